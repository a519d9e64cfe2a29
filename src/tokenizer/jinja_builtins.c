/* jinja_builtins.c — what the Jinja subset knows about values: attribute and
 * item access as jinja2's ImmutableSandboxedEnvironment does it (Python
 * attributes first for ".", items first for "[]"; methods that modify a list
 * or a dict are "unsafe"), iteration, arithmetic, the filters and tests of
 * jinja2 3.1 that chat templates use (transformers' tojson), Python string /
 * dict / list methods, and the globals range, namespace, dict,
 * raise_exception and strftime_now. A known Python method or jinja2 filter we
 * do not implement is refused by name, never approximated. */
#include "jinja_int.h"
#include <errno.h>
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
static int bind(jj_ctx *c, const char *what, const char *const *params, int np, jv **args, int nargs,
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

static int need_str(jj_ctx *c, jv *v, const char *what) {
    if (v && v->t == JV_STR) return 0;
    if (v && v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: %s must be str, not %s", what, v ? jv_type_name(v) : "nothing");
    return -1;
}

static int need_int(jj_ctx *c, jv *v, int64_t *out, const char *what) {
    if (v && (v->t == JV_INT || v->t == JV_BOOL)) { *out = v->t == JV_INT ? v->i : v->b; return 0; }
    if (v && v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: %s must be an integer, not %s", what, v ? jv_type_name(v) : "nothing");
    return -1;
}

static jv *strval(jj_ctx *c, jb *b) {
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

static int64_t jlen(jj_ctx *c, jv *v) {
    if (v->flags & JV_F_ITER) {
        jj_fail(c, DF_EINVAL, "TypeError: object of type '%s' has no len()", jv_type_name(v));
        return -1;
    }
    switch (v->t) {
    case JV_STR: return (int64_t)ju_len(v->s.p, v->s.n);
    case JV_LIST: case JV_TUPLE: return (int64_t)v->l.n;
    case JV_DICT: return (int64_t)v->d.n;
    case JV_UNDEF: return 0;
    case JV_LOOP: return v->loop->n;
    default:
        jj_fail(c, DF_EINVAL, "TypeError: object of type '%s' has no len()", jv_type_name(v));
        return -1;
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

typedef struct { const char *name; int id; } mdef;

static const mdef str_methods[] = {
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
static const mdef dict_methods[] = {
    {"get", M_D_GET}, {"items", M_D_ITEMS}, {"keys", M_D_KEYS}, {"values", M_D_VALUES}, {"copy", M_D_COPY},
    {"fromkeys", 0}, {"clear", -1}, {"pop", -1}, {"popitem", -1}, {"setdefault", -1}, {"update", -1}, {NULL, 0}};
static const mdef list_methods[] = {
    {"count", M_L_COUNT}, {"index", M_L_INDEX}, {"copy", M_L_COPY}, {"append", -1}, {"clear", -1}, {"extend", -1},
    {"insert", -1}, {"pop", -1}, {"remove", -1}, {"reverse", -1}, {"sort", -1}, {NULL, 0}};
static const mdef tuple_methods[] = {{"count", M_L_COUNT}, {"index", M_L_INDEX}, {NULL, 0}};
static const mdef num_attrs[] = {
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
    const mdef *tbl = NULL;
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

static void html_escape(const char *s, size_t n, jb *b) {
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

static jv *overflow(jj_ctx *c) {
    jj_fail(c, DF_EUNSUPPORTED, "integer arithmetic beyond 64 bits is not supported by deltafin's Jinja subset");
    return NULL;
}

static jv *repeat(jj_ctx *c, jv *seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq->t == JV_STR) {
        if (seq->s.n && (uint64_t)k > (1u << 30) / seq->s.n) { jj_fail(c, DF_ENOMEM, "string repetition too large"); return NULL; }
        jb b = {0};
        for (int64_t i = 0; i < k; i++) jb_put(&b, seq->s.p, seq->s.n);
        return strval(c, &b);
    }
    if (seq->l.n && (uint64_t)k > (1u << 26) / seq->l.n) { jj_fail(c, DF_ENOMEM, "list repetition too large"); return NULL; }
    jv *r = jv_list(c, seq->t, seq->l.n * (size_t)k);
    if (!r) return NULL;
    for (int64_t i = 0; i < k; i++) memcpy(r->l.a + i * seq->l.n, seq->l.a, seq->l.n * sizeof(jv *));
    return r;
}

static jv *percent_format(jj_ctx *c, jv *fmt, jv *args);

jv *jj_binop(jj_ctx *c, int op, jv *a, jv *b) {
    static const char *names[] = {"", "+", "-", "*", "/", "//", "%", "** or pow()"};
    if (op == OP_MOD && a->t == JV_STR) return percent_format(c, a, b); /* str % Undefined formats it */
    if (a->t == JV_UNDEF) return jj_undef_fail(c, a);
    if (b->t == JV_UNDEF) return jj_undef_fail(c, b);
    int an = jv_is_number(a), bn = jv_is_number(b);
    if (an && bn) {
        int fl = a->t == JV_FLOAT || b->t == JV_FLOAT;
        if (!fl) {
            int64_t x = a->t == JV_INT ? a->i : a->b, y = b->t == JV_INT ? b->i : b->b, r;
            switch (op) {
            case OP_ADD: if (__builtin_add_overflow(x, y, &r)) return overflow(c); return jv_int(c, r);
            case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) return overflow(c); return jv_int(c, r);
            case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) return overflow(c); return jv_int(c, r);
            case OP_DIV:
                if (!y) { jj_fail(c, DF_EINVAL, "ZeroDivisionError: division by zero"); return NULL; }
                return jv_float(c, (double)x / (double)y);
            case OP_FLOORDIV: case OP_MOD: {
                if (!y) {
                    jj_fail(c, DF_EINVAL, "ZeroDivisionError: integer %s by zero", op == OP_MOD ? "modulo" : "division or modulo");
                    return NULL;
                }
                if (x == INT64_MIN && y == -1) return overflow(c);
                int64_t q = x / y, m = x % y;
                if (m && ((m < 0) != (y < 0))) { q--; m += y; }
                return jv_int(c, op == OP_MOD ? m : q);
            }
            case OP_POW: {
                if (y < 0) return jv_float(c, pow((double)x, (double)y));
                int64_t acc = 1, base = x;
                int64_t e = y;
                while (e) {
                    if (e & 1) { if (__builtin_mul_overflow(acc, base, &acc)) return overflow(c); }
                    e >>= 1;
                    if (e && __builtin_mul_overflow(base, base, &base)) return overflow(c);
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
            if (safe && !(a->flags & JV_F_SAFE)) html_escape(a->s.p, a->s.n, &o); else jb_put(&o, a->s.p, a->s.n);
            if (safe && !(b->flags & JV_F_SAFE)) html_escape(b->s.p, b->s.n, &o); else jb_put(&o, b->s.p, b->s.n);
            jv *r = strval(c, &o);
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
    if (op == OP_MOD && a->t == JV_STR) return percent_format(c, a, b);
    return type_error(c, names[op], a, b);
}

/* ============================================================ strings */

static int is_ws_at(const char *s, size_t n, size_t i, size_t *adv) {
    int32_t cp = ju_decode(s + i, n - i, adv);
    return ju_isspace(cp);
}

/* strip chars (NULL = whitespace) from the left (1), right (2) or both (3) */
static jv *do_strip(jj_ctx *c, jv *s, jv *chars, int sides) {
    if (chars && chars->t != JV_NONE && need_str(c, chars, "strip arg")) return NULL;
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

static const char *memmem_(const char *h, size_t hn, const char *nd, size_t nn) {
    if (!nn) return h;
    if (nn > hn) return NULL;
    for (size_t i = 0; i + nn <= hn; i++) if (h[i] == nd[0] && !memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}
static const char *memrmem_(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;) if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

static jv *list_from(jj_ctx *c, jv **items, size_t n) {
    jv *l = jv_list(c, JV_LIST, n);
    if (l && n) memcpy(l->l.a, items, n * sizeof *items);
    return l;
}

typedef struct { jv **v; size_t n, cap; } vec;
static int vec_push(jj_ctx *c, vec *a, jv *x) {
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
static jv *as_iter(jv *l) {
    if (l) l->flags = (l->flags & ~JV_F_CONSUMED) | JV_F_ITER;
    return l;
}
static jv *vec_list(jj_ctx *c, vec *a) {
    jv *l = list_from(c, a->v, a->n);
    free(a->v);
    a->v = NULL;
    return l;
}

/* str.split / rsplit */
static jv *do_split(jj_ctx *c, jv *s, jv *sep, jv *maxsplit, int right) {
    int64_t maxs = -1;
    if (maxsplit && need_int(c, maxsplit, &maxs, "maxsplit")) return NULL;
    vec out = {0};
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
                    if (vec_push(c, &out, jv_str_nocopy(c, p + i, n - i))) { free(out.v); return NULL; }
                    break;
                }
                size_t j = i;
                while (j < n && !is_ws_at(p, n, j, &adv)) j += adv;
                if (vec_push(c, &out, jv_str_nocopy(c, p + i, j - i))) { free(out.v); return NULL; }
                k++;
                i = j;
            }
            return vec_list(c, &out);
        }
        /* rsplit(None): collect from the right */
        vec rev = {0};
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
                if (vec_push(c, &rev, jv_str_nocopy(c, p, e))) { free(rev.v); return NULL; }
                break;
            }
            size_t i = e;
            while (i > 0) {
                size_t q = i - 1;
                while (q > 0 && ((unsigned char)p[q] & 0xC0) == 0x80) q--;
                if (is_ws_at(p, n, q, &adv)) break;
                i = q;
            }
            if (vec_push(c, &rev, jv_str_nocopy(c, p + i, e - i))) { free(rev.v); return NULL; }
            k++;
            e = i;
        }
        for (size_t a = 0; a < rev.n / 2; a++) { jv *t = rev.v[a]; rev.v[a] = rev.v[rev.n - 1 - a]; rev.v[rev.n - 1 - a] = t; }
        return vec_list(c, &rev);
    }
    if (need_str(c, sep, "separator")) return NULL;
    if (!sep->s.n) { jj_fail(c, DF_EINVAL, "ValueError: empty separator"); return NULL; }
    if (!right) {
        size_t i = 0;
        int64_t k = 0;
        for (;;) {
            const char *h = (maxs < 0 || k < maxs) ? memmem_(p + i, n - i, sep->s.p, sep->s.n) : NULL;
            if (!h) { if (vec_push(c, &out, jv_str_nocopy(c, p + i, n - i))) { free(out.v); return NULL; } break; }
            if (vec_push(c, &out, jv_str_nocopy(c, p + i, (size_t)(h - (p + i))))) { free(out.v); return NULL; }
            i = (size_t)(h - p) + sep->s.n;
            k++;
        }
        return vec_list(c, &out);
    }
    size_t e = n;
    int64_t k = 0;
    for (;;) {
        const char *h = (maxs < 0 || k < maxs) ? memrmem_(p, e, sep->s.p, sep->s.n) : NULL;
        if (!h) { if (vec_push(c, &out, jv_str_nocopy(c, p, e))) { free(out.v); return NULL; } break; }
        size_t st = (size_t)(h - p) + sep->s.n;
        if (vec_push(c, &out, jv_str_nocopy(c, p + st, e - st))) { free(out.v); return NULL; }
        e = (size_t)(h - p);
        k++;
    }
    for (size_t a = 0; a < out.n / 2; a++) { jv *t = out.v[a]; out.v[a] = out.v[out.n - 1 - a]; out.v[out.n - 1 - a] = t; }
    return vec_list(c, &out);
}

/* case mapping of each code point (utf8proc's simple mappings) */
enum { CASE_UPPER, CASE_LOWER, CASE_SWAP };
static void case_map(const char *s, size_t n, int mode, jb *b) {
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
static void py_capitalize(const char *s, size_t n, jb *b) {
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

static int str_pred(const jv *s, int kind) {
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
static jv *do_splitlines(jj_ctx *c, const char *p, size_t n, int keep) {
    vec out = {0};
    size_t i = 0, st = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(p + i, n - i, &adv);
        int brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
                  cp == 0x85 || cp == 0x2028 || cp == 0x2029;
        if (brk) {
            size_t e = i + adv;
            if (cp == '\r' && e < n && p[e] == '\n') e++;
            if (vec_push(c, &out, jv_str_nocopy(c, p + st, (keep ? e : i) - st))) { free(out.v); return NULL; }
            st = i = e;
            continue;
        }
        i += adv;
    }
    if (st < n && vec_push(c, &out, jv_str_nocopy(c, p + st, n - st))) { free(out.v); return NULL; }
    return vec_list(c, &out);
}

/* Python %-formatting: "%s" % x, "%(k)s" % d, flags/width/precision for s r d i f F e E g G x X o c */
static jv *percent_format(jj_ctx *c, jv *fmt, jv *args) {
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
    return strval(c, &b);
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
    return strval(c, &b);
}

static int64_t str_find(jv *s, jv *sub, jv *start, jv *end, int right) {
    int64_t n = (int64_t)ju_len(s->s.p, s->s.n), a = 0, z = n;
    if (start && (start->t == JV_INT)) { a = start->i < 0 ? start->i + n : start->i; if (a < 0) a = 0; }
    if (end && (end->t == JV_INT)) { z = end->i < 0 ? end->i + n : end->i; if (z > n) z = n; }
    if (a > n || a > z) return -1;
    size_t ba = ju_offset(s->s.p, s->s.n, (size_t)a), bz = ju_offset(s->s.p, s->s.n, (size_t)z);
    const char *h = right ? memrmem_(s->s.p + ba, bz - ba, sub->s.p, sub->s.n) : memmem_(s->s.p + ba, bz - ba, sub->s.p, sub->s.n);
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
        if (bind(c, nm, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int id = fn->fn.id;
        if (id == M_S_TITLE) py_title(s->s.p, s->s.n, &b);
        else if (id == M_S_CAPITALIZE) py_capitalize(s->s.p, s->s.n, &b);
        else case_map(s->s.p, s->s.n, id == M_S_UPPER ? CASE_UPPER : id == M_S_LOWER ? CASE_LOWER : CASE_SWAP, &b);
        return strval(c, &b);
    }
    case M_S_STRIP: case M_S_LSTRIP: case M_S_RSTRIP: {
        static const char *const pp[] = {"chars"};
        if (bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        jv *r = do_strip(c, s, a[0], fn->fn.id == M_S_STRIP ? 3 : fn->fn.id == M_S_LSTRIP ? 1 : 2);
        if (r) r->flags = 0;
        return r;
    }
    case M_S_SPLIT: case M_S_RSPLIT: {
        static const char *const pp[] = {"sep", "maxsplit"};
        if (bind(c, nm, pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        return do_split(c, s, a[0], a[1], fn->fn.id == M_S_RSPLIT);
    }
    case M_S_STARTSWITH: case M_S_ENDSWITH: {
        static const char *const pp[] = {"prefix", "start", "end"};
        if (bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
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
        if (bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (!a[0] || !a[1]) { jj_fail(c, DF_EINVAL, "TypeError: replace expected at least 2 arguments"); return NULL; }
        if (need_str(c, a[0], "replace() argument 1") || need_str(c, a[1], "replace() argument 2")) return NULL;
        int64_t cnt = -1;
        if (a[2] && need_int(c, a[2], &cnt, "count")) return NULL;
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
            return strval(c, &b);
        }
        for (;;) {
            const char *h = (cnt < 0 || k < cnt) ? memmem_(p + i, n - i, a[0]->s.p, a[0]->s.n) : NULL;
            if (!h) { jb_put(&b, p + i, n - i); break; }
            jb_put(&b, p + i, (size_t)(h - (p + i)));
            jb_put(&b, a[1]->s.p, a[1]->s.n);
            i = (size_t)(h - p) + a[0]->s.n;
            k++;
        }
        return strval(c, &b);
    }
    case M_S_FIND: case M_S_RFIND: case M_S_INDEX: case M_S_RINDEX: case M_S_COUNT: {
        static const char *const pp[] = {"sub", "start", "end"};
        if (bind(c, nm, pp, 3, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        if (need_str(c, a[0], "substring")) return NULL;
        if (fn->fn.id == M_S_COUNT) {
            if (a[1] || a[2]) { jj_fail(c, DF_EUNSUPPORTED, "count() with start/end is not supported by deltafin's Jinja subset"); return NULL; }
            if (!a[0]->s.n) return jv_int(c, (int64_t)ju_len(s->s.p, s->s.n) + 1);
            int64_t k = 0;
            const char *p = s->s.p, *e = p + s->s.n;
            for (const char *h; (h = memmem_(p, (size_t)(e - p), a[0]->s.p, a[0]->s.n)); p = h + a[0]->s.n) k++;
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
        if (bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
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
        return strval(c, &b);
    }
    case M_S_FORMAT: return brace_format(c, s, args, nargs, kwn, kwv, nkw);
    case M_S_SPLITLINES: {
        static const char *const pp[] = {"keepends"};
        if (bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        return do_splitlines(c, s->s.p, s->s.n, a[0] && jv_truthy(a[0]));
    }
    case M_S_ISDIGIT: case M_S_ISALPHA: case M_S_ISALNUM: case M_S_ISSPACE: case M_S_ISLOWER: case M_S_ISUPPER:
    case M_S_ISDECIMAL: case M_S_ISNUMERIC: case M_S_ISASCII: {
        if (bind(c, nm, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int id = fn->fn.id;
        int kind = id == M_S_ISDIGIT ? 1 : id == M_S_ISALPHA ? 2 : id == M_S_ISALNUM ? 3 : id == M_S_ISSPACE ? 4 :
                   id == M_S_ISLOWER ? 5 : id == M_S_ISUPPER ? 6 : id == M_S_ISDECIMAL ? 7 : id == M_S_ISNUMERIC ? 8 : 9;
        return jv_bool(str_pred(s, kind));
    }
    case M_S_REMOVEPREFIX: case M_S_REMOVESUFFIX: {
        static const char *const pp[] = {"affix"};
        if (bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || need_str(c, a[0], nm)) return NULL;
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
        if (bind(c, nm, pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || need_str(c, a[0], "separator")) return NULL;
        if (!a[0]->s.n) { jj_fail(c, DF_EINVAL, "ValueError: empty separator"); return NULL; }
        const char *h = fn->fn.id == M_S_PARTITION ? memmem_(s->s.p, s->s.n, a[0]->s.p, a[0]->s.n)
                                                    : memrmem_(s->s.p, s->s.n, a[0]->s.p, a[0]->s.n);
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
        if (bind(c, nm, pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
        int64_t w;
        if (need_int(c, a[0], &w, "width")) return NULL;
        const char *fillc = " ";
        size_t fl = 1;
        if (a[1]) {
            if (need_str(c, a[1], "fillchar")) return NULL;
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
            return strval(c, &b);
        }
        for (int64_t i = 0; i < left; i++) jb_put(&b, fillc, fl);
        jb_put(&b, s->s.p, s->s.n);
        for (int64_t i = left; i < pad; i++) jb_put(&b, fillc, fl);
        return strval(c, &b);
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "string method '%s' is not supported by deltafin's Jinja subset", nm);
    return NULL;
}

static jv *dict_view(jj_ctx *c, jv *d, int kind) {
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

static const mdef globals[] = {
    {"range", G_RANGE}, {"namespace", G_NAMESPACE}, {"dict", G_DICT}, {"raise_exception", G_RAISE},
    {"strftime_now", G_STRFTIME}, {"cycler", G_CYCLER}, {"joiner", G_JOINER}, {"lipsum", G_LIPSUM}, {NULL, 0}};

jv *jj_global(jj_ctx *c, const char *name) {
    for (const mdef *g = globals; g->name; g++)
        if (!strcmp(g->name, name)) return bound(c, g->id, NULL, g->name);
    return NULL;
}

static jv *call_global(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    switch (fn->fn.id) {
    case G_RANGE: {
        if (nkw) { jj_fail(c, DF_EINVAL, "TypeError: range() takes no keyword arguments"); return NULL; }
        if (nargs < 1 || nargs > 3) { jj_fail(c, DF_EINVAL, "TypeError: range expected 1 to 3 arguments, got %d", nargs); return NULL; }
        int64_t v[3];
        for (int i = 0; i < nargs; i++) if (need_int(c, args[i], &v[i], "range() argument")) return NULL;
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
        if (bind(c, "strftime_now", pp, 1, args, nargs, kwn, kwv, nkw, a, 0) || need_str(c, a[0], "format")) return NULL;
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
        if (bind(c, "get", pp, 2, args, nargs, kwn, kwv, nkw, a, 0)) return NULL;
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
        return dict_view(c, self, id == M_D_ITEMS ? 0 : id == M_D_KEYS ? 1 : 2);
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

/* ============================================================ filters */

enum {
    F_ABS = 1, F_ATTR, F_CAPITALIZE, F_CENTER, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT,
    F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN,
    F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM,
    F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER, F_WORDCOUNT,
    F_UNSUPPORTED = 1000
};
static const mdef filters[] = {
    {"abs", F_ABS}, {"attr", F_ATTR}, {"capitalize", F_CAPITALIZE}, {"center", F_CENTER}, {"count", F_COUNT},
    {"d", F_DEFAULT}, {"default", F_DEFAULT}, {"dictsort", F_DICTSORT}, {"e", F_ESCAPE}, {"escape", F_ESCAPE},
    {"first", F_FIRST}, {"float", F_FLOAT}, {"forceescape", F_FORCEESCAPE}, {"format", F_FORMAT}, {"indent", F_INDENT},
    {"int", F_INT}, {"items", F_ITEMS}, {"join", F_JOIN}, {"last", F_LAST}, {"length", F_LENGTH}, {"list", F_LIST},
    {"lower", F_LOWER}, {"map", F_MAP}, {"max", F_MAX}, {"min", F_MIN}, {"reject", F_REJECT},
    {"rejectattr", F_REJECTATTR}, {"replace", F_REPLACE}, {"reverse", F_REVERSE}, {"round", F_ROUND},
    {"safe", F_SAFE}, {"select", F_SELECT}, {"selectattr", F_SELECTATTR}, {"sort", F_SORT}, {"string", F_STRING},
    {"sum", F_SUM}, {"title", F_TITLE}, {"tojson", F_TOJSON}, {"trim", F_TRIM}, {"truncate", F_TRUNCATE},
    {"unique", F_UNIQUE}, {"upper", F_UPPER}, {"wordcount", F_WORDCOUNT},
    /* jinja2 filters outside the subset */
    {"batch", F_UNSUPPORTED}, {"filesizeformat", F_UNSUPPORTED}, {"groupby", F_UNSUPPORTED},
    {"pprint", F_UNSUPPORTED}, {"random", F_UNSUPPORTED}, {"slice", F_UNSUPPORTED}, {"striptags", F_UNSUPPORTED},
    {"urlencode", F_UNSUPPORTED}, {"urlize", F_UNSUPPORTED}, {"wordwrap", F_UNSUPPORTED}, {"xmlattr", F_UNSUPPORTED},
    {NULL, 0}};

int jj_filter_id(const char *name, int *supported) {
    for (const mdef *f = filters; f->name; f++)
        if (!strcmp(f->name, name)) { *supported = f->id != F_UNSUPPORTED; return f->id; }
    *supported = 0;
    return -1;
}

enum {
    T_DEFINED = 1, T_UNDEFINED, T_NONE, T_STRING, T_NUMBER, T_INTEGER, T_FLOAT, T_BOOLEAN, T_MAPPING, T_ITERABLE,
    T_SEQUENCE, T_CALLABLE, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_ODD, T_EVEN, T_DIVISIBLEBY, T_SAMEAS,
    T_LOWER, T_UPPER, T_TRUE, T_FALSE, T_ESCAPED, T_FILTER, T_TEST
};
static const mdef tests[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"string", T_STRING}, {"number", T_NUMBER},
    {"integer", T_INTEGER}, {"float", T_FLOAT}, {"boolean", T_BOOLEAN}, {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE}, {"eq", T_EQ}, {"equalto", T_EQ},
    {"==", T_EQ}, {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE},
    {"<=", T_LE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"in", T_IN},
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"sameas", T_SAMEAS}, {"lower", T_LOWER},
    {"upper", T_UPPER}, {"true", T_TRUE}, {"false", T_FALSE}, {"escaped", T_ESCAPED}, {"filter", T_FILTER},
    {"test", T_TEST}, {NULL, 0}};

int jj_test_id(const char *name, int *supported) {
    for (const mdef *t = tests; t->name; t++)
        if (!strcmp(t->name, name)) { *supported = 1; return t->id; }
    *supported = 0;
    return -1;
}

/* environment.getattr / getitem along a dotted attribute path ("a.b", "0") */
static jv *attr_path(jj_ctx *c, jv *v, const jv *path, jv *dflt) {
    if (path->t == JV_INT) return jj_getitem(c, v, (jv *)path);
    const char *p = path->s.p, *e = p + path->s.n;
    while (p <= e) {
        const char *q = p;
        while (q < e && *q != '.') q++;
        size_t l = (size_t)(q - p);
        int digits = l > 0;
        for (size_t i = 0; i < l; i++) digits &= p[i] >= '0' && p[i] <= '9';
        jv *key = digits ? jv_int(c, strtoll(p, NULL, 10)) : jv_str(c, p, l);
        if (!key) return NULL;
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        v = jj_getitem(c, v, key);
        if (!v) return NULL;
        if (dflt && v->t == JV_UNDEF) { v = dflt; break; }
        p = q + 1;
    }
    return v;
}

static int sort_key_less(jj_ctx *c, jv *a, jv *b, int case_sensitive) {
    if (!case_sensitive && a->t == JV_STR && b->t == JV_STR) {
        jb x = {0}, y = {0};
        case_map(a->s.p, a->s.n, CASE_LOWER, &x);
        case_map(b->s.p, b->s.n, CASE_LOWER, &y);
        jv xa = {.t = JV_STR}, yb = {.t = JV_STR};
        xa.s.p = x.p ? x.p : ""; xa.s.n = x.n;
        yb.s.p = y.p ? y.p : ""; yb.s.n = y.n;
        int r = jv_less(c, &xa, &yb);
        free(x.p);
        free(y.p);
        return r;
    }
    return jv_less(c, a, b);
}

/* stable merge sort of v[0..n) by keys k[] */
static int msort(jj_ctx *c, jv **v, jv **k, size_t n, int cs, int rev, jv **tv, jv **tk, int eq_first) {
    if (n < 2) return 0;
    size_t m = n / 2;
    if (msort(c, v, k, m, cs, rev, tv, tk, eq_first) || msort(c, v + m, k + m, n - m, cs, rev, tv, tk, eq_first))
        return -1;
    size_t i = 0, j = m, o = 0;
    while (i < m && j < n) {
        /* the sort filter's keys are one-item lists: equal items never reach '<' */
        int lt = eq_first && jv_equal(k[i], k[j]) ? 0
               : rev ? sort_key_less(c, k[i], k[j], cs) : sort_key_less(c, k[j], k[i], cs);
        if (lt < 0) return -1;
        if (lt) { tv[o] = v[j]; tk[o++] = k[j++]; }
        else { tv[o] = v[i]; tk[o++] = k[i++]; }
    }
    while (i < m) { tv[o] = v[i]; tk[o++] = k[i++]; }
    while (j < n) { tv[o] = v[j]; tk[o++] = k[j++]; }
    memcpy(v, tv, n * sizeof *v);
    memcpy(k, tk, n * sizeof *k);
    return 0;
}

static jv *sorted(jj_ctx *c, jv *items, jv **keys, int cs, int rev, int eq_first) {
    size_t n = items->l.n;
    jv *r = jv_list(c, JV_LIST, n);
    if (!r) return NULL;
    if (n) memcpy(r->l.a, items->l.a, n * sizeof(jv *));
    jv **k = malloc((n + 1) * sizeof *k), **tv = malloc((n + 1) * sizeof *tv), **tk = malloc((n + 1) * sizeof *tk);
    if (!k || !tv || !tk) { free(k); free(tv); free(tk); jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
    memcpy(k, keys, n * sizeof *k);
    int rc = msort(c, r->l.a, k, n, cs, rev, tv, tk, eq_first);
    free(k); free(tv); free(tk);
    return rc ? NULL : r;
}

static jv *select_items(jj_ctx *c, jj_frame *f, jv *v, jv **args, int nargs, int by_attr, int keep) {
    if (!jv_truthy(v)) return as_iter(jv_list(c, JV_LIST, 0)); /* "if value:" before iterating */
    jv *items = jj_iterate(c, v);
    if (!items) return NULL;
    int ai = 0;
    jv *attr = NULL;
    if (by_attr) {
        if (nargs < 1 || need_str(c, args[0], "attribute")) return NULL;
        attr = args[0];
        ai = 1;
    }
    int tid = -1;
    const char *tname = NULL;
    if (ai < nargs) {
        if (need_str(c, args[ai], "test name")) return NULL;
        int sup;
        tname = args[ai]->s.p;
        tid = jj_test_id(tname, &sup);
        if (tid < 0) { jj_fail(c, DF_EINVAL, "TemplateRuntimeError: No test named '%s'", tname); return NULL; }
        ai++;
    }
    vec out = {0};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.a[i];
        jv *t = attr ? attr_path(c, x, attr, NULL) : x;
        if (!t) { free(out.v); return NULL; }
        int r = tid >= 0 ? jj_apply_test(c, tid, tname, t, args + ai, nargs - ai) : jv_truthy(t);
        if (r < 0) { free(out.v); return NULL; }
        if (r == keep && vec_push(c, &out, x)) { free(out.v); return NULL; }
    }
    (void)f;
    return as_iter(vec_list(c, &out));
}

static void jinja_title(const char *s, size_t n, jb *b) {
    /* "".join(item[0].upper() + item[1:].lower() for item in re.split(r"([-\s({\[<]+)", s) if item) */
    size_t i = 0;
    while (i < n) {
        size_t adv;
        int32_t cp = ju_decode(s + i, n - i, &adv);
        int sep = ju_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
        size_t j = i;
        if (sep) {
            while (j < n) {
                int32_t q = ju_decode(s + j, n - j, &adv);
                if (!(ju_isspace(q) || q == '-' || q == '(' || q == '{' || q == '[' || q == '<')) break;
                j += adv;
            }
            jb_put(b, s + i, j - i);
        } else {
            int first = 1;
            while (j < n) {
                int32_t q = ju_decode(s + j, n - j, &adv);
                if (ju_isspace(q) || q == '-' || q == '(' || q == '{' || q == '[' || q == '<') break;
                int32_t m = first ? utf8proc_toupper(q) : utf8proc_tolower(q);
                char t[4];
                jb_put(b, t, (size_t)ju_encode(m, t));
                first = 0;
                j += adv;
            }
        }
        i = j;
    }
}

static jv *parse_number_str(jj_ctx *c, jv *s, int want_int, int64_t base, int *ok) {
    *ok = 0;
    char tmp[128];
    const char *p = s->s.p;
    size_t n = s->s.n;
    /* strip whitespace */
    while (n && ju_isspace((unsigned char)*p)) { p++; n--; }
    while (n && ju_isspace((unsigned char)p[n - 1])) n--;
    if (!n || n >= sizeof tmp) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '_') { if (!i || i + 1 >= n || p[i - 1] == '_') return NULL; continue; }
        tmp[k++] = p[i];
    }
    tmp[k] = 0;
    char *end;
    if (want_int) {
        int b = (int)base;
        const char *q = tmp;
        int neg = 0;
        if (*q == '+' || *q == '-') { neg = *q == '-'; q++; }
        if (b == 16 && q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) q += 2;
        else if (b == 8 && q[0] == '0' && (q[1] == 'o' || q[1] == 'O')) q += 2;
        else if (b == 2 && q[0] == '0' && (q[1] == 'b' || q[1] == 'B')) q += 2;
        if (!*q) return NULL;
        errno = 0;
        long long v = strtoll(q, &end, b);
        if (*end || errno) return NULL;
        *ok = 1;
        return jv_int(c, neg ? -v : v);
    }
    double d = strtod(tmp, &end);
    if (*end) return NULL;
    *ok = 1;
    return jv_float(c, d);
}

static jv *float_to_int(jj_ctx *c, double d) {
    if (isnan(d) || isinf(d) || d >= 9.2e18 || d <= -9.2e18) return NULL;
    return jv_int(c, (int64_t)d);
}

jv *jj_apply_filter(jj_ctx *c, jj_frame *f, int id, const char *name, jv *v, jv **args, int nargs, const char **kwn,
                    jv **kwv, int nkw) {
    jv *a[6] = {0};
    jb b = {0};
#define BIND(...) do { static const char *const pp_[] = {__VA_ARGS__}; \
        if (bind(c, name, pp_, (int)(sizeof pp_ / sizeof *pp_), args, nargs, kwn, kwv, nkw, a, 0)) return NULL; } while (0)
#define NOARGS() do { if (bind(c, name, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL; } while (0)
    switch (id) {
    case F_ABS:
        NOARGS();
        if (v->t == JV_INT) { if (v->i == INT64_MIN) return overflow(c); return jv_int(c, v->i < 0 ? -v->i : v->i); }
        if (v->t == JV_BOOL) return jv_int(c, v->b);
        if (v->t == JV_FLOAT) return jv_float(c, fabs(v->f));
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        jj_fail(c, DF_EINVAL, "TypeError: bad operand type for abs(): '%s'", jv_type_name(v));
        return NULL;
    case F_ATTR:
        BIND("name");
        if (need_str(c, a[0], "attribute name")) return NULL;
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        { /* do_attr: getattr only, then the sandbox check */
            if (v->t == JV_LOOP || v->t == JV_NS) return jj_getattr(c, v, a[0]->s.p, a[0]->s.n);
            int is_attr;
            jv *m = jj_method(c, v, a[0]->s.p, a[0]->s.n, &is_attr);
            if (m || is_attr || c->rc) return m;
            return jv_undef(c, "'%s object' has no attribute '%s'", jv_type_name(v), a[0]->s.p);
        }
    case F_CAPITALIZE: case F_UPPER: case F_LOWER: case F_TITLE: {
        NOARGS();
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        if (id == F_CAPITALIZE) py_capitalize(s->s.p, s->s.n, &b);
        else if (id == F_TITLE) jinja_title(s->s.p, s->s.n, &b);
        else case_map(s->s.p, s->s.n, id == F_UPPER ? CASE_UPPER : CASE_LOWER, &b);
        jv *r = strval(c, &b);
        if (r) r->flags = s->flags & JV_F_SAFE;
        return r;
    }
    case F_CENTER: {
        BIND("width");
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        jv *fn = bound(c, M_S_CENTER, s, "center");
        jv *w = a[0] ? a[0] : jv_int(c, 80);
        return fn && w ? str_method(c, fn, &w, 1, NULL, NULL, 0) : NULL;
    }
    case F_COUNT: case F_LENGTH: {
        NOARGS();
        int64_t n = jlen(c, v);
        return n < 0 ? NULL : jv_int(c, n);
    }
    case F_DEFAULT:
        BIND("default_value", "boolean");
        if (v->t == JV_UNDEF || (a[1] && jv_truthy(a[1]) && !jv_truthy(v))) return a[0] ? a[0] : jv_str_nocopy(c, "", 0);
        return v;
    case F_DICTSORT: {
        BIND("case_sensitive", "by", "reverse");
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        if (v->t != JV_DICT) { jj_fail(c, DF_EINVAL, "AttributeError: '%s' object has no attribute 'items'", jv_type_name(v)); return NULL; }
        int pos = 0;
        if (a[1]) {
            if (need_str(c, a[1], "by")) return NULL;
            if (!strcmp(a[1]->s.p, "value")) pos = 1;
            else if (strcmp(a[1]->s.p, "key")) { jj_fail(c, DF_EINVAL, "FilterArgumentError: You can only sort by either \"key\" or \"value\""); return NULL; }
        }
        jv *items = dict_view(c, v, 0);
        if (!items) return NULL;
        items->flags = 0;
        jv **keys = malloc((items->l.n + 1) * sizeof *keys);
        if (!keys) return NULL;
        for (size_t i = 0; i < items->l.n; i++) keys[i] = items->l.a[i]->l.a[pos];
        jv *r = sorted(c, items, keys, a[0] && jv_truthy(a[0]), a[2] && jv_truthy(a[2]), 0);
        free(keys);
        return r;
    }
    case F_ESCAPE: case F_FORCEESCAPE: {
        NOARGS();
        if (v->t == JV_STR && (v->flags & JV_F_SAFE) && id == F_ESCAPE) return v;
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        html_escape(s->s.p, s->s.n, &b);
        jv *r = strval(c, &b);
        if (r) r->flags = JV_F_SAFE;
        return r;
    }
    case F_FIRST: case F_LAST: {
        NOARGS();
        if (id == F_LAST && (v->flags & JV_F_ITER)) {
            jj_fail(c, DF_EINVAL, "TypeError: '%s' object is not reversible", jv_type_name(v));
            return NULL;
        }
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        if (!items->l.n) return jv_undef(c, "No %s item, sequence was empty.", id == F_FIRST ? "first" : "last");
        return items->l.a[id == F_FIRST ? 0 : items->l.n - 1];
    }
    case F_FLOAT: {
        BIND("default");
        jv *d = a[0] ? a[0] : jv_float(c, 0.0);
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v); /* float(Undefined) raises */
        if (v->t == JV_FLOAT) return v;
        if (v->t == JV_INT || v->t == JV_BOOL) return jv_float(c, jv_num(v));
        if (v->t == JV_STR) {
            int ok;
            jv *r = parse_number_str(c, v, 0, 10, &ok);
            if (ok) return r;
            /* inf / nan spellings */
            char t[16] = {0};
            size_t l = v->s.n < 15 ? v->s.n : 15;
            for (size_t i = 0; i < l; i++) t[i] = (char)(v->s.p[i] | 0x20);
            if (!strcmp(t, "inf") || !strcmp(t, "infinity") || !strcmp(t, "+inf")) return jv_float(c, INFINITY);
            if (!strcmp(t, "-inf") || !strcmp(t, "-infinity")) return jv_float(c, -INFINITY);
            if (!strcmp(t, "nan")) return jv_float(c, NAN);
        }
        return d;
    }
    case F_FORMAT: {
        if (nargs && nkw) { jj_fail(c, DF_EINVAL, "FilterArgumentError: can't handle positional and keyword arguments at the same time"); return NULL; }
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        if (nkw) {
            jv *d = jv_dict(c, (size_t)nkw);
            if (!d) return NULL;
            for (int k = 0; k < nkw; k++) { jv *kk = jv_strz(c, kwn[k]); if (!kk || jv_dict_set(c, d, kk, kwv[k])) return NULL; }
            return percent_format(c, s, d);
        }
        jv *t = jv_list(c, JV_TUPLE, (size_t)nargs);
        if (!t) return NULL;
        for (int i = 0; i < nargs; i++) t->l.a[i] = args[i];
        return percent_format(c, s, t);
    }
    case F_INDENT: {
        BIND("width", "first", "blank");
        if (v->t != JV_STR) { /* jinja2 does s += "\n" on the value itself */
            if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
            jj_fail(c, DF_EINVAL, "TypeError: indent needs a string, not %s", jv_type_name(v));
            return NULL;
        }
        jv *s = v;
        jb ind = {0};
        if (a[0] && a[0]->t == JV_STR) jb_put(&ind, a[0]->s.p, a[0]->s.n);
        else {
            int64_t w = 4;
            if (a[0] && need_int(c, a[0], &w, "width")) return NULL;
            for (int64_t i = 0; i < w; i++) jb_putc(&ind, ' ');
        }
        jb src = {0};
        jb_put(&src, s->s.p, s->s.n);
        jb_putc(&src, '\n');
        jv *srcv = strval(c, &src); /* arena copy: the lines point into it */
        jv *lines = srcv ? do_splitlines(c, srcv->s.p, srcv->s.n, 0) : NULL;
        if (!lines) { free(ind.p); return NULL; }
        int blank = a[2] && jv_truthy(a[2]);
        for (size_t i = 0; i < lines->l.n; i++) {
            jv *ln = lines->l.a[i];
            if (i) {
                jb_putc(&b, '\n');
                if (blank || ln->s.n) jb_put(&b, ind.p ? ind.p : "", ind.n);
            }
            jb_put(&b, ln->s.p, ln->s.n);
        }
        if (a[1] && jv_truthy(a[1])) {
            jb r = {0};
            jb_put(&r, ind.p ? ind.p : "", ind.n);
            jb_put(&r, b.p ? b.p : "", b.n);
            free(b.p);
            b = r;
        }
        free(ind.p);
        return strval(c, &b);
    }
    case F_INT: {
        BIND("default", "base");
        jv *d = a[0] ? a[0] : jv_int(c, 0);
        int64_t base = 10;
        if (a[1] && need_int(c, a[1], &base, "base")) return NULL;
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v); /* int(Undefined) raises */
        if (v->t == JV_INT) return v;
        if (v->t == JV_BOOL) return jv_int(c, v->b);
        if (v->t == JV_FLOAT) { jv *r = float_to_int(c, v->f); return r ? r : d; }
        if (v->t == JV_STR) {
            int ok;
            jv *r = parse_number_str(c, v, 1, base, &ok);
            if (ok) return r;
            r = parse_number_str(c, v, 0, 10, &ok);
            if (ok) { jv *q = float_to_int(c, r->f); return q ? q : d; }
        }
        return d;
    }
    case F_ITEMS: {
        NOARGS();
        if (v->t == JV_UNDEF) return as_iter(jv_list(c, JV_LIST, 0));
        if (v->t != JV_DICT) { jj_fail(c, DF_EINVAL, "TypeError: Can only get item pairs from a mapping."); return NULL; }
        jv *r = dict_view(c, v, 0);
        if (r) r->flags = 0;
        return as_iter(r);
    }
    case F_JOIN: {
        BIND("d", "attribute");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        if (a[0] && a[0]->t != JV_STR) { if (!(a[0] = jv_as_str(c, a[0]))) return NULL; }
        for (size_t i = 0; i < items->l.n; i++) {
            jv *x = items->l.a[i];
            if (a[1]) { x = attr_path(c, x, a[1], NULL); if (!x) { free(b.p); return NULL; } }
            if (i && a[0]) jb_put(&b, a[0]->s.p, a[0]->s.n);
            if (jv_to_str(c, x, &b)) { free(b.p); return NULL; }
        }
        return strval(c, &b);
    }
    case F_LIST: {
        NOARGS();
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        return list_from(c, items->l.a, items->l.n);
    }
    case F_MAP: {
        if (!jv_truthy(v)) return as_iter(jv_list(c, JV_LIST, 0)); /* "if value:" before iterating */
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        jv *r = as_iter(jv_list(c, JV_LIST, items->l.n));
        if (!r) return NULL;
        if (nargs == 0) { /* map(attribute=..., default=...) */
            jv *attr = NULL, *dflt = NULL;
            for (int k = 0; k < nkw; k++) {
                if (!strcmp(kwn[k], "attribute")) attr = kwv[k];
                else if (!strcmp(kwn[k], "default")) dflt = kwv[k];
                else { jj_fail(c, DF_EINVAL, "FilterArgumentError: Unexpected keyword argument '%s'", kwn[k]); return NULL; }
            }
            if (!attr) { jj_fail(c, DF_EINVAL, "FilterArgumentError: map requires a filter argument"); return NULL; }
            for (size_t i = 0; i < items->l.n; i++) if (!(r->l.a[i] = attr_path(c, items->l.a[i], attr, dflt))) return NULL;
            return r;
        }
        if (need_str(c, args[0], "filter name")) return NULL;
        int sup;
        int fid = jj_filter_id(args[0]->s.p, &sup);
        if (fid < 0) { jj_fail(c, DF_EINVAL, "TemplateRuntimeError: No filter named '%s'", args[0]->s.p); return NULL; }
        if (!sup) { jj_fail(c, DF_EUNSUPPORTED, "filter '%s' is not supported by deltafin's Jinja subset", args[0]->s.p); return NULL; }
        for (size_t i = 0; i < items->l.n; i++)
            if (!(r->l.a[i] = jj_apply_filter(c, f, fid, args[0]->s.p, items->l.a[i], args + 1, nargs - 1, kwn, kwv, nkw)))
                return NULL;
        return r;
    }
    case F_MAX: case F_MIN: {
        BIND("case_sensitive", "attribute");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        if (!items->l.n) return jv_undef(c, "No aggregated item, sequence was empty.");
        jv *best = items->l.a[0], *bk = a[1] ? attr_path(c, best, a[1], NULL) : best;
        if (!bk) return NULL;
        for (size_t i = 1; i < items->l.n; i++) {
            jv *x = items->l.a[i], *xk = a[1] ? attr_path(c, x, a[1], NULL) : x;
            if (!xk) return NULL;
            int lt = id == F_MAX ? sort_key_less(c, bk, xk, a[0] && jv_truthy(a[0]))
                                 : sort_key_less(c, xk, bk, a[0] && jv_truthy(a[0]));
            if (lt < 0) return NULL;
            if (lt) { best = x; bk = xk; }
        }
        return best;
    }
    case F_REJECT: case F_SELECT:
        if (nkw) { jj_fail(c, DF_EINVAL, "TypeError: %s() got unexpected keyword arguments", name); return NULL; }
        return select_items(c, f, v, args, nargs, 0, id == F_SELECT);
    case F_REJECTATTR: case F_SELECTATTR:
        if (nkw) { jj_fail(c, DF_EINVAL, "TypeError: %s() got unexpected keyword arguments", name); return NULL; }
        return select_items(c, f, v, args, nargs, 1, id == F_SELECTATTR);
    case F_REPLACE: {
        BIND("old", "new", "count");
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        if (a[0] && a[0]->t != JV_STR && !(a[0] = jv_as_str(c, a[0]))) return NULL;
        if (a[1] && a[1]->t != JV_STR && !(a[1] = jv_as_str(c, a[1]))) return NULL;
        jv *fn = bound(c, M_S_REPLACE, s, "replace");
        jv *xa[3] = {a[0], a[1], a[2]};
        jv *r = fn ? str_method(c, fn, xa, a[2] ? 3 : 2, NULL, NULL, 0) : NULL;
        if (r && (s->flags & JV_F_SAFE)) r->flags |= JV_F_SAFE;
        return r;
    }
    case F_REVERSE: {
        NOARGS();
        if (v->t == JV_STR) {
            size_t n = ju_len(v->s.p, v->s.n);
            jv *items = jj_iterate(c, v);
            if (!items) return NULL;
            for (size_t i = n; i-- > 0;) jb_put(&b, items->l.a[i]->s.p, items->l.a[i]->s.n);
            return strval(c, &b);
        }
        int was_iter = (v->flags & JV_F_ITER) != 0; /* reversed() fails on a generator: list(value) reversed */
        if (!was_iter && v->t != JV_LIST && v->t != JV_TUPLE && v->t != JV_DICT) {
            if (v->t == JV_UNDEF) return as_iter(jv_list(c, JV_LIST, 0)); /* reversed(Undefined): empty */
            jj_fail(c, DF_EINVAL, "FilterArgumentError: argument must be iterable");
            return NULL;
        }
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        jv *r = jv_list(c, JV_LIST, items->l.n);
        if (!r) return NULL;
        for (size_t i = 0; i < items->l.n; i++) r->l.a[i] = items->l.a[items->l.n - 1 - i];
        return was_iter ? r : as_iter(r);
    }
    case F_ROUND: {
        BIND("precision", "method");
        int64_t prec = 0;
        if (a[0] && need_int(c, a[0], &prec, "precision")) return NULL;
        const char *m = "common";
        if (a[1]) { if (need_str(c, a[1], "method")) return NULL; m = a[1]->s.p; }
        if (!jv_is_number(v)) {
            if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
            jj_fail(c, DF_EINVAL, "TypeError: type %s doesn't define __round__ method", jv_type_name(v));
            return NULL;
        }
        double x = jv_num(v), p10 = pow(10.0, (double)prec);
        if (!strcmp(m, "common")) {
            if (v->t != JV_FLOAT) return jv_int(c, v->t == JV_INT ? v->i : v->b); /* round(int, n) stays an int */
            char t[64];
            if (prec >= 0 && prec < 30) { snprintf(t, sizeof t, "%.*f", (int)prec, x); return jv_float(c, strtod(t, NULL)); }
            return jv_float(c, nearbyint(x * p10) / p10);
        }
        if (!strcmp(m, "ceil")) return jv_float(c, ceil(x * p10) / p10);
        if (!strcmp(m, "floor")) return jv_float(c, floor(x * p10) / p10);
        jj_fail(c, DF_EINVAL, "FilterArgumentError: method must be common, ceil or floor");
        return NULL;
    }
    case F_SAFE: {
        NOARGS();
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        jv *r = jv_str_nocopy(c, s->s.p, s->s.n);
        if (r) r->flags = JV_F_SAFE;
        return r;
    }
    case F_SORT: {
        BIND("reverse", "case_sensitive", "attribute");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        jv **keys = malloc((items->l.n + 1) * sizeof *keys);
        if (!keys) return NULL;
        for (size_t i = 0; i < items->l.n; i++) {
            keys[i] = a[2] ? attr_path(c, items->l.a[i], a[2], NULL) : items->l.a[i];
            if (!keys[i]) { free(keys); return NULL; }
        }
        jv *r = sorted(c, items, keys, a[1] && jv_truthy(a[1]), a[0] && jv_truthy(a[0]), 1);
        free(keys);
        return r;
    }
    case F_STRING: {
        NOARGS();
        return jv_as_str(c, v);
    }
    case F_SUM: {
        BIND("attribute", "start");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        jv *acc = a[1] ? a[1] : jv_int(c, 0);
        for (size_t i = 0; i < items->l.n && acc; i++) {
            jv *x = a[0] ? attr_path(c, items->l.a[i], a[0], NULL) : items->l.a[i];
            if (!x) return NULL;
            acc = jj_binop(c, OP_ADD, acc, x);
        }
        return acc;
    }
    case F_TOJSON: {
        /* transformers: json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
        BIND("ensure_ascii", "indent", "separators", "sort_keys");
        jj_json_opts o = {.ensure_ascii = a[0] && jv_truthy(a[0]), .sort_keys = a[3] && jv_truthy(a[3])};
        jb ind = {0};
        if (a[1] && a[1]->t != JV_NONE) {
            o.has_indent = 1;
            if (a[1]->t == JV_STR) jb_put(&ind, a[1]->s.p, a[1]->s.n);
            else {
                int64_t w;
                if (need_int(c, a[1], &w, "indent")) return NULL;
                for (int64_t i = 0; i < w; i++) jb_putc(&ind, ' ');
            }
            o.indent = ind.p ? ind.p : "";
            o.indent_n = ind.n;
        }
        o.item_sep = o.has_indent ? "," : ", ";
        o.key_sep = ": ";
        char *is = NULL, *ks = NULL;
        if (a[2] && a[2]->t != JV_NONE) {
            if ((a[2]->t != JV_TUPLE && a[2]->t != JV_LIST) || a[2]->l.n != 2 || a[2]->l.a[0]->t != JV_STR ||
                a[2]->l.a[1]->t != JV_STR) {
                free(ind.p);
                jj_fail(c, DF_EINVAL, "ValueError: separators must be a (item_separator, key_separator) pair of strings");
                return NULL;
            }
            is = strndup(a[2]->l.a[0]->s.p, a[2]->l.a[0]->s.n);
            ks = strndup(a[2]->l.a[1]->s.p, a[2]->l.a[1]->s.n);
            o.item_sep = is;
            o.key_sep = ks;
        }
        int rc = jv_json_dump(c, v, &o, &b);
        free(ind.p); free(is); free(ks);
        if (rc) { free(b.p); return NULL; }
        return strval(c, &b);
    }
    case F_TRIM: {
        BIND("chars");
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        return do_strip(c, s, a[0], 3);
    }
    case F_TRUNCATE: {
        BIND("length", "killwords", "end", "leeway");
        jv *s = v; /* len(s) of the value itself; only a str is cut */
        int64_t length = 255, leeway = 5;
        if (a[0] && need_int(c, a[0], &length, "length")) return NULL;
        if (a[3] && a[3]->t != JV_NONE && need_int(c, a[3], &leeway, "leeway")) return NULL;
        jv *end = a[2] ? a[2] : jv_str_nocopy(c, "...", 3);
        if (!end || need_str(c, end, "end")) return NULL;
        int64_t endlen = (int64_t)ju_len(end->s.p, end->s.n);
        if (length < endlen) { jj_fail(c, DF_EINVAL, "AssertionError: expected length >= %lld, got %lld", (long long)endlen, (long long)length); return NULL; }
        int64_t n = jlen(c, s);
        if (n < 0) return NULL;
        if (n <= length + leeway) return s;
        if (s->t != JV_STR) { jj_fail(c, DF_EUNSUPPORTED, "truncate of a long %s is not supported by deltafin's Jinja subset", jv_type_name(s)); return NULL; }
        size_t cut = ju_offset(s->s.p, s->s.n, (size_t)(length - endlen));
        if (a[1] && jv_truthy(a[1])) { jb_put(&b, s->s.p, cut); jb_put(&b, end->s.p, end->s.n); return strval(c, &b); }
        /* result = s[: length - len(end)].rsplit(" ", 1)[0] */
        const char *sp = memrmem_(s->s.p, cut, " ", 1);
        jb_put(&b, s->s.p, sp ? (size_t)(sp - s->s.p) : cut);
        jb_put(&b, end->s.p, end->s.n);
        return strval(c, &b);
    }
    case F_UNIQUE: {
        BIND("case_sensitive", "attribute");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        vec out = {0}, seen = {0};
        for (size_t i = 0; i < items->l.n; i++) {
            jv *x = items->l.a[i], *k = a[1] ? attr_path(c, x, a[1], NULL) : x;
            if (!k) { free(out.v); free(seen.v); return NULL; }
            if (k->t == JV_LIST || k->t == JV_DICT || k->t == JV_NS) {
                jj_fail(c, DF_EINVAL, "TypeError: unhashable type: '%s'", jv_type_name(k));
                free(out.v); free(seen.v);
                return NULL;
            }
            if (!(a[0] && jv_truthy(a[0])) && k->t == JV_STR) {
                jb lo = {0};
                case_map(k->s.p, k->s.n, CASE_LOWER, &lo);
                k = strval(c, &lo);
                if (!k) { free(out.v); free(seen.v); return NULL; }
            }
            int dup = 0;
            for (size_t j = 0; j < seen.n && !dup; j++) dup = jv_equal(seen.v[j], k);
            if (!dup && (vec_push(c, &seen, k) || vec_push(c, &out, x))) { free(out.v); free(seen.v); return NULL; }
        }
        free(seen.v);
        return as_iter(vec_list(c, &out));
    }
    case F_WORDCOUNT: {
        NOARGS();
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        int64_t k = 0;
        int in_word = 0;
        size_t i = 0;
        while (i < s->s.n) {
            size_t adv;
            int32_t cp = ju_decode(s->s.p + i, s->s.n - i, &adv);
            utf8proc_category_t cat = utf8proc_category(cp);
            int w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_NO);
            if (w && !in_word) k++;
            in_word = w;
            i += adv;
        }
        return jv_int(c, k);
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "filter '%s' is not supported by deltafin's Jinja subset", name);
    return NULL;
#undef BIND
#undef NOARGS
}

/* ============================================================ tests */

int jj_apply_test(jj_ctx *c, int id, const char *name, jv *v, jv **args, int nargs) {
    jv *x = nargs > 0 ? args[0] : NULL;
    if ((id == T_EQ || id == T_NE || id == T_LT || id == T_LE || id == T_GT || id == T_GE || id == T_IN ||
         id == T_DIVISIBLEBY || id == T_SAMEAS) && !x) {
        jj_fail(c, DF_EINVAL, "TypeError: test '%s' needs an argument", name);
        return -1;
    }
    int lt;
    switch (id) {
    case T_DEFINED: return v->t != JV_UNDEF;
    case T_UNDEFINED: return v->t == JV_UNDEF;
    case T_NONE: return v->t == JV_NONE;
    case T_STRING: return v->t == JV_STR;
    case T_NUMBER: return jv_is_number(v);
    case T_INTEGER: return v->t == JV_INT;
    case T_FLOAT: return v->t == JV_FLOAT;
    case T_BOOLEAN: return v->t == JV_BOOL;
    case T_MAPPING: return v->t == JV_DICT;
    case T_ITERABLE: return v->t == JV_STR || v->t == JV_LIST || v->t == JV_TUPLE || v->t == JV_DICT || v->t == JV_UNDEF;
    case T_SEQUENCE:
        if (v->flags & JV_F_ITER) return 0; /* no len() */
        return v->t == JV_STR || v->t == JV_LIST || v->t == JV_TUPLE || v->t == JV_DICT || v->t == JV_UNDEF;
    case T_CALLABLE: return v->t == JV_MACRO || v->t == JV_FUNC || v->t == JV_METHOD || v->t == JV_UNDEF;
    case T_EQ: return jv_equal(v, x);
    case T_NE: return !jv_equal(v, x);
    case T_LT: return jv_less(c, v, x);
    case T_GT: return jv_less(c, x, v);
    case T_LE: lt = jv_less(c, v, x); return lt < 0 ? -1 : lt || jv_equal(v, x);
    case T_GE: lt = jv_less(c, x, v); return lt < 0 ? -1 : lt || jv_equal(v, x);
    case T_IN: {
        jv *hay = x;
        if (hay->t == JV_STR) {
            if (v->t != JV_STR) { jj_fail(c, DF_EINVAL, "TypeError: 'in <string>' requires string as left operand, not %s", jv_type_name(v)); return -1; }
            return memmem_(hay->s.p, hay->s.n, v->s.p, v->s.n) != NULL;
        }
        if (hay->t == JV_DICT) return jv_dict_get(hay, v) != NULL;
        jv *items = jj_iterate(c, hay);
        if (!items) return -1;
        for (size_t i = 0; i < items->l.n; i++) if (jv_equal(items->l.a[i], v)) return 1;
        return 0;
    }
    case T_ODD: case T_EVEN: case T_DIVISIBLEBY: {
        if (v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
        if (!jv_is_number(v)) { jj_fail(c, DF_EINVAL, "TypeError: not all arguments converted during string formatting"); return -1; }
        jv *two = jv_int(c, id == T_DIVISIBLEBY ? 0 : 2);
        jv *m = jj_binop(c, OP_MOD, v, id == T_DIVISIBLEBY ? x : two);
        if (!m) return -1;
        int zero = jv_num(m) == 0;
        return id == T_ODD ? (jv_num(m) == 1) : zero;
    }
    case T_SAMEAS:
        if (v == x) return 1;
        if (v->t != x->t) return 0;
        if (v->t == JV_NONE || v->t == JV_BOOL) return v->t == JV_NONE || v->b == x->b;
        if (v->t == JV_INT) return v->i == x->i && v->i >= -5 && v->i <= 256; /* CPython small-int cache */
        return 0;
    case T_LOWER: case T_UPPER: {
        jv *s = jv_as_str(c, v);
        if (!s) return -1;
        return str_pred(s, id == T_LOWER ? 5 : 6);
    }
    case T_TRUE: return v->t == JV_BOOL && v->b;
    case T_FALSE: return v->t == JV_BOOL && !v->b;
    case T_ESCAPED: return v->t == JV_STR && (v->flags & JV_F_SAFE);
    case T_FILTER: case T_TEST: {
        if (v->t != JV_STR) return 0;
        int sup;
        return (id == T_FILTER ? jj_filter_id(v->s.p, &sup) : jj_test_id(v->s.p, &sup)) >= 0 && sup;
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "test '%s' is not supported by deltafin's Jinja subset", name);
    return -1;
}
