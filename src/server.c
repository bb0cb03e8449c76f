/* server.c - emlio_server_t: serves the shards of one directory over ZeroMQ.
 * One frontend thread owns the ROUTER socket; worker threads build batches.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "buf.h"
#include "crc32c.h"
#include "emlio/example.h"
#include "netpath.h"
#include "queue.h"
#include "security.h"
#include "shardset.h"
#include "wire.h"

/* How often blocked threads wake to check for stop, in ms. */
#define S_STOP_POLL_MS    100
/* The longest a destroy waits for ZeroMQ to release frames that point into
 * the shard mappings before it gives up and leaves them mapped. */
#define S_RELEASE_WAIT_MS 5000
#define S_MAX_IDENTITY    255
/* s_read_sample's verdict for a sample lacking the requested field. */
#define S_EMISSING        (-1999)

/* One GET on its way from the frontend to a worker and back. */
/* One sample located and verified by a reader: a view into the mapping. */
typedef struct s_sample_view {
    const uint8_t *data;
    size_t len;
    int64_t label;
    uint32_t crc;
    uint32_t shard;
    uint64_t record;
    uint8_t *owned; /* a copy the view points into (ImageFolder files),
                       freed with the batch; NULL for the mapping */
} s_sample_view_t;

/* One GET on its way through the pipeline: frontend -> reader ->
 * serializer -> frontend. */
typedef struct s_job {
    zmq_msg_t identity;
    zmq_msg_t header; /* kept alive: msg borrows strings from it */
    emlio_wire_msg_t msg;
    s_sample_view_t *views; /* filled by the reader; skipped ones left out */
    size_t n_views;
    size_t per; /* views per sample (fields), set by the reader */
    int code;   /* the reader's verdict: 0, or the error to answer with */
    char text[EMLIO_ERRMSG_LEN];
} s_job_t;

/* Lives as long as ZeroMQ holds any frame of one sent batch: the mapping
 * must stay, and with drop_behind its pages are let go after the last. */
typedef struct s_release {
    emlio_server_t *server;
    atomic_uint left;
    size_t n;
    s_sample_view_t items[]; /* only shard and record are used */
} s_release_t;

/* Outstanding GETs of one client (by ZeroMQ routing id). */
typedef struct s_peer {
    uint8_t id[S_MAX_IDENTITY];
    uint8_t id_len;
    uint32_t outstanding;
    uint64_t last_seen_ns;
    uint64_t session; /* the client session it joined by HELLO; 0 = none
                         (a v1 client: each connection is a client) */
    bool stalled;     /* a reply could not be queued: it does not read */
} s_peer_t;

struct emlio_server {
    emlio_ctx_t *ctx;
    emlio_server_config_t cfg; /* strings below are owned copies */
    char *data_dir;
    char *bytes_key;
    char *label_key;
    char *format; /* copies of cfg's strings (NULL = default) */
    char *field;
    char *label_field;    /* "cls" unless configured */
    char *fields_spec;    /* cfg.fields, copied */
    char **fields;        /* the names of --fields; NULL = one default */
    size_t n_fields;      /* 0 = one default field (protocol v1 and v2) */
    emlio_buf_t welcome2; /* the WELCOME of protocol v2 clients */
    size_t bytes_key_len; /* measured once, not per sample */
    size_t label_key_len;
    char *name;
    char *curve_secret;
    char *authorized_keys;
    emlio_shardset_t set;
    bool loaded;
    emlio_buf_t welcome;
    void *router;
    char endpoint[256];
    char inproc_work[64];
    char inproc_done[64];
    pthread_t frontend;
    pthread_t *workers; /* cfg.workers readers, then the serializers */
    emlio_queue_t *ser_queue;
    uint32_t n_workers_started;
    bool frontend_started;
    atomic_bool stopping;
    /* Sent batches whose frames ZeroMQ still holds (one release token
     * each); the mappings may only go away when this is back to zero. */
    atomic_uint_fast64_t batches_in_flight;
    /* Frontend-thread state. */
    s_peer_t *peers;
    size_t n_peers;
    size_t cap_peers;
    size_t n_clients; /* sessions, counting a session-less peer as one */
    void *monitor;    /* connection events of the ROUTER (PAIR), or NULL */
    emlio_netpath_bufplan_t sndbuf;
    /* Counters. */
    atomic_uint_fast64_t requests;
    atomic_uint_fast64_t errors;
    atomic_uint_fast64_t samples;
    atomic_uint_fast64_t bytes;
    atomic_uint_fast64_t corrupt_skipped;
    atomic_uint_fast64_t clients;
    atomic_uint_fast64_t active_clients;
    atomic_uint_fast64_t active_streams;
    emlio_zap_t *zap;
    bool curve;
    char curve_public[EMLIO_CURVE_KEY_LEN];
    char err[EMLIO_ERRMSG_LEN];
};

void
emlio_server_config_init(emlio_server_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->bytes_key = "image/encoded";
    cfg->label_key = "image/class/label";
    cfg->verify = true;
    cfg->write_index = true;
    cfg->workers = 2;
    cfg->serializers = 1;
    cfg->queue_depth = 64;
    cfg->readahead = true;
    cfg->max_batch = 4096;
    cfg->max_credit = 256;
    cfg->on_corrupt = EMLIO_ON_CORRUPT_FAIL;
    cfg->max_clients = 1024;
    cfg->idle_timeout_ms = 300000;
}

static char *
s_dup_or(const char *s, const char *fallback)
{
    return emlio_strdup(s ? s : fallback);
}

emlio_server_t *
emlio_server_new(emlio_ctx_t *ctx, const emlio_server_config_t *cfg)
{
    assert(ctx && cfg);
    emlio_server_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    char default_name[64];
    snprintf(default_name, sizeof(default_name), "emliod/%d.%d.%d",
             EMLIO_VERSION_MAJOR, EMLIO_VERSION_MINOR, EMLIO_VERSION_PATCH);
    self->ctx = ctx;
    self->cfg = *cfg;
    self->data_dir = s_dup_or(cfg->data_dir, "");
    self->bytes_key = s_dup_or(cfg->bytes_key, "image/encoded");
    self->label_key = s_dup_or(cfg->label_key, "image/class/label");
    self->name = s_dup_or(cfg->name, default_name);
    self->format = s_dup_or(cfg->format, "auto");
    self->field = cfg->field ? emlio_strdup(cfg->field) : NULL;
    self->label_field = s_dup_or(cfg->label_field, "cls");
    self->fields_spec = cfg->fields ? emlio_strdup(cfg->fields) : NULL;
    if (!self->data_dir || !self->bytes_key || !self->label_key ||
        !self->name || !self->format || !self->label_field ||
        (cfg->field && !self->field) || (cfg->fields && !self->fields_spec)) {
        emlio_server_destroy(&self);
        return NULL;
    }
    self->cfg.data_dir = self->data_dir;
    self->cfg.bytes_key = self->bytes_key;
    self->bytes_key_len = strlen(self->bytes_key);
    self->label_key_len = strlen(self->label_key);
    self->cfg.label_key = self->label_key;
    self->cfg.name = self->name;
    self->cfg.format = self->format;
    self->cfg.field = self->field;
    self->cfg.label_field = self->label_field;
    self->cfg.fields = self->fields_spec;
    if (self->cfg.workers == 0)
        self->cfg.workers = 1;
    if (self->cfg.serializers == 0)
        self->cfg.serializers = 1;
    if (self->cfg.queue_depth == 0)
        self->cfg.queue_depth = 1;
    if (self->cfg.max_batch == 0 ||
        self->cfg.max_batch > EMLIO_WIRE_MAX_SAMPLES)
        self->cfg.max_batch = EMLIO_WIRE_MAX_SAMPLES;
    if (self->cfg.max_credit == 0)
        self->cfg.max_credit = 1;
    if (self->cfg.max_clients == 0)
        self->cfg.max_clients = 1;
    /* The key strings are borrowed by the config; keep our own copies. */
    self->cfg.authorized_keys = NULL;
    self->cfg.curve_secret_key = NULL;
    if (cfg->curve_secret_key) {
        self->curve_secret = emlio_strdup(cfg->curve_secret_key);
        self->cfg.curve_secret_key = self->curve_secret;
    }
    if (cfg->authorized_keys) {
        self->authorized_keys = emlio_strdup(cfg->authorized_keys);
        self->cfg.authorized_keys = self->authorized_keys;
    }
    if ((cfg->curve_secret_key && !self->curve_secret) ||
        (cfg->authorized_keys && !self->authorized_keys)) {
        emlio_server_destroy(&self);
        return NULL;
    }
    emlio_buf_init(&self->welcome);
    emlio_buf_init(&self->welcome2);
    snprintf(self->err, sizeof(self->err), "no error");
    return self;
}

