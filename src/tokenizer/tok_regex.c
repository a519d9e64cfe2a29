/* tok_regex.c — pre-tokenizer regexes on PCRE2 (UTF + UCP + JIT) and the
 * Split pre-tokenizer's behaviours.
 *
 * HF tokenizers (Rust `regex`/onig) and tiktoken (fancy-regex) patterns are
 * rewritten for PCRE2 where the dialects differ:
 *   - \s / \S mean Unicode White_Space in Rust; PCRE2's UCP \s also matches
 *     U+180E and misses nothing else, so both are spelled out explicitly;
 *   - [X&&[^Y]] is class intersection in Rust; PCRE2 10.42 accepts it silently
 *     with another meaning (shared/notes/tokenizers.md), so it becomes
 *     (?:(?![Y])[X]) (and [X&&[Y]] becomes (?:(?=[Y])[X])).
 * Split behaviours follow tokenizers/src/tokenizer/normalizer.rs (split). */
#include "tok_internal.h"
#include <stdlib.h>
#include <string.h>

/* Rust's White_Space property (Unicode PropList), as PCRE2 class items. */
#define WS_ITEMS "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* Copy one escape sequence starting at p[*i] == '\\' (handles \p{..}, \x{..}). */
static void copy_escape(const char *p, size_t *i, tok_buf *out) {
    size_t s = *i;
    size_t j = s + 1;
    if (p[j] == 0) { *i = j; tok_buf_put(out, p + s, 1); return; }
    char c = p[j];
    j++;
    if ((c == 'p' || c == 'P' || c == 'x' || c == 'u') && p[j] == '{') {
        while (p[j] && p[j] != '}') j++;
        if (p[j] == '}') j++;
    }
    tok_buf_put(out, p + s, j - s);
    *i = j;
}

/* Parse a class body p[*i] just after '[' up to and including the matching
 * ']' and emit its PCRE2 form. */
static int rewrite_class(const char *p, size_t *i, tok_buf *out, char *err, size_t errlen, const char *what) {
    size_t j = *i;
    int neg = 0;
    if (p[j] == '^') { neg = 1; j++; }
    tok_buf left = {0}, right = {0};
    int right_neg = 0, has_and = 0, first = 1;
    tok_buf *cur = &left;
    for (;;) {
        char c = p[j];
        if (c == 0) { tok_err(err, errlen, "%s: unterminated character class in regex", what); goto fail; }
        if (c == ']' && !first) { j++; break; }
        first = 0;
        if (c == '\\') {
            if (p[j + 1] == 's') { tok_buf_puts(cur, WS_ITEMS); j += 2; continue; }
            if (p[j + 1] == 'S') {
                tok_err(err, errlen, "%s: \\S inside a character class is not supported", what);
                goto fail;
            }
            copy_escape(p, &j, cur);
            continue;
        }
        if (c == '&' && p[j + 1] == '&') {
            if (has_and) { tok_err(err, errlen, "%s: more than one && in a class is not supported", what); goto fail; }
            has_and = 1;
            j += 2;
            if (p[j] != '[') { tok_err(err, errlen, "%s: && must be followed by a [class] in regex", what); goto fail; }
            j++;
            if (p[j] == '^') { right_neg = 1; j++; }
            int f2 = 1;
            for (;;) {
                char d = p[j];
                if (d == 0) { tok_err(err, errlen, "%s: unterminated class after &&", what); goto fail; }
                if (d == ']' && !f2) { j++; break; }
                f2 = 0;
                if (d == '\\') {
                    if (p[j + 1] == 's') { tok_buf_puts(&right, WS_ITEMS); j += 2; continue; }
                    copy_escape(p, &j, &right);
                    continue;
                }
                if (d == '[' && p[j + 1] != ':') { tok_err(err, errlen, "%s: nested class after && is not supported", what); goto fail; }
                tok_buf_put(&right, &d, 1);
                j++;
            }
            cur = NULL;
            continue;
        }
        if (!cur) { tok_err(err, errlen, "%s: items after the && operand are not supported", what); goto fail; }
        if (c == '[' && p[j + 1] != ':') {
            tok_err(err, errlen, "%s: nested character class (Rust union syntax) is not supported", what);
            goto fail;
        }
        tok_buf_put(cur, &c, 1);
        j++;
    }
    if (has_and) {
        if (neg) { tok_err(err, errlen, "%s: negated class with && is not supported", what); goto fail; }
        tok_buf_puts(out, right_neg ? "(?:(?![" : "(?:(?=[");
        tok_buf_put(out, right.p, right.n);
        tok_buf_puts(out, "])[");
        tok_buf_put(out, left.p, left.n);
        tok_buf_puts(out, "])");
    } else {
        tok_buf_puts(out, neg ? "[^" : "[");
        tok_buf_put(out, left.p, left.n);
        tok_buf_puts(out, "]");
    }
    free(left.p); free(right.p);
    *i = j;
    return 0;
fail:
    free(left.p); free(right.p);
    return DF_EUNSUPPORTED;
}

