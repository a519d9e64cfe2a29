/* cli.h — subcommands of the `deltafin` program. Each lives in its own file
 * (cmd_<name>.c), parses its own flags, and uses only include/deltafin.h.
 * Each returns the process exit status (0 ok, 1 runtime error, 2 usage error). */
#ifndef DF_CLI_H
#define DF_CLI_H
int cmd_run(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_synth(int argc, char **argv);
/* outdir.c: OUT_DIR must be new or empty and expert dirs must hold no packs; with
 * force the deltafin files there are removed first (manifest.json first). `cmd` names
 * the command in messages. Returns 0, or the exit status (1) after printing why. */
int cli_check_out_dirs(const char *cmd, const char *out, const char *expert_dirs, int force, int quiet);
#endif
