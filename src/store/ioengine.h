/* ioengine.h - reading records from the device the way it wants to be read.
 * SPDX-License-Identifier: MIT
 *
 * A dataset that fits in the memory the daemon may use is served from its
 * mappings (zero-copy frames of the page cache). One that does not must not
 * be: a 110 KB record touched through a mapping in random order pulls
 * readahead around it, and under memory pressure those pages are evicted
 * before they are sent, so every byte was read from the device 16-64 times
 * (issue 30). In "read" mode a mapped shard's records are read instead with
 * exact-size reads into pooled buffers (iobuf.h), readahead off
 * (POSIX_FADV_RANDOM), and a reader submits all the records of its GET,
 * and of the GETs queued behind it up to --read-ahead-bytes, at once, so
 * the device sees a queue of them in the order they will be sent, not one
 * read per thread:
 *
 *   reader (server_pipeline.c)                         this module
 *     emlio__ioengine_stage(GET, and the next) ----> io_uring (or pread)
 *     format read op -> ctx->pread (shard set) -> emlio__ioengine_take()
 *                                                  (the staged buffer,
 *                                                   or a plain pread)
 *     emlio__ioengine_release(GET)       (what it staged and did not take)
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

/* The memory this process may fill with page cache now: the lower of
 * the machine's MemAvailable (MemTotal on kernels without it) and the
 * memory cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes of
 * this process's cgroup). *why names the bound. It changes while the
 * daemon runs (other processes, a cgroup limit written), so --io auto
 * asks again (emlio__io_rechoose). */
uint64_t emlio__io_memory_limit(const char **why);

/* What auto decides at start for a dataset of `bytes` under `limit`: read
 * when the dataset would take more than 3/4 of the memory; asked modes
 * are kept. */
emlio__io_mode_t emlio__io_choose(emlio__io_mode_t asked, uint64_t bytes,
                                  uint64_t limit);

/* What auto decides at a later look, `now` being MAP or READ: mapped
 * goes to read above 3/4 of the memory, as at start; read goes back to
 * the mappings only below 3/5. The gap keeps a limit near the line from
 * switching the engine at every look. A limit of 0 (unknown) keeps now. */
emlio__io_mode_t emlio__io_rechoose(emlio__io_mode_t now, uint64_t bytes,
                                    uint64_t limit);

/* The queue depth for reads of the device holding fd: its
 * queue/nr_requests in sysfs, capped to [4, 128]; 32 when unknown. */
unsigned emlio__io_device_depth(int fd);

/* One read: len bytes of fd at offset. With align (fd opened O_DIRECT,
 * see emlio__io_direct) the device reads the aligned blocks around them
 * straight into the buffer, past the page cache, and the bytes asked for
 * start `offset % align` into it. */
typedef struct emlio__io_req {
    const void *owner; /* whose read (a shard): a reused fd never matches */
    int fd;
    uint64_t offset;
    size_t len;
    unsigned align; /* 0: buffered, exact */
    bool owns_fd;   /* the engine closes fd once the read is let go (a
                       file opened for this one read: an ImageFolder's) */
} emlio__io_req_t;

/* Makes fd read past the page cache (O_DIRECT) if its file system lets
 * it: returns the alignment its reads need (the device's logical block
 * size, 4096 when unknown), or 0 when fd stays buffered (no direct I/O
 * there, or EMLIO_IO_DIRECT=0 in the environment). A dataset larger than
 * memory gains nothing from the page cache but the cost of filling and
 * reclaiming it: a copy of every byte and the memory cgroup's reclaim,
 * which held buffered random reads here to ~60% of what the device
 * delivers (issue 30). */
unsigned emlio__io_direct(int fd);
/* Why reads stay buffered with EMLIO_IO_DIRECT=0, else NULL. */
const char *emlio__io_direct_refusal(void);

