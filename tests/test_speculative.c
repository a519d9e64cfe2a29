/* test_speculative.c — speculative decoding (deltafin.h df_spec_*, df_drafter_*) gives the
 * very tokens plain decoding gives, and leaves the session in the exact state plain decoding
 * leaves it in:
 *   - every tests/golden/<case>/ (tiny HF checkpoints; KDA models included): 24 greedy tokens
 *     with the n-gram drafter and with a test drafter that proposes the plain continuation
 *     with every fifth position wrong (full acceptance, partial rejection, rollback of the KV
 *     cache and of the KDA state) == plain decode; the logits of one more token after the
 *     generation are bitwise equal (the rolled-back state is exact); seeded sampling
 *     (temperature 0.9, top-p 0.95) == plain seeded sampling, and again on a second run;
 *   - the KDA cases again on "cpu-kdacopy" (kda_copy_backend.h: the GPU's device copies of the KDA states and their
 *     rollback snapshots emulated on the host), with copies, with every 3rd call failing, with room for two copies,
 *     and with no room for snapshots: the same checks, and the emulated device's counters show each path taken;
 *   - a KDA model drafting for a KDA model (k3_a + k3_b, kl_mxfp4 + kl_bf16) on the default backend, on cpu-kdacopy
 *     and on "cpu-devcache" (dev_cache_backend.h: the GPU's routed-expert tier emulated on the host): == plain
 *     decode, and the draft model's tokens and logits bitwise those of the model opened alone (two models' experts
 *     never mixed in a device cache), the target's greedy its golden's;
 *   - models/kimi-mini with models/kimi-mini-draft: 20 text prompts, 32 greedy tokens with the
 *     draft model == plain decode; seeded sampling on 4 of them; the re-tokenizing drafter
 *     (the draft through its own tokenizer) on 4; the n-gram drafter on a repetitive prompt
 *     (acceptance asserted > 0); sampled drafts (df_drafter_set_sampling) reproducible with a seed;
 *   - the min(1, p/q) acceptance rule itself: its output follows p (Monte Carlo), acceptance = sum min(p, q).
 * Gating is off here (it only decides when to draft, never what is output) except in one
 * pass that checks the output is still identical with it on. */
#define _GNU_SOURCE
#include "deltafin.h"
#include "engine/draft.h"
#include "kda_copy_backend.h"
#include "dev_cache_backend.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

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

static void rm_rf(const char *p) {
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", p);
    if (system(cmd)) {}
}

/* prompt -> n_gen tokens by plain decoding; then the logits of one more eval (of the last token) */
static int plain_gen(df_model *m, const int32_t *prompt, int np, int n_gen, const df_sampler_opts *so, int32_t *out,
                     float *final) {
    char err[512];
    const int V = df_model_n_vocab(m);
    df_session *s = NULL;
    int rc = df_session_new(&s, m, np + n_gen + 1, err, sizeof err);
    float *lg = malloc(sizeof(float) * V);
    df_sampler *smp = df_sampler_new(so);
    if (!rc) rc = df_eval(s, prompt, np, lg, 0, NULL, NULL, err, sizeof err);
    for (int k = 0; !rc && k < n_gen; k++) {
        out[k] = df_sample(smp, lg, V);
        rc = df_eval(s, &out[k], 1, k + 1 == n_gen ? final : lg, 0, NULL, NULL, err, sizeof err);
    }
    if (rc) fprintf(stderr, "plain_gen: %s\n", err);
    df_sampler_free(smp);
    free(lg);
    df_session_free(s);
    return rc;
}

