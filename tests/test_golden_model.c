/* test_golden_model.c — the shipped default model against its transformers goldens
 * (tests/golden_model/<name>.json, written by tools/train/train.py; format in
 * tests/golden_model/README.md). For every file: open the model directory it names
 * (models/kimi-mini or models/kimi-mini-draft, HF layout) through df_model_open,
 * converted into a temporary cache, evaluate prompt_ids with all logits and assert
 * max |logit - golden| <= 2e-3 over every stored logit (all positions x vocab, or the
 * last row + the top-20 of every position for draft files), then 32 greedy tokens ==
 * greedy_ids. When the model has a tokenizer, tokenizing `prompt` with the special
 * tokens its tokenizer_config.json asks for (DF_TOK_ADD_SPECIAL: add_bos_token, false for
 * kimi-mini; the goldens have no [BOS]) must give exactly prompt_ids.
 * MoE models are run again under a RAM budget whose expert cache is 1/4 of the
 * model's expert bytes (issue 4: exact on real routing): greedy ids must be equal
 * and the prompt logits bitwise equal, with evictions (more misses).
 */
#define _GNU_SOURCE
#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include "test_util.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Logit tolerance (issue 2's acceptance bound). The goldens were regenerated with TF32 off
 * (tools/train/regold.py): transformers runs the router matmul in fp32 even in a float64 model, and
 * with TF32 on that reference moved by ~2e-3. Against the TF32-off reference this engine is within
 * ~1e-5 (stored logits are rounded to 1e-5). */
#define TOL 2e-3
#define TOL_MOE_TF32 TOL

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (!b || fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); fclose(f); return NULL; }
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

typedef struct {
    char *prompt, *model;       /* prompt text; model dir relative to the repo root */
    int n_prompt, n_greedy;
    int32_t *prompt_ids, *greedy;
    double *margins;
    int n_rows, vocab;          /* prompt_logits rows (n_prompt, or 1 = last position only) */
    float *logits;              /* [n_rows, vocab] */
    int n_top;                  /* prompt_top20: per position, n_top (id, logit) pairs; 0 if absent */
    int32_t *top_ids;           /* [n_prompt, n_top] */
    float *top_logits;
} golden;

static void golden_free(golden *g) {
    free(g->prompt); free(g->model); free(g->prompt_ids); free(g->greedy); free(g->margins);
    free(g->logits); free(g->top_ids); free(g->top_logits);
    memset(g, 0, sizeof *g);
}

static int ids_of(const cJSON *a, int32_t **out) {
    int n = cJSON_GetArraySize(a);
    *out = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    int i = 0;
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next) (*out)[i++] = (int32_t)e->valueint;
    return n;
}

