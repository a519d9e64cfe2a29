/* install.c — install.h: the checks of an installed model shared by setup, list and the commands naming setup's
 * repair (the side files against the checkpoint's copies; the quick check of a full install). */
#include "install.h"
#include "deltafin.h"
#include "model/native.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const install_side_files[] = {"tokenizer.json", "tokenizer_config.json", "tiktoken.model", "chat_template.jinja",
                                          "special_tokens_map.json", "generation_config.json", "README.md", NULL};

void install_checkpoint_dir(const char *dir, const char *repo, char *out, size_t cap) {
    const char *name = strchr(repo, '/');
    snprintf(out, cap, "%s/%s", dir, name ? name + 1 : repo);
}

/* 1 when files a and b both exist with the same bytes (small files: read whole) */
static int same_file(const char *a, const char *b) {
    char *x = NULL, *y = NULL;
    size_t nx = 0, ny = 0;
    int same = !df_read_file(a, &x, &nx, NULL, 0) && !df_read_file(b, &y, &ny, NULL, 0) && nx == ny && !memcmp(x, y, nx);
    free(x);
    free(y);
    return same;
}

int install_check_side_files(const char *nat_dir, const char *ck_dir, install_side_fn fn, void *user) {
    int n = 0;
    for (size_t i = 0; install_side_files[i]; i++) {
        char src[4200], dst[4200];
        snprintf(src, sizeof src, "%s/%s", ck_dir, install_side_files[i]);
        snprintf(dst, sizeof dst, "%s/%s", nat_dir, install_side_files[i]);
        if (!df_path_exists(src) || same_file(src, dst)) continue;
        install_side_problem p = {install_side_files[i], dst, src, !df_path_exists(dst)};
        if (fn) fn(user, &p);
        n++;
    }
    return n;
}

/* df_model_verify_all reads spine.bin first, then the experts: the quick check stops it at the first expert */
typedef struct { uint64_t spine_bytes; char first[1400]; } quick;

static int quick_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)what; (void)total;
    return done > ((quick *)user)->spine_bytes;
}

static void quick_problem(void *user, const df_verify_problem *p) {
    quick *q = user;
    if (!q->first[0]) snprintf(q->first, sizeof q->first, "%s", p->message);
}

static void side_first(void *user, const install_side_problem *p) {
    quick *q = user;
    if (!q->first[0])
        snprintf(q->first, sizeof q->first, "%s %s %s", p->installed, p->missing ? "is missing; the checkpoint's copy is" :
                 "differs from the checkpoint's copy", p->checkpoint);
}

int install_quick_check(const char *nat_dir, const char *ck_dir, char *why, size_t cap) {
    if (cap) why[0] = 0;
    df_native *nat = NULL;
    char err[1400] = "";
    if (native_open(&nat, nat_dir, err, sizeof err)) {
        snprintf(why, cap, "%s", err[0] ? err : "manifest.json cannot be read");
        native_close(nat);
        return 1;
    }
    if (nat->pack_error[0]) {
        snprintf(why, cap, "%s", nat->pack_error);
        native_close(nat);
        return 1;
    }
    quick q = {nat->spine_bytes, ""};
    native_close(nat);
    if (ck_dir && install_check_side_files(nat_dir, ck_dir, side_first, &q)) {
        snprintf(why, cap, "%s", q.first);
        return 1;
    }
    if (q.spine_bytes > INSTALL_QUICK_SPINE_BYTES) return 0;
    df_model_opts o;
    df_model_opts_default(&o);
    o.progress = quick_progress;
    o.progress_user = &q;
    df_verify_summary sum;
    int rc = df_model_verify_all(nat_dir, &o, quick_problem, &q, &sum, err, sizeof err);
    if (q.first[0]) { snprintf(why, cap, "%s", q.first); return 1; }
    if (rc < 0 && rc != DF_ECANCELLED) { snprintf(why, cap, "%s", err[0] ? err : df_strerror(rc)); return 1; }
    return 0;
}
