/* alloc.c - the allocation wrappers every module uses.
 * Sizes are overflow-checked here once, so callers need not repeat it.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

void *
emlio_malloc(size_t len)
{
    return malloc(len ? len : 1);
}

void *
emlio_calloc(size_t n, size_t size)
{
    if (n == 0 || size == 0)
        return calloc(1, 1);
    return calloc(n, size); /* calloc checks n * size itself */
}

void *
emlio_realloc(void *ptr, size_t len)
{
    return realloc(ptr, len ? len : 1);
}

void *
emlio_reallocarray(void *ptr, size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return emlio_realloc(ptr, n * size);
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
