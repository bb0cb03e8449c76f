/* client_tune.c - what the client measures of its path and does about it:
 * TCP_INFO samples of the streams (RTT floor, smoothed RTT), the receive
 * buffers planned from the first RTT sample (netpath.h), the stream
 * tuner's feed (tuner.h) and the advice when the windows limit. Part of
 * the connections room (conn) of client_internal.h.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

/* Plans the receive buffers from the first RTT sample, once, and sizes
 * those of the streams already connected to match (netpath.h). */
void
emlio__client_plan_rcvbuf(emlio_client_t *self)
{
    if (self->conn.rcvbuf_by_rtt || !self->conn.rtt_ns)
        return;
    self->conn.rcvbuf_by_rtt = true;
    uint64_t rtt_us = EMLIO_MIN(self->conn.rtt_ns / 1000, UINT32_MAX);
    emlio__netpath_plan_recv(&self->conn.limits, (uint32_t)rtt_us,
                             &self->conn.rcvbuf);
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (uint32_t s = 0; s < self->conn.daemons[d].n_streams; s++)
            if (self->conn.daemons[d].streams[s].fd >= 0)
                (void)emlio__netpath_apply_recv(
                    self->conn.daemons[d].streams[s].fd, &self->conn.rcvbuf);
}

/* Samples the kernel's view of our streams: the path's RTT floor (lowest
 * min RTT) and its smoothed RTT now (the mean over streams). */
void
emlio__client_sample_paths(emlio_client_t *self)
{
    uint64_t floor_us = UINT64_MAX, sum_us = 0, n = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            emlio__netpath_info_t info;
            if (daemon->streams[s].fd < 0 ||
                emlio__netpath_info(daemon->streams[s].fd, &info) < 0 ||
                !info.rtt_us)
                continue;
            uint32_t low = info.min_rtt_us ? info.min_rtt_us : info.rtt_us;
            floor_us = EMLIO_MIN(floor_us, low);
            sum_us += info.rtt_us;
            n++;
        }
    }
    if (n) {
        self->conn.rtt_ns = floor_us * 1000;
        self->conn.srtt_ns = sum_us * 1000 / n;
    }
}

/* Logs once, when the windows limit the rate, what would lift it. */
static void
s_advise(emlio_client_t *self)
{
    if (self->conn.advised || self->conn.tuner.limit != EMLIO_LIMIT_WINDOW ||
        !self->conn.rtt_ns)
        return;
    self->conn.advised = true;
    double rtt_s = (double)self->conn.rtt_ns / 1e9;
    double per_stream = (double)self->conn.window_bytes / rtt_s / 1e6;
    /* A buffer covering this path's bandwidth-delay product at 1.25 GB/s
     * (10 Gb/s) for one stream. */
    double need_mib = 1.25e9 * rtt_s / (1 << 20);
    emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
              "the path is window-limited: RTT %.1f ms, window %" PRIu64
              " KiB, so each stream carries at most ~%.0f MB/s; %s streams. "
              "To carry more per stream, raise net.ipv4.tcp_wmem's maximum "
              "on the daemon host ('%s') and net.ipv4.tcp_rmem's maximum on "
              "this host to %.0f MiB (~1,250 MB/s per stream at this RTT), or "
              "run emliod with CAP_NET_ADMIN (it then forces 32 MiB send "
              "buffers); see docs/tuning.md",
              rtt_s * 1e3, self->conn.window_bytes >> 10, per_stream,
              self->conn.tuner.pinned ? "--streams pins the number of"
                                      : "opening more",
              self->conn.daemons[0].endpoint, need_mib);
}

/* Which I/O threads the streams start on (iolanes.h), before the first
 * opens. Streams the caller fixed cannot be added to later, so they spread
 * over every thread at once; so do those of daemons all on this host
 * (local: one thread ran full over loopback); others start on one. The
 * caller may fix the threads too. */
void
emlio__client_init_lanes(emlio_client_t *self, bool local)
{
    int io_threads = zmq_ctx_get(emlio__ctx_zmq(self->ctx), ZMQ_IO_THREADS);
    uint32_t threads = io_threads > 0 ? (uint32_t)io_threads : 1;
    if (self->cfg.io_threads)
        threads = EMLIO_MIN(threads, self->cfg.io_threads);
    emlio__iolanes_init(&self->conn.lanes, threads,
                        emlio__ctx_io_prefix(self->ctx),
                        self->cfg.streams || self->cfg.io_threads || local);
}

/* A lane was just taken (iolanes.h), `before` were in use: each daemon
 * opens a share of its own streams again for it, so that the new lane
 * carries as much of every daemon as each lane before it. Per daemon, not
 * from the fewest any daemon has: one that took few streams (it refused
 * more, or descriptors ran out) must not keep the others off the lane. */
int
emlio__client_add_lane_streams(emlio_client_t *self, uint32_t before)
{
    uint32_t want[EMLIO__CLIENT_MAX_DAEMONS];
    before = EMLIO_MAX(before, 1);
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint32_t n = self->conn.daemons[d].n_streams;
        want[d] = n + (n + before - 1) / before;
    }
    return emlio__client_add_streams_each(self, want);
}