static int golden_load(const char *path, golden *g, char *why, size_t wlen) {
    memset(g, 0, sizeof *g);
    char *txt = slurp(path, NULL);
    if (!txt) { snprintf(why, wlen, "cannot read"); return -1; }
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) { snprintf(why, wlen, "not valid JSON"); return -1; }
    const cJSON *pr = cJSON_GetObjectItem(j, "prompt"), *md = cJSON_GetObjectItem(j, "model"),
                *pi = cJSON_GetObjectItem(j, "prompt_ids"), *pl = cJSON_GetObjectItem(j, "prompt_logits"),
                *gi = cJSON_GetObjectItem(j, "greedy_ids"), *gm = cJSON_GetObjectItem(j, "greedy_margins"),
                *tp = cJSON_GetObjectItem(j, "prompt_top20");
    int rc = -1;
    if (!cJSON_IsString(pr) || !cJSON_IsString(md) || !cJSON_IsArray(pi) || !cJSON_IsArray(pl) || !cJSON_IsArray(gi) ||
        cJSON_GetArraySize(pi) == 0 || cJSON_GetArraySize(pl) == 0) {
        snprintf(why, wlen, "missing prompt / model / prompt_ids / prompt_logits / greedy_ids");
        goto out;
    }
    g->prompt = strdup(pr->valuestring);
    g->model = strdup(md->valuestring);
    g->n_prompt = ids_of(pi, &g->prompt_ids);
    g->n_greedy = ids_of(gi, &g->greedy);
    g->margins = calloc((size_t)g->n_greedy + 1, sizeof(double));
    int k = 0;
    for (const cJSON *e = cJSON_IsArray(gm) ? gm->child : NULL; e && k < g->n_greedy; e = e->next) g->margins[k++] = e->valuedouble;
    g->n_rows = cJSON_GetArraySize(pl);
    g->vocab = cJSON_GetArraySize(pl->child);
    if (g->n_rows != g->n_prompt && g->n_rows != 1) {
        snprintf(why, wlen, "prompt_logits has %d rows (want %d or 1)", g->n_rows, g->n_prompt);
        goto out;
    }
    g->logits = malloc(sizeof(float) * (size_t)g->n_rows * g->vocab);
    int r = 0;
    for (const cJSON *row = pl->child; row; row = row->next, r++) {
        if (cJSON_GetArraySize(row) != g->vocab) { snprintf(why, wlen, "prompt_logits row %d is ragged", r); goto out; }
        int v = 0;
        for (const cJSON *e = row->child; e; e = e->next) g->logits[(size_t)r * g->vocab + v++] = (float)e->valuedouble;
    }
    if (cJSON_IsArray(tp)) {
        if (cJSON_GetArraySize(tp) != g->n_prompt) { snprintf(why, wlen, "prompt_top20 has %d rows", cJSON_GetArraySize(tp)); goto out; }
        g->n_top = cJSON_GetArraySize(tp->child);
        g->top_ids = malloc(sizeof(int32_t) * (size_t)g->n_prompt * g->n_top);
        g->top_logits = malloc(sizeof(float) * (size_t)g->n_prompt * g->n_top);
        int t = 0;
        for (const cJSON *row = tp->child; row; row = row->next, t++) {
            int i = 0;
            for (const cJSON *p = row->child; p && i < g->n_top; p = p->next, i++) {
                g->top_ids[(size_t)t * g->n_top + i] = (int32_t)cJSON_GetArrayItem(p, 0)->valueint;
                g->top_logits[(size_t)t * g->n_top + i] = (float)cJSON_GetArrayItem(p, 1)->valuedouble;
            }
            if (i != g->n_top) { snprintf(why, wlen, "prompt_top20 row %d is ragged", t); goto out; }
        }
    }
    rc = 0;
out:
    cJSON_Delete(j);
    return rc;
}

typedef struct {
    float *plog;          /* [n_prompt, vocab] */
    int32_t *gen;         /* [n_greedy] */
    double eval_s;
    uint64_t misses, hits;
} run_out;

/* prompt with all logits, then n_greedy greedy steps (one T=1 eval each) */
static int run_model(df_model *m, const golden *g, run_out *r, char *err, size_t errlen) {
    const int V = df_model_n_vocab(m);
    r->plog = malloc(sizeof(float) * (size_t)g->n_prompt * V);
    r->gen = calloc((size_t)g->n_greedy + 1, sizeof(int32_t));
    float *lg = malloc(sizeof(float) * V);
    df_session *s = NULL;
    double t0 = now_s();
    int rc = df_session_new(&s, m, g->n_prompt + g->n_greedy + 1, err, errlen);
    if (!rc) rc = df_eval(s, g->prompt_ids, g->n_prompt, r->plog, DF_EVAL_ALL_LOGITS, NULL, NULL, err, errlen);
    if (!rc) memcpy(lg, r->plog + (size_t)(g->n_prompt - 1) * V, sizeof(float) * V);
    df_sampler *smp = df_sampler_new(NULL); /* greedy: argmax, ties -> lowest id */
    for (int k = 0; !rc && k < g->n_greedy; k++) {
        r->gen[k] = df_sample(smp, lg, V);
        if (k + 1 < g->n_greedy) rc = df_eval(s, &r->gen[k], 1, lg, 0, NULL, NULL, err, errlen);
    }
    r->eval_s = now_s() - t0;
    df_sampler_free(smp);
    free(lg);
    df_session_free(s);
    df_stats st;
    df_model_stats(m, &st);
    r->misses = st.expert_misses;
    r->hits = st.expert_hits;
    return rc;
}

static void run_free(run_out *r) { free(r->plog); free(r->gen); memset(r, 0, sizeof *r); }

