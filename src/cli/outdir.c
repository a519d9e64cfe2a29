/* outdir.c — output-directory checks shared by `deltafin synth` and `deltafin convert`:
 * refuse to write a model into a non-empty directory (old packs and another model's
 * tokenizer would be mixed with the new files) unless --force, which removes only the
 * files deltafin writes (docs/native-format.md). The directories are created and locked
 * here (a writer lock held until the process ends, util.h df_dir_lock), so the files of
 * an interrupted run (killed: *.tmp, no manifest.json) are recognised and removed by the
 * next run when the directory holds nothing else (else that run refuses without --force),
 * while a run still writing there is never disturbed. */
#include "cli.h"
#include "util/util.h"
#include <dirent.h>
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Names deltafin writes into a model or pack directory (docs/native-format.md),
 * with or without the ".tmp" of an unfinished write; *is_tmp says which. card: README.md counts too (the
 * checkpoint's model card, which convert copies: only in a directory that holds a model, manifest.json, so that a
 * user's own README.md elsewhere is never taken for ours). */
static int is_model_file(const char *name, int card, int *is_tmp) {
    static const char *const fixed[] = {"manifest.json", "spine.bin", "tokenizer.json", "tokenizer_config.json",
                                        "tiktoken.model", "chat_template.jinja", "special_tokens_map.json",
                                        "generation_config.json", "heat.bin"};
    char base[512];
    snprintf(base, sizeof base, "%s", name);
    size_t n = strlen(base);
    int tmp = n > 4 && !strcmp(base + n - 4, ".tmp");
    if (tmp) base[n - 4] = 0;
    if (is_tmp) *is_tmp = tmp;
    for (size_t i = 0; i < sizeof fixed / sizeof *fixed; i++)
        if (!strcmp(base, fixed[i])) return 1;
    if (card && !strcmp(base, "README.md")) return 1;
    return !fnmatch("experts-L*.pack", base, 0);
}

typedef struct {
    int all;              /* entries (no . and ..) */
    int model;            /* deltafin file names, with or without .tmp */
    int tmp;              /* of them, *.tmp */
    int manifest;         /* manifest.json is there */
    char first[256], first_model[256], first_other[256];
} dir_scan;

enum { RM_NONE, RM_MODEL, RM_TMP };

/* Entries of dir. remove = RM_MODEL unlinks the deltafin files (manifest.json first, so
 * the directory never looks like a complete model made of mixed files), RM_TMP only the
 * deltafin *.tmp files; s->model / s->tmp then count what was removed. Returns 0, 1 when
 * dir does not exist, -1 with errno. */
static int scan_dir(const char *dir, int remove, dir_scan *s) {
    memset(s, 0, sizeof *s);
    char p[4096];
    struct stat mst;
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    const int card = stat(p, &mst) == 0; /* a model's directory: its README.md is the card convert copied */
    if (remove == RM_MODEL) {
        snprintf(p, sizeof p, "%s/manifest.json", dir);
        if (unlink(p) == 0) { s->model++; s->all++; }
    }
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 1 : -1;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        s->all++;
        if (!s->first[0]) snprintf(s->first, sizeof s->first, "%s", e->d_name);
        int tmp = 0;
        if (!is_model_file(e->d_name, card, &tmp)) {
            if (!s->first_other[0]) snprintf(s->first_other, sizeof s->first_other, "%s", e->d_name);
            continue;
        }
        if (!s->first_model[0]) snprintf(s->first_model, sizeof s->first_model, "%s", e->d_name);
        if (!strcmp(e->d_name, "manifest.json")) s->manifest = 1;
        if (remove == RM_NONE || (remove == RM_TMP && !tmp)) {
            if (remove == RM_NONE) { s->model++; s->tmp += tmp; }
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) || S_ISDIR(st.st_mode)) continue;
        if (unlink(p)) { rc = -1; break; }
        s->model++;
        s->tmp += tmp;
    }
    int se = errno;
    closedir(d);
    errno = se;
    return rc;
}

