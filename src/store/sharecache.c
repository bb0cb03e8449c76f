/* sharecache.c - chunks of shards read once and copied out to every job.
 * SPDX-License-Identifier: MIT
 * See sharecache.h for what it is for.
 */
#include "base.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include "iobuf.h"
#include "ioengine.h"
#include "sharecache.h"

/* Readers a chunk keeps count of; and those the cache remembers as
 * active (a job that read in the last S_ACTIVE_NS). */
#define S_TRACKED   8
#define S_RECENT    32
#define S_ACTIVE_NS ((uint64_t)2000000000)

typedef struct s_chunk {
    const void *owner;
    uint64_t ident;
    uint64_t index;
    uint8_t *buf;        /* emlio__io_read's buffer */
    const uint8_t *data; /* the chunk's first byte inside it */
    size_t len;          /* bytes of the file in the chunk */
    uint64_t loader;     /* the reader that read it */
    /* Who copied how much out of it: each job reads every record once an
     * epoch, so a reader that has copied (about) the chunk's length is
     * done with it. The first S_TRACKED readers are counted. */
    uint64_t reader[S_TRACKED];
    uint64_t got[S_TRACKED];
    unsigned n_readers;
    unsigned pins; /* readers copying from it, or waiting for it */
    bool ready;    /* read; data valid */
    bool hashed;   /* in the table (a failed read leaves it) */
    int err;       /* the read's error, for its waiters */
    struct s_chunk *hnext;
    struct s_chunk *prev, *next; /* recency: most recent after the head */
} s_chunk_t;

struct emlio__share_cache {
    pthread_mutex_t lock;
    pthread_cond_t loaded; /* some chunk's read finished */
    uint64_t capacity;
    uint64_t held; /* bytes reserved by chunks in the table or loading */
    uint64_t peak;
    uint64_t chunks;
    uint64_t evicted;
    emlio__share_tally_t total;
    s_chunk_t **buckets;
    size_t mask;
    s_chunk_t lru; /* sentinel of the recency ring */
    /* Readers seen lately, for how many jobs are sharing now. */
    uint64_t recent[S_RECENT];
    uint64_t recent_ns[S_RECENT];
};

static _Thread_local struct {
    emlio__share_cache_t *cache;
    uint64_t reader;
    emlio__share_tally_t *tally;
} s_scope;

void
emlio__share_scope_set(emlio__share_cache_t *cache, uint64_t reader,
                       emlio__share_tally_t *tally)
{
    s_scope.cache = cache;
    s_scope.reader = reader;
    s_scope.tally = tally;
}

emlio__share_cache_t *
emlio__share_scope(uint64_t *reader, emlio__share_tally_t **tally)
{
    *reader = s_scope.reader;
    *tally = s_scope.tally;
    return s_scope.cache;
}

int
emlio__share_cache_new(emlio__share_cache_t **self_p, uint64_t capacity)
{
    *self_p = NULL;
    emlio__share_cache_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return EMLIO_ENOMEM;
    self->capacity = EMLIO_MAX(capacity, EMLIO__SHARE_MIN);
    size_t want = (size_t)EMLIO_MIN(self->capacity / EMLIO__SHARE_CHUNK * 2,
                                    (uint64_t)1 << 20);
    size_t n = 64;
    while (n < want)
        n <<= 1;
    self->buckets = emlio_calloc(n, sizeof(*self->buckets));
    if (!self->buckets) {
        emlio_free(self);
        return EMLIO_ENOMEM;
    }
    self->mask = n - 1;
    self->lru.prev = self->lru.next = &self->lru;
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->loaded, NULL);
    *self_p = self;
    return 0;
}

static void
s_chunk_free(s_chunk_t *c)
{
    emlio__iobuf_free(c->buf);
    emlio_free(c);
}

void
emlio__share_cache_destroy(emlio__share_cache_t **self_p)
{
    emlio__share_cache_t *self = *self_p;
    if (!self)
        return;
    for (s_chunk_t *c = self->lru.next, *next; c != &self->lru; c = next) {
        next = c->next;
        s_chunk_free(c);
    }
    pthread_cond_destroy(&self->loaded);
    pthread_mutex_destroy(&self->lock);
    emlio_free(self->buckets);
    emlio_free(self);
    *self_p = NULL;
}

static size_t
s_hash(const emlio__share_cache_t *self, const void *owner, uint64_t ident,
       uint64_t index)
{
    uint64_t h = (uint64_t)(uintptr_t)owner * UINT64_C(0x9e3779b97f4a7c15);
    h ^= ident + UINT64_C(0xbf58476d1ce4e5b9) + (h << 6) + (h >> 2);
    h ^= index * UINT64_C(0x94d049bb133111eb);
    return (size_t)(h ^ (h >> 29)) & self->mask;
}

static void
s_unlink_lru(s_chunk_t *c)
{
    c->prev->next = c->next;
    c->next->prev = c->prev;
}

static void
s_push_lru(emlio__share_cache_t *self, s_chunk_t *c)
{
    c->next = self->lru.next;
    c->prev = &self->lru;
    self->lru.next->prev = c;
    self->lru.next = c;
}

