/*
 * backend.h — the compute backend interface used by the engine: a table of
 * function pointers chosen at runtime ("cpu" = best SIMD this machine has,
 * "cpu-scalar" = the plain-C reference kept for tests; a CUDA backend can slot
 * in beside them), plus the pthread pool the kernels share.
 *
 * Every op works on fp32 activations; linear weights stay in their checkpoint
 * encoding (src/model/weights.h) and are decoded block by block on the fly with
 * fp32 accumulation (nothing is re-quantized). Encodings: shared/notes/formats.md.
 */
#ifndef DF_KERNELS_BACKEND_H
#define DF_KERNELS_BACKEND_H

#include "model/weights.h"
#include <stddef.h>
#include <stdint.h>

/* ------------------------------------------------------------ thread pool */

typedef struct df_pool df_pool;
/* Work item: process indices [begin, end); tid in [0, n_threads). */
typedef void (*df_task_fn)(void *ctx, int64_t begin, int64_t end, int tid);

/* n_threads <= 0: all online cores. Returns NULL on allocation failure. */
df_pool *df_pool_new(int n_threads);
void df_pool_free(df_pool *p);
int df_pool_threads(const df_pool *p);
/* Run fn over [0, n) in chunks of about `grain` indices on all threads (the
 * caller works too); returns when every chunk is done. p may be NULL (serial). */
void df_pool_run(df_pool *p, int64_t n, int64_t grain, df_task_fn fn, void *ctx);

/* --------------------------------------------------------------- backend */

/* One token's routed experts, routed and run on the device right after the MLA block that computes their router
 * logits (df_mla_block.moe): in, the layer's routing (engine/moe.c moe_route: the same selection and weights, with
 * route_math.h's sigmoid) and activation; out, set by the backend. */
typedef struct df_moe_dev {
    int tag, layer;                     /* the experts' DF_DEVKEY tag and layer */
    int E, K, n_group, topk_group;      /* routed experts, top-k, groups and groups kept (n_group <= 1: no groups);
                                         * E = K = 0: a dense MLP, the block's started sh_gate / sh_up / sh_down, whose
                                         * output is added into the residual as forward's x += out */
    int renorm;                         /* divide the top-k weights by their sum (+ 1e-20) */
    float scale;                        /* routed_scaling_factor */
    const float *bias;                  /* [E] e_score_correction_bias (selection only), or NULL */
    int act;                            /* 0 SwiGLU, 1 SiTU (beta, lb) */
    float beta, lb;
    int shared;                         /* the layer has a shared expert (the block must have started it: sh_gate) */
    int queued;                         /* out: 1 = routed, the experts' MLPs, the combine and the residual add queued
                                         * (the moe_resid that would follow is not to be called), 0 = not (the
                                         * caller routes from the returned logits as without this) */
    uint64_t bytes;                     /* out: the routed experts' weight bytes read (queued) */
} df_moe_dev;

/* The weights and shape of one layer's MLA mixer with its residual and the FFN's input (df_backend.mla_block;
 * engine/attention.c, the absorbed form). */
typedef struct df_mla_block {
    const float *attn_norm, *ffn_norm;  /* [D] the layer's input and post-attention RMSNorm weights */
    float eps;                          /* their epsilon (rms_norm_eps) */
    const df_weight *q_a, *q_b;         /* q_lora_rank > 0: q = q_b(rmsnorm(q_a h, q_a_norm)); else NULL */
    const df_weight *q_proj;            /* q_lora_rank == 0: q = q_proj h; else NULL */
    const df_weight *kv_a, *kv_b, *o;   /* kv_a [kvl + dr, D], kv_b [H*(dn+dv), kvl], o [D, H*dv] */
    const df_weight *router;            /* [E, D], or NULL (a dense FFN: no router logits) */
    const float *q_a_norm, *kv_a_norm;  /* [q_a.rows] (or NULL), [kvl] */
    float lora_eps;                     /* epsilon of q_a_norm and kv_a_norm */
    int H, dn, dr, dv, kvl;             /* heads, nope / rope / value head dims, kv_lora_rank */
    float scale;                        /* softmax scale */
    uint64_t resid_key;                 /* the caller's residual stream on the device (an engine's address; 0: none) */
    /* Optional (T = 1 with resid_key): the next FFN's shared expert, which the backend may start on h2 right after the
     * router, before the call returns, for the moe_resid call that follows with the same weights (so the device
     * works on it while the host routes); NULL: none. sh_act, sh_beta, sh_lb as moe_resid's act, beta, lb. */
    const df_weight *sh_gate, *sh_up, *sh_down;
    int sh_act;
    float sh_beta, sh_lb;
    /* Optional (T = 1 with resid_key and a router, the next FFN a routed MoE whose every expert is resident in device
     * memory): route the token on the device and add the MoE's output (its routed experts and the shared expert the
     * block started) into the device residual as moe_resid would, without the host; NULL: not. The backend may decline
     * (moe->queued = 0). The experts chosen reach the caller later through moe_routed. When it queues them, the call
     * may return before the device has finished: x_out, h2 and logits are then not written (the caller needs none of
     * them: the layer's output is in the device residual), and the cache rows it writes reach the host arrays c / kpe
     * at a later call of this backend (before any call reads those host rows, and at the latest at the next call that
     * waits for the device; seq_forget of the sequence drops them). */
    df_moe_dev *moe;
} df_mla_block;

