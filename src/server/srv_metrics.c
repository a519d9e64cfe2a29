/* srv_metrics.c — the server's cumulative counters and their Prometheus text exposition (GET /metrics).
 *
 * Request figures (count by kind and HTTP status, prompt / reused / generated tokens, time to first token and
 * request duration histograms) come from each finished generation. Engine figures (expert hits / misses, bytes read
 * on demand / by prefetch, weight bytes touched, I/O stall, prefill / decode time) come from df_stats, which the
 * server resets when a generation starts alone; srv_metrics_fold adds what a df_stats snapshot holds beyond the
 * largest snapshot of the same reset epoch, so generations that overlap are counted once; /metrics folds a snapshot
 * at every scrape too, so a running generation's work shows while it runs.
 * Format: https://prometheus.io/docs/instrumenting/exposition_formats/ (text format 0.0.4). */
#include "srv.h"
#include <stdio.h>
#include <string.h>

/* upper bounds (seconds) of the histogram buckets; +Inf is implied */
static const double k_bounds[SRV_METRIC_BUCKETS] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};

static void hist_add(srv_hist *h, double v) {
    for (int i = 0; i < SRV_METRIC_BUCKETS; i++)
        if (v <= k_bounds[i]) h->le[i]++;
    h->count++;
    h->sum += v;
}

void srv_metrics_request(srv_metrics *m, int chat, int status, int prompt_tokens, int cached_tokens,
                         int completion_tokens, double ttft_s, double duration_s) {
    int i = 0;
    while (i < m->n_codes && (m->codes[i].chat != chat || m->codes[i].status != status)) i++;
    if (i == m->n_codes && i < SRV_METRIC_CODES) {
        m->codes[i].chat = chat;
        m->codes[i].status = status;
        m->codes[i].n = 0;
        m->n_codes++;
    }
    if (i < m->n_codes) m->codes[i].n++;
    m->prompt_tokens += prompt_tokens > 0 ? (uint64_t)prompt_tokens : 0;
    m->cached_tokens += cached_tokens > 0 ? (uint64_t)cached_tokens : 0;
    m->completion_tokens += completion_tokens > 0 ? (uint64_t)completion_tokens : 0;
    if (completion_tokens > 0 && ttft_s > 0) hist_add(&m->ttft, ttft_s);
    if (duration_s >= 0) hist_add(&m->duration, duration_s);
}

/* Snapshots may arrive out of order (each is read outside the server's lock): per field, only growth beyond the
 * largest value seen in this epoch is added, and that largest value is kept. */
#define GROW(f)                                                                                                       \
    do {                                                                                                              \
        if (st->f > m->cap.f) {                                                                                       \
            a->f += st->f - m->cap.f;                                                                                 \
            m->cap.f = st->f;                                                                                         \
        }                                                                                                             \
    } while (0)

int srv_metrics_fold(srv_metrics *m, const df_stats *st, unsigned seq) {
    if ((seq & 1) || seq != m->seq) return 0;
    if (m->cap_seq != m->seq) {
        memset(&m->cap, 0, sizeof m->cap);
        m->cap_seq = m->seq;
    }
    df_stats *a = &m->engine;
    GROW(prefill_tokens);
    GROW(decode_tokens);
    GROW(prefill_s);
    GROW(decode_s);
    GROW(weight_bytes_read);
    GROW(expert_bytes_demand);
    GROW(expert_bytes_prefetch);
    GROW(expert_hits);
    GROW(expert_misses);
    GROW(prefetch_useful);
    GROW(prefetch_issued);
    GROW(io_stall_s);
    GROW(spine_bytes_streamed);
    if (st->resident_bytes) a->resident_bytes = st->resident_bytes; /* a gauge: the latest */
    return 1;
}

void srv_metrics_reset_begin(srv_metrics *m, const df_stats *before) {
    srv_metrics_fold(m, before, m->seq);
    m->seq++;
}

void srv_metrics_reset_end(srv_metrics *m) { m->seq++; }

static void hist_print(srv_buf *b, const char *name, const char *help, const srv_hist *h) {
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < SRV_METRIC_BUCKETS; i++)
        srv_buf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, k_bounds[i], (unsigned long long)h->le[i]);
    srv_buf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count,
                   name, h->sum, name, (unsigned long long)h->count);
}

static void counter(srv_buf *b, const char *name, const char *help, double v) {
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s %.17g\n", name, help, name, name, v);
}

static void gauge(srv_buf *b, const char *name, const char *help, double v) {
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s %.17g\n", name, help, name, name, v);
}

/* label value escaping: backslash, double quote and newline */
static void label_value(srv_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"') srv_buf_printf(b, "\\%c", *s);
        else if (*s == '\n') srv_buf_adds(b, "\\n");
        else srv_buf_add(b, s, 1);
    }
}

