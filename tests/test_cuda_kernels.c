/* test_cuda_kernels.c — every CUDA kernel (src/kernels/cuda) against the CPU
 * reference (cpu-scalar, engine rope_apply / eng_act formulas):
 *   - exact decoding of every encoding (all fp8 / e2m1 / e8m0 codes): a matmul
 *     with one-hot activations returns each weight element bit for bit;
 *   - matmul of every encoding for T = 1..N rows against the scalar reference
 *     (fp32 accumulation; tolerance 1e-5 of the row's magnitude);
 *   - batch invariance: row t of a T-row call is bitwise equal to a 1-row call;
 *   - every kernel variant gives the same bits: the one-token kernels (one row per warp; the tiled kernel
 *     with 2 / 4 rows per warp and 4 or 8 warps) and the T-row kernels (one row per warp; tiles of 8x8,
 *     32x8, 16x8 rows x tokens), on shapes with rows not a multiple of any tile, cols with a partial last
 *     round of 32 groups, and activations in several shared-memory chunks;
 *   - the weight cache: a cleared cache sees new data at a reused address;
 *     explicit keys (routed experts) are cached by key;
 *   - RMSNorm, SwiGLU, SiTU, softmax, RoPE;
 *   - the MLA attention core (df_cuda_mla_attend) against a double-precision host reference, every kv_b
 *     encoding, rows of several sequences, batch invariance.
 *   - the attention core's device mirrors of latent caches (seq_key): decode, rollback, growth, several
 *     sequences and unkeyed rows in one call, each bitwise equal to the unmirrored call; seq_forget.
 *   - the whole MLA block (df_cuda_mla_block) bitwise equal to its steps as separate calls, alone or batched,
 *     mirrored or not.
 *   - the KDA recurrence (df_cuda_kda_recur) bitwise equal to the CPU's with a lower-bound gate, and between one
 *     call of T rows and T calls of one row.
 * Without a CUDA device (or in a build without the backend) it prints why,
 * "skipped" and its closing line, and exits 77 (CTest: skipped). */
#include "engine/engine.h"
#include "kernels/backend.h"
#include "kernels/cuda.h"
#include "kernels/cuda_env.h"
#include "kernels/dtype.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float rndf(void) { return (float)((rnd() >> 8) / 16777216.0 * 2.0 - 1.0); }

static void free_weight(df_weight *w) { free((void *)w->data); free((void *)w->scale); }

/* A random weight of type t without NaN codes (so 0 * w = 0 in one-hot products). */
static df_weight make_weight(df_wtype t, int64_t rows, int64_t cols) {
    df_weight w = {t, rows, cols, NULL, NULL, 0};
    const size_t n = (size_t)(rows * cols);
    switch (t) {
    case DF_W_F32: { float *d = malloc(n * 4); for (size_t i = 0; i < n; i++) d[i] = rndf(); w.data = d; break; }
    case DF_W_BF16: {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) { float f = rndf(); uint32_t u; memcpy(&u, &f, 4); d[i] = (uint16_t)(u >> 16); }
        w.data = d; break;
    }
    case DF_W_F16: {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) d[i] = (uint16_t)((rnd() & 0x83ff) | ((1 + rnd() % 20) << 10));
        for (size_t i = 0; i < n && i < 8; i++) d[i] = (uint16_t)(rnd() & 0x83ff); /* subnormals and zeros */
        w.data = d; break;
    }
    case DF_W_FP8_B128: {
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) { d[i] = (uint8_t)rnd(); if ((d[i] & 0x7f) == 0x7f) d[i] ^= 1; }
        size_t ns = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128));
        float *s = malloc(ns * 4);
        for (size_t i = 0; i < ns; i++) s[i] = 0.003f + 0.0007f * (float)i;
        w.data = d; w.scale = s; break;
    }
    case DF_W_INT4_G32: {
        uint32_t *d = malloc(n / 2);
        for (size_t i = 0; i < n / 8; i++) d[i] = rnd();
        uint16_t *s = malloc(n / 32 * 2);
        for (size_t i = 0; i < n / 32; i++) { float f = 0.01f * (1 + i % 7); uint32_t u; memcpy(&u, &f, 4); s[i] = (uint16_t)(u >> 16); }
        w.data = d; w.scale = s; break;
    }
    case DF_W_MXFP4: {
        uint8_t *d = malloc(n / 2);
        for (size_t i = 0; i < n / 2; i++) d[i] = (uint8_t)rnd();
        uint8_t *s = malloc(n / 32);
        for (size_t i = 0; i < n / 32; i++) s[i] = (uint8_t)(118 + rnd() % 14);
        w.data = d; w.scale = s; break;
    }
    case DF_W_INT8_ROW: {
        int8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) d[i] = (int8_t)(rnd() % 255 - 127);
        float *s = malloc((size_t)rows * 4);
        for (int64_t i = 0; i < rows; i++) s[i] = 0.001f * (1 + i % 5);
        w.data = d; w.scale = s; break;
    }
    default: break;
    }
    return w;
}

/* Every element of w decoded on the GPU (one-hot activations) equals the scalar decode. */
static void check_decode(const df_weight *w, const char *what) {
    const int64_t R = w->rows, C = w->cols;
    float *x = calloc((size_t)(C * C), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(C * R));
    float *ref = malloc(sizeof(float) * (size_t)C);
    for (int64_t c = 0; c < C; c++) x[c * C + c] = 1.0f;
    int rc = df_cuda_matmul(w, x, (int)C, y);
    CHECK(rc == 0, "%s decode: %s", what, df_cuda_last_error());
    const df_backend *sc = df_backend_get("cpu-scalar");
    int64_t bad = 0, fr = -1, fc = -1;
    float fg = 0, fcpu = 0;
    for (int64_t r = 0; r < R && rc == 0; r++) {
        sc->decode_row(w, r, ref);
        for (int64_t c = 0; c < C; c++)
            if (!(y[c * R + r] == ref[c])) {
                if (fr < 0) { fr = r; fc = c; fg = y[c * R + r]; fcpu = ref[c]; }
                bad++;
            }
    }
    CHECK(bad == 0, "%s decode: %lld of %lld elements differ (first [%lld,%lld]: gpu %.9g cpu %.9g)", what, (long long)bad,
          (long long)(R * C), (long long)fr, (long long)fc, fg, fcpu);
    free(x); free(y); free(ref);
}

static void test_decode_exact(void) {
    /* fp8: all 254 non-NaN codes in one row per block of 128 rows (two blocks of scales) */
    {
        df_weight w = make_weight(DF_W_FP8_B128, 130, 256);
        uint8_t *d = (uint8_t *)w.data;
        for (int c = 0, k = 0; c < 256; c++, k++) {
            if ((k & 0x7f) == 0x7f) k++;
            d[c] = (uint8_t)k;
            d[129 * 256 + c] = (uint8_t)k;
        }
        ((float *)w.scale)[1] = 300.0f; /* scale x 2^120 overflows: the element-wise path */
        check_decode(&w, "fp8_b128 all codes");
        free_weight(&w);
    }
    /* mxfp4: every e2m1 code at every position parity; E8M0 scales 0 (2^-127), 1, 127, 254 */
    {
        df_weight w = make_weight(DF_W_MXFP4, 4, 64);
        uint8_t *d = (uint8_t *)w.data, *s = (uint8_t *)w.scale;
        for (int i = 0; i < 4 * 32; i++) d[i] = (uint8_t)((i % 16) | (((i / 16) % 16) << 4));
        const uint8_t sc[8] = {0, 1, 127, 200, 100, 150, 126, 128}; /* (254 x 6 overflows: inf x 0 = NaN) */
        for (int i = 0; i < 8; i++) s[i] = sc[i];
        check_decode(&w, "mxfp4 all codes");
        free_weight(&w);
    }
    static const df_wtype types[] = {DF_W_F32, DF_W_BF16, DF_W_F16, DF_W_INT4_G32, DF_W_INT8_ROW};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        df_weight w = make_weight(types[i], 5, 96);
        check_decode(&w, df_wtype_name(types[i]));
        free_weight(&w);
    }
    {   /* odd column count: the element-wise path */
        df_weight w = make_weight(DF_W_BF16, 3, 37);
        check_decode(&w, "bf16 37 cols");
        free_weight(&w);
        w = make_weight(DF_W_FP8_B128, 3, 200);
        check_decode(&w, "fp8 200 cols");
        free_weight(&w);
    }
}

static void test_matmul_kernels(const char *split) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    static const struct { df_wtype t; int64_t rows, cols; } cases[] = {
        {DF_W_F32, 67, 256}, {DF_W_F32, 9, 101}, {DF_W_BF16, 130, 512}, {DF_W_BF16, 33, 70}, {DF_W_F16, 64, 384},
        {DF_W_FP8_B128, 300, 640}, {DF_W_FP8_B128, 20, 150}, {DF_W_INT4_G32, 96, 1024}, {DF_W_MXFP4, 200, 2048},
        {DF_W_MXFP4, 7, 7168}, {DF_W_INT8_ROW, 50, 272},
        /* rows not a multiple of any tile, cols with a partial last round of 32 groups, several smem chunks */
        {DF_W_MXFP4, 37, 1088}, {DF_W_INT4_G32, 45, 96}, {DF_W_BF16, 33, 20000}, {DF_W_F32, 70, 12},
        {DF_W_FP8_B128, 129, 2064}, {DF_W_F16, 3, 8},
    };
    static const int Ts[] = {1, 2, 3, 4, 5, 8, 9, 17, 64, 130};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        df_weight w = make_weight(cases[ci].t, cases[ci].rows, cases[ci].cols);
        const int64_t R = w.rows, C = w.cols;
        const int TM = 130;
        float *x = malloc(sizeof(float) * (size_t)(TM * C));
        for (int64_t i = 0; i < TM * C; i++) x[i] = rndf();
        float *y = malloc(sizeof(float) * (size_t)(TM * R)), *ref = malloc(sizeof(float) * (size_t)(TM * R));
        float *y1 = malloc(sizeof(float) * (size_t)R), *y2 = malloc(sizeof(float) * (size_t)(TM * R));
        sc->matmul(NULL, &w, x, TM, ref);
        /* the error bound's scale: sum |w| |x| per output */
        double *mag = calloc((size_t)(TM * R), sizeof(double));
        float *row = malloc(sizeof(float) * (size_t)C);
        for (int64_t r = 0; r < R; r++) {
            sc->decode_row(&w, r, row);
            for (int t = 0; t < TM; t++) {
                double a = 0;
                for (int64_t c = 0; c < C; c++) a += fabs((double)row[c] * x[(int64_t)t * C + c]);
                mag[(int64_t)t * R + r] = a;
            }
        }
        for (size_t ti = 0; ti < sizeof Ts / sizeof Ts[0]; ti++) {
            const int T = Ts[ti];
            int rc = df_cuda_matmul(&w, x, T, y);
            CHECK(rc == 0, "matmul (%s) %s: %s", split, df_wtype_name(w.type), df_cuda_last_error());
            if (rc) continue;
            double md = 0, worst = 0; /* max |gpu - cpu| / (sum |w||x|) */
            for (int64_t i = 0; i < T * R; i++) {
                double d = fabs((double)y[i] - ref[i]) / (mag[i] + 1e-30);
                if (d > worst || d != d) { worst = d; md = fabs((double)y[i] - ref[i]); }
            }
            CHECK(worst <= 1e-5, "matmul (%s) %s [%lld x %lld] T=%d: max diff %g (%.3g of sum |w x|)", split, df_wtype_name(w.type),
                  (long long)R, (long long)C, T, md, worst);
            /* batch invariance: each row equals the 1-row call bit for bit */
            int same = 1;
            for (int t = 0; t < T && same; t++) {
                if (df_cuda_matmul(&w, x + (int64_t)t * C, 1, y1)) { same = 0; break; }
                if (memcmp(y1, y + (int64_t)t * R, sizeof(float) * (size_t)R)) same = 0;
            }
            CHECK(same, "matmul (%s) %s [%lld x %lld] T=%d: a row differs from the 1-row call (batch invariance)",
                  split, df_wtype_name(w.type), (long long)R, (long long)C, T);
            /* every one-token kernel (the reference with one row per warp, the tiled one with 2, 4, 8 rows per
             * warp) and every T-row kernel (reference, tiles of 8x8, 32x8, 16x8): the same bits as the automatic
             * T-row call above */
            static const int variants[] = {1, 2, 4, 8};
            for (int vi = 0; vi < 4; vi++) {
                df_cuda_set_matvec_rows(variants[vi]);
                same = 1;
                for (int t = 0; t < T && same; t++) {
                    if (df_cuda_matmul(&w, x + (int64_t)t * C, 1, y1)) { same = 0; break; }
                    if (memcmp(y1, y + (int64_t)t * R, sizeof(float) * (size_t)R)) same = 0;
                }
                df_cuda_set_matvec_rows(0);
                CHECK(same, "matmul (%s) %s [%lld x %lld] T=%d: the one-token kernel %d differs from the T-row call",
                      split, df_wtype_name(w.type), (long long)R, (long long)C, T, variants[vi]);
                if (T < 2) continue;
                df_cuda_set_tile(variants[vi]);
                int rc2 = df_cuda_matmul(&w, x, T, y2);
                df_cuda_set_tile(0);
                CHECK(rc2 == 0 && !memcmp(y2, y, sizeof(float) * (size_t)(T * R)),
                      "matmul (%s) %s [%lld x %lld] T=%d: the T-row kernel %d differs from the automatic one (%s)",
                      split, df_wtype_name(w.type), (long long)R, (long long)C, T, variants[vi], rc2 ? df_cuda_last_error() : "bits");
            }
        }
        free(x); free(y); free(ref); free(y1); free(y2); free(mag); free(row);
        free_weight(&w);
        df_cuda_cache_clear(); /* weights are cached by host address, which the next case (or pass) may reuse */
    }
}

/* Both kernel families for the matrices of at most 2048 rows: the K-split kernel (the default) and, with it off,
 * the one-row-per-warp and tiled kernels (their variants checked against each other). */
static void test_matmul(void) {
    test_matmul_kernels("split");
    df_cuda_set_split(0);
    test_matmul_kernels("no split");
    df_cuda_set_split(1);
}

