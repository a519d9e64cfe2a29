/* test_convert_cli.c — `deltafin convert` end to end through the binary
 * ($DF_BIN): each golden checkpoint converts (source, bf16 and int8 spines,
 * striped experts), the result opens and verifies, and usage / missing-input /
 * corrupt-input errors give the documented exit codes and messages. */
#include "test_util.h"

#include "model/native.h"
#include "util/util.h"

#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static char tmpdir[256];
static const char *bin;

/* Run a shell command; stdout+stderr into out (cap). Returns the exit status. */
static int run(char *out, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int run(char *out, size_t cap, const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void check_model(const char *dir, const char *mode, const char *what) {
    df_native *n;
    char err[1024];
    int rc = native_open(&n, dir, err, sizeof err);
    CHECK(rc == 0, "%s: open: %s", what, err);
    if (rc) return;
    CHECK(!strcmp(n->spine_mode, mode), "%s: spine_mode %s", what, n->spine_mode);
    if (!strcmp(mode, "int8")) CHECK(n->exact == 0, "%s: int8 not exact", what);
    if (!strcmp(mode, "source")) CHECK(n->exact == 1, "%s: source exact", what);
    CHECK(native_verify(n, NULL, NULL, err, sizeof err) == 0, "%s: verify: %s", what, err);
    native_close(n);
}

int main(void) {
    bin = getenv("DF_BIN");
    if (!bin) bin = "build/deltafin";
    if (!df_path_exists(bin)) {
        printf("no deltafin binary at %s (set DF_BIN): skipped\n", bin);
        return t_done();
    }
    snprintf(tmpdir, sizeof tmpdir, "/tmp/df_test_convert_cli_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    char out[8192];
    int rc = run(out, sizeof out, "%s convert --help", bin);
    CHECK(rc == 0 && strstr(out, "--spine") && strstr(out, "--expert-dirs"), "--help (rc %d)", rc);
    rc = run(out, sizeof out, "%s convert onlyone", bin);
    CHECK(rc == 2, "one argument -> usage (rc %d)", rc);
    rc = run(out, sizeof out, "%s convert a b --spine fp4", bin);
    CHECK(rc == 2 && strstr(out, "fp4"), "bad --spine -> usage (rc %d): %s", rc, out);
    rc = run(out, sizeof out, "%s convert a b --bogus", bin);
    CHECK(rc == 2 && strstr(out, "--bogus"), "unknown option (rc %d)", rc);
    rc = run(out, sizeof out, "%s convert %s/nope %s/o", bin, tmpdir, tmpdir);
    CHECK(rc == 1 && strstr(out, "nope") && strstr(out, "config.json"), "missing dir (rc %d): %s", rc, out);

    DIR *d = opendir("tests/golden");
    int n_cases = 0;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char src[600], dst[800], cfg[700];
        snprintf(src, sizeof src, "tests/golden/%s", de->d_name);
        snprintf(cfg, sizeof cfg, "%s/config.json", src);
        if (de->d_name[0] == '.' || !df_path_exists(cfg)) continue;
        n_cases++;
        static const char *const modes[3] = {"source", "bf16", "int8"};
        for (int m = 0; m < 3; m++) {
            snprintf(dst, sizeof dst, "%s/%s-%s", tmpdir, de->d_name, modes[m]);
            rc = run(out, sizeof out, "%s convert %s %s --spine %s", bin, src, dst, modes[m]);
            CHECK(rc == 0 && strstr(out, "100.0%"), "%s --spine %s (rc %d): %s", de->d_name, modes[m], rc, out);
            if (!rc) check_model(dst, modes[m], dst);
        }
        /* striped over two directories, quiet */
        snprintf(dst, sizeof dst, "%s/%s-striped", tmpdir, de->d_name);
        rc = run(out, sizeof out, "%s convert %s %s --expert-dirs %s/da-%s,%s/db-%s --threads 1 --quiet", bin, src, dst, tmpdir, de->d_name,
                 tmpdir, de->d_name);
        CHECK(rc == 0 && !strstr(out, "MB/s"), "%s striped quiet (rc %d): %s", de->d_name, rc, out);
        if (!rc) check_model(dst, "source", dst);
    }
    if (d) closedir(d);
    printf("golden checkpoints converted through the CLI: %d\n", n_cases);

    /* a truncated checkpoint: exit 1, message names the file, no manifest */
    if (n_cases) {
        rc = run(out, sizeof out,
                 "mkdir -p %s/trunc && cp tests/golden/bf16_kimi/config.json %s/trunc/ && head -c 20000 tests/golden/bf16_kimi/model.safetensors > "
                 "%s/trunc/model.safetensors",
                 tmpdir, tmpdir, tmpdir);
        if (rc == 0) {
            rc = run(out, sizeof out, "%s convert %s/trunc %s/trunc-out", bin, tmpdir, tmpdir);
            char man[600];
            snprintf(man, sizeof man, "%s/trunc-out/manifest.json", tmpdir);
            CHECK(rc == 1 && strstr(out, "model.safetensors") && !df_path_exists(man), "truncated checkpoint (rc %d): %s", rc, out);
        }
    }
    /* the tokenizer: a checkpoint without one converts to a token-ids model (said on the last line); one with
     * tokenizer_config.json but without tokenizer.json converts too (exit 0) with a warning naming the missing file and
     * what it means, also with --quiet; with tokenizer.json, no warning and the tokenizer is copied */
    if (n_cases) {
        char want[2048];
        rc = run(out, sizeof out, "%s convert tests/golden/bf16_kimi %s/notok", bin, tmpdir);
        CHECK(rc == 0 && strstr(out, "(spine source; no tokenizer: token ids only)") && !strstr(out, "warning"),
              "checkpoint without a tokenizer (rc %d): %s", rc, out);
        rc = run(out, sizeof out, "mkdir -p %s/cfgonly && cp tests/golden/bf16_kimi/* models/kimi-mini/tokenizer_config.json %s/cfgonly/",
                 tmpdir, tmpdir);
        CHECK(rc == 0, "copy a checkpoint: %s", out);
        for (int quiet = 0; quiet < 2 && !rc; quiet++) {
            rc = run(out, sizeof out, "%s convert %s/cfgonly %s/cfgonly-out%d%s", bin, tmpdir, tmpdir, quiet, quiet ? " --quiet" : "");
            snprintf(want, sizeof want,
                     "deltafin convert: warning: %s/cfgonly has tokenizer_config.json but no tokenizer.json (nor tiktoken.model): "
                     "%s/cfgonly-out%d has no tokenizer, so run --prompt, run --chat, tokenize and the server's text requests cannot "
                     "be used with it (token ids only: run --prompt-ids). Put the model's tokenizer.json (from its repository) "
                     "into %s/cfgonly-out%d; converting again does not add one unless it is in %s/cfgonly\n",
                     tmpdir, tmpdir, quiet, tmpdir, quiet, tmpdir);
            char tc[700];
            snprintf(tc, sizeof tc, "%s/cfgonly-out%d/tokenizer_config.json", tmpdir, quiet);
            CHECK(rc == 0 && strstr(out, want) && df_path_exists(tc), "tokenizer_config.json without tokenizer.json%s (rc %d): %s",
                  quiet ? ", --quiet" : "", rc, out);
            rc = 0;
        }
        rc = run(out, sizeof out, "touch %s/cfgonly/tokenizer.model && %s convert %s/cfgonly %s/cfgonly-sp --quiet", tmpdir, bin,
                 tmpdir, tmpdir);
        CHECK(rc == 0 && strstr(out, "(nor tiktoken.model); its tokenizer.model (SentencePiece) is not a format deltafin reads: "),
              "a SentencePiece tokenizer.model only (rc %d): %s", rc, out);
        rc = run(out, sizeof out, "rm %s/cfgonly/tokenizer.model && cp models/kimi-mini/tokenizer.json %s/cfgonly/ && %s convert %s/cfgonly %s/withtok",
                 tmpdir, tmpdir, bin, tmpdir, tmpdir);
        char tj[700];
        snprintf(tj, sizeof tj, "%s/withtok/tokenizer.json", tmpdir);
        CHECK(rc == 0 && !strstr(out, "warning") && !strstr(out, "no tokenizer") && df_path_exists(tj),
              "checkpoint with tokenizer.json (rc %d): %s", rc, out);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
    return t_done();
}
