/* api.c — public tokenizer API (stubs until the tokenizer lands). */
#include "deltafin.h"
#include <stdio.h>

static int stub(char *err, size_t errlen, const char *fn) {
    if (err && errlen) snprintf(err, errlen, "%s: not implemented yet", fn);
    return DF_EUNSUPPORTED;
}
int df_tokenizer_open(df_tokenizer **out, const char *path, const char *config_path, char *err, size_t errlen) { *out = NULL; return stub(err, errlen, "df_tokenizer_open"); }
void df_tokenizer_free(df_tokenizer *t) {}
int df_tokenize(const df_tokenizer *t, const char *text, size_t len, int flags, int32_t **ids_out, size_t *n_out, char *err, size_t errlen) { return stub(err, errlen, "df_tokenize"); }
int df_detokenize(const df_tokenizer *t, const int32_t *ids, size_t n, char **text_out, size_t *len_out, char *err, size_t errlen) { return stub(err, errlen, "df_detokenize"); }
int df_tokenizer_n_vocab(const df_tokenizer *t) { return 0; }
int32_t df_tokenizer_token_id(const df_tokenizer *t, const char *token) { return -1; }
int df_tokenizer_stop_ids(const df_tokenizer *t, int32_t *ids, int cap) { return 0; }
df_detok *df_detok_new(const df_tokenizer *t) { return NULL; }
int df_detok_push(df_detok *d, int32_t id, char *out, size_t cap) { return -1; }
int df_detok_flush(df_detok *d, char *out, size_t cap) { return 0; }
void df_detok_free(df_detok *d) {}
int df_chat_render(const df_tokenizer *t, const char *m, const char *tools, int flags, char **text_out, char *err, size_t errlen) { return stub(err, errlen, "df_chat_render"); }
