/*
 * cuda.h — the CUDA backend ("cuda"): the backend table's matmul runs on the
 * GPU with the weight resident in GPU memory (a cache keyed by the weight's
 * identity, see df_weight.dev_key), the small vector ops on the best CPU
 * backend. Design and limits: docs/cuda.md.
 *
 * Everything here links in every build: without the CUDA toolkit (DF_CUDA=OFF
 * or no nvcc) the functions report "not built" (src/kernels/cuda_none.c). With
 * it, cudart is linked statically, so a binary runs on machines without a GPU
 * or driver: df_cuda_probe then says why there is no device.
 */
#ifndef DF_KERNELS_CUDA_H
#define DF_KERNELS_CUDA_H

#include "kernels/backend.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable CUDA devices (>= 1: device 0 is used), or 0 with the reason in why
 * ("this build has no CUDA backend ...", "no CUDA device (cudaGetDeviceCount: ...)"). why may be NULL. */
int df_cuda_probe(char *why, size_t whylen);

/* The backend table (NULL when df_cuda_probe finds no device). */
const df_backend *df_cuda_backend(void);

/* Device name and memory, e.g. "NVIDIA H200, 139.8 GiB, sm_90" into buf; "" without a device. */
void df_cuda_describe(char *buf, size_t len);

/* GPU memory (bytes) the routed-expert cache may hold; 0 = all free memory less a 1 GiB reserve.
 * Weights with dev_key == 0 (the spine) are cached outside this budget while memory lasts. */
void df_cuda_set_expert_budget(uint64_t bytes);
/* 1: weights with dev_key == 0 are cached by host address (a resident spine); 0: they are copied
 * to the GPU on every call (spine streaming reuses its staging buffers for other layers). */
void df_cuda_set_cache_by_address(int on);
/* Matmul kernel choice, for tests and benchmarks (every choice gives the same outputs bit for bit; docs/cuda.md).
 * 0 = automatic, 1 = the one-row-per-warp kernel. One token (env DF_CUDA_MV_ROWS): 2 = the tiled kernel with
 * 2 rows per warp and 4 warps per block, 4 = 4 rows per warp, 4 warps, 8 = 2 rows per warp, 8 warps.
 * T >= 2 (env DF_CUDA_TILE): the tiled kernel's block, 2 = 8 rows x 8 tokens, 4 = 32 x 8, 8 = 16 x 8. */
void df_cuda_set_matvec_rows(int n);
void df_cuda_set_tile(int n);
/* 1 (the default; env DF_CUDA_SPLIT): matrices of at most 2048 rows off the tensor cores run the K-split kernel, a
 * canonical order of its own for every T; 0: the kernels above. The two give different bits; for tests. */
void df_cuda_set_split(int on);
/* Drop every cached weight (a model was closed: its host addresses may be reused). */
void df_cuda_cache_clear(void);
/* Drop the routed experts of the model with this device tag (DF_DEVKEY) and every weight cached by host address (the
 * closed model's may be reused); the other open models' experts stay (their spine weights are uploaded again when
 * next used). */
void df_cuda_cache_drop_model(int tag);

/* Upload w into the weight cache now (its key as df_cuda_matmul would use): 0 = cached, 1 = no room
 * (it will be copied per call), -1 = no device / CUDA error. */
int df_cuda_preload(const df_weight *w);
/* DF_CUDA_TRACE=1 (cuda_trace.c): wrap the table's GPU calls with wall-time counters printed at exit. */
struct df_backend;
void df_cuda_trace_wrap(struct df_backend *be);
/* With DF_CUDA_TRACE=1: the device time (seconds) of the GPU entry point that returned last, from taking the runtime's
 * mutex to its closing synchronisation (events on its stream); -1 when not traced or not measured. */
double df_cuda_last_gpu_s(void);
/* With DF_CUDA_TRACE=1 or 2: the host time of the entry point that returned last, from taking the runtime's mutex to
 * calling its closing synchronisation (*queue: preparing and queueing its work) and inside that synchronisation
 * (*wait: the device finishing it); 0, or -1 when not traced or not measured. */
int df_cuda_last_host_split(double *queue, double *wait);
/* With DF_CUDA_TRACE=1: the device time per stage of the entry points (copies in and out, each kernel), on stderr. */
void df_cuda_trace_stages(void);
/* df_backend.dev_load: upload the routed-expert weight w (host data, dev_key set) into the expert cache unless it
 * is there: 0 = resident, 1 = it does not fit without evicting a cached expert (the GPU budget, or the free memory
 * less the 1 GiB reserve and the room the attention's KV mirrors may still take, DF_CUDA_KV_MIRROR), -1 = no device /
 * CUDA error / no host data or key. */
