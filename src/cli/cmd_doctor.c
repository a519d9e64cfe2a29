/* cmd_doctor.c — `deltafin doctor` (placeholder until its issue lands). */
#include "cli.h"
#include <stdio.h>

int cmd_doctor(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deltafin doctor: not implemented yet\n");
    return 1;
}
