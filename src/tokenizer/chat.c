/* chat.c — rendering a conversation in the model's chat format.
 *
 * When the model ships a chat template (chat_template.jinja, or
 * tokenizer_config.json "chat_template") it is rendered by deltafin's Jinja
 * subset (jinja_*.c) exactly as transformers' apply_chat_template does:
 * variables messages, tools, documents (None), add_generation_prompt, the
 * special tokens of tokenizer_config.json (bos_token, eos_token, ...) and
 * keyword arguments (enable_thinking / thinking = True with DF_CHAT_THINKING, plus
 * reasoning_effort "high"; = False with DF_CHAT_NO_THINKING; neither: not passed,
 * the template's default as in transformers; or the caller's "chat_template_kwargs").
 * Goldens: tests/tokenizer/golden_jinja*.jsonl.
 * For Kimi K3's XTML template (it reads "_xtml_json_block"), tool-call
 * arguments given as a JSON string reach the template as an object, as K3's
 * tokenizer and vLLM do.
 *
 * Without a template, each family's published template is re-implemented
 * statement by statement below (the fallback), byte-identical to
 * transformers (tests/tokenizer/golden_chat.jsonl):
 *   Kimi K2      shared/data/kimi-k2-chat-template.jinja
 *   DeepSeek-V3  tokenizer_config.json chat_template of deepseek-ai/DeepSeek-V3
 *                (quirks kept: ns.is_first / is_output_first are never reset)
 *   Qwen3        tokenizer_config.json chat_template of Qwen3 (enable_thinking)
 *   harmony      gpt-oss; no template ships with it: docs/chat-formats.md
 * Messages: OpenAI-style JSON array of {role, content, tool_calls, ...}, or an
 * object {"messages": [...], "tools": [...], "chat_template_kwargs": {...}}.
 * The fallback is lenient where the templates would raise (null content
 * renders as ""); the template path raises exactly where jinja2 would. */
#include "tok_internal.h"
#include "jinja.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int tok_py_json_dump(const char *json, tok_buf *out);
int tok_py_json_dump_items(const char *json, tok_buf **items, int *n);

static const char *role_of(const cJSON *m) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(r) ? r->valuestring : "";
}

/* content as text: string; list of parts -> their "text" joined; else "" */
static void content_of(const cJSON *m, tok_buf *o) {
    o->n = 0;
    tok_buf_put(o, "", 0);
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (cJSON_IsString(c)) { tok_buf_puts(o, c->valuestring); return; }
    if (cJSON_IsArray(c)) {
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (cJSON_IsString(t)) tok_buf_puts(o, t->valuestring);
        }
    }
}

static int content_is_null(const cJSON *m) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    return !c || cJSON_IsNull(c);
}

static const char *str_field(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* tool call's function object (OpenAI {type, function:{name, arguments}} or flat) */
static const cJSON *tc_function(const cJSON *tc) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
    return cJSON_IsObject(f) ? f : tc;
}

/* arguments as text: a string as-is, anything else as Python json.dumps */
static void tc_arguments(const cJSON *f, tok_buf *o) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
    if (cJSON_IsString(a)) { tok_buf_puts(o, a->valuestring); return; }
    if (!a) return;
    char *raw = cJSON_PrintUnformatted(a);
    if (raw) { tok_py_json_dump(raw, o); free(raw); }
}

static int tools_present(const char *tools_json, cJSON **tools) {
    *tools = NULL;
    if (!tools_json) return 0;
    *tools = cJSON_Parse(tools_json);
    return cJSON_IsArray(*tools) && cJSON_GetArraySize(*tools) > 0;
}

/* ------------------------------------------------------------------ Kimi */

