/* srv.h — internal interfaces of the OpenAI-compatible server (`deltafin serve`).
 *
 * Data path of one request:
 *   HTTP body (srv_http.c) -> UTF-8 check + JSON -> srv_request (srv_request.c)
 *   -> admission (--parallel running + --queue waiting, else 429) -> a worker thread (srv_gen.c):
 *      prompt tokens -> a session (longest cached prefix) -> KV prefix reuse -> df_eval -> sample
 *      -> decode steps batched with the other running generations (df_eval_batch) -> streaming detok
 *      -> stop matcher (srv_stop.c) -> Kimi reasoning / tool-call parser (srv_kimi.c)
 *      -> SSE chunks or one JSON body -> back to the connection thread.
 * The engine is reached through srv_backend (srv_backend.c: include/deltafin.h only;
 * srv_mock.c: a tiny deterministic byte-level model used by tests without a model).
 */
#ifndef DF_SRV_H
#define DF_SRV_H

#include "deltafin.h"
#include "server/server.h"
#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

/* ------------------------------------------------------------ byte buffer */
typedef struct {
    char *p;
    size_t len, cap;
} srv_buf;
void srv_buf_init(srv_buf *b);
void srv_buf_free(srv_buf *b);
/* Append n bytes (keeps a NUL after them). Aborts on out-of-memory. */
void srv_buf_add(srv_buf *b, const void *s, size_t n);
void srv_buf_adds(srv_buf *b, const char *s);
void srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Drop the first n bytes. */
void srv_buf_consume(srv_buf *b, size_t n);

/* ----------------------------------------------------------------- UTF-8 */
/* 1 when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF). */
int srv_utf8_valid(const char *s, size_t n);
/* Length of the longest prefix of s[0..n) that does not end inside a UTF-8
 * character (a trailing incomplete sequence is excluded). */
size_t srv_utf8_complete_prefix(const char *s, size_t n);
/* Copy s[0..n) into b, replacing each ill-formed sequence with U+FFFD. */
void srv_utf8_sanitize(srv_buf *b, const char *s, size_t n);

/* ---------------------------------------------------------------- errors */
/* OpenAI error body: {"error":{"message","type","param","code"}} (malloc'd). */
char *srv_error_json(const char *message, const char *type, const char *param, const char *code);
/* "invalid_request_error" etc. for an HTTP status. */
const char *srv_error_type(int http_status);

/* ----------------------------------------------------------- stop matcher */
/* Finds stop sequences in a text stream that arrives in pieces; text that could
 * still be the beginning of a stop sequence is held back until decided. */
typedef struct {
    char **stops;
    int n_stops;
    srv_buf held;
    int stopped;
} srv_stop;
void srv_stop_init(srv_stop *m, const char *const *stops, int n);
void srv_stop_free(srv_stop *m);
/* Feed a piece; appends the text now safe to emit to out. Returns 1 when a stop
 * sequence was found (everything before it was emitted; the rest is dropped). */
int srv_stop_push(srv_stop *m, const char *s, size_t n, srv_buf *out);
/* End of stream: emit whatever is held. */
void srv_stop_flush(srv_stop *m, srv_buf *out);
/* Length of the longest suffix of s[0..n) that is a proper prefix of any of
 * pats (shared by the stop matcher and the Kimi parser). */
size_t srv_partial_suffix(const char *s, size_t n, char *const *pats, int npats);

/* ------------------------------------------------------------ Kimi parser */
/* Splits assistant output into reasoning (<think>...</think>), content and Kimi
 * tool calls (<|tool_calls_section_begin|> <|tool_call_begin|> functions.NAME:IDX
 * <|tool_call_argument_begin|> {json} <|tool_call_end|> ... <|tool_calls_section_end|>). */
typedef struct {
    char *id;        /* "functions.NAME:IDX" as the model wrote it */
    char *name;      /* NAME */
    char *arguments; /* the JSON text as the model wrote it */
} srv_tool_call;

typedef struct {
    int think;       /* parse <think> */
    int tools;       /* parse tool-call sections (only when the request sent tools) */
    int state;       /* internal */
    srv_buf held;    /* undecided text */
    srv_buf call;    /* text of the tool call being read */
    srv_buf bad;     /* a malformed call's text, returned as content (srv_kimi_push) */
    srv_tool_call *calls;
    int n_calls, n_calls_emitted;
} srv_kimi;

