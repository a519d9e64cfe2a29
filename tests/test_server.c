/* test_server.c — unit tests of the server's model-independent pieces: UTF-8
 * checks, stop-sequence hold-back across tokens, Kimi reasoning / tool-call
 * parsing, request validation (OpenAI error shape), common-prefix reuse. */
#include "server/srv.h"
#include "test_util.h"
#include <string.h>

/* Feed pieces through a stop matcher; returns everything emitted, '|' between pushes. */
static char *run_stop(const char *const *stops, int ns, const char *const *pieces, int np, int *hit) {
    srv_stop m;
    srv_stop_init(&m, stops, ns);
    srv_buf out;
    srv_buf_init(&out);
    *hit = 0;
    for (int i = 0; i < np && !*hit; i++) {
        srv_buf o;
        srv_buf_init(&o);
        *hit = srv_stop_push(&m, pieces[i], strlen(pieces[i]), &o);
        srv_buf_add(&out, o.p, o.len);
        srv_buf_adds(&out, "|");
        srv_buf_free(&o);
    }
    if (!*hit) srv_stop_flush(&m, &out);
    srv_stop_free(&m);
    char *r = strdup(out.p ? out.p : "");
    srv_buf_free(&out);
    return r;
}

static void test_utf8(void) {
    CHECK(srv_utf8_valid("abc", 3), "ascii");
    CHECK(srv_utf8_valid("caf\xC3\xA9 \xF0\x9F\x99\x82", 10), "2- and 4-byte");
    CHECK(!srv_utf8_valid("\xC3", 1), "truncated 2-byte");
    CHECK(!srv_utf8_valid("\xC0\xAF", 2), "overlong");
    CHECK(!srv_utf8_valid("\xED\xA0\x80", 3), "surrogate");
    CHECK(!srv_utf8_valid("\xF4\x90\x80\x80", 4), "above U+10FFFF");
    CHECK(!srv_utf8_valid("\xFF", 1), "0xFF");
    CHECK(srv_utf8_complete_prefix("ab\xF0\x9F\x99", 5) == 2, "incomplete 4-byte tail held: %zu",
          srv_utf8_complete_prefix("ab\xF0\x9F\x99", 5));
    CHECK(srv_utf8_complete_prefix("ab\xE6\x97\xA5", 5) == 5, "complete 3-byte");
    CHECK(srv_utf8_complete_prefix("a\xFF", 2) == 2, "ill-formed byte is not held");
    srv_buf b;
    srv_buf_init(&b);
    srv_utf8_sanitize(&b, "a\xFF" "b\xC3", 4);
    CHECK(b.len == 8 && !memcmp(b.p, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8), "sanitize -> U+FFFD: %s", b.p);
    srv_buf_free(&b);
}

static void test_stop(void) {
    int hit;
    const char *s1[] = {"STOP"};
    const char *p1[] = {"Hello S", "T", "O", "P world"};
    char *r = run_stop(s1, 1, p1, 4, &hit);
    CHECK(hit == 1 && !strcmp(r, "Hello ||||"), "stop across 4 pieces: '%s'", r);
    free(r);
    const char *p2[] = {"Hello S", "T", "x", "y"};
    r = run_stop(s1, 1, p2, 4, &hit);
    CHECK(hit == 0 && !strcmp(r, "Hello ||STx|y|"), "false start released when decided: '%s'", r);
    free(r);
    const char *s3[] = {"\n\n", "END"};
    const char *p3[] = {"a\n", "b\n", "\nc"};
    r = run_stop(s3, 2, p3, 3, &hit);
    CHECK(hit == 1 && !strcmp(r, "a|\nb||"), "two stops, earliest wins: '%s'", r);
    free(r);
    const char *p4[] = {"abc"};
    r = run_stop(NULL, 0, p4, 1, &hit);
    CHECK(hit == 0 && !strcmp(r, "abc|"), "no stops: pass through: '%s'", r);
    free(r);
    /* a multi-byte stop sequence split inside a character */
    const char *s5[] = {"\xE6\x97\xA5\xE6\x9C\xAC"};
    const char *p5[] = {"x\xE6\x97\xA5", "\xE6\x9C\xAC" "y"};
    r = run_stop(s5, 1, p5, 2, &hit);
    CHECK(hit == 1 && !strcmp(r, "x||"), "UTF-8 stop: '%s'", r);
    free(r);
    char *pats[] = {"abcd", "cx"};
    CHECK(srv_partial_suffix("zzabc", 5, pats, 2) == 3, "partial suffix abc");
    CHECK(srv_partial_suffix("zzc", 3, pats, 2) == 1, "partial suffix c");
    CHECK(srv_partial_suffix("abcd", 4, pats, 2) == 0, "a whole match is not a proper prefix");
}