static int render_kimi(const cJSON *msgs, const char *tools_json, int flags, tok_buf *o) {
    cJSON *tools;
    if (tools_present(tools_json, &tools)) {
        tok_buf_puts(o, "<|im_system|>tool_declare<|im_middle|>");
        if (tok_py_json_dump(tools_json, o)) { cJSON_Delete(tools); return DF_EINVAL; }
        tok_buf_puts(o, "<|im_end|>");
    }
    cJSON_Delete(tools);
    int i = 0;
    const cJSON *m;
    tok_buf c = {0};
    cJSON_ArrayForEach(m, msgs) {
        const char *r = role_of(m);
        if (i == 0 && strcmp(r, "system"))
            tok_buf_puts(o, "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>");
        if (!strcmp(r, "system")) tok_buf_puts(o, "<|im_system|>system<|im_middle|>");
        else if (!strcmp(r, "user")) tok_buf_puts(o, "<|im_user|>user<|im_middle|>");
        else if (!strcmp(r, "assistant")) tok_buf_puts(o, "<|im_assistant|>assistant<|im_middle|>");
        else if (!strcmp(r, "tool")) tok_buf_puts(o, "<|im_system|>tool<|im_middle|>");
        const cJSON *cj = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (cJSON_IsArray(cj)) {
            const cJSON *part;
            cJSON_ArrayForEach(part, cj) {
                const char *ty = str_field(part, "type");
                if ((ty && !strcmp(ty, "image")) || cJSON_GetObjectItemCaseSensitive(part, "image") ||
                    cJSON_GetObjectItemCaseSensitive(part, "image_url"))
                    tok_buf_puts(o, "<|media_start|>image<|media_content|><|media_pad|><|media_end|>");
                else { const char *t = str_field(part, "text"); if (t) tok_buf_puts(o, t); }
            }
        } else {
            content_of(m, &c);
            tok_buf_put(o, c.p, c.n);
        }
        tok_buf_puts(o, "<|im_end|>");
        i++;
    }
    free(c.p);
    if (flags & DF_CHAT_ADD_GENERATION_PROMPT) tok_buf_puts(o, "<|im_assistant|>assistant<|im_middle|>");
    return 0;
}

/* -------------------------------------------------------------- DeepSeek */

#define FW_BAR "\xef\xbd\x9c"   /* U+FF5C fullwidth vertical line */
#define LB "\xe2\x96\x81"       /* U+2581 lower one eighth block */

static int render_deepseek(const df_tokenizer *t, const cJSON *msgs, int flags, tok_buf *o) {
    int is_first = 0, is_tool = 0, is_output_first = 1, first_sp = 1;
    tok_buf sp = {0}, c = {0}, a = {0};
    tok_buf_put(&sp, "", 0);
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (strcmp(role_of(m), "system")) continue;
        content_of(m, &c);
        if (!first_sp) tok_buf_puts(&sp, "\n\n");
        tok_buf_put(&sp, c.p, c.n);
        first_sp = 0;
    }
    if (t->bos_str) tok_buf_puts(o, t->bos_str);
    tok_buf_put(o, sp.p, sp.n);
    cJSON_ArrayForEach(m, msgs) {
        const char *r = role_of(m);
        content_of(m, &c);
        if (!strcmp(r, "user")) {
            is_tool = 0;
            tok_buf_puts(o, "<" FW_BAR "User" FW_BAR ">");
            tok_buf_put(o, c.p, c.n);
        }
        if (!strcmp(r, "assistant") && content_is_null(m)) {
            is_tool = 0;
            const cJSON *tc, *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            cJSON_ArrayForEach(tc, tcs) {
                const cJSON *f = tc_function(tc);
                const char *ty = str_field(tc, "type"), *nm = str_field(f, "name");
                a.n = 0; tok_buf_put(&a, "", 0);
                tc_arguments(f, &a);
                if (!is_first) tok_buf_puts(o, "<" FW_BAR "Assistant" FW_BAR "><" FW_BAR "tool" LB "calls" LB "begin" FW_BAR ">");
                else tok_buf_puts(o, "\n");
                tok_buf_puts(o, "<" FW_BAR "tool" LB "call" LB "begin" FW_BAR ">");
                tok_buf_puts(o, ty ? ty : "function");
                tok_buf_puts(o, "<" FW_BAR "tool" LB "sep" FW_BAR ">");
                tok_buf_puts(o, nm ? nm : "");
                tok_buf_puts(o, "\n```json\n");
                tok_buf_put(o, a.p, a.n);
                tok_buf_puts(o, "\n```<" FW_BAR "tool" LB "call" LB "end" FW_BAR ">");
                if (is_first) tok_buf_puts(o, "<" FW_BAR "tool" LB "calls" LB "end" FW_BAR "><" FW_BAR "end" LB "of" LB "sentence" FW_BAR ">");
                else is_first = 1;
            }
        }
        if (!strcmp(r, "assistant") && !content_is_null(m)) {
            if (is_tool) {
                tok_buf_puts(o, "<" FW_BAR "tool" LB "outputs" LB "end" FW_BAR ">");
                is_tool = 0;
            } else tok_buf_puts(o, "<" FW_BAR "Assistant" FW_BAR ">");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<" FW_BAR "end" LB "of" LB "sentence" FW_BAR ">");
        }
        if (!strcmp(r, "tool")) {
            is_tool = 1;
            if (is_output_first) {
                tok_buf_puts(o, "<" FW_BAR "tool" LB "outputs" LB "begin" FW_BAR "><" FW_BAR "tool" LB "output" LB "begin" FW_BAR ">");
                is_output_first = 0;
            } else tok_buf_puts(o, "\n<" FW_BAR "tool" LB "output" LB "begin" FW_BAR ">");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<" FW_BAR "tool" LB "output" LB "end" FW_BAR ">");
        }
    }
    if (is_tool) tok_buf_puts(o, "<" FW_BAR "tool" LB "outputs" LB "end" FW_BAR ">");
    if ((flags & DF_CHAT_ADD_GENERATION_PROMPT) && !is_tool) tok_buf_puts(o, "<" FW_BAR "Assistant" FW_BAR ">");
    free(sp.p); free(c.p); free(a.p);
    return 0;
}

