/* tuner.h - how many TCP streams a client needs per daemon, and what limits
 * its rate. Pure logic: the client feeds it measurements, it answers.
 * SPDX-License-Identifier: MIT
 *
 * One TCP stream carries at most about window / RTT, where the window is
 * the smaller of the daemon's send buffer and our receive buffer. On a long
 * path with ordinary buffers (4 MiB at 30 ms: ~140 MB/s) that, not the
 * link, is the limit, and parallel streams are how wide-area transfer tools
 * reach line rate. The tuner opens streams while three things hold:
 *   - the consumer waits (time blocked in next() is a real share of the
 *     tick): if the training loop is the bottleneck, more streams only burn
 *     memory and energy;
 *   - the streams we have run at their window limit: the rate is at least
 *     EMLIO_TUNER_WINDOW_SHARE of streams x window / RTT, with at least
 *     that share of a window asked of each stream (else the batches in
 *     flight are too few, which the client's request window fixes). If the
 *     streams run well below window / RTT, the daemon, its disk, the link
 *     or this host's CPU is what limits, and more streams would not help;
 *   - the last growth paid off (the rate grew by EMLIO_TUNER_MIN_GAIN).
 * It doubles the streams each step (a long path is far from its target, and
 * each step costs a few RTTs of slow start), judges a step by the best of
 * two ticks after the new streams had a tick to ramp up, and never shrinks
 * (closing a stream would strand the requests it carries).
 */
#ifndef EMLIO_TUNER_H
#define EMLIO_TUNER_H

#include <stdbool.h>
#include <stdint.h>

#include "emlio.h"

#define EMLIO_TUNER_WINDOW_SHARE 0.5  /* of streams x window / RTT */
#define EMLIO_TUNER_WINDOW_FULL  0.75 /* the same, held to their windows */
#define EMLIO_TUNER_MIN_WAIT     0.05 /* consumer blocked share of a tick */
#define EMLIO_TUNER_MIN_GAIN     0.10 /* rate growth that justifies a step */
#define EMLIO_TUNER_MIN_TICK_NS  200000000ull
#define EMLIO_TUNER_DISK_SHARE              \
    50 /* % of a daemon's reader time spent \
          waiting for its device */
#define EMLIO_TUNER_CPU_IDLE                \
    0.10 /* host idle share below which the \
            CPUs count as the limit */

/* What limits the rate: enum emlio_limit of emlio/client.h. */

typedef struct emlio__tuner {
    uint32_t min_streams, max_streams;
    bool pinned; /* the caller fixed the streams: measure, never change */
    uint64_t last_tick_ns;
    uint64_t last_bytes;
    uint64_t last_wait_ns;
    uint64_t grew_at_ns;     /* when the last step opened streams */
    double rate_before_grow; /* bytes/s before that step; 0 = judged */
    double best_since_grow;  /* best tick rate since the ramp-up */
    uint32_t judged;         /* ticks measured since the ramp-up */
    bool settled;            /* growth stopped paying off */
    /* Results of the last tick. */
    double rate;       /* bytes/s over the tick */
    double wait_share; /* share of the tick the consumer was blocked */
    int limit;         /* enum emlio_limit */
} emlio__tuner_t;

void emlio__tuner_init(emlio__tuner_t *t, uint32_t start, uint32_t max,
                       bool pinned, uint64_t now_ns);

/* One measurement of the client. */
typedef struct emlio__tuner_input {
    uint64_t now_ns;
    uint64_t bytes;   /* sample bytes received so far (running total) */
    uint64_t wait_ns; /* time the consumer was blocked (running total) */
    uint32_t streams; /* open per daemon */
    uint32_t daemons; /* the daemons they go to, whose streams all carry
                         `bytes` (0: one) */
    uint64_t window;  /* per-stream TCP window the path allows, bytes */
    uint64_t queued;  /* bytes requested and not yet received, per stream */
    uint64_t rtt_ns;  /* the path's RTT floor (min RTT); 0 = unknown */
    uint64_t srtt_ns; /* its smoothed RTT now */
    double host_idle; /* share of this host's CPU time idle over the tick,
                         0..1; < 0 = unknown */
    int disk;         /* the highest "disk" a daemon's recent BATCHes
                         said: % of its readers' time waiting for its
                         device (0: none said) */
} emlio__tuner_input_t;

/* Returns the number of streams wanted (>= in->streams) once a tick has
 * passed, or 0 when it is not time yet. */
uint32_t emlio__tuner_step(emlio__tuner_t *t, const emlio__tuner_input_t *in);

/* The streams to start with, before anything was measured: as many as
 * carry `rate` bytes/s when each carries 85% of window / RTT (what one
 * stream really carries here), within [min, max]; min when the RTT or the
 * window is not known. Each stream also slow-starts on its own, so more of
 * them reach a bandwidth-delay product in fewer round trips. */
uint32_t emlio__tuner_start_streams(double rate, uint64_t window,
                                    uint64_t rtt_ns, uint32_t min,
                                    uint32_t max);

#endif /* EMLIO_TUNER_H */
