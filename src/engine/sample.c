/*
 * sample.c — token selection (public API): greedy argmax (ties -> lowest id),
 * or temperature -> top-k -> top-p (nucleus) sampling from the softmax with a
 * seeded xoshiro256** PRNG, so a seed reproduces its output, in O(vocabulary)
 * plus a sort of the kept candidates (dist); and df_logprob (log-softmax of one
 * id plus the best top_n).
 */
#include "deltafin.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct df_sampler {
    df_sampler_opts o;
    uint64_t s[4];
    struct cand { float v; int32_t id; } *c; /* top-k candidates [cap] */
    float *w;                                /* every token's weight exp(v - m) [cap] */
    double *bs;                              /* the weights' sums per block of SB tokens [cap / SB + 1] */
    int32_t *ix;                             /* top-p: the kept tokens first [cap] */
    int cap;
};

enum { SB = 256 }; /* tokens per block sum */

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
    free(s->w);
    free(s->bs);
    free(s->ix);
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

/* Room for n tokens' candidates, weights, block sums and indices; 0 when out of memory. */
static int reserve(df_sampler *s, int n) {
    if (s->cap >= n) return 1;
    struct cand *c = realloc(s->c, sizeof *c * (size_t)n);
    if (c) s->c = c;
    float *w = realloc(s->w, sizeof *w * (size_t)n);
    if (w) s->w = w;
    double *bs = realloc(s->bs, sizeof *bs * (size_t)(n / SB + 1));
    if (bs) s->bs = bs;
    int32_t *ix = realloc(s->ix, sizeof *ix * (size_t)n);
    if (ix) s->ix = ix;
    if (!c || !w || !bs || !ix) return 0;
    s->cap = n;
    return 1;
}

/* e^x for x <= 0 in fp32, without branches so that the weights' loop vectorizes: k = round(x / ln 2) read from the
 * mantissa of x log2(e) + 1.5 x 2^23 (clamped to -126 in integers), r = x - k ln 2 (ln 2 in two parts, the first with 9
 * significant bits so k times it is exact), e^r by its Taylor series to degree 7 (|r| <= ln2 / 2: truncation error
 * < 6e-9 relative), times 2^k built in the exponent field: within about 1e-7 of e^x (1 ulp). Below -87 (under fp32's
 * normal range, weights < 2^-125 of the largest) and NaN (a NaN logit, never drawn): 0. */
static inline float exp_le0(float x) {
    const float tb = x * 1.44269504088896341f + 12582912.0f;
    int32_t k;
    memcpy(&k, &tb, sizeof k);
    k -= 0x4B400000;
    const int32_t low = -(int32_t)(k < -126); /* masks, not branches */
    k = (k & ~low) | (-126 & low);
    const float kf = (float)k;
    const float r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;
    float p = 1.0f + r * (1.0f / 7.0f);
    p = 1.0f + r * (1.0f / 6.0f) * p;
    p = 1.0f + r * (1.0f / 5.0f) * p;
    p = 1.0f + r * (1.0f / 4.0f) * p;
    p = 1.0f + r * (1.0f / 3.0f) * p;
    p = 1.0f + r * (1.0f / 2.0f) * p;
    p = 1.0f + r * p;
    const int32_t e = (int32_t)((uint32_t)(k + 127) << 23); /* unsigned: a NaN x gives any k */
    float sc, y = 0.0f;
    memcpy(&sc, &e, sizeof sc);
    const float v = p * sc;
    int32_t vb;
    memcpy(&vb, &v, sizeof vb);
    vb &= -(int32_t)(x >= -87.0f);
    memcpy(&y, &vb, sizeof y);
    return y;
}

/* w[i] = exp(lg[i] / temp - mv) for one block of SB tokens (separate arrays: the loop vectorizes) */
static void block_weights(float *restrict w, const float *restrict lg, float temp, float mv) {
    for (int i = 0; i < SB; i++) w[i] = exp_le0(lg[i] / temp - mv);
}

/* Restore the max-heap order by cand_cmp (its root: the worst of the k) below position p of c[0..k). */
static void sift_down(struct cand *c, int k, int p) {
    for (;;) {
        int ch = 2 * p + 1;
        if (ch >= k) return;
        if (ch + 1 < k && cand_cmp(&c[ch + 1], &c[ch]) > 0) ch++;
        if (cand_cmp(&c[ch], &c[p]) <= 0) return;
        const struct cand t = c[p];
        c[p] = c[ch];
        c[ch] = t;
        p = ch;
    }
}

/* The best k candidates (v = logit / temperature; order: v descending, ties -> lower id) into c[0..k), best first:
 * a heap of the k best so far (the worst at its root), replaced only by a better candidate; O(n + k log k) for the
 * few candidates that enter. The same k candidates in the same order as sorting all n. */
