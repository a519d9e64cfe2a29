/* cmd_synth.c — `deltafin synth` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_synth(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin synth: not implemented yet\n");
    return 1;
}
