/*
 * fuzz.h — the fuzz targets' shared declarations (tests/fuzz/README.md). Each fuzz_*.c defines
 * LLVMFuzzerTestOneInput (libFuzzer's entry point: one input of n bytes; returns 0) and may abort (a failed
 * property) through FUZZ_ASSERT. Built with -DDF_FUZZ=ON and clang they are libFuzzer programs; in every build they
 * are also linked with replay.c into test programs that run their committed corpus (a CTest test each).
 */
#ifndef DF_TESTS_FUZZ_H
#define DF_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);

/* A property every input must keep: on failure, the message on stderr and abort() (libFuzzer then saves the input;
 * replay.c reports the file). */
#define FUZZ_ASSERT(cond, ...)                                                                                         \
    do {                                                                                                               \
        if (!(cond)) {                                                                                                 \
            fprintf(stderr, "fuzz property failed (%s:%d): ", __FILE__, __LINE__);                                     \
            fprintf(stderr, __VA_ARGS__);                                                                              \
            fputc('\n', stderr);                                                                                       \
            abort();                                                                                                   \
        }                                                                                                              \
    } while (0)

/* The source tree (DF_SRC, else the working directory): where the targets find models/kimi-mini. */
static inline const char *fuzz_src(void) {
    const char *s = getenv("DF_SRC");
    return s && *s ? s : ".";
}

#endif
