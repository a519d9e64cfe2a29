/* cli_args.c — argument parsing shared by the subcommands (one definition of a
 * size and of "a regular file in a directory", so every command accepts the same forms). */
#include "cli.h"
#include "deltafin.h"
#include "util/util.h"
#include <errno.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return -1;
    switch (*end) {
    case 'k': case 'K': v *= 1024.0; end++; break;
    case 'm': case 'M': v *= 1048576.0; end++; break;
    case 'g': case 'G': v *= 1073741824.0; end++; break;
    case 't': case 'T': v *= 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end || v >= 18446744073709551616.0) return -1;
    *out = (uint64_t)v;
    return 0;
}

int cli_known_option(const char *a, const char *const *names) {
    for (; *names; names++)
        if (!strcmp(a, *names)) return 1;
    return 0;
}

int cli_list_has_empty(const char *s) {
    size_t n = strlen(s);
    return !n || s[0] == ',' || s[n - 1] == ',' || strstr(s, ",,") != NULL;
}

int cli_is_file(const char *dir, const char *name) {
    char p[8192];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int cli_check_model_dir(const char *cmd, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        if (e == ENOENT || e == ENOTDIR)
            fprintf(stderr, "deltafin %s: --model %s: no such directory (expected a model directory with manifest.json "
                            "or config.json)\n", cmd, path);
        else fprintf(stderr, "deltafin %s: --model %s: %s\n", cmd, path, strerror(e));
        return 1;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "deltafin %s: --model %s is not a directory (expected a model directory with manifest.json or "
                        "config.json)\n", cmd, path);
        return 1;
    }
    return 0;
}

/* The names --backend (and DF_BACKEND) take. */
#define BACKEND_NAMES "auto, cpu, cpu-scalar, cpu-avx2, cpu-avx512 or cuda"
static int backend_known(const char *name) {
    static const char *const ok[] = {"auto", "cpu", "cpu-scalar", "cpu-avx2", "cpu-avx512", "cuda", NULL};
    for (int i = 0; ok[i]; i++)
        if (!strcmp(name, ok[i])) return 1;
    return 0;
}

int cli_check_backend(const char *cmd, const char *name) {
    if (backend_known(name)) return 0;
    fprintf(stderr, "deltafin %s: --backend \"%s\": expected " BACKEND_NAMES "\n", cmd, name);
    return 2;
}

const char *cli_default_backend(void) {
    const char *e = getenv("DF_BACKEND");
    return e && *e ? e : "auto";
}

int cli_check_env_aliases(const char *cmd, const char *backend, int prefetch, int prefault) {
    const char *e = getenv("DF_BACKEND");
    if (e && *e && backend == e && !backend_known(e)) {
        fprintf(stderr, "deltafin %s: environment variable DF_BACKEND=\"%s\" (the alias of --backend): expected " BACKEND_NAMES
                        "; unset it or fix its value\n", cmd, e);
        return 2;
    }
    /* the values the engine takes (df_env_switch), checked before the model is opened */
    char err[1024];
    int mode;
    if ((!prefetch && df_env_switch("DF_PREFETCH", "--prefetch", 1, &mode, err, sizeof err)) ||
        (!prefault && df_env_switch("DF_PREFAULT", "--prefault", 0, &mode, err, sizeof err))) {
        fprintf(stderr, "deltafin %s: %s\n", cmd, err);
        return 2;
    }
    return 0;
}

int cli_parse_budget(const char *cmd, const char *flag, const char *v, uint64_t *out) {
    const int gpu = !strcmp(flag, "--gpu-budget");
    if (!cli_parse_size(v, out) && (!gpu || *out)) return 0;
    if (gpu) fprintf(stderr, "deltafin %s: %s \"%s\" is not a size (e.g. 40G, 512M)\n", cmd, flag, v);
    else fprintf(stderr, "deltafin %s: %s \"%s\": expected a size such as 4G or 512M (K, M, G, T: powers of 1024), or 0 for "
                         "no budget\n", cmd, flag, v);
    return 2;
}

int cli_parse_mode(const char *cmd, const char *flag, const char *v, int *out) {
    const int pf = !strcmp(flag, "--prefetch");
    if (!strcmp(v, "auto")) *out = 0;
    else if (!strcmp(v, "on")) *out = 1;
    else if (!strcmp(v, "off")) *out = 2;
    else if (pf && !strcmp(v, "ungated")) *out = 3;
    else {
        fprintf(stderr, "deltafin %s: %s \"%s\": expected auto, on%s off\n", cmd, flag, v, pf ? ", ungated or" : " or");
        return -1;
    }
    return 0;
}

