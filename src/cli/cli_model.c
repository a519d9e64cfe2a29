/*
 * cli_model.c — what `run` and `chat` share (cli_model.h): strict numbers, the sampling flags, the flags that say
 * how a model is opened, the model directory's checks before it is opened, opening it (a streamed install's source
 * of experts included), the configuration line, and the positions the model was trained on (the model card's or
 * the config's figure, for the warnings of long prompts and conversations).
 */
#include "cli_model.h"
#include "hub/stream.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cli_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected an integer in [%lld, %lld]\n", cmd, flag, s, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_num(const char *cmd, const char *flag, const char *s, double lo, double hi, int lo_open, float *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end || errno || !isfinite(v) || v < lo || (lo_open && v == lo) || v > hi) {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected a number in %c%g, %g]\n", cmd, flag, s, lo_open ? '(' : '[', lo,
                hi);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* the value after argv[*i] (advancing *i), or NULL after "deltafin CMD: FLAG needs a value" */
static const char *next_value(const char *cmd, int argc, char **argv, int *i) {
    if (*i + 1 < argc) return argv[++*i];
    fprintf(stderr, "deltafin %s: %s needs a value\n", cmd, argv[*i]);
    return NULL;
}

void cli_sampling_defaults(cli_sampling *s) {
    memset(s, 0, sizeof *s);
    df_sampler_opts_default(&s->so);
}

/* records that `flag` (--top-p, --top-k or --seed) was given, once */
static void sampling_given(cli_sampling *s, const char *flag) {
    if (strstr(s->given, flag)) return;
    size_t l = strlen(s->given);
    snprintf(s->given + l, sizeof s->given - l, "%s%s", l ? ", " : "", flag);
    s->n_given++;
}

int cli_sampling_arg(const char *cmd, int argc, char **argv, int *i, cli_sampling *s) {
    const char *a = argv[*i], *v;
    long long iv;
    if (!strcmp(a, "--temperature")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_num(cmd, a, v, 0, 2, 0, &s->so.temperature)) return -1;
    } else if (!strcmp(a, "--top-p")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_num(cmd, a, v, 0, 1, 1, &s->so.top_p)) return -1;
        sampling_given(s, a);
    } else if (!strcmp(a, "--top-k")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_int(cmd, a, v, -1, INT32_MAX, &iv)) return -1;
        s->so.top_k = iv < 0 ? 0 : (int)iv; /* -1 = off, as the server's top_k */
        sampling_given(s, a);
    } else if (!strcmp(a, "--seed")) {
        if (!(v = next_value(cmd, argc, argv, i))) return -1;
        sampling_given(s, a);
        if (cli_parse_seed(cmd, a, v, &s->so.seed)) return -1;
    } else return 0;
    return 1;
}

void cli_sampling_note(const char *cmd, const cli_sampling *s) {
    if (s->n_given && s->so.temperature == 0)
        fprintf(stderr, "deltafin %s: note: %s %s no effect at --temperature 0 (greedy decoding takes the most likely "
                        "token); give --temperature > 0 to sample\n", cmd, s->given, s->n_given > 1 ? "have" : "has");
}

