/*
 * fuzz_request.c — the server's request parser (src/server/srv_request.c) on any bytes, as a chat and as a
 * completion request: it must return 0 (a request, freed here) or an HTTP status with an OpenAI error body
 * ({"error": {...}} that cJSON parses), never crash, leak or read past the body. The same bytes as the messages of
 * `tokenize --chat` (srv_check_chat, src/server/server.h), without and with a tools list: 0 with a messages list,
 * or -1 with a message.
 */
#include "fuzz.h"
#include "server/server.h"
#include "server/srv.h"

#include <cjson/cJSON.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    for (int kind = SRV_CHAT; kind <= SRV_COMPLETION; kind++) {
        srv_request r;
        char *ej = NULL;
        const int st = srv_request_parse(&r, kind, (const char *)data, n, &ej);
        FUZZ_ASSERT(st == 0 || (st >= 400 && st < 600 && ej), "status %d, error %s", st, ej ? ej : "(none)");
        if (st) {
            cJSON *e = cJSON_Parse(ej);
            const cJSON *er = cJSON_GetObjectItemCaseSensitive(e, "error");
            FUZZ_ASSERT(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(er, "message")) &&
                            cJSON_IsString(cJSON_GetObjectItemCaseSensitive(er, "type")),
                        "status %d with a body not in the OpenAI error shape: %s", st, ej);
            cJSON_Delete(e);
        }
        free(ej);
        if (st == 0) srv_request_free(&r);
    }
    for (int t = 0; t < 2; t++) {
        char *msgs = NULL, *tools = NULL, err[512] = "";
        const int rc = srv_check_chat((const char *)data, n, t ? "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]" : NULL,
                                      &msgs, &tools, err, sizeof err);
        FUZZ_ASSERT((rc == 0 && msgs) || (rc == -1 && !msgs && !tools && err[0]), "srv_check_chat %d: %s", rc, err);
        free(msgs);
        free(tools);
    }
    return 0;
}
