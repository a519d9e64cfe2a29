/*
 * backend.c — runtime selection of the compute backend by name and CPU
 * features (cpuid via __builtin_cpu_supports, and cpuid.h for F16C), and weight byte accounting.
 */
#include "backend.h"
#include "cpu/cpu_internal.h"
#include "kernels/cuda.h"
#include "kernels/cuda_env.h"

#include <stdio.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
/* F16C (CPUID leaf 1, ECX bit 29) from cpuid itself: not every compiler's __builtin_cpu_supports knows "f16c"
 * (clang 14 does not) */
static int have_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
}
#endif

static int have_avx2(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && have_f16c();
#else
    return 0;
#endif
}

static int have_avx512(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
#else
    return 0;
#endif
}

static const df_backend *g_extra_be;
void df_backend_register(const df_backend *b) { g_extra_be = b; }

const df_backend *df_backend_get(const char *name) {
    if (g_extra_be && name && !strcmp(name, g_extra_be->name)) return g_extra_be;
    if (!name || !*name || !strcmp(name, "cpu")) {
        if (have_avx512()) return &df_backend_cpu_avx512;
        if (have_avx2()) return &df_backend_cpu_avx2;
        return &df_backend_cpu_scalar;
    }
    /* the CUDA backend's settings are checked before it is considered: an invalid DF_CUDA_* knob stops cuda and
     * auto alike (never a silent fallback to the CPU), on machines with or without a GPU */
    if ((!strcmp(name, "cuda") || !strcmp(name, "auto")) && df_cuda_env_check(NULL, 0) < 0) return NULL;
    if (!strcmp(name, "cuda")) return df_cuda_backend();
    if (!strcmp(name, "auto")) {
        const df_backend *c = df_cuda_backend();
        return c ? c : df_backend_get("cpu");
    }
    if (!strcmp(name, "cpu-scalar")) return &df_backend_cpu_scalar;
    if (!strcmp(name, "cpu-avx2")) return have_avx2() ? &df_backend_cpu_avx2 : NULL;
    if (!strcmp(name, "cpu-avx512")) return have_avx512() ? &df_backend_cpu_avx512 : NULL;
    return NULL;
}

const char *df_backend_why(const char *name, char *buf, size_t len) {
    if (name && (!strcmp(name, "cuda") || !strcmp(name, "auto")) && df_cuda_env_check(buf, len) < 0) {
        /* say so when this machine could not use the GPU anyway: the knob is what to fix, or --backend cpu */
        const size_t n = strlen(buf);
        if (!df_cuda_probe(NULL, 0) && n + 2 < len)
            snprintf(buf + n, len - n, " (no usable CUDA device here; --backend cpu ignores DF_CUDA_*)");
        return buf;
    }
    if (name && !strcmp(name, "cuda")) {
        if (df_cuda_probe(buf, len)) snprintf(buf, len, "available");
        return buf;
    }
    snprintf(buf, len, "unknown or not supported by this CPU (use auto, cpu, cpu-scalar, cuda, or cpu-avx2 / cpu-avx512 "
             "where this CPU has them: it has %s)", df_cpu_features());
    return buf;
}

int df_backend_list(const df_backend **out, int cap) {
    int n = 0;
    if (n < cap) out[n++] = &df_backend_cpu_scalar;
    if (have_avx2() && n < cap) out[n++] = &df_backend_cpu_avx2;
    if (have_avx512() && n < cap) out[n++] = &df_backend_cpu_avx512;
    return n;
}

const char *df_cpu_features(void) {
    if (have_avx512()) return "avx512f avx512bw avx512vl avx2 fma f16c";
    if (have_avx2()) return "avx2 fma f16c";
    return "none (scalar)";
}

uint64_t df_weight_bytes(const df_weight *w) {
    int64_t r = w->rows, c = w->cols;
    switch (w->type) {
    case DF_W_F32: return (uint64_t)(r * c * 4);
    case DF_W_BF16:
    case DF_W_F16: return (uint64_t)(r * c * 2);
    case DF_W_FP8_B128: return (uint64_t)(r * c + ((r + 127) / 128) * ((c + 127) / 128) * 4);
    case DF_W_INT4_G32: return (uint64_t)(r * c / 2 + r * (c / 32) * 2);
    case DF_W_MXFP4: return (uint64_t)(r * c / 2 + r * (c / 32));
    case DF_W_INT8_ROW: return (uint64_t)(r * c + r * 4);
    default: return 0;
    }
}
