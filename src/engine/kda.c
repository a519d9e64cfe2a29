/*
 * kda.c — Kimi Delta Attention (KDA), the linear-attention mixer of Kimi Linear
 * and Kimi K3. For T tokens of one layer, continuing the session's state:
 *   q, k, v = SiLU(causal depthwise conv_W(x W_{q,k,v}^T))  (zero left padding at
 *             position 0; the conv state carries the last W-1 projections)
 *   q, k    = per head x / sqrt(sum x^2 + 1e-6); q *= K^-0.5
 *   beta    = sigmoid(x W_b^T)                                  [heads]
 *   raw     = f_b(f_a(x)) + dt_bias                             [heads, K]
 *   g       = lb * sigmoid(exp(A_log[h]) * raw)   (gate_lower_bound lb given)
 *           = -exp(A_log[h]) * softplus(raw)       (otherwise)  (log-decay per key channel)
 *   per token, per head: S *= exp(g) (rows k); S += k (x) beta*(v - k^T S); o = q^T S
 *   o       = RMSNorm_K(o) * o_norm * act(g_proj(x))  (act = sigmoid, FusedRMSNormGated)
 *   out     = o_proj(o)
 * Sources: shared/notes/kimi-k3.md; Moonshot's modeling_kimi_linear.py (KimiDeltaAttention);
 * flash-linear-attention fla/ops/kda (naive recurrent form, gate with lower_bound), fla ShortConvolution.
 * The recurrence runs token after token in one fixed order per head (heads in parallel), so a
 * prompt evaluated at once, token by token or in any chunks gives bit-identical state and output.
 */
#include "engine.h"
#include "deltafin.h"
#include "kernels/kda_math.h"
#include "util/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { KDA_BE_MIN_T = 16 }; /* steps: rows of a sequence from which a lower-bound-gate recurrence runs on the backend's */
enum { KDA_BLOCK_ROWS = 1024 }; /* the most rows of one kda_block call (its device scratch grows with them) */

/* items: (sequence, head) pairs, i = sequence * H + head; each runs its sequence's rows in order */
typedef struct {
    const df_kda_args *a; /* per sequence */
    int H;
} kda_job;

/* One head's recurrence over the call's rows. Built for AVX-512, AVX2 and the baseline, chosen at load time: the
 * loops over columns vectorize, and every lane does the same IEEE operations in the same order as the baseline
 * (no contraction, kda.c is built with -ffp-contract=off; no reassociation), so each clone gives the same bits. */
__attribute__((target_clones("avx512f", "avx2", "default"))) void kda_recur_head(const df_kda_args *a, int h) {
    const int K = a->K, D = a->H * a->K;
    float kv_mem[K > 0 ? K : 1], decay[K > 0 ? K : 1];
    const float qscale = 1.0f / sqrtf((float)K), ea = df_expf(a->A_log[h]);
    float *S = a->S + h * (int64_t)K * K;
    for (int t = 0; t < a->T; t++) {
        float *q = a->q + (int64_t)t * D + h * K, *k = a->k + (int64_t)t * D + h * K;
        const float *v = a->v + (int64_t)t * D + h * K;
        const float beta = df_kda_prep(q, k, a->graw + (int64_t)t * D + h * K, a->dt_bias + h * K, ea, a->has_lb, a->lb,
                                       a->bl[(int64_t)t * a->H + h], qscale, K, decay);
        /* decay rows, then kv_mem = k^T S (rows ascending) */
        for (int i = 0; i < K; i++) kv_mem[i] = 0.0f;
        for (int r = 0; r < K; r++) {
            float *row = S + (int64_t)r * K;
            const float d = decay[r], kr = k[r];
            for (int c = 0; c < K; c++) {
                row[c] *= d;
                kv_mem[c] += row[c] * kr;
            }
        }
        for (int c = 0; c < K; c++) kv_mem[c] = beta * (v[c] - kv_mem[c]);
        float *o = a->o + (int64_t)t * D + h * K;
        for (int c = 0; c < K; c++) o[c] = 0.0f;
        for (int r = 0; r < K; r++) {
            float *row = S + (int64_t)r * K;
            const float kr = k[r], qr = q[r];
            for (int c = 0; c < K; c++) {
                row[c] += kr * kv_mem[c];
                o[c] += qr * row[c];
            }
        }
        df_kda_out(o, a->gate + (int64_t)t * D + h * K, a->o_norm, a->eps, a->silu_gate, K);
    }
}

