/*
 * cmd_chat.c — `deltafin chat`: a multi-turn conversation with a model in its chat format, one user message per line
 * of stdin, each reply streamed to stdout as it is generated. The conversation is kept as an OpenAI-style message list
 * (cJSON) and rendered whole each turn (df_chat_render); the session's KV cache keeps the tokens the new rendering
 * shares with what it holds, so a turn evaluates only its new tokens. Greedy replies are the tokens `deltafin run`
 * generates for the same rendered conversation. Lines that start with / are commands (/help or /?, /clear, /exit, /quit or /bye).
 * On a terminal a banner and a "> " prompt go to stderr; piped, stdout carries only the replies, one per line.
 * Ctrl-C stops the reply being generated (a second one, or one at the prompt, ends the chat: exit status 130).
 * Uses include/deltafin.h for the model, cli_model.h for what it shares with `run`.
 */
#include "cli.h"
#include "cli_model.h"
#include "hub/stream.h"
#include "deltafin.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHAT_MAX_NEW 512 /* the default --max-new: a reply, not run's 32-token continuation */
/* the longest line a Linux terminal hands over in its line-editing (canonical) mode, the newline included: the
 * characters typed or pasted past 4095 are discarded by the terminal, so a line this long was most likely cut */
#define TTY_LINE_MAX 4096

static void chat_usage(FILE *f) {
    fprintf(f,
            "usage: deltafin chat [--model DIR] [--system TEXT] [--max-new N] [options]\n"
            "A conversation with the model in its chat format: one user message per line of stdin, each reply\n"
            "streamed to stdout (followed by a newline) as it is generated. On a terminal a banner and a \"> \" prompt\n"
            "go to stderr; with stdin piped there is neither, so stdout holds only the replies, one after another.\n"
            "Each turn renders the whole conversation and evaluates only the tokens the KV cache does not hold yet\n"
            "(the common prefix with the previous turn is kept); a greedy reply is the one `deltafin run` generates\n"
            "for the same rendered conversation.\n"
            "  --model DIR          native model dir (manifest.json) or Hugging Face dir (config.json; converted once into the cache);\n"
            "                       default: the model `deltafin setup` installed, else the embedded models/kimi-mini\n"
            "  --system TEXT        a system message first in the conversation (default: none; the chat template\n"
            "                       may add its own, as Kimi's does)\n"
            "  --max-new N          most tokens of one reply, 1..2147483647 (default %d); a reply ends earlier at\n"
            "                       the model's end-of-turn token\n"
            "  --ctx N              KV cache positions of the conversation (default min(4096, model maximum); more than\n"
            "                       the model maximum is lowered to it, with a note); a message that would not fit is\n"
            "                       refused with a note (/clear starts a new conversation)\n"
            "  --thinking           render with thinking on (enable_thinking=True; formats without the switch ignore it)\n"
            "  --no-thinking        render with thinking off (enable_thinking=False); neither: the template's default\n"
            "  --stats              after each reply, on stderr: the conversation's tokens, those reused from the KV\n"
            "                       cache and those evaluated, TTFT and decode tok/s\n"
            "  --quiet              no configuration line or banner on stderr (warnings and notes are still shown)\n"
            "  --threads N          compute threads, 0..4096 (default 0: all cores)\n"
            "  --temperature T      0..2; 0 = greedy (default)\n"
            "  --top-p P            nucleus sampling, in (0, 1] (default 1: off)\n"
            "  --top-k K            sample among the K most likely tokens (default 0: off; -1: off too)\n"
            "  --seed S             sampling seed, -2^63..2^64-1 (default 0); the sampler's stream runs on from one\n"
            "                       reply to the next and starts again at /clear\n"
            "                       (--top-p, --top-k and --seed apply with --temperature > 0; at 0 a note says so)\n"
            "  --ram-budget SIZE    bytes for weights + KV cache (--ctx positions), e.g. 4G, 512M (default 0: unlimited)\n"
            "  --expert-dirs D1,D2  where the expert packs live (override)\n"
            "  --cache-dir DIR      where an HF checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n"
            "  --spine MODE         source|bf16|int8 spine when converting an HF checkpoint (int8 is NOT exact)\n"
            "  --events FILE        per-token JSONL I/O events, appended to FILE\n"
            "  --heat FILE|off      persistent expert heat histogram (default with --ram-budget: MODEL/heat.bin)\n"
            "  --prefetch MODE      auto | on | off | ungated: router lookahead prefetch, as in `deltafin run`\n"
            "  --prefault MODE      auto (on) | on | off: fault the expert cache in before its first reads\n"
            "  --io-depth N         expert reads in flight per drive (16)\n"
            "  --io-size SIZE       bytes of one expert read request, a multiple of 4K, at most 64M (1M)\n"
            "  --preload            read every routed expert into memory before the first message\n"
            "  --backend NAME       auto (default) | cpu | cpu-scalar | cpu-avx2 | cpu-avx512 | cuda; default env DF_BACKEND\n"
            "  --gpu-budget SIZE    backend cuda: GPU memory for the routed-expert cache (default all free less 1G)\n"
            "Commands, at the start of a line: /help (or /?) lists them, /clear starts a new conversation (the history\n"
            "and the KV cache are dropped), /exit, /quit or /bye (or the end of input, Ctrl-D) ends the chat with status\n"
            "0; another /word is an error (no model call); //TEXT sends /TEXT as a message. An empty line (or one of\n"
            "only spaces and tabs) is ignored. Ctrl-C while a reply is generated stops it (what it said stays in the\n"
            "conversation; before its first token, while the message is evaluated, the message is dropped); Ctrl-C at\n"
            "the prompt, or a second one, ends the chat with status 130. A message or reply that would overflow --ctx\n"
            "is said on stderr and the chat goes on. Messages must be valid UTF-8. Errors after the start (a message that does\n"
            "not fit, a bad command) are said on stderr and do not end the chat. A terminal passes lines of at most\n"
            "4095 bytes and discards what is typed or pasted past that: a line that long is dropped, with a note\n"
            "(send longer messages from a pipe or a file).\n",
            CHAT_MAX_NEW);
}

