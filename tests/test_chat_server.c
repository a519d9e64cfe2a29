/* test_chat_server.c — chat-format pieces of the server:
 *  - vision input is refused: a chat request with image_url / input_image content
 *    parts answers 400 "image input is not supported: deltafin runs the text model only";
 *  - Kimi K3's XTML output (think / response / tools channels) is split into
 *    reasoning_content, content and tool_calls by srv_kimi, at every streaming split;
 *  - round trip: the parsed message rendered back through the model's own chat
 *    template (tests/tokenizer/templates/kimi-k3.jinja, kimi-k2-thinking.jinja, kimi-k2-instruct-0905.jinja)
 *    reproduces the generation prompt followed by exactly what the model wrote,
 *    so the next turn's prompt extends the cached one;
 *  - <|end_of_msg|> (K3's end of turn) is a stop id. */
#include "deltafin.h"
#include "server/srv.h"
#include "test_util.h"
#include <cjson/cJSON.h>
#include <string.h>
#include <sys/stat.h>

int srv_kimi_prompt_opens_think(const char *text, size_t n); /* srv_kimi.c */

#define CACHE "tests/.cache/chat_server"

/* ------------------------------------------------------------ vision */

static void expect_image_400(const char *body, const char *param) {
    srv_request r;
    char *ej = NULL;
    int st = srv_request_parse(&r, SRV_CHAT, body, strlen(body), &ej);
    cJSON *e = ej ? cJSON_Parse(ej) : NULL, *er = e ? cJSON_GetObjectItem(e, "error") : NULL;
    cJSON *m = er ? cJSON_GetObjectItem(er, "message") : NULL, *p = er ? cJSON_GetObjectItem(er, "param") : NULL;
    CHECK(st == 400, "image part -> 400: %d", st);
    CHECK(cJSON_IsString(m) && strstr(m->valuestring, "image input is not supported: deltafin runs the text model only"),
          "message: %s", ej ? ej : "(none)");
    CHECK(cJSON_IsString(p) && !strcmp(p->valuestring, param), "param %s: %s", param, ej ? ej : "(none)");
    cJSON_Delete(e);
    free(ej);
    if (st == 0) srv_request_free(&r);
}

