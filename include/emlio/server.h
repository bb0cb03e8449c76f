/* emlio/server.h - the storage-node daemon as a library object.
 * SPDX-License-Identifier: MIT
 *
 * emliod is a thin main() around this module, so tests can run a server in
 * the same process. A server serves the shards under one data directory
 * (TFRecord files, WebDataset tar files, or an ImageFolder tree: see
 * cfg.format) on one ZeroMQ ROUTER endpoint:
 *
 * Example:
 *   emlio_server_config_t cfg;
 *   emlio_server_config_init(&cfg);
 *   cfg.data_dir = "/data/imagenet";
 *   emlio_server_t *srv = emlio_server_new(ctx, &cfg);
 *   if (emlio_server_load(srv) < 0 ||
 *       emlio_server_bind(srv, "tcp://0.0.0.0:5555") < 0 ||
 *       emlio_server_start(srv) < 0)
 *       die(emlio_server_errmsg(srv));
 *   wait_for_shutdown();
 *   emlio_server_destroy(&srv);   // stops the threads first
 *
 * Threads: start() launches a pipeline: one frontend thread (owns the TCP
 * socket: reads requests, starts readahead, sends finished batches),
 * `workers` reader threads (find and verify the records in the mapped
 * shards) and `serializers` threads (build the batch header and frames),
 * joined by an inproc socket and a bounded queue. Sample bytes
 * travel as ZeroMQ frames that point into the mapping (zero-copy). All
 * functions here are called from one controlling thread.
 */
#ifndef EMLIO_SERVER_H
#define EMLIO_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emlio_ctx emlio_ctx_t;
typedef struct emlio_server emlio_server_t;

