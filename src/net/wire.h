/* wire.h - the EMLIO wire protocol (version 4): encoding and decoding.
 * SPDX-License-Identifier: MIT
 *
 * Every message's first frame is a msgpack map (the header); a BATCH is
 * followed by one raw frame per sample (v4: a packed frame of the small
 * ones and a table, wire_pack.c checks it). docs/protocol.md is the normative
 * description; this module is its only implementation in the library.
 *
 * Encoding uses msgpack-c's packer. Decoding is a bounded, allocation-light
 * cursor over the untrusted bytes (picohttpparser style): every length is
 * checked against the bytes that remain before anything is allocated, unknown
 * keys are skipped (forward compatibility), nesting is limited.
 */
#ifndef EMLIO_WIRE_H
#define EMLIO_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base.h"

/* The one protocol version: named fields, transforms (a GET may ask the
 * daemon to decode and augment, the BATCH then carries one tensor frame,
 * docs/protocol.md 5.6) and packed batches (small sample frames in one
 * frame, located by an offset table, 5.4.1). A HELLO of another version
 * is refused with EMLIO_EVERSION; there is no fallback. */
#define EMLIO_WIRE_VERSION    4
#define EMLIO_WIRE_PACK_OWN   UINT64_MAX /* a span in its own frame */
#define EMLIO_WIRE_MAX_SPEC   1024u      /* bytes in a transform spec */
#define EMLIO_WIRE_MAX_FIELDS 64u        /* fields per sample */

/* Hard ceilings that no configuration may exceed; daemons and clients apply
 * their own, lower, limits on top. */
#define EMLIO_WIRE_MAX_HEADER  (16u << 20) /* bytes in a header frame */
#define EMLIO_WIRE_MAX_SAMPLES 65536u      /* samples in one batch */
#define EMLIO_WIRE_MAX_SHARDS  1000000u    /* shards in one inventory */
#define EMLIO_WIRE_MAX_NAME    4096u       /* bytes in a shard name */
#define EMLIO_WIRE_MAX_JOB     255u        /* bytes in a job name (HELLO) */
#define EMLIO_WIRE_MAX_WHERE   200u        /* bytes in one BATCH "where" */
#define EMLIO_WIRE_MAX_WEIGHT  1000u       /* a job's weight, 1..this */
#define EMLIO_WIRE_MAX_STREAMS                     \
    64u /* connections one client session may join \
         */

enum emlio_msg_type {
    EMLIO_MSG_NONE = 0,
    EMLIO_MSG_HELLO = 1,   /* client -> server: who I am, which version */
    EMLIO_MSG_WELCOME = 2, /* server -> client: limits and shard inventory */
    EMLIO_MSG_GET = 3,     /* client -> server: one batch of samples */
    EMLIO_MSG_BATCH = 4,   /* server -> client: the samples of one GET */
    EMLIO_MSG_ERROR = 5    /* server -> client: a request failed */
};

typedef struct emlio__wire_shard {
    const char *name; /* borrowed from the decoded frame; not NUL-terminated */
    size_t name_len;
    uint64_t records;
    uint64_t bytes;
    /* Content identity (WELCOME entry element 3): equal for copies of one
     * shard wherever they sit, so a client can tell replicas from
     * different files that share a name; 0 = not known (then absent). */
    uint64_t digest;
} emlio__wire_shard_t;

typedef struct emlio__wire_str {
    const char *s; /* borrowed from the decoded frame; not NUL-terminated */
    size_t len;
} emlio__wire_str_t;

typedef struct emlio__wire_item {
    uint32_t shard; /* index into the server's WELCOME inventory */
    uint64_t record;
} emlio__wire_item_t;

/* Where one sample frame of a packed BATCH lies: off bytes into the
 * packed frame, len bytes long; off EMLIO_WIRE_PACK_OWN: in its own frame,
 * the next one after the packed frame and the own frames before it. */
typedef struct emlio__wire_span {
    uint64_t off;
    uint64_t len;
} emlio__wire_span_t;

typedef struct emlio__wire_sample {
    uint32_t shard;
    uint64_t record;
    int64_t label; /* -1 when the record has no label */
    uint32_t crc;  /* CRC-32C of the sample's frame */
} emlio__wire_sample_t;

/* Decoded messages (docs/protocol.md 5), one struct per message type.
 * Strings are borrowed from the frame that was decoded, so the frame must
 * outlive the message; arrays are owned and freed by
 * emlio__wire_msg_release. Keys a message type does not define are
 * skipped, as unknown keys are. */

