/* keyindex.h - an index from byte keys to the slots of an array the
 * caller owns: open addressing with linear probing and backward-shift
 * deletion, so lookups stay O(1) however many entries come and go.
 * SPDX-License-Identifier: MIT
 *
 * The index stores no keys, only each entry's hash and value (a slot
 * number of the caller's array); it asks the caller's `same` whether the
 * entry at a slot has a given key, so every value in the index must name
 * a live entry of the array whenever the index is called. That keeps it
 * small (12 bytes per entry) and lets the caller keep its array compact.
 * To remove entry i and move the last one, L, into its slot: del(key of
 * i), then put(key of L, i) while L is still in the array, then move it.
 * Not thread-safe: one owner.
 */
#ifndef EMLIO_KEYINDEX_H
#define EMLIO_KEYINDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether the caller's entry at slot `value` has key [key, key + len). */
typedef bool (*emlio__keyindex_same_fn)(const void *owner, uint32_t value,
                                        const void *key, size_t len);

typedef struct emlio__keyindex {
    uint64_t *hashes; /* 0 = empty (a real hash of 0 is stored as 1) */
    uint32_t *values;
    size_t cap; /* a power of two, or 0 */
    size_t n;
    const void *owner;
    emlio__keyindex_same_fn same;
} emlio__keyindex_t;

/* An empty index asking same(owner, ...) to compare keys. */
void emlio__keyindex_init(emlio__keyindex_t *ix, const void *owner,
                          emlio__keyindex_same_fn same);
void emlio__keyindex_release(emlio__keyindex_t *ix);
/* Maps key to value, replacing its value if the key is there. 0, or
 * EMLIO_ENOMEM (the index is unchanged). */
int emlio__keyindex_put(emlio__keyindex_t *ix, const void *key, size_t len,
                        uint32_t value);
/* The value of key into *value: true, or false when it is not there. */
bool emlio__keyindex_get(const emlio__keyindex_t *ix, const void *key,
                         size_t len, uint32_t *value);
/* Forgets key (nothing when it is not there). Call it before the caller's
 * entry changes its key or goes, while `same` can still see it. */
void emlio__keyindex_del(emlio__keyindex_t *ix, const void *key, size_t len);

#endif /* EMLIO_KEYINDEX_H */