static void
s_unhash(emlio__share_cache_t *self, s_chunk_t *c)
{
    if (!c->hashed)
        return;
    s_chunk_t **p = &self->buckets[s_hash(self, c->owner, c->ident, c->index)];
    while (*p != c)
        p = &(*p)->hnext;
    *p = c->hnext;
    c->hashed = false;
}

/* Notes that reader read now; returns how many readers read in the last
 * S_ACTIVE_NS (at least 1). Under the lock. */
static unsigned
s_active_readers(emlio__share_cache_t *self, uint64_t reader)
{
    uint64_t now = emlio__now_ns();
    unsigned n = 0, slot = 0;
    bool seen = false;
    for (unsigned i = 0; i < S_RECENT; i++) {
        if (self->recent[i] == reader) {
            self->recent_ns[i] = now;
            seen = true;
        }
        if (self->recent_ns[i] < self->recent_ns[slot])
            slot = i;
        n += self->recent_ns[i] && now - self->recent_ns[i] < S_ACTIVE_NS;
    }
    if (!seen) {
        n += !(self->recent_ns[slot] &&
               now - self->recent_ns[slot] < S_ACTIVE_NS);
        self->recent[slot] = reader;
        self->recent_ns[slot] = now;
    }
    return EMLIO_MAX(n, 1u);
}

/* Whether every one of `active` jobs has copied (nearly: tar headers'
 * padding is never copied) all of c: no one needs it again this epoch. */
static bool
s_done(const s_chunk_t *c, unsigned active)
{
    unsigned done = 0;
    for (unsigned i = 0; i < c->n_readers && i < S_TRACKED; i++)
        done += c->got[i] >= c->len - c->len / 16;
    return done >= active;
}

static void
s_evict(emlio__share_cache_t *self, s_chunk_t *c)
{
    s_unhash(self, c);
    s_unlink_lru(c);
    self->held -= c->len;
    self->evicted++;
    s_chunk_free(c);
}

/* Lets go of unpinned chunks until need more bytes fit: first those every
 * active job is done with, then the least recent. Evicting by recency
 * alone let go of chunks a job a little behind the others was about to
 * read, while chunks all had finished stayed (three jobs cold read 1.20x
 * the dataset). Returns whether they fit. Under the lock. */
static bool
s_evict_done(emlio__share_cache_t *self, uint64_t need, unsigned active)
{
    s_chunk_t *c = self->lru.prev;
    while (self->held + need > self->capacity && c != &self->lru) {
        s_chunk_t *prev = c->prev;
        if (!c->pins && c->ready && s_done(c, active))
            s_evict(self, c);
        c = prev;
    }
    return self->held + need <= self->capacity;
}

static bool
s_make_room(emlio__share_cache_t *self, uint64_t need, unsigned active)
{
    if (s_evict_done(self, need, active))
        return true;
    s_chunk_t *c = self->lru.prev;
    while (self->held + need > self->capacity && c != &self->lru) {
        s_chunk_t *prev = c->prev;
        if (!c->pins && c->ready)
            s_evict(self, c);
        c = prev;
    }
    return self->held + need <= self->capacity;
}

/* Counts bytes reader copied out of c. Under the lock. */
static void
s_count_use(s_chunk_t *c, uint64_t reader, uint64_t bytes)
{
    unsigned i = 0;
    while (i < c->n_readers && c->reader[i] != reader)
        i++;
    if (i == c->n_readers) {
        if (i == S_TRACKED)
            return;
        c->reader[i] = reader;
        c->got[i] = 0;
        c->n_readers++;
    }
    c->got[i] += bytes;
}

static s_chunk_t *
s_lookup(emlio__share_cache_t *self, const void *owner, uint64_t ident,
         uint64_t index)
{
    s_chunk_t *c = self->buckets[s_hash(self, owner, ident, index)];
    while (c && !(c->owner == owner && c->ident == ident && c->index == index))
        c = c->hnext;
    return c;
}

/* Drops a pin; a chunk out of the table (its read failed) is freed by its
 * last. Under the lock. */
static void
s_unpin(emlio__share_cache_t *self, s_chunk_t *c)
{
    if (--c->pins || c->hashed)
        return;
    s_unlink_lru(c);
    self->held -= c->len;
    s_chunk_free(c);
}

/* Chunk `index` of the file, pinned and ready: found, waited for, or read
 * now by the caller (*fresh set). NULL with *rc 0: no room; with *rc < 0:
 * the read failed. Under the lock, which a read lets go meanwhile. */
