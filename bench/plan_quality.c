/* plan_quality.c - measures how well the planner's windowed shuffle mixes a
 * dataset against a full random shuffle, and how long ImageNet-sized plans
 * take to build and to produce their batches. Numbers are quoted in
 * docs/planner.md. SPDX-License-Identifier: MIT
 *
 * Build and run (from the repository root):
 *   cc -std=c11 -O2 -Iinclude -Ibuild/include -Isrc/base -o build/plan_quality
 * \ bench/plan_quality.c src/client/plan.c src/base/alloc.c src/base/error.c
 *   build/plan_quality
 */
#include "emlio_internal.h"

#include <math.h>
#include <time.h>

#include "bench_clock.h"

#define SHARDS  100
#define RECORDS 1000
#define N       (SHARDS * RECORDS)
#define BATCH   256

/* Counts inversions of a[0..n) by merge sort, using tmp as scratch. */
static uint64_t
s_inversions(uint32_t *a, uint32_t *tmp, size_t n)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    uint64_t inv = s_inversions(a, tmp, h) + s_inversions(a + h, tmp, n - h);
    size_t i = 0;
    size_t j = h;
    size_t k = 0;
    while (i < h && j < n) {
        if (a[i] <= a[j]) {
            tmp[k++] = a[i++];
        } else {
            inv += h - i;
            tmp[k++] = a[j++];
        }
    }
    while (i < h)
        tmp[k++] = a[i++];
    while (j < n)
        tmp[k++] = a[j++];
    memcpy(a, tmp, n * sizeof(*a));
    return inv;
}

/* The whole epoch (world 1) as file positions: order[pos] = shard * R + r,
 * where shard is the index in name order (names sort like indices). */
static void
s_order(const emlio_plan_shard_t *shards, uint32_t window, uint64_t seed,
        uint64_t epoch, int shuffle, uint32_t *order)
{
    emlio_plan_t *plan = emlio_plan_new();
    emlio_plan_params_t p;
    emlio_plan_params_init(&p);
    p.batch_size = BATCH;
    p.seed = seed;
    p.epoch = epoch;
    p.shuffle = shuffle;
    p.window_shards = window;
    if (!plan || emlio_plan_build(plan, shards, SHARDS, &p) < 0) {
        fprintf(stderr, "plan_quality: cannot build plan\n");
        exit(1);
    }
    size_t pos = 0;
    for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
        size_t len;
        const emlio_plan_sample_t *s = emlio_plan_batch(plan, b, &len);
        for (size_t k = 0; k < len; k++)
            order[pos++] = (uint32_t)(s[k].shard * RECORDS + s[k].record);
    }
    emlio_plan_destroy(&plan);
}

/* Averages each measure over SEEDS seeds; the spread of Kendall tau comes
 * mostly from the shard permutation, which has only SHARDS elements. */
#define SEEDS 100

static void
s_measure(const emlio_plan_shard_t *shards, const char *label, uint32_t window,
          int shuffle)
{
    static uint32_t e0[N];
    static uint32_t e1[N];
    static uint32_t pos1[N];
    static uint32_t seq[N];
    static uint32_t tmp[N];
    double disp = 0;
    double same_shard = 0;
    double tau_file = 0;
    double tau_file_sq = 0;
    double tau_epoch = 0;
    double distinct_sum = 0;
    size_t distinct_max = 0;
    size_t batches = 0;
    double pairs = (double)N * (N - 1) / 2;
    for (uint64_t seed = 1; seed <= SEEDS; seed++) {
        s_order(shards, window, seed, 0, shuffle, e0);
        s_order(shards, window, seed, 1, shuffle, e1);
        for (size_t i = 0; i < N; i++) {
            disp += fabs((double)i - (double)e0[i]) / N / N;
            if (i && e0[i] / RECORDS == e0[i - 1] / RECORDS)
                same_shard += 1.0 / (N - 1);
        }
        memcpy(seq, e0, sizeof(seq));
        double t = (double)s_inversions(seq, tmp, N) / pairs;
        tau_file += t;
        tau_file_sq += t * t;
        for (size_t i = 0; i < N; i++)
            pos1[e1[i]] = (uint32_t)i;
        for (size_t i = 0; i < N; i++)
            seq[i] = pos1[e0[i]];
        tau_epoch += (double)s_inversions(seq, tmp, N) / pairs;
        for (size_t b = 0; b < N; b += BATCH) {
            bool touched[SHARDS] = { false };
            size_t distinct = 0;
            for (size_t i = b; i < N && i < b + BATCH; i++)
                if (!touched[e0[i] / RECORDS]) {
                    touched[e0[i] / RECORDS] = true;
                    distinct++;
                }
            distinct_sum += (double)distinct;
            distinct_max = EMLIO_MAX(distinct_max, distinct);
            batches++;
        }
    }
    double mean_tau = tau_file / SEEDS;
    double sd_tau = sqrt(fmax(0, tau_file_sq / SEEDS - mean_tau * mean_tau));
    printf("| %-14s | %.4f | %.4f +- %.4f | %.4f | %.4f | %6.1f | %3zu |\n",
           label, disp / SEEDS, mean_tau, sd_tau, tau_epoch / SEEDS,
           same_shard / SEEDS, distinct_sum / (double)batches, distinct_max);
}

