/* progress.c — a tiny self-overwriting progress line for long operations
 * (convert, verify); usable directly as a df_progress_fn. */
#include "util.h"

#include <string.h>

void df_progress_printer_init(df_progress_printer *p, FILE *out, const char *label) {
    memset(p, 0, sizeof *p);
    p->out = out ? out : stderr;
    p->label = label ? label : "";
    p->t_start = p->t_last = df_now();
}

int df_progress_print(void *user, const char *what, uint64_t done, uint64_t total) {
    df_progress_printer *p = user;
    if (!p || p->finished) return 0;
    double t = df_now();
    int last = total && done >= total;
    if (!last && t - p->t_last < 0.1) return 0;
    p->t_last = t;
    double el = t - p->t_start;
    double pct = total ? 100.0 * (double)done / (double)total : 0.0;
    if (what && !strcmp(what, "bytes")) {
        double mb = (double)done / 1e6, tmb = (double)total / 1e6;
        fprintf(p->out, "\r%s: %.1f / %.1f MB  %5.1f%%  %.1f MB/s   ", p->label, mb, tmb, pct,
                el > 0 ? mb / el : 0.0);
    } else {
        fprintf(p->out, "\r%s: %llu / %llu %s  %5.1f%%   ", p->label, (unsigned long long)done,
                (unsigned long long)total, what ? what : "", pct);
    }
    if (last) {
        fprintf(p->out, "(%.1f s)\n", el);
        p->finished = 1;
    }
    fflush(p->out);
    return 0;
}
