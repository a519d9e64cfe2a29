/* default_model.c — the model a command uses when it is run without --model: the default
 * entry of the installed-models registry (`deltafin setup`), else the embedded
 * models/kimi-mini, looked up beside the executable (a build tree inside the source tree),
 * under the install prefix (PREFIX/share/deltafin/models) and in the source tree the
 * program was built from. */
#include "cli.h"
#include "hub/registry.h"
#include "util/util.h"

#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef DF_SOURCE_DIR
#define DF_SOURCE_DIR ""
#endif

static int has_model(const char *d) { return cli_is_file(d, "config.json") || cli_is_file(d, "manifest.json"); }

int cli_embedded_model(char *out, size_t cap, char *how, size_t howcap) {
    char exe[PATH_MAX], cand[PATH_MAX + 64];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *s = strrchr(exe, '/');
        if (s) *s = 0;
        static const char *const rel[][2] = {{"../models/kimi-mini", "beside the executable"},
                                             {"../share/deltafin/models/kimi-mini", "under the install prefix"},
                                             {"models/kimi-mini", "beside the executable"}};
        for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
            snprintf(cand, sizeof cand, "%s/%s", exe, rel[i][0]);
            char abs[PATH_MAX];
            if (has_model(cand) && realpath(cand, abs)) {
                snprintf(out, cap, "%s", abs);
                snprintf(how, howcap, "embedded kimi-mini, found %s", rel[i][1]);
                return 0;
            }
        }
    }
    if (DF_SOURCE_DIR[0]) {
        snprintf(cand, sizeof cand, "%s/models/kimi-mini", DF_SOURCE_DIR);
        if (has_model(cand)) {
            snprintf(out, cap, "%s", cand);
            snprintf(how, howcap, "embedded kimi-mini, found in the source tree");
            return 0;
        }
    }
    return -1;
}

int cli_default_model(const char *cmd, char *out, size_t cap, char *how, size_t howcap) {
    char reg[4096], err[512];
    reg_entry e;
    if (registry_path(NULL, reg, sizeof reg, err, sizeof err) == 0) {
        int rc = registry_default(reg, &e, err, sizeof err);
        if (rc < 0) fprintf(stderr, "deltafin %s: warning: %s\n", cmd, err);
        if (rc == 1) {
            snprintf(out, cap, "%s", e.model);
            snprintf(how, howcap, "installed %s (%s) from registry %s", e.repo, e.mode, reg);
            return 0;
        }
        if (rc == 2) {
            char qrepo[1100], qdir[8300]; /* the suggested command is pasted into a shell: each word quoted */
            fprintf(stderr, "deltafin %s: the default model %s (installed by `deltafin setup`, registry %s) is missing: "
                            "%s has no manifest.json%s. Restore or mount %s, install it again with `deltafin setup %s --dir %s`, "
                            "pass --model DIR, or make another installed model the default with `deltafin setup OTHER/REPO` "
                            "(`deltafin list` shows them)\n",
                    cmd, e.repo, reg, e.model, df_path_exists(e.model) ? "" : " (no such directory)", e.dir,
                    df_shell_quote(e.repo, qrepo, sizeof qrepo), df_shell_quote(e.dir, qdir, sizeof qdir));
            return 1;
        }
    }
    if (cli_embedded_model(out, cap, how, howcap) == 0) return 0;
    fprintf(stderr, "deltafin %s: no --model given, no installed model (registry %s) and no embedded models/kimi-mini "
                    "found (looked in models/kimi-mini beside the executable, in ../share/deltafin/models/kimi-mini under "
                    "its install prefix%s%s): pass --model DIR, install one with `deltafin setup REPO`, or copy the "
                    "repository's models/kimi-mini beside the executable\n",
            cmd, reg, DF_SOURCE_DIR[0] ? " and in the source tree " : "", DF_SOURCE_DIR);
    return 1;
}
