/*
 * cli_preload.c — `--preload` of run, serve and bench decode: every routed expert read into memory before the first
 * token (df_model_preload), with a progress line on stderr and a closing line saying where the experts are.
 */
#include "cli.h"
#include "deltafin.h"
#include <stdio.h>
#include <time.h>

typedef struct {
    int quiet, open;
    time_t last;
} preload_progress;

static int on_preload(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)what;
    preload_progress *p = user;
    const time_t now = time(NULL);
    if (p->quiet || !cli_stderr_tty() || now == p->last || done >= total) return 0;
    p->last = now;
    fprintf(stderr, "%spreload: %llu / %llu experts", cli_cr(), (unsigned long long)done, (unsigned long long)total);
    p->open = 1;
    return 0;
}

int cli_preload(const char *cmd, df_model *m, int quiet) {
    preload_progress p = {quiet, 0, 0};
    df_preload_info in;
    char err[2048] = "";
    const int rc = df_model_preload(m, on_preload, &p, &in, err, sizeof err);
    if (p.open) fprintf(stderr, "%s", cli_stderr_tty() ? "\r\033[K" : "\n");
    if (rc) {
        fprintf(stderr, "deltafin %s: --preload: %s\n", cmd, err[0] ? err : df_strerror(rc));
        return 1;
    }
    char line[256];
    if (!quiet) fprintf(stderr, "%s\n", df_preload_describe(&in, line, sizeof line));
    return 0;
}
