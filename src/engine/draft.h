/*
 * draft.h — the drafter interface behind deltafin.h's df_drafter: one function that
 * proposes up to k tokens continuing a history. Implementations: draft_ngram.c
 * (prompt lookup), draft_model.c (a draft model with the target's tokenizer, or with
 * its own tokenizer through re-tokenization). Used by speculative.c.
 */
#ifndef DF_ENGINE_DRAFT_H
#define DF_ENGINE_DRAFT_H

#include "deltafin.h"

#include <stddef.h>
#include <stdint.h>

struct df_drafter {
    const char *kind;          /* df_drafter_kind */
    int n_vocab;               /* ids it proposes are below this; 0 = any (n-gram: copied from the history) */
    /* Propose up to k (>= 1) tokens after hist[0..n) into out; returns how many (0: no proposal),
     * or a negative DF_E* with err. */
    int (*draft)(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, char *err, size_t errlen);
    void (*destroy)(df_drafter *d);
};

#endif
