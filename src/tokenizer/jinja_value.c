/* jinja_value.c — the value model of the Jinja subset: an arena, Python-like
 * values (None, bool, int, float, str, list, tuple, dict, namespace, ...),
 * Python's str() / repr() / == / < / truthiness, json.loads of the render
 * variables and json.dumps as transformers' tojson filter calls it. */
#include "jinja_int.h"
#include "util/util.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ------------------------------------------------------------------ arena */

struct jj_chunk {
    jj_chunk *next;
    size_t used, cap;
    _Alignas(16) char data[];
};

void *ja_alloc(jj_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    jj_chunk *h = a->head;
    if (!h || h->used + n > h->cap) {
        size_t cap = n > 65536 ? n : 65536;
        if (h && h->cap * 2 > cap && h->cap < (64u << 20)) cap = h->cap * 2 > n ? h->cap * 2 : n;
        if (a->limit && a->total + cap > a->limit) { a->oom = 1; return NULL; }
        jj_chunk *k = malloc(sizeof *k + cap);
        if (!k) { a->oom = 1; return NULL; }
        k->next = h;
        k->used = 0;
        k->cap = cap;
        a->head = h = k;
        a->total += cap;
    }
    void *p = h->data + h->used;
    h->used += n;
    memset(p, 0, n);
    return p;
}

char *ja_strndup(jj_arena *a, const char *s, size_t n) {
    char *p = ja_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ja_free(jj_arena *a) {
    jj_chunk *h = a->head;
    while (h) {
        jj_chunk *n = h->next;
        free(h);
        h = n;
    }
    a->head = NULL;
    a->total = 0;
}

int jb_put(jb *b, const void *p, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return DF_ENOMEM;
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}
int jb_puts(jb *b, const char *s) { return jb_put(b, s, strlen(s)); }
int jb_putc(jb *b, char c) { return jb_put(b, &c, 1); }

/* ------------------------------------------------------------------ errors */

void jj_fail(jj_ctx *c, int rc, const char *fmt, ...) {
    if (c->rc) return;
    c->rc = rc;
    if (!c->err || !c->errlen) return;
    int k = snprintf(c->err, c->errlen, "chat template line %d: ", c->line);
    if (k < 0 || (size_t)k >= c->errlen) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, c->errlen - (size_t)k, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------ UTF-8 */

int32_t ju_decode(const char *s, size_t n, size_t *adv) {
    const unsigned char *u = (const unsigned char *)s;
    if (!n) { *adv = 0; return -1; }
    if (u[0] < 0x80) { *adv = 1; return u[0]; }
    int l = u[0] >= 0xF0 ? 4 : u[0] >= 0xE0 ? 3 : u[0] >= 0xC0 ? 2 : 1;
    if ((size_t)l > n || l == 1) { *adv = 1; return 0xFFFD; }
    int32_t cp = u[0] & (0x7F >> l);
    for (int i = 1; i < l; i++) cp = (cp << 6) | (u[i] & 0x3F);
    *adv = (size_t)l;
    return cp;
}

int ju_encode(int32_t cp, char *o) {
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

size_t ju_len(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xC0) != 0x80;
    return k;
}

size_t ju_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0, k = 0;
    while (i < n && k < cp) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
        k++;
    }
    return i;
}

/* Python str.isspace() */
int ju_isspace(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Python str.isprintable() for one code point */
static int ju_isprintable(int32_t c) {
    if (c == ' ') return 1;
    utf8proc_category_t k = utf8proc_category(c);
    switch (k) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS: case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL: case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return 0;
    default:
        return 1;
    }
}

/* ----------------------------------------------------------------- values */

jv jv_undef_c = {.t = JV_UNDEF};
jv jv_none_c = {.t = JV_NONE};
jv jv_true_c = {.t = JV_BOOL, .b = 1};
jv jv_false_c = {.t = JV_BOOL, .b = 0};

jv *jv_new(jj_ctx *c, int t) {
    jv *v = ja_alloc(c->a, sizeof *v);
    if (!v) { jj_fail(c, DF_ENOMEM, "out of memory (the template's working memory limit was reached)"); return NULL; }
    v->t = (uint8_t)t;
    return v;
}

