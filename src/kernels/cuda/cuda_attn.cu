/*
 * cuda_attn.cu — the MLA attention core on the GPU (df_backend.mla_attend, kernels/cuda.h
 * df_cuda_mla_attend): the absorbed form of src/engine/attention.c,
 *   q_lat[t,h,:] = K_h^T q_nope[t,h]                       (absorb_kernel)
 *   s = (q_lat[t,h] . c_s + q_pe[t,h] . kpe_s) * scale, s < npos[t]; p = softmax(s);
 *   o_lat[t,h,:] = sum_s p_s c_s                           (attn_kernel)
 *   o_v[t, h*dv + e] = V_h[e,:] . o_lat[t,h,:]             (value_kernel)
 * with kv_b rows per head h = [K_h (dn rows) ; V_h (dv rows)] over kvl columns, decoded element by element
 * exactly as the CPU's decode_row (every encoding of model/weights.h; kernels/dtype.h). One call: the rows' q
 * and the distinct latent caches (rows of one sequence share theirs: [0, max npos of its rows) once) go up in
 * one copy from pinned staging, three kernels, o_v comes back; one synchronisation. kv_b comes from the weight
 * cache of cuda_runtime.cu (keyed by host address, like a resident spine weight).
 *
 * Canonical order (batch invariance: an output depends only on its row's own data, never on T, the other
 * rows, the tiles or the grid):
 *   - q_lat[t,h,k]: one fp32 chain over d = 0..dn-1, fma(q_nope[d], K[d,k], acc) from 0;
 *   - a score: two dots, each lane l of a warp taking the elements l, l+32, ... in order (fma chain from 0),
 *     the 32 lane sums combined by the xor butterfly (16, 8, 4, 2, 1); score = (dot_c + dot_pe) * scale;
 *   - softmax over the positions in chunks of 32 (online, chunks in order): chunk max m_c (exact), running max
 *     m = max(m, m_c), e_s = expf(s - m), the chunk's sum by the xor butterfly over its 32 lanes, running sum
 *     l = fma(l, alpha, chunk sum) and accumulator a = a * alpha with alpha = expf(m_old - m) (0 for the first
 *     chunk, and exactly 1 while the max does not change); a[k] += e_s c_s[k] by fma, positions in order;
 *     o_lat = a / l;
 *   - o_v[t,h,e]: the lane-partial chains over k = l, l+32, ... (fma) and the xor butterfly.
 * All arithmetic on fp32 values (nothing rounded below fp32) with explicit fmaf / __fmul_rn / __fadd_rn /
 * __fdiv_rn, so no contraction choice of the compiler can differ between the kernel variants (tokens per tile,
 * heads per block), which therefore give the same bits.
 */
#include "cuda_internal.h"
#include "cuda_decode.cuh"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int AT = 128;     /* absorb: threads per block (one column k each) */
constexpr int NT = 128;     /* attention: threads per block */
constexpr int NW = NT / 32; /* attention: warps per block */
constexpr int CH = 32;      /* attention: positions per softmax chunk (one per lane in the chunk statistics) */
constexpr int PP = CH / NW; /* attention: positions per warp in a chunk's scores */
constexpr int VW = 4;       /* value: warps per block */
constexpr int VR = 16;      /* value: rows of V_h per block */
constexpr int KMAX = 1024;  /* largest kv_lora_rank (NT x 8 accumulators per thread) */

/* Element (r, c) of a weight [rows, cols] of encoding ENC, exactly as the CPU's cpu_scalar_decode_range (the
 * element decoders: cuda_decode.cuh). */
