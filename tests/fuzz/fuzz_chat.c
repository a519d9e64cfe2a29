/*
 * fuzz_chat.c — the chat template interpreter (src/tokenizer/jinja_*.c, chat.c) rendering the embedded
 * kimi-mini's template over any message list: the input is the messages JSON, and after a NUL byte the tools JSON.
 * df_chat_render must render or refuse with a message, never crash or hang; a rendering is then tokenized with
 * special tokens parsed, as the server does.
 */
#include "fuzz.h"
#include "deltafin.h"

#include <string.h>

static df_tokenizer *tok;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    char err[512];
    if (!tok) {
        char path[4096];
        snprintf(path, sizeof path, "%s/models/kimi-mini", fuzz_src());
        if (df_tokenizer_open(&tok, path, NULL, err, sizeof err)) {
            fprintf(stderr, "fuzz_chat: %s (run from the source tree, or set DF_SRC)\n", err);
            exit(1);
        }
    }
    char *s = malloc(n + 1);
    if (!s) return 0;
    memcpy(s, data, n);
    s[n] = 0;
    const size_t ml = strlen(s);
    const char *tools = ml < n ? s + ml + 1 : NULL;
    char *text = NULL;
    err[0] = 0;
    const int rc = df_chat_render(tok, s, tools, 0, &text, err, sizeof err);
    FUZZ_ASSERT(rc == 0 ? text != NULL : err[0] != 0, "df_chat_render returned %d with %s", rc, rc ? "no message" : "no text");
    if (rc == 0) {
        int32_t *ids = NULL;
        size_t ni = 0;
        if (df_tokenize(tok, text, strlen(text), DF_TOK_PARSE_SPECIAL, &ids, &ni, err, sizeof err) == 0) free(ids);
    }
    free(text);
    free(s);
    return 0;
}