jv *jv_int(jj_ctx *c, int64_t i) { jv *v = jv_new(c, JV_INT); if (v) v->i = i; return v; }
jv *jv_float(jj_ctx *c, double f) { jv *v = jv_new(c, JV_FLOAT); if (v) v->f = f; return v; }
jv *jv_bool(int b) { return b ? &jv_true_c : &jv_false_c; }

jv *jv_str_nocopy(jj_ctx *c, const char *p, size_t n) {
    jv *v = jv_new(c, JV_STR);
    if (!v) return NULL;
    v->s.p = p ? p : "";
    v->s.n = n;
    return v;
}

jv *jv_str(jj_ctx *c, const char *p, size_t n) {
    char *q = ja_strndup(c->a, p ? p : "", n);
    if (!q) { jj_fail(c, DF_ENOMEM, "out of memory (the template's working memory limit was reached)"); return NULL; }
    return jv_str_nocopy(c, q, n);
}

jv *jv_strz(jj_ctx *c, const char *s) { return jv_str(c, s, strlen(s)); }

jv *jv_undef(jj_ctx *c, const char *fmt, ...) {
    jv *v = jv_new(c, JV_UNDEF);
    if (!v) return NULL;
    if (fmt) {
        char tmp[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(tmp, sizeof tmp, fmt, ap);
        va_end(ap);
        v->u.msg = ja_strndup(c->a, tmp, strlen(tmp));
    }
    return v;
}

jv *jv_list(jj_ctx *c, int t, size_t n) {
    jv *v = jv_new(c, t);
    if (!v) return NULL;
    v->l.n = n;
    if (n) {
        v->l.a = ja_alloc(c->a, n * sizeof(jv *));
        if (!v->l.a) { jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
    }
    return v;
}

jv *jv_dict(jj_ctx *c, size_t cap) {
    jv *v = jv_new(c, JV_DICT);
    if (!v) return NULL;
    if (cap) {
        v->d.e = ja_alloc(c->a, cap * sizeof(jv_kv));
        if (!v->d.e) { jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
        v->d.cap = cap;
    }
    return v;
}

jv *jv_dict_get(const jv *d, const jv *k) {
    for (size_t i = 0; i < d->d.n; i++) if (jv_equal(d->d.e[i].k, k)) return d->d.e[i].v;
    return NULL;
}

jv *jv_dict_gets(const jv *d, const char *k) {
    size_t n = strlen(k);
    for (size_t i = 0; i < d->d.n; i++) {
        const jv *kk = d->d.e[i].k;
        if (kk->t == JV_STR && kk->s.n == n && !memcmp(kk->s.p, k, n)) return d->d.e[i].v;
    }
    return NULL;
}

int jv_dict_set(jj_ctx *c, jv *d, jv *k, jv *v) {
    for (size_t i = 0; i < d->d.n; i++)
        if (jv_equal(d->d.e[i].k, k)) { d->d.e[i].v = v; return 0; }
    if (d->d.n == d->d.cap) {
        size_t cap = d->d.cap ? d->d.cap * 2 : 4;
        jv_kv *e = ja_alloc(c->a, cap * sizeof *e);
        if (!e) { jj_fail(c, DF_ENOMEM, "out of memory"); return DF_ENOMEM; }
        if (d->d.n) memcpy(e, d->d.e, d->d.n * sizeof *e);
        d->d.e = e;
        d->d.cap = cap;
    }
    d->d.e[d->d.n].k = k;
    d->d.e[d->d.n].v = v;
    d->d.n++;
    return 0;
}

const char *jv_type_name(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return v->flags & JV_F_SAFE ? "Markup" : "str";
    case JV_LIST: return v->flags & JV_F_ITER ? "generator" : v->flags & JV_F_RANGE ? "range" :
                         v->flags & JV_F_ITEMS ? "dict_items" : v->flags & JV_F_KEYS ? "dict_keys" :
                         v->flags & JV_F_VALUES ? "dict_values" : "list";
    case JV_TUPLE: return "tuple";
    case JV_DICT: return "dict";
    case JV_NS: return "Namespace";
    case JV_MACRO: return "Macro";
    case JV_FUNC: return "function";
    case JV_METHOD: return "builtin_function_or_method";
    case JV_LOOP: return "LoopContext";
    }
    return "object";
}

int jv_truthy(const jv *v) {
    switch (v->t) {
    case JV_UNDEF: case JV_NONE: return 0;
    case JV_BOOL: return v->b;
    case JV_INT: return v->i != 0;
    case JV_FLOAT: return v->f != 0.0;
    case JV_STR: return v->s.n != 0;
    case JV_LIST: case JV_TUPLE: return (v->flags & (JV_F_ITER | JV_F_RANGE)) == JV_F_ITER || v->l.n != 0;
    case JV_DICT: return v->d.n != 0;
    default: return 1;
    }
}

int jv_is_number(const jv *v) { return v->t == JV_INT || v->t == JV_FLOAT || v->t == JV_BOOL; }
double jv_num(const jv *v) { return v->t == JV_FLOAT ? v->f : v->t == JV_INT ? (double)v->i : (double)v->b; }
static int64_t jv_ival(const jv *v) { return v->t == JV_BOOL ? v->b : v->i; }

static int num_eq(const jv *a, const jv *b) {
    if (a->t != JV_FLOAT && b->t != JV_FLOAT) return jv_ival(a) == jv_ival(b);
    if (a->t == JV_FLOAT && b->t == JV_FLOAT) return a->f == b->f;
    const jv *fv = a->t == JV_FLOAT ? a : b, *iv = a->t == JV_FLOAT ? b : a;
    double f = fv->f;
    if (f != floor(f) || f < -9.3e18 || f > 9.3e18) return 0;
    if (f >= 9223372036854775807.0 || f < -9223372036854775808.0) return 0;
    return (int64_t)f == jv_ival(iv);
}

static int jv_equal_(const jv *a, const jv *b, int depth);
int jv_equal(const jv *a, const jv *b) { return jv_equal_(a, b, 0); }

static int jv_equal_(const jv *a, const jv *b, int depth) {
    if (a == b) return 1;
    if (depth > 900) return 0; /* (Python would raise RecursionError) */
    if (jv_is_number(a) && jv_is_number(b)) return num_eq(a, b);
    if (a->t != b->t) return 0;
    if ((a->flags | b->flags) & (JV_F_ITER | JV_F_RANGE)) return 0; /* generators compare by identity */
    switch (a->t) {
    case JV_UNDEF: case JV_NONE: return 1;
    case JV_STR: return a->s.n == b->s.n && !memcmp(a->s.p, b->s.p, a->s.n);
    case JV_LIST: case JV_TUPLE:
        if (a->l.n != b->l.n) return 0;
        for (size_t i = 0; i < a->l.n; i++) if (!jv_equal_(a->l.a[i], b->l.a[i], depth + 1)) return 0;
        return 1;
    case JV_DICT:
        if (a->d.n != b->d.n) return 0;
        for (size_t i = 0; i < a->d.n; i++) {
            jv *o = jv_dict_get(b, a->d.e[i].k);
            if (!o || !jv_equal_(a->d.e[i].v, o, depth + 1)) return 0;
        }
        return 1;
    case JV_MACRO: return a->m == b->m;
    case JV_FUNC: case JV_METHOD: return a->fn.id == b->fn.id && a->fn.self == b->fn.self;
    default: return 0;
    }
}

static int jv_less_(jj_ctx *c, const jv *a, const jv *b, int depth);
int jv_less(jj_ctx *c, const jv *a, const jv *b) { return jv_less_(c, a, b, 0); }

static int jv_less_(jj_ctx *c, const jv *a, const jv *b, int depth) {
    if (depth > 900) { jj_fail(c, DF_EINVAL, "RecursionError: maximum recursion depth exceeded in comparison"); return -1; }
    if (jv_is_number(a) && jv_is_number(b)) {
        if (a->t != JV_FLOAT && b->t != JV_FLOAT) return jv_ival(a) < jv_ival(b);
        return jv_num(a) < jv_num(b);
    }
    if (a->t == JV_STR && b->t == JV_STR) {
        size_t n = a->s.n < b->s.n ? a->s.n : b->s.n;
        int r = memcmp(a->s.p, b->s.p, n);
        return r ? r < 0 : a->s.n < b->s.n;
    }
    if ((a->t == JV_LIST || a->t == JV_TUPLE) && a->t == b->t) {
        size_t n = a->l.n < b->l.n ? a->l.n : b->l.n;
        for (size_t i = 0; i < n; i++) {
            if (jv_equal(a->l.a[i], b->l.a[i])) continue;
            return jv_less_(c, a->l.a[i], b->l.a[i], depth + 1);
        }
        return a->l.n < b->l.n;
    }
    if (a->t == JV_UNDEF || b->t == JV_UNDEF) { jj_undef_fail(c, a->t == JV_UNDEF ? a : b); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: '<' not supported between instances of '%s' and '%s'", jv_type_name(a),
            jv_type_name(b));
    return -1;
}

/* ---------------------------------------------------------- str / repr */

size_t jj_py_float_repr(double v, char out[64]) {
    if (isnan(v)) return (size_t)snprintf(out, 64, "nan");
    if (isinf(v)) return (size_t)snprintf(out, 64, v < 0 ? "-inf" : "inf");
    char t[64], d[32];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof t, "%.*e", prec - 1, v);
        if (strtod(t, NULL) == v) break;
    }
    size_t n = 0;
    const char *q = t;
    if (*q == '-') { out[n++] = '-'; q++; }
    int nd = 0;
    for (; *q && *q != 'e'; q++) if (*q >= '0' && *q <= '9') d[nd++] = *q;
    int ex = atoi(q + 1);
    while (nd > 1 && d[nd - 1] == '0') nd--;
    if (ex >= -4 && ex < 16) {
        if (ex >= 0) {
            for (int i = 0; i <= ex; i++) out[n++] = i < nd ? d[i] : '0';
            out[n++] = '.';
            if (nd > ex + 1) for (int i = ex + 1; i < nd; i++) out[n++] = d[i];
            else out[n++] = '0';
        } else {
            out[n++] = '0';
            out[n++] = '.';
            for (int i = 0; i < -ex - 1; i++) out[n++] = '0';
            for (int i = 0; i < nd; i++) out[n++] = d[i];
        }
    } else {
        out[n++] = d[0];
        if (nd > 1) {
            out[n++] = '.';
            for (int i = 1; i < nd; i++) out[n++] = d[i];
        }
        n += (size_t)snprintf(out + n, 64 - n, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
    out[n] = 0;
    return n;
}

void py_float_repr(double v, jb *b) {
    char t[64];
    jb_put(b, t, jj_py_float_repr(v, t));
}

static void repr_str(const char *s, size_t n, jb *b) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jb_putc(b, q);
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        char tmp[16];
        if (cp == q || cp == '\\') { jb_putc(b, '\\'); jb_putc(b, (char)cp); }
        else if (cp == '\t') jb_puts(b, "\\t");
        else if (cp == '\n') jb_puts(b, "\\n");
        else if (cp == '\r') jb_puts(b, "\\r");
        else if (cp < ' ' || cp == 0x7F) { snprintf(tmp, sizeof tmp, "\\x%02x", cp); jb_puts(b, tmp); }
        else if (cp < 0x7F || ju_isprintable(cp)) jb_put(b, s + i, adv);
        else {
            if (cp <= 0xFF) snprintf(tmp, sizeof tmp, "\\x%02x", cp);
            else if (cp <= 0xFFFF) snprintf(tmp, sizeof tmp, "\\u%04x", cp);
            else snprintf(tmp, sizeof tmp, "\\U%08x", cp);
            jb_puts(b, tmp);
        }
        i += adv;
    }
    jb_putc(b, q);
}

