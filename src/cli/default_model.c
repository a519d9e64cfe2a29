/* default_model.c — the model a command uses when it is run without --model: the default
 * entry of the installed-models registry (`deltafin setup`), else the embedded
 * models/kimi-mini, looked up beside the executable (a build tree inside the source tree),
 * under the install prefix (PREFIX/share/deltafin/models) and in the source tree the
 * program was built from. */
#include "cli.h"
#include "deltafin.h"
#include "hub/install.h"
#include "hub/registry.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef DF_SOURCE_DIR
#define DF_SOURCE_DIR ""
#endif

static int has_model(const char *d) { return cli_is_file(d, "config.json") || cli_is_file(d, "manifest.json"); }

int cli_embedded_model(char *out, size_t cap, char *how, size_t howcap) {
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        static const char *const rel[][2] = {{"../models/kimi-mini", "beside the executable"},
                                             {"../share/deltafin/models/kimi-mini", "under the install prefix"},
                                             {"models/kimi-mini", "beside the executable"}};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(cand, sizeof cand, "%s/%s", exe, rel[i][0]);
            char abs[PATH_MAX];
            if (has_model(cand) && realpath(cand, abs)) {
                snprintf(out, cap, "%s", abs);
                snprintf(how, howcap, "embedded kimi-mini, found %s", rel[i][1]);
                return 0;
            }
        }
    }
    if (DF_SOURCE_DIR[0]) {
        snprintf(cand, sizeof cand, "%s/models/kimi-mini", DF_SOURCE_DIR);
        if (has_model(cand)) {
            snprintf(out, cap, "%s", cand);
            snprintf(how, howcap, "embedded kimi-mini, found in the source tree");
            return 0;
        }
    }
    return -1;
}

/* the registry's default entry cli_default_model chose (the process runs one command: one default model) */
static reg_entry dflt_entry;
static int have_dflt_entry;

int cli_default_model(const char *cmd, char *out, size_t cap, char *how, size_t howcap) {
    char reg[4096], err[512];
    reg_entry e;
    if (registry_path(NULL, reg, sizeof reg, err, sizeof err) == 0) {
        int rc = registry_default(reg, &e, err, sizeof err);
        if (rc < 0) fprintf(stderr, "deltafin %s: warning: %s\n", cmd, err);
        if (rc == 1) {
            snprintf(out, cap, "%s", e.model);
            snprintf(how, howcap, "installed %s (%s) from registry %s", e.repo, e.mode, reg);
            dflt_entry = e;
            have_dflt_entry = 1;
            return 0;
        }
        if (rc == 2) {
            char fix[40000]; /* the suggested command is pasted into a shell: each word quoted */
            registry_repair_command(&e, NULL, 0, fix, sizeof fix);
            fprintf(stderr, "deltafin %s: the default model %s (installed by `deltafin setup`, registry %s) is missing: "
                            "%s has no manifest.json%s. Restore or mount %s, install it again with `%s`, "
                            "pass --model DIR, or make another installed model the default with `deltafin setup OTHER/REPO` "
                            "(`deltafin list` shows them)\n",
                    cmd, e.repo, reg, e.model, df_path_exists(e.model) ? "" : " (no such directory)", e.dir, fix);
            return 1;
        }
        if (rc == 3) {
            char qrepo[1100], qreg[16400]; /* the suggested commands are pasted into a shell: each word quoted */
            df_shell_quote(e.repo, qrepo, sizeof qrepo);
            df_shell_quote(reg, qreg, sizeof qreg);
            fprintf(stderr, "deltafin %s: the registry %s names %s as the default model, but has no entry for it (the entry "
                            "was removed, e.g. by editing the file): install it again with `deltafin setup %s` (it becomes "
                            "the default), make an installed model the default with `deltafin setup OTHER/REPO` "
                            "(`deltafin list` shows them), pass --model DIR, or remove the \"default\" key from %s to use the "
                            "embedded model\n", cmd, reg, e.repo, qrepo, qreg);
            return 1;
        }
    }
    if (cli_embedded_model(out, cap, how, howcap) == 0) return 0;
    fprintf(stderr, "deltafin %s: no --model given, no installed model (registry %s) and no embedded models/kimi-mini "
                    "found (looked in models/kimi-mini beside the executable, in ../share/deltafin/models/kimi-mini under "
                    "its install prefix%s%s): pass --model DIR, install one with `deltafin setup REPO`, or copy the "
                    "repository's models/kimi-mini beside the executable\n",
            cmd, reg, DF_SOURCE_DIR[0] ? " and in the source tree " : "", DF_SOURCE_DIR);
    return 1;
}