/* Takes one more I/O thread when those in use run full (iolanes.h), and
 * has each daemon open as many streams again for it, so that it carries
 * as much as each lane before it. Once every lane is in use (at once
 * where the streams are fixed) there is nothing to measure for. */
static int
s_spread_lanes(emlio_client_t *self, uint64_t now)
{
    uint32_t before = self->conn.lanes.used;
    if (before >= self->conn.lanes.threads ||
        !emlio__iolanes_sample(&self->conn.lanes, now))
        return 0;
    if (self->conn.lanes.busiest < 0)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                  "cannot find this context's I/O threads in "
                  "/proc/self/task to measure them: spreading over all %u",
                  self->conn.lanes.threads);
    else
        emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                  "I/O threads ran up to %.0f%% of a CPU: spreading over %u "
                  "of %u",
                  100 * self->conn.lanes.busiest, self->conn.lanes.used,
                  self->conn.lanes.threads);
    return emlio__client_add_lane_streams(self, before);
}

/* One step of the stream tuner (tuner.h), at most once per tick: measures
 * the rate, the consumer's waiting and the path, and opens streams when
 * the windows, not the consumer or the daemons, hold the rate back.
 * waiting_ns is the wait in progress inside next(). */
int
emlio__client_tune(emlio_client_t *self, uint64_t waiting_ns)
{
    uint64_t now = emlio__now_ns();
    uint64_t tick = EMLIO_MAX(4 * self->conn.rtt_ns, EMLIO_TUNER_MIN_TICK_NS);
    if (now - self->conn.tuner.last_tick_ns < tick)
        return 0;
    emlio__client_sample_paths(self);
    uint64_t rtt = self->conn.rtt_ns;
    uint32_t streams = UINT32_MAX;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        streams = EMLIO_MIN(streams, self->conn.daemons[d].n_streams);
    uint64_t dt = now - self->conn.tuner.last_tick_ns;
    int rc = s_spread_lanes(self, now);
    if (rc < 0)
        return rc;
    /* Bytes asked for and not yet here, per stream: samples in flight
     * times the mean sample size. Parts times a mean part size would
     * overcount: a daemon's share of a batch is cut into near-equal parts,
     * often smaller than part_samples (a share of 20 at 19 per part goes
     * as 10 + 10). */
    uint64_t sample_bytes =
        self->win.batch_bytes / EMLIO_MAX(self->cfg.batch_size, 1);
    emlio__tuner_input_t in = {
        .now_ns = now,
        .bytes = self->conn.total_bytes,
        .wait_ns = self->fig.total_wait_ns + self->fig.wait_ns + waiting_ns,
        .streams = streams,
        .daemons = self->conn.n_daemons,
        .window = self->conn.window_bytes,
        .queued = self->win.outstanding_samples * sample_bytes /
                  EMLIO_MAX((uint64_t)streams * self->conn.n_daemons, 1),
        .rtt_ns = rtt,
        .srtt_ns = self->conn.srtt_ns,
        .host_idle = -1,
    };
    /* A daemon's word for its disk holds for a second: one that stopped
     * sending BATCHes (idle, or done) says nothing of now. */
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        if (now - self->conn.daemons[d].disk_at_ns < 1000000000ull)
            in.disk = EMLIO_MAX(in.disk, self->conn.daemons[d].disk);
    uint64_t idle, total;
    if (emlio__netpath_cpu_times(&idle, &total) == 0) {
        if (self->conn.cpu_total && total > self->conn.cpu_total)
            in.host_idle = (double)(idle - self->conn.cpu_idle) /
                           (double)(total - self->conn.cpu_total);
        self->conn.cpu_idle = idle;
        self->conn.cpu_total = total;
    }
    uint32_t want = emlio__tuner_step(&self->conn.tuner, &in);
    if (!want)
        return 0;
    emlio_log(self->ctx, EMLIO_LOG_DEBUG, "client",
              "tuner: %.1f MB/s, consumer waited %.0f%%, %u streams, %" PRIu64
              " KiB asked per stream, window %" PRIu64
              " KiB, RTT %.2f/%.2f ms: %s%s",
              self->conn.tuner.rate / 1e6, 100 * self->conn.tuner.wait_share,
              streams, in.queued >> 10, in.window >> 10, (double)rtt / 1e6,
              (double)self->conn.srtt_ns / 1e6,
              emlio_limit_name(self->conn.tuner.limit),
              self->conn.tuner.settled ? " (settled)" : "");
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            daemon->streams[s].rx_rate =
                (double)(daemon->streams[s].rx_bytes -
                         daemon->streams[s].rx_bytes_tick) *
                1e9 / (double)dt;
            daemon->streams[s].rx_bytes_tick = daemon->streams[s].rx_bytes;
        }
    }
    s_advise(self);
    if (want <= streams)
        return 0;
    emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
              "%.0f MB/s over %u streams per daemon at RTT %.1f ms is "
              "window-limited; opening %u",
              self->conn.tuner.rate / 1e6, streams, (double)rtt / 1e6, want);
    return emlio__client_add_streams(self, want);
}