static int to_text_(jj_ctx *c, const jv *v, jb *b, int repr, int depth);
static int to_text(jj_ctx *c, const jv *v, jb *b, int repr) { return to_text_(c, v, b, repr, 0); }

static int to_text_(jj_ctx *c, const jv *v, jb *b, int repr, int depth) {
    char tmp[64];
    if (depth > 900) { jj_fail(c, DF_EINVAL, "RecursionError: maximum recursion depth exceeded while getting the repr of an object"); return c->rc; }
    switch (v->t) {
    case JV_UNDEF: jb_puts(b, repr ? "Undefined" : ""); return 0;
    case JV_NONE: jb_puts(b, "None"); return 0;
    case JV_BOOL: jb_puts(b, v->b ? "True" : "False"); return 0;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v->i); jb_puts(b, tmp); return 0;
    case JV_FLOAT: py_float_repr(v->f, b); return 0;
    case JV_STR:
        if (!repr) { jb_put(b, v->s.p, v->s.n); return 0; }
        if (v->flags & JV_F_SAFE) jb_puts(b, "Markup(");
        repr_str(v->s.p, v->s.n, b);
        if (v->flags & JV_F_SAFE) jb_putc(b, ')');
        return 0;
    case JV_LIST: case JV_TUPLE: {
        if (v->flags & (JV_F_ITER | JV_F_RANGE)) {
            jj_fail(c, DF_EUNSUPPORTED, "converting a %s to text is not supported by deltafin's Jinja subset (Python "
                    "would print %s)", jv_type_name(v), v->flags & JV_F_ITER ? "its memory address" : "range(...)");
            return c->rc;
        }
        const char *pre = v->flags & JV_F_ITEMS ? "dict_items(" : v->flags & JV_F_KEYS ? "dict_keys(" :
                          v->flags & JV_F_VALUES ? "dict_values(" : "";
        jb_puts(b, pre);
        jb_putc(b, v->t == JV_LIST ? '[' : '(');
        for (size_t i = 0; i < v->l.n; i++) {
            if (i) jb_puts(b, ", ");
            if (to_text_(c, v->l.a[i], b, 1, depth + 1)) return c->rc;
        }
        if (v->t == JV_TUPLE && v->l.n == 1) jb_putc(b, ',');
        jb_putc(b, v->t == JV_LIST ? ']' : ')');
        if (*pre) jb_putc(b, ')');
        return 0;
    }
    case JV_DICT: case JV_NS:
        if (v->t == JV_NS) jb_puts(b, "<Namespace ");
        jb_putc(b, '{');
        for (size_t i = 0; i < v->d.n; i++) {
            if (i) jb_puts(b, ", ");
            if (to_text_(c, v->d.e[i].k, b, 1, depth + 1)) return c->rc;
            jb_puts(b, ": ");
            if (to_text_(c, v->d.e[i].v, b, 1, depth + 1)) return c->rc;
        }
        jb_putc(b, '}');
        if (v->t == JV_NS) jb_putc(b, '>');
        return 0;
    case JV_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %lld/%lld>", (long long)v->loop->i + 1, (long long)v->loop->n);
        jb_puts(b, tmp);
        return 0;
    case JV_MACRO:
        jb_puts(b, "<Macro '");
        jb_puts(b, v->m->node->s);
        jb_puts(b, "'>");
        return 0;
    default:
        jj_fail(c, DF_EUNSUPPORTED, "converting a %s ('%s') to text is not supported by deltafin's Jinja subset "
                "(Python would print a memory address)", jv_type_name(v), v->fn.name ? v->fn.name : "?");
        return c->rc;
    }
}