/* ----------------------------------------------------------------- Qwen3 */

static int starts_with(const char *s, size_t n, const char *p) { size_t l = strlen(p); return n >= l && !memcmp(s, p, l); }
static int ends_with(const char *s, size_t n, const char *p) { size_t l = strlen(p); return n >= l && !memcmp(s + n - l, p, l); }

/* Python str.strip('\n') family on [*s, *s+*n) */
static void lstrip_nl(const char **s, size_t *n) { while (*n && **s == '\n') { (*s)++; (*n)--; } }
static void rstrip_nl(const char *s, size_t *n) { while (*n && s[*n - 1] == '\n') (*n)--; }

static const char *memfind(const char *h, size_t hn, const char *nd) {
    size_t l = strlen(nd);
    if (l > hn) return NULL;
    for (size_t i = 0; i + l <= hn; i++) if (!memcmp(h + i, nd, l)) return h + i;
    return NULL;
}
static const char *memfind_last(const char *h, size_t hn, const char *nd) {
    size_t l = strlen(nd);
    if (l > hn) return NULL;
    for (size_t i = hn - l + 1; i-- > 0;) if (!memcmp(h + i, nd, l)) return h + i;
    return NULL;
}

static int render_qwen3(const cJSON *msgs, const char *tools_json, int flags, tok_buf *o) {
    int n = cJSON_GetArraySize(msgs);
    const cJSON *m0 = cJSON_GetArrayItem(msgs, 0);
    tok_buf c = {0};
    cJSON *tools;
    int has_tools = tools_present(tools_json, &tools);
    cJSON_Delete(tools);
    if (has_tools) {
        tok_buf_puts(o, "<|im_start|>system\n");
        if (m0 && !strcmp(role_of(m0), "system")) { content_of(m0, &c); tok_buf_put(o, c.p, c.n); tok_buf_puts(o, "\n\n"); }
        tok_buf_puts(o, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
        tok_buf *items = NULL;
        int ni = 0;
        int rc = tok_py_json_dump_items(tools_json, &items, &ni);
        for (int i = 0; i < ni; i++) {
            if (!rc) { tok_buf_puts(o, "\n"); tok_buf_put(o, items[i].p, items[i].n); }
            free(items[i].p);
        }
        free(items);
        if (rc) { free(c.p); return rc; }
        tok_buf_puts(o, "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
                        "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
                        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n");
    } else if (m0 && !strcmp(role_of(m0), "system")) {
        content_of(m0, &c);
        tok_buf_puts(o, "<|im_start|>system\n");
        tok_buf_put(o, c.p, c.n);
        tok_buf_puts(o, "<|im_end|>\n");
    }
    int multi_step = 1, last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        if (!multi_step || strcmp(role_of(m), "user")) continue;
        content_of(m, &c);
        if (!(starts_with(c.p, c.n, "<tool_response>") && ends_with(c.p, c.n, "</tool_response>"))) {
            multi_step = 0;
            last_query = i;
        }
    }
    tok_buf a = {0};
    for (int i = 0; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        const char *r = role_of(m);
        content_of(m, &c);
        if (!strcmp(r, "user") || (!strcmp(r, "system") && i != 0)) {
            tok_buf_puts(o, "<|im_start|>");
            tok_buf_puts(o, r);
            tok_buf_puts(o, "\n");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<|im_end|>\n");
        } else if (!strcmp(r, "assistant")) {
            const char *cs = c.p, *rs = "";
            size_t cn = c.n, rn = 0;
            const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
            if (rc && !cJSON_IsNull(rc)) {
                if (cJSON_IsString(rc)) { rs = rc->valuestring; rn = strlen(rs); }
            } else if (memfind(c.p, c.n, "</think>")) {
                const char *last = memfind_last(c.p, c.n, "</think>");
                cs = last + 8; cn = (size_t)(c.p + c.n - cs);
                lstrip_nl(&cs, &cn);
                const char *first = memfind(c.p, c.n, "</think>");
                size_t bn = (size_t)(first - c.p);
                rstrip_nl(c.p, &bn);
                const char *th = memfind_last(c.p, bn, "<think>");
                rs = th ? th + 7 : c.p;
                rn = (size_t)(c.p + bn - rs);
                lstrip_nl(&rs, &rn);
            }
            tok_buf_puts(o, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || rn)) {
                const char *r2 = rs;
                size_t r2n = rn;
                lstrip_nl(&r2, &r2n);
                rstrip_nl(r2, &r2n);
                tok_buf_puts(o, "<think>\n");
                tok_buf_put(o, r2, r2n);
                tok_buf_puts(o, "\n</think>\n\n");
                const char *c2 = cs;
                size_t c2n = cn;
                lstrip_nl(&c2, &c2n);
                tok_buf_put(o, c2, c2n);
            } else tok_buf_put(o, cs, cn);
            const cJSON *tc, *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            int j = 0;
            if (cJSON_IsArray(tcs)) cJSON_ArrayForEach(tc, tcs) {
                if ((j == 0 && cn) || j > 0) tok_buf_puts(o, "\n");
                const cJSON *f = tc_function(tc);
                const char *nm = str_field(f, "name");
                tok_buf_puts(o, "<tool_call>\n{\"name\": \"");
                tok_buf_puts(o, nm ? nm : "");
                tok_buf_puts(o, "\", \"arguments\": ");
                a.n = 0; tok_buf_put(&a, "", 0);
                tc_arguments(f, &a);
                tok_buf_put(o, a.p, a.n);
                tok_buf_puts(o, "}\n</tool_call>");
                j++;
            }
            tok_buf_puts(o, "<|im_end|>\n");
        } else if (!strcmp(r, "tool")) {
            if (i == 0 || strcmp(role_of(cJSON_GetArrayItem(msgs, i - 1)), "tool")) tok_buf_puts(o, "<|im_start|>user");
            tok_buf_puts(o, "\n<tool_response>\n");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "\n</tool_response>");
            if (i == n - 1 || strcmp(role_of(cJSON_GetArrayItem(msgs, i + 1)), "tool")) tok_buf_puts(o, "<|im_end|>\n");
        }
    }
    if (flags & DF_CHAT_ADD_GENERATION_PROMPT) {
        tok_buf_puts(o, "<|im_start|>assistant\n");
        if (flags & DF_CHAT_NO_THINKING) tok_buf_puts(o, "<think>\n\n</think>\n\n"); /* enable_thinking=False */
    }
    free(c.p); free(a.p);
    return 0;
}

