/*
 * bench_cuda.c — `deltafin bench kernels --backend cuda`: the GPU's limits (device-to-device
 * copy bandwidth; the fp32 FMA peak from SMs x clock; the dense bf16 tensor peak of the
 * data sheet) and the CUDA matmul kernel of each encoding, timed alone with CUDA events
 * (weights and activations resident in GPU memory), as % of the measured bandwidth
 * (weight bytes / time) and as TFLOP/s against both peaks.
 */
#include "bench_kernels.h"
#include "kernels/backend.h"
#include "kernels/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Dense bf16 tensor-core peak of the H200 / H100 SXM data sheet (TFLOP/s, no sparsity). */
#define BF16_DENSE_PEAK_TFLOPS 989.4

/* One row of the table: the kernel for (type, R x C, T); v = the kernel variant (df_cuda_set_matvec_rows for
 * T = 1, df_cuda_set_tile for T >= 2; 0 = automatic, 1 = the reference one-row-per-warp kernel). */
static void bench_one(df_wtype t, int64_t R, int64_t C, int T, int v, double bw, double fp32_peak) {
    const df_weight w = {t, R, C, NULL, NULL, 0};
    const double wb = (double)df_weight_bytes(&w);
    if (T == 1) df_cuda_set_matvec_rows(v);
    else df_cuda_set_tile(v);
    const double ms = df_cuda_bench_matmul(t, R, C, T, T >= 256 ? 5 : 50);
    df_cuda_set_matvec_rows(0);
    df_cuda_set_tile(0);
    char shape[40];
    static const char *const tag1[9] = {"", "/ref", "/2r4w", "", "/4r4w", "", "", "", "/2r8w"};
    static const char *const tagT[9] = {"", "/ref", "/8x8", "", "/32x8", "", "", "", "/16x8"};
    snprintf(shape, sizeof shape, "%lldx%lld%s", (long long)R, (long long)C, (T == 1 ? tag1 : tagT)[v]);
    if (ms <= 0) {
        printf("%-10s %-15s %5d  failed: %s\n", df_wtype_name(t), shape, T, df_cuda_last_error());
        return;
    }
    const double gbs = wb / (ms * 1e-3) / 1e9, tf = 2.0 * R * C * T / (ms * 1e-3) / 1e12;
    printf("%-10s %-15s %5d %10.4f %9.1f %6.1f %9.2f %6.1f %6.2f\n", df_wtype_name(t), shape, T, ms, gbs,
           bw > 0 ? 100 * gbs * 1e9 / bw : 0, tf, fp32_peak > 0 ? 100 * tf * 1e12 / fp32_peak : 0,
           100 * tf / BF16_DENSE_PEAK_TFLOPS);
    fflush(stdout);
}

