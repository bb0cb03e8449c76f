/* ioengine.h - reading records from the device the way it wants to be read.
 * SPDX-License-Identifier: MIT
 *
 * A dataset that fits in the memory the daemon may use is served from its
 * mappings (zero-copy frames of the page cache). One that does not must not
 * be: a 110 KB record touched through a mapping in random order pulls
 * readahead around it, and under memory pressure those pages are evicted
 * before they are sent, so every byte was read from the device 16-64 times
 * (issue 30). In "read" mode a mapped shard's records are read instead with
 * exact-size reads into private buffers, readahead off (POSIX_FADV_RANDOM),
 * and a reader submits all the records of one GET at once so the device
 * sees a queue of them, not one read per thread:
 *
 *   reader (server_pipeline.c)                         this module
 *     emlio__ioengine_stage(reqs of one GET) ----> io_uring (or pread)
 *     format read op -> emlio__shard_pread ----> emlio__ioengine_take()
 *                                                  (the staged buffer, or
 *                                                   a plain pread)
 *
 * An engine belongs to one thread (a ring is not shared); emlio__ioengine_
 * thread() gives the calling thread its own, made on first use. io_uring is
 * used where liburing was built in and the kernel allows it; otherwise, or
 * with EMLIO_IO_URING=0 in the environment (what `make test` uses to run
 * the fallback), reads go through pread, with one log line saying why.
 */
#ifndef EMLIO_IOENGINE_H
#define EMLIO_IOENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How mapped shards are read: emliod --io. */
typedef enum emlio__io_mode {
    EMLIO__IO_AUTO = 0, /* map when the dataset fits the memory, else read */
    EMLIO__IO_MAP,      /* zero-copy from the mappings */
    EMLIO__IO_READ,     /* exact-size reads through the engine */
} emlio__io_mode_t;

/* Parses "auto", "map" or "read"; -1 for anything else. */
int emlio__io_mode_parse(const char *text);

/* The memory this process may fill with page cache: the lowest of the
 * machine's MemTotal and the memory cgroup's limit (v2 memory.max or v1
 * memory.limit_in_bytes of this process's cgroup). *why names the bound. */
uint64_t emlio__io_memory_limit(const char **why);

/* What auto decides for a dataset of `bytes` under `limit`: read when the
 * dataset would take more than 3/4 of the memory. */
emlio__io_mode_t emlio__io_choose(emlio__io_mode_t asked, uint64_t bytes,
                                  uint64_t limit);

/* The queue depth for reads of the device holding fd: its
 * queue/nr_requests in sysfs, capped to [4, 128]; 32 when unknown. */
unsigned emlio__io_device_depth(int fd);

/* One read: len bytes of fd at offset. */
typedef struct emlio__io_req {
    const void *owner; /* whose read (a shard): a reused fd never matches */
    int fd;
    uint64_t offset;
    size_t len;
} emlio__io_req_t;

typedef struct emlio__ioengine emlio__ioengine_t;

/* The calling thread's engine (made on first use with `depth` entries, 0:
 * 32; freed when the thread exits). NULL only when out of memory. */
emlio__ioengine_t *emlio__ioengine_thread(unsigned depth);
/* Why engines read with pread ("disabled by EMLIO_IO_URING=0", "refused by
 * the kernel ...", "not built in ..."), or NULL when they use io_uring:
 * a probe that keeps no ring, for the daemon's start-up log. */
const char *emlio__io_uring_refusal(void);
/* "io_uring" or "pread". */
const char *emlio__ioengine_kind(const emlio__ioengine_t *eng);

/* Reads every request into its own buffer, depth at a time, and keeps the
 * results until taken or the next stage (which frees what was not taken).
 * A request that fails keeps its error for emlio__ioengine_take. */
void emlio__ioengine_stage(emlio__ioengine_t *eng, const emlio__io_req_t *reqs,
                           size_t n);
/* The staged buffer of exactly (owner, fd, offset, len), handed to the
 * caller (emlio_free it): 1 with *buf set, 0 when nothing staged matches
 * (or eng is NULL), or the
 * staged read's error: -EIO, or -ESTALE when the file ended before len. */
int emlio__ioengine_take(emlio__ioengine_t *eng, const void *owner, int fd,
                         uint64_t offset, size_t len, uint8_t **buf);
/* Frees every staged buffer not taken. */
void emlio__ioengine_drop(emlio__ioengine_t *eng);

/* Reads len bytes of fd at offset into buf by pread, to the end: 0, -EIO
 * (or another -errno), or -ESTALE when the file is shorter. */
int emlio__io_pread_full(int fd, uint64_t offset, size_t len, uint8_t *buf);

/* Counters of every engine in the process since start (relaxed atomics). */
typedef struct emlio__io_counters {
    uint64_t reads;  /* requests staged */
    uint64_t bytes;  /* bytes they asked for */
    uint64_t taken;  /* staged buffers handed to readers */
    uint64_t errors; /* reads that failed or came short */
} emlio__io_counters_t;

void emlio__io_counters(emlio__io_counters_t *out);

/* This process's bytes read from the block layer (/proc/self/io
 * read_bytes: page-cache misses, through mappings or reads): 0 unknown. */
uint64_t emlio__io_device_read_bytes(void);

#endif /* EMLIO_IOENGINE_H */