/* --------------------------------------------------------------- harmony */

static void ts_type(const cJSON *s, tok_buf *o) {
    const cJSON *en = cJSON_GetObjectItemCaseSensitive(s, "enum");
    if (cJSON_IsArray(en)) {
        const cJSON *v;
        int k = 0;
        cJSON_ArrayForEach(v, en) {
            if (k++) tok_buf_puts(o, " | ");
            char *raw = cJSON_PrintUnformatted(v);
            if (raw) { tok_py_json_dump(raw, o); free(raw); }
        }
        return;
    }
    const char *t = str_field(s, "type");
    if (!t) tok_buf_puts(o, "any");
    else if (!strcmp(t, "string")) tok_buf_puts(o, "string");
    else if (!strcmp(t, "number") || !strcmp(t, "integer")) tok_buf_puts(o, "number");
    else if (!strcmp(t, "boolean")) tok_buf_puts(o, "boolean");
    else if (!strcmp(t, "array")) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(s, "items");
        if (it) ts_type(it, o); else tok_buf_puts(o, "any");
        tok_buf_puts(o, "[]");
    } else if (!strcmp(t, "object")) tok_buf_puts(o, "object");
    else tok_buf_puts(o, "any");
}

static int in_required(const cJSON *req, const char *k) {
    const cJSON *v;
    cJSON_ArrayForEach(v, req) if (cJSON_IsString(v) && !strcmp(v->valuestring, k)) return 1;
    return 0;
}