int bench_kernels_cuda(int argc, char **argv, const int *types, int ntypes, int64_t (*shapes)[2], int nshapes,
                       const int *Ts, int nT, int ts_given, int shapes_given) {
    char why[300];
    if (!df_backend_get("cuda")) { /* the knobs' validation (cuda_env.h) as for run / serve, then the device */
        df_backend_why("cuda", why, sizeof why);
        fprintf(stderr, "deltafin bench kernels: --backend cuda: %s\n", why);
        return 1;
    }
    char dev[160], date[64];
    df_cuda_describe(dev, sizeof dev);
    time_t tnow = time(NULL);
    struct tm tm;
    gmtime_r(&tnow, &tm);
    strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", &tm);
    printf("command: deltafin bench");
    for (int i = 0; i < argc; i++) printf(" %s", argv[i]);
    double fp32_peak = 0;
    int sms = 0, mhz = 0;
    df_cuda_fp32_peak(&fp32_peak, &sms, &mhz);
    printf("\ndevice: %s, %d SMs at %d MHz; date: %s\n", dev, sms, mhz, date);
    const double bw = df_cuda_bench_bandwidth();
    printf("limits: HBM %.1f GB/s measured (device-to-device copy of 4 GiB, bytes read + written); fp32 FMA peak "
           "%.1f TFLOP/s (SMs x 128 lanes x 2 x clock); dense bf16 tensor peak %.1f TFLOP/s (data sheet)\n",
           bw / 1e9, fp32_peak / 1e12, BF16_DENSE_PEAK_TFLOPS);
    int64_t sh[8][2] = {{2048, 7168}, {7168, 2048}, {32768, 7168}};
    int nsh = 3;
    if (shapes_given) { nsh = nshapes > 8 ? 8 : nshapes; memcpy(sh, shapes, sizeof(int64_t) * 2 * (size_t)nsh); }
    int tl[16] = {1, 8, 512};
    const char *ve = getenv("DF_CUDA_BENCH_VARIANTS");
    const int variants = ve && *ve && *ve != '0';
    int ntl = 3;
    if (ts_given) { ntl = nT > 16 ? 16 : nT; memcpy(tl, Ts, sizeof(int) * (size_t)ntl); }
    printf("\nkernels (y[T,rows] = x[T,cols] W^T on the GPU, fp32 accumulation, batch-invariant order; ms/call = CUDA events "
           "over back-to-back calls;\nGB/s = weight bytes per call / time; %%HBM = that / measured HBM; %%fp32 and %%bf16 = "
           "TFLOP/s / the peaks above)\n");
    printf("(no suffix: the automatic kernel; shape/ref: the reference kernel, one warp per row; with env "
           "DF_CUDA_BENCH_VARIANTS=1 also\n /2r4w /4r4w /2r8w: the tiled one-token kernel (rows per warp, warps per block), "
           "/8x8 /32x8 /16x8: the tiled T-row kernel with that block tile; all give the same bits)\n");
    printf("%-10s %-15s %5s %10s %9s %6s %9s %6s %6s\n", "encoding", "shape", "T", "ms/call", "GB/s", "%HBM", "TFLOP/s",
           "%fp32", "%bf16");
    for (int ti = 0; ti < ntypes; ti++)
        for (int si = 0; si < nsh; si++)
            for (int k = 0; k < ntl; k++) {
                /* the automatic kernel, the reference kernel and (env) every variant */
                bench_one((df_wtype)types[ti], sh[si][0], sh[si][1], tl[k], 0, bw, fp32_peak);
                bench_one((df_wtype)types[ti], sh[si][0], sh[si][1], tl[k], 1, bw, fp32_peak);
                for (int v = 2; variants && v <= 8; v *= 2)
                    bench_one((df_wtype)types[ti], sh[si][0], sh[si][1], tl[k], v, bw, fp32_peak);
            }
    /* a decode step's MoE layer: the top-k experts' matrices of one shape in one grouped launch (the engine's
     * df_cuda_mlp_group), all reading the same x; 16 = 8 experts' gates and ups, 8 = their downs */
    printf("\ngrouped launches (n weights of one shape in one tensor-core launch, as a decode step's MoE layer runs its "
           "top-k experts;\nGB/s = the n weights' bytes per call / time, read from HBM: n x a weight > the L2 cache)\n");
    printf("%-10s %-15s %5s %4s %10s %9s %6s\n", "encoding", "shape", "T", "n", "ms/call", "GB/s", "%HBM");
    for (int ti = 0; ti < ntypes; ti++) {
        const df_wtype t = (df_wtype)types[ti];
        if (t != DF_W_MXFP4 && t != DF_W_BF16) continue;
        for (int si = 0; si < nsh && si < 2; si++)
            for (int k = 0; k < ntl; k++) {
                if (tl[k] > 16) continue;
                const int n = si == 0 ? 16 : 8;
                const df_weight w = {t, sh[si][0], sh[si][1], NULL, NULL, 0};
                /* one token: the automatic tile (16 rows x 2 tokens per warp) and variant 8 (32 x 2) */
                for (int v = 0; v <= (tl[k] == 1 ? 8 : 0); v += 8) {
                    if (tl[k] == 1) df_cuda_set_matvec_rows(v);
                    const double ms = df_cuda_bench_group(t, sh[si][0], sh[si][1], tl[k], n, 50);
                    df_cuda_set_matvec_rows(0);
                    char shape[40];
                    snprintf(shape, sizeof shape, "%lldx%lld%s", (long long)sh[si][0], (long long)sh[si][1], v ? "/32x2" : "");
                    if (ms <= 0) {
                        printf("%-10s %-15s %5d %4d  failed: %s\n", df_wtype_name(t), shape, tl[k], n, df_cuda_last_error());
                        continue;
                    }
                    const double gbs = (double)df_weight_bytes(&w) * n / (ms * 1e-3) / 1e9;
                    printf("%-10s %-15s %5d %4d %10.4f %9.1f %6.1f\n", df_wtype_name(t), shape, tl[k], n, ms, gbs,
                           bw > 0 ? 100 * gbs * 1e9 / bw : 0);
                    fflush(stdout);
                }
            }
    }
    return 0;
}
