/* jinja_filters.c — the filters and tests of jinja2 3.1 that chat templates
 * use (transformers' tojson among them), resolved to ids at parse time and
 * applied at render time. A known jinja2 filter we do not implement is
 * refused by name, never approximated. */
#include "jinja_int.h"
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ============================================================ helpers */

/* len(v); -1 + TypeError for a value without a length (a generator included) */
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

/* marks list l as a one-pass generator result (map, select, items, unique, reverse) */
static jv *as_iter(jv *l) {
    if (l) l->flags = (l->flags & ~JV_F_CONSUMED) | JV_F_ITER;
    return l;
}

/* ============================================================ filters */

enum {
    F_ABS = 1, F_ATTR, F_CAPITALIZE, F_CENTER, F_COUNT, F_DEFAULT, F_DICTSORT, F_ESCAPE, F_FIRST, F_FLOAT,
    F_FORCEESCAPE, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP, F_MAX, F_MIN,
    F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR, F_SORT, F_STRING, F_SUM,
    F_TITLE, F_TOJSON, F_TRIM, F_TRUNCATE, F_UNIQUE, F_UPPER, F_WORDCOUNT,
    F_UNSUPPORTED = 1000
};
static const jj_mdef filters[] = {
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
    for (const jj_mdef *f = filters; f->name; f++)
        if (!strcmp(f->name, name)) { *supported = f->id != F_UNSUPPORTED; return f->id; }
    *supported = 0;
    return -1;
}

enum {
    T_DEFINED = 1, T_UNDEFINED, T_NONE, T_STRING, T_NUMBER, T_INTEGER, T_FLOAT, T_BOOLEAN, T_MAPPING, T_ITERABLE,
    T_SEQUENCE, T_CALLABLE, T_EQ, T_NE, T_LT, T_LE, T_GT, T_GE, T_IN, T_ODD, T_EVEN, T_DIVISIBLEBY, T_SAMEAS,
    T_LOWER, T_UPPER, T_TRUE, T_FALSE, T_ESCAPED, T_FILTER, T_TEST
};
static const jj_mdef tests[] = {
    {"defined", T_DEFINED}, {"undefined", T_UNDEFINED}, {"none", T_NONE}, {"string", T_STRING}, {"number", T_NUMBER},
    {"integer", T_INTEGER}, {"float", T_FLOAT}, {"boolean", T_BOOLEAN}, {"mapping", T_MAPPING},
    {"iterable", T_ITERABLE}, {"sequence", T_SEQUENCE}, {"callable", T_CALLABLE}, {"eq", T_EQ}, {"equalto", T_EQ},
    {"==", T_EQ}, {"ne", T_NE}, {"!=", T_NE}, {"lt", T_LT}, {"lessthan", T_LT}, {"<", T_LT}, {"le", T_LE},
    {"<=", T_LE}, {"gt", T_GT}, {"greaterthan", T_GT}, {">", T_GT}, {"ge", T_GE}, {">=", T_GE}, {"in", T_IN},
    {"odd", T_ODD}, {"even", T_EVEN}, {"divisibleby", T_DIVISIBLEBY}, {"sameas", T_SAMEAS}, {"lower", T_LOWER},
    {"upper", T_UPPER}, {"true", T_TRUE}, {"false", T_FALSE}, {"escaped", T_ESCAPED}, {"filter", T_FILTER},
    {"test", T_TEST}, {NULL, 0}};

int jj_test_id(const char *name, int *supported) {
    for (const jj_mdef *t = tests; t->name; t++)
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
        jj_case_map(a->s.p, a->s.n, CASE_LOWER, &x);
        jj_case_map(b->s.p, b->s.n, CASE_LOWER, &y);
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
        if (nargs < 1 || jj_need_str(c, args[0], "attribute")) return NULL;
        attr = args[0];
        ai = 1;
    }
    int tid = -1;
    const char *tname = NULL;
    if (ai < nargs) {
        if (jj_need_str(c, args[ai], "test name")) return NULL;
        int sup;
        tname = args[ai]->s.p;
        tid = jj_test_id(tname, &sup);
        if (tid < 0) { jj_fail(c, DF_EINVAL, "TemplateRuntimeError: No test named '%s'", tname); return NULL; }
        ai++;
    }
    jj_vec out = {0};
    for (size_t i = 0; i < items->l.n; i++) {
        jv *x = items->l.a[i];
        jv *t = attr ? attr_path(c, x, attr, NULL) : x;
        if (!t) { free(out.v); return NULL; }
        int r = tid >= 0 ? jj_apply_test(c, tid, tname, t, args + ai, nargs - ai) : jv_truthy(t);
        if (r < 0) { free(out.v); return NULL; }
        if (r == keep && jj_vec_push(c, &out, x)) { free(out.v); return NULL; }
    }
    (void)f;
    return as_iter(jj_vec_list(c, &out));
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
        if (jj_bind(c, name, pp_, (int)(sizeof pp_ / sizeof *pp_), args, nargs, kwn, kwv, nkw, a, 0)) return NULL; } while (0)