static void test_kimi(void) {
    srv_kimi k;
    srv_buf r, c;
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 1, 1, 0);
    const char *pieces[] = {"<thi", "nk>Let me ", "think.</th", "ink>Sure. <|tool_calls_sec",
                            "tion_begin|><|tool_call_begin|>functions.get_weather:0",
                            "<|tool_call_argument_begin|>{\"city\": \"Bei", "jing\"}<|tool_call_end|>",
                            "<|tool_call_begin|> functions.add:1 <|tool_call_argument_begin|>{\"a\":1}<|tool_call_end|>",
                            "<|tool_calls_section_end|>"};
    for (int i = 0; i < 9; i++) srv_kimi_push(&k, pieces[i], strlen(pieces[i]), &r, &c);
    srv_kimi_flush(&k, &r, &c);
    CHECK(r.p && !strcmp(r.p, "Let me think."), "reasoning: '%s'", r.p);
    CHECK(c.p && !strcmp(c.p, "Sure. "), "content: '%s'", c.p);
    CHECK(k.n_calls == 2, "2 tool calls: %d", k.n_calls);
    if (k.n_calls == 2) {
        CHECK(!strcmp(k.calls[0].id, "functions.get_weather:0"), "id: %s", k.calls[0].id);
        CHECK(!strcmp(k.calls[0].name, "get_weather"), "name: %s", k.calls[0].name);
        CHECK(!strcmp(k.calls[0].arguments, "{\"city\": \"Beijing\"}"), "args: %s", k.calls[0].arguments);
        CHECK(!strcmp(k.calls[1].name, "add") && !strcmp(k.calls[1].arguments, "{\"a\":1}"), "2nd call: %s %s",
              k.calls[1].name, k.calls[1].arguments);
    }
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);

    /* malformed K2 calls (a header that is not NAME:IDX, no argument marker) are no calls: their text is content */
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 0, 1, 0);
    {
        const char *t = "A<|tool_calls_section_begin|><|tool_call_begin|>functions.get weather:0<|tool_call_argument_begin|>{}"
                        "<|tool_call_end|><|tool_call_begin|>functions.x:1<|tool_call_end|><|tool_call_begin|>functions.ok-1:2"
                        "<|tool_call_argument_begin|>{\"a\":2}<|tool_call_end|><|tool_calls_section_end|>B";
        const size_t tl = strlen(t);
        for (size_t i = 0; i < tl; i += 7) srv_kimi_push(&k, t + i, tl - i < 7 ? tl - i : 7, &r, &c);
        srv_kimi_flush(&k, &r, &c);
        CHECK(k.n_calls == 1 && !strcmp(k.calls[0].name, "ok-1") && !strcmp(k.calls[0].arguments, "{\"a\":2}"),
              "malformed K2 calls skipped: %d calls", k.n_calls);
        CHECK(c.p && !strcmp(c.p, "A<|tool_call_begin|>functions.get weather:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
                                  "<|tool_call_begin|>functions.x:1<|tool_call_end|>B"),
              "malformed K2 calls as content: '%s'", c.p);
    }
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);
    /* a K3 call without a tool name: content */
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 0, 1, 0);
    {
        const char *t = "<|open|>tools<|sep|><|open|>call index=\"1\"<|sep|><|close|>call<|sep|><|open|>call tool=\"f\" index=\"2\"<|sep|>"
                        "<|open|>argument key=\"n\" type=\"number\"<|sep|>3<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>";
        srv_kimi_push(&k, t, strlen(t), &r, &c);
        srv_kimi_flush(&k, &r, &c);
        CHECK(k.n_calls == 1 && !strcmp(k.calls[0].name, "f") && !strcmp(k.calls[0].arguments, "{\"n\": 3}"),
              "K3 call without a tool name skipped: %d calls (%s)", k.n_calls, k.n_calls ? k.calls[0].arguments : "");
        CHECK(c.p && !strcmp(c.p, "<|open|>call index=\"1\"<|sep|><|close|>call<|sep|>"), "K3 nameless call as content: '%s'", c.p);
    }
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);

    /* no <think>: everything is content; tools off: markers are plain text */
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 1, 0, 0);
    srv_kimi_push(&k, "<t", 2, &r, &c);
    CHECK(c.len == 0, "'<t' held (could be <think>)");
    srv_kimi_push(&k, "able> ok <|tool_calls_section_begin|>", 37, &r, &c);
    srv_kimi_flush(&k, &r, &c);
    CHECK(r.len == 0 && c.p && !strcmp(c.p, "<table> ok <|tool_calls_section_begin|>"), "content only: '%s'", c.p);
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);

    /* prompt already opened <think>; output cut before </think> */
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 1, 0, 1);
    srv_kimi_push(&k, "step 1</", 8, &r, &c);
    srv_kimi_flush(&k, &r, &c);
    CHECK(r.p && !strcmp(r.p, "step 1</") && c.len == 0, "unterminated reasoning: '%s'", r.p);
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);

    /* output cut (max_tokens) inside the opening marker: srv_kimi_drop_partial_open drops text that could still be
     * the marker; what cannot (decided content, spaces only, a finished marker) stays; without it (a model that
     * stopped) the partial marker is content */
    static const struct { const char *out; int drop; const char *reason, *content; } cut[] = {
        {"<th", 1, "", ""},
        {"\n <thin", 1, "", ""},
        {"<|open|>thi", 1, "", ""},         /* K3 <|open|>think<|sep|> */
        {"<|open|>respo", 1, "", ""},       /* K3 <|open|>response<|sep|> */
        {"<th", 0, "", "<th"},              /* stopped, not cut: the model wrote "<th" */
        {"<ta", 1, "", "<ta"},              /* not a prefix of a marker: content at once */
        {"\n\n", 1, "", "\n\n"},            /* spaces only: no marker text to drop */
        {"<think>ab</th", 1, "ab</th", ""}, /* inside the reasoning: reasoning as far as it went */
        {"<think>a</think><th", 1, "a", "<th"}, /* content after the reasoning: "<th" is text there */
    };
    for (size_t q = 0; q < sizeof cut / sizeof cut[0]; q++)
        for (int split = 0; split <= 1; split++) { /* whole, and one byte a piece */
            srv_buf_init(&r);
            srv_buf_init(&c);
            srv_kimi_init(&k, 1, 1, 0);
            const size_t ol = strlen(cut[q].out);
            if (split) for (size_t i = 0; i < ol; i++) srv_kimi_push(&k, cut[q].out + i, 1, &r, &c);
            else srv_kimi_push(&k, cut[q].out, ol, &r, &c);
            if (cut[q].drop) srv_kimi_drop_partial_open(&k);
            srv_kimi_flush(&k, &r, &c);
            CHECK(!strcmp(r.p ? r.p : "", cut[q].reason) && !strcmp(c.p ? c.p : "", cut[q].content),
                  "cut '%s' (drop %d, split %d): reasoning '%s' content '%s', want '%s' '%s'", cut[q].out, cut[q].drop,
                  split, r.p ? r.p : "", c.p ? c.p : "", cut[q].reason, cut[q].content);
            srv_kimi_free(&k);
            srv_buf_free(&r);
            srv_buf_free(&c);
        }
}

