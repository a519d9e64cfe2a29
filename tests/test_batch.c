/* test_batch.c — df_eval_batch: several sessions in one forward pass give each session exactly the
 * logits (bit for bit) and tokens of evaluating it alone. On tiny golden checkpoints of every mixer
 * kind (tests/golden: Kimi K2-style MLA + MoE, Kimi Linear and K3 with KDA layers), for 1, 4 and 8
 * sequences of different prompt and output lengths, greedy and seeded sampling, sequences joining
 * between steps (their prompt as its own batch, or in the same batch as the others' decode rows),
 * a truncated session (pending rows of a recurrent state) and the golden's own greedy ids; the KDA models again on
 * "cpu-kdacopy" (kda_copy_backend.h: the GPU's device copies of the KDA states emulated), with and without failing
 * calls; every case again on "cpu-devcache" (dev_cache_backend.h: the GPU's routed-expert tier emulated, experts
 * pinned from it beside others acquired from the store). */
#define _GNU_SOURCE
#include "deltafin.h"
#include "kda_copy_backend.h"
#include "dev_cache_backend.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAXS = 8, MAXP = 40, MAXG = 10 };

typedef struct {
    int np, ng;                  /* prompt length, tokens to generate */
    int32_t p[MAXP];
    int sample;                  /* 0 greedy, 1 seeded sampling */
    int32_t ids[MAXG];           /* generated (alone) */
    float *lg;                   /* [ng][V]: logits each token was drawn from (alone) */
} seqdef;

static df_sampler *new_sampler(const seqdef *d, int i) {
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    if (d->sample) { so.temperature = 0.9f; so.top_p = 0.95f; so.seed = 1000 + (uint64_t)i; }
    return df_sampler_new(&so);
}

