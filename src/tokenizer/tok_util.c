/* tok_util.c — small building blocks of the tokenizer: byte-string and pair
 * hash maps, growable buffers, UTF-8 validation/repair, the id -> bytes table. */
#include "tok_internal.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

void tok_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || !errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

uint64_t tok_hash_bytes(const void *p, size_t n) { return XXH3_64bits(p, n); }

/* ------------------------------------------------------------------ tok_map */

void tok_map_init(tok_map *m, size_t expect) {
    memset(m, 0, sizeof *m);
    size_t cap = 16;
    while (cap < expect * 2) cap <<= 1;
    m->cap = cap;
    m->slots = calloc(cap, sizeof *m->slots);
}

void tok_map_free(tok_map *m) {
    free(m->slots); free(m->ents); free(m->arena);
    memset(m, 0, sizeof *m);
}

static void map_insert_slot(tok_map *m, uint64_t h, uint32_t idx) {
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->slots[i]) i = (i + 1) & mask;
    m->slots[i] = idx + 1;
}

int tok_map_put(tok_map *m, const void *key, size_t len, int32_t val) {
    if (!m->slots) return DF_ENOMEM;
    uint64_t h = tok_hash_bytes(key, len);
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->slots[i]) {
        struct tok_map_ent *e = &m->ents[m->slots[i] - 1];
        if (e->h == h && e->len == len && memcmp(m->arena + e->off, key, len) == 0) { e->val = val; return 0; }
        i = (i + 1) & mask;
    }
    if ((m->n + 1) * 2 > m->cap) {
        size_t ncap = m->cap * 2;
        uint32_t *ns = calloc(ncap, sizeof *ns);
        if (!ns) return DF_ENOMEM;
        free(m->slots); m->slots = ns; m->cap = ncap;
        for (size_t k = 0; k < m->n; k++) map_insert_slot(m, m->ents[k].h, (uint32_t)k);
    }
    if (m->n == m->ents_cap) {
        size_t nc = m->ents_cap ? m->ents_cap * 2 : 1024;
        void *ne = realloc(m->ents, nc * sizeof *m->ents);
        if (!ne) return DF_ENOMEM;
        m->ents = ne; m->ents_cap = nc;
    }
    if (m->arena_len + len + 1 > m->arena_cap) {
        size_t nc = m->arena_cap ? m->arena_cap * 2 : 65536;
        while (nc < m->arena_len + len + 1) nc *= 2;
        char *na = realloc(m->arena, nc);
        if (!na) return DF_ENOMEM;
        m->arena = na; m->arena_cap = nc;
    }
    memcpy(m->arena + m->arena_len, key, len);
    struct tok_map_ent *e = &m->ents[m->n];
    e->h = h; e->off = (uint32_t)m->arena_len; e->len = (uint32_t)len; e->val = val;
    m->arena_len += len;
    map_insert_slot(m, h, (uint32_t)m->n);
    m->n++;
    return 0;
}

int32_t tok_map_get(const tok_map *m, const void *key, size_t len) {
    if (!m->slots) return -1;
    uint64_t h = tok_hash_bytes(key, len);
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->slots[i]) {
        const struct tok_map_ent *e = &m->ents[m->slots[i] - 1];
        if (e->h == h && e->len == len && memcmp(m->arena + e->off, key, len) == 0) return e->val;
        i = (i + 1) & mask;
    }
    return -1;
}

/* ---------------------------------------------------------------- tok_pairs */

void tok_pairs_init(tok_pairs *p, size_t expect) {
    size_t cap = 16;
    while (cap < expect * 2) cap <<= 1;
    p->cap = cap; p->n = 0;
    p->keys = calloc(cap, sizeof *p->keys);
    p->rank = malloc(cap * sizeof *p->rank);
    p->merged = malloc(cap * sizeof *p->merged);
}

void tok_pairs_free(tok_pairs *p) {
    free(p->keys); free(p->rank); free(p->merged);
    memset(p, 0, sizeof *p);
}

static void pairs_raw_put(tok_pairs *p, uint64_t k, int32_t rank, int32_t merged, int keep_lower) {
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = p->cap - 1, i = (size_t)(h >> 20) & mask;
    while (p->keys[i] && p->keys[i] != k) i = (i + 1) & mask;
    if (p->keys[i] == k) {
        if (!keep_lower || rank < p->rank[i]) { p->rank[i] = rank; p->merged[i] = merged; }
        return;
    }
    p->keys[i] = k; p->rank[i] = rank; p->merged[i] = merged; p->n++;
}

