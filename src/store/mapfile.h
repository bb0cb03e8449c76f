/* mapfile.h - map a whole file read-only: what the TFRecord and tar
 * readers share.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_MAPFILE_H
#define EMLIO_MAPFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "beneath.h"

/* Opens rel beneath root (beneath.h; path names it in messages) and maps
 * it whole (MAP_PRIVATE; *base NULL for an empty file), fills *st from the
 * open file, and closes the descriptor: the mapping keeps the file alive,
 * and one descriptor per shard would eat the fd limit. Returns 0, or < 0
 * with errbuf (EMLIO_ERRMSG_LEN) saying "cannot open/map 'path': why" (a
 * link out of the root, a directory, a FIFO or other non-regular file and
 * a file larger than the address space are refused). */
int emlio__map_file(const emlio__root_t *root, const char *rel,
                    const char *path, const uint8_t **base, size_t *size,
                    struct stat *st, char *errbuf);

/* Maps the open regular file fd whole (MAP_PRIVATE; *base NULL for an
 * empty file) at the size st gives, without closing fd: how the shard
 * cache maps a shard it has opened, leased and checked itself (so the
 * mapping is of that very inode). Returns 0 or < 0 with errbuf as
 * emlio__map_file. */
int emlio__map_fd(int fd, const struct stat *st, const char *path,
                  const uint8_t **base, size_t *size, char *errbuf);

/* Unmaps what emlio__map_file or emlio__map_fd mapped (NULL: nothing). */
void emlio__map_drop(const uint8_t *base, size_t size);

/* Replaces the pages of a mapping made by emlio__map_file with zeros, in
 * place (frames pointing into it stay valid, but read zeros instead of a
 * file that shrank: no SIGBUS). A NULL base is a no-op. 0 or -errno. */
int emlio__map_blank(const uint8_t *base, size_t size);

#endif /* EMLIO_MAPFILE_H */