static void test_vision(void) {
    expect_image_400("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"what is this?\"},"
                     "{\"type\":\"image_url\",\"image_url\":{\"url\":\"data:image/png;base64,AAAA\"}}]}]}",
                     "messages[0].content[1]");
    expect_image_400("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":"
                     "[{\"type\":\"input_image\",\"image_url\":\"https://example.com/a.png\"}]}]}",
                     "messages[1].content[0]");
    expect_image_400("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"image\":\"x\"}]}]}",
                     "messages[0].content[0]");
    /* text parts are still fine */
    srv_request r;
    char *ej = NULL;
    const char *ok = "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                     "{\"type\":\"text\",\"text\":\"b\"}]}]}";
    int st = srv_request_parse(&r, SRV_CHAT, ok, strlen(ok), &ej);
    CHECK(st == 0, "text parts accepted: %d %s", st, ej ? ej : "");
    if (st == 0) srv_request_free(&r);
    free(ej);
}

/* ------------------------------------------------------- K3 parsing */

typedef struct { char *reasoning, *content; srv_tool_call calls[8]; int n_calls; } parsed;

static void parsed_free(parsed *p) {
    free(p->reasoning);
    free(p->content);
    for (int i = 0; i < p->n_calls; i++) {
        free(p->calls[i].id);
        free(p->calls[i].name);
        free(p->calls[i].arguments);
    }
    memset(p, 0, sizeof *p);
}

/* feed s in pieces of `step` bytes (0 = split at `at` once) */
static parsed run(const char *s, int tools, int starts_in_think, size_t step, size_t at) {
    srv_kimi k;
    srv_buf r, c;
    srv_buf_init(&r);
    srv_buf_init(&c);
    srv_kimi_init(&k, 1, tools, starts_in_think);
    size_t n = strlen(s);
    if (step) for (size_t i = 0; i < n; i += step) srv_kimi_push(&k, s + i, i + step <= n ? step : n - i, &r, &c);
    else { srv_kimi_push(&k, s, at, &r, &c); srv_kimi_push(&k, s + at, n - at, &r, &c); }
    srv_kimi_flush(&k, &r, &c);
    parsed p = {strdup(r.p ? r.p : ""), strdup(c.p ? c.p : ""), {{0}}, 0};
    for (int i = 0; i < k.n_calls && i < 8; i++) {
        p.calls[i].id = strdup(k.calls[i].id);
        p.calls[i].name = strdup(k.calls[i].name);
        p.calls[i].arguments = strdup(k.calls[i].arguments);
        p.n_calls++;
    }
    srv_kimi_free(&k);
    srv_buf_free(&r);
    srv_buf_free(&c);
    return p;
}

/* what Kimi K3 writes after "<|open|>message role="assistant"<|sep|><|open|>think<|sep|>" */
static const char *K3_OUT =
    "The user wants Oslo & Rome \"now\".<|close|>think<|sep|>"
    "<|open|>response<|sep|>Checking both.<|close|>response<|sep|>"
    "<|open|>tools<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Oslo \"Norway\"<|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
    "<|open|>argument key=\"opts\" type=\"object\"<|sep|>{\"hourly\": true, \"units\": [\"C\"]}<|close|>argument<|sep|>"
    "<|close|>call<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"2\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Rome<|close|>argument<|sep|>"
    "<|close|>call<|sep|>"
    "<|close|>tools<|sep|>"
    "<|close|>message<|sep|>";

static int check_k3(parsed *p, const char *how) {
    int ok = !strcmp(p->reasoning, "The user wants Oslo & Rome \"now\".") && !strcmp(p->content, "Checking both.") &&
             p->n_calls == 2;
    ok = ok && !strcmp(p->calls[0].name, "get_weather") && !strcmp(p->calls[0].id, "functions.get_weather:0") &&
         !strcmp(p->calls[0].arguments,
                 "{\"city\": \"Oslo \\\"Norway\\\"\", \"days\": 2, \"opts\": {\"hourly\": true, \"units\": [\"C\"]}}") &&
         !strcmp(p->calls[1].id, "functions.get_weather:1") && !strcmp(p->calls[1].arguments, "{\"city\": \"Rome\"}");
    if (!ok)
        fprintf(stderr, "K3 parse (%s): reasoning '%s' content '%s' calls %d: %s %s | %s\n", how, p->reasoning,
                p->content, p->n_calls, p->n_calls ? p->calls[0].id : "", p->n_calls ? p->calls[0].arguments : "",
                p->n_calls > 1 ? p->calls[1].arguments : "");
    return ok;
}

static void test_k3_parse(void) {
    int bad = 0, runs = 0;
    size_t n = strlen(K3_OUT);
    for (size_t at = 0; at <= n; at++) { /* every single split point */
        parsed p = run(K3_OUT, 1, 1, 0, at);
        bad += !check_k3(&p, "split");
        runs++;
        parsed_free(&p);
    }
    for (size_t step = 1; step <= 9; step++) {
        parsed p = run(K3_OUT, 1, 1, step, 0);
        bad += !check_k3(&p, "pieces");
        runs++;
        parsed_free(&p);
    }
    CHECK(bad == 0, "K3 output parsed differently at %d of %d streamings", bad, runs);

    /* non-thinking prompt ("<|open|>response<|sep|>" already open): content up to the response end */
    parsed p = run("Hi there.<|close|>response<|sep|><|close|>message<|sep|>", 1, 0, 3, 0);
    CHECK(!strcmp(p.content, "Hi there.") && !*p.reasoning && !p.n_calls, "K3 no-think: '%s' '%s'", p.content, p.reasoning);
    parsed_free(&p);
    /* the model opens the think channel itself */
    p = run("<|open|>think<|sep|>hmm<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|>", 0, 0, 2, 0);
    CHECK(!strcmp(p.reasoning, "hmm") && !strcmp(p.content, "ok"), "K3 think opened by the model: '%s' '%s'",
          p.reasoning, p.content);
    parsed_free(&p);
    /* a json block (arguments that were not a JSON object of key/values) */
    p = run("r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
            "<|open|>call tool=\"f\" index=\"1\"<|sep|><|open|>json type=\"object\"<|sep|>{\"a\":[1,2]}<|close|>json<|sep|>"
            "<|close|>call<|sep|><|close|>tools<|sep|>", 1, 1, 5, 0);
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].name, "f") && !strcmp(p.calls[0].arguments, "{\"a\":[1,2]}") && !*p.content,
          "K3 json block: %d '%s' '%s'", p.n_calls, p.n_calls ? p.calls[0].arguments : "", p.content);
    parsed_free(&p);
    /* a call without arguments, a number that is not valid JSON becomes a string */
    p = run("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"now\" index=\"1\"<|sep|><|close|>call<|sep|>"
            "<|open|>call tool=\"g\" index=\"2\"<|sep|><|open|>argument key=\"x\" type=\"number\"<|sep|>1.2.3"
            "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>", 1, 1, 1, 0);
    CHECK(p.n_calls == 2 && !strcmp(p.calls[0].arguments, "{}") && !strcmp(p.calls[1].arguments, "{\"x\": \"1.2.3\"}"),
          "K3 empty / bad literal: %d '%s' '%s'", p.n_calls, p.n_calls ? p.calls[0].arguments : "",
          p.n_calls > 1 ? p.calls[1].arguments : "");
    parsed_free(&p);
    /* tools not requested: the tools channel stays text; an unterminated call is given back as content */
    p = run("<|close|>think<|sep|>x<|open|>tools<|sep|>y", 0, 1, 4, 0);
    CHECK(!strcmp(p.content, "x<|open|>tools<|sep|>y") && !p.n_calls, "K3 tools off: '%s'", p.content);
    parsed_free(&p);
    p = run("<|close|>think<|sep|>x<|open|>tools<|sep|><|open|>call tool=\"f\"", 1, 1, 4, 0);
    CHECK(!strcmp(p.content, "x<|open|>tools<|sep|><|open|>call tool=\"f\"") && !p.n_calls, "K3 cut call: '%s'", p.content);
    parsed_free(&p);
    /* K2 still works alongside */
    p = run("<think>R</think>C<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>"
            "{\"a\":1}<|tool_call_end|><|tool_calls_section_end|>", 1, 0, 3, 0);
    CHECK(!strcmp(p.reasoning, "R") && !strcmp(p.content, "C") && p.n_calls == 1 && !strcmp(p.calls[0].id, "functions.f:0"),
          "K2: '%s' '%s' %d", p.reasoning, p.content, p.n_calls);
    parsed_free(&p);

    const char *k3p = "x<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>";
    CHECK(srv_kimi_prompt_opens_think(k3p, strlen(k3p)), "K3 prompt opens think");
    CHECK(srv_kimi_prompt_opens_think("a<think>\n", 9), "K2 prompt opens think");
    const char *k3r = "x<|open|>response<|sep|>";
    CHECK(!srv_kimi_prompt_opens_think(k3r, strlen(k3r)), "K3 response prompt");
}

