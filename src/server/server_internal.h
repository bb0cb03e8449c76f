/* server_internal.h - the rooms of emlio_server_t and what they share.
 * SPDX-License-Identifier: MIT
 *
 * The server is these files around one struct:
 *   server.c          public API: new/destroy, load, bind, start/stop, stats
 *   server_admit.c    connections (socket monitor), peers and sessions (by
 *                     routing id and descriptor: keyindex.h), eviction
 *   server_request.c  the frontend thread: HELLO, GET decoded and put to
 *                     the gate, replies forwarded
 *   server_gate.c     the admission of one GET: every gate, the parked
 *                     GETs and their way out, readahead advice
 *   server_copy.c     the copy budget and the packed frames' buffer pool
 *   server_jobs.c     training jobs (HELLO's "job") and the fair dispatch
 *   fairq.c           the deficit round robin under it
 *   server_pipeline.c reader and serializer threads, frames, release
 *   server_io.c       --io: mapped or read, and the --io auto watch
 *   server_xf.c       the transform stage (a GET with a transform)
 *   server_xfspec.c   the transform specs clients sent, parsed once
 *   server_fields.c   the fields a client names (HELLO's "fields")
 * Each room owns one sub-struct of emlio_server_t and is the only writer of
 * it (admit, request and gate all run on the frontend thread and share
 * adm).
 *
 * The path of one GET (docs/design.md traces it):
 *   frontend (request: decode; gate: GO) --fair queue (jobs)--> --work
 *   inproc--> reader (pipeline: views) [--> transform pool (xf: one
 *   block)] --ser_queue--> serializer (pipeline: frames) --done inproc-->
 *   frontend (request: forwarded to the client)
 * A job leaves the read stage as views: job->per frames for each of
 * job->n_views samples, each view a use of a shard's mapping or a private
 * copy (format.h), the sample's label and CRC in its first view.
 * Credits, release tokens and replies are per job.
 */
#ifndef EMLIO_SERVER_INTERNAL_H
#define EMLIO_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <zmq.h>

#include "base.h"
#include "net.h"
#include "server_fields.h"
#include "server_jobs.h"
#include "server_xfspec.h"
#include "store.h"

/* The send high-water mark of each client connection, in messages. A
 * connection that keeps within its credits has at most max_credit replies
 * queued, but libzmq's writer learns that its queue shrank only every
 * (mark + 1) / 2 messages the I/O thread takes (the pipe's low-water mark),
 * so the queue it sees may be that much longer than the real one. With a
 * mark of max_credit + 64, a reading client with 256 GETs in flight could
 * look like one that stopped reading and be closed (issue 18); with twice
 * the credits plus room for error replies, the seen queue stays below the
 * mark by construction: credits + (mark + 1) / 2 - 1 < mark. */
#define EMLIO__SRV_SNDHWM(credits)          (2 * (uint64_t)(credits) + 64)
/* Readahead advises a shard's records in chunks of about this many bytes,
 * each at most once per EMLIO__SRV_RA_REFRESH_MS (see s_readahead). */
#define EMLIO__SRV_RA_CHUNK                 (1u << 20)
#define EMLIO__SRV_RA_REFRESH_MS            10000u
/* How often blocked threads wake to check for stop, in ms. */
#define EMLIO__SRV_POLL_MS                  100
/* The longest a destroy waits for ZeroMQ to release frames that point into
 * the shard mappings; after that the mappings stay until the frames go. */
#define EMLIO__SRV_RELEASE_WAIT_MS          2000
#define EMLIO__SRV_MAX_IDENTITY             255
/* How long a shard whose lease is being broken waits for its frames in
 * flight before their pages are blanked and the writer may go on. */
#define EMLIO__SRV_LEASE_GRACE_MS           5000
/* Log "out of file descriptors" at most this often (ms). */
#define EMLIO__SRV_FD_LOG_MS                10000
/* The largest request a daemon accepts, for max_batch samples per GET. */
#define EMLIO_SERVER_MAX_REQUEST(max_batch) (4096 + (int64_t)(max_batch)*24)