static void test_cache(void) {
    df_weight w = make_weight(DF_W_F32, 8, 64);
    float x[64], y0[8], y1[8], y2[8];
    for (int i = 0; i < 64; i++) x[i] = rndf();
    df_cuda_cache_clear();
    CHECK(df_cuda_matmul(&w, x, 1, y0) == 0, "cache: %s", df_cuda_last_error());
    float *d = (float *)w.data;
    for (int i = 0; i < 8 * 64; i++) d[i] *= 2.0f;
    CHECK(df_cuda_matmul(&w, x, 1, y1) == 0, "cache: %s", df_cuda_last_error());
    CHECK(!memcmp(y0, y1, sizeof y0), "cache: an address-keyed weight is served from the GPU copy");
    df_cuda_cache_clear();
    CHECK(df_cuda_matmul(&w, x, 1, y2) == 0, "cache: %s", df_cuda_last_error());
    CHECK(y2[3] == 2.0f * y0[3], "cache: after clearing, the new data is used (%g vs 2 x %g)", y2[3], y0[3]);
    /* explicit keys: the same host buffer under two keys holds two different experts */
    df_weight a = w, b = w;
    a.dev_key = DF_DEVKEY(0, 1, 5, 0);
    b.dev_key = DF_DEVKEY(0, 1, 6, 0);
    float ya[8], yb[8], ya2[8];
    CHECK(df_cuda_matmul(&a, x, 1, ya) == 0, "cache: %s", df_cuda_last_error());
    for (int i = 0; i < 8 * 64; i++) d[i] = -d[i];
    CHECK(df_cuda_matmul(&b, x, 1, yb) == 0, "cache: %s", df_cuda_last_error());
    CHECK(df_cuda_matmul(&a, x, 1, ya2) == 0, "cache: %s", df_cuda_last_error());
    CHECK(!memcmp(ya, ya2, sizeof ya) && yb[0] == -ya[0], "cache: keyed experts (%g %g %g)", ya[0], yb[0], ya2[0]);
    df_cuda_stats st;
    df_cuda_get_stats(&st);
    CHECK(st.expert_hits >= 1 && st.expert_misses >= 2 && st.expert_bytes >= 2 * 8 * 64 * 4,
          "cache stats: hits %llu misses %llu bytes %llu", (unsigned long long)st.expert_hits,
          (unsigned long long)st.expert_misses, (unsigned long long)st.expert_bytes);
    /* df_cuda_has: resident or not, without counting a use */
    {
        df_cuda_stats s1;
        const int h5 = df_cuda_has(DF_DEVKEY(0, 1, 5, 0)), h6 = df_cuda_has(DF_DEVKEY(0, 1, 6, 0)), h7 = df_cuda_has(DF_DEVKEY(0, 1, 7, 0));
        df_cuda_get_stats(&s1);
        CHECK(h5 == 1 && h6 == 1 && h7 == 0 && s1.expert_hits == st.expert_hits && s1.expert_misses == st.expert_misses,
              "df_cuda_has: %d %d %d, hits %llu -> %llu", h5, h6, h7, (unsigned long long)st.expert_hits,
              (unsigned long long)s1.expert_hits);
    }
    /* a budget smaller than two experts evicts the older one */
    df_cuda_set_expert_budget(8 * 64 * 4 + 256);
    df_cuda_get_stats(&st);
    CHECK(st.expert_bytes <= 8 * 64 * 4 + 256, "budget: %llu expert bytes cached", (unsigned long long)st.expert_bytes);
    df_cuda_set_expert_budget(0);
    df_cuda_cache_clear();
    free_weight(&w);
}

/* df_cuda_matmul2: two matrices of one width on one token in one launch (cached, K-split encodings), bitwise each
 * matrix alone (df_cuda_matmul); an MLA layer's q_a and kv_a (K2 shapes, unequal K splits: 2 rows of q_a per block),
 * a shared expert's gate and up, small and odd row counts; a pair of two encodings takes two launches. */
static void test_matmul2(void) {
    static const struct { df_wtype ta, tb; int ra, rb, cols, one; } cs[] = {
        {DF_W_BF16, DF_W_BF16, 1536, 576, 7168, 1}, {DF_W_FP8_B128, DF_W_FP8_B128, 1536, 576, 7168, 1},
        {DF_W_BF16, DF_W_BF16, 2048, 2048, 7168, 1}, {DF_W_BF16, DF_W_BF16, 64, 112, 128, 1},
        {DF_W_BF16, DF_W_BF16, 100, 37, 256, 1},     {DF_W_FP8_B128, DF_W_FP8_B128, 300, 1000, 1024, 1},
        {DF_W_BF16, DF_W_FP8_B128, 64, 64, 256, 0},  {DF_W_BF16, DF_W_BF16, 4096, 576, 1024, 0},
    };
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        df_weight a = make_weight(cs[c].ta, cs[c].ra, cs[c].cols), b = make_weight(cs[c].tb, cs[c].rb, cs[c].cols);
        float *x = malloc(sizeof(float) * cs[c].cols), *ya = malloc(sizeof(float) * cs[c].ra),
              *yb = malloc(sizeof(float) * cs[c].rb), *ra = malloc(sizeof(float) * cs[c].ra),
              *rb = malloc(sizeof(float) * cs[c].rb);
        for (int i = 0; i < cs[c].cols; i++) x[i] = rndf();
        int ok = df_cuda_matmul(&a, x, 1, ra) == 0 && df_cuda_matmul(&b, x, 1, rb) == 0; /* both cached now */
        const int one = ok ? df_cuda_matmul2(&a, &b, x, ya, yb) : -1;
        CHECK(ok && one == cs[c].one, "matmul2 %dx%d + %dx%d: %d launch(es) (want %s): %s", cs[c].ra, cs[c].cols,
              cs[c].rb, cs[c].cols, one, cs[c].one ? "1: one" : "0: two", one < 0 ? df_cuda_last_error() : "");
        CHECK(one >= 0 && !memcmp(ya, ra, sizeof(float) * cs[c].ra) && !memcmp(yb, rb, sizeof(float) * cs[c].rb),
              "matmul2 %dx%d + %dx%d: bitwise each matrix alone", cs[c].ra, cs[c].cols, cs[c].rb, cs[c].cols);
        free(x); free(ya); free(yb); free(ra); free(rb);
        free_weight(&a);
        free_weight(&b);
        df_cuda_cache_clear();
    }
}

/* The fused MLP (one round trip) against scalar matmuls + the activation on the CPU. */
static void test_mlp(void) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    const int64_t D = 256, I = 96;
    df_weight gate = make_weight(DF_W_MXFP4, I, D), up = make_weight(DF_W_MXFP4, I, D), down = make_weight(DF_W_BF16, D, I);
    gate.dev_key = DF_DEVKEY(0, 0, 1, 0); /* one expert-keyed, two address-keyed */
    for (int act = 0; act < 2; act++)
        for (int T = 1; T <= 9; T += 8) {
            float *x = malloc(sizeof(float) * T * D), *o = malloc(sizeof(float) * T * D), *r = malloc(sizeof(float) * T * D);
            float *g = malloc(sizeof(float) * T * I), *u = malloc(sizeof(float) * T * I);
            for (int64_t i = 0; i < T * D; i++) x[i] = rndf();
            int rc = df_cuda_mlp(&gate, &up, &down, act, 3.0f, 2.5f, x, T, o);
            CHECK(rc == 0, "mlp: %s", df_cuda_last_error());
            sc->matmul(NULL, &gate, x, T, g);
            sc->matmul(NULL, &up, x, T, u);
            for (int64_t i = 0; i < T * I; i++) {
                const float gv = g[i], uv = act ? 2.5f * tanhf(u[i] / 2.5f) : u[i];
                g[i] = act ? 3.0f * tanhf(gv / 3.0f) * (1.0f / (1.0f + expf(-gv))) * uv : gv / (1.0f + expf(-gv)) * uv;
            }
            sc->matmul(NULL, &down, g, T, r);
            double md = 0, mx = 0;
            for (int64_t i = 0; i < T * D; i++) { md = fmax(md, fabs(o[i] - r[i])); mx = fmax(mx, fabs(r[i])); }
            CHECK(rc == 0 && md <= 1e-4 * (1 + mx), "mlp act %d T=%d: max diff %g (max %g)", act, T, md, mx);
            free(x); free(o); free(r); free(g); free(u);
        }
    df_cuda_cache_clear();
    free_weight(&gate); free_weight(&up); free_weight(&down);
}

/* The CPU's MLP (cpu-scalar matmuls, the engine's SwiGLU / SiTU, eng_act) for the grouped-MLP test. */
static void cpu_mlp(const df_weight *gate, const df_weight *up, const df_weight *down, int act, float beta, float lb,
                    const float *x, int T, float *out) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    const int64_t I = gate->rows;
    float *g = malloc(sizeof(float) * (size_t)(T * I)), *u = malloc(sizeof(float) * (size_t)(T * I));
    sc->matmul(NULL, gate, x, T, g);
    sc->matmul(NULL, up, x, T, u);
    for (int64_t i = 0; i < T * I; i++) {
        const float gv = g[i], uv = act && lb != 0.0f ? lb * tanhf(u[i] / lb) : u[i];
        g[i] = act ? beta * tanhf(gv / beta) * (1.0f / (1.0f + expf(-gv))) * uv : gv / (1.0f + expf(-gv)) * uv;
    }
    sc->matmul(NULL, down, g, T, out);
    free(g); free(u);
}

/* df_cuda_mla_project: bitwise the same as its steps as separate GPU calls (df_cuda_matmul of q_a, df_cuda_rmsnorm,
 * df_cuda_matmul of q_b, of kv_a; the same kernels), every row bitwise the same alone as in the batch, within
 * tolerance of the CPU; and the q_proj form (no q_lora). */
static void test_mla_project(void) {
    enum { D = 256, R = 96, Q = 160, K = 72, T = 5 };
    const float eps = 1e-6f;
    static const df_wtype enc[3] = {DF_W_BF16, DF_W_MXFP4, DF_W_FP8_B128};
    for (int ei = 0; ei < 3; ei++) {
        df_weight qa = make_weight(enc[ei], R, D), qb = make_weight(enc[ei], Q, R), kva = make_weight(DF_W_BF16, K, D);
        df_weight qp = make_weight(enc[ei], Q, D);
        float nw[R], h[T * D], q[T * Q], kv[T * K], q1[Q], kv1[K], ra[T * R], rq[T * Q], rk[T * K];
        for (int i = 0; i < R; i++) nw[i] = 0.5f + rndf();
        for (int i = 0; i < T * D; i++) h[i] = rndf();
        int rc = df_cuda_mla_project(&qa, nw, eps, &qb, NULL, &kva, h, T, q, kv);
        CHECK(rc == 0, "mla_project %s: %s", df_wtype_name(enc[ei]), df_cuda_last_error());
        rc |= df_cuda_matmul(&qa, h, T, ra) | df_cuda_rmsnorm(ra, ra, nw, T, R, eps) | df_cuda_matmul(&qb, ra, T, rq) |
              df_cuda_matmul(&kva, h, T, rk);
        CHECK(rc == 0 && !memcmp(q, rq, sizeof q) && !memcmp(kv, rk, sizeof kv),
              "mla_project %s: differs from its steps as separate calls", df_wtype_name(enc[ei]));
        int same = 1;
        for (int t = 0; t < T; t++) {
            same &= df_cuda_mla_project(&qa, nw, eps, &qb, NULL, &kva, h + t * D, 1, q1, kv1) == 0 &&
                    !memcmp(q1, q + t * Q, sizeof q1) && !memcmp(kv1, kv + t * K, sizeof kv1);
        }
        CHECK(same, "mla_project %s: a row alone differs from the batch", df_wtype_name(enc[ei]));
        /* against the CPU (scalar matmuls, the engine's RMSNorm formula) */
        const df_backend *sc = df_backend_get("cpu-scalar");
        float ca[T * R], cq[T * Q];
        sc->matmul(NULL, &qa, h, T, ca);
        for (int t = 0; t < T; t++) sc->rmsnorm(ca + t * R, ca + t * R, nw, R, eps);
        sc->matmul(NULL, &qb, ca, T, cq);
        double md = 0, mx = 0;
        for (int i = 0; i < T * Q; i++) { md = fmax(md, fabs(cq[i] - q[i])); mx = fmax(mx, fabs(cq[i])); }
        CHECK(md <= 1e-4 * (1 + mx), "mla_project %s vs the CPU: max diff %g (max %g)", df_wtype_name(enc[ei]), md, mx);
        /* no q_lora: q = q_proj h */
        rc = df_cuda_mla_project(NULL, NULL, eps, NULL, &qp, &kva, h, T, q, kv) | df_cuda_matmul(&qp, h, T, rq);
        CHECK(rc == 0 && !memcmp(q, rq, sizeof q) && !memcmp(kv, rk, sizeof kv), "mla_project %s (q_proj): %s",
              df_wtype_name(enc[ei]), df_cuda_last_error());
        free_weight(&qa); free_weight(&qb); free_weight(&kva); free_weight(&qp);
        df_cuda_cache_clear(); /* weights and the norm are cached by host address, which the next case may reuse */
    }
}

/* The grouped tensor-core launches inside df_cuda_mlp_group: 40 MXFP4 experts of one shape (T of 1..16, more items
 * than one launch takes, so gate/up pairs and downs go in several launches) with a BF16 shared expert, an INT4 expert
 * and an MXFP4 expert of another width beside them (those run one by one). The first call uploads the keyed weights
 * (one by one), the second finds them cached and groups the 40 (df_cuda_stats.grouped_items); with resident pinned
 * views the first call groups. Every item's output is bitwise equal to df_cuda_mlp on that item alone. */
static void test_mlp_group_mma(void) {
    enum { NG = 40, N = NG + 3, D = 256, I = 128 };
    static const int Ts[8] = {1, 2, 1, 5, 16, 3, 1, 8};
    df_weight host[N][3];
    float *x[N], *o[N], *one[N];
    int T[N];
    for (int i = 0; i < N; i++) {
        const df_wtype tg = i < NG ? DF_W_MXFP4 : i == NG ? DF_W_BF16 : i == NG + 1 ? DF_W_INT4_G32 : DF_W_MXFP4;
        const int64_t Ii = i == NG ? 64 : i == NG + 2 ? 96 : I;
        T[i] = i < NG ? Ts[i % 8] : 4;
        host[i][0] = make_weight(tg, Ii, D);
        host[i][1] = make_weight(tg, Ii, D);
        host[i][2] = make_weight(tg, D, Ii);
        x[i] = malloc(sizeof(float) * (size_t)T[i] * D);
        for (int64_t k = 0; k < (int64_t)T[i] * D; k++) x[i][k] = rndf();
        o[i] = malloc(sizeof(float) * (size_t)T[i] * D);
        one[i] = malloc(sizeof(float) * (size_t)T[i] * D);
    }
    for (int mode = 0; mode < 2; mode++) { /* 0: keyed (uploaded by the first call), 1: resident pinned views */
        df_cuda_cache_clear();
        df_weight w[N][3];
        int ok = 1;
        for (int i = 0; i < N; i++)
            for (int p = 0; p < 3; p++) {
                w[i][p] = host[i][p];
                w[i][p].dev_key = DF_DEVKEY(0, 9, i, p);
                if (mode == 1) {
                    df_weight v = w[i][p];
                    ok &= df_cuda_preload(&w[i][p]) == 0 && df_cuda_pin(w[i][p].dev_key, &v) == 1;
                    w[i][p] = v;
                }
            }
        CHECK(ok, "mlp_group (grouped) mode %d: preload / pin: %s", mode, df_cuda_last_error());
        const df_weight *gp[N], *up[N], *dp[N];
        const float *xp[N];
        for (int i = 0; i < N; i++) { gp[i] = &w[i][0]; up[i] = &w[i][1]; dp[i] = &w[i][2]; xp[i] = x[i]; }
        for (int call = 0; call < 2; call++) {
            df_cuda_stats s0, s1;
            df_cuda_get_stats(&s0);
            const int rc = df_cuda_mlp_group(N, gp, up, dp, call, 3.0f, 2.5f, xp, T, o);
            df_cuda_get_stats(&s1);
            CHECK(rc == 0, "mlp_group (grouped) mode %d call %d: %s", mode, call, df_cuda_last_error());
            const uint64_t want = mode == 0 && call == 0 ? 0 : NG;
            CHECK(s1.grouped_items - s0.grouped_items == want, "mlp_group mode %d call %d: %llu items grouped, want %llu",
                  mode, call, (unsigned long long)(s1.grouped_items - s0.grouped_items), (unsigned long long)want);
            if (rc) continue;
            int64_t bad = 0, tot = 0;
            for (int i = 0; i < N; i++) {
                const int r1 = df_cuda_mlp(gp[i], up[i], dp[i], call, 3.0f, 2.5f, x[i], T[i], one[i]);
                CHECK(r1 == 0, "mlp mode %d item %d: %s", mode, i, df_cuda_last_error());
                for (int64_t k = 0; k < (int64_t)T[i] * D; k++, tot++) bad += memcmp(&one[i][k], &o[i][k], sizeof(float)) != 0;
            }
            CHECK(bad == 0, "mlp_group (grouped) mode %d call %d: %lld of %lld outputs differ from df_cuda_mlp", mode, call,
                  (long long)bad, (long long)tot);
        }
        if (mode == 1)
            for (int i = 0; i < N; i++)
                for (int p = 0; p < 3; p++) df_cuda_unpin(DF_DEVKEY(0, 9, i, p));
    }
    df_cuda_cache_clear();
    for (int i = 0; i < N; i++) {
        for (int p = 0; p < 3; p++) free_weight(&host[i][p]);
        free(x[i]); free(o[i]); free(one[i]);
    }
}

