/*
 * cuda_act.cuh — the gated activations of one element on the device, shared by the activation kernels
 * (cuda_ops.cu: silu_mul, situ_mul) and the tensor-core kernel's input split that applies them on the fly
 * (cuda_mma.cu), so both give the same bits. Math as the CPU's moe.c eng_act: SwiGLU silu(g) u; SiTU
 * beta tanh(g / beta) sigmoid(g) u', u' = lb tanh(u / lb) when lb != 0, else u.
 */
#ifndef DF_KERNELS_CUDA_ACT_CUH
#define DF_KERNELS_CUDA_ACT_CUH

#include <math.h>

__device__ __forceinline__ float act_silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

__device__ __forceinline__ float act_situ_mul(float g, float u, float b, float lb) {
    const float uv = lb != 0.0f ? lb * tanhf(u / lb) : u;
    return b * tanhf(g / b) * (1.0f / (1.0f + expf(-g))) * uv;
}

#endif
