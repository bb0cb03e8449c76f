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
#include <unistd.h>

#include "emlio_internal.h"

#ifdef EMLIO_HAVE_URING
#    include <liburing.h>
#endif

#define S_DEFAULT_DEPTH 32u

/* One staged read and its result. */
typedef struct s_staged {
    emlio__io_req_t req;
    uint8_t *buf;
    size_t got;
    int rc;     /* 0 done, < 0 failed */
    bool taken; /* handed out (or dropped) */
} s_staged_t;

struct emlio__ioengine {
    unsigned depth;
    bool uring;
#ifdef EMLIO_HAVE_URING
    struct io_uring ring;
#endif
    s_staged_t *staged;
    size_t n, cap;
    size_t next_take; /* readers take in order: where to look first */
};

static struct {
    atomic_uint_fast64_t reads, bytes, taken, errors;
} s_count;

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
    uint64_t total = s_read_field("/proc/meminfo", "MemTotal:") * 1024;
    uint64_t cg = s_cgroup_limit();
    if (cg && (!total || cg < total)) {
        if (why)
            *why = "memory cgroup limit";
        return cg;
    }
    if (why)
        *why = "MemTotal";
    return total;
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

int
emlio__io_pread_full(int fd, uint64_t offset, size_t len, uint8_t *buf)
{
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, buf + got, len - got, (off_t)(offset + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -ESTALE;
        got += (size_t)r;
    }
    return 0;
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

void
emlio__ioengine_drop(emlio__ioengine_t *eng)
{
    for (size_t i = 0; i < eng->n; i++)
        if (!eng->staged[i].taken)
            emlio_free(eng->staged[i].buf);
    eng->n = 0;
    eng->next_take = 0;
}

#ifdef EMLIO_HAVE_URING
/* Queues what is left of staged read i. */
static bool
s_uring_queue(emlio__ioengine_t *eng, size_t i)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&eng->ring);
    if (!sqe)
        return false;
    s_staged_t *s = &eng->staged[i];
    io_uring_prep_read(sqe, s->req.fd, s->buf + s->got,
                       (unsigned)(s->req.len - s->got), s->req.offset + s->got);
    io_uring_sqe_set_data64(sqe, i);
    return true;
}

/* Runs every staged read through the ring, depth in flight; a short read
 * goes back in for the rest, a read of 0 bytes means the file ended. */
static int
s_uring_run(emlio__ioengine_t *eng)
{
    size_t next = 0, inflight = 0;
    while (next < eng->n || inflight) {
        while (next < eng->n && inflight < eng->depth) {
            if (eng->staged[next].rc < 0 ||
                eng->staged[next].got == eng->staged[next].req.len) {
                next++;
                continue;
            }
            if (!s_uring_queue(eng, next))
                break;
            next++, inflight++;
        }
        if (!inflight)
            break;
        int rc = io_uring_submit_and_wait(&eng->ring, 1);
        if (rc < 0 && rc != -EINTR)
            return rc;
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&eng->ring, head, cqe)
        {
            seen++;
            inflight--;
            s_staged_t *s = &eng->staged[io_uring_cqe_get_data64(cqe)];
            if (cqe->res == -EINTR || cqe->res == -EAGAIN) {
                /* again, below */
            } else if (cqe->res < 0) {
                s->rc = cqe->res;
            } else if (cqe->res == 0) {
                s->rc = -ESTALE;
            } else {
                s->got += (size_t)cqe->res;
            }
            if (s->rc == 0 && s->got < s->req.len &&
                s_uring_queue(eng, (size_t)(s - eng->staged)))
                inflight++;
        }
        io_uring_cq_advance(&eng->ring, seen);
    }
    return 0;
}
#endif

void
emlio__ioengine_stage(emlio__ioengine_t *eng, const emlio__io_req_t *reqs,
                      size_t n)
{
    emlio__ioengine_drop(eng);
    if (n > eng->cap) {
        s_staged_t *grown = emlio_realloc(eng->staged, n * sizeof(*grown));
        if (!grown)
            return; /* nothing staged: readers pread one by one */
        eng->staged = grown;
        eng->cap = n;
    }
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; i++) {
        s_staged_t *s = &eng->staged[eng->n];
        *s = (s_staged_t){ .req = reqs[i] };
        s->buf = emlio_malloc(reqs[i].len ? reqs[i].len : 1);
        if (!s->buf)
            break;
        bytes += reqs[i].len;
        eng->n++;
    }
    atomic_fetch_add_explicit(&s_count.reads, eng->n, memory_order_relaxed);
    atomic_fetch_add_explicit(&s_count.bytes, bytes, memory_order_relaxed);
#ifdef EMLIO_HAVE_URING
    if (eng->uring)
        (void)s_uring_run(eng); /* a ring that fails leaves the rest below */
#endif
    /* pread what the ring did not finish (everything, without a ring). */
    for (size_t i = 0; i < eng->n; i++) {
        s_staged_t *s = &eng->staged[i];
        if (s->rc == 0 && s->got < s->req.len) {
            s->rc = emlio__io_pread_full(s->req.fd, s->req.offset + s->got,
                                         s->req.len - s->got, s->buf + s->got);
            if (s->rc == 0)
                s->got = s->req.len;
        }
    }
    for (size_t i = 0; i < eng->n; i++)
        if (eng->staged[i].rc < 0)
            atomic_fetch_add_explicit(&s_count.errors, 1, memory_order_relaxed);
}

int
emlio__ioengine_take(emlio__ioengine_t *eng, const void *owner, int fd,
                     uint64_t offset, size_t len, uint8_t **buf)
{
    if (!eng)
        return 0;
    for (size_t k = 0; k < eng->n; k++) {
        size_t i = (eng->next_take + k) % eng->n;
        s_staged_t *s = &eng->staged[i];
        if (s->taken || s->req.owner != owner || s->req.fd != fd ||
            s->req.offset != offset || s->req.len != len)
            continue;
        s->taken = true;
        eng->next_take = i + 1;
        if (s->rc < 0) {
            emlio_free(s->buf);
            return s->rc;
        }
        *buf = s->buf;
        atomic_fetch_add_explicit(&s_count.taken, 1, memory_order_relaxed);
        return 1;
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
}

uint64_t
emlio__io_device_read_bytes(void)
{
    return s_read_field("/proc/self/io", "read_bytes:");
}