/* Waits (bounded) until ZeroMQ has released every zero-copy frame, so the
 * mappings can be unmapped without a use-after-unmap in its I/O threads. */
static bool
s_wait_batches_released(emlio_server_t *self)
{
    uint64_t deadline = emlio__now_ns() + S_RELEASE_WAIT_MS * 1000000ull;
    while (atomic_load(&self->batches_in_flight) > 0) {
        if (emlio__now_ns() > deadline)
            return false;
        struct timespec ts = { 0, 1000000 };
        nanosleep(&ts, NULL);
    }
    return true;
}

void
emlio_server_destroy(emlio_server_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_server_t *self = *self_p;
    emlio_server_stop(self);
    if (self->router) {
        int linger = 0;
        zmq_setsockopt(self->router, ZMQ_LINGER, &linger, sizeof(linger));
        zmq_socket_monitor(self->router, NULL, 0);
        zmq_close(self->router);
    }
    if (self->monitor)
        zmq_close(self->monitor);
    if (s_wait_batches_released(self)) {
        emlio__shardset_release(&self->set);
    } else {
        /* Leaking the mappings is safe; unmapping them is not. */
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "%" PRIuFAST64 " sent batches still held by zeromq; leaving "
                  "shards mapped",
                  atomic_load(&self->batches_in_flight));
    }
    emlio__zap_stop(&self->zap);
    emlio_buf_release(&self->welcome);
    emlio_free(self->peers);
    if (self->curve_secret) /* do not leave the secret in freed memory */
        memset(self->curve_secret, 0, strlen(self->curve_secret));
    emlio_free(self->curve_secret);
    emlio_free(self->authorized_keys);
    emlio_free(self->workers);
    emlio_free(self->data_dir);
    emlio_free(self->bytes_key);
    emlio_free(self->label_key);
    emlio_free(self->format);
    emlio_free(self->field);
    emlio_free(self->label_field);
    emlio_free(self->fields_spec);
    for (size_t i = 0; i < self->n_fields; i++)
        emlio_free(self->fields[i]);
    emlio_free(self->fields);
    emlio_buf_release(&self->welcome2);
    emlio_free(self->name);
    emlio_free(self);
    *self_p = NULL;
}

static void
s_shardset_log(void *userdata, const char *msg)
{
    emlio_server_t *self = userdata;
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", msg);
}

/* Encodes the WELCOME once, when both the inventory (load) and the
 * connections' send buffer (bind) are known; every client gets these
 * bytes. */
static int
s_encode_welcome(emlio_server_t *self)
{
    emlio_wire_shard_t *inv = emlio_calloc(self->set.n, sizeof(*inv));
    if (!inv)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < self->set.n; i++) {
        inv[i].name = self->set.shards[i].name;
        inv[i].name_len = strlen(inv[i].name);
        inv[i].records = emlio__shard_count(&self->set.shards[i]);
        inv[i].bytes = emlio__shard_size(&self->set.shards[i]);
    }
    int rc = emlio__wire_encode_welcome_v(
        &self->welcome, 1, self->name, self->set.fingerprint,
        self->cfg.max_batch, self->cfg.max_credit, EMLIO_WIRE_MAX_STREAMS,
        self->sndbuf.effective, inv, self->set.n, NULL, 0);
    if (rc == 0)
        rc = emlio__wire_encode_welcome_v(
            &self->welcome2, 2, self->name, self->set.fingerprint,
            self->cfg.max_batch, self->cfg.max_credit, EMLIO_WIRE_MAX_STREAMS,
            self->sndbuf.effective, inv, self->set.n, self->fields,
            self->n_fields);
    emlio_free(inv);
    if (rc < 0)
        return emlio__seterr(self->err, rc, "out of memory");
    return 0;
}

/* Splits cfg.fields ("jpg,cls,json") into self->fields and checks the
 * names against what the backends can serve. */
static int
s_parse_fields(emlio_server_t *self)
{
    const char *p = self->fields_spec;
    if (!p)
        return 0;
    while (*p) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len > EMLIO_WIRE_MAX_NAME)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': empty or long name",
                                 self->fields_spec);
        if (self->n_fields >= EMLIO_WIRE_MAX_FIELDS)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': more than %u fields",
                                 self->fields_spec, EMLIO_WIRE_MAX_FIELDS);
        char **fields = emlio_reallocarray(self->fields, self->n_fields + 1,
                                           sizeof(*fields));
        if (!fields)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        self->fields = fields;
        char *name = emlio_malloc(len + 1);
        if (!name)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        memcpy(name, p, len);
        name[len] = '\0';
        for (size_t i = 0; i < self->n_fields; i++)
            if (strcmp(self->fields[i], name) == 0) {
                emlio__seterr(self->err, EMLIO_EINVAL,
                              "bad field list '%s': '%s' twice",
                              self->fields_spec, name);
                emlio_free(name);
                return EMLIO_EINVAL;
            }
        self->fields[self->n_fields++] = name;
        p += len + (comma ? 1 : 0);
        if (comma && !*p)
            return emlio__seterr(self->err, EMLIO_EINVAL,
                                 "bad field list '%s': empty name",
                                 self->fields_spec);
    }
    return 0;
}

/* A requested field no shard can have is a configuration error found at
 * start-up, not one error per sample later. */
static int
s_check_fields(emlio_server_t *self)
{
    for (size_t f = 0; f < self->n_fields; f++) {
        const char *want = self->fields[f];
        bool found = false, unknown = false;
        for (size_t i = 0; i < self->set.n && !found; i++) {
            const emlio_shard_t *shard = &self->set.shards[i];
            if (shard->kind == EMLIO_SHARD_TAR) {
                const emlio__tar_index_t *idx = emlio__tar_index(shard->tar);
                for (size_t k = 0; k < idx->n_fields && !found; k++)
                    found = strcmp(idx->fields[k], want) == 0;
            } else if (shard->kind == EMLIO_SHARD_IMAGEFOLDER) {
                found = !strcmp(want, "image") || !strcmp(want, "label");
            } else {
                unknown = true; /* Example keys: checked per record */
            }
        }
        if (!found && !unknown)
            return emlio__seterr(
                self->err, EMLIO_ENOTFOUND,
                "no shard under '%s' has field '%s' (tar: member "
                "extensions; imagefolder: image, label)",
                self->data_dir, want);
    }
    return 0;
}

int
emlio_server_load(emlio_server_t *self)
{
    assert(self);
    if (self->loaded)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already loaded");
    emlio_shardset_opts_t opts = {
        .format = self->cfg.format,
        .mixed_formats = self->cfg.mixed_formats,
        .verify_data = self->cfg.verify,
        .write_index = self->cfg.write_index,
    };
    int rc = s_parse_fields(self);
    if (rc < 0)
        return rc;
    rc = emlio__shardset_load(&self->set, self->data_dir, &opts, s_shardset_log,
                              self, self->err);
    if (rc < 0)
        return rc;
    rc = s_check_fields(self);
    if (rc < 0) {
        emlio__shardset_release(&self->set);
        return rc;
    }
    self->loaded = true;
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "loaded %zu shards, %" PRIu64 " records, %" PRIu64
              " bytes from '%s' (dataset %s)",
              self->set.n, self->set.records, self->set.bytes, self->data_dir,
              self->set.fingerprint);
    return (int)self->set.n;
}