int cli_model_arg(const char *cmd, int argc, char **argv, int *i, df_model_opts *mo, int *spine_given) {
    const char *a = argv[*i], *v;
    long long iv;
    if (!strcmp(a, "--threads")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_int(cmd, a, v, 0, 4096, &iv)) return -1;
        mo->threads = (int)iv;
    } else if (!strcmp(a, "--ram-budget")) { /* 0 = no budget, as leaving the flag out */
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_budget(cmd, a, v, &mo->ram_budget)) return -1;
    } else if (!strcmp(a, "--expert-dirs")) {
        if (!(mo->expert_dirs = next_value(cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--cache-dir")) {
        if (!(mo->cache_dir = next_value(cmd, argc, argv, i)) || cli_check_cache_dir(cmd, mo->cache_dir)) return -1;
    } else if (!strcmp(a, "--events")) {
        if (!(mo->events_path = next_value(cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--heat")) {
        if (!(mo->heat_path = next_value(cmd, argc, argv, i))) return -1;
    } else if (!strcmp(a, "--prefetch")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_mode(cmd, a, v, &mo->prefetch)) return -1;
    } else if (!strcmp(a, "--prefault")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_mode(cmd, a, v, &mo->prefault)) return -1;
    } else if (!strcmp(a, "--io-depth") || !strcmp(a, "--io-size")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_io(cmd, a, v, &mo->io_depth, &mo->io_size)) return -1;
    } else if (!strcmp(a, "--backend")) {
        if (!(mo->backend = next_value(cmd, argc, argv, i)) || cli_check_backend(cmd, mo->backend)) return -1;
    } else if (!strcmp(a, "--gpu-budget")) {
        if (!(v = next_value(cmd, argc, argv, i)) || cli_parse_budget(cmd, a, v, &mo->gpu_budget)) return -1;
    } else if (!strcmp(a, "--spine")) {
        if (!(v = next_value(cmd, argc, argv, i))) return -1;
        if (!strcmp(v, "source")) mo->spine = DF_SPINE_SOURCE;
        else if (!strcmp(v, "bf16")) mo->spine = DF_SPINE_BF16;
        else if (!strcmp(v, "int8")) mo->spine = DF_SPINE_INT8;
        else {
            fprintf(stderr, "deltafin %s: --spine must be source, bf16 or int8 (got \"%s\")\n", cmd, v);
            return -1;
        }
        *spine_given = 1;
    } else return 0;
    return 1;
}

int cli_model_check(const char *cmd, const char *model, int spine_given) {
    /* a mistyped path is "no such directory", before anything looks inside it */
    if (cli_check_model_dir(cmd, model)) return 1;
    /* a directory that is no model: the real cause, before a text prompt looks for its tokenizer */
    if (!cli_is_file(model, "manifest.json") && !cli_is_file(model, "config.json")) {
        fprintf(stderr, "deltafin %s: %s: neither manifest.json (native model) nor config.json (Hugging Face checkpoint) "
                        "found\n", cmd, model);
        return 1;
    }
    if (spine_given && cli_is_file(model, "manifest.json")) {
        fprintf(stderr, "deltafin %s: --spine applies only when converting a Hugging Face checkpoint; %s is a native model "
                        "(its spine encoding was chosen by `deltafin convert --spine`): drop --spine\n", cmd, model);
        return 2;
    }
    return 0;
}

int cli_model_need_tokenizer(const char *cmd, const char *model, const char *alt) {
    if (cli_is_file(model, "tokenizer.json") || cli_is_file(model, "tiktoken.model")) return 0;
    char fix[4096];
    if (cli_setup_install(model, fix, sizeof fix, NULL, 0)) /* an install of setup lost its tokenizer: damage */
        fprintf(stderr, "deltafin %s: model %s is an install of `deltafin setup` and its tokenizer (tokenizer.json / "
                "tiktoken.model) is missing: the install is damaged; `%s` repairs it\n", cmd, model, fix);
    else if (cli_is_file(model, "tokenizer_config.json")) { /* the configuration without its tokenizer */
        char tfix[8192];
        cli_tokenizer_fix(model, tfix, sizeof tfix);
        fprintf(stderr, "deltafin %s: model %s has tokenizer_config.json but its tokenizer (tokenizer.json / "
                "tiktoken.model) is missing: %s%s%s\n", cmd, model, tfix, alt ? "; or " : "", alt ? alt : "");
    } else
        fprintf(stderr, "deltafin %s: model %s has no tokenizer (tokenizer.json / tiktoken.model)%s%s\n", cmd, model,
                alt ? "; " : "", alt ? alt : "");
    return 1;
}

int cli_model_open(df_model **m, struct stream_src **remote, const char *model, df_model_opts *mo, char *err,
                   size_t errlen) {
    int rc;
    /* a streamed install (`deltafin setup --stream`): routed experts not yet local are fetched on first use */
    if (stream_is_streamed(model)) {
        if ((rc = stream_open(remote, model, 0, err, errlen))) return rc;
        mo->remote_source = stream_remote(*remote);
    }
    return df_model_open(m, model, mo, err, errlen);
}

void cli_model_echo(df_model *m, const char *model, const char *how, const char *extra) {
    fprintf(stderr, "%s%s%s%s%s%s\n", df_model_describe(m), how[0] ? "; model (no --model): " : "", how[0] ? model : "",
            how[0] ? ", " : "", how, extra ? extra : "");
}

/* DIR/NAME parsed as JSON, or NULL (missing, over 64 MiB, unreadable, not JSON) */
static cJSON *read_json(const char *dir, const char *name) {
    char p[8192];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = n > 0 && n < (64L << 20) ? malloc((size_t)n + 1) : NULL;
    cJSON *j = NULL;
    if (b && fread(b, 1, (size_t)n, f) == (size_t)n) { b[n] = 0; j = cJSON_Parse(b); }
    free(b);
    fclose(f);
    return j;
}

/* the config's max_position_embeddings (config.json, else manifest.json's copy; text_config's in a multimodal
 * config), or 0; *from names the file it came from */
static long config_max_positions(const char *model, const char **from) {
    cJSON *root = read_json(model, "config.json"), *cfg = root;
    *from = "config.json";
    if (!root && (root = read_json(model, "manifest.json"))) { cfg = cJSON_GetObjectItemCaseSensitive(root, "config"); *from = "manifest.json config"; }
    long v = 0;
    if (cfg) {
        cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
        cJSON *mp = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(tc) ? tc : cfg, "max_position_embeddings");
        if (!mp && cJSON_IsObject(tc)) mp = cJSON_GetObjectItemCaseSensitive(cfg, "max_position_embeddings");
        if (cJSON_IsNumber(mp) && mp->valuedouble >= 1 && mp->valuedouble < 1e12) v = (long)mp->valuedouble;
    }
    cJSON_Delete(root);
    return v;
}

long cli_max_positions(const char *model) {
    const char *from;
    return config_max_positions(model, &from);
}

long cli_trained_positions(const char *model, char *src, size_t cap) {
    char p[8192];
    snprintf(p, sizeof p, "%s/README.md", model);
    FILE *f = fopen(p, "r");
    if (f) {
        char line[1024];
        int in_front = 0;
        long v = 0;
        for (int ln = 0; fgets(line, sizeof line, f); ln++) {
            if (!strncmp(line, "---", 3) && (line[3] == '\n' || line[3] == '\r' || !line[3])) {
                if (ln == 0) { in_front = 1; continue; }
                break;
            }
            if (!in_front) break;
            char *q = line;
            while (*q == ' ') q++;
            if (!strncmp(q, "trained_positions:", 18)) {
                char *end;
                v = strtol(q + 18, &end, 10);
                while (*end == ' ' || *end == '\r' || *end == '\n') end++;
                if (*end || v <= 0) v = 0;
                break;
            }
        }
        fclose(f);
        if (v > 0) { snprintf(src, cap, "model card %s/README.md: trained_positions", model); return v; }
    }
    const char *from = NULL;
    long v = config_max_positions(model, &from);
    if (v > 0) snprintf(src, cap, "%s max_position_embeddings", from);
    return v;
}