template <int ENC>
__device__ __forceinline__ float wdec(const uint8_t *__restrict__ d, const uint8_t *__restrict__ s, int64_t cols,
                                      int64_t r, int64_t c) {
    if constexpr (ENC == DF_W_F32) return reinterpret_cast<const float *>(d)[r * cols + c];
    else if constexpr (ENC == DF_W_BF16) return bf16_f32(reinterpret_cast<const uint16_t *>(d)[r * cols + c]);
    else if constexpr (ENC == DF_W_F16) return f16_f32(reinterpret_cast<const uint16_t *>(d)[r * cols + c]);
    else if constexpr (ENC == DF_W_FP8_B128)
        return __fmul_rn(fp8_f32(d[r * cols + c]), reinterpret_cast<const float *>(s)[(r / 128) * ((cols + 127) / 128) + c / 128]);
    else if constexpr (ENC == DF_W_INT4_G32) {
        const uint32_t wd = reinterpret_cast<const uint32_t *>(d)[r * (cols / 8) + c / 8];
        const int q = (int)((wd >> (4 * (c % 8))) & 15u) - 8;
        return __fmul_rn((float)q, bf16_f32(reinterpret_cast<const uint16_t *>(s)[r * (cols / 32) + c / 32]));
    } else if constexpr (ENC == DF_W_MXFP4) {
        const uint32_t b = d[r * (cols / 2) + c / 2];
        return __fmul_rn(e2m1_f32((c & 1) ? b >> 4 : b & 15u), e8m0_f32(s[r * (cols / 32) + c / 32]));
    } else if constexpr (ENC == DF_W_INT8_ROW)
        return __fmul_rn((float)(int8_t)d[r * cols + c], reinterpret_cast<const float *>(s)[r]);
    else return __int_as_float(0x7fc00000);
}

/* One lane's part of the dot products of PP cached rows (src[cpos[u] * n ..], n elements) with HB query rows
 * (q[j * n ..]): elements lane, lane + 32, ... into acc[u][j] by fma in that order. */
