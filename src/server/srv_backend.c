/* srv_backend.c — the server's view of a real model, through include/deltafin.h
 * only: one df_model, --parallel df_sessions (KV caches kept across requests for
 * prefix reuse), its tokenizer and the engine's sampler.
 *
 * Decode steps of concurrent generations are batched: a session that evaluates one
 * token (no flags, no progress callback) is "decoding" until it is released; its step
 * waits until every decoding session has asked for its step, and the last one to ask
 * (or, when a session stops decoding, a waiting one) runs them all as one
 * df_eval_batch, so each expert a layer needs is read once for all of them. Prompts
 * (prefill) run as their own df_eval between batches. Every session's logits are those
 * of evaluating it alone (df_eval_batch is bit-exact), so batching never changes output. */
#include "srv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    df_session *s;
    int busy;                 /* acquired by a generation */
    int decoding;             /* counted in be_model.n_decoding */
    double last_used;
    /* the step it waits for */
    int queued, done, rc;
    int32_t id;
    float *logits;
} m_sess;

typedef struct {
    df_model *m;
    const df_tokenizer *t;
    int n_ss;
    m_sess *ss;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_decoding, n_queued;
    int leader;               /* a batch is running */
    float *batch_logits;      /* [n_ss, n_vocab] */
    char batch_err[512];      /* the last batch's error message */
    uint64_t n_batches, n_batch_rows;
    df_model *dm;             /* the draft model (srv_backend_set_draft), or NULL */
    df_drafter **drafters;    /* [n_ss], or NULL */
    df_spec_opts spec;
    char draft_describe[1200];
} be_model;

#define BM(b) ((be_model *)(b)->impl)

static int m_tokenize(srv_backend *b, const char *s, size_t n, int add_bos, int32_t **ids, size_t *n_ids,
                      char *err, size_t errlen) {
    /* the same flags as `deltafin run`: plain text gets what tokenizer_config asks
     * for (add_bos_token, as transformers' add_special_tokens=True) and no
     * special-token parsing; rendered chat text has its specials parsed, no extras */
    return df_tokenize(BM(b)->t, s, n, add_bos ? DF_TOK_ADD_SPECIAL : DF_TOK_PARSE_SPECIAL, ids, n_ids, err, errlen);
}
static int m_chat_render(srv_backend *b, const char *msgs, const char *tools, char **text, char *err, size_t errlen) {
    return df_chat_render(BM(b)->t, msgs, tools, DF_CHAT_ADD_GENERATION_PROMPT, text, err, errlen);
}
static int m_token_bytes(srv_backend *b, int32_t id, char **out, size_t *len) {
    if (!BM(b)->t) {
        char tmp[24];
        int n = snprintf(tmp, sizeof tmp, " %d", (int)id);
        *out = strdup(tmp);
        *len = (size_t)n;
        return 0;
    }
    const char *p;
    size_t n;
    if (df_token_bytes(BM(b)->t, id, &p, &n)) return DF_EINVAL;
    *out = malloc(n + 1);
    if (!*out) return DF_ENOMEM;
    memcpy(*out, p, n);
    (*out)[n] = 0;
    *len = n;
    return 0;
}
/* Without a tokenizer each token's text is " ID" (documented in docs/server.md). */
typedef struct { df_detok *d; } m_detok;
static void *m_detok_new(srv_backend *b) {
    m_detok *d = calloc(1, sizeof *d);
    if (BM(b)->t) d->d = df_detok_new(BM(b)->t);
    return d;
}
static int m_detok_push(void *p, int32_t id, char *out, size_t cap) {
    m_detok *d = p;
    if (!d->d) return snprintf(out, cap, " %d", (int)id);
    return df_detok_push(d->d, id, out, cap);
}
static int m_detok_flush(void *p, char *out, size_t cap) {
    m_detok *d = p;
    return d->d ? df_detok_flush(d->d, out, cap) : 0;
}
static void m_detok_free(void *p) {
    m_detok *d = p;
    if (d && d->d) df_detok_free(d->d);
    free(d);
}
static int32_t m_token_id(srv_backend *b, const char *tok) { return BM(b)->t ? df_tokenizer_token_id(BM(b)->t, tok) : -1; }
static int m_stop_ids(srv_backend *b, int32_t *ids, int cap) { return BM(b)->t ? df_tokenizer_stop_ids(BM(b)->t, ids, cap) : 0; }
static void *m_session_acquire(srv_backend *b, const int32_t *prompt, int n) {
    be_model *bm = BM(b);
    const int32_t *toks[SRV_MAX_PARALLEL];
    int np[SRV_MAX_PARALLEL], busy[SRV_MAX_PARALLEL];
    double last[SRV_MAX_PARALLEL];
    pthread_mutex_lock(&bm->mu);
    for (int i = 0; i < bm->n_ss; i++) { /* a busy session is being evaluated by its generation: not read */
        busy[i] = bm->ss[i].busy;
        toks[i] = busy[i] ? NULL : df_session_tokens(bm->ss[i].s);
        np[i] = busy[i] ? 0 : df_session_n_past(bm->ss[i].s);
        last[i] = bm->ss[i].last_used;
    }
    int i = srv_pick_session(toks, np, busy, last, bm->n_ss, prompt, n);
    if (i >= 0) bm->ss[i].busy = 1;
    pthread_mutex_unlock(&bm->mu);
    return i >= 0 ? &bm->ss[i] : NULL;
}

