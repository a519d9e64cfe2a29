/* test_server_gen.c — the server's generator end to end in-process, on the
 * built-in mock model (src/server/srv_mock.c, whose greedy continuation of a
 * P-token prompt is MOCK_TEXT from offset P): exact texts, SSE framing, stop
 * sequences across tokens, UTF-8-safe chunks, logprobs (text_offset in characters,
 * partial characters as bytes:\xNN, chat bytes, distinct top_logprobs keys), seeds
 * (per-request entropy without one), max_tokens 0 with echo, KV prefix reuse,
 * cancellation, prompt errors and a context smaller than the default (serve --mock --ctx). */
#include "server/srv.h"
#include "test_util.h"
#include <string.h>

static srv_backend *be;
static srv_gen_opts go;

/* Run one request body; returns the job (caller unrefs). */
static srv_job *run(int kind, const char *body) {
    srv_job *j = srv_job_new();
    char *ej = NULL;
    int st = srv_request_parse(&j->req, kind, body, strlen(body), &ej);
    CHECK(st == 0, "parse %s: %s", body, ej ? ej : "");
    free(ej);
    if (st) { j->done = 1; return j; }
    srv_gen_run(&go, j);
    CHECK(j->done && j->prepared, "job finished");
    return j;
}

/* Parse SSE output: checks framing; returns the concatenated text deltas and
 * the last finish_reason; counts events; checks every delta is valid UTF-8. */
typedef struct { char text[4096], reasoning[1024]; char finish[32]; int events, done, usage_chunk, bad_utf8, lp_tokens; cJSON *usage; } sse_t;
static void parse_sse(const char *s, sse_t *o, int chat) {
    memset(o, 0, sizeof *o);
    const char *p = s;
    while (*p) {
        const char *e = strstr(p, "\n\n");
        CHECK(e != NULL, "event terminated by a blank line");
        if (!e) break;
        if (*p == ':') { p = e + 2; continue; } /* comment (keep-alive) */
        CHECK(!strncmp(p, "data: ", 6), "event starts with 'data: ': %.20s", p);
        size_t n = (size_t)(e - p - 6);
        char *payload = strndup(p + 6, n);
        CHECK(!o->done, "nothing after [DONE]");
        if (!strcmp(payload, "[DONE]")) o->done = 1;
        else {
            cJSON *j = cJSON_Parse(payload);
            CHECK(j != NULL, "event is JSON: %s", payload);
            cJSON *ch = cJSON_GetObjectItem(j, "choices");
            if (cJSON_GetArraySize(ch) == 0) {
                o->usage_chunk++;
                o->usage = cJSON_Duplicate(cJSON_GetObjectItem(j, "usage"), 1);
            } else {
                cJSON *c = cJSON_GetArrayItem(ch, 0);
                cJSON *t = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "content") : cJSON_GetObjectItem(c, "text");
                if (cJSON_IsString(t)) {
                    if (!srv_utf8_valid(t->valuestring, strlen(t->valuestring))) o->bad_utf8++;
                    strncat(o->text, t->valuestring, sizeof o->text - strlen(o->text) - 1);
                }
                cJSON *rs = chat ? cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "reasoning_content") : NULL;
                if (cJSON_IsString(rs)) strncat(o->reasoning, rs->valuestring, sizeof o->reasoning - strlen(o->reasoning) - 1);
                cJSON *f = cJSON_GetObjectItem(c, "finish_reason");
                if (cJSON_IsString(f)) snprintf(o->finish, sizeof o->finish, "%s", f->valuestring);
                cJSON *lp = cJSON_GetObjectItem(c, "logprobs");
                if (cJSON_IsObject(lp)) o->lp_tokens += cJSON_GetArraySize(chat ? cJSON_GetObjectItem(lp, "content") : cJSON_GetObjectItem(lp, "tokens"));
            }
            cJSON_Delete(j);
        }
        free(payload);
        o->events++;
        p = e + 2;
    }
}

static cJSON *body_json(srv_job *j) {
    cJSON *r = cJSON_Parse(j->out.p ? j->out.p : "");
    CHECK(r != NULL, "response is JSON: %s", j->out.p ? j->out.p : "(empty)");
    return r;
}
static const char *choice_str(cJSON *r, const char *k) {
    cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    cJSON *v = cJSON_GetObjectItem(c, k);
    return cJSON_IsString(v) ? v->valuestring : "";
}
static int usage_int(cJSON *u, const char *k) {
    cJSON *v = cJSON_GetObjectItem(u, k);
    return cJSON_IsNumber(v) ? v->valueint : -1;
}
static int cached(cJSON *u) { return usage_int(cJSON_GetObjectItem(u, "prompt_tokens_details"), "cached_tokens"); }

/* Byte position of character (code point) index ci in s. */
static size_t byte_at_char(const char *s, size_t ci) {
    size_t b = 0, c = 0;
    for (; s[b]; b++) {
        if (((unsigned char)s[b] & 0xC0) == 0x80) continue;
        if (c++ == ci) return b;
    }
    return b;
}

/* A backend that is the mock except that every id >= 128 shows as the token "?"
 * (tokens with equal strings, as a tokenizer with duplicate texts has). */
static srv_backend dup_be;
static int dup_token_bytes(srv_backend *b, int32_t id, char **out, size_t *len) {
    if (id >= 128 && id < 256) { *out = strdup("?"); *len = 1; return 0; }
    return be->token_bytes(be, id, out, len);
}

