/*
 * cuda_ops.cu — the per-row and element-wise ops of the forward pass on the
 * GPU: RMSNorm, SwiGLU (silu_mul), SiTU, softmax, RoPE, and the MLA block's row steps (residual + RMSNorm; the
 * latent KV rows: RMSNorm, RoPE into the cache, the queries' RoPE). Same math as the CPU
 * reference (src/kernels/cpu/cpu_scalar.c, src/engine/rope.c, moe.c eng_act):
 * fp32 values, fp64 sums for RMSNorm/softmax combined in a fixed order (RMSNorm: 1024 threads per row, each warp's
 * butterfly, then the warp sums in order; softmax: a shared-memory tree), so a row's result never depends on how many
 * rows are in the call.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_act.cuh"
#include "cuda_split.cuh"

#include <math.h>
#include <stdint.h>

int g_cu_pdl = 1;
int g_cu_copy_kernel = 1;

namespace {

constexpr int NT = 256; /* threads per row for the row ops */

/* Sum of one double per thread, fixed tree; every thread gets the result. */
__device__ double block_sum(double v, double *sh) {
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];
        __syncthreads();
    }
    double r = sh[0];
    __syncthreads();
    return r;
}

constexpr int NN = 1024; /* threads per row of the RMSNorms (rmsnorm, add_rmsnorm) */

/* Sum of one double per thread of an NN-thread block, every thread gets the result: each warp's 32 values by the
 * xor butterfly (16, 8, 4, 2, 1), then the NN / 32 warp sums added in warp order (sh: NN / 32 doubles). */
__device__ double block_sum_nn(double v, double *sh) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double r = sh[0];
#pragma unroll
    for (int i = 1; i < NN / 32; i++) r += sh[i];
    __syncthreads();
    return r;
}

/* Thread threadIdx.x's elements i = threadIdx.x, + NN, + 2 NN, ... (< n) visited in order, UB at a time: get(i)
 * loads (all UB loads of a batch issued before any is used), use(i, v) consumes in index order. */
constexpr int UB = 4;
template <class Get, class Use> __device__ __forceinline__ void strided(int64_t n, Get get, Use use) {
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += (int64_t)NN * UB) {
        float v[UB];
#pragma unroll
        for (int u = 0; u < UB; u++) {
            const int64_t i = i0 + (int64_t)u * NN;
            v[u] = i < n ? get(i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UB; u++) {
            const int64_t i = i0 + (int64_t)u * NN;
            if (i < n) use(i, v[u]);
        }
    }
}

/* Block t (NN threads): row t. The sum of squares in fp64, each thread's elements in index order, then
 * block_sum_nn. */
__global__ void __launch_bounds__(NN) rmsnorm_kernel(float *out, const float *x, const float *w, int64_t n, float eps) {
    pdl_enter();
    __shared__ double sh[NN / 32];
    const float *xr = x + (int64_t)blockIdx.x * n;
    float *o = out + (int64_t)blockIdx.x * n;
    double ss = 0.0;
    strided(n, [&](int64_t i) { return xr[i]; }, [&](int64_t, float v) { ss += (double)v * v; });
    ss = block_sum_nn(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    strided(n, [&](int64_t i) { return xr[i] * r * w[i]; }, [&](int64_t i, float v) { o[i] = v; });
}

__global__ void softmax_kernel(float *x, int64_t n) {
    pdl_enter();
    __shared__ double sh[NT];
    __shared__ float shm[NT];
    float *xr = x + (int64_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int64_t i = threadIdx.x; i < n; i += NT) m = fmaxf(m, xr[i]);
    shm[threadIdx.x] = m;
    __syncthreads();
    for (int s = NT / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shm[threadIdx.x] = fmaxf(shm[threadIdx.x], shm[threadIdx.x + s]);
        __syncthreads();
    }
    m = shm[0];
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += NT) {
        const float e = expf(xr[i] - m);
        xr[i] = e;
        sum += e;
    }
    sum = block_sum(sum, sh);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = threadIdx.x; i < n; i += NT) xr[i] *= inv;
}