/* One sequence's KDA recurrence (engine/kda.c; the math in kernels/kda_math.h): T rows of H heads of K values,
 * rows [T, H*K] row-major (bl [T, H]); S [H][K][K] the sequence's state (row r = key channel), updated in place.
 * q and k are the conv'd, SiLU'd projections (q and k may be overwritten: their l2-normalized values); graw =
 * f_b(f_a(x)) before dt_bias; bl the beta logits; gate the output gate logits; o [T, H*K] the gated-RMSNorm'd output
 * (before o_proj). has_lb: the log-decay is lb * sigmoid(e^A_log[h] * raw), else -e^A_log[h] * softplus(raw);
 * silu_gate: the output gate is SiLU, else sigmoid; eps: the RMSNorm's. */
typedef struct {
    int H, K, T;
    float *q, *k;
    const float *v, *graw, *bl, *gate;
    const float *A_log, *dt_bias, *o_norm; /* [H], [H*K], [K] */
    int has_lb, silu_gate;
    float lb, eps;
    float *S, *o;
} df_kda_args;

/* One KDA layer's mixer (engine/kda.c, the math in its header comment) for the rows of one sequence, on a backend
 * with its own: the projections q, k, v, f_a -> f_b, beta, g (or g_a -> g_b when g is NULL) of h, the short
 * convolutions (conv_q / conv_k / conv_v [H*K, W], SiLU), the recurrence and gated RMSNorm as df_kda_args, and o. */
typedef struct {
    const df_weight *q, *k, *v, *f_a, *f_b, *beta, *g, *g_a, *g_b, *o;
    const float *conv_q, *conv_k, *conv_v;   /* [H*K, W] */
    const float *A_log, *dt_bias, *o_norm;   /* [H], [H*K], [K] */
    int H, K, W, has_lb, silu_gate;
    float lb, eps;
} df_kda_block;

enum { DF_KDA_DROP = 0, DF_KDA_FETCH = 1, DF_KDA_SNAP = 2, DF_KDA_RESTORE = 3, DF_KDA_FETCH_SNAP = 4 }; /* kda_state's op */
enum { DF_KDA_BLOCK_SEQS = 32 };              /* the most sequences of one df_backend.kda_block call */

