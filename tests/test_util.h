/* test_util.h — tiny assertion helpers; every test program ends with
 * "N passed, N failed" and exits non-zero on any failure. */
#ifndef DF_TEST_UTIL_H
#define DF_TEST_UTIL_H
#include <stdio.h>
#include <stdlib.h>
#include <math.h>

static int t_pass, t_fail;
#define CHECK(cond, ...) do { if (cond) t_pass++; else { t_fail++; \
    fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
    fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); } } while (0)
#define CHECK_NEAR(a, b, tol, what) CHECK(fabs((double)(a) - (double)(b)) <= (tol), \
    "%s: %.9g vs %.9g (tol %g)", what, (double)(a), (double)(b), (double)(tol))
static inline int t_done(void) {
    printf("%d passed, %d failed\n", t_pass, t_fail);
    return t_fail ? 1 : 0;
}
#endif
