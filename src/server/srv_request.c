/* srv_request.c — parse and validate OpenAI request bodies for
 * /v1/chat/completions and /v1/completions. Every rejection is a 400 in the
 * OpenAI error shape naming the offending parameter. Options that would change
 * the numerics in a way we cannot honour (penalties, logit_bias, n > 1) are
 * rejected rather than silently ignored. */
#include "srv.h"
#include "util/util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(param, ...) do { char m_[512]; snprintf(m_, sizeof m_, __VA_ARGS__); \
    *err_json = srv_error_json(m_, "invalid_request_error", param, NULL); goto fail; } while (0)

/* A number with no fractional part (any magnitude: range checks come after). */
static int is_integral(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble);
}

static int is_int(const cJSON *v) {
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble == floor(v->valuedouble) &&
           fabs(v->valuedouble) < 9.007199254740992e15;
}

/* The text of top-level member `key`'s number as the client sent it, for error messages: a double prints a
 * large integer rounded (%.15g gives 9.00719925474099e+15 for 9007199254740993), so a message would name a
 * value the client never sent. The body has parsed as JSON; the raw text is used when it is a plain number
 * that reads back as the parsed value d (e.g. not when cJSON took an earlier member with an escaped name);
 * else an integral d as %.0f, anything else as %.15g. */
static size_t json_ws(const char *b, size_t n, size_t i) {
    while (i < n && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n')) i++;
    return i;
}
static size_t json_str_end(const char *b, size_t n, size_t i) { /* b[i] == '"': the index past the closing quote */
    for (i++; i < n; i++) {
        if (b[i] == '\\') i++;
        else if (b[i] == '"') return i + 1;
    }
    return n;
}
static size_t json_value_end(const char *b, size_t n, size_t i) {
    int depth = 0;
    while (i < n) {
        const char c = b[i];
        if (c == '"') {
            i = json_str_end(b, n, i);
            if (!depth) return i;
            continue;
        }
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') {
            if (!depth) return i;
            if (!--depth) return i + 1;
        } else if (!depth && (c == ',' || c == ' ' || c == '\t' || c == '\r' || c == '\n')) return i;
        i++;
    }
    return n;
}
static const char *num_text(const char *b, size_t n, const char *key, double d, char *out, size_t cap) {
    size_t i = json_ws(b, n, 0);
    const size_t kl = strlen(key);
    if (i < n && b[i] == '{') {
        for (i++;;) {
            i = json_ws(b, n, i);
            if (i >= n || b[i] != '"') break;
            const size_t ks = i + 1, ke = json_str_end(b, n, i);
            const int match = ke >= ks + 1 && ke - 1 - ks == kl && !memcmp(b + ks, key, kl);
            i = json_ws(b, n, ke);
            if (i >= n || b[i] != ':') break;
            i = json_ws(b, n, i + 1);
            const size_t ve = json_value_end(b, n, i);
            if (match) {
                const size_t vl = ve - i;
                if (vl > 0 && vl < cap && vl <= 48) {
                    memcpy(out, b + i, vl);
                    out[vl] = 0;
                    if (strspn(out, "-+0123456789.eE") == vl && strtod(out, NULL) == d) return out;
                }
                break;
            }
            i = json_ws(b, n, ve);
            if (i >= n || b[i] != ',') break;
            i++;
        }
    }
    if (isfinite(d) && d == floor(d) && fabs(d) < 1e21) snprintf(out, cap, "%.0f", d);
    else snprintf(out, cap, "%.15g", d);
    return out;
}

void srv_request_free(srv_request *r) {
    free(r->model);
    free(r->messages_json);
    free(r->tools_json);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stops; i++) free(r->stops[i]);
    memset(r, 0, sizeof *r);
}

/* content: string, null, or an array of {type:"text", text} parts -> string. */
static int normalise_content(cJSON *msg, int idx, char **err_json) {
    char param[64];
    snprintf(param, sizeof param, "messages[%d].content", idx);
    cJSON *c = cJSON_GetObjectItemCaseSensitive(msg, "content");
    if (!c || cJSON_IsNull(c) || cJSON_IsString(c)) return 0;
    if (!cJSON_IsArray(c)) FAIL(param, "Invalid type for '%s': expected a string, an array of content parts or null.", param);
    if (!cJSON_GetArraySize(c)) FAIL(param, "Invalid '%s': empty array. Expected an array with minimum length 1.", param);
    srv_buf b;
    srv_buf_init(&b);
    cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, c) {
        cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        cJSON *tx = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(part)) { srv_buf_adds(&b, part->valuestring); k++; continue; }
        /* vision input is out of scope: the model's vision tower is not run */
        if (cJSON_IsObject(part) && ((cJSON_IsString(ty) && (!strcmp(ty->valuestring, "image_url") ||
                                                           !strcmp(ty->valuestring, "input_image") ||
                                                           !strcmp(ty->valuestring, "image"))) ||
                                     cJSON_GetObjectItemCaseSensitive(part, "image_url"))) {
            srv_buf_free(&b);
            char pp[80];
            snprintf(pp, sizeof pp, "%s[%d]", param, k);
            FAIL(pp, "image input is not supported: deltafin runs the text model only ('%s' is an image part). "
                 "Send text content parts only.", pp);
        }
        if (cJSON_IsObject(part) && cJSON_IsString(ty) && !strcmp(ty->valuestring, "text") && !cJSON_IsString(tx)) {
            srv_buf_free(&b);
            char pp[96];
            snprintf(pp, sizeof pp, "%s[%d].text", param, k);
            if (!tx) FAIL(pp, "Missing required parameter: '%s'.", pp);
            FAIL(pp, "Invalid type for '%s': expected a string.", pp);
        }
        if (!cJSON_IsObject(part) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text")) {
            srv_buf_free(&b);
            FAIL(param, "Unsupported content part %d in '%s': only {\"type\":\"text\",\"text\":...} parts are supported.", k, param);
        }
        srv_buf_adds(&b, tx->valuestring);
        k++;
    }
    cJSON_ReplaceItemInObjectCaseSensitive(msg, "content", cJSON_CreateString(b.p ? b.p : ""));
    srv_buf_free(&b);
    return 0;