template <int HB>
__device__ __forceinline__ void lane_dots(const float *src, int n, const int64_t *cpos, const float *q, int lane,
                                          float (&acc)[PP][HB]) {
#pragma unroll 1
    for (int i = lane; i < n; i += 32) {
        float x[PP];
#pragma unroll
        for (int u = 0; u < PP; u++) x[u] = src[cpos[u] * n + i];
#pragma unroll
        for (int j = 0; j < HB; j++) {
            const float qv = q[j * n + i];
#pragma unroll
            for (int u = 0; u < PP; u++) acc[u][j] = fmaf(qv, x[u], acc[u][j]);
        }
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* q_lat [T, H, kvl]: block (h, a tile of AT columns) x (a tile of TT tokens); thread = one column k.
 * q [T, H, dn + dr]; kv_b [H*(dn+dv), kvl]. Shared: the tile's q_nope [TT][dn]. */
template <int ENC, int TT>
__global__ void __launch_bounds__(AT) absorb_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ ws,
                                                    int H, int dn, int dr, int dv, int kvl, const float *__restrict__ q,
                                                    int T, float *__restrict__ q_lat) {
    extern __shared__ float abs_smem[];
    float *qn = abs_smem;
    const int kb = (kvl + AT - 1) / AT;
    const int h = blockIdx.x / kb, k = (blockIdx.x % kb) * AT + threadIdx.x;
    const int t0 = blockIdx.y * TT, qd = dn + dr;
    for (int i = threadIdx.x; i < TT * dn; i += AT) {
        const int t = t0 + i / dn;
        qn[i] = t < T ? q[((int64_t)t * H + h) * qd + i % dn] : 0.0f;
    }
    __syncthreads();
    if (k >= kvl) return;
    float acc[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++) acc[tt] = 0.0f;
    const int64_t r0 = (int64_t)h * (dn + dv);
#pragma unroll 4
    for (int d = 0; d < dn; d++) {
        const float w = wdec<ENC>(wd, ws, kvl, r0 + d, k);
#pragma unroll
        for (int tt = 0; tt < TT; tt++) acc[tt] = fmaf(qn[tt * dn + d], w, acc[tt]);
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++)
        if (t0 + tt < T) q_lat[((int64_t)(t0 + tt) * H + h) * kvl + k] = acc[tt];
}

/* o_lat [T, H, kvl]: block = row t x HB heads (blockIdx.y * HB ..); thread tid owns the columns
 * k = tid + NT*kk, kk < KPT. cache: the uploaded latent caches; row t's c at cache + coff[t] ([npos, kvl]),
 * its k_pe at cache + poff[t] ([npos, dr]). */
template <int HB, int KPT>
__global__ void __launch_bounds__(NT) attn_kernel(const float *__restrict__ q, const float *__restrict__ q_lat,
                                                  const float *__restrict__ cache, const int64_t *__restrict__ coff,
                                                  const int64_t *__restrict__ poff, const int *__restrict__ npos, int H,
                                                  int dn, int dr, int kvl, float scale, float *__restrict__ o_lat) {
    extern __shared__ float att_smem[];
    float *qs = att_smem;             /* [HB][kvl] q_lat */
    float *qp = qs + HB * kvl;        /* [HB][dr] q_pe */
    float *sc = qp + HB * dr;         /* [HB][CH] scores, then exp weights */
    float *st_m = sc + HB * CH;       /* [HB] running max */
    float *st_l = st_m + HB;          /* [HB] running sum */
    float *st_a = st_l + HB;          /* [HB] this chunk's rescaling */
    const int t = blockIdx.x, h0 = blockIdx.y * HB, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qd = dn + dr;
    for (int i = tid; i < HB * kvl; i += NT) {
        const int h = h0 + i / kvl;
        qs[i] = h < H ? q_lat[((int64_t)t * H + h) * kvl + i % kvl] : 0.0f;
    }
    for (int i = tid; i < HB * dr; i += NT) {
        const int h = h0 + i / dr;
        qp[i] = h < H ? q[((int64_t)t * H + h) * qd + dn + i % dr] : 0.0f;
    }
    if (tid < HB) {
        st_m[tid] = -INFINITY;
        st_l[tid] = 0.0f;
    }
    const float *c = cache + coff[t], *kp = cache + poff[t];
    const int n = npos[t];
    float acc[HB][KPT];
#pragma unroll
    for (int j = 0; j < HB; j++)
#pragma unroll
        for (int kk = 0; kk < KPT; kk++) acc[j][kk] = 0.0f;
    __syncthreads();
#pragma unroll 1
    for (int s0 = 0; s0 < n; s0 += CH) {
        const int nc = n - s0 < CH ? n - s0 : CH;
        /* scores: warp w the positions w, w+NW, ..., w+NW*(PP-1) of the chunk, all at once (independent chains,
         * their loads in flight together); positions past the chunk's end are computed on the last one, not stored */
        if (warp < nc) {
            int64_t cpos[PP];
#pragma unroll
            for (int u = 0; u < PP; u++) cpos[u] = s0 + (warp + NW * u < nc ? warp + NW * u : nc - 1);
            float a[PP][HB], b[PP][HB];
#pragma unroll
            for (int u = 0; u < PP; u++)
#pragma unroll
                for (int j = 0; j < HB; j++) a[u][j] = b[u][j] = 0.0f;
            lane_dots<HB>(c, kvl, cpos, qs, lane, a);
            lane_dots<HB>(kp, dr, cpos, qp, lane, b);
#pragma unroll
            for (int u = 0; u < PP; u++)
#pragma unroll
                for (int j = 0; j < HB; j++) {
                    const float sa = warp_sum(a[u][j]), sb = warp_sum(b[u][j]);
                    if (lane == 0 && warp + NW * u < nc) sc[j * CH + warp + NW * u] = __fmul_rn(__fadd_rn(sa, sb), scale);
                }
        }
        __syncthreads();
        /* chunk statistics: warp w for heads w, w+NW, ...; lane = position in the chunk */
        for (int j = warp; j < HB; j += NW) {
            const float v = lane < nc ? sc[j * CH + lane] : -INFINITY;
            float mx = v;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
            const float mold = st_m[j], mnew = fmaxf(mold, mx);
            const float e = lane < nc ? expf(__fadd_rn(v, -mnew)) : 0.0f;
            sc[j * CH + lane] = e;
            const float sum = warp_sum(e);
            const float alpha = mold == -INFINITY ? 0.0f : expf(__fadd_rn(mold, -mnew));
            if (lane == 0) {
                st_m[j] = mnew;
                st_l[j] = fmaf(st_l[j], alpha, sum);
                st_a[j] = alpha;
            }
        }
        __syncthreads();
        /* accumulate: a[k] = a[k] * alpha + sum_p e_p c_p[k], positions in order */
#pragma unroll
        for (int j = 0; j < HB; j++) {
            const float al = st_a[j];
            if (al != 1.0f)
#pragma unroll
                for (int kk = 0; kk < KPT; kk++) acc[j][kk] = __fmul_rn(acc[j][kk], al);
        }
#pragma unroll 8
        for (int p = 0; p < nc; p++) {
            const float *cp = c + (int64_t)(s0 + p) * kvl;
            float cv[KPT];
#pragma unroll
            for (int kk = 0; kk < KPT; kk++) {
                const int k = tid + NT * kk;
                cv[kk] = k < kvl ? cp[k] : 0.0f;
            }
#pragma unroll
            for (int j = 0; j < HB; j++) {
                const float e = sc[j * CH + p];
#pragma unroll
                for (int kk = 0; kk < KPT; kk++) acc[j][kk] = fmaf(e, cv[kk], acc[j][kk]);
            }
        }
        __syncthreads(); /* sc and the statistics are rewritten by the next chunk */
    }
#pragma unroll
    for (int j = 0; j < HB; j++) {
        if (h0 + j >= H) break;
        const float l = st_l[j];
        float *o = o_lat + ((int64_t)t * H + h0 + j) * kvl;
#pragma unroll
        for (int kk = 0; kk < KPT; kk++) {
            const int k = tid + NT * kk;
            if (k < kvl) o[k] = __fdiv_rn(acc[j][kk], l);
        }
    }
}

/* o_v [T, H*dv]: block = (head h, VR rows of V_h) x (TT tokens); warp w the rows w, w+VW, ... of its VR.
 * Shared: the tile's o_lat of head h [TT][kvl]. */
template <int ENC, int TT>
__global__ void __launch_bounds__(VW * 32) value_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ ws,
                                                        int H, int dn, int dv, int kvl, const float *__restrict__ o_lat,
                                                        int T, float *__restrict__ o_v) {
    extern __shared__ float val_smem[];
    float *ol = val_smem;
    const int rb = (dv + VR - 1) / VR;
    const int h = blockIdx.x / rb, e0 = (blockIdx.x % rb) * VR;
    const int t0 = blockIdx.y * TT, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < TT * kvl; i += VW * 32) {
        const int t = t0 + i / kvl;
        ol[i] = t < T ? o_lat[((int64_t)t * H + h) * kvl + i % kvl] : 0.0f;
    }
    __syncthreads();
    const int e1 = e0 + VR < dv ? e0 + VR : dv;
    for (int e = e0 + warp; e < e1; e += VW) {
        const int64_t r = (int64_t)h * (dn + dv) + dn + e;
        float acc[TT];
#pragma unroll
        for (int tt = 0; tt < TT; tt++) acc[tt] = 0.0f;
#pragma unroll 4
        for (int k = lane; k < kvl; k += 32) {
            const float w = wdec<ENC>(wd, ws, kvl, r, k);
#pragma unroll
            for (int tt = 0; tt < TT; tt++) acc[tt] = fmaf(w, ol[tt * kvl + k], acc[tt]);
        }
#pragma unroll
        for (int tt = 0; tt < TT; tt++) acc[tt] = warp_sum(acc[tt]);
#pragma unroll
        for (int tt = 0; tt < TT; tt++)
            if (lane == tt && t0 + tt < T) o_v[(int64_t)(t0 + tt) * H * dv + (int64_t)h * dv + e] = acc[tt];
    }
}

