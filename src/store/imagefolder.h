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
 * Each read checks the file's size and mtime against the listing; a
 * changed file is an error naming it, never a short or padded sample.
 * Nothing is held open between reads: no descriptor per class.
 *
 * Thread rules: scan from one thread; then the format's reads from many.
 */
#ifndef EMLIO_IMAGEFOLDER_H
#define EMLIO_IMAGEFOLDER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "beneath.h"
#include "format.h"

typedef struct emlio__folder emlio__folder_t;

/* Is name (a file's basename) an image ImageFolder serves? */
bool emlio__folder_is_image(const char *name);

/* A handle for class directory root/cls with label `label`, whose files
 * are opened beneath base (its descriptor borrowed: it must outlive the
 * handle). Opens nothing. NULL only when out of memory. */
emlio__folder_t *emlio__folder_new(const char *root, const char *cls,
                                   int64_t label, const emlio__root_t *base);
void emlio__folder_destroy(emlio__folder_t **self_p);

/* Opens the class directory and lists its images (a stat per image, for
 * its size and mtime). Returns the count or -errno / EMLIO_ENOMEM with
 * the message in errmsg. */
int emlio__folder_scan(emlio__folder_t *self);

/* Symlinks the scan left out (not followed, or leading out of the root or
 * to something not a regular file), and subdirectories it could not open
 * (permission); *example names one (borrowed). */
size_t emlio__folder_links(const emlio__folder_t *self, const char **example);
/* Image files of 0 bytes the walk left out (no image: never an empty
 * sample); *example names one. */
size_t emlio__folder_empty(const emlio__folder_t *self, const char **example);
size_t emlio__folder_unreadable(const emlio__folder_t *self,
                                const char **example);

/* Records (image files) listed. */
size_t emlio__folder_count(const emlio__folder_t *self);
const char *emlio__folder_errmsg(const emlio__folder_t *self);

/* Was this class walked (every file stat'ed) by the scan of this load, or
 * taken from the file-list cache (its directories stat'ed, no file)? */
bool emlio__folder_listed(const emlio__folder_t *self);
bool emlio__folder_cached(const emlio__folder_t *self);

/* The file-list cache, ROOT/.emlio-files (imagefolder_cache.c; format in
 * docs/formats.md): every class's directories (device, inode, mtime) and
 * files (size, mtime), written atomically (hidden, so never served) from
 * listed or cached folders[0, n). follow: the root follows symlinks
 * (a list made one way is not used the other). Returns 0 or -errno. */
int emlio__folder_cache_write(const char *path, bool follow,
                              emlio__folder_t *const *folders, size_t n);
/* Points folders[0, n) (new, unscanned: the tree's classes) at the
 * listing in cache data[0, len) when their directories still match it.
 * The cache is a hint, never authority: magic, version, length and
 * checksum are checked, every name must be one a walk writes (relative,
 * no hidden or ".." component, images only, sorted, no repeats, in a
 * listed directory), and a class is used only when each of its listed
 * directories, opened beneath the root now, has the same device, inode
 * and mtime, and that mtime is older than its walk by a margin (a change
 * within the same clock tick would not show). Files are not stat'ed:
 * sizes and mtimes are checked at each read. Takes *data_p (freed when the
 * last folder using it goes; NULL then). Returns how many folders are
 * left to scan (stale or new classes; why says why for the first), or
 * EMLIO_EFORMAT / -ESTALE (the whole cache unusable; folders left empty),
 * EMLIO_ENOMEM. *rewrite: the cache should be written again after the
 * scans (stale, new or removed classes, or unusable). */
int emlio__folder_cache_load(uint8_t **data_p, size_t len, bool follow,
                             emlio__folder_t *const *folders, size_t n,
                             bool *rewrite, char *why);
/* The checks of emlio__folder_cache_load that need no file system: the
 * header, the tables and every class's names (the fuzzer's entry). Reads
 * nothing outside data[0, len) (which must be 8-byte aligned). Returns 0,
 * EMLIO_EFORMAT or -ESTALE, with why. */
int emlio__folder_cache_check(const uint8_t *data, size_t len, bool follow,
                              char *why);
/* Sets a cache's checksum after an edit (tests forge lists with it). */
int emlio__folder_cache_seal(uint8_t *data, size_t len);

/* The tree format's load_tree (format.h; imagefolder_tree.c): the
 * non-hidden subdirectories of dir, sorted, each a shard (a handle of
 * this module) added through load->add; their listing from
 * dir/.emlio-files when it still describes them, else walked (and the
 * list written again with load->write_index). A class without images is
 * an error, as in torchvision. Returns the number of classes or < 0 with
 * errbuf set. */
int emlio__folder_load_tree(const emlio__tree_load_t *load, const char *dir,
                            char *errbuf);

/* ImageFolder behind the format interface (format.h): one shard per class
 * directory, one record per image file, the label the class's index;
 * fields "image" and "label". Files are read into copies (size and mtime
 * checked at every read), so no lease, user count or mapping applies. */
extern const emlio__format_ops_t emlio__format_imagefolder;

#endif /* EMLIO_IMAGEFOLDER_H */
