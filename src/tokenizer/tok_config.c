/* tok_config.c — what tokenizer_config.json adds to a tokenizer: BOS/EOS
 * strings and ids, and which chat format the model uses (from its
 * chat_template text, a chat_template.jinja beside it, or its special tokens;
 * no Jinja engine: each family's format is implemented in chat_*.c). */
#include "tok_internal.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *tok_slurp(const char *path, size_t *len, char *err, size_t errlen);

static const char *tok_str_of(const cJSON *v) {
    if (cJSON_IsString(v)) return v->valuestring;
    if (cJSON_IsObject(v)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(v, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

void tok_detect_chat(df_tokenizer *t, const char *tmpl) {
    if (tmpl && *tmpl) {
        if (strstr(tmpl, "<|im_middle|>")) { t->chat = TOK_CHAT_KIMI; return; }
        if (strstr(tmpl, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>")) { t->chat = TOK_CHAT_DEEPSEEK; return; }
        if (strstr(tmpl, "<|im_start|>")) { t->chat = TOK_CHAT_QWEN3; return; }
        if (strstr(tmpl, "<|channel|>") || strstr(tmpl, "<|start|>")) { t->chat = TOK_CHAT_HARMONY; return; }
    }
    if (df_tokenizer_token_id(t, "<|im_middle|>") >= 0) t->chat = TOK_CHAT_KIMI;
    else if (df_tokenizer_token_id(t, "<\xef\xbd\x9c" "Assistant\xef\xbd\x9c>") >= 0) t->chat = TOK_CHAT_DEEPSEEK;
    else if (df_tokenizer_token_id(t, "<|im_start|>") >= 0) t->chat = TOK_CHAT_QWEN3;
    else if (df_tokenizer_token_id(t, "<|channel|>") >= 0) t->chat = TOK_CHAT_HARMONY;
    else t->chat = TOK_CHAT_NONE;
}

int tok_apply_config(df_tokenizer *t, const char *config_path, char *err, size_t errlen) {
    cJSON *cfg = NULL;
    char *tmpl_own = NULL;
    const char *tmpl = NULL;
    if (config_path) {
        size_t len;
        char *c = tok_slurp(config_path, &len, err, errlen);
        if (!c) return DF_EIO;
        cfg = cJSON_ParseWithLength(c, len);
        free(c);
        if (!cfg) { tok_err(err, errlen, "%s: not valid JSON (expected tokenizer_config.json)", config_path); return DF_EFORMAT; }
        const char *b = tok_str_of(cJSON_GetObjectItemCaseSensitive(cfg, "bos_token"));
        const char *e = tok_str_of(cJSON_GetObjectItemCaseSensitive(cfg, "eos_token"));
        if (b) t->bos_str = strdup(b);
        t->add_bos = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token"));
        if (e) t->eos_str = strdup(e);
        const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
        if (cJSON_IsString(ct)) tmpl = ct->valuestring;
        else if (cJSON_IsArray(ct)) {
            const cJSON *x;
            cJSON_ArrayForEach(x, ct) {
                const char *nm = tok_str_of(cJSON_GetObjectItemCaseSensitive(x, "name"));
                const cJSON *tt = cJSON_GetObjectItemCaseSensitive(x, "template");
                if (nm && !strcmp(nm, "default") && cJSON_IsString(tt)) tmpl = tt->valuestring;
            }
        }
        if (!tmpl) { /* chat_template.jinja beside the config (transformers >= 4.43) */
            char p[4096];
            snprintf(p, sizeof p, "%s", config_path);
            char *sl = strrchr(p, '/');
            size_t dl = sl ? (size_t)(sl - p + 1) : 0;
            snprintf(p + dl, sizeof p - dl, "chat_template.jinja");
            if (access(p, R_OK) == 0) tmpl = tmpl_own = tok_slurp(p, NULL, NULL, 0);
        }
    }
    if (t->kind == TOK_KIND_TIKTOKEN) {
        if (!t->bos_str && df_tokenizer_token_id(t, "[BOS]") >= 0) t->bos_str = strdup("[BOS]");
        if (!t->eos_str && df_tokenizer_token_id(t, "[EOS]") >= 0) t->eos_str = strdup("[EOS]");
    }
    t->bos_id = t->bos_str ? df_tokenizer_token_id(t, t->bos_str) : -1;
    t->eos_id = t->eos_str ? df_tokenizer_token_id(t, t->eos_str) : -1;
    tok_detect_chat(t, tmpl);
    free(tmpl_own);
    cJSON_Delete(cfg);
    return 0;
}
