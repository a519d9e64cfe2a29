/*
 * cpu_avx2_dense.c — AVX2 fused F32 / BF16 / F16 matmul kernels for 1 <= T <= 8 tokens (cpu_internal.h): none yet,
 * dense weights run the generic path.
 */
#include "cpu_internal.h"

int avx2_dense_rows(const df_weight *w, int T) { (void)w; (void)T; return 0; }
void avx2_dense_mm(const df_weight *w, const float *x, int T, float *y, int64_t r0, int64_t r1) {
    (void)w; (void)x; (void)T; (void)y; (void)r0; (void)r1;
}