int df_cuda_dev_load(const df_weight *w);
/* Upload every weight of a resident spine the GPU reads (the layers' projections, kv_b for the attention core,
 * routers, dense / shared MLPs and lm_head; not the embedding, which the CPU reads row by row) in layer order;
 * stops at the first that does not fit. Returns the weights' bytes now cached on the GPU; *all = 1 when every one is. */
uint64_t df_cuda_preload_spine(const df_spine *sp, int n_layers, int *all);
/* Pin a cached weight by its explicit key (df_backend.dev_pin): 1 and its type/shape in *w, or 0. */
int df_cuda_pin(uint64_t dev_key, df_weight *w);
/* 1 when the weight with this explicit key is cached on the GPU now (df_backend.dev_has: no pin, no recency or hit
 * counted), else 0. */
int df_cuda_has(uint64_t dev_key);
/* Page-lock host memory [p, p + n) for DMA (cudaHostRegister; 0 = done, -1 with df_cuda_last_error) and undo it
 * (cudaHostUnregister; memory never registered is ignored). */
int df_cuda_host_pin(void *p, size_t n);
void df_cuda_host_unpin(void *p);
void df_cuda_unpin(uint64_t dev_key);
/* df_backend.moe_routed: the picks (ascending ids) of the caller's last device routing of this layer, once a later call
 * synchronised the stream after it: 1 with ids [K], each routing reported once; else 0. */
int df_cuda_moe_routed(uint64_t resid_key, int layer, int *ids);
/* df_backend.final_logits: rows x [n, D] copied in (or, x NULL and n = 1, the caller's device residual), cu_rmsnorm
 * with norm [D] (cached by address), lm_head as a matmul (cached or copied like one), logits copied out; one
 * synchronisation. */
int df_cuda_final_logits(const float *x, int n, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head,
                         float *logits);
/* Greedy decoding on the device (cuda_greedy.cu; df_backend.final_argmax / token_wait / embed_dev, their contracts in
 * kernels/backend.h). df_cuda_final_argmax: df_cuda_final_logits's norm and lm_head for one row (x [D] host, or x
 * NULL: the caller's device residual), then the first index of the largest logit into the device's token slot and
 * into pinned read-back slot `slot` (0 or 1); queued, not waited for. df_cuda_token_wait: waits for slot's
 * token and gives it. df_cuda_embed_dev: the caller's device residual row = the embedding row of the device's token
 * slot (decoded as decode_row); queued; resid_key 0: embed uploaded into the weight cache if it is not there (0 when it
 * is cached, -1 when there is no room). Each 0, or -1 (df_cuda_last_error). */
int df_cuda_final_argmax(const float *x, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head,
                         int slot);
int df_cuda_token_wait(int slot, int32_t *id);
int df_cuda_embed_dev(uint64_t resid_key, const df_weight *embed);
/* The device routing alone (tests): engine/moe.c moe_route's contract for one token (logits [E], bias [E] or NULL,
 * n_group / topk_group, renorm, scale; K <= 16, E <= 1024), computed by the route kernel of the device MoE path
 * (cuda_moe.cu); ids [K] and weights [K] in ascending id order. 0, or -1 (no device, limits, CUDA error). */
int df_cuda_route_test(const float *logits, const float *bias, int E, int K, int n_group, int topk_group, int renorm,
                       float scale, int *ids, float *weights);

/* df_backend.kda_recur on the GPU (cuda_kda.cu): one sequence's KDA recurrence, rows and state copied in and out;
 * the bits of engine/kda.c's kda_recur_head with a lower-bound gate. 0, or -1 (no device, K > 224, a CUDA error; the
 * caller's state untouched). */
int df_cuda_kda_recur(const df_kda_args *a);
/* df_backend.kda_block on the GPU (cuda_kda.cu): the KDA mixer of n_seq sequences' rows in one call (h in, out back),
 * each state from and into the device's copy under its key when there is one or room for one (kept[s] = 1), else
 * copied in from and back into conv[s] and S[s]. -1: no device, K > 224, shapes that do not chain, a CUDA error (every
 * state as before). */
int df_cuda_kda_block(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                      float *const *conv, float *const *S, float *out, unsigned char *kept);
/* df_backend.kda_state on the GPU (cuda_kda.cu): fetch (DF_KDA_FETCH) or forget (DF_KDA_DROP) the device's copy of
 * the KDA state under key, keep its snapshot (DF_KDA_SNAP), make that current (DF_KDA_RESTORE) or fetch it
 * (DF_KDA_FETCH_SNAP); backend.h gives the contract. 0, or -1 (a failed copy, no copy or snapshot, no room for a
 * snapshot; error recorded). */
