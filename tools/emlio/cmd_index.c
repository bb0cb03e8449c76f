/* cmd_index.c - `emlio index` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_index(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio index: not built yet\n");
    return 1;
}
