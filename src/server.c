/* server.c - emlio_server_t: serves the shards of one directory over ZeroMQ.
 * One frontend thread owns the ROUTER socket; worker threads build batches.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
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
#define S_STOP_POLL_MS                      100
/* The longest a destroy waits for ZeroMQ to release frames that point into
 * the shard mappings; after that the mappings stay until the frames go. */
#define S_RELEASE_WAIT_MS                   2000
#define S_MAX_IDENTITY                      255
/* How long a shard whose lease is being broken waits for its frames in
 * flight before their pages are blanked and the writer may go on. */
#define S_LEASE_GRACE_MS                    5000
/* Log "out of file descriptors" at most this often (ms). */
#define S_FD_LOG_MS                         10000
/* The largest request a daemon accepts, for max_batch samples per GET. */
#define EMLIO_SERVER_MAX_REQUEST(max_batch) (4096 + (int64_t)(max_batch)*24)

/* One GET on its way through the pipeline: frontend -> reader ->
 * serializer -> frontend. */
typedef struct s_job {
    zmq_msg_t identity;
    zmq_msg_t header; /* kept alive: msg borrows strings from it */
    emlio_wire_msg_t msg;
    emlio__view_t *views; /* filled by the reader; skipped ones left out */
    size_t n_views;
    size_t per; /* views per sample (fields), set by the reader */
    int code;   /* the reader's verdict: 0, or the error to answer with */
    char text[EMLIO_ERRMSG_LEN];
} s_job_t;

/* What zero-copy frames point into, and so what must outlive every frame
 * ZeroMQ holds: the shards and their mappings. The server holds one
 * reference and every sent batch one more, so emlio_server_destroy never
 * frees what a ZeroMQ I/O thread may still read or call back into. */
typedef struct s_core {
    atomic_uint refs;
    bool drop_behind;
    emlio_shardset_t set;
    /* Sent batches whose frames ZeroMQ still holds. */
    atomic_uint_fast64_t batches_in_flight;
} s_core_t;

/* Lives as long as ZeroMQ holds any frame of one sent batch: the mapping
 * must stay, and with drop_behind its pages are let go after the last. */
typedef struct s_release {
    s_core_t *core;
    atomic_uint left;
    size_t n;
    emlio__view_t items[]; /* only shard, record and held are used */
} s_release_t;

/* One TCP (or IPC) connection of the ROUTER, known from the socket
 * monitor by its file descriptor. */
typedef struct s_conn {
    int fd;
    uint64_t last_seen_ns;
    bool closing; /* shut down by us; waiting for ZeroMQ to notice */
} s_conn_t;

