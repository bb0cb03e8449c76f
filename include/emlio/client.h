/* emlio/client.h - the training-side client: runs epochs against daemons.
 * SPDX-License-Identifier: MIT
 *
 * A client connects to one or more emliod daemons, learns their shard
 * inventories, plans each epoch for its rank (see emlio/plan.h), and keeps
 * many batch requests in flight over several TCP streams per daemon. Batches
 * are handed over as they arrive (out of order) unless in_order is set.
 *
 * Example:
 *   emlio_client_config_t cfg;
 *   emlio_client_config_init(&cfg);
 *   cfg.batch_size = 256;
 *   emlio_client_t *c = emlio_client_new(ctx, &cfg);
 *   if (emlio_client_connect(c, "tcp://node1:5555,tcp://node2:5555") < 0)
 *       die(emlio_client_errmsg(c));
 *   for (uint64_t epoch = 0; epoch < 10; epoch++) {
 *       emlio_client_begin_epoch(c, epoch);
 *       emlio_batch_t *b;
 *       int rc;
 *       while ((rc = emlio_client_next(c, &b)) > 0) {
 *           size_t n;
 *           const emlio_sample_t *s = emlio_batch_samples(b, &n);
 *           for (size_t i = 0; i < n; i++)
 *               train_on(s[i].data, s[i].len, s[i].label);
 *           emlio_batch_release(&b);
 *       }
 *       if (rc < 0) die(emlio_client_errmsg(c));
 *   }
 *   emlio_client_destroy(&c);
 *
 * Thread rules: a client and its batches are used by one thread at a time
 * (ZeroMQ's own I/O threads keep receiving in the background, which is what
 * hides the network). Batches may be released from another thread than the
 * one that got them, but not concurrently with calls on the client.
 */
#ifndef EMLIO_CLIENT_H
#define EMLIO_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emlio_ctx emlio_ctx_t;
typedef struct emlio_client emlio_client_t;
typedef struct emlio_batch emlio_batch_t;

/* One source of a blended job (docs/planner.md, "Sources"): a dataset on
 * one or more daemons, and its share of every epoch. */
typedef struct emlio_source {
    const char *name;      /* 1..64 printable bytes, unique in the job */
    const char *endpoints; /* its daemons, comma-separated */
    double weight;         /* its share against the other weighted
                              sources: finite and > 0; ignored when samples
                              is set */
    uint64_t samples;      /* exactly this many samples an epoch; 0: by
                              weight */
} emlio_source_t;

