/* cli.c - option parsing and JSON helpers for fetch and plan.
 * SPDX-License-Identifier: MIT
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "emlio.h"

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

static void
s_log_stderr(void *userdata, int level, const char *module, const char *msg)
{
    static const char *const names[] = { "error", "warning", "info", "debug" };
    (void)userdata;
    fprintf(stderr, "emlio: %s: %s%s%s\n", module,
            level > 0 && level < 4 ? names[level] : "",
            level > 0 && level < 4 ? ": " : "", msg);
}

void
cli_install_log(struct emlio_ctx *ctx)
{
    static const char *const names[] = { "error", "warn", "info", "debug" };
    int level = EMLIO_LOG_WARN;
    const char *env = getenv("EMLIO_LOG_LEVEL");
    for (int i = 0; env && i < 4; i++)
        if (!strcmp(env, names[i]))
            level = i;
    emlio_ctx_set_log(ctx, s_log_stderr, NULL, level);
}
