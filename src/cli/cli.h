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
#endif
