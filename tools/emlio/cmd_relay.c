/* cmd_relay.c - `emlio relay` (placeholder until its module lands this
 * session). SPDX-License-Identifier: MIT
 */
#include <stdio.h>

#include "commands.h"

int
cmd_relay(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "emlio relay: not built yet\n");
    return 1;
}
