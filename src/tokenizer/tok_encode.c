/* tok_encode.c — text -> ids: the encode pipeline.
 *
 * Order (HF tokenizers TokenizerImpl::encode_single_sequence; tiktoken
 * CoreBPE::encode): invalid UTF-8 is first replaced by U+FFFD (maximal
 * subparts, like Python's bytes.decode('utf-8', 'replace')); added tokens are
 * cut out (leftmost, longest; special ones only with DF_TOK_PARSE_SPECIAL);
 * each remaining segment is normalized, pre-tokenized and BPE-encoded.
 * tiktoken files with Kimi's pattern also get Kimi's slicing (400k-character
 * chunks; runs of whitespace / non-whitespace capped at 25k characters, by
 * Python str.isspace) as tokenization_kimi.py does. */
#include "tok_internal.h"
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

typedef struct {
    const df_tokenizer *t;
    tok_cache *cache;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    pcre2_match_data *md;
    tok_spans sa, sb;
    tok_buf norm, work;
    char *err; size_t errlen;
} enc_ctx;

static int cmp_desc(const void *a, const void *b) { return *(const int *)b - *(const int *)a; }

int tok_build_added_index(df_tokenizer *t) {
    tok_map_init(&t->added_map, (size_t)t->n_added + 8);
    memset(t->added_first, 0, sizeof t->added_first);
    free(t->added_lens);
    t->added_lens = malloc(((size_t)t->n_added + 1) * sizeof(int));
    if (!t->added_lens) return DF_ENOMEM;
    t->n_added_lens = 0;
    for (int i = 0; i < t->n_added; i++) {
        tok_added *a = &t->added[i];
        if (!a->len) continue;
        if (tok_map_put(&t->added_map, a->content, a->len, i)) return DF_ENOMEM;
        t->added_first[(uint8_t)a->content[0]] = 1;
        int seen = 0;
        for (int k = 0; k < t->n_added_lens; k++) if (t->added_lens[k] == (int)a->len) seen = 1;
        if (!seen) t->added_lens[t->n_added_lens++] = (int)a->len;
    }
    qsort(t->added_lens, t->n_added_lens, sizeof(int), cmp_desc);
    return 0;
}

/* ------------------------------------------------------------ normalizers */

static int nf_map(const char *s, size_t n, int opts, tok_buf *out) {
    /* ASCII never composes or decomposes: only non-ASCII runs, with the
     * starter before them, go through utf8proc. */
    size_t i = 0;
    while (i < n) {
        size_t j = i;
        while (j < n && (uint8_t)s[j] < 0x80) j++;
        if (j == n) return tok_buf_put(out, s + i, n - i);
        size_t st = j > i ? j - 1 : j;
        if (st > i && tok_buf_put(out, s + i, st - i)) return DF_ENOMEM;
        size_t e = j;
        while (e < n && (uint8_t)s[e] >= 0x80) e++;
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s + st, (utf8proc_ssize_t)(e - st), &dst,
                                          (utf8proc_option_t)opts);
        if (r < 0) { free(dst); return DF_EFORMAT; }
        int rc = tok_buf_put(out, dst, (size_t)r);
        free(dst);
        if (rc) return rc;
        i = e;
    }
    return 0;
}

