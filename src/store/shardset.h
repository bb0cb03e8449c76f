/* shardset.h - the shards of one data directory: found, mapped, indexed.
 * SPDX-License-Identifier: MIT
 *
 * Used by the server and the dataset tools. Shards are ordered by their
 * path relative to the data directory; that relative path is their name on
 * the wire, and the dataset fingerprint covers every (name, records,
 * bytes) so a client can tell when a restarted daemon serves something
 * else. What a shard's bytes mean is its format's business: each shard
 * carries its format's table (shard->ops, see format.h), chosen once at
 * load; this module owns what all shards share: discovery, leases, users,
 * copying reads and the watch for shards changed on disk.
 */
#ifndef EMLIO_SHARDSET_H
#define EMLIO_SHARDSET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsindex.h"
#include "format.h"

typedef struct emlio__shard emlio__shard_t;
typedef struct emlio__shardset emlio__shardset_t;
typedef struct emlio__shardset_opts emlio__shardset_opts_t;

/* One shard. A mapped shard (TFRecord, tar) that changes under a running daemon
 * must never be read through its mapping once the change is visible (a shrunk
 * file raises SIGBUS on access), so every access to the mapping, including a
 * zero-copy frame that ZeroMQ still holds, counts as a user. Leased shards
 * hold a read lease (F_SETLEASE): a writer's open waits until we have
 * stopped reading and released the lease. Shards that cannot be leased
 * (another process has them open for writing, a file system without
 * leases, a foreign owner without CAP_LEASE) are read with pread into a
 * private copy, which a shrinking file cannot fault. ImageFolder files
 * are always read into copies (imagefolder.c checks size and mtime
 * on every read), so nothing here applies to them. */
struct emlio__shard {
    char *name;                     /* path relative to the data directory */
    const emlio__format_ops_t *ops; /* its format */
    void *impl;                     /* the format's handle */
    /* The rest concerns mapped shards (ops->mapped); a shard of a tree
     * format (an ImageFolder class) has fd -1, is never leased and never
     * counts users. */
    struct emlio__shard_cache *cache; /* opens it on demand; NULL: mapped
                                         for good (a single-file dataset) */
    int fd;      /* open read-only for the lease and copying reads; -1
                    while the cache has it closed */
    bool leased; /* holds a read lease; otherwise copying reads */
    /* --io read (ioengine.h): records are read with exact-size reads, not
     * served from the mapping, even when leased. Set before serving, and
     * under --io auto turned on and off while serving (the memory the
     * daemon may use changed, or the shard's pages became resident):
     * read it with emlio__shard_reads_io. A reader that saw it one way
     * and the format another only loses a staged read (freed unused). */
    atomic_bool read_io;
    /* read_io: the descriptor made ready for it (POSIX_FADV_RANDOM, and
     * O_DIRECT where the file system has it; -1 none yet: the cache
     * resets it when it closes the shard; for a tree format's shard, 0
     * once its files were probed), and the alignment its direct reads
     * need (0: buffered). See emlio__shard_io_align. */
    atomic_int io_fd;
    atomic_uint io_align;
    bool released; /* changed: lease given back, mapping no longer read */
    bool replaced; /* logged that the path now names another file */
    uint64_t size; /* the size at load */
    dev_t dev;     /* the inode we opened, to notice a rename over it */
    ino_t ino;
    uint64_t mtime_ns;   /* at load: a reopen must find the same file */
    uint32_t slot;       /* in the cache's list of open shards */
    uint64_t changed_ns; /* when the change was seen (frontend only) */
    atomic_uint users;   /* readers and frames in flight in the mapping */
    atomic_bool changed; /* changed on disk: its samples are refused */
    atomic_bool logged;  /* the change has been logged */
    atomic_bool is_open; /* cache: mapped and open; readers may start */
    atomic_bool ref;     /* cache: used since the CLOCK hand passed */
};

/* Whether record bytes are taken from the shard's mapping (zero-copy):
 * leased, and not read through the I/O engine (read_io). */
static inline bool
emlio__shard_reads_io(const emlio__shard_t *shard)
{
    return atomic_load_explicit(&shard->read_io, memory_order_relaxed);
}

