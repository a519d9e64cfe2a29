/* tok_bpe.c — byte-pair encoding of one pre-token.
 *
 * Merging follows HF tokenizers' BPE (models/bpe/word.rs merge_all) and
 * tiktoken's _byte_pair_merge, which agree: repeatedly merge the adjacent pair
 * with the lowest rank, leftmost first on ties. Implemented with a binary heap
 * of candidate pairs over a doubly linked list of symbols, so a word of n
 * symbols costs O(n log n) (no quadratic blow-up on megabyte-long pieces).
 * Stale heap entries are detected by re-checking the symbol ids.
 * A per-call cache maps short words to their ids (most text repeats words). */
#include "tok_internal.h"
#include <stdlib.h>
#include <string.h>

struct tok_cache {
    tok_map map;       /* word -> offset into ids pool */
    tok_ids pool;      /* [count, ids...] */
    /* scratch */
    int32_t *sid, *prev, *next;
    uint64_t *heap;    /* (rank << 32 | position) of candidate merges: min = lowest rank, leftmost */
    size_t scap, hcap;
};

#define CACHE_MAX_WORD 96
#define CACHE_MAX_ENTS (1u << 20)

tok_cache *tok_cache_new(void) {
    tok_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    tok_map_init(&c->map, 4096);
    return c;
}

void tok_cache_free(tok_cache *c) {
    if (!c) return;
    tok_map_free(&c->map);
    free(c->pool.v); free(c->sid); free(c->prev); free(c->next); free(c->heap);
    free(c);
}

static int scratch(tok_cache *c, size_t n) {
    if (n > c->scap) {
        size_t nc = c->scap ? c->scap : 256;
        while (nc < n) nc *= 2;
        int32_t *a = realloc(c->sid, nc * sizeof *a); if (!a) return DF_ENOMEM; c->sid = a;
        a = realloc(c->prev, nc * sizeof *a); if (!a) return DF_ENOMEM; c->prev = a;
        a = realloc(c->next, nc * sizeof *a); if (!a) return DF_ENOMEM; c->next = a;
        uint64_t *h = realloc(c->heap, nc * 2 * sizeof *h); if (!h) return DF_ENOMEM; c->heap = h;
        c->scap = nc; c->hcap = nc * 2;
    }
    return 0;
}

/* 4-ary min-heap of 64-bit keys (one cache line holds a node's children). */
static int heap_push(tok_cache *c, size_t *hn, uint64_t e) {
    if (*hn == c->hcap) {
        size_t nc = c->hcap * 2;
        uint64_t *h = realloc(c->heap, nc * sizeof *h);
        if (!h) return DF_ENOMEM;
        c->heap = h; c->hcap = nc;
    }
    uint64_t *h = c->heap;
    size_t i = (*hn)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h[p] <= e) break;
        h[i] = h[p]; i = p;
    }
    h[i] = e;
    return 0;
}

static uint64_t heap_pop(tok_cache *c, size_t *hn) {
    uint64_t *h = c->heap, top = h[0], last = h[--(*hn)];
    size_t i = 0, n = *hn;
    for (;;) {
        size_t f = 4 * i + 1, m = i;
        uint64_t best = last;
        for (size_t k = f; k < f + 4 && k < n; k++) if (h[k] < best) { best = h[k]; m = k; }
        if (m == i) break;
        h[i] = h[m]; i = m;
    }
    if (n) h[i] = last;
    return top;
}

#define HKEY(rank, pos) (((uint64_t)(uint32_t)(rank) << 32) | (uint32_t)(pos))

/* Initial symbols of a word. */
static int initial_symbols(const df_tokenizer *t, const char *w, size_t n, tok_cache *c, size_t *ns) {
    int rc = scratch(c, n + 1);
    if (rc) return rc;
    size_t k = 0;
    const uint8_t *u = (const uint8_t *)w;
    if (t->byte_level) {
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[u[i]];
            if (id < 0) id = t->unk_id;
            if (id >= 0) c->sid[k++] = id;
        }
    } else {
        size_t i = 0;
        while (i < n) {
            int l = tok_utf8_valid_len(u + i, n - i);
            if (!l) l = 1;
            int32_t id = tok_map_get(&t->vocab, w + i, l);
            if (id >= 0) c->sid[k++] = id;
            else if (t->byte_fallback) {
                for (int j = 0; j < l; j++) {
                    int32_t b = t->byte_id[u[i + j]];
                    if (b >= 0) c->sid[k++] = b;
                    else if (t->unk_id >= 0) c->sid[k++] = t->unk_id;
                }
            } else if (t->unk_id >= 0) c->sid[k++] = t->unk_id;
            i += l;
        }
    }
    *ns = k;
    return 0;
}

