/*
 * engine.h — internal interface of the forward pass (DeepSeek-V3 / Kimi K2
 * family): RoPE/YaRN tables, MLA attention with the absorbed latent KV cache,
 * noaux_tc MoE routing with rows grouped by expert, the per-layer forward.
 * Math: shared/notes/model-math.md (transformers DeepseekV3ForCausalLM, v5).
 * The public API (api.c) wraps this; tests may drive it directly with weights
 * built by hand and an expert source that is not the store.
 */
#ifndef DF_ENGINE_ENGINE_H
#define DF_ENGINE_ENGINE_H

#include "deltafin.h"
#include "kernels/backend.h"
#include "model/weights.h"
#include "store/store.h"

#include <stdint.h>

/* Where routed experts come from (the store in production; arrays in tests). */
typedef struct {
    void *ctx;
    int (*request)(void *ctx, int layer, const int *experts, int n, store_prio prio);
    int (*acquire)(void *ctx, int layer, const int *experts, int n, df_expert *views, char *err, size_t errlen);
    void (*release)(void *ctx, int layer, const int *experts, int n);
    /* optional (NULL: every member taken as in memory): which members are in memory (2), being read (1) or
     * neither (0) now (store_present) */
    void (*present)(void *ctx, int layer, const int *experts, int n, unsigned char *present);
} df_expert_src;

/* RoPE / YaRN constants resolved from the config (rope.c). */
typedef struct {
    int dim;                 /* qk_rope_head_dim */
    float *inv_freq;         /* [dim/2], fp32 as transformers computes it */
    float attention_factor;  /* multiplies cos and sin (YaRN mscale ratio; 1 without YaRN) */
    double softmax_scale;    /* qk_head_dim^-0.5 * mscale(factor, mscale_all_dim)^2 */
} df_rope;

int rope_init(df_rope *r, const df_config *cfg, char *err, size_t errlen);
void rope_free(df_rope *r);
/* Rotate one head's rope part in place at position pos. Input pairs (x[2i], x[2i+1]) (checkpoint
 * order); output in transformers' de-interleaved order: out[i], out[i + dim/2]. Both q and k
 * use it, so dot products equal the reference's. */
void rope_apply(const df_rope *r, float *x, int64_t pos);
/* The rotation rope_apply uses at position pos: cs[2i] = cos(inv_freq[i] pos) * attention_factor, cs[2i+1] = the
 * sine, for i < dim/2 (fp32, the same bits as rope_apply's); the table a backend's mla_block takes per row. */
void rope_cs(const df_rope *r, int64_t pos, float *cs);

/* Per-session sequence state.
 * MLA layers: normalized latent c_kv [kv_lora] and k_pe [rope] (roped unless mla_use_nope) per token (fp32).
 * KDA layers: the recurrent state S [heads, K, K] (fp32, S[h][k][v]) and the short-conv state: the last
 * W-1 pre-conv projections of q, k and v ([3][W-1][D], oldest first), both for the position n_past. */
typedef struct {
    uint64_t uid;            /* unique in the process, >= 1 (kv_init): names the cache's device mirrors
                              * (df_backend.mla_attend seq_key = uid << 8 | layer, seq_forget) */
    int n_layers, kv_lora, rope;
    int n_ctx;               /* hard limit */
    int cap;                 /* allocated positions (grows by doubling up to n_ctx) */
    float **c;               /* [n_layers][cap * kv_lora]; NULL for KDA layers */
    float **kpe;             /* [n_layers][cap * rope];    NULL for KDA layers */
    unsigned char mixer[DF_MAX_LAYERS];
    int kda_H, kda_K, kda_W; /* heads, head_dim, conv kernel */
    float **kda_S;           /* [n_layers][H*K*K]; NULL for MLA layers */
    float **kda_conv;        /* [n_layers][3*(W-1)*H*K]; NULL for MLA layers */
    /* a backend's device copies of the KDA states (df_backend.kda_block's key uid << 8 | layer): kda_be the backend
     * that may hold some (NULL: none); kda_dev[l] bit 0 (KV_KDA_COPY): it may hold layer l's, bit 1 (KV_KDA_NEWER):
     * that copy may be newer than kda_S / kda_conv, which are then stale until kv_kda_host; bit 2 (KV_KDA_SNAP): the
     * copy's snapshot (df_backend.kda_state DF_KDA_SNAP) stands for layer l's part of the last kv_recurrent_save's
     * buffer kda_snap, written there only when the copy is dropped (kda_snap_lost: such a write failed) */
    const df_backend *kda_be;
    unsigned char kda_dev[DF_MAX_LAYERS];
    float *kda_snap;
    int kda_snap_lost;
} df_kvcache;
enum { KV_KDA_COPY = 1, KV_KDA_NEWER = 2, KV_KDA_SNAP = 4 };
/* The key of a cache's layer on a backend's device (df_backend.mla_attend's seq_key, kda_block's key): uid << 8 |
 * layer, so that seq_forget(uid) finds every layer's. */
