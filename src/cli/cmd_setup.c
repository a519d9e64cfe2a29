/* cmd_setup.c — `deltafin setup REPO`: download a model from a Hugging Face-compatible mirror
 * (src/hub), check it, convert it to the native layout (df_convert) and record it in the
 * installed-models registry as the default model. See usage(). */
#define _GNU_SOURCE
#include "cli.h"
#include "deltafin.h"
#include "hub/hub.h"
#include "hub/install.h"
#include "hub/registry.h"
#include "hub/stream.h"
#include "model/native.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin setup REPO [options]\n\n"
            "Download the Hugging Face model REPO (OWNER/NAME) from a mirror, verify it, convert it to deltafin's\n"
            "native layout and make it the default model of run / serve / tokenize / bench decode, prefill, batch / doctor\n"
            "(see `deltafin list`).\n"
            "Any server with the hub's HTTP layout works: MIRROR/REPO/resolve/REV/FILE with Range requests, the\n"
            "X-Linked-Size / ETag (sha256) headers of LFS files, and the listing MIRROR/api/models/REPO/revision/REV\n"
            "(else model.safetensors.index.json is the listing). config.json is checked BEFORE anything large is\n"
            "downloaded: an architecture deltafin cannot run stops here.\n\n"
            "options:\n"
            "  --full                 download every needed file, then convert (the default); on a streamed install:\n"
            "                         completes it in place\n"
            "  --stream               download the spine only (every tensor but the routed experts, plus each shard's\n"
            "                         safetensors header); each routed expert is fetched by HTTP Range the first time a\n"
            "                         token needs it, verified, written into the native pack and read locally afterwards\n"
            "                         (`deltafin warm` fetches ahead); output identical to a full install\n"
            "  --disk-budget SIZE     with --stream: keep at most SIZE of fetched experts on disk, evicting the coldest\n"
            "                         (heat-ranked; default unbounded)\n"
            "  --revision R           branch, tag or commit (default main)\n"
            "  --mirror URL           default $HF_ENDPOINT, else https://huggingface.co; token: $HF_TOKEN\n"
            "  --dir DIR              install directory (default $XDG_DATA_HOME/deltafin/models/OWNER--NAME, else\n"
            "                         ~/.local/share/deltafin/models/OWNER--NAME): DIR/NAME (the checkpoint),\n"
            "                         DIR/native (the native model)\n"
            "  --expert-dirs D1,D2    stripe the routed experts over these directories (one per drive)\n"
            "  --include-draft        also download the repo's draft/ model files\n"
            "  --connections N        parallel ranged requests (default 8)\n"
            "  --hash-threads N       SHA-256 threads, one file each (default 0 = cores - 1, at most 4)\n"
            "  --chunk SIZE           bytes per ranged request (default 16M)\n"
            "  --retries N            extra tries of a failed request (default 4)\n"
            "  --threads N            threads that write the expert packs in the conversion (as convert --threads):\n"
            "                         an integer from 0 to 1024; 0 (the default) = one per core\n"
            "  --keep-download        keep the downloaded .safetensors shards after the conversion (default: removed)\n"
            "  --download-only        download and verify into DIR/NAME only: no conversion, nothing recorded\n"
            "  --registry FILE        installed-models registry (default $DELTAFIN_REGISTRY, else\n"
            "                         $XDG_DATA_HOME/deltafin/models.json, else ~/.local/share/deltafin/models.json)\n"
            "  --no-default           record the model without making it the default; the registry holds one entry per\n"
            "                         REPO, so when REPO is the default and installed in another directory, its entry (and\n"
            "                         so the default) is left unchanged and this install is not recorded (use --model DIR/native)\n"
            "  --quiet                no progress lines (on a terminal one line rewritten in place; to a file or pipe a\n"
            "                         plain line every 5 s, then the step's summary line)\n"
            "  --verbose              log every request\n"
            "Resumable: files are written as FILE.partial with a sidecar of the bytes done; a run stopped in any way\n"
            "(kill -9, a dropped network, Ctrl-C) continues where it stopped when run again, fetching no byte twice.\n"
            "A file gets its final name only after its sha256 matched the mirror's; verified files are synced to the\n"
            "disk together at the end (--download-only, --keep-download; by default the shards are removed after the\n"
            "conversion without being synced). A file a stop left verified but not yet synced is re-hashed by the next\n"
            "run: kept if its bytes on the disk match, downloaded again if not. With --download-only each verified range\n"
            "is handed to the drive's writeback as it is hashed, so the final sync is short (DF_SETUP_WRITEBACK=1|0\n"
            "forces it on or off). Exit 1 on any error, 2 on usage.\n");
}

static uint64_t du_total;
static int du_add(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)p; (void)f;
    if (flag == FTW_F) du_total += (uint64_t)st->st_blocks * 512u;
    return 0;
}
static uint64_t disk_usage(const char *dir) {
    du_total = 0;
    nftw(dir, du_add, 32, FTW_PHYS);
    return du_total;
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st; (void)flag; (void)f;
    remove(p);
    return 0;
}

/* progress of a long local step (the conversion, the verification of an install): on a terminal one line rewritten
 * twice a second; elsewhere (a log file, a pipe) a plain line every 5 s, the first at 5 s (the step's summary line ends it) */
typedef struct { const char *label; double t0, last; int open, quiet, ended; } conv_prog;

static int on_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    conv_prog *p = user;
    (void)what;
    if (df_interrupted()) return 1;
    if (p->quiet || p->ended) return 0;
    double t = df_now();
    if (total && done >= total) p->ended = 1;
    const int tty = cli_stderr_tty();
    if (tty ? t - p->last < 0.5 && done < total : done >= total || t - (p->last > 0 ? p->last : p->t0) < 5.0) return 0;
    p->last = t;
    fprintf(stderr, "%s%s: %.1f / %.1f MB  %5.1f%%  %.1f MB/s%s", cli_cr(), p->label, done / 1e6, total / 1e6,
            total ? 100.0 * (double)done / (double)total : 100.0, t > p->t0 ? done / 1e6 / (t - p->t0) : 0.0, tty ? "   " : "\n");
    p->open = tty;
    fflush(stderr);
    return 0;
}

