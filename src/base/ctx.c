/* ctx.c - the library context: the ZeroMQ context and the log sink.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <stdatomic.h>

#include <time.h>
#include <zmq.h>

struct emlio_ctx {
    void *zmq;
    emlio_log_fn *log_fn;
    void *log_userdata;
    int log_level;        /* -1 when no sink is installed */
    int io_prefix;        /* its I/O threads' name prefix, 1..S_PREFIXES */
    bool io_prefix_owned; /* no live context shares it (s_take_prefix) */
};

/* The I/O thread name prefixes of the live contexts, one bit each: a
 * process that keeps one context while it creates and destroys thousands
 * more must not hand the kept one's number out again, or its clients would
 * measure another context's threads. Atomic bits rather than a lock, so a
 * fork while another thread creates a context leaves nothing held. */
#define S_PREFIXES 9999 /* "9999/ZMQbg/IO/1" fills a thread name */
static atomic_uint s_prefix_used[(S_PREFIXES + 31) / 32]; /* lock-free */
static atomic_uint s_prefix_next;

/* A free prefix, marked used (*owned); where all S_PREFIXES are live, the
 * next in turn, shared (not owned: destroying this context frees none). */
static int
s_take_prefix(bool *owned)
{
    unsigned start = atomic_fetch_add(&s_prefix_next, 1) % S_PREFIXES;
    for (unsigned k = 0; k < S_PREFIXES; k++) {
        unsigned i = (start + k) % S_PREFIXES;
        unsigned bit = 1u << (i % 32);
        if (!(atomic_fetch_or(&s_prefix_used[i / 32], bit) & bit)) {
            *owned = true;
            return (int)i + 1;
        }
    }
    *owned = false;
    return (int)start + 1;
}

static void
s_give_prefix(int prefix)
{
    unsigned i = (unsigned)prefix - 1;
    atomic_fetch_and(&s_prefix_used[i / 32], ~(1u << (i % 32)));
}

emlio_ctx_t *
emlio_ctx_new(void)
{
    emlio_ctx_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->zmq = zmq_ctx_new();
    if (!self->zmq) {
        emlio_free(self);
        return NULL;
    }
    zmq_ctx_set(self->zmq, ZMQ_IO_THREADS, EMLIO__CTX_IO_THREADS);
    /* A number of its own in the I/O threads' names ("<n>/ZMQbg/IO/<i>",
     * 15 characters at most), so that a client can find and measure its
     * own threads among other contexts' (iolanes.h). */
    self->io_prefix = s_take_prefix(&self->io_prefix_owned);
    if (zmq_ctx_set(self->zmq, ZMQ_THREAD_NAME_PREFIX, self->io_prefix) != 0) {
        /* A libzmq without the option: the threads cannot be told from
         * other contexts', so clients use them all (iolanes.h). */
        if (self->io_prefix_owned)
            s_give_prefix(self->io_prefix);
        self->io_prefix = 0;
        self->io_prefix_owned = false;
    }
    self->log_level = -1;
    return self;
}

int
emlio__ctx_io_prefix(const emlio_ctx_t *ctx)
{
    return ctx->io_prefix;
}

void
emlio_ctx_destroy(emlio_ctx_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio_ctx_t *self = *self_p;
    while (zmq_ctx_term(self->zmq) != 0 && errno == EINTR)
        ;
    /* Its I/O threads are gone: the number may name another's. */
    if (self->io_prefix_owned)
        s_give_prefix(self->io_prefix);
    emlio_free(self);
    *self_p = NULL;
}

void
emlio_ctx_set_log(emlio_ctx_t *self, emlio_log_fn *fn, void *userdata,
                  int max_level)
{
    assert(self);
    self->log_fn = fn;
    self->log_userdata = userdata;
    self->log_level = fn ? max_level : -1;
}

int
emlio_ctx_log_level(const emlio_ctx_t *ctx)
{
    return ctx ? ctx->log_level : -1;
}

void
emlio_ctx_log(const emlio_ctx_t *ctx, int level, const char *module,
              const char *fmt, ...)
{
    if (!ctx || !ctx->log_fn || level > ctx->log_level)
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    ctx->log_fn(ctx->log_userdata, level, module, msg);
}

void
emlio__zmq_drain(void *sock)
{
    int more = 1;
    size_t len = sizeof(more);
    while (zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &len) == 0 && more) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        zmq_msg_recv(&part, sock, 0);
        zmq_msg_close(&part);
    }
}

void *
emlio__ctx_zmq(const emlio_ctx_t *ctx)
{
    return ctx->zmq;
}

uint64_t
emlio__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

double
emlio__now_s(void)
{
    return (double)emlio__now_ns() / 1e9;
}

uint64_t
emlio__unique_id(void)
{
    static atomic_uint_fast64_t next;
    return atomic_fetch_add(&next, 1) + 1;
}
