/* cmd_tokenize.c — `deltafin tokenize` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_tokenize(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin tokenize: not implemented yet\n");
    return 1;
}
