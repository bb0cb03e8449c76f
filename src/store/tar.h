/* tar.h - WebDataset tar shards: mapped, indexed, members zero-copy.
 * The module's private header: tar.c (the handle and its format table),
 * tar_scan.c (reading an archive's headers) and tar_index.c (its indexes
 * on disk) share it.
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

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "beneath.h"
#include "format.h"
#include "mapfile.h"

/* Longest member path we accept (GNU long names and pax paths included). */
#define EMLIO_TAR_MAX_NAME   4096
/* Fields (distinct extensions) per shard; more is not a WebDataset. */
#define EMLIO_TAR_MAX_FIELDS 256
/* A header, and the unit members are padded to. */
#define EMLIO__TAR_BLOCK     512

/* ---- the parts of a header, as bytes (tar_scan.c) ---- */
/* Octal (NUL/space padded) or GNU base-256 number field p[0, n). */
bool emlio__tarh_number(const uint8_t *p, size_t n, uint64_t *out);
/* Whether the 512-byte header h carries a right checksum. */
bool emlio__tarh_checksum_ok(const uint8_t *h);
/* Whether h is all zero (the end of an archive). */
bool emlio__tarh_zero_block(const uint8_t *h);
/* The length of the NUL-terminated field p[0, n). */
size_t emlio__tarh_strnlen(const uint8_t *p, size_t n);
/* Whether typeflag names a regular file member. */
bool emlio__tarh_regular(uint8_t type);
/* Reads the "path" (into path[0, EMLIO_TAR_MAX_NAME)) and "size" records
 * of a pax extended header data[0, len). 0 or EMLIO_EFORMAT. */
int emlio__tarh_pax(const uint8_t *data, size_t len, char *path,
                    size_t *path_len, bool *have_path, uint64_t *size,
                    bool *have_size);
/* Whether h (512 bytes) is the header of a regular member of len bytes:
 * the check index loads make, for copying reads that read the header with
 * the data. A header whose own size field is 0 passes (pax sizes, for
 * members of 8 GiB and more, leave it so). */
bool emlio__tar_header_ok(const uint8_t *h, uint64_t len);

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
/* emlio__tar_scan_mem, keeping the member names (for writing a wds2idx
 * index) only with keep_names: an index load's check of the archive
 * needs none. */
int emlio__tar_walk(const uint8_t *base, size_t size, const char *name,
                    bool keep_names, emlio__tar_index_t *out, char *errbuf);

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

/* The dataset index's record table of a tar shard (tar_index.c; layout in
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

/* ---- the handle (tar.c) ---- */

typedef struct emlio__tar {
    emlio__mapfile_t file; /* the archive, its mapping, its last error */
    emlio__tar_index_t idx;
    /* A table from the dataset index (dsindex.h): idx.members and
     * idx.first point into it; checked on first read (S_TABLE_*). */
    const uint8_t *table;
    size_t table_len;
    uint32_t table_crc;
    atomic_int table_state;
    uint8_t *table_buf; /* what the format's index_table built */
    /* The last prune: its key ("*" or the field), what it dropped. */
    char *pruned_key;
    uint64_t pruned;
    char *pruned_example;
} emlio__tar_t;

enum { S_TABLE_OK = 0, S_TABLE_UNCHECKED, S_TABLE_CHECKING };

emlio__tar_t *emlio__tar_new(const char *path);
void emlio__tar_destroy(emlio__tar_t **self_p);
/* Maps the file read-only. Returns 0 or -errno (message in errmsg). */
int emlio__tar_open(emlio__tar_t *self);
/* Builds the index by walking the headers. Returns the sample count or an
 * error as emlio__tar_scan_mem. */
int emlio__tar_scan(emlio__tar_t *self);
/* Forgets the index (a borrowed table's arrays are not ours) and what
 * pruned it. */
void emlio__tar_drop(emlio__tar_t *self);

const char *emlio__tar_errmsg(const emlio__tar_t *self);
size_t emlio__tar_count(const emlio__tar_t *self);

/* Finds sample i's member for field (exact, lower case), or with field
 * NULL the member emlio__tar_default_field picks, and stores its index
 * into the index's members in *member. Returns 0, EMLIO_ENOTFOUND (no
 * sample i) or -ENOENT (no such member). */
int emlio__tar_find(const emlio__tar_t *self, size_t i, const char *field,
                    size_t *member);
/* Where member's data starts in the mapping (valid while the handle
 * lives and the file is not truncated; see emlio__mapfile_blank). */
const uint8_t *emlio__tar_data(const emlio__tar_t *self, size_t member);
/* A label member's value, p[0, n) (ASCII decimal, blanks around it); -1
 * when it is not a number. */
int64_t emlio__tar_parse_label(const uint8_t *p, size_t n);
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

/* ---- the indexes on disk (tar_index.c) ---- */
/* Loads idx_path when it is not older than the shard and describes it
 * (checked against a walk of the headers). Returns the sample count,
 * -ENOENT, -ESTALE (older than the shard), EMLIO_EFORMAT or
 * EMLIO_ENOMEM. */
int emlio__tar_load_index(emlio__tar_t *self, const char *idx_path);
/* Writes the index in DALI's wds2idx v1.2 format, atomically. Members
 * whose names hold white space cannot be written (-EINVAL). Needs the
 * member names, so only after a scan. Returns 0 or -errno. */
int emlio__tar_write_index(const emlio__tar_t *self, const char *idx_path);

/* Tar (WebDataset) behind the format interface (format.h): a sample is
 * the run of members sharing a key; a field is a member's extension
 * ("jpg", "cls"). */
extern const emlio__format_ops_t emlio__format_tar;

#endif /* EMLIO_TAR_H */
