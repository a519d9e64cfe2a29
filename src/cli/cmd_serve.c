/* cmd_serve.c — `deltafin serve`: parse flags, then run the OpenAI-compatible
 * server (src/server, docs/server.md). */
#include "cli.h"
#include "cli_draft.h"
#include "hub/stream.h"
#include "server/server.h"
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: deltafin serve [--model DIR] [options]\n"
            "  --model DIR              native model directory or Hugging Face checkpoint (default: the model\n"
            "                           `deltafin setup` installed, else the embedded models/kimi-mini)\n"
            "  --host ADDR              numeric IPv4 / IPv6 address to bind, or localhost (= 127.0.0.1) (default 127.0.0.1)\n"
            "  --port N                 TCP port (default 8000; 0 = any free port)\n"
            "  --port-file PATH         write the bound port to PATH once listening (exit 1 if it cannot be written)\n"
            "  --ram-budget SIZE        bytes for weights + KV cache, e.g. 8G (default 0: unlimited)\n"
            "  --threads N              compute threads (default all cores)\n"
            "  --backend NAME           auto (default: cuda when a CUDA device is present) | cpu (best SIMD) |\n"
            "                           cpu-scalar | cpu-avx2 | cpu-avx512 | cuda\n"
            "  --gpu-budget SIZE        backend cuda: GPU memory for the routed-expert cache (default all free less 1G)\n"
            "  --ctx N                  KV cache positions (default min(4096, model maximum); more than the\n"
            "                           model maximum is lowered to it, with a note on stderr)\n"
            "  --prefetch MODE          auto (on with --ram-budget; without one, a prompt's next layer only) | on |\n"
            "                           off | ungated: router lookahead prefetch, as in `deltafin run`\n"
            "  --prefault MODE          auto (on) | on | off: fault the expert cache in before its first reads\n"
            "  --io-depth N             expert reads in flight per drive (16)\n"
            "  --io-size SIZE           bytes of one expert read request, a multiple of 4K, at most 64M (1M)\n"
            "  --cache-dir DIR          where a Hugging Face checkpoint is converted (default $XDG_CACHE_HOME/deltafin)\n"
            "  --preload                read every routed expert into memory before serving (GPU memory first with\n"
            "                           --backend cuda, then the host cache; nothing is evicted for it; refused on\n"
            "                           a streamed install, where it would fetch the whole model)\n"
            "  --max-tokens N           cap on generated tokens per request: a request's max_tokens above it is\n"
            "                           lowered to it (default 0: no cap but the context's room)\n"
            "  --max-request-bytes N    largest accepted request body (default 134217728)\n"
            "  --parallel N             generations running at once, their decode steps batched into one\n"
            "                           forward pass (each expert read once per step for all); outputs are\n"
            "                           byte-identical to serving each alone; the RAM budget holds N KV caches (1..64,\n"
            "                           default 4)\n"
            "  --queue N                requests that may wait while --parallel run; more get 429 (default 16)\n"
            "  --api-key KEY            require 'Authorization: Bearer KEY' (default: none)\n"
            "  --cors ORIGIN|off        Access-Control-Allow-Origin on every response, and answers to browsers'\n"
            "                           preflight (OPTIONS) requests (default *: any origin; off: no CORS headers)\n"
            "  --no-kv-reuse            always prefill the whole prompt (no prefix reuse)\n"
            "  --keepalive SECONDS      SSE comment period while a stream is silent, e.g. a long prefill\n"
            "                           (default 5; above --timeout / 2 it is lowered to that, with a note; 0 = off: a stream silent for\n"
            "                           3/4 of --timeout then ends with an error event)\n"
            "  --timeout SECONDS        close idle or stalled connections after this (default 60)\n"
            "  --max-connections N      concurrent connections (default 256)\n"
            "  --mock [--mock-delay-ms N]  serve a built-in byte-level test model instead of --model\n"
            "  --mock-kimi              the test model as a Kimi model (<think> + a tool call)\n"
            "  --verbose                log every rejected request\n"
            "SIGTERM, SIGINT and SIGHUP shut the server down cleanly (exit 0, --port-file removed); under nohup\n"
            "  SIGHUP stays ignored\n"
            "endpoints: POST /v1/chat/completions, POST /v1/completions, GET /v1/models; without the API key:\n"
            "  GET /health (state as JSON), GET /metrics (Prometheus text), GET /store.json (each routed expert's\n"
            "  tier) and GET / (a live view in the browser); docs/server.md\n"
            "speculative decoding (requests without logprobs; the output is the same):\n%s",
            cli_draft_usage(0));
}