static void head_task(void *ctx, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const kda_job *j = ctx;
    for (int64_t i = i0; i < i1; i++) kda_recur_head(&j->a[i / j->H], (int)(i % j->H));
}

/* out[t, c] = silu(sum_j w[c, j] * x[t - (W-1) + j, c]) over [state (W-1 rows); x (T rows)], in place: rows from
 * the last to the first, so a row's inputs before it are still the original x. Channels in parallel on the pool
 * (each output is the same expression whatever the split). */
typedef struct {
    float *x;
    const float *state, *w;
    int T, D, W;
} conv_job;

/* built per target like kda_recur_head (the same bits: a harness of kda_short_conv, default against the clones,
 * T x D x W = 1024 x 12288 x 4, 3 x 1000 x 4, 1 x 333 x 4, 17 x 256 x 1, 9 x 4096 x 6: identical output and state) */
__attribute__((target_clones("avx512f", "avx2", "default"))) static void conv_task(void *ctx, int64_t c0, int64_t c1,
                                                                                   int tid) {
    (void)tid;
    const conv_job *j = ctx;
    const int64_t D = j->D;
    const int P = j->W - 1;
    for (int t = j->T - 1; t >= 0; t--) {
        float *xo = j->x + (int64_t)t * D;
        if (t >= P) { /* every input a row of x */
            const float *xi = j->x + (int64_t)(t - P) * D;
            for (int64_t c = c0; c < c1; c++) {
                float s = 0.0f;
                for (int jj = 0; jj < j->W; jj++) s = DF_HM_ADD(s, DF_HM_MUL(j->w[c * j->W + jj], xi[(int64_t)jj * D + c]));
                xo[c] = df_kda_silu(s);
            }
        } else {
            for (int64_t c = c0; c < c1; c++) {
                float s = 0.0f;
                for (int jj = 0; jj < j->W; jj++) { /* row i of x; below 0, row P + i of the state */
                    const int i = t - P + jj;
                    s = DF_HM_ADD(s, DF_HM_MUL(j->w[c * j->W + jj],
                                               i >= 0 ? j->x[(int64_t)i * D + c] : j->state[(int64_t)(P + i) * D + c]));
                }
                xo[c] = df_kda_silu(s);
            }
        }
    }
}

void kda_short_conv(df_pool *pool, float *x, float *state, const float *w, int T, int D, int W, float *tmp) {
    const int P = W - 1;
    for (int r = 0; r < P; r++) { /* the new state: row T + r of [state; x] */
        const int i = T + r - P;
        memcpy(tmp + (int64_t)r * D, i >= 0 ? x + (int64_t)i * D : state + (int64_t)(P + i) * D, sizeof(float) * D);
    }
    conv_job j = {x, state, w, T, D, W};
    const int nt = df_pool_threads(pool);
    int64_t grain = (int64_t)T * D * W < 65536 ? D : (D + 4 * nt - 1) / (4 * nt);
    if (grain < 16) grain = 16;
    df_pool_run(pool, D, grain, conv_task, &j);
    memcpy(state, tmp, sizeof(float) * (size_t)P * D);
}

int kda_forward(df_engine *e, int layer, df_kvcache *kv, const float *h, int T, float *out, char *err, size_t errlen) {
    const df_seq_rows one = {kv, 0, T};
    return kda_forward_batch(e, layer, &one, 1, h, out, err, errlen);
}

/* The mixer step by step: projections, convolutions and o_proj with the backend's matmuls over all rows at once; the
 * recurrence on the backend (kda_recur) or the pool. */
