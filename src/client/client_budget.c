/* client_budget.c - how much the client's window may hold, and how: the
 * window's bounds (credits, memory, the path), the parts a batch is asked
 * for in, and which stream may carry a GET. client_window.c sends, files
 * and hands over; this file only decides how much and where.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

/* The auto-sized window never exceeds this many bytes in flight. */
#define S_MAX_INFLIGHT_BYTES (512ull << 20)
/* Rate growth that justifies growing the window further while the
 * consumer starves (emlio__budget_adapt). */
#define S_WINDOW_MIN_GAIN    0.05
/* Bytes one GET asks for unless cfg.request_bytes says otherwise: parts of
 * 1.8-3.5 MB (16-32 samples of 110 KB) cost the least CPU per byte over
 * loopback (0.49 CPU-s/GB); a whole batch of 28 MB as one GET cost 0.73,
 * its bytes out of cache when checked (docs/performance.md, "A batch in
 * parts"). Smaller parts pay the fixed cost of a GET more often. */
#define S_PART_BYTES         (2ull << 20)

/* The most batches worth having in flight over `streams` streams: a
 * stream has at most one TCP window on the wire per RTT, so requests
 * beyond two windows per stream only wait in the daemon's queues (and cost
 * us memory: fresh pages are dear); UINT64_MAX when the window or the
 * batch size is not known. */
static uint64_t
s_per_path(const emlio_client_t *self, uint64_t streams)
{
    if (!self->conn.window_bytes || !self->win.batch_bytes)
        return UINT64_MAX;
    return 2 * self->conn.window_bytes * streams / self->win.batch_bytes +
           2 * streams;
}

/* The largest mean record size of any shard (0 with no records). */
static uint64_t
s_max_shard_mean(const emlio_client_t *self)
{
    uint64_t most = 0;
    for (size_t i = 0; i < self->inv.n_shards; i++)
        if (self->inv.shards[i].records)
            most = EMLIO_MAX(most, self->inv.shards[i].bytes /
                                       self->inv.shards[i].records);
    return most;
}

/* How a daemon's share of a batch is split into GETs, from the mean
 * sample size: parts of about cfg.request_bytes, at most parts_max of them
 * per daemon. parts_max stays within half of every daemon's credits per
 * connection (at least one part), so one stream can always carry two
 * batches' parts: with all its credits per batch, a batch was requested
 * only once the one before it was all in, one batch per round trip
 * (max-credit 2, one stream, 5 ms: half the rate of one GET per batch).
 * And n_daemons + parts_max within the 256 part numbers of a request id. */
static void
s_split_parts(emlio_client_t *self, uint64_t mean_bytes)
{
    uint64_t n = self->cfg.batch_size;
    uint64_t want =
        self->cfg.request_bytes ? self->cfg.request_bytes : S_PART_BYTES;
    uint64_t per = mean_bytes ? EMLIO_MAX(want / mean_bytes, 1) : n;
    /* Within every daemon's samples per GET: a batch larger than that is
     * asked for in parts too. */
    uint64_t get_max = UINT32_MAX;
    uint64_t cap = 256 - EMLIO_MIN(self->conn.n_daemons, 255);
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        const emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        if (daemon->max_batch)
            get_max = EMLIO_MIN(get_max, daemon->max_batch);
        cap = EMLIO_MIN(cap, daemon->max_credit / 2);
    }
    /* And within what one GET may make every daemon copy (WELCOME's
     * max_copy_bytes): each sample's tensor block when the daemon decodes,
     * and its bytes, which a packed reply or a shard without a lease
     * copies. Below it the daemon refused every GET ("ask for fewer
     * samples"), for tensors whatever request_bytes said (issue 34). */
    /* Sized by the shard with the largest mean record, not the dataset's
     * mean: in a mix of 20 KB images and 1 KB records, GETs sized by the
     * mean asked for too many of the large ones and every one was refused
     * (--mixed-formats --io read --max-copy-bytes 64K). */
    uint64_t per_copy = EMLIO_MAX(mean_bytes, s_max_shard_mean(self));
    if (emlio__tensor_active(self))
        per_copy += emlio__tensor_out_bytes(self);
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint64_t copy = self->conn.daemons[d].max_copy;
        /* 3/4 of it: the daemon charges each record's own size, and
         * records above the mean must fit too. */
        if (copy && per_copy)
            get_max = EMLIO_MIN(get_max, EMLIO_MAX(copy / 4 * 3 / per_copy, 1));
    }
    self->win.get_max = (uint32_t)get_max;
    per = EMLIO_MAX(EMLIO_MIN(per, get_max), 1);
    /* Not (n + per - 1) / per: per may be near UINT64_MAX
     * (request_bytes UINT64_MAX, one GET per daemon). */
    uint64_t parts = n / per + (n % per != 0);
    parts = EMLIO_MAX(EMLIO_MIN(parts, cap), 1);
    uint32_t samples = (uint32_t)((n + parts - 1) / parts);
    /* Said once per change (window_init runs again as streams join), for
     * whoever tunes request_bytes. */
    if (samples != self->win.part_samples || parts != self->win.parts_max)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                  "a batch of %" PRIu64 " goes in up to %" PRIu64
                  " GETs per daemon of at most %" PRIu32 " samples (~%" PRIu64
                  " KiB each)",
                  n, parts, samples, mean_bytes * samples >> 10);
    self->win.part_samples = samples;
    self->win.parts_max = (uint32_t)parts;
}

