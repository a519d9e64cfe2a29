/* test_spine_stream.c — spine streaming under --ram-budget (issue 4): for every
 * tests/golden/<case>/ and models/kimi-mini (HF dirs converted into a mkdtemp
 * cache), a budget below the whole spine's needs makes df_model_open keep a
 * prefix of layers resident and stream the rest; prompt logits (all positions)
 * and greedy ids must be bit-identical (memcmp) to the unbudgeted run, at the
 * streaming minimum and at budgets between it and the fully resident one. A
 * budget one byte below the minimum is DF_EBUDGET and the message states it. */
#define _GNU_SOURCE
#include "deltafin.h"
#include "test_util.h"

#include <dirent.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define N_PROMPT 7
#define N_GREEDY 6

static void rm_rf(const char *p) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", p);
}

typedef struct {
    float *logits;   /* [N_PROMPT, V] */
    int32_t ids[N_GREEDY];
    int V;
} result;

static int open_model(df_model **m, const char *dir, const char *cache, uint64_t budget, char *err, size_t errlen) {
    df_model_opts o;
    df_model_opts_default(&o);
    o.cache_dir = cache;
    o.threads = 2;
    o.ram_budget = budget;
    o.kv_positions = N_PROMPT + N_GREEDY + 1;
    o.heat_path = "off";
    return df_model_open(m, dir, &o, err, errlen);
}

static int run(df_model *m, result *r, char *err, size_t errlen) {
    int V = df_model_n_vocab(m);
    r->V = V;
    r->logits = calloc((size_t)N_PROMPT * V, sizeof(float));
    float *lg = malloc(sizeof(float) * V);
    int32_t prompt[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) prompt[i] = (int32_t)((i * 37 + 11) % V);
    df_session *s = NULL;
    int rc = df_session_new(&s, m, N_PROMPT + N_GREEDY + 1, err, errlen);
    if (!rc) rc = df_eval(s, prompt, N_PROMPT, r->logits, DF_EVAL_ALL_LOGITS, NULL, NULL, err, errlen);
    const float *last = r->logits + (size_t)(N_PROMPT - 1) * V;
    for (int g = 0; !rc && g < N_GREEDY; g++) {
        int best = 0;
        for (int v = 1; v < V; v++)
            if (last[v] > last[best]) best = v;
        r->ids[g] = best;
        rc = df_eval(s, &r->ids[g], 1, lg, 0, NULL, NULL, err, errlen);
        last = lg;
    }
    df_session_free(s);
    free(lg);
    return rc;
}

/* "= N bytes" in a DF_EBUDGET message */
static uint64_t parse_min(const char *msg) {
    const char *p = strstr(msg, ") = ");
    if (!p) return 0;
    return strtoull(p + 4, NULL, 10);
}

static void one_case(const char *dir, const char *label) {
    char cache[] = "/tmp/df_test_sst.XXXXXX";
    if (!mkdtemp(cache)) { CHECK(0, "mkdtemp"); return; }
    char err[2048] = "";
    df_model *m = NULL;
    result ref = {0};
    int rc = open_model(&m, dir, cache, 0, err, sizeof err);
    CHECK(rc == DF_OK, "%s: open unbudgeted: %s", label, err);
    if (rc) goto out;
    rc = run(m, &ref, err, sizeof err);
    CHECK(rc == DF_OK, "%s: unbudgeted run: %s", label, err);
    df_model_close(m);
    m = NULL;
    if (rc) goto out;

    /* the minimum (all spine layers streamed, typically) */
    rc = open_model(&m, dir, cache, 1, err, sizeof err);
    CHECK(rc == DF_EBUDGET && strstr(err, "spine streaming"), "%s: budget 1 byte: rc %d: %s", label, rc, err);
    df_model_close(m);
    m = NULL;
    uint64_t min = parse_min(err);
    CHECK(min > 0, "%s: no minimum in \"%s\"", label, err);
    if (!min) goto out;
    rc = open_model(&m, dir, cache, min - 1, err, sizeof err);
    CHECK(rc == DF_EBUDGET && parse_min(err) == min, "%s: budget min-1: rc %d: %s", label, rc, err);
    df_model_close(m);
    m = NULL;

    /* from the minimum up to the first budget where the whole spine is resident */
    int last_res = -1, n_stream_runs = 0, saw_resident = 0;
    for (uint64_t b = min; b < min * 4; b += min / 24 + 1) {
        rc = open_model(&m, dir, cache, b, err, sizeof err);
        CHECK(rc == DF_OK, "%s: budget %llu (>= minimum %llu): %s", label, (unsigned long long)b, (unsigned long long)min, err);
        if (rc) break;
        const char *d = df_model_describe(m);
        const char *sp = strstr(d, "spine resident ");
        if (!sp) { /* fully resident from here on */
            saw_resident = 1;
            df_model_close(m);
            m = NULL;
            break;
        }
        int res = atoi(sp + strlen("spine resident "));
        if (res != last_res) {  /* one comparison per resident-layer count */
            last_res = res;
            result r = {0};
            rc = run(m, &r, err, sizeof err);
            CHECK(rc == DF_OK, "%s: streaming run (budget %llu): %s", label, (unsigned long long)b, err);
            if (!rc) {
                CHECK(!memcmp(r.logits, ref.logits, sizeof(float) * (size_t)N_PROMPT * ref.V),
                      "%s: prompt logits differ with %d resident layers (budget %llu)", label, res, (unsigned long long)b);
                CHECK(!memcmp(r.ids, ref.ids, sizeof r.ids), "%s: greedy ids differ with %d resident layers", label, res);
                df_stats st;
                df_model_stats(m, &st);
                CHECK(st.resident_bytes > 0 && st.resident_bytes <= b, "%s: resident %llu bytes > budget %llu", label,
                      (unsigned long long)st.resident_bytes, (unsigned long long)b);
                n_stream_runs++;
            }
            free(r.logits);
        }
        df_model_close(m);
        m = NULL;
    }
    CHECK(n_stream_runs >= 1, "%s: no streaming layout was exercised", label);
    CHECK(saw_resident, "%s: no budget up to 4x the minimum kept the whole spine resident", label);
    printf("%s: minimum %llu bytes, %d streaming layouts bit-identical\n", label, (unsigned long long)min, n_stream_runs);
out:
    df_model_close(m);
    free(ref.logits);
    rm_rf(cache);
}

int main(void) {
    const char *src = getenv("DF_SRC");
    char root[4096];
    snprintf(root, sizeof root, "%s", src && *src ? src : ".");
    char gdir[4200];
    snprintf(gdir, sizeof gdir, "%s/tests/golden", root);
    DIR *d = opendir(gdir);
    CHECK(d != NULL, "cannot open %s", gdir);
    int n = 0;
    struct dirent *de;
    char names[64][NAME_MAX + 1];
    while (d && (de = readdir(d)) && n < 64) {
        if (de->d_name[0] == '.') continue;
        char p[4600];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s/config.json", gdir, de->d_name);
        if (stat(p, &st) == 0) snprintf(names[n++], sizeof names[0], "%s", de->d_name);
    }
    if (d) closedir(d);
    for (int i = 0; i < n; i++) {
        char p[4600];
        snprintf(p, sizeof p, "%s/%.255s", gdir, names[i]);
        one_case(p, names[i]);
    }
    CHECK(n >= 7, "only %d golden cases found", n);
    char km[4400];
    snprintf(km, sizeof km, "%s/models/kimi-mini", root);
    one_case(km, "kimi-mini");
    return t_done();
}