void srv_kimi_init(srv_kimi *k, int think, int tools, int starts_in_think);
void srv_kimi_free(srv_kimi *k);
/* Feed text; appends decided reasoning to reasoning and content to content; new
 * complete tool calls are appended to k->calls. */
void srv_kimi_push(srv_kimi *k, const char *s, size_t n, srv_buf *reasoning, srv_buf *content);
/* End of stream: what is held becomes reasoning or content; an unterminated
 * tool call becomes content text. */
void srv_kimi_flush(srv_kimi *k, srv_buf *reasoning, srv_buf *content);
/* Generation stopped at max_tokens (or the context): before srv_kimi_flush, drops held text that could still
 * have become the opening marker ("<think>", K3's "<|open|>think<|sep|>" / "<|open|>response<|sep|>"): the
 * output so far is optional spaces / newlines and a non-empty proper prefix of the marker (e.g. "<th"), which
 * then is neither content nor reasoning. Output of spaces / newlines only, or anything once the opening was
 * decided, is kept. Not for other ends: a model that stops (end of turn, stop sequence) after "<th" wrote "<th". */
void srv_kimi_drop_partial_open(srv_kimi *k);
/* Does the rendered chat prompt open the reasoning section ("<think>" of K2, "<|open|>think<|sep|>" of K3)? */
int srv_kimi_prompt_opens_think(const char *text, size_t n);

/* --------------------------------------------------------------- request */
enum { SRV_CHAT = 1, SRV_COMPLETION = 2 };
#define SRV_MAX_STOPS 16
#define SRV_MAX_ALL_LOGITS 67108864.0 /* floats (256 MiB): prompt tokens x vocabulary for echo + logprobs */
#define SRV_MAX_STOP_LEN 1024    /* bytes per stop sequence (bounds the hold-back work per token) */
#define SRV_MAX_TOP_LOGPROBS 20
#define SRV_MAX_MAX_TOKENS 1000000000 /* largest max_tokens / top_k a request may name */
#define SRV_COMPLETION_DEFAULT_MAX_TOKENS 16 /* /v1/completions without max_tokens (OpenAI's default); chat: the room */

typedef struct {
    int kind;                 /* SRV_CHAT / SRV_COMPLETION */
    char *model;              /* as sent, or NULL */
    /* chat */
    char *messages_json;      /* normalised messages array (content parts joined) */
    char *tools_json;         /* tools array or NULL */
    int n_tools;
    /* completion */
    char *prompt;             /* text prompt, or NULL */
    size_t prompt_len;
    int32_t *prompt_ids;      /* token-id prompt, or NULL */
    int n_prompt_ids;
    int echo;
    /* common */
    int stream, include_usage;
    int max_tokens;           /* 0 = not given (unless max_tokens_set) */
    int max_tokens_set;       /* max_tokens / max_completion_tokens was given (0 is allowed with echo: scoring) */
    double temperature, top_p;
    int top_k;
    int has_seed;
    uint64_t seed;
    char *stops[SRV_MAX_STOPS];
    int n_stops;
    int logprobs;             /* 1 when logprobs were asked for */
    int top_logprobs;         /* 0..20 */
    int return_token_ids;     /* non-standard: choices[].token_ids */
} srv_request;

/* Parse and validate a request body (already checked to be UTF-8). On error
 * returns an HTTP status (400) and writes a malloc'd OpenAI error body into
 * *err_json; on success returns 0. */
int srv_request_parse(srv_request *r, int kind, const char *body, size_t len, char **err_json);
void srv_request_free(srv_request *r);
/* Find the first JSON string in body[0..len) (valid JSON) that holds a NUL
 * (the escape \u0000 or a raw 0 byte): 1 with its location written to param
 * ("messages[0].content", "stop[1]"; "request body" at the top level), else 0.
 * cJSON strings end at the first NUL, so such strings must be rejected. */
int srv_json_find_nul(const char *body, size_t len, char *param, size_t cap);

