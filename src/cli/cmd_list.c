/* cmd_list.c — `deltafin list [--registry FILE]`: the installed models of the registry
 * (src/hub/registry.h) with their size on disk and completeness, and the embedded model. */
#define _XOPEN_SOURCE 700
#include "cli.h"
#include "hub/registry.h"
#include "hub/stream.h"
#include "model/native.h"
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
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: deltafin list [--registry FILE]\n"
                   "  the models `deltafin setup` installed: repo, mode, size on disk, completeness (full, or streamed\n"
                   "  with the share of routed experts present locally; DAMAGED, with the reason, when a full install's\n"
                   "  files no longer match its manifest), directory; `*` marks the default model that run / serve /\n"
                   "  tokenize / bench decode, prefill, batch / doctor use without --model. Then the embedded model.\n"
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
    for (int i = 0; i < n; i++) {
        reg_entry *e = &es[i];
        char man[4200], state[64];
        snprintf(man, sizeof man, "%s/manifest.json", e->model);
        struct stat st;
        if (stat(man, &st) != 0) snprintf(state, sizeof state, "MISSING (run setup again)");
        else if (stream_is_streamed(e->model)) {
            double f = stream_local_fraction(e->model);
            if (f >= 0) snprintf(state, sizeof state, "streamed %.1f%%", 100.0 * f);
            else snprintf(state, sizeof state, "streamed");
        }
        else snprintf(state, sizeof state, "full");
        /* a full install whose files no longer match its manifest (a pack missing or cut short): not complete */
        char why[1400] = "";
        if (!strcmp(state, "full")) {
            df_native *nat = NULL;
            const int bad = native_open(&nat, e->model, why, sizeof why) != 0;
            if (!bad && nat->pack_error[0]) snprintf(why, sizeof why, "%s", nat->pack_error);
            if (bad || why[0]) snprintf(state, sizeof state, "DAMAGED");
            native_close(nat);
        }
        printf("%c %-40s %-16s %9.2f GB  %s@%s  %s\n", !strcmp(e->repo, dflt) ? '*' : ' ', e->repo, state,
               disk_usage(e->dir) / 1e9, e->mirror, e->revision, e->model);
        if (why[0]) {
            /* the suggested commands are pasted into a shell: each word quoted; setup run again repairs the install
             * (from the mirror and revision it came from, into its directory, recorded in this registry, the default
             * model staying the default) */
            char qmodel[8300], qrepo[1100], qdir[8300], qmirror[8300], qrev[600], qreg[16400];
            const char *env = getenv("HF_ENDPOINT"), *dmirror = env && *env ? env : "https://huggingface.co";
            const int other_mirror = e->mirror[0] && strcmp(e->mirror, dmirror);
            const int other_rev = e->revision[0] && strcmp(e->revision, "main");
            printf("    %s: %s (`deltafin doctor --model %s` checks every file; `deltafin setup %s --dir %s%s%s%s%s%s%s%s` "
                   "repairs the install)\n",
                   e->repo, why, df_shell_quote(e->model, qmodel, sizeof qmodel), df_shell_quote(e->repo, qrepo, sizeof qrepo),
                   df_shell_quote(e->dir, qdir, sizeof qdir), other_mirror ? " --mirror " : "",
                   other_mirror ? df_shell_quote(e->mirror, qmirror, sizeof qmirror) : "", other_rev ? " --revision " : "",
                   other_rev ? df_shell_quote(e->revision, qrev, sizeof qrev) : "", reg_flag ? " --registry " : "",
                   reg_flag ? df_shell_quote(reg, qreg, sizeof qreg) : "", strcmp(e->repo, dflt) ? " --no-default" : "");
        }
    }
    free(es);
    char emb[4096], how[256];
    if (cli_embedded_model(emb, sizeof emb, how, sizeof how) == 0)
        printf("%c %-40s %-16s %9.2f GB  %s (%s)\n", n && dflt[0] ? ' ' : '*', "embedded kimi-mini", "full", disk_usage(emb) / 1e9, emb, how);
    else printf("  embedded kimi-mini: not found\n");
    return 0;
}
