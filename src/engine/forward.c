/*
 * forward.c — T tokens through the whole model, one pass over the per-layer
 * description (df_config: mixer per layer, FFN kind, activation, residual kind):
 *   x = embed(ids); per layer: x += mixer(RMSNorm(x)); x += FFN(RMSNorm(x));
 *   logits = lm_head(RMSNorm(x)) for the last (or every) position.
 * mixer: MLA (attention.c) or KDA (kda.c); FFN: dense MLP, MoE or latent MoE (moe.c).
 * Block attention residuals (AttnRes, attn_res_block B > 0; Moonshot's
 * KimiDecoderLayer._forward_attn_residual and _apply_attn_res): per token a list of
 * block vectors and a running prefix p (= the layer input). The mixer input is
 * mix(blocks, p) once a block exists; at layers l % B == 0 p is pushed as a block and
 * restarts at zero; p += mixer out; the FFN input is mix(blocks, p); p += FFN out.
 * After the last layer the output mix (output_attn_res_*) gives the final norm's input.
 *   mix(v_0..v_n) = sum_i softmax_i(<v_i * rsqrt(mean(v_i^2) + eps), norm.w * proj.w>) v_i
 * On a backend with mla_block (cuda) and a model without AttnRes or an output gate, an MLA layer's mixer, its
 * residual, the FFN's norm and the router's logits are one backend call (attention.c attn_block_batch).
 * Batches (forward_batch): rows of several sequences in one pass; every per-row step (embedding, norms,
 * AttnRes, router, experts, lm_head, MLA projections) runs over all rows at once, so each expert a layer
 * needs is read once for the batch, while each row attends to its own sequence's KV cache at its own
 * position (MLA) or continues its own sequence's recurrent state (KDA).
 * The kernels give each row the same bits whatever the other rows, so a sequence's logits equal those of
 * evaluating it alone.
 * Also the weight-byte-counting matmul wrapper.
 */
#include "engine.h"
#include "deltafin.h"
#include "spine_stream.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Router lookahead prefetch runs for calls of at most PREFETCH_MAX_T rows, and for decode batches (one row
 * per sequence) of at most PREFETCH_MAX_SEQ sequences. */
enum { PREFETCH_MAX_T = 4, PREFETCH_MAX_SEQ = 16 };

/* The decode lookahead's live A/B gate. Reading guesses ahead hides compute behind the drive, but a wrong
 * guess costs a read (and a slot, and CPU time on small machines) for nothing; which wins depends on the
 * machine, the budget and the routing. So decode steps (calls of the lookahead's size) of one size (rows per
 * call) are timed per row, PF_WINDOW with the lookahead on and PF_WINDOW off, in the order on, off, off, on
 * (blocks of PF_WINDOW / 2 steps: a trend over the steps, such as a cache warming up or a context growing, weighs
 * on both arms alike); the faster (off only when it is 3% faster) runs for an exploit period (PF_EXPLOIT_MIN
 * steps, doubled each time the same arm wins again, at most PF_EXPLOIT_MAX), then both are measured again.
 * Never changes numerics. */
enum { PF_WINDOW = 8, PF_EXPLOIT_MIN = 32, PF_EXPLOIT_MAX = 512 };
static const int pf_order[4] = {0, 1, 1, 0}; /* the arm of each block of PF_WINDOW / 2 measured steps */

static void pf_measure_restart(df_engine *e) { /* measure both arms from the start, on first */
    e->pf_measuring = 1;
    e->pf_arm = e->pf_n = 0;
    e->pf_mrows = 0;
    e->pf_sum[0] = e->pf_sum[1] = 0;
    e->pf_rows[0] = e->pf_rows[1] = 0;
}

