/* jinja_builtins.c — what the Jinja subset knows about values: attribute and
 * item access as jinja2's ImmutableSandboxedEnvironment does it (Python
 * attributes first for ".", items first for "[]"; methods that modify a list
 * or a dict are "unsafe"), iteration, arithmetic operators, Python string /
 * dict / list methods, the globals range, namespace, dict, raise_exception
 * and strftime_now, and the value helpers the filters share (jinja_filters.c
 * holds the filters and tests). A known Python method we do not implement is
 * refused by name, never approximated. */
#include "jinja_int.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ============================================================ arguments */

/* Bind positional and keyword arguments to named parameters (Python style).
 * out[i] = NULL for a parameter not given. extra_* receive surplus arguments
 * when non-NULL (filters with *args / **kwargs). */
int jj_bind(jj_ctx *c, const char *what, const char *const *params, int np, jv **args, int nargs,
            const char **kwn, jv **kwv, int nkw, jv **out, int allow_extra_pos) {
    for (int i = 0; i < np; i++) out[i] = NULL;
    if (nargs > np && !allow_extra_pos) {
        jj_fail(c, DF_EINVAL, "TypeError: %s() takes at most %d argument%s (%d given)", what, np, np == 1 ? "" : "s", nargs);
        return -1;
    }
    for (int i = 0; i < nargs && i < np; i++) out[i] = args[i];
    for (int k = 0; k < nkw; k++) {
        int found = -1;
        for (int i = 0; i < np; i++) if (!strcmp(params[i], kwn[k])) found = i;
        if (found < 0) {
            jj_fail(c, DF_EINVAL, "TypeError: %s() got an unexpected keyword argument '%s'", what, kwn[k]);
            return -1;
        }
        if (out[found]) {
            jj_fail(c, DF_EINVAL, "TypeError: %s() got multiple values for argument '%s'", what, kwn[k]);
            return -1;
        }
        out[found] = kwv[k];
    }
    return 0;
}