typedef struct emlio_client_config {
    uint32_t batch_size;    /* samples per batch; default 32. May exceed
                               the daemons' samples per GET (WELCOME
                               max_batch): the batch is then asked for in
                               parts within it (see request_bytes) */
    uint32_t world;         /* ranks in the job; default 1 */
    uint32_t rank;          /* this rank; default 0 */
    uint64_t seed;          /* shuffle seed shared by all ranks; default 0 */
    int shuffle;            /* enum emlio_shuffle; default window */
    uint32_t window_shards; /* shuffle window; 0 = planner default */
    bool drop_last;         /* see emlio/plan.h; default false */
    uint32_t streams;       /* TCP streams per daemon. 0 (default): tuned -
                               start with 2 (more, up to 16, on a long path
                               where 2 could not carry 250 MB/s at the
                               measured RTT and window) and open more (up
                               to 64) while the path's TCP windows, not the
                               consumer or the daemons, limit the rate (see
                               emlio_client_stats_t.limit); N: exactly N */
    uint32_t inflight;      /* batches in flight; 0 = sized from the
                               measured bandwidth-delay product */
    bool in_order;          /* deliver in plan order; default false */
    bool verify;            /* check every sample's CRC-32C; default true */
    int connect_timeout_ms; /* give up connecting after this; default 10000 */
    int timeout_ms;         /* fail when no reply arrives for this long;
                               default 60000 */
    const char *name;       /* client name sent in HELLO; default
                               "emlio-client" */
    /* CURVE (encryption and authentication), all three or none: the
     * daemon's public key and this client's key pair, each as 40 Z85
     * characters (see `emlio keygen`). Borrowed until connect returns. */
    const char *curve_server_key;
    const char *curve_public_key;
    const char *curve_secret_key;
    /* One past the last epoch the caller will run (e.g. first + epochs),
     * or 0 (default) when not known. While epoch e's last batches arrive,
     * the client already requests epoch e + 1's first ones (within the
     * same in-flight window), so the pipe never drains between epochs;
     * they are handed over only after begin_epoch(e + 1), and dropped if
     * the caller begins another epoch or stops. With end_epoch set, no
     * epoch at or past it is requested. */
    uint64_t end_epoch;
    /* Decoded tensors instead of encoded bytes (docs/transform.md): a
     * transform spec such as "random_resized_crop(224),horizontal_flip"
     * (emlio/transform.h), or NULL (default) for the samples as stored.
     * Every batch then also carries one uint8 block of batch x H x W x 3
     * (emlio_batch_images), byte-identical whichever side decoded it.
     * Borrowed until connect returns. */
    const char *transform;
    int32_t decode_at;          /* enum emlio_decode_at; default auto */
    uint32_t transform_threads; /* decode threads here; 0 (default) = one
                                   per online CPU */
    uint64_t max_pixels;        /* images above this are refused; 0
                                   (default) = 100 million */
    /* Bytes asked for by one GET. A daemon's share of a batch is asked
     * for in parts of about this many bytes (by the dataset's mean sample
     * size), spread over the streams and reassembled here, so that each
     * part is checked while it is still in the CPU's cache at both ends:
     * over loopback, batches of 256 x 110 KB cost 0.68-0.70 CPU-s/GB as one
     * GET and 0.53-0.58 in parts (docs/performance.md, "A batch in parts").
     * 0 (default) = 2 MiB;
     * UINT64_MAX = one GET per daemon per batch. Parts never make a batch
     * look different to the caller. */
    uint64_t request_bytes;
    /* ZeroMQ I/O threads of the library context the streams use (at most
     * the context's two). 0 (default): daemons on this host (loopback,
     * ipc) and fixed streams use them all at once; others start on one
     * and take the next when it runs 3/4 of a CPU in two tuner ticks in a
     * row (one thread reads more per wake-up, so the kernel ACKs less:
     * docs/tuning.md). N: N from the start, never more. */
    uint32_t io_threads;
    /* Shards of one name whose content differs between daemons (their
     * WELCOME digests, record counts or sizes disagree) are refused by
     * default: reading either as a replica of the other would deliver the
     * wrong samples. true: they are distinct shards, each read from the
     * daemons that hold that content (an ImageFolder class split over
     * nodes by files: docs/formats.md, "One dataset on several nodes").
     * Default false. */
    bool disjoint_shards;
    /* Shared reads (docs/fairness.md, "Shared reads"): plan each epoch
     * from the dataset's shared schedule (docs/planner.md), so that jobs
     * over one dataset read its windows of shards in the same order,
     * each in its own seed's order inside the window, and ask the daemons
     * to serve this job from the chunks they read once for all of them.
     * Every sample still comes exactly once per epoch. Windows are sized
     * from the daemons' WELCOME "share_window" unless window_shards is
     * set. Default false. */
    bool share;
    /* Where a sharing job's epoch 0 begins in the shared schedule
     * (docs/planner.md, "Joining"). EMLIO_SHARE_JOIN_AUTO (default): where
     * the daemons' other sharing jobs are reading now (WELCOME
     * "share_cursor"), so that a job started late reads what they read
     * from its first batch; from the start when none is, and for a job of
     * several ranks that has no name (its ranks could be told different
     * places). EMLIO_SHARE_JOIN_AT: at cursor share_join (0: the start;
     * the cursor another run reported, to repeat its order). A resumed
     * state keeps the cursor it was saved with. */
    uint8_t share_join_mode;
    /* A sample this client cannot decode (enum emlio_on_corrupt, core.h):
     * EMLIO_ON_CORRUPT_FAIL (default) fails next() naming its shard and
     * record; EMLIO_ON_CORRUPT_SKIP leaves it out of its batch, logs why
     * and lists it in emlio_client_skipped. Samples the daemons decode
     * follow the daemons' own policy (emliod --on-corrupt): run both with
     * skip for one rule wherever decode_at puts a batch. */
    uint8_t on_corrupt;
    /* The training job this client belongs to, sent in HELLO
     * (docs/fairness.md): the daemon shares its readers among jobs by
     * weight, counting every rank and stream of one job as one. NULL
     * (default): $EMLIO_JOB, else $TORCHELASTIC_RUN_ID, else $SLURM_JOB_ID,
     * else none (this client is a job of its own). 1..64 printable bytes.
     * Copied. */
    const char *job;
    /* The weight the job asks for, 1..1000; the daemon caps it by its
     * policy (emliod --job-weight). 0 (default): the policy's. */
    uint32_t job_weight;
    uint32_t reserved32; /* zero */
    /* Room for options added later without changing the struct's size:
     * config_init zeroes it; leave it zero. */
    uint64_t share_join; /* the cursor of EMLIO_SHARE_JOIN_AT */
    /* The fields wanted of every sample, in this order, as a comma list
     * ("jpg,cls", as webdataset's to_tuple), asked of the daemons in
     * HELLO (docs/formats.md, "Multi-field samples"). A daemon started
     * with --fields serves any of its list (its default for clients that
     * name none); one without serves any field its shards have, and a
     * sample without one fails its request naming it. A name the daemon
     * cannot serve fails connect (EMLIO_ENOTFOUND, naming it); a bad list
     * (an empty name, a name twice) EMLIO_EINVAL. NULL (default): the
     * daemon's fields. Borrowed until emlio_client_new returns. */
    const char *fields;
    /* Sources (docs/planner.md, "Sources"): n_sources datasets blended in
     * every epoch in exact quotas, each on its own daemons; connect is
     * then given NULL for endpoints. Every sample says its source
     * (emlio_sample_t.source). Sources are mixed whole: no window_shards,
     * no share. Copied by emlio_client_new. 0 and NULL: one dataset, on
     * the endpoints connect is given. */
    const emlio_source_t *sources;
    uint32_t n_sources;
    /* Every global batch holds each source's share of it within one
     * sample (with sources only). Default false. */
    bool stratify;
    /* Samples per epoch over all ranks; 0 (default): the sum of the
     * sources' sizes (with sources only). */
    uint64_t epoch_samples;
} emlio_client_config_t;

