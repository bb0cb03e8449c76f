/* iobuf.c - the pool of touched buffers behind exact-size record reads.
 * SPDX-License-Identifier: MIT
 * See iobuf.h for why.
 */
#define _GNU_SOURCE /* MAP_ANONYMOUS */
#include "iobuf.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "base.h"

/* Arena blocks are poisoned while idle and past each buffer's length, so
 * ASan still sees overruns into them (they are not malloc's). */
#if defined(__SANITIZE_ADDRESS__)
#    define S_ASAN 1
#elif defined(__has_feature)
#    if __has_feature(address_sanitizer)
#        define S_ASAN 1
#    endif
#endif
#ifdef S_ASAN
#    include <sanitizer/asan_interface.h>
#    define S_POISON(p, n)   ASAN_POISON_MEMORY_REGION((p), (n))
#    define S_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#    define S_POISON(p, n)   ((void)(p), (void)(n))
#    define S_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

#define S_MAGIC     0x494f4246u /* "IOBF" */
#define S_MIN       ((size_t)4096)
#define S_UNKEPT    UINT32_MAX       /* larger than the pool keeps */
#define S_SMALL     (UINT32_MAX - 1) /* at most S_SMALL_MAX: plain malloc */
#define S_CLASSES   64
/* Small buffers (an int64 field's 8 bytes) are not worth a page: they
 * come from malloc, 16-aligned, and are not pooled. */
#define S_SMALL_MAX ((size_t)2048)

/* Just in front of every buffer's data; 32 bytes, so small buffers stay
 * 16-aligned. Larger ones sit EMLIO__IOBUF_ALIGN bytes into their block,
 * the header in the last 32 bytes of that prefix. */
typedef struct s_head {
    uint32_t magic;
    uint32_t cls;
    uint64_t size;    /* usable bytes after the header */
    atomic_uint refs; /* holders: 1 from alloc, +1 per ref */
    uint32_t arena;   /* 1: carved from the arena, never freed */
    uint32_t pad[2];
} s_head_t;

_Static_assert(sizeof(s_head_t) == 32, "iobuf header size");

/* An idle buffer links to the next one of its class through its data. */
typedef struct s_idle {
    struct s_idle *next;
} s_idle_t;

static struct {
    pthread_mutex_t lock;
    s_idle_t *free[S_CLASSES];
    size_t idle, out, limit;
    uint64_t allocs, reused;
    /* The arena (emlio__iobuf_arena_init): [base, base + len), carved from
     * the front at `used`; its idle buffers wait on afree, whatever the
     * idle limit, since its pages stay registered with the rings. */
    uint8_t *base;
    size_t len, used;
    s_idle_t *afree[S_CLASSES];
    uint64_t arena_misses;
} s_pool = { .lock = PTHREAD_MUTEX_INITIALIZER,
             .limit = EMLIO__IOBUF_DEFAULT_IDLE };

/* The class of a request of len bytes and its size: 4 KiB, then four
 * classes per power of two (5/4, 6/4, 7/4, 8/4 of it). */
static uint32_t
s_class(size_t len, size_t *size)
{
    if (len <= S_SMALL_MAX) {
        *size = len ? len : 1;
        return S_SMALL;
    }
    if (len <= S_MIN) {
        *size = S_MIN;
        return 0;
    }
    if (len > EMLIO__IOBUF_MAX_POOLED) {
        *size = len;
        return S_UNKEPT;
    }
    unsigned p = 63u - (unsigned)__builtin_clzll((unsigned long long)len - 1);
    size_t base = (size_t)1 << p; /* base < len <= 2 * base */
    size_t step = base / 4;
    size_t q = (len - base + step - 1) / step; /* 1..4 */
    *size = base + q * step;
    return (uint32_t)((p - 12) * 4 + q);
}

static s_head_t *
s_head(void *buf)
{
    return (s_head_t *)(void *)((uint8_t *)buf - sizeof(s_head_t));
}

/* The block behind buf, as malloc or posix_memalign gave it. */
static void *
s_block(void *buf, uint32_t cls)
{
    return (uint8_t *)buf -
           (cls == S_SMALL ? sizeof(s_head_t) : EMLIO__IOBUF_ALIGN);
}

