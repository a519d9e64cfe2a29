/*
 * bench_batch.c — `deltafin bench batch`: aggregate decode speed of S sequences decoding together
 * (df_eval_batch: one row per sequence per forward pass, each expert a layer needs read once for all
 * of them) for each S of --seqs, cold (the model's files evicted from the page cache, model reopened) under --ram-budget.
 * Per S: aggregate tok/s (S x tokens / decode time), expert bytes read per generated token, hit rate,
 * and the storage bound B / (expert bytes read per token) with B from the I/O benchmark on the same
 * packs (mean of before and after); also each S's aggregate against the single-sequence storage bound
 * B / (bytes per token at S = 1), and whether sequence 0 (the same prompt at every S) generated the same
 * tokens at every S (batching never changes a sequence's output).
 */
#define _GNU_SOURCE
#include "bench_common.h"
#include "cli.h"
#include "deltafin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { MAX_SEQS = 64, MAX_RUNS = 16 };

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin bench batch [--model DIR] [--ram-budget SIZE] [--seqs 1,2,4,8] [--tokens N (16)]\n"
               "       [--prompt N (8)] [--threads N] [--seed N (1)] [--io-seconds S (5)] [--qd N (16)] [--no-drop]\n"
               "       [--backend auto|cpu|cpu-scalar|cpu-avx2|cpu-avx512|cuda] [--gpu-budget SIZE] [--cache-dir DIR]\n"
               "  For each S of --seqs: S sequences (random prompts of N tokens, seeded; sequence 0's is the same at\n"
               "  every S) prefilled in one batch, then --tokens greedy decode steps of S rows each in one forward pass;\n"
               "  cold (model reopened, its files evicted from the page cache). Prints aggregate tok/s, expert bytes read per generated\n"
               "  token, hit rate, the storage bound B / bytes-per-token and the speed-up over S = 1.\n"
               "  --qd N: expert reads in flight per drive, for the store (as `run --io-depth`) and the I/O benchmark.\n"
               "  --model DIR: a native model, or a Hugging Face checkpoint converted once into the conversion cache\n"
               "  (default: the installed default model, else the embedded models/kimi-mini, as `deltafin run`).\n"
               "  --cache-dir DIR: where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n");
}

static int parse_list(const char *s, int *out, int cap) {
    int n = 0;
    for (const char *p = s;;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_SEQS || n == cap || (*end && *end != ',')) return -1;
        out[n++] = (int)v;
        if (!*end) return n;
        p = end + 1;
    }
}

static uint64_t next_rand(uint64_t *r) {
    *r ^= *r >> 12;
    *r ^= *r << 25;
    *r ^= *r >> 27;
    return *r * 0x2545F4914F6CDD1Dull >> 33;
}

typedef struct {
    int S;
    double tps, decode_s, stall_s, read_per_tok, hit, bound, share;
    double phase_s[DF_PHASES];
    int32_t seq0[4096];
    int n_seq0;
    const char *exact; /* cli_exact_note of the model */
} run_result;

