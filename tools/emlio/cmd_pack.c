/* cmd_pack.c - `emlio pack` (placeholder until its module lands this session).
 * SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_pack(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio pack: not built yet\n");
    return 1;
}
