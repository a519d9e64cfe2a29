/*
 * bench_kernels.c — `deltafin bench machine` and `deltafin bench kernels` (see bench_kernels.h).
 *
 * machine: DRAM read bandwidth with 1..N threads of the kernels' own pool (each pass a
 *   streaming sum over a buffer >= 8x the last-level cache; best of 5 passes) and the peak
 *   fp32 FMA rate (independent FMA chains in registers, widest vectors the CPU has) on one
 *   thread and on all of them.
 * kernels: the same limits, then backend->matmul for each encoding, T and shape with the
 *   weight rotated over copies filling a buffer >= 4x the LLC (each call reads weights that
 *   are not in any cache), printed in GB/s of weight bytes (df_weight_bytes per call), as a
 *   fraction of the DRAM bandwidth measured at the same thread count, in GFLOP/s and as a
 *   fraction of the FMA peak of that many threads, with each T's time relative to T=1.
 * Prints the command, the machine (CPU model, usable / online CPUs, LLC, features) and the
 * date first, so a run can be pasted into bench/RESULTS.md as is.
 */
#define _GNU_SOURCE
#include "bench_kernels.h"
#include "cli.h"
#include "kernels/backend.h"
#include "model/weights.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define MAX_LIST 64

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Per-call times kept for the median (calls past this are timed in the mean only). */
#define MAX_CALLS 8192
static double calls[MAX_CALLS];

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median of v[0..n) (sorts v), n >= 1. */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ------------------------------------------------------------ machine facts */

static int usable_cpus(void) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

/* "model name" of /proc/cpuinfo and the SIMD flags among `want` that it lists */
static void cpu_info(char *model, size_t ml, char *flags, size_t fl) {
    snprintf(model, ml, "unknown");
    flags[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[8192];
    int got_model = 0, got_flags = 0;
    static const char *want[] = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512vbmi",
                                 "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16", "amx_int8", NULL};
    while (fgets(line, sizeof line, f) && !(got_model && got_flags)) {
        char *v = strchr(line, ':');
        if (!v) continue;
        v++;
        while (*v == ' ') v++;
        v[strcspn(v, "\n")] = 0;
        if (!got_model && !strncmp(line, "model name", 10)) { snprintf(model, ml, "%s", v); got_model = 1; }
        else if (!got_flags && (!strncmp(line, "flags", 5) || !strncmp(line, "Features", 8))) {
            got_flags = 1;
            size_t n = 0;
            for (int i = 0; want[i]; i++) {
                size_t wl = strlen(want[i]);
                for (const char *p = v; (p = strstr(p, want[i])); p += wl)
                    if ((p == v || p[-1] == ' ') && (p[wl] == ' ' || p[wl] == 0)) {
                        n += (size_t)snprintf(flags + n, n < fl ? fl - n : 0, "%s%s", n ? " " : "", want[i]);
                        break;
                    }
            }
        }
    }
    fclose(f);
}

/* Size in bytes of the largest (highest-level) cache of cpu0, 0 if unknown. */
static uint64_t llc_bytes(void) {
    uint64_t best = 0;
    int best_level = -1;
    for (int i = 0; i < 16; i++) {
        char p[128], buf[64];
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/level", i);
        FILE *f = fopen(p, "r");
        if (!f) break;
        int level = 0;
        if (fscanf(f, "%d", &level) != 1) level = 0;
        fclose(f);
        snprintf(p, sizeof p, "/sys/devices/system/cpu/cpu0/cache/index%d/size", i);
        f = fopen(p, "r");
        if (!f) continue;
        if (fgets(buf, sizeof buf, f)) {
            char *end;
            uint64_t v = strtoull(buf, &end, 10);
            if (*end == 'K') v <<= 10;
            else if (*end == 'M') v <<= 20;
            if (level > best_level || (level == best_level && v > best)) { best = v; best_level = level; }
        }
        fclose(f);
    }
    return best;
}

/* "/proc/loadavg"'s first three fields (other work on the machine skews every figure) */
static void load_average(char *out, size_t n) {
    snprintf(out, n, "?");
    FILE *f = fopen("/proc/loadavg", "r");
    if (!f) return;
    double a, b, c;
    if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, n, "%.2f %.2f %.2f", a, b, c);
    fclose(f);
}

/* ------------------------------------------------------------ DRAM read bandwidth */