fail:
    return 400;
}

/* The rule for message i (m) of "messages": an object with a string role (system, developer, user, assistant, tool,
 * function) and a "content", which only an assistant message may leave out; a tool message's string tool_call_id.
 * 0, or -1 with the offending parameter ("messages[i].role") in param and OpenAI's wording of the error in msg. */
static int check_message(const cJSON *m, int i, char *param, size_t plen, char *msg, size_t mlen) {
    snprintf(param, plen, "messages[%d]", i);
    if (!cJSON_IsObject(m)) { snprintf(msg, mlen, "Invalid type for '%s': expected an object.", param); return -1; }
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    snprintf(param, plen, "messages[%d].role", i);
    if (!cJSON_IsString(role)) { snprintf(msg, mlen, "Missing or invalid '%s': expected a string.", param); return -1; }
    static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function"};
    int ok = 0;
    for (size_t k = 0; k < sizeof roles / sizeof *roles; k++) ok |= !strcmp(role->valuestring, roles[k]);
    if (!ok) {
        snprintf(msg, mlen, "Invalid value for '%s': '%s'. Supported values are: 'system', 'developer', 'user', 'assistant', 'tool'.",
                 param, role->valuestring);
        return -1;
    }
    if (!cJSON_GetObjectItemCaseSensitive(m, "content") && strcmp(role->valuestring, "assistant")) {
        snprintf(param, plen, "messages[%d].content", i);
        snprintf(msg, mlen, "Missing required parameter: '%s'.", param);
        return -1;
    }
    /* an assistant message's tool calls, as the OpenAI API takes them: a list of {"function": {"name": string,
     * "arguments": string}} objects; arguments is the call's JSON text (a JSON object sent as such is refused, as the
     * OpenAI API refuses it: a chat template would render it otherwise than the string the model wrote) */
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tcs && !cJSON_IsNull(tcs)) {
        snprintf(param, plen, "messages[%d].tool_calls", i);
        if (!cJSON_IsArray(tcs)) { snprintf(msg, mlen, "Invalid type for '%s': expected an array.", param); return -1; }
        int k = 0;
        for (const cJSON *tc = tcs->child; tc; tc = tc->next, k++) {
            snprintf(param, plen, "messages[%d].tool_calls[%d]", i, k);
            if (!cJSON_IsObject(tc)) { snprintf(msg, mlen, "Invalid type for '%s': expected an object.", param); return -1; }
            const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tc, "function");
            snprintf(param, plen, "messages[%d].tool_calls[%d].function", i, k);
            if (!fn) { snprintf(msg, mlen, "Missing required parameter: '%s'.", param); return -1; }
            if (!cJSON_IsObject(fn)) { snprintf(msg, mlen, "Invalid type for '%s': expected an object.", param); return -1; }
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(fn, "name"), *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
            snprintf(param, plen, "messages[%d].tool_calls[%d].function.name", i, k);
            if (!nm) { snprintf(msg, mlen, "Missing required parameter: '%s'.", param); return -1; }
            if (!cJSON_IsString(nm)) { snprintf(msg, mlen, "Invalid type for '%s': expected a string.", param); return -1; }
            snprintf(param, plen, "messages[%d].tool_calls[%d].function.arguments", i, k);
            if (!args) { snprintf(msg, mlen, "Missing required parameter: '%s'.", param); return -1; }
            if (!cJSON_IsString(args)) {
                snprintf(msg, mlen, "Invalid type for '%s': expected a string, but got %s instead. Send the arguments as JSON "
                         "text, e.g. \"{\\\"city\\\": \\\"Paris\\\"}\".", param,
                         cJSON_IsObject(args) ? "an object" : cJSON_IsArray(args) ? "an array" : cJSON_IsNumber(args) ? "a number"
                         : cJSON_IsBool(args) ? "a boolean" : "null");
                return -1;
            }
        }
    }
    /* a tool result names the call it answers (the OpenAI API requires it; chat templates render it) */
    if (!strcmp(role->valuestring, "tool")) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
        snprintf(param, plen, "messages[%d].tool_call_id", i);
        if (!id) { snprintf(msg, mlen, "Missing required parameter: '%s'.", param); return -1; }
        if (!cJSON_IsString(id)) { snprintf(msg, mlen, "Invalid type for '%s': expected a string.", param); return -1; }
    }
    return 0;
}