static inline bool
emlio__shard_maps(const emlio__shard_t *shard)
{
    return shard->leased && !emlio__shard_reads_io(shard);
}

/* A mapped shard's file (mapfile.h), as its format keeps it. */
static inline emlio__mapfile_t *
emlio__shard_file(const emlio__shard_t *shard)
{
    return shard->ops->file(shard->impl);
}

/* Records of the shard. */
size_t emlio__shard_count(const emlio__shard_t *shard);
/* Bytes of the shard (file size; sum of files for a class directory). */
uint64_t emlio__shard_size(const emlio__shard_t *shard);
/* The shard's bytes over its records (0 for none): what the server
 * charges for a record it does not look up. */
uint64_t emlio__shard_mean_record(const emlio__shard_t *shard);
/* Byte offset of record i in the shard's file, for messages (0 for an
 * ImageFolder class, whose records are files). */
uint64_t emlio__shard_offset(const emlio__shard_t *shard, size_t i);
/* Page-cache advice for records [first, first + n); best effort. */
void emlio__shard_advise(const emlio__shard_t *shard, size_t first, size_t n,
                         int advice);

/* How a data directory is read (see emlio_server_config_t). */
struct emlio__shardset_opts {
    const char *format; /* NULL/"auto", "tfrecord", "tar", "imagefolder" */
    bool mixed_formats;
    bool verify_data;
    bool write_index; /* write .idx files and the dataset index */
    bool rescan;      /* ignore existing index files */
    /* Where the dataset index lives when the data directory is read-only
     * (see emlio__dsindex_path); NULL: in the data directory. */
    const char *index_dir;
    /* Follow symlinks inside the data directory (never out of it: see
     * beneath.h); without it symlinks are left out, with a log line. */
    bool follow_symlinks;
    /* Leave out samples that cannot be served: without the daemon's one
     * field (prune_field, or NULL for an image) or, with --fields, without
     * any of them (prune_field the list, "jpg,cls,json"). Logged once with
     * a count and an example; none left is an error. */
    bool prune;
    const char *prune_field;
    /* Set from another thread (a signal): the load stops between shards
     * (or ImageFolder classes) with -ECANCELED. NULL: never. */
    const atomic_bool *cancel;
    /* Mapped shards go through a shard cache (shard_cache.h): opened on
     * demand, at most max_open_shards at once (0: the default of
     * emlio__shard_cache_budget), the least recently used idle one closed
     * for another. lease (the daemon): an open shard keeps its descriptor
     * and a read lease (copying reads when none can be had), and the
     * cache's thread receives lease breaks. Without it (the tools) an
     * open shard is only mapped (fd -1). */
    bool lease;
    size_t max_open_shards;
    uint32_t grace_ms; /* see emlio__shard_cache_new; 0: 5000 */
};

struct emlio__shardset {
    emlio__root_t root; /* the data directory: every open is beneath it */
    emlio__shard_t *shards;
    size_t n;
    size_t cap; /* shards allocated (emlio__shardset_grow) */
    uint64_t records;
    uint64_t bytes;
    size_t mapped;    /* TFRecord and tar shards */
    size_t opened;    /* of those, opened at load (the rest: from the index) */
    size_t leased;    /* of those opened, leased (the cache leases on open) */
    size_t indexed;   /* of those, tables served from the dataset index */
    size_t rescanned; /* of those, not found current in it at load */
    emlio__dsindex_t index;      /* mapped; TFRecord shards borrow tables */
    emlio__dsindex_t index_prev; /* replaced, still borrowed from */
    struct emlio__shard_cache *cache; /* of the mapped shards */
    char fingerprint[17];             /* 16 hex digits */
};

