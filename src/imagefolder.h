/* imagefolder.h - ImageFolder trees (ROOT/CLASS/.../x.jpg) as shards.
 * SPDX-License-Identifier: MIT
 *
 * Each class directory is one shard: its image files (found recursively,
 * hidden files and directories skipped, extensions compared without case)
 * in byte order of their path are its records, and its label is the index
 * of the class directory among the sorted class directories, as
 * torchvision's ImageFolder assigns them.
 *
 * Records are read with one open beneath the data root's descriptor
 * (beneath.h: never outside the root, never a FIFO) + one read into a
 * fresh buffer + close: see docs/formats.md for the measurements behind
 * this. Symlinks are listed only when the root follows them, and only
 * when they lead to a regular file inside the root.
 * Each read checks the file's size against the listing; a changed file is
 * an error naming it, never a short or padded sample.
 *
 * Thread rules: scan from one thread; then emlio__folder_read from many.
 */
#ifndef EMLIO_IMAGEFOLDER_H
#define EMLIO_IMAGEFOLDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "beneath.h"

typedef struct emlio__folder emlio__folder_t;

/* Is name (a file's basename) an image ImageFolder serves? */
bool emlio__folder_is_image(const char *name);

/* A handle for class directory root/cls with label `label`, whose files
 * are opened beneath base (its descriptor borrowed: it must outlive the
 * handle). Opens nothing. NULL only when out of memory. */
emlio__folder_t *emlio__folder_new(const char *root, const char *cls,
                                   int64_t label, const emlio__root_t *base);
void emlio__folder_destroy(emlio__folder_t **self_p);

/* Opens the class directory and lists its images. Returns the count or
 * -errno / EMLIO_ENOMEM with the message in errmsg. */
int emlio__folder_scan(emlio__folder_t *self);

/* Symlinks the scan left out (not followed, or leading out of the root or
 * to something not a regular file), and subdirectories it could not open
 * (permission); *example names one (borrowed). */
size_t emlio__folder_links(const emlio__folder_t *self, const char **example);
size_t emlio__folder_unreadable(const emlio__folder_t *self,
                                const char **example);

size_t emlio__folder_count(const emlio__folder_t *self);
/* Sum of the listed files' sizes. */
uint64_t emlio__folder_size(const emlio__folder_t *self);
int64_t emlio__folder_label(const emlio__folder_t *self);
/* Path of record i relative to the class directory (borrowed). */
const char *emlio__folder_file(const emlio__folder_t *self, size_t i);
/* Size of record i's file as listed (0 for no record i). */
uint64_t emlio__folder_file_size(const emlio__folder_t *self, size_t i);
const char *emlio__folder_errmsg(const emlio__folder_t *self);

/* Reads record i into a fresh buffer (*data, freed with emlio_free).
 * Returns 0, EMLIO_ENOTFOUND (no record i), EMLIO_EFORMAT (the file's size
 * changed since the listing), -errno or EMLIO_ENOMEM. Thread-safe. */
int emlio__folder_read(const emlio__folder_t *self, size_t i, uint8_t **data,
                       size_t *len);

/* The listing cache: every class's directories (with mtimes) and files
 * (with size and mtime), written beside the tree as ROOT/.emlio-files
 * (atomically; hidden, so never served) after a scan. */
int emlio__folder_cache_write(const char *path, struct timespec root_mtime,
                              emlio__folder_t *const *folders, size_t n);
/* Fills folders[0, n) (new, unscanned, the tree's classes in order) from
 * cache text[0, len) when it still describes the tree. The cache is a
 * hint, never authority: every name must be one a walk writes (relative,
 * no hidden or ".." component, sorted, no repeats), and each class's
 * directory entries now (read without a stat per file) must be exactly
 * the files and directories it lists: nothing missing, nothing added, no
 * other class (root_mtime is recorded for people, not compared: writing
 * the cache into the root changes it). Sizes and mtimes are checked at
 * each read. Returns 0, -ESTALE, EMLIO_EFORMAT or EMLIO_ENOMEM (then the
 * folders are left empty and why, EMLIO_ERRMSG_LEN or NULL, says why). */
int emlio__folder_cache_load(const char *text, size_t len,
                             struct timespec root_mtime,
                             emlio__folder_t *const *folders, size_t n,
                             char *why);

#endif /* EMLIO_IMAGEFOLDER_H */
