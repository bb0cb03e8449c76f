/* format.h - one interface per file format: what the shard set, the server
 * and the dataset tools call instead of knowing TFRecord, tar or ImageFolder.
 * SPDX-License-Identifier: MIT
 *
 * A format is one table of operations (emlio__format_ops_t) that its
 * reader defines over its own handle: tfrecord.c, tar.c and imagefolder.c
 * (their headers declare the tables; format.c lists them). The shard set
 * finds a shard's format once, at load, and keeps the table in shard->ops
 * and the handle in shard->impl; from then on every caller goes through
 * the table, the way SQLite's pager goes through its VFS. Adding a format
 * is one reader plus one entry in emlio__formats (format.c).
 *
 * The formats sit below the shard set: an operation takes the format's
 * handle (void *impl) and, to read, a read context (emlio__read_ctx_t)
 * that the shard set binds to the shard for that read, never the shard
 * itself. Leases, users, descriptors and the mark of a changed shard stay
 * in the shard set (shardset.h); a format says what it needs through the
 * context (pread, changed) and marks the views it points into the mapping
 * (emlio__view_map), and the shard set acts on it.
 *
 * Two shapes of format exist:
 * - file formats (suffix set): one shard per file with that suffix,
 *   mapped read-only through the handle's emlio__mapfile_t (ops->file; see
 *   shardset.h on leases and copying reads);
 * - tree formats (suffix NULL, load_tree set): the data directory itself
 *   is read as a tree when no shard file is found, as ImageFolder is; its
 *   shards are added through emlio__tree_load_t.add.
 */
#ifndef EMLIO_FORMAT_H
#define EMLIO_FORMAT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "beneath.h"
#include "emlio/dataset.h"
#include "mapfile.h"

/* Log hook for non-fatal events (an index that could not be written). */
typedef void emlio__shardset_log_fn(void *userdata, const char *msg);

/* A format's verdict for a sample that lacks a requested field; the caller
 * names shard, sample and field (the name is left in *missing). */
#define EMLIO__FORMAT_EMISSING  (-1999)
/* A sample whose label member does not parse as an integer (its field name
 * left in *missing): a wrong --label-field, or a broken label. */
#define EMLIO__FORMAT_EBADLABEL (-1998)

/* One frame of a sample as a reader found it: a view into a shard's
 * mapping (zero-copy) or into a private copy. A view is what the pipeline
 * carries from the read stage to the serialize stage (and, later, through
 * a transform stage in between: see server_internal.h). */
/* Fields one sample may be read as (--fields): the wire's limit too
 * (EMLIO_WIRE_MAX_FIELDS; server.c checks that the two agree), kept here
 * so that the store needs no network header. */
#define EMLIO__FORMAT_MAX_FIELDS 64u

typedef struct emlio__view {
    const uint8_t *data;
    size_t len;
    /* A frame's bytes are either a private copy (copying reads, ImageFolder
     * files, numbers), freed by that frame, or in a shard's mapping, then
     * the view holds one use of the shard for as long as the frame lives. */
    uint8_t *owned; /* the copy data points into, else NULL */
    bool held;      /* holds a use of its shard's mapping */
    bool packed;    /* copied into its job's packed frame */
    int64_t label;  /* the sample's label (first view of a sample) */
    uint32_t crc;   /* CRC-32C of the sample's frames (first view) */
    uint32_t shard;
    uint64_t record;
} emlio__view_t;

/* What a reader asks of a format: which fields, which keys, which checks.
 * Filled once by the server from its configuration. */
typedef struct emlio__read_opts {
    const char *field;       /* the one field sent; NULL = the default */
    const char *label_field; /* tar member holding the label ("cls") */
    const char *bytes_key;   /* TFRecord Example key of the image */
    size_t bytes_key_len;
    const char *label_key; /* TFRecord Example key of the label */
    size_t label_key_len;
    char *const *fields; /* --fields: one frame per name; NULL = one frame */
    size_t n_fields;
    bool raw; /* TFRecord: send whole records, no Example parsing */
    /* TFRecord: a record without an int64 label_key is EBADLABEL, not
     * label -1 (the key was configured: a typo must not pass). */
    bool label_required;
    bool verify; /* TFRecord: check each record's CRC as it is read */
    /* TFRecord, with verify: a sample served from the mapping and at least
     * this long gets the CRC derived from its record's stored CRC and the
     * CRCs of the bytes around it (emlio_crc32c_middle), its own bytes
     * unread; the client's check of the bytes it receives then checks them
     * against the disk's CRC, and the daemon no longer detects corruption
     * inside such samples itself. 0: always computed from the bytes. Set
     * only when the daemon does not act on corruption (see server.c). */
    size_t derive_crc_min;
    emlio__shardset_log_fn *log; /* copying reads report changed shards */
    void *userdata;
} emlio__read_opts_t;

/* What one read of a shard may use besides the format's own handle,
 * bound by the shard set (shardset.c) for that read: the shard set owns
 * the shard's descriptor, its lease and its users, so a format never sees
 * the shard and never calls back into the shard set. */