/* A byte account of copied replies (server_copy.c): a connection's, held
 * by its peer and by every job charged to it (any thread may give a
 * charge back). */
typedef struct emlio__copy_acct {
    atomic_uint_fast64_t bytes;
    atomic_uint refs;
} emlio__copy_acct_t;

/* What one job (then its reply's release token) is charged. */
typedef struct emlio__copy_charge {
    emlio__copy_acct_t *conn;     /* a reference, or NULL */
    atomic_uint_fast64_t *daemon; /* the core's account */
    uint64_t bytes;
} emlio__copy_charge_t;

/* A GET with a transform (server_xf.c): the pipeline the gate found for
 * its spec, and once transformed, the block (samples kept x H x W x 3)
 * with each kept sample's quadruple. */
typedef struct emlio__job_xf {
    const emlio_transform_t *spec; /* NULL: raw samples */
    atomic_uint *users;            /* the spec cache's count of its users */
    emlio__xf_job_t run;
    emlio__xf_sample_t *samples;
    emlio__wire_sample_t *wire;
    size_t kept;
} emlio__job_xf_t;

/* The copy budget (server_copy.c): what the job may copy, what it is
 * charged, and while it is parked (server_gate.c), the account it will be
 * charged to (a reference). */
typedef struct emlio__job_copy {
    uint64_t want;
    emlio__copy_charge_t charge;
    emlio__copy_acct_t *waits_on;
} emlio__job_copy_t;

/* A packed reply (server_copy.c, server_pipeline.c): the reader copies
 * sample frames of at most max bytes (the peer's) into one pooled buffer
 * of at most cap bytes (charged like a copy), and the serializer sends it
 * as one frame with the offset table. */
typedef struct emlio__job_pack {
    bool on;
    uint32_t max;
    uint64_t cap;
    uint8_t *buf; /* from the core's pool; NULL = none yet */
    size_t size;  /* its size (a pool class) */
    size_t len;   /* bytes used */
} emlio__job_pack_t;

/* Staged reads (server_pipeline.c, --io read): the shards of the reads
 * staged for this job, each used (acquired) until the job's reads are
 * taken or released, so no descriptor closes under a read. */
typedef struct emlio__job_io {
    emlio__shard_t **holds;
    size_t n_holds;
    uint64_t bytes;        /* what its staged reads took from the file system */
    uint64_t shared_bytes; /* of its record bytes, those copied from a chunk
                              another job read (sharecache.h) */
    bool share;            /* read through the shared cache */
} emlio__job_io_t;

/* Its training job and its place in the fair queue (server_jobs.c): queued
 * there until its turn, then dispatched to the readers. */
typedef struct emlio__job_sched {
    struct emlio__trainjob *tjob;
    emlio__fairq_item_t fq;
    struct emlio__job *held_next; /* in its job's held list */
    uint64_t queued_ns;
    bool dispatched; /* holds a slot of the pipeline's window */
} emlio__job_sched_t;

/* One GET on its way through the daemon: gate (frontend) -> fair queue ->
 * reader -> transform stage (a GET with a transform) -> serializer ->
 * frontend, which forwards the reply. */
typedef struct emlio__job {
    zmq_msg_t identity;
    zmq_msg_t header; /* kept alive: msg borrows strings from it */
    emlio__wire_msg_t msg;
    emlio__view_t *views; /* filled by the reader; skipped ones left out */
    size_t n_views;       /* samples read (views hold n_views * per) */
    size_t per;           /* views per sample (fields), set by the reader */
    /* The fields its session asked for (server_fields.c; interned, lives
     * as long as the server); NULL: the daemon's own. */
    const emlio__fieldset_t *fields;
    int code; /* the verdict so far: 0, or the error to answer with */
    char text[EMLIO_ERRMSG_LEN];
    struct emlio_server *srv; /* for the transform pool's callbacks */
    emlio__job_xf_t xf;
    emlio__job_copy_t copy;
    emlio__job_pack_t pack;
    emlio__job_io_t io;
    emlio__job_sched_t sched;
} emlio__job_t;