static void harmony_tool(const cJSON *tool, tok_buf *o) {
    const cJSON *f = tc_function(tool);
    const char *nm = str_field(f, "name"), *desc = str_field(f, "description");
    if (desc && *desc) { tok_buf_puts(o, "// "); tok_buf_puts(o, desc); tok_buf_puts(o, "\n"); }
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    const cJSON *props = params ? cJSON_GetObjectItemCaseSensitive(params, "properties") : NULL;
    const cJSON *req = params ? cJSON_GetObjectItemCaseSensitive(params, "required") : NULL;
    tok_buf_puts(o, "type ");
    tok_buf_puts(o, nm ? nm : "");
    if (!props || !cJSON_GetArraySize(props)) { tok_buf_puts(o, " = () => any;\n\n"); return; }
    tok_buf_puts(o, " = (_: {\n");
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        const char *d = str_field(p, "description");
        if (d && *d) { tok_buf_puts(o, "// "); tok_buf_puts(o, d); tok_buf_puts(o, "\n"); }
        tok_buf_puts(o, p->string);
        if (!in_required(req, p->string)) tok_buf_puts(o, "?");
        tok_buf_puts(o, ": ");
        ts_type(p, o);
        tok_buf_puts(o, ",\n");
    }
    tok_buf_puts(o, "}) => any;\n\n");
}

