/*
 * cuda_attn.cu — the MLA attention core on the GPU (df_backend.mla_attend, kernels/cuda.h
 * df_cuda_mla_attend): the absorbed form of src/engine/attention.c,
 *   q_lat[t,h,:] = K_h^T q_nope[t,h]                       (absorb_kernel)
 *   s = (q_lat[t,h] . c_s + q_pe[t,h] . kpe_s) * scale, s < npos[t]; p = softmax(s);
 *   o_lat[t,h,:] = sum_s p_s c_s                           (attn_kernel)
 *   o_v[t, h*dv + e] = V_h[e,:] . o_lat[t,h,:]             (value_kernel; one token: value1_kernel)
 * with kv_b rows per head h = [K_h (dn rows) ; V_h (dv rows)] over kvl columns, decoded element by element
 * exactly as the CPU's decode_row (every encoding of model/weights.h; kernels/dtype.h). One call: the rows' q,
 * a row table and the latent cache rows the device lacks go up in one copy from pinned staging, a scatter kernel
 * moves mirrored caches' new rows into place, three kernels, o_v comes back; one synchronisation. A cache with a
 * nonzero seq_key has a device mirror kept between calls (only rows from the first one the call writes, or the
 * mirror lacks, are copied: one row per sequence and layer in a decode step); a cache with key 0, or one no mirror
 * has room for, is staged whole for the call (rows of one sequence share it: [0, max npos of its rows) once).
 * The attention kernel reads each row's cache through a per-row device pointer, so both kinds mix in one call and
 * give the same bits. kv_b comes from the weight cache of cuda_runtime.cu (keyed by host address, like a resident
 * spine weight).
 *
 * Canonical order (batch invariance: an output depends only on its row's own data, never on T, the other
 * rows, the tiles or the grid):
 *   - q_lat[t,h,k]: AS = 4 fp32 chains over the slices d in [s dn / 4, (s + 1) dn / 4) in order, fma(q_nope[d],
 *     K[d,k], acc) from 0, added in slice order ((c0 + c1) + c2) + c3;
 *   - a score: two dots, each lane l of a warp taking the elements l, l+32, ... in order (fma chain from 0),
 *     the 32 lane sums combined by the xor butterfly (16, 8, 4, 2, 1); score = (dot_c + dot_pe) * scale;
 *   - softmax over the positions in chunks of 32 (online, chunks in order): chunk max m_c (exact), running max
 *     m = max(m, m_c), e_s = expf(s - m), the chunk's sum by the xor butterfly over its 32 lanes, running sum
 *     l = fma(l, alpha, chunk sum) and accumulator a = a * alpha with alpha = expf(m_old - m) (0 for the first
 *     chunk, and exactly 1 while the max does not change); a[k] += e_s c_s[k] by fma, positions in order;
 *     o_lat = a / l. Positions in segments of seg_len(npos) positions (32, doubled while a row would have
 *     more than 8 segments, up to 256), a block each (so a short context is walked by several blocks per head and a
 *     long one by many blocks at once); a row with more than one segment combines the segments' (m_s, l_s, a_s) in segment order:
 *     M = max m_s, w_s = expf(m_s - M), l = sum l_s w_s, o = sum a_s w_s (fma chains), o_lat = o / l. The
 *     segments depend only on the row's own npos;
 *   - o_v[t,h,e]: the lane-partial chains over k = l, l+32, ... (fma) and the xor butterfly.
 * All arithmetic on fp32 values (nothing rounded below fp32) with explicit fmaf / __fmul_rn / __fadd_rn /
 * __fdiv_rn, so no contraction choice of the compiler can differ between the kernel variants (tokens per tile,
 * heads per block), which therefore give the same bits.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
#include "cuda_decode.cuh"
#include "kernels/cuda_env.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

constexpr int AT = 128;     /* absorb: columns per block */
constexpr int AS = 4;       /* absorb: slices of q_nope's dn elements, a thread each per column */
constexpr int NT = 128;     /* attention: threads per block */
constexpr int NW = NT / 32; /* attention: warps per block */
constexpr int CH = 32;      /* attention: positions per softmax chunk (one per lane in the chunk statistics) */
constexpr int PP = CH / NW; /* attention: positions per warp in a chunk's scores */
constexpr int VW = 4;       /* value: warps per block */
constexpr int VR = 16;      /* value: rows of V_h per block (one token: VR1, a row per warp) */
constexpr int VR1 = 4;
constexpr int KMAX = 1024;  /* largest kv_lora_rank (NT x 8 accumulators per thread) */
constexpr int SEG = 256;    /* attention: most positions per segment (a block each; more than one: partials combined) */

/* Positions per segment of a row of npos positions (part of the canonical order: a function of the row's own npos
 * only): 32, doubled while that makes more than 8 segments, at most SEG. */
__host__ __device__ __forceinline__ int seg_len(int npos) {
    int L = CH;
    while (L < SEG && (npos + L - 1) / L > 8) L *= 2;
    return L;
}
/* The most segments of any row of at most maxn positions. */
inline int nseg_bound(int maxn) {
    const int a = (maxn + CH - 1) / CH, b = (maxn + SEG - 1) / SEG;
    return a < (b > 8 ? b : 8) ? a : (b > 8 ? b : 8);
}

/* One lane's part of the dot products of PP cached rows (src[cpos[u] * n ..], n elements) with HB query rows
 * (q[j * n ..]): elements lane, lane + 32, ... into acc[u][j] by fma in that order. */
template <int HB>
__device__ __forceinline__ void lane_dots(const float *src, int n, const int64_t *cpos, const float *q, int lane,
                                          float (&acc)[PP][HB]) {
#pragma unroll 4
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

/* q_lat [T, H, kvl]: block (h, a tile of AT columns) x (a tile of TT tokens); AS threads per column k, thread
 * (s, k) the chain over d in slice s = [s dn / AS, (s + 1) dn / AS), the AS partial sums then added in slice order.
 * q [T, H, dn + dr]; kv_b [H*(dn+dv), kvl]. Shared: the tile's q_nope [TT][dn], the partials [AS][TT][AT]. */
template <int ENC, int TT>
__global__ void __launch_bounds__(AT * AS) absorb_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ ws,
                                                         int H, int dn, int dr, int dv, int kvl,
                                                         const float *__restrict__ q, int T, float *__restrict__ q_lat) {
    pdl_enter();
    extern __shared__ float abs_smem[];
    float *qn = abs_smem, *part = abs_smem + TT * dn;
    const int kb = (kvl + AT - 1) / AT, sl = threadIdx.x / AT, kk = threadIdx.x % AT;
    const int h = blockIdx.x / kb, k = (blockIdx.x % kb) * AT + kk;
    const int t0 = blockIdx.y * TT, qd = dn + dr;
    for (int i = threadIdx.x; i < TT * dn; i += AT * AS) {
        const int t = t0 + i / dn;
        qn[i] = t < T ? q[((int64_t)t * H + h) * qd + i % dn] : 0.0f;
    }
    __syncthreads();
    float acc[TT];
#pragma unroll
    for (int tt = 0; tt < TT; tt++) acc[tt] = 0.0f;
    if (k < kvl) {
        const int64_t r0 = (int64_t)h * (dn + dv);
        const int d0 = sl * dn / AS, d1 = (sl + 1) * dn / AS;
#pragma unroll 16
        for (int d = d0; d < d1; d++) {
            const float w = wdec<ENC>(wd, ws, kvl, r0 + d, k);
#pragma unroll
            for (int tt = 0; tt < TT; tt++) acc[tt] = fmaf(qn[tt * dn + d], w, acc[tt]);
        }
    }
#pragma unroll
    for (int tt = 0; tt < TT; tt++) part[(sl * TT + tt) * AT + kk] = acc[tt];
    __syncthreads();
    if (sl != 0 || k >= kvl) return;
#pragma unroll
    for (int tt = 0; tt < TT; tt++) {
        float v = part[tt * AT + kk];
#pragma unroll
        for (int j = 1; j < AS; j++) v = __fadd_rn(v, part[(j * TT + tt) * AT + kk]);
        if (t0 + tt < T) q_lat[((int64_t)(t0 + tt) * H + h) * kvl + k] = v;
    }
}

