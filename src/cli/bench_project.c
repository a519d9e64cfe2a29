/*
 * bench_project.c — `deltafin bench project`: decode tok/s and prompt TTFT of a FULL model (Kimi K3 by
 * default: 93 layers, 92 MoE layers, top-16 of 896 latent MXFP4 experts of 17.5 MB) on N drives of B GB/s,
 * projected from per-token figures measured on a smaller model (an events file of `bench decode --events` /
 * `run --events`, or a short `bench decode` run here with --model) or given on the command line.
 *
 * Model (every input and formula is printed, with where it came from: given, measured, or assumed):
 *   bytes_per_token = moe_layers * top_k * expert_bytes           (expert bytes one token needs, before hits)
 *   t_io      = r * bytes_per_token / (N * B)                      r = 1 - h, or the measured read/needed ratio
 *                                                                  (which also counts prefetch reads never used)
 *   t_compute = compute_ms_per_layer * layers                      (spine + expert compute scaled by layers;
 *                                                                  measured: decode time less the expert stall and
 *                                                                  the waits for streamed spine layers, which bench
 *                                                                  decode --events records in a spine_stream line)
 *   decode tok/s = 1 / max(t_io, t_compute)                        reads fully hidden behind compute
 *                = 1 / (t_io + t_compute)                          no overlap
 *                = 1 / max(t_io, t_compute + s * t_io)             s = exposed-I/O fraction (stall / read time)
 *   prefill of T tokens, expert-major (each touched expert read once per layer):
 *   union_bytes = coverage(T) * moe_layers * experts * expert_bytes
 *   coverage(T) = 1 - (1 - c_m)^(T / T_m) from a measured coverage c_m over T_m tokens, else uniform
 *                 independent routing 1 - (1 - top_k / experts)^T
 *   TTFT = max(union_bytes / (N*B), T * layers * prefill_ms_per_layer_token), and the sum (no overlap)
 * It is a bound-style estimate: queueing, per-layer waits for the slowest drive, and compute that does not
 * scale with layers are outside it.
 */
#define _GNU_SOURCE
#include "cli.h"
#include "bench_common.h"
#include "deltafin.h"
#include "model/native.h"
#include "model/weights.h"
#include "util/util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The events file of the bench decode run (--model without --from), a temporary: removed when the run ends, also
 * when SIGINT / SIGTERM / SIGHUP ends it (the handler removes it and re-raises the signal under its default
 * disposition, so the exit status stays 128 + the signal) or something calls exit() */
static char g_tmp_events[128];
static const int g_tmp_sigs[] = {SIGINT, SIGTERM, SIGHUP};
static struct sigaction g_tmp_old[3];

static void tmp_events_remove(void) {
    if (g_tmp_events[0]) unlink(g_tmp_events);
}

static void tmp_events_signal(int sig) {
    if (g_tmp_events[0]) unlink(g_tmp_events); /* async-signal-safe */
    signal(sig, SIG_DFL);
    raise(sig); /* delivered when this handler returns: the process ends by the signal */
}

/* from here on the temporary at path is removed however the process ends (but kill -9) */
static void tmp_events_guard(const char *path) {
    static int registered;
    if (!registered) registered = !atexit(tmp_events_remove);
    snprintf(g_tmp_events, sizeof g_tmp_events, "%s", path);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = tmp_events_signal;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; i++) {
        sigaction(g_tmp_sigs[i], NULL, &g_tmp_old[i]);
        /* a signal ignored by the parent (nohup, `cmd &` without job control) stays ignored */
        if (g_tmp_old[i].sa_handler != SIG_IGN) sigaction(g_tmp_sigs[i], &sa, NULL);
    }
}

/* the temporary removed and the previous handlers back */
static void tmp_events_done(void) {
    if (!g_tmp_events[0]) return;
    unlink(g_tmp_events);
    for (int i = 0; i < 3; i++) sigaction(g_tmp_sigs[i], &g_tmp_old[i], NULL);
    g_tmp_events[0] = 0;
}

typedef struct {
    const char *name;
    int layers, dense, experts, top_k, moe_inter, width;
    const char *what;
} proj_arch;

/* Full models (shared/notes/kimi-k3.md; Kimi K2: DeepSeek-V3 shapes, 384 experts, experts taken as MXFP4). */
static const proj_arch ARCHES[] = {
    {"kimi_k3", 93, 1, 896, 16, 3072, 3584, "Kimi K3: 93 layers (1 dense), latent MoE 896 x [3072, 3584] mxfp4, top-16"},
    {"kimi_k2", 61, 1, 384, 8, 2048, 7168, "Kimi K2: 61 layers (1 dense), 384 x [2048, 7168] mxfp4, top-8"},
};

/* One expert extent as deltafin lays it out: gate, up [I, W], down [W, I], each array 64-byte aligned, 4 KiB stride. */
static uint64_t expert_stride(df_wtype t, int64_t I, int64_t W) {
    int64_t r[3] = {I, I, W}, c[3] = {W, W, I};
    uint64_t x = 0;
    for (int p = 0; p < 3; p++)
        x += (df_weight_data_bytes(t, r[p], c[p]) + 63) / 64 * 64 + (df_weight_scale_bytes(t, r[p], c[p]) + 63) / 64 * 64;
    return (x + 4095) / 4096 * 4096;
}