static int kda_steps(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out, char *err,
                     size_t errlen) {
    const df_config *cfg = e->cfg;
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int H = cfg->kda_heads, K = cfg->kda_head_dim, D = H * K, W = cfg->kda_conv;
    int rc = DF_OK, T = 0;
    df_kda_args *args = NULL;
    int *row0 = malloc(sizeof(int) * (size_t)(n_seq > 0 ? n_seq : 1));
    if (!row0) {
        if (err) snprintf(err, errlen, "KDA layer %d: out of memory", layer);
        return DF_ENOMEM;
    }
    for (int s = 0; s < n_seq; s++) { row0[s] = T; T += seqs[s].T; }
    for (int s = 0; s < n_seq && rc == DF_OK; s++) /* the host's state current, and changed below */
        rc = kv_kda_host(seqs[s].kv, layer, 1, err, errlen);
    if (rc) goto done;
    /* q, k, v, graw, gate, o [T, D]; fa [T, K]; bl [T, H]; the convolution's next state [W-1, D]: in the engine's
     * buffer, reused call after call */
    const size_t need = (size_t)T * (6 * (size_t)D + (size_t)K + (size_t)H) + (size_t)(W - 1) * D;
    if (e->kda_cap < need) {
        float *nb = realloc(e->kda_buf, sizeof(float) * need);
        if (!nb) {
            rc = DF_ENOMEM;
            if (err) snprintf(err, errlen, "KDA layer %d: out of memory for %d tokens", layer, T);
            goto done;
        }
        e->kda_buf = nb;
        e->kda_cap = need;
    }
    float *q = e->kda_buf, *k = q + (size_t)T * D, *v = k + (size_t)T * D, *graw = v + (size_t)T * D,
          *gate = graw + (size_t)T * D, *o = gate + (size_t)T * D, *fa = o + (size_t)T * D, *bl = fa + (size_t)T * K, *ctmp = bl + (size_t)T * H;
    double t0 = df_now();
    eng_matmul(e, &lw->kda_q, h, T, q);
    eng_matmul(e, &lw->kda_k, h, T, k);
    eng_matmul(e, &lw->kda_v, h, T, v);
    e->phase_s[DF_PHASE_KDA_PROJ] += df_now() - t0;
    for (int s = 0; s < n_seq; s++) { /* each sequence's rows continue its own conv state */
        float *cs = seqs[s].kv->kda_conv[layer];
        const size_t P = (size_t)(W - 1) * D;
        const int64_t o = (int64_t)row0[s] * D;
        kda_short_conv(e->pool, q + o, cs, lw->conv_q, seqs[s].T, D, W, ctmp);
        kda_short_conv(e->pool, k + o, cs + P, lw->conv_k, seqs[s].T, D, W, ctmp);
        kda_short_conv(e->pool, v + o, cs + 2 * P, lw->conv_v, seqs[s].T, D, W, ctmp);
    }
    t0 = df_now();
    eng_matmul(e, &lw->f_a, h, T, fa);
    eng_matmul(e, &lw->f_b, fa, T, graw);
    eng_matmul(e, &lw->beta, h, T, bl);
    if (cfg->kda_full_rank_gate) {
        eng_matmul(e, &lw->g, h, T, gate);
    } else {
        eng_matmul(e, &lw->g_a, h, T, fa);
        eng_matmul(e, &lw->g_b, fa, T, gate);
    }
    e->phase_s[DF_PHASE_KDA_PROJ] += df_now() - t0;
    args = malloc(sizeof(df_kda_args) * (size_t)n_seq);
    if (!args) {
        rc = DF_ENOMEM;
        if (err) snprintf(err, errlen, "KDA layer %d: out of memory", layer);
        goto done;
    }
    for (int s = 0; s < n_seq; s++) {
        const int64_t r0 = (int64_t)row0[s];
        args[s] = (df_kda_args){H, K, seqs[s].T, q + r0 * D, k + r0 * D, v + r0 * D, graw + r0 * D, bl + r0 * H,
                                gate + r0 * D, lw->A_log, lw->dt_bias, lw->o_norm, cfg->kda_has_lower_bound,
                                cfg->kda_out_gate_act == DF_ACT_SILU, cfg->kda_lower_bound, cfg->rms_norm_eps,
                                seqs[s].kv->kda_S[layer], o + r0 * D};
    }
    /* On a backend with its own recurrence (the GPU), sequence by sequence: with a lower-bound gate (the CPU's bits
     * there) a prompt-sized sequence only (a one-row step costs more in copying the state than it computes); without
     * one (softplus's log1pf is each side's) every sequence, so that a row's bits do not depend on the call. The rest,
     * and any sequence the backend declines (nothing written), run on the pool. */
    int n_cpu = 0;
    for (int s = 0; s < n_seq; s++) {
        const int be = e->be->kda_recur && (!cfg->kda_has_lower_bound || seqs[s].T >= KDA_BE_MIN_T);
        if (!be || e->be->kda_recur(&args[s])) args[n_cpu++] = args[s];
    }
    if (n_cpu > 0) {
        kda_job j = {args, H};
        const int64_t items = (int64_t)n_cpu * H;
        const int64_t grain = (int64_t)T * K * K * H < 65536 ? items : 1;
        df_pool_run(e->pool, items, grain, head_task, &j);
    }
    t0 = df_now();
    eng_matmul(e, &lw->o, o, T, out);
    e->phase_s[DF_PHASE_KDA_PROJ] += df_now() - t0;
done:
    free(row0); free(args);
    return rc;
}

