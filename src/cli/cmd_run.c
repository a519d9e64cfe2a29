/*
 * cmd_run.c — `deltafin run`: open a model, evaluate a prompt (text through the
 * model's tokenizer, or --prompt-ids), then generate up to --max-new tokens
 * (greedy by default; --temperature/--top-p/--top-k/--seed sample), streaming
 * the decoded text to stdout. Uses only include/deltafin.h.
 */
#include "cli.h"
#include "deltafin.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: deltafin run --model DIR (--prompt TEXT | --prompt-ids 1,2,3) [options]\n"
            "  --model DIR          native model dir (manifest.json) or Hugging Face dir (config.json; converted once into the cache)\n"
            "  --prompt TEXT        prompt text (needs the model's tokenizer)\n"
            "  --prompt-ids LIST    prompt as comma-separated token ids\n"
            "  --max-new N          tokens to generate (default 32)\n"
            "  --chat               wrap the prompt as one user message in the model's chat format\n"
            "  --print-ids          print the generated ids comma-separated on one line (instead of text)\n"
            "  --stats              print TTFT, prefill/decode tok/s and weight bytes per token to stderr\n"
            "  --threads N          compute threads (default: all cores)\n"
            "  --temperature T      0 = greedy (default); --top-p P, --top-k K, --seed S for sampling\n"
            "  --ram-budget SIZE    bytes for weights + KV cache, e.g. 4G, 512M (default unlimited)\n"
            "  --expert-dirs D1,D2  where the expert packs live (override)\n"
            "  --cache-dir DIR      where an HF checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n"
            "  --spine MODE         source|bf16|int8 spine when converting (int8 is NOT exact)\n"
            "  --events FILE        per-token JSONL I/O events\n"
            "  --prefetch MODE      auto (on with --ram-budget) | on | off: router lookahead prefetch (alias env DF_PREFETCH)\n"
            "  --heat FILE|off      persistent expert heat histogram (default with --ram-budget: MODEL/heat.bin)\n"
            "  --backend NAME       cpu (best SIMD, default) | cpu-scalar\n"
            "  --quiet              no configuration line or progress on stderr\n");
}

/* "4G", "512M", "100K", "12345" -> bytes; 0 on error */
static uint64_t parse_size(const char *s) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0) return 0;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1048576.0; end++; break;
    case 'g': case 'G': v *= 1073741824.0; end++; break;
    case 't': case 'T': v *= 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) return 0;
    return (uint64_t)v;
}

static int parse_ids(const char *s, int32_t **out, int *n_out) {
    int cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    const char *p = s;
    while (*p) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) { free(ids); return -1; }
        if (n == cap) ids = realloc(ids, sizeof(int32_t) * (cap *= 2));
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ') p++;
        if (*p && *p != ',') { free(ids); return -1; }
    }
    *out = ids;
    *n_out = n;
    return n > 0 ? 0 : -1;
}

static int progress_cb(void *user, const char *what, uint64_t done, uint64_t total) {
    static time_t last;
    static int finished;
    time_t now = time(NULL);
    if (done < total) finished = 0;
    if (!total || finished) return 0;
    if (done == total || now != last) {
        last = now;
        fprintf(stderr, "\rconverting: %s %.1f%% (%llu / %llu)%s", what, 100.0 * done / total, (unsigned long long)done,
                (unsigned long long)total, done == total ? "\n" : "");
        if (done == total) finished = 1;
    }
    return 0;
}

