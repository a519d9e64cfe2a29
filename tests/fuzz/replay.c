/*
 * replay.c — runs a fuzz target (fuzz.h) over files: each argument is a file, or a directory whose regular files
 * are taken in name order. Every input must return without a crash, a sanitizer report or a failed property (those
 * abort the program: CTest reports the test failed, and the last "input:" line names the file). Prints one line per
 * input with -v, and the closing "N passed, N failed" line.
 */
#include "fuzz.h"

#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

static int pass;
static int verbose;

static void run_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "replay: cannot open %s\n", path); exit(1); }
    uint8_t *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            if (!nb) { fprintf(stderr, "replay: out of memory reading %s\n", path); exit(1); }
            buf = nb;
        }
        const size_t got = fread(buf + n, 1, cap - n, f);
        if (!got) break;
        n += got;
    }
    fclose(f);
    fprintf(stderr, "input: %s (%zu bytes)\n", path, n);
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    pass++;
    if (verbose) printf("ok %s\n", path);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void run_path(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) { fprintf(stderr, "replay: %s: no such file or directory\n", path); exit(1); }
    if (!S_ISDIR(st.st_mode)) { run_file(path); return; }
    DIR *d = opendir(path);
    if (!d) { fprintf(stderr, "replay: cannot read %s\n", path); exit(1); }
    char **names = NULL;
    size_t nn = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char **nb = realloc(names, (nn + 1) * sizeof *names);
        if (!nb) exit(1);
        names = nb;
        names[nn] = malloc(strlen(path) + strlen(e->d_name) + 2);
        sprintf(names[nn++], "%s/%s", path, e->d_name);
    }
    closedir(d);
    qsort(names, nn, sizeof *names, cmp_str);
    for (size_t i = 0; i < nn; i++) {
        struct stat fs;
        if (stat(names[i], &fs) == 0 && S_ISREG(fs.st_mode)) run_file(names[i]);
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv) {
    int i = 1;
    if (i < argc && !strcmp(argv[i], "-v")) { verbose = 1; i++; }
    if (i >= argc) { fprintf(stderr, "usage: %s [-v] FILE|DIR...\n", argv[0]); return 2; }
    for (; i < argc; i++) run_path(argv[i]);
    printf("%d passed, 0 failed\n", pass);
    return 0;
}
