/* jinja_int.h — the private data model of the Jinja subset (jinja_*.c):
 * arena, Python-like values, the template AST and the render context. */
#ifndef DF_JINJA_INT_H
#define DF_JINJA_INT_H

#include "jinja.h"
#include "deltafin.h"
#include <stdint.h>
#include <stddef.h>

/* ------------------------------------------------------------------ arena */

typedef struct jj_chunk jj_chunk;
typedef struct {
    jj_chunk *head;
    size_t total, limit;
    int oom;
} jj_arena;

void *ja_alloc(jj_arena *a, size_t n);            /* zeroed, 16-aligned; NULL when over the limit */
char *ja_strndup(jj_arena *a, const char *s, size_t n);
void ja_free(jj_arena *a);

/* growable byte buffer (malloc'd) */
typedef struct { char *p; size_t n, cap; } jb;
int jb_put(jb *b, const void *p, size_t n);
int jb_puts(jb *b, const char *s);
int jb_putc(jb *b, char c);

/* ----------------------------------------------------------------- values */

enum {
    JV_UNDEF, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_TUPLE, JV_DICT, JV_NS,
    JV_MACRO, JV_FUNC, JV_METHOD, JV_LOOP
};
enum { JV_F_SAFE = 1, JV_F_ITEMS = 2, JV_F_KEYS = 4, JV_F_VALUES = 8, JV_F_UNSAFE_ATTR = 16,
       JV_F_ITER = 32,      /* a Python generator / iterator (map, select, items, unique, reverse): one pass */
       JV_F_CONSUMED = 64,  /* ... already iterated */
       JV_F_RANGE = 128 };  /* a range object (prints as range(a, b)) */

typedef struct jv jv;
typedef struct { jv *k, *v; } jv_kv;
struct jj_macro;
struct jj_loop;

struct jv {
    uint8_t t, flags;
    union {
        int b;
        int64_t i;
        double f;
        struct { const char *p; size_t n; } s;      /* UTF-8 */
        struct { jv **a; size_t n; } l;            /* list, tuple */
        struct { jv_kv *e; size_t n, cap; } d;     /* dict (insertion order), namespace */
        struct { const char *msg; } u;             /* undefined: jinja2's hint */
        struct jj_macro *m;
        struct { int id; jv *self; const char *name; } fn; /* builtin function / bound method */
        struct jj_loop *loop;
    };
};

/* shared constants */
extern jv jv_undef_c, jv_none_c, jv_true_c, jv_false_c;

/* ------------------------------------------------------------------- AST */

enum {
    /* expressions */
    JN_CONST = 1, JN_NAME, JN_GETATTR, JN_GETITEM, JN_SLICE, JN_CALL, JN_FILTER, JN_TEST, JN_BINOP, JN_NEG,
    JN_POS, JN_NOT, JN_AND, JN_OR, JN_COMPARE, JN_COND, JN_LIST, JN_TUPLE, JN_DICT, JN_CONCAT,
    /* statements */
    JS_TEXT, JS_OUTPUT, JS_IF, JS_FOR, JS_SET, JS_SETATTR, JS_SETBLOCK, JS_MACRO, JS_BREAK, JS_CONTINUE, JS_WITH,
    JS_FILTERBLOCK, JS_BODY
};
enum { OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW };
enum { CMP_EQ = 1, CMP_NE, CMP_LT, CMP_LE, CMP_GT, CMP_GE, CMP_IN, CMP_NOTIN };

typedef struct jnode jnode;
struct jnode {
    int kind, line;
    int op;                 /* operator / filter or test id / macro flags / for: has filter */
    const char *s;          /* name, attribute, text */
    size_t sn;
    jv *cv;                 /* constant */
    jnode *a, *b, *c, *d;
    jnode **list;              /* args, items, body, compare operands */
    int n;
    jnode **list2;             /* kwarg values, dict values, else body, defaults */
    int n2;
    const char **names;     /* kwarg names, targets, macro params */
    int nnames;
    int *ops;               /* compare operators */
};

struct jj_template {
    jj_arena arena;
    jnode *root;               /* JS_BODY */
};

/* catch flags of a macro (jnode.op) */
enum { JM_VARARGS = 1, JM_KWARGS = 2, JM_CALLER = 4 };

