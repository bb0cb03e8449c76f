/* buf.c - a growable byte buffer.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "buf.h"

void
emlio_buf_init(emlio_buf_t *self)
{
    self->data = NULL;
    self->len = 0;
    self->cap = 0;
}

void
emlio_buf_release(emlio_buf_t *self)
{
    emlio_free(self->data);
    emlio_buf_init(self);
}

void
emlio_buf_clear(emlio_buf_t *self)
{
    self->len = 0;
}

int
emlio_buf_grow(emlio_buf_t *self, size_t extra)
{
    /* One spare byte so text appended with addf can stay NUL-terminated. */
    if (extra > SIZE_MAX - self->len - 1)
        return EMLIO_ENOMEM;
    size_t need = self->len + extra + 1;
    if (need <= self->cap)
        return 0;
    size_t cap = self->cap ? self->cap : 64;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *data = emlio_realloc(self->data, cap);
    if (!data)
        return EMLIO_ENOMEM;
    self->data = data;
    self->cap = cap;
    return 0;
}

int
emlio_buf_add(emlio_buf_t *self, const void *data, size_t n)
{
    int rc = emlio_buf_grow(self, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(self->data + self->len, data, n);
    self->len += n;
    self->data[self->len] = 0;
    return 0;
}

int
emlio_buf_addf(emlio_buf_t *self, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return EMLIO_EINVAL;
    int rc = emlio_buf_grow(self, (size_t)n);
    if (rc < 0)
        return rc;
    va_start(ap, fmt);
    vsnprintf((char *)self->data + self->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    self->len += (size_t)n;
    return 0;
}

uint8_t *
emlio_buf_detach(emlio_buf_t *self, size_t *len_out)
{
    uint8_t *data = self->data;
    if (len_out)
        *len_out = self->len;
    emlio_buf_init(self);
    return data;
}
