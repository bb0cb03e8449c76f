/* crc_speed.c - CRC-32C speed of this build (emlio_crc32c), per sample
 * size, from cache and from memory (issue 18; docs/performance.md).
 *
 * usage: crc_speed [MIB]
 * For each sample size, checksums samples laid end to end in about 1 MiB
 * (stays in L2) and in MIB MiB (default 1024: from DRAM), and prints
 * GB/s. The checksum of each pass is printed
 * too, so that two builds can be compared for equal results.
 * Then, for 2 MiB frames (a packed part), the rate over bytes this thread
 * just wrote and over bytes a thread pinned to another CPU just wrote:
 * what a client's check costs when ZeroMQ's I/O thread received the frame
 * on the same core, or on another (docs/performance.md, "I/O threads").
 * SPDX-License-Identifier: MIT
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32c.h"

#include "bench_clock.h"

/* GB/s over passes of buffer total, sample by sample: at least five and
 * at least 2 GB in all (a short run times the 512-bit units' wake-up and
 * the first misses, not the loop), after one untimed pass. */
static double
s_rate(const uint8_t *buf, size_t total, size_t sample, uint32_t *sum)
{
    size_t n = total / sample;
    size_t passes = (2000000000u / (n * sample)) + 1;
    if (passes < 5)
        passes = 5;
    for (size_t i = 0; i < n; i++)
        *sum ^= emlio_crc32c(0, buf + i * sample, sample);
    double t0 = bench_seconds(CLOCK_MONOTONIC);
    for (size_t pass = 0; pass < passes; pass++)
        for (size_t i = 0; i < n; i++)
            *sum ^= emlio_crc32c(0, buf + i * sample, sample);
    return (double)passes * (double)(n * sample) /
           (bench_seconds(CLOCK_MONOTONIC) - t0) / 1e9;
}

/* ---- frames written by this thread or another --------------------------- */

#define FRAME   (2u << 20)
#define FRAMES  8   /* rotated, so that no frame stays cached by accident */
#define HANDOFF 400 /* frames per measurement */

static uint8_t *s_frames[FRAMES];
static atomic_uint s_turn; /* 2k: writer's turn for frame k; 2k+1: ours */

static void
s_pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static void *
s_writer(void *arg)
{
    s_pin(*(int *)arg);
    for (unsigned k = 0; k < HANDOFF; k++) {
        while (atomic_load(&s_turn) != 2 * k)
            ;
        memset(s_frames[k % FRAMES], (int)k, FRAME);
        atomic_store(&s_turn, 2 * k + 1);
    }
    return NULL;
}

/* GB/s of the CRC over frames just written by this thread (other = false)
 * or by a thread on CPU 1 while this one runs on CPU 0. */
static double
s_handoff_rate(bool other, const int cpus[2], uint32_t *sum)
{
    double spent = 0;
    s_pin(cpus[0]);
    if (!other) {
        for (unsigned k = 0; k < HANDOFF; k++) {
            memset(s_frames[k % FRAMES], (int)k, FRAME);
            double t0 = bench_seconds(CLOCK_MONOTONIC);
            *sum ^= emlio_crc32c(0, s_frames[k % FRAMES], FRAME);
            spent += bench_seconds(CLOCK_MONOTONIC) - t0;
        }
        return HANDOFF * (double)FRAME / spent / 1e9;
    }
    int cpu = cpus[1];
    pthread_t t;
    atomic_store(&s_turn, 0);
    if (pthread_create(&t, NULL, s_writer, &cpu) != 0)
        return 0;
    for (unsigned k = 0; k < HANDOFF; k++) {
        while (atomic_load(&s_turn) != 2 * k + 1)
            ;
        double t0 = bench_seconds(CLOCK_MONOTONIC);
        *sum ^= emlio_crc32c(0, s_frames[k % FRAMES], FRAME);
        spent += bench_seconds(CLOCK_MONOTONIC) - t0;
        atomic_store(&s_turn, 2 * k + 2);
    }
    pthread_join(t, NULL);
    return HANDOFF * (double)FRAME / spent / 1e9;
}

static void
s_handoff_report(void)
{
    /* The first two CPUs this process may run on (a container may allow
     * others than 0 and 1). */
    cpu_set_t allowed;
    int cpus[2] = { -1, -1 }, n = 0;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
        if (CPU_ISSET(c, &allowed))
            cpus[n++] = c;
    bool ok = n > 0;
    for (int i = 0; i < FRAMES; i++)
        ok &= (s_frames[i] = malloc(FRAME)) != NULL;
    uint32_t sum = 0;
    if (ok) {
        printf("2 MiB frames just written by this thread: %.1f GB/s\n",
               s_handoff_rate(false, cpus, &sum));
        if (n == 2)
            printf("2 MiB frames just written on another CPU (%d, read on "
                   "%d): %.1f GB/s\n",
                   cpus[1], cpus[0], s_handoff_rate(true, cpus, &sum));
    }
    for (int i = 0; i < FRAMES; i++)
        free(s_frames[i]);
}

int
main(int argc, char **argv)
{
    size_t big = (size_t)(argc > 1 ? atol(argv[1]) : 1024) << 20;
    static const size_t sizes[] = { 512, 4096, 8192, 32768, 110000, 3500000 };
    uint8_t *buf = malloc(big);
    if (!buf) {
        fprintf(stderr, "crc_speed: cannot allocate %zu MiB\n", big >> 20);
        return 1;
    }
    for (size_t i = 0; i < big; i++)
        buf[i] = (uint8_t)(i * 2654435761u >> 13);
    printf("%10s %14s %14s %10s\n", "sample B", "cached GB/s", "memory GB/s",
           "checksum");
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        uint32_t sum = 0;
        /* About 1 MiB of samples (at least one): stays in L2. */
        size_t hot = (1u << 20) / sizes[k] * sizes[k];
        if (hot < sizes[k])
            hot = sizes[k];
        double cached = s_rate(buf, hot, sizes[k], &sum);
        double cold = s_rate(buf, big, sizes[k], &sum);
        printf("%10zu %14.1f %14.1f %10x\n", sizes[k], cached, cold,
               (unsigned)sum);
    }
    free(buf);
    s_handoff_report();
    return 0;
}