/* Samples above this size that are served zero-copy from a leased mapping
 * or copied into a packed frame get a CRC derived from the stored one,
 * with no CRC pass over their bytes (docs/protocol.md 9); smaller ones are
 * copied while in cache and checked there. */
#define EMLIO__SRV_DERIVE_MIN     (EMLIO_SERVER_PACK_SMALL + 1)
/* The most bytes one packed frame holds; the rest go as frames of their
 * own. Pool classes run from 4 KiB up to it by powers of two. */
#define EMLIO__SRV_PACK_CAP       (4u << 20)
#define EMLIO__SRV_PACK_MIN_SHIFT 12
#define EMLIO__SRV_PACK_CLASSES   11
/* Bytes of idle buffers the pool keeps per class. */
#define EMLIO__SRV_PACK_KEEP      (16u << 20)

/* Pre-touched buffers for packed frames: fresh memory costs a page fault
 * per 4 KiB (~16 us on our VMs), far more than the copy it holds. Buffers
 * come back from ZeroMQ's I/O threads, hence the lock. */
typedef struct emlio__pack_pool {
    pthread_mutex_t lock;
    void *free[EMLIO__SRV_PACK_CLASSES]; /* singly linked through word 0 */
    size_t n_free[EMLIO__SRV_PACK_CLASSES];
} emlio__pack_pool_t;

/* What zero-copy frames point into, and so what must outlive every frame
 * ZeroMQ holds: the shards and their mappings. The server holds one
 * reference and every sent batch one more, so emlio_server_destroy never
 * frees what a ZeroMQ I/O thread may still read or call back into. */
typedef struct emlio__srv_core {
    atomic_uint refs;
    bool drop_behind;
    /* ioengine.h (server_io.c): io_engine, readers may stage exact-size
     * reads (--io read, or auto); io_reading, the dataset is read, not
     * mapped (every readable shard's read_io set, but for io_mapped
     * resident ones); io_auto, looked at again while serving (and
     * io_switches counts the changes). io_depth reads in flight per
     * reader. */
    bool io_engine;
    bool io_auto;
    atomic_bool io_reading;
    atomic_uint io_mapped;
    atomic_uint io_switches;
    unsigned io_depth;
    uint64_t read_ahead; /* bytes each reader may hold staged ahead */
    uint32_t readers;
    /* Chunks read once for every job that shares reads (sharecache.h);
     * NULL when the daemon reads nothing from the device. */
    struct emlio__share_cache *share;
    /* The readers' recent share of time waiting for the device
     * (emlio__srv_disk_share), sampled at most every 250 ms. */
    pthread_mutex_t disk_lock;
    uint64_t disk_at_ns, disk_wait_ns;
    int disk_pct;
    emlio__shardset_t set;
    /* Sent batches whose frames ZeroMQ still holds. */
    atomic_uint_fast64_t batches_in_flight;
    /* Bytes of copied replies charged and not yet freed, daemon-wide. */
    atomic_uint_fast64_t copied;
    emlio__pack_pool_t pack_pool; /* buffers of packed frames */
} emlio__srv_core_t;

/* One TCP (or IPC) connection of the ROUTER, known from the socket
 * monitor by its file descriptor. */
typedef struct emlio__conn {
    int fd;
    /* The socket's inode when registered: the monitor's events can be
     * lost (its queue overflows while accepts fail by the thousand), so a
     * descriptor number alone may by now name another connection. */
    ino_t ino;
    uint64_t last_seen_ns;
    bool closing; /* shut down by us; waiting for ZeroMQ to notice */
} emlio__conn_t;

