/* cmd_plan.c - `emlio plan`: asks the daemons for their inventories and
 * prints the epoch plan of one or every rank as JSON, for inspection.
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "emlio.h"

static void
s_usage(FILE *out)
{
    fprintf(out,
            "usage: emlio plan --connect EP[,EP...] --world W --batch B "
            "[options]\n"
            "\n"
            "  --epoch E            epoch to plan (default 0)\n"
            "  --seed S             shuffle seed (default 0)\n"
            "  --rank R             print only rank R (default: every rank)\n"
            "  --shuffle MODE       window (default) or none\n"
            "  --window-shards N    shards per shuffle window (4)\n"
            "  --drop-last          drop the remainder instead of padding\n"
            "  --summary            per-rank totals only, no samples\n"
            "\n"
            "Prints one JSON object: {\"epoch\", \"world\", \"batch_size\", "
            "\"seed\",\n"
            "\"dataset_samples\", \"dropped\", \"ranks\": [{\"rank\", "
            "\"samples\", \"pad\",\n"
            "\"batches\": [[[shard, record, daemon, pad], ...], ...]}]}.\n");
}

int
cmd_plan(int argc, char **argv)
{
    enum {
        O_EPOCH = 256,
        O_SEED,
        O_RANK,
        O_SHUFFLE,
        O_WINDOW,
        O_DROP_LAST,
        O_SUMMARY,
        O_WORLD
    };
    static const struct option opts[] = {
        { "connect", required_argument, NULL, 'c' },
        { "batch", required_argument, NULL, 'b' },
        { "world", required_argument, NULL, O_WORLD },
        { "epoch", required_argument, NULL, O_EPOCH },
        { "seed", required_argument, NULL, O_SEED },
        { "rank", required_argument, NULL, O_RANK },
        { "shuffle", required_argument, NULL, O_SHUFFLE },
        { "window-shards", required_argument, NULL, O_WINDOW },
        { "drop-last", no_argument, NULL, O_DROP_LAST },
        { "summary", no_argument, NULL, O_SUMMARY },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 },
    };
    emlio_plan_params_t params;
    emlio_plan_params_init(&params);
    const char *connect = NULL;
    uint64_t v, world = 0, batch = 0;
    int64_t only_rank = -1;
    bool summary = false;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:b:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            connect = optarg;
            break;
        case 'b':
            if (cli_parse_u64("plan", "--batch", optarg, &batch) < 0)
                return 2;
            break;
        case O_WORLD:
            if (cli_parse_u64("plan", "--world", optarg, &world) < 0)
                return 2;
            break;
        case O_EPOCH:
            if (cli_parse_u64("plan", "--epoch", optarg, &params.epoch) < 0)
                return 2;
            break;
        case O_SEED:
            if (cli_parse_u64("plan", "--seed", optarg, &params.seed) < 0)
                return 2;
            break;
        case O_RANK:
            if (cli_parse_u64("plan", "--rank", optarg, &v) < 0)
                return 2;
            only_rank = (int64_t)v;
            break;
        case O_SHUFFLE:
            if (!strcmp(optarg, "none") || !strcmp(optarg, "window")) {
                params.shuffle = !strcmp(optarg, "none") ? EMLIO_SHUFFLE_NONE
                                                         : EMLIO_SHUFFLE_WINDOW;
            } else {
                fprintf(stderr, "emlio plan: invalid --shuffle '%s'\n", optarg);
                return 2;
            }
            break;
        case O_WINDOW:
            if (cli_parse_u64("plan", "--window-shards", optarg, &v) < 0)
                return 2;
            params.window_shards = (uint32_t)v;
            break;
        case O_DROP_LAST:
            params.drop_last = true;
            break;
        case O_SUMMARY:
            summary = true;
            break;
        case 'h':
            s_usage(stdout);
            return 0;
        default:
            s_usage(stderr);
            return 2;
        }
    }
    if (!connect || world == 0 || world > UINT32_MAX || batch == 0 ||
        batch > UINT32_MAX ||
        (only_rank >= 0 && (uint64_t)only_rank >= world)) {
        fprintf(stderr, "emlio plan: --connect, a positive --world and --batch "
                        "are required, and --rank must be below --world\n");
        return 2;
    }
    params.world = (uint32_t)world;
    params.batch_size = (uint32_t)batch;

    int status = 1;
    emlio_ctx_t *ctx = emlio_ctx_new();
    emlio_client_config_t cfg;
    emlio_client_config_init(&cfg);
    cfg.streams = 1;
    emlio_client_t *client = ctx ? emlio_client_new(ctx, &cfg) : NULL;
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_shard_t *shards = NULL;
    if (!client || !plan) {
        fprintf(stderr, "emlio plan: out of memory\n");
        goto out;
    }
    if (emlio_client_connect(client, connect) < 0) {
        fprintf(stderr, "emlio plan: %s\n", emlio_client_errmsg(client));
        goto out;
    }
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
