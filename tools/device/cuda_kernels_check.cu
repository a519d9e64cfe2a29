/*
 * cuda_kernels_check.cu — the matmul kernels alone, built on the accelerator machine with nvcc and nothing else
 * (for when the project's binaries cannot travel there): every kernel variant (the tiled one-token kernel with
 * 2 / 4 rows per warp, the tiled T-row kernel with 8x8 / 32x8 / 16x8 blocks, the automatic choice) bitwise against
 * the one-row-per-warp reference kernel, which test_cuda_kernels checks against the CPU; batch invariance (each
 * row of a T-row call equals the 1-row call); f32 / bf16 against a host double-precision product; then the
 * timings of `deltafin bench kernels --backend cuda` for each variant.
 * MXFP4 (and BF16 with CKC_MMA=0x22) runs on the tensor-core kernel (cuda_mma.cu), whose variants are checked
 * against its variant 1 and against a host double-precision product; `bench` also times MXFP4 / BF16 on the other
 * kernel family ("fma" / "mma").
 * Build (repository root): nvcc -O3 -std=c++17 -arch=sm_90 -Isrc -Iinclude tools/device/cuda_kernels_check.cu \
 *     src/kernels/cuda/cuda_matmul.cu src/kernels/cuda/cuda_mma.cu src/kernels/cuda/cuda_ops.cu -o /tmp/ckc
 * Usage: /tmp/ckc [check] [bench TYPES SHAPES TS]   e.g. /tmp/ckc check bench mxfp4,bf16 2048x7168,32768x7168 1,8,512
 */
#include "kernels/cuda/cuda_internal.h"

#ifndef DF_CUDA_ENCS
#define DF_CUDA_ENCS 0x7f
#endif

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }
static float rndf() { return (float)((rnd() >> 8) / 16777216.0 * 2.0 - 1.0); }
static const char *NAMES[] = {"f32", "bf16", "f16", "fp8_b128", "int4_g32", "mxfp4", "int8_row"};
static int fails = 0, passes = 0;
#define CK(e) do { cudaError_t e_ = (e); if (e_ != cudaSuccess) { printf("CUDA error %s at %d\n", cudaGetErrorString(e_), __LINE__); exit(1); } } while (0)

static size_t data_bytes(int t, int64_t R, int64_t C) {
    const int64_t n = R * C;
    switch (t) { case 0: return n * 4; case 1: case 2: return n * 2; case 3: case 6: return n; default: return n / 2; }
}
static size_t scale_bytes(int t, int64_t R, int64_t C) {
    switch (t) {
    case 3: return ((R + 127) / 128) * ((C + 127) / 128) * 4;
    case 4: return R * C / 32 * 2;
    case 5: return R * C / 32;
    case 6: return R * 4;
    default: return 0;
    }
}

/* Random weights; nan_codes: fp8 NaN codes allowed; wide: scales that take the element-wise decoding path. */
static void make(int t, int64_t R, int64_t C, std::vector<uint8_t> &d, std::vector<uint8_t> &s, bool wide) {
    d.resize(data_bytes(t, R, C));
    s.resize(scale_bytes(t, R, C));
    for (auto &b : d) b = (uint8_t)rnd();
    if (t == 0) for (size_t i = 0; i < d.size() / 4; i++) { float f = rndf(); memcpy(&d[4 * i], &f, 4); }
    if (t == 1) for (size_t i = 0; i < d.size() / 2; i++) { float f = rndf(); uint32_t u; memcpy(&u, &f, 4); d[2 * i] = (uint8_t)(u >> 16); d[2 * i + 1] = (uint8_t)(u >> 24); }
    if (t == 2) for (size_t i = 0; i < d.size() / 2; i++) d[2 * i + 1] = (uint8_t)((d[2 * i + 1] & 0x83) | ((1 + rnd() % 20) << 2));
    if (t == 3) {
        if (!wide) for (auto &b : d) if ((b & 0x7f) == 0x7f) b ^= 1;
        for (size_t i = 0; i < s.size() / 4; i++) { float f = (wide && i % 3 == 1) ? 300.0f : 0.003f + 0.0007f * (float)i; memcpy(&s[4 * i], &f, 4); }
    }
    if (t == 4) for (size_t i = 0; i < s.size() / 2; i++) { float f = 0.01f * (1 + i % 7); uint32_t u; memcpy(&u, &f, 4); s[2 * i] = (uint8_t)(u >> 16); s[2 * i + 1] = (uint8_t)(u >> 24); }
    if (t == 5) for (auto &b : s) b = wide ? (uint8_t)(rnd() % 7 == 0 ? 120 + rnd() % 120 : 118 + rnd() % 14) : (uint8_t)(118 + rnd() % 10);
    if (t == 6) for (size_t i = 0; i < s.size() / 4; i++) { float f = 0.001f * (1 + i % 5); memcpy(&s[4 * i], &f, 4); }
}

