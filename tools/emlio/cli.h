/* cli.h - small helpers shared by the `emlio` subcommands that talk to
 * daemons (fetch, plan): option values and JSON output.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_CLI_H
#define EMLIO_TOOLS_CLI_H

#include <stdint.h>
#include <stdio.h>

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
