/*
 * cmd_bench.c — `deltafin bench io` and `deltafin bench decode`.
 *
 * bench io: O_DIRECT random-read bandwidth of one or more directories at the
 *   engine's read size and queue depth (src/store/store_bench.c).
 * bench decode: cold-cache greedy decode of a model under --ram-budget through
 *   the public API, printing tok/s, expert bytes per token, hit rate, and the
 *   ratio of achieved speed to the storage bound B / ((1-h) * bytes_per_token),
 *   with B measured by bench io on the model's pack directories in the same run.
 *   The page cache is dropped first when running as root.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "hub/stream.h"
#include "bench_common.h"
#include "deltafin.h"
#include "model/convert.h"
#include "model/native.h"
#include "util/util.h"
#include "store/store.h"
#include "store/store_bench.h"
#include <errno.h>
#include <limits.h>
#include <libgen.h>
#include <math.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* a whole decimal integer in [lo, hi], else a usage message naming the command and flag, -1 */
static int want_int(const char *cmd, const char *flag, const char *s, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "deltafin bench %s: %s \"%s\": expected an integer in [%ld, %ld]\n", cmd, flag, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* a finite number in (lo, hi] when lo_open, else [lo, hi]; else a usage message, -1 */
static int want_num(const char *cmd, const char *flag, const char *s, double lo, double hi, int lo_open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
        fprintf(stderr, "deltafin bench %s: %s \"%s\": expected a number in %c%g, %g]\n", cmd, flag, s, lo_open ? '(' : '[', lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

/* a size > 0 (cli_parse_size), else a usage message, -1 */
static int want_size(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    uint64_t v = 0;
    if (cli_parse_size(s, &v) || !v) {
        fprintf(stderr, "deltafin bench %s: %s \"%s\": expected a size like 1M or 64K (more than 0)\n", cmd, flag, s);
        return -1;
    }
    *out = v;
    return 0;
}

#define BENCH_MAX_QD 1024       /* reads in flight per directory (each holds one read buffer) */
#define BENCH_MAX_SECONDS 86400.0

int bench_check_native(const char *cmd, const char *model) {
    char what[64];
    snprintf(what, sizeof what, "bench %s", cmd);
    if (cli_check_model_dir(what, model)) return 1;
    if (cli_is_file(model, "manifest.json")) return 0;
    if (cli_is_file(model, "config.json")) {
        fprintf(stderr, "deltafin bench %s: %s is a Hugging Face checkpoint; bench measures a native model's pack files: "
                        "run `deltafin convert %s OUT` first and pass --model OUT\n", cmd, model, model);
        return 2;
    }
    fprintf(stderr, "deltafin bench %s: %s: neither manifest.json (native model) nor config.json (Hugging Face checkpoint) "
                    "found\n", cmd, model);
    return 1;
}

int bench_native_model(const char *cmd, const char **model, const char *cache_dir, char *conv, size_t cap, char *how,
                       size_t howcap) {
    char what[64], err[2048] = "";
    snprintf(what, sizeof what, "bench %s", cmd);
    if (cli_check_model_dir(what, *model)) return 1;
    /* the installed default (no --model): checked as `deltafin list` does before it is measured; damaged, the setup
     * command that repairs it is named (as run and serve name it) */
    if (how && !strncmp(how, "installed ", 10) && cli_default_model_repair(what, how, 0)) return 1;
    if (cli_is_file(*model, "manifest.json")) return 0;
    if (!cli_is_file(*model, "config.json")) return bench_check_native(cmd, *model);
    df_model_opts co;
    df_model_opts_default(&co);
    if (cache_dir) co.cache_dir = cache_dir;
    /* a first-use conversion shows its progress on stderr, in run's format */
    if (convert_cached(*model, co.cache_dir, co.spine, cli_convert_progress, NULL, conv, cap, err, sizeof err)) {
        cli_convert_progress_end();
        fprintf(stderr, "deltafin bench %s: %s: %s\n", cmd, *model, err);
        return 1;
    }
    if (how) {
        size_t n = strlen(how);
        snprintf(how + n, howcap - n, "%s%s converted into the conversion cache (%s)", n ? ", " : "", *model, conv);
    }
    *model = conv;
    return 0;
}

/* Evict the regular files of one directory (not recursive) from the page cache: each written back
 * (fdatasync) and then dropped (POSIX_FADV_DONTNEED). Returns the files evicted, -1 when dir cannot be read. */
static int evict_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) continue;
        fdatasync(fd);
        if (posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0) n++;
        close(fd);
    }
    closedir(d);
    return n;
}

int bench_drop_caches(const char *model, const char *pack_dirs) {
    int ok = model ? evict_dir(model) >= 0 : 1;
    char list[8192];
    snprintf(list, sizeof list, "%s", pack_dirs ? pack_dirs : "");
    for (char *save = NULL, *d = strtok_r(list, ",", &save); d; d = strtok_r(NULL, ",", &save))
        if (!model || strcmp(d, model)) ok &= evict_dir(d) >= 0;
    return ok;
}

void bench_pack_dirs(const df_native *nat, char *dirs, size_t cap) {
    const native_expert_layer *L = &nat->moe_layers[0];
    size_t off = 0;
    dirs[0] = 0;
    for (int k = 0; k < L->n_files && off < cap; k++) {
        char tmp[2048];
        snprintf(tmp, sizeof tmp, "%s", L->files[k]);
        off += (size_t)snprintf(dirs + off, cap - off, "%s%s", k ? "," : "", dirname(tmp));
    }
}

void bench_expert_io_opts(store_bench_opts *bo, const char *dirs, int qd, uint64_t stride, int top_k, double seconds) {
    store_bench_opts_default(bo);
    bo->dirs = dirs;
    bo->qd = qd;
    bo->run_bytes = stride;
    bo->group = top_k;
    bo->seconds = seconds;
    bo->match = "experts-L*.pack"; /* the packs only: a model directory also holds spine.bin */
}

int bench_check_io_buffer(const char *cmd, uint64_t io_buffer, int qd) {
    if (!io_buffer || io_buffer > (uint64_t)qd << 20) return 0;
    fprintf(stderr, "deltafin bench %s: --io-buffer %.0f KiB: a pool must be larger than --qd x 1 MiB reads (%d MiB here), "
            "which are the reused buffers of the default B\n", cmd, io_buffer / 1024.0, qd);
    return 2;
}

int bench_open_event(const char *line, bench_open_ev *o) {
    if (!strstr(line, "\"ev\":\"open\"")) return 0;
    memset(o, 0, sizeof *o);
    const char *a = strstr(line, "\"model\":\""), *b = a ? strstr(a + 9, "\",\"slots\":") : NULL;
    if (a && b) snprintf(o->model, sizeof o->model, "%.*s", (int)(b - (a + 9)), a + 9);
    const char *sb = strstr(line, "\"slot_bytes\":"), *dr = strstr(line, "\"drives\":");
    if (sb) o->slot_bytes = strtoull(sb + 13, NULL, 10);
    if (dr) o->drives = atoi(dr + 9);
    return 1;
}

int bench_open_matches(const bench_open_ev *o, const df_native *nat) {
    if (!o->slot_bytes || nat->n_moe_layers == 0 || o->slot_bytes == store_slot_bytes(nat)) return 1;
    /* the same experts laid out over other stripes: each stripe is rounded up to whole 4 KiB pages */
    int n = o->drives > 1 ? o->drives : 1;
    for (int i = 0; i < nat->n_moe_layers; i++)
        if (nat->moe_layers[i].n_files > n) n = nat->moe_layers[i].n_files;
    return o->slot_bytes >= nat->stride && o->slot_bytes < nat->stride + 4096ull * (uint64_t)n;
}

/* "NAME", N MoE layers x E experts, expert slots of B bytes */
static void model_shape(char *out, size_t cap, const df_native *nat) {
    snprintf(out, cap, "\"%s\", %d layers, %d MoE x %d experts, expert slots of %llu bytes", nat->name,
             nat->cfg.num_hidden_layers, nat->n_moe_layers, nat->n_experts, (unsigned long long)store_slot_bytes(nat));
}

void bench_trace_foreign(const char *cmd, const char *flag, const char *path, const bench_open_ev *o, const df_native *nat,
                         const char *model_arg, const char *why) {
    char shape[512], q[8300];
    model_shape(shape, sizeof shape, nat);
    fprintf(stderr, "deltafin bench %s: %s %s was recorded on another model: \"%s\" (expert slots of %llu bytes%s%s), not "
                    "on --model %s (%s): record a trace with this model (`deltafin %s --model %s --events FILE`) or pass "
                    "--model the model the trace was recorded on\n",
            cmd, flag, path, o->model, (unsigned long long)o->slot_bytes, why ? "; " : "", why ? why : "", model_arg, shape,
            strcmp(cmd, "project") ? "run" : "bench decode", df_shell_quote(model_arg, q, sizeof q));
}

