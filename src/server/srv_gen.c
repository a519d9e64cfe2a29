/* srv_gen.c — one generation on the worker thread: prompt -> tokens, KV prefix
 * reuse, prefill with keep-alives, the sample/eval loop, and the OpenAI output
 * (SSE chunks while streaming, one JSON body otherwise).
 *
 * Per sampled token: id -> streaming detokenizer (only complete UTF-8) -> stop
 * matcher (holds back possible stop prefixes) -> Kimi parser (reasoning /
 * content / tool calls, chat only) -> deltas. The client-gone flag is checked
 * before every token and in df_eval's progress callback, so a disconnect stops
 * the work within one token (or one chunk of a prefill's layer). */
#include "srv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { FIN_NONE, FIN_STOP, FIN_LENGTH, FIN_CANCEL, FIN_ERROR };

/* Where a pending logprob entry's token sits in the generated text, in characters: [start, end) (start: the characters
 * completed before the token, as text_offset; end: those completed after it; a token that only begins a character has
 * start == end). A prompt entry (echo) has prompt set and goes out with the echo. */
typedef struct {
    size_t start, end;
    int32_t id;
    int prompt;
} lp_span;

typedef struct {
    const srv_gen_opts *o;
    srv_job *j;
    srv_backend *be;
    srv_request *r;
    char id[48];
    long created;
    void *detok;
    srv_stop stop;
    srv_kimi kimi;
    int use_kimi;
    int32_t markers[12];
    const char *marker_text[12];
    int n_markers;
    srv_buf content, reasoning;       /* whole response (non-streamed) */
    int n_calls_sent;
    /* logprobs not yet attached to emitted text */
    cJSON *lp_pending;                /* chat: array of entries; completions: object of 4 arrays */
    lp_span *spans;                   /* one per pending entry, in the same order */
    int n_spans, cap_spans;
    int spans_off;                    /* out of memory for spans: every entry goes with the next text, none is cut */
    cJSON *lp_all;                    /* non-streamed: everything */
    size_t echo_chars;                /* characters of the echoed prompt (completions text_offset base) */
    size_t gen_chars;                 /* characters the detokenizer has produced so far */
    size_t delivered_chars;           /* characters of generated text past the stop matcher (the returned text) */
    int32_t *gen_ids;
    int n_gen;
    int n_prompt, n_cached;
} gen_ctx;

int srv_common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    if (!a || !b) return 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

int srv_pick_session(const int32_t *const *toks, const int *n_past, const int *busy, const double *last_used, int n,
                     const int32_t *prompt, int np) {
    int best = -1, best_len = -1;
    for (int i = 0; i < n; i++) {
        if (busy[i]) continue;
        const int len = srv_common_prefix(toks[i], n_past[i], prompt, np);
        if (len > best_len || (len == best_len && last_used[i] < last_used[best])) { best = i; best_len = len; }
    }
    return best;
}

static void make_id(char *dst, size_t cap, const char *prefix) {
    static const char hex[] = "0123456789abcdef";
    uint64_t a = srv_random_u64(), b = srv_random_u64();
    char tmp[25];
    for (int i = 0; i < 24; i++) {
        tmp[i] = hex[a & 15];
        a = (a >> 4) | (b << 60);
        b >>= 4;
    }
    tmp[24] = 0;
    snprintf(dst, cap, "%s-%s", prefix, tmp);
}

static cJSON *new_lp_container(int chat) {
    if (chat) return cJSON_CreateArray();
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "tokens");
    cJSON_AddArrayToObject(o, "token_logprobs");
    cJSON_AddArrayToObject(o, "top_logprobs");
    cJSON_AddArrayToObject(o, "text_offset");
    return o;
}

/* The logprobs token string of a token's bytes (srv_token_display: the text, or
 * "bytes:\\xNN..." for a token that is not whole UTF-8 characters). */
static cJSON *str_of_bytes(const char *s, size_t n) {
    srv_buf b;
    srv_buf_init(&b);
    srv_token_display(&b, s, n);
    cJSON *v = cJSON_CreateString(b.p ? b.p : "");
    srv_buf_free(&b);
    return v;
}

/* Completions top_logprobs are an object keyed by token string. Distinct ids whose
 * strings coincide (e.g. two tokens with the same text) must not collapse into one
 * key: a later duplicate is keyed "token_id:ID" (vLLM's spelling for ids). */
static void add_top(cJSON *t, const char *s, size_t n, int32_t id, float lp) {
    cJSON *k = str_of_bytes(s, n);
    if (!cJSON_GetObjectItemCaseSensitive(t, k->valuestring)) cJSON_AddNumberToObject(t, k->valuestring, lp);
    else {
        char alt[32];
        snprintf(alt, sizeof alt, "token_id:%d", (int)id);
        cJSON_AddNumberToObject(t, alt, lp);
    }
    cJSON_Delete(k);
}

/* A completions top_logprobs entry: the top-N alternatives (most likely first), then the
 * token itself (sampled or, for an echoed prompt token, given) when it is not among them,
 * as the OpenAI legacy completions API and vLLM do: up to N + 1 keys, and with logprobs 0
 * the token alone. (Chat top_logprobs stay the top-N list of the chat API.) */
