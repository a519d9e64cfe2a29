/*
 * cmd_doctor.c — `deltafin doctor [--model DIR] [--cache-dir DIR]`: machine facts
 * (cores, RAM, SIMD features, io_uring availability) and, with --model, a full
 * checksum verification of the model's native files (df_model_verify_all: every
 * corrupt expert is named with its layer, file and offset, and the spine's state
 * is printed, also when a corrupt spine.bin stops the model from opening) and a
 * check that its tokenizer (when it has one) opens. For an install of `deltafin setup` (the registry names it), the
 * side files are checked against the checkpoint's copies (src/hub/install.h) and the messages name setup's repair
 * command instead of the engine's "re-run `deltafin convert`". Damage that stops the model from opening (a missing
 * spine.bin, or one or a pack of another size than its manifest says) hides nothing: every damaged file is reported and the other files' checksums
 * are still verified (file_check, make_view), so that one run lists every problem, as fsck does, each damaged file on
 * one line (the open's own error is said only when no such line names its file). The closing summary (the FAILED line)
 * names a tokenizer that is missing or does not open.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "hub/install.h"
#include "hub/stream.h"
#include "deltafin.h"
#include "model/convert.h"
#include "model/native.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

static int line_open; /* a progress line without its newline is on stderr */

static int verify_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    static time_t last;
    time_t now = time(NULL);
    if (total && (done == total || (now != last && cli_stderr_tty()))) {
        last = now;
        fprintf(stderr, "%s%s: %.1f%% of %.1f MB%s", cli_cr(), user ? (const char *)user : "verifying", 100.0 * done / total,
                total / 1e6, done == total ? "\n" : "");
        line_open = done != total;
    }
    return 0;
}

/* end an unfinished progress line (the conversion's or the verification's) before an error message */
static void line_end(void) {
    if (!cli_convert_progress_end() && line_open) fputc('\n', stderr);
    line_open = 0;
}

/* A model `deltafin setup` installed: the command that repairs it, said instead of the engine's advice to convert
 * again (df_advice_setup_repair); "" for a model the user converted. */
static char setup_fix[40000];

/* A model the user converted with `deltafin convert` whose source checkpoint is still there (manifest.json's
 * source.dir, a directory with config.json): the command that converts it again, said instead of the bare advice;
 * "" otherwise (a setup install, a conversion in the cache, a synthetic model, a moved or deleted checkpoint). */
static char convert_fix[9000];

/* "deltafin convert SRC DIR --force [--spine MODE]" from DIR/manifest.json into convert_fix, when SRC still exists;
 * a model striped over other directories (expert files outside DIR) needs its --expert-dirs too: then nothing */
static void find_convert_fix(const char *dir) {
    convert_fix[0] = 0;
    char path[4200], *buf = NULL, e[256];
    size_t len = 0;
    snprintf(path, sizeof path, "%s/manifest.json", dir);
    if (df_read_file(path, &buf, &len, e, sizeof e)) return;
    cJSON *m = cJSON_ParseWithLength(buf, len);
    free(buf);
    const cJSON *src = m ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "source"), "dir") : NULL;
    const cJSON *sm = m ? cJSON_GetObjectItemCaseSensitive(m, "spine_mode") : NULL;
    const cJSON *layers = m ? cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(m, "experts"), "layers") : NULL;
    int outside = 0; /* a pack file not directly in DIR (striped over --expert-dirs) */
    const cJSON *L;
    cJSON_ArrayForEach(L, layers) {
        const cJSON *f;
        cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(L, "files")) outside |= !cJSON_IsString(f) || strchr(f->valuestring, '/');
    }
    char cfg[4200];
    struct stat st;
    if (cJSON_IsString(src) && src->valuestring[0] == '/' && !outside &&
        snprintf(cfg, sizeof cfg, "%s/config.json", src->valuestring) < (int)sizeof cfg && stat(cfg, &st) == 0) {
        char qs[4200], qd[4200];
        const char *mode = cJSON_IsString(sm) ? sm->valuestring : "source";
        snprintf(convert_fix, sizeof convert_fix, "deltafin convert %s %s --force%s%s",
                 df_shell_quote(src->valuestring, qs, sizeof qs), df_shell_quote(dir, qd, sizeof qd),
                 strcmp(mode, "source") ? " --spine " : "", strcmp(mode, "source") ? mode : "");
    }
    cJSON_Delete(m);
}

static void advice(char *msg, size_t cap) {
    if (setup_fix[0]) df_advice_setup_repair(msg, cap, setup_fix);
    else if (convert_fix[0]) df_advice_convert_repair(msg, cap, convert_fix);
}

/* One line per damaged file. When damage stops the model from opening, df_model_open's error names one damaged file;
 * the checks below (file_check, df_model_verify_all) name every damaged file on a line of its own with its repair.
 * So the open error is kept (open_err) and said only if no such line names its file (say_open_err, before the
 * states): the paths the damage lines name are collected in named[]. */
static char open_err[8192];
static int open_err_pending;
static char named[64][1024];
static int n_named;

/* the absolute paths in a damage line (words that begin with '/', without trailing punctuation) into named[] */
static void note_paths(const char *msg) {
    for (const char *p = msg; (p = strchr(p, '/')) != NULL;) {
        if (p > msg && p[-1] != ' ' && p[-1] != '(') { p++; continue; }
        size_t n = strcspn(p, " \t\n");
        while (n && strchr(":;,.)", p[n - 1])) n--;
        if (n > 1 && n < sizeof named[0] && n_named < 64) snprintf(named[n_named++], sizeof named[0], "%.*s", (int)n, p);
        p += n ? n : 1;
    }
}

