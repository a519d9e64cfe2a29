/*
 * fuzz_kimi.c — the Kimi reasoning / tool-call parser of the server's output stream (src/server/srv_kimi.c).
 * Byte 0 picks the parser's switches (think, tools, starts in think) and a piece length of 1..32 bytes; the rest
 * is model output. Property: pushing the output in pieces gives exactly what pushing it whole gives (reasoning,
 * content and every tool call's id, name and arguments), as a stream must.
 */
#include "fuzz.h"
#include "server/srv.h"

#include <string.h>

typedef struct {
    srv_kimi k;
    srv_buf r, c;
} parsed;

static void parse(parsed *p, int think, int tools, int in_think, const uint8_t *s, size_t n, size_t piece) {
    srv_buf_init(&p->r);
    srv_buf_init(&p->c);
    srv_kimi_init(&p->k, think, tools, in_think);
    for (size_t i = 0; i < n; i += piece)
        srv_kimi_push(&p->k, (const char *)s + i, n - i < piece ? n - i : piece, &p->r, &p->c);
    srv_kimi_flush(&p->k, &p->r, &p->c);
}

static void done(parsed *p) {
    srv_kimi_free(&p->k);
    srv_buf_free(&p->r);
    srv_buf_free(&p->c);
}

static int same_buf(const srv_buf *a, const srv_buf *b) {
    return a->len == b->len && (!a->len || !memcmp(a->p, b->p, a->len));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    const int think = data[0] & 1, tools = (data[0] >> 1) & 1, in_think = (data[0] >> 2) & 1;
    const size_t piece = 1 + (data[0] >> 3);
    parsed a, b;
    parse(&a, think, tools, in_think, data + 1, n - 1, piece);
    parse(&b, think, tools, in_think, data + 1, n - 1, n);
    FUZZ_ASSERT(same_buf(&a.r, &b.r), "reasoning differs with pieces of %zu bytes", piece);
    FUZZ_ASSERT(same_buf(&a.c, &b.c), "content differs with pieces of %zu bytes", piece);
    FUZZ_ASSERT(a.k.n_calls == b.k.n_calls, "%d tool calls in pieces of %zu bytes, %d whole", a.k.n_calls, piece, b.k.n_calls);
    for (int i = 0; i < a.k.n_calls; i++)
        FUZZ_ASSERT(!strcmp(a.k.calls[i].id, b.k.calls[i].id) && !strcmp(a.k.calls[i].name, b.k.calls[i].name) &&
                        !strcmp(a.k.calls[i].arguments, b.k.calls[i].arguments),
                    "tool call %d differs with pieces of %zu bytes", i, piece);
    done(&a);
    done(&b);
    return 0;
}