static int parse_messages(srv_request *r, cJSON *root, char **err_json) {
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) FAIL("messages", "Missing required parameter: 'messages'.");
    if (!cJSON_IsArray(msgs)) FAIL("messages", "Invalid type for 'messages': expected an array of message objects.");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) FAIL("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.");
    int i = 0;
    cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        char param[96], msg[400];
        if (check_message(m, i, param, sizeof param, msg, sizeof msg)) FAIL(param, "%s", msg);
        cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        /* OpenAI clients send "content": null on assistant messages that carry tool_calls: render it as "" (chat
         * templates that iterate over content would fail on None) */
        if (cJSON_IsNull(c)) cJSON_ReplaceItemInObjectCaseSensitive(m, "content", cJSON_CreateString(""));
        if (normalise_content(m, i, err_json)) return 400;
        i++;
    }
    r->messages_json = cJSON_PrintUnformatted(msgs);
    cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) FAIL("tools", "Invalid type for 'tools': expected an array.");
        cJSON *t;
        int k = 0;
        cJSON_ArrayForEach(t, tools) {
            cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
            cJSON *nm = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
            if (!cJSON_IsObject(t) || !cJSON_IsString(nm)) {
                char param[48];
                snprintf(param, sizeof param, "tools[%d].function.name", k);
                FAIL(param, "Missing or invalid '%s': each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}.", param);
            }
            /* the OpenAI API's rule for a function name: 1 to 64 of a-z, A-Z, 0-9, '_' and '-' */
            const char *nv = nm->valuestring;
            const size_t nl = strlen(nv);
            if (!nl || nl > 64 || strspn(nv, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != nl) {
                char param[48];
                snprintf(param, sizeof param, "tools[%d].function.name", k);
                FAIL(param, "Invalid '%s': '%.80s%s' does not match the pattern '^[a-zA-Z0-9_-]{1,64}$' (1 to 64 letters, "
                            "digits, '_' or '-').", param, nv, nl > 80 ? "..." : "");
            }
            k++;
        }
        r->n_tools = k;
        if (k) r->tools_json = cJSON_PrintUnformatted(tools);
    }
    cJSON *tc = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    if (tc && !cJSON_IsNull(tc) && (!tools || cJSON_IsNull(tools)))
        FAIL("tool_choice", "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.");
    static const char *legacy[] = {"functions", "function_call"};
    for (int i = 0; i < 2; i++) {
        cJSON *f = cJSON_GetObjectItemCaseSensitive(root, legacy[i]);
        if (f && !cJSON_IsNull(f))
            FAIL(legacy[i], "Unsupported parameter '%s' (deprecated by the OpenAI API): send the functions as 'tools' "
                            "(each {\"type\":\"function\",\"function\":{...}}) and 'function_call' as 'tool_choice'.",
                 legacy[i]);
    }
    if (tc && !cJSON_IsNull(tc)) {
        if (cJSON_IsString(tc)) {
            if (strcmp(tc->valuestring, "auto") && strcmp(tc->valuestring, "none"))
                FAIL("tool_choice", "Unsupported value for 'tool_choice': '%s'. Supported: 'auto', 'none'.", tc->valuestring);
            if (!strcmp(tc->valuestring, "none")) r->n_tools = 0;
        } else FAIL("tool_choice", "Unsupported 'tool_choice': only 'auto' and 'none' are supported (no forced calls).");
    }
    return 0;
fail:
    return 400;
}

/* What a JSON value that should have been a token id is, for an error message: "a string", "null", "1.5", ... */
static void json_kind(const cJSON *v, char *out, size_t cap) {
    if (cJSON_IsNumber(v) && isfinite(v->valuedouble)) snprintf(out, cap, "%.15g", v->valuedouble);
    else if (cJSON_IsNumber(v)) snprintf(out, cap, "a number out of range");
    else if (cJSON_IsString(v)) snprintf(out, cap, "a string");
    else if (cJSON_IsArray(v)) snprintf(out, cap, "an array");
    else if (cJSON_IsObject(v)) snprintf(out, cap, "an object");
    else if (cJSON_IsBool(v)) snprintf(out, cap, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else snprintf(out, cap, "null");
}

static int parse_prompt(srv_request *r, cJSON *root, char **err_json) {
    cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) FAIL("prompt", "Missing required parameter: 'prompt'.");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child; /* a batch of one */
    if (cJSON_IsString(p)) {
        if (!p->valuestring[0]) FAIL("prompt", "Invalid 'prompt': empty string.");
        r->prompt = strdup(p->valuestring);
        r->prompt_len = strlen(p->valuestring);
        return 0;
    }
    if (cJSON_IsArray(p)) {
        int n = cJSON_GetArraySize(p);
        if (n == 0) FAIL("prompt", "Invalid 'prompt': empty array.");
        /* a batch (strings or token-id arrays) starts with one; a token-id array with a number */
        if (cJSON_IsString(p->child) || cJSON_IsArray(p->child))
            FAIL("prompt", "Invalid 'prompt': only one prompt per request is supported (n = 1).");
        r->prompt_ids = malloc((size_t)n * sizeof(int32_t));
        if (!r->prompt_ids) FAIL("prompt", "Invalid 'prompt': out of memory for %d token ids.", n);
        int i = 0;
        cJSON *e;
        cJSON_ArrayForEach(e, p) {
            if (!is_int(e) || e->valuedouble < 0 || e->valuedouble > 2147483647.0) {
                char got[48];
                json_kind(e, got, sizeof got);
                FAIL("prompt", "Invalid 'prompt[%d]': expected a token id (a non-negative integer), got %s.", i, got);
            }
            r->prompt_ids[i++] = (int32_t)e->valuedouble;
        }
        r->n_prompt_ids = n;
        return 0;
    }
    FAIL("prompt", "Invalid type for 'prompt': expected a string, an array of token ids, or a one-element array of either.");
fail:
    return 400;
}

