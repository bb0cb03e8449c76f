/* client.c - emlio_client_t: plans epochs and pulls their batches from the
 * daemons with many requests in flight over several streams.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <zmq.h>

#include <sys/random.h>

#include "crc32c.h"
#include "netpath.h"
#include "tuner.h"
#include "wire.h"

#define S_MAX_DAEMONS        255 /* part numbers are 8 bits of the request id */
#define S_MAX_STREAMS        EMLIO_WIRE_MAX_STREAMS
/* Streams per daemon the tuner starts from (cfg.streams = 0): two, or on a
 * long path as many as carry S_START_RATE at the measured RTT and window
 * (at most S_MAX_START_STREAMS), so that the first epoch does not crawl
 * while the tuner doubles its way up. */
#define S_AUTO_START_STREAMS 2
#define S_MAX_START_STREAMS  16
#define S_START_RATE         250e6 /* bytes/s: 2 Gb/s */
/* Request ids: generation (24 bits) | batch index (32) | part (8). The
 * generation changes with every epoch so late replies to an abandoned epoch
 * are recognized and dropped. */
#define S_ID(gen, batch, part) \
    (((uint64_t)(gen) << 40) | ((uint64_t)(batch) << 8) | (uint64_t)(part))
#define S_ID_GEN(id)         ((id) >> 40)
#define S_ID_BATCH(id)       (((id) >> 8) & 0xffffffffu)
#define S_ID_PART(id)        ((id)&0xffu)
/* The auto-sized window never exceeds this many bytes in flight. */
#define S_MAX_INFLIGHT_BYTES (512ull << 20)

typedef struct s_daemon {
    char *endpoint;
    uint32_t n_streams;                       /* streams opened */
    void *socks[S_MAX_STREAMS];               /* one DEALER per stream */
    uint32_t sock_outstanding[S_MAX_STREAMS]; /* GETs in flight per stream:
                                                 the daemon grants
                                                 max_credit per connection */
    void *mons[S_MAX_STREAMS];                /* PAIR sockets receiving each
                                                 stream's connection events */
    bool down[S_MAX_STREAMS];                 /* stream lost its connection */
    bool ready[S_MAX_STREAMS];        /* may carry GETs: joined the session */
    int fd[S_MAX_STREAMS];            /* its TCP socket (TCP_INFO), or -1 */
    uint64_t rx_bytes[S_MAX_STREAMS]; /* sample bytes received */
    uint64_t rx_bytes_tick[S_MAX_STREAMS];
    double rx_rate[S_MAX_STREAMS]; /* bytes/s over the last tuner tick */
    uint32_t max_streams;          /* the daemon's session limit; 0 = a daemon
                                      without sessions (each stream a client) */
    uint64_t sndbuf;               /* its send buffer per connection; 0 =
                                      not said */
    uint64_t failed_handshakes;    /* transient handshake failures seen */
    char dataset[64];
    uint32_t *local_id; /* global shard -> this daemon's shard id, or
                           UINT32_MAX when it does not hold the shard */
    uint64_t max_batch;
    uint64_t max_credit;
} s_daemon_t;

typedef struct s_shard {
    char *name;
    uint64_t records;
    uint64_t bytes;
    uint32_t *holders;
    uint32_t n_holders;
} s_shard_t;

/* The samples of one batch that one daemon serves. */
typedef struct s_part {
    uint32_t daemon;
    uint32_t n;
    uint32_t *positions; /* indices into the batch's samples */
    bool done;
    uint32_t sock; /* the stream the GET went out on */
    uint64_t sent_ns;
} s_part_t;

struct emlio_batch {
    emlio_client_t *owner;
    uint64_t epoch;
    uint64_t index;
    uint32_t gen; /* request generation: its epoch's, in the request ids */
    emlio_sample_t *samples;
    size_t n; /* samples planned */
    size_t cap;
    zmq_msg_t *frames;
    size_t n_frames;
    const uint8_t **fdata; /* [position * n_fields + field] */
    size_t *flen;
    s_part_t *parts;
    uint32_t n_parts;
    uint32_t parts_done;
    uint32_t *positions; /* storage for the parts' positions */
    uint64_t bytes;
    struct emlio_batch *next; /* ready queue or free list */
};

struct emlio_client {
    emlio_ctx_t *ctx;
    int failed_rc; /* next() failed for good this epoch (0: it did not) */
    char failed_msg[EMLIO_ERRMSG_LEN];
    emlio_client_config_t cfg;
    char *name;
    uint64_t session; /* random: lets the daemons count our streams once */
    emlio_netpath_limits_t limits;  /* this host's TCP buffer limits */
    emlio_netpath_bufplan_t rcvbuf; /* how each stream's receive buffer is
                                       sized */
    emlio_tuner_t tuner;
    uint64_t window_bytes; /* per-stream TCP window the path allows */
    uint64_t rtt_ns;       /* RTT floor over our streams (TCP_INFO) */
    uint64_t srtt_ns;      /* smoothed RTT now */
    uint64_t total_bytes;  /* sample bytes received, all epochs */
    uint64_t total_wait_ns;
    uint64_t batch_bytes; /* mean bytes of one batch in this dataset */
    uint64_t cpu_idle;    /* host CPU jiffies at the last tuner tick */
    uint64_t cpu_total;
    bool advised;          /* the window advice was logged */
    uint32_t *poll_daemon; /* poll item i -> daemon, stream */
    uint32_t *poll_stream;
    s_daemon_t *daemons;
    uint32_t n_daemons;
    s_shard_t *shards;
    size_t n_shards;
    char **fields;    /* the daemons' field names (protocol v2); NULL = one
                         unnamed field */
    size_t n_fields;  /* frames per sample, >= 1 */
    char dataset[17]; /* fingerprint over all daemons' datasets */
    zmq_pollitem_t *poll;
    size_t n_poll;
    emlio_plan_t *plan;
    bool in_epoch;
    uint64_t epoch;
    uint32_t gen;
    /* The next epoch, planned and requested while the current one's last
     * batches are still arriving (so the pipe never drains between
     * epochs); its batches wait in the slots until begin_epoch takes it. */
    emlio_plan_t *ahead_plan;
    bool ahead;
    uint64_t ahead_epoch;
    uint32_t ahead_gen;
    size_t ahead_n;
    size_t ahead_next;
    size_t n_batches;
    size_t next_to_send; /* next plan batch to request */
    size_t next_deliver; /* in_order: the batch due next */
    uint8_t *delivered;  /* bitmap over the epoch's batches */
    size_t n_delivered;
    emlio_batch_t **slots; /* batches requested and not yet handed over */
    size_t n_slots;
    size_t cap_slots;
    emlio_batch_t *ready_head; /* completed, out-of-order delivery queue */
    emlio_batch_t *ready_tail;
    emlio_batch_t *free_list;
    uint32_t window; /* batches in flight allowed now */
    uint32_t window_max;
    uint64_t min_latency_ns; /* fastest request seen: RTT + service time */
    uint64_t adapt_ns;       /* when the window was last resized */
    uint64_t adapt_batches;  /* batches delivered at that time */
    size_t outstanding_parts;
    emlio_buf_t scratch;
    emlio_wire_item_t *items;
    emlio_sample_t *skipped; /* records daemons left out as corrupt */
    size_t n_skipped;
    size_t cap_skipped;
    /* Epoch figures. */
    uint64_t epoch_start_ns;
    uint64_t last_delivery_ns;
    uint64_t first_batch_ns;
    uint64_t wait_ns;
    uint64_t stat_samples;
    uint64_t stat_bytes;
    uint64_t retries;
    char err[EMLIO_ERRMSG_LEN];
};

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
    self->plan = emlio_plan_new();
    self->ahead_plan = emlio_plan_new();
    if (!self->name || !self->plan || !self->ahead_plan) {
        emlio_client_destroy(&self);
        return NULL;
    }
    self->cfg.name = self->name;
    if (self->cfg.batch_size == 0)
        self->cfg.batch_size = 1;
    if (self->cfg.world == 0)
        self->cfg.world = 1;
    if (self->cfg.streams > S_MAX_STREAMS)
        self->cfg.streams = S_MAX_STREAMS;
    emlio__netpath_limits(&self->limits);
    emlio__netpath_plan(&self->limits, false, 0, &self->rcvbuf);
    while (!self->session) /* never 0: that means "no session" on the wire */
        if (getrandom(&self->session, sizeof(self->session), 0) !=
            sizeof(self->session))
            self->session = emlio__now_ns() ^ (uintptr_t)self;
    emlio_buf_init(&self->scratch);
    snprintf(self->err, sizeof(self->err), "no error");
    return self;
}

static void
s_batch_free(emlio_batch_t *b)
{
    for (size_t i = 0; i < b->n_frames; i++)
        zmq_msg_close(&b->frames[i]);
    emlio_free(b->samples);
    emlio_free(b->frames);
    emlio_free(b->fdata);
    emlio_free(b->flen);
    emlio_free(b->parts);
    emlio_free(b->positions);
    emlio_free(b);
}

/* Takes a batch object from the free list (memory already touched, which
 * matters on VMs where a fresh page fault costs ~16 us) or makes one. */
static emlio_batch_t *
s_batch_get(emlio_client_t *self, size_t n)
{
    emlio_batch_t *b = self->free_list;
    if (b && b->cap >= n) {
        self->free_list = b->next;
    } else {
        b = emlio_calloc(1, sizeof(*b));
        if (!b)
            return NULL;
        b->cap = EMLIO_MAX(n, self->cfg.batch_size);
        size_t nf = self->n_fields ? self->n_fields : 1;
        b->samples = emlio_calloc(b->cap, sizeof(*b->samples));
        b->frames = emlio_calloc(b->cap * nf, sizeof(*b->frames));
        b->fdata = emlio_calloc(b->cap * nf, sizeof(*b->fdata));
        b->flen = emlio_calloc(b->cap * nf, sizeof(*b->flen));
        b->positions = emlio_calloc(b->cap, sizeof(*b->positions));
        b->parts = emlio_calloc(self->n_daemons, sizeof(*b->parts));
        if (!b->samples || !b->frames || !b->positions || !b->parts ||
            !b->fdata || !b->flen) {
            s_batch_free(b);
            return NULL;
        }
    }
    b->owner = self;
    b->n = n;
    b->n_frames = 0;
    b->n_parts = 0;
    b->parts_done = 0;
    b->bytes = 0;
    b->next = NULL;
    return b;
}

/* Returns a batch to the free list, closing its frames (which hands the
 * received buffers back to ZeroMQ). */