static int rewrite_pattern(const char *p, tok_buf *out, char *err, size_t errlen, const char *what) {
    size_t i = 0;
    while (p[i]) {
        char c = p[i];
        if (c == '\\') {
            if (p[i + 1] == 's') { tok_buf_puts(out, "[" WS_ITEMS "]"); i += 2; continue; }
            if (p[i + 1] == 'S') { tok_buf_puts(out, "[^" WS_ITEMS "]"); i += 2; continue; }
            copy_escape(p, &i, out);
            continue;
        }
        if (c == '[') {
            i++;
            int rc = rewrite_class(p, &i, out, err, errlen, what);
            if (rc) return rc;
            continue;
        }
        tok_buf_put(out, &c, 1);
        i++;
    }
    if (!out->p) tok_buf_put(out, "", 0);
    return 0;
}

int tok_regex_compile(tok_regex *r, const char *pattern, const char *what, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    tok_buf pat = {0};
    int rc = rewrite_pattern(pattern, &pat, err, errlen, what);
    if (rc) { free(pat.p); return rc; }
    int ec;
    PCRE2_SIZE eo;
    r->code = pcre2_compile((PCRE2_SPTR)pat.p, pat.n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    if (!r->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        tok_err(err, errlen, "%s: regex does not compile with PCRE2 at offset %zu: %s (pattern %.200s)",
                what, (size_t)eo, (char *)msg, pattern);
        free(pat.p);
        return DF_EUNSUPPORTED;
    }
    free(pat.p);
    r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

void tok_regex_free(tok_regex *r) {
    if (r->code) pcre2_code_free(r->code);
    r->code = NULL;
}

/* Pieces of a span: (offset, length, is_match) covering it in order. */
typedef struct { size_t off, len; int m; } piece;

int tok_regex_split(const tok_regex *r, pcre2_match_data *md, pcre2_match_context *mc, const char *text,
                    tok_span span, int behavior, int invert, tok_spans *out) {
    const char *s = text + span.off;
    size_t n = span.len, pos = 0, gap = 0;
    piece *pc = NULL;
    size_t np = 0, cap = 0;
#define ADD(o, l, mm) do { if (np == cap) { cap = cap ? cap * 2 : 64; piece *q = realloc(pc, cap * sizeof *q); \
        if (!q) { free(pc); return DF_ENOMEM; } pc = q; } pc[np].off = (o); pc[np].len = (l); pc[np].m = (mm); np++; } while (0)
    while (pos <= n) {
        int rc = pcre2_match(r->code, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, mc);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) { free(pc); return DF_EUNSUPPORTED; } /* match limit / JIT stack: never split silently wrong */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t a = ov[0], b = ov[1];
        if (b == a) { /* empty match: step one character */
            if (a >= n) break;
            pos = a + 1;
            while (pos < n && ((uint8_t)s[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (a > gap) ADD(gap, a - gap, 0);
        ADD(a, b - a, 1);
        gap = pos = b;
    }
    if (gap < n) ADD(gap, n - gap, 0);
#undef ADD
    if (invert) for (size_t k = 0; k < np; k++) pc[k].m = !pc[k].m;
    int rc = 0;
    switch (behavior) {
    case TOK_SPLIT_ISOLATED:
        for (size_t k = 0; k < np && !rc; k++) rc = tok_spans_push(out, span.off + pc[k].off, pc[k].len);
        break;
    case TOK_SPLIT_REMOVED:
        for (size_t k = 0; k < np && !rc; k++)
            if (!pc[k].m) rc = tok_spans_push(out, span.off + pc[k].off, pc[k].len);
        break;
    case TOK_SPLIT_MERGED_PREV: {
        int prev_m = 0;
        size_t base = out->n;
        for (size_t k = 0; k < np && !rc; k++) {
            if (pc[k].m && !prev_m && out->n > base) out->v[out->n - 1].len += pc[k].len;
            else rc = tok_spans_push(out, span.off + pc[k].off, pc[k].len);
            prev_m = pc[k].m;
        }
        break;
    }
    case TOK_SPLIT_MERGED_NEXT: {
        /* walk backwards: a match merges into the piece that follows it */
        size_t base = out->n;
        int prev_m = 0;
        for (size_t k = np; k-- > 0 && !rc;) {
            if (pc[k].m && !prev_m && out->n > base) {
                out->v[out->n - 1].off -= pc[k].len;
                out->v[out->n - 1].len += pc[k].len;
            } else rc = tok_spans_push(out, span.off + pc[k].off, pc[k].len);
            prev_m = pc[k].m;
        }
        for (size_t a = base, b = out->n ? out->n - 1 : 0; a < b; a++, b--) {
            tok_span x = out->v[a]; out->v[a] = out->v[b]; out->v[b] = x;
        }
        break;
    }
    case TOK_SPLIT_CONTIGUOUS: {
        int prev_m = 0;
        size_t base = out->n;
        for (size_t k = 0; k < np && !rc; k++) {
            if (pc[k].m == prev_m && out->n > base) out->v[out->n - 1].len += pc[k].len;
            else rc = tok_spans_push(out, span.off + pc[k].off, pc[k].len);
            prev_m = pc[k].m;
        }
        break;
    }
    }
    free(pc);
    return rc;
}
