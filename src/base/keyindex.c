/* keyindex.c - see keyindex.h.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "keyindex.h"

/* FNV-1a, then a final mix: routing ids differ in their last bytes
 * (ZeroMQ numbers them), which FNV alone spreads poorly over the low
 * bits a power-of-two table uses. Never 0, which marks an empty slot. */
static uint64_t
s_hash(const void *key, size_t len)
{
    const uint8_t *p = key;
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

void
emlio__keyindex_init(emlio__keyindex_t *ix, const void *owner,
                     emlio__keyindex_same_fn same)
{
    *ix = (emlio__keyindex_t){ .owner = owner, .same = same };
}

void
emlio__keyindex_release(emlio__keyindex_t *ix)
{
    emlio_free(ix->hashes);
    emlio_free(ix->values);
    emlio__keyindex_init(ix, ix->owner, ix->same);
}

/* The slot holding key, or the empty slot where it would go. */
static size_t
s_find(const emlio__keyindex_t *ix, uint64_t h, const void *key, size_t len)
{
    size_t mask = ix->cap - 1;
    size_t i = (size_t)h & mask;
    while (ix->hashes[i] && !(ix->hashes[i] == h &&
                              ix->same(ix->owner, ix->values[i], key, len)))
        i = (i + 1) & mask;
    return i;
}

/* Doubles the table (or makes the first), rehashing every entry. */
static int
s_grow(emlio__keyindex_t *ix)
{
    size_t cap = ix->cap ? ix->cap * 2 : 16;
    uint64_t *hashes = emlio_calloc(cap, sizeof(*hashes));
    uint32_t *values = emlio_calloc(cap, sizeof(*values));
    if (!hashes || !values) {
        emlio_free(hashes);
        emlio_free(values);
        return EMLIO_ENOMEM;
    }
    for (size_t i = 0; i < ix->cap; i++) {
        if (!ix->hashes[i])
            continue;
        size_t j = (size_t)ix->hashes[i] & (cap - 1);
        while (hashes[j])
            j = (j + 1) & (cap - 1);
        hashes[j] = ix->hashes[i];
        values[j] = ix->values[i];
    }
    emlio_free(ix->hashes);
    emlio_free(ix->values);
    ix->hashes = hashes;
    ix->values = values;
    ix->cap = cap;
    return 0;
}

int
emlio__keyindex_put(emlio__keyindex_t *ix, const void *key, size_t len,
                    uint32_t value)
{
    uint64_t h = s_hash(key, len);
    if (ix->cap) {
        size_t i = s_find(ix, h, key, len);
        if (ix->hashes[i]) {
            ix->values[i] = value;
            return 0;
        }
    }
    /* At most half full: probes stay short. */
    if (2 * (ix->n + 1) > ix->cap && s_grow(ix) < 0)
        return EMLIO_ENOMEM;
    size_t i = s_find(ix, h, key, len);
    ix->hashes[i] = h;
    ix->values[i] = value;
    ix->n++;
    return 0;
}

bool
emlio__keyindex_get(const emlio__keyindex_t *ix, const void *key, size_t len,
                    uint32_t *value)
{
    if (!ix->n)
        return false;
    size_t i = s_find(ix, s_hash(key, len), key, len);
    if (!ix->hashes[i])
        return false;
    *value = ix->values[i];
    return true;
}

void
emlio__keyindex_del(emlio__keyindex_t *ix, const void *key, size_t len)
{
    if (!ix->n)
        return;
    size_t mask = ix->cap - 1;
    size_t i = s_find(ix, s_hash(key, len), key, len);
    if (!ix->hashes[i])
        return;
    /* Backward shift: move up every later entry of the run that would be
     * found from a slot at or before the hole, so no probe stops early at
     * it (no tombstones to sweep). */
    for (size_t j = (i + 1) & mask; ix->hashes[j]; j = (j + 1) & mask) {
        size_t home = (size_t)ix->hashes[j] & mask;
        /* j's entry may move to i unless its home lies in (i, j]. */
        bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (stays)
            continue;
        ix->hashes[i] = ix->hashes[j];
        ix->values[i] = ix->values[j];
        i = j;
    }
    ix->hashes[i] = 0;
    ix->n--;
}
