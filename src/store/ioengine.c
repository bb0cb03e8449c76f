/* ioengine.c - exact-size record reads: io_uring with a pread fallback.
 * SPDX-License-Identifier: MIT
 * See ioengine.h for why and where it is called from.
 */
#define _GNU_SOURCE
#include "ioengine.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base.h"
#include "iobuf.h"

#ifdef EMLIO_HAVE_URING
#    include <liburing.h>
#endif

#define S_DEFAULT_DEPTH 32u

/* Where a staged read is: waiting for room in the ring (or, without a
 * ring, for its take), with the kernel, finished, or handed out/freed. */
enum { S_QUEUED, S_INFLIGHT, S_DONE, S_GONE };

/* The bytes a request reads: [at, at + span) of its file, of which the
 * caller's begin skew bytes in; done once need = skew + len arrived. */
typedef struct s_span {
    uint64_t at;
    size_t span, skew, need;
} s_span_t;

/* One staged read and its result. */
typedef struct s_staged {
    emlio__io_req_t req;
    s_span_t sp;
    const void *tag; /* whose reads (a job): released together */
    uint8_t *buf;
    size_t got; /* bytes of the span read so far */
    int rc;     /* 0, or < 0 failed */
    int state;
    bool fixed; /* buf lies in the arena this thread's ring registered */
} s_staged_t;

/* Staged reads in the order staged: staged[i] has sequence number
 * base + i (the ring's user data), so entries can leave the front while
 * later ones are with the kernel. */
struct emlio__ioengine {
    unsigned depth;
    bool uring;
    bool fixed;  /* the arena is registered with the ring (iobuf.h) */
    bool broken; /* the ring failed: no more submissions */
#ifdef EMLIO_HAVE_URING
    struct io_uring ring;
#endif
    s_staged_t *staged;
    size_t n, cap;
    uint64_t base;
    size_t next_take;   /* readers take in order: where to look first */
    size_t next_submit; /* first entry that may still be S_QUEUED */
    unsigned inflight;
    size_t pending; /* bytes staged, not taken or released */
};

static struct {
    atomic_uint_fast64_t reads, bytes, taken, errors, ahead, direct, wait_ns;
    atomic_uint_fast64_t fixed; /* reads into registered buffers */
    atomic_int fixed_errno;     /* why a ring could not register them */
} s_count;

/* Counts time a reader spent waiting for the device since t0. */
static void
s_waited(uint64_t t0)
{
    atomic_fetch_add_explicit(&s_count.wait_ns, emlio__now_ns() - t0,
                              memory_order_relaxed);
}

int
emlio__io_mode_parse(const char *text)
{
    if (!text || !strcmp(text, "auto"))
        return EMLIO__IO_AUTO;
    if (!strcmp(text, "map"))
        return EMLIO__IO_MAP;
    if (!strcmp(text, "read"))
        return EMLIO__IO_READ;
    return -1;
}

/* The first number in a small file, or 0 (also for "max"). */
static uint64_t
s_read_u64(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return (uint64_t)v;
}

/* The number after `key` on its line of a "Key: N" file (/proc/meminfo,
 * /proc/self/io), or 0. */
static uint64_t
s_read_field(const char *path, const char *key)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    char line[256];
    size_t klen = strlen(key);
    unsigned long long v = 0;
    while (fgets(line, sizeof(line), f))
        if (!strncmp(line, key, klen) && sscanf(line + klen, " %llu", &v) == 1)
            break;
    fclose(f);
    return (uint64_t)v;
}

/* The limit of this process's memory cgroup: v2 ("0::/path") memory.max,
 * else v1 ("N:memory:/path") memory.limit_in_bytes; 0 when none. */