/* The grouped MLP (df_cuda_mlp_group, df_backend.mlp_group): one group of items of different T (1, 3, 17),
 * encodings (MXFP4 on the tensor cores, BF16, FP8, INT4, F32, mixed within an item) and widths (an odd one: 37),
 * with the weights (a) cached by explicit keys, (b) resident and pinned (views without host data), (c) copied per
 * call into the scratch buffer (address caching off), (d) keyed under an expert budget of one weight (evictions of
 * weights the group's queued kernels still read); SwiGLU and SiTU (with and without the linear beta). Each item's
 * output is bitwise equal to df_cuda_mlp on that item alone (also with the items in reverse order) and within
 * tolerance of the CPU's MLP. */
static void test_mlp_group(void) {
    enum { N = 6 };
    static const struct { df_wtype tg, td; int64_t D, I; int T; } it[N] = {
        {DF_W_MXFP4, DF_W_MXFP4, 256, 96, 1},     {DF_W_BF16, DF_W_BF16, 256, 64, 3},
        {DF_W_FP8_B128, DF_W_FP8_B128, 256, 160, 17}, {DF_W_MXFP4, DF_W_BF16, 192, 128, 3},
        {DF_W_BF16, DF_W_F32, 37, 40, 17},         {DF_W_INT4_G32, DF_W_FP8_B128, 256, 64, 1},
    };
    df_weight host[N][3];
    float *x[N], *ref[N][3], *o[N], *o1[N];
    uint64_t biggest = 0;
    for (int i = 0; i < N; i++) {
        host[i][0] = make_weight(it[i].tg, it[i].I, it[i].D);
        host[i][1] = make_weight(it[i].tg, it[i].I, it[i].D);
        host[i][2] = make_weight(it[i].td, it[i].D, it[i].I);
        for (int p = 0; p < 3; p++)
            if (df_weight_bytes(&host[i][p]) > biggest) biggest = df_weight_bytes(&host[i][p]);
        const int64_t nx = it[i].T * it[i].D;
        x[i] = malloc(sizeof(float) * (size_t)nx);
        for (int64_t k = 0; k < nx; k++) x[i][k] = rndf();
        o[i] = malloc(sizeof(float) * (size_t)nx);
        o1[i] = malloc(sizeof(float) * (size_t)nx);
    }
    static const struct { int act; float beta, lb; } acts[3] = {{0, 0, 0}, {1, 3.0f, 2.5f}, {1, 4.0f, 0.0f}};
    for (int a = 0; a < 3; a++)
        for (int i = 0; i < N; i++) {
            ref[i][a] = malloc(sizeof(float) * (size_t)(it[i].T * it[i].D));
            cpu_mlp(&host[i][0], &host[i][1], &host[i][2], acts[a].act, acts[a].beta, acts[a].lb, x[i], it[i].T, ref[i][a]);
        }
    static const char *const mode_name[4] = {"keyed", "pinned", "scratch", "budget"};
    for (int mode = 0; mode < 4; mode++) {
        df_cuda_cache_clear();
        df_weight w[N][3];
        int pinned = 1;
        for (int i = 0; i < N; i++)
            for (int p = 0; p < 3; p++) {
                w[i][p] = host[i][p];
                w[i][p].dev_key = mode == 2 ? 0 : DF_DEVKEY(0, 7, i, p);
                if (mode == 1) { /* resident: uploaded now, then only the pinned view (no host data) is used */
                    df_weight v = w[i][p];
                    pinned &= df_cuda_preload(&w[i][p]) == 0 && df_cuda_pin(w[i][p].dev_key, &v) == 1 && !v.data;
                    w[i][p] = v;
                }
            }
        CHECK(pinned, "mlp_group %s: preload / pin: %s", mode_name[mode], df_cuda_last_error());
        if (mode == 2) df_cuda_set_cache_by_address(0);
        if (mode == 3) df_cuda_set_expert_budget(biggest + 256);
        const df_weight *gp[N], *up[N], *dp[N], *rgp[N], *rup[N], *rdp[N];
        const float *xp[N], *rxp[N];
        float *op[N], *rop[N];
        int Tp[N], rTp[N];
        for (int i = 0; i < N; i++) {
            gp[i] = &w[i][0]; up[i] = &w[i][1]; dp[i] = &w[i][2]; xp[i] = x[i]; op[i] = o[i]; Tp[i] = it[i].T;
            const int r = N - 1 - i;
            rgp[r] = gp[i]; rup[r] = up[i]; rdp[r] = dp[i]; rxp[r] = x[i]; rop[r] = o1[i]; rTp[r] = it[i].T;
        }
        for (int a = 0; a < 3; a++) {
            const int act = acts[a].act;
            const float beta = acts[a].beta, lb = acts[a].lb;
            int rc = df_cuda_mlp_group(N, gp, up, dp, act, beta, lb, xp, Tp, op);
            CHECK(rc == 0, "mlp_group %s act %d: %s", mode_name[mode], a, df_cuda_last_error());
            int rc2 = df_cuda_mlp_group(N, rgp, rup, rdp, act, beta, lb, rxp, rTp, rop);
            CHECK(rc2 == 0, "mlp_group %s act %d (reversed): %s", mode_name[mode], a, df_cuda_last_error());
            if (rc || rc2) continue;
            for (int i = 0; i < N; i++) {
                const int64_t no = it[i].T * it[i].D;
                CHECK(!memcmp(o[i], o1[i], sizeof(float) * (size_t)no),
                      "mlp_group %s act %d item %d: the reversed group differs", mode_name[mode], a, i);
                float *one = malloc(sizeof(float) * (size_t)no);
                const int r1 = df_cuda_mlp(gp[i], up[i], dp[i], act, beta, lb, x[i], it[i].T, one);
                CHECK(r1 == 0, "mlp %s item %d: %s", mode_name[mode], i, df_cuda_last_error());
                int64_t bad = 0;
                for (int64_t k = 0; k < no; k++) bad += memcmp(&one[k], &o[i][k], sizeof(float)) != 0;
                CHECK(r1 == 0 && bad == 0, "mlp_group %s act %d item %d (%s/%s, T=%d, %lldx%lld): %lld of %lld outputs "
                      "differ from df_cuda_mlp", mode_name[mode], a, i, df_wtype_name(it[i].tg), df_wtype_name(it[i].td),
                      it[i].T, (long long)it[i].I, (long long)it[i].D, (long long)bad, (long long)no);
                double md = 0, mx = 0;
                for (int64_t k = 0; k < no; k++) {
                    md = fmax(md, fabs(o[i][k] - ref[i][a][k]));
                    mx = fmax(mx, fabs(ref[i][a][k]));
                }
                CHECK(md <= 1e-4 * (1 + mx), "mlp_group %s act %d item %d vs the CPU: max diff %g (max %g)",
                      mode_name[mode], a, i, md, mx);
                free(one);
            }
        }
        if (mode == 1)
            for (int i = 0; i < N; i++)
                for (int p = 0; p < 3; p++) df_cuda_unpin(DF_DEVKEY(0, 7, i, p));
        df_cuda_set_cache_by_address(1);
        df_cuda_set_expert_budget(0);
    }
    /* items with T = 0 are skipped (their output untouched); a group of none is a no-op */
    {
        const df_weight *gp[2] = {&host[0][0], &host[1][0]}, *up[2] = {&host[0][1], &host[1][1]};
        const df_weight *dp[2] = {&host[0][2], &host[1][2]};
        const float *xp[2] = {x[0], x[1]};
        float *op[2] = {o[0], o[1]};
        int Tp[2] = {0, it[1].T};
        for (int64_t k = 0; k < it[0].D; k++) o[0][k] = -7.0f;
        CHECK(df_cuda_mlp_group(2, gp, up, dp, 0, 0, 0, xp, Tp, op) == 0 && o[0][0] == -7.0f && o[0][it[0].D - 1] == -7.0f,
              "mlp_group: an item with T = 0 (%s)", df_cuda_last_error());
        CHECK(df_cuda_mlp_group(0, gp, up, dp, 0, 0, 0, xp, Tp, op) == 0, "mlp_group of no items: %s", df_cuda_last_error());
        /* shapes that do not chain: -1 */
        const df_weight *bad[2] = {&host[0][0], &host[1][0]}; /* a gate as down: [I, D], not [D, I] */
        CHECK(df_cuda_mlp_group(2, gp, up, bad, 0, 0, 0, xp, Tp, op) == -1, "mlp_group: unchained shapes accepted");
    }
    df_cuda_cache_clear();
    for (int i = 0; i < N; i++) {
        for (int p = 0; p < 3; p++) free_weight(&host[i][p]);
        for (int a = 0; a < 3; a++) free(ref[i][a]);
        free(x[i]); free(o[i]); free(o1[i]);
    }
}

static void test_ops(void) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    const int T = 5;
    const int64_t n = 1000;
    float *x = malloc(sizeof(float) * T * n), *w = malloc(sizeof(float) * n), *g = malloc(sizeof(float) * T * n);
    float *o = malloc(sizeof(float) * T * n), *ref = malloc(sizeof(float) * T * n);
    for (int64_t i = 0; i < T * n; i++) { x[i] = 4 * rndf(); g[i] = 6 * rndf(); }
    for (int64_t i = 0; i < n; i++) w[i] = 1 + rndf();
    double md;
    /* RMSNorm */
    CHECK(df_cuda_rmsnorm(o, x, w, T, n, 1e-6f) == 0, "rmsnorm: %s", df_cuda_last_error());
    md = 0;
    for (int t = 0; t < T; t++) {
        sc->rmsnorm(ref + t * n, x + t * n, w, n, 1e-6f);
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(o[t * n + i] - ref[t * n + i]) / (fabs(ref[t * n + i]) + 1e-30));
    }
    CHECK(md <= 4e-7, "rmsnorm: max relative diff %g", md);
    /* SwiGLU */
    CHECK(df_cuda_silu_mul(o, g, x, T * n) == 0, "silu_mul: %s", df_cuda_last_error());
    sc->silu_mul(ref, g, x, T * n);
    md = 0;
    for (int64_t i = 0; i < T * n; i++) md = fmax(md, fabs(o[i] - ref[i]) / (fabs(ref[i]) + 1e-6));
    CHECK(md <= 1e-6, "silu_mul: max relative diff %g", md);
    /* SiTU (moe.c eng_act), with and without the linear beta */
    for (int k = 0; k < 2; k++) {
        const float b = 3.0f, lb = k ? 2.5f : 0.0f;
        CHECK(df_cuda_situ_mul(o, g, x, T * n, b, lb) == 0, "situ: %s", df_cuda_last_error());
        md = 0;
        for (int64_t i = 0; i < T * n; i++) {
            const float gv = g[i], uv = lb != 0.0f ? lb * tanhf(x[i] / lb) : x[i];
            const float r = b * tanhf(gv / b) * (1.0f / (1.0f + expf(-gv))) * uv;
            md = fmax(md, fabs(o[i] - r) / (fabs(r) + 1e-6));
        }
        CHECK(md <= 2e-6, "situ (lb %g): max relative diff %g", lb, md);
    }
    /* softmax */
    memcpy(o, g, sizeof(float) * T * n);
    memcpy(ref, g, sizeof(float) * T * n);
    CHECK(df_cuda_softmax(o, T, n) == 0, "softmax: %s", df_cuda_last_error());
    md = 0;
    for (int t = 0; t < T; t++) {
        sc->softmax(ref + t * n, n);
        for (int64_t i = 0; i < n; i++) md = fmax(md, fabs(o[t * n + i] - ref[t * n + i]) / (ref[t * n + i] + 1e-30));
    }
    CHECK(md <= 1e-6, "softmax: max relative diff %g", md);
    /* RoPE (engine rope_apply) at positions up to 100000 */
    {
        const int dim = 64, TT = 6;
        float inv[32];
        for (int i = 0; i < dim / 2; i++) inv[i] = powf(10000.0f, -(float)(2 * i) / dim);
        df_rope r = {dim, inv, 1.1f, 0.0};
        int64_t pos[6] = {0, 1, 7, 513, 4095, 100000};
        memcpy(o, x, sizeof(float) * TT * dim);
        memcpy(ref, x, sizeof(float) * TT * dim);
        CHECK(df_cuda_rope(o, TT, dim, inv, 1.1f, pos) == 0, "rope: %s", df_cuda_last_error());
        md = 0;
        for (int t = 0; t < TT; t++) {
            rope_apply(&r, ref + t * dim, pos[t]);
            for (int i = 0; i < dim; i++) md = fmax(md, fabs(o[t * dim + i] - ref[t * dim + i]));
        }
        CHECK(md <= 2e-6 * 8, "rope: max diff %g", md);
    }
    free(x); free(w); free(g); free(o); free(ref);
}

/* ---- The MLA attention core (df_cuda_mla_attend, df_backend.mla_attend) ---- */

/* The CPU attention math (engine/attention.c, absorbed form) in double precision from the exactly decoded kv_b
 * (cpu-scalar decode_row): o_v [T, H*dv]; mag [T, H*dv] the error scale of each output, sum_k |V[e,k]| *
 * sum_s p_s |c_s[k]| * (1 + S) with S = sum_s p_s (sum |q_lat c_s| + sum |q_pe kpe_s|) * scale (a score's rounding
 * moves every p_s by about that relative amount). */
static void ref_attend(const df_weight *kvb, int T, int H, int dn, int dr, int dv, int kvl, float scale, const float *q,
                       const float *const *c, const float *const *kpe, const int *npos, double *o_v, double *mag) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    const int qd = dn + dr;
    float *W = malloc(sizeof(float) * (size_t)kvb->rows * (size_t)kvl);
    for (int64_t r = 0; r < kvb->rows; r++) sc->decode_row(kvb, r, W + r * kvl);
    int maxn = 1;
    for (int t = 0; t < T; t++) if (npos[t] > maxn) maxn = npos[t];
    double *ql = malloc(sizeof(double) * (size_t)kvl), *ol = malloc(sizeof(double) * (size_t)kvl);
    double *oa = malloc(sizeof(double) * (size_t)kvl), *p = malloc(sizeof(double) * (size_t)maxn);
    double *sa = malloc(sizeof(double) * (size_t)maxn);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < H; h++) {
            const float *qt = q + ((int64_t)t * H + h) * qd;
            for (int k = 0; k < kvl; k++) {
                double a = 0;
                for (int d = 0; d < dn; d++) a += (double)qt[d] * W[((int64_t)h * (dn + dv) + d) * kvl + k];
                ql[k] = a;
            }
            double m = -INFINITY;
            for (int s = 0; s < npos[t]; s++) {
                double a = 0, aa = 0;
                for (int k = 0; k < kvl; k++) {
                    a += ql[k] * c[t][(int64_t)s * kvl + k];
                    aa += fabs(ql[k] * c[t][(int64_t)s * kvl + k]);
                }
                for (int i = 0; i < dr; i++) {
                    a += (double)qt[dn + i] * kpe[t][(int64_t)s * dr + i];
                    aa += fabs((double)qt[dn + i] * kpe[t][(int64_t)s * dr + i]);
                }
                p[s] = a * scale;
                sa[s] = aa * scale;
                if (p[s] > m) m = p[s];
            }
            double sum = 0, S = 0;
            for (int s = 0; s < npos[t]; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
            for (int s = 0; s < npos[t]; s++) { p[s] /= sum; S += p[s] * sa[s]; }
            for (int k = 0; k < kvl; k++) {
                double a = 0, aa = 0;
                for (int s = 0; s < npos[t]; s++) {
                    a += p[s] * c[t][(int64_t)s * kvl + k];
                    aa += p[s] * fabs(c[t][(int64_t)s * kvl + k]);
                }
                ol[k] = a;
                oa[k] = aa;
            }
            for (int e = 0; e < dv; e++) {
                const float *wr = W + ((int64_t)h * (dn + dv) + dn + e) * kvl;
                double a = 0, aa = 0;
                for (int k = 0; k < kvl; k++) { a += wr[k] * ol[k]; aa += fabs(wr[k]) * oa[k]; }
                o_v[(int64_t)t * H * dv + (int64_t)h * dv + e] = a;
                mag[(int64_t)t * H * dv + (int64_t)h * dv + e] = aa * (1 + S);
            }
        }
    free(W); free(ql); free(ol); free(oa); free(p); free(sa);
}