__global__ void silu_mul_kernel(float *out, const float *g, const float *u, int64_t n) {
    pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = act_silu_mul(g[i], u[i]);
}

__global__ void situ_mul_kernel(float *out, const float *g, const float *u, int64_t n, float b, float lb) {
    pdl_enter();
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        out[i] = act_situ_mul(g[i], u[i], b, lb);
    }
}

__global__ void rope_kernel(float *out, const float *x, int T, int dim, const float *inv_freq, float af,
                            const int64_t *pos) {
    pdl_enter();
    const int half = dim / 2;
    const int64_t n = (int64_t)T * half;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = k / half;
        const int i = (int)(k % half);
        const float f = inv_freq[i] * (float)pos[t];
        const float c = cosf(f) * af, s = sinf(f) * af;
        const float a = x[t * dim + 2 * i], b = x[t * dim + 2 * i + 1];
        out[t * dim + i] = a * c - b * s;
        out[t * dim + i + half] = b * c + a * s;
    }
}

/* x_out = x + a (one fp32 add per element; also into xo2 when not NULL, which may be x: each element is read before
 * it is written, by the same thread), h = rmsnorm(x_out) * w: rmsnorm_kernel's sum and arithmetic on x_out; xs (NULL:
 * none): h's split (cuda_split.cuh), row t at xs + t (n / 32) 48, from h read back through L2 after the block's
 * barrier (other threads wrote it). */
__global__ void __launch_bounds__(NN) add_rmsnorm_kernel(float *xo, const float *x, const float *a, const float *w,
                                                          int64_t n, float eps, float *h, float *xo2, uint32_t *xs) {
    pdl_enter();
    __shared__ double sh[NN / 32];
    const int64_t base = (int64_t)blockIdx.x * n;
    double ss = 0.0;
    strided(n, [&](int64_t i) { return __fadd_rn(x[base + i], a[base + i]); }, [&](int64_t i, float v) {
        xo[base + i] = v;
        if (xo2) xo2[base + i] = v;
        ss += (double)v * v;
    });
    ss = block_sum_nn(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    strided(n, [&](int64_t i) { return xo[base + i] * r * w[i]; }, [&](int64_t i, float v) { h[base + i] = v; });
    if (!xs) return;
    __syncthreads();
    const int64_t ng = n / 32;
    uint32_t *xr = xs + (int64_t)blockIdx.x * ng * 48;
    for (int64_t i = threadIdx.x; i < ng * 8; i += NN) {
        int64_t tg;
        const float *hp = h + base + split_elem(i, ng, &tg);
        const float v[4] = {__ldcg(hp), __ldcg(hp + 4), __ldcg(hp + 1), __ldcg(hp + 5)};
        split_store(v, xr, i);
    }
}

/* Element i of rope(v, cs) (df_backend.mla_block; engine/rope.c rope_apply without contraction); cs NULL: v[i]. */
__device__ __forceinline__ float rope_elem(const float *v, int i, int dim, const float *cs) {
    const int half = dim / 2;
    if (!cs || i >= 2 * half) return v[i];
    const int k = i < half ? i : i - half;
    const float a = v[2 * k], b = v[2 * k + 1], c = cs[2 * k], s = cs[2 * k + 1];
    return i < half ? __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s)) : __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

/* Block (t, 0): row t of kva [T, kvl + dr] -> c_new = rmsnorm(kva[:kvl]) * kvn (rmsnorm_kernel's sum and
 * arithmetic), kpe_new = rope(kva[kvl:], cs[t]), each written to dc / dp (row t's places in its cache) and to ret_c
 * [T, kvl] / ret_p [T, dr]. Blocks (t, 1 ..): q [T, H, dn + dr] = q_raw with every head's rope part roped by cs[t], block (t, 1 + b)
 * the elements b NN + tid, + (gridDim.y - 1) NN, ... of row t. NN threads per block. */
