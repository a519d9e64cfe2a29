/* test_jinja.c — deltafin's Jinja subset against jinja2 in transformers'
 * environment (goldens: tools/tokenizer/make_jinja_goldens.py, run here with
 * python3 + jinja2 3.1.6).
 *
 *   tests/tokenizer/golden_jinja_cases.jsonl  one construct per template (whitespace
 *       control, scoping, expressions, filters, tests, methods, Undefined, errors):
 *       rendered text byte-identical, and an error wherever jinja2 raised.
 *   tests/tokenizer/golden_jinja.jsonl  the real chat templates of
 *       tests/tokenizer/templates/ (npm tokenizer packages, Kimi K2 / K2-Thinking /
 *       K3, gpt-oss) over a conversation set, through df_chat_render on a
 *       tokenizer directory whose tokenizer_config.json carries the template:
 *       byte-identical to apply_chat_template, DF_EINVAL where it raises.
 * Plus: constructs outside the subset are refused (DF_EUNSUPPORTED) naming the
 * construct and the line; chat_template.jinja beside the config wins over the
 * config's chat_template; a refused template does not stop the tokenizer
 * from opening; the object form's chat_template_kwargs and DF_CHAT_THINKING. */
#include "deltafin.h"
#include "tokenizer/jinja.h"
#include "test_util.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define TDIR "tests/tokenizer/templates"
#define CACHE "tests/.cache/jinja"

static char *slurp(const char *p, size_t *n) {
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long l = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    if (fread(b, 1, (size_t)l, f) != (size_t)l) { fclose(f); free(b); return NULL; }
    fclose(f);
    b[l] = 0;
    if (n) *n = (size_t)l;
    return b;
}

static void write_file(const char *p, const char *s) {
    FILE *f = fopen(p, "wb");
    if (!f) { fprintf(stderr, "cannot write %s: %s\n", p, strerror(errno)); return; }
    fputs(s, f);
    fclose(f);
}

static void mkdirs(const char *p) {
    char b[1024];
    snprintf(b, sizeof b, "%s", p);
    for (char *q = b + 1; *q; q++)
        if (*q == '/') { *q = 0; mkdir(b, 0755); *q = '/'; }
    mkdir(b, 0755);
}

/* next line of a buffer (modifies it); NULL at the end */
static char *next_line(char **cur) {
    char *s = *cur;
    if (!s || !*s) return NULL;
    char *e = strchr(s, '\n');
    if (e) { *e = 0; *cur = e + 1; } else *cur = s + strlen(s);
    return s;
}

/* ---------------------------------------------------------- unit cases */

static void test_cases(void) {
    char *txt = slurp("tests/tokenizer/golden_jinja_cases.jsonl", NULL);
    CHECK(txt != NULL, "tests/tokenizer/golden_jinja_cases.jsonl missing");
    if (!txt) return;
    char *cur = txt, *line = next_line(&cur);
    cJSON *first = cJSON_Parse(line);
    char *vars = strdup(cJSON_GetObjectItem(first, "vars")->valuestring); /* JSON text: 2.0 stays a float */
    int ok = 0, bad = 0, errs = 0;
    while ((line = next_line(&cur))) {
        cJSON *j = cJSON_Parse(line);
        const char *t = cJSON_GetObjectItem(j, "t")->valuestring;
        const cJSON *want = cJSON_GetObjectItem(j, "text");
        char err[1024] = "";
        jj_template *tp = NULL;
        char *out = NULL;
        int rc = jj_parse(t, strlen(t), &tp, err, sizeof err);
        if (!rc) rc = jj_render_json(tp, vars, strlen(vars), &out, NULL, err, sizeof err);
        if (want) {
            if (!rc && !strcmp(out, want->valuestring)) ok++;
            else {
                bad++;
                fprintf(stderr, "CASE %s\n  got:  %s\n  want: %s\n", t, rc ? err : out, want->valuestring);
            }
        } else {
            if (rc == DF_EINVAL && err[0]) errs++;
            else {
                bad++;
                fprintf(stderr, "CASE %s: jinja2 raised '%s', deltafin gave rc %d '%s'\n", t,
                        cJSON_GetObjectItem(j, "error")->valuestring, rc, rc ? err : out);
            }
        }
        free(out);
        jj_free(tp);
        cJSON_Delete(j);
    }
    printf("jinja cases: %d equal, %d errors matched, %d differ\n", ok, errs, bad);
    CHECK(bad == 0, "%d Jinja cases differ from jinja2", bad);
    CHECK(ok >= 90 && errs >= 25, "too few cases (%d, %d)", ok, errs);
    free(vars);
    cJSON_Delete(first);
    free(txt);
}