struct Shape {
    int T, H, dn, dr, dv, kvl;
    float scale;
};

template <int ENC, int TT>
cudaError_t launch_wk(const uint8_t *d, const uint8_t *s, const Shape &sh, const float *q, float *q_lat,
                      const float *o_lat, float *o_v, int which, cudaStream_t st) {
    const unsigned ty = (unsigned)((sh.T + TT - 1) / TT);
    if (which == 0) {
        const dim3 grid((unsigned)(sh.H * ((sh.kvl + AT - 1) / AT)), ty);
        absorb_kernel<ENC, TT><<<grid, AT, sizeof(float) * TT * sh.dn, st>>>(d, s, sh.H, sh.dn, sh.dr, sh.dv, sh.kvl, q,
                                                                             sh.T, q_lat);
    } else {
        const dim3 grid((unsigned)(sh.H * ((sh.dv + VR - 1) / VR)), ty);
        value_kernel<ENC, TT><<<grid, VW * 32, sizeof(float) * TT * sh.kvl, st>>>(d, s, sh.H, sh.dn, sh.dv, sh.kvl, o_lat,
                                                                                 sh.T, o_v);
    }
    return cudaGetLastError();
}

/* which: 0 = absorb (q -> q_lat), 1 = value (o_lat -> o_v). One token: a tile of 1 (the same chains). */
template <int ENC>
cudaError_t launch_w(const uint8_t *d, const uint8_t *s, const Shape &sh, const float *q, float *q_lat,
                     const float *o_lat, float *o_v, int which, cudaStream_t st) {
    if (sh.T == 1) return launch_wk<ENC, 1>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    return launch_wk<ENC, 8>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
}