int cli_parse_io(const char *cmd, const char *flag, const char *v, int *depth, uint64_t *size) {
    if (!strcmp(flag, "--io-depth")) {
        char *end;
        errno = 0;
        const long x = strtol(v, &end, 10);
        if (end == v || *end || errno || x < 1 || x > 1024) {
            fprintf(stderr, "deltafin %s: --io-depth \"%s\": expected 1..1024 expert reads in flight per drive\n", cmd, v);
            return -1;
        }
        *depth = (int)x;
        return 0;
    }
    uint64_t b;
    if (cli_parse_size(v, &b) || b < 4096 || b % 4096 || b > (64u << 20)) {
        fprintf(stderr, "deltafin %s: --io-size \"%s\": expected a multiple of 4K from 4K to 64M (e.g. 1M)\n", cmd, v);
        return -1;
    }
    *size = b;
    return 0;
}

int cli_stderr_tty(void) {
    static int tty = -1;
    if (tty < 0) tty = isatty(2) != 0;
    return tty;
}

const char *cli_cr(void) { return cli_stderr_tty() ? "\r" : ""; }

const char *cli_exact_note(struct df_model *m) {
    if (df_model_is_exact(m)) return "";
    return strstr(df_model_describe(m), "spine int8") ? " (NOT EXACT: int8 spine)" : " (NOT EXACT: lossy bf16 spine)";
}

/* the split argument vector (and the option names it points to) live as long as the process, as argv does; held
 * here so that they stay reachable until exit */
static char **split_argv;
/* which entries of split_argv are values split off an --option=value (split_val[i] for split_argv[i]) */
static char *split_val;
/* 1 with *opt = its option when a is a value split off an --option=value */
static int split_is_value(const char *a, const char **opt) {
    for (int i = 1; split_argv && split_val && split_argv[i]; i++)
        if (split_argv[i] == a && split_val[i]) {
            *opt = split_argv[i - 1];
            return 1;
        }
    return 0;
}

int cli_split_option_values(int argc, char **argv, char ***out) {
    char **v = malloc(sizeof(char *) * (size_t)(2 * argc + 1));
    char *isv = calloc((size_t)(2 * argc + 1), 1);
    if (!v || !isv) { free(v); free(isv); *out = argv; return argc; }
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        /* the value of --prompt / --api-key / --system (chat) is free text: "--prompt --x=1" keeps "--x=1" whole */
        const int is_value = i > 0 && (!strcmp(argv[i - 1], "--prompt") || !strcmp(argv[i - 1], "--api-key") ||
                                       !strcmp(argv[i - 1], "--system"));
        size_t k = 2;
        if (eq && !is_value && a[0] == '-' && a[1] == '-')
            while (k < (size_t)(eq - a) && (a[k] == '-' || (a[k] >= 'a' && a[k] <= 'z') || (a[k] >= 'A' && a[k] <= 'Z') ||
                                           (a[k] >= '0' && a[k] <= '9')))
                k++;
        if (eq && !is_value && a[0] == '-' && a[1] == '-' && k > 2 && k == (size_t)(eq - a)) {
            char *name = strndup(a, k);
            if (!name) { v[n++] = argv[i]; continue; }
            v[n++] = name;
            isv[n] = 1;
            v[n++] = (char *)(eq + 1);
        } else v[n++] = argv[i];
    }
    v[n] = NULL;
    free(split_argv);
    free(split_val);
    split_argv = v;
    split_val = isv;
    *out = v;
    return n;
}

int cli_edit_distance(const char *a, const char *b) {
    int la = (int)strnlen(a, 63), lb = (int)strnlen(b, 63), d[64][64];
    for (int i = 0; i <= la; i++) d[i][0] = i;
    for (int j = 0; j <= lb; j++) d[0][j] = j;
    for (int i = 1; i <= la; i++)
        for (int j = 1; j <= lb; j++) {
            int c = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < c) c = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < c) c = d[i][j - 1] + 1;
            d[i][j] = c;
        }
    return d[la][lb];
}

/* the only name of names / names2 that a is a prefix of (a of 4 or more characters), else the closest within 2
 * edits of a, else NULL */
static const char *closest(const char *a, const char *const *names, const char *const *names2) {
    const char *best = NULL, *prefix_of = NULL;
    int best_d = 3, n_prefix = 0;
    const size_t la = strlen(a);
    for (int l = 0; l < 2; l++)
        for (const char *const *p = l ? names2 : names; p && *p; p++) {
            int d = cli_edit_distance(a, *p);
            if (d < best_d) { best_d = d; best = *p; }
            if (la >= 4 && !strncmp(*p, a, la)) { prefix_of = *p; n_prefix++; }
        }
    return n_prefix == 1 ? prefix_of : best;
}