/* Issue 11 items 4, 5, 10: logprobs offsets / partial characters / keys, seeds, max_tokens 0. */
static void test_issue11(void) {
    char body[512], pr[60];
    memset(pr, 'x', 59);
    pr[59] = 0;
    /* 4a. completions: byte tokens split "Café naïve 日本語": text_offset in characters,
     * monotone, the text at each offset starts with the token; partial characters are
     * "bytes:\xNN" tokens at the offset of the character they belong to */
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":20,\"temperature\":0,\"logprobs\":1}", pr);
    srv_job *j = run(SRV_COMPLETION, body);
    cJSON *r = body_json(j);
    const char *text = choice_str(r, "text");
    /* the last two tokens are 2 bytes of 語: the text ends with U+FFFD for them */
    CHECK(!strncmp(text, "Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xEF\xBF\xBD", 23), "text: '%s'", text);
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    cJSON *toks = cJSON_GetObjectItem(lp, "tokens"), *offs = cJSON_GetObjectItem(lp, "text_offset");
    static const char *want_tok[20] = {"C", "a", "f", "bytes:\\xc3", "bytes:\\xa9", " ", "n", "a", "bytes:\\xc3", "bytes:\\xaf",
                                      "v", "e", " ", "bytes:\\xe6", "bytes:\\x97", "bytes:\\xa5", "bytes:\\xe6", "bytes:\\x9c",
                                      "bytes:\\xac", "bytes:\\xe8"};
    static const int want_off[20] = {0, 1, 2, 3, 3, 4, 5, 6, 7, 7, 8, 9, 10, 11, 11, 11, 12, 12, 12, 13};
    CHECK(cJSON_GetArraySize(toks) == 20 && cJSON_GetArraySize(offs) == 20, "20 entries");
    int prev = -1, ok_tok = 1, ok_off = 1, ok_prefix = 1;
    for (int i = 0; i < 20 && i < cJSON_GetArraySize(toks); i++) {
        const char *t = cJSON_GetArrayItem(toks, i)->valuestring;
        int o = cJSON_GetArrayItem(offs, i)->valueint;
        if (strcmp(t, want_tok[i])) { ok_tok = 0; fprintf(stderr, "token %d: '%s' want '%s'\n", i, t, want_tok[i]); }
        if (o != want_off[i]) { ok_off = 0; fprintf(stderr, "text_offset %d: %d want %d\n", i, o, want_off[i]); }
        CHECK(o >= prev, "text_offset monotone at %d", i);
        prev = o;
        if (strncmp(t, "bytes:", 6) && strncmp(text + byte_at_char(text, (size_t)o), t, strlen(t))) ok_prefix = 0;
    }
    CHECK(ok_tok, "token strings (partial characters as bytes:\\xNN)");
    CHECK(ok_off, "text_offset values in characters");
    CHECK(ok_prefix, "text[text_offset[i]:] starts with tokens[i]");
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 4b. echo: offsets count characters of the echoed prompt ("né" is 2 characters, 3 bytes) */
    j = run(SRV_COMPLETION, "{\"prompt\":\"n\xC3\xA9\",\"echo\":true,\"max_tokens\":2,\"temperature\":0,\"logprobs\":0}");
    r = body_json(j);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    offs = cJSON_GetObjectItem(lp, "text_offset");
    toks = cJSON_GetObjectItem(lp, "tokens");
    CHECK(cJSON_GetArraySize(offs) == 5 && cJSON_GetArrayItem(offs, 0)->valueint == 0 && cJSON_GetArrayItem(offs, 1)->valueint == 1 &&
          cJSON_GetArrayItem(offs, 2)->valueint == 1 && cJSON_GetArrayItem(offs, 3)->valueint == 2 &&
          cJSON_GetArrayItem(offs, 4)->valueint == 3, "echo text_offset 0,1,1,2,3");
    CHECK(!strcmp(cJSON_GetArrayItem(toks, 1)->valuestring, "bytes:\\xc3") && !strcmp(cJSON_GetArrayItem(toks, 2)->valuestring, "bytes:\\xa9"),
          "prompt partial-character tokens");
    text = choice_str(r, "text");
    CHECK(!strncmp(text + byte_at_char(text, 2), cJSON_GetArrayItem(toks, 3)->valuestring, 1), "generated token at its offset: '%s'", text);
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 4c. chat: bytes are each token's own bytes, also inside a character; the token
     * string of a partial character is bytes:\xNN; top_logprobs are per token */
    const char *content = "012345678901234567890123456789012345678901"; /* 6 + 42 + 11 = 59 prompt tokens */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"%s\"}],\"max_tokens\":5,\"temperature\":0,"
                                "\"logprobs\":true,\"top_logprobs\":3}", content);
    j = run(SRV_CHAT, body);
    r = body_json(j);
    cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs"), "content");
    CHECK(cJSON_GetArraySize(c) == 5, "5 chat logprob entries");
    static const int want_b[5] = {'C', 'a', 'f', 0xC3, 0xA9};
    static const char *want_ct[5] = {"C", "a", "f", "bytes:\\xc3", "bytes:\\xa9"};
    for (int i = 0; i < 5 && i < cJSON_GetArraySize(c); i++) {
        cJSON *e = cJSON_GetArrayItem(c, i), *b = cJSON_GetObjectItem(e, "bytes");
        CHECK(cJSON_GetArraySize(b) == 1 && cJSON_GetArrayItem(b, 0)->valueint == want_b[i], "chat bytes[%d] = [%d]", i, want_b[i]);
        CHECK(!strcmp(cJSON_GetObjectItem(e, "token")->valuestring, want_ct[i]), "chat token %d: %s", i,
              cJSON_GetObjectItem(e, "token")->valuestring);
        CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(e, "top_logprobs")) == 3, "3 alternatives");
    }
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 4d. top_logprobs never collapse: 20 alternatives (many are bytes >= 0x80: distinct
     * bytes:\xNN keys), and with tokens whose strings coincide (dup_be: every byte >= 128
     * is "?") the duplicates are keyed token_id:ID */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":3,\"temperature\":0,\"logprobs\":20}");
    r = body_json(j);
    cJSON *tops = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs"), "top_logprobs");
    for (int i = 0; i < 3; i++) CHECK(cJSON_GetArraySize(cJSON_GetArrayItem(tops, i)) == 20, "20 distinct keys at %d: %d", i,
                                      cJSON_GetArraySize(cJSON_GetArrayItem(tops, i)));
    cJSON_Delete(r);
    srv_job_unref(j);
    dup_be = *be;
    dup_be.token_bytes = dup_token_bytes;
    go.be = &dup_be;
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":3,\"temperature\":0,\"logprobs\":20}");
    r = body_json(j);
    tops = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs"), "top_logprobs");
    cJSON *t0 = cJSON_GetArrayItem(tops, 0), *kv;
    int n_q = 0, n_id = 0, n_keys = 0;
    cJSON_ArrayForEach(kv, t0) {
        n_keys++;
        n_q += !strcmp(kv->string, "?");
        n_id += !strncmp(kv->string, "token_id:", 9) && atoi(kv->string + 9) >= 128;
    }
    CHECK(n_keys == 20 && n_q == 1 && n_id >= 1 && n_q + n_id + 0 <= 20, "duplicates keyed token_id:ID: %d keys, %d '?', %d ids",
          n_keys, n_q, n_id);
    cJSON_Delete(r);
    srv_job_unref(j);
    go.be = be;

    /* 5. no seed: each request draws its own seed (entropy), so two "regenerate"s differ */
    uint64_t seeds[2];
    char texts[2][256];
    for (int i = 0; i < 2; i++) {
        j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":60,\"temperature\":1.5}");
        r = body_json(j);
        seeds[i] = j->seed;
        snprintf(texts[i], sizeof texts[i], "%s", choice_str(r, "text"));
        cJSON_Delete(r);
        srv_job_unref(j);
    }
    CHECK(seeds[0] != seeds[1], "two requests without seed get different seeds: %llu %llu", (unsigned long long)seeds[0],
          (unsigned long long)seeds[1]);
    CHECK(strcmp(texts[0], texts[1]), "and different texts: '%s'", texts[0]);
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":2,\"temperature\":1.5,\"seed\":42}");
    CHECK(j->seed == 42, "a given seed is used: %llu", (unsigned long long)j->seed);
    srv_job_unref(j);

    /* 10. max_tokens 0 + echo (scoring): the prompt's logprobs, nothing generated */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":0,\"logprobs\":1}");
    r = body_json(j);
    CHECK(j->http_status == 200, "max_tokens 0 + echo: 200 (%d)", j->http_status);
    CHECK(!strcmp(choice_str(r, "text"), "abc") && !strcmp(choice_str(r, "finish_reason"), "length"), "text is the prompt, length");
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    cJSON *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
    CHECK(cJSON_GetArraySize(tlp) == 3 && cJSON_IsNull(cJSON_GetArrayItem(tlp, 0)) && cJSON_IsNumber(cJSON_GetArrayItem(tlp, 2)),
          "3 prompt logprobs, the first null");
    {   /* after "a" the mock predicts 'e'; 'b' has logit ((98*7+1)%13)/13 */
        double mx = 9.0, sum = 0;
        for (int v = 0; v < 262; v++) sum += exp((v == 'e' ? 9.0 : (double)(float)((v * 7 + 1) % 13) / 13.0f) - mx);
        CHECK_NEAR(cJSON_GetArrayItem(tlp, 1)->valuedouble, (double)(float)((98 * 7 + 1) % 13) / 13.0f - (mx + log(sum)), 1e-5,
                   "logprob of 'b' after 'a'");
    }
    CHECK(usage_int(cJSON_GetObjectItem(r, "usage"), "completion_tokens") == 0, "0 completion tokens");
    cJSON_Delete(r);
    srv_job_unref(j);
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":0,\"stream\":true,\"logprobs\":0}");
    sse_t s;
    parse_sse(j->out.p, &s, 0);
    CHECK(!strcmp(s.text, "abc") && s.lp_tokens == 3 && s.done == 1, "streamed max_tokens 0: '%s', %d logprobs", s.text, s.lp_tokens);
    srv_job_unref(j);
    srv_request rq;
    char *ej = NULL;
    const char *b0 = "{\"prompt\":\"abc\",\"max_tokens\":0}";
    CHECK(srv_request_parse(&rq, SRV_COMPLETION, b0, strlen(b0), &ej) == 400 && ej && strstr(ej, "echo"), "max_tokens 0 without echo: 400: %s",
          ej ? ej : "");
    free(ej);
    ej = NULL;
    b0 = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":0}";
    CHECK(srv_request_parse(&rq, SRV_CHAT, b0, strlen(b0), &ej) == 400, "chat max_tokens 0: 400");
    free(ej);
}

