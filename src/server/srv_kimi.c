/* srv_kimi.c — Kimi-family assistant output -> reasoning_content, content and
 * tool_calls. Two dialects, recognised by their markers as they stream:
 *
 * Kimi K2 / K2-Thinking / Kimi Linear (K2 chat template, Moonshot's tool-call docs):
 *   <think>REASONING</think>CONTENT
 *   <|tool_calls_section_begin|>
 *     <|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|> ...
 *   <|tool_calls_section_end|>
 *
 * Kimi K3 (XTML; tests/tokenizer/templates/kimi-k3.jinja, Moonshot's reference
 * encoder). The generation prompt ends "<|open|>message role="assistant"<|sep|>"
 * then "<|open|>think<|sep|>" (thinking) or "<|open|>response<|sep|>", so the
 * output is
 *   REASONING<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
 *   <|open|>tools<|sep|>
 *     <|open|>call tool="NAME" index="1"<|sep|>
 *       <|open|>argument key="K" type="string|number|boolean|null|object|array"<|sep|>VALUE<|close|>argument<|sep|> ...
 *       (or <|open|>json type="object"<|sep|>{json}<|close|>json<|sep|>)
 *     <|close|>call<|sep|> ...
 *   <|close|>tools<|sep|>
 *   <|close|>message<|sep|><|end_of_msg|>
 * Attribute values escape & and " as &amp; &quot;. A string argument's VALUE is
 * the raw text, any other type's VALUE is its JSON literal; the call's
 * "arguments" becomes the JSON object of them (the json block as written).
 * Calls get ids "functions.NAME:IDX" (IDX counts calls from 0), as K2's do.
 *
 * A malformed call (K2: no argument marker, or a header that is not NAME:IDX; K3: no tool name) is no call: its
 * text, markers included, is returned as content.
 *
 * Works on a stream: markers may arrive split over several pieces; any tail
 * that could still be the start of a marker is held back until decided. Output
 * cut by max_tokens inside the opening marker ("<th") is dropped, not returned as
 * content (srv_kimi_drop_partial_open). */
#define _GNU_SOURCE /* memmem, POLLRDHUP */
#include "srv.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define M_THINK "<think>"
#define M_THINK_END "</think>"
#define M_SEC "<|tool_calls_section_begin|>"
#define M_SEC_END "<|tool_calls_section_end|>"
#define M_CALL "<|tool_call_begin|>"
#define M_ARG "<|tool_call_argument_begin|>"
#define M_CALL_END "<|tool_call_end|>"

/* Kimi K3 */
#define X_OPEN "<|open|>"
#define X_CLOSE "<|close|>"
#define X_SEP "<|sep|>"
#define X_THINK X_OPEN "think" X_SEP
#define X_THINK_END X_CLOSE "think" X_SEP
#define X_RESP X_OPEN "response" X_SEP
#define X_RESP_END X_CLOSE "response" X_SEP
#define X_TOOLS X_OPEN "tools" X_SEP
#define X_TOOLS_END X_CLOSE "tools" X_SEP
#define X_CALL X_OPEN "call"
#define X_CALL_END X_CLOSE "call" X_SEP
#define X_MSG_END X_CLOSE "message" X_SEP
#define X_EOM "<|end_of_msg|>"

enum { K_START, K_THINK, K_CONTENT, K_TOOLS, K_TOOLS3 };

void srv_kimi_init(srv_kimi *k, int think, int tools, int starts_in_think) {
    memset(k, 0, sizeof *k);
    k->think = think;
    k->tools = tools;
    k->state = think ? (starts_in_think ? K_THINK : K_START) : K_CONTENT;
    srv_buf_init(&k->held);
    srv_buf_init(&k->call);
    srv_buf_init(&k->bad);
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
    srv_buf_free(&k->bad);
    memset(k, 0, sizeof *k);
}

/* Does the rendered prompt leave the model inside a reasoning section? K2
 * templates end thinking prompts with "<think>", K3's with "<|open|>think<|sep|>". */
int srv_kimi_prompt_opens_think(const char *text, size_t n) {
    while (n && (text[n - 1] == '\n' || text[n - 1] == ' ')) n--;
    size_t a = strlen(M_THINK), b = strlen(X_THINK);
    return (n >= a && !memcmp(text + n - a, M_THINK, a)) || (n >= b && !memcmp(text + n - b, X_THINK, b));
}