/* the same through df_spec_step with drafter d (NULL: none) */
static int spec_gen(df_model *m, df_drafter *d, const df_spec_opts *o, const int32_t *prompt, int np, int n_gen,
                    const df_sampler_opts *so, int32_t *out, float *final, df_spec_stats *st) {
    char err[512] = "";
    const int V = df_model_n_vocab(m);
    df_session *s = NULL;
    df_spec *g = NULL;
    int rc = df_session_new(&s, m, np + n_gen + 1, err, sizeof err);
    float *lg = malloc(sizeof(float) * V);
    df_sampler *smp = df_sampler_new(so);
    if (!rc) rc = df_spec_new(&g, s, d, smp, o, err, sizeof err);
    if (!rc) rc = df_eval(s, prompt, np, lg, 0, NULL, NULL, err, sizeof err);
    int n = 0;
    if (!rc) out[n++] = df_sample(smp, lg, V);
    while (!rc && n < n_gen) {
        int r = df_spec_step(g, out[n - 1], out + n, n_gen - n, err, sizeof err);
        if (r <= 0) { rc = r ? r : -1; break; }
        n += r;
    }
    /* the session holds the prompt + all but the last token: exactly those */
    if (!rc && (df_session_n_past(s) != np + n_gen - 1 || memcmp(df_session_tokens(s), prompt, sizeof(int32_t) * np) ||
                memcmp(df_session_tokens(s) + np, out, sizeof(int32_t) * (n_gen - 1)))) {
        fprintf(stderr, "spec_gen: the session holds %d tokens, expected %d (or other ids)\n", df_session_n_past(s), np + n_gen - 1);
        rc = -100;
    }
    if (!rc) rc = df_eval(s, &out[n_gen - 1], 1, final, 0, NULL, NULL, err, sizeof err);
    if (rc && rc != -100) fprintf(stderr, "spec_gen: %d %s\n", rc, err);
    df_spec_get_stats(g, st);
    df_spec_free(g);
    df_sampler_free(smp);
    free(lg);
    df_session_free(s);
    return rc;
}

/* A test drafter: proposes ref[n..] (the plain continuation) with every position p where
 * p % 5 == 3 changed, so verification sees full acceptances and rejections at every offset. */
typedef struct {
    struct df_drafter base;
    const int32_t *ref;
    int n_ref, V;
} oracle_drafter;

static int oracle_draft(df_drafter *d, const int32_t *hist, int n, int k, int32_t *out, float *q, char *err, size_t errlen) {
    oracle_drafter *o = (oracle_drafter *)d;
    int c = 0;
    for (int p = n; p < o->n_ref && c < k; p++) out[c++] = p % 5 == 3 ? (o->ref[p] + 1) % o->V : o->ref[p];
    return c;
}
static void oracle_destroy(df_drafter *d) { (void)d; }

static int same_logits(const float *a, const float *b, int V) { return !memcmp(a, b, sizeof(float) * V); }

/* One prompt on model m: plain vs each drafter given; label names the case. */
typedef struct {
    const char *name;
    df_drafter *d;
    df_spec_opts o;
    int want_accept;        /* assert accepted > 0 */
    int want_reject;        /* assert accepted < drafted */
} drafter_case;

/* The drafting options of the golden cases: k fixed at 4 (fixed) and adaptive up to 6 (adapt), the gate off. */
static void spec_opts_fixed_adapt(df_spec_opts *fixed, df_spec_opts *adapt) {
    df_spec_opts_default(fixed);
    fixed->gate = 0;
    fixed->adaptive = 0;
    fixed->k_max = 4;
    *adapt = *fixed;
    adapt->adaptive = 1;
    adapt->k_max = 6;
}

static void compare(df_model *m, const char *label, const int32_t *prompt, int np, int n_gen, const df_sampler_opts *so,
                    drafter_case *dc, int ndc) {
    const int V = df_model_n_vocab(m);
    int32_t *ref = malloc(sizeof(int32_t) * n_gen), *got = malloc(sizeof(int32_t) * n_gen);
    float *fr = malloc(sizeof(float) * V), *fg = malloc(sizeof(float) * V);
    int rc = plain_gen(m, prompt, np, n_gen, so, ref, fr);
    CHECK(rc == 0, "%s: plain decode failed", label);
    if (rc) goto out;
    /* the oracle drafter proposes this plain continuation (with its deliberate errors) */
    int32_t *full = malloc(sizeof(int32_t) * (size_t)(np + n_gen));
    memcpy(full, prompt, sizeof(int32_t) * np);
    memcpy(full + np, ref, sizeof(int32_t) * n_gen);
    for (int i = 0; i < ndc; i++)
        if (!strcmp(dc[i].d->kind, "oracle")) { ((oracle_drafter *)dc[i].d)->ref = full; ((oracle_drafter *)dc[i].d)->n_ref = np + n_gen; }
    for (int i = 0; i < ndc; i++) {
        df_spec_stats st;
        memset(got, 0xff, sizeof(int32_t) * n_gen);
        rc = spec_gen(m, dc[i].d, &dc[i].o, prompt, np, n_gen, so, got, fg, &st);
        int match = 0;
        while (match < n_gen && got[match] == ref[match]) match++;
        CHECK(rc == 0, "%s %s: speculative decode failed (%d)", label, dc[i].name, rc);
        CHECK(match == n_gen, "%s %s: tokens differ from plain decode at %d (%d vs %d)", label, dc[i].name, match,
              match < n_gen ? got[match] : 0, match < n_gen ? ref[match] : 0);
        CHECK(rc || same_logits(fr, fg, V), "%s %s: the state after generation differs (next logits not bitwise equal)", label, dc[i].name);
        if (dc[i].want_accept) CHECK(st.accepted > 0, "%s %s: nothing accepted (%llu drafted)", label, dc[i].name, (unsigned long long)st.drafted);
        if (dc[i].want_reject) CHECK(st.accepted < st.drafted, "%s %s: no rejection exercised", label, dc[i].name);
        printf("  %-34s %-10s %2d tokens: drafted %3llu accepted %3llu in %2llu verifications, %2llu plain steps%s\n", label,
               dc[i].name, n_gen, (unsigned long long)st.drafted, (unsigned long long)st.accepted,
               (unsigned long long)st.verify_calls, (unsigned long long)st.plain_steps, match == n_gen ? "" : "  MISMATCH");
    }
    free(full);
out:
    free(ref); free(got); free(fr); free(fg);
}