cudaError_t launch_weight_kernel(df_wtype type, const void *data, const void *scale, const Shape &sh, const float *q,
                                 float *q_lat, const float *o_lat, float *o_v, int which, cudaStream_t st) {
    const uint8_t *d = static_cast<const uint8_t *>(data), *s = static_cast<const uint8_t *>(scale);
    switch (type) {
    case DF_W_F32: return launch_w<DF_W_F32>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_BF16: return launch_w<DF_W_BF16>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_F16: return launch_w<DF_W_F16>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_FP8_B128: return launch_w<DF_W_FP8_B128>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_INT4_G32: return launch_w<DF_W_INT4_G32>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_MXFP4: return launch_w<DF_W_MXFP4>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    case DF_W_INT8_ROW: return launch_w<DF_W_INT8_ROW>(d, s, sh, q, q_lat, o_lat, o_v, which, st);
    default: return cudaErrorInvalidValue;
    }
}

template <int HB, int KPT>
cudaError_t launch_attn_k(const Shape &sh, const float *q, const float *q_lat, const float *cache, const int64_t *coff,
                          const int64_t *poff, const int *npos, float *o_lat, cudaStream_t st) {
    const size_t smem = sizeof(float) * ((size_t)HB * (sh.kvl + sh.dr + CH) + 3 * HB);
    const dim3 grid((unsigned)sh.T, (unsigned)((sh.H + HB - 1) / HB));
    attn_kernel<HB, KPT><<<grid, NT, smem, st>>>(q, q_lat, cache, coff, poff, npos, sh.H, sh.dn, sh.dr, sh.kvl, sh.scale,
                                                 o_lat);
    return cudaGetLastError();
}

/* Heads per block: 4 when there are blocks enough for the GPU (the latent cache is read once for 4 heads),
 * else 1; columns per thread from kvl. Neither changes a result's bits. */
template <int HB>
cudaError_t launch_attn_h(const Shape &sh, const float *q, const float *q_lat, const float *cache, const int64_t *coff,
                          const int64_t *poff, const int *npos, float *o_lat, cudaStream_t st) {
    if (sh.kvl <= NT) return launch_attn_k<HB, 1>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
    if (sh.kvl <= 2 * NT) return launch_attn_k<HB, 2>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
    if (sh.kvl <= 4 * NT) return launch_attn_k<HB, 4>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
    return launch_attn_k<HB, 8>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
}

cudaError_t launch_attn(const Shape &sh, const float *q, const float *q_lat, const float *cache, const int64_t *coff,
                        const int64_t *poff, const int *npos, float *o_lat, cudaStream_t st) {
    if ((int64_t)sh.T * sh.H >= 1024) return launch_attn_h<4>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
    return launch_attn_h<1>(sh, q, q_lat, cache, coff, poff, npos, o_lat, st);
}

/* Device and pinned host buffers of this file (grow only; the runtime's mutex is held while they are used). */
void *g_dev, *g_host;
size_t g_cdev, g_chost;

size_t up256(size_t n) { return (n + 255) / 256 * 256; }

int err_cuda(const char *what, cudaError_t e) {
    char b[256];
    snprintf(b, sizeof b, "mla_attend: %s: %s", what, cudaGetErrorString(e));
    return cu_rt_error(b);
}
#define CKA(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return err_cuda(#call, e_); } while (0)