static int parse_int(const char *flag, const char *v, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi) {
        fprintf(stderr, "deltafin setup: %s \"%s\": expected an integer in [%d, %d]\n", flag, v, lo, hi);
        return 2;
    }
    *out = (int)x;
    return 0;
}

/* Default install directory: <data root>/deltafin/models/OWNER--NAME. */
static int default_dir(const char *repo, char *out, size_t cap) {
    const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
    char name[300];
    snprintf(name, sizeof name, "%s", repo);
    char *s = strchr(name, '/');
    if (s) { memmove(s + 2, s + 1, strlen(s + 1) + 1); s[0] = '-'; s[1] = '-'; }
    if (xdg && *xdg) snprintf(out, cap, "%s/deltafin/models/%s", xdg, name);
    else if (home && *home) snprintf(out, cap, "%s/.local/share/deltafin/models/%s", home, name);
    else return -1;
    return 0;
}

/* The registry's entry of repo, if any: 1 and *out filled, else 0 (an unreadable registry is reported when recording). */
static int prior_entry(const char *reg, const char *repo, reg_entry *out) {
    reg_entry *es = NULL;
    int n = 0, found = 0;
    char err[512];
    if (registry_load(reg, &es, &n, NULL, 0, err, sizeof err)) return 0;
    for (int i = 0; i < n; i++)
        if (!strcmp(es[i].repo, repo)) { *out = es[i]; found = 1; break; }
    free(es);
    return found;
}

/* Recording repo in another install directory replaces its registry entry: the old directory's files stay
 * where they are, so say which they are and how to delete them. */
static void note_replaced_dir(const char *reg, const reg_entry *e) {
    reg_entry old;
    if (!prior_entry(reg, e->repo, &old) || !old.dir[0] || !strcmp(old.dir, e->dir)) return;
    char qold[8300]; /* pasted into a shell: quoted as one word */
    fprintf(stderr, "setup: note: %s was installed in %s; the registry now points at %s instead. The files in %s were left "
                    "in place%s: delete them with `rm -rf %s` if you no longer need them\n",
            e->repo, old.dir, e->dir, old.dir, df_path_exists(old.dir) ? "" : " (it no longer exists)",
            df_shell_quote(old.dir, qold, sizeof qold));
}

/* The registry holds one entry per repo, and the default names a repo: with --no-default, recording an install of the
 * default repo in another directory would repoint that entry, and so change what the default model loads. Then the
 * entry is left as it is and this install is not recorded: 1 and *kept filled (the entry left in place), else 0. */
static int keeps_default_entry(const char *reg, const reg_entry *e, int no_default, reg_entry *kept) {
    if (!no_default) return 0;
    reg_entry *es = NULL;
    int n = 0, found = 0;
    char dflt[256], err[512];
    if (registry_load(reg, &es, &n, dflt, sizeof dflt, err, sizeof err)) return 0;
    for (int i = 0; i < n && !found; i++)
        if (!strcmp(es[i].repo, e->repo) && !strcmp(dflt, e->repo) && es[i].dir[0] && strcmp(es[i].dir, e->dir)) {
            *kept = es[i];
            found = 1;
        }
    free(es);
    return found;
}

/* Record e in the registry (the default too unless no_default) and put in tail what the closing line says about it:
 * default_tail when it is the default now, "" when recorded with --no-default, and when keeps_default_entry (nothing
 * written) that the install is not recorded, which install the default stays and how to use this one. 0 or DF_E*. */
static int record_install(const char *reg, const reg_entry *e, int no_default, const char *default_tail, char *tail, size_t tcap,
                          char *err, size_t errlen) {
    reg_entry kept;
    if (keeps_default_entry(reg, e, no_default, &kept)) {
        char qm[8300];
        snprintf(tail, tcap, "; NOT recorded in the registry (--no-default): %s is the default model and its entry still "
                             "points at %s, left unchanged; use this install with --model %s",
                 e->repo, kept.model, df_shell_quote(e->model, qm, sizeof qm));
        return 0;
    }
    note_replaced_dir(reg, e);
    int rc = registry_record(reg, e, !no_default, err, errlen);
    snprintf(tail, tcap, "%s", no_default ? "" : default_tail);
    return rc;
}

/* ---- re-verifying an existing full install (setup run again over it) ---- */

typedef struct {
    int n;              /* problems found */
    char what[1200];    /* the first ones, named for the closing line */
    int quiet;
    conv_prog *prog;
} damage;

static void damage_add(damage *d, const char *fmt, const char *a, long x, long y) {
    char one[400];
    snprintf(one, sizeof one, fmt, a, x, y);
    d->n++;
    size_t L = strlen(d->what);
    if (d->n <= 4) snprintf(d->what + L, sizeof d->what - L, "%s%s", L ? ", " : "", one);
    else if (d->n == 5) snprintf(d->what + L, sizeof d->what - L, " and more");
}

static void on_problem(void *user, const df_verify_problem *p) {
    damage *d = user;
    if (d->prog && d->prog->open) { fprintf(stderr, "\n"); d->prog->open = 0; }
    fprintf(stderr, "setup: damaged: %s\n", p->message);
    const char *base = strrchr(p->file, '/') ? strrchr(p->file, '/') + 1 : p->file;
    if (p->layer < 0) damage_add(d, "%s", base, 0, 0);
    else if (p->expert < 0) damage_add(d, "%s (layer %ld, unreadable)", base, p->layer, 0);
    else damage_add(d, "%s (layer %ld expert %ld)", base, p->layer, p->expert);
}

/* a file install_file_damage found (it stops the install from opening) */
static void damage_file(void *user, const char *what) { damage_add(user, "%s", what, 0, 0); }

/* The directories a full install's expert packs are in, as --expert-dirs would name them ("" when they are in
 * nat_dir itself, the default): from the manifest, so that a repair writes them where they were. */
