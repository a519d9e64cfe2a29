/* cmd_bench.c — `deltafin bench` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_bench(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin bench: not implemented yet\n");
    return 1;
}