__device__ __forceinline__ void kv_rows(const float *kva, int kvl, int dr, const float *kvn, float eps,
                                        const float *cst, float *dc, float *dp, float *ret_c, float *ret_p,
                                        const float *q_raw, float *q, int H, int dn, double *sh) {
    const int t = blockIdx.x;
    const float *row = kva + (int64_t)t * (kvl + dr);
    if (blockIdx.y > 0) {
        const int qd = dn + dr, qb = (int)gridDim.y - 1;
        const float *qs = q_raw + (int64_t)t * H * qd;
        float *qo = q + (int64_t)t * H * qd;
#pragma unroll 4
        for (int j = ((int)blockIdx.y - 1) * NN + threadIdx.x; j < H * qd; j += qb * NN) {
            const int h = j / qd, d = j % qd;
            qo[j] = d < dn ? qs[j] : rope_elem(qs + h * qd + dn, d - dn, dr, cst);
        }
        return;
    }
    double ss = 0.0;
    strided(kvl, [&](int64_t i) { return row[i]; }, [&](int64_t, float v) { ss += (double)v * v; });
    ss = block_sum_nn(ss, sh);
    const float r = (float)(1.0 / sqrt(ss / (double)kvl + (double)eps));
    for (int i = threadIdx.x; i < kvl; i += NN) {
        const float v = row[i] * r * kvn[i];
        dc[i] = v;
        ret_c[(int64_t)t * kvl + i] = v;
    }
    if (dr) {
        for (int i = threadIdx.x; i < dr; i += NN) {
            const float v = rope_elem(row + kvl, i, dr, cst);
            dp[i] = v;
            ret_p[(int64_t)t * dr + i] = v;
        }
    }
}

__global__ void __launch_bounds__(NN) kv_rows_kernel(const float *kva, int kvl, int dr, const float *kvn, float eps,
                                                      const float *cs, float *const *dst_c, float *const *dst_p,
                                                      float *ret_c, float *ret_p, const float *q_raw, float *q, int H,
                                                      int dn) {
    pdl_enter();
    __shared__ double sh[NN / 32];
    const int t = blockIdx.x;
    kv_rows(kva, kvl, dr, kvn, eps, cs ? cs + (int64_t)t * dr : nullptr, blockIdx.y ? nullptr : dst_c[t],
            blockIdx.y || !dr ? nullptr : dst_p[t], ret_c, ret_p, q_raw, q, H, dn, sh);
}

/* kv_rows_kernel for one row (T = 1) with its destinations and cs by value; cs goes through shared memory (lanes
 * read different pairs) */
__global__ void __launch_bounds__(NN) kv_row1_kernel(const float *kva, int kvl, int dr, const float *kvn, float eps,
                                                     const __grid_constant__ cu_row1 r1,
                                                     const __grid_constant__ cu_cs1 cs, int has_cs, float *ret_c,
                                                     float *ret_p, const float *q_raw, float *q, int H, int dn) {
    pdl_enter();
    __shared__ double sh[NN / 32];
    __shared__ float scs[CU_CS1_MAX];
    if (has_cs)
        for (int i = threadIdx.x; i < dr; i += NN) scs[i] = cs.v[i];
    __syncthreads();
    const int64_t at = (int64_t)r1.npos - 1;
    kv_rows(kva, kvl, dr, kvn, eps, has_cs ? scs : nullptr, r1.c + at * kvl, r1.p + at * dr, ret_c, ret_p, q_raw, q,
            H, dn, sh);
}

using CombineArgs = cu_combine_args;

