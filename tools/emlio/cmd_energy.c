/* cmd_energy.c - `emlio energy` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_energy(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio energy: not built yet\n");
    return 1;
}