/* ------------------------------------------------------------ events file */

typedef struct {
    int ok;
    int decode_tokens;         /* token events that extend the previous one by one position */
    int prompt_tokens;         /* positions of the prompt evals */
    int total_positions;       /* last pos + 1 */
    double decode_s, stall_s;  /* over decode tokens */
    double io_s;               /* over decode tokens: sum of max over drives of bytes / busy GB/s */
    uint64_t bytes_read, hits, misses, slot_bytes;
    int max_layer, max_id, n_layers_seen;
    int max_acquire;           /* the most experts one acquire event names: the top-k of a single-sequence run */
    uint64_t distinct;         /* distinct (layer, expert) acquired over the whole file */
    int have_bd;               /* a "bench_decode" line (bench decode --events): the prompt's eval and B */
    double prefill_s, prefill_stall_s, bd_gbps;
    int prefill_tokens;
    int have_exact;            /* the bench_decode line says whether the model is exact: exact_note (cli_exact_note) */
    char exact_note[64];
    int have_spine;            /* "spine_stream" lines (bench decode --events): the decode steps' waits for streamed */
    double spine_wait_s;       /* spine layers (the spine larger than the budget), not in the token events' stall */
    uint64_t spine_bytes;
    int n_open, n_opens;       /* the store's open events (one per recorded run); the distinct ones in opens */
    bench_open_ev opens[8];
} ev_summary;

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static double jnum(const cJSON *o, const char *k, double d) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : d;
}

static int read_events(const char *path, ev_summary *s, char *err, size_t errlen) {
    memset(s, 0, sizeof *s);
    s->max_layer = -1;
    FILE *f = fopen(path, "r");
    if (!f) { snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno)); return -1; }
    char *line = NULL;
    size_t cap = 0;
    uint32_t *keys = NULL;
    size_t nk = 0, ck = 0;
    int64_t prev_pos = -2;
    double prev_t = 0;
    int layer_seen[DF_MAX_LAYERS] = {0};
    while (getline(&line, &cap, f) > 0) {
        bench_open_ev o; /* read from the text: the model's name is written unescaped */
        if (bench_open_event(line, &o)) {
            s->n_open++;
            int seen = 0;
            for (int i = 0; i < s->n_opens && !seen; i++)
                seen = !strcmp(s->opens[i].model, o.model) && s->opens[i].slot_bytes == o.slot_bytes && s->opens[i].drives == o.drives;
            if (!seen && s->n_opens < 8) s->opens[s->n_opens++] = o;
            if (o.slot_bytes) s->slot_bytes = o.slot_bytes;
            prev_pos = -2;
            continue;
        }
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "ev");
        const char *e = cJSON_IsString(ev) ? ev->valuestring : "";
        double t = jnum(j, "t", 0);
        if (!strcmp(e, "bench_decode")) {
            s->have_bd = 1;
            s->prefill_s = jnum(j, "prefill_s", 0);
            s->prefill_stall_s = jnum(j, "prefill_stall_s", 0);
            s->prefill_tokens = (int)jnum(j, "prefill_tokens", 0);
            s->bd_gbps = jnum(j, "gbps", 0);
            const cJSON *en = cJSON_GetObjectItemCaseSensitive(j, "exact_note");
            if (cJSON_IsString(en)) {
                s->have_exact = 1;
                snprintf(s->exact_note, sizeof s->exact_note, "%s", en->valuestring);
            }
        } else if (!strcmp(e, "spine_stream")) {
            s->have_spine = 1;
            s->spine_wait_s += jnum(j, "wait_s", 0);
            s->spine_bytes += (uint64_t)jnum(j, "bytes", 0);
        } else if (!strcmp(e, "acquire")) {
            int L = (int)jnum(j, "layer", -1);
            const cJSON *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
            if (L >= 0 && L < DF_MAX_LAYERS && cJSON_IsArray(ids)) {
                if (!layer_seen[L]) { layer_seen[L] = 1; s->n_layers_seen++; }
                if (L > s->max_layer) s->max_layer = L;
                const int na = cJSON_GetArraySize(ids);
                if (na > s->max_acquire) s->max_acquire = na;
                for (const cJSON *x = ids->child; x; x = x->next) {
                    if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble >= (1 << 23)) continue;
                    int id = (int)x->valuedouble;
                    if (id > s->max_id) s->max_id = id;
                    if (nk == ck) {
                        ck = ck ? 2 * ck : 4096;
                        uint32_t *nkeys = realloc(keys, ck * sizeof *keys);
                        if (!nkeys) break;
                        keys = nkeys;
                    }
                    keys[nk++] = (uint32_t)L << 23 | (uint32_t)id;
                }
            }
        } else if (!strcmp(e, "token")) {
            int64_t pos = (int64_t)jnum(j, "pos", -1);
            if (pos + 1 > s->total_positions) s->total_positions = (int)(pos + 1);
            if (pos == prev_pos + 1) { /* one decode step */
                s->decode_tokens++;
                s->decode_s += t - prev_t;
                s->stall_s += jnum(j, "stall_ms", 0) / 1e3;
                s->bytes_read += (uint64_t)jnum(j, "bytes_demand", 0) + (uint64_t)jnum(j, "bytes_prefetch", 0);
                s->hits += (uint64_t)jnum(j, "hits", 0);
                s->misses += (uint64_t)jnum(j, "misses", 0);
                double io = 0;
                const cJSON *dr = cJSON_GetObjectItemCaseSensitive(j, "drives");
                for (const cJSON *d = cJSON_IsArray(dr) ? dr->child : NULL; d; d = d->next) {
                    double b = jnum(d, "bytes", 0), g = jnum(d, "gbps", 0);
                    if (b > 0 && g > 0 && b / g / 1e9 > io) io = b / g / 1e9;
                }
                s->io_s += io;
            } else {
                s->prompt_tokens += (int)(pos - (prev_pos < -1 ? -1 : prev_pos));
            }
            prev_pos = pos;
            prev_t = t;
        }
        cJSON_Delete(j);
    }
    free(line);
    fclose(f);
    if (nk) {
        qsort(keys, nk, sizeof *keys, cmp_u32);
        s->distinct = 1;
        for (size_t i = 1; i < nk; i++) s->distinct += keys[i] != keys[i - 1];
    }
    free(keys);
    if (s->decode_tokens == 0) {
        snprintf(err, errlen, "%s: no decode steps (token events one position apart); record one with "
                              "`deltafin bench decode --events FILE` or `deltafin run --events FILE`", path);
        return -1;
    }
    s->ok = 1;
    return 0;
}