/* --------------------------------------------------------------- backend */
/* What the generator needs from a model. srv_backend_open_model uses only
 * include/deltafin.h; srv_backend_open_mock is the test model. */
typedef struct srv_backend srv_backend;
struct srv_backend {
    const char *name;
    const char *describe;     /* one line: the resolved configuration (df_model_describe) */
    int n_vocab, n_ctx;
    int has_tokenizer;
    int is_kimi;              /* Kimi chat format: <think> and tool-call parsing */
    int exact;
    void *impl;
    /* tokenizer (only when has_tokenizer) */
    /* add_bos=1: completion text (the tokenizer config's specials, e.g. BOS; no special
     * parsing); 0: rendered chat (specials parsed) */
    int (*tokenize)(srv_backend *b, const char *s, size_t n, int add_bos, int32_t **ids, size_t *n_ids,
                    char *err, size_t errlen);
    int (*chat_render)(srv_backend *b, const char *messages, const char *tools, char **text,
                       char *err, size_t errlen);
    /* Bytes of one token (may be partial UTF-8), malloc'd. */
    int (*token_bytes)(srv_backend *b, int32_t id, char **out, size_t *len);
    void *(*detok_new)(srv_backend *b);
    int (*detok_push)(void *d, int32_t id, char *out, size_t cap);
    int (*detok_flush)(void *d, char *out, size_t cap);
    void (*detok_free)(void *d);
    int32_t (*token_id)(srv_backend *b, const char *tok);
    int (*stop_ids)(srv_backend *b, int32_t *ids, int cap);
    /* Sessions (one KV cache each, kept across requests for prefix reuse): n_sessions of them, one per
     * generation running at once (serve --parallel). session_acquire takes an idle one, the one whose
     * cached tokens share the longest prefix with prompt[0..n) (ties: the least recently used); NULL
     * when all are taken. session_release gives it back (its tokens stay for the next request). */
    int n_sessions;
    void *(*session_acquire)(srv_backend *b, const int32_t *prompt, int n);
    void (*session_release)(srv_backend *b, void *sess);
    int (*n_past)(srv_backend *b, void *sess);
    const int32_t *(*tokens)(srv_backend *b, void *sess);
    int (*truncate)(srv_backend *b, void *sess, int n_keep);
    /* flags: DF_EVAL_ALL_LOGITS -> logits holds n rows of n_vocab. A one-token eval without flags or
     * progress is a decode step: the model backend batches the decode steps of all sessions that are
     * decoding into one forward pass (df_eval_batch), the result being the same as alone. */
    int (*eval)(srv_backend *b, void *sess, const int32_t *ids, int n, float *logits, int flags,
                df_progress_fn progress, void *user, char *err, size_t errlen);
    /* sampling */
    void *(*sampler_new)(srv_backend *b, const df_sampler_opts *o);
    int32_t (*sample)(void *s, const float *logits, int n_vocab);
    void (*sampler_free)(void *s);
    float (*logprob)(const float *logits, int n_vocab, int32_t id, int top_n, int32_t *top_ids, float *top_lp);
    /* engine statistics (df_model_stats); NULL for the mock */
    void (*stats)(srv_backend *b, df_stats *out);
    void (*stats_reset)(srv_backend *b);
    /* batched decode steps so far: forward passes and the rows they held (rows / steps = mean batch); NULL for the mock */
    void (*batch_stats)(srv_backend *b, uint64_t *steps, uint64_t *rows);
    /* the routed experts' tiers now (df_model_expert_map; same arguments); NULL for the mock */
    int (*expert_map)(srv_backend *b, unsigned char *state, float *heat, int cap, int *moe_layers, int *experts,
                      int *layer_ids);
    void (*close)(srv_backend *b);
    /* speculative decoding (srv_backend_set_draft); NULL without a drafter: spec_new(b, sess, sampler) makes
     * a generator over an acquired session (with that session's drafter) and the request's sampler,
     * spec_step is df_spec_step. Its evals run on their own, outside the decode batches. */
    void *(*spec_new)(srv_backend *b, void *sess, void *sampler);
    int (*spec_step)(void *spec, int32_t cur, int32_t *out, int cap, char *err, size_t errlen);
    void (*spec_free)(void *spec);
    const char *draft_describe;  /* one line: the resolved drafting configuration, or NULL */
};

