/*
 * cmd_run.c — `deltafin run`: open a model, evaluate a prompt (text through the
 * model's tokenizer — from --prompt, --prompt-file or stdin — or --prompt-ids),
 * then generate up to --max-new tokens (greedy by default;
 * --temperature/--top-p/--top-k/--seed sample), streaming the decoded text to
 * stdout. A prefill that takes more than a second shows its progress on stderr;
 * a prompt longer than the positions the model was trained on gets a warning.
 * Uses only include/deltafin.h for the model (the configuration and model card
 * are read as files for the trained-positions figure).
 */
#include "cli.h"
#include "cli_draft.h"
#include "cli_model.h"
#include "hub/stream.h"
#include "deltafin.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <unistd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static void run_usage(FILE *f) {
    fprintf(f,
            "usage: deltafin run [--model DIR] (--prompt TEXT | --prompt-file FILE | --prompt-ids 1,2,3) [options]\n"
            "  --model DIR          native model dir (manifest.json) or Hugging Face dir (config.json; converted once into the cache);\n"
            "                       default: the model `deltafin setup` installed, else the embedded models/kimi-mini\n"
            "  --prompt TEXT        prompt text (needs the model's tokenizer); --prompt - reads it from stdin\n"
            "  --prompt-file FILE   prompt text from FILE, as is (- = stdin); prompt text is encoded as text: a special\n"
            "                       token's string (e.g. <|im_end|>) stays text, as in the server's completions (`tokenize`\n"
            "                       parses them unless --no-parse-special; --chat's rendered markers are specials)\n"
            "  --prompt-ids LIST    prompt as comma-separated token ids\n"
            "  --max-new N          tokens to generate (default 32); stops early at the model's end-of-sequence token\n"
            "                       (kept in --print-ids, not printed as text) or, with a note, when the context is full\n"
            "  --chat               wrap the prompt as one user message in the model's chat format\n"
            "  --print-ids          print the generated ids comma-separated on one line (instead of text)\n"
            "  --stats              print TTFT, prefill/decode tok/s and weight bytes per token to stderr\n"
            "  --profile            time per phase of the forward pass (attention, KDA, router, experts, I/O wait,\n"
            "                       ...) for the prefill and per decoded token, after the --stats lines (implies --stats)\n"
            "  --threads N          compute threads, 0..4096 (default 0: all cores)\n"
            "  --temperature T      0..2; 0 = greedy (default)\n"
            "  --top-p P            nucleus sampling, in (0, 1] (default 1: off)\n"
            "  --top-k K            sample among the K most likely tokens (default 0: off; -1: off too, as the server's top_k)\n"
            "  --seed S             sampling seed, -2^63..2^64-1 (default 0: the same output on every run); a negative\n"
            "                       S is S + 2^64, as the server's \"seed\": the same seed samples the same tokens\n"
            "                       (--top-p, --top-k and --seed apply with --temperature > 0; at 0 a note says so)\n"
            "  --ram-budget SIZE    bytes for weights + KV cache, e.g. 4G, 512M (default 0: unlimited)\n"
            "  --expert-dirs D1,D2  where the expert packs live (override)\n"
            "  --cache-dir DIR      where an HF checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n"
            "  --spine MODE         source|bf16|int8 spine when converting an HF checkpoint (int8 is NOT exact);\n"
            "                       an error with a native model dir (its spine was chosen by `deltafin convert`)\n"
            "  --events FILE        per-token JSONL I/O events, appended to FILE (created when missing; remove it\n"
            "                       first for a trace of one run)\n"
            "  --prefetch MODE      auto (on with --ram-budget; without one, a prompt's next layer only) | on | off |\n"
            "                       ungated: router lookahead prefetch; on: decode steps are timed with it on and off\n"
            "                       and the faster is kept (measured again now and then), ungated: always on (alias env\n"
            "                       DF_PREFETCH=1|on|0|off|ungated)\n"
            "  --prefault MODE      auto (on) | on | off: fault the expert cache in before its first reads (with\n"
            "                       --ram-budget the whole cache, without ~1 GiB ahead of the loads; alias env\n"
            "                       DF_PREFAULT=1|on|0|off)\n"
            "  --io-depth N         expert reads in flight per drive (16)\n"
            "  --io-size SIZE       bytes of one expert read request, a multiple of 4K, at most 64M (1M)\n"
            "  --preload            read every routed expert into memory before the prompt (GPU memory first with\n"
            "                       --backend cuda, then the host cache; nothing is evicted for it; refused on a\n"
            "                       streamed install, where it would fetch the whole model)\n"
            "  --heat FILE|off      persistent expert heat histogram (default with --ram-budget: MODEL/heat.bin); FILE is\n"
            "                       created when missing (or empty), its directory must exist; an existing FILE that is\n"
            "                       not this model's heat file (another file, another model's heat file, a damaged\n"
            "                       one) is neither used nor overwritten: a warning at start says so and the run's\n"
            "                       heat is not saved; a failed save (e.g. a read-only directory) is a warning too,\n"
            "                       the old FILE kept (the exit status is unchanged either way)\n"
            "  --backend NAME       auto (default: cuda when a CUDA device is present, else cpu) | cpu (best SIMD)\n"
            "                       | cpu-scalar | cpu-avx2 | cpu-avx512 | cuda (an error without a CUDA device);\n"
            "                       default env DF_BACKEND\n"
            "  --gpu-budget SIZE    backend cuda: GPU memory for the routed-expert cache (default all free less 1G)\n"
            "  --quiet              no configuration line or progress on stderr (warnings and notes, such as\n"
            "                       generation going past the trained positions, are still shown)\n"
            "%s"
            "Prompt text must be valid UTF-8, as the server requires: an invalid byte is a usage error (exit 2) naming\n"
            "its byte offset and where the prompt came from; nothing is generated.\n"
            "The generated text goes to stdout: to a file or pipe of its own exactly the generated bytes; on a terminal,\n"
            "or where stderr goes too, a newline follows unless the text ends with one.\n"
            "A prefill that takes over a second reports its progress (layers done) on stderr: one line rewritten in\n"
            "place on a terminal, else a line every 5 s. A prompt longer than the positions the model was trained on\n"
            "(the model card's trained_positions in DIR/README.md, which convert and setup copy beside the native\n"
            "files, else the config's max_position_embeddings) gets a warning on stderr.\n",
            cli_draft_usage(1));
}

