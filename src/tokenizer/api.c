/* api.c — the public tokenizer API of include/deltafin.h: open (model dir,
 * tokenizer.json or tiktoken rank file), encode, decode, token lookup, stop
 * ids, the streaming UTF-8-safe decoder and chat rendering (chat.c: the
 * model's own Jinja template when it ships one). */
#include "tok_internal.h"
#include "jinja.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *tok_slurp(const char *path, size_t *len, char *err, size_t errlen);

static int file_exists(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* Is `path` JSON, to be read as a tokenizer.json rather than a tiktoken rank file: named *.json, or its first non-space
 * byte opens a JSON object, array or string ('{', '[', '"': none of them starts a base64 token of a rank file)? */
static int looks_json(const char *path) {
    const size_t n = strlen(path);
    if (n >= 5 && !strcmp(path + n - 5, ".json")) return 1;
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int c;
    while ((c = fgetc(f)) == ' ' || c == '\n' || c == '\r' || c == '\t') {}
    fclose(f);
    return c == '{' || c == '[' || c == '"';
}

int df_tokenizer_open(df_tokenizer **out, const char *path, const char *config_path, char *err, size_t errlen) {
    *out = NULL;
    if (!path) { tok_err(err, errlen, "df_tokenizer_open: no path given"); return DF_EINVAL; }
    struct stat st;
    if (stat(path, &st) != 0) { tok_err(err, errlen, "tokenizer %s: no such file or directory", path); return DF_EIO; }
    char file[4096], cfg[4096];
    cfg[0] = 0;
    int tiktoken = 0;
    if (S_ISDIR(st.st_mode)) {
        snprintf(file, sizeof file, "%s/tokenizer.json", path);
        if (!file_exists(file)) {
            snprintf(file, sizeof file, "%s/tiktoken.model", path);
            if (!file_exists(file)) {
                tok_err(err, errlen, "%s: no tokenizer.json or tiktoken.model in this directory", path);
                return DF_EIO;
            }
            tiktoken = 1;
        }
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", path);
    } else {
        snprintf(file, sizeof file, "%s", path);
        tiktoken = !looks_json(path);
        snprintf(cfg, sizeof cfg, "%s", path);
        char *sl = strrchr(cfg, '/');
        size_t dl = sl ? (size_t)(sl - cfg + 1) : 0;
        snprintf(cfg + dl, sizeof cfg - dl, "tokenizer_config.json");
    }
    const char *cp = config_path;
    if (!cp && file_exists(cfg)) cp = cfg;
    if (config_path && !file_exists(config_path)) {
        tok_err(err, errlen, "tokenizer config %s: no such file", config_path);
        return DF_EIO;
    }
    df_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return DF_ENOMEM;
    t->path = strdup(file);
    t->bos_id = t->eos_id = t->unk_id = -1;
    int rc = tiktoken ? tok_load_tiktoken(t, file, cp, err, errlen) : tok_load_hf(t, file, err, errlen);
    if (!rc) rc = tok_build_added_index(t);
    if (!rc) rc = tok_apply_config(t, cp, err, errlen);
    if (rc) { df_tokenizer_free(t); return rc; }
    *out = t;
    return 0;
}

void df_tokenizer_free(df_tokenizer *t) {
    if (!t) return;
    free(t->pool); free(t->tok_off); free(t->tok_len); free(t->tok_flags);
    tok_map_free(&t->vocab);
    tok_pairs_free(&t->pairs);
    for (int i = 0; i < t->n_norms; i++) { free(t->norms[i].a); free(t->norms[i].b); }
    free(t->norms);
    for (int i = 0; i < t->n_pretoks; i++) tok_regex_free(&t->pretoks[i].re);
    free(t->pretoks);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    tok_map_free(&t->added_map);
    free(t->added_lens);
    tok_regex_free(&t->tt_re);
    free(t->bos_str); free(t->eos_str); free(t->path);
    free(t->chat_template); free(t->chat_template_from); free(t->jj_err); free(t->chat_vars);
    jj_free(t->jj);
    free(t);
}

int df_tokenize(const df_tokenizer *t, const char *text, size_t len, int flags,
                int32_t **ids_out, size_t *n_out, char *err, size_t errlen) {
    *ids_out = NULL; *n_out = 0;
    if (!t || (!text && len)) { tok_err(err, errlen, "df_tokenize: no tokenizer or text"); return DF_EINVAL; }
    tok_ids ids = {0};
    int rc = tok_encode(t, text ? text : "", len, flags, &ids, err, errlen);
    if (rc) { free(ids.v); return rc; }
    if (!ids.v) ids.v = malloc(sizeof(int32_t));
    *ids_out = ids.v;
    *n_out = ids.n;
    return 0;
}

int df_detokenize(const df_tokenizer *t, const int32_t *ids, size_t n, char **text_out, size_t *len_out,
                  char *err, size_t errlen) {
    *text_out = NULL;
    if (len_out) *len_out = 0;
    tok_buf b = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_vocab || !(t->tok_flags[id] & TOK_F_PRESENT)) {
            tok_err(err, errlen, "token id %d at position %zu is not in the vocabulary (size %d)",
                    id, i, t->n_vocab);
            free(b.p);
            return DF_EINVAL;
        }
        if (tok_buf_put(&b, t->pool + t->tok_off[id], t->tok_len[id])) { free(b.p); return DF_ENOMEM; }
    }
    size_t ol;
    char *o = tok_utf8_sanitize(b.p ? b.p : "", b.n, &ol);
    free(b.p);
    if (!o) return DF_ENOMEM;
    *text_out = o;
    if (len_out) *len_out = ol;
    return 0;
}