/* every option with whether it takes a value: the names an unknown option is compared with, in this order, and the
 * value options that may be given once */
static const cli_option chat_options[] = {
    {"--help", 0}, {"--model", 1}, {"--system", 1}, {"--max-new", 1}, {"--ctx", 1}, {"--thinking", 0},
    {"--no-thinking", 0}, {"--stats", 0}, {"--quiet", 0}, {"--preload", 0}, {"--threads", 1}, {"--temperature", 1},
    {"--top-p", 1}, {"--top-k", 1}, {"--seed", 1}, {"--ram-budget", 1}, {"--expert-dirs", 1}, {"--cache-dir", 1},
    {"--events", 1}, {"--heat", 1}, {"--prefetch", 1}, {"--prefault", 1}, {"--backend", 1}, {"--gpu-budget", 1},
    {"--spine", 1}, {"--io-depth", 1}, {"--io-size", 1}, {NULL, 0}};
CLI_OPTIONS_FIT(chat_options);

/* ------------------------------------------------------------------ Ctrl-C */

static volatile sig_atomic_t g_busy; /* 1 while a turn runs (its prefill and reply) */
static volatile sig_atomic_t g_stop; /* SIGINT during a turn: stop the reply at the next token */
static volatile sig_atomic_t g_quit; /* SIGINT outside a turn (at the prompt): end the chat */

/* SIGINT: the first during a turn stops its reply; a second one during the same turn ends the process at once
 * (130); one at the prompt ends the chat (the read returns EINTR). Async-signal-safe: flags, write(2), _exit. */
static void on_sigint(int sig) {
    (void)sig;
    if (g_busy && !g_stop) { g_stop = 1; return; }
    if (g_busy) {
        static const char msg[] = "\ndeltafin chat: interrupted\n";
        (void)!write(STDERR_FILENO, msg, sizeof msg - 1);
        _exit(130);
    }
    g_quit = 1;
}

/* installs on_sigint for SIGINT: without SA_RESTART while reading a line (so that Ctrl-C ends the read), with it
 * during a turn (the engine's reads and waits go on; the flag is checked between tokens) */
static void sigint_mode(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, NULL);
}

/* ------------------------------------------------------------ the session */

