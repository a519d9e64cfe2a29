/* jinja_parse.c — lexer and parser of the Jinja subset: a port of jinja2
 * 3.1's lexer (trim_blocks and lstrip_blocks on, as transformers sets them;
 * "-" / "+" whitespace control; one trailing newline dropped; \r\n and \r
 * read as \n) and of its recursive-descent parser, down to operator
 * precedence (filters bind tighter than arithmetic, "~" between + and *,
 * left-associative **). Constructs outside the subset are refused with
 * DF_EUNSUPPORTED naming the construct and the line. */
#include "jinja_int.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

enum { T_EOF, T_DATA, T_VBEGIN, T_VEND, T_BBEGIN, T_BEND, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP };
/* multi-character operators */
enum { O_FLOORDIV = 256, O_POW, O_EQ, O_NE, O_GE, O_LE };

typedef struct {
    int type, line, op;
    const char *s;   /* name / data / decoded string (arena) */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct {
    jj_arena *a;
    const char *src;
    size_t len;
    tok *t;
    int nt, cap;
    int pos;         /* parser position */
    int rc;
    char *err;
    size_t errlen;
    int in_loop, in_macro;
    int depth;       /* nesting of expressions and blocks (bounded: the parser recurses) */
} P;

#define MAX_NEST 400

static void pfail(P *p, int rc, int line, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void pfail(P *p, int rc, int line, const char *fmt, ...) {
    if (p->rc) return;
    p->rc = rc;
    if (!p->err || !p->errlen) return;
    int k = snprintf(p->err, p->errlen, "chat template line %d: ", line);
    if (k < 0 || (size_t)k >= p->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, p->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

#define UNSUP(p, line, ...) pfail(p, DF_EUNSUPPORTED, line, __VA_ARGS__)
#define SYNTAX(p, line, ...) pfail(p, DF_EINVAL, line, __VA_ARGS__)

/* ------------------------------------------------------------------ lexer */

static tok *push_tok(P *p, int type, int line) {
    if (p->nt == p->cap) {
        int cap = p->cap ? p->cap * 2 : 256;
        tok *nt = realloc(p->t, (size_t)cap * sizeof *nt);
        if (!nt) { pfail(p, DF_ENOMEM, line, "out of memory"); return NULL; }
        p->t = nt;
        p->cap = cap;
    }
    tok *t = &p->t[p->nt++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->line = line;
    return t;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

/* whitespace per Python's \s / str.isspace at s[i]; returns byte length or 0 */
static size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t adv;
    int32_t cp = ju_decode(s + i, n - i, &adv);
    return ju_isspace(cp) ? adv : 0;
}

/* length of text after rstrip() of Unicode whitespace */
static size_t rstrip_len(const char *s, size_t n) {
    while (n) {
        size_t k = n - 1;
        while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t adv;
        int32_t cp = ju_decode(s + k, n - k, &adv);
        if (!ju_isspace(cp)) break;
        n = k;
    }
    return n;
}

static int all_ws(const char *s, size_t n) {
    if (!n) return 0; /* \s+ needs at least one */
    size_t i = 0;
    while (i < n) {
        size_t k = ws_at(s, n, i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* emit data text before a tag, applying "-" / lstrip_blocks */
static void emit_text(P *p, const char *text, size_t n, int sign, int is_var, int line_starting, int *line) {
    int stripped_nl = 0;
    if (sign == '-') {
        size_t m = rstrip_len(text, n);
        stripped_nl = count_nl(text + m, n - m);
        n = m;
    } else if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--) if (text[i - 1] == '\n') { l_pos = i; break; }
        if ((l_pos > 0 || line_starting) && all_ws(text + l_pos, n - l_pos)) n = l_pos;
    }
    if (n) {
        tok *t = push_tok(p, T_DATA, *line);
        if (!t) return;
        t->s = text;
        t->n = n;
    }
    *line += count_nl(text, n) + stripped_nl;
}

static int is_name_start(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_'; }
static int is_name_char(char ch) { return is_name_start(ch) || (ch >= '0' && ch <= '9'); }
static int is_digit(char ch) { return ch >= '0' && ch <= '9'; }

/* digits with single '_' separators: (\d+_)*\d+ ; returns length or 0 */
static size_t digits_us(const char *s, size_t n, size_t i) {
    size_t j = i;
    if (j >= n || !is_digit(s[j])) return 0;
    for (;;) {
        while (j < n && is_digit(s[j])) j++;
        if (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) { j++; continue; }
        break;
    }
    return j - i;
}

/* float_re at i (caller checked the (?<!\.) lookbehind); returns length or 0 */
static size_t float_at(const char *s, size_t n, size_t i) {
    size_t d = digits_us(s, n, i);
    if (!d) return 0;
    size_t j = i + d;
    /* (\.digits)? e[+-]?digits */
    size_t k = j;
    if (k < n && s[k] == '.') {
        size_t f = digits_us(s, n, k + 1);
        if (f) k += 1 + f;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        size_t m = k + 1;
        if (m < n && (s[m] == '+' || s[m] == '-')) m++;
        size_t e = digits_us(s, n, m);
        if (e) return m + e - i;
    }
    /* \.digits required */
    if (j < n && s[j] == '.') {
        size_t f = digits_us(s, n, j + 1);
        if (f) return j + 1 + f - i;
    }
    return 0;
}

static size_t int_at(const char *s, size_t n, size_t i, int64_t *val, int *overflow) {
    size_t j = i;
    *overflow = 0;
    int base = 10;
    if (j + 1 < n && s[j] == '0' && (s[j + 1] == 'b' || s[j + 1] == 'B' || s[j + 1] == 'o' || s[j + 1] == 'O' ||
                                      s[j + 1] == 'x' || s[j + 1] == 'X')) {
        char b = (char)(s[j + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        size_t k = j + 2;
        uint64_t v = 0;
        int nd = 0;
        for (;;) {
            if (k < n && s[k] == '_') k++;
            if (k >= n) break;
            char ch = (char)(s[k] | 0x20);
            int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : 99;
            if (d >= base) { if (s[k - 1] == '_') k--; break; }
            if (v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base) *overflow = 1;
            v = v * (uint64_t)base + (uint64_t)d;
            nd++;
            k++;
        }
        if (!nd) return 0;
        if (v > INT64_MAX) *overflow = 1;
        *val = (int64_t)v;
        return k - i;
    }
    if (j >= n || !is_digit(s[j])) return 0;
    if (s[j] == '0') { /* 0(_?0)* */
        size_t k = j + 1;
        while (k < n) {
            if (s[k] == '0') k++;
            else if (k + 1 < n && s[k] == '_' && s[k + 1] == '0') k += 2;
            else break;
        }
        *val = 0;
        return k - i;
    }
    size_t d = digits_us(s, n, j);
    uint64_t v = 0;
    for (size_t k = j; k < j + d; k++) {
        if (s[k] == '_') continue;
        if (v > (UINT64_MAX - 9) / 10) *overflow = 1;
        v = v * 10 + (uint64_t)(s[k] - '0');
    }
    if (v > INT64_MAX) *overflow = 1;
    *val = (int64_t)v;
    return d;
}

/* Python "unicode-escape" decoding of a string literal body */
static int unescape(P *p, const char *s, size_t n, int line, const char **out, size_t *outn) {
    jb b = {0};
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch != '\\' || i + 1 >= n) { jb_putc(&b, ch); continue; }
        char e = s[++i];
        int32_t cp = -1;
        switch (e) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            if (i + (size_t)nd >= n) {
                free(b.p);
                SYNTAX(p, line, "truncated \\%c escape in a string literal", e);
                return -1;
            }
            int32_t v = 0;
            for (int k = 1; k <= nd; k++) {
                char h = (char)(s[i + (size_t)k] | 0x20);
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : -1;
                if (d < 0) { free(b.p); SYNTAX(p, line, "bad \\%c escape in a string literal", e); return -1; }
                v = v * 16 + d;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
                free(b.p);
                UNSUP(p, line, "string literal escape \\%c%.*s (a surrogate or out of range) is not supported", e, nd,
                      s + i + 1);
                return -1;
            }
            i += (size_t)nd;
            cp = v;
            break;
        }
        case '0': case '1': case '2': case '3': case '4': case '5': case '6': case '7': {
            int32_t v = e - '0';
            for (int k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) v = v * 8 + (s[++i] - '0');
            cp = v;
            break;
        }
        case 'N':
            free(b.p);
            UNSUP(p, line, "\\N{...} escapes in string literals are not supported by deltafin's Jinja subset");
            return -1;
        default:
            jb_putc(&b, '\\');
            jb_putc(&b, e);
            continue;
        }
        char tmp[4];
        jb_put(&b, tmp, (size_t)ju_encode(cp, tmp));
    }
    *out = ja_strndup(p->a, b.p ? b.p : "", b.n);
    *outn = b.n;
    free(b.p);
    return *out ? 0 : -1;
}

/* tokens inside {{ }} / {% %} until the end tag; returns position after it */
static size_t lex_tag(P *p, size_t i, int is_var, int *line, int *line_starting) {
    const char *s = p->src;
    size_t n = p->len;
    char bal[256];
    int nb = 0;
    for (;;) {
        if (i >= n) { SYNTAX(p, *line, "unexpected end of template: missing '%s'", is_var ? "}}" : "%}"); return n; }
        if (!nb) {
            if (is_var) {
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '}' && s[i + 2] == '}') {
                    size_t j = i + 3;
                    while (ws_at(s, n, j)) j += ws_at(s, n, j);
                    push_tok(p, T_VEND, *line);
                    *line += count_nl(s + i, j - i);
                    *line_starting = j > i && s[j - 1] == '\n';
                    return j;
                }
                if (s[i] == '}' && i + 1 < n && s[i + 1] == '}') {
                    push_tok(p, T_VEND, *line);
                    *line_starting = 0;
                    return i + 2;
                }
            } else {
                if (s[i] == '+' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
                    push_tok(p, T_BEND, *line);
                    *line_starting = 0;
                    return i + 3;
                }
                if (s[i] == '-' && i + 2 < n && s[i + 1] == '%' && s[i + 2] == '}') {
                    size_t j = i + 3;
                    while (ws_at(s, n, j)) j += ws_at(s, n, j);
                    push_tok(p, T_BEND, *line);
                    *line += count_nl(s + i, j - i);
                    *line_starting = s[j - 1] == '\n';
                    return j;
                }
                if (s[i] == '%' && i + 1 < n && s[i + 1] == '}') {
                    size_t j = i + 2;
                    if (j < n && s[j] == '\n') { j++; (*line)++; } /* trim_blocks */
                    push_tok(p, T_BEND, *line);
                    *line_starting = s[j - 1] == '\n';
                    return j;
                }
            }
        }
        size_t w = ws_at(s, n, i);
        if (w) {
            while (ws_at(s, n, i)) { *line += s[i] == '\n'; i += ws_at(s, n, i); }
            continue;
        }
        char ch = s[i];
        if (is_digit(ch)) {
            size_t fl = (i > 0 && s[i - 1] == '.') ? 0 : float_at(s, n, i);
            if (fl) {
                tok *t = push_tok(p, T_FLOAT, *line);
                if (!t) return n;
                char tmp[128];
                size_t k = 0;
                for (size_t q = i; q < i + fl && k < sizeof tmp - 1; q++) if (s[q] != '_') tmp[k++] = s[q];
                tmp[k] = 0;
                t->f = strtod(tmp, NULL);
                i += fl;
                continue;
            }
            int64_t v;
            int ovf;
            size_t il = int_at(s, n, i, &v, &ovf);
            if (il) {
                if (ovf) { UNSUP(p, *line, "integer literal %.*s does not fit in 64 bits", (int)il, s + i); return n; }
                tok *t = push_tok(p, T_INT, *line);
                if (!t) return n;
                t->i = v;
                i += il;
                continue;
            }
        }
        if (is_name_start(ch)) {
            size_t j = i;
            while (j < n && is_name_char(s[j])) j++;
            tok *t = push_tok(p, T_NAME, *line);
            if (!t) return n;
            t->s = ja_strndup(p->a, s + i, j - i);
            t->n = j - i;
            i = j;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != ch) j += s[j] == '\\' ? 2 : 1;
            if (j >= n) { SYNTAX(p, *line, "unterminated string literal"); return n; }
            tok *t = push_tok(p, T_STRING, *line);
            if (!t) return n;
            if (unescape(p, s + i + 1, j - i - 1, *line, &t->s, &t->n)) return n;
            *line += count_nl(s + i, j - i);
            i = j + 1;
            continue;
        }
        /* operators */
        int op = 0;
        size_t ol = 1;
        if (i + 1 < n) {
            char c2 = s[i + 1];
            if (ch == '/' && c2 == '/') op = O_FLOORDIV;
            else if (ch == '*' && c2 == '*') op = O_POW;
            else if (ch == '=' && c2 == '=') op = O_EQ;
            else if (ch == '!' && c2 == '=') op = O_NE;
            else if (ch == '>' && c2 == '=') op = O_GE;
            else if (ch == '<' && c2 == '=') op = O_LE;
            if (op) ol = 2;
        }
        if (!op) {
            if (strchr("+-/*%~[](){}><=.:|,;", ch) && ch) op = ch;
            else {
                if ((unsigned char)ch >= 0x80) UNSUP(p, *line, "non-ASCII character in a tag (identifiers must be ASCII)");
                else SYNTAX(p, *line, "unexpected char '%c'", ch);
                return n;
            }
        }
        if (op == '(' || op == '[' || op == '{') {
            if (nb >= (int)sizeof bal) { UNSUP(p, *line, "brackets nested too deeply"); return n; }
            bal[nb++] = op == '(' ? ')' : op == '[' ? ']' : '}';
        } else if (op == ')' || op == ']' || op == '}') {
            if (!nb) { SYNTAX(p, *line, "unexpected '%c'", op); return n; }
            char want = bal[--nb];
            if (want != op) { SYNTAX(p, *line, "unexpected '%c', expected '%c'", op, want); return n; }
        }
        tok *t = push_tok(p, T_OP, *line);
        if (!t) return n;
        t->op = op;
        i += ol;
    }
}

static int lex(P *p) {
    const char *s = p->src;
    size_t n = p->len;
    size_t i = 0;
    int line = 1, line_starting = 1;
    while (i < n && !p->rc) {
        /* find the next tag start */
        size_t k = i;
        for (; k + 1 < n; k++)
            if (s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) break;
        if (k + 1 >= n) { /* rest is data */
            tok *t = push_tok(p, T_DATA, line);
            if (!t) return p->rc;
            t->s = s + i;
            t->n = n - i;
            break;
        }
        char kind = s[k + 1];
        int sign = k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+') ? s[k + 2] : 0;
        size_t after = k + 2 + (sign ? 1 : 0);
        /* {% raw %} */
        if (kind == '%') {
            size_t j = after;
            while (ws_at(s, n, j)) j += ws_at(s, n, j);
            if (j + 3 <= n && !memcmp(s + j, "raw", 3)) {
                size_t q = j + 3;
                while (ws_at(s, n, q)) q += ws_at(s, n, q);
                size_t endr = 0;
                if (q + 3 <= n && s[q] == '-' && s[q + 1] == '%' && s[q + 2] == '}') {
                    endr = q + 3;
                    while (ws_at(s, n, endr)) endr += ws_at(s, n, endr);
                } else if (q + 2 <= n && s[q] == '%' && s[q + 1] == '}') endr = q + 2;
                if (endr) {
                    emit_text(p, s + i, k - i, sign, 0, line_starting, &line);
                    line += count_nl(s + k, endr - k);
                    line_starting = s[endr - 1] == '\n';
                    /* find {%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?) */
                    size_t r = endr;
                    for (;;) {
                        while (r + 1 < n && !(s[r] == '{' && s[r + 1] == '%')) r++;
                        if (r + 1 >= n) { SYNTAX(p, line, "missing end of raw directive"); return p->rc; }
                        int rs = r + 2 < n && (s[r + 2] == '-' || s[r + 2] == '+') ? s[r + 2] : 0;
                        size_t e = r + 2 + (rs ? 1 : 0);
                        while (ws_at(s, n, e)) e += ws_at(s, n, e);
                        if (e + 6 <= n && !memcmp(s + e, "endraw", 6)) {
                            size_t f = e + 6;
                            while (ws_at(s, n, f)) f += ws_at(s, n, f);
                            size_t fe = 0;
                            if (f + 3 <= n && s[f] == '+' && s[f + 1] == '%' && s[f + 2] == '}') fe = f + 3;
                            else if (f + 3 <= n && s[f] == '-' && s[f + 1] == '%' && s[f + 2] == '}') {
                                fe = f + 3;
                                while (ws_at(s, n, fe)) fe += ws_at(s, n, fe);
                            } else if (f + 2 <= n && s[f] == '%' && s[f + 1] == '}') {
                                fe = f + 2;
                                if (fe < n && s[fe] == '\n') fe++;
                            }
                            if (fe) {
                                emit_text(p, s + endr, r - endr, rs, 0, line_starting, &line);
                                line += count_nl(s + r, fe - r);
                                line_starting = s[fe - 1] == '\n';
                                i = fe;
                                break;
                            }
                        }
                        r += 2;
                    }
                    continue;
                }
            }
        }
        emit_text(p, s + i, k - i, sign, kind == '{', line_starting, &line);
        line_starting = 0;
        if (kind == '#') {
            /* comment: (.*?)(\+#}|\-#}\s*|#}\n?) */
            size_t r = after;
            for (;;) {
                if (r + 1 >= n) { SYNTAX(p, line, "missing end of comment tag"); return p->rc; }
                if (s[r] == '#' && s[r + 1] == '}') break;
                r++;
            }
            size_t e = r + 2;
            if (r > after && s[r - 1] == '-') { while (ws_at(s, n, e)) e += ws_at(s, n, e); }
            else if (r > after && s[r - 1] == '+') {}
            else if (e < n && s[e] == '\n') e++;
            line += count_nl(s + k, e - k);
            line_starting = s[e - 1] == '\n';
            i = e;
            continue;
        }
        push_tok(p, kind == '{' ? T_VBEGIN : T_BBEGIN, line);
        i = lex_tag(p, after, kind == '{', &line, &line_starting);
    }
    push_tok(p, T_EOF, line);
    return p->rc;
}

/* ----------------------------------------------------------------- parser */

static tok *cur(P *p) { return &p->t[p->pos]; }
static tok *peek(P *p, int k) { int i = p->pos + k; return &p->t[i < p->nt ? i : p->nt - 1]; }
static tok *next_tok(P *p) { tok *t = cur(p); if (p->pos < p->nt - 1) p->pos++; return t; }
static int is_op(P *p, int op) { return cur(p)->type == T_OP && cur(p)->op == op; }
static int is_name(P *p, const char *nm) { return cur(p)->type == T_NAME && !strcmp(cur(p)->s, nm); }
static int skip_op(P *p, int op) { if (is_op(p, op)) { next_tok(p); return 1; } return 0; }
static int skip_name(P *p, const char *nm) { if (is_name(p, nm)) { next_tok(p); return 1; } return 0; }

static const char *tok_desc(tok *t, char *buf, size_t cap) {
    switch (t->type) {
    case T_EOF: return "end of template";
    case T_DATA: return "template data";
    case T_VBEGIN: return "'{{'";
    case T_VEND: return "'}}'";
    case T_BBEGIN: return "'{%'";
    case T_BEND: return "'%}'";
    case T_NAME: snprintf(buf, cap, "'%s'", t->s); return buf;
    case T_STRING: return "string";
    case T_INT: return "integer";
    case T_FLOAT: return "float";
    default:
        if (t->op < 256) snprintf(buf, cap, "'%c'", t->op);
        else snprintf(buf, cap, "'%s'", t->op == O_FLOORDIV ? "//" : t->op == O_POW ? "**" : t->op == O_EQ ? "==" :
                      t->op == O_NE ? "!=" : t->op == O_GE ? ">=" : "<=");
        return buf;
    }
}

static int expect_op(P *p, int op) {
    if (skip_op(p, op)) return 0;
    char b[64];
    SYNTAX(p, cur(p)->line, "expected '%c', got %s", op, tok_desc(cur(p), b, sizeof b));
    return -1;
}

static const char *expect_name(P *p) {
    if (cur(p)->type == T_NAME) return next_tok(p)->s;
    char b[64];
    SYNTAX(p, cur(p)->line, "expected a name, got %s", tok_desc(cur(p), b, sizeof b));
    return NULL;
}

static jnode *node(P *p, int kind, int line) {
    jnode *n = ja_alloc(p->a, sizeof *n);
    if (!n) { pfail(p, DF_ENOMEM, line, "out of memory"); return NULL; }
    n->kind = kind;
    n->line = line;
    return n;
}

/* growable node arrays in the arena */
typedef struct { jnode **v; int n, cap; } nv;
static int nv_push(P *p, nv *a, jnode *x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        jnode **v = ja_alloc(p->a, (size_t)cap * sizeof *v);
        if (!v) { pfail(p, DF_ENOMEM, 0, "out of memory"); return -1; }
        if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof *v);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}
typedef struct { const char **v; int n, cap; } sv;
static int sv_push(P *p, sv *a, const char *x) {
    if (a->n == a->cap) {
        int cap = a->cap ? a->cap * 2 : 4;
        const char **v = ja_alloc(p->a, (size_t)cap * sizeof *v);
        if (!v) { pfail(p, DF_ENOMEM, 0, "out of memory"); return -1; }
        if (a->n) memcpy(v, a->v, (size_t)a->n * sizeof *v);
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}

static jnode *parse_expression(P *p, int with_condexpr);
static jnode *parse_unary(P *p, int with_filter);
static jnode *parse_primary(P *p);
static jnode *parse_postfix(P *p, jnode *n);
static jnode *parse_filter_expr(P *p, jnode *n);

static jnode *const_node(P *p, int line, jv *v) {
    jnode *n = node(p, JN_CONST, line);
    if (n) n->cv = v;
    return n;
}

static jv *pv_new(P *p, int t) {
    jv *v = ja_alloc(p->a, sizeof *v);
    if (!v) { pfail(p, DF_ENOMEM, 0, "out of memory"); return NULL; }
    v->t = (uint8_t)t;
    return v;
}

/* end of a tuple: '}}', '%}', ')' or an extra end name */
static int is_tuple_end(P *p, const char *const *extra) {
    tok *t = cur(p);
    if (t->type == T_VEND || t->type == T_BEND || t->type == T_EOF || (t->type == T_OP && t->op == ')')) return 1;
    for (; extra && *extra; extra++) if (t->type == T_NAME && !strcmp(t->s, *extra)) return 1;
    return 0;
}

/* parse_tuple(simplified, with_condexpr, extra_end_rules, explicit_parentheses) */
static jnode *parse_tuple(P *p, int simplified, int with_condexpr, const char *const *extra, int explicit_paren) {
    int line = cur(p)->line;
    nv items = {0};
    int is_tuple = 0;
    for (;;) {
        if (items.n && expect_op(p, ',')) return NULL;
        if (is_tuple_end(p, extra)) break;
        jnode *e = simplified ? parse_primary(p) : parse_expression(p, with_condexpr);
        if (!e || nv_push(p, &items, e)) return NULL;
        if (is_op(p, ',')) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_paren) {
            char b[64];
            SYNTAX(p, cur(p)->line, "expected an expression, got %s", tok_desc(cur(p), b, sizeof b));
            return NULL;
        }
    }
    jnode *t = node(p, JN_TUPLE, line);
    if (!t) return NULL;
    t->list = items.v;
    t->n = items.n;
    return t;
}

static int parse_call_args(P *p, nv *args, nv *kwv, sv *kwn) {
    if (expect_op(p, '(')) return -1;
    int require_comma = 0;
    while (!is_op(p, ')')) {
        if (p->rc) return -1;
        if (require_comma) {
            if (expect_op(p, ',')) return -1;
            if (is_op(p, ')')) break;
        }
        if (is_op(p, '*') || is_op(p, O_POW)) {
            UNSUP(p, cur(p)->line, "'*args' / '**kwargs' in calls are not supported by deltafin's Jinja subset");
            return -1;
        }
        if (cur(p)->type == T_NAME && peek(p, 1)->type == T_OP && peek(p, 1)->op == '=') {
            const char *k = next_tok(p)->s;
            next_tok(p);
            jnode *v = parse_expression(p, 1);
            if (!v || nv_push(p, kwv, v) || sv_push(p, kwn, k)) return -1;
        } else {
            if (kwv->n) { SYNTAX(p, cur(p)->line, "invalid syntax for function call expression"); return -1; }
            jnode *v = parse_expression(p, 1);
            if (!v || nv_push(p, args, v)) return -1;
        }
        require_comma = 1;
    }
    return expect_op(p, ')');
}

static jnode *parse_call(P *p, jnode *fn) {
    int line = cur(p)->line;
    nv args = {0}, kwv = {0};
    sv kwn = {0};
    if (parse_call_args(p, &args, &kwv, &kwn)) return NULL;
    jnode *c = node(p, JN_CALL, line);
    if (!c) return NULL;
    c->a = fn;
    c->list = args.v; c->n = args.n;
    c->list2 = kwv.v; c->n2 = kwv.n;
    c->names = kwn.v; c->nnames = kwn.n;
    return c;
}

static jnode *parse_filter(P *p, jnode *operand, int start_inline) {
    while (is_op(p, '|') || start_inline) {
        if (!start_inline) next_tok(p);
        start_inline = 0;
        int line = cur(p)->line;
        const char *name = expect_name(p);
        if (!name) return NULL;
        if (is_op(p, '.')) {
            UNSUP(p, line, "dotted filter names ('%s.…') are not supported by deltafin's Jinja subset", name);
            return NULL;
        }
        int supported = 0;
        int id = jj_filter_id(name, &supported);
        if (id < 0) { SYNTAX(p, line, "no filter named '%s'", name); return NULL; }
        if (!supported) { UNSUP(p, line, "filter '%s' is not supported by deltafin's Jinja subset", name); return NULL; }
        jnode *f = node(p, JN_FILTER, line);
        if (!f) return NULL;
        f->a = operand;
        f->s = name;
        f->op = id;
        if (is_op(p, '(')) {
            nv args = {0}, kwv = {0};
            sv kwn = {0};
            if (parse_call_args(p, &args, &kwv, &kwn)) return NULL;
            f->list = args.v; f->n = args.n;
            f->list2 = kwv.v; f->n2 = kwv.n;
            f->names = kwn.v; f->nnames = kwn.n;
        }
        operand = f;
    }
    return operand;
}

static jnode *parse_test(P *p, jnode *operand) {
    int line = next_tok(p)->line; /* 'is' */
    int negated = skip_name(p, "not");
    const char *name = expect_name(p);
    if (!name) return NULL;
    if (is_op(p, '.')) { UNSUP(p, line, "dotted test names are not supported by deltafin's Jinja subset"); return NULL; }
    int supported = 0;
    int id = jj_test_id(name, &supported);
    if (id < 0) { SYNTAX(p, line, "no test named '%s'", name); return NULL; }
    if (!supported) { UNSUP(p, line, "test '%s' is not supported by deltafin's Jinja subset", name); return NULL; }
    jnode *t = node(p, JN_TEST, line);
    if (!t) return NULL;
    t->a = operand;
    t->s = name;
    t->op = id;
    tok *c = cur(p);
    if (is_op(p, '(')) {
        nv args = {0}, kwv = {0};
        sv kwn = {0};
        if (parse_call_args(p, &args, &kwv, &kwn)) return NULL;
        if (kwv.n) { UNSUP(p, line, "keyword arguments to tests are not supported by deltafin's Jinja subset"); return NULL; }
        t->list = args.v;
        t->n = args.n;
    } else if ((c->type == T_NAME || c->type == T_STRING || c->type == T_INT || c->type == T_FLOAT ||
                (c->type == T_OP && (c->op == '(' || c->op == '[' || c->op == '{'))) &&
               !(c->type == T_NAME && (!strcmp(c->s, "else") || !strcmp(c->s, "or") || !strcmp(c->s, "and")))) {
        if (c->type == T_NAME && !strcmp(c->s, "is")) { SYNTAX(p, line, "you cannot chain multiple tests with is"); return NULL; }
        jnode *arg = parse_primary(p);
        if (!arg) return NULL;
        arg = parse_postfix(p, arg);
        if (!arg) return NULL;
        t->list = ja_alloc(p->a, sizeof(jnode *));
        if (!t->list) return NULL;
        t->list[0] = arg;
        t->n = 1;
    }
    if (negated) {
        jnode *nn = node(p, JN_NOT, line);
        if (!nn) return NULL;
        nn->a = t;
        return nn;
    }
    return t;
}

static jnode *parse_subscribed(P *p) {
    int line = cur(p)->line;
    jnode *parts[3] = {NULL, NULL, NULL};
    if (is_op(p, ':')) {
        next_tok(p);
    } else {
        jnode *e = parse_expression(p, 1);
        if (!e) return NULL;
        if (!is_op(p, ':')) return e;
        next_tok(p);
        parts[0] = e;
    }
    if (!is_op(p, ':') && !is_op(p, ']') && !is_op(p, ',')) {
        if (!(parts[1] = parse_expression(p, 1))) return NULL;
    }
    if (is_op(p, ':')) {
        next_tok(p);
        if (!is_op(p, ']') && !is_op(p, ',')) {
            if (!(parts[2] = parse_expression(p, 1))) return NULL;
        }
    }
    jnode *s = node(p, JN_SLICE, line);
    if (!s) return NULL;
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static jnode *parse_subscript(P *p, jnode *obj) {
    tok *t = next_tok(p);
    int line = t->line;
    if (t->op == '.') {
        tok *a = next_tok(p);
        if (a->type == T_NAME) {
            jnode *g = node(p, JN_GETATTR, line);
            if (!g) return NULL;
            g->a = obj;
            g->s = a->s;
            g->sn = a->n;
            return g;
        }
        if (a->type == T_INT) {
            jnode *g = node(p, JN_GETITEM, line);
            jv *v = pv_new(p, JV_INT);
            if (!g || !v) return NULL;
            v->i = a->i;
            g->a = obj;
            g->b = const_node(p, line, v);
            return g->b ? g : NULL;
        }
        SYNTAX(p, line, "expected name or number after '.'");
        return NULL;
    }
    /* '[' */
    nv args = {0};
    while (!is_op(p, ']')) {
        if (p->rc) return NULL;
        if (args.n && expect_op(p, ',')) return NULL;
        jnode *e = parse_subscribed(p);
        if (!e || nv_push(p, &args, e)) return NULL;
    }
    if (expect_op(p, ']')) return NULL;
    jnode *g = node(p, JN_GETITEM, line);
    if (!g) return NULL;
    g->a = obj;
    if (args.n == 1) g->b = args.v[0];
    else {
        jnode *tu = node(p, JN_TUPLE, line);
        if (!tu) return NULL;
        tu->list = args.v;
        tu->n = args.n;
        g->b = tu;
    }
    return g;
}

static jnode *parse_postfix(P *p, jnode *n) {
    while (n && !p->rc) {
        if (is_op(p, '.') || is_op(p, '[')) n = parse_subscript(p, n);
        else if (is_op(p, '(')) n = parse_call(p, n);
        else break;
    }
    return p->rc ? NULL : n;
}

static jnode *parse_filter_expr(P *p, jnode *n) {
    while (n && !p->rc) {
        if (is_op(p, '|')) n = parse_filter(p, n, 0);
        else if (is_name(p, "is")) n = parse_test(p, n);
        else if (is_op(p, '(')) n = parse_call(p, n);
        else break;
    }
    return p->rc ? NULL : n;
}

static jnode *parse_primary(P *p) {
    tok *t = cur(p);
    int line = t->line;
    if (t->type == T_NAME) {
        next_tok(p);
        if (!strcmp(t->s, "true") || !strcmp(t->s, "True")) return const_node(p, line, &jv_true_c);
        if (!strcmp(t->s, "false") || !strcmp(t->s, "False")) return const_node(p, line, &jv_false_c);
        if (!strcmp(t->s, "none") || !strcmp(t->s, "None")) return const_node(p, line, &jv_none_c);
        jnode *n = node(p, JN_NAME, line);
        if (n) { n->s = t->s; n->sn = t->n; }
        return n;
    }
    if (t->type == T_STRING) {
        jb b = {0};
        while (cur(p)->type == T_STRING) { tok *s = next_tok(p); jb_put(&b, s->s, s->n); }
        jv *v = pv_new(p, JV_STR);
        if (!v) { free(b.p); return NULL; }
        v->s.p = ja_strndup(p->a, b.p ? b.p : "", b.n);
        v->s.n = b.n;
        free(b.p);
        return const_node(p, line, v);
    }
    if (t->type == T_INT || t->type == T_FLOAT) {
        next_tok(p);
        jv *v = pv_new(p, t->type == T_INT ? JV_INT : JV_FLOAT);
        if (!v) return NULL;
        if (t->type == T_INT) v->i = t->i; else v->f = t->f;
        return const_node(p, line, v);
    }
    if (t->type == T_OP && t->op == '(') {
        next_tok(p);
        jnode *e = parse_tuple(p, 0, 1, NULL, 1);
        if (!e || expect_op(p, ')')) return NULL;
        return e;
    }
    if (t->type == T_OP && t->op == '[') {
        next_tok(p);
        nv items = {0};
        while (!is_op(p, ']')) {
            if (p->rc) return NULL;
            if (items.n && expect_op(p, ',')) return NULL;
            if (is_op(p, ']')) break;
            jnode *e = parse_expression(p, 1);
            if (!e || nv_push(p, &items, e)) return NULL;
        }
        if (expect_op(p, ']')) return NULL;
        jnode *l = node(p, JN_LIST, line);
        if (l) { l->list = items.v; l->n = items.n; }
        return l;
    }
    if (t->type == T_OP && t->op == '{') {
        next_tok(p);
        nv keys = {0}, vals = {0};
        while (!is_op(p, '}')) {
            if (p->rc) return NULL;
            if (keys.n && expect_op(p, ',')) return NULL;
            if (is_op(p, '}')) break;
            jnode *k = parse_expression(p, 1);
            if (!k || expect_op(p, ':')) return NULL;
            jnode *v = parse_expression(p, 1);
            if (!v || nv_push(p, &keys, k) || nv_push(p, &vals, v)) return NULL;
        }
        if (expect_op(p, '}')) return NULL;
        jnode *d = node(p, JN_DICT, line);
        if (d) { d->list = keys.v; d->n = keys.n; d->list2 = vals.v; d->n2 = vals.n; }
        return d;
    }
    char b[64];
    SYNTAX(p, line, "unexpected %s", tok_desc(t, b, sizeof b));
    return NULL;
}

static jnode *parse_unary(P *p, int with_filter) {
    int line = cur(p)->line;
    jnode *n;
    if (++p->depth > MAX_NEST) {
        UNSUP(p, line, "expressions nested deeper than %d levels are not supported by deltafin's Jinja subset", MAX_NEST);
        return NULL;
    }
    if (is_op(p, '-') || is_op(p, '+')) {
        int neg = next_tok(p)->op == '-';
        jnode *x = parse_unary(p, 0);
        if (!x) return NULL;
        n = node(p, neg ? JN_NEG : JN_POS, line);
        if (!n) return NULL;
        n->a = x;
    } else {
        n = parse_primary(p);
        if (!n) return NULL;
    }
    n = parse_postfix(p, n);
    if (n && with_filter) n = parse_filter_expr(p, n);
    p->depth--;
    return n;
}

static jnode *binop(P *p, int op, jnode *l, jnode *r, int line) {
    if (!l || !r) return NULL;
    jnode *n = node(p, JN_BINOP, line);
    if (n) { n->op = op; n->a = l; n->b = r; }
    return n;
}

static jnode *parse_pow(P *p) {
    jnode *l = parse_unary(p, 1);
    while (l && is_op(p, O_POW)) { int line = next_tok(p)->line; l = binop(p, OP_POW, l, parse_unary(p, 1), line); }
    return l;
}

static jnode *parse_math2(P *p) {
    jnode *l = parse_pow(p);
    while (l) {
        int op = is_op(p, '*') ? OP_MUL : is_op(p, '/') ? OP_DIV : is_op(p, O_FLOORDIV) ? OP_FLOORDIV : is_op(p, '%') ? OP_MOD : 0;
        if (!op) break;
        int line = next_tok(p)->line;
        l = binop(p, op, l, parse_pow(p), line);
    }
    return l;
}

static jnode *parse_concat(P *p) {
    int line = cur(p)->line;
    jnode *first = parse_math2(p);
    if (!first || !is_op(p, '~')) return first;
    nv items = {0};
    if (nv_push(p, &items, first)) return NULL;
    while (is_op(p, '~')) {
        next_tok(p);
        jnode *e = parse_math2(p);
        if (!e || nv_push(p, &items, e)) return NULL;
    }
    jnode *c = node(p, JN_CONCAT, line);
    if (c) { c->list = items.v; c->n = items.n; }
    return c;
}

static jnode *parse_math1(P *p) {
    jnode *l = parse_concat(p);
    while (l && (is_op(p, '+') || is_op(p, '-'))) {
        int op = next_tok(p)->op == '+' ? OP_ADD : OP_SUB;
        l = binop(p, op, l, parse_concat(p), cur(p)->line);
    }
    return l;
}

static jnode *parse_compare(P *p) {
    int line = cur(p)->line;
    jnode *e = parse_math1(p);
    if (!e) return NULL;
    nv rhs = {0};
    int ops[64], nops = 0;
    for (;;) {
        int op = 0;
        if (is_op(p, O_EQ)) op = CMP_EQ;
        else if (is_op(p, O_NE)) op = CMP_NE;
        else if (is_op(p, '<')) op = CMP_LT;
        else if (is_op(p, O_LE)) op = CMP_LE;
        else if (is_op(p, '>')) op = CMP_GT;
        else if (is_op(p, O_GE)) op = CMP_GE;
        if (op) next_tok(p);
        else if (is_name(p, "in")) { next_tok(p); op = CMP_IN; }
        else if (is_name(p, "not") && peek(p, 1)->type == T_NAME && !strcmp(peek(p, 1)->s, "in")) {
            next_tok(p); next_tok(p); op = CMP_NOTIN;
        } else break;
        if (nops == 64) { UNSUP(p, line, "more than 64 chained comparisons"); return NULL; }
        jnode *r = parse_math1(p);
        if (!r || nv_push(p, &rhs, r)) return NULL;
        ops[nops++] = op;
    }
    if (!nops) return e;
    jnode *c = node(p, JN_COMPARE, line);
    if (!c) return NULL;
    c->a = e;
    c->list = rhs.v;
    c->n = rhs.n;
    c->ops = ja_alloc(p->a, (size_t)nops * sizeof(int));
    if (!c->ops) return NULL;
    memcpy(c->ops, ops, (size_t)nops * sizeof(int));
    return c;
}

static jnode *parse_not(P *p) {
    if (is_name(p, "not")) {
        int line = next_tok(p)->line;
        jnode *x = parse_not(p);
        if (!x) return NULL;
        jnode *n = node(p, JN_NOT, line);
        if (n) n->a = x;
        return n;
    }
    return parse_compare(p);
}

static jnode *parse_and(P *p) {
    jnode *l = parse_not(p);
    while (l && is_name(p, "and")) {
        int line = next_tok(p)->line;
        jnode *r = parse_not(p);
        if (!r) return NULL;
        jnode *n = node(p, JN_AND, line);
        if (!n) return NULL;
        n->a = l; n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_or(P *p) {
    jnode *l = parse_and(p);
    while (l && is_name(p, "or")) {
        int line = next_tok(p)->line;
        jnode *r = parse_and(p);
        if (!r) return NULL;
        jnode *n = node(p, JN_OR, line);
        if (!n) return NULL;
        n->a = l; n->b = r;
        l = n;
    }
    return l;
}

static jnode *parse_condexpr(P *p) {
    jnode *e1 = parse_or(p);
    while (e1 && is_name(p, "if")) {
        int line = next_tok(p)->line;
        jnode *e2 = parse_or(p);
        if (!e2) return NULL;
        jnode *e3 = NULL;
        if (skip_name(p, "else")) { if (!(e3 = parse_condexpr(p))) return NULL; }
        jnode *c = node(p, JN_COND, line);
        if (!c) return NULL;
        c->a = e2; c->b = e1; c->c = e3;
        e1 = c;
    }
    return e1;
}

static jnode *parse_expression(P *p, int with_condexpr) { return with_condexpr ? parse_condexpr(p) : parse_or(p); }

/* ------------------------------------------------------------- statements */

static jnode *subparse(P *p, const char *const *end_tokens);

static int expect_block_end(P *p) {
    if (cur(p)->type == T_BEND) { next_tok(p); return 0; }
    char b[64];
    SYNTAX(p, cur(p)->line, "expected end of statement block ('%%}'), got %s", tok_desc(cur(p), b, sizeof b));
    return -1;
}

/* parse statements until one of the end names; leaves the parser on that name */
static jnode *parse_statements(P *p, const char *const *end, int drop_needle) {
    jnode *body = subparse(p, end);
    if (!body) return NULL;
    if (cur(p)->type == T_EOF) {
        SYNTAX(p, cur(p)->line, "unexpected end of template: expected '%s'", end[0]);
        return NULL;
    }
    if (drop_needle) {
        next_tok(p);
        if (expect_block_end(p)) return NULL;
    }
    return body;
}

/* assignment target: a name, names separated by commas, or ns.attr */
static int parse_target(P *p, sv *names, const char **ns_name, const char **ns_attr, int with_namespace,
                        const char *const *extra) {
    int line = cur(p)->line;
    if (with_namespace && cur(p)->type == T_NAME && peek(p, 1)->type == T_OP && peek(p, 1)->op == '.') {
        *ns_name = next_tok(p)->s;
        next_tok(p);
        *ns_attr = expect_name(p);
        return *ns_attr ? 0 : -1;
    }
    int paren = skip_op(p, '(');
    for (;;) {
        if (cur(p)->type != T_NAME) {
            if (cur(p)->type == T_OP && cur(p)->op == '(') {
                UNSUP(p, line, "nested tuple targets are not supported by deltafin's Jinja subset");
            } else {
                char b[64];
                SYNTAX(p, line, "cannot assign to %s", tok_desc(cur(p), b, sizeof b));
            }
            return -1;
        }
        const char *nm = next_tok(p)->s;
        if (!strcmp(nm, "true") || !strcmp(nm, "false") || !strcmp(nm, "none") || !strcmp(nm, "True") ||
            !strcmp(nm, "False") || !strcmp(nm, "None")) {
            SYNTAX(p, line, "cannot assign to '%s'", nm);
            return -1;
        }
        if (sv_push(p, names, nm)) return -1;
        if (!is_op(p, ',')) break;
        next_tok(p);
        if (is_tuple_end(p, extra) || (paren && is_op(p, ')')) || is_op(p, '=')) break;
        if (extra && cur(p)->type == T_NAME) {
            int stop = 0;
            for (const char *const *e = extra; *e; e++) stop |= !strcmp(cur(p)->s, *e);
            if (stop) break;
        }
    }
    if (paren && expect_op(p, ')')) return -1;
    return 0;
}

/* does a subtree read a name (for macro varargs / kwargs / caller)? */
static int reads_name(const jnode *n, const char *name) {
    if (!n) return 0;
    if (n->kind == JS_MACRO) return 0;
    if (n->kind == JN_NAME && !strcmp(n->s, name)) return 1;
    if (reads_name(n->a, name) || reads_name(n->b, name) || reads_name(n->c, name) || reads_name(n->d, name)) return 1;
    for (int i = 0; i < n->n; i++) if (reads_name(n->list[i], name)) return 1;
    for (int i = 0; i < n->n2; i++) if (reads_name(n->list2[i], name)) return 1;
    return 0;
}

static jnode *parse_for(P *p, int line) {
    static const char *const in_end[] = {"in", NULL};
    static const char *const rec_end[] = {"recursive", NULL};
    static const char *const body_end[] = {"endfor", "else", NULL};
    static const char *const else_end[] = {"endfor", NULL};
    sv names = {0};
    const char *d1 = NULL, *d2 = NULL;
    if (parse_target(p, &names, &d1, &d2, 0, in_end)) return NULL;
    if (!skip_name(p, "in")) { SYNTAX(p, cur(p)->line, "expected 'in' in for loop"); return NULL; }
    jnode *iter = parse_tuple(p, 0, 0, rec_end, 0);
    if (!iter) return NULL;
    jnode *test = NULL;
    if (skip_name(p, "if")) { if (!(test = parse_expression(p, 1))) return NULL; }
    if (is_name(p, "recursive")) { UNSUP(p, line, "recursive for loops are not supported by deltafin's Jinja subset"); return NULL; }
    if (expect_block_end(p)) return NULL;
    p->in_loop++;
    jnode *body = parse_statements(p, body_end, 0);
    p->in_loop--;
    if (!body) return NULL;
    jnode *els = NULL;
    if (skip_name(p, "else")) {
        if (expect_block_end(p)) return NULL;
        if (!(els = parse_statements(p, else_end, 1))) return NULL;
    } else {
        next_tok(p); /* endfor */
        if (expect_block_end(p)) return NULL;
    }
    jnode *f = node(p, JS_FOR, line);
    if (!f) return NULL;
    f->names = names.v;
    f->nnames = names.n;
    f->a = iter;
    f->b = test;
    f->c = body;
    f->d = els;
    return f;
}

static jnode *parse_if(P *p, int line) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    static const char *const endif[] = {"endif", NULL};
    jnode *top = node(p, JS_IF, line), *n = top;
    if (!top) return NULL;
    for (;;) {
        if (!(n->a = parse_tuple(p, 0, 0, NULL, 0))) return NULL;
        if (expect_block_end(p)) return NULL;
        if (!(n->b = parse_statements(p, ends, 0))) return NULL;
        tok *t = next_tok(p);
        if (!strcmp(t->s, "elif")) {
            jnode *e = node(p, JS_IF, t->line);
            if (!e) return NULL;
            n->c = e;
            n = e;
            continue;
        }
        if (!strcmp(t->s, "else")) {
            if (expect_block_end(p)) return NULL;
            if (!(n->c = parse_statements(p, endif, 1))) return NULL;
        } else if (expect_block_end(p)) return NULL;
        break;
    }
    return top;
}

static jnode *parse_set(P *p, int line) {
    static const char *const endset[] = {"endset", NULL};
    sv names = {0};
    const char *ns = NULL, *attr = NULL;
    if (parse_target(p, &names, &ns, &attr, 1, NULL)) return NULL;
    if (skip_op(p, '=')) {
        jnode *e = parse_tuple(p, 0, 1, NULL, 0);
        if (!e || expect_block_end(p)) return NULL;
        jnode *s = node(p, ns ? JS_SETATTR : JS_SET, line);
        if (!s) return NULL;
        s->names = names.v;
        s->nnames = names.n;
        if (ns) { /* names = {namespace, attribute} */
            s->names = ja_alloc(p->a, 2 * sizeof(char *));
            if (!s->names) return NULL;
            s->names[0] = ns;
            s->names[1] = attr;
            s->nnames = 2;
        }
        s->a = e;
        return s;
    }
    /* block set, optionally filtered */
    jnode *filt = NULL;
    if (is_op(p, '|')) { if (!(filt = parse_filter(p, NULL, 0))) return NULL; }
    if (names.n > 1) { SYNTAX(p, line, "a block set needs a single target"); return NULL; }
    if (expect_block_end(p)) return NULL;
    jnode *body = parse_statements(p, endset, 1);
    if (!body) return NULL;
    jnode *s = node(p, JS_SETBLOCK, line);
    if (!s) return NULL;
    if (ns) {
        s->names = ja_alloc(p->a, 2 * sizeof(char *));
        if (!s->names) return NULL;
        s->names[0] = ns;
        s->names[1] = attr;
        s->nnames = 2;
        s->op = 1; /* namespace attribute */
    } else {
        s->names = names.v;
        s->nnames = names.n;
    }
    s->a = filt;
    s->b = body;
    return s;
}

static jnode *parse_macro(P *p, int line) {
    static const char *const endmacro[] = {"endmacro", NULL};
    const char *name = expect_name(p);
    if (!name || expect_op(p, '(')) return NULL;
    sv params = {0};
    nv defaults = {0};
    int have_default = 0;
    while (!is_op(p, ')')) {
        if (p->rc) return NULL;
        if (params.n && expect_op(p, ',')) return NULL;
        const char *a = expect_name(p);
        if (!a) return NULL;
        jnode *d = NULL;
        if (skip_op(p, '=')) {
            if (!(d = parse_expression(p, 1))) return NULL;
            have_default = 1;
        } else if (have_default) {
            SYNTAX(p, line, "non-default argument follows default argument");
            return NULL;
        }
        if (sv_push(p, &params, a) || nv_push(p, &defaults, d)) return NULL;
    }
    next_tok(p);
    if (expect_block_end(p)) return NULL;
    int saved_loop = p->in_loop;
    p->in_loop = 0;
    p->in_macro++;
    jnode *body = parse_statements(p, endmacro, 1);
    p->in_macro--;
    p->in_loop = saved_loop;
    if (!body) return NULL;
    jnode *m = node(p, JS_MACRO, line);
    if (!m) return NULL;
    m->s = name;
    m->names = params.v;
    m->nnames = params.n;
    m->list2 = defaults.v;
    m->n2 = defaults.n;
    m->a = body;
    m->op = (reads_name(body, "varargs") ? JM_VARARGS : 0) | (reads_name(body, "kwargs") ? JM_KWARGS : 0) |
            (reads_name(body, "caller") ? JM_CALLER : 0);
    if (m->op & JM_CALLER) {
        UNSUP(p, line, "macros using 'caller' ({%% call %%} blocks) are not supported by deltafin's Jinja subset");
        return NULL;
    }
    return m;
}

static jnode *parse_with(P *p, int line) {
    static const char *const endwith[] = {"endwith", NULL};
    sv names = {0};
    nv vals = {0};
    while (cur(p)->type != T_BEND) {
        if (p->rc) return NULL;
        if (names.n && expect_op(p, ',')) return NULL;
        const char *nm = expect_name(p);
        if (!nm) return NULL;
        if (is_op(p, ',')) { UNSUP(p, line, "tuple targets in {%% with %%} are not supported"); return NULL; }
        if (expect_op(p, '=')) return NULL;
        jnode *v = parse_expression(p, 1);
        if (!v || sv_push(p, &names, nm) || nv_push(p, &vals, v)) return NULL;
    }
    next_tok(p);
    jnode *body = parse_statements(p, endwith, 1);
    if (!body) return NULL;
    jnode *w = node(p, JS_WITH, line);
    if (!w) return NULL;
    w->names = names.v;
    w->nnames = names.n;
    w->list2 = vals.v;
    w->n2 = vals.n;
    w->a = body;
    return w;
}

static jnode *parse_statement_(P *p);
static jnode *parse_statement(P *p) {
    if (++p->depth > MAX_NEST) {
        UNSUP(p, cur(p)->line, "blocks nested deeper than %d levels are not supported by deltafin's Jinja subset", MAX_NEST);
        return NULL;
    }
    jnode *n = parse_statement_(p);
    p->depth--;
    return n;
}

static jnode *parse_statement_(P *p) {
    tok *t = cur(p);
    int line = t->line;
    if (t->type != T_NAME) {
        char b[64];
        SYNTAX(p, line, "tag name expected, got %s", tok_desc(t, b, sizeof b));
        return NULL;
    }
    const char *kw = t->s;
    next_tok(p);
    if (!strcmp(kw, "for")) return parse_for(p, line);
    if (!strcmp(kw, "if")) return parse_if(p, line);
    if (!strcmp(kw, "set")) return parse_set(p, line);
    if (!strcmp(kw, "macro")) return parse_macro(p, line);
    if (!strcmp(kw, "with")) return parse_with(p, line);
    if (!strcmp(kw, "print")) {
        jnode *e = parse_tuple(p, 0, 1, NULL, 0);
        if (!e || expect_block_end(p)) return NULL;
        jnode *o = node(p, JS_OUTPUT, line);
        if (o) o->a = e;
        return o;
    }
    if (!strcmp(kw, "break") || !strcmp(kw, "continue")) {
        if (!p->in_loop) { SYNTAX(p, line, "'%s' outside of a loop", kw); return NULL; }
        if (expect_block_end(p)) return NULL;
        return node(p, kw[0] == 'b' ? JS_BREAK : JS_CONTINUE, line);
    }
    if (!strcmp(kw, "filter")) {
        static const char *const endfilter[] = {"endfilter", NULL};
        jnode *f = parse_filter(p, NULL, 1);
        if (!f || expect_block_end(p)) return NULL;
        jnode *body = parse_statements(p, endfilter, 1);
        if (!body) return NULL;
        jnode *n = node(p, JS_FILTERBLOCK, line);
        if (n) { n->a = f; n->b = body; }
        return n;
    }
    if (!strcmp(kw, "generation")) { /* transformers' AssistantTracker: renders its body */
        static const char *const endgen[] = {"endgeneration", NULL};
        if (expect_block_end(p)) return NULL;
        jnode *body = parse_statements(p, endgen, 1);
        jnode *w = body ? node(p, JS_WITH, line) : NULL; /* a call block: its own frame */
        if (w) w->a = body;
        return w;
    }
    static const char *const known[] = {"block", "extends", "include", "import", "from", "call", "autoescape",
                                        "trans", "pluralize", NULL};
    for (const char *const *k = known; *k; k++)
        if (!strcmp(kw, *k)) {
            UNSUP(p, line, "'{%% %s %%}' is not supported by deltafin's Jinja subset", kw);
            return NULL;
        }
    if (!strcmp(kw, "do")) {
        SYNTAX(p, line, "encountered unknown tag 'do' (the 'do' extension is not enabled in transformers' environment)");
        return NULL;
    }
    SYNTAX(p, line, "encountered unknown tag '%s'", kw);
    return NULL;
}

static jnode *subparse(P *p, const char *const *end_tokens) {
    nv body = {0};
    int line = cur(p)->line;
    while (!p->rc) {
        tok *t = cur(p);
        if (t->type == T_EOF) break;
        if (t->type == T_DATA) {
            next_tok(p);
            jnode *n = node(p, JS_TEXT, t->line);
            if (!n) return NULL;
            n->s = t->s;
            n->sn = t->n;
            if (nv_push(p, &body, n)) return NULL;
        } else if (t->type == T_VBEGIN) {
            next_tok(p);
            jnode *e = parse_tuple(p, 0, 1, NULL, 0);
            if (!e) return NULL;
            if (cur(p)->type != T_VEND) {
                char b[64];
                SYNTAX(p, cur(p)->line, "expected end of print statement ('}}'), got %s", tok_desc(cur(p), b, sizeof b));
                return NULL;
            }
            next_tok(p);
            jnode *o = node(p, JS_OUTPUT, t->line);
            if (!o) return NULL;
            o->a = e;
            if (nv_push(p, &body, o)) return NULL;
        } else if (t->type == T_BBEGIN) {
            next_tok(p);
            tok *k = cur(p);
            if (end_tokens && k->type == T_NAME) {
                int hit = 0;
                for (const char *const *e = end_tokens; *e; e++) hit |= !strcmp(k->s, *e);
                if (hit) break;
            }
            jnode *s = parse_statement(p);
            if (!s) return NULL;
            if (nv_push(p, &body, s)) return NULL;
        } else {
            char b[64];
            SYNTAX(p, t->line, "unexpected %s", tok_desc(t, b, sizeof b));
            return NULL;
        }
    }
    if (p->rc) return NULL;
    jnode *b = node(p, JS_BODY, line);
    if (b) { b->list = body.v; b->n = body.n; }
    return b;
}

int jj_parse(const char *src, size_t len, jj_template **out, char *err, size_t errlen) {
    *out = NULL;
    if (err && errlen) err[0] = 0;
    jj_template *t = calloc(1, sizeof *t);
    if (!t) return DF_ENOMEM;
    P p = {.a = &t->arena, .err = err, .errlen = errlen};
    /* UTF-8 check, newline normalisation, one trailing newline dropped */
    for (size_t i = 0; i < len;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)src + i, (utf8proc_ssize_t)(len - i), &cp);
        if (l <= 0) {
            free(t);
            if (err && errlen) snprintf(err, errlen, "chat template: not valid UTF-8 (byte offset %zu)", i);
            return DF_EINVAL;
        }
        i += (size_t)l;
    }
    char *s = ja_alloc(&t->arena, len + 1);
    if (!s) { jj_free(t); return DF_ENOMEM; }
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') { s[n++] = '\n'; if (i + 1 < len && src[i + 1] == '\n') i++; }
        else s[n++] = src[i];
    }
    if (n && s[n - 1] == '\n') n--;
    s[n] = 0;
    p.src = s;
    p.len = n;
    int rc = lex(&p);
    if (!rc) {
        t->root = subparse(&p, NULL);
        rc = p.rc;
        if (!rc && cur(&p)->type != T_EOF) {
            tok *k = cur(&p);
            char b[64];
            SYNTAX(&p, k->line, "unexpected %s (no block is open)", tok_desc(k, b, sizeof b));
            rc = p.rc;
        }
    }
    free(p.t);
    if (rc) { jj_free(t); return rc; }
    *out = t;
    return 0;
}

void jj_free(jj_template *t) {
    if (!t) return;
    ja_free(&t->arena);
    free(t);
}