/* The container levels of a raw JSON body as a byte scan meets them (srv_json_find_nul, json_too_deep): the first cap
 * levels kept (an object's current member name as body offsets, an array's current index), deeper ones only counted.
 * Strings are the scan's to skip; json_levels_string takes each. */
typedef struct {
    int is_obj, index;
    size_t key, key_len;
} json_lvl;
typedef struct {
    json_lvl *st;
    int cap, depth, want_key;
} json_levels;

/* Byte c of the scan, outside strings: '{' / '[' opens a level, '}' / ']' closes one, ',' steps an array's index or
 * expects an object's next member name, ':' ends that expectation. */
static void json_levels_byte(json_levels *L, char c) {
    if (c == '{' || c == '[') {
        if (L->depth < L->cap) L->st[L->depth] = (json_lvl){c == '{', 0, 0, 0};
        L->depth++;
        L->want_key = c == '{';
    } else if (c == '}' || c == ']') {
        if (L->depth > 0) L->depth--;
        L->want_key = 0;
    } else if (c == ',') {
        if (L->depth > 0 && L->depth <= L->cap) {
            if (L->st[L->depth - 1].is_obj) L->want_key = 1;
            else L->st[L->depth - 1].index++;
        }
    } else if (c == ':') {
        L->want_key = 0;
    }
}

/* A string of the scan, its text at b[s0 .. s0 + n): the current object's member name where one is expected. */
static void json_levels_string(json_levels *L, size_t s0, size_t n) {
    if (L->want_key && L->depth > 0 && L->depth <= L->cap && L->st[L->depth - 1].is_obj) {
        L->st[L->depth - 1].key = s0;
        L->st[L->depth - 1].key_len = n;
    }
    L->want_key = 0;
}

/* The path of the kept levels ("a[1].c[1]": a member by its name as the body spells it, cut at keymax bytes) into
 * out (cut at cap); "" at the top. */
static void json_levels_path(const json_levels *L, const char *b, size_t keymax, char *out, size_t cap) {
    size_t o = 0;
    out[0] = 0;
    const int n = L->depth < L->cap ? L->depth : L->cap;
    for (int d = 0; d < n && o < cap; d++) {
        const json_lvl *l = &L->st[d];
        const int w = l->is_obj ? snprintf(out + o, cap - o, "%s%.*s", o ? "." : "",
                                           (int)(l->key_len < keymax ? l->key_len : keymax), b + l->key)
                                : snprintf(out + o, cap - o, "[%d]", l->index);
        if (w > 0) o += (size_t)w;
    }
}

/* cJSON decodes the escape \u0000 (and copies a raw NUL byte) into its NUL-
 * terminated strings, which silently cuts a prompt, a message or a stop
 * sequence short. This walks the raw body (already parsed, so it is valid
 * JSON) and finds the first string holding a NUL, tracking where it sits so
 * the error can name it ("messages[1].content", "stop[0]", "prompt").
 * Returns 1 and writes the path into param (the root itself: "request body"),
 * or 0 when no string holds a NUL. A backslash escapes the next character, so
 * "\\u0000" (an escaped backslash, then "u0000") is not a NUL. The path keeps
 * the first NUL_MAX_DEPTH levels, member names cut at 47 bytes. */
