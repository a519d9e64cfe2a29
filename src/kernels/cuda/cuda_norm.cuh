/*
 * cuda_norm.cuh — RMSNorm's scale r = 1 / sqrt(sum(x^2) / n + eps) with the reduction order of the RMSNorm kernels
 * (cuda_ops.cu rmsnorm_kernel: NORM_NN threads, thread j summing x[j]^2, x[j + NORM_NN]^2, ... in fp64 in index
 * order, each warp's 32 sums combined by the xor butterfly 16, 8, 4, 2, 1, then the NORM_NN / 32 warp sums added
 * in warp order), computed by a block of any multiple of 32 threads: its threads take the virtual threads j = k blockDim +
 * tid < NORM_NN in turn (a warp's 32 virtual threads are one virtual warp), so the additions, and the bits, are the RMSNorm kernels'. Math:
 * RMSNorm (Zhang and Sennrich 2019), as engine/ops.c.
 */
#ifndef DF_KERNELS_CUDA_NORM_CUH
#define DF_KERNELS_CUDA_NORM_CUH

#include <stdint.h>

constexpr int NORM_NN = 1024; /* threads per row of the RMSNorm kernels */

/* r for x [n] (device memory written by other blocks of this grid: read past L1); sh: NORM_NN / 32 doubles of shared
 * memory; every thread of the block gets r. Called by every thread of the block. */
__device__ __forceinline__ float rms_scale_emul(const float *x, int64_t n, float eps, double *sh) {
    const int tid = threadIdx.x, bd = blockDim.x;
    for (int k = 0; k * bd < NORM_NN; k++) {
        const int j = k * bd + tid;
        if (j >= NORM_NN) break; /* the whole warp: bd is a multiple of 32 */
        double ss = 0.0;
        for (int64_t i = j; i < n; i += NORM_NN) {
            const float v = __ldcg(x + i);
            ss += (double)v * v;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, off);
        if ((j & 31) == 0) sh[j >> 5] = ss;
    }
    __syncthreads();
    double s = sh[0];
#pragma unroll
    for (int i = 1; i < NORM_NN / 32; i++) s += sh[i];
    return (float)(1.0 / sqrt(s / (double)n + (double)eps));
}

#endif