int jj_need_str(jj_ctx *c, jv *v, const char *what) {
    if (v && v->t == JV_STR) return 0;
    if (v && v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: %s must be str, not %s", what, v ? jv_type_name(v) : "nothing");
    return -1;
}

int jj_need_int(jj_ctx *c, jv *v, int64_t *out, const char *what) {
    if (v && (v->t == JV_INT || v->t == JV_BOOL)) { *out = v->t == JV_INT ? v->i : v->b; return 0; }
    if (v && v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: %s must be an integer, not %s", what, v ? jv_type_name(v) : "nothing");
    return -1;
}

jv *jj_strval(jj_ctx *c, jb *b) {
    jv *r = jv_str(c, b->p ? b->p : "", b->n);
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    return r;
}

/* ============================================================ iteration */

jv *jj_iterate(jj_ctx *c, jv *v) {
    switch (v->t) {
    case JV_LIST: case JV_TUPLE:
        if (v->flags & JV_F_ITER) { /* a generator runs once */
            if (v->flags & JV_F_CONSUMED) {
                jj_fail(c, DF_EUNSUPPORTED, "iterating a generator (the result of map / select / items / unique / "
                        "reverse) a second time is not supported by deltafin's Jinja subset: add |list");
                return NULL;
            }
            v->flags |= JV_F_CONSUMED;
        }
        return v;
    case JV_UNDEF: return jv_list(c, JV_LIST, 0);
    case JV_STR: {
        size_t n = ju_len(v->s.p, v->s.n);
        jv *l = jv_list(c, JV_LIST, n);
        if (!l) return NULL;
        size_t i = 0;
        for (size_t k = 0; k < n; k++) {
            size_t j = i + 1;
            while (j < v->s.n && ((unsigned char)v->s.p[j] & 0xC0) == 0x80) j++;
            if (!(l->l.a[k] = jv_str_nocopy(c, v->s.p + i, j - i))) return NULL;
            i = j;
        }
        return l;
    }
    case JV_DICT: {
        jv *l = jv_list(c, JV_LIST, v->d.n);
        if (!l) return NULL;
        for (size_t i = 0; i < v->d.n; i++) l->l.a[i] = v->d.e[i].k;
        return l;
    }
    default:
        jj_fail(c, DF_EINVAL, "TypeError: '%s' object is not iterable", jv_type_name(v));
        return NULL;
    }
}

/* ============================================================ methods */

enum {
    /* str */
    M_S_UPPER = 1, M_S_LOWER, M_S_STRIP, M_S_LSTRIP, M_S_RSTRIP, M_S_SPLIT, M_S_RSPLIT, M_S_STARTSWITH, M_S_ENDSWITH,
    M_S_REPLACE, M_S_FIND, M_S_RFIND, M_S_INDEX, M_S_RINDEX, M_S_COUNT, M_S_JOIN, M_S_TITLE, M_S_CAPITALIZE,
    M_S_FORMAT, M_S_SPLITLINES, M_S_ISDIGIT, M_S_ISALPHA, M_S_ISALNUM, M_S_ISSPACE, M_S_ISLOWER, M_S_ISUPPER,
    M_S_REMOVEPREFIX, M_S_REMOVESUFFIX, M_S_PARTITION, M_S_RPARTITION, M_S_SWAPCASE, M_S_ZFILL, M_S_CENTER,
    M_S_LJUST, M_S_RJUST, M_S_ISDECIMAL, M_S_ISNUMERIC, M_S_ISASCII,
    /* dict */
    M_D_GET = 100, M_D_ITEMS, M_D_KEYS, M_D_VALUES, M_D_COPY,
    /* list / tuple */
    M_L_COUNT = 200, M_L_INDEX, M_L_COPY,
    /* loop */
    M_LOOP_CYCLE = 300, M_LOOP_CHANGED,
    /* globals */
    G_RANGE = 400, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_CYCLER, G_JOINER, G_LIPSUM
};

static const jj_mdef str_methods[] = {
    {"upper", M_S_UPPER}, {"lower", M_S_LOWER}, {"strip", M_S_STRIP}, {"lstrip", M_S_LSTRIP}, {"rstrip", M_S_RSTRIP},
    {"split", M_S_SPLIT}, {"rsplit", M_S_RSPLIT}, {"startswith", M_S_STARTSWITH}, {"endswith", M_S_ENDSWITH},
    {"replace", M_S_REPLACE}, {"find", M_S_FIND}, {"rfind", M_S_RFIND}, {"index", M_S_INDEX}, {"rindex", M_S_RINDEX},
    {"count", M_S_COUNT}, {"join", M_S_JOIN}, {"title", M_S_TITLE}, {"capitalize", M_S_CAPITALIZE},
    {"format", M_S_FORMAT}, {"splitlines", M_S_SPLITLINES}, {"isdigit", M_S_ISDIGIT}, {"isalpha", M_S_ISALPHA},
    {"isalnum", M_S_ISALNUM}, {"isspace", M_S_ISSPACE}, {"islower", M_S_ISLOWER}, {"isupper", M_S_ISUPPER},
    {"removeprefix", M_S_REMOVEPREFIX}, {"removesuffix", M_S_REMOVESUFFIX}, {"partition", M_S_PARTITION},
    {"rpartition", M_S_RPARTITION}, {"swapcase", M_S_SWAPCASE}, {"zfill", M_S_ZFILL}, {"center", M_S_CENTER},
    {"ljust", M_S_LJUST}, {"rjust", M_S_RJUST}, {"isdecimal", M_S_ISDECIMAL}, {"isnumeric", M_S_ISNUMERIC},
    {"isascii", M_S_ISASCII},
    /* Python str methods outside the subset: refused when accessed */
    {"casefold", 0}, {"encode", 0}, {"expandtabs", 0}, {"format_map", 0}, {"isidentifier", 0}, {"isprintable", 0},
    {"istitle", 0}, {"maketrans", 0}, {"translate", 0}, {NULL, 0}};
static const jj_mdef dict_methods[] = {
    {"get", M_D_GET}, {"items", M_D_ITEMS}, {"keys", M_D_KEYS}, {"values", M_D_VALUES}, {"copy", M_D_COPY},
    {"fromkeys", 0}, {"clear", -1}, {"pop", -1}, {"popitem", -1}, {"setdefault", -1}, {"update", -1}, {NULL, 0}};
static const jj_mdef list_methods[] = {
    {"count", M_L_COUNT}, {"index", M_L_INDEX}, {"copy", M_L_COPY}, {"append", -1}, {"clear", -1}, {"extend", -1},
    {"insert", -1}, {"pop", -1}, {"remove", -1}, {"reverse", -1}, {"sort", -1}, {NULL, 0}};
static const jj_mdef tuple_methods[] = {{"count", M_L_COUNT}, {"index", M_L_INDEX}, {NULL, 0}};
static const jj_mdef num_attrs[] = {
    {"as_integer_ratio", 0}, {"bit_count", 0}, {"bit_length", 0}, {"conjugate", 0}, {"denominator", 0},
    {"from_bytes", 0}, {"imag", 0}, {"numerator", 0}, {"real", 0}, {"to_bytes", 0}, {"fromhex", 0}, {"hex", 0},
    {"is_integer", 0}, {NULL, 0}};

static jv *bound(jj_ctx *c, int id, jv *self, const char *name) {
    jv *m = jv_new(c, id >= G_RANGE ? JV_FUNC : JV_METHOD);
    if (!m) return NULL;
    m->fn.id = id;
    m->fn.self = self;
    m->fn.name = name;
    return m;
}

jv *jj_method(jj_ctx *c, jv *obj, const char *name, size_t nlen, int *is_attr) {
    (void)nlen;
    *is_attr = 0;
    const jj_mdef *tbl = NULL;
    switch (obj->t) {
    case JV_STR: tbl = str_methods; break;
    case JV_DICT: tbl = dict_methods; break;
    case JV_LIST: tbl = list_methods; break;
    case JV_TUPLE: tbl = tuple_methods; break;
    case JV_INT: case JV_FLOAT: case JV_BOOL: tbl = num_attrs; break;
    default: return NULL;
    }
    for (; tbl->name; tbl++) {
        if (strcmp(tbl->name, name)) continue;
        *is_attr = 1;
        if (tbl->id > 0) return bound(c, tbl->id, obj, tbl->name);
        if (tbl->id < 0) { /* ImmutableSandboxedEnvironment: modifying methods are unsafe */
            jv *u = jv_undef(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
            if (u) u->flags |= JV_F_UNSAFE_ATTR;
            return u;
        }
        jj_fail(c, DF_EUNSUPPORTED, "the Python %s attribute '%s' is not supported by deltafin's Jinja subset",
                jv_type_name(obj), name);
        return NULL;
    }
    return NULL;
}

static jv *no_attr(jj_ctx *c, jv *obj, const char *name) {
    if (obj->t == JV_NONE) return jv_undef(c, "'None' has no attribute '%s'", name);
    return jv_undef(c, "'%s object' has no attribute '%s'", jv_type_name(obj), name);
}

static jv *loop_attr(jj_ctx *c, jv *lv, const char *name) {
    struct jj_loop *l = lv->loop;
    if (!strcmp(name, "index")) return jv_int(c, l->i + 1);
    if (!strcmp(name, "index0")) return jv_int(c, l->i);
    if (!strcmp(name, "revindex")) return jv_int(c, l->n - l->i);
    if (!strcmp(name, "revindex0")) return jv_int(c, l->n - l->i - 1);
    if (!strcmp(name, "first")) return jv_bool(l->i == 0);
    if (!strcmp(name, "last")) return jv_bool(l->i == l->n - 1);
    if (!strcmp(name, "length")) return jv_int(c, l->n);
    if (!strcmp(name, "depth")) return jv_int(c, l->depth);
    if (!strcmp(name, "depth0")) return jv_int(c, l->depth - 1);
    if (!strcmp(name, "previtem"))
        return l->i > 0 ? l->items[l->i - 1] : jv_undef(c, "there is no previous item");
    if (!strcmp(name, "nextitem"))
        return l->i + 1 < l->n ? l->items[l->i + 1] : jv_undef(c, "there is no next item");
    if (!strcmp(name, "cycle")) return bound(c, M_LOOP_CYCLE, lv, "cycle");
    if (!strcmp(name, "changed")) return bound(c, M_LOOP_CHANGED, lv, "changed");
    return no_attr(c, lv, name);
}

jv *jj_getattr(jj_ctx *c, jv *obj, const char *name, size_t nlen) {
    if (!strncmp(name, "__", 2)) { /* dunder attributes exist on every object and are unsafe */
        jv *u = jv_undef(c, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(obj));
        if (u) u->flags |= JV_F_UNSAFE_ATTR;
        return u;
    }
    if (obj->t == JV_LOOP) return loop_attr(c, obj, name);
    if (obj->t == JV_NS) {
        jv *v = jv_dict_gets(obj, name);
        return v ? v : no_attr(c, obj, name);
    }
    int is_attr;
    jv *m = jj_method(c, obj, name, nlen, &is_attr);
    if (m || is_attr || c->rc) return m;
    if (obj->t == JV_DICT) {
        jv *v = jv_dict_gets(obj, name);
        if (v) return v;
    }
    return no_attr(c, obj, name);
}

jv *jj_getitem(jj_ctx *c, jv *obj, jv *key) {
    if (obj->flags & JV_F_ITER) return jv_undef(c, "'%s object' has no element", jv_type_name(obj));
    switch (obj->t) {
    case JV_DICT: {
        if (key->t != JV_LIST && key->t != JV_DICT && key->t != JV_NS) {
            jv *v = jv_dict_get(obj, key);
            if (v) return v;
        }
        break;
    }
    case JV_LIST: case JV_TUPLE: case JV_STR:
        if (key->t == JV_INT || key->t == JV_BOOL) {
            int64_t i = key->t == JV_INT ? key->i : key->b;
            int64_t n = obj->t == JV_STR ? (int64_t)ju_len(obj->s.p, obj->s.n) : (int64_t)obj->l.n;
            int64_t j = i < 0 ? i + n : i;
            if (j < 0 || j >= n) return jv_undef(c, "'%s object' has no element %lld", jv_type_name(obj), (long long)i);
            if (obj->t != JV_STR) return obj->l.a[j];
            size_t a = ju_offset(obj->s.p, obj->s.n, (size_t)j), b = ju_offset(obj->s.p, obj->s.n, (size_t)j + 1);
            return jv_str_nocopy(c, obj->s.p + a, b - a);
        }
        break;
    default:
        break;
    }
    if (key->t == JV_STR) {
        if (obj->t == JV_DICT) {
            if (!strncmp(key->s.p, "__", 2)) return jj_getattr(c, obj, key->s.p, key->s.n);
            int is_attr;
            jv *m = jj_method(c, obj, key->s.p, key->s.n, &is_attr);
            if (m || is_attr || c->rc) return m;
            return no_attr(c, obj, key->s.p);
        }
        return jj_getattr(c, obj, key->s.p, key->s.n);
    }
    jb b = {0};
    if (jv_repr(c, key, &b)) { free(b.p); return NULL; }
    jv *u = obj->t == JV_NONE ? jv_undef(c, "'None' has no element %s", b.p)
                              : jv_undef(c, "'%s object' has no element %s", jv_type_name(obj), b.p);
    free(b.p);
    return u;
}

/* ============================================================ arithmetic */

void jj_html_escape(const char *s, size_t n, jb *b) {
    for (size_t i = 0; i < n; i++) {
        switch (s[i]) {
        case '&': jb_puts(b, "&amp;"); break;
        case '<': jb_puts(b, "&lt;"); break;
        case '>': jb_puts(b, "&gt;"); break;
        case '"': jb_puts(b, "&#34;"); break;
        case '\'': jb_puts(b, "&#39;"); break;
        default: jb_putc(b, s[i]);
        }
    }
}

static jv *type_error(jj_ctx *c, const char *op, jv *a, jv *b) {
    if (a->t == JV_UNDEF) return jj_undef_fail(c, a);
    if (b->t == JV_UNDEF) return jj_undef_fail(c, b);
    if (!strcmp(op, "+") && a->t == JV_STR)
        jj_fail(c, DF_EINVAL, "TypeError: can only concatenate str (not \"%s\") to str", jv_type_name(b));
    else if (!strcmp(op, "+") && a->t == JV_LIST)
        jj_fail(c, DF_EINVAL, "TypeError: can only concatenate list (not \"%s\") to list", jv_type_name(b));
    else
        jj_fail(c, DF_EINVAL, "TypeError: unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(a),
                jv_type_name(b));
    return NULL;
}

jv *jj_overflow(jj_ctx *c) {
    jj_fail(c, DF_EUNSUPPORTED, "integer arithmetic beyond 64 bits is not supported by deltafin's Jinja subset");
    return NULL;
}

static jv *repeat(jj_ctx *c, jv *seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq->t == JV_STR) {
        if (seq->s.n && (uint64_t)k > (1u << 30) / seq->s.n) { jj_fail(c, DF_ENOMEM, "string repetition too large"); return NULL; }
        jb b = {0};
        for (int64_t i = 0; i < k; i++) jb_put(&b, seq->s.p, seq->s.n);
        return jj_strval(c, &b);
    }
    if (seq->l.n && (uint64_t)k > (1u << 26) / seq->l.n) { jj_fail(c, DF_ENOMEM, "list repetition too large"); return NULL; }
    jv *r = jv_list(c, seq->t, seq->l.n * (size_t)k);
    if (!r) return NULL;
    for (int64_t i = 0; i < k; i++) memcpy(r->l.a + i * seq->l.n, seq->l.a, seq->l.n * sizeof(jv *));
    return r;
}

jv *jj_binop(jj_ctx *c, int op, jv *a, jv *b) {
    static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "** or pow()"};
    if (op == OP_MOD && a->t == JV_STR) return jj_percent_format(c, a, b); /* str % Undefined formats it */
    if (a->t == JV_UNDEF) return jj_undef_fail(c, a);
    if (b->t == JV_UNDEF) return jj_undef_fail(c, b);
    int an = jv_is_number(a), bn = jv_is_number(b);
    if (an && bn) {
        int fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
        if (!fl) {
            int64_t x = a->t == JV_INT ? a->i : a->b, y = b->t == JV_INT ? b->i : b->b, r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) return jj_overflow(c); return jv_int(c, r);
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) return jj_overflow(c); return jv_int(c, r);
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) return jj_overflow(c); return jv_int(c, r);
            case OP_DIV:
                if (!y) { jj_fail(c, DF_EINVAL, "ZeroDivisionError: division by zero"); return NULL; }
                return jv_float(c, (double)x / (double)y);
            case OP_FLOORDIV: case OP_MOD: {
                if (!y) {
                    jj_fail(c, DF_EINVAL, "ZeroDivisionError: integer %s by zero", op == OP_MOD ? "modulo" : "division or modulo");
                    return NULL;
                }
                if (x == INT64_MIN && y == -1) return jj_overflow(c);
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(c, op == OP_MOD ? m : q);
            }
            case OP_POW: {
                if (y < 0) return jv_float(c, pow((double)x, (double)y));
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e) {
                    if (e & 1) { if (__builtin_mul_overflow(acc, base, &acc)) return jj_overflow(c); }
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) return jj_overflow(c);
                }
                return jv_int(c, acc);
            }
            }
        }
        double x = jv_num(a), y = jv_num(b);
        switch (op) {
        case OP_ADD: return jv_float(c, x + y);
        case OP_SUB: return jv_float(c, x - y);
        case OP_MUL: return jv_float(c, x * y);
        case OP_DIV:
            if (y == 0) { jj_fail(c, DF_EINVAL, "ZeroDivisionError: float division by zero"); return NULL; }
            return jv_float(c, x / y);
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) { jj_fail(c, DF_EINVAL, "ZeroDivisionError: float %s by zero", op == OP_MOD ? "modulo" : "floor division"); return NULL; }
            double m = fmod(x, y);
            double dv = (x - m) / y;
            if (m) { if ((y < 0) != (m < 0)) { m += y; dv -= 1.0; } }
            else m = copysign(0.0, y);
            if (op == OP_MOD) return jv_float(c, m);
            double fd;
            if (dv) { fd = floor(dv); if (dv - fd > 0.5) fd += 1.0; }
            else fd = copysign(0.0, x / y);
            return jv_float(c, fd);
        }
        case OP_POW:
            if (x == 0 && y < 0) { jj_fail(c, DF_EINVAL, "ZeroDivisionError: 0.0 cannot be raised to a negative power"); return NULL; }
            return jv_float(c, pow(x, y));
        }
    }
    if (op == OP_ADD) {
        if (a->t == JV_STR && b->t == JV_STR) {
            jb o = {0};
            int safe = (a->flags | b->flags) & JV_F_SAFE;
            if (safe && !(a->flags & JV_F_SAFE)) jj_html_escape(a->s.p, a->s.n, &o); else jb_put(&o, a->s.p, a->s.n);
            if (safe && !(b->flags & JV_F_SAFE)) jj_html_escape(b->s.p, b->s.n, &o); else jb_put(&o, b->s.p, b->s.n);
            jv *r = jj_strval(c, &o);
            if (r && safe) r->flags |= JV_F_SAFE;
            return r;
        }
        if ((a->t == JV_LIST || a->t == JV_TUPLE) && a->t == b->t && !(a->flags | b->flags)) {
            jv *r = jv_list(c, a->t, a->l.n + b->l.n);
            if (!r) return NULL;
            if (a->l.n) memcpy(r->l.a, a->l.a, a->l.n * sizeof(jv *));
            if (b->l.n) memcpy(r->l.a + a->l.n, b->l.a, b->l.n * sizeof(jv *));
            return r;
        }
    }
    if (op == OP_MUL) {
        if ((a->t == JV_STR || a->t == JV_LIST || a->t == JV_TUPLE) && (b->t == JV_INT || b->t == JV_BOOL))
            return repeat(c, a, b->t == JV_INT ? b->i : b->b);
        if ((b->t == JV_STR || b->t == JV_LIST || b->t == JV_TUPLE) && (a->t == JV_INT || a->t == JV_BOOL))
            return repeat(c, b, a->t == JV_INT ? a->i : a->b);
    }
    if (op == OP_MOD && a->t == JV_STR) return jj_percent_format(c, a, b);
    return type_error(c, names[op], a, b);
}

