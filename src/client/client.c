/* client.c - emlio_client_t: plans epochs and pulls their batches from the
 * daemons with many requests in flight over several streams. This file
 * holds the public API and the lifecycle; client_internal.h maps the rooms.
 * SPDX-License-Identifier: MIT
 */
#include "client_internal.h"

#include <sys/random.h>

void
emlio_client_config_init(emlio_client_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->batch_size = 32;
    cfg->world = 1;
    cfg->shuffle = EMLIO_SHUFFLE_WINDOW;
    cfg->streams = 0;
    cfg->verify = true;
    cfg->connect_timeout_ms = 10000;
    cfg->timeout_ms = 60000;
}

/* Splits cfg.fields ("jpg,cls") into self->want_fields. 0, EMLIO_ENOMEM,
 * or EMLIO_EINVAL with the reason in errbuf (reported by connect). */
static int
s_parse_fields(emlio_client_t *self, const char *spec, char *errbuf)
{
    if (!spec || !*spec)
        return 0;
    for (const char *p = spec;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n > EMLIO_WIRE_MAX_NAME)
            return emlio__seterr(errbuf, EMLIO_EINVAL,
                                 "fields '%.200s': an empty or long name",
                                 spec);
        if (self->n_want_fields == EMLIO_WIRE_MAX_FIELDS)
            return emlio__seterr(errbuf, EMLIO_EINVAL,
                                 "fields '%.200s': more than %u", spec,
                                 EMLIO_WIRE_MAX_FIELDS);
        for (size_t i = 0; i < self->n_want_fields; i++)
            if (strlen(self->want_fields[i]) == n &&
                memcmp(self->want_fields[i], p, n) == 0)
                return emlio__seterr(errbuf, EMLIO_EINVAL,
                                     "fields '%.200s': '%.*s' twice", spec,
                                     (int)EMLIO_MIN(n, 64), p);
        char **v = emlio_reallocarray(self->want_fields,
                                      self->n_want_fields + 1, sizeof(*v));
        if (!v)
            return EMLIO_ENOMEM;
        self->want_fields = v;
        char *name = emlio__memdupz(p, n);
        if (!name)
            return EMLIO_ENOMEM;
        v[self->n_want_fields++] = name;
        if (!p[n])
            return 0;
        p += n + 1;
    }
}

emlio_client_t *
emlio_client_new(emlio_ctx_t *ctx, const emlio_client_config_t *cfg)
{
    assert(ctx && cfg);
    emlio_client_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->ctx = ctx;
    self->cfg = *cfg;
    self->name = emlio_strdup(cfg->name ? cfg->name : "emlio-client");
    const char *job = cfg->job;
    static const char *const job_env[] = { "EMLIO_JOB", "TORCHELASTIC_RUN_ID",
                                           "SLURM_JOB_ID" };
    for (size_t i = 0; !job && i < EMLIO_ARRAY_SIZE(job_env); i++) {
        const char *v = getenv(job_env[i]);
        job = v && *v ? v : NULL;
    }
    self->job = job ? emlio_strdup(job) : NULL;
    if (job && !self->job) {
        emlio_client_destroy(&self);
        return NULL;
    }
    self->cfg.job = self->job;
    self->current.plan = emlio_plan_new();
    self->ahead.plan = emlio_plan_new();
    if (!self->name || !self->current.plan || !self->ahead.plan) {
        emlio_client_destroy(&self);
        return NULL;
    }
    self->cfg.name = self->name;
    if (self->cfg.batch_size == 0)
        self->cfg.batch_size = 1;
    if (self->cfg.world == 0)
        self->cfg.world = 1;
    if (self->cfg.streams > EMLIO__CLIENT_MAX_STREAMS)
        self->cfg.streams = EMLIO__CLIENT_MAX_STREAMS;
    emlio__netpath_limits(&self->conn.limits);
    /* Autotuned until the first RTT sample says how long the path is. */
    emlio__netpath_plan_recv(&self->conn.limits, 0, &self->conn.rcvbuf);
    /* Never 0: that means "no session" on the wire. */
    while (!self->conn.session)
        if (getrandom(&self->conn.session, sizeof(self->conn.session), 0) !=
            sizeof(self->conn.session))
            self->conn.session = emlio__now_ns() ^ (uintptr_t)self;
    emlio_buf_init(&self->scratch);
    snprintf(self->err, sizeof(self->err), "no error");
    /* A bad spec is the caller's mistake, reported by connect (new fails
     * only when out of memory). */
    self->xf_init_rc =
        emlio__client_xf_init(&self->xf, &self->cfg, self->xf_init_err);
    self->cfg.transform = NULL; /* borrowed: the parsed copy is kept */
    if (self->xf_init_rc == 0)
        self->xf_init_rc = s_parse_fields(self, cfg->fields, self->xf_init_err);
    self->cfg.fields = NULL; /* borrowed: the split copy is kept */
    if (self->xf_init_rc == 0)
        self->xf_init_rc = emlio__sources_init(self, cfg, self->xf_init_err);
    if (self->xf_init_rc == EMLIO_ENOMEM) {
        emlio_client_destroy(&self);
        return NULL;
    }
    return self;
}

