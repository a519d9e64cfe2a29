/*
 * cmd_doctor.c — `deltafin doctor [--model DIR] [--cache-dir DIR]`: machine facts
 * (cores, RAM, SIMD features, io_uring availability) and, with --model, a full
 * checksum verification of the model's native files (df_model_verify_all: every
 * corrupt expert is named with its layer, file and offset, and the spine's state
 * is printed, also when a corrupt spine.bin stops the model from opening) and a
 * check that its tokenizer (when it has one) opens. For an install of `deltafin setup` (the registry names it), the
 * side files are checked against the checkpoint's copies (src/hub/install.h) and the messages name setup's repair
 * command instead of the engine's "re-run `deltafin convert`".
 */
#define _GNU_SOURCE
#include "cli.h"
#include "hub/install.h"
#include "hub/stream.h"
#include "deltafin.h"
#include "util/util.h"

#include <errno.h>
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

static void advice(char *msg, size_t cap) {
    if (setup_fix[0]) df_advice_setup_repair(msg, cap, setup_fix);
}

/* df_model_verify_all: one line per problem, as found */
static void report_problem(void *user, const df_verify_problem *p) {
    (void)user;
    line_end();
    char msg[8192];
    snprintf(msg, sizeof msg, "%s", p->message);
    advice(msg, sizeof msg);
    if (p->layer < 0)
        fprintf(stderr, "deltafin doctor: spine CORRUPT: %s\n", msg);
    else if (p->expert < 0)
        fprintf(stderr, "deltafin doctor: layer %d UNREADABLE: %s\n", p->layer, msg);
    else
        fprintf(stderr, "deltafin doctor: corrupt expert: %s\n", msg); /* names layer, expert, file(s), offset(s) */
}

/* a setup install's side file that is not the checkpoint's copy (install_check_side_files) */
static void report_side_file(void *user, const install_side_problem *p) {
    (void)user;
    line_end();
    fprintf(stderr, "deltafin doctor: %s %s %s: repair the install with `%s`\n", p->installed,
            p->missing ? "is missing; the checkpoint's copy is" : "differs from the checkpoint's copy", p->checkpoint, setup_fix);
}

/* The checksums all verified: said on stdout; when another check failed (status != 0) the last line on stderr says
 * the doctor FAILED anyway, with the setup install's repair when there is one. */
static void checksums_ok(int status) {
    printf("checksums: all OK\n");
    if (status)
        fprintf(stderr, "deltafin doctor: FAILED by the problems reported above (the checksums are OK)%s%s%s\n",
                setup_fix[0] ? "; `" : "", setup_fix, setup_fix[0] ? "` repairs the install" : "");
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
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("usage: deltafin doctor [--model DIR] [--cache-dir DIR]\n"
                   "  prints machine facts, then verifies every checksum of the model and that its tokenizer opens\n"
                   "  (without --model: the model `deltafin setup` installed, else the embedded models/kimi-mini):\n"
                   "  every corrupt expert is named (layer, expert, file, offset), then the spine's state; any problem: exit 1.\n"
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
    int status = 0;
    if (rc) {
        advice(err, sizeof err);
        fprintf(stderr, "deltafin doctor: %s\n", err);
        /* damaged or missing files (a corrupt spine.bin, a missing pack stop the open): still check every checksum below */
        struct stat st;
        if ((rc != DF_EFORMAT && rc != DF_EIO) || stat(model, &st) || !S_ISDIR(st.st_mode)) return 1;
        status = 1;
    } else {
        const char *desc = df_model_describe(m); /* "model NAME (...), ...": the line's key says "model" once */
        if (!strncmp(desc, "model ", 6)) desc += 6;
        printf("model: %s%s%s%s%s\n", desc, dflt_how[0] ? "; model (no --model): " : "",
               dflt_how[0] ? model : "", dflt_how[0] ? ", " : "", dflt_how);
        df_model_close(m); /* the check below reads the files itself */
    }
    /* the tokenizer: a file that is present but does not open is an error (not "no tokenizer") */
    if (cli_is_file(model, "tokenizer.json") || cli_is_file(model, "tiktoken.model")) {
        df_tokenizer *t = NULL;
        char terr[1024] = "";
        if (df_tokenizer_open(&t, model, NULL, terr, sizeof terr)) {
            fprintf(stderr, "deltafin doctor: tokenizer FAILED: %s\n", terr[0] ? terr : "cannot open");
            status = 1;
        } else {
            printf("tokenizer: OK\n");
            df_tokenizer_free(t);
        }
    } else if (cli_is_file(model, "tokenizer_config.json")) {
        /* the tokenizer's configuration without the tokenizer: a file was lost (a model without one has neither) */
        fprintf(stderr, "deltafin doctor: tokenizer FAILED: %s has tokenizer_config.json but neither tokenizer.json nor "
                        "tiktoken.model: %s\n", model,
                setup_fix[0] ? "the install is damaged (see below)" : "copy the tokenizer from the checkpoint, or convert again");
        status = 1;
    } else {
        printf("tokenizer: none (token ids only)\n");
    }
    /* a setup install: the tokenizer and the other files convert copied, against the checkpoint's copies setup keeps */
    if (setup_fix[0] && !remote) {
        int nside = install_check_side_files(model, setup_ck, report_side_file, NULL);
        if (nside) status = 1;
        else printf("side files: as in the checkpoint %s\n", setup_ck);
    }
    if (remote) {
        /* the manifest's expert checksums are of the holes: check what was fetched against what was recorded */
        uint64_t ok = 0, bad = 0;
        int vr = stream_verify_local(remote, &ok, &bad, stderr);
        stream_print_stats(remote, stdout);
        stream_close(remote);
        if (vr < 0) { fprintf(stderr, "deltafin doctor: cannot check the streamed experts: %s\n", df_strerror(vr)); return 1; }
        printf("experts: streamed install: %llu fetched experts OK, %llu corrupt (the others are fetched on first use, "
               "checked against their shard's sha256 ETag)\n", (unsigned long long)ok, (unsigned long long)bad);
        if (bad) {
            fprintf(stderr, "deltafin doctor: verification FAILED: %llu streamed experts corrupt%s%s%s\n", (unsigned long long)bad,
                    setup_fix[0] ? "; `" : "", setup_fix, setup_fix[0] ? "` fetches them again" : "");
            return 1;
        }
        checksums_ok(status);
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
    if (nbad < 0) {
        if (strcmp(verr, err)) fprintf(stderr, "deltafin doctor: verification FAILED: %s\n", verr);
        return 1;
    }
    if (sum.spine_ok) printf("spine: OK (%s, %llu bytes)\n", sum.spine_file, (unsigned long long)sum.spine_bytes);
    else printf("spine: CORRUPT (%s, %llu bytes)\n", sum.spine_file, (unsigned long long)sum.spine_bytes);
    if (sum.n_moe_layers)
        printf("experts: %d routed experts in %d MoE layers: %d OK, %d corrupt\n", sum.n_experts, sum.n_moe_layers,
               sum.n_experts - sum.n_bad_experts, sum.n_bad_experts);
    else
        printf("experts: none (dense model)\n");
    if (nbad > 0) {
        fprintf(stderr, "deltafin doctor: verification FAILED: %s\n", verr);
        return 1;
    }
    checksums_ok(status);
    return backend_ok ? status : 1;
}