/* The mock's logprob of token v after n_past tokens (its logits: 9 at the target byte, ((7v + n_past) % 13) / 13 elsewhere). */
static double mock_lp(int n_past, int target, int v) {
    double sum = 0, mx = 9.0;
    for (int u = 0; u < 262; u++) sum += exp((u == target ? 9.0 : (double)(float)((u * 7 + n_past) % 13) / 13.0f) - mx);
    return (v == target ? 9.0 : (double)(float)((v * 7 + n_past) % 13) / 13.0f) - (mx + log(sum));
}

/* The completions top_logprobs of a streamed response, concatenated over its chunks. */
static cJSON *sse_tops(const char *out) {
    cJSON *all = cJSON_CreateArray();
    for (const char *p = out; (p = strstr(p, "data: {")) != NULL;) {
        const char *e = strstr(p, "\n\n");
        char *payload = strndup(p + 6, e ? (size_t)(e - p - 6) : strlen(p + 6));
        cJSON *j = cJSON_Parse(payload), *t;
        cJSON *tops = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs"),
                                          "top_logprobs");
        cJSON_ArrayForEach(t, tops) cJSON_AddItemToArray(all, cJSON_Duplicate(t, 1));
        cJSON_Delete(j);
        free(payload);
        p = e ? e : p + strlen(p);
    }
    return all;
}

/* The text and logprobs of a response, whole or streamed (concatenated over its chunks): completions' 4 arrays in
 * *lp (an object), chat's content entries in *lp (an array); reasoning_content apart (chat). */
static void collect(srv_job *j, int chat, int stream, char *text, size_t cap, char *reasoning, size_t rcap, cJSON **lp) {
    text[0] = reasoning[0] = 0;
    static const char *const keys[] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
    if (chat) *lp = cJSON_CreateArray();
    else {
        *lp = cJSON_CreateObject();
        for (int k = 0; k < 4; k++) cJSON_AddArrayToObject(*lp, keys[k]);
    }
    const char *p = j->out.p ? j->out.p : "";
    for (;;) {
        const char *e = NULL;
        char *payload;
        if (stream) {
            if (!(p = strstr(p, "data: {"))) break;
            e = strstr(p, "\n\n");
            payload = strndup(p + 6, e ? (size_t)(e - p - 6) : strlen(p + 6));
        } else payload = strdup(p);
        cJSON *r = cJSON_Parse(payload), *c = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
        cJSON *m = chat ? cJSON_GetObjectItem(c, stream ? "delta" : "message") : c;
        cJSON *t = cJSON_GetObjectItem(m, chat ? "content" : "text"), *rs = cJSON_GetObjectItem(m, "reasoning_content");
        if (cJSON_IsString(t)) strncat(text, t->valuestring, cap - strlen(text) - 1);
        if (cJSON_IsString(rs)) strncat(reasoning, rs->valuestring, rcap - strlen(reasoning) - 1);
        cJSON *l = cJSON_GetObjectItem(c, "logprobs"), *x;
        if (chat) cJSON_ArrayForEach(x, cJSON_GetObjectItem(l, "content")) cJSON_AddItemToArray(*lp, cJSON_Duplicate(x, 1));
        else
            for (int k = 0; k < 4; k++)
                cJSON_ArrayForEach(x, cJSON_GetObjectItem(l, keys[k])) cJSON_AddItemToArray(cJSON_GetObjectItem(*lp, keys[k]), cJSON_Duplicate(x, 1));
        cJSON_Delete(r);
        free(payload);
        if (!stream) break;
        p = e ? e : p + strlen(p);
    }
}

/* Completions logprobs cover exactly the returned text: with a stop sequence, no entry for the stop sequence or what
 * followed it (those tokens were generated: usage counts them), whole and streamed; tokens concatenate to the text,
 * text_offset is each token's start in it, the 4 arrays are of one length. The mock's tokens are bytes: none
 * straddles the cut (a straddling token: the chat case in main, and tests/server/client.mjs on a real model). */
