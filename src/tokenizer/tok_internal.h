/* tok_internal.h — the tokenizer's private data model, shared by the files of
 * src/tokenizer/: the loaded vocabulary (id <-> bytes), BPE merge table,
 * normalizer and pre-tokenizer pipeline, added/special tokens, and the chat
 * format chosen from the model's files. Nothing here is public API. */
#ifndef DF_TOK_INTERNAL_H
#define DF_TOK_INTERNAL_H

#include "deltafin.h"
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* ---------------------------------------------------------------- hashing */

uint64_t tok_hash_bytes(const void *p, size_t n);

/* Open-addressing map: byte string -> int32 value. Keys are copied into an
 * internal arena. */
typedef struct {
    uint32_t *slots;  /* index+1 into entries, 0 = empty */
    size_t cap;       /* power of two */
    size_t n;
    struct tok_map_ent { uint64_t h; uint32_t off, len; int32_t val; } *ents;
    size_t ents_cap;
    char *arena;
    size_t arena_len, arena_cap;
} tok_map;

void tok_map_init(tok_map *m, size_t expect);
void tok_map_free(tok_map *m);
/* Insert or overwrite. Returns 0 or DF_ENOMEM. */
int tok_map_put(tok_map *m, const void *key, size_t len, int32_t val);
/* Value for key, or -1 when absent. */
int32_t tok_map_get(const tok_map *m, const void *key, size_t len);

/* Pair map: (left id, right id) -> (rank, merged id). */
typedef struct {
    uint64_t *keys;   /* (left << 32 | right) + 1; 0 = empty */
    int32_t *rank, *merged;
    size_t cap, n;
} tok_pairs;

void tok_pairs_init(tok_pairs *p, size_t expect);
void tok_pairs_free(tok_pairs *p);
int tok_pairs_put(tok_pairs *p, int32_t a, int32_t b, int32_t rank, int32_t merged);
/* Returns 1 and fills rank/merged when (a, b) merges. */
static inline int tok_pairs_get(const tok_pairs *p, int32_t a, int32_t b, int32_t *rank, int32_t *merged) {
    uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    uint64_t h = k * 0x9E3779B97F4A7C15ull;
    size_t mask = p->cap - 1, i = (size_t)(h >> 20) & mask;
    for (;;) {
        uint64_t kk = p->keys[i];
        if (kk == k) { *rank = p->rank[i]; *merged = p->merged[i]; return 1; }
        if (kk == 0) return 0;
        i = (i + 1) & mask;
    }
}

/* ------------------------------------------------------------------ UTF-8 */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if s starts an invalid
 * or truncated sequence. */
int tok_utf8_valid_len(const uint8_t *s, size_t n);
/* Decode one valid sequence (caller checked validity); returns code point. */
int32_t tok_utf8_decode(const uint8_t *s, int len);
int tok_utf8_encode(int32_t cp, char *out);
/* Number of bytes of the "maximal subpart" of an ill-formed sequence at s
 * (Unicode 3.9 / WHATWG: each one becomes one U+FFFD). Always >= 1. */
int tok_utf8_bad_len(const uint8_t *s, size_t n);
/* Copy s, replacing ill-formed sequences with U+FFFD (maximal subparts, as
 * Python's bytes.decode('utf-8', 'replace') and Rust's from_utf8_lossy).
 * Returns malloc'd NUL-terminated buffer; *out_len set. NULL on OOM. */
char *tok_utf8_sanitize(const char *s, size_t n, size_t *out_len);

/* ------------------------------------------------------- dynamic buffers */

typedef struct { int32_t *v; size_t n, cap; } tok_ids;
int tok_ids_push(tok_ids *a, int32_t x);
int tok_ids_append(tok_ids *a, const int32_t *x, size_t n);

typedef struct { char *p; size_t n, cap; } tok_buf;
int tok_buf_put(tok_buf *b, const void *p, size_t n);
int tok_buf_puts(tok_buf *b, const char *s);
int tok_buf_putc(tok_buf *b, char c);

/* ------------------------------------------------------------- pipeline */

enum { TOK_SPLIT_REMOVED, TOK_SPLIT_ISOLATED, TOK_SPLIT_MERGED_PREV, TOK_SPLIT_MERGED_NEXT, TOK_SPLIT_CONTIGUOUS };

typedef struct { size_t off, len; } tok_span;
typedef struct { tok_span *v; size_t n, cap; } tok_spans;
int tok_spans_push(tok_spans *s, size_t off, size_t len);

/* A compiled regex (PCRE2 UTF+UCP, JIT when available). */
typedef struct {
    pcre2_code *code;
    int jit;
    int standin;   /* split on a copy with tok_regex.c's Unicode stand-ins (same byte offsets) */
} tok_regex;

/* Compile an HF / tiktoken (Rust regex / fancy-regex / Oniguruma syntax)
 * pattern for PCRE2: rewrites \s and \S to Rust's White_Space set,
 * [X&&[^Y]] class intersections to (?:(?!Y)[X]), a bare script \p{Han} to the
 * Script property, and gives the properties the references' Unicode 16 tables
 * (tok_regex.c). Errors name the pattern. */
int tok_regex_compile(tok_regex *r, const char *pattern, const char *what, char *err, size_t errlen);
void tok_regex_free(tok_regex *r);
/* Split text[span] by the regex with a Split behaviour; pieces are appended
 * to out (offsets relative to text). */
int tok_regex_split(const tok_regex *r, pcre2_match_data *md, pcre2_match_context *mc, const char *text,
                    tok_span span, int behavior, int invert, tok_spans *out);