#define NOARGS() do { if (jj_bind(c, name, NULL, 0, args, nargs, kwn, kwv, nkw, a, 0)) return NULL; } while (0)
    switch (id) {
    case F_ABS:
        NOARGS();
        if (v->t == JV_INT) { if (v->i == INT64_MIN) return jj_overflow(c); return jv_int(c, v->i < 0 ? -v->i : v->i); }
        if (v->t == JV_BOOL) return jv_int(c, v->b);
        if (v->t == JV_FLOAT) return jv_float(c, fabs(v->f));
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        jj_fail(c, DF_EINVAL, "TypeError: bad operand type for abs(): '%s'", jv_type_name(v));
        return NULL;
    case F_ATTR:
        BIND("name");
        if (jj_need_str(c, a[0], "attribute name")) return NULL;
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
        if (id == F_CAPITALIZE) jj_py_capitalize(s->s.p, s->s.n, &b);
        else if (id == F_TITLE) jinja_title(s->s.p, s->s.n, &b);
        else jj_case_map(s->s.p, s->s.n, id == F_UPPER ? CASE_UPPER : CASE_LOWER, &b);
        jv *r = jj_strval(c, &b);
        if (r) r->flags = s->flags & JV_F_SAFE;
        return r;
    }
    case F_CENTER: {
        BIND("width");
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        int is_attr;
        jv *fn = jj_method(c, s, "center", 6, &is_attr);
        jv *w = a[0] ? a[0] : jv_int(c, 80);
        return fn && w ? jj_call_builtin(c, fn, &w, 1, NULL, NULL, 0) : NULL;
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
            if (jj_need_str(c, a[1], "by")) return NULL;
            if (!strcmp(a[1]->s.p, "value")) pos = 1;
            else if (strcmp(a[1]->s.p, "key")) { jj_fail(c, DF_EINVAL, "FilterArgumentError: You can only sort by either \"key\" or \"value\""); return NULL; }
        }
        jv *items = jj_dict_view(c, v, 0);
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
        jj_html_escape(s->s.p, s->s.n, &b);
        jv *r = jj_strval(c, &b);
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
            return jj_percent_format(c, s, d);
        }
        jv *t = jv_list(c, JV_TUPLE, (size_t)nargs);
        if (!t) return NULL;
        for (int i = 0; i < nargs; i++) t->l.a[i] = args[i];
        return jj_percent_format(c, s, t);
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
            if (a[0] && jj_need_int(c, a[0], &w, "width")) return NULL;
            for (int64_t i = 0; i < w; i++) jb_putc(&ind, ' ');
        }
        jb src = {0};
        jb_put(&src, s->s.p, s->s.n);
        jb_putc(&src, '\n');
        jv *srcv = jj_strval(c, &src); /* arena copy: the lines point into it */
        jv *lines = srcv ? jj_splitlines(c, srcv->s.p, srcv->s.n, 0) : NULL;
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
        return jj_strval(c, &b);
    }
    case F_INT: {
        BIND("default", "base");
        jv *d = a[0] ? a[0] : jv_int(c, 0);
        int64_t base = 10;
        if (a[1] && jj_need_int(c, a[1], &base, "base")) return NULL;
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
        jv *r = jj_dict_view(c, v, 0);
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
        return jj_strval(c, &b);
    }
    case F_LIST: {
        NOARGS();
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        return jj_list_from(c, items->l.a, items->l.n);
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
        if (jj_need_str(c, args[0], "filter name")) return NULL;
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
        int is_attr;
        jv *fn = jj_method(c, s, "replace", 7, &is_attr);
        jv *xa[3] = {a[0], a[1], a[2]};
        jv *r = fn ? jj_call_builtin(c, fn, xa, a[2] ? 3 : 2, NULL, NULL, 0) : NULL;
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
            return jj_strval(c, &b);
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
        if (a[0] && jj_need_int(c, a[0], &prec, "precision")) return NULL;
        const char *m = "common";
        if (a[1]) { if (jj_need_str(c, a[1], "method")) return NULL; m = a[1]->s.p; }
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
                if (jj_need_int(c, a[1], &w, "indent")) return NULL;
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
        return jj_strval(c, &b);
    }
    case F_TRIM: {
        BIND("chars");
        jv *s = jv_as_str(c, v);
        if (!s) return NULL;
        return jj_strip(c, s, a[0], 3);
    }
    case F_TRUNCATE: {
        BIND("length", "killwords", "end", "leeway");
        jv *s = v; /* len(s) of the value itself; only a str is cut */
        int64_t length = 255, leeway = 5;
        if (a[0] && jj_need_int(c, a[0], &length, "length")) return NULL;
        if (a[3] && a[3]->t != JV_NONE && jj_need_int(c, a[3], &leeway, "leeway")) return NULL;
        jv *end = a[2] ? a[2] : jv_str_nocopy(c, "...", 3);
        if (!end || jj_need_str(c, end, "end")) return NULL;
        int64_t endlen = (int64_t)ju_len(end->s.p, end->s.n);
        if (length < endlen) { jj_fail(c, DF_EINVAL, "AssertionError: expected length >= %lld, got %lld", (long long)endlen, (long long)length); return NULL; }
        int64_t n = jlen(c, s);
        if (n < 0) return NULL;
        if (n <= length + leeway) return s;
        if (s->t != JV_STR) { jj_fail(c, DF_EUNSUPPORTED, "truncate of a long %s is not supported by deltafin's Jinja subset", jv_type_name(s)); return NULL; }
        size_t cut = ju_offset(s->s.p, s->s.n, (size_t)(length - endlen));
        if (a[1] && jv_truthy(a[1])) { jb_put(&b, s->s.p, cut); jb_put(&b, end->s.p, end->s.n); return jj_strval(c, &b); }
        /* result = s[: length - len(end)].rsplit(" ", 1)[0] */
        const char *sp = jj_memrmem(s->s.p, cut, " ", 1);
        jb_put(&b, s->s.p, sp ? (size_t)(sp - s->s.p) : cut);
        jb_put(&b, end->s.p, end->s.n);
        return jj_strval(c, &b);
    }
    case F_UNIQUE: {
        BIND("case_sensitive", "attribute");
        jv *items = jj_iterate(c, v);
        if (!items) return NULL;
        jj_vec out = {0}, seen = {0};
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
                jj_case_map(k->s.p, k->s.n, CASE_LOWER, &lo);
                k = jj_strval(c, &lo);
                if (!k) { free(out.v); free(seen.v); return NULL; }
            }
            int dup = 0;
            for (size_t j = 0; j < seen.n && !dup; j++) dup = jv_equal(seen.v[j], k);
            if (!dup && (jj_vec_push(c, &seen, k) || jj_vec_push(c, &out, x))) { free(out.v); free(seen.v); return NULL; }
        }
        free(seen.v);
        return as_iter(jj_vec_list(c, &out));
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
    case T_EQ: return jj_compare(c, CMP_EQ, v, x);
    case T_NE: return jj_compare(c, CMP_NE, v, x);
    case T_LT: return jj_compare(c, CMP_LT, v, x);
    case T_GT: return jj_compare(c, CMP_GT, v, x);
    case T_LE: return jj_compare(c, CMP_LE, v, x);
    case T_GE: return jj_compare(c, CMP_GE, v, x);
    case T_IN: {
        jv *hay = x;
        if (hay->t == JV_STR) {
            if (v->t != JV_STR) { jj_fail(c, DF_EINVAL, "TypeError: 'in <string>' requires string as left operand, not %s", jv_type_name(v)); return -1; }
            return jj_memmem(hay->s.p, hay->s.n, v->s.p, v->s.n) != NULL;
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
        return jj_str_pred(s, id == T_LOWER ? 5 : 6);
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