/* The session stops decoding (bm->mu held): the others' batch may now be complete. */
static void leave_decoding_locked(be_model *bm, m_sess *ms) {
    if (!ms->decoding) return;
    ms->decoding = 0;
    bm->n_decoding--;
    pthread_cond_broadcast(&bm->cv);
}

static void m_session_release(srv_backend *b, void *sess) {
    be_model *bm = BM(b);
    m_sess *ms = sess;
    if (!ms) return;
    pthread_mutex_lock(&bm->mu);
    leave_decoding_locked(bm, ms);
    ms->busy = 0;
    ms->last_used = srv_now();
    pthread_mutex_unlock(&bm->mu);
}
static int m_n_past(srv_backend *b, void *sess) { return df_session_n_past(((m_sess *)sess)->s); }
static const int32_t *m_tokens(srv_backend *b, void *sess) { return df_session_tokens(((m_sess *)sess)->s); }
static int m_truncate(srv_backend *b, void *sess, int n) { return df_session_truncate(((m_sess *)sess)->s, n); }

/* Run every queued step as one df_eval_batch (bm->mu held on entry and return; released meanwhile). */
static void run_batch_locked(srv_backend *b) {
    be_model *bm = BM(b);
    df_session *ss[SRV_MAX_PARALLEL];
    const int32_t *ids[SRV_MAX_PARALLEL];
    int ones[SRV_MAX_PARALLEL];
    m_sess *who[SRV_MAX_PARALLEL];
    int k = 0;
    for (int i = 0; i < bm->n_ss; i++)
        if (bm->ss[i].queued) {
            bm->ss[i].queued = 0;
            ss[k] = bm->ss[i].s;
            ids[k] = &bm->ss[i].id;
            ones[k] = 1;
            who[k++] = &bm->ss[i];
        }
    bm->n_queued -= k;
    bm->leader = 1;
    pthread_mutex_unlock(&bm->mu);
    char err[512] = "";
    const int rc = df_eval_batch(ss, ids, ones, k, bm->batch_logits, 0, err, sizeof err);
    const size_t V = (size_t)b->n_vocab;
    if (!rc)
        for (int i = 0; i < k; i++) memcpy(who[i]->logits, bm->batch_logits + i * V, sizeof(float) * V);
    pthread_mutex_lock(&bm->mu);
    if (rc) snprintf(bm->batch_err, sizeof bm->batch_err, "%s", err);
    bm->n_batches++;
    bm->n_batch_rows += (uint64_t)k;
    for (int i = 0; i < k; i++) { who[i]->rc = rc; who[i]->done = 1; }
    bm->leader = 0;
    pthread_cond_broadcast(&bm->cv);
}

