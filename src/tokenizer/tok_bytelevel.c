/* tok_bytelevel.c — the GPT-2 "ByteLevel" alphabet: every byte 0..255 is
 * written as a printable code point (bytes 33-126, 161-172, 174-255 as
 * themselves, the other 68 as U+0100.. in byte order). Source: GPT-2
 * encoder.py bytes_to_unicode, used by HF tokenizers' ByteLevel. */
#include "tok_internal.h"
#include <string.h>

/* The GPT-2 pre-tokenizer regex (HF ByteLevel with use_regex=true). */
const char *const tok_gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static int16_t cp_to_byte[324];
static int table_ready;

static void build_table(void) {
    for (int i = 0; i < 324; i++) cp_to_byte[i] = -1;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = keep ? b : 256 + n++;
        cp_to_byte[cp] = (int16_t)b;
    }
    __atomic_store_n(&table_ready, 1, __ATOMIC_RELEASE);
}

int tok_bytelevel_decode_str(const char *s, size_t n, tok_buf *out) {
    if (!__atomic_load_n(&table_ready, __ATOMIC_ACQUIRE)) build_table();
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, start = out->n;
    while (i < n) {
        int l = tok_utf8_valid_len(u + i, n - i);
        if (!l) { out->n = start; return -1; }
        int32_t cp = tok_utf8_decode(u + i, l);
        if (cp >= 324 || cp_to_byte[cp] < 0) { out->n = start; return -1; }
        char b = (char)cp_to_byte[cp];
        if (tok_buf_put(out, &b, 1)) return DF_ENOMEM;
        i += l;
    }
    return 0;
}
