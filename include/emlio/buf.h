/* emlio/buf.h - a growable byte buffer (git's strbuf lifecycle), the output
 * type of the writers (emlio_example_build, emlio_tfrecord_append).
 * SPDX-License-Identifier: MIT
 *
 * Example:
 *   emlio_buf_t b = EMLIO_BUF_INIT;
 *   if (emlio_buf_addf(&b, "%d records", 3) < 0)
 *       die("out of memory");
 *   consume(b.data, b.len);
 *   emlio_buf_release(&b);
 *
 * A buffer is a plain value: used by one thread at a time.
 */
#ifndef EMLIO_BUF_H
#define EMLIO_BUF_H

#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct emlio_buf {
    uint8_t *data; /* NULL until the first byte is added */
    size_t len;
    size_t cap;
} emlio_buf_t;

#define EMLIO_BUF_INIT \
    {                  \
        NULL, 0, 0     \
    }

/* Sets the buffer to EMLIO_BUF_INIT. */
EMLIO_EXPORT void emlio_buf_init(emlio_buf_t *self);

/* Frees the memory and returns the buffer to EMLIO_BUF_INIT. */
EMLIO_EXPORT void emlio_buf_release(emlio_buf_t *self);

/* Empties the buffer but keeps its memory for reuse. */
EMLIO_EXPORT void emlio_buf_clear(emlio_buf_t *self);

/* Makes room for extra more bytes. 0 or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_buf_grow(emlio_buf_t *self, size_t extra);

/* Appends n bytes. 0 or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_buf_add(emlio_buf_t *self, const void *data, size_t n);

/* Appends printf-style text (a NUL follows it in memory but is not counted
 * in len). 0 or EMLIO_ENOMEM. */
EMLIO_EXPORT int emlio_buf_addf(emlio_buf_t *self, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Hands the memory to the caller, who frees it with emlio_free, and resets
 * the buffer; *len_out receives the length when not NULL. */
EMLIO_EXPORT uint8_t *emlio_buf_detach(emlio_buf_t *self, size_t *len_out);

/* Frees memory the library handed over (emlio_buf_detach). Accepts NULL. */
EMLIO_EXPORT void emlio_free(void *ptr);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_BUF_H */