/* df_cuda_mla_attend on random data against ref_attend (|gpu - ref| <= 1e-5 of the output's error scale) for
 * one token and batches whose rows come from several sequences (different caches and npos, prompts, long
 * contexts over many softmax chunks), every kv_b encoding (bf16 and fp8_b128 on the model's head shape), head
 * counts that do not fill a block of 4 heads, kv_lora_rank from 64 to 1024 (not a multiple of 32 too), no rope
 * part; batch invariance: each row alone (other kernel tiles and heads per block) is bitwise its row of the batch. */
static void test_mla_attend(void) {
    static const struct {
        df_wtype enc;
        int H, dn, dr, dv, kvl;
        float qmul;       /* query magnitude: flatter (0.25) or more peaked (1) softmax */
        int nseq, seqT[3], npast[3];
    } cases[] = {
        {DF_W_BF16, 2, 16, 8, 16, 64, 1.0f, 1, {1}, {0}},                          /* one token, one position */
        {DF_W_FP8_B128, 4, 32, 16, 24, 96, 0.25f, 1, {1}, {99}},                   /* decode, 4 chunks (last partial) */
        {DF_W_FP8_B128, 8, 128, 64, 128, 512, 0.5f, 3, {3, 2, 2}, {4, 39, 299}},   /* K2 head shape, 3 sequences */
        {DF_W_BF16, 64, 128, 64, 128, 512, 0.25f, 1, {20}, {20}},                  /* K2 shape, prompt: 4 heads/block */
        {DF_W_F32, 3, 8, 4, 8, 200, 1.0f, 1, {342}, {0}},                          /* H % 4 != 0, kvl % 32 != 0 */
        {DF_W_F16, 2, 8, 0, 8, 64, 1.0f, 2, {1, 1}, {0, 5}},                       /* no rope part */
        {DF_W_INT4_G32, 2, 16, 8, 16, 64, 1.0f, 1, {3}, {5}},
        {DF_W_MXFP4, 2, 16, 8, 16, 64, 1.0f, 2, {2, 1}, {0, 40}},
        {DF_W_INT8_ROW, 2, 16, 8, 16, 64, 1.0f, 2, {1, 2}, {2999, 10}},            /* a long context */
        {DF_W_BF16, 2, 16, 8, 16, 1024, 1.0f, 1, {2}, {3}},                        /* the largest kv_lora_rank */
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        const int H = cases[ci].H, dn = cases[ci].dn, dr = cases[ci].dr, dv = cases[ci].dv, kvl = cases[ci].kvl;
        const int qd = dn + dr;
        const float scale = 1.0f / sqrtf((float)qd);
        df_weight kvb = make_weight(cases[ci].enc, (int64_t)H * (dn + dv), kvl);
        int T = 0;
        for (int s = 0; s < cases[ci].nseq; s++) T += cases[ci].seqT[s];
        float *cs[3] = {NULL, NULL, NULL}, *ks[3] = {NULL, NULL, NULL};
        const float **c = malloc(sizeof(float *) * (size_t)T), **kp = malloc(sizeof(float *) * (size_t)T);
        int *npos = malloc(sizeof(int) * (size_t)T);
        for (int s = 0, t = 0; s < cases[ci].nseq; s++) {
            const int n = cases[ci].npast[s] + cases[ci].seqT[s];
            cs[s] = malloc(sizeof(float) * (size_t)n * kvl);
            ks[s] = malloc(sizeof(float) * ((size_t)n * dr + 1));
            for (int64_t i = 0; i < (int64_t)n * kvl; i++) cs[s][i] = rndf();
            for (int64_t i = 0; i < (int64_t)n * dr; i++) ks[s][i] = rndf();
            for (int i = 0; i < cases[ci].seqT[s]; i++, t++) {
                c[t] = cs[s];
                kp[t] = ks[s];
                npos[t] = cases[ci].npast[s] + i + 1;
            }
        }
        float *q = malloc(sizeof(float) * (size_t)T * H * qd);
        for (int64_t i = 0; i < (int64_t)T * H * qd; i++) q[i] = cases[ci].qmul * rndf();
        float *o = malloc(sizeof(float) * (size_t)T * H * dv), *o1 = malloc(sizeof(float) * (size_t)H * dv);
        double *ref = malloc(sizeof(double) * (size_t)T * H * dv), *mag = malloc(sizeof(double) * (size_t)T * H * dv);
        char what[160];
        snprintf(what, sizeof what, "mla_attend %s H=%d dn=%d dr=%d dv=%d kvl=%d T=%d", df_wtype_name(kvb.type), H, dn, dr,
                 dv, kvl, T);
        int rc = df_cuda_mla_attend(&kvb, T, H, dn, dr, dv, kvl, scale, q, c, kp, npos, NULL, o);
        CHECK(rc == 0, "%s: %s", what, df_cuda_last_error());
        if (rc == 0) {
            ref_attend(&kvb, T, H, dn, dr, dv, kvl, scale, q, c, kp, npos, ref, mag);
            double worst = 0, wd = 0;
            int64_t wi = 0;
            for (int64_t i = 0; i < (int64_t)T * H * dv; i++) {
                const double d = fabs((double)o[i] - ref[i]), r = d / (mag[i] + 1e-30);
                if (r > worst || r != r) { worst = r; wd = d; wi = i; }
            }
            CHECK(worst <= 1e-5, "%s: max diff %g at %lld (gpu %.9g ref %.9g; %.3g of the error scale)", what, wd,
                  (long long)wi, o[wi], ref[wi], worst);
            /* the output projection in the same call: bitwise df_cuda_matmul of o_proj on this o_v */
            {
                df_weight ow = make_weight(ci % 2 ? DF_W_MXFP4 : DF_W_BF16, 48, (int64_t)H * dv);
                float *po = malloc(sizeof(float) * (size_t)T * 48), *pr = malloc(sizeof(float) * (size_t)T * 48);
                int r1 = -1, r2 = -1;
                if ((H * dv) % 32 == 0 || !(ci % 2)) {
                    r1 = df_cuda_mla_attend_o(&kvb, T, H, dn, dr, dv, kvl, scale, q, c, kp, npos, NULL, &ow, po);
                    r2 = df_cuda_matmul(&ow, o, T, pr);
                    CHECK(r1 == 0 && r2 == 0 && !memcmp(po, pr, sizeof(float) * (size_t)T * 48),
                          "%s: mla_attend_o differs from mla_attend + matmul (%s)", what, df_cuda_last_error());
                }
                free(po); free(pr); free_weight(&ow);
                df_cuda_cache_clear(); /* o_proj is cached by its host address, which the next weight may reuse */
            }
            /* batch invariance: each row alone */
            int same = 1, t_bad = -1;
            for (int t = 0; t < T && same; t++) {
                if (df_cuda_mla_attend(&kvb, 1, H, dn, dr, dv, kvl, scale, q + (int64_t)t * H * qd, c + t, kp + t,
                                       npos + t, NULL, o1) ||
                    memcmp(o1, o + (int64_t)t * H * dv, sizeof(float) * (size_t)H * dv)) {
                    same = 0;
                    t_bad = t;
                }
            }
            CHECK(same, "%s: row %d alone differs from its row of the batch (batch invariance; %s)", what, t_bad,
                  df_cuda_last_error());
        }
        free(q); free(o); free(o1); free(ref); free(mag); free(c); free(kp); free(npos);
        for (int s = 0; s < 3; s++) { free(cs[s]); free(ks[s]); }
        free_weight(&kvb);
        df_cuda_cache_clear(); /* kv_b is cached by its host address, which the next case may reuse */
    }
    {   /* a kv_lora_rank above 1024: -1 (the caller computes it on the CPU) */
        df_weight kvb = make_weight(DF_W_BF16, 2 * 16, 1056);
        float q[2 * 16] = {0}, cc[1056] = {0}, kk[1] = {0}, o[2 * 8];
        const float *c = cc, *kp = kk;
        const int np = 1;
        CHECK(df_cuda_mla_attend(&kvb, 1, 2, 8, 0, 8, 1056, 1.0f, q, &c, &kp, &np, NULL, o) == -1,
              "mla_attend: kv_lora_rank 1056 is refused");
        free_weight(&kvb);
    }
}

/* ---- The device mirrors of latent caches (df_cuda_mla_attend's seq_key) ---- */

enum { MH = 4, MDN = 32, MDR = 16, MDV = 24, MKVL = 96, MQD = MDN + MDR, MN = 300 };

/* One sequence: its cache c [MN, MKVL], kpe [MN, MDR] and a query per position, q [MN, MH*MQD]. */
typedef struct {
    float *c, *kp, *q;
} mseq;

static void mseq_fill(mseq *s, int r0, int r1) {
    for (int64_t i = (int64_t)r0 * MKVL; i < (int64_t)r1 * MKVL; i++) s->c[i] = rndf();
    for (int64_t i = (int64_t)r0 * MDR; i < (int64_t)r1 * MDR; i++) s->kp[i] = rndf();
    for (int64_t i = (int64_t)r0 * MH * MQD; i < (int64_t)r1 * MH * MQD; i++) s->q[i] = 0.5f * rndf();
}

/* One call of T rows: row t of sequence sq[t] at npos np[t] (its query: that sequence's q row np[t] - 1), with the
 * keys key[t] into o [T, MH*MDV], and again with no keys (every cache staged whole) into o0. 1 when both succeed and
 * o is bitwise o0. */
static int mirror_call(const df_weight *kvb, int T, mseq *const *sq, const int *np, const uint64_t *key, float *o,
                       float *o0, const char *what) {
    float *q = malloc(sizeof(float) * (size_t)T * MH * MQD);
    const float **c = malloc(sizeof(float *) * (size_t)T), **kp = malloc(sizeof(float *) * (size_t)T);
    for (int t = 0; t < T; t++) {
        memcpy(q + (int64_t)t * MH * MQD, sq[t]->q + (int64_t)(np[t] - 1) * MH * MQD, sizeof(float) * MH * MQD);
        c[t] = sq[t]->c;
        kp[t] = sq[t]->kp;
    }
    const float scale = 1.0f / sqrtf((float)MQD);
    const int r1 = df_cuda_mla_attend(kvb, T, MH, MDN, MDR, MDV, MKVL, scale, q, c, kp, np, key, o);
    CHECK(r1 == 0, "%s (keyed): %s", what, df_cuda_last_error());
    const int r0 = df_cuda_mla_attend(kvb, T, MH, MDN, MDR, MDV, MKVL, scale, q, c, kp, np, NULL, o0);
    CHECK(r0 == 0, "%s (no keys): %s", what, df_cuda_last_error());
    free(q); free(c); free(kp);
    return r1 == 0 && r0 == 0 && !memcmp(o, o0, sizeof(float) * (size_t)T * MH * MDV);
}

/* Mirrored caches give the bits of staged ones: a sequence A prompted (20 rows in one call) then decoded position
 * by position to 300 (the mirror grows past its first 256 positions); a rollback (rows from 150 rewritten, then
 * evaluated again from 150, and new rows decoded on to 200); a second sequence B beside A in one call (distinct
 * keys, two rows of B), a row with key 0 among keyed ones, a 300-row prompt of a fresh key C in one call. With
 * mirrors on (DF_CUDA_KV_MIRROR), a host row below the call's first written row changed against the contract is not
 * seen (the mirror holds the old one) until df_cuda_seq_forget drops the sequence's mirrors; one key given for two
 * caches is refused. */
static void test_mla_mirror(void) {
    /* the checks that need mirrors to be used: DF_CUDA_KV_MIRROR on with the default cap or one of 64 MiB and more
     * (off, or a tiny cap, stages every cache: the bitwise checks still hold) */
    unsigned long long cap = 0;
    const int on = df_cuda_env_kv_mirror(&cap, NULL, 0) > 0 && (cap == 0 || cap >= (64ull << 20));
    df_weight kvb = make_weight(DF_W_BF16, (int64_t)MH * (MDN + MDV), MKVL);
    mseq sa, sb, sc;
    mseq *all[3] = {&sa, &sb, &sc};
    for (int i = 0; i < 3; i++) {
        all[i]->c = malloc(sizeof(float) * MN * MKVL);
        all[i]->kp = malloc(sizeof(float) * MN * MDR);
        all[i]->q = malloc(sizeof(float) * MN * MH * MQD);
        mseq_fill(all[i], 0, MN);
    }
    const uint64_t KA = (101ull << 8) | 3, KB = (102ull << 8) | 3, KC = (103ull << 8) | 5;
    enum { OV = MH * MDV };
    float *o = malloc(sizeof(float) * MN * OV), *o0 = malloc(sizeof(float) * MN * OV), last[OV];
    mseq *rows[MN];
    int np[MN];
    uint64_t key[MN];
    /* A: a prompt of 20 rows, then one position a call up to MN */
    for (int t = 0; t < 20; t++) { rows[t] = &sa; np[t] = t + 1; key[t] = KA; }
    CHECK(mirror_call(&kvb, 20, rows, np, key, o, o0, "mirror: A prompt of 20"), "mirror: A's 20-row prompt differs");
    int bad = -1;
    for (int n = 21; n <= MN; n++) {
        rows[0] = &sa; np[0] = n; key[0] = KA;
        if (!mirror_call(&kvb, 1, rows, np, key, o, o0, "mirror: A decode") && bad < 0) bad = n;
    }
    CHECK(bad < 0, "mirror: A decoded with a key differs from unkeyed at npos %d", bad);
    /* rollback: rows [150, 160) rewritten and evaluated again in one call, then decode on to 200 */
    mseq_fill(&sa, 150, 160);
    for (int t = 0; t < 10; t++) { rows[t] = &sa; np[t] = 151 + t; key[t] = KA; }
    CHECK(mirror_call(&kvb, 10, rows, np, key, o, o0, "mirror: A rollback"), "mirror: A after a rollback to 150 differs");
    bad = -1;
    for (int n = 161; n <= 200; n++) {
        mseq_fill(&sa, n - 1, n); /* a new token's row (the old one is stale on the device) */
        rows[0] = &sa; np[0] = n; key[0] = KA;
        if (!mirror_call(&kvb, 1, rows, np, key, o, o0, "mirror: A decode after rollback") && bad < 0) bad = n;
    }
    CHECK(bad < 0, "mirror: A decoded after a rollback differs at npos %d", bad);
    /* B (prompt of 40) beside A in one call: A at 201, B at 41 and 42 */
    for (int t = 0; t < 40; t++) { rows[t] = &sb; np[t] = t + 1; key[t] = KB; }
    CHECK(mirror_call(&kvb, 40, rows, np, key, o, o0, "mirror: B prompt"), "mirror: B's prompt differs");
    rows[0] = &sa; np[0] = 201; key[0] = KA;
    rows[1] = &sb; np[1] = 41; key[1] = KB;
    rows[2] = &sb; np[2] = 42; key[2] = KB;
    CHECK(mirror_call(&kvb, 3, rows, np, key, o, o0, "mirror: A and B"), "mirror: A and B in one call differ");
    /* a row with key 0 (its cache staged whole) among keyed ones; C's 300-row prompt in one call */
    rows[0] = &sb; np[0] = 43; key[0] = KB;
    rows[1] = &sc; np[1] = 7; key[1] = 0;
    rows[2] = &sa; np[2] = 202; key[2] = KA;
    CHECK(mirror_call(&kvb, 3, rows, np, key, o, o0, "mirror: keys and key 0"), "mirror: key 0 among keyed rows differs");
    for (int t = 0; t < MN; t++) { rows[t] = &sc; np[t] = t + 1; key[t] = KC; }
    CHECK(mirror_call(&kvb, MN, rows, np, key, o, o0, "mirror: C prompt of 300"), "mirror: C's 300-row prompt differs");
    /* the mirror is what is read: a host row below the call's first row changed (against the contract) */
    rows[0] = &sa; np[0] = 202; key[0] = KA;
    CHECK(mirror_call(&kvb, 1, rows, np, key, o, o0, "mirror: A again"), "mirror: A read again differs");
    memcpy(last, o, sizeof last);
    if (on) {
        const float keep = sa.c[5];
        sa.c[5] += 1.0f;
        mirror_call(&kvb, 1, rows, np, key, o, o0, "mirror: A re-read");
        CHECK(!memcmp(o, last, sizeof last), "mirror: rows below the first written one are read from the mirror");
        CHECK(memcmp(o0, last, sizeof last), "mirror: (the changed host row changes an unkeyed result)");
        df_cuda_seq_forget(101); /* A's mirrors gone: the next keyed call reads the host's rows again */
        CHECK(mirror_call(&kvb, 1, rows, np, key, o, o0, "mirror: A after forget"), "mirror: A after seq_forget differs");
        CHECK(memcmp(o, last, sizeof last), "mirror: seq_forget(101) dropped A's mirror");
        sa.c[5] = keep;
    }
    if (on) { /* one key for two caches: refused */
        const float *c2[2] = {sa.c, sb.c}, *k2[2] = {sa.kp, sb.kp};
        const int n2[2] = {3, 3};
        const uint64_t k[2] = {KA, KA};
        float q[2 * MH * MQD] = {0};
        CHECK(df_cuda_mla_attend(&kvb, 2, MH, MDN, MDR, MDV, MKVL, 1.0f, q, c2, k2, n2, k, o) == -1,
              "mirror: one seq_key for two caches is refused");
    }
    df_cuda_seq_forget(0);
    for (int i = 0; i < 3; i++) { free(all[i]->c); free(all[i]->kp); free(all[i]->q); }
    free(o); free(o0);
    free_weight(&kvb);
    df_cuda_cache_clear();
}

