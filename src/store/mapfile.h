/* mapfile.h - one file mapped whole, read-only: the handle the TFRecord
 * and tar readers embed for their shard and the index beside it.
 * SPDX-License-Identifier: MIT
 *
 * The handle knows where its file is (a path, opened beneath a root:
 * beneath.h), maps it from a path or from a descriptor the shard cache
 * opened, unmaps it while keeping its size (so a closed shard still
 * answers count and size), blanks it in place when the file changed,
 * advises the page cache over byte ranges of it and reads the small index
 * file that sits beside it. What the bytes mean is the reader's business.
 *
 * Thread rules: init/confine/open/map_fd/unmap/read_beside from one
 * thread; base and size may then be read from many.
 */
#ifndef EMLIO_MAPFILE_H
#define EMLIO_MAPFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include "beneath.h"

/* The largest index file read_beside reads: a few dozen bytes per record
 * of at least 16 bytes; a bigger one is not an index of anything that
 * could be mapped. */
#define EMLIO__MAPFILE_INDEX_MAX ((size_t)1 << 30)

typedef struct emlio__mapfile {
    char *path;            /* as named, for messages */
    emlio__root_t root;    /* where path is opened (beneath.h) */
    size_t skip;           /* path + skip is path relative to root */
    const uint8_t *base;   /* NULL when unmapped or empty */
    size_t size;           /* kept while unmapped */
    struct timespec mtime; /* of the file last mapped */
    bool open;             /* mapped now */
    char err[EMLIO_ERRMSG_LEN];
} emlio__mapfile_t;

/* Names the file (path copied) with nothing mapped, files opened as named
 * until confine. Returns 0 or EMLIO_ENOMEM. */
int emlio__mapfile_init(emlio__mapfile_t *self, const char *path);

/* Opens the file (and the index beside it) beneath root from now on: rel
 * is the end of path relative to the root. The root's descriptor is
 * borrowed and must stay open while the handle opens files. */
void emlio__mapfile_confine(emlio__mapfile_t *self, const emlio__root_t *root,
                            const char *rel);

/* Opens the file beneath the root and maps it whole (MAP_PRIVATE; base
 * NULL for an empty file), then closes the descriptor: the mapping keeps
 * the file alive, and one descriptor per shard would eat the fd limit.
 * Returns 0, or < 0 with err saying "cannot open/map 'path': why" (a link
 * out of the root, a directory, a FIFO or other non-regular file and a
 * file larger than the address space are refused). */
int emlio__mapfile_open(emlio__mapfile_t *self);

/* Maps the open regular file fd whole at the size st gives, without
 * closing fd, for a handle not mapped now: how the shard cache maps a
 * shard it opened, leased and checked itself (so the mapping is of that
 * very inode). Returns 0 or < 0 with err as emlio__mapfile_open. */
int emlio__mapfile_map_fd(emlio__mapfile_t *self, int fd,
                          const struct stat *st);

/* Drops the mapping but keeps size and mtime: the shard cache's close.
 * Nothing may read base until the file is mapped again. */
void emlio__mapfile_unmap(emlio__mapfile_t *self);

/* Replaces the mapping by zero pages of the same size, in place: pointers
 * into it stay valid but read zeros instead of a file that shrank (no
 * SIGBUS). Nothing mapped is a no-op. Returns 0 or -errno. */
int emlio__mapfile_blank(const emlio__mapfile_t *self);

/* Page-cache advice (EMLIO_ADVISE_WILLNEED or EMLIO_ADVISE_DONTNEED, see
 * emlio/tfrecord.h) for bytes [start, stop) of the mapping, rounded out to
 * whole pages (the mapping is page aligned and its last page whole, so
 * that stays inside it). Returns 0 (also when nothing is mapped), -EINVAL
 * for a range outside the file or another advice, or -errno. */
int emlio__mapfile_advise(const emlio__mapfile_t *self, uint64_t start,
                          uint64_t stop, int advice);

/* Reads the index file idx_path whole into a fresh buffer (*text, the
 * caller's to free with emlio_free; *len bytes, not NUL-terminated): beneath
 * the root when it sits beside the file (its path begins as the file's),
 * else as named; never a FIFO (beneath.h). With fresh, an index older than
 * the file last mapped is refused (-ESTALE). A file that shrinks meanwhile
 * gives fewer bytes; one that grows is cut at the size fstat gave. Returns
 * 0, or < 0 with err naming the index: -errno, EMLIO_EFORMAT (more than
 * EMLIO__MAPFILE_INDEX_MAX bytes) or EMLIO_ENOMEM. */
int emlio__mapfile_read_beside(emlio__mapfile_t *self, const char *idx_path,
                               bool fresh, char **text, size_t *len);

/* Unmaps and frees the path; leaves self zeroed (an initialised handle
 * or a zeroed one may be released). */
void emlio__mapfile_release(emlio__mapfile_t *self);

#endif /* EMLIO_MAPFILE_H */
