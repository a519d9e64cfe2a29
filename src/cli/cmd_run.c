/* cmd_run.c — `deltafin run` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_run(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin run: not implemented yet\n");
    return 1;
}