static cJSON *completion_top(gen_ctx *g, int top, const int32_t *tids, const float *tlp, int32_t id, float lp) {
    cJSON *t = cJSON_CreateObject();
    int listed = 0;
    for (int i = 0; i < top; i++) {
        char *s = NULL;
        size_t sl = 0;
        g->be->token_bytes(g->be, tids[i], &s, &sl);
        add_top(t, s, sl, tids[i], tlp[i]);
        free(s);
        listed |= tids[i] == id;
    }
    if (!listed) {
        char *s = NULL;
        size_t sl = 0;
        g->be->token_bytes(g->be, id, &s, &sl);
        add_top(t, s, sl, id, lp);
        free(s);
    }
    return t;
}

static cJSON *bytes_array(const char *s, size_t n) {
    cJSON *a = cJSON_CreateArray();
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((unsigned char)s[i]));
    return a;
}

/* A new pending entry's span, empty at the characters produced so far (srv_gen_run sets its end once the token's text
 * is counted). */
static void span_push(gen_ctx *g, int32_t id, int prompt) {
    if (g->spans_off) return;
    if (g->n_spans == g->cap_spans) {
        int cap = g->cap_spans ? 2 * g->cap_spans : 64;
        lp_span *ns = realloc(g->spans, (size_t)cap * sizeof *ns);
        if (!ns) { g->spans_off = 1; return; }
        g->spans = ns;
        g->cap_spans = cap;
    }
    g->spans[g->n_spans++] = (lp_span){g->gen_chars, g->gen_chars, id, prompt};
}

/* Record the logprob entry of token `id` drawn from `logits`. */
static void record_logprob(gen_ctx *g, const float *logits, int32_t id) {
    span_push(g, id, 0);
    int top = g->r->top_logprobs;
    int32_t tids[SRV_MAX_TOP_LOGPROBS];
    float tlp[SRV_MAX_TOP_LOGPROBS];
    float lp = g->be->logprob(logits, g->be->n_vocab, id, top, tids, tlp);
    char *tb = NULL;
    size_t tl = 0;
    g->be->token_bytes(g->be, id, &tb, &tl);
    if (g->r->kind == SRV_CHAT) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddItemToObject(e, "token", str_of_bytes(tb, tl));
        cJSON_AddNumberToObject(e, "logprob", lp);
        cJSON_AddItemToObject(e, "bytes", bytes_array(tb, tl));
        cJSON *ta = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int i = 0; i < top; i++) {
            char *s = NULL;
            size_t sl = 0;
            g->be->token_bytes(g->be, tids[i], &s, &sl);
            cJSON *t = cJSON_CreateObject();
            cJSON_AddItemToObject(t, "token", str_of_bytes(s, sl));
            cJSON_AddNumberToObject(t, "logprob", tlp[i]);
            cJSON_AddItemToObject(t, "bytes", bytes_array(s, sl));
            cJSON_AddItemToArray(ta, t);
            free(s);
        }
        cJSON_AddItemToArray(g->lp_pending, e);
    } else {
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "tokens"), str_of_bytes(tb, tl));
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "token_logprobs"), cJSON_CreateNumber(lp));
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "top_logprobs"), completion_top(g, top, tids, tlp, id, lp));
        /* in characters of the returned text: the characters completed before this
         * token (one that continues a character gets that character's offset) */
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "text_offset"),
                             cJSON_CreateNumber((double)(g->echo_chars + g->gen_chars)));
    }
    free(tb);
}

/* text_offset of each prompt token, in characters of the echoed text `echo`:
 * the characters the streaming detokenizer has completed before the token. When
 * the decoded prompt is the echo preceded by text the tokenizer added (a BOS
 * token's text), that text is not counted (its tokens get offset 0). */
static size_t *prompt_offsets(gen_ctx *g, const int32_t *P, int n, const srv_buf *echo) {
    size_t *off = malloc((size_t)(n > 0 ? n : 1) * sizeof *off);
    srv_buf d;
    srv_buf_init(&d);
    void *dt = g->be->detok_new(g->be);
    char tmp[1024];
    size_t chars = 0;
    for (int i = 0; i < n; i++) {
        off[i] = chars;
        int k = g->be->detok_push(dt, P[i], tmp, sizeof tmp);
        if (k > 0) { srv_buf_add(&d, tmp, (size_t)k); chars += srv_utf8_chars(tmp, (size_t)k); }
    }
    int k = g->be->detok_flush(dt, tmp, sizeof tmp);
    if (k > 0) srv_buf_add(&d, tmp, (size_t)k);
    g->be->detok_free(dt);
    size_t echo_chars = srv_utf8_chars(echo->p ? echo->p : "", echo->len), shift = 0;
    if (d.len >= echo->len && !memcmp(d.p + d.len - echo->len, echo->p ? echo->p : "", echo->len))
        shift = srv_utf8_chars(d.p, d.len - echo->len);
    for (int i = 0; i < n; i++) {
        off[i] = off[i] > shift ? off[i] - shift : 0;
        if (off[i] > echo_chars) off[i] = echo_chars;
    }
    srv_buf_free(&d);
    return off;
}

/* Completions echo + logprobs: entries for the prompt tokens (the first has no
 * logprob: null, as in the OpenAI API); row i-1 of `all` predicts token i. */