int bench_trace_verdict(const char *cmd, const char *flag, const char *path, const bench_open_ev *opens, int n,
                        const char *why, const df_native *nat, const char *model_arg) {
    const bench_open_ev *foreign = NULL;
    for (int i = 0; i < n && !foreign; i++) /* an expert slot of another size */
        if (!bench_open_matches(&opens[i], nat)) foreign = &opens[i];
    if (!foreign && why) { /* experts the model does not have: name the run of another name, if one is */
        for (int i = 0; i < n && !foreign; i++)
            if (strcmp(opens[i].model, nat->name)) foreign = &opens[i];
        if (!foreign) foreign = &opens[0];
    }
    if (foreign) {
        bench_trace_foreign(cmd, flag, path, foreign, nat, model_arg, why);
        return 1;
    }
    /* the same expert shapes: only the name differs (a folder of another name, a converted copy): said once a name */
    for (int i = 0; i < n; i++) {
        int said = !opens[i].model[0] || !strcmp(opens[i].model, nat->name);
        for (int j = 0; j < i && !said; j++) said = !strcmp(opens[j].model, opens[i].model);
        if (!said)
            fprintf(stderr, "deltafin bench %s: note: %s %s was recorded on \"%s\", --model is \"%s\": the same expert shapes, "
                            "taken as the same model\n", cmd, flag, path, opens[i].model, nat->name);
    }
    return 0;
}

void bench_trace_unchecked(const char *cmd, const char *flag, const char *path, const df_native *nat) {
    fprintf(stderr, "deltafin bench %s: warning: %s %s has no \"open\" event (an events file of an older deltafin): cannot "
                    "check that it was recorded on this model (\"%s\")\n", cmd, flag, path, nat->name);
}

static long vm_hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return -1;
    char line[256];
    long kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    fclose(f);
    return kb;
}

static void print_io(const store_bench_opts *o, const store_bench_result *r) {
    printf("bench io: %s, %s, read %llu KiB, run %llu KiB%s%.0d, qd %d per dir, %.1f s: %.3f GB/s",
           r->io_engine, r->direct ? "O_DIRECT" : "buffered (O_DIRECT unavailable)",
           (unsigned long long)(o->io_bytes >> 10), (unsigned long long)((o->run_bytes ? o->run_bytes : o->io_bytes) >> 10),
           o->group > 1 ? " x group " : "", o->group > 1 ? o->group : 0, o->qd, r->seconds, r->gbps);
    if (o->buffer_bytes > (uint64_t)o->qd * o->io_bytes)
        printf(" into %.0f MiB of buffers", o->buffer_bytes / 1048576.0);
    if (r->fixed_buf) printf(" (registered buffers)");
    if (o->cpu_load > 0) printf(" with %d thread%s computing", o->cpu_load, o->cpu_load > 1 ? "s" : "");
    if (r->n_sparse) printf(" (%d sparse or preallocated file%s skipped)", r->n_sparse, r->n_sparse > 1 ? "s" : "");
    if (r->n_dirs > 1) {
        printf(" (");
        for (int i = 0; i < r->n_dirs; i++) printf("%s%.3f", i ? ", " : "", r->dir_gbps[i]);
        printf(" per dir)");
    }
    printf("\n");
    if (r->n_dirs > 1) {
        /* stripe k's size proportional to drive k's GB/s gives every drive the same expected
         * completion time (bytes_k / GB/s_k), so one expert read waits for no slow drive */
        double mx = 0;
        for (int i = 0; i < r->n_dirs; i++)
            if (r->dir_gbps[i] > mx) mx = r->dir_gbps[i];
        if (mx > 0) {
            int ok = 1;
            for (int i = 0; i < r->n_dirs; i++) ok &= r->dir_gbps[i] > 0;
            if (ok) {
                printf("suggested: --stripe-weights ");
                for (int i = 0; i < r->n_dirs; i++) printf("%s%.2f", i ? "," : "", r->dir_gbps[i] / mx < 0.01 ? 0.01 : r->dir_gbps[i] / mx);
                printf("  (GB/s per dir, normalised to the fastest; for convert/synth --expert-dirs in this order)\n");
            } else {
                printf("suggested: no --stripe-weights (a directory read nothing; measure again)\n");
            }
        }
    }
}

static int bench_io(int argc, char **argv) {
    store_bench_opts o;
    store_bench_opts_default(&o);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin bench io --dir DIR[,DIR2...] [--size 1M] [--run SIZE] [--qd 16 (1..1024)] [--seconds 10] "
                   "[--group K (0..64)] [--buffer SIZE] [--pread] [--fixed] [--cpu-load N] [--no-drop]\n"
                   "  O_DIRECT random reads over the files in each DIR (one queue per DIR); files with holes or\n"
                   "  preallocated (unwritten) extents are skipped: their reads would not reach the drive.\n"
                   "  --run SIZE: bytes read back to back per random offset (the expert extent), default --size.\n"
                   "  --group K: runs in groups of K extents of one file, ascending (a layer's top-k experts).\n"
                   "  --buffer SIZE: reads land in turn in a pool of SIZE per DIR (as the expert cache fills), not in\n"
                   "  qd reused buffers (fio's way, the default); some virtual disks are much slower into gigabytes.\n"
                   "  --fixed: the destination (reused buffers or the pool) registered with the io_uring (no page pinning\n"
                   "  per read, as fio's fixedbufs); by default plain reads, as the expert store and fio read.\n"
                   "  --cpu-load N: N threads compute (in registers) while the reads run: the drive's speed while the\n"
                   "  cores are busy, as during a decode; on some virtual machines the host's disk emulation shares them.\n"
                   "  The DIRs' files are evicted from the page cache first (--no-drop: kept).\n");
            return 0;
        }
        if (!strcmp(a, "--pread")) { o.use_uring = 0; continue; }
        if (!strcmp(a, "--fixed")) { o.fixed = 1; continue; }
        if (!strcmp(a, "--no-drop")) continue;
        static const char *const vals[] = {"--dir", "--size", "--run", "--group", "--qd", "--seconds", "--buffer", "--cpu-load", NULL};
        static const char *const flags[] = {"--help", "--pread", "--fixed", "--no-drop", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench io", a, vals, flags);
        if (!v) { fprintf(stderr, "deltafin bench io: %s needs a value\n", a); return 2; }
        if (cli_repeated_at("bench io", argc, argv, i, vals, NULL)) return 2;
        if (!strcmp(a, "--dir")) o.dirs = v;
        else if (!strcmp(a, "--size")) { if (want_size("io", a, v, &o.io_bytes)) return 2; }
        else if (!strcmp(a, "--run")) { if (want_size("io", a, v, &o.run_bytes)) return 2; }
        else if (!strcmp(a, "--buffer")) { if (want_size("io", a, v, &o.buffer_bytes)) return 2; }
        else if (!strcmp(a, "--group")) { if (want_int("io", a, v, 0, 64, &o.group)) return 2; }
        else if (!strcmp(a, "--qd")) { if (want_int("io", a, v, 1, BENCH_MAX_QD, &o.qd)) return 2; }
        else if (!strcmp(a, "--cpu-load")) { if (want_int("io", a, v, 0, 256, &o.cpu_load)) return 2; }
        else if (!strcmp(a, "--seconds")) { if (want_num("io", a, v, 0, BENCH_MAX_SECONDS, 1, &o.seconds)) return 2; }
        i++;
    }
    /* what store_bench_io needs, said here with the flag and the value at fault */
    if (!o.dirs) {
        fprintf(stderr, "deltafin bench io: --dir DIR is required: the directory (or comma-separated directories, one per drive) "
                        "whose files are read, e.g. a model directory from `deltafin convert` or `deltafin synth DIR`\n");
        return 2;
    }
    if (o.io_bytes % 4096) {
        fprintf(stderr, "deltafin bench io: --size %llu bytes: O_DIRECT reads must be a multiple of 4096 bytes; use e.g. 4K, "
                        "64K or 1M (the default)\n", (unsigned long long)o.io_bytes);
        return 2;
    }
    if (cli_list_has_empty(o.dirs)) {
        fprintf(stderr, "deltafin bench io: --dir \"%s\": an empty directory name in the list; separate directories with one "
                        "comma (D1,D2)\n", o.dirs);
        return 2;
    }
    {
        int nd = 0;
        for (const char *p = o.dirs;; p++) {
            const char *e = strchr(p, ',');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            char d[4096];
            snprintf(d, sizeof d, "%.*s", (int)len, p);
            /* a directory that is not there, not a directory, or holds no file at all: a usage error (exit 2, as
             * the other --dir and option errors of bench), naming the directory and where files to read come from */
            struct stat sb;
            const int missing = stat(d, &sb) != 0;
            const char *why = missing ? (errno == ENOENT ? "no such directory" : strerror(errno))
                              : !S_ISDIR(sb.st_mode) ? "not a directory" : NULL;
            int nonempty = 0; /* synth writes only into a new or empty directory */
            if (!why) {
                DIR *dp = opendir(d);
                int entries = 0, files = 0;
                struct dirent *de;
                while (dp && (de = readdir(dp))) {
                    if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
                    entries++;
                    char fp[8300];
                    struct stat fs;
                    snprintf(fp, sizeof fp, "%s/%s", d, de->d_name);
                    files += stat(fp, &fs) == 0 && S_ISREG(fs.st_mode);
                }
                if (dp) closedir(dp);
                if (dp && !files) why = entries ? "the directory holds no file to read (only directories or other entries)"
                                                : "the directory is empty, nothing to read";
                nonempty = entries > 0;
            }
            if (why) {
                char qd[8300], synth[8400] = ""; /* the suggested command is pasted into a shell: the directory quoted */
                if ((missing || S_ISDIR(sb.st_mode)) && !nonempty)
                    snprintf(synth, sizeof synth, " (write one with `deltafin synth %s ...`)", df_shell_quote(d, qd, sizeof qd));
                else if (nonempty) { /* synth refuses a non-empty directory: a new one inside it */
                    char sub[4200];
                    snprintf(sub, sizeof sub, "%s/synth", d);
                    snprintf(synth, sizeof synth, " (write one with `deltafin synth %s ...` and give --dir that directory)",
                             df_shell_quote(sub, qd, sizeof qd));
                }
                fprintf(stderr, "deltafin bench io: --dir %s: %s; give --dir a directory of files to read, such as a model "
                                "directory written by `deltafin convert` or `deltafin synth`%s\n", d, why, synth);
                return 2;
            }
            nd++;
            if (!e) break;
            p = e;
        }
        if (nd > 16) {
            fprintf(stderr, "deltafin bench io: --dir: %d directories; at most 16 are measured together\n", nd);
            return 2;
        }
    }
    if (o.buffer_bytes && o.buffer_bytes <= (uint64_t)o.qd * o.io_bytes) {
        fprintf(stderr, "deltafin bench io: --buffer %.0f KiB: a pool must be larger than --qd x --size (%.0f KiB here), which "
                "are the reused buffers measured without --buffer\n", o.buffer_bytes / 1024.0, (double)o.qd * o.io_bytes / 1024.0);
        return 2;
    }
    int nodrop = 0;
    for (int i = 0; i < argc; i++) nodrop |= !strcmp(argv[i], "--no-drop");
    if (!nodrop) bench_drop_caches(NULL, o.dirs);
    store_bench_result r;
    char err[1024];
    int rc = store_bench_io(&o, &r, err, sizeof err);
    if (rc) {
        fprintf(stderr, "deltafin bench io: %s\n", err);
        return rc == DF_EINVAL ? 2 : 1;
    }
    print_io(&o, &r);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The store's expert stall over the decode steps (token events one position after the previous one) of the last run
 * recorded in an events file (after its last open event), in seconds. */