static void
s_batch_put(emlio_client_t *self, emlio_batch_t *b)
{
    for (size_t i = 0; i < b->n_frames; i++)
        zmq_msg_close(&b->frames[i]);
    b->n_frames = 0;
    b->next = self->free_list;
    self->free_list = b;
}

/* Drops every batch in flight or waiting except those of generation keep
 * (0: drops all), giving back the credits of their outstanding parts (late
 * replies are recognized by their generation and ignored). */
static void
s_abandon_epoch(emlio_client_t *self, uint32_t keep)
{
    size_t k = 0;
    for (size_t i = 0; i < self->n_slots; i++) {
        emlio_batch_t *b = self->slots[i];
        if (keep && b->gen == keep) {
            self->slots[k++] = b;
            continue;
        }
        for (uint32_t p = 0; p < b->n_parts; p++) {
            s_part_t *part = &b->parts[p];
            if (part->done)
                continue;
            uint32_t *out =
                &self->daemons[part->daemon].sock_outstanding[part->sock];
            if (*out)
                (*out)--;
            if (self->outstanding_parts)
                self->outstanding_parts--;
        }
        s_batch_put(self, b);
    }
    self->n_slots = k;
    self->ready_head = self->ready_tail = NULL;
    self->in_epoch = false;
    self->failed_rc = 0;
}

static void s_disconnect(emlio_client_t *self);

void
emlio_client_destroy(emlio_client_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_client_t *self = *self_p;
    s_abandon_epoch(self, 0);
    while (self->free_list) {
        emlio_batch_t *b = self->free_list;
        self->free_list = b->next;
        s_batch_free(b);
    }
    s_disconnect(self);
    emlio_free(self->slots);
    emlio_free(self->delivered);
    emlio_free(self->items);
    emlio_free(self->skipped);
    emlio_buf_release(&self->scratch);
    emlio_plan_destroy(&self->plan);
    emlio_plan_destroy(&self->ahead_plan);
    emlio_free(self->name);
    emlio_free(self);
    *self_p = NULL;
}

/* Closes every stream and forgets the daemons and the merged inventory, so
 * that a failed connect leaves the client as new (connect may be retried). */
static void
s_disconnect(emlio_client_t *self)
{
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        s_daemon_t *daemon = &self->daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            if (daemon->socks[s]) {
                zmq_socket_monitor(daemon->socks[s], NULL, 0);
                zmq_close(daemon->socks[s]);
            }
            if (daemon->mons[s])
                zmq_close(daemon->mons[s]);
        }
        emlio_free(daemon->endpoint);
        emlio_free(daemon->local_id);
    }
    for (size_t i = 0; i < self->n_shards; i++) {
        emlio_free(self->shards[i].name);
        emlio_free(self->shards[i].holders);
    }
    emlio_free(self->shards);
    for (size_t i = 0; self->fields && i < self->n_fields; i++)
        emlio_free(self->fields[i]);
    emlio_free(self->fields);
    emlio_free(self->daemons);
    emlio_free(self->poll);
    emlio_free(self->poll_daemon);
    emlio_free(self->poll_stream);
    self->shards = NULL;
    self->n_shards = 0;
    self->daemons = NULL;
    self->n_daemons = 0;
    self->poll = NULL;
    self->poll_daemon = NULL;
    self->poll_stream = NULL;
    self->n_poll = 0;
}

/* ---- connecting -------------------------------------------------------- */

/* Opens stream s of daemon d: a DEALER with CURVE when configured, watched
 * by a monitor (created before connecting so the first handshake's outcome
 * is seen), then connected. Sets errno and returns -1 on failure. */
static int
s_open_stream(emlio_client_t *self, s_daemon_t *daemon, uint32_t d, uint32_t s)
{
    void *zctx = emlio__ctx_zmq(self->ctx);
    void *sock = zmq_socket(zctx, ZMQ_DEALER);
    if (!sock)
        return -1;
    daemon->socks[s] = sock;
    daemon->fd[s] = -1;
    daemon->n_streams = EMLIO_MAX(daemon->n_streams, s + 1);
    /* Credits bound what can be queued, so the high-water marks never need
     * to drop or block; heartbeats notice a dead peer; reconnects back off
     * exponentially up to 2 s while a daemon restarts. */
    int zero = 0;
    int hb_ivl = 2000;
    int hb_ttl = 10000;
    int reconnect_max = 2000;
    if (zmq_setsockopt(sock, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_SNDHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_RCVHWM, &zero, sizeof(zero)) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof(hb_ivl)) != 0 ||
        zmq_setsockopt(sock, ZMQ_HEARTBEAT_TIMEOUT, &hb_ttl, sizeof(hb_ttl)) !=
            0 ||
        zmq_setsockopt(sock, ZMQ_RECONNECT_IVL_MAX, &reconnect_max,
                       sizeof(reconnect_max)) != 0)
        return -1;
    /* The receive buffer as large as the host allows (see netpath.h):
     * explicit where that beats autotuning, forced on CONNECTED where we
     * may. */
    if (self->rcvbuf.zmq_value >= 0 &&
        zmq_setsockopt(sock, ZMQ_RCVBUF, &self->rcvbuf.zmq_value,
                       sizeof(int)) != 0)
        return -1;
    if (self->cfg.curve_server_key) {
        if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY,
                           self->cfg.curve_server_key, 40) != 0 ||
            zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY,
                           self->cfg.curve_public_key, 40) != 0 ||
            zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY,
                           self->cfg.curve_secret_key, 40) != 0)
            return -1;
    }
    char ep[96];
    snprintf(ep, sizeof(ep), "inproc://emlio-mon-%" PRIu64 "-%u-%u",
             emlio__unique_id(), d, s);
    if (zmq_socket_monitor(sock, ep,
                           ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED |
                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
        return -1;
    void *mon = zmq_socket(zctx, ZMQ_PAIR);
    if (!mon)
        return -1;
    daemon->mons[s] = mon;
    if (zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0)
        return -1;
    if (zmq_connect(mon, ep) != 0)
        return -1;
    return zmq_connect(sock, daemon->endpoint);
}

static int s_resend_stream(emlio_client_t *self, uint32_t d, uint32_t sock,
                           uint64_t before_ns);

/* Closes the last stream s of a daemon (one that failed to open). */
static void
s_close_stream(s_daemon_t *daemon, uint32_t s)
{
    if (daemon->socks[s]) {
        zmq_socket_monitor(daemon->socks[s], NULL, 0);
        zmq_close(daemon->socks[s]);
    }
    if (daemon->mons[s])
        zmq_close(daemon->mons[s]);
    daemon->socks[s] = daemon->mons[s] = NULL;
    daemon->ready[s] = false;
    daemon->fd[s] = -1;
    if (daemon->n_streams == s + 1)
        daemon->n_streams = s;
}

/* The id a HELLO on stream s carries: generation 0, which no GET uses. */
#define S_HELLO_ID(s) S_ID(0, s, 0)

/* Sends HELLO on stream s of daemon d: with our session, so that the
 * daemon admits our streams as one client; a stream > 0 joins the session
 * stream 0 opened. Returns 0 or -errno (nothing is lost: the caller
 * decides). */
static int
s_send_hello(emlio_client_t *self, uint32_t d, uint32_t s)
{
    if (emlio__wire_encode_hello(&self->scratch, self->name, self->session, s,
                                 S_HELLO_ID(s)) < 0)
        return -ENOMEM;
    while (zmq_send(self->daemons[d].socks[s], self->scratch.data,
                    self->scratch.len, ZMQ_DONTWAIT) < 0)
        if (errno != EINTR)
            return -errno;
    return 0;
}

/* Reads one monitor event if one is waiting: 1 (event and value set), 0
 * (none) or -errno. */
static int
s_read_event(void *mon, uint16_t *event, uint32_t *value)
{
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    if (zmq_msg_recv(&frame, mon, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&frame);
        return err == EAGAIN || err == EINTR ? 0 : -err;
    }
    *event = 0;
    *value = 0;
    if (zmq_msg_size(&frame) >= 6) {
        memcpy(event, zmq_msg_data(&frame), 2);
        memcpy(value, (uint8_t *)zmq_msg_data(&frame) + 2, 4);
    }
    bool more = zmq_msg_more(&frame);
    zmq_msg_close(&frame);
    if (more) { /* the second frame is the peer's address */
        zmq_msg_init(&frame);
        zmq_msg_recv(&frame, mon, 0);
        zmq_msg_close(&frame);
    }
    return 1;
}

/* Acts on the connection events of stream s of daemon d: remembers a lost
 * connection, asks again for what was in flight once it is back, and turns
 * a failed security handshake into an error the caller can act on. */
static int
s_handle_events(emlio_client_t *self, uint32_t d, uint32_t s)
{
    s_daemon_t *daemon = &self->daemons[d];
    uint16_t event = 0;
    uint32_t value = 0;
    int rc;
    while ((rc = s_read_event(daemon->mons[s], &event, &value)) > 0) {
        switch (event) {
        case ZMQ_EVENT_CONNECTED:
            daemon->fd[s] = (int)value; /* for TCP_INFO */
            if (self->rcvbuf.force_value)
                emlio__netpath_force((int)value, false,
                                     self->rcvbuf.force_value);
            break;
        case ZMQ_EVENT_DISCONNECTED:
            daemon->fd[s] = -1;
            daemon->down[s] = true;
            emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
                      "lost connection %u to daemon '%s'; reconnecting", s,
                      daemon->endpoint);
            break;
        case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
            if (daemon->down[s]) {
                daemon->down[s] = false;
                emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                          "reconnected %u to daemon '%s'; asking again for "
                          "what was in flight",
                          s, daemon->endpoint);
                /* A restarted daemon knows nothing of our session: say
                 * HELLO again first (ZeroMQ keeps the order), so the
                 * stream counts as ours, not as another client. */
                if (daemon->max_streams)
                    s_send_hello(self, d, s);
                rc = s_resend_stream(self, d, s, emlio__now_ns());
                if (rc < 0)
                    return rc;
            }
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
            return emlio__seterr(
                self->err, EMLIO_EDENIED,
                "daemon '%s' refused this client (CURVE authentication "
                "failed, status %" PRIu32 "): is our public key in its "
                "authorized keys?",
                daemon->endpoint, value);
        case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if (value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
                return emlio__seterr(
                    self->err, EMLIO_EDENIED,
                    "security handshake with daemon '%s' failed: %s",
                    daemon->endpoint,
                    self->cfg.curve_server_key
                        ? "the daemon does not use CURVE"
                        : "the daemon requires CURVE (give its public key)");
            daemon->failed_handshakes++;
            break;
        case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
            /* The connection closed mid-handshake: a daemon restarting, a
             * proxy whose upstream is down, or (with CURVE) a wrong server
             * key. ZeroMQ reconnects by itself; a persistent failure ends
             * as a timeout whose message mentions these. */
            daemon->failed_handshakes++;
            break;
        default:
            break;
        }
    }
    return rc;
}