/* The dataset's mean sample size in bytes (0 when it has no records), and
 * its records in *records. */
static uint64_t
s_mean_bytes(const emlio_client_t *self, uint64_t *records)
{
    uint64_t bytes = 0;
    *records = 0;
    for (size_t i = 0; i < self->inv.n_shards; i++) {
        *records += self->inv.shards[i].records;
        bytes += self->inv.shards[i].bytes;
    }
    return *records ? bytes / *records : 0;
}

int
emlio__budget_check_batch(emlio_client_t *self)
{
    uint64_t records;
    s_split_parts(self, s_mean_bytes(self, &records));
    if (self->win.part_samples <= self->win.get_max)
        return 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        if (self->win.part_samples > self->conn.daemons[d].max_batch)
            return emlio__seterr(
                self->err, EMLIO_ELIMIT,
                "batch size %" PRIu32 " needs GETs of %" PRIu32
                " samples (at most %" PRIu32 " GETs a batch, half the "
                "daemons' credits), above daemon '%s' limit of %" PRIu64
                " samples per GET",
                self->cfg.batch_size, self->win.part_samples,
                self->win.parts_max, self->conn.daemons[d].endpoint,
                self->conn.daemons[d].max_batch);
    return 0;
}

/* Sizes the window bounds from the daemons' credits and a memory cap. */
void
emlio__budget_init(emlio_client_t *self)
{
    uint64_t records;
    uint64_t mean = s_mean_bytes(self, &records);
    s_split_parts(self, mean);
    /* Every batch may need parts_max parts from any daemon, so the daemon
     * with the fewest credits bounds the window. */
    uint64_t credits = UINT64_MAX;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint32_t ready = 0;
        for (uint32_t k = 0; k < self->conn.daemons[d].n_streams; k++)
            ready += self->conn.daemons[d].streams[k].ready;
        credits = EMLIO_MIN(credits, self->conn.daemons[d].max_credit * ready);
    }
    credits /= self->win.parts_max;
    uint64_t batch_bytes = records ? mean * self->cfg.batch_size : 1;
    self->win.batch_bytes = batch_bytes;
    uint64_t by_memory = S_MAX_INFLIGHT_BYTES / EMLIO_MAX(batch_bytes, 1);
    uint64_t max = EMLIO_MIN(credits, EMLIO_MAX(by_memory, 2));
    self->win.max = (uint32_t)EMLIO_MIN(EMLIO_MAX(max, 1), 65536);
    if (self->cfg.inflight) {
        self->win.limit = EMLIO_MIN(self->cfg.inflight, self->win.max);
    } else {
        /* Start at twice the bandwidth-delay product of the rate the
         * first epoch is sized for, from the first RTT sample: growing from
         * a few batches would take many round trips on a long path (no
         * serial warm-up), while on a short one this is a few batches.
         * Then grow while the consumer starves (emlio__budget_adapt). */
        uint64_t streams =
            (uint64_t)self->conn.tuner.min_streams * self->conn.n_daemons;
        uint64_t start = EMLIO_MAX(4, 2 * streams);
        uint64_t bdp = (uint64_t)(2 * EMLIO__CLIENT_START_RATE *
                                  (double)self->conn.rtt_ns / 1e9) /
                       EMLIO_MAX(batch_bytes, 1);
        start = EMLIO_MAX(start, EMLIO_MIN(bdp, s_per_path(self, streams)));
        self->win.limit = (uint32_t)EMLIO_MIN(start, self->win.max);
    }
}

/* The auto-sized window keeps what it grew to, within the bounds of now
 * (streams, and so credits, may have been added). */
void
emlio__budget_rebound(emlio_client_t *self)
{
    uint32_t window = self->win.limit;
    emlio__budget_init(self);
    /* Streams were added, or a new epoch begins: growth may pay again. */
    self->win.grow_rate = 0;
    self->win.grown_out = false;
    self->win.limit =
        EMLIO_MIN(EMLIO_MAX(window, self->win.limit), self->win.max);
}