typedef struct {
    const uint8_t *buf;
    int64_t piece;      /* bytes per index */
    int streams, pf;    /* the piece is read as `streams` interleaved sequential streams; pf: prefetch distance */
    uint64_t sink[64];  /* one per thread (tid < 64), keeps the sums alive */
} bw_job;

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static uint64_t sum_avx512(const uint8_t *p, int64_t n, int S, int pf) {
    __m512i s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm512_setzero_si512();
    const int64_t seg = n / S / 256 * 256;
    for (int64_t i = 0; i < seg; i += 256)
        for (int k = 0; k < S; k++) {
            const uint8_t *q = p + k * seg + i;
            if (pf) { _mm_prefetch((const char *)q + pf, _MM_HINT_T0); _mm_prefetch((const char *)q + pf + 128, _MM_HINT_T0); }
            s[k] = _mm512_add_epi64(s[k], _mm512_add_epi64(_mm512_load_si512(q), _mm512_load_si512(q + 64)));
            s[k] = _mm512_add_epi64(s[k], _mm512_add_epi64(_mm512_load_si512(q + 128), _mm512_load_si512(q + 192)));
        }
    for (int k = 1; k < 8; k++) s[0] = _mm512_add_epi64(s[0], s[k]);
    return (uint64_t)_mm512_reduce_add_epi64(s[0]);
}
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint8_t *p, int64_t n, int S, int pf) {
    __m256i s[8];
    for (int k = 0; k < 8; k++) s[k] = _mm256_setzero_si256();
    const int64_t seg = n / S / 128 * 128;
    for (int64_t i = 0; i < seg; i += 128)
        for (int k = 0; k < S; k++) {
            const uint8_t *q = p + k * seg + i;
            if (pf) _mm_prefetch((const char *)q + pf, _MM_HINT_T0);
            s[k] = _mm256_add_epi64(s[k], _mm256_add_epi64(_mm256_load_si256((const __m256i *)q), _mm256_load_si256((const __m256i *)(q + 32))));
            s[k] = _mm256_add_epi64(s[k], _mm256_add_epi64(_mm256_load_si256((const __m256i *)(q + 64)), _mm256_load_si256((const __m256i *)(q + 96))));
        }
    for (int k = 1; k < 8; k++) s[0] = _mm256_add_epi64(s[0], s[k]);
    uint64_t o[4];
    _mm256_storeu_si256((__m256i *)o, s[0]);
    return o[0] + o[1] + o[2] + o[3];
}
#endif
static uint64_t sum_scalar(const uint8_t *p, int64_t n, int S, int pf) {
    const uint64_t *q = (const uint64_t *)p;
    uint64_t a = 0, b = 0, c = 0, d = 0;
    (void)S; (void)pf;
    for (int64_t i = 0; i + 4 <= n / 8; i += 4) { a += q[i]; b += q[i + 1]; c += q[i + 2]; d += q[i + 3]; }
    return a + b + c + d;
}
static uint64_t (*sum_fn)(const uint8_t *, int64_t, int, int) = sum_scalar;
static const char *simd_name = "scalar";

static void pick_simd(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) { sum_fn = sum_avx512; simd_name = "avx512"; return; }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) { sum_fn = sum_avx2; simd_name = "avx2"; return; }
#endif
}

static void bw_task(void *ctx, int64_t b, int64_t e, int tid) {
    bw_job *j = ctx;
    uint64_t s = 0;
    for (int64_t i = b; i < e; i++) s += sum_fn(j->buf + i * j->piece, j->piece, j->streams, j->pf);
    j->sink[tid & 63] += s;
}

/* Read patterns tried for the DRAM limit (the best one is the machine's figure): one sequential
 * stream per thread, and several interleaved streams per thread (as a matmul reads several
 * rows at once), with and without software prefetch. */
static const struct { int streams, pf; const char *name; } bw_patterns[] = {
    {1, 0, "1 stream"}, {4, 0, "4 streams"}, {8, 2048, "8 streams+pf"}};
#define N_BW_PATTERNS 3

/* Best of `passes` streaming reads of the whole buffer in one pattern, GB/s. */
static double dram_read_gbps(df_pool *p, const uint8_t *buf, int64_t bytes, int passes, int pat) {
    bw_job j = {buf, 4 << 20, bw_patterns[pat].streams, bw_patterns[pat].pf, {0}};
    const int64_t n = bytes / j.piece;
    double best = 0;
    for (int r = 0; r < passes; r++) {
        double t0 = now_s();
        df_pool_run(p, n, 1, bw_task, &j);
        double dt = now_s() - t0;
        if (dt > 0 && n * j.piece / dt / 1e9 > best) best = n * j.piece / dt / 1e9;
    }
    return best;
}

/* ------------------------------------------------------------ FMA peak */

