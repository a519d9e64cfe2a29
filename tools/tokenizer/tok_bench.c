/* tok_bench.c — tokenizer throughput benchmark (not part of the build; built by
 * tools/tokenizer/build_bench.sh so it can be carried to a machine without our
 * -dev packages). Usage: tok_bench TOKENIZER [--config CFG] INPUT [REPS]
 * Prints seconds, MB/s, id count and FNV-1a 64 of the ids (int32 LE). */
#include "deltafin.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const char *cfg = NULL;
    const char *pos[3] = {0};
    int np = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--config") && i + 1 < argc) cfg = argv[++i];
        else if (np < 3) pos[np++] = argv[i];
    }
    if (np < 2) { fprintf(stderr, "usage: tok_bench TOKENIZER [--config CFG] INPUT [REPS]\n"); return 2; }
    int reps = np > 2 ? atoi(pos[2]) : 1;
    char err[1024];
    df_tokenizer *t;
    double t0 = now();
    if (df_tokenizer_open(&t, pos[0], cfg, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
    double tload = now() - t0;
    FILE *f = fopen(pos[1], "rb");
    if (!f) { perror(pos[1]); return 1; }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t)n) return 1;
    fclose(f);
    double best = 1e9;
    int32_t *ids = NULL;
    size_t ni = 0;
    for (int r = 0; r < reps; r++) {
        free(ids);
        t0 = now();
        if (df_tokenize(t, buf, n, 0, &ids, &ni, err, sizeof err)) { fprintf(stderr, "%s\n", err); return 1; }
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < ni; i++)
        for (int k = 0; k < 4; k++) { h ^= (uint8_t)((uint32_t)ids[i] >> (8 * k)); h *= 0x100000001b3ull; }
    printf("deltafin %-40s load %.2fs  encode %7.3f s  %6.2f MB/s  %zu ids  fnv %016llx\n", pos[0], tload, best,
           n / best / 1e6, ni, (unsigned long long)h);
    free(ids); free(buf);
    df_tokenizer_free(t);
    return 0;
}