/* ---- The whole MLA block (df_cuda_mla_block) ---- */

enum { BD = 128, BH = 4, BDN = 32, BDR = 16, BDV = 24, BKVL = 96, BR = 64, BE = 16, BQD = BDN + BDR, BNC = 64 };

/* rope(v, cs) as df_backend.mla_block defines it (engine/rope.c rope_apply with its cos/sin table). */
static void host_rope(const float *v, const float *cs, int dim, float *out) {
    const int half = dim / 2;
    for (int i = 0; i < half; i++) {
        const float a = v[2 * i], b = v[2 * i + 1], c = cs[2 * i], s = cs[2 * i + 1];
        out[i] = a * c - b * s;
        out[i + half] = b * c + a * s;
    }
}

/* The block's steps as separate GPU calls (and the RoPE and residual on the host), T rows; the cache rows written. */
static int ref_block(const df_mla_block *b, int T, const float *x, const float *cs, float *const *c, float *const *kpe,
                     const int *npos, float *xo, float *h2, float *lg) {
    enum { MT = 8 };
    static float h[MT * BD], q[MT * BH * BQD], kva[MT * (BKVL + BDR)], a[MT * BD];
    if (T > MT) return -1;
    int rc = df_cuda_rmsnorm(h, x, b->attn_norm, T, BD, b->eps) |
             df_cuda_mla_project(b->q_a, b->q_a_norm, b->lora_eps, b->q_b, b->q_proj, b->kv_a, h, T, q, kva);
    for (int t = 0; t < T && !rc; t++) {
        const float *row = kva + t * (BKVL + BDR);
        rc |= df_cuda_rmsnorm(c[t] + (npos[t] - 1) * BKVL, row, b->kv_a_norm, 1, BKVL, b->lora_eps);
        float *kp = kpe[t] + (npos[t] - 1) * BDR, qr[BDR];
        if (cs) host_rope(row + BKVL, cs + t * BDR, BDR, kp);
        else memcpy(kp, row + BKVL, sizeof(float) * BDR);
        for (int hh = 0; hh < BH && cs; hh++) {
            float *qp = q + (t * BH + hh) * BQD + BDN;
            host_rope(qp, cs + t * BDR, BDR, qr);
            memcpy(qp, qr, sizeof qr);
        }
    }
    rc |= df_cuda_mla_attend_o(b->kv_b, T, BH, BDN, BDR, BDV, BKVL, b->scale, q, (const float *const *)c,
                               (const float *const *)kpe, npos, NULL, b->o, a);
    for (int i = 0; i < T * BD; i++) xo[i] = x[i] + a[i];
    rc |= df_cuda_rmsnorm(h2, xo, b->ffn_norm, T, BD, b->eps);
    if (b->router) rc |= df_cuda_matmul(b->router, h2, T, lg);
    return rc;
}

/* One cache set: sequence A (rows at positions 5..7 of a prompt) and B (a decode row at 40). */
typedef struct { float c[2][BNC * BKVL], p[2][BNC * BDR]; } bcaches;

/* df_cuda_mla_block: bitwise its steps as separate GPU calls (ref_block), the cache rows it writes included, for a
 * call with two sequences (a 3-row prompt and a decode row); the same bits for each sequence alone and for the
 * prompt's rows one call each; mirrored caches (seq_key) as unkeyed ones, over a prompt and two decode steps; the
 * q_proj form with an fp8 kv_b, and a layer without rotary or router. */
static void test_mla_block(void) {
    const float eps = 1e-5f, leps = 1e-6f;
    static bcaches base, ca, cb, cc;
    for (int form = 0; form < 3; form++) {
        df_weight qa = make_weight(DF_W_BF16, BR, BD), qb = make_weight(form ? DF_W_BF16 : DF_W_MXFP4, BH * BQD, BR);
        df_weight qp = make_weight(DF_W_BF16, BH * BQD, BD), kva = make_weight(DF_W_BF16, BKVL + BDR, BD);
        df_weight kvb = make_weight(form == 1 ? DF_W_FP8_B128 : DF_W_BF16, BH * (BDN + BDV), BKVL);
        df_weight ow = make_weight(DF_W_MXFP4, BD, BH * BDV), rw = make_weight(DF_W_BF16, BE, BD);
        static float an[BD], fn[BD], qan[BR], kvn[BKVL];
        for (int i = 0; i < BD; i++) { an[i] = 0.5f + rndf(); fn[i] = 0.5f + rndf(); }
        for (int i = 0; i < BR; i++) qan[i] = 0.5f + rndf();
        for (int i = 0; i < BKVL; i++) kvn[i] = 0.5f + rndf();
        const df_mla_block b = {an, fn, eps, form == 1 ? NULL : &qa, form == 1 ? NULL : &qb, form == 1 ? &qp : NULL,
                                &kva, &kvb, &ow, form == 2 ? NULL : &rw, form == 1 ? NULL : qan, kvn, leps,
                                BH, BDN, BDR, BDV, BKVL, 0.125f, 0, NULL, NULL, NULL, 0, 0.0f, 0.0f, NULL};
        for (int s = 0; s < 2; s++) {
            for (int i = 0; i < BNC * BKVL; i++) base.c[s][i] = rndf();
            for (int i = 0; i < BNC * BDR; i++) base.p[s][i] = rndf();
        }
        enum { T = 4 };
        float x[T * BD], cs[T * BDR], xo[T * BD], h2[T * BD], lg[T * BE], rxo[T * BD], rh2[T * BD], rlg[T * BE];
        for (int i = 0; i < T * BD; i++) x[i] = rndf();
        for (int i = 0; i < T * BDR; i++) cs[i] = 1.2f * rndf();
        const float *csp = form == 2 ? NULL : cs;
        const int npos[T] = {6, 7, 8, 41};
        char what[64];
        snprintf(what, sizeof what, "mla_block form %d", form);
        /* the batch, unkeyed */
        ca = base;
        float *c4[T] = {ca.c[0], ca.c[0], ca.c[0], ca.c[1]}, *p4[T] = {ca.p[0], ca.p[0], ca.p[0], ca.p[1]};
        int rc = df_cuda_mla_block(&b, T, x, csp, c4, p4, npos, NULL, xo, h2, lg);
        CHECK(rc == 0, "%s: %s", what, df_cuda_last_error());
        /* the reference: each sequence alone, the steps as separate calls */
        cb = base;
        float *r4c[T] = {cb.c[0], cb.c[0], cb.c[0], cb.c[1]}, *r4p[T] = {cb.p[0], cb.p[0], cb.p[0], cb.p[1]};
        rc = ref_block(&b, 3, x, csp, r4c, r4p, npos, rxo, rh2, rlg) |
             ref_block(&b, 1, x + 3 * BD, csp ? csp + 3 * BDR : NULL, r4c + 3, r4p + 3, npos + 3, rxo + 3 * BD, rh2 + 3 * BD,
                       rlg + 3 * BE);
        CHECK(rc == 0, "%s: the reference steps: %s", what, df_cuda_last_error());
        CHECK(!memcmp(xo, rxo, sizeof xo) && !memcmp(h2, rh2, sizeof h2) && (form == 2 || !memcmp(lg, rlg, sizeof lg)),
              "%s: x_out / h2 / logits differ from the steps as separate calls", what);
        CHECK(!memcmp(&ca, &cb, sizeof ca), "%s: the cache rows written differ from the steps as separate calls", what);
        /* the prompt's rows one call each, then B's row: the same bits */
        cc = base;
        int same = 1;
        float x1[BD], h1[BD], l1[BE];
        for (int t = 0; t < T; t++) {
            float *c1 = cc.c[t < 3 ? 0 : 1], *p1 = cc.p[t < 3 ? 0 : 1];
            same &= df_cuda_mla_block(&b, 1, x + t * BD, csp ? csp + t * BDR : NULL, &c1, &p1, npos + t, NULL, x1, h1, l1) == 0 &&
                    !memcmp(x1, xo + t * BD, sizeof x1) && !memcmp(h1, h2 + t * BD, sizeof h1) &&
                    (form == 2 || !memcmp(l1, lg + t * BE, sizeof l1));
        }
        CHECK(same && !memcmp(&cc, &ca, sizeof ca), "%s: rows one call each differ from the batch", what);
        /* mirrored caches (keys of sequences 1 and 2, layer `form`): the prompt, then two decode steps of both, each
         * bitwise the unkeyed call on a copy of the same host caches; x_out in place (x_out = x) */
        cc = base;
        ca = base;
        const uint64_t key[T] = {1u << 8 | (unsigned)form, 1u << 8 | (unsigned)form, 1u << 8 | (unsigned)form,
                                 2u << 8 | (unsigned)form};
        float *k4c[T] = {cc.c[0], cc.c[0], cc.c[0], cc.c[1]}, *k4p[T] = {cc.p[0], cc.p[0], cc.p[0], cc.p[1]};
        float xk[T * BD], xu[T * BD];
        memcpy(xk, x, sizeof xk);
        memcpy(xu, x, sizeof xu);
        same = df_cuda_mla_block(&b, T, xk, csp, k4c, k4p, npos, key, xk, h2, lg) == 0 &&
               df_cuda_mla_block(&b, T, xu, csp, c4, p4, npos, NULL, xu, rh2, rlg) == 0 && !memcmp(xk, xu, sizeof xk) &&
               !memcmp(h2, rh2, sizeof h2);
        for (int step = 0; step < 2 && same; step++) {
            const int np2[2] = {9 + step, 42 + step};
            const uint64_t k2[2] = {key[0], key[3]};
            float *kc[2] = {cc.c[0], cc.c[1]}, *kp[2] = {cc.p[0], cc.p[1]}, *uc[2] = {ca.c[0], ca.c[1]},
                  *up[2] = {ca.p[0], ca.p[1]};
            float xs[2 * BD], xs2[2 * BD];
            for (int i = 0; i < 2 * BD; i++) xs[i] = xs2[i] = rndf();
            same = df_cuda_mla_block(&b, 2, xs, csp, kc, kp, np2, k2, xs, h2, lg) == 0 &&
                   df_cuda_mla_block(&b, 2, xs2, csp, uc, up, np2, NULL, xs2, rh2, rlg) == 0 && !memcmp(xs, xs2, sizeof xs) &&
                   !memcmp(h2, rh2, sizeof(float) * 2 * BD) && (form == 2 || !memcmp(lg, rlg, sizeof(float) * 2 * BE));
        }
        CHECK(same && !memcmp(&cc, &ca, sizeof ca), "%s: mirrored caches differ from unkeyed ones (%s)", what,
              df_cuda_last_error());
        df_cuda_seq_forget(1);
        df_cuda_seq_forget(2);
        /* rows of one cache at positions that are not consecutive: refused */
        {
            const int gap[2] = {6, 8};
            float *gc[2] = {ca.c[0], ca.c[0]}, *gp[2] = {ca.p[0], ca.p[0]};
            CHECK(df_cuda_mla_block(&b, 2, x, csp, gc, gp, gap, NULL, xo, h2, lg) == -1,
                  "%s: rows at positions 5 and 7 of one cache are refused", what);
        }
        free_weight(&qa); free_weight(&qb); free_weight(&qp); free_weight(&kva); free_weight(&kvb); free_weight(&ow);
        free_weight(&rw);
        df_cuda_cache_clear(); /* weights and norms are cached by host address, which the next form may reuse */
    }
}

/* df_cuda_moe_resid: a block call leaves its x_out as the device residual; three MXFP4 experts and a bf16 shared expert
 * added into it (weights in item order); the next block given x NULL continues from there, bitwise as the same block
 * given x_out + the host combine (df_cuda_mlp_group's outputs, fmaf chains from 0 in item order, + the shared
 * expert) on a copy of the same cache. */
