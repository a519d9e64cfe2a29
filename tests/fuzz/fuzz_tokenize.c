/*
 * fuzz_tokenize.c — the tokenizer (src/tokenizer) of the embedded kimi-mini on any bytes. Byte 0 picks the flags
 * (DF_TOK_ADD_BOS, DF_TOK_PARSE_SPECIAL, DF_TOK_ADD_SPECIAL); the rest is the text. Every id must be inside the
 * vocabulary, and decoding the ids of plain valid UTF-8 text (no specials parsed or added) gives back the text's
 * exact bytes (a byte-level BPE loses nothing; the tokenizer's leading space, when it adds one, aside). Invalid
 * UTF-8 is encoded with U+FFFD for each bad sequence (docs/tokenizer.md), so its bytes do not come back.
 */
#include "fuzz.h"
#include "deltafin.h"

#include <string.h>

static df_tokenizer *tok;

/* Whether s[0..n) is valid UTF-8 (RFC 3629: no overlong forms, no surrogates, at most U+10FFFF). */
static int utf8_valid(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        const uint8_t c = s[i];
        size_t k;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        if (c >= 0xc2 && c <= 0xdf) { k = 1; cp = c & 0x1f; }
        else if (c >= 0xe0 && c <= 0xef) { k = 2; cp = c & 0x0f; }
        else if (c >= 0xf0 && c <= 0xf4) { k = 3; cp = c & 0x07; }
        else return 0;
        for (size_t j = 1; j <= k; j++) {
            if (i + j >= n || (s[i + j] & 0xc0) != 0x80) return 0;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        if ((k == 2 && cp < 0x800) || (k == 3 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
        i += k + 1;
    }
    return 1;
}
static size_t prefix; /* bytes the tokenizer puts before decoded plain text ("a" -> " a": 1) */

static void setup(void) {
    if (tok) return;
    char path[4096], err[512];
    snprintf(path, sizeof path, "%s/models/kimi-mini", fuzz_src());
    if (df_tokenizer_open(&tok, path, NULL, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenize: %s (run from the source tree, or set DF_SRC)\n", err);
        exit(1);
    }
    int32_t *ids = NULL;
    size_t ni = 0, nt = 0;
    char *txt = NULL;
    if (df_tokenize(tok, "a", 1, 0, &ids, &ni, err, sizeof err) || df_detokenize(tok, ids, ni, &txt, &nt, err, sizeof err)) {
        fprintf(stderr, "fuzz_tokenize: %s\n", err);
        exit(1);
    }
    prefix = nt - 1;
    free(ids);
    free(txt);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    setup();
    if (n < 1) return 0;
    const int flags = data[0] & (DF_TOK_ADD_BOS | DF_TOK_PARSE_SPECIAL | DF_TOK_ADD_SPECIAL);
    const char *text = (const char *)data + 1;
    const size_t len = n - 1;
    int32_t *ids = NULL;
    size_t ni = 0;
    char err[512];
    if (df_tokenize(tok, text, len, flags, &ids, &ni, err, sizeof err)) return 0; /* refused (e.g. invalid UTF-8) */
    const int nv = df_tokenizer_n_vocab(tok);
    for (size_t i = 0; i < ni; i++) FUZZ_ASSERT(ids[i] >= 0 && ids[i] < nv, "id %d of %zu outside the vocabulary (%d)", ids[i], i, nv);
    char *back = NULL;
    size_t nb = 0;
    const int rc = df_detokenize(tok, ids, ni, &back, &nb, err, sizeof err);
    FUZZ_ASSERT(rc == 0, "the ids of a tokenized text do not decode: %s", err);
    if (!flags && len && utf8_valid(data + 1, len)) /* plain valid text: the same bytes back */
        FUZZ_ASSERT(nb == len + prefix && !memcmp(back + prefix, text, len), "decoded %zu bytes for %zu bytes of text", nb, len);
    free(back);
    free(ids);
    return 0;
}