static int apply_norm(const tok_norm *nm, const char *s, size_t n, tok_buf *out) {
    out->n = 0;
    switch (nm->type) {
    case TOK_NORM_NFC: return nf_map(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
    case TOK_NORM_NFD: return nf_map(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, out);
    case TOK_NORM_NFKC: return nf_map(s, n, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, out);
    case TOK_NORM_NFKD: return nf_map(s, n, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, out);
    case TOK_NORM_LOWERCASE: {
        size_t i = 0;
        while (i < n) {
            int l = tok_utf8_valid_len((const uint8_t *)s + i, n - i);
            if (!l) l = 1;
            char tmp[4];
            int32_t cp = tok_utf8_decode((const uint8_t *)s + i, l);
            int k = tok_utf8_encode(utf8proc_tolower(cp), tmp);
            if (tok_buf_put(out, tmp, k)) return DF_ENOMEM;
            i += l;
        }
        return tok_buf_put(out, "", 0);
    }
    case TOK_NORM_REPLACE: {
        size_t pl = strlen(nm->a), i = 0;
        if (!pl) return tok_buf_put(out, s, n);
        while (i < n) {
            if (i + pl <= n && !memcmp(s + i, nm->a, pl)) { if (tok_buf_puts(out, nm->b)) return DF_ENOMEM; i += pl; }
            else { if (tok_buf_put(out, s + i, 1)) return DF_ENOMEM; i++; }
        }
        return tok_buf_put(out, "", 0);
    }
    case TOK_NORM_PREPEND:
        if (n && tok_buf_puts(out, nm->a)) return DF_ENOMEM;
        return tok_buf_put(out, s, n);
    }
    return DF_EUNSUPPORTED;
}

/* ------------------------------------------------------------ HF segment */

static int split_all(enc_ctx *c, const tok_regex *re, const char *text, int behavior, int invert) {
    c->sb.n = 0;
    for (size_t k = 0; k < c->sa.n; k++) {
        int rc = tok_regex_split(re, c->md, c->mc, text, c->sa.v[k], behavior, invert, &c->sb);
        if (rc) {
            tok_err(c->err, c->errlen, "tokenizer %s: regex matching failed (PCRE2 limit) on a %zu-byte piece",
                    c->t->path ? c->t->path : "", c->sa.v[k].len);
            return rc;
        }
    }
    tok_spans x = c->sa; c->sa = c->sb; c->sb = x;
    return 0;
}

static int encode_hf_segment(enc_ctx *c, const char *s, size_t n, tok_ids *out) {
    const df_tokenizer *t = c->t;
    const char *text = s;
    if (t->n_norms) {
        tok_buf tmp = {0};
        int rc = 0;
        const char *src = s;
        size_t sn = n;
        for (int i = 0; i < t->n_norms && !rc; i++) {
            rc = apply_norm(&t->norms[i], src, sn, &tmp);
            if (rc) break;
            tok_buf x = c->norm; c->norm = tmp; tmp = x;
            src = c->norm.p ? c->norm.p : ""; sn = c->norm.n;
        }
        free(tmp.p);
        if (rc) { tok_err(c->err, c->errlen, "normalizer failed on the input"); return rc; }
        text = src; n = sn;
    }
    c->sa.n = 0;
    if (n == 0) return 0;
    if (tok_spans_push(&c->sa, 0, n)) return DF_ENOMEM;
    for (int p = 0; p < t->n_pretoks; p++) {
        const tok_pretok *pt = &t->pretoks[p];
        int rc = 0;
        switch (pt->type) {
        case TOK_PRE_SPLIT: rc = split_all(c, &pt->re, text, pt->behavior, pt->invert); break;
        case TOK_PRE_DIGITS:
            rc = split_all(c, &pt->re, text, pt->individual ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS, 0);
            break;
        case TOK_PRE_BYTELEVEL:
            if (pt->add_prefix_space) {
                /* prepend ' ' to every piece that does not start with one */
                tok_buf nb = {0};
                c->sb.n = 0;
                for (size_t k = 0; k < c->sa.n; k++) {
                    tok_span sp = c->sa.v[k];
                    size_t off = nb.n;
                    if (sp.len && text[sp.off] != ' ' && tok_buf_putc(&nb, ' ')) { free(nb.p); return DF_ENOMEM; }
                    if (tok_buf_put(&nb, text + sp.off, sp.len)) { free(nb.p); return DF_ENOMEM; }
                    if (tok_spans_push(&c->sb, off, nb.n - off)) { free(nb.p); return DF_ENOMEM; }
                }
                free(c->work.p);
                c->work = nb;
                text = c->work.p ? c->work.p : "";
                tok_spans x = c->sa; c->sa = c->sb; c->sb = x;
            }
            if (pt->use_regex) rc = split_all(c, &pt->re, text, TOK_SPLIT_ISOLATED, 0);
            break;
        }
        if (rc) return rc;
    }
    for (size_t k = 0; k < c->sa.n; k++) {
        int rc = tok_bpe_word(t, text + c->sa.v[k].off, c->sa.v[k].len, c->cache, out);
        if (rc) return rc;
    }
    return 0;
}

/* ------------------------------------------------------ tiktoken segment */

static int py_isspace(int32_t cp) {
    if (cp < 128) return cp == ' ' || (cp >= 9 && cp <= 13) || (cp >= 0x1c && cp <= 0x1f);
    const utf8proc_property_t *p = utf8proc_get_property(cp);
    return p->category == UTF8PROC_CATEGORY_ZS || p->bidi_class == UTF8PROC_BIDI_CLASS_WS ||
           p->bidi_class == UTF8PROC_BIDI_CLASS_B || p->bidi_class == UTF8PROC_BIDI_CLASS_S;
}

static int encode_tt_piece(enc_ctx *c, const char *s, size_t n, tok_ids *out) {
    c->sa.n = 0;
    if (!n) return 0;
    if (tok_spans_push(&c->sa, 0, n)) return DF_ENOMEM;
    /* tiktoken keeps only the regex matches (find_iter) */
    int rc = split_all(c, &c->t->tt_re, s, TOK_SPLIT_REMOVED, 1);
    if (rc) return rc;
    for (size_t k = 0; k < c->sa.n; k++) {
        rc = tok_bpe_word(c->t, s + c->sa.v[k].off, c->sa.v[k].len, c->cache, out);
        if (rc) return rc;
    }
    return 0;
}

static int encode_tt_segment(enc_ctx *c, const char *s, size_t n, tok_ids *out) {
    if (!c->t->tt_kimi_slicing) return encode_tt_piece(c, s, n, out);
    const size_t MAX_CHARS = 400000, MAX_RUN = 25000;
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0;
    while (i < n) {
        /* one 400k-character chunk */
        size_t chunk_start = i, nch = 0;
        while (i < n && nch < MAX_CHARS) { int l = tok_utf8_valid_len(u + i, n - i); i += l ? l : 1; nch++; }
        size_t chunk_end = i;
        /* split runs longer than MAX_RUN (llama3 _split_whitespaces_or_nonwhitespaces) */
        size_t j = chunk_start, slice_start = chunk_start, run = 0;
        int cur_space = -1;
        while (j < chunk_end) {
            int l = tok_utf8_valid_len(u + j, chunk_end - j);
            if (!l) l = 1;
            int sp = py_isspace(tok_utf8_decode(u + j, l));
            if (cur_space < 0) { cur_space = sp; run = 0; }
            if (sp != cur_space) { run = 1; cur_space = sp; }
            else if (++run > MAX_RUN) {
                int rc = encode_tt_piece(c, s + slice_start, j - slice_start, out);
                if (rc) return rc;
                slice_start = j;
                run = 1;
            }
            j += l;
        }
        int rc = encode_tt_piece(c, s + slice_start, chunk_end - slice_start, out);
        if (rc) return rc;
    }
    return 0;
}

/* ---------------------------------------------------------------- driver */

static int is_ws(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

int tok_encode(const df_tokenizer *t, const char *text0, size_t len0, int flags, tok_ids *out, char *err, size_t errlen) {
    enc_ctx c;
    memset(&c, 0, sizeof c);
    c.t = t; c.err = err; c.errlen = errlen;
    int rc = 0;
    char *fixed = NULL;
    const char *text = text0;
    size_t len = len0;
    /* validate; repair invalid UTF-8 (documented: U+FFFD per maximal subpart) */
    {
        const uint8_t *u = (const uint8_t *)text0;
        size_t i = 0;
        while (i < len0) {
            if (u[i] < 0x80) { i++; continue; }
            int l = tok_utf8_valid_len(u + i, len0 - i);
            if (!l) break;
            i += l;
        }
        if (i < len0) {
            fixed = tok_utf8_sanitize(text0, len0, &len);
            if (!fixed) return DF_ENOMEM;
            text = fixed;
        }
    }
    c.cache = tok_cache_new();
    c.mc = pcre2_match_context_create(NULL);
    c.js = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
    c.md = pcre2_match_data_create(16, NULL);
    if (!c.cache || !c.mc || !c.js || !c.md) { rc = DF_ENOMEM; goto out; }
    pcre2_jit_stack_assign(c.mc, NULL, c.js);

    int parse_special = (flags & DF_TOK_PARSE_SPECIAL) != 0;
    if (((flags & DF_TOK_ADD_BOS) || ((flags & DF_TOK_ADD_SPECIAL) && t->add_bos)) && t->bos_id >= 0 && (rc = tok_ids_push(out, t->bos_id))) goto out;
    size_t seg = 0, i = 0;
    while (i <= len) {
        int found = -1;
        size_t mlen = 0;
        if (i < len && t->added_first[(uint8_t)text[i]]) {
            for (int k = 0; k < t->n_added_lens; k++) {
                size_t L = (size_t)t->added_lens[k];
                if (i + L > len) continue;
                int32_t ai = tok_map_get(&t->added_map, text + i, L);
                if (ai < 0) continue;
                const tok_added *a = &t->added[ai];
                if (a->special && !parse_special) continue;
                if (t->kind == TOK_KIND_TIKTOKEN && !parse_special) continue;
                found = ai; mlen = L;
                break;
            }
        }
        if (found < 0 && i < len) { i++; continue; }
        /* segment [seg, end) then the added token */
        size_t end = i;
        const tok_added *a = found >= 0 ? &t->added[found] : NULL;
        if (a && a->lstrip) while (end > seg && is_ws(text[end - 1])) end--;
        if (end > seg) {
            rc = t->kind == TOK_KIND_TIKTOKEN ? encode_tt_segment(&c, text + seg, end - seg, out)
                                              : encode_hf_segment(&c, text + seg, end - seg, out);
            if (rc) goto out;
        }
        if (!a) break;
        if ((rc = tok_ids_push(out, a->id))) goto out;
        i += mlen;
        if (a->rstrip) while (i < len && is_ws(text[i])) i++;
        seg = i;
    }
out:
    if (rc == DF_ENOMEM) tok_err(err, errlen, "out of memory while tokenizing %zu bytes", len0);
    tok_cache_free(c.cache);
    if (c.md) pcre2_match_data_free(c.md);
    if (c.js) pcre2_jit_stack_free(c.js);
    if (c.mc) pcre2_match_context_free(c.mc);
    free(c.sa.v); free(c.sb.v); free(c.norm.p); free(c.work.p);
    free(fixed);
    return rc;
}