/* emlio_client_config_t.share_join_mode. */
enum emlio_share_join { EMLIO_SHARE_JOIN_AUTO = 0, EMLIO_SHARE_JOIN_AT = 1 };

/* Where a client's transforms run (emlio_client_config_t.decode_at). */
enum emlio_decode_at {
    /* Placed per epoch by measured time and energy: the share of batches
     * the daemons decode minimises joules per image without being more
     * than 10% slower than the fastest share (emlio_client_xf_stats). */
    EMLIO_DECODE_AUTO = 0,
    EMLIO_DECODE_CLIENT = 1, /* here, on transform_threads */
    EMLIO_DECODE_SERVER = 2  /* on the daemons (emliod --transform-threads) */
};

/* "auto", "client" or "server"; NULL for other values. */
EMLIO_EXPORT const char *emlio_decode_at_name(int decode_at);
/* The value of a name above, or EMLIO_EINVAL. */
EMLIO_EXPORT int emlio_decode_at_parse(const char *name);

/* Fills cfg with the defaults documented above. */
EMLIO_EXPORT void emlio_client_config_init(emlio_client_config_t *cfg);

/* Allocates a client; cfg is copied. NULL only when out of memory. */
EMLIO_EXPORT emlio_client_t *emlio_client_new(emlio_ctx_t *ctx,
                                              const emlio_client_config_t *cfg);

/* Closes the sockets and frees the client. Every batch must have been
 * released first. Accepts NULL; sets *self_p to NULL. */
EMLIO_EXPORT void emlio_client_destroy(emlio_client_t **self_p);

/* Connects to the comma-separated ZeroMQ endpoints, one per daemon, and
 * fetches each daemon's inventory; with sources configured, endpoints is
 * NULL and the daemons are the sources' (a bad source, such as a weight
 * that is not a positive number, two sources of one name or one endpoint
 * in two sources, is EMLIO_EINVAL naming it). Blocks up to connect_timeout_ms.
 * Returns the number of daemons, -ECONNREFUSED (nothing listens at an endpoint:
 * said at once, not after the timeout), EMLIO_ETIMEDOUT (a daemon did not
 * answer: the message names it), EMLIO_EDENIED (the daemon refused our CURVE
 * key, or the security settings of the two sides differ), EMLIO_EVERSION,
 * EMLIO_EINVAL (bad endpoint list, two daemons disagreeing about a shard,
 * incomplete CURVE keys) or -errno.
 *
 * After connect, a stream whose daemon goes away reconnects by itself with
 * exponential backoff (up to 2 s between tries); once it is back, the
 * requests it had in flight are sent again, so a daemon restarted with the
 * same data completes the epoch with every sample exactly once.
 *
 * State after a failure: the client is as new (no daemon, no shard), so
 * connect may be called again, with the same or other endpoints. A wrong
 * CURVE server key fails with EMLIO_EDENIED after a few failed handshakes
 * (well under a second), not after connect_timeout_ms. */
