/*
 * draft_model.c — drafting with a smaller model: the draft model's greedy (argmax)
 * continuation of the history, k tokens, one df_eval each. Its session follows the
 * history: the common prefix with what it holds is kept (df_session_truncate rolls
 * back its KV cache and recurrent state exactly), the rest is evaluated in one call.
 *
 * With a different tokenizer (df_drafter_retok_new), the history is the target's
 * ids: they are detokenized with the target's tokenizer and re-tokenized with the
 * draft's, the draft model continues that token sequence, and its drafted text is
 * tokenized with the target's tokenizer; the last of those ids is dropped (more text
 * could merge into it) and the rest is the proposal. Verification decides what is
 * kept, so a boundary the two tokenizers split differently only costs acceptance.
 */
#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    struct df_drafter base;
    df_model *m;
    df_session *s;
    int n_vocab;
    float *logits;                 /* [n_vocab] */
    const df_tokenizer *ttok;      /* re-tokenizing drafter: the target's tokenizer; else NULL */
    const df_tokenizer *dtok;      /* re-tokenizing drafter: the draft model's tokenizer */
    int32_t *ids;                  /* re-tokenizing drafter: drafted ids of the draft model */
    int ids_cap;
    df_sampler *smp;               /* sampled drafts (df_drafter_set_sampling); NULL = argmax */
} model_drafter;

/* Continuation of hist[0..n) (draft-model ids) by k tokens into out: greedy, or sampled with the
 * distributions written to q [k, n_vocab] (when q and g->smp). */
static int draft_ids(model_drafter *g, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen) {
    if (n < 1) return 0;
    const int32_t *have = df_session_tokens(g->s);
    int ns = df_session_n_past(g->s), c = 0;
    while (c < ns && c < n && have[c] == hist[c]) c++;
    if (c == n) c = n - 1; /* the last position's logits are needed again */
    df_session_truncate(g->s, c);
    int rc = df_eval(g->s, hist + c, n - c, g->logits, 0, NULL, NULL, err, errlen);
    if (rc == DF_ECONTEXT) return 0; /* the draft's context is full: no proposal */
    if (rc) return rc;
    int got = 0;
    for (int i = 0; i < k; i++) {
        if (g->smp && q) { /* x ~ q: one uniform against q's cumulative sum (ids ascending) */
            const float *qi = q + (size_t)i * g->n_vocab;
            df_sampler_probs(g->smp, g->logits, g->n_vocab, q + (size_t)i * g->n_vocab);
            const double u = df_sampler_uniform(g->smp);
            double acc = 0;
            int32_t x = -1;
            for (int v = 0; v < g->n_vocab; v++) {
                if (qi[v] <= 0) continue;
                acc += qi[v];
                x = v;
                if (u < acc) break;
            }
            out[got++] = x >= 0 ? x : df_sample(NULL, g->logits, g->n_vocab);
        } else out[got++] = df_sample(NULL, g->logits, g->n_vocab); /* no sampler: the argmax */
        if (i + 1 == k) break;
        /* the first drafted token's eval marks the rollback point (recurrent draft models) */
        rc = df_eval(g->s, &out[got - 1], 1, g->logits, i == 0 ? DF_EVAL_MARK : 0, NULL, NULL, err, errlen);
        if (rc == DF_ECONTEXT) break;
        if (rc) return rc;
    }
    return got;
}

static int model_draft(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen) {
    return draft_ids((model_drafter *)d, hist, n, k, out, q, err, errlen);
}