static void *g_d, *g_s, *g_x, *g_y;
static cudaStream_t g_st;
/* every copy on the kernels' (non-blocking) stream, waited for: the legacy stream does not order with it */
static void h2d(void *dst, const void *src, size_t n) {
    CK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, g_st));
    CK(cudaStreamSynchronize(g_st));
}
static void run(int t, int64_t R, int64_t C, int T, int mv, int tile, std::vector<float> &y) {
    cu_set_matvec_rows(mv);
    cu_set_tile(tile);
    CK(cudaMemsetAsync(g_y, 0xff, sizeof(float) * R * T, g_st));
    CK(cu_matmul_launch((df_wtype)t, g_d, g_s, R, C, (const float *)g_x, T, (float *)g_y, g_st));
    y.resize((size_t)R * T);
    CK(cudaMemcpyAsync(y.data(), g_y, sizeof(float) * R * T, cudaMemcpyDeviceToHost, g_st));
    CK(cudaStreamSynchronize(g_st));
    cu_set_matvec_rows(0);
    cu_set_tile(0);
}

static void check_case(int t, int64_t R, int64_t C, bool wide) {
    std::vector<uint8_t> d, s;
    make(t, R, C, d, s, wide);
    const int TM = 130;
    std::vector<float> x((size_t)TM * C);
    for (auto &v : x) v = rndf();
    h2d(g_d, d.data(), d.size());
    if (s.size()) h2d(g_s, s.data(), s.size());
    h2d(g_x, x.data(), sizeof(float) * x.size());
    static const int Ts[] = {1, 2, 3, 5, 7, 8, 9, 17, 64, 130};
    std::vector<float> ref, y, y1;
    int bad = 0;
    std::string what;
    for (int T : Ts) {
        run(t, R, C, T, 1, 1, ref); /* the reference kernel */
        if (T == 1 && t == 1) { /* warm: nothing */ }
        if ((t <= 1 || t == 5) && T == (t == 5 && R * C > 1000000 ? 9 : 130)) { /* host double-precision product */
            double worst = 0;
            for (int64_t r = 0; r < R; r++)
                for (int tt = 0; tt < T; tt++) {
                    double a = 0, m = 0;
                    for (int64_t c = 0; c < C; c++) {
                        float w;
                        if (t == 5) {
                            static const float e2m1[16] = {0, .5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -.5f, -1, -1.5f, -2, -3, -4, -6};
                            const int e = s[(size_t)(r * C + c) / 32];
                            const int code = (d[(size_t)(r * C + c) / 2] >> (4 * (c & 1))) & 15;
                            w = e == 255 ? NAN : (float)ldexp((double)e2m1[code], e - 127);
                        } else if (t == 0) memcpy(&w, &d[4 * (r * C + c)], 4);
                        else { uint32_t u = (uint32_t)d[2 * (r * C + c)] << 16 | (uint32_t)d[2 * (r * C + c) + 1] << 24; memcpy(&w, &u, 4); }
                        a += (double)w * x[(size_t)tt * C + c];
                        m += fabs((double)w * x[(size_t)tt * C + c]);
                    }
                    worst = fmax(worst, fabs(a - ref[(size_t)tt * R + r]) / (m + 1e-30));
                }
            if (!(worst <= 1e-5)) { bad++; what += " host-ref(" + std::to_string(worst) + ")"; }
            else what += " host-ref max " + std::to_string(worst);
        }
        const int vs[][2] = {{0, 0}, {2, 2}, {4, 4}, {8, 8}};
        for (auto &v : vs) {
            run(t, R, C, T, v[0], v[1], y);
            if (memcmp(y.data(), ref.data(), sizeof(float) * y.size())) {
                bad++;
                what += " T=" + std::to_string(T) + "/mv" + std::to_string(v[0]) + "/tile" + std::to_string(v[1]);
            }
        }
        /* batch invariance: each row against the automatic one-token kernel (x row t copied to the front) */
        for (int tt = 0; tt < T && tt < 4; tt++) {
            h2d(g_x, x.data() + (size_t)tt * C, sizeof(float) * C);
            run(t, R, C, 1, 0, 0, y1);
            h2d(g_x, x.data(), sizeof(float) * x.size());
            if (memcmp(y1.data(), ref.data() + (size_t)tt * R, sizeof(float) * R)) { bad++; what += " inv T=" + std::to_string(T) + " t=" + std::to_string(tt); }
        }
    }
    printf("%s %-9s %6lldx%-6lld %s%s\n", bad ? "FAIL" : "ok  ", NAMES[t], (long long)R, (long long)C, wide ? "(wide scales/NaN) " : "", what.c_str());
    if (bad) fails++; else passes++;
}