/* the open error, unless a damage line named its file */
static void say_open_err(void) {
    if (!open_err_pending) return;
    open_err_pending = 0;
    for (int i = 0; i < n_named; i++) {
        const char *h = strstr(open_err, named[i]);
        const char e = h ? h[strlen(named[i])] : 0;
        if (h && (e == 0 || e == ' ' || e == ':' || e == ';' || e == ',' || e == ')')) return; /* said by that line */
    }
    fprintf(stderr, "deltafin doctor: %s\n", open_err);
}

/* The tokenizer's problem ("tokenizer.json is missing", "tokenizer.json does not open"), for the closing summary; ""
 * when it opens or the model has none. side_tok_missing: the setup install's side-file check named the missing file. */
static char tok_problem[64];
static int side_tok_missing;
/* what repairs it, for the closing summary: a clause ("copy ... into DIR, or convert again", "`setup ...` repairs the
 * install") */
static char tok_fix[41000];

/* msg (a closing summary) mentions the tokenizer's problem: "spine.bin OK, 0 of 8 ... corrupt, tokenizer.json is
 * missing: the model files are damaged; ..." (appended when msg has no ": the model files are damaged") */
static void tok_note(char *msg, size_t cap) {
    if (!tok_problem[0]) return;
    char *at = strstr(msg, ": the model files are damaged");
    if (!at) {
        snprintf(msg + strlen(msg), cap - strlen(msg), "; and %s", tok_problem);
        return;
    }
    char rest[8192];
    snprintf(rest, sizeof rest, "%s", at);
    snprintf(at, cap - (size_t)(at - msg), ", %s%s", tok_problem, rest);
}

/* "deltafin doctor: verification FAILED: MSG" with the tokenizer's problem */
static void verification_failed(const char *msg) {
    char m[8400];
    snprintf(m, sizeof m, "%s", msg);
    tok_note(m, sizeof m);
    fprintf(stderr, "deltafin doctor: verification FAILED: %s\n", m);
}

/* Damage that stops the model from opening (native_open refuses it, and df_model_verify_all with it checks nothing):
 * spine.bin missing or not the size its manifest says, an expert pack not the size of its experts or that cannot be looked
 * at (a missing pack alone does not stop it: it is reported as its layer's problem). file_check finds such files from
 * manifest.json and reports each one; the checksums of the rest are then verified through a stand-in directory, the
 * view (make_view): a copy of the manifest whose packs are the model's own files by absolute path, except the damaged
 * ones (a path that does not exist: their layers count as unreadable, and the engine's line for those layers is left
 * out, file_check's said it), and spine.bin linked, or, when it is the damaged file, an empty stand-in (its state is
 * file_check's). */
typedef struct {
    const char *cache;    /* the conversion's directory when the model was converted into the cache, else NULL */
    int spine_bad;        /* spine.bin reported by file_check */
    char spine_path[4400];
    uint64_t spine_bytes; /* the manifest's */
    int64_t spine_have;   /* spine.bin's real size when file_check reported it; -1: missing or not looked at */
    unsigned char *skip;  /* [layer]: the layer's packs reported by file_check */
    int n_skip;
    char first[3][64];    /* the first problems, named in the FAILED line as df_model_verify_all names them */
    int n_first, n_events;
    char view_spine[4600]; /* the view's spine.bin: said as spine_path in the engine's messages */
} damage;

static void note_problem(damage *d, const char *name) {
    if (d->n_first < 3) snprintf(d->first[d->n_first++], sizeof d->first[0], "%s", name);
    d->n_events++;
}

/* df_model_verify_all: one line per problem, as found (user: the damage file_check reported, when checking a view) */
static void report_problem(void *user, const df_verify_problem *p) {
    damage *d = user;
    line_end();
    if (d) {
        char name[64];
        if (p->layer < 0) snprintf(name, sizeof name, "spine.bin");
        else if (p->expert < 0) snprintf(name, sizeof name, "layer %d", p->layer);
        else snprintf(name, sizeof name, "layer %d expert %d", p->layer, p->expert);
        note_problem(d, name);
        if (p->layer < 0 ? d->spine_bad : p->expert < 0 && p->layer < d->n_skip && d->skip[p->layer]) return; /* said */
    }
    char msg[8192];
    snprintf(msg, sizeof msg, "%s", p->message);
    /* every damaged file's line says its repair (the engine's lines for a corrupt spine.bin or a pack that cannot be
     * opened do not; the open's error, which did, is not said again for that file) */
    if (p->expert < 0 && !strstr(msg, "convert") && !strstr(msg, "repair"))
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "%s", p->layer < 0 ? "; convert again" : "; restore the file, or convert again");
    if (d && d->view_spine[0]) { /* the view's spine.bin is the model's */
        const char *v = strstr(p->message, d->view_spine);
        if (v) snprintf(msg, sizeof msg, "%.*s%s%s", (int)(v - p->message), p->message, d->spine_path, v + strlen(d->view_spine));
    }
    if (d) convert_cache_hint(d->cache, msg, sizeof msg);
    advice(msg, sizeof msg);
    note_paths(msg);
    if (p->layer < 0)
        fprintf(stderr, "deltafin doctor: spine CORRUPT: %s\n", msg);
    else if (p->expert < 0)
        fprintf(stderr, "deltafin doctor: layer %d UNREADABLE: %s\n", p->layer, msg);
    else
        fprintf(stderr, "deltafin doctor: corrupt expert: %s\n", msg); /* names layer, expert, file(s), offset(s) */
}