/* Outstanding GETs of one client (by ZeroMQ routing id). */
typedef struct s_peer {
    uint8_t id[S_MAX_IDENTITY];
    uint8_t id_len;
    uint32_t outstanding;
    uint64_t last_seen_ns;
    int fd;           /* its connection (ZMQ_SRCFD), -1 when unknown */
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
    s_core_t *core; /* shards and mappings, shared with frames in flight */
    emlio__read_opts_t rd; /* what readers ask of the formats (load) */
    bool loaded;
    emlio_buf_t welcome;
    void *router;
    void *monitor; /* PAIR receiving the ROUTER's connection events */
    void *work;    /* frontend -> readers (bound in start) */
    void *done;    /* serializers -> frontend (bound in start) */
    char inproc_monitor[64];
    int bound_port; /* TCP port of the router, -1 for other transports */
    char endpoint[256];
    char inproc_work[64];
    char inproc_done[64];
    pthread_t frontend;
    pthread_t *workers; /* cfg.workers readers, then the serializers */
    emlio_queue_t *ser_queue;
    uint32_t n_workers_started;
    bool frontend_started;
    atomic_bool stopping;
    /* Frontend-thread state. */
    s_peer_t *peers;
    size_t n_peers;
    size_t cap_peers;
    size_t n_clients; /* sessions, counting a session-less peer as one */
    emlio_netpath_bufplan_t sndbuf;
    s_conn_t *conns;
    size_t n_conns;
    size_t cap_conns;
    int cur_fd;          /* connection of the message being handled */
    uint64_t err_log_ns; /* rate limit of refused-request lines */
    uint64_t err_log_n;
    uint64_t err_log_quiet;
    uint64_t fd_log_ns;     /* last "out of file descriptors" line */
    uint64_t accept_failed; /* accepts refused since that line */
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
    self->bound_port = -1;
    self->core = emlio_calloc(1, sizeof(*self->core));
    if (!self->core) {
        emlio_free(self);
        return NULL;
    }
    atomic_init(&self->core->refs, 1);
    atomic_init(&self->core->batches_in_flight, 0);
    self->core->drop_behind = cfg->drop_behind;
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

/* Closes a socket with linger 0 (nothing we send is worth waiting for
 * after a stop) and NULLs the caller's pointer. */
static void
s_close_socket(void **sock_p)
{
    if (!*sock_p)
        return;
    int zero = 0;
    (void)zmq_setsockopt(*sock_p, ZMQ_LINGER, &zero, sizeof(zero));
    zmq_close(*sock_p);
    *sock_p = NULL;
}

/* Sets one socket option; on failure fills errbuf naming the option. */
static int
s_setopt(void *sock, int option, const void *value, size_t len,
         const char *what, char *errbuf)
{
    if (zmq_setsockopt(sock, option, value, len) == 0)
        return 0;
    int err = errno;
    return emlio__seterr(errbuf, -err, "cannot set %s: %s", what,
                         zmq_strerror(err));
}

static int
s_setopt_int(void *sock, int option, int value, const char *what, char *errbuf)
{
    return s_setopt(sock, option, &value, sizeof(value), what, errbuf);
}

/* Drops one reference to the core; the last one unmaps the shards. */
static void
s_core_unref(s_core_t **core_p)
{
    s_core_t *core = *core_p;
    *core_p = NULL;
    if (!core || atomic_fetch_sub(&core->refs, 1) != 1)
        return;
    emlio__shardset_release(&core->set);
    emlio_free(core);
}

/* Waits (bounded) until ZeroMQ has released every zero-copy frame, so the
 * mappings go away with the server rather than with ZeroMQ's last frame. */
static bool
s_wait_batches_released(const s_core_t *core)
{
    uint64_t deadline = emlio__now_ns() + S_RELEASE_WAIT_MS * 1000000ull;
    while (atomic_load(&core->batches_in_flight) > 0) {
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
    /* Stop the monitor before closing its reader: libzmq would otherwise
     * keep events for a socket that is gone. */
    if (self->router && self->monitor)
        (void)zmq_socket_monitor(self->router, NULL, 0);
    s_close_socket(&self->monitor);
    s_close_socket(&self->work);
    s_close_socket(&self->done);
    s_close_socket(&self->router);
    emlio__queue_destroy(&self->ser_queue); /* from a start that failed */
    if (self->core && !s_wait_batches_released(self->core))
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                  "%" PRIuFAST64 " sent batches still held by zeromq; the "
                  "shards stay mapped until it releases them",
                  atomic_load(&self->core->batches_in_flight));
    /* Frames still held keep their own references to the core. */
    s_core_unref(&self->core);
    emlio__zap_stop(&self->zap);
    emlio_buf_release(&self->welcome);
    emlio_free(self->peers);
    emlio_free(self->conns);
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
    const emlio_shardset_t *set = &self->core->set;
    emlio_wire_shard_t *inv = emlio_calloc(set->n, sizeof(*inv));
    if (!inv)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < set->n; i++) {
        inv[i].name = set->shards[i].name;
        inv[i].name_len = strlen(inv[i].name);
        inv[i].records = emlio__shard_count(&set->shards[i]);
        inv[i].bytes = emlio__shard_size(&set->shards[i]);
    }
    emlio_buf_clear(&self->welcome);
    emlio_buf_clear(&self->welcome2);
    int rc = emlio__wire_encode_welcome_v(
        &self->welcome, 1, self->name, set->fingerprint, self->cfg.max_batch,
        self->cfg.max_credit, EMLIO_WIRE_MAX_STREAMS, self->sndbuf.effective,
        inv, set->n, NULL, 0);
    if (rc == 0)
        rc = emlio__wire_encode_welcome_v(
            &self->welcome2, 2, self->name, set->fingerprint,
            self->cfg.max_batch, self->cfg.max_credit, EMLIO_WIRE_MAX_STREAMS,
            self->sndbuf.effective, inv, set->n, self->fields, self->n_fields);
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
        for (size_t i = 0; i < self->core->set.n && !found; i++) {
            const emlio_shard_t *shard = &self->core->set.shards[i];
            int has = shard->ops->has_field(shard, want);
            found = has > 0;
            unknown |= has < 0; /* Example keys: checked per record */
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
    /* With --on-corrupt skip a record whose data is corrupt must not stop
     * the daemon from starting: the scan checks the framing only; the data
     * CRC is checked on every read, and each skipped record is logged. */
    bool skip = self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    emlio_shardset_opts_t opts = {
        .format = self->cfg.format,
        .mixed_formats = self->cfg.mixed_formats,
        .verify_data = self->cfg.verify && !skip,
        .write_index = self->cfg.write_index,
        .lease = true,
    };
    int rc = s_parse_fields(self);
    if (rc < 0)
        return rc;
    self->rd = (emlio__read_opts_t){
        .field = self->field,
        .label_field = self->label_field,
        .bytes_key = self->bytes_key,
        .bytes_key_len = self->bytes_key_len,
        .label_key = self->label_key,
        .label_key_len = self->label_key_len,
        .fields = self->fields,
        .n_fields = self->n_fields,
        .raw = self->cfg.raw,
        .verify = self->cfg.verify,
        .log = s_shardset_log,
        .userdata = self,
    };
    rc = emlio__shardset_load(&self->core->set, self->data_dir, &opts,
                              s_shardset_log, self, self->err);
    if (rc < 0)
        return rc;
    rc = s_check_fields(self);
    if (rc < 0) {
        emlio__shardset_release(&self->core->set);
        return rc;
    }
    const emlio_shardset_t *set = &self->core->set;
    if (set->leased < set->mapped)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "%zu of %zu mapped shards could not be leased (open for "
                  "writing elsewhere, or no lease support): they are read by "
                  "copying",
                  set->mapped - set->leased, set->mapped);
    self->loaded = true;
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "loaded %zu shards, %" PRIu64 " records, %" PRIu64
              " bytes from '%s' (dataset %s)",
              self->core->set.n, self->core->set.records, self->core->set.bytes,
              self->data_dir, self->core->set.fingerprint);
    return (int)self->core->set.n;
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
 * connection, whose descriptors the ROUTER's monitor reports (see
 * s_monitor_drain). */
