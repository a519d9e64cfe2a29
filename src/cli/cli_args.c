/* cli_args.c — argument parsing shared by the subcommands (one definition of a
 * size and of "a regular file in a directory", so every command accepts the same forms). */
#include "cli.h"
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1048576.0; end++; break;
    case 'g': case 'G': v *= 1073741824.0; end++; break;
    case 't': case 'T': v *= 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v >= 18446744073709551616.0) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_known_option(const char *a, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(a, *names)) return 1;
    return 0;
}

int cli_is_file(const char *dir, const char *name) {
    char p[8192];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int cli_check_model_dir(const char *cmd, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            fprintf(stderr, "deltafin %s: --model %s: no such directory (expected a model directory with manifest.json "
                            "or config.json)\n", cmd, path);
        else fprintf(stderr, "deltafin %s: --model %s: %s\n", cmd, path, strerror(e));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "deltafin %s: --model %s is not a directory (expected a model directory with manifest.json or "
                        "config.json)\n", cmd, path);
        return 1;
    }
    return 0;
}

int cli_check_backend(const char *cmd, const char *name) {
    static const char *const ok[] = {"auto", "cpu", "cpu-scalar", "cpu-avx2", "cpu-avx512", "cuda", NULL};
    for (int i = 0; ok[i]; i++)
        if (!strcmp(name, ok[i])) return 0;
    fprintf(stderr, "deltafin %s: --backend \"%s\": expected auto, cpu, cpu-scalar, cpu-avx2, cpu-avx512 or cuda\n", cmd, name);
    return 2;
}

const char *cli_default_backend(void) {
    const char *e = getenv("DF_BACKEND");
    return e && *e ? e : "auto";
}

int cli_parse_mode(const char *cmd, const char *flag, const char *v, int *out) {
    const int pf = !strcmp(flag, "--prefetch");
    if (!strcmp(v, "auto")) *out = 0;
    else if (!strcmp(v, "on")) *out = 1;
    else if (!strcmp(v, "off")) *out = 2;
    else if (pf && !strcmp(v, "ungated")) *out = 3;
    else {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected auto, on%s off\n", cmd, flag, v, pf ? ", ungated or" : " or");
        return -1;
    }
    return 0;
}

int cli_stderr_tty(void) {
    static int tty = -1;
    if (tty < 0) tty = isatty(2) != 0;
    return tty;
}

const char *cli_cr(void) { return cli_stderr_tty() ? "\r" : ""; }
