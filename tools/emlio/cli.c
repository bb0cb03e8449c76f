/* cli.c - option parsing and JSON helpers for fetch and plan.
 * SPDX-License-Identifier: MIT
 */
#include <errno.h>
#include <stdlib.h>

#include "cli.h"

int
cli_parse_u64(const char *cmd, const char *opt, const char *arg, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || *end || end == arg || arg[0] == '-') {
        fprintf(stderr, "emlio %s: invalid value '%s' for %s\n", cmd, arg, opt);
        return -1;
    }
    *out = v;
    return 0;
}

void
cli_json_string(FILE *out, const char *s)
{
    fputc('"', out);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(out, "\\%c", c);
        else if (c < 0x20)
            fprintf(out, "\\u%04x", c);
        else
            fputc(c, out);
    }
    fputc('"', out);
}
