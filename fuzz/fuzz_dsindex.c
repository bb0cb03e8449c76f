/* fuzz_dsindex.c - libFuzzer harness for the dataset index checks
 * (emlio__dsindex_parse): header, entries, names and table bounds.
 * SPDX-License-Identifier: MIT
 *
 * The data directory's inode is taken from the input's own header, so
 * inputs reach the entry checks; every accepted entry is looked up by
 * name and its table's first and last bytes are read (ASan catches a
 * table outside the input).
 */
#include "emlio_internal.h"

#include "dsindex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    if (size >= 48)
        memcpy(&ino, copy + 40, 8);
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
        }
    }
    (void)sink;
    emlio_free(copy);
    return 0;
}