/* run's options but the --draft* ones (cli_draft_flags, each taking a value), with whether each takes a value: the
 * names an unknown option is compared with, in this order, and the value options that may be given once */
static const cli_option run_options[] = {
    {"--help", 0}, {"--model", 1}, {"--prompt", 1}, {"--prompt-ids", 1}, {"--prompt-file", 1}, {"--max-new", 1},
    {"--chat", 0}, {"--stats", 0}, {"--profile", 0}, {"--print-ids", 0}, {"--quiet", 0}, {"--preload", 0},
    {"--threads", 1}, {"--temperature", 1}, {"--top-p", 1}, {"--top-k", 1}, {"--seed", 1}, {"--ram-budget", 1},
    {"--expert-dirs", 1}, {"--cache-dir", 1}, {"--events", 1}, {"--heat", 1}, {"--prefetch", 1}, {"--prefault", 1},
    {"--backend", 1}, {"--gpu-budget", 1}, {"--spine", 1}, {"--io-depth", 1}, {"--io-size", 1}, {NULL, 0}};
CLI_OPTIONS_FIT(run_options);

static int progress_open; /* a progress line without its newline is on stderr */

/* end an unfinished progress line (the conversion's or the prefill's) before an error message */
static void progress_end(void) {
    if (!cli_convert_progress_end() && progress_open) fputc('\n', stderr);
    progress_open = 0;
}

/* Whole contents of FILE ("-" = stdin) as a NUL-terminated string; NULL after a message, with *status the exit
 * status: 1 when it cannot be read, 2 when it is no text (a NUL byte). */
static char *read_prompt(const char *path, size_t *len_out, int *status) {
    *status = 1;
    int is_stdin = !strcmp(path, "-");
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "deltafin run: --prompt-file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (;;) {
        if (!b) break;
        if (n + 1 >= cap) {
            char *t = realloc(b, cap *= 2);
            if (!t) { free(b); b = NULL; break; }
            b = t;
        }
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0) break;
    }
    int bad = ferror(f);
    if (!is_stdin) fclose(f);
    if (!b || bad) {
        fprintf(stderr, "deltafin run: cannot read the prompt from %s: %s\n", is_stdin ? "stdin" : path,
                b ? strerror(errno) : "out of memory");
        free(b);
        return NULL;
    }
    b[n] = 0;
    if (memchr(b, 0, n)) {
        fprintf(stderr, "deltafin run: the prompt from %s contains a NUL byte (not text)\n", is_stdin ? "stdin" : path);
        free(b);
        *status = 2;
        return NULL;
    }
    *len_out = n;
    return b;
}

/* 1 when the generated text should end its line: stdout is a terminal, or the same open file as stderr (one log
 * holding both streams, where the stats follow the text) */
