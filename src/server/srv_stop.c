/* srv_stop.c — stop sequences over a streamed text. Pieces arrive token by
 * token; a stop sequence may span several pieces, so any tail of the pending
 * text that is still a prefix of some stop sequence is held back until the next
 * piece decides it. Held text always starts at a UTF-8 character boundary
 * (stop sequences are valid UTF-8), so emitted text never splits a character. */
#define _GNU_SOURCE /* memmem, POLLRDHUP */
#include "srv.h"
#include <stdlib.h>
#include <string.h>

size_t srv_partial_suffix(const char *s, size_t n, char *const *pats, int npats) {
    size_t best = 0;
    for (int i = 0; i < npats; i++) {
        size_t pl = strlen(pats[i]);
        if (!pl) continue;
        size_t k = pl - 1 < n ? pl - 1 : n; /* proper prefix only */
        for (; k > best; k--)
            if (!memcmp(s + n - k, pats[i], k)) { best = k; break; }
    }
    return best;
}

void srv_stop_init(srv_stop *m, const char *const *stops, int n) {
    memset(m, 0, sizeof *m);
    srv_buf_init(&m->held);
    if (n > 0) {
        m->stops = calloc((size_t)n, sizeof *m->stops);
        for (int i = 0; i < n; i++)
            if (stops[i] && stops[i][0]) m->stops[m->n_stops++] = strdup(stops[i]);
    }
}

void srv_stop_free(srv_stop *m) {
    for (int i = 0; i < m->n_stops; i++) free(m->stops[i]);
    free(m->stops);
    srv_buf_free(&m->held);
    memset(m, 0, sizeof *m);
}

int srv_stop_push(srv_stop *m, const char *s, size_t n, srv_buf *out) {
    if (m->stopped) return 1;
    srv_buf_add(&m->held, s, n);
    if (!m->n_stops) {
        srv_buf_add(out, m->held.p, m->held.len);
        srv_buf_consume(&m->held, m->held.len);
        return 0;
    }
    /* earliest occurrence of any stop sequence */
    size_t cut = (size_t)-1;
    for (int i = 0; i < m->n_stops; i++) {
        char *f = memmem(m->held.p, m->held.len, m->stops[i], strlen(m->stops[i]));
        if (f && (size_t)(f - m->held.p) < cut) cut = (size_t)(f - m->held.p);
    }
    if (cut != (size_t)-1) {
        srv_buf_add(out, m->held.p, cut);
        srv_buf_consume(&m->held, m->held.len);
        m->stopped = 1;
        return 1;
    }
    size_t keep = srv_partial_suffix(m->held.p, m->held.len, m->stops, m->n_stops);
    size_t emit = m->held.len - keep;
    srv_buf_add(out, m->held.p, emit);
    srv_buf_consume(&m->held, emit);
    return 0;
}

void srv_stop_flush(srv_stop *m, srv_buf *out) {
    if (!m->stopped) srv_buf_add(out, m->held.p, m->held.len);
    srv_buf_consume(&m->held, m->held.len);
}