/* Outstanding GETs of one client (by ZeroMQ routing id). */
typedef struct emlio__peer {
    uint8_t id[EMLIO__SRV_MAX_IDENTITY];
    uint8_t id_len;
    uint32_t outstanding;
    uint64_t last_seen_ns;
    int fd;            /* its connection (ZMQ_SRCFD), -1 when unknown */
    ino_t ino;         /* that socket's inode: fd may name another by now */
    uint64_t session;  /* the client session it joined by HELLO; 0 = none
                          (no session: each connection is a client) */
    bool stalled;      /* a reply could not be queued: it does not read */
    uint64_t bytes;    /* reply bytes forwarded to it (its session's, once
                          its other streams are gone) */
    uint64_t since_ns; /* when it (or its session) was admitted */
    char addr[64];     /* where it connects from, for the log */
    emlio__copy_acct_t *copy; /* its copied bytes (NULL: out of memory) */
    bool coalescing;   /* its replies are sent with Nagle on, and their ends
                          pushed (server_request.c) */
    bool no_coalesce;  /* never: a short path (auto mode), not TCP, or its
                          descriptor names another socket by now */
    uint32_t pack_max; /* the largest frame packed for it (cfg.pack and
                          where it connects from, s_peer_pack_max) */
    struct emlio__trainjob *tjob;    /* its job (server_jobs.c); NULL until
                                        its HELLO or first GET */
    bool share;                      /* its HELLO asked for shared reads */
    const emlio__fieldset_t *fields; /* its HELLO's "fields"; NULL: the
                                        daemon's own */
} emlio__peer_t;

/* Owned copies of the configuration's strings, and what is derived from
 * them at load (server.c). */
typedef struct emlio__srv_own {
    char *data_dir;
    char *bytes_key;
    char *label_key;
    char *format; /* copies of cfg's strings (NULL = default) */
    char *field;
    char *label_field;    /* "cls" unless configured */
    bool label_field_set; /* configured (a field no shard has is an error) */
    bool label_key_set;   /* configured (records must have it) */
    char *fields_spec;    /* cfg.fields, copied */
    char *index_dir;      /* cfg.index_dir, copied */
    char *job_weights;    /* cfg.job_weights, copied */
    char **fields;        /* the names of --fields; NULL = one default */
    size_t n_fields;      /* 0 = one default field */
    size_t bytes_key_len; /* measured once, not per sample */
    size_t label_key_len;
    char *name;
    char *curve_secret;
    char *authorized_keys;
    char **classes; /* label i's name (classes.h); NULL = not known */
    size_t n_classes;
} emlio__srv_own_t;

/* Sockets and their addresses (server.c creates them; the frontend thread
 * alone uses router and monitor once started). */
typedef struct emlio__srv_net {
    void *router;
    void *monitor; /* PAIR receiving the ROUTER's connection events */
    void *work;    /* frontend -> readers (bound in start) */
    void *done;    /* serializers -> frontend (bound in start) */
    char inproc_monitor[64];
    int bound_port; /* TCP port of the router, -1 for other transports */
    char endpoint[256];
    char inproc_work[64];
    char inproc_done[64];
    emlio_buf_t welcome; /* the WELCOME of the daemon's own fields */
    emlio__zap_t *zap;
    bool curve;
    char curve_public[EMLIO_CURVE_KEY_LEN];
} emlio__srv_net_t;

/* The threads (server.c starts and joins them; server_pipeline.c runs
 * readers and serializers). */
typedef struct emlio__srv_threads {
    pthread_t frontend;
    pthread_t *workers; /* cfg.workers readers, then the serializers */
    emlio__queue_t *ser_queue;
    uint32_t n_workers_started;
    bool frontend_started;
    atomic_bool stopping;
    atomic_bool frontend_stopped; /* joined: it sends readers no more jobs */
    pthread_t io_watch;           /* --io auto's look (server_io.c) */
    bool io_watch_started;
} emlio__srv_threads_t;