int df_cuda_kda_state(uint64_t key, float *conv, float *S, int op);
/* The KDA states' device copies: how many, and their bytes (tests). */
void df_cuda_kda_copies(int *n, uint64_t *bytes);

typedef struct {
    uint64_t spine_bytes, expert_bytes;   /* cached now */
    uint64_t expert_hits, expert_misses;  /* routed-expert cache lookups */
    uint64_t uploaded_bytes;              /* host -> GPU weight bytes since start */
    uint64_t grouped_items;               /* MLP items run in grouped tensor-core launches (df_cuda_mlp_group) */
    uint64_t shared_early;                /* MoEs that took the shared expert their mla_block started */
    uint64_t dev_routed;                  /* one-token MoEs routed and run on the device (df_mla_block.moe) */
} df_cuda_stats;
void df_cuda_get_stats(df_cuda_stats *out);

/* ---- the GPU ops on host arrays (tests and benchmarks; each call copies in, runs, copies out).
 * Return 0, or -1 with no device / on a CUDA error (df_cuda_last_error). ---- */
const char *df_cuda_last_error(void);
/* y [T, rows] = x [T, cols] W^T, same contract as df_backend.matmul (W cached like the backend's). */
int df_cuda_matmul(const df_weight *w, const float *x, int T, float *y);
/* One token through two matrices of one width, ya [a.rows] = A x and yb [b.rows] = B x, each bitwise as df_cuda_matmul
 * gives it: 1 = in one launch (same encoding, both cached, both on the K-split kernel: cu_matmul2_launch), 0 = in two;
 * -1 (widths differ, no device, a CUDA error). */
int df_cuda_matmul2(const df_weight *a, const df_weight *b, const float *x, float *ya, float *yb);
/* out [T, down.rows] = down(act(gate x, up x)) on the GPU, one round trip (df_backend.mlp). */
int df_cuda_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
                const float *x, int T, float *out);
/* n MLPs in one round trip (df_backend.mlp_group): item i, out[i] [T[i], down[i]->rows] from x[i]
 * [T[i], gate[i]->cols], bitwise equal to df_cuda_mlp on that item alone; one copy in (all the x[i]), every item's
 * kernels on the stream, one copy out, one synchronisation. Weights found or cached like df_cuda_mlp's. */
int df_cuda_mlp_group(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                      int act, float beta, float lb, const float *const *x, const int *T, float *const *out);
/* The MLA projections of T rows in one round trip (df_backend.mla_project, same contract): h copied in; q_a, the
 * RMSNorm (cu_rmsnorm: fp64 sum of squares by a fixed tree), q_b (or q_proj) and kv_a on the stream; q and kva
 * copied out; one synchronisation. Weights found or cached as for a matmul. */
int df_cuda_mla_project(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b,
                        const df_weight *q_proj, const df_weight *kv_a, const float *h, int T, float *q, float *kva);
/* The MLA attention core of T rows in one round trip (df_backend.mla_attend, same contract, seq_key included): kv_b
 * from the weight cache (decoded exactly, every encoding); q and the latent caches copied in, o_v out, one
 * synchronisation. A cache with a nonzero seq_key is mirrored in GPU memory between calls (docs/cuda.md): only its
 * rows from the first one the device copy lacks or the call rewrites (min over its rows of npos - 1) up to its
 * largest npos are copied; a cache with key 0 (or that no mirror has room for: env DF_CUDA_KV_MIRROR, LRU eviction)
 * is copied whole for the call ([0, max npos of its rows) once). A fixed order of additions per (row, head), so a
 * row's o_v is bitwise the same alone or in a batch, mirrored or not. -1 (df_cuda_last_error says why) for
 * kv_lora_rank > 1024, a kv_b shape that does not match, npos < 1, one nonzero key given for two different caches,
 * an invalid DF_CUDA_KV_MIRROR, no device or a CUDA error (the call's mirrors are then dropped). */
int df_cuda_mla_attend(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                       const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                       float *o_v);
/* Drop the device mirrors of the sequence uid (the df_cuda_mla_attend and df_cuda_kda_block keys k with k >> 8 == uid;
 * df_backend.seq_forget; a KDA state's copy is forgotten, not fetched); uid 0: every latent-cache mirror (a model was
 * opened or closed) but no KDA state's copy (the current state of a session, perhaps of another model, which drops it
 * by its uid when freed). Nothing to do without a device. */
