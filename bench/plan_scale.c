/* plan_scale.c - measures what a plan costs at 10^8-10^9 samples: build
 * time, time to the first batch, memory per rank, the cost of a world-8
 * summary (what `emlio plan --summary` does) and batches per second.
 * Figures are quoted in docs/planner.md ("Cost").
 * SPDX-License-Identifier: MIT
 *
 * Build and run (from the repository root; about a minute):
 *   cc -std=c11 -O2 -Iinclude -Ibuild/include -Isrc/base -o build/plan_scale \
 *       bench/plan_scale.c src/client/plan.c src/base/alloc.c src/base/error.c
 *   build/plan_scale            # the table
 *   build/plan_scale N S W      # one row: N samples, S shards, world W
 *
 * Each row runs in its own child process, so that its peak resident size
 * (VmHWM, reset through /proc/self/clear_refs after the inventory is made)
 * is the plan's alone. Times are CPU seconds of the process (the wall
 * clock of a shared machine says more about its neighbours), best of 3.
 */
#include "emlio_internal.h"

#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_clock.h"

#define BATCH 256

/* A field of /proc/self/status in kB (VmRSS, VmHWM), or -1. */
static long
s_status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    size_t len = strlen(field);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, field, len) == 0 && line[len] == ':')
            kb = strtol(line + len + 1, NULL, 10);
    if (f)
        fclose(f);
    return kb;
}

/* Resets VmHWM to the current resident size (Linux >= 4.0). */
static void
s_reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

static void
s_fail(emlio_plan_t *plan)
{
    fprintf(stderr, "plan_scale: %s\n",
            plan ? emlio_plan_errmsg(plan) : "out of memory");
    exit(1);
}

/* S shards named like a sharded dataset, N samples split as evenly as
 * integers allow, spread over 4 daemons. */
static emlio_plan_shard_t *
s_inventory(uint64_t n, size_t shards, char **names_out)
{
    static const uint32_t holders[4] = { 0, 1, 2, 3 };
    emlio_plan_shard_t *inv = calloc(shards, sizeof(*inv));
    char *names = calloc(shards, 32);
    if (!inv || !names)
        s_fail(NULL);
    for (size_t i = 0; i < shards; i++) {
        char *name = names + i * 32;
        snprintf(name, 32, "train-%07zu", i);
        uint64_t r = n / shards + (i < n % shards);
        inv[i] = (emlio_plan_shard_t){ .name = name,
                                       .records = r,
                                       .bytes = r * 128,
                                       .holders = &holders[i % 4],
                                       .n_holders = 1 };
    }
    *names_out = names;
    return inv;
}

static void
s_params(emlio_plan_params_t *p, uint32_t world, uint32_t rank, uint64_t epoch)
{
    emlio_plan_params_init(p);
    p->world = world;
    p->rank = rank;
    p->batch_size = BATCH;
    p->seed = 42;
    p->epoch = epoch;
}

/* One row: prints build, first batch, summary and batch rate figures for
 * rank 0 of `world`. */
static void
s_row(uint64_t n, size_t shards, uint32_t world)
{
    char *names;
    emlio_plan_shard_t *inv = s_inventory(n, shards, &names);
    long rss0 = s_status_kb("VmRSS");
    s_reset_peak();
    emlio_plan_t *plan = emlio_plan_new();
    if (!plan)
        s_fail(NULL);
    double build = 1e9;
    double first = 1e9;
    emlio_plan_params_t p;
    for (uint64_t e = 0; e < 3; e++) {
        s_params(&p, world, 0, e);
        double t0 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
        if (emlio_plan_build(plan, inv, shards, &p) < 0)
            s_fail(plan);
        double t1 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
        size_t len;
        volatile const emlio_plan_sample_t *s = emlio_plan_batch(plan, 0, &len);
        (void)s;
        double t2 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
        build = EMLIO_MIN(build, t1 - t0);
        first = EMLIO_MIN(first, t2 - t0);
    }
    long peak = s_status_kb("VmHWM") - rss0;
    /* `emlio plan --world W --summary`: every rank built once. */
    double t0 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (uint32_t r = 0; r < world; r++) {
        s_params(&p, world, r, 0);
        if (emlio_plan_build(plan, inv, shards, &p) < 0)
            s_fail(plan);
    }
    double summary = bench_seconds(CLOCK_PROCESS_CPUTIME_ID) - t0;
    /* Batches per second over the first 4000 batches of the last rank. */
    size_t nb = EMLIO_MIN(emlio_plan_batch_count(plan), (size_t)4000);
    uint64_t sum = 0;
    t0 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
    for (size_t b = 0; b < nb; b++) {
        size_t len;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
        sum += s[len - 1].record;
    }
    double rate = (double)nb * BATCH /
                  EMLIO_MAX(bench_seconds(CLOCK_PROCESS_CPUTIME_ID) - t0, 1e-9);
    size_t held = 0;
#ifdef EMLIO_PLAN_VERSION
    held = emlio_plan_memory(plan);
#endif
    printf("| %" PRIu64 " | %zu | %" PRIu32 " | %.2f | %.2f | %.2f | %.1f "
           "| %.1f | %.1f |%s\n",
           n, shards, world, build * 1e3, first * 1e3, (double)held / 1048576.0,
           (double)peak / 1024.0, summary * 1e3, rate / 1e6, sum ? "" : " ");
    emlio_plan_destroy(&plan);
    free(inv);
    free(names);
}

static int
s_child(uint64_t n, size_t shards, uint32_t world)
{
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        s_row(n, shards, world);
        fflush(stdout);
        _exit(0);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        printf("| %" PRIu64 " | %zu | %" PRIu32 " | failed |\n", n, shards,
               world);
        return 1;
    }
    return 0;
}

int
main(int argc, char **argv)
{
    printf("batch %d, seed 42; CPU time, best of 3; rank 0 except the "
           "summary\n\n",
           BATCH);
    printf("| samples | shards | world | build ms | first batch ms "
           "| plan MB held | peak MB | summary ms (all ranks) "
           "| M samples/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    if (argc == 4)
        return s_child(strtoull(argv[1], NULL, 10),
                       (size_t)strtoull(argv[2], NULL, 10),
                       (uint32_t)strtoul(argv[3], NULL, 10));

    static const struct {
        uint64_t n;
        size_t shards;
        uint32_t world;
    } rows[] = {
        { 10000000, 500, 8 },       { 100000000, 5000, 1 },
        { 100000000, 5000, 8 },     { 1000000000, 50000, 8 },
        { 1000000000, 1000000, 8 },
    };

    int failed = 0;
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(rows); i++)
        failed |= s_child(rows[i].n, rows[i].shards, rows[i].world);
    return failed;
}