static void prompt_logprobs(gen_ctx *g, const int32_t *P, int n, const float *all, const srv_buf *echo) {
    int top = g->r->top_logprobs;
    int32_t tids[SRV_MAX_TOP_LOGPROBS];
    float tlp[SRV_MAX_TOP_LOGPROBS];
    size_t *off = prompt_offsets(g, P, n, echo);
    for (int i = 0; i < n; i++) {
        char *tb = NULL;
        size_t tl = 0;
        g->be->token_bytes(g->be, P[i], &tb, &tl);
        span_push(g, P[i], 1);
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "tokens"), str_of_bytes(tb, tl));
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "text_offset"), cJSON_CreateNumber((double)off[i]));
        free(tb);
        if (i == 0) {
            cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "token_logprobs"), cJSON_CreateNull());
            cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "top_logprobs"), cJSON_CreateNull());
            continue;
        }
        const float *row = all + (size_t)(i - 1) * g->be->n_vocab;
        float lp = g->be->logprob(row, g->be->n_vocab, P[i], top, tids, tlp);
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "token_logprobs"), cJSON_CreateNumber(lp));
        cJSON_AddItemToArray(cJSON_GetObjectItem(g->lp_pending, "top_logprobs"), completion_top(g, top, tids, tlp, P[i], lp));
    }
    free(off);
}

static const char *const lp_keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};

/* Pending logprob entries (their spans are kept one for one). */
static int n_pending(gen_ctx *g) {
    return cJSON_GetArraySize(g->r->kind == SRV_CHAT ? g->lp_pending : cJSON_GetObjectItem(g->lp_pending, "tokens"));
}

/* Move the first n pending logprob entries into dst (chat: {"content":[...]}; completions: the 4 arrays). */
static void take_first(gen_ctx *g, cJSON *dst, int n) {
    const int have = n_pending(g);
    if (n > have) n = have;
    if (g->r->kind == SRV_CHAT) {
        cJSON *arr = cJSON_GetObjectItem(dst, "content");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_DetachItemFromArray(g->lp_pending, 0));
    } else {
        for (int k = 0; k < 4; k++) {
            cJSON *src = cJSON_GetObjectItem(g->lp_pending, lp_keys[k]), *d = cJSON_GetObjectItem(dst, lp_keys[k]);
            for (int i = 0; i < n; i++) cJSON_AddItemToArray(d, cJSON_DetachItemFromArray(src, 0));
        }
    }
    if (g->spans_off) return;
    memmove(g->spans, g->spans + n, (size_t)(g->n_spans - n) * sizeof *g->spans);
    g->n_spans -= n;
}

/* Every pending entry into dst (at the end of the generation). */
static void take_pending(gen_ctx *g, cJSON *dst) { take_first(g, dst, n_pending(g)); }

/* The leading pending entries whose whole text is in the delivered text: a token's logprob goes out once the stop
 * matcher has released all of its text (a token part of which it still holds may yet be cut by a stop sequence). */
static void take_delivered(gen_ctx *g, cJSON *dst) {
    int n = 0;
    const int np = n_pending(g);
    while (n < np && (g->spans_off || g->spans[n].prompt ||
                      (g->spans[n].start < g->delivered_chars && g->spans[n].end <= g->delivered_chars)))
        n++;
    take_first(g, dst, n);
}

/* A stop sequence cut the text at delivered_chars: the pending entries cover exactly the returned text. Entries of
 * tokens that begin at or after the cut (the stop sequence and what followed) are dropped; a token that straddles
 * the cut keeps its logprob, with its token string (chat: also its bytes) cut to the characters before the cut. */
static void settle_at_stop(gen_ctx *g) {
    if (g->spans_off) return;
    int keep = 0;
    const int np = n_pending(g);
    while (keep < np && (g->spans[keep].prompt || g->spans[keep].start < g->delivered_chars)) keep++;
    for (int i = np - 1; i >= keep; i--) {
        if (g->r->kind == SRV_CHAT) cJSON_DeleteItemFromArray(g->lp_pending, i);
        else
            for (int k = 0; k < 4; k++) cJSON_DeleteItemFromArray(cJSON_GetObjectItem(g->lp_pending, lp_keys[k]), i);
    }
    g->n_spans = keep;
    if (!keep) return;
    const lp_span *sp = &g->spans[keep - 1];
    if (sp->prompt || sp->end <= g->delivered_chars) return;
    /* the straddling token: its first (delivered - start) characters; a token that is not whole UTF-8 characters
     * (one that splits a character with its neighbour) has no such prefix and is kept as it is */
    char *tb = NULL;
    size_t tl = 0, cut = 0, chars = 0;
    g->be->token_bytes(g->be, sp->id, &tb, &tl);
    if (tb && srv_utf8_valid(tb, tl)) {
        const size_t want = g->delivered_chars - sp->start;
        while (cut < tl && chars < want) {
            cut++;
            while (cut < tl && ((unsigned char)tb[cut] & 0xC0) == 0x80) cut++;
            chars++;
        }
        if (g->r->kind == SRV_CHAT) {
            cJSON *e = cJSON_GetArrayItem(g->lp_pending, keep - 1);
            cJSON_ReplaceItemInObject(e, "token", str_of_bytes(tb, cut));
            cJSON_ReplaceItemInObject(e, "bytes", bytes_array(tb, cut));
        } else {
            cJSON_ReplaceItemInArray(cJSON_GetObjectItem(g->lp_pending, "tokens"), keep - 1, str_of_bytes(tb, cut));
        }
    }
    free(tb);
}

