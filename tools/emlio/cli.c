/* cli.c - options and JSON helpers shared by `emlio fetch` and `emlio plan`.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "emlio.h"
#include "tool_util.h"

static const opt_choice_t s_shuffles[] = {
    { "window", EMLIO_SHUFFLE_WINDOW },
    { "none", EMLIO_SHUFFLE_NONE },
    { NULL, 0 },
};

void
cli_plan_opts_init(cli_plan_opts_t *self)
{
    /* window_shards 0 is the planner's default: all shards in one window,
     * a uniform shuffle. */
    *self = (cli_plan_opts_t){ .shuffle = EMLIO_SHUFFLE_WINDOW, .world = 1 };
}

void
cli_plan_opts_table(cli_plan_opts_t *self, opt_t table[CLI_PLAN_NOPTS + 1])
{
    const opt_t opts[CLI_PLAN_NOPTS + 1] = {
        OPT("connect", 'c', OPT_STR, &self->connect, "EPS",
            "daemon endpoints, comma-separated"),
        OPT("batch", 'b', OPT_U64, &self->batch, "B", "samples per batch",
            .min = 1, .max = UINT32_MAX),
        OPT("seed", 0, OPT_U64, &self->seed, "S",
            "shuffle seed shared by all ranks (0)"),
        OPT("shuffle", 0, OPT_CHOICE, &self->shuffle, "MODE",
            "window (default) or none", .choices = s_shuffles),
        OPT("window-shards", 0, OPT_U32, &self->window_shards, "N",
            "shards per shuffle window (0: all, a uniform shuffle)"),
        OPT("drop-last", 0, OPT_FLAG, &self->drop_last, NULL,
            "drop the remainder instead of padding"),
        OPT("rank", 0, OPT_U64, &self->rank, "R", "this rank", .min = 0,
            .max = UINT32_MAX, .seen = &self->have_rank),
        OPT("world", 0, OPT_U64, &self->world, "W",
            "the job size (ranks); fetch: else RANK/WORLD_SIZE,\n"
            "SLURM_PROCID/SLURM_NTASKS, 0 of 1",
            .min = 1, .max = UINT32_MAX, .seen = &self->have_world),
        OPT_END,
    };
    for (size_t i = 0; i <= CLI_PLAN_NOPTS; i++)
        table[i] = opts[i];
}

int
cli_parse(const char *cmd, const opt_t *const *tables, int argc, char **argv,
          void (*usage)(FILE *, const opt_t *const *))
{
    return cli_parse_args(cmd, tables, argc, argv, 0, NULL, usage);
}

int
cli_parse_args(const char *cmd, const opt_t *const *tables, int argc,
               char **argv, int flags, int *npos,
               void (*usage)(FILE *, const opt_t *const *))
{
    char prog[64];
    snprintf(prog, sizeof(prog), "emlio %s", cmd);
    int rc = opt_parse_args(prog, tables, argc, argv, flags, npos);
    if (rc == OPT_HELP_SHOWN) {
        usage(stdout, tables);
        return 0;
    }
    if (rc < 0) {
        usage(stderr, tables);
        return 2;
    }
    return -1;
}

int
cli_rank_from_env(const char *cmd, cli_plan_opts_t *self)
{
    static const char *const pairs[][2] = {
        { "RANK", "WORLD_SIZE" }, { "SLURM_PROCID", "SLURM_NTASKS" }
    };
    for (size_t i = 0; i < 2 && !(self->have_rank && self->have_world); i++) {
        const char *r = getenv(pairs[i][0]);
        const char *w = getenv(pairs[i][1]);
        if (!r || !w)
            continue;
        if ((!self->have_rank &&
             cli_parse_u64(cmd, pairs[i][0], r, &self->rank) < 0) ||
            (!self->have_world &&
             cli_parse_u64(cmd, pairs[i][1], w, &self->world) < 0))
            return -1;
        self->have_rank = self->have_world = true;
    }
    if (self->world == 0 || self->world > UINT32_MAX ||
        self->rank >= self->world) {
        fprintf(stderr,
                "emlio %s: rank %" PRIu64 " is not below world %" PRIu64 "\n",
                cmd, self->rank, self->world);
        return -1;
    }
    return 0;
}

int
cli_parse_u64(const char *cmd, const char *opt, const char *arg, uint64_t *out)
{
    char prog[64];
    snprintf(prog, sizeof(prog), "emlio %s", cmd);
    return opt_parse_u64(prog, opt, arg, UINT64_MAX, out);
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

int
cli_check_connect(const char *cmd, const char *endpoints)
{
    char err[TOOL_ERRMSG_LEN];
    if (tool_check_endpoints(endpoints, false, err) == 0)
        return 0;
    fprintf(stderr, "emlio %s: --connect: %s\n", cmd, err);
    return -1;
}

emlio_client_t *
cli_client_connect(const char *cmd, emlio_ctx_t *ctx,
                   const emlio_client_config_t *cfg, const char *endpoints)
{
    emlio_client_t *client = ctx ? emlio_client_new(ctx, cfg) : NULL;
    if (!client) {
        fprintf(stderr, "emlio %s: out of memory\n", cmd);
        return NULL;
    }
    if (emlio_client_connect(client, endpoints) < 0) {
        fprintf(stderr, "emlio %s: %s\n", cmd, emlio_client_errmsg(client));
        emlio_client_destroy(&client);
    }
    return client;
}