/* Finds every shard file of a file format (*.tfrecord, *.tar) under dir
 * (recursively, following no symlinked directories), maps each, takes its
 * records from the dataset index (dsindex.h) when its entry is current,
 * else loads its "<file>.idx" when it is valid (and, for tar, not older
 * than the shard) and otherwise scans the file (verify_data: checking
 * every TFRecord data CRC) and, if write_index, writes the .idx and the
 * dataset index (see emlio__shardset_load_files). With no such files (or format
 * "imagefolder"), dir is read by the tree format, as an ImageFolder tree: one
 * shard per class directory. Several formats at once are EMLIO_EINVAL unless
 * opts->mixed_formats. Returns the shard count or an error with errbuf
 * naming the file (see emlio_server_load). */
int emlio__shardset_load(emlio__shardset_t *self, const char *dir,
                         const emlio__shardset_opts_t *opts,
                         emlio__shardset_log_fn *log, void *userdata,
                         char *errbuf);

/* Adds one shard per name in found[k] (file format emlio__formats[k];
 * the names are taken over), in parallel threads: each is leased when
 * opts->lease, mapped, and takes its records from the dataset index when
 * its entry matches the file's size, mtime and inode, else from its .idx
 * file or a scan; then the dataset index is rewritten when anything was
 * rescanned (opts->write_index). Returns 0 or < 0 with errbuf naming the
 * first shard that failed (shards loaded so far stay in self). */
int emlio__shardset_load_files(emlio__shardset_t *self, const char *dir,
                               const struct stat *root, emlio__names_t *found,
                               const emlio__shardset_opts_t *opts,
                               emlio__shardset_log_fn *log, void *userdata,
                               char *errbuf);

/* The content identity of shard i as WELCOME reports it (docs/protocol.md
 * 5.2): 2^32 plus the CRC-32C of its record table (the dataset index's,
 * or one computed now for a table built by a scan), or of its file list
 * (tree formats); 0 when it has neither. Copies of one file on two nodes
 * agree; two files of one name almost never do. */
uint64_t emlio__shard_identity(emlio__shardset_t *self, size_t i);

/* Lets a mapped shard's data be read: 0 and one more user (the shard is
 * open and mapped until the matching emlio__shard_release; the cache opens
 * it if it was closed), -ESTALE when the shard changed on disk (then
 * nothing may touch its mapping), or another -errno when it cannot be
 * opened now (-EMFILE). */
int emlio__shard_acquire(emlio__shard_t *shard);

/* emlio__shard_acquire without opening: true and one more user when the
 * shard is open now and unchanged (hints: readahead, prefetch), else
 * false. */
bool emlio__shard_try_use(emlio__shard_t *shard);

/* One more use of a shard the caller already uses (acquired): a frame
 * pointing into the mapping, say. Ended by emlio__shard_release. */
void emlio__shard_hold(emlio__shard_t *shard);

/* Whether reading shard's records will send them zero-copy from its
 * mapping: a mapped shard that holds a read lease or, while the cache has
 * it closed, one the cache's last lease suggests it will get when opened
 * (emlio__shard_cache_leases_work; a closed shard's own flag is stale or,
 * never opened, unset). A guess for closed shards: a lease refused on
 * opening makes the reader copy. Safe from any thread. */
bool emlio__shard_zero_copy(const emlio__shard_t *shard);

/* Ends one use begun by emlio__shard_acquire or emlio__shard_hold. */
void emlio__shard_release(emlio__shard_t *shard);

/* Marks shard changed (once; logs why through log) so that no new reader
 * starts on it. Safe from any thread. */
void emlio__shard_mark_changed(emlio__shard_t *shard, const char *why,
                               emlio__shardset_log_fn *log, void *userdata);

/* Whether opts asks the load to stop (see emlio_shardset_opts.cancel). */
static inline bool
emlio__shardset_cancelled(const emlio__shardset_opts_t *opts)
{
    return opts->cancel && atomic_load(opts->cancel);
}

/* Makes room for more shards at self->shards[self->n]; zeroed. The
 * capacity at least doubles, so a tree adding its classes one by one
 * costs O(n), not O(n^2). Returns 0 or EMLIO_ENOMEM. */
int emlio__shardset_grow(emlio__shardset_t *self, size_t more);

