/*
 * sample.c — token selection (public API): greedy argmax (ties -> lowest id),
 * or temperature -> top-k -> top-p (nucleus) sampling from the softmax with a
 * seeded xoshiro256** PRNG, so a seed reproduces its output; and df_logprob
 * (log-softmax of one id plus the best top_n).
 */
#include "deltafin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct df_sampler {
    df_sampler_opts o;
    uint64_t s[4];
    struct cand { float v; int32_t id; } *c;
    int cap;
};

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
static uint64_t xoshiro(uint64_t *s) {
    uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return r;
}

void df_sampler_opts_default(df_sampler_opts *o) {
    memset(o, 0, sizeof *o);
    o->top_p = 1.0f;
}

df_sampler *df_sampler_new(const df_sampler_opts *o) {
    df_sampler *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (o) s->o = *o; else df_sampler_opts_default(&s->o);
    uint64_t x = s->o.seed;
    for (int i = 0; i < 4; i++) s->s[i] = splitmix64(&x);
    return s;
}

void df_sampler_free(df_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s);
}

/* The first index of the largest logit (NaN never wins; all NaN: 0): the running best b with l[i] > l[b]. Chunks of
 * 256 logits are first reduced in 16 independent lanes (a loop the compiler vectorizes) and only a chunk holding a
 * logit above the best so far is scanned one by one, so the result is that of the one-by-one scan (a 32000-logit
 * vocabulary: ~8 us instead of ~140 us on the dev VM, per greedy token). */
static int32_t argmax(const float *l, int n) {
    enum { C = 256, W = 16 };
    int32_t b = 0;
    float bv = l[0];
    int i = 1;
    for (; i + C <= n; i += C) {
        float m[W];
        for (int w = 0; w < W; w++) m[w] = -INFINITY;
        for (int j = 0; j < C; j += W)
            for (int w = 0; w < W; w++) {
                const float x = l[i + j + w];
                m[w] = x > m[w] ? x : m[w];
            }
        float mx = m[0];
        for (int w = 1; w < W; w++) mx = m[w] > mx ? m[w] : mx;
        if (mx > bv)
            for (int j = i; j < i + C; j++)
                if (l[j] > bv) { bv = l[j]; b = j; }
    }
    for (; i < n; i++)
        if (l[i] > bv) { bv = l[i]; b = i; }
    return b;
}

static int cand_cmp(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->v > y->v) return -1;
    if (x->v < y->v) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t df_sample(df_sampler *s, const float *logits, int n_vocab) {
    if (!s || s->o.temperature <= 0.0f || s->o.top_k == 1) return argmax(logits, n_vocab);
    if (s->cap < n_vocab) {
        struct cand *c = realloc(s->c, sizeof *c * (size_t)n_vocab);
        if (!c) return argmax(logits, n_vocab);
        s->c = c;
        s->cap = n_vocab;
    }
    for (int i = 0; i < n_vocab; i++) { s->c[i].v = logits[i] / s->o.temperature; s->c[i].id = i; }
    qsort(s->c, (size_t)n_vocab, sizeof *s->c, cand_cmp);
    int n = n_vocab;
    if (s->o.top_k > 0 && s->o.top_k < n) n = s->o.top_k;
    double m = s->c[0].v, sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)s->c[i].v - m);
    if (s->o.top_p > 0.0f && s->o.top_p < 1.0f) {
        double acc = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += exp((double)s->c[i].v - m) / sum;
            if (acc >= s->o.top_p) { keep = i + 1; break; }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++) sum += exp((double)s->c[i].v - m);
    }
    double u = (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    for (int i = 0; i < n; i++) {
        acc += exp((double)s->c[i].v - m);
        if (u < acc) return s->c[i].id;
    }
    return s->c[n - 1].id;
}

float df_logprob(const float *logits, int n_vocab, int32_t id, int top_n, int32_t *top_ids, float *top_logprobs) {
    float m = -INFINITY;
    for (int i = 0; i < n_vocab; i++) if (logits[i] > m) m = logits[i];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)logits[i] - m);
    double lse = m + log(sum);
    if (top_n > 0 && top_ids && top_logprobs) {
        /* best top_n by raw logit, ties -> lower id (strict > keeps the earlier id first) */
        int have = 0;
        for (int i = 0; i < n_vocab; i++) {
            float v = logits[i];
            if (have == top_n && !(v > top_logprobs[have - 1])) continue;
            int k = have < top_n ? have++ : top_n - 1;
            while (k > 0 && v > top_logprobs[k - 1]) {
                top_ids[k] = top_ids[k - 1];
                top_logprobs[k] = top_logprobs[k - 1];
                k--;
            }
            top_ids[k] = i;
            top_logprobs[k] = v;
        }
        for (int k = 0; k < have; k++) top_logprobs[k] = (float)((double)top_logprobs[k] - lse);
        for (int k = have; k < top_n; k++) { top_ids[k] = -1; top_logprobs[k] = -INFINITY; }
    }
    if (id < 0 || id >= n_vocab) return -INFINITY;
    return (float)((double)logits[id] - lse);
}

void df_sampler_probs(df_sampler *s, const float *logits, int n_vocab, float *probs) {
    for (int i = 0; i < n_vocab; i++) probs[i] = 0.0f;
    if (!s || s->o.temperature <= 0.0f || s->o.top_k == 1) { probs[argmax(logits, n_vocab)] = 1.0f; return; }
    if (s->cap < n_vocab) {
        struct cand *c = realloc(s->c, sizeof *c * (size_t)n_vocab);
        if (!c) { probs[argmax(logits, n_vocab)] = 1.0f; return; }
        s->c = c;
        s->cap = n_vocab;
    }
    /* the candidates, cut and weights of df_sample */
    for (int i = 0; i < n_vocab; i++) { s->c[i].v = logits[i] / s->o.temperature; s->c[i].id = i; }
    qsort(s->c, (size_t)n_vocab, sizeof *s->c, cand_cmp);
    int n = n_vocab;
    if (s->o.top_k > 0 && s->o.top_k < n) n = s->o.top_k;
    double m = s->c[0].v, sum = 0;
    for (int i = 0; i < n; i++) sum += exp((double)s->c[i].v - m);
    if (s->o.top_p > 0.0f && s->o.top_p < 1.0f) {
        double acc = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += exp((double)s->c[i].v - m) / sum;
            if (acc >= s->o.top_p) { keep = i + 1; break; }
        }
        n = keep;
        sum = 0;
        for (int i = 0; i < n; i++) sum += exp((double)s->c[i].v - m);
    }
    for (int i = 0; i < n; i++) probs[s->c[i].id] = (float)(exp((double)s->c[i].v - m) / sum);
}

double df_sampler_uniform(df_sampler *s) { return (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0); }
