/* test_shell_quote.c — df_shell_quote (src/util/shquote.c): the words of the commands messages suggest.
 * Each quoted word, pasted into `sh -c`, must come back as exactly the original string (one argument). */
#include "test_util.h"
#include "util/util.h"

#include <string.h>

/* run `printf %s WORD | od`-free: sh prints its argument count and the argument, we compare */
static int sh_roundtrip(const char *s) {
    char q[4096], cmd[9000], got[4096] = "";
    df_shell_quote(s, q, sizeof q);
    snprintf(cmd, sizeof cmd, "set -- %s; printf '%%d:%%s' \"$#\" \"$1\"", q);
    FILE *p = popen(cmd, "r"); /* popen runs /bin/sh -c cmd */
    if (!p) return 0;
    size_t n = fread(got, 1, sizeof got - 1, p);
    got[n] = 0;
    pclose(p);
    char want[4200];
    snprintf(want, sizeof want, "1:%s", s);
    if (strcmp(got, want)) fprintf(stderr, "  word [%s] quoted [%s]: the shell gave [%s]\n", s, q, got);
    return !strcmp(got, want);
}

int main(void) {
    char q[256];
    CHECK(!strcmp(df_shell_quote("/tmp/x/inst", q, sizeof q), "/tmp/x/inst"), "plain path left bare: %s", q);
    CHECK(!strcmp(df_shell_quote("moonshotai/Kimi-K2-Instruct", q, sizeof q), "moonshotai/Kimi-K2-Instruct"), "repo: %s", q);
    CHECK(!strcmp(df_shell_quote("/tmp/x/inst dir", q, sizeof q), "'/tmp/x/inst dir'"), "space: %s", q);
    CHECK(!strcmp(df_shell_quote("/tmp/it's", q, sizeof q), "'/tmp/it'\\''s'"), "single quote: %s", q);
    CHECK(!strcmp(df_shell_quote("", q, sizeof q), "''"), "empty word: %s", q);
    CHECK(!strcmp(df_shell_quote(NULL, q, sizeof q), "''"), "NULL: %s", q);
    CHECK(!strcmp(df_shell_quote("~/m", q, sizeof q), "'~/m'"), "tilde quoted (no expansion): %s", q);
    CHECK(!strcmp(df_shell_quote("$HOME", q, sizeof q), "'$HOME'"), "dollar: %s", q);
    /* a word that does not fit is never handed out cut short */
    char small[12];
    df_shell_quote("/a/very/long/path with space", small, sizeof small);
    CHECK(!strcmp(small, "''"), "too long for 12 bytes: %s", small);
    char mid[24];
    df_shell_quote("/a/very/long/path with space", mid, sizeof mid);
    CHECK(!strcmp(mid, "'(path too long)'"), "too long for 24 bytes: %s", mid);
    df_shell_quote("'", q, 6); /* needs 7 bytes: ''\''' */
    CHECK(!strcmp(q, "''"), "quote that does not fit: %s", q);
    df_shell_quote("'", q, 7);
    CHECK(!strcmp(q, "''\\'''"), "a lone quote in exactly 7 bytes: %s", q);
    CHECK(df_shell_quote("x", NULL, 0)[0] == 0, "no buffer");
    /* the shell reads every quoted word back as the original, as one argument */
    static const char *const words[] = {"/tmp/x/inst dir", "/tmp/it's here", "'", "''", "a'b'c", "two  spaces", "tab\there",
                                        "new\nline", "$(rm -rf /)", "`id`", "a\\b", "semi;colon", "glob*?[x]", "-dash", "~user",
                                        "\"dq\"", "!bang", "#hash", "back\\'slash", "&&", "a|b", "é ü", "/plain/path"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) CHECK(sh_roundtrip(words[i]), "shell round trip of [%s]", words[i]);
    return t_done();
}
