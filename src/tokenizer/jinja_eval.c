/* jinja_eval.c — evaluation of the Jinja subset: expressions with Python
 * semantics, statements, jinja2's scoping (a for-loop iteration, a macro
 * call, a {% with %} and a block {% set %} each get a frame; {% if %} does
 * not; names resolve through the enclosing frames at the time of use, so a
 * macro sees the template's current top-level values), macros with defaults,
 * varargs / kwargs, loop controls, and the render entry point. */
#include "jinja_int.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RENDER_MEM_LIMIT ((size_t)1 << 30)
#define MAX_STEPS 200000000LL
#define MAX_DEPTH 200

enum { ST_OK = 0, ST_BREAK = 1, ST_CONTINUE = 2, ST_ERR = -1 };

/* ----------------------------------------------------------------- frames */

static jj_frame *frame_new(jj_ctx *c, jj_frame *parent) {
    jj_frame *f = ja_alloc(c->a, sizeof *f);
    if (!f) { jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
    f->parent = parent;
    return f;
}

static int frame_set(jj_ctx *c, jj_frame *f, const char *name, jv *v) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->vars[i].name, name)) { f->vars[i].v = v; return 0; }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        jj_var *nv = ja_alloc(c->a, (size_t)cap * sizeof *nv);
        if (!nv) { jj_fail(c, DF_ENOMEM, "out of memory"); return -1; }
        if (f->n) memcpy(nv, f->vars, (size_t)f->n * sizeof *nv);
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n].name = name;
    f->vars[f->n].v = v;
    f->n++;
    return 0;
}

jv *jj_lookup(jj_ctx *c, jj_frame *f, const char *name) {
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (!strcmp(f->vars[i].name, name)) return f->vars[i].v;
    jv *g = jj_global(c, name);
    if (g || c->rc) return g;
    return jv_undef(c, "'%s' is undefined", name);
}

jv *jj_undef_fail(jj_ctx *c, const jv *u) {
    if (u->flags & JV_F_UNSAFE_ATTR) jj_fail(c, DF_EINVAL, "SecurityError: %s", u->u.msg);
    else jj_fail(c, DF_EINVAL, "UndefinedError: %s", u->u.msg ? u->u.msg : "'undefined' is undefined");
    return NULL;
}

/* ------------------------------------------------------------ expressions */

static int eval_args(jj_ctx *c, jj_frame *f, const jnode *e, jv ***args, jv ***kwv) {
    *args = NULL;
    *kwv = NULL;
    if (e->n) {
        *args = ja_alloc(c->a, (size_t)e->n * sizeof(jv *));
        if (!*args) { jj_fail(c, DF_ENOMEM, "out of memory"); return -1; }
        for (int i = 0; i < e->n; i++) if (!((*args)[i] = jj_eval(c, f, e->list[i]))) return -1;
    }
    if (e->n2) {
        *kwv = ja_alloc(c->a, (size_t)e->n2 * sizeof(jv *));
        if (!*kwv) { jj_fail(c, DF_ENOMEM, "out of memory"); return -1; }
        for (int i = 0; i < e->n2; i++) if (!((*kwv)[i] = jj_eval(c, f, e->list2[i]))) return -1;
    }
    return 0;
}

static int slice_index(jj_ctx *c, jv *v, int64_t *out, int *present) {
    *present = 0;
    if (!v || v->t == JV_NONE) return 0;
    if (v->t == JV_INT || v->t == JV_BOOL) { *out = v->t == JV_INT ? v->i : v->b; *present = 1; return 0; }
    if (v->t == JV_UNDEF) { jj_undef_fail(c, v); return -1; }
    jj_fail(c, DF_EINVAL, "TypeError: slice indices must be integers or None, not %s", jv_type_name(v));
    return -1;
}