int cli_default_model_repair(const char *cmd, const char *how, int rc) {
    if (!have_dflt_entry || !how || strncmp(how, "installed ", 10)) return 0;
    const reg_entry *e = &dflt_entry;
    char fix[40000], why[1400] = "", ck[4200];
    if (rc == 0) { /* the cause is not known: the quick check of `deltafin list` decides */
        if (!strcmp(e->mode, "stream") || cli_is_file(e->model, "stream.json")) return 0; /* setup --stream repairs fetched experts only */
        install_checkpoint_dir(e->dir, e->repo, ck, sizeof ck);
        if (!install_quick_check(e->model, ck, why, sizeof why)) return 0;
    } else if (rc != DF_EIO && rc != DF_EFORMAT) return 0;
    registry_repair_command(e, NULL, 0, fix, sizeof fix);
    if (why[0])
        fprintf(stderr, "deltafin %s: the default model %s (installed by `deltafin setup` in %s) is DAMAGED: %s; `%s` verifies and "
                        "repairs it (`deltafin list` shows the install)\n", cmd, e->repo, e->dir, why, fix);
    else
        fprintf(stderr, "deltafin %s: the default model %s is an install of `deltafin setup` (in %s): `%s` verifies and repairs it "
                        "(`deltafin list` shows the install)\n", cmd, e->repo, e->dir, fix);
    return 1;
}

int cli_setup_install(const char *model_dir, char *fix, size_t cap, char *ck, size_t ckcap) {
    char reg[4096], err[512];
    reg_entry e, d;
    if (registry_path(NULL, reg, sizeof reg, err, sizeof err) || registry_find_model(reg, model_dir, &e, err, sizeof err) != 1) return 0;
    /* the repair of another install than the default keeps the default as it is */
    const int drc = registry_default(reg, &d, err, sizeof err);
    const int is_default = (drc == 1 || drc == 2) && !strcmp(d.repo, e.repo);
    registry_repair_command(&e, NULL, !is_default, fix, cap);
    if (ck) install_checkpoint_dir(e.dir, e.repo, ck, ckcap);
    return 1;
}

void cli_model_open_error(const char *cmd, const char *model, const char *how, const char *msg, int rc) {
    char m[8192], fix[4096];
    snprintf(m, sizeof m, "%s", msg && msg[0] ? msg : df_strerror(rc));
    if ((rc == DF_EIO || rc == DF_EFORMAT) && cli_setup_install(model, fix, sizeof fix, NULL, 0))
        df_advice_setup_repair(m, sizeof m, fix);
    fprintf(stderr, "deltafin %s: %s\n", cmd, m);
    cli_default_model_repair(cmd, how, rc);
}

/* the checkpoint directory a native model was converted from: its manifest's "source": {"dir": ...}; "" if unknown */
static void converted_from(const char *model, char *out, size_t cap) {
    char mf[4200], *txt = NULL;
    size_t len = 0;
    out[0] = 0;
    snprintf(mf, sizeof mf, "%s/manifest.json", model);
    if (df_read_file(mf, &txt, &len, NULL, 0)) return;
    cJSON *m = cJSON_ParseWithLength(txt, len);
    free(txt);
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "source"), "dir");
    if (cJSON_IsString(d) && d->valuestring[0]) snprintf(out, cap, "%s", d->valuestring);
    cJSON_Delete(m);
}

static int has_tokenizer(const char *dir) { return cli_is_file(dir, "tokenizer.json") || cli_is_file(dir, "tiktoken.model"); }

int cli_tokenizer_fix(const char *model, char *out, size_t cap) {
    char fix[4096], ck[4200], src[4200];
    if (cli_is_file(model, "config.json") && !cli_is_file(model, "manifest.json")) { /* a Hugging Face checkpoint */
        snprintf(out, cap, "the checkpoint itself has none: put the model's tokenizer.json (from its repository) into %s", model);
        return 0;
    }
    if (cli_setup_install(model, fix, sizeof fix, ck, sizeof ck)) {
        if (has_tokenizer(ck)) {
            snprintf(out, cap, "the install is damaged; `%s` repairs it", fix);
            return 1;
        }
        snprintf(out, cap, "the checkpoint it was installed from (%s) has no tokenizer.json or tiktoken.model either, so `%s` "
                 "cannot restore one: put the model's tokenizer.json (from its repository) into %s", ck, fix, model);
        return 0;
    }
    converted_from(model, src, sizeof src);
    struct stat st;
    if (!src[0] || stat(src, &st) != 0 || !S_ISDIR(st.st_mode))
        snprintf(out, cap, "copy the model's tokenizer.json (or tiktoken.model) into %s from the checkpoint it was converted "
                 "from%s%s%s, or from the model's repository", model, src[0] ? " (" : "", src, src[0] ? ", no longer there)" : "");
    else if (cli_is_file(src, "tokenizer.json"))
        snprintf(out, cap, "copy %s/tokenizer.json into %s, or convert again", src, model);
    else if (cli_is_file(src, "tiktoken.model"))
        snprintf(out, cap, "copy %s/tiktoken.model into %s, or convert again", src, model);
    else
        snprintf(out, cap, "the checkpoint it was converted from (%s) has no tokenizer.json or tiktoken.model either, so converting "
                 "again does not help: put the model's tokenizer.json (from its repository) into %s", src, model);
    return 0;
}