static int parse(int kind, const char *body, srv_request *r, char **ej) {
    return srv_request_parse(r, kind, body, strlen(body), ej);
}

/* Expect a 400 whose error.param is `param` (NULL = none) and whose message
 * contains `msg` (NULL = any); len = body bytes (0 = strlen). */
static void expect_400_n(int kind, const char *body, size_t len, const char *param, const char *msg) {
    srv_request r;
    char *ej = NULL;
    int st = srv_request_parse(&r, kind, body, len ? len : strlen(body), &ej);
    CHECK(st == 400, "status 400 for %s: %d", body, st);
    cJSON *e = ej ? cJSON_Parse(ej) : NULL, *er = e ? cJSON_GetObjectItem(e, "error") : NULL;
    cJSON *p = er ? cJSON_GetObjectItem(er, "param") : NULL, *t = er ? cJSON_GetObjectItem(er, "type") : NULL;
    CHECK(er && cJSON_IsString(cJSON_GetObjectItem(er, "message")), "error.message for %s", body);
    CHECK(t && cJSON_IsString(t) && !strcmp(t->valuestring, "invalid_request_error"), "error.type for %s", body);
    if (param) CHECK(p && cJSON_IsString(p) && !strcmp(p->valuestring, param), "param %s for %s: %s", param, body, ej);
    else CHECK(p && cJSON_IsNull(p), "param null for %s: %s", body, ej);
    if (msg) {
        cJSON *m = er ? cJSON_GetObjectItem(er, "message") : NULL;
        CHECK(cJSON_IsString(m) && strstr(m->valuestring, msg), "message of %s has '%s': %s", body, msg, ej);
    }
    cJSON_Delete(e);
    free(ej);
    if (st == 0) srv_request_free(&r);
}

static void expect_400(int kind, const char *body, const char *param) { expect_400_n(kind, body, 0, param, NULL); }

/* Expect a 400 whose error.message is exactly `msg`. */
static void expect_400_exact(int kind, const char *body, const char *msg) {
    srv_request r;
    char *ej = NULL;
    int st = srv_request_parse(&r, kind, body, strlen(body), &ej);
    cJSON *e = ej ? cJSON_Parse(ej) : NULL, *m = e ? cJSON_GetObjectItem(cJSON_GetObjectItem(e, "error"), "message") : NULL;
    CHECK(st == 400 && cJSON_IsString(m) && !strcmp(m->valuestring, msg), "%s: 400 '%s': %d %s", body, msg, st, ej ? ej : "");
    cJSON_Delete(e);
    free(ej);
    if (st == 0) srv_request_free(&r);
}