static s_chunk_t *
s_get_chunk(emlio__share_cache_t *self, const void *owner, uint64_t ident,
            int fd, unsigned align, uint64_t file_size, uint64_t index,
            uint64_t reader, unsigned active, bool *fresh, int *rc)
{
    *fresh = false;
    *rc = 0;
    s_chunk_t *c = s_lookup(self, owner, ident, index);
    if (c) {
        c->pins++;
        s_unlink_lru(c);
        s_push_lru(self, c);
        while (!c->ready && !c->err)
            pthread_cond_wait(&self->loaded, &self->lock);
        if (c->err) {
            *rc = c->err;
            s_unpin(self, c);
            return NULL;
        }
        return c;
    }
    uint64_t off = index * EMLIO__SHARE_CHUNK;
    size_t len =
        (size_t)EMLIO_MIN((uint64_t)EMLIO__SHARE_CHUNK, file_size - off);
    if (!s_make_room(self, len, active))
        return NULL;
    c = emlio_calloc(1, sizeof(*c));
    if (!c) {
        *rc = EMLIO_ENOMEM;
        return NULL;
    }
    *c = (s_chunk_t){ .owner = owner,
                      .ident = ident,
                      .index = index,
                      .len = len,
                      .loader = reader,
                      .pins = 1,
                      .hashed = true };
    size_t h = s_hash(self, owner, ident, index);
    c->hnext = self->buckets[h];
    self->buckets[h] = c;
    s_push_lru(self, c);
    self->held += len;
    self->peak = EMLIO_MAX(self->peak, self->held);
    self->chunks++;
    pthread_mutex_unlock(&self->lock);
    int r = emlio__io_read(fd, off, len, align, &c->buf, &c->data);
    pthread_mutex_lock(&self->lock);
    if (r < 0) {
        c->err = r;
        s_unhash(self, c);
        pthread_cond_broadcast(&self->loaded);
        *rc = r;
        s_unpin(self, c);
        return NULL;
    }
    c->ready = true;
    pthread_cond_broadcast(&self->loaded);
    *fresh = true;
    return c;
}

int
emlio__share_cache_read(emlio__share_cache_t *self, const void *owner,
                        uint64_t ident, int fd, unsigned align,
                        uint64_t file_size, uint64_t offset, size_t len,
                        uint64_t reader, uint8_t **buf, const uint8_t **data,
                        emlio__share_tally_t *tally)
{
    emlio__share_tally_t none;
    if (!tally)
        tally = &none;
    if (offset > file_size || len > file_size - offset)
        return -ESTALE;
    uint64_t first = offset / EMLIO__SHARE_CHUNK;
    uint64_t last = len ? (offset + len - 1) / EMLIO__SHARE_CHUNK : first;
    /* A record over more chunks than half the cache would push out what
     * other jobs are about to copy: read it alone. */
    if ((last - first + 1) * EMLIO__SHARE_CHUNK > self->capacity / 2) {
        tally->bypass += len;
        return 0;
    }
    uint8_t *out = emlio__iobuf_alloc(len ? len : 1);
    if (!out)
        return EMLIO_ENOMEM;
    emlio__share_tally_t t = { 0 };
    int rc = 1;
    pthread_mutex_lock(&self->lock);
    unsigned active = s_active_readers(self, reader);
    for (uint64_t i = first; i <= last && len; i++) {
        bool fresh;
        int got;
        s_chunk_t *c = s_get_chunk(self, owner, ident, fd, align, file_size, i,
                                   reader, active, &fresh, &got);
        if (!c) {
            t.shared = t.own = 0;
            if (got == 0) /* no room: the caller reads it all alone */
                t.bypass = len;
            rc = got;
            break;
        }
        uint64_t base = i * EMLIO__SHARE_CHUNK;
        uint64_t lo = EMLIO_MAX(offset, base);
        uint64_t hi = EMLIO_MIN(offset + len, base + c->len);
        if (hi < EMLIO_MIN(offset + len, base + EMLIO__SHARE_CHUNK)) {
            /* A chunk read when the file was shorter than the caller
             * says now: the file changed under us. */
            t.shared = t.own = 0;
            rc = -ESTALE;
            s_unpin(self, c);
            break;
        }
        /* The copy runs under the lock: 110 KB is ~10 us of memcpy, less
         * than taking and dropping it again around each piece. */
        memcpy(out + (lo - offset), c->data + (lo - base), (size_t)(hi - lo));
        if (fresh)
            t.loaded += c->len;
        s_count_use(c, reader, hi - lo);
        if (c->loader == reader)
            t.own += hi - lo;
        else
            t.shared += hi - lo;
        s_unpin(self, c);
    }
    self->total.loaded += t.loaded;
    self->total.shared += t.shared;
    self->total.own += t.own;
    self->total.bypass += t.bypass;
    pthread_mutex_unlock(&self->lock);
    tally->loaded += t.loaded;
    if (rc != 1) {
        tally->bypass += t.bypass;
        emlio__iobuf_free(out);
        return rc;
    }
    tally->shared += t.shared;
    tally->own += t.own;
    *buf = out;
    *data = out;
    return 1;
}

void
emlio__share_cache_stats(emlio__share_cache_t *self, emlio__share_stats_t *out)
{
    pthread_mutex_lock(&self->lock);
    *out = (emlio__share_stats_t){ .capacity = self->capacity,
                                   .held = self->held,
                                   .peak = self->peak,
                                   .chunks = self->chunks,
                                   .evicted = self->evicted,
                                   .total = self->total };
    pthread_mutex_unlock(&self->lock);
}
