/*
 * cli_draft.c — the speculative-decoding flags shared by `run`, `chat` and `serve`
 * (--draft DIR|ngram|off, --draft-max, --draft-adaptive, --draft-gate,
 * --draft-window, --draft-retry, --draft-ngram, --draft-retok), opening the
 * drafter they name (a draft model is opened resident, beside the target), the
 * one-line description of the resolved drafting configuration and the --stats line.
 */
#include "cli_draft.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void cli_draft_defaults(cli_draft_opts *o) {
    memset(o, 0, sizeof *o);
    o->draft = "off";
    df_spec_opts_default(&o->spec);
    o->ngram_min = 2;
    o->ngram_max = 4;
    o->retok = -1;
}

#define DRAFT_USAGE_COMMON \
    "  --draft DIR|ngram|off speculative decoding: drafts from a draft model DIR (native or Hugging Face dir),\n" \
    "                       from prompt lookup (ngram), or none (off, default); output is identical either way\n" \
    "  --draft-max K        most tokens drafted per verification, 1..64 (default 8)\n" \
    "  --draft-adaptive on|off  k follows the acceptance (default on) or is always --draft-max\n" \
    "  --draft-gate on|off  switch drafting off while it is slower than plain decoding, measured live (default on)\n" \
    "  --draft-window N     generated tokens per gate measurement window, >= 16 (default 32)\n" \
    "  --draft-retry N      tokens decoded plainly before drafting is retried after the gate stopped it (default 256)\n" \
    "  --draft-ngram MIN,MAX  n-gram lengths looked up by --draft ngram, 1 <= MIN <= MAX <= 16 (default 2,4)\n" \
    "  --draft-retok auto|on|off  draft through text re-tokenization (a draft model with another tokenizer);\n" \
    "                       auto (default): on when the draft model's vocabulary size differs from the target's\n"
static const char cli_draft_usage_common[] = DRAFT_USAGE_COMMON;
static const char cli_draft_usage_run[] = DRAFT_USAGE_COMMON \
    "  --draft-sample on|off  with sampling: the draft model samples its drafts and verification accepts\n" \
    "                       with min(1, p/q) (same distribution; not the same sample as plain decoding, and\n" \
    "                       reproducible only with --draft-gate off). off (default): greedy drafts, same sample\n";

const char *cli_draft_usage(int with_sample) {
    if (!with_sample) return cli_draft_usage_common; /* serve drafts greedily: no --draft-sample */
    return cli_draft_usage_run;
}

static int int_arg(const char *cmd, const char *flag, const char *v, long lo, long hi, int *out) {
    char *end;
    errno = 0;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected an integer in [%ld, %ld]\n", cmd, flag, v ? v : "", lo, hi);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static int onoff_arg(const char *cmd, const char *flag, const char *v, int *out) {
    if (v && !strcmp(v, "on")) *out = 1;
    else if (v && !strcmp(v, "off")) *out = 0;
    else {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected on or off\n", cmd, flag, v ? v : "");
        return -1;
    }
    return 0;
}

const char *const cli_draft_flags[] = {"--draft", "--draft-max", "--draft-adaptive", "--draft-gate", "--draft-window",
                                       "--draft-retry", "--draft-ngram", "--draft-retok", "--draft-sample", NULL};