static int
s_setup_sndbuf(emlio_server_t *self, void *router)
{
    emlio_netpath_limits_t limits;
    emlio__netpath_limits(&limits);
    emlio__netpath_plan(&limits, true, self->cfg.sndbuf, &self->sndbuf);
    if (self->sndbuf.zmq_value >= 0) {
        int rc = s_setopt_int(router, ZMQ_SNDBUF, self->sndbuf.zmq_value,
                              "ZMQ_SNDBUF", self->err);
        if (rc < 0)
            return rc;
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
    int sndhwm = (int)EMLIO_MIN(self->cfg.max_credit + 64u, (uint32_t)INT_MAX);
    /* Requests are small; refuse (disconnect) anything larger before libzmq
     * buffers it, so a hostile peer cannot make us hold huge frames. */
    int64_t max_msg = EMLIO_SERVER_MAX_REQUEST(self->cfg.max_batch);
    char *e = self->err;
    int rc = 0;
    if ((rc = s_setopt_int(router, ZMQ_SNDHWM, sndhwm, "ZMQ_SNDHWM", e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_ROUTER_MANDATORY, 1,
                           "ZMQ_ROUTER_MANDATORY", e)) < 0 ||
        (rc = s_setopt(router, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg),
                       "ZMQ_MAXMSGSIZE", e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_HEARTBEAT_IVL, 2000, "ZMQ_HEARTBEAT_IVL",
                           e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_HEARTBEAT_TTL, 10000,
                           "ZMQ_HEARTBEAT_TTL", e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_HEARTBEAT_TIMEOUT, 10000,
                           "ZMQ_HEARTBEAT_TIMEOUT", e)) < 0 ||
        (rc = s_setopt_int(router, ZMQ_HANDSHAKE_IVL, 10000,
                           "ZMQ_HANDSHAKE_IVL", e)) < 0 ||
        (rc = s_setup_sndbuf(self, router)) < 0) {
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
    /* Bind before the monitor exists: a failed bind (a port in use) then
     * closes a socket that was never monitored. Closing a monitored socket
     * races libzmq's monitor teardown and could hang the context's
     * termination (libzmq issues 1279, 2083). Nothing is served before
     * start, and the port is announced only after this returns. */
    if (zmq_bind(router, endpoint) != 0) {
        int err = errno;
        zmq_close(router);
        return emlio__seterr(self->err, -err, "cannot bind '%s': %s", endpoint,
                             zmq_strerror(err));
    }
    /* Connection events drive the accounting of connections: a slot is
     * freed the moment its connection closes, idle ones are shut down, and
     * running out of file descriptors is seen. */
    snprintf(self->inproc_monitor, sizeof(self->inproc_monitor),
             "inproc://emlio-monitor-%p-%" PRIu64, (void *)self,
             emlio__now_ns());
    int events =
        ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_ACCEPT_FAILED;
    self->monitor = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PAIR);
    if (!self->monitor ||
        zmq_socket_monitor(router, self->inproc_monitor, events) != 0 ||
        zmq_connect(self->monitor, self->inproc_monitor) != 0) {
        int err = errno;
        if (self->monitor)
            (void)zmq_socket_monitor(router, NULL, 0);
        s_close_socket(&self->monitor);
        zmq_close(router);
        return emlio__seterr(self->err, -err,
                             "cannot monitor the connections of '%s': %s",
                             endpoint, zmq_strerror(err));
    }
    size_t len = sizeof(self->endpoint);
    if (zmq_getsockopt(router, ZMQ_LAST_ENDPOINT, self->endpoint, &len) != 0)
        snprintf(self->endpoint, sizeof(self->endpoint), "%s", endpoint);
    const char *colon = strrchr(self->endpoint, ':');
    if (!strncmp(self->endpoint, "tcp://", 6) && colon)
        self->bound_port = atoi(colon + 1);
    self->router = router;
    return 0;
}

const char *
emlio_server_endpoint(const emlio_server_t *self)
{
    return self->endpoint;
}

/* ---- the worker: one GET in, one BATCH or ERROR out ------------------- */

/* Drops one reference to a sent batch's release token; the last one (the
 * last frame ZeroMQ lets go of, or the sender) ends the batch's uses of
 * the shards. Runs in a ZeroMQ I/O thread: touches only the token and the
 * core, never the server, which may be gone by then. */
static void
s_release_unref(s_release_t *rel)
{
    if (atomic_fetch_sub(&rel->left, 1) != 1)
        return;
    s_core_t *core = rel->core;
    const emlio__view_t *advised = NULL;
    for (size_t i = 0; i < rel->n; i++) {
        const emlio__view_t *item = &rel->items[i];
        emlio_shard_t *shard = &core->set.shards[item->shard];
        if (!item->held)
            continue;
        /* Sent: not read again this epoch (advised once per sample, whose
         * fields are consecutive items). */
        if (core->drop_behind && (!advised || advised->shard != item->shard ||
                                  advised->record != item->record))
            emlio__shard_advise(shard, (size_t)item->record, 1,
                                EMLIO_ADVISE_DONTNEED);
        advised = item;
        emlio__shard_release(shard);
    }
    emlio_free(rel);
    atomic_fetch_sub(&core->batches_in_flight, 1);
    s_core_unref(&core);
}

static void
s_frame_free(void *data, void *hint)
{
    (void)data;
    s_release_unref(hint);
}

/* Frees the private copy behind a copying read's frame. */
static void
s_free_hint(void *data, void *hint)
{
    (void)data;
    emlio_free(hint);
}

