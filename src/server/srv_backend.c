/* srv_backend.c — the server's view of a real model, through include/deltafin.h
 * only: one df_model, one df_session (the KV cache kept across requests for
 * prefix reuse), its tokenizer and the engine's sampler. */
#include "srv.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    df_model *m;
    df_session *s;
    const df_tokenizer *t;
    df_model *dm;             /* the draft model (srv_backend_set_draft), or NULL */
    df_drafter *drafter;      /* or NULL */
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
static int m_n_past(srv_backend *b) { return df_session_n_past(BM(b)->s); }
static const int32_t *m_tokens(srv_backend *b) { return df_session_tokens(BM(b)->s); }
static int m_truncate(srv_backend *b, int n) { return df_session_truncate(BM(b)->s, n); }
static int m_eval(srv_backend *b, const int32_t *ids, int n, float *logits, int flags, df_progress_fn p, void *u,
                  char *err, size_t errlen) {
    return df_eval(BM(b)->s, ids, n, logits, flags, p, u, err, errlen);
}
static void *m_sampler_new(srv_backend *b, const df_sampler_opts *o) { return df_sampler_new(o); }
static int32_t m_sample(void *s, const float *l, int n) { return df_sample(s, l, n); }
static void m_sampler_free(void *s) { df_sampler_free(s); }
static void m_stats(srv_backend *b, df_stats *out) { df_model_stats(BM(b)->m, out); }
static void m_stats_reset(srv_backend *b) { df_model_stats_reset(BM(b)->m); }
static void m_close(srv_backend *b) {
    if (!b) return;
    if (BM(b)) {
        df_drafter_free(BM(b)->drafter);
        df_model_close(BM(b)->dm);
        if (BM(b)->s) df_session_free(BM(b)->s);
        if (BM(b)->m) df_model_close(BM(b)->m);
        free(BM(b));
    }
    free(b);
}

int srv_backend_open_model(srv_backend **out, const char *path, const df_model_opts *mo, int n_ctx,
                           char *err, size_t errlen) {
    *out = NULL;
    srv_backend *b = calloc(1, sizeof *b);
    be_model *bm = calloc(1, sizeof *bm);
    if (!b || !bm) { free(b); free(bm); return DF_ENOMEM; }
    b->impl = bm;
    b->close = m_close;
    df_model_opts o = *mo;
    o.kv_positions = n_ctx; /* 0: the engine's default (min(4096, max_position_embeddings)) */
    int rc = df_model_open(&bm->m, path, &o, err, errlen);
    if (rc) { m_close(b); return rc; }
    int ctx_max = df_model_n_ctx_max(bm->m);
    if (n_ctx <= 0) n_ctx = ctx_max > 0 && ctx_max < 4096 ? ctx_max : 4096;
    if (ctx_max > 0 && n_ctx > ctx_max) n_ctx = ctx_max;
    rc = df_session_new(&bm->s, bm->m, n_ctx, err, errlen);
    if (rc) { m_close(b); return rc; }
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
    if (b->n_vocab <= 0) {
        snprintf(err, errlen, "model %s reports %d vocabulary entries", path, b->n_vocab);
        m_close(b);
        return DF_EFORMAT;
    }
    *out = b;
    return 0;
}

/* ------------------------------------------------------- speculative decoding */

static void *m_spec_new(srv_backend *b, void *sampler) {
    df_spec *g = NULL;
    char err[256];
    return df_spec_new(&g, BM(b)->s, BM(b)->drafter, sampler, &BM(b)->spec, err, sizeof err) ? NULL : g;
}
static int m_spec_step(void *g, int32_t cur, int32_t *out, int cap, char *err, size_t errlen) {
    return df_spec_step(g, cur, out, cap, err, errlen);
}
static void m_spec_free(void *g) { df_spec_free(g); }

int srv_backend_set_draft(srv_backend *b, const srv_draft_config *dc, const df_model_opts *mo, char *err, size_t errlen) {
    if (!dc->draft || !strcmp(dc->draft, "off")) return 0;
    be_model *bm = BM(b);
    int rc;
    if (!strcmp(dc->draft, "ngram")) {
        rc = df_drafter_ngram_new(&bm->drafter, dc->ngram_max, dc->ngram_min, err, errlen);
        snprintf(bm->draft_describe, sizeof bm->draft_describe, "ngram (n %d..%d)", dc->ngram_min, dc->ngram_max);
    } else {
        df_model_opts o;
        df_model_opts_default(&o);
        o.threads = mo->threads;
        o.kv_positions = b->n_ctx;
        o.heat_path = "off";
        char e2[1024] = "";
        rc = df_model_open(&bm->dm, dc->draft, &o, e2, sizeof e2);
        if (rc) {
            snprintf(err, errlen, "--draft %s: %s", dc->draft, e2);
            return rc;
        }
        int retok = dc->retok >= 0 ? dc->retok : df_model_n_vocab(bm->dm) != b->n_vocab;
        if (retok) rc = df_drafter_retok_new(&bm->drafter, bm->dm, bm->t, b->n_ctx, e2, sizeof e2);
        else rc = df_drafter_model_new(&bm->drafter, bm->dm, b->n_ctx, e2, sizeof e2);
        if (!rc && !retok && df_model_n_vocab(bm->dm) != b->n_vocab) {
            snprintf(e2, sizeof e2, "its vocabulary has %d tokens, the target's %d: use --draft-retok on (or auto)",
                     df_model_n_vocab(bm->dm), b->n_vocab);
            rc = DF_EINVAL;
        }
        if (rc) {
            snprintf(err, errlen, "--draft %s: %s", dc->draft, e2);
            return rc;
        }
        snprintf(bm->draft_describe, sizeof bm->draft_describe, "%s %s", df_drafter_kind(bm->drafter), dc->draft);
    }
    if (rc) return rc;
    bm->spec = dc->spec;
    size_t l = strlen(bm->draft_describe);
    snprintf(bm->draft_describe + l, sizeof bm->draft_describe - l, ", k max %d%s, gate %s (window %d, retry %d)",
             dc->spec.k_max, dc->spec.adaptive ? " adaptive" : " fixed", dc->spec.gate ? "on" : "off", dc->spec.window,
             dc->spec.retry);
    b->spec_new = m_spec_new;
    b->spec_step = m_spec_step;
    b->spec_free = m_spec_free;
    b->draft_describe = bm->draft_describe;
    return 0;
}
