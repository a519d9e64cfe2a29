/* tok_tiktoken.c — load a tiktoken rank file (one "base64(bytes) rank" per
 * line, as Kimi's tiktoken.model and tiktoken's *.tiktoken files) plus its
 * special tokens and split pattern.
 *
 * Specials: 256 ids follow the base ranks (Kimi: 163584..163839). Names come
 * from tokenizer_config.json's added_tokens_decoder when given, else Kimi's
 * table (shared/notes/tokenizers.md); unnamed ids are <|reserved_token_{id}|>.
 * Pattern: tokenizer_config.json "pat_str" (a deltafin extension, used for
 * o200k tests) or Kimi's pattern (tokenization_kimi.py), in which case Kimi's
 * slicing of long inputs is applied too. */
#include "tok_internal.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *tok_slurp(const char *path, size_t *len, char *err, size_t errlen);

/* \p{Han} here is the Han *script* (Script=Han, as the Rust regex crate behind
 * tiktoken reads a bare script name), not Script_Extensions: U+3002 "。" is
 * Common and splits from the ideographs before it (tok_regex.c rewrites it). */
const char *const tok_kimi_pattern =
    "[\\p{Han}]+"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    "|\\p{N}{1,3}"
    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
    "|\\s*[\\r\\n]+"
    "|\\s+(?!\\S)"
    "|\\s+";

static const struct { int off; const char *name; } kimi_named[] = {
    {0, "[BOS]"}, {1, "[EOS]"}, {2, "<|im_end|>"}, {3, "<|im_user|>"}, {4, "<|im_assistant|>"},
    {6, "<|start_header_id|>"}, {7, "<|end_header_id|>"}, {9, "[EOT]"}, {10, "<|im_system|>"},
    {11, "<|tool_calls_section_begin|>"}, {12, "<|tool_calls_section_end|>"}, {13, "<|tool_call_begin|>"},
    {14, "<|tool_call_argument_begin|>"}, {15, "<|tool_call_end|>"}, {17, "<|im_middle|>"},
    {254, "[UNK]"}, {255, "[PAD]"},
};

static int b64val(int c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
}

/* Decode base64 s[0..n) into out; returns length or -1. */
static int b64dec(const char *s, size_t n, uint8_t *out, size_t cap) {
    uint32_t acc = 0;
    int bits = 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '=') break;
        int v = b64val((uint8_t)s[i]);
        if (v < 0) return -1;
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (k >= cap) return -1;
            out[k++] = (uint8_t)(acc >> bits);
        }
    }
    return (int)k;
}

static int add_special(df_tokenizer *t, int32_t id, const char *name, int special) {
    tok_added *na = realloc(t->added, ((size_t)t->n_added + 1) * sizeof *na);
    if (!na) return DF_ENOMEM;
    t->added = na;
    tok_added *a = &t->added[t->n_added++];
    memset(a, 0, sizeof *a);
    a->content = strdup(name);
    a->len = strlen(name);
    a->id = id;
    a->special = special;
    return tok_set_token(t, id, name, a->len, TOK_F_ADDED | (special ? TOK_F_SPECIAL : 0));
}