/* When the wait for streams just opened to daemon to join its session
 * (connect to WELCOME: a few round trips) ends; 0 when none is joining.
 * Until then a batch's parts wait for them rather than all queue on the
 * streams already joined: at 100 ms a batch of 1024 x 110 KB sent on
 * stream 0 alone took up to 1.9 s to arrive (0.69-1.92 s), one TCP window
 * per round trip, against 0.75-0.79 s spread over the streams
 * (docs/performance.md, "A batch in parts"). Bounded,
 * so a stream that never joins delays nothing for long. */
static uint64_t
s_join_deadline(const emlio_client_t *self, const emlio__cdaemon_t *daemon)
{
    bool joining = false;
    for (uint32_t k = 0; k < daemon->n_streams && !joining; k++)
        joining = !daemon->streams[k].ready && !daemon->streams[k].down;
    if (!joining || !daemon->opened_ns)
        return 0;
    /* TCP's handshake, ZeroMQ's (ZMTP greetings, and CURVE's when on),
     * then HELLO and WELCOME: three or four round trips. */
    uint64_t wait =
        EMLIO_MIN(4 * self->conn.rtt_ns + 50000000ull, 1000000000ull);
    return daemon->opened_ns + wait;
}

int
emlio__budget_join_wait_ms(const emlio_client_t *self, uint64_t now)
{
    uint64_t first = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint64_t t = s_join_deadline(self, &self->conn.daemons[d]);
        if (t > now && (!first || t < first))
            first = t;
    }
    return first ? (int)((first - now) / 1000000) + 1 : -1;
}

/* The most GETs one stream of daemon may have outstanding: its credits,
 * and no more than two TCP windows of batches (s_per_path), each of up to
 * parts_max parts: more would only queue behind one stream's slow start
 * while the streams opened with it are still joining. Never below one
 * batch's parts (s_split_parts keeps parts_max within the credits), except
 * while streams join: then two TCP windows of parts, so that a batch too
 * big for the joined streams waits for the others (s_join_deadline). */
static uint64_t
s_stream_cap(const emlio_client_t *self, const emlio__cdaemon_t *daemon,
             uint64_t now)
{
    uint64_t parts = EMLIO_MAX(self->win.parts_max, 1);
    uint64_t path = s_per_path(self, 1);
    if (path <= UINT64_MAX / parts)
        path *= parts;
    uint64_t cap = EMLIO_MIN(daemon->max_credit, path);
    if (self->conn.window_bytes && now < s_join_deadline(self, daemon)) {
        uint64_t part_bytes = self->win.batch_bytes /
                              EMLIO_MAX(self->cfg.batch_size, 1) *
                              self->win.part_samples;
        cap = EMLIO_MIN(
            cap, 2 * self->conn.window_bytes / EMLIO_MAX(part_bytes, 1) + 1);
    }
    return cap;
}

/* The least-loaded stream of daemon that may carry a GET now: joined, up,
 * and below the daemon's credits per connection; UINT32_MAX when none. A
 * stream that lost its connection gets nothing new: GETs queued on it
 * while it is down would reach the daemon after reconnecting together
 * with their resends (emlio__window_resend), two credits for one. */
uint32_t
emlio__budget_free_stream(const emlio_client_t *self,
                          const emlio__cdaemon_t *daemon, uint64_t now)
{
    uint64_t cap = s_stream_cap(self, daemon, now);
    uint32_t best = UINT32_MAX;
    for (uint32_t k = 0; k < daemon->n_streams; k++) {
        if (!daemon->streams[k].ready || daemon->streams[k].down ||
            daemon->streams[k].outstanding >= cap)
            continue;
        if (best == UINT32_MAX ||
            daemon->streams[k].outstanding < daemon->streams[best].outstanding)
            best = k;
    }
    return best;
}

/* Whether every daemon has parts_max credits left on its streams, so that
 * a batch, whichever daemons hold its samples, can be requested now
 * without any connection going past the credits its daemon grants
 * (WELCOME max_credit): each of its parts then finds a stream in
 * emlio__budget_free_stream. The window's bounds are sized from the same
 * credits (emlio__budget_init); this holds even while streams are down. */
bool
emlio__budget_has_credit(const emlio_client_t *self)
{
    uint64_t now = emlio__now_ns();
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        const emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        uint64_t cap = s_stream_cap(self, daemon, now);
        uint64_t left = 0;
        for (uint32_t k = 0; k < daemon->n_streams; k++)
            if (daemon->streams[k].ready && !daemon->streams[k].down &&
                daemon->streams[k].outstanding < cap)
                left += cap - daemon->streams[k].outstanding;
        if (left < EMLIO_MAX(self->win.parts_max, 1))
            return false;
    }
    return true;
}