/* ============================================================ strings */

static int is_ws_at(const char *s, size_t n, size_t i, size_t *adv) {
    int32_t cp = ju_decode(s + i, n - i, adv);
    return ju_isspace(cp);
}

/* strip chars (NULL = whitespace) from the left (1), right (2) or both (3) */
jv *jj_strip(jj_ctx *c, jv *s, jv *chars, int sides) {
    if (chars && chars->t != JV_NONE && jj_need_str(c, chars, "strip arg")) return NULL;
    const char *p = s->s.p;
    size_t n = s->s.n, i = 0, e = n;
    int use_chars = chars && chars->t == JV_STR;
    for (;;) { /* left */
        if (!(sides & 1) || i >= e) break;
        size_t adv;
        int32_t cp = ju_decode(p + i, e - i, &adv);
        int hit = 0;
        if (use_chars) {
            for (size_t k = 0; k < chars->s.n;) {
                size_t a2;
                if (ju_decode(chars->s.p + k, chars->s.n - k, &a2) == cp) { hit = 1; break; }
                k += a2;
            }
        } else hit = ju_isspace(cp);
        if (!hit) break;
        i += adv;
    }
    while ((sides & 2) && e > i) { /* right */
        size_t k = e - 1;
        while (k > i && ((unsigned char)p[k] & 0xC0) == 0x80) k--;
        size_t adv;
        int32_t cp = ju_decode(p + k, e - k, &adv);
        int hit = 0;
        if (use_chars) {
            for (size_t q = 0; q < chars->s.n;) {
                size_t a2;
                if (ju_decode(chars->s.p + q, chars->s.n - q, &a2) == cp) { hit = 1; break; }
                q += a2;
            }
        } else hit = ju_isspace(cp);
        if (!hit) break;
        e = k;
    }
    jv *r = jv_str_nocopy(c, p + i, e - i);
    if (r) r->flags = s->flags & JV_F_SAFE;
    return r;
}

