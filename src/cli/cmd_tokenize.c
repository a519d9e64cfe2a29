/* cmd_tokenize.c — `deltafin tokenize`: text on stdin -> ids (comma-separated,
 * one line), or ids -> text with --decode, or a chat (JSON list of messages,
 * or {"messages": [...], "tools": [...]}) rendered in the model's chat format
 * with --chat (--render prints the prompt text instead of its ids).
 * Defaults are transformers' (issue 11 item 3): special-token strings in the
 * text are special tokens (tokenizer(text), split_special_tokens=False;
 * --no-parse-special encodes them as plain text), and the chat template gets
 * no enable_thinking (apply_chat_template's default: Qwen3 thinks;
 * --thinking / --no-thinking pass True / False). */
#include "cli.h"
#include "deltafin.h"
#include "server/server.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin tokenize [--model DIR | --tokenizer FILE [--config tokenizer_config.json]]\n"
            "                         [--decode] [--chat [--render] [--tools FILE] [--thinking | --no-thinking]\n"
            "                         [--no-gen-prompt]] [--no-parse-special] [--add-bos]\n"
            "  reads text (or ids with --decode, or a JSON list of messages with --chat) on stdin;\n"
            "  prints ids comma-separated on one line (or the text).\n"
            "  --decode reads the ids as `run --prompt-ids` takes them (comma-separated integers >= 0, no empty\n"
            "  item); text (and --chat's input) must be valid UTF-8. Bad input is an error naming the position of\n"
            "  the bad id or the byte offset of the invalid byte (exit 1).\n"
            "  --model DIR: the tokenizer of a model directory (tokenizer.json or tiktoken.model); without --model\n"
            "  or --tokenizer: the model `deltafin setup` installed, else the embedded models/kimi-mini (as `run`).\n"
            "  special-token strings in the text (<|im_end|>, ...) are special tokens, as transformers'\n"
            "  tokenizers do by default; --no-parse-special encodes them as plain text (--parse-special,\n"
            "  the default, is still accepted).\n"
            "  --chat renders with the template's own thinking default (apply_chat_template without\n"
            "  enable_thinking: Qwen3 thinks); --thinking / --no-thinking pass enable_thinking True / False.\n"
            "  --render, --tools, --thinking, --no-thinking and --no-gen-prompt apply only with --chat.\n"
            "  --chat checks the messages as `deltafin serve` does (an error, exit 1, with the server's message): a\n"
            "  non-empty list, each with a role and a content (only an assistant message may leave it out; null is\n"
            "  rendered as \"\"; text parts are joined), no NUL characters, no key twice, no image parts.\n");
}

/* tokenize's options: what an unknown option is compared with */
static const char *const value_options[] = {"--model", "--tokenizer", "--config", "--tools", NULL};
static const char *const flag_options[] = {"--decode", "--chat", "--render", "--thinking", "--no-thinking", "--no-gen-prompt",
                                           "--parse-special", "--no-parse-special", "--add-bos", "--help", NULL};

static char *read_all(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap + 1);
    if (!b) return NULL;
    size_t r;
    while ((r = fread(b + len, 1, cap - len, f)) > 0) {
        len += r;
        if (len == cap) {
            char *nb = realloc(b, cap * 2 + 1);
            if (!nb) { free(b); return NULL; }
            b = nb; cap *= 2;
        }
    }
    b[len] = 0;
    *n = len;
    return b;
}

/* text[0..n) (text[n] == 0, as read_all leaves it) as one JSON value with nothing but whitespace after it: the
 * value, or NULL with *off the byte offset of the error in text (n when the text ends early: the length given to
 * cJSON counts the terminating NUL, which it would otherwise report as the last byte, n - 1) */
static cJSON *parse_json(const char *text, size_t n, size_t *off) {
    const char *at = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, n + 1, &at, 0);
    if (root) {
        const char *e = at ? at : text + n;
        while (e < text + n && (*e == ' ' || *e == '\t' || *e == '\r' || *e == '\n')) e++;
        if (e < text + n) { cJSON_Delete(root); root = NULL; at = e; }
    }
    if (!root) *off = at && at >= text ? (size_t)(at - text) : 0;
    if (!root && strspn(text, " \t\r\n") >= n) *off = n; /* blanks alone: the value is missing at their end */
    if (*off > n) *off = n;
    return root;
}

