/* tar_impl.h - the tar handle, shared by tar.c (reading) and
 * tar_table.c (its dataset index table). Private to those two files.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TAR_IMPL_H
#define EMLIO_TAR_IMPL_H

#include <stdatomic.h>
#include <sys/stat.h>

#include "mapfile.h"
#include "tar.h"

struct emlio__tar {
    emlio__mapfile_t file; /* the archive, its mapping, its last error */
    emlio__tar_index_t idx;
    /* A table from the dataset index (dsindex.h): idx.members and
     * idx.first point into it; checked on first read (S_TABLE_*). */
    const uint8_t *table;
    size_t table_len;
    uint32_t table_crc;
    atomic_int table_state;
    uint8_t *table_buf; /* what emlio__tar_table built */
    /* The last prune: its key ("*" or the field), what it dropped. */
    char *pruned_key;
    uint64_t pruned;
    char *pruned_example;
};

enum { S_TABLE_OK = 0, S_TABLE_UNCHECKED, S_TABLE_CHECKING };

/* Forgets the index (a borrowed table's arrays are not ours) and what
 * pruned it. */
void emlio__tar_drop(emlio__tar_t *self);
/* The prune itself, on an index of our own (see emlio__tar_prune). */
size_t emlio__tar_prune_now(emlio__tar_t *self, const char *field,
                            char *example, size_t len);
/* Whether the index may be read: one load once checked. A borrowed
 * table is checked (CRC and bounds) by the first reader, others waiting;
 * one that fails is replaced (emlio__tar_adopt). Always 0: what readers
 * see afterwards is safe to read. */
int emlio__tar_ready(const emlio__tar_t *self);

#endif /* EMLIO_TAR_IMPL_H */