/* HELLO (5.1): who the client is and which session it joins. */
typedef struct emlio__msg_hello {
    uint64_t version;
    const char *name; /* the client's */
    size_t name_len;
    uint64_t session; /* 0 = none: each connection is a client */
    uint64_t stream;  /* > 0 joins the session stream 0 opened */
    const char *job;  /* the job it belongs to (NULL: its session is one) */
    size_t job_len;
    uint64_t weight;           /* the job's requested weight (0: 1) */
    bool share;                /* it reads through the daemon's shared cache */
    emlio__wire_str_t *fields; /* the fields it asks for (none: the
                                  daemon's) */
    size_t n_fields;
} emlio__msg_hello_t;

/* WELCOME (5.2): the daemon's limits and inventory, or (joined) the short
 * answer to a further stream's HELLO. */
typedef struct emlio__msg_welcome {
    uint64_t version;
    bool joined;      /* a join: no inventory */
    const char *name; /* the daemon's */
    size_t name_len;
    const char *dataset; /* its fingerprint (hex) */
    size_t dataset_len;
    const char *format; /* the dataset's format */
    size_t format_len;
    uint64_t max_batch;      /* samples per GET it accepts */
    uint64_t max_credit;     /* GETs one connection may have out */
    uint64_t max_streams;    /* connections one session may have */
    uint64_t sndbuf;         /* send buffer per connection, bytes */
    uint64_t max_copy_bytes; /* copied reply bytes one connection may hold
                                (0 = not said) */
    uint64_t xf_threads;     /* its transform threads (0: it does not) */
    uint64_t core_mw;        /* power per busy core, milliwatts (0 = unknown) */
    bool share;              /* it shares every job's reads (--share-all) */
    uint64_t share_window;   /* bytes of a window of the shared schedule (0:
                                no shared reads) */
    uint64_t share_segs;   /* where the jobs that share reads are now, for a */
    uint64_t share_cursor; /* job that joins them (docs/planner.md) */
    emlio__wire_shard_t *shards;
    size_t n_shards;
    emlio__wire_str_t *fields; /* field names (none: one unnamed field) */
    size_t n_fields;
    emlio__wire_str_t *classes; /* label i's name (optional) */
    size_t n_classes;
} emlio__msg_welcome_t;

/* What a GET says of itself beyond its samples (5.3). */
typedef struct emlio__msg_get_flags {
    bool unchecked; /* the client does not check sample CRCs */
    bool pipelined; /* other GETs of the client are in flight on this
                       connection */
    bool describe;  /* the reply names each sample's record ("where") */
} emlio__msg_get_flags_t;

/* GET (5.3): one batch, or one part of one. */
typedef struct emlio__msg_get {
    const char *dataset; /* the fingerprint the client planned with */
    size_t dataset_len;
    emlio__wire_item_t *items;
    size_t n_items;
    const char *xf_spec; /* transform spec (5.6); NULL = raw samples */
    size_t xf_spec_len;
    uint64_t xf_seed;  /* the transform's RNG seed */
    uint64_t xf_epoch; /* the epoch the batch belongs to */
    emlio__msg_get_flags_t flags;
    uint64_t segs;   /* a job that shares reads: the shared schedule's */
    uint64_t cursor; /* segments and its batch's cursor (segs 0: none) */
} emlio__msg_get_t;

/* BATCH (5.4): the samples of one GET, raw or as one tensor (5.6). */
typedef struct emlio__msg_batch {
    emlio__wire_sample_t *samples;
    size_t n_samples;
    bool packed;               /* the header has a "pack" table (even empty) */
    emlio__wire_span_t *spans; /* that table, one span per sample frame */
    size_t n_spans;
    emlio__wire_str_t *where; /* where each sample's record lies (NULL: not
                                 sent) */
    size_t n_where;
    bool has_disk;     /* "disk" was sent: */
    int disk;          /* the daemon's device-wait share, percent */
    uint64_t read;     /* "rd": bytes read for it (0: not said) */
    uint64_t shared;   /* "sh": of those, copied from another job's read */
    bool has_shape;    /* a tensor batch (one frame) of */
    uint64_t shape[4]; /* samples, height, width, channels */
    uint64_t xf_ns;    /* CPU ns the daemon spent transforming */
} emlio__msg_batch_t;