/* the --tools file's text: one JSON array of tools, each checked as the server checks a request's "tools" (its
 * message, with the file named rather than --chat); 0, else -1 with the message printed (exit 1) */
static int check_tools(const char *path, const char *tools, size_t tn) {
    size_t off = 0;
    cJSON *root = parse_json(tools, tn, &off);
    if (!root) {
        fprintf(stderr, "deltafin tokenize: --tools %s: not valid JSON (error near byte %zu)\n", path, off);
        return -1;
    }
    const char *kind = cJSON_IsArray(root) ? NULL : cJSON_IsObject(root) ? "an object" : cJSON_IsString(root) ? "a string"
                       : cJSON_IsNumber(root) ? "a number" : cJSON_IsNull(root) ? "null" : "a boolean";
    cJSON_Delete(root);
    if (kind) {
        fprintf(stderr, "deltafin tokenize: --tools %s: expected a JSON array of tools "
                        "([{\"type\":\"function\",\"function\":{\"name\":...}}, ...]), not %s\n", path, kind);
        return -1;
    }
    static const char probe[] = "[{\"role\":\"user\",\"content\":\"\"}]"; /* the tools alone, with a minimal chat */
    char err[1024] = "", *msgs = NULL, *tj = NULL;
    int rc = srv_check_chat(probe, sizeof probe - 1, tools, &msgs, &tj, err, sizeof err);
    free(msgs);
    free(tj);
    if (rc) fprintf(stderr, "deltafin tokenize: --tools %s: %s\n", path, err);
    return rc ? -1 : 0;
}