/* Receives one whole message into parts (at most max, extra frames are
 * dropped). Returns the number of frames or -errno. */
static int
s_recv_multipart(void *sock, zmq_msg_t *parts, size_t max, int flags)
{
    size_t n = 0;
    int more = 1;
    while (more) {
        zmq_msg_t scratch;
        zmq_msg_t *part = n < max ? &parts[n] : &scratch;
        zmq_msg_init(part);
        if (zmq_msg_recv(part, sock, n == 0 ? flags : 0) < 0) {
            int err = errno;
            zmq_msg_close(part);
            for (size_t i = 0; i < EMLIO_MIN(n, max); i++)
                zmq_msg_close(&parts[i]);
            return -err;
        }
        more = zmq_msg_more(part);
        if (part == &scratch)
            zmq_msg_close(part);
        n++;
    }
    return (int)n;
}

/* A daemon's error code as ours: library codes and -errno pass through,
 * anything else (a hostile or newer peer) becomes EMLIO_EPROTO. */
static int
s_remote_code(int64_t code)
{
    if ((code <= -1000 && code > -2000) || (code < 0 && code > -200))
        return (int)code;
    return EMLIO_EPROTO;
}

/* Failed CURVE handshakes in a row after which connect gives up. */
#define S_CURVE_FAILS 3

/* HELLO -> WELCOME with one daemon; fills its inventory. */
static int
s_handshake(emlio_client_t *self, s_daemon_t *daemon, emlio_wire_msg_t *msg,
            zmq_msg_t *frame, uint64_t deadline_ns)
{
    void *sock = daemon->socks[0];
    uint64_t t0 = emlio__now_ns();
    int sent = s_send_hello(self, (uint32_t)(daemon - self->daemons), 0);
    if (sent < 0)
        return emlio__seterr(self->err, sent, "cannot send to '%s': %s",
                             daemon->endpoint, zmq_strerror(-sent));
    for (;;) {
        uint64_t now = emlio__now_ns();
        int left =
            now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000);
        zmq_pollitem_t items[2] = { { sock, 0, ZMQ_POLLIN, 0 },
                                    { daemon->mons[0], 0, ZMQ_POLLIN, 0 } };
        int ready = 0;
        if (left > 0)
            while ((ready = zmq_poll(items, 2, left)) < 0 && errno == EINTR)
                ;
        if (ready > 0 && (items[1].revents & ZMQ_POLLIN)) {
            int rc =
                s_handle_events(self, (uint32_t)(daemon - self->daemons), 0);
            if (rc < 0)
                return rc;
            /* With CURVE, a daemon that closes every handshake (about one
             * per 100 ms reconnect) almost surely cannot decrypt ours: a
             * wrong server key. Say so now, not after the whole timeout. */
            if (self->cfg.curve_server_key &&
                daemon->failed_handshakes >= S_CURVE_FAILS)
                return emlio__seterr(
                    self->err, EMLIO_EDENIED,
                    "security handshake with daemon '%s' failed %" PRIu64
                    " times in %.1f s: wrong server key, or the daemon "
                    "does not use CURVE?",
                    daemon->endpoint, daemon->failed_handshakes,
                    (double)(emlio__now_ns() - t0) / 1e9);
            continue;
        }
        if (ready <= 0 && daemon->failed_handshakes)
            return emlio__seterr(
                self->err, EMLIO_ETIMEDOUT,
                "no answer from daemon '%s' within %d ms: %" PRIu64
                " handshakes failed (%s)",
                daemon->endpoint, self->cfg.connect_timeout_ms,
                daemon->failed_handshakes,
                self->cfg.curve_server_key
                    ? "wrong server key, or the daemon does not use CURVE?"
                    : "does the daemon require CURVE?");
        if (ready <= 0)
            return emlio__seterr(
                self->err, EMLIO_ETIMEDOUT,
                "no answer from daemon '%s' within %d ms: is emliod "
                "running there?",
                daemon->endpoint, self->cfg.connect_timeout_ms);
        int n = s_recv_multipart(sock, frame, 1, ZMQ_DONTWAIT);
        if (n == -EAGAIN)
            continue;
        if (n < 0)
            return emlio__seterr(self->err, n, "cannot receive from '%s': %s",
                                 daemon->endpoint, zmq_strerror(-n));
        char why[EMLIO_ERRMSG_LEN];
        int rc = emlio__wire_decode(msg, zmq_msg_data(frame),
                                    zmq_msg_size(frame), 0, why);
        if (rc < 0) {
            zmq_msg_close(frame);
            return emlio__seterr(self->err, rc, "daemon '%s' sent a %s",
                                 daemon->endpoint, why);
        }
        if (msg->type == EMLIO_MSG_ERROR) {
            int code = s_remote_code(msg->code);
            emlio__seterr(self->err, code, "daemon '%s' refused us: %.*s",
                          daemon->endpoint, (int)msg->text_len, msg->text);
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            return code;
        }
        if (msg->type != EMLIO_MSG_WELCOME) {
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            continue; /* a stale reply from an earlier session */
        }
        if (msg->version < EMLIO_WIRE_VERSION_MIN ||
            msg->version > EMLIO_WIRE_VERSION) {
            emlio__wire_msg_release(msg);
            zmq_msg_close(frame);
            return emlio__seterr(self->err, EMLIO_EVERSION,
                                 "daemon '%s' speaks protocol %" PRIu64
                                 ", we speak %d to %d",
                                 daemon->endpoint, msg->version,
                                 EMLIO_WIRE_VERSION_MIN, EMLIO_WIRE_VERSION);
        }
        self->min_latency_ns = emlio__now_ns() - t0;
        return 0;
    }
}

typedef struct s_entry {
    const char *name;
    size_t name_len;
    uint64_t records;
    uint64_t bytes;
    uint32_t daemon;
    uint32_t local;
} s_entry_t;

static int
s_cmp_entry(const void *pa, const void *pb)
{
    const s_entry_t *a = pa;
    const s_entry_t *b = pb;
    size_t n = EMLIO_MIN(a->name_len, b->name_len);
    int c = memcmp(a->name, b->name, n);
    if (c)
        return c;
    if (a->name_len != b->name_len)
        return a->name_len < b->name_len ? -1 : 1;
    return a->daemon < b->daemon ? -1 : a->daemon > b->daemon;
}

/* Keeps the field names of the first daemon's WELCOME; every other daemon
 * must serve the same fields, or samples would differ by daemon. */
static int
s_take_fields(emlio_client_t *self, const s_daemon_t *daemon,
              const emlio_wire_msg_t *msg, bool first)
{
    if (first) {
        self->n_fields = msg->n_fields ? msg->n_fields : 1;
        if (!msg->n_fields)
            return 0;
        self->fields = emlio_calloc(msg->n_fields, sizeof(*self->fields));
        if (!self->fields)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        for (size_t i = 0; i < msg->n_fields; i++) {
            self->fields[i] = emlio_malloc(msg->fields[i].len + 1);
            if (!self->fields[i])
                return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
            memcpy(self->fields[i], msg->fields[i].s, msg->fields[i].len);
            self->fields[i][msg->fields[i].len] = '\0';
        }
        return 0;
    }
    bool same = (msg->n_fields ? msg->n_fields : 1) == self->n_fields;
    for (size_t i = 0; same && i < msg->n_fields; i++)
        same = self->fields && strlen(self->fields[i]) == msg->fields[i].len &&
               !memcmp(self->fields[i], msg->fields[i].s, msg->fields[i].len);
    if (!same)
        return emlio__seterr(self->err, EMLIO_EMISMATCH,
                             "daemon '%s' serves other fields than '%s'",
                             daemon->endpoint, self->daemons[0].endpoint);
    return 0;
}

/* Builds the global shard table: the union of inventories by name. */
static int
s_merge_inventories(emlio_client_t *self, s_entry_t *entries, size_t n)
{
    qsort(entries, n, sizeof(*entries), s_cmp_entry);
    self->shards = emlio_calloc(n, sizeof(*self->shards));
    if (!self->shards)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        self->daemons[d].local_id = emlio_calloc(n, sizeof(uint32_t));
        if (!self->daemons[d].local_id)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        memset(self->daemons[d].local_id, 0xff, n * sizeof(uint32_t));
    }
    for (size_t i = 0; i < n;) {
        size_t j = i + 1;
        while (j < n && entries[j].name_len == entries[i].name_len &&
               !memcmp(entries[j].name, entries[i].name, entries[i].name_len))
            j++;
        s_shard_t *shard = &self->shards[self->n_shards];
        shard->name = emlio_malloc(entries[i].name_len + 1);
        shard->holders = emlio_calloc(j - i, sizeof(uint32_t));
        if (!shard->name || !shard->holders) {
            emlio_free(shard->name);
            emlio_free(shard->holders);
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        }
        memcpy(shard->name, entries[i].name, entries[i].name_len);
        shard->name[entries[i].name_len] = 0;
        shard->records = entries[i].records;
        shard->bytes = entries[i].bytes;
        self->n_shards++;
        for (size_t k = i; k < j; k++) {
            if (entries[k].records != shard->records)
                return emlio__seterr(self->err, EMLIO_EINVAL,
                                     "shard '%s' has %" PRIu64
                                     " records on '%s' but %" PRIu64 " on '%s'",
                                     shard->name, shard->records,
                                     self->daemons[entries[i].daemon].endpoint,
                                     entries[k].records,
                                     self->daemons[entries[k].daemon].endpoint);
            shard->holders[shard->n_holders++] = entries[k].daemon;
            self->daemons[entries[k].daemon].local_id[self->n_shards - 1] =
                entries[k].local;
        }
        i = j;
    }
    return 0;
}

/* Rebuilds the poll set after streams were added: one item per stream, in
 * daemon order, then one per monitor. */