__device__ __forceinline__ void combine_resid(const CombineArgs &a, float *resid, int64_t D) {
    for (int64_t d = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; d < D; d += (int64_t)gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < a.n; i++) acc = fmaf(a.w[i], a.y[i][d], acc);
        /* n = 0: a dense MLP's output, added as forward's x += out */
        const float v = a.n == 0 ? (a.sh ? a.sh[d] : 0.0f) : a.sh ? __fadd_rn(acc, a.sh[d]) : acc;
        if (a.n || a.sh) resid[d] = __fadd_rn(resid[d], v);
    }
}

__global__ void combine_resid_kernel(const __grid_constant__ CombineArgs a, float *resid, int64_t D) {
    pdl_enter();
    combine_resid(a, resid, D);
}

/* the arguments from device memory (cu_combine_resid_dev_launch): the same additions in the same order */
__global__ void combine_resid_dev_kernel(const CombineArgs *__restrict__ a, float *resid, int64_t D) {
    pdl_enter();
    combine_resid(*a, resid, D);
}

/* dst = src for n bytes, both 16-byte aligned: 16-byte words by the grid, the tail by block 0 */
__global__ void copy_kernel(uint4 *dst, const uint4 *src, size_t n) {
    pdl_enter();
    const size_t n16 = n / 16;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = src[i];
    if (blockIdx.x == 0 && threadIdx.x < (n & 15))
        reinterpret_cast<uint8_t *>(dst)[n16 * 16 + threadIdx.x] = reinterpret_cast<const uint8_t *>(src)[n16 * 16 + threadIdx.x];
}

__global__ void fill_kernel(uint32_t *p, size_t n, uint32_t seed) {
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t v = (uint32_t)i * 2654435761u ^ seed;
        v ^= v >> 15; v *= 2246822519u; v ^= v >> 13; v *= 3266489917u; v ^= v >> 16;
        p[i] = v;
    }
}

unsigned grid_for(int64_t n) {
    int64_t b = (n + 255) / 256;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

} // namespace

cudaError_t cu_rmsnorm_launch(float *out, const float *x, const float *w, int T, int64_t n, float eps, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    cu_launch(rmsnorm_kernel, T, NN, 0, st, out, x, w, n, eps);
    return cudaGetLastError();
}

cudaError_t cu_softmax_launch(float *x, int T, int64_t n, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    cu_launch(softmax_kernel, T, NT, 0, st, x, n);
    return cudaGetLastError();
}

cudaError_t cu_silu_mul_launch(float *out, const float *g, const float *u, int64_t n, cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    cu_launch(silu_mul_kernel, grid_for(n), 256, 0, st, out, g, u, n);
    return cudaGetLastError();
}

cudaError_t cu_situ_mul_launch(float *out, const float *g, const float *u, int64_t n, float beta, float lb,
                               cudaStream_t st) {
    if (n <= 0) return cudaSuccess;
    cu_launch(situ_mul_kernel, grid_for(n), 256, 0, st, out, g, u, n, beta, lb);
    return cudaGetLastError();
}

cudaError_t cu_rope_launch(float *out, const float *x, int T, int dim, const float *inv_freq, float attention_factor,
                           const int64_t *pos, cudaStream_t st) {
    if (T <= 0 || dim < 2) return cudaSuccess;
    cu_launch(rope_kernel, grid_for((int64_t)T * (dim / 2)), 256, 0, st, out, x, T, dim, inv_freq, attention_factor, pos);
    return cudaGetLastError();
}

cudaError_t cu_add_rmsnorm_launch(float *x_out, const float *x, const float *a, const float *w, int T, int64_t n,
                                  float eps, float *h, cudaStream_t st, float *x_out2, void *xs) {
    if (T <= 0) return cudaSuccess;
    if (xs && n % 32 != 0) return cudaErrorInvalidValue;
    cu_launch(add_rmsnorm_kernel, T, NN, 0, st, x_out, x, a, w, n, eps, h, x_out2, static_cast<uint32_t *>(xs));
    return cudaGetLastError();
}

