/* chat_json.c — re-serialize JSON text exactly as Python's
 * json.dumps(x, ensure_ascii=False) does (separators ", " and ": ", key order
 * kept, ints as written, floats as repr()), which is what the `tojson` filter
 * of transformers' chat templates produces. Working on the raw text (not on
 * cJSON numbers) keeps 1 and 1.0 apart, as Python does. */
#include "tok_internal.h"
#include "jinja.h"
#include "util/util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ws(const char **p) { while (**p == ' ' || **p == '\t' || **p == '\n' || **p == '\r') (*p)++; }


static void put_cp_escaped(tok_buf *o, int32_t cp) {
    char tmp[8];
    switch (cp) {
    case '"': tok_buf_puts(o, "\\\""); return;
    case '\\': tok_buf_puts(o, "\\\\"); return;
    case '\n': tok_buf_puts(o, "\\n"); return;
    case '\r': tok_buf_puts(o, "\\r"); return;
    case '\t': tok_buf_puts(o, "\\t"); return;
    case '\b': tok_buf_puts(o, "\\b"); return;
    case '\f': tok_buf_puts(o, "\\f"); return;
    }
    if (cp < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", cp); tok_buf_puts(o, tmp); return; }
    int n = tok_utf8_encode(cp, tmp);
    tok_buf_put(o, tmp, n);
}

static int dump_string(const char **p, tok_buf *o) {
    const char *s = *p + 1;
    tok_buf_putc(o, '"');
    for (;;) {
        unsigned char c = (unsigned char)*s;
        if (!c) return -1;
        if (c == '"') { s++; break; }
        if (c == '\\') {
            char e = s[1];
            s += 2;
            switch (e) {
            case '"': put_cp_escaped(o, '"'); break;
            case '\\': put_cp_escaped(o, '\\'); break;
            case '/': put_cp_escaped(o, '/'); break;
            case 'b': put_cp_escaped(o, '\b'); break;
            case 'f': put_cp_escaped(o, '\f'); break;
            case 'n': put_cp_escaped(o, '\n'); break;
            case 'r': put_cp_escaped(o, '\r'); break;
            case 't': put_cp_escaped(o, '\t'); break;
            case 'u': {
                unsigned v, w;
                if (df_hex4(s, &v)) return -1;
                s += 4;
                if (v >= 0xD800 && v < 0xDC00 && s[0] == '\\' && s[1] == 'u' && !df_hex4(s + 2, &w) && w >= 0xDC00 && w < 0xE000) {
                    v = 0x10000 + ((v - 0xD800) << 10) + (w - 0xDC00);
                    s += 6;
                } else if (v >= 0xD800 && v < 0xE000) v = 0xFFFD;
                put_cp_escaped(o, (int32_t)v);
                break;
            }
            default: return -1;
            }
            continue;
        }
        int l = tok_utf8_valid_len((const uint8_t *)s, strlen(s));
        if (!l) return -1;
        put_cp_escaped(o, tok_utf8_decode((const uint8_t *)s, l));
        s += l;
    }
    tok_buf_putc(o, '"');
    *p = s;
    return 0;
}

/* Python repr() of a double. */
static void py_float(double v, tok_buf *o) {
    char t[64];
    tok_buf_put(o, t, jj_py_float_repr(v, t));
}

static int dump_value(const char **p, tok_buf *o, int depth) {
    if (depth > 200) return -1;
    ws(p);
    const char *s = *p;
    if (*s == '"') return dump_string(p, o);
    if (*s == '{' || *s == '[') {
        char close = *s == '{' ? '}' : ']';
        int obj = *s == '{';
        tok_buf_putc(o, *s);
        s++;
        *p = s;
        ws(p);
        if (**p == close) { (*p)++; tok_buf_putc(o, close); return 0; }
        for (;;) {
            if (obj) {
                ws(p);
                if (**p != '"' || dump_string(p, o)) return -1;
                ws(p);
                if (**p != ':') return -1;
                (*p)++;
                tok_buf_puts(o, ": ");
            }
            if (dump_value(p, o, depth + 1)) return -1;
            ws(p);
            if (**p == ',') { (*p)++; tok_buf_puts(o, ", "); continue; }
            if (**p == close) { (*p)++; tok_buf_putc(o, close); return 0; }
            return -1;
        }
    }
    if (!strncmp(s, "true", 4)) { tok_buf_puts(o, "true"); *p = s + 4; return 0; }
    if (!strncmp(s, "false", 5)) { tok_buf_puts(o, "false"); *p = s + 5; return 0; }
    if (!strncmp(s, "null", 4)) { tok_buf_puts(o, "null"); *p = s + 4; return 0; }
    if (*s == '-' || (*s >= '0' && *s <= '9')) {
        const char *e = s;
        int is_float = 0;
        if (*e == '-') e++;
        while ((*e >= '0' && *e <= '9') || *e == '.' || *e == 'e' || *e == 'E' || *e == '+' || *e == '-') {
            if (*e == '.' || *e == 'e' || *e == 'E') is_float = 1;
            e++;
        }
        if (is_float) py_float(strtod(s, NULL), o);
        else {
            const char *q = s;
            int neg = *q == '-';
            if (neg) q++;
            while (*q == '0' && q + 1 < e) q++;
            if (neg && !(e - q == 1 && *q == '0')) tok_buf_putc(o, '-');
            tok_buf_put(o, q, (size_t)(e - q));
        }
        *p = e;
        return 0;
    }
    return -1;
}

int tok_py_json_dump(const char *json, tok_buf *out) {
    const char *p = json;
    if (dump_value(&p, out, 0)) return DF_EINVAL;
    ws(&p);
    return *p ? DF_EINVAL : 0;
}

int tok_py_json_dump_items(const char *json, tok_buf **items, int *n) {
    const char *p = json;
    *items = NULL; *n = 0;
    ws(&p);
    if (*p != '[') return DF_EINVAL;
    p++;
    ws(&p);
    if (*p == ']') return 0;
    int cap = 0;
    for (;;) {
        if (*n == cap) {
            cap = cap ? cap * 2 : 8;
            tok_buf *ni = realloc(*items, cap * sizeof *ni);
            if (!ni) return DF_ENOMEM;
            *items = ni;
        }
        memset(&(*items)[*n], 0, sizeof(tok_buf));
        if (dump_value(&p, &(*items)[*n], 0)) { (*n)++; return DF_EINVAL; }
        (*n)++;
        ws(&p);
        if (*p == ',') { p++; continue; }
        if (*p == ']') return 0;
        return DF_EINVAL;
    }
}