static int
s_rebuild_poll(emlio_client_t *self)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        n += self->daemons[d].n_streams;
    zmq_pollitem_t *poll = emlio_calloc(2 * n, sizeof(*poll));
    uint32_t *pd = emlio_calloc(n, sizeof(*pd));
    uint32_t *ps = emlio_calloc(n, sizeof(*ps));
    if (!poll || !pd || !ps) {
        emlio_free(poll);
        emlio_free(pd);
        emlio_free(ps);
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    size_t i = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        for (uint32_t s = 0; s < self->daemons[d].n_streams; s++, i++) {
            poll[i] =
                (zmq_pollitem_t){ self->daemons[d].socks[s], 0, ZMQ_POLLIN, 0 };
            poll[n + i] =
                (zmq_pollitem_t){ self->daemons[d].mons[s], 0, ZMQ_POLLIN, 0 };
            pd[i] = d;
            ps[i] = s;
        }
    emlio_free(self->poll);
    emlio_free(self->poll_daemon);
    emlio_free(self->poll_stream);
    self->poll = poll;
    self->poll_daemon = pd;
    self->poll_stream = ps;
    self->n_poll = n;
    return 0;
}

/* Opens streams on every daemon until each has `want` (within its
 * session limit). A new stream says HELLO to join our session and carries
 * GETs once the daemon answered (s_receive_one marks it ready); a daemon
 * without sessions takes GETs at once. */
static int
s_add_streams(emlio_client_t *self, uint32_t want)
{
    bool added = false;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        s_daemon_t *daemon = &self->daemons[d];
        uint32_t limit =
            daemon->max_streams ? daemon->max_streams : S_MAX_STREAMS;
        while (daemon->n_streams < EMLIO_MIN(want, limit)) {
            uint32_t s = daemon->n_streams;
            int rc = s_open_stream(self, daemon, d, s) != 0 ? -errno : 0;
            if (rc == 0 && daemon->max_streams)
                rc = s_send_hello(self, d, s);
            if (rc < 0) {
                /* Out of descriptors, say: the streams we have carry on;
                 * this daemon gets no more. */
                s_close_stream(daemon, s);
                daemon->max_streams = EMLIO_MAX(s, 1);
                emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
                          "cannot open stream %u to '%s': %s; staying at %u", s,
                          daemon->endpoint, zmq_strerror(-rc), s);
                break;
            }
            if (!daemon->max_streams)
                daemon->ready[s] = true;
            added = true;
        }
    }
    return added || !self->poll ? s_rebuild_poll(self) : 0;
}

static void s_sample_paths(emlio_client_t *self);

/* The per-stream window the path allows: the smaller of the daemons' send
 * buffers and the receive buffer this host autotunes to; and the streams
 * to start with. */
static void
s_init_tuning(emlio_client_t *self)
{
    uint64_t rcv = self->rcvbuf.effective;
    uint64_t snd = UINT64_MAX;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        snd = EMLIO_MIN(snd,
                        self->daemons[d].sndbuf
                            ? self->daemons[d].sndbuf
                            : EMLIO_MAX(self->limits.tcp_wmem_max, 4u << 20));
    self->window_bytes = EMLIO_MIN(snd, rcv ? rcv : snd);
    uint32_t start =
        self->cfg.streams ? self->cfg.streams : S_AUTO_START_STREAMS;
    s_sample_paths(self); /* stream 0's RTT, from the HELLO's ACK */
    uint64_t rtt = self->rtt_ns ? self->rtt_ns : self->min_latency_ns;
    if (!self->cfg.streams && rtt && self->window_bytes) {
        /* 85%: what one stream really carries of window / RTT here. */
        double per_stream =
            0.85 * (double)self->window_bytes * 1e9 / (double)rtt;
        double need = S_START_RATE / per_stream;
        if (need > start)
            start = (uint32_t)EMLIO_MIN(need + 0.999, S_MAX_START_STREAMS);
        if (start > S_AUTO_START_STREAMS)
            emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
                      "RTT %.1f ms with a %" PRIu64 " KiB window: starting "
                      "with %u streams per daemon",
                      (double)rtt / 1e6, self->window_bytes >> 10, start);
    }
    emlio__tuner_init(&self->tuner, start, S_MAX_STREAMS,
                      self->cfg.streams != 0, emlio__now_ns());
}

static int s_connect(emlio_client_t *self, const char *endpoints);

int
emlio_client_connect(emlio_client_t *self, const char *endpoints)
{
    assert(self && endpoints);
    if (self->n_daemons)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "client already connected");
    int rc = s_connect(self, endpoints);
    if (rc < 0)
        s_disconnect(self); /* as new again: connect may be retried */
    return rc;
}

static int
s_connect(emlio_client_t *self, const char *endpoints)
{
    const emlio_client_config_t *keycfg = &self->cfg;
    int keys = !!keycfg->curve_server_key + !!keycfg->curve_public_key +
               !!keycfg->curve_secret_key;
    if (keys != 0 && keys != 3)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "curve needs the server key and our key pair");
    if (keys && (strlen(keycfg->curve_server_key) != 40 ||
                 strlen(keycfg->curve_public_key) != 40 ||
                 strlen(keycfg->curve_secret_key) != 40))
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "curve keys must be 40 Z85 characters");
    /* Count and split the endpoint list. */
    size_t count = 1;
    for (const char *p = endpoints; *p; p++)
        count += *p == ',';
    if (count > S_MAX_DAEMONS)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "too many daemons (at most %d)", S_MAX_DAEMONS);
    self->daemons = emlio_calloc(count, sizeof(*self->daemons));
    if (!self->daemons)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    const char *p = endpoints;
    for (size_t i = 0; i < count; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == 0)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "empty endpoint in '%s'", endpoints);
        s_daemon_t *daemon = &self->daemons[self->n_daemons++];
        daemon->endpoint = emlio_malloc(len + 1);
        if (!daemon->endpoint)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        memcpy(daemon->endpoint, p, len);
        daemon->endpoint[len] = 0;
        /* Stream 0 says HELLO; the others join once we know the daemon
         * admits them into our session (s_add_streams). */
        if (s_open_stream(self, daemon, self->n_daemons - 1, 0) != 0)
            return emlio__seterr(self->err, -errno,
                                 "cannot connect to '%s': %s", daemon->endpoint,
                                 zmq_strerror(errno));
        daemon->ready[0] = true;
        p = end ? end + 1 : p + len;
    }
    /* Handshake with every daemon; the inventories' strings are borrowed
     * from the WELCOME frames, kept until the merge is done. */
    zmq_msg_t *frames = emlio_calloc(self->n_daemons, sizeof(*frames));
    emlio_wire_msg_t *msgs = emlio_calloc(self->n_daemons, sizeof(*msgs));
    s_entry_t *entries = NULL;
    uint32_t got = 0;
    int rc = 0;
    if (!frames || !msgs) {
        rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        goto out;
    }
    uint64_t deadline =
        emlio__now_ns() +
        (uint64_t)EMLIO_MAX(self->cfg.connect_timeout_ms, 1) * 1000000ull;
    size_t n_entries = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        rc = s_handshake(self, &self->daemons[d], &msgs[d], &frames[d],
                         deadline);
        if (rc < 0)
            goto out;
        got++;
        s_daemon_t *daemon = &self->daemons[d];
        snprintf(
            daemon->dataset, sizeof(daemon->dataset), "%.*s",
            (int)EMLIO_MIN(msgs[d].dataset_len, sizeof(daemon->dataset) - 1),
            msgs[d].dataset);
        daemon->max_batch = msgs[d].max_batch ? msgs[d].max_batch : 4096;
        daemon->max_credit = msgs[d].max_credit ? msgs[d].max_credit : 16;
        daemon->max_streams =
            (uint32_t)EMLIO_MIN(msgs[d].max_streams, S_MAX_STREAMS);
        daemon->sndbuf = msgs[d].sndbuf;
        n_entries += msgs[d].n_shards;
        rc = s_take_fields(self, daemon, &msgs[d], d == 0);
        if (rc < 0)
            goto out;
    }
    entries = emlio_calloc(n_entries, sizeof(*entries));
    if (!entries) {
        rc = emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        goto out;
    }
    size_t k = 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        for (size_t i = 0; i < msgs[d].n_shards; i++) {
            const emlio_wire_shard_t *s = &msgs[d].shards[i];
            entries[k++] = (s_entry_t){ s->name,  s->name_len, s->records,
                                        s->bytes, d,           (uint32_t)i };
        }
        for (const char *c = self->daemons[d].dataset; *c; c++)
            h = (h ^ (uint8_t)*c) * 0x100000001b3ull;
    }
    snprintf(self->dataset, sizeof(self->dataset), "%016" PRIx64, h);
    rc = s_merge_inventories(self, entries, n_entries);
    if (rc < 0)
        goto out;
    s_init_tuning(self);
    rc = s_add_streams(self, self->tuner.min_streams);
    if (rc < 0)
        goto out;
    rc = (int)self->n_daemons;
out:
    for (uint32_t d = 0; d < got; d++) {
        emlio__wire_msg_release(&msgs[d]);
        zmq_msg_close(&frames[d]);
    }
    emlio_free(entries);
    emlio_free(frames);
    emlio_free(msgs);
    return rc;
}

size_t
emlio_client_field_count(const emlio_client_t *self)
{
    assert(self);
    return self->n_fields ? self->n_fields : 1;
}

const char *
emlio_client_field_name(const emlio_client_t *self, size_t i)
{
    assert(self);
    if (i >= emlio_client_field_count(self))
        return NULL;
    return self->fields ? self->fields[i] : "";
}

int
emlio_client_field_index(const emlio_client_t *self, const char *name)
{
    assert(self && name);
    for (size_t i = 0; self->fields && i < self->n_fields; i++)
        if (strcmp(self->fields[i], name) == 0)
            return (int)i;
    return EMLIO_ENOTFOUND;
}

int
emlio_batch_field(const emlio_batch_t *b, size_t i, size_t field,
                  const uint8_t **data, size_t *len)
{
    assert(b && data && len);
    size_t nf = b->owner->n_fields ? b->owner->n_fields : 1;
    if (i >= b->n || field >= nf)
        return EMLIO_ENOTFOUND;
    *data = b->fdata[i * nf + field];
    *len = b->flen[i * nf + field];
    return 0;
}

size_t
emlio_client_shard_count(const emlio_client_t *self)
{
    return self->n_shards;
}

const char *
emlio_client_shard_name(const emlio_client_t *self, size_t i)
{
    return i < self->n_shards ? self->shards[i].name : NULL;
}

uint64_t
emlio_client_shard_records(const emlio_client_t *self, size_t i)
{
    return i < self->n_shards ? self->shards[i].records : 0;
}