/* JSON string escaping for the one-message chat list */
static char *json_escape(const char *s) {
    size_t n = strlen(s);
    char *o = malloc(n * 6 + 3), *p = o;
    *p++ = '"';
    for (const unsigned char *q = (const unsigned char *)s; *q; q++) {
        if (*q == '"' || *q == '\\') { *p++ = '\\'; *p++ = (char)*q; }
        else if (*q == '\n') { *p++ = '\\'; *p++ = 'n'; }
        else if (*q == '\r') { *p++ = '\\'; *p++ = 'r'; }
        else if (*q == '\t') { *p++ = '\\'; *p++ = 't'; }
        else if (*q < 0x20) p += sprintf(p, "\\u%04x", *q);
        else *p++ = (char)*q;
    }
    *p++ = '"';
    *p = 0;
    return o;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_ids = NULL;
    int max_new = 32, chat = 0, stats = 0, print_ids = 0, quiet = 0;
    df_model_opts mo;
    df_model_opts_default(&mo);
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "deltafin run: %s needs a value\n", a), (char *)NULL))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!(model = NEXT())) return 2; }
        else if (!strcmp(a, "--prompt")) { if (!(prompt = NEXT())) return 2; }
        else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = NEXT())) return 2; }
        else if (!strcmp(a, "--max-new")) { const char *v = NEXT(); if (!v) return 2; max_new = atoi(v); if (max_new < 0) { fprintf(stderr, "deltafin run: --max-new must be >= 0\n"); return 2; } }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--threads")) { const char *v = NEXT(); if (!v) return 2; mo.threads = atoi(v); }
        else if (!strcmp(a, "--temperature")) { const char *v = NEXT(); if (!v) return 2; so.temperature = (float)atof(v); }
        else if (!strcmp(a, "--top-p")) { const char *v = NEXT(); if (!v) return 2; so.top_p = (float)atof(v); }
        else if (!strcmp(a, "--top-k")) { const char *v = NEXT(); if (!v) return 2; so.top_k = atoi(v); }
        else if (!strcmp(a, "--seed")) { const char *v = NEXT(); if (!v) return 2; so.seed = strtoull(v, NULL, 10); }
        else if (!strcmp(a, "--ram-budget")) {
            const char *v = NEXT(); if (!v) return 2;
            mo.ram_budget = parse_size(v);
            if (!mo.ram_budget) { fprintf(stderr, "deltafin run: --ram-budget \"%s\" is not a size (e.g. 4G, 512M)\n", v); return 2; }
        }
        else if (!strcmp(a, "--expert-dirs")) { if (!(mo.expert_dirs = NEXT())) return 2; }
        else if (!strcmp(a, "--cache-dir")) { if (!(mo.cache_dir = NEXT())) return 2; }
        else if (!strcmp(a, "--events")) { if (!(mo.events_path = NEXT())) return 2; }
        else if (!strcmp(a, "--heat")) { if (!(mo.heat_path = NEXT())) return 2; }
        else if (!strcmp(a, "--prefetch")) {
            const char *v = NEXT();
            if (!v) return 2;
            if (!strcmp(v, "auto")) mo.prefetch = 0;
            else if (!strcmp(v, "on")) mo.prefetch = 1;
            else if (!strcmp(v, "off")) mo.prefetch = 2;
            else { fprintf(stderr, "deltafin run: --prefetch \"%s\": expected auto, on or off\n", v); return 2; }
        }
        else if (!strcmp(a, "--backend")) { if (!(mo.backend = NEXT())) return 2; }
        else if (!strcmp(a, "--spine")) {
            const char *v = NEXT(); if (!v) return 2;
            if (!strcmp(v, "source")) mo.spine = DF_SPINE_SOURCE;
            else if (!strcmp(v, "bf16")) mo.spine = DF_SPINE_BF16;
            else if (!strcmp(v, "int8")) mo.spine = DF_SPINE_INT8;
            else { fprintf(stderr, "deltafin run: --spine must be source, bf16 or int8 (got \"%s\")\n", v); return 2; }
        }
        else { fprintf(stderr, "deltafin run: unknown option '%s'\n\n", a); run_usage(stderr); return 2; }