/* one damaged file found by file_check, in report_problem's format (layer -1: spine.bin) */
static void report_file(const damage *d, int layer, const char *what) {
    char msg[8192];
    snprintf(msg, sizeof msg, "%s", what);
    convert_cache_hint(d->cache, msg, sizeof msg);
    advice(msg, sizeof msg);
    note_paths(msg);
    if (layer < 0) fprintf(stderr, "deltafin doctor: spine CORRUPT: %s\n", msg);
    else fprintf(stderr, "deltafin doctor: layer %d UNREADABLE: %s\n", layer, msg);
}

/* a non-negative integer of a manifest (as native.c reads them); -1 when absent or not one */
static int64_t num_u64(const cJSON *x) {
    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 9.0e15 || x->valuedouble != (double)(int64_t)x->valuedouble)
        return -1;
    return (int64_t)x->valuedouble;
}
static int64_t j_u64(const cJSON *o, const char *k) { return num_u64(cJSON_GetObjectItemCaseSensitive(o, k)); }

/* Every file of the native model nat (its real path) that its manifest (root) names, checked for what stops the model
 * from opening, each such file reported (report_file); root is rewritten for the view in directory view: every pack by
 * its absolute path, a damaged one (of another size, or not looked at) by a path in view that does not exist, and a damaged
 * spine.bin as an empty stand-in (its file made in view; the model's spine.bin linked there otherwise). Returns the
 * number of damaged files that stop the model from opening (a missing pack in a layer without such a file is left to
 * df_model_verify_all), negated when the view could not be made; 0 also when the manifest is not one it can follow
 * (nothing reported). */
static int file_check(const char *nat, cJSON *root, const char *view, damage *d) {
    cJSON *sp = cJSON_GetObjectItemCaseSensitive(root, "spine");
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(sp, "file");
    const int64_t sbytes = j_u64(sp, "bytes");
    if (!cJSON_IsString(sf) || !sf->valuestring[0] || strchr(sf->valuestring, '/') || !strcmp(sf->valuestring, ".") ||
        !strcmp(sf->valuestring, "..") || sbytes < 0)
        return 0;
    const cJSON *ex = cJSON_GetObjectItemCaseSensitive(root, "experts");
    const cJSON *layers = cJSON_GetObjectItemCaseSensitive(ex, "layers");
    const int64_t ne = j_u64(ex, "n_experts"), stride = j_u64(ex, "stride");
    /* what the checks below read, first: a manifest they cannot follow is left to the engine's error */
    int max_layer = -1;
    for (const cJSON *lj = cJSON_IsArray(layers) ? layers->child : NULL; lj; lj = lj->next) {
        const int64_t l = j_u64(lj, "layer");
        const cJSON *files = cJSON_GetObjectItemCaseSensitive(lj, "files"), *ss = cJSON_GetObjectItemCaseSensitive(lj, "stripe_sizes");
        const int nf = cJSON_GetArraySize(files);
        if (l < 0 || l > 65535 || ne < 1 || ne > 1000000 || stride < 1 || !cJSON_IsArray(files) || nf < 1 || nf > 64 ||
            (ss && (!cJSON_IsArray(ss) || cJSON_GetArraySize(ss) != nf)))
            return 0;
        for (const cJSON *fj = files->child; fj; fj = fj->next)
            if (!cJSON_IsString(fj) || !fj->valuestring[0]) return 0;
        for (const cJSON *x = ss ? ss->child : NULL; x; x = x->next)
            if (num_u64(x) < 1) return 0;
        if (l > max_layer) max_layer = (int)l;
    }
    d->n_skip = max_layer + 1;
    d->skip = calloc((size_t)d->n_skip + 1, 1);
    if (!d->skip) return 0;
    int bad = 0;
    char msg[8192];
    struct stat st;
    /* spine.bin: present, of the manifest's size */
    snprintf(d->spine_path, sizeof d->spine_path, "%s/%s", nat, sf->valuestring);
    d->spine_bytes = (uint64_t)sbytes;
    msg[0] = 0;
    d->spine_have = -1;
    if (stat(d->spine_path, &st) != 0)
        snprintf(msg, sizeof msg, "spine file %s: %s%s", d->spine_path, strerror(errno),
                 errno == ENOENT ? " (the converted model is incomplete; convert again)" : "");
    else if ((uint64_t)(d->spine_have = (int64_t)st.st_size) != d->spine_bytes)
        snprintf(msg, sizeof msg, "%s is %lld bytes but the manifest says %llu (truncated or replaced; convert again)",
                 d->spine_path, (long long)st.st_size, (unsigned long long)d->spine_bytes);
    if (msg[0]) {
        d->spine_bad = 1;
        bad++;
        note_problem(d, "spine.bin");
        report_file(d, -1, msg);
    }
    /* the packs, layer by layer: each file holds n_experts stripes of its size (stripe_sizes, else stripe_bytes, else
     * the stride); in a layer with a damaged one, every file that is not whole is reported (the engine's line for the
     * layer, which would name one of them, is left out) */
    enum { F_WHOLE, F_MISSING, F_ERROR, F_SIZE };
    for (const cJSON *lj = cJSON_IsArray(layers) ? layers->child : NULL; lj; lj = lj->next) {
        const int layer = (int)j_u64(lj, "layer");
        cJSON *files = cJSON_GetObjectItemCaseSensitive(lj, "files");
        const cJSON *ss = cJSON_GetObjectItemCaseSensitive(lj, "stripe_sizes");
        const int64_t sb = j_u64(lj, "stripe_bytes");
        const int nf = cJSON_GetArraySize(files);
        char path[64][4400];
        int cls[64], err[64], blocked = 0;
        int64_t have[64];
        uint64_t need[64];
        for (int k = 0; k < nf; k++) {
            const char *f = cJSON_GetArrayItem(files, k)->valuestring;
            if (f[0] == '/') snprintf(path[k], sizeof path[k], "%s", f);
            else snprintf(path[k], sizeof path[k], "%s/%s", nat, f);
            const int64_t size = ss ? num_u64(cJSON_GetArrayItem(ss, k)) : sb > 0 ? sb : stride;
            need[k] = (uint64_t)ne * (uint64_t)size;
            cls[k] = F_WHOLE, err[k] = 0, have[k] = 0;
            if (stat(path[k], &st) != 0) err[k] = errno, cls[k] = errno == ENOENT ? F_MISSING : F_ERROR;
            else if ((uint64_t)(have[k] = (int64_t)st.st_size) != need[k]) cls[k] = F_SIZE;
            blocked |= cls[k] == F_ERROR || cls[k] == F_SIZE;
        }
        for (int k = 0; k < nf; k++) {
            if (blocked && cls[k] != F_WHOLE) {
                if (cls[k] == F_MISSING)
                    snprintf(msg, sizeof msg, "cannot open expert pack %s (layer %d): %s; none of its %d experts checked", path[k],
                             layer, strerror(err[k]), (int)ne);
                else if (cls[k] == F_ERROR)
                    snprintf(msg, sizeof msg, "expert pack %s (layer %d): %s; none of its %d experts checked", path[k], layer,
                             strerror(err[k]), (int)ne);
                else
                    snprintf(msg, sizeof msg, "expert pack %s (layer %d) is %lld bytes, needs %llu (%s; convert again); "
                             "none of its %d experts checked", path[k], layer, (long long)have[k], (unsigned long long)need[k],
                             native_pack_size_cause((uint64_t)have[k], need[k]), (int)ne);
                report_file(d, layer, msg);
                bad += cls[k] != F_MISSING;
            }
            /* the view: the model's file by its absolute path, a damaged one by a path that does not exist */
            char vpath[4600];
            const char *base = strrchr(path[k], '/');
            if (cls[k] == F_ERROR || cls[k] == F_SIZE) snprintf(vpath, sizeof vpath, "%s/absent/%s", view, base ? base + 1 : path[k]);
            else snprintf(vpath, sizeof vpath, "%s", path[k]);
            cJSON_ReplaceItemInArray(files, k, cJSON_CreateString(vpath));
        }
        if (blocked) d->skip[layer] = 1;
    }
    if (!bad) return 0;
    /* the view's spine: the model's (linked), or an empty stand-in for a damaged one (its state is reported above) */
    char *vspine = d->view_spine;
    snprintf(vspine, sizeof d->view_spine, "%s/%s", view, sf->valuestring);
    if (d->spine_bad) {
        char hx[17];
        df_xxh64_hex(df_xxh64("", 0), hx);
        cJSON_ReplaceItemInObject(sp, "bytes", cJSON_CreateNumber(0));
        cJSON_ReplaceItemInObject(sp, "xxh64", cJSON_CreateString(hx));
        cJSON_ReplaceItemInObject(sp, "tensors", cJSON_CreateArray());
        int fd = open(vspine, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) return -bad;
        close(fd);
    } else if (symlink(d->spine_path, vspine) != 0) {
        return -bad;
    }
    return bad;
}