static double bench(int t, int64_t R, int64_t C, int T, int mv, int tile) {
    CK(cu_fill_random(g_d, data_bytes(t, R, C), 1, g_st));
    if (scale_bytes(t, R, C)) CK(cudaMemsetAsync(g_s, t == 5 ? 0x7f : 0x3c, scale_bytes(t, R, C), g_st));
    if (t == 3) { /* no NaN codes (real checkpoints have none): clear the mantissa's low bit */
        std::vector<uint8_t> h(data_bytes(t, R, C));
        CK(cudaStreamSynchronize(g_st));
        CK(cudaMemcpy(h.data(), g_d, h.size(), cudaMemcpyDeviceToHost));
        for (auto &b : h) b &= 0xfe;
        h2d(g_d, h.data(), h.size());
    }
    CK(cudaMemsetAsync(g_x, 0, sizeof(float) * T * C, g_st));
    cu_set_matvec_rows(mv);
    cu_set_tile(tile);
    const int iters = T >= 256 ? 5 : 50;
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0); cudaEventCreate(&e1);
    CK(cu_matmul_launch((df_wtype)t, g_d, g_s, R, C, (const float *)g_x, T, (float *)g_y, g_st));
    cudaEventRecord(e0, g_st);
    for (int i = 0; i < iters; i++) cu_matmul_launch((df_wtype)t, g_d, g_s, R, C, (const float *)g_x, T, (float *)g_y, g_st);
    cudaEventRecord(e1, g_st);
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0); cudaEventDestroy(e1);
    cu_set_matvec_rows(0);
    cu_set_tile(0);
    return ms / iters;
}

