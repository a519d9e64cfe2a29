/*
 * fuzz_model_files.c — the parsers of a checkpoint's files: config.json (config_parse, src/model/native.h) and a
 * .safetensors header (st_open_file, src/model/safetensors.c). Byte 0 picks which; the rest is the file. Each must
 * accept it or refuse it with a message, never crash or read outside the file.
 */
#define _GNU_SOURCE /* memfd_create */
#include "fuzz.h"
#include "model/native.h"
#include "model/safetensors.h"

#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    if (n < 1) return 0;
    char err[512] = "";
    if (data[0] & 1) {
        char *s = malloc(n);
        if (!s) return 0;
        memcpy(s, data + 1, n - 1);
        s[n - 1] = 0;
        df_config cfg;
        memset(&cfg, 0, sizeof cfg);
        const int rc = config_parse(s, &cfg, "config.json", err, sizeof err);
        FUZZ_ASSERT(rc == 0 || err[0], "config_parse returned %d with no message", rc);
        free(s);
        return 0;
    }
    const int fd = memfd_create("fuzz.safetensors", 0);
    if (fd < 0) return 0;
    if (n > 1 && write(fd, data + 1, n - 1) != (ssize_t)(n - 1)) { close(fd); return 0; }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    st_set *st = NULL;
    const int rc = st_open_file(&st, path, err, sizeof err);
    FUZZ_ASSERT(rc == 0 || err[0], "st_open_file returned %d with no message", rc);
    if (rc == 0) {
        for (int i = 0; i < st->n; i++) {
            const st_tensor *t = &st->t[i];
            const st_file *f = &st->files[t->file];
            FUZZ_ASSERT(st_find(st, t->name) == t, "tensor %d not found by its name", i);
            FUZZ_ASSERT(t->nbytes == 0 || (t->data >= (const uint8_t *)f->map && t->nbytes <= f->size &&
                                           (size_t)(t->data - (const uint8_t *)f->map) <= f->size - t->nbytes),
                        "tensor %s's data lies outside the file", t->name);
        }
        st_close(st);
    }
    close(fd);
    return 0;
}
