/*
 * bench_prefill.c — `deltafin bench prefill`: the time to first token of an N-token prompt evaluated in one
 * call, cold (the model's files evicted from the page cache), against the two floors it cannot beat: reading the union of routed experts
 * the prompt touches once at the drives' speed (B from the I/O benchmark on the same packs, before and after),
 * and the compute time (the forward pass's phases without I/O wait). Prints the read amplification (expert
 * bytes read / bytes of the touched union; 1.0 = each touched expert read exactly once) and
 * TTFT / max(union read time, compute time).
 */
#define _GNU_SOURCE
#include "bench_common.h"
#include "cli.h"
#include "deltafin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deltafin bench prefill [--model DIR] [--tokens N (64)] [--ram-budget SIZE] [--threads N]\n"
               "       [--seed N (1)] [--io-seconds S (5)] [--qd N (16)] [--no-drop] [--backend auto|cpu|cpu-scalar|cpu-avx2|cpu-avx512|cuda]\n"
               "       [--gpu-budget SIZE] [--events FILE (the store's JSONL events: every read, acquire, dropped guess)]\n"
               "       [--prefetch auto|on|off|ungated] [--prefault auto|on|off (as in `deltafin run`)] [--io-buffer SIZE]\n"
               "       [--cache-dir DIR]\n"
               "  --model DIR: a native model, or a Hugging Face checkpoint converted once into the conversion cache\n"
               "  as `run` does. Default: the model `deltafin setup` installed, else the embedded models/kimi-mini.\n"
               "  --cache-dir DIR: where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n"
               "  Cold TTFT of an N-token prompt (random ids, seeded) in one evaluation; prints the expert bytes read\n"
               "  against the union of experts the prompt touches (amplification), the union's read time at\n"
               "  `bench io` speed, the compute time and TTFT / max(both).\n"
               "  --qd N: expert reads in flight per drive, for the store (as `run --io-depth`) and the I/O benchmark.\n"
               "  --io-buffer SIZE: also measure B with the reads landing in a pool of SIZE (as the expert cache fills;\n"
               "  see `bench io --buffer`) and print the union's read time and the ratio for that B too.\n");
}

