/* test_verify_all.c — the library side of issue 11 items 13 and 14:
 *  - df_model_verify_all reports every problem with its layer, expert, file and offset (two corrupt experts in
 *    different layers of a converted golden, then a corrupt spine.bin as well), fills the summary, returns the
 *    number of problems and summarises them in err; progress can cancel it; a clean model gives 0;
 *  - df_convert cancelled by its progress callback (what `deltafin convert` does on SIGINT / SIGTERM) at every
 *    point it can be cancelled leaves no file behind: no *.tmp, no renamed file, no tokenizer copy. */
#include "test_util.h"

#include "deltafin.h"
#include "model/native.h"
#include "util/util.h"

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

typedef struct {
    int n;
    int layer[16], expert[16];
    char file[16][1200], msg[16][1600];
    uint64_t offset[16], bytes[16];
} reports;

static void collect(void *user, const df_verify_problem *p) {
    reports *r = user;
    if (r->n >= 16) return;
    r->layer[r->n] = p->layer;
    r->expert[r->n] = p->expert;
    snprintf(r->file[r->n], sizeof r->file[0], "%s", p->file);
    snprintf(r->msg[r->n], sizeof r->msg[0], "%s", p->message);
    r->offset[r->n] = p->offset;
    r->bytes[r->n] = p->bytes;
    r->n++;
}

