/* cli.h - what the `emlio` subcommands share: parsing with opts.c's
 * tables, the options that pick the data and the plan (fetch, plan), and
 * JSON output.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_CLI_H
#define EMLIO_TOOLS_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "emlio.h"
#include "opts.h"

/* The options fetch and plan both take. */
typedef struct cli_plan_opts {
    const char *connect;    /* --connect: endpoints, comma-separated */
    uint64_t batch;         /* --batch */
    uint64_t seed;          /* --seed */
    int shuffle;            /* --shuffle: enum emlio_shuffle */
    uint32_t window_shards; /* --window-shards */
    bool drop_last;         /* --drop-last */
    uint64_t rank;          /* --rank */
    uint64_t world;         /* --world */
    bool have_rank;
    bool have_world;
} cli_plan_opts_t;

#define CLI_PLAN_NOPTS 8

/* Sets the defaults (window shuffle, planner's window, rank 0 of 1). */
void cli_plan_opts_init(cli_plan_opts_t *self);

/* Fills table (CLI_PLAN_NOPTS entries and the terminator) with the shared
 * options, writing into self. */
void cli_plan_opts_table(cli_plan_opts_t *self,
                         opt_t table[CLI_PLAN_NOPTS + 1]);

/* Parses argv for `emlio CMD` against tables. Returns -1 to go on, 0 after
 * printing usage to stdout for --help, or 2 (the exit status of a usage
 * error) after printing what is wrong and the usage to stderr. */
/* Checks the endpoints of --connect (tcp://HOST:PORT, ...) before any
 * connection; prints why and returns -1 when one is malformed. */
/* A client made with cfg and connected to endpoints, or NULL after
 * printing why ("emlio CMD: ..."). ctx may be NULL (out of memory). */
emlio_client_t *cli_client_connect(const char *cmd, emlio_ctx_t *ctx,
                                   const emlio_client_config_t *cfg,
                                   const char *endpoints);

int cli_check_connect(const char *cmd, const char *endpoints);

int cli_parse(const char *cmd, const opt_t *const *tables, int argc,
              char **argv, void (*usage)(FILE *, const opt_t *const *));

/* cli_parse for the commands that take arguments (see opt_parse_args):
 * on -1 the *npos arguments are argv[1..1 + *npos). */
int cli_parse_args(const char *cmd, const opt_t *const *tables, int argc,
                   char **argv, int flags, int *npos,
                   void (*usage)(FILE *, const opt_t *const *));

/* Fills in rank and world the user did not give from torchrun's RANK and
 * WORLD_SIZE, else SLURM's SLURM_PROCID and SLURM_NTASKS, and checks that
 * rank < world. Returns 0 or -1 after printing why as "emlio CMD: ...". */
int cli_rank_from_env(const char *cmd, cli_plan_opts_t *self);

/* Parses arg as a non-negative decimal integer for option opt. On failure
 * prints "emlio CMD: invalid value 'ARG' for OPT" and returns -1. */
int cli_parse_u64(const char *cmd, const char *opt, const char *arg,
                  uint64_t *out);

/* Writes s to out as a JSON string literal (quotes, backslashes and
 * control characters escaped). */
void cli_json_string(FILE *out, const char *s);

/* Sends the library's log to stderr ("emlio: client: ..."), at the level
 * named by $EMLIO_LOG_LEVEL (error, warn, info or debug; default warn). */
struct emlio_ctx;
void cli_install_log(struct emlio_ctx *ctx);

#endif /* EMLIO_TOOLS_CLI_H */