static int m_eval(srv_backend *b, void *sess, const int32_t *ids, int n, float *logits, int flags, df_progress_fn p,
                  void *u, char *err, size_t errlen) {
    be_model *bm = BM(b);
    m_sess *ms = sess;
    if (n != 1 || flags || p || !logits || bm->n_ss == 1) { /* a prompt (or the only session): on its own */
        pthread_mutex_lock(&bm->mu);
        leave_decoding_locked(bm, ms);
        pthread_mutex_unlock(&bm->mu);
        return df_eval(ms->s, ids, n, logits, flags, p, u, err, errlen);
    }
    pthread_mutex_lock(&bm->mu);
    if (!ms->decoding) { ms->decoding = 1; bm->n_decoding++; }
    ms->id = ids[0];
    ms->logits = logits;
    ms->done = 0;
    ms->queued = 1;
    bm->n_queued++;
    while (!ms->done) {
        if (!bm->leader && bm->n_queued > 0 && bm->n_queued >= bm->n_decoding) run_batch_locked(b);
        else pthread_cond_wait(&bm->cv, &bm->mu);
    }
    const int rc = ms->rc;
    if (rc && err) snprintf(err, errlen, "%s", bm->batch_err);
    pthread_mutex_unlock(&bm->mu);
    return rc;
}
static void *m_sampler_new(srv_backend *b, const df_sampler_opts *o) { return df_sampler_new(o); }
static int32_t m_sample(void *s, const float *l, int n) { return df_sample(s, l, n); }
static void m_sampler_free(void *s) { df_sampler_free(s); }
static void m_stats(srv_backend *b, df_stats *out) { df_model_stats(BM(b)->m, out); }
static void m_stats_reset(srv_backend *b) { df_model_stats_reset(BM(b)->m); }
static void m_batch_stats(srv_backend *b, uint64_t *steps, uint64_t *rows) {
    be_model *bm = BM(b);
    pthread_mutex_lock(&bm->mu);
    *steps = bm->n_batches;
    *rows = bm->n_batch_rows;
    pthread_mutex_unlock(&bm->mu);
}
static int m_expert_map(srv_backend *b, unsigned char *state, float *heat, int cap, int *moe_layers, int *experts,
                        int *layer_ids) {
    return df_model_expert_map(BM(b)->m, state, heat, cap, moe_layers, experts, layer_ids);
}
static void m_close(srv_backend *b) {
    if (!b) return;
    if (BM(b)) {
        be_model *bm = BM(b);
        for (int i = 0; bm->drafters && i < bm->n_ss; i++) df_drafter_free(bm->drafters[i]);
        free(bm->drafters);
        df_model_close(bm->dm);
        for (int i = 0; bm->ss && i < bm->n_ss; i++) df_session_free(bm->ss[i].s);
        free(bm->ss);
        free(bm->batch_logits);
        pthread_mutex_destroy(&bm->mu);
        pthread_cond_destroy(&bm->cv);
        if (bm->m) df_model_close(bm->m);
        free(bm);
    }
    free(b);
}

