/* server.h — entry point of the OpenAI-compatible server (`deltafin serve`),
 * for the CLI: a configuration struct and srv_serve(). Internals: srv.h;
 * reference: docs/server.md. */
#ifndef DF_SERVER_H
#define DF_SERVER_H

#include "deltafin.h"

#include <stddef.h>
#include <stdint.h>

/* Speculative decoding for the model (`serve --draft ...`, the same flags as `run`). */
typedef struct {
    const char *draft;        /* NULL or "off": none; "ngram"; or a draft model directory */
    int ngram_min, ngram_max; /* --draft ngram: n-gram lengths looked up */
    int retok;                /* a draft model through re-tokenization: -1 auto (vocabulary sizes differ), 0, 1 */
    df_spec_opts spec;
} srv_draft_config;

typedef struct {
    const char *model_path;   /* NULL with mock */
    const char *model_fix;    /* when model_path is an install of `deltafin setup`: the (shell-quoted) setup command that
                               * repairs it, which an error opening it names instead of the engine's convert advice */
    int mock;                 /* serve the mock model (tests) */
    int mock_delay_ms;
    int mock_kimi;            /* the mock speaks Kimi: reasoning + a tool call */
    const char *host;         /* numeric IPv4 / IPv6 address */
    int port;                 /* 0 = any free port */
    uint64_t ram_budget;      /* bytes; 0 = unlimited */
    int threads;              /* 0 = all cores */
    int n_ctx;                /* KV positions; 0 = min(4096, model maximum) */
    int max_tokens;           /* cap per request; 0 = context room */
    size_t max_request_bytes; /* larger bodies -> 413 */
    int queue;                /* waiting requests allowed while one runs (cmd_serve default 16); more -> 429 */
    const char *api_key;      /* NULL = no key */
    const char *cors;         /* Access-Control-Allow-Origin of every response and preflight; NULL = no CORS headers */
    int kv_reuse;             /* reuse the KV cache for a common prompt prefix */
    double keepalive_s;       /* SSE comment period while a stream is silent (at most timeout_s / 2); 0 = off */
    int timeout_s;            /* idle / stalled connection timeout */
    int max_connections;
    int verbose;
    const char *port_file;    /* write the bound port here once listening */
    int parallel;             /* generations running at once, decode steps batched (cmd_serve default 4); 0 = 1 */
    const void *remote_source; /* streamed install: df_model_opts.remote_source (src/hub/stream.h); NULL = none */
    /* compute backend (docs/cuda.md) */
    const char *backend;      /* auto | cpu | cpu-scalar | cuda; NULL = the library default */
    uint64_t gpu_budget;      /* backend cuda: routed-expert cache bytes; 0 = all free GPU memory less 1 GiB */
    int prefetch;             /* df_model_opts.prefetch: 0 auto, 1 on, 2 off, 3 ungated */
    int prefault;             /* df_model_opts.prefault: 0 auto, 1 on, 2 off */
    int io_depth;             /* df_model_opts.io_depth: expert reads in flight per drive; 0 = 16 */
    uint64_t io_size;         /* df_model_opts.io_size: bytes of one expert read; 0 = 1 MiB */
    int preload;              /* 1: every routed expert read into memory at start (df_model_preload) */
    const char *cache_dir;    /* df_model_opts.cache_dir: where a Hugging Face checkpoint is converted; NULL = default */
    srv_draft_config draft;   /* speculative decoding; draft.draft NULL = off */
} srv_config;

/* Open the model, listen, serve until SIGTERM/SIGINT/SIGHUP (SIGHUP not when it
 * was ignored at the call: nohup), then drain and close.
 * Returns a process exit status (0 after a clean shutdown, 1 when the model
 * cannot be opened or the address cannot be bound, 2 for a bad --host), or
 * 128 + SIGINT / SIGTERM / SIGHUP when that signal stopped the first-use conversion of
 * the model (or draft) before serving: the signal is then left pending and
 * blocked in the calling thread, for the caller to end by it after its own
 * cleanup (cmd_serve: exit status 128 + signal, as `run`). */
int srv_serve(const srv_config *c);

/* The messages of `tokenize --chat` checked as /v1/chat/completions checks a request's (src/server/srv_request.c:
 * NUL characters, keys sent twice, nesting, roles, contents and their parts, tool results' tool_call_id, tool
 * names) and normalised as the server normalises them (content parts joined into a string, null content as "").
 * in[0..n): a JSON list of messages, or an object {"messages": [...], "tools": [...]}; tools: NULL or a JSON list
 * of tools (--tools FILE; an error when in has "tools" too). 0 with *messages_json (a JSON list) and *tools_json
 * (NULL when there are none) malloc'd, else -1 with the server's message (OpenAI's wording) in err. */
int srv_check_chat(const char *in, size_t n, const char *tools, char **messages_json, char **tools_json, char *err,
                   size_t errlen);

#endif