typedef struct {
    df_model *m;
    const df_tokenizer *tok;
    df_session *s;
    df_sampler *smp;
    df_sampler_opts so;
    cJSON *msgs;            /* the conversation: the system message (when given), then user / assistant in turn */
    const char *system;     /* --system, or NULL */
    int cflags;             /* df_chat_render flags */
    int max_new, n_ctx, vocab, stats, tty;
    long model_max;         /* the most positions the model takes (0: unknown): how far --ctx may grow */
    int32_t stop[16];       /* end-of-turn ids */
    int n_stop;
    float *logits;
    long trained;           /* positions the model was trained on (0: unknown) */
    char trained_src[8400]; /* where that figure comes from */
    int warned;             /* the note past the trained positions was given in this conversation */
    int turn;               /* turns of this conversation so far */
} chat_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* a new conversation: the message list holds the system message alone (or nothing); 0, or -1 out of memory */
static int conversation_new(chat_state *c) {
    cJSON_Delete(c->msgs);
    c->msgs = cJSON_CreateArray();
    if (!c->msgs) return -1;
    if (c->system) {
        cJSON *sm = cJSON_CreateObject();
        if (!sm || !cJSON_AddStringToObject(sm, "role", "system") || !cJSON_AddStringToObject(sm, "content", c->system)) {
            cJSON_Delete(sm);
            return -1;
        }
        cJSON_AddItemToArray(c->msgs, sm);
    }
    c->warned = 0;
    c->turn = 0;
    return 0;
}

/* appends {"role": role, "content": text} to the conversation: 0, or -1 out of memory */
static int conversation_add(chat_state *c, const char *role, const char *text) {
    cJSON *o = cJSON_CreateObject();
    if (!o || !cJSON_AddStringToObject(o, "role", role) || !cJSON_AddStringToObject(o, "content", text)) {
        cJSON_Delete(o);
        return -1;
    }
    cJSON_AddItemToArray(c->msgs, o);
    return 0;
}

/* drops the last message (a user message whose turn did not happen) */
static void conversation_pop(chat_state *c) {
    int n = cJSON_GetArraySize(c->msgs);
    if (n > 0) cJSON_DeleteItemFromArray(c->msgs, n - 1);
}

/* The conversation rendered in the model's chat format with the generation prompt, tokenized as `run --chat`
 * tokenizes its rendering (the template's special markers parsed as specials, nothing added). 0 with *ids
 * (malloc'd) and *n, else -1 after a message. */
static int conversation_tokens(chat_state *c, int32_t **ids, size_t *n) {
    char err[1024], *json = cJSON_PrintUnformatted(c->msgs), *text = NULL;
    if (!json) { fprintf(stderr, "deltafin chat: out of memory\n"); return -1; }
    int rc = df_chat_render(c->tok, json, NULL, DF_CHAT_ADD_GENERATION_PROMPT | c->cflags, &text, err, sizeof err);
    free(json);
    if (rc) { fprintf(stderr, "deltafin chat: chat format: %s; the message is dropped\n", err); return -1; }
    rc = df_tokenize(c->tok, text, strlen(text), DF_TOK_PARSE_SPECIAL, ids, n, err, sizeof err);
    free(text);
    if (rc) { fprintf(stderr, "deltafin chat: tokenize: %s; the message is dropped\n", err); return -1; }
    return 0;
}

/* the note, once per conversation, that it has grown past the positions the model was trained on */
static void note_trained(chat_state *c, int positions) {
    if (c->warned || c->trained <= 0 || positions <= c->trained) return;
    c->warned = 1;
    fprintf(stderr, "deltafin chat: note: the conversation has reached %d tokens, past the %ld positions %s was trained "
                    "on (%s); its replies may degrade: /clear starts a new conversation\n", positions, c->trained,
            df_model_name(c->m), c->trained_src);
}

/* a reply as it is generated: its text (for the history) and what was printed */
typedef struct {
    chat_state *c;
    df_detok *dt;
    char *text;       /* the reply's text so far (NUL-terminated) */
    size_t len, cap;
    int oom;
    int n_tokens;     /* reply tokens (the end-of-turn token not counted) */
    int ended;        /* 1: an end-of-turn token ended it */
    double t_first;   /* when the first token was chosen */
} reply;

/* appends printed text to the reply's copy */
static void reply_text(reply *r, const char *p, size_t n) {
    if (r->oom || !n) return;
    if (r->len + n + 1 > r->cap) {
        size_t cap = r->cap ? r->cap : 256;
        while (cap < r->len + n + 1) cap *= 2;
        char *t = realloc(r->text, cap);
        if (!t) { r->oom = 1; return; }
        r->text = t;
        r->cap = cap;
    }
    memcpy(r->text + r->len, p, n);
    r->len += n;
    r->text[r->len] = 0;
}

