/* srv_mock.c — a tiny deterministic "model" for testing the server without
 * weights (`deltafin serve --mock`). Vocabulary: ids 0..255 are bytes, 256 is
 * EOS, 257..261 are Kimi's tool-call markers. After n_past tokens the logits peak at byte MOCK_TEXT[n_past % (L+1)]
 * where index L is EOS at n_past == L and '\n' in later cycles: the greedy
 * continuation of a P-token prompt is the text from offset P % (L+1), ending
 * with EOS when P < L, and endless (cycling) when P > L. The text has multi-byte UTF-8 characters, which byte
 * tokens split: exactly what the server's UTF-8-safe chunking must handle.
 * The sampler here is the mock's own (softmax with temperature, top-k, top-p,
 * xorshift64* seeded RNG); real models use the engine's df_sampler. */
#include "srv.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char MOCK_TEXT[] =
    "Hello, world! The quick brown fox jumps over the lazy dog. "
    "Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 done.";
#define MOCK_L ((int)sizeof MOCK_TEXT - 1)
/* Kimi mode (--mock-kimi): the model continues this script wherever the context
 * ends with a prefix of it (from its start otherwise), then says EOS. */
static const char MOCK_KIMI[] =
    "<think>The user asks for the weather.</think>Checking."
    "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    "{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>";
#define MOCK_KL ((int)sizeof MOCK_KIMI - 1)
#define MOCK_EOS 256
/* Kimi's tool-call markers are special tokens (ids 257..261 here): the streaming
 * detokenizer renders nothing for them, as for any special, so the generator must
 * recognise them by id. <think> stays plain text (it is in Kimi K2). */
static const char *const MOCK_MARKERS[] = {"<|tool_calls_section_begin|>", "<|tool_calls_section_end|>",
                                           "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"};
#define MOCK_N_MARKERS 5
#define MOCK_VOCAB (257 + MOCK_N_MARKERS)
#define MOCK_CTX 65536      /* the mock's maximum context, as a model's max_position_embeddings */
#define MOCK_CTX_DEFAULT 4096 /* --ctx 0: as the engine's default, min(4096, maximum) */

typedef struct {
    int32_t *toks; /* n_ctx */
    int n_past;
    int busy;
    double last_used;
} mock_sess;

typedef struct {
    mock_sess *ss;
    int n_ss;
    int n_ctx;                        /* positions of each session (serve --ctx), at most MOCK_CTX */
    pthread_mutex_t mu;               /* session_acquire / release */
    int delay_ms;
    int kimi;
    int32_t script[sizeof MOCK_KIMI]; /* MOCK_KIMI as tokens (markers as one id each) */
    int n_script;
} mock;
#define MK(b) ((mock *)(b)->impl)

static int k_tokenize(srv_backend *b, const char *s, size_t n, int add_bos, int32_t **ids, size_t *n_ids,
                      char *err, size_t errlen) {
    *ids = malloc((n ? n : 1) * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) (*ids)[i] = (unsigned char)s[i];
    *n_ids = n;
    return 0;
}
static int k_chat_render(srv_backend *b, const char *msgs, const char *tools, char **text, char *err, size_t errlen) {
    cJSON *a = cJSON_Parse(msgs), *m;
    srv_buf o;
    srv_buf_init(&o);
    cJSON_ArrayForEach(m, a) {
        cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        srv_buf_printf(&o, "%s: %s\n", cJSON_IsString(r) ? r->valuestring : "?", cJSON_IsString(c) ? c->valuestring : "");
    }
    srv_buf_adds(&o, "assistant:");
    cJSON_Delete(a);
    *text = o.p;
    return 0;
}
static int k_token_bytes(srv_backend *b, int32_t id, char **out, size_t *len) {
    if (id > MOCK_EOS && id < MOCK_VOCAB) {
        *out = strdup(MOCK_MARKERS[id - MOCK_EOS - 1]);
        *len = strlen(*out);
        return 0;
    }
    *out = malloc(2);
    *len = id < 256 ? 1 : 0;
    (*out)[0] = (char)id;
    (*out)[*len] = 0;
    return 0;
}
typedef struct { char buf[8]; int n; } k_detok; /* bytes of an incomplete character (at most 3) */
static void *k_detok_new(srv_backend *b) { return calloc(1, sizeof(k_detok)); }
static int k_detok_push(void *p, int32_t id, char *out, size_t cap) {
    k_detok *d = p;
    if (id >= 256) return 0;
    d->buf[d->n++] = (char)id;
    /* whole characters out, an incomplete one (at most 3 bytes) held; ill-formed bytes become U+FFFD, as the
     * engine's detokenizer makes them (a sampled byte token need not continue a character) */
    const size_t ok = srv_utf8_complete_prefix(d->buf, (size_t)d->n);
    if (ok == 0) return 0;
    srv_buf b;
    srv_buf_init(&b);
    srv_utf8_sanitize(&b, d->buf, ok);
    const int n = (int)b.len;
    if (b.len > cap) { srv_buf_free(&b); return -1; }
    memcpy(out, b.p, b.len);
    srv_buf_free(&b);
    memmove(d->buf, d->buf + ok, (size_t)d->n - ok);
    d->n -= (int)ok;
    return n;
}
static int k_detok_flush(void *p, char *out, size_t cap) {
    k_detok *d = p;
    srv_buf b;
    srv_buf_init(&b);
    srv_utf8_sanitize(&b, d->buf, (size_t)d->n);
    int n = (int)(b.len < cap ? b.len : cap);
    if (n) memcpy(out, b.p, (size_t)n);
    srv_buf_free(&b);
    d->n = 0;
    return n;
}
static void k_detok_free(void *p) { free(p); }
static int32_t k_token_id(srv_backend *b, const char *tok) {
    for (int i = 0; i < MOCK_N_MARKERS; i++)
        if (!strcmp(tok, MOCK_MARKERS[i])) return MOCK_EOS + 1 + i;
    return !strcmp(tok, "</s>") ? MOCK_EOS : -1;
}
static int k_stop_ids(srv_backend *b, int32_t *ids, int cap) {
    if (cap < 1) return 0;
    ids[0] = MOCK_EOS;
    return 1;
}
static void *k_session_acquire(srv_backend *b, const int32_t *prompt, int n) {
    mock *k = MK(b);
    pthread_mutex_lock(&k->mu);
    const int32_t *toks[SRV_MAX_PARALLEL];
    int np[SRV_MAX_PARALLEL], busy[SRV_MAX_PARALLEL];
    double last[SRV_MAX_PARALLEL];
    for (int i = 0; i < k->n_ss; i++) { /* a busy session is being evaluated by its generation: not read */
        busy[i] = k->ss[i].busy;
        toks[i] = k->ss[i].toks;
        np[i] = busy[i] ? 0 : k->ss[i].n_past;
        last[i] = k->ss[i].last_used;
    }
    int i = srv_pick_session(toks, np, busy, last, k->n_ss, prompt, n);
    if (i >= 0) k->ss[i].busy = 1;
    pthread_mutex_unlock(&k->mu);
    return i >= 0 ? &k->ss[i] : NULL;
}
static void k_session_release(srv_backend *b, void *sess) {
    mock *k = MK(b);
    mock_sess *ms = sess;
    if (!ms) return;
    pthread_mutex_lock(&k->mu);
    ms->busy = 0;
    ms->last_used = srv_now();
    pthread_mutex_unlock(&k->mu);
}
static int k_n_past(srv_backend *b, void *sess) { return ((mock_sess *)sess)->n_past; }
static const int32_t *k_tokens(srv_backend *b, void *sess) { return ((mock_sess *)sess)->toks; }
static int k_truncate(srv_backend *b, void *sess, int n) {
    mock_sess *ms = sess;
    if (n < 0 || n > ms->n_past) return DF_EINVAL;
    ms->n_past = n;
    return 0;
}
/* The mock's logits after the first n_past tokens of toks. */
static void mock_logits(mock *k, const int32_t *toks, int n_past, float *logits) {
    int pos = n_past % (MOCK_L + 1);
    int target = pos < MOCK_L ? (unsigned char)MOCK_TEXT[pos] : n_past == MOCK_L ? MOCK_EOS : '\n';
    if (k->kimi) {
        int m = n_past < k->n_script ? n_past : k->n_script;
        for (; m > 0; m--) {
            int eq = 1;
            for (int i = 0; i < m && eq; i++) eq = toks[n_past - m + i] == k->script[i];
            if (eq) break;
        }
        target = m == k->n_script ? MOCK_EOS : k->script[m];
    }
    for (int v = 0; v < MOCK_VOCAB; v++) logits[v] = (float)((v * 7 + n_past) % 13) / 13.0f;
    logits[target] = 9.0f;
}

static int k_eval(srv_backend *b, void *sess, const int32_t *ids, int n, float *logits, int flags,
                  df_progress_fn progress, void *u, char *err, size_t errlen) {
    mock *k = MK(b);
    mock_sess *ms = sess;
    if (ms->n_past + n > k->n_ctx) {
        snprintf(err, errlen, "context full: %d tokens in the session + %d new exceed its %d positions", ms->n_past, n,
                 k->n_ctx);
        return DF_ECONTEXT;
    }
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= MOCK_VOCAB) {
            snprintf(err, errlen, "token id %d out of range [0, %d)", (int)ids[i], MOCK_VOCAB);
            return DF_EINVAL;
        }
    }
    for (int i = 0; i < n; i++) {
        if (k->delay_ms) {
            struct timespec ts = {k->delay_ms / 1000, (k->delay_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (progress && progress(u, "tokens", (uint64_t)i + 1, (uint64_t)n)) return DF_ECANCELLED;
    }
    memcpy(ms->toks + ms->n_past, ids, (size_t)n * sizeof *ids);
    ms->n_past += n;
    if (logits && (flags & DF_EVAL_ALL_LOGITS))
        for (int i = 0; i < n; i++) mock_logits(k, ms->toks, ms->n_past - n + i + 1, logits + (size_t)i * MOCK_VOCAB);
    else if (logits) mock_logits(k, ms->toks, ms->n_past, logits);
    return 0;
}

typedef struct { df_sampler_opts o; uint64_t rng; } k_sampler;
static void *k_sampler_new(srv_backend *b, const df_sampler_opts *o) {
    k_sampler *s = calloc(1, sizeof *s);
    s->o = *o;
    s->rng = o->seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!s->rng) s->rng = 1;
    return s;
}
static double k_rand(k_sampler *s) {
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (double)((s->rng * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
}
static int32_t k_sample(void *p, const float *l, int n) {
    k_sampler *s = p;
    int best = 0;
    for (int i = 1; i < n; i++) if (l[i] > l[best]) best = i;
    if (s->o.temperature <= 0) return best;
    int idx[MOCK_VOCAB];
    double pr[MOCK_VOCAB];
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++) { /* sort ids by logit, descending (insertion sort; n is tiny) */
        int x = idx[i], j = i;
        while (j > 0 && (l[idx[j - 1]] < l[x] || (l[idx[j - 1]] == l[x] && idx[j - 1] > x))) { idx[j] = idx[j - 1]; j--; }
        idx[j] = x;
    }
    int k = s->o.top_k > 0 && s->o.top_k < n ? s->o.top_k : n;
    double sum = 0;
    for (int i = 0; i < k; i++) sum += pr[i] = exp((l[idx[i]] - l[idx[0]]) / s->o.temperature);
    double acc = 0;
    int keep = k;
    for (int i = 0; i < k; i++) {
        acc += pr[i] / sum;
        if (acc >= s->o.top_p) { keep = i + 1; break; }
    }
    sum = 0;
    for (int i = 0; i < keep; i++) sum += pr[i];
    double r = k_rand(s) * sum;
    for (int i = 0; i < keep; i++) { r -= pr[i]; if (r <= 0) return idx[i]; }
    return idx[keep - 1];
}
static void k_sampler_free(void *s) { free(s); }
static float k_logprob(const float *l, int n, int32_t id, int top_n, int32_t *ti, float *tl) {
    double mx = l[0], sum = 0;
    for (int i = 1; i < n; i++) if (l[i] > mx) mx = l[i];
    for (int i = 0; i < n; i++) sum += exp(l[i] - mx);
    double lse = mx + log(sum);
    for (int t = 0; t < top_n; t++) { /* selection of the t-th best (ties -> lower id) */
        int best = -1;
        for (int i = 0; i < n; i++) {
            int used = 0;
            for (int u = 0; u < t; u++) used |= ti[u] == i;
            if (!used && (best < 0 || l[i] > l[best])) best = i;
        }
        ti[t] = best;
        tl[t] = (float)(l[best] - lse);
    }
    return (float)(l[id] - lse);
}
static void k_close(srv_backend *b) {
    if (!b) return;
    if (b->impl) {
        for (int i = 0; i < MK(b)->n_ss; i++) free(MK(b)->ss[i].toks);
        free(MK(b)->ss);
        pthread_mutex_destroy(&MK(b)->mu);
    }
    free(b->impl);
    free(b);
}

int srv_backend_open_mock(srv_backend **out, int delay_ms, int kimi, int n_ctx, int n_sessions, char *err, size_t errlen) {
    if (n_sessions < 1 || n_sessions > SRV_MAX_PARALLEL) {
        snprintf(err, errlen, "mock: %d sessions (1..%d)", n_sessions, SRV_MAX_PARALLEL);
        return DF_EINVAL;
    }
    srv_backend *b = calloc(1, sizeof *b);
    mock *k = calloc(1, sizeof *k);
    mock_sess *ss = calloc((size_t)n_sessions, sizeof *ss);
    if (!b || !k || !ss) { free(b); free(k); free(ss); return DF_ENOMEM; }
    k->ss = ss;
    k->n_ss = n_sessions;
    /* --ctx as srv_backend_open_model takes it: 0 = min(4096, the maximum), the engine's default; more than the
     * maximum is lowered to it, with the same note */
    if (n_ctx <= 0) n_ctx = MOCK_CTX_DEFAULT;
    if (n_ctx > MOCK_CTX) {
        fprintf(stderr, "deltafin serve: note: --ctx %d is more than the model's maximum of %d positions; using %d\n",
                n_ctx, MOCK_CTX, MOCK_CTX);
        n_ctx = MOCK_CTX;
    }
    k->n_ctx = n_ctx;
    for (int i = 0; i < n_sessions; i++)
        if (!(ss[i].toks = malloc((size_t)n_ctx * sizeof *ss[i].toks))) {
            for (int j = 0; j < i; j++) free(ss[j].toks);
            free(b); free(k); free(ss);
            return DF_ENOMEM;
        }
    pthread_mutex_init(&k->mu, NULL);
    k->delay_ms = delay_ms;
    k->kimi = kimi;
    for (int i = 0; i < MOCK_KL;) {
        int id = (unsigned char)MOCK_KIMI[i], len = 1;
        for (int q = 0; q < MOCK_N_MARKERS; q++)
            if (!strncmp(MOCK_KIMI + i, MOCK_MARKERS[q], strlen(MOCK_MARKERS[q]))) { id = MOCK_EOS + 1 + q; len = (int)strlen(MOCK_MARKERS[q]); }
        k->script[k->n_script++] = id;
        i += len;
    }
    b->impl = k;
    b->name = kimi ? "mock-kimi" : "mock";
    b->describe = kimi ? "mock-kimi: built-in test model (bytes + EOS + 5 Kimi markers, <think> + tool-call script)"
                       : "mock: built-in test model (bytes + EOS, fixed UTF-8 text)";
    b->is_kimi = kimi;
    b->n_vocab = MOCK_VOCAB;
    b->n_ctx = n_ctx;
    b->has_tokenizer = 1;
    b->exact = 1;
    b->tokenize = k_tokenize;
    b->chat_render = k_chat_render;
    b->token_bytes = k_token_bytes;
    b->detok_new = k_detok_new;
    b->detok_push = k_detok_push;
    b->detok_flush = k_detok_flush;
    b->detok_free = k_detok_free;
    b->token_id = k_token_id;
    b->stop_ids = k_stop_ids;
    b->n_sessions = n_sessions;
    b->session_acquire = k_session_acquire;
    b->session_release = k_session_release;
    b->n_past = k_n_past;
    b->tokens = k_tokens;
    b->truncate = k_truncate;
    b->eval = k_eval;
    b->sampler_new = k_sampler_new;
    b->sample = k_sample;
    b->sampler_free = k_sampler_free;
    b->logprob = k_logprob;
    b->close = k_close;
    *out = b;
    return 0;
}
