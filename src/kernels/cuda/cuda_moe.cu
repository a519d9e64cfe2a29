/*
 * cuda_moe.cu — one token's MoE routed on the device (df_mla_block.moe): the router's top-k from the logits the block
 * just computed, then the chosen experts' MLPs in grouped tensor-core launches, the weighted combine and the residual
 * add, with no host step between the router and the experts.
 *
 * Routing (engine/moe.c moe_route, DeepseekV3TopkRouter noaux_tc; the same bits): s = sigmoid(logit) by route_math.h;
 * choice = s + bias; with groups, a group's score is the sum of its two largest choices (scanned in index order as
 * the host scans them), the topk_group best groups are kept (lowest index on ties) and the others' choices become
 * -inf; then K rounds pick the largest untaken choice, lowest index on ties, as the host's sequential scan does (a NaN
 * choice never wins, except where the scan starts on one: the first untaken index). Weights: s at the picks, summed in
 * pick order, divided by (sum + 1e-20) when renorm, times scale; every operation a single rounding, as the host's
 * (moe.c is compiled without contraction). Then the K (id, weight) pairs are sorted by id: the host combines the
 * experts in ascending id order.
 *
 * The picks, up to ROUTE_RANK_MAXE experts and no NaN choice: with distinct keys (value, then index, as one 64-bit
 * key whose order is the scan's preference) the K rounds pick the K largest keys in descending order, so thread x
 * counts the keys above its own (its rank) and writes x as pick rank when rank < K: one pass, no rounds. Otherwise
 * one warp runs the rounds: each lane takes the indices lane, lane + 32, ...; a round's pick is the warp's best key
 * by a butterfly, so every lane ends with the same pick, and lane k keeps pick k. Lane k of the first warp then
 * loads its pick's arrays, takes its weight (the sum shuffled in pick order) and its rank among the picks' ids,
 * and writes the grouped launches' items (cuda_internal.h cu_mma_group) and the combine's arguments at that rank
 * into device memory, where the next kernels on the stream read them.
 */
#include "cuda_internal.h"
#include "cuda_launch.cuh"
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

