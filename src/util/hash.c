/* hash.c — XXH64 (seed 0) helpers over libxxhash. */
#include "util.h"
#include "deltafin.h"

#include <xxhash.h>

uint64_t df_xxh64(const void *data, size_t len) { return (uint64_t)XXH64(data, len, 0); }

void df_xxh64_hex(uint64_t h, char out[17]) {
    static const char hx[] = "0123456789abcdef";
    for (int i = 15; i >= 0; i--) { out[i] = hx[h & 15]; h >>= 4; }
    out[16] = 0;
}

int df_xxh64_parse(const char *s, uint64_t *h) {
    uint64_t v = 0;
    if (!s) return DF_EFORMAT;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return DF_EFORMAT;
        v = (v << 4) | (uint64_t)d;
    }
    if (s[16]) return DF_EFORMAT;
    *h = v;
    return DF_OK;
}
