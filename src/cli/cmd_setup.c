/* cmd_setup.c — `deltafin setup REPO`: see usage(). */
#include "cli.h"
#include <stdio.h>
int cmd_setup(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin setup: not available yet\n");
    return 1;
}