static void pf_gate_record(df_engine *e, double dt, int rows) {
    e->pf_steps[e->pf_arm]++;
    if (!e->pf_measuring) {
        if (--e->pf_left <= 0) pf_measure_restart(e);
        return;
    }
    /* A step's time per row depends on the rows of the call (a decode batch of 4 costs far less per row than one
     * row; a speculative verification is not a plain step): the arms are compared on steps of one size only. A
     * step of another size restarts the measurement (not counted: it may have run with the other arm), so a
     * workload whose step size keeps changing stays on the lookahead (arm 0) until it settles. */
    if (!e->pf_mrows) e->pf_mrows = rows;
    else if (rows != e->pf_mrows) {
        pf_measure_restart(e);
        return;
    }
    e->pf_sum[e->pf_arm] += dt;
    e->pf_rows[e->pf_arm] += (uint64_t)rows;
    if (++e->pf_n < 2 * PF_WINDOW) {
        e->pf_arm = pf_order[e->pf_n / (PF_WINDOW / 2)];
        return;
    }
    e->pf_n = 0;
    const double t_on = e->pf_sum[0] / (double)e->pf_rows[0], t_off = e->pf_sum[1] / (double)e->pf_rows[1];
    const int best = t_off < 0.97 * t_on;
    e->pf_exploit = e->pf_exploit && best == e->pf_best ? (2 * e->pf_exploit < PF_EXPLOIT_MAX ? 2 * e->pf_exploit : PF_EXPLOIT_MAX)
                                                        : PF_EXPLOIT_MIN;
    e->pf_best = e->pf_arm = best;
    e->pf_left = e->pf_exploit;
    e->pf_measuring = 0;
}

int eng_tick(df_engine *e) {
    return e->progress &&
           e->progress(e->progress_user, "layers", (uint64_t)e->progress_layers, (uint64_t)e->cfg->num_hidden_layers);
}

int eng_cancelled(int layer, char *err, size_t errlen) {
    if (err) snprintf(err, errlen, "evaluation cancelled in layer %d", layer);
    return DF_ECANCELLED;
}

void eng_matmul(df_engine *e, const df_weight *w, const float *x, int T, float *y) {
    e->be->matmul(e->pool, w, x, T, y);
    e->weight_bytes += df_weight_bytes(w);
}

/* Row-wise steps of T rows over the pool: each row's result depends on that row only, so any split gives the same
 * bits; small calls (a decode step) run on this thread. */
enum { ROWS_PAR_MIN = 1 << 16 }; /* floats of work below which a step stays on this thread */
typedef struct {
    const df_engine *e;
    float *out;
    const float *in, *w, *blocks, *proj_w;
    int D, nb, nbmax;
    float eps;
} rows_job;

/* items per pool chunk of n items: ~4 chunks per thread */
static int64_t rows_grain(const df_engine *e, int64_t n) {
    const int nt = df_pool_threads(e->pool);
    const int64_t g = (n + 4 * (int64_t)nt - 1) / (4 * (int64_t)nt);
    return g < 1 ? 1 : g;
}

static void norm_task(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) j->e->be->rmsnorm(j->out + t * j->D, j->in + t * j->D, j->w, j->D, j->eps);
}

/* out[t] = RMSNorm(in[t]) * w for T rows of D (the backend's rmsnorm) */
static void norm_rows(const df_engine *e, float *out, const float *in, const float *w, int T, int D, float eps) {
    rows_job j = {e, out, in, w, NULL, NULL, D, 0, 0, eps};
    df_pool_run(e->pool, T, (int64_t)T * D < ROWS_PAR_MIN ? T : rows_grain(e, T), norm_task, &j);
}

static void add_task(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) j->out[i] += j->in[i];
}

/* x += a over n floats */
static void add_rows(const df_engine *e, float *x, const float *a, int64_t n) {
    rows_job j = {e, x, a, NULL, NULL, NULL, 0, 0, 0, 0.0f};
    df_pool_run(e->pool, n, n < ROWS_PAR_MIN ? n : rows_grain(e, n), add_task, &j);
}

/* AttnRes mix for T tokens: out[t] = softmax-weighted sum of blocks[t][0..nb) and p[t] (see above). */
static void attn_res_mix(float *out, const float *blocks, int nb, int nbmax, const float *p, const float *norm_w,
                         const float *proj_w, int T, int D, float eps) {
    float sc[DF_MAX_LAYERS + 2];
    for (int t = 0; t < T; t++) {
        const float *pt = p + (int64_t)t * D;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? blocks + ((int64_t)t * nbmax + i) * D : pt;
            float ss = 0.0f, dot = 0.0f;
            for (int d = 0; d < D; d++) ss += v[d] * v[d];
            const float r = 1.0f / sqrtf(ss / (float)D + eps);
            for (int d = 0; d < D; d++) dot += v[d] * r * (norm_w[d] * proj_w[d]);
            sc[i] = dot;
        }
        float mx = sc[0];
        for (int i = 1; i <= nb; i++) if (sc[i] > mx) mx = sc[i];
        float sum = 0.0f;
        for (int i = 0; i <= nb; i++) { sc[i] = expf(sc[i] - mx); sum += sc[i]; }
        float *o = out + (int64_t)t * D;
        for (int d = 0; d < D; d++) o[d] = 0.0f;
        for (int i = 0; i <= nb; i++) {
            const float *v = i < nb ? blocks + ((int64_t)t * nbmax + i) * D : pt;
            const float w = sc[i] / sum;
            for (int d = 0; d < D; d++) o[d] += w * v[d];
        }
    }
}