/* Expect the body accepted (status 0); what names the case in a failure. */
static void expect_ok(int kind, const char *body, const char *what) {
    srv_request r;
    char *ej = NULL;
    const int st = srv_request_parse(&r, kind, body, strlen(body), &ej);
    CHECK(st == 0, "%s: accepted: %d %s", what, st, ej ? ej : "");
    free(ej);
    if (st == 0) srv_request_free(&r);
}

/* Numbers in messages are the text the client sent: a double prints 9007199254740993 (not one) as
 * 9.00719925474099e+15 with %.15g, a value nobody sent. */
static void test_number_text(void) {
    const char *seed_msg = ". Expected an integer of magnitude below 2^53.";
    char want[160];
    static const char *sent[] = {"9007199254740993", "-9007199254740993", "9007199254740992", "12345678901234567890", "1e20",
                                 "9.007199254740993E15"};
    for (int i = 0; i < 6; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"prompt\":\"a\",\"seed\":%s}", sent[i]);
        snprintf(want, sizeof want, "Invalid 'seed': %s%s", sent[i], seed_msg);
        expect_400_exact(SRV_COMPLETION, body, want);
    }
    /* the top-level member, past strings with quotes and braces, nested objects and whitespace */
    expect_400_exact(SRV_COMPLETION, "{\"stop\":[\"}\\\"seed\\\":1,\",\"seed\"],\"x\":{\"seed\":1,\"y\":[{}]},\"prompt\":\"a\",\n"
                     " \"seed\" :\t9007199254740993 }", "Invalid 'seed': 9007199254740993. Expected an integer of magnitude below 2^53.");
    /* a member name with an escape (cJSON reads it as "seed"): no raw text found, the integral value exactly */
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"se\\u0065d\":9007199254740993}",
                     "Invalid 'seed': 9007199254740992. Expected an integer of magnitude below 2^53.");
    /* a member sent twice (here once escaped) is refused, naming its path: parsers disagree on which value wins */
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"se\\u0065d\":1e300,\"seed\":5}",
                     "Invalid request body: the key 'seed' appears more than once in its object. Send each key once.");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"user\",\"content\":\"y\",\"role\":\"system\"}]}",
                 0, "messages[1].role", "appears more than once");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"stream\":true,\"stream_options\":{\"include_usage\":true,\"include_usage\":false}}",
                 0, "stream_options.include_usage", "appears more than once");
    expect_400_n(SRV_COMPLETION, "{\"model\":\"m\",\"prompt\":\"a\",\"model\":\"m\"}", 0, "model", "appears more than once");
    /* the same key in different objects is no duplicate */
    expect_ok(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}],\"max_tokens\":2}",
              "repeated keys in sibling objects");
    {   /* nesting: 256 levels are accepted; 257, 300, past the JSON parser's own limit (1000) and 100000 levels are
         * refused with one and the same message, naming the limit and where it is passed (a tool schema the chat
         * template could not take) */
        static const int depths[] = {256, 257, 300, 1000, 1001, 100000};
        /* x's arrays: "x" then [0] for levels 3 .. 257, the first past the limit; cut after 100 characters */
        char path[1024] = "x", want[1400];
        for (int i = 3; i <= 257; i++) strcat(path, "[0]");
        snprintf(want, sizeof want, "Invalid request body: arrays / objects nest more than 256 levels deep (at '%.100s...'); "
                 "this server accepts at most 256.", path);
        char *b = malloc(2 * 100000 + 64);
        for (size_t k = 0; b && k < sizeof depths / sizeof *depths; k++) {
            const int levels = depths[k];
            /* {"prompt":"a","x":[[...[1]...]]}: the body is level 1, x's arrays levels 2 .. levels */
            int n = snprintf(b, 64, "{\"prompt\":\"a\",\"x\":");
            for (int i = 2; i <= levels; i++) b[n++] = '[';
            b[n++] = '1';
            for (int i = 2; i <= levels; i++) b[n++] = ']';
            b[n++] = '}';
            b[n] = 0;
            if (levels == 256) expect_ok(SRV_COMPLETION, b, "256 levels");
            else expect_400_exact(SRV_COMPLETION, b, want);
        }
        /* a member name in the path; brackets inside strings are text, not nesting */
        if (b) {
            int n = snprintf(b, 64, "{\"prompt\":\"[[[{{{\",\"tools\":[{\"function\":{\"parameters\":");
            for (int i = 5; i <= 257; i++) n += sprintf(b + n, "{\"p\":");
            n += sprintf(b + n, "1");
            for (int i = 5; i <= 257; i++) b[n++] = '}';
            n += sprintf(b + n, "}}]}");
            char w2[1400], p2[1400] = "tools[0].function.parameters";
            for (int i = 6; i <= 257; i++) strcat(p2, ".p");
            snprintf(w2, sizeof w2, "Invalid request body: arrays / objects nest more than 256 levels deep (at '%.100s...'); "
                     "this server accepts at most 256.", p2);
            expect_400_exact(SRV_COMPLETION, b, w2);
            n = sprintf(b, "{\"prompt\":\"");
            for (int i = 0; i < 2000; i++) b[n++] = '[';
            n += sprintf(b + n, "\",\"max_tokens\":2}");
            expect_ok(SRV_COMPLETION, b, "2000 '[' inside a string are no nesting");
        }
        free(b);
    }
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":12345678901234567}",
                     "Invalid 'max_tokens': 12345678901234567 is too large. Expected a value between 1 and 1000000000 (generation "
                     "also stops at the end of the model's context, with finish_reason \"length\").");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"n\":9007199254740993}", "Invalid 'n': 9007199254740993. Only n = 1 is supported.");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"logprobs\":21}", "Invalid 'logprobs': 21. Expected a value between 0 and 20.");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":true,\"top_logprobs\":-1}",
                     "Invalid 'top_logprobs': -1. Expected a value between 0 and 20.");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"top_k\":-2}",
                     "Invalid 'top_k': -2. Expected -1 or 0 (off) or a positive integer up to 1000000000.");
    /* %g printed these as 2 and 1: the message named an allowed value */
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"temperature\":2.0000001}",
                     "Invalid 'temperature': 2.0000001. Expected a value between 0 and 2.");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"top_p\":1.0000001}", "Invalid 'top_p': 1.0000001. Expected a value in (0, 1].");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"presence_penalty\":1e-9}",
                     "Unsupported 'presence_penalty': 1e-9. Only 0 (off) is supported.");
}