EMLIO_EXPORT int emlio_client_connect(emlio_client_t *self,
                                      const char *endpoints);

/* The union of the daemons' shards, by name (replicas once), in name order:
 * count, and name/records of shard i (borrowed, valid until destroy). */
EMLIO_EXPORT size_t emlio_client_shard_count(const emlio_client_t *self);
EMLIO_EXPORT const char *emlio_client_shard_name(const emlio_client_t *self,
                                                 size_t i);
EMLIO_EXPORT uint64_t emlio_client_shard_records(const emlio_client_t *self,
                                                 size_t i);

/* Bytes of shard i as its daemon reports them (file size; the files of an
 * ImageFolder class), and the dataset's format as the first daemon names
 * it ("tfrecord", "tar", "imagefolder", "mixed"; "" from daemons that do
 * not say). */
EMLIO_EXPORT uint64_t emlio_client_shard_bytes(const emlio_client_t *self,
                                               size_t i);
EMLIO_EXPORT const char *emlio_client_format(const emlio_client_t *self);

/* The dataset's class names, when the daemons know them (an ImageFolder's
 * class directories, or the classes.txt `emlio pack` writes next to its
 * shards): count (0: not known), and the name of label i (borrowed, valid
 * until destroy; NULL past the count). */
EMLIO_EXPORT size_t emlio_client_class_count(const emlio_client_t *self);
EMLIO_EXPORT const char *emlio_client_class_name(const emlio_client_t *self,
                                                 size_t label);

/* The job's sources (0 without them), the name of source s (borrowed;
 * NULL past the count), the source of shard i, and the samples source s
 * has in the current epoch over all ranks (its quota; 0 before the first
 * begin_epoch). */
EMLIO_EXPORT size_t emlio_client_source_count(const emlio_client_t *self);
EMLIO_EXPORT const char *emlio_client_source_name(const emlio_client_t *self,
                                                  size_t s);
EMLIO_EXPORT uint32_t emlio_client_shard_source(const emlio_client_t *self,
                                                size_t i);
EMLIO_EXPORT uint64_t emlio_client_source_quota(const emlio_client_t *self,
                                                size_t s);

/* The daemons that hold shard i (indices for emlio_client_daemon_endpoint),
 * count in *n; borrowed, valid until destroy. */
EMLIO_EXPORT const uint32_t *
emlio_client_shard_holders(const emlio_client_t *self, size_t i, size_t *n);

/* Daemons connected, and the endpoint of daemon d (borrowed). */
EMLIO_EXPORT size_t emlio_client_daemon_count(const emlio_client_t *self);
EMLIO_EXPORT const char *
emlio_client_daemon_endpoint(const emlio_client_t *self, size_t d);

/* Plans epoch for this rank and starts requesting its batches (or takes
 * over those already requested ahead: see end_epoch). Batches of an
 * unfinished previous epoch that were not yet delivered are abandoned.
 * Returns the number of batches this rank will receive in the epoch, or
 * EMLIO_EINVAL / EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_client_begin_epoch(emlio_client_t *self, uint64_t epoch);

/* Waits for the next batch of the current epoch. Returns 1 with *batch_out
 * set (the caller releases it with emlio_batch_release), 0 at the end of the
 * epoch, or < 0 on failure: EMLIO_ETIMEDOUT (no reply for timeout_ms),
 * EMLIO_ECORRUPT (a sample failed its checksum, or a daemon reported a
 * corrupt record), EMLIO_EPROTO (a daemon sent something malformed),
 * EMLIO_EMISMATCH (a restarted daemon serves a different dataset), or the
 * error a daemon returned, or -EINTR when a signal interrupted the wait
 * (call again to carry on; nothing is lost). The message names the daemon
 * and the reason.
 *
 * State after a failure: EMLIO_ETIMEDOUT, -EINTR and EMLIO_EINVAL lose
 * nothing; call again. Any other failure ends the epoch: the client stays
 * usable, but every later next() returns the same code at once (saying
 * that the epoch failed earlier) until begin_epoch or load_state starts an
 * epoch again. Batches already returned stay valid until released. */