static int print_ids(const int32_t *ids, size_t n) {
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    printf("\n");
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *tokfile = NULL, *config = NULL, *tools_path = NULL;
    int decode = 0, chat = 0, render = 0, flags = DF_TOK_PARSE_SPECIAL, cflags = DF_CHAT_ADD_GENERATION_PROMPT;
    int no_special = 0;
    const char *chat_only = NULL; /* an option that needs --chat */
    if (cli_check_repeated("tokenize", argc, argv, value_options, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(a, "--tokenizer") && i + 1 < argc) tokfile = argv[++i];
        else if (!strcmp(a, "--config") && i + 1 < argc) config = argv[++i];
        else if (!strcmp(a, "--tools") && i + 1 < argc) { tools_path = argv[++i]; chat_only = a; }
        else if (!strcmp(a, "--decode")) decode = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--render")) { render = 1; chat_only = a; }
        else if (!strcmp(a, "--thinking")) { cflags |= DF_CHAT_THINKING; chat_only = a; }
        else if (!strcmp(a, "--no-thinking")) { cflags |= DF_CHAT_NO_THINKING; chat_only = a; }
        else if (!strcmp(a, "--no-gen-prompt")) { cflags &= ~DF_CHAT_ADD_GENERATION_PROMPT; chat_only = a; }
        else if (!strcmp(a, "--parse-special")) { flags |= DF_TOK_PARSE_SPECIAL; no_special = 0; }
        else if (!strcmp(a, "--no-parse-special")) { flags &= ~DF_TOK_PARSE_SPECIAL; no_special = 1; }
        else if (!strcmp(a, "--add-bos")) flags |= DF_TOK_ADD_BOS;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (cli_known_option(a, value_options)) { fprintf(stderr, "deltafin tokenize: %s needs a value\n", a); return 2; }
        else return cli_unknown_option("tokenize", a, value_options, flag_options);
    }
    if (model && tokfile) { fprintf(stderr, "deltafin tokenize: give one of --model DIR or --tokenizer FILE, not both\n"); return 2; }
    char dflt_dir[4096], dflt_how[4600];
    if (model && cli_check_model_dir("tokenize", model)) return 1; /* run's message for a missing directory */
    if (!model && !tokfile) { /* the default model, as `run` without --model */
        if (cli_default_model("tokenize", dflt_dir, sizeof dflt_dir, dflt_how, sizeof dflt_how)) return 1;
        model = dflt_dir;
    }
    if (decode && chat) { fprintf(stderr, "deltafin tokenize: --decode and --chat do not combine\n"); return 2; }
    if (chat_only && !chat) {
        fprintf(stderr, "deltafin tokenize: %s applies only with --chat (see deltafin tokenize --help)\n", chat_only);
        return 2;
    }
    if ((cflags & DF_CHAT_THINKING) && (cflags & DF_CHAT_NO_THINKING)) {
        fprintf(stderr, "deltafin tokenize: --thinking and --no-thinking do not combine\n");
        return 2;
    }
    if (no_special && chat) {
        fprintf(stderr, "deltafin tokenize: --no-parse-special does not combine with --chat (the rendered prompt's "
                        "markers are special tokens)\n");
        return 2;
    }
    char err[1024] = "";
    df_tokenizer *t = NULL;
    int rc = df_tokenizer_open(&t, model ? model : tokfile, config, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin tokenize: %s\n", err); return 1; }
    size_t n;
    char *in = read_all(stdin, &n);
    if (!in) { fprintf(stderr, "deltafin tokenize: cannot read stdin\n"); df_tokenizer_free(t); return 1; }
    int status = 0;
    if (decode) {
        /* the ids as run --prompt-ids takes them (one parser, one set of messages); nothing but blanks is no ids:
         * empty text, as `tokenize` prints an empty line for empty text */
        int32_t *ids = NULL;
        size_t k = 0;
        size_t blank = strspn(in, " \t\r\n");
        if (in[blank] && cli_parse_ids(in, &ids, &k, err, sizeof err)) {
            fprintf(stderr, "deltafin tokenize --decode: %s\n", err);
            status = 1;
        }
        if (!status) {
            char *txt; size_t tl;
            rc = df_detokenize(t, ids, k, &txt, &tl, err, sizeof err);
            if (rc) { fprintf(stderr, "deltafin tokenize --decode: %s\n", err); status = 1; }
            else { fwrite(txt, 1, tl, stdout); free(txt); }
        }
        free(ids);
    } else {
        char *text = in, *rendered = NULL, *tools = NULL;
        size_t tl = n;
        /* text is UTF-8, as the server requires of a request: a bad byte is refused, not replaced */
        if (cli_check_utf8("tokenize", chat ? "the --chat input on stdin" : "the text on stdin", in, n)) status = 1;
        if (!status && chat) {
            size_t off = 0;
            cJSON *root = parse_json(in, n, &off);
            if (!root) {
                fprintf(stderr, "deltafin tokenize: --chat: stdin: the messages are not valid JSON (error near byte %zu): "
                                "expected a JSON list of messages, or {\"messages\": [...]}\n", off);
                status = 1;
            }
            cJSON_Delete(root);
            if (!status && tools_path) {
                FILE *f = fopen(tools_path, "rb");
                size_t tn = 0;
                if (!f || !(tools = read_all(f, &tn))) {
                    fprintf(stderr, "deltafin tokenize: cannot read --tools %s: %s\n", tools_path, strerror(errno));
                    status = 1;
                } else {
                    char what[4200];
                    snprintf(what, sizeof what, "--tools %s", tools_path);
                    if (cli_check_utf8("tokenize", what, tools, tn) || check_tools(tools_path, tools, tn)) status = 1;
                }
                if (f) fclose(f);
            }
            char *msgs = NULL, *tj = NULL;
            if (!status && srv_check_chat(in, n, tools, &msgs, &tj, err, sizeof err)) {
                fprintf(stderr, "deltafin tokenize: --chat: %s\n", err);
                status = 1;
            }
            if (!status) {
                rc = df_chat_render(t, msgs, tj, cflags, &rendered, err, sizeof err);
                if (rc) { fprintf(stderr, "deltafin tokenize: %s\n", err); status = 1; }
                else { text = rendered; tl = strlen(rendered); flags |= DF_TOK_PARSE_SPECIAL; }
            }
            free(msgs);
            free(tj);
        }
        if (!status && chat && render) fwrite(text, 1, tl, stdout);
        else if (!status) {
            int32_t *ids; size_t ni;
            rc = df_tokenize(t, text, tl, flags, &ids, &ni, err, sizeof err);
            if (rc) { fprintf(stderr, "deltafin tokenize: %s\n", err); status = 1; }
            else { print_ids(ids, ni); free(ids); }
        }
        free(rendered); free(tools);
    }
    free(in);
    df_tokenizer_free(t);
    return status;
}