const uint32_t *
emlio_client_shard_holders(const emlio_client_t *self, size_t i, size_t *n)
{
    *n = i < self->n_shards ? self->shards[i].n_holders : 0;
    return i < self->n_shards ? self->shards[i].holders : NULL;
}

size_t
emlio_client_daemon_count(const emlio_client_t *self)
{
    return self->n_daemons;
}

const char *
emlio_client_daemon_endpoint(const emlio_client_t *self, size_t d)
{
    return d < self->n_daemons ? self->daemons[d].endpoint : NULL;
}

/* ---- epochs ------------------------------------------------------------ */

static bool
s_is_delivered(const emlio_client_t *self, size_t i)
{
    return self->delivered[i / 8] & (1u << (i % 8));
}

/* Sizes the window bounds from the daemons' credits and a memory cap. */
static void
s_init_window(emlio_client_t *self)
{
    /* Every batch may need a part from any daemon, so the daemon with the
     * fewest credits bounds the window. */
    uint64_t credits = UINT64_MAX;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        uint32_t ready = 0;
        for (uint32_t k = 0; k < self->daemons[d].n_streams; k++)
            ready += self->daemons[d].ready[k];
        credits = EMLIO_MIN(credits, self->daemons[d].max_credit * ready);
    }
    uint64_t records = 0;
    uint64_t bytes = 0;
    for (size_t i = 0; i < self->n_shards; i++) {
        records += self->shards[i].records;
        bytes += self->shards[i].bytes;
    }
    uint64_t batch_bytes = records ? bytes / records * self->cfg.batch_size : 1;
    self->batch_bytes = batch_bytes;
    uint64_t by_memory = S_MAX_INFLIGHT_BYTES / EMLIO_MAX(batch_bytes, 1);
    uint64_t max = EMLIO_MIN(credits, EMLIO_MAX(by_memory, 2));
    self->window_max = (uint32_t)EMLIO_MIN(EMLIO_MAX(max, 1), 65536);
    if (self->cfg.inflight) {
        self->window = EMLIO_MIN(self->cfg.inflight, self->window_max);
    } else {
        /* Start small and grow while the consumer starves (see s_adapt). */
        uint32_t start =
            EMLIO_MAX(4, 2 * self->tuner.min_streams * self->n_daemons);
        self->window = EMLIO_MIN(start, self->window_max);
    }
}

/* The auto-sized window keeps what it grew to, within the bounds of now
 * (streams, and so credits, may have been added). */
static void
s_rebound_window(emlio_client_t *self)
{
    uint32_t window = self->window;
    s_init_window(self);
    self->window = EMLIO_MIN(EMLIO_MAX(window, self->window), self->window_max);
}

static int s_compact(emlio_client_t *self, emlio_batch_t *b);
static void s_queue_ready(emlio_client_t *self, emlio_batch_t *b);

/* Never generation 0: id 0 is what a daemon uses for errors it cannot tie
 * to a request, and HELLO ids use generation 0. */
static uint32_t
s_next_gen(uint32_t gen)
{
    gen = (gen + 1) & 0xffffff;
    return gen ? gen : 1;
}

/* Plans `epoch` for this rank into plan. Returns its batch count or < 0. */
static int
s_plan_build(emlio_client_t *self, emlio_plan_t *plan, uint64_t epoch)
{
    emlio_plan_shard_t *in = emlio_calloc(self->n_shards, sizeof(*in));
    if (!in)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < self->n_shards; i++)
        in[i] =
            (emlio_plan_shard_t){ self->shards[i].name, self->shards[i].records,
                                  self->shards[i].bytes,
                                  self->shards[i].holders,
                                  self->shards[i].n_holders };
    emlio_plan_params_t params;
    emlio_plan_params_init(&params);
    params.world = self->cfg.world;
    params.rank = self->cfg.rank;
    params.batch_size = self->cfg.batch_size;
    params.epoch = epoch;
    params.seed = self->cfg.seed;
    params.shuffle = self->cfg.shuffle;
    params.window_shards = self->cfg.window_shards;
    params.drop_last = self->cfg.drop_last;
    int rc = emlio_plan_build(plan, in, self->n_shards, &params);
    emlio_free(in);
    if (rc < 0)
        return emlio__seterr(self->err, rc, "cannot plan epoch %" PRIu64 ": %s",
                             epoch, emlio_plan_errmsg(plan));
    size_t n = emlio_plan_batch_count(plan);
    if (n > UINT32_MAX)
        return emlio__seterr(self->err, EMLIO_ELIMIT, "too many batches");
    return (int)n;
}

/* begin_epoch(epoch) when that epoch was requested ahead: it becomes the
 * current one, with the batches already in flight or arrived. */
static void
s_take_ahead(emlio_client_t *self)
{
    s_abandon_epoch(self, self->ahead_gen);
    emlio_plan_t *plan = self->plan;
    self->plan = self->ahead_plan;
    self->ahead_plan = plan;
    self->gen = self->ahead_gen;
    self->n_batches = self->ahead_n;
    self->next_to_send = self->ahead_next;
    self->ahead = false;
}

int
emlio_client_begin_epoch(emlio_client_t *self, uint64_t epoch)
{
    assert(self);
    if (!self->n_shards)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "connect before starting an epoch");
    for (uint32_t d = 0; d < self->n_daemons; d++)
        if (self->cfg.batch_size > self->daemons[d].max_batch)
            return emlio__seterr(self->err, EMLIO_ELIMIT,
                                 "batch size %" PRIu32 " exceeds daemon '%s' "
                                 "limit of %" PRIu64,
                                 self->cfg.batch_size,
                                 self->daemons[d].endpoint,
                                 self->daemons[d].max_batch);
    bool took_ahead = self->ahead && self->ahead_epoch == epoch;
    if (took_ahead) {
        s_take_ahead(self);
    } else {
        uint32_t last = self->ahead ? self->ahead_gen : self->gen;
        s_abandon_epoch(self, 0);
        self->ahead = false;
        int rc = s_plan_build(self, self->plan, epoch);
        if (rc < 0)
            return rc;
        self->n_batches = (size_t)rc;
        self->next_to_send = 0;
        self->gen = s_next_gen(last);
    }
    size_t n = self->n_batches;
    uint8_t *bits = emlio_realloc(self->delivered, n / 8 + 1);
    if (!bits)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    memset(bits, 0, n / 8 + 1);
    self->delivered = bits;
    if (!self->items) {
        self->items = emlio_calloc(self->cfg.batch_size, sizeof(*self->items));
        if (!self->items)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    if (!self->window) {
        s_init_window(self);
    } else if (!self->cfg.inflight) {
        s_rebound_window(self);
    }
    self->epoch = epoch;
    self->next_deliver = 0;
    self->n_delivered = 0;
    self->in_epoch = true;
    self->epoch_start_ns = emlio__now_ns();
    self->last_delivery_ns = self->epoch_start_ns;
    self->first_batch_ns = 0;
    self->total_wait_ns += self->wait_ns;
    self->wait_ns = 0;
    self->stat_samples = 0;
    self->stat_bytes = 0;
    self->n_skipped = 0;
    self->adapt_ns = self->epoch_start_ns;
    self->adapt_batches = 0;
    if (took_ahead) {
        /* Batches of this epoch that arrived while the last one ran are
         * complete now (in_order finds them in the slots). */
        for (size_t i = 0; i < self->n_slots; i++) {
            emlio_batch_t *b = self->slots[i];
            if (b->parts_done != b->n_parts)
                continue;
            int rc = s_compact(self, b);
            if (rc < 0)
                return rc;
            if (!self->cfg.in_order)
                s_queue_ready(self, b);
        }
    }
    return (int)n;
}

/* Sends (or sends again) the GET of part p of batch b on stream sock, or on
 * the daemon's least-loaded stream when sock is UINT32_MAX. */
static int
s_send_part(emlio_client_t *self, emlio_batch_t *b, uint32_t p, uint32_t sock)
{
    s_part_t *part = &b->parts[p];
    s_daemon_t *daemon = &self->daemons[part->daemon];
    for (uint32_t i = 0; i < part->n; i++) {
        const emlio_sample_t *s = &b->samples[part->positions[i]];
        self->items[i].shard = daemon->local_id[s->shard];
        self->items[i].record = s->record;
    }
    if (emlio__wire_encode_get(&self->scratch, S_ID(b->gen, b->index, p),
                               daemon->dataset, self->items, part->n) < 0)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    if (sock == UINT32_MAX) {
        /* The least-loaded stream that may carry GETs: replies come back
         * out of order, so round robin alone could push one connection
         * past its credits. */
        sock = 0;
        for (uint32_t k = 1; k < daemon->n_streams; k++)
            if (daemon->ready[k] &&
                daemon->sock_outstanding[k] < daemon->sock_outstanding[sock])
                sock = k;
        daemon->sock_outstanding[sock]++;
        part->sock = sock;
    }
    while (zmq_send(daemon->socks[sock], self->scratch.data, self->scratch.len,
                    0) < 0) {
        if (errno != EINTR)
            return emlio__seterr(self->err, -errno,
                                 "cannot send to daemon '%s': %s",
                                 daemon->endpoint, zmq_strerror(errno));
    }
    part->sent_ns = emlio__now_ns();
    return 0;
}

/* A stream of daemon d reconnected (after a daemon restart, say): whatever
 * it had in flight died with the old connection, so ask again. GET is a pure
 * read and replies are matched by id, so a late duplicate is harmless. */
static int
s_resend_stream(emlio_client_t *self, uint32_t d, uint32_t sock,
                uint64_t before_ns)
{
    for (size_t i = 0; i < self->n_slots; i++) {
        emlio_batch_t *b = self->slots[i];
        for (uint32_t p = 0; p < b->n_parts; p++) {
            s_part_t *part = &b->parts[p];
            if (part->done || part->daemon != d || part->sock != sock ||
                part->sent_ns >= before_ns)
                continue;
            int rc = s_send_part(self, b, p, sock);
            if (rc < 0)
                return rc;
            self->retries++;
        }
    }
    return 0;
}

/* Sends the GETs of batch `index` of plan (epoch, request generation gen),
 * one per daemon that holds its samples. */