static uint64_t
s_cgroup_limit(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f)
        return 0;
    char line[4096], path[4200];
    uint64_t limit = 0;
    while (!limit && fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = 0;
        char *p = strchr(line, ':');
        char *q = p ? strchr(p + 1, ':') : NULL;
        if (!q)
            continue;
        *q = 0;
        const char *ctrl = p + 1, *cg = q + 1;
        if (!strcmp(line, "0") && !*ctrl) {
            snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", cg);
            limit = s_read_u64(path);
        } else if (strstr(ctrl, "memory")) {
            snprintf(path, sizeof(path),
                     "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", cg);
            limit = s_read_u64(path);
            if (limit >= (UINT64_C(1) << 62)) /* v1's "unlimited" */
                limit = 0;
        }
    }
    fclose(f);
    return limit;
}

uint64_t
emlio__io_memory_limit(const char **why)
{
    /* MemAvailable, not MemTotal: memory that other processes pin or use
     * is not ours to cache in (the 20 GB of 24 pinned elsewhere
     * made a 5 GB dataset "fit" and thrash its mappings at 75 MB/s). Our
     * own cached pages are reclaimable, so they count as available and a
     * warm dataset does not push itself out of the decision. */
    uint64_t avail = s_read_field("/proc/meminfo", "MemAvailable:") * 1024;
    const char *bound = "MemAvailable";
    if (!avail) { /* kernels before 3.14 */
        avail = s_read_field("/proc/meminfo", "MemTotal:") * 1024;
        bound = "MemTotal";
    }
    uint64_t cg = s_cgroup_limit();
    if (cg && (!avail || cg < avail)) {
        avail = cg;
        bound = "memory cgroup limit";
    }
    if (why)
        *why = bound;
    return avail;
}

emlio__io_mode_t
emlio__io_choose(emlio__io_mode_t asked, uint64_t bytes, uint64_t limit)
{
    if (asked != EMLIO__IO_AUTO)
        return asked;
    if (!limit)
        return EMLIO__IO_MAP;
    return bytes > limit / 4 * 3 ? EMLIO__IO_READ : EMLIO__IO_MAP;
}

emlio__io_mode_t
emlio__io_rechoose(emlio__io_mode_t now, uint64_t bytes, uint64_t limit)
{
    if (!limit)
        return now;
    if (now == EMLIO__IO_READ)
        return bytes < limit / 5 * 3 ? EMLIO__IO_MAP : EMLIO__IO_READ;
    return emlio__io_choose(EMLIO__IO_AUTO, bytes, limit);
}

unsigned
emlio__io_device_depth(int fd)
{
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
        return S_DEFAULT_DEPTH;
    char path[128];
    /* A partition's queue is its disk's: /sys/dev/block/M:m/../queue. */
    snprintf(path, sizeof(path), "/sys/dev/block/%u:%u/queue/nr_requests",
             major(st.st_dev), minor(st.st_dev));
    uint64_t n = s_read_u64(path);
    if (!n) {
        snprintf(path, sizeof(path),
                 "/sys/dev/block/%u:%u/../queue/nr_requests", major(st.st_dev),
                 minor(st.st_dev));
        n = s_read_u64(path);
    }
    if (!n)
        return S_DEFAULT_DEPTH;
    return (unsigned)EMLIO_MAX(4, EMLIO_MIN(n, 128));
}

static s_span_t
s_span_of(uint64_t offset, size_t len, unsigned align)
{
    if (!align)
        return (s_span_t){ .at = offset, .span = len, .need = len };
    uint64_t a = align;
    uint64_t at = offset / a * a;
    uint64_t end = (offset + len + a - 1) / a * a;
    return (s_span_t){ .at = at,
                       .span = (size_t)(end - at),
                       .skew = (size_t)(offset - at),
                       .need = (size_t)(offset - at) + len };
}

/* Whether a read that has brought got bytes of sp is over: all it needs
 * is there (an aligned read may end short of the span at the file's
 * end), or the file ended before (-ESTALE). 0: read on. */
static int
s_span_check(const s_span_t *sp, size_t got, unsigned align, ssize_t last)
{
    if (got >= sp->need)
        return 1;
    if (last == 0 || (align && got % align))
        return -ESTALE; /* a direct read comes short only at the end */
    return 0;
}

