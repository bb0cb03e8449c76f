/* plan_blend.c - what a blend of sources costs the planner per sample,
 * against one dataset of the same size, in one invocation: ns per planned
 * sample over every batch of one rank's epoch (emlio_plan_batch), for one
 * dataset, three sources by weight, and the same stratified; and for a
 * weight change after half the epoch, what the build costs (it marks the
 * consumed half) and the rest's ns per sample. Quoted in docs/planner.md
 * ("Sources", "Weights changed mid-epoch").
 * SPDX-License-Identifier: MIT
 *
 * Build and run (from the repository root, after make; seconds):
 *   cc -std=c11 -O2 -Iinclude -Ibuild/include -o build/plan_blend
 * bench/plan_blend.c \ -Lbuild/lib -lemlio -Wl,-rpath,$PWD/build/lib
 *   build/plan_blend [SAMPLES]       # default 10^7, 1,000 shards, world 8
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "emlio/plan.h"

#include "bench_clock.h"

#define SHARDS 1000

/* ns per sample of rank 0's whole epoch, best of 3; *check gets a sum of
 * the records so the work cannot be optimised away. */
static double
s_run(const emlio_plan_shard_t *shards, const emlio_plan_params_t *p,
      unsigned long long *check)
{
    emlio_plan_t *plan = emlio_plan_new();
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        if (emlio_plan_build(plan, shards, SHARDS, p) < 0) {
            fprintf(stderr, "plan: %s\n", emlio_plan_errmsg(plan));
            exit(1);
        }
        double t0 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
        unsigned long long sum = 0, n_all = 0;
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t n;
            const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &n);
            for (size_t i = 0; i < n; i++)
                sum += s[i].record + s[i].source;
            n_all += n;
        }
        double ns = (bench_seconds(CLOCK_PROCESS_CPUTIME_ID) - t0) * 1e9 /
                    (double)n_all;
        best = ns < best ? ns : best;
        *check += sum;
    }
    emlio_plan_destroy(&plan);
    return best;
}

int
main(int argc, char **argv)
{
    unsigned long long samples =
        argc > 1 ? strtoull(argv[1], NULL, 10) : 10000000ull;
    static emlio_plan_shard_t shards[SHARDS];
    static char names[SHARDS][16];
    static const uint32_t holder = 0;
    for (size_t i = 0; i < SHARDS; i++) {
        snprintf(names[i], sizeof(names[i]), "s%04zu", i);
        shards[i] = (emlio_plan_shard_t){
            names[i], samples / SHARDS, samples / SHARDS * 100000, &holder, 1, 0
        };
    }
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.world = 8;
    p.batch_size = 256;
    unsigned long long check = 0;
    double one = s_run(shards, &p, &check);
    /* Three sources: 500, 300 and 200 shards, weights 1 : 2 : 5. */
    for (size_t i = 0; i < SHARDS; i++)
        shards[i].source = i < 500 ? 0 : i < 800 ? 1 : 2;
    emlio_plan_source_t src[3] = { { 1, 0 }, { 2, 0 }, { 5, 0 } };
    p.sources = src;
    p.n_sources = 3;
    double blend = s_run(shards, &p, &check);
    p.stratify = true;
    double strat = s_run(shards, &p, &check);
    /* Weights 1:2:5 -> 5:2:1 after the first half of the epoch. */
    p.stratify = false;
    emlio_plan_span_t half = { 0, samples / SHARDS * SHARDS / 2 };
    emlio_plan_layer_t layer = { src, 0, &half, 1 };
    emlio_plan_source_t now[3] = { { 5, 0 }, { 2, 0 }, { 1, 0 } };
    p.sources = now;
    p.layers = &layer;
    p.n_layers = 1;
    emlio_plan_t *plan = emlio_plan_new();
    double t0 = bench_seconds(CLOCK_PROCESS_CPUTIME_ID);
    if (emlio_plan_build(plan, shards, SHARDS, &p) < 0) {
        fprintf(stderr, "plan: %s\n", emlio_plan_errmsg(plan));
        return 1;
    }
    double build = bench_seconds(CLOCK_PROCESS_CPUTIME_ID) - t0;
    size_t memory = emlio_plan_memory(plan);
    emlio_plan_destroy(&plan);
    double layered = s_run(shards, &p, &check);
    printf("samples %llu, shards %d, world 8, batch 256 (check %llu)\n",
           samples, SHARDS, check % 1000);
    printf("one dataset      %.1f ns/sample\n", one);
    printf("3 sources        %.1f ns/sample (%.2fx)\n", blend, blend / one);
    printf("3, stratified    %.1f ns/sample (%.2fx)\n", strat, strat / one);
    printf("changed at half  build %.3f s (%.1f ns per consumed sample), "
           "%.1f ns/sample of the rest (%.2fx), plan %zu bytes\n",
           build, build * 1e9 / (double)half.end, layered, layered / one,
           memory);
    return 0;
}