static void
s_free_block(void *buf)
{
    s_head_t *h = s_head(buf);
    h->magic = 0;
    emlio_free(s_block(buf, h->cls));
}

uint8_t *
emlio__iobuf_alloc(size_t len)
{
    size_t size;
    uint32_t cls = s_class(len, &size);
    if (cls < S_CLASSES) {
        pthread_mutex_lock(&s_pool.lock);
        s_idle_t *hit = s_pool.free[cls];
        if (hit) {
            s_pool.free[cls] = hit->next;
            s_pool.idle -= size;
            s_pool.reused++;
            s_pool.allocs++;
            s_pool.out += size;
        }
        pthread_mutex_unlock(&s_pool.lock);
        if (hit) {
            atomic_store_explicit(&s_head(hit)->refs, 1, memory_order_relaxed);
            return (uint8_t *)hit;
        }
    }
    if (size > SIZE_MAX - EMLIO__IOBUF_ALIGN)
        return NULL;
    uint8_t *data;
    if (cls == S_SMALL) {
        uint8_t *block = emlio_malloc(sizeof(s_head_t) + size);
        if (!block)
            return NULL;
        data = block + sizeof(s_head_t);
    } else {
        uint8_t *block =
            emlio__aligned_alloc(EMLIO__IOBUF_ALIGN, EMLIO__IOBUF_ALIGN + size);
        if (!block)
            return NULL;
        data = block + EMLIO__IOBUF_ALIGN;
    }
    s_head_t *h = s_head(data);
    *h = (s_head_t){ .magic = S_MAGIC, .cls = cls, .size = size };
    atomic_init(&h->refs, 1);
    pthread_mutex_lock(&s_pool.lock);
    s_pool.allocs++;
    s_pool.out += size;
    pthread_mutex_unlock(&s_pool.lock);
    return data;
}

uint8_t *
emlio__iobuf_ref(uint8_t *buf)
{
    s_head_t *h = s_head(buf);
    if (h->magic != S_MAGIC)
        abort();
    atomic_fetch_add_explicit(&h->refs, 1, memory_order_relaxed);
    return buf;
}

void
emlio__iobuf_free(void *buf)
{
    if (!buf)
        return;
    s_head_t *h = s_head(buf);
    if (h->magic != S_MAGIC)
        abort(); /* not ours: a mix-up with emlio_free is a bug */
    /* Others still hold it: parts of one merged read (ioengine.c). The
     * release pairs with their writes before they let go. */
    if (atomic_fetch_sub_explicit(&h->refs, 1, memory_order_acq_rel) != 1)
        return;
    size_t size = (size_t)h->size;
    bool kept = false;
    if (h->arena) {
        S_POISON(buf, size);
        S_UNPOISON(buf, sizeof(s_idle_t));
        pthread_mutex_lock(&s_pool.lock);
        s_pool.out -= size;
        s_idle_t *idle = buf;
        idle->next = s_pool.afree[h->cls];
        s_pool.afree[h->cls] = idle;
        pthread_mutex_unlock(&s_pool.lock);
        return;
    }
    pthread_mutex_lock(&s_pool.lock);
    s_pool.out -= size;
    if (h->cls < S_CLASSES && s_pool.idle + size <= s_pool.limit) {
        s_idle_t *idle = buf;
        idle->next = s_pool.free[h->cls];
        s_pool.free[h->cls] = idle;
        s_pool.idle += size;
        kept = true;
    }
    pthread_mutex_unlock(&s_pool.lock);
    if (!kept)
        s_free_block(buf);
}

/* Takes idle buffers off the lists until at most keep bytes are idle;
 * returns them linked, for the caller to free outside the lock. */
static s_idle_t *
s_shed(size_t keep)
{
    s_idle_t *shed = NULL;
    for (int c = S_CLASSES - 1; c >= 0 && s_pool.idle > keep; c--)
        while (s_pool.free[c] && s_pool.idle > keep) {
            s_idle_t *b = s_pool.free[c];
            s_pool.free[c] = b->next;
            s_pool.idle -= (size_t)s_head(b)->size;
            b->next = shed;
            shed = b;
        }
    return shed;
}

