/* test_stripes.c — proportional striping (--stripe-weights, manifest
 * "stripe_sizes"; docs/native-format.md): each golden checkpoint converted with
 * --stripe-weights 3,1 over 2 directories and 1,2,1 over 3 directories gives
 * stripe sizes in those proportions; every expert read back (native_read_expert
 * and the store, io_uring and pread) equals the unstriped conversion byte for
 * byte, checksums verify, and `deltafin run --prompt-ids` gives the same greedy
 * ids. Also: the planner, malformed weights, synth with weights, bench io's
 * suggested line. */
#include "test_util.h"

#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include "util/util.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmpdir[256];
static const char *bin;

static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_plan(void) {
    uint64_t s[64];
    int uneq;
    char err[256];
    uint64_t stride = 40 * 4096;
    CHECK(native_stripe_plan(stride, 2, "3,1", s, &uneq, err, sizeof err) == 0 && uneq && s[0] == 30 * 4096 && s[1] == 10 * 4096,
          "3,1 -> 30/10 pages (%llu %llu)", (unsigned long long)s[0], (unsigned long long)s[1]);
    CHECK(native_stripe_plan(stride, 3, "1,2,1", s, &uneq, err, sizeof err) == 0 && uneq && s[0] == 10 * 4096 && s[1] == 20 * 4096 &&
              s[2] == 10 * 4096,
          "1,2,1 -> 10/20/10 pages");
    /* odd page counts: whole pages, sum covers the stride, every stripe non-empty */
    CHECK(native_stripe_plan(7 * 4096, 3, "5,1,0.01", s, &uneq, err, sizeof err) == 0 && uneq && s[2] == 4096 &&
              s[0] + s[1] + s[2] >= 7 * 4096 && s[0] % 4096 == 0 && s[1] % 4096 == 0,
          "tiny weight still gets a page");
    CHECK(native_stripe_plan(stride, 2, "2,2", s, &uneq, err, sizeof err) == 0 && !uneq && s[0] == 20 * 4096 && s[1] == 20 * 4096,
          "equal weights -> equal stripes");
    CHECK(native_stripe_plan(stride, 2, NULL, s, &uneq, err, sizeof err) == 0 && !uneq && s[0] == 20 * 4096, "no weights -> equal");
    CHECK(native_stripe_plan(stride, 2, "1,2,3", s, &uneq, err, sizeof err) == DF_EINVAL && strstr(err, "3 entries"), "count: %s", err);
    CHECK(native_stripe_plan(stride, 2, "1,0", s, &uneq, err, sizeof err) == DF_EINVAL, "zero weight refused");
    CHECK(native_stripe_plan(stride, 2, "1,x", s, &uneq, err, sizeof err) == DF_EINVAL, "junk refused");
    CHECK(native_stripe_plan(stride, 2, "1,", s, &uneq, err, sizeof err) == DF_EINVAL, "empty entry refused");
}