/* ERROR (5.5): a request failed. */
typedef struct emlio__msg_error {
    int64_t code;     /* an EMLIO_E* code */
    const char *text; /* for people, not peers */
    size_t text_len;
} emlio__msg_error_t;

/* A decoded message: its type says which member holds it. */
typedef struct emlio__wire_msg {
    int type;    /* enum emlio_msg_type */
    uint64_t id; /* the request id (GET, BATCH, ERROR; a HELLO's echo) */

    union {
        emlio__msg_hello_t hello;
        emlio__msg_welcome_t welcome;
        emlio__msg_get_t get;
        emlio__msg_batch_t batch;
        emlio__msg_error_t error;
    };
} emlio__wire_msg_t;

/* What a GET asks beyond its items: a transform (NULL spec: the raw
 * samples) and the flags of docs/protocol.md 5.3. */
typedef struct emlio__wire_xf {
    const char *spec; /* canonical transform spec (emlio/transform.h) */
    uint64_t seed;
    uint64_t epoch;
    /* The client does not check the samples' CRC-32C (`emlio fetch
     * --no-crc`): sent as "unchecked", so that the daemon checks stored
     * checksums itself instead of leaving large samples to the client's
     * check (docs/protocol.md 5.3). */
    bool unchecked;
    /* Other GETs of this client are in flight on the same connection: sent
     * as "pipelined", a hint emliod does not act on (docs/protocol.md 5.3:
     * a tail held for the next GET waited a round trip). */
    bool pipelined;
    /* A job that shares reads: the shared schedule's segments and the
     * cursor of this GET's batch (segs 0: not sent). */
    uint64_t segs;
    uint64_t cursor;
    /* The client decodes the samples itself: sent as "describe", so that
     * the reply names each sample's record ("where") and a decode error
     * here can name the file, as the daemon's own do. */
    bool describe;
} emlio__wire_xf_t;

/* The tensor block of a BATCH that answers a GET with a transform: one
 * frame of samples x height x width x channels bytes (uint8, HWC). */
typedef struct emlio__wire_tensor {
    uint32_t height;
    uint32_t width;
    uint32_t channels;
    uint64_t xf_ns; /* CPU ns spent transforming the batch (informative) */
} emlio__wire_tensor_t;

/* HELLO (docs/protocol.md 5.1). */
typedef struct emlio__wire_hello {
    const char *name; /* the client's */
    /* The session (0: none, and then no stream or id are sent); a HELLO
     * with stream > 0 joins the session stream 0's HELLO opened; id is
     * echoed in the reply (0 = none). */
    uint64_t session;
    uint32_t stream;
    uint64_t id;
    const char *job; /* the job it belongs to; NULL or "": none */
    uint64_t weight; /* the weight it asks for; 0: not said */
    bool share;      /* it reads through the shared cache */
    /* The fields it wants of every sample; none: the daemon's. */
    char *const *fields;
    size_t n_fields;
} emlio__wire_hello_t;

/* WELCOME with the full inventory (docs/protocol.md 5.2). */
typedef struct emlio__wire_welcome {
    const char *name; /* the daemon's */
    const char *dataset;
    uint64_t max_batch;
    uint64_t max_credit;
    uint64_t max_streams;
    uint64_t sndbuf;
    const emlio__wire_shard_t *shards;
    size_t n_shards;
    char *const *fields; /* none: one unnamed field */
    size_t n_fields;
    uint64_t xf_threads;  /* 0 = this daemon does not transform */
    uint64_t core_mw;     /* power per busy core, milliwatts; 0 = unknown */
    char *const *classes; /* label i's name; NULL/0 = not known */
    size_t n_classes;
    const char *format; /* "tfrecord", "tar", "imagefolder" or "mixed";
                           NULL = not said */
    /* The bytes of copied replies one connection may have in memory
     * ("max_copy_bytes"); 0 = not sent. */
    uint64_t max_copy_bytes;
    /* "share_window", the bytes of one window of the shared schedule
     * (docs/planner.md); 0 = not sent (no shared reads). */
    uint64_t share_window;
    bool share_all; /* "share": true (false: not sent) */
} emlio__wire_welcome_t;

#define EMLIO_WIRE_MAX_CLASSES 1000000u /* class names in one WELCOME */

/* Frees the arrays of msg and resets it. Accepts an already-released msg. */
void emlio__wire_msg_release(emlio__wire_msg_t *msg);