static double decode_expert_stall(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char *line = NULL;
    size_t cap = 0;
    double stall = 0;
    long long prev = -2;
    while (getline(&line, &cap, f) > 0) {
        if (strstr(line, "\"ev\":\"open\"")) { stall = 0; prev = -2; continue; }
        if (!strstr(line, "\"ev\":\"token\"")) continue;
        const char *p = strstr(line, "\"pos\":"), *sm = strstr(line, "\"stall_ms\":");
        if (!p) continue;
        long long pos = atoll(p + 6);
        if (pos == prev + 1 && sm) stall += atof(sm + 11) / 1e3;
        prev = pos;
    }
    free(line);
    fclose(f);
    return stall;
}

static int bench_decode(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL, *events = NULL, *expert_dirs = NULL, *prompt_ids = "1,2,3,4,5,6,7,8";
    const char *backend = cli_default_backend();
    uint64_t budget = 0, gpu_budget = 0, io_buffer = 0;
    int tokens = 16, warmup = 0, threads = 0, qd = 16, nodrop = 0, prefetch = 0, prefault = 0, preload = 0, io_cpu = 0;
    double io_seconds = 5;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin bench decode [--model DIR] [--ram-budget SIZE] [--tokens N (16)] [--warmup N (0)] [--threads N]\n"
                   "       [--prompt-ids 1,2,3] [--io-seconds S (5)] [--qd N] [--io-buffer SIZE] [--events FILE] [--expert-dirs D1,D2] "
                   "[--no-drop]\n"
                   "       [--backend auto|cpu|cpu-scalar|cpu-avx2|cpu-avx512|cuda] [--gpu-budget SIZE] [--prefetch auto|on|off|ungated] [--prefault auto|on|off]\n"
                   "       [--preload] [--cache-dir DIR]\n"
                   "  Cold-cache greedy decode; prints tok/s, bytes/token, hit rate and the storage-bound ratio.\n"
                   "  Cold: the model's files (its directory and pack directories) are evicted from the page cache\n"
                   "  before the model opens and after the I/O benchmark (other files stay cached); --no-drop keeps them.\n"
                   "  --warmup N: N decode tokens before the measured ones (not counted), e.g. to fill the caches\n"
                   "  and measure a model held in memory.\n"
                   "  --prefetch / --prefault / --preload: as in `deltafin run` (DF_PREFETCH / DF_PREFAULT when auto);\n"
                   "  --preload reads every routed expert into memory before the prompt (untimed): a model held in memory.\n"
                   "  --qd N: expert reads in flight per drive, for the store (as `run --io-depth`) and the I/O benchmark (16).\n"
                   "  --io-buffer SIZE: also measure B with the reads landing in a pool of SIZE (e.g. the budget), as\n"
                   "  the expert cache fills, and print the bound for that B too (see `bench io --buffer`).\n"
                   "  --io-cpu-load N: also measure B with N threads computing beside the reads (the decode's own\n"
                   "  threads, typically), and print the bound for that B too (see `bench io --cpu-load`).\n"
                   "  --model DIR: a native model, or a Hugging Face checkpoint converted once into the conversion cache\n"
                   "  as `run` does. Default: the model `deltafin setup` installed, else the embedded models/kimi-mini.\n"
                   "  --cache-dir DIR: where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n");
            return 0;
        }
        if (!strcmp(a, "--no-drop")) { nodrop = 1; continue; }
        if (!strcmp(a, "--preload")) { preload = 1; continue; }
        static const char *const vals[] = {"--model", "--ram-budget", "--tokens", "--warmup", "--threads", "--prompt-ids", "--io-seconds",
                                           "--qd", "--events", "--expert-dirs", "--backend", "--gpu-budget", "--prefetch",
                                           "--prefault", "--io-buffer", "--io-cpu-load", "--cache-dir", NULL};
        static const char *const flags[] = {"--help", "--no-drop", "--preload", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench decode", a, vals, flags);
        if (!v) { fprintf(stderr, "deltafin bench decode: %s needs a value\n", a); return 2; }
        if (cli_repeated_at("bench decode", argc, argv, i, vals, NULL)) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench decode", v)) return 2; cache_dir = v; }
        else if (!strcmp(a, "--ram-budget")) { /* 0 = no budget, as leaving the flag out */
            if (cli_parse_budget("bench decode", a, v, &budget)) return 2;
        }
        else if (!strcmp(a, "--tokens")) { if (want_int("decode", a, v, 1, 1 << 20, &tokens)) return 2; }
        else if (!strcmp(a, "--warmup")) { if (want_int("decode", a, v, 0, 1 << 20, &warmup)) return 2; }
        else if (!strcmp(a, "--threads")) { if (want_int("decode", a, v, 0, 4096, &threads)) return 2; }
        else if (!strcmp(a, "--prompt-ids")) prompt_ids = v;
        else if (!strcmp(a, "--io-seconds")) { if (want_num("decode", a, v, 0, BENCH_MAX_SECONDS, 1, &io_seconds)) return 2; }
        else if (!strcmp(a, "--qd")) { if (want_int("decode", a, v, 1, BENCH_MAX_QD, &qd)) return 2; }
        else if (!strcmp(a, "--events")) events = v;
        else if (!strcmp(a, "--expert-dirs")) expert_dirs = v;
        else if (!strcmp(a, "--backend")) { if (cli_check_backend("bench decode", v)) return 2; backend = v; }
        else if (!strcmp(a, "--gpu-budget")) { if (want_size("decode", a, v, &gpu_budget)) return 2; }
        else if (!strcmp(a, "--prefetch")) { if (cli_parse_mode("bench decode", a, v, &prefetch)) return 2; }
        else if (!strcmp(a, "--prefault")) { if (cli_parse_mode("bench decode", a, v, &prefault)) return 2; }
        else if (!strcmp(a, "--io-buffer")) { if (want_size("decode", a, v, &io_buffer)) return 2; }
        else if (!strcmp(a, "--io-cpu-load")) { if (want_int("decode", a, v, 0, 256, &io_cpu)) return 2; }
        i++;
    }
    if (bench_check_io_buffer("decode", io_buffer, qd)) return 2;
    if (cli_check_env_aliases("bench decode", backend, prefetch, prefault)) return 2;
    char dflt_dir[4096], dflt_how[4600] = "", conv_dir[4096], err[2048] = "";
    if (!model) {
        if (cli_default_model("bench decode", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    /* a Hugging Face checkpoint (the embedded kimi-mini, or --model): converted once into the conversion cache,
     * as `run` does, and measured there */
    char conv_how[4600] = "";
    int crc = bench_native_model("decode", &model, cache_dir, conv_dir, sizeof conv_dir, dflt_how[0] ? dflt_how : conv_how,
                                 dflt_how[0] ? sizeof dflt_how : sizeof conv_how);
    if (crc) return crc;
    int32_t ids[256];
    int n_ids = 0;
    for (const char *p = prompt_ids;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || *p == '-' || *p == '+' || *p == ' ' || errno || v > INT32_MAX || n_ids == 256 || (*end && *end != ',')) {
            fprintf(stderr, "deltafin bench decode: --prompt-ids \"%s\": expected 1 to 256 comma-separated token ids\n", prompt_ids);
            return 2;
        }
        ids[n_ids++] = (int32_t)v;
        if (!*end) break;
        p = end + 1;
    }
    /* the model's expert geometry and pack directories */
    df_native *nat = NULL;
    int rc = bench_check_native("decode", model);
    if (rc) return rc;
    rc = native_open(&nat, model, err, sizeof err);
    if (rc) { cli_model_open_error("bench decode", model, dflt_how, err, rc); return 1; }
    if (nat->n_moe_layers == 0) { fprintf(stderr, "deltafin bench decode: %s has no routed experts\n", model); native_close(nat); return 1; }
    uint64_t stride = nat->stride;
    int top_k = nat->cfg.num_experts_per_tok, n_moe = nat->n_moe_layers;
    char dirs[4096] = "";
    if (expert_dirs) snprintf(dirs, sizeof dirs, "%s", expert_dirs);
    else bench_pack_dirs(nat, dirs, sizeof dirs);
    native_close(nat);
    int dropped = nodrop ? 0 : bench_drop_caches(model, dirs);
    /* open the model first (cold): a --ram-budget it cannot run under fails before the I/O benchmark */
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.ram_budget = budget;
    mo.threads = threads;
    mo.events_path = events;
    mo.expert_dirs = expert_dirs;
    mo.backend = backend;
    mo.gpu_budget = gpu_budget;
    mo.prefetch = prefetch;
    mo.prefault = prefault;
    mo.io_depth = qd; /* the store reads at the depth B is measured at */
    mo.kv_positions = n_ids + warmup + tokens + 1; /* reserve the KV cache this run needs, not the whole context */
    stream_src *remote = NULL; /* a streamed install: experts not yet local are fetched on first use */
    if (stream_is_streamed(model)) {
        if (stream_open(&remote, model, 0, err, sizeof err)) { fprintf(stderr, "deltafin bench decode: %s\n", err); return 1; }
        mo.remote_source = stream_remote(remote);
    }
    df_model *m = NULL;
    double t_open = now_s();
    rc = df_model_open(&m, model, &mo, err, sizeof err);
    if (rc) {
        cli_model_open_error("bench decode", model, dflt_how, err, rc); /* a setup install: the command that repairs it */
        return 1;
    }
    double open_s = now_s() - t_open;
    int n_vocab = df_model_n_vocab(m);
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= n_vocab) {
            fprintf(stderr, "deltafin bench decode: prompt id %d is outside the vocabulary (%d tokens)\n", ids[i], n_vocab);
            df_model_close(m);
            return 2;
        }
    char bstr[32] = "unlimited";
    if (budget) snprintf(bstr, sizeof bstr, "%.3f GiB", budget / 1073741824.0);
    printf("bench decode: %s, ram budget %s, %d tokens (after %d warm-up tokens), page cache %s%s\n", model, bstr, tokens, warmup,
           dropped ? "evicted (the model's files)" : (nodrop ? "kept (--no-drop)" : "NOT evicted (a directory could not be read): numbers may be warm"),
           preload ? "; experts preloaded (--preload): a model held in memory, not a cold one" : "");
    /* the resolved configuration: one line on stderr, as run and serve echo it; the results stay on stdout */
    fflush(stdout); /* in a 2>&1 log the line follows the header above */
    fprintf(stderr, "%s%s%s%s%s\n", df_model_describe(m), dflt_how[0] ? "; model (no --model): " : "", dflt_how,
            conv_how[0] ? "; model: " : "", conv_how);
    printf("  open %.1f s\n", open_s);
    if (preload) { /* untimed: the model held in memory before the prompt */
        fflush(stdout);
        if (cli_preload("bench decode", m, 0)) { df_model_close(m); return 1; }
    }
    /* B: drive bandwidth at the engine's read size, queue depth and extent */
    store_bench_opts bo;
    bench_expert_io_opts(&bo, dirs, qd, stride, top_k, io_seconds);
    store_bench_result br;
    rc = store_bench_io(&bo, &br, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench decode: I/O benchmark: %s\n", err); df_model_close(m); return 1; }
    printf("  ");
    print_io(&bo, &br);
    /* B into a pool of --io-buffer (the drive as the expert cache sees it) */
    store_bench_opts bp = bo;
    bp.buffer_bytes = io_buffer;
    store_bench_result bpr = {0};
    if (io_buffer) {
        if (!nodrop) bench_drop_caches(model, dirs);
        rc = store_bench_io(&bp, &bpr, err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin bench decode: I/O benchmark (--io-buffer): %s\n", err); df_model_close(m); return 1; }
        printf("  ");
        print_io(&bp, &bpr);
    }
    /* B with the cores busy (the drive as an overlapped decode sees it on a machine whose I/O shares the cores) */
    store_bench_opts bc = bo;
    bc.cpu_load = io_cpu;
    store_bench_result bcr = {0};
    if (io_cpu) {
        if (!nodrop) bench_drop_caches(model, dirs);
        rc = store_bench_io(&bc, &bcr, err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin bench decode: I/O benchmark (--io-cpu-load): %s\n", err); df_model_close(m); return 1; }
        printf("  ");
        print_io(&bc, &bcr);
    }
    if (!nodrop) bench_drop_caches(model, dirs);

    df_session *s = NULL;
    rc = df_session_new(&s, m, 0, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench decode: %s\n", err); df_model_close(m); return 1; }
    float *logits = malloc(sizeof(float) * (size_t)n_vocab);
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    so.temperature = 0;
    df_sampler *smp = df_sampler_new(&so);
    rc = df_eval(s, ids, n_ids, logits, 0, NULL, NULL, err, sizeof err);
    int32_t tok = rc ? 0 : df_sample(smp, logits, n_vocab);
    df_stats st0; /* the prompt's eval (prefill), before the reset */
    df_model_stats(m, &st0);
    int steps = 0; /* decode steps run (warm-up ones included): the token events one position apart */
    for (int t = 0; t < warmup && !rc; t++) { /* not measured */
        rc = df_eval(s, &tok, 1, logits, 0, NULL, NULL, err, sizeof err);
        if (!rc) tok = df_sample(smp, logits, n_vocab), steps++;
    }
    df_stats stw; /* after the warm-up steps: their I/O wait and streamed spine bytes, for the spine_stream event */
    df_model_stats(m, &stw);
    df_model_stats_reset(m);
    printf("  decoded token ids:");
    fflush(stdout);
    for (int t = 0; t < tokens && !rc; t++) {
        rc = df_eval(s, &tok, 1, logits, 0, NULL, NULL, err, sizeof err);
        if (rc) break;
        tok = df_sample(smp, logits, n_vocab);
        steps++;
        printf(" %d", tok);
        fflush(stdout);
    }
    printf("\n");
    fflush(stdout); /* the line ends before any later message on stderr */
    if (rc) fprintf(stderr, "deltafin bench decode: %s\n", err);
    df_stats st;
    df_model_stats(m, &st);
    /* B again after the decode (shared disks are noisy): the bound uses the mean */
    store_bench_result br2;
    if (store_bench_io(&bo, &br2, err, sizeof err) == 0) {
        printf("  after: ");
        print_io(&bo, &br2);
        br.gbps = (br.gbps + br2.gbps) / 2;
    }
    if (io_buffer && store_bench_io(&bp, &br2, err, sizeof err) == 0) {
        printf("  after: ");
        print_io(&bp, &br2);
        bpr.gbps = (bpr.gbps + br2.gbps) / 2;
    }
    if (io_cpu && store_bench_io(&bc, &br2, err, sizeof err) == 0) {
        printf("  after: ");
        print_io(&bc, &br2);
        bcr.gbps = (bcr.gbps + br2.gbps) / 2;
    }
    double tps = st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0;
    uint64_t acq = st.expert_hits + st.expert_misses;
    double h = acq ? (double)st.expert_hits / acq : 0;
    double need_tok = st.decode_tokens ? (double)acq * stride / st.decode_tokens : (double)top_k * n_moe * stride;
    double read_tok = st.decode_tokens ? (double)(st.expert_bytes_demand + st.expert_bytes_prefetch) / st.decode_tokens : 0;
    /* bytes the drive must deliver per token: missed experts + streamed spine layers (when the spine does not fit) */
    double spine_tok = st.decode_tokens ? (double)st.spine_bytes_streamed / st.decode_tokens : 0;
    double bound = (1 - h) * need_tok + spine_tok > 0 ? br.gbps * 1e9 / ((1 - h) * need_tok + spine_tok) : 0;
    double read_gbps = st.decode_s > 0 ? (st.expert_bytes_demand + st.expert_bytes_prefetch) / 1e9 / st.decode_s : 0;
    printf("  decode: %.3f tok/s over %llu tokens (%.2f s), io stall %.2f s\n", tps, (unsigned long long)st.decode_tokens,
           st.decode_s, st.io_stall_s);
    printf("  experts: %.1f MB needed/token, %.1f MB read/token (demand %.1f, prefetch %.1f MB total), hit rate %.3f, "
           "prefetch useful %llu/%llu, lookahead on for %llu of %llu decode steps\n",
           need_tok / 1e6, read_tok / 1e6, st.expert_bytes_demand / 1e6, st.expert_bytes_prefetch / 1e6, h,
           (unsigned long long)st.prefetch_useful, (unsigned long long)st.prefetch_issued,
           (unsigned long long)st.prefetch_steps_on, (unsigned long long)(st.prefetch_steps_on + st.prefetch_steps_off));
    if (bound > 0)
        printf("  storage bound B/((1-h)*expert_bytes_per_token + streamed_spine_bytes_per_token) = %.3f tok/s (B = %.3f GB/s, "
               "mean of before/after; spine streamed %.1f MB/token): achieved %.1f%% of the bound; expert reads %.3f GB/s = %.1f%% of B\n",
               bound, br.gbps, spine_tok / 1e6, 100 * tps / bound, read_gbps, br.gbps > 0 ? 100 * read_gbps / br.gbps : 0);
    else /* every acquisition hit (the experts fit in the cache): no read bounds decode */
        printf("  storage bound B/((1-h)*bytes_per_token): none, hit rate %.3f (B = %.3f GB/s, mean of before/after); "
               "expert reads %.3f GB/s = %.1f%% of B\n",
               h, br.gbps, read_gbps, br.gbps > 0 ? 100 * read_gbps / br.gbps : 0);
    if (io_buffer && bound > 0 && bpr.gbps > 0) {
        const double bound_p = bound * bpr.gbps / br.gbps;
        printf("  storage bound with B into %.0f MiB of buffers = %.3f tok/s (B = %.3f GB/s, mean of before/after): achieved "
               "%.1f%% of it; expert reads %.1f%% of that B\n",
               io_buffer / 1048576.0, bound_p, bpr.gbps, 100 * tps / bound_p, 100 * read_gbps / bpr.gbps);
    }
    if (io_cpu && bound > 0 && bcr.gbps > 0) {
        const double bound_c = bound * bcr.gbps / br.gbps;
        printf("  storage bound with B read beside %d computing thread%s = %.3f tok/s (B = %.3f GB/s, mean of before/after; "
               "%.0f%% of the idle B): achieved %.1f%% of it; expert reads %.1f%% of that B\n",
               io_cpu, io_cpu > 1 ? "s" : "", bound_c, bcr.gbps, 100 * bcr.gbps / br.gbps, 100 * tps / bound_c,
               100 * read_gbps / bcr.gbps);
    }
    printf("  prefill: %llu tokens in %.2f s (io stall %.2f s)\n", (unsigned long long)st0.prefill_tokens, st0.prefill_s,
           st0.io_stall_s);
    if (st.expert_slots_pinned) printf("  expert slots page-locked for the GPU: %d of %d\n", st.expert_slots_pinned, st.expert_slots);
    const char *exact = cli_exact_note(m); /* a string literal: still valid after the model closes */
    printf("  resident %.2f GiB, peak RSS %.2f GiB%s\n", st.resident_bytes / 1073741824.0, vm_hwm_kb() / 1048576.0, exact);
    free(logits);
    df_sampler_free(smp);
    df_session_free(s);
    df_model_close(m);
    if (remote) stream_print_stats(remote, stdout);
    stream_close(remote);
    if (events && !rc) { /* after the store closed the file: this run's totals, for `bench project --from` */
        /* the decode steps' waits for streamed spine layers (the spine does not fit the budget): the engine's I/O wait
         * of those steps (expert acquisitions + streamed layers) less the store's expert stall of the same steps (the
         * stall_ms of their token events); the store's events do not record them on their own */
        const double io_wait = stw.io_stall_s - st0.io_stall_s + st.io_stall_s;
        const uint64_t sp_bytes = stw.spine_bytes_streamed - st0.spine_bytes_streamed + st.spine_bytes_streamed;
        const double ex_stall = decode_expert_stall(events);
        const double sp_wait = sp_bytes && io_wait > ex_stall ? io_wait - ex_stall : 0;
        FILE *ef = fopen(events, "a");
        if (ef) {
            fprintf(ef, "{\"ev\":\"spine_stream\",\"decode_steps\":%d,\"bytes\":%llu,\"wait_s\":%.6f,\"io_wait_s\":%.6f,"
                        "\"expert_stall_s\":%.6f}\n", steps, (unsigned long long)sp_bytes, sp_wait, io_wait, ex_stall);
            fprintf(ef, "{\"ev\":\"bench_decode\",\"prefill_s\":%.6f,\"prefill_tokens\":%llu,\"prefill_stall_s\":%.6f,"
                        "\"decode_s\":%.6f,\"decode_tokens\":%llu,\"io_stall_s\":%.6f,\"gbps\":%.4f,\"exact\":%s,"
                        "\"exact_note\":\"%s\"}\n",
                    st0.prefill_s, (unsigned long long)st0.prefill_tokens, st0.io_stall_s, st.decode_s,
                    (unsigned long long)st.decode_tokens, st.io_stall_s, br.gbps, exact[0] ? "false" : "true", exact);
            fclose(ef);
        }
    }
    return rc ? 1 : 0;
}

/* ------------------------------------------------------------ bench cache */

typedef struct {
    int *layer, *off, *n; /* per acquire: layer, offset into ids, count */
    int *ids;
    int n_acq, cap, n_ids, cap_ids;
    int n_open;               /* the store's open events (one per recorded run) */
    int n_opens;              /* the distinct ones kept in opens */
    bench_open_ev opens[8];
} trace;

static void trace_free(trace *t);

/* Acquire events ({"ev":"acquire","layer":L,...,"ids":[...]}) of a JSONL events file. */
static int trace_load(const char *path, trace *t) {
    memset(t, 0, sizeof *t);
    FILE *f = fopen(path, "r");
    if (!f) return -1; /* errno says why */
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        bench_open_ev o;
        if (bench_open_event(line, &o)) { /* the model of each recorded run, for trace_check */
            t->n_open++;
            int seen = 0;
            for (int i = 0; i < t->n_opens && !seen; i++)
                seen = !strcmp(t->opens[i].model, o.model) && t->opens[i].slot_bytes == o.slot_bytes &&
                       t->opens[i].drives == o.drives;
            if (!seen && t->n_opens < 8) t->opens[t->n_opens++] = o;
            continue;
        }
        if (!strstr(line, "\"ev\":\"acquire\"")) continue;
        char *pl = strstr(line, "\"layer\":"), *pi = strstr(line, "\"ids\":[");
        if (!pl || !pi) continue;
        if (t->n_acq == t->cap) {
            t->cap = t->cap ? 2 * t->cap : 1024;
            t->layer = realloc(t->layer, t->cap * sizeof(int));
            t->off = realloc(t->off, t->cap * sizeof(int));
            t->n = realloc(t->n, t->cap * sizeof(int));
        }
        t->layer[t->n_acq] = atoi(pl + 8);
        t->off[t->n_acq] = t->n_ids;
        int k = 0;
        for (char *p = pi + 7; *p && *p != ']';) {
            if (t->n_ids == t->cap_ids) {
                t->cap_ids = t->cap_ids ? 2 * t->cap_ids : 4096;
                t->ids = realloc(t->ids, t->cap_ids * sizeof(int));
            }
            t->ids[t->n_ids++] = (int)strtol(p, &p, 10);
            k++;
            while (*p == ',' || *p == ' ') p++;
        }
        t->n[t->n_acq++] = k;
    }
    free(line);
    fclose(f);
    return t->n_acq > 0 ? 0 : -2;
}

/* trace_load with its message: "cannot open FILE: strerror" or "no acquire events in FILE"; 0 or 1 (the exit status) */
static int trace_load_msg(const char *cmd, const char *path, trace *t) {
    int r = trace_load(path, t);
    if (r == -1) fprintf(stderr, "deltafin bench %s: cannot open %s: %s\n", cmd, path, strerror(errno));
    else if (r) {
        fprintf(stderr, "deltafin bench %s: no acquire events in %s (an events file of deltafin run --events)\n", cmd, path);
        trace_free(t);
    }
    return r ? 1 : 0;
}

static void trace_free(trace *t) { free(t->layer); free(t->off); free(t->n); free(t->ids); }

/* A trace of the model nat (--model model_arg), else a message and 1 (the exit status), checked before anything is
 * printed or measured: a trace of another model is one of other expert shapes: an acquisition that names no routed
 * expert of the model (a MoE layer, an expert id below its count), or an open event's expert slot of another size.
 *  - with open events (each recorded run's): bench_trace_verdict: refused naming the model they name
 *    (bench_trace_foreign); of the same shapes and another name (a copy in a folder of another name), one note line;
 *  - without (an older events file): "deltafin bench CMD: FLAG FILE: layer L expert E is not a routed expert of MODEL
 *    (...; the trace was recorded on another model?)" for a foreign expert, else one warning line (its model cannot
 *    be checked), and 0. */
static int trace_check(const char *cmd, const char *flag, const char *path, const trace *t, const df_native *nat,
                       const char *model_arg) {
    int bad_L = -1, bad_x = -1, bad = 0;
    for (int i = 0; i < t->n_acq && !bad; i++) {
        const int L = t->layer[i];
        const int moe = L >= 0 && L < nat->cfg.num_hidden_layers && nat->by_layer && nat->by_layer[L];
        for (int c = 0; c < t->n[i] && !bad; c++) {
            const int x = t->ids[t->off[i] + c];
            if (moe && x >= 0 && x < nat->n_experts) continue;
            bad = 1, bad_L = L, bad_x = x;
        }
    }
    if (t->n_opens) {
        char why[128];
        snprintf(why, sizeof why, "its layer %d expert %d is not a routed expert of --model", bad_L, bad_x);
        return bench_trace_verdict(cmd, flag, path, t->opens, t->n_opens, bad ? why : NULL, nat, model_arg);
    }
    if (bad) {
        fprintf(stderr, "deltafin bench %s: %s %s: layer %d expert %d is not a routed expert of %s (%d MoE layer%s x %d "
                        "experts; the trace was recorded on another model?)\n", cmd, flag, path, bad_L, bad_x, nat->name,
                nat->n_moe_layers, nat->n_moe_layers == 1 ? "" : "s", nat->n_experts);
        return 1;
    }
    if (!t->n_open) bench_trace_unchecked(cmd, flag, path, nat);
    return 0;
}

/* Replay a trace through the store; returns the hit rate or -1. */
static double g_decay; /* bench cache --decay */

static double replay(const df_native *nat, const trace *t, int slots, int policy, const char *heat, double hot_fraction,
                     char *err, size_t errlen) {
    store_opts o;
    store_opts_default(&o);
    o.decay = g_decay;
    o.cache_bytes = (uint64_t)slots * store_slot_bytes(nat);
    o.policy = policy;
    o.heat_path = heat;
    if (hot_fraction >= 0) o.hot_fraction = hot_fraction;
    o.verify = 0;
    df_store *st = NULL;
    if (store_open(&st, nat, &o, err, errlen)) return -1;
    df_expert v[64];
    for (int i = 0; i < t->n_acq; i++) {
        const int *ids = t->ids + t->off[i];
        for (int c = 0, n; c < t->n[i]; c += n) {
            n = t->n[i] - c < 64 ? t->n[i] - c : 64;
            if (n > store_max_acquire(st)) n = store_max_acquire(st);
            if (store_acquire(st, t->layer[i], ids + c, n, v, err, errlen)) { store_close(st); return -1; }
            store_release(st, t->layer[i], ids + c, n);
        }
    }
    store_stats s;
    store_get_stats(st, &s);
    store_close(st);
    return s.hits + s.misses ? (double)s.hits / (s.hits + s.misses) : 0;
}

#define MAX_SLOTS 64
/* --slots N,N2,...: up to cap integers >= 1, nothing else; the count, else -1 */
static int parse_slots(const char *s, int *out, int cap) {
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || *p == ' ' || *p == '+' || errno || v < 1 || v > INT_MAX || n == cap || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        if (!*end) return n;
        p = end + 1;
    }
}

static int bench_cache(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL, *test = NULL, *train = NULL;
    int slots[MAX_SLOTS] = {64}, n_slots = 1, slots_given = 0;
    double hot = -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin bench cache --model DIR --trace EVENTS.jsonl [--train EVENTS.jsonl] [--slots N,N2,...]\n"
                   "       [--hot-fraction F] [--decay D] [--cache-dir DIR]\n"
                   "  Replays the expert acquisitions of an events file (deltafin run --events) through the store with\n"
                   "  LRU, frequency-aware eviction, and frequency + the heat tier learned from --train (default: the\n"
                   "  trace itself = in-sample; another run's events = held-out). Prints hit rates. --model DIR: a\n"
                   "  native model, or a Hugging Face checkpoint converted once into the conversion cache.\n"
                   "  --slots: cache sizes in expert slots, each from the model's experts per token to its routed\n"
                   "  experts (MoE layers x experts); another is an error. Default 64, moved into that range for a\n"
                   "  model where 64 is outside it (and said so). A trace recorded on a model of other expert shapes is\n"
                   "  refused (expert slots of another size, or experts --model lacks); only another name (the same\n"
                   "  checkpoint in a folder of another name) is a note. A trace without an open event, of an older\n"
                   "  deltafin, is replayed with a warning.\n"
                   "  --cache-dir DIR: where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n");
            return 0;
        }
        static const char *const vals[] = {"--model", "--trace", "--train", "--slots", "--hot-fraction", "--decay", "--cache-dir",
                                           NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench cache", a, vals, NULL);
        if (!v) { fprintf(stderr, "deltafin bench cache: %s needs a value\n", a); return 2; }
        if (cli_repeated_at("bench cache", argc, argv, i, vals, NULL)) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench cache", v)) return 2; cache_dir = v; }
        else if (!strcmp(a, "--trace")) test = v;
        else if (!strcmp(a, "--train")) train = v;
        else if (!strcmp(a, "--slots")) {
            if ((n_slots = parse_slots(v, slots, MAX_SLOTS)) < 0) {
                fprintf(stderr, "deltafin bench cache: --slots \"%s\": expected up to %d comma-separated integers >= 1\n", v, MAX_SLOTS);
                return 2;
            }
            slots_given = 1;
        }
        else if (!strcmp(a, "--hot-fraction")) { if (want_num("cache", a, v, 0, 1, 0, &hot)) return 2; }
        else if (!strcmp(a, "--decay")) { if (want_num("cache", a, v, 0, 1, 1, &g_decay)) return 2; }
        i++;
    }
    if (!model || !test) { fprintf(stderr, "deltafin bench cache: --model and --trace are required\n"); return 2; }
    char err[2048];
    df_native *nat = NULL;
    char conv_dir[4096];
    const char *model_arg = model; /* as given (a Hugging Face directory is replaced by its conversion) */
    int chk = bench_native_model("cache", &model, cache_dir, conv_dir, sizeof conv_dir, NULL, 0); /* an HF checkpoint: converted */
    if (chk) return chk;
    if (native_open(&nat, model, err, sizeof err)) { fprintf(stderr, "deltafin bench cache: %s\n", err); return 1; }
    const int total = nat->n_moe_layers * nat->n_experts, topk = nat->cfg.num_experts_per_tok;
    if (total < 1) {
        fprintf(stderr, "deltafin bench cache: %s has no routed experts to cache\n", model);
        native_close(nat);
        return 1;
    }
    char slots_note[160] = "";
    if (!slots_given && (slots[0] < topk || slots[0] > total)) {
        /* no --slots: the default 64, clamped into what this model allows */
        const int d = slots[0];
        slots[0] = d < topk ? topk : total;
        snprintf(slots_note, sizeof slots_note, " (no --slots: the default %d is %s this model's [%d, %d])", d,
                 d < topk ? "below" : "beyond", topk, total);
    }
    for (int k = 0; k < n_slots; k++) {
        if (slots[k] < topk || slots[k] > total) {
            fprintf(stderr, "deltafin bench cache: --slots %d: expected a count in [%d, %d] for this model (at least its %d experts "
                    "per token, at most its %d routed experts: %d MoE layers x %d)\n", slots[k], topk, total, topk, total,
                    nat->n_moe_layers, nat->n_experts);
            native_close(nat);
            return 2;
        }
    }
    trace tt, tr;
    if (trace_load_msg("cache", test, &tt)) { native_close(nat); return 1; }
    if (trace_load_msg("cache", train ? train : test, &tr)) { trace_free(&tt); native_close(nat); return 1; }
    if (trace_check("cache", "--trace", test, &tt, nat, model_arg) ||
        (train && trace_check("cache", "--train", train, &tr, nat, model_arg))) {
        trace_free(&tt); trace_free(&tr); native_close(nat); return 1;
    }
    char heat[64];
    snprintf(heat, sizeof heat, "/tmp/df_bench_heat_%d.bin", (int)getpid());
    int rc = 0;
    printf("bench cache: %s, trace %s (%d acquisitions), heat from %s (%s)%s\n", model, test, tt.n_acq,
           train ? train : test, train ? "held-out" : "in-sample", slots_note);
    printf("  %8s %8s %10s %10s %12s\n", "slots", "of all", "LRU", "LRFU", "LRFU+heat");
    for (int k = 0; k < n_slots && !rc; k++) {
        const int slot = slots[k];
        unlink(heat);
        /* learn the heat: replay the training trace once with the heat file set (saved on close) */
        double r0 = replay(nat, &tr, slot, 0, heat, 0, err, sizeof err);
        double lru = replay(nat, &tt, slot, 1, NULL, -1, err, sizeof err);
        double fr = replay(nat, &tt, slot, 0, NULL, -1, err, sizeof err);
        /* a fresh copy of the learned heat for the measured run (its close updates the file) */
        double fh = replay(nat, &tt, slot, 0, heat, hot, err, sizeof err);
        if (r0 < 0 || lru < 0 || fr < 0 || fh < 0) { fprintf(stderr, "deltafin bench cache: %s\n", err); rc = 1; break; }
        printf("  %8d %7.1f%% %9.1f%% %9.1f%% %11.1f%%\n", slot, 100.0 * slot / total, 100 * lru, 100 * fr, 100 * fh);
    }
    unlink(heat);
    trace_free(&tt);
    trace_free(&tr);
    native_close(nat);
    return rc;
}