/* n_sessions: generations that may run at once (>= 1); the RAM budget (mo->ram_budget) reserves a KV
 * cache of n_ctx positions for each. */
int srv_backend_open_model(srv_backend **out, const char *path, const df_model_opts *mo, int n_ctx, int n_sessions, int preload,
                           char *err, size_t errlen);
/* Mock model: vocabulary = 256 bytes + EOS (256); the greedy continuation of
 * a prompt follows a fixed UTF-8 text (EOS at its end for prompts shorter than
 * it, endless cycling for longer ones); delay_ms per evaluated token. kimi=1:
 * a Kimi-family model whose output is a fixed <think> + tool-call script.
 * n_ctx: positions of each session (serve --ctx), as srv_backend_open_model
 * takes it: 0 = 4096 (the engine's default); the mock's maximum is 65536, more is lowered to it with a note. */
int srv_backend_open_mock(srv_backend **out, int delay_ms, int kimi, int n_ctx, int n_sessions, char *err, size_t errlen);
/* Give a model backend the drafter dc names (none for "off"/NULL): one per session (a draft model
 * directory is opened once, resident, with mo's threads; each session's drafter has its own draft
 * session). DF_E* with err naming the flag and value. */
int srv_backend_set_draft(srv_backend *b, const srv_draft_config *dc, const df_model_opts *mo, char *err, size_t errlen);

/* Most sessions / generations running at once (serve --parallel). */
#define SRV_MAX_PARALLEL 64
/* The session a request gets (backends' session_acquire): among the n sessions that are not busy, the
 * one whose tokens toks[i][0..n_past[i]) share the longest prefix with prompt[0..np); ties go to the
 * smallest last_used (least recently used). -1 when all are busy. */
int srv_pick_session(const int32_t *const *toks, const int *n_past, const int *busy, const double *last_used, int n,
                     const int32_t *prompt, int np);

/* ------------------------------------------------------------- generator */
/* Longest common prefix of two token arrays. */
int srv_common_prefix(const int32_t *a, int na, const int32_t *b, int nb);

typedef struct srv_job srv_job;
typedef struct {
    srv_backend *be;
    int max_tokens;           /* --max-tokens cap (0 = context limit) */
    int kv_reuse;             /* reuse the KV cache for a common prefix */
    double keepalive_s;       /* unused by the generator: keep-alives are sent by the connection (srv_http.c) */
    int verbose;
} srv_gen_opts;

/* A fresh 64-bit value from the kernel's entropy source (getrandom), for sampling
 * seeds and response ids; falls back to a clock + counter mix if it fails. */
uint64_t srv_random_u64(void);
/* Number of UTF-8 characters (code points) in s[0..n): bytes that are not
 * continuation bytes (ill-formed bytes count one each). */
size_t srv_utf8_chars(const char *s, size_t n);
/* The token string shown in logprobs for a token's bytes: the text itself when
 * it is well-formed UTF-8, else "bytes:" + each byte escaped as \xNN (printable
 * ASCII kept, backslash doubled), as the OpenAI API shows partial characters.
 * Appends to b. */
void srv_token_display(srv_buf *b, const char *s, size_t n);

/* Run one job on the worker thread (fills the job's output). */
void srv_gen_run(const srv_gen_opts *o, srv_job *j);