typedef struct emlio_server_config {
    const char *data_dir;      /* borrowed; shards are found recursively */
    const char *bytes_key;     /* Example feature sent as the sample's bytes;
                                  default "image/encoded" */
    const char *label_key;     /* int64 feature sent as the label; default
                                  "image/class/label" */
    bool raw;                  /* send whole records, do not parse Examples */
    bool verify;               /* check each record's data CRC when reading;
                                  default true */
    bool write_index;          /* write missing .idx files at load; default
                                  true (failures to write are only logged) */
    uint32_t workers;          /* reader threads (find, verify); default 2 */
    uint32_t serializers;      /* serializer threads (frames, headers);
                                  default 1 */
    uint32_t queue_depth;      /* jobs between readers and serializers
                                  (backpressure); default 64 */
    bool readahead;            /* madvise WILLNEED the records of each request
                                  as it arrives; default true */
    bool drop_behind;          /* madvise DONTNEED a batch's pages once sent
                                  (datasets larger than memory); default false */
    const char *io;            /* how records are read (TFRecord and tar
                                  shards, ImageFolder files):
                                  "map" (zero-copy from the page cache),
                                  "read" (exact-size reads, io_uring where
                                  allowed, for datasets larger than memory)
                                  or "auto" (NULL, the default: "read" when
                                  the dataset is over 3/4 of the memory the
                                  daemon may use, cgroup limit included) */
    uint32_t io_depth;         /* reads in flight per reader with "read";
                                  0: the device's queue/nr_requests, capped
                                  to 128 */
    uint64_t read_ahead_bytes; /* with "read": bytes the readers may hold
                                  read for GETs queued behind the one they
                                  serve (daemon-wide, split among them);
                                  0: EMLIO_SERVER_READ_AHEAD_BYTES */
    uint32_t max_batch;        /* samples one GET may ask for; default 4096 */
    uint32_t max_credit;       /* GETs one connection (client stream) may
                                  have outstanding; default 256 */
    int on_corrupt;            /* enum emlio_on_corrupt (core.h): a record
                                  whose stored CRC does not match, or an
                                  image that does not decode; default
                                  FAIL */
    const char *name;          /* server name in WELCOME; default
                                  "emliod/<version>" */
    uint32_t max_clients;      /* clients known at once; a client's streams
                                  (joined to its session by HELLO) count
                                  once; more are refused with EMLIO_ELIMIT;
                                  default 1024 */
    uint32_t idle_timeout_ms;  /* a connection with nothing outstanding
                                  and silent this long is forgotten;
                                  default 300000 */
    /* CURVE: this daemon's secret key (40 Z85 characters; NULL = plaintext)
     * and a directory of authorized client public keys (NULL = any client
     * with CURVE, i.e. encryption without client authentication). Only one
     * CURVE server per emlio_ctx_t (ZeroMQ has one ZAP endpoint per
     * context). Copied. */
    const char *curve_secret_key;
    const char *authorized_keys;
    /* Send buffer of each client connection. 0 (default): as large as the
     * host allows - forced to 32 MiB when the process has CAP_NET_ADMIN,
     * else net.core.wmem_max when that beats autotuning, else autotuned up
     * to net.ipv4.tcp_wmem's maximum. A TCP stream carries at most about
     * its send buffer per RTT, so this is what long paths need. > 0: that
     * many bytes (forced where permitted); < 0: leave it to the kernel. */
    int64_t sndbuf;
    /* The data format (docs/formats.md): NULL or "auto" (what is found:
     * *.tfrecord files, *.tar WebDataset shards, or else an ImageFolder
     * tree of class directories), "tfrecord", "tar" or "imagefolder".
     * Copied. */
    const char *format;
    /* The field sent as each sample's bytes for tar shards (a member
     * extension such as "jpg"; NULL = the first image member) and the
     * field holding its label (NULL = "cls"). Copied. */
    const char *field;
    const char *label_field;
    bool mixed_formats; /* serve several formats under one data_dir;
                           default false (an error, naming what was found) */
    /* Multi-field samples: comma-separated field names sent as one frame
     * each per sample. tar: member extensions ("jpg,cls,json"); TFRecord:
     * Example feature keys (bytes features as they are, int64 as 8-byte
     * and float as 4-byte little-endian values); ImageFolder: "image" and
     * "label". NULL = one field, as --field/--bytes-key choose. Copied. */
    const char *fields;
    /* Transforms for clients that ask for tensors (docs/transform.md): threads
     * that decode and augment, at a lower CPU priority than reading and sending
     * so raw-byte clients are not starved; default one per online CPU, 0 = this
     * daemon does not transform. Images above max_pixels pixels are refused (0
     * = 100 million). core_mw: this host's power per busy core in milliwatts,
     * told to clients for placement by energy (0 = the energy model's
     * default). transform_threads above EMLIO_SERVER_MAX_TRANSFORM_THREADS
     * is refused by emlio_server_load. */
    uint32_t transform_threads;
    uint32_t core_mw;
    uint64_t max_pixels;
    /* Symlinks under data_dir: by default left out (one log line); true
     * follows those that resolve inside data_dir. Nothing outside
     * data_dir is ever opened, and only regular files are read
     * (docs/security.md, "One rule for paths"). */
    bool follow_symlinks;
    /* Bytes of copied replies (samples not sent zero-copy from a leased
     * mapping: ImageFolder files, shards read by pread) one connection may
     * have in memory at once, and the whole daemon. A GET that could copy
     * more than max_copy_bytes is refused with EMLIO_ELIMIT; one that does
     * not fit now waits until earlier replies are sent. Told to clients in
     * WELCOME ("max_copy_bytes"). Defaults: EMLIO_SERVER_MAX_COPY_BYTES
     * and EMLIO_SERVER_MAX_COPY_BYTES_TOTAL (0 = the default). */
    uint64_t max_copy_bytes;
    uint64_t max_copy_bytes_total;
    /* Where the dataset index (docs/protocol.md, "Dataset index") is kept
     * when data_dir is not writable: a directory holding one index per
     * data directory. NULL: data_dir/.emlio-index. Copied. */
    const char *index_dir;
    /* TFRecord and tar shards open at once (descriptor, read lease and
     * mapping each). Shards are opened when first read and the least
     * recently used idle one is closed when this budget is spent; a shard
     * whose frames are still in flight is never closed, so the budget may
     * be exceeded while every open shard is in use. 0 (default): derived
     * from RLIMIT_NOFILE (the soft limit less 64 and a quarter of it for
     * sockets and clients, at most a quarter of vm.max_map_count).
     * emlio_server_load fails with EMLIO_EINVAL, saying what to raise,
     * when the limit leaves room for fewer than 8 shards (or all of
     * them, when fewer) or this value plus 64 exceeds it. */
    uint32_t max_open_shards;
    /* Full TCP segments for a pipeline of replies (emlio_coalesce_t;
     * default EMLIO_COALESCE_AUTO). Once a client keeps GETs in flight,
     * each reply to it is written with Nagle on, so that its short writes
     * fill whole segments (fewer packets, less CPU per byte at both ends
     * and on every hop), and its end is pushed once written (TCP_NODELAY),
     * so no reply's tail waits a round trip for an ACK. A value outside the
     * enum fails emlio_server_load with EMLIO_EINVAL. Appended last (the
     * struct's layout is ABI). */
    int coalesce;
    /* Which sample frames a protocol 4 client gets in its reply's one
     * packed frame (emlio_pack_t; default EMLIO_PACK_AUTO;
     * docs/protocol.md 5.4.1). Frames of at most EMLIO_SERVER_PACK_SMALL
     * bytes always are: a ZeroMQ message of their own costs both ends more
     * than the copy. Frames of up to EMLIO_SERVER_PACK_LARGE bytes
     * (ImageNet's JPEGs) cost the receiver a message, two reads and a
     * wake-up each, and the path an ACK, where packed they cost this
     * daemon one copy from the mapping (~0.2 CPU-s/GB); larger frames
     * always go zero-copy. A value outside the enum fails
     * emlio_server_load with EMLIO_EINVAL. Appended last (ABI). */
    int pack;
    /* Training jobs (docs/fairness.md). The weight each job gets, as
     * "NAME=W[,NAME=W...]" with W in 1..1000 and "*" for every job not
     * named (default 1): a job's HELLO may ask for less, never more. NULL:
     * every job weighs 1. Copied. */
    const char *job_weights;
    /* EMLIO_SCHEDULE_FAIR (default): the pipeline serves GETs by job, in
     * weighted fair shares of bytes; EMLIO_SCHEDULE_FIFO: in arrival
     * order, whoever opens the most streams getting the most. */
    int schedule;
    /* Jobs known at once (a HELLO beyond is refused with EMLIO_ELIMIT);
     * 0: EMLIO_SERVER_MAX_JOBS. Each costs ~200 bytes. */
    uint32_t max_jobs;
    /* Shared reads (docs/fairness.md, "Shared reads"). share_bytes: the
     * most bytes of shard chunks the daemon keeps for jobs that share
     * reads (a HELLO with "share", or every job with share_all); 0:
     * EMLIO_SERVER_SHARE_BYTES, or a quarter of the memory the daemon
     * may use when that is less. Used when records are read from the
     * device (io "read", or "auto" choosing it); mapped datasets share
     * the page cache already. */
    uint64_t share_bytes;
    bool share_all;
} emlio_server_config_t;