static int
s_request_batch(emlio_client_t *self, const emlio_plan_t *from, uint64_t epoch,
                uint32_t gen, size_t index)
{
    size_t n;
    const emlio_plan_sample_t *plan = emlio_plan_batch(from, index, &n);
    emlio_batch_t *b = s_batch_get(self, n);
    if (!b)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    b->epoch = epoch;
    b->index = index;
    b->gen = gen;
    /* Group the samples by daemon, keeping plan order within each part. */
    uint32_t counts[S_MAX_DAEMONS] = { 0 };
    int part_of[S_MAX_DAEMONS];
    for (uint32_t d = 0; d < self->n_daemons; d++)
        part_of[d] = -1;
    for (size_t i = 0; i < n; i++) {
        uint32_t d = plan[i].daemon;
        if (part_of[d] < 0) {
            part_of[d] = (int)b->n_parts;
            b->parts[b->n_parts++] = (s_part_t){ .daemon = d };
        }
        counts[part_of[d]]++;
        b->samples[i] =
            (emlio_sample_t){ NULL,          SIZE_MAX,       -1,
                              plan[i].shard, plan[i].record, plan[i].pad };
        for (size_t f = 0; f < self->n_fields; f++) {
            b->fdata[i * self->n_fields + f] = NULL; /* until it arrives */
            b->flen[i * self->n_fields + f] = 0;
        }
    }
    uint32_t offset = 0;
    for (uint32_t p = 0; p < b->n_parts; p++) {
        b->parts[p].positions = b->positions + offset;
        offset += counts[p];
    }
    for (size_t i = 0; i < n; i++) {
        s_part_t *part = &b->parts[part_of[plan[i].daemon]];
        part->positions[part->n++] = (uint32_t)i;
    }
    self->slots[self->n_slots++] = b;
    for (uint32_t p = 0; p < b->n_parts; p++) {
        int rc = s_send_part(self, b, p, UINT32_MAX);
        if (rc < 0)
            return rc;
        self->outstanding_parts++;
    }
    return 0;
}

/* With every batch of the current epoch requested and room in the window,
 * requests the next epoch's first batches (cfg.end_epoch permitting), so
 * the pipe stays full across the epoch boundary. A plan that fails here
 * only means no overlap: begin_epoch will report the failure. */
static int
s_fill_ahead(emlio_client_t *self)
{
    uint64_t next = self->epoch + 1;
    if (!self->in_epoch || next == 0 ||
        (self->cfg.end_epoch && next >= self->cfg.end_epoch))
        return 0;
    if (!self->ahead) {
        int n = s_plan_build(self, self->ahead_plan, next);
        if (n < 0) {
            snprintf(self->err, sizeof(self->err), "no error");
            self->cfg.end_epoch = next; /* do not try again */
            return 0;
        }
        self->ahead = true;
        self->ahead_epoch = next;
        self->ahead_gen = s_next_gen(self->gen);
        self->ahead_n = (size_t)n;
        self->ahead_next = 0;
    }
    while (self->n_slots < self->window && self->ahead_next < self->ahead_n) {
        int rc = s_request_batch(self, self->ahead_plan, self->ahead_epoch,
                                 self->ahead_gen, self->ahead_next++);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Keeps the window full: requests plan batches until `window` are out. */
static int
s_fill_window(emlio_client_t *self)
{
    if (self->cap_slots < self->window_max) {
        emlio_batch_t **slots =
            emlio_reallocarray(self->slots, self->window_max, sizeof(*slots));
        if (!slots)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        self->slots = slots;
        self->cap_slots = self->window_max;
    }
    while (self->n_slots < self->window &&
           self->next_to_send < self->n_batches) {
        size_t i = self->next_to_send++;
        if (s_is_delivered(self, i))
            continue; /* resumed from saved state */
        int rc = s_request_batch(self, self->plan, self->epoch, self->gen, i);
        if (rc < 0)
            return rc;
    }
    if (self->n_slots < self->window && self->next_to_send >= self->n_batches)
        return s_fill_ahead(self);
    return 0;
}

static emlio_batch_t *
s_find_slot(emlio_client_t *self, uint32_t gen, uint64_t index, size_t *pos)
{
    for (size_t i = 0; i < self->n_slots; i++)
        if (self->slots[i]->index == index && self->slots[i]->gen == gen) {
            if (pos)
                *pos = i;
            return self->slots[i];
        }
    return NULL;
}

/* Removes holes left by records the daemon skipped as corrupt, and
 * remembers them so the caller can report every one. */
static int
s_compact(emlio_client_t *self, emlio_batch_t *b)
{
    size_t k = 0;
    for (size_t i = 0; i < b->n; i++) {
        if (b->samples[i].len != SIZE_MAX) {
            b->samples[k++] = b->samples[i];
            continue;
        }
        if (self->n_skipped == self->cap_skipped) {
            size_t cap = self->cap_skipped ? self->cap_skipped * 2 : 16;
            emlio_sample_t *v =
                emlio_reallocarray(self->skipped, cap, sizeof(*v));
            if (!v)
                return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
            self->skipped = v;
            self->cap_skipped = cap;
        }
        emlio_sample_t *s = &self->skipped[self->n_skipped++];
        *s = b->samples[i];
        s->data = NULL;
        s->len = 0;
    }
    b->n = k;
    return 0;
}

/* Appends b to the out-of-order delivery queue. */
static void
s_queue_ready(emlio_client_t *self, emlio_batch_t *b)
{
    b->next = NULL;
    if (self->ready_tail)
        self->ready_tail->next = b;
    else
        self->ready_head = b;
    self->ready_tail = b;
}

/* All parts of b arrived. A batch of the epoch requested ahead waits in
 * its slot until begin_epoch takes that epoch (its holes are compacted
 * then, when the skipped list belongs to that epoch). */
static int
s_complete(emlio_client_t *self, emlio_batch_t *b)
{
    if (b->gen != self->gen)
        return 0;
    int rc = s_compact(self, b);
    if (rc < 0)
        return rc;
    if (!self->cfg.in_order)
        s_queue_ready(self, b);
    return 0;
}

/* The daemon's answer to a stream's HELLO (ids of generation 0): WELCOME
 * lets the stream carry GETs; ERROR (the session has all the streams the
 * daemon allows) caps the streams of that daemon where they are. */
static int
s_joined(emlio_client_t *self, uint32_t d, const emlio_wire_msg_t *msg)
{
    s_daemon_t *daemon = &self->daemons[d];
    uint64_t s = S_ID_BATCH(msg->id);
    if (s >= daemon->n_streams)
        return 1; /* not ours: ignore */
    if (msg->type == EMLIO_MSG_WELCOME) {
        if (!daemon->ready[s]) {
            daemon->ready[s] = true;
            if (self->n_batches && !self->cfg.inflight)
                s_rebound_window(self); /* more streams, more credits */
        }
        return 1;
    }
    emlio_log(self->ctx, EMLIO_LOG_WARN, "client",
              "daemon '%s' refused stream %" PRIu64
              ": %.*s; staying at %" PRIu64 " streams",
              daemon->endpoint, s, (int)msg->text_len, msg->text, s);
    daemon->max_streams = (uint32_t)EMLIO_MAX(s, 1);
    return 1;
}

/* Receives and files one reply from daemon d's socket. Returns 1 when a
 * message was handled, 0 when none was waiting, < 0 on failure. */
static int
s_receive_one(emlio_client_t *self, uint32_t d, uint32_t stream)
{
    s_daemon_t *daemon = &self->daemons[d];
    void *sock = daemon->socks[stream];
    zmq_msg_t header;
    zmq_msg_init(&header);
    if (zmq_msg_recv(&header, sock, ZMQ_DONTWAIT) < 0) {
        int err = errno;
        zmq_msg_close(&header);
        if (err == EAGAIN || err == EINTR)
            return 0;
        return emlio__seterr(self->err, -err, "cannot receive from '%s': %s",
                             daemon->endpoint, zmq_strerror(err));
    }
    emlio_wire_msg_t msg;
    char why[EMLIO_ERRMSG_LEN];
    int rc =
        emlio__wire_decode(&msg, zmq_msg_data(&header), zmq_msg_size(&header),
                           self->cfg.batch_size, why);
    if (rc < 0) {
        emlio__zmq_drain(sock);
        zmq_msg_close(&header);
        return emlio__seterr(self->err, EMLIO_EPROTO, "daemon '%s' sent a %s",
                             daemon->endpoint, why);
    }
    rc = 1;
    emlio_batch_t *b = NULL;
    s_part_t *part = NULL;
    size_t frames0 = 0;
    uint64_t bytes0 = 0;
    if (S_ID_GEN(msg.id) == 0 && msg.id != 0 &&
        (msg.type == EMLIO_MSG_WELCOME || msg.type == EMLIO_MSG_ERROR)) {
        rc = s_joined(self, d, &msg);
        goto out;
    }
    if (msg.type == EMLIO_MSG_BATCH || msg.type == EMLIO_MSG_ERROR) {
        uint64_t part_no = S_ID_PART(msg.id);
        uint64_t gen = S_ID_GEN(msg.id);
        if (gen == self->gen || (self->ahead && gen == self->ahead_gen))
            b = s_find_slot(self, (uint32_t)gen, S_ID_BATCH(msg.id), NULL);
        if (b && part_no < b->n_parts && b->parts[part_no].daemon == d &&
            !b->parts[part_no].done)
            part = &b->parts[part_no];
    }
    if (msg.type == EMLIO_MSG_ERROR && (part || msg.id == 0)) {
        int code = msg.code <= -1000 && msg.code > -2000 ? (int)msg.code
                                                         : EMLIO_EPROTO;
        rc =
            emlio__seterr(self->err, code, "daemon '%s' failed a request: %.*s",
                          daemon->endpoint, (int)msg.text_len, msg.text);
        goto out;
    }
    if (!part)
        goto out; /* stale, duplicate or unsolicited: ignore */
    /* A part that fails half-way gives its frames back, so that a resend
     * or a late duplicate files into the same places, never past them. */
    frames0 = b->n_frames;
    bytes0 = b->bytes;
    if (msg.n_samples > b->cap - b->n_frames) {
        rc = emlio__seterr(self->err, EMLIO_EPROTO,
                           "daemon '%s' answered request %" PRIu64
                           " with %zu samples, more than asked",
                           daemon->endpoint, msg.id, msg.n_samples);
        goto out;
    }
    uint64_t now = emlio__now_ns();
    if (now - part->sent_ns < self->min_latency_ns || !self->min_latency_ns)
        self->min_latency_ns = now - part->sent_ns;
    /* Match the reply to the request in order; the daemon may have left
     * out records it skipped as corrupt, never added or reordered any. */
    uint32_t next = 0;
    for (size_t j = 0; j < msg.n_samples; j++) {
        const emlio_wire_sample_t *ws = &msg.samples[j];
        while (next < part->n) {
            emlio_sample_t *s = &b->samples[part->positions[next]];
            if (daemon->local_id[s->shard] == ws->shard &&
                s->record == ws->record)
                break;
            next++;
        }
        if (next == part->n) {
            rc = emlio__seterr(self->err, EMLIO_EPROTO,
                               "daemon '%s' answered request %" PRIu64
                               " with a sample it did not ask for",
                               daemon->endpoint, msg.id);
            goto out;
        }
        /* One frame per field (protocol v2), one in all otherwise. */
        uint32_t pos = part->positions[next++];
        size_t nf = self->n_fields;
        uint32_t crc = 0;
        size_t sample_len = 0;
        for (size_t f = 0; f < nf; f++) {
            zmq_msg_t *frame = &b->frames[b->n_frames];
            zmq_msg_init(frame);
            int more = zmq_msg_more(
                j == 0 && f == 0 ? &header : &b->frames[b->n_frames - 1]);
            if (!more || zmq_msg_recv(frame, sock, 0) < 0) {
                zmq_msg_close(frame);
                rc = emlio__seterr(self->err, EMLIO_EPROTO,
                                   "daemon '%s' sent %zu sample frames where "
                                   "the header announced %zu",
                                   daemon->endpoint, j * nf + f,
                                   msg.n_samples * nf);
                goto out;
            }
            b->n_frames++;
            b->fdata[pos * nf + f] = zmq_msg_data(frame);
            b->flen[pos * nf + f] = zmq_msg_size(frame);
            if (self->cfg.verify)
                crc =
                    emlio_crc32c(crc, zmq_msg_data(frame), zmq_msg_size(frame));
            sample_len += zmq_msg_size(frame);
        }
        emlio_sample_t *s = &b->samples[pos];
        s->data = b->fdata[pos * nf];
        s->len = b->flen[pos * nf];
        s->label = ws->label;
        if (self->cfg.verify && crc != ws->crc) {
            rc = emlio__seterr(self->err, EMLIO_ECORRUPT,
                               "sample %" PRIu64 " of shard '%s' from daemon "
                               "'%s' failed its checksum",
                               s->record, self->shards[s->shard].name,
                               daemon->endpoint);
            goto out;
        }
        b->bytes += sample_len;
        daemon->rx_bytes[stream] += sample_len;
        self->total_bytes += sample_len;
    }
    part->done = true;
    daemon->sock_outstanding[part->sock]--;
    self->outstanding_parts--;
    if (++b->parts_done == b->n_parts)
        rc = s_complete(self, b);
out:
    if (rc < 0 && part) {
        for (size_t i = frames0; i < b->n_frames; i++)
            zmq_msg_close(&b->frames[i]);
        for (uint32_t i = 0; i < part->n; i++) {
            b->samples[part->positions[i]].data = NULL;
            b->samples[part->positions[i]].len = 0;
        }
        b->n_frames = frames0;
        b->bytes = bytes0;
    }
    emlio__zmq_drain(sock);
    emlio__wire_msg_release(&msg);
    zmq_msg_close(&header);
    return rc;
}

/* Grows the auto-sized window while the consumer starves with the window
 * full, toward about twice the bandwidth-delay product measured as
 * (batches delivered per second) x (fastest request round trip). */
static void
s_adapt(emlio_client_t *self, bool starved)
{
    if (self->cfg.inflight)
        return;
    uint64_t now = emlio__now_ns();
    uint64_t dt = now - self->adapt_ns;
    if (dt < 50000000ull)
        return;
    uint32_t streams = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        for (uint32_t k = 0; k < self->daemons[d].n_streams; k++)
            streams += self->daemons[d].ready[k];
    uint64_t batches = self->n_delivered - self->adapt_batches;
    double rate = (double)batches * 1e9 / (double)dt;
    double bdp = rate * (double)self->min_latency_ns / 1e9;
    uint32_t target = (uint32_t)(2 * bdp) + streams;
    if (starved)
        target = EMLIO_MAX(target, self->window + self->window / 2 + 1);
    else if (target < self->window / 2)
        target = self->window; /* shrink lazily: no flapping */
    else
        target = EMLIO_MAX(target, self->window);
    /* A stream has at most one TCP window on the wire per RTT: requests
     * beyond two windows per stream only wait in the daemon's queues (and
     * cost us memory: fresh pages are dear), so a starving consumer on a
     * window-limited path is helped by streams (s_tune), not by more
     * batches in flight. */
    if (self->window_bytes && self->batch_bytes) {
        uint64_t per_path =
            2 * self->window_bytes * streams / EMLIO_MAX(self->batch_bytes, 1) +
            2 * (uint64_t)streams;
        target = (uint32_t)EMLIO_MIN((uint64_t)target, per_path);
    }
    self->window = EMLIO_MIN(EMLIO_MAX(target, 2u), self->window_max);
    self->adapt_ns = now;
    self->adapt_batches = self->n_delivered;
}

/* Samples the kernel's view of our streams: the path's RTT floor (lowest
 * min RTT) and its smoothed RTT now (the mean over streams). */
static void
s_sample_paths(emlio_client_t *self)
{
    uint64_t floor_us = UINT64_MAX, sum_us = 0, n = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        s_daemon_t *daemon = &self->daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            emlio_netpath_info_t info;
            if (daemon->fd[s] < 0 ||
                emlio__netpath_info(daemon->fd[s], &info) < 0 || !info.rtt_us)
                continue;
            uint32_t low = info.min_rtt_us ? info.min_rtt_us : info.rtt_us;
            floor_us = EMLIO_MIN(floor_us, low);
            sum_us += info.rtt_us;
            n++;
        }
    }
    if (n) {
        self->rtt_ns = floor_us * 1000;
        self->srtt_ns = sum_us * 1000 / n;
    }
}