/* writes text to stdout at once (the reply streams) and to the reply's copy */
static void reply_write(reply *r, const char *p, int n) {
    if (n <= 0) return;
    fwrite(p, 1, (size_t)n, stdout);
    fflush(stdout);
    reply_text(r, p, (size_t)n);
}

/* A chosen token (df_decode_greedy's on_token, and each sampled token): an end-of-turn token ends the reply;
 * another is printed (its complete UTF-8 characters) and kept. 1 = stop here (end of turn, or Ctrl-C). */
static int reply_token(void *user, int32_t id) {
    reply *r = user;
    if (!r->t_first) r->t_first = now_s();
    for (int q = 0; q < r->c->n_stop; q++)
        if (r->c->stop[q] == id) return r->ended = 1;
    r->n_tokens++;
    char buf[1024];
    reply_write(r, buf, df_detok_push(r->dt, id, buf, sizeof buf));
    return g_stop != 0;
}

/* df_eval's progress during a turn's prefill: Ctrl-C cancels it (DF_ECANCELLED, the session as before) */
static int prefill_cancel(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user, (void)what, (void)done, (void)total;
    return g_stop != 0;
}

/* One turn: the user's message joins the conversation, the new rendering's tokens past the KV cache's common prefix
 * are evaluated, and the reply is generated, streamed to stdout (then a newline) and added to the conversation. A
 * message that cannot be taken (it does not fit the context, an engine error, Ctrl-C before the reply began) is said
 * on stderr and dropped. Returns 0, or -1 when the chat cannot go on (out of memory). */