/* Every expert of b (striped) equals a (unstriped), through native_read_expert and the store. */
static void compare_models(const char *ref_dir, const char *dir, int nd, const int *w, const char *what) {
    df_native *a = NULL, *b = NULL;
    char err[1024] = "";
    int rc = native_open(&a, ref_dir, err, sizeof err);
    CHECK(rc == 0, "%s: open ref: %s", what, err);
    rc = rc ? rc : native_open(&b, dir, err, sizeof err);
    CHECK(rc == 0, "%s: open striped: %s", what, err);
    if (rc) { native_close(a); native_close(b); return; }
    CHECK(a->n_moe_layers == b->n_moe_layers && a->stride == b->stride && a->n_experts == b->n_experts, "%s: same shape", what);
    int wsum = 0;
    char ws[64] = "";
    for (int k = 0; k < nd; k++) {
        wsum += w[k];
        snprintf(ws + strlen(ws), sizeof ws - strlen(ws), "%s%d", k ? "," : "", w[k]);
    }
    uint64_t plan[64];
    int uneq = 0;
    CHECK(native_stripe_plan(b->stride, nd, ws, plan, &uneq, err, sizeof err) == 0, "%s: plan: %s", what, err);
    int n_uneq = 0;
    for (int i = 0; i < b->n_moe_layers; i++) {
        const native_expert_layer *L = &b->moe_layers[i];
        /* an extent of very few pages may not split unequally: then the layout is the equal one */
        CHECK(L->n_files == nd && !!L->stripe_sizes == uneq, "%s: layer %d: %d files, stripe_sizes %s", what, L->layer, L->n_files,
              L->stripe_sizes ? "set" : "absent");
        if (L->n_files != nd || !L->stripe_sizes) continue;
        n_uneq++;
        uint64_t sum = native_stripe_begin(L, nd), pages = (b->stride + 4095) / 4096;
        CHECK(sum >= b->stride && native_extent_buf_bytes(b, L->layer) == sum, "%s: sizes cover the stride", what);
        for (int k = 0; k < nd; k++) {
            /* proportional to within one page of rounding (rounded up) */
            double want = (double)pages * w[k] / wsum * 4096, got = (double)L->stripe_sizes[k];
            CHECK(L->stripe_sizes[k] == plan[k] && L->stripe_sizes[k] % 4096 == 0 && got >= want && got < want + 4096,
                  "%s: layer %d stripe %d: %llu vs %.0f", what, L->layer, k, (unsigned long long)L->stripe_sizes[k], want);
        }
    }
    printf("%s: stride %llu, %d of %d layers with unequal stripes\n", what, (unsigned long long)b->stride, n_uneq, b->n_moe_layers);
    uint64_t bb = 0;
    for (int i = 0; i < b->n_moe_layers; i++)
        if (native_extent_buf_bytes(b, b->moe_layers[i].layer) > bb) bb = native_extent_buf_bytes(b, b->moe_layers[i].layer);
    uint64_t ab = native_extent_buf_bytes(a, a->moe_layers[0].layer);
    uint8_t *x = calloc(1, ab), *y = calloc(1, bb);
    int bad = 0;
    for (int i = 0; i < b->n_moe_layers && x && y; i++) {
        int l = b->moe_layers[i].layer;
        for (int e = 0; e < b->n_experts; e++) {
            if (native_read_expert(a, l, e, x, err, sizeof err) || native_read_expert(b, l, e, y, err, sizeof err)) {
                bad++;
                fprintf(stderr, "%s: read: %s\n", what, err);
                continue;
            }
            if (memcmp(x, y, b->stride) || native_verify_expert(b, l, e, y, err, sizeof err)) bad++;
        }
    }
    CHECK(bad == 0, "%s: %d experts differ from the unstriped conversion", what, bad);
    CHECK(native_verify(b, NULL, NULL, err, sizeof err) == 0, "%s: verify: %s", what, err);
    /* the store (one queue per drive, reassembly in place), io_uring and pread, small reads */
    for (int uring = 1; uring >= 0; uring--) {
        store_opts o;
        store_opts_default(&o);
        o.use_uring = uring;
        o.io_bytes = 4096;
        df_store *st = NULL;
        rc = store_open(&st, b, &o, err, sizeof err);
        CHECK(rc == 0, "%s: store_open: %s", what, err);
        if (rc) continue;
        int sbad = 0;
        for (int i = 0; i < b->n_moe_layers; i++) {
            int l = b->moe_layers[i].layer;
            for (int e = 0; e < b->n_experts; e++) {
                df_expert v;
                if (store_acquire(st, l, &e, 1, &v, err, sizeof err)) {
                    sbad++;
                    fprintf(stderr, "%s: acquire: %s\n", what, err);
                    continue;
                }
                const uint8_t *base = (const uint8_t *)v.gate.data - b->parts[0].offset;
                if (native_read_expert(a, l, e, x, err, sizeof err) || memcmp(base, x, b->stride)) sbad++;
                store_release(st, l, &e, 1);
            }
        }
        CHECK(sbad == 0, "%s: store uring=%d: %d experts differ", what, uring, sbad);
        store_close(st);
    }
    free(x);
    free(y);
    native_close(a);
    native_close(b);
}

static void greedy_same(const char *ref_dir, const char *dir, const char *what) {
    static char a[4096], b[4096];
    int ra = run(a, sizeof a, "%s run --model %s --cache-dir %s/cache --quiet --prompt-ids 1,2,3 --max-new 8 --print-ids", bin, ref_dir, tmpdir);
    int rb = run(b, sizeof b, "%s run --model %s --cache-dir %s/cache --quiet --prompt-ids 1,2,3 --max-new 8 --print-ids", bin, dir, tmpdir);
    CHECK(ra == 0 && rb == 0 && a[0] >= '0' && a[0] <= '9' && !strcmp(a, b), "%s: greedy ids '%s' (rc %d) vs '%s' (rc %d)", what, a, ra, b,
          rb);
}

