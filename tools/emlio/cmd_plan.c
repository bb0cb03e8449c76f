/* cmd_plan.c - `emlio plan` (placeholder until its module lands this session).
 * SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_plan(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio plan: not built yet\n");
    return 1;
}