/* Admission: frontend-thread state (server_admit.c, server_request.c). */
typedef struct emlio__srv_admit {
    emlio__peer_t *peers; /* compact: a removed peer's slot takes the last */
    size_t n_peers;
    size_t cap_peers;
    emlio__keyindex_t peer_index; /* routing id -> slot in peers */
    size_t n_clients; /* sessions, counting a session-less peer as one */
    emlio__netpath_bufplan_t sndbuf;
    emlio__conn_t *conns; /* compact, like peers */
    size_t n_conns;
    size_t cap_conns;
    emlio__keyindex_t conn_index; /* descriptor -> slot in conns */
    int cur_fd;                   /* connection of the message being handled */
    uint64_t err_log_ns;          /* rate limit of refused-request lines */
    uint64_t err_log_n;
    uint64_t err_log_quiet;
    /* Connections at once that leave the shard cache its descriptors
     * (0: no cap): beyond it the idlest silent connection, or else the
     * new one, is closed, so idle sockets cannot starve shard opens. */
    size_t max_conns;
    uint64_t conns_log_ns;  /* last "closing connections beyond" line */
    uint64_t conns_closed;  /* closed for max_conns since that line */
    uint64_t fd_log_ns;     /* last "out of file descriptors" line */
    uint64_t accept_failed; /* accepts refused since that line */
    uint64_t client_log_ns; /* start of the client log's current window */
    uint64_t client_log_n;  /* client lines in it; beyond a few, counted */
    uint64_t client_log_quiet;
    /* GETs parked for room in the copy budget, in arrival order
     * (server_gate.c). */
    struct emlio__job **parked;
    size_t n_parked;
    size_t cap_parked;
    /* Readahead (server_gate.c): per shard, per chunk of about
     * EMLIO__SRV_RA_CHUNK bytes of records, when it was last advised (ms
     * since start + 1; 0 = never). NULL until the shard is first asked. */
    uint32_t **ra_stamp;
    size_t ra_n; /* shards in ra_stamp */
    uint64_t ra_t0_ns;
} emlio__srv_admit_t;

/* Counters, written by any thread, read by emlio_server_stats. */
typedef struct emlio__srv_counters {
    atomic_uint_fast64_t requests;
    atomic_uint_fast64_t errors;
    atomic_uint_fast64_t samples;
    atomic_uint_fast64_t bytes;
    atomic_uint_fast64_t corrupt_skipped;
    atomic_uint_fast64_t clients;
    atomic_uint_fast64_t active_clients;
    atomic_uint_fast64_t active_streams;
    atomic_uint_fast64_t packed_bytes;
    atomic_uint_fast64_t copy_waits; /* GETs that waited for the budget */
} emlio__srv_counters_t;

struct emlio_server {
    emlio_ctx_t *ctx;
    emlio_server_config_t cfg; /* strings point into own */
    emlio__srv_own_t own;
    emlio__srv_core_t *core; /* shards and mappings, shared with frames */
    emlio__read_opts_t rd;   /* what readers ask of the formats (load) */
    bool loaded;
    emlio__srv_net_t net;
    emlio__srv_threads_t thr;
    emlio__srv_admit_t adm;
    emlio__srv_counters_t count;
    emlio__xfspecs_t xf;    /* transform specs and threads (server_xf.c) */
    emlio__srv_jobs_t jobs; /* training jobs, fair dispatch (server_jobs.c) */
    emlio__srv_fieldsets_t fieldsets; /* lists clients named (frontend) */
    bool jobs_ready;                  /* jobs initialised (at load) */
    atomic_bool interrupted;          /* emlio_server_interrupt: stop loading */
    char err[EMLIO_ERRMSG_LEN];
};

/* ---- server.c: socket options, the core, the shard log ---- */
int emlio__srv_setopt_int(void *sock, int option, int value, const char *what,
                          char *errbuf);
void emlio__srv_core_unref(emlio__srv_core_t **core_p);
void emlio__srv_shardset_log(void *userdata, const char *msg);
/* The full WELCOME into out, for sessions served fields[0, n_fields)
 * (none: one unnamed field). 0 or EMLIO_ENOMEM. */
int emlio__srv_encode_welcome(emlio_server_t *self, char *const *fields,
                              size_t n_fields, emlio_buf_t *out);

/* ---- server_admit.c: connections and peers (frontend thread only) ---- */
/* The indexes of peers and connections (emlio_server_new), and everything
 * admission holds (destroy). */