static void
s_free_list(s_idle_t *list)
{
    while (list) {
        s_idle_t *next = list->next;
        s_free_block(list);
        list = next;
    }
}

void
emlio__iobuf_set_idle_limit(size_t bytes)
{
    pthread_mutex_lock(&s_pool.lock);
    s_pool.limit = bytes;
    s_idle_t *shed = s_shed(bytes);
    pthread_mutex_unlock(&s_pool.lock);
    s_free_list(shed);
}

void
emlio__iobuf_trim(void)
{
    pthread_mutex_lock(&s_pool.lock);
    s_idle_t *shed = s_shed(0);
    pthread_mutex_unlock(&s_pool.lock);
    s_free_list(shed);
}

void
emlio__iobuf_stats(emlio__iobuf_stats_t *out)
{
    pthread_mutex_lock(&s_pool.lock);
    *out = (emlio__iobuf_stats_t){ .allocs = s_pool.allocs,
                                   .reused = s_pool.reused,
                                   .idle = s_pool.idle,
                                   .out = s_pool.out,
                                   .arena_bytes = s_pool.len,
                                   .arena_misses = s_pool.arena_misses };
    pthread_mutex_unlock(&s_pool.lock);
}

/* ---- the arena ------------------------------------------------------- */

int
emlio__iobuf_arena_init(size_t bytes)
{
    bytes = (bytes + EMLIO__IOBUF_ALIGN - 1) & ~(EMLIO__IOBUF_ALIGN - 1);
    if (!bytes)
        return EMLIO_EINVAL;
    pthread_mutex_lock(&s_pool.lock);
    bool have = s_pool.base != NULL;
    pthread_mutex_unlock(&s_pool.lock);
    if (have)
        return EMLIO_EINVAL; /* one per process: the rings hold its pages */
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return EMLIO_ENOMEM;
    S_POISON(base, bytes);
    pthread_mutex_lock(&s_pool.lock);
    if (s_pool.base) { /* another thread won */
        pthread_mutex_unlock(&s_pool.lock);
        munmap(base, bytes);
        return EMLIO_EINVAL;
    }
    s_pool.base = base;
    s_pool.len = bytes;
    s_pool.used = 0;
    pthread_mutex_unlock(&s_pool.lock);
    return 0;
}

bool
emlio__iobuf_arena(void **base, size_t *len)
{
    pthread_mutex_lock(&s_pool.lock);
    *base = s_pool.base;
    *len = s_pool.len;
    pthread_mutex_unlock(&s_pool.lock);
    return *base != NULL;
}

bool
emlio__iobuf_in_arena(const uint8_t *buf, size_t len)
{
    /* base and len are set once, before any buffer of the arena exists. */
    const uint8_t *base = s_pool.base;
    return base && buf >= base && len <= s_pool.len &&
           (size_t)(buf - base) <= s_pool.len - len;
}

uint8_t *
emlio__iobuf_alloc_io(size_t len)
{
    size_t size;
    uint32_t cls = s_class(len, &size);
    uint8_t *data = NULL;
    if (cls < S_CLASSES) {
        pthread_mutex_lock(&s_pool.lock);
        if (s_pool.afree[cls]) {
            s_idle_t *hit = s_pool.afree[cls];
            S_UNPOISON(hit, sizeof(*hit));
            s_pool.afree[cls] = hit->next;
            data = (uint8_t *)hit;
        } else if (s_pool.base &&
                   s_pool.len - s_pool.used >= EMLIO__IOBUF_ALIGN + size) {
            data = s_pool.base + s_pool.used + EMLIO__IOBUF_ALIGN;
            s_pool.used += EMLIO__IOBUF_ALIGN + size;
        }
        if (data) {
            s_pool.allocs++;
            s_pool.out += size;
        } else if (s_pool.base) {
            s_pool.arena_misses++;
        }
        pthread_mutex_unlock(&s_pool.lock);
    }
    if (!data)
        return emlio__iobuf_alloc(len);
    s_head_t *h = s_head(data);
    S_UNPOISON(h, sizeof(*h));
    *h = (s_head_t){ .magic = S_MAGIC, .cls = cls, .size = size, .arena = 1 };
    atomic_init(&h->refs, 1);
    S_UNPOISON(data, len);
    return data;
}