/* Ends what a view holds: its use of the mapping or its private copy. */
static void
s_view_release(emlio_server_t *self, emlio__view_t *view)
{
    emlio__view_release(view, &self->core->set.shards[view->shard]);
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

/* Counts a sample skipped under --on-corrupt skip and logs why (msg may
 * be NULL: a changed shard was logged once already). */
static void
s_skip(emlio_server_t *self, const char *msg)
{
    atomic_fetch_add(&self->corrupt_skipped, 1);
    if (msg)
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", msg);
}

/* Judges one sample's read verdict rc: 0 keeps it, 1 skips it (under
 * --on-corrupt skip, counted and logged), < 0 fails the job with the
 * error in job->code and job->text. */
static int
s_read_verdict(emlio_server_t *self, s_job_t *job, emlio_shard_t *shard,
               uint64_t record, int rc, const char *missing)
{
    bool skip = self->cfg.on_corrupt == EMLIO_ON_CORRUPT_SKIP;
    const emlio__format_ops_t *ops = shard->ops;
    char where[PATH_MAX + 128] = "";
    char msg[PATH_MAX + 256];
    if (rc == 0)
        return 0;
    if (rc == EMLIO_ECORRUPT && atomic_load(&shard->changed))
        rc = -ESTALE; /* changed on disk, not rotten: say so */
    /* Only after ENOTFOUND is excluded may the format describe record. */
    if (rc != EMLIO_ENOTFOUND)
        ops->describe(shard, record, where, sizeof(where));
    uint64_t offset =
        rc == EMLIO_ENOTFOUND ? 0 : emlio__shard_offset(shard, (size_t)record);
    if (rc == -ESTALE && skip) {
        s_skip(self, NULL);
        return 1;
    }
    if (rc == -ESTALE) {
        job->code = EMLIO_ECORRUPT;
        snprintf(job->text, sizeof(job->text),
                 "record %" PRIu64 " of shard '%s' cannot be read intact: "
                 "the shard changed on disk while being served",
                 record, shard->name);
        return -1;
    }
    if (skip && ops->changed_code && rc == ops->changed_code) {
        /* A file rewritten since it was listed: like a changed shard. */
        snprintf(msg, sizeof(msg), "skipping changed %s", where);
        s_skip(self, msg);
        return 1;
    }
    if (skip && rc == EMLIO__FORMAT_EMISSING) {
        snprintf(msg, sizeof(msg),
                 "skipping sample %" PRIu64 " of '%s' at offset %" PRIu64
                 ": no field '%s'",
                 record, shard->name, offset, missing);
        s_skip(self, msg);
        return 1;
    }
    if (skip && rc == EMLIO_ECORRUPT) {
        snprintf(msg, sizeof(msg),
                 "skipping corrupt record %" PRIu64 " of '%s' at offset "
                 "%" PRIu64,
                 record, shard->name, offset);
        s_skip(self, msg);
        return 1;
    }
    job->code = rc == EMLIO__FORMAT_EMISSING ? EMLIO_EFORMAT : rc;
    if (rc == EMLIO_ENOTFOUND)
        snprintf(job->text, sizeof(job->text),
                 "no record %" PRIu64 " in shard '%s' (%zu records)", record,
                 shard->name, emlio__shard_count(shard));
    else if (rc == EMLIO__FORMAT_EMISSING)
        snprintf(job->text, sizeof(job->text),
                 "sample %" PRIu64 " of shard '%s' at offset %" PRIu64
                 " has no field '%s'",
                 record, shard->name, offset, missing);
    else
        snprintf(job->text, sizeof(job->text), "%s %s",
                 rc == EMLIO_ECORRUPT                           ? "corrupt"
                 : ops->changed_code && rc == ops->changed_code ? "changed"
                                                                : "unreadable",
                 where);
    return -1;
}

/* The reader stage: checks the request against the dataset, finds and
 * verifies every sample through its shard's format, and leaves views (or
 * an error) in the job: per views for each sample kept, in request order. */
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
        (get->dataset_len != strlen(self->core->set.fingerprint) ||
         memcmp(get->dataset, self->core->set.fingerprint, get->dataset_len))) {
        job->code = EMLIO_EMISMATCH;
        snprintf(job->text, sizeof(job->text),
                 "dataset changed: client expects '%.*s', server has '%s'",
                 (int)EMLIO_MIN(get->dataset_len, 64), get->dataset,
                 self->core->set.fingerprint);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const emlio_wire_item_t *item = &get->items[i];
        if (item->shard >= self->core->set.n) {
            job->code = EMLIO_ENOTFOUND;
            snprintf(job->text, sizeof(job->text),
                     "no shard %" PRIu32 " (server has %zu)", item->shard,
                     self->core->set.n);
            return;
        }
        emlio_shard_t *shard = &self->core->set.shards[item->shard];
        emlio__view_t *view = &job->views[job->n_views * per];
        for (size_t f = 0; f < per; f++) {
            view[f].shard = item->shard;
            view[f].record = item->record;
        }
        const char *missing = self->field ? self->field : "(image)";
        int rc =
            emlio__format_read(shard, item->record, &self->rd, view, &missing);
        if (rc < 0)
            for (size_t f = 0; f < per; f++)
                s_view_release(self, &view[f]);
        rc = s_read_verdict(self, job, shard, item->record, rc, missing);
        if (rc < 0)
            return;
        job->n_views += rc == 0;
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
    /* The header is built before any frame, so nothing after it can fail
     * and every view's hold moves into a frame exactly once. */
    emlio_buf_t buf = EMLIO_BUF_INIT;
    zmq_msg_t header;
    if (job->code == 0) {
        for (size_t i = 0; i < n; i++) {
            const emlio__view_t *v = &job->views[i * per];
            samples[i] =
                (emlio_wire_sample_t){ v->shard, v->record, v->label, v->crc };
        }
        if (emlio__wire_encode_batch(&buf, get->id, samples, n) < 0 ||
            s_header_msg(&header, &buf) < 0) {
            job->code = EMLIO_ENOMEM;
            snprintf(job->text, sizeof(job->text), "out of memory");
        }
    }
    if (job->code == 0) {
        /* One reference per mapped frame plus the sender's own; a frame of
         * a copy frees its copy itself. */
        unsigned mapped = 0;
        for (size_t i = 0; i < nf; i++)
            mapped += job->views[i].held;
        rel->core = self->core;
        rel->n = nf;
        atomic_init(&rel->left, mapped + 1);
        atomic_fetch_add(&self->core->refs, 1);
        atomic_fetch_add(&self->core->batches_in_flight, 1);
        for (size_t i = 0; i < nf; i++) {
            emlio__view_t *v = &job->views[i];
            rel->items[i] = *v;
            rel->items[i].owned = NULL;
            /* Zero-copy: the frame points into the mapping or the copy.
             * zmq_msg_init_data cannot fail for a non-NULL free function. */
            assert(v->owned || v->held);
            if (v->owned)
                (void)zmq_msg_init_data(&frames[i], (void *)v->data, v->len,
                                        s_free_hint, v->owned);
            else
                (void)zmq_msg_init_data(&frames[i], (void *)v->data, v->len,
                                        s_frame_free, rel);
            v->owned = NULL; /* now the frame's */
            v->held = false; /* now the token's */
            bytes += v->len;
        }
        s_send_parts(done, &job->identity, &header, frames, nf, 0);
        s_release_unref(rel); /* the sender's reference */
        atomic_fetch_add(&self->requests, 1);
        atomic_fetch_add(&self->samples, n);
        atomic_fetch_add(&self->bytes, bytes);
        emlio_free(frames);
        emlio_free(samples);
        return;
    }
    emlio_buf_release(&buf);
    emlio_free(rel);
    atomic_fetch_add(&self->errors, 1);
    emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "request %" PRIu64 ": %s",
              get->id, job->text);
    s_send_error(done, &job->identity, get->id, job->code, job->text, 0);
    emlio_free(frames);
    emlio_free(samples);
}