int jv_to_str(jj_ctx *c, const jv *v, jb *b) { return to_text(c, v, b, 0); }
int jv_repr(jj_ctx *c, const jv *v, jb *b) { return to_text(c, v, b, 1); }

jv *jv_as_str(jj_ctx *c, jv *v) {
    if (v->t == JV_STR) return v;
    jb b = {0};
    if (jv_to_str(c, v, &b)) { free(b.p); return NULL; }
    jv *r = jv_str(c, b.p ? b.p : "", b.n);
    free(b.p);
    return r;
}

/* ------------------------------------------------------------ json.dumps */

static void json_str(const char *s, size_t n, int ascii, jb *b) {
    jb_putc(b, '"');
    size_t i = 0;
    char tmp[16];
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        switch (cp) {
        case '"': jb_puts(b, "\\\""); break;
        case '\\': jb_puts(b, "\\\\"); break;
        case '\n': jb_puts(b, "\\n"); break;
        case '\r': jb_puts(b, "\\r"); break;
        case '\t': jb_puts(b, "\\t"); break;
        case '\b': jb_puts(b, "\\b"); break;
        case '\f': jb_puts(b, "\\f"); break;
        default:
            if (cp < 0x20 || (ascii && cp > 0x7E)) {
                if (cp > 0xFFFF) {
                    int32_t v = cp - 0x10000;
                    snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", 0xD800 | (v >> 10), 0xDC00 | (v & 0x3FF));
                } else snprintf(tmp, sizeof tmp, "\\u%04x", cp);
                jb_puts(b, tmp);
            } else jb_put(b, s + i, adv);
        }
        i += adv;
    }
    jb_putc(b, '"');
}

