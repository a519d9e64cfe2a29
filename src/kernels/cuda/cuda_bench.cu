/*
 * cuda_bench.cu — the CUDA backend's kernel benchmarks (kernels/cuda.h: df_cuda_bench_matmul, df_cuda_bench_group,
 * df_cuda_bench_bandwidth, df_cuda_fp32_peak) for `deltafin bench kernels --backend cuda`: each times back-to-back
 * launches of one kernel on synthetic weights in device memory (CUDA events on the runtime's one stream, its mutex
 * held: cuda_internal.h cu_rt_lock).
 */
#include "cuda_internal.h"
#include "model/weights.h"

#include <stdint.h>
#include <stdlib.h>

namespace {

/* Temporary device arrays, freed on return. */
struct Tmp {
    void *p[4] = {NULL, NULL, NULL, NULL};
    ~Tmp() { for (void *q : p) if (q) cudaFree(q); }
};

size_t up256(size_t n) { return (n + 255) / 256 * 256; }

/* ms per call of launch() (which queues work on st and returns its launch error): one warm-up call,
 * then CUDA events around iters back-to-back calls; -1 on an error. */
template <class F> double time_launches(cudaStream_t st, int iters, F &&launch) {
    cudaEvent_t e0 = NULL, e1 = NULL;
    double ms = -1;
    if (cudaEventCreate(&e0) == cudaSuccess && cudaEventCreate(&e1) == cudaSuccess && launch() == cudaSuccess) {
        cudaEventRecord(e0, st);
        for (int i = 0; i < iters; i++) launch();
        cudaEventRecord(e1, st);
        float el = 0;
        if (cudaEventSynchronize(e1) == cudaSuccess && cudaEventElapsedTime(&el, e0, e1) == cudaSuccess) ms = el / iters;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    return ms;
}

} // namespace

extern "C" double df_cuda_bench_matmul(df_wtype t, int64_t rows, int64_t cols, int T, int iters) {
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    double ms = -1;
    Tmp m;
    const size_t db = df_weight_data_bytes(t, rows, cols), sb = df_weight_scale_bytes(t, rows, cols);
    do {
        if (cudaMalloc(&m.p[0], db + 256) != cudaSuccess) break;
        if (sb && cudaMalloc(&m.p[1], sb + 256) != cudaSuccess) break;
        if (cudaMalloc(&m.p[2], sizeof(float) * (size_t)T * cols + 256) != cudaSuccess) break;
        if (cudaMalloc(&m.p[3], sizeof(float) * (size_t)T * rows + 256) != cudaSuccess) break;
        if (cu_fill_random(m.p[0], db, 1, st) != cudaSuccess) break;
        /* fp8: no NaN codes (S.1111.111; real checkpoints have none, and a group with one takes the slower
         * element-wise decoding): clear each byte's lowest mantissa bit */
        if (t == DF_W_FP8_B128 && cu_and_words(m.p[0], db, 0xfefefefeu, st) != cudaSuccess) break;
        if (sb) {
            /* scales: small finite values (fp8 block scales as floats, bf16, E8M0 near 2^0) */
            cudaMemsetAsync(m.p[1], t == DF_W_MXFP4 ? 0x7f : 0x3c, sb, st);
        }
        /* activations: zeros (the kernel's work does not depend on the values) */
        if (cudaMemsetAsync(m.p[2], 0, sizeof(float) * (size_t)T * cols, st) != cudaSuccess) break;
        ms = time_launches(st, iters, [&] {
            return cu_matmul_launch(t, m.p[0], m.p[1], rows, cols, (const float *)m.p[2], T, (float *)m.p[3], st);
        });
    } while (0);
    cudaGetLastError();
    cu_rt_unlock();
    return ms;
}

extern "C" double df_cuda_bench_group(df_wtype t, int64_t rows, int64_t cols, int T, int n, int iters) {
    if ((t != DF_W_MXFP4 && t != DF_W_BF16) || cols % 32 || n <= 0 || T <= 0 || T > 256)
        return cu_rt_error("grouped launch: MXFP4 or BF16 only, cols % 32 == 0, 1 <= T <= 256");
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    double ms = -1;
    Tmp m;
    const size_t db = up256(df_weight_data_bytes(t, rows, cols)), sb = up256(df_weight_scale_bytes(t, rows, cols));
    cu_mma_item *items = (cu_mma_item *)malloc(sizeof(cu_mma_item) * (size_t)n);
    do {
        if (!items) break;
        if (cudaMalloc(&m.p[0], db * (size_t)n) != cudaSuccess) break;
        if (sb && cudaMalloc(&m.p[1], sb * (size_t)n) != cudaSuccess) break;
        if (cudaMalloc(&m.p[2], sizeof(float) * (size_t)T * cols + 256) != cudaSuccess) break;
        if (cudaMalloc(&m.p[3], sizeof(float) * (size_t)T * rows * n + 256) != cudaSuccess) break;
        if (cu_fill_random(m.p[0], db * (size_t)n, 1, st) != cudaSuccess) break;
        if (sb) cudaMemsetAsync(m.p[1], t == DF_W_MXFP4 ? 0x7f : 0x3c, sb * (size_t)n, st);
        if (cudaMemsetAsync(m.p[2], 0, sizeof(float) * (size_t)T * cols, st) != cudaSuccess) break;
        for (int i = 0; i < n; i++)
            items[i] = {(char *)m.p[0] + db * (size_t)i, sb ? (char *)m.p[1] + sb * (size_t)i : NULL, (const float *)m.p[2],
                        (float *)m.p[3] + (size_t)T * rows * i, T};
        ms = time_launches(st, iters, [&] { return cu_mma_group_launch(t, rows, cols, n, items, st); });
    } while (0);
    free(items);
    cudaGetLastError();
    cu_rt_unlock();
    return ms;
}

extern "C" double df_cuda_bench_bandwidth(void) {
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    double bw = -1;
    Tmp m;
    const size_t n = (size_t)4 << 30;
    do {
        if (cudaMalloc(&m.p[0], n) != cudaSuccess || cudaMalloc(&m.p[1], n) != cudaSuccess) break;
        cudaMemsetAsync(m.p[0], 1, n, st);
        const double ms = time_launches(st, 10, [&] { return cudaMemcpyAsync(m.p[1], m.p[0], n, cudaMemcpyDeviceToDevice, st); });
        if (ms > 0) bw = 2.0 * (double)n / (ms * 1e-3);
    } while (0);
    cudaGetLastError();
    cu_rt_unlock();
    return bw;
}

extern "C" void df_cuda_fp32_peak(double *flops, int *sms, int *mhz) {
    *flops = 0; *sms = 0; *mhz = 0;
    if (!df_cuda_probe(NULL, 0)) return;
    int n = 0, khz = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, 0);
    cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0);
    *sms = n;
    *mhz = khz / 1000;
    *flops = (double)n * 128 * 2 * khz * 1e3;
}