static inline uint64_t kv_layer_key(const df_kvcache *kv, int layer) { return kv->uid << 8 | (uint64_t)layer; }

/* An empty cache for cfg's layers with a fresh uid. Only attn_chunk (attention.c) writes the MLA rows c / kpe, at
 * the positions it then attends from (the seq_key contract of df_backend.mla_attend); code that writes them
 * otherwise must give the cache a fresh uid (kv_new_uid; the old one's device copies dropped with seq_forget). The
 * owner of a cache calls be->seq_forget(uid), when the backend has it, before kv_free. */
int kv_init(df_kvcache *kv, const df_config *cfg, int n_ctx);
/* A fresh cache uid (a process-wide counter from 1). */
uint64_t kv_new_uid(void);
/* Make room for positions [0, n); DF_ECONTEXT past n_ctx, DF_ENOMEM. */
int kv_reserve(df_kvcache *kv, int n);
void kv_free(df_kvcache *kv);
uint64_t kv_bytes(const df_kvcache *kv);
/* Bytes of the recurrent (KDA) state of all layers: what a snapshot holds (0 without KDA layers). */
uint64_t kv_recurrent_bytes(const df_kvcache *kv);
/* Layer l's KDA state current in kda_S / kda_conv: fetched from kda_be's device copy when that may be newer; drop: the
 * copy forgotten too (the host's state is about to change). DF_OK, or DF_EUNSUPPORTED when the fetch failed (err
 * names the layer and the backend's reason; the copy kept). */
int kv_kda_host(df_kvcache *kv, int l, int drop, char *err, size_t errlen);
/* Copy the recurrent state out to / in from buf (kv_recurrent_bytes bytes: per KDA layer S then the conv state);
 * reset sets it to zero (the state before position 0).
 * save: with dev, a layer with a device copy keeps its snapshot on the device when the backend can (DF_KDA_SNAP, a
 * third slot of device memory per layer for the session's life; buf's part written only if that copy is dropped
 * before the next save: for the frequent rollbacks of draft verification); otherwise, and without dev, the copy is
 * fetched first (kv_kda_host); buf must stay allocated while the cache lives or until the next save. DF_OK or
 * kv_kda_host's error.
 * load: from buf; where buf is the last save's, the device's snapshots become the current copies (DF_KDA_RESTORE),
 * other layers' copies are forgotten. DF_OK, or DF_EUNSUPPORTED (err says why) when that snapshot was lost: then the
 * state is reset (the caller recomputes from position 0).
 * reset: forgets every copy (snapshots written into the last save's buffer first). */
int kv_recurrent_save(df_kvcache *kv, float *buf, int dev, char *err, size_t errlen);
/* The last save's snapshot is not wanted any more (its position gone): its device parts are never fetched, a load
 * of its buffer fails (DF_EUNSUPPORTED) until the next save. */
void kv_recurrent_drop_snapshot(df_kvcache *kv);
int kv_recurrent_load(df_kvcache *kv, const float *buf, char *err, size_t errlen);
void kv_recurrent_reset(df_kvcache *kv);



/* The rows of one sequence in a batched forward pass: T consecutive rows continuing kv at n_past. */
typedef struct {
    df_kvcache *kv;
    int n_past;
    int T;
} df_seq_rows;

enum { DF_GUESS_VOTES = 8 };