static int text_ends_line(void) {
    if (isatty(STDOUT_FILENO)) return 1;
    struct stat a, b;
    return fstat(STDOUT_FILENO, &a) == 0 && fstat(STDERR_FILENO, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

/* df_eval progress for the prefill (layers done of the model's layers): on a terminal, nothing for a prefill under
 * a second, then one line rewritten at most twice a second; on a file or pipe, a line every 5 s (the first at 5 s). */
typedef struct {
    double t0, last;
    int n_tokens, shown;
} prefill_prog;

static double now_s(void);

/* SIGINT / SIGTERM / SIGHUP (SIGHUP not when ignored at the start: nohup) during the prefill: end the progress line,
 * say so, then die of the signal as before (exit status 128 + signal). Async-signal-safe: write(2), signal, raise. */
static volatile sig_atomic_t g_prefill_line;
static void prefill_signal(int sig) {
    static const char nl[] = "\n", msg[] = "deltafin run: interrupted\n";
    if (g_prefill_line) (void)!write(2, nl, sizeof nl - 1);
    (void)!write(2, msg, sizeof msg - 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Generation: the first SIGINT / SIGTERM / SIGHUP (as in the prefill) stops after the current token (what was
 * generated is printed, with the stats when asked, and the exit status is 128 + the signal); a second one ends the
 * process at once. */
static volatile sig_atomic_t g_gen_sig;
static void gen_signal(int sig) {
    g_gen_sig = sig;
    signal(sig, SIG_DFL);
}

/* A generated token (df_decode_greedy's on_token, and the greedy path's first token): kept, printed unless it is a
 * stop token; 1 = stop here (a stop token, or a signal). */
typedef struct {
    int32_t *out_ids;
    int *n_out;
    const int32_t *stop;
    int n_stop;
    df_detok *dt;
    char *last; /* the last byte of text written */
    int stopped;
} gen_out;

static int gen_emit(void *user, int32_t id) {
    gen_out *g = user;
    g->out_ids[(*g->n_out)++] = id;
    for (int q = 0; q < g->n_stop; q++)
        if (g->stop[q] == id) return g->stopped = 1;
    if (g->dt) {
        char buf[1024];
        const int w = df_detok_push(g->dt, id, buf, sizeof buf);
        if (w > 0) {
            fwrite(buf, 1, (size_t)w, stdout);
            fflush(stdout);
            *g->last = buf[w - 1];
        }
    }
    return g_gen_sig != 0;
}

static int prefill_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    prefill_prog *p = user;
    double now = now_s();
    /* a terminal: from 1 s on, one line rewritten every 0.5 s; a file or pipe: a line every 5 s, the first at 5 s */
    const int tty = cli_stderr_tty();
    if (now - (p->shown ? p->last : p->t0) < (tty ? (p->shown ? 0.5 : 1.0) : 5.0)) return 0;
    p->last = now;
    p->shown = 1;
    fprintf(stderr, "%sprefill: %d tokens, %s %llu / %llu, %.1f s%s", cli_cr(), p->n_tokens, what,
            (unsigned long long)done, (unsigned long long)total, now - p->t0, tty ? "" : "\n");
    fflush(stderr);
    progress_open = tty;
    g_prefill_line = tty;
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

/* CPU time of the process (all threads), seconds */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int cmd_run(int argc, char **argv) {
    const char *model = NULL, *prompt = NULL, *prompt_ids = NULL, *prompt_file = NULL;
    char *prompt_buf = NULL;
    size_t prompt_len = 0;
    int max_new = 32, chat = 0, stats = 0, profile = 0, print_ids = 0, quiet = 0, spine_given = 0, preload = 0;
    long long iv;
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.backend = cli_default_backend();
    cli_sampling smpl;
    cli_sampling_defaults(&smpl);
    cli_draft_opts dopt;
    cli_draft_defaults(&dopt);
    if (cli_check_repeated_in("run", argc, argv, run_options, cli_draft_flags)) return 2;
    for (int i = 1; i < argc; i++) {
        int dr, sr;
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "deltafin run: %s needs a value\n", a), (char *)NULL))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { run_usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!(model = NEXT())) return 2; }
        else if (!strcmp(a, "--prompt")) { if (!(prompt = NEXT())) return 2; }
        else if (!strcmp(a, "--prompt-ids")) { if (!(prompt_ids = NEXT())) return 2; }
        else if (!strcmp(a, "--prompt-file")) { if (!(prompt_file = NEXT())) return 2; }
        else if (!strcmp(a, "--max-new")) {
            const char *v = NEXT();
            if (!v || cli_parse_int("run", a, v, 0, INT_MAX, &iv)) return 2;
            max_new = (int)iv;
        }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "--profile")) profile = stats = 1;
        else if (!strcmp(a, "--print-ids")) print_ids = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--preload")) preload = 1;
        else if ((sr = cli_sampling_arg("run", argc, argv, &i, &smpl)) != 0) { if (sr < 0) return 2; }
        else if ((sr = cli_model_arg("run", argc, argv, &i, &mo, &spine_given)) != 0) { if (sr < 0) return 2; }
        else if ((dr = cli_draft_arg("run", argc, argv, &i, &dopt)) != 0) { if (dr < 0) return 2; }
        else return cli_unknown_option_in("run", a, run_options, cli_draft_flags);