enum emlio_schedule { EMLIO_SCHEDULE_FAIR = 0, EMLIO_SCHEDULE_FIFO = 1 };

#define EMLIO_SERVER_MAX_JOBS    4096
/* Default of share_bytes: room for four windows of 128 MiB. */
#define EMLIO_SERVER_SHARE_BYTES ((uint64_t)512 << 20)

/* When replies' segments are coalesced (emlio_server_config_t.coalesce). */
typedef enum emlio_coalesce {
    /* On connections whose RTT is EMLIO_COALESCE_MIN_RTT_US or more, where
     * a window that opens as ACKs arrive sends short tails as packets of
     * their own (at 30 ms: 44 KB instead of 64 KB segments, 6-13% of a
     * CPU-bound rate); not over loopback or a LAN, where it measured 2-5%
     * slower for small samples. */
    EMLIO_COALESCE_AUTO = 0,
    EMLIO_COALESCE_ALWAYS = 1, /* on every TCP connection */
    EMLIO_COALESCE_NEVER = 2,  /* TCP_NODELAY always, as ZeroMQ sets it */
} emlio_coalesce_t;

/* Which frames are packed (emlio_server_config_t.pack). */
typedef enum emlio_pack {
    /* Frames of up to EMLIO_SERVER_PACK_LARGE bytes on connections that
     * cross a network, EMLIO_SERVER_PACK_SMALL within this host (loopback,
     * IPC), where client and daemon share the CPUs and the copy costs more
     * than the client saves (docs/performance.md, "Packing large
     * frames"). */
    EMLIO_PACK_AUTO = 0,
    EMLIO_PACK_LARGE = 1, /* up to EMLIO_SERVER_PACK_LARGE on every one */
    EMLIO_PACK_SMALL = 2, /* up to EMLIO_SERVER_PACK_SMALL on every one */
} emlio_pack_t;