/* Whether endpoint may be reachable from other hosts: anything but TCP on
 * a loopback address, ipc:// or inproc://. */
static bool
s_is_public(const char *endpoint)
{
    static const char *const local[] = {
        "tcp://127.", "tcp://localhost:", "tcp://[::1]:", "ipc://", "inproc://"
    };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(local); i++)
        if (!strncmp(endpoint, local[i], strlen(local[i])))
            return false;
    return true;
}

/* Makes router a CURVE server with our secret key, behind a ZAP handler
 * that admits the authorized client keys (or any CURVE client when no
 * directory is configured). */
static int
s_setup_curve(emlio_server_t *self, void *router)
{
    int rc = 0;
    if (emlio_curve_public(self->curve_public, self->cfg.curve_secret_key) < 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "the curve secret key is not a valid Z85 key");
    if (!self->zap) {
        size_t n_keys = 0;
        self->zap = emlio__zap_start(self->ctx, self->cfg.authorized_keys, &rc,
                                     &n_keys, self->err);
        if (!self->zap)
            return rc;
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "curve on, public key %s; %s%zu authorized client keys",
                  self->curve_public,
                  self->cfg.authorized_keys ? "" : "any client key (no list); ",
                  n_keys);
    }
    int one = 1;
    if (zmq_setsockopt(router, ZMQ_CURVE_SERVER, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, self->cfg.curve_secret_key,
                       40) != 0 ||
        zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, "emlio", 5) != 0)
        return emlio__seterr(self->err, -errno, "cannot enable curve: %s",
                             zmq_strerror(errno));
    self->curve = true;
    return 0;
}

/* Sizes the send buffer of every client connection (see
 * emlio_server_config_t.sndbuf): through ZMQ_SNDBUF where an explicit size
 * beats autotuning, or, with CAP_NET_ADMIN, by forcing it on each accepted
 * connection, whose descriptors the ROUTER's monitor reports. */
static int
s_setup_sndbuf(emlio_server_t *self, void *router)
{
    emlio_netpath_limits_t limits;
    emlio__netpath_limits(&limits);
    emlio__netpath_plan(&limits, true, self->cfg.sndbuf, &self->sndbuf);
    if (self->sndbuf.zmq_value >= 0 &&
        zmq_setsockopt(router, ZMQ_SNDBUF, &self->sndbuf.zmq_value,
                       sizeof(int)) != 0)
        return emlio__seterr(self->err, -errno, "cannot set ZMQ_SNDBUF: %s",
                             zmq_strerror(errno));
    if (self->sndbuf.force_value) {
        char ep[64];
        snprintf(ep, sizeof(ep), "inproc://emlio-smon-%" PRIu64,
                 emlio__unique_id());
        void *mon = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PAIR);
        int zero = 0;
        if (!mon || zmq_socket_monitor(router, ep, ZMQ_EVENT_ACCEPTED) != 0 ||
            zmq_setsockopt(mon, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
            zmq_connect(mon, ep) != 0) {
            int err = errno;
            if (mon)
                zmq_close(mon);
            return emlio__seterr(self->err, -err,
                                 "cannot monitor the server socket: %s",
                                 zmq_strerror(err));
        }
        self->monitor = mon;
    }
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "send buffer per connection: %" PRIu64 " KiB (%s; "
              "net.ipv4.tcp_wmem max %" PRIu64
              " KiB, net.core.wmem_max %" PRIu64 " KiB%s)",
              self->sndbuf.effective >> 10, self->sndbuf.how,
              limits.tcp_wmem_max >> 10, limits.wmem_max >> 10,
              limits.net_admin ? ", CAP_NET_ADMIN" : "");
    return 0;
}

/* Acts on the ROUTER's connection events: forces the send buffer of each
 * accepted connection (the event's value is its descriptor). */
static void
s_frontend_monitor(emlio_server_t *self)
{
    for (;;) {
        zmq_msg_t frame;
        zmq_msg_init(&frame);
        if (zmq_msg_recv(&frame, self->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&frame);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&frame) >= 6) {
            memcpy(&event, zmq_msg_data(&frame), 2);
            memcpy(&value, (uint8_t *)zmq_msg_data(&frame) + 2, 4);
        }
        zmq_msg_close(&frame);
        emlio__zmq_drain(self->monitor); /* the address frame */
        if (event == ZMQ_EVENT_ACCEPTED && self->sndbuf.force_value) {
            int rc = emlio__netpath_force((int)value, true,
                                          self->sndbuf.force_value);
            if (rc < 0)
                emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                          "cannot force the send buffer of a connection: %s",
                          strerror(-rc));
        }
    }
}

int
emlio_server_bind(emlio_server_t *self, const char *endpoint)
{
    assert(self && endpoint);
    if (self->router)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already bound");
    void *router = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_ROUTER);
    if (!router)
        return emlio__seterr(self->err, -errno, "cannot create socket: %s",
                             zmq_strerror(errno));
    /* Credits bound what a well-behaved connection can have queued, so the
     * send high-water mark (credits plus room for error replies) only ever
     * stops a peer that sends without reading: its extra replies are
     * dropped (non-blocking sends) instead of growing our memory. The
     * receive side stays unbounded on purpose: libzmq 4.3.4 aborts
     * (assertion !_io_error in stream_engine_base.cpp) when a peer whose
     * input was stopped at the receive mark disconnects, so a finite mark
     * would let any client crash the daemon. The frontend drains requests
     * faster than one client can send them (see tests/integration/
     * test_load.sh). Mandatory routing reports vanished peers instead of
     * silently discarding their batches. */
    int one = 1;
    int hb_ivl = 2000;
    int hb_ttl = 10000;
    int sndhwm = (int)EMLIO_MIN(self->cfg.max_credit + 64u, (uint32_t)INT_MAX);
    int rcvhwm = 0;
    zmq_setsockopt(router, ZMQ_SNDHWM, &sndhwm, sizeof(sndhwm));
    zmq_setsockopt(router, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
    zmq_setsockopt(router, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
    /* Requests are small; refuse (disconnect) anything larger before libzmq
     * buffers it, so a hostile peer cannot make us hold huge frames. */
    int64_t max_msg = 4096 + (int64_t)self->cfg.max_batch * 24;
    zmq_setsockopt(router, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg));
    zmq_setsockopt(router, ZMQ_HEARTBEAT_IVL, &hb_ivl, sizeof(hb_ivl));
    zmq_setsockopt(router, ZMQ_HEARTBEAT_TTL, &hb_ttl, sizeof(hb_ttl));
    zmq_setsockopt(router, ZMQ_HEARTBEAT_TIMEOUT, &hb_ttl, sizeof(hb_ttl));
    int rc = s_setup_sndbuf(self, router);
    if (rc < 0) {
        zmq_close(router);
        return rc;
    }
    if (self->cfg.curve_secret_key) {
        rc = s_setup_curve(self, router);
        if (rc < 0) {
            zmq_close(router);
            return rc;
        }
    } else if (s_is_public(endpoint)) {
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "serving '%s' without CURVE: data travels unencrypted "
                  "and any client may read it",
                  endpoint);
    }
    if (zmq_bind(router, endpoint) != 0) {
        int err = errno;
        zmq_close(router);
        return emlio__seterr(self->err, -err, "cannot bind '%s': %s", endpoint,
                             zmq_strerror(err));
    }
    size_t len = sizeof(self->endpoint);
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, self->endpoint, &len) != 0)
        snprintf(self->endpoint, sizeof(self->endpoint), "%s", endpoint);
    self->router = router;
    return 0;
}

const char *
emlio_server_endpoint(const emlio_server_t *self)
{
    return self->endpoint;
}

/* ---- the worker: one GET in, one BATCH or ERROR out ------------------- */

