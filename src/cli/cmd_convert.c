/* cmd_convert.c — `deltafin convert HF_DIR MODEL_DIR [--spine source|bf16|int8]
 * [--expert-dirs D1,D2] [--threads N] [--quiet]`: a Hugging Face checkpoint
 * to the native layout (docs/native-format.md) through df_convert, with a
 * progress line on stderr (MB, %, MB/s). */
#include "cli.h"
#include <limits.h>
#include "deltafin.h"
#include "util/util.h"

#include <cjson/cJSON.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: deltafin convert HF_DIR MODEL_DIR [options]\n\n"
            "Convert a Hugging Face checkpoint (config.json + *.safetensors) into deltafin's native layout:\n"
            "a resident spine (spine.bin), one pack of routed experts per MoE layer (experts-LNNN.pack, each\n"
            "expert one 4 KiB-aligned extent, bytes unchanged) and manifest.json (written last).\n\n"
            "options:\n"
            "  --spine MODE         source (default: keep each spine tensor's encoding, exact),\n"
            "                       bf16 (re-encode f32/f16/fp8 linears as bf16; exact only if lossless, reported),\n"
            "                       int8 (per-row absmax int8 linears; NOT exact)\n"
            "  --expert-dirs D1,D2  stripe every expert over these directories (one per drive)\n"
            "  --stripe-weights W1,W2  stripe k's size proportional to W_k (e.g. GB/s per drive from\n"
            "                       `deltafin bench io --dir D1,D2`); default equal\n"
            "  --threads N          threads that write the expert packs, each one MoE layer at a time: an integer\n"
            "                       from 0 to 1024; 0 (the default) = one per core. At most 16 run, and no more\n"
            "                       than the model has MoE layers; the spine is written by one thread\n"
            "  --force              MODEL_DIR may be non-empty: delete the deltafin model files in it first\n"
            "                       (otherwise a non-empty MODEL_DIR is refused: old packs would be mixed in)\n"
            "  --quiet              no progress line (warnings are still shown)\n"
            "  -h, --help           this help\n"
            "The tokenizer (tokenizer.json or tiktoken.model), tokenizer_config.json, chat_template.jinja,\n"
            "special_tokens_map.json, generation_config.json and README.md are copied when the checkpoint has them.\n"
            "A checkpoint without a tokenizer gives a model that takes token ids only (run --prompt-ids); one with\n"
            "tokenizer_config.json but without the tokenizer itself (a partial download, or a SentencePiece\n"
            "tokenizer.model only) is converted too, with a warning on stderr saying so (exit status 0): put the\n"
            "model's tokenizer.json into MODEL_DIR before using text with it.\n"
            "SIGINT or SIGTERM stops the conversion, removes every file it wrote and exits with 128 + the signal\n"
            "number. A killed conversion leaves *.tmp files and no manifest.json: the next run into that directory\n"
            "removes them only when the directory holds nothing but deltafin's model files; when it holds anything\n"
            "else, that run refuses (it names the other entry) and asks for --force, which deletes the deltafin\n"
            "files first.\n");
}

typedef struct {
    struct timespec t0;
    double last;
    int done;
    int open;       /* a progress line without its newline is on stderr */
    int quiet;      /* no progress line; the callback still answers SIGINT / SIGTERM */
} prog;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int on_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    prog *p = user;
    if (df_interrupted()) return 1; /* df_convert stops and removes every file it wrote */
    if (p->quiet) return 0;
    double t = now_s(), el = t - ((double)p->t0.tv_sec + 1e-9 * (double)p->t0.tv_nsec);
    int last = total && done >= total;
    if (p->done || (!last && (t - p->last < 0.2 || !cli_stderr_tty()))) return 0;
    p->last = t;
    double mb = (double)done / 1e6;
    fprintf(stderr, "%sconvert: %.1f / %.1f MB  %5.1f%%  %.1f MB/s   ", cli_cr(), mb, (double)total / 1e6,
            total ? 100.0 * (double)done / (double)total : 0.0, el > 0 ? mb / el : 0.0);
    p->open = !last;
    if (last) {
        fprintf(stderr, "(%.1f s)\n", el);
        p->done = 1;
    }
    fflush(stderr);
    (void)what;
    return 0;
}