/* ------------------------------------------------------- round trips */

static void write_file(const char *p, const char *s) {
    FILE *f = fopen(p, "wb");
    if (f) { fputs(s, f); fclose(f); }
}

static char *slurp(const char *p) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    size_t got = fread(b, 1, (size_t)l, f);
    fclose(f);
    b[got] = 0;
    return b;
}

static df_tokenizer *template_tokenizer(const char *name, const char *extra_tokens) {
    char dir[256], p[512];
    snprintf(dir, sizeof dir, CACHE "/%s", name);
    mkdir("tests/.cache", 0755);
    mkdir(CACHE, 0755);
    mkdir(dir, 0755);
    snprintf(p, sizeof p, "tests/tokenizer/templates/%s.jinja", name);
    char *tmpl = slurp(p);
    CHECK(tmpl != NULL, "%s missing", p);
    if (!tmpl) return NULL;
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    char tj[1024];
    snprintf(tj, sizeof tj, "{\"added_tokens\":[%s],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}",
             extra_tokens ? extra_tokens : "");
    write_file(p, tj);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "bos_token", "[BOS]");
    cJSON_AddStringToObject(cfg, "eos_token", "[EOS]");
    cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    char *cs = cJSON_Print(cfg);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, cs);
    free(cs);
    cJSON_Delete(cfg);
    free(tmpl);
    df_tokenizer *t = NULL;
    char err[512];
    int rc = df_tokenizer_open(&t, dir, NULL, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", dir, err);
    return t;
}

/* the assistant message the server returns for a parse */
static cJSON *assistant_message(parsed *p) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "assistant");
    if (*p->content || !p->n_calls) cJSON_AddStringToObject(m, "content", p->content);
    else cJSON_AddNullToObject(m, "content");
    if (*p->reasoning) cJSON_AddStringToObject(m, "reasoning_content", p->reasoning);
    if (p->n_calls) {
        cJSON *tcs = cJSON_AddArrayToObject(m, "tool_calls");
        for (int i = 0; i < p->n_calls; i++) {
            cJSON *tc = cJSON_CreateObject(), *fn = cJSON_CreateObject();
            cJSON_AddStringToObject(tc, "id", p->calls[i].id);
            cJSON_AddStringToObject(tc, "type", "function");
            cJSON_AddStringToObject(fn, "name", p->calls[i].name);
            cJSON_AddStringToObject(fn, "arguments", p->calls[i].arguments);
            cJSON_AddItemToObject(tc, "function", fn);
            cJSON_AddItemToArray(tcs, tc);
        }
    }
    return m;
}

