/* shquote.c — quoting a word for a POSIX shell, for the commands that messages suggest
 * (see util.h: df_shell_quote). */
#include "util.h"

#include <stdio.h>
#include <string.h>

/* characters that never need quoting in a shell word (nor start a special meaning anywhere in one) */
static int sh_plain(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || strchr("_@%+=:,./-", c);
}

const char *df_shell_quote(const char *s, char *out, size_t cap) {
    if (!out || !cap) return "";
    if (!s) s = "";
    int plain = *s != 0;
    for (const char *p = s; *p && plain; p++) plain = sh_plain((unsigned char)*p);
    size_t o = 0;
#define PUT(c) do { if (o + 1 >= cap) goto cut; out[o++] = (c); } while (0)
    if (plain) {
        for (const char *p = s; *p; p++) PUT(*p);
    } else {
        /* '...' with every embedded ' written as '\'' (close, escaped quote, reopen) */
        PUT('\'');
        for (const char *p = s; *p; p++) {
            if (*p == '\'') {
                if (o + 4 >= cap) goto cut;
                memcpy(out + o, "'\\''", 4);
                o += 4;
            } else PUT(*p);
        }
        PUT('\'');
    }
#undef PUT
    out[o] = 0;
    return out;
cut:
    /* never hand out a truncated word a shell would read differently: say it did not fit */
    snprintf(out, cap, "%s", cap > strlen("'(path too long)'") ? "'(path too long)'" : cap > 2 ? "''" : "");
    return out;
}

/* msg's first "re-run `deltafin convert`" or "convert again" becomes LEAD`FIX` (in place, within cap) */
static void advice_replace(char *msg, size_t cap, const char *lead, const char *fix) {
    static const char *const advice[] = {"re-run `deltafin convert`", "convert again"};
    char tmp[8192];
    for (size_t i = 0; i < sizeof advice / sizeof advice[0]; i++) {
        char *p = strstr(msg, advice[i]);
        if (!p) continue;
        snprintf(tmp, sizeof tmp, "%s", p + strlen(advice[i]));
        *p = 0;
        const size_t l = strlen(msg);
        snprintf(msg + l, cap - l, "%s`%s`%s", lead, fix, tmp);
        return;
    }
}

void df_advice_setup_repair(char *msg, size_t cap, const char *fix) {
    advice_replace(msg, cap, "repair the install with ", fix);
}

void df_advice_convert_repair(char *msg, size_t cap, const char *fix) { advice_replace(msg, cap, "convert again: ", fix); }

void df_advice_strip(char *msg) {
    /* "(truncated; convert again)" -> "(truncated)", "...: the pack is corrupt; convert again" -> "...: the pack is
     * corrupt", "(convert again)" -> "", "...; re-run `deltafin convert`" -> "..." */
    static const char *const advice[] = {"; convert again", "; re-run `deltafin convert`", " (convert again)",
                                         ", convert again", " convert again"};
    for (size_t i = 0; i < sizeof advice / sizeof advice[0]; i++) {
        const size_t n = strlen(advice[i]);
        for (char *p; (p = strstr(msg, advice[i])) != NULL;) memmove(p, p + n, strlen(p + n) + 1);
    }
}