static void install_expert_dirs(const char *nat_dir, char *out, size_t cap) {
    out[0] = 0;
    df_native *nat = NULL;
    char err[1400], absn[4096];
    if (native_open(&nat, nat_dir, err, sizeof err) || !nat->n_moe_layers || !realpath(nat_dir, absn)) { native_close(nat); return; }
    const native_expert_layer *L = &nat->moe_layers[0];
    int in_nat = L->n_files == 1;
    size_t o = 0;
    for (int f = 0; f < L->n_files; f++) {
        char d[4200];
        snprintf(d, sizeof d, "%s", L->files[f]);
        char *sl = strrchr(d, '/');
        if (sl) *sl = 0; else snprintf(d, sizeof d, "%s", nat_dir);
        char absd[4096];
        const char *dd = realpath(d, absd) ? absd : d;
        if (strcmp(dd, absn)) in_nat = 0;
        if (o < cap) o += (size_t)snprintf(out + o, cap - o, "%s%s", f ? "," : "", dd);
    }
    if (in_nat || o >= cap) out[0] = 0;
    native_close(nat);
}

/* a side file missing or changed (install_check_side_files): copied again from the checkpoint's copy at once */
typedef struct { damage *d; int n_fixed; char *fixed; size_t fcap; } side_repair;

static void on_side_problem(void *user, const install_side_problem *p) {
    side_repair *r = user;
    char err[1024];
    if (df_copy_file_atomic(p->checkpoint, p->installed, err, sizeof err)) {
        fprintf(stderr, "setup: damaged: %s %s and cannot be copied again from %s: %s\n", p->installed,
                p->missing ? "is missing" : "differs from the checkpoint's", p->checkpoint, err);
        damage_add(r->d, "%s", p->name, 0, 0);
        return;
    }
    fprintf(stderr, "setup: damaged: %s %s: copied again from %s\n", p->installed, p->missing ? "was missing" : "differed from the checkpoint's",
            p->checkpoint);
    size_t L = strlen(r->fixed);
    snprintf(r->fixed + L, r->fcap - L, "%s%s", L ? ", " : "", p->name);
    r->n_fixed++;
}

/* Re-verify the full install nat_dir (converted from the checkpoint directory dl_dir): every checksum of
 * spine.bin and the routed experts (df_model_verify_all), and the side files (tokenizer, ...) against the
 * copies setup keeps in dl_dir. A side file missing or changed is copied again from dl_dir at once (*side_fixed
 * counts them, named in fixed). Returns the number of problems only a new conversion repairs (named in d->what),
 * 0 when the install is intact, DF_ECANCELLED on Ctrl-C. */
static int verify_full_install(const char *nat_dir, const char *dl_dir, int quiet, damage *d, int *side_fixed, char *fixed,
                               size_t fcap) {
    fixed[0] = 0;
    side_repair sr = {d, 0, fixed, fcap};
    install_check_side_files(nat_dir, dl_dir, on_side_problem, &sr);
    *side_fixed = sr.n_fixed;
    df_model_opts o;
    df_model_opts_default(&o);
    conv_prog vp = {"verify", df_now(), 0, 0, quiet, 0};
    o.progress = on_progress;
    o.progress_user = &vp;
    d->prog = &vp;
    char err[2048] = "";
    df_verify_summary sum;
    int nbad = df_model_verify_all(nat_dir, &o, on_problem, d, &sum, err, sizeof err);
    if (vp.open) fprintf(stderr, "\n");
    d->prog = NULL;
    if (nbad == DF_ECANCELLED) return DF_ECANCELLED;
    if (nbad < 0) { /* the files cannot be checked at all (the manifest unreadable, a pack cut short): err says which */
        df_advice_strip(err); /* setup repairs it itself */
        fprintf(stderr, "setup: damaged: %s\n", err);
        /* each file that stops the model from opening, named as the other damage is ("experts-L002.pack (layer 2,
         * truncated: 1000 of 3407872 bytes)"); the error itself when none is found */
        if (!install_file_damage(nat_dir, damage_file, d)) damage_add(d, "%s", err, 0, 0);
    }
    if (!quiet && nbad >= 0)
        fprintf(stderr, "setup: verified %s: spine.bin %s, %d routed experts: %d OK, %d corrupt or unreadable (%.1f s)\n", nat_dir,
                sum.spine_ok ? "OK" : "DAMAGED", sum.n_experts, sum.n_experts - sum.n_bad_experts, sum.n_bad_experts, df_now() - vp.t0);
    return d->n;
}

/* Re-verify a streamed install (setup --stream run again over it): every expert fetched so far against the XXH64
 * recorded when it was fetched (stream_verify_local, as doctor). A corrupt one is marked not present in
 * stream-state.bin (as an eviction does) and fetched again now. *n_ok / *n_fixed get the counts, what names the
 * first repaired ones. 0 when every fetched expert is intact or was fetched again, else DF_E* with err. */
