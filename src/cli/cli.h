/* cli.h — subcommands of the `deltafin` program. Each lives in its own file
 * (cmd_<name>.c), parses its own flags, and uses only include/deltafin.h.
 * Each returns the process exit status (0 ok, 1 runtime error, 2 usage error). */
#ifndef DF_CLI_H
#define DF_CLI_H
#include <stddef.h>
#include <stdint.h>
int cmd_run(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_synth(int argc, char **argv);
/* outdir.c: the output directory (`label` in messages: MODEL_DIR, OUT_DIR) must be new or empty and expert dirs hold no packs; with
 * force the deltafin files there are removed first (manifest.json first). `cmd` names
 * the command in messages. Returns 0, or the exit status (1) after printing why. */
int cli_check_out_dirs(const char *cmd, const char *label, const char *out, const char *expert_dirs, int force, int quiet);
/* outdir.c: --expert-dirs "D1,D2,...": 1..16 non-empty names, none twice (trailing slashes aside). 0, or 2 (a usage
 * error) after printing "deltafin CMD: --expert-dirs ..." on stderr. */
int cli_check_expert_dirs(const char *cmd, const char *dirs);
/* cli_args.c: "4G", "512M", "100K", "1.5GiB", "12345" -> bytes (powers of 1024; an optional
 * "i" and "B" after the unit). 0, or -1 for anything else (trailing text, negative, overflow). */
int cli_parse_size(const char *s, uint64_t *out);
/* 1 when stderr is a terminal: progress lines are redrawn in place ("\r"); else (a log file, a pipe) only each
 * progress's final line is written, without carriage returns. cli_cr() is "\r" or "" accordingly. */
int cli_stderr_tty(void);
/* "" for an exact model, else the label its results carry wherever they print (run --stats, the bench results):
 * " (NOT EXACT: int8 spine)" or " (NOT EXACT: lossy bf16 spine)". */
struct df_model;
const char *cli_exact_note(struct df_model *m);
const char *cli_cr(void);
/* 1 when `a` is one of the NULL-terminated names: a parser asks it before saying "A needs a value", so a
 * mistyped flag at the end of the command line is an unknown option, not a flag without its value. */
int cli_known_option(const char *a, const char *const *names);
/* A single-value option given twice ("run --prompt a --prompt b": the later value would silently replace the earlier):
 * argv scanned for the options of the NULL-terminated `values` / `values2` (values2 may be NULL), those that take a
 * value (which is skipped, so "--prompt --prompt" is one option and its value). 0, or 2 (a usage error) after
 * "deltafin CMD: --prompt is given more than once ("a", then "b"); it takes one value: give it once" on stderr. */
int cli_check_repeated(const char *cmd, int argc, char **argv, const char *const *values, const char *const *values2);
/* The same check for the value option argv[i] alone (its earlier occurrences in argv[1..i)): for a parser that meets
 * each option in turn. 0, or 2 after the message. */
int cli_repeated_at(const char *cmd, int argc, char **argv, int i, const char *const *values, const char *const *values2);
/* One entry of a command's option table, which ends with {NULL, 0}: the option's name ("--model") and whether it takes
 * a value. The one table gives both the names an unknown option is compared with (cli_unknown_option_in, in table
 * order) and the value options that may be given only once (cli_check_repeated_in). At most CLI_MAX_OPTIONS entries
 * before the terminator (CLI_OPTIONS_FIT checks a table at compile time). */
typedef struct {
    const char *name;
    int takes_value;
} cli_option;
#define CLI_MAX_OPTIONS 64
#define CLI_OPTIONS_FIT(t) _Static_assert(sizeof(t) / sizeof((t)[0]) <= CLI_MAX_OPTIONS + 1, #t ": too many options")
/* cli_check_repeated with the value options of `opts` (an option table, above) as `values`: 0, or 2 after the message. */
int cli_check_repeated_in(const char *cmd, int argc, char **argv, const cli_option *opts, const char *const *values2);
/* cli_unknown_option (below) with every name of `opts` (an option table, above) as `names`. Returns 2. */
int cli_unknown_option_in(const char *cmd, const char *a, const cli_option *opts, const char *const *names2);
/* 1 when the comma-separated list s has an empty item ("a,,b", ",a", "a," or ""): lists are refused so everywhere. */
int cli_list_has_empty(const char *s);
/* The token ids of a comma-separated list ("1,2, 3"; spaces, tabs and line breaks around an item are ignored): each a
 * decimal integer in [0, INT32_MAX], no empty item, at least one. run --prompt-ids and tokenize --decode parse by it.
 * 0 with *out (malloc'd) and *n, else -1 and a one-line reason in err ("empty item at position 1 (expected ...)",
 * "token id -1 at position 0 is out of range (...)", "not a token id at position 2, near 'abc' (...)"). */
int cli_parse_ids(const char *s, int32_t **out, size_t *n, char *err, size_t errlen);
/* A --seed value (`flag` names it): a decimal integer in [-2^63, 2^64-1], a negative one mapped as (uint64_t)(int64_t)v
 * (as the server maps a request's "seed", so the same seed samples the same tokens in both). 0, else a usage message
 * naming the command, flag and value and -1. */
int cli_parse_seed(const char *cmd, const char *flag, const char *v, uint64_t *out);
/* s[0..n) must be well-formed UTF-8 (util.h: df_utf8_invalid_at), as the server requires of a request: 0, else
 * "deltafin CMD: WHAT is not valid UTF-8: invalid byte 0xNN at byte offset K" on stderr and -1. */
int cli_check_utf8(const char *cmd, const char *what, const char *s, size_t n);
/* Every "--name=value" of argv (name: letters, digits and dashes) as the two arguments "--name" "value", so each
 * command's parser accepts both forms; the value after --prompt, --api-key or --system (free text) is kept whole. *out gets
 * the new argv (NULL-terminated; argv itself when out of memory); returns its count. */
int cli_split_option_values(int argc, char **argv, char ***out);
/* An unknown option `a` of `cmd` ("run", "bench io"): one line on stderr, "deltafin CMD: unknown option 'A' (see
 * deltafin CMD --help)", with "did you mean" when A is a prefix of only one of the NULL-terminated `names` / `names2`
 * (either may be NULL), or one of them is within 2 edits of A; "unexpected argument" when A is no option. Returns 2. */
int cli_unknown_option(const char *cmd, const char *a, const char *const *names, const char *const *names2);
/* An unknown command: "deltafin: unknown command 'A' (see deltafin --help)", with "did you mean" as above. Returns 2. */
int cli_unknown_command(const char *a, const char *const *names);
/* The name of the NULL-terminated `names` that "did you mean" above would suggest for A, else NULL. */
const char *cli_closest(const char *a, const char *const *names);
/* cli_args.c: the Levenshtein distance of a and b (each cut at 63 bytes). */
int cli_edit_distance(const char *a, const char *b);
/* --prefetch auto|on|off|ungated / --prefault auto|on|off (by `flag`) into df_model_opts' 0 / 1 / 2 (/ 3 = ungated):
 * 0, else a usage message naming the command, flag and value and -1. */
int cli_parse_mode(const char *cmd, const char *flag, const char *v, int *out);
/* --io-depth N (expert reads in flight per drive, 1..1024) into *depth, --io-size SIZE (bytes of one read, a multiple
 * of 4 KiB up to 64 MiB) into *size (df_model_opts.io_depth / io_size): 0, else a usage message naming the command,
 * flag and value and -1. */
int cli_parse_io(const char *cmd, const char *flag, const char *v, int *depth, uint64_t *size);
/* The progress of a first-use conversion (a df_progress_fn for df_model_opts.progress or convert_cached; user unused):
 * "converting: WHAT P% (DONE / TOTAL)" on stderr, rewritten in place on a terminal, and its final line once however
 * often the converter reports completion. cli_convert_progress_end() ends an unfinished line (before an error
 * message) and returns 1 when there was one. Used by run, bench and doctor alike. */
int cli_convert_progress(void *user, const char *what, uint64_t done, uint64_t total);
int cli_convert_progress_end(void);
/* --cache-dir DIR: 0 when DIR is not empty, else a usage message naming the command and -1. */
int cli_check_cache_dir(const char *cmd, const char *v);
/* 1 when dir/name is a regular file. */
int cli_is_file(const char *dir, const char *name);
/* --model PATH must be an existing directory: 0, else a message naming the flag
 * ("deltafin CMD: --model PATH: no such directory" / "is not a directory") and 1. */
int cli_check_model_dir(const char *cmd, const char *path);
/* default_model.c: the model of a command run without --model: the registry's default
 * (`deltafin setup`; registry file from $DELTAFIN_REGISTRY, $XDG_DATA_HOME or HOME), else
 * the embedded models/kimi-mini. out gets the directory, how a phrase for the configuration
 * line ("installed REPO (full) from registry FILE" / "embedded kimi-mini, found beside the
 * executable"). 0, or 1 after printing why there is none, or why the registry's default cannot be used (its model
 * directory has no manifest.json, or "default" names a repo the registry has no entry for): never another model. */
int cli_default_model(const char *cmd, char *out, size_t cap, char *how, size_t howcap);
/* The embedded models/kimi-mini only: 0 and out/how filled, -1 when not found. */
int cli_embedded_model(char *out, size_t cap, char *how, size_t howcap);
/* The model of a command run without --model (how: cli_default_model's) failed: to open (rc the DF_E* of df_model_open),
 * or with its cause unknown (rc 0: serve's exit status). When it is the installed default and its files are damaged
 * (rc DF_EIO or DF_EFORMAT; with rc 0 when the quick check of `deltafin list` (src/hub/install.h) finds damage, which it
 * then names), prints on stderr "deltafin CMD: the default model REPO is an install of `deltafin setup` (in DIR):
 * `deltafin setup REPO --dir DIR ...` verifies and repairs it" (the command shell-quoted, as `deltafin list` prints it).
 * Returns 1 when it printed, else 0. Used by run, serve and bench alike. */
int cli_default_model_repair(const char *cmd, const char *how, int rc);
/* When model_dir is an install of `deltafin setup` (the registry's entry whose native directory it is, by real path):
 * 1, the command that verifies and repairs it in fix (as cli_default_model_repair names it; --no-default when it is
 * not the default model) and the checkpoint directory of its side files in ck (may be NULL); else 0. */
int cli_setup_install(const char *model_dir, char *fix, size_t cap, char *ck, size_t ckcap);
/* A model with tokenizer_config.json but neither tokenizer.json nor tiktoken.model (the tokenizer itself): what repairs it,
 * as one clause for a message, depending on where a tokenizer can come from: a setup install's repair command when
 * its checkpoint has one; for a converted model, the copy in the checkpoint it was converted from (its manifest's
 * source.dir), or, when that checkpoint has none either, the model's repository (converting again does not help).
 * Returns 1 when it names a setup install's repair command that restores the tokenizer, else 0. */
int cli_tokenizer_fix(const char *model, char *out, size_t cap);
/* An error opening model (run, bench): prints "deltafin CMD: MSG" on stderr, where a setup install's message names
 * the setup command that repairs it instead of the engine's convert advice (df_advice_setup_repair), then
 * cli_default_model_repair(cmd, how, rc). */
void cli_model_open_error(const char *cmd, const char *model, const char *how, const char *msg, int rc);
int cmd_setup(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_warm(int argc, char **argv);
/* --backend NAME: 0 when NAME is auto, cpu, cpu-scalar, cpu-avx2, cpu-avx512 or cuda, else a message naming
 * the command and 2. The default backend of run, serve and bench: env DF_BACKEND if set, else "auto"
 * (cuda when a CUDA device is present, else cpu). */
int cli_check_backend(const char *cmd, const char *name);
/* --preload: df_model_preload with a progress line and a closing line on stderr (none when quiet); 0, or 1 after
 * printing "deltafin CMD: --preload: ..." */
struct df_model;
int cli_preload(const char *cmd, struct df_model *m, int quiet);
const char *cli_default_backend(void);
/* The environment aliases of the model options, checked as their flags are (a usage error, exit 2, naming the
 * variable): DF_BACKEND when `backend` is its value (cli_default_backend's pointer: no --backend given), DF_PREFETCH
 * when prefetch == 0 and DF_PREFAULT when prefault == 0 (no flag, or auto: the engine then reads them, with
 * df_env_switch of util/util.h, which this check uses too). 0, or 2 after one line on stderr. */
int cli_check_env_aliases(const char *cmd, const char *backend, int prefetch, int prefault);
/* --ram-budget SIZE (0 = no budget; run, serve, bench decode / prefill / batch) or --gpu-budget SIZE (> 0; run and
 * serve) into *out: 0, or 2 after one line on stderr naming the flag and the value. */
int cli_parse_budget(const char *cmd, const char *flag, const char *v, uint64_t *out);
#endif