/* ---------------------------------------------------------- render state */

typedef struct jj_frame jj_frame;
typedef struct { const char *name; jv *v; } jj_var;
struct jj_frame {
    jj_frame *parent;
    jj_var *vars;
    int n, cap;
};

struct jj_macro {
    const jnode *node;
    jj_frame *closure;
};

struct jj_loop {
    jv **items;
    int64_t n, i;
    int depth;
    jv *last_changed;
    int changed_set;
};

typedef struct {
    jj_arena *a;            /* per-render arena */
    jb *out;                /* current output */
    int rc;                 /* first error (0 = none) */
    char *err;
    size_t errlen;
    int line;               /* line of the node being evaluated */
    int depth;              /* macro recursion */
    jj_frame *root;
    int64_t steps;
} jj_ctx;

/* errors: set ctx->rc (first one wins) and a message prefixed with the line */
void jj_fail(jj_ctx *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------- value helpers */

jv *jv_new(jj_ctx *c, int t);
jv *jv_int(jj_ctx *c, int64_t i);
jv *jv_float(jj_ctx *c, double f);
jv *jv_bool(int b);
jv *jv_str(jj_ctx *c, const char *p, size_t n);       /* copies */
jv *jv_str_nocopy(jj_ctx *c, const char *p, size_t n); /* p lives in the arena already */
jv *jv_strz(jj_ctx *c, const char *s);
jv *jv_undef(jj_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv *jv_list(jj_ctx *c, int t, size_t n);               /* JV_LIST / JV_TUPLE with n NULL slots */
jv *jv_dict(jj_ctx *c, size_t cap);
int jv_dict_set(jj_ctx *c, jv *d, jv *k, jv *v);      /* replaces an equal key in place */
jv *jv_dict_get(const jv *d, const jv *k);            /* NULL when absent */
jv *jv_dict_gets(const jv *d, const char *k);

const char *jv_type_name(const jv *v);               /* Python type name: str, int, dict, ... */
int jv_truthy(const jv *v);
int jv_equal(const jv *a, const jv *b);
/* Python <: returns 0 or 1; -1 with an error set when not comparable */
int jv_less(jj_ctx *c, const jv *a, const jv *b);
int jv_is_number(const jv *v);                        /* int, float, bool */
double jv_num(const jv *v);

/* str() and repr() appended to b; 0 or an error rc (set on c) */
int jv_to_str(jj_ctx *c, const jv *v, jb *b);
int jv_repr(jj_ctx *c, const jv *v, jb *b);
jv *jv_as_str(jj_ctx *c, jv *v);                     /* str(v) as a value (v itself for strings) */
void py_float_repr(double v, jb *b);

/* json.dumps(v, ensure_ascii, indent (NULL = None), separators, sort_keys) */
typedef struct {
    int ensure_ascii, sort_keys;
    const char *indent; size_t indent_n; int has_indent;
    const char *item_sep, *key_sep;
} jj_json_opts;
int jv_json_dump(jj_ctx *c, const jv *v, const jj_json_opts *o, jb *b);
/* json.loads of text into values (Python semantics); NULL + error on failure */
jv *jv_json_parse(jj_ctx *c, const char *s, size_t n);

/* UTF-8 helpers (code points) */
size_t ju_len(const char *s, size_t n);
size_t ju_offset(const char *s, size_t n, size_t cp);  /* byte offset of code point cp */
int32_t ju_decode(const char *s, size_t n, size_t *adv);
int ju_encode(int32_t cp, char *out);
int ju_isspace(int32_t cp);

/* ------------------------------------------------------- eval and builtins */

jv *jj_eval(jj_ctx *c, jj_frame *f, const jnode *e);
/* l OP r for a comparison operator CMP_* (Python semantics): 1 or 0, -1 with c's error set. */
int jj_compare(jj_ctx *c, int op, jv *l, jv *r);
jv *jj_lookup(jj_ctx *c, jj_frame *f, const char *name);
jv *jj_getattr(jj_ctx *c, jv *obj, const char *name, size_t nlen);
jv *jj_getitem(jj_ctx *c, jv *obj, jv *key);
jv *jj_call_value(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw);
jv *jj_iterate(jj_ctx *c, jv *v);                       /* a list value of the items, or NULL + error */
jv *jj_undef_fail(jj_ctx *c, const jv *u);             /* raises UndefinedError for u; returns NULL */

/* filters and tests: ids resolved at parse time */
int jj_filter_id(const char *name, int *supported);
int jj_test_id(const char *name, int *supported);
jv *jj_apply_filter(jj_ctx *c, jj_frame *f, int id, const char *name, jv *v, jv **args, int nargs, const char **kwn,
                    jv **kwv, int nkw);
int jj_apply_test(jj_ctx *c, int id, const char *name, jv *v, jv **args, int nargs); /* 0/1, -1 error */

/* global functions (range, namespace, dict, raise_exception, strftime_now, ...) */
jv *jj_global(jj_ctx *c, const char *name);
jv *jj_method(jj_ctx *c, jv *obj, const char *name, size_t nlen, int *is_attr); /* bound method or NULL */
jv *jj_call_builtin(jj_ctx *c, jv *fn, jv **args, int nargs, const char **kwn, jv **kwv, int nkw);

/* binary operators shared by eval and filters */
jv *jj_binop(jj_ctx *c, int op, jv *a, jv *b);

/* ------------------------------------ helpers shared by builtins and filters */

typedef struct { const char *name; int id; } jj_mdef;  /* a name -> id table entry; tables end with NULL */
typedef struct { jv **v; size_t n, cap; } jj_vec;      /* growable array of values (malloc'd) */
enum { CASE_UPPER, CASE_LOWER, CASE_SWAP };            /* jj_case_map modes */

/* binds positional and keyword args to params (Python style); out[i] = NULL if not given; 0 or -1 */
int jj_bind(jj_ctx *c, const char *what, const char *const *params, int np, jv **args, int nargs,
            const char **kwn, jv **kwv, int nkw, jv **out, int allow_extra_pos);
/* 0 when v is a str, else -1 + TypeError */
int jj_need_str(jj_ctx *c, jv *v, const char *what);
/* int / bool into *out, else -1 + TypeError */
int jj_need_int(jj_ctx *c, jv *v, int64_t *out, const char *what);
/* b as a str value; frees b's buffer */
jv *jj_strval(jj_ctx *c, jb *b);
/* appends s to b HTML-escaped as markupsafe does (& < > " ') */
void jj_html_escape(const char *s, size_t n, jb *b);
/* fails with "integer arithmetic beyond 64 bits" (DF_EUNSUPPORTED); returns NULL */
jv *jj_overflow(jj_ctx *c);
/* str.strip(chars) (NULL / None: whitespace) on the left (1), right (2) or both sides (3) */
jv *jj_strip(jj_ctx *c, jv *s, jv *chars, int sides);
/* first occurrence of nd in h, or NULL */
const char *jj_memmem(const char *h, size_t hn, const char *nd, size_t nn);
/* last occurrence of nd in h, or NULL */
const char *jj_memrmem(const char *h, size_t hn, const char *nd, size_t nn);
/* a new list holding items[0..n) */
jv *jj_list_from(jj_ctx *c, jv **items, size_t n);
/* appends x; -1 if x is NULL or out of memory */
int jj_vec_push(jj_ctx *c, jj_vec *a, jv *x);
/* a's items as a list value; frees a's array */
jv *jj_vec_list(jj_ctx *c, jj_vec *a);
/* appends s to b case-mapped per code point (CASE_UPPER / CASE_LOWER / CASE_SWAP) */
void jj_case_map(const char *s, size_t n, int mode, jb *b);
/* appends Python's s.capitalize() to b */
void jj_py_capitalize(const char *s, size_t n, jb *b);
/* str.isdigit() .. isascii(): kind 1 digit 2 alpha 3 alnum 4 space 5 lower 6 upper 7 decimal 8 numeric 9 ascii */
int jj_str_pred(const jv *s, int kind);
/* str.splitlines(keepends) */
jv *jj_splitlines(jj_ctx *c, const char *p, size_t n, int keep);
/* Python %-formatting: fmt % args */
jv *jj_percent_format(jj_ctx *c, jv *fmt, jv *args);
/* dict d's items (0), keys (1) or values (2) as a list */
jv *jj_dict_view(jj_ctx *c, jv *d, int kind);

#endif