/* Reads what is left of sp into buf by pread, from got on. */
static int
s_pread_span(int fd, const s_span_t *sp, unsigned align, uint8_t *buf,
             size_t got)
{
    for (;;) {
        ssize_t r = pread(fd, buf + got, sp->span - got, (off_t)(sp->at + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        got += (size_t)r;
        int done = s_span_check(sp, got, align, r);
        if (done)
            return done < 0 ? done : 0;
    }
}

/* A buffer for a span: direct reads want a whole, aligned one. A staged
 * read's comes from the arena registered with the rings (iobuf.h); a
 * read now (pread, which registration does not help, and whose buffer may
 * live long: the shared cache's chunks) from the heap. */
static uint8_t *
s_span_buf(const s_span_t *sp, unsigned align, bool staged)
{
    size_t len = align ? EMLIO_MAX(sp->span, EMLIO__IOBUF_ALIGN) : sp->span;
    return staged ? emlio__iobuf_alloc_io(len) : emlio__iobuf_alloc(len);
}

int
emlio__io_read(int fd, uint64_t offset, size_t len, unsigned align,
               uint8_t **buf, const uint8_t **data)
{
    s_span_t sp = s_span_of(offset, len, align);
    uint8_t *b = s_span_buf(&sp, align, false);
    if (!b)
        return EMLIO_ENOMEM;
    uint64_t t0 = emlio__now_ns();
    int rc = len ? s_pread_span(fd, &sp, align, b, 0) : 0;
    s_waited(t0);
    if (rc < 0) {
        emlio__iobuf_free(b);
        return rc;
    }
    *buf = b;
    *data = b + sp.skew;
    return 0;
}

const char *
emlio__io_direct_refusal(void)
{
    const char *e = getenv("EMLIO_IO_DIRECT");
    return e && !strcmp(e, "0") ? "disabled by EMLIO_IO_DIRECT=0" : NULL;
}

/* The logical block size of the device holding fd, or 4096. */
static unsigned
s_block_size(int fd)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return 4096;
    char path[128];
    snprintf(path, sizeof(path),
             "/sys/dev/block/%u:%u/queue/logical_block_size", major(st.st_dev),
             minor(st.st_dev));
    uint64_t n = s_read_u64(path);
    if (!n) {
        snprintf(path, sizeof(path),
                 "/sys/dev/block/%u:%u/../queue/logical_block_size",
                 major(st.st_dev), minor(st.st_dev));
        n = s_read_u64(path);
    }
    /* A power of two the buffers' alignment covers, else the safe one. */
    if (n < 512 || n > EMLIO__IOBUF_ALIGN || (n & (n - 1)))
        return 4096;
    return (unsigned)n;
}

unsigned
emlio__io_direct(int fd)
{
    if (fd < 0 || emlio__io_direct_refusal())
        return 0;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return 0;
    if (!(fl & O_DIRECT) && fcntl(fd, F_SETFL, fl | O_DIRECT) < 0)
        return 0; /* tmpfs and others refuse it here */
    unsigned align = s_block_size(fd);
    /* Some file systems take the flag and fail the reads: try one. */
    uint8_t *probe = emlio__iobuf_alloc(EMLIO__IOBUF_ALIGN);
    ssize_t r = -1;
    if (probe) {
        do
            r = pread(fd, probe, align, 0);
        while (r < 0 && errno == EINTR);
    }
    emlio__iobuf_free(probe);
    if (r < 0) {
        (void)fcntl(fd, F_SETFL, fl & ~O_DIRECT);
        return 0;
    }
    return align;
}

/* ---- the per-thread engine ---------------------------------------- */

static pthread_key_t s_key;
static pthread_once_t s_key_once = PTHREAD_ONCE_INIT;

static bool
s_uring_allowed(void)
{
    const char *e = getenv("EMLIO_IO_URING");
    return !(e && !strcmp(e, "0"));
}

const char *
emlio__io_uring_refusal(void)
{
    if (!s_uring_allowed())
        return "disabled by EMLIO_IO_URING=0";
#ifdef EMLIO_HAVE_URING
    struct io_uring ring;
    if (io_uring_queue_init(1, &ring, 0) != 0)
        return "refused by the kernel (sysctl or seccomp)";
    io_uring_queue_exit(&ring);
    return NULL;
#else
    return "not built in (no liburing)";
#endif
}

static void
s_engine_free(void *p)
{
    emlio__ioengine_t *eng = p;
    if (!eng)
        return;
    emlio__ioengine_drop(eng);
#ifdef EMLIO_HAVE_URING
    if (eng->uring)
        io_uring_queue_exit(&eng->ring);
#endif
    emlio_free(eng->staged);
    emlio_free(eng);
}

static void
s_make_key(void)
{
    (void)pthread_key_create(&s_key, s_engine_free);
}

#ifdef EMLIO_HAVE_URING
/* Registers the buffer arena with eng's ring, if there is one: a direct
 * read into a registered buffer skips pinning its pages and unpinning
 * them at completion, per read (io_uring_prep_read_fixed). Refused (the
 * memlock limit of a user without CAP_IPC_LOCK, an old kernel): reads go
 * as plain reads, and why is kept for the start-up log. */
static void
s_register_arena(emlio__ioengine_t *eng)
{
    void *base;
    size_t len;
    if (!eng->uring || !emlio__io_fixed_allowed() ||
        !emlio__iobuf_arena(&base, &len))
        return;
    struct iovec iov = { .iov_base = base, .iov_len = len };
    int rc = io_uring_register_buffers(&eng->ring, &iov, 1);
    if (rc == 0)
        eng->fixed = true;
    else
        atomic_store(&s_count.fixed_errno, -rc);
}
#endif

bool
emlio__io_fixed_allowed(void)
{
    const char *e = getenv("EMLIO_IO_FIXED");
    return !(e && !strcmp(e, "0"));
}

int
emlio__io_fixed_errno(void)
{
    return atomic_load(&s_count.fixed_errno);
}

const char *
emlio__io_fixed_refusal(void)
{
    static char why[96];
    if (!emlio__io_fixed_allowed())
        return "disabled by EMLIO_IO_FIXED=0";
#ifdef EMLIO_HAVE_URING
    void *base;
    size_t len;
    if (!emlio__iobuf_arena(&base, &len))
        return "no buffer arena";
    struct io_uring ring;
    if (!s_uring_allowed() || io_uring_queue_init(1, &ring, 0) != 0)
        return "no io_uring";
    struct iovec iov = { .iov_base = base, .iov_len = len };
    int rc = io_uring_register_buffers(&ring, &iov, 1);
    io_uring_queue_exit(&ring);
    if (rc == 0)
        return NULL;
    snprintf(why, sizeof(why), "refused by the kernel: %s%s", strerror(-rc),
             rc == -ENOMEM ? " (the memlock limit, RLIMIT_MEMLOCK)" : "");
    return why;
#else
    return "not built in (no liburing)";
#endif
}

emlio__ioengine_t *
emlio__ioengine_thread(unsigned depth)
{
    pthread_once(&s_key_once, s_make_key);
    emlio__ioengine_t *eng = pthread_getspecific(s_key);
    if (eng)
        return eng;
    eng = emlio_calloc(1, sizeof(*eng));
    if (!eng)
        return NULL;
    eng->depth = depth ? depth : S_DEFAULT_DEPTH;
#ifdef EMLIO_HAVE_URING
    if (s_uring_allowed() &&
        io_uring_queue_init(eng->depth, &eng->ring, 0) == 0)
        eng->uring = true;
    s_register_arena(eng);
#endif
    if (pthread_setspecific(s_key, eng) != 0) {
        s_engine_free(eng);
        return NULL;
    }
    return eng;
}

const char *
emlio__ioengine_kind(const emlio__ioengine_t *eng)
{
    return eng && eng->uring ? "io_uring" : "pread";
}

/* Finishes entry s by pread (no ring, or a broken one). */
static void
s_pread_entry(s_staged_t *s)
{
    uint64_t t0 = emlio__now_ns();
    s->rc = s_pread_span(s->req.fd, &s->sp, s->req.align, s->buf, s->got);
    s_waited(t0);
    if (s->rc == 0)
        s->got = s->sp.need;
    else
        atomic_fetch_add_explicit(&s_count.errors, 1, memory_order_relaxed);
    s->state = S_DONE;
}

#ifdef EMLIO_HAVE_URING
/* Hands queued entries to the kernel in staging order, depth in flight. */
static void
s_pump(emlio__ioengine_t *eng)
{
    bool queued = false;
    while (!eng->broken && eng->inflight < eng->depth &&
           eng->next_submit < eng->n) {
        s_staged_t *s = &eng->staged[eng->next_submit];
        if (s->state != S_QUEUED) {
            eng->next_submit++;
            continue;
        }
        struct io_uring_sqe *sqe = io_uring_get_sqe(&eng->ring);
        if (!sqe)
            break;
        unsigned len = (unsigned)(s->sp.span - s->got);
        if (s->fixed)
            io_uring_prep_read_fixed(sqe, s->req.fd, s->buf + s->got, len,
                                     s->sp.at + s->got, 0);
        else
            io_uring_prep_read(sqe, s->req.fd, s->buf + s->got, len,
                               s->sp.at + s->got);
        io_uring_sqe_set_data64(sqe, eng->base + eng->next_submit);
        s->state = S_INFLIGHT;
        eng->inflight++;
        eng->next_submit++;
        queued = true;
    }
    if (queued && io_uring_submit(&eng->ring) < 0)
        eng->broken = true; /* what it holds stays in flight: never freed */
}

/* One completion into its entry: a short read goes back in the queue for
 * the rest, a read of 0 bytes means the file ended. */
static void
s_complete(emlio__ioengine_t *eng, const struct io_uring_cqe *cqe)
{
    uint64_t seq = io_uring_cqe_get_data64(cqe);
    eng->inflight--;
    if (seq < eng->base || seq - eng->base >= eng->n)
        return; /* cannot happen: entries in flight never leave */
    size_t i = (size_t)(seq - eng->base);
    s_staged_t *s = &eng->staged[i];
    int done = 0;
    if (cqe->res == -EINTR || cqe->res == -EAGAIN) {
        /* again, below */
    } else if (cqe->res < 0) {
        s->rc = cqe->res;
    } else {
        s->got += (size_t)cqe->res;
        done = s_span_check(&s->sp, s->got, s->req.align, cqe->res);
        if (done < 0)
            s->rc = done;
    }
    if (s->rc == 0 && !done) {
        s->state = S_QUEUED;
        if (i < eng->next_submit)
            eng->next_submit = i;
        return;
    }
    if (s->rc < 0)
        atomic_fetch_add_explicit(&s_count.errors, 1, memory_order_relaxed);
    s->state = S_DONE;
}

/* Takes the completions there are, without waiting. */
static void
s_reap_ready(emlio__ioengine_t *eng)
{
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&eng->ring, head, cqe)
    {
        seen++;
        s_complete(eng, cqe);
    }
    io_uring_cq_advance(&eng->ring, seen);
}