static void test_moe_resid_mode(int early) {
    enum { BI = 64, NX = 3 };
    const float eps = 1e-5f, leps = 1e-6f;
    df_weight qa = make_weight(DF_W_BF16, BR, BD), qb = make_weight(DF_W_BF16, BH * BQD, BR);
    df_weight kva = make_weight(DF_W_BF16, BKVL + BDR, BD), kvb = make_weight(DF_W_BF16, BH * (BDN + BDV), BKVL);
    df_weight ow = make_weight(DF_W_BF16, BD, BH * BDV), rw = make_weight(DF_W_BF16, BE, BD);
    static float an[BD], fn[BD], qan[BR], kvn[BKVL];
    for (int i = 0; i < BD; i++) { an[i] = 0.5f + rndf(); fn[i] = 0.5f + rndf(); }
    for (int i = 0; i < BR; i++) qan[i] = 0.5f + rndf();
    for (int i = 0; i < BKVL; i++) kvn[i] = 0.5f + rndf();
    const uint64_t key = 0x5eed;
    df_weight g[NX + 1], u[NX + 1], d[NX + 1];
    for (int i = 0; i <= NX; i++) {
        const df_wtype t = i < NX ? DF_W_MXFP4 : DF_W_BF16;
        g[i] = make_weight(t, BI, BD);
        u[i] = make_weight(t, BI, BD);
        d[i] = make_weight(t, BD, BI);
        if (i < NX) { g[i].dev_key = DF_DEVKEY(0, 1, i, 0); u[i].dev_key = DF_DEVKEY(0, 1, i, 1); d[i].dev_key = DF_DEVKEY(0, 1, i, 2); }
    }
    /* early: the block also starts the shared expert (item NX), which moe_resid then takes */
    df_mla_block b = {an, fn, eps, &qa, &qb, NULL, &kva, &kvb, &ow, &rw, qan, kvn, leps, BH, BDN, BDR, BDV, BKVL, 0.125f,
                      key, NULL, NULL, NULL, 0, 0.0f, 0.0f, NULL};
    const df_mla_block b0 = b;
    if (early) { b.sh_gate = &g[NX]; b.sh_up = &u[NX]; b.sh_down = &d[NX]; }
    static float c1[BNC * BKVL], p1[BNC * BDR], c2[BNC * BKVL], p2[BNC * BDR];
    for (int i = 0; i < BNC * BKVL; i++) c1[i] = c2[i] = rndf();
    for (int i = 0; i < BNC * BDR; i++) p1[i] = p2[i] = rndf();
    float *cp1 = c1, *pp1 = p1, *cp2 = c2, *pp2 = p2;
    float x[BD], cs[2 * BDR], xo[BD], h2[BD], lg[BE], w[NX] = {0.31f, -0.57f, 0.125f};
    for (int i = 0; i < BD; i++) x[i] = rndf();
    for (int i = 0; i < 2 * BDR; i++) cs[i] = 1.2f * rndf();
    const int np1 = 10, np2 = 11;
    /* the first block (x given): x_out becomes the device residual; the second cache copy gets the same row */
    int rc = df_cuda_mla_block(&b, 1, x, cs, &cp2, &pp2, &np1, NULL, xo, h2, lg);
    /* the reference: the items' outputs back on the host, combined there */
    const df_weight *gp[NX + 1], *up[NX + 1], *dp[NX + 1];
    const float *xs[NX + 1];
    float ys[NX + 1][BD], *yp[NX + 1];
    int Ts[NX + 1];
    for (int i = 0; i <= NX; i++) { gp[i] = &g[i]; up[i] = &u[i]; dp[i] = &d[i]; xs[i] = h2; yp[i] = ys[i]; Ts[i] = 1; }
    rc |= df_cuda_mlp_group(NX + 1, gp, up, dp, 0, 0, 0, xs, Ts, yp);
    /* the block again on the other cache copy (the same row): its x_out is the residual, its shared expert started */
    rc |= df_cuda_mla_block(&b, 1, x, cs, &cp1, &pp1, &np1, NULL, xo, h2, lg);
    df_cuda_stats st0, st1;
    df_cuda_get_stats(&st0);
    float xr[BD];
    for (int k = 0; k < BD; k++) {
        float acc = 0.0f;
        for (int i = 0; i < NX; i++) acc = fmaf(w[i], ys[i][k], acc);
        xr[k] = xo[k] + (acc + ys[NX][k]);
    }
    /* the device path (the residual now holds the second call's x_out, the same values) */
    rc |= df_cuda_moe_resid(NX + 1, gp, up, dp, 0, 0, 0, h2, w, 1, key);
    df_cuda_get_stats(&st1);
    CHECK(rc == 0, "moe_resid%s: %s", early ? " (shared expert started by the block)" : "", df_cuda_last_error());
    CHECK(st1.shared_early - st0.shared_early == (uint64_t)early, "moe_resid%s: took %llu started shared experts",
          early ? " (shared expert started by the block)" : "", (unsigned long long)(st1.shared_early - st0.shared_early));
    CHECK(df_cuda_moe_resid(NX + 1, gp, up, dp, 0, 0, 0, h2, w, 1, key + 1) == -1,
          "moe_resid: a key no mla_block wrote is refused");
    float x2[BD], h22[BD], lg2[BE], x3[BD], h23[BD], lg3[BE], cs2[BDR];
    for (int i = 0; i < BDR; i++) cs2[i] = cs[BDR + i];
    rc = df_cuda_mla_block(&b0, 1, NULL, cs2, &cp1, &pp1, &np2, NULL, x2, h22, lg2) |
         df_cuda_mla_block(&b0, 1, xr, cs2, &cp2, &pp2, &np2, NULL, x3, h23, lg3);
    CHECK(rc == 0 && !memcmp(x2, x3, sizeof x2) && !memcmp(h22, h23, sizeof h22) && !memcmp(lg2, lg3, sizeof lg2) &&
              !memcmp(c1, c2, sizeof c1) && !memcmp(p1, p2, sizeof p1),
          "moe_resid%s + mla_block(x NULL) differs from the host combine + mla_block(x) (%s)",
          early ? " (shared expert started by the block)" : "", df_cuda_last_error());
    for (int i = 0; i <= NX; i++) { free_weight(&g[i]); free_weight(&u[i]); free_weight(&d[i]); }
    free_weight(&qa); free_weight(&qb); free_weight(&kva); free_weight(&kvb); free_weight(&ow); free_weight(&rw);
    df_cuda_cache_clear();
}

/* df_cuda_moe_resid after an mla_block: the shared expert computed in the call, and started by the block (b.sh_*);
 * both bitwise the host combine of mlp_group's outputs. */
static void test_moe_resid(void) {
    test_moe_resid_mode(0);
    test_moe_resid_mode(1);
}

/* moe_route's picks and weights for one token, sorted by id (the order the device routing reports) */
static void host_route_sorted(const df_config *cfg, const float *lg, const float *bias, int *ids, float *w) {
    const int K = cfg->num_experts_per_tok;
    moe_route(cfg, lg, bias, 1, ids, w);
    for (int k = 1; k < K; k++)
        for (int j = k; j > 0 && ids[j - 1] > ids[j]; j--) {
            const int t = ids[j]; ids[j] = ids[j - 1]; ids[j - 1] = t;
            const float f = w[j]; w[j] = w[j - 1]; w[j - 1] = f;
        }
}

/* df_cuda_route_test: the device routing's picks and weights bitwise moe_route's (route_math.h's sigmoid on both
 * sides), over shapes of DeepSeek-V3 (256 experts, 8 groups keep 4), Kimi K2 (384, no groups), K3 (896, top-16) and
 * small ones, logits of several magnitudes, ties (repeated values), -inf and NaN logits. */
static void test_route(void) {
    static const struct { int E, K, G, TG, renorm, deepseek; float scale; } cs[] = {
        {256, 8, 8, 4, 1, 1, 2.5f}, {384, 8, 1, 1, 1, 0, 2.827f}, {896, 16, 1, 1, 1, 0, 2.5f}, {64, 8, 1, 1, 1, 0, 1.0f},
        {16, 2, 4, 2, 0, 1, 1.0f}, {64, 1, 1, 1, 1, 0, 1.0f}, {16, 16, 2, 1, 1, 1, 16.0f},
    };
    static float lg[1024], bias[1024];
    int n_bad = 0, n = 0;
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++)
        for (int mode = 0; mode < 6; mode++) {
            df_config cfg;
            memset(&cfg, 0, sizeof cfg);
            const int E = cs[c].E, K = cs[c].K;
            cfg.n_routed_experts = E;
            cfg.num_experts_per_tok = K;
            cfg.n_group = cs[c].G;
            cfg.topk_group = cs[c].TG;
            cfg.norm_topk_prob = cs[c].renorm;
            cfg.arch = cs[c].deepseek ? DF_ARCH_DEEPSEEK : DF_ARCH_DEEPSEEK + 1;
            cfg.routed_scaling_factor = cs[c].scale;
            const float mag = mode == 1 ? 20.0f : mode == 2 ? 0.01f : 4.0f;
            for (int x = 0; x < E; x++) {
                lg[x] = mag * rndf();
                bias[x] = 0.1f * rndf();
            }
            if (mode == 3) /* ties: few distinct values */
                for (int x = 0; x < E; x++) lg[x] = (float)(rnd() % 4) * 0.5f;
            if (mode == 4) { /* -inf and +inf logits */
                lg[E / 3] = -INFINITY;
                lg[E / 2] = INFINITY;
                lg[E - 1] = -200.0f;
            }
            if (mode == 5) lg[E / 4] = NAN;
            int hi[16], di[16];
            float hw[16], dw[16];
            host_route_sorted(&cfg, lg, mode == 3 ? NULL : bias, hi, hw);
            const int rc = df_cuda_route_test(lg, mode == 3 ? NULL : bias, E, K, cfg.n_group, cfg.topk_group,
                                              cfg.norm_topk_prob && (cfg.arch == DF_ARCH_DEEPSEEK || K > 1),
                                              cfg.routed_scaling_factor, di, dw);
            n++;
            /* a NaN weight (a NaN logit picked) is NaN on both sides; its payload is the hardware's own */
            int wbad = 0;
            for (int k = 0; k < K; k++)
                wbad |= !(hw[k] != hw[k] && dw[k] != dw[k]) && memcmp(&hw[k], &dw[k], sizeof(float));
            if (rc || memcmp(hi, di, sizeof(int) * K) || wbad) {
                if (n_bad++ < 3) {
                    printf("FAIL route E=%d K=%d G=%d mode %d (rc %d):", E, K, cfg.n_group, mode, rc);
                    for (int k = 0; k < K; k++) printf(" %d/%d %a/%a", hi[k], di[k], hw[k], dw[k]);
                    printf("\n");
                }
            }
        }
    CHECK(n_bad == 0, "device routing: %d of %d cases differ from moe_route", n_bad, n);
}

/* The KDA recurrence (df_cuda_kda_recur) against the CPU's kda_recur_head: state and output bitwise equal with a
 * lower-bound gate (K3), within 1e-5 relative with softplus (log1pf's last bit is each side's); T rows in one call
 * bitwise equal to T one-row calls on the GPU (either gate); K up to 128, heads 1-4, a K the device declines. */
static void test_kda(void) {
    static const struct { int H, K, T, has_lb, silu; } cs[] = {
        {4, 16, 9, 1, 0}, {2, 32, 17, 1, 1}, {3, 128, 5, 1, 0}, {1, 64, 33, 0, 0}, {4, 16, 7, 0, 1}, {2, 100, 3, 1, 0},
    };
    int n_bad = 0, n_inv_bad = 0, n = 0;
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int H = cs[ci].H, K = cs[ci].K, T = cs[ci].T, D = H * K;
        const size_t rows = (size_t)T * D, sn = (size_t)H * K * K;
        float *q = malloc(4 * rows), *k = malloc(4 * rows), *v = malloc(4 * rows), *graw = malloc(4 * rows),
              *gate = malloc(4 * rows), *bl = malloc(4 * (size_t)T * H), *A_log = malloc(4 * (size_t)H),
              *dt = malloc(4 * (size_t)D), *on = malloc(4 * (size_t)K), *S0 = malloc(4 * sn);
        float *qc = malloc(4 * rows), *kc = malloc(4 * rows), *oc = malloc(4 * rows), *Sc = malloc(4 * sn);
        float *qg = malloc(4 * rows), *kg = malloc(4 * rows), *og = malloc(4 * rows), *Sg = malloc(4 * sn);
        float *o1 = malloc(4 * rows), *S1 = malloc(4 * sn);
        for (size_t i = 0; i < rows; i++) {
            q[i] = rndf(); k[i] = rndf(); v[i] = rndf(); graw[i] = 3.0f * rndf(); gate[i] = 2.0f * rndf();
        }
        for (int i = 0; i < T * H; i++) bl[i] = 2.0f * rndf();
        for (int i = 0; i < H; i++) A_log[i] = rndf();
        for (int i = 0; i < D; i++) dt[i] = 0.5f * rndf();
        for (int i = 0; i < K; i++) on[i] = 1.0f + 0.2f * rndf();
        for (size_t i = 0; i < sn; i++) S0[i] = 0.1f * rndf();
        df_kda_args a = {H, K, T, qc, kc, v, graw, bl, gate, A_log, dt, on, cs[ci].has_lb, cs[ci].silu, -5.0f, 1e-5f,
                         Sc, oc};
        memcpy(qc, q, 4 * rows); memcpy(kc, k, 4 * rows); memcpy(Sc, S0, 4 * sn);
        for (int h = 0; h < H; h++) kda_recur_head(&a, h);
        a.q = qg; a.k = kg; a.S = Sg; a.o = og;
        memcpy(qg, q, 4 * rows); memcpy(kg, k, 4 * rows); memcpy(Sg, S0, 4 * sn);
        const int rc = df_cuda_kda_recur(&a);
        n++;
        int bad = rc != 0;
        if (!bad && cs[ci].has_lb) bad = memcmp(Sc, Sg, 4 * sn) || memcmp(oc, og, 4 * rows);
        if (!bad && !cs[ci].has_lb) {
            for (size_t i = 0; i < sn && !bad; i++) bad = fabsf(Sc[i] - Sg[i]) > 1e-5f * (1.0f + fabsf(Sc[i]));
            for (size_t i = 0; i < rows && !bad; i++) bad = fabsf(oc[i] - og[i]) > 1e-5f * (1.0f + fabsf(oc[i]));
        }
        if (bad && n_bad++ < 3) printf("FAIL kda H=%d K=%d T=%d lb=%d: rc %d, S[0] %a / %a, o[0] %a / %a\n", H, K, T,
                                       cs[ci].has_lb, rc, Sc[0], Sg[0], oc[0], og[0]);
        /* the same rows one at a time on the GPU */
        memcpy(qg, q, 4 * rows); memcpy(kg, k, 4 * rows); memcpy(S1, S0, 4 * sn);
        int rc1 = 0;
        for (int t = 0; t < T && !rc1; t++) {
            df_kda_args b = a;
            b.T = 1; b.q = qg + (size_t)t * D; b.k = kg + (size_t)t * D; b.v = v + (size_t)t * D;
            b.graw = graw + (size_t)t * D; b.bl = bl + (size_t)t * H; b.gate = gate + (size_t)t * D;
            b.S = S1; b.o = o1 + (size_t)t * D;
            rc1 = df_cuda_kda_recur(&b);
        }
        if (rc1 || rc || memcmp(S1, Sg, 4 * sn) || memcmp(o1, og, 4 * rows)) {
            if (n_inv_bad++ < 3) printf("FAIL kda H=%d K=%d T=%d: one row per call differs from one call\n", H, K, T);
        }
        free(q); free(k); free(v); free(graw); free(gate); free(bl); free(A_log); free(dt); free(on); free(S0);
        free(qc); free(kc); free(oc); free(Sc); free(qg); free(kg); free(og); free(Sg); free(o1); free(S1);
    }
    CHECK(n_bad == 0, "KDA recurrence: %d of %d cases differ from the CPU's", n_bad, n);
    CHECK(n_inv_bad == 0, "KDA recurrence: %d of %d cases differ between one call and one row per call", n_inv_bad, n);
    /* a head size whose state does not fit a block's shared memory: declined, the state untouched */
    float one = 1.0f;
    df_kda_args big = {1, 256, 1, &one, &one, &one, &one, &one, &one, &one, &one, &one, 1, 0, -5.0f, 1e-5f, &one, &one};
    CHECK(df_cuda_kda_recur(&big) == -1 && one == 1.0f, "KDA recurrence: K = 256 declined, nothing written");
}

/* one sequence through df_cuda_kda_block: -1 failed, 0 the state written back, 1 kept on the device */
static int kda_block1(const df_kda_block *b, int T, const float *h, uint64_t key, float *conv, float *S, float *out) {
    unsigned char kept = 0;
    if (df_cuda_kda_block(b, 1, &T, h, &key, &conv, &S, out, &kept)) return -1;
    return kept;
}

/* The whole KDA mixer in one call (df_cuda_kda_block) against its steps: the GPU's matmuls (the cuda backend's), the
 * CPU's short convolution (kda_short_conv) and recurrence (kda_recur_head): output, state and conv state bitwise
 * equal with a lower-bound gate, full-rank and low-rank output gates; T rows in one call bitwise T one-row calls; the
 * same with the state kept in a device copy (df_cuda_kda_state); four sequences in one call as each alone. */