static void
s_frame_free(void *data, void *hint)
{
    (void)data;
    s_release_t *rel = hint;
    if (atomic_fetch_sub(&rel->left, 1) != 1)
        return;
    emlio_server_t *self = rel->server;
    if (self->cfg.drop_behind) {
        /* Sent: these pages will not be read again this epoch. */
        for (size_t i = 0; i < rel->n; i++)
            emlio__shard_advise(&self->set.shards[rel->items[i].shard],
                                (size_t)rel->items[i].record, 1,
                                EMLIO_ADVISE_DONTNEED);
    }
    for (size_t i = 0; i < rel->n; i++)
        emlio_free(rel->items[i].owned);
    emlio_free(rel);
    atomic_fetch_sub(&self->batches_in_flight, 1);
}

/* Finds one sample's bytes and CRC in one pass: the record's stored CRC
 * is checked by combining the CRCs of the parts before, inside and after
 * the sample bytes, so no byte is read twice. */

/* A tar sample: the configured member (or the first image member), zero
 * copy from the mapping, and the label from the label member. A sample
 * without that member is EMLIO_EFORMAT with -ENOENT's meaning (the caller
 * names shard, sample and field). */
static int
s_read_tar_sample(const emlio_server_t *self, const emlio_shard_t *shard,
                  uint64_t record, s_sample_view_t *out)
{
    const uint8_t *data;
    size_t len;
    int rc = self->field ? emlio__tar_field(shard->tar, (size_t)record,
                                            self->field, &data, &len)
                         : emlio__tar_default_field(shard->tar, (size_t)record,
                                                    &data, &len);
    if (rc == -ENOENT)
        return S_EMISSING;
    if (rc < 0)
        return rc;
    out->data = data;
    out->len = len;
    out->label =
        emlio__tar_label(shard->tar, (size_t)record, self->label_field);
    out->crc = emlio_crc32c(0, data, len);
    return 0;
}

static int
s_read_folder_sample(const emlio_shard_t *shard, uint64_t record,
                     s_sample_view_t *out)
{
    uint8_t *data;
    size_t len;
    int rc = emlio__folder_read(shard->folder, (size_t)record, &data, &len);
    if (rc < 0)
        return rc;
    out->owned = data;
    out->data = data;
    out->len = len;
    out->label = emlio__folder_label(shard->folder);
    out->crc = emlio_crc32c(0, data, len);
    return 0;
}

/* An owned little-endian copy of an int64 or float value (a field frame
 * of a number). */
static int
s_number_view(s_sample_view_t *out, const void *le, size_t len)
{
    out->owned = emlio_malloc(len);
    if (!out->owned)
        return EMLIO_ENOMEM;
    memcpy(out->owned, le, len);
    out->data = out->owned;
    out->len = len;
    return 0;
}

static int
s_int64_view(s_sample_view_t *out, int64_t v)
{
    uint8_t le[8];
    for (int k = 0; k < 8; k++)
        le[k] = (uint8_t)((uint64_t)v >> (8 * k));
    return s_number_view(out, le, sizeof(le));
}

/* Multi-field samples: fills views[0, n_fields) with one frame per
 * configured field, the label and the sample CRC (over the frames in
 * field order) in views[0]. A missing field is S_EMISSING with its name in
 * *missing. On failure nothing stays owned. */
static int
s_read_fields(const emlio_server_t *self, const emlio_shard_t *shard,
              uint64_t record, s_sample_view_t *views, const char **missing)
{
    size_t nf = self->n_fields;
    int rc = 0;
    int64_t label = -1;
    for (size_t f = 0; f < nf; f++)
        views[f].owned = NULL;
    if (shard->kind == EMLIO_SHARD_TAR) {
        for (size_t f = 0; f < nf && rc == 0; f++) {
            const uint8_t *d;
            size_t len;
            rc = emlio__tar_field(shard->tar, (size_t)record, self->fields[f],
                                  &d, &len);
            if (rc == -ENOENT) {
                *missing = self->fields[f];
                rc = S_EMISSING;
            } else if (rc == 0) {
                views[f].data = d;
                views[f].len = len;
            }
        }
        label = emlio__tar_label(shard->tar, (size_t)record, self->label_field);
    } else if (shard->kind == EMLIO_SHARD_IMAGEFOLDER) {
        label = emlio__folder_label(shard->folder);
        for (size_t f = 0; f < nf && rc == 0; f++) {
            if (strcmp(self->fields[f], "image") == 0) {
                uint8_t *d;
                size_t len;
                rc =
                    emlio__folder_read(shard->folder, (size_t)record, &d, &len);
                if (rc == 0) {
                    views[f].owned = d;
                    views[f].data = d;
                    views[f].len = len;
                }
            } else if (strcmp(self->fields[f], "label") == 0) {
                rc = s_int64_view(&views[f], label);
            } else {
                *missing = self->fields[f];
                rc = S_EMISSING;
            }
        }
    } else {
        const uint8_t *rec;
        size_t rec_len;
        uint32_t stored;
        rc = emlio_tfrecord_record(shard->file, (size_t)record, &rec, &rec_len,
                                   &stored);
        if (rc == 0 && self->cfg.verify &&
            emlio_crc32c(0, rec, rec_len) != stored)
            rc = EMLIO_ECORRUPT;
        emlio_example_field_t ex[EMLIO_WIRE_MAX_FIELDS + 1];
        if (rc == 0) {
            memset(ex, 0, sizeof(ex));
            for (size_t f = 0; f < nf; f++) {
                ex[f].key = self->fields[f];
                ex[f].key_len = strlen(self->fields[f]);
            }
            ex[nf].key = self->label_key;
            ex[nf].key_len = self->label_key_len;
            if (emlio_example_parse(rec, rec_len, ex, nf + 1) < 0)
                rc = EMLIO_EFORMAT;
        }
        if (rc == 0 && ex[nf].kind == EMLIO_FEATURE_INT64 && ex[nf].count)
            label = ex[nf].int64;
        for (size_t f = 0; f < nf && rc == 0; f++) {
            if (ex[f].kind == EMLIO_FEATURE_BYTES && ex[f].count) {
                views[f].data = ex[f].bytes;
                views[f].len = ex[f].bytes_len;
            } else if (ex[f].kind == EMLIO_FEATURE_INT64 && ex[f].count) {
                rc = s_int64_view(&views[f], ex[f].int64);
            } else if (ex[f].kind == EMLIO_FEATURE_FLOAT && ex[f].count) {
                uint32_t bits;
                uint8_t le[4];
                memcpy(&bits, &ex[f].f32, 4);
                for (int k = 0; k < 4; k++)
                    le[k] = (uint8_t)(bits >> (8 * k));
                rc = s_number_view(&views[f], le, 4);
            } else {
                *missing = self->fields[f];
                rc = S_EMISSING;
            }
        }
    }
    if (rc < 0) {
        for (size_t f = 0; f < nf; f++) {
            emlio_free(views[f].owned);
            views[f].owned = NULL;
        }
        return rc;
    }
    uint32_t crc = 0;
    for (size_t f = 0; f < nf; f++)
        crc = emlio_crc32c(crc, views[f].data, views[f].len);
    views[0].label = label;
    views[0].crc = crc;
    return 0;
}

static int
s_read_sample(const emlio_server_t *self, const emlio_shard_t *shard,
              uint64_t record, s_sample_view_t *out)
{
    out->owned = NULL;
    if (shard->kind == EMLIO_SHARD_TAR)
        return s_read_tar_sample(self, shard, record, out);
    if (shard->kind == EMLIO_SHARD_IMAGEFOLDER)
        return s_read_folder_sample(shard, record, out);
    const uint8_t *rec;
    size_t rec_len;
    uint32_t stored;
    int rc = emlio_tfrecord_record(shard->file, (size_t)record, &rec, &rec_len,
                                   &stored);
    if (rc < 0)
        return rc;
    out->data = rec;
    out->len = rec_len;
    out->label = -1;
    if (!self->cfg.raw) {
        emlio_example_field_t fields[2] = {
            { .key = self->bytes_key, .key_len = self->bytes_key_len },
            { .key = self->label_key, .key_len = self->label_key_len },
        };
        /* Records that are not Examples, or lack the key, pass as raw. */
        if (emlio_example_parse(rec, rec_len, fields, 2) > 0) {
            if (fields[0].kind == EMLIO_FEATURE_BYTES && fields[0].count) {
                out->data = fields[0].bytes;
                out->len = fields[0].bytes_len;
            }
            if (fields[1].kind == EMLIO_FEATURE_INT64 && fields[1].count)
                out->label = fields[1].int64;
        }
    }
    out->crc = emlio_crc32c(0, out->data, out->len);
    if (self->cfg.verify) {
        size_t before = (size_t)(out->data - rec);
        size_t after = rec_len - before - out->len;
        uint32_t whole = out->crc;
        if (before || after) {
            uint32_t head = emlio_crc32c(0, rec, before);
            uint32_t tail = emlio_crc32c(0, out->data + out->len, after);
            whole = emlio_crc32c_combine(head, out->crc, out->len);
            whole = emlio_crc32c_combine(whole, tail, after);
        }
        if (whole != stored)
            return EMLIO_ECORRUPT;
    }
    return 0;
}