/* golden.json's prompt_ids and greedy_ids */
static int read_golden(const char *dir, int32_t *p, int *np, int32_t *g, int *ng) {
    char path[1200];
    snprintf(path, sizeof path, "%s/golden.json", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (fread(b, 1, (size_t)n, f) != (size_t)n) { fclose(f); free(b); return -1; }
    fclose(f);
    b[n] = 0;
    cJSON *j = cJSON_Parse(b);
    free(b);
    if (!j) return -1;
    cJSON *pa = cJSON_GetObjectItem(j, "prompt_ids"), *ga = cJSON_GetObjectItem(j, "greedy_ids");
    *np = *ng = 0;
    for (int i = 0; i < cJSON_GetArraySize(pa) && i < MAXP; i++) p[(*np)++] = cJSON_GetArrayItem(pa, i)->valueint;
    for (int i = 0; i < cJSON_GetArraySize(ga) && i < MAXG; i++) g[(*ng)++] = cJSON_GetArrayItem(ga, i)->valueint;
    cJSON_Delete(j);
    return 0;
}

/* Reference: each sequence alone (prompt, then ng tokens drawn and fed back one at a time). */
static void run_alone(df_model *m, seqdef *d, int i, const char *name) {
    const int V = df_model_n_vocab(m);
    char err[512] = "";
    df_session *s = NULL;
    CHECK(df_session_new(&s, m, 0, err, sizeof err) == 0, "%s: session: %s", name, err);
    df_sampler *sm = new_sampler(d, i);
    int rc = df_eval(s, d->p, d->np, d->lg, 0, NULL, NULL, err, sizeof err);
    CHECK(rc == 0, "%s: alone prompt %d: %s", name, i, err);
    for (int k = 0; k < d->ng && !rc; k++) {
        d->ids[k] = df_sample(sm, d->lg + (size_t)k * V, V);
        if (k + 1 < d->ng) rc = df_eval(s, &d->ids[k], 1, d->lg + (size_t)(k + 1) * V, 0, NULL, NULL, err, sizeof err);
    }
    CHECK(rc == 0, "%s: alone decode %d: %s", name, i, err);
    df_sampler_free(sm);
    df_session_free(s);
}

/* Batched: sequence i joins at step i/2; joiners of even steps are prefilled as their own batch, those of
 * odd steps ride in the same batch as the decode rows. Every logits row and id must equal the alone run. */
static void run_batched(df_model *m, seqdef *d, int S, const char *name) {
    const int V = df_model_n_vocab(m);
    char err[512] = "";
    df_session *s[MAXS] = {0};
    df_sampler *sm[MAXS] = {0};
    int k_of[MAXS], joined[MAXS] = {0}, bad_logits = 0, bad_ids = 0, rc = 0, calls = 0;
    float *lg = malloc(sizeof(float) * (size_t)MAXS * V);
    for (int i = 0; i < S; i++) {
        CHECK(df_session_new(&s[i], m, 0, err, sizeof err) == 0, "%s: session: %s", name, err);
        sm[i] = new_sampler(&d[i], i);
        k_of[i] = 0;
    }
    int32_t last[MAXS];
    for (int step = 0; step < 64 && !rc; step++) {
        df_session *bs[MAXS];
        const int32_t *bi[MAXS];
        int bn[MAXS], who[MAXS], nb = 0, any = 0;
        if (step % 2 == 0) { /* this step's joiners alone in one batch first */
            for (int i = 0; i < S; i++)
                if (!joined[i] && i / 2 == step) { bs[nb] = s[i]; bi[nb] = d[i].p; bn[nb] = d[i].np; who[nb++] = i; }
            if (nb) {
                rc = df_eval_batch(bs, bi, bn, nb, lg, 0, err, sizeof err);
                calls++;
                CHECK(rc == 0, "%s: prefill batch: %s", name, err);
                for (int b = 0; b < nb && !rc; b++) {
                    const int i = who[b];
                    joined[i] = 1;
                    bad_logits += memcmp(lg + (size_t)b * V, d[i].lg, sizeof(float) * V) != 0;
                    last[i] = df_sample(sm[i], lg + (size_t)b * V, V);
                    bad_ids += last[i] != d[i].ids[0];
                    k_of[i] = 1;
                }
            }
            nb = 0;
        }
        for (int i = 0; i < S; i++) {
            if (joined[i] && k_of[i] < d[i].ng) { bs[nb] = s[i]; bi[nb] = &last[i]; bn[nb] = 1; who[nb++] = i; any = 1; }
            else if (!joined[i] && i / 2 == step) { bs[nb] = s[i]; bi[nb] = d[i].p; bn[nb] = d[i].np; who[nb++] = i; any = 1; }
        }
        if (!any) {
            int pending = 0;
            for (int i = 0; i < S; i++) pending |= !joined[i];
            if (!pending) break;
            continue;
        }
        rc = df_eval_batch(bs, bi, bn, nb, lg, 0, err, sizeof err);
        calls++;
        CHECK(rc == 0, "%s: batch step %d: %s", name, step, err);
        for (int b = 0; b < nb && !rc; b++) {
            const int i = who[b], k = joined[i] ? k_of[i] : 0;
            joined[i] = 1;
            bad_logits += memcmp(lg + (size_t)b * V, d[i].lg + (size_t)k * V, sizeof(float) * V) != 0;
            last[i] = df_sample(sm[i], lg + (size_t)b * V, V);
            bad_ids += last[i] != d[i].ids[k];
            k_of[i] = k + 1;
        }
    }
    int done = 1;
    for (int i = 0; i < S; i++) done &= k_of[i] == d[i].ng;
    CHECK(done, "%s: %d sequences: not every sequence finished", name, S);
    CHECK(bad_logits == 0, "%s: %d sequences: %d logits rows differ from evaluating alone", name, S, bad_logits);
    CHECK(bad_ids == 0, "%s: %d sequences: %d tokens differ from evaluating alone", name, S, bad_ids);
    printf("%s: %d sequences in %d batched calls: logits and tokens %s\n", name, S, calls,
           bad_logits || bad_ids ? "DIFFER from alone" : "identical to alone");

    /* truncation (a recurrent state restarts from its snapshot or zero, the rest are pending rows):
     * cut sequence 0 back by two prompt tokens and evaluate them with sequence 1's next token */
    if (S >= 2 && !rc) {
        const int32_t *tail = d[0].p + d[0].np - 2;
        df_session *s0 = NULL;
        rc = df_session_new(&s0, m, 0, err, sizeof err);
        float *ref = malloc(sizeof(float) * (size_t)2 * V);
        if (!rc) rc = df_eval(s0, d[0].p, d[0].np, ref, 0, NULL, NULL, err, sizeof err);
        df_session_truncate(s0, d[0].np - 2);
        df_session *bs[2] = {s0, s[1]};
        const int32_t *bi[2] = {tail, &d[1].p[0]};
        int bn[2] = {2, 1};
        float *lg2 = malloc(sizeof(float) * (size_t)3 * V);
        if (!rc) rc = df_eval_batch(bs, bi, bn, 2, lg2, DF_EVAL_ALL_LOGITS, err, sizeof err);
        CHECK(rc == 0, "%s: truncated batch: %s", name, err);
        CHECK(!rc && !memcmp(lg2 + (size_t)V, ref, sizeof(float) * V),
              "%s: a truncated session re-evaluated in a batch differs from its first evaluation", name);
        CHECK(df_session_n_past(s0) == d[0].np, "%s: n_past %d after the truncated batch", name, df_session_n_past(s0));
        free(lg2);
        free(ref);
        df_session_free(s0);
    }
    for (int i = 0; i < S; i++) { df_sampler_free(sm[i]); df_session_free(s[i]); }
    free(lg);
}

/* A progress callback that asks to stop at its first call from inside a layer: done == 0 (no layer finished yet),
 * or the same count twice in a row (after-layer calls advance it). */
static int stop_in_layer(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)what;
    (void)total;
    long long *last = user;
    const int stop = done == 0 || (long long)done == *last;
    *last = (long long)done;
    return stop;
}