/* On a backend with its own whole mixer (the GPU's kda_block), the sequences in calls of up to DF_KDA_BLOCK_SEQS and
 * KDA_BLOCK_ROWS rows (the projections over all their rows): the same expressions as kda_steps, so the same bits; each state may stay in the
 * backend's device copy (df_kvcache.kda_dev), which every reader of the host's state fetches first (kv_kda_host). A
 * call that fails runs kda_steps for its sequences (their states as before the call). */
int kda_forward_batch(df_engine *e, int layer, const df_seq_rows *seqs, int n_seq, const float *h, float *out, char *err,
                      size_t errlen) {
    const df_config *cfg = e->cfg;
    if (!e->be->kda_block || !e->be->kda_recur || !e->be->kda_state)
        return kda_steps(e, layer, seqs, n_seq, h, out, err, errlen);
    const df_layer_weights *lw = &e->spine->layers[layer];
    const int full = cfg->kda_full_rank_gate;
    const df_kda_block b = {&lw->kda_q, &lw->kda_k, &lw->kda_v, &lw->f_a, &lw->f_b, &lw->beta, full ? &lw->g : NULL,
                            full ? NULL : &lw->g_a, full ? NULL : &lw->g_b, &lw->o, lw->conv_q, lw->conv_k, lw->conv_v,
                            lw->A_log, lw->dt_bias, lw->o_norm, cfg->kda_heads, cfg->kda_head_dim, cfg->kda_conv,
                            cfg->kda_has_lower_bound, cfg->kda_out_gate_act == DF_ACT_SILU, cfg->kda_lower_bound,
                            cfg->rms_norm_eps};
    const df_weight *ws[] = {b.q, b.k, b.v, b.f_a, b.f_b, b.beta, b.g, b.g_a, b.g_b, b.o};
    const int64_t Dm = lw->kda_q.cols, Do = lw->o.rows;
    int64_t r0 = 0;
    for (int s = 0, off = 0; s < n_seq;) {
        /* the next call: whole sequences (up to DF_KDA_BLOCK_SEQS) while their rows fit KDA_BLOCK_ROWS, or the next
         * KDA_BLOCK_ROWS rows of one longer sequence (its later rows in the calls after: the state carries over) */
        df_seq_rows part[DF_KDA_BLOCK_SEQS];
        int Ts[DF_KDA_BLOCK_SEQS], n = 0, T = 0;
        uint64_t key[DF_KDA_BLOCK_SEQS];
        float *conv[DF_KDA_BLOCK_SEQS], *S[DF_KDA_BLOCK_SEQS];
        unsigned char kept[DF_KDA_BLOCK_SEQS];
        while (s < n_seq && n < DF_KDA_BLOCK_SEQS) {
            const int left = seqs[s].T - off;
            if (n > 0 && T + left > KDA_BLOCK_ROWS) break;
            const int take = left < KDA_BLOCK_ROWS ? left : KDA_BLOCK_ROWS;
            df_kvcache *kv = seqs[s].kv;
            if (kv->kda_be && kv->kda_be != e->be) { /* another backend's copies (not expected: one engine per
                                                        * cache): every layer's back to the host, then forgotten */
                for (int l = 0; l < kv->n_layers; l++) {
                    const int rc = kv_kda_host(kv, l, 1, err, errlen);
                    if (rc) return rc;
                }
                kv->kda_be = NULL;
            }
            part[n] = (df_seq_rows){kv, seqs[s].n_past + off, take};
            Ts[n] = take;
            key[n] = kv_layer_key(kv, layer);
            conv[n] = kv->kda_conv[layer];
            S[n] = kv->kda_S[layer];
            n++;
            T += take;
            off += take;
            if (off < seqs[s].T) break;
            s++;
            off = 0;
        }
        const float *hs = h + r0 * Dm;
        float *os = out + r0 * Do;
        if (e->be->kda_block(&b, n, Ts, hs, key, conv, S, os, kept) == 0) {
            for (int i = 0; i < n; i++)
                if (kept[i]) {
                    part[i].kv->kda_be = e->be;
                    part[i].kv->kda_dev[layer] |= KV_KDA_COPY | KV_KDA_NEWER; /* a snapshot mark stays */
                }
            for (size_t i = 0; i < sizeof ws / sizeof *ws; i++)
                if (ws[i]) e->weight_bytes += df_weight_bytes(ws[i]);
        } else {
            const int rc = kda_steps(e, layer, part, n, hs, os, err, errlen);
            if (rc) return rc;
        }
        r0 += T;
    }
    return DF_OK;
}