const char *jj_memmem(const char *h, size_t hn, const char *nd, size_t nn) {
    if (!nn) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++) if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}
const char *jj_memrmem(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;) if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

jv *jj_list_from(jj_ctx *c, jv **items, size_t n) {
    jv *l = jv_list(c, JV_LIST, n);
    if (l && n) memcpy(l->l.a, items, n * sizeof *items);
    return l;
}

int jj_vec_push(jj_ctx *c, jj_vec *a, jv *x) {
    if (!x) return -1;
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 8;
        jv **v = realloc(a->v, cap * sizeof *v);
        if (!v) { jj_fail(c, DF_ENOMEM, "out of memory"); return -1; }
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return 0;
}
jv *jj_vec_list(jj_ctx *c, jj_vec *a) {
    jv *l = jj_list_from(c, a->v, a->n);
    free(a->v);
    a->v = NULL;
    return l;
}

/* str.split / rsplit */
static jv *do_split(jj_ctx *c, jv *s, jv *sep, jv *maxsplit, int right) {
    int64_t maxs = -1;
    if (maxsplit && jj_need_int(c, maxsplit, &maxs, "maxsplit")) return NULL;
    jj_vec out = {0};
    const char *p = s->s.p;
    size_t n = s->s.n;
    if (!sep || sep->t == JV_NONE) { /* runs of whitespace */
        if (!right) {
            size_t i = 0;
            int64_t k = 0;
            for (;;) {
                size_t adv;
                while (i < n && is_ws_at(p, n, i, &adv)) i += adv;
                if (i >= n) break;
                if (maxs >= 0 && k >= maxs) { /* the rest, as it is */
                    if (jj_vec_push(c, &out, jv_str_nocopy(c, p + i, n - i))) { free(out.v); return NULL; }
                    break;
                }
                size_t j = i;
                while (j < n && !is_ws_at(p, n, j, &adv)) j += adv;
                if (jj_vec_push(c, &out, jv_str_nocopy(c, p + i, j - i))) { free(out.v); return NULL; }
                k++;
                i = j;
            }
            return jj_vec_list(c, &out);
        }
        /* rsplit(None): collect from the right */
        jj_vec rev = {0};
        size_t e = n;
        int64_t k = 0;
        for (;;) {
            size_t adv;
            while (e > 0) {
                size_t q = e - 1;
                while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                if (!is_ws_at(p, n, q, &adv)) break;
                e = q;
            }
            if (!e) break;
            if (maxs >= 0 && k >= maxs) {
                if (jj_vec_push(c, &rev, jv_str_nocopy(c, p, e))) { free(rev.v); return NULL; }
                break;
            }
            size_t i = e;
            while (i > 0) {
                size_t q = i - 1;
                while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                if (is_ws_at(p, n, q, &adv)) break;
                i = q;
            }
            if (jj_vec_push(c, &rev, jv_str_nocopy(c, p + i, e - i))) { free(rev.v); return NULL; }
            k++;
            e = i;
        }
        for (size_t a = 0; a < rev.n / 2; a++) { jv *t = rev.v[a]; rev.v[a] = rev.v[rev.n - 1 - a]; rev.v[rev.n - 1 - a] = t; }
        return jj_vec_list(c, &rev);
    }
    if (jj_need_str(c, sep, "separator")) return NULL;
    if (!sep->s.n) { jj_fail(c, DF_EINVAL, "ValueError: empty separator"); return NULL; }
    if (!right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *h = (maxs < 0 || k < maxs) ? jj_memmem(p + i, n - i, sep->s.p, sep->s.n) : NULL;
            if (!h) { if (jj_vec_push(c, &out, jv_str_nocopy(c, p + i, n - i))) { free(out.v); return NULL; } break; }
            if (jj_vec_push(c, &out, jv_str_nocopy(c, p + i, (size_t)(h - (p + i))))) { free(out.v); return NULL; }
            i = (size_t)(h - p) + sep->s.n;
            k++;
        }
        return jj_vec_list(c, &out);
    }
    size_t e = n;
    int64_t k = 0;
    for (;;) {
        const char *h = (maxs < 0 || k < maxs) ? jj_memrmem(p, e, sep->s.p, sep->s.n) : NULL;
        if (!h) { if (jj_vec_push(c, &out, jv_str_nocopy(c, p, e))) { free(out.v); return NULL; } break; }
        size_t st = (size_t)(h - p) + sep->s.n;
        if (jj_vec_push(c, &out, jv_str_nocopy(c, p + st, e - st))) { free(out.v); return NULL; }
        e = (size_t)(h - p);
        k++;
    }
    for (size_t a = 0; a < out.n / 2; a++) { jv *t = out.v[a]; out.v[a] = out.v[out.n - 1 - a]; out.v[out.n - 1 - a] = t; }
    return jj_vec_list(c, &out);
}

/* case mapping of each code point (utf8proc's simple mappings) */
void jj_case_map(const char *s, size_t n, int mode, jb *b) {
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        int32_t m = cp;
        if (mode == CASE_UPPER) m = utf8proc_toupper(cp);
        else if (mode == CASE_LOWER) m = utf8proc_tolower(cp);
        else m = utf8proc_islower(cp) ? utf8proc_toupper(cp) : utf8proc_isupper(cp) ? utf8proc_tolower(cp) : cp;
        if (mode != CASE_LOWER && cp == 0xDF) { jb_puts(b, "SS"); i += adv; continue; } /* ß */
        char t[4];
        jb_put(b, t, (size_t)ju_encode(m, t));
        i += adv;
    }
}

static int is_cased_letter(int32_t cp) {
    return utf8proc_isupper(cp) || utf8proc_islower(cp) || utf8proc_category(cp) == UTF8PROC_CATEGORY_LT;
}

/* Python str.title(): a letter after an uncased character is upper-cased */
static void py_title(const char *s, size_t n, jb *b) {
    int prev_cased = 0;
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        int32_t m = cp;
        if (is_cased_letter(cp)) {
            m = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = 1;
        } else prev_cased = 0;
        char t[4];
        jb_put(b, t, (size_t)ju_encode(m, t));
        i += adv;
    }
}

/* Python str.capitalize(): first character title-cased, the rest lower-cased */
void jj_py_capitalize(const char *s, size_t n, jb *b) {
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        int32_t m = i == 0 ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
        char t[4];
        jb_put(b, t, (size_t)ju_encode(m, t));
        i += adv;
    }
}