/* Job shared by a connection thread (consumer) and the worker (producer). */
#include <pthread.h>
struct srv_job {
    srv_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* freed when it drops to 0 */
    int prepared;             /* http_status and (stream) headers decided */
    int http_status;
    int done;                 /* no more output will come */
    volatile int cancel;      /* client gone / shutdown: stop at the next token */
    int shutdown;             /* cancelled because the server is stopping */
    int final;                /* the response is complete (set before the last bytes are
                                 released), so admission no longer counts this job */
    srv_buf out;              /* produced bytes not yet sent */
    double last_out;          /* monotonic time of the last produced byte */
    int fd;                   /* client socket, for disconnect polling; -1 once the connection is closing */
    srv_job *next;            /* queue link */
    /* results (for the log) */
    int prompt_tokens, cached_tokens, completion_tokens;
    int live_tokens;          /* tokens generated so far (atomic; read by /metrics while the job runs) */
    double ttft_s;
    uint64_t seed;            /* the sampling seed used (the request's, else srv_random_u64) */
    int engine_rc;            /* df_eval's error code when evaluation failed (else 0) */
    char engine_err[600];     /* and its message */
    char error_msg[720];      /* the message of the error answer the generator gave (fail_job), for the log */
    /* A stream that ends normally is logged once the connection has finished sending it, so that the log line can
     * say whether its client left before the end arrived (both under mu): */
    int conn_done;            /* the connection has finished with the response (on_completed) */
    int conn_gone;            /* ... without sending all of it: the client left, or the connection failed */
    char log_line[512];       /* the worker's log line, printed by on_completed when the worker finished first */
};
double srv_now(void);
srv_job *srv_job_new(void);
void srv_job_unref(srv_job *j);
/* Append produced bytes and wake the consumer (takes the job lock). */
void srv_job_emit(srv_job *j, const char *s, size_t n);

/* ---------------------------------------------------------------- metrics */
/* The server's cumulative figures for GET /metrics (srv_metrics.c; Prometheus text format 0.0.4). The caller
 * serializes every call (the server's mutex). */
enum { SRV_METRIC_BUCKETS = 13, SRV_METRIC_CODES = 32 };
typedef struct {
    uint64_t le[SRV_METRIC_BUCKETS]; /* observations <= each bound (cumulative, as exposed) */
    uint64_t count;
    double sum;
} srv_hist;
typedef struct {
    struct { int chat, status; uint64_t n; } codes[SRV_METRIC_CODES];
    int n_codes;
    uint64_t prompt_tokens, cached_tokens, completion_tokens;
    srv_hist ttft, duration;   /* seconds */
    df_stats engine;           /* engine counters summed over reset epochs (resident_bytes: the latest) */
    df_stats cap;              /* per field, the largest snapshot value folded while seq was cap_seq */
    unsigned seq;              /* +1 when a reset of the engine's statistics begins, +1 when it ends: odd during
                                  one, and each even value is one reset epoch */
    unsigned cap_seq;
} srv_metrics;
/* What the exposition reads from the server at scrape time. */
typedef struct {
    const char *model;
    uint64_t live_tokens;      /* tokens generated so far by the generations still running */
    int exact, healthy, parallel, queue, in_flight, waiting, has_batches;
    unsigned long rejected, model_errors;
    uint64_t decode_batches, decode_batch_rows;
} srv_metrics_live;
/* One finished generation request (the server passes none refused with 400): chat (1) or completions (0), its HTTP
 * status, its token counts, the seconds to its first token (not counted when it generated nothing) and the worker's
 * seconds on it (duration_s < 0: it never ran, e.g. its client left while it waited: not in the duration histogram). */
void srv_metrics_request(srv_metrics *m, int chat, int status, int prompt_tokens, int cached_tokens,
                         int completion_tokens, double ttft_s, double duration_s);
/* A df_stats snapshot read while m->seq was `seq` (counters since the engine's last reset): adds, per field, its
 * growth beyond the largest value folded in that epoch (snapshots may come out of order). Nothing when a reset was
 * under way then or has begun since (the snapshot may straddle it): returns 0, else 1. */
int srv_metrics_fold(srv_metrics *m, const df_stats *st, unsigned seq);
/* Around a reset of the engine's statistics: begin folds `before` (their last value) and marks the reset under way;
 * end starts the new epoch. */
void srv_metrics_reset_begin(srv_metrics *m, const df_stats *before);
void srv_metrics_reset_end(srv_metrics *m);
/* Append the exposition of m and live to b. */
void srv_metrics_text(srv_buf *b, const srv_metrics *m, const srv_metrics_live *live);

/* ------------------------------------------------------------- live view */
/* GET /store.json: the routed experts' tiers as JSON (srv_ui.c; malloc'd; *http_status 200, or 500 with an OpenAI
 * error body); a backend without expert_map (the mock) gives an empty map. */
char *srv_store_json(srv_backend *be, int *http_status);
/* GET /: the live view page (static HTML and script; it polls /health, /metrics and /store.json). */
const char *srv_ui_html(void);

#endif