void df_cuda_seq_forget(uint64_t uid);
/* df_cuda_mla_attend followed by the output projection on the device (df_backend.mla_attend_o): out [T, o->rows] =
 * o(o_v) by the matmul kernels' own launch (the bits of df_cuda_matmul on that o_v), one copy out of out instead of
 * o_v; -1 also for an o whose columns are not H x dv. */
int df_cuda_mla_attend_o(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                         const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                         const df_weight *o, float *out);
/* One layer's MLA mixer, its residual and the FFN's input norm and router in one round trip (df_backend.mla_block, same
 * contract): x and the cos/sin table copied in with the latent cache rows the device lacks (as df_cuda_mla_attend,
 * mirrors included; the call's own rows are computed and written on the device); the input RMSNorm, the projections
 * (as df_cuda_mla_project), the latent KV rows' RMSNorm and RoPE and the queries' RoPE (one kernel), the attention core
 * and o_proj (as df_cuda_mla_attend_o), the residual with the FFN's RMSNorm and the router (df_cuda_matmul's kernels)
 * on the stream; x_out, h2, the logits and the new cache rows copied out; one synchronisation. The norms' sums are
 * those of df_cuda_rmsnorm, so each step has the bits of its own GPU call. -1 (df_cuda_last_error says why) for weights
 * that do not chain, a shape mla_attend refuses, rows of one cache at positions that are not consecutive, no device
 * or a CUDA error (the call's mirrors are then dropped). */
int df_cuda_mla_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c, float *const *kpe,
                      const int *npos, const uint64_t *seq_key, float *x_out, float *h2, float *logits);
/* One token's MoE into the device residual (df_backend.moe_resid, same contract): the items as df_cuda_mlp_group
 * runs them (one copy in), then one kernel adds their weighted sum and the shared item into the residual row the
 * last df_cuda_mla_block left; no copy out, no synchronisation. -1 (df_cuda_last_error) for shapes that do not chain,
 * more than 32 routed items, no residual row yet, no device or a CUDA error. */
int df_cuda_moe_resid(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                      int act, float beta, float lb, const float *x, const float *w, int shared, uint64_t resid_key);
/* out[t] = rmsnorm(x[t]) * w for T rows of n (fp64 sum of squares, like cpu_scalar_rmsnorm). */
int df_cuda_rmsnorm(float *out, const float *x, const float *w, int T, int64_t n, float eps);
/* out[i] = silu(g[i]) * u[i] for n values. */
int df_cuda_silu_mul(float *out, const float *g, const float *u, int64_t n);
/* SiTU: out[i] = beta*tanh(g/beta)*sigmoid(g) * (lb != 0 ? lb*tanh(u/lb) : u) (engine eng_act). */
int df_cuda_situ_mul(float *out, const float *g, const float *u, int64_t n, float beta, float lb);
/* In-place softmax of T rows of n values (max-subtracted, fp64 sum, like cpu_scalar_softmax). */
int df_cuda_softmax(float *x, int T, int64_t n);
/* RoPE of T vectors of dim values at positions pos[t] (engine rope_apply: pairs (x[2i], x[2i+1]) in,
 * de-interleaved out; cos/sin times attention_factor). inv_freq [dim/2]. */
int df_cuda_rope(float *x, int T, int dim, const float *inv_freq, float attention_factor, const int64_t *pos);

/* Benchmark: ms per call of the matmul kernel alone (weight and activations resident on the GPU,
 * CUDA events over iters calls) for a random weight of type t [rows, cols] and T rows; -1 on error. */
double df_cuda_bench_matmul(df_wtype t, int64_t rows, int64_t cols, int T, int iters);
/* Benchmark: ms per grouped tensor-core launch (as a decode step's MoE layer runs its experts) of n random weights
 * of type t (MXFP4 or BF16) [rows, cols], each applied to the same x [T, cols] (T <= 256): CUDA events over iters
 * calls, weights resident (n distinct weights: with n x the weight's bytes above the GPU's L2 cache, each call
 * reads them from HBM); -1 on error (df_cuda_last_error). */
double df_cuda_bench_group(df_wtype t, int64_t rows, int64_t cols, int T, int n, int iters);
/* fp32 FMA peak (FLOP/s) = SMs x 128 lanes x 2 x boost clock; also the SM count and clock (MHz). */
void df_cuda_fp32_peak(double *flops, int *sms, int *mhz);
/* Measured device-memory bandwidth (bytes read + written per second) of a large device-to-device copy. */
double df_cuda_bench_bandwidth(void);

#ifdef __cplusplus
}
#endif

#endif