typedef struct { double seconds; double flops[64]; } fma_job;

#if defined(__x86_64__)
#define FMA12(T, FMA)                                                                                     \
    a0 = FMA(a0, m, b); a1 = FMA(a1, m, b); a2 = FMA(a2, m, b); a3 = FMA(a3, m, b); a4 = FMA(a4, m, b);      \
    a5 = FMA(a5, m, b); a6 = FMA(a6, m, b); a7 = FMA(a7, m, b); a8 = FMA(a8, m, b); a9 = FMA(a9, m, b);      \
    a10 = FMA(a10, m, b); a11 = FMA(a11, m, b);
__attribute__((target("avx512f"))) static double fma_loop_avx512(double seconds) {
    __m512 a0 = _mm512_set1_ps(0), a1 = _mm512_set1_ps(1), a2 = _mm512_set1_ps(2), a3 = _mm512_set1_ps(3),
           a4 = _mm512_set1_ps(4), a5 = _mm512_set1_ps(5), a6 = _mm512_set1_ps(6), a7 = _mm512_set1_ps(7),
           a8 = _mm512_set1_ps(8), a9 = _mm512_set1_ps(9), a10 = _mm512_set1_ps(10), a11 = _mm512_set1_ps(11);
    const __m512 m = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
    double t0 = now_s(), t;
    int64_t it = 0;
    do {
        for (int k = 0; k < 4096; k++) {
            FMA12(__m512, _mm512_fmadd_ps)
            __asm__ volatile("" ::"v"(a0), "v"(a1), "v"(a2), "v"(a3), "v"(a4), "v"(a5), "v"(a6), "v"(a7), "v"(a8),
                             "v"(a9), "v"(a10), "v"(a11));
        }
        it += 4096;
    } while ((t = now_s() - t0) < seconds);
    return it * 12.0 * 16 * 2 / t;
}
__attribute__((target("avx2,fma"))) static double fma_loop_avx2(double seconds) {
    __m256 a0 = _mm256_set1_ps(0), a1 = _mm256_set1_ps(1), a2 = _mm256_set1_ps(2), a3 = _mm256_set1_ps(3),
           a4 = _mm256_set1_ps(4), a5 = _mm256_set1_ps(5), a6 = _mm256_set1_ps(6), a7 = _mm256_set1_ps(7),
           a8 = _mm256_set1_ps(8), a9 = _mm256_set1_ps(9), a10 = _mm256_set1_ps(10), a11 = _mm256_set1_ps(11);
    const __m256 m = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
    double t0 = now_s(), t;
    int64_t it = 0;
    do {
        for (int k = 0; k < 4096; k++) {
            FMA12(__m256, _mm256_fmadd_ps)
            __asm__ volatile("" ::"x"(a0), "x"(a1), "x"(a2), "x"(a3), "x"(a4), "x"(a5), "x"(a6), "x"(a7), "x"(a8),
                             "x"(a9), "x"(a10), "x"(a11));
        }
        it += 4096;
    } while ((t = now_s() - t0) < seconds);
    return it * 12.0 * 8 * 2 / t;
}
#endif
static double fma_loop_scalar(double seconds) {
    volatile float sink;
    float a[12];
    for (int i = 0; i < 12; i++) a[i] = (float)i;
    double t0 = now_s(), t;
    int64_t it = 0;
    do {
        for (int k = 0; k < 4096; k++)
            for (int i = 0; i < 12; i++) a[i] = fmaf(a[i], 0.999f, 0.001f);
        it += 4096;
    } while ((t = now_s() - t0) < seconds);
    sink = a[0];
    (void)sink;
    return it * 12.0 * 2 / t;
}

static void fma_task(void *ctx, int64_t b, int64_t e, int tid) {
    fma_job *j = ctx;
    for (int64_t i = b; i < e; i++) {
        double f;
#if defined(__x86_64__)
        if (!strcmp(simd_name, "avx512")) f = fma_loop_avx512(j->seconds);
        else if (!strcmp(simd_name, "avx2")) f = fma_loop_avx2(j->seconds);
        else
#endif
            f = fma_loop_scalar(j->seconds);
        j->flops[i & 63] = f;
    }
}

/* fp32 FLOP/s (2 per FMA lane) of n threads at once, summed. */
static double fma_peak(df_pool *p, int n, double seconds) {
    fma_job j = {seconds, {0}};
    df_pool_run(p, n, 1, fma_task, &j);
    double s = 0;
    for (int i = 0; i < n && i < 64; i++) s += j.flops[i];
    return s;
}

