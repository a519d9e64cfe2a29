/* cmd_warm.c — `deltafin warm`: fetch ahead, into a streamed install, the routed experts that recorded
 * routing says are most likely: from a trace (`run --events` JSONL: the "acquire" events, each expert
 * ranked by how often it was acquired), or by running prompts (prefill of each line: the experts their
 * routing picks are fetched), up to --budget bytes of experts. */
#include "cli.h"
#include "deltafin.h"
#include "hub/stream.h"
#include "util/util.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin warm [--model DIR] (--trace EVENTS.jsonl | --prompts FILE) [--budget SIZE]\n\n"
            "Fetch ahead, while the machine is idle, the routed experts of a streamed install (`deltafin setup --stream`)\n"
            "that recorded routing says are most likely, so later runs find them local.\n"
            "  --model DIR            the streamed install's native directory (default: the installed default model)\n"
            "  --trace EVENTS.jsonl   routing recorded by `deltafin run --events FILE`: experts ranked by how often they\n"
            "                         were acquired (heat), most first\n"
            "  --prompts FILE         one prompt per line: each is prefilled and the experts its routing needs are fetched\n"
            "  --budget SIZE          stop after this many bytes of experts were fetched (default: no limit)\n"
            "The closing line counts the experts fetched and present; on an install with a disk budget (setup --disk-budget)\n"
            "it also says how many present experts the budget evicted to make room (\"N evicted by the disk budget\").\n");
}

typedef struct { int layer, expert; double heat; } cand;

static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->heat != y->heat) return x->heat > y->heat ? -1 : 1;
    return x->layer != y->layer ? x->layer - y->layer : x->expert - y->expert;
}