static int verify_streamed_install(const char *nat_dir, uint64_t *n_ok, int *n_fixed, char *what, size_t cap, char *err,
                                   size_t errlen) {
    *n_ok = 0;
    *n_fixed = 0;
    what[0] = 0;
    stream_src *ss = NULL;
    int rc = stream_open(&ss, nat_dir, 0, err, errlen);
    if (rc) return rc;
    char *txt = NULL;
    size_t tlen = 0;
    FILE *mf = open_memstream(&txt, &tlen);
    uint64_t bad = 0;
    int vr = mf ? stream_verify_local(ss, n_ok, &bad, mf) : DF_ENOMEM;
    if (mf) fclose(mf);
    stream_close(ss);
    ss = NULL;
    if (vr < 0) { free(txt); return df_set_errc(err, errlen, vr, "cannot check the fetched experts of %s: %s", nat_dir, df_strerror(vr)); }
    if (!bad) { free(txt); return 0; }
    /* the corrupt ones: named by stream_verify_local's lines ("... streamed expert layer L expert E ...") */
    int (*le)[2] = calloc(bad, sizeof *le), nle = 0;
    for (char *line = txt ? strtok(txt, "\n") : NULL; line && le; line = strtok(NULL, "\n")) {
        const char *m = strstr(line, "streamed expert layer ");
        const char *msg = strncmp(line, "deltafin doctor: ", 17) ? line : line + 17;
        fprintf(stderr, "setup: damaged: %s\n", msg);
        if (m && (uint64_t)nle < bad && sscanf(m, "streamed expert layer %d expert %d", &le[nle][0], &le[nle][1]) == 2) nle++;
    }
    free(txt);
    if (!le || (uint64_t)nle != bad) { free(le); return df_set_errc(err, errlen, DF_EFORMAT, "%llu fetched experts are corrupt and could not be named", (unsigned long long)bad); }
    /* not present any more (stream-state.bin: "DFSTRM1\0", u32 layers, u32 experts, u8 present[layers x experts], ...) */
    char sp[4200];
    snprintf(sp, sizeof sp, "%s/stream-state.bin", nat_dir);
    int fd = open(sp, O_RDWR | O_CLOEXEC);
    uint8_t hdr[16];
    uint32_t E = 0;
    if (fd < 0 || df_pread_all(fd, hdr, sizeof hdr, 0)) {
        if (fd >= 0) close(fd);
        free(le);
        return df_set_errc(err, errlen, DF_EIO, "cannot update %s: %s", sp, strerror(errno));
    }
    memcpy(&E, hdr + 12, 4);
    const uint8_t zero = 0;
    for (int i = 0; i < nle && !rc; i++)
        if (df_pwrite_all(fd, &zero, 1, 16 + (uint64_t)le[i][0] * E + (uint64_t)le[i][1]))
            rc = df_set_errc(err, errlen, DF_EIO, "cannot update %s: %s", sp, strerror(errno));
    if (!rc && fsync(fd)) rc = df_set_errc(err, errlen, DF_EIO, "cannot sync %s: %s", sp, strerror(errno));
    close(fd);
    /* and fetched again now (from the mirror, checked as any fetch) */
    if (!rc && (rc = stream_open(&ss, nat_dir, 0, err, errlen))) ss = NULL;
    for (int i = 0; i < nle && !rc; i++) {
        int fr = stream_fetch_now(ss, le[i][0], le[i][1], err, errlen);
        if (fr < 0) { rc = fr; break; }
        (*n_fixed)++;
        size_t L = strlen(what);
        if (i < 4) snprintf(what + L, cap - L, "%slayer %d expert %d", L ? ", " : "", le[i][0], le[i][1]);
        else if (i == 4) snprintf(what + L, cap - L, " and %d more", nle - 4);
    }
    if (ss) stream_close(ss);
    free(le);
    return rc;
}

int cmd_setup(int argc, char **argv) {
    const char *repo = NULL, *rev = NULL, *mirror = NULL, *dir_flag = NULL, *expert_dirs = NULL, *reg_flag = NULL;
    int download_only = 0, include_draft = 0, keep = 0, no_default = 0, quiet = 0, verbose = 0, threads = 0, retries = 4, stream = 0;
    int said_full = 0, said_stream = 0;
    hub_dl_opts dl;
    hub_dl_opts_default(&dl);
    uint64_t disk_budget = 0;
    static const char *const values[] = {"--revision", "--mirror", "--dir", "--expert-dirs", "--registry", "--connections",
                                         "--hash-threads", "--retries", "--threads", "--disk-budget", "--chunk", NULL};
    if (cli_check_repeated("setup", argc, argv, values, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "deltafin setup: %s needs a value\n", a), (char *)NULL))
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--full")) { stream = 0; said_full = 1; }
        else if (!strcmp(a, "--stream")) { stream = 1; said_stream = 1; }
        else if (!strcmp(a, "--revision")) { if (!(rev = NEXT())) return 2; }
        else if (!strcmp(a, "--mirror")) { if (!(mirror = NEXT())) return 2; }
        else if (!strcmp(a, "--dir")) { if (!(dir_flag = NEXT())) return 2; }
        else if (!strcmp(a, "--expert-dirs")) { if (!(expert_dirs = NEXT())) return 2; }
        else if (!strcmp(a, "--registry")) { if (!(reg_flag = NEXT())) return 2; }
        else if (!strcmp(a, "--include-draft")) include_draft = 1;
        else if (!strcmp(a, "--keep-download")) keep = 1;
        else if (!strcmp(a, "--download-only")) download_only = 1;
        else if (!strcmp(a, "--no-default")) no_default = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--verbose")) verbose = 1;
        else if (!strcmp(a, "--connections")) { const char *v = NEXT(); if (!v || parse_int(a, v, 1, 256, &dl.connections)) return 2; }
        else if (!strcmp(a, "--hash-threads")) { const char *v = NEXT(); if (!v || parse_int(a, v, 0, 4, &dl.hash_threads)) return 2; }
        else if (!strcmp(a, "--retries")) { const char *v = NEXT(); if (!v || parse_int(a, v, 0, 100, &retries)) return 2; }
        else if (!strcmp(a, "--threads")) { const char *v = NEXT(); if (!v || parse_int(a, v, 0, 1024, &threads)) return 2; }
        else if (!strcmp(a, "--disk-budget")) {
            const char *v = NEXT();
            if (!v) return 2;
            if (cli_parse_size(v, &disk_budget)) { fprintf(stderr, "deltafin setup: --disk-budget \"%s\": expected a size (e.g. 200G)\n", v); return 2; }
        }
        else if (!strcmp(a, "--chunk")) {
            const char *v = NEXT();
            if (!v) return 2;
            if (cli_parse_size(v, &dl.chunk_bytes) || dl.chunk_bytes < 65536) {
                fprintf(stderr, "deltafin setup: --chunk \"%s\": expected a size of at least 64K (e.g. 16M)\n", v);
                return 2;
            }
        }
        else if (a[0] == '-') {
            static const char *const opts[] = {"--help", "--full", "--stream", "--revision", "--mirror", "--dir", "--expert-dirs",
                                               "--registry", "--include-draft", "--keep-download", "--download-only",
                                               "--no-default", "--quiet", "--verbose", "--connections", "--hash-threads",
                                               "--retries", "--threads", "--disk-budget", "--chunk", NULL};
            return cli_unknown_option("setup", a, opts, NULL);
        }
        else if (!repo) repo = a;
        else { fprintf(stderr, "deltafin setup: one REPO only (got \"%s\" and \"%s\")\n", repo, a); return 2; }