/* ------------------------------------------------------------ weights */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float rndf(void) { return (float)((rnd() >> 8) / 16777216.0 * 2.0 - 1.0); }
static uint16_t f32_to_bf16(float f) { uint32_t u; memcpy(&u, &f, 4); return (uint16_t)(u >> 16); }

/* Fill one copy of a weight with plausible values (no NaN, sane scales). */
static void fill_weight(df_wtype t, int64_t rows, int64_t cols, uint8_t *data, uint8_t *scale) {
    size_t nd = df_weight_data_bytes(t, rows, cols), ns = df_weight_scale_bytes(t, rows, cols);
    switch (t) {
    case DF_W_F32: for (size_t i = 0; i < nd / 4; i++) ((float *)data)[i] = rndf() * 0.05f; break;
    case DF_W_BF16: for (size_t i = 0; i < nd / 2; i++) ((uint16_t *)data)[i] = f32_to_bf16(rndf() * 0.05f); break;
    case DF_W_F16: for (size_t i = 0; i < nd / 2; i++) ((uint16_t *)data)[i] = (uint16_t)((rnd() & 0x83ff) | ((5 + rnd() % 10) << 10)); break;
    case DF_W_FP8_B128:
        for (size_t i = 0; i < nd; i++) { uint8_t b = (uint8_t)rnd(); if ((b & 0x7f) == 0x7f) b = 0x3f; data[i] = b; }
        for (size_t i = 0; i < ns / 4; i++) ((float *)scale)[i] = 1e-4f * (1.0f + (float)(rnd() % 100) / 100.0f);
        break;
    case DF_W_INT4_G32:
        for (size_t i = 0; i < nd; i++) data[i] = (uint8_t)rnd();
        for (size_t i = 0; i < ns / 2; i++) ((uint16_t *)scale)[i] = f32_to_bf16(0.001f * (1 + rnd() % 16));
        break;
    case DF_W_MXFP4:
        for (size_t i = 0; i < nd; i++) data[i] = (uint8_t)rnd();
        for (size_t i = 0; i < ns; i++) scale[i] = (uint8_t)(118 + rnd() % 8);
        break;
    case DF_W_INT8_ROW:
        for (size_t i = 0; i < nd; i++) data[i] = (uint8_t)(rnd() % 255);
        for (size_t i = 0; i < ns / 4; i++) ((float *)scale)[i] = 1e-3f;
        break;
    default: break;
    }
}

/* ------------------------------------------------------------ options */

static int parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || errno || !(v > 0)) return -1;
    uint64_t m = 1;
    if (*end == 'K' || *end == 'k') { m = 1ull << 10; end++; }
    else if (*end == 'M' || *end == 'm') { m = 1ull << 20; end++; }
    else if (*end == 'G' || *end == 'g') { m = 1ull << 30; end++; }
    if (*end == 'i') end++;
    if (*end == 'B') end++;
    if (*end || v * (double)m > 1e15) return -1;
    *out = (uint64_t)(v * (double)m);
    return 0;
}

/* "1,2,4" or "1-4" or "1-4,8" -> sorted unique ints in [lo, hi]; count or -1 */
static int parse_int_list(const char *s, int lo, int hi, int *out, int cap) {
    int n = 0;
    const char *p = s;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p) return -1;
        b = a;
        if (*end == '-') {
            const char *q = end + 1;
            b = strtol(q, &end, 10);
            if (end == q) return -1;
        }
        if (a < lo || b > hi || a > b) return -1;
        for (long v = a; v <= b; v++) {
            int dup = 0;
            for (int i = 0; i < n; i++) dup |= out[i] == v;
            if (!dup) { if (n == cap) return -1; out[n++] = (int)v; }
        }
        if (*end == ',') end++;
        else if (*end) return -1;
        p = end;
    }
    for (int i = 1; i < n; i++)
        for (int k = i; k > 0 && out[k - 1] > out[k]; k--) { int t = out[k]; out[k] = out[k - 1]; out[k - 1] = t; }
    return n > 0 ? n : -1;
}

