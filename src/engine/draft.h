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
    int stochastic;            /* 1: drafts are sampled and q is filled (df_drafter_set_sampling) */
    /* Propose up to k (>= 1) tokens after hist[0..n) into out; returns how many (0: no proposal),
     * or a negative DF_E* with err. A stochastic drafter writes the distribution each draft was
     * sampled from to q[i * n_vocab ..] (q [k, n_vocab]). */
    int (*draft)(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen);
    void (*destroy)(df_drafter *d);
    int cheap;                 /* 1: a draft costs nothing next to a target step (n-gram lookup): while the gate
                                  has drafting off, speculative.c still asks it for one token per plain step to
                                  see whether drafting would pay again (shadow acceptance) */
};

/* The speculative-sampling decision for one draft x sampled from q (speculative.c): accept x with
 * probability min(1, p(x)/q(x)) (first uniform of smp), else return a sample of norm(max(0, p - q))
 * (second uniform), which is never x. p, q: [V] probabilities. */
int32_t spec_accept(df_sampler *smp, const float *p, const float *q, int32_t x, int V);

#endif