/* Everything a forward pass needs. */
typedef struct {
    const df_config *cfg;
    const df_spine *spine;
    const df_backend *be;
    unsigned dev_tag;                /* the model's tag in the device's expert keys (DF_DEVKEY; api.c, 0 off the GPU) */
    df_pool *pool;
    df_expert_src experts;
    df_rope rope;
    int prefetch;                    /* router-based prefetch of layer L+1 (issue 4) */
    int prefetch_prompt;             /* the prompt-sized lookahead of layer L+1 (on whenever prefetch is, and without a budget) */
    int max_acquire;                 /* most experts experts.acquire may pin at once; 0 = top-k */
    /* counters (added to by forward) */
    uint64_t weight_bytes;           /* weight bytes touched by compute */
    double io_wait_s;                /* time in experts.acquire */
    uint64_t prefetch_issued;
    double phase_s[DF_PHASES];       /* wall time per forward phase (deltafin.h DF_PHASE_*) */
    unsigned char *touched;          /* [num_hidden_layers * n_routed_experts]: expert used since the last reset */
    uint64_t touched_n;              /* distinct (layer, expert) pairs used since the last reset */
    /* added for spine streaming (issue 4): NULL = the whole spine is resident */
    struct spine_stream *stream;
    /* prompt-sized lookahead: the residual stream after layer la_layer - 1's attention, from which
     * ffn_forward of that layer guesses la_layer's experts (NULL = none) */
    const float *la_x;
    int la_layer;
    /* the forward call's progress callback (NULL: none) and the layers it has finished: eng_tick reports them again
     * from inside a layer (a long prompt's attention chunks and expert chunks), so a caller that prints progress by
     * time sees a layer that takes long */
    int (*progress)(void *, const char *, uint64_t, uint64_t);
    void *progress_user;
    int progress_layers;
    /* one token's MoE into the backend's device residual (moe_resid): defer_ok, set by forward for an FFN call whose
     * next layer is an MLA block (which can take x from the device); ffn_deferred, set by ffn_forward when it did so
     * (its out was not written); x_dev, the host's x lacks that MoE output: the next block takes x from the device;
     * sh_early, set by forward for a block whose FFN will be such an MoE with a shared expert: the block may start
     * that shared expert on the device (df_mla_block.sh_gate) */
    int defer_ok, ffn_deferred, x_dev, sh_early;
    /* greedy decoding on the device (api.c df_decode_greedy; the backend's final_argmax, embed_dev), set by the caller
     * around one forward call of one row: dev_token, the row's token is the device's last argmax (ids[0] is not
     * read; the embedding row is made there); argmax_on, the final norm and lm_head run by final_argmax into read-back
     * slot argmax_slot (no logits written) */
    int dev_token, argmax_on, argmax_slot;
    /* router logits [T, n_routed_experts] of the next ffn_forward's rows, computed with the layer's MLA block
     * (df_backend.mla_block); NULL: ffn_forward runs the router itself */
    const float *ffn_logits;
    /* one token's MoE routed and run on the device by its layer's MLA block (df_mla_block.moe): moe_dev, set by forward
     * for a block whose FFN may go there; moe_queued and moe_bytes (the routed experts' weight bytes), set by the block
     * when it did; mr_pend[layer], such routings whose picks the backend has not reported yet (df_backend.moe_routed;
     * taken by eng_moe_settle), mr_npend of them */
    int moe_dev, moe_queued;
    uint64_t moe_bytes;
    unsigned char mr_pend[DF_MAX_LAYERS];
    int mr_npend;
    /* calibration of the prompt lookahead (moe_guess_prompt): per vote count v (1..DF_GUESS_VOTES, the last
     * bucket = v or more rows picked the expert), the guesses made and how many the layer then needed; the
     * votes of the last guess (gs_votes[n_routed_experts], of layer gs_layer; -1 = none to score) */
    uint32_t gs_made[DF_GUESS_VOTES + 1], gs_needed[DF_GUESS_VOTES + 1];
    int *gs_votes;
    int gs_layer;
    /* the decode lookahead's live A/B gate (forward.c): decode steps are timed in windows with the lookahead
     * on (arm 0) and off (arm 1); the faster arm then runs for pf_left steps before both are measured again.
     * prefetch_ungated: always on (no gate). pf_steps: decode steps run with each arm since the last reset. */
    int prefetch_ungated;
    int pf_arm, pf_measuring, pf_n, pf_left, pf_exploit, pf_best;
    int pf_mrows;                    /* rows per step of the current measurement (0: not yet set) */
    double pf_sum[2];
    uint64_t pf_rows[2];
    uint64_t pf_steps[2];
    /* routed picks (rows x top-k) and the distinct experts they name, summed over MoE layer calls since the last
     * reset: picks / union = how many rows each expert read serves */
    uint64_t routed_picks, routed_union;
    /* kda.c's rows of a call (projections, gates, output), kept and grown as needed: fresh pages for every KDA layer
     * would be faulted in and zeroed each time */
    float *kda_buf;
    size_t kda_cap; /* floats */
} df_engine;