static void test_kda_block(void) {
    static const struct { int H, K, T, W, full; } cs[] = {
        {2, 16, 19, 4, 1}, {3, 32, 5, 4, 0}, {1, 64, 2, 4, 1}, {2, 16, 7, 1, 0}, {2, 16, 3, 4, 1}};
    const df_backend *cu = df_backend_get("cuda");
    if (!cu) { CHECK(0, "KDA block: no cuda backend"); return; }
    enum { DM = 96 };
    int n_bad = 0, n_inv = 0, n_res = 0, n_multi = 0, n = 0;
    /* the checks of copies kept on the device: DF_CUDA_KV_MIRROR on with the default cap or one of 64 MiB and more
     * (off: every state through the host, the bitwise checks still hold) */
    unsigned long long kcap = 0;
    const int kon = df_cuda_env_kv_mirror(&kcap, NULL, 0) > 0 && (kcap == 0 || kcap >= (64ull << 20));
    df_cuda_set_cache_by_address(0); /* each case's weights, not a freed earlier case's at the same address */
    for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
        const int H = cs[ci].H, K = cs[ci].K, T = cs[ci].T, W = cs[ci].W, D = H * K, P = W - 1;
        df_weight wq = make_weight(DF_W_BF16, D, DM), wk = make_weight(DF_W_BF16, D, DM), wv = make_weight(DF_W_BF16, D, DM);
        df_weight fa = make_weight(DF_W_BF16, K, DM), fb = make_weight(DF_W_BF16, D, K), wb = make_weight(DF_W_BF16, H, DM);
        df_weight g = make_weight(DF_W_BF16, D, DM), ga = make_weight(DF_W_BF16, K, DM), gb = make_weight(DF_W_BF16, D, K);
        df_weight wo = make_weight(DF_W_BF16, DM, D);
        const size_t sn = (size_t)H * K * K, cn = (size_t)3 * P * D, rows = (size_t)T * D;
        float *h = malloc(4 * (size_t)T * DM), *cw = malloc(4 * 3 * (size_t)D * W), *A_log = malloc(4 * (size_t)H),
              *dt = malloc(4 * (size_t)D), *on = malloc(4 * (size_t)K), *S0 = malloc(4 * sn), *C0 = malloc(4 * cn + 4);
        for (int i = 0; i < T * DM; i++) h[i] = rndf();
        for (int i = 0; i < 3 * D * W; i++) cw[i] = 0.5f * rndf();
        for (int i = 0; i < H; i++) A_log[i] = rndf();
        for (int i = 0; i < D; i++) dt[i] = 0.5f * rndf();
        for (int i = 0; i < K; i++) on[i] = 1.0f + 0.2f * rndf();
        for (size_t i = 0; i < sn; i++) S0[i] = 0.1f * rndf();
        for (size_t i = 0; i < cn; i++) C0[i] = rndf();
        const df_kda_block b = {&wq, &wk, &wv, &fa, &fb, &wb, cs[ci].full ? &g : NULL, cs[ci].full ? NULL : &ga,
                                cs[ci].full ? NULL : &gb, &wo, cw, cw + (size_t)D * W, cw + 2 * (size_t)D * W, A_log, dt,
                                on, H, K, W, 1, 1, -5.0f, 1e-5f};
        /* the steps */
        float *q = malloc(4 * rows), *k = malloc(4 * rows), *v = malloc(4 * rows), *graw = malloc(4 * rows),
              *gate = malloc(4 * rows), *o = malloc(4 * rows), *f = malloc(4 * (size_t)T * K), *bl = malloc(4 * (size_t)T * H),
              *tmp = malloc(4 * (size_t)(P + 1) * D), *Sr = malloc(4 * sn), *Cr = malloc(4 * cn + 4),
              *outr = malloc(4 * (size_t)T * DM);
        memcpy(Sr, S0, 4 * sn); memcpy(Cr, C0, 4 * cn);
        cu->matmul(NULL, &wq, h, T, q); cu->matmul(NULL, &wk, h, T, k); cu->matmul(NULL, &wv, h, T, v);
        kda_short_conv(NULL, q, Cr, b.conv_q, T, D, W, tmp);
        kda_short_conv(NULL, k, Cr + (size_t)P * D, b.conv_k, T, D, W, tmp);
        kda_short_conv(NULL, v, Cr + 2 * (size_t)P * D, b.conv_v, T, D, W, tmp);
        cu->matmul(NULL, &fa, h, T, f); cu->matmul(NULL, &fb, f, T, graw); cu->matmul(NULL, &wb, h, T, bl);
        if (cs[ci].full) cu->matmul(NULL, &g, h, T, gate);
        else { cu->matmul(NULL, &ga, h, T, f); cu->matmul(NULL, &gb, f, T, gate); }
        df_kda_args a = {H, K, T, q, k, v, graw, bl, gate, A_log, dt, on, 1, 1, -5.0f, 1e-5f, Sr, o};
        for (int hh = 0; hh < H; hh++) kda_recur_head(&a, hh);
        cu->matmul(NULL, &wo, o, T, outr);
        /* one call */
        float *Sg = malloc(4 * sn), *Cg = malloc(4 * cn + 4), *outg = malloc(4 * (size_t)T * DM);
        memcpy(Sg, S0, 4 * sn); memcpy(Cg, C0, 4 * cn);
        const int rc = kda_block1(&b, T, h, 0, Cg, Sg, outg);
        n++;
        if (rc || memcmp(Sg, Sr, 4 * sn) || memcmp(Cg, Cr, 4 * cn) || memcmp(outg, outr, 4 * (size_t)T * DM)) {
            if (n_bad++ < 3)
                printf("FAIL kda block H=%d K=%d T=%d W=%d full=%d: rc %d, out[0] %a / %a, S[0] %a / %a\n", H, K, T, W,
                       cs[ci].full, rc, outg[0], outr[0], Sg[0], Sr[0]);
        }
        /* one row per call */
        float *S1 = malloc(4 * sn), *C1 = malloc(4 * cn + 4), *out1 = malloc(4 * (size_t)T * DM);
        memcpy(S1, S0, 4 * sn); memcpy(C1, C0, 4 * cn);
        int rc1 = 0;
        for (int t = 0; t < T && !rc1; t++)
            rc1 = kda_block1(&b, 1, h + (size_t)t * DM, 0, C1, S1, out1 + (size_t)t * DM);
        if (rc1 || memcmp(S1, Sg, 4 * sn) || memcmp(C1, Cg, 4 * cn) || memcmp(out1, outg, 4 * (size_t)T * DM))
            if (n_inv++ < 3) printf("FAIL kda block H=%d K=%d T=%d: one row per call differs from one call\n", H, K, T);
        /* the state kept on the device under a key: the host's untouched, the same output and (fetched) state, in one
         * call and row by row; a call that fails (declined at the start, or at o_proj after the state's kernels ran)
         * leaves it as it was and keeps no new copy; dropped and forgotten */
        const uint64_t uid = 1000 + ci, key1 = uid << 8 | 3, key2 = uid << 8 | 4, key3 = uid << 8 | 7;
        int rk = -2;
        if (kon) {
            memcpy(S1, S0, 4 * sn); memcpy(C1, C0, 4 * cn);
            rk = kda_block1(&b, T, h, key1, C1, S1, out1);
            int ok = rk == 1 && !memcmp(S1, S0, 4 * sn) && !memcmp(C1, C0, 4 * cn) && !memcmp(out1, outg, 4 * (size_t)T * DM);
            ok = ok && df_cuda_kda_state(key1, C1, S1, DF_KDA_FETCH) == 0 && !memcmp(S1, Sg, 4 * sn) && !memcmp(C1, Cg, 4 * cn);
            memcpy(S1, S0, 4 * sn); memcpy(C1, C0, 4 * cn);
            for (int t = 0; t < T && ok; t++)
                ok = kda_block1(&b, 1, h + (size_t)t * DM, key2, C1, S1, out1 + (size_t)t * DM) == 1 &&
                     !memcmp(S1, S0, 4 * sn);
            ok = ok && !memcmp(out1, outg, 4 * (size_t)T * DM);
            int nc = 0;
            uint64_t cbytes = 0;
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 2 && cbytes >= 4 * 4 * (sn + cn);
            df_weight bad_o = wo; /* in neither memory: the call fails at o_proj, after the state's kernels */
            bad_o.data = NULL;
            bad_o.dev_key = 0x7e57dead00000000ull | (uint64_t)ci;
            df_kda_block bf = b, bw = b; /* bw: another convolution width, declined before any kernel */
            bf.o = &bad_o;
            bw.W = W + 1;
            ok = ok && kda_block1(&bf, 1, h, key2, C1, S1, out1) == -1 && kda_block1(&bw, 1, h, key2, C1, S1, out1) == -1;
            ok = ok && kda_block1(&bf, 1, h, key3, C1, S1, out1) == -1 && !memcmp(S1, S0, 4 * sn);
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 2;
            ok = ok && df_cuda_kda_state(key2, C1, S1, DF_KDA_FETCH) == 0 && !memcmp(S1, Sg, 4 * sn) && !memcmp(C1, Cg, 4 * cn);
            ok = ok && df_cuda_kda_state(key3, C1, S1, DF_KDA_FETCH) == -1; /* no copy under key3: an error */
            ok = ok && df_cuda_kda_state(key2, NULL, NULL, DF_KDA_DROP) == 0;
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 1;
            df_cuda_seq_forget(0); /* every latent mirror, no KDA copy */
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 1;
            df_cuda_seq_forget(uid);
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 0 && cbytes == 0;
            if (!ok && n_res++ < 3) printf("FAIL kda block H=%d K=%d T=%d: with the state on the device (rc %d)\n", H, K, T, rk);
        }
        /* a snapshot on the device (the rollback of a draft's verification): the first t0 rows, DF_KDA_SNAP, the rest
         * (the same output and state as one call); DF_KDA_RESTORE, the rest again: the same bits again (twice); the
         * snapshot fetched is the state after t0 rows; a failing call leaves both; dropped: nothing to restore */
        if (kon && T >= 2) {
            const uint64_t key4 = uid << 8 | 9;
            const int t0 = T / 2;
            float *Sh = malloc(4 * sn), *Ch = malloc(4 * cn + 4), *outh = malloc(4 * (size_t)T * DM);
            memcpy(Sh, S0, 4 * sn); memcpy(Ch, C0, 4 * cn);
            int ok = kda_block1(&b, t0, h, 0, Ch, Sh, outh) == 0; /* the state after t0 rows, on the host */
            memcpy(S1, S0, 4 * sn); memcpy(C1, C0, 4 * cn);
            ok = ok && kda_block1(&b, t0, h, key4, C1, S1, out1) == 1 && df_cuda_kda_state(key4, NULL, NULL, DF_KDA_SNAP) == 0;
            int nc = 0;
            uint64_t cbytes = 0;
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 1 && cbytes >= 3 * 4 * (sn + cn);
            for (int round = 0; round < 3 && ok; round++) {
                if (round) ok = df_cuda_kda_state(key4, NULL, NULL, DF_KDA_RESTORE) == 0;
                memset(out1, 0, 4 * (size_t)T * DM);
                ok = ok && kda_block1(&b, T - t0, h + (size_t)t0 * DM, key4, C1, S1, out1) == 1 &&
                     !memcmp(out1, outg + (size_t)t0 * DM, 4 * (size_t)(T - t0) * DM) &&
                     df_cuda_kda_state(key4, C1, S1, DF_KDA_FETCH) == 0 && !memcmp(S1, Sg, 4 * sn) &&
                     !memcmp(C1, Cg, 4 * cn);
            }
            df_weight bad_o = wo;
            bad_o.data = NULL;
            bad_o.dev_key = 0x7e57beef00000000ull | (uint64_t)ci;
            df_kda_block bf = b;
            bf.o = &bad_o;
            ok = ok && kda_block1(&bf, 1, h, key4, C1, S1, out1) == -1;
            ok = ok && df_cuda_kda_state(key4, C1, S1, DF_KDA_FETCH_SNAP) == 0 && !memcmp(S1, Sh, 4 * sn) &&
                 !memcmp(C1, Ch, 4 * cn);
            memset(S1, 0, 4 * sn);
            ok = ok && df_cuda_kda_state(key4, NULL, NULL, DF_KDA_RESTORE) == 0 &&
                 df_cuda_kda_state(key4, C1, S1, DF_KDA_FETCH) == 0 && !memcmp(S1, Sh, 4 * sn) && !memcmp(C1, Ch, 4 * cn);
            ok = ok && df_cuda_kda_state(key4, NULL, NULL, DF_KDA_DROP) == 0 &&
                 df_cuda_kda_state(key4, NULL, NULL, DF_KDA_RESTORE) == -1 &&
                 df_cuda_kda_state(key4, NULL, NULL, DF_KDA_SNAP) == -1;
            df_cuda_kda_copies(&nc, &cbytes);
            ok = ok && nc == 0 && cbytes == 0;
            if (!ok && n_res++ < 3) printf("FAIL kda block H=%d K=%d T=%d: the device's snapshot\n", H, K, T);
            free(Sh); free(Ch); free(outh);
        }
        /* four sequences in one call (rows T, 1, 0 and T - 1 of another h, other starting states; with copies on the
         * first, third and fourth kept on the device, the second through the host) against each alone: the same output
         * rows and states, the kept ones' host states untouched until fetched */
        if (T >= 2) {
            enum { NS = 4 };
            const int Tm[NS] = {T, 1, 0, T - 1};
            float *Sm[NS], *Cm[NS], *Sa[NS], *Ca[NS], *Sz[NS];
            float *outm = malloc(4 * (size_t)(2 * T) * DM), *outa = malloc(4 * (size_t)(2 * T) * DM);
            float *hm = malloc(4 * (size_t)(2 * T) * DM);
            for (int i = 0; i < 2 * T * DM; i++) hm[i] = rndf();
            for (int j = 0; j < NS; j++) {
                Sm[j] = malloc(4 * sn); Cm[j] = malloc(4 * cn + 4); Sa[j] = malloc(4 * sn); Ca[j] = malloc(4 * cn + 4);
                Sz[j] = malloc(4 * sn);
                for (size_t i = 0; i < sn; i++) Sm[j][i] = Sa[j][i] = Sz[j][i] = 0.1f * rndf();
                for (size_t i = 0; i < cn; i++) Cm[j][i] = Ca[j][i] = rndf();
            }
            const uint64_t km[NS] = {uid << 8 | 5, 0, uid << 8 | 8, uid << 8 | 6};
            unsigned char kept[NS] = {9, 9, 9, 9};
            int okm = df_cuda_kda_block(&b, NS, Tm, hm, km, Cm, Sm, outm, kept) == 0;
            for (int j = 0; j < NS && okm; j++) okm = kept[j] == (kon && km[j] != 0);
            size_t r = 0;
            for (int j = 0; j < NS && okm; j++) {
                okm = Tm[j] == 0 || kda_block1(&b, Tm[j], hm + r * DM, 0, Ca[j], Sa[j], outa + r * DM) == 0;
                r += (size_t)Tm[j];
            }
            okm = okm && !memcmp(outm, outa, 4 * (size_t)(2 * T) * DM);
            for (int j = 0; j < NS && okm; j++)
                if (kept[j])
                    okm = !memcmp(Sm[j], Sz[j], 4 * sn) && df_cuda_kda_state(km[j], Cm[j], Sm[j], DF_KDA_FETCH) == 0;
            for (int j = 0; j < NS && okm; j++) okm = !memcmp(Sm[j], Sa[j], 4 * sn) && !memcmp(Cm[j], Ca[j], 4 * cn);
            df_cuda_seq_forget(uid);
            if (!okm && n_multi++ < 3) printf("FAIL kda block H=%d K=%d T=%d: four sequences in one call\n", H, K, T);
            for (int j = 0; j < NS; j++) { free(Sm[j]); free(Cm[j]); free(Sa[j]); free(Ca[j]); free(Sz[j]); }
            free(outm); free(outa); free(hm);
        }
        df_weight *ws[] = {&wq, &wk, &wv, &fa, &fb, &wb, &g, &ga, &gb, &wo};
        for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) free((void *)ws[i]->data);
        free(h); free(cw); free(A_log); free(dt); free(on); free(S0); free(C0); free(q); free(k); free(v); free(graw);
        free(gate); free(o); free(f); free(bl); free(tmp); free(Sr); free(Cr); free(outr); free(Sg); free(Cg); free(outg);
        free(S1); free(C1); free(out1);
    }
    df_cuda_set_cache_by_address(1);
    CHECK(n_bad == 0, "KDA block: %d of %d cases differ from its steps", n_bad, n);
    CHECK(n_inv == 0, "KDA block: %d of %d cases differ between one call and one row per call", n_inv, n);
    CHECK(n_res == 0, "KDA block: %d of %d cases wrong with the state kept on the device", n_res, n);
    CHECK(n_multi == 0, "KDA block: %d of %d cases differ between four sequences in one call and each alone", n_multi, n);
    /* a head size whose state does not fit a block's shared memory: declined, state and conv state untouched */
    df_weight one_w = make_weight(DF_W_BF16, 1, 1);
    float one = 1.0f, conv1 = 2.0f, outv = 3.0f;
    const df_kda_block big = {&one_w, &one_w, &one_w, &one_w, &one_w, &one_w, &one_w, NULL, NULL, &one_w, &one, &one,
                              &one, &one, &one, &one, 1, 256, 2, 1, 1, -5.0f, 1e-5f};
    CHECK(kda_block1(&big, 1, &one, 0, &conv1, &one, &outv) == -1 && one == 1.0f && conv1 == 2.0f,
          "KDA block: K = 256 declined, state and conv state untouched");
    free((void *)one_w.data);
}