static void top_k_sorted(struct cand *c, const float *logits, int n, float temp, int k) {
    for (int i = 0; i < k; i++) { c[i].v = logits[i] / temp; c[i].id = i; }
    for (int r = k / 2 - 1; r >= 0; r--) sift_down(c, k, r);
    for (int i = k; i < n; i++) {
        const struct cand x = {logits[i] / temp, i};
        if (cand_cmp(&x, &c[0]) >= 0) continue; /* not better than the worst kept */
        c[0] = x;
        sift_down(c, k, 0);
    }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

/* The tokens a sampler draws from and their weights (dist). */
typedef struct {
    int mode;   /* 0: s->c[0..n) (top-k), weight exp(c.v - m); 1: every token, weight s->w[i]; 2: s->ix[0..n), s->w[ix] */
    int n;
    double m;   /* the largest v (mode 0) */
    double sum; /* the kept weights' sum (mode 1: of the block sums s->bs in order) */
} distr;

/* The kept tokens' weights summed in order (modes 0 and 2). */
static double kept_sum(const df_sampler *s, const distr *d) {
    double sum = 0;
    if (d->mode == 0)
        for (int i = 0; i < d->n; i++) sum += exp((double)s->c[i].v - d->m);
    else
        for (int i = 0; i < d->n; i++) sum += s->w[s->ix[i]];
    return sum;
}

/* top-p over every token (weights s->w, total `total`): the nucleus, the tokens of the shortest prefix of the order
 * (weight descending, ties -> lower id) whose weight reaches top_p x total, into s->ix[0..return) (in no particular
 * order) without sorting: a selection by weight (three-way partitions around a pivot weight, keeping the side that
 * holds the cut; expected O(n)), then among the tokens of the cut's weight the lowest ids. */
static int nucleus(df_sampler *s, int n, double total) {
    int32_t *ix = s->ix;
    const float *w = s->w;
    int hi = 0, nan_at = n; /* NaN weights (NaN logits) at the end, never kept */
    for (int i = 0; i < n; i++)
        if (w[i] == w[i]) ix[hi++] = i;
        else ix[--nan_at] = i;
    const double target = (double)s->o.top_p * total;
    double above = 0; /* the weight of ix[0..lo): tokens heavier than every one in [lo, hi) */
    int lo = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    while (lo < hi) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        const float pw = w[ix[lo + (int)((rng >> 33) % (uint64_t)(hi - lo))]];
        /* [lo, g) heavier than pw, [g, e) equal, [e, hi) lighter */
        int g = lo, e = lo, l = hi;
        while (e < l) {
            const int32_t t = ix[e];
            if (w[t] > pw) { ix[e] = ix[g]; ix[g++] = t; e++; }
            else if (w[t] == pw) e++;
            else { ix[e] = ix[--l]; ix[l] = t; }
        }
        double mg = 0, me = 0;
        for (int i = lo; i < g; i++) mg += w[ix[i]];
        for (int i = g; i < e; i++) me += w[ix[i]];
        if (g > lo && above + mg >= target) { hi = g; continue; } /* the cut is among the heavier ones */
        if (above + mg + me >= target) { /* among the ties: the lowest ids until the target */
            int cnt = e - g;
            for (int i = g + 1; i < e; i++) /* insertion sort by id (ties are few, or all the same weight) */
                for (int j = i; j > g && ix[j - 1] > ix[j]; j--) { const int32_t t = ix[j]; ix[j] = ix[j - 1]; ix[j - 1] = t; }
            double acc = above + mg;
            for (int i = g; i < e; i++) {
                acc += pw;
                if (acc >= target) { cnt = i - g + 1; break; }
            }
            return g + cnt;
        }
        above += mg + me;
        lo = e;
    }
    return lo > 0 ? lo : n;
}

/* The distribution a sampler draws from (temperature, then top-k, then top-p; Holtzman et al. 2019 for top-p), with
 * v_i = logit_i / temperature and m the largest v:
 *   - top-k on (0 < top_k < n): the k best candidates sorted best first into s->c, their weights exp(v - m) (double)
 *     summed in that order; with top-p the shortest prefix whose weights (each over that sum, added in order) reach
 *     top_p is kept and summed again (mode 0).
 *   - else: every weight w_i = exp(v_i - m) in fp32 (exp_le0) into s->w, summed per block of SB tokens into s->bs and
 *     the blocks in order: without top-p every token is kept (mode 1); with it, the nucleus (mode 2).
 * No sort of the whole vocabulary: O(n) plus the top-k candidates' sort. 0: out of memory. */