int bench_prefill(int argc, char **argv) {
    const char *model = NULL, *cache_dir = NULL, *backend = cli_default_backend();
    uint64_t budget = 0, gpu_budget = 0, io_buffer = 0;
    long tokens = 64, threads = 0, qd = 16;
    uint64_t seed = 1;
    double io_seconds = 5;
    int nodrop = 0, prefetch = 0, prefault = 0;
    const char *events = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--no-drop")) { nodrop = 1; continue; }
        static const char *const vals[] = {"--model", "--events", "--ram-budget", "--tokens", "--threads", "--seed", "--qd",
                                           "--backend", "--gpu-budget", "--io-seconds", "--prefetch", "--prefault", "--io-buffer",
                                           "--cache-dir", NULL};
        static const char *const bench_flags[] = {"--help", "--no-drop", NULL};
        if (!cli_known_option(a, vals)) return cli_unknown_option("bench prefill", a, vals, bench_flags);
        if (!v) { fprintf(stderr, "deltafin bench prefill: %s needs a value (see --help)\n", a); return 2; }
        if (cli_repeated_at("bench prefill", argc, argv, i, vals, NULL)) return 2;
        char *end = NULL;
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--cache-dir")) { if (cli_check_cache_dir("bench prefill", v)) return 2; cache_dir = v; }
        else if (!strcmp(a, "--events")) events = v;
        else if (!strcmp(a, "--ram-budget")) {
            if (cli_parse_budget("bench prefill", a, v, &budget)) return 2;
        } else if (!strcmp(a, "--seed")) {
            if (cli_parse_seed("bench prefill", a, v, &seed)) return 2;
        } else if (!strcmp(a, "--tokens") || !strcmp(a, "--threads") || !strcmp(a, "--qd")) {
            long x = strtol(v, &end, 10);
            long lo = !strcmp(a, "--threads") ? 0 : 1, hi = !strcmp(a, "--qd") ? 1024 : 1 << 20;
            if (!*v || *end || x < lo || x > hi) { fprintf(stderr, "deltafin bench prefill: %s '%s': expected an integer in [%ld, %ld]\n", a, v, lo, hi); return 2; }
            if (!strcmp(a, "--tokens")) tokens = x;
            else if (!strcmp(a, "--threads")) threads = x;
            else qd = x;
        } else if (!strcmp(a, "--backend")) {
            if (cli_check_backend("bench prefill", v)) return 2;
            backend = v;
        } else if (!strcmp(a, "--gpu-budget")) {
            if (cli_parse_size(v, &gpu_budget)) { fprintf(stderr, "deltafin bench prefill: --gpu-budget '%s': expected a size like 8G\n", v); return 2; }
        } else if (!strcmp(a, "--prefetch") || !strcmp(a, "--prefault")) {
            if (cli_parse_mode("bench prefill", a, v, !strcmp(a, "--prefetch") ? &prefetch : &prefault)) return 2;
        } else if (!strcmp(a, "--io-buffer")) {
            if (cli_parse_size(v, &io_buffer) || !io_buffer) { fprintf(stderr, "deltafin bench prefill: --io-buffer \"%s\": expected a size like 1G (more than 0)\n", v); return 2; }
        } else if (!strcmp(a, "--io-seconds")) {
            io_seconds = strtod(v, &end);
            if (!*v || *end || !(io_seconds > 0 && io_seconds < 86400)) { fprintf(stderr, "deltafin bench prefill: --io-seconds '%s': expected seconds > 0\n", v); return 2; }
        } else return cli_unknown_option("bench prefill", a, vals, bench_flags);
        i++;
    }
    if (bench_check_io_buffer("prefill", io_buffer, (int)qd)) return 2;
    if (cli_check_env_aliases("bench prefill", backend, prefetch, prefault)) return 2;
    char err[2048] = "", conv_dir[4096], dflt_dir[4096], dflt_how[4600] = "", conv_how[4600] = "";
    if (!model) { /* the default model, as bench decode */
        if (cli_default_model("bench prefill", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    df_native *nat = NULL;
    int rc = bench_native_model("prefill", &model, cache_dir, conv_dir, sizeof conv_dir, dflt_how[0] ? dflt_how : conv_how,
                                dflt_how[0] ? sizeof dflt_how : sizeof conv_how);
    if (rc) return rc;
    rc = bench_check_native("prefill", model);
    if (rc) return rc;
    rc = native_open(&nat, model, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench prefill: %s\n", err); return 1; }
    if (nat->n_moe_layers == 0) { fprintf(stderr, "deltafin bench prefill: %s has no routed experts\n", model); native_close(nat); return 1; }
    const uint64_t stride = nat->stride;
    const int top_k = nat->cfg.num_experts_per_tok;
    const uint64_t bank = (uint64_t)nat->n_moe_layers * nat->n_experts * stride;
    char dirs[4096];
    bench_pack_dirs(nat, dirs, sizeof dirs);
    native_close(nat);
    int dropped = nodrop ? 0 : bench_drop_caches(model, dirs);
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.ram_budget = budget;
    mo.threads = (int)threads;
    mo.backend = backend;
    mo.gpu_budget = gpu_budget;
    mo.kv_positions = (int)tokens + 1;
    mo.prefetch = prefetch;
    mo.prefault = prefault;
    mo.io_depth = (int)qd; /* the store reads at the depth B is measured at */
    mo.events_path = events;
    df_model *m = NULL;
    rc = df_model_open(&m, model, &mo, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench prefill: %s\n", err); return 1; }
    const int V = df_model_n_vocab(m);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)tokens);
    float *logits = malloc(sizeof(float) * (size_t)V);
    uint64_t r = (uint64_t)seed * 0x9E3779B97F4A7C15ull + 1;
    for (long i = 0; i < tokens; i++) {
        r ^= r >> 12; r ^= r << 25; r ^= r >> 27;
        ids[i] = (int32_t)((r * 0x2545F4914F6CDD1Dull >> 33) % (uint64_t)V);
    }
    char bstr[32] = "unlimited";
    if (budget) snprintf(bstr, sizeof bstr, "%.3f GiB", budget / 1073741824.0);
    printf("bench prefill: %s, %ld tokens, ram budget %s, page cache %s\n", model, tokens, bstr,
           dropped ? "evicted (the model's files)" : (nodrop ? "kept (--no-drop)" : "NOT evicted (a directory could not be read): numbers may be warm"));
    fflush(stdout); /* in a 2>&1 log the line follows the header above */
    /* the resolved configuration: one line on stderr, as bench decode */
    fprintf(stderr, "%s%s%s%s%s\n", df_model_describe(m), dflt_how[0] ? "; model (no --model): " : "", dflt_how,
            conv_how[0] ? "; model: " : "", conv_how);
    store_bench_opts bo;
    bench_expert_io_opts(&bo, dirs, (int)qd, stride, top_k, io_seconds);
    store_bench_result b1, b2;
    rc = store_bench_io(&bo, &b1, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench prefill: I/O benchmark: %s\n", err); goto out; }
    store_bench_opts bp = bo;
    bp.buffer_bytes = io_buffer;
    store_bench_result p1 = {0}, p2 = {0};
    if (io_buffer) {
        if (!nodrop) bench_drop_caches(model, dirs);
        rc = store_bench_io(&bp, &p1, err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin bench prefill: I/O benchmark (--io-buffer): %s\n", err); goto out; }
    }
    if (!nodrop) bench_drop_caches(model, dirs);
    df_session *s = NULL;
    rc = df_session_new(&s, m, (int)tokens + 1, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin bench prefill: %s\n", err); goto out; }
    df_model_stats_reset(m);
    double t0 = now_s();
    rc = df_eval(s, ids, (int)tokens, logits, 0, NULL, NULL, err, sizeof err);
    double ttft = now_s() - t0;
    df_session_free(s);
    if (rc) { fprintf(stderr, "deltafin bench prefill: %s\n", err); goto out; }
    df_stats st;
    df_model_stats(m, &st);
    double B = b1.gbps;
    if (store_bench_io(&bo, &b2, err, sizeof err) == 0) B = (b1.gbps + b2.gbps) / 2;
    double Bp = p1.gbps;
    if (io_buffer && store_bench_io(&bp, &p2, err, sizeof err) == 0) Bp = (p1.gbps + p2.gbps) / 2;
    const uint64_t read = st.expert_bytes_demand + st.expert_bytes_prefetch;
    const double amp = st.expert_union_bytes ? (double)read / st.expert_union_bytes : 0;
    const double t_union = B > 0 ? st.expert_union_bytes / (B * 1e9) : 0;
    double compute = 0;
    for (int p = 0; p < DF_PHASES; p++)
        if (p != DF_PHASE_IO_WAIT) compute += st.phase_s[p];
    const double floor_s = t_union > compute ? t_union : compute;
    printf("  bench io: %.3f GB/s before, %.3f GB/s after (B = mean %.3f GB/s; %d KiB reads, qd %ld)\n", b1.gbps, b2.gbps, B,
           (int)(stride / 1024), qd);
    printf("  TTFT %.3f s (%.1f tok/s)%s\n", ttft, tokens / ttft, cli_exact_note(m));
    printf("  experts: union %llu of %llu (%.1f%% of the bank), %.1f MB; read %.1f MB (demand %.1f, prefetch %.1f); "
           "amplification %.3f\n",
           (unsigned long long)st.expert_union_count, (unsigned long long)(bank / stride), 100.0 * st.expert_union_bytes / bank,
           st.expert_union_bytes / 1e6, read / 1e6, st.expert_bytes_demand / 1e6, st.expert_bytes_prefetch / 1e6, amp);
    printf("  union read time at B: %.3f s; compute (phases without I/O wait): %.3f s; I/O wait %.3f s\n", t_union, compute,
           st.phase_s[DF_PHASE_IO_WAIT]);
    printf("  TTFT / max(union read, compute) = %.3f\n", floor_s > 0 ? ttft / floor_s : 0);
    if (io_buffer && Bp > 0) {
        const double t_union_p = st.expert_union_bytes / (Bp * 1e9), floor_p = t_union_p > compute ? t_union_p : compute;
        printf("  with B into %.0f MiB of buffers: %.3f GB/s before, %.3f GB/s after (mean %.3f); union read time %.3f s; "
               "TTFT / max(union read, compute) = %.3f\n",
               io_buffer / 1048576.0, p1.gbps, p2.gbps, Bp, t_union_p, ttft / floor_p);
    }
    printf("  phases:");
    for (int p = 0; p < DF_PHASES; p++)
        if (st.phase_s[p] > 0) printf(" %s %.3f s", df_phase_name(p), st.phase_s[p]);
    printf("\n");
    if (st.expert_slots_pinned) printf("  expert slots page-locked for the GPU: %d of %d\n", st.expert_slots_pinned, st.expert_slots);
out:
    free(ids);
    free(logits);
    df_model_close(m);
    return rc ? 1 : 0;
}
