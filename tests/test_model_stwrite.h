/* test_model_stwrite.h — helpers for the model tests: write small safetensors
 * files and HF checkpoint directories by hand (no Python needed), and a tiny
 * deterministic PRNG. Header-only; included by tests/test_model_*.c and
 * tests/test_convert*.c. */
#ifndef DF_TEST_MODEL_STWRITE_H
#define DF_TEST_MODEL_STWRITE_H

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char name[256];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    void *data;           /* owned */
    size_t nbytes;
} stw_entry;

typedef struct {
    stw_entry e[4096];
    int n;
} stw;

static uint64_t stw_rng = 0x9E3779B97F4A7C15ull;
static inline uint32_t stw_rand(void) {
    stw_rng ^= stw_rng << 13; stw_rng ^= stw_rng >> 7; stw_rng ^= stw_rng << 17;
    return (uint32_t)(stw_rng >> 11);
}
/* uniform in [-a, a] */
static inline float stw_randf(float a) { return a * ((float)(stw_rand() % 2000001) / 1000000.0f - 1.0f); }

static inline size_t stw_dsize(const char *dt) {
    if (!strcmp(dt, "F32") || !strcmp(dt, "I32")) return 4;
    if (!strcmp(dt, "BF16") || !strcmp(dt, "F16") || !strcmp(dt, "I16")) return 2;
    if (!strcmp(dt, "I64")) return 8;
    return 1;
}

/* Add a tensor; data copied (NULL = zeros). Returns the entry's data buffer. */
static inline void *stw_add(stw *w, const char *name, const char *dtype, int ndim, const int64_t *shape, const void *data) {
    stw_entry *e = &w->e[w->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->dtype = dtype;
    e->ndim = ndim;
    size_t n = 1;
    for (int i = 0; i < ndim; i++) { e->shape[i] = shape[i]; n *= (size_t)shape[i]; }
    e->nbytes = n * stw_dsize(dtype);
    e->data = calloc(1, e->nbytes + 1);
    if (data) memcpy(e->data, data, e->nbytes);
    return e->data;
}

static inline uint16_t stw_bf16(float f) {
    union { float f; uint32_t u; } v = {f};
    uint32_t lsb = (v.u >> 16) & 1;
    v.u += 0x7FFFu + lsb;
    return (uint16_t)(v.u >> 16);
}

/* random bf16 tensor */
static inline void *stw_add_bf16(stw *w, const char *name, int ndim, int64_t r, int64_t c, float amp) {
    int64_t sh[2] = {r, c};
    uint16_t *d = stw_add(w, name, "BF16", ndim, sh, NULL);
    size_t n = (size_t)r * (size_t)(ndim == 2 ? c : 1);
    for (size_t i = 0; i < n; i++) d[i] = stw_bf16(ndim == 1 ? 1.0f + stw_randf(0.1f) : stw_randf(amp));
    return d;
}

/* Write entries [from, to) to path as one safetensors file. Returns 0 on success. */
static inline int stw_write_range(const stw *w, int from, int to, const char *path) {
    cJSON *h = cJSON_CreateObject();
    size_t off = 0;
    for (int i = from; i < to; i++) {
        const stw_entry *e = &w->e[i];
        cJSON *t = cJSON_CreateObject();
        cJSON_AddStringToObject(t, "dtype", e->dtype);
        cJSON *sh = cJSON_AddArrayToObject(t, "shape");
        for (int k = 0; k < e->ndim; k++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)e->shape[k]));
        cJSON *of = cJSON_AddArrayToObject(t, "data_offsets");
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(of, cJSON_CreateNumber((double)(off + e->nbytes)));
        off += e->nbytes;
        cJSON_AddItemToObject(h, e->name, t);
    }
    cJSON *md = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(md, "format", "pt");
    char *txt = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    size_t hl = strlen(txt), pad = (8 - hl % 8) % 8;
    FILE *f = fopen(path, "wb");
    if (!f) { free(txt); return -1; }
    uint64_t n = hl + pad;
    unsigned char le[8];
    for (int i = 0; i < 8; i++) le[i] = (unsigned char)(n >> (8 * i));
    fwrite(le, 1, 8, f);
    fwrite(txt, 1, hl, f);
    for (size_t i = 0; i < pad; i++) fputc(' ', f);
    for (int i = from; i < to; i++) fwrite(w->e[i].data, 1, w->e[i].nbytes, f);
    free(txt);
    return fclose(f);
}

static inline void stw_free(stw *w) {
    for (int i = 0; i < w->n; i++) free(w->e[i].data);
    w->n = 0;
}

static inline int stw_write_text(const char *path, const char *txt) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fputs(txt, f);
    return fclose(f);
}

static inline const stw_entry *stw_get(const stw *w, const char *name) {
    for (int i = 0; i < w->n; i++)
        if (!strcmp(w->e[i].name, name)) return &w->e[i];
    return NULL;
}

#endif