static int cli_path_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

/* existed[k] = whether entry k of the comma-separated list exists (set = 0), or
 * rmdir entry k when it did not exist before (set = 1; only an empty directory goes). */
static void for_each_dir(const char *list, int *existed, int set) {
    if (!list || !*list) return;
    char *cp = strdup(list), *save = NULL;
    int k = 0;
    for (char *t = cp ? strtok_r(cp, ",", &save) : NULL; t && k < 64; t = strtok_r(NULL, ",", &save), k++) {
        if (!set) existed[k] = cli_path_exists(t);
        else if (!existed[k]) rmdir(t);
    }
    free(cp);
}

/* After a failed or interrupted conversion: the directories it created, when empty. 1 when MODEL_DIR went. */
static int remove_created(const char *out, int out_existed, const char *expert_dirs, int *dir_existed) {
    for_each_dir(expert_dirs, dir_existed, 1);
    return !out_existed && rmdir(out) == 0;
}

int cmd_convert(int argc, char **argv) {
    const char *pos[2] = {NULL, NULL};
    int npos = 0, quiet = 0, force = 0;
    df_convert_opts o;
    df_convert_opts_default(&o);
    /* SIGINT / SIGTERM / SIGHUP from here on: stop, remove what was written, exit 128 + signal (installed before any
     * file or directory is created, so that no signal ends the process with one left behind) */
    df_interrupt_install();
    static const char *const values[] = {"--spine", "--expert-dirs", "--threads", "--stripe-weights", NULL};
    if (cli_check_repeated("convert", argc, argv, values, NULL)) return 2;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) { quiet = 1; continue; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        if (!strcmp(a, "--spine") || !strcmp(a, "--expert-dirs") || !strcmp(a, "--threads") || !strcmp(a, "--stripe-weights")) {
            if (i + 1 >= argc) { fprintf(stderr, "deltafin convert: %s needs a value\n", a); return 2; }
            const char *v = argv[++i];
            if (!strcmp(a, "--spine")) {
                if (!strcmp(v, "source")) o.spine = DF_SPINE_SOURCE;
                else if (!strcmp(v, "bf16")) o.spine = DF_SPINE_BF16;
                else if (!strcmp(v, "int8")) o.spine = DF_SPINE_INT8;
                else { fprintf(stderr, "deltafin convert: --spine '%s': expected source, bf16 or int8\n", v); return 2; }
            } else if (!strcmp(a, "--expert-dirs")) {
                o.expert_dirs = v;
            } else if (!strcmp(a, "--stripe-weights")) {
                o.stripe_weights = v;
            } else {
                /* digits only (strtol alone would take "", " 3" and "+3") */
                char *end = NULL;
                errno = 0;
                long n = *v >= '0' && *v <= '9' ? strtol(v, &end, 10) : -1;
                if (!end || *end || errno || n < 0 || n > 1024) {
                    fprintf(stderr, "deltafin convert: --threads \"%s\": expected the number of threads that write the expert "
                                    "packs, an integer from 0 to 1024 (0 = one per core, the default)\n", v);
                    return 2;
                }
                o.threads = (int)n;
            }
            continue;
        }
        static const char *const opts[] = {"--help", "--quiet", "--force", "--spine", "--expert-dirs", "--threads",
                                           "--stripe-weights", NULL};
        if (a[0] == '-' && a[1]) return cli_unknown_option("convert", a, opts, NULL);
        if (npos == 2) { fprintf(stderr, "deltafin convert: unexpected argument '%s'\n\n", a); usage(stderr); return 2; }
        pos[npos++] = a;
    }
    if (npos != 2) {
        if (npos == 1) fprintf(stderr, "deltafin convert: the output directory MODEL_DIR is missing (usage: deltafin convert HF_DIR "
                                       "MODEL_DIR [options]; see deltafin convert --help)\n");
        else usage(stderr);
        return 2;
    }
    if (!*pos[0] || !*pos[1]) {
        fprintf(stderr, "deltafin convert: %s \"\": expected a directory (usage: deltafin convert HF_DIR MODEL_DIR)\n",
                !*pos[0] ? "HF_DIR" : "MODEL_DIR");
        return 2;
    }
    if (cli_check_expert_dirs("convert", o.expert_dirs)) return 2;
    {
        char a[4096], b[4096];
        if (realpath(pos[0], a) && realpath(pos[1], b) && !strcmp(a, b)) {
            fprintf(stderr, "deltafin convert: MODEL_DIR %s is the checkpoint directory itself; choose another directory\n", pos[1]);
            return 2;
        }
    }
    {   /* a directory that is already native (manifest.json, no config.json) needs no conversion */
        char mf[4200], cf[4200];
        snprintf(mf, sizeof mf, "%s/manifest.json", pos[0]);
        snprintf(cf, sizeof cf, "%s/config.json", pos[0]);
        if (cli_path_exists(mf) && !cli_path_exists(cf)) {
            fprintf(stderr, "deltafin convert: %s is already a native deltafin model directory (manifest.json): nothing to "
                    "convert; use it directly with --model %s\n", pos[0], pos[0]);
            return 1;
        }
        struct stat hs;
        if (stat(pos[0], &hs) != 0) {
            fprintf(stderr, "deltafin convert: HF_DIR %s: %s; expected a Hugging Face checkpoint directory (config.json and "
                    "*.safetensors)\n", pos[0], strerror(errno));
            return 1;
        }
        if (!S_ISDIR(hs.st_mode)) {
            fprintf(stderr, "deltafin convert: HF_DIR %s is not a directory; expected a Hugging Face checkpoint directory "
                    "(config.json and *.safetensors)\n", pos[0]);
            return 1;
        }
        if (!cli_path_exists(cf)) {
            fprintf(stderr, "deltafin convert: HF_DIR %s has no config.json: expected a Hugging Face checkpoint directory "
                    "(config.json and *.safetensors; `deltafin setup REPO` downloads one)\n", pos[0]);
            return 1;
        }
    }
    {   /* the architecture first: an unsupported one stops here, before anything is written */
        char arch[320], aerr[1024] = "";
        int arc = df_checkpoint_describe(pos[0], arch, sizeof arch, aerr, sizeof aerr);
        if (arc) {
            fprintf(stderr, "deltafin convert: %s (%s)\n", aerr, df_strerror(arc));
            return 1;
        }
        if (!quiet) fprintf(stderr, "deltafin convert: %s\n", arch);
    }
    /* directories that do not exist yet are removed again if the conversion fails or is interrupted */
    int out_existed = cli_path_exists(pos[1]), dir_existed[64] = {0};
    for_each_dir(o.expert_dirs, dir_existed, 0);
    if (df_interrupted()) { /* before anything was created: nothing to remove */
        fprintf(stderr, "deltafin convert: interrupted by %s before the conversion started: nothing was written\n",
                df_signal_name(df_interrupted()));
        return 128 + df_interrupted();
    }
    int crc = cli_check_out_dirs("convert", "MODEL_DIR", pos[1], o.expert_dirs, force, quiet);
    if (crc) {
        remove_created(pos[1], out_existed, o.expert_dirs, dir_existed);
        return crc;
    }
    /* a README.md still there after --force is the user's own (a converted model's card went with its model): the
     * checkpoint's card would replace it */
    {
        char card[4200], own[4200];
        snprintf(card, sizeof card, "%s/README.md", pos[0]);
        snprintf(own, sizeof own, "%s/README.md", pos[1]);
        if (cli_path_exists(card) && cli_path_exists(own)) {
            fprintf(stderr, "deltafin convert: %s is not a converted model's README.md (--force keeps it), and the "
                            "checkpoint's model card %s would replace it: move it away, or choose another MODEL_DIR\n",
                    own, card);
            return 1;
        }
    }
    prog p = {0};
    p.quiet = quiet;
    clock_gettime(CLOCK_MONOTONIC, &p.t0);
    o.progress = on_progress;
    o.progress_user = &p;
    char err[1024] = "";
    int rc = df_convert(pos[0], pos[1], &o, err, sizeof err);
    int sig = df_interrupted();
    if (rc) {
        if (p.open) fputc('\n', stderr); /* end the progress line before the error */
        int gone = remove_created(pos[1], out_existed, o.expert_dirs, dir_existed);
        if (sig && rc == DF_ECANCELLED) {
            fprintf(stderr, "deltafin convert: interrupted by %s: removed every file it had written to %s%s%s\n", df_signal_name(sig),
                    pos[1], o.expert_dirs ? " and the expert directories" : "",
                    gone ? " (and the directory, which this run had created)" : "");
            return 128 + sig;
        }
        fprintf(stderr, "deltafin convert: %s (%s)\n", err[0] ? err : "failed", df_strerror(rc));
        return rc == DF_EINVAL ? 2 : 1; /* a bad option value (e.g. --stripe-weights) is a usage error */
    }
    if (sig) { /* too late to stop: the last file was being written when the signal came */
        if (p.open) fputc('\n', stderr);
        fprintf(stderr, "deltafin convert: interrupted by %s after the conversion had finished: %s is complete and was kept\n",
                df_signal_name(sig), pos[1]);
        return 128 + sig;
    }
    /* the tokenizer: convert copies tokenizer.json or tiktoken.model when the checkpoint has one. tokenizer_config.json
     * without either is a checkpoint whose tokenizer was left out (a partial download, or a repository that ships only
     * the SentencePiece tokenizer.model, which deltafin does not read): the model is written, but text cannot be used
     * with it, and converting again does not change that; said even with --quiet (a warning, exit status 0) */
    const int has_tok = cli_is_file(pos[0], "tokenizer.json") || cli_is_file(pos[0], "tiktoken.model");
    if (!has_tok && cli_is_file(pos[0], "tokenizer_config.json"))
        fprintf(stderr, "deltafin convert: warning: %s has tokenizer_config.json but no tokenizer.json (nor tiktoken.model)%s: %s "
                        "has no tokenizer, so run --prompt, run --chat, tokenize and the server's text requests cannot be used "
                        "with it (token ids only: run --prompt-ids). Put the model's tokenizer.json (from its repository) into %s; "
                        "converting again does not add one unless it is in %s\n",
                pos[0], cli_is_file(pos[0], "tokenizer.model") ? "; its tokenizer.model (SentencePiece) is not a format deltafin reads" : "",
                pos[1], pos[1], pos[0]);
    if (!quiet) {
        /* --spine bf16: exact only when every re-encoded value was a bf16 already (manifest.json records it) */
        char note[160] = "";
        if (o.spine == DF_SPINE_INT8) snprintf(note, sizeof note, ", NOT EXACT");
        else if (o.spine == DF_SPINE_BF16) {
            char man[4200], *buf = NULL;
            size_t len = 0;
            snprintf(man, sizeof man, "%.4000s/manifest.json", pos[1]);
            cJSON *m = df_read_file(man, &buf, &len, NULL, 0) == 0 ? cJSON_ParseWithLength(buf, len) : NULL;
            free(buf);
            const cJSON *ll = cJSON_GetObjectItemCaseSensitive(m, "spine_bf16_lossless");
            const cJSON *nl = cJSON_GetObjectItemCaseSensitive(m, "spine_lossy_tensors");
            if (cJSON_IsTrue(ll)) snprintf(note, sizeof note, ", lossless: exact");
            else if (cJSON_IsFalse(ll))
                snprintf(note, sizeof note, ", NOT EXACT: %d spine tensors had values that are not bf16 (use --spine source)",
                         cJSON_IsNumber(nl) ? nl->valueint : 0);
            cJSON_Delete(m);
        }
        fprintf(stderr, "deltafin convert: wrote %s (spine %s%s%s)\n", pos[1],
                o.spine == DF_SPINE_SOURCE ? "source" : o.spine == DF_SPINE_BF16 ? "bf16" : "int8", note,
                has_tok ? "" : "; no tokenizer: token ids only");
    }
    return 0;
}