static int render_harmony(const cJSON *msgs, const char *tools_json, int flags, tok_buf *o) {
    cJSON *tools;
    int has_tools = tools_present(tools_json, &tools);
    tok_buf_puts(o, "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
                    "Knowledge cutoff: 2024-06\n\nReasoning: ");
    tok_buf_puts(o, (flags & DF_CHAT_THINKING) ? "high" : "medium");
    tok_buf_puts(o, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.");
    if (has_tools) tok_buf_puts(o, "\nCalls to these tools must go to the commentary channel: 'functions'.");
    tok_buf_puts(o, "<|end|>");
    int n = cJSON_GetArraySize(msgs), first = 0;
    tok_buf c = {0}, a = {0};
    const cJSON *m0 = cJSON_GetArrayItem(msgs, 0);
    tok_buf_put(&c, "", 0);
    if (m0 && (!strcmp(role_of(m0), "system") || !strcmp(role_of(m0), "developer"))) { content_of(m0, &c); first = 1; }
    if (c.n || has_tools) {
        tok_buf_puts(o, "<|start|>developer<|message|>");
        if (c.n) { tok_buf_puts(o, "# Instructions\n\n"); tok_buf_put(o, c.p, c.n); tok_buf_puts(o, "\n\n"); }
        if (has_tools) {
            tok_buf_puts(o, "# Tools\n\n## functions\n\nnamespace functions {\n\n");
            const cJSON *t;
            cJSON_ArrayForEach(t, tools) harmony_tool(t, o);
            tok_buf_puts(o, "} // namespace functions");
        }
        tok_buf_puts(o, "<|end|>");
    }
    cJSON_Delete(tools);
    int last_user = -1;
    for (int i = 0; i < n; i++) if (!strcmp(role_of(cJSON_GetArrayItem(msgs, i)), "user")) last_user = i;
    for (int i = first; i < n; i++) {
        const cJSON *m = cJSON_GetArrayItem(msgs, i);
        const char *r = role_of(m);
        content_of(m, &c);
        if (!strcmp(r, "system") || !strcmp(r, "developer")) {
            tok_buf_puts(o, "<|start|>developer<|message|># Instructions\n\n");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<|end|>");
        } else if (!strcmp(r, "user")) {
            tok_buf_puts(o, "<|start|>user<|message|>");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<|end|>");
        } else if (!strcmp(r, "assistant")) {
            const char *th = str_field(m, "reasoning_content");
            if (!th || !*th) th = str_field(m, "thinking");
            const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
            int has_tc = cJSON_IsArray(tcs) && cJSON_GetArraySize(tcs) > 0;
            if (th && *th && (i > last_user || has_tc)) {
                tok_buf_puts(o, "<|start|>assistant<|channel|>analysis<|message|>");
                tok_buf_puts(o, th);
                tok_buf_puts(o, "<|end|>");
            }
            if (has_tc) {
                const cJSON *tc;
                cJSON_ArrayForEach(tc, tcs) {
                    const cJSON *f = tc_function(tc);
                    const char *nm = str_field(f, "name");
                    a.n = 0; tok_buf_put(&a, "", 0);
                    tc_arguments(f, &a);
                    tok_buf_puts(o, "<|start|>assistant to=functions.");
                    tok_buf_puts(o, nm ? nm : "");
                    tok_buf_puts(o, "<|channel|>commentary json<|message|>");
                    tok_buf_put(o, a.p, a.n);
                    tok_buf_puts(o, "<|call|>");
                }
                if (c.n) {
                    tok_buf_puts(o, "<|start|>assistant<|channel|>final<|message|>");
                    tok_buf_put(o, c.p, c.n);
                    tok_buf_puts(o, "<|end|>");
                }
            } else {
                tok_buf_puts(o, "<|start|>assistant<|channel|>final<|message|>");
                tok_buf_put(o, c.p, c.n);
                tok_buf_puts(o, "<|end|>");
            }
        } else if (!strcmp(r, "tool")) {
            const char *nm = str_field(m, "name");
            if (!nm) { /* the name of the call this answers */
                const char *id = str_field(m, "tool_call_id");
                for (int k = i - 1; k >= 0 && !nm && id; k--) {
                    const cJSON *tc, *tcs = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(msgs, k), "tool_calls");
                    cJSON_ArrayForEach(tc, tcs) {
                        const char *tid = str_field(tc, "id");
                        if (tid && !strcmp(tid, id)) nm = str_field(tc_function(tc), "name");
                    }
                }
            }
            tok_buf_puts(o, "<|start|>functions.");
            tok_buf_puts(o, nm ? nm : "tool");
            tok_buf_puts(o, " to=assistant<|channel|>commentary<|message|>");
            tok_buf_put(o, c.p, c.n);
            tok_buf_puts(o, "<|end|>");
        }
    }
    if (flags & DF_CHAT_ADD_GENERATION_PROMPT) tok_buf_puts(o, "<|start|>assistant");
    free(c.p); free(a.p);
    return 0;
}

/* ------------------------------------------------------- raw JSON spans */

static const char *js_ws(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* end of the JSON value at p (already validated by cJSON) */
static const char *js_skip(const char *p) {
    p = js_ws(p);
    if (*p == '"') {
        for (p++; *p && *p != '"'; p++) if (*p == '\\' && p[1]) p++;
        return *p ? p + 1 : NULL;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = js_ws(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                p = js_skip(p);                 /* key */
                if (!p || *(p = js_ws(p)) != ':') return NULL;
                p++;
            }
            p = js_skip(p);
            if (!p) return NULL;
            p = js_ws(p);
            if (*p == ',') { p++; continue; }
            return *p == close ? p + 1 : NULL;
        }
    }
    while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n' && *p != '\t' && *p != '\r') p++;
    return p;
}

/* raw text of member `key` of the JSON object at obj (the last one, as json.loads keeps) */
static int js_member(const char *obj, const char *key, const char **vs, size_t *vn) {
    const char *p = js_ws(obj);
    int found = 0;
    if (*p != '{') return 0;
    p = js_ws(p + 1);
    size_t kl = strlen(key);
    while (*p == '"') {
        const char *ks = p + 1, *ke = js_skip(p);
        if (!ke) return found;
        p = js_ws(ke);
        if (*p != ':') return found;
        const char *v = js_ws(p + 1), *ve = js_skip(v);
        if (!ve) return found;
        if ((size_t)(ke - 1 - ks) == kl && !memcmp(ks, key, kl)) { *vs = v; *vn = (size_t)(ve - v); found = 1; }
        p = js_ws(ve);
        if (*p != ',') break;
        p = js_ws(p + 1);
    }
    return found;
}