/* Python slice semantics on a sequence of n items: fills the index list */
static int64_t *slice_indices(jj_ctx *c, int64_t n, jv *sa, jv *sb, jv *sc, int64_t *count) {
    int64_t start, stop, step = 1;
    int hs, he, hst;
    if (slice_index(c, sa, &start, &hs) || slice_index(c, sb, &stop, &he) || slice_index(c, sc, &step, &hst)) return NULL;
    if (!hst) step = 1;
    if (step == 0) { jj_fail(c, DF_EINVAL, "ValueError: slice step cannot be zero"); return NULL; }
    if (step > 0) {
        if (!hs) start = 0; else if (start < 0) { start += n; if (start < 0) start = 0; } else if (start > n) start = n;
        if (!he) stop = n; else if (stop < 0) { stop += n; if (stop < 0) stop = 0; } else if (stop > n) stop = n;
    } else {
        if (!hs) start = n - 1; else if (start < 0) { start += n; if (start < 0) start = -1; } else if (start >= n) start = n - 1;
        if (!he) stop = -1; else if (stop < 0) { stop += n; if (stop < 0) stop = -1; } else if (stop >= n) stop = n - 1;
    }
    int64_t k = 0;
    if (step > 0 && stop > start) k = (stop - start + step - 1) / step;
    if (step < 0 && stop < start) k = (start - stop + (-step) - 1) / (-step);
    int64_t *idx = ja_alloc(c->a, (size_t)(k ? k : 1) * sizeof *idx);
    if (!idx) { jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
    for (int64_t i = 0; i < k; i++) idx[i] = start + i * step;
    *count = k;
    return idx;
}

static jv *eval_slice(jj_ctx *c, jj_frame *f, jv *obj, const jnode *s) {
    jv *sa = NULL, *sb = NULL, *sc = NULL;
    if (s->a && !(sa = jj_eval(c, f, s->a))) return NULL;
    if (s->b && !(sb = jj_eval(c, f, s->b))) return NULL;
    if (s->c && !(sc = jj_eval(c, f, s->c))) return NULL;
    if (obj->t == JV_UNDEF) return jj_undef_fail(c, obj);
    int64_t k;
    if (obj->t == JV_STR) {
        int64_t n = (int64_t)ju_len(obj->s.p, obj->s.n);
        int64_t *idx = slice_indices(c, n, sa, sb, sc, &k);
        if (!idx) return NULL;
        /* code point offsets */
        size_t *off = malloc((size_t)(n + 1) * sizeof *off);
        if (!off) { jj_fail(c, DF_ENOMEM, "out of memory"); return NULL; }
        size_t i = 0;
        int64_t cp = 0;
        while (i < obj->s.n) {
            off[cp++] = i;
            i++;
            while (i < obj->s.n && ((unsigned char)obj->s.p[i] & 0xC0) == 0x80) i++;
        }
        off[n] = obj->s.n;
        jb b = {0};
        int step1 = k > 0 && (k == 1 || idx[1] == idx[0] + 1);
        if (step1 && k > 0) jb_put(&b, obj->s.p + off[idx[0]], off[idx[k - 1] + 1] - off[idx[0]]);
        else for (int64_t j = 0; j < k; j++) jb_put(&b, obj->s.p + off[idx[j]], off[idx[j] + 1] - off[idx[j]]);
        free(off);
        jv *r = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return r;
    }
    if (obj->t == JV_LIST || obj->t == JV_TUPLE) {
        int64_t *idx = slice_indices(c, (int64_t)obj->l.n, sa, sb, sc, &k);
        if (!idx) return NULL;
        jv *r = jv_list(c, obj->t, (size_t)k);
        if (!r) return NULL;
        for (int64_t j = 0; j < k; j++) r->l.a[j] = obj->l.a[idx[j]];
        return r;
    }
    if (obj->t == JV_DICT) {
        jj_fail(c, DF_EINVAL, "TypeError: unhashable type: 'slice'");
        return NULL;
    }
    return jv_undef(c, "'%s object' has no attribute 'slice'", jv_type_name(obj));
}

static int hashable(jj_ctx *c, jv *k) {
    if (k->t == JV_LIST || k->t == JV_DICT || k->t == JV_NS) {
        jj_fail(c, DF_EINVAL, "TypeError: unhashable type: '%s'", jv_type_name(k));
        return 0;
    }
    if (k->t == JV_TUPLE) for (size_t i = 0; i < k->l.n; i++) if (!hashable(c, k->l.a[i])) return 0;
    return 1;
}

/* `needle in hay` */
static int contains(jj_ctx *c, jv *hay, jv *needle) {
    switch (hay->t) {
    case JV_STR:
        if (needle->t != JV_STR) {
            if (needle->t == JV_UNDEF) { jj_undef_fail(c, needle); return -1; }
            jj_fail(c, DF_EINVAL, "TypeError: 'in <string>' requires string as left operand, not %s", jv_type_name(needle));
            return -1;
        }
        if (!needle->s.n) return 1;
        if (needle->s.n > hay->s.n) return 0;
        for (size_t i = 0; i + needle->s.n <= hay->s.n; i++)
            if (!memcmp(hay->s.p + i, needle->s.p, needle->s.n)) return 1;
        return 0;
    case JV_LIST: case JV_TUPLE:
        for (size_t i = 0; i < hay->l.n; i++) if (jv_equal(hay->l.a[i], needle)) return 1;
        return 0;
    case JV_DICT:
        if (!hashable(c, needle)) return -1;
        return jv_dict_get(hay, needle) != NULL;
    case JV_UNDEF:
        return 0; /* iterates as empty */
    default:
        jj_fail(c, DF_EINVAL, "TypeError: argument of type '%s' is not iterable", jv_type_name(hay));
        return -1;
    }
}

int jj_compare(jj_ctx *c, int op, jv *l, jv *r) {
    int lt;
    switch (op) {
    case CMP_EQ: return jv_equal(l, r);
    case CMP_NE: return !jv_equal(l, r);
    case CMP_LT: return jv_less(c, l, r);
    case CMP_GT: return jv_less(c, r, l);
    case CMP_LE: lt = jv_less(c, l, r); return lt < 0 ? -1 : lt || jv_equal(l, r);
    case CMP_GE: lt = jv_less(c, r, l); return lt < 0 ? -1 : lt || jv_equal(l, r);
    case CMP_IN: return contains(c, r, l);
    case CMP_NOTIN: { int k = contains(c, r, l); return k < 0 ? -1 : !k; }
    }
    return -1;
}

jv *jj_eval(jj_ctx *c, jj_frame *f, const jnode *e) {
    if (c->rc) return NULL;
    c->line = e->line;
    switch (e->kind) {
    case JN_CONST: return e->cv;
    case JN_NAME: return jj_lookup(c, f, e->s);
    case JN_GETATTR: {
        jv *o = jj_eval(c, f, e->a);
        if (!o) return NULL;
        c->line = e->line;
        if (o->t == JV_UNDEF) return jj_undef_fail(c, o);
        return jj_getattr(c, o, e->s, e->sn);
    }
    case JN_GETITEM: {
        jv *o = jj_eval(c, f, e->a);
        if (!o) return NULL;
        if (e->b->kind == JN_SLICE) return eval_slice(c, f, o, e->b);
        jv *k = jj_eval(c, f, e->b);
        if (!k) return NULL;
        c->line = e->line;
        if (o->t == JV_UNDEF) return jj_undef_fail(c, o);
        return jj_getitem(c, o, k);
    }
    case JN_CALL: {
        jv *fn = jj_eval(c, f, e->a);
        if (!fn) return NULL;
        jv **args, **kwv;
        if (eval_args(c, f, e, &args, &kwv)) return NULL;
        c->line = e->line;
        return jj_call_value(c, fn, args, e->n, e->names, kwv, e->n2);
    }
    case JN_FILTER: {
        jv *v = jj_eval(c, f, e->a);
        if (!v) return NULL;
        jv **args, **kwv;
        if (eval_args(c, f, e, &args, &kwv)) return NULL;
        c->line = e->line;
        return jj_apply_filter(c, f, e->op, e->s, v, args, e->n, e->names, kwv, e->n2);
    }
    case JN_TEST: {
        jv *v = jj_eval(c, f, e->a);
        if (!v) return NULL;
        jv **args, **kwv;
        if (eval_args(c, f, e, &args, &kwv)) return NULL;
        c->line = e->line;
        int r = jj_apply_test(c, e->op, e->s, v, args, e->n);
        return r < 0 ? NULL : jv_bool(r);
    }
    case JN_BINOP: {
        jv *l = jj_eval(c, f, e->a);
        if (!l) return NULL;
        jv *r = jj_eval(c, f, e->b);
        if (!r) return NULL;
        c->line = e->line;
        return jj_binop(c, e->op, l, r);
    }
    case JN_NEG: case JN_POS: {
        jv *v = jj_eval(c, f, e->a);
        if (!v) return NULL;
        c->line = e->line;
        if (v->t == JV_UNDEF) return jj_undef_fail(c, v);
        if (v->t == JV_INT || v->t == JV_BOOL) {
            int64_t i = v->t == JV_INT ? v->i : v->b;
            if (e->kind == JN_POS) return jv_int(c, i);
            if (i == INT64_MIN) { jj_fail(c, DF_EUNSUPPORTED, "integer overflow (beyond 64 bits)"); return NULL; }
            return jv_int(c, -i);
        }
        if (v->t == JV_FLOAT) return e->kind == JN_POS ? v : jv_float(c, -v->f);
        jj_fail(c, DF_EINVAL, "TypeError: bad operand type for unary %c: '%s'", e->kind == JN_NEG ? '-' : '+',
                jv_type_name(v));
        return NULL;
    }
    case JN_NOT: {
        jv *v = jj_eval(c, f, e->a);
        return v ? jv_bool(!jv_truthy(v)) : NULL;
    }
    case JN_AND: case JN_OR: {
        jv *l = jj_eval(c, f, e->a);
        if (!l) return NULL;
        int t = jv_truthy(l);
        if (e->kind == JN_AND ? !t : t) return l;
        return jj_eval(c, f, e->b);
    }
    case JN_COMPARE: {
        jv *l = jj_eval(c, f, e->a);
        if (!l) return NULL;
        for (int i = 0; i < e->n; i++) {
            jv *r = jj_eval(c, f, e->list[i]);
            if (!r) return NULL;
            c->line = e->line;
            int k = jj_compare(c, e->ops[i], l, r);
            if (k < 0) return NULL;
            if (!k) return &jv_false_c;
            l = r;
        }
        return &jv_true_c;
    }
    case JN_COND: {
        jv *t = jj_eval(c, f, e->a);
        if (!t) return NULL;
        if (jv_truthy(t)) return jj_eval(c, f, e->b);
        if (e->c) return jj_eval(c, f, e->c);
        return jv_undef(c, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                        e->line);
    }
    case JN_LIST: case JN_TUPLE: {
        jv *l = jv_list(c, e->kind == JN_LIST ? JV_LIST : JV_TUPLE, (size_t)e->n);
        if (!l) return NULL;
        for (int i = 0; i < e->n; i++) if (!(l->l.a[i] = jj_eval(c, f, e->list[i]))) return NULL;
        return l;
    }
    case JN_DICT: {
        jv *d = jv_dict(c, (size_t)(e->n ? e->n : 1));
        if (!d) return NULL;
        for (int i = 0; i < e->n; i++) {
            jv *k = jj_eval(c, f, e->list[i]);
            if (!k) return NULL;
            jv *v = jj_eval(c, f, e->list2[i]);
            if (!v) return NULL;
            c->line = e->line;
            if (!hashable(c, k) || jv_dict_set(c, d, k, v)) return NULL;
        }
        return d;
    }
    case JN_CONCAT: {
        jb b = {0};
        for (int i = 0; i < e->n; i++) {
            jv *v = jj_eval(c, f, e->list[i]);
            if (!v || jv_to_str(c, v, &b)) { free(b.p); return NULL; }
        }
        jv *r = jv_str(c, b.p ? b.p : "", b.n);
        free(b.p);
        return r;
    }
    case JN_SLICE:
        jj_fail(c, DF_EINVAL, "a slice outside of a subscript");
        return NULL;
    }
    jj_fail(c, DF_EUNSUPPORTED, "internal: unknown expression node %d", e->kind);
    return NULL;
}

/* ------------------------------------------------------------ statements */

static int exec_node(jj_ctx *c, jj_frame *f, const jnode *s);

static int assign_targets(jj_ctx *c, jj_frame *f, const char **names, int n, jv *v) {
    if (n == 1) return frame_set(c, f, names[0], v);
    jv *items = jj_iterate(c, v);
    if (!items) return -1;
    if ((int)items->l.n != n) {
        if ((int)items->l.n > n) jj_fail(c, DF_EINVAL, "ValueError: too many values to unpack (expected %d)", n);
        else jj_fail(c, DF_EINVAL, "ValueError: not enough values to unpack (expected %d, got %zu)", n, items->l.n);
        return -1;
    }
    for (int i = 0; i < n; i++) if (frame_set(c, f, names[i], items->l.a[i])) return -1;
    return 0;
}

/* render a body into a string (new frame) */
static jv *render_body(jj_ctx *c, jj_frame *f, const jnode *body) {
    jb buf = {0}, *saved = c->out;
    c->out = &buf;
    jj_frame *inner = frame_new(c, f);
    int st = inner ? exec_node(c, inner, body) : ST_ERR;
    c->out = saved;
    if (st == ST_ERR || c->rc) { free(buf.p); return NULL; }
    jv *r = jv_str(c, buf.p ? buf.p : "", buf.n);
    free(buf.p);
    return r;
}

/* apply a filter chain parsed with a NULL innermost operand to v */
static jv *apply_chain(jj_ctx *c, jj_frame *f, const jnode *chain, jv *v) {
    if (!chain) return v;
    if (chain->a) { v = apply_chain(c, f, chain->a, v); if (!v) return NULL; }
    jv **args, **kwv;
    if (eval_args(c, f, chain, &args, &kwv)) return NULL;
    c->line = chain->line;
    return jj_apply_filter(c, f, chain->op, chain->s, v, args, chain->n, chain->names, kwv, chain->n2);
}

static jv *ns_target(jj_ctx *c, jj_frame *f, const char *name) {
    jv *ns = jj_lookup(c, f, name);
    if (!ns) return NULL;
    if (ns->t != JV_NS) {
        jj_fail(c, DF_EINVAL, "TemplateRuntimeError: cannot assign attribute on non-namespace object ('%s' is %s)", name,
                jv_type_name(ns));
        return NULL;
    }
    return ns;
}

static int exec_for(jj_ctx *c, jj_frame *f, const jnode *s) {
    jv *it = jj_eval(c, f, s->a);
    if (!it) return ST_ERR;
    c->line = s->line;
    jv *items = jj_iterate(c, it);
    if (!items) return ST_ERR;
    jv **v = items->l.a;
    int64_t n = (int64_t)items->l.n;
    if (s->b) { /* loop filter: evaluated with the target bound, before the loop runs */
        jv **keep = ja_alloc(c->a, (size_t)(n ? n : 1) * sizeof *keep);
        if (!keep) { jj_fail(c, DF_ENOMEM, "out of memory"); return ST_ERR; }
        int64_t k = 0;
        for (int64_t i = 0; i < n; i++) {
            jj_frame *tf = frame_new(c, f);
            if (!tf || assign_targets(c, tf, s->names, s->nnames, v[i])) return ST_ERR;
            jv *t = jj_eval(c, tf, s->b);
            if (!t) return ST_ERR;
            if (jv_truthy(t)) keep[k++] = v[i];
        }
        v = keep;
        n = k;
    }
    if (n == 0) {
        if (!s->d) return ST_OK;
        jj_frame *ef = frame_new(c, f);
        if (!ef) return ST_ERR;
        int st = exec_node(c, ef, s->d);
        return st == ST_ERR ? ST_ERR : ST_OK;
    }
    struct jj_loop *lp = ja_alloc(c->a, sizeof *lp);
    jv *lv = jv_new(c, JV_LOOP);
    if (!lp || !lv) { jj_fail(c, DF_ENOMEM, "out of memory"); return ST_ERR; }
    lp->items = v;
    lp->n = n;
    lp->depth = 1;
    lv->loop = lp;
    for (int64_t i = 0; i < n; i++) {
        if (++c->steps > MAX_STEPS) { jj_fail(c, DF_EINVAL, "the template ran more than %lld steps", MAX_STEPS); return ST_ERR; }
        lp->i = i;
        jj_frame *lf = frame_new(c, f);
        if (!lf) return ST_ERR;
        c->line = s->line;
        if (assign_targets(c, lf, s->names, s->nnames, v[i]) || frame_set(c, lf, "loop", lv)) return ST_ERR;
        int st = exec_node(c, lf, s->c);
        if (st == ST_ERR) return ST_ERR;
        if (st == ST_BREAK) break;
    }
    return ST_OK;
}

static int exec_node(jj_ctx *c, jj_frame *f, const jnode *s) {
    if (c->rc) return ST_ERR;
    c->line = s->line;
    switch (s->kind) {
    case JS_BODY:
        for (int i = 0; i < s->n; i++) {
            int st = exec_node(c, f, s->list[i]);
            if (st) return st;
        }
        return ST_OK;
    case JS_TEXT:
        if (jb_put(c->out, s->s, s->sn)) { jj_fail(c, DF_ENOMEM, "out of memory"); return ST_ERR; }
        return ST_OK;
    case JS_OUTPUT: {
        jv *v = jj_eval(c, f, s->a);
        if (!v) return ST_ERR;
        c->line = s->line;
        return jv_to_str(c, v, c->out) ? ST_ERR : ST_OK;
    }
    case JS_IF: {
        jv *t = jj_eval(c, f, s->a);
        if (!t) return ST_ERR;
        if (jv_truthy(t)) return exec_node(c, f, s->b);
        return s->c ? exec_node(c, f, s->c) : ST_OK;
    }
    case JS_FOR: return exec_for(c, f, s);
    case JS_SET: {
        jv *v = jj_eval(c, f, s->a);
        if (!v) return ST_ERR;
        c->line = s->line;
        return assign_targets(c, f, s->names, s->nnames, v) ? ST_ERR : ST_OK;
    }
    case JS_SETATTR: {
        jv *ns = ns_target(c, f, s->names[0]);
        if (!ns) return ST_ERR;
        jv *v = jj_eval(c, f, s->a);
        if (!v) return ST_ERR;
        jv *k = jv_strz(c, s->names[1]);
        return k && !jv_dict_set(c, ns, k, v) ? ST_OK : ST_ERR;
    }
    case JS_SETBLOCK: {
        jv *v = render_body(c, f, s->b);
        if (!v) return ST_ERR;
        v = apply_chain(c, f, s->a, v);
        if (!v) return ST_ERR;
        c->line = s->line;
        if (s->op) {
            jv *ns = ns_target(c, f, s->names[0]);
            jv *k = ns ? jv_strz(c, s->names[1]) : NULL;
            return k && !jv_dict_set(c, ns, k, v) ? ST_OK : ST_ERR;
        }
        return frame_set(c, f, s->names[0], v) ? ST_ERR : ST_OK;
    }
    case JS_MACRO: {
        jv *m = jv_new(c, JV_MACRO);
        struct jj_macro *mm = ja_alloc(c->a, sizeof *mm);
        if (!m || !mm) { jj_fail(c, DF_ENOMEM, "out of memory"); return ST_ERR; }
        mm->node = s;
        mm->closure = f;
        m->m = mm;
        return frame_set(c, f, s->s, m) ? ST_ERR : ST_OK;
    }
    case JS_BREAK: return ST_BREAK;
    case JS_CONTINUE: return ST_CONTINUE;
    case JS_WITH: {
        jv **vals = ja_alloc(c->a, (size_t)(s->n2 ? s->n2 : 1) * sizeof *vals);
        if (!vals) { jj_fail(c, DF_ENOMEM, "out of memory"); return ST_ERR; }
        for (int i = 0; i < s->n2; i++) if (!(vals[i] = jj_eval(c, f, s->list2[i]))) return ST_ERR;
        jj_frame *wf = frame_new(c, f);
        if (!wf) return ST_ERR;
        for (int i = 0; i < s->nnames; i++) if (frame_set(c, wf, s->names[i], vals[i])) return ST_ERR;
        return exec_node(c, wf, s->a);
    }
    case JS_FILTERBLOCK: {
        jv *v = render_body(c, f, s->b);
        if (!v) return ST_ERR;
        v = apply_chain(c, f, s->a, v);
        if (!v) return ST_ERR;
        return jv_to_str(c, v, c->out) ? ST_ERR : ST_OK;
    }
    }
    jj_fail(c, DF_EUNSUPPORTED, "internal: unknown statement node %d", s->kind);
    return ST_ERR;
}

/* ------------------------------------------------------------------ calls */

static jv *call_macro(jj_ctx *c, struct jj_macro *m, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    const jnode *d = m->node;
    int call_line = c->line;
    if (c->depth >= MAX_DEPTH) {
        jj_fail(c, DF_EINVAL, "RecursionError: macro '%s' nested deeper than %d calls", d->s, MAX_DEPTH);
        return NULL;
    }
    if (++c->steps > MAX_STEPS) { jj_fail(c, DF_EINVAL, "the template ran more than %lld steps", MAX_STEPS); return NULL; }
    jj_frame *mf = frame_new(c, m->closure);
    if (!mf) return NULL;
    int np = d->nnames;
    if (nargs > np && !(d->op & JM_VARARGS)) {
        jj_fail(c, DF_EINVAL, "TypeError: macro '%s' takes not more than %d argument(s)", d->s, np);
        return NULL;
    }
    jv *kwargs = (d->op & JM_KWARGS) ? jv_dict(c, 4) : NULL;
    if ((d->op & JM_KWARGS) && !kwargs) return NULL;
    for (int k = 0; k < nkw; k++) {
        int found = -1;
        for (int i = 0; i < np; i++) if (!strcmp(d->names[i], kwn[k])) found = i;
        if (found >= 0 && found < nargs) {
            jj_fail(c, DF_EINVAL, "TypeError: macro '%s' got multiple values for argument '%s'", d->s, kwn[k]);
            return NULL;
        }
        if (found < 0) {
            if (!kwargs) { jj_fail(c, DF_EINVAL, "TypeError: macro '%s' takes no keyword argument '%s'", d->s, kwn[k]); return NULL; }
            jv *kk = jv_strz(c, kwn[k]);
            if (!kk || jv_dict_set(c, kwargs, kk, kwv[k])) return NULL;
        }
    }
    for (int i = 0; i < np; i++) {
        jv *v = NULL;
        if (i < nargs) v = args[i];
        else {
            for (int k = 0; k < nkw; k++) if (!strcmp(d->names[i], kwn[k])) v = kwv[k];
            if (!v && d->list2[i]) { if (!(v = jj_eval(c, mf, d->list2[i]))) return NULL; }
            if (!v && !(v = jv_undef(c, "parameter '%s' was not provided", d->names[i]))) return NULL;
        }
        if (frame_set(c, mf, d->names[i], v)) return NULL;
    }
    if (d->op & JM_VARARGS) {
        int nv = nargs > np ? nargs - np : 0;
        jv *va = jv_list(c, JV_TUPLE, (size_t)nv);
        if (!va) return NULL;
        for (int i = 0; i < nv; i++) va->l.a[i] = args[np + i];
        if (frame_set(c, mf, "varargs", va)) return NULL;
    }
    if (kwargs && frame_set(c, mf, "kwargs", kwargs)) return NULL;
    c->depth++;
    jb buf = {0}, *saved = c->out;
    c->out = &buf;
    int st = exec_node(c, mf, d->a);
    c->out = saved;
    c->depth--;
    c->line = call_line;
    if (st == ST_ERR || c->rc) { free(buf.p); return NULL; }
    jv *r = jv_str(c, buf.p ? buf.p : "", buf.n);
    free(buf.p);
    return r;
}

jv *jj_call_value(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw) {
    switch (fn->t) {
    case JV_MACRO: return call_macro(c, fn->m, args, nargs, kwn, kwv, nkw);
    case JV_FUNC: case JV_METHOD: return jj_call_builtin(c, fn, args, nargs, kwn, kwv, nkw);
    case JV_UNDEF: return jj_undef_fail(c, fn);
    default:
        jj_fail(c, DF_EINVAL, "TypeError: '%s' object is not callable", jv_type_name(fn));
        return NULL;
    }
}

/* ----------------------------------------------------------------- render */

/* JJ_TOOL_ARGS_OBJECTS: messages[*].tool_calls[*](.function).arguments JSON-object strings -> objects */
static void tool_args_objects(jj_ctx *c, jv *vars) {
    jv *msgs = jv_dict_gets(vars, "messages");
    if (!msgs || msgs->t != JV_LIST) return;
    for (size_t i = 0; i < msgs->l.n; i++) {
        jv *m = msgs->l.a[i];
        jv *tcs = m->t == JV_DICT ? jv_dict_gets(m, "tool_calls") : NULL;
        if (!tcs || tcs->t != JV_LIST) continue;
        for (size_t k = 0; k < tcs->l.n; k++) {
            jv *tc = tcs->l.a[k];
            if (tc->t != JV_DICT) continue;
            jv *fn = jv_dict_gets(tc, "function");
            jv *target = fn && fn->t == JV_DICT ? fn : tc;
            jv *a = jv_dict_gets(target, "arguments");
            if (!a || a->t != JV_STR) continue;
            jj_ctx q = *c; /* a string that is not a JSON object stays a string */
            char qerr[64];
            q.rc = 0;
            q.err = qerr;
            q.errlen = sizeof qerr;
            jv *o = jv_json_parse(&q, a->s.p, a->s.n);
            if (!q.rc && o && o->t == JV_DICT) {
                jv *key = jv_strz(c, "arguments");
                if (!key || jv_dict_set(c, target, key, o)) return;
            }
        }
    }
}

int jj_render_json(const jj_template *t, const char *vars_json, size_t vars_len, char **out, size_t *out_len,
                   char *err, size_t errlen) {
    return jj_render_opts(t, vars_json, vars_len, 0, out, out_len, err, errlen);
}

int jj_render_opts(const jj_template *t, const char *vars_json, size_t vars_len, int opts, char **out,
                   size_t *out_len, char *err, size_t errlen) {
    *out = NULL;
    if (out_len) *out_len = 0;
    if (err && errlen) err[0] = 0;
    jj_arena arena = {.limit = RENDER_MEM_LIMIT};
    jb buf = {0};
    jj_ctx c = {.a = &arena, .out = &buf, .err = err, .errlen = errlen, .line = 1};
    jj_frame *root = frame_new(&c, NULL);
    c.root = root;
    jv *vars = root ? jv_json_parse(&c, vars_json, vars_len) : NULL;
    if (vars && vars->t != JV_DICT) jj_fail(&c, DF_EINVAL, "render variables must be a JSON object");
    if (!c.rc && vars && (opts & JJ_TOOL_ARGS_OBJECTS)) tool_args_objects(&c, vars);
    if (!c.rc && vars)
        for (size_t i = 0; i < vars->d.n; i++) {
            jv *k = vars->d.e[i].k;
            if (frame_set(&c, root, k->s.p, vars->d.e[i].v)) break;
        }
    if (!c.rc) exec_node(&c, root, t->root);
    if (!c.rc && arena.oom) jj_fail(&c, DF_ENOMEM, "out of memory");
    int rc = c.rc;
    ja_free(&arena);
    if (rc) { free(buf.p); return rc; }
    if (!buf.p) { buf.p = malloc(1); if (!buf.p) return DF_ENOMEM; buf.p[0] = 0; }
    *out = buf.p;
    if (out_len) *out_len = buf.n;
    return 0;
}
