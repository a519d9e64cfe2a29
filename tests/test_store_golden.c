/*
 * test_store_golden.c — exactness under a RAM budget: every golden case
 * (tests/golden/<case>/, tiny HF checkpoints) is converted once, then run with
 * no budget and with a --ram-budget whose expert cache is 1/4 of the model's
 * expert bytes (or the minimum of 2 x top-k slots when that is larger); prompt
 * logits must be bitwise identical and the 20 greedy ids equal, while the
 * budgeted run really evicts (more misses than distinct experts).
 */
#define _GNU_SOURCE
#include "test_util.h"
#include "deltafin.h"
#include "model/native.h"
#include "store/store.h"
#include <dirent.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    float *plog;
    int32_t gen[20];
    uint64_t misses, hits;
} result;

static int prompt_of(const char *case_dir, int32_t *ids, int cap) {
    char p[1600];
    snprintf(p, sizeof p, "%s/golden.json", case_dir);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *q = strstr(buf, "\"prompt_ids\"");
    if (!q || !(q = strchr(q, '['))) return 0;
    int k = 0;
    for (q++; *q && *q != ']' && k < cap;) {
        ids[k++] = (int32_t)strtol(q, &q, 10);
        while (*q == ',' || *q == ' ' || *q == '\n') q++;
    }
    return k;
}

/* A df_model_stats call from another thread while a forward pass holds the model (from its progress callback):
 * it must return at once (a /metrics scrape during a long prompt), with the counters of the last finished call. */
typedef struct {
    df_model *m;
    volatile int done;
    df_stats st;
} stats_probe;

static void *stats_thread(void *arg) {
    stats_probe *p = arg;
    df_model_stats(p->m, &p->st);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

typedef struct {
    df_model *m;
    int asked, returned, started;
    uint64_t prefill_tokens;
    pthread_t th;
    stats_probe p;
} probe_result;

static int probe_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    probe_result *r = user;
    (void)total;
    if (r->asked || strcmp(what, "layers") || done < 1) return 0;
    r->asked = 1;
    r->p.m = r->m;
    if (pthread_create(&r->th, NULL, stats_thread, &r->p)) return 0;
    r->started = 1;
    for (int i = 0; i < 500 && !__atomic_load_n(&r->p.done, __ATOMIC_ACQUIRE); i++) usleep(10000); /* up to 5 s */
    r->returned = __atomic_load_n(&r->p.done, __ATOMIC_ACQUIRE);
    if (r->returned) r->prefill_tokens = r->p.st.prefill_tokens;
    return 0; /* joined after df_eval: a thread blocked on the model returns once this pass releases it */
}

static int run(const char *dir, uint64_t budget, const int32_t *prompt, int np, result *r, char *err, size_t errlen) {
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.ram_budget = budget;
    mo.threads = 2;
    df_model *m = NULL;
    int rc = df_model_open(&m, dir, &mo, err, errlen);
    if (rc) return rc;
    int V = df_model_n_vocab(m);
    df_session *s = NULL;
    rc = df_session_new(&s, m, np + 24, err, errlen);
    if (!rc) {
        r->plog = malloc(sizeof(float) * (size_t)np * V);
        float *lg = malloc(sizeof(float) * V);
        probe_result pr;
        memset(&pr, 0, sizeof pr);
        pr.m = m;
        rc = df_eval(s, prompt, np, r->plog, DF_EVAL_ALL_LOGITS, budget ? probe_progress : NULL, &pr, err, errlen);
        if (pr.started) pthread_join(pr.th, NULL);
        if (budget) {
            CHECK(pr.asked && pr.returned, "df_model_stats during a forward pass returned within 5 s (asked %d)", pr.asked);
            CHECK(pr.prefill_tokens == 0, "stats during the first pass: prefill tokens %llu (expected 0: none finished)",
                  (unsigned long long)pr.prefill_tokens);
        }
        int32_t t = 0;
        if (!rc) {
            float *last = r->plog + (size_t)(np - 1) * V;
            for (int i = 1; i < V; i++) if (last[i] > last[t]) t = i;
        }
        for (int g = 0; g < 20 && !rc; g++) {
            r->gen[g] = t;
            rc = df_eval(s, &t, 1, lg, 0, NULL, NULL, err, errlen);
            t = 0;
            for (int i = 1; i < V && !rc; i++) if (lg[i] > lg[t]) t = i;
        }
        free(lg);
        df_stats st;
        df_model_stats(m, &st);
        r->misses = st.expert_misses;
        r->hits = st.expert_hits;
        df_session_free(s);
    }
    df_model_close(m);
    return rc;
}