/* ------------------------------------------------------------ bench store */

/* The store's I/O path without compute: a decode trace replayed cold, layer by
 * layer as the engine does it (request all of the layer's experts on demand,
 * then acquire / release each), against bench io measured in the same run. */
static int bench_store(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL, *test = NULL, *cache_arg = "";
    uint64_t cache = 0;
    int qd = 16, uring = 1, nodrop = 0, have_cache = 0;
    double io_seconds = 5;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin bench store --model DIR --trace EVENTS.jsonl [--cache SIZE]\n"
                   "       [--qd N] [--pread] [--io-seconds S] [--no-drop] [--cache-dir DIR]\n"
                   "  Replays a decode trace through the expert store with real cold reads and no compute; prints\n"
                   "  expert read GB/s as a share of bench io on the same directories in the same run, with qd reused\n"
                   "  buffers and into a pool the size of the cache (at most 4 GiB; see `bench io --buffer`). --model\n"
                   "  DIR: a native model, or a Hugging Face checkpoint converted once into the conversion cache.\n"
                   "  --cache SIZE: the expert cache (default 1/4 of the routed experts, at least one token's top-k\n"
                   "  experts; a smaller SIZE is an error naming the least). A trace recorded on a model of other expert\n"
                   "  shapes is refused (expert slots of another size, or experts --model lacks); only another name (the\n"
                   "  same checkpoint in a folder of another name) is a note. A trace without an open event, of an older\n"
                   "  deltafin, is replayed with a warning.\n"
                   "  --cache-dir DIR: where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n");
            return 0;
        }
        if (!strcmp(a, "--pread")) { uring = 0; continue; }
        if (!strcmp(a, "--no-drop")) { nodrop = 1; continue; }
        static const char *const vals[] = {"--model", "--trace", "--cache", "--qd", "--io-seconds", "--cache-dir", NULL};
        static const char *const flags[] = {"--help", "--pread", "--no-drop", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench store", a, vals, flags);
        if (!v) { fprintf(stderr, "deltafin bench store: %s needs a value\n", a); return 2; }
        if (cli_repeated_at("bench store", argc, argv, i, vals, NULL)) return 2;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench store", v)) return 2; cache_dir = v; }
        else if (!strcmp(a, "--trace")) test = v;
        else if (!strcmp(a, "--cache")) { if (want_size("store", a, v, &cache)) return 2; have_cache = 1; cache_arg = v; }
        else if (!strcmp(a, "--qd")) { if (want_int("store", a, v, 1, BENCH_MAX_QD, &qd)) return 2; }
        else if (!strcmp(a, "--io-seconds")) { if (want_num("store", a, v, 0, BENCH_MAX_SECONDS, 1, &io_seconds)) return 2; }
        i++;
    }
    if (!model || !test) { fprintf(stderr, "deltafin bench store: --model and --trace are required\n"); return 2; }
    char err[2048];
    df_native *nat = NULL;
    char conv_dir[4096];
    const char *model_arg = model; /* as given (a Hugging Face directory is replaced by its conversion) */
    int chk = bench_native_model("store", &model, cache_dir, conv_dir, sizeof conv_dir, NULL, 0); /* an HF checkpoint: converted */
    if (chk) return chk;
    if (native_open(&nat, model, err, sizeof err)) { fprintf(stderr, "deltafin bench store: %s\n", err); return 1; }
    trace tt;
    if (trace_load_msg("store", test, &tt)) { native_close(nat); return 1; }
    if (trace_check("store", "--trace", test, &tt, nat, model_arg)) { trace_free(&tt); native_close(nat); return 1; }
    const uint64_t slot_bytes = store_slot_bytes(nat), need = (uint64_t)nat->cfg.num_experts_per_tok * slot_bytes;
    uint64_t experts = (uint64_t)nat->n_moe_layers * nat->n_experts * slot_bytes;
    if (!have_cache) cache = experts / 4 > need ? experts / 4 : need; /* a small model: at least one token's experts */
    /* the cache must hold one token's experts (top-k slots), as the store checks when it opens: said here, before
     * the I/O benchmarks (2 x --io-seconds) rather than after them */
    if (nat->n_moe_layers > 0 && cache / slot_bytes < (uint64_t)nat->cfg.num_experts_per_tok) {
        fprintf(stderr, "deltafin bench store: --cache %s holds %llu expert slots of %llu bytes but one token needs "
                        "top-k = %d: give at least %llu bytes (--cache %lluK)\n", cache_arg,
                (unsigned long long)(cache / slot_bytes), (unsigned long long)slot_bytes, nat->cfg.num_experts_per_tok,
                (unsigned long long)need, (unsigned long long)((need + 1023) / 1024));
        trace_free(&tt); native_close(nat); return 2;
    }
    char dirs[4096];
    bench_pack_dirs(nat, dirs, sizeof dirs);
    int dropped = nodrop ? 0 : bench_drop_caches(model, dirs);
    store_bench_opts bo;
    bench_expert_io_opts(&bo, dirs, qd, nat->stride, nat->cfg.num_experts_per_tok, io_seconds);
    bo.use_uring = uring;
    store_bench_result br;
    int rc = store_bench_io(&bo, &br, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench store: I/O benchmark: %s\n", err); trace_free(&tt); native_close(nat); return 1; }
    const int gib = experts >= (1ull << 30); /* sizes in GiB, or MiB for a small model */
    printf("bench store: %s, trace %s (%d acquisitions), cache %.2f %s of %.2f %s experts, page cache %s\n  ", model,
           test, tt.n_acq, cache / (gib ? 1073741824.0 : 1048576.0), gib ? "GiB" : "MiB",
           experts / (gib ? 1073741824.0 : 1048576.0), gib ? "GiB" : "MiB",
           dropped ? "evicted (the model's files)" : "not evicted");
    print_io(&bo, &br);
    /* and with the reads landing in a pool the size of the cache (at most 4 GiB), as the store's reads do; not when
     * that pool is no larger than the qd reused buffers (the same measurement again) */
    store_bench_opts bp = bo;
    bp.buffer_bytes = cache < ((uint64_t)4 << 30) ? cache : ((uint64_t)4 << 30);
    const int pool = bp.buffer_bytes > (uint64_t)bo.qd * bo.io_bytes;
    store_bench_result bpr = {0};
    if (!nodrop && pool) bench_drop_caches(model, dirs);
    if (pool && store_bench_io(&bp, &bpr, err, sizeof err) == 0) {
        printf("  ");
        print_io(&bp, &bpr);
    }
    if (!nodrop) bench_drop_caches(model, dirs);
    store_opts o;
    store_opts_default(&o);
    o.cache_bytes = cache;
    o.io_depth = qd;
    o.use_uring = uring;
    df_store *st = NULL;
    if ((rc = store_open(&st, nat, &o, err, sizeof err))) {
        fprintf(stderr, "deltafin bench store: %s\n", err);
        trace_free(&tt); native_close(nat); return 1;
    }
    double t0 = now_s();
    df_expert v;
    for (int i = 0; i < tt.n_acq && !rc;) {
        int j = i, L = tt.layer[i];
        while (j < tt.n_acq && tt.layer[j] == L) j++;
        for (int q = i; q < j; q++) store_request(st, L, tt.ids + tt.off[q], tt.n[q], STORE_DEMAND);
        for (int q = i; q < j && !rc; q++)
            for (int c = 0; c < tt.n[q] && !rc; c++) {
                int x = tt.ids[tt.off[q] + c];
                rc = store_acquire(st, L, &x, 1, &v, err, sizeof err);
                if (!rc) store_release(st, L, &x, 1);
            }
        i = j;
    }
    double dt = now_s() - t0;
    store_stats s;
    store_get_stats(st, &s);
    store_close(st);
    store_bench_result br2;
    if (!rc && store_bench_io(&bo, &br2, err, sizeof err) == 0) {
        printf("  after: ");
        print_io(&bo, &br2);
        br.gbps = (br.gbps + br2.gbps) / 2;
    }
    if (!rc && pool && store_bench_io(&bp, &br2, err, sizeof err) == 0) {
        printf("  after: ");
        print_io(&bp, &br2);
        bpr.gbps = (bpr.gbps + br2.gbps) / 2;
    }
    if (rc) fprintf(stderr, "deltafin bench store: %s\n", err);
    double gbps = (s.bytes_demand + s.bytes_prefetch) / 1e9 / dt;
    printf("  replay: %.2f s, %.2f GB read, %.3f GB/s = %.1f%% of bench io (mean of before/after), hit rate %.3f, stall %.2f s, %s\n", dt,
           (s.bytes_demand + s.bytes_prefetch) / 1e9, gbps, br.gbps > 0 ? 100 * gbps / br.gbps : 0,
           s.hits + s.misses ? (double)s.hits / (s.hits + s.misses) : 0, s.stall_s, s.io_engine);
    if (bpr.gbps > 0)
        printf("  replay vs bench io into %.0f MiB of buffers: %.1f%%\n", bp.buffer_bytes / 1048576.0, 100 * gbps / bpr.gbps);
    trace_free(&tt);
    native_close(nat);
    return rc ? 1 : 0;
}