typedef struct df_backend {
    const char *name;   /* "cpu-avx512", "cpu-avx2", "cpu-scalar" */
    /* y[t*rows + r] = sum_c W[r,c] * x[t*cols + c] for t < T (x: [T, cols], y: [T, rows]).
     * fp32 accumulation on the encoding; parallel over rows on `pool`. */
    void (*matmul)(df_pool *pool, const df_weight *w, const float *x, int T, float *y);
    /* Decode row `row` of W into out[cols] (fp32). Also the embedding lookup. */
    void (*decode_row)(const df_weight *w, int64_t row, float *out);
    float (*dot)(const float *a, const float *b, int64_t n);
    void (*axpy)(float *y, float a, const float *x, int64_t n);   /* y += a*x */
    /* out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]  (HF DeepseekV3RMSNorm, fp32) */
    void (*rmsnorm)(float *out, const float *x, const float *w, int64_t n, float eps);
    /* out[i] = silu(g[i]) * u[i], silu(z) = z / (1 + exp(-z)) */
    void (*silu_mul)(float *out, const float *g, const float *u, int64_t n);
    /* in-place softmax over n values (max-subtracted, fp32) */
    void (*softmax)(float *x, int64_t n);
    /* Optional (NULL: the caller evaluates the expressions itself). Attention scores of H heads against npos cached
     * positions: p[h*ldp + s] = (dot(ql + h*ldql, c + s*n1, n1) + dot(qp + h*ldqp, kpe + s*n2, n2)) * scale for
     * h < H, s < npos, with this backend's `dot`, so each value has the bits of that expression (one call instead of
     * 2*H*npos; the cached rows are read once for all H heads). Returns 0, or -1 for a shape it does not take (then
     * nothing is written). Used by engine/attention.c (MLA scores in absorbed form). */
    int (*attn_scores)(const float *ql, int64_t ldql, const float *qp, int64_t ldqp, int H, const float *c, int64_t n1,
                       const float *kpe, int64_t n2, int64_t npos, float scale, float *p, int64_t ldp);
    /* Optional. Attention values of H heads: for s = 0, 1, ..., npos - 1 in that order, axpy(o + h*ldo, p[h*ldp + s],
     * c + s*n1, n1) for every h < H, with the bits of those axpy calls (o accumulated in place). Returns 0, or -1 for a
     * shape it does not take (nothing written). */
    int (*attn_values)(const float *p, int64_t ldp, int H, const float *c, int64_t n1, int64_t npos, float *o, int64_t ldo);
    /* Optional (NULL on the CPU): weights resident in device memory, the first routed-expert tier.
     * dev_pin: when the weight with this dev_key (DF_DEVKEY) is resident, keep it so until dev_unpin and
     * return 1 with *w = its type and shape (data and scale NULL: matmul finds it by dev_key); else 0. */
    int (*dev_pin)(uint64_t dev_key, df_weight *w);
    void (*dev_unpin)(uint64_t dev_key);
    /* Optional (NULL on the CPU; set whenever dev_pin is): 1 when the weight with this dev_key is resident in device
     * memory now, else 0; no side effect (neither pinned nor counted as a use in the device cache's recency or hit
     * count). */
    int (*dev_has)(uint64_t dev_key);
    /* Optional (NULL on the CPU): upload a routed-expert weight (host data, dev_key set) into device memory now,
     * without evicting anything: 0 = resident, 1 = no room for it (nothing evicted), -1 = error. (--preload) */
    int (*dev_load)(const df_weight *w);
    /* Optional (a device tier other than the CUDA backend's, whose cache api.c manages itself): forget every routed
     * expert whose DF_DEVKEY tag is tag (the model holding that tag was closed; the tag may be given to the next). */
    void (*dev_drop_tag)(int tag);
    /* Optional: a whole MLP in one call, out [T, down.rows] = down(act(gate x, up x)) for x [T, gate.cols];
     * act 0 = SwiGLU silu(g)*u, 1 = SiTU (beta, lb as eng_act). Returns 0, or -1 when it cannot (the caller then
     * runs the three matmuls and the activation itself). */
    int (*mlp)(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
               const float *x, int T, float *out);
    /* Optional: page-lock n bytes at p for the device's DMA (0 = done) / undo it (ignored for memory never
     * pinned). The expert store pins its slot buffers with these, so experts are copied to the GPU at the
     * bus's speed. */
    int (*host_pin)(void *p, size_t n);
    void (*host_unpin)(void *p);
    /* Optional (NULL on the CPU): n independent MLPs ("items") in one call, as mlp does each, with one copy of all
     * the inputs to the device, the items' kernels back to back, one copy back and one synchronisation. Item i:
     * out[i] [T[i], down[i]->rows] = down[i](act(gate[i] x[i], up[i] x[i])) for x[i] [T[i], gate[i]->cols] (fp32,
     * row-major; items may differ in weights, encodings, widths and T; T[i] <= 0: item skipped, out[i] untouched);
     * act, beta, lb as mlp, for every item. Each item's out[i] is bit for bit what mlp gives for it alone. Weights
     * as mlp takes them (host data, or a dev_pin view with no host data). Returns 0, or -1 when it cannot (shapes
     * that do not chain, a device error: no out[i] is then to be trusted and the caller computes the items as it
     * would without this op). */
    int (*mlp_group)(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                     int act, float beta, float lb, const float *const *x, const int *T, float *const *out);
    /* Optional (NULL on the CPU): the MLA projections of T rows in one call (engine/attention.c): with q_a (q_lora_rank
     * > 0) q [T, q_b.rows] = q_b(rmsnorm(q_a h) with weight q_a_norm [q_a.rows] and eps), else q = q_proj h; kva
     * [T, kv_a.rows] = kv_a h; h [T, kv_a.cols] (fp32). Each row's results depend only on that row. Returns 0, or -1
     * when it cannot (a device error: q and kva are then not to be trusted and the caller computes them itself). */
    int (*mla_project)(const df_weight *q_a, const float *q_a_norm, float eps, const df_weight *q_b,
                       const df_weight *q_proj, const df_weight *kv_a, const float *h, int T, float *q, float *kva);
    /* Optional (NULL on the CPU): the MLA attention core of T rows in one call (engine/attention.c, absorbed form):
     * kv_b [H*(dn+dv), kvl] (per head h: dn rows K_h, then dv rows V_h; any encoding); q [T, H*(dn+dr)] per head
     * [nope | rope], RoPE already applied; row t attends to the positions 0..npos[t]-1 of its sequence's latent cache,
     * c[t] [>= npos[t], kvl] (normalised c_kv) and kpe[t] [>= npos[t], dr] (k_pe); rows of one sequence share the
     * pointers. o_v [T, H*dv] (fp32) = V_h o_lat with o_lat = sum_s p_s c_s, p = softmax((q_lat . c_s + q_pe .
     * kpe_s) * scale) (fp32, max-subtracted), q_lat = K_h^T q_nope. Each row's result depends only on that row's
     * inputs (the same bits alone or in any batch).
     * seq_key (NULL = every key 0): per row t, the identity of its cache (its sequence's latent cache of this
     * layer, engine: (df_kvcache.uid << 8) | layer) for a copy kept on the device between calls; 0 = none (the
     * cache's rows [0, npos[t]) are read from the host in this call). Rows with one nonzero key share c[t] and
     * kpe[t]. Contract for a nonzero key: with p = the smallest npos[t] - 1 over the call's rows with that key (the
     * first position the call's rows write), the host rows [0, p) of c and kpe hold the values they held when
     * earlier calls with that key read them; rows from p on may have changed (rewritten for this call, or after
     * a rollback), and are read again from the host.
     * Returns 0, or -1 when it cannot (a shape or encoding it does not support, a device error: o_v is then not to
     * be trusted and the caller computes the attention itself). */
    int (*mla_attend)(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                      const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                      float *o_v);
    /* Optional (NULL on the CPU): mla_attend followed by the output projection on the device: out [T, o->rows] =
     * o(o_v) (a model without an output gate); the same contract and return as mla_attend. */
    int (*mla_attend_o)(const df_weight *kv_b, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                        const float *const *c, const float *const *kpe, const int *npos, const uint64_t *seq_key,
                        const df_weight *o, float *out);
    /* Optional (NULL on the CPU): one layer's whole MLA mixer of T rows, its residual and the FFN's input in one
     * device call (a model without an output gate or attention residuals; engine/attention.c mla_block_chunk):
     *   h = rmsnorm(x, attn_norm); q, kva as mla_project(h); per row t at position p = npos[t] - 1:
     *   c_new = rmsnorm(kva[:kvl], kv_a_norm), kpe_new = rope(kva[kvl:], cs[t]), q_pe of every head = rope(q_pe,
     *   cs[t]); the cache rows p of c[t] / kpe[t] := c_new / kpe_new (written on the device, then into the host
     *   arrays before the return); a = o(attention core as mla_attend); x_out = x + a; h2 = rmsnorm(x_out,
     *   ffn_norm); logits = router(h2) when b->router is set.
     * rope(v, cs)[i] = v[2i] cs[2i] - v[2i+1] cs[2i+1], rope(v, cs)[i + dr/2] = v[2i+1] cs[2i] + v[2i] cs[2i+1]
     * (engine/rope.c rope_apply with cs = its cos, sin times the attention factor, rope_cs); cs NULL: no rotary.
     * x, x_out [T, D] (may be the same array; x NULL, for T = 1: x is the caller's device residual row, b->resid_key's,
     * as its last mla_block left it with moe_resid's output added), h2 [T, D], logits [T, router rows] (fp32,
     * row-major); with b->resid_key, x_out also stays on the device as that caller's residual; c, kpe, npos and
     * seq_key as mla_attend, with the rows of each cache in one call at consecutive positions ending at its largest
     * npos. Each row's results depend only on that row's inputs and its cache's earlier rows (the same bits alone or
     * in any batch). Returns 0, or -1 when it cannot (a shape it does not support, a device error: nothing it
     * returns is to be trusted, the host cache rows it would write may be half written, and the caller computes the
     * whole block with the other ops). */
    int (*mla_block)(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c, float *const *kpe,
                     const int *npos, const uint64_t *seq_key, float *x_out, float *h2, float *logits);
    /* Optional (NULL on the CPU): one token's MoE added into the device's residual row without a round trip (the next
     * mla_block, given x NULL, continues from it): n items as mlp_group's with T = 1, every one on the same input x
     * [gate.cols] (host), each down.rows = gate.cols; resid += (sum over the first n - shared items, in order, of
     * w[i] * out_i by fused multiply-adds from 0) + out of the last item when shared (the shared expert), then the
     * residual add: the bits of moe.c's axpy combine and forward's x += out with an FMA axpy; into the residual of
     * resid_key (as mla_block's b->resid_key; its last mla_block wrote it). Queued, not waited for. When that
     * mla_block was given this shared expert (b->sh_gate / sh_up / sh_down and its activation), the output it
     * started is used (the same kernels on the same h2: the same bits). Returns 0, or -1 when it cannot (nothing was
     * added: the caller computes the items with mlp_group). */
    int (*moe_resid)(int n, const df_weight *const *gate, const df_weight *const *up, const df_weight *const *down,
                     int act, float beta, float lb, const float *x, const float *w, int shared, uint64_t resid_key);
    /* Optional (NULL on the CPU; set whenever the backend may queue df_mla_block.moe): the experts a layer's device
     * routing chose for the caller resid_key, once the device has chosen them (after a later call of this backend
     * returned): ids [K] in ascending order and 1, each routing reported once; 0 = none (yet). */
    int (*moe_routed)(uint64_t resid_key, int layer, int *ids);
    /* Optional (NULL on the CPU): the model's logits [n, lm_head.rows] = lm_head(rmsnorm(x_t) * norm) (eps) of n rows
     * x [n, lm_head.cols] (host, fp32), or with x NULL and n = 1 of the caller's device residual row (resid_key's, as
     * the last mla_block and the MoE it queued left it). The same kernels for every n (each row's logits the same bits
     * alone or in a batch). Waits for the device. 0, or -1 when it cannot (an error recorded). */
    int (*final_logits)(const float *x, int n, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head,
                        float *logits);
    /* Optional (NULL on the CPU; all three or none): greedy decoding that stays on the device (engine/api.c
     * df_decode_greedy), so the next step is queued before this one's token is back. final_argmax: as final_logits
     * for one row (x [lm_head.cols] host, or x NULL: resid_key's device residual row), then the first index of the
     * largest logit (sample.c's argmax: NaN never wins; logit 0 NaN or all NaN: 0) into the device's token slot and
     * into read-back slot `slot` (0 or 1); queued, not waited for; the logits stay on the device.
     * token_wait: waits for the token of the last final_argmax into `slot` and gives it. embed_dev: resid_key's
     * device residual row = row (the device's token slot) of embed, the values of decode_row; queued (the next
     * mla_block, given x NULL, starts from it); with resid_key 0 only embed made resident in GPU memory (0 when it
     * is: the caller uses the device chain only then, never a per-call upload of the whole table). Each 0, or -1 (an error recorded). */
    int (*final_argmax)(const float *x, uint64_t resid_key, const float *norm, float eps, const df_weight *lm_head, int slot);
    int (*token_wait)(int slot, int32_t *id);
    int (*embed_dev)(uint64_t resid_key, const df_weight *embed);
    /* Optional (NULL on the CPU): the sequence with this uid (df_kvcache.uid) is gone: drop every device copy of its
     * caches (the mla_attend keys k with k >> 8 == uid); uid 0 = every sequence's. */
    void (*seq_forget)(uint64_t uid);
    /* Optional (NULL on the CPU: engine/kda.c runs kda_math.h's recurrence on the pool): a sequence's KDA recurrence
     * (df_kda_args) with the bits of the CPU's when has_lb is set (the same operations in the same order; softplus's
     * log1pf may differ in its last bit otherwise). 0, or -1 (then nothing is written: the caller runs it itself). */
    int (*kda_recur)(const df_kda_args *a);
    /* Optional (NULL on the CPU): a KDA layer's whole mixer for the rows of n_seq sequences (1..DF_KDA_BLOCK_SEQS) in
     * one call: out [T, o.rows] = the mixer of h [T, q.cols] (fp32, row-major; T = the sum of Ts, sequence s's Ts[s]
     * rows after sequence s - 1's), each sequence continuing its own conv state conv[s] [3][W-1][H*K] (the q, k, v
     * convolutions' last W-1 inputs) and S[s] [H][K][K]. The projections with the backend's matmuls over all rows
     * (each weight read once), everything after them with the bits of engine/kda.c's CPU loops when has_lb is set
     * (softplus's log1pf may differ in its last bit otherwise); each row's output depends only on its row and its
     * sequence's state before it (one call of T rows = T calls of one row, alone or beside other sequences).
     * key[s] (df_kvcache.uid << 8 | layer; 0: none; distinct) names sequence s's device copy of its state: a call
     * starts from that copy when the device holds one (then conv[s] and S[s] are not read), else from conv[s] and
     * S[s]; the state after the call stays there (kda_state fetches it) when the backend has room for a copy.
     * Returns 0 with kept[s] = 1 where the state after the call is kept only in the device's copy (conv[s] and S[s]
     * unchanged, stale until kda_state fetches it), 0 where it was written into conv[s] and S[s]; or -1: every state
     * as it was before the call, wherever it was (out not to be trusted: the caller computes the mixer itself, after
     * fetching the states). */
    int (*kda_block)(const df_kda_block *b, int n_seq, const int *Ts, const float *h, const uint64_t *key,
                     float *const *conv, float *const *S, float *out, unsigned char *kept);
    /* Optional (NULL on the CPU; set with kda_block): the device's copy of a KDA state (kda_block's key). op
     * DF_KDA_FETCH: when the copy is newer than the host's, written into conv and S (kda_block's shapes); the copy
     * stays, equal to the host's. DF_KDA_DROP: the copy and its snapshot forgotten (the host's state is about to
     * change, or is the current one; nothing to do when the device holds none). DF_KDA_SNAP: the copy's current state
     * also kept as its snapshot (replacing an earlier one; later kda_block calls leave it; conv and S unused).
     * DF_KDA_RESTORE: the snapshot becomes the copy's current state (newer than the host's; the snapshot stays).
     * DF_KDA_FETCH_SNAP: the snapshot written into conv and S. 0, or -1: the copy failed, or the device holds no copy
     * (or snapshot) to fetch or restore (the state is lost: the caller only asks for one kda_block or DF_KDA_SNAP
     * kept), or no room for a snapshot (nothing changed: the caller keeps the state on the host); error recorded. */
    int (*kda_state)(uint64_t key, float *conv, float *S, int op);
} df_backend;

/* "cpu" (or NULL/"") = best available SIMD; "cpu-scalar"; "cpu-avx2"; "cpu-avx512";
 * "cuda" (GPU matmuls, kernels/cuda.h); "auto" = cuda when a CUDA device is present, else cpu.
 * NULL if the name is unknown, the CPU lacks the instructions or there is no CUDA device. */
const df_backend *df_backend_get(const char *name);
/* Tests: one more backend that df_backend_get(b->name) returns (b stays owned by the caller, alive while in use;
 * NULL: none), e.g. the CPU's with the GPU's optional entry points emulated on the host. Not thread-safe. */
void df_backend_register(const df_backend *b);
/* Why df_backend_get(name) returned NULL, into buf (e.g. "no CUDA device (cudaGetDeviceCount: ...)"). */
const char *df_backend_why(const char *name, char *buf, size_t len);
/* Every backend this machine can run (scalar first); returns the count. */
int df_backend_list(const df_backend **out, int cap);
/* SIMD features found at runtime, e.g. "avx2 fma f16c" or "avx512f avx2 fma f16c". */
const char *df_cpu_features(void);

/* Bytes of the data + scale arrays of a weight (kernels' own accounting, for stats). */
uint64_t df_weight_bytes(const df_weight *w);

#endif