/* Waits for at least one completion and takes every one there is. */
static void
s_reap(emlio__ioengine_t *eng)
{
    struct io_uring_cqe *cqe;
    int rc;
    uint64_t t0 = emlio__now_ns();
    do
        rc = io_uring_wait_cqe(&eng->ring, &cqe);
    while (rc == -EINTR);
    s_waited(t0);
    if (rc < 0) {
        eng->broken = true;
        return;
    }
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&eng->ring, head, cqe)
    {
        seen++;
        s_complete(eng, cqe);
    }
    io_uring_cq_advance(&eng->ring, seen);
}
#endif

/* Brings entry s to S_DONE: waits for the ring, or reads it now. */
static void
s_finish(emlio__ioengine_t *eng, s_staged_t *s)
{
#ifdef EMLIO_HAVE_URING
    size_t i = (size_t)(s - eng->staged);
    while (eng->uring && !eng->broken && eng->staged[i].state != S_DONE) {
        s_pump(eng);
        if (eng->staged[i].state == S_INFLIGHT ||
            (eng->inflight && eng->staged[i].state == S_QUEUED))
            s_reap(eng);
        else if (eng->staged[i].state == S_QUEUED)
            break; /* the ring has no room and nothing to wait for */
    }
    s = &eng->staged[i];
    if (s->state == S_INFLIGHT) { /* a broken ring still owns the buffer */
        s->buf = NULL;
        s->rc = -EIO;
        s->state = S_DONE;
        atomic_fetch_add_explicit(&s_count.errors, 1, memory_order_relaxed);
        return;
    }
#else
    (void)eng;
#endif
    if (s->state == S_QUEUED)
        s_pread_entry(s);
}