static int chat_turn(chat_state *c, const char *message) {
    const double t0 = now_s();
    char err[1024];
    int32_t *ids = NULL;
    size_t n_sz = 0;
    /* Ctrl-C from here on belongs to this turn (rendering and tokenizing a long message take a while too) */
    g_stop = 0;
    g_busy = 1;
    if (conversation_add(c, "user", message)) { g_busy = 0; fprintf(stderr, "deltafin chat: out of memory\n"); return -1; }
    if (conversation_tokens(c, &ids, &n_sz)) { g_busy = 0; g_stop = 0; conversation_pop(c); return 0; }
    const int n = n_sz > INT_MAX ? INT_MAX : (int)n_sz;
    if (g_stop) {
        g_busy = 0;
        g_stop = 0;
        fprintf(stderr, "deltafin chat: interrupted before the reply began; the message is dropped\n");
        free(ids);
        conversation_pop(c);
        return 0;
    }
    if (n >= c->n_ctx) { /* no room for even one reply token */
        g_busy = 0;
        if (c->turn == 0) { /* a new conversation: /clear would not help; a larger --ctx, or a shorter message */
            char fix[160];
            if (c->model_max > n) snprintf(fix, sizeof fix, "a larger --ctx (more than %d, at most %ld) holds it", n, c->model_max);
            else if (c->model_max > 0) snprintf(fix, sizeof fix, "the model takes at most %ld positions: send a shorter message", c->model_max);
            else snprintf(fix, sizeof fix, "send a shorter message");
            fprintf(stderr, "deltafin chat: the message in the chat format%s is %d tokens and the context holds %d positions: "
                            "the message is dropped; %s\n", c->system ? " (with the --system message)" : "", n, c->n_ctx, fix);
        } else {
            char more[96] = "";
            if (c->model_max > c->n_ctx) snprintf(more, sizeof more, " (or a larger --ctx, at most %ld, holds more)", c->model_max);
            fprintf(stderr, "deltafin chat: the conversation with this message is %d tokens and the context holds %d "
                            "positions: the message is dropped; /clear starts a new conversation%s\n", n, c->n_ctx, more);
        }
        free(ids);
        conversation_pop(c);
        return 0;
    }
    /* keep the KV cache's common prefix with the new rendering; at least one token is evaluated, for its logits */
    const int np = df_session_n_past(c->s);
    const int32_t *have = df_session_tokens(c->s);
    int keep = 0;
    while (keep < np && keep < n && have[keep] == ids[keep]) keep++;
    if (keep >= n) keep = n - 1;
    if (keep < np && df_session_truncate(c->s, keep)) {
        keep = 0;
        if (df_session_truncate(c->s, 0)) {
            g_busy = 0;
            fprintf(stderr, "deltafin chat: cannot reset the KV cache\n");
            free(ids);
            return -1;
        }
    }
    df_model_stats_reset(c->m);
    const double tp = now_s();
    int rc = df_eval(c->s, ids + keep, n - keep, c->logits, 0, prefill_cancel, NULL, err, sizeof err);
    const double prefill_s = now_s() - tp;
    free(ids);
    if (rc) {
        g_busy = 0;
        df_session_truncate(c->s, keep); /* the session as before the call */
        if (rc == DF_ECANCELLED) fprintf(stderr, "deltafin chat: interrupted before the reply began; the message is dropped\n");
        else fprintf(stderr, "deltafin chat: %s; the message is dropped\n", err);
        g_stop = 0;
        conversation_pop(c);
        return 0;
    }
    note_trained(c, n); /* the message is in the conversation now */
    /* the reply: until an end-of-turn token, --max-new tokens, or the context's end */
    int gen_max = c->max_new, ctx_limited = 0;
    if (gen_max > c->n_ctx - n) { gen_max = c->n_ctx - n; ctx_limited = 1; }
    reply r = {.c = c, .dt = df_detok_new(c->tok)};
    if (!r.dt) { g_busy = 0; fprintf(stderr, "deltafin chat: out of memory\n"); return -1; }
    const int greedy = c->so.temperature <= 0.0f || c->so.top_k == 1; /* df_sample's argmax */
    char gen_err[1024] = "";
    if (greedy) {
        /* the first token from the prompt's logits, the rest by df_decode_greedy: run's greedy path */
        const int32_t first = df_sample(c->smp, c->logits, c->vocab);
        if (!reply_token(&r, first) && gen_max > 1)
            rc = df_decode_greedy(c->s, first, gen_max - 1, reply_token, &r, NULL, gen_err, sizeof gen_err);
    } else {
        for (int k = 0; k < gen_max; k++) {
            const int32_t id = df_sample(c->smp, c->logits, c->vocab);
            if (reply_token(&r, id) || k + 1 == gen_max) break;
            if ((rc = df_eval(c->s, &id, 1, c->logits, 0, NULL, NULL, gen_err, sizeof gen_err))) break;
        }
    }
    g_busy = 0;
    char buf[64];
    reply_write(&r, buf, df_detok_flush(r.dt, buf, sizeof buf));
    df_detok_free(r.dt);
    fputc('\n', stdout);
    fflush(stdout);
    const int interrupted = g_stop != 0 && !r.ended;
    g_stop = 0;
    if (rc) fprintf(stderr, "deltafin chat: %s; the reply stops here\n", gen_err);
    else if (interrupted)
        fprintf(stderr, "deltafin chat: reply interrupted (Ctrl-C) after %d token%s; it stays in the conversation\n",
                r.n_tokens, r.n_tokens == 1 ? "" : "s");
    else if (ctx_limited && !r.ended && r.n_tokens >= gen_max)
        fprintf(stderr, "deltafin chat: the context is full (%d positions): the reply stops here; /clear starts a new "
                        "conversation\n", c->n_ctx);
    if (r.oom || conversation_add(c, "assistant", r.text ? r.text : "")) {
        free(r.text);
        fprintf(stderr, "deltafin chat: out of memory\n");
        return -1;
    }
    free(r.text);
    c->turn++;
    note_trained(c, n + r.n_tokens);
    if (c->stats) {
        df_stats st;
        df_model_stats(c->m, &st);
        const int evaluated = n - keep;
        char dec[160];
        if (st.decode_tokens)
            snprintf(dec, sizeof dec, "decode %.2f tok/s (%llu tokens in %.3f s)", st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0.0,
                     (unsigned long long)st.decode_tokens, st.decode_s);
        else snprintf(dec, sizeof dec, "decode: no decode steps");
        fprintf(stderr, "stats: turn %d: conversation %d tokens, %d reused from the KV cache, %d evaluated (prefill %.3f s, "
                        "%.2f tok/s); TTFT %.3f s; reply %d token%s%s; %s%s\n", c->turn, n, keep, evaluated, prefill_s,
                prefill_s > 0 ? evaluated / prefill_s : 0.0, r.t_first ? r.t_first - t0 : 0.0, r.n_tokens,
                r.n_tokens == 1 ? "" : "s", r.ended ? " + end of turn" : "", dec, cli_exact_note(c->m));
    }
    return 0;
}