static int retok_draft(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen) {
    (void)q;
    model_drafter *g = (model_drafter *)d;
    char *text = NULL, *dtext = NULL;
    size_t tl = 0, dl = 0, nd = 0, nt = 0;
    int32_t *dh = NULL, *tids = NULL;
    int got = 0;
    int rc = df_detokenize(g->ttok, hist, (size_t)n, &text, &tl, err, errlen);
    if (!rc) rc = df_tokenize(g->dtok, text, tl, DF_TOK_PARSE_SPECIAL, &dh, &nd, err, errlen);
    if (rc) goto done;
    /* one more draft token than asked: the last target id is dropped */
    if (g->ids_cap < k + 2) {
        int32_t *t = realloc(g->ids, sizeof(int32_t) * (size_t)(k + 2));
        if (!t) { rc = DF_ENOMEM; goto done; }
        g->ids = t;
        g->ids_cap = k + 2;
    }
    int nd_got = draft_ids(g, dh, (int)nd, k + 1, g->ids, NULL, err, errlen);
    if (nd_got < 0) { rc = nd_got; goto done; }
    if (nd_got == 0) goto done;
    rc = df_detokenize(g->dtok, g->ids, (size_t)nd_got, &dtext, &dl, err, errlen);
    if (!rc && dl) rc = df_tokenize(g->ttok, dtext, dl, 0, &tids, &nt, err, errlen);
    if (rc) goto done;
    for (size_t i = 0; i + 1 < nt && got < k; i++) out[got++] = tids[i];
done:
    free(text);
    free(dtext);
    free(dh);
    free(tids);
    return rc ? rc : got;
}

static void model_destroy(df_drafter *d) {
    model_drafter *g = (model_drafter *)d;
    df_session_free(g->s);
    df_sampler_free(g->smp);
    free(g->logits);
    free(g->ids);
    free(g);
}

static int drafter_make(df_drafter **out, df_model *draft, int n_ctx, const df_tokenizer *ttok, char *err, size_t errlen) {
    *out = NULL;
    if (!draft) {
        if (err && errlen) snprintf(err, errlen, "draft-model drafter: no draft model");
        return DF_EINVAL;
    }
    model_drafter *g = calloc(1, sizeof *g);
    if (!g) return DF_ENOMEM;
    g->m = draft;
    g->n_vocab = df_model_n_vocab(draft);
    g->logits = malloc(sizeof(float) * (size_t)g->n_vocab);
    int rc = g->logits ? df_session_new(&g->s, draft, n_ctx, err, errlen) : DF_ENOMEM;
    if (rc) {
        if (rc == DF_ENOMEM && err && errlen) snprintf(err, errlen, "out of memory");
        free(g->logits);
        free(g);
        return rc;
    }
    g->base.kind = ttok ? "model-retok" : "model";
    g->base.n_vocab = ttok ? 0 : g->n_vocab;
    g->base.draft = ttok ? retok_draft : model_draft;
    g->base.destroy = model_destroy;
    g->ttok = ttok;
    if (ttok) {
        g->dtok = df_model_tokenizer(draft);
        if (!g->dtok) {
            if (err && errlen)
                snprintf(err, errlen, "draft model %s has no tokenizer (tokenizer.json / tiktoken.model): a draft with a different "
                                      "tokenizer needs one", df_model_name(draft));
            model_destroy(&g->base);
            return DF_EINVAL;
        }
    }
    *out = &g->base;
    return DF_OK;
}

int df_drafter_model_new(df_drafter **out, df_model *draft, int n_ctx, char *err, size_t errlen) {
    return drafter_make(out, draft, n_ctx, NULL, err, errlen);
}

int df_drafter_retok_new(df_drafter **out, df_model *draft, const df_tokenizer *target_tok, int n_ctx, char *err, size_t errlen) {
    if (!target_tok) {
        *out = NULL;
        if (err && errlen) snprintf(err, errlen, "re-tokenizing drafter: the target model has no tokenizer");
        return DF_EINVAL;
    }
    return drafter_make(out, draft, n_ctx, target_tok, err, errlen);
}

int df_drafter_set_sampling(df_drafter *d, const df_sampler_opts *o, char *err, size_t errlen) {
    if (!d || d->destroy != model_destroy || d->draft != model_draft) {
        if (err && errlen) snprintf(err, errlen, "sampled drafts need a draft model with the target's tokenizer (not %s)", df_drafter_kind(d));
        return DF_EINVAL;
    }
    model_drafter *g = (model_drafter *)d;
    df_sampler_free(g->smp);
    g->smp = NULL;
    d->stochastic = 0;
    if (!o || o->temperature <= 0.0f) return DF_OK;
    df_sampler_opts so = *o;
    so.seed = o->seed ^ 0x5deece66dull; /* its own stream: the target's draws stay the verification's */
    if (!(g->smp = df_sampler_new(&so))) return DF_ENOMEM;
    d->stochastic = 1;
    return DF_OK;
}