#undef NEXT
    }
    if (!repo) { fprintf(stderr, "deltafin setup: REPO is required (e.g. moonshotai/Kimi-K2-Instruct)\n\n"); usage(stderr); return 2; }
    if (said_full && said_stream) {
        fprintf(stderr, "deltafin setup: --full and --stream cannot be combined: choose one (--full downloads every file; "
                        "--stream the spine only, the experts on first use; --full later completes a streamed install)\n");
        return 2;
    }
    /* a streamed install's shards hold only headers, the spine and the experts fetched so far (the rest are holes):
     * they are never a checkpoint of their own to hand over or keep */
    if (stream && download_only) {
        fprintf(stderr, "deltafin setup: --stream and --download-only cannot be combined: a streamed install fetches only the "
                        "spine and, later, the experts a token needs; use --download-only alone for the whole checkpoint\n");
        return 2;
    }
    if (stream && keep) {
        fprintf(stderr, "deltafin setup: --stream and --keep-download cannot be combined: a streamed install's shards are "
                        "sparse (only the experts fetched so far) and stay inside the install; use --full --keep-download to "
                        "keep complete shards\n");
        return 2;
    }
    if (disk_budget && !stream) {
        fprintf(stderr, "deltafin setup: --disk-budget applies to --stream installs only (a --full install holds every expert)\n");
        return 2;
    }
    int writeback = -1; /* DF_SETUP_WRITEBACK: 1|on / 0|off, else automatic (on when the sync follows the download) */
    const char *wb = getenv("DF_SETUP_WRITEBACK");
    if (wb && *wb) {
        if (!strcmp(wb, "1") || !strcmp(wb, "on")) writeback = 1;
        else if (!strcmp(wb, "0") || !strcmp(wb, "off")) writeback = 0;
        else {
            fprintf(stderr, "deltafin setup: DF_SETUP_WRITEBACK=\"%s\": expected 1, on, 0 or off (or unset: on with --download-only)\n", wb);
            return 2;
        }
    }
    char err[2048] = "", tail[12000] = ""; /* tail: what the closing line says of the registry (record_install) */
    hub_ctx h;
    if (hub_init(&h, mirror, repo, rev, err, sizeof err)) { fprintf(stderr, "deltafin setup: %s\n", err); return 2; }
    h.retries = retries;
    h.verbose = verbose;
    dl.quiet = quiet;
    char dir[1900], reg[4096], dl_dir[3100], nat_dir[3100];
    if (dir_flag) snprintf(dir, sizeof dir, "%s", dir_flag);
    else if (default_dir(h.repo, dir, sizeof dir)) { fprintf(stderr, "deltafin setup: no install directory: pass --dir DIR (HOME is not set)\n"); return 2; }
    if (registry_path(reg_flag, reg, sizeof reg, err, sizeof err)) { fprintf(stderr, "deltafin setup: %s\n", err); return 2; }
    /* the checkpoint directory is named after the repo: convert names the model after it */
    install_checkpoint_dir(dir, h.repo, dl_dir, sizeof dl_dir);
    snprintf(nat_dir, sizeof nat_dir, "%s/native", dir);
    char hts[16] = "auto";
    if (dl.hash_threads > 0) snprintf(hts, sizeof hts, "%d", dl.hash_threads);
    fprintf(stderr, "setup: %s@%s from %s into %s, %s, %d connections x %.1f MiB ranges, hash threads %s, retries %d, token %s, expert dirs %s, "
                    "registry %s%s\n", h.repo, h.rev, h.mirror, dir, stream ? "stream" : "full", dl.connections, dl.chunk_bytes / 1048576.0, hts, retries,
            h.token[0] ? "from HF_TOKEN" : "none", expert_dirs ? expert_dirs : "DIR/native", reg, no_default ? " (not made default)" : "");
    df_interrupt_install();

    /* an install that already completed: only the registry is updated */
    char man[3200];
    snprintf(man, sizeof man, "%s/manifest.json", nat_dir);
    reg_entry e;
    memset(&e, 0, sizeof e);
    snprintf(e.repo, sizeof e.repo, "%s", h.repo);
    snprintf(e.revision, sizeof e.revision, "%s", h.rev);
    snprintf(e.mirror, sizeof e.mirror, "%s", h.mirror);
    snprintf(e.mode, sizeof e.mode, "%s", stream ? "stream" : "full");
    char absd[4096];
    snprintf(e.dir, sizeof e.dir, "%.1900s", realpath(dir, absd) ? absd : dir);
    snprintf(e.model, sizeof e.model, "%.1900s/native", e.dir);
    int was_streamed = stream_is_streamed(nat_dir);
    reg_entry kept;
    if (!download_only && keeps_default_entry(reg, &e, no_default, &kept)) {
        char qm[8300];
        fprintf(stderr, "setup: note: %s is the default model, installed in %s; the registry holds one entry per model and "
                        "--no-default leaves that entry (and so the default) unchanged, so this install in %s will not be "
                        "recorded in the registry: use it with --model %s\n",
                e.repo, kept.dir, e.dir, df_shell_quote(e.model, qm, sizeof qm));
    }
    int repairing = 0, rc0 = 0;
    damage dmg;
    memset(&dmg, 0, sizeof dmg);
    char repair_dirs[4096] = "";
    if (df_path_exists(man) && (stream || !was_streamed)) {
        /* the revision installed here (the registry's entry of this directory): another one is not "installed" */
        reg_entry old;
        const char *have_rev = prior_entry(reg, h.repo, &old) && !strcmp(old.dir, e.dir) && old.revision[0] ? old.revision : NULL;
        if (have_rev && rev && strcmp(have_rev, h.rev)) {
            char qdir[8300], qrepo[1100], qrev[1100], qreg[8300]; /* pasted into a shell: each word quoted */
            df_shell_quote(dir, qdir, sizeof qdir);
            fprintf(stderr, "deltafin setup: %s is installed in %s at revision \"%s\", not the requested \"%s\"; nothing was changed. "
                            "To replace it, delete that install (`rm -rf %s`) and run `deltafin setup %s --revision %s%s%s%s%s` "
                            "again; to keep both, install the new revision elsewhere with --dir OTHER_DIR (the registry then "
                            "points at it)\n",
                    h.repo, dir, have_rev, h.rev, qdir, df_shell_quote(h.repo, qrepo, sizeof qrepo),
                    df_shell_quote(h.rev, qrev, sizeof qrev), dir_flag ? " --dir " : "", dir_flag ? qdir : "",
                    reg_flag ? " --registry " : "", reg_flag ? df_shell_quote(reg_flag, qreg, sizeof qreg) : "");
            return 1;
        }
        if (have_rev) snprintf(e.revision, sizeof e.revision, "%s", have_rev);
        if (was_streamed) snprintf(e.mode, sizeof e.mode, "stream");
        /* a full install is verified again (as a pull would): a side file that went missing is copied again from the
         * checkpoint's copy; a damaged spine.bin or expert pack sends setup on to download and convert again */
        if (!was_streamed && !download_only) {
            if (!quiet) fprintf(stderr, "setup: %s is installed in %s: verifying every file\n", h.repo, nat_dir);
            int side_fixed = 0;
            char fixed[600];
            rc0 = verify_full_install(nat_dir, dl_dir, quiet, &dmg, &side_fixed, fixed, sizeof fixed);
            if (rc0 == DF_ECANCELLED) { fprintf(stderr, "deltafin setup: verification interrupted; nothing was changed\n"); return 130; }
            if (rc0 > 0) {
                repairing = 1;
                /* the packs go back where they were (--expert-dirs of the first install) unless told otherwise */
                if (!expert_dirs) {
                    install_expert_dirs(nat_dir, repair_dirs, sizeof repair_dirs);
                    if (repair_dirs[0]) expert_dirs = repair_dirs;
                }
                fprintf(stderr, "setup: the install in %s is DAMAGED: %s; repairing it: the checkpoint is downloaded again "
                                "(files still on disk in %s are reused) and converted again%s%s\n",
                        dir, dmg.what, dl_dir, expert_dirs ? ", experts into " : "", expert_dirs ? expert_dirs : "");
            } else if (side_fixed) {
                e.bytes = disk_usage(dir);
                if (record_install(reg, &e, no_default, "; it is the default model", tail, sizeof tail, err, sizeof err)) {
                    fprintf(stderr, "deltafin setup: %s\n", err);
                    return 1;
                }
                printf("setup: %s (revision %s) in %s was damaged and is repaired: %s copied again from %s; every checksum "
                       "matches%s\n", h.repo, e.revision, e.model, fixed, dl_dir, tail);
                return 0;
            }
        }
        /* a streamed install: each expert fetched so far is checked; a corrupt one is fetched again */
        if (was_streamed && stream && !download_only) {
            uint64_t n_ok = 0;
            int n_fixed = 0;
            char fixed[600];
            if (verify_streamed_install(nat_dir, &n_ok, &n_fixed, fixed, sizeof fixed, err, sizeof err)) {
                fprintf(stderr, "deltafin setup: the streamed install in %s is damaged and could not be repaired: %s; "
                                "`deltafin doctor --model %s` names each corrupt expert\n",
                        dir, err, df_shell_quote(nat_dir, repair_dirs, sizeof repair_dirs));
                return 1;
            }
            if (n_fixed) {
                e.bytes = disk_usage(dir);
                if (record_install(reg, &e, no_default, "; it is the default model", tail, sizeof tail, err, sizeof err)) {
                    fprintf(stderr, "deltafin setup: %s\n", err);
                    return 1;
                }
                printf("setup: %s (revision %s) in %s was damaged and is repaired: %d corrupt fetched expert%s (%s) fetched again; "
                       "%llu intact ones kept%s\n", h.repo, e.revision, e.model, n_fixed, n_fixed == 1 ? "" : "s", fixed,
                       (unsigned long long)n_ok, tail);
                return 0;
            }
        }
        if (!repairing) {
            e.bytes = disk_usage(dir);
            if (record_install(reg, &e, no_default, "; it is the default model", tail, sizeof tail, err, sizeof err)) {
                fprintf(stderr, "deltafin setup: %s\n", err);
                return 1;
            }
            printf("setup: %s (revision %s) is already installed in %s%s%s\n", h.repo, e.revision, e.model,
                   download_only ? "" : was_streamed ? " (verified: every fetched expert matches its checksum)" : " (verified: every checksum matches)",
                   tail);
            return 0;
        }
    }

    /* 1. config.json first: an architecture deltafin cannot run stops before any large download */
    char *cfg = NULL;
    size_t cfg_len = 0;
    int rc = hub_get_file(&h, "config.json", &cfg, &cfg_len, err, sizeof err);
    if (rc) {
        if (rc == DF_EINVAL && strstr(err, " 404 ")) {
            /* say whether the repo or the revision is missing (the listing does the asking) */
            hub_file *fs0 = NULL;
            int n0 = 0;
            char e2[2048];
            if (hub_list(&h, &fs0, &n0, e2, sizeof e2)) snprintf(err, sizeof err, "%s", e2);
            free(fs0);
        }
        fprintf(stderr, "deltafin setup: %s\n", err);
        return 1;
    }
    char tmpd[] = "/tmp/deltafin-setup-XXXXXX", cpath[64], arch[1024];
    if (!mkdtemp(tmpd)) { fprintf(stderr, "deltafin setup: cannot create a temporary directory: %s\n", strerror(errno)); free(cfg); return 1; }
    snprintf(cpath, sizeof cpath, "%s/config.json", tmpd);
    rc = df_write_file_atomic(cpath, cfg, cfg_len, err, sizeof err);
    if (!rc) rc = df_checkpoint_describe(tmpd, arch, sizeof arch, err, sizeof err);
    unlink(cpath);
    rmdir(tmpd);
    free(cfg);
    if (rc) {
        fprintf(stderr, "deltafin setup: %s cannot be run by deltafin: %s; nothing was downloaded\n", h.repo, err);
        return 1;
    }
    fprintf(stderr, "setup: architecture: %s\n", arch);

    /* 2. listing and selection */
    hub_file *files = NULL;
    int n = 0;
    if ((rc = hub_list(&h, &files, &n, err, sizeof err))) { fprintf(stderr, "deltafin setup: %s\n", err); return 1; }
    char *index = NULL;
    for (int i = 0; i < n; i++)
        if (!strcmp(files[i].name, "model.safetensors.index.json")) {
            if ((rc = hub_get_file(&h, files[i].name, &index, NULL, err, sizeof err))) {
                fprintf(stderr, "deltafin setup: %s\n", err);
                free(files);
                return 1;
            }
        }
    n = hub_select(files, n, index, include_draft);
    free(index);
    uint64_t total = 0, weights = 0;
    int n_shards = 0;
    for (int i = 0; i < n; i++) {
        int is_st = strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json");
        if (files[i].size == 0 || (is_st && !files[i].sha256[0])) {
            hub_file f;
            int hr = hub_head(&h, files[i].name, &f, err, sizeof err);
            if (hr < 0) { fprintf(stderr, "deltafin setup: %s\n", err); free(files); return 1; }
            if (hr == 0) files[i] = f;
        }
        if (is_st) {
            n_shards++;
            weights += files[i].size;
            if (!files[i].sha256[0])
                fprintf(stderr, "setup: warning: the mirror gives no sha256 for %s (no LFS metadata): its bytes are not verified\n",
                        files[i].name);
        }
        total += files[i].size;
    }
    if (n_shards == 0) {
        fprintf(stderr, "deltafin setup: %s@%s on %s lists no .safetensors weights: not a checkpoint deltafin can convert\n",
                h.repo, h.rev, h.mirror);
        free(files);
        return 1;
    }
    fprintf(stderr, "setup: %d files, %.1f MB (%d weight shards, %.1f MB)\n", n, total / 1e6, n_shards, weights / 1e6);

    /* 3. disk space: what is left to download + the native layout (about the weights' size) */
    if ((rc = df_mkdir_p(dl_dir, err, sizeof err))) { fprintf(stderr, "deltafin setup: %s\n", err); free(files); return 1; }
    snprintf(e.dir, sizeof e.dir, "%.1900s", realpath(dir, absd) ? absd : dir);
    snprintf(e.model, sizeof e.model, "%.1900s/native", e.dir);
    uint64_t have = 0;
    for (int i = 0; i < n; i++) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dl_dir, files[i].name);
        if (stat(p, &st) == 0 && (uint64_t)st.st_size == files[i].size) have += files[i].size;
        else {
            snprintf(p, sizeof p, "%s/%s.partial", dl_dir, files[i].name);
            if (stat(p, &st) == 0 && (uint64_t)st.st_size == files[i].size) have += files[i].size; /* already allocated */
        }
    }
    if (repairing && !keep) {
        /* the first install kept its shards (--keep-download): the repair converts from them and keeps them too */
        int kept_shards = 0;
        for (int i = 0; i < n; i++) {
            char p[4200];
            struct stat st;
            snprintf(p, sizeof p, "%s/%s", dl_dir, files[i].name);
            if (strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json") && stat(p, &st) == 0 &&
                (uint64_t)st.st_size == files[i].size)
                kept_shards++;
        }
        if (kept_shards == n_shards) {
            keep = 1;
            if (!quiet) fprintf(stderr, "setup: the %d shards are still in %s (--keep-download): the repair converts from them and keeps them\n",
                                n_shards, dl_dir);
        }
    }
    struct statvfs vfs;
    if (statvfs(dl_dir, &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize;
        uint64_t need = stream ? 0 : (total - have) + (expert_dirs || download_only ? 0 : weights);
        if (repairing) avail += disk_usage(nat_dir); /* the damaged native files are removed before the conversion */
        if (need > avail) {
            fprintf(stderr, "deltafin setup: not enough disk space in %s: the download needs %.2f GB more and the native layout "
                            "about %.2f GB, %.2f GB are free; free space, or choose --dir (and --expert-dirs for the experts)\n",
                    dir, (total - have) / 1e9, expert_dirs ? 0.0 : weights / 1e9, avail / 1e9);
            free(files);
            return 1;
        }
    }

    /* 4. download (a streamed install being completed: its sparse shards are fetched whole now) */
    if (!stream && was_streamed) {
        /* keep what the streamed install holds (headers, spine, fetched experts): the shards resume from it */
        uint64_t kept_all = 0;
        for (int i = 0; i < n; i++) {
            uint64_t kept = 0;
            if ((rc = stream_seed_full(nat_dir, dl_dir, files[i].name, files[i].size, files[i].sha256, (uint64_t)1 << 20, &kept,
                                       err, sizeof err))) {
                fprintf(stderr, "deltafin setup: %s\n", err);
                free(files);
                return 1;
            }
            kept_all += kept;
        }
        fprintf(stderr, "setup: completing the streamed install in %s: %.1f MB already here are kept\n", dir, kept_all / 1e6);
    }
    uint64_t spine_fetched = 0;
    double ts0 = df_now();
    /* a full install converts first: the shards it removes afterwards never need to reach the disk */
    dl.defer_sync = !stream && !download_only;
    /* when the sync follows the download at once, the drive's writes overlap the transfer */
    dl.writeback = writeback >= 0 ? writeback : !dl.defer_sync;
    if (stream) {
        /* everything but the weight shards whole; of the shards, the headers and the spine tensors */
        int k = 0;
        hub_file *small = calloc((size_t)n, sizeof(hub_file));
        for (int i = 0; small && i < n; i++)
            if (!(strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json"))) small[k++] = files[i];
        rc = small ? hub_download(&h, small, k, dl_dir, &dl, err, sizeof err) : DF_ENOMEM;
        free(small);
        for (int i = 0; i < n && !rc; i++) {
            if (!(strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json"))) continue;
            uint64_t got = 0;
            rc = stream_fetch_spine(&h, dl_dir, files[i].name, files[i].size, files[i].sha256, dl.connections, &got, err, sizeof err);
            spine_fetched += got;
            if (!quiet && !rc) fprintf(stderr, "  %-60s spine %.1f MB of %.1f MB\n", files[i].name, got / 1e6, files[i].size / 1e6);
        }
        dl.bytes_fetched += spine_fetched;
        dl.seconds = df_now() - ts0;
    } else rc = hub_download(&h, files, n, dl_dir, &dl, err, sizeof err);
    if (rc) {
        fprintf(stderr, "deltafin setup: %s\n", err);
        fprintf(stderr, "setup: fetched %llu bytes this run (%llu were already on disk), %d retries\n",
                (unsigned long long)dl.bytes_fetched, (unsigned long long)dl.bytes_present, dl.retries_used);
        free(files);
        return rc == DF_ECANCELLED ? 130 : 1;
    }
    fprintf(stderr, "setup: downloaded %.1f MB in %.2f s (%.1f MB/s), %.1f MB were already on disk, %d retries\n",
            dl.bytes_fetched / 1e6, dl.seconds, dl.seconds > 0 ? dl.bytes_fetched / 1e6 / dl.seconds : 0.0,
            dl.bytes_present / 1e6, dl.retries_used);
    if (dl.rechecked_ok || dl.rechecked_bad)
        fprintf(stderr, "setup: re-checked %d file%s an earlier run verified but did not sync: %d kept, %d downloaded again\n",
                dl.rechecked_ok + dl.rechecked_bad, dl.rechecked_ok + dl.rechecked_bad == 1 ? "" : "s", dl.rechecked_ok,
                dl.rechecked_bad);
    if (dl.synced_bytes) fprintf(stderr, "setup: synced %.1f MB of the download to the disk in %.2f s\n", dl.synced_bytes / 1e6, dl.sync_seconds);

    if (download_only) {
        free(files);
        printf("setup: %s downloaded into %s (--download-only: not converted, not recorded)\n", h.repo, dl_dir);
        return 0;
    }


    /* 5. convert (a directory left by an interrupted conversion is cleared first: it has no manifest.json) */
    if (df_path_exists(nat_dir)) nftw(nat_dir, rm_entry, 32, FTW_DEPTH | FTW_PHYS);
    df_convert_opts co;
    df_convert_opts_default(&co);
    co.expert_dirs = expert_dirs;
    co.threads = threads;
    co.sparse_experts = stream; /* experts not fetched yet stay holes in the packs */
    conv_prog cp = {"convert", df_now(), 0, 0, quiet, 0};
    co.progress = on_progress;
    co.progress_user = &cp;
    rc = df_convert(dl_dir, nat_dir, &co, err, sizeof err);
    if (cp.open) fprintf(stderr, "\n");
    if (rc) {
        fprintf(stderr, "deltafin setup: converting %s: %s\n", dl_dir, err);
        free(files);
        return rc == DF_ECANCELLED ? 130 : 1;
    }
    fprintf(stderr, "setup: converted into %s in %.1f s\n", nat_dir, df_now() - cp.t0);
    if (stream) {
        /* the packs become sparse and every expert remote until fetched */
        cJSON *sj = cJSON_CreateObject(), *sh = cJSON_CreateObject();
        char absck[4096];
        cJSON_AddStringToObject(sj, "repo", h.repo);
        cJSON_AddStringToObject(sj, "revision", h.rev);
        cJSON_AddStringToObject(sj, "mirror", h.mirror);
        cJSON_AddStringToObject(sj, "checkpoint", realpath(dl_dir, absck) ? absck : dl_dir);
        for (int i = 0; i < n; i++)
            if (strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json"))
                cJSON_AddStringToObject(sh, files[i].name, files[i].sha256);
        cJSON_AddItemToObject(sj, "shards", sh);
        cJSON_AddNumberToObject(sj, "disk_budget", (double)disk_budget);
        char *txt = cJSON_Print(sj);
        cJSON_Delete(sj);
        rc = txt ? stream_init_files(nat_dir, txt, err, sizeof err) : DF_ENOMEM;
        free(txt);
        /* the spine now lives in native/spine.bin: the sparse shards keep only headers and fetched experts */
        uint64_t dropped = 0;
        for (int i = 0; i < n && !rc; i++)
            if (strstr(files[i].name, ".safetensors") && !strstr(files[i].name, ".index.json")) {
                uint64_t d = 0;
                rc = stream_drop_spine(dl_dir, files[i].name, &d, err, sizeof err);
                dropped += d;
            }
        if (rc) { fprintf(stderr, "deltafin setup: %s\n", err); free(files); return 1; }
        if (!quiet) fprintf(stderr, "setup: %.1f MB of spine dropped from the sparse checkpoint (kept in %s/spine.bin)\n", dropped / 1e6, nat_dir);
        keep = 1; /* the sparse shards are where fetched experts land */
    }
    /* the shards go unsynced (the native layout holds their bytes durably); what stays is synced */
    for (int i = 0; i < n && !keep && !rc; i++) {
        const char *nm = files[i].name;
        if (strstr(nm, ".safetensors") && !strstr(nm, ".index.json")) rc = hub_remove_download(dl_dir, nm, err, sizeof err);
    }
    uint64_t synced = 0;
    double sync_s = 0;
    if (!rc) rc = hub_sync_verified(files, n, dl_dir, &synced, &sync_s, err, sizeof err);
    free(files);
    if (rc) { fprintf(stderr, "deltafin setup: %s\n", err); return 1; }
    if (synced) fprintf(stderr, "setup: synced %.1f MB of the download to the disk in %.2f s\n", synced / 1e6, sync_s);

    /* 6. record */
    e.bytes = disk_usage(dir);
    e.installed = (double)time(NULL);
    if (record_install(reg, &e, no_default, repairing ? "; it is the default model" : "; it is now the default model (run / serve without --model)",
                       tail, sizeof tail, err, sizeof err)) {
        fprintf(stderr, "deltafin setup: %s\n", err);
        return 1;
    }
    if (repairing) {
        printf("setup: %s repaired (full, %.1f MB on disk) in %s: rebuilt %s by converting the checkpoint again "
               "(%.1f MB downloaded, %.1f MB reused from the disk)%s\n", h.repo, e.bytes / 1e6, e.model, dmg.what,
               dl.bytes_fetched / 1e6, dl.bytes_present / 1e6, tail);
        return 0;
    }
    printf("setup: %s installed (%s, %.1f MB on disk) in %s%s\n", h.repo, stream ? "stream" : "full", e.bytes / 1e6, e.model,
           tail);
    return 0;
}
