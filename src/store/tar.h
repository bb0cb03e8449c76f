/* tar.h - WebDataset tar shards: mapped, indexed, members zero-copy.
 * SPDX-License-Identifier: MIT
 *
 * A WebDataset shard is a tar archive (POSIX ustar, GNU long names 'L',
 * pax extended headers 'x') whose regular members are grouped into
 * samples: consecutive members sharing a key, the key being the member
 * path up to the first dot of its basename, the field the rest after that
 * dot, lower-cased ("a/b/000.seg.png" is key "a/b/000", field "seg.png").
 * Members whose basename has no key (no dot, or a leading dot) and
 * non-regular members (directories, links, pax globals) are not samples
 * and are skipped, as webdataset and DALI skip them.
 *
 * The index (members with data offset, length and field; samples as runs
 * of members) comes from one walk of the headers, or from a DALI wds2idx
 * "v1.2" index file checked against the mapping.
 *
 * Thread rules: open/scan/load_index/write_index from one thread; after
 * that the accessors may be called from many threads at once.
 */
#ifndef EMLIO_TAR_H
#define EMLIO_TAR_H

#include "beneath.h"
#include "format.h"
#include "mapfile.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

/* Longest member path we accept (GNU long names and pax paths included). */
#define EMLIO_TAR_MAX_NAME   4096
/* Fields (distinct extensions) per shard; more is not a WebDataset. */
#define EMLIO_TAR_MAX_FIELDS 256

typedef struct emlio__tar_member {
    uint64_t offset; /* of the data, a multiple of 512 */
    uint64_t len;
    uint32_t field; /* index into fields */
} emlio__tar_member_t;

/* What a scan or an index load produces; owned by whoever holds it. */
typedef struct emlio__tar_index {
    emlio__tar_member_t *members;
    size_t n_members;
    uint32_t *first; /* n_samples + 1 entries: sample i is members
                        [first[i], first[i + 1]) */
    size_t n_samples;
    char **fields; /* distinct field names, in order of first appearance */
    size_t n_fields;
    char **names; /* member paths (scan only; NULL after a load) */
} emlio__tar_index_t;

void emlio__tar_index_release(emlio__tar_index_t *idx);

/* Walks the tar headers of base[0, size) named name and fills *out (empty
 * on entry). Returns the sample count, EMLIO_EFORMAT (bad checksum, a
 * member running past the end, a duplicate field in one sample; errbuf
 * names the file and offset) or EMLIO_ENOMEM. Nothing is left allocated
 * on failure. Never reads outside base[0, size). */
int emlio__tar_scan_mem(const uint8_t *base, size_t size, const char *name,
                        emlio__tar_index_t *out, char *errbuf);

/* Parses a wds2idx v1.2 index text[0, len) named idx_name and checks it
 * against the shard base[0, size) named name: every member's header just
 * before its data, with a valid checksum, regular type and the same size;
 * offsets increasing; samples grouped by key. Returns the sample count,
 * EMLIO_EFORMAT (message names the index line) or EMLIO_ENOMEM. */
int emlio__tar_parse_index(const char *text, size_t len, const char *idx_name,
                           const uint8_t *base, size_t size, const char *name,
                           emlio__tar_index_t *out, char *errbuf);

/* What a prune left out, kept so that a table stored after it says so:
 * key is "-" (not pruned), "*" (pruned to samples with an image member)
 * or the field pruned for (a list "jpg,cls": every one of them); example
 * names the first sample dropped. */
typedef struct emlio__tar_pruned {
    const char *key;
    uint64_t dropped;
    const char *example;
} emlio__tar_pruned_t;

/* The dataset index's record table of a tar shard (tar_table.c; layout in
 * docs/protocol.md 9.1): idx and what pruned it, in one fresh buffer
 * (*out, *len; the caller frees it). Returns 0 or EMLIO_ENOMEM. */
int emlio__tar_table_write(const emlio__tar_index_t *idx,
                           const emlio__tar_pruned_t *pruned, uint8_t **out,
                           size_t *len);
/* Reads such a table t[0, len) (8-aligned) of `samples` samples into *out:
 * field names copied, members and sample starts pointing into t (not to
 * be freed); *key and *example point into t. Checks sizes only (see
 * emlio__tar_table_ok). Returns 0, EMLIO_EFORMAT or EMLIO_ENOMEM. */
int emlio__tar_table_read(const uint8_t *t, size_t len, uint64_t samples,
                          emlio__tar_index_t *out, const char **key,
                          const char **example, uint64_t *dropped);
/* Whether every sample start and member of idx is inside a shard of size
 * bytes and every field exists: what reads rely on. Reads all of idx. */
bool emlio__tar_table_ok(const emlio__tar_index_t *idx, uint64_t size);

typedef struct emlio__tar emlio__tar_t;

emlio__tar_t *emlio__tar_new(const char *path);
void emlio__tar_destroy(emlio__tar_t **self_p);
/* Maps the file read-only. Returns 0 or -errno (message in errmsg). */
int emlio__tar_open(emlio__tar_t *self);
/* The archive's mapped file (mapfile.h). */
emlio__mapfile_t *emlio__tar_file(emlio__tar_t *self);
/* Maps the file from fd (open on the handle's file, st its fstat) for a
 * handle not mapped now; the fd stays the caller's (the shard cache). */
int emlio__tar_map_fd(emlio__tar_t *self, int fd, const struct stat *st);
/* Unmaps the file, keeping its index and size (the shard cache's close);
 * nothing may read the members' data until it is mapped again. */
