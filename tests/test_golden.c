/* test_golden.c — every tests/golden/<case>/ (tiny HF checkpoints + transformers
 * float64 outputs, see tools/reference/): open the HF dir through df_model_open
 * (converted into a temporary cache), evaluate prompt_ids with all logits and
 * assert max |logit - golden| <= 2e-3, then 20 greedy tokens == greedy_ids.
 * Also: explicit df_convert -> identical logits; T=1 decode vs one batched eval;
 * int8 spine (reported, not asserted). */
#define _GNU_SOURCE
#include "deltafin.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); fclose(f); return NULL; }
    b[n] = 0;
    fclose(f);
    return b;
}

typedef struct {
    int n_prompt, n_greedy, vocab, has_logits;
    int32_t *prompt;
    float *logits;      /* [n_prompt, vocab] */
    int32_t *greedy;
    double *margins;
} golden;

static int golden_load(const char *path, golden *g) {
    char *txt = slurp(path);
    if (!txt) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    cJSON *p = cJSON_GetObjectItem(j, "prompt_ids"), *pl = cJSON_GetObjectItem(j, "prompt_logits"),
          *gi = cJSON_GetObjectItem(j, "greedy_ids"), *gm = cJSON_GetObjectItem(j, "greedy_margins");
    if (!cJSON_IsArray(p) || !cJSON_IsArray(gi) || cJSON_GetArraySize(p) == 0) { cJSON_Delete(j); return -1; }
    g->n_prompt = cJSON_GetArraySize(p);
    g->n_greedy = cJSON_GetArraySize(gi);
    /* prompt_logits may be absent (ids-only goldens): then only the greedy ids are checked */
    g->has_logits = cJSON_IsArray(pl) && cJSON_GetArraySize(pl) == g->n_prompt;
    g->vocab = g->has_logits ? cJSON_GetArraySize(cJSON_GetArrayItem(pl, 0)) : 0;
    g->prompt = malloc(sizeof(int32_t) * g->n_prompt);
    g->greedy = malloc(sizeof(int32_t) * g->n_greedy);
    g->margins = calloc((size_t)g->n_greedy, sizeof(double));
    g->logits = malloc(sizeof(float) * (size_t)g->n_prompt * g->vocab);
    for (int i = 0; i < g->n_prompt; i++) {
        g->prompt[i] = cJSON_GetArrayItem(p, i)->valueint;
        cJSON *row = g->has_logits ? cJSON_GetArrayItem(pl, i) : NULL;
        for (int v = 0; row && v < g->vocab; v++) g->logits[(size_t)i * g->vocab + v] = (float)cJSON_GetArrayItem(row, v)->valuedouble;
    }
    for (int i = 0; i < g->n_greedy; i++) {
        g->greedy[i] = cJSON_GetArrayItem(gi, i)->valueint;
        if (cJSON_IsArray(gm) && i < cJSON_GetArraySize(gm)) g->margins[i] = cJSON_GetArrayItem(gm, i)->valuedouble;
    }
    cJSON_Delete(j);
    return 0;
}

static void golden_free(golden *g) { free(g->prompt); free(g->logits); free(g->greedy); free(g->margins); }

/* Evaluate the prompt (all logits) then n greedy steps. */
static int run_model(df_model *m, const golden *g, float *plog, int32_t *gen, char *err, size_t errlen) {
    df_session *s = NULL;
    int rc = df_session_new(&s, m, g->n_prompt + g->n_greedy + 1, err, errlen);
    if (rc) return rc;
    rc = df_eval(s, g->prompt, g->n_prompt, plog, DF_EVAL_ALL_LOGITS, NULL, NULL, err, errlen);
    int V = g->vocab;
    float *lg = malloc(sizeof(float) * V);
    memcpy(lg, plog + (size_t)(g->n_prompt - 1) * V, sizeof(float) * V);
    df_sampler *smp = df_sampler_new(NULL);
    for (int k = 0; !rc && k < g->n_greedy; k++) {
        gen[k] = df_sample(smp, lg, V);
        if (k + 1 < g->n_greedy) rc = df_eval(s, &gen[k], 1, lg, 0, NULL, NULL, err, errlen);
    }
    df_sampler_free(smp);
    free(lg);
    df_session_free(s);
    return rc;
}