static void
s_free_bytes(void *data, void *hint)
{
    (void)hint;
    emlio_free(data);
}

/* Moves header (detached from its buffer) into a ZeroMQ message. */
static int
s_header_msg(zmq_msg_t *msg, emlio_buf_t *header)
{
    size_t len;
    uint8_t *bytes = emlio_buf_detach(header, &len);
    if (zmq_msg_init_data(msg, bytes, len, s_free_bytes, NULL) != 0) {
        emlio_free(bytes);
        return -errno;
    }
    return 0;
}

/* Sends identity, header and n sample frames as one multipart message.
 * Every message is consumed (sent or closed) whatever happens. */
static int
s_send_parts(void *sock, zmq_msg_t *identity, zmq_msg_t *header,
             zmq_msg_t *frames, size_t n, int flags)
{
    int rc = 0;
    zmq_msg_t *parts[2] = { identity, header };
    for (size_t i = 0; i < 2 + n; i++) {
        zmq_msg_t *part = i < 2 ? parts[i] : &frames[i - 2];
        int more = i + 1 < 2 + n ? ZMQ_SNDMORE : 0;
        if (rc == 0) {
            while (zmq_msg_send(part, sock, more | flags) < 0) {
                if (errno == EINTR)
                    continue;
                rc = -errno;
                break;
            }
            if (rc == 0)
                continue;
        }
        zmq_msg_close(part);
    }
    return rc;
}

static int
s_send_error(void *sock, zmq_msg_t *identity, uint64_t id, int code,
             const char *text, int flags)
{
    emlio_buf_t buf = EMLIO_BUF_INIT;
    zmq_msg_t header;
    if (emlio__wire_encode_error(&buf, id, code, text) < 0 ||
        s_header_msg(&header, &buf) < 0) {
        emlio_buf_release(&buf);
        zmq_msg_close(identity);
        return EMLIO_ENOMEM;
    }
    return s_send_parts(sock, identity, &header, NULL, 0, flags);
}

/* The reader stage: checks the request against the dataset, finds and
 * verifies every record, and leaves views (or an error) in the job. */
static void
s_read_job(emlio_server_t *self, s_job_t *job)
{
    const emlio_wire_msg_t *get = &job->msg;
    size_t n = get->n_items;
    size_t per = self->n_fields ? self->n_fields : 1; /* frames per sample */
    job->per = per;
    job->views = emlio_calloc(n ? n * per : 1, sizeof(*job->views));
    if (!job->views) {
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
        return;
    }
    if (get->dataset &&
        (get->dataset_len != strlen(self->set.fingerprint) ||
         memcmp(get->dataset, self->set.fingerprint, get->dataset_len))) {
        job->code = EMLIO_EMISMATCH;
        snprintf(job->text, sizeof(job->text),
                 "dataset changed: client expects '%.*s', server has '%s'",
                 (int)EMLIO_MIN(get->dataset_len, 64), get->dataset,
                 self->set.fingerprint);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const emlio_wire_item_t *item = &get->items[i];
        if (item->shard >= self->set.n) {
            job->code = EMLIO_ENOTFOUND;
            snprintf(job->text, sizeof(job->text),
                     "no shard %" PRIu32 " (server has %zu)", item->shard,
                     self->set.n);
            return;
        }
        const emlio_shard_t *shard = &self->set.shards[item->shard];
        s_sample_view_t *view = &job->views[job->n_views * per];
        const char *missing = self->field ? self->field : "(image)";
        int rc = self->n_fields
                     ? s_read_fields(self, shard, item->record, view, &missing)
                     : s_read_sample(self, shard, item->record, view);
        if (rc == S_EMISSING && self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP) {
            atomic_fetch_add(&self->corrupt_skipped, 1);
            emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                      "skipping sample %" PRIu64 " of '%s' at offset "
                      "%" PRIu64 ": no field '%s'",
                      item->record, shard->name,
                      emlio__shard_offset(shard, item->record), missing);
            continue;
        }
        if (rc == EMLIO_ECORRUPT &&
            self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP) {
            atomic_fetch_add(&self->corrupt_skipped, 1);
            emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                      "skipping corrupt record %" PRIu64 " of '%s' at offset "
                      "%" PRIu64,
                      item->record, shard->name,
                      emlio__shard_offset(shard, item->record));
            continue;
        }
        if (rc < 0) {
            job->code = rc == S_EMISSING ? EMLIO_EFORMAT : rc;
            if (rc == EMLIO_ENOTFOUND)
                snprintf(job->text, sizeof(job->text),
                         "no record %" PRIu64 " in shard '%s' (%zu records)",
                         item->record, shard->name, emlio__shard_count(shard));
            else if (rc == S_EMISSING)
                snprintf(job->text, sizeof(job->text),
                         "sample %" PRIu64 " of shard '%s' at offset %" PRIu64
                         " has no field '%s'",
                         item->record, shard->name,
                         emlio__shard_offset(shard, item->record), missing);
            else if (shard->kind == EMLIO_SHARD_IMAGEFOLDER)
                snprintf(job->text, sizeof(job->text),
                         "%s file '%s/%s' (record %" PRIu64 ")",
                         rc == EMLIO_EFORMAT ? "changed" : "unreadable",
                         shard->name,
                         emlio__folder_file(shard->folder, item->record),
                         item->record);
            else
                snprintf(job->text, sizeof(job->text),
                         "%s record %" PRIu64 " in shard '%s' at offset "
                         "%" PRIu64,
                         rc == EMLIO_ECORRUPT ? "corrupt" : "unreadable",
                         item->record, shard->name,
                         emlio__shard_offset(shard, item->record));
            return;
        }
        for (size_t f = 0; f < per; f++) {
            view[f].shard = item->shard;
            view[f].record = item->record;
        }
        job->n_views++;
    }
}

/* The serializer stage: turns the reader's views into the BATCH header and
 * one zero-copy frame per sample (or the ERROR), and hands the reply to
 * the frontend. Consumes job->identity. */
