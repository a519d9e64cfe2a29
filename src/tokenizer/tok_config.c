/* tok_config.c — what tokenizer_config.json adds to a tokenizer: BOS/EOS
 * strings and ids, the special tokens a chat template sees (transformers'
 * special_tokens_map), and the chat template itself: chat_template.jinja
 * beside the config (it takes priority, as in transformers) or the config's
 * "chat_template" (a string, or a list whose "default" entry is used). The
 * template is parsed once here (jinja_*.c); one outside the supported Jinja
 * subset is kept as refused, with the reason, and reported when a chat is
 * rendered. Without a template the hand-written format of the model family
 * (chat.c), detected from the special tokens, is the fallback. */
#include "tok_internal.h"
#include "jinja.h"
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

/* "<dir of path>/name" */
static void sibling(const char *path, const char *name, char *out, size_t cap) {
    snprintf(out, cap, "%s", path);
    char *sl = strrchr(out, '/');
    size_t dl = sl ? (size_t)(sl - out + 1) : 0;
    snprintf(out + dl, cap - dl, "%s", name);
}

/* transformers' special_tokens_map as JSON members: the set ones of
 * bos/eos/unk/sep/pad/cls/mask_token, and additional_special_tokens */
static void special_tokens_json(df_tokenizer *t, const cJSON *cfg) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                       "mask_token"};
    cJSON *o = cJSON_CreateObject();
    if (!o) return;
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const char *v = cfg ? tok_str_of(cJSON_GetObjectItemCaseSensitive(cfg, keys[i])) : NULL;
        if (!v && i == 0) v = t->bos_str;
        if (!v && i == 1) v = t->eos_str;
        if (v && *v) cJSON_AddStringToObject(o, keys[i], v);
    }
    const cJSON *extra = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "additional_special_tokens") : NULL;
    if (cJSON_IsArray(extra) && cJSON_GetArraySize(extra) > 0) {
        cJSON *l = cJSON_AddArrayToObject(o, "additional_special_tokens");
        const cJSON *x;
        cJSON_ArrayForEach(x, extra) {
            const char *s = tok_str_of(x);
            if (s) cJSON_AddItemToArray(l, cJSON_CreateString(s));
        }
    }
    char *txt = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!txt) return;
    size_t n = strlen(txt);
    if (n >= 2) { /* strip the braces: members are spliced into the render variables */
        memmove(txt, txt + 1, n - 2);
        txt[n - 2] = 0;
    }
    t->chat_vars = txt;
}

int tok_apply_config(df_tokenizer *t, const char *config_path, char *err, size_t errlen) {
    cJSON *cfg = NULL;
    const char *tmpl = NULL;
    char from[4096] = "";
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
        if (tmpl) snprintf(from, sizeof from, "%s (chat_template)", config_path);
    }
    /* chat_template.jinja beside the config (or the tokenizer file) takes priority, as in transformers */
    char jpath[4096];
    sibling(config_path ? config_path : t->path, "chat_template.jinja", jpath, sizeof jpath);
    if (access(jpath, R_OK) == 0) {
        size_t jl;
        char *jt = tok_slurp(jpath, &jl, err, errlen);
        if (!jt) { cJSON_Delete(cfg); return DF_EIO; }
        t->chat_template = jt;
        snprintf(from, sizeof from, "%s", jpath);
    } else if (tmpl) t->chat_template = strdup(tmpl);
    if (t->kind == TOK_KIND_TIKTOKEN) {
        if (!t->bos_str && df_tokenizer_token_id(t, "[BOS]") >= 0) t->bos_str = strdup("[BOS]");
        if (!t->eos_str && df_tokenizer_token_id(t, "[EOS]") >= 0) t->eos_str = strdup("[EOS]");
    }
    t->bos_id = t->bos_str ? df_tokenizer_token_id(t, t->bos_str) : -1;
    t->eos_id = t->eos_str ? df_tokenizer_token_id(t, t->eos_str) : -1;
    tok_detect_chat(t, t->chat_template);
    special_tokens_json(t, cfg);
    cJSON_Delete(cfg);
    if (t->chat_template) {
        t->chat_template_from = strdup(from);
        char perr[512] = "";
        t->jj_rc = jj_parse(t->chat_template, strlen(t->chat_template), &t->jj, perr, sizeof perr);
        if (t->jj_rc == DF_ENOMEM) return DF_ENOMEM;
        if (t->jj_rc) t->jj_err = strdup(perr);
    }
    return 0;
}