/* ------------------------------------------------------- template path */

static int render_template(const df_tokenizer *t, const char *msgs, size_t msgs_n, const char *tools, size_t tools_n,
                           const char *kw, size_t kw_n, int flags, char **text_out, char *err, size_t errlen) {
    if (!t->jj) {
        tok_err(err, errlen, "chat: the model's chat template (%s) cannot be used: %s", t->chat_template_from,
                t->jj_err ? t->jj_err : "parse failed");
        return t->jj_rc ? t->jj_rc : DF_EUNSUPPORTED;
    }
    /* render(messages=, tools=, documents=None, add_generation_prompt=, **{**special_tokens_map, **kwargs}) */
    tok_buf v = {0};
    tok_buf_puts(&v, "{");
    int any = 0;
    if (t->chat_vars && *t->chat_vars) { tok_buf_puts(&v, t->chat_vars); any = 1; }
    /* neither thinking flag: enable_thinking / thinking stay undefined, the template's default (transformers) */
    if (!kw && (flags & (DF_CHAT_THINKING | DF_CHAT_NO_THINKING))) {
        const char *b = (flags & DF_CHAT_THINKING) ? "true" : "false";
        tok_buf_puts(&v, any ? ", " : "");
        tok_buf_puts(&v, "\"enable_thinking\": ");
        tok_buf_puts(&v, b);
        tok_buf_puts(&v, ", \"thinking\": ");
        tok_buf_puts(&v, b);
        /* gpt-oss: the built-in harmony format says "Reasoning: high" with DF_CHAT_THINKING too */
        if (flags & DF_CHAT_THINKING) tok_buf_puts(&v, ", \"reasoning_effort\": \"high\"");
        any = 1;
    } else if (kw) {
        const char *a = kw, *e = kw + kw_n;
        while (a < e && *a != '{') a++;
        while (e > a && e[-1] != '}') e--;
        if (e - a >= 2) {
            const char *in = js_ws(a + 1);
            if (in < e - 1) {
                tok_buf_puts(&v, any ? ", " : "");
                tok_buf_put(&v, a + 1, (size_t)(e - 1 - (a + 1)));
                any = 1;
            }
        }
    }
    tok_buf_puts(&v, any ? ", " : "");
    tok_buf_puts(&v, "\"messages\": ");
    tok_buf_put(&v, msgs, msgs_n);
    tok_buf_puts(&v, ", \"tools\": ");
    if (tools) tok_buf_put(&v, tools, tools_n); else tok_buf_puts(&v, "null");
    tok_buf_puts(&v, ", \"documents\": null, \"add_generation_prompt\": ");
    tok_buf_puts(&v, (flags & DF_CHAT_ADD_GENERATION_PROMPT) ? "true" : "false");
    tok_buf_puts(&v, "}");
    if (!v.p) return DF_ENOMEM;
    /* Kimi K3's XTML template renders a call's arguments as <|open|>argument ...> elements only from an
     * object; its own tokenizer (and vLLM) turn the JSON string of an OpenAI tool call into one first */
    int opts = strstr(t->chat_template, "_xtml_json_block") ? JJ_TOOL_ARGS_OBJECTS : 0;
    char jerr[600] = "";
    size_t n;
    int rc = jj_render_opts(t->jj, v.p, v.n, opts, text_out, &n, jerr, sizeof jerr);
    free(v.p);
    if (rc) tok_err(err, errlen, "chat: the model's chat template (%s) failed: %s", t->chat_template_from, jerr);
    return rc;
}