static char *dup_trim(const char *s, size_t n) {
    while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    char *r = malloc(n + 1);
    memcpy(r, s, n);
    r[n] = 0;
    return r;
}

static void push_call(srv_kimi *k, srv_tool_call c) {
    k->calls = realloc(k->calls, (size_t)(k->n_calls + 1) * sizeof *k->calls);
    k->calls[k->n_calls++] = c;
}

/* Whether a K2 call's header (the text before <|tool_call_argument_begin|>, spaces around it aside) is
 * "[functions.]NAME:IDX" with NAME of [A-Za-z0-9_.-] and IDX digits, as the K2 template writes it. */
static int k2_header_ok(const char *s, size_t n) {
    while (n && (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\n' || s[n - 1] == '\t' || s[n - 1] == '\r')) n--;
    if (n > 10 && !memcmp(s, "functions.", 10)) { s += 10; n -= 10; }
    size_t i = 0, name = 0, idx = 0;
    for (; i < n && s[i] != ':'; i++, name++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_' || s[i] == '.' || s[i] == '-'))
            return 0;
    if (i == n || !name) return 0;
    for (i++; i < n; i++, idx++)
        if (s[i] < '0' || s[i] > '9') return 0;
    return idx > 0;
}

/* One complete K2 call: "functions.NAME:IDX<|tool_call_argument_begin|>{json}". A malformed one (no argument
 * marker, a header not NAME:IDX) is no call: its text, markers included, goes to k->bad (returned as content), as
 * vLLM's Kimi K2 parser leaves text it cannot match. */
static void add_call(srv_kimi *k, const char *s, size_t n) {
    const char *arg = memmem(s, n, M_ARG, strlen(M_ARG));
    if (!arg || !k2_header_ok(s, (size_t)(arg - s))) {
        srv_buf_adds(&k->bad, M_CALL);
        srv_buf_add(&k->bad, s, n);
        srv_buf_adds(&k->bad, M_CALL_END);
        return;
    }
    size_t hl = arg ? (size_t)(arg - s) : n;
    srv_tool_call c;
    c.id = dup_trim(s, hl);
    c.arguments = arg ? dup_trim(arg + strlen(M_ARG), n - hl - strlen(M_ARG)) : strdup("{}");
    const char *nm = c.id;
    if (!strncmp(nm, "functions.", 10)) nm += 10;
    const char *colon = strrchr(nm, ':');
    size_t nl = colon ? (size_t)(colon - nm) : strlen(nm);
    c.name = dup_trim(nm, nl);
    push_call(k, c);
}

/* Parse complete K2 calls out of k->call; returns 1 when the section ended (the
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

/* ------------------------------------------------------------- Kimi K3 */

/* value of attribute `name` in an XTML open tag's text (between the tag name and <|sep|>), unescaped */
static char *xtml_attr(const char *s, size_t n, const char *name) {
    size_t nl = strlen(name);
    for (size_t i = 0; i + nl + 2 <= n; i++) {
        if (s[i] != ' ' || memcmp(s + i + 1, name, nl) || i + 1 + nl + 2 > n || s[i + 1 + nl] != '=' ||
            s[i + 2 + nl] != '"')
            continue;
        size_t a = i + 3 + nl, e = a;
        while (e < n && s[e] != '"') e++;
        srv_buf b;
        srv_buf_init(&b);
        for (size_t q = a; q < e; q++) {
            if (s[q] == '&' && e - q >= 6 && !memcmp(s + q, "&quot;", 6)) { srv_buf_add(&b, "\"", 1); q += 5; }
            else if (s[q] == '&' && e - q >= 5 && !memcmp(s + q, "&amp;", 5)) { srv_buf_add(&b, "&", 1); q += 4; }
            else srv_buf_add(&b, s + q, 1);
        }
        char *r = strdup(b.p ? b.p : "");
        srv_buf_free(&b);
        return r;
    }
    return NULL;
}

static void json_string(srv_buf *o, const char *s, size_t n) {
    char *t = malloc(n + 1);
    memcpy(t, s, n);
    t[n] = 0;
    cJSON *j = cJSON_CreateString(t);
    char *txt = j ? cJSON_PrintUnformatted(j) : NULL;
    srv_buf_adds(o, txt ? txt : "\"\"");
    free(txt);
    cJSON_Delete(j);
    free(t);
}

/* One complete K3 call: the text after "<|open|>call" up to "<|close|>call<|sep|>". */
static void add_call3(srv_kimi *k, const char *s, size_t n) {
    const char *sep = memmem(s, n, X_SEP, strlen(X_SEP));
    size_t hl = sep ? (size_t)(sep - s) : n;
    srv_tool_call c;
    c.name = xtml_attr(s, hl, "tool");
    if (!c.name || !c.name[0] || !sep) { /* no tool name, or no <|sep|> after the open tag: no call (as add_call) */
        free(c.name);
        srv_buf_adds(&k->bad, X_CALL);
        srv_buf_add(&k->bad, s, n);
        srv_buf_adds(&k->bad, X_CALL_END);
        return;
    }
    const char *p = sep ? sep + strlen(X_SEP) : s + n, *e = s + n;
    srv_buf args;
    srv_buf_init(&args);
    int n_args = 0;
    char *json_block = NULL;
    for (;;) {
        const char *o = memmem(p, (size_t)(e - p), X_OPEN, strlen(X_OPEN));
        if (!o) break;
        const char *tag = o + strlen(X_OPEN);
        const char *ts = memmem(tag, (size_t)(e - tag), X_SEP, strlen(X_SEP));
        if (!ts) break;
        int is_json = (size_t)(e - tag) >= 4 && !memcmp(tag, "json", 4);
        const char *close = is_json ? X_CLOSE "json" X_SEP : X_CLOSE "argument" X_SEP;
        const char *v = ts + strlen(X_SEP);
        const char *ve = memmem(v, (size_t)(e - v), close, strlen(close));
        if (!ve) ve = e;
        if (is_json) {
            free(json_block);
            json_block = dup_trim(v, (size_t)(ve - v));
        } else {
            char *key = xtml_attr(tag, (size_t)(ts - tag), "key");
            char *type = xtml_attr(tag, (size_t)(ts - tag), "type");
            srv_buf_adds(&args, n_args++ ? ", " : "{");
            json_string(&args, key ? key : "", key ? strlen(key) : 0);
            srv_buf_adds(&args, ": ");
            int literal = 0;
            if (type && strcmp(type, "string")) { /* a JSON literal, kept as written when it parses */
                char *lit = dup_trim(v, (size_t)(ve - v));
                cJSON *chk = cJSON_ParseWithOpts(lit, NULL, 1); /* the whole text, nothing after */
                if (chk) { srv_buf_adds(&args, lit); literal = 1; }
                cJSON_Delete(chk);
                free(lit);
            }
            if (!literal) json_string(&args, v, (size_t)(ve - v));
            free(key);
            free(type);
        }
        p = ve == e ? e : ve + strlen(close);
    }
    if (json_block && !n_args) c.arguments = json_block;
    else {
        free(json_block);
        srv_buf_adds(&args, n_args ? "}" : "{}");
        c.arguments = strdup(args.p);
    }
    srv_buf_free(&args);
    char id[300];
    snprintf(id, sizeof id, "functions.%.200s:%d", c.name, k->n_calls);
    c.id = strdup(id);
    push_call(k, c);
}

/* Parse complete K3 calls out of k->call; returns 1 when the tools section
 * ended (the text after it is left in k->call). */
static int parse_section3(srv_kimi *k) {
    for (;;) {
        char *p = k->call.p;
        size_t n = k->call.len;
        char *end = memmem(p, n, X_TOOLS_END, strlen(X_TOOLS_END));
        char *cb = memmem(p, n, X_CALL, strlen(X_CALL));
        if (cb && (!end || cb < end)) {
            char *ce = memmem(cb, n - (size_t)(cb - p), X_CALL_END, strlen(X_CALL_END));
            if (!ce) return 0;
            const char *body = cb + strlen(X_CALL);
            add_call3(k, body, (size_t)(ce - body));
            srv_buf_consume(&k->call, (size_t)(ce - p) + strlen(X_CALL_END));
            continue;
        }
        if (end) {
            srv_buf_consume(&k->call, (size_t)(end - p) + strlen(X_TOOLS_END));
            return 1;
        }
        return 0;
    }
}

/* K3 structural markers dropped from content */
static const char *const x_drop[] = {X_RESP, X_RESP_END, X_MSG_END, X_EOM};
#define N_DROP 4

/* earliest of the markers in p[0..n): index into pats (or -1) and position */
static int first_marker(const char *p, size_t n, char *const *pats, int np, size_t *at) {
    int best = -1;
    for (int i = 0; i < np; i++) {
        char *h = memmem(p, n, pats[i], strlen(pats[i]));
        if (h && (best < 0 || (size_t)(h - p) < *at)) { best = i; *at = (size_t)(h - p); }
    }
    return best;
}

void srv_kimi_push(srv_kimi *k, const char *s, size_t n, srv_buf *reasoning, srv_buf *content) {
    srv_buf_add(&k->held, s, n);
    for (;;) {
        char *p = k->held.p;
        size_t len = k->held.len;
        if (k->state == K_START) {
            size_t i = 0; /* leading whitespace before the opening marker is allowed */
            while (i < len && (p[i] == ' ' || p[i] == '\n')) i++;
            static const char *const opens[] = {M_THINK, X_THINK, X_RESP};
            int undecided = 0, hit = -1;
            for (int q = 0; q < 3; q++) {
                size_t ml = strlen(opens[q]), cmp = len - i < ml ? len - i : ml;
                if (memcmp(p + i, opens[q], cmp)) continue;
                if (len - i < ml) undecided = 1;
                else hit = q;
            }
            if (hit < 0 && undecided) return;
            if (hit < 0) { k->state = K_CONTENT; continue; }
            srv_buf_consume(&k->held, i + strlen(opens[hit]));
            k->state = hit == 2 ? K_CONTENT : K_THINK;
            continue;
        }
        if (k->state == K_THINK) {
            char *pats[] = {M_THINK_END, X_THINK_END};
            size_t at = 0;
            int m = first_marker(p, len, pats, 2, &at);
            if (m >= 0) {
                srv_buf_add(reasoning, p, at);
                srv_buf_consume(&k->held, at + strlen(pats[m]));
                k->state = K_CONTENT;
                continue;
            }
            size_t keep = srv_partial_suffix(p, len, pats, 2);
            srv_buf_add(reasoning, p, len - keep);
            srv_buf_consume(&k->held, len - keep);
            return;
        }
        if (k->state == K_CONTENT) {
            char *pats[2 + N_DROP];
            int np = 0;
            for (int q = 0; q < N_DROP; q++) pats[np++] = (char *)x_drop[q];
            if (k->tools) { pats[np++] = M_SEC; pats[np++] = X_TOOLS; }
            size_t at = 0;
            int m = first_marker(p, len, pats, np, &at);
            if (m >= 0) {
                srv_buf_add(content, p, at);
                srv_buf_consume(&k->held, at + strlen(pats[m]));
                if (m >= N_DROP) k->state = !strcmp(pats[m], M_SEC) ? K_TOOLS : K_TOOLS3;
                continue;
            }
            size_t keep = srv_partial_suffix(p, len, pats, np);
            srv_buf_add(content, p, len - keep);
            srv_buf_consume(&k->held, len - keep);
            return;
        }
        /* K_TOOLS / K_TOOLS3 */
        srv_buf_add(&k->call, p, len);
        srv_buf_consume(&k->held, len);
        const int ended = k->state == K_TOOLS ? parse_section(k) : parse_section3(k);
        if (k->bad.len) { /* malformed calls: text */
            srv_buf_add(content, k->bad.p, k->bad.len);
            srv_buf_consume(&k->bad, k->bad.len);
        }
        if (!ended) return;
        k->state = K_CONTENT;
        srv_buf_add(&k->held, k->call.p, k->call.len); /* text after the section */
        srv_buf_consume(&k->call, k->call.len);
    }
}

void srv_kimi_drop_partial_open(srv_kimi *k) {
    if (k->state != K_START) return; /* K_START holds only spaces / newlines + a proper prefix of an opening marker */
    size_t i = 0;
    while (i < k->held.len && (k->held.p[i] == ' ' || k->held.p[i] == '\n')) i++;
    if (i < k->held.len) srv_buf_consume(&k->held, k->held.len);
}

void srv_kimi_flush(srv_kimi *k, srv_buf *reasoning, srv_buf *content) {
    if (k->state == K_THINK) srv_buf_add(reasoning, k->held.p, k->held.len);
    else if (k->state == K_TOOLS || k->state == K_TOOLS3) {
        if (k->call.len) {
            srv_buf_adds(content, k->state == K_TOOLS ? M_SEC : X_TOOLS);
            srv_buf_add(content, k->call.p, k->call.len);
        }
    } else srv_buf_add(content, k->held.p, k->held.len);
    srv_buf_consume(&k->held, k->held.len);
    srv_buf_consume(&k->call, k->call.len);
}