/* Progress from inside a layer of the current forward call: its callback with ("layers", the layers finished, all
 * layers). Its answer is returned: non-zero (cancel) and the caller stops at that chunk boundary with eng_cancelled
 * (a long prompt's layer can take seconds). */
int eng_tick(df_engine *e);

/* DF_ECANCELLED with "evaluation cancelled in layer L" in err. */
int eng_cancelled(int layer, char *err, size_t errlen);

/* y = x W^T on the engine's backend, counting weight bytes. x [T, cols], y [T, rows]. */
void eng_matmul(df_engine *e, const df_weight *w, const float *x, int T, float *y);

/* MLA attention for T tokens at positions n_past.. (cache rows written here).
 * h: [T, hidden] (already input-normalized); out: [T, hidden]. */
int attn_forward(df_engine *e, int layer, df_kvcache *kv, int n_past, const float *h, int T, float *out,
                 char *err, size_t errlen);

/* MLA attention for the rows of n_seq sequences (engine.h df_seq_rows; h, out: [sum T, hidden]): up to
 * 256 rows in one pass (projections over all rows, each row attending to its own sequence's cache),
 * longer batches one sequence at a time. Each row's result equals attn_forward on its sequence alone. */
int attn_forward_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out,
                       char *err, size_t errlen);

/* Layer `layer`'s whole MLA mixer with its residual and the FFN's input, for the rows of n_seq sequences (as
 * attn_forward_batch chunks them), on a backend with mla_block (a model without an output gate or attention
 * residuals): x [sum T, hidden] += attention(rmsnorm(x)); h2 [sum T, hidden] = rmsnorm(x, ffn_norm); logits
 * [sum T, n_routed_experts] = router(h2) when logits is not NULL (a MoE layer). A chunk the backend cannot take is
 * computed with the separate steps (norm, attn_forward_batch's chunk, residual, norm, router). */
int attn_block_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, float *x, float *h2, float *logits,
                     char *err, size_t errlen);

/* noaux_tc routing of T rows of router logits [T, E] -> ids/weights [T, top_k] (moe.c). */
void moe_route(const df_config *cfg, const float *logits, const float *bias, int T, int *ids, float *weights);
/* The picks of the device-routed MoEs (engine.h mr_pend) the backend has reported since: counted as touched experts. */
void eng_moe_settle(df_engine *e);
/* FFN of a layer (dense MLP, or shared + routed experts grouped by expert). h: [T, hidden]
 * (post-attention-normalized); out: [T, hidden]. */
int ffn_forward(df_engine *e, int layer, const float *h, int T, float *out, char *err, size_t errlen);
/* Prefetch hook: route h (layer's ffn-normalized residual) with layer's router and request the
 * predicted experts a read would bring in (not in GPU memory, not already in a slot) with STORE_PREFETCH,
 * unless there are more than max_n guesses (max_n <= 0: no limit). No effect on numerics. */
void moe_prefetch(df_engine *e, int layer, const float *x_resid, int T, int max_n);

/* The experts layer `layer`'s router picks for any of the T rows of x_resid (the residual stream, normed
 * here with that layer's ffn_norm), into used[n_routed_experts], most-picked first (ascending id among
 * equals); returns how many (0 for a dense layer or on allocation failure). */
int moe_guess(df_engine *e, int layer, const float *x_resid, int T, int *used);

/* Prompt-sized lookahead: moe_guess, cut to the guesses worth reading. A wrong guess is bytes read for
 * nothing, so the most-voted guesses are kept while the expected wrong ones (by the precision measured for
 * their vote count on earlier layers: e->gs_made / gs_needed, prior 1 - 0.3 / votes) stay within DF_GUESS_WASTE of the
 * expected needed ones; the guess is remembered for scoring by the layer's own routing (moe_guess_score). */
int moe_guess_prompt(df_engine *e, int layer, const float *x_resid, int T, int *used);
/* Scores the remembered guess for `layer` against the experts its routing picked (count[x] > 0). */
void moe_guess_score(df_engine *e, int layer, const int *count);

/* 1 when one row's token can go from the final norm and lm_head to the next step's embedding on the device (the
 * backend's final_argmax / token_wait / embed_dev, its MLA block for layer 0, the final norm there, no streamed spine,
 * no attention residuals or output gate): forward with dev_token / argmax_on (df_decode_greedy). */
