/*
 * cpu_avx2_fp8.c — AVX2 fused FP8 (block 128) matmul kernels for 1 <= T <= 8 tokens (cpu_internal.h): none yet,
 * FP8 runs the generic decode_row + dot path.
 */
#include "cpu_internal.h"

int avx2_fp8_rows(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_fp8_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)x; (void)T; (void)y; (void)r0; (void)r1;
}