const char *cli_closest(const char *a, const char *const *names) { return closest(a, names, NULL); }

int cli_unknown_command(const char *a, const char *const *names) {
    const char *best = closest(a, names, NULL);
    if (best) fprintf(stderr, "deltafin: unknown command '%s', did you mean '%s'? (see deltafin --help)\n", a, best);
    else fprintf(stderr, "deltafin: unknown command '%s' (see deltafin --help)\n", a);
    return 2;
}

int cli_unknown_option(const char *cmd, const char *a, const char *const *names, const char *const *names2) {
    const char *best = a[0] == '-' ? closest(a, names, names2) : NULL;
    const char *opt = NULL;
    if (a[0] != '-' && split_is_value(a, &opt)) /* --flag=value for a flag that takes none */
        fprintf(stderr, "deltafin %s: %s takes no value (given '%s=%s'; see deltafin %s --help)\n", cmd, opt, opt, a, cmd);
    else if (a[0] != '-')
        fprintf(stderr, "deltafin %s: unexpected argument '%s' (see deltafin %s --help)\n", cmd, a, cmd);
    else if (best)
        fprintf(stderr, "deltafin %s: unknown option '%s', did you mean '%s'? (see deltafin %s --help)\n", cmd, a, best, cmd);
    else fprintf(stderr, "deltafin %s: unknown option '%s' (see deltafin %s --help)\n", cmd, a, cmd);
    return 2;
}

int cli_check_cache_dir(const char *cmd, const char *v) {
    if (v && *v) return 0;
    fprintf(stderr, "deltafin %s: --cache-dir \"\": expected a directory (an empty name is none; leave the option out "
                    "for the default cache)\n", cmd);
    return -1;
}

/* the conversion progress line: one format for run, bench and doctor (run's), each conversion's final line once */
static int conv_open;     /* a progress line without its newline is on stderr */
static int conv_finished; /* the final (100%) line was printed: repeats of it are not */
static time_t conv_last;

int cli_convert_progress(void *user, const char *what, uint64_t done, uint64_t total) {
    (void)user;
    time_t now = time(NULL);
    if (done < total) conv_finished = 0;
    if (!total || conv_finished) return 0;
    if (done == total || (now != conv_last && cli_stderr_tty())) {
        conv_last = now;
        fprintf(stderr, "%sconverting: %s %.1f%% (%llu / %llu)%s", cli_cr(), what ? what : "bytes", 100.0 * done / total,
                (unsigned long long)done, (unsigned long long)total, done == total ? "\n" : "");
        conv_open = done != total;
        if (done == total) conv_finished = 1;
    }
    return 0;
}

int cli_convert_progress_end(void) {
    int was = conv_open;
    if (conv_open) fputc('\n', stderr);
    conv_open = 0;
    return was;
}

int cli_check_utf8(const char *cmd, const char *what, const char *s, size_t n) {
    const size_t at = df_utf8_invalid_at(s, n);
    if (at == n) return 0;
    const int cut = df_utf8_seq((const unsigned char *)s + at, n - at) < 0; /* a character cut short by the end */
    fprintf(stderr, "deltafin %s: %s is not valid UTF-8: invalid byte 0x%02x at byte offset %zu%s\n", cmd, what,
            (unsigned char)s[at], at, cut ? " (an incomplete character at the end)" : "");
    return -1;
}

int cli_parse_seed(const char *cmd, const char *flag, const char *v, uint64_t *out) {
    char *end;
    errno = 0;
    if (v[0] == '-') {
        long long x = strtoll(v, &end, 10);
        if (v[1] >= '0' && v[1] <= '9' && !*end && !errno) { *out = (uint64_t)(int64_t)x; return 0; }
    } else {
        unsigned long long x = strtoull(v, &end, 10);
        if (v[0] >= '0' && v[0] <= '9' && !*end && !errno) { *out = (uint64_t)x; return 0; }
    }
    fprintf(stderr, "deltafin %s: %s \"%s\": expected an integer in [-9223372036854775808, 18446744073709551615]\n", cmd, flag, v);
    return -1;
}

static int ids_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

/* the item at p (up to its comma or the end, without trailing blanks; at most 20 bytes), control characters escaped
 * (\n, \xNN), so that a message quoting it stays one line */
static void quote_near(const char *p, char *out, size_t cap) {
    const char *e = p;
    while (*e && *e != ',' && e < p + 20) e++;
    while (e > p && ids_space(e[-1])) e--;
    size_t m = 0;
    for (const char *q = p; q < e && m + 5 < cap; q++) {
        unsigned char c = (unsigned char)*q;
        if (c == '\n') m += (size_t)snprintf(out + m, cap - m, "\\n");
        else if (c == '\r') m += (size_t)snprintf(out + m, cap - m, "\\r");
        else if (c == '\t') m += (size_t)snprintf(out + m, cap - m, "\\t");
        else if (c < 0x20 || c == 0x7f) m += (size_t)snprintf(out + m, cap - m, "\\x%02x", c);
        else out[m++] = (char)c;
    }
    out[m] = 0;
}