/* Decodes one header frame. Returns the bytes consumed (== len on success),
 * EMLIO_EPROTO (malformed, unknown type, missing field, an array longer than
 * its limit; errbuf, EMLIO_ERRMSG_LEN bytes, says which) or EMLIO_ENOMEM.
 * max_items bounds GET items and BATCH samples (0 = the hard ceiling). */
int emlio__wire_decode(emlio__wire_msg_t *msg, const uint8_t *buf, size_t len,
                       size_t max_items, char *errbuf);

/* Encoders append one header frame to out (cleared first). Each returns 0
 * or EMLIO_ENOMEM. */
int emlio__wire_encode_hello(emlio_buf_t *out, const emlio__wire_hello_t *h);
int emlio__wire_encode_welcome(emlio_buf_t *out,
                               const emlio__wire_welcome_t *w);
/* The short WELCOME that answers a join (no shards, id echoed). */
int emlio__wire_encode_joined(emlio_buf_t *out, uint64_t id,
                              const char *dataset);
/* GET; xf NULL (or its spec NULL and no flags): a plain one. */
int emlio__wire_encode_get(emlio_buf_t *out, uint64_t id, const char *dataset,
                           const emlio__wire_item_t *items, size_t n,
                           const emlio__wire_xf_t *xf);
/* What a BATCH says of the daemon's device (docs/protocol.md 5.4): disk,
 * the share of its reader time spent waiting for the device lately, in
 * percent ("disk"), or EMLIO_WIRE_NO_DISK to leave it out (a daemon that
 * does not read); read, the bytes its reads took from the file system
 * for this reply ("rd"; 0: left out). */
#define EMLIO_WIRE_NO_DISK (-1)

typedef struct emlio__wire_io {
    int disk;
    uint64_t read;
    uint64_t shared; /* "sh" */
    /* Not of the device: the records' descriptions ("where"), one per
     * sample, each at most EMLIO_WIRE_MAX_WHERE bytes (longer ones are
     * cut); NULL: left out. Rides here because every BATCH encoder takes
     * these optional keys. */
    char *const *where;
} emlio__wire_io_t;

#define EMLIO_WIRE_NO_IO ((emlio__wire_io_t){ EMLIO_WIRE_NO_DISK, 0, 0, NULL })
/* BATCH of raw samples: the offset table spans[0, n_spans) ("pack"), one
 * span per sample frame, in frame order (sample-major, field-minor). */
int emlio__wire_encode_batch(emlio_buf_t *out, uint64_t id,
                             const emlio__wire_sample_t *samples, size_t n,
                             const emlio__wire_span_t *spans, size_t n_spans,
                             emlio__wire_io_t io);
/* Checks a packed BATCH's offset table from the network against what the
 * receiver expects: want spans (samples x fields), and a packed frame of
 * packed_len bytes (has_packed: it came). Spans in the packed frame must lie
 * inside it, in ascending order, and not overlap (gaps are allowed); the
 * packed frame must come exactly when some span is in it. Returns the
 * number of own frames that must follow, or EMLIO_EPROTO with errbuf
 * (EMLIO_ERRMSG_LEN bytes) saying which span is wrong and why. */
int emlio__wire_pack_check(const emlio__wire_span_t *spans, size_t n_spans,
                           size_t want, bool has_packed, size_t packed_len,
                           char *errbuf);
/* out = the encoded WELCOME base with "share_segs" and "share_cursor"
 * added (the daemon's prebuilt WELCOME, for a job that joins others
 * reading the shared schedule). Returns 0, EMLIO_EPROTO when base is not
 * an encoded map, or EMLIO_ENOMEM. */
int emlio__wire_welcome_add_cursor(emlio_buf_t *out, const emlio_buf_t *base,
                                   uint64_t segs, uint64_t cursor);
/* BATCH of a transformed GET: the quadruples (crc over each sample's
 * height x width x channels slice) and the shape of the one tensor frame. */
int emlio__wire_encode_batch_tensor(emlio_buf_t *out, uint64_t id,
                                    const emlio__wire_sample_t *samples,
                                    size_t n, const emlio__wire_tensor_t *t,
                                    emlio__wire_io_t io);
int emlio__wire_encode_error(emlio_buf_t *out, uint64_t id, int code,
                             const char *text);

#endif /* EMLIO_WIRE_H */