/* ------------------------------------------------------------ golden cases */

static int read_golden(const char *path, int32_t **prompt, int *np, int32_t **greedy, int *ng) {
    char *txt = slurp(path);
    if (!txt) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    cJSON *p = cJSON_GetObjectItem(j, "prompt_ids"), *gi = cJSON_GetObjectItem(j, "greedy_ids");
    if (!cJSON_IsArray(p) || !cJSON_IsArray(gi)) { cJSON_Delete(j); return -1; }
    *np = cJSON_GetArraySize(p);
    *ng = cJSON_GetArraySize(gi);
    *prompt = malloc(sizeof(int32_t) * (*np + 1));
    *greedy = malloc(sizeof(int32_t) * (*ng + 1));
    for (int i = 0; i < *np; i++) (*prompt)[i] = cJSON_GetArrayItem(p, i)->valueint;
    for (int i = 0; i < *ng; i++) (*greedy)[i] = cJSON_GetArrayItem(gi, i)->valueint;
    cJSON_Delete(j);
    return 0;
}

static void golden_case(const char *dir, const char *name, const char *backend) {
    enum { NG = 24 };
    char path[8600], err[1024] = "";
    int32_t *prompt = NULL, *greedy = NULL;
    int np = 0, ng = 0;
    snprintf(path, sizeof path, "%s/golden.json", dir);
    if (read_golden(path, &prompt, &np, &greedy, &ng)) { CHECK(0, "%s: cannot read golden.json", name); return; }
    char tmp[] = "/tmp/df_spec_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.cache_dir = tmp;
    mo.threads = 2;
    mo.backend = backend;
    df_model *m = NULL;
    int rc = df_model_open(&m, dir, &mo, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", name, err);
    if (rc) goto done;
    const int V = df_model_n_vocab(m);
    /* the plain greedy continuation (the oracle's reference), checked against the golden's ids */
    int32_t *ref = malloc(sizeof(int32_t) * (np + NG));
    float *fin = malloc(sizeof(float) * V);
    df_sampler_opts greedy_o;
    df_sampler_opts_default(&greedy_o);
    memcpy(ref, prompt, sizeof(int32_t) * np);
    rc = plain_gen(m, prompt, np, NG, &greedy_o, ref + np, fin);
    int m20 = 0;
    while (m20 < ng && m20 < NG && ref[np + m20] == greedy[m20]) m20++;
    CHECK(rc == 0 && m20 == (ng < NG ? ng : NG), "%s: plain greedy differs from the golden at %d", name, m20);

    df_drafter *ng_d = NULL, *ng1_d = NULL;
    CHECK(df_drafter_ngram_new(&ng_d, 0, 0, err, sizeof err) == 0, "ngram: %s", err);
    CHECK(df_drafter_ngram_new(&ng1_d, 3, 1, err, sizeof err) == 0, "ngram 3..1: %s", err);
    oracle_drafter od = {{"oracle", 0, 0, oracle_draft, oracle_destroy, 0}, ref, np + NG, V};
    df_spec_opts fixed, adapt, gated;
    spec_opts_fixed_adapt(&fixed, &adapt);
    gated = adapt;
    gated.gate = 1;
    drafter_case dc[] = {
        {"oracle", &od.base, fixed, 1, 1},
        {"ngram", ng_d, adapt, 0, 0},
        {"ngram3..1", ng1_d, adapt, 0, 0},
        {"oracle-adk", &od.base, adapt, 1, 1},
        {"oracle-gate", &od.base, gated, 0, 0},
    };
    char label[256];
    snprintf(label, sizeof label, "%s greedy", name);
    compare(m, label, prompt, np, NG, &greedy_o, dc, 5);
    /* seeded sampling: the same sample as plain decoding with the seed, twice */
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    so.temperature = 0.9f;
    so.top_p = 0.95f;
    so.seed = 4242;
    snprintf(label, sizeof label, "%s seed 4242", name);
    compare(m, label, prompt, np, NG, &so, dc, 3);
    compare(m, label, prompt, np, NG, &so, dc, 1);
    df_drafter_free(ng_d);
    df_drafter_free(ng1_d);
    free(ref);
    free(fin);
    df_model_close(m);
done:
    free(prompt);
    free(greedy);
    rm_rf(tmp);
}

/* A KDA model drafting for a KDA model (two models' recurrent states, each session marking and rolling back its own):
 * target and draft goldens of one vocabulary, greedy and seeded, plain vs drafted on `backend`. */
static void kda_draft_model_case(const char *gdir, const char *target, const char *draft, const char *backend) {
    char tp[4400], dp[4400], tmp[] = "/tmp/df_spec_XXXXXX", err[1024] = "", label[300];
    snprintf(tp, sizeof tp, "%s/%s", gdir, target);
    snprintf(dp, sizeof dp, "%s/%s", gdir, draft);
    int32_t *prompt = NULL, *greedy = NULL;
    int np = 0, ng = 0;
    char gj[4500];
    snprintf(gj, sizeof gj, "%s/golden.json", tp);
    if (read_golden(gj, &prompt, &np, &greedy, &ng)) { CHECK(0, "%s: cannot read golden.json", target); return; }
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.cache_dir = tmp;
    mo.threads = 2;
    mo.backend = backend;
    df_model *m = NULL, *dm = NULL;
    df_drafter *dd = NULL;
    /* the draft model's own greedy continuation and next logits, opened alone: the same bits are expected after it
     * drafted for the target on the same backend (the two models' weights never mixed in a device cache) */
    enum { NA = 12 };
    int32_t alone[NA], after[NA];
    float *fa = NULL, *fb = NULL;
    df_sampler_opts g0;
    df_sampler_opts_default(&g0);
    int rc = df_model_open(&dm, dp, &mo, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", draft, err);
    if (!rc) {
        fa = malloc(sizeof(float) * df_model_n_vocab(dm));
        fb = malloc(sizeof(float) * df_model_n_vocab(dm));
        rc = plain_gen(dm, prompt, np, NA, &g0, alone, fa);
        CHECK(rc == 0, "%s alone: plain decode failed", draft);
        df_model_close(dm);
        dm = NULL;
    }
    if (!rc) rc = df_model_open(&m, tp, &mo, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", target, err);
    if (!rc) rc = df_model_open(&dm, dp, &mo, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", draft, err);
    if (!rc) rc = df_drafter_model_new(&dd, dm, 0, err, sizeof err);
    CHECK(rc == 0, "%s drafting for %s: %s", draft, target, err);
    if (!rc) {
        df_spec_opts fixed, adapt;
        spec_opts_fixed_adapt(&fixed, &adapt);
        drafter_case dc[] = {{"draft-model", dd, fixed, 0, 0}, {"draft-adk", dd, adapt, 0, 0}};
        df_sampler_opts so;
        df_sampler_opts_default(&so);
        so.temperature = 0.9f;
        so.seed = 77;
        snprintf(label, sizeof label, "%s+%s%s%s greedy", target, draft, backend ? " " : "", backend ? backend : "");
        compare(m, label, prompt, np, 24, &g0, dc, 2);
        snprintf(label, sizeof label, "%s+%s%s%s seed 77", target, draft, backend ? " " : "", backend ? backend : "");
        compare(m, label, prompt, np, 24, &so, dc, 1);
        /* both models still compute what they compute alone */
        rc = plain_gen(dm, prompt, np, NA, &g0, after, fb);
        CHECK(rc == 0 && !memcmp(alone, after, sizeof alone) && same_logits(fa, fb, df_model_n_vocab(dm)),
              "%s, after drafting for %s: its greedy tokens or logits differ from the model opened alone", draft, target);
        int32_t *tg = malloc(sizeof(int32_t) * (ng > 0 ? ng : 1));
        float *ft = malloc(sizeof(float) * df_model_n_vocab(m));
        rc = plain_gen(m, prompt, np, ng, &g0, tg, ft);
        CHECK(rc == 0 && !memcmp(tg, greedy, sizeof(int32_t) * ng), "%s, with %s open beside it: greedy differs from the "
              "golden", target, draft);
        free(tg);
        free(ft);
    }
    free(fa);
    free(fb);
    df_drafter_free(dd);
    df_model_close(dm);
    df_model_close(m);
    free(prompt);
    free(greedy);
    rm_rf(tmp);
}

/* ------------------------------------------------------- kimi-mini + draft */

static const char *const kimi_prompts[20] = {
    "In the beginning God created the heaven and the earth. And the earth was",
    "#include <stdio.h>\n\nint main(int argc, char **argv)\n{\n",
    "static int __init init_module(void)\n{\n\tint ret;\n\n",
    "The malloc() function allocates size bytes and returns a pointer to",
    "The os module provides a portable way of using",
    "And God said, Let there be light: and there was light.",
    "for (i = 0; i < n; i++) {\n",
    "def main():\n    parser = argparse.ArgumentParser(",
    "The free() function frees the memory space pointed to by",
    "And the LORD spake unto Moses, saying,",
    "struct list_head {\n\tstruct list_head *next, *prev;\n};\n",
    "import sys\nimport os\n\n",
    "The open() system call opens the file specified by pathname.",
    "Blessed are the meek: for they shall inherit the earth.",
    "if (ret < 0) {\n\tpr_err(\"",
    "class Parser(object):\n    def __init__(self",
    "RETURN VALUE\n       On success,",
    "Now the serpent was more subtil than any beast of the field",
    "#define MAX(a, b) ((a) > (b) ? (a) : (b))\n",
    "The printf() family of functions produces output according to a format",
};

static void kimi_cases(const char *root) {
    char km[4200], kd[4200], err[1024] = "";
    snprintf(km, sizeof km, "%s/models/kimi-mini", root);
    snprintf(kd, sizeof kd, "%s/models/kimi-mini-draft", root);
    char tmp[] = "/tmp/df_spec_XXXXXX";
    CHECK(mkdtemp(tmp) != NULL, "mkdtemp");
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.cache_dir = tmp;
    mo.threads = 2;
    df_model *m = NULL, *dm = NULL;
    int rc = df_model_open(&m, km, &mo, err, sizeof err);
    CHECK(rc == 0, "kimi-mini: open: %s", err);
    if (!rc) rc = df_model_open(&dm, kd, &mo, err, sizeof err);
    CHECK(rc == 0, "kimi-mini-draft: open: %s", err);
    const df_tokenizer *tok = m ? df_model_tokenizer(m) : NULL;
    CHECK(rc || tok, "kimi-mini has no tokenizer");
    if (rc || !tok) goto done;
    df_drafter *dd = NULL, *rd = NULL, *ngd = NULL;
    CHECK(df_drafter_model_new(&dd, dm, 0, err, sizeof err) == 0, "draft drafter: %s", err);
    CHECK(df_drafter_retok_new(&rd, dm, tok, 0, err, sizeof err) == 0, "retok drafter: %s", err);
    CHECK(df_drafter_ngram_new(&ngd, 0, 0, err, sizeof err) == 0, "ngram drafter: %s", err);
    if (!dd || !rd || !ngd) goto free_d;
    CHECK(!strcmp(df_drafter_kind(dd), "model") && !strcmp(df_drafter_kind(rd), "model-retok") && !strcmp(df_drafter_kind(ngd), "ngram"),
          "drafter kinds");
    df_spec_opts o;
    df_spec_opts_default(&o);
    o.gate = 0;
    df_sampler_opts greedy_o, so;
    df_sampler_opts_default(&greedy_o);
    df_sampler_opts_default(&so);
    so.temperature = 0.8f;
    so.top_k = 40;
    so.seed = 99;
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < 20; i++) {
        int32_t *ids = NULL;
        size_t n = 0;
        rc = df_tokenize(tok, kimi_prompts[i], strlen(kimi_prompts[i]), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        CHECK(rc == 0 && n > 0, "tokenize prompt %d: %s", i, err);
        if (rc || !n) { free(ids); continue; }
        char label[64];
        snprintf(label, sizeof label, "kimi-mini prompt %2d greedy", i);
        drafter_case dc[] = {{"draft", dd, o, 0, 0}, {"retok", rd, o, 0, 0}};
        compare(m, label, ids, (int)n, 32, &greedy_o, dc, i % 5 == 0 ? 2 : 1);
        if (i % 5 == 1) {
            snprintf(label, sizeof label, "kimi-mini prompt %2d seed 99", i);
            compare(m, label, ids, (int)n, 32, &so, dc, 1);
        }
        free(ids);
    }
    /* acceptance of the draft model over a longer greedy run (it must draft usefully) */
    {
        int32_t *ids = NULL, *out = malloc(sizeof(int32_t) * 64);
        size_t n = 0;
        float *fin = malloc(sizeof(float) * df_model_n_vocab(m));
        df_spec_stats st;
        df_tokenize(tok, kimi_prompts[0], strlen(kimi_prompts[0]), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        rc = spec_gen(m, dd, &o, ids, (int)n, 64, &greedy_o, out, fin, &st);
        drafted = st.drafted;
        accepted = st.accepted;
        CHECK(rc == 0 && accepted > 0, "draft model: no token accepted (%llu drafted)", (unsigned long long)drafted);
        printf("  kimi-mini + kimi-mini-draft, 64 tokens: acceptance %llu / %llu\n", (unsigned long long)accepted,
               (unsigned long long)drafted);
        free(ids); free(out); free(fin);
    }
    /* sampled drafts (the min(1, p/q) rule): reproducible with the gate off (the draft's sampler restarted), acceptance > 0 */
    {
        df_drafter *sd = NULL;
        CHECK(df_drafter_model_new(&sd, dm, 0, err, sizeof err) == 0, "sampled drafter: %s", err);
        CHECK(df_drafter_set_sampling(sd, &so, err, sizeof err) == 0, "set_sampling: %s", err);
        int32_t *ids = NULL, *o1 = malloc(sizeof(int32_t) * 48), *o2 = malloc(sizeof(int32_t) * 48);
        size_t n = 0;
        float *f1 = malloc(sizeof(float) * df_model_n_vocab(m)), *f2 = malloc(sizeof(float) * df_model_n_vocab(m));
        df_spec_stats s1, s2;
        df_tokenize(tok, kimi_prompts[3], strlen(kimi_prompts[3]), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        int r1 = spec_gen(m, sd, &o, ids, (int)n, 48, &so, o1, f1, &s1);
        df_drafter_set_sampling(sd, &so, err, sizeof err); /* the draft stream starts again */
        int r2 = spec_gen(m, sd, &o, ids, (int)n, 48, &so, o2, f2, &s2);
        CHECK(r1 == 0 && r2 == 0 && !memcmp(o1, o2, sizeof(int32_t) * 48) && same_logits(f1, f2, df_model_n_vocab(m)),
              "sampled drafts: two runs with seed 99 differ");
        CHECK(s1.drafted > 0 && s1.accepted > 0 && s1.accepted < s1.drafted, "sampled drafts: drafted %llu accepted %llu",
              (unsigned long long)s1.drafted, (unsigned long long)s1.accepted);
        printf("  kimi-mini sampled drafts (T 0.8, top-k 40, seed 99), 48 tokens: acceptance %llu / %llu, reproducible\n",
               (unsigned long long)s1.accepted, (unsigned long long)s1.drafted);
        free(ids); free(o1); free(o2); free(f1); free(f2);
        df_drafter_free(sd);
    }
    /* n-gram on a repetitive prompt */
    {
        const char *rep = "one two three four five six seven eight nine ten\none two three four five six seven eight nine ten\n"
                          "one two three four five six seven eight nine ten\none two three four";
        int32_t *ids = NULL;
        size_t n = 0;
        rc = df_tokenize(tok, rep, strlen(rep), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
        drafter_case dc[] = {{"ngram", ngd, o, 1, 0}};
        if (!rc) compare(m, "kimi-mini repetitive greedy", ids, (int)n, 32, &greedy_o, dc, 1);
        free(ids);
    }
free_d:
    df_drafter_free(dd);
    df_drafter_free(rd);
    df_drafter_free(ngd);
done:
    df_model_close(dm);
    df_model_close(m);
    rm_rf(tmp);
}

/* ------------------------------------------------------------------ misc */

static void api_errors(void) {
    char err[256] = "";
    df_drafter *d = NULL;
    CHECK(df_drafter_ngram_new(&d, 3, 5, err, sizeof err) == DF_EINVAL && !d && strstr(err, "n_min"), "ngram n_min > n_max: %s", err);
    CHECK(df_drafter_ngram_new(&d, 17, 1, err, sizeof err) == DF_EINVAL, "ngram n_max 17");
    CHECK(df_drafter_model_new(&d, NULL, 0, err, sizeof err) == DF_EINVAL, "no draft model");
    CHECK(!strcmp(df_drafter_kind(NULL), "off"), "kind of no drafter");
    /* n-gram lookup itself */
    CHECK(df_drafter_ngram_new(&d, 3, 1, err, sizeof err) == 0, "ngram");
    int32_t hist[] = {5, 6, 7, 8, 9, 5, 6, 7}, out[8];
    int n = d->draft(d, hist, 8, 4, out, NULL, err, sizeof err);
    CHECK(n == 4 && out[0] == 8 && out[1] == 9 && out[2] == 5 && out[3] == 6, "ngram: [5 6 7] -> 8 9 5 6: %d", n);
    int32_t hist2[] = {1, 2, 3, 4};
    CHECK(d->draft(d, hist2, 4, 4, out, NULL, err, sizeof err) == 0, "ngram: no repeat, no proposal");
    int32_t hist3[] = {1, 2, 9, 1, 2, 8, 1, 2};
    n = d->draft(d, hist3, 8, 2, out, NULL, err, sizeof err);
    CHECK(n == 2 && out[0] == 8 && out[1] == 1, "ngram: the most recent occurrence wins: %d %d", out[0], out[1]);
    CHECK(df_drafter_set_sampling(d, NULL, err, sizeof err) == DF_EINVAL, "sampled drafts need a draft model");
    df_drafter_free(d);
}

/* The min(1, p/q) rule: x ~ q, y = spec_accept(p, q, x): y must be distributed as p (Monte Carlo over the
 * sampler's stream, 400000 draws, |freq - p| < 0.004 for every id), and a rejected y is never x. */
static void accept_rule(void) {
    enum { V = 6, N = 400000 };
    const float p[V] = {0.40f, 0.25f, 0.15f, 0.10f, 0.10f, 0.0f}, q[V] = {0.10f, 0.30f, 0.30f, 0.05f, 0.05f, 0.20f};
    df_sampler_opts so;
    df_sampler_opts_default(&so);
    so.seed = 17;
    df_sampler *smp = df_sampler_new(&so);
    long cnt[V] = {0}, accepted = 0, bad = 0;
    for (int t = 0; t < N; t++) {
        double u = df_sampler_uniform(smp), a = 0;
        int32_t x = V - 1;
        for (int i = 0; i < V; i++) { a += q[i]; if (u < a) { x = i; break; } }
        int32_t y = spec_accept(smp, p, q, x, V);
        cnt[y]++;
        accepted += y == x;
        bad += y < 0 || y >= V;
    }
    double worst = 0, want_acc = 0;
    for (int i = 0; i < V; i++) {
        double d = fabs((double)cnt[i] / N - p[i]);
        if (d > worst) worst = d;
        want_acc += p[i] < q[i] ? p[i] : q[i];
    }
    CHECK(bad == 0 && worst < 0.004, "spec_accept: output distribution off by %.4f (bad %ld)", worst, bad);
    CHECK(fabs((double)accepted / N - want_acc) < 0.004, "spec_accept: acceptance %.4f, expected sum min(p, q) = %.4f",
          (double)accepted / N, want_acc);
    printf("  min(1, p/q) rule: %d draws, max |freq - p| %.4f, acceptance %.4f (sum min(p, q) %.4f)\n", N, worst,
           (double)accepted / N, want_acc);
    /* the sampler's distribution: greedy is one-hot, top-k keeps k, the sum is 1 */
    float lg[V] = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f, -1.0f}, pr[V];
    df_sampler_probs(NULL, lg, V, pr);
    CHECK(pr[1] == 1.0f && pr[4] == 0.0f, "greedy probs: one-hot at the lowest argmax");
    so.temperature = 0.7f;
    so.top_k = 3;
    df_sampler *s3 = df_sampler_new(&so);
    df_sampler_probs(s3, lg, V, pr);
    double sum = 0;
    for (int i = 0; i < V; i++) sum += pr[i];
    CHECK(fabs(sum - 1) < 1e-6 && pr[0] == 0 && pr[3] == 0 && pr[5] == 0 && pr[1] == pr[4] && pr[2] > 0,
          "top-k 3 probs: %g %g %g %g %g %g", pr[0], pr[1], pr[2], pr[3], pr[4], pr[5]);
    df_sampler_free(s3);
    df_sampler_free(smp);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    const char *src = getenv("DF_SRC");
    const char *root = src && *src ? src : ".";
    api_errors();
    accept_rule();
    char gdir[4200];
    snprintf(gdir, sizeof gdir, "%s/tests/golden", root);
    DIR *d = opendir(gdir);
    char *names[256];
    int n = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < 256) {
            if (e->d_name[0] == '.') continue;
            char p[8400];
            snprintf(p, sizeof p, "%s/%s/golden.json", gdir, e->d_name);
            struct stat st;
            if (stat(p, &st) == 0) names[n++] = strdup(e->d_name);
        }
        closedir(d);
    }
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    CHECK(n > 0, "no golden cases under %s", gdir);
    for (int i = 0; i < n; i++) {
        char p[8400];
        snprintf(p, sizeof p, "%s/%s", gdir, names[i]);
        golden_case(p, names[i], NULL);
    }
    kda_draft_model_case(gdir, "k3_a", "k3_b", NULL);
    kda_draft_model_case(gdir, "kl_mxfp4", "kl_bf16", NULL);
    /* the KDA models again on the CPU backend with the GPU's device copies of the KDA states emulated
     * (kda_copy_backend.h): copies kept, snapshots kept with them; every 3rd call failing (the steps path: fetches,
     * a snapshot fetched as its copy is dropped); room for two copies only; no room for snapshots */
    kcb_register();
    static const struct { int fail_every, max_copies, no_snap; const char *what; } kv[] = {
        {0, KCB_MAX, 0, "copies"}, {3, KCB_MAX, 0, "every 3rd call failing"}, {0, 2, 0, "2 copies"},
        {0, KCB_MAX, 1, "no snapshots"}};
    for (size_t c = 0; c < sizeof kv / sizeof kv[0]; c++) {
        kcb_fail_every = kv[c].fail_every;
        kcb_max_copies = kv[c].max_copies;
        kcb_no_snap = kv[c].no_snap;
        kcb_calls = 0;
        kcb_n_snap = kcb_n_restore = kcb_n_fetch = kcb_n_fetch_snap = kcb_n_kept = kcb_n_failed = 0;
        int nk = 0;
        for (int i = 0; i < n; i++) {
            if (strncmp(names[i], "k3_", 3) && strncmp(names[i], "kl_", 3)) continue;
            char p[8400], label[300];
            snprintf(p, sizeof p, "%s/%s", gdir, names[i]);
            snprintf(label, sizeof label, "%s (cpu-kdacopy, %s)", names[i], kv[c].what);
            golden_case(p, label, "cpu-kdacopy");
            nk++;
        }
        if (c == 0 || c == 1) {
            kda_draft_model_case(gdir, "k3_a", "k3_b", "cpu-kdacopy");
            kda_draft_model_case(gdir, "kl_mxfp4", "kl_bf16", "cpu-kdacopy");
        }
        printf("  cpu-kdacopy, %s: %d models; kept %llu, snapshots %llu, restores %llu, fetches %llu, snapshots fetched "
               "%llu, failed calls %llu, copies left %d\n", kv[c].what, nk, kcb_n_kept, kcb_n_snap, kcb_n_restore,
               kcb_n_fetch, kcb_n_fetch_snap, kcb_n_failed, kcb_live());
        CHECK(nk > 0 && kcb_n_kept > 0 && kcb_live() == 0, "cpu-kdacopy, %s: states kept on the emulated device, all "
              "forgotten with their sessions (%d models, %llu kept, %d left)", kv[c].what, nk, kcb_n_kept, kcb_live());
        CHECK(kv[c].no_snap ? kcb_n_snap == 0 : kcb_n_snap > 0 && kcb_n_restore > 0,
              "cpu-kdacopy, %s: the verifications' snapshots on the device (%llu) and rollbacks to them (%llu)",
              kv[c].what, kcb_n_snap, kcb_n_restore);
        if (kv[c].fail_every) CHECK(kcb_n_failed > 0 && kcb_n_fetch_snap > 0, "cpu-kdacopy, %s: failed calls (%llu) "
              "fetch snapshots as their copies go (%llu)", kv[c].what, kcb_n_failed, kcb_n_fetch_snap);
    }
    df_backend_register(NULL);
    /* a target and its draft model on a device tier of routed experts, emulated (dev_cache_backend.h): each model's
     * experts under its own tag, so each computes what it computes alone; all forgotten once both are closed */
    dcb_register();
    kda_draft_model_case(gdir, "k3_a", "k3_b", "cpu-devcache");
    kda_draft_model_case(gdir, "kl_mxfp4", "kl_bf16", "cpu-devcache");
    printf("  cpu-devcache: %llu expert matrices cached, %llu pinned from the tier, %d left\n", dcb_n_cached, dcb_n_pinned,
           dcb_live());
    CHECK(dcb_n_cached > 0 && dcb_n_pinned > 0 && dcb_live() == 0, "cpu-devcache: the tier was used (%llu cached, %llu "
          "pinned) and emptied with its models (%d left)", dcb_n_cached, dcb_n_pinned, dcb_live());
    df_backend_register(NULL);
    for (int i = 0; i < n; i++) free(names[i]);
    kimi_cases(root);
    return t_done();
}