static cJSON *new_lp_out(gen_ctx *g) {
    if (g->r->kind != SRV_CHAT) return new_lp_container(0);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddArrayToObject(o, "content");
    return o;
}

static cJSON *usage_json(gen_ctx *g) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", g->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", g->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", g->n_prompt + g->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", g->n_cached);
    return u;
}

static cJSON *envelope(gen_ctx *g, int chunk) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", g->id);
    cJSON_AddStringToObject(o, "object", g->r->kind == SRV_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                                 : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)g->created);
    cJSON_AddStringToObject(o, "model", g->be->name);
    cJSON_AddStringToObject(o, "system_fingerprint", "deltafin-" DELTAFIN_VERSION);
    return o;
}

static void send_json_event(gen_ctx *g, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    srv_buf b;
    srv_buf_init(&b);
    srv_buf_adds(&b, "data: ");
    srv_buf_adds(&b, s);
    srv_buf_adds(&b, "\n\n");
    srv_job_emit(g->j, b.p, b.len);
    srv_buf_free(&b);
    free(s);
}

static cJSON *tool_call_json(const srv_tool_call *c, int index, int with_index) {
    cJSON *t = cJSON_CreateObject();
    if (with_index) cJSON_AddNumberToObject(t, "index", index);
    cJSON_AddStringToObject(t, "id", c->id);
    cJSON_AddStringToObject(t, "type", "function");
    cJSON *f = cJSON_AddObjectToObject(t, "function");
    cJSON_AddStringToObject(f, "name", c->name);
    cJSON_AddStringToObject(f, "arguments", c->arguments);
    return t;
}

/* Streamed chunk: text deltas (or the role / finish chunk). */
static void stream_chunk(gen_ctx *g, const srv_buf *reason, const srv_buf *content, int role, const char *finish) {
    cJSON *o = envelope(g, 1), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    int has_text = (reason && reason->len) || (content && content->len);
    if (g->r->kind == SRV_CHAT) {
        cJSON *d = cJSON_AddObjectToObject(c, "delta");
        if (role) { cJSON_AddStringToObject(d, "role", "assistant"); cJSON_AddStringToObject(d, "content", ""); }
        if (reason && reason->len) cJSON_AddStringToObject(d, "reasoning_content", reason->p);
        if (content && content->len) cJSON_AddStringToObject(d, "content", content->p);
        if (g->kimi.n_calls > g->n_calls_sent) {
            cJSON *tc = cJSON_AddArrayToObject(d, "tool_calls");
            for (; g->n_calls_sent < g->kimi.n_calls; g->n_calls_sent++)
                cJSON_AddItemToArray(tc, tool_call_json(&g->kimi.calls[g->n_calls_sent], g->n_calls_sent, 1));
        }
    } else cJSON_AddStringToObject(c, "text", content && content->len ? content->p : "");
    /* logprobs ride with the text that completes their tokens (take_delivered); tokens that produced none yet
     * (incomplete UTF-8) go with the final chunk, which carries whatever is left (after a stop sequence, what
     * settle_at_stop kept: the entries of the returned text) */
    int lp_now = g->r->logprobs && (has_text || (finish && n_pending(g) > 0));
    if (lp_now) {
        cJSON *lp = new_lp_out(g);
        if (finish) take_pending(g, lp);
        else take_delivered(g, lp);
        cJSON_AddItemToObject(c, "logprobs", lp);
    } else cJSON_AddNullToObject(c, "logprobs");
    if (finish) cJSON_AddStringToObject(c, "finish_reason", finish); else cJSON_AddNullToObject(c, "finish_reason");
    if (finish && (g->r->return_token_ids || !g->be->has_tokenizer)) { /* non-standard: the generated ids */
        cJSON *a = cJSON_AddArrayToObject(c, "token_ids");
        for (int i = 0; i < g->n_gen; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(g->gen_ids[i]));
    }
    if (g->r->include_usage) cJSON_AddNullToObject(o, "usage");
    send_json_event(g, o);
    cJSON_Delete(o);
}

/* Route decided text (after the stop matcher) to the response. */
static void deliver(gen_ctx *g, const char *s, size_t n) {
    srv_buf reason, content;
    srv_buf_init(&reason);
    srv_buf_init(&content);
    int calls_before = g->kimi.n_calls;
    g->delivered_chars += srv_utf8_chars(s, n);
    if (g->use_kimi) srv_kimi_push(&g->kimi, s, n, &reason, &content);
    else srv_buf_add(&content, s, n);
    if (g->r->stream) {
        if (reason.len || content.len || g->kimi.n_calls > calls_before) stream_chunk(g, &reason, &content, 0, NULL);
    } else {
        srv_buf_add(&g->reasoning, reason.p, reason.len);
        srv_buf_add(&g->content, content.p, content.len);
        if (g->r->logprobs) take_delivered(g, g->lp_all);
    }
    srv_buf_free(&reason);
    srv_buf_free(&content);
}