static int json_key_text(jj_ctx *c, const jv *k, jb *b, const jj_json_opts *o) {
    char tmp[32];
    switch (k->t) {
    case JV_STR: json_str(k->s.p, k->s.n, o->ensure_ascii, b); return 0;
    case JV_BOOL: jb_puts(b, k->b ? "\"true\"" : "\"false\""); return 0;
    case JV_NONE: jb_puts(b, "\"null\""); return 0;
    case JV_INT: snprintf(tmp, sizeof tmp, "\"%lld\"", (long long)k->i); jb_puts(b, tmp); return 0;
    case JV_FLOAT: {
        jb t = {0};
        if (isnan(k->f)) jb_puts(&t, "NaN");
        else if (isinf(k->f)) jb_puts(&t, k->f < 0 ? "-Infinity" : "Infinity");
        else py_float_repr(k->f, &t);
        jb_putc(b, '"');
        jb_put(b, t.p, t.n);
        jb_putc(b, '"');
        free(t.p);
        return 0;
    }
    default:
        jj_fail(c, DF_EINVAL, "TypeError: keys must be str, int, float, bool or None, not %s", jv_type_name(k));
        return c->rc;
    }
}

static void json_newline(const jj_json_opts *o, int level, jb *b) {
    jb_putc(b, '\n');
    for (int i = 0; i < level; i++) jb_put(b, o->indent, o->indent_n);
}