/* Rewrite experts.layers[0] of dir's manifest with `set` (a JSON value for key, or NULL to delete it);
 * native_open must then fail with DF_EFORMAT mentioning `want`; the manifest is restored. */
static void tamper(const char *dir, const char *key, const char *set, const char *want) {
    char mf[700], err[1024] = "";
    snprintf(mf, sizeof mf, "%s/manifest.json", dir);
    char *txt = NULL;
    size_t len = 0;
    if (df_read_file(mf, &txt, &len, err, sizeof err)) { CHECK(0, "read %s: %s", mf, err); return; }
    cJSON *m = cJSON_Parse(txt);
    cJSON *L0 = m ? cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(m, "experts"), "layers"), 0) : NULL;
    CHECK(L0 != NULL, "manifest parse");
    if (L0) {
        if (set) cJSON_ReplaceItemInObject(L0, key, cJSON_Parse(set));
        else cJSON_DeleteItemFromObject(L0, key);
        if (set && !cJSON_GetObjectItem(L0, key)) cJSON_AddItemToObject(L0, key, cJSON_Parse(set));
        char *t2 = cJSON_Print(m);
        df_write_file_atomic(mf, t2, strlen(t2), err, sizeof err);
        free(t2);
        df_native *n = NULL;
        int rc = native_open(&n, dir, err, sizeof err);
        CHECK(rc == DF_EFORMAT && strstr(err, want), "%s = %s: rc %d, %s", key, set ? set : "(deleted)", rc, err);
        native_close(n);
        df_write_file_atomic(mf, txt, len, err, sizeof err);
    }
    cJSON_Delete(m);
    free(txt);
}

static void test_manifest_checks(void) {
    char out[8192], dir[600];
    snprintf(dir, sizeof dir, "%s/tamper", tmpdir);
    int rc = run(out, sizeof out, "%s convert tests/golden/bf16_kimi %s --expert-dirs %s/t0,%s/t1 --stripe-weights 3,1 --quiet", bin, dir,
                 tmpdir, tmpdir);
    CHECK(rc == 0, "tamper base convert (rc %d): %s", rc, out);
    if (rc) return;
    df_native *n = NULL;
    char err[1024];
    CHECK(native_open(&n, dir, err, sizeof err) == 0 && n->moe_layers[0].stripe_sizes && n->moe_layers[0].stripe_sizes[0] == 12288 &&
              n->moe_layers[0].stripe_sizes[1] == 4096 && n->moe_layers[0].stripe_bytes == 12288,
          "3,1 over a 3-page extent: ceil(2.25) + ceil(0.75) = 3 + 1 pages");
    native_close(n);
    tamper(dir, "stripe_sizes", "[12288]", "one size per file");
    tamper(dir, "stripe_sizes", "[12288, 100]", "multiple of 4096");
    tamper(dir, "stripe_sizes", "[4096, 4096]", "less than stride");
    tamper(dir, "stripe_sizes", "[12288, 0]", "multiple of 4096");
    tamper(dir, "stripe_bytes", "4096", "disagrees");
    /* the equal reading of this layout (stripe_bytes 12288 for both files) needs file 1 to be 3x longer */
    tamper(dir, "stripe_sizes", NULL, "truncated");
    /* the reader still opens the untouched manifest */
    CHECK(native_open(&n, dir, err, sizeof err) == 0, "restored manifest opens: %s", err);
    native_close(n);
}