/* serve's options but the --draft* ones (cli_draft_flags, each taking a value), with whether each takes a value: the
 * names an unknown option is compared with, in this order, and the value options that may be given once */
static const cli_option serve_options[] = {
    {"--help", 0}, {"--model", 1}, {"--cache-dir", 1}, {"--host", 1}, {"--port", 1}, {"--port-file", 1},
    {"--ram-budget", 1}, {"--threads", 1}, {"--backend", 1}, {"--gpu-budget", 1}, {"--ctx", 1}, {"--prefetch", 1},
    {"--prefault", 1}, {"--io-depth", 1}, {"--io-size", 1}, {"--preload", 0}, {"--max-tokens", 1},
    {"--max-request-bytes", 1}, {"--parallel", 1}, {"--queue", 1}, {"--api-key", 1}, {"--cors", 1},
    {"--no-kv-reuse", 0}, {"--keepalive", 1}, {"--timeout", 1}, {"--max-connections", 1}, {"--mock", 0},
    {"--mock-delay-ms", 1}, {"--mock-kimi", 0}, {"--verbose", 0}, {NULL, 0}};
CLI_OPTIONS_FIT(serve_options);

/* a whole decimal integer in [lo, hi]; else a usage message naming the flag and the value (as run's), -1 */
static int parse_int(const char *flag, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "deltafin serve: %s \"%s\": expected an integer in [%d, %d]\n", flag, s, lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* host (checked: numeric IPv4 / IPv6, or localhost) reaches this machine only: 127.0.0.0/8, ::1, ::ffff:127.x.y.z */
static int host_is_loopback(const char *host) {
    struct in_addr a4;
    struct in6_addr a6;
    if (!strcmp(host, "localhost")) return 1;
    if (inet_pton(AF_INET, host, &a4) == 1) return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return 0;
}

int cmd_serve(int argc, char **argv) {
    srv_config c;
    memset(&c, 0, sizeof c);
    c.host = "127.0.0.1";
    c.port = 8000;
    c.max_request_bytes = 128u << 20;
    c.kv_reuse = 1;
    c.keepalive_s = 5;
    c.timeout_s = 60;
    c.max_connections = 256;
    c.queue = 16;
    c.parallel = 4;
    c.cors = "*";
    c.backend = cli_default_backend();
    cli_draft_opts dopt;
    cli_draft_defaults(&dopt);
    if (cli_check_repeated_in("serve", argc, argv, serve_options, cli_draft_flags)) return 2;
    for (int i = 1; i < argc; i++) {
        int dr;
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int tmp;
        uint64_t sz;
#define NEED() do { if (!v) { fprintf(stderr, "deltafin serve: %s needs a value\n", a); return 2; } i++; } while (0)
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { serve_usage(stdout); return 0; }
        else if (!strcmp(a, "--model")) { NEED(); c.model_path = v; }
        else if (!strcmp(a, "--cache-dir")) { NEED(); if (cli_check_cache_dir("serve", v)) return 2; c.cache_dir = v; }
        else if (!strcmp(a, "--host")) { NEED(); c.host = v; }
        else if (!strcmp(a, "--port")) { NEED(); if (parse_int(a, v, 0, 65535, &c.port)) return 2; }
        else if (!strcmp(a, "--port-file")) { NEED(); c.port_file = v; }
        else if (!strcmp(a, "--ram-budget")) {
            NEED();
            if (cli_parse_budget("serve", a, v, &c.ram_budget)) return 2;
        } else if (!strcmp(a, "--threads")) { NEED(); if (parse_int(a, v, 0, 4096, &c.threads)) return 2; }
        else if (!strcmp(a, "--backend")) { NEED(); if (cli_check_backend("serve", v)) return 2; c.backend = v; }
        else if (!strcmp(a, "--gpu-budget")) {
            NEED();
            if (cli_parse_budget("serve", a, v, &c.gpu_budget)) return 2;
        }
        else if (!strcmp(a, "--ctx")) {
            NEED();
            if (parse_int(a, v, 1, 1 << 30, &c.n_ctx)) {
                fprintf(stderr, "  (leave --ctx out for the default, min(4096, model maximum))\n");
                return 2;
            }
        }
        else if (!strcmp(a, "--prefetch")) { NEED(); if (cli_parse_mode("serve", a, v, &c.prefetch)) return 2; }
        else if (!strcmp(a, "--prefault")) { NEED(); if (cli_parse_mode("serve", a, v, &c.prefault)) return 2; }
        else if (!strcmp(a, "--io-depth") || !strcmp(a, "--io-size")) {
            NEED();
            if (cli_parse_io("serve", a, v, &c.io_depth, &c.io_size)) return 2;
        }
        else if (!strcmp(a, "--max-tokens")) { NEED(); if (parse_int(a, v, 0, 1 << 30, &c.max_tokens)) return 2; }
        else if (!strcmp(a, "--max-request-bytes")) {
            NEED();
            if (cli_parse_size(v, &sz) || sz < 64) {
                fprintf(stderr, "deltafin serve: --max-request-bytes \"%s\": expected a size of at least 64 bytes such as 1M or "
                                "65536 (K, M, G, T: powers of 1024)\n", v);
                return 2;
            }
            c.max_request_bytes = (size_t)sz;
        } else if (!strcmp(a, "--queue")) { NEED(); if (parse_int(a, v, 0, 100000, &c.queue)) return 2; }
        else if (!strcmp(a, "--parallel")) { NEED(); if (parse_int(a, v, 1, 64, &c.parallel)) return 2; }
        else if (!strcmp(a, "--api-key")) { NEED(); c.api_key = v; }
        else if (!strcmp(a, "--cors")) { NEED(); c.cors = strcmp(v, "off") ? v : NULL; }
        else if (!strcmp(a, "--no-kv-reuse")) c.kv_reuse = 0;
        else if (!strcmp(a, "--preload")) c.preload = 1;
        else if (!strcmp(a, "--keepalive")) {
            NEED();
            char *end;
            c.keepalive_s = strtod(v, &end);
            if (end == v || *end || !(c.keepalive_s >= 0 && c.keepalive_s <= 86400)) {
                fprintf(stderr, "deltafin serve: --keepalive \"%s\": expected seconds in [0, 86400] (0 = off)\n", v);
                return 2;
            }
        }
        else if (!strcmp(a, "--timeout")) { NEED(); if (parse_int(a, v, 1, 86400, &c.timeout_s)) return 2; }
        else if (!strcmp(a, "--max-connections")) { NEED(); if (parse_int(a, v, 1, 100000, &c.max_connections)) return 2; }
        else if (!strcmp(a, "--mock")) c.mock = 1;
        else if (!strcmp(a, "--mock-kimi")) c.mock = c.mock_kimi = 1;
        else if (!strcmp(a, "--mock-delay-ms")) { NEED(); if (parse_int(a, v, 0, 60000, &c.mock_delay_ms)) return 2; }
        else if (!strcmp(a, "--verbose") || !strcmp(a, "-v")) c.verbose = 1;
        else if ((dr = cli_draft_arg("serve", argc, argv, &i, &dopt)) != 0) { if (dr < 0) return 2; }
        else return cli_unknown_option_in("serve", a, serve_options, cli_draft_flags);
        (void)tmp;
    }
    /* every option is checked before anything else is said or done: a usage error is the only line */
    if (dopt.sample) { fprintf(stderr, "deltafin serve: --draft-sample is a run option (the server drafts greedily)\n"); return 2; }
    if (c.api_key && !c.api_key[0]) { fprintf(stderr, "deltafin serve: --api-key must not be empty\n"); return 2; }
    {   /* as srv_serve binds it: numeric IPv4 / IPv6, or localhost */
        unsigned char addr[sizeof(struct in6_addr)];
        if (strcmp(c.host, "localhost") && inet_pton(AF_INET, c.host, addr) != 1 && inet_pton(AF_INET6, c.host, addr) != 1) {
            fprintf(stderr, "deltafin serve: --host %s is not a numeric IPv4 or IPv6 address or localhost (e.g. 127.0.0.1, ::1, "
                            "0.0.0.0)\n", c.host);
            return 2;
        }
    }
    if (c.cors) {
        int bad = !c.cors[0];
        for (const char *q = c.cors; *q; q++) bad |= (unsigned char)*q < 0x20 || *q == 0x7f;
        if (bad) {
            fprintf(stderr, "deltafin serve: --cors \"%s\": expected an origin such as * or https://example.com, or off\n", c.cors);
            return 2;
        }
    }
    if (c.mock && c.model_path) {
        fprintf(stderr, "deltafin serve: --mock serves the built-in byte-level test model: drop --model %s, or drop --mock\n",
                c.model_path);
        return 2;
    }
    if (c.mock && (c.ram_budget || c.preload)) { /* the test model has no weights to budget or preload */
        fprintf(stderr, "deltafin serve: %s applies to a real model, not --mock (the built-in byte-level test model)\n",
                c.ram_budget ? "--ram-budget" : "--preload");
        return 2;
    }
    if (!c.mock && c.mock_delay_ms) {
        fprintf(stderr, "deltafin serve: --mock-delay-ms applies to --mock only (the built-in test model)\n");
        return 2;
    }
    if (c.mock && cli_draft_enabled(&dopt)) { fprintf(stderr, "deltafin serve: --draft needs a real model (not --mock)\n"); return 2; }
    /* then the notes, and the default model */
    cli_draft_note_unused("serve", &dopt);
    if (!c.api_key && !host_is_loopback(c.host))
        fprintf(stderr, "deltafin serve: warning: --host %s accepts connections from other machines and there is no --api-key: "
                        "anyone who can reach the port can use this server (add --api-key KEY, or --host 127.0.0.1 for this "
                        "machine only)\n", c.host);
    if (c.keepalive_s > 0 && c.keepalive_s > c.timeout_s / 2.0) /* said, not silently changed (srv_http.c lowers it) */
        fprintf(stderr, "deltafin serve: note: --keepalive %g is more than --timeout %d / 2; keep-alives are sent every %g s\n",
                c.keepalive_s, c.timeout_s, c.timeout_s / 2.0);
    if (!c.mock && cli_check_env_aliases("serve", c.backend, c.prefetch, c.prefault)) return 2;
    char dflt_dir[4096], dflt_how[4600] = "";
    const int model_is_default = !c.model_path && !c.mock;
    if (model_is_default) {
        if (cli_default_model("serve", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        c.model_path = dflt_dir;
        fprintf(stderr, "deltafin serve: model (no --model): %s, %s\n", dflt_dir, dflt_how);
    }
    if (!c.mock && (cli_check_model_dir("serve", c.model_path) || cli_draft_check_path("serve", &dopt))) return 1;
    c.draft.draft = dopt.draft;
    c.draft.ngram_min = dopt.ngram_min;
    c.draft.ngram_max = dopt.ngram_max;
    c.draft.retok = dopt.retok;
    c.draft.spec = dopt.spec;
    /* a streamed install (`deltafin setup --stream`): experts not yet local are fetched on first use */
    stream_src *remote = NULL;
    if (!c.mock && stream_is_streamed(c.model_path)) {
        char err[1024];
        if (stream_open(&remote, c.model_path, 0, err, sizeof err)) { fprintf(stderr, "deltafin serve: %s\n", err); return 1; }
        c.remote_source = stream_remote(remote);
    }
    /* an install of `deltafin setup`: an error opening it names the setup command that repairs it */
    static char model_fix[4096];
    if (!c.mock && cli_setup_install(c.model_path, model_fix, sizeof model_fix, NULL, 0)) c.model_fix = model_fix;
    int rc = srv_serve(&c);
    /* the installed default that could not be served: when its files are damaged, the setup command that repairs it
     * (as run; srv_serve said why it stopped) */
    if (rc == 1 && !c.mock && model_is_default) cli_default_model_repair("serve", dflt_how, 0);
    if (remote) stream_print_stats(remote, stderr);
    stream_close(remote);
    if (rc == 128 + SIGINT || rc == 128 + SIGTERM || rc == 128 + SIGHUP) {
        /* the signal stopped a first-use conversion (its files removed, said on stderr): end by it, as run and bench
         * do; it is pending, blocked by srv_serve, and delivered under the default disposition at the unblock */
        const int sig = rc - 128;
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, sig);
        signal(sig, SIG_DFL);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
        raise(sig);
    }
    return rc;
}