EMLIO_EXPORT int emlio_client_next(emlio_client_t *self,
                                   emlio_batch_t **batch_out);

/* One sample of a batch: a zero-copy view valid until the batch is
 * released. */
typedef struct emlio_sample {
    const uint8_t *data; /* the sample's bytes (e.g. an encoded JPEG) */
    size_t len;
    int64_t label;   /* -1 when the record has none */
    uint32_t shard;  /* index for emlio_client_shard_name */
    uint64_t record; /* record index within the shard */
    bool pad;        /* a repeat that only evens out batch counts */
    uint32_t source; /* index for emlio_client_source_name; 0 without
                        sources */
} emlio_sample_t;

/* The samples of a batch, in plan order, and their count in *n. */
EMLIO_EXPORT const emlio_sample_t *emlio_batch_samples(const emlio_batch_t *b,
                                                       size_t *n);

/* Multi-field samples (a daemon started with --fields):
 * every sample carries one byte string per field, in the order the daemon
 * lists them; emlio_sample_t's data/len is field 0. A daemon without
 * --fields serves one unnamed field (""). Field names are borrowed from the
 * client and valid until it is destroyed; field_name returns NULL past the
 * count, field_index EMLIO_ENOTFOUND for an unknown name. */
EMLIO_EXPORT size_t emlio_client_field_count(const emlio_client_t *self);
EMLIO_EXPORT const char *emlio_client_field_name(const emlio_client_t *self,
                                                 size_t i);
EMLIO_EXPORT int emlio_client_field_index(const emlio_client_t *self,
                                          const char *name);

/* Points data and len at field `field` of sample i of the batch (zero-copy,
 * valid until the batch is released; NULL/0 for a sample the daemon
 * skipped). Returns 0 or EMLIO_ENOTFOUND (i or field out of range). */
EMLIO_EXPORT int emlio_batch_field(const emlio_batch_t *b, size_t i,
                                   size_t field, const uint8_t **data,
                                   size_t *len);

/* The batch's tensors, with a transform configured: one contiguous block of
 * *n x *height x *width x 3 uint8 (RGB, HWC), sample i at
 * i x height x width x 3, in the order of emlio_batch_samples; a sample a
 * daemon skipped as corrupt has an all-zero slot (its len is 0). Valid
 * until the batch is released. NULL (and *n 0) without a transform. */
EMLIO_EXPORT const uint8_t *emlio_batch_images(const emlio_batch_t *b,
                                               size_t *n, uint32_t *height,
                                               uint32_t *width);

/* The batch's epoch and its index in this rank's plan of that epoch. */
EMLIO_EXPORT uint64_t emlio_batch_epoch(const emlio_batch_t *b);
EMLIO_EXPORT uint64_t emlio_batch_index(const emlio_batch_t *b);

/* Returns the batch's memory to the client. Accepts NULL; sets *b_p NULL. */
EMLIO_EXPORT void emlio_batch_release(emlio_batch_t **b_p);

/* Figures of the current (or just finished) epoch. */
typedef struct emlio_client_stats {
    uint64_t epoch;
    uint64_t batches;     /* delivered this epoch */
    uint64_t samples;     /* delivered, padding included */
    uint64_t bytes;       /* sample bytes delivered */
    double seconds;       /* from begin_epoch to the last delivery */
    double wait_s;        /* time spent blocked inside next() */
    double first_batch_s; /* time to the first batch */
    uint32_t inflight;    /* window in use (batches) */
    uint64_t retries;     /* requests sent again after a reconnect */
    uint64_t skipped;     /* samples left out as corrupt (by daemons or
                             by on_corrupt skip here) */
    /* The network path, as the kernel measures it (TCP_INFO) and as the
     * stream tuner judges it; updated every few RTTs. */
    double rtt_ms;       /* RTT floor over the streams; 0 = not measured */
    double mb_per_s;     /* delivery rate over the last tuner tick */
    uint32_t streams;    /* streams per daemon (the fewest of any daemon) */
    int32_t limit;       /* what limits the rate now: enum emlio_limit */
    uint64_t window;     /* per-stream TCP window the path allows: the
                            daemons' send buffer or our receive buffer,
                            whichever is smaller; bytes */
    uint32_t io_threads; /* ZeroMQ I/O threads that carry streams: one
                            to start with, one more each time those run
                            3/4 of a CPU (docs/tuning.md); all of them
                            (up to one per stream) when the streams are
                            fixed */
    uint32_t disk_pct;   /* the share of their readers' time the daemons
                            said (BATCH "disk", the highest of their last
                            words) they spent waiting for their devices,
                            percent; 0 when none reads with --io read */
    uint64_t disk_read_bytes; /* what the daemons' reads took from their
                                 file systems for this epoch's batches
                                 (BATCH "rd"; --io read, aligned as the
                                 direct reads go: the device's bytes past
                                 the page cache). Divided by bytes: the
                                 read amplification. 0 when no daemon
                                 reads (--io map: the page cache's misses
                                 are counted daemon-wide only, in the
                                 metric emlio_server_disk_read_bytes) */
    uint64_t shared_bytes;    /* of bytes, those the daemons copied from a
                                 read another job made (BATCH "sh";
                                 share): what sharing saved the devices */
    uint64_t share_join;      /* share: the shared schedule's cursor epoch
                                 0 began at (docs/planner.md, "Joining");
                                 0 when not sharing */
} emlio_client_stats_t;