int main(void) {
    test_plan();
    bin = getenv("DF_BIN");
    if (!bin) bin = "build/deltafin";
    if (!df_path_exists(bin)) {
        printf("no deltafin binary at %s (set DF_BIN): CLI parts skipped\n", bin);
        return t_done();
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_stripes_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    static char out[16384];
    int rc = run(out, sizeof out, "%s convert --help", bin);
    CHECK(rc == 0 && strstr(out, "--stripe-weights"), "convert --help documents --stripe-weights");
    rc = run(out, sizeof out, "%s convert tests/golden/bf16_kimi %s/bad1 --expert-dirs %s/x0,%s/x1 --stripe-weights 1,2,3 --quiet", bin,
             tmpdir, tmpdir, tmpdir);
    CHECK(rc == 2 && strstr(out, "--stripe-weights"), "convert: weight count mismatch (rc %d): %s", rc, out);
    rc = run(out, sizeof out, "%s convert tests/golden/bf16_kimi %s/bad2 --stripe-weights 3,1 --quiet", bin, tmpdir);
    CHECK(rc == 2 && strstr(out, "--expert-dirs"), "convert: weights without --expert-dirs (rc %d): %s", rc, out);

    test_manifest_checks();

    DIR *d = opendir("tests/golden");
    int n_cases = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char src[600], cfg[700], ref[800], dst[800];
        snprintf(src, sizeof src, "tests/golden/%s", de->d_name);
        snprintf(cfg, sizeof cfg, "%s/config.json", src);
        if (de->d_name[0] == '.' || !df_path_exists(cfg)) continue;
        n_cases++;
        snprintf(ref, sizeof ref, "%s/%s-ref", tmpdir, de->d_name);
        rc = run(out, sizeof out, "%s convert %s %s --quiet", bin, src, ref);
        CHECK(rc == 0, "%s: plain convert (rc %d): %s", de->d_name, rc, out);
        if (rc) continue;
        /* 3,1 over two directories */
        snprintf(dst, sizeof dst, "%s/%s-w31", tmpdir, de->d_name);
        rc = run(out, sizeof out, "%s convert %s %s --expert-dirs %s/%s-a0,%s/%s-a1 --stripe-weights 3,1 --quiet", bin, src, dst, tmpdir,
                 de->d_name, tmpdir, de->d_name);
        CHECK(rc == 0, "%s: convert 3,1 (rc %d): %s", de->d_name, rc, out);
        if (!rc) {
            static const int w[2] = {3, 1};
            char what[700];
            snprintf(what, sizeof what, "%s 3,1", de->d_name);
            compare_models(ref, dst, 2, w, what);
            greedy_same(ref, dst, what);
        }
        /* 1,2,1 over three directories */
        snprintf(dst, sizeof dst, "%s/%s-w121", tmpdir, de->d_name);
        rc = run(out, sizeof out, "%s convert %s %s --expert-dirs %s/%s-b0,%s/%s-b1,%s/%s-b2 --stripe-weights 1,2,1 --quiet --threads 2", bin,
                 src, dst, tmpdir, de->d_name, tmpdir, de->d_name, tmpdir, de->d_name);
        CHECK(rc == 0, "%s: convert 1,2,1 (rc %d): %s", de->d_name, rc, out);
        if (!rc) {
            static const int w[3] = {1, 2, 1};
            char what[700];
            snprintf(what, sizeof what, "%s 1,2,1", de->d_name);
            compare_models(ref, dst, 3, w, what);
            greedy_same(ref, dst, what);
        }
    }
    if (d) closedir(d);
    CHECK(n_cases >= 1, "golden checkpoints found: %d", n_cases);
    printf("golden checkpoints checked with stripe weights: %d\n", n_cases);

    /* synth: the same layout with weights equals the unweighted synth, expert for expert */
    rc = run(out, sizeof out,
             "%s synth %s/syn-ref --hidden 256 --moe-inter 128 --experts 8 --top-k 2 --layers 3 --dense 1 --vocab 512 --heads 4 "
             "--q-lora 64 --kv-lora 64 --inter 512 --quiet && %s synth %s/syn-w --hidden 256 --moe-inter 128 --experts 8 --top-k 2 "
             "--layers 3 --dense 1 --vocab 512 --heads 4 --q-lora 64 --kv-lora 64 --inter 512 --quiet --expert-dirs %s/sw0,%s/sw1 "
             "--stripe-weights 3,1",
             bin, tmpdir, bin, tmpdir, tmpdir, tmpdir);
    CHECK(rc == 0, "synth with --stripe-weights (rc %d): %s", rc, out);
    if (!rc) {
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/syn-ref", tmpdir);
        snprintf(b, sizeof b, "%s/syn-w", tmpdir);
        static const int w[2] = {3, 1};
        compare_models(a, b, 2, w, "synth 3,1");
        /* bench io over the two stripe directories prints the suggested weights */
        rc = run(out, sizeof out, "%s bench io --dir %s/sw0,%s/sw1 --size 64K --seconds 0.3 --no-drop", bin, tmpdir, tmpdir);
        CHECK(rc == 0 && strstr(out, "suggested: --stripe-weights "), "bench io suggests weights (rc %d): %s", rc, out);
    }
    rc = run(out, sizeof out, "%s synth %s/syn-bad --quiet --expert-dirs %s/sb0,%s/sb1 --stripe-weights 1", bin, tmpdir, tmpdir, tmpdir);
    CHECK(rc == 2 && strstr(out, "--stripe-weights"), "synth: weight count mismatch (rc %d): %s", rc, out);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