/* The view of the native model nat (file_check) in a new temporary directory (view), its manifest written: file_check's
 * count of the damaged files it reported (0: none that stop the model from opening; negated: reported, but the view
 * could not be made). remove_view removes it. */
static int make_view(const char *nat, damage *d, char *view, size_t cap) {
    char real[4096], mf[4200];
    if (!realpath(nat, real)) return 0;
    snprintf(mf, sizeof mf, "%s/manifest.json", real);
    char *txt = NULL;
    size_t len = 0;
    if (df_read_file(mf, &txt, &len, NULL, 0)) return 0;
    cJSON *root = cJSON_ParseWithLength(txt, len);
    free(txt);
    if (!cJSON_IsObject(root)) { cJSON_Delete(root); return 0; }
    const char *tmp = getenv("TMPDIR");
    snprintf(view, cap, "%s/deltafin-doctor.XXXXXX", tmp && tmp[0] == '/' ? tmp : "/tmp");
    if (!mkdtemp(view)) { view[0] = 0; cJSON_Delete(root); return 0; }
    int bad = file_check(real, root, view, d);
    char *out = bad > 0 ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (bad > 0) {
        snprintf(mf, sizeof mf, "%s/manifest.json", view);
        FILE *f = out ? fopen(mf, "w") : NULL;
        int ok = f && fputs(out, f) >= 0;
        if (f && fclose(f)) ok = 0;
        if (!ok) bad = -bad;
    }
    free(out);
    return bad;
}

/* verify_progress for the view's verification; a SIGINT / SIGTERM / SIGHUP (df_interrupt_install) cancels it, so that
 * the view is removed before the signal ends the process */
static int view_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    verify_progress(user, what, done, total);
    return df_interrupted() != 0;
}

/* the view and its files gone */
static void remove_view(const char *view, const damage *d) {
    if (!view[0]) return;
    char p[4700];
    snprintf(p, sizeof p, "%s/manifest.json", view);
    unlink(p);
    if (d->view_spine[0]) unlink(d->view_spine);
    rmdir(view);
}

/* A native model whose manifest.json is missing or damaged: dir is no Hugging Face checkpoint (no config.json) but holds
 * files convert writes (spine.bin, experts-L*.pack, or their *.tmp of a conversion that did not finish), and its
 * manifest.json is missing, cannot be read, is not valid JSON or is not a deltafin manifest. Without the manifest
 * nothing else can be read or checked. The number of those files found, with the manifest's path in mf, what is
 * wrong with it in what ("is missing") and the files in files ("spine.bin and 3 expert packs"); else 0 (a manifest
 * that parses is the engine's to check). */