enum { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_DIGITS, TOK_PRE_CHARSPLIT };
typedef struct {
    int type;
    tok_regex re;          /* SPLIT, BYTELEVEL with use_regex */
    int behavior, invert;  /* SPLIT */
    int use_regex, add_prefix_space; /* BYTELEVEL */
    int individual;        /* DIGITS */
} tok_pretok;

enum { TOK_NORM_NFC, TOK_NORM_NFD, TOK_NORM_NFKC, TOK_NORM_NFKD, TOK_NORM_LOWERCASE, TOK_NORM_REPLACE, TOK_NORM_PREPEND };
typedef struct { int type; char *a; char *b; } tok_norm;

typedef struct {
    char *content; size_t len;
    int32_t id;
    int special, lstrip, rstrip, normalized, single_word;
} tok_added;

enum { TOK_CHAT_NONE, TOK_CHAT_KIMI, TOK_CHAT_DEEPSEEK, TOK_CHAT_QWEN3, TOK_CHAT_HARMONY };
enum { TOK_KIND_HF, TOK_KIND_TIKTOKEN };
enum { TOK_DEC_BYTELEVEL, TOK_DEC_RAW };

struct df_tokenizer {
    int kind;
    int32_t n_vocab;           /* max id + 1 */
    /* id -> decoded bytes (raw bytes for byte-level vocab; content for added tokens) */
    char *pool; size_t pool_len, pool_cap;
    uint32_t *tok_off, *tok_len;
    uint8_t *tok_flags;        /* TOK_F_* */
    int32_t ids_cap;           /* allocated entries of tok_off/tok_len/tok_flags */
    /* model vocabulary in model space (raw bytes when byte_level) -> id */
    tok_map vocab;
    tok_pairs pairs;
    int byte_level;            /* vocab strings use the GPT-2 byte-to-unicode alphabet */
    int32_t byte_id[256];      /* id of the one-byte token, -1 if none */
    int byte_fallback;         /* <0xXX> tokens for bytes without a symbol */
    int32_t unk_id;
    int ignore_merges;
    /* pipeline */
    tok_norm *norms; int n_norms;
    tok_pretok *pretoks; int n_pretoks;
    tok_added *added; int n_added;
    uint8_t added_first[256];  /* bitmap of first bytes of added-token contents */
    tok_map added_map;         /* content -> index into added */
    int *added_lens; int n_added_lens; /* distinct content lengths, longest first */
    int decoder;
    /* tiktoken */
    tok_regex tt_re;
    int tt_kimi_slicing;       /* Kimi's 400k-char slices and 25k-char run cap */
    /* specials */
    int32_t bos_id, eos_id;
    int add_bos;               /* tokenizer_config.json add_bos_token (0 when absent) */
    char *bos_str, *eos_str;   /* as written in the chat format */
    int chat;                  /* hand-written fallback format (chat.c) when no template ships */
    char *path;
    /* the model's own chat template (chat_template.jinja, else tokenizer_config.json) */
    char *chat_template;       /* template text, NULL when none ships */
    char *chat_template_from;  /* the file it came from (for messages) */
    struct jj_template *jj;    /* parsed template; NULL when absent or refused */
    int jj_rc;                 /* why it was refused (DF_EUNSUPPORTED / DF_EINVAL), 0 otherwise */
    char *jj_err;              /* the parser's message naming the construct and line */
    char *chat_vars;           /* JSON members (no braces) of transformers' special_tokens_map */
};

enum { TOK_F_PRESENT = 1, TOK_F_SPECIAL = 2, TOK_F_ADDED = 4 };

/* tok_store.c: set the decoded bytes of id (grows tables). */
int tok_set_token(df_tokenizer *t, int32_t id, const void *bytes, size_t len, int flags);
int tok_ensure_ids(df_tokenizer *t, int32_t n);

/* tok_bytelevel.c: GPT-2 byte<->unicode alphabet. */
int tok_bytelevel_decode_str(const char *s, size_t n, tok_buf *out); /* -1 if a char is outside the alphabet */
extern const char *const tok_gpt2_pattern;

/* tok_bpe.c */
typedef struct tok_cache tok_cache;
tok_cache *tok_cache_new(void);
void tok_cache_free(tok_cache *c);
/* BPE-encode one pre-token (model-space bytes) and append ids. */
int tok_bpe_word(const df_tokenizer *t, const char *w, size_t n, tok_cache *cache, tok_ids *out);
/* Build pair table for tiktoken-style ranks from the vocabulary. */
int tok_bpe_pairs_from_ranks(df_tokenizer *t);

/* tok_hf.c / tok_tiktoken.c: loaders. */
int tok_load_hf(df_tokenizer *t, const char *json_path, char *err, size_t errlen);
int tok_load_tiktoken(df_tokenizer *t, const char *path, const char *config_path, char *err, size_t errlen);
/* tok_config.c: read tokenizer_config.json (bos/eos, chat format) */
int tok_apply_config(df_tokenizer *t, const char *config_path, char *err, size_t errlen);
void tok_detect_chat(df_tokenizer *t, const char *chat_template);

/* tok_encode.c */
int tok_build_added_index(df_tokenizer *t);
int tok_encode(const df_tokenizer *t, const char *text, size_t len, int flags, tok_ids *out, char *err, size_t errlen);

/* chat.c: the model's template (jinja_*.c) when it ships one, else the hand-written format */
int tok_chat_render(const df_tokenizer *t, const char *messages_json, const char *tools_json, int flags,
                    char **text_out, char *err, size_t errlen);

void tok_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