int cli_parse_ids(const char *s, int32_t **out, size_t *n_out, char *err, size_t errlen) {
    static const char expected[] = "expected comma-separated token ids, integers >= 0";
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(sizeof(int32_t) * cap);
    if (!ids) { snprintf(err, errlen, "out of memory"); return -1; }
    const char *p = s;
    while (ids_space(*p)) p++;
    if (!*p) { snprintf(err, errlen, "no ids (%s)", expected); free(ids); return -1; }
    for (;;) {
        while (ids_space(*p)) p++;
        if (*p == ',' || !*p) {
            snprintf(err, errlen, "empty item at position %zu (%s)", n, expected);
            free(ids);
            return -1;
        }
        const char *item = p;
        const char *d = *p == '-' ? p + 1 : p; /* a negative number is an id out of range */
        char *end = (char *)d;
        while (*end >= '0' && *end <= '9') end++;
        const char *after = end;
        while (ids_space(*after)) after++;
        if (end == d || (*after && *after != ',')) {
            char near[100];
            quote_near(item, near, sizeof near);
            snprintf(err, errlen, "not a token id at position %zu, near '%s' (%s)", n, near, expected);
            free(ids);
            return -1;
        }
        errno = 0;
        long long v = strtoll(item, NULL, 10);
        if (errno == ERANGE || v < 0 || v > INT32_MAX) {
            snprintf(err, errlen, "token id %.*s at position %zu is out of range (expected an integer from 0 to %d)",
                     (int)(end - item), item, n, INT32_MAX);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int32_t *t = realloc(ids, sizeof(int32_t) * (cap *= 2));
            if (!t) { free(ids); snprintf(err, errlen, "out of memory"); return -1; }
            ids = t;
        }
        ids[n++] = (int32_t)v;
        p = after;
        if (!*p) break;
        p++; /* the comma */
    }
    *out = ids;
    *n_out = n;
    return 0;
}

/* argv[k] is one of the value options */
static int is_value_option(const char *a, const char *const *values, const char *const *values2) {
    return cli_known_option(a, values) || (values2 && cli_known_option(a, values2));
}

int cli_repeated_at(const char *cmd, int argc, char **argv, int i, const char *const *values, const char *const *values2) {
    if (i + 1 >= argc) return 0; /* no value: the parser says so */
    for (int j = 0; j < i; j++) { /* argv[0]: the command's name, or (bench) its first argument */
        if (!is_value_option(argv[j], values, values2)) continue;
        if (!strcmp(argv[j], argv[i])) {
            fprintf(stderr, "deltafin %s: %s is given more than once (\"%.60s%s\", then \"%.60s%s\"); it takes one value: give "
                            "it once\n", cmd, argv[i], argv[j + 1], strlen(argv[j + 1]) > 60 ? "..." : "", argv[i + 1],
                    strlen(argv[i + 1]) > 60 ? "..." : "");
            return 2;
        }
        j++; /* its value (it may look like an option) */
    }
    return 0;
}

int cli_check_repeated(const char *cmd, int argc, char **argv, const char *const *values, const char *const *values2) {
    for (int i = 0; i < argc; i++) {
        if (!is_value_option(argv[i], values, values2)) continue;
        if (cli_repeated_at(cmd, argc, argv, i, values, values2)) return 2;
        i++; /* its value */
    }
    return 0;
}

/* the names of an option table (values_only: those that take a value) into out, NULL-terminated; out holds
 * CLI_MAX_OPTIONS + 1 */
static void table_names(const cli_option *opts, int values_only, const char **out) {
    int n = 0;
    for (; opts->name && n < CLI_MAX_OPTIONS; opts++)
        if (!values_only || opts->takes_value) out[n++] = opts->name;
    out[n] = NULL;
}

int cli_check_repeated_in(const char *cmd, int argc, char **argv, const cli_option *opts, const char *const *values2) {
    const char *values[CLI_MAX_OPTIONS + 1];
    table_names(opts, 1, values);
    return cli_check_repeated(cmd, argc, argv, values, values2);
}

int cli_unknown_option_in(const char *cmd, const char *a, const cli_option *opts, const char *const *names2) {
    const char *names[CLI_MAX_OPTIONS + 1];
    table_names(opts, 0, names);
    return cli_unknown_option(cmd, a, names, names2);
}
