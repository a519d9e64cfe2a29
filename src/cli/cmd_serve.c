/* cmd_serve.c — `deltafin serve` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_serve(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin serve: not implemented yet\n");
    return 1;
}