static int json_dump(jj_ctx *c, const jv *v, const jj_json_opts *o, int level, jb *b) {
    char tmp[32];
    if (level > 500) { jj_fail(c, DF_EINVAL, "RecursionError: maximum recursion depth exceeded in tojson"); return c->rc; }
    switch (v->t) {
    case JV_NONE: jb_puts(b, "null"); return 0;
    case JV_BOOL: jb_puts(b, v->b ? "true" : "false"); return 0;
    case JV_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v->i); jb_puts(b, tmp); return 0;
    case JV_FLOAT:
        if (isnan(v->f)) jb_puts(b, "NaN");
        else if (isinf(v->f)) jb_puts(b, v->f < 0 ? "-Infinity" : "Infinity");
        else py_float_repr(v->f, b);
        return 0;
    case JV_STR: json_str(v->s.p, v->s.n, o->ensure_ascii, b); return 0;
    case JV_LIST: case JV_TUPLE:
        if (v->flags & (JV_F_ITER | JV_F_RANGE | JV_F_ITEMS | JV_F_KEYS | JV_F_VALUES)) {
            jj_fail(c, DF_EINVAL, "TypeError: Object of type %s is not JSON serializable", jv_type_name(v));
            return c->rc;
        }
        if (!v->l.n) { jb_puts(b, "[]"); return 0; }
        jb_putc(b, '[');
        for (size_t i = 0; i < v->l.n; i++) {
            if (i) jb_puts(b, o->item_sep);
            if (o->has_indent) json_newline(o, level + 1, b);
            if (json_dump(c, v->l.a[i], o, level + 1, b)) return c->rc;
        }
        if (o->has_indent) json_newline(o, level, b);
        jb_putc(b, ']');
        return 0;
    case JV_DICT: {
        if (!v->d.n) { jb_puts(b, "{}"); return 0; }
        size_t n = v->d.n;
        size_t *ord = malloc(n * sizeof *ord);
        if (!ord) return DF_ENOMEM;
        for (size_t i = 0; i < n; i++) ord[i] = i;
        if (o->sort_keys) { /* stable insertion sort by key (Python sorted(d.items())) */
            for (size_t i = 1; i < n; i++) {
                size_t x = ord[i], j = i;
                while (j > 0) {
                    int lt = jv_less(c, v->d.e[x].k, v->d.e[ord[j - 1]].k);
                    if (lt < 0) { free(ord); return c->rc; }
                    if (!lt) break;
                    ord[j] = ord[j - 1];
                    j--;
                }
                ord[j] = x;
            }
        }
        jb_putc(b, '{');
        for (size_t i = 0; i < n; i++) {
            const jv_kv *e = &v->d.e[ord[i]];
            if (i) jb_puts(b, o->item_sep);
            if (o->has_indent) json_newline(o, level + 1, b);
            if (json_key_text(c, e->k, b, o) || (jb_puts(b, o->key_sep), json_dump(c, e->v, o, level + 1, b))) {
                free(ord);
                return c->rc;
            }
        }
        free(ord);
        if (o->has_indent) json_newline(o, level, b);
        jb_putc(b, '}');
        return 0;
    }
    case JV_UNDEF:
        jj_fail(c, DF_EINVAL, "TypeError: Object of type Undefined is not JSON serializable%s%s%s",
                v->u.msg ? " (" : "", v->u.msg ? v->u.msg : "", v->u.msg ? ")" : "");
        return c->rc;
    default:
        jj_fail(c, DF_EINVAL, "TypeError: Object of type %s is not JSON serializable", jv_type_name(v));
        return c->rc;
    }
}

