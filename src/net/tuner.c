/* tuner.c - stream count and rate-limit diagnosis (see tuner.h).
 * SPDX-License-Identifier: MIT
 */
#include "tuner.h"

const char *
emlio_limit_name(int limit)
{
    switch (limit) {
    case EMLIO_LIMIT_CONSUMER:
        return "consumer";
    case EMLIO_LIMIT_WINDOW:
        return "window";
    case EMLIO_LIMIT_NETWORK:
        return "network";
    case EMLIO_LIMIT_DAEMON:
        return "daemon";
    case EMLIO_LIMIT_CPU:
        return "cpu";
    case EMLIO_LIMIT_DISK:
        return "disk";
    default:
        return "unknown";
    }
}

void
emlio__tuner_init(emlio__tuner_t *t, uint32_t start, uint32_t max, bool pinned,
                  uint64_t now_ns)
{
    *t = (emlio__tuner_t){ 0 };
    t->min_streams = start;
    t->max_streams = max < start ? start : max;
    t->pinned = pinned;
    t->last_tick_ns = now_ns;
}

uint32_t
emlio__tuner_start_streams(double rate, uint64_t window, uint64_t rtt_ns,
                           uint32_t min, uint32_t max)
{
    if (max < min)
        max = min;
    if (!window || !rtt_ns || rate <= 0)
        return min;
    double per_stream = 0.85 * (double)window * 1e9 / (double)rtt_ns;
    double need = rate / per_stream;
    if (need <= min)
        return min;
    return need >= max ? max : (uint32_t)(need + 0.999);
}

uint32_t
emlio__tuner_step(emlio__tuner_t *t, const emlio__tuner_input_t *in)
{
    /* A tick spans several RTTs, so that slow start and the window's
     * oscillations average out. */
    uint64_t tick = 4 * in->rtt_ns;
    if (tick < EMLIO_TUNER_MIN_TICK_NS)
        tick = EMLIO_TUNER_MIN_TICK_NS;
    uint64_t dt = in->now_ns - t->last_tick_ns;
    if (dt < tick)
        return 0;
    t->rate = (double)(in->bytes - t->last_bytes) * 1e9 / (double)dt;
    t->wait_share = (double)(in->wait_ns - t->last_wait_ns) / (double)dt;
    t->last_tick_ns = in->now_ns;
    t->last_bytes = in->bytes;
    t->last_wait_ns = in->wait_ns;

    /* What limits: the consumer when it hardly waits; this host's CPUs
     * when they are all busy, unless the streams run full: a stream costs
     * CPU per byte (its ACKs and wake-ups), so on busy CPUs more of them
     * add rate only where each is held to its window (30 ms, 2 vCPUs: 20
     * streams carried what 10 did, with twice the batches in flight); the
     * windows when the streams run near window / RTT each with enough asked
     * of them to fill their windows (else the batches in flight, not the
     * streams, are short: the client's window grows for that); the path
     * when its queues grow (smoothed RTT above 1.5 x the floor + 5 ms: on
     * loopback a busy CPU alone delays ACKs by a few ms); else the daemons.
     * Without an RTT (not TCP) windows never limit. */
    double per_stream =
        in->rtt_ns ? (double)in->window * 1e9 / (double)in->rtt_ns : 0;
    /* The rate is all daemons' together: it is carried by streams per
     * daemon times the daemons. */
    double carried = (double)in->streams * (in->daemons ? in->daemons : 1);
    double capacity = per_stream * carried; /* bytes/s at full windows */
    bool measured =
        per_stream > 0 &&
        (double)in->queued >= EMLIO_TUNER_WINDOW_SHARE * (double)in->window;
    bool window_bound =
        measured && t->rate >= EMLIO_TUNER_WINDOW_SHARE * capacity;
    bool window_full =
        measured && t->rate >= EMLIO_TUNER_WINDOW_FULL * capacity;
    bool cpu_busy = in->host_idle >= 0 && in->host_idle < EMLIO_TUNER_CPU_IDLE;
    if (t->wait_share < EMLIO_TUNER_MIN_WAIT)
        t->limit = EMLIO_LIMIT_CONSUMER;
    else if (cpu_busy && !window_full)
        t->limit = EMLIO_LIMIT_CPU;
    else if (window_bound)
        t->limit = EMLIO_LIMIT_WINDOW;
    else if (in->disk >= EMLIO_TUNER_DISK_SHARE)
        t->limit = EMLIO_LIMIT_DISK; /* before the path: on loopback a
                                        starved reader delays ACKs too */
    else if (in->rtt_ns && 2 * in->srtt_ns > 3 * in->rtt_ns + 10000000ull)
        t->limit = EMLIO_LIMIT_NETWORK;
    else
        t->limit = EMLIO_LIMIT_DAEMON;

    uint32_t streams = in->streams;
    if (t->pinned || t->settled || streams >= t->max_streams)
        return streams;
    if (t->rate_before_grow > 0) {
        /* Judge the last step by the best of the ticks that follow the new
         * streams' ramp-up (one tick): a single tick is noisy. */
        if (in->now_ns - t->grew_at_ns < 2 * tick)
            return streams;
        /* A tick in which little was asked (an epoch's tail) says nothing
         * about the streams. */
        if ((double)in->queued < EMLIO_TUNER_WINDOW_SHARE * (double)in->window)
            return streams;
        if (t->rate > t->best_since_grow)
            t->best_since_grow = t->rate;
        if (++t->judged < 2)
            return streams;
        if (t->best_since_grow <
            t->rate_before_grow * (1.0 + EMLIO_TUNER_MIN_GAIN)) {
            t->settled = true;
            return streams;
        }
        t->rate_before_grow = 0;
    }
    if (t->limit != EMLIO_LIMIT_WINDOW)
        return streams;
    uint32_t want = streams * 2;
    if (want > t->max_streams)
        want = t->max_streams;
    t->rate_before_grow = t->rate;
    t->best_since_grow = 0;
    t->judged = 0;
    t->grew_at_ns = in->now_ns;
    return want;
}