/* Default of read_ahead_bytes: four GETs of 64 ImageNet-sized samples per
 * reader and then some, and still a small part of any memory cgroup that
 * a storage daemon runs in. */
#define EMLIO_SERVER_READ_AHEAD_BYTES      ((uint64_t)64 << 20)
/* The most decode threads a daemon may be given (transform_threads). */
#define EMLIO_SERVER_MAX_TRANSFORM_THREADS 1024
/* Least memory (cgroup limit or MemTotal) the daemon needs with "read":
 * room for the read-ahead twice (staged, then waiting to be sent) and for
 * the pool of buffers behind it. */
#define EMLIO_SERVER_IO_MIN_MEMORY(read_ahead) \
    (2 * (read_ahead) + ((uint64_t)32 << 20))

#define EMLIO_SERVER_PACK_SMALL ((uint32_t)16 << 10)
#define EMLIO_SERVER_PACK_LARGE ((uint32_t)256 << 10)

/* EMLIO_COALESCE_AUTO's threshold: the connection's smallest RTT seen
 * (TCP_INFO), read once, when the client first has two GETs unanswered. */
#define EMLIO_COALESCE_MIN_RTT_US 1000

#define EMLIO_SERVER_MAX_COPY_BYTES       ((uint64_t)256 << 20)
#define EMLIO_SERVER_MAX_COPY_BYTES_TOTAL ((uint64_t)1 << 30)

/* Fills cfg with the defaults documented above. */
EMLIO_EXPORT void emlio_server_config_init(emlio_server_config_t *cfg);

/* Allocates a server; cfg is copied (its strings too). Returns NULL only
 * when out of memory. */
EMLIO_EXPORT emlio_server_t *emlio_server_new(emlio_ctx_t *ctx,
                                              const emlio_server_config_t *cfg);

/* Stops the threads if running, closes the socket, unmaps the shards and
 * frees the server. Accepts NULL; sets *self_p to NULL. */
EMLIO_EXPORT void emlio_server_destroy(emlio_server_t **self_p);

/* Asks a load in progress (emlio_server_load in another thread) to stop:
 * it returns -ECANCELED between two shards (ImageFolder: two classes),
 * without writing more indexes. Safe from any thread, and async-signal
 * safe (one atomic store); a later load is interrupted as well. */
EMLIO_EXPORT void emlio_server_interrupt(emlio_server_t *self);

/* Finds, maps and indexes the shards under cfg.data_dir (reusing valid .idx
 * files, scanning and writing them otherwise). Blocks for the scan. Returns
 * the number of shards, -errno (directory missing or unreadable),
 * EMLIO_ENOTFOUND (no shards, or an empty dataset),
 * EMLIO_EFORMAT/EMLIO_ECORRUPT (a shard is damaged: the message names it
 * and the offset) or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_server_load(emlio_server_t *self);

/* Binds the ROUTER socket. endpoint is any ZeroMQ endpoint; a TCP port of
 * "*" or 0 picks a free port, and emlio_server_endpoint() then gives the real
 * one. With a CURVE secret key configured, starts the authentication
 * handler first; without one, logs a warning when the endpoint is not on
 * loopback. Returns 0, -errno (EADDRINUSE, ...), EMLIO_EINVAL (bad key) or
 * EMLIO_ENOTFOUND (no keys in the authorized-keys directory). */
EMLIO_EXPORT int emlio_server_bind(emlio_server_t *self, const char *endpoint);

/* The endpoint actually bound (e.g. "tcp://127.0.0.1:41237"), borrowed;
 * "" before bind. */
EMLIO_EXPORT const char *emlio_server_endpoint(const emlio_server_t *self);

/* Starts the frontend and worker threads; returns at once. Returns 0,
 * EMLIO_EINVAL (not loaded or not bound) or -errno. */