/* Create dir (mkdir -p) and take its writer lock (kept until the process ends; a
 * directory named twice, e.g. OUT_DIR also in --expert-dirs, is locked once).
 * 0 locked, 1 no lock available on this filesystem (stale files are then left alone),
 * -1 after printing why (cannot create it, or another process is writing there). */
static int create_and_lock(const char *cmd, const char *dir, const char *what) {
    static struct { dev_t dev; ino_t ino; } held[80];
    static int n_held;
    char err[1024];
    if (df_mkdir_p(dir, err, sizeof err)) {
        fprintf(stderr, "deltafin %s: cannot create %s %s: %s\n", cmd, what, dir, err);
        return -1;
    }
    struct stat st;
    if (stat(dir, &st) == 0)
        for (int i = 0; i < n_held; i++)
            if (held[i].dev == st.st_dev && held[i].ino == st.st_ino) return 0;
    int fd = df_dir_lock(dir);
    if (fd == -EBUSY) {
        fprintf(stderr,
                "deltafin %s: another deltafin process is writing a model into %s %s right now; wait for it to "
                "finish (or stop it) or choose another directory\n",
                cmd, what, dir);
        return -1;
    }
    if (fd < 0) return 1;
    /* fd stays open: the lock lasts until this process exits */
    if (n_held < (int)(sizeof held / sizeof *held)) {
        held[n_held].dev = st.st_dev;
        held[n_held].ino = st.st_ino;
        n_held++;
    }
    return 0;
}

/* The output directory (named `label` in messages: the command's usage calls it MODEL_DIR or OUT_DIR) must be new or empty (a non-empty one would mix old and new files:
 * stale packs, another model's tokenizer); pack directories must hold no
 * packs. --force removes the deltafin files there first. What an interrupted
 * run left (only deltafin file names, at least one *.tmp, no manifest.json; in
 * pack directories: *.pack.tmp) is removed without --force. 0, or exit status. */