void emlio__tar_unmap(emlio__tar_t *self);
/* Opens the shard (and the index beside it) beneath root from now on:
 * rel is the end of the handle's path relative to the root (see
 * emlio__tfrecord_confine). */
void emlio__tar_confine(emlio__tar_t *self, const emlio__root_t *root,
                        const char *rel);
/* Builds the index by walking the headers. Returns the sample count or an
 * error as emlio__tar_scan_mem. */
int emlio__tar_scan(emlio__tar_t *self);
/* Loads idx_path when it is not older than the shard and describes it.
 * Returns the sample count, -ENOENT, -ESTALE (older than the shard),
 * EMLIO_EFORMAT or EMLIO_ENOMEM. */
int emlio__tar_load_index(emlio__tar_t *self, const char *idx_path);
/* Writes the index in DALI's wds2idx v1.2 format, atomically. Members
 * whose names hold white space cannot be written (-EINVAL). Needs the
 * member names, so only after a scan. Returns 0 or -errno. */
int emlio__tar_write_index(const emlio__tar_t *self, const char *idx_path);

const char *emlio__tar_path(const emlio__tar_t *self);
const char *emlio__tar_errmsg(const emlio__tar_t *self);
size_t emlio__tar_count(const emlio__tar_t *self);
uint64_t emlio__tar_size(const emlio__tar_t *self);
const emlio__tar_index_t *emlio__tar_index(const emlio__tar_t *self);
/* Offset of sample i's first member's data (for messages and advice). */
uint64_t emlio__tar_offset(const emlio__tar_t *self, size_t i);

/* Finds sample i's member for field (exact, lower case), or with field
 * NULL the member emlio__tar_default_field picks, and stores its index
 * into emlio__tar_index(self)->members in *member. Returns 0,
 * EMLIO_ENOTFOUND (no sample i) or -ENOENT (no such member). */
int emlio__tar_find(const emlio__tar_t *self, size_t i, const char *field,
                    size_t *member);
/* Where member's data starts in the mapping (valid while the handle
 * lives and the file is not truncated; see emlio__tar_blank). */
const uint8_t *emlio__tar_data(const emlio__tar_t *self, size_t member);
/* Whether h (512 bytes) is the header of a regular member of len bytes:
 * the check index loads make, for copying reads that read the header with
 * the data. A header whose own size field is 0 passes (pax sizes, for
 * members of 8 GiB and more, leave it so). */
bool emlio__tar_header_ok(const uint8_t *h, uint64_t len);
/* A label member's value, p[0, n) (ASCII decimal, blanks around it); -1
 * when it is not a number. */
int64_t emlio__tar_parse_label(const uint8_t *p, size_t n);
/* Replaces the mapping by zero pages of the same size in place, as
 * emlio__tfrecord_blank does. Returns 0 or -errno. */
int emlio__tar_blank(emlio__tar_t *self);

/* Takes the shard's index from a dataset index table (see
 * emlio__tar_table_read; borrowed from a mapping that outlives the
 * handle) of a file of size bytes, when it was pruned as prune asks
 * ("-", "*" or a field; a table not pruned is taken for any). Needs no
 * open file. The table is checked against crc and emlio__tar_table_ok
 * when the shard is first read; a bad one is replaced by a rescan of the
 * mapping (pruned the same way), or, when that fails, by samples without
 * members. Returns the sample count or EMLIO_EFORMAT / -ESTALE /
 * EMLIO_ENOMEM. */
int emlio__tar_adopt(emlio__tar_t *self, const void *table, size_t len,
                     uint64_t records, uint64_t size, uint32_t crc,
                     const char *prune);
/* The table to store in the dataset index (*len bytes; valid until the
 * next adopt, scan or load). NULL when out of memory. */
const void *emlio__tar_table(emlio__tar_t *self, size_t *len);

/* Drops the samples that have no member field (a list "jpg,cls,json": that
 * lack any of them; NULL: no image member, where emlio__tar_default_field
 * would pick another one) from the index,
 * so they are neither counted nor served. Returns how many were dropped;
 * example (len bytes) names the first ("'README.txt' in 'a.tar' at offset
 * 0"). */
size_t emlio__tar_prune(emlio__tar_t *self, const char *field, char *example,
                        size_t len);

/* Finds field `field` (exact, lower case) of sample i and points *data
 * into the mapping (zero-copy, valid while the handle lives). Returns 0,
 * EMLIO_ENOTFOUND (no sample i) or -ENOENT (the sample lacks the field). */
int emlio__tar_field(const emlio__tar_t *self, size_t i, const char *field,
                     const uint8_t **data, size_t *len);
/* The member a single-field stream sends when no field is named: the first
 * member whose field is an image extension (jpg, jpeg, png, webp, ...),
 * else the first member that is not "cls". Returns 0, EMLIO_ENOTFOUND or
 * -ENOENT (an empty sample). */
int emlio__tar_default_field(const emlio__tar_t *self, size_t i,
                             const uint8_t **data, size_t *len);
/* The label of sample i from its member `field` (ASCII decimal, as
 * webdataset's "cls"); -1 when absent or not a number. */
int64_t emlio__tar_label(const emlio__tar_t *self, size_t i, const char *field);
/* Page-cache advice for samples [first, first + n), as emlio_tfrecord_advise.
 */
int emlio__tar_advise(const emlio__tar_t *self, size_t first, size_t n,
                      int advice);

/* Tar (WebDataset) behind the format interface (format.h; format_tar.c). */
extern const emlio__format_ops_t emlio__format_tar;

#endif /* EMLIO_TAR_H */