/* /help's text, on stderr */
static void chat_help(void) {
    fprintf(stderr, "commands (at the start of a line):\n"
                    "  /help, /?      this list\n"
                    "  /clear         start a new conversation (the history and the KV cache are dropped)\n"
                    "  /exit, /quit, /bye  end the chat (as the end of input, Ctrl-D)\n"
                    "  //TEXT         send /TEXT as a message\n"
                    "Ctrl-C stops a reply being generated (what it said stays in the conversation); at the prompt it ends "
                    "the chat.\n");
}

/* What a line that starts with / asks: 1 = end the chat, 0 = done (or an error said), -1 = cannot go on. */
static int chat_command(chat_state *c, char *line) {
    char *end = line + strcspn(line, " \t");
    char *rest = end + strspn(end, " \t");
    const char saved = *end;
    *end = 0;
    static const char *const names[] = {"/help", "/clear", "/exit", "/quit", "/bye", "/?", NULL};
    int which = -1;
    for (int k = 0; names[k]; k++)
        if (!strcmp(line, names[k])) which = k;
    if (which == 5) which = 0; /* /? is /help (as ollama's) */
    if (which < 0) {
        const char *near = cli_closest(line, names);
        fprintf(stderr, "deltafin chat: unknown command '%s'%s%s%s; /help lists the commands (//TEXT sends /TEXT as a "
                        "message)\n", line, near ? " (did you mean '" : "", near ? near : "", near ? "'?)" : "");
        return 0;
    }
    if (*rest) {
        fprintf(stderr, "deltafin chat: %s takes no argument (got '%s'); nothing done\n", line, rest);
        return 0;
    }
    *end = saved;
    switch (which) {
    case 0: chat_help(); return 0;
    case 1:
        if (conversation_new(c)) { fprintf(stderr, "deltafin chat: out of memory\n"); return -1; }
        if (df_session_truncate(c->s, 0)) { fprintf(stderr, "deltafin chat: cannot reset the KV cache\n"); return -1; }
        df_sampler_free(c->smp); /* the sampler's stream starts again, as a new run's */
        if (!(c->smp = df_sampler_new(&c->so))) { fprintf(stderr, "deltafin chat: out of memory\n"); return -1; }
        if (c->tty) fprintf(stderr, "(new conversation)\n");
        return 0;
    default: return 1;
    }
}

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system = NULL;
    int max_new = CHAT_MAX_NEW, ctx = 0, stats = 0, quiet = 0, preload = 0, spine_given = 0, cflags = 0;
    long long iv;
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.backend = cli_default_backend();
    cli_sampling smpl;
    cli_sampling_defaults(&smpl);
    if (cli_check_repeated_in("chat", argc, argv, chat_options, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        int r;
        const char *a = argv[i];
#define NEXT() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "deltafin chat: %s needs a value\n", a), (char *)NULL))
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { chat_usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { if (!(model = NEXT())) return 2; }
        else if (!strcmp(a, "--system")) { if (!(system = NEXT())) return 2; }
        else if (!strcmp(a, "--max-new")) {
            const char *v = NEXT();
            if (!v || cli_parse_int("chat", a, v, 1, INT_MAX, &iv)) return 2;
            max_new = (int)iv;
        }
        else if (!strcmp(a, "--ctx")) {
            const char *v = NEXT();
            if (!v || cli_parse_int("chat", a, v, 2, 1 << 30, &iv)) return 2;
            ctx = (int)iv;
        }
        else if (!strcmp(a, "--thinking")) cflags |= DF_CHAT_THINKING;
        else if (!strcmp(a, "--no-thinking")) cflags |= DF_CHAT_NO_THINKING;
        else if (!strcmp(a, "--stats")) stats = 1;
        else if (!strcmp(a, "--quiet")) quiet = 1;
        else if (!strcmp(a, "--preload")) preload = 1;
        else if ((r = cli_sampling_arg("chat", argc, argv, &i, &smpl)) != 0) { if (r < 0) return 2; }
        else if ((r = cli_model_arg("chat", argc, argv, &i, &mo, &spine_given)) != 0) { if (r < 0) return 2; }
        else return cli_unknown_option_in("chat", a, chat_options, NULL);
#undef NEXT
    }
    if ((cflags & DF_CHAT_THINKING) && (cflags & DF_CHAT_NO_THINKING)) {
        fprintf(stderr, "deltafin chat: --thinking and --no-thinking contradict each other: give one of them\n");
        return 2;
    }
    if (system && cli_check_utf8("chat", "--system", system, strlen(system))) return 2;
    cli_sampling_note("chat", &smpl);
    if (cli_check_env_aliases("chat", mo.backend, mo.prefetch, mo.prefault)) return 2;
    /* the model: --model, else the default as `run` finds it */
    char dflt_dir[4096], dflt_how[4600] = "";
    if (!model) {
        if (cli_default_model("chat", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    /* the messages come from stdin and the replies go to stdout: a closed one is said now (before opening the model,
     * whose files would otherwise take its descriptor: a read of stdin would read one of them) */
    if (fcntl(STDIN_FILENO, F_GETFD) < 0) {
        fprintf(stderr, "deltafin chat: stdin is closed: the chat reads its messages from stdin, one per line (a terminal, "
                        "a pipe or a file)\n");
        return 1;
    }
    if (fcntl(STDOUT_FILENO, F_GETFD) < 0) {
        fprintf(stderr, "deltafin chat: stdout is closed: the chat writes its replies to stdout (redirect it to /dev/null "
                        "to discard them)\n");
        return 1;
    }
    int rc = cli_model_check("chat", model, spine_given);
    if (rc) return rc;
    if (cli_model_need_tokenizer("chat", model, NULL)) return 1;
    if (!quiet) { mo.progress = cli_convert_progress; mo.progress_user = NULL; }
    /* --ctx past the model's maximum is lowered now, so that a --ram-budget reserves (and its error names) the KV cache
     * of the positions the chat will use */
    const long cfg_max = cli_max_positions(model);
    if (ctx && cfg_max > 0 && ctx > cfg_max) {
        fprintf(stderr, "deltafin chat: note: --ctx %d is more than the model's maximum of %ld positions; using %ld\n",
                ctx, cfg_max, cfg_max);
        ctx = (int)cfg_max;
    }
    mo.kv_positions = ctx ? ctx : 4096; /* inside --ram-budget: the conversation's KV cache */

    char err[1024] = "";
    int status = 1;
    struct stream_src *remote = NULL;
    char *line = NULL;
    chat_state c;
    memset(&c, 0, sizeof c);
    c.so = smpl.so;
    c.system = system;
    c.cflags = cflags;
    c.max_new = max_new;
    c.stats = stats;
    c.tty = isatty(STDIN_FILENO);
    rc = cli_model_open(&c.m, &remote, model, &mo, err, sizeof err);
    if (rc == DF_EBUDGET && strstr(err, "KV cache")) { /* say where the KV cache figure comes from */
        size_t l = strlen(err);
        if (l < sizeof err)
            snprintf(err + l, sizeof err - l, "; the KV cache is for %s%d positions%s: lower --ctx (a smaller KV cache), "
                     "or raise --ram-budget", ctx ? "--ctx " : "", cfg_max > 0 && mo.kv_positions > cfg_max ? (int)cfg_max :
                     mo.kv_positions, ctx ? "" : " (the default --ctx)");
    }
    if (rc) {
        cli_convert_progress_end();
        cli_model_open_error("chat", model, dflt_how, err, rc);
        goto done;
    }
    if (!(c.tok = df_model_tokenizer(c.m))) {
        const char *why = df_model_tokenizer_error(c.m);
        fprintf(stderr, "deltafin chat: model %s: %s\n", model, why ? why : "no tokenizer");
        goto done;
    }
    /* the context: --ctx, or min(4096, the model's maximum) */
    const int ctx_max = df_model_n_ctx_max(c.m);
    int n_ctx = ctx ? ctx : ctx_max > 0 && ctx_max < 4096 ? ctx_max : 4096;
    if (ctx_max > 0 && n_ctx > ctx_max) {
        if (ctx) fprintf(stderr, "deltafin chat: note: --ctx %d is more than the model's maximum of %d positions; using %d\n",
                         ctx, ctx_max, ctx_max);
        n_ctx = ctx_max;
    }
    if (!quiet) {
        char extra[160];
        snprintf(extra, sizeof extra, "; chat: context %d positions, --max-new %d", n_ctx, max_new);
        cli_model_echo(c.m, model, dflt_how, extra);
    }
    if (quiet && !df_model_is_exact(c.m)) /* the lossy modes are labeled wherever results are printed */
        fprintf(stderr, "deltafin chat: NOT EXACT: %s\n",
                strstr(df_model_describe(c.m), "spine int8") ? "int8 spine" : "lossy bf16 spine");
    if (preload && cli_preload("chat", c.m, quiet)) goto done;
    if ((rc = df_session_new(&c.s, c.m, n_ctx, err, sizeof err))) { fprintf(stderr, "deltafin chat: %s\n", err); goto done; }
    c.n_ctx = df_session_n_ctx(c.s);
    /* how far --ctx may grow: the open model's maximum, except under a --ram-budget (there df_model_n_ctx_max is the
     * KV cache's reserve, --ctx itself): the config's */
    c.model_max = mo.ram_budget ? cfg_max : ctx_max;
    c.vocab = df_model_n_vocab(c.m);
    c.n_stop = df_tokenizer_stop_ids(c.tok, c.stop, 16);
    c.smp = df_sampler_new(&c.so);
    c.logits = malloc(sizeof(float) * (size_t)c.vocab);
    if (!c.smp || !c.logits || conversation_new(&c)) { fprintf(stderr, "deltafin chat: out of memory\n"); goto done; }
    c.trained = cli_trained_positions(model, c.trained_src, sizeof c.trained_src);
    { /* the chat format renders at all (a model without a chat template): said now, not at the first message */
        if (conversation_add(&c, "user", "hi")) { fprintf(stderr, "deltafin chat: out of memory\n"); goto done; }
        char *json = cJSON_PrintUnformatted(c.msgs), *text = NULL;
        rc = json ? df_chat_render(c.tok, json, NULL, DF_CHAT_ADD_GENERATION_PROMPT | c.cflags, &text, err, sizeof err)
                  : DF_ENOMEM;
        free(json);
        free(text);
        conversation_pop(&c);
        if (rc) {
            fprintf(stderr, "deltafin chat: %s has no usable chat format: %s\n", df_model_name(c.m),
                    rc == DF_ENOMEM ? "out of memory" : err);
            goto done;
        }
    }
    if (c.tty && !quiet)
        fprintf(stderr, "deltafin chat with %s (context %d positions). Type a message and press Enter; /help lists the "
                        "commands, /exit or Ctrl-D ends the chat.\n", df_model_name(c.m), c.n_ctx);
    status = 0;
    size_t cap = 0;
    for (;;) {
        if (g_quit) { status = 130; break; }
        if (c.tty) { fputs("> ", stderr); fflush(stderr); }
        sigint_mode(0);
        errno = 0;
        ssize_t len = g_quit ? -1 : getline(&line, &cap, stdin);
        const int e = errno;
        sigint_mode(1);
        if (g_quit) { if (c.tty) fputc('\n', stderr); status = 130; break; }
        if (len < 0) {
            if (ferror(stdin) && e != EINTR) { fprintf(stderr, "deltafin chat: cannot read stdin: %s\n", strerror(e)); status = 1; }
            else if (c.tty) fputc('\n', stderr); /* Ctrl-D: the shell's prompt on a line of its own */
            break;
        }
        if (c.tty && len >= TTY_LINE_MAX) { /* the terminal cut it: a reply to part of a message would mislead */
            fprintf(stderr, "deltafin chat: the line reached the terminal's limit of %d bytes, so the terminal most likely "
                            "cut it there: the message is dropped; send a longer message from a pipe or a file "
                            "(deltafin chat < FILE, one message per line)\n", TTY_LINE_MAX - 1);
            continue;
        }
        if (len > 0 && line[len - 1] == '\n') line[--len] = 0;
        if (len > 0 && line[len - 1] == '\r') line[--len] = 0;
        if (strlen(line) != (size_t)len) { fprintf(stderr, "deltafin chat: the message contains a NUL byte (not text); it is dropped\n"); continue; }
        if (!line[strspn(line, " \t")]) continue; /* an empty line */
        if (line[0] == '/' && line[1] != '/') {
            int r = chat_command(&c, line);
            if (r < 0) status = 1;
            if (r) break;
            continue;
        }
        const char *msg = line[0] == '/' ? line + 1 : line; /* //TEXT: the message /TEXT */
        if (cli_check_utf8("chat", "the message", msg, strlen(msg))) continue;
        if (chat_turn(&c, msg)) { status = 1; break; }
        if (ferror(stdout)) break; /* a closed pipe or a full disk: main says so */
    }
done:
    signal(SIGINT, SIG_DFL);
    free(line);
    cJSON_Delete(c.msgs);
    free(c.logits);
    df_sampler_free(c.smp);
    df_session_free(c.s);
    df_model_close(c.m);
    stream_close(remote);
    return status;
}