#undef NEXT
    }
    df_sampler_opts so = smpl.so;
    /* flags that change nothing in this run: said once, not an error */
    cli_sampling_note("run", &smpl);
    cli_draft_note_unused("run", &dopt);
    cli_draft_note_sample("run", &dopt, so.temperature);
    if (cli_check_env_aliases("run", mo.backend, mo.prefetch, mo.prefault)) return 2;
    char dflt_dir[4096], dflt_how[4600] = "";
    if (!model) {
        if (cli_default_model("run", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    if ((prompt != NULL) + (prompt_ids != NULL) + (prompt_file != NULL) != 1) {
        fprintf(stderr, "deltafin run: give exactly one of --prompt TEXT, --prompt-file FILE or --prompt-ids LIST\n");
        return 2;
    }
    if (chat && prompt_ids) { fprintf(stderr, "deltafin run: --chat needs --prompt TEXT (ids are used as given)\n"); return 2; }
    /* the model directory (no such directory, no model in it, --spine with a native model), then a mistyped --draft */
    {
        const int ck = cli_model_check("run", model, spine_given);
        if (ck || cli_draft_check_path("run", &dopt)) return ck ? ck : 1;
    }
    if (!quiet) { mo.progress = cli_convert_progress; mo.progress_user = NULL; }
    if (prompt_file || (prompt && !strcmp(prompt, "-"))) {
        int st;
        if (!(prompt_buf = read_prompt(prompt_file ? prompt_file : "-", &prompt_len, &st))) return st;
        prompt = prompt_buf;
    } else if (prompt) prompt_len = strlen(prompt);
    /* an empty prompt is said before the model loads (an empty --prompt with --chat is still one user message) */
    if (prompt && !prompt_len && (prompt_buf || !chat)) {
        if (prompt_buf && !(prompt_file && strcmp(prompt_file, "-")))
            fprintf(stderr, "deltafin run: %s -: standard input was empty (pipe the prompt text in, or give it with --prompt "
                            "TEXT)\n", prompt_file ? "--prompt-file" : "--prompt");
        else if (prompt_buf) fprintf(stderr, "deltafin run: --prompt-file %s: the file is empty\n", prompt_file);
        else fprintf(stderr, "deltafin run: --prompt \"\": the prompt is empty (give the text to continue, or token ids "
                             "with --prompt-ids 1,2,3)\n");
        free(prompt_buf);
        return 2;
    }
    if (prompt) { /* text is UTF-8, as the server requires of a request: a bad byte is refused, not replaced */
        char what[4200];
        if (prompt_file && strcmp(prompt_file, "-")) snprintf(what, sizeof what, "the prompt from --prompt-file %s", prompt_file);
        else snprintf(what, sizeof what, "the prompt from %s", prompt_file ? "stdin (--prompt-file -)"
                                                             : prompt_buf ? "stdin (--prompt -)" : "--prompt");
        if (cli_check_utf8("run", what, prompt, prompt_len)) { free(prompt_buf); return 2; }
    }

    char err[1024] = "";
    int rc, status = 1;
    int32_t *ids = NULL, *out_ids = NULL;
    int n_ids = 0, n_out = 0;
    df_model *m = NULL;
    stream_src *remote = NULL; /* streamed install: the source of experts not yet local */
    df_tokenizer *own_tok = NULL; /* a text prompt: the model directory's tokenizer, opened before the model */
    df_session *s = NULL;
    df_sampler *smp = NULL;
    df_detok *dt = NULL;
    float *logits = NULL;
    df_model *draft_model = NULL;
    df_drafter *drafter = NULL;
    df_spec *spec = NULL;
    if (prompt_ids) {
        size_t n = 0;
        if (cli_parse_ids(prompt_ids, &ids, &n, err, sizeof err)) {
            fprintf(stderr, "deltafin run: --prompt-ids: %s\n", err);
            free(prompt_buf);
            return 2;
        }
        n_ids = (int)n; /* a command line holds far fewer than INT_MAX ids */
    } else {
        /* tokenize first: the KV reserve inside --ram-budget is then the prompt's real token count */
        if (cli_model_need_tokenizer("run", model, "pass token ids with --prompt-ids 1,2,3")) { free(prompt_buf); return 1; }
        rc = df_tokenizer_open(&own_tok, model, NULL, err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin run: tokenizer of %s: %s\n", model, err); free(prompt_buf); return 1; }
        size_t n = 0;
        if (chat) {
            char *esc = json_escape(prompt), *msgs = malloc(strlen(esc) + 64), *text = NULL;
            sprintf(msgs, "[{\"role\":\"user\",\"content\":%s}]", esc);
            rc = df_chat_render(own_tok, msgs, NULL, DF_CHAT_ADD_GENERATION_PROMPT, &text, err, sizeof err);
            free(esc); free(msgs);
            if (rc) { fprintf(stderr, "deltafin run: chat format: %s\n", err); goto done; }
            rc = df_tokenize(own_tok, text, strlen(text), DF_TOK_PARSE_SPECIAL, &ids, &n, err, sizeof err);
            free(text);
        } else {
            rc = df_tokenize(own_tok, prompt, prompt_len, DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        }
        if (rc) { fprintf(stderr, "deltafin run: tokenize: %s\n", err); goto done; }
        n_ids = (int)n;
        if (n_ids == 0) { fprintf(stderr, "deltafin run: the prompt is empty after tokenization\n"); goto done; }
    }
    /* KV positions this run can need (reserved inside --ram-budget) */
    long long kvp = (long long)n_ids + max_new + 1;
    mo.kv_positions = kvp > INT_MAX ? INT_MAX : (int)kvp;

    /* a streamed install (`deltafin setup --stream`): routed experts not yet local are fetched on first use */
    rc = cli_model_open(&m, &remote, model, &mo, err, sizeof err);
    if (rc == DF_EBUDGET && strstr(err, "KV cache")) { /* say where the KV cache figure comes from (as serve does) */
        size_t l = strlen(err);
        if (l < sizeof err)
            snprintf(err + l, sizeof err - l, "; the KV cache is for the prompt's %d token%s + --max-new %d positions: "
                     "lower --max-new (a smaller KV cache), or raise --ram-budget", n_ids, n_ids == 1 ? "" : "s", max_new);
    }
    if (rc) {
        progress_end();
        cli_model_open_error("run", model, dflt_how, err, rc); /* a setup install: the setup command that repairs it */
        goto done;
    }
    if (!quiet) cli_model_echo(m, model, dflt_how, NULL);
    if (preload && cli_preload("run", m, quiet)) { status = 1; goto done; }
    if ((rc = cli_draft_open("run", &dopt, m, &mo, &draft_model, &drafter))) { status = rc; goto done; }
    if (!quiet && drafter) {
        char line[1024];
        cli_draft_describe(&dopt, drafter, line, sizeof line);
        fprintf(stderr, "%s\n", line);
    }
    const df_tokenizer *tok = own_tok ? own_tok : df_model_tokenizer(m);
    int vocab = df_model_n_vocab(m);
    for (int i = 0; i < n_ids; i++)
        if (ids[i] >= vocab) { fprintf(stderr, "deltafin run: prompt id %d is outside the vocabulary (%d tokens)\n", ids[i], vocab); status = 2; goto done; }
    /* the context: prompt + generated tokens fit in it (as serve's prompt + completion); generation stops when full */
    int n_ctx = df_model_n_ctx_max(m);
    if (n_ids >= n_ctx) {
        fprintf(stderr, "deltafin run: the prompt has %d tokens and the context holds %d positions: no room to generate; "
                        "shorten the prompt\n", n_ids, n_ctx);
        goto done;
    }
    {
        char src[8400];
        long trained = cli_trained_positions(model, src, sizeof src);
        if (trained > 0 && n_ids > trained)
            fprintf(stderr, "deltafin run: warning: the prompt has %d tokens but %s was trained on %ld positions (%s); "
                            "past that its output is unreliable\n", n_ids, df_model_name(m), trained, src);
        else if (trained > 0 && trained < n_ctx && (long long)n_ids + max_new > trained) /* else the context stops first */
            fprintf(stderr, "deltafin run: note: %d prompt token%s + --max-new %d go past the %ld positions %s was trained "
                            "on (%s); the output may degrade after position %ld\n", n_ids, n_ids == 1 ? "" : "s", max_new, trained,
                    df_model_name(m), src, trained);
    }
    /* the lossy modes are labeled wherever results are printed, --quiet or not */
    if (quiet && !df_model_is_exact(m))
        fprintf(stderr, "deltafin run: NOT EXACT: %s\n",
                strstr(df_model_describe(m), "spine int8") ? "int8 spine" : "lossy bf16 spine");
    int gen_max = max_new, ctx_limited = 0;
    if ((long long)max_new > (long long)n_ctx - n_ids) { gen_max = n_ctx - n_ids; ctx_limited = 1; }
    int32_t stop[16];
    int n_stop = tok ? df_tokenizer_stop_ids(tok, stop, 16) : 0;
    rc = df_session_new(&s, m, n_ids + gen_max > n_ctx ? n_ctx : n_ids + gen_max, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin run: %s\n", err); goto done; }
    smp = df_sampler_new(&so);
    const int greedy = so.temperature <= 0.0f || so.top_k == 1; /* df_sample's argmax */
    logits = malloc(sizeof(float) * (size_t)vocab);
    out_ids = malloc(sizeof(int32_t) * (size_t)(gen_max + 1));
    if (!smp || !logits || !out_ids) { fprintf(stderr, "deltafin run: out of memory\n"); goto done; }
    if (tok && !print_ids) dt = df_detok_new(tok);
    df_model_stats_reset(m);
    double t_start = now_s();
    prefill_prog pp = {.t0 = t_start, .n_tokens = n_ids};
    struct sigaction sa_new, sa_int, sa_term, sa_hup;
    memset(&sa_new, 0, sizeof sa_new);
    sa_new.sa_handler = prefill_signal;
    sigemptyset(&sa_new.sa_mask);
    const int catch_sig = !quiet;
    /* SIGHUP only where it is not ignored (nohup keeps the run going) */
    const int hup = sigaction(SIGHUP, NULL, &sa_hup) == 0 && sa_hup.sa_handler != SIG_IGN;
    if (catch_sig) {
        sigaction(SIGINT, &sa_new, &sa_int);
        sigaction(SIGTERM, &sa_new, &sa_term);
        if (hup) sigaction(SIGHUP, &sa_new, NULL);
    }
    rc = df_eval(s, ids, n_ids, logits, 0, quiet ? NULL : prefill_progress, &pp, err, sizeof err);
    if (catch_sig) {
        sigaction(SIGINT, &sa_int, NULL);
        sigaction(SIGTERM, &sa_term, NULL);
        if (hup) sigaction(SIGHUP, &sa_hup, NULL);
    }
    g_prefill_line = 0;
    if (pp.shown) {
        double dt = now_s() - t_start;
        /* on a terminal, spaces overwrite the rest of the longer progress line; elsewhere the line ends with its text */
        fprintf(stderr, "%sprefill: %d tokens in %.1f s (%.1f tok/s)%*s\n", cli_cr(), n_ids, dt, dt > 0 ? n_ids / dt : 0.0,
                cli_stderr_tty() ? 30 : 0, "");
        progress_open = 0;
    }
    if (rc) { fprintf(stderr, "deltafin run: %s\n", err); goto done; }
    df_stats after_prefill;
    df_model_stats(m, &after_prefill);
    char buf[1024];
    int stopped = 0;
    struct sigaction sg_new, sg_int, sg_term, sg_hup;
    memset(&sg_new, 0, sizeof sg_new);
    sg_new.sa_handler = gen_signal;
    sigemptyset(&sg_new.sa_mask);
    g_gen_sig = 0;
    sigaction(SIGINT, &sg_new, &sg_int);
    sigaction(SIGTERM, &sg_new, &sg_term);
    if (hup) sigaction(SIGHUP, &sg_new, &sg_hup);
    const double t_gen = now_s(), cpu_gen = cpu_s();
    char last = 0; /* the last byte of text written */
    gen_out go = {out_ids, &n_out, stop, n_stop, dt, &last, 0};
    if (drafter) {
        /* speculative: the same tokens as the loop below, several per target eval */
        rc = dopt.sample && so.temperature > 0 ? df_drafter_set_sampling(drafter, &so, err, sizeof err) : 0;
        if (!rc) rc = df_spec_new(&spec, s, drafter, smp, &dopt.spec, err, sizeof err);
        if (rc) {
            fprintf(stderr, "deltafin run: --draft %s: %s\n", dopt.draft, err);
            if (rc == DF_EINVAL) status = 2;
            goto done;
        }
        int n_new = gen_max > 0 ? 1 : 0;
        if (n_new) out_ids[0] = df_sample(smp, logits, vocab);
        while (n_new > 0) { /* df_spec_step wrote its tokens at out_ids + n_out: gen_emit keeps them there */
            int halt = 0;
            for (int j = 0; j < n_new && !halt; j++) halt = gen_emit(&go, out_ids[n_out]);
            if (halt || n_out >= gen_max) break;
            n_new = df_spec_step(spec, out_ids[n_out - 1], out_ids + n_out, gen_max - n_out, err, sizeof err);
            if (n_new < 0) { fprintf(stderr, "\ndeltafin run: %s\n", err); goto done; }
        }
    }
    if (!drafter && greedy && gen_max > 0) {
        /* greedy: the first token from the prompt's logits, the rest by df_decode_greedy (on the GPU the token stays
         * there between steps); the same tokens as the loop below */
        const int32_t first = df_sample(smp, logits, vocab);
        if (!gen_emit(&go, first) && gen_max > 1 && !g_gen_sig)
            rc = df_decode_greedy(s, first, gen_max - 1, gen_emit, &go, NULL, err, sizeof err);
        if (rc) { fprintf(stderr, "\ndeltafin run: %s\n", err); goto done; }
    }
    for (int k = 0; !drafter && !greedy && k < gen_max; k++) {
        if (gen_emit(&go, df_sample(smp, logits, vocab)) || k + 1 == gen_max) break;
        rc = df_eval(s, &out_ids[n_out - 1], 1, logits, 0, NULL, NULL, err, sizeof err);
        if (rc) { fprintf(stderr, "\ndeltafin run: %s\n", err); goto done; }
    }
    stopped = go.stopped;
    const double gen_s = now_s() - t_gen, gen_cpu = cpu_s() - cpu_gen, total = now_s() - t_start;
    const int gen_sig = g_gen_sig;
    sigaction(SIGINT, &sg_int, NULL);
    sigaction(SIGTERM, &sg_term, NULL);
    if (hup) sigaction(SIGHUP, &sg_hup, NULL);
    /* text: on a terminal, or where stderr goes too, the output ends at the start of a line (a newline after the text
     * unless the text ends with one, so that the prompt or the stats follow on a line of their own); to a file or
     * pipe of its own exactly the generated bytes. Nothing generated (--max-new 0) prints nothing. */
    if (dt) {
        int w = df_detok_flush(dt, buf, sizeof buf);
        if (w > 0) { fwrite(buf, 1, (size_t)w, stdout); last = buf[w - 1]; }
        if (n_out && last != '\n' && text_ends_line()) fputc('\n', stdout);
    }
    if ((print_ids || !tok) && n_out) { /* without a tokenizer the ids are the output */
        for (int i = 0; i < n_out; i++) printf("%s%d", i ? "," : "", out_ids[i]);
        printf("\n");
    }
    fflush(stdout);
    if (gen_sig)
        fprintf(stderr, "deltafin run: interrupted (%s) after %d generated tokens\n",
                gen_sig == SIGINT ? "SIGINT" : gen_sig == SIGHUP ? "SIGHUP" : "SIGTERM", n_out);
    else if (ctx_limited && !stopped)
        fprintf(stderr, "deltafin run: stopped: context full (%d positions); generated %d of --max-new %d tokens\n", n_ctx, n_out,
                max_new);
    df_stats st;
    memset(&st, 0, sizeof st);
    if (stats) df_model_stats(m, &st);
    /* decode: the tokens after the first (which comes from the prompt's logits) and their time. Plain decoding:
     * the one-token evals. Speculative: the engine counts every verified position, rejected drafts included,
     * and not the drafter's time; the real rate is the generated tokens over the generation's wall time. */
    const uint64_t dec_tokens = drafter ? (uint64_t)(n_out > 1 ? n_out - 1 : 0) : st.decode_tokens;
    if (stats) {
        const double dec_s = drafter ? gen_s : st.decode_s;
        char dec_note[160] = "";
        if (drafter)
            snprintf(dec_note, sizeof dec_note, ", drafting included; the target verified %llu positions in %.3f s",
                     (unsigned long long)st.decode_tokens, st.decode_s);
        /* weight bytes per generated token: the decode evals' bytes / the tokens they gave (else the prefill's) */
        double per_tok = dec_tokens ? (double)(st.weight_bytes_read - after_prefill.weight_bytes_read) / dec_tokens
                                    : (double)after_prefill.weight_bytes_read;
        /* no decode step (--max-new 1, or a stop at the first token): no rate to print */
        char dec[400];
        if (dec_tokens) snprintf(dec, sizeof dec, "decode %.2f tok/s (%llu tokens in %.3f s%s)", dec_s > 0 ? dec_tokens / dec_s : 0.0,
                                 (unsigned long long)dec_tokens, dec_s, dec_note);
        else snprintf(dec, sizeof dec, "decode: no decode steps");
        /* nothing generated (--max-new 0): no first token to time */
        char ttft[64];
        if (n_out) snprintf(ttft, sizeof ttft, "TTFT %.3f s", st.ttft_s);
        else snprintf(ttft, sizeof ttft, "TTFT n/a (no token generated)");
        fprintf(stderr,
                "stats: prompt %d tokens, generated %d; %s; prefill %.2f tok/s; %s; "
                "weight bytes touched %.1f MB/token; experts read %.1f MB (demand) + %.1f MB (prefetch), hits %llu, misses %llu, "
                "I/O stall %.3f s; total %.3f s%s\n",
                n_ids, n_out, ttft, st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0.0,
                dec, per_tok / 1e6,
                st.expert_bytes_demand / 1e6, st.expert_bytes_prefetch / 1e6, (unsigned long long)st.expert_hits,
                (unsigned long long)st.expert_misses, st.io_stall_s, total,
                cli_exact_note(m));
        if (st.expert_hits + st.expert_misses) {
            fprintf(stderr, "stats: expert hit rate %.1f%%", 100.0 * st.expert_hits / (double)(st.expert_hits + st.expert_misses));
            if (st.prefetch_issued)
                fprintf(stderr, "; prefetch recall %.1f%% (%llu of %llu guesses used)", 100.0 * st.prefetch_useful / (double)st.prefetch_issued,
                        (unsigned long long)st.prefetch_useful, (unsigned long long)st.prefetch_issued);
            /* the decode steps only: a one-token prompt's eval is counted with them by the engine */
            const uint64_t la_on = st.prefetch_steps_on - after_prefill.prefetch_steps_on,
                           la_all = la_on + st.prefetch_steps_off - after_prefill.prefetch_steps_off;
            if (la_all)
                fprintf(stderr, "; lookahead on for %llu of %llu decode steps%s", (unsigned long long)la_on,
                        (unsigned long long)la_all,
                        strstr(df_model_describe(m), "prefetch ungated") ? " (ungated)" : " (measured A/B)");
            for (int d = 0; d < st.n_drives; d++)
                fprintf(stderr, "; drive %d: %.1f MB at %.2f GB/s", d, st.drive_bytes[d] / 1e6,
                        st.drive_busy_s[d] > 0 ? st.drive_bytes[d] / st.drive_busy_s[d] / 1e9 : 0.0);
            fputc('\n', stderr);
        }
    }
    if (stats && n_out < 2) /* the first token comes from the prompt's logits: no generation step to time */
        fprintf(stderr, "stats: generation %d token%s, no decode steps (draft %s)\n", n_out, n_out == 1 ? "" : "s",
                drafter ? df_drafter_kind(drafter) : "off");
    else if (stats) /* tokens after the first (which comes from the prompt's logits) per second of generation */
        fprintf(stderr, "stats: generation %d tokens, %d after the first in %.3f s: %.2f tok/s, CPU time %.3f s (draft %s)\n",
                n_out, n_out - 1, gen_s, gen_s > 0 ? (n_out - 1) / gen_s : 0.0, gen_cpu, drafter ? df_drafter_kind(drafter) : "off");
    if (stats && spec) {
        df_spec_stats sst;
        df_spec_get_stats(spec, &sst);
        cli_draft_print_stats(stderr, &sst, drafter);
    }
    if (stats && remote) stream_print_stats(remote, stderr);
    if (stats && profile) { /* after every --stats line */
        /* prefill phases from the snapshot after the prompt; decode phases per generated token */
        double pre = 0, dec = 0;
        for (int p = 0; p < DF_PHASES; p++) { pre += after_prefill.phase_s[p]; dec += st.phase_s[p] - after_prefill.phase_s[p]; }
        const double nd = dec_tokens ? (double)dec_tokens : 1; /* per generated token, as the stats line */
        fprintf(stderr, "profile: phase            prefill s   share   decode ms/token   share\n");
        for (int p = 0; p < DF_PHASES; p++) {
            const double a = after_prefill.phase_s[p], d = st.phase_s[p] - after_prefill.phase_s[p];
            fprintf(stderr, "profile: %-16s %10.3f  %5.1f%%  %16.3f  %5.1f%%\n", df_phase_name(p), a, pre > 0 ? 100 * a / pre : 0,
                    1e3 * d / nd, dec > 0 ? 100 * d / dec : 0);
        }
        fprintf(stderr, "profile: %-16s %10.3f          %16.3f\n", "total", pre, 1e3 * dec / nd);
    }
    status = gen_sig ? 128 + gen_sig : 0;
done:
    df_spec_free(spec);
    df_drafter_free(drafter);
    df_model_close(draft_model);
    df_detok_free(dt);
    free(logits);
    free(out_ids);
    free(ids);
    df_sampler_free(smp);
    df_session_free(s);
    df_model_close(m);
    stream_close(remote);
    df_tokenizer_free(own_tok);
    free(prompt_buf);
    return status;
}
