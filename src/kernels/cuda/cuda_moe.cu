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
#include "cuda_route.cuh"

#include <math.h>
#include <stdint.h>

namespace {

/* Block: 32 threads, or (one_pass) a multiple of 32 >= E with the keys' area [E] in the dynamic shared memory. */
__global__ void route_kernel(const float *__restrict__ lg, const float *__restrict__ bias, int E, int K, int G, int topk_group,
                             int renorm, float scale, const void *const *__restrict__ tab, float *g, float *u, float *y,
                             int64_t I, int64_t D, const float *sh, cu_moe_route_out *o, int *ids_out, int one_pass) {
    pdl_enter();
    extern __shared__ unsigned long long sm[]; /* (one_pass) keys [E], then s [E], choice [E] as floats */
    route_body(lg, bias, E, K, G, topk_group, renorm, scale, tab, g, u, y, I, D, sh, o, ids_out, one_pass, sm);
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
                              const void *h2xs, const cu_router *rt) {
    cudaError_t e = cudaErrorNotSupported;
    if (rt) {
        const cu_route_args a = {bias, E, K, G, topk_group, renorm, scale, tab, g, u, y, I, D, sh, o, ids_out};
        e = cu_router_route_launch(rt->type, rt->data, rt->scale, E, rt->cols, rt->x, const_cast<float *>(logits), &a, st);
        if (e == cudaErrorNotSupported &&
            (e = cu_matmul_launch(rt->type, rt->data, rt->scale, E, rt->cols, rt->x, 1, const_cast<float *>(logits), st)) ==
                cudaSuccess)
            e = cudaErrorNotSupported; /* the router alone: the routing follows */
        if (e != cudaSuccess && e != cudaErrorNotSupported) return e;
    }
    if (e == cudaErrorNotSupported)
        e = cu_route_launch(logits, bias, E, K, G, topk_group, renorm, scale, tab, g, u, y, I, D, sh, o, st, ids_out);
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