static void
s_job_free(emlio_server_t *self, s_job_t *job)
{
    if (!job)
        return;
    /* Views a batch did not take (an error reply): every frame of every
     * sample read so far. */
    for (size_t i = 0; job->views && i < job->n_views * job->per; i++)
        s_view_release(self, &job->views[i]);
    emlio_free(job->views);
    emlio__wire_msg_release(&job->msg);
    zmq_msg_close(&job->header);
    emlio_free(job);
}

static void
s_job_drop(emlio_server_t *self, s_job_t *job)
{
    zmq_msg_close(&job->identity);
    s_job_free(self, job);
}

/* A reader thread: jobs from the frontend (over inproc), views into the
 * serializers' bounded queue. Blocking on a full queue is the daemon's
 * backpressure. */
static void *
s_reader_main(void *arg)
{
    emlio_server_t *self = arg;
    void *work = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PULL);
    char err[EMLIO_ERRMSG_LEN];
    if (!work ||
        s_setopt_int(work, ZMQ_RCVTIMEO, S_STOP_POLL_MS, "ZMQ_RCVTIMEO", err) <
            0 ||
        zmq_connect(work, self->inproc_work) != 0) {
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "a reader thread cannot start: %s", zmq_strerror(errno));
        goto out;
    }
    while (!atomic_load(&self->stopping)) {
        s_job_t *job;
        int n = zmq_recv(work, &job, sizeof(job), 0);
        if (n != (int)sizeof(job))
            continue; /* timeout or EINTR: look at the stop flag again */
        s_read_job(self, job);
        if (emlio__queue_push(self->ser_queue, job) < 0)
            s_job_drop(self, job);
    }
    /* Free the jobs still queued for us; their clients will ask again. */
    for (;;) {
        s_job_t *job;
        if (zmq_recv(work, &job, sizeof(job), ZMQ_DONTWAIT) != (int)sizeof(job))
            break;
        s_job_drop(self, job);
    }
out:
    if (work)
        zmq_close(work);
    return NULL;
}

/* A serializer thread: views from the queue, replies to the frontend. */
static void *
s_serializer_main(void *arg)
{
    emlio_server_t *self = arg;
    void *done = zmq_socket(emlio__ctx_zmq(self->ctx), ZMQ_PUSH);
    char err[EMLIO_ERRMSG_LEN];
    /* A reply that cannot be handed over while stopping is dropped rather
     * than blocking the join. Without a socket the jobs are still popped
     * (and dropped), so the readers never block on a full queue. */
    bool connected =
        done &&
        s_setopt_int(done, ZMQ_SNDTIMEO, S_STOP_POLL_MS, "ZMQ_SNDTIMEO", err) ==
            0 &&
        s_setopt_int(done, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM", err) == 0 &&
        s_setopt_int(done, ZMQ_LINGER, 0, "ZMQ_LINGER", err) == 0 &&
        zmq_connect(done, self->inproc_done) == 0;
    if (!connected)
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "a serializer thread cannot start: %s", zmq_strerror(errno));
    void *item;
    while (emlio__queue_pop(self->ser_queue, &item) == 0) {
        s_job_t *job = item;
        if (!connected || atomic_load(&self->stopping)) {
            s_job_drop(self, job);
            continue;
        }
        s_serialize_job(self, done, job); /* consumes job->identity */
        s_job_free(self, job);
    }
    if (done)
        zmq_close(done);
    return NULL;
}

/* ---- peers: client connections by routing id, grouped in sessions ----- */

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

/* ---- connections: known from the ROUTER's socket monitor -------------- */

static s_conn_t *
s_conn_find(emlio_server_t *self, int fd)
{
    for (size_t i = 0; i < self->n_conns; i++)
        if (self->conns[i].fd == fd)
            return &self->conns[i];
    return NULL;
}