/* df_decode_greedy's tokens, stopping at the stop_at-th (0 = never) */
typedef struct {
    int32_t *ids;
    int n, stop_at;
} greedy_got;

static int greedy_take(void *user, int32_t id) {
    greedy_got *g = user;
    g->ids[g->n++] = id;
    return g->stop_at && g->n == g->stop_at;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) { double d = fabs((double)a[i] - b[i]); if (d > m || d != d) m = d; }
    return m;
}

static void rm_rf(const char *p) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {}
}

static void run_case(const char *dir, const char *name) {
    char path[8400];
    golden g;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (golden_load(path, &g)) { CHECK(0, "%s: cannot read golden.json", name); return; }
    char tmp[] = "/tmp/df_golden_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char err[1024] = "";
    df_model_opts o;
    df_model_opts_default(&o);
    o.cache_dir = tmp;
    o.threads = 2;
    df_model *m = NULL;
    int rc = df_model_open(&m, dir, &o, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", name, err);
    if (rc) { golden_free(&g); rm_rf(tmp); return; }
    if (!g.has_logits) g.vocab = df_model_n_vocab(m);
    CHECK(df_model_n_vocab(m) == g.vocab, "%s: vocab %d vs golden %d", name, df_model_n_vocab(m), g.vocab);
    size_t NL = (size_t)g.n_prompt * g.vocab;
    float *plog = malloc(sizeof(float) * NL), *plog2 = malloc(sizeof(float) * NL);
    int32_t *gen = calloc((size_t)g.n_greedy, sizeof(int32_t)), *gen2 = calloc((size_t)g.n_greedy, sizeof(int32_t));
    rc = run_model(m, &g, plog, gen, err, sizeof err);
    CHECK(rc == 0, "%s: eval: %s", name, err);
    double md = g.has_logits ? max_diff(plog, g.logits, NL) : 0;
    int match = 0;
    while (match < g.n_greedy && gen[match] == g.greedy[match]) match++;
    if (g.has_logits) printf("%-28s prompt %2d tokens: max |logit diff| %.3g; greedy %d/%d match", name, g.n_prompt, md, match, g.n_greedy);
    else printf("%-28s prompt %2d tokens: (no prompt_logits in golden.json); greedy %d/%d match", name, g.n_prompt, match, g.n_greedy);
    if (match < g.n_greedy) printf(" (first mismatch step %d: %d vs %d, golden margin %.3g)", match, gen[match], g.greedy[match], g.margins[match]);
    printf("\n");
    CHECK(md <= 2e-3, "%s: max logit diff %g > 2e-3", name, md);
    CHECK(match == g.n_greedy, "%s: greedy tokens differ from step %d", name, match);

    /* T=1 decode of the prompt == one batched eval */
    {
        df_session *s = NULL;
        df_session_new(&s, m, g.n_prompt, err, sizeof err);
        double dd = 0;
        float *lg = malloc(sizeof(float) * g.vocab);
        for (int t = 0; t < g.n_prompt && s; t++) {
            rc = df_eval(s, &g.prompt[t], 1, lg, 0, NULL, NULL, err, sizeof err);
            if (rc) break;
            double d = max_diff(lg, plog + (size_t)t * g.vocab, g.vocab);
            if (d > dd) dd = d;
        }
        CHECK(rc == 0, "%s: decode: %s", name, err);
        printf("%-28s T=1 decode vs batched: max diff %.3g\n", "", dd);
        CHECK(dd == 0, "%s: T=1 decode differs from the batched eval by %g (must be identical)", name, dd);
        free(lg);
        df_session_free(s);
    }
    /* chunked prompt, then truncation and re-evaluation (prefix reuse): bit-identical logits.
     * For models with recurrent (KDA) layers this goes through the prompt snapshot and the
     * pending-token path of df_session_truncate. */
    if (g.n_prompt >= 4) {
        df_session *s = NULL;
        rc = df_session_new(&s, m, g.n_prompt + 4, err, sizeof err);
        float *lg = malloc(sizeof(float) * g.vocab);
        const int k = g.n_prompt / 2;
        const float *last = plog + (size_t)(g.n_prompt - 1) * g.vocab;
        double d1 = -1, d2 = -1, d3 = -1;
        if (!rc) rc = df_eval(s, g.prompt, k, lg, 0, NULL, NULL, err, sizeof err);
        if (!rc) rc = df_eval(s, g.prompt + k, g.n_prompt - k, lg, 0, NULL, NULL, err, sizeof err);
        if (!rc) d1 = max_diff(lg, last, g.vocab);
        /* back into the prompt (before the snapshot taken at its end) */
        if (!rc) rc = df_session_truncate(s, g.n_prompt - 2);
        if (!rc) rc = df_eval(s, g.prompt + g.n_prompt - 2, 2, lg, 0, NULL, NULL, err, sizeof err);
        if (!rc) d2 = max_diff(lg, last, g.vocab);
        /* a decode step past the prompt, then back to before the first chunk's end */
        if (!rc) rc = df_eval(s, &gen[0], 1, lg, 0, NULL, NULL, err, sizeof err);
        if (!rc) rc = df_session_truncate(s, k - 1);
        if (!rc) rc = df_eval(s, g.prompt + k - 1, g.n_prompt - (k - 1), lg, 0, NULL, NULL, err, sizeof err);
        if (!rc) d3 = max_diff(lg, last, g.vocab);
        CHECK(rc == 0, "%s: chunk/truncate: %s", name, err);
        printf("%-28s chunked %g, truncate+re-eval %g / %g (must be 0)\n", "", d1, d2, d3);
        CHECK(d1 == 0 && d2 == 0 && d3 == 0, "%s: chunked or truncated evaluation differs (%g %g %g)", name, d1, d2, d3);
        free(lg);
        df_session_free(s);
    }
    /* df_decode_greedy (on the GPU: the token chosen there, the next step queued before it is read back) == the
     * df_eval + argmax loop; stopped early, the session continues as after that loop (the queued step dropped) */
    if (g.n_greedy >= 6) {
        greedy_got gg = {calloc((size_t)g.n_greedy, sizeof(int32_t)), 0, 0};
        df_session *s = NULL;
        rc = df_session_new(&s, m, g.n_prompt + g.n_greedy + 1, err, sizeof err);
        if (!rc) rc = df_eval(s, g.prompt, g.n_prompt, NULL, 0, NULL, NULL, err, sizeof err);
        int got = -1;
        if (!rc) rc = df_decode_greedy(s, gen[0], g.n_greedy - 1, greedy_take, &gg, &got, err, sizeof err);
        const int got_all = got;
        CHECK(rc == 0 && got == g.n_greedy - 1 && !memcmp(gg.ids, gen + 1, sizeof(int32_t) * (size_t)(g.n_greedy - 1)) &&
                  df_session_n_past(s) == g.n_prompt + g.n_greedy - 1,
              "%s: df_decode_greedy: rc %d (%s), %d tokens, n_past %d", name, rc, err, got, s ? df_session_n_past(s) : -1);
        df_session_free(s);
        /* stop at the 3rd token, then a token of our own at the position the dropped step wrote */
        float *lg = malloc(sizeof(float) * g.vocab), *lp = malloc(sizeof(float) * g.vocab);
        const int32_t other = (gen[3] + 1) % g.vocab;
        gg.n = 0;
        gg.stop_at = 3;
        s = NULL;
        rc = df_session_new(&s, m, g.n_prompt + g.n_greedy + 1, err, sizeof err);
        if (!rc) rc = df_eval(s, g.prompt, g.n_prompt, NULL, 0, NULL, NULL, err, sizeof err);
        if (!rc) rc = df_decode_greedy(s, gen[0], g.n_greedy - 1, greedy_take, &gg, &got, err, sizeof err);
        const int np = s ? df_session_n_past(s) : -1;
        if (!rc) rc = df_eval(s, &other, 1, lg, 0, NULL, NULL, err, sizeof err);
        df_session_free(s);
        s = NULL;
        int rc2 = df_session_new(&s, m, g.n_prompt + g.n_greedy + 1, err, sizeof err);
        if (!rc2) rc2 = df_eval(s, g.prompt, g.n_prompt, NULL, 0, NULL, NULL, err, sizeof err);
        for (int k = 0; k < 3 && !rc2; k++) rc2 = df_eval(s, &gen[k], 1, NULL, 0, NULL, NULL, err, sizeof err);
        if (!rc2) rc2 = df_eval(s, &other, 1, lp, 0, NULL, NULL, err, sizeof err);
        df_session_free(s);
        const double dd = rc || rc2 ? -1 : max_diff(lg, lp, g.vocab);
        printf("%-28s df_decode_greedy %d/%d tokens; stopped at 3: n_past %d, next logits vs the loop's: max diff %g\n",
               "", got_all, g.n_greedy - 1, np, dd);
        CHECK(rc == 0 && rc2 == 0 && got == 3 && !memcmp(gg.ids, gen + 1, sizeof(int32_t) * 3) && np == g.n_prompt + 3 &&
                  dd == 0,
              "%s: df_decode_greedy stopped at 3: rc %d/%d (%s), %d tokens, n_past %d, logits diff %g", name, rc, rc2, err,
              got, np, dd);
        free(lg);
        free(lp);
        free(gg.ids);
    }
    df_model_close(m);

    /* explicit df_convert -> same output */
    {
        char nat[4200];
        snprintf(nat, sizeof nat, "%s/native", tmp);
        df_convert_opts co;
        df_convert_opts_default(&co);
        rc = df_convert(dir, nat, &co, err, sizeof err);
        CHECK(rc == 0, "%s: df_convert: %s", name, err);
        df_model *m2 = NULL;
        if (!rc) rc = df_model_open(&m2, nat, &o, err, sizeof err);
        CHECK(rc == 0, "%s: open native: %s", name, err);
        if (!rc) {
            rc = run_model(m2, &g, plog2, gen2, err, sizeof err);
            CHECK(rc == 0 && max_diff(plog, plog2, NL) == 0 && !memcmp(gen, gen2, sizeof(int32_t) * g.n_greedy),
                  "%s: converted-then-opened output differs (%g)", name, max_diff(plog, plog2, NL));
            df_model_close(m2);
        }
    }
    /* int8 spine: reported only */
    {
        df_model_opts o8 = o;
        o8.spine = DF_SPINE_INT8;
        df_model *m8 = NULL;
        rc = df_model_open(&m8, dir, &o8, err, sizeof err);
        if (rc == 0) {
            CHECK(!df_model_is_exact(m8), "%s: int8 spine must be labeled not exact", name);
            rc = run_model(m8, &g, plog2, gen2, err, sizeof err);
            int mt = 0;
            while (mt < g.n_greedy && gen2[mt] == g.greedy[mt]) mt++;
            printf("%-28s int8 spine (NOT EXACT): max |logit diff| %.3g, greedy %d/%d match\n", "",
                   g.has_logits ? max_diff(plog2, g.logits, NL) : max_diff(plog2, plog, NL), mt, g.n_greedy);
            df_model_close(m8);
        } else {
            printf("%-28s int8 spine: cannot open (%s)\n", "", err);
        }
    }
    free(plog); free(plog2); free(gen); free(gen2);
    golden_free(&g);
    rm_rf(tmp);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    const char *src = getenv("DF_SRC");
    char root[4096];
    snprintf(root, sizeof root, "%s/tests/golden", src && *src ? src : ".");
    DIR *d = opendir(root);
    char *names[256];
    int n = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < 256) {
            if (e->d_name[0] == '.') continue;
            char p[8192];
            snprintf(p, sizeof p, "%s/%s/golden.json", root, e->d_name);
            struct stat st;
            if (stat(p, &st) == 0) names[n++] = strdup(e->d_name);
        }
        closedir(d);
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    printf("%d golden cases under %s\n", n, root);
    for (int i = 0; i < n; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", root, names[i]);
        run_case(p, names[i]);
        free(names[i]);
    }
    if (n == 0) printf("no golden cases yet (tools/reference/ writes them)\n");
    return t_done();
}
