/* commands.h - the subcommands of the `emlio` command-line tool.
 * Each takes the arguments after its name (argv[0] is the subcommand name)
 * and returns the process exit status. Errors go to stderr as
 * "emlio <cmd>: <what failed>: <why>".
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_COMMANDS_H
#define EMLIO_TOOLS_COMMANDS_H

int cmd_synth(int argc, char **argv);   /* cmd_synth.c */
int cmd_pack(int argc, char **argv);    /* cmd_pack.c */
int cmd_index(int argc, char **argv);   /* cmd_index.c */
int cmd_inspect(int argc, char **argv); /* cmd_inspect.c */
int cmd_fetch(int argc, char **argv);   /* cmd_fetch.c */
int cmd_plan(int argc, char **argv);    /* cmd_plan.c */
int cmd_keygen(int argc, char **argv);  /* cmd_keygen.c */
int cmd_energy(int argc, char **argv);  /* cmd_energy.c */

#endif /* EMLIO_TOOLS_COMMANDS_H */
