/*
 * cmd_doctor.c — `deltafin doctor [--model DIR]`: machine facts (cores, RAM,
 * SIMD features, io_uring availability) and, with --model, a full checksum
 * verification of the model's native files (df_model_verify).
 */
#define _GNU_SOURCE
#include "cli.h"
#include "deltafin.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int verify_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    static time_t last;
    time_t now = time(NULL);
    if (total && (done == total || now != last)) {
        last = now;
        fprintf(stderr, "\rverifying: %.1f%% of %.1f MB%s", 100.0 * done / total, total / 1e6, done == total ? "\n" : "");
    }
    return 0;
}

static const char *simd_features(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    static char buf[128];
    buf[0] = 0;
    if (__builtin_cpu_supports("avx512f")) strcat(buf, "avx512f ");
    if (__builtin_cpu_supports("avx512bw")) strcat(buf, "avx512bw ");
    if (__builtin_cpu_supports("avx512vl")) strcat(buf, "avx512vl ");
    if (__builtin_cpu_supports("avx2")) strcat(buf, "avx2 ");
    if (__builtin_cpu_supports("fma")) strcat(buf, "fma ");
    if (__builtin_cpu_supports("f16c")) strcat(buf, "f16c ");
    if (!buf[0]) strcpy(buf, "none");
    return buf;
#else
    return "none (not x86-64)";
#endif
}

/* io_uring_setup(0 entries) fails with EINVAL when the syscall exists, ENOSYS/EPERM when it is unavailable. */
static const char *uring_status(void) {
#ifdef __NR_io_uring_setup
    long r = syscall(__NR_io_uring_setup, 0, NULL);
    if (r >= 0) { close((int)r); return "available"; }
    if (errno == EINVAL || errno == EFAULT) return "available";
    if (errno == EPERM) return "blocked (EPERM: seccomp or kernel.io_uring_disabled); the pread pool is used";
    return "not available; the pread pool is used";
#else
    return "unknown";
#endif
}

int cmd_doctor(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: deltafin doctor [--model DIR]\n  prints machine facts; with --model, verifies every checksum of the model\n");
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else { fprintf(stderr, "deltafin doctor: unknown option '%s'\n", argv[i]); return 2; }
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    printf("deltafin %s\n", DELTAFIN_VERSION);
    printf("cores: %ld\n", cores);
    printf("RAM: %.1f GiB\n", ram / 1073741824.0);
    printf("SIMD: %s\n", simd_features());
    printf("io_uring: %s\n", uring_status());
    if (!model) return 0;
    char err[1024] = "";
    df_model_opts o;
    df_model_opts_default(&o);
    df_model *m = NULL;
    int rc = df_model_open(&m, model, &o, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin doctor: %s\n", err); return 1; }
    printf("model: %s\n", df_model_describe(m));
    rc = df_model_verify(m, verify_progress, NULL, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin doctor: verification FAILED: %s\n", err); df_model_close(m); return 1; }
    printf("checksums: all OK\n");
    df_model_close(m);
    return 0;
}