void
emlio_client_destroy(emlio_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_client_t *self = *self_p;
    emlio__epoch_abandon(self, 0);
    emlio__tensor_shutdown(self); /* the pool gives back what it held */
    emlio__client_xf_release(&self->xf);
    while (self->win.free_list) {
        emlio_batch_t *b = self->win.free_list;
        self->win.free_list = b->next;
        emlio__batch_free(b);
    }
    emlio__client_disconnect(self);
    emlio_free(self->win.slots);
    emlio_free(self->win.delivered);
    emlio_free(self->win.items);
    emlio_free(self->win.skipped);
    emlio_buf_release(&self->scratch);
    emlio_plan_destroy(&self->current.plan);
    emlio_plan_destroy(&self->ahead.plan);
    emlio__resume_clear(&self->resume);
    emlio_free(self->name);
    emlio_free(self->job);
    for (size_t i = 0; i < self->n_want_fields; i++)
        emlio_free(self->want_fields[i]);
    emlio_free(self->want_fields);
    emlio__sources_release(self);
    emlio_free(self);
    *self_p = NULL;
}

int
emlio_client_connect(emlio_client_t *self, const char *endpoints)
{
    assert(self);
    if (self->conn.n_daemons)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "client already connected");
    if (self->xf_init_rc < 0)
        return emlio__seterr(self->err, self->xf_init_rc, "%s",
                             self->xf_init_err);
    if (self->n_src && endpoints && *endpoints)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "the sources name the daemons: connect takes "
                             "no endpoint list beside them");
    if (self->n_src)
        endpoints = self->src_endpoints;
    if (!endpoints)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "no endpoint to connect "
                             "to");
    int rc = emlio__client_dial(self, endpoints);
    if (rc < 0) /* as new again: connect may be retried */
        emlio__client_disconnect(self);
    return rc;
}

size_t
emlio_client_field_count(const emlio_client_t *self)
{
    assert(self);
    return self->inv.n_fields ? self->inv.n_fields : 1;
}

const char *
emlio_client_field_name(const emlio_client_t *self, size_t i)
{
    assert(self);
    if (i >= emlio_client_field_count(self))
        return NULL;
    return self->inv.fields ? self->inv.fields[i] : "";
}

int
emlio_client_field_index(const emlio_client_t *self, const char *name)
{
    assert(self && name);
    for (size_t i = 0; self->inv.fields && i < self->inv.n_fields; i++)
        if (strcmp(self->inv.fields[i], name) == 0)
            return (int)i;
    return EMLIO_ENOTFOUND;
}

int
emlio_batch_field(const emlio_batch_t *b, size_t i, size_t field,
                  const uint8_t **data, size_t *len)
{
    assert(b && data && len);
    size_t nf = b->owner->inv.n_fields ? b->owner->inv.n_fields : 1;
    if (i >= b->n || field >= nf)
        return EMLIO_ENOTFOUND;
    *data = b->fdata[i * nf + field];
    *len = b->flen[i * nf + field];
    return 0;
}

uint64_t
emlio_client_shard_bytes(const emlio_client_t *self, size_t i)
{
    return i < self->inv.n_shards ? self->inv.shards[i].bytes : 0;
}

