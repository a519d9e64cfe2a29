/*
 * draft_ngram.c — prompt lookup drafting (no model): the history's last n tokens
 * (n from n_max down to n_min) are searched for, most recent earlier occurrence
 * first, and the tokens that followed that occurrence are proposed. Repetitive
 * text (code edits, quoting the prompt, lists) drafts well; text without repeats
 * proposes nothing and costs nothing. Deterministic: the draft is a point mass.
 * Idea: Saxena 2023, "prompt lookup decoding"; the search here is a plain
 * backwards scan over the history (its cost is far below one forward pass).
 */
#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    struct df_drafter base;
    int n_max, n_min;
} ngram_drafter;

static int ngram_draft(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen) {
    (void)err; (void)errlen; (void)q;
    const ngram_drafter *g = (const ngram_drafter *)d;
    for (int len = g->n_max; len >= g->n_min; len--) {
        if (len >= n) continue;
        const int32_t *suf = hist + n - len;
        /* an earlier occurrence starting at i (i + len <= n - 1: at least one token follows it) */
        for (int i = n - len - 1; i >= 0; i--) {
            if (hist[i] != suf[0] || memcmp(hist + i, suf, sizeof(int32_t) * (size_t)len)) continue;
            int c = 0;
            for (int j = i + len; j < n && c < k; j++) out[c++] = hist[j];
            return c;
        }
    }
    return 0;
}

static void ngram_destroy(df_drafter *d) { free(d); }

int df_drafter_ngram_new(df_drafter **out, int n_max, int n_min, char *err, size_t errlen) {
    *out = NULL;
    if (n_max == 0 && n_min == 0) { n_max = 4; n_min = 2; }
    if (n_min < 1 || n_max < n_min || n_max > 16) {
        if (err && errlen) snprintf(err, errlen, "n-gram drafter: n_max %d, n_min %d: expected 1 <= n_min <= n_max <= 16", n_max, n_min);
        return DF_EINVAL;
    }
    ngram_drafter *g = calloc(1, sizeof *g);
    if (!g) {
        if (err && errlen) snprintf(err, errlen, "out of memory");
        return DF_ENOMEM;
    }
    g->base.kind = "ngram";
    g->base.cheap = 1;
    g->base.draft = ngram_draft;
    g->base.destroy = ngram_destroy;
    g->n_max = n_max;
    g->n_min = n_min;
    *out = &g->base;
    return DF_OK;
}

void df_drafter_free(df_drafter *d) {
    if (d && d->destroy) d->destroy(d);
}

const char *df_drafter_kind(const df_drafter *d) { return d ? d->kind : "off"; }