void emlio__srv_admit_init(emlio_server_t *self);
void emlio__srv_admit_release(emlio_server_t *self);
size_t emlio__srv_session_streams(const emlio_server_t *self, uint64_t session);
emlio__conn_t *emlio__srv_conn_find(emlio_server_t *self, int fd);
emlio__conn_t *emlio__srv_conn_add(emlio_server_t *self, int fd, uint64_t now);
/* Whether conn's descriptor still holds the socket it was registered with. */
bool emlio__srv_conn_same(const emlio__conn_t *conn);
void emlio__srv_monitor_drain(emlio_server_t *self);
void emlio__srv_conns_expire(emlio_server_t *self, uint64_t now);
void emlio__srv_peers_expire(emlio_server_t *self, uint64_t now);
emlio__peer_t *emlio__srv_peer_add(emlio_server_t *self, const uint8_t *id,
                                   size_t len, bool add, uint64_t session);
emlio__peer_t *emlio__srv_peer_find(emlio_server_t *self, const uint8_t *id,
                                    size_t len, bool add);
void emlio__srv_peer_flooding(emlio_server_t *self, emlio__peer_t *peer);
/* When a GET of peer arrives (its outstanding count just grew): decides,
 * once, whether its replies travel with Nagle on (it pipelines on a path
 * that qualifies: cfg.coalesce, emlio_coalesce_t); server_request.c then
 * toggles it per reply from ZeroMQ's I/O thread. */
void emlio__srv_peer_coalesce(emlio_server_t *self, emlio__peer_t *peer);

/* ---- server_request.c: the frontend thread ---- */
void *emlio__srv_frontend_main(void *arg);
/* Hands a job to the readers; 0, or -1 (stopping, or the socket failed:
 * the job is still the caller's). */
int emlio__srv_send_work(emlio_server_t *self, void *work, emlio__job_t *job);

/* ---- server_pipeline.c: replies, jobs, reader and serializer threads ---- */
int emlio__srv_send_parts(void *sock, zmq_msg_t *identity, zmq_msg_t *header,
                          zmq_msg_t *frames, size_t n, int flags);
int emlio__srv_send_error(void *sock, zmq_msg_t *identity, uint64_t id,
                          int code, const char *text, int flags);
void emlio__srv_job_free(emlio_server_t *self, emlio__job_t *job);
void emlio__srv_job_drop(emlio_server_t *self, emlio__job_t *job);
void *emlio__srv_reader_main(void *arg);
void *emlio__srv_serializer_main(void *arg);
void emlio__srv_view_release(emlio_server_t *self, emlio__view_t *view);
void emlio__srv_skip(emlio_server_t *self, const char *msg);
int emlio__srv_header_msg(zmq_msg_t *msg, emlio_buf_t *header);
/* The one frame of an ERROR reply, in header; 0 or EMLIO_ENOMEM. */
int emlio__srv_error_msg(zmq_msg_t *header, uint64_t id, int code,
                         const char *text);

/* ---- server_copy.c: the copy budget (frontend thread, but release) ---- */
emlio__copy_acct_t *emlio__srv_copy_acct_new(void);
void emlio__srv_copy_acct_unref(emlio__copy_acct_t **acct_p);
/* Gives a charge back (any thread); leaves it empty. */
void emlio__srv_copy_release(emlio__copy_charge_t *charge);
/* Packed frames' buffers: init/release with the core; get returns a buffer
 * of at least want (<= EMLIO__SRV_PACK_CAP) bytes, its size in *size, or
 * NULL; put takes one back (any thread). */
/* server_io.c: --io decided at load (and logged), and under --io auto
 * looked at again by a thread of its own while serving (started after the
 * readers, joined as the server stops). */
int emlio__srv_io_choose(emlio_server_t *self);
int emlio__srv_io_watch_start(emlio_server_t *self);
void emlio__srv_io_watch_stop(emlio_server_t *self);
/* The share of the readers' time spent waiting for the device over the
 * last quarter second or so, in percent, for BATCH's "disk" (the client's
 * `limit: disk`); EMLIO_WIRE_NO_DISK when records are not read (--io
 * map: the page cache's misses are not the readers' to time). */
int emlio__srv_disk_share(emlio__srv_core_t *core);
/* The bytes of one window of the shared schedule (WELCOME
 * "share_window"): a quarter of the shared cache; 0 without one. */