/* Registers (or, for a reused descriptor, renews) the connection on fd. */
static s_conn_t *
s_conn_add(emlio_server_t *self, int fd, uint64_t now)
{
    s_conn_t *conn = s_conn_find(self, fd);
    if (!conn) {
        if (self->n_conns == self->cap_conns) {
            size_t cap = self->cap_conns ? self->cap_conns * 2 : 64;
            s_conn_t *conns =
                emlio_reallocarray(self->conns, cap, sizeof(*conns));
            if (!conns)
                return NULL;
            self->conns = conns;
            self->cap_conns = cap;
        }
        conn = &self->conns[self->n_conns++];
    }
    conn->fd = fd;
    conn->last_seen_ns = now;
    conn->closing = false;
    return conn;
}

/* The connection on fd is gone: its slot and credits are freed now, not
 * after an idle timeout. */
static void
s_conn_closed(emlio_server_t *self, int fd)
{
    s_conn_t *conn = s_conn_find(self, fd);
    if (conn)
        *conn = self->conns[--self->n_conns];
    for (size_t i = 0; i < self->n_peers;) {
        if (self->peers[i].fd == fd)
            s_peer_remove(self, i);
        else
            i++;
    }
    atomic_store(&self->active_clients, self->n_clients);
}

/* Whether fd is one of our ROUTER's accepted connections (and not, after a
 * reuse of the number, some other descriptor of this process). */
static bool
s_fd_is_ours(const emlio_server_t *self, int fd)
{
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (getsockname(fd, (struct sockaddr *)&addr, &len) != 0)
        return false;
    if (self->bound_port < 0)
        return addr.ss_family == AF_UNIX;
    int port = -1;
    if (addr.ss_family == AF_INET)
        port = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    else if (addr.ss_family == AF_INET6)
        port = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    return port == self->bound_port;
}

/* Closes one connection for a reason that is logged. ZeroMQ has no call to
 * drop one peer of a ROUTER, so its socket is shut down under it: ZeroMQ
 * then closes the connection as if the peer had, and the monitor reports
 * it (s_conn_closed). */
static void
s_conn_shutdown(emlio_server_t *self, s_conn_t *conn, int level,
                const char *why)
{
    if (conn->closing)
        return;
    conn->closing = true;
    if (!s_fd_is_ours(self, conn->fd))
        return;
    emlio_log(self->ctx, level, "server", "closing connection %d: %s", conn->fd,
              why);
    (void)shutdown(conn->fd, SHUT_RDWR);
}

/* Closes the connection that has been silent longest and has nothing
 * outstanding; returns whether there was one. */
static bool
s_conn_evict_idlest(emlio_server_t *self, uint64_t now, uint64_t min_idle_ns,
                    int level, const char *why)
{
    s_conn_t *idlest = NULL;
    for (size_t i = 0; i < self->n_conns; i++) {
        s_conn_t *conn = &self->conns[i];
        if (conn->closing || now - conn->last_seen_ns < min_idle_ns)
            continue;
        bool busy = false;
        for (size_t k = 0; k < self->n_peers && !busy; k++)
            busy = self->peers[k].fd == conn->fd && self->peers[k].outstanding;
        if (!busy && (!idlest || conn->last_seen_ns < idlest->last_seen_ns))
            idlest = conn;
    }
    if (!idlest)
        return false;
    char text[160];
    snprintf(text, sizeof(text), "%s (silent for %.1f s)", why,
             (double)(now - idlest->last_seen_ns) / 1e9);
    s_conn_shutdown(self, idlest, level, text);
    return true;
}

/* An accept failed. Out of file descriptors, libzmq retries at once and
 * spins until one is free: say so (rate-limited) and free one, the idlest
 * connection, so that clients that do talk can get in. */
static void
s_accept_failed(emlio_server_t *self, int err, uint64_t now)
{
    self->accept_failed++;
    bool no_fds =
        err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
    if (now - self->fd_log_ns >= S_FD_LOG_MS * 1000000ull) {
        struct rlimit lim = { 0, 0 };
        (void)getrlimit(RLIMIT_NOFILE, &lim);
        emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                  "cannot accept connections: %s (%" PRIu64 " refused; "
                  "descriptor limit %llu, %zu connections open)%s",
                  strerror(err), self->accept_failed,
                  (unsigned long long)lim.rlim_cur, self->n_conns,
                  no_fds ? "; closing the idlest connections" : "");
        self->fd_log_ns = now;
        self->accept_failed = 0;
    }
    if (no_fds)
        (void)s_conn_evict_idlest(self, now, 1000000000ull, EMLIO_LOG_WARN,
                                  "out of file descriptors");
}

/* Handles every connection event the monitor has queued. */
static void
s_monitor_drain(emlio_server_t *self)
{
    for (;;) {
        zmq_msg_t ev;
        zmq_msg_init(&ev);
        if (zmq_msg_recv(&ev, self->monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&ev);
            return;
        }
        uint16_t event = 0;
        uint32_t value = 0;
        if (zmq_msg_size(&ev) >= 6) {
            memcpy(&event, zmq_msg_data(&ev), 2);
            memcpy(&value, (uint8_t *)zmq_msg_data(&ev) + 2, 4);
        }
        bool more = zmq_msg_more(&ev);
        zmq_msg_close(&ev);
        if (more)
            emlio__zmq_drain(self->monitor); /* the endpoint frame */
        uint64_t now = emlio__now_ns();
        emlio_log(self->ctx, EMLIO_LOG_DEBUG, "server",
                  "connection event 0x%x on %" PRIu32, event, value);
        if (event == ZMQ_EVENT_ACCEPTED && self->sndbuf.force_value) {
            int rc = emlio__netpath_force((int)value, true,
                                          self->sndbuf.force_value);
            if (rc < 0)
                emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                          "cannot force the send buffer of a connection: %s",
                          strerror(-rc));
        }
        if (event == ZMQ_EVENT_ACCEPTED)
            s_conn_add(self, (int)value, now);
        else if (event == ZMQ_EVENT_DISCONNECTED)
            s_conn_closed(self, (int)value);
        else if (event == ZMQ_EVENT_ACCEPT_FAILED)
            s_accept_failed(self, (int)value, now);
    }
}

