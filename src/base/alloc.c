/* alloc.c - the allocation wrappers every module uses.
 * Sizes are overflow-checked here once, so callers need not repeat it.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <stdatomic.h>

/* Fault injection (SQLite's "fail the Nth malloc"). This is the one piece
 * of process-wide mutable state in the library, on purpose: allocations
 * happen where no context is at hand, and only tests set it. */
static atomic_long s_fail_countdown; /* 0: off; 1: the next one fails */
static atomic_long s_fail_seen;      /* allocations since it was armed */

char *
emlio__memdupz(const void *p, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *copy = emlio_malloc(len + 1);
    if (!copy)
        return NULL;
    if (len)
        memcpy(copy, p, len);
    copy[len] = '\0';
    return copy;
}

void
emlio__alloc_fail_at(long n)
{
    atomic_store(&s_fail_seen, 0);
    atomic_store(&s_fail_countdown, n > 0 ? n : 0);
}

long
emlio__alloc_count(void)
{
    return atomic_load(&s_fail_seen);
}

static bool
s_fail(void)
{
    atomic_fetch_add(&s_fail_seen, 1);
    long left = atomic_load(&s_fail_countdown);
    while (left > 0 &&
           !atomic_compare_exchange_weak(&s_fail_countdown, &left, left - 1))
        ;
    return left == 1;
}

void *
emlio_malloc(size_t len)
{
    if (s_fail())
        return NULL;
    return malloc(len ? len : 1);
}

void *
emlio__aligned_alloc(size_t align, size_t len)
{
    if (s_fail())
        return NULL;
    void *p = NULL;
    return posix_memalign(&p, align, len ? len : 1) == 0 ? p : NULL;
}

void *
emlio_calloc(size_t n, size_t size)
{
    if (s_fail())
        return NULL;
    if (n == 0 || size == 0)
        return calloc(1, 1);
    return calloc(n, size); /* calloc checks n * size itself */
}

void *
emlio_realloc(void *ptr, size_t len)
{
    if (s_fail())
        return NULL;
    return realloc(ptr, len ? len : 1);
}

void *
emlio_reallocarray(void *ptr, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return emlio_realloc(ptr, n * size);
}

int
emlio__grow(void *array_p, size_t *cap, size_t n, size_t size, size_t first)
{
    if (n < *cap)
        return 0;
    size_t want = *cap ? *cap * 2 : first;
    if (want <= n)
        want = n + 1;
    /* The pointer is copied in and out as bytes: it may be an int * or a
     * struct's, which a void ** must not be used to write. */
    void *array;
    memcpy(&array, array_p, sizeof(array));
    void *grown = emlio_reallocarray(array, want, size);
    if (!grown)
        return EMLIO_ENOMEM;
    memcpy(array_p, &grown, sizeof(grown));
    *cap = want;
    return 0;
}

char *
emlio_strdup(const char *s)
{
    size_t len = strlen(s) + 1;
    char *copy = emlio_malloc(len);
    if (copy)
        memcpy(copy, s, len);
    return copy;
}

void
emlio_free(void *ptr)
{
    free(ptr);
}