/* The MoE routed on the device by the block (df_mla_block.moe): every one of BE MXFP4 experts resident (dev_load), a
 * bf16 shared expert started by the block; the call returns without waiting (its x_out / h2 / logits unwritten) and
 * the next block given x NULL then continues bitwise as the host path does (the block's logits routed by moe_route,
 * moe_resid with those picks, the next block given x NULL), the cache rows of both calls in the host arrays after it;
 * the picks come back through df_cuda_moe_routed after the next call. A layer missing one expert is declined (queued
 * 0, the outputs written). */
static void test_moe_route_block(void) {
    enum { BI = 64, K = 4, LAYER = 3 };
    const float eps = 1e-5f, leps = 1e-6f;
    df_weight qa = make_weight(DF_W_BF16, BR, BD), qb = make_weight(DF_W_BF16, BH * BQD, BR);
    df_weight kva = make_weight(DF_W_BF16, BKVL + BDR, BD), kvb = make_weight(DF_W_BF16, BH * (BDN + BDV), BKVL);
    df_weight ow = make_weight(DF_W_BF16, BD, BH * BDV), rw = make_weight(DF_W_BF16, BE, BD);
    static float an[BD], fn[BD], qan[BR], kvn[BKVL], bias[BE];
    for (int i = 0; i < BD; i++) { an[i] = 0.5f + rndf(); fn[i] = 0.5f + rndf(); }
    for (int i = 0; i < BR; i++) qan[i] = 0.5f + rndf();
    for (int i = 0; i < BKVL; i++) kvn[i] = 0.5f + rndf();
    for (int i = 0; i < BE; i++) bias[i] = 0.05f * rndf();
    const uint64_t key = 0x7a11;
    df_weight g[BE + 1], u[BE + 1], d[BE + 1];
    int loaded = 0;
    for (int i = 0; i <= BE; i++) {
        const df_wtype t = i < BE ? DF_W_MXFP4 : DF_W_BF16;
        g[i] = make_weight(t, BI, BD);
        u[i] = make_weight(t, BI, BD);
        d[i] = make_weight(t, BD, BI);
        if (i < BE) {
            g[i].dev_key = DF_DEVKEY(0, LAYER, i, 0); u[i].dev_key = DF_DEVKEY(0, LAYER, i, 1); d[i].dev_key = DF_DEVKEY(0, LAYER, i, 2);
            loaded += !df_cuda_dev_load(&g[i]) + !df_cuda_dev_load(&u[i]) + !df_cuda_dev_load(&d[i]);
        }
    }
    CHECK(loaded == 3 * BE, "dev_load of the %d experts: %d of %d matrices resident", BE, loaded, 3 * BE);
    df_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.n_routed_experts = BE;
    cfg.num_experts_per_tok = K;
    cfg.n_group = 4;
    cfg.topk_group = 2;
    cfg.norm_topk_prob = 1;
    cfg.arch = DF_ARCH_DEEPSEEK;
    cfg.routed_scaling_factor = 2.5f;
    df_moe_dev md = {0, LAYER, BE, K, 4, 2, 1, 2.5f, bias, 0, 0.0f, 0.0f, 1, 0, 0};
    df_mla_block b = {an, fn, eps, &qa, &qb, NULL, &kva, &kvb, &ow, &rw, qan, kvn, leps, BH, BDN, BDR, BDV, BKVL, 0.125f,
                      key, &g[BE], &u[BE], &d[BE], 0, 0.0f, 0.0f, NULL};
    const df_mla_block b0 = {an, fn, eps, &qa, &qb, NULL, &kva, &kvb, &ow, &rw, qan, kvn, leps, BH, BDN, BDR, BDV, BKVL,
                             0.125f, key, NULL, NULL, NULL, 0, 0.0f, 0.0f, NULL};
    static float c1[BNC * BKVL], p1[BNC * BDR], c2[BNC * BKVL], p2[BNC * BDR];
    for (int i = 0; i < BNC * BKVL; i++) c1[i] = c2[i] = rndf();
    for (int i = 0; i < BNC * BDR; i++) p1[i] = p2[i] = rndf();
    float *cp1 = c1, *pp1 = p1, *cp2 = c2, *pp2 = p2;
    float x[BD], cs[2 * BDR], cs2[BDR], xo[BD], h2[BD], lg[BE], xo2[BD], h2b[BD], lgb[BE];
    for (int i = 0; i < BD; i++) x[i] = rndf();
    for (int i = 0; i < 2 * BDR; i++) cs[i] = 1.2f * rndf();
    for (int i = 0; i < BDR; i++) cs2[i] = cs[BDR + i];
    const int np1 = 10, np2 = 11;
    df_cuda_stats st0, st1;
    df_cuda_get_stats(&st0);
    /* the device path: block (routes and runs the MoE), then the next block from the device residual */
    b.moe = &md;
    int rc = df_cuda_mla_block(&b, 1, x, cs, &cp1, &pp1, &np1, NULL, xo, h2, lg);
    const int queued = md.queued;
    float x2[BD], h22[BD], lg2[BE], x3[BD], h23[BD], lg3[BE];
    rc |= df_cuda_mla_block(&b0, 1, NULL, cs2, &cp1, &pp1, &np2, NULL, x2, h22, lg2);
    df_cuda_get_stats(&st1);
    int dids[16] = {0}, got = df_cuda_moe_routed(key, LAYER, dids), again = df_cuda_moe_routed(key, LAYER, dids + 8);
    /* the host path on the other cache copy */
    b.moe = NULL;
    rc |= df_cuda_mla_block(&b, 1, x, cs, &cp2, &pp2, &np1, NULL, xo2, h2b, lgb);
    int hid[16];
    float hw[16];
    host_route_sorted(&cfg, lgb, bias, hid, hw);
    const df_weight *gp[K + 1], *up[K + 1], *dp[K + 1];
    for (int i = 0; i < K; i++) { gp[i] = &g[hid[i]]; up[i] = &u[hid[i]]; dp[i] = &d[hid[i]]; }
    gp[K] = &g[BE]; up[K] = &u[BE]; dp[K] = &d[BE];
    rc |= df_cuda_moe_resid(K + 1, gp, up, dp, 0, 0, 0, h2b, hw, 1, key);
    rc |= df_cuda_mla_block(&b0, 1, NULL, cs2, &cp2, &pp2, &np2, NULL, x3, h23, lg3);
    CHECK(rc == 0 && queued == 1, "device-routed MoE: rc %d, queued %d (%s)", rc, queued, df_cuda_last_error());
    CHECK(st1.dev_routed - st0.dev_routed == 1 && st1.shared_early - st0.shared_early == 1,
          "device-routed MoE: %llu routed, %llu started shared experts taken (want 1, 1)",
          (unsigned long long)(st1.dev_routed - st0.dev_routed), (unsigned long long)(st1.shared_early - st0.shared_early));
    CHECK(got == 1 && again == 0 && !memcmp(dids, hid, sizeof(int) * K),
          "device-routed MoE: moe_routed %d then %d, picks %d %d %d %d, host %d %d %d %d", got, again, dids[0], dids[1],
          dids[2], dids[3], hid[0], hid[1], hid[2], hid[3]);
    CHECK(!memcmp(x2, x3, sizeof x2) && !memcmp(h22, h23, sizeof h22) && !memcmp(lg2, lg3, sizeof lg2) &&
              !memcmp(c1, c2, sizeof c1) && !memcmp(p1, p2, sizeof p1),
          "device-routed MoE + mla_block(x NULL) differs from moe_route + moe_resid + mla_block(x NULL)");
    /* one expert gone: declined, the host path's logits still returned */
    df_cuda_cache_clear();
    for (int i = 1; i < BE; i++) { df_cuda_dev_load(&g[i]); df_cuda_dev_load(&u[i]); df_cuda_dev_load(&d[i]); }
    b.moe = &md;
    rc = df_cuda_mla_block(&b, 1, x, cs, &cp1, &pp1, &np1, NULL, xo, h2, lg);
    CHECK(rc == 0 && md.queued == 0 && !memcmp(lg, lgb, sizeof lg), "device-routed MoE with expert 0 missing: rc %d, queued %d",
          rc, md.queued);
    for (int i = 0; i <= BE; i++) { free_weight(&g[i]); free_weight(&u[i]); free_weight(&d[i]); }
    free_weight(&qa); free_weight(&qb); free_weight(&kva); free_weight(&kvb); free_weight(&ow); free_weight(&rw);
    df_cuda_cache_clear();
}

/* A dense layer's MLP run by the block (df_mla_block.moe with K = 0, the MLP started as the shared expert), then the
 * final norm and lm_head from the device residual (df_cuda_final_logits with x NULL): bitwise the host path (the
 * block, df_cuda_mlp on its h2, x_out + out on the host, the final op on those rows); and final_logits of three rows
 * at once bitwise each row alone. */
static void test_dense_final(void) {
    enum { BI = 96, V = 80 };
    const float eps = 1e-5f, leps = 1e-6f;
    df_weight qa = make_weight(DF_W_BF16, BR, BD), qb = make_weight(DF_W_BF16, BH * BQD, BR);
    df_weight kva = make_weight(DF_W_BF16, BKVL + BDR, BD), kvb = make_weight(DF_W_BF16, BH * (BDN + BDV), BKVL);
    df_weight ow = make_weight(DF_W_BF16, BD, BH * BDV), lm = make_weight(DF_W_BF16, V, BD);
    df_weight g = make_weight(DF_W_BF16, BI, BD), u = make_weight(DF_W_BF16, BI, BD), d = make_weight(DF_W_BF16, BD, BI);
    static float an[BD], fn[BD], qan[BR], kvn[BKVL], fin[BD];
    for (int i = 0; i < BD; i++) { an[i] = 0.5f + rndf(); fn[i] = 0.5f + rndf(); fin[i] = 0.5f + rndf(); }
    for (int i = 0; i < BR; i++) qan[i] = 0.5f + rndf();
    for (int i = 0; i < BKVL; i++) kvn[i] = 0.5f + rndf();
    const uint64_t key = 0xde45e;
    df_moe_dev md = {0, 5, 0, 0, 0, 0, 0, 0.0f, NULL, 0, 0.0f, 0.0f, 1, 0, 0};
    df_mla_block b = {an, fn, eps, &qa, &qb, NULL, &kva, &kvb, &ow, NULL, qan, kvn, leps, BH, BDN, BDR, BDV, BKVL, 0.125f,
                      key, &g, &u, &d, 0, 0.0f, 0.0f, &md};
    df_mla_block b0 = b;
    b0.sh_gate = b0.sh_up = b0.sh_down = NULL;
    b0.moe = NULL;
    static float c1[BNC * BKVL], p1[BNC * BDR], c2[BNC * BKVL], p2[BNC * BDR];
    for (int i = 0; i < BNC * BKVL; i++) c1[i] = c2[i] = rndf();
    for (int i = 0; i < BNC * BDR; i++) p1[i] = p2[i] = rndf();
    float *cp1 = c1, *pp1 = p1, *cp2 = c2, *pp2 = p2;
    float x[BD], cs[BDR], xo[BD], h2[BD], xo2[BD], h2b[BD], mo[BD], lg1[V], lg2[V];
    for (int i = 0; i < BD; i++) x[i] = rndf();
    for (int i = 0; i < BDR; i++) cs[i] = 1.2f * rndf();
    const int np = 7;
    int rc = df_cuda_mla_block(&b, 1, x, cs, &cp1, &pp1, &np, NULL, xo, h2, NULL);
    const int queued = md.queued;
    rc |= df_cuda_final_logits(NULL, 1, key, fin, eps, &lm, lg1);
    rc |= df_cuda_mla_block(&b0, 1, x, cs, &cp2, &pp2, &np, NULL, xo2, h2b, NULL);
    rc |= df_cuda_mlp(&g, &u, &d, 0, 0.0f, 0.0f, h2b, 1, mo);
    for (int i = 0; i < BD; i++) xo2[i] += mo[i];
    rc |= df_cuda_final_logits(xo2, 1, 0, fin, eps, &lm, lg2);
    CHECK(rc == 0 && queued == 1, "dense MLP by the block: rc %d, queued %d (%s)", rc, queued, df_cuda_last_error());
    CHECK(!memcmp(lg1, lg2, sizeof lg1) && !memcmp(c1, c2, sizeof c1) && !memcmp(p1, p2, sizeof p1),
          "dense MLP by the block + final_logits(device residual) differs from the host path");
    float xs3[3 * BD], l3[3 * V], l1[V];
    for (int i = 0; i < 3 * BD; i++) xs3[i] = rndf();
    rc = df_cuda_final_logits(xs3, 3, 0, fin, eps, &lm, l3);
    int same = 1;
    for (int t = 0; t < 3; t++) {
        rc |= df_cuda_final_logits(xs3 + t * BD, 1, 0, fin, eps, &lm, l1);
        same &= !memcmp(l1, l3 + t * V, sizeof l1);
    }
    CHECK(rc == 0 && same, "final_logits: three rows at once differ from each row alone");
    free_weight(&qa); free_weight(&qb); free_weight(&kva); free_weight(&kvb); free_weight(&ow); free_weight(&lm);
    free_weight(&g); free_weight(&u); free_weight(&d);
    df_cuda_cache_clear();
}

int main(void) {
    char why[300];
    if (!df_cuda_probe(why, sizeof why)) {
        printf("test_cuda_kernels: skipped: %s\n", why);
        t_done();
        return 77; /* CTest: skipped (SKIP_RETURN_CODE) */
    }
    char desc[160];
    df_cuda_describe(desc, sizeof desc);
    printf("test_cuda_kernels: %s\n", desc);
    test_decode_exact();
    test_matmul();
    test_cache();
    test_mlp();
    test_mlp_group();
    test_mlp_group_mma();
    test_mla_project();
    test_ops();
    test_mla_attend();
    test_mla_mirror();
    test_matmul2();
    test_mla_block();
    test_moe_resid();
    test_route();
    test_kda();
    test_kda_block();
    test_moe_route_block();
    test_dense_final();
    return t_done();
}