/* Logs once, when the windows limit the rate, what would lift it. */
static void
s_advise(emlio_client_t *self)
{
    if (self->advised || self->tuner.limit != EMLIO_LIMIT_WINDOW ||
        !self->rtt_ns)
        return;
    self->advised = true;
    double rtt_s = (double)self->rtt_ns / 1e9;
    double per_stream = (double)self->window_bytes / rtt_s / 1e6;
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
              rtt_s * 1e3, self->window_bytes >> 10, per_stream,
              self->tuner.pinned ? "--streams pins the number of"
                                 : "opening more",
              self->daemons[0].endpoint, need_mib);
}

/* One step of the stream tuner (tuner.h), at most once per tick: measures
 * the rate, the consumer's waiting and the path, and opens streams when
 * the windows, not the consumer or the daemons, hold the rate back.
 * waiting_ns is the wait in progress inside next(). */
static int
s_tune(emlio_client_t *self, uint64_t waiting_ns)
{
    uint64_t now = emlio__now_ns();
    uint64_t tick = EMLIO_MAX(4 * self->rtt_ns, EMLIO_TUNER_MIN_TICK_NS);
    if (now - self->tuner.last_tick_ns < tick)
        return 0;
    s_sample_paths(self);
    uint64_t rtt = self->rtt_ns;
    uint32_t streams = UINT32_MAX;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        streams = EMLIO_MIN(streams, self->daemons[d].n_streams);
    uint64_t dt = now - self->tuner.last_tick_ns;
    /* Bytes asked for and not yet here, per stream: parts in flight times
     * the mean part size. */
    uint64_t part_bytes = self->batch_bytes / EMLIO_MAX(self->n_daemons, 1);
    emlio_tuner_input_t in = {
        .now_ns = now,
        .bytes = self->total_bytes,
        .wait_ns = self->total_wait_ns + self->wait_ns + waiting_ns,
        .streams = streams,
        .window = self->window_bytes,
        .queued = self->outstanding_parts * part_bytes /
                  EMLIO_MAX((uint64_t)streams * self->n_daemons, 1),
        .rtt_ns = rtt,
        .srtt_ns = self->srtt_ns,
        .host_idle = -1,
    };
    uint64_t idle, total;
    if (emlio__netpath_cpu_times(&idle, &total) == 0) {
        if (self->cpu_total && total > self->cpu_total)
            in.host_idle = (double)(idle - self->cpu_idle) /
                           (double)(total - self->cpu_total);
        self->cpu_idle = idle;
        self->cpu_total = total;
    }
    uint32_t want = emlio__tuner_step(&self->tuner, &in);
    if (!want)
        return 0;
    emlio_log(self->ctx, EMLIO_LOG_DEBUG, "client",
              "tuner: %.1f MB/s, consumer waited %.0f%%, %u streams, %" PRIu64
              " KiB asked per stream, window %" PRIu64
              " KiB, RTT %.2f/%.2f ms: %s%s",
              self->tuner.rate / 1e6, 100 * self->tuner.wait_share, streams,
              in.queued >> 10, in.window >> 10, (double)rtt / 1e6,
              (double)self->srtt_ns / 1e6, emlio_limit_name(self->tuner.limit),
              self->tuner.settled ? " (settled)" : "");
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        s_daemon_t *daemon = &self->daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++) {
            daemon->rx_rate[s] =
                (double)(daemon->rx_bytes[s] - daemon->rx_bytes_tick[s]) * 1e9 /
                (double)dt;
            daemon->rx_bytes_tick[s] = daemon->rx_bytes[s];
        }
    }
    s_advise(self);
    if (want <= streams)
        return 0;
    emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
              "%.0f MB/s over %u streams per daemon at RTT %.1f ms is "
              "window-limited; opening %u",
              self->tuner.rate / 1e6, streams, (double)rtt / 1e6, want);
    return s_add_streams(self, want);
}

static emlio_batch_t *
s_take_ready(emlio_client_t *self)
{
    emlio_batch_t *b = NULL;
    size_t pos = 0;
    if (self->cfg.in_order) {
        while (self->next_deliver < self->n_batches &&
               s_is_delivered(self, self->next_deliver))
            self->next_deliver++;
        b = s_find_slot(self, self->gen, self->next_deliver, &pos);
        if (!b || b->parts_done != b->n_parts)
            return NULL;
    } else {
        b = self->ready_head;
        if (!b)
            return NULL;
        self->ready_head = b->next;
        if (!self->ready_head)
            self->ready_tail = NULL;
        emlio_batch_t *slot = s_find_slot(self, b->gen, b->index, &pos);
        assert(slot == b);
        (void)slot;
    }
    self->slots[pos] = self->slots[--self->n_slots];
    return b;
}