static void mix_task(void *ctx, int64_t t0, int64_t t1, int tid) {
    (void)tid;
    const rows_job *j = ctx;
    attn_res_mix(j->out + t0 * j->D, j->blocks + t0 * j->nbmax * j->D, j->nb, j->nbmax, j->in + t0 * j->D, j->w,
                 j->proj_w, (int)(t1 - t0), j->D, j->eps);
}

/* attn_res_mix over the pool, rows split */
static void attn_res_mix_rows(const df_engine *e, float *out, const float *blocks, int nb, int nbmax, const float *p,
                              const float *norm_w, const float *proj_w, int T, int D, float eps) {
    rows_job j = {e, out, p, norm_w, blocks, proj_w, D, nb, nbmax, eps};
    df_pool_run(e->pool, T, (int64_t)T * D * (nb + 1) < ROWS_PAR_MIN ? T : rows_grain(e, T), mix_task, &j);
}

int eng_greedy_dev(const df_engine *e) {
    const df_config *cfg = e->cfg;
    return e->be->final_argmax && e->be->token_wait && e->be->embed_dev && e->be->mla_block && e->be->final_logits &&
           !e->stream && cfg->attn_res_block == 0 && !cfg->mla_output_gate && cfg->num_hidden_layers > 0 &&
           cfg->mixer[0] == DF_MIXER_MLA;
}

int forward(df_engine *e, df_kvcache *kv, int n_past, const int32_t *ids, int T, float *logits, int all_logits,
            int (*progress)(void *, const char *, uint64_t, uint64_t), void *user, char *err, size_t errlen) {
    if (T <= 0) return DF_OK;
    const df_seq_rows one = {kv, n_past, T};
    return forward_batch(e, &one, 1, ids, logits, all_logits, progress, user, err, errlen);
}

int forward_batch(df_engine *e, const df_seq_rows *seqs, int n_seq, const int32_t *ids, float *logits, int all_logits,
                  int (*progress)(void *, const char *, uint64_t, uint64_t), void *user, char *err, size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_spine *sp = e->spine;
    const int D = cfg->hidden_size, L = cfg->num_hidden_layers;
    int T = 0, decode_batch = n_seq <= PREFETCH_MAX_SEQ;
    for (int s = 0; s < n_seq; s++) {
        if (seqs[s].T <= 0) {
            if (err) snprintf(err, errlen, "sequence %d of the batch has %d rows (at least 1)", s, seqs[s].T);
            return DF_EINVAL;
        }
        if (seqs[s].n_past + seqs[s].T > seqs[s].kv->n_ctx) {
            if (err) snprintf(err, errlen, "context full: %d + %d tokens exceed the session's %d positions",
                              seqs[s].n_past, seqs[s].T, seqs[s].kv->n_ctx);
            return DF_ECONTEXT;
        }
        for (int s2 = 0; s2 < s; s2++)
            if (seqs[s2].kv == seqs[s].kv) {
                if (err) snprintf(err, errlen, "sequences %d and %d of the batch share one KV cache", s2, s);
                return DF_EINVAL;
            }
        decode_batch &= seqs[s].T == 1;
        T += seqs[s].T;
    }
    if (T <= 0) return DF_OK;
    const int dev_token = e->dev_token;
    if ((dev_token || e->argmax_on) && (T != 1 || n_seq != 1 || !eng_greedy_dev(e))) {
        if (err) snprintf(err, errlen, "forward: a token chosen on the GPU needs one row through an MLA block there");
        return DF_EUNSUPPORTED;
    }
    for (int t = 0; t < T && !dev_token; t++)
        if (ids[t] < 0 || ids[t] >= sp->embed.rows) {
            if (err) snprintf(err, errlen, "token id %d at index %d is outside the vocabulary [0, %lld)", ids[t], t,
                              (long long)sp->embed.rows);
            return DF_EINVAL;
        }
    int rc = DF_OK;
    const int B = cfg->attn_res_block, nbmax = B > 0 ? (L + B - 1) / B + 1 : 0;
    int nb = 0;
    float *x = malloc(sizeof(float) * (size_t)T * D), *h = malloc(sizeof(float) * (size_t)T * D),
          *a = malloc(sizeof(float) * (size_t)T * D);
    float *blocks = B > 0 ? malloc(sizeof(float) * (size_t)T * nbmax * D) : NULL;
    float *mx = B > 0 ? malloc(sizeof(float) * (size_t)T * D) : NULL;
    /* layers whose MLA mixer, residual, FFN norm and router run as one backend call (mla_block): a model without
     * attention residuals or an output gate */
    const int use_block = e->be->mla_block && B == 0 && !cfg->mla_output_gate;
    float *rlog = use_block && cfg->n_routed_experts > 0 ? malloc(sizeof(float) * (size_t)T * cfg->n_routed_experts) : NULL;
    if (!x || !h || !a || (B > 0 && (!blocks || !mx)) || (use_block && cfg->n_routed_experts > 0 && !rlog)) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "forward: out of memory for %d tokens", T);
        goto done;
    }
    e->progress = progress;
    e->progress_user = user;
    e->progress_layers = 0;
    e->x_dev = e->defer_ok = e->ffn_deferred = e->sh_early = e->moe_dev = e->moe_queued = 0;
    if (e->stream) sst_start(e->stream, sst_first_streamed(e->stream)); /* usually already read after the last call */
    /* a decode step: the lookahead runs when the gate's arm says so (always when ungated) */
    const int dstep = e->prefetch && (T <= PREFETCH_MAX_T || decode_batch);
    const int pf_on = dstep && (e->prefetch_ungated || e->pf_arm == 0);
    const double t_call = df_now();
    double lap = t_call;