static void usage(FILE *f, const char *name) {
    fprintf(f,
            "usage: deltafin bench machine [--threads LIST] [--dram-buffer SIZE]\n"
            "       deltafin bench kernels [--threads LIST] [--types LIST] [--T LIST] [--shapes RxC,...]\n"
            "                              [--backend NAME|all] [--seconds S] [--buffer SIZE] [--dram-buffer SIZE] [--warm]\n"
            "  machine: DRAM read bandwidth with each thread count (default 1..usable CPUs) and the fp32 FMA peak.\n"
            "  kernels: the same limits, then each matmul kernel on weights that are not in cache (rotated over\n"
            "           --buffer, default max(4 x LLC, 512M)), in GB/s of weight bytes and as a fraction of the DRAM\n"
            "           bandwidth at the same thread count. Defaults: --threads 1,<usable CPUs>\n"
            "           --types f32,bf16,f16,fp8_b128,int4_g32,mxfp4 --T 1,8,64 --shapes 2048x7168,7168x2048\n"
            "           --backend cpu (the best this CPU runs; all = every SIMD backend, or name cpu-scalar);\n"
            "           cuda = the GPU's kernels and limits (default types mxfp4..f32, shapes 2048x7168,7168x2048,\n"
            "           32768x7168, T 1,8,512)\n"
            "           --seconds 0.3 per measurement; --warm adds the same call on one copy (in cache).\n");
    (void)name;
}

/* ------------------------------------------------------------ main */

