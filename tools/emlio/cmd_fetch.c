/* cmd_fetch.c - `emlio fetch` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_fetch(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio fetch: not built yet\n");
    return 1;
}
