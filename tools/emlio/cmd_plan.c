/* cmd_plan.c - `emlio plan`: asks the daemons for their inventories and
 * prints the epoch plan of one or every rank as JSON, for inspection.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "emlio.h"

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out, "usage: emlio plan --connect EP[,EP...] --world W --batch B "
                 "[options]\n\n");
    opt_usage(out, tables);
    fprintf(out,
            "\n--rank R prints only rank R (default: every rank).\n"
            "Prints one JSON object: {\"epoch\", \"world\", \"batch_size\", "
            "\"seed\",\n"
            "\"dataset_samples\", \"dropped\", \"ranks\": [{\"rank\", "
            "\"samples\", \"pad\",\n"
            "\"batches\": [[[shard, record, daemon, pad], ...], ...]}]}.\n");
}

/* Parses argv into the plan parameters. Returns -1 to go on, else the exit
 * status. */
static int
s_parse_args(int argc, char **argv, cli_plan_opts_t *po,
             emlio_plan_params_t *params, bool *summary)
{
    opt_t shared[CLI_PLAN_NOPTS + 1];
    cli_plan_opts_init(po);
    po->world = 0;
    cli_plan_opts_table(po, shared);
    const opt_t own[] = {
        OPT("epoch", 0, OPT_U64, &params->epoch, "E",
            "epoch to plan (default 0)"),
        OPT("summary", 0, OPT_FLAG, summary, NULL,
            "per-rank totals only, no samples"),
        OPT("help", 'h', OPT_HELP, NULL, NULL, "this text"),
        OPT_END,
    };
    const opt_t *const tables[] = { shared, own, NULL };
    int status = cli_parse("plan", tables, argc, argv, s_usage);
    if (status >= 0)
        return status;
    if (!po->connect || po->world == 0 || po->batch == 0 ||
        (po->have_rank && po->rank >= po->world)) {
        fprintf(stderr, "emlio plan: --connect, a positive --world and --batch "
                        "are required, and --rank must be below --world\n");
        return 2;
    }
    if (cli_check_connect("plan", po->connect) < 0)
        return 2;
    params->world = (uint32_t)po->world;
    params->batch_size = (uint32_t)po->batch;
    params->seed = po->seed;
    params->shuffle = po->shuffle;
    params->window_shards = po->window_shards;
    params->drop_last = po->drop_last;
    return -1;
}

int
cmd_plan(int argc, char **argv)
{
    emlio_plan_params_t params;
    emlio_plan_params_init(&params);
    cli_plan_opts_t po;
    bool summary = false;
    int status = s_parse_args(argc, argv, &po, &params, &summary);
    if (status >= 0)
        return status;
    const char *connect = po.connect;
    int64_t only_rank = po.have_rank ? (int64_t)po.rank : -1;

    status = 1;
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.streams = 1;
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_shard_t *shards = NULL;
    emlio_client_t *client =
        plan ? cli_client_connect("plan", ctx, &cfg, connect) : NULL;
    if (!plan)
        fprintf(stderr, "emlio plan: out of memory\n");
    if (!client)
        goto out;
    size_t n = emlio_client_shard_count(client);
    shards = calloc(n ? n : 1, sizeof(*shards));
    if (!shards)
        goto out;
    for (size_t i = 0; i < n; i++) {
        size_t holders;
        shards[i].name = emlio_client_shard_name(client, i);
        shards[i].records = emlio_client_shard_records(client, i);
        shards[i].holders = emlio_client_shard_holders(client, i, &holders);
        shards[i].n_holders = (uint32_t)holders;
    }
    bool first_rank = true;
    for (uint32_t r = 0; r < params.world; r++) {
        if (only_rank >= 0 && r != (uint64_t)only_rank)
            continue;
        params.rank = r;
        if (emlio_plan_build(plan, shards, n, &params) < 0) {
            fprintf(stderr, "emlio plan: %s\n", emlio_plan_errmsg(plan));
            goto out;
        }
        if (first_rank)
            printf("{\"epoch\": %" PRIu64 ", \"world\": %" PRIu32
                   ", \"batch_size\": %" PRIu32 ", \"seed\": %" PRIu64
                   ", \"dataset_samples\": %" PRIu64 ", \"dropped\": %" PRIu64
                   ", \"ranks\": [",
                   params.epoch, params.world, params.batch_size, params.seed,
                   emlio_plan_dataset_size(plan),
                   emlio_plan_dropped_count(plan));
        printf("%s\n {\"rank\": %" PRIu32 ", \"samples\": %" PRIu64
               ", \"pad\": %" PRIu64 ", \"batch_count\": %zu",
               first_rank ? "" : ",", r, emlio_plan_sample_count(plan),
               emlio_plan_pad_count(plan), emlio_plan_batch_count(plan));
        first_rank = false;
        if (!summary) {
            printf(", \"batches\": [");
            for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
                size_t k;
                const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &k);
                printf("%s\n  [", b ? "," : "");
                for (size_t i = 0; i < k; i++) {
                    printf("%s[", i ? ", " : "");
                    cli_json_string(stdout, shards[s[i].shard].name);
                    printf(", %" PRIu64 ", ", s[i].record);
                    cli_json_string(stdout, emlio_client_daemon_endpoint(
                                                client, s[i].daemon));
                    printf(", %s]", s[i].pad ? "true" : "false");
                }
                printf("]");
            }
            printf("]");
        }
        printf("}");
    }
    printf("]}\n");
    status = 0;
out:
    free(shards);
    emlio_plan_destroy(&plan);
    emlio_client_destroy(&client);
    emlio_ctx_destroy(&ctx);
    return status;
}