/* ---- the frontend: the only thread that touches the TCP socket -------- */

/* Shuts down connections silent for idle_timeout_ms with nothing
 * outstanding (ZeroMQ clients answer heartbeats, so those alone never close
 * them), including ones that never said HELLO. */
static void
s_conns_expire(emlio_server_t *self, uint64_t now)
{
    uint64_t idle = (uint64_t)self->cfg.idle_timeout_ms * 1000000ull;
    char why[96];
    snprintf(why, sizeof(why), "idle for more than %" PRIu32 " ms",
             self->cfg.idle_timeout_ms);
    while (s_conn_evict_idlest(self, now, idle, EMLIO_LOG_INFO, why))
        ;
}

/* Forgets peers that have nothing outstanding and were not heard from for
 * idle_timeout_ms (peers whose connection the monitor does not report,
 * such as inproc ones); connected ones are closed by s_conns_expire. */
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
        s_monitor_drain(self); /* connections that closed free their slot */
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
    peer->fd = self->cur_fd;
    peer->session = session;
    peer->stalled = false;
    return peer;
}

static s_peer_t *
s_peer_find(emlio_server_t *self, const uint8_t *id, size_t len, bool add)
{
    return s_peer_add(self, id, len, add, 0);
}

/* A reply to peer could not even be queued: its send queue (credits plus
 * room for errors) is full, which a client that reads never causes. It
 * floods requests without reading: close its connection with a logged
 * reason, rather than leave it wedged with credits that never return. */
static void
s_peer_flooding(emlio_server_t *self, s_peer_t *peer)
{
    peer->stalled = true;
    s_conn_t *conn = peer->fd >= 0 ? s_conn_find(self, peer->fd) : NULL;
    if (!conn || conn->closing)
        return;
    char why[160];
    snprintf(why, sizeof(why),
             "the client sends requests without reading the replies "
             "(%" PRIu32 " outstanding, send queue full)",
             peer->outstanding);
    s_conn_shutdown(self, conn, EMLIO_LOG_WARN, why);
}