static void test_logprobs_stop(void) {
    static const struct { const char *body, *text; int n; } C[] = {
        /* "lo, world! The quick brown fox" after "abc": the stop spans 6 tokens, its first one (" ") held back */
        {"{\"prompt\":\"abc\",\"max_tokens\":40,\"temperature\":0,\"logprobs\":2,\"stop\":[\" brown\",\"zzz\"]", "lo, world! The quick", 20},
        /* the stop is the first token: nothing returned, no entry */
        {"{\"prompt\":\"abc\",\"max_tokens\":40,\"temperature\":0,\"logprobs\":1,\"stop\":\"lo\"", "", 0},
        /* echo: the prompt's entries stay, the generated ones end at the stop */
        {"{\"prompt\":\"abc\",\"max_tokens\":40,\"temperature\":0,\"logprobs\":1,\"echo\":true,\"stop\":\", w\"", "abclo", 5},
        /* a stop inside a multi-byte character's tokens ("Caf\u00e9 na\u00efve" after 59 x's): the 2 byte tokens of the
         * character that begins the stop go with it */
        {"{\"prompt\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\",\"max_tokens\":40,\"temperature\":0,"
         "\"logprobs\":1,\"stop\":\"\u00efve\"", "Caf\xC3\xA9 na", 8},
    };
    for (size_t c = 0; c < sizeof C / sizeof C[0]; c++)
        for (int st = 0; st <= 1; st++) {
            char body[512], text[512], rs[8];
            snprintf(body, sizeof body, "%s%s}", C[c].body, st ? ",\"stream\":true" : "");
            srv_job *j = run(SRV_COMPLETION, body);
            cJSON *lp;
            collect(j, 0, st, text, sizeof text, rs, sizeof rs, &lp);
            cJSON *toks = cJSON_GetObjectItem(lp, "tokens"), *off = cJSON_GetObjectItem(lp, "text_offset"), *t;
            const int n = cJSON_GetArraySize(toks);
            char cat[512] = "";
            int offs_ok = 1, i = 0;
            size_t at = 0; /* characters before token i; a byte token continuing a character sits at that character */
            cJSON_ArrayForEach(t, toks) {
                const char *b = t->valuestring;
                if (!strncmp(b, "bytes:", 6)) { /* a byte of a multi-byte character, as bytes:\xNN */
                    unsigned v = 0;
                    sscanf(b + 8, "%2x", &v);
                    size_t l = strlen(cat);
                    cat[l] = (char)v;
                    cat[l + 1] = 0;
                } else strncat(cat, b, sizeof cat - strlen(cat) - 1);
                offs_ok &= cJSON_GetArrayItem(off, i)->valueint == (int)at;
                at = srv_utf8_chars(cat, srv_utf8_complete_prefix(cat, strlen(cat)));
                i++;
            }
            CHECK(!strcmp(text, C[c].text), "stop case %zu%s: text '%s'", c, st ? " streamed" : "", text);
            CHECK(n == C[c].n && cJSON_GetArraySize(cJSON_GetObjectItem(lp, "token_logprobs")) == n &&
                  cJSON_GetArraySize(cJSON_GetObjectItem(lp, "top_logprobs")) == n && cJSON_GetArraySize(off) == n,
                  "stop case %zu%s: %d entries in each array (want %d)", c, st ? " streamed" : "", n, C[c].n);
            CHECK(!strcmp(cat, text), "stop case %zu%s: the tokens make the returned text: '%s'", c, st ? " streamed" : "", cat);
            CHECK(offs_ok, "stop case %zu%s: text_offset is each token's start", c, st ? " streamed" : "");
            cJSON_Delete(lp);
            srv_job_unref(j);
        }
}

/* Completions top_logprobs hold the sampled token too (OpenAI legacy completions, vLLM): up to logprobs + 1 keys, the
 * top ones first; with logprobs 0 the sampled token alone; also for echoed prompt tokens. Chat top_logprobs stay the
 * top-N list. */
static void test_sampled_in_top(void) {
    /* echo "abc" + 2 greedy tokens "lo"; after n tokens the mock's top token is MOCK_TEXT[n] ("Hello, ...") */
    static const char target[] = "Hello";
    for (int n = 0; n <= 1; n++) {
        char body[256];
        for (int st = 0; st <= 1; st++) {
            snprintf(body, sizeof body, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":2,\"temperature\":0,\"logprobs\":%d%s}", n,
                     st ? ",\"stream\":true" : "");
            srv_job *j = run(SRV_COMPLETION, body);
            cJSON *r = st ? NULL : body_json(j);
            cJSON *tops = st ? sse_tops(j->out.p)
                             : cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs"),
                                                   "top_logprobs");
            CHECK(cJSON_GetArraySize(tops) == 5 && cJSON_IsNull(cJSON_GetArrayItem(tops, 0)), "logprobs %d%s: 5 entries, the first null",
                  n, st ? " streamed" : "");
            static const char toks[] = "abclo";
            for (int i = 1; i < 5 && i < cJSON_GetArraySize(tops); i++) {
                cJSON *t = cJSON_GetArrayItem(tops, i);
                const int tgt = target[i], tok = toks[i];
                const int want_n = tok == tgt ? 1 : n + 1; /* greedy tokens are the top one; "b", "c" are not */
                char key[2] = {(char)tok, 0}, tkey[2] = {(char)tgt, 0};
                cJSON *v = cJSON_GetObjectItem(t, key), *tv = cJSON_GetObjectItem(t, tkey);
                CHECK(cJSON_GetArraySize(t) == want_n, "logprobs %d%s, token %d '%c': %d keys (want %d)", n, st ? " streamed" : "", i, tok,
                      cJSON_GetArraySize(t), want_n);
                CHECK(cJSON_IsNumber(v) && fabs(v->valuedouble - mock_lp(i, tgt, tok)) < 1e-5, "token %d '%c' keyed with its logprob %g: %g",
                      i, tok, mock_lp(i, tgt, tok), cJSON_IsNumber(v) ? v->valuedouble : 0.0);
                if (n > 0) { /* the top token first, then the sampled one */
                    CHECK(cJSON_IsNumber(tv) && t->child == tv && fabs(tv->valuedouble - mock_lp(i, tgt, tgt)) < 1e-5,
                          "token %d: top '%c' first, logprob %g", i, tgt, mock_lp(i, tgt, tgt));
                } else CHECK(tok == tgt || !tv, "logprobs 0: token %d '%c' alone", i, tok);
            }
            if (st) cJSON_Delete(tops);
            cJSON_Delete(r);
            srv_job_unref(j);
        }
    }
    /* sampled at temperature 2: most tokens are not the top one; each entry = top-1 + the sampled token, whose value
     * is its token_logprobs value */
    srv_job *j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":24,\"temperature\":2,\"seed\":11,\"logprobs\":1}");
    cJSON *r = body_json(j);
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs"), *tl = cJSON_GetObjectItem(lp, "token_logprobs"),
          *tk = cJSON_GetObjectItem(lp, "tokens");
    int n_two = 0, n_ok = 0, n = cJSON_GetArraySize(tops);
    for (int i = 0; i < n; i++) {
        cJSON *t = cJSON_GetArrayItem(tops, i), *v = cJSON_GetObjectItem(t, cJSON_GetArrayItem(tk, i)->valuestring);
        const double lpi = cJSON_GetArrayItem(tl, i)->valuedouble;
        n_two += cJSON_GetArraySize(t) == 2;
        /* the top (logprob of 9 - lse > -1.6 at temperature-free logits) first; the sampled token keyed with token_logprobs */
        n_ok += v && fabs(v->valuedouble - lpi) < 1e-9 && t->child->valuedouble > -1.6 &&
                (cJSON_GetArraySize(t) == 1 ? t->child == v : t->child->next == v && lpi < t->child->valuedouble);
    }
    CHECK(n == 24 && n_ok == 24, "sampled: every entry has the top token, then the sampled one (%d of %d)", n_ok, n);
    CHECK(n_two >= 8, "sampled: %d of 24 tokens were not the top one (2 keys)", n_two);
    cJSON_Delete(r);
    srv_job_unref(j);
    /* chat: top_logprobs is the top-N list only (the chat API's format), also for a sampled token that is not in it */
    j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":16,\"temperature\":2,\"seed\":11,"
                      "\"logprobs\":true,\"top_logprobs\":1}");
    r = body_json(j);
    cJSON *c = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs"), "content");
    int n_one = 0, n_other = 0;
    cJSON *e;
    cJSON_ArrayForEach(e, c) {
        cJSON *ta = cJSON_GetObjectItem(e, "top_logprobs");
        n_one += cJSON_GetArraySize(ta) == 1;
        n_other += strcmp(cJSON_GetObjectItem(cJSON_GetArrayItem(ta, 0), "token")->valuestring, cJSON_GetObjectItem(e, "token")->valuestring) != 0;
    }
    CHECK(cJSON_GetArraySize(c) == 16 && n_one == 16 && n_other >= 4, "chat: 16 entries of 1 alternative (%d), %d sampled tokens not in it",
          n_one, n_other);
    cJSON_Delete(r);
    srv_job_unref(j);
}