int jv_json_dump(jj_ctx *c, const jv *v, const jj_json_opts *o, jb *b) { return json_dump(c, v, o, 0, b); }

/* ------------------------------------------------------------ json.loads */

typedef struct { jj_ctx *c; const char *s, *e; } jp;

static void jp_ws(jp *p) { while (p->s < p->e && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) p->s++; }

static jv *jp_fail(jp *p, const char *what) {
    jj_fail(p->c, DF_EINVAL, "render variables are not valid JSON: %s", what);
    return NULL;
}


static jv *jp_string(jp *p) {
    p->s++; /* " */
    jb b = {0};
    for (;;) {
        if (p->s >= p->e) { free(b.p); return jp_fail(p, "unterminated string"); }
        unsigned char ch = (unsigned char)*p->s;
        if (ch == '"') { p->s++; break; }
        if (ch == '\\') {
            if (p->e - p->s < 2) { free(b.p); return jp_fail(p, "bad escape"); }
            char esc = p->s[1];
            p->s += 2;
            char o;
            switch (esc) {
            case '"': o = '"'; break;
            case '\\': o = '\\'; break;
            case '/': o = '/'; break;
            case 'b': o = '\b'; break;
            case 'f': o = '\f'; break;
            case 'n': o = '\n'; break;
            case 'r': o = '\r'; break;
            case 't': o = '\t'; break;
            case 'u': {
                unsigned v, w;
                if (p->e - p->s < 4 || df_hex4(p->s, &v)) { free(b.p); return jp_fail(p, "bad \\u escape"); }
                p->s += 4;
                if (v >= 0xD800 && v < 0xDC00 && p->e - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u' &&
                    !df_hex4(p->s + 2, &w) && w >= 0xDC00 && w < 0xE000) {
                    v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
                    p->s += 6;
                } else if (v >= 0xD800 && v < 0xE000) {
                    free(b.p);
                    return jp_fail(p, "lone UTF-16 surrogate escape (\\ud800-\\udfff)");
                }
                char tmp[4];
                jb_put(&b, tmp, (size_t)ju_encode((int32_t)v, tmp));
                continue;
            }
            default: free(b.p); return jp_fail(p, "bad escape");
            }
            jb_putc(&b, o);
            continue;
        }
        if (ch < 0x20) { free(b.p); return jp_fail(p, "control character in string"); }
        /* copy a run of plain bytes */
        const char *q = p->s;
        while (q < p->e && *q != '"' && *q != '\\' && (unsigned char)*q >= 0x20) q++;
        jb_put(&b, p->s, (size_t)(q - p->s));
        p->s = q;
    }
    /* validate UTF-8 */
    for (size_t i = 0; i < b.n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)b.p + i, (utf8proc_ssize_t)(b.n - i), &cp);
        if (l <= 0) { free(b.p); return jp_fail(p, "invalid UTF-8 in a string"); }
        i += (size_t)l;
    }
    jv *v = jv_str(p->c, b.p ? b.p : "", b.n);
    free(b.p);
    return v;
}

