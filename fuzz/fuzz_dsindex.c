/* fuzz_dsindex.c - libFuzzer harness for the dataset index checks
 * (emlio__dsindex_parse): header, entries, names and table bounds.
 * SPDX-License-Identifier: MIT
 *
 * The data directory's inode is taken from the input's own header, and
 * the header's checksum is set right (half the inputs), so inputs reach
 * the entry checks; every accepted entry is looked up by
 * name and its table's first and last bytes are read (ASan catches a
 * table outside the input).
 */
#include "emlio_internal.h"

#include "crc32c.h"
#include "dsindex.h"
#include "tar.h"

/* Sets the header CRC of copy[0, size) to what its counts say it is. */
static void
s_fix_crc(uint8_t *copy, size_t size)
{
    uint64_t n, names;
    memcpy(&n, copy + 16, 8);
    memcpy(&names, copy + 24, 8);
    if (n > (size - 64) / 80 || names > size - 64 - n * 80)
        return;
    uint32_t crc = emlio_crc32c(0, copy, 60);
    crc = emlio_crc32c(crc, copy + 64, (size_t)(n * 80 + names));
    memcpy(copy + 60, &crc, 4);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A tar entry's table read back and bounds-checked as a first read
 * does (tar_index.c). */
static void
s_tar_table(const uint8_t *t, const emlio__dsindex_entry_t *e,
            volatile uint8_t *sink)
{
    emlio__tar_index_t idx;
    const char *key, *example;
    uint64_t dropped;
    if (strncmp(e->format, "tar", sizeof(e->format)) != 0 ||
        emlio__tar_table_read(t, (size_t)e->table_len, e->records, &idx, &key,
                              &example, &dropped) < 0)
        return;
    if (emlio__tar_table_ok(&idx, e->size) && idx.n_members)
        *sink ^= (uint8_t)idx.members[idx.n_members - 1].len;
    idx.members = NULL; /* borrowed from t */
    idx.first = NULL;
    emlio__tar_index_release(&idx);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A private copy: reads past size are caught rather than allowed. */
    uint8_t *copy = emlio_malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    uint64_t ino = 0;
    if (size >= 64) {
        memcpy(&ino, copy + 40, 8);
        if (copy[56] & 1) /* a reserved byte chooses */
            s_fix_crc(copy, size);
    }
    emlio__dsindex_t ix;
    char err[EMLIO_ERRMSG_LEN];
    volatile uint8_t sink = 0;
    if (emlio__dsindex_parse(&ix, copy, size, ino, "fuzz", err) == 0) {
        for (size_t i = 0; i < ix.n; i++) {
            const emlio__dsindex_entry_t *e =
                emlio__dsindex_find(&ix, ix.names + ix.entries[i].name_off);
            const uint8_t *t = emlio__dsindex_table(&ix, e);
            if (e->table_len)
                sink ^= t[0] ^ t[e->table_len - 1];
            s_tar_table(t, e, &sink);
        }
    }
    (void)sink;
    emlio_free(copy);
    return 0;
}