/* Lets go of entry s: its buffer freed, its bytes off the read-ahead. */
static void
s_forget(emlio__ioengine_t *eng, s_staged_t *s)
{
    if (s->state == S_GONE)
        return;
    if (s->state != S_DONE)
        s_finish(eng, s); /* never free what the kernel writes into */
    emlio__iobuf_free(s->buf);
    s->buf = NULL;
    if (s->req.owns_fd && s->req.fd >= 0)
        close(s->req.fd);
    s->state = S_GONE;
    eng->pending -= s->req.len;
}

/* Drops the finished entries at the front, so the table holds only what
 * is staged ahead. */
static void
s_compact(emlio__ioengine_t *eng)
{
    size_t k = 0;
    while (k < eng->n && eng->staged[k].state == S_GONE)
        k++;
    if (!k)
        return;
    memmove(eng->staged, eng->staged + k, (eng->n - k) * sizeof(*eng->staged));
    eng->n -= k;
    eng->base += k;
    eng->next_take = eng->next_take > k ? eng->next_take - k : 0;
    eng->next_submit = eng->next_submit > k ? eng->next_submit - k : 0;
}

void
emlio__ioengine_release(emlio__ioengine_t *eng, const void *tag)
{
    for (size_t i = 0; i < eng->n; i++)
        if (eng->staged[i].tag == tag)
            s_forget(eng, &eng->staged[i]);
    s_compact(eng);
}

