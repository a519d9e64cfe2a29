/* registry.c — the installed-models registry (registry.h): a small JSON file read and
 * rewritten whole (temp + fsync + rename). */
#define _GNU_SOURCE /* realpath */
#include "registry.h"
#include "deltafin.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int registry_path(const char *override, char *out, size_t cap, char *err, size_t errlen) {
    const char *env = getenv("DELTAFIN_REGISTRY"), *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    int n;
    if (override && *override) n = snprintf(out, cap, "%s", override);
    else if (env && *env) n = snprintf(out, cap, "%s", env);
    else if (xdg && *xdg) n = snprintf(out, cap, "%s/deltafin/models.json", xdg);
    else if (home && *home) n = snprintf(out, cap, "%s/.local/share/deltafin/models.json", home);
    else return df_set_errc(err, errlen, DF_EINVAL, "no registry location: pass --registry FILE or set DELTAFIN_REGISTRY, XDG_DATA_HOME or HOME");
    if (n < 0 || (size_t)n >= cap) return df_set_errc(err, errlen, DF_EINVAL, "registry path too long");
    return 0;
}

static void get_str(const cJSON *o, const char *k, char *dst, size_t cap) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    snprintf(dst, cap, "%s", cJSON_IsString(v) ? v->valuestring : "");
}

static double get_num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

int registry_load(const char *path, reg_entry **entries, int *n, char *dflt, size_t dcap, char *err, size_t errlen) {
    *entries = NULL;
    *n = 0;
    if (dflt && dcap) dflt[0] = 0;
    if (!df_path_exists(path)) return 0;
    char *txt = NULL;
    int rc = df_read_file(path, &txt, NULL, err, errlen);
    if (rc) return rc;
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    const cJSON *models = root ? cJSON_GetObjectItemCaseSensitive(root, "models") : NULL;
    if (!cJSON_IsObject(root) || !cJSON_IsArray(models)) {
        cJSON_Delete(root);
        return df_set_errc(err, errlen, DF_EFORMAT, "registry %s is not a deltafin models.json (expected {\"default\": ..., \"models\": [...]}); "
                           "move it away and run `deltafin setup` again", path);
    }
    if (dflt && dcap) get_str(root, "default", dflt, dcap);
    int cnt = cJSON_GetArraySize(models);
    if (cnt > 0) {
        *entries = calloc((size_t)cnt, sizeof(reg_entry));
        if (!*entries) { cJSON_Delete(root); return df_set_errc(err, errlen, DF_ENOMEM, "out of memory reading %s", path); }
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, models) {
        reg_entry *e = &(*entries)[*n];
        get_str(m, "repo", e->repo, sizeof e->repo);
        if (!e->repo[0]) continue;
        get_str(m, "revision", e->revision, sizeof e->revision);
        get_str(m, "mirror", e->mirror, sizeof e->mirror);
        get_str(m, "dir", e->dir, sizeof e->dir);
        get_str(m, "model", e->model, sizeof e->model);
        get_str(m, "mode", e->mode, sizeof e->mode);
        e->bytes = (uint64_t)get_num(m, "bytes");
        e->installed = get_num(m, "installed");
        (*n)++;
    }
    cJSON_Delete(root);
    return 0;
}

static cJSON *entry_json(const reg_entry *e) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "repo", e->repo);
    cJSON_AddStringToObject(o, "revision", e->revision);
    cJSON_AddStringToObject(o, "mirror", e->mirror);
    cJSON_AddStringToObject(o, "dir", e->dir);
    cJSON_AddStringToObject(o, "model", e->model);
    cJSON_AddStringToObject(o, "mode", e->mode);
    cJSON_AddNumberToObject(o, "bytes", (double)e->bytes);
    cJSON_AddNumberToObject(o, "installed", e->installed > 0 ? e->installed : (double)time(NULL));
    return o;
}

int registry_record(const char *path, const reg_entry *e, int make_default, char *err, size_t errlen) {
    reg_entry *old = NULL;
    int n = 0, rc;
    char dflt[256];
    if ((rc = registry_load(path, &old, &n, dflt, sizeof dflt, err, errlen))) return rc;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if ((rc = df_mkdir_p(dir, err, errlen))) { free(old); return rc; }
    }
    cJSON *root = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    cJSON_AddStringToObject(root, "default", make_default ? e->repo : dflt);
    int replaced = 0;
    for (int i = 0; i < n; i++) {
        if (!strcmp(old[i].repo, e->repo)) { cJSON_AddItemToArray(arr, entry_json(e)); replaced = 1; }
        else cJSON_AddItemToArray(arr, entry_json(&old[i]));
    }
    if (!replaced) cJSON_AddItemToArray(arr, entry_json(e));
    cJSON_AddItemToObject(root, "models", arr);
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    free(old);
    if (!txt) return df_set_errc(err, errlen, DF_ENOMEM, "out of memory writing %s", path);
    rc = df_write_file_atomic(path, txt, strlen(txt), err, errlen);
    free(txt);
    return rc;
}

int registry_default(const char *path, reg_entry *out, char *err, size_t errlen) {
    reg_entry *es = NULL;
    int n = 0, found = 0;
    char dflt[256];
    int rc = registry_load(path, &es, &n, dflt, sizeof dflt, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < n && dflt[0]; i++) {
        char man[4200];
        snprintf(man, sizeof man, "%s/manifest.json", es[i].model);
        if (!strcmp(es[i].repo, dflt)) { *out = es[i]; found = df_path_exists(man) ? 1 : 2; break; }
    }
    free(es);
    if (!found && dflt[0]) { /* "default" names no entry */
        memset(out, 0, sizeof *out);
        snprintf(out->repo, sizeof out->repo, "%s", dflt);
        found = 3;
    }
    return found;
}

int registry_find_model(const char *path, const char *model_dir, reg_entry *out, char *err, size_t errlen) {
    char want[PATH_MAX];
    if (!realpath(model_dir, want)) return 0;
    reg_entry *es = NULL;
    int n = 0, found = 0;
    int rc = registry_load(path, &es, &n, NULL, 0, err, errlen);
    if (rc) return rc;
    for (int i = 0; i < n && !found; i++) {
        char have[PATH_MAX];
        if (es[i].model[0] && realpath(es[i].model, have) && !strcmp(have, want)) { *out = es[i]; found = 1; }
    }
    free(es);
    return found;
}

void registry_repair_command(const reg_entry *e, const char *registry, int not_default, char *out, size_t cap) {
    char qrepo[1100], qdir[8300], qmirror[2100], qrev[600], qreg[16400];
    const char *env = getenv("HF_ENDPOINT"), *dmirror = env && *env ? env : "https://huggingface.co";
    const int other_mirror = e->mirror[0] && strcmp(e->mirror, dmirror);
    const int other_rev = e->revision[0] && strcmp(e->revision, "main");
    snprintf(out, cap, "deltafin setup %s%s --dir %s%s%s%s%s%s%s%s", df_shell_quote(e->repo, qrepo, sizeof qrepo),
             !strcmp(e->mode, "stream") ? " --stream" : "", df_shell_quote(e->dir, qdir, sizeof qdir), other_mirror ? " --mirror " : "",
             other_mirror ? df_shell_quote(e->mirror, qmirror, sizeof qmirror) : "", other_rev ? " --revision " : "",
             other_rev ? df_shell_quote(e->revision, qrev, sizeof qrev) : "", registry ? " --registry " : "",
             registry ? df_shell_quote(registry, qreg, sizeof qreg) : "", not_default ? " --no-default" : "");
}