/* What limits a client's rate (emlio_client_stats_t.limit). */
enum emlio_limit {
    EMLIO_LIMIT_UNKNOWN = 0,  /* not measured yet */
    EMLIO_LIMIT_CONSUMER = 1, /* the caller: batches wait for it */
    EMLIO_LIMIT_WINDOW = 2,   /* TCP windows: each stream carries at most
                                 window / RTT; more streams or bigger buffers
                                 help (docs/tuning.md) */
    EMLIO_LIMIT_NETWORK = 3,  /* the path: queues build up (RTT above its
                                 floor) */
    EMLIO_LIMIT_DAEMON = 4,   /* the daemons (their CPU, or a disk they do
                                 not time: --io map) */
    EMLIO_LIMIT_CPU = 5       /* this host's CPUs: all busy (under 10%
                                 idle), so receiving is starved; named
                                 before the windows unless the streams
                                 run full (3/4 of window / RTT), and no
                                 stream is opened then */
    ,
    EMLIO_LIMIT_DISK = 6 /* a daemon's device: its readers spend half
                            their time or more waiting for reads (BATCH
                            "disk", --io read); a faster disk, more disks
                            or a windowed shuffle help, not streams */
};

/* "consumer", "window", "network", "daemon", "cpu", "disk" or
 * "unknown". */
EMLIO_EXPORT const char *emlio_limit_name(int limit);

/* Where the transforms ran, and why (a transform configured). */
typedef struct emlio_client_xf_stats {
    int32_t decode_at;            /* enum emlio_decode_at, as configured */
    double server_share;          /* share of this epoch's batches the daemons
                                     decode */
    bool decided;                 /* auto: share chosen from measurements (false
                                     while both sides are still being measured) */
    uint64_t batches_server;      /* this epoch's batches decoded by daemons */
    uint64_t batches_client;      /* ... and here */
    double client_ms_per_image;   /* CPU ms per image here (0 = none yet) */
    double server_ms_per_image;   /* ... on the daemons, as they report it */
    uint32_t client_threads;      /* transform_threads here */
    uint32_t server_threads;      /* the daemons' transform threads, summed */
    double predicted_ips;         /* auto: the chosen share's images/s */
    double predicted_j_per_image; /* ... and joules per image */
    double fastest_ips;           /* the fastest share's images/s */
    const char *bound;            /* what bounds the chosen share's rate:
                                     "server", "client", "link",
                                     "consumer"; "" when not decided */
    char why[320];                /* the decision, with its figures */
    uint64_t client_ws_bytes;     /* what one decode here may hold: a
                                     quarter of the memory this process
                                     may use (MemAvailable or its memory
                                     cgroup's limit) over client_threads,
                                     32-512 MiB; an image needing more is
                                     refused, naming it (docs/transform.md) */
} emlio_client_xf_stats_t;

/* Fills out; all zero without a transform. */
EMLIO_EXPORT void emlio_client_xf_stats(const emlio_client_t *self,
                                        emlio_client_xf_stats_t *out);

