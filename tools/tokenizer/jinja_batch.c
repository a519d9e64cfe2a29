/* jinja_batch.c — differential-test driver for deltafin's Jinja subset.
 * Reads JSON lines {"t": template, "v": {variables}} on stdin and writes one
 * JSON line per input: {"ok": rendered} or {"err": message, "rc": code}.
 * Build: cc -Iinclude -Isrc tools/tokenizer/jinja_batch.c src/tokenizer/jinja_*.c -lutf8proc -lcjson -lm
 * Used by tools/tokenizer/jinja_fuzz.py against jinja2 with transformers' environment. */
#include "tokenizer/jinja.h"
#include "deltafin.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(void) {
    size_t cap = 1 << 20, n;
    char *line = malloc(cap);
    while (1) {
        n = 0;
        int ch;
        while ((ch = getchar()) != EOF && ch != '\n') {
            if (n + 1 >= cap) { cap *= 2; line = realloc(line, cap); }
            line[n++] = (char)ch;
        }
        if (ch == EOF && !n) break;
        line[n] = 0;
        cJSON *j = cJSON_Parse(line), *o = cJSON_CreateObject();
        const char *t = cJSON_GetStringValue(cJSON_GetObjectItem(j, "t"));
        const char *vs = cJSON_GetStringValue(cJSON_GetObjectItem(j, "v"));
        char err[1024] = "";
        jj_template *tp = NULL;
        int rc = jj_parse(t ? t : "", t ? strlen(t) : 0, &tp, err, sizeof err);
        char *out = NULL;
        size_t ol = 0;
        if (!rc) rc = jj_render_json(tp, vs ? vs : "{}", vs ? strlen(vs) : 2, &out, &ol, err, sizeof err);
        if (rc) { cJSON_AddStringToObject(o, "err", err); cJSON_AddNumberToObject(o, "rc", rc); }
        else cJSON_AddStringToObject(o, "ok", out);
        char *s = cJSON_PrintUnformatted(o);
        puts(s);
        fflush(stdout);
        free(s); free(out);
        jj_free(tp);
        cJSON_Delete(j); cJSON_Delete(o);
    }
    free(line);
    return 0;
}
