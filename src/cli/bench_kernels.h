/* bench_kernels.h — `deltafin bench machine` and `deltafin bench kernels` (bench_kernels.c).
 *
 * bench_kernels_main(argc, argv): argv[0] is the benchmark's name, "machine" or "kernels",
 * argv[1..argc-1] its options (--help lists them). `machine` prints the machine's limits:
 * DRAM read bandwidth with 1..N threads (a streaming sum over a buffer much larger than the
 * last-level cache) and the peak fp32 FMA rate per core and for all threads. `kernels`
 * measures those limits, then every matmul kernel (encodings x T x shapes, weights rotated
 * over a buffer larger than the LLC so they are not in cache) in GB/s of weight bytes and
 * as a fraction of the DRAM bandwidth measured at the same thread count.
 * Returns the process exit status (0 ok, 1 runtime error, 2 usage error). */
#ifndef DF_CLI_BENCH_KERNELS_H
#define DF_CLI_BENCH_KERNELS_H
int bench_kernels_main(int argc, char **argv);
#include <stdint.h>
/* `bench kernels --backend cuda` (bench_cuda.c): the GPU's limits and the CUDA matmul kernels; types, shapes
 * and Ts as parsed by bench_kernels_main (its defaults replaced by GPU-sized ones unless *_given). */
int bench_kernels_cuda(int argc, char **argv, const int *types, int ntypes, int64_t (*shapes)[2], int nshapes,
                       const int *Ts, int nT, int ts_given, int shapes_given);
#endif