static void
s_serialize_job(emlio_server_t *self, void *done, s_job_t *job)
{
    const emlio_wire_msg_t *get = &job->msg;
    size_t n = job->n_views;
    size_t per = self->n_fields ? self->n_fields : 1; /* frames per sample */
    size_t nf = n * per;
    emlio_wire_sample_t *samples = NULL;
    zmq_msg_t *frames = NULL;
    s_release_t *rel = NULL;
    size_t made = 0;
    uint64_t bytes = 0;
    if (job->code == 0) {
        samples = emlio_calloc(n ? n : 1, sizeof(*samples));
        frames = emlio_calloc(nf ? nf : 1, sizeof(*frames));
        rel = emlio_malloc(sizeof(*rel) + nf * sizeof(rel->items[0]));
        if (!samples || !frames || !rel) {
            job->code = EMLIO_ENOMEM;
            snprintf(job->text, sizeof(job->text), "out of memory");
        }
    }
    if (job->code == 0) {
        rel->server = self;
        rel->n = nf;
        atomic_init(&rel->left, (unsigned)(nf ? nf : 1));
        atomic_fetch_add(&self->batches_in_flight, 1);
        for (size_t i = 0; i < nf; i++) {
            const s_sample_view_t *v = &job->views[i];
            rel->items[i] = *v;
            job->views[i].owned = NULL; /* rel frees it with the batch */
            /* Zero-copy: the frame points into the mapping. */
            zmq_msg_init_data(&frames[i], (void *)v->data, v->len, s_frame_free,
                              rel);
            if (i % per == 0)
                samples[i / per] = (emlio_wire_sample_t){ v->shard, v->record,
                                                          v->label, v->crc };
            bytes += v->len;
        }
        made = nf;
        emlio_buf_t buf = EMLIO_BUF_INIT;
        zmq_msg_t header;
        if (emlio__wire_encode_batch(&buf, get->id, samples, n) == 0 &&
            s_header_msg(&header, &buf) == 0) {
            if (nf == 0) /* no frame will release it */
                s_frame_free(NULL, rel);
            s_send_parts(done, &job->identity, &header, frames, nf, 0);
            atomic_fetch_add(&self->requests, 1);
            atomic_fetch_add(&self->samples, n);
            atomic_fetch_add(&self->bytes, bytes);
            emlio_free(frames);
            emlio_free(samples);
            return;
        }
        emlio_buf_release(&buf);
        job->code = EMLIO_ENOMEM;
        snprintf(job->text, sizeof(job->text), "out of memory");
    }
    for (size_t i = 0; i < made; i++)
        zmq_msg_close(&frames[i]); /* the last close frees rel */
    if (!made)
        emlio_free(rel);
    atomic_fetch_add(&self->errors, 1);
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "request %" PRIu64 ": %s",
              get->id, job->text);
    s_send_error(done, &job->identity, get->id, job->code, job->text, 0);
    emlio_free(frames);
    emlio_free(samples);
}

static void
s_job_free(s_job_t *job)
{
    if (!job)
        return;
    /* Views a batch did not take (an error reply); the per-sample frame
     * count is not known here, so every slot that may hold one is freed
     * (calloc'd, so the rest are NULL). */
    for (size_t i = 0; job->views && i < job->n_views * job->per; i++)
        emlio_free(job->views[i].owned);
    emlio_free(job->views);
    emlio__wire_msg_release(&job->msg);
    zmq_msg_close(&job->header);
    emlio_free(job);
}

static void
s_job_drop(s_job_t *job)
{
    zmq_msg_close(&job->identity);
    s_job_free(job);
}

/* A reader thread: jobs from the frontend (over inproc), views into the
 * serializers' bounded queue. Blocking on a full queue is the daemon's
 * backpressure. */
static void *
s_reader_main(void *arg)
{
    emlio_server_t *self = arg;
    void *work = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PULL);
    int timeout = S_STOP_POLL_MS;
    if (!work)
        return NULL;
    zmq_setsockopt(work, ZMQ_RCVTIMEO, &timeout, sizeof(timeout));
    if (zmq_connect(work, self->inproc_work) != 0)
        goto out;
    while (!atomic_load(&self->stopping)) {
        s_job_t *job;
        int n = zmq_recv(work, &job, sizeof(job), 0);
        if (n != (int)sizeof(job))
            continue; /* timeout or EINTR: look at the stop flag again */
        s_read_job(self, job);
        if (emlio__queue_push(self->ser_queue, job) < 0)
            s_job_drop(job);
    }
    /* Free the jobs still queued for us; their clients will ask again. */
    for (;;) {
        s_job_t *job;
        if (zmq_recv(work, &job, sizeof(job), ZMQ_DONTWAIT) != (int)sizeof(job))
            break;
        s_job_drop(job);
    }
out:
    zmq_close(work);
    return NULL;
}

/* A serializer thread: views from the queue, replies to the frontend. */
static void *
s_serializer_main(void *arg)
{
    emlio_server_t *self = arg;
    void *done = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PUSH);
    int timeout = S_STOP_POLL_MS;
    int zero = 0;
    if (!done)
        return NULL;
    /* A reply that cannot be handed over while stopping is dropped rather
     * than blocking the join. */
    zmq_setsockopt(done, ZMQ_SNDTIMEO, &timeout, sizeof(timeout));
    zmq_setsockopt(done, ZMQ_SNDHWM, &zero, sizeof(zero));
    zmq_setsockopt(done, ZMQ_LINGER, &zero, sizeof(zero));
    bool connected = zmq_connect(done, self->inproc_done) == 0;
    void *item;
    while (emlio__queue_pop(self->ser_queue, &item) == 0) {
        s_job_t *job = item;
        if (!connected || atomic_load(&self->stopping)) {
            s_job_drop(job);
            continue;
        }
        s_serialize_job(self, done, job); /* consumes job->identity */
        s_job_free(job);
    }
    zmq_close(done);
    return NULL;
}

/* ---- the frontend: the only thread that touches the TCP socket -------- */

/* Forgets connections that have nothing outstanding and were not heard
 * from for idle_timeout_ms; ZeroMQ heartbeats already closed dead TCP
 * connections, this trims the bookkeeping behind them. */
/* Connections of session (0 never matches: session-less peers are each
 * their own client). */
static size_t
s_session_streams(const emlio_server_t *self, uint64_t session)
{
    size_t n = 0;
    for (size_t i = 0; session && i < self->n_peers; i++)
        n += self->peers[i].session == session;
    return n;
}

/* Forgets peer i; the client count drops with its session's last one. */
static void
s_peer_remove(emlio_server_t *self, size_t i)
{
    uint64_t session = self->peers[i].session;
    self->peers[i] = self->peers[--self->n_peers];
    if (!session || !s_session_streams(self, session))
        self->n_clients--;
}

static void
s_peers_expire(emlio_server_t *self, uint64_t now)
{
    uint64_t idle = (uint64_t)self->cfg.idle_timeout_ms * 1000000ull;
    for (size_t i = 0; i < self->n_peers;) {
        s_peer_t *peer = &self->peers[i];
        if (!peer->outstanding && now - peer->last_seen_ns > idle)
            s_peer_remove(self, i);
        else
            i++;
    }
}

/* The bookkeeping of one client connection (a ZeroMQ routing id). With add,
 * an unknown connection is registered, as part of `session` when that
 * session is known (a client's extra stream: admitted with it, up to
 * EMLIO_WIRE_MAX_STREAMS), else as a new client unless max_clients are
 * already known; NULL then means "refuse it". */
static s_peer_t *
s_peer_add(emlio_server_t *self, const uint8_t *id, size_t len, bool add,
           uint64_t session)
{
    uint64_t now = emlio__now_ns();
    for (size_t i = 0; i < self->n_peers; i++)
        if (self->peers[i].id_len == len &&
            !memcmp(self->peers[i].id, id, len)) {
            self->peers[i].last_seen_ns = now;
            return &self->peers[i];
        }
    if (!add || len > S_MAX_IDENTITY)
        return NULL;
    size_t streams = s_session_streams(self, session);
    if (streams >= EMLIO_WIRE_MAX_STREAMS)
        return NULL;
    if (!streams && self->n_clients >= self->cfg.max_clients) {
        s_peers_expire(self, now);
        if (self->n_clients >= self->cfg.max_clients)
            return NULL;
    }
    if (self->n_peers == self->cap_peers) {
        size_t cap = self->cap_peers ? self->cap_peers * 2 : 16;
        s_peer_t *peers = emlio_reallocarray(self->peers, cap, sizeof(*peers));
        if (!peers)
            return NULL;
        self->peers = peers;
        self->cap_peers = cap;
    }
    if (!streams)
        self->n_clients++;
    s_peer_t *peer = &self->peers[self->n_peers++];
    memcpy(peer->id, id, len);
    peer->id_len = (uint8_t)len;
    peer->outstanding = 0;
    peer->last_seen_ns = now;
    peer->session = session;
    peer->stalled = false;
    return peer;
}

static s_peer_t *
s_peer_find(emlio_server_t *self, const uint8_t *id, size_t len, bool add)
{
    return s_peer_add(self, id, len, add, 0);
}

