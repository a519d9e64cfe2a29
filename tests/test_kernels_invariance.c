/* test_kernels_invariance.c — the engine's promise of ONE summation order per (row, token):
 * for every backend this CPU runs, every encoding (F32, BF16, F16, FP8 block 128, INT4 g32,
 * MXFP4) and T in {1, 2, 3, 8, 17, 64}, each output y[t, r] of a T-token matmul is bit for
 * bit the output of that token alone (T = 1), with 1, 2 and 3 pool threads; and a view of a
 * subset of the rows gives the same bits as those rows of the full call (which other rows are
 * in the call does not matter). Shapes cover the SIMD paths' edges: columns that are not a
 * multiple of 16 (scalar tails), several column tiles, row counts that are not a multiple of
 * the kernels' row blocks, and a matmul small enough to run on the calling thread. */
#include "kernels/backend.h"
#include "test_util.h"

#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float rndf(void) { return (float)((rnd() >> 8) / 16777216.0 * 2.0 - 1.0); }
static uint16_t bf16_of(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

typedef struct { df_weight w; void *data, *scale; } owned;

/* A random weight with valid values (no NaN / Inf, finite scales). */
static owned make(df_wtype t, int64_t rows, int64_t cols) {
    owned o = {{.type = t, .rows = rows, .cols = cols}, NULL, NULL};
    const size_t n = (size_t)(rows * cols), nd = df_weight_data_bytes(t, rows, cols), ns = df_weight_scale_bytes(t, rows, cols);
    o.data = malloc(nd + 64);
    o.scale = ns ? malloc(ns + 64) : NULL;
    uint8_t *d = o.data, *s = o.scale;
    switch (t) {
    case DF_W_F32: for (size_t i = 0; i < n; i++) ((float *)d)[i] = rndf() * (1 + (float)(rnd() % 100)); break;
    case DF_W_BF16: for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = bf16_of(rndf() * (1 + (float)(rnd() % 100))); break;
    case DF_W_F16:
        for (size_t i = 0; i < n; i++) ((uint16_t *)d)[i] = (uint16_t)((rnd() & 0x83ff) | ((1 + rnd() % 29) << 10));
        ((uint16_t *)d)[0] = 0x0003; /* a subnormal half */
        break;
    case DF_W_FP8_B128:
        for (size_t i = 0; i < nd; i++) { uint8_t b = (uint8_t)rnd(); d[i] = (b & 0x7f) == 0x7f ? 0x3f : b; } /* subnormals included */
        for (size_t i = 0; i < ns / 4; i++) ((float *)s)[i] = 1e-3f * (1 + (float)(rnd() % 997)) / 97.0f;
        break;
    case DF_W_INT4_G32:
        for (size_t i = 0; i < nd; i++) d[i] = (uint8_t)rnd();
        for (size_t i = 0; i < ns / 2; i++) ((uint16_t *)s)[i] = bf16_of(1e-3f * (1 + (float)(rnd() % 300)));
        break;
    case DF_W_MXFP4:
        for (size_t i = 0; i < nd; i++) d[i] = (uint8_t)rnd();
        for (size_t i = 0; i < ns; i++) s[i] = (uint8_t)(100 + rnd() % 40);
        break;
    default: break;
    }
    o.w.data = o.data;
    o.w.scale = o.scale;
    return o;
}

/* Rows [r0, rows) of w as a weight of its own (r0 a multiple of 128 for FP8's row blocks). */
static df_weight tail_view(const df_weight *w, int64_t r0) {
    df_weight v = *w;
    v.rows = w->rows - r0;
    const size_t per_row = df_weight_data_bytes(w->type, 1, w->cols);
    v.data = (const uint8_t *)w->data + per_row * (size_t)r0;
    if (w->type == DF_W_FP8_B128) v.scale = (const float *)w->scale + (r0 / 128) * ((w->cols + 127) / 128);
    else if (w->scale) v.scale = (const uint8_t *)w->scale + df_weight_scale_bytes(w->type, 1, w->cols) * (size_t)r0;
    return v;
}

static int bits_equal(const float *a, const float *b, size_t n) { return !memcmp(a, b, n * sizeof(float)); }

int main(void) {
    const df_backend *bes[8];
    const int nb = df_backend_list(bes, 8);
    df_pool *pools[3] = {df_pool_new(1), df_pool_new(2), df_pool_new(3)};
    const df_wtype types[] = {DF_W_F32, DF_W_BF16, DF_W_F16, DF_W_FP8_B128, DF_W_INT4_G32, DF_W_MXFP4};
    const int Ts[] = {1, 2, 3, 4, 5, 6, 7, 8, 17, 64};
    /* (rows, cols): big enough for the pool and several column tiles; tiny (runs serially); fewer columns than one
     * 8-column chunk (the tail alone; 4-bit: one block) */
    const int64_t shapes[3][2] = {{300, 1061}, {13, 40}, {5, 6}};
    printf("cpu features: %s; backends:", df_cpu_features());
    for (int b = 0; b < nb; b++) printf(" %s", bes[b]->name);
    printf("\n");
    for (int si = 0; si < 3; si++)
        for (unsigned ti = 0; ti < sizeof types / sizeof *types; ti++) {
            const df_wtype t = types[ti];
            const int64_t rows = shapes[si][0];
            int64_t cols = shapes[si][1];
            if (t == DF_W_INT4_G32 || t == DF_W_MXFP4) cols = cols < 32 ? 32 : cols / 32 * 32 + (si == 0 ? 32 : 0); /* whole blocks */
            owned o = make(t, rows, cols);
            const int maxT = 64;
            float *x = malloc(sizeof(float) * (size_t)(maxT * cols)), *y = malloc(sizeof(float) * (size_t)(maxT * rows)),
                  *y1 = malloc(sizeof(float) * (size_t)(maxT * rows));
            for (int64_t i = 0; i < maxT * cols; i++) x[i] = rndf() * (rnd() % 8 ? 1.0f : 100.0f);
            for (int b = 0; b < nb; b++) {
                /* the reference: every token alone, one thread */
                for (int k = 0; k < maxT; k++) bes[b]->matmul(pools[0], &o.w, x + (int64_t)k * cols, 1, y1 + (int64_t)k * rows);
                for (unsigned Ti = 0; Ti < sizeof Ts / sizeof *Ts; Ti++)
                    for (int p = 0; p < 3; p++) {
                        const int T = Ts[Ti];
                        memset(y, 0xff, sizeof(float) * (size_t)(T * rows));
                        /* tokens taken from the middle of x, so each T sees a different mix */
                        const int k0 = (int)((Ti * 7 + (unsigned)p) % (unsigned)(maxT - T + 1));
                        bes[b]->matmul(pools[p], &o.w, x + (int64_t)k0 * cols, T, y);
                        CHECK(bits_equal(y, y1 + (int64_t)k0 * rows, (size_t)(T * rows)),
                              "%s %s %lldx%lld T=%d threads %d: a token's result differs from the token alone", bes[b]->name,
                              df_wtype_name(t), (long long)rows, (long long)cols, T, p + 1);
                    }
                /* a subset of the rows: same bits as those rows of the full call */
                if (rows > 128) {
                    const int64_t r0 = 128;
                    df_weight v = tail_view(&o.w, r0);
                    const int T = 17;
                    bes[b]->matmul(pools[1], &v, x, T, y);
                    int same = 1;
                    for (int k = 0; k < T; k++)
                        same &= bits_equal(y + (int64_t)k * v.rows, y1 + (int64_t)k * rows + r0, (size_t)v.rows);
                    CHECK(same, "%s %s: rows [%lld, %lld) alone differ from the same rows of the full matmul", bes[b]->name,
                          df_wtype_name(t), (long long)r0, (long long)rows);
                }
            }
            free(x); free(y); free(y1); free(o.data); free(o.scale);
        }
    for (int p = 0; p < 3; p++) df_pool_free(pools[p]);
    return t_done();
}