int main(void) {
    const char *src = getenv("DF_SRC") ? getenv("DF_SRC") : ".";
    char gdir[1024];
    snprintf(gdir, sizeof gdir, "%s/tests/golden", src);
    DIR *d = opendir(gdir);
    if (!d) { printf("no %s: skipped\n", gdir); return t_done(); }
    char tmp[256];
    snprintf(tmp, sizeof tmp, "/tmp/df_test_store_golden_%d", (int)getpid());
    mkdir(tmp, 0755);
    struct dirent *de;
    int cases = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        char hf[1400], out[1400], err[2048] = "";
        snprintf(hf, sizeof hf, "%s/%s", gdir, de->d_name);
        int32_t prompt[256];
        int np = prompt_of(hf, prompt, 256);
        if (np <= 0) continue;
        snprintf(out, sizeof out, "%s/%s", tmp, de->d_name);
        df_convert_opts co;
        df_convert_opts_default(&co);
        co.spine = DF_SPINE_BF16;
        int rc = df_convert(hf, out, &co, err, sizeof err);
        CHECK(rc == 0, "%s: convert: %s", de->d_name, err);
        if (rc) continue;
        df_native *nat = NULL;
        rc = native_open(&nat, out, err, sizeof err);
        CHECK(rc == 0, "%s: native_open: %s", de->d_name, err);
        if (rc) continue;
        if (nat->n_moe_layers == 0) { native_close(nat); continue; }
        uint64_t slot = store_slot_bytes(nat), k = nat->cfg.num_experts_per_tok;
        uint64_t experts = (uint64_t)nat->n_moe_layers * nat->n_experts * slot;
        native_close(nat);
        /* the minimum from the budget error, then fixed part + a quarter of the experts */
        df_model_opts mo;
        df_model_opts_default(&mo);
        mo.ram_budget = 1;
        df_model *m = NULL;
        rc = df_model_open(&m, out, &mo, err, sizeof err);
        const char *eq = strstr(err, ") = ");
        CHECK(rc == DF_EBUDGET && eq, "%s: tiny budget: %d %s", de->d_name, rc, err);
        if (rc != DF_EBUDGET || !eq) { df_model_close(m); continue; }
        uint64_t minimum = strtoull(eq + 4, NULL, 10), cache = experts / 4;
        if (cache < 2 * k * slot) cache = 2 * k * slot;
        uint64_t budget = minimum - 2 * k * slot + cache;
        result a = {0}, b = {0};
        rc = run(out, 0, prompt, np, &a, err, sizeof err);
        CHECK(rc == 0, "%s: unbudgeted run: %s", de->d_name, err);
        int rc2 = run(out, budget, prompt, np, &b, err, sizeof err);
        CHECK(rc2 == 0, "%s: budgeted run (%llu bytes): %s", de->d_name, (unsigned long long)budget, err);
        if (!rc && !rc2) {
            df_model_opts_default(&mo);
            CHECK(!memcmp(a.gen, b.gen, sizeof a.gen), "%s: greedy ids differ under the budget", de->d_name);
            /* logits: bitwise */
            int same = 1;
            df_model *mm = NULL;
            if (df_model_open(&mm, out, &mo, err, sizeof err) == 0) {
                size_t nl = (size_t)np * df_model_n_vocab(mm);
                same = !memcmp(a.plog, b.plog, nl * sizeof(float));
                df_model_close(mm);
            }
            CHECK(same, "%s: prompt logits differ under the budget", de->d_name);
            CHECK(cache >= experts || b.misses > a.misses, "%s: budgeted run should evict (misses %llu vs %llu)",
                  de->d_name, (unsigned long long)b.misses, (unsigned long long)a.misses);
            printf("%s: budget %llu bytes (expert cache %llu of %llu): ids equal, logits bitwise equal; misses %llu "
                   "(unbudgeted %llu)\n",
                   de->d_name, (unsigned long long)budget, (unsigned long long)cache, (unsigned long long)experts,
                   (unsigned long long)b.misses, (unsigned long long)a.misses);
            cases++;
        }
        free(a.plog);
        free(b.plog);
    }
    closedir(d);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmp);
    if (system(cmd)) {}
    CHECK(cases >= 1, "no golden case with routed experts ran");
    return t_done();
}