int jj_str_pred(const jv *s, int kind) {
    /* 1 digit 2 alpha 3 alnum 4 space 5 lower 6 upper 7 decimal 8 numeric 9 ascii */
    if (kind == 9) { for (size_t i = 0; i < s->s.n; i++) if ((unsigned char)s->s.p[i] >= 0x80) return 0; return 1; }
    if (!s->s.n) return 0;
    int cased = 0;
    size_t i = 0;
    while (i < s->s.n) {
        size_t adv;
        int32_t cp = ju_decode(s->s.p + i, s->s.n - i, &adv);
        utf8proc_category_t k = utf8proc_category(cp);
        int letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        int dec = k == UTF8PROC_CATEGORY_ND;
        int num = dec || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 1: case 7: if (!dec) return 0; break;
        case 8: if (!num) return 0; break;
        case 2: if (!letter) return 0; break;
        case 3: if (!letter && !num) return 0; break;
        case 4: if (!ju_isspace(cp)) return 0; break;
        case 5: if (utf8proc_isupper(cp) || k == UTF8PROC_CATEGORY_LT) return 0; if (utf8proc_islower(cp)) cased = 1; break;
        case 6: if (utf8proc_islower(cp) || k == UTF8PROC_CATEGORY_LT) return 0; if (utf8proc_isupper(cp)) cased = 1; break;
        }
        i += adv;
    }
    return kind == 5 || kind == 6 ? cased : 1;
}

/* str.splitlines(keepends) */
jv *jj_splitlines(jj_ctx *c, const char *p, size_t n, int keep) {
    jj_vec out = {0};
    size_t i = 0, st = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(p + i, n - i, &adv);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (brk) {
            size_t e = i + adv;
            if (cp == '\r' && e < n && p[e] == '\n') e++;
            if (jj_vec_push(c, &out, jv_str_nocopy(c, p + st, (keep ? e : i) - st))) { free(out.v); return NULL; }
            st = i = e;
            continue;
        }
        i += adv;
    }
    if (st < n && jj_vec_push(c, &out, jv_str_nocopy(c, p + st, n - st))) { free(out.v); return NULL; }
    return jj_vec_list(c, &out);
}

/* Python %-formatting: "%s" % x, "%(k)s" % d, flags/width/precision for s r d i f F e E g G x X o c */
jv *jj_percent_format(jj_ctx *c, jv *fmt, jv *args) {
    jv **av = NULL;
    size_t an = 0, ai = 0;
    jv *mapping = NULL;
    /* CPython: an argument with __getitem__ that is not a tuple or a str (dict, list, Undefined) never
     * raises "not all arguments converted" */
    int mapping_like = args->t == JV_DICT || args->t == JV_LIST || args->t == JV_UNDEF;
    if (args->t == JV_TUPLE) { av = args->l.a; an = args->l.n; }
    else if (args->t == JV_DICT) { mapping = args; av = &args; an = 1; }
    else { av = &args; an = 1; }
    jb b = {0};
    const char *p = fmt->s.p, *e = p + fmt->s.n;
    while (p < e) {
        if (*p != '%') { jb_putc(&b, *p++); continue; }
        p++;
        if (p < e && *p == '%') { jb_putc(&b, '%'); p++; continue; }
        jv *v = NULL;
        if (p < e && *p == '(') {
            const char *k = ++p;
            while (p < e && *p != ')') p++;
            if (args->t == JV_UNDEF) { free(b.p); jj_undef_fail(c, args); return NULL; }
            if (!mapping || p >= e) { free(b.p); jj_fail(c, DF_EINVAL, "TypeError: format requires a mapping"); return NULL; }
            jv *key = jv_str(c, k, (size_t)(p - k));
            p++;
            if (!key) { free(b.p); return NULL; }
            v = jv_dict_get(mapping, key);
            if (!v) { free(b.p); jj_fail(c, DF_EINVAL, "KeyError: '%.*s'", (int)key->s.n, key->s.p); return NULL; }
        }
        char spec[32];
        size_t sl = 0;
        spec[sl++] = '%';
        while (p < e && strchr("-+ 0#", *p) && sl < 20) spec[sl++] = *p++;
        while (p < e && *p >= '0' && *p <= '9' && sl < 24) spec[sl++] = *p++;
        if (p < e && *p == '.') { spec[sl++] = *p++; while (p < e && *p >= '0' && *p <= '9' && sl < 28) spec[sl++] = *p++; }
        if (p >= e) { free(b.p); jj_fail(c, DF_EINVAL, "ValueError: incomplete format"); return NULL; }
        char conv = *p++;
        spec[sl] = 0;
        if (!v) {
            if (ai >= an) { free(b.p); jj_fail(c, DF_EINVAL, "TypeError: not enough arguments for format string"); return NULL; }
            v = av[ai++];
        }
        char tmp[512];
        if (conv == 's' || conv == 'r') {
            jb t = {0};
            if ((conv == 's' ? jv_to_str(c, v, &t) : jv_repr(c, v, &t))) { free(t.p); free(b.p); return NULL; }
            int width = 0, left = 0, prec = -1;
            for (size_t q = 1; q < sl; q++) {
                if (spec[q] == '-') left = 1;
                else if (spec[q] >= '0' && spec[q] <= '9') { width = atoi(spec + q); while (q + 1 < sl && spec[q + 1] >= '0' && spec[q + 1] <= '9') q++; }
                else if (spec[q] == '.') { prec = atoi(spec + q + 1); break; }
            }
            size_t len = t.p ? ju_len(t.p, t.n) : 0;
            size_t bytes = t.n;
            if (prec >= 0 && (size_t)prec < len) { bytes = ju_offset(t.p, t.n, (size_t)prec); len = (size_t)prec; }
            if (!left) for (size_t q = len; q < (size_t)width; q++) jb_putc(&b, ' ');
            jb_put(&b, t.p ? t.p : "", bytes);
            if (left) for (size_t q = len; q < (size_t)width; q++) jb_putc(&b, ' ');
            free(t.p);
            continue;
        }
        if (v->t == JV_UNDEF && conv != 's' && conv != 'r') { free(b.p); jj_undef_fail(c, v); return NULL; }
        if (strchr("diouxXc", conv)) {
            int64_t iv;
            if (v->t == JV_FLOAT && conv != 'c') iv = (int64_t)v->f;
            else if (v->t == JV_INT || v->t == JV_BOOL) iv = v->t == JV_INT ? v->i : v->b;
            else { free(b.p); jj_fail(c, DF_EINVAL, "TypeError: %%%c format: a real number is required, not %s", conv, jv_type_name(v)); return NULL; }
            if (conv == 'c') { char u[4]; jb_put(&b, u, (size_t)ju_encode((int32_t)iv, u)); continue; }
            if (conv == 'i' || conv == 'u') conv = 'd';
            spec[sl++] = 'l'; spec[sl++] = 'l'; spec[sl++] = conv; spec[sl] = 0;
            snprintf(tmp, sizeof tmp, spec, (long long)iv);
            jb_puts(&b, tmp);
            continue;
        }
        if (strchr("fFeEgG", conv)) {
            if (!jv_is_number(v)) { free(b.p); jj_fail(c, DF_EINVAL, "TypeError: must be real number, not %s", jv_type_name(v)); return NULL; }
            spec[sl++] = conv; spec[sl] = 0;
            snprintf(tmp, sizeof tmp, spec, jv_num(v));
            jb_puts(&b, tmp);
            continue;
        }
        free(b.p);
        jj_fail(c, DF_EUNSUPPORTED, "%%-format conversion '%c' is not supported by deltafin's Jinja subset", conv);
        return NULL;
    }
    if (ai < an && !mapping_like) {
        free(b.p);
        jj_fail(c, DF_EINVAL, "TypeError: not all arguments converted during string formatting");
        return NULL;
    }
    return jj_strval(c, &b);
}