/* max |ours - golden| over every stored logit; *where = position of the max */
static double logit_diff(const golden *g, const float *plog, int V, int *where) {
    double md = 0;
    *where = -1;
    for (int r = 0; r < g->n_rows; r++) {
        int t = g->n_rows == g->n_prompt ? r : g->n_prompt - 1;
        const float *a = plog + (size_t)t * V, *b = g->logits + (size_t)r * g->vocab;
        for (int v = 0; v < g->vocab; v++) {
            double d = fabs((double)a[v] - b[v]);
            if (d > md || d != d) { md = d; *where = t; }
        }
    }
    for (int t = 0; t < g->n_prompt && g->n_top; t++)
        for (int i = 0; i < g->n_top; i++) {
            int32_t id = g->top_ids[(size_t)t * g->n_top + i];
            double d = id >= 0 && id < V ? fabs((double)plog[(size_t)t * V + id] - g->top_logits[(size_t)t * g->n_top + i]) : INFINITY;
            if (d > md || d != d) { md = d; *where = t; }
        }
    return md;
}

static int n_match(const int32_t *a, const int32_t *b, int n) {
    int k = 0;
    while (k < n && a[k] == b[k]) k++;
    return k;
}

/* add_bos_token of <model_dir>/tokenizer_config.json (HF default when absent: no BOS for
 * PreTrainedTokenizerFast without a post-processor; -1 when the file is unreadable) */
static int config_add_bos(const char *model_dir) {
    char p[4400];
    snprintf(p, sizeof p, "%.4200s/tokenizer_config.json", model_dir);
    char *txt = slurp(p, NULL);
    if (!txt) return -1;
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    if (!j) return -1;
    const cJSON *b = cJSON_GetObjectItem(j, "add_bos_token");
    int r = cJSON_IsTrue(b) ? 1 : 0;
    cJSON_Delete(j);
    return r;
}

static void check_tokenizer(df_model *m, const char *model_dir, const golden *g, const char *name) {
    const df_tokenizer *tok = df_model_tokenizer(m);
    if (!tok) { printf("%-10s tokenizer: none loaded with the model, ids check skipped\n", ""); return; }
    int add_bos = config_add_bos(model_dir);
    CHECK(add_bos >= 0, "%s: cannot read %s/tokenizer_config.json", name, model_dir);
    char err[512] = "";
    int32_t *ids = NULL;
    size_t n = 0;
    /* DF_TOK_ADD_SPECIAL: what tokenizer_config.json asks for (as transformers' add_special_tokens=True);
     * the goldens were tokenized with add_special_tokens=False, equal exactly when add_bos_token is false */
    int rc = df_tokenize(tok, g->prompt, strlen(g->prompt), DF_TOK_ADD_SPECIAL, &ids, &n, err, sizeof err);
    if (rc) {
        printf("%-10s tokenizer: df_tokenize failed (%s), ids check skipped\n", "", err);
        return;
    }
    int same = n == (size_t)g->n_prompt && !memcmp(ids, g->prompt_ids, sizeof(int32_t) * n);
    printf("%-10s tokenizer (DF_TOK_ADD_SPECIAL, add_bos_token %s): %zu ids, %s prompt_ids\n", "",
           add_bos > 0 ? "true" : "false", n,
           same ? "equal to" : "DIFFERENT from");
    CHECK(same, "%s: tokenizing the prompt gives %zu ids, golden prompt_ids has %d (first difference at %d)", name, n,
          g->n_prompt, n_match(ids, g->prompt_ids, (int)(n < (size_t)g->n_prompt ? n : (size_t)g->n_prompt)));
    free(ids);
}

