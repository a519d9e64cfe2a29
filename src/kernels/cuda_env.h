/*
 * cuda_env.h — the CUDA backend's environment knobs (docs/cuda.md): DF_CUDA_MMA, the encodings whose matmuls run
 * on the tensor-core kernel, the on/off switches DF_CUDA_MLP_GROUP, DF_CUDA_ATTN, DF_CUDA_MLA_PROJECT,
 * DF_CUDA_MLA_BLOCK, DF_CUDA_MOE_RESID, DF_CUDA_HOST_PIN, DF_CUDA_SPLIT, DF_CUDA_SHARED_EARLY, DF_CUDA_PDL, DF_CUDA_SIDE_STREAM, DF_CUDA_COPY_KERNEL, DF_CUDA_MOE_ROUTE, DF_CUDA_GREEDY, DF_CUDA_KDA, DF_CUDA_KDA_BLOCK and DF_CUDA_KDA_SNAP, the
 * kernel variants DF_CUDA_MV_ROWS and DF_CUDA_TILE, and DF_CUDA_KV_MIRROR, the GPU memory of the attention core's
 * latent-cache mirrors. Read the same way by the backend's choice (backend.c: --backend cuda / auto refuse an
 * invalid value, on any machine), by the CUDA runtime's probe (cuda_runtime.cu: DF_CUDA_MMA, the variants,
 * DF_CUDA_HOST_PIN, DF_CUDA_PDL, DF_CUDA_SIDE_STREAM, DF_CUDA_COPY_KERNEL), by the backend table (cuda_backend.c: the other switches) and by the attention core
 * (cuda_attn.cu: DF_CUDA_KV_MIRROR, on its first call). Plain C, also compiled as C++ by nvcc.
 */
#ifndef DF_KERNELS_CUDA_ENV_H
#define DF_KERNELS_CUDA_ENV_H

#include "model/weights.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the encodings the tensor-core kernel supports, as DF_CUDA_MMA bits (1 << df_wtype): 0x2 BF16, 0x20 MXFP4 */
#define DF_CUDA_MMA_BITS ((1u << DF_W_MXFP4) | (1u << DF_W_BF16))

/* DF_CUDA_MMA: unset or empty: 0 (the default, MXFP4). A bit mask of DF_CUDA_MMA_BITS, decimal or 0x hex: 1 with it
 * in *mask. Anything else (not a number, a sign, trailing characters, other bits): -1 with a message naming the
 * variable and the accepted values in why. */
static inline int df_cuda_env_mma(unsigned *mask, char *why, size_t whylen) {
    const char *v = getenv("DF_CUDA_MMA");
    if (!v || !*v) return 0;
    const char *p = v;
    int base = 10;
    if (p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) { base = 16; p += 2; }
    const int digit = (*p >= '0' && *p <= '9') || (base == 16 && ((*p >= 'a' && *p <= 'f') || (*p >= 'A' && *p <= 'F')));
    char *end = NULL;
    errno = 0;
    unsigned long m = digit ? strtoul(p, &end, base) : 0;
    if (!digit || *end || errno || (m & ~(unsigned long)DF_CUDA_MMA_BITS)) {
        if (why && whylen)
            snprintf(why, whylen, "environment variable DF_CUDA_MMA=\"%.40s%s\": expected a bit mask of tensor-core "
                     "encodings, decimal or 0x hex: 0 (none), 2 = 0x2 (BF16), 32 = 0x20 (MXFP4, the default) or 34 = 0x22 "
                     "(both); unset it or fix its value", v, strlen(v) > 40 ? "..." : "");
        return -1;
    }
    *mask = (unsigned)m;
    return 1;
}