/* df_eval of a 300-token prompt (two attention chunks of 256 rows: a progress tick inside each layer) cancelled from
 * inside a layer: DF_ECANCELLED naming the layer, nothing evaluated, and the session then gives the golden prompt's
 * logits bitwise as a fresh one (d->lg[0..V): run_alone's), the KDA state of a recurrent model included. */
static void cancel_in_layer(df_model *m, const seqdef *d, const char *name) {
    const int V = df_model_n_vocab(m);
    char err[512] = "";
    df_session *s = NULL;
    CHECK(df_session_new(&s, m, 0, err, sizeof err) == 0, "%s: session: %s", name, err);
    int32_t *p = malloc(sizeof(int32_t) * 300);
    float *lg = malloc(sizeof(float) * (size_t)V);
    for (int t = 0; t < 300; t++) p[t] = (int32_t)((t * 37 + 11) % V);
    long long last = -1;
    int rc = df_eval(s, p, 300, lg, 0, stop_in_layer, &last, err, sizeof err);
    CHECK(rc == DF_ECANCELLED && strstr(err, "cancelled in layer") && df_session_n_past(s) == 0,
          "%s: cancelled inside a layer: rc %d '%s', n_past %d", name, rc, err, df_session_n_past(s));
    rc = df_eval(s, d->p, d->np, lg, 0, NULL, NULL, err, sizeof err);
    CHECK(rc == 0 && !memcmp(lg, d->lg, sizeof(float) * (size_t)V),
          "%s: after the cancelled call the golden prompt's logits equal a fresh session's (%s)", name, err);
    free(p);
    free(lg);
    df_session_free(s);
}