/* str.format with {} / {0} / {name} and an optional !r / !s; format specs are refused */
static jv *brace_format(jj_ctx *c, jv *fmt, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    jb b = {0};
    const char *p = fmt->s.p, *e = p + fmt->s.n;
    int auto_i = 0;
    while (p < e) {
        if (*p == '{' && p + 1 < e && p[1] == '{') { jb_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < e && p[1] == '}') { jb_putc(&b, '}'); p += 2; continue; }
        if (*p != '{') { jb_putc(&b, *p++); continue; }
        const char *f = ++p;
        while (p < e && *p != '}' && *p != '!' && *p != ':') p++;
        size_t fl = (size_t)(p - f);
        char conv = 0;
        if (p < e && *p == '!') { conv = p[1]; p += 2; }
        if (p < e && *p == ':') { free(b.p); jj_fail(c, DF_EUNSUPPORTED, "str.format specs ('{…:spec}') are not supported by deltafin's Jinja subset"); return NULL; }
        if (p >= e || *p != '}') { free(b.p); jj_fail(c, DF_EINVAL, "ValueError: bad format string"); return NULL; }
        p++;
        jv *v = NULL;
        if (!fl) {
            if (auto_i >= nargs) { free(b.p); jj_fail(c, DF_EINVAL, "IndexError: Replacement index %d out of range", auto_i); return NULL; }
            v = args[auto_i++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            int k = atoi(f);
            if (k >= nargs) { free(b.p); jj_fail(c, DF_EINVAL, "IndexError: Replacement index %d out of range", k); return NULL; }
            v = args[k];
        } else {
            for (int k = 0; k < nkw; k++) if (strlen(kwn[k]) == fl && !memcmp(kwn[k], f, fl)) v = kwv[k];
            if (!v) {
                for (size_t q = 0; q < fl; q++) if (f[q] == '.' || f[q] == '[') {
                    free(b.p);
                    jj_fail(c, DF_EUNSUPPORTED, "attribute / index access inside str.format fields is not supported by deltafin's Jinja subset");
                    return NULL;
                }
                free(b.p);
                jj_fail(c, DF_EINVAL, "KeyError: '%.*s'", (int)fl, f);
                return NULL;
            }
        }
        if ((conv == 'r' ? jv_repr(c, v, &b) : jv_to_str(c, v, &b))) { free(b.p); return NULL; }
    }
    return jj_strval(c, &b);
}

static int64_t str_find(jv *s, jv *sub, jv *start, jv *end, int right) {
    int64_t n = (int64_t)ju_len(s->s.p, s->s.n), a = 0, z = n;
    if (start && (start->t == JV_INT)) { a = start->i < 0 ? start->i + n : start->i; if (a < 0) a = 0; }
    if (end && (end->t == JV_INT)) { z = end->i < 0 ? end->i + n : end->i; if (z > n) z = n; }
    if (a > n || a > z) return -1;
    size_t ba = ju_offset(s->s.p, s->s.n, (size_t)a), bz = ju_offset(s->s.p, s->s.n, (size_t)z);
    const char *h = right ? jj_memrmem(s->s.p + ba, bz - ba, sub->s.p, sub->s.n) : jj_memmem(s->s.p + ba, bz - ba, sub->s.p, sub->s.n);
    if (!h) return -1;
    return (int64_t)ju_len(s->s.p, (size_t)(h - s->s.p));
}

static jv *str_method(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    jv *s = fn->fn.self;
    jv *a[4] = {0};
    jb b = {0};
    const char *nm = fn->fn.name;
    switch (fn->fn.id) {
    case M_S_UPPER: case M_S_LOWER: case M_S_SWAPCASE: case M_S_TITLE: case M_S_CAPITALIZE: {
        if (jj_bind(c, nm, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int id = fn->fn.id;
        if (id == M_S_TITLE) py_title(s->s.p, s->s.n, &b);
        else if (id == M_S_CAPITALIZE) jj_py_capitalize(s->s.p, s->s.n, &b);
        else jj_case_map(s->s.p, s->s.n, id == M_S_UPPER ? CASE_UPPER : id == M_S_LOWER ? CASE_LOWER : CASE_SWAP, &b);
        return jj_strval(c, &b);
    }
    case M_S_STRIP: case M_S_LSTRIP: case M_S_RSTRIP: {
        static const char *const pp[] = {"chars"};
        if (jj_bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        jv *r = jj_strip(c, s, a[0], fn->fn.id == M_S_STRIP ? 3 : fn->fn.id == M_S_LSTRIP ? 1 : 2);
        if (r) r->flags = 0;
        return r;
    }
    case M_S_SPLIT: case M_S_RSPLIT: {
        static const char *const pp[] = {"sep", "maxsplit"};
        if (jj_bind(c, nm, pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        return do_split(c, s, a[0], a[1], fn->fn.id == M_S_RSPLIT);
    }
    case M_S_STARTSWITH: case M_S_ENDSWITH: {
        static const char *const pp[] = {"prefix", "start", "end"};
        if (jj_bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (!a[0]) { jj_fail(c, DF_EINVAL, "TypeError: %s() takes at least 1 argument (0 given)", nm); return NULL; }
        if (a[1] || a[2]) { jj_fail(c, DF_EUNSUPPORTED, "%s() with start/end is not supported by deltafin's Jinja subset", nm); return NULL; }
        jv **cands = &a[0];
        size_t nc = 1;
        if (a[0]->t == JV_TUPLE) { cands = a[0]->l.a; nc = a[0]->l.n; }
        for (size_t k = 0; k < nc; k++) {
            jv *x = cands[k];
            if (x->t != JV_STR) {
                jj_fail(c, DF_EINVAL, "TypeError: %s first arg must be str or a tuple of str, not %s", nm, jv_type_name(x));
                return NULL;
            }
            if (x->s.n > s->s.n) continue;
            const char *at = fn->fn.id == M_S_STARTSWITH ? s->s.p : s->s.p + s->s.n - x->s.n;
            if (!memcmp(at, x->s.p, x->s.n)) return &jv_true_c;
        }
        return &jv_false_c;
    }
    case M_S_REPLACE: {
        static const char *const pp[] = {"old", "new", "count"};
        if (jj_bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (!a[0] || !a[1]) { jj_fail(c, DF_EINVAL, "TypeError: replace expected at least 2 arguments"); return NULL; }
        if (jj_need_str(c, a[0], "replace() argument 1") || jj_need_str(c, a[1], "replace() argument 2")) return NULL;
        int64_t cnt = -1;
        if (a[2] && jj_need_int(c, a[2], &cnt, "count")) return NULL;
        const char *p = s->s.p;
        size_t n = s->s.n, i = 0;
        int64_t k = 0;
        if (!a[0]->s.n) { /* insert between every character */
            size_t adv;
            while (i <= n && (cnt < 0 || k < cnt)) {
                jb_put(&b, a[1]->s.p, a[1]->s.n);
                k++;
                if (i >= n) { i = n + 1; break; }
                ju_decode(p + i, n - i, &adv);
                jb_put(&b, p + i, adv);
                i += adv;
            }
            if (i <= n) jb_put(&b, p + i, n - i);
            return jj_strval(c, &b);
        }
        for (;;) {
            const char *h = (cnt < 0 || k < cnt) ? jj_memmem(p + i, n - i, a[0]->s.p, a[0]->s.n) : NULL;
            if (!h) { jb_put(&b, p + i, n - i); break; }
            jb_put(&b, p + i, (size_t)(h - (p + i)));
            jb_put(&b, a[1]->s.p, a[1]->s.n);
            i = (size_t)(h - p) + a[0]->s.n;
            k++;
        }
        return jj_strval(c, &b);
    }
    case M_S_FIND: case M_S_RFIND: case M_S_INDEX: case M_S_RINDEX: case M_S_COUNT: {
        static const char *const pp[] = {"sub", "start", "end"};
        if (jj_bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (jj_need_str(c, a[0], "substring")) return NULL;
        if (fn->fn.id == M_S_COUNT) {
            if (a[1] || a[2]) { jj_fail(c, DF_EUNSUPPORTED, "count() with start/end is not supported by deltafin's Jinja subset"); return NULL; }
            if (!a[0]->s.n) return jv_int(c, (int64_t)ju_len(s->s.p, s->s.n) + 1);
            int64_t k = 0;
            const char *p = s->s.p, *e = p + s->s.n;
            for (const char *h; (h = jj_memmem(p, (size_t)(e - p), a[0]->s.p, a[0]->s.n)); p = h + a[0]->s.n) k++;
            return jv_int(c, k);
        }
        int right = fn->fn.id == M_S_RFIND || fn->fn.id == M_S_RINDEX;
        int64_t r = str_find(s, a[0], a[1], a[2], right);
        if (r < 0 && (fn->fn.id == M_S_INDEX || fn->fn.id == M_S_RINDEX)) {
            jj_fail(c, DF_EINVAL, "ValueError: substring not found");
            return NULL;
        }
        return jv_int(c, r);
    }
    case M_S_JOIN: {
        static const char *const pp[] = {"iterable"};
        if (jj_bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (!a[0]) { jj_fail(c, DF_EINVAL, "TypeError: join() takes exactly one argument (0 given)"); return NULL; }
        jv *items = jj_iterate(c, a[0]);
        if (!items) return NULL;
        for (size_t i = 0; i < items->l.n; i++) {
            jv *x = items->l.a[i];
            if (x->t != JV_STR) {
                jj_fail(c, DF_EINVAL, "TypeError: sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
                free(b.p);
                return NULL;
            }
            if (i) jb_put(&b, s->s.p, s->s.n);
            jb_put(&b, x->s.p, x->s.n);
        }
        return jj_strval(c, &b);
    }
    case M_S_FORMAT: return brace_format(c, s, args, nargs, kwn, kwv, nkw);
    case M_S_SPLITLINES: {
        static const char *const pp[] = {"keepends"};
        if (jj_bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        return jj_splitlines(c, s->s.p, s->s.n, a[0] && jv_truthy(a[0]));
    }
    case M_S_ISDIGIT: case M_S_ISALPHA: case M_S_ISALNUM: case M_S_ISSPACE: case M_S_ISLOWER: case M_S_ISUPPER:
    case M_S_ISDECIMAL: case M_S_ISNUMERIC: case M_S_ISASCII: {
        if (jj_bind(c, nm, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int id = fn->fn.id;
        int kind = id == M_S_ISDIGIT ? 1 : id == M_S_ISALPHA ? 2 : id == M_S_ISALNUM ? 3 : id == M_S_ISSPACE ? 4 :
                   id == M_S_ISLOWER ? 5 : id == M_S_ISUPPER ? 6 : id == M_S_ISDECIMAL ? 7 : id == M_S_ISNUMERIC ? 8 : 9;
        return jv_bool(jj_str_pred(s, kind));
    }
    case M_S_REMOVEPREFIX: case M_S_REMOVESUFFIX: {
        static const char *const pp[] = {"affix"};
        if (jj_bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || jj_need_str(c, a[0], nm)) return NULL;
        jv *x = a[0];
        if (x->s.n <= s->s.n) {
            if (fn->fn.id == M_S_REMOVEPREFIX && !memcmp(s->s.p, x->s.p, x->s.n))
                return jv_str_nocopy(c, s->s.p + x->s.n, s->s.n - x->s.n);
            if (fn->fn.id == M_S_REMOVESUFFIX && x->s.n && !memcmp(s->s.p + s->s.n - x->s.n, x->s.p, x->s.n))
                return jv_str_nocopy(c, s->s.p, s->s.n - x->s.n);
        }
        return jv_str_nocopy(c, s->s.p, s->s.n);
    }
    case M_S_PARTITION: case M_S_RPARTITION: {
        static const char *const pp[] = {"sep"};
        if (jj_bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || jj_need_str(c, a[0], "separator")) return NULL;
        if (!a[0]->s.n) { jj_fail(c, DF_EINVAL, "ValueError: empty separator"); return NULL; }
        const char *h = fn->fn.id == M_S_PARTITION ? jj_memmem(s->s.p, s->s.n, a[0]->s.p, a[0]->s.n)
                                                    : jj_memrmem(s->s.p, s->s.n, a[0]->s.p, a[0]->s.n);
        jv *t = jv_list(c, JV_TUPLE, 3);
        if (!t) return NULL;
        jv *empty = jv_str_nocopy(c, "", 0);
        if (!h) {
            t->l.a[0] = fn->fn.id == M_S_PARTITION ? s : empty;
            t->l.a[1] = empty;
            t->l.a[2] = fn->fn.id == M_S_PARTITION ? empty : s;
        } else {
            t->l.a[0] = jv_str_nocopy(c, s->s.p, (size_t)(h - s->s.p));
            t->l.a[1] = a[0];
            t->l.a[2] = jv_str_nocopy(c, h + a[0]->s.n, s->s.n - (size_t)(h - s->s.p) - a[0]->s.n);
        }
        return t;
    }
    case M_S_ZFILL: case M_S_CENTER: case M_S_LJUST: case M_S_RJUST: {
        static const char *const pp[] = {"width", "fillchar"};
        if (jj_bind(c, nm, pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int64_t w;
        if (jj_need_int(c, a[0], &w, "width")) return NULL;
        const char *fillc = " ";
        size_t fl = 1;
        if (a[1]) {
            if (jj_need_str(c, a[1], "fillchar")) return NULL;
            if (ju_len(a[1]->s.p, a[1]->s.n) != 1) { jj_fail(c, DF_EINVAL, "TypeError: The fill character must be exactly one character long"); return NULL; }
            fillc = a[1]->s.p;
            fl = a[1]->s.n;
        }
        int64_t len = (int64_t)ju_len(s->s.p, s->s.n);
        if (w <= len) return s;
        int64_t pad = w - len, left = 0;
        if (fn->fn.id == M_S_CENTER) left = pad / 2 + (pad & w & 1);
        else if (fn->fn.id == M_S_RJUST) left = pad;
        else if (fn->fn.id == M_S_ZFILL) {
            size_t sign = s->s.n && (s->s.p[0] == '+' || s->s.p[0] == '-');
            jb_put(&b, s->s.p, sign);
            for (int64_t i = 0; i < pad; i++) jb_putc(&b, '0');
            jb_put(&b, s->s.p + sign, s->s.n - sign);
            return jj_strval(c, &b);
        }
        for (int64_t i = 0; i < left; i++) jb_put(&b, fillc, fl);
        jb_put(&b, s->s.p, s->s.n);
        for (int64_t i = left; i < pad; i++) jb_put(&b, fillc, fl);
        return jj_strval(c, &b);
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "string method '%s' is not supported by deltafin's Jinja subset", nm);
    return NULL;
}

jv *jj_dict_view(jj_ctx *c, jv *d, int kind) {
    jv *l = jv_list(c, JV_LIST, d->d.n);
    if (!l) return NULL;
    for (size_t i = 0; i < d->d.n; i++) {
        if (kind == 0) {
            jv *t = jv_list(c, JV_TUPLE, 2);
            if (!t) return NULL;
            t->l.a[0] = d->d.e[i].k;
            t->l.a[1] = d->d.e[i].v;
            l->l.a[i] = t;
        } else l->l.a[i] = kind == 1 ? d->d.e[i].k : d->d.e[i].v;
    }
    l->flags = kind == 0 ? JV_F_ITEMS : kind == 1 ? JV_F_KEYS : JV_F_VALUES;
    return l;
}

/* ============================================================ globals */

static const jj_mdef globals[] = {
    {"range", G_RANGE}, {"namespace", G_NAMESPACE}, {"dict", G_DICT}, {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME}, {"cycler", G_CYCLER}, {"joiner", G_JOINER}, {"lipsum", G_LIPSUM}, {NULL, 0}};

jv *jj_global(jj_ctx *c, const char *name) {
    for (const jj_mdef *g = globals; g->name; g++)
        if (!strcmp(g->name, name)) return bound(c, g->id, NULL, g->name);
    return NULL;
}

static jv *call_global(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    switch (fn->fn.id) {
    case G_RANGE: {
        if (nkw) { jj_fail(c, DF_EINVAL, "TypeError: range() takes no keyword arguments"); return NULL; }
        if (nargs < 1 || nargs > 3) { jj_fail(c, DF_EINVAL, "TypeError: range expected 1 to 3 arguments, got %d", nargs); return NULL; }
        int64_t v[3];
        for (int i = 0; i < nargs; i++) if (jj_need_int(c, args[i], &v[i], "range() argument")) return NULL;
        int64_t start = nargs == 1 ? 0 : v[0], stop = nargs == 1 ? v[0] : v[1], step = nargs == 3 ? v[2] : 1;
        if (!step) { jj_fail(c, DF_EINVAL, "ValueError: range() arg 3 must not be zero"); return NULL; }
        int64_t n = 0;
        if (step > 0 && stop > start) n = (stop - start + step - 1) / step;
        if (step < 0 && stop < start) n = (start - stop - step - 1) / (-step);
        if (n > 10000000) { jj_fail(c, DF_EINVAL, "OverflowError: range too big, maximum size for range is 10000000 (the sandbox limit)"); return NULL; }
        jv *l = jv_list(c, JV_LIST, (size_t)n);
        if (!l) return NULL;
        for (int64_t i = 0; i < n; i++) if (!(l->l.a[i] = jv_int(c, start + i * step))) return NULL;
        return l;
    }
    case G_NAMESPACE: case G_DICT: {
        jv *d = jv_dict(c, (size_t)(nkw + 4));
        if (!d) return NULL;
        if (fn->fn.id == G_NAMESPACE) d->t = JV_NS;
        if (nargs > 1) { jj_fail(c, DF_EINVAL, "TypeError: %s expected at most 1 argument, got %d", fn->fn.name, nargs); return NULL; }
        if (nargs == 1) {
            jv *src = args[0];
            if (src->t == JV_DICT || src->t == JV_NS) {
                for (size_t i = 0; i < src->d.n; i++) if (jv_dict_set(c, d, src->d.e[i].k, src->d.e[i].v)) return NULL;
            } else {
                jv *items = jj_iterate(c, src);
                if (!items) return NULL;
                for (size_t i = 0; i < items->l.n; i++) {
                    jv *pr = items->l.a[i];
                    if ((pr->t != JV_LIST && pr->t != JV_TUPLE) || pr->l.n != 2) {
                        jj_fail(c, DF_EINVAL, "ValueError: dictionary update sequence element #%zu has the wrong length", i);
                        return NULL;
                    }
                    if (jv_dict_set(c, d, pr->l.a[0], pr->l.a[1])) return NULL;
                }
            }
        }
        for (int k = 0; k < nkw; k++) {
            jv *kk = jv_strz(c, kwn[k]);
            if (!kk || jv_dict_set(c, d, kk, kwv[k])) return NULL;
        }
        return d;
    }
    case G_RAISE: {
        jb b = {0};
        if (nargs >= 1 && jv_to_str(c, args[0], &b)) { free(b.p); return NULL; }
        jj_fail(c, DF_EINVAL, "TemplateError: %s", b.p ? b.p : "");
        free(b.p);
        return NULL;
    }
    case G_STRFTIME: {
        static const char *const pp[] = {"format"};
        jv *a[1];
        if (jj_bind(c, "strftime_now", pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || jj_need_str(c, a[0], "format")) return NULL;
        time_t now = time(NULL);
        const char *fix = getenv("DF_CHAT_NOW"); /* fixed clock (unix seconds) for reproducible renders */
        if (fix && *fix) now = (time_t)strtoll(fix, NULL, 10);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[512];
        size_t k = strftime(out, sizeof out, a[0]->s.p, &tm);
        return jv_str(c, out, k);
    }
    default:
        jj_fail(c, DF_EUNSUPPORTED, "the global '%s()' is not supported by deltafin's Jinja subset", fn->fn.name);
        return NULL;
    }
}

jv *jj_call_builtin(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    int id = fn->fn.id;
    if (id >= G_RANGE) return call_global(c, fn, args, nargs, kwn, kwv, nkw);
    if (id < M_D_GET) return str_method(c, fn, args, nargs, kwn, kwv, nkw);
    jv *self = fn->fn.self;
    jv *a[3] = {0};
    switch (id) {
    case M_D_GET: {
        static const char *const pp[] = {"key", "default"};
        if (nkw) { jj_fail(c, DF_EINVAL, "TypeError: dict.get() takes no keyword arguments"); return NULL; }
        if (jj_bind(c, "get", pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (!a[0]) { jj_fail(c, DF_EINVAL, "TypeError: get expected at least 1 argument, got 0"); return NULL; }
        if (a[0]->t == JV_LIST || a[0]->t == JV_DICT) {
            jj_fail(c, DF_EINVAL, "TypeError: unhashable type: '%s'", jv_type_name(a[0]));
            return NULL;
        }
        jv *v = jv_dict_get(self, a[0]);
        return v ? v : a[1] ? a[1] : &jv_none_c;
    }
    case M_D_ITEMS: case M_D_KEYS: case M_D_VALUES:
        if (nargs || nkw) { jj_fail(c, DF_EINVAL, "TypeError: %s() takes no arguments", fn->fn.name); return NULL; }
        return jj_dict_view(c, self, id == M_D_ITEMS ? 0 : id == M_D_KEYS ? 1 : 2);
    case M_D_COPY: {
        jv *d = jv_dict(c, self->d.n + 1);
        if (!d) return NULL;
        for (size_t i = 0; i < self->d.n; i++) if (jv_dict_set(c, d, self->d.e[i].k, self->d.e[i].v)) return NULL;
        return d;
    }
    case M_L_COPY: {
        jv *l = jv_list(c, JV_LIST, self->l.n);
        if (l && self->l.n) memcpy(l->l.a, self->l.a, self->l.n * sizeof(jv *));
        return l;
    }
    case M_L_COUNT: case M_L_INDEX: {
        if (nargs != 1 || nkw) {
            if (id == M_L_INDEX && nargs > 1) { jj_fail(c, DF_EUNSUPPORTED, "index() with start/stop is not supported by deltafin's Jinja subset"); return NULL; }
            jj_fail(c, DF_EINVAL, "TypeError: %s() takes exactly one argument (%d given)", fn->fn.name, nargs);
            return NULL;
        }
        int64_t k = 0;
        for (size_t i = 0; i < self->l.n; i++)
            if (jv_equal(self->l.a[i], args[0])) {
                if (id == M_L_INDEX) return jv_int(c, (int64_t)i);
                k++;
            }
        if (id == M_L_INDEX) { jj_fail(c, DF_EINVAL, "ValueError: value is not in list"); return NULL; }
        return jv_int(c, k);
    }
    case M_LOOP_CYCLE: {
        if (!nargs) { jj_fail(c, DF_EINVAL, "TypeError: no items for cycling given"); return NULL; }
        return args[self->loop->i % nargs];
    }
    case M_LOOP_CHANGED: {
        jv *t = jv_list(c, JV_TUPLE, (size_t)nargs);
        if (!t) return NULL;
        for (int i = 0; i < nargs; i++) t->l.a[i] = args[i];
        struct jj_loop *l = self->loop;
        if (l->changed_set && jv_equal(l->last_changed, t)) return &jv_false_c;
        l->last_changed = t;
        l->changed_set = 1;
        return &jv_true_c;
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "method '%s' is not supported by deltafin's Jinja subset", fn->fn.name);
    return NULL;
}