int bench_kernels_main(int argc, char **argv) {
    const char *name = argc > 0 ? argv[0] : "kernels";
    const int kernels = !strcmp(name, "kernels");
    if (!kernels && strcmp(name, "machine")) {
        fprintf(stderr, "deltafin bench: unknown benchmark '%s' (machine, kernels)\n", name);
        return 2;
    }
    const int ncpu = usable_cpus();
    int threads[MAX_LIST], nthr = 0, Ts[MAX_LIST], nT = 0, types[DF_W__COUNT], ntypes = 0, warm = 0;
    int64_t shapes[MAX_LIST][2];
    int nshapes = 0;
    double seconds = 0.3;
    uint64_t buffer = 0, dram_buffer = 0;
    const char *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout, name); return 0; }
        if (!strcmp(a, "--warm")) { warm = 1; continue; }
        static const char *const vals_machine[] = {"--threads", "--dram-buffer", NULL};
        static const char *const vals_kernels[] = {"--threads", "--dram-buffer", "--T", "--types", "--shapes", "--backend", "--seconds",
                                                   "--buffer", NULL};
        static const char *const bench_flags[] = {"--help", "--warm", NULL};
        char what[32];
        snprintf(what, sizeof what, "bench %s", name);
        if (!cli_known_option(a, kernels ? vals_kernels : vals_machine))
            return cli_unknown_option(what, a, kernels ? vals_kernels : vals_machine, kernels ? bench_flags : NULL);
        if (!v) { fprintf(stderr, "deltafin bench %s: %s needs a value (see --help)\n", name, a); return 2; }
        if (cli_repeated_at(what, argc, argv, i, kernels ? vals_kernels : vals_machine, NULL)) return 2;
        i++;
        if (!strcmp(a, "--threads")) {
            if ((nthr = parse_int_list(v, 1, 4096, threads, MAX_LIST)) < 0) {
                fprintf(stderr, "deltafin bench %s: --threads \"%s\": expected a list like 1,2 or 1-8\n", name, v);
                return 2;
            }
        } else if (!strcmp(a, "--T") && kernels) {
            if ((nT = parse_int_list(v, 1, 4096, Ts, MAX_LIST)) < 0) {
                fprintf(stderr, "deltafin bench %s: --T \"%s\": expected a list like 1,8,64\n", name, v);
                return 2;
            }
        } else if (!strcmp(a, "--types") && kernels) {
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            ntypes = 0;
            if (cli_list_has_empty(v)) {
                fprintf(stderr, "deltafin bench %s: --types \"%s\": an empty item in the list; expected e.g. f32,bf16,mxfp4\n", name, v);
                return 2;
            }
            for (char *sv, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
                int t = df_wtype_from_name(tok);
                if (t < 0 || ntypes == DF_W__COUNT) {
                    fprintf(stderr, "deltafin bench %s: --types: unknown encoding \"%s\" (f32, bf16, f16, fp8_b128, int4_g32, mxfp4, int8_row)\n", name, tok);
                    return 2;
                }
                types[ntypes++] = t;
            }
        } else if (!strcmp(a, "--shapes") && kernels) {
            char buf[512];
            snprintf(buf, sizeof buf, "%s", v);
            nshapes = 0;
            if (cli_list_has_empty(v)) {
                fprintf(stderr, "deltafin bench %s: --shapes \"%s\": an empty item in the list; expected e.g. 2048x7168,7168x2048\n",
                        name, v);
                return 2;
            }
            for (char *sv, *tok = strtok_r(buf, ",", &sv); tok; tok = strtok_r(NULL, ",", &sv)) {
                long long r, c;
                char x, extra;
                if (nshapes == MAX_LIST || sscanf(tok, "%lld%c%lld%c", &r, &x, &c, &extra) != 3 || (x != 'x' && x != 'X') || r < 1 ||
                    c < 1 || r > (1 << 20) || c > (1 << 20) || r * c > (1ll << 31)) {
                    fprintf(stderr, "deltafin bench %s: --shapes: \"%s\": expected ROWSxCOLS, e.g. 2048x7168\n", name, tok);
                    return 2;
                }
                shapes[nshapes][0] = r;
                shapes[nshapes++][1] = c;
            }
        } else if (!strcmp(a, "--backend") && kernels) backend = v;
        else if (!strcmp(a, "--seconds") && kernels) {
            char *end;
            seconds = strtod(v, &end);
            if (end == v || *end || !(seconds > 0) || seconds > 60) {
                fprintf(stderr, "deltafin bench %s: --seconds \"%s\": expected a number in (0, 60]\n", name, v);
                return 2;
            }
        } else if (!strcmp(a, "--buffer") && kernels) {
            if (parse_size(v, &buffer)) { fprintf(stderr, "deltafin bench %s: --buffer \"%s\": expected a size like 512M\n", name, v); return 2; }
        } else if (!strcmp(a, "--dram-buffer")) {
            if (parse_size(v, &dram_buffer)) { fprintf(stderr, "deltafin bench %s: --dram-buffer \"%s\": expected a size like 1G\n", name, v); return 2; }
        } else return cli_unknown_option(what, a, kernels ? vals_kernels : vals_machine, kernels ? bench_flags : NULL);
    }
    if (!nthr) {
        if (kernels) { threads[nthr++] = 1; if (ncpu > 1) threads[nthr++] = ncpu; }
        else for (int t = 1; t <= ncpu && nthr < MAX_LIST; t++) threads[nthr++] = t;
    }
    if (kernels && !strcmp(backend, "cuda")) {
        const int ts_given = nT > 0, shapes_given = nshapes > 0;
        if (!ntypes) {
            const df_wtype d[] = {DF_W_MXFP4, DF_W_BF16, DF_W_FP8_B128, DF_W_INT4_G32, DF_W_F16, DF_W_F32};
            for (int i = 0; i < 6; i++) types[ntypes++] = d[i];
        }
        return bench_kernels_cuda(argc, argv, types, ntypes, shapes, nshapes, Ts, nT, ts_given, shapes_given);
    }
    if (!nT) { Ts[0] = 1; Ts[1] = 8; Ts[2] = 64; nT = 3; }
    if (!ntypes) {
        const df_wtype d[] = {DF_W_F32, DF_W_BF16, DF_W_F16, DF_W_FP8_B128, DF_W_INT4_G32, DF_W_MXFP4};
        for (int i = 0; i < 6; i++) types[ntypes++] = d[i];
    }
    if (!nshapes) { shapes[0][0] = 2048; shapes[0][1] = 7168; shapes[1][0] = 7168; shapes[1][1] = 2048; nshapes = 2; }
    const df_backend *bes[8];
    int nbe = 0;
    if (!strcmp(backend, "all")) {
        const df_backend *l[8];
        int n = df_backend_list(l, 8);
        for (int i = 0; i < n; i++) if (strcmp(l[i]->name, "cpu-scalar")) bes[nbe++] = l[i];
    } else if ((bes[0] = df_backend_get(backend))) nbe = 1;
    if (kernels && !nbe) {
        fprintf(stderr, "deltafin bench %s: --backend \"%s\": unknown or not supported by this CPU\n", name, backend);
        return 2;
    }
    pick_simd();

    /* header: command, machine, date */
    char model[256], flags[512], date[64];
    cpu_info(model, sizeof model, flags, sizeof flags);
    time_t tnow = time(NULL);
    struct tm tm;
    gmtime_r(&tnow, &tm);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    const uint64_t llc = llc_bytes();
    printf("command: deltafin bench");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    /* no cache size in sysfs (some VMs and containers): "LLC unknown", and the default buffers are the floors of
     * max(8 x LLC, 1G) and max(4 x LLC, 512M): --dram-buffer 1G, --buffer 512M */
    char llc_txt[48];
    if (llc) snprintf(llc_txt, sizeof llc_txt, "%.1f MiB", llc / 1048576.0);
    else snprintf(llc_txt, sizeof llc_txt, "unknown");
    printf("\nmachine: %s; %d usable CPUs (%ld online); LLC %s; flags: %s\n", model, ncpu,
           sysconf(_SC_NPROCESSORS_ONLN), llc_txt, flags[0] ? flags : "-");
    printf("kernels: backends");
    {
        const df_backend *l[8];
        int n = df_backend_list(l, 8);
        for (int i = 0; i < n; i++) printf(" %s", l[i]->name);
    }
    char la[64];
    load_average(la, sizeof la);
    printf(" (features: %s); limits measured with %s code\ndate: %s; load average %s\n", df_cpu_features(), simd_name, date, la);

    /* limits */
    if (!dram_buffer) dram_buffer = llc * 8 > (1ull << 30) ? llc * 8 : (1ull << 30);
    dram_buffer = dram_buffer / (1 << 20) * (1 << 20);
    if (dram_buffer < (1 << 20)) dram_buffer = 1 << 20;
    uint8_t *buf = aligned_alloc(1 << 21, dram_buffer);
    if (!buf) { fprintf(stderr, "deltafin bench %s: cannot allocate the %.0f MiB read buffer\n", name, dram_buffer / 1048576.0); return 1; }
    memset(buf, 1, dram_buffer);
    double dram[MAX_LIST], peak1 = 0;
    df_pool *pools[MAX_LIST];
    for (int i = 0; i < nthr; i++) {
        pools[i] = df_pool_new(threads[i]);
        if (!pools[i]) { fprintf(stderr, "deltafin bench %s: cannot start %d threads\n", name, threads[i]); return 1; }
    }
    if (llc && dram_buffer < 4 * llc)
        printf("note: --dram-buffer %.0f MiB is under 4x the LLC (%.0f MiB): part of the reads may hit the cache\n",
               dram_buffer / 1048576.0, llc / 1048576.0);
    printf("\nmachine limits (DRAM: streaming sum over %.0f MiB, best of 3 passes per pattern, DRAM GB/s = the best\n"
           "pattern; FMA: 12 independent FMA chains per thread, %s)\n", dram_buffer / 1048576.0, simd_name);
    printf("%8s", "threads");
    for (int q = 0; q < N_BW_PATTERNS; q++) printf(" %14s", bw_patterns[q].name);
    printf(" %10s %13s %11s\n", "DRAM GB/s", "FMA GFLOP/s", "per thread");
    for (int i = 0; i < nthr; i++) {
        dram[i] = 0;
        printf("%8d", threads[i]);
        for (int q = 0; q < N_BW_PATTERNS; q++) {
            double g = dram_read_gbps(pools[i], buf, (int64_t)dram_buffer, 3, q);
            if (g > dram[i]) dram[i] = g;
            printf(" %14.2f", g);
        }
        double f = fma_peak(pools[i], threads[i], 0.3);
        if (threads[i] == 1 || peak1 == 0) peak1 = threads[i] == 1 ? f : f / threads[i];
        printf(" %10.2f %13.1f %11.1f\n", dram[i], f / 1e9, f / 1e9 / threads[i]);
        fflush(stdout);
    }
    free(buf);
    if (!kernels) {
        for (int i = 0; i < nthr; i++) df_pool_free(pools[i]);
        return 0;
    }

    /* kernels */
    if (!buffer) buffer = llc * 4 > (512ull << 20) ? llc * 4 : (512ull << 20);
    int maxT = 1;
    for (int i = 0; i < nT; i++) if (Ts[i] > maxT) maxT = Ts[i];
    if (llc && buffer < 2 * llc)
        printf("\nnote: --buffer %.0f MiB is under 2x the LLC (%.0f MiB): the weights may be (partly) in cache\n",
               buffer / 1048576.0, llc / 1048576.0);
    printf("\nkernels (y[T,rows] = x[T,cols] W^T; weights rotated over copies filling >= %.0f MiB, not in cache;\n"
           "GB/s = weight bytes per call / time; %%DRAM = that / DRAM GB/s at the same thread count; %%FMA = GFLOP/s /\n"
           "(FMA peak of one thread x threads); xT1 = time / the T=1 time; med = the median call's GB/s and %%DRAM, robust\n"
           "to other processes on a shared machine%s)\n",
           buffer / 1048576.0, warm ? "; warm = the same call on one copy, in cache" : "");
    printf("%-10s %-11s %-10s %4s %7s %9s %8s %7s %9s %6s %6s %8s %7s%s\n", "encoding", "backend", "shape", "T", "threads", "ms/call",
           "GB/s", "%DRAM", "GFLOP/s", "%FMA", "xT1", "med GB/s", "med %", warm ? "  warm GB/s" : "");
    int rc = 0;
    for (int si = 0; si < nshapes && !rc; si++)
        for (int ti = 0; ti < ntypes && !rc; ti++) {
            const df_wtype t = (df_wtype)types[ti];
            const int64_t R = shapes[si][0], C = shapes[si][1];
            if ((t == DF_W_INT4_G32 || t == DF_W_MXFP4) && C % 32) {
                printf("%-10s (skipped %lldx%lld: cols must be a multiple of 32)\n", df_wtype_name(t), (long long)R, (long long)C);
                continue;
            }
            const size_t nd = df_weight_data_bytes(t, R, C), ns = df_weight_scale_bytes(t, R, C);
            const size_t nda = (nd + 4095) / 4096 * 4096, nsa = (ns + 4095) / 4096 * 4096;
            const uint64_t wbytes = df_weight_bytes(&(df_weight){t, R, C, NULL, NULL, 0});
            int copies = (int)((buffer + nda + nsa - 1) / (nda + nsa));
            if (copies < 2) copies = 2;
            uint8_t *data = aligned_alloc(4096, nda * copies), *scale = nsa ? aligned_alloc(4096, nsa * copies) : NULL;
            float *x = malloc(sizeof(float) * (size_t)maxT * C), *y = malloc(sizeof(float) * (size_t)maxT * R);
            df_weight *w = malloc(sizeof(df_weight) * copies);
            if (!data || (nsa && !scale) || !x || !y || !w) {
                fprintf(stderr, "deltafin bench %s: cannot allocate %d copies of a %lldx%lld %s weight\n", name, copies, (long long)R,
                        (long long)C, df_wtype_name(t));
                free(data); free(scale); free(x); free(y); free(w);
                rc = 1;
                break;
            }
            fill_weight(t, R, C, data, scale);
            for (int k = 0; k < copies; k++) {
                if (k) {
                    memcpy(data + nda * k, data, nd);
                    if (ns) memcpy(scale + nsa * k, scale, ns);
                }
                w[k] = (df_weight){t, R, C, data + nda * k, ns ? scale + nsa * k : NULL, 0};
            }
            for (int64_t i = 0; i < (int64_t)maxT * C; i++) x[i] = rndf();
            for (int bi = 0; bi < nbe; bi++)
                for (int hi = 0; hi < nthr; hi++) {
                    double t1 = 0;
                    for (int k = 0; k < nT; k++) {
                        const int T = Ts[k];
                        int c = 0;
                        bes[bi]->matmul(pools[hi], &w[copies - 1], x, T, y); /* warm-up (scratch, pool) */
                        double t0 = now_s(), dt, tc = t0;
                        do {
                            bes[bi]->matmul(pools[hi], &w[c % copies], x, T, y);
                            const double tn = now_s();
                            if (c < MAX_CALLS) calls[c] = tn - tc;
                            tc = tn;
                            c++;
                        } while ((dt = now_s() - t0) < seconds || c < 3);
                        const double per = dt / c, gbps = wbytes / per / 1e9, gf = 2.0 * R * C * T / per / 1e9;
                        const double med = median(calls, c < MAX_CALLS ? c : MAX_CALLS);
                        if (T == 1) t1 = per;
                        char xt1[16] = "-";
                        if (t1 > 0) snprintf(xt1, sizeof xt1, "%.2f", per / t1);
                        char shape[32];
                        snprintf(shape, sizeof shape, "%lldx%lld", (long long)R, (long long)C);
                        printf("%-10s %-11s %-10s %4d %7d %9.3f %8.2f %6.1f%% %9.1f %5.1f%% %6s %8.2f %6.1f%%", df_wtype_name(t), bes[bi]->name,
                               shape, T, threads[hi], per * 1e3, gbps, 100 * gbps / dram[hi], gf, 100 * gf / (peak1 / 1e9 * threads[hi]), xt1,
                               wbytes / med / 1e9, 100 * wbytes / med / 1e9 / dram[hi]);
                        if (warm) {
                            int cw = 0;
                            double t0w = now_s(), dw;
                            do { bes[bi]->matmul(pools[hi], &w[0], x, T, y); cw++; } while ((dw = now_s() - t0w) < seconds || cw < 3);
                            printf("  %9.2f", wbytes / (dw / cw) / 1e9);
                        }
                        printf("\n");
                        fflush(stdout);
                    }
                }
            free(data); free(scale); free(x); free(y); free(w);
        }
    for (int i = 0; i < nthr; i++) df_pool_free(pools[i]);
    load_average(la, sizeof la);
    printf("load average at the end: %s\n", la);
    return rc;
}