/* o_lat[h] of a row whose positions span ns > 1 segments, from the segments' partials p ([ns][kvl + 2]: a_s, then
 * m_s and l_s), by the NT threads of a block (thread = columns k, k + NT, ...): M = the segments' largest max;
 * w_s = expf(m_s - M); l = sum_s l_s w_s and o = sum_s a_s w_s (fma, segments in order); o_lat = o / l. The partials
 * were written by other blocks of this grid: read through L2 (__ldcg) after their fence. */
__device__ __forceinline__ void combine_segments(const float *p, int ns, int kvl, float *o) {
    float M = -INFINITY;
    for (int sg = 0; sg < ns; sg++) M = fmaxf(M, __ldcg(p + (int64_t)sg * (kvl + 2) + kvl));
    float l = 0.0f;
    for (int sg = 0; sg < ns; sg++) {
        const float *ps = p + (int64_t)sg * (kvl + 2);
        l = fmaf(__ldcg(ps + kvl + 1), expf(__fadd_rn(__ldcg(ps + kvl), -M)), l);
    }
    for (int k = threadIdx.x; k < kvl; k += NT) {
        float a = 0.0f;
        for (int sg = 0; sg < ns; sg++) {
            const float *ps = p + (int64_t)sg * (kvl + 2);
            a = fmaf(__ldcg(ps + k), expf(__fadd_rn(__ldcg(ps + kvl), -M)), a);
        }
        o[k] = __fdiv_rn(a, l);
    }
}

/* o_lat [T, H, kvl]: block = row t x HB heads (blockIdx.y * HB ..); thread tid owns the columns
 * k = tid + NT*kk, kk < KPT. Row t's latent cache in device memory (a mirror, or this call's staging): c at
 * cptr[t] ([npos[t], kvl]), k_pe at pptr[t] ([npos[t], dr]); cptr NULL: one row (T = 1), its cache r1. */
template <int HB, int KPT>
__global__ void __launch_bounds__(NT) attn_kernel(const float *__restrict__ q, const float *__restrict__ q_lat,
                                                  const float *const *__restrict__ cptr,
                                                  const float *const *__restrict__ pptr, const int *__restrict__ npos,
                                                  int H, int dn, int dr, int kvl, float scale, float *__restrict__ o_lat,
                                                  int t0, int nsegm, float *__restrict__ part,
                                                  unsigned *__restrict__ cnt, const cu_row1 r1) {
    pdl_enter();
    extern __shared__ float att_smem[];
    float *qs = att_smem;             /* [HB][kvl] q_lat */
    float *qp = qs + HB * kvl;        /* [HB][dr] q_pe */
    float *sc = qp + HB * dr;         /* [HB][CH] scores, then exp weights */
    float *st_m = sc + HB * CH;       /* [HB] running max */
    float *st_l = st_m + HB;          /* [HB] running sum */
    float *st_a = st_l + HB;          /* [HB] this chunk's rescaling */
    const int t = t0 + blockIdx.x, h0 = blockIdx.y * HB, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qd = dn + dr;
    const int n_all = cptr ? npos[t] : r1.npos, L = seg_len(n_all), sb = blockIdx.z * L; /* this block's segment: [sb, min(n_all, sb + L)) */
    if (sb >= n_all) return;
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
    const float *c = (cptr ? cptr[t] : r1.c) + (int64_t)sb * kvl, *kp = (cptr ? pptr[t] : r1.p) + (int64_t)sb * dr;
    const int n = n_all - sb < L ? n_all - sb : L;
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
    /* one segment: the result; several: this segment's max, sum and accumulator, and the row's last block to finish
     * combines them (combine_segments) */
    const bool whole = n_all <= L;
#pragma unroll
    for (int j = 0; j < HB; j++) {
        if (h0 + j >= H) break;
        const float l = st_l[j];
        float *o = whole ? o_lat + ((int64_t)t * H + h0 + j) * kvl
                         : part + (((int64_t)(t - t0) * H + h0 + j) * nsegm + blockIdx.z) * (kvl + 2);
#pragma unroll
        for (int kk = 0; kk < KPT; kk++) {
            const int k = tid + NT * kk;
            if (k < kvl) o[k] = whole ? __fdiv_rn(acc[j][kk], l) : acc[j][kk];
        }
        if (!whole && tid == 0) {
            o[kvl] = st_m[j];
            o[kvl + 1] = l;
        }
    }
    if (whole) return;
    /* cnt[row, head group] counts the row's segments done; atomicInc wraps it to 0 at the last one (ready for the
     * next launch) */
    __shared__ int last;
    __threadfence();
    __syncthreads();
    const int ns = (n_all + L - 1) / L;
    if (tid == 0) {
        unsigned *c = cnt + (int64_t)(t - t0) * gridDim.y + blockIdx.y;
        last = atomicInc(c, (unsigned)ns - 1u) == (unsigned)ns - 1u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int j = 0; j < HB && h0 + j < H; j++)
        combine_segments(part + ((int64_t)(t - t0) * H + h0 + j) * nsegm * (kvl + 2), ns, kvl,
                         o_lat + ((int64_t)t * H + h0 + j) * kvl);
}

/* o_v [T, H*dv]: block = (head h, NR rows of V_h) x (TT tokens); warp w the rows w, w+VW, ... of its NR.
 * Shared: the tile's o_lat of head h [TT][kvl]. */