static int bpe_merge(const df_tokenizer *t, tok_cache *c, size_t n, tok_ids *out) {
    int32_t *id = c->sid, *prev = c->prev, *next = c->next;
    for (size_t i = 0; i < n; i++) { prev[i] = (int32_t)i - 1; next[i] = (i + 1 < n) ? (int32_t)i + 1 : -1; }
    size_t hn = 0;
    int32_t r, m;
    for (size_t i = 0; i + 1 < n; i++)
        if (tok_pairs_get(&t->pairs, id[i], id[i + 1], &r, &m) && heap_push(c, &hn, HKEY(r, i))) return DF_ENOMEM;
    while (hn) {
        uint64_t e = heap_pop(c, &hn);
        int32_t p = (int32_t)(uint32_t)e, q = next[p];
        /* stale entries: the pair now at p must still merge with this rank */
        if (id[p] < 0 || q < 0 || !tok_pairs_get(&t->pairs, id[p], id[q], &r, &m) || (uint32_t)r != (uint32_t)(e >> 32))
            continue;
        id[p] = m;
        int32_t qn = next[q];
        next[p] = qn;
        if (qn >= 0) prev[qn] = p;
        id[q] = -1;
        int32_t pp = prev[p];
        if (pp >= 0 && tok_pairs_get(&t->pairs, id[pp], id[p], &r, &m) && heap_push(c, &hn, HKEY(r, pp))) return DF_ENOMEM;
        if (qn >= 0 && tok_pairs_get(&t->pairs, id[p], id[qn], &r, &m) && heap_push(c, &hn, HKEY(r, p))) return DF_ENOMEM;
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = next[i])
        if (tok_ids_push(out, id[i])) return DF_ENOMEM;
    return 0;
}

int tok_bpe_word(const df_tokenizer *t, const char *w, size_t n, tok_cache *c, tok_ids *out) {
    if (n == 0) return 0;
    if (t->ignore_merges) {
        int32_t id = tok_map_get(&t->vocab, w, n);
        if (id >= 0) return tok_ids_push(out, id);
    }
    int use_cache = c && n <= CACHE_MAX_WORD;
    if (use_cache) {
        int32_t off = tok_map_get(&c->map, w, n);
        if (off >= 0) return tok_ids_append(out, c->pool.v + off + 1, (size_t)c->pool.v[off]);
    }
    size_t ns;
    int rc = initial_symbols(t, w, n, c, &ns);
    if (rc) return rc;
    size_t start = out->n;
    rc = bpe_merge(t, c, ns, out);
    if (rc) return rc;
    if (use_cache && c->map.n < CACHE_MAX_ENTS) {
        size_t cnt = out->n - start;
        int32_t off = (int32_t)c->pool.n;
        if (tok_ids_push(&c->pool, (int32_t)cnt)) return DF_ENOMEM;
        if (tok_ids_append(&c->pool, out->v + start, cnt)) return DF_ENOMEM;
        if (tok_map_put(&c->map, w, n, off)) return DF_ENOMEM;
    }
    return 0;
}

/* tiktoken ranks: token c (rank r) is the merge of every split c = a | b where
 * a and b are tokens; the merge's rank is r. */
int tok_bpe_pairs_from_ranks(df_tokenizer *t) {
    tok_pairs_init(&t->pairs, (size_t)t->vocab.n * 4);
    if (!t->pairs.keys) return DF_ENOMEM;
    for (size_t e = 0; e < t->vocab.n; e++) {
        const struct tok_map_ent *en = &t->vocab.ents[e];
        const char *s = t->vocab.arena + en->off;
        for (uint32_t k = 1; k < en->len; k++) {
            int32_t a = tok_map_get(&t->vocab, s, k);
            if (a < 0) continue;
            int32_t b = tok_map_get(&t->vocab, s + k, en->len - k);
            if (b < 0) continue;
            if (tok_pairs_put(&t->pairs, a, b, en->val, en->val)) return DF_ENOMEM;
        }
    }
    return 0;
}