#define NUL_MAX_DEPTH 64
int srv_json_find_nul(const char *body, size_t len, char *param, size_t cap) {
    json_lvl st[NUL_MAX_DEPTH];
    json_levels L = {st, NUL_MAX_DEPTH, 0, 0};
    for (size_t i = 0; i < len; i++) {
        if (body[i] != '"') {
            json_levels_byte(&L, body[i]);
            continue;
        }
        size_t s0 = ++i;
        int nul = 0;
        for (; i < len && body[i] != '"'; i++) {
            if (body[i] == 0) nul = 1;
            if (body[i] != '\\') continue;
            if (i + 5 < len && !memcmp(body + i + 1, "u0000", 5)) nul = 1;
            i++; /* skip the escaped character */
        }
        json_levels_string(&L, s0, i - s0);
        if (nul) {
            json_levels_path(&L, body, 47, param, cap);
            if (!param[0]) snprintf(param, cap, "request body");
            return 1;
        }
    }
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Appends child c (the i-th of o) to the path in where[at..): ".name" (or "name" at the start) in an object,
 * "[i]" in an array; returns the path's new end, at most cap - 1 (a path too long for where is cut). */
static size_t json_path_push(const cJSON *o, const cJSON *c, int i, char *where, size_t cap, size_t at) {
    const int w = cJSON_IsObject(o) ? snprintf(where + at, at < cap ? cap - at : 0, "%s%s", at ? "." : "", c->string ? c->string : "")
                                    : snprintf(where + at, at < cap ? cap - at : 0, "[%d]", i);
    const size_t nat = at + (w > 0 ? (size_t)w : 0);
    return nat < cap ? nat : cap - 1;
}

/* Whether an object anywhere in the tree under o repeats a member name (JSON parsers disagree on which value wins:
 * cJSON keeps the first, Python and JavaScript the last). Yes: where = its path ("messages[0].role", "model"),
 * 1; no: 0; -1 when out of memory. Names of each object sorted (O(n log n) for a body of many keys). */
static int json_dup_key(const cJSON *o, char *where, size_t cap, size_t at) {
    if (!cJSON_IsObject(o) && !cJSON_IsArray(o)) return 0;
    if (cJSON_IsObject(o)) {
        size_t n = 0;
        for (const cJSON *c = o->child; c; c = c->next) n++;
        if (n > 1) {
            const char **nm = malloc(sizeof *nm * n);
            if (!nm) return -1;
            size_t k = 0;
            for (const cJSON *c = o->child; c; c = c->next) nm[k++] = c->string ? c->string : "";
            qsort(nm, n, sizeof *nm, cmp_name);
            for (k = 1; k < n && strcmp(nm[k - 1], nm[k]); k++) {}
            if (k < n) {
                snprintf(where + at, at < cap ? cap - at : 0, "%s%s", at ? "." : "", nm[k]);
                free(nm);
                return 1;
            }
            free(nm);
        }
    }
    int i = 0;
    for (const cJSON *c = o->child; c; c = c->next, i++) {
        if (!cJSON_IsObject(c) && !cJSON_IsArray(c)) continue;
        const int r = json_dup_key(c, where, cap, json_path_push(o, c, i, where, cap, at));
        if (r) return r;
        if (at < cap) where[at] = 0;
    }
    return 0;
}

/* The most levels of arrays / objects a request may nest (the body's top object is level 1): the chat template's
 * values (tokenizer/jinja_value.c) take 400 levels below a tool or a message, so a request within this is never
 * refused by the template. Below the JSON parser's own limit (CJSON_NESTING_LIMIT), so that the byte scan below, not
 * the parser, refuses every body nested deeper, with one message. */
#define SRV_MAX_DEPTH 256
#if SRV_MAX_DEPTH >= CJSON_NESTING_LIMIT
#error "SRV_MAX_DEPTH must be below cJSON's nesting limit"
#endif

/* A byte scan of the body, before it is parsed: 1 when its arrays / objects nest more than SRV_MAX_DEPTH levels (the
 * top value at level 1), with the path of the first array / object past the limit in where (as json_path_push writes
 * paths: "x[0][0]...", an object member by its name as the body spells it; a path too long for where is cut); else 0.
 * Strings are skipped (a bracket inside one is text); whether the rest is valid JSON is the parser's to say. */
static int json_too_deep(const char *b, size_t n, char *where, size_t cap) {
    json_lvl st[SRV_MAX_DEPTH];
    json_levels L = {st, SRV_MAX_DEPTH, 0, 0};
    where[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = b[i];
        if (c == '"') {
            const size_t e = json_str_end(b, n, i); /* past the closing quote */
            json_levels_string(&L, i + 1, e > i + 1 ? e - i - 2 : 0);
            i = e - 1;
            continue;
        }
        if ((c == '{' || c == '[') && L.depth == SRV_MAX_DEPTH) {
            json_levels_path(&L, b, 200, where, cap);
            return 1;
        }
        json_levels_byte(&L, c);
    }
    return 0;
}

/* What a body the JSON parser refused at byte off holds: the offset of the first \uXXXX escape in a string up to 16
 * bytes past off that is a lone UTF-16 surrogate (a high one not followed by a low one, or a low one alone), which
 * the parser refuses; else -1. */
static long scan_unparsed(const char *body, size_t len, size_t off) {
    int in_str = 0;
    for (size_t i = 0; i < off + 16 && i < len; i++) {
        const char c = body[i];
        if (!in_str) {
            if (c == '"') in_str = 1;
            continue;
        }
        if (c == '"') in_str = 0;
        if (c != '\\') continue;
        unsigned v = 0, w = 0;
        if (len - i >= 6 && body[i + 1] == 'u' && df_hex4(body + i + 2, &v)) v = 0; /* \uXXXX: 6 bytes */
        if (v >= 0xDC00 && v <= 0xDFFF) return (long)i;
        if (v >= 0xD800 && v <= 0xDBFF) {
            if (len - i < 12 || body[i + 6] != '\\' || body[i + 7] != 'u' || df_hex4(body + i + 8, &w)) w = 0;
            if (w < 0xDC00 || w > 0xDFFF) return (long)i;
            i += 11; /* the pair */
            continue;
        }
        i++; /* the escaped character */
    }
    return -1;
}

int srv_request_parse(srv_request *r, int kind, const char *body, size_t len, char **err_json) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->temperature = 1.0;
    r->top_p = 1.0;
    *err_json = NULL;
    const char *end = NULL;
    cJSON *root = NULL, *v;
    char nb[64]; /* a number as sent, for messages: NUM(key) */
#define NUM(key) num_text(body, len, (key), v->valuedouble, nb, sizeof nb)
    {   /* nesting past SRV_MAX_DEPTH, before the parser (which stops at its own, higher limit): one message at any depth */
        char where[256];
        if (json_too_deep(body, len, where, sizeof where)) {
            char shown[120]; /* the path's start: the request's field (a long path is cut) */
            snprintf(shown, sizeof shown, "%.100s%s", where, strlen(where) > 100 ? "..." : "");
            FAIL(NULL, "Invalid request body: arrays / objects nest more than %d levels deep (at '%s'); this server "
                       "accepts at most %d.", SRV_MAX_DEPTH, shown, SRV_MAX_DEPTH);
        }
    }
    root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    if (!root) {
        size_t off = end && end >= body ? (size_t)(end - body) : 0;
        /* a lone surrogate escape: say so rather than point at the error's byte alone */
        const long ls = scan_unparsed(body, len, off);
        if (ls >= 0)
            FAIL(NULL, "We could not parse the JSON body of your request: the escape '%.6s' at byte %ld is a lone UTF-16 "
                       "surrogate (a high surrogate \\ud800-\\udbff must be followed by a low one \\udc00-\\udfff). "
                       "Send the character itself or its complete surrogate pair.", body + ls, ls);
        FAIL(NULL, "We could not parse the JSON body of your request (error near byte %zu). "
                   "The OpenAI API expects a JSON payload.", off);
    }
    if (end) { /* only whitespace may follow the JSON value */
        const char *e = end, *lim = body + len;
        while (e < lim && (*e == ' ' || *e == '\t' || *e == '\r' || *e == '\n')) e++;
        if (e < lim) FAIL(NULL, "We could not parse the JSON body of your request: unexpected data after the JSON value at byte %zu.",
                          (size_t)(e - body));
    }
    if (!cJSON_IsObject(root)) FAIL(NULL, "The request body must be a JSON object.");
    {
        char where[256];
        if (srv_json_find_nul(body, len, where, sizeof where))
            FAIL(where, "Invalid '%s': the string contains a NUL character (\\u0000), which is not supported. "
                        "Remove it from the request.", where);
    }
    {
        char where[256] = "";
        const int d = json_dup_key(root, where, sizeof where, 0);
        if (d < 0) FAIL(NULL, "The server is out of memory checking the request body.");
        if (d) FAIL(where, "Invalid request body: the key '%s' appears more than once in its object. Send each key once.", where);
    }

    if ((v = cJSON_GetObjectItemCaseSensitive(root, "model")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) FAIL("model", "Invalid type for 'model': expected a string.");
        r->model = strdup(v->valuestring);
    }
    if (kind == SRV_CHAT) { if (parse_messages(r, root, err_json)) goto fail; }
    else if (parse_prompt(r, root, err_json)) goto fail;

#define OPT_BOOL(name, dst) if ((v = cJSON_GetObjectItemCaseSensitive(root, name)) && !cJSON_IsNull(v)) { \
        if (!cJSON_IsBool(v)) { FAIL(name, "Invalid type for '%s': expected a boolean.", name); } \
        dst = cJSON_IsTrue(v); }
    OPT_BOOL("stream", r->stream);
    OPT_BOOL("return_token_ids", r->return_token_ids);
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream_options")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) FAIL("stream_options", "Invalid type for 'stream_options': expected an object.");
        if (!r->stream) FAIL("stream_options", "The 'stream_options' parameter is only allowed when 'stream' is enabled.");
        cJSON *iu = cJSON_GetObjectItemCaseSensitive(v, "include_usage");
        if (iu && !cJSON_IsNull(iu)) {
            if (!cJSON_IsBool(iu)) FAIL("stream_options.include_usage", "Invalid type for 'stream_options.include_usage': expected a boolean.");
            r->include_usage = cJSON_IsTrue(iu);
        }
    }
    static const char *maxn[] = {"max_tokens", "max_completion_tokens"};
    for (int i = 0; i < 2; i++) {
        if (!(v = cJSON_GetObjectItemCaseSensitive(root, maxn[i])) || cJSON_IsNull(v)) continue;
        if (!is_integral(v)) FAIL(maxn[i], "Invalid type for '%s': expected an integer.", maxn[i]);
        /* 0 only for completions with echo (scoring the prompt: its logprobs, nothing generated) */
        if (v->valuedouble < (kind == SRV_COMPLETION ? 0 : 1))
            FAIL(maxn[i], "Invalid '%s': %s. Expected a value >= 1%s.", maxn[i], NUM(maxn[i]),
                 kind == SRV_COMPLETION ? " (or 0 with 'echo': true, to score the prompt)" : "");
        if (v->valuedouble > SRV_MAX_MAX_TOKENS)
            FAIL(maxn[i], "Invalid '%s': %s is too large. Expected a value between 1 and %d (generation also "
                          "stops at the end of the model's context, with finish_reason \"length\").",
                 maxn[i], NUM(maxn[i]), SRV_MAX_MAX_TOKENS);
        r->max_tokens = (int)v->valuedouble;
        r->max_tokens_set = 1;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "temperature")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v)) FAIL("temperature", "Invalid type for 'temperature': expected a number.");
        if (!(v->valuedouble >= 0 && v->valuedouble <= 2)) FAIL("temperature", "Invalid 'temperature': %s. Expected a value between 0 and 2.", NUM("temperature"));
        r->temperature = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_p")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsNumber(v)) FAIL("top_p", "Invalid type for 'top_p': expected a number.");
        if (!(v->valuedouble > 0 && v->valuedouble <= 1)) FAIL("top_p", "Invalid 'top_p': %s. Expected a value in (0, 1].", NUM("top_p"));
        r->top_p = v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "top_k")) && !cJSON_IsNull(v)) {
        if (!is_integral(v)) FAIL("top_k", "Invalid type for 'top_k': expected an integer.");
        if (v->valuedouble < -1 || v->valuedouble > SRV_MAX_MAX_TOKENS)
            FAIL("top_k", "Invalid 'top_k': %s. Expected -1 or 0 (off) or a positive integer up to %d.", NUM("top_k"),
                 SRV_MAX_MAX_TOKENS);
        r->top_k = v->valuedouble < 0 ? 0 : (int)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "seed")) && !cJSON_IsNull(v)) {
        if (!is_integral(v)) FAIL("seed", "Invalid type for 'seed': expected an integer.");
        if (!is_int(v)) FAIL("seed", "Invalid 'seed': %s. Expected an integer of magnitude below 2^53.", NUM("seed"));
        r->has_seed = 1;
        r->seed = (uint64_t)(int64_t)v->valuedouble;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "n")) && !cJSON_IsNull(v)) {
        if (!is_integral(v)) FAIL("n", "Invalid type for 'n': expected an integer.");
        if (v->valuedouble != 1) FAIL("n", "Invalid 'n': %s. Only n = 1 is supported.", NUM("n"));
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stop")) && !cJSON_IsNull(v)) {
        if (cJSON_IsString(v)) {
            if (strlen(v->valuestring) > SRV_MAX_STOP_LEN) FAIL("stop", "Invalid 'stop': longer than %d bytes.", SRV_MAX_STOP_LEN);
            if (v->valuestring[0]) r->stops[r->n_stops++] = strdup(v->valuestring);
        } else if (cJSON_IsArray(v)) {
            if (cJSON_GetArraySize(v) > SRV_MAX_STOPS) FAIL("stop", "Invalid 'stop': at most %d sequences.", SRV_MAX_STOPS);
            cJSON *s;
            cJSON_ArrayForEach(s, v) {
                if (!cJSON_IsString(s)) FAIL("stop", "Invalid type for 'stop': expected a string or an array of strings.");
                if (strlen(s->valuestring) > SRV_MAX_STOP_LEN) FAIL("stop", "Invalid 'stop': longer than %d bytes.", SRV_MAX_STOP_LEN);
                /* an empty sequence never matches: ignored, as for "stop": "" */
                if (s->valuestring[0]) r->stops[r->n_stops++] = strdup(s->valuestring);
            }
        } else FAIL("stop", "Invalid type for 'stop': expected a string or an array of strings.");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "logprobs")) && !cJSON_IsNull(v)) {
        if (kind == SRV_CHAT) {
            if (!cJSON_IsBool(v)) FAIL("logprobs", "Invalid type for 'logprobs': expected a boolean.");
            r->logprobs = cJSON_IsTrue(v);
        } else {
            if (!is_integral(v)) FAIL("logprobs", "Invalid type for 'logprobs': expected an integer.");
            if (v->valuedouble < 0 || v->valuedouble > SRV_MAX_TOP_LOGPROBS)
                FAIL("logprobs", "Invalid 'logprobs': %s. Expected a value between 0 and %d.", NUM("logprobs"), SRV_MAX_TOP_LOGPROBS);
            r->logprobs = 1;
            r->top_logprobs = (int)v->valuedouble;
        }
    }
    if (kind == SRV_CHAT && (v = cJSON_GetObjectItemCaseSensitive(root, "top_logprobs")) && !cJSON_IsNull(v)) {
        if (!is_integral(v)) FAIL("top_logprobs", "Invalid type for 'top_logprobs': expected an integer.");
        if (v->valuedouble < 0 || v->valuedouble > SRV_MAX_TOP_LOGPROBS)
            FAIL("top_logprobs", "Invalid 'top_logprobs': %s. Expected a value between 0 and %d.", NUM("top_logprobs"), SRV_MAX_TOP_LOGPROBS);
        if (!r->logprobs) FAIL("top_logprobs", "Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is used.");
        r->top_logprobs = (int)v->valuedouble;
    }
    if (kind == SRV_COMPLETION) OPT_BOOL("echo", r->echo);
    if (r->max_tokens_set && r->max_tokens == 0 && !r->echo)
        FAIL("max_tokens", "Invalid 'max_tokens': 0. Expected a value >= 1 (0 is allowed only with 'echo': true, to score the prompt).");
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "user")) && !cJSON_IsNull(v) && !cJSON_IsString(v))
        FAIL("user", "Invalid type for 'user': expected a string.");
    if (kind == SRV_COMPLETION) {
        if ((v = cJSON_GetObjectItemCaseSensitive(root, "suffix")) && !cJSON_IsNull(v)) {
            if (!cJSON_IsString(v)) FAIL("suffix", "Invalid type for 'suffix': expected a string.");
            if (v->valuestring[0]) FAIL("suffix", "Unsupported 'suffix': text after the completion (insertion) is not supported by this model.");
        }
        if ((v = cJSON_GetObjectItemCaseSensitive(root, "best_of")) && !cJSON_IsNull(v)) {
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
                FAIL("best_of", "Invalid type for 'best_of': expected an integer.");
            if (v->valuedouble != 1) FAIL("best_of", "Invalid 'best_of': %s. Only best_of = 1 is supported.", NUM("best_of"));
        }
    }
    static const char *pens[] = {"presence_penalty", "frequency_penalty", "repetition_penalty"};
    for (int i = 0; i < 3; i++) {
        if (!(v = cJSON_GetObjectItemCaseSensitive(root, pens[i])) || cJSON_IsNull(v)) continue;
        if (!cJSON_IsNumber(v)) FAIL(pens[i], "Invalid type for '%s': expected a number.", pens[i]);
        double neutral = i == 2 ? 1.0 : 0.0;
        if (v->valuedouble != neutral) FAIL(pens[i], "Unsupported '%s': %s. Only %g (off) is supported.", pens[i], NUM(pens[i]), neutral);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "logit_bias")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) FAIL("logit_bias", "Invalid type for 'logit_bias': expected an object.");
        if (v->child) FAIL("logit_bias", "Unsupported 'logit_bias': not supported by this server.");
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "response_format")) && !cJSON_IsNull(v)) {
        cJSON *t = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "type") : NULL;
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text"))
            FAIL("response_format", "Unsupported 'response_format': only {\"type\":\"text\"} is supported.");
    }