/* The converted native directory of `model_dir` inside cache (convert_cached names it <basename>-<hash>-<spine>). */
static int find_native(const char *cache, const char *model_dir, char *out, size_t cap) {
    const char *base = strrchr(model_dir, '/');
    base = base ? base + 1 : model_dir;
    size_t bl = strlen(base);
    DIR *d = opendir(cache);
    if (!d) return -1;
    int found = -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, base, bl) || e->d_name[bl] != '-' || strstr(e->d_name, ".lock")) continue;
        /* "<base>-<16 hex>-<spine>": the draft's "kimi-mini-draft-..." must not match "kimi-mini" */
        const char *h = e->d_name + bl + 1;
        int hex = 0;
        while ((h[hex] >= '0' && h[hex] <= '9') || (h[hex] >= 'a' && h[hex] <= 'f')) hex++;
        if (hex != 16 || h[hex] != '-') continue;
        char p[8400];
        snprintf(p, sizeof p, "%s/%s/manifest.json", cache, e->d_name);
        struct stat st;
        if (stat(p, &st) == 0) { snprintf(out, cap, "%s/%s", cache, e->d_name); found = 0; break; }
    }
    closedir(d);
    return found;
}

/* Budgeted rerun: expert cache = 1/4 of the expert bytes (at least the 2 x top-k minimum). */
static void check_budget(const char *cache, const char *model_dir, const golden *g, const run_out *ref,
                         const char *name) {
    char nat_dir[4400], err[1024] = "";
    if (find_native(cache, model_dir, nat_dir, sizeof nat_dir)) {
        CHECK(0, "%s: converted directory of %s not found in %s", name, model_dir, cache);
        return;
    }
    df_native *nat = NULL;
    int rc = native_open(&nat, nat_dir, err, sizeof err);
    CHECK(rc == 0, "%s: native_open %s: %s", name, nat_dir, err);
    if (rc) return;
    if (nat->n_moe_layers == 0) { native_close(nat); return; }
    const uint64_t slot = store_slot_bytes(nat), k = (uint64_t)nat->cfg.num_experts_per_tok;
    const uint64_t experts = (uint64_t)nat->n_moe_layers * (uint64_t)nat->n_experts * slot;
    native_close(nat);
    const int kv_pos = g->n_prompt + g->n_greedy + 1;
    /* the fixed part (spine + KV + other) from the budget error's stated minimum */
    df_model_opts o;
    df_model_opts_default(&o);
    o.threads = 2;
    o.kv_positions = kv_pos;
    o.ram_budget = 1;
    df_model *m = NULL;
    rc = df_model_open(&m, nat_dir, &o, err, sizeof err);
    const char *eq = strstr(err, ") = ");
    CHECK(rc == DF_EBUDGET && eq, "%s: a 1-byte budget must fail with the minimum stated: rc %d, %s", name, rc, err);
    df_model_close(m);
    m = NULL;
    if (rc != DF_EBUDGET || !eq) return;
    const uint64_t minimum = strtoull(eq + 4, NULL, 10);
    uint64_t cache_b = experts / 4;
    if (cache_b < 2 * k * slot) cache_b = 2 * k * slot;
    o.ram_budget = minimum - 2 * k * slot + cache_b;
    /* with DF_BACKEND=cuda, GPU memory is the first expert tier and would hold every expert after its first
     * read; a 1-byte GPU budget sends every expert through the store, whose eviction is checked here */
    o.gpu_budget = 1;
    rc = df_model_open(&m, nat_dir, &o, err, sizeof err);
    CHECK(rc == 0, "%s: open with --ram-budget %llu: %s", name, (unsigned long long)o.ram_budget, err);
    if (rc) return;
    run_out b = {0};
    rc = run_model(m, g, &b, err, sizeof err);
    CHECK(rc == 0, "%s: budgeted eval: %s", name, err);
    if (!rc) {
        const int V = df_model_n_vocab(m);
        int match = n_match(b.gen, g->greedy, g->n_greedy);
        int bitwise = !memcmp(b.plog, ref->plog, sizeof(float) * (size_t)g->n_prompt * V);
        printf("%-10s budget %llu B (expert cache %llu of %llu B): greedy %d/%d match, prompt logits %s; misses %llu "
               "(unbudgeted %llu), %.2f s\n",
               "", (unsigned long long)o.ram_budget, (unsigned long long)cache_b, (unsigned long long)experts, match,
               g->n_greedy, bitwise ? "bitwise equal" : "DIFFER", (unsigned long long)b.misses,
               (unsigned long long)ref->misses, b.eval_s);
        CHECK(match == g->n_greedy, "%s: under the budget greedy ids differ from step %d", name, match);
        CHECK(!memcmp(b.gen, ref->gen, sizeof(int32_t) * g->n_greedy), "%s: budgeted ids differ from unbudgeted", name);
        CHECK(bitwise, "%s: prompt logits under the budget are not bitwise equal to the unbudgeted run", name);
        CHECK(cache_b >= experts || b.misses > ref->misses, "%s: the budgeted run should evict (misses %llu vs %llu)",
              name, (unsigned long long)b.misses, (unsigned long long)ref->misses);
    }
    run_free(&b);
    df_model_close(m);
}

