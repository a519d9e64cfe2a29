/* cli_draft.h — speculative-decoding flags shared by `run`, `chat` and `serve` (cli_draft.c). */
#ifndef DF_CLI_DRAFT_H
#define DF_CLI_DRAFT_H
#include "cli.h"
#include "deltafin.h"

#include <stdio.h>

typedef struct {
    const char *draft;          /* "off" (default), "ngram" or a draft model directory */
    df_spec_opts spec;
    int ngram_min, ngram_max;   /* default 2, 4 */
    int retok;                  /* -1 auto, 0 off, 1 on */
    int sample;                 /* --draft-sample: the draft model samples its drafts (min(1, p/q) rule) */
    const char *tuned;          /* the last --draft-* flag given other than --draft itself (NULL: none) */
    unsigned given;             /* bit k: cli_draft_flags[k] was given */
} cli_draft_opts;

void cli_draft_defaults(cli_draft_opts *o);
/* The usage lines of the flags; with_sample: also --draft-sample (run, chat; serve drafts greedily and refuses it). */
const char *cli_draft_usage(int with_sample);
/* argv[*i] is a --draft* flag: parse it and its value (advancing *i) and return 1; -1 after a usage
 * message naming the flag (`cmd` is the subcommand); 0 when argv[*i] is not one of them. */
int cli_draft_arg(const char *cmd, int argc, char **argv, int *i, cli_draft_opts *o);
int cli_draft_enabled(const cli_draft_opts *o);
/* The flags cli_draft_arg parses, NULL-terminated. */
extern const char *const cli_draft_flags[];
/* A --draft-* tuning flag given while drafting is off: a one-line note on stderr ("deltafin CMD: note: --draft-max
 * has no effect without --draft ..."), not an error; likewise --draft-ngram with a draft model, and --draft-retok or
 * --draft-sample with --draft ngram. */
void cli_draft_note_unused(const char *cmd, const cli_draft_opts *o);
/* --draft-sample on with drafting at --temperature 0: the note "deltafin CMD: note: --draft-sample on has no effect at
 * --temperature 0 ..." on stderr and o->sample cleared (greedy drafts, as the drafter runs); nothing otherwise. */
void cli_draft_note_sample(const char *cmd, cli_draft_opts *o, float temperature);
/* A --draft DIR that is no directory: "deltafin CMD: --draft DIR: no such directory (...)" and 1, so that a
 * mistyped path is reported before the target model is opened; 0 for a directory, ngram or off. */
int cli_draft_check_path(const char *cmd, const cli_draft_opts *o);
/* The drafter the options name for `target` (NULL when off); a draft model directory is opened into
 * *draft_model (closed by the caller after the drafter is freed) with the target's threads, cache
 * dir, backend and KV positions. 0, or the exit status (1 runtime, 2 usage) after a message. */
int cli_draft_open(const char *cmd, const cli_draft_opts *o, df_model *target, const df_model_opts *target_opts,
                   df_model **draft_model, df_drafter **out);
/* "draft: ngram (n 2..4), k max 8 adaptive, gate on (window 32, retry 128)" */
void cli_draft_describe(const cli_draft_opts *o, const df_drafter *d, char *buf, size_t cap);
/* One "stats: draft ..." line: drafted, accepted, acceptance rate, verifications, times, live speedup. */
void cli_draft_print_stats(FILE *f, const df_spec_stats *st, const df_drafter *d);
#endif
