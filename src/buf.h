/* buf.h - a growable byte buffer (git's strbuf lifecycle).
 * SPDX-License-Identifier: MIT
 *
 *   emlio_buf_t b = EMLIO_BUF_INIT;
 *   emlio_buf_add(&b, data, n);
 *   ... b.data, b.len ...
 *   emlio_buf_release(&b);
 */
#ifndef EMLIO_BUF_H
#define EMLIO_BUF_H

#include <stddef.h>
#include <stdint.h>

typedef struct emlio_buf {
    uint8_t *data; /* NULL until the first byte is added */
    size_t len;
    size_t cap;
} emlio_buf_t;

#define EMLIO_BUF_INIT \
    {                  \
        NULL, 0, 0     \
    }

void emlio_buf_init(emlio_buf_t *self);
/* Frees the memory and returns the buffer to EMLIO_BUF_INIT. */
void emlio_buf_release(emlio_buf_t *self);
/* Empties the buffer but keeps its memory for reuse. */
void emlio_buf_clear(emlio_buf_t *self);
/* Makes room for extra more bytes. 0 or EMLIO_ENOMEM. */
int emlio_buf_grow(emlio_buf_t *self, size_t extra);
/* Appends n bytes. 0 or EMLIO_ENOMEM. */
int emlio_buf_add(emlio_buf_t *self, const void *data, size_t n);
/* Appends printf-style text (not NUL-counted in len). 0 or EMLIO_ENOMEM. */
int emlio_buf_addf(emlio_buf_t *self, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Hands the memory to the caller (who frees it with emlio_free) and resets
 * the buffer; *len_out receives the length when not NULL. */
uint8_t *emlio_buf_detach(emlio_buf_t *self, size_t *len_out);

#endif /* EMLIO_BUF_H */
