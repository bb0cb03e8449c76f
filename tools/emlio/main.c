/* main.c - `emlio`, the command-line front end: dispatches to subcommands.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <malloc.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "emlio.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} s_commands[] = {
    { "synth", cmd_synth, "write a synthetic ImageFolder tree of JPEGs" },
    { "pack", cmd_pack,
      "pack a dataset into TFRecord or WebDataset tar shards" },
    { "index", cmd_index, "write DALI-format index files for shards" },
    { "inspect", cmd_inspect,
      "show a shard, a data directory or a running daemon" },
    { "fetch", cmd_fetch, "run epochs against emliod daemons" },
    { "plan", cmd_plan, "print a rank's epoch plan as JSON" },
    { "keygen", cmd_keygen, "write a CURVE key pair for emliod and clients" },
    { "energy", cmd_energy, "run a command and report time, CPU and energy" },
};

static void
s_usage(FILE *out)
{
    fprintf(
        out,
        "usage: emlio <command> [options]\n       emlio --version\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(s_commands) / sizeof(s_commands[0]); i++)
        fprintf(out, "  %-8s %s\n", s_commands[i].name, s_commands[i].help);
    fprintf(out, "\nRun 'emlio <command> --help' for its options.\n");
}

int
main(int argc, char **argv)
{
    /* ZeroMQ allocates every received frame with malloc; keep freed memory
     * in the heap instead of unmapping it, since faulting fresh pages in
     * costs ~16 us a page on our VMs (4-8x fewer faults in emlio fetch). */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
    if (argc < 2) {
        s_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        s_usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("emlio %s (libemlio %s)\n", EMLIO_VERSION_STRING,
               emlio_version_string());
        return 0;
    }
    for (size_t i = 0; i < sizeof(s_commands) / sizeof(s_commands[0]); i++)
        if (!strcmp(argv[1], s_commands[i].name))
            return s_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "emlio: unknown command '%s'\n", argv[1]);
    s_usage(stderr);
    return 2;
}
