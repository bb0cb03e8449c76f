/* opts.h - the option parser shared by emliod, `emlio fetch` and `emlio plan`:
 * one table describes each option once, for argv, config files and --help.
 * Every program and `emlio` command parses with it (test_layout.sh), and
 * test_docs.sh checks the man pages and README against --help.
 * SPDX-License-Identifier: MIT
 *
 *   uint32_t workers = 2;
 *   const char *bind = NULL;
 *   const opt_t table[] = {
 *       OPT("bind", 'b', OPT_STR, &bind, "EP", "endpoint to bind"),
 *       OPT("readers", 0, OPT_U32, &workers, "N", "reader threads", .min = 1),
 *       OPT_END,
 *   };
 *   const opt_t *tables[] = { table, NULL };
 *   int rc = opt_parse("emliod", tables, argc, argv);
 *
 * Programs print their own messages through these helpers; nothing here
 * exits: callers turn the returns into exit statuses (2 for usage errors).
 */
#ifndef EMLIO_TOOLS_OPTS_H
#define EMLIO_TOOLS_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum opt_kind {
    OPT_FLAG,   /* bool *dest = true */
    OPT_UNSET,  /* bool *dest = false (a --no-X option) */
    OPT_STR,    /* const char **dest = the value (borrowed) */
    OPT_U64,    /* uint64_t *dest, decimal, in [min, max] */
    OPT_U32,    /* uint32_t *dest, decimal, in [min, max] */
    OPT_INT,    /* int *dest, decimal, in [min, max] */
    OPT_DOUBLE, /* double *dest, in [min, max] read as doubles */
    OPT_CHOICE, /* int *dest = the value of the named choice */
    OPT_SIZE,   /* uint64_t *dest, decimal with an optional K, M, G or T
                   suffix (KiB..., 1024-based), in [min, max] */
    OPT_LIST,   /* opt_list_t *dest: each use appends the value (borrowed) */
    OPT_HELP    /* prints nothing itself: opt_parse returns OPT_HELP_SHOWN */
};

/* The values of a repeatable option (OPT_LIST), in the order given. */
#define OPT_LIST_MAX 256

typedef struct opt_list {
    const char *v[OPT_LIST_MAX];
    size_t n;
} opt_list_t;

/* One named value of an OPT_CHOICE option. */
typedef struct opt_choice {
    const char *name;
    int value;
} opt_choice_t;

/* One option. A table ends with an entry whose name is NULL. */
typedef struct opt {
    const char *name; /* long name without "--" */
    char short_name;  /* 0 for none */
    int kind;         /* enum opt_kind */
    void *dest;       /* where the value goes (see enum opt_kind) */
    const char *meta; /* value name in --help; NULL for flags */
    const char *help; /* one line; '\n' continues on an indented line */
    uint64_t min;     /* integer kinds: smallest value accepted */
    uint64_t max;     /* integer kinds: largest (0: the type's largest) */
    const opt_choice_t *choices; /* OPT_CHOICE: ends with name NULL */
    bool *seen;                  /* set to true when given, if not NULL */
    double dmin;                 /* OPT_DOUBLE: smallest value */
    double dmax;                 /* OPT_DOUBLE: largest value */
} opt_t;

/* Table entries: name, short name, kind, destination, value name, help,
 * then any of .min, .max, .choices, .seen, .dmin, .dmax. */
#define OPT(name_, short_, kind_, dest_, meta_, ...)              \
    {                                                             \
        .name = (name_), .short_name = (short_), .kind = (kind_), \
        .dest = (dest_), .meta = (meta_), .help = __VA_ARGS__     \
    }
#define OPT_END      \
    {                \
        .name = NULL \
    }

#define OPT_HELP_SHOWN 1

/* Parses argv[1..argc) against the NULL-terminated list of tables: long
 * options as "--name VALUE" or "--name=VALUE", short ones as "-x VALUE".
 * Positional arguments are refused. Returns 0, OPT_HELP_SHOWN when an
 * OPT_HELP option was given (the caller prints its usage to stdout and exits
 * 0), or -1 after printing "PROG: <what is wrong>" to stderr. */
int opt_parse(const char *prog, const opt_t *const *tables, int argc,
              char **argv);

/* opt_parse_args flags. */
#define OPT_STOP_AT_ARG                                  \
    1 /* the first positional argument ends the options: \
         a command to run, whose own options follow */

/* Like opt_parse, but positional arguments are kept: moved, in order, to
 * argv[1..1 + *npos). "--" ends the options (all that follows is
 * positional). Same returns as opt_parse. */
int opt_parse_args(const char *prog, const opt_t *const *tables, int argc,
                   char **argv, int flags, int *npos);

/* Applies the options of a config file: one option per line, written as on
 * the command line without the dashes ("bind tcp://0.0.0.0:5555",
 * "drop-behind", "max-clients = 4096"); blank lines and lines starting with
 * '#' are skipped. String values point into *text_out, which the caller
 * frees (with free) after the last use of the options; it is set even on
 * failure. Returns 0, or -1 after printing the file, line and what is wrong
 * to stderr. */
int opt_load_config(const char *prog, const opt_t *const *tables,
                    const char *path, char **text_out);

/* Applies one option by name with its value (NULL for flags). Returns 0 or
 * -1 after printing why, prefixed by where ("PROG" or "FILE:LINE"). */
int opt_apply(const char *where, const opt_t *const *tables, const char *name,
              const char *value);

/* Writes the option lines of --help for every table: "  --name META" (or
 * "  -x, --name META" when it has a short name) in a 23-column field, then
 * the help text. */
void opt_usage(FILE *out, const opt_t *const *tables);

/* Parses arg as a non-negative decimal integer no larger than max. Returns 0,
 * or -1 after printing "PROG: invalid value 'ARG' for OPT". */
int opt_parse_u64(const char *prog, const char *opt, const char *arg,
                  uint64_t max, uint64_t *out);

#endif /* EMLIO_TOOLS_OPTS_H */