/* NUL characters (cJSON strings end at NUL): rejected naming the field, never truncated. */
static void test_nul(void) {
    char where[256];
    const char *b1 = "{\"a\":[1,{\"b\":\"x\",\"c\":[\"ok\",\"y\\u0000z\"]}]}";
    CHECK(srv_json_find_nul(b1, strlen(b1), where, sizeof where) == 1 && !strcmp(where, "a[1].c[1]"), "path: %s", where);
    const char *b2 = "{\"a\":\"x\\\\u0000\",\"b\":\"\\\\\\u0000\"}"; /* "x\\u0000" is no NUL; "\\\u0000" is */
    CHECK(srv_json_find_nul(b2, strlen(b2), where, sizeof where) == 1 && !strcmp(where, "b"), "escaped backslash: %s", where);
    const char *b3 = "{\"a\":\"x\\\\u0000\",\"u0000\":\"\\u00000\"}";
    CHECK(srv_json_find_nul(b3, strlen(b3), where, sizeof where) == 1 && !strcmp(where, "u0000"), "key u0000: %s", where);
    const char *b4 = "{\"a\":\"\\u0001\\\"u0000\"}";
    CHECK(srv_json_find_nul(b4, strlen(b4), where, sizeof where) == 0, "escaped quote, \\u0001: none");

    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\\u0000bcdefgh long text after nul\",\"max_tokens\":2,\"echo\":true}", 0,
                 "prompt", "NUL");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":[\"a\\u0000b\"]}", 0, "prompt[0]", "NUL");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"hi\\u0000 there\"}]}",
                 0, "messages[1].content", "NUL");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                 "{\"type\":\"text\",\"text\":\"\\u0000\"}]}]}", 0, "messages[0].content[1].text", "NUL");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":\"x\\u0000y\"}", 0, "stop", "NUL");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"x\",\"\\u0000\"]}", 0, "stop[1]", "NUL");
    /* a raw NUL byte inside a string */
    static const char raw[] = "{\"prompt\":\"ab\0cd\"}";
    expect_400_n(SRV_COMPLETION, raw, sizeof raw - 1, "prompt", "NUL");
    /* an escaped backslash followed by u0000 is ordinary text: kept whole */
    srv_request r;
    char *ej = NULL;
    int st = parse(SRV_COMPLETION, "{\"prompt\":\"a\\\\u0000b\"}", &r, &ej);
    CHECK(st == 0 && r.prompt && !strcmp(r.prompt, "a\\u0000b") && r.prompt_len == 8, "escaped backslash kept: %s",
          st ? ej : r.prompt);
    if (!st) srv_request_free(&r);
    free(ej);
}