template <int ENC, int TT, int NR>
__global__ void __launch_bounds__(VW * 32) value_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ ws,
                                                        int H, int dn, int dv, int kvl, const float *__restrict__ o_lat,
                                                        int T, float *__restrict__ o_v) {
    pdl_enter();
    extern __shared__ float val_smem[];
    float *ol = val_smem;
    const int rb = (dv + NR - 1) / NR;
    const int h = blockIdx.x / rb, e0 = (blockIdx.x % rb) * NR;
    const int t0 = blockIdx.y * TT, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < TT * kvl; i += VW * 32) {
        const int t = t0 + i / kvl;
        ol[i] = t < T ? o_lat[((int64_t)t * H + h) * kvl + i % kvl] : 0.0f;
    }
    __syncthreads();
    const int e1 = e0 + NR < dv ? e0 + NR : dv;
    for (int e = e0 + warp; e < e1; e += VW) {
        const int64_t r = (int64_t)h * (dn + dv) + dn + e;
        float acc[TT];
#pragma unroll
        for (int tt = 0; tt < TT; tt++) acc[tt] = 0.0f;
#pragma unroll 16
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

/* o_v of one token (T = 1): value_kernel's chains (warp = row e of V_h; lane l: k = l, l + 32, ... by fma from 0,
 * then the xor butterfly), the row first read as vectors (wdec8) into shared memory. Block = head h x VW rows.
 * Needs kvl % 8 == 0 and 16-byte aligned weights. Shared: o_lat of head h [kvl], the rows [VW][kvl]. */
template <int ENC>
__global__ void __launch_bounds__(VW * 32) value1_kernel(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ ws,
                                                         int H, int dn, int dv, int kvl, const float *__restrict__ o_lat,
                                                         float *__restrict__ o_v) {
    pdl_enter();
    extern __shared__ float val_smem[];
    const int rb = (dv + VW - 1) / VW, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int h = blockIdx.x / rb, e = (blockIdx.x % rb) * VW + warp;
    float *ol = val_smem, *row = val_smem + kvl + warp * kvl;
    const bool live = e < dv;
    if (live) { /* the row into shared memory (its loads in flight beside o_lat's) */
        const int64_t r = (int64_t)h * (dn + dv) + dn + e;
        for (int g = lane; g < kvl / 8; g += 32) {
            float w[8];
            wdec8<ENC>(wd, ws, kvl, r, (int64_t)g * 8, w);
            reinterpret_cast<float4 *>(row + g * 8)[0] = make_float4(w[0], w[1], w[2], w[3]);
            reinterpret_cast<float4 *>(row + g * 8)[1] = make_float4(w[4], w[5], w[6], w[7]);
        }
    }
    for (int i = threadIdx.x; i < kvl; i += VW * 32) ol[i] = o_lat[(int64_t)h * kvl + i];
    __syncthreads();
    if (!live) return;
    float acc = 0.0f;
#pragma unroll 16
    for (int k = lane; k < kvl; k += 32) acc = fmaf(row[k], ol[k], acc);
    acc = warp_sum(acc);
    if (lane == 0) o_v[(int64_t)h * dv + e] = acc;
}

struct Shape {
    int T, H, dn, dr, dv, kvl;
    float scale;
    int maxn; /* the most positions a row attends to */
};

template <int ENC, int TT>
cudaError_t launch_wk(const uint8_t *d, const uint8_t *s, const Shape &sh, const float *q, float *q_lat,
                      const float *o_lat, float *o_v, int which, cudaStream_t st) {
    const unsigned ty = (unsigned)((sh.T + TT - 1) / TT);
    const bool vec = TT == 1 && sh.kvl % 8 == 0 && ((uintptr_t)d & 15) == 0;
    if (vec && which == 1) {
        const dim3 grid((unsigned)(sh.H * ((sh.dv + VW - 1) / VW)));
        cu_launch(value1_kernel<ENC>, grid, VW * 32, sizeof(float) * (1 + VW) * sh.kvl, st, d, s, sh.H, sh.dn, sh.dv,
                  sh.kvl, o_lat, o_v);
    } else if (which == 0) {
        const dim3 grid((unsigned)(sh.H * ((sh.kvl + AT - 1) / AT)), ty);
        cu_launch(absorb_kernel<ENC, TT>, grid, AT * AS, sizeof(float) * TT * (sh.dn + AS * AT), st, d, s, sh.H, sh.dn, sh.dr, sh.dv, sh.kvl, q,
                                                                             sh.T, q_lat);
    } else {
        /* one token: a row per warp (more blocks in flight); a tile of tokens: 16 rows per block share its o_lat */
        constexpr int NR = TT == 1 ? VR1 : VR;
        const dim3 grid((unsigned)(sh.H * ((sh.dv + NR - 1) / NR)), ty);
        cu_launch(value_kernel<ENC, TT, NR>, grid, VW * 32, sizeof(float) * TT * sh.kvl, st, d, s, sh.H, sh.dn, sh.dv, sh.kvl,
                                                                                     o_lat, sh.T, o_v);
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

typedef const float *const *Ptrs; /* per row, a device pointer to its cache's c or k_pe rows */

/* Partial results of the segmented rows (device, grown on demand; the runtime's mutex is held while in use), and the
 * most bytes they may take: rows go through the attention kernel in groups that fit. */
float *g_part;
size_t g_cpart;
unsigned *g_cnt; /* [rows][head groups] segment counters of the attention kernel, zero between launches */
size_t g_ccnt;
constexpr size_t PART_MAX = (size_t)256 << 20;

/* The attention kernel over rows [0, T) in groups of rows whose partials fit PART_MAX (a segmented row is combined
 * by its last block). */
template <int HB, int KPT>
cudaError_t launch_attn_k(const Shape &sh, const float *q, const float *q_lat, Ptrs cptr, Ptrs pptr, const int *npos,
                          const cu_row1 &r1, float *o_lat, cudaStream_t st) {
    const size_t smem = sizeof(float) * ((size_t)HB * (sh.kvl + sh.dr + CH) + 3 * HB);
    const int nsegm = nseg_bound(sh.maxn);
    const size_t row_part = nsegm > 1 ? sizeof(float) * (size_t)sh.H * nsegm * (sh.kvl + 2) : 0;
    int rows = row_part ? (int)(PART_MAX / row_part) : sh.T;
    if (rows < 1) rows = 1;
    if (rows > sh.T) rows = sh.T;
    if (row_part && row_part * (size_t)rows > g_cpart) {
        cudaError_t e = cudaStreamSynchronize(st); /* the old buffer may still be read */
        if (e != cudaSuccess) return e;
        if (g_part) cudaFree(g_part);
        g_part = NULL;
        g_cpart = 0;
        if ((e = cudaMalloc(&g_part, row_part * (size_t)rows)) != cudaSuccess) return e;
        g_cpart = row_part * (size_t)rows;
    }
    const size_t ncnt = (size_t)rows * (size_t)((sh.H + HB - 1) / HB);
    if (row_part && ncnt > g_ccnt) {
        cudaError_t e = cudaStreamSynchronize(st);
        if (e != cudaSuccess) return e;
        if (g_cnt) cudaFree(g_cnt);
        g_cnt = NULL;
        g_ccnt = 0;
        if ((e = cudaMalloc(&g_cnt, sizeof(unsigned) * ncnt)) != cudaSuccess) return e;
        if ((e = cudaMemsetAsync(g_cnt, 0, sizeof(unsigned) * ncnt, st)) != cudaSuccess) return e;
        g_ccnt = ncnt;
    }
    for (int t0 = 0; t0 < sh.T; t0 += rows) {
        const int n = sh.T - t0 < rows ? sh.T - t0 : rows;
        const dim3 grid((unsigned)n, (unsigned)((sh.H + HB - 1) / HB), (unsigned)nsegm);
        cu_launch(attn_kernel<HB, KPT>, grid, NT, smem, st, q, q_lat, cptr, pptr, npos, sh.H, sh.dn, sh.dr, sh.kvl, sh.scale,
                                                     o_lat, t0, nsegm, g_part, g_cnt, r1);
        const cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
}

/* Heads per block: 4 when there are blocks enough for the GPU (the latent cache is read once for 4 heads),
 * else 1; columns per thread from kvl. Neither changes a result's bits. */
template <int HB>
cudaError_t launch_attn_h(const Shape &sh, const float *q, const float *q_lat, Ptrs cptr, Ptrs pptr, const int *npos,
                          const cu_row1 &r1, float *o_lat, cudaStream_t st) {
    if (sh.kvl <= NT) return launch_attn_k<HB, 1>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
    if (sh.kvl <= 2 * NT) return launch_attn_k<HB, 2>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
    if (sh.kvl <= 4 * NT) return launch_attn_k<HB, 4>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
    return launch_attn_k<HB, 8>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
}

/* cptr NULL: one row (T = 1) whose cache is r1 */
cudaError_t launch_attn(const Shape &sh, const float *q, const float *q_lat, Ptrs cptr, Ptrs pptr, const int *npos,
                        const cu_row1 &r1, float *o_lat, cudaStream_t st) {
    if ((int64_t)sh.T * sh.H >= 1024) return launch_attn_h<4>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
    return launch_attn_h<1>(sh, q, q_lat, cptr, pptr, npos, r1, o_lat, st);
}

/* A copy of n floats within device memory (a mirror's new rows from the staging area). */
struct Seg {
    const float *src;
    float *dst;
    long long n;
};

/* Every segment's copy: block (x, y) copies part of segment y, element by element. */
__global__ void __launch_bounds__(256) scatter_kernel(const Seg *__restrict__ seg) {
    pdl_enter();
    const Seg s = seg[blockIdx.y];
    for (long long i = (long long)blockIdx.x * 256 + threadIdx.x; i < s.n; i += (long long)gridDim.x * 256) s.dst[i] = s.src[i];
}

/* The device buffer of this file (grow only; the runtime's mutex is held while it is used). */
void *g_dev;
size_t g_cdev;
/* Pinned host staging, two buffers taken by turns, so that a call may return before the device has read its upload or
 * written its returned part (an asynchronous block, see attend_locked): a buffer is reused only once the event
 * recorded after its call's last copy has completed, and such a call's cache rows (pend) are written into the host
 * caches then, or at the next call that synchronises, or before any call reads host cache rows. */
struct HostBuf {
    void *p;
    size_t cap;
    cudaEvent_t ev;
    int ev_live;
    int pend;             /* an asynchronous block's row, still to be written into the host caches */
    float *dst_c, *dst_p; /* host rows (kvl, dr floats) */
    size_t off_c, off_p;  /* their values in this buffer */
    int kvl, dr;
    uint64_t key;         /* the cache's seq_key */
};
HostBuf g_hb[2];
int g_hcur;
/* The last one-row block's h2: its host array (bk->h2) and its device copy in g_dev, until the next call (cu_attn_h2) */
struct {
    const float *host;
    const float *dev;
} g_h2;

size_t up256(size_t n) { return (n + 255) / 256 * 256; }
size_t up4(size_t n) { return (n + 3) / 4 * 4; }

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

/* h2's split for the routed experts' grouped tensor-core launches: add_rmsnorm writes it beside h2, cu_rt_moe_route's
 * gate / up launch reads it (both on the stream, in that order), so no split launch runs between them. */
void *g_h2xs;
size_t g_ch2xs;

/* Host buffer i once the device is done with it: its last call's copies complete, its pending row written. */
int host_wait(int i) {
    HostBuf &h = g_hb[i];
    if (h.ev_live) {
        CKA(cudaEventSynchronize(h.ev));
        h.ev_live = 0;
    }
    if (h.pend) {
        memcpy(h.dst_c, (const char *)h.p + h.off_c, sizeof(float) * (size_t)h.kvl);
        if (h.dr) memcpy(h.dst_p, (const char *)h.p + h.off_p, sizeof(float) * (size_t)h.dr);
        h.pend = 0;
    }
    return 0;
}

} // namespace

const float *cu_attn_h2(const float *host) { return host && host == g_h2.host ? g_h2.dev : NULL; }

/* The asynchronous blocks' rows whose copies have completed, into the host caches (cuda_internal.h). */
void cu_attn_settle(void) {
    for (int i = 0; i < 2; i++) {
        HostBuf &h = g_hb[i];
        if (h.pend && (!h.ev_live || cudaEventQuery(h.ev) == cudaSuccess)) host_wait(i);
    }
}

namespace {

int grow_host(int i, size_t need) {
    HostBuf &h = g_hb[i];
    if (need <= h.cap) return 0;
    if (h.p) cudaFreeHost(h.p); /* host_wait(i) came first: no copy reads or writes it */
    h.p = NULL;
    h.cap = 0;
    const size_t n = (need + (1u << 20) - 1) / (1u << 20) * (1u << 20);
    CKA(cudaHostAlloc(&h.p, n, cudaHostAllocDefault));
    h.cap = n;
    return 0;
}

/* ---- Device mirrors of latent caches (seq_key != 0), under the runtime's mutex.
 * A mirror holds rows [0, valid) of one key's c and k_pe, equal to the host's as the last calls read them. A call
 * lowers valid to its first written row (the seq_key contract), grows the arrays when its rows need more positions
 * (capacity doubling, at least MIR_MIN, the valid rows copied over), and copies rows [valid, max npos) in through
 * the staging. All mirrors together hold at most g_mcap bytes (DF_CUDA_KV_MIRROR); the least recently used ones
 * not in the current call are dropped to make room; a cache no mirror has room for is staged whole (no error). */

constexpr size_t MIR_RESERVE = (size_t)1 << 30; /* device memory left free by a mirror's growth (scratch, context) */
constexpr int MIR_MIN = 256;                     /* smallest capacity (positions) */
constexpr int MBUCKET = 4096;

struct Mirror {
    uint64_t key;
    void *mem;        /* one allocation: c [cap, kvl] at mem, k_pe [cap, dr] at mem + pe_off */
    size_t bytes, pe_off;
    int cap, valid, kvl, dr;
    uint64_t tick;    /* the last call that used it */
    int next;         /* bucket chain / free list; -1 = end */
    int used;
};

Mirror *g_mir;
int g_nmir, g_capmir, g_mfree = -1;
int g_mlive;          /* mirrors in the table (read without the mutex by mir_forget_keys: atomic) */
int g_mbucket[MBUCKET];
int g_minit;          /* DF_CUDA_KV_MIRROR read */
int g_mon;            /* mirrors on */
int g_mbad;           /* DF_CUDA_KV_MIRROR invalid (g_mwhy): every call fails */
char g_mwhy[256];
size_t g_mcap, g_mbytes;
uint64_t g_mcall;     /* calls so far: the LRU clock */

unsigned mir_bucket(uint64_t k) { return (unsigned)((k * 0x9E3779B97F4A7C15ull) >> 52) & (MBUCKET - 1); }

/* DF_CUDA_KV_MIRROR (cuda_env.h) on the first call: the cap, default 1/8 of the device's memory. */
void mir_setup() {
    if (g_minit) return;
    g_minit = 1;
    for (int i = 0; i < MBUCKET; i++) g_mbucket[i] = -1;
    const int r = cu_kv_mirror_cap(&g_mcap, g_mwhy, sizeof g_mwhy);
    if (r < 0) { g_mbad = 1; return; }
    g_mon = r > 0 && g_mcap > 0;
}

int mir_find(uint64_t key) {
    for (int i = g_mbucket[mir_bucket(key)]; i >= 0; i = g_mir[i].next)
        if (g_mir[i].key == key) return i;
    return -1;
}

/* An empty mirror for key (no device memory yet); -1 when the host is out of memory. */
int mir_add(uint64_t key, int kvl, int dr) {
    int i;
    if (g_mfree >= 0) {
        i = g_mfree;
        g_mfree = g_mir[i].next;
    } else {
        if (g_nmir == g_capmir) {
            const int nc = g_capmir ? 2 * g_capmir : 256;
            Mirror *n = (Mirror *)realloc(g_mir, sizeof(Mirror) * (size_t)nc);
            if (!n) return -1;
            g_mir = n;
            g_capmir = nc;
        }
        i = g_nmir++;
    }
    Mirror *m = &g_mir[i];
    memset(m, 0, sizeof *m);
    m->key = key;
    m->kvl = kvl;
    m->dr = dr;
    m->used = 1;
    const unsigned b = mir_bucket(key);
    m->next = g_mbucket[b];
    g_mbucket[b] = i;
    __atomic_add_fetch(&g_mlive, 1, __ATOMIC_RELAXED);
    return i;
}

/* Drop mirror i: its memory is freed stream-ordered (after the work queued that may still read it). */
void mir_drop(int i) {
    Mirror *m = &g_mir[i];
    int *pp = &g_mbucket[mir_bucket(m->key)];
    while (*pp != i) pp = &g_mir[*pp].next;
    *pp = m->next;
    if (m->mem) cudaFreeAsync(m->mem, cu_rt_stream());
    g_mbytes -= m->bytes;
    m->used = 0;
    m->next = g_mfree;
    g_mfree = i;
    __atomic_sub_fetch(&g_mlive, 1, __ATOMIC_RELAXED);
}

/* Drop the least recently used mirror holding memory that the call `tick` does not use; 0 when there is none. */
int mir_evict(uint64_t tick) {
    int best = -1;
    for (int i = 0; i < g_nmir; i++)
        if (g_mir[i].used && g_mir[i].mem && g_mir[i].tick != tick && (best < 0 || g_mir[i].tick < g_mir[best].tick))
            best = i;
    if (best < 0) return 0;
    mir_drop(best);
    return 1;
}

/* Room for `need` positions in mirror i: 0 (grown if it had to, the valid rows copied to the new arrays), 1 when
 * there is no room (under the cap after evicting, in free device memory, or the allocation failed: the caller
 * stages the cache instead), -1 on a CUDA error (recorded). */
int mir_reserve(int i, int need, uint64_t tick) {
    Mirror *m = &g_mir[i];
    if (need <= m->cap) return 0;
    int cap = m->cap * 2 > need ? m->cap * 2 : need;
    if (cap < MIR_MIN) cap = MIR_MIN;
    const size_t pe_off = up256(sizeof(float) * (size_t)cap * m->kvl);
    const size_t bytes = pe_off + up256(sizeof(float) * (size_t)cap * m->dr);
    if (bytes > g_mcap) return 1;
    while (g_mbytes - m->bytes + bytes > g_mcap)
        if (!mir_evict(tick)) return 1;
    size_t fr = 0, tot = 0;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) { cudaGetLastError(); return 1; }
    if (fr < bytes + MIR_RESERVE) return 1;
    cudaStream_t st = cu_rt_stream();
    void *mem = NULL;
    if (cudaMallocAsync(&mem, bytes, st) != cudaSuccess) { cudaGetLastError(); return 1; }
    if (m->valid > 0) {
        cudaError_t e = cudaMemcpyAsync(mem, m->mem, sizeof(float) * (size_t)m->valid * m->kvl,
                                        cudaMemcpyDeviceToDevice, st);
        if (e == cudaSuccess && m->dr)
            e = cudaMemcpyAsync((char *)mem + pe_off, (char *)m->mem + m->pe_off, sizeof(float) * (size_t)m->valid * m->dr,
                                cudaMemcpyDeviceToDevice, st);
        if (e != cudaSuccess) {
            cudaFreeAsync(mem, st);
            return err_cuda("cudaMemcpyAsync (growing a KV mirror)", e);
        }
    }
    if (m->mem) cudaFreeAsync(m->mem, st);
    g_mbytes += bytes - m->bytes;
    m->mem = mem;
    m->bytes = bytes;
    m->pe_off = pe_off;
    m->cap = cap;
    return 0;
}

/* Drop the mirrors of the keys of a call that failed (their rows' state on the device is unknown). */
void mir_forget_keys(int T, const uint64_t *key, int locked) {
    if (!key || !__atomic_load_n(&g_mlive, __ATOMIC_RELAXED)) return;
    if (!locked && cu_rt_lock()) return;
    for (int t = 0; t < T; t++) {
        const int i = key[t] ? mir_find(key[t]) : -1;
        if (i >= 0) mir_drop(i);
    }
    if (!locked) cu_rt_unlock();
}

/* The distinct caches of a call. */
struct Unit {
    const float *c, *k; /* host rows */
    uint64_t key;       /* 0: staged whole */
    int first, need;    /* min (npos - 1) and max npos over its rows */
    int mir;            /* its mirror, or -1: rows [0, need) staged for this call */
    int lo;             /* first row copied in: the mirror's valid rows, 0 when staged */
    size_t off_c, off_p;/* its copied rows in the staging's cache area (floats) */
};

/* Group the rows into units (u[slot[t]] is row t's): keyed rows by key (mirrors on), the others by their (c, kpe)
 * pair, O(T x units); then each keyed unit's mirror found or made, its valid rows cut to the unit's first row and
 * room made for its positions. Returns the number of units, or -1 (recorded). */
int plan_units(int T, const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
               int kvl, int dr, Unit *u, int *slot) {
    int nu = 0;
    for (int t = 0; t < T; t++) {
        const uint64_t key = g_mon && seq_key ? seq_key[t] : 0;
        int j = 0;
        while (j < nu && !(u[j].key == key && (key ? 1 : u[j].c == c[t] && u[j].k == kpe[t]))) j++;
        if (j == nu) {
            u[nu] = Unit{c[t], kpe[t], key, npos[t] - 1, 0, -1, 0, 0, 0};
            nu++;
        } else if (key && (u[j].c != c[t] || u[j].k != kpe[t])) {
            char b[160];
            snprintf(b, sizeof b, "mla_attend: row %d has seq_key %llx, as an earlier row with a different cache", t,
                     (unsigned long long)key);
            return cu_rt_error(b);
        }
        slot[t] = j;
        if (npos[t] - 1 < u[j].first) u[j].first = npos[t] - 1;
        if (npos[t] > u[j].need) u[j].need = npos[t];
    }
    const uint64_t tick = ++g_mcall;
    for (int j = 0; j < nu; j++) { /* first every mirror of the call marked, so none is evicted for another */
        if (!u[j].key) continue;
        int i = mir_find(u[j].key);
        if (i >= 0 && (g_mir[i].kvl != kvl || g_mir[i].dr != dr)) {
            mir_drop(i);
            i = -1;
        }
        if (i < 0) i = mir_add(u[j].key, kvl, dr);
        if (i < 0) continue; /* no host memory for the entry: staged */
        g_mir[i].tick = tick;
        if (g_mir[i].valid > u[j].first) g_mir[i].valid = u[j].first;
        u[j].mir = i;
    }
    for (int j = 0; j < nu; j++) {
        if (u[j].mir < 0) continue;
        const int r = mir_reserve(u[j].mir, u[j].need, tick);
        if (r < 0) return -1;
        if (r > 0) u[j].mir = -1;
        else u[j].lo = g_mir[u[j].mir].valid;
    }
    return nu;
}

/* The MLA block's own inputs and outputs (df_backend.mla_block; attend_locked's block mode). */
struct BlockIn {
    const df_mla_block *b;
    const float *x, *cs;           /* host: x [T, D] (NULL: the device residual, one row), cs [T, dr] or NULL */
    float *const *c, *const *kpe;  /* host caches: row npos[t] - 1 of each written before the return */
    float *x_out, *h2, *logits;    /* host outputs */
    int64_t D, E, R;               /* hidden size, router rows (0: no router), q_lora_rank (0: q_proj) */
};

/* A weight's device arrays (cu_rt_weight) and the matmul y [T, w.rows] = x [T, w.cols] W^T queued on st. */
int matmul_dev(const df_weight *w, const float *x, int T, float *y, cudaStream_t st) {
    const void *d = NULL, *s = NULL;
    if (cu_rt_weight(w, &d, &s)) return -1;
    CKA(cu_matmul_launch(w->type, d, s, w->rows, w->cols, x, T, y, st));
    return 0;
}

/* The call with the runtime's mutex held. Staging layout (256-byte aligned regions), the uploaded part first:
 * [x | cs] (block) or q | cptr | pptr | npos | [dst_c | dst_p] (block) | segs | the copied cache rows (per unit: c rows
 * [lo, need) then k_pe rows; copied from the host: [lo, need), or [lo, first) in block mode, where the device writes
 * the call's own rows); then device-only q_lat, o_lat, o_v, the output projection's result, [h, q_a, q_raw, kva, q]
 * (block); then the returned part (block: x_out | h2 | logits | c_new | kpe_new; else o_v or out), mirrored at the
 * same offsets from h_ret in the host staging. */
int attend_locked(const df_weight *kv_b, const Shape &sh, const float *q, const float *const *c,
                  const float *const *kpe, const int *npos, const uint64_t *seq_key, float *o_v, const df_weight *o,
                  float *out, const BlockIn *bk) {
    const int T = sh.T, H = sh.H, kvl = sh.kvl, dr = sh.dr, qd = sh.dn + sh.dr;
    cudaStream_t st = cu_rt_stream();
    mir_setup();
    if (g_mbad) return cu_rt_error(g_mwhy);
    cu_rt_sh_join(); /* a started shared expert on the side stream reads the last block's h2 in this staging */
    g_h2.host = NULL; /* the last block's h2 is overwritten by this call */
    /* this call's host staging: the buffer the call before last used, once the device is done with it */
    const int hi = g_hcur ^= 1;
    if (host_wait(hi)) return -1;
    Unit *u = (Unit *)malloc(sizeof(Unit) * (size_t)T + sizeof(int) * (size_t)T);
    if (!u) return cu_rt_error("mla_attend: out of host memory");
    int *slot = (int *)(u + T);
    const int nu = plan_units(T, c, kpe, npos, seq_key, kvl, dr, u, slot);
    if (nu < 0) { free(u); return -1; }
    /* rows read from the host caches below: an asynchronous call's row among them must be there first */
    for (int j = 0; j < nu; j++)
        if ((bk ? u[j].first : u[j].need) > u[j].lo) {
            if (host_wait(hi ^ 1)) { free(u); return -1; }
            break;
        }
    if (bk) { /* the device writes each unit's rows [first, need): the call's rows must be exactly those */
        int *cnt = (int *)calloc((size_t)nu, sizeof(int));
        if (!cnt) { free(u); return cu_rt_error("mla_block: out of host memory"); }
        for (int t = 0; t < T; t++) cnt[slot[t]]++;
        int j = 0;
        while (j < nu && cnt[j] == u[j].need - u[j].first) j++;
        free(cnt);
        if (j < nu) { free(u); return cu_rt_error("mla_block: the rows of one cache are not at consecutive positions"); }
    }
    size_t cache_floats = 0;
    int nseg = 0;
    long long seg_max = 0;
    for (int j = 0; j < nu; j++) {
        const size_t n = (size_t)(u[j].need - u[j].lo), nc = bk ? (size_t)(u[j].first - u[j].lo) : n;
        u[j].off_c = cache_floats;
        cache_floats += up4(n * kvl);
        u[j].off_p = cache_floats;
        cache_floats += up4(n * dr);
        if (u[j].mir >= 0 && nc) {
            nseg += dr ? 2 : 1;
            if ((long long)(nc * kvl) > seg_max) seg_max = (long long)(nc * kvl);
        }
    }
    size_t off = 0;
    auto take = [&off](size_t bytes) { const size_t at = off; off = up256(off + bytes); return at; };
    const size_t fl = sizeof(float);
    const int64_t D = bk ? bk->D : 0, E = bk ? bk->E : 0, R = bk ? bk->R : 0;
    const size_t o_x = bk && bk->x ? take(fl * (size_t)T * D) : 0, o_cs = bk && bk->cs ? take(fl * (size_t)T * dr) : 0;
    const size_t o_q = bk ? 0 : take(fl * (size_t)T * H * qd);
    const size_t o_cp = take(sizeof(float *) * (size_t)T), o_pp = take(sizeof(float *) * (size_t)T);
    const size_t o_np = take(sizeof(int) * (size_t)T);
    const size_t o_dc = bk ? take(sizeof(float *) * (size_t)T) : 0, o_dp = bk ? take(sizeof(float *) * (size_t)T) : 0;
    const size_t o_seg = take(sizeof(Seg) * (size_t)nseg), o_cache = off;
    const size_t up_bytes = o_cache + fl * cache_floats;
    off = up256(up_bytes);
    const size_t o_qlat = take(fl * (size_t)T * H * kvl), o_olat = take(fl * (size_t)T * H * kvl);
    const size_t o_ov = take(fl * (size_t)T * H * sh.dv), o_out = bk ? take(fl * (size_t)T * (size_t)o->rows) : 0;
    const size_t o_h = bk ? take(fl * (size_t)T * D) : 0, o_qa = bk && R ? take(fl * (size_t)T * R) : 0;
    const size_t o_qraw = bk ? take(fl * (size_t)T * H * qd) : 0, o_kva = bk ? take(fl * (size_t)T * (kvl + dr)) : 0;
    const size_t o_qd = bk ? take(fl * (size_t)T * H * qd) : 0;
    /* the returned part: offsets from o_ret (device) and h_ret (host) */
    const size_t o_ret = off, h_ret = up256(up_bytes);
    size_t r_x = 0, r_h = 0, r_l = 0, r_c = 0, r_p = 0, ret_bytes;
    if (bk) {
        off = 0;
        r_x = take(fl * (size_t)T * D);
        r_h = take(fl * (size_t)T * D);
        r_l = take(fl * (size_t)T * (E ? E : 1));
        r_c = take(fl * (size_t)T * kvl);
        r_p = take(fl * (size_t)T * (dr ? dr : 1));
        ret_bytes = off;
    } else {
        ret_bytes = o ? fl * (size_t)T * (size_t)o->rows : fl * (size_t)T * H * sh.dv;
    }
    if (grow_dev(o_ret + ret_bytes) || grow_host(hi, h_ret + ret_bytes)) { free(u); return -1; }
    char *hb = (char *)g_hb[hi].p, *db = (char *)g_dev;
    /* the caller's device residual: this call's x_out, the next call's x when that gives none */
    int *resid_valid = NULL;
    float *resid = bk && bk->b->resid_key ? cu_rt_resid(bk->b->resid_key, (size_t)T * D, !bk->x, &resid_valid) : NULL;
    if (bk && !bk->x && (T != 1 || !resid)) {
        free(u);
        return resid ? cu_rt_error("mla_block: x from the device residual for one row only") : -1;
    }
    if (bk && bk->b->resid_key && !resid) { free(u); return -1; }
    if (bk && resid) cu_rt_shared_drop(bk->b->resid_key); /* an earlier call's started shared expert is not this one's */
    if (bk) {
        if (bk->x) memcpy(hb + o_x, bk->x, fl * (size_t)T * D);
        if (bk->cs) memcpy(hb + o_cs, bk->cs, fl * (size_t)T * dr);
    } else {
        memcpy(hb + o_q, q, fl * (size_t)T * H * qd);
    }
    const float **cp = (const float **)(hb + o_cp), **pp = (const float **)(hb + o_pp);
    float **dcw = bk ? (float **)(hb + o_dc) : NULL, **dpw = bk ? (float **)(hb + o_dp) : NULL;
    Seg *seg = (Seg *)(hb + o_seg);
    float *hc = (float *)(hb + o_cache), *dc = (float *)(db + o_cache);
    for (int j = 0, k = 0; j < nu; j++) {
        const size_t lo = (size_t)u[j].lo, n = (size_t)((bk ? u[j].first : u[j].need) - u[j].lo);
        memcpy(hc + u[j].off_c, u[j].c + lo * kvl, fl * n * kvl);
        if (dr) memcpy(hc + u[j].off_p, u[j].k + lo * dr, fl * n * dr);
        if (u[j].mir < 0 || !n) continue;
        const Mirror &m = g_mir[u[j].mir];
        seg[k++] = Seg{dc + u[j].off_c, (float *)m.mem + lo * kvl, (long long)(n * kvl)};
        if (dr) seg[k++] = Seg{dc + u[j].off_p, (float *)((char *)m.mem + m.pe_off) + lo * dr, (long long)(n * dr)};
    }
    for (int t = 0; t < T; t++) {
        const Unit &v = u[slot[t]];
        if (v.mir >= 0) {
            const Mirror &m = g_mir[v.mir];
            cp[t] = (const float *)m.mem;
            pp[t] = (const float *)((const char *)m.mem + m.pe_off);
        } else { /* staged: rows from lo = 0, so indexed by position as a mirror */
            cp[t] = dc + v.off_c;
            pp[t] = dc + v.off_p;
        }
        if (bk) {
            dcw[t] = (float *)cp[t] + (size_t)(npos[t] - 1) * kvl;
            dpw[t] = (float *)pp[t] + (size_t)(npos[t] - 1) * dr;
        }
    }
    memcpy(hb + o_np, npos, sizeof(int) * (size_t)T);
    /* One token of a block whose cache is a mirror holding every earlier row, and whose x is on the device: nothing
     * to upload. Its cache and RoPE go to the kernels by value, and its new cache rows straight into the host
     * staging's returned part (pinned, written by the kernel), so neither copy-in nor their copy-out is launched. */
    const bool row1 = bk && T == 1 && nu == 1 && u[0].mir >= 0 && nseg == 0 && !bk->x && dr <= CU_CS1_MAX &&
                      g_cu_copy_kernel;
    cu_row1 r1 = {};
    if (row1) {
        const Mirror &m = g_mir[u[0].mir];
        r1.c = (float *)m.mem;
        r1.p = (float *)((char *)m.mem + m.pe_off);
        r1.npos = npos[0];
    }
    cudaError_t e = row1 ? cudaSuccess : cu_copy_launch(db, hb, up_bytes, cudaMemcpyHostToDevice, st);
    cu_rt_mark("attn: copy in");
    const long long bx = (seg_max + 1023) / 1024;
    for (int s0 = 0; e == cudaSuccess && s0 < nseg; s0 += 65535) { /* grid.y: at most 65535 segments a launch */
        const dim3 grid((unsigned)(bx < 1 ? 1 : bx > 64 ? 64 : bx), (unsigned)(nseg - s0 < 65535 ? nseg - s0 : 65535));
        cu_launch(scatter_kernel, grid, 256, 0, st, (const Seg *)(db + o_seg) + s0);
        e = cudaGetLastError();
    }
    cu_rt_mark("attn: cache rows into the mirrors");
    if (e == cudaSuccess) /* the mirrors' rows are queued (in block mode the call's own rows follow): [0, need) from here on */
        for (int j = 0; j < nu; j++)
            if (u[j].mir >= 0) g_mir[u[j].mir].valid = u[j].need;
    free(u);
    if (e != cudaSuccess) return err_cuda("copying the caches in", e);
    float *dql = (float *)(db + o_qlat), *dol = (float *)(db + o_olat), *dov = (float *)(db + o_ov);
    const float *dq = (const float *)(db + (bk ? o_qd : o_q));
    if (bk) { /* the input norm, the projections, the latent KV rows into the caches and the queries' RoPE */
        const df_mla_block *b = bk->b;
        const float *dx = bk->x ? (const float *)(db + o_x) : resid, *nw = NULL;
        float *dh = (float *)(db + o_h), *dqa = (float *)(db + o_qa), *dqr = (float *)(db + o_qraw);
        float *dkva = (float *)(db + o_kva);
        if (cu_rt_vec(b->attn_norm, D, &nw)) return -1;
        CKA(cu_rmsnorm_launch(dh, dx, nw, T, D, b->eps, st));
        cu_rt_mark("block: input norm");
        /* one token: q_a and kv_a (both on h) in one launch when both are cached (the same bits) */
        const int two = R && T == 1 ? cu_rt_matmul2(b->q_a, b->kv_a, dh, dqa, dkva, st) : 0;
        if (two < 0) return -1;
        if (R) {
            if ((!two && matmul_dev(b->q_a, dh, T, dqa, st)) || cu_rt_vec(b->q_a_norm, R, &nw)) return -1;
            CKA(cu_rmsnorm_launch(dqa, dqa, nw, T, R, b->lora_eps, st));
            if (matmul_dev(b->q_b, dqa, T, dqr, st)) return -1;
        } else if (matmul_dev(b->q_proj, dh, T, dqr, st)) {
            return -1;
        }
        if ((!two && matmul_dev(b->kv_a, dh, T, dkva, st)) || cu_rt_vec(b->kv_a_norm, kvl, &nw)) return -1;
        cu_rt_mark("block: projections");
        if (row1) {
            cu_cs1 cs1;
            if (bk->cs) memcpy(cs1.v, bk->cs, fl * (size_t)dr);
            CKA(cu_kv_row1_launch(dkva, kvl, dr, nw, b->lora_eps, r1, cs1, bk->cs != NULL, (float *)(hb + h_ret + r_c),
                                  (float *)(hb + h_ret + r_p), dqr, (float *)dq, H, sh.dn, st));
        } else {
            CKA(cu_kv_rows_launch(dkva, T, kvl, dr, nw, b->lora_eps, bk->cs ? (const float *)(db + o_cs) : NULL,
                                  (float *const *)(db + o_dc), (float *const *)(db + o_dp), (float *)(db + o_ret + r_c),
                                  (float *)(db + o_ret + r_p), dqr, (float *)dq, H, sh.dn, st));
        }
        cu_rt_mark("block: latent KV rows, RoPE");
    }
    const void *wd = NULL, *ws = NULL;
    if (cu_rt_weight(kv_b, &wd, &ws)) return -1;
    CKA(launch_weight_kernel(kv_b->type, wd, ws, sh, dq, dql, NULL, NULL, 0, st));
    cu_rt_mark("attn: q absorbed (K_h^T q_nope)");
    CKA(launch_attn(sh, dq, dql, row1 ? NULL : (Ptrs)(db + o_cp), (Ptrs)(db + o_pp), (const int *)(db + o_np), r1,
                    dol, st));
    cu_rt_mark("attn: core");
    CKA(launch_weight_kernel(kv_b->type, wd, ws, sh, NULL, NULL, dol, dov, 1, st));
    cu_rt_mark("attn: V_h o_lat");
    if (o) { /* the output projection on the device: o(o_v), the matmul kernels' own launch */
        if (matmul_dev(o, dov, T, (float *)(db + (bk ? o_out : o_ret)), st)) return -1;
        cu_rt_mark("attn: o_proj");
    }
    void *xs = NULL; /* h2's split (g_h2xs), when written */
    if (bk) { /* the residual, the FFN's input norm and the router */
        const float *nw = NULL;
        float *dxo = (float *)(db + o_ret + r_x), *dh2 = (float *)(db + o_ret + r_h);
        if (cu_rt_vec(bk->b->ffn_norm, D, &nw)) return -1;
        /* one token whose MoE the device may run: h2's split too (g_h2xs) */
        if (resid && T == 1 && E && bk->b->moe && bk->b->moe->E == E && D % 32 == 0) {
            if (g_ch2xs < (size_t)D * 6) {
                if (g_h2xs) CKA(cudaFree(g_h2xs));
                g_h2xs = NULL;
                g_ch2xs = 0;
                CKA(cudaMalloc(&g_h2xs, (size_t)D * 6));
                g_ch2xs = (size_t)D * 6;
            }
            xs = g_h2xs;
        }
        /* x_out into the returned part and, as the caller's residual, into resid (which may be x) */
        CKA(cu_add_rmsnorm_launch(dxo, bk->x ? (const float *)(db + o_x) : resid, (const float *)(db + o_out), nw, T, D,
                                  bk->b->eps, dh2, st, resid, xs));
        if (resid && resid_valid) *resid_valid = 1;
        /* this call's h2 on the device, for the moe_resid that follows with the host copy of it (cu_attn_h2) */
        if (resid && T == 1) {
            g_h2.host = bk->h2;
            g_h2.dev = dh2;
        }
        if (E && matmul_dev(bk->b->router, dh2, T, (float *)(db + o_ret + r_l), st)) return -1;
        cu_rt_mark("block: residual, norm, router");
    }
    /* A block whose MoE the device will route and run (moe_queued below) returns before the host reads x_out, h2
     * or the logits, and its asynchronous finish (host_wait) takes only the new cache rows: those alone are copied
     * back (none when the kernel wrote them into the staging: row1), and the rest only when the MoE was not queued
     * after all. */
    const bool may_queue = bk && resid && T == 1 && bk->b->moe && bk->b->moe->E == E && (E || bk->b->moe->K == 0);
    const size_t ret_from = may_queue ? r_c : 0, ret_to = row1 ? r_c : ret_bytes;
    if (ret_to > ret_from)
        CKA(cu_copy_launch(hb + h_ret + ret_from, (bk || o ? db + o_ret : (char *)dov) + ret_from, ret_to - ret_from,
                           cudaMemcpyDeviceToHost, st));
    if (!g_hb[hi].ev) CKA(cudaEventCreateWithFlags(&g_hb[hi].ev, cudaEventDisableTiming));
    CKA(cudaEventRecord(g_hb[hi].ev, st)); /* the staging's last copy of this call */
    g_hb[hi].ev_live = 1;
    /* the next FFN's shared expert on h2, queued behind the copy-out: the device runs it while the host routes (the
     * key's earlier one was dropped when this call began) */
    int started = 0;
    cudaEvent_t ev = NULL;
    if (bk && resid) {
        const df_mla_block *b = bk->b;
        if (b->sh_gate && b->sh_up && b->sh_down && T == 1 && b->sh_gate->cols == D && b->sh_down->rows == D &&
            (started = cu_rt_shared_start(b->resid_key, b->sh_gate, b->sh_up, b->sh_down, b->sh_act, b->sh_beta,
                                          b->sh_lb, (const float *)(db + o_ret + r_h), &ev)) < 0)
            return -1;
    }
    /* the FFN's routed experts, routed on the device and added into the residual behind the shared expert: then the
     * call returns without waiting, and the device runs them while the host goes on */
    if (bk && resid && T == 1 && bk->b->moe && bk->b->moe->E == E && (E || bk->b->moe->K == 0) &&
        (started || !bk->b->moe->shared)) {
        df_moe_dev *m = bk->b->moe;
        const float *bd = NULL;
        if (m->bias && cu_rt_vec(m->bias, E, &bd)) return -1;
        if (cu_rt_moe_route(bk->b->resid_key, m, bd, (const float *)(db + o_ret + r_l), (const float *)(db + o_ret + r_h),
                            xs) < 0)
            return -1;
        if (m->queued) { /* asynchronous: nothing waited for; the row reaches the host cache later (host_wait) */
            HostBuf &h = g_hb[hi];
            h.pend = 1;
            h.dst_c = bk->c[0] + (size_t)(npos[0] - 1) * kvl;
            h.dst_p = bk->kpe[0] + (size_t)(npos[0] - 1) * dr;
            h.off_c = h_ret + r_c;
            h.off_p = h_ret + r_p;
            h.kvl = kvl;
            h.dr = dr;
            h.key = seq_key ? seq_key[0] : 0;
            return 0;
        }
    }
    if (ret_from) { /* the part not copied above, behind whatever was queued since (a started shared expert too) */
        CKA(cu_copy_launch(hb + h_ret, db + o_ret, ret_from, cudaMemcpyDeviceToHost, st));
        CKA(cudaEventRecord(g_hb[hi].ev, st));
        CKA(cu_rt_sync("attn: copy out"));
    } else {
        CKA(started ? cu_rt_sync_event("attn: copy out", ev) : cu_rt_sync("attn: copy out"));
    }
    if (host_wait(hi ^ 1)) return -1; /* the other buffer's copies came before: done */
    if (!bk) {
        memcpy(o ? out : o_v, hb + h_ret, ret_bytes);
        return 0;
    }
    const char *hr = hb + h_ret;
    memcpy(bk->x_out, hr + r_x, fl * (size_t)T * D);
    memcpy(bk->h2, hr + r_h, fl * (size_t)T * D);
    if (E) memcpy(bk->logits, hr + r_l, fl * (size_t)T * E);
    for (int t = 0; t < T; t++) {
        memcpy(bk->c[t] + (size_t)(npos[t] - 1) * kvl, hr + r_c + fl * (size_t)t * kvl, fl * kvl);
        if (dr) memcpy(bk->kpe[t] + (size_t)(npos[t] - 1) * dr, hr + r_p + fl * (size_t)t * dr, fl * dr);
    }
    return 0;
}

/* A call that fails before it runs: its keys' mirrors dropped (the host may have rewritten rows they hold), the
 * reason recorded. */
int refuse(int T, const uint64_t *seq_key, const char *msg) {
    mir_forget_keys(T, seq_key, 0);
    return cu_rt_error(msg);
}

} // namespace

int cu_kv_mirror_cap(size_t *cap, char *why, size_t whylen) {
    unsigned long long b = 0;
    const int r = df_cuda_env_kv_mirror(&b, why, whylen);
    if (r > 0 && !b) {
        size_t fr = 0, tot = 0;
        if (cudaMemGetInfo(&fr, &tot) == cudaSuccess) b = tot / 8;
        else cudaGetLastError();
    }
    *cap = r > 0 ? (size_t)b : 0;
    return r;
}

/* Device memory the attention core's KV mirrors may still take (their cap less what they hold; 0 when mirrors are
 * off or the knob is invalid). With the runtime's mutex held. */
size_t cu_attn_mirror_room(void) {
    mir_setup();
    if (g_mbad || !g_mon) return 0;
    return g_mcap > g_mbytes ? g_mcap - g_mbytes : 0;
}

/* The attention core's limits (mla_attend's and mla_block's): kv_b [H*(dn+dv), kvl] in a decodable encoding, the
 * kernels' register and shared-memory bounds, rows that attend to at least one position of a cache. 0, or -1 with
 * the reason in b (starting with op). */
static int core_refusal(const char *op, const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl,
                        const float *const *c, const float *const *kpe, const int *npos, char *b, size_t bl) {
    if (H <= 0 || dn <= 0 || dr < 0 || dv <= 0 || kvl <= 0 || kv_b->rows != (int64_t)H * (dn + dv) || kv_b->cols != kvl) {
        snprintf(b, bl, "%s: kv_b [%lld, %lld] does not match %d heads x (%d + %d) rows, %d columns", op,
                 (long long)kv_b->rows, (long long)kv_b->cols, H, dn, dv, kvl);
        return -1;
    }
    if ((int)kv_b->type < 0 || kv_b->type >= DF_W__COUNT ||
        ((kv_b->type == DF_W_INT4_G32 || kv_b->type == DF_W_MXFP4) && kvl % 32)) {
        snprintf(b, bl, "%s: kv_b encoding %d with %d columns not supported", op, (int)kv_b->type, kvl);
        return -1;
    }
    /* kvl: NT x 8 accumulators per thread; shared memory: 48 KB per block for each kernel */
    const size_t smem_attn = sizeof(float) * ((size_t)4 * (kvl + dr + CH) + 12);
    if (kvl > KMAX || smem_attn > 48 * 1024 || sizeof(float) * 8 * ((size_t)dn + AS * AT) > 48 * 1024 ||
        sizeof(float) * 8 * (size_t)kvl > 48 * 1024 || T > 65535 * 8 || (int64_t)H * ((dv + VR1 - 1) / VR1) > 0x7fffffff) {
        snprintf(b, bl, "%s: shape not supported on the GPU (T %d, kv_lora_rank %d, nope %d, rope %d)", op, T, kvl, dn, dr);
        return -1;
    }
    for (int t = 0; t < T; t++)
        if (npos[t] < 1 || !c[t] || (dr && !kpe[t])) {
            snprintf(b, bl, "%s: row %d attends to %d positions", op, t, npos[t]);
            return -1;
        }
    return 0;
}

/* A checked call of attend_locked under the runtime's mutex; after an error the stream is drained (no queued copy may
 * still read a host buffer) and the call's mirrors dropped (what the device holds of those caches is unknown). */
static int core_call(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                     const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                     float *o_v, const df_weight *o, float *out, const BlockIn *bk) {
    if (cu_rt_lock()) return -1;
    int maxn = 1;
    for (int t = 0; t < T; t++) if (npos[t] > maxn) maxn = npos[t];
    const Shape sh = {T, H, dn, dr, dv, kvl, scale, maxn};
    const int rc = attend_locked(kv_b, sh, q, c, kpe, npos, seq_key, o_v, o, out, bk);
    if (rc) {
        cudaStreamSynchronize(cu_rt_stream());
        cudaGetLastError();
        mir_forget_keys(T, seq_key, 1);
        host_wait(0); /* the earlier calls' rows (their copies done) */
        host_wait(1);
    }
    cu_rt_unlock();
    return rc;
}

static int mla_attend_impl(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale,
                           const float *q, const float *const *c, const float *const *kpe, const int *npos,
                           const uint64_t *seq_key, float *o_v, const df_weight *o, float *out) {
    if (T <= 0) return 0;
    char b[200];
    if (o && o->cols != (int64_t)H * dv) {
        snprintf(b, sizeof b, "mla_attend: o_proj [%lld, %lld] does not take %d heads x %d values", (long long)o->rows,
                 (long long)o->cols, H, dv);
        return refuse(T, seq_key, b);
    }
    if (core_refusal("mla_attend", kv_b, T, H, dn, dr, dv, kvl, c, kpe, npos, b, sizeof b)) return refuse(T, seq_key, b);
    return core_call(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, o_v, o, out, NULL);
}

extern "C" int df_cuda_mla_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale,
                                  const float *q, const float *const *c, const float *const *kpe, const int *npos,
                                  const uint64_t *seq_key, float *o_v) {
    return mla_attend_impl(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, o_v, NULL, NULL);
}

extern "C" int df_cuda_mla_attend_o(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale,
                                    const float *q, const float *const *c, const float *const *kpe, const int *npos,
                                    const uint64_t *seq_key, const df_weight *o, float *out) {
    return mla_attend_impl(kv_b, T, H, dn, dr, dv, kvl, scale, q, c, kpe, npos, seq_key, NULL, o, out);
}

extern "C" int df_cuda_mla_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c,
                                 float *const *kpe, const int *npos, const uint64_t *seq_key, float *x_out, float *h2,
                                 float *logits) {
    if (b->moe) b->moe->queued = 0;
    if (T <= 0) return 0;
    const uint64_t *key = seq_key;
    char m[240];
    const int H = b->H, dn = b->dn, dr = b->dr, dv = b->dv, kvl = b->kvl;
    const int64_t D = b->kv_a ? b->kv_a->cols : 0, Q = (int64_t)H * (dn + dr);
    const df_weight *qw = b->q_a ? b->q_b : b->q_proj;
    const int64_t R = b->q_a ? b->q_a->rows : 0;
    if (!b->kv_a || !b->kv_b || !b->o || !qw || !b->attn_norm || !b->ffn_norm || !b->kv_a_norm || (b->q_a && !b->q_a_norm) ||
        b->kv_a->rows != (int64_t)kvl + dr || qw->rows != Q || (b->q_a ? b->q_a->cols != D || qw->cols != R : qw->cols != D) ||
        b->o->rows != D || (b->router && b->router->cols != D)) {
        snprintf(m, sizeof m, "mla_block: the weights do not chain (kv_a [%lld, %lld], %d heads x (%d + %d), kv_lora_rank %d)",
                 b->kv_a ? (long long)b->kv_a->rows : 0LL, (long long)D, H, dn, dr, kvl);
        return refuse(T, key, m);
    }
    if (b->o->cols != (int64_t)H * dv) {
        snprintf(m, sizeof m, "mla_block: o_proj [%lld, %lld] does not take %d heads x %d values", (long long)b->o->rows,
                 (long long)b->o->cols, H, dv);
        return refuse(T, key, m);
    }
    if (core_refusal("mla_block", b->kv_b, T, H, dn, dr, dv, kvl, (const float *const *)c, (const float *const *)kpe, npos,
                     m, sizeof m))
        return refuse(T, key, m);
    const BlockIn bk = {b, x, cs, c, kpe, x_out, h2, logits, D, b->router ? b->router->rows : 0, R};
    return core_call(b->kv_b, T, H, dn, dr, dv, kvl, b->scale, NULL, (const float *const *)c, (const float *const *)kpe,
                     npos, key, NULL, b->o, NULL, &bk);
}

extern "C" void df_cuda_seq_forget(uint64_t uid) {
    if ((!__atomic_load_n(&g_mlive, __ATOMIC_RELAXED) && !cu_kda_live()) || cu_rt_lock()) return;
    cu_kda_forget(uid);
    for (int i = 0; i < g_nmir; i++)
        if (g_mir[i].used && (uid == 0 || g_mir[i].key >> 8 == uid)) mir_drop(i);
    for (int i = 0; i < 2; i++) /* the sequence's host caches may be gone: its pending row is not written */
        if (g_hb[i].pend && (uid == 0 || g_hb[i].key >> 8 == uid)) g_hb[i].pend = 0;
    cu_rt_unlock();
}