static void run_case(const char *dir, const char *name, const char *backend) {
    char tmp[] = "/tmp/df_batch_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    char err[1024] = "";
    df_model_opts o;
    df_model_opts_default(&o);
    o.cache_dir = tmp;
    o.threads = 2;
    o.backend = backend;
    df_model *m = NULL;
    int rc = df_model_open(&m, dir, &o, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", name, err);
    if (!rc) {
        const int V = df_model_n_vocab(m);
        seqdef d[MAXS];
        int32_t gp[MAXP], gg[MAXG];
        int gnp = 0, gng = 0;
        CHECK(read_golden(dir, gp, &gnp, gg, &gng) == 0 && gnp >= 3, "%s: golden.json", name);
        uint64_t r = 88172645463325252ull;
        for (int i = 0; i < MAXS; i++) {
            memset(&d[i], 0, sizeof d[i]);
            d[i].sample = i % 2;
            d[i].ng = 3 + (i * 5) % 7;
            if (i == 0) { /* the golden prompt, greedy: its ids are the golden's */
                d[i].np = gnp;
                memcpy(d[i].p, gp, sizeof(int32_t) * gnp);
                d[i].ng = gng < MAXG ? gng : MAXG;
            } else {
                d[i].np = 2 + (i * 7) % 13;
                for (int t = 0; t < d[i].np; t++) {
                    r ^= r << 13; r ^= r >> 7; r ^= r << 17;
                    d[i].p[t] = (int32_t)(r % (uint64_t)V);
                }
            }
            d[i].lg = malloc(sizeof(float) * (size_t)d[i].ng * V);
            run_alone(m, &d[i], i, name);
        }
        int match = 0;
        while (match < d[0].ng && d[0].ids[match] == gg[match]) match++;
        CHECK(match == d[0].ng, "%s: greedy ids of the golden prompt: %d of %d match", name, match, d[0].ng);
        cancel_in_layer(m, &d[0], name);
        run_batched(m, d, 1, name);
        run_batched(m, d, 4, name);
        run_batched(m, d, 8, name);
        /* errors: one session twice; a session that would overflow (nothing evaluated) */
        df_session *a = NULL, *b = NULL;
        df_session_new(&a, m, 8, err, sizeof err);
        df_session_new(&b, m, 0, err, sizeof err);
        df_session *two[2] = {a, a};
        const int32_t *ti[2] = {d[1].p, d[1].p};
        int tn[2] = {1, 1};
        CHECK(df_eval_batch(two, ti, tn, 2, NULL, 0, err, sizeof err) == DF_EINVAL, "%s: same session twice", name);
        df_session *ab[2] = {b, a};
        int tn2[2] = {1, 9};
        const int32_t *ti2[2] = {d[1].p, gp};
        CHECK(gnp >= 9 && df_eval_batch(ab, ti2, tn2, 2, NULL, 0, err, sizeof err) == DF_ECONTEXT, "%s: overflow", name);
        CHECK(strstr(err, "sequence 1") != NULL, "%s: the overflow message names the sequence: %s", name, err);
        CHECK(df_session_n_past(a) == 0 && df_session_n_past(b) == 0, "%s: nothing evaluated on an error", name);
        df_session_free(a);
        df_session_free(b);
        for (int i = 0; i < MAXS; i++) free(d[i].lg);
        df_model_close(m);
    }
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd)) {}
}

int main(void) {
    const char *src = getenv("DF_SRC");
    if (src && chdir(src)) {}
    static const char *cases[] = {"bf16_kimi", "kl_bf16", "k3_a", "k3_c"};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/golden/%s", cases[i]);
        run_case(dir, cases[i], NULL);
    }
    /* the KDA models on the CPU with the GPU's device copies of their states emulated (kda_copy_backend.h: the
     * sequences of a batch in one kda_block call, each state kept under its key), with and without failing calls */
    kcb_register();
    for (int f = 0; f < 2; f++) {
        kcb_fail_every = f ? 3 : 0;
        kcb_calls = 0;
        kcb_n_kept = kcb_n_failed = 0;
        for (size_t i = 1; i < sizeof cases / sizeof *cases; i++) {
            char dir[256], name[160];
            snprintf(dir, sizeof dir, "tests/golden/%s", cases[i]);
            snprintf(name, sizeof name, "%s (cpu-kdacopy%s)", cases[i], f ? ", every 3rd call failing" : "");
            run_case(dir, name, "cpu-kdacopy");
        }
        CHECK(kcb_n_kept > 0 && (!f || kcb_n_failed > 0) && kcb_live() == 0,
              "cpu-kdacopy%s: states kept on the emulated device (%llu), failed calls (%llu), none left (%d)",
              f ? ", failing" : "", kcb_n_kept, kcb_n_failed, kcb_live());
    }
    /* every case on the CPU with the GPU's routed-expert tier emulated (dev_cache_backend.h): experts computed once
     * are pinned from the tier afterwards, the rest acquired from the store, in one batch */
    dcb_register();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char dir[256], name[160];
        snprintf(dir, sizeof dir, "tests/golden/%s", cases[i]);
        snprintf(name, sizeof name, "%s (cpu-devcache)", cases[i]);
        run_case(dir, name, "cpu-devcache");
    }
    CHECK(dcb_n_pinned > 0 && dcb_live() == 0, "cpu-devcache: experts pinned from the emulated tier (%llu), none left "
          "once the models closed (%d)", dcb_n_pinned, dcb_live());
    df_backend_register(NULL);
    return t_done();
}