/* ------------------------------------------------- real chat templates */

#define MAXT 32
static struct { char name[64]; df_tokenizer *t; } toks[MAXT];
static int ntoks;

/* a tokenizer directory whose tokenizer_config.json carries the template */
static df_tokenizer *tok_for(const char *name, cJSON *special) {
    for (int i = 0; i < ntoks; i++) if (!strcmp(toks[i].name, name)) return toks[i].t;
    if (ntoks == MAXT) return NULL;
    char path[1024], dir[512];
    snprintf(path, sizeof path, TDIR "/%s.jinja", name);
    char *tmpl = slurp(path, NULL);
    CHECK(tmpl != NULL, "template %s missing", path);
    if (!tmpl) return NULL;
    snprintf(dir, sizeof dir, CACHE "/%s", name);
    mkdirs(dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_file(path, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}");
    cJSON *cfg = cJSON_Duplicate(cJSON_GetObjectItem(special, name), 1);
    if (!cfg) cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    char *cs = cJSON_Print(cfg);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    write_file(path, cs);
    free(cs);
    cJSON_Delete(cfg);
    free(tmpl);
    char err[512];
    df_tokenizer *t = NULL;
    int rc = df_tokenizer_open(&t, dir, NULL, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", dir, err);
    snprintf(toks[ntoks].name, sizeof toks[ntoks].name, "%s", name);
    toks[ntoks++].t = t;
    return t;
}

static void test_templates(void) {
    char *sp = slurp(TDIR "/special_tokens.json", NULL);
    cJSON *special = sp ? cJSON_Parse(sp) : NULL;
    free(sp);
    CHECK(special != NULL, TDIR "/special_tokens.json missing or invalid");
    char *txt = slurp("tests/tokenizer/golden_jinja.jsonl", NULL);
    CHECK(txt != NULL, "tests/tokenizer/golden_jinja.jsonl missing");
    if (!txt || !special) { free(txt); cJSON_Delete(special); return; }
    int ok = 0, errs = 0, bad = 0, per[MAXT] = {0};
    char *cur = txt, *line;
    while ((line = next_line(&cur))) {
        cJSON *j = cJSON_Parse(line);
        const char *name = cJSON_GetObjectItem(j, "tmpl")->valuestring;
        df_tokenizer *t = tok_for(name, special);
        if (!t) { bad++; cJSON_Delete(j); continue; }
        const cJSON *tools = cJSON_GetObjectItem(j, "tools");
        const char *msgs = cJSON_GetObjectItem(j, "messages")->valuestring;
        const char *kw = cJSON_GetObjectItem(j, "kwargs")->valuestring;
        size_t cap = strlen(msgs) + strlen(kw) + (cJSON_IsString(tools) ? strlen(tools->valuestring) : 0) + 128;
        char *obj = malloc(cap);
        snprintf(obj, cap, "{\"messages\": %s, \"tools\": %s, \"chat_template_kwargs\": %s}", msgs,
                 cJSON_IsString(tools) ? tools->valuestring : "null", kw);
        int flags = cJSON_IsTrue(cJSON_GetObjectItem(j, "gen")) ? DF_CHAT_ADD_GENERATION_PROMPT : 0;
        char err[1024] = "", *out = NULL;
        int rc = df_chat_render(t, obj, NULL, flags, &out, err, sizeof err);
        const cJSON *want = cJSON_GetObjectItem(j, "text");
        int k = 0;
        while (k < ntoks && strcmp(toks[k].name, name)) k++;
        if (want) {
            if (!rc && !strcmp(out, want->valuestring)) { ok++; per[k]++; }
            else {
                bad++;
                fprintf(stderr, "TEMPLATE %s / %s (gen %d, kwargs %s)\n  got:  %.1500s\n  want: %.1500s\n", name,
                        cJSON_GetObjectItem(j, "case")->valuestring, flags, kw, rc ? err : out, want->valuestring);
            }
        } else {
            if (rc == DF_EINVAL && strstr(err, "failed")) errs++;
            else {
                bad++;
                fprintf(stderr, "TEMPLATE %s / %s (kwargs %s): jinja2 raised '%s', deltafin rc %d: %.300s\n", name,
                        cJSON_GetObjectItem(j, "case")->valuestring, kw, cJSON_GetObjectItem(j, "error")->valuestring,
                        rc, rc ? err : out);
            }
        }
        free(out);
        free(obj);
        cJSON_Delete(j);
    }
    printf("chat templates: %d renderings equal, %d errors matched, %d differ;", ok, errs, bad);
    for (int i = 0; i < ntoks; i++) printf(" %s %d", toks[i].name, per[i]);
    printf("\n");
    CHECK(bad == 0, "%d template renderings differ from transformers", bad);
    CHECK(ntoks >= 10, "only %d templates", ntoks);
    for (int i = 0; i < ntoks; i++) CHECK(per[i] >= 10, "template %s: only %d goldens", toks[i].name, per[i]);
    free(txt);
    cJSON_Delete(special);
}

/* ----------------------------------------------------------- refusals */

static void expect_refused(const char *tmpl, const char *vars, const char *what, int line) {
    char err[512] = "", want_line[32];
    jj_template *tp = NULL;
    char *out = NULL;
    int rc = jj_parse(tmpl, strlen(tmpl), &tp, err, sizeof err);
    if (!rc) rc = jj_render_json(tp, vars, strlen(vars), &out, NULL, err, sizeof err);
    snprintf(want_line, sizeof want_line, "line %d:", line);
    CHECK(rc == DF_EUNSUPPORTED && strstr(err, what) && strstr(err, want_line),
          "'%s' should be refused naming '%s' at line %d: rc %d '%s'", tmpl, what, line, rc, err);
    free(out);
    jj_free(tp);
}

static void test_refusals(void) {
    expect_refused("a\n{% include 'other.jinja' %}", "{}", "include", 2);
    expect_refused("{% extends 'base' %}", "{}", "extends", 1);
    expect_refused("x\ny\n{% import 'm' as m %}", "{}", "import", 3);
    expect_refused("{% macro m() %}{{ caller() }}{% endmacro %}{% call m() %}x{% endcall %}", "{}", "caller", 1);
    expect_refused("{% for x in l recursive %}{{ x }}{% endfor %}", "{\"l\": [1]}", "recursive", 1);
    expect_refused("{{ l|groupby('a') }}", "{\"l\": []}", "filter 'groupby'", 1);
    expect_refused("\n\n{{ l|random }}", "{\"l\": [1]}", "filter 'random'", 3);
    expect_refused("{{ 'ab'.casefold() }}", "{}", "casefold", 1);
    expect_refused("{% if true %}\n{{ 'x'.encode() }}\n{% endif %}", "{}", "encode", 2);
    expect_refused("{{ f(*args) }}", "{}", "*args", 1);
    expect_refused("{{ 2 ** 100 }}", "{}", "64 bits", 1);
    expect_refused("{{ '{:>5}'.format(1) }}", "{}", "format spec", 1);
    expect_refused("{{ (1).bit_length() }}", "{}", "bit_length", 1);
    expect_refused("{% for a, (b, c) in l %}{% endfor %}", "{\"l\": []}", "nested tuple", 1);
    /* a construct in a branch that is not taken is not an error */
    jj_template *tp = NULL;
    char err[256] = "", *out = NULL;
    const char *t = "{% if false %}{{ 'x'.casefold() }}{% endif %}ok";
    int rc = jj_parse(t, strlen(t), &tp, err, sizeof err);
    if (!rc) rc = jj_render_json(tp, "{}", 2, &out, NULL, err, sizeof err);
    CHECK(rc == 0 && !strcmp(out, "ok"), "untaken branch: rc %d %s", rc, rc ? err : out);
    free(out);
    jj_free(tp);
}

/* ---------------------------------------------- loading and the API */

static df_tokenizer *open_dir(const char *dir, const char *cfg, const char *jinja_file) {
    mkdirs(dir);
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    write_file(p, "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}}");
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    write_file(p, cfg);
    snprintf(p, sizeof p, "%s/chat_template.jinja", dir);
    if (jinja_file) write_file(p, jinja_file); else remove(p);
    df_tokenizer *t = NULL;
    char err[512];
    int rc = df_tokenizer_open(&t, dir, NULL, err, sizeof err);
    CHECK(rc == 0, "open %s: %s", dir, err);
    return t;
}

static void test_loading(void) {
    char err[1024], *out = NULL;
    /* chat_template.jinja wins over the config's chat_template */
    df_tokenizer *t = open_dir(CACHE "/prio", "{\"bos_token\": \"<s>\", \"chat_template\": \"CONFIG\"}",
                               "FILE {{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}\n");
    if (t) {
        int rc = df_chat_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 0, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "FILE <s>[hi]"), "chat_template.jinja priority: rc %d '%s'", rc, rc ? err : out);
        free(out);
        df_tokenizer_free(t);
    }
    /* a list of named templates: "default" is used */
    t = open_dir(CACHE "/named", "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"},"
                                 " {\"name\": \"default\", \"template\": \"D{{ add_generation_prompt }}\"}]}", NULL);
    if (t) {
        int rc = df_chat_render(t, "[]", NULL, DF_CHAT_ADD_GENERATION_PROMPT, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "DTrue"), "named default template: rc %d '%s'", rc, rc ? err : out);
        free(out);
        df_tokenizer_free(t);
    }
    /* a refused template: the tokenizer opens, rendering names the file, construct and line */
    t = open_dir(CACHE "/refused", "{\"chat_template\": \"ok\\n{% include 'x' %}\"}", NULL);
    if (t) {
        int32_t *ids;
        size_t n;
        int rc = df_tokenize(t, "a", 1, 0, &ids, &n, err, sizeof err);
        CHECK(rc == 0 && n == 1, "tokenizer with a refused template still encodes");
        if (!rc) free(ids);
        rc = df_chat_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 0, &out, err, sizeof err);
        CHECK(rc == DF_EUNSUPPORTED && strstr(err, "tokenizer_config.json") && strstr(err, "include") &&
              strstr(err, "line 2"), "refused template: rc %d '%s'", rc, err);
        df_tokenizer_free(t);
    }
    /* raise_exception reaches the caller as DF_EINVAL with the template's message */
    t = open_dir(CACHE "/raises", "{\"chat_template\": \"{{ raise_exception('only ' ~ messages|length ~ ' messages') }}\"}", NULL);
    if (t) {
        int rc = df_chat_render(t, "[{\"role\":\"user\",\"content\":\"hi\"}]", NULL, 0, &out, err, sizeof err);
        CHECK(rc == DF_EINVAL && strstr(err, "only 1 messages"), "raise_exception: rc %d '%s'", rc, err);
        df_tokenizer_free(t);
    }
    /* DF_CHAT_THINKING -> enable_thinking / thinking True, DF_CHAT_NO_THINKING -> False, neither -> undefined
     * (transformers' default); chat_template_kwargs replace them; tools=None by default */
    t = open_dir(CACHE "/kwargs", "{\"chat_template\": \"{{ enable_thinking }}/{{ thinking }}/{{ tools }}/{{ documents }}/"
                                  "{{ x is defined }}/{{ messages[0].n }}/{{ reasoning_effort }}\"}", NULL);
    if (t) {
        const char *m = "[{\"role\":\"user\",\"content\":\"hi\",\"n\":1.0}]";
        int rc = df_chat_render(t, m, NULL, DF_CHAT_THINKING, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "True/True/None/None/False/1.0/high"), "thinking flag: '%s'", rc ? err : out);
        free(out);
        rc = df_chat_render(t, m, "[]", DF_CHAT_NO_THINKING, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "False/False/[]/None/False/1.0/"), "DF_CHAT_NO_THINKING: '%s'", rc ? err : out);
        free(out);
        rc = df_chat_render(t, m, "[]", 0, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "//[]/None/False/1.0/"), "no thinking flag (undefined): '%s'", rc ? err : out);
        free(out);
        out = NULL;
        rc = df_chat_render(t, m, NULL, DF_CHAT_THINKING | DF_CHAT_NO_THINKING, &out, err, sizeof err);
        CHECK(rc == DF_EINVAL && strstr(err, "together"), "both thinking flags: rc %d '%s'", rc, err);
        free(out);
        rc = df_chat_render(t, "{\"messages\": [{\"role\":\"user\",\"content\":\"x\",\"n\":2}], \"chat_template_kwargs\": "
                               "{\"x\": 1, \"thinking\": \"custom\"}}", NULL, DF_CHAT_THINKING, &out, err, sizeof err);
        CHECK(rc == 0 && !strcmp(out, "/custom/None/None/True/2/"), "chat_template_kwargs: '%s'", rc ? err : out);
        free(out);
        df_tokenizer_free(t);
    }
}

int main(void) {
    setenv("DF_CHAT_NOW", "1767225600", 1); /* strftime_now, as make_jinja_goldens.py pins it */
    setenv("TZ", "UTC", 1);
    tzset();
    mkdirs(CACHE);
    test_cases();
    test_templates();
    test_refusals();
    test_loading();
    for (int i = 0; i < ntoks; i++) df_tokenizer_free(toks[i].t);
    return t_done();
}