/* The CUDA backend's on/off developer knobs (docs/cuda.md): DF_CUDA_MLP_GROUP (a MoE chunk's expert MLPs in one
 * round trip), DF_CUDA_ATTN (the MLA attention core on the GPU), DF_CUDA_MLA_PROJECT (the MLA projections in one
 * round trip, and o_proj with the core), DF_CUDA_MLA_BLOCK (a layer's whole MLA mixer, residual, FFN norm and router
 * in one round trip), DF_CUDA_MOE_RESID (a decode step's MoE added into the device residual without a round trip),
 * DF_CUDA_HOST_PIN (page-locked host staging buffers), DF_CUDA_SPLIT (matrices of at most 2048 rows split over K:
 * a canonical order of their own, so the switch changes bits) and DF_CUDA_SHARED_EARLY (an MLA block starts the
 * next MoE's shared expert before it returns). df_cuda_env_switch_def: unset or empty: def; "1" or "on": 1; "0" or
 * "off": 0; anything else: -1 with a message naming the variable and the accepted values in why. df_cuda_env_switch:
 * the default 1 (on). */
static inline int df_cuda_env_switch_def(const char *name, int def, char *why, size_t whylen) {
    const char *v = getenv(name);
    if (!v || !*v) return def;
    if (!strcmp(v, "1") || !strcmp(v, "on")) return 1;
    if (!strcmp(v, "0") || !strcmp(v, "off")) return 0;
    if (why && whylen)
        snprintf(why, whylen, "environment variable %s=\"%.40s%s\": expected 1 or on%s, 0 or off%s (lower case); unset it "
                 "or fix its value", name, v, strlen(v) > 40 ? "..." : "", def ? " (the default)" : "", def ? "" : " (the default)");
    return -1;
}
static inline int df_cuda_env_switch(const char *name, char *why, size_t whylen) {
    return df_cuda_env_switch_def(name, 1, why, whylen);
}

/* A knob whose value is one digit of `allowed` (e.g. "01248"): unset or empty = 0; that digit's value in *out; anything
 * else: -1 with "environment variable NAME="VALUE": expected EXPECT; unset it or fix its value" in why. */
static inline int df_cuda_env_digit(const char *name, const char *allowed, const char *expect, int *out, char *why,
                                    size_t whylen) {
    const char *v = getenv(name);
    *out = 0;
    if (!v || !*v) return 0;
    if (v[1] == 0 && strchr(allowed, v[0])) {
        *out = v[0] - '0';
        return 0;
    }
    if (why && whylen)
        snprintf(why, whylen, "environment variable %s=\"%.40s%s\": expected %s; unset it or fix its value", name, v,
                 strlen(v) > 40 ? "..." : "", expect);
    return -1;
}

/* The matmul kernel variant knobs (docs/cuda.md): DF_CUDA_MV_ROWS (one token) and DF_CUDA_TILE (T >= 2). Unset or
 * empty: 0 (automatic); one of 0 (automatic), 1, 2, 4, 8 exactly: that value in *out; anything else (not a number,
 * a sign, trailing characters, another number): -1 with a message naming the variable and the accepted values. */
static inline int df_cuda_env_variant(const char *name, int *out, char *why, size_t whylen) {
    return df_cuda_env_digit(name, "01248", "a kernel variant 0 (automatic, the default), 1, 2, 4 or 8", out, why, whylen);
}

/* DF_CUDA_MMA_KS, the tensor-core kernel's most K slices (docs/cuda.md): unset or empty = 0 (the default, 2);
 * "1", "2", "4" or "8" = that many. Anything else: -1 with a message naming the variable in why. */
static inline int df_cuda_env_ks(int *out, char *why, size_t whylen) {
    return df_cuda_env_digit("DF_CUDA_MMA_KS", "1248", "the tensor-core kernel's most K slices, 1, 2 (the default), 4 or 8",
                             out, why, whylen);
}

/* DF_CUDA_KV_MIRROR, the GPU memory all the attention core's device mirrors of latent KV caches may hold together
 * (docs/cuda.md). Unset, empty, "1" or "on": 1 with *bytes = 0 (on, the default cap: 1/8 of the device's memory);
 * "0" or "off": 0 (off: every call uploads its caches whole); a size, digits with an optional fraction and a unit
 * K, M, G or T (powers of 1024, case-insensitive, optionally followed by "iB" or "B"; e.g. "512M", "4G", "1.5GiB"):
 * 1 with that many bytes in *bytes (a size of 0 bytes is off: 0). Anything else (no unit, a sign, other characters):
 * -1 with a message naming the variable and the accepted values in why. */