/* Block: 32 threads, or (one_pass) a multiple of 32 >= E with the keys' area [E] in the dynamic shared memory. */
__global__ void route_kernel(const float *__restrict__ lg, const float *__restrict__ bias, int E, int K, int G, int topk_group,
                             int renorm, float scale, const void *const *__restrict__ tab, float *g, float *u, float *y,
                             int64_t I, int64_t D, const float *sh, cu_moe_route_out *o, int *ids_out, int one_pass) {
    pdl_enter();
    extern __shared__ unsigned long long sm[]; /* (one_pass) keys [E], then s [E], choice [E] as floats */
    __shared__ float gs[CU_ROUTE_MAXG];
    __shared__ unsigned char keep[CU_ROUTE_MAXG];
    __shared__ int picks[CU_ROUTE_MAXK];
    unsigned long long *keys = sm;
    float *s = reinterpret_cast<float *>(sm + (one_pass ? E : 0)), *ch = s + E;
    const int tid = threadIdx.x, lane = tid & 31;
    for (int x = tid; x < E; x += blockDim.x) {
        const float v = df_route_sigmoid(lg[x]);
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

cudaError_t cu_route_launch(const float *logits, const float *bias, int E, int K, int G, int topk_group, int renorm,
                            float scale, const void *const *tab, float *g, float *u, float *y, int64_t I, int64_t D,
                            const float *sh, cu_moe_route_out *o, cudaStream_t st, int *ids_out) {
    if (E <= 0 || E > CU_ROUTE_MAXE || K < 1 || K > CU_ROUTE_MAXK || K > E || 2 * K > CU_MMA_MAXG || K > CU_COMBINE_MAX ||
        G > CU_ROUTE_MAXG || (G > 1 && E / G < 1))
        return cudaErrorInvalidValue;
    const int one_pass = E <= ROUTE_RANK_MAXE;
    const size_t smem = (size_t)E * 2 * sizeof(float) + (one_pass ? (size_t)E * sizeof(unsigned long long) : 0);
    cu_launch(route_kernel, 1, one_pass ? (E + 31) / 32 * 32 : 32, smem, st, logits, bias, E, K, G, topk_group, renorm,
              scale, tab, g, u, y, I, D, sh, o, ids_out, one_pass);
    return cudaGetLastError();
}

cudaError_t cu_moe_dev_launch(const float *logits, const float *bias, int E, int K, int G, int topk_group, int renorm,
                              float scale, const void *const *tab, df_wtype tgu, df_wtype tdn, int64_t I, int64_t D,
                              const float *h2, float *g, float *u, float *y, const float *sh, int act, float beta, float lb,
                              float *resid, cu_moe_route_out *o, cudaEvent_t join, cudaStream_t st, int *ids_out,
                              const void *h2xs) {
    cudaError_t e = cu_route_launch(logits, bias, E, K, G, topk_group, renorm, scale, tab, g, u, y, I, D, sh, o, st, ids_out);
    if (e != cudaSuccess) return e;
    cu_rt_mark("moe: route");
    if ((e = cu_mma_group_dev_launch(tgu, I, D, h2, 1, 2 * K, 1, &o->gu, st, NULL, 0, 0.0f, 0.0f, h2xs)) != cudaSuccess) return e;
    cu_rt_mark("moe: grouped gate+up");
    /* the activation as the downs' input is split (the bits of the activation kernel, then the split) */
    if ((e = cu_mma_group_dev_launch(tdn, D, I, g, K, K, 1, &o->dn, st, u, act, beta, lb)) != cudaSuccess) return e;
    cu_rt_mark("moe: activation, grouped down");
    if (join && (e = cudaStreamWaitEvent(st, join, 0)) != cudaSuccess) return e;
    if ((e = cu_combine_resid_dev_launch(resid, D, &o->cb, st)) != cudaSuccess) return e;
    cu_rt_mark("moe: combined into the residual");
    return cudaSuccess;
}

extern "C" int df_cuda_route_test(const float *logits, const float *bias, int E, int K, int n_group, int topk_group,
                                  int renorm, float scale, int *ids, float *weights) {
    if (E <= 0 || E > CU_ROUTE_MAXE || K < 1 || K > CU_ROUTE_MAXK || K > E) return -1;
    if (cu_rt_lock()) return -1;
    cudaStream_t st = cu_rt_stream();
    char *d = nullptr;
    const size_t fe = sizeof(float) * (size_t)E, tb = sizeof(void *) * 6 * (size_t)E;
    int rc = -1;
    do {
        if (cudaMalloc(&d, 2 * fe + tb + sizeof(cu_moe_route_out)) != cudaSuccess) break;
        float *dl = (float *)d, *db = (float *)(d + fe);
        void **tab = (void **)(d + 2 * fe);
        cu_moe_route_out *o = (cu_moe_route_out *)(d + 2 * fe + tb);
        if (cudaMemcpyAsync(dl, logits, fe, cudaMemcpyHostToDevice, st) != cudaSuccess) break;
        if (bias && cudaMemcpyAsync(db, bias, fe, cudaMemcpyHostToDevice, st) != cudaSuccess) break;
        if (cudaMemsetAsync(tab, 0, tb, st) != cudaSuccess) break;
        if (cu_route_launch(dl, bias ? db : nullptr, E, K, n_group > 1 ? n_group : 1, topk_group, renorm, scale, tab,
                            nullptr, nullptr, nullptr, 0, 0, nullptr, o, st) != cudaSuccess)
            break;
        if (cudaMemcpyAsync(ids, o->ids, sizeof(int) * (size_t)K, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cudaMemcpyAsync(weights, o->w, sizeof(float) * (size_t)K, cudaMemcpyDeviceToHost, st) != cudaSuccess) break;
        if (cudaStreamSynchronize(st) != cudaSuccess) break;
        rc = 0;
    } while (0);
    if (rc) cu_rt_error("route test: a CUDA call failed");
    cudaStreamSynchronize(st);
    if (d) cudaFree(d);
    cu_rt_unlock();
    return rc;
}
