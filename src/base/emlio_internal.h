/* emlio_internal.h - the first include of every libemlio source file.
 * Feature macros, system headers, banned functions and small internal helpers.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_INTERNAL_H
#define EMLIO_INTERNAL_H

#ifndef _GNU_SOURCE
#    define _GNU_SOURCE /* madvise flags, pipe2, memmem */
#endif

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "emlio.h"

#include "banned.h"

#define EMLIO_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define EMLIO_MIN(a, b)     ((a) < (b) ? (a) : (b))
#define EMLIO_MAX(a, b)     ((a) > (b) ? (a) : (b))

#if defined(__GNUC__)
#    define EMLIO_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#    define EMLIO_UNUSED            __attribute__((unused))
#else
#    define EMLIO_PRINTF(fmt, args)
#    define EMLIO_UNUSED
#endif

/* Every allocation goes through these so sizes are overflow-checked in one
 * place. They return NULL on failure; callers turn that into EMLIO_ENOMEM. */
void *emlio_malloc(size_t len);
/* posix_memalign under the same fault injection; freed with emlio_free. */
void *emlio__aligned_alloc(size_t align, size_t len);
void *emlio_calloc(size_t n, size_t size);
void *emlio_realloc(void *ptr, size_t len);
/* realloc(ptr, n * size), failing instead of overflowing. */
void *emlio_reallocarray(void *ptr, size_t n, size_t size);
/* Makes room for element n in the array *array_p of *cap elements of size
 * bytes (git's ALLOC_GROW): when n is past the end, the capacity doubles,
 * from first for an empty array. array_p is the address of the array's
 * pointer, of any element type. On failure the array and *cap are as they
 * were. Returns 0 or EMLIO_ENOMEM. */
int emlio__grow(void *array_p, size_t *cap, size_t n, size_t size,
                size_t first);

/* Tests only: makes the nth allocation from now (1 = the next) fail once,
 * process-wide; 0 turns it off. emlio__alloc_count says how many
 * allocations were made since, so a sweep knows when it has covered a run
 * (tests/unit/test_faults.c). */
void emlio__alloc_fail_at(long n);
long emlio__alloc_count(void);
char *emlio_strdup(const char *s);
/* A NUL-terminated copy of the len bytes at p, which need not be a string
 * (git's xmemdupz): for names taken from the wire or a file. NULL on
 * failure. */
char *emlio__memdupz(const void *p, size_t len);

/* Size of the per-handle error-message buffers. */
#define EMLIO_ERRMSG_LEN 512

/* Formats into a handle's errmsg buffer and returns rc, so a failure site
 * reads: return emlio__seterr(self->err, EMLIO_EFORMAT, "...", ...); */
int emlio__seterr(char *errbuf, int rc, const char *fmt, ...)
    EMLIO_PRINTF(3, 4);

/* Logging through the context's sink. The macro tests the level first so
 * hot paths pay nothing for arguments when the level is off. */
#define emlio_log(ctx, level, module, ...)                        \
    do {                                                          \
        if ((level) <= emlio_ctx_log_level(ctx))                  \
            emlio_ctx_log((ctx), (level), (module), __VA_ARGS__); \
    } while (0)

/* Writes data[0, len) to path atomically: a temporary file beside it
 * (mode 0644), fsync'ed and renamed over path. Returns 0 or -errno. */
int emlio__write_file_atomic(const char *path, const void *data, size_t len);

/* The advice that follows "cannot write 'P': <strerror>" for a cache file
 * (an index, a file list: losing one costs time at the next start, never
 * data), picked by rc: if_denied where the place is read-only or not ours
 * to write or not there (EROFS, EACCES, EPERM, ENOENT, ENOTDIR), if_full where
 * the file system is full or over quota (ENOSPC, EDQUOT, EFBIG), "" otherwise:
 * no advice is better than a wrong one. */
const char *emlio__write_advice(int rc, const char *if_denied,
                                const char *if_full);

/* Receives and discards the remaining frames of the multipart message
 * being read on sock (a void * so zmq.h stays out of here). */
void emlio__zmq_drain(void *sock);

/* The ZeroMQ context owned by ctx (a void * so zmq.h stays out of here). */
void *emlio__ctx_zmq(const emlio_ctx_t *ctx);

/* The ZeroMQ I/O threads of every library context. Two let a daemon
 * encode and send over several streams in parallel; a client starts on
 * one and takes the second when the first runs full (iolanes.h). On the
 * 2-core machines we target more would only contend. */
#define EMLIO__CTX_IO_THREADS 2

/* The number in ctx's I/O thread names, "<n>/ZMQbg/IO/<i>" (iolanes.h); 0
 * where libzmq could not name them. */
int emlio__ctx_io_prefix(const emlio_ctx_t *ctx);

/* Monotonic clock in nanoseconds and seconds. */
uint64_t emlio__now_ns(void);

/* A number never returned before in this process: names inproc endpoints,
 * which outlive their sockets briefly (ZeroMQ unbinds them
 * asynchronously), so an address-based name could be reused too soon. */
uint64_t emlio__unique_id(void);
double emlio__now_s(void);

#endif /* EMLIO_INTERNAL_H */
