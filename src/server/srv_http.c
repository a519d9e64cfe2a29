/* srv_http.c — HTTP side of `deltafin serve` on libmicrohttpd: request syntax (400 for a malformed method,
 * request target or header that libmicrohttpd lets through), routing, API
 * key, body size limit (413), admission (--parallel generations running plus --queue
 * waiting, default 16; more -> 429 with Retry-After), the --parallel worker threads
 * that run generations, SSE responses with keep-alive comments, client-disconnect detection,
 * /health (including a model that failed: a corrupt expert pack), /metrics (Prometheus text,
 * srv_metrics.c), the live view (/ and /store.json, srv_ui.c), and SIGTERM/SIGINT/SIGHUP shutdown.
 *
 * Threads: MHD runs one thread per connection; a handler blocks while its job
 * waits and runs (polling the socket for a hang-up every 100 ms). Each worker runs
 * one generation at a time on a session of its own; the backend batches their decode
 * steps into one forward pass (srv_backend.c) and serializes prompts. A job whose
 * client has gone (hang-up seen by poll, or the connection closed) no longer
 * counts for admission: the next request is queued behind it and starts as soon
 * as the worker has stopped the abandoned one. */
#define _GNU_SOURCE /* memmem, POLLRDHUP */
#include "srv.h"
#include "util/util.h"
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    srv_config cfg;
    srv_backend *be;
    srv_gen_opts gen;
    struct MHD_Daemon *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_job *qhead, *qtail;
    srv_job *running[SRV_MAX_PARALLEL]; /* the job of each worker, or NULL */
    uint64_t n_started;                  /* generations started (a job's log line: did another overlap it?) */
    int n_workers;
    int n_responding;         /* generation requests not yet fully answered (drained at shutdown) */
    int stopping;
    long created;
    unsigned long n_served, n_rejected;
    df_stats last;            /* engine statistics of the last finished generation */
    int has_last;
    int model_rc;             /* a model failure seen by a generation: DF_EFORMAT (corrupt data) sticky; DF_EIO (a read
                               * or a streamed install's fetch failed) until a generation started after it succeeds */
    double model_err_t;       /* srv_now() when model_rc was last set */
    char model_err[600];
    unsigned long n_model_errors;
    srv_metrics met;          /* cumulative figures for /metrics */
} server;

static server S;

enum { R_NONE, R_HEALTH, R_METRICS, R_UI, R_STORE, R_MODELS, R_MODEL_ONE, R_CHAT, R_COMPL };

typedef struct {
    int route;
    srv_buf body;
    int too_big;
    int responding;           /* counted in S.n_responding */
    size_t discarded;
    int fd;
    srv_job *job;             /* an admitted generation (one reference), released in on_completed */
    int started;              /* on_request has seen this request (routed it, or answered it) */
    int bad_target;           /* the raw request target is malformed (on_uri) */
} conn_ctx;

/* SSE stream state (the response's reader callback) */
typedef struct {
    srv_job *j;
    double last_sent;         /* monotonic time the reader last returned bytes */
    int timed_out;            /* the stall error event was sent */
} sse_ctx;

/* --------------------------------------------------------------- helpers */

static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* 1 when the job's client is known to be gone (then it is marked cancelled). */
static int job_abandoned(srv_job *j) {
    if (__atomic_load_n(&j->cancel, __ATOMIC_SEQ_CST)) return 1;
    pthread_mutex_lock(&j->mu);
    int gone = !j->done && client_gone(j->fd);
    if (gone) j->cancel = 1;
    pthread_mutex_unlock(&j->mu);
    return gone;
}

/* Generations that hold or wait for a worker (S.mu held): each running one unless
 * its response is complete or its client has gone, and every waiting one whose
 * client is still there. */
static int busy_locked(void) {
    int n = 0;
    for (srv_job *q = S.qhead; q; q = q->next) n += !job_abandoned(q);
    for (int w = 0; w < S.n_workers; w++) {
        srv_job *r = S.running[w];
        if (r && !__atomic_load_n(&r->final, __ATOMIC_SEQ_CST) && !job_abandoned(r)) n++;
    }
    return n;
}

/* Admitted generations not yet running (the count 429 is judged by; S.mu held). */
static int waiting_locked(void) {
    const int w = busy_locked() - S.n_workers;
    return w > 0 ? w : 0;
}