const char *
emlio_client_format(const emlio_client_t *self)
{
    return self->inv.format;
}

size_t
emlio_client_class_count(const emlio_client_t *self)
{
    return self->inv.n_classes;
}

const char *
emlio_client_class_name(const emlio_client_t *self, size_t label)
{
    return label < self->inv.n_classes ? self->inv.classes[label] : NULL;
}

size_t
emlio_client_shard_count(const emlio_client_t *self)
{
    return self->inv.n_shards;
}

const char *
emlio_client_shard_name(const emlio_client_t *self, size_t i)
{
    return i < self->inv.n_shards ? self->inv.shards[i].name : NULL;
}

uint64_t
emlio_client_shard_records(const emlio_client_t *self, size_t i)
{
    return i < self->inv.n_shards ? self->inv.shards[i].records : 0;
}

const uint32_t *
emlio_client_shard_holders(const emlio_client_t *self, size_t i, size_t *n)
{
    *n = i < self->inv.n_shards ? self->inv.shards[i].n_holders : 0;
    return i < self->inv.n_shards ? self->inv.shards[i].holders : NULL;
}

size_t
emlio_client_daemon_count(const emlio_client_t *self)
{
    return self->conn.n_daemons;
}

const char *
emlio_client_daemon_endpoint(const emlio_client_t *self, size_t d)
{
    return d < self->conn.n_daemons ? self->conn.daemons[d].endpoint : NULL;
}

/* What the path can carry, bytes/s, for the placement of transforms: each
 * stream at most a window per RTT; 0 while the RTT is not measured. */
static double
s_path_rate(const emlio_client_t *self)
{
    if (!self->conn.rtt_ns || !self->conn.window_bytes)
        return 0;
    uint64_t streams = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        streams += self->conn.daemons[d].n_streams;
    return (double)self->conn.window_bytes * (double)streams /
           ((double)self->conn.rtt_ns / 1e9);
}

/* The pace of the caller over the epoch that ends: images per second of
 * its own time between next() calls (the epoch's time minus the time it
 * waited in next()). A GPU-bound training loop takes only so many images a
 * second, whatever the placement, so auto may then save energy; 0 when
 * not measured, or when the caller waited for most of the epoch (the
 * loader, not the caller, set the pace). */
static double
s_consumer_rate(const emlio_client_t *self)
{
    uint64_t span = self->fig.last_delivery_ns - self->fig.epoch_start_ns;
    if (!self->fig.samples || !span || self->fig.wait_ns * 2 >= span)
        return 0;
    return (double)self->fig.samples /
           ((double)(span - self->fig.wait_ns) / 1e9);
}

int
emlio_client_begin_epoch(emlio_client_t *self, uint64_t epoch)
{
    assert(self);
    if (!self->inv.n_shards)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "connect before starting an epoch");
    int rc = emlio__budget_check_batch(self);
    if (rc < 0)
        return rc;
    emlio__client_xf_begin_epoch(&self->xf, s_path_rate(self),
                                 s_consumer_rate(self));
    return emlio__epoch_begin(self, epoch);
}

static int s_next(emlio_client_t *self, emlio_batch_t **batch_out);

/* The poll items of the wait: every stream and its monitor, and the decode
 * pool's eventfd while it holds batches (the slot after them). */
static size_t
s_poll_items(emlio_client_t *self)
{
    size_t n = 2 * self->conn.n_poll;
    if (!emlio__client_xf_pending(&self->xf))
        return n;
    self->conn.poll[n] =
        (zmq_pollitem_t){ NULL, self->xf.wake_fd, ZMQ_POLLIN, 0 };
    return n + 1;
}