EMLIO_EXPORT int emlio_server_start(emlio_server_t *self);

/* Stops the threads and waits for them. Idempotent. Batches already handed
 * to ZeroMQ may still be sent until the server is destroyed. */
EMLIO_EXPORT void emlio_server_stop(emlio_server_t *self);

/* Counters since start; safe to call while running (relaxed reads). */
typedef struct emlio_server_stats {
    uint64_t requests;        /* GETs answered with a batch */
    uint64_t errors;          /* requests answered with an error */
    uint64_t samples;         /* samples sent */
    uint64_t bytes;           /* sample bytes sent */
    uint64_t corrupt_skipped; /* records left out by on_corrupt skip */
    uint64_t clients;         /* HELLOs answered (client connections) */
    uint64_t active_clients;  /* clients known now (a session's streams
                                 count once) */
    uint64_t auth_refused;    /* CURVE handshakes refused */
    uint64_t active_streams;  /* client connections known now */
    uint64_t packed_bytes;    /* of bytes, those sent inside packed frames
                                 (emlio_server_config_t.pack) */
    /* The device, as the daemon's process sees it (issue 30): bytes this
     * process caused the block layer to read (/proc/self/io read_bytes:
     * page-cache misses through mappings and reads; 0 where unknown), and
     * with io "read" the exact-size reads staged and their bytes. Device
     * bytes over sent bytes is the read amplification. */
    uint64_t disk_read_bytes;
    uint64_t io_reads;
    uint64_t io_read_bytes;
    uint64_t io_errors;       /* staged reads that failed or came short */
    uint64_t io_ahead_bytes;  /* of io_read_bytes, read ahead for
                                 requests queued behind the one served */
    uint64_t io_direct_reads; /* of io_reads, past the page cache */
    uint64_t io_wait_ns;      /* reader time spent waiting for the device
                                 (what BATCH's "disk" share is made of) */
    bool io_read;             /* the io mode in force is "read" */
    /* --io auto (issue 30): shards served from their mappings while the
     * dataset is read, because their pages are resident anyway; and how
     * often auto switched between map and read while serving. */
    uint32_t io_mapped_shards;
    uint32_t io_switches;
    /* Of io_reads, those read into buffers registered with io_uring (the
     * read-ahead arena): no page pinning per read. */
    uint64_t io_fixed_reads;
} emlio_server_stats_t;

EMLIO_EXPORT void emlio_server_stats(const emlio_server_t *self,
                                     emlio_server_stats_t *out);

/* One training job as the daemon sees it (emlio_server_jobs). */
typedef struct emlio_server_job {
    char name[65]; /* its HELLO's "job", or session-HEX / conn-HEX
                      for a client that named none */
    bool named;
    uint32_t weight;       /* in force */
    uint32_t streams;      /* connections attached now */
    uint32_t queued;       /* GETs waiting for their turn */
    uint64_t requests;     /* GETs admitted */
    uint64_t samples;      /* samples asked for */
    uint64_t bytes;        /* reply bytes sent */
    uint64_t disk_bytes;   /* bytes read from the file system for it */
    uint64_t wait_ns;      /* its GETs' total time waiting for their turn */
    uint64_t shared_bytes; /* of bytes, copied from chunks other jobs read
                              (shared reads) */
    uint64_t since_ns;     /* when it arrived (CLOCK_MONOTONIC) */
} emlio_server_job_t;

/* Copies up to cap of the jobs known now into out; returns how many are
 * known (more than cap: call again with room for them). Thread-safe. */
EMLIO_EXPORT size_t emlio_server_jobs(emlio_server_t *self,
                                      emlio_server_job_t *out, size_t cap);

/* Shards loaded, and the dataset fingerprint sent to clients (borrowed). */
EMLIO_EXPORT size_t emlio_server_shard_count(const emlio_server_t *self);
EMLIO_EXPORT uint64_t emlio_server_record_count(const emlio_server_t *self);
EMLIO_EXPORT const char *emlio_server_dataset(const emlio_server_t *self);

/* The last failure's text. Never NULL. */
EMLIO_EXPORT const char *emlio_server_errmsg(const emlio_server_t *self);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_SERVER_H */