/* One TCP stream of a client. */
typedef struct emlio_stream_stats {
    uint32_t daemon;    /* index for emlio_client_daemon_endpoint */
    uint32_t stream;    /* stream number at that daemon */
    bool ready;         /* carries requests (joined the daemon's session) */
    double mb_per_s;    /* sample bytes over the last tuner tick */
    double rtt_ms;      /* smoothed RTT (TCP_INFO); 0 = not measured */
    uint64_t bytes;     /* sample bytes received on it */
    uint32_t io_thread; /* the ZeroMQ I/O thread carrying it, from 0 */
    uint32_t reserved32;
    uint64_t reserved[1];
} emlio_stream_stats_t;

/* Fills out[0..max) with the client's streams, daemon by daemon; returns
 * how many there are (which may exceed max). */
EMLIO_EXPORT size_t emlio_client_streams(const emlio_client_t *self,
                                         emlio_stream_stats_t *out, size_t max);

EMLIO_EXPORT void emlio_client_stats(const emlio_client_t *self,
                                     emlio_client_stats_t *out);

/* Resume state: a small serializable blob that records the epoch and which
 * of its batches were already delivered (and released or not: a batch counts
 * as delivered when next() returned it). A client built with the same
 * configuration and inventory that loads it delivers exactly the rest.
 * save: *blob_out is allocated (free with emlio_client_free_blob); on
 * failure (EMLIO_ENOMEM, or EMLIO_EINVAL before the first epoch) nothing is
 * allocated, *blob_out is left alone and the client is unchanged. */
EMLIO_EXPORT int emlio_client_save_state(const emlio_client_t *self,
                                         uint8_t **blob_out, size_t *len_out);
EMLIO_EXPORT void emlio_client_free_blob(uint8_t *blob);

/* Loads a blob made by save_state and resumes that epoch: the next call to
 * next() continues it. Returns the batches still to come, or EMLIO_ESTATE
 * (the blob is damaged, or was made with another seed, world, rank, batch
 * size or dataset: the message says which). Call after connect.
 *
 * A state describes the job, not only its rank: it carries what earlier
 * runs of the job consumed of its epoch (the global positions of the
 * epoch's order, docs/planner.md, "Elastic resume"), and the batches this
 * rank delivered of the rest. */
EMLIO_EXPORT int emlio_client_load_state(emlio_client_t *self,
                                         const uint8_t *blob, size_t len);

/* Elastic resume: loads the states every rank of the job's last run saved
 * (n of them, one per rank, in any order, whatever that run's world size)
 * and resumes their epoch on this run's ranks. What they consumed of it,
 * earlier runs included, is left out; the rest, in the epoch's global
 * order, is sliced among this run's ranks as a whole epoch would be, so
 * the union over all runs is the epoch exactly once and each rank still
 * receives samples in global order. Every rank of the new run calls this
 * with the same states and computes the same split; the cost is
 * O(states + their batches), not a replay.
 *
 * The run must keep the job's global batch (world x batch size), seed,
 * dataset, shuffle, window and drop_last (drop_last is applied to the
 * rest anew). A rank whose state is of the epoch before, complete, had
 * only finished early. Returns the batches this rank has of the rest, or
 * EMLIO_ESTATE naming the state and the reason: damaged, another job, a
 * rank missing or given twice, states of different runs or epochs,
 * another global batch. Call after connect. */
EMLIO_EXPORT int emlio_client_load_states(emlio_client_t *self,
                                          const uint8_t *const *blobs,
                                          const size_t *lens, size_t n);

/* The samples of the current epoch left out as corrupt: by daemons running
 * with on_corrupt = skip (a stored CRC that did not match, or an image that
 * did not decode there), or by this client's on_corrupt = skip (an image
 * that did not decode here). data and len are empty; shard, record and pad
 * say which. They are never delivered. Count in *n; borrowed, valid until the
 * next call. */
EMLIO_EXPORT const emlio_sample_t *
emlio_client_skipped(const emlio_client_t *self, size_t *n);

/* The plan of the current epoch (borrowed; valid until the next
 * begin_epoch), or NULL before the first epoch. The samples that
 * emlio_plan_batch returns for it are valid until the next call on this
 * client, which computes batches into the same buffer. */
typedef struct emlio_plan emlio_plan_t;
EMLIO_EXPORT const emlio_plan_t *emlio_client_plan(const emlio_client_t *self);

/* The last failure's text. Never NULL. */
EMLIO_EXPORT const char *emlio_client_errmsg(const emlio_client_t *self);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_CLIENT_H */