int tok_chat_render(const df_tokenizer *t, const char *messages_json, const char *tools_json, int flags,
                    char **text_out, char *err, size_t errlen) {
    cJSON *msgs = cJSON_Parse(messages_json);
    if (!msgs) {
        const char *at = cJSON_GetErrorPtr();
        tok_err(err, errlen, "chat: messages are not valid JSON (near \"%.30s\"; lone \\ud800-\\udfff escapes "
                "are rejected)", at ? at : "");
        return DF_EINVAL;
    }
    const char *msgs_raw = messages_json, *tools_raw = tools_json, *kw_raw = NULL;
    size_t msgs_n = strlen(messages_json), tools_n = tools_json ? strlen(tools_json) : 0, kw_n = 0;
    char *tools_own = NULL;
    if (!cJSON_IsArray(msgs)) {
        /* also accept {"messages": [...], "tools": [...], "chat_template_kwargs": {...}} */
        cJSON *obj = msgs;
        cJSON *mm = cJSON_IsObject(obj) ? cJSON_DetachItemFromObjectCaseSensitive(obj, "messages") : NULL;
        if (!cJSON_IsArray(mm)) {
            cJSON_Delete(mm);
            cJSON_Delete(obj);
            tok_err(err, errlen, "chat: messages must be a JSON array of {\"role\", \"content\"} objects");
            return DF_EINVAL;
        }
        const cJSON *kwj = cJSON_GetObjectItemCaseSensitive(obj, "chat_template_kwargs");
        if (kwj && !cJSON_IsNull(kwj) && !cJSON_IsObject(kwj)) {
            cJSON_Delete(mm);
            cJSON_Delete(obj);
            tok_err(err, errlen, "chat: chat_template_kwargs must be a JSON object");
            return DF_EINVAL;
        }
        js_member(messages_json, "messages", &msgs_raw, &msgs_n);
        if (cJSON_IsObject(kwj)) js_member(messages_json, "chat_template_kwargs", &kw_raw, &kw_n);
        const cJSON *tt = cJSON_GetObjectItemCaseSensitive(obj, "tools");
        if (!tools_json && tt && !cJSON_IsNull(tt) && js_member(messages_json, "tools", &tools_raw, &tools_n)) {
            tools_own = malloc(tools_n + 1);
            if (tools_own) { memcpy(tools_own, tools_raw, tools_n); tools_own[tools_n] = 0; }
            tools_json = tools_own;
        }
        cJSON_Delete(obj);
        msgs = mm;
    }
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        if (!cJSON_IsObject(m) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(m, "role"))) {
            cJSON_Delete(msgs);
            free(tools_own);
            tok_err(err, errlen, "chat: every message needs a string \"role\"");
            return DF_EINVAL;
        }
    }
    if (tools_json) {
        cJSON *tj = cJSON_Parse(tools_json);
        int ok = tj && (cJSON_IsArray(tj) || cJSON_IsNull(tj));
        int is_null = cJSON_IsNull(tj);
        cJSON_Delete(tj);
        if (!ok) {
            cJSON_Delete(msgs);
            free(tools_own);
            tok_err(err, errlen, "chat: tools must be a JSON array");
            return DF_EINVAL;
        }
        if (is_null) tools_raw = NULL;
    }
    if (t->chat_template) {
        cJSON_Delete(msgs);
        int rc = render_template(t, msgs_raw, msgs_n, tools_raw, tools_n, kw_raw, kw_n, flags, text_out, err, errlen);
        free(tools_own);
        return rc;
    }
    tok_buf o = {0};
    tok_buf_put(&o, "", 0);
    int rc;
    switch (t->chat) {
    case TOK_CHAT_KIMI: rc = render_kimi(msgs, tools_json, flags, &o); break;
    case TOK_CHAT_DEEPSEEK: rc = render_deepseek(t, msgs, flags, &o); break;
    case TOK_CHAT_QWEN3: rc = render_qwen3(msgs, tools_json, flags, &o); break;
    case TOK_CHAT_HARMONY: rc = render_harmony(msgs, tools_json, flags, &o); break;
    default:
        tok_err(err, errlen, "chat: tokenizer %s has no chat template and no chat format we know (Kimi K2, "
                "DeepSeek-V3, Qwen3, gpt-oss harmony are built in; detected from the special tokens)",
                t->path ? t->path : "");
        rc = DF_EUNSUPPORTED;
    }
    cJSON_Delete(msgs);
    free(tools_own);
    if (rc) {
        if (rc == DF_EINVAL && err && !*err) tok_err(err, errlen, "chat: tools JSON could not be re-serialized");
        free(o.p);
        return rc;
    }
    *text_out = o.p;
    return 0;
}