static int s_next(emlio_client_t *self, emlio_batch_t **batch_out);

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
    if (!self->in_epoch)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "no epoch in progress: call begin_epoch");
    uint64_t wait_start = emlio__now_ns();
    uint64_t last_progress = wait_start;
    bool waited = false;
    bool starved = false;
    for (;;) {
        int rc = s_tune(self, waited ? emlio__now_ns() - wait_start : 0);
        if (rc < 0)
            return rc;
        rc = s_fill_window(self);
        if (rc < 0)
            return rc;
        emlio_batch_t *b = s_take_ready(self);
        if (b) {
            uint64_t now = emlio__now_ns();
            self->delivered[b->index / 8] |= (uint8_t)(1u << (b->index % 8));
            self->n_delivered++;
            self->stat_samples += b->n;
            self->stat_bytes += b->bytes;
            self->last_delivery_ns = now;
            if (!self->first_batch_ns)
                self->first_batch_ns = now;
            if (waited)
                self->wait_ns += now - wait_start;
            s_adapt(self, starved);
            *batch_out = b;
            return 1;
        }
        if (self->n_delivered == self->n_batches) {
            self->in_epoch = false;
            return 0;
        }
        /* Nothing ready: wait for replies. A wait with every slot of the
         * window busy means the window, not the daemon, is the limit. */
        if (self->n_slots >= self->window &&
            self->next_to_send < self->n_batches)
            starved = true;
        waited = true;
        uint64_t now = emlio__now_ns();
        uint64_t limit =
            (uint64_t)EMLIO_MAX(self->cfg.timeout_ms, 1) * 1000000ull;
        if (now - last_progress >= limit) {
            self->wait_ns += now - wait_start;
            return emlio__seterr(self->err, EMLIO_ETIMEDOUT,
                                 "no reply from the daemons for %d ms with %zu "
                                 "requests outstanding (first: '%s')",
                                 self->cfg.timeout_ms, self->outstanding_parts,
                                 self->daemons[0].endpoint);
        }
        int left = (int)((limit - (now - last_progress)) / 1000000) + 1;
        rc = zmq_poll(self->poll, (int)(2 * self->n_poll), left);
        if (rc < 0) {
            if (errno == EINTR) {
                /* Let the caller look at its signal flags; nothing is lost,
                 * the next call carries on. */
                self->wait_ns += emlio__now_ns() - wait_start;
                return emlio__seterr(self->err, -EINTR, "interrupted");
            }
            return emlio__seterr(self->err, -errno, "poll failed: %s",
                                 zmq_strerror(errno));
        }
        for (size_t i = 0; i < self->n_poll; i++) {
            if (!(self->poll[self->n_poll + i].revents & ZMQ_POLLIN))
                continue;
            rc = s_handle_events(self, self->poll_daemon[i],
                                 self->poll_stream[i]);
            if (rc < 0) {
                self->wait_ns += emlio__now_ns() - wait_start;
                return rc;
            }
        }
        for (size_t i = 0; i < self->n_poll; i++) {
            if (!(self->poll[i].revents & ZMQ_POLLIN))
                continue;
            /* Drain what is queued on this stream, a bounded amount so the
             * other streams are served too. */
            for (int k = 0; k < 64; k++) {
                rc = s_receive_one(self, self->poll_daemon[i],
                                   self->poll_stream[i]);
                if (rc < 0) {
                    self->wait_ns += emlio__now_ns() - wait_start;
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
    s_batch_put((*b_p)->owner, *b_p);
    *b_p = NULL;
}

void
emlio_client_stats(const emlio_client_t *self, emlio_client_stats_t *out)
{
    memset(out, 0, sizeof(*out));
    out->epoch = self->epoch;
    out->batches = self->n_delivered;
    out->samples = self->stat_samples;
    out->bytes = self->stat_bytes;
    out->seconds =
        (double)(self->last_delivery_ns - self->epoch_start_ns) / 1e9;
    out->wait_s = (double)self->wait_ns / 1e9;
    out->first_batch_s =
        self->first_batch_ns
            ? (double)(self->first_batch_ns - self->epoch_start_ns) / 1e9
            : 0;
    out->inflight = self->window;
    out->retries = self->retries;
    out->skipped = self->n_skipped;
    out->rtt_ms = (double)self->rtt_ns / 1e6;
    out->mb_per_s = self->tuner.rate / 1e6;
    out->streams = UINT32_MAX;
    for (uint32_t d = 0; d < self->n_daemons; d++)
        out->streams = EMLIO_MIN(out->streams, self->daemons[d].n_streams);
    if (!self->n_daemons)
        out->streams = 0;
    out->limit = self->tuner.limit;
    out->window = self->window_bytes;
}

size_t
emlio_client_streams(const emlio_client_t *self, emlio_stream_stats_t *out,
                     size_t max)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->n_daemons; d++) {
        const s_daemon_t *daemon = &self->daemons[d];
        for (uint32_t s = 0; s < daemon->n_streams; s++, n++) {
            if (n >= max)
                continue;
            emlio_netpath_info_t info;
            double rtt = 0;
            if (daemon->fd[s] >= 0 &&
                emlio__netpath_info(daemon->fd[s], &info) == 0)
                rtt = info.rtt_us / 1e3;
            out[n] = (emlio_stream_stats_t){
                .daemon = d,
                .stream = s,
                .ready = daemon->ready[s],
                .mb_per_s = daemon->rx_rate[s] / 1e6,
                .rtt_ms = rtt,
                .bytes = daemon->rx_bytes[s],
            };
        }
    }
    return n;
}

const emlio_sample_t *
emlio_client_skipped(const emlio_client_t *self, size_t *n)
{
    *n = self->n_skipped;
    return self->skipped;
}

const emlio_plan_t *
emlio_client_plan(const emlio_client_t *self)
{
    return self->n_batches || self->in_epoch ? self->plan : NULL;
}

const char *
emlio_client_errmsg(const emlio_client_t *self)
{
    return self->err;
}

/* ---- resume state ------------------------------------------------------ */

/* Layout (little endian): "EMLS", u32 format 2, u64 seed, u32 world, rank,
 * batch_size, shuffle, window_shards, drop_last, char dataset[16],
 * u64 epoch, u64 n_batches, bitmap[(n_batches + 7) / 8], u32 crc32c of all
 * the bytes before it. The bitmap names batches of one order, so the
 * format follows the plan version: format 1 was plan version 1. */
#define S_STATE_MAGIC  "EMLS"
#define S_STATE_FORMAT 2u
#define S_STATE_FIXED  (4 + 4 + 8 + 6 * 4 + 16 + 8 + 8)
_Static_assert(EMLIO_PLAN_VERSION == 2,
               "another plan order needs another resume state format");

static void
s_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void
s_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
s_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t
s_get32(const uint8_t *p)
{
    return (uint32_t)s_get64((const uint8_t[8]){ p[0], p[1], p[2], p[3] });
}

static void
s_put_params(const emlio_client_t *self, uint8_t *p)
{
    memcpy(p, S_STATE_MAGIC, 4);
    s_put32(p + 4, S_STATE_FORMAT);
    s_put64(p + 8, self->cfg.seed);
    s_put32(p + 16, self->cfg.world);
    s_put32(p + 20, self->cfg.rank);
    s_put32(p + 24, self->cfg.batch_size);
    s_put32(p + 28, (uint32_t)self->cfg.shuffle);
    s_put32(p + 32, self->cfg.window_shards);
    s_put32(p + 36, self->cfg.drop_last);
    memcpy(p + 40, self->dataset, 16);
}

int
emlio_client_save_state(const emlio_client_t *self, uint8_t **blob_out,
                        size_t *len_out)
{
    assert(self && blob_out && len_out);
    if (!self->delivered)
        return emlio__seterr((char *)self->err, EMLIO_EINVAL,
                             "no epoch has been started");
    size_t bitmap = (self->n_batches + 7) / 8;
    size_t len = S_STATE_FIXED + bitmap + 4;
    uint8_t *p = emlio_malloc(len);
    if (!p)
        return emlio__seterr((char *)self->err, EMLIO_ENOMEM, "out of memory");
    s_put_params(self, p);
    s_put64(p + 56, self->epoch);
    s_put64(p + 64, self->n_batches);
    memcpy(p + S_STATE_FIXED, self->delivered, bitmap);
    s_put32(p + len - 4, emlio_crc32c(0, p, len - 4));
    *blob_out = p;
    *len_out = len;
    return 0;
}

void
emlio_client_free_blob(uint8_t *blob)
{
    emlio_free(blob);
}

int
emlio_client_load_state(emlio_client_t *self, const uint8_t *blob, size_t len)
{
    assert(self && blob);
    if (len < S_STATE_FIXED + 4 || memcmp(blob, S_STATE_MAGIC, 4) ||
        s_get32(blob + len - 4) != emlio_crc32c(0, blob, len - 4))
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state is damaged or not an emlio state");
    uint32_t format = s_get32(blob + 4);
    if (format != S_STATE_FORMAT)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state has format %" PRIu32
                             ", expected %u%s",
                             format, S_STATE_FORMAT,
                             format == 1 ? ": it was saved against plan "
                                           "version 1, whose sample order "
                                           "differs; start the epoch again"
                                         : "");
    uint8_t mine[S_STATE_FIXED];
    s_put_params(self, mine);
    if (memcmp(mine, blob, 56)) {
        const char *what = memcmp(mine + 40, blob + 40, 16) ? "dataset"
                           : memcmp(mine + 8, blob + 8, 8)  ? "seed"
                                                            : "world, rank, "
                                                              "batch size or "
                                                              "shuffle";
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state was made with another %s", what);
    }
    uint64_t epoch = s_get64(blob + 56);
    uint64_t n = s_get64(blob + 64);
    /* Nothing requested ahead may survive: some of it may be delivered
     * already according to the state. */
    s_abandon_epoch(self, 0);
    self->ahead = false;
    int rc = emlio_client_begin_epoch(self, epoch);
    if (rc < 0)
        return rc;
    if (n != self->n_batches || len != S_STATE_FIXED + (n + 7) / 8 + 4)
        return emlio__seterr(self->err, EMLIO_ESTATE,
                             "resume state has %" PRIu64 " batches, the plan "
                             "%zu",
                             n, self->n_batches);
    memcpy(self->delivered, blob + S_STATE_FIXED, (n + 7) / 8);
    self->n_delivered = 0;
    for (size_t i = 0; i < n; i++)
        self->n_delivered += s_is_delivered(self, i);
    if (self->n_delivered == n)
        self->in_epoch = true; /* next() reports the end at once */
    return (int)(n - self->n_delivered);
}