typedef struct emlio__read_ctx {
    /* Take record bytes from the mapping (zero-copy: the shard is leased
     * and not read through the I/O engine); else read copies with pread. */
    bool maps;
    /* --io read (ioengine.h): a reader may have staged this record's
     * bytes; a tree format takes them from the engine. */
    bool read_io;
    /* Reads bytes [offset, offset + want) of the shard's file into a fresh
     * buffer (*buf_out, freed with emlio__iobuf_free), *data pointing at
     * offset's byte in it: the buffer a reader staged for exactly this
     * range, else one read now. Returns 0, -ESTALE (the file became
     * shorter: the shard set has marked the shard changed), -EIO,
     * EMLIO_EFORMAT (no descriptor to read) or EMLIO_ENOMEM. */
    int (*pread)(struct emlio__read_ctx *ctx, uint64_t offset, size_t want,
                 uint8_t **buf_out, const uint8_t **data);
    void *arg; /* the shard set's, for pread */
    /* Set by the format: the file no longer says what the index does (a
     * tar member's header changed), why in words; the shard set marks the
     * shard changed when the read returns. */
    const char *changed;
} emlio__read_ctx_t;

/* A tree format's load: where the shard set's data directory is and how
 * it is read, and the shard set's hook to add a shard. */
typedef struct emlio__tree_load {
    const emlio__root_t *root; /* the data directory: every open beneath */
    bool rescan;               /* ignore listing caches */
    bool write_index;          /* write a listing cache */
    const atomic_bool *cancel; /* set from another thread: stop; may be NULL */
    emlio__shardset_log_fn *log;
    void *userdata;
    /* Appends a shard called name (copied) whose handle is impl (taken
     * over in every case: destroyed by the shard set, or at once when the
     * add fails). Returns 0 or EMLIO_ENOMEM. */
    int (*add)(void *arg, const char *name, void *impl);
    void *arg;
} emlio__tree_load_t;