static void test_request(void) {
    srv_request r;
    char *ej = NULL;
    int st = parse(SRV_CHAT,
                   "{\"model\":\"m\",\"messages\":[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":"
                   "[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}],\"stream\":true,"
                   "\"stream_options\":{\"include_usage\":true},\"stop\":[\"x\",\"yz\"],\"max_completion_tokens\":7,"
                   "\"temperature\":0,\"seed\":42,\"logprobs\":true,\"top_logprobs\":3,\"user\":\"u\",\"n\":1}",
                   &r, &ej);
    CHECK(st == 0, "valid chat: %s", ej ? ej : "");
    if (!st) {
        CHECK(r.stream && r.include_usage && r.max_tokens == 7 && r.temperature == 0 && r.has_seed && r.seed == 42,
              "chat fields");
        CHECK(r.n_stops == 2 && !strcmp(r.stops[1], "yz"), "stops");
        CHECK(r.logprobs && r.top_logprobs == 3, "logprobs");
        CHECK(!strcmp(r.messages_json, "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"ab\"}]"),
              "content parts joined: %s", r.messages_json);
        srv_request_free(&r);
    }
    st = parse(SRV_COMPLETION, "{\"prompt\":[1,2,3],\"logprobs\":2,\"echo\":true,\"stop\":\"\\n\"}", &r, &ej);
    CHECK(st == 0 && r.n_prompt_ids == 3 && r.prompt_ids[2] == 3 && r.top_logprobs == 2 && r.echo && r.n_stops == 1,
          "token-id completion");
    if (!st) srv_request_free(&r);
    st = parse(SRV_COMPLETION, "{\"prompt\":[\"once\"],\"max_tokens\":null}", &r, &ej);
    CHECK(st == 0 && r.prompt && !strcmp(r.prompt, "once") && r.max_tokens == 0, "batch of one string");
    if (!st) srv_request_free(&r);

    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}", NULL);  /* truncated */
    expect_400(SRV_CHAT, "[1,2]", NULL);
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]} trailing", NULL);
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]} \r\n", &r, &ej);
    CHECK(st == 0, "trailing whitespace is fine");
    if (!st) srv_request_free(&r);
    expect_400(SRV_CHAT, "", NULL);
    expect_400(SRV_CHAT, "{\"messages\":[]}", "messages");
    /* as the OpenAI API: an empty parts list, a text part without text, a tool result without tool_call_id, a tool
     * name outside ^[a-zA-Z0-9_-]{1,64}$ */
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[]}]}",
                     "Invalid 'messages[0].content': empty array. Expected an array with minimum length 1.");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
                     "Missing required parameter: 'messages[0].content[0].text'.");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":1}]}]}",
                     "Invalid type for 'messages[0].content[0].text': expected a string.");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"audio\"}]}]}", "messages[0].content");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"content\":\"x\"}]}",
                     "Missing required parameter: 'messages[1].tool_call_id'.");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"tool\",\"tool_call_id\":5,\"content\":\"x\"}]}",
                     "Invalid type for 'messages[0].tool_call_id': expected a string.");
    expect_400_exact(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a b\"}}]}",
                     "Invalid 'tools[0].function.name': 'a b' does not match the pattern '^[a-zA-Z0-9_-]{1,64}$' (1 to 64 "
                     "letters, digits, '_' or '-').");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"\"}}]}",
               "tools[0].function.name");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\",\"function\":"
               "{\"name\":\"x2345678901234567890123456789012345678901234567890123456789012345\"}}]}", "tools[0].function.name");
    {
        srv_request r;
        char *ej = NULL;
        const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{\"type\":\"function\",\"function\":"
                         "{\"name\":\"Get_weather-2\"}}]}";
        CHECK(srv_request_parse(&r, SRV_CHAT, ok, strlen(ok), &ej) == 0 && r.n_tools == 1, "tool name Get_weather-2: %s", ej ? ej : "");
        srv_request_free(&r);
        free(ej);
    }
    expect_400(SRV_CHAT, "{\"messages\":\"hi\"}", "messages");
    expect_400(SRV_CHAT, "{}", "messages");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", "messages[0].role");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", "messages[0].content");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":\"hot\"}", "temperature");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"temperature\":3}", "temperature");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":1.5}", "max_tokens");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_tokens\":0}", "max_tokens");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"n\":2}", "n");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[1]}", "stop");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream\":\"yes\"}", "stream");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"top_logprobs\":2}", "top_logprobs");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"logprobs\":1}", "logprobs");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"presence_penalty\":0.5}", "presence_penalty");
    /* a lone UTF-16 surrogate escape: named (the JSON parser refuses it); a complete pair is a character */
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"\\ud83d\",\"max_tokens\":2}", 0, NULL,
                 "the escape '\\ud83d' at byte 11 is a lone UTF-16 surrogate");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\\udc00b\"}", 0, NULL, "lone UTF-16 surrogate");
    /* a pair, then an escaped backslash: text */
    expect_ok(SRV_COMPLETION, "{\"prompt\":\"\\ud83d\\ude00 \\\\ud83d\"}",
              "a surrogate pair and an escaped backslash before 'ud83d'");
    /* tool_choice without tools (as the OpenAI API), the legacy functions, suffix and best_of > 1: refused, not ignored */
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":\"auto\"}", 0, "tool_choice",
                 "only allowed when 'tools' are specified");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":[{\"name\":\"f\"}]}", 0,
                 "functions", "send the functions as 'tools'");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"function_call\":\"auto\"}", "function_call");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"suffix\":\"end\"}", 0, "suffix", "Unsupported 'suffix'");
    expect_400_exact(SRV_COMPLETION, "{\"prompt\":\"a\",\"best_of\":3}", "Invalid 'best_of': 3. Only best_of = 1 is supported.");
    expect_400(SRV_COMPLETION, "{\"prompt\":\"a\",\"best_of\":\"1\"}", "best_of");
    {   /* their neutral values pass: tool_choice with tools, null functions, an empty suffix, best_of 1 */
        static const char *okb[] = {
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"none\"}",
            "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"functions\":null,\"tool_choice\":null}",
            "{\"prompt\":\"a\",\"suffix\":\"\",\"best_of\":1}", "{\"prompt\":\"a\",\"suffix\":null,\"best_of\":null}"};
        for (int i = 0; i < 4; i++) expect_ok(i < 2 ? SRV_CHAT : SRV_COMPLETION, okb[i], okb[i]);
    }
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stream_options\":{\"include_usage\":true}}", "stream_options");
    expect_400(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"model\":7}", "model");
    expect_400(SRV_COMPLETION, "{\"prompt\":\"\"}", "prompt");
    {
        char longstop[1200 + 64];
        int k = snprintf(longstop, sizeof longstop, "{\"prompt\":\"a\",\"stop\":\"");
        memset(longstop + k, 'x', 1100);
        strcpy(longstop + k + 1100, "\"}");
        expect_400(SRV_COMPLETION, longstop, "stop");
    }
    expect_400(SRV_COMPLETION, "{\"prompt\":[]}", "prompt");
    expect_400(SRV_COMPLETION, "{\"prompt\":[1,-2]}", "prompt");
    expect_400(SRV_COMPLETION, "{\"prompt\":[\"a\",\"b\"]}", "prompt");
    expect_400(SRV_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":true}", "logprobs");
    expect_400(SRV_COMPLETION, "{\"prompt\":\"x\",\"logprobs\":21}", "logprobs");

    /* empty stop sequences are ignored in both forms (they never match) */
    st = parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":\"\"}", &r, &ej);
    CHECK(st == 0 && r.n_stops == 0, "stop \"\" ignored: %d", st);
    if (!st) srv_request_free(&r);
    st = parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"stop\":[\"\"]}", &r, &ej);
    CHECK(st == 0 && r.n_stops == 0, "stop [\"\"] ignored: %d %s", st, st ? ej : "");
    if (!st) srv_request_free(&r);
    else { free(ej); ej = NULL; }
    st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop\":[\"\",\"END\",\"\"]}", &r, &ej);
    CHECK(st == 0 && r.n_stops == 1 && !strcmp(r.stops[0], "END"), "stop [\"\",\"END\",\"\"] -> END only");
    if (!st) srv_request_free(&r);
    else { free(ej); ej = NULL; }
    /* max_tokens out of range: the message says which bound */
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":100000000000}", 0, "max_tokens", "too large");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":100000000000}", 0, "max_tokens", "between 1 and 1000000000");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":1e300}", 0, "max_tokens", "1e300 is too large");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"max_completion_tokens\":5000000000}", 0,
                 "max_completion_tokens", "too large");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":-3}", 0, "max_tokens", "-3. Expected a value >= 1");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":2.5}", 0, "max_tokens", "expected an integer");
    st = parse(SRV_COMPLETION, "{\"prompt\":\"a\",\"max_tokens\":1000000000}", &r, &ej);
    CHECK(st == 0 && r.max_tokens == 1000000000, "max_tokens 1e9 accepted (clamped to the context later)");
    if (!st) srv_request_free(&r);
    else { free(ej); ej = NULL; }
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"top_k\":1e12}", 0, "top_k", "up to 1000000000");
    expect_400_n(SRV_COMPLETION, "{\"prompt\":\"a\",\"seed\":1e20}", 0, "seed", "2^53");
}