/* --from FILE with --model DIR (nat): the events were recorded on a model of its expert shapes, else a message and 1:
 * each recorded run's open event has its expert slot size (bench_open_matches) and the experts the events acquire are
 * within its layers and experts. With open events: bench_trace_verdict (refused naming the model they name; only the
 * name differs: one note line, and 0); without (an older file): a foreign expert is said with the layer and expert
 * counts, else a warning line (its model cannot be checked), and 0. */
static int check_events_model(const char *path, const ev_summary *ev, const df_native *nat, const char *model_arg) {
    const int beyond = ev->max_layer >= 0 && (ev->max_layer >= nat->cfg.num_hidden_layers || ev->max_id >= nat->n_experts);
    if (ev->n_opens) {
        char why[128];
        snprintf(why, sizeof why, "its experts reach layer %d and expert %d, beyond --model's", ev->max_layer, ev->max_id);
        return bench_trace_verdict("project", "--from", path, ev->opens, ev->n_opens, beyond ? why : NULL, nat, model_arg);
    }
    if (beyond) {
        char q[8300];
        fprintf(stderr, "deltafin bench project: --from %s: its experts reach layer %d and expert %d, beyond %s (%d layers, %d "
                        "experts per MoE layer): the events were recorded on another model; record them with this model "
                        "(`deltafin bench decode --model %s --events FILE`) or pass --model the model they were recorded on\n",
                path, ev->max_layer, ev->max_id, nat->name, nat->cfg.num_hidden_layers, nat->n_experts,
                df_shell_quote(model_arg, q, sizeof q));
        return 1;
    }
    bench_trace_unchecked("project", "--from", path, nat);
    return 0;
}

/* The label of a lossy model's results, as cli_exact_note gives it for an open model (the bench decode run's, which
 * its bench_decode line carries), from the manifest of a model that is not opened here: "" when exact. */
static const char *native_exact_note(const df_native *nat) {
    if (nat->exact) return "";
    return !strcmp(nat->spine_mode, "int8") ? " (NOT EXACT: int8 spine)" : " (NOT EXACT: lossy bf16 spine)";
}

/* ------------------------------------------------------------ inputs */

typedef struct {
    double v;
    int set;                   /* 0 unset, 1 given, 2 measured, 3 assumed, 4 from the full model's config */
    char note[240];
} input;

static void in_set(input *x, double v, int how, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void in_set(input *x, double v, int how, const char *fmt, ...) {
    x->v = v;
    x->set = how;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->note, sizeof x->note, fmt, ap);
    va_end(ap);
}

static const char *how_name(int how) {
    static const char *const n[] = {"unset", "given", "measured", "assumed", "config"};
    return n[how < 0 || how > 4 ? 0 : how];
}

static void print_in(const char *name, const input *x, const char *fmt) {
    char v[64];
    snprintf(v, sizeof v, fmt, x->v);
    printf("  %-32s %-18s %-8s %s\n", name, v, how_name(x->set), x->note);
}

