/* cli_model.h — what the commands that open a model and generate (`run`, `chat`) share (cli_model.c): strict
 * numbers, the sampling flags, the model-opening flags, the model directory's checks, opening it (a streamed install
 * included), the configuration line, the most positions the model takes and those it was trained on. Each message
 * names the command. */
#ifndef DF_CLI_MODEL_H
#define DF_CLI_MODEL_H
#include "cli.h"
#include "deltafin.h"

#include <stddef.h>

/* A whole decimal integer in [lo, hi] into *out: 0, else "deltafin CMD: FLAG "S": expected an integer in [LO, HI]"
 * on stderr and -1. */
int cli_parse_int(const char *cmd, const char *flag, const char *s, long long lo, long long hi, long long *out);
/* A finite number in [lo, hi] (in (lo, hi] when lo_open) into *out: 0, else a usage message naming the flag, -1. */
int cli_parse_num(const char *cmd, const char *flag, const char *s, double lo, double hi, int lo_open, float *out);

/* The sampling flags (--temperature, --top-p, --top-k, --seed) and which of --top-p, --top-k and --seed were given
 * (", "-separated in `given`, for the note that they do nothing at temperature 0). */
typedef struct {
    df_sampler_opts so;
    char given[64];
    int n_given;
} cli_sampling;
void cli_sampling_defaults(cli_sampling *s);
/* argv[*i] is a sampling flag: parse it and its value (advancing *i) and return 1; -1 after a usage message naming
 * the flag; 0 when argv[*i] is not one of them. */
int cli_sampling_arg(const char *cmd, int argc, char **argv, int *i, cli_sampling *s);
/* --top-p / --top-k / --seed given at temperature 0: a one-line note on stderr (they change nothing), not an error. */
void cli_sampling_note(const char *cmd, const cli_sampling *s);

/* argv[*i] is one of the flags that say how the model is opened (--threads, --ram-budget, --expert-dirs, --cache-dir,
 * --events, --heat, --prefetch, --prefault, --io-depth, --io-size, --backend, --gpu-budget, --spine): parse it into
 * *mo (advancing *i; --spine also sets *spine_given) and return 1; -1 after a usage message naming the flag; 0 when
 * argv[*i] is none of them. */
int cli_model_arg(const char *cmd, int argc, char **argv, int *i, df_model_opts *mo, int *spine_given);

/* The model directory (--model, or the default) before it is opened: it exists and is a directory, it holds a model
 * (manifest.json or config.json), and --spine (spine_given) is not asked of a native model. 0, or the exit status
 * (1 runtime, 2 usage) after one line on stderr. */
int cli_model_check(const char *cmd, const char *model, int spine_given);
/* The model has a tokenizer (tokenizer.json or tiktoken.model): 0; else why not (a damaged setup install and the
 * command that repairs it, a tokenizer_config.json without its tokenizer and what restores it, or none at all) on
 * stderr, followed by "; ALT" when alt is not NULL (what to do instead, e.g. "pass token ids with --prompt-ids
 * 1,2,3"), and 1. */
int cli_model_need_tokenizer(const char *cmd, const char *model, const char *alt);
/* df_model_open of `model` with *mo; a streamed install (`deltafin setup --stream`) first opens the source of its
 * experts not yet local into *remote (closed by the caller with stream_close, also after an error) and sets
 * mo->remote_source. Returns df_model_open's code (or stream_open's) with the message in err; prints nothing. */
struct stream_src;
int cli_model_open(df_model **m, struct stream_src **remote, const char *model, df_model_opts *mo, char *err,
                   size_t errlen);
/* The configuration line on stderr: df_model_describe, then for a model found without --model (how non-empty)
 * "; model (no --model): DIR, HOW"; `extra` (may be NULL) is appended as is. */
void cli_model_echo(df_model *m, const char *model, const char *how, const char *extra);
/* The most positions the model takes: its config's max_position_embeddings (config.json, else manifest.json's copy),
 * read before the model is opened; 0 when unknown. (df_model_n_ctx_max says the same once the model is open, except
 * under a --ram-budget, where it is the KV cache's reserve.) */
long cli_max_positions(const char *model);
/* The positions the model was trained on, or 0 when unknown; `src` says where the figure came from. The model card
 * (DIR/README.md, a Hugging Face model card) wins when its YAML front matter names `trained_positions: N` (a model
 * trained on short windows whose config allows far more positions, as kimi-mini: trained on 512,
 * max_position_embeddings 131072 through YaRN); else the config's max_position_embeddings (config.json, or
 * manifest.json's copy in a native dir). */
long cli_trained_positions(const char *model, char *src, size_t cap);
#endif