int df_tokenizer_n_vocab(const df_tokenizer *t) { return t ? t->n_vocab : 0; }

int32_t df_tokenizer_token_id(const df_tokenizer *t, const char *token) {
    if (!t || !token) return -1;
    size_t n = strlen(token);
    int32_t ai = tok_map_get(&t->added_map, token, n);
    if (ai >= 0) return t->added[ai].id;
    if (t->byte_level && t->kind == TOK_KIND_HF) {
        tok_buf b = {0};
        int32_t id = -1;
        if (tok_bytelevel_decode_str(token, n, &b) == 0) id = tok_map_get(&t->vocab, b.p ? b.p : "", b.n);
        free(b.p);
        if (id >= 0) return id;
    }
    return tok_map_get(&t->vocab, token, n);
}

int df_tokenizer_stop_ids(const df_tokenizer *t, int32_t *ids, int cap) {
    static const char *const names[] = {
        "<|im_end|>", "<|endoftext|>", "<|return|>", "<|call|>", "<|eot_id|>", "[EOS]", "<|end_of_msg|>",
        "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>",
    };
    int n = 0;
    if (t->eos_id >= 0 && n < cap) ids[n++] = t->eos_id;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = df_tokenizer_token_id(t, names[i]);
        if (id < 0) continue;
        int dup = 0;
        for (int k = 0; k < n; k++) dup |= ids[k] == id;
        if (!dup && n < cap) ids[n++] = id;
    }
    return n;
}

/* ------------------------------------------------------ streaming decode */

struct df_detok {
    const df_tokenizer *t;
    tok_buf pend;
};

df_detok *df_detok_new(const df_tokenizer *t) {
    if (!t) return NULL;
    df_detok *d = calloc(1, sizeof *d);
    if (d) d->t = t;
    return d;
}

void df_detok_free(df_detok *d) {
    if (!d) return;
    free(d->pend.p);
    free(d);
}

/* Emit complete characters of pend; keep a trailing incomplete sequence
 * unless `final`. Ill-formed bytes become U+FFFD. */
static int detok_drain(df_detok *d, char *out, size_t cap, int final) {
    const uint8_t *u = (const uint8_t *)d->pend.p;
    size_t n = d->pend.n, i = 0, k = 0;
    while (i < n) {
        int l = u[i] < 0x80 ? 1 : tok_utf8_valid_len(u + i, n - i);
        if (l) {
            if (k + l > cap) return DF_EINVAL;
            memcpy(out + k, u + i, l); k += l; i += l;
            continue;
        }
        int bl = tok_utf8_bad_len(u + i, n - i);
        if (!final && i + bl == n && u[i] >= 0xC2 && u[i] <= 0xF4) break; /* may still complete */
        if (k + 3 > cap) return DF_EINVAL;
        memcpy(out + k, "\xEF\xBF\xBD", 3); k += 3; i += bl;
    }
    memmove(d->pend.p, d->pend.p + i, n - i);
    d->pend.n = n - i;
    return (int)k;
}

int df_detok_push(df_detok *d, int32_t id, char *out, size_t cap) {
    if (!d) return DF_EINVAL;
    const df_tokenizer *t = d->t;
    if (id < 0 || id >= t->n_vocab || !(t->tok_flags[id] & TOK_F_PRESENT)) return DF_EINVAL;
    if (tok_buf_put(&d->pend, t->pool + t->tok_off[id], t->tok_len[id])) return DF_ENOMEM;
    return detok_drain(d, out, cap, 0);
}

int df_detok_flush(df_detok *d, char *out, size_t cap) {
    if (!d) return DF_EINVAL;
    if (!d->pend.n) return 0;
    return detok_drain(d, out, cap, 1);
}

int df_chat_render(const df_tokenizer *t, const char *messages_json, const char *tools_json, int flags,
                   char **text_out, char *err, size_t errlen) {
    *text_out = NULL;
    if (!t || !messages_json) { tok_err(err, errlen, "df_chat_render: no tokenizer or messages"); return DF_EINVAL; }
    /* default (neither thinking flag): the template decides, as transformers' apply_chat_template */
    if ((flags & DF_CHAT_THINKING) && (flags & DF_CHAT_NO_THINKING)) {
        tok_err(err, errlen, "df_chat_render: DF_CHAT_THINKING and DF_CHAT_NO_THINKING together");
        return DF_EINVAL;
    }
    return tok_chat_render(t, messages_json, tools_json, flags, text_out, err, errlen);
}

int df_token_bytes(const df_tokenizer *t, int32_t id, const char **bytes, size_t *len) {
    if (!t || !bytes || !len || id < 0 || id >= t->n_vocab || !(t->tok_flags[id] & TOK_F_PRESENT)) return DF_EINVAL;
    *bytes = t->pool + t->tok_off[id];
    *len = t->tok_len[id];
    return 0;
}