/* serve --mock --ctx N: the mock's sessions hold N positions, and the generator treats them as the engine's: a prompt of
 * N tokens or more is a 400 naming the context, generation stops at the context with finish_reason "length" (also a
 * chat without max_tokens), a KV-reused session too; 0 is 4096 (the engine's default), more than the mock's maximum (65536) is lowered to it. */
static void test_mock_ctx(void) {
    char err[256];
    srv_backend *saved = be, *m16 = NULL;
    CHECK(srv_backend_open_mock(&m16, 0, 0, 16, 1, err, sizeof err) == 0 && m16 && m16->n_ctx == 16, "mock --ctx 16 opens");
    if (!m16) return;
    be = go.be = m16;
    srv_job *j = run(SRV_COMPLETION, "{\"prompt\":\"abcdefghijklmnop\",\"max_tokens\":1,\"temperature\":0}");
    CHECK(j->http_status == 400 && strstr(j->out.p, "\"This server's context is 16 tokens (deltafin serve --ctx 16); the prompt has 16 tokens, which leaves no room "
                                                  "for a completion: shorten the prompt, or restart the server with a larger --ctx (up to the "
                                                  "model's maximum context).\"") &&
          strstr(j->out.p, "\"param\":\"prompt\""), "16-token prompt in a 16-position context: 400: %s", j->out.p);
    srv_job_unref(j);
    /* 10 prompt tokens + max_tokens 100: the 6 that fit, then "length" (the mock's text from offset 10) */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abcdefghij\",\"max_tokens\":100,\"temperature\":0}");
    cJSON *r = body_json(j);
    CHECK(j->http_status == 200 && !strcmp(choice_str(r, "text"), "ld! Th") && !strcmp(choice_str(r, "finish_reason"), "length"),
          "prompt + max_tokens past the context: the room, finish length: %d '%s' %s", j->http_status, choice_str(r, "text"),
          choice_str(r, "finish_reason"));
    CHECK(usage_int(cJSON_GetObjectItem(r, "usage"), "completion_tokens") == 6, "6 completion tokens");
    cJSON_Delete(r);
    srv_job_unref(j);
    /* the same streamed, and extending the cached tokens (KV reuse): the room is the context's, not the new part's */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abcdefghijld\",\"max_tokens\":100,\"temperature\":0,\"stream\":true}");
    sse_t s;
    parse_sse(j->out.p, &s, 0);
    CHECK(!strcmp(s.text, "! Th") && !strcmp(s.finish, "length") && s.done, "streamed, reused: '%s' %s", s.text, s.finish);
    srv_job_unref(j);
    /* chat without max_tokens: what fits ("user: hi\nassistant:" is 19 tokens: not in 16) */
    j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0}");
    CHECK(j->http_status == 400 && strstr(j->out.p, "the prompt has 19 tokens") && strstr(j->out.p, "\"param\":\"messages\""),
          "chat prompt past the context: 400: %s", j->out.p);
    srv_job_unref(j);
    m16->close(m16);
    srv_backend *m = NULL;
    CHECK(srv_backend_open_mock(&m, 0, 0, 24, 1, err, sizeof err) == 0 && m, "mock --ctx 24 opens");
    if (m) {
        be = go.be = m;
        j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"temperature\":0}");
        r = body_json(j);
        cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "message");
        cJSON *ct = cJSON_GetObjectItem(msg, "content");
        CHECK(j->http_status == 200 && cJSON_IsString(ct) && !strcmp(ct->valuestring, "uick ") &&
              !strcmp(choice_str(r, "finish_reason"), "length"), "chat without max_tokens: the 5 that fit in 24: %s", j->out.p);
        cJSON_Delete(r);
        srv_job_unref(j);
        m->close(m);
    }
    m = NULL;
    CHECK(srv_backend_open_mock(&m, 0, 0, 0, 1, err, sizeof err) == 0 && m && m->n_ctx == 4096, "--ctx 0: the default, 4096");
    if (m) m->close(m);
    m = NULL;
    CHECK(srv_backend_open_mock(&m, 0, 0, 5000, 1, err, sizeof err) == 0 && m && m->n_ctx == 5000, "--ctx 5000: as asked");
    if (m) m->close(m);
    m = NULL;
    CHECK(srv_backend_open_mock(&m, 0, 0, 70000, 1, err, sizeof err) == 0 && m && m->n_ctx == 65536, "--ctx 70000: lowered to 65536");
    if (m) m->close(m);
    be = go.be = saved;
}