static int manifest_damaged(const char *dir, char *mf, size_t mcap, char *what, size_t wcap, char *files, size_t fcap) {
    if (cli_is_file(dir, "config.json")) return 0;
    DIR *dh = opendir(dir);
    if (!dh) return 0;
    int spine = 0, packs = 0, tmp = 0;
    for (struct dirent *e; (e = readdir(dh)) != NULL;) {
        const char *n = e->d_name;
        const size_t L = strlen(n);
        const int is_tmp = L > 4 && !strcmp(n + L - 4, ".tmp");
        const size_t b = is_tmp ? L - 4 : L; /* the name without .tmp */
        const int is_spine = b == 9 && !strncmp(n, "spine.bin", 9);
        const int is_pack = b > 14 && !strncmp(n, "experts-L", 9) && !strncmp(n + b - 5, ".pack", 5);
        const int is_man = is_tmp && b == 13 && !strncmp(n, "manifest.json", 13);
        if (is_tmp && (is_spine || is_pack || is_man)) tmp++;
        else if (is_spine) spine = 1;
        else if (is_pack) packs++;
    }
    closedir(dh);
    if (!spine && !packs && !tmp) return 0;
    char real[4096];
    snprintf(mf, mcap, "%s/manifest.json", realpath(dir, real) ? real : dir);
    char *txt = NULL;
    size_t len = 0;
    struct stat st;
    if (stat(mf, &st) != 0) snprintf(what, wcap, "%s", errno == ENOENT ? "is missing" : strerror(errno));
    else if (df_read_file(mf, &txt, &len, NULL, 0)) snprintf(what, wcap, "cannot be read: %s", strerror(errno));
    else {
        cJSON *m = cJSON_ParseWithLength(txt, len);
        const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(m, "format");
        if (!m) snprintf(what, wcap, "is not valid JSON (%zu bytes: cut short or overwritten)", len);
        else if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, "deltafin-native"))
            snprintf(what, wcap, "is not a deltafin manifest (no \"format\": \"deltafin-native\")");
        else what[0] = 0;
        cJSON_Delete(m);
    }
    free(txt);
    if (!what[0]) return 0;
    size_t o = 0;
    files[0] = 0;
    if (spine) o += (size_t)snprintf(files + o, o < fcap ? fcap - o : 0, "spine.bin");
    if (packs && o < fcap)
        o += (size_t)snprintf(files + o, fcap - o, "%s%d expert pack%s", spine ? " and " : "", packs, packs == 1 ? "" : "s");
    if (tmp && o < fcap)
        snprintf(files + o, fcap - o, "%s%d *.tmp file%s of a conversion that did not finish", o ? ", and " : "", tmp,
                 tmp == 1 ? "" : "s");
    return spine + packs + tmp;
}

/* a setup install's side file that is not the checkpoint's copy (install_check_side_files) */
static void report_side_file(void *user, const install_side_problem *p) {
    (void)user;
    line_end();
    if (p->missing && (!strcmp(p->name, "tokenizer.json") || !strcmp(p->name, "tiktoken.model"))) side_tok_missing = 1;
    fprintf(stderr, "deltafin doctor: %s %s %s: repair the install with `%s`\n", p->installed,
            p->missing ? "is missing; the checkpoint's copy is" : "differs from the checkpoint's copy", p->checkpoint, setup_fix);
}

/* The tokenizer of model: OK, none (token ids only), or a problem (said on stderr, named in tok_problem for the
 * closing summary, its repair in tok_fix): a file that is present but does not open is an error (not "no
 * tokenizer"), and so is tokenizer_config.json without the tokenizer itself. 1 on a problem. */
static int check_tokenizer(const char *model) {
    if (cli_is_file(model, "tokenizer.json") || cli_is_file(model, "tiktoken.model")) {
        df_tokenizer *t = NULL;
        char terr[1024] = "";
        if (df_tokenizer_open(&t, model, NULL, terr, sizeof terr)) {
            fprintf(stderr, "deltafin doctor: tokenizer FAILED: %s\n", terr[0] ? terr : "cannot open");
            const char *tf = cli_is_file(model, "tokenizer.json") ? "tokenizer.json" : "tiktoken.model";
            snprintf(tok_problem, sizeof tok_problem, "%s does not open", tf);
            if (setup_fix[0]) {
                snprintf(tok_fix, sizeof tok_fix, "`%s` repairs the install", setup_fix);
            } else if (cli_is_file(model, "config.json") && !cli_is_file(model, "manifest.json")) {
                /* a Hugging Face checkpoint: its own copy is the broken one */
                snprintf(tok_fix, sizeof tok_fix, "replace %s/%s with the model's own (from its repository)", model, tf);
            } else { /* a converted model: from the checkpoint when it has one, else from the model's repository */
                char fix[8192];
                cli_tokenizer_fix(model, fix, sizeof fix);
                snprintf(tok_fix, sizeof tok_fix, "%s", fix);
            }
            return 1;
        }
        printf("tokenizer: OK\n");
        df_tokenizer_free(t);
        return 0;
    }
    if (cli_is_file(model, "tokenizer_config.json")) {
        /* the tokenizer's configuration without the tokenizer: lost, or never in the checkpoint (cli_tokenizer_fix) */
        snprintf(tok_problem, sizeof tok_problem, "tokenizer.json is missing");
        char fix[41000];
        if (cli_tokenizer_fix(model, fix, sizeof fix)) snprintf(tok_fix, sizeof tok_fix, "`%s` repairs the install", setup_fix);
        else snprintf(tok_fix, sizeof tok_fix, "%s", fix);
        if (!side_tok_missing)
            fprintf(stderr, "deltafin doctor: tokenizer FAILED: %s has tokenizer_config.json but neither tokenizer.json nor "
                            "tiktoken.model: %s\n", model, fix);
        return 1;
    }
    printf("tokenizer: none (token ids only)\n");
    return 0;
}