int grow_dev(size_t need) {
    if (need <= g_cdev) return 0;
    if (g_dev) cudaFree(g_dev);
    g_dev = NULL;
    g_cdev = 0;
    const size_t n = (need + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    CKA(cudaMalloc(&g_dev, n));
    g_cdev = n;
    return 0;
}

int grow_host(size_t need) {
    if (need <= g_chost) return 0;
    if (g_host) cudaFreeHost(g_host);
    g_host = NULL;
    g_chost = 0;
    const size_t n = (need + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    CKA(cudaHostAlloc(&g_host, n, cudaHostAllocDefault));
    g_chost = n;
    return 0;
}

/* The call with the runtime's mutex held. */
int attend_locked(const df_weight *kv_b, const Shape &sh, const float *q, const float *const *c,
                  const float *const *kpe, const int *npos, float *o_v) {
    const int T = sh.T, H = sh.H, kvl = sh.kvl, dr = sh.dr, qd = sh.dn + sh.dr;
    cudaStream_t st = cu_rt_stream();
    /* the distinct caches (a sequence's rows share one) and the positions each must hold */
    int *slot = (int *)malloc(sizeof(int) * (size_t)T * 2);
    if (!slot) return cu_rt_error("mla_attend: out of host memory");
    int *umax = slot + T, nu = 0;
    /* grouped by the pair (c, kpe): O(T x distinct) */
    const float **uc = (const float **)malloc(sizeof(float *) * (size_t)T * 2);
    if (!uc) { free(slot); return cu_rt_error("mla_attend: out of host memory"); }
    const float **uk = uc + T;
    for (int t = 0; t < T; t++) {
        int u = 0;
        while (u < nu && !(uc[u] == c[t] && uk[u] == kpe[t])) u++;
        if (u == nu) { uc[nu] = c[t]; uk[nu] = kpe[t]; umax[nu] = 0; nu++; }
        slot[t] = u;
        if (npos[t] > umax[u]) umax[u] = npos[t];
    }
    /* layout (bytes), uploaded part first: q | coff | poff | npos | caches; then device-only q_lat, o_lat, o_v */
    const size_t o_q = 0, o_coff = up256(sizeof(float) * (size_t)T * H * qd);
    const size_t o_poff = o_coff + up256(sizeof(int64_t) * (size_t)T), o_np = o_poff + up256(sizeof(int64_t) * (size_t)T);
    const size_t o_cache = o_np + up256(sizeof(int) * (size_t)T);
    size_t cache_floats = 0;
    for (int u = 0; u < nu; u++) cache_floats += ((size_t)umax[u] * kvl + 3) / 4 * 4 + ((size_t)umax[u] * dr + 3) / 4 * 4;
    const size_t up_bytes = o_cache + sizeof(float) * cache_floats;
    const size_t o_qlat = up256(up_bytes), o_olat = o_qlat + up256(sizeof(float) * (size_t)T * H * kvl);
    const size_t o_ov = o_olat + up256(sizeof(float) * (size_t)T * H * kvl);
    const size_t ov_bytes = sizeof(float) * (size_t)T * H * sh.dv;
    const size_t h_ov = up256(up_bytes); /* o_v's place in the host staging */
    int rc = 0;
    const void *wd = NULL, *ws = NULL;
    if (cu_rt_weight(kv_b, &wd, &ws) || grow_dev(o_ov + ov_bytes) || grow_host(h_ov + ov_bytes)) rc = -1;
    if (rc == 0) {
        char *hb = (char *)g_host;
        memcpy(hb + o_q, q, sizeof(float) * (size_t)T * H * qd);
        int64_t *coff = (int64_t *)(hb + o_coff), *poff = (int64_t *)(hb + o_poff);
        int *np = (int *)(hb + o_np);
        float *cb = (float *)(hb + o_cache);
        int64_t *ucoff = (int64_t *)malloc(sizeof(int64_t) * (size_t)nu * 2);
        if (!ucoff) {
            rc = cu_rt_error("mla_attend: out of host memory");
        } else {
            int64_t *upoff = ucoff + nu;
            size_t cur = 0;
            for (int u = 0; u < nu; u++) {
                ucoff[u] = (int64_t)cur;
                memcpy(cb + cur, uc[u], sizeof(float) * (size_t)umax[u] * kvl);
                cur += ((size_t)umax[u] * kvl + 3) / 4 * 4;
                upoff[u] = (int64_t)cur;
                if (dr) memcpy(cb + cur, uk[u], sizeof(float) * (size_t)umax[u] * dr);
                cur += ((size_t)umax[u] * dr + 3) / 4 * 4;
            }
            for (int t = 0; t < T; t++) {
                coff[t] = ucoff[slot[t]];
                poff[t] = upoff[slot[t]];
                np[t] = npos[t];
            }
            free(ucoff);
        }
    }
    free(slot);
    free(uc);
    if (rc) return -1;
    char *db = (char *)g_dev;
    CKA(cudaMemcpyAsync(db, g_host, up_bytes, cudaMemcpyHostToDevice, st));
    const float *dq = (const float *)(db + o_q);
    float *dql = (float *)(db + o_qlat), *dol = (float *)(db + o_olat), *dov = (float *)(db + o_ov);
    CKA(launch_weight_kernel(kv_b->type, wd, ws, sh, dq, dql, NULL, NULL, 0, st));
    CKA(launch_attn(sh, dq, dql, (const float *)(db + o_cache), (const int64_t *)(db + o_coff),
                    (const int64_t *)(db + o_poff), (const int *)(db + o_np), dol, st));
    CKA(launch_weight_kernel(kv_b->type, wd, ws, sh, NULL, NULL, dol, dov, 1, st));
    CKA(cudaMemcpyAsync((char *)g_host + h_ov, dov, ov_bytes, cudaMemcpyDeviceToHost, st));
    CKA(cudaStreamSynchronize(st));
    memcpy(o_v, (char *)g_host + h_ov, ov_bytes);
    return 0;
}

} // namespace

extern "C" int df_cuda_mla_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale,
                                  const float *q, const float *const *c, const float *const *kpe, const int *npos,
                                  float *o_v) {
    if (T <= 0) return 0;
    char b[200];
    if (H <= 0 || dn <= 0 || dr < 0 || dv <= 0 || kvl <= 0 || kv_b->rows != (int64_t)H * (dn + dv) || kv_b->cols != kvl) {
        snprintf(b, sizeof b, "mla_attend: kv_b [%lld, %lld] does not match %d heads x (%d + %d) rows, %d columns",
                 (long long)kv_b->rows, (long long)kv_b->cols, H, dn, dv, kvl);
        return cu_rt_error(b);
    }
    if ((int)kv_b->type < 0 || kv_b->type >= DF_W__COUNT ||
        ((kv_b->type == DF_W_INT4_G32 || kv_b->type == DF_W_MXFP4) && kvl % 32)) {
        snprintf(b, sizeof b, "mla_attend: kv_b encoding %d with %d columns not supported", (int)kv_b->type, kvl);
        return cu_rt_error(b);
    }
    /* kvl: NT x 8 accumulators per thread; shared memory: 48 KB per block for each kernel */
    const size_t smem_attn = sizeof(float) * ((size_t)4 * (kvl + dr + CH) + 12);
    if (kvl > KMAX || smem_attn > 48 * 1024 || sizeof(float) * 8 * (size_t)dn > 48 * 1024 ||
        sizeof(float) * 8 * (size_t)kvl > 48 * 1024 || T > 65535 * 8 || (int64_t)H * ((dv + VR - 1) / VR) > 0x7fffffff) {
        snprintf(b, sizeof b, "mla_attend: shape not supported on the GPU (T %d, kv_lora_rank %d, nope %d, rope %d)", T,
                 kvl, dn, dr);
        return cu_rt_error(b);
    }
    for (int t = 0; t < T; t++)
        if (npos[t] < 1 || !c[t] || (dr && !kpe[t])) {
            snprintf(b, sizeof b, "mla_attend: row %d attends to %d positions", t, npos[t]);
            return cu_rt_error(b);
        }
    if (cu_rt_lock()) return -1;
    const Shape sh = {T, H, dn, dr, dv, kvl, scale};
    int rc = attend_locked(kv_b, sh, q, c, kpe, npos, o_v);
    if (rc) {
        cudaStreamSynchronize(cu_rt_stream()); /* no queued copy may still read a host buffer after an error return */
        cudaGetLastError();
    }
    cu_rt_unlock();
    return rc;
}