static void flip(const char *path, uint64_t off) {
    FILE *f = fopen(path, "r+b");
    if (!f) { CHECK(0, "open %s", path); return; }
    fseek(f, (long)off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, (long)off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static int n_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int cancel_at, calls;
static int cancel_cb(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user; (void)what; (void)done; (void)total;
    return ++calls >= cancel_at;
}

static void test_verify_all(void) {
    char out[512], err[2048], p[700];
    snprintf(out, sizeof out, "%s/m", tmpdir);
    int rc = df_convert("tests/golden/bf16_kimi", out, NULL, err, sizeof err);
    CHECK(rc == 0, "convert: %s", err);
    if (rc) return;
    df_native *n;
    if (native_open(&n, out, err, sizeof err)) { CHECK(0, "open: %s", err); return; }
    const uint64_t S = n->stride, spine_bytes = n->spine_bytes;
    const int ne = n->n_experts, nl = n->n_moe_layers;
    native_close(n);
    CHECK(ne == 8 && nl == 3, "golden shape: %d experts, %d MoE layers", ne, nl);

    reports r = {0};
    df_verify_summary s;
    rc = df_model_verify_all(out, NULL, collect, &r, &s, err, sizeof err);
    CHECK(rc == 0 && r.n == 0 && s.spine_ok && s.n_experts == 24 && s.n_bad_experts == 0 && s.n_moe_layers == 3 &&
              s.spine_bytes == spine_bytes && strstr(s.spine_file, "spine.bin"),
          "clean: rc %d, %d reports, spine_ok %d, %d/%d", rc, r.n, s.spine_ok, s.n_bad_experts, s.n_experts);

    /* two experts in different layers */
    snprintf(p, sizeof p, "%s/experts-L001.pack", out);
    flip(p, 2 * S + 100);
    snprintf(p, sizeof p, "%s/experts-L003.pack", out);
    flip(p, 5 * S + 7);
    memset(&r, 0, sizeof r);
    rc = df_model_verify_all(out, NULL, collect, &r, &s, err, sizeof err);
    CHECK(rc == 2 && r.n == 2, "two corrupt experts: rc %d, %d reports: %s", rc, r.n, err);
    CHECK(r.n >= 1 && r.layer[0] == 1 && r.expert[0] == 2 && strstr(r.file[0], "experts-L001.pack") && r.offset[0] == 2 * S &&
              r.bytes[0] == S && strstr(r.msg[0], "layer 1 expert 2") && strstr(r.msg[0], "checksum mismatch"),
          "first: layer %d expert %d %s @%llu: %s", r.layer[0], r.expert[0], r.file[0], (unsigned long long)r.offset[0], r.msg[0]);
    CHECK(r.n >= 2 && r.layer[1] == 3 && r.expert[1] == 5 && strstr(r.file[1], "experts-L003.pack") && r.offset[1] == 5 * S &&
              strstr(r.msg[1], "layer 3 expert 5"),
          "second: layer %d expert %d %s @%llu: %s", r.layer[1], r.expert[1], r.file[1], (unsigned long long)r.offset[1], r.msg[1]);
    CHECK(s.spine_ok && s.n_bad_experts == 2 && s.n_experts == 24, "summary: spine_ok %d, %d/%d", s.spine_ok, s.n_bad_experts, s.n_experts);
    CHECK(strstr(err, "spine.bin OK, 2 of 24 routed experts") && strstr(err, "layer 1 expert 2, layer 3 expert 5"), "err: %s", err);

    /* the spine too: reported first (layer -1), the experts still checked */
    snprintf(p, sizeof p, "%s/spine.bin", out);
    flip(p, 100);
    memset(&r, 0, sizeof r);
    rc = df_model_verify_all(out, NULL, collect, &r, &s, err, sizeof err);
    CHECK(rc == 3 && r.n == 3 && r.layer[0] == -1 && r.expert[0] == -1 && strstr(r.file[0], "spine.bin") && !s.spine_ok &&
              s.n_bad_experts == 2 && strstr(err, "spine.bin CORRUPT"),
          "spine + experts: rc %d, %d reports, spine_ok %d: %s", rc, r.n, s.spine_ok, err);
    /* the model does not open (the spine is checked at open), which is why doctor needs this call */
    df_model *m = NULL;
    CHECK(df_model_open(&m, out, NULL, err, sizeof err) == DF_EFORMAT, "open of a corrupt spine fails");
    df_model_close(m);

    /* progress "bytes" up to the total; a non-zero return cancels */
    cancel_at = 3;
    calls = 0;
    df_model_opts o;
    df_model_opts_default(&o);
    o.progress = cancel_cb;
    rc = df_model_verify_all(out, &o, NULL, NULL, NULL, err, sizeof err);
    CHECK(rc == DF_ECANCELLED && calls == 3, "cancel: rc %d after %d calls", rc, calls);
    /* no model */
    snprintf(p, sizeof p, "%s/nope", tmpdir);
    CHECK(df_model_verify_all(p, NULL, NULL, NULL, NULL, err, sizeof err) < 0 && strstr(err, "nope"), "missing dir: %s", err);
}

/* a copy of a golden with tokenizer files, so a cancelled conversion also has copies to remove */
static void test_convert_cancel(void) {
    char hf[512], out[512], err[1024], cmd[2600];
    snprintf(hf, sizeof hf, "%s/hf", tmpdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp tests/golden/bf16_kimi/config.json tests/golden/bf16_kimi/model.safetensors %s/ && "
                              "echo '{}' > %s/tokenizer_config.json && echo 'x' > %s/chat_template.jinja", hf, hf, hf, hf);
    CHECK(system(cmd) == 0, "make %s", hf);
    /* how many progress calls a whole conversion makes */
    df_convert_opts o;
    df_convert_opts_default(&o);
    o.progress = cancel_cb;
    o.threads = 1;
    cancel_at = 1 << 30;
    calls = 0;
    snprintf(out, sizeof out, "%s/c-all", tmpdir);
    int rc = df_convert(hf, out, &o, err, sizeof err);
    int total_calls = calls;
    char p[700];
    snprintf(p, sizeof p, "%s/chat_template.jinja", out);
    CHECK(rc == 0 && total_calls > 3 && df_path_exists(p), "full conversion: rc %d, %d progress calls: %s", rc, total_calls, err);
    /* cancelled at each call but the last (after manifest.json: the model is complete) */
    int bad = 0;
    for (int k = 1; k < total_calls; k++) {
        cancel_at = k;
        calls = 0;
        snprintf(out, sizeof out, "%s/c%d", tmpdir, k);
        rc = df_convert(hf, out, &o, err, sizeof err);
        int left = n_entries(out);
        if (rc != DF_ECANCELLED || left > 0) {
            bad++;
            fprintf(stderr, "cancel at call %d of %d: rc %d, %d files left\n", k, total_calls, rc, left);
        }
    }
    CHECK(bad == 0, "cancelled conversions leave nothing (%d of %d bad)", bad, total_calls - 1);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_verify_all_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    test_verify_all();
    test_convert_cancel();
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