static void
s_frontend_reply_error(emlio_server_t *self, zmq_msg_t *identity, uint64_t id,
                       int code, const char *text)
{
    atomic_fetch_add(&self->errors, 1);
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", text);
    s_peer_t *peer = s_peer_find(self, zmq_msg_data(identity),
                                 zmq_msg_size(identity), false);
    if (s_send_error(self->router, identity, id, code, text, ZMQ_DONTWAIT) ==
            -EAGAIN &&
        peer)
        peer->stalled = true;
}

/* Plan-driven readahead: the client asks for batches well before it needs
 * them, so telling the kernel now which records are coming (runs of
 * consecutive records coalesced into one madvise) overlaps the disk with
 * the work on earlier batches. Items are checked later; bad ones are
 * skipped here. */
static void
s_readahead(emlio_server_t *self, const emlio_wire_msg_t *get)
{
    size_t i = 0;
    while (i < get->n_items) {
        const emlio_wire_item_t *first = &get->items[i];
        size_t run = 1;
        while (i + run < get->n_items &&
               get->items[i + run].shard == first->shard &&
               get->items[i + run].record == first->record + run)
            run++;
        if (first->shard < self->set.n) {
            const emlio_shard_t *shard = &self->set.shards[first->shard];
            size_t count = emlio__shard_count(shard);
            if (first->record < count)
                emlio__shard_advise(shard, (size_t)first->record,
                                    EMLIO_MIN(run, count - first->record),
                                    EMLIO_ADVISE_WILLNEED);
        }
        i += run;
    }
}

/* HELLO: admits the connection (alone, or into its client's session) and
 * answers WELCOME: the whole inventory for a session's first stream, the
 * short "joined" form for its further streams. */
static void
s_frontend_hello(emlio_server_t *self, s_job_t *job)
{
    const emlio_wire_msg_t *hello = &job->msg;
    const uint8_t *id = zmq_msg_data(&job->identity);
    size_t id_len = zmq_msg_size(&job->identity);
    s_peer_t *peer = s_peer_find(self, id, id_len, false);
    if (!peer) {
        bool joining =
            hello->session && s_session_streams(self, hello->session) > 0;
        peer = s_peer_add(self, id, id_len, true, hello->session);
        if (!peer) {
            char text[160];
            if (joining)
                snprintf(text, sizeof(text),
                         "too many streams in one client session (limit %u)",
                         EMLIO_WIRE_MAX_STREAMS);
            else
                snprintf(text, sizeof(text),
                         "too many clients (limit %" PRIu32 ")",
                         self->cfg.max_clients);
            s_frontend_reply_error(self, &job->identity, hello->id,
                                   EMLIO_ELIMIT, text);
            return;
        }
    } else if (hello->session && peer->session != hello->session) {
        /* A connection says HELLO again under a session (a client that
         * reconnected its stream 0 first): it becomes part of it. */
        uint64_t old = peer->session;
        if (s_session_streams(self, hello->session) > 0 &&
            (!old || s_session_streams(self, old) == 1))
            self->n_clients--;
        peer->session = hello->session;
    }
    zmq_msg_t welcome;
    if (hello->session && hello->stream > 0) {
        emlio_buf_t joined = EMLIO_BUF_INIT;
        if (emlio__wire_encode_joined_v(&joined, hello->version, hello->id,
                                        self->set.fingerprint) < 0 ||
            zmq_msg_init_size(&welcome, joined.len) != 0) {
            emlio_buf_release(&joined);
            zmq_msg_close(&job->identity);
            return;
        }
        memcpy(zmq_msg_data(&welcome), joined.data, joined.len);
        emlio_buf_release(&joined);
    } else {
        /* The encoded WELCOME lives as long as the server: no copy. */
        const emlio_buf_t *w =
            hello->version >= 2 ? &self->welcome2 : &self->welcome;
        zmq_msg_init_data(&welcome, w->data, w->len, NULL, NULL);
        atomic_fetch_add(&self->clients, 1);
    }
    s_send_parts(self->router, &job->identity, &welcome, NULL, 0, ZMQ_DONTWAIT);
}

/* Handles one client message: HELLO answered here, GET passed to a reader. */
static void
s_frontend_request(emlio_server_t *self, void *work)
{
    s_job_t *job = emlio_calloc(1, sizeof(*job));
    if (!job) {
        emlio__zmq_drain(self->router);
        return;
    }
    zmq_msg_init(&job->identity);
    zmq_msg_init(&job->header);
    if (zmq_msg_recv(&job->identity, self->router, ZMQ_DONTWAIT) < 0)
        goto drop;
    if (!zmq_msg_more(&job->identity) ||
        zmq_msg_recv(&job->header, self->router, 0) < 0)
        goto drop;
    if (zmq_msg_more(&job->header)) {
        emlio__zmq_drain(self->router);
        s_frontend_reply_error(self, &job->identity, 0, EMLIO_EPROTO,
                               "requests are a single header frame");
        goto drop_header;
    }
    /* A connection that stopped reading (a reply to it could not even be
     * queued) and is at its credit limit gets its requests dropped before
     * any decoding and without a reply: a flood then costs the frontend
     * almost nothing and cannot outrun it (the receive queue is unbounded:
     * see emlio_server_bind). A reading client is never affected: it always
     * gets one reply per request. */
    s_peer_t *known = s_peer_find(self, zmq_msg_data(&job->identity),
                                  zmq_msg_size(&job->identity), false);
    if (known && known->stalled && known->outstanding >= self->cfg.max_credit) {
        atomic_fetch_add(&self->errors, 1);
        goto drop;
    }
    char err[EMLIO_ERRMSG_LEN];
    int rc = emlio__wire_decode(&job->msg, zmq_msg_data(&job->header),
                                zmq_msg_size(&job->header), self->cfg.max_batch,
                                err);
    if (rc < 0) {
        char text[EMLIO_ERRMSG_LEN + 32];
        snprintf(text, sizeof(text), "bad request: %s", err);
        s_frontend_reply_error(self, &job->identity, 0, EMLIO_EPROTO, text);
        goto drop_header;
    }
    if (job->msg.type == EMLIO_MSG_HELLO) {
        if (job->msg.version < EMLIO_WIRE_VERSION_MIN ||
            job->msg.version > EMLIO_WIRE_VERSION) {
            char text[128];
            snprintf(text, sizeof(text),
                     "protocol version %" PRIu64 " not supported (server "
                     "speaks %d to %d)",
                     job->msg.version, EMLIO_WIRE_VERSION_MIN,
                     EMLIO_WIRE_VERSION);
            s_frontend_reply_error(self, &job->identity, 0, EMLIO_EVERSION,
                                   text);
            goto drop_header;
        }
        if (job->msg.version < 2 && self->n_fields) {
            /* A v1 client would read the frames of one sample's fields as
             * several samples: refuse it clearly instead. */
            char text[EMLIO_ERRMSG_LEN];
            snprintf(text, sizeof(text),
                     "protocol version 1 not supported: this daemon serves "
                     "multi-field samples (--fields %.300s), which need "
                     "protocol version 2; upgrade the client",
                     self->fields_spec);
            s_frontend_reply_error(self, &job->identity, 0, EMLIO_EVERSION,
                                   text);
            goto drop_header;
        }
        s_frontend_hello(self, job);
        goto drop_header;
    }
    if (job->msg.type != EMLIO_MSG_GET) {
        s_frontend_reply_error(self, &job->identity, job->msg.id, EMLIO_EPROTO,
                               "unexpected message type from a client");
        goto drop_header;
    }
    s_peer_t *peer = s_peer_find(self, zmq_msg_data(&job->identity),
                                 zmq_msg_size(&job->identity), true);
    if (!peer || peer->outstanding >= self->cfg.max_credit) {
        char text[128];
        if (!peer)
            snprintf(text, sizeof(text),
                     "too many client connections (limit %" PRIu32 ")",
                     self->cfg.max_clients);
        else
            snprintf(text, sizeof(text),
                     "too many outstanding requests (limit %" PRIu32 ")",
                     self->cfg.max_credit);
        s_frontend_reply_error(self, &job->identity, job->msg.id, EMLIO_ELIMIT,
                               text);
        goto drop_header;
    }
    peer->outstanding++;
    if (self->cfg.readahead)
        s_readahead(self, &job->msg);
    if (zmq_send(work, &job, sizeof(job), 0) != (int)sizeof(job)) {
        peer->outstanding--;
        goto drop;
    }
    return; /* the worker owns the job now */
drop:
    zmq_msg_close(&job->identity);
drop_header:
    s_job_free(job);
}

