/* imagefolder_list.h - a class directory's listing as imagefolder.c (the
 * walk, reads) and imagefolder_cache.c (the file-list cache) share it.
 * SPDX-License-Identifier: MIT
 *
 * A listing is a packed block: directory and file entries, then their
 * NUL-terminated names. A walked class owns its block; the classes loaded
 * from one cache share the cache's block (refcounted), so a cached start
 * allocates nothing per file. The entries are the cache's own layout.
 */
#ifndef EMLIO_IMAGEFOLDER_LIST_H
#define EMLIO_IMAGEFOLDER_LIST_H

#include <stdatomic.h>

#include "imagefolder.h"

/* A listed image (24 bytes, host byte order, as the cache stores it). */
typedef struct emlio__folder_file {
    uint64_t size;
    int64_t mtime_ns;
    uint32_t name; /* offset of its path (relative to the class) */
    uint32_t len;  /* strlen of that path */
} emlio__folder_file_t;

/* A directory walked (32 bytes): entries added, removed or renamed in it
 * change its mtime, which is how a cached listing is found stale without
 * a stat per file. */
typedef struct emlio__folder_dir {
    uint64_t dev;
    uint64_t ino;
    int64_t mtime_ns;
    uint32_t name; /* "" for the class directory, else "sub/" */
    uint32_t len;
} emlio__folder_dir_t;

typedef struct emlio__folder_blob {
    atomic_size_t refs;
    void *mem;
} emlio__folder_blob_t;

/* Class flags, as the cache stores them. */
#define EMLIO__FOLDER_RELIST 1u /* left something out: list at each start */

struct emlio__folder {
    char *root;
    char *cls;
    int64_t label;
    emlio__root_t base; /* the data root (descriptor borrowed) */
    /* What the walk left out, and one example of each for the log (short:
     * a tree has thousands of classes). */
    size_t links; /* symlinks */
    char link[256];
    size_t unreadable; /* subdirectories it could not open */
    char unread[256];
    size_t empty; /* image files of 0 bytes: no image, never a sample */
    char empty_ex[256];
    emlio__folder_blob_t *blob; /* owns files, dirs, names */
    const emlio__folder_file_t *files;
    size_t n;
    const emlio__folder_dir_t *dirs;
    size_t n_dirs;
    const char *names; /* the entries' name offsets count from here */
    size_t names_len;
    uint64_t bytes;
    int64_t listed_ns; /* CLOCK_REALTIME when the walk began */
    unsigned flags;
    bool listed; /* walked by this load */
    bool cached; /* taken from the cache by this load */
    char err[EMLIO_ERRMSG_LEN];
};

/* A blob owning mem (emlio_free'd with the last reference); NULL on OOM. */
emlio__folder_blob_t *emlio__folder_blob_new(void *mem);
void emlio__folder_blob_drop(emlio__folder_blob_t **blob_p);
/* Drops the listing (back to a new, unscanned folder). */
void emlio__folder_forget(emlio__folder_t *self);
/* Opens CLASS/rel beneath the data root, as emlio__open_beneath. */
int emlio__folder_open(const emlio__folder_t *self, const char *rel,
                       unsigned flags, struct stat *st);
/* A timestamp in ns, as entries store it. */
int64_t emlio__folder_ns(struct timespec ts);

#endif /* EMLIO_IMAGEFOLDER_LIST_H */
