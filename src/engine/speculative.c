/*
 * speculative.c — speculative decoding over a target session (deltafin.h df_spec_*).
 * One step: the drafter proposes d1..dk after the history (session tokens + cur);
 * [cur, d1..dk] go through the target in one df_eval with all logits (each routed
 * expert read once per layer for the k+1 rows); then, in order, the caller's sampler
 * picks y_i from row i's logits, y_i is emitted, and the step goes on only while
 * y_i == d_{i+1}; after k matches y_k (the bonus token) ends the step. The session
 * is truncated to cur + the accepted drafts (KV rows past it are dropped; recurrent
 * state rolls back to the DF_EVAL_MARK snapshot and the kept tokens are re-evaluated
 * in front of the next call: exact, never approximate).
 *
 * Exactness: the kernels are batch-invariant (row i's logits are bit-identical to a
 * one-token eval at that position) and the sampler draws once per emitted token in
 * emission order, so the output equals plain decoding with the same sampler: greedy
 * byte-identical, seeded sampling the same sample. For a deterministic draft (point
 * mass q at d) this is the speculative-sampling rule of Leviathan et al. 2023 /
 * Chen et al. 2023: P(accept d) = p(d) = min(1, p(d)/q(d)); on rejection y ~ p
 * restricted to y != d, renormalised = norm(max(0, p - q)).
 *
 * Gating: verifying k rows routes to more distinct experts, which can cost more than
 * it saves on a storage-bound model. Generated tokens per second are measured live
 * (wall time of drafting + verification + sampling) with drafting and without it
 * (WARMUP plain tokens, then a plain probe of PROBE_WINDOW tokens, then again after 1, 2, 4 and then every
 * PROBE_EVERY windows: the first rates include the warm-up of caches);
 * when drafting is slower over at least MIN_WINDOW tokens with at least one verification, or clearly slower (under
 * EARLY_RATIO of the plain rate) after EARLY_CALLS verifications, it is switched off
 * for `retry` tokens (x2 each time it fails again, up to 16x) and then tried again, so
 * a drafter that never pays costs a few verifications per retry period. k adapts: it doubles
 * after a fully accepted draft and becomes the accepted length + 1 after a rejection.
 */
#define _GNU_SOURCE
#include "deltafin.h"
#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { WARMUP = 16, MIN_WINDOW = 16, EARLY_CALLS = 2, PROBE_WINDOW = 8, PROBE_EVERY = 8, BACKOFF_MAX = 16, K_START = 2,
       SHADOW_WINDOW = 16 };
#define SHADOW_RATIO 0.75 /* a cheap drafter off by the gate: back on when its one-token guesses matched this share
                             of SHADOW_WINDOW plain tokens */
#define EARLY_RATIO 0.7 /* after EARLY_CALLS verifications: off at once when below this share of the plain rate */

typedef enum { G_PROBE = 0, G_SPEC, G_OFF } gate_mode;