/* One S: open cold, prefill S prompts in one batch, `tokens` batched greedy steps. 0 or a DF_E* code. */
static int run_one(const char *model, uint64_t budget, const char *backend, uint64_t gpu_budget, int threads, int qd, int S,
                   int tokens, int prompt, uint64_t seed, int nodrop, run_result *out, char *err, size_t errlen) {
    if (!nodrop) bench_drop_caches(model, NULL); /* the packs of a model converted with --expert-dirs: evicted by the caller once */
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.ram_budget = budget;
    mo.threads = threads;
    mo.kv_positions = prompt + tokens + 1;
    mo.n_seq = S;
    mo.backend = backend;
    mo.gpu_budget = gpu_budget;
    mo.io_depth = qd; /* the store reads at the depth B is measured at */
    mo.heat_path = "off"; /* every S starts from the same empty cache */
    df_model *m = NULL;
    int rc = df_model_open(&m, model, &mo, err, errlen);
    if (rc) return rc;
    const int V = df_model_n_vocab(m);
    out->exact = cli_exact_note(m);
    df_session *ss[MAX_SEQS] = {0};
    int32_t *ids[MAX_SEQS] = {0}, tok[MAX_SEQS];
    const int32_t *row[MAX_SEQS];
    int n[MAX_SEQS];
    float *logits = malloc(sizeof(float) * (size_t)S * V);
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    df_sampler *smp = df_sampler_new(&so); /* greedy: no state */
    if (!logits || !smp) { rc = DF_ENOMEM; snprintf(err, errlen, "out of memory"); goto out; }
    for (int i = 0; i < S && !rc; i++) {
        rc = df_session_new(&ss[i], m, prompt + tokens + 1, err, errlen);
        ids[i] = malloc(sizeof(int32_t) * (size_t)prompt);
        if (!rc && !ids[i]) { rc = DF_ENOMEM; snprintf(err, errlen, "out of memory"); }
        uint64_t r = (seed + (uint64_t)i) * 0x9E3779B97F4A7C15ull + 1;
        for (int t = 0; !rc && t < prompt; t++) ids[i][t] = (int32_t)(next_rand(&r) % (uint64_t)V);
        row[i] = ids[i];
        n[i] = prompt;
    }
    if (!rc) rc = df_eval_batch(ss, row, n, S, logits, 0, err, errlen);
    for (int i = 0; i < S && !rc; i++) {
        tok[i] = df_sample(smp, logits + (size_t)i * V, V);
        row[i] = &tok[i];
        n[i] = 1;
    }
    df_model_stats_reset(m);
    out->S = S;
    out->n_seq0 = 0;
    for (int t = 0; t < tokens && !rc; t++) {
        if (out->n_seq0 < 4096) out->seq0[out->n_seq0++] = tok[0];
        rc = df_eval_batch(ss, row, n, S, logits, 0, err, errlen);
        for (int i = 0; i < S && !rc; i++) tok[i] = df_sample(smp, logits + (size_t)i * V, V);
    }
    if (!rc) {
        df_stats st;
        df_model_stats(m, &st);
        const uint64_t acq = st.expert_hits + st.expert_misses, gen = st.decode_tokens;
        out->decode_s = st.decode_s;
        out->tps = st.decode_s > 0 ? gen / st.decode_s : 0;
        out->stall_s = st.io_stall_s;
        out->read_per_tok = gen ? (double)(st.expert_bytes_demand + st.expert_bytes_prefetch + st.spine_bytes_streamed) / gen : 0;
        out->hit = acq ? (double)st.expert_hits / acq : 0;
        out->share = st.routed_union ? (double)st.routed_picks / st.routed_union : 0;
        for (int p = 0; p < DF_PHASES; p++) out->phase_s[p] = st.phase_s[p];
    }
out:
    for (int i = 0; i < S; i++) { df_session_free(ss[i]); free(ids[i]); }
    free(logits);
    df_sampler_free(smp);
    df_model_close(m);
    return rc;
}

