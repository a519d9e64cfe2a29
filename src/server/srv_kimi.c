/* srv_kimi.c — Kimi-family assistant output -> reasoning_content, content and
 * tool_calls. Format (Kimi K2 chat template and Moonshot's tool-call docs):
 *   <think>REASONING</think>CONTENT
 *   <|tool_calls_section_begin|>
 *     <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|> ...
 *   <|tool_calls_section_end|>
 * Works on a stream: markers may arrive split over several pieces; any tail that
 * could still be the start of a marker is held back until decided. */
#define _GNU_SOURCE /* memmem, POLLRDHUP */
#include "srv.h"
#include <stdlib.h>
#include <string.h>

#define M_THINK "<think>"
#define M_THINK_END "</think>"
#define M_SEC "<|tool_calls_section_begin|>"
#define M_SEC_END "<|tool_calls_section_end|>"
#define M_CALL "<|tool_call_begin|>"
#define M_ARG "<|tool_call_argument_begin|>"
#define M_CALL_END "<|tool_call_end|>"

enum { K_START, K_THINK, K_CONTENT, K_TOOLS };

void srv_kimi_init(srv_kimi *k, int think, int tools, int starts_in_think) {
    memset(k, 0, sizeof *k);
    k->think = think;
    k->tools = tools;
    k->state = think ? (starts_in_think ? K_THINK : K_START) : K_CONTENT;
    srv_buf_init(&k->held);
    srv_buf_init(&k->call);
}

void srv_kimi_free(srv_kimi *k) {
    for (int i = 0; i < k->n_calls; i++) {
        free(k->calls[i].id);
        free(k->calls[i].name);
        free(k->calls[i].arguments);
    }
    free(k->calls);
    srv_buf_free(&k->held);
    srv_buf_free(&k->call);
    memset(k, 0, sizeof *k);
}

static char *dup_trim(const char *s, size_t n) {
    while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    char *r = malloc(n + 1);
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

/* One complete call: "functions.NAME:IDX<|tool_call_argument_begin|>{json}". */
static void add_call(srv_kimi *k, const char *s, size_t n) {
    const char *arg = memmem(s, n, M_ARG, strlen(M_ARG));
    size_t hl = arg ? (size_t)(arg - s) : n;
    srv_tool_call c;
    c.id = dup_trim(s, hl);
    c.arguments = arg ? dup_trim(arg + strlen(M_ARG), n - hl - strlen(M_ARG)) : strdup("{}");
    const char *nm = c.id;
    if (!strncmp(nm, "functions.", 10)) nm += 10;
    const char *colon = strrchr(nm, ':');
    size_t nl = colon ? (size_t)(colon - nm) : strlen(nm);
    c.name = dup_trim(nm, nl);
    k->calls = realloc(k->calls, (size_t)(k->n_calls + 1) * sizeof *k->calls);
    k->calls[k->n_calls++] = c;
}

/* Parse complete calls out of k->call; returns 1 when the section ended (the
 * text after the section end is left in k->call). */
static int parse_section(srv_kimi *k) {
    for (;;) {
        char *p = k->call.p;
        size_t n = k->call.len;
        char *end = memmem(p, n, M_SEC_END, strlen(M_SEC_END));
        char *cb = memmem(p, n, M_CALL, strlen(M_CALL));
        if (cb && (!end || cb < end)) {
            char *ce = memmem(cb, n - (size_t)(cb - p), M_CALL_END, strlen(M_CALL_END));
            if (!ce) return 0;
            const char *body = cb + strlen(M_CALL);
            add_call(k, body, (size_t)(ce - body));
            srv_buf_consume(&k->call, (size_t)(ce - p) + strlen(M_CALL_END));
            continue;
        }
        if (end) {
            srv_buf_consume(&k->call, (size_t)(end - p) + strlen(M_SEC_END));
            return 1;
        }
        return 0;
    }
}

void srv_kimi_push(srv_kimi *k, const char *s, size_t n, srv_buf *reasoning, srv_buf *content) {
    srv_buf_add(&k->held, s, n);
    for (;;) {
        char *p = k->held.p;
        size_t len = k->held.len;
        if (k->state == K_START) {
            size_t i = 0; /* leading whitespace before <think> is allowed */
            while (i < len && (p[i] == ' ' || p[i] == '\n')) i++;
            size_t ml = strlen(M_THINK), cmp = len - i < ml ? len - i : ml;
            if (memcmp(p + i, M_THINK, cmp)) { k->state = K_CONTENT; continue; }
            if (len - i < ml) return; /* undecided */
            srv_buf_consume(&k->held, i + ml);
            k->state = K_THINK;
            continue;
        }
        if (k->state == K_THINK) {
            char *e = memmem(p, len, M_THINK_END, strlen(M_THINK_END));
            if (e) {
                srv_buf_add(reasoning, p, (size_t)(e - p));
                srv_buf_consume(&k->held, (size_t)(e - p) + strlen(M_THINK_END));
                k->state = K_CONTENT;
                continue;
            }
            char *pats[] = {M_THINK_END};
            size_t keep = srv_partial_suffix(p, len, pats, 1);
            srv_buf_add(reasoning, p, len - keep);
            srv_buf_consume(&k->held, len - keep);
            return;
        }
        if (k->state == K_CONTENT) {
            if (!k->tools) {
                srv_buf_add(content, p, len);
                srv_buf_consume(&k->held, len);
                return;
            }
            char *e = memmem(p, len, M_SEC, strlen(M_SEC));
            if (e) {
                srv_buf_add(content, p, (size_t)(e - p));
                srv_buf_consume(&k->held, (size_t)(e - p) + strlen(M_SEC));
                k->state = K_TOOLS;
                continue;
            }
            char *pats[] = {M_SEC};
            size_t keep = srv_partial_suffix(p, len, pats, 1);
            srv_buf_add(content, p, len - keep);
            srv_buf_consume(&k->held, len - keep);
            return;
        }
        /* K_TOOLS */
        srv_buf_add(&k->call, p, len);
        srv_buf_consume(&k->held, len);
        if (!parse_section(k)) return;
        k->state = K_CONTENT;
        srv_buf_add(&k->held, k->call.p, k->call.len); /* text after the section */
        srv_buf_consume(&k->call, k->call.len);
    }
}

void srv_kimi_flush(srv_kimi *k, srv_buf *reasoning, srv_buf *content) {
    if (k->state == K_THINK) srv_buf_add(reasoning, k->held.p, k->held.len);
    else if (k->state == K_TOOLS) {
        if (k->call.len) {
            srv_buf_adds(content, M_SEC);
            srv_buf_add(content, k->call.p, k->call.len);
        }
    } else srv_buf_add(content, k->held.p, k->held.len);
    srv_buf_consume(&k->held, k->held.len);
    srv_buf_consume(&k->call, k->call.len);
}