int srv_backend_open_model(srv_backend **out, const char *path, const df_model_opts *mo, int n_ctx, int n_sessions, int preload,
                           char *err, size_t errlen) {
    *out = NULL;
    if (n_sessions < 1 || n_sessions > SRV_MAX_PARALLEL) {
        snprintf(err, errlen, "--parallel %d: expected 1..%d", n_sessions, SRV_MAX_PARALLEL);
        return DF_EINVAL;
    }
    srv_backend *b = calloc(1, sizeof *b);
    be_model *bm = calloc(1, sizeof *bm);
    m_sess *ss = calloc((size_t)n_sessions, sizeof *ss);
    if (!b || !bm || !ss) { free(b); free(bm); free(ss); return DF_ENOMEM; }
    pthread_mutex_init(&bm->mu, NULL);
    pthread_cond_init(&bm->cv, NULL);
    bm->ss = ss;
    bm->n_ss = n_sessions;
    b->impl = bm;
    b->close = m_close;
    df_model_opts o = *mo;
    o.kv_positions = n_ctx; /* 0: the engine's default (min(4096, max_position_embeddings)) */
    o.n_seq = n_sessions;   /* the budget holds every session's KV cache */
    int rc = df_model_open(&bm->m, path, &o, err, errlen);
    if (rc == DF_EBUDGET && n_sessions > 1) { /* say where the KV cache figure comes from */
        size_t l = strlen(err);
        if (l < errlen)
            snprintf(err + l, errlen - l, "; the KV cache is for --parallel %d sessions of --ctx positions each: "
                     "lower --parallel or --ctx, or raise --ram-budget", n_sessions);
    }
    if (rc) { m_close(b); return rc; }
    if (preload) { /* --preload: every routed expert in memory before the first request */
        df_preload_info in;
        rc = df_model_preload(bm->m, NULL, NULL, &in, err, errlen);
        if (rc) { m_close(b); return rc; }
        char line[256];
        fprintf(stderr, "%s\n", df_preload_describe(&in, line, sizeof line));
    }
    int ctx_max = df_model_n_ctx_max(bm->m);
    if (n_ctx <= 0) n_ctx = ctx_max > 0 && ctx_max < 4096 ? ctx_max : 4096;
    if (ctx_max > 0 && n_ctx > ctx_max) { /* said, not silently changed */
        fprintf(stderr, "deltafin serve: note: --ctx %d is more than the model's maximum of %d positions; using %d\n",
                n_ctx, ctx_max, ctx_max);
        n_ctx = ctx_max;
    }
    for (int i = 0; i < n_sessions; i++) {
        rc = df_session_new(&bm->ss[i].s, bm->m, n_ctx, err, errlen);
        if (rc) { m_close(b); return rc; }
    }
    bm->t = df_model_tokenizer(bm->m);
    const char *terr = df_model_tokenizer_error(bm->m);
    if (terr) {
        /* a tokenizer file that exists but cannot be used is an error, not "no tokenizer" */
        snprintf(err, errlen, "%s", terr);
        m_close(b);
        return DF_EFORMAT;
    }
    b->name = df_model_name(bm->m);
    b->describe = df_model_describe(bm->m);
    b->n_vocab = df_model_n_vocab(bm->m);
    b->n_ctx = n_ctx;
    b->exact = df_model_is_exact(bm->m);
    b->has_tokenizer = bm->t != NULL;
    b->is_kimi = bm->t && (df_tokenizer_token_id(bm->t, "<|im_middle|>") >= 0 ||                  /* K2 family */
                           (df_tokenizer_token_id(bm->t, "<|open|>") >= 0 &&                        /* K3 (XTML) */
                            df_tokenizer_token_id(bm->t, "<|sep|>") >= 0));
    b->tokenize = m_tokenize;
    b->chat_render = m_chat_render;
    b->token_bytes = m_token_bytes;
    b->detok_new = m_detok_new;
    b->detok_push = m_detok_push;
    b->detok_flush = m_detok_flush;
    b->detok_free = m_detok_free;
    b->token_id = m_token_id;
    b->stop_ids = m_stop_ids;
    b->n_sessions = n_sessions;
    b->session_acquire = m_session_acquire;
    b->session_release = m_session_release;
    b->n_past = m_n_past;
    b->tokens = m_tokens;
    b->truncate = m_truncate;
    b->eval = m_eval;
    b->sampler_new = m_sampler_new;
    b->sample = m_sample;
    b->sampler_free = m_sampler_free;
    b->logprob = df_logprob;
    b->stats = m_stats;
    b->stats_reset = m_stats_reset;
    b->batch_stats = m_batch_stats;
    b->expert_map = m_expert_map;
    if (b->n_vocab <= 0) {
        snprintf(err, errlen, "model %s reports %d vocabulary entries", path, b->n_vocab);
        m_close(b);
        return DF_EFORMAT;
    }
    bm->batch_logits = malloc(sizeof(float) * (size_t)n_sessions * (size_t)b->n_vocab);
    if (!bm->batch_logits) { m_close(b); return DF_ENOMEM; }
    *out = b;
    return 0;
}