/* "content": null (OpenAI clients, assistant tool calls) reaches the chat template as "" */
static void test_null_content(void) {
    srv_request r;
    char *ej = NULL;
    int st = parse(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
                             "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                             "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]}", &r, &ej);
    CHECK(st == 0, "null assistant content accepted: %d %s", st, ej ? ej : "");
    if (st == 0) {
        CHECK(r.messages_json && strstr(r.messages_json, "\"content\":\"\",\"tool_calls\"") && !strstr(r.messages_json, "null"),
              "null content rendered as \"\": %s", r.messages_json);
        srv_request_free(&r);
    }
    free(ej);
    /* a tool call's arguments must be a string (JSON text), as the OpenAI API requires: an object, an array, a number,
     * null or none at all is a 400 naming the parameter; so is a call without a function name */
    static const char *const bad_args[][2] = {
        {"{\"city\":\"Paris\"}", "Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, but got an "
                                 "object instead. Send the arguments as JSON text, e.g. \"{\\\"city\\\": \\\"Paris\\\"}\"."},
        {"[1]", "Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, but got an array instead."},
        {"3", "Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, but got a number instead."},
        {"null", "Invalid type for 'messages[1].tool_calls[0].function.arguments': expected a string, but got null instead."},
    };
    for (size_t k = 0; k < sizeof bad_args / sizeof bad_args[0]; k++) {
        char b[512];
        snprintf(b, sizeof b, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":null,"
                              "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":%s}}]},"
                              "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"}]}", bad_args[k][0]);
        expect_400_n(SRV_CHAT, b, 0, "messages[1].tool_calls[0].function.arguments", bad_args[k][1]);
    }
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"name\":\"f\"}}]}]}",
                 0, "messages[0].tool_calls[0].function.arguments", "Missing required parameter: 'messages[0].tool_calls[0].function.arguments'.");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\"}}]}]}",
                 0, "messages[0].tool_calls[0].function.name", "Missing required parameter: 'messages[0].tool_calls[0].function.name'.");
    expect_400_n(SRV_CHAT, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":{\"function\":{}}}]}",
                 0, "messages[0].tool_calls", "Invalid type for 'messages[0].tool_calls': expected an array.");
}