/* Forwards one finished reply from a worker to its client. */
static void
s_frontend_reply(emlio_server_t *self, void *done)
{
    zmq_msg_t identity;
    zmq_msg_init(&identity);
    if (zmq_msg_recv(&identity, done, ZMQ_DONTWAIT) < 0) {
        zmq_msg_close(&identity);
        return;
    }
    s_peer_t *peer = s_peer_find(self, zmq_msg_data(&identity),
                                 zmq_msg_size(&identity), false);
    bool lost = false;
    int more = 1;
    if (zmq_msg_send(&identity, self->router, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0) {
        /* EHOSTUNREACH: the client went away; a reconnecting client asks
         * again (GET is idempotent). EAGAIN: its queue is full, which a
         * client within its credits never causes, so it sends without
         * reading: the credit stays used up, and once all are, its further
         * requests are dropped before any work is done for them. */
        if (errno == EAGAIN && peer) {
            peer->stalled = true;
            peer = NULL;
        }
        zmq_msg_close(&identity);
        lost = true;
    }
    if (peer && peer->outstanding)
        peer->outstanding--;
    while (more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, done, 0) < 0) {
            zmq_msg_close(&part);
            break;
        }
        more = zmq_msg_more(&part);
        if (lost || zmq_msg_send(&part, self->router,
                                 (more ? ZMQ_SNDMORE : 0) | ZMQ_DONTWAIT) < 0) {
            lost = true;
            zmq_msg_close(&part);
        }
    }
}

static void *
s_frontend_main(void *arg)
{
    emlio_server_t *self = arg;
    void *work = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PUSH);
    void *done = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PULL);
    int zero = 0;
    zmq_setsockopt(work, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(done, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_setsockopt(done, ZMQ_RCVHWM, &zero, sizeof(zero));
    zmq_setsockopt(work, ZMQ_SNDHWM, &zero, sizeof(zero));
    if (zmq_bind(work, self->inproc_work) != 0 ||
        zmq_bind(done, self->inproc_done) != 0) {
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "cannot bind internal sockets: %s", zmq_strerror(errno));
        goto out;
    }
    zmq_pollitem_t items[3] = {
        { self->router, 0, ZMQ_POLLIN, 0 },
        { done, 0, ZMQ_POLLIN, 0 },
        { self->monitor, 0, ZMQ_POLLIN, 0 },
    };
    uint64_t last_expire = emlio__now_ns();
    while (!atomic_load(&self->stopping)) {
        uint64_t now = emlio__now_ns();
        if (now - last_expire > 1000000000ull) {
            s_peers_expire(self, now);
            atomic_store(&self->active_clients, self->n_clients);
            atomic_store(&self->active_streams, self->n_peers);
            last_expire = now;
        }
        if (zmq_poll(items, self->monitor ? 3 : 2, S_STOP_POLL_MS) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (self->monitor && (items[2].revents & ZMQ_POLLIN))
            s_frontend_monitor(self);
        /* Replies first: finished batches free credits and memory. */
        for (int i = 0; i < 256 && (items[1].revents & ZMQ_POLLIN); i++) {
            s_frontend_reply(self, done);
            int events = 0;
            size_t len = sizeof(events);
            zmq_getsockopt(done, ZMQ_EVENTS, &events, &len);
            items[1].revents = (short)(events & ZMQ_POLLIN);
        }
        for (int i = 0; i < 256 && (items[0].revents & ZMQ_POLLIN); i++) {
            s_frontend_request(self, work);
            int events = 0;
            size_t len = sizeof(events);
            zmq_getsockopt(self->router, ZMQ_EVENTS, &events, &len);
            items[0].revents = (short)(events & ZMQ_POLLIN);
        }
    }
out:
    zmq_close(work);
    zmq_close(done);
    return NULL;
}

int
emlio_server_start(emlio_server_t *self)
{
    assert(self);
    if (!self->loaded || !self->router)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "server must be loaded and bound before start");
    if (self->frontend_started)
        return emlio__seterr(self->err, EMLIO_EINVAL, "server already started");
    int rc = s_encode_welcome(self);
    if (rc < 0)
        return rc;
    snprintf(self->inproc_work, sizeof(self->inproc_work),
             "inproc://emlio-work-%p", (void *)self);
    snprintf(self->inproc_done, sizeof(self->inproc_done),
             "inproc://emlio-done-%p", (void *)self);
    atomic_store(&self->stopping, false);
    uint32_t n = self->cfg.workers + self->cfg.serializers;
    self->workers = emlio_calloc(n, sizeof(*self->workers));
    self->ser_queue = emlio__queue_new(self->cfg.queue_depth);
    if (!self->workers || !self->ser_queue)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    rc = pthread_create(&self->frontend, NULL, s_frontend_main, self);
    if (rc != 0)
        return emlio__seterr(self->err, -rc, "cannot start frontend thread: %s",
                             strerror(rc));
    self->frontend_started = true;
    for (uint32_t i = 0; i < n; i++) {
        bool reader = i < self->cfg.workers;
        rc = pthread_create(&self->workers[i], NULL,
                            reader ? s_reader_main : s_serializer_main, self);
        if (rc != 0) {
            emlio_server_stop(self);
            return emlio__seterr(self->err, -rc, "cannot start %s thread: %s",
                                 reader ? "reader" : "serializer",
                                 strerror(rc));
        }
        self->n_workers_started++;
    }
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "serving on %s with %" PRIu32 " readers, %" PRIu32
              " serializers%s%s",
              self->endpoint, self->cfg.workers, self->cfg.serializers,
              self->cfg.readahead ? ", readahead" : "",
              self->cfg.drop_behind ? ", drop-behind" : "");
    return 0;
}

void
emlio_server_stop(emlio_server_t *self)
{
    if (!self || !self->frontend_started)
        return;
    atomic_store(&self->stopping, true);
    /* The frontend goes first so that no new job reaches a reader after the
     * reader has drained its inproc queue; readers next, so that nothing
     * is pushed after the serializers' queue closes. */
    pthread_join(self->frontend, NULL);
    uint32_t readers = EMLIO_MIN(self->n_workers_started, self->cfg.workers);
    for (uint32_t i = 0; i < readers; i++)
        pthread_join(self->workers[i], NULL);
    emlio__queue_close(self->ser_queue);
    for (uint32_t i = readers; i < self->n_workers_started; i++)
        pthread_join(self->workers[i], NULL);
    emlio__queue_destroy(&self->ser_queue);
    self->n_workers_started = 0;
    self->frontend_started = false;
}

void
emlio_server_stats(const emlio_server_t *self, emlio_server_stats_t *out)
{
    out->requests = atomic_load(&self->requests);
    out->errors = atomic_load(&self->errors);
    out->samples = atomic_load(&self->samples);
    out->bytes = atomic_load(&self->bytes);
    out->corrupt_skipped = atomic_load(&self->corrupt_skipped);
    out->clients = atomic_load(&self->clients);
    out->active_clients = atomic_load(&self->active_clients);
    out->active_streams = atomic_load(&self->active_streams);
    out->auth_refused = emlio__zap_refused(self->zap);
}

size_t
emlio_server_shard_count(const emlio_server_t *self)
{
    return self->set.n;
}

uint64_t
emlio_server_record_count(const emlio_server_t *self)
{
    return self->set.records;
}

const char *
emlio_server_dataset(const emlio_server_t *self)
{
    return self->set.fingerprint;
}

const char *
emlio_server_errmsg(const emlio_server_t *self)
{
    return self->err;
}
