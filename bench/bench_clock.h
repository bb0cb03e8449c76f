/* bench_clock.h - the clock the C benchmarks time with, in seconds.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_BENCH_CLOCK_H
#define EMLIO_BENCH_CLOCK_H

#include <time.h>

/* Seconds on clock id: CLOCK_MONOTONIC for elapsed time,
 * CLOCK_PROCESS_CPUTIME_ID or CLOCK_THREAD_CPUTIME_ID for CPU time. */
static inline double
bench_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif /* EMLIO_BENCH_CLOCK_H */