#undef NUM
    cJSON_Delete(root);
    return 0;
fail:
    cJSON_Delete(root);
    srv_request_free(r);
    r->kind = kind;
    if (!*err_json) *err_json = srv_error_json("invalid request", "invalid_request_error", NULL, NULL);
    return 400;
}

int srv_check_chat(const char *in, size_t n, const char *tools, char **messages_json, char **tools_json, char *err,
                   size_t errlen) {
    *messages_json = *tools_json = NULL;
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(in, n, &at, 0);
    if (root) { /* nothing but whitespace after the value */
        const char *e = at;
        while (e < in + n && (*e == ' ' || *e == '\t' || *e == '\r' || *e == '\n')) e++;
        if (e < in + n) { cJSON_Delete(root); root = NULL; at = e; }
    }
    if (!root) {
        snprintf(err, errlen, "the messages are not valid JSON (near byte %ld): expected a JSON list of messages, or "
                              "{\"messages\": [...]}", at && at >= in ? (long)(at - in) : 0L);
        return -1;
    }
    const int is_list = cJSON_IsArray(root), is_obj = cJSON_IsObject(root);
    const int has_tools = is_obj && cJSON_GetObjectItemCaseSensitive(root, "tools");
    const int empty_obj = is_obj && !root->child;
    cJSON_Delete(root);
    if (!is_list && !is_obj) {
        snprintf(err, errlen, "expected a JSON list of messages, or {\"messages\": [...]}");
        return -1;
    }
    if (empty_obj) { snprintf(err, errlen, "no \"messages\": expected a JSON list of messages, or {\"messages\": [...]}"); return -1; }
    if (tools && has_tools) { snprintf(err, errlen, "the input has \"tools\" and --tools gives them too: give them once"); return -1; }
    /* the request the server would get: {"messages": LIST[, "tools": TOOLS]} or the object with "tools" added */
    const size_t tl = tools ? strlen(tools) : 0;
    char *body = malloc(n + tl + 32);
    if (!body) { snprintf(err, errlen, "out of memory"); return -1; }
    size_t bl = 0;
    if (is_list) {
        bl += (size_t)sprintf(body, "{\"messages\":");
        memcpy(body + bl, in, n); bl += n;
        if (tools) { bl += (size_t)sprintf(body + bl, ",\"tools\":"); memcpy(body + bl, tools, tl); bl += tl; }
        body[bl++] = '}';
    } else {
        const char *brace = memchr(in, '{', n); /* the object's first byte: only whitespace before it */
        if (tools) {
            bl += (size_t)sprintf(body, "{\"tools\":");
            memcpy(body + bl, tools, tl); bl += tl;
            body[bl++] = ',';
            memcpy(body + bl, brace + 1, n - (size_t)(brace + 1 - in)); bl += n - (size_t)(brace + 1 - in);
        } else { memcpy(body, in, n); bl = n; }
    }
    body[bl] = 0;
    srv_request r;
    char *ej = NULL;
    int rc = srv_request_parse(&r, SRV_CHAT, body, bl, &ej);
    free(body);
    if (rc) {
        cJSON *e = ej ? cJSON_Parse(ej) : NULL;
        const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(e, "error"), "message");
        snprintf(err, errlen, "%s", cJSON_IsString(m) ? m->valuestring : "invalid messages");
        cJSON_Delete(e);
        free(ej);
        srv_request_free(&r);
        return -1;
    }
    *messages_json = r.messages_json;
    *tools_json = r.n_tools ? r.tools_json : NULL;
    if (*tools_json) r.tools_json = NULL;
    r.messages_json = NULL;
    srv_request_free(&r);
    return 0;
}
