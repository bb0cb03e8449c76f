/* cmd_synth.c - `emlio synth` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_synth(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio synth: not built yet\n");
    return 1;
}