static jv *jp_value(jp *p, int depth) {
    if (depth > 400) return jp_fail(p, "nested too deeply");
    jp_ws(p);
    if (p->s >= p->e) return jp_fail(p, "unexpected end");
    char ch = *p->s;
    if (ch == '"') return jp_string(p);
    if (ch == '{') {
        p->s++;
        jv *d = jv_dict(p->c, 4);
        if (!d) return NULL;
        jp_ws(p);
        if (p->s < p->e && *p->s == '}') { p->s++; return d; }
        for (;;) {
            jp_ws(p);
            if (p->s >= p->e || *p->s != '"') return jp_fail(p, "expected a string key");
            jv *k = jp_string(p);
            if (!k) return NULL;
            jp_ws(p);
            if (p->s >= p->e || *p->s != ':') return jp_fail(p, "expected ':'");
            p->s++;
            jv *v = jp_value(p, depth + 1);
            if (!v || jv_dict_set(p->c, d, k, v)) return NULL;
            jp_ws(p);
            if (p->s < p->e && *p->s == ',') { p->s++; continue; }
            if (p->s < p->e && *p->s == '}') { p->s++; return d; }
            return jp_fail(p, "expected ',' or '}'");
        }
    }
    if (ch == '[') {
        p->s++;
        jv **items = NULL;
        size_t n = 0, cap = 0;
        jp_ws(p);
        if (p->s < p->e && *p->s == ']') { p->s++; return jv_list(p->c, JV_LIST, 0); }
        for (;;) {
            jv *v = jp_value(p, depth + 1);
            if (!v) { free(items); return NULL; }
            if (n == cap) {
                cap = cap ? cap * 2 : 8;
                jv **ni = realloc(items, cap * sizeof *ni);
                if (!ni) { free(items); return jp_fail(p, "out of memory"); }
                items = ni;
            }
            items[n++] = v;
            jp_ws(p);
            if (p->s < p->e && *p->s == ',') { p->s++; continue; }
            if (p->s < p->e && *p->s == ']') { p->s++; break; }
            free(items);
            return jp_fail(p, "expected ',' or ']'");
        }
        jv *l = jv_list(p->c, JV_LIST, n);
        if (l) memcpy(l->l.a, items, n * sizeof *items);
        free(items);
        return l;
    }
    if (p->e - p->s >= 4 && !memcmp(p->s, "true", 4)) { p->s += 4; return &jv_true_c; }
    if (p->e - p->s >= 5 && !memcmp(p->s, "false", 5)) { p->s += 5; return &jv_false_c; }
    if (p->e - p->s >= 4 && !memcmp(p->s, "null", 4)) { p->s += 4; return &jv_none_c; }
    if (p->e - p->s >= 3 && !memcmp(p->s, "NaN", 3)) { p->s += 3; return jv_float(p->c, NAN); }
    if (p->e - p->s >= 8 && !memcmp(p->s, "Infinity", 8)) { p->s += 8; return jv_float(p->c, INFINITY); }
    if (p->e - p->s >= 9 && !memcmp(p->s, "-Infinity", 9)) { p->s += 9; return jv_float(p->c, -INFINITY); }
    if (ch == '-' || (ch >= '0' && ch <= '9')) {
        const char *q = p->s;
        int is_float = 0;
        if (*q == '-') q++;
        if (q >= p->e || !(*q >= '0' && *q <= '9')) return jp_fail(p, "bad number");
        while (q < p->e && ((*q >= '0' && *q <= '9') || *q == '.' || *q == 'e' || *q == 'E' || *q == '+' || *q == '-')) {
            if (*q == '.' || *q == 'e' || *q == 'E') is_float = 1;
            q++;
        }
        char tmp[400];
        size_t l = (size_t)(q - p->s);
        if (l >= sizeof tmp) return jp_fail(p, "number too long");
        memcpy(tmp, p->s, l);
        tmp[l] = 0;
        p->s = q;
        char *end;
        if (is_float) {
            double f = strtod(tmp, &end);
            if (*end) return jp_fail(p, "bad number");
            return jv_float(p->c, f);
        }
        errno = 0;
        long long i = strtoll(tmp, &end, 10);
        if (*end) return jp_fail(p, "bad number");
        if (errno == ERANGE) {
            jj_fail(p->c, DF_EUNSUPPORTED, "integer %s does not fit in 64 bits (not supported by deltafin's Jinja subset)", tmp);
            return NULL;
        }
        return jv_int(p->c, i);
    }
    return jp_fail(p, "unexpected character");
}

jv *jv_json_parse(jj_ctx *c, const char *s, size_t n) {
    jp p = {c, s, s + n};
    jv *v = jp_value(&p, 0);
    if (!v) return NULL;
    jp_ws(&p);
    if (p.s != p.e) return jp_fail(&p, "trailing characters");
    return v;
}