/* A whole body; retry_after (429) and allow (405: the methods the URL takes) add those headers when not NULL. */
static enum MHD_Result send_body_h(struct MHD_Connection *c, int status, const char *type, const char *body,
                                   const char *retry_after, const char *allow) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    if (S.cfg.cors) MHD_add_response_header(r, "Access-Control-Allow-Origin", S.cfg.cors);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    if (allow) MHD_add_response_header(r, "Allow", allow);
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_body(struct MHD_Connection *c, int status, const char *type, const char *body,
                                 const char *retry_after) {
    return send_body_h(c, status, type, body, retry_after, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *c, int status, const char *msg, const char *param,
                                  const char *code) {
    char *e = srv_error_json(msg, srv_error_type(status), param, code);
    enum MHD_Result ok = send_body(c, status, "application/json", e, status == 429 ? "1" : NULL);
    free(e);
    if (S.cfg.verbose) fprintf(stderr, "serve: %d %s\n", status, msg);
    return ok;
}

/* The log line of a generation request refused with 400 (its body failed a check, on arrival or once its prompt
 * was tokenized): the endpoint, the status and the message the client was sent (control characters escaped, so
 * that it stays one line). No generation figures: none ran. */
/* "prefill 155.7 tok/s" for the log line; an eval under 1 ms as its time ("prefill 1 token in 0.42 ms": a rate from
 * it says little); none of that kind of eval as "no prefill step" (a prompt with one new token is a one-token step,
 * counted with the decode steps) */
static void rate_text(char *out, size_t cap, const char *what, uint64_t tokens, double s) {
    if (!tokens) snprintf(out, cap, "no %s step", what);
    else if (s < 1e-3) snprintf(out, cap, "%s %llu token%s in %.2f ms", what, (unsigned long long)tokens, tokens == 1 ? "" : "s", s * 1e3);
    else snprintf(out, cap, "%s %.1f tok/s", what, tokens / s);
}

static void log_refusal(int chat, int status, const char *msg) {
    srv_buf b;
    srv_buf_init(&b);
    for (const unsigned char *p = (const unsigned char *)(msg ? msg : ""); *p; p++) {
        if (*p == '\n') srv_buf_adds(&b, "\\n");
        else if (*p < 0x20 || *p == 0x7f) srv_buf_printf(&b, "\\x%02x", *p);
        else srv_buf_add(&b, p, 1);
    }
    fprintf(stderr, "serve: %s status %d: %s\n", chat ? "chat" : "completion", status, b.p ? b.p : "");
    srv_buf_free(&b);
}

/* A model this server does not serve (a generation request's "model", GET /v1/models/NAME): 404
 * invalid_request_error / model_not_found, as the OpenAI API answers it. Not logged here. */
static enum MHD_Result send_model_not_found(struct MHD_Connection *c, const char *msg) {
    char *e = srv_error_json(msg, "invalid_request_error", "model", "model_not_found");
    enum MHD_Result ok = send_body(c, 404, "application/json", e, NULL);
    free(e);
    return ok;
}

/* A 400 answer to a generation request, logged (log_refusal). */
static enum MHD_Result refuse(struct MHD_Connection *c, int chat, const char *msg, const char *param, const char *code) {
    char *e = srv_error_json(msg, srv_error_type(400), param, code);
    enum MHD_Result ok = send_body(c, 400, "application/json", e, NULL);
    free(e);
    log_refusal(chat, 400, msg);
    return ok;
}

static int key_ok(struct MHD_Connection *c) {
    if (!S.cfg.api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    const char *k = NULL;
    if (h && !strncasecmp(h, "Bearer ", 7)) k = h + 7;
    if (!k) k = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (!k) return 0;
    /* a header value's surrounding spaces and tabs are not part of it (RFC 9110 5.5), nor extra spaces after "Bearer" */
    while (*k == ' ' || *k == '\t') k++;
    size_t a = strlen(k), b = strlen(S.cfg.api_key);
    while (a && (k[a - 1] == ' ' || k[a - 1] == '\t')) a--;
    unsigned diff = (unsigned)(a ^ b);
    for (size_t i = 0; i < a && i < b; i++) diff |= (unsigned char)(k[i] ^ S.cfg.api_key[i]);
    return diff == 0;
}

/* ---------------------------------------------------------------- worker */

static void *worker_main(void *arg) {
    const int self = (int)(intptr_t)arg;
    for (;;) {
        pthread_mutex_lock(&S.mu);
        while (!S.qhead && !S.stopping) pthread_cond_wait(&S.cv, &S.mu);
        srv_job *j = S.qhead;
        if (!j) { pthread_mutex_unlock(&S.mu); break; }
        S.qhead = j->next;
        if (!S.qhead) S.qtail = NULL;
        S.running[self] = j;
        int others = 0; /* engine statistics are reset for a generation that starts alone */
        for (int w = 0; w < S.n_workers; w++) others += w != self && S.running[w];
        const uint64_t my_start = ++S.n_started;
        pthread_mutex_unlock(&S.mu);

        double t0 = srv_now();
        const int ran = !j->cancel; /* a job cancelled while it waited never runs: no duration */
        if (j->cancel) {
            if (j->shutdown) {
                char *e = srv_error_json("The server is shutting down.", "server_error", NULL, NULL);
                pthread_mutex_lock(&j->mu);
                srv_buf_adds(&j->out, e);
                j->http_status = 503;
                pthread_mutex_unlock(&j->mu);
                free(e);
            }
            __atomic_store_n(&j->final, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_lock(&j->mu);
            if (!j->prepared) { j->prepared = 1; if (!j->http_status) j->http_status = 499; }
            j->done = 1;
            pthread_cond_broadcast(&j->cv);
            pthread_mutex_unlock(&j->mu);
        } else {
            if (S.be->stats_reset && !others) { /* /metrics keeps what the reset drops */
                df_stats before;
                memset(&before, 0, sizeof before);
                if (S.be->stats) S.be->stats(S.be, &before);
                pthread_mutex_lock(&S.mu);
                srv_metrics_reset_begin(&S.met, &before); /* a scrape's snapshot read from now on is not folded */
                pthread_mutex_unlock(&S.mu);
                S.be->stats_reset(S.be);
                pthread_mutex_lock(&S.mu);
                srv_metrics_reset_end(&S.met);
                pthread_mutex_unlock(&S.mu);
            }
            srv_gen_run(&S.gen, j);
        }
        double dt = srv_now() - t0;
        df_stats st;
        memset(&st, 0, sizeof st);
        if (S.be->stats) S.be->stats(S.be, &st); /* for /metrics always; for the log line and /health not when cancelled */
        const df_stats st_all = st;
        if (j->cancel) memset(&st, 0, sizeof st);
        /* the engine's figures are this request's only when no other generation ran beside it (they are the
         * engine's since the reset at its start); with overlapping requests they are the batch's, and the line says so */
        pthread_mutex_lock(&S.mu);
        const int overlapped = others || S.n_started != my_start;
        pthread_mutex_unlock(&S.mu);
        char extra[320] = "";
        if (st.prefill_tokens || st.decode_tokens) {
            char pre[64], dec[96];
            rate_text(pre, sizeof pre, "prefill", st.prefill_tokens, st.prefill_s);
            /* with a drafter the engine counts every verified position (drafts included), not generated tokens */
            rate_text(dec, sizeof dec, S.be->draft_describe ? "decode (verified positions)" : "decode", st.decode_tokens,
                      st.decode_s);
            snprintf(extra, sizeof extra, "; %s%s, %s, experts %llu hits / %llu misses",
                     overlapped ? "engine (shared with overlapping requests since the last one that ran alone): " : "",
                     pre, dec, (unsigned long long)st.expert_hits, (unsigned long long)st.expert_misses);
        }
        /* a 400 here: the request's prompt failed a check (ids outside the vocabulary, no room in the context, ...);
         * it is logged and counted as the 400s of handle_generate: its reason, no generation figures, not in
         * deltafin_requests_total */
        const int refused = j->http_status == 400;
        if (refused) log_refusal(j->req.kind == SRV_CHAT, 400, j->error_msg);
        else {
            char line[sizeof j->log_line];
            char ttft[48]; /* no first token (stopped during the prompt, max_tokens 0): no time to it */
            if (j->completion_tokens > 0) snprintf(ttft, sizeof ttft, "ttft %.3f s", j->ttft_s);
            else snprintf(ttft, sizeof ttft, "no token");
            snprintf(line, sizeof line, "serve: %s %s status %d: prompt %d tokens (%d reused), %d generated, %s, %.3f s%s",
                     j->req.kind == SRV_CHAT ? "chat" : "completion", j->req.stream ? "stream" : "json", j->http_status,
                     j->prompt_tokens, j->cached_tokens, j->completion_tokens, ttft, dt, extra);
            const char *mark = j->cancel ? (j->shutdown ? " (shutdown)" : " (client gone)") : "";
            int later = 0;
            if (!j->cancel && j->req.stream && j->http_status == 200) {
                /* a stream that ended normally: its client may still leave before the end is sent (the generation
                 * outran it); on_completed logs it when the connection finishes after this */
                pthread_mutex_lock(&j->mu);
                if (j->cancel || j->conn_gone) mark = " (client gone)";
                else if (!j->conn_done) { memcpy(j->log_line, line, sizeof line); later = 1; }
                pthread_mutex_unlock(&j->mu);
            }
            if (!later) fprintf(stderr, "%s%s\n", line, mark);
        }
        pthread_mutex_lock(&S.mu);
        if (st.prefill_tokens || st.decode_tokens) { S.last = st; S.has_last = 1; }
        /* no reset runs while this job is counted as running, so the snapshot is of the current epoch */
        if (S.be->stats) srv_metrics_fold(&S.met, &st_all, S.met.seq);
        if (!refused)
            srv_metrics_request(&S.met, j->req.kind == SRV_CHAT, j->http_status, j->prompt_tokens, j->cached_tokens,
                                j->completion_tokens, j->ttft_s, ran ? dt : -1.0);
        if (j->engine_rc == DF_EFORMAT || j->engine_rc == DF_EIO) { /* the model's files fail: /health says so */
            if (S.model_rc != DF_EFORMAT) { /* corrupt data stays the reason shown */
                S.model_rc = j->engine_rc;
                snprintf(S.model_err, sizeof S.model_err, "%s", j->engine_err);
            }
            S.model_err_t = srv_now();
            S.n_model_errors++;
        } else if (S.model_rc == DF_EIO && ran && !j->engine_rc && j->http_status == 200 && t0 > S.model_err_t &&
                   !j->cancel && j->prompt_tokens > 0) {
            /* an I/O failure (a read error, a streamed install's mirror out of reach) is transient: a generation
             * that started after it and evaluated without error shows the model's reads work again */
            S.model_rc = 0;
            S.model_err[0] = 0;
        }
        S.running[self] = NULL;
        S.n_served += !refused;
        pthread_mutex_unlock(&S.mu);
        srv_job_unref(j);
    }
    return NULL;
}

/* ------------------------------------------------------------------- SSE */

/* Keep-alive period of a stream: --keepalive, but never so long that --timeout
 * (MHD closes a connection with no traffic for that long) could expire first. */
static double keepalive_period(void) {
    double ka = S.cfg.keepalive_s, half = S.cfg.timeout_s > 0 ? S.cfg.timeout_s / 2.0 : 0;
    if (ka <= 0) return 0;
    return half > 0 && half < ka ? half : ka;
}

static ssize_t sse_copy(sse_ctx *x, char *buf, size_t max, const char *s, size_t n) {
    if (n > max) n = max;
    memcpy(buf, s, n);
    x->last_sent = srv_now();
    return (ssize_t)n;
}

static ssize_t sse_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    sse_ctx *x = cls;
    srv_job *j = x->j;
    double ka = keepalive_period();
    pthread_mutex_lock(&j->mu);
    for (;;) {
        if (j->out.len) {
            if (client_gone(j->fd)) break; /* no use writing: stop the generation now */
            size_t n = j->out.len < max ? j->out.len : max;
            sse_copy(x, buf, max, j->out.p, n);
            srv_buf_consume(&j->out, n);
            pthread_mutex_unlock(&j->mu);
            return (ssize_t)n;
        }
        if (j->done || x->timed_out) { pthread_mutex_unlock(&j->mu); return MHD_CONTENT_READER_END_OF_STREAM; }
        double quiet = srv_now() - x->last_sent;
        if (ka > 0 && quiet >= ka) { /* a comment keeps the connection (and proxies) alive during a long prefill */
            pthread_mutex_unlock(&j->mu);
            return sse_copy(x, buf, max, ": keep-alive\n\n", 14);
        }
        if (ka <= 0 && S.cfg.timeout_s > 0 && quiet >= 0.75 * S.cfg.timeout_s) {
            /* keep-alives are off and --timeout is about to close this silent stream:
             * end it with an error event instead of a bare close after the 200 */
            j->cancel = 1;
            x->timed_out = 1;
            pthread_mutex_unlock(&j->mu);
            char m[300];
            snprintf(m, sizeof m, "No output for %.1f s (the prompt is still being processed) and keep-alives are off "
                     "(--keepalive 0): the stream is closed before --timeout %d s expires. Use --keepalive S to keep long "
                     "prefills open.", quiet, S.cfg.timeout_s);
            char *e = srv_error_json(m, "server_error", NULL, "timeout");
            srv_buf b;
            srv_buf_init(&b);
            srv_buf_printf(&b, "data: %s\n\ndata: [DONE]\n\n", e);
            free(e);
            ssize_t n = b.len <= max ? sse_copy(x, buf, max, b.p, b.len) : MHD_CONTENT_READER_END_WITH_ERROR;
            srv_buf_free(&b);
            if (S.cfg.verbose) fprintf(stderr, "serve: stream closed after %.1f s without output (--keepalive 0)\n", quiet);
            return n;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->out.len && !j->done && client_gone(j->fd)) break;
    }
    j->cancel = 1;
    pthread_mutex_unlock(&j->mu);
    return MHD_CONTENT_READER_END_WITH_ERROR;
}

static void sse_free(void *cls) {
    sse_ctx *x = cls;
    srv_job *j = x->j;
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancel = 1; /* the connection went away mid-stream */
    pthread_mutex_unlock(&j->mu);
    srv_job_unref(j);
    free(x);
}

/* ------------------------------------------------------------ generation */

static enum MHD_Result handle_generate(struct MHD_Connection *c, conn_ctx *x) {
    const int chat = x->route == R_CHAT;
    if (!srv_utf8_valid(x->body.p ? x->body.p : "", x->body.len))
        return refuse(c, chat, "The request body is not valid UTF-8.", NULL, NULL);
    char *ej = NULL;
    srv_job *j = srv_job_new();
    int st = srv_request_parse(&j->req, chat ? SRV_CHAT : SRV_COMPLETION, x->body.p ? x->body.p : "", x->body.len, &ej);
    if (st) {
        enum MHD_Result ok = send_body(c, st, "application/json", ej, NULL);
        cJSON *o = cJSON_Parse(ej); /* the log gives the message sent */
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
        log_refusal(chat, st, cJSON_IsString(m) ? m->valuestring : ej);
        cJSON_Delete(o);
        free(ej);
        srv_job_unref(j);
        return ok;
    }
    if (j->req.model && strcmp(j->req.model, S.be->name)) {
        char m[600];
        snprintf(m, sizeof m, "The model '%.300s' does not exist. This server serves '%.200s' (GET /v1/models).",
                 j->req.model, S.be->name);
        srv_job_unref(j);
        log_refusal(chat, 404, m);
        return send_model_not_found(c, m);
    }
    j->fd = x->fd;
    /* admission */
    pthread_mutex_lock(&S.mu);
    if (S.stopping) {
        pthread_mutex_unlock(&S.mu);
        srv_job_unref(j);
        return send_error(c, 503, "The server is shutting down.", NULL, NULL);
    }
    /* a running job whose response is complete (its client may already be
     * sending the next request) or whose client has gone no longer counts, nor
     * does a waiting job whose client has gone */
    int busy = busy_locked();
    if (busy >= S.n_workers + S.cfg.queue) {
        S.n_rejected++;
        pthread_mutex_unlock(&S.mu);
        srv_job_unref(j);
        char m[200];
        snprintf(m, sizeof m, "The server is busy: %d generation%s running (--parallel %d) and %d waiting (--queue %d). Retry later.",
                 S.n_workers, S.n_workers == 1 ? " is" : "s are", S.n_workers, busy - S.n_workers, S.cfg.queue);
        return send_error(c, 429, m, NULL, "server_busy");
    }
    S.n_responding++;
    x->responding = 1;
    j->refs = 3; /* this handler (then the SSE response) + the worker + the connection (on_completed) */
    x->job = j;
    if (S.qtail) S.qtail->next = j; else S.qhead = j;
    S.qtail = j;
    pthread_cond_signal(&S.cv);
    pthread_mutex_unlock(&S.mu);

    /* wait: streams until headers are decided, others until the body is complete */
    pthread_mutex_lock(&j->mu);
    while (!(j->req.stream ? j->prepared : j->done)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!(j->req.stream ? j->prepared : j->done) && client_gone(x->fd)) {
            j->cancel = 1;
            pthread_mutex_unlock(&j->mu);
            srv_job_unref(j);
            return MHD_NO; /* close the connection */
        }
    }
    int status = j->http_status;
    if (status != 200 || !j->req.stream) {
        while (!j->done) pthread_cond_wait(&j->cv, &j->mu);
        char *body = strdup(j->out.p ? j->out.p : "");
        pthread_mutex_unlock(&j->mu);
        srv_job_unref(j);
        enum MHD_Result ok = status == 499 ? MHD_NO : send_body(c, status, "application/json", body, NULL);
        free(body);
        return ok;
    }
    pthread_mutex_unlock(&j->mu);
    sse_ctx *sx = calloc(1, sizeof *sx);
    if (!sx) { srv_job_unref(j); return MHD_NO; }
    sx->j = j;
    sx->last_sent = srv_now();
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, sse_reader, sx, sse_free);
    if (!r) { sse_free(sx); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    if (S.cfg.cors) MHD_add_response_header(r, "Access-Control-Allow-Origin", S.cfg.cors);
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result handle_models(struct MHD_Connection *c, const char *one) {
    if (one && strcmp(one, S.be->name)) {
        char m[400];
        snprintf(m, sizeof m, "The model '%.300s' does not exist.", one);
        if (S.cfg.verbose) fprintf(stderr, "serve: 404 %s\n", m);
        return send_model_not_found(c, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", S.be->name);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)S.created);
    cJSON_AddStringToObject(m, "owned_by", "deltafin");
    cJSON_AddNumberToObject(m, "context_length", S.be->n_ctx);
    cJSON *root = m;
    if (!one) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "object", "list");
        cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    enum MHD_Result ok = send_body(c, 200, "application/json", s, NULL);
    free(s);
    return ok;
}

/* GET /metrics: the Prometheus text exposition (no API key, like /health). */
static enum MHD_Result handle_metrics(struct MHD_Connection *c) {
    srv_metrics_live live;
    memset(&live, 0, sizeof live);
    live.model = S.be->name;
    live.exact = S.be->exact;
    live.parallel = S.n_workers;
    live.queue = S.cfg.queue;
    if (S.be->batch_stats) {
        live.has_batches = 1;
        S.be->batch_stats(S.be, &live.decode_batches, &live.decode_batch_rows);
    }
    /* the engine's counters now (a generation still running included), folded unless a reset of the engine's
     * statistics began or ended while they were read (then the next scrape has them) */
    df_stats now;
    memset(&now, 0, sizeof now);
    pthread_mutex_lock(&S.mu);
    const unsigned seq = S.met.seq;
    pthread_mutex_unlock(&S.mu);
    if (S.be->stats && !(seq & 1)) S.be->stats(S.be, &now);
    srv_buf b;
    srv_buf_init(&b);
    pthread_mutex_lock(&S.mu);
    if (S.be->stats) srv_metrics_fold(&S.met, &now, seq);
    for (int w = 0; w < S.n_workers; w++)
        if (S.running[w]) live.live_tokens += (uint64_t)__atomic_load_n(&S.running[w]->live_tokens, __ATOMIC_RELAXED);
    live.healthy = !S.model_rc;
    live.in_flight = busy_locked(); /* as /health: running + waiting, a job whose client has gone not counted */
    live.waiting = waiting_locked();
    live.rejected = S.n_rejected;
    live.model_errors = S.n_model_errors;
    srv_metrics_text(&b, &S.met, &live);
    pthread_mutex_unlock(&S.mu);
    enum MHD_Result ok = send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", NULL);
    srv_buf_free(&b);
    return ok;
}

static enum MHD_Result handle_health(struct MHD_Connection *c) {
    pthread_mutex_lock(&S.mu);
    /* in_flight = running + waiting, both as the 429 check counts them (a job whose client has gone, or whose response
     * is complete, not counted), so in_flight - waiting is what runs */
    int busy = busy_locked(), has = S.has_last, model_rc = S.model_rc;
    const int waiting = waiting_locked();
    unsigned long served = S.n_served, rejected = S.n_rejected, n_err = S.n_model_errors;
    df_stats st = S.last;
    char merr[sizeof S.model_err];
    memcpy(merr, S.model_err, sizeof merr);
    pthread_mutex_unlock(&S.mu);
    cJSON *o = cJSON_CreateObject();
    /* a model whose files failed during a generation (checksum mismatch in an expert
     * pack, read error) is not healthy: status "error", the engine's message, HTTP 503 */
    cJSON_AddStringToObject(o, "status", model_rc ? "error" : "ok");
    if (model_rc) {
        cJSON *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", merr);
        cJSON_AddStringToObject(e, "code", model_rc == DF_EFORMAT ? "model_corrupt" : "model_io_error");
        cJSON_AddStringToObject(e, "engine_error", df_strerror(model_rc));
        cJSON_AddNumberToObject(e, "failed_requests", (double)n_err);
    }
    cJSON_AddStringToObject(o, "model", S.be->name);
    cJSON_AddBoolToObject(o, "exact", S.be->exact);
    cJSON_AddNumberToObject(o, "in_flight", busy);
    cJSON_AddNumberToObject(o, "queue", S.cfg.queue); /* capacity: requests that may wait (--queue) */
    cJSON_AddNumberToObject(o, "waiting", waiting);
    cJSON_AddNumberToObject(o, "parallel", S.n_workers);
    if (S.be->batch_stats) { /* decode steps of concurrent generations run as one forward pass */
        uint64_t steps = 0, rows = 0;
        S.be->batch_stats(S.be, &steps, &rows);
        cJSON_AddNumberToObject(o, "decode_batches", (double)steps);
        cJSON_AddNumberToObject(o, "decode_batch_rows", (double)rows);
    }
    cJSON_AddNumberToObject(o, "served", (double)served);
    cJSON_AddNumberToObject(o, "rejected", (double)rejected);
    if (has) { /* df_stats of the last finished generation */
        cJSON *l = cJSON_AddObjectToObject(o, "last");
        cJSON_AddNumberToObject(l, "ttft_s", st.ttft_s);
        cJSON_AddNumberToObject(l, "prefill_tokens", (double)st.prefill_tokens);
        cJSON_AddNumberToObject(l, "prefill_tok_s", st.prefill_s > 0 ? st.prefill_tokens / st.prefill_s : 0);
        cJSON_AddNumberToObject(l, "decode_tokens", (double)st.decode_tokens);
        cJSON_AddNumberToObject(l, "decode_tok_s", st.decode_s > 0 ? st.decode_tokens / st.decode_s : 0);
        cJSON_AddNumberToObject(l, "weight_bytes_read", (double)st.weight_bytes_read);
        cJSON_AddNumberToObject(l, "expert_bytes_demand", (double)st.expert_bytes_demand);
        cJSON_AddNumberToObject(l, "expert_hits", (double)st.expert_hits);
        cJSON_AddNumberToObject(l, "expert_misses", (double)st.expert_misses);
        cJSON_AddNumberToObject(l, "io_stall_s", st.io_stall_s);
        cJSON_AddNumberToObject(l, "resident_bytes", (double)st.resident_bytes);
    }
    char *b = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    enum MHD_Result ok = send_body(c, model_rc ? 503 : 200, "application/json", b, NULL);
    free(b);
    return ok;
}

/* RFC 9110 tchar: the characters of a method or a header field name. */
static int is_tchar(unsigned char ch) {
    return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
           (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* The answer to a CORS preflight (OPTIONS): 204 with the allowed origin (--cors), the route's methods, the request
 * headers a client may send and a day's cache. The headers allowed are those the preflight asks for
 * (Access-Control-Request-Headers, when it is a list of header names: the OpenAI SDKs send X-Stainless-* headers),
 * else Authorization, Content-Type and X-Api-Key. */
static enum MHD_Result send_preflight(struct MHD_Connection *c, int post) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", S.cfg.cors);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", post ? "POST, OPTIONS" : "GET, HEAD, OPTIONS");
    const char *asked = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    int names = asked && *asked && strlen(asked) <= 2048;
    for (const char *p = asked; names && *p; p++)
        names = is_tchar((unsigned char)*p) || *p == ',' || *p == ' ';
    MHD_add_response_header(r, "Access-Control-Allow-Headers", names ? asked : "Authorization, Content-Type, X-Api-Key");
    MHD_add_response_header(r, "Vary", "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    enum MHD_Result ok = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    return ok;
}

/* ------------------------------------------------------ request syntax */

/* A request's context, made by on_uri (MHD's URI log callback) once the request line is parsed, else by on_request. */
static conn_ctx *conn_new(void) {
    conn_ctx *x = calloc(1, sizeof *x);
    if (!x) return NULL;
    srv_buf_init(&x->body);
    x->fd = -1;
    return x;
}

static int is_token(const char *s) {
    if (!s || !*s) return 0;
    for (; *s; s++)
        if (!is_tchar((unsigned char)*s)) return 0;
    return 1;
}

/* The raw request target (before percent-decoding): origin form (/path?query), absolute form (http[s]://...) or
 * "*", without spaces or control characters (bytes >= 0x80 are let through). */
static int target_ok(const char *t) {
    if (!t) return 0;
    if (strcmp(t, "*") && t[0] != '/' && strncasecmp(t, "http://", 7) && strncasecmp(t, "https://", 8)) return 0;
    for (const unsigned char *p = (const unsigned char *)t; *p; p++)
        if (*p <= ' ' || *p == 0x7f) return 0;
    return 1;
}

/* MHD_get_connection_values iterator: stops at the first header whose name is not a token or whose value holds a
 * control character other than HTAB; *(const char **)cls is then that header's name. */
static enum MHD_Result header_check(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    int ok = is_token(key);
    for (const unsigned char *v = (const unsigned char *)value; ok && v && *v; v++)
        if ((*v < ' ' && *v != '\t') || *v == 0x7f) ok = 0;
    if (ok) return MHD_YES;
    *(const char **)cls = key ? key : "";
    return MHD_NO;
}

/* s with every byte outside printable ASCII as '?', at most 60 of them (for a message). */
static void printable(char *out, size_t n, const char *s) {
    size_t i = 0;
    for (; s && s[i] && i < 60 && i + 1 < n; i++) out[i] = s[i] >= ' ' && s[i] < 0x7f ? s[i] : '?';
    if (n) out[i < n ? i : n - 1] = 0;
}

/* 400 for a request that MHD parsed but that is not well-formed HTTP; the connection is closed after it, since
 * the rest of such a request cannot be trusted to be framed as it says. */
static enum MHD_Result send_bad_request(struct MHD_Connection *c, const char *msg, const char *code) {
    char *e = srv_error_json(msg, srv_error_type(400), NULL, code);
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(e), e, MHD_RESPMEM_MUST_COPY);
    free(e);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Connection", "close");
    if (S.cfg.cors) MHD_add_response_header(r, "Access-Control-Allow-Origin", S.cfg.cors);
    enum MHD_Result ok = MHD_queue_response(c, 400, r);
    MHD_destroy_response(r);
    if (S.cfg.verbose) fprintf(stderr, "serve: 400 %s\n", msg);
    return ok;
}

/* MHD_OPTION_URI_LOG_CALLBACK: called with the raw request target once MHD has parsed the request line, before
 * the headers; what it returns is the request's context (*con_cls) for on_request and on_completed. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)c;
    conn_ctx *x = conn_new();
    if (x) x->bad_target = !target_ok(uri);
    return x;
}

/* 1, with *answered the result of queueing a 400, when the request line or a header is malformed in a way MHD
 * lets through; 0 when the request is well-formed. */
static int request_malformed(struct MHD_Connection *c, conn_ctx *x, const char *method, enum MHD_Result *answered) {
    char m[300], v[64];
    if (!is_token(method)) {
        printable(v, sizeof v, method);
        snprintf(m, sizeof m, "Malformed request line: the method '%s' is not an HTTP token.", v);
        *answered = send_bad_request(c, m, "invalid_request_line");
        return 1;
    }
    if (x->bad_target) {
        *answered = send_bad_request(c, "Malformed request line: the request target must be a path such as "
                                        "/v1/models, without spaces or control characters.", "invalid_request_line");
        return 1;
    }
    const char *h = NULL;
    MHD_get_connection_values(c, MHD_HEADER_KIND, header_check, &h);
    if (h) {
        printable(v, sizeof v, h);
        snprintf(m, sizeof m, "Malformed header '%s': a field name is a non-empty HTTP token (no spaces) and a "
                              "value holds no control characters.", v);
        *answered = send_bad_request(c, m, "invalid_header");
        return 1;
    }
    return 0;
}

/* --------------------------------------------------------------- routing */

/* url without a leading /v1 (/v1/models and /models are one route) and without one trailing slash
 * (/v1/chat/completions/ is /v1/chat/completions, as the redirects of FastAPI and gin servers make it), into buf
 * when the slash is cut. */
static const char *api_path(const char *url, char *buf, size_t n) {
    const char *p = strncmp(url, "/v1/", 4) ? url : url + 3;
    const size_t len = strlen(p);
    if (len < 2 || p[len - 1] != '/' || len > n) return p;
    memcpy(buf, p, len - 1);
    buf[len - 1] = 0;
    return buf;
}

/* The answer to a GET or HEAD request on route (one that does not generate), url the request's URL. */
static enum MHD_Result handle_get(struct MHD_Connection *c, int route, const char *url) {
    if (route == R_HEALTH) return handle_health(c);
    if (route == R_METRICS) return handle_metrics(c);
    if (route == R_UI) return send_body(c, 200, "text/html; charset=utf-8", srv_ui_html(), NULL);
    if (route == R_STORE) {
        int status = 200;
        char *j = srv_store_json(S.be, &status);
        enum MHD_Result ok = send_body(c, status, "application/json", j ? j : "{}", NULL);
        free(j);
        return ok;
    }
    if (route == R_MODELS) return handle_models(c, NULL);
    char pb[1024];
    return handle_models(c, api_path(url, pb, sizeof pb) + 8); /* R_MODEL_ONE: /models/ID */
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    conn_ctx *x = *con_cls;
    if (!x) {
        x = conn_new();
        if (!x) return MHD_NO;
        *con_cls = x;
    }
    if (!x->started) {
        x->started = 1;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        x->fd = ci ? ci->connect_fd : -1;
        enum MHD_Result answered;
        if (request_malformed(c, x, method, &answered)) return answered;
        char pb[1024];
        const char *p = api_path(url, pb, sizeof pb);
        int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
        if (!strcmp(p, "/health")) x->route = R_HEALTH;
        else if (!strcmp(p, "/metrics")) x->route = R_METRICS;
        else if (!strcmp(url, "/")) x->route = R_UI;
        else if (!strcmp(p, "/store.json")) x->route = R_STORE;
        else if (!strcmp(p, "/models")) x->route = R_MODELS;
        else if (!strncmp(p, "/models/", 8) && p[8]) x->route = R_MODEL_ONE;
        else if (!strcmp(p, "/chat/completions")) x->route = R_CHAT;
        else if (!strcmp(p, "/completions")) x->route = R_COMPL;
        else {
            char m[300];
            snprintf(m, sizeof m, "Unknown request URL: %s %.200s.", method, url);
            return send_error(c, 404, m, NULL, "unknown_url");
        }
        int want_post = x->route == R_CHAT || x->route == R_COMPL;
        /* a browser's CORS preflight (no credentials: answered before the API key check) */
        if (S.cfg.cors && !strcmp(method, "OPTIONS")) return send_preflight(c, want_post);
        if (want_post ? !post : !(get || !strcmp(method, "HEAD"))) {
            char m[300];
            snprintf(m, sizeof m, "Method %s is not allowed on %.200s (use %s).", method, url, want_post ? "POST" : "GET");
            char *e = srv_error_json(m, srv_error_type(405), NULL, "method_not_allowed");
            enum MHD_Result ok = send_body_h(c, 405, "application/json", e ? e : "{}", NULL,
                                             want_post ? (S.cfg.cors ? "POST, OPTIONS" : "POST")
                                                       : (S.cfg.cors ? "GET, HEAD, OPTIONS" : "GET, HEAD"));
            free(e);
            return ok;
        }
        int keyless = x->route == R_HEALTH || x->route == R_METRICS || x->route == R_UI || x->route == R_STORE;
        if (!keyless && !key_ok(c))
            return send_error(c, 401, "Incorrect or missing API key: send 'Authorization: Bearer KEY'.", NULL, "invalid_api_key");
        const char *ce = want_post ? MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Encoding") : NULL;
        if (ce && *ce && strcasecmp(ce, "identity")) {
            char m[200];
            snprintf(m, sizeof m, "Unsupported Content-Encoding '%.60s': send the JSON body uncompressed.", ce);
            return send_error(c, 415, m, NULL, "unsupported_content_encoding");
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > S.cfg.max_request_bytes) {
            char m[200];
            snprintf(m, sizeof m, "The request body (%s bytes) exceeds --max-request-bytes %zu.", cl, S.cfg.max_request_bytes);
            return send_error(c, 413, m, NULL, "request_too_large");
        }
        /* the route's answer waits for MHD's last call (below), once the whole request is read: a response queued
         * before that (as the errors above are, so as not to read a body) makes MHD close the connection after it */
        return MHD_YES;
    }
    if (*upload_size) {
        /* MHD cannot answer in the middle of an upload: an oversized (chunked)
         * body is discarded up to a bound, then answered 413; past the bound
         * the connection is closed. */
        if (!x->too_big && x->body.len + *upload_size > S.cfg.max_request_bytes) {
            x->too_big = 1;
            x->discarded = x->body.len;
            srv_buf_free(&x->body);
        }
        if (x->too_big) {
            x->discarded += *upload_size;
            if (x->discarded > S.cfg.max_request_bytes + (64u << 20)) return MHD_NO;
        } else srv_buf_add(&x->body, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (x->too_big) {
        char m[200];
        snprintf(m, sizeof m, "The request body exceeds --max-request-bytes %zu.", S.cfg.max_request_bytes);
        return send_error(c, 413, m, NULL, "request_too_large");
    }
    if (x->route == R_CHAT || x->route == R_COMPL) return handle_generate(c, x);
    return handle_get(c, x->route, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    conn_ctx *x = *con_cls;
    if (!x) return;
    if (x->job) { /* the socket is about to be closed (its number may be reused): stop polling it */
        srv_job *j = x->job;
        pthread_mutex_lock(&j->mu);
        j->fd = -1;
        if (!j->done) j->cancel = 1;
        j->conn_done = 1;
        j->conn_gone = toe != MHD_REQUEST_TERMINATED_COMPLETED_OK || j->cancel;
        if (j->log_line[0]) { /* a stream the worker finished first: its log line, now that the outcome is known */
            fprintf(stderr, "%s%s\n", j->log_line, !j->conn_gone ? ""
                                                  : toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN ? " (shutdown)"
                                                                                                 : " (client gone)");
            j->log_line[0] = 0;
        }
        pthread_mutex_unlock(&j->mu);
        srv_job_unref(j);
        x->job = NULL;
    }
    if (x->responding) {
        pthread_mutex_lock(&S.mu);
        S.n_responding--;
        pthread_cond_broadcast(&S.cv);
        pthread_mutex_unlock(&S.mu);
    }
    srv_buf_free(&x->body);
    free(x);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    if (!S.cfg.verbose) return;
    fprintf(stderr, "serve (http): ");
    vfprintf(stderr, fmt, ap);
}

/* ------------------------------------------------------------------ main */

/* The SIGINT, SIGTERM or SIGHUP pending in this thread (blocked here), else 0: after a model open that returned
 * DF_ECANCELLED, the signal that stopped its first-use conversion (convert_cached raises it again under this mask). */
static int pending_stop_signal(void) {
    sigset_t p;
    if (sigpending(&p) != 0) return 0;
    return sigismember(&p, SIGINT) == 1 ? SIGINT : sigismember(&p, SIGTERM) == 1 ? SIGTERM
         : sigismember(&p, SIGHUP) == 1 ? SIGHUP : 0;
}

static const char *stop_signal_name(int sig) { return df_signal_name(sig); }

/* "cannot listen on HOST:PORT" for the socket error e, with what to try, then tail */
static void say_cannot_listen(const srv_config *cfg, int e, const char *tail) {
    fprintf(stderr, "deltafin serve: cannot listen on %s:%d: %s (%s)%s\n", cfg->host, cfg->port, strerror(e),
            e == EADDRNOTAVAIL ? "no interface of this machine has that address: try --host 127.0.0.1 or 0.0.0.0"
            : e == EADDRINUSE  ? "the port is in use: try another --port, or --port 0 for any free one"
                               : "check --host and --port",
            tail);
}

int srv_serve(const srv_config *cfg) {
    memset(&S, 0, sizeof S);
    S.cfg = *cfg;
    S.created = (long)time(NULL);
    char err[1024] = "";
    int rc;
    /* signals: handled by sigwait in this thread only. SIGHUP (the terminal closed, or a service manager's stop) shuts
     * down as SIGTERM does, unless it was ignored when serve started (nohup): then it stays ignored */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    struct sigaction hup;
    if (sigaction(SIGHUP, NULL, &hup) != 0 || hup.sa_handler != SIG_IGN) sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* --port-file: scripts wait for it, so a path that cannot be written is an
     * error now (before the model loads), not a warning after listening */
    FILE *port_f = NULL;
    char port_tmp[4096] = "";
    if (cfg->port_file) {
        /* a PATH left by an earlier server names its (dead) port: remove it first, so that PATH appears only once
         * this server's port is known (a script waiting for it never reads the old one) */
        if (unlink(cfg->port_file) != 0 && errno != ENOENT) {
            fprintf(stderr, "deltafin serve: cannot remove the old --port-file %s: %s\n", cfg->port_file, strerror(errno));
            return 1;
        }
        snprintf(port_tmp, sizeof port_tmp, "%s.tmp", cfg->port_file);
        if (!(port_f = fopen(port_tmp, "w"))) {
            fprintf(stderr, "deltafin serve: cannot write --port-file %s (%s: %s)\n", cfg->port_file, port_tmp, strerror(errno));
            return 1;
        }
    }
#define DROP_PORT_FILE() do { if (port_f) { fclose(port_f); unlink(port_tmp); port_f = NULL; } } while (0)

    S.n_workers = cfg->parallel > 0 ? cfg->parallel : 1;
    if (S.n_workers > SRV_MAX_PARALLEL) {
        fprintf(stderr, "deltafin serve: --parallel %d: at most %d\n", S.n_workers, SRV_MAX_PARALLEL);
        DROP_PORT_FILE();
        return 2;
    }
    /* the address first, before the model loads (which can take minutes): a port in use, or an address this machine
     * does not have, is said at once. The socket is bound now and listens once the model is ready (until then a
     * client's connection is refused, not left waiting); libmicrohttpd then serves it (MHD_OPTION_LISTEN_SOCKET) */
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ERROR_LOG;
    socklen_t ss_len;
    {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
        const char *host = !strcmp(cfg->host, "localhost") ? "127.0.0.1" : cfg->host;
        if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = htons((uint16_t)cfg->port);
            ss_len = sizeof *a4;
        } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
            a6->sin6_family = AF_INET6;
            a6->sin6_port = htons((uint16_t)cfg->port);
            ss_len = sizeof *a6;
            flags |= MHD_USE_IPv6;
        } else {
            fprintf(stderr, "deltafin serve: --host %s is not a numeric IPv4 or IPv6 address or localhost (e.g. 127.0.0.1, ::1, 0.0.0.0)\n", cfg->host);
            DROP_PORT_FILE();
            return 2;
        }
    }
    const int lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    {
        const int one = 1;
        int e = lfd < 0 ? errno : 0;
        if (!e) setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* as libmicrohttpd's own sockets */
        if (!e && ss.ss_family == AF_INET6) setsockopt(lfd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (!e && bind(lfd, (struct sockaddr *)&ss, ss_len) != 0) e = errno;
        if (e) {
            say_cannot_listen(cfg, e, "; the model was not loaded");
            if (lfd >= 0) close(lfd);
            DROP_PORT_FILE();
            return 1;
        }
    }
#undef DROP_PORT_FILE
#define DROP_PORT_FILE() do { close(lfd); if (port_f) { fclose(port_f); unlink(port_tmp); port_f = NULL; } } while (0)
    if (cfg->mock)
        rc = srv_backend_open_mock(&S.be, cfg->mock_delay_ms, cfg->mock_kimi, cfg->n_ctx, S.n_workers, err, sizeof err);
    else {
        df_model_opts mo;
        df_model_opts_default(&mo);
        mo.threads = cfg->threads;
        mo.ram_budget = cfg->ram_budget;
        mo.remote_source = cfg->remote_source;
        mo.backend = cfg->backend;
        mo.gpu_budget = cfg->gpu_budget;
        mo.prefetch = cfg->prefetch;
        mo.prefault = cfg->prefault;
        mo.io_depth = cfg->io_depth;
        mo.io_size = cfg->io_size;
        mo.cache_dir = cfg->cache_dir;
        rc = srv_backend_open_model(&S.be, cfg->model_path, &mo, cfg->n_ctx, S.n_workers, cfg->preload, err, sizeof err);
        if (!rc && (rc = srv_backend_set_draft(S.be, &cfg->draft, &mo, err, sizeof err))) {
            S.be->close(S.be);
            S.be = NULL;
            /* the draft failed, not the main model: err already names --draft PATH */
            const int sig = rc == DF_ECANCELLED ? pending_stop_signal() : 0;
            if (sig) /* its first-use conversion was stopped: that said why and what it removed, on its own line */
                fprintf(stderr, "deltafin serve: cannot use the draft model: interrupted by %s\n", stop_signal_name(sig));
            else fprintf(stderr, "deltafin serve: cannot use the draft model: %s\n", err[0] ? err : df_strerror(rc));
            DROP_PORT_FILE();
            return sig ? 128 + sig : 1;
        }
    }
    if (rc) {
        const int sig = rc == DF_ECANCELLED ? pending_stop_signal() : 0;
        if (sig) /* its first-use conversion was stopped: that printed why and what it removed; not said twice */
            fprintf(stderr, "deltafin serve: cannot open model %s: interrupted by %s\n", cfg->model_path, stop_signal_name(sig));
        else {
            /* err says what and why; the code's name only when it is empty; a setup install's repair, not convert */
            if (!err[0]) snprintf(err, sizeof err, "%s", df_strerror(rc));
            if (cfg->model_fix && (rc == DF_EIO || rc == DF_EFORMAT)) df_advice_setup_repair(err, sizeof err, cfg->model_fix);
            fprintf(stderr, "deltafin serve: cannot open model %s: %s\n", cfg->mock ? "mock" : cfg->model_path, err);
        }
        DROP_PORT_FILE();
        return sig ? 128 + sig : 1;
    }
    S.gen.be = S.be;
    S.gen.max_tokens = cfg->max_tokens;
    S.gen.kv_reuse = cfg->kv_reuse;
    S.gen.keepalive_s = cfg->keepalive_s;
    S.gen.verbose = cfg->verbose;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.cv, NULL);

    pthread_t workers[SRV_MAX_PARALLEL];
    for (int w = 0; w < S.n_workers; w++) pthread_create(&workers[w], NULL, worker_main, (void *)(intptr_t)w);
    const int lerr = listen(lfd, SOMAXCONN) != 0 ? errno : 0;
    S.d = lerr ? NULL
               : MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, NULL,
                           MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                           MHD_OPTION_LISTEN_SOCKET, (MHD_socket)lfd,
                           MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
                           MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                           MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL,
                           MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL,
                           MHD_OPTION_END);
    if (!S.d) {
        const int e = lerr ? lerr : errno;
        say_cannot_listen(cfg, e, "");
        pthread_mutex_lock(&S.mu);
        S.stopping = 1;
        pthread_cond_broadcast(&S.cv);
        pthread_mutex_unlock(&S.mu);
        for (int w = 0; w < S.n_workers; w++) pthread_join(workers[w], NULL);
        S.be->close(S.be);
        if (lerr) DROP_PORT_FILE();
        else if (port_f) { fclose(port_f); unlink(port_tmp); port_f = NULL; } /* the socket is libmicrohttpd's to close */
        return 1;
    }
    if (S.be->describe && S.be->describe[0]) fprintf(stderr, "%s\n", S.be->describe);
    if (S.be->draft_describe) fprintf(stderr, "draft: %s\n", S.be->draft_describe);
    int port = cfg->port; /* the bound one (--port 0: the kernel's choice) */
    {
        struct sockaddr_storage b;
        socklen_t bl = sizeof b;
        if (getsockname(lfd, (struct sockaddr *)&b, &bl) == 0)
            port = ntohs(b.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&b)->sin6_port : ((struct sockaddr_in *)&b)->sin_port);
    }
    fprintf(stderr, "deltafin serve: model %s (%s%s), context %d, listening on http://%s%s%s:%d/v1 (parallel %d, queue %d, max request %zu bytes%s, CORS %s)\n",
            S.be->name, cfg->mock ? "mock" : "engine", S.be->exact ? "" : ", NOT exact: lossy spine", S.be->n_ctx,
            strchr(cfg->host, ':') ? "[" : "", cfg->host, strchr(cfg->host, ':') ? "]" : "", port, S.n_workers, cfg->queue,
            cfg->max_request_bytes, cfg->api_key ? ", API key required" : "", cfg->cors ? cfg->cors : "off");
    int sig = 0, status = 0;
    struct stat port_st; /* the --port-file this server wrote (removed at shutdown if it is still that file) */
    int port_written = 0;
    if (port_f) {
        int bad = fprintf(port_f, "%d\n", port) < 0 || fflush(port_f) != 0 || fsync(fileno(port_f)) != 0;
        int e = errno;
        bad |= fclose(port_f) != 0;
        port_f = NULL;
        if (!bad && rename(port_tmp, cfg->port_file) != 0) { bad = 1; e = errno; }
        if (bad) {
            fprintf(stderr, "deltafin serve: cannot write --port-file %s: %s; stopping\n", cfg->port_file, strerror(e));
            unlink(port_tmp);
            status = 1;
        } else port_written = stat(cfg->port_file, &port_st) == 0;
    }
    if (!status) {
        sigwait(&sigs, &sig);
        fprintf(stderr, "deltafin serve: %s received, shutting down\n", df_signal_name(sig));
    }
    pthread_mutex_lock(&S.mu);
    S.stopping = 1;
    for (srv_job *j = S.qhead; j; j = j->next) { j->shutdown = 1; j->cancel = 1; }
    for (int w = 0; w < S.n_workers; w++)
        if (S.running[w]) { S.running[w]->shutdown = 1; S.running[w]->cancel = 1; }
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    for (int w = 0; w < S.n_workers; w++) pthread_join(workers[w], NULL);
    /* let cancelled streams and final bodies reach their clients (at most 10 s) */
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&S.mu);
    while (S.n_responding > 0) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec >= until.tv_nsec)) break;
        pthread_mutex_unlock(&S.mu);
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        pthread_mutex_lock(&S.mu);
    }
    pthread_mutex_unlock(&S.mu);
    MHD_stop_daemon(S.d);
    /* the port is closed: a script must not find it in --port-file any more. Unless PATH is no longer the file
     * written above (another server started with the same PATH since, and wrote its own port there) */
    struct stat now_st;
    if (port_written && stat(cfg->port_file, &now_st) == 0 && now_st.st_dev == port_st.st_dev && now_st.st_ino == port_st.st_ino &&
        now_st.st_ctim.tv_sec == port_st.st_ctim.tv_sec && now_st.st_ctim.tv_nsec == port_st.st_ctim.tv_nsec)
        unlink(cfg->port_file);
    fprintf(stderr, "deltafin serve: stopped after serving %lu generation request%s (%lu rejected as busy; requests refused "
                    "as invalid are not counted)\n",
            S.n_served, S.n_served == 1 ? "" : "s", S.n_rejected);
    S.be->close(S.be);
    pthread_mutex_destroy(&S.mu);
    pthread_cond_destroy(&S.cv);
    return status;
}