struct df_spec {
    df_session *s;
    df_drafter *d;
    df_sampler *smp;
    df_spec_opts o;
    int n_vocab;
    float *logits;           /* [(k_max + 1) * n_vocab] */
    int32_t *batch;          /* [k_max + 1]: cur + drafts */
    float *q;                /* [k_max, n_vocab]: draft distributions of a stochastic drafter */
    float *p;                /* [n_vocab]: the target's distribution at one row */
    int32_t *hist;           /* session tokens + cur, for the drafter */
    int hist_cap;
    int k;
    df_spec_stats st;
    gate_mode mode;
    int win_tokens;          /* tokens in the current window */
    int win_calls;           /* verifications in it */
    double win_s;            /* its wall time */
    int off_left;            /* G_OFF: plain tokens before drafting is tried again */
    int backoff;
    int spec_windows;        /* full G_SPEC windows since the last plain probe */
    int probe_every;         /* windows between plain probes: 1, 2, 4 .. PROBE_EVERY (early rates are warm-up) */
    int sh_n, sh_hit;        /* G_OFF with a cheap drafter: plain tokens seen, and how many its guess matched */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int set_err(char *err, size_t errlen, int code, const char *msg) {
    if (err && errlen) snprintf(err, errlen, "%s", msg);
    return code;
}

void df_spec_opts_default(df_spec_opts *o) {
    memset(o, 0, sizeof *o);
    o->k_max = 8;
    o->adaptive = 1;
    o->gate = 1;
    o->window = 32;
    o->retry = 256;
}

int df_spec_new(df_spec **out, df_session *target, df_drafter *d, df_sampler *smp, const df_spec_opts *opts, char *err,
                size_t errlen) {
    *out = NULL;
    if (!target || !smp) return set_err(err, errlen, DF_EINVAL, "df_spec_new: no target session or sampler");
    df_spec_opts o;
    if (opts) o = *opts; else df_spec_opts_default(&o);
    if (o.k_max < 1 || o.k_max > 64) {
        if (err && errlen) snprintf(err, errlen, "draft length %d: expected 1..64", o.k_max);
        return DF_EINVAL;
    }
    if (o.window < MIN_WINDOW) o.window = MIN_WINDOW;
    if (o.retry < 1) o.retry = 1;
    df_spec *g = calloc(1, sizeof *g);
    if (!g) return set_err(err, errlen, DF_ENOMEM, "out of memory");
    g->s = target;
    g->d = d;
    g->smp = smp;
    g->o = o;
    /* the vocabulary is the target model's: the sampler picks among n_vocab logits */
    g->n_vocab = df_model_n_vocab(df_session_model(target));
    if (d && d->n_vocab && d->n_vocab != g->n_vocab) {
        if (err && errlen)
            snprintf(err, errlen, "the draft model's vocabulary has %d tokens, the target's %d: a draft model must use the target's "
                                  "tokenizer (or draft through re-tokenization)", d->n_vocab, g->n_vocab);
        free(g);
        return DF_EINVAL;
    }
    g->logits = malloc(sizeof(float) * (size_t)(o.k_max + 1) * g->n_vocab);
    g->batch = malloc(sizeof(int32_t) * (size_t)(o.k_max + 1));
    if (d && d->stochastic) {
        g->q = malloc(sizeof(float) * (size_t)o.k_max * g->n_vocab);
        g->p = malloc(sizeof(float) * (size_t)g->n_vocab);
        if (!g->q || !g->p) { df_spec_free(g); return set_err(err, errlen, DF_ENOMEM, "out of memory"); }
    }
    if (!g->logits || !g->batch) { df_spec_free(g); return set_err(err, errlen, DF_ENOMEM, "out of memory"); }
    g->k = o.adaptive ? (o.k_max < K_START ? o.k_max : K_START) : o.k_max; /* a short first trial: k grows by doubling */
    g->mode = d ? (o.gate ? G_PROBE : G_SPEC) : G_OFF;
    g->off_left = 0;
    g->backoff = 1;
    g->probe_every = 1;
    *out = g;
    return DF_OK;
}

void df_spec_free(df_spec *g) {
    if (!g) return;
    free(g->logits);
    free(g->batch);
    free(g->q);
    free(g->p);
    free(g->hist);
    free(g);
}

void df_spec_get_stats(const df_spec *g, df_spec_stats *o) {
    memset(o, 0, sizeof *o);
    if (!g) return;
    *o = g->st;
    o->k = g->k;
    o->drafting = g->mode == G_SPEC;
    o->probing = g->mode == G_PROBE && g->d != NULL;
}

/* Account a step of `n` tokens taking dt seconds and move the gate. */
static void win_reset(df_spec *g) {
    g->win_tokens = g->win_calls = 0;
    g->win_s = 0;
}

static void gate_update(df_spec *g, int n, double dt, int verified) {
    g->win_tokens += n;
    g->win_s += dt;
    g->win_calls += verified;
    const double rate = g->win_s > 0 ? g->win_tokens / g->win_s : 0;
    switch (g->mode) {
    case G_PROBE: /* a plain window: the baseline drafting is compared with */
        if (g->st.generated <= WARMUP) { win_reset(g); break; } /* the first tokens warm the expert cache up */
        if (g->win_tokens >= PROBE_WINDOW) {
            g->st.plain_tok_s = rate;
            g->mode = G_SPEC;
            win_reset(g);
        }
        break;
    case G_SPEC:
        if (!g->o.gate) {
            if (g->win_tokens >= g->o.window) { g->st.spec_tok_s = rate; win_reset(g); }
            break;
        }
        const double plain = g->st.plain_tok_s;
        /* a window without one verification (the drafter proposed nothing: plain steps) says nothing about drafting */
        if (plain > 0 && g->win_calls > 0 &&
            ((g->win_tokens >= MIN_WINDOW && rate < plain) || (g->win_calls >= EARLY_CALLS && rate < EARLY_RATIO * plain))) {
            /* drafting does not pay: off for a while */
            g->st.spec_tok_s = rate;
            g->st.gate_off++;
            g->mode = G_OFF;
            g->off_left = g->o.retry * g->backoff;
            if (g->backoff < BACKOFF_MAX) g->backoff *= 2;
            g->sh_n = g->sh_hit = 0;
            win_reset(g);
        } else if (g->win_tokens >= g->o.window) {
            g->st.spec_tok_s = rate;
            g->backoff = 1;
            win_reset(g);
            if (++g->spec_windows >= g->probe_every) {
                g->spec_windows = 0;
                g->mode = G_PROBE;
                if (g->probe_every < PROBE_EVERY) g->probe_every *= 2;
            }
        }
        break;
    case G_OFF:
        if (!g->d) break;
        g->off_left -= n;
        if (g->d->cheap && g->sh_n >= SHADOW_WINDOW * (g->backoff > 2 ? g->backoff / 2 : 1)) {
            /* the drafter's guesses would have been accepted often enough: try drafting again now (the
             * window grows with the backoff, so a drafter that keeps failing the gate is re-tried less often) */
            if (g->sh_hit >= SHADOW_RATIO * g->sh_n) g->off_left = 0;
            g->sh_n = g->sh_hit = 0;
        }
        if (g->off_left <= 0) {
            if (g->win_tokens >= MIN_WINDOW) g->st.plain_tok_s = rate; /* the latest plain rate */
            g->mode = G_SPEC;
            g->spec_windows = 0;
            win_reset(g);
        } else if (g->win_tokens >= g->o.window) {
            g->st.plain_tok_s = rate;
            win_reset(g);
        }
        break;
    }
}

/* The drafter's view: the session's tokens + cur. */
static int make_hist(df_spec *g, int32_t cur) {
    const int n = df_session_n_past(g->s);
    if (g->hist_cap < n + 1) {
        int cap = g->hist_cap ? g->hist_cap : 256;
        while (cap < n + 1) cap *= 2;
        int32_t *h = realloc(g->hist, sizeof(int32_t) * (size_t)cap);
        if (!h) return -1;
        g->hist = h;
        g->hist_cap = cap;
    }
    if (n) memcpy(g->hist, df_session_tokens(g->s), sizeof(int32_t) * (size_t)n);
    g->hist[n] = cur;
    return n + 1;
}

int df_spec_step(df_spec *g, int32_t cur, int32_t *out, int cap, char *err, size_t errlen) {
    if (!g || !out || cap < 1) return set_err(err, errlen, DF_EINVAL, "df_spec_step: bad arguments");
    const int V = g->n_vocab, n_past = df_session_n_past(g->s), room = df_session_n_ctx(g->s) - n_past;
    if (room < 1) {
        if (err && errlen) snprintf(err, errlen, "context full: %d positions", df_session_n_ctx(g->s));
        return DF_ECONTEXT;
    }
    int k = g->k;
    if (k > cap - 1) k = cap - 1;
    if (k > room - 1) k = room - 1;
    double t0 = now_s();
    int nd = 0;
    if (g->mode == G_SPEC && k >= 1) {
        int nh = make_hist(g, cur);
        if (nh < 0) return set_err(err, errlen, DF_ENOMEM, "out of memory");
        nd = g->d->draft(g->d, g->hist, nh, k, g->batch + 1, g->q, err, errlen);
        if (nd < 0) return nd;
        for (int i = 0; i < nd; i++)
            if (g->batch[1 + i] < 0 || g->batch[1 + i] >= V) { nd = i; break; } /* not a target token: cut there */
    }
    int32_t shadow = -2; /* G_OFF, cheap drafter: its one-token guess (-1: none) */
    if (g->mode == G_OFF && g->d && g->d->cheap && !g->d->stochastic) {
        int nh = make_hist(g, cur);
        if (nh < 0) return set_err(err, errlen, DF_ENOMEM, "out of memory");
        int32_t t;
        shadow = g->d->draft(g->d, g->hist, nh, 1, &t, NULL, err, errlen) == 1 ? t : -1;
    }
    double t1 = now_s();
    g->st.draft_s += t1 - t0;
    int rc, n_out = 0;
    if (nd == 0) {
        rc = df_eval(g->s, &cur, 1, g->logits, 0, NULL, NULL, err, errlen);
        if (rc) return rc;
        out[n_out++] = df_sample(g->smp, g->logits, V);
        if (shadow != -2) { g->sh_n++; g->sh_hit += out[0] == shadow; }
        g->st.plain_steps++;
        g->st.plain_s += now_s() - t1;
    } else {
        g->batch[0] = cur;
        rc = df_eval(g->s, g->batch, nd + 1, g->logits, DF_EVAL_ALL_LOGITS | DF_EVAL_MARK, NULL, NULL, err, errlen);
        if (rc) return rc;
        int acc = 0;
        for (int i = 0; i <= nd; i++) {
            int32_t y;
            if (g->q && i < nd) { /* a sampled draft: the min(1, p/q) rule */
                df_sampler_probs(g->smp, g->logits + (size_t)i * V, V, g->p);
                y = spec_accept(g->smp, g->p, g->q + (size_t)i * V, g->batch[1 + i], V);
            } else y = df_sample(g->smp, g->logits + (size_t)i * V, V);
            out[n_out++] = y;
            if (i == nd || y != g->batch[1 + i]) break;
            acc++;
        }
        if (acc < nd) df_session_truncate(g->s, n_past + 1 + acc); /* cur + the accepted drafts */
        g->st.verify_calls++;
        g->st.drafted += (uint64_t)nd;
        g->st.accepted += (uint64_t)acc;
        g->st.verify_s += now_s() - t1;
        if (g->o.adaptive) {
            if (acc == nd && nd == k) g->k = g->k * 2 > g->o.k_max ? g->o.k_max : g->k * 2;
            else if (acc < nd) g->k = acc + 1;
        }
    }
    g->st.generated += (uint64_t)n_out;
    if (g->d) gate_update(g, n_out, now_s() - t0, nd > 0);
    return n_out;
}

int32_t spec_accept(df_sampler *smp, const float *p, const float *q, int32_t x, int V) {
    const double u = df_sampler_uniform(smp);
    if (u * (double)q[x] < (double)p[x]) return x; /* u < p(x) / q(x) */
    double sum = 0;
    for (int i = 0; i < V; i++) if (p[i] > q[i]) sum += (double)p[i] - q[i];
    const double r = df_sampler_uniform(smp) * sum;
    double acc = 0;
    int32_t last = -1;
    for (int i = 0; i < V; i++) {
        if (!(p[i] > q[i])) continue;
        acc += (double)p[i] - q[i];
        last = i;
        if (r < acc) return i;
    }
    return last >= 0 ? last : x; /* p == q everywhere: x was accepted above (u < 1) */
}