int tok_load_tiktoken(df_tokenizer *t, const char *path, const char *config_path, char *err, size_t errlen) {
    size_t len;
    char *txt = tok_slurp(path, &len, err, errlen);
    if (!txt) return DF_EIO;
    t->kind = TOK_KIND_TIKTOKEN;
    t->byte_level = 1;
    t->ignore_merges = 1;
    t->decoder = TOK_DEC_RAW;
    t->unk_id = -1;
    tok_map_init(&t->vocab, 1 << 18);
    int rc = 0;
    size_t i = 0;
    int line = 0;
    uint8_t buf[1024];
    while (i < len) {
        size_t e = i;
        while (e < len && txt[e] != '\n') e++;
        line++;
        size_t le = e;
        if (le > i && txt[le - 1] == '\r') le--;
        if (le > i) {
            size_t sp = i;
            while (sp < le && txt[sp] != ' ') sp++;
            char *endp = NULL;
            long rank = sp < le ? strtol(txt + sp + 1, &endp, 10) : -1;
            int bl = sp < le ? b64dec(txt + i, sp - i, buf, sizeof buf) : -1;
            if (bl <= 0 || rank < 0 || rank > 0x7fffffff) {
                tok_err(err, errlen, "%s:%d: expected \"base64 rank\" (a tiktoken rank file)", path, line);
                free(txt);
                return DF_EFORMAT;
            }
            if ((rc = tok_map_put(&t->vocab, buf, (size_t)bl, (int32_t)rank)) ||
                (rc = tok_set_token(t, (int32_t)rank, buf, (size_t)bl, 0))) { free(txt); return rc; }
        }
        i = e + 1;
    }
    free(txt);
    if (t->vocab.n == 0) { tok_err(err, errlen, "%s: no ranks found (empty tiktoken file?)", path); return DF_EFORMAT; }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        t->byte_id[b] = tok_map_get(&t->vocab, &c, 1);
        if (t->byte_id[b] < 0) {
            tok_err(err, errlen, "%s: byte 0x%02x has no rank; a byte-level tiktoken file must rank all 256 bytes", path, b);
            return DF_EFORMAT;
        }
    }
    if ((rc = tok_bpe_pairs_from_ranks(t))) return rc;

    int32_t base = (int32_t)t->vocab.n;
    cJSON *cfg = NULL;
    if (config_path) {
        char *c = tok_slurp(config_path, &len, err, errlen);
        if (!c) return DF_EIO;
        cfg = cJSON_ParseWithLength(c, len);
        free(c);
        if (!cfg) { tok_err(err, errlen, "%s: not valid JSON (expected tokenizer_config.json)", config_path); return DF_EFORMAT; }
    }
    const cJSON *atd = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "added_tokens_decoder") : NULL;
    const cJSON *pat = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "pat_str") : NULL;
    int n_specials = 256;
    const cJSON *nsj = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "num_reserved_special_tokens") : NULL;
    if (cJSON_IsNumber(nsj)) n_specials = (int)nsj->valuedouble;
    for (int k = 0; k < n_specials && !rc; k++) {
        int32_t id = base + k;
        char name[64];
        const char *nm = NULL;
        int special = 1;
        if (atd) {
            char key[16];
            snprintf(key, sizeof key, "%d", id);
            const cJSON *ent = cJSON_GetObjectItemCaseSensitive(atd, key);
            const cJSON *ct = ent ? cJSON_GetObjectItemCaseSensitive(ent, "content") : NULL;
            if (cJSON_IsString(ct)) nm = ct->valuestring;
            const cJSON *sp = ent ? cJSON_GetObjectItemCaseSensitive(ent, "special") : NULL;
            if (cJSON_IsBool(sp)) special = cJSON_IsTrue(sp);
        } else {
            for (size_t q = 0; q < sizeof kimi_named / sizeof kimi_named[0]; q++)
                if (kimi_named[q].off == k) nm = kimi_named[q].name;
        }
        if (!nm) { snprintf(name, sizeof name, "<|reserved_token_%d|>", id); nm = name; }
        rc = add_special(t, id, nm, special);
    }
    /* added_tokens_decoder entries outside the reserved range (other files) */
    if (atd && !rc) {
        const cJSON *ent;
        cJSON_ArrayForEach(ent, atd) {
            long id = strtol(ent->string, NULL, 10);
            if (id >= base && id < base + n_specials) continue;
            if (id < 0 || id > 0x7fffffff) continue;
            const cJSON *ct = cJSON_GetObjectItemCaseSensitive(ent, "content");
            const cJSON *sp = cJSON_GetObjectItemCaseSensitive(ent, "special");
            if (cJSON_IsString(ct) && (rc = add_special(t, (int32_t)id, ct->valuestring, !cJSON_IsFalse(sp)))) break;
        }
    }
    if (!rc) {
        const char *p = cJSON_IsString(pat) ? pat->valuestring : tok_kimi_pattern;
        t->tt_kimi_slicing = !cJSON_IsString(pat);
        char what[600];
        snprintf(what, sizeof what, "%s: split pattern", cJSON_IsString(pat) ? config_path : path);
        rc = tok_regex_compile(&t->tt_re, p, what, err, errlen);
    }
    cJSON_Delete(cfg);
    return rc;
}