/* Reads bytes [offset, offset + want) of a mapped shard's file into a
 * fresh buffer (*buf_out, the caller's to free with emlio__iobuf_free),
 * *data pointing at offset's byte in it: the buffer a reader staged for
 * exactly this range with read_io (ioengine.h), else one read now. A
 * short read means the file shrank under us: the shard is marked changed
 * and the answer is -ESTALE; else 0, -EIO or EMLIO_ENOMEM. What a read
 * context's pread (format.h) does for a format. */
int emlio__shard_pread(emlio__shard_t *shard, uint64_t offset, size_t want,
                       uint8_t **buf_out, const uint8_t **data,
                       emlio__shardset_log_fn *log, void *userdata);

/* read_io: makes the shard's open descriptor ready for exact reads once
 * (readahead off, O_DIRECT where it works) and returns the alignment its
 * reads need (0: buffered). A descriptor made ready stays so after
 * read_io is turned off (its alignment is still returned: the copying
 * reads of an unleased shard must keep to it). The caller has the shard
 * acquired. */
unsigned emlio__shard_io_align(emlio__shard_t *shard);
/* The same for fd, a file of a tree format's shard (an ImageFolder
 * class) opened for one staged read: O_DIRECT is probed on the shard's
 * first file and then only set, readahead off where it is not had. */
unsigned emlio__shard_io_align_file(emlio__shard_t *shard, int fd);

/* How many bytes of a mapped shard's file sit in the page cache now
 * (mincore over a mapping of it made for the question): 0 and true, or
 * false when the shard is not open (the cache closed it), changed, or
 * not mapped. Linux answers for pages of files this process owns or may
 * write, or with CAP_FOWNER (root); for others it counts only pages this
 * process has touched, so such shards look cold and are read. */
bool emlio__shard_resident(emlio__shard_t *shard, uint64_t *bytes);

/* Reads sample `record` of shard into views[0, max(1, o->n_fields)),
 * label and CRC (over the frames, in order) in views[0]: acquires a mapped
 * shard for the read (-ESTALE when it changed on disk), binds a read
 * context (format.h) to it, dispatches to shard->ops->read, takes one use
 * of the shard for each view left pointing into its mapping and marks the
 * shard changed when the format found it so. On failure the caller
 * releases the views (emlio__view_release). */
int emlio__shard_read(emlio__shard_t *shard, uint64_t record,
                      const emlio__read_opts_t *o, emlio__view_t *views,
                      const char **missing);

/* Ends what view holds: its use of shard's mapping (shard may be NULL for
 * a view that holds none) or its private copy. */
void emlio__view_release(emlio__view_t *view, emlio__shard_t *shard);

/* Where record lives, for messages: "file 'cat/x.jpg' (record 7)" for a
 * format whose records have names (member_name), else "record 7 in shard
 * 'a.tar' at offset 1536". */
void emlio__shard_describe(const emlio__shard_t *shard, uint64_t record,
                           char *buf, size_t len);

/* A copying read (mapped shards without a lease) with pread into a fresh
 * buffer, by format (ops->read_copy):
 * - TFRecord: i is a record; reads its framing and data; *data and *len
 *   are the record's payload inside the copy and *stored its stored CRC
 *   (the caller checks it, as for mapped reads);
 * - tar: i is a member (an index into the index's members); reads
 *   the member's header with its data and checks the header as an index
 *   load does (emlio__tar_header_ok); *data and *len are the member's
 *   data and *stored is 0 (tar has no checksum of the data).
 * *buf_out is the caller's to free (NULL on failure). Returns 0,
 * EMLIO_ENOTFOUND, EMLIO_EFORMAT (not a mapped shard, or a record too
 * large), EMLIO_ENOMEM, -EIO, or -ESTALE when the file has become shorter
 * or a tar header no longer matches (the shard is then marked changed). */
int emlio__shard_read_copy(emlio__shard_t *shard, size_t i, uint8_t **buf_out,
                           const uint8_t **data, size_t *len, uint32_t *stored,
                           emlio__shardset_log_fn *log, void *userdata);

/* Unmaps and frees everything; leaves self empty. */
void emlio__shardset_release(emlio__shardset_t *self);

#endif /* EMLIO_SHARDSET_H */