static void
s_frontend_reply_error(emlio_server_t *self, zmq_msg_t *identity, uint64_t id,
                       int code, const char *text)
{
    atomic_fetch_add(&self->errors, 1);
    /* At most 10 lines a second: a flooding peer must not fill the disk. */
    uint64_t now = emlio__now_ns();
    if (now - self->err_log_ns > 1000000000ull) {
        if (self->err_log_quiet)
            emlio_log(self->ctx, EMLIO_LOG_WARN, "server",
                      "%" PRIu64 " more refused requests not logged",
                      self->err_log_quiet);
        self->err_log_ns = now;
        self->err_log_n = 0;
        self->err_log_quiet = 0;
    }
    if (self->err_log_n++ < 10)
        emlio_log(self->ctx, EMLIO_LOG_WARN, "server", "%s", text);
    else
        self->err_log_quiet++;
    s_peer_t *peer = s_peer_find(self, zmq_msg_data(identity),
                                 zmq_msg_size(identity), false);
    if (s_send_error(self->router, identity, id, code, text, ZMQ_DONTWAIT) ==
            -EAGAIN &&
        peer)
        s_peer_flooding(self, peer);
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
        if (first->shard < self->core->set.n) {
            const emlio_shard_t *shard = &self->core->set.shards[first->shard];
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
 * short "joined" form for its further streams. Consumes job->identity. */
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
    /* Copies: a zero-copy WELCOME could outlive the server in a ZeroMQ
     * queue. It is sent once per connection. */
    zmq_msg_t welcome;
    emlio_buf_t joined = EMLIO_BUF_INIT;
    const emlio_buf_t *reply = &self->welcome;
    if (hello->session && hello->stream > 0) {
        if (emlio__wire_encode_joined_v(&joined, hello->version, hello->id,
                                        self->core->set.fingerprint) < 0) {
            emlio_buf_release(&joined);
            zmq_msg_close(&job->identity);
            return;
        }
        reply = &joined;
    } else {
        if (hello->version >= 2)
            reply = &self->welcome2;
        atomic_fetch_add(&self->clients, 1);
    }
    if (zmq_msg_init_size(&welcome, reply->len) != 0) {
        emlio_buf_release(&joined);
        zmq_msg_close(&job->identity);
        return;
    }
    memcpy(zmq_msg_data(&welcome), reply->data, reply->len);
    emlio_buf_release(&joined);
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
    /* Which connection it came on (libzmq sets the source descriptor on the
     * frames it received, not on the routing id it prepends): its activity
     * keeps it from the idle timeout; one that we are closing gets nothing
     * more done for it. */
    self->cur_fd = zmq_msg_get(&job->header, ZMQ_SRCFD);
    if (self->cur_fd >= 0) {
        s_conn_t *conn = s_conn_find(self, self->cur_fd);
        if (!conn) { /* its ACCEPTED event may still be queued */
            s_monitor_drain(self);
            conn = s_conn_find(self, self->cur_fd);
        }
        if (!conn)
            conn = s_conn_add(self, self->cur_fd, emlio__now_ns());
        else
            conn->last_seen_ns = emlio__now_ns();
        if (conn && conn->closing) {
            emlio__zmq_drain(self->router);
            goto drop;
        }
    }
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
    s_job_free(self, job);
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
            s_peer_flooding(self, peer);
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
    void *work = self->work;
    void *done = self->done;
    zmq_pollitem_t items[3] = {
        { self->router, 0, ZMQ_POLLIN, 0 },
        { done, 0, ZMQ_POLLIN, 0 },
        { self->monitor, 0, ZMQ_POLLIN, 0 },
    };
    uint64_t last_expire = emlio__now_ns();
    uint64_t last_watch = last_expire;
    uint64_t last_paths = last_expire;
    while (!atomic_load(&self->stopping)) {
        uint64_t now = emlio__now_ns();
        if (now - last_watch >= S_STOP_POLL_MS * 1000000ull) {
            /* Shards being changed on disk: refuse their samples and let
             * the writer go on once no frame points into them. */
            bool paths = now - last_paths > 1000000000ull;
            emlio__shardset_watch(&self->core->set, paths, S_LEASE_GRACE_MS,
                                  s_shardset_log, self);
            last_paths = paths ? now : last_paths;
            last_watch = now;
        }
        if (now - last_expire > 1000000000ull) {
            s_monitor_drain(self);
            s_conns_expire(self, now);
            s_peers_expire(self, now);
            atomic_store(&self->active_clients, self->n_clients);
            atomic_store(&self->active_streams, self->n_peers);
            last_expire = now;
        }
        if (zmq_poll(items, 3, S_STOP_POLL_MS) < 0) {
            if (errno == EINTR)
                continue;
            emlio_log(self->ctx, EMLIO_LOG_ERROR, "server",
                      "frontend stops: cannot poll: %s", zmq_strerror(errno));
            break;
        }
        /* Connection events first: a closed connection frees its slot
         * before the next HELLO is looked at. */
        if (items[2].revents & ZMQ_POLLIN)
            s_monitor_drain(self);
        /* Replies next: finished batches free credits and memory. */
        for (int i = 0; i < 256 && (items[1].revents & ZMQ_POLLIN); i++) {
            s_frontend_reply(self, done);
            int events = 0;
            size_t len = sizeof(events);
            if (zmq_getsockopt(done, ZMQ_EVENTS, &events, &len) != 0)
                events = 0;
            items[1].revents = (short)(events & ZMQ_POLLIN);
        }
        for (int i = 0; i < 256 && (items[0].revents & ZMQ_POLLIN); i++) {
            s_frontend_request(self, work);
            int events = 0;
            size_t len = sizeof(events);
            if (zmq_getsockopt(self->router, ZMQ_EVENTS, &events, &len) != 0)
                events = 0;
            items[0].revents = (short)(events & ZMQ_POLLIN);
        }
    }
    return NULL;
}

/* Creates and binds the frontend's two internal sockets here, before its
 * thread starts, so that start can report a failure (the thread then only
 * uses them; pthread_create is the memory barrier ZeroMQ asks for). */
static int
s_bind_internal(emlio_server_t *self)
{
    void *zctx = emlio__ctx_zmq(self->ctx);
    char *e = self->err;
    int rc;
    self->work = zmq_socket(zctx, ZMQ_PUSH);
    self->done = zmq_socket(zctx, ZMQ_PULL);
    if (!self->work || !self->done)
        return emlio__seterr(e, -errno, "cannot create internal sockets: %s",
                             zmq_strerror(errno));
    if ((rc = s_setopt_int(self->work, ZMQ_LINGER, 0, "ZMQ_LINGER", e)) < 0 ||
        (rc = s_setopt_int(self->done, ZMQ_LINGER, 0, "ZMQ_LINGER", e)) < 0 ||
        (rc = s_setopt_int(self->done, ZMQ_RCVHWM, 0, "ZMQ_RCVHWM", e)) < 0 ||
        (rc = s_setopt_int(self->work, ZMQ_SNDHWM, 0, "ZMQ_SNDHWM", e)) < 0)
        return rc;
    if (zmq_bind(self->work, self->inproc_work) != 0 ||
        zmq_bind(self->done, self->inproc_done) != 0)
        return emlio__seterr(e, -errno, "cannot bind internal sockets: %s",
                             zmq_strerror(errno));
    return 0;
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
             "inproc://emlio-work-%p-%" PRIu64, (void *)self, emlio__now_ns());
    snprintf(self->inproc_done, sizeof(self->inproc_done),
             "inproc://emlio-done-%p-%" PRIu64, (void *)self, emlio__now_ns());
    atomic_store(&self->stopping, false);
    uint32_t n = self->cfg.workers + self->cfg.serializers;
    if (!self->workers)
        self->workers = emlio_calloc(n, sizeof(*self->workers));
    if (!self->ser_queue)
        self->ser_queue = emlio__queue_new(self->cfg.queue_depth);
    if (!self->workers || !self->ser_queue)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    s_close_socket(&self->work); /* from an earlier failed start */
    s_close_socket(&self->done);
    rc = s_bind_internal(self);
    if (rc < 0) {
        s_close_socket(&self->work);
        s_close_socket(&self->done);
        return rc;
    }
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
    /* Jobs no serializer took (one that never started, after a failed
     * start): a closed queue hands out what it still holds, then ends. */
    void *left;
    while (self->ser_queue && emlio__queue_pop(self->ser_queue, &left) == 0)
        s_job_drop(self, left);
    emlio__queue_destroy(&self->ser_queue);
    /* Replies still queued inside are dropped with their frames. */
    s_close_socket(&self->work);
    s_close_socket(&self->done);
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
    return self->core->set.n;
}

uint64_t
emlio_server_record_count(const emlio_server_t *self)
{
    return self->core->set.records;
}

const char *
emlio_server_dataset(const emlio_server_t *self)
{
    return self->core->set.fingerprint;
}

const char *
emlio_server_errmsg(const emlio_server_t *self)
{
    return self->err;
}