static int dist(df_sampler *s, const float *logits, int n, distr *d) {
    if (!reserve(s, n)) return 0;
    const float temp = s->o.temperature;
    const int top_p = s->o.top_p > 0.0f && s->o.top_p < 1.0f;
    if (s->o.top_k > 0 && s->o.top_k < n) {
        d->mode = 0;
        d->n = s->o.top_k;
        top_k_sorted(s->c, logits, n, temp, d->n);
        d->m = s->c[0].v;
        d->sum = kept_sum(s, d);
        if (top_p) {
            double acc = 0;
            for (int i = 0; i < d->n; i++) {
                acc += exp((double)s->c[i].v - d->m) / d->sum;
                if (acc >= s->o.top_p) { d->n = i + 1; break; }
            }
            d->sum = kept_sum(s, d);
        }
        return 1;
    }
    /* loops of fixed length over whole blocks (which the compiler vectorizes at -O2), the rest one by one */
    const int nb = n / SB;
    float mv = -INFINITY, ml[16];
    for (int j = 0; j < 16; j++) ml[j] = -INFINITY;
    for (int b = 0; b < nb; b++)
        for (int i = b * SB; i < (b + 1) * SB; i += 16)
            for (int j = 0; j < 16; j++) {
                const float v = logits[i + j] / temp;
                ml[j] = v > ml[j] ? v : ml[j];
            }
    for (int j = 0; j < 16; j++) mv = ml[j] > mv ? ml[j] : mv;
    for (int i = nb * SB; i < n; i++) {
        const float v = logits[i] / temp;
        mv = v > mv ? v : mv;
    }
    double total = 0;
    for (int b = 0; b * SB < n; b++) {
        const int i0 = b * SB, i1 = b < nb ? i0 + SB : n;
        double bsum = 0;
        if (b < nb) {
            block_weights(s->w + i0, logits + i0, temp, mv);
            double part[8] = {0}; /* eight running sums (token i in sum i % 8), added in order */
            for (int i = i0; i < i0 + SB; i += 8)
                for (int j = 0; j < 8; j++) part[j] += s->w[i + j];
            for (int j = 0; j < 8; j++) bsum += part[j];
        } else {
            for (int i = i0; i < i1; i++) bsum += (s->w[i] = exp_le0(logits[i] / temp - mv));
        }
        s->bs[b] = bsum;
        total += bsum;
    }
    d->m = mv;
    if (!top_p) {
        d->mode = 1;
        d->n = n;
        d->sum = total;
        return 1;
    }
    d->mode = 2;
    d->n = nucleus(s, n, total);
    d->sum = kept_sum(s, d);
    return 1;
}

int32_t df_sample(df_sampler *s, const float *logits, int n_vocab) {
    if (!s || s->o.temperature <= 0.0f || s->o.top_k == 1) return argmax(logits, n_vocab);
    distr d;
    if (!dist(s, logits, n_vocab, &d)) return argmax(logits, n_vocab);
    const double u = (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0) * d.sum;
    double acc = 0;
    if (d.mode == 1) { /* every token in index order: the block holding u, then its token */
        for (int b = 0; b * SB < n_vocab; b++) {
            if (u < acc + s->bs[b]) {
                double a2 = acc;
                for (int i = b * SB; i < n_vocab && i < (b + 1) * SB; i++) {
                    a2 += s->w[i];
                    if (u < a2) return i;
                }
            }
            acc += s->bs[b];
        }
        for (int i = n_vocab - 1; i >= 0; i--) /* u at the total (rounding): the last token with weight */
            if (s->w[i] > 0) return i;
        return argmax(logits, n_vocab);
    }
    if (d.mode == 2) {
        for (int i = 0; i < d.n; i++) {
            acc += s->w[s->ix[i]];
            if (u < acc) return s->ix[i];
        }
        return s->ix[d.n - 1];
    }
    for (int i = 0; i < d.n; i++) {
        acc += exp((double)s->c[i].v - d.m);
        if (u < acc) return s->c[i].id;
    }
    return s->c[d.n - 1].id;
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
    distr d; /* the candidates, cut and weights of df_sample */
    if (!dist(s, logits, n_vocab, &d)) { probs[argmax(logits, n_vocab)] = 1.0f; return; }
    if (d.mode == 1)
        for (int i = 0; i < n_vocab; i++) probs[i] = (float)(s->w[i] / d.sum);
    else if (d.mode == 2)
        for (int i = 0; i < d.n; i++) probs[s->ix[i]] = (float)(s->w[s->ix[i]] / d.sum);
    else
        for (int i = 0; i < d.n; i++) probs[s->c[i].id] = (float)(exp((double)s->c[i].v - d.m) / d.sum);
}

double df_sampler_uniform(df_sampler *s) { return (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0); }