/* Text of one token into the pipeline; returns 1 when a stop sequence matched. */
static int push_text(gen_ctx *g, const char *s, size_t n) {
    srv_buf safe;
    srv_buf_init(&safe);
    int hit = srv_stop_push(&g->stop, s, n, &safe);
    if (safe.len) deliver(g, safe.p, safe.len);
    srv_buf_free(&safe);
    return hit;
}

/* df_eval's per-layer callback: stop a prefill whose client left. (Keep-alive
 * comments are written by the connection thread, srv_http.c, whenever the stream
 * has been silent for the keep-alive period, however long one layer takes.) */
static int gen_progress(void *u, const char *what, uint64_t done, uint64_t total) {
    gen_ctx *g = u;
    return g->j->cancel ? 1 : 0;
}

/* An evaluation error: kept on the job so that the server can report a model
 * that fails (a corrupt expert pack, DF_EFORMAT / DF_EIO) on /health. */
static void note_engine_error(gen_ctx *g, int rc, const char *err) {
    g->j->engine_rc = rc;
    snprintf(g->j->engine_err, sizeof g->j->engine_err, "%s", err);
}

/* Answer the job with an error: the OpenAI error body with `status` before the response began, else an SSE error
 * event and [DONE] (a stream keeps its 200); the message is kept on the job for the server's log line. */
static void fail_job(gen_ctx *g, int status, const char *msg, const char *param) {
    char *e = srv_error_json(msg, srv_error_type(status), param, NULL);
    __atomic_store_n(&g->j->final, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&g->j->mu);
    snprintf(g->j->error_msg, sizeof g->j->error_msg, "%s", msg);
    if (!g->j->prepared) {
        g->j->http_status = status;
        g->j->prepared = 1;
        srv_buf_adds(&g->j->out, e);
    } else {
        srv_buf_adds(&g->j->out, "data: ");
        srv_buf_adds(&g->j->out, e);
        srv_buf_adds(&g->j->out, "\n\ndata: [DONE]\n\n");
    }
    pthread_cond_broadcast(&g->j->cv);
    pthread_mutex_unlock(&g->j->mu);
    free(e);
}

/* Tokens of the prompt (malloc'd); on error fails the job and returns NULL. */
static int32_t *prompt_tokens(gen_ctx *g, int *n_out, int *think_open, srv_buf *echo) {
    srv_backend *be = g->be;
    srv_request *r = g->r;
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    *think_open = 0;
    if (r->kind == SRV_CHAT) {
        if (!be->has_tokenizer) {
            fail_job(g, 400, "This model has no tokenizer: use /v1/completions with a token-id array as 'prompt'.", "messages");
            return NULL;
        }
        char *text = NULL;
        if (be->chat_render(be, r->messages_json, r->tools_json, &text, err, sizeof err)) {
            char m[700];
            snprintf(m, sizeof m, "Cannot render 'messages' in the model's chat format: %s", err);
            fail_job(g, 400, m, "messages");
            return NULL;
        }
        size_t tl = strlen(text);
        while (tl && (text[tl - 1] == '\n' || text[tl - 1] == ' ')) tl--;
        *think_open = srv_kimi_prompt_opens_think(text, tl);
        int rc = be->tokenize(be, text, strlen(text), 0, &ids, &n, err, sizeof err);
        free(text);
        if (rc) {
            char m[700];
            snprintf(m, sizeof m, "Cannot tokenize the rendered chat: %s", err);
            fail_job(g, 400, m, "messages");
            return NULL;
        }
    } else if (r->prompt) {
        if (!be->has_tokenizer) {
            fail_job(g, 400, "This model has no tokenizer: send 'prompt' as an array of token ids.", "prompt");
            return NULL;
        }
        if (be->tokenize(be, r->prompt, r->prompt_len, 1, &ids, &n, err, sizeof err)) {
            char m[700];
            snprintf(m, sizeof m, "Cannot tokenize 'prompt': %s", err);
            fail_job(g, 400, m, "prompt");
            return NULL;
        }
        if (r->echo) srv_buf_add(echo, r->prompt, r->prompt_len);
    } else {
        n = (size_t)r->n_prompt_ids;
        ids = malloc(n * sizeof *ids);
        memcpy(ids, r->prompt_ids, n * sizeof *ids);
        for (size_t i = 0; i < n; i++) {
            if (ids[i] >= be->n_vocab) {
                char m[200];
                snprintf(m, sizeof m, "Invalid 'prompt[%zu]': token id %d is outside the vocabulary [0, %d).", i, (int)ids[i], be->n_vocab);
                fail_job(g, 400, m, "prompt");
                free(ids);
                return NULL;
            }
        }
        if (r->echo) {
            void *d = be->detok_new(be);
            char tmp[512];
            for (size_t i = 0; i < n; i++) {
                int k = be->detok_push(d, ids[i], tmp, sizeof tmp);
                if (k > 0) srv_buf_add(echo, tmp, (size_t)k);
            }
            int k = be->detok_flush(d, tmp, sizeof tmp);
            if (k > 0) srv_buf_add(echo, tmp, (size_t)k);
            be->detok_free(d);
        }
    }
    if (n == 0) {
        fail_job(g, 400, "The prompt is empty after tokenization.", r->kind == SRV_CHAT ? "messages" : "prompt");
        free(ids);
        return NULL;
    }
    if ((int)n >= be->n_ctx) {
        char m[320];
        /* n_ctx is the server's --ctx (default min(4096, the model's maximum)), not the model's own limit */
        snprintf(m, sizeof m, "This server's context is %d tokens (deltafin serve --ctx %d); the prompt has %zu tokens, "
                 "which leaves no room for a completion: shorten the prompt, or restart the server with a larger --ctx "
                 "(up to the model's maximum context).", be->n_ctx, be->n_ctx, n);
        fail_job(g, 400, m, r->kind == SRV_CHAT ? "messages" : "prompt");
        free(ids);
        return NULL;
    }
    *n_out = (int)n;
    return ids;
}