int tok_pairs_put(tok_pairs *p, int32_t a, int32_t b, int32_t rank, int32_t merged) {
    if (!p->keys || !p->rank || !p->merged) return DF_ENOMEM;
    if ((p->n + 1) * 2 > p->cap) {
        tok_pairs q;
        tok_pairs_init(&q, p->cap);
        if (!q.keys || !q.rank || !q.merged) { tok_pairs_free(&q); return DF_ENOMEM; }
        for (size_t i = 0; i < p->cap; i++)
            if (p->keys[i]) pairs_raw_put(&q, p->keys[i], p->rank[i], p->merged[i], 0);
        tok_pairs_free(p);
        *p = q;
    }
    /* The first (lowest-rank) definition of a pair wins, as in HF merges. */
    pairs_raw_put(p, (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1, rank, merged, 1);
    return 0;
}

/* ------------------------------------------------------------------ buffers */

int tok_ids_push(tok_ids *a, int32_t x) {
    if (a->n == a->cap) {
        size_t nc = a->cap ? a->cap * 2 : 64;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return DF_ENOMEM;
        a->v = nv; a->cap = nc;
    }
    a->v[a->n++] = x;
    return 0;
}

int tok_ids_append(tok_ids *a, const int32_t *x, size_t n) {
    if (a->n + n > a->cap) {
        size_t nc = a->cap ? a->cap : 64;
        while (nc < a->n + n) nc *= 2;
        int32_t *nv = realloc(a->v, nc * sizeof *nv);
        if (!nv) return DF_ENOMEM;
        a->v = nv; a->cap = nc;
    }
    memcpy(a->v + a->n, x, n * sizeof *x);
    a->n += n;
    return 0;
}

int tok_buf_put(tok_buf *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) return DF_ENOMEM;
        b->p = np; b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
int tok_buf_puts(tok_buf *b, const char *s) { return tok_buf_put(b, s, strlen(s)); }
int tok_buf_putc(tok_buf *b, char c) { return tok_buf_put(b, &c, 1); }

int tok_spans_push(tok_spans *s, size_t off, size_t len) {
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 64;
        tok_span *nv = realloc(s->v, nc * sizeof *nv);
        if (!nv) return DF_ENOMEM;
        s->v = nv; s->cap = nc;
    }
    s->v[s->n].off = off; s->v[s->n].len = len; s->n++;
    return 0;
}

/* -------------------------------------------------------------------- UTF-8 */

int tok_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    if (c < 0xC2) return 0;
    if (c < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
    if (c < 0xF0) {
        if (n < 3) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80) return 0;
        return 3;
    }
    if (c < 0xF5) {
        if (n < 4) return 0;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
        if (s[1] < lo || s[1] > hi || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
        return 4;
    }
    return 0;
}

int tok_utf8_bad_len(const uint8_t *s, size_t n) {
    uint8_t c = s[0];
    int need;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c < 0xE0) need = 2;
    else if (c >= 0xE0 && c < 0xF0) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c < 0xF5) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 1;
    size_t i = 1;
    if (i < n && s[i] >= lo && s[i] <= hi) {
        i++;
        while (i < (size_t)need && i < n && (s[i] & 0xC0) == 0x80) i++;
    }
    return (int)i;
}

int32_t tok_utf8_decode(const uint8_t *s, int len) {
    switch (len) {
    case 1: return s[0];
    case 2: return ((s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    case 3: return ((s[0] & 0x0F) << 12) | ((s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    default: return ((s[0] & 0x07) << 18) | ((s[1] & 0x3F) << 12) | ((s[2] & 0x3F) << 6) | (s[3] & 0x3F);
    }
}

int tok_utf8_encode(int32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len) {
    /* Worst case: every byte becomes 3 bytes of U+FFFD. */
    char *o = malloc(n * 3 + 1);
    if (!o) return NULL;
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, k = 0;
    while (i < n) {
        if (u[i] < 0x80) { o[k++] = (char)u[i++]; continue; }
        int l = tok_utf8_valid_len(u + i, n - i);
        if (l) { memcpy(o + k, u + i, l); k += l; i += l; continue; }
        i += tok_utf8_bad_len(u + i, n - i);
        memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3;
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

/* --------------------------------------------------------------- id table */

int tok_ensure_ids(df_tokenizer *t, int32_t n) {
    if (n <= t->n_vocab) return 0;
    if (n > t->ids_cap) {
        int32_t cap = t->ids_cap ? t->ids_cap : 1024;
        while (cap < n) cap *= 2;
        uint32_t *o = realloc(t->tok_off, (size_t)cap * sizeof *o);
        if (!o) return DF_ENOMEM;
        t->tok_off = o;
        uint32_t *l = realloc(t->tok_len, (size_t)cap * sizeof *l);
        if (!l) return DF_ENOMEM;
        t->tok_len = l;
        uint8_t *f = realloc(t->tok_flags, (size_t)cap);
        if (!f) return DF_ENOMEM;
        t->tok_flags = f;
        t->ids_cap = cap;
    }
    for (int32_t i = t->n_vocab; i < n; i++) { t->tok_off[i] = 0; t->tok_len[i] = 0; t->tok_flags[i] = 0; }
    t->n_vocab = n;
    return 0;
}

int tok_set_token(df_tokenizer *t, int32_t id, const void *bytes, size_t len, int flags) {
    if (id < 0) return DF_EINVAL;
    int rc = tok_ensure_ids(t, id + 1);
    if (rc) return rc;
    if (t->pool_len + len > t->pool_cap) {
        size_t nc = t->pool_cap ? t->pool_cap * 2 : (1 << 20);
        while (nc < t->pool_len + len) nc *= 2;
        char *np = realloc(t->pool, nc);
        if (!np) return DF_ENOMEM;
        t->pool = np; t->pool_cap = nc;
    }
    memcpy(t->pool + t->pool_len, bytes, len);
    t->tok_off[id] = (uint32_t)t->pool_len;
    t->tok_len[id] = (uint32_t)len;
    t->tok_flags[id] = (uint8_t)(flags | TOK_F_PRESENT);
    t->pool_len += len;
    return 0;
}
