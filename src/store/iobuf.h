/* iobuf.h - reused buffers for the records a daemon reads from the device.
 * SPDX-License-Identifier: MIT
 *
 * A record read with an exact-size read (ioengine.h) needs a buffer of its
 * own until its frame is sent. A fresh malloc of 110 KB on these VMs is
 * fresh pages, and faulting in a page costs ~16 us: 28 faults, ~450 us, for
 * a record the disk delivers in ~70 us. So buffers come from a pool of ones
 * already touched, in size classes four to a power of two (at most 19%
 * larger than asked), page-aligned so the device can read into them
 * directly (O_DIRECT), and go back to it when the frame is freed (on
 * whichever thread that is: ZeroMQ's I/O thread, a reader, the tensor
 * stage). The pool keeps at most its limit idle; what would exceed it is
 * freed. Buffers larger than EMLIO__IOBUF_MAX_POOLED are never kept.
 *
 * Every buffer from emlio__iobuf_alloc must be freed with emlio__iobuf_free
 * (never emlio_free): a buffer carries a small header in front of it, so
 * the two allocators do not mix. Under ASan a mix-up is reported at once.
 * Safe from any thread.
 */
#ifndef EMLIO_IOBUF_H
#define EMLIO_IOBUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMLIO__IOBUF_MAX_POOLED   ((size_t)16 << 20)
/* Buffers of more than 2 KiB start at a multiple of this: what O_DIRECT
 * reads need of their memory on any block device. */
#define EMLIO__IOBUF_ALIGN        ((size_t)4096)
#define EMLIO__IOBUF_DEFAULT_IDLE ((size_t)64 << 20)

/* A buffer of at least len bytes (a reused one where the pool has one of
 * its class), or NULL when out of memory. */
uint8_t *emlio__iobuf_alloc(size_t len);
/* One more holder of buf (returned): the buffer goes back to the pool at
 * the last emlio__iobuf_free. The records of one merged read are handed
 * out this way, each pointing into the one buffer the device read into,
 * instead of a copy each. Holders only read it. */
uint8_t *emlio__iobuf_ref(uint8_t *buf);
/* Lets go of buf: back to the pool (or to malloc, past the idle limit)
 * once its last holder has let go; NULL is a no-op. */
void emlio__iobuf_free(void *buf);
/* How many idle bytes the pool may keep (default
 * EMLIO__IOBUF_DEFAULT_IDLE); a lower limit frees the excess now. */
void emlio__iobuf_set_idle_limit(size_t bytes);
/* Frees every idle buffer (daemon shutdown, tests). */
void emlio__iobuf_trim(void);

/* The arena: one region for the buffers the device reads into, which the
 * I/O engine registers with each io_uring once (ioengine.c), so that a
 * direct read into it does not pin and unpin its pages on every read
 * (io_uring's fixed buffers). Its pages stay resident: the daemon sizes it
 * to what it reads ahead. One per process, made before the first ring;
 * never freed. 0, EMLIO_ENOMEM, or EMLIO_EINVAL (there is one already, or
 * bytes is 0). */
int emlio__iobuf_arena_init(size_t bytes);
/* The arena's region; false when there is none. */
bool emlio__iobuf_arena(void **base, size_t *len);
/* Whether [buf, buf + len) lies in the arena. */
bool emlio__iobuf_in_arena(const uint8_t *buf, size_t len);
/* A buffer for a device read: from the arena while it has one of len's
 * class idle or room to carve one, else as emlio__iobuf_alloc. Freed with
 * emlio__iobuf_free like any other: an arena buffer goes back to the
 * arena's own lists, whatever the idle limit. */
uint8_t *emlio__iobuf_alloc_io(size_t len);

typedef struct emlio__iobuf_stats {
    uint64_t allocs;       /* emlio__iobuf_alloc calls that returned a buffer */
    uint64_t reused;       /* of them, served from the pool */
    size_t idle;           /* bytes idle in the pool now (the arena's not) */
    size_t out;            /* bytes handed out and not yet freed */
    size_t arena_bytes;    /* the arena's size; 0: none */
    uint64_t arena_misses; /* device buffers it had no room for */
} emlio__iobuf_stats_t;

void emlio__iobuf_stats(emlio__iobuf_stats_t *out);

#endif /* EMLIO_IOBUF_H */
