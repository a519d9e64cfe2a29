/* srv_util.c — server helpers: growable byte buffer, UTF-8 validation and
 * sanitising (RFC 3629 well-formedness: util.h's df_utf8_seq), OpenAI error bodies, jobs, clock. */
#include "srv.h"
#include "util/util.h"
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

static void oom(void) {
    fprintf(stderr, "deltafin serve: out of memory\n");
    abort();
}

void srv_buf_init(srv_buf *b) { memset(b, 0, sizeof *b); }
void srv_buf_free(srv_buf *b) { free(b->p); memset(b, 0, sizeof *b); }

static void buf_reserve(srv_buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) oom();
    b->p = p;
    b->cap = cap;
}

void srv_buf_add(srv_buf *b, const void *s, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void srv_buf_adds(srv_buf *b, const char *s) { srv_buf_add(b, s, strlen(s)); }

void srv_buf_printf(srv_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void srv_buf_consume(srv_buf *b, size_t n) {
    if (n >= b->len) { b->len = 0; if (b->p) b->p[0] = 0; return; }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
    b->p[b->len] = 0;
}

int srv_utf8_valid(const char *s, size_t n) { return df_utf8_invalid_at(s, n) == n; }

size_t srv_utf8_complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = df_utf8_seq(u + i, n - i);
        if (l < 0) return i;      /* incomplete tail */
        i += l ? (size_t)l : 1;   /* ill-formed bytes count as complete (they will be replaced) */
    }
    return n;
}

void srv_utf8_sanitize(srv_buf *b, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        int l = df_utf8_seq(u + i, n - i);
        if (l > 0) { srv_buf_add(b, s + i, (size_t)l); i += (size_t)l; }
        else { srv_buf_add(b, "\xEF\xBF\xBD", 3); i++; }
    }
}

size_t srv_utf8_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

void srv_token_display(srv_buf *b, const char *s, size_t n) {
    if (srv_utf8_valid(s, n)) { srv_buf_add(b, s, n); return; }
    srv_buf_adds(b, "bytes:");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\') srv_buf_adds(b, "\\\\");
        else if (c >= 0x20 && c < 0x7F) srv_buf_add(b, &s[i], 1);
        else srv_buf_printf(b, "\\x%02x", c);
    }
}

uint64_t srv_random_u64(void) {
    uint64_t v = 0;
    size_t got = 0;
    while (got < sizeof v) {
        ssize_t k = getrandom((char *)&v + got, sizeof v - got, 0);
        if (k <= 0) break;
        got += (size_t)k;
    }
    if (got == sizeof v) return v;
    /* no entropy source: clock + counter through splitmix64 (still differs per call) */
    static uint64_t ctr;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + __atomic_add_fetch(&ctr, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull;
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

char *srv_error_json(const char *message, const char *type, const char *param, const char *code) {
    cJSON *root = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(e, "message", message);
    cJSON_AddStringToObject(e, "type", type ? type : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param); else cJSON_AddNullToObject(e, "param");
    if (code) cJSON_AddStringToObject(e, "code", code); else cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) oom();
    return s;
}

const char *srv_error_type(int st) {
    switch (st) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "server_error";
    default: return st >= 500 ? "server_error" : "invalid_request_error";
    }
}

double srv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

srv_job *srv_job_new(void) {
    srv_job *j = calloc(1, sizeof *j);
    if (!j) oom();
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &a);
    pthread_condattr_destroy(&a);
    j->refs = 1;
    j->fd = -1;
    srv_buf_init(&j->out);
    j->last_out = srv_now();
    return j;
}

void srv_job_unref(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    srv_request_free(&j->req);
    srv_buf_free(&j->out);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void srv_job_emit(srv_job *j, const char *s, size_t n) {
    pthread_mutex_lock(&j->mu);
    srv_buf_add(&j->out, s, n);
    j->last_out = srv_now();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}