/* The checksums all verified: said on stdout; when another check failed (status != 0) the last line on stderr says
 * the doctor FAILED anyway, with the setup install's repair when there is one. */
static void checksums_ok(int status, int others) {
    say_open_err();
    printf("checksums: all OK\n");
    if (status && tok_problem[0])
        fprintf(stderr, "deltafin doctor: FAILED: %s%s (the checksums are OK); %s\n", tok_problem,
                others ? ", and the other problems reported above" : "", tok_fix);
    else if (status)
        fprintf(stderr, "deltafin doctor: FAILED by the problems reported above (the checksums are OK)%s%s%s\n",
                setup_fix[0] ? "; `" : "", setup_fix, setup_fix[0] ? "` repairs the install" : "");
}

/* the spine's and the routed experts' state, on stdout: spine.bin's real size (spine_have; -1: missing), and the
 * experts that failed their checksum or could not be read (corrupt) apart from those in a layer whose pack could not
 * be opened (unreadable: the layers said UNREADABLE above) */
static void print_state(int spine_ok, const char *spine_file, int64_t spine_have, const df_verify_summary *sum) {
    if (spine_have < 0) printf("spine: %s (%s, missing)\n", spine_ok ? "OK" : "CORRUPT", spine_file);
    else printf("spine: %s (%s, %lld bytes)\n", spine_ok ? "OK" : "CORRUPT", spine_file, (long long)spine_have);
    if (sum->n_moe_layers) {
        const int unreadable = sum->n_unreadable_experts, corrupt = sum->n_bad_experts - unreadable;
        printf("experts: %d routed experts in %d MoE layers: %d OK, %d corrupt", sum->n_experts, sum->n_moe_layers,
               sum->n_experts - sum->n_bad_experts, corrupt);
        if (unreadable) printf(", %d unreadable", unreadable);
        printf("\n");
    } else
        printf("experts: none (dense model)\n");
}

/* a file's size, -1 when it cannot be looked at (missing) */
static int64_t spine_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* df_model_verify_all stopped at a damaged file that keeps the model from opening (verr, its error): each damaged file
 * (file_check), then every other checksum (through the view), the states and the FAILED line, as for a model that
 * opens; exit status 1. Without a native model or manifest to follow (or no damaged file found), verr alone, unless
 * it is the open's error (err) already said. */
static int verify_damaged(const char *model, const df_model_opts *opts, const char *cache_dir, const char *verr, const char *err) {
    char nat[4700] = "", view[4200] = "";
    damage d;
    memset(&d, 0, sizeof d);
    if (cli_is_file(model, "manifest.json")) snprintf(nat, sizeof nat, "%s", model);
    else if (cli_is_file(model, "config.json") && convert_cache_lookup(model, cache_dir, opts->spine, nat, sizeof nat, NULL, 0) == 1)
        d.cache = nat; /* its conversion in the cache, complete */
    else nat[0] = 0;
    const int bad = nat[0] ? make_view(nat, &d, view, sizeof view) : 0;
    int nb = 0;
    df_verify_summary sum;
    char verr2[8192] = "";
    if (bad > 0) { /* its errors would name the view: the model's (verr) is said instead */
        df_model_opts vo = *opts;
        vo.progress = view_progress;
        df_interrupt_install();
        nb = df_model_verify_all(view, &vo, report_problem, &d, &sum, verr2, sizeof verr2);
        line_end();
    }
    remove_view(view, &d);
    free(d.skip);
    const int sig = df_interrupted();
    if (sig) { /* the view removed: end by the signal, as without the view */
        signal(sig, SIG_DFL);
        raise(sig);
    }
    if (bad == 0) { /* nothing found here: the engine's error */
        say_open_err();
        if (strcmp(verr, err)) verification_failed(verr);
        else if (tok_problem[0]) fprintf(stderr, "deltafin doctor: FAILED: the error above, and %s\n", tok_problem);
        return 1;
    }
    if (bad < 0 || nb < 0) { /* the damage found, without the other checksums: the engine's error on the model */
        say_open_err();
        verification_failed(verr);
        return 1;
    }
    say_open_err();
    print_state(!d.spine_bad && sum.spine_ok, d.spine_path, d.spine_bad ? d.spine_have : (int64_t)sum.spine_bytes, &sum);
    /* the FAILED line of df_model_verify_all, with the damage found here */
    char list[256] = "", msg[8192];
    for (int i = 0; i < d.n_first; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", d.first[i]);
    snprintf(msg, sizeof msg,
             "%s, %d of %d routed experts corrupt or unreadable%s%s%s: the model files are damaged; re-run `deltafin convert`",
             !d.spine_bad && sum.spine_ok ? "spine.bin OK" : "spine.bin CORRUPT", sum.n_bad_experts, sum.n_experts,
             d.n_first ? " (" : "", list, d.n_first ? (d.n_events > d.n_first ? ", ...)" : ")") : "");
    convert_cache_hint(d.cache, msg, sizeof msg);
    advice(msg, sizeof msg);
    verification_failed(msg);
    return 1;
}

static const char *simd_features(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    static char buf[128];
    buf[0] = 0;
    if (__builtin_cpu_supports("avx512f")) strcat(buf, "avx512f ");
    if (__builtin_cpu_supports("avx512bw")) strcat(buf, "avx512bw ");
    if (__builtin_cpu_supports("avx512vl")) strcat(buf, "avx512vl ");
    if (__builtin_cpu_supports("avx2")) strcat(buf, "avx2 ");
    if (__builtin_cpu_supports("fma")) strcat(buf, "fma ");
    {   /* F16C from cpuid itself: clang 14's __builtin_cpu_supports does not know "f16c" */
        unsigned a, b, c, d;
        if (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C)) strcat(buf, "f16c ");
    }
    size_t n = strlen(buf);
    if (n) buf[n - 1] = 0; /* the space after the last name */
    else strcpy(buf, "none");
    return buf;
#else
    return "none (not x86-64)";
#endif
}