int main(int argc, char **argv) {
    CK(cudaStreamCreateWithFlags(&g_st, cudaStreamNonBlocking));
    if (getenv("CKC_MMA")) cu_set_mma((unsigned)strtoul(getenv("CKC_MMA"), NULL, 0)); /* e.g. 0x22: bf16 too */
    const size_t big = (size_t)32768 * 7168 * 4 + 4096;
    CK(cudaMalloc(&g_d, big)); CK(cudaMalloc(&g_s, big / 16)); CK(cudaMalloc(&g_x, sizeof(float) * 512 * 20000 + 4096));
    CK(cudaMalloc(&g_y, sizeof(float) * 512 * 32768 + 4096));
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "check")) {
            static const struct { int t; int64_t R, C; bool wide; } cases[] = {
                {0, 67, 256, 0}, {0, 9, 100, 0}, {0, 70, 12, 0}, {1, 130, 512, 0}, {1, 33, 72, 0}, {1, 33, 20000, 0},
                {2, 64, 384, 0}, {2, 3, 8, 0}, {3, 300, 640, 0}, {3, 129, 2064, 0}, {3, 260, 1024, 1}, {4, 96, 1024, 0},
                {4, 45, 96, 0}, {5, 200, 2048, 0}, {5, 7, 7168, 0}, {5, 37, 1088, 0}, {5, 100, 2048, 1}, {6, 50, 272, 0},
                {0, 9, 101, 0}, {1, 33, 70, 0}, {3, 20, 150, 0}, {5, 2048, 7168, 1}, {1, 7168, 256, 0},
            };
            for (auto &c : cases)
                if ((DF_CUDA_ENCS >> c.t) & 1) check_case(c.t, c.R, c.C, c.wide);
            printf("%d passed, %d failed\n", passes, fails);
        } else if (!strcmp(argv[a], "bench") && a + 3 < argc) {
            std::vector<int> types, Ts;
            std::vector<std::pair<int64_t, int64_t>> shapes;
            for (char *p = strtok(argv[a + 1], ","); p; p = strtok(NULL, ","))
                for (int i = 0; i < 7; i++) if (!strcmp(p, NAMES[i])) types.push_back(i);
            for (char *p = strtok(argv[a + 2], ","); p; p = strtok(NULL, ",")) { long long r, c; sscanf(p, "%lldx%lld", &r, &c); shapes.push_back({r, c}); }
            for (char *p = strtok(argv[a + 3], ","); p; p = strtok(NULL, ",")) Ts.push_back(atoi(p));
            a += 3;
            const char *re = getenv("CKC_REF");
            const bool ref = re && *re == '1';
            /* HBM: device-to-device copy of 4 GiB, bytes read + written */
            void *p0, *p1;
            const size_t n = (size_t)4 << 30;
            CK(cudaMalloc(&p0, n)); CK(cudaMalloc(&p1, n));
            cudaEvent_t e0, e1;
            cudaEventCreate(&e0); cudaEventCreate(&e1);
            CK(cudaMemcpyAsync(p1, p0, n, cudaMemcpyDeviceToDevice, g_st));
            cudaEventRecord(e0, g_st);
            for (int i = 0; i < 10; i++) cudaMemcpyAsync(p1, p0, n, cudaMemcpyDeviceToDevice, g_st);
            cudaEventRecord(e1, g_st);
            CK(cudaEventSynchronize(e1));
            float ms;
            cudaEventElapsedTime(&ms, e0, e1);
            const double bw = 2.0 * n * 10 / (ms * 1e-3);
            cudaFree(p0); cudaFree(p1);
            printf("HBM %.1f GB/s (device-to-device copy, read + written)\n", bw / 1e9);
            printf("%-9s %-12s %-6s %5s %10s %9s %6s %9s\n", "encoding", "shape", "kernel", "T", "ms/call", "GB/s", "%HBM", "TFLOP/s");
            for (int t : types)
                for (auto &sh : shapes)
                    for (int T : Ts) {
                        const int vs1[][3] = {{0, 0, 0}, {2, 0, 2}, {4, 0, 4}, {8, 0, 8}, {1, 1, 1}};
                        const int vsT[][3] = {{0, 0, 0}, {0, 2, 2}, {0, 4, 4}, {0, 8, 8}, {1, 1, 1}};
                        const int nv = ref ? 5 : 4; /* env CKC_REF=1: also the reference kernel */
                        const unsigned mma0 = cu_get_mma(), alt = (t == 1 || t == 5);
                        for (int k = 0; k < nv + (int)alt; k++) {
                            /* the last row: MXFP4 / BF16 on the other kernel family (tensor-core / fp32-FMA) */
                            const int other = k == nv;
                            const int *v = other ? vs1[0] : T == 1 ? vs1[k] : vsT[k];
                            if (other) cu_set_mma(mma0 ^ (1u << t));
                            const double m = bench(t, sh.first, sh.second, T, v[0], v[1]);
                            cu_set_mma(mma0);
                            const double wb = (double)(data_bytes(t, sh.first, sh.second) + scale_bytes(t, sh.first, sh.second));
                            const char *kn[] = {"auto", "ref", "v2", "", "v4", "", "", "", "v8"};
                            printf("%-9s %5lldx%-6lld %-6s %5d %10.4f %9.1f %6.1f %9.2f\n", NAMES[t], (long long)sh.first,
                                   (long long)sh.second, other ? ((mma0 >> t) & 1 ? "fma" : "mma") : kn[v[2]], T, m, wb / (m * 1e-3) / 1e9, 100 * wb / (m * 1e-3) / bw,
                                   2.0 * sh.first * sh.second * T / (m * 1e-3) / 1e12);
                            fflush(stdout);
                        }
                    }
        }
    }
    return fails ? 1 : 0;
}
