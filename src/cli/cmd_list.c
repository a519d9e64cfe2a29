/* cmd_list.c — `deltafin list [--registry FILE]`: the installed models of the registry
 * (src/hub/registry.h) with their size on disk and completeness, and the embedded model. */
#define _XOPEN_SOURCE 700
#include "cli.h"
#include "hub/install.h"
#include "hub/registry.h"
#include "hub/stream.h"
#include "util/util.h"

#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t du_total;

static int du_add(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)p; (void)f;
    if (flag == FTW_F) du_total += (uint64_t)st->st_blocks * 512u;
    return 0;
}

/* Bytes the files under dir take on disk (allocated blocks: a sparse pack counts what it holds). */
static uint64_t disk_usage(const char *dir) {
    du_total = 0;
    nftw(dir, du_add, 32, FTW_PHYS);
    return du_total;
}

int cmd_list(int argc, char **argv) {
    const char *reg_flag = NULL;
    static const char *const values[] = {"--registry", NULL};
    if (cli_check_repeated("list", argc, argv, values, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltafin list [--registry FILE]\n"
                   "  the models `deltafin setup` installed: repo, mode, size on disk, completeness, directory. Completeness:\n"
                   "  full; streamed x%% (the share of routed experts present locally); or DAMAGED, with the reason and the\n"
                   "  `deltafin setup` command that repairs it, when a full install fails a quick check: spine.bin or an\n"
                   "  expert pack missing or of another size, spine.bin's checksum (when at most 256 MiB), a tokenizer or\n"
                   "  other file convert copied missing or not the checkpoint's copy (`deltafin doctor` checks every checksum).\n"
                   "  `*` marks the default model that run / serve / tokenize / bench decode, prefill, batch / doctor use\n"
                   "  without --model; a default the registry has no entry for is listed (with how to fix it) after the\n"
                   "  installed models: those commands refuse it. Then, under its own heading, the embedded model (built in,\n"
                   "  not counted as installed; the default when the registry names none).\n"
                   "  --registry FILE  the registry (default $DELTAFIN_REGISTRY, else $XDG_DATA_HOME/deltafin/models.json,\n"
                   "                   else ~/.local/share/deltafin/models.json)\n");
            return 0;
        }
        if (!strcmp(argv[i], "--registry") && i + 1 < argc) reg_flag = argv[++i];
        else if (!strcmp(argv[i], "--registry")) { fprintf(stderr, "deltafin list: --registry needs a value\n"); return 2; }
        else {
            static const char *const opts[] = {"--help", "--registry", NULL};
            return cli_unknown_option("list", argv[i], opts, NULL);
        }
    }
    char reg[4096], err[1024], dflt[256];
    if (registry_path(reg_flag, reg, sizeof reg, err, sizeof err)) { fprintf(stderr, "deltafin list: %s\n", err); return 1; }
    reg_entry *es = NULL;
    int n = 0;
    if (registry_load(reg, &es, &n, dflt, sizeof dflt, err, sizeof err)) { fprintf(stderr, "deltafin list: %s\n", err); return 1; }
    printf("installed models (registry %s): %d\n", reg, n);
    int dflt_found = 0;
    for (int i = 0; i < n; i++) dflt_found |= dflt[0] && !strcmp(es[i].repo, dflt);
    for (int i = 0; i < n; i++) {
        reg_entry *e = &es[i];
        char man[4200], state[64];
        snprintf(man, sizeof man, "%s/manifest.json", e->model);
        struct stat st;
        if (stat(man, &st) != 0) snprintf(state, sizeof state, "MISSING (run setup again)");
        else if (stream_is_streamed(e->model)) {
            const double f = stream_local_percent(e->model);
            if (f >= 0) snprintf(state, sizeof state, "streamed %.1f%%", f);
            else snprintf(state, sizeof state, "streamed");
        }
        else snprintf(state, sizeof state, "full");
        /* a full install whose files no longer match its manifest (spine.bin or a pack missing or cut short, a corrupt
         * spine.bin) or whose side files are not the checkpoint's (tokenizer.json gone): not complete. The quick check
         * (src/hub/install.h): every size, the side files, spine.bin's checksum when small; the experts' contents are
         * doctor's (and setup's) */
        char why[1400] = "";
        if (!strcmp(state, "full")) {
            char ck[4200];
            install_checkpoint_dir(e->dir, e->repo, ck, sizeof ck);
            if (install_quick_check(e->model, ck, why, sizeof why)) snprintf(state, sizeof state, "DAMAGED");
        }
        printf("%c %-40s %-16s %9.2f GB  %s@%s  %s\n", !strcmp(e->repo, dflt) ? '*' : ' ', e->repo, state,
               disk_usage(e->dir) / 1e9, e->mirror, e->revision, e->model);
        if (why[0]) {
            /* the suggested commands are pasted into a shell: each word quoted; setup run again repairs the install
             * (from the mirror and revision it came from, into its directory, recorded in this registry, the default
             * model staying the default) */
            char qmodel[8300], fix[40000];
            registry_repair_command(e, reg_flag ? reg : NULL, strcmp(e->repo, dflt) != 0, fix, sizeof fix);
            printf("    %s: %s (`deltafin doctor --model %s` checks every file; `%s` repairs the install)\n", e->repo, why,
                   df_shell_quote(e->model, qmodel, sizeof qmodel), fix);
        }
    }
    free(es);
    if (dflt[0] && !dflt_found) {
        /* a dangling default: the commands without --model refuse it (cli_default_model) rather than use the embedded
         * model; said here with the same ways out, each command quoted for the shell */
        char qrepo[1100], qreg[16400];
        printf("* %s: the default model, but the registry has no entry for it (the entry was removed, e.g. by editing the "
               "file): run / serve / tokenize / bench / doctor without --model refuse it. `deltafin setup %s%s%s` installs "
               "it again, `deltafin setup OTHER/REPO` makes an installed model the default, or remove the \"default\" key "
               "from %s to use the embedded model\n",
               dflt, df_shell_quote(dflt, qrepo, sizeof qrepo), reg_flag ? " --registry " : "",
               reg_flag ? df_shell_quote(reg, qreg, sizeof qreg) : "", reg);
    }
    char emb[4096], how[256];
    printf("built-in model (not in the registry):\n");
    /* `*` when the registry names no default: the embedded model is then the one the commands use */
    if (cli_embedded_model(emb, sizeof emb, how, sizeof how) == 0)
        printf("%c %-40s %-16s %9.2f GB  %s (%s)\n", dflt[0] ? ' ' : '*', "embedded kimi-mini", "full", disk_usage(emb) / 1e9, emb, how);
    else printf("  embedded kimi-mini: not found\n");
    return 0;
}
