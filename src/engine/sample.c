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
    struct cand { float v; int32_t id; } *c; /* candidates [cap] */
    double *w;                               /* weights [cap] */
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
    free(s->w);
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

/* Room for n candidates and n weights; 0 when out of memory. */
static int reserve(df_sampler *s, int n) {
    if (s->cap >= n) return 1;
    struct cand *c = realloc(s->c, sizeof *c * (size_t)n);
    if (!c) return 0;
    s->c = c;
    double *w = realloc(s->w, sizeof *w * (size_t)n);
    if (!w) return 0;
    s->w = w;
    s->cap = n;
    return 1;
}

/* The best k candidates (v = logit / temperature; order: v descending, ties -> lower id) into c[0..k), best first:
 * a heap of the k best so far (the worst at its root), replaced only by a better candidate; O(n + k log k) for the
 * few candidates that enter. The same k candidates in the same order as sorting all n. */
static void top_k_sorted(struct cand *c, const float *logits, int n, float temp, int k) {
    for (int i = 0; i < k; i++) { c[i].v = logits[i] / temp; c[i].id = i; }
    /* a max-heap by cand_cmp: its root is the worst of the k */
    for (int r = k / 2 - 1; r >= 0; r--)
        for (int p = r;;) {
            int ch = 2 * p + 1;
            if (ch >= k) break;
            if (ch + 1 < k && cand_cmp(&c[ch + 1], &c[ch]) > 0) ch++;
            if (cand_cmp(&c[ch], &c[p]) <= 0) break;
            struct cand t = c[p]; c[p] = c[ch]; c[ch] = t;
            p = ch;
        }
    for (int i = k; i < n; i++) {
        const struct cand x = {logits[i] / temp, i};
        if (cand_cmp(&x, &c[0]) >= 0) continue; /* not better than the worst kept */
        c[0] = x;
        for (int p = 0;;) {
            int ch = 2 * p + 1;
            if (ch >= k) break;
            if (ch + 1 < k && cand_cmp(&c[ch + 1], &c[ch]) > 0) ch++;
            if (cand_cmp(&c[ch], &c[p]) <= 0) break;
            struct cand t = c[p]; c[p] = c[ch]; c[ch] = t;
            p = ch;
        }
    }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

/* The distribution a sampler draws from (temperature, then top-k, then top-p; Holtzman et al. 2019 for top-p), with
 * v_i = logit_i / temperature and m the largest v:
 *   - top-k on (0 < top_k < n): the k best candidates sorted best first into s->c, their weights exp(v - m) summed in
 *     that order; with top-p the shortest prefix whose weights (each over that sum, added in order) reach top_p is
 *     kept and summed again. Returns the kept count, *sum their weight.
 *   - else: every weight w_i = exp(v_i - m) into s->w and *sum = their sum in index order; with top-p on, the
 *     candidates are sorted best first into s->c band by band (weights in [2^-8, 1], then [2^-16, 2^-8), ...: a
 *     prefix of the full order) until they reach top_p, the shortest prefix whose weights over *sum reach top_p is
 *     kept and summed again in that order (return: its count). Without top-p: -1 (every token kept, in index
 *     order). No sort of the whole vocabulary: O(n) plus the kept candidates' sort.
 * 0: out of memory. */
static int dist(df_sampler *s, const float *logits, int n, double *m_out, double *sum_out) {
    if (!reserve(s, n)) return 0;
    const float temp = s->o.temperature;
    const int top_p = s->o.top_p > 0.0f && s->o.top_p < 1.0f;
    double m, sum = 0;
    int keep;
    if (s->o.top_k > 0 && s->o.top_k < n) {
        keep = s->o.top_k;
        top_k_sorted(s->c, logits, n, temp, keep);
        m = s->c[0].v;
        for (int i = 0; i < keep; i++) sum += exp((double)s->c[i].v - m);
        if (top_p) {
            double acc = 0;
            for (int i = 0; i < keep; i++) {
                acc += exp((double)s->c[i].v - m) / sum;
                if (acc >= s->o.top_p) { keep = i + 1; break; }
            }
        }
    } else {
        float mv = -INFINITY;
        for (int i = 0; i < n; i++) {
            const float v = logits[i] / temp;
            if (v > mv) mv = v;
        }
        m = mv;
        for (int i = 0; i < n; i++) sum += (s->w[i] = exp((double)(logits[i] / temp) - m));
        if (!top_p) {
            *m_out = m;
            *sum_out = sum;
            return -1;
        }
        /* bands of weight [tau, hi), tau = 2^-8, 2^-16, ... (the last: everything below hi): each band sorted after
         * the ones above it, so c[0..nc) is always a prefix of the full order */
        keep = 0;
        int nc = 0;
        double acc = 0, hi = INFINITY;
        for (double tau = 0x1p-8;; hi = tau, tau *= 0x1p-8) {
            const int last = tau < 0x1p-1000, start = nc;
            for (int i = 0; i < n; i++)
                if (s->w[i] < hi && (s->w[i] >= tau || last)) s->c[nc++] = (struct cand){logits[i] / temp, i};
            qsort(s->c + start, (size_t)(nc - start), sizeof *s->c, cand_cmp);
            for (int i = start; i < nc && !keep; i++) {
                acc += exp((double)s->c[i].v - m) / sum;
                if (acc >= s->o.top_p) keep = i + 1;
            }
            if (keep || last) {
                if (!keep) keep = nc;
                break;
            }
        }
    }
    sum = 0;
    for (int i = 0; i < keep; i++) sum += exp((double)s->c[i].v - m);
    *m_out = m;
    *sum_out = sum;
    return keep;
}

int32_t df_sample(df_sampler *s, const float *logits, int n_vocab) {
    if (!s || s->o.temperature <= 0.0f || s->o.top_k == 1) return argmax(logits, n_vocab);
    double m, sum;
    const int n = dist(s, logits, n_vocab, &m, &sum);
    if (!n) return argmax(logits, n_vocab);
    double u = (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0) * sum, acc = 0;
    if (n < 0) { /* every token, in index order */
        int32_t last = argmax(logits, n_vocab);
        for (int i = 0; i < n_vocab; i++) {
            if (s->w[i] > 0) last = i;
            acc += s->w[i];
            if (u < acc) return i;
        }
        return last;
    }
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
    double m, sum;
    const int n = dist(s, logits, n_vocab, &m, &sum); /* the candidates, cut and weights of df_sample */
    if (!n) { probs[argmax(logits, n_vocab)] = 1.0f; return; }
    if (n < 0) {
        for (int i = 0; i < n_vocab; i++) probs[i] = (float)(s->w[i] / sum);
        return;
    }
    for (int i = 0; i < n; i++) probs[s->c[i].id] = (float)(exp((double)s->c[i].v - m) / sum);
}

double df_sampler_uniform(df_sampler *s) { return (double)(xoshiro(s->s) >> 11) * (1.0 / 9007199254740992.0); }
