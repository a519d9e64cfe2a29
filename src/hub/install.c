/* install.c — install.h: the checks of an installed model shared by setup, list and the commands naming setup's
 * repair (the side files against the checkpoint's copies; the quick check of a full install). */
#include "install.h"
#include "deltafin.h"
#include "model/native.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

static int quick_check(const char *nat_dir, const char *ck_dir, char *why, size_t cap) {
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

int install_quick_check(const char *nat_dir, const char *ck_dir, char *why, size_t cap) {
    const int r = quick_check(nat_dir, ck_dir, why, cap);
    if (r && cap) df_advice_strip(why); /* the callers name setup's repair, never "convert again" */
    return r;
}

/* a non-negative integer of the manifest; -1 when absent or not one */
static int64_t man_u64(const cJSON *o, const char *k) {
    const cJSON *x = k ? cJSON_GetObjectItemCaseSensitive(o, k) : o;
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 || x->valuedouble != (double)(int64_t)x->valuedouble)
        return -1;
    return (int64_t)x->valuedouble;
}

/* one file of the install against the size the manifest gives it: its phrase to fn when missing or of another size */
static int size_check(const char *path, const char *layer, uint64_t need, install_damage_fn fn, void *user) {
    struct stat st;
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char what[1400];
    if (stat(path, &st) != 0)
        snprintf(what, sizeof what, "%s (%s%s)", base, layer, errno == ENOENT ? "missing" : strerror(errno));
    else if ((uint64_t)st.st_size < need)
        snprintf(what, sizeof what, "%s (%struncated: %lld of %llu bytes)", base, layer, (long long)st.st_size, (unsigned long long)need);
    else if ((uint64_t)st.st_size > need)
        snprintf(what, sizeof what, "%s (%stoo large: %lld bytes, the manifest says %llu)", base, layer, (long long)st.st_size,
                 (unsigned long long)need);
    else return 0;
    if (fn) fn(user, what);
    return 1;
}

int install_file_damage(const char *nat_dir, install_damage_fn fn, void *user) {
    char mf[4200], *txt = NULL;
    size_t len = 0;
    snprintf(mf, sizeof mf, "%s/manifest.json", nat_dir);
    cJSON *m = df_read_file(mf, &txt, &len, NULL, 0) ? NULL : cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(m)) {
        if (fn) fn(user, df_path_exists(mf) ? "manifest.json (not valid JSON)" : "manifest.json (missing)");
        cJSON_Delete(m);
        return 1;
    }
    int n = 0;
    char p[4400];
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(m, "spine"), *sf = cJSON_GetObjectItemCaseSensitive(sp, "file");
    const int64_t sb = man_u64(sp, "bytes");
    if (cJSON_IsString(sf) && sb >= 0) {
        snprintf(p, sizeof p, "%s/%s", nat_dir, sf->valuestring);
        n += size_check(p, "", (uint64_t)sb, fn, user);
    }
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(m, "experts"), *layers = cJSON_GetObjectItemCaseSensitive(ex, "layers");
    const int64_t ne = man_u64(ex, "n_experts"), stride = man_u64(ex, "stride");
    for (const cJSON *lj = cJSON_IsArray(layers) ? layers->child : NULL; lj && ne > 0; lj = lj->next) {
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(lj, "files"), *ss = cJSON_GetObjectItemCaseSensitive(lj, "stripe_sizes");
        const int64_t l = man_u64(lj, "layer"), sbytes = man_u64(lj, "stripe_bytes");
        char layer[32];
        snprintf(layer, sizeof layer, "layer %lld, ", (long long)l);
        int k = 0;
        for (const cJSON *fj = cJSON_IsArray(files) ? files->child : NULL; fj; fj = fj->next, k++) {
            const int64_t size = cJSON_IsArray(ss) ? man_u64(cJSON_GetArrayItem(ss, k), NULL) : sbytes > 0 ? sbytes : stride;
            if (!cJSON_IsString(fj) || size <= 0) continue;
            if (fj->valuestring[0] == '/') snprintf(p, sizeof p, "%s", fj->valuestring);
            else snprintf(p, sizeof p, "%s/%s", nat_dir, fj->valuestring);
            n += size_check(p, layer, (uint64_t)ne * (uint64_t)size, fn, user);
        }
    }
    cJSON_Delete(m);
    return n;
}