cudaError_t cu_kv_rows_launch(const float *kva, int T, int kvl, int dr, const float *kv_norm, float eps, const float *cs,
                              float *const *dst_c, float *const *dst_p, float *ret_c, float *ret_p, const float *q_raw,
                              float *q, int H, int dn, cudaStream_t st) {
    if (T <= 0) return cudaSuccess;
    /* the queries' RoPE over blocks of about 2 elements per thread (a decode row: 64 heads x 192 -> 6 blocks) */
    const int qb = (int)(((int64_t)H * (dn + dr) + 2 * NN - 1) / (2 * NN));
    cu_launch(kv_rows_kernel, dim3((unsigned)T, (unsigned)(1 + qb)), NN, 0, st, kva, kvl, dr, kv_norm, eps, cs, dst_c, dst_p, ret_c, ret_p, q_raw, q, H, dn);
    return cudaGetLastError();
}

cudaError_t cu_kv_row1_launch(const float *kva, int kvl, int dr, const float *kv_norm, float eps, const cu_row1 &r1,
                              const cu_cs1 &cs, int has_cs, float *ret_c, float *ret_p, const float *q_raw, float *q,
                              int H, int dn, cudaStream_t st) {
    if (dr > CU_CS1_MAX) return cudaErrorInvalidValue;
    const int qb = (int)(((int64_t)H * (dn + dr) + 2 * NN - 1) / (2 * NN));
    cu_launch(kv_row1_kernel, dim3(1u, (unsigned)(1 + qb)), NN, 0, st, kva, kvl, dr, kv_norm, eps, r1, cs, has_cs,
              ret_c, ret_p, q_raw, q, H, dn);
    return cudaGetLastError();
}

cudaError_t cu_combine_resid_launch(float *resid, int64_t D, int n, const float *const *y, const float *w, const float *sh,
                                    cudaStream_t st) {
    if (n < 0 || n > CU_COMBINE_MAX) return cudaErrorInvalidValue;
    CombineArgs a;
    for (int i = 0; i < n; i++) { a.y[i] = y[i]; a.w[i] = w[i]; }
    a.sh = sh;
    a.n = n;
    cu_launch(combine_resid_kernel, grid_for(D), 256, 0, st, a, resid, D);
    return cudaGetLastError();
}

cudaError_t cu_combine_resid_dev_launch(float *resid, int64_t D, const cu_combine_args *da, cudaStream_t st) {
    cu_launch(combine_resid_dev_kernel, grid_for(D), 256, 0, st, da, resid, D);
    return cudaGetLastError();
}

cudaError_t cu_copy_launch(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t st) {
    if (!n) return cudaSuccess;
    if (!g_cu_copy_kernel || n > CU_COPY_KERNEL_MAX || ((uintptr_t)dst & 15) || ((uintptr_t)src & 15))
        return cudaMemcpyAsync(dst, src, n, kind, st);
    const size_t n16 = n / 16;
    size_t blocks = (n16 + 255) / 256;
    if (blocks < 1) blocks = 1;
    if (blocks > 64) blocks = 64;
    cu_launch(copy_kernel, (unsigned)blocks, 256, 0, st, static_cast<uint4 *>(dst), static_cast<const uint4 *>(src), n);
    return cudaGetLastError();
}

cudaError_t cu_fill_random(void *p, size_t n, uint32_t seed, cudaStream_t st) {
    cu_launch(fill_kernel, grid_for((int64_t)(n / 4)), 256, 0, st, static_cast<uint32_t *>(p), n / 4, seed);
    return cudaGetLastError();
}

__global__ void and_kernel(uint32_t *p, size_t n, uint32_t mask) {
    pdl_enter();
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] &= mask;
}

cudaError_t cu_and_words(void *p, size_t n, uint32_t mask, cudaStream_t st) {
    cu_launch(and_kernel, grid_for((int64_t)(n / 4)), 256, 0, st, static_cast<uint32_t *>(p), n / 4, mask);
    return cudaGetLastError();
}