void
emlio__ioengine_drop(emlio__ioengine_t *eng)
{
    for (size_t i = 0; i < eng->n; i++)
        s_forget(eng, &eng->staged[i]);
    s_compact(eng);
}

size_t
emlio__ioengine_pending(const emlio__ioengine_t *eng)
{
    return eng ? eng->pending : 0;
}

size_t
emlio__ioengine_stage(emlio__ioengine_t *eng, const void *tag,
                      const emlio__io_req_t *reqs, size_t n)
{
    if (n > eng->cap - eng->n) {
        size_t cap = EMLIO_MAX(eng->n + n, eng->cap * 2);
        s_staged_t *grown =
            emlio_reallocarray(eng->staged, cap, sizeof(*grown));
        if (!grown) { /* nothing staged: readers read one by one */
            for (size_t i = 0; i < n; i++)
                if (reqs[i].owns_fd && reqs[i].fd >= 0)
                    close(reqs[i].fd);
            return 0;
        }
        eng->staged = grown;
        eng->cap = cap;
    }
    size_t queued = 0;
    uint64_t bytes = 0, direct = 0, fixed = 0;
    bool behind = eng->pending > 0;
    for (; queued < n; queued++) {
        s_span_t sp = s_span_of(reqs[queued].offset, reqs[queued].len,
                                reqs[queued].align);
        uint8_t *buf = s_span_buf(&sp, reqs[queued].align, true);
        if (!buf)
            break;
        bool in_arena = eng->fixed && emlio__iobuf_in_arena(buf, sp.span);
        eng->staged[eng->n++] = (s_staged_t){ .req = reqs[queued],
                                              .sp = sp,
                                              .tag = tag,
                                              .buf = buf,
                                              .state = S_QUEUED,
                                              .fixed = in_arena };
        bytes += reqs[queued].len;
        direct += reqs[queued].align != 0;
        fixed += in_arena;
    }
    for (size_t i = queued; i < n; i++) /* not staged: not ours to keep */
        if (reqs[i].owns_fd && reqs[i].fd >= 0)
            close(reqs[i].fd);
    eng->pending += bytes;
    atomic_fetch_add_explicit(&s_count.reads, queued, memory_order_relaxed);
    atomic_fetch_add_explicit(&s_count.bytes, bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&s_count.direct, direct, memory_order_relaxed);
    atomic_fetch_add_explicit(&s_count.fixed, fixed, memory_order_relaxed);
    if (behind)
        atomic_fetch_add_explicit(&s_count.ahead, bytes, memory_order_relaxed);
#ifdef EMLIO_HAVE_URING
    if (eng->uring)
        s_pump(eng); /* without a ring, each is read when taken */
#endif
    return queued;
}