int
emlio_client_next(emlio_client_t *self, emlio_batch_t **batch_out)
{
    assert(self && batch_out);
    *batch_out = NULL;
    /* After a failure that loses a part of the epoch (a corrupt sample, a
     * protocol error, a daemon's refusal), the epoch cannot complete: every
     * later call says so at once, until begin_epoch or load_state. Timeouts
     * and interruptions lose nothing and may be retried. */
    if (self->failed_rc)
        return emlio__seterr(self->err, self->failed_rc,
                             "the epoch failed earlier (%s); begin_epoch or "
                             "load_state starts again",
                             self->failed_msg);
    int rc = s_next(self, batch_out);
    if (rc < 0 && rc != EMLIO_ETIMEDOUT && rc != -EINTR && rc != EMLIO_EINVAL) {
        self->failed_rc = rc;
        snprintf(self->failed_msg, sizeof(self->failed_msg), "%s", self->err);
    }
    return rc;
}

static int
s_next(emlio_client_t *self, emlio_batch_t **batch_out)
{
    if (!self->current.live)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "no epoch in progress: call begin_epoch");
    uint64_t wait_start = emlio__now_ns();
    uint64_t last_progress = wait_start;
    bool waited = false;
    bool starved = false;
    for (;;) {
        int rc =
            emlio__client_tune(self, waited ? emlio__now_ns() - wait_start : 0);
        if (rc < 0)
            return rc;
        rc = emlio__window_fill(self);
        if (rc < 0)
            return rc;
        if (emlio__client_xf_pending(&self->xf)) {
            rc = emlio__tensor_collect(self);
            if (rc < 0)
                return rc;
            if (rc)
                last_progress = emlio__now_ns();
        }
        emlio_batch_t *b = emlio__window_take(self);
        if (b) {
            uint64_t now = emlio__now_ns();
            self->win.delivered[b->index / 8] |=
                (uint8_t)(1u << (b->index % 8));
            self->win.n_delivered++;
            self->fig.samples += b->n;
            self->fig.bytes += b->bytes;
            self->fig.disk_read += b->disk_read;
            self->fig.shared += b->shared;
            self->fig.last_delivery_ns = now;
            if (!self->fig.first_batch_ns)
                self->fig.first_batch_ns = now;
            if (waited)
                self->fig.wait_ns += now - wait_start;
            emlio__budget_adapt(self, starved);
            *batch_out = b;
            return 1;
        }
        if (self->win.n_delivered == self->current.n_batches) {
            self->current.live = false;
            return 0;
        }
        /* Nothing ready: wait for replies. A wait with every slot of the
         * window busy means the window, not the daemon, is the limit. */
        if (self->win.n_slots >= self->win.limit &&
            self->current.next_to_send < self->current.n_batches)
            starved = true;
        waited = true;
        uint64_t now = emlio__now_ns();
        uint64_t limit =
            (uint64_t)EMLIO_MAX(self->cfg.timeout_ms, 1) * 1000000ull;
        if (now - last_progress >= limit) {
            self->fig.wait_ns += now - wait_start;
            return emlio__seterr(self->err, EMLIO_ETIMEDOUT,
                                 "no reply from the daemons for %d ms with %zu "
                                 "requests outstanding (first: '%s')",
                                 self->cfg.timeout_ms,
                                 self->win.outstanding_parts,
                                 self->conn.daemons[0].endpoint);
        }
        int left = (int)((limit - (now - last_progress)) / 1000000) + 1;
        /* Parts held back while streams join are sent when they have
         * joined, or when the wait for them ends (client_budget.c). */
        int join_ms = emlio__budget_join_wait_ms(self, now);
        if (join_ms >= 0 && join_ms < left)
            left = join_ms;
        rc = zmq_poll(self->conn.poll, (int)s_poll_items(self), left);
        if (rc < 0) {
            if (errno == EINTR) {
                /* Let the caller look at its signal flags; nothing is lost,
                 * the next call carries on. */
                self->fig.wait_ns += emlio__now_ns() - wait_start;
                return emlio__seterr(self->err, -EINTR, "interrupted");
            }
            return emlio__seterr(self->err, -errno, "poll failed: %s",
                                 zmq_strerror(errno));
        }
        for (size_t i = 0; i < self->conn.n_poll; i++) {
            if (!(self->conn.poll[self->conn.n_poll + i].revents & ZMQ_POLLIN))
                continue;
            rc = emlio__client_handle_events(self, self->conn.poll_daemon[i],
                                             self->conn.poll_stream[i]);
            if (rc < 0) {
                self->fig.wait_ns += emlio__now_ns() - wait_start;
                return rc;
            }
        }
        for (size_t i = 0; i < self->conn.n_poll; i++) {
            if (!(self->conn.poll[i].revents & ZMQ_POLLIN))
                continue;
            /* Drain what is queued on this stream, a bounded amount so the
             * other streams are served too. */
            for (int k = 0; k < 64; k++) {
                rc = emlio__window_receive(self, self->conn.poll_daemon[i],
                                           self->conn.poll_stream[i]);
                if (rc < 0) {
                    self->fig.wait_ns += emlio__now_ns() - wait_start;
                    return rc;
                }
                if (rc == 0)
                    break;
                last_progress = emlio__now_ns();
            }
        }
    }
}