int cmd_warm(int argc, char **argv) {
    const char *model = NULL, *trace = NULL, *prompts = NULL;
    uint64_t budget = UINT64_MAX;
    static const char *const values[] = {"--model", "--trace", "--prompts", "--budget", NULL};
    if (cli_check_repeated("warm", argc, argv, values, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--model") || !strcmp(a, "--trace") || !strcmp(a, "--prompts") || !strcmp(a, "--budget")) {
            if (!v) { fprintf(stderr, "deltafin warm: %s needs a value\n", a); return 2; }
            i++;
            if (!strcmp(a, "--model")) model = v;
            else if (!strcmp(a, "--trace")) trace = v;
            else if (!strcmp(a, "--prompts")) prompts = v;
            else if (cli_parse_size(v, &budget)) { fprintf(stderr, "deltafin warm: --budget \"%s\": expected a size (e.g. 20G)\n", v); return 2; }
        } else {
            static const char *const opts[] = {"--help", "--model", "--trace", "--prompts", "--budget", NULL};
            return cli_unknown_option("warm", a, opts, NULL);
        }
    }
    if (!!trace + !!prompts != 1) { fprintf(stderr, "deltafin warm: give one of --trace EVENTS.jsonl or --prompts FILE\n"); return 2; }
    char dflt[4096], how[4600];
    if (!model) {
        if (cli_default_model("warm", dflt, sizeof dflt, how, sizeof how)) return 1;
        model = dflt;
    }
    if (!stream_is_streamed(model)) {
        fprintf(stderr, "deltafin warm: %s is not a streamed install (no stream.json): its experts are all local already\n", model);
        return 1;
    }
    char err[2048];
    stream_src *ss = NULL;
    if (stream_open(&ss, model, 0, err, sizeof err)) { fprintf(stderr, "deltafin warm: %s\n", err); return 1; }
    double t0 = df_now();
    int status = 0, fetched = 0, local = 0;
    uint64_t bytes = 0;
    if (trace) {
        char *txt = NULL;
        if (df_read_file(trace, &txt, NULL, err, sizeof err)) { fprintf(stderr, "deltafin warm: %s\n", err); stream_close(ss); return 1; }
        cand *cs = NULL;
        int n = 0, cap = 0, lines = 0;
        for (char *line = strtok(txt, "\n"); line; line = strtok(NULL, "\n")) {
            cJSON *j = cJSON_Parse(line);
            const cJSON *ev = cJSON_GetObjectItemCaseSensitive(j, "ev"), *L = cJSON_GetObjectItemCaseSensitive(j, "layer"),
                        *ids = cJSON_GetObjectItemCaseSensitive(j, "ids");
            if (cJSON_IsString(ev) && !strcmp(ev->valuestring, "acquire") && cJSON_IsNumber(L) && cJSON_IsArray(ids)) {
                lines++;
                const cJSON *id;
                cJSON_ArrayForEach(id, ids) {
                    int k;
                    for (k = 0; k < n; k++)
                        if (cs[k].layer == L->valueint && cs[k].expert == id->valueint) break;
                    if (k == n) {
                        if (n == cap) { cap = cap ? cap * 2 : 256; cs = realloc(cs, sizeof(cand) * (size_t)cap); }
                        cs[n++] = (cand){L->valueint, id->valueint, 0};
                    }
                    cs[k].heat += 1;
                }
            }
            cJSON_Delete(j);
        }
        free(txt);
        if (!lines) fprintf(stderr, "deltafin warm: %s has no \"acquire\" events (record them with `deltafin run --events FILE`)\n", trace);
        if (n > 1) qsort(cs, (size_t)n, sizeof(cand), cmp_cand);
        for (int k = 0; k < n; k++) {
            uint64_t eb = stream_expert_bytes(ss, cs[k].layer);
            if (bytes + eb > budget) break;
            int rc = stream_fetch_now(ss, cs[k].layer, cs[k].expert, err, sizeof err);
            if (rc < 0) { fprintf(stderr, "deltafin warm: %s\n", err); status = 1; break; }
            if (rc == 1) local++;
            else { fetched++; bytes += eb; printf("warm: layer %d expert %d (acquired %.0f times)\n", cs[k].layer, cs[k].expert, cs[k].heat); }
        }
        free(cs);
    } else {
        char *txt = NULL;
        if (df_read_file(prompts, &txt, NULL, err, sizeof err)) { fprintf(stderr, "deltafin warm: %s\n", err); stream_close(ss); return 1; }
        df_model_opts mo;
        df_model_opts_default(&mo);
        mo.remote_source = stream_remote(ss);
        df_model *m = NULL;
        if (df_model_open(&m, model, &mo, err, sizeof err)) { fprintf(stderr, "deltafin warm: %s\n", err); free(txt); stream_close(ss); return 1; }
        const df_tokenizer *tok = df_model_tokenizer(m);
        if (!tok) { fprintf(stderr, "deltafin warm: %s has no tokenizer: use --trace\n", model); status = 1; }
        for (char *line = strtok(txt, "\n"); line && !status; line = strtok(NULL, "\n")) {
            stream_stats st;
            stream_get_stats(ss, &st);
            if (st.net_bytes >= budget) break;
            int32_t *ids = NULL;
            size_t nids = 0;
            df_session *s = NULL;
            if (df_tokenize(tok, line, strlen(line), DF_TOK_ADD_SPECIAL, &ids, &nids, err, sizeof err) || !nids ||
                df_session_new(&s, m, (int)nids + 1, err, sizeof err) || df_eval(s, ids, (int)nids, NULL, 0, NULL, NULL, err, sizeof err)) {
                if (nids) { fprintf(stderr, "deltafin warm: %s\n", err); status = 1; }
            }
            df_session_free(s);
            free(ids);
        }
        df_model_close(m);
        free(txt);
        stream_stats st;
        stream_get_stats(ss, &st);
        fetched = (int)st.fetches;
        bytes = st.net_bytes;
        local = (int)st.local_hits;
    }
    stream_stats st;
    stream_get_stats(ss, &st);
    /* with a disk budget (setup --stream --disk-budget) fetching evicts the coldest present experts: said, so that
     * "present" is not read as what was fetched */
    char evicted[96] = "";
    if (st.evictions)
        snprintf(evicted, sizeof evicted, "; %llu evicted by the disk budget", (unsigned long long)st.evictions);
    printf("warm: fetched %d experts (%.2f MB of extents, %.2f MB from the network) in %.2f s; %d already local%s; present %llu / %llu (%.1f%%)\n",
           fetched, bytes / 1e6, st.net_bytes / 1e6, df_now() - t0, local, evicted, (unsigned long long)st.present, (unsigned long long)st.total,
           st.total ? 100.0 * (double)st.present / (double)st.total : 100.0);
    stream_close(ss);
    return status;
}