/* Splits batch b (n samples of plan) into parts: each daemon's share in
 * plan order, cut into ceil(share / part_samples) parts of near-equal
 * size, so a share of 20 at 19 per part goes as 10 + 10, not 19 + 1.
 * Tensors the daemons decode stay one part per daemon: each GET comes back
 * as one block, handed over without a copy only when it is the batch's. */
void
emlio__budget_make_parts(emlio_client_t *self, emlio_batch_t *b,
                         const emlio_plan_sample_t *plan, size_t n)
{
    uint32_t share[EMLIO__CLIENT_MAX_DAEMONS] = { 0 };
    uint32_t first[EMLIO__CLIENT_MAX_DAEMONS]; /* its first part */
    uint32_t seen[EMLIO__CLIENT_MAX_DAEMONS] = { 0 };
    for (size_t i = 0; i < n; i++)
        share[plan[i].daemon]++;
    /* Never more than parts_max parts per daemon, whatever n. */
    uint32_t parts_max = EMLIO_MAX(self->win.parts_max, 1);
    uint32_t per = EMLIO_MAX(self->win.part_samples,
                             (uint32_t)((n + parts_max - 1) / parts_max));
    if ((b->xf_server && n <= self->win.get_max) || !per)
        per = (uint32_t)EMLIO_MAX(n, 1);
    uint32_t offset = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        first[d] = b->n_parts;
        uint32_t k = (share[d] + per - 1) / per;
        for (uint32_t p = 0; p < k; p++) {
            /* Parts p < share % k get one sample more than the rest. */
            uint32_t size = share[d] / k + (p < share[d] % k);
            b->parts[b->n_parts++] =
                (emlio__part_t){ .daemon = d,
                                 .positions = b->positions + offset };
            offset += size;
        }
    }
    for (size_t i = 0; i < n; i++) {
        uint32_t d = plan[i].daemon;
        uint32_t k = (share[d] + per - 1) / per;
        /* The j-th sample of d's share goes to the part whose range holds
         * it: the first share % k parts hold base + 1 samples each. */
        uint32_t j = seen[d]++, base = share[d] / k, extra = share[d] % k;
        uint32_t p = j < extra * (base + 1)
                         ? j / (base + 1)
                         : extra + (j - extra * (base + 1)) / base;
        emlio__part_t *part = &b->parts[first[d] + p];
        part->positions[part->n++] = (uint32_t)i;
    }
}

/* Grows the auto-sized window while the consumer starves with the window
 * full, toward about twice the bandwidth-delay product measured as
 * (batches delivered per second) x (fastest request round trip). */
void
emlio__budget_adapt(emlio_client_t *self, bool starved)
{
    if (self->cfg.inflight)
        return;
    uint64_t now = emlio__now_ns();
    uint64_t dt = now - self->win.adapt_ns;
    if (dt < 50000000ull)
        return;
    uint32_t streams = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (uint32_t k = 0; k < self->conn.daemons[d].n_streams; k++)
            streams += self->conn.daemons[d].streams[k].ready;
    uint64_t batches = self->win.n_delivered - self->win.adapt_batches;
    double rate = (double)batches * 1e9 / (double)dt;
    double bdp = rate * (double)self->win.min_latency_ns / 1e9;
    uint32_t target = (uint32_t)(2 * bdp) + streams;
    /* Growing blindly while the consumer starves took the window to its
     * bounds on a CPU-bound loopback (hundreds of batches of fresh pages
     * for nothing); grow only while the last growth paid off. */
    if (starved && self->win.grow_rate > 0 &&
        rate < self->win.grow_rate * (1 + S_WINDOW_MIN_GAIN))
        self->win.grown_out = true;
    if (starved && !self->win.grown_out) {
        target = EMLIO_MAX(target, self->win.limit + self->win.limit / 2 + 1);
        self->win.grow_rate = rate;
    } else if (target < self->win.limit / 2)
        target = self->win.limit; /* shrink lazily: no flapping */
    else
        target = EMLIO_MAX(target, self->win.limit);
    /* A stream has at most one TCP window on the wire per RTT: requests
     * beyond two windows per stream only wait in the daemon's queues (and
     * cost us memory: fresh pages are dear), so a starving consumer on a
     * window-limited path is helped by streams (emlio__client_tune), not by
     * more batches in flight. */
    target = (uint32_t)EMLIO_MIN((uint64_t)target, s_per_path(self, streams));
    self->win.limit = EMLIO_MIN(EMLIO_MAX(target, 2u), self->win.max);
    self->win.adapt_ns = now;
    self->win.adapt_batches = self->win.n_delivered;
}
