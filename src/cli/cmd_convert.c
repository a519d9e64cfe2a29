/* cmd_convert.c — `deltafin convert` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_convert(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin convert: not implemented yet\n");
    return 1;
}