int cli_draft_arg(const char *cmd, int argc, char **argv, int *i, cli_draft_opts *o) {
    const char *a = argv[*i];
    if (strncmp(a, "--draft", 7)) return 0;
    int which = -1;
    for (int k = 0; cli_draft_flags[k]; k++)
        if (!strcmp(a, cli_draft_flags[k])) which = k;
    if (which < 0) return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "deltafin %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[++*i];
    if (which > 0) o->tuned = cli_draft_flags[which];
    o->given |= 1u << which;
    switch (which) {
    case 0:
        if (!*v) { fprintf(stderr, "deltafin %s: --draft needs a draft model directory, ngram or off\n", cmd); return -1; }
        o->draft = v;
        return 1;
    case 1: return int_arg(cmd, a, v, 1, 64, &o->spec.k_max) ? -1 : 1;
    case 2: return onoff_arg(cmd, a, v, &o->spec.adaptive) ? -1 : 1;
    case 3: return onoff_arg(cmd, a, v, &o->spec.gate) ? -1 : 1;
    case 4: return int_arg(cmd, a, v, 16, 1 << 20, &o->spec.window) ? -1 : 1;
    case 5: return int_arg(cmd, a, v, 1, 1 << 24, &o->spec.retry) ? -1 : 1;
    case 6: {
        int lo, hi, used = 0;
        if (sscanf(v, "%d,%d%n", &lo, &hi, &used) != 2 || v[used] || lo < 1 || hi < lo || hi > 16) {
            fprintf(stderr, "deltafin %s: --draft-ngram \"%s\": expected MIN,MAX with 1 <= MIN <= MAX <= 16\n", cmd, v);
            return -1;
        }
        o->ngram_min = lo;
        o->ngram_max = hi;
        return 1;
    }
    case 7:
        if (!strcmp(v, "auto")) o->retok = -1;
        else if (!strcmp(v, "on") || !strcmp(v, "off")) o->retok = !strcmp(v, "on");
        else {
            fprintf(stderr, "deltafin %s: %s \"%s\": expected auto, on or off\n", cmd, a, v);
            return -1;
        }
        return 1;
    case 8: return onoff_arg(cmd, a, v, &o->sample) ? -1 : 1;
    }
    return 0;
}

int cli_draft_enabled(const cli_draft_opts *o) { return o->draft && strcmp(o->draft, "off"); }

void cli_draft_note_unused(const char *cmd, const cli_draft_opts *o) {
    if (o->tuned && !cli_draft_enabled(o)) {
        fprintf(stderr, "deltafin %s: note: %s has no effect without --draft DIR|ngram (speculative decoding is off)\n", cmd,
                o->tuned);
        return;
    }
    if (!cli_draft_enabled(o)) return;
    const int ngram = !strcmp(o->draft, "ngram");
    for (int k = 6; k <= 8; k++) /* --draft-ngram; --draft-retok, --draft-sample */
        if ((o->given >> k & 1) && (k == 6) != ngram)
            fprintf(stderr, "deltafin %s: note: %s has no effect with --draft %s (it applies to %s)\n", cmd,
                    cli_draft_flags[k], ngram ? "ngram" : "DIR", k == 6 ? "--draft ngram" : "a draft model");
}

void cli_draft_note_sample(const char *cmd, cli_draft_opts *o, float temperature) {
    if (!o->sample || temperature != 0 || !cli_draft_enabled(o)) return;
    fprintf(stderr, "deltafin %s: note: --draft-sample on has no effect at --temperature 0 (greedy decoding: the drafts "
                    "are greedy); give --temperature > 0 to sample\n", cmd);
    o->sample = 0; /* as the drafter runs: greedy drafts (the draft line says so) */
}

int cli_draft_check_path(const char *cmd, const cli_draft_opts *o) {
    if (!cli_draft_enabled(o) || !strcmp(o->draft, "ngram")) return 0;
    struct stat st;
    const int missing = stat(o->draft, &st) != 0;
    if (missing || !S_ISDIR(st.st_mode)) {
        fprintf(stderr, "deltafin %s: --draft %s: %s (expected a draft model directory, ngram or off)\n", cmd, o->draft,
                missing ? "no such directory" : "not a directory");
        return 1;
    }
    return 0;
}