static const char *fin_name(gen_ctx *g, int fin) {
    if (fin == FIN_LENGTH) return "length";
    if (g->kimi.n_calls > 0) return "tool_calls";
    return "stop";
}

static void finish_nonstream(gen_ctx *g, int fin, const srv_buf *echo) {
    cJSON *o = envelope(g, 0), *ch = cJSON_AddArrayToObject(o, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(ch, c);
    cJSON_AddNumberToObject(c, "index", 0);
    if (g->r->kind == SRV_CHAT) {
        cJSON *m = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(m, "role", "assistant");
        if (g->kimi.n_calls && !g->content.len) cJSON_AddNullToObject(m, "content");
        else cJSON_AddStringToObject(m, "content", g->content.p ? g->content.p : "");
        if (g->reasoning.len) cJSON_AddStringToObject(m, "reasoning_content", g->reasoning.p);
        if (g->kimi.n_calls) {
            cJSON *tc = cJSON_AddArrayToObject(m, "tool_calls");
            for (int i = 0; i < g->kimi.n_calls; i++) cJSON_AddItemToArray(tc, tool_call_json(&g->kimi.calls[i], i, 0));
        }
    } else {
        srv_buf t;
        srv_buf_init(&t);
        srv_buf_add(&t, echo->p, echo->len);
        srv_buf_add(&t, g->content.p, g->content.len);
        cJSON_AddStringToObject(c, "text", t.p ? t.p : "");
        srv_buf_free(&t);
    }
    if (g->r->logprobs) { cJSON_AddItemToObject(c, "logprobs", g->lp_all); g->lp_all = NULL; }
    else cJSON_AddNullToObject(c, "logprobs");
    cJSON_AddStringToObject(c, "finish_reason", fin_name(g, fin));
    if (g->r->return_token_ids || !g->be->has_tokenizer) {
        cJSON *a = cJSON_AddArrayToObject(c, "token_ids");
        for (int i = 0; i < g->n_gen; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(g->gen_ids[i]));
    }
    cJSON_AddItemToObject(o, "usage", usage_json(g));
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    pthread_mutex_lock(&g->j->mu);
    g->j->http_status = 200;
    g->j->prepared = 1;
    srv_buf_adds(&g->j->out, s);
    pthread_mutex_unlock(&g->j->mu);
    free(s);
}

static void finish_stream(gen_ctx *g, int fin) {
    stream_chunk(g, NULL, NULL, 0, fin_name(g, fin)); /* with token_ids when asked for (or no tokenizer) */
    if (g->r->include_usage) {
        cJSON *o = envelope(g, 1);
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_json(g));
        send_json_event(g, o);
        cJSON_Delete(o);
    }
    __atomic_store_n(&g->j->final, 1, __ATOMIC_SEQ_CST);
    srv_job_emit(g->j, "data: [DONE]\n\n", 14);
}