int main(void) {
    char err[256];
    CHECK(srv_backend_open_mock(&be, 0, 0, 0, 1, err, sizeof err) == 0, "mock opens");
    go.be = be;
    go.kv_reuse = 1;
    go.keepalive_s = 5;

    /* 1. greedy completion: text, finish, usage */
    srv_job *j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":20,\"temperature\":0}");
    cJSON *r = body_json(j);
    CHECK(j->http_status == 200, "200: %d", j->http_status);
    CHECK(!strcmp(choice_str(r, "text"), "lo, world! The quick"), "greedy text: '%s'", choice_str(r, "text"));
    CHECK(!strcmp(choice_str(r, "finish_reason"), "length"), "finish length");
    cJSON *u = cJSON_GetObjectItem(r, "usage");
    CHECK(usage_int(u, "prompt_tokens") == 3 && usage_int(u, "completion_tokens") == 20 && usage_int(u, "total_tokens") == 23, "usage");
    CHECK(!strcmp(cJSON_GetObjectItem(r, "object")->valuestring, "text_completion"), "object");
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 2. KV reuse: an extension of the cached tokens evaluates only the rest */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abclo, world!\",\"max_tokens\":6,\"temperature\":0}");
    r = body_json(j);
    CHECK(cached(cJSON_GetObjectItem(r, "usage")) == 12, "12 of 13 prompt tokens reused: %d", cached(cJSON_GetObjectItem(r, "usage")));
    CHECK(!strcmp(choice_str(r, "text"), " The q"), "same text as without reuse: '%s'", choice_str(r, "text"));
    cJSON_Delete(r);
    srv_job_unref(j);
    j = run(SRV_COMPLETION, "{\"prompt\":\"xyz\",\"max_tokens\":2,\"temperature\":0}");
    r = body_json(j);
    CHECK(cached(cJSON_GetObjectItem(r, "usage")) == 0, "different prefix: nothing reused");
    void *sess = be->session_acquire(be, NULL, 0);
    CHECK(sess && be->n_past(be, sess) == 4, "session holds prompt + evaluated tokens: %d", sess ? be->n_past(be, sess) : -1);
    be->session_release(be, sess);
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 3. streamed completion with a stop sequence spanning tokens */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":40,\"temperature\":0,\"stream\":true,\"stop\":[\" brown\",\"zzz\"],"
                            "\"stream_options\":{\"include_usage\":true}}");
    sse_t s;
    parse_sse(j->out.p, &s, 0);
    CHECK(!strcmp(s.text, "lo, world! The quick"), "streamed text stops before ' brown': '%s'", s.text);
    CHECK(!strcmp(s.finish, "stop"), "finish stop: %s", s.finish);
    CHECK(s.done == 1 && s.usage_chunk == 1, "[DONE] and one usage chunk");
    CHECK(usage_int(s.usage, "completion_tokens") == 26, "tokens up to and including the stop's last byte: %d",
          usage_int(s.usage, "completion_tokens"));
    cJSON_Delete(s.usage);
    CHECK(j->out.len >= 14 && !strcmp(j->out.p + j->out.len - 14, "data: [DONE]\n\n"), "ends with [DONE]");
    srv_job_unref(j);

    /* 4. UTF-8: byte tokens split characters; no chunk may split one; EOS -> stop */
    char body[512];
    char pr[60];
    memset(pr, 'x', 59);
    pr[59] = 0;
    snprintf(body, sizeof body, "{\"prompt\":\"%s\",\"max_tokens\":100,\"temperature\":0,\"stream\":true}", pr);
    j = run(SRV_COMPLETION, body);
    parse_sse(j->out.p, &s, 0);
    CHECK(!strcmp(s.text, "Caf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82 done."), "UTF-8 text: '%s'", s.text);
    CHECK(s.bad_utf8 == 0, "every chunk is valid UTF-8");
    CHECK(!strcmp(s.finish, "stop"), "EOS -> stop: %s", s.finish);
    CHECK(s.events == 22 + 2, "one event per complete character + finish + [DONE]: %d", s.events);
    srv_job_unref(j);

    /* 5. logprobs (completions): one entry per token, top-2, consistent */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"max_tokens\":5,\"temperature\":0,\"logprobs\":2}");
    r = body_json(j);
    cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItem(lp, "tokens")) == 5, "5 logprob tokens");
    cJSON *tl = cJSON_GetObjectItem(lp, "token_logprobs"), *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    cJSON *t0 = cJSON_GetArrayItem(tops, 0);
    CHECK(cJSON_GetArraySize(t0) == 2, "top-2");
    CHECK(!strcmp(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "tokens"), 0)->valuestring, "l"), "first token 'l'");
    CHECK_NEAR(cJSON_GetArrayItem(tl, 0)->valuedouble, cJSON_GetObjectItem(t0, "l")->valuedouble, 1e-6, "greedy token is top-1");
    CHECK(cJSON_GetArrayItem(tl, 0)->valuedouble < 0 && cJSON_GetArrayItem(tl, 0)->valuedouble > -0.2, "logprob near 0: %g",
          cJSON_GetArrayItem(tl, 0)->valuedouble);
    CHECK(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 4)->valueint == 4, "text_offset");
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 6. chat: streamed with logprobs; non-streamed */
    j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,\"temperature\":0,"
                      "\"stream\":true,\"logprobs\":true,\"top_logprobs\":1}");
    parse_sse(j->out.p, &s, 1);
    /* prompt "user: hi\nassistant:" is 19 tokens */
    CHECK(!strcmp(s.text, "uick bro"), "chat stream text: '%s'", s.text);
    CHECK(s.lp_tokens == 8, "8 logprob entries streamed: %d", s.lp_tokens);
    CHECK(!strcmp(s.finish, "length"), "length");
    srv_job_unref(j);
    j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":8,\"temperature\":0}");
    r = body_json(j);
    cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "message");
    CHECK(!strcmp(cJSON_GetObjectItem(msg, "content")->valuestring, "uick bro") &&
          !strcmp(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant"), "chat message");
    CHECK(cached(cJSON_GetObjectItem(r, "usage")) == 18, "same chat again reuses 18 tokens: %d", cached(cJSON_GetObjectItem(r, "usage")));
    cJSON_Delete(r);
    srv_job_unref(j);

    /* 7. seeds: same seed same text; temperature sampling differs from greedy somewhere */
    char t1[256] = "", t2[256] = "", t3[256] = "";
    const char *sb = "{\"prompt\":\"abc\",\"max_tokens\":60,\"temperature\":1.5,\"seed\":%d}";
    char *outs[3] = {t1, t2, t3};
    int seeds[3] = {7, 7, 8};
    for (int i = 0; i < 3; i++) {
        snprintf(body, sizeof body, sb, seeds[i]);
        j = run(SRV_COMPLETION, body);
        r = body_json(j);
        snprintf(outs[i], 256, "%s", choice_str(r, "text"));
        cJSON_Delete(r);
        srv_job_unref(j);
    }
    CHECK(!strcmp(t1, t2), "same seed, same text");
    CHECK(strcmp(t1, t3), "different seed, different text");

    /* 8. cancelled before start: no output; prompt errors -> 400 */
    j = srv_job_new();
    char *ej = NULL;
    srv_request_parse(&j->req, SRV_COMPLETION, "{\"prompt\":\"abc\"}", 16, &ej);
    j->cancel = 1;
    srv_gen_run(&go, j);
    CHECK(j->done && j->out.len == 0 && j->completion_tokens == 0, "cancelled: nothing generated");
    srv_job_unref(j);
    j = run(SRV_COMPLETION, "{\"prompt\":[1,2,999]}");
    CHECK(j->http_status == 400 && strstr(j->out.p, "outside the vocabulary"), "id out of range: %s", j->out.p);
    srv_job_unref(j);
    srv_buf big;
    srv_buf_init(&big);
    srv_buf_adds(&big, "{\"prompt\":[1");
    for (int i = 0; i < 5000; i++) srv_buf_adds(&big, ",1");
    srv_buf_adds(&big, "],\"stream\":true}");
    j = run(SRV_COMPLETION, big.p);
    CHECK(j->http_status == 400 && strstr(j->out.p, "context"), "prompt longer than the context: %s", j->out.p);
    srv_buf_free(&big);
    srv_job_unref(j);
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":3,\"temperature\":0}");
    r = body_json(j);
    CHECK(!strcmp(choice_str(r, "text"), "abclo,"), "echo: '%s'", choice_str(r, "text"));
    cJSON_Delete(r);
    srv_job_unref(j);
    /* echo + logprobs: prompt tokens get logprobs too (the first null) */
    j = run(SRV_COMPLETION, "{\"prompt\":\"abc\",\"echo\":true,\"max_tokens\":2,\"temperature\":0,\"logprobs\":1}");
    r = body_json(j);
    lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "logprobs");
    cJSON *toks = cJSON_GetObjectItem(lp, "tokens"), *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
    CHECK(!strcmp(choice_str(r, "text"), "abclo"), "echo text: '%s'", choice_str(r, "text"));
    CHECK(cJSON_GetArraySize(toks) == 5 && !strcmp(cJSON_GetArrayItem(toks, 1)->valuestring, "b") &&
          !strcmp(cJSON_GetArrayItem(toks, 3)->valuestring, "l"), "prompt + completion tokens");
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(tlp, 0)) && cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)),
          "first prompt token: null");
    /* mock after 1 token predicts 'e' (logit 9): 'b' has logit ((98*7+1)%13)/13 */
    double lse = 0;
    {
        float lg[262];
        for (int v = 0; v < 262; v++) lg[v] = (float)((v * 7 + 1) % 13) / 13.0f;
        lg['e'] = 9.0f;
        double mx = 9.0, sum = 0;
        for (int v = 0; v < 262; v++) sum += exp(lg[v] - mx);
        lse = mx + log(sum);
        CHECK_NEAR(cJSON_GetArrayItem(tlp, 1)->valuedouble, lg['b'] - lse, 1e-5, "prompt logprob of 'b' after 'a'");
    }
    CHECK(cJSON_GetArrayItem(tlp, 3)->valuedouble > -0.2, "completion token logprob near 0");
    CHECK(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "text_offset"), 4)->valueint == 4, "text_offset counts the echo");
    CHECK(cached(cJSON_GetObjectItem(r, "usage")) == 0, "echo + logprobs evaluates the whole prompt");
    cJSON_Delete(r);
    srv_job_unref(j);

    test_issue11();
    test_sampled_in_top();
    test_logprobs_stop();
    test_mock_ctx();
    be->close(be);

    /* 9. Kimi: <think> -> reasoning_content, tool-call section -> tool_calls */
    CHECK(srv_backend_open_mock(&be, 0, 1, 0, 1, err, sizeof err) == 0, "kimi mock opens");
    go.be = be;
    const char *tools = "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{}}}]";
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"temperature\":0,%s}", tools);
    j = run(SRV_CHAT, body);
    r = body_json(j);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
    msg = cJSON_GetObjectItem(c0, "message");
    cJSON *rc = cJSON_GetObjectItem(msg, "reasoning_content"), *ct = cJSON_GetObjectItem(msg, "content");
    CHECK(cJSON_IsString(rc) && !strcmp(rc->valuestring, "The user asks for the weather."), "reasoning_content");
    CHECK(cJSON_IsString(ct) && !strcmp(ct->valuestring, "Checking."), "content without markers: %s", cJSON_IsString(ct) ? ct->valuestring : "?");
    cJSON *tc = cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0), *fn = cJSON_GetObjectItem(tc, "function");
    CHECK(tc && !strcmp(cJSON_GetObjectItem(tc, "id")->valuestring, "functions.get_weather:0") &&
          !strcmp(cJSON_GetObjectItem(tc, "type")->valuestring, "function"), "tool call id/type");
    CHECK(fn && !strcmp(cJSON_GetObjectItem(fn, "name")->valuestring, "get_weather") &&
          !strcmp(cJSON_GetObjectItem(fn, "arguments")->valuestring, "{\"city\": \"Paris\"}"), "tool call function");
    CHECK(!strcmp(choice_str(r, "finish_reason"), "tool_calls"), "finish tool_calls: %s", choice_str(r, "finish_reason"));
    cJSON_Delete(r);
    srv_job_unref(j);
    /* streamed: reasoning deltas, content, one tool_calls delta with index 0 */
    snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"temperature\":0,\"stream\":true,%s}", tools);
    j = run(SRV_CHAT, body);
    parse_sse(j->out.p, &s, 1);
    CHECK(!strcmp(s.text, "Checking.") && !strcmp(s.finish, "tool_calls"), "streamed content / finish: '%s' %s", s.text, s.finish);
    CHECK(!strcmp(s.reasoning, "The user asks for the weather."), "reasoning_content deltas: '%s'", s.reasoning);
    CHECK(strstr(j->out.p, "\"tool_calls\":[{\"index\":0,\"id\":\"functions.get_weather:0\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]") != NULL,
          "tool_calls delta");
    CHECK(strstr(j->out.p, "<|tool_call") == NULL && strstr(j->out.p, "<think>") == NULL, "no markers leak into the stream");
    srv_job_unref(j);
    /* without tools: the section stays text; reasoning is still split */
    j = run(SRV_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"temperature\":0}");
    r = body_json(j);
    msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "message");
    ct = cJSON_GetObjectItem(msg, "content");
    CHECK(cJSON_IsString(ct) && !strncmp(ct->valuestring, "Checking.<|tool_calls_section_begin|>", 37), "no tools: raw text");
    CHECK(!cJSON_GetObjectItem(msg, "tool_calls") && !strcmp(choice_str(r, "finish_reason"), "stop"), "no tool_calls, stop");
    cJSON_Delete(r);
    srv_job_unref(j);
    /* max_tokens inside the reasoning section: "<think>" (7 tokens) + "The u" (5): the reasoning so far is
     * reasoning_content, content is "" (a string, not null: no tool call was made), finish_reason "length"; with
     * and without tools, streamed and not */
    for (int tl = 0; tl <= 1; tl++)
        for (int st = 0; st <= 1; st++) {
            snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"temperature\":0,"
                     "\"max_tokens\":12%s%s%s}", st ? ",\"stream\":true" : "", tl ? "," : "", tl ? tools : "");
            j = run(SRV_CHAT, body);
            if (st) {
                parse_sse(j->out.p, &s, 1);
                CHECK(!strcmp(s.reasoning, "The u") && !strcmp(s.text, "") && !strcmp(s.finish, "length") && s.done,
                      "max_tokens in the reasoning (streamed, tools %d): reasoning '%s', content '%s', %s", tl, s.reasoning,
                      s.text, s.finish);
                CHECK(!strstr(j->out.p, "\"content\":null") && !strstr(j->out.p, "<think>"),
                      "max_tokens in the reasoning (streamed, tools %d): no null content, no marker", tl);
            } else {
                r = body_json(j);
                msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "message");
                rc = cJSON_GetObjectItem(msg, "reasoning_content");
                ct = cJSON_GetObjectItem(msg, "content");
                CHECK(cJSON_IsString(rc) && !strcmp(rc->valuestring, "The u") && cJSON_IsString(ct) && !ct->valuestring[0] &&
                      !cJSON_GetObjectItem(msg, "tool_calls") && !strcmp(choice_str(r, "finish_reason"), "length"),
                      "max_tokens in the reasoning (tools %d): reasoning_content 'The u', content \"\", length: %s", tl, j->out.p);
                CHECK(usage_int(cJSON_GetObjectItem(r, "usage"), "completion_tokens") == 12, "12 completion tokens");
                cJSON_Delete(r);
            }
            srv_job_unref(j);
        }
    /* max_tokens inside the opening "<think>" (plain text, one token a byte here, as several tokens in kimi-mini):
     * the partial marker ("<", "<t" ... "<think") could still have been <think>, so it is neither content nor
     * reasoning: content "", no reasoning_content, finish "length", streamed and not, with and without tools (with
     * tools also logprobs: the cut tokens keep their entries). A
     * stop sequence ("ink") that ends the output after "<th" is a stop, not a cut: "<th" is the content there */
    for (int mt = 1; mt <= 7; mt++)
        for (int st = 0; st <= 1; st++)
            for (int tl = 0; tl <= 1; tl++) {
                const int stop_ink = mt == 7; /* max_tokens 7 would finish the marker; stop at "ink" instead */
                snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],"
                         "\"temperature\":0,\"max_tokens\":%d%s%s%s%s}", stop_ink ? 20 : mt, stop_ink ? ",\"stop\":\"ink\"" : "",
                         st ? ",\"stream\":true" : "", tl ? ",\"logprobs\":true," : "", tl ? tools : "");
                j = run(SRV_CHAT, body);
                const char *want = stop_ink ? "<th" : "", *want_fin = stop_ink ? "stop" : "length";
                char text[512], reason[512];
                cJSON *lpx = NULL;
                collect(j, 1, st, text, sizeof text, reason, sizeof reason, &lpx);
                /* with tools the request asks for logprobs: one entry per generated token (the stop's: up to "<th") */
                CHECK(cJSON_GetArraySize(lpx) == (tl ? (stop_ink ? 3 : mt) : 0), "max_tokens %d (streamed %d, tools %d): "
                      "%d logprobs entries", mt, st, tl, cJSON_GetArraySize(lpx));
                cJSON_Delete(lpx);
                CHECK(!strcmp(text, want) && !reason[0], "max_tokens %d%s (streamed %d, tools %d): content '%s' "
                      "reasoning '%s', want content '%s'", mt, stop_ink ? " / stop \"ink\"" : "", st, tl, text, reason, want);
                if (st) {
                    parse_sse(j->out.p, &s, 1);
                    CHECK(!strcmp(s.finish, want_fin) && s.done && !strstr(j->out.p, "reasoning_content") &&
                          (stop_ink || !strstr(j->out.p, "\"content\":\"<")),
                          "max_tokens %d (streamed, tools %d): finish %s, no partial marker delta", mt, tl, s.finish);
                } else {
                    r = body_json(j);
                    msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0), "message");
                    ct = cJSON_GetObjectItem(msg, "content");
                    CHECK(cJSON_IsString(ct) && !strcmp(ct->valuestring, want) && !cJSON_GetObjectItem(msg, "reasoning_content") &&
                          !strcmp(choice_str(r, "finish_reason"), want_fin) &&
                          usage_int(cJSON_GetObjectItem(r, "usage"), "completion_tokens") == (stop_ink ? 6 : mt),
                          "max_tokens %d (tools %d): %s", mt, tl, j->out.p);
                    cJSON_Delete(r);
                }
                srv_job_unref(j);
            }
    /* chat logprobs with a stop sequence that begins inside a token: <|tool_calls_section_begin|> is one token (a
     * special, its text put back by the generator); stop "section" cuts it. The entries cover exactly the text
     * returned (reasoning and content, markers as written): the straddling token keeps its logprob with its token and
     * bytes cut to "<|tool_calls_"; nothing of the stop sequence or after it */
    for (int st = 0; st <= 1; st++) {
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}],\"temperature\":0,"
                 "\"logprobs\":true,\"top_logprobs\":1,\"stop\":\"section\"%s}", st ? ",\"stream\":true" : "");
        j = run(SRV_CHAT, body);
        char text[512], reason[512], cat[1024] = "";
        cJSON *lp, *e;
        collect(j, 1, st, text, sizeof text, reason, sizeof reason, &lp);
        CHECK(!strcmp(reason, "The user asks for the weather.") && !strcmp(text, "Checking.<|tool_calls_"),
              "chat stop inside a marker%s: reasoning '%s', content '%s'", st ? " (streamed)" : "", reason, text);
        cJSON_ArrayForEach(e, lp) strncat(cat, cJSON_GetObjectItem(e, "token")->valuestring, sizeof cat - strlen(cat) - 1);
        CHECK(!strcmp(cat, "<think>The user asks for the weather.</think>Checking.<|tool_calls_"),
              "chat stop%s: the logprob tokens are the text returned: '%s'", st ? " (streamed)" : "", cat);
        cJSON *last = cJSON_GetArrayItem(lp, cJSON_GetArraySize(lp) - 1), *bytes = cJSON_GetObjectItem(last, "bytes");
        CHECK(cJSON_GetArraySize(lp) == 55 && cJSON_GetArraySize(bytes) == 13 &&
              cJSON_GetArrayItem(bytes, 12)->valueint == '_' && cJSON_GetObjectItem(last, "logprob")->valuedouble < 0,
              "chat stop%s: 54 byte tokens + the cut marker (13 bytes): %d entries", st ? " (streamed)" : "", cJSON_GetArraySize(lp));
        cJSON_Delete(lp);
        srv_job_unref(j);
    }
    be->close(be);
    return t_done();
}