const emlio_sample_t *
emlio_batch_samples(const emlio_batch_t *b, size_t *n)
{
    *n = b->n;
    return b->samples;
}

uint64_t
emlio_batch_epoch(const emlio_batch_t *b)
{
    return b->epoch;
}

uint64_t
emlio_batch_index(const emlio_batch_t *b)
{
    return b->index;
}

void
emlio_batch_release(emlio_batch_t **b_p)
{
    if (!b_p || !*b_p)
        return;
    emlio__batch_put((*b_p)->owner, *b_p);
    *b_p = NULL;
}

void
emlio_client_stats(const emlio_client_t *self, emlio_client_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->epoch = self->current.number;
    out->batches = self->win.n_delivered;
    out->samples = self->fig.samples;
    out->bytes = self->fig.bytes;
    out->disk_read_bytes = self->fig.disk_read;
    out->shared_bytes = self->fig.shared;
    out->share_join = self->inv.share ? self->inv.join : 0;
    out->seconds =
        (double)(self->fig.last_delivery_ns - self->fig.epoch_start_ns) / 1e9;
    out->wait_s = (double)self->fig.wait_ns / 1e9;
    out->first_batch_s =
        self->fig.first_batch_ns
            ? (double)(self->fig.first_batch_ns - self->fig.epoch_start_ns) /
                  1e9
            : 0;
    out->inflight = self->win.limit;
    out->retries = self->fig.retries;
    out->skipped = self->win.n_skipped;
    out->rtt_ms = (double)self->conn.rtt_ns / 1e6;
    out->mb_per_s = self->conn.tuner.rate / 1e6;
    out->streams = UINT32_MAX;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        out->streams = EMLIO_MIN(out->streams, self->conn.daemons[d].n_streams);
    if (!self->conn.n_daemons)
        out->streams = 0;
    out->limit = self->conn.tuner.limit;
    out->window = self->conn.window_bytes;
    out->io_threads =
        self->conn.n_daemons ? emlio__iolanes_carrying(&self->conn.lanes) : 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        out->disk_pct =
            EMLIO_MAX(out->disk_pct, (uint32_t)self->conn.daemons[d].disk);
}

size_t
emlio_client_streams(const emlio_client_t *self, emlio_stream_stats_t *out,
                     size_t max)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        const emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++, n++) {
            if (n >= max)
                continue;
            emlio__netpath_info_t info;
            double rtt = 0;
            if (daemon->streams[s].fd >= 0 &&
                emlio__netpath_info(daemon->streams[s].fd, &info) == 0)
                rtt = info.rtt_us / 1e3;
            out[n] = (emlio_stream_stats_t){
                .daemon = d,
                .stream = s,
                .ready = daemon->streams[s].ready,
                .io_thread = daemon->streams[s].lane,
                .mb_per_s = daemon->streams[s].rx_rate / 1e6,
                .rtt_ms = rtt,
                .bytes = daemon->streams[s].rx_bytes,
            };
        }
    }
    return n;
}

const emlio_sample_t *
emlio_client_skipped(const emlio_client_t *self, size_t *n)
{
    *n = self->win.n_skipped;
    return self->win.skipped;
}

const emlio_plan_t *
emlio_client_plan(const emlio_client_t *self)
{
    return self->current.n_batches || self->current.live ? self->current.plan
                                                         : NULL;
}

const char *
emlio_client_errmsg(const emlio_client_t *self)
{
    return self->err;
}