/* One read now, not staged: len bytes of fd at offset (aligned as
 * emlio__io_req_t says) into a fresh buffer *buf (emlio__iobuf_free it),
 * *data pointing at offset's byte. 0, -ESTALE when the file is shorter,
 * EMLIO_ENOMEM, or another -errno. */
int emlio__io_read(int fd, uint64_t offset, size_t len, unsigned align,
                   uint8_t **buf, const uint8_t **data);

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

/* Queues the reads of reqs for tag (a job: whose reads they are, released
 * together) behind those staged before, each into its own buffer
 * (iobuf.h), and hands them to the device at once: io_uring keeps depth
 * in flight and submits the rest as earlier ones complete, so a reader
 * that stages the next job before working on this one keeps the device
 * busy meanwhile. Without io_uring each is read by pread when taken.
 * Returns how many were staged (the first ones; fewer only when out of
 * memory). A read that fails keeps its error for emlio__ioengine_take. */
size_t emlio__ioengine_stage(emlio__ioengine_t *eng, const void *tag,
                             const emlio__io_req_t *reqs, size_t n);
/* The staged buffer of exactly (owner, fd, offset, len) (fd -1: any), waiting
 * for its read if it is still with the device, handed to the caller (free it
 * with emlio__iobuf_free), *data at offset's byte inside it (not at its start
 * for an aligned read); or a copy of that range out of a staged read that
 * holds it (a tar member of a staged sample; the read stays staged for
 * the rest): 1 with *buf set, 0 when nothing staged holds it (or
 * eng is NULL), or the read's error: -EIO (or another -errno), or -ESTALE
 * when the file ended before len. */
int emlio__ioengine_take(emlio__ioengine_t *eng, const void *owner, int fd,
                         uint64_t offset, size_t len, uint8_t **buf,
                         const uint8_t **data);
/* Frees tag's staged reads not taken, waiting for those the device still
 * writes into. */
void emlio__ioengine_release(emlio__ioengine_t *eng, const void *tag);
/* emlio__ioengine_release of every tag. */
void emlio__ioengine_drop(emlio__ioengine_t *eng);
/* Bytes staged and neither taken nor released: the read-ahead held now
 * (0 for NULL). */
size_t emlio__ioengine_pending(const emlio__ioengine_t *eng);

/* Counters of every engine in the process since start (relaxed atomics). */
typedef struct emlio__io_counters {
    uint64_t reads;   /* requests staged */
    uint64_t bytes;   /* bytes they asked for */
    uint64_t taken;   /* staged buffers handed to readers */
    uint64_t errors;  /* reads that failed or came short */
    uint64_t ahead;   /* bytes staged while earlier reads were pending:
                         read ahead of the request being served */
    uint64_t direct;  /* requests read past the page cache (O_DIRECT) */
    uint64_t wait_ns; /* time readers spent waiting for the device: for a
                         staged read still in flight, or a read now */
    uint64_t fixed;   /* reads submitted into registered buffers (the
                         arena, iobuf.h) */
} emlio__io_counters_t;

void emlio__io_counters(emlio__io_counters_t *out);
/* Whether reads may go into registered buffers: not with EMLIO_IO_FIXED=0. */
bool emlio__io_fixed_allowed(void);
/* Why a ring could not register the buffer arena (an errno: ENOMEM is the
 * memlock limit), or 0 where every ring that tried did. */
int emlio__io_fixed_errno(void);
/* Why reads cannot go into registered buffers ("disabled by
 * EMLIO_IO_FIXED=0", "no buffer arena", "refused by the kernel: ..."), or
 * NULL when a ring registers the arena (tried on a ring of its own; call
 * once, at start: it pins the arena's pages for the try). */
const char *emlio__io_fixed_refusal(void);

/* This process's bytes read from the block layer (/proc/self/io
 * read_bytes: page-cache misses, through mappings or reads): 0 unknown. */
uint64_t emlio__io_device_read_bytes(void);

#endif /* EMLIO_IOENGINE_H */