/* io_uring_setup(0 entries) fails with EINVAL when the syscall exists, ENOSYS/EPERM when it is unavailable. */
static const char *uring_status(void) {
#ifdef __NR_io_uring_setup
    long r = syscall(__NR_io_uring_setup, 0, NULL);
    if (r >= 0) { close((int)r); return "available"; }
    if (errno == EINVAL || errno == EFAULT) return "available";
    if (errno == EPERM) return "blocked (EPERM: seccomp or kernel.io_uring_disabled); the pread pool is used";
    return "not available; the pread pool is used";
#else
    return "unknown";
#endif
}

int cmd_doctor(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL;
    static const char *const values[] = {"--model", "--cache-dir", NULL};
    if (cli_check_repeated("doctor", argc, argv, values, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin doctor [--model DIR] [--cache-dir DIR]\n"
                   "  prints machine facts, then verifies every checksum of the model and that its tokenizer opens\n"
                   "  (without --model: the model `deltafin setup` installed, else the embedded models/kimi-mini):\n"
                   "  every damaged file (spine.bin or an expert pack missing or of another size than the manifest says,\n"
                   "  larger or smaller; manifest.json missing or damaged beside spine.bin / the packs) and every corrupt\n"
                   "  expert (layer, expert, file, offset) is named on one line of its own with its repair, then the spine's\n"
                   "  state (its real size, or missing) and the experts' (OK, corrupt, unreadable: in a pack that could not\n"
                   "  be read); any problem: exit 1, and the last line sums up what failed (a missing tokenizer.json included,\n"
                   "  with where a tokenizer can come from: the checkpoint's copy, or the model's repository when the\n"
                   "  checkpoint has none either).\n"
                   "  A model `deltafin setup` installed: its tokenizer and the other files convert copied are checked against\n"
                   "  the checkpoint's copies too, and the repair named is that setup command (not `deltafin convert`)\n"
                   "  --model DIR      native model dir, or Hugging Face dir (converted once into the cache, as `run` does)\n"
                   "  --cache-dir DIR  where an HF checkpoint (--model DIR or the default model) is converted (default\n"
                   "                   $XDG_CACHE_HOME/deltafin)\n");
            return 0;
        } else if (!strcmp(a, "--model") || !strcmp(a, "--cache-dir")) {
            if (i + 1 >= argc) { fprintf(stderr, "deltafin doctor: %s needs a value\n", a); return 2; }
            if (!strcmp(a, "--model")) model = argv[++i];
            else if (cli_check_cache_dir("doctor", cache_dir = argv[++i])) return 2;
        } else {
            static const char *const opts[] = {"--help", "--model", "--cache-dir", NULL};
            return cli_unknown_option("doctor", a, opts, NULL);
        }
    }
    if (model && cli_check_model_dir("doctor", model)) return 1; /* before the machine facts: run's message */
    int backend_ok = 1;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double ram = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    printf("deltafin %s\n", DELTAFIN_VERSION);
    printf("cores: %ld\n", cores);
    printf("RAM: %.1f GiB\n", ram / 1073741824.0);
    printf("SIMD: %s\n", simd_features());
    printf("io_uring: %s\n", uring_status());
    {
        char b[400];
        const int ok = df_backend_available("cuda", b, sizeof b);
        printf("GPU: %s\n", ok ? b + 6 /* past "cuda: " */ : b);
        /* the backend run / serve would use: DF_BACKEND's (the default --backend) when set, else auto */
        const char *env = getenv("DF_BACKEND");
        const char *dflt = env && *env ? env : "auto";
        backend_ok = df_backend_available(dflt, b, sizeof b);
        if (dflt == env) printf("backend %s (DF_BACKEND): %s\n", env, backend_ok ? b : "cannot start (the error on stderr says why)");
        else printf("backend auto: %s\n", strncmp(b, "cuda:", 5) ? b : "cuda");
        /* auto fails only on a setting (e.g. an invalid CUDA knob): run / serve would stop on it */
        if (!backend_ok && dflt != env) fprintf(stderr, "deltafin doctor: the default backend (auto) cannot start: %s\n", b);
    }
    char dflt_dir[4096], dflt_how[4600] = "";
    if (!model) {
        if (cli_default_model("doctor", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    /* an install of `deltafin setup` (the default model, or --model naming one): its repair is setup's */
    char setup_ck[4200] = "";
    setup_fix[0] = 0;
    cli_setup_install(model, setup_fix, sizeof setup_fix, setup_ck, sizeof setup_ck);
    if (!setup_fix[0]) find_convert_fix(model);
    {   /* a native model whose manifest.json is missing or damaged: its files cannot be read without it */
        char mf[4200], what[200], files[200];
        const int nf = manifest_damaged(model, mf, sizeof mf, what, sizeof what, files, sizeof files);
        if (nf > 0) {
            char msg[41000];
            snprintf(msg, sizeof msg, "%s %s; %s %s here, but without the manifest %s cannot be read or checked; convert again",
                     mf, what, files, nf == 1 ? "is" : "are", nf == 1 ? "it" : "they");
            advice(msg, sizeof msg);
            fprintf(stderr, "deltafin doctor: manifest.json DAMAGED: %s\n", msg);
            /* what can be checked without it: a setup install's side files, the tokenizer */
            if (setup_fix[0]) install_check_side_files(model, setup_ck, report_side_file, NULL);
            check_tokenizer(model);
            snprintf(msg, sizeof msg, "manifest.json %s (%s not checked): the model files are damaged; re-run `deltafin convert`",
                     !strcmp(what, "is missing") ? "missing" : "damaged", files);
            advice(msg, sizeof msg);
            verification_failed(msg);
            return 1;
        }
    }
    char err[8192] = "";
    df_model_opts o;
    df_model_opts_default(&o);
    o.cache_dir = cache_dir;
    o.progress = cli_convert_progress; /* a first-use conversion: run's progress line, once */
    o.progress_user = NULL;
    df_model *m = NULL;
    /* a streamed install (`setup --stream`): opened with its remote source; its local experts are checked below */
    stream_src *remote = NULL;
    if (stream_is_streamed(model)) {
        if (stream_open(&remote, model, 0, err, sizeof err)) { fprintf(stderr, "deltafin doctor: %s\n", err); return 1; }
        o.remote_source = stream_remote(remote);
    }
    int rc = df_model_open(&m, model, &o, err, sizeof err);
    line_end();
    int status = 0, others = 0; /* others: a problem that is not the tokenizer's */
    if (rc) {
        advice(err, sizeof err);
        /* damaged or missing files (a corrupt spine.bin, a missing pack stop the open): still check every checksum below,
         * which names each damaged file; the open error is said then only if none of those lines names its file */
        struct stat st;
        if ((rc != DF_EFORMAT && rc != DF_EIO) || stat(model, &st) || !S_ISDIR(st.st_mode)) {
            fprintf(stderr, "deltafin doctor: %s\n", err);
            return 1;
        }
        snprintf(open_err, sizeof open_err, "%s", err);
        open_err_pending = 1;
        status = others = 1;
    } else {
        char desc[8192]; /* "model NAME (...), ...": the line's key says "model" once */
        const char *d0 = df_model_describe(m);
        snprintf(desc, sizeof desc, "%s", strncmp(d0, "model ", 6) ? d0 : d0 + 6);
        /* without the run settings (", N threads, backend ..., heat ..."): a verification uses none of them */
        char *th = strstr(desc, " threads, backend "), *tk = th ? strstr(th, ", tokenizer ") : NULL;
        if (tk) {
            char *st = th;
            while (st > desc && !(st[0] == ',' && st[1] == ' ')) st--;
            if (st > desc) memmove(st, tk, strlen(tk) + 1);
        }
        printf("model: %s%s%s%s%s\n", desc, dflt_how[0] ? "; model (no --model): " : "",
               dflt_how[0] ? model : "", dflt_how[0] ? ", " : "", dflt_how);
        df_model_close(m); /* the check below reads the files itself */
    }
    /* a setup install: the tokenizer and the other files convert copied, against the checkpoint's copies setup keeps
     * (first: a missing tokenizer file it names is not named again below) */
    if (setup_fix[0] && !remote) {
        int nside = install_check_side_files(model, setup_ck, report_side_file, NULL);
        if (nside) status = 1, others |= nside > side_tok_missing;
        else printf("side files: as in the checkpoint %s\n", setup_ck);
    }
    if (check_tokenizer(model)) status = 1;
    if (remote) {
        /* the manifest's expert checksums are of the holes: check what was fetched against what was recorded */
        uint64_t ok = 0, bad = 0;
        int vr = stream_verify_local(remote, &ok, &bad, stderr);
        stream_print_stats(remote, stdout);
        stream_close(remote);
        say_open_err();
        if (vr < 0) { fprintf(stderr, "deltafin doctor: cannot check the streamed experts: %s\n", df_strerror(vr)); return 1; }
        printf("experts: streamed install: %llu fetched experts OK, %llu corrupt (the others are fetched on first use, "
               "checked against their shard's sha256 ETag)\n", (unsigned long long)ok, (unsigned long long)bad);
        if (bad) {
            char m[41000];
            snprintf(m, sizeof m, "%llu streamed experts corrupt%s%s%s", (unsigned long long)bad,
                     setup_fix[0] ? "; `" : "", setup_fix, setup_fix[0] ? "` fetches them again" : "");
            verification_failed(m);
            return 1;
        }
        checksums_ok(status, others);
        return backend_ok ? status : 1;
    }
    /* every checksum: each corrupt expert (layer, expert, file, offset) and the spine's state */
    char verr[8192] = "";
    df_verify_summary sum;
    o.progress = verify_progress;
    o.progress_user = NULL;
    int nbad = df_model_verify_all(model, &o, report_problem, NULL, &sum, verr, sizeof verr);
    line_end();
    advice(verr, sizeof verr);
    if (nbad == DF_EFORMAT || nbad == DF_EIO) /* a damaged file stopped the model from opening: the others still */
        return verify_damaged(model, &o, cache_dir, verr, err);
    if (nbad < 0) {
        say_open_err();
        if (strcmp(verr, err)) verification_failed(verr);
        else if (tok_problem[0]) fprintf(stderr, "deltafin doctor: FAILED: the error above, and %s\n", tok_problem);
        return 1;
    }
    say_open_err();
    print_state(sum.spine_ok, sum.spine_file, spine_size(sum.spine_file), &sum);
    if (nbad > 0) {
        verification_failed(verr);
        return 1;
    }
    checksums_ok(status, others);
    return backend_ok ? status : 1;
}