int bench_batch(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL;
    uint64_t budget = 0;
    int seqs[MAX_RUNS] = {1, 2, 4, 8}, n_runs = 4, tokens = 16, prompt = 8, threads = 0, qd = 16, nodrop = 0;
    uint64_t seed = 1;
    double io_seconds = 5;
    const char *backend = cli_default_backend();
    uint64_t gpu_budget = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--no-drop")) { nodrop = 1; continue; }
        static const char *const vals[] = {"--model", "--backend", "--gpu-budget", "--ram-budget", "--seqs", "--tokens", "--prompt",
                                           "--threads", "--seed", "--qd", "--io-seconds", "--cache-dir", NULL};
        static const char *const bench_flags[] = {"--help", "--no-drop", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench batch", a, vals, bench_flags);
        if (!v) { fprintf(stderr, "deltafin bench batch: %s needs a value (see --help)\n", a); return 2; }
        if (cli_repeated_at("bench batch", argc, argv, i, vals, NULL)) return 2;
        char *end = NULL;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench batch", v)) return 2; cache_dir = v; }
        else if (!strcmp(a, "--backend")) {
            if (cli_check_backend("bench batch", v)) return 2;
            backend = v;
        } else if (!strcmp(a, "--gpu-budget")) {
            if (cli_parse_size(v, &gpu_budget)) { fprintf(stderr, "deltafin bench batch: --gpu-budget '%s': expected a size like 8G\n", v); return 2; }
        }
        else if (!strcmp(a, "--ram-budget")) {
            if (cli_parse_budget("bench batch", a, v, &budget)) return 2;
        } else if (!strcmp(a, "--seqs")) {
            if ((n_runs = parse_list(v, seqs, MAX_RUNS)) < 0) {
                fprintf(stderr, "deltafin bench batch: --seqs '%s': expected up to %d comma-separated counts in [1, %d]\n", v, MAX_RUNS, MAX_SEQS);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_seed("bench batch", a, v, &seed)) return 2;
        } else if (!strcmp(a, "--tokens") || !strcmp(a, "--prompt") || !strcmp(a, "--threads") || !strcmp(a, "--qd")) {
            long x = strtol(v, &end, 10);
            const long lo = !strcmp(a, "--threads") ? 0 : 1,
                       hi = !strcmp(a, "--qd") ? 1024 : !strcmp(a, "--tokens") ? 4096 : 1 << 20;
            if (!*v || *end || x < lo || x > hi) {
                fprintf(stderr, "deltafin bench batch: %s '%s': expected an integer in [%ld, %ld]\n", a, v, lo, hi);
                return 2;
            }
            if (!strcmp(a, "--tokens")) tokens = (int)x;
            else if (!strcmp(a, "--prompt")) prompt = (int)x;
            else if (!strcmp(a, "--threads")) threads = (int)x;
            else qd = (int)x;
        } else if (!strcmp(a, "--io-seconds")) {
            io_seconds = strtod(v, &end);
            if (!*v || *end || !(io_seconds > 0 && io_seconds < 86400)) { fprintf(stderr, "deltafin bench batch: --io-seconds '%s': expected seconds > 0\n", v); return 2; }
        } else return cli_unknown_option("bench batch", a, vals, bench_flags);
        i++;
    }
    if (cli_check_env_aliases("bench batch", backend, 0, 0)) return 2;
    char dflt_dir[4096], dflt_how[4600] = "", conv_dir[4096], conv_how[4700] = "", err[2048] = "";
    if (!model) { /* the default model, as bench decode */
        if (cli_default_model("bench batch", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    df_native *nat = NULL;
    /* a Hugging Face checkpoint is converted once into the conversion cache, as for bench decode / prefill */
    int rc = bench_native_model("batch", &model, cache_dir, conv_dir, sizeof conv_dir, dflt_how[0] ? dflt_how : conv_how,
                                dflt_how[0] ? sizeof dflt_how : sizeof conv_how);
    if (rc) return rc;
    if (dflt_how[0] || conv_how[0]) fprintf(stderr, "bench batch: model %s (%s)\n", model, dflt_how[0] ? dflt_how : conv_how);
    rc = native_open(&nat, model, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench batch: %s\n", err); return 1; }
    if (nat->n_moe_layers == 0) { fprintf(stderr, "deltafin bench batch: %s has no routed experts\n", model); native_close(nat); return 1; }
    const uint64_t stride = nat->stride, bank = (uint64_t)nat->n_moe_layers * nat->n_experts * nat->stride;
    const int top_k = nat->cfg.num_experts_per_tok;
    char dirs[4096];
    bench_pack_dirs(nat, dirs, sizeof dirs);
    native_close(nat);
    char bstr[32] = "unlimited";
    if (budget) snprintf(bstr, sizeof bstr, "%.3f GiB", budget / 1073741824.0);
    const int root_drop = nodrop ? 0 : bench_drop_caches(model, dirs);
    printf("bench batch: %s, ram budget %s (routed experts %.3f GiB), prompt %d, %d decode steps per S, page cache %s\n", model,
           bstr, bank / 1073741824.0, prompt, tokens,
           root_drop ? "the model's files evicted before each S" : (nodrop ? "kept (--no-drop)" : "NOT evicted (a directory could not be read): numbers may be warm"));
    store_bench_opts bo;
    bench_expert_io_opts(&bo, dirs, qd, stride, top_k, io_seconds);
    store_bench_result b1, b2;
    rc = store_bench_io(&bo, &b1, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench batch: I/O benchmark: %s\n", err); return 1; }
    run_result *res = calloc((size_t)n_runs, sizeof *res);
    if (!res) return 1;
    for (int k = 0; k < n_runs && !rc; k++) {
        rc = run_one(model, budget, backend, gpu_budget, threads, qd, seqs[k], tokens, prompt, seed, nodrop, &res[k], err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin bench batch: S = %d: %s\n", seqs[k], err); break; }
        printf("  S=%d: %.3f tok/s aggregate (%.3f per sequence) over %d tokens in %.2f s, io stall %.2f s, "
               "expert+spine bytes read %.1f MB/token, hit rate %.3f, rows per expert read %.2f%s\n",
               seqs[k], res[k].tps, res[k].tps / seqs[k], seqs[k] * tokens, res[k].decode_s, res[k].stall_s,
               res[k].read_per_tok / 1e6, res[k].hit, res[k].share, res[k].exact);
        printf("       phases:");
        int shown = 0;
        for (int p = 0; p < DF_PHASES; p++)
            if (res[k].phase_s[p] >= 0.005) shown = printf(" %s %.2f s", df_phase_name(p), res[k].phase_s[p]);
        printf("%s\n", shown ? "" : " each under 5 ms");
        fflush(stdout);
    }
    double B = b1.gbps;
    if (!rc && store_bench_io(&bo, &b2, err, sizeof err) == 0) B = (b1.gbps + b2.gbps) / 2;
    if (!rc) {
        printf("  bench io: %.3f GB/s before, %.3f GB/s after (B = mean %.3f GB/s; %d KiB reads, qd %d)\n", b1.gbps, b2.gbps, B,
               (int)(stride / 1024), qd);
        const double bound1 = res[0].read_per_tok > 0 ? B * 1e9 / res[0].read_per_tok : 0;
        printf("  %-4s %12s %12s %14s %14s %12s %12s\n", "S", "tok/s", "x S=first", "MB read/tok", "bound tok/s",
               "of bound", "x bound(1st)");
        for (int k = 0; k < n_runs; k++) {
            const double bound = res[k].read_per_tok > 0 ? B * 1e9 / res[k].read_per_tok : 0;
            printf("  %-4d %12.3f %12.2f %14.1f %14.3f %11.1f%% %12.2f%s\n", res[k].S, res[k].tps,
                   res[0].tps > 0 ? res[k].tps / res[0].tps : 0, res[k].read_per_tok / 1e6, bound,
                   bound > 0 ? 100 * res[k].tps / bound : 0, bound1 > 0 ? res[k].tps / bound1 : 0, res[k].exact);
        }
        int same = 1;
        for (int k = 1; k < n_runs; k++)
            same &= res[k].n_seq0 == res[0].n_seq0 && !memcmp(res[k].seq0, res[0].seq0, sizeof(int32_t) * res[0].n_seq0);
        printf("  bound = B / (expert + streamed spine bytes read per generated token); x bound(1st) = tok/s over the\n"
               "  first S's bound. rows per expert read = the router's picks (rows x top-k) / the distinct experts they\n"
               "  named, per MoE layer evaluation: the most that reading each expert once per step saves over S = 1 when\n"
               "  storage-bound (before hits). sequence 0's tokens identical at every S: %s\n", same ? "yes" : "NO");
        if (!same) rc = 1;
    }
    free(res);
    return rc ? 1 : 0;
}