#define LAP(ph) do { double n_ = df_now(); e->phase_s[ph] += n_ - lap; lap = n_; } while (0)
    if (dev_token) { /* the row on the device from its token slot: the first block reads it there */
        memset(x, 0, sizeof(float) * (size_t)D); /* what host-side guesses (the lookahead) would read */
        if (e->be->embed_dev((uint64_t)(uintptr_t)e, &sp->embed)) {
            rc = DF_EUNSUPPORTED;
            if (err) snprintf(err, errlen, "the embedding row failed on the GPU");
            goto done;
        }
        e->x_dev = 1;
    } else {
        for (int t = 0; t < T; t++) e->be->decode_row(&sp->embed, ids[t], x + (int64_t)t * D);
    }
    LAP(DF_PHASE_EMBED);
    e->weight_bytes += df_weight_bytes(&sp->embed) / (uint64_t)sp->embed.rows * (uint64_t)T;
    for (int l = 0; l < L; l++) {
        if (e->stream) {
            /* streamed layer: wait for its staging buffer, then read layer l+1 into the other one meanwhile */
            rc = sst_layer(e->stream, l, &e->io_wait_s, err, errlen);
            if (rc) goto done;
            if (l + 1 < L) sst_start(e->stream, l + 1);
        }
        LAP(DF_PHASE_IO_WAIT);
        const df_layer_weights *lw = &sp->layers[l];
        const int block = use_block && cfg->mixer[l] == DF_MIXER_MLA;
        /* a decode step's FFN may stay on the device when what follows continues from there: the next layer's block,
         * or after the last layer the final norm and lm_head (final_logits). Not with a streamed spine: the shared
         * expert's host copy is a staging buffer the next reads reuse while the queued upload may still read it. */
        const int next_dev = l + 1 < L ? cfg->mixer[l + 1] == DF_MIXER_MLA : logits != NULL && e->be->final_logits != NULL;
        const int stay = block && T == 1 && n_seq == 1 && next_dev && e->be->moe_resid && D % 16 == 0 && !e->stream;
        const int defer = stay && lw->is_moe; /* ffn_forward's moe_resid path */
        /* the block may route and run the MoE itself (every routed expert resident on the device), or a dense layer's
         * MLP; then it starts the shared expert (the dense MLP) before it returns */
        e->moe_dev = stay && (!lw->is_moe || cfg->latent_dim == 0) && e->be->moe_routed != NULL;
        e->sh_early = lw->is_moe ? defer && lw->has_shared && cfg->latent_dim == 0 : e->moe_dev;
        e->moe_queued = 0;
        if (block) { /* x += mixer(RMSNorm(x)); h = RMSNorm(x) for the FFN; the router's logits */
            rc = attn_block_batch(e, l, seqs, n_seq, x, h, lw->is_moe ? rlog : NULL, err, errlen);
            LAP(DF_PHASE_MLA);
            if (rc) goto done;
        }
        const float *ain = x;
        int restart = 0;
        if (B > 0) {
            if (nb > 0) {
                attn_res_mix_rows(e, mx, blocks, nb, nbmax, x, lw->attn_res_norm, lw->attn_res_proj, T, D, cfg->rms_norm_eps);
                ain = mx;
            }
            if (l % B == 0) { /* the prefix becomes a block; the next prefix starts at the mixer output */
                for (int t = 0; t < T; t++)
                    memcpy(blocks + ((int64_t)t * nbmax + nb) * D, x + (int64_t)t * D, sizeof(float) * D);
                nb++;
                restart = 1;
            }
        }
        if (!block) {
            norm_rows(e, h, ain, lw->attn_norm, T, D, cfg->rms_norm_eps);
            LAP(DF_PHASE_NORM);
            /* projections over all rows at once; each row attends to its own sequence's KV cache (MLA) or
             * continues its own sequence's recurrent state (KDA) */
            const double kp0 = e->phase_s[DF_PHASE_KDA_PROJ]; /* kda_steps times its projections there */
            if (cfg->mixer[l] == DF_MIXER_KDA) rc = kda_forward_batch(e, l, seqs, n_seq, h, a, err, errlen);
            else rc = attn_forward_batch(e, l, seqs, n_seq, h, a, err, errlen);
            lap += e->phase_s[DF_PHASE_KDA_PROJ] - kp0;
            LAP(cfg->mixer[l] == DF_MIXER_KDA ? DF_PHASE_KDA : DF_PHASE_MLA);
            if (rc) goto done;
            if (restart) memcpy(x, a, sizeof(float) * (size_t)T * D);
            else add_rows(e, x, a, (int64_t)T * D);
        }
        /* lookahead prefetch of layer l+1, decode-sized calls (one sequence or a decode batch): the guesses
         * go out now, before layer l's FFN */
        if (pf_on && l + 1 < L) {
            /* the router of a streamed layer l+1 is in its staging buffer (read since layer l began) */
            if (e->stream && (rc = sst_layer(e->stream, l + 1, &e->io_wait_s, err, errlen))) goto done;
            LAP(DF_PHASE_NORM);
            moe_prefetch(e, l + 1, x, T, 0);
            LAP(DF_PHASE_PREFETCH);
        }
        /* prompt-sized calls: a prompt's union of guesses is most of a layer, so they must not take slots
         * layer l still needs: ffn_forward guesses layer l+1's experts from x once layer l's own reads are
         * queued (behind them, into slots nothing pending or unused holds; see ffn_forward). Not for a
         * streamed layer l+1: its router arrives with its staging read, and waiting for that here would hold
         * back layer l's own reads. */
        e->la_x = NULL;
        if (e->prefetch_prompt && T > PREFETCH_MAX_T && l + 1 < L && sp->layers[l + 1].is_moe &&
            (!e->stream || l + 1 < sst_first_streamed(e->stream))) {
            if (sp->layers[l].is_moe) {
                e->la_x = x;
                e->la_layer = l + 1;
            } else { /* a dense layer reads no experts: the guesses go out now, read during its MLP (when
                      * they fit the cache: else layer l+1's own set would evict them) */
                int *g = malloc(sizeof(int) * (size_t)cfg->n_routed_experts);
                const int ng = g ? moe_guess_prompt(e, l + 1, x, T, g) : 0;
                if (ng > 0 && ng <= (e->max_acquire > 0 ? e->max_acquire : cfg->num_experts_per_tok)) {
                    e->experts.request(e->experts.ctx, l + 1, g, ng, STORE_PREFETCH);
                    e->prefetch_issued += (uint64_t)ng;
                }
                free(g);
                LAP(DF_PHASE_PREFETCH);
            }
        }
        if (!block) {
            const float *fin = x;
            if (B > 0) {
                attn_res_mix_rows(e, mx, blocks, nb, nbmax, x, lw->mlp_res_norm, lw->mlp_res_proj, T, D, cfg->rms_norm_eps);
                fin = mx;
            }
            norm_rows(e, h, fin, lw->ffn_norm, T, D, cfg->rms_norm_eps);
            LAP(DF_PHASE_NORM);
        }
        {
            const double io0 = e->io_wait_s, r0 = e->phase_s[DF_PHASE_ROUTER];
            e->ffn_logits = block && lw->is_moe ? rlog : NULL;
            e->defer_ok = defer;
            e->ffn_deferred = 0;
            rc = ffn_forward(e, l, h, T, a, err, errlen);
            e->ffn_logits = NULL;
            e->defer_ok = 0;
            e->la_x = NULL;
            const double now = df_now(), dio = e->io_wait_s - io0, dr = e->phase_s[DF_PHASE_ROUTER] - r0;
            e->phase_s[lw->is_moe ? DF_PHASE_EXPERTS : DF_PHASE_DENSE] += now - lap - dio - dr;
            e->phase_s[DF_PHASE_IO_WAIT] += dio;
            lap = now;
        }
        if (rc) goto done;
        if (e->ffn_deferred) e->x_dev = 1; /* x += a happened on the device; the next block reads it there */
        else add_rows(e, x, a, (int64_t)T * D);
        e->progress_layers = l + 1;
        if (progress && progress(user, "layers", (uint64_t)l + 1, (uint64_t)L)) {
            rc = DF_ECANCELLED;
            if (err) snprintf(err, errlen, "evaluation cancelled at layer %d", l);
            goto done;
        }
    }
    if (logits) {
        /* the rows that need logits: every row, or the last row of each sequence; with the backend's final_logits
         * the final norm and lm_head run there (from its residual row when the last FFN stayed on the device) */
        const int dev = B == 0 && e->be->final_logits;
        int n = 0;
        for (int s = 0, r0 = 0; s < n_seq && !e->x_dev; r0 += seqs[s].T, s++)
            for (int t = all_logits ? r0 : r0 + seqs[s].T - 1; t < r0 + seqs[s].T; t++, n++) {
                const float *xr = x + (int64_t)t * D;
                if (dev) {
                    memcpy(h + (int64_t)n * D, xr, sizeof(float) * D);
                    continue;
                }
                if (B > 0) { /* output attention residual */
                    attn_res_mix(mx + (int64_t)n * D, blocks + (int64_t)t * nbmax * D, nb, nbmax, xr, sp->out_res_norm,
                                 sp->out_res_proj, 1, D, cfg->rms_norm_eps);
                    xr = mx + (int64_t)n * D;
                }
                e->be->rmsnorm(h + (int64_t)n * D, xr, sp->final_norm, D, cfg->rms_norm_eps);
            }
        if (dev && e->argmax_on) { /* the token chosen on the device, read back later (df_decode_greedy) */
            if (e->be->final_argmax(e->x_dev ? NULL : h, (uint64_t)(uintptr_t)e, sp->final_norm, cfg->rms_norm_eps,
                                    &sp->lm_head, e->argmax_slot)) {
                rc = DF_EUNSUPPORTED;
                if (err) snprintf(err, errlen, "the final norm, lm_head and argmax failed on the GPU");
                goto done;
            }
            e->x_dev = 0;
            e->weight_bytes += df_weight_bytes(&sp->lm_head);
        } else if (dev) {
            if (e->be->final_logits(e->x_dev ? NULL : h, e->x_dev ? 1 : n, (uint64_t)(uintptr_t)e, sp->final_norm,
                                    cfg->rms_norm_eps, &sp->lm_head, logits)) {
                rc = DF_EUNSUPPORTED;
                if (err) snprintf(err, errlen, "the final norm and lm_head failed on the GPU");
                goto done;
            }
            e->x_dev = 0;
            e->weight_bytes += df_weight_bytes(&sp->lm_head);
        } else {
            LAP(DF_PHASE_NORM);
            eng_matmul(e, &sp->lm_head, h, n, logits);
        }
        LAP(DF_PHASE_LM_HEAD);
    }
#undef LAP
    eng_moe_settle(e);
    if (dstep) {
        if (e->prefetch_ungated) e->pf_steps[0]++;
        else pf_gate_record(e, df_now() - t_call, T);
    }
done:
    e->la_x = NULL; /* x is freed below */
    e->progress = NULL;
    e->x_dev = e->defer_ok = e->ffn_deferred = e->sh_early = e->moe_dev = e->moe_queued = 0;
    /* the next call's first streamed layer is read while the caller samples */
    if (e->stream) sst_start(e->stream, sst_first_streamed(e->stream));
    free(x);
    free(h);
    free(a);
    free(blocks);
    free(mx);
    free(rlog);
    return rc;
}