void srv_metrics_text(srv_buf *b, const srv_metrics *m, const srv_metrics_live *live) {
    srv_buf_adds(b, "# HELP deltafin_info The served model (value 1).\n# TYPE deltafin_info gauge\ndeltafin_info{model=\"");
    label_value(b, live->model);
    srv_buf_printf(b, "\",exact=\"%s\",version=\"%s\"} 1\n", live->exact ? "true" : "false", DELTAFIN_VERSION);
    gauge(b, "deltafin_model_healthy", "0 while /health reports the model's files failing (corrupt data: until restart; an I/O error: until a later generation succeeds), else 1.",
          live->healthy);
    gauge(b, "deltafin_parallel", "Generations that may run at once (--parallel).", live->parallel);
    gauge(b, "deltafin_queue_capacity", "Requests that may wait for a worker (--queue).", live->queue);
    gauge(b, "deltafin_requests_running", "Generations admitted and not finished (running or waiting).", live->in_flight);
    gauge(b, "deltafin_requests_waiting", "Admitted generations waiting for a worker.", live->waiting);
    srv_buf_adds(b, "# HELP deltafin_requests_total Finished generation requests by endpoint and HTTP status (499: the "
                    "client left before the response began; a stream keeps the 200 it was sent). Requests refused with "
                    "400 (invalid) or 429 (busy) are not counted.\n"
                    "# TYPE deltafin_requests_total counter\n");
    for (int i = 0; i < m->n_codes; i++)
        srv_buf_printf(b, "deltafin_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n",
                       m->codes[i].chat ? "chat" : "completions", m->codes[i].status, (unsigned long long)m->codes[i].n);
    counter(b, "deltafin_requests_rejected_total", "Requests refused with 429 (every worker busy and the queue full).",
            (double)live->rejected);
    counter(b, "deltafin_model_errors_total", "Generations stopped by a model file failure (corrupt pack, read error).",
            (double)live->model_errors);
    counter(b, "deltafin_prompt_tokens_total", "Prompt tokens of finished generations (reused prefix included).",
            (double)m->prompt_tokens);
    counter(b, "deltafin_prompt_tokens_reused_total", "Prompt tokens taken from a session's KV cache (not evaluated).",
            (double)m->cached_tokens);
    counter(b, "deltafin_generation_tokens_total", "Tokens generated (those of running generations included).",
            (double)(m->completion_tokens + live->live_tokens));
    hist_print(b, "deltafin_time_to_first_token_seconds", "Time from a worker starting the generation (prompt evaluation included) to its first token.", &m->ttft);
    hist_print(b, "deltafin_request_duration_seconds", "Time a worker spent on a generation request (those that never "
               "ran, or were refused with 400, not counted).", &m->duration);
    const df_stats *e = &m->engine;
    counter(b, "deltafin_engine_prefill_tokens_total", "Tokens evaluated in multi-token (prompt) evaluations.",
            (double)e->prefill_tokens);
    counter(b, "deltafin_engine_decode_tokens_total", "Tokens evaluated one per sequence (decode steps).",
            (double)e->decode_tokens);
    counter(b, "deltafin_engine_prefill_seconds_total", "Wall time of prompt evaluations.", e->prefill_s);
    counter(b, "deltafin_engine_decode_seconds_total", "Wall time of decode steps.", e->decode_s);
    counter(b, "deltafin_expert_hits_total", "Routed experts found in memory when a token needed them.",
            (double)e->expert_hits);
    counter(b, "deltafin_expert_misses_total", "Routed experts read from the drives when a token needed them.",
            (double)e->expert_misses);
    srv_buf_adds(b, "# HELP deltafin_expert_read_bytes_total Routed-expert bytes read from the drives.\n"
                    "# TYPE deltafin_expert_read_bytes_total counter\n");
    srv_buf_printf(b, "deltafin_expert_read_bytes_total{reason=\"demand\"} %llu\n",
                   (unsigned long long)e->expert_bytes_demand);
    srv_buf_printf(b, "deltafin_expert_read_bytes_total{reason=\"prefetch\"} %llu\n",
                   (unsigned long long)e->expert_bytes_prefetch);
    counter(b, "deltafin_prefetch_issued_total", "Experts read ahead by the router lookahead.", (double)e->prefetch_issued);
    counter(b, "deltafin_prefetch_useful_total", "Experts read ahead and then used.", (double)e->prefetch_useful);
    counter(b, "deltafin_spine_streamed_bytes_total", "Spine bytes read from the drives (layers beyond the budget).",
            (double)e->spine_bytes_streamed);
    counter(b, "deltafin_weight_bytes_touched_total", "Weight bytes (spine and experts) the computation read.",
            (double)e->weight_bytes_read);
    counter(b, "deltafin_io_stall_seconds_total", "Computation time spent waiting for expert reads.", e->io_stall_s);
    gauge(b, "deltafin_resident_bytes", "Memory held by the model at the last finished generation (spine, caches, KV).",
          (double)e->resident_bytes);
    if (live->has_batches) {
        counter(b, "deltafin_decode_batches_total", "Decode steps run as one forward pass over the running sequences.",
                (double)live->decode_batches);
        counter(b, "deltafin_decode_batch_rows_total", "Sequences evaluated in those decode steps (rows).",
                (double)live->decode_batch_rows);
    }
}