typedef struct emlio__format_ops {
    const char *name;   /* "tfrecord": --format, messages, inspect */
    const char *suffix; /* ".tfrecord"; NULL for a tree format */
    const char *what;   /* its shards in messages: "*.tfrecord shards" */
    /* Mapped: shard data lives in a mapping of an open file (leases,
     * users, copying reads and blanking apply). */
    bool mapped;
    /* The read verdict that means "this record's file changed since the
     * listing" (skipped under --on-corrupt skip, answered as "changed");
     * 0 for none (mapped formats say -ESTALE instead). */
    int changed_code;

    /* ---- loading (file formats) ---- */
    /* Creates the handle for path (opens nothing); NULL when out of memory. */
    void *(*create)(const char *path);
    /* The handle's mapped file (mapfile.h): the shard set confines it
     * beneath the data root, maps it from the descriptor the shard cache
     * opened, leased and checked (at load and at every reopen), unmaps it
     * (the cache's close: index and size stay, so count, size and offset
     * still answer), blanks it when the file changed, and quotes its path
     * and last error (the loading calls' messages). */
    emlio__mapfile_t *(*file)(void *impl);
    /* Opens (maps) the file by its path. Returns 0 or < 0 (see file's
     * err). */
    int (*open)(void *impl);
    /* Loads the index file idx; the record count or < 0 (-ENOENT: none). */
    int (*load_index)(void *impl, const char *idx);
    /* Scans the file for its records; the count or < 0. */
    int (*scan)(void *impl, bool verify_data);
    /* Writes the index scan built; 0 (also when there is nothing to
     * write) or < 0. */
    int (*write_index)(const void *impl, const char *idx);
    /* The record table the dataset index (dsindex.h) keeps for the shard
     * once scan or load_index built it (and prune, if any, ran): *len
     * bytes, valid until the handle's index changes; NULL when out of
     * memory. */
    const void *(*index_table)(void *impl, size_t *len);
    /* Takes records from such a table (borrowed from the index's mapping,
     * which outlives the handle) instead of load_index/scan, with no file
     * open, when it was pruned as prune says ("-": no prune, "*": to an
     * image member, else that field): the record count, or < 0 (then the
     * shard is rescanned). */
    int (*adopt_table)(void *impl, const void *table, size_t len,
                       uint64_t records, uint64_t size, uint32_t crc,
                       const char *prune);
    /* A copying read of record (TFRecord) or member (tar) i with
     * ctx->pread into a fresh buffer (*buf_out, the caller's to free;
     * NULL on failure): see emlio__shard_read_copy for what each format
     * reads and answers. */
    int (*read_copy)(const void *impl, emlio__read_ctx_t *ctx, size_t i,
                     uint8_t **buf_out, const uint8_t **data, size_t *len,
                     uint32_t *stored);
    /* The byte range (offset and length in the file) that the copying
     * reads of sample i fall in: TFRecord, the record read_copy reads; tar,
     * every member of the sample with its header, which read_copy's reads
     * of its members take their parts of. A reader stages them for a
     * whole request at once (ioengine.h). 0, or < 0 for a sample out of
     * range; may be NULL (the copying reads are then made one at a time). */
    int (*extent)(const void *impl, size_t i, uint64_t *offset, size_t *len);
    /* Tree formats: opens sample i's file for a staged read of its
     * len bytes, checked as a read checks it. Returns the descriptor
     * (the caller's to close) with *key naming the file for the take, or
     * < 0 (a changed file: EMLIO_EFORMAT). NULL: not staged. */
    int (*open_record)(const void *impl, size_t i, const void **key,
                       size_t *len);

    /* ---- loading (tree formats) ---- */
    /* Reads dir (opened as load->root) as a tree and adds its shards
     * through load->add. Returns the number of shards added (0: the tree
     * has none) or < 0 with errbuf set (shards added so far stay added). */
    int (*load_tree)(const emlio__tree_load_t *load, const char *dir,
                     char *errbuf);

    /* ---- every format ---- */
    void (*destroy)(void *impl);
    size_t (*count)(const void *impl);
    uint64_t (*size)(const void *impl);
    /* At most how many bytes reading record i copies (its record, all its
     * members, its file): what a copying read may allocate for it. */
    uint64_t (*record_bytes)(const void *impl, size_t i);
    /* Byte offset of record i in the file, for messages (0 if none). */
    uint64_t (*offset)(const void *impl, size_t i);
    /* Page-cache advice for records [first, first + n); may be NULL. */
    void (*advise)(const void *impl, size_t first, size_t n, int advice);
    /* CPU-cache prefetch of record i, to be read soon: its index entry
     * only (data false), or, once that is in cache, the record's first and
     * last bytes (data true). Never faults, never blocks; may be NULL. */
    void (*prefetch)(const void *impl, size_t i, bool data);
    /* Whether field can be served from the shard: 1 yes, 0 no, -1 only
     * known per record (TFRecord Example keys). */
    int (*has_field)(const void *impl, const char *field);
    /* Reads sample `record` of a shard the caller uses (acquired, when
     * mapped) into views, through ctx: views[0] only when o->n_fields is
     * 0 (with its label and crc), else views[0, n_fields) (label in
     * views[0]; the caller computes the crc). A view into the mapping is
     * marked held (emlio__view_map) and the caller takes a use of the
     * shard for it; a copy is the view's own. On failure the caller
     * releases the views. Returns 0, EMLIO__FORMAT_EMISSING (name in
     * *missing), EMLIO_ECORRUPT, EMLIO_ENOTFOUND, ... */
    int (*read)(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
                const emlio__read_opts_t *o, emlio__view_t *views,
                const char **missing);
    /* The label every record of the shard has (an ImageFolder class), or
     * -1 when records carry their own; NULL = -1. Names the classes. */
    int64_t (*shard_label)(const void *impl);
    /* Drops the samples that cannot be served as field says (one field, a
     * list "jpg,cls" of which each is needed, or NULL: an image), before
     * the inventory is counted; returns how many, example naming the
     * first. NULL: every sample can be. */
    size_t (*prune)(void *impl, const char *field, char *example, size_t len);
    /* A tree format's name of record r inside its shard (the file of an
     * ImageFolder class), for the tools and for messages ("file
     * 'cat/x.jpg' (record 7)"; without it: "record 7 in shard 'a.tar' at
     * offset 1536", see emlio__shard_describe); NULL (the pointer) for
     * formats whose records have no names of their own. */
    const char *(*member_name)(const void *impl, size_t r);
    /* Every field of sample r, in order, to fn (the tools' view of a
     * record: emlio_dataset_record), and its default label. The caller
     * uses the shard (acquired, when mapped). */
    int (*record)(const void *impl, size_t r, emlio_dataset_field_fn *fn,
                  void *userdata, int64_t *label);
    /* Tree formats: a CRC-32C of what the shard holds (an ImageFolder
     * class: its files' paths and sizes), equal wherever a copy of it
     * sits. NULL: file formats, whose record table is the identity (see
     * emlio__shard_identity). */
    uint32_t (*identity)(const void *impl);
} emlio__format_ops_t;

/* Every format, file formats first, in the order a directory's shards are
 * loaded; NULL-terminated. */
extern const emlio__format_ops_t *const emlio__formats[];

/* The format called name, or NULL. */
const emlio__format_ops_t *emlio__format_find(const char *name);

/* View helpers for the format implementations. */
/* Points view into the shard's mapping and marks it held: the shard set
 * takes one use of the shard for it when the read returns, and gives it
 * back when the view is released (emlio__view_release, shardset.h). */
void emlio__view_map(emlio__view_t *view, const uint8_t *data, size_t len);
/* A private copy of data[0, len). Returns 0 or EMLIO_ENOMEM. */
int emlio__view_copy(emlio__view_t *view, const void *data, size_t len);
/* A private copy of v as 8 little-endian bytes (a number field). */
int emlio__view_int64(emlio__view_t *view, int64_t v);

/* A growable list of names, for directory walks. */
typedef struct emlio__names {
    char **v;
    size_t n;
    size_t cap;
} emlio__names_t;

int emlio__names_push(emlio__names_t *names, const char *name);
void emlio__names_release(emlio__names_t *names);
void emlio__names_sort(emlio__names_t *names);

#endif /* EMLIO_FORMAT_H */