/* A flag's value as a number in [lo, hi] (an integer when integer), else a message naming it and -1. */
static int num_arg_as(const char *flag, const char *s, double lo, double hi, int integer, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || v > hi || (integer && v != floor(v))) {
        fprintf(stderr, "deltafin bench project: %s \"%s\": expected %s in [%g, %g]\n", flag, s,
                integer ? "an integer" : "a number", lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}
static int num_arg(const char *flag, const char *s, double lo, double hi, double *out) {
    return num_arg_as(flag, s, lo, hi, 0, out);
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin bench project --drives N --gbps B [--arch kimi_k3|kimi_k2]\n"
            "       [--from EVENTS.jsonl [--model DIR]] | [--model DIR [--tokens N] [--ram-budget SIZE] ...]\n"
            "       [--hit-rate H] [--read-ratio R] [--compute-ms-per-layer C] [--stall S] [--coverage C]\n"
            "       [--prompt-tokens T (512)] [--prefill-ms-per-layer-token P] [--bytes-per-token X]\n"
            "       [--layers L] [--moe-layers M] [--experts E] [--top-k K] [--expert-bytes S]\n"
            "  Projects decode tok/s and the TTFT of a T-token prompt of the FULL model (default kimi_k3: 93 layers,\n"
            "  92 MoE layers, top-16 of 896 experts of 17.5 MB) on N drives of B GB/s each (B: what one drive\n"
            "  achieves at the engine's reads; `deltafin bench io`), from per-token figures measured on a smaller\n"
            "  model or given here. Prints every input (config / given / measured / assumed), each formula, the results\n"
            "  (labeled NOT EXACT when measured on a lossy model: int8 or lossy bf16 spine, as run --stats labels them).\n"
            "  --from FILE        events of `bench decode --events FILE` or `run --events FILE`: hit rate, read/needed\n"
            "                     ratio, compute ms per layer, stall, expert coverage (with --model DIR: that model's\n"
            "                     layer and expert counts; events of other expert shapes are refused, another model\n"
            "                     name alone is a note; else inferred from the events). Waits for streamed spine\n"
            "                     layers (a spine larger than the --ram-budget) are I/O, not compute: `bench decode\n"
            "                     --events` records them, `run --events` not\n"
            "  --model DIR        without --from: runs `bench decode --model DIR --events TMP` first (--tokens N (16),\n"
            "                     --ram-budget, --threads, --io-seconds, --prompt-ids, --qd, --expert-dirs, --no-drop\n"
            "                     are passed on); a Hugging Face DIR is converted once into the conversion cache\n"
            "                     (with or without --from; --cache-dir DIR: where, default $XDG_CACHE_HOME/deltafin)\n"
            "  --hit-rate H       expert cache hit rate h (default: measured, else 0 = cold)\n"
            "  --read-ratio R     expert bytes read / bytes needed (default: measured, else 1 - h)\n"
            "  --compute-ms-per-layer C  compute per layer per token, I/O stall and spine-streaming waits excluded\n"
            "                     (default: measured, else 0)\n"
            "  --stall S          exposed-I/O fraction: stall time / expert read time (0 = reads hidden behind\n"
            "                     compute, 1 = not at all; default: measured, else not used)\n"
            "  --coverage C       fraction of all experts a T-token prompt touches (default: from the measured\n"
            "                     coverage, else uniform routing 1 - (1 - top_k/experts)^T)\n"
            "  --prefill-ms-per-layer-token P  prefill compute per layer per prompt token (default C: no batching gain)\n"
            "  --bytes-per-token X  expert bytes one token needs before hits (default moe_layers * top_k * expert_bytes)\n");
}

typedef int (*decode_fn)(int argc, char **argv);