static void test_misc(void) {
    int32_t a[] = {1, 2, 3, 4}, b[] = {1, 2, 9}, c[] = {1, 2, 3, 4, 5};
    CHECK(srv_common_prefix(a, 4, b, 3) == 2, "lcp 2");
    CHECK(srv_common_prefix(a, 4, c, 5) == 4, "lcp extension");
    CHECK(srv_common_prefix(NULL, 0, c, 5) == 0, "lcp empty");
    char *e = srv_error_json("m \"q\"", "rate_limit_error", NULL, "server_busy");
    CHECK(!strcmp(e, "{\"error\":{\"message\":\"m \\\"q\\\"\",\"type\":\"rate_limit_error\",\"param\":null,\"code\":\"server_busy\"}}"),
          "error json: %s", e);
    free(e);
    CHECK(!strcmp(srv_error_type(401), "authentication_error") && !strcmp(srv_error_type(429), "rate_limit_error"), "types");
}

/* logprobs token strings (issue 11 item 4), character counts, entropy seeds (item 5) */
static void test_token_display(void) {
    struct { const char *in; size_t n; const char *want; } cases[] = {
        {"hello", 5, "hello"},
        {"\xE5\x9B\xBD", 3, "\xE5\x9B\xBD"},        /* a whole character stays text */
        {"\xE5\x9B", 2, "bytes:\\xe5\\x9b"},         /* the start of one */
        {"\xBD", 1, "bytes:\\xbd"},                  /* its end */
        {" \xE2\x80", 3, "bytes: \\xe2\\x80"},       /* printable ASCII kept, as OpenAI shows it */
        {"a\\\xFF", 3, "bytes:a\\\\\\xff"},          /* a backslash is doubled */
        {"", 0, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        srv_buf b;
        srv_buf_init(&b);
        srv_token_display(&b, cases[i].in, cases[i].n);
        CHECK(!strcmp(b.p ? b.p : "", cases[i].want), "token display %zu: '%s' want '%s'", i, b.p ? b.p : "", cases[i].want);
        srv_buf_free(&b);
    }
    CHECK(srv_utf8_chars("Caf\xC3\xA9 \xF0\x9F\x99\x82", 10) == 6, "6 characters");
    CHECK(srv_utf8_chars("\xE5\x9B", 2) == 1, "a partial character counts once");
    uint64_t a = srv_random_u64(), b = srv_random_u64(), c = srv_random_u64();
    CHECK(a != b && b != c && a != c, "srv_random_u64 differs per call");
}

int main(void) {
    test_null_content();
    test_utf8();
    test_stop();
    test_kimi();
    test_request();
    test_number_text();
    test_nul();
    test_misc();
    test_token_display();
    return t_done();
}
