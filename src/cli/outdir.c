/* outdir.c — output-directory checks shared by `deltafin synth` and `deltafin convert`:
 * refuse to write a model into a non-empty directory (old packs and another model's
 * tokenizer would be mixed with the new files) unless --force, which removes only the
 * files deltafin writes (docs/native-format.md). */
#include "cli.h"
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Names deltafin writes into a model or pack directory (docs/native-format.md),
 * with or without the ".tmp" of an interrupted write. */
static int is_model_file(const char *name) {
    static const char *const fixed[] = {"manifest.json", "spine.bin", "tokenizer.json", "tokenizer_config.json",
                                        "tiktoken.model", "chat_template.jinja", "special_tokens_map.json",
                                        "generation_config.json", "heat.bin"};
    char base[512];
    snprintf(base, sizeof base, "%s", name);
    size_t n = strlen(base);
    if (n > 4 && !strcmp(base + n - 4, ".tmp")) base[n - 4] = 0;
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        if (!strcmp(base, fixed[i])) return 1;
    return !fnmatch("experts-L*.pack", base, 0);
}

/* Entries of dir (no . and ..): *n_all of them, *n_model deltafin files; the
 * first name of each kind is copied out. remove=1 unlinks the deltafin files
 * (manifest.json first, so the directory never looks like a complete model made
 * of mixed files). Returns 0, 1 when dir does not exist, -1 with errno. */
static int scan_dir(const char *dir, int remove, int *n_all, int *n_model, char *first, size_t cap, char *first_model,
                    size_t mcap) {
    *n_all = *n_model = 0;
    if (first) first[0] = 0;
    if (first_model) first_model[0] = 0;
    char p[4096];
    if (remove) {
        snprintf(p, sizeof p, "%s/manifest.json", dir);
        if (unlink(p) == 0) { (*n_model)++; (*n_all)++; }
    }
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 1 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        (*n_all)++;
        if (first && !first[0]) snprintf(first, cap, "%s", e->d_name);
        if (!is_model_file(e->d_name)) continue;
        if (first_model && !first_model[0]) snprintf(first_model, mcap, "%s", e->d_name);
        if (!remove) { (*n_model)++; continue; }
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) || S_ISDIR(st.st_mode)) continue;
        if (unlink(p)) { rc = -1; break; }
        (*n_model)++;
    }
    int se = errno;
    closedir(d);
    errno = se;
    return rc;
}

/* OUT_DIR must be new or empty (a non-empty one would mix old and new files:
 * stale packs, another model's tokenizer); pack directories must hold no
 * packs. --force removes the deltafin files there first. 0, or exit status. */
int cli_check_out_dirs(const char *cmd, const char *out, const char *expert_dirs, int force, int quiet) {
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "deltafin %s: %s exists and is not a directory; choose another OUT_DIR\n", cmd, out);
        return 1;
    }
    char first[256], first_model[256];
    int n_all, n_model;
    int rc = scan_dir(out, 0, &n_all, &n_model, first, sizeof first, first_model, sizeof first_model);
    if (rc < 0) {
        fprintf(stderr, "deltafin %s: cannot read %s: %s\n", cmd, out, strerror(errno));
        return 1;
    }
    if (rc == 0 && n_all > 0) {
        if (!force) {
            fprintf(stderr,
                    "deltafin %s: OUT_DIR %s is not empty (%d entr%s, e.g. '%s'; %d deltafin model file%s); "
                    "%s writes a whole new model "
                    "and would leave old files mixed with it. Choose a new or empty directory, or pass --force to "
                    "delete the deltafin model files in it (manifest.json, spine.bin, experts-L*.pack, tokenizer "
                    "files) and write there.\n",
                    cmd, out, n_all, n_all == 1 ? "y" : "ies", first_model[0] ? first_model : first, n_model,
                    n_model == 1 ? "" : "s", cmd);
            return 1;
        }
        if (scan_dir(out, 1, &n_all, &n_model, NULL, 0, NULL, 0)) {
            fprintf(stderr, "deltafin %s: --force: cannot remove the old model files in %s: %s\n", cmd, out, strerror(errno));
            return 1;
        }
        if (!quiet)
            fprintf(stderr, "%s: --force: removed %d old model file%s from %s (%d other entr%s left in place)\n",
                    cmd, n_model, n_model == 1 ? "" : "s", out, n_all - n_model, n_all - n_model == 1 ? "y" : "ies");
    }
    if (!expert_dirs || !*expert_dirs) return 0;
    char *cp = strdup(expert_dirs), *save = NULL;
    rc = 0;
    for (char *t = strtok_r(cp, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        int r = scan_dir(t, 0, &n_all, &n_model, NULL, 0, first_model, sizeof first_model);
        if (r < 0) {
            fprintf(stderr, "deltafin %s: cannot read expert directory %s: %s\n", cmd, t, strerror(errno));
            rc = 1;
        } else if (r == 0 && n_model > 0) {
            if (!force) {
                fprintf(stderr,
                        "deltafin %s: expert directory %s already holds model files (%d, e.g. '%s'); choose "
                        "another directory, or pass --force to delete them first.\n",
                        cmd, t, n_model, first_model);
                rc = 1;
            } else if (scan_dir(t, 1, &n_all, &n_model, NULL, 0, NULL, 0)) {
                fprintf(stderr, "deltafin %s: --force: cannot remove the old packs in %s: %s\n", cmd, t, strerror(errno));
                rc = 1;
            } else if (!quiet) {
                fprintf(stderr, "%s: --force: removed %d old file%s from %s\n", cmd, n_model, n_model == 1 ? "" : "s", t);
            }
        }
    }
    free(cp);
    return rc;
}

