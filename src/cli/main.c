/* main.c — the `deltafin` program: dispatches to a subcommand. */
#include "cli.h"
#include "deltafin.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} cmds[] = {
    {"run", cmd_run, "generate text from a prompt"},
    {"chat", cmd_chat, "an interactive conversation with a model in its chat format"},
    {"convert", cmd_convert, "convert a Hugging Face checkpoint to the native layout"},
    {"tokenize", cmd_tokenize, "encode text to token ids (or --decode ids to text)"},
    {"serve", cmd_serve, "OpenAI-compatible HTTP server"},
    {"bench", cmd_bench, "benchmarks: io, decode, prefill, batch, project, machine, kernels, store, cache"},
    {"doctor", cmd_doctor, "verify a model's files and checksums; report the machine"},
    {"setup", cmd_setup, "download a model from a Hugging Face mirror, convert it, make it the default"},
    {"list", cmd_list, "installed models (size, completeness) and the default"},
    {"warm", cmd_warm, "fetch ahead the likeliest experts of a streamed install (from a trace or prompts)"},
    {"synth", cmd_synth, "write a large synthetic checkpoint with real expert shapes"},
};

static void usage(FILE *f) {
    fprintf(f, "deltafin %s — exact MoE inference with streamed experts\n\nusage: deltafin COMMAND [options]\n\n",
            DELTAFIN_VERSION);
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) fprintf(f, "  %-9s %s\n", cmds[i].name, cmds[i].help);
    fprintf(f, "  %-9s %s\n", "version", "print the version (also: deltafin --version)");
    fprintf(f, "\nRun `deltafin COMMAND --help` (or `deltafin help COMMAND`) for a command's options; an option's value\n"
                "may follow it (--max-new 64) or be joined with = (--max-new=64); an option that takes a value may be\n"
                "given once (twice is a usage error, exit 2).\n");
}

/* Everything written to stdout must have reached it: a full disk (> /dev/full), a closed pipe or an I/O error
 * turns a success into exit 1 (a closed pipe quietly, as `head` expects; SIGPIPE, when not ignored, ends the
 * process first with the conventional 141). Returns the exit status. */
static int close_stdout(const char *cmd, int rc) {
    int err = ferror(stdout);
    errno = 0;
    if (fflush(stdout) != 0) err = 1;
    int e = errno;
    if (!err) return rc;
    /* an error of an earlier flush left no errno: an empty write asks the file again (/dev/full: ENOSPC) */
    if (!e && write(STDOUT_FILENO, "", 0) < 0) e = errno;
    if (e != EPIPE)
        fprintf(stderr, "deltafin%s%s: cannot write the output: %s\n", cmd ? " " : "", cmd ? cmd : "",
                e ? strerror(e) : "write error on standard output");
    return rc ? rc : 1;
}

int main(int argc, char **argv) {
    if (argc < 2) { usage(stderr); return 2; }
    /* `deltafin help COMMAND [SUB]` is `deltafin COMMAND [SUB] --help` */
    char *help_argv[8];
    if (!strcmp(argv[1], "help") && argc >= 3 && argc <= 4) {
        int n = 0;
        for (int i = 0; i < argc; i++)
            if (i != 1) help_argv[n++] = argv[i];
        help_argv[n++] = "--help";
        help_argv[n] = NULL;
        argc = n;
        argv = help_argv;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) { usage(stdout); return close_stdout(NULL, 0); }
    /* --opt=value is --opt value, for every command's options */
    argc = cli_split_option_values(argc, argv, &argv);
    if (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version")) {
        /* `version --help` (and `help version`): its usage; any other argument: refused as every command refuses one */
        if (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
            printf("usage: deltafin version   (also: deltafin --version)\nPrints the version of this deltafin binary.\n");
            return close_stdout(NULL, 0);
        }
        if (argc >= 3) {
            static const char *const none[] = {"--help", NULL};
            return cli_unknown_option("version", argv[2], none, NULL);
        }
        printf("deltafin %s\n", DELTAFIN_VERSION);
        return close_stdout(NULL, 0);
    }
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        if (!strcmp(argv[1], cmds[i].name)) return close_stdout(cmds[i].name, cmds[i].fn(argc - 1, argv + 1));
    const char *names[sizeof cmds / sizeof cmds[0] + 2];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) names[i] = cmds[i].name;
    names[sizeof cmds / sizeof cmds[0]] = "version";
    names[sizeof cmds / sizeof cmds[0] + 1] = NULL;
    return cli_unknown_command(argv[1], names);
}
