/* test_kernels.c — every kernel op of every backend this CPU runs, against the
 * scalar reference (and the scalar reference against hand-computed values). */
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kernels/cpu/cpu_internal.h"
#include "test_util.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float rndf(void) { return (float)((rnd() >> 8) / 16777216.0 * 2.0 - 1.0); }

/* Build a random weight of type t (arrays malloc'd; freed by caller). */
static df_weight make_weight(df_wtype t, int64_t rows, int64_t cols) {
    df_weight w = {t, rows, cols, NULL, NULL, 0};
    size_t n = (size_t)(rows * cols);
    switch (t) {
    case DF_W_F32: { float *d = malloc(n * 4); for (size_t i = 0; i < n; i++) d[i] = rndf(); w.data = d; break; }
    case DF_W_BF16: case DF_W_F16: {
        uint16_t *d = malloc(n * 2);
        for (size_t i = 0; i < n; i++) {
            if (t == DF_W_BF16) { float f = rndf(); uint32_t u; memcpy(&u, &f, 4); d[i] = (uint16_t)(u >> 16); }
            else d[i] = (uint16_t)((rnd() & 0x83ff) | ((8 + rnd() % 10) << 10)); /* normal halves ~[2^-7, 2^2] */
        }
        if (t == DF_W_F16) d[0] = 0x0001; /* a subnormal */
        w.data = d; break;
    }
    case DF_W_FP8_B128: {
        uint8_t *d = malloc(n);
        for (size_t i = 0; i < n; i++) { d[i] = (uint8_t)rnd(); if ((d[i] & 0x7f) == 0x7f) d[i] = 0x3f; }
        size_t ns = (size_t)(((rows + 127) / 128) * ((cols + 127) / 128));
        float *s = malloc(ns * 4);
        for (size_t i = 0; i < ns; i++) s[i] = 0.01f + 0.001f * (float)i;
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
        for (size_t i = 0; i < n / 32; i++) s[i] = (uint8_t)(120 + rnd() % 10);
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

static void test_known_values(void) {
    const df_backend *sc = df_backend_get("cpu-scalar");
    float out[64];
    /* MXFP4: low nibble = even element; byte 0x72 -> elements 1.0 (code 2), 6.0 (code 7); scale 2^(128-127) = 2 */
    uint8_t d4[16] = {0x72, 0x9f}, s4[1] = {128};
    df_weight w = {DF_W_MXFP4, 1, 32, d4, s4, 0};
    sc->decode_row(&w, 0, out);
    CHECK(out[0] == 2.0f && out[1] == 12.0f && out[2] == -12.0f && out[3] == -1.0f && out[4] == 0.0f,
          "mxfp4 %g %g %g %g", out[0], out[1], out[2], out[3]);
    /* INT4 g32: nibble j of word = element j (LSB first), value nibble-8, bf16 scale 0.5 (0x3f00) */
    uint32_t d5[4] = {0x0000F098u, 0x88888888u, 0x88888888u, 0x88888888u};
    uint16_t s5[1] = {0x3f00};
    df_weight w5 = {DF_W_INT4_G32, 1, 32, d5, s5, 0};
    sc->decode_row(&w5, 0, out);
    CHECK(out[0] == 0.0f && out[1] == 0.5f && out[2] == -4.0f && out[3] == 3.5f && out[4] == -4.0f && out[8] == 0.0f,
          "int4 %g %g %g %g %g", out[0], out[1], out[2], out[3], out[4]);
    /* FP8 e4m3fn: 0x38 = 1.0, 0x01 = 2^-9, 0xc0 = -2.0, 0x7e = 448 */
    CHECK(df_fp8e4m3_to_f32(0x38) == 1.0f && df_fp8e4m3_to_f32(0x01) == ldexpf(1, -9) &&
          df_fp8e4m3_to_f32(0xc0) == -2.0f && df_fp8e4m3_to_f32(0x7e) == 448.0f && isnan(df_fp8e4m3_to_f32(0x7f)),
          "fp8 table");
    CHECK(df_f16_to_f32(0x3c00) == 1.0f && df_f16_to_f32(0x0001) == ldexpf(1, -24) && df_f16_to_f32(0xc000) == -2.0f, "f16");
    CHECK(df_bf16_to_f32(0x3f80) == 1.0f && df_e8m0_to_f32(127) == 1.0f && df_e8m0_to_f32(130) == 8.0f, "bf16/e8m0");
    /* rmsnorm / silu / softmax */
    float x[4] = {1, 2, 3, 4}, wn[4] = {1, 1, 1, 2}, o[4];
    sc->rmsnorm(o, x, wn, 4, 0.0f);
    CHECK_NEAR(o[3], 8.0 / sqrt(7.5), 1e-6, "rmsnorm");
    float g[2] = {1.0f, -2.0f}, u[2] = {2.0f, 3.0f};
    sc->silu_mul(o, g, u, 2);
    CHECK_NEAR(o[0], 2.0 / (1.0 + exp(-1.0)), 1e-6, "silu");
    CHECK_NEAR(o[1], 3.0 * -2.0 / (1.0 + exp(2.0)), 1e-6, "silu neg");
    float sm[3] = {1, 2, 3};
    sc->softmax(sm, 3);
    CHECK_NEAR(sm[2], exp(3.0) / (exp(1.0) + exp(2.0) + exp(3.0)), 1e-6, "softmax");
}

static void test_backends(void) {
    const df_backend *list[8];
    int nb = df_backend_list(list, 8);
    printf("cpu features: %s; backends:", df_cpu_features());
    for (int i = 0; i < nb; i++) printf(" %s", list[i]->name);
    printf("\n");
    const df_backend *sc = df_backend_get("cpu-scalar");
    df_pool *pool = df_pool_new(2);
    const int64_t rows = 131;
    for (int t = 0; t < DF_W__COUNT; t++) {
        int64_t cols = (t == DF_W_INT4_G32 || t == DF_W_MXFP4) ? 96 : 101;
        df_weight w = make_weight((df_wtype)t, rows, cols);
        for (int T = 1; T <= 5; T += 2) {
            float *x = malloc(sizeof(float) * T * cols), *yref = malloc(sizeof(float) * T * rows),
                  *y = malloc(sizeof(float) * T * rows), *row = malloc(sizeof(float) * cols);
            for (int64_t i = 0; i < T * cols; i++) x[i] = rndf();
            /* reference in double from the scalar decoder */
            double maxref = 0;
            for (int64_t r = 0; r < rows; r++) {
                sc->decode_row(&w, r, row);
                for (int k = 0; k < T; k++) {
                    double s = 0;
                    for (int64_t c = 0; c < cols; c++) s += (double)row[c] * x[k * cols + c];
                    yref[k * rows + r] = (float)s;
                    if (fabs(s) > maxref) maxref = fabs(s);
                }
            }
            for (int b = 0; b < nb; b++) {
                list[b]->matmul(pool, &w, x, T, y);
                double md = 0;
                for (int64_t i = 0; i < T * rows; i++) md = fmax(md, fabs((double)y[i] - yref[i]));
                CHECK(md <= 1e-5 * (1 + maxref), "%s matmul type %d%s T=%d maxdiff %g (scale %g)", list[b]->name, t,
                      "", T, md, maxref);
                if (T > 1) { /* each token alone (T=1) gives bit-identical results */
                    int same = 1;
                    float *y1 = malloc(sizeof(float) * rows);
                    for (int k = 0; k < T; k++) {
                        list[b]->matmul(pool, &w, x + (int64_t)k * cols, 1, y1);
                        same &= !memcmp(y1, y + (int64_t)k * rows, sizeof(float) * rows);
                    }
                    CHECK(same, "%s type %d: T=1 results differ from the T=%d batch", list[b]->name, t, T);
                    free(y1);
                }
                if (T == 1) {
                    float *row2 = malloc(sizeof(float) * cols);
                    int same = 1;
                    for (int64_t r = 0; r < rows; r++) {
                        sc->decode_row(&w, r, row);
                        list[b]->decode_row(&w, r, row2);
                        for (int64_t c = 0; c < cols; c++) if (row[c] != row2[c]) same = 0; /* -0 == +0 */
                    }
                    CHECK(same, "%s decode_row type %d differs from scalar", list[b]->name, t);
                    free(row2);
                }
            }
            free(x); free(yref); free(y); free(row);
        }
        free((void *)w.data); free((void *)w.scale);
    }
    /* dot / axpy / norms on every backend */
    float a[77], bb[77], y1[77], y2[77], o1[77], o2[77], wn[77];
    for (int i = 0; i < 77; i++) { a[i] = rndf(); bb[i] = rndf(); y1[i] = y2[i] = rndf(); wn[i] = rndf(); }
    for (int b = 0; b < nb; b++) {
        CHECK_NEAR(list[b]->dot(a, bb, 77), sc->dot(a, bb, 77), 1e-5, list[b]->name);
        memcpy(y2, y1, sizeof y1);
        list[b]->axpy(y2, 0.5f, a, 77);
        double md = 0;
        for (int i = 0; i < 77; i++) md = fmax(md, fabs(y2[i] - (y1[i] + 0.5f * a[i])));
        CHECK(md < 1e-6, "%s axpy %g", list[b]->name, md);
        sc->rmsnorm(o1, a, wn, 77, 1e-6f); list[b]->rmsnorm(o2, a, wn, 77, 1e-6f);
        CHECK(!memcmp(o1, o2, sizeof o1), "%s rmsnorm", list[b]->name);
        sc->silu_mul(o1, a, bb, 77); list[b]->silu_mul(o2, a, bb, 77);
        CHECK(!memcmp(o1, o2, sizeof o1), "%s silu_mul", list[b]->name);
        memcpy(o1, a, sizeof a); memcpy(o2, a, sizeof a);
        sc->softmax(o1, 77); list[b]->softmax(o2, 77);
        CHECK(!memcmp(o1, o2, sizeof o1), "%s softmax", list[b]->name);
    }
    df_pool_free(pool);
}

/* attn_scores / attn_values of every backend that has them: the bits of the dot / axpy expressions they stand for
 * (df_backend docs), over head counts, widths (with tails) and position counts around the 16-position blocks. */
static void test_attention_ops(void) {
    const df_backend *list[8];
    const int nb = df_backend_list(list, 8);
    const int64_t widths[][2] = {{64, 16}, {512, 64}, {48, 8}, {37, 5}, {96, 32}, {16, 3}};
    const int heads[] = {1, 3, 4, 8}, npos_list[] = {1, 15, 16, 17, 47, 100};
    for (int b = 0; b < nb; b++) {
        const df_backend *be = list[b];
        if (!be->attn_scores && !be->attn_values) continue;
        int bad_s = 0, bad_v = 0, took_s = 0, took_v = 0;
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++)
                for (size_t pi = 0; pi < sizeof npos_list / sizeof npos_list[0]; pi++) {
                    const int64_t n1 = widths[wi][0], n2 = widths[wi][1], npos = npos_list[pi], ldp = npos + 3;
                    const int H = heads[hi];
                    const int64_t ldq = n1 + n2 + 5;
                    float *q = malloc(sizeof(float) * (size_t)(H * ldq)), *c = malloc(sizeof(float) * (size_t)(npos * n1)),
                          *k = malloc(sizeof(float) * (size_t)(npos * n2)), *p = malloc(sizeof(float) * (size_t)(H * ldp)),
                          *pr = malloc(sizeof(float) * (size_t)(H * ldp)), *o = malloc(sizeof(float) * (size_t)(H * (n1 + 2))),
                          *orf = malloc(sizeof(float) * (size_t)(H * (n1 + 2)));
                    for (int64_t i = 0; i < H * ldq; i++) q[i] = rndf();
                    for (int64_t i = 0; i < npos * n1; i++) c[i] = rndf();
                    for (int64_t i = 0; i < npos * n2; i++) k[i] = rndf();
                    const float scale = 0.125f;
                    if (be->attn_scores && be->attn_scores(q, ldq, q + n1, ldq, H, c, n1, k, n2, npos, scale, p, ldp) == 0) {
                        took_s++;
                        for (int h = 0; h < H; h++)
                            for (int64_t s = 0; s < npos; s++) {
                                pr[h * ldp + s] = (be->dot(q + h * ldq, c + s * n1, n1) + be->dot(q + h * ldq + n1, k + s * n2, n2)) * scale;
                                bad_s += memcmp(&pr[h * ldp + s], &p[h * ldp + s], 4) != 0;
                            }
                    }
                    for (int64_t i = 0; i < H * ldp; i++) p[i] = rndf();
                    for (int64_t i = 0; i < H * (n1 + 2); i++) o[i] = orf[i] = rndf();
                    if (be->attn_values && be->attn_values(p, ldp, H, c, n1, npos, o, n1 + 2) == 0) {
                        took_v++;
                        for (int64_t s = 0; s < npos; s++)
                            for (int h = 0; h < H; h++) be->axpy(orf + h * (n1 + 2), p[h * ldp + s], c + s * n1, n1);
                        bad_v += memcmp(o, orf, sizeof(float) * (size_t)(H * (n1 + 2))) != 0;
                    }
                    free(q); free(c); free(k); free(p); free(pr); free(o); free(orf);
                }
        CHECK(bad_s == 0, "%s attn_scores: %d values differ from the dot expression", be->name, bad_s);
        CHECK(bad_v == 0, "%s attn_values: %d cases differ from the axpy calls", be->name, bad_v);
        CHECK(took_s > 0 && took_v > 0, "%s: attention ops took %d / %d shapes", be->name, took_s, took_v);
    }
}

/* cpu_expf against libm's expf (the same values on glibc: the same algorithm; checked on a stride through every
 * float), and every SIMD backend's softmax against the scalar one, bit for bit (NaN payloads aside), on arrays with
 * special values and long runs. */
static void test_softmax_exp(void) {
#ifdef __GLIBC__
    uint64_t diff = 0, n = 0;
    for (uint64_t u = 0; u <= 0xffffffffull; u += 9973) {
        const uint32_t b = (uint32_t)u;
        float x, a, c;
        memcpy(&x, &b, 4);
        if (isnan(x)) continue;
        a = expf(x);
        c = cpu_expf(x);
        n++;
        diff += memcmp(&a, &c, 4) != 0;
    }
    CHECK(diff == 0, "cpu_expf differs from libm expf on %llu of %llu floats", (unsigned long long)diff, (unsigned long long)n);
#endif
    const float specials[] = {-INFINITY, INFINITY, NAN, -88.5f, -103.0f, -104.0f, -150.0f, 88.5f, 0.0f, -0.0f, 1e-30f, -1e-30f};
    const df_backend *list[8];
    const int nb = df_backend_list(list, 8);
    const df_backend *sc = df_backend_get("cpu-scalar");
    for (int b = 0; b < nb; b++) {
        if (list[b] == sc) continue;
        int bad = 0;
        for (int rep = 0; rep < 400; rep++) {
            const int len = 1 + (int)(rnd() % 700);
            float *a1 = malloc(sizeof(float) * (size_t)len), *a2 = malloc(sizeof(float) * (size_t)len);
            for (int i = 0; i < len; i++) {
                float v = rndf() * (float)(1 + rep % 9) * 30.0f;
                if (rep % 5 == 0 && rnd() % 13 == 0) v = specials[rnd() % (sizeof specials / sizeof specials[0])];
                a1[i] = a2[i] = v;
            }
            sc->softmax(a1, len);
            list[b]->softmax(a2, len);
            for (int i = 0; i < len; i++)
                if (!(isnan(a1[i]) && isnan(a2[i])) && memcmp(&a1[i], &a2[i], 4)) { bad++; break; }
            free(a1); free(a2);
        }
        CHECK(bad == 0, "%s softmax: %d of 400 arrays differ from cpu-scalar's", list[b]->name, bad);
    }
}

/* The pool covers every index exactly once. */
static void count_task(void *ctx, int64_t b, int64_t e, int tid) {
    int *hits = ctx;
    for (int64_t i = b; i < e; i++) __atomic_fetch_add(&hits[i], 1, __ATOMIC_RELAXED);
}
static void test_pool(void) {
    df_pool *p = df_pool_new(3);
    int hits[1000] = {0};
    for (int rep = 0; rep < 50; rep++) df_pool_run(p, 1000, 7, count_task, hits);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= hits[i] == 50;
    CHECK(ok, "pool coverage");
    df_pool_free(p);
}

/* DF_BENCH=1: one-token and 8-token matmul speed on a Kimi K2 expert matrix (2048 x 7168)
 * in MXFP4 and bf16 for every backend (figures for bench/RESULTS.md; not a test). */
#include <time.h>
static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void bench(void) {
    const char *th = getenv("DF_BENCH_THREADS");
    df_pool *p = df_pool_new(th ? atoi(th) : 0);
    const df_backend *list[8];
    int nb = df_backend_list(list, 8);
    const int64_t R = 2048, C = 7168;
    printf("bench: %d threads, cpu %s\n", df_pool_threads(p), df_cpu_features());
    for (int ty = 0; ty < 2; ty++) {
        df_weight w = make_weight(ty ? DF_W_BF16 : DF_W_MXFP4, R, C);
        float *x = malloc(sizeof(float) * C * 8), *y = malloc(sizeof(float) * R * 8);
        for (int64_t i = 0; i < C * 8; i++) x[i] = rndf();
        for (int b = 0; b < nb; b++)
            for (int T = 1; T <= 8; T *= 8) {
                int reps = list[b] == df_backend_get("cpu-scalar") ? 2 : 20;
                list[b]->matmul(p, &w, x, T, y);
                double t0 = now_s();
                for (int r = 0; r < reps; r++) list[b]->matmul(p, &w, x, T, y);
                double dt = (now_s() - t0) / reps;
                printf("bench %-5s %-10s T=%d %lldx%lld: %8.3f ms  %6.2f GB/s of weights  %7.2f GFLOP/s\n", ty ? "bf16" : "mxfp4",
                       list[b]->name, T, (long long)R, (long long)C, dt * 1e3, df_weight_bytes(&w) / dt / 1e9, 2.0 * R * C * T / dt / 1e9);
            }
        free(x); free(y); free((void *)w.data); free((void *)w.scale);
    }
    df_pool_free(p);
}

int main(void) {
    if (getenv("DF_BENCH")) { bench(); return 0; }
    test_known_values();
    test_backends();
    test_attention_ops();
    test_softmax_exp();
    test_pool();
    return t_done();
}
