/* dsindex.h - one binary index per dataset, read once at start.
 * SPDX-License-Identifier: MIT
 *
 * A cached start must cost time in proportion to the index, not to the
 * data: the DALI text sidecars ("<shard>.idx") are parsed into the heap
 * and checked against every record header, which reads every page of the
 * dataset. This file holds, for every mapped shard of a data directory,
 * its identity at indexing time (name, size, mtime, inode) and its
 * format's record table, in one file read once into one private, read-only
 * region (one mapping, however many shards: vm.max_map_count is 65530; not
 * a shared mapping of the file, which a truncation or an in-place rewrite
 * under the daemon would turn into SIGBUS). A shard whose stat still
 * matches takes its table straight from that region; a record table is
 * checked by its own CRC when the shard is first read (see the format's
 * adopt_table), and every record by its data CRC as it is served.
 *
 * The file format (version 1) is in docs/protocol.md, "Dataset index".
 * Writers replace the file atomically (temporary file + rename); what a
 * daemon read earlier is its own whatever happens to the file.
 */
#ifndef EMLIO_DSINDEX_H
#define EMLIO_DSINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "format.h"

#define EMLIO__DSINDEX_NAME    ".emlio-index"
#define EMLIO__DSINDEX_VERSION 1u

/* One shard's entry, as stored (little-endian; 80 bytes). */
typedef struct emlio__dsindex_entry {
    uint64_t name_off; /* into the names area */
    uint32_t name_len;
    char format[12]; /* the format's name, NUL-padded */
    uint64_t size;
    uint64_t mtime_ns;
    uint64_t ino;
    uint64_t records;
    uint64_t table_off; /* from the start of the file, 16-aligned */
    uint64_t table_len;
    uint32_t table_crc; /* CRC-32C of the table's bytes */
    uint32_t reserved;
} emlio__dsindex_entry_t;

/* A mapped index; zeroed = none. */
typedef struct emlio__dsindex {
    const uint8_t *map;
    size_t size;
    size_t n;
    const emlio__dsindex_entry_t *entries;
    const char *names;
    uint64_t written_ns; /* when it was written */
} emlio__dsindex_t;

/* What a writer stores for one shard. */
typedef struct emlio__dsindex_item {
    const char *name;
    const char *format;
    const struct stat *st; /* the shard as it was indexed */
    uint64_t records;
    const void *table;
    size_t table_len;
    /* The table's CRC when it is an earlier index's table, unchanged:
     * carried over (never recomputed over bytes not checked since). */
    bool crc_known;
    uint32_t crc;
} emlio__dsindex_item_t;

/* Where the index of data directory dir lives: dir/.emlio-index, or with
 * index_dir, index_dir/<16 hex digits of dir's absolute path>.emlio-index
 * (for read-only data). Returns 0 or -ENAMETOOLONG / -errno. */
int emlio__dsindex_path(const char *dir, const char *index_dir, char *out,
                        size_t len);

/* Maps the index at path and checks its header, shard table and names
 * against root (the data directory's stat: an index of another directory
 * is refused). Returns 0 with *self filled, -ENOENT when there is none,
 * or EMLIO_EFORMAT / -errno with errbuf saying why (the caller logs it and
 * rebuilds). */
int emlio__dsindex_open(emlio__dsindex_t *self, const char *path,
                        const struct stat *root, char *errbuf);

/* The checks of emlio__dsindex_open on map[0, size) (borrowed; the
 * fuzzer's entry point), root_ino being the data directory's inode.
 * Returns 0 with *self pointing into map, or EMLIO_EFORMAT. */
int emlio__dsindex_parse(emlio__dsindex_t *self, const uint8_t *map,
                         size_t size, uint64_t root_ino, const char *path,
                         char *errbuf);

/* The entry of shard name, or NULL. */
const emlio__dsindex_entry_t *emlio__dsindex_find(const emlio__dsindex_t *self,
                                                  const char *name);

/* Whether entry still describes the file st of format: same size, mtime,
 * inode and format, and not modified within two seconds before the index
 * was written (a write in the same clock tick could leave size and mtime
 * as they were). */
bool emlio__dsindex_fresh(const emlio__dsindex_t *self,
                          const emlio__dsindex_entry_t *entry,
                          const struct stat *st, const char *format);

/* The record table of entry (inside the mapping). */
const void *emlio__dsindex_table(const emlio__dsindex_t *self,
                                 const emlio__dsindex_entry_t *entry);

/* Writes items[0, n) (any order) as the index of root at path, through a
 * temporary file renamed over it. Returns 0 or -errno. */
int emlio__dsindex_write(const char *path, const struct stat *root,
                         emlio__dsindex_item_t *items, size_t n);

/* Unmaps; leaves self zeroed. */
void emlio__dsindex_close(emlio__dsindex_t *self);

#endif /* EMLIO_DSINDEX_H */
