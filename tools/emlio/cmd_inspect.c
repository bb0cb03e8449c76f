/* cmd_inspect.c - `emlio inspect` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_inspect(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio inspect: not built yet\n");
    return 1;
}