/* bench_project.c: `bench project` (decode runs `bench decode` for its --model measurement) */
int bench_project(int argc, char **argv, int (*decode)(int argc, char **argv));
#include "bench_kernels.h" /* `bench machine` / `bench kernels` */
/* bench_prefill.c: `bench prefill` */
int bench_prefill(int argc, char **argv);
/* bench_batch.c: `bench batch` */
int bench_batch(int argc, char **argv);

int cmd_bench(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: deltafin bench io --dir DIR[,DIR2...] [--size 1M] [--qd 16] [--seconds 10]\n"
                "       deltafin bench decode [--model DIR] [--ram-budget SIZE] [--tokens N]\n"
                "       deltafin bench prefill [--model DIR] [--tokens N] [--ram-budget SIZE]\n"
                "       deltafin bench batch [--model DIR] [--ram-budget SIZE] [--seqs 1,2,4,8] [--tokens N]\n"
                "       deltafin bench machine | kernels [--threads 1,2,...]   (DRAM bandwidth, FMA peak; kernel GB/s)\n"
                "       deltafin bench cache --model DIR --trace EVENTS.jsonl [--train EVENTS.jsonl] [--slots N,...]\n"
                "       deltafin bench store --model DIR --trace EVENTS.jsonl [--cache SIZE]\n"
                "       deltafin bench project --drives N --gbps B [--arch kimi_k3] [--from EVENTS.jsonl | --model DIR |\n"
                "                              --hit-rate H --compute-ms-per-layer C ...]\n"
                "  Each benchmark's options: deltafin bench <io|decode|prefill|batch|machine|kernels|cache|store|project> --help\n"
                "  Without --model, decode, prefill and batch use the model `deltafin setup` installed, else the embedded\n"
                "  models/kimi-mini (as `deltafin run`). A Hugging Face checkpoint given to decode, prefill, batch, cache,\n"
                "  store or project is converted once into the conversion cache: $XDG_CACHE_HOME/deltafin, or --cache-dir DIR.\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "io")) return bench_io(argc - 2, argv + 2);
    if (!strcmp(argv[1], "decode")) return bench_decode(argc - 2, argv + 2);
    if (!strcmp(argv[1], "prefill")) return bench_prefill(argc - 2, argv + 2);
    if (!strcmp(argv[1], "batch")) return bench_batch(argc - 2, argv + 2);
    if (!strcmp(argv[1], "machine") || !strcmp(argv[1], "kernels")) return bench_kernels_main(argc - 1, argv + 1);
    if (!strcmp(argv[1], "cache")) return bench_cache(argc - 2, argv + 2);
    if (!strcmp(argv[1], "store")) return bench_store(argc - 2, argv + 2);
    if (!strcmp(argv[1], "project")) return bench_project(argc - 2, argv + 2, bench_decode);
    static const char *const names[] = {"io", "decode", "prefill", "batch", "machine", "kernels", "cache", "store", "project", NULL};
    const char *best = cli_closest(argv[1], names);
    /* a suggestion only for a likely typo: a few edits relative to the word's length (bench decod, bench prefil),
     * or the start of a name (bench bat); not an unrelated short word (bench foo is 2 edits from io) */
    if (best) {
        const size_t la = strlen(argv[1]);
        const int near = cli_edit_distance(argv[1], best) <= (la / 3 > 1 ? (int)(la / 3) : 1);
        if (!near && !(la >= 3 && !strncmp(best, argv[1], la))) best = NULL;
    }
    char hint[64] = "", list[128] = "";
    if (best) snprintf(hint, sizeof hint, ", did you mean 'bench %s'?", best);
    for (int i = 0; names[i]; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
    fprintf(stderr, "deltafin bench: unknown benchmark '%s'%s (%s; see deltafin bench --help)\n", argv[1], hint, list);
    return 2;
}