/* Best of `runs`: the build alone into *build, and the build plus every
 * batch of rank 0 (what a plan computes over an epoch) as the result. */
static double
s_time_build(const emlio_plan_shard_t *shards, size_t n, uint32_t world,
             int runs, double *build)
{
    double best = 1e9;
    *build = 1e9;
    emlio_plan_t *plan = emlio_plan_new();
    for (int i = 0; i < runs; i++) {
        emlio_plan_params_t p;
        emlio_plan_params_init(&p);
        p.world = world;
        p.batch_size = 256;
        p.epoch = (uint64_t)i;
        double t0 = bench_seconds(CLOCK_MONOTONIC);
        if (emlio_plan_build(plan, shards, n, &p) < 0) {
            fprintf(stderr, "plan_quality: %s\n", emlio_plan_errmsg(plan));
            exit(1);
        }
        *build = EMLIO_MIN(*build, bench_seconds(CLOCK_MONOTONIC) - t0);
        for (size_t b = 0; b < emlio_plan_batch_count(plan); b++) {
            size_t len;
            emlio_plan_batch(plan, b, &len);
        }
        best = EMLIO_MIN(best, bench_seconds(CLOCK_MONOTONIC) - t0);
    }
    emlio_plan_destroy(&plan);
    return best;
}

int
main(void)
{
    static char names[1024][32];
    static emlio_plan_shard_t shards[1024];
    static const uint32_t holder = 0;
    for (size_t i = 0; i < SHARDS; i++) {
        snprintf(names[i], sizeof(names[i]), "shard-%05zu", i);
        shards[i] = (emlio_plan_shard_t){ .name = names[i],
                                          .records = RECORDS,
                                          .bytes = RECORDS * 110000,
                                          .holders = &holder,
                                          .n_holders = 1 };
    }
    printf("%d shards x %d records, batch %d, world 1, mean of %d seeds\n\n",
           SHARDS, RECORDS, BATCH, SEEDS);
    printf("| policy         | displ | tau vs file | tau e0 vs e1 "
           "| same-shard next | shards/batch | max |\n");
    printf("|---|---|---|---|---|---|---|\n");
    s_measure(shards, "none", 4, EMLIO_SHUFFLE_NONE);
    static const uint32_t windows[] = { 1, 2, 4, 8, 16 };
    for (size_t w = 0; w < EMLIO_ARRAY_SIZE(windows); w++) {
        char label[32];
        snprintf(label, sizeof(label), "window %" PRIu32, windows[w]);
        s_measure(shards, label, windows[w], EMLIO_SHUFFLE_WINDOW);
    }
    s_measure(shards, "full (W=100)", SHARDS, EMLIO_SHUFFLE_WINDOW);

    /* ImageNet-1k train: 1,281,167 samples over 1024 shards. */
    const uint64_t total = 1281167;
    for (size_t i = 0; i < 1024; i++) {
        snprintf(names[i], sizeof(names[i]), "train-%05zu-of-01024", i);
        uint64_t r = total / 1024 + (i < total % 1024);
        shards[i] = (emlio_plan_shard_t){ .name = names[i],
                                          .records = r,
                                          .bytes = r * 110000,
                                          .holders = &holder,
                                          .n_holders = 1 };
    }
    printf("\n1,281,167 samples / 1024 shards, best of 5, build and build "
           "+ every batch of rank 0:\n");
    for (uint32_t world = 1; world <= 8; world *= 8) {
        double build;
        double all = s_time_build(shards, 1024, world, 5, &build);
        printf("  world %" PRIu32 ": %.2f ms, %.1f ms\n", world, build * 1e3,
               all * 1e3);
    }
    return 0;
}