/* ------------------------------------------------------- speculative decoding */

static void *m_spec_new(srv_backend *b, void *sess, void *sampler) {
    be_model *bm = BM(b);
    m_sess *ms = sess;
    df_spec *g = NULL;
    char err[256];
    return df_spec_new(&g, ms->s, bm->drafters[ms - bm->ss], sampler, &bm->spec, err, sizeof err) ? NULL : g;
}
static int m_spec_step(void *g, int32_t cur, int32_t *out, int cap, char *err, size_t errlen) {
    return df_spec_step(g, cur, out, cap, err, errlen);
}
static void m_spec_free(void *g) { df_spec_free(g); }

int srv_backend_set_draft(srv_backend *b, const srv_draft_config *dc, const df_model_opts *mo, char *err, size_t errlen) {
    if (!dc->draft || !strcmp(dc->draft, "off")) return 0;
    be_model *bm = BM(b);
    char e2[1024] = "";
    int rc = 0, retok = 0;
    if (!(bm->drafters = calloc((size_t)bm->n_ss, sizeof *bm->drafters))) return DF_ENOMEM;
    const int ngram = !strcmp(dc->draft, "ngram");
    if (!ngram) {
        df_model_opts o;
        df_model_opts_default(&o);
        o.threads = mo->threads; /* the target's threads, cache, backend and progress, as run's --draft */
        o.cache_dir = mo->cache_dir;
        o.backend = mo->backend;
        o.progress = mo->progress;
        o.progress_user = mo->progress_user;
        o.kv_positions = b->n_ctx;
        o.heat_path = "off";
        rc = df_model_open(&bm->dm, dc->draft, &o, e2, sizeof e2);
        retok = dc->retok >= 0 ? dc->retok : bm->dm && df_model_n_vocab(bm->dm) != b->n_vocab;
        if (!rc && !retok && df_model_n_vocab(bm->dm) != b->n_vocab) {
            snprintf(e2, sizeof e2, "its vocabulary has %d tokens, the target's %d: use --draft-retok on (or auto)",
                     df_model_n_vocab(bm->dm), b->n_vocab);
            rc = DF_EINVAL;
        }
    }
    for (int i = 0; !rc && i < bm->n_ss; i++) {
        if (ngram) rc = df_drafter_ngram_new(&bm->drafters[i], dc->ngram_max, dc->ngram_min, e2, sizeof e2);
        else if (retok) rc = df_drafter_retok_new(&bm->drafters[i], bm->dm, bm->t, b->n_ctx, e2, sizeof e2);
        else rc = df_drafter_model_new(&bm->drafters[i], bm->dm, b->n_ctx, e2, sizeof e2);
    }
    if (rc) {
        snprintf(err, errlen, "--draft %s: %s", dc->draft, e2);
        return rc;
    }
    if (ngram) snprintf(bm->draft_describe, sizeof bm->draft_describe, "ngram (n %d..%d)", dc->ngram_min, dc->ngram_max);
    else snprintf(bm->draft_describe, sizeof bm->draft_describe, "%s %s", df_drafter_kind(bm->drafters[0]), dc->draft);
    bm->spec = dc->spec;
    size_t l = strlen(bm->draft_describe);
    snprintf(bm->draft_describe + l, sizeof bm->draft_describe - l, ", k max %d%s, gate %s (window %d, retry %d)%s",
             dc->spec.k_max, dc->spec.adaptive ? " adaptive" : " fixed", dc->spec.gate ? "on" : "off", dc->spec.window,
             dc->spec.retry, bm->n_ss > 1 ? ", one drafter per session" : "");
    b->spec_new = m_spec_new;
    b->spec_step = m_spec_step;
    b->spec_free = m_spec_free;
    b->draft_describe = bm->draft_describe;
    return 0;
}