static void run_case(const char *root, const char *cache, const char *file, const char *name) {
    golden g;
    char why[256] = "", err[1024] = "";
    double t0 = now_s();
    if (golden_load(file, &g, why, sizeof why)) {
        CHECK(0, "%s: %s: %s", name, file, why);
        golden_free(&g);
        return;
    }
    double t_load = now_s() - t0;
    char model_dir[4200];
    snprintf(model_dir, sizeof model_dir, "%s/%s", root, g.model);
    df_model_opts o;
    df_model_opts_default(&o);
    o.cache_dir = cache;
    o.threads = 2;
    df_model *m = NULL;
    int rc = df_model_open(&m, model_dir, &o, err, sizeof err);
    CHECK(rc == 0, "%s: open %s: %s", name, model_dir, err);
    if (rc) { golden_free(&g); return; }
    const int V = df_model_n_vocab(m);
    CHECK(V == g.vocab, "%s: vocab %d vs golden %d", name, V, g.vocab);
    if (V != g.vocab) { df_model_close(m); golden_free(&g); return; }
    run_out r = {0};
    rc = run_model(m, &g, &r, err, sizeof err);
    CHECK(rc == 0, "%s: eval: %s", name, err);
    if (!rc) {
        int where;
        double md = logit_diff(&g, r.plog, V, &where);
        int match = n_match(r.gen, g.greedy, g.n_greedy);
        printf("%-10s %s, prompt %d tokens: max |logit diff| %.3g (%s, worst at position %d); greedy %d/%d match; "
               "json %.2f s, eval %.2f s\n",
               name, g.model, g.n_prompt, md, g.n_rows == g.n_prompt ? "all positions x vocab" : "last row + top-20 per position",
               where, match, g.n_greedy, t_load, r.eval_s);
        if (match < g.n_greedy)
            printf("%-10s first mismatch at step %d: %d vs golden %d (golden margin %.3g)\n", "", match, r.gen[match],
                   g.greedy[match], g.margins[match]);
        const double tol = strstr(g.model, "draft") ? TOL : TOL_MOE_TF32;
        CHECK(md <= tol, "%s: max logit diff %g > %g", name, md, tol);
        CHECK(match == g.n_greedy, "%s: greedy tokens differ from step %d", name, match);
        check_tokenizer(m, model_dir, &g, name);
    }
    df_model_close(m);
    if (!rc) check_budget(cache, model_dir, &g, &r, name);
    run_free(&r);
    golden_free(&g);
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    const char *src = getenv("DF_SRC");
    char root[4096], gdir[4200];
    snprintf(root, sizeof root, "%s", src && *src ? src : ".");
    snprintf(gdir, sizeof gdir, "%s/tests/golden_model", root);
    DIR *d = opendir(gdir);
    CHECK(d != NULL, "cannot open %s", gdir);
    if (!d) return t_done();
    char *names[64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        size_t l = strlen(e->d_name);
        if (e->d_name[0] != '.' && l > 5 && !strcmp(e->d_name + l - 5, ".json")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    printf("%d golden files under %s\n", n, gdir);
    CHECK(n >= 5, "expected the 5 kimi-mini goldens (+ draft), found %d files", n);
    char cache[] = "/tmp/df_golden_model_XXXXXX";
    CHECK(mkdtemp(cache) != NULL, "mkdtemp");
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        char f[8400], nm[256];
        snprintf(f, sizeof f, "%s/%s", gdir, names[i]);
        snprintf(nm, sizeof nm, "%.*s", (int)strlen(names[i]) - 5, names[i]);
        run_case(root, cache, f, nm);
        free(names[i]);
    }
    printf("total %.2f s\n", now_s() - t0);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache);
    if (system(cmd)) {}
    return t_done();
}