int eng_greedy_dev(const df_engine *e);
/* T tokens through every layer. logits: NULL, [vocab] (last position) or [T, vocab] when all_logits.
 * progress called per layer (what = "layers"). */
int forward(df_engine *e, df_kvcache *kv, int n_past, const int32_t *ids, int T, float *logits, int all_logits,
            int (*progress)(void *, const char *, uint64_t, uint64_t), void *user, char *err, size_t errlen);

/* Rows of n_seq sequences (seqs[i].T rows each, in order; distinct KV caches) through every layer in one
 * pass: per-row work and the experts over all rows, each mixer per sequence (forward.c). ids: [sum T].
 * logits: NULL, [n_seq, vocab] (the last row of each sequence) or [sum T, vocab] when all_logits. Each
 * sequence's logits and state equal those of forward() on it alone (batch-invariant kernels).
 * DF_EINVAL (a sequence without rows, a shared KV cache, an id outside the vocabulary), DF_ECONTEXT. */
int forward_batch(df_engine *e, const df_seq_rows *seqs, int n_seq, const int32_t *ids, float *logits, int all_logits,
                  int (*progress)(void *, const char *, uint64_t, uint64_t), void *user, char *err, size_t errlen);

/* Kimi Delta Attention for T tokens continuing the layer's recurrent state (kda.c).
 * h: [T, hidden] (input-normalized); out: [T, hidden]. Math: shared/notes/kimi-k3.md (KDA),
 * flash-linear-attention's naive recurrent form, one token after another (so any chunking of
 * a prompt gives bit-identical results). */
int kda_forward(df_engine *e, int layer, df_kvcache *kv, const float *h, int T, float *out, char *err, size_t errlen);

/* kda_forward for the rows of n_seq sequences (h, out: [sum T, hidden]): projections over all rows, the
 * short conv and the recurrence of each sequence on its own state. Each row's result equals kda_forward on
 * its sequence alone. */
int kda_forward_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out, char *err,
                      size_t errlen);
/* The CPU's KDA recurrence of head h of one sequence (df_kda_args, kernels/backend.h; the math in kernels/kda_math.h):
 * its T rows in order, the state a->S + h*K*K updated, q / k of the head normalized in place, o of the head written.
 * The reference the GPU's df_cuda_kda_recur is tested against (test_cuda_kernels). */
void kda_recur_head(const df_kda_args *a, int h);
/* KDA's short convolution of T rows (engine/kda.c): x [T, D] replaced by silu(sum_j w[c, j] x[t - (W-1) + j, c])
 * over [state (W-1 rows); x] (w [D, W]), state [W-1, D] replaced by the last W-1 rows of [state; x]; tmp holds
 * (W-1) x D floats; channels split over pool (NULL: this thread). */
void kda_short_conv(df_pool *pool, float *x, float *state, const float *w, int T, int D, int W, float *tmp);

/* The MLP activation of cfg->act applied in place: g[i] = act(g[i], u[i]) for n values
 * (SwiGLU: silu(g)*u; SiTU: beta*tanh(g/beta)*sigmoid(g) * (lb*tanh(u/lb) or u)). */
void eng_act(const df_engine *e, float *g, const float *u, int64_t n);

/* 1 when routed expert x of the layer is resident in device memory now (all three weights; an I/O hint: it may be
 * evicted later), asked without pinning it or counting a use (df_backend.dev_has); 0 on a backend without one (moe.c). */
int eng_dev_resident(const df_engine *e, int layer, int x);

/* What eng_preload held: experts of every MoE layer (total), those now in device memory, those in the host cache
 * only; the weight bytes read; stopped = 1 when the host cache filled before every expert had a place. */
typedef struct {
    int total, on_device, in_host, stopped;
    uint64_t bytes;
} eng_preload_result;
/* Read every routed expert into memory before the first token (preload.c): device memory first where the backend
 * has it (dev_load; nothing evicted), then the host cache, up to host_slots experts there. progress: what =
 * "preload", experts placed of total; non-zero cancels (DF_ECANCELLED). Errors: the source's (DF_EIO, DF_EFORMAT with
 * its message), DF_EIO when a copy into device memory fails. Never changes results. */
int eng_preload(df_engine *e, int host_slots, df_progress_fn progress, void *user, eng_preload_result *res, char *err,
                size_t errlen);

#endif