int cli_draft_open(const char *cmd, const cli_draft_opts *o, df_model *target, const df_model_opts *target_opts,
                   df_model **draft_model, df_drafter **out) {
    char err[1024] = "";
    *draft_model = NULL;
    *out = NULL;
    if (!cli_draft_enabled(o)) return 0;
    int rc;
    if (!strcmp(o->draft, "ngram")) {
        rc = df_drafter_ngram_new(out, o->ngram_max, o->ngram_min, err, sizeof err);
        if (rc) { fprintf(stderr, "deltafin %s: --draft ngram: %s\n", cmd, err); return 2; }
        return 0;
    }
    if (cli_draft_check_path(cmd, o)) return 1;
    /* the draft model: resident (no budget of its own), the target's threads, cache and backend */
    df_model_opts mo;
    df_model_opts_default(&mo);
    mo.threads = target_opts->threads;
    mo.cache_dir = target_opts->cache_dir;
    mo.backend = target_opts->backend;
    mo.progress = target_opts->progress;
    mo.progress_user = target_opts->progress_user;
    mo.kv_positions = target_opts->kv_positions;
    mo.heat_path = "off";
    rc = df_model_open(draft_model, o->draft, &mo, err, sizeof err);
    if (rc) { fprintf(stderr, "deltafin %s: --draft %s: %s\n", cmd, o->draft, err); return 1; }
    int retok = o->retok;
    if (retok < 0) retok = df_model_n_vocab(*draft_model) != df_model_n_vocab(target);
    if (retok) rc = df_drafter_retok_new(out, *draft_model, df_model_tokenizer(target), 0, err, sizeof err);
    else if (df_model_n_vocab(*draft_model) != df_model_n_vocab(target)) {
        fprintf(stderr, "deltafin %s: --draft %s: its vocabulary has %d tokens, the target's %d: use --draft-retok on "
                        "(or auto) to draft through text\n", cmd, o->draft, df_model_n_vocab(*draft_model), df_model_n_vocab(target));
        rc = 2;
    } else rc = df_drafter_model_new(out, *draft_model, 0, err, sizeof err);
    if (rc) {
        if (rc < 0) fprintf(stderr, "deltafin %s: --draft %s: %s\n", cmd, o->draft, err);
        df_model_close(*draft_model);
        *draft_model = NULL;
        return rc == 2 ? 2 : 1;
    }
    return 0;
}

void cli_draft_describe(const cli_draft_opts *o, const df_drafter *d, char *buf, size_t cap) {
    if (!d) { snprintf(buf, cap, "draft: off"); return; }
    char what[512];
    if (!strcmp(df_drafter_kind(d), "ngram")) snprintf(what, sizeof what, "ngram (n %d..%d)", o->ngram_min, o->ngram_max);
    else snprintf(what, sizeof what, "%s %s", df_drafter_kind(d), o->draft);
    snprintf(buf, cap, "draft: %s%s, k max %d%s, gate %s (window %d, retry %d)", what, o->sample ? " (sampled drafts)" : "",
             o->spec.k_max, o->spec.adaptive ? " adaptive" : " fixed", o->spec.gate ? "on" : "off", o->spec.window, o->spec.retry);
}

void cli_draft_print_stats(FILE *f, const df_spec_stats *st, const df_drafter *d) {
    const double calls = st->verify_calls ? (double)st->verify_calls : 1;
    fprintf(f, "stats: draft %s: drafted %llu, accepted %llu (acceptance %.1f%%), %llu verifications (%.2f tokens each), "
               "%llu plain steps; draft %.3f s, verify %.3f s, plain %.3f s; k now %d, drafting %s, gate stopped it %llu time%s",
            df_drafter_kind(d), (unsigned long long)st->drafted, (unsigned long long)st->accepted,
            st->drafted ? 100.0 * st->accepted / st->drafted : 0.0, (unsigned long long)st->verify_calls,
            (st->accepted + st->verify_calls) / calls, (unsigned long long)st->plain_steps, st->draft_s, st->verify_s,
            st->plain_s, st->k,
            st->drafting  ? "on"
            : st->probing ? "paused (a plain window measuring the rate without it)"
                          : "off (the gate: slower than plain decoding)",
            (unsigned long long)st->gate_off, st->gate_off == 1 ? "" : "s");
    if (st->drafted == 0) fputs("; the drafter proposed nothing", f);
    else if (st->spec_tok_s > 0 && st->plain_tok_s > 0)
        fprintf(f, "; live tok/s with drafting %.2f, without %.2f: speedup %.2fx", st->spec_tok_s, st->plain_tok_s,
                st->spec_tok_s / st->plain_tok_s);
    fputc('\n', f);
}