void srv_gen_run(const srv_gen_opts *o, srv_job *j) {
    gen_ctx G, *g = &G;
    memset(g, 0, sizeof G);
    g->o = o;
    g->j = j;
    g->be = o->be;
    g->r = &j->req;
    g->created = (long)time(NULL);
    make_id(g->id, sizeof g->id, g->r->kind == SRV_CHAT ? "chatcmpl" : "cmpl");
    srv_backend *be = g->be;
    srv_request *r = g->r;
    double t0 = srv_now();
    srv_buf echo;
    srv_buf_init(&echo);
    srv_buf_init(&g->content);
    srv_buf_init(&g->reasoning);
    float *logits = NULL;
    void *sampler = NULL, *spec = NULL;
    int32_t *P = NULL;
    void *sess = NULL;
    int n = 0, think_open = 0, fin = FIN_NONE;
    char err[512] = "";

    if (!(P = prompt_tokens(g, &n, &think_open, &echo))) goto out;
    /* echo + logprobs: the prompt's own logprobs need logits at every prompt
     * position, so the whole prompt is evaluated with DF_EVAL_ALL_LOGITS */
    int prompt_lp = r->echo && r->logprobs;
    if (prompt_lp && (double)n * be->n_vocab > SRV_MAX_ALL_LOGITS) {
        char m[300];
        snprintf(m, sizeof m, "'echo' with 'logprobs' needs logits for all %d prompt tokens (%d x %d floats); "
                 "the limit is %.0f: shorten the prompt or drop 'logprobs'.", n, n, be->n_vocab, (double)SRV_MAX_ALL_LOGITS);
        fail_job(g, 400, m, "logprobs");
        goto out;
    }
    g->echo_chars = srv_utf8_chars(echo.p ? echo.p : "", echo.len);
    g->n_prompt = n;
    int room = be->n_ctx - n;
    /* without max_tokens: completions generate SRV_COMPLETION_DEFAULT_MAX_TOKENS (the OpenAI default), chat what fits
     * (or --max-tokens); --max-tokens and the context's room cap either */
    int max_new = r->max_tokens > 0 || r->max_tokens_set ? r->max_tokens
                  : r->kind == SRV_COMPLETION                ? SRV_COMPLETION_DEFAULT_MAX_TOKENS
                  : o->max_tokens > 0                        ? o->max_tokens
                                                             : room;
    if (o->max_tokens > 0 && max_new > o->max_tokens) max_new = o->max_tokens;
    if (max_new > room) max_new = room;

    g->use_kimi = r->kind == SRV_CHAT && be->is_kimi;
    srv_kimi_init(&g->kimi, g->use_kimi, g->use_kimi && r->n_tools > 0, think_open);
    srv_stop_init(&g->stop, (const char *const *)r->stops, r->n_stops);
    if (g->use_kimi) {
        static const char *mk[] = {"<think>", "</think>", "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                   "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                                   "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
        for (int i = 0; i < 11; i++) {
            int32_t id = be->token_id(be, mk[i]);
            if (id >= 0) { g->markers[g->n_markers] = id; g->marker_text[g->n_markers++] = mk[i]; }
        }
    }
    int32_t stop_ids[16];
    int n_stop_ids = be->stop_ids(be, stop_ids, 16);
    g->detok = be->detok_new(be);
    if (r->logprobs) {
        g->lp_pending = new_lp_container(r->kind == SRV_CHAT);
        g->lp_all = new_lp_out(g);
    }
    g->gen_ids = malloc((size_t)(max_new > 0 ? max_new : 1) * sizeof(int32_t));
    logits = malloc((size_t)be->n_vocab * sizeof(float));
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    so.temperature = (float)r->temperature;
    so.top_p = (float)r->top_p;
    so.top_k = r->top_k;
    /* without a seed every request draws its own from the kernel's entropy source */
    so.seed = j->seed = r->has_seed ? r->seed : srv_random_u64();
    sampler = be->sampler_new(be, &so);
    if (!logits || !g->gen_ids || !sampler) { fail_job(g, 500, "Out of memory (or no sampler) while starting generation.", NULL); goto out; }

    /* KV reuse: keep the longest common prefix of the cached tokens and the prompt
     * (at least one prompt token is always evaluated, for its logits). */
    /* the idle session whose cached tokens share the longest prefix with the prompt */
    if (!(sess = be->session_acquire(be, P, n))) { fail_job(g, 503, "No free session (more generations than --parallel).", NULL); goto out; }
    int np = be->n_past(be, sess);
    int keep = o->kv_reuse && !prompt_lp ? srv_common_prefix(be->tokens(be, sess), np, P, n) : 0;
    if (keep >= n) keep = n - 1;
    if (keep < np && be->truncate(be, sess, keep)) {
        keep = 0;
        if (be->truncate(be, sess, 0)) { fail_job(g, 500, "Cannot reset the KV cache.", NULL); goto out; }
    }
    g->n_cached = keep;

    if (r->stream) { /* headers + the role chunk go out before the prefill */
        pthread_mutex_lock(&j->mu);
        j->http_status = 200;
        j->prepared = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        if (r->kind == SRV_CHAT) stream_chunk(g, NULL, NULL, 1, NULL);
    }
    int rc;
    if (prompt_lp) {
        float *all = malloc((size_t)n * (size_t)be->n_vocab * sizeof(float));
        if (!all) { fail_job(g, 500, "Out of memory for the prompt's logits.", NULL); goto out; }
        rc = be->eval(be, sess, P, n, all, DF_EVAL_ALL_LOGITS, gen_progress, g, err, sizeof err);
        if (!rc) {
            memcpy(logits, all + (size_t)(n - 1) * be->n_vocab, (size_t)be->n_vocab * sizeof(float));
            prompt_logprobs(g, P, n, all, &echo);
        }
        free(all);
    } else rc = be->eval(be, sess, P + keep, n - keep, logits, 0, gen_progress, g, err, sizeof err);
    if (!rc && r->stream && echo.len) stream_chunk(g, NULL, &echo, 0, NULL);
    else if (!rc && prompt_lp) take_pending(g, g->lp_all);
    if (rc == DF_ECANCELLED || j->cancel) { be->truncate(be, sess, keep); fin = FIN_CANCEL; goto finish; }
    if (rc) {
        be->truncate(be, sess, keep);
        note_engine_error(g, rc, err);
        char m[700];
        snprintf(m, sizeof m, "Prompt evaluation failed: %s (%s)", err, df_strerror(rc));
        fail_job(g, 500, m, NULL);
        goto out;
    }
    char piece[1024];
    /* speculative decoding (serve --draft): the same tokens, several per target eval; not with logprobs,
     * which need every token's logits */
    spec = be->spec_new && !r->logprobs ? be->spec_new(be, sess, sampler) : NULL;
    int32_t sq[65];
    int sq_n = 0, sq_i = 0;
    for (int step = 0; step < max_new; step++) {
        if (j->cancel) { fin = FIN_CANCEL; break; }
        int32_t id = sq_i < sq_n ? sq[sq_i++] : be->sample(sampler, logits, be->n_vocab);
        if (step == 0) j->ttft_s = srv_now() - t0;
        int is_stop = 0;
        for (int i = 0; i < n_stop_ids; i++) is_stop |= id == stop_ids[i];
        if (is_stop) { fin = FIN_STOP; break; }
        if (r->logprobs) record_logprob(g, logits, id);
        g->gen_ids[g->n_gen++] = id;
        __atomic_store_n(&j->live_tokens, g->n_gen, __ATOMIC_RELAXED); /* /metrics while it runs */
        const char *mtext = NULL;
        for (int i = 0; i < g->n_markers; i++) if (id == g->markers[i]) mtext = g->marker_text[i];
        int k, hit = 0;
        /* the characters this token completes are counted (its logprob span's end) before its text goes on */
        if (mtext) {
            k = be->detok_flush(g->detok, piece, sizeof piece);
            g->gen_chars += (k > 0 ? srv_utf8_chars(piece, (size_t)k) : 0) + srv_utf8_chars(mtext, strlen(mtext));
            if (r->logprobs && !g->spans_off) g->spans[g->n_spans - 1].end = g->gen_chars;
            if (k > 0) hit = push_text(g, piece, (size_t)k);
            if (!hit) hit = push_text(g, mtext, strlen(mtext));
        } else {
            k = be->detok_push(g->detok, id, piece, sizeof piece);
            if (k > 0) g->gen_chars += srv_utf8_chars(piece, (size_t)k);
            if (r->logprobs && !g->spans_off) g->spans[g->n_spans - 1].end = g->gen_chars;
            if (k > 0) hit = push_text(g, piece, (size_t)k);
        }
        if (hit) { fin = FIN_STOP; break; }
        if (step + 1 == max_new) { fin = FIN_LENGTH; break; }
        if (spec && sq_i < sq_n) continue; /* decided by the last verification, already in the session */
        if (be->n_past(be, sess) + 1 >= be->n_ctx) { fin = FIN_LENGTH; break; }
        if (spec) {
            const int cap = max_new - step - 1 < 65 ? max_new - step - 1 : 65;
            rc = sq_n = be->spec_step(spec, id, sq, cap, err, sizeof err);
            sq_i = 0;
            if (rc > 0) rc = 0;
        } else rc = be->eval(be, sess, &id, 1, logits, 0, NULL, NULL, err, sizeof err);
        if (rc) {
            note_engine_error(g, rc, err);
            char m[700];
            snprintf(m, sizeof m, "Evaluation failed after %d tokens: %s (%s)", g->n_gen, err, df_strerror(rc));
            fail_job(g, 500, m, NULL);
            goto out;
        }
    }
    if (fin == FIN_NONE) fin = FIN_LENGTH; /* max_new == 0: no room, or max_tokens 0 (echo: scoring the prompt) */
finish:
    if (fin == FIN_CANCEL) {
        if (j->shutdown) fail_job(g, 503, "The server is shutting down; the generation was cancelled.", NULL);
        goto out;
    }
    if (!g->stop.stopped) {
        int k = be->detok_flush(g->detok, piece, sizeof piece);
        int hit = k > 0 ? push_text(g, piece, (size_t)k) : 0;
        if (!hit) {
            srv_buf rest;
            srv_buf_init(&rest);
            srv_stop_flush(&g->stop, &rest);
            if (rest.len) deliver(g, rest.p, rest.len);
            srv_buf_free(&rest);
        }
    }
    if (r->logprobs && g->stop.stopped) settle_at_stop(g);
    if (g->use_kimi) {
        srv_buf reason, content;
        srv_buf_init(&reason);
        srv_buf_init(&content);
        if (fin == FIN_LENGTH) srv_kimi_drop_partial_open(&g->kimi); /* "<th" cut by max_tokens: not content */
        srv_kimi_flush(&g->kimi, &reason, &content);
        if (r->stream) {
            if (reason.len || content.len) stream_chunk(g, &reason, &content, 0, NULL);
        } else {
            srv_buf_add(&g->reasoning, reason.p, reason.len);
            srv_buf_add(&g->content, content.p, content.len);
        }
        srv_buf_free(&reason);
        srv_buf_free(&content);
    }
    if (r->logprobs && !r->stream) take_pending(g, g->lp_all);
    /* the session is free before the client sees the end (its next request may reuse the prefix) */
    be->session_release(be, sess);
    sess = NULL;
    if (r->stream) finish_stream(g, fin);
    else finish_nonstream(g, fin, &echo);
out:
    j->prompt_tokens = g->n_prompt;
    j->cached_tokens = g->n_cached;
    j->completion_tokens = g->n_gen;
    if (spec) be->spec_free(spec);
    if (sess) be->session_release(be, sess);
    if (sampler) be->sampler_free(sampler);
    if (g->detok) be->detok_free(g->detok);
    srv_stop_free(&g->stop);
    srv_kimi_free(&g->kimi);
    cJSON_Delete(g->lp_pending);
    free(g->spans);
    cJSON_Delete(g->lp_all);
    srv_buf_free(&g->content);
    srv_buf_free(&g->reasoning);
    srv_buf_free(&echo);
    free(g->gen_ids);
    free(logits);
    free(P);
    __atomic_store_n(&j->final, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_lock(&j->mu);
    if (!j->prepared) { j->prepared = 1; j->http_status = 499; }
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}