int cli_check_out_dirs(const char *cmd, const char *label, const char *out, const char *expert_dirs, int force, int quiet) {
    struct stat st;
    if (stat(out, &st) == 0 && !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "deltafin %s: %s exists and is not a directory; choose another %s\n", cmd, out, label);
        return 1;
    }
    int lk = create_and_lock(cmd, out, label);
    if (lk < 0) return 1;
    dir_scan s;
    int rc = scan_dir(out, RM_NONE, &s);
    if (rc < 0) {
        fprintf(stderr, "deltafin %s: cannot read %s: %s\n", cmd, out, strerror(errno));
        return 1;
    }
    if (rc == 0 && s.all > 0) {
        int stale = lk == 0 && !s.manifest && s.model == s.all && s.tmp > 0;
        if (!force && !stale) {
            char why[700] = "";
            if (!s.manifest && s.tmp > 0 && s.model < s.all) /* an interrupted run's files next to others */
                snprintf(why, sizeof why, "; %d *.tmp of an interrupted run, which are removed automatically only when "
                                          "the directory holds nothing else, but it also holds '%s'", s.tmp, s.first_other);
            else if (!s.manifest && s.model == s.all && s.model > 0)
                snprintf(why, sizeof why, "; no manifest.json: an unfinished model");
            fprintf(stderr,
                    "deltafin %s: %s %s is not empty (%d entr%s, e.g. '%s'; %d deltafin model file%s%s); "
                    "%s writes a whole new model "
                    "and would leave old files mixed with it. Choose a new or empty directory, or pass --force to "
                    "delete the deltafin model files in it (manifest.json, spine.bin, experts-L*.pack, tokenizer "
                    "files, a converted model's README.md) and write there.\n",
                    cmd, label, out, s.all, s.all == 1 ? "y" : "ies", s.first_model[0] ? s.first_model : s.first, s.model,
                    s.model == 1 ? "" : "s", why, cmd);
            return 1;
        }
        int n_all = s.all;
        if (scan_dir(out, RM_MODEL, &s)) {
            fprintf(stderr, "deltafin %s: %s: cannot remove the old model files in %s: %s\n", cmd,
                    force ? "--force" : "interrupted run", out, strerror(errno));
            return 1;
        }
        if (!quiet && force && !stale)
            fprintf(stderr, "%s: --force: removed %d old model file%s from %s (%d other entr%s left in place)\n",
                    cmd, s.model, s.model == 1 ? "" : "s", out, n_all - s.model, n_all - s.model == 1 ? "y" : "ies");
        else if (!quiet)
            fprintf(stderr, "%s: removed %d file%s (%d *.tmp) left in %s by an interrupted convert or synth "
                            "(no manifest.json: it never finished)\n",
                    cmd, s.model, s.model == 1 ? "" : "s", s.tmp, out);
    }
    if (!expert_dirs || !*expert_dirs) return 0;
    char *cp = strdup(expert_dirs), *save = NULL;
    if (!cp) return 1;
    rc = 0;
    for (char *t = strtok_r(cp, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        int lkd = create_and_lock(cmd, t, "expert directory");
        if (lkd < 0) { rc = 1; break; }
        if (lkd == 0 && scan_dir(t, RM_TMP, &s) == 0 && s.tmp > 0 && !quiet)
            fprintf(stderr, "%s: removed %d *.tmp file%s left in %s by an interrupted convert or synth\n", cmd, s.tmp,
                    s.tmp == 1 ? "" : "s", t);
        int r = scan_dir(t, RM_NONE, &s);
        if (r < 0) {
            fprintf(stderr, "deltafin %s: cannot read expert directory %s: %s\n", cmd, t, strerror(errno));
            rc = 1;
        } else if (r == 0 && s.model > 0) {
            if (!force) {
                fprintf(stderr,
                        "deltafin %s: expert directory %s already holds model files (%d, e.g. '%s'); choose "
                        "another directory, or pass --force to delete them first.\n",
                        cmd, t, s.model, s.first_model);
                rc = 1;
            } else if (scan_dir(t, RM_MODEL, &s)) {
                fprintf(stderr, "deltafin %s: --force: cannot remove the old packs in %s: %s\n", cmd, t, strerror(errno));
                rc = 1;
            } else if (!quiet) {
                fprintf(stderr, "%s: --force: removed %d old file%s from %s\n", cmd, s.model, s.model == 1 ? "" : "s", t);
            }
        }
    }
    free(cp);
    return rc;
}

int cli_check_expert_dirs(const char *cmd, const char *dirs) {
    if (!dirs) return 0;
    int nd = 1;
    for (const char *q = dirs; *q; q++) nd += *q == ',';
    const size_t n = strlen(dirs);
    if (!n || nd > 16 || strstr(dirs, ",,") || dirs[0] == ',' || dirs[n - 1] == ',') {
        fprintf(stderr, "deltafin %s: --expert-dirs \"%s\": expected 1..16 directories separated by commas\n", cmd, dirs);
        return 2;
    }
    /* the same directory twice (trailing slashes aside) would hold two stripes of every expert on one drive */
    const char *a = dirs;
    for (int i = 0; i < nd; i++) {
        const char *ae = strchr(a, ',');
        size_t al = ae ? (size_t)(ae - a) : strlen(a);
        while (al > 1 && a[al - 1] == '/') al--;
        const char *b = ae ? ae + 1 : a + strlen(a);
        for (int j = i + 1; j < nd; j++) {
            const char *be = strchr(b, ',');
            size_t bl = be ? (size_t)(be - b) : strlen(b);
            while (bl > 1 && b[bl - 1] == '/') bl--;
            if (al == bl && !memcmp(a, b, al)) {
                fprintf(stderr, "deltafin %s: --expert-dirs \"%s\": the directory %.*s is named twice; name each drive's "
                        "directory once\n", cmd, dirs, (int)al, a);
                return 2;
            }
            b = be ? be + 1 : b + strlen(b);
        }
        a = ae ? ae + 1 : a + strlen(a);
    }
    return 0;
}