static inline int df_cuda_env_kv_mirror(unsigned long long *bytes, char *why, size_t whylen) {
    const char *v = getenv("DF_CUDA_KV_MIRROR");
    *bytes = 0;
    if (!v || !*v || !strcmp(v, "1") || !strcmp(v, "on")) return 1;
    if (!strcmp(v, "0") || !strcmp(v, "off")) return 0;
    const char *p = v;
    double x = 0, f = 1;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) x = x * 10 + (*p - '0');
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) x += (*p - '0') * (f /= 10);
    double unit = 0;
    switch (*p) {
    case 'k': case 'K': unit = 1024.0; break;
    case 'm': case 'M': unit = 1048576.0; break;
    case 'g': case 'G': unit = 1073741824.0; break;
    case 't': case 'T': unit = 1099511627776.0; break;
    default: break;
    }
    if (unit > 0) {
        p++;
        if (*p == 'i' && (p[1] == 'B' || p[1] == 'b')) p++;
        if (*p == 'B' || *p == 'b') p++;
    }
    if (!digits || unit == 0 || *p || x * unit >= 18446744073709551616.0) {
        if (why && whylen)
            snprintf(why, whylen, "environment variable DF_CUDA_KV_MIRROR=\"%.40s%s\": expected 1 or on (the default: "
                     "up to 1/8 of the GPU's memory), 0 or off, or a size with a unit such as 512M or 4G; unset it or fix "
                     "its value", v, strlen(v) > 40 ? "..." : "");
        return -1;
    }
    *bytes = (unsigned long long)(x * unit);
    return *bytes ? 1 : 0;
}

/* DF_CUDA_TRACE (cuda_trace.c, off by default): unset, empty, "0" or "off": 0; "1" or "on": 1 (host clocks and device
 * events); "2": 2 (host clocks only); anything else: -1 with a message in why. */
static inline int df_cuda_env_trace(char *why, size_t whylen) {
    const char *v = getenv("DF_CUDA_TRACE");
    if (!v || !*v || !strcmp(v, "0") || !strcmp(v, "off")) return 0;
    if (!strcmp(v, "1") || !strcmp(v, "on")) return 1;
    if (!strcmp(v, "2")) return 2;
    if (why && whylen)
        snprintf(why, whylen, "environment variable DF_CUDA_TRACE=\"%.40s%s\": expected 1 (on), 2 (host clocks only) or 0 "
                 "(off, the default); unset it or fix its value", v, strlen(v) > 40 ? "..." : "");
    return -1;
}

/* Every CUDA knob above checked: 0, or -1 with the first invalid one's message in why (may be NULL). */
static inline int df_cuda_env_check(char *why, size_t whylen) {
    unsigned mma;
    if (df_cuda_env_mma(&mma, why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_MLP_GROUP", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_ATTN", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_MLA_PROJECT", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_MLA_BLOCK", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_MOE_RESID", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_HOST_PIN", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_SPLIT", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_SHARED_EARLY", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_PDL", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_SIDE_STREAM", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_COPY_KERNEL", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_MOE_ROUTE", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_GREEDY", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_KDA", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_KDA_BLOCK", why, whylen) < 0) return -1;
    if (df_cuda_env_switch("DF_CUDA_KDA_SNAP", why, whylen) < 0) return -1;
    if (df_cuda_env_trace(why, whylen) < 0) return -1;
    unsigned long long mirror;
    if (df_cuda_env_kv_mirror(&mirror, why, whylen) < 0) return -1;
    int variant;
    if (df_cuda_env_variant("DF_CUDA_MV_ROWS", &variant, why, whylen) < 0) return -1;
    if (df_cuda_env_variant("DF_CUDA_TILE", &variant, why, whylen) < 0) return -1;
    if (df_cuda_env_ks(&variant, why, whylen) < 0) return -1;
    return 0;
}

#endif