#undef NEXT
    }
    if (!model) { fprintf(stderr, "deltafin run: --model DIR is required\n\n"); run_usage(stderr); return 2; }
    if (!prompt == !prompt_ids) { fprintf(stderr, "deltafin run: give exactly one of --prompt TEXT or --prompt-ids LIST\n"); return 2; }
    if (!quiet) { mo.progress = progress_cb; mo.progress_user = NULL; }
    /* KV positions this run can need (reserved inside --ram-budget): prompt tokens <= ids or bytes (+ chat markup) */
    if (prompt_ids) {
        int n = 1;
        for (const char *q = prompt_ids; *q; q++) n += *q == ',';
        mo.kv_positions = n + max_new + 1;
    } else {
        mo.kv_positions = (int)strlen(prompt) + max_new + (chat ? 512 : 16);
    }

    char err[1024] = "";
    df_model *m = NULL;
    int rc = df_model_open(&m, model, &mo, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin run: %s\n", err[0] ? err : df_strerror(rc)); return 1; }
    if (!quiet) fprintf(stderr, "%s\n", df_model_describe(m));
    const df_tokenizer *tok = df_model_tokenizer(m);
    int status = 1;
    int32_t *ids = NULL, *out_ids = NULL;
    int n_ids = 0, n_out = 0;
    df_session *s = NULL;
    df_sampler *smp = NULL;
    df_detok *dt = NULL;
    float *logits = NULL;
    if (prompt_ids) {
        if (parse_ids(prompt_ids, &ids, &n_ids)) { fprintf(stderr, "deltafin run: --prompt-ids \"%s\" is not a comma-separated list of token ids\n", prompt_ids); status = 2; goto done; }
        if (chat) { fprintf(stderr, "deltafin run: --chat needs --prompt TEXT (ids are used as given)\n"); status = 2; goto done; }
    } else {
        if (!tok) { fprintf(stderr, "deltafin run: model %s has no tokenizer (tokenizer.json / tiktoken.model); pass token ids with --prompt-ids 1,2,3\n", model); goto done; }
        size_t n = 0;
        if (chat) {
            char *esc = json_escape(prompt), *msgs = malloc(strlen(esc) + 64), *text = NULL;
            sprintf(msgs, "[{\"role\":\"user\",\"content\":%s}]", esc);
            rc = df_chat_render(tok, msgs, NULL, DF_CHAT_ADD_GENERATION_PROMPT, &text, err, sizeof err);
            free(esc); free(msgs);
            if (rc) { fprintf(stderr, "deltafin run: chat format: %s\n", err); goto done; }
            rc = df_tokenize(tok, text, strlen(text), DF_TOK_PARSE_SPECIAL, &ids, &n, err, sizeof err);
            free(text);
        } else {
            rc = df_tokenize(tok, prompt, strlen(prompt), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        }
        if (rc) { fprintf(stderr, "deltafin run: tokenize: %s\n", err); goto done; }
        n_ids = (int)n;
        if (n_ids == 0) { fprintf(stderr, "deltafin run: the prompt is empty after tokenization\n"); goto done; }
    }
    int vocab = df_model_n_vocab(m);
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= vocab) { fprintf(stderr, "deltafin run: prompt id %d is outside the vocabulary (%d tokens)\n", ids[i], vocab); status = 2; goto done; }
    int32_t stop[16];
    int n_stop = tok ? df_tokenizer_stop_ids(tok, stop, 16) : 0;
    rc = df_session_new(&s, m, n_ids + max_new, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin run: %s\n", err); goto done; }
    smp = df_sampler_new(&so);
    logits = malloc(sizeof(float) * (size_t)vocab);
    out_ids = malloc(sizeof(int32_t) * (size_t)(max_new + 1));
    if (!smp || !logits || !out_ids) { fprintf(stderr, "deltafin run: out of memory\n"); goto done; }
    if (tok && !print_ids) dt = df_detok_new(tok);
    df_model_stats_reset(m);
    double t_start = now_s();
    rc = df_eval(s, ids, n_ids, logits, 0, NULL, NULL, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin run: %s\n", err); goto done; }
    df_stats after_prefill;
    df_model_stats(m, &after_prefill);
    char buf[1024];
    for (int k = 0; k < max_new; k++) {
        int32_t id = df_sample(smp, logits, vocab);
        out_ids[n_out++] = id;
        int is_stop = 0;
        for (int q = 0; q < n_stop; q++) is_stop |= stop[q] == id;
        if (dt && !is_stop) {
            int w = df_detok_push(dt, id, buf, sizeof buf);
            if (w > 0) { fwrite(buf, 1, (size_t)w, stdout); fflush(stdout); }
        }
        if (is_stop || k + 1 == max_new) break;
        rc = df_eval(s, &id, 1, logits, 0, NULL, NULL, err, sizeof err);
        if (rc) { fprintf(stderr, "\ndeltafin run: %s\n", err); goto done; }
    }
    double total = now_s() - t_start;
    if (dt) {
        int w = df_detok_flush(dt, buf, sizeof buf);
        if (w > 0) fwrite(buf, 1, (size_t)w, stdout);
        fputc('\n', stdout);
    }
    if (print_ids) {
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out_ids[i]);
        printf("\n");
    }
    fflush(stdout);
    if (stats) {
        df_stats st;
        df_model_stats(m, &st);
        /* weight bytes per generated token: the decode evals' bytes / their count (else the prefill's) */
        double per_tok = st.decode_tokens ? (double)(st.weight_bytes_read - after_prefill.weight_bytes_read) / st.decode_tokens
                                          : (double)after_prefill.weight_bytes_read;
        fprintf(stderr,
                "stats: prompt %d tokens, generated %d; TTFT %.3f s; prefill %.2f tok/s; decode %.2f tok/s (%llu tokens in %.3f s); "
                "weight bytes read %.1f MB/token; experts read %.1f MB (demand) + %.1f MB (prefetch), hits %llu, misses %llu, "
                "I/O stall %.3f s; total %.3f s%s\n",
                n_ids, n_out, st.ttft_s, st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0.0,
                st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0.0, (unsigned long long)st.decode_tokens, st.decode_s,
                per_tok / 1e6,
                st.expert_bytes_demand / 1e6, st.expert_bytes_prefetch / 1e6, (unsigned long long)st.expert_hits,
                (unsigned long long)st.expert_misses, st.io_stall_s, total,
                df_model_is_exact(m) ? "" : strstr(df_model_describe(m), "spine int8") ? " (NOT EXACT: int8 spine)"
                                                                                       : " (NOT EXACT: lossy bf16 spine)");
    }
    status = 0;
done:
    df_detok_free(dt);
    free(logits);
    free(out_ids);
    free(ids);
    df_sampler_free(smp);
    df_session_free(s);
    df_model_close(m);
    return status;
}