uint64_t emlio__srv_share_window(const emlio__srv_core_t *core);

/* A reply's "disk" and "rd" (the bytes job's staged reads took). */
emlio__wire_io_t emlio__srv_job_io(emlio__srv_core_t *core,
                                   const emlio__job_t *job);
void emlio__srv_pack_pool_init(emlio__pack_pool_t *pool);
void emlio__srv_pack_pool_release(emlio__pack_pool_t *pool);
uint8_t *emlio__srv_pack_get(emlio__pack_pool_t *pool, size_t want,
                             size_t *size);
void emlio__srv_pack_put(emlio__pack_pool_t *pool, uint8_t *buf, size_t size);
/* Sizes what a GET the peer may send (credit taken) can copy, and
 * charges it if it fits now: 0 (charged, or nothing to copy), 1 (does not
 * fit until earlier replies are freed: the caller parks it), or
 * EMLIO_ELIMIT / EMLIO_ENOMEM with text (refuse it). With others parked
 * (queued), a packed reply packs nothing rather than take their room. */
int emlio__srv_copy_admit(emlio_server_t *self, emlio__job_t *job,
                          emlio__peer_t *peer, bool queued, char *text,
                          size_t len);
/* Charges a parked job to acct (its connection's, or NULL) if it fits now. */
bool emlio__srv_copy_charge_if_fits(emlio_server_t *self, emlio__job_t *job,
                                    emlio__copy_acct_t *acct);

/* ---- server_gate.c: the admission of one GET (frontend thread) ---- */
typedef enum {
    EMLIO__GATE_GO,     /* hand it to emlio__srv_gate_dispatch */
    EMLIO__GATE_PARK,   /* the gate holds it until the copy budget has room */
    EMLIO__GATE_REFUSE, /* answer ERROR with the refusal */
} emlio__gate_verdict_t;

typedef struct emlio__refusal {
    int code; /* the ERROR's code: EMLIO_ECREDIT, EMLIO_ELIMIT, ... */
    char text[EMLIO_ERRMSG_LEN];
} emlio__refusal_t;

/* Whether a request from identity is dropped unread: its peer stopped
 * reading and is at its credit limit (asked before decoding). */
bool emlio__srv_gate_unread(emlio_server_t *self, const zmq_msg_t *identity);
/* Every gate of a decoded GET, in order (server_gate.c lists them). GO
 * and PARK set *peer (NULL otherwise) and take one of its credits; PARK
 * keeps the job. REFUSE fills why and leaves the job to the caller. */
emlio__gate_verdict_t emlio__srv_gate_get(emlio_server_t *self,
                                          emlio__job_t *job,
                                          emlio__peer_t **peer,
                                          emlio__refusal_t *why);
/* Hands an admitted GET of peer (NULL: forgotten while parked) to the
 * scheduler; on failure (stopping) gives its credit back, drops it and
 * returns -1. */
int emlio__srv_gate_dispatch(emlio_server_t *self, void *work,
                             emlio__job_t *job, emlio__peer_t *peer);
/* Dispatches the parked GETs that fit now, in arrival order. */
void emlio__srv_gate_parked_run(emlio_server_t *self, void *work);
/* Drops the parked GETs (the frontend stops). */
void emlio__srv_gate_parked_drop(emlio_server_t *self);

/* ---- server_xf.c: the transform stage ---- */
int emlio__srv_xf_admit(emlio_server_t *self, emlio__job_t *job, char *text);
bool emlio__srv_xf_start(emlio_server_t *self, emlio__job_t *job);
bool emlio__srv_xf_serialize(emlio_server_t *self, void *done,
                             emlio__job_t *job);
void emlio__srv_xf_job_free(emlio__job_t *job);
/* The tensor blocks the job's transform makes of its GET's samples (0
 * without one), which the copy budget and the fair queue both count. */
uint64_t emlio__srv_xf_bytes(const emlio__job_t *job);

#endif /* EMLIO_SERVER_INTERNAL_H */