/* A part of a finished staged read (a record of a merged read, a tar
 * member of a staged sample): a reference to the buffer the device read
 * into, not a copy, since the parts of a read go out in the same reply.
 * The read stays for its other parts until its job releases it. */
static int
s_take_part(const s_staged_t *s, uint64_t offset, uint8_t **buf,
            const uint8_t **data)
{
    if (s->rc < 0)
        return s->rc;
    *buf = emlio__iobuf_ref(s->buf);
    *data = s->buf + s->sp.skew + (offset - s->req.offset);
    atomic_fetch_add_explicit(&s_count.taken, 1, memory_order_relaxed);
    return 1;
}

int
emlio__ioengine_take(emlio__ioengine_t *eng, const void *owner, int fd,
                     uint64_t offset, size_t len, uint8_t **buf,
                     const uint8_t **data)
{
    if (!eng)
        return 0;
#ifdef EMLIO_HAVE_URING
    /* Refill the device's queue as reads complete, at every take: the
     * reader checks and sends between takes, and a queue refilled only
     * when it next waits runs dry meanwhile (this VM: 15-25% of the
     * device's rate). */
    if (eng->uring && !eng->broken && eng->inflight) {
        s_reap_ready(eng);
        s_pump(eng);
    }
#endif
    for (size_t k = 0; k < eng->n; k++) {
        size_t i = (eng->next_take + k) % eng->n;
        s_staged_t *s = &eng->staged[i];
        if (s->state == S_GONE || s->req.owner != owner ||
            (fd >= 0 && s->req.fd != fd) || offset < s->req.offset ||
            len > s->req.len || offset - s->req.offset > s->req.len - len)
            continue;
        s_finish(eng, s);
        s = &eng->staged[i];
        if (s->req.offset != offset || s->req.len != len)
            return s_take_part(s, offset, buf, data);
        eng->next_take = i + 1;
        int rc = s->rc;
        if (rc == 0) {
            *buf = s->buf;
            *data = s->buf + s->sp.skew;
            s->buf = NULL; /* the caller's now */
            atomic_fetch_add_explicit(&s_count.taken, 1, memory_order_relaxed);
        }
        s_forget(eng, s);
        return rc < 0 ? rc : 1;
    }
    return 0;
}

void
emlio__io_counters(emlio__io_counters_t *out)
{
    out->reads = atomic_load_explicit(&s_count.reads, memory_order_relaxed);
    out->bytes = atomic_load_explicit(&s_count.bytes, memory_order_relaxed);
    out->taken = atomic_load_explicit(&s_count.taken, memory_order_relaxed);
    out->errors = atomic_load_explicit(&s_count.errors, memory_order_relaxed);
    out->ahead = atomic_load_explicit(&s_count.ahead, memory_order_relaxed);
    out->direct = atomic_load_explicit(&s_count.direct, memory_order_relaxed);
    out->wait_ns = atomic_load_explicit(&s_count.wait_ns, memory_order_relaxed);
    out->fixed = atomic_load_explicit(&s_count.fixed, memory_order_relaxed);
}

uint64_t
emlio__io_device_read_bytes(void)
{
    return s_read_field("/proc/self/io", "read_bytes:");
}
