/*
 * cuda_route.cuh — one token's MoE routing on the device, the body shared by the route kernel (cuda_moe.cu) and the
 * router's matmul with the routing in its last block (cuda_matmul.cu). Math and order: cuda_moe.cu's header
 * (engine/moe.c moe_route, the same bits).
 */
#ifndef DF_KERNELS_CUDA_ROUTE_CUH
#define DF_KERNELS_CUDA_ROUTE_CUH

#include "cuda_internal.h"
#include "kernels/route_math.h"

#include <math.h>
#include <stdint.h>

namespace {

/* (value, index) as one 64-bit key whose unsigned order is the host scan's preference: a larger value first, then a
 * lower index (values compared as floats: -0 == +0; NaN never makes a key). */
__device__ __forceinline__ unsigned long long key_of(float v, int i) {
    uint32_t u = __float_as_uint(v);
    if (v == 0.0f) u = 0; /* -0 and +0 tie, as in the host's comparison */
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (uint32_t)(0xFFFFFFFFu - (uint32_t)i);
}

/* Experts up to which the picks are ranked in one pass (a thread per expert, E comparisons each); above, the rounds
 * cost less. */
constexpr int ROUTE_RANK_MAXE = 256;

/* The routing by one block of any multiple of 32 threads (one_pass: at least E of them, and the keys' area [E] first
 * in sm); sm: then s [E] and choice [E] as floats. The logits are read past L1 (another block of the calling kernel
 * may have written them). Every thread of the block calls it. */
__device__ __forceinline__ void route_body(const float *lg, const float *__restrict__ bias, int E, int K, int G,
                                          int topk_group, int renorm, float scale, const void *const *__restrict__ tab,
                                          float *g, float *u, float *y, int64_t I, int64_t D, const float *sh,
                                          cu_moe_route_out *o, int *ids_out, int one_pass, unsigned long long *sm) {
    __shared__ float gs[CU_ROUTE_MAXG];
    __shared__ unsigned char keep[CU_ROUTE_MAXG];
    __shared__ int picks[CU_ROUTE_MAXK];
    unsigned long long *keys = sm;
    float *s = reinterpret_cast<float *>(sm + (one_pass ? E : 0)), *ch = s + E;
    const int tid = threadIdx.x, lane = tid & 31;
    for (int x = tid; x < E; x += blockDim.x) {
        const float v = df_route_sigmoid(__ldcg(lg + x));
        s[x] = v;
        ch[x] = __fadd_rn(v, bias ? bias[x] : 0.0f);
    }
    __syncthreads();
    if (G > 1 && tid < 32) {
        const int per = E / G;
        for (int gi = lane; gi < G; gi += 32) {
            float a = -INFINITY, b = -INFINITY;
            for (int x = gi * per; x < (gi + 1) * per; x++) {
                const float c = ch[x];
                if (c > a) { b = a; a = c; }
                else if (c > b) b = c;
            }
            gs[gi] = per >= 2 ? __fadd_rn(a, b) : a;
            keep[gi] = 0;
        }
        __syncwarp();
        if (lane == 0)
            for (int k = 0; k < topk_group && k < G; k++) {
                int best = -1;
                for (int gi = 0; gi < G; gi++)
                    if (!keep[gi] && (best < 0 || gs[gi] > gs[best])) best = gi;
                keep[best] = 1;
            }
        __syncwarp();
        for (int x = lane; x < E; x += 32) {
            const int gi = x / per;
            if (gi < G && !keep[gi]) ch[x] = -INFINITY;
        }
    }
    __syncthreads();
    int mine = -1; /* lane k of the first warp: pick k */
    bool ranked = false;
    if (one_pass && !__syncthreads_or(tid < E && ch[tid] != ch[tid])) { /* every thread: one expert; no NaN */
        unsigned long long kx = 0;
        if (tid < E) keys[tid] = kx = key_of(ch[tid], tid);
        __syncthreads();
        if (tid < E) {
            int rk = 0;
            for (int x = 0; x < E; x++) rk += keys[x] > kx;
            if (rk < K) picks[rk] = tid;
        }
        __syncthreads();
        if (tid < K) mine = picks[tid];
        ranked = true;
    }
    if (tid >= 32) return;
    /* K rounds: this lane's elements x = lane + 32 j, taken ones marked in a bit mask (E <= 1024: j < 32) */
    uint32_t taken = 0;
    for (int k = 0; !ranked && k < K; k++) {
        unsigned long long best = 0; /* 0: none (a real key has its top bit set or an index term) */
        int first = E;               /* the lowest untaken index */
        for (int j = 0, x = lane; x < E; j++, x += 32) {
            if (taken >> j & 1) continue;
            if (x < first) first = x;
            const float v = ch[x];
            if (v != v) continue;
            const unsigned long long kk = key_of(v, x);
            if (kk > best) best = kk;
        }
#pragma unroll
        for (int m = 16; m > 0; m >>= 1) {
            const unsigned long long c = __shfl_xor_sync(0xffffffffu, best, m);
            if (c > best) best = c;
        }
        first = __reduce_min_sync(0xffffffffu, (unsigned)first);
        const float fv = ch[first < E ? first : 0];
        const int pick = first < E && fv != fv ? first : (int)(0xFFFFFFFFu - (uint32_t)best);
        if ((pick & 31) == lane) taken |= 1u << (pick >> 5);
        if (lane == k) mine = pick;
    }
    /* lane k < K: its pick's arrays (loads issued before the weights' arithmetic), weight, and rank among the picks */
    const void *t[6] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
    float w = 0.0f;
    if (lane < K) {
        const void *const *tp = tab + (int64_t)mine * 6; /* gate data, scale, up data, scale, down data, scale */
#pragma unroll
        for (int q = 0; q < 6; q++) t[q] = tp[q];
        w = s[mine];
    }
    float sum = 0.0f; /* in pick order, as the host adds them */
    for (int k = 0; k < K; k++) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, w, k));
    if (renorm) w = __fdiv_rn(w, __fadd_rn(sum, 1e-20f));
    w = __fmul_rn(w, scale);
    int rank = 0; /* ascending ids (distinct): the host combines in that order */
    for (int k = 0; k < K; k++) rank += __shfl_sync(0xffffffffu, mine, k) < mine;
    if (lane < K) {
        const int i = rank;
        o->gu.d[2 * i] = static_cast<const uint8_t *>(t[0]);
        o->gu.s[2 * i] = static_cast<const uint8_t *>(t[1]);
        o->gu.y[2 * i] = g + (int64_t)i * I;
        o->gu.d[2 * i + 1] = static_cast<const uint8_t *>(t[2]);
        o->gu.s[2 * i + 1] = static_cast<const uint8_t *>(t[3]);
        o->gu.y[2 * i + 1] = u + (int64_t)i * I;
        o->gu.xrow[2 * i] = o->gu.xrow[2 * i + 1] = 0;
        o->gu.T[2 * i] = o->gu.T[2 * i + 1] = 1;
        o->dn.d[i] = static_cast<const uint8_t *>(t[4]);
        o->dn.s[i] = static_cast<const uint8_t *>(t[5]);
        o->dn.y[i] = y + (int64_t)i * D;
        o->dn.xrow[i] = i;
        o->dn.T[i] = 1;
        o->cb.y[i] = y + (int64_t)i * D;
        o->cb.w[i] = w;
        o->ids[i] = mine;
        o->w[i] = w;
        if (ids_out) ids_out[i] = mine;
    }
    if (lane == 0) {
        o->cb.sh = sh;
        o->cb.n = K;
    }
}

} // namespace

#endif