/* `deltafin bench project ...` (argv[0] is the first option); decode runs `bench decode` for --model. */
int bench_project(int argc, char **argv, decode_fn decode) {
    const char *arch_name = "kimi_k3", *from = NULL, *model = NULL, *cache_dir = NULL;
    double drives = 0, gbps = 0, prompt_t = 512;
    input h = {0}, rr = {0}, cms = {0}, stall = {0}, cov = {0}, pms = {0}, bpt = {0};
    input L = {0}, M = {0}, E = {0}, K = {0}, S = {0};
    const char *pass[20];
    int npass = 0, tokens = 16;
    int tokens_set = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--no-drop")) { if (npass < 20) pass[npass++] = a; continue; }
        static const char *const vals[] = {"--arch", "--from", "--model", "--drives", "--gbps", "--prompt-tokens", "--tokens",
                                           "--ram-budget", "--threads", "--io-seconds", "--prompt-ids", "--qd", "--expert-dirs",
                                           "--cache-dir",
                                           "--hit-rate", "--read-ratio", "--compute-ms-per-layer", "--stall", "--coverage",
                                           "--prefill-ms-per-layer-token", "--bytes-per-token", "--layers", "--moe-layers",
                                           "--experts", "--top-k", "--expert-bytes", NULL};
        static const char *const bench_flags[] = {"--help", "--no-drop", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench project", a, vals, bench_flags);
        if (!v) {
            fprintf(stderr, "deltafin bench project: %s needs a value (see --help)\n", a);
            return 2;
        }
        if (cli_repeated_at("bench project", argc, argv, i, vals, NULL)) return 2;
        double x;
        i++;
#define NUM(flag, lo, hi, dst, extra)                                                       \
        if (!strcmp(a, flag)) {                                                              \
            if (num_arg(flag, v, lo, hi, &x)) return 2;                                       \
            in_set(dst, x, 1, "%s", extra);                                                   \
            continue;                                                                         \
        }
        if (!strcmp(a, "--arch")) { arch_name = v; continue; }
        if (!strcmp(a, "--from")) { from = v; continue; }
        if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench project", v)) return 2; cache_dir = v; continue; }
        if (!strcmp(a, "--model")) { model = v; continue; }
        if (!strcmp(a, "--drives")) {
            if (num_arg_as(a, v, 1, 64, 1, &drives)) return 2;
            continue;
        }
        if (!strcmp(a, "--gbps")) { if (num_arg(a, v, 1e-6, 1e4, &gbps)) return 2; continue; }
        if (!strcmp(a, "--prompt-tokens")) { if (num_arg(a, v, 1, 1 << 24, &prompt_t)) return 2; continue; }
        if (!strcmp(a, "--tokens")) { double t; if (num_arg(a, v, 1, 1 << 20, &t)) return 2; tokens = (int)t; tokens_set = 1; continue; }
        if (!strcmp(a, "--ram-budget") || !strcmp(a, "--threads") || !strcmp(a, "--io-seconds") || !strcmp(a, "--prompt-ids") ||
            !strcmp(a, "--qd") || !strcmp(a, "--expert-dirs")) {
            if (npass < 19) { pass[npass++] = a; pass[npass++] = v; }
            continue;
        }
        NUM("--hit-rate", 0, 1, &h, "(--hit-rate)")
        NUM("--read-ratio", 0, 1e3, &rr, "(--read-ratio)")
        NUM("--compute-ms-per-layer", 0, 1e7, &cms, "(--compute-ms-per-layer)")
        NUM("--stall", 0, 1, &stall, "(--stall)")
        NUM("--coverage", 0, 1, &cov, "(--coverage)")
        NUM("--prefill-ms-per-layer-token", 0, 1e7, &pms, "(--prefill-ms-per-layer-token)")
        NUM("--bytes-per-token", 1, 1e16, &bpt, "(--bytes-per-token)")
        NUM("--layers", 1, 4096, &L, "(--layers)")
        NUM("--moe-layers", 1, 4096, &M, "(--moe-layers)")
        NUM("--experts", 1, 1 << 20, &E, "(--experts)")
        NUM("--top-k", 1, 4096, &K, "(--top-k)")
        NUM("--expert-bytes", 1, 1e13, &S, "(--expert-bytes)")
#undef NUM
        return cli_unknown_option("bench project", a, vals, bench_flags);
    }
    const proj_arch *A = NULL;
    for (size_t i = 0; i < sizeof ARCHES / sizeof *ARCHES; i++)
        if (!strcmp(arch_name, ARCHES[i].name)) A = &ARCHES[i];
    if (!A) { fprintf(stderr, "deltafin bench project: --arch %s: expected kimi_k3 or kimi_k2\n", arch_name); return 2; }
    if (drives < 1 || gbps <= 0) {
        fprintf(stderr, "deltafin bench project: --drives N and --gbps B (GB/s per drive) are required\n");
        return 2;
    }
    if ((npass || tokens_set) && (!model || from)) {
        fprintf(stderr, "deltafin bench project: --tokens, --ram-budget, --threads, --io-seconds, --prompt-ids, --qd, "
                        "--expert-dirs, --no-drop are for the bench decode run of --model DIR (without --from)\n");
        return 2;
    }
    if (cache_dir && !model) { fprintf(stderr, "deltafin bench project: --cache-dir needs --model DIR\n"); return 2; }
    /* a Hugging Face checkpoint: converted once into the conversion cache (as the bench decode run and run do), then
     * used as that native model (its manifest's layer and expert counts) */
    char conv_dir[4096];
    const char *model_arg = model; /* as given (a Hugging Face directory is replaced by its conversion) */
    const int from_given = from != NULL; /* events recorded elsewhere, not by the bench decode run here */
    if (model && bench_native_model("project", &model, cache_dir, conv_dir, sizeof conv_dir, NULL, 0)) return 1;

    /* ---- measure: a bench decode run (--model without --from), then its events */
    char tmp_events[128] = "";
    if (model && !from) {
        snprintf(tmp_events, sizeof tmp_events, "/tmp/df_bench_project_%d.jsonl", (int)getpid());
        tmp_events_guard(tmp_events); /* before the decode run creates it */
        char tok[16];
        snprintf(tok, sizeof tok, "%d", tokens);
        char *dv[32];
        int dn = 0;
        dv[dn++] = "--model"; dv[dn++] = (char *)model;
        dv[dn++] = "--events"; dv[dn++] = tmp_events;
        dv[dn++] = "--tokens"; dv[dn++] = tok;
        for (int i = 0; i < npass; i++) dv[dn++] = (char *)pass[i];
        dv[dn] = NULL;
        printf("bench project: measuring with `deltafin bench decode --model %s --events %s --tokens %d", model, tmp_events, tokens);
        for (int i = 0; i < npass; i++) printf(" %s", pass[i]);
        printf("`\n");
        fflush(stdout);
        int rc = decode(dn, dv);
        if (rc) {
            tmp_events_done();
            fprintf(stderr, "deltafin bench project: the bench decode run failed (exit %d); give the inputs instead "
                            "(--hit-rate, --compute-ms-per-layer, ...)\n", rc);
            return 1;
        }
        from = tmp_events;
    }
    ev_summary ev = {0};
    char err[2048] = "";
    if (from && read_events(from, &ev, err, sizeof err)) {
        fprintf(stderr, "deltafin bench project: %s\n", err);
        tmp_events_done();
        return 1;
    }
    tmp_events_done();
    /* the measured model's geometry: from its manifest when we have it, else from the events */
    int m_layers = 0, m_experts = 0, m_moe = 0, m_hidden = 0, m_topk = 0;
    const char *topk_src = "events";
    const char *geom = "events";
    /* the NOT EXACT label of the result line: what the bench decode run said (its bench_decode line), else the
     * manifest of --model; NULL = not known (the events of `run --events` without --model) */
    const char *exact = ev.have_exact ? ev.exact_note : NULL;
    if (model) {
        df_native *nat = NULL;
        if (native_open(&nat, model, err, sizeof err) == 0) {
            if (from_given && ev.ok && check_events_model(from, &ev, nat, model_arg)) {
                native_close(nat);
                return 1;
            }
            if (!exact) exact = native_exact_note(nat);
            m_layers = nat->cfg.num_hidden_layers;
            m_experts = nat->n_experts;
            m_moe = nat->n_moe_layers;
            m_hidden = nat->cfg.hidden_size;
            m_topk = nat->cfg.num_experts_per_tok;
            topk_src = "config";
            if (!ev.slot_bytes) ev.slot_bytes = nat->stride;
            geom = "manifest";
            native_close(nat);
        } else if (ev.ok) {
            fprintf(stderr, "deltafin bench project: note: %s (layer and expert counts taken from the events)\n", err);
        }
    }
    if (ev.ok && !m_layers) {
        m_layers = ev.max_layer + 1;      /* the last layer is a MoE layer in these models */
        m_moe = ev.n_layers_seen;
        m_experts = ev.max_id + 1;        /* a lower bound: the largest expert id seen */
    }
    if (ev.ok && !m_topk) m_topk = ev.max_acquire; /* the widest acquire: top-k (a batch's union of them) */

    /* ---- the projected model */
    uint64_t stride = expert_stride(DF_W_MXFP4, A->moe_inter, A->width);
    if (!L.set) in_set(&L, A->layers, 4, "%s", A->what);
    if (!M.set) in_set(&M, L.v - A->dense, 4, "layers - %d dense", A->dense);
    if (!E.set) in_set(&E, A->experts, 4, "routed experts per MoE layer");
    if (!K.set) in_set(&K, A->top_k, 4, "experts per token per MoE layer");
    if (!S.set)
        in_set(&S, (double)stride, 4, "gate, up [%d, %d] + down [%d, %d] mxfp4 with scales, 4 KiB stride (%.2f MB)",
               A->moe_inter, A->width, A->width, A->moe_inter, stride / 1e6);
    if (!bpt.set) in_set(&bpt, M.v * K.v * S.v, 4, "= moe_layers * top_k * expert_bytes (before hits)");
    double bank = M.v * E.v * S.v;

    /* ---- measured figures (flags given win) */
    double m_h = 0, m_rr = 0, m_cms = 0, m_stall_wall = 0, m_exposed = -1, m_cov = -1, need = 0;
    if (ev.ok) {
        uint64_t acq = ev.hits + ev.misses;
        m_h = acq ? (double)ev.hits / acq : 0;
        need = (double)acq * ev.slot_bytes;
        m_rr = need > 0 ? ev.bytes_read / need : 0;
        /* compute: the decode time less the waits for expert reads (stall) and for streamed spine layers */
        const double sp_wait = ev.spine_wait_s, comp_s = ev.decode_s - ev.stall_s - sp_wait;
        m_cms = m_layers ? 1e3 * comp_s / ev.decode_tokens / m_layers : 0;
        if (m_cms < 0) m_cms = 0;
        m_stall_wall = ev.decode_s > 0 ? ev.stall_s / ev.decode_s : 0;
        if (ev.io_s > 0) m_exposed = fmin(1.0, ev.stall_s / ev.io_s);
        if (m_moe > 0 && m_experts > 0) m_cov = (double)ev.distinct / ((double)m_moe * m_experts);
        const char *src = model ? model : from;
        printf("bench project: measured on %s (%d layers, %d MoE, %d experts per layer [%s]; %d decode tokens, "
               "%d prompt tokens):\n", src, m_layers, m_moe, m_experts, geom, ev.decode_tokens, ev.prompt_tokens);
        char sp_part[64] = "";
        if (sp_wait > 0) snprintf(sp_part, sizeof sp_part, ", spine-streaming wait %.2f", 1e3 * sp_wait / ev.decode_tokens);
        printf("  expert bytes per token after hits %.1f MB (needed %.1f MB before hits), hit rate %.4f, "
               "%.2f ms per token (compute %.2f, stall %.2f%s), stall / decode time %.3f\n",
               ev.bytes_read / 1e6 / ev.decode_tokens, need / 1e6 / ev.decode_tokens, m_h,
               1e3 * ev.decode_s / ev.decode_tokens, 1e3 * comp_s / ev.decode_tokens,
               1e3 * ev.stall_s / ev.decode_tokens, sp_part, m_stall_wall);
        if (ev.have_spine && ev.spine_bytes)
            printf("  spine streaming (the spine did not fit the budget): %.1f MB of spine layers read per token, %.2f ms per "
                   "token waiting for them (%.3f s in all): I/O, not counted as compute\n",
                   ev.spine_bytes / 1e6 / ev.decode_tokens, 1e3 * sp_wait / ev.decode_tokens, sp_wait);
        else if (!ev.have_spine)
            printf("  note: these events do not record waits for streamed spine layers (`run --events`): had the spine been "
                   "streamed (larger than --ram-budget), they count as compute here; `bench decode --events` records them\n");
        if (!exact)
            printf("  note: these events do not say whether the model is exact (`run --events`): with --model DIR a lossy "
                   "model's result is labeled NOT EXACT\n");
        if (ev.have_bd)
            printf("  prefill %d tokens in %.2f s (stall %.2f s); drive bandwidth of that run (bench io) %.3f GB/s\n",
                   ev.prefill_tokens, ev.prefill_s, ev.prefill_stall_s, ev.bd_gbps);
        if (m_hidden && m_hidden != 7168)
            printf("  note: the measured model has hidden size %d; its compute per layer does not carry over to "
                   "the full model's 7168\n", m_hidden);
        if (!h.set) in_set(&h, m_h, 2, "hits / acquisitions over %d decode tokens", ev.decode_tokens);
        if (!rr.set && need > 0)
            in_set(&rr, m_rr, 2, "bytes read / needed = %.1f / %.1f MB per token (prefetch reads included)",
                   ev.bytes_read / 1e6 / ev.decode_tokens, need / 1e6 / ev.decode_tokens);
        if (!cms.set)
            in_set(&cms, m_cms, 2, "(decode time - stall%s) / tokens / %d layers", sp_wait > 0 ? " - spine-streaming wait" : "",
                   m_layers);
        if (!pms.set && ev.have_bd && ev.prefill_tokens > 1 && m_layers)
            in_set(&pms, fmax(0, 1e3 * (ev.prefill_s - ev.prefill_stall_s) / ev.prefill_tokens / m_layers), 2,
                   "(prefill time - stall) / %d prompt tokens / %d layers (batching gain at %g tokens not included)",
                   ev.prefill_tokens, m_layers, prompt_t);
        if (!stall.set && m_exposed >= 0)
            in_set(&stall, m_exposed, 2, "stall %.3f s / expert read time %.3f s (drive busy time)", ev.stall_s, ev.io_s);
        if (!cov.set && m_cov >= 0) {
            double t_m = ev.total_positions > 0 ? ev.total_positions : 1;
            double c = m_cov >= 1 ? 1 : 1 - pow(1 - m_cov, prompt_t / t_m);
            in_set(&cov, c, 3, "= 1 - (1 - %.4f)^(%g / %g): measured coverage %.4f over %g tokens, tokens independent",
                   m_cov, prompt_t, t_m, m_cov, t_m);
        }
    }
    /* a measured hit rate of a run whose routed experts never missed says nothing about the projected model. Top-k
     * covering every expert (each token needs the whole bank, which then stays cached): refused. No expert bytes read
     * at all (the bank fit the budget, e.g. a small model without --ram-budget, as documented runs do): a warning
     * line, and the storage bound is said as none (not inf) */
    if (ev.ok && (h.set == 2 || rr.set == 2)) {
        const int covers = m_experts > 0 && m_topk >= m_experts;
        const int no_reads = ev.hits + ev.misses > 0 && ev.misses == 0 && ev.bytes_read == 0;
        char why[256];
        if (covers) /* under a budget smaller than the bank it misses, cycling through the bank: no better */
            snprintf(why, sizeof why, "its top-k %d covers every one of its %d routed experts per MoE layer [top-k: %s]: "
                     "every token needs the whole expert bank", m_topk, m_experts, topk_src);
        else
            snprintf(why, sizeof why, "no expert bytes were read in its %d decode steps (all %llu expert acquisitions hit: "
                     "its expert bank fit the budget)", ev.decode_tokens, (unsigned long long)(ev.hits + ev.misses));
        if (covers || no_reads)
            fprintf(stderr, "deltafin bench project: %s%s%s; so its hit rate %.4f (read ratio %.4f) says nothing about %s "
                            "(top-%d of %.0f experts)%s. Measure on a model whose experts are larger than the budget, e.g. "
                            "`deltafin synth DIR` (its defaults) and `deltafin bench project --model DIR --ram-budget SIZE` "
                            "with SIZE smaller than its experts, or give --hit-rate H and --read-ratio R\n",
                    covers ? "" : "warning: ", ev.misses == 0 ? "the measured model's routed experts never missed: " : "",
                    why, m_h, m_rr, A->name, (int)K.v, E.v,
                    covers ? "" : "; the decode projection below counts no expert reads (t_io 0)");
        if (covers) return 1;
    }
    if (!h.set) in_set(&h, 0, 3, "cold: no expert cache");
    if (!rr.set) in_set(&rr, 1 - h.v, 3, "= 1 - h (no prefetch read wasted)");
    if (!cms.set) in_set(&cms, 0, 3, "compute not counted: I/O bound only");
    if (!cov.set)
        in_set(&cov, 1 - pow(1 - K.v / E.v, prompt_t), 3, "= 1 - (1 - top_k/experts)^T: uniform, independent routing");
    if (!pms.set) in_set(&pms, cms.v, 3, "= compute_ms_per_layer (no batching gain: an upper bound)");

    /* ---- results */
    double bw = drives * gbps * 1e9;
    double t_io = rr.v * bpt.v / bw, t_c = cms.v * 1e-3 * L.v;
    double tps_ov = 1 / fmax(t_io, t_c), tps_no = 1 / (t_io + t_c);
    double tps_s = stall.set ? 1 / fmax(t_io, t_c + stall.v * t_io) : 0;
    double ubytes = cov.v * bank, tp_io = ubytes / bw, tp_c = prompt_t * L.v * pms.v * 1e-3;
    double ttft_ov = fmax(tp_io, tp_c), ttft_no = tp_io + tp_c;
    if (!(t_io > 0) && !(t_c > 0)) { /* a token would cost nothing: no projection (the result line would say inf) */
        fprintf(stderr, "deltafin bench project: a decode step projects to 0 s (no expert bytes read: hit rate %g, read ratio "
                        "%g; and no compute: compute_ms_per_layer %g): give --compute-ms-per-layer, or a hit rate below 1\n",
                h.v, rr.v, cms.v);
        return 2;
    }

    printf("bench project: %s on %g drive%s x %g GB/s\n", A->name, drives, drives == 1 ? "" : "s", gbps);
    printf("inputs:                            value              source   note\n");
    print_in("layers", &L, "%.0f");
    print_in("moe_layers", &M, "%.0f");
    print_in("experts", &E, "%.0f");
    print_in("top_k", &K, "%.0f");
    print_in("expert_bytes", &S, "%.0f");
    print_in("bytes_per_token", &bpt, "%.0f");
    input in_n = {drives, 1, "--drives"}, in_b = {gbps, 1, "--gbps: GB/s per drive (1e9 bytes/s)"};
    print_in("N (drives)", &in_n, "%.0f");
    print_in("B (GB/s per drive)", &in_b, "%.3f");
    print_in("h (hit rate)", &h, "%.4f");
    print_in("r (read ratio)", &rr, "%.4f");
    print_in("compute_ms_per_layer", &cms, "%.3f");
    if (stall.set) print_in("s (exposed-I/O fraction)", &stall, "%.4f");
    input in_t = {prompt_t, 1, "--prompt-tokens (default 512)"};
    print_in("T (prompt tokens)", &in_t, "%.0f");
    print_in("coverage(T)", &cov, "%.5f");
    print_in("prefill_ms_per_layer_token", &pms, "%.3f");
    printf("decode:\n");
    printf("  t_io      = r * bytes_per_token / (N*B) = %.4f * %.0f / %.4g = %.4f s\n", rr.v, bpt.v, bw, t_io);
    printf("  t_compute = compute_ms_per_layer * layers = %.3f ms * %.0f = %.4f s\n", cms.v, L.v, t_c);
    printf("  decode tok/s = 1 / max(t_io, t_compute) = %.4f   (reads fully overlapped with compute)\n", tps_ov);
    printf("  decode tok/s = 1 / (t_io + t_compute)   = %.4f   (no overlap)\n", tps_no);
    if (stall.set)
        printf("  decode tok/s = 1 / max(t_io, t_compute + s * t_io) = %.4f   (s = %.4f of the reads exposed)\n", tps_s, stall.v);
    if (t_io > 0)
        printf("  storage bound (compute free) = (N*B) / (r * bytes_per_token) = %.4f tok/s\n", 1 / t_io);
    else /* r = 0 (given): no expert bytes read, no bound (not inf) */
        printf("  storage bound (compute free): none, r = 0: no expert bytes read\n");
    printf("prefill of T = %.0f tokens, expert-major (each touched expert read once per layer):\n", prompt_t);
    printf("  union_bytes = coverage(T) * moe_layers * experts * expert_bytes = %.5f * %.0f = %.4g bytes\n", cov.v, bank, ubytes);
    printf("  t_io_prefill      = union_bytes / (N*B) = %.2f s\n", tp_io);
    printf("  t_compute_prefill = T * layers * prefill_ms_per_layer_token = %.0f * %.0f * %.3f ms = %.2f s\n", prompt_t, L.v,
           pms.v, tp_c);
    printf("  TTFT = max(t_io_prefill, t_compute_prefill) = %.2f s   (overlapped)\n", ttft_ov);
    printf("  TTFT = t_io_prefill + t_compute_prefill     = %.2f s   (no overlap)\n", ttft_no);
    printf("result: decode_tok_s=%.4f decode_tok_s_no_overlap=%.4f", tps_ov, tps_no);
    if (stall.set) printf(" decode_tok_s_stall=%.4f", tps_s);
    /* a lossy model's measured figures: labeled as run --stats and the other bench results label theirs */
    printf(" ttft_s=%.2f ttft_s_no_overlap=%.2f t_io_s=%.4f t_compute_s=%.4f%s\n", ttft_ov, ttft_no, t_io, t_c,
           ev.ok && exact ? exact : "");
    return 0;
}