static char *render(df_tokenizer *t, cJSON *msgs, const char *tools, int flags, const char *kwargs) {
    char *m = cJSON_PrintUnformatted(msgs);
    size_t cap = strlen(m) + strlen(tools) + strlen(kwargs) + 100;
    char *obj = malloc(cap);
    snprintf(obj, cap, "{\"messages\": %s, \"tools\": %s, \"chat_template_kwargs\": %s}", m, tools, kwargs);
    char err[1024], *out = NULL;
    int rc = df_chat_render(t, obj, NULL, flags, &out, err, sizeof err);
    CHECK(rc == 0, "render: %s", err);
    free(m);
    free(obj);
    return rc ? NULL : out;
}

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"opts\":{\"type\":\"object\"}},\"required\":[\"city\"]}}}]";

/* prompt(user) + model output == render(user + parsed assistant) */
static void round_trip(const char *tmpl, const char *output, const char *turn_end, int starts_in_think, const char *kwargs) {
    df_tokenizer *t = template_tokenizer(tmpl, NULL);
    if (!t) return;
    cJSON *msgs = cJSON_CreateArray();
    cJSON *u = cJSON_CreateObject();
    cJSON_AddStringToObject(u, "role", "user");
    cJSON_AddStringToObject(u, "content", "Weather in Oslo and Rome?");
    cJSON_AddItemToArray(msgs, u);
    char *prompt = render(t, msgs, TOOLS, DF_CHAT_ADD_GENERATION_PROMPT, kwargs);
    CHECK(prompt && srv_kimi_prompt_opens_think(prompt, strlen(prompt)) == starts_in_think,
          "%s: the generation prompt %s the reasoning section", tmpl, starts_in_think ? "opens" : "does not open");
    parsed p = run(output, 1, starts_in_think, 7, 0);
    cJSON_AddItemToArray(msgs, assistant_message(&p));
    char *full = render(t, msgs, TOOLS, 0, kwargs);
    if (prompt && full) {
        size_t pl = strlen(prompt), ol = strlen(output), el = strlen(turn_end), fl = strlen(full);
        int ok = fl == pl + ol + el && !memcmp(full, prompt, pl) && !memcmp(full + pl, output, ol) &&
                 !memcmp(full + pl + ol, turn_end, el);
        CHECK(ok, "%s round trip: prompt + output + turn end != the next turn's rendering\n  prompt: %s\n  output: %s\n"
              "  render: %s", tmpl, prompt, output, full);
    }
    free(prompt);
    free(full);
    parsed_free(&p);
    cJSON_Delete(msgs);
    df_tokenizer_free(t);
}

static void test_round_trips(void) {
    /* Kimi K3: what the model writes up to its end-of-turn token */
    round_trip("kimi-k3", K3_OUT, "<|end_of_msg|>", 1, "{}");
    round_trip("kimi-k3",
               "Sunny in both.<|close|>response<|sep|><|close|>message<|sep|>", "<|end_of_msg|>", 0,
               "{\"thinking\": false}");
    /* Kimi K2-Thinking (the last assistant turn keeps its reasoning) */
    round_trip("kimi-k2-thinking",
               "<think>Two cities.</think>Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>{\"city\":\"Oslo\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1"
               "<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|><|tool_calls_section_end|>",
               "<|im_end|>", 0, "{}");
    /* Kimi K2 Instruct-0905 (models/kimi-mini's template): the calls come back as the model wrote them, with and
     * without text before them (content null) */
    round_trip("kimi-k2-instruct-0905",
               "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
               "<|tool_call_argument_begin|>{\"city\":\"Oslo\"}<|tool_call_end|><|tool_call_begin|>functions.get_weather:1"
               "<|tool_call_argument_begin|>{\"city\": \"Rome\"}<|tool_call_end|><|tool_calls_section_end|>",
               "<|im_end|>", 0, "{}");
    round_trip("kimi-k2-instruct-0905",
               "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               "{\"city\": \"Oslo\", \"days\": 2}<|tool_call_end|><|tool_calls_section_end|>",
               "<|im_end|>", 0, "{}");
}

static void test_stop_ids(void) {
    df_tokenizer *t = template_tokenizer("kimi-k3", "{\"id\":1,\"content\":\"<|end_of_msg|>\",\"special\":true},"
                                                    "{\"id\":2,\"content\":\"[EOS]\",\"special\":true}");
    if (!t) return;
    int32_t ids[16];
    int n = df_tokenizer_stop_ids(t, ids, 16), has = 0;
    for (int i = 0; i < n; i++) has |= ids[i] == 1;
    CHECK(has, "<|end_of_msg|> is a stop id (%d ids)", n);
    df_tokenizer_free(t);
}

int main(void) {
    test_vision();
    test_k3_parse();
    test_round_trips();
    test_stop_ids();
    return t_done();
}
