/* server_io.c - how the daemon's readers reach the bytes of its shards
 * (emliod --io): from the mappings (zero-copy frames of the page cache) or
 * with exact-size reads through the I/O engine (store/ioengine.h), chosen
 * at load and, under --io auto, looked at again while serving.
 *
 * The look (a thread of its own, every S_WATCH_MS) asks two questions:
 *   - does the dataset still fit the memory this process may fill with page
 *     cache (MemAvailable, or the memory cgroup's limit)? Other processes
 *     start and pin memory, operators write cgroup limits: the answer moves
 *     every shard between the mappings and the engine, and is logged;
 *   - while reading, which shards are resident anyway (cat'ed by someone,
 *     left over from when the dataset fitted)? Those are served from their
 *     mappings, zero-copy, until their pages go (mincore,
 *     emlio__shard_resident).
 * Readers see the outcome as each shard's read_io flag; a switch in the
 * middle of a request costs at most a staged read freed unused.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include "server_internal.h"
#include "store.h"

/* How often --io auto looks again, and in how small steps its thread
 * checks that the daemon stops. */
#define S_WATCH_MS                2000
#define S_WATCH_STEP_MS           50
/* A shard is served from its mapping, while the dataset is read, once this
 * share of its pages is resident, and read again below the second: a
 * mapped miss costs a fault and readahead, so only nearly whole shards
 * qualify, and the gap keeps a shard at the edge from flapping. */
#define S_RESIDENT_IN_PCT         90
#define S_RESIDENT_OUT_PCT        75
/* Shard bytes one look checks for residency (mincore walks every page):
 * 4 GiB is ~1M pages, a few ms; bigger datasets are covered over several
 * looks, from where the last one stopped. */
#define S_RESIDENT_BYTES_PER_LOOK ((uint64_t)4 << 30)
/* The residency count is logged when it changed, at most this often. */
#define S_RESIDENT_LOG_MS         10000

/* Whether shard i can be read through the engine at all: a mapped file's
 * records (extents), or a tree format's files. */
static bool
s_readable(const emlio__shard_t *shard)
{
    return shard->ops->mapped || shard->ops->open_record;
}

/* Every readable shard read through the engine (reading) or served from
 * its mapping (not); the residency pass starts over. */
static void
s_set_all(emlio_server_t *self, bool reading)
{
    emlio__shardset_t *set = &self->core->set;
    for (size_t i = 0; i < set->n; i++)
        atomic_store(&set->shards[i].read_io,
                     reading && s_readable(&set->shards[i]));
    atomic_store(&self->core->io_reading, reading);
    atomic_store(&self->core->io_mapped, 0);
}

/* "auto; dataset 2700 MiB, MemAvailable 900 MiB": why, for log lines. */
static void
s_why(const emlio_server_t *self, const char *how, const char *bound,
      uint64_t limit, char *why, size_t len)
{
    snprintf(why, len, "%s; dataset %" PRIu64 " MiB, %s %" PRIu64 " MiB", how,
             self->core->set.bytes >> 20, bound, limit >> 20);
}

static void
s_log_map(emlio_server_t *self, const char *verb, const char *why)
{
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "io: %smap (%s): records are zero-copy frames of the page "
              "cache%s",
              verb, why,
              self->core->io_auto ? "; looked at again every 2 s" : "");
}

/* The read mode's log line: how the engine reads (direct or buffered, the
 * probe's answer on the first open shard), through what, how deep. */
static void
s_log_read(emlio_server_t *self, const char *verb, const char *why)
{
    emlio__shardset_t *set = &self->core->set;
    const char *refusal = emlio__io_uring_refusal();
    /* Direct I/O is decided per descriptor; the first open shard's says
     * what the file system allows (and makes it ready). */
    unsigned align = 0;
    bool probed = false;
    for (size_t i = 0; i < set->n && !probed; i++)
        if (emlio__shard_reads_io(&set->shards[i]) && set->shards[i].fd >= 0 &&
            emlio__shard_try_use(&set->shards[i])) {
            align = emlio__shard_io_align(&set->shards[i]);
            emlio__shard_release(&set->shards[i]);
            probed = true;
        }
    char direct[96];
    if (!probed && !emlio__io_direct_refusal()) /* files read whole */
        snprintf(direct, sizeof(direct),
                 "past the page cache where the file system allows it "
                 "(O_DIRECT, probed per %s)",
                 set->n && set->shards[0].ops->mapped ? "shard" : "class");
    else if (align)
        snprintf(direct, sizeof(direct),
                 "past the page cache (O_DIRECT, %u-byte blocks)", align);
    else
        snprintf(direct, sizeof(direct), "through the page cache (%s)",
                 emlio__io_direct_refusal() ? emlio__io_direct_refusal()
                                            : "no direct I/O here");
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "io: %sread (%s): exact-size reads %s through %s, %u in "
              "flight per reader, %" PRIu64 " MiB read ahead, readahead off",
              verb, why, direct, refusal ? "pread" : "io_uring",
              self->core->io_depth,
              (self->core->read_ahead * self->core->readers) >> 20);
}

/* The cache of chunks read once for every job that shares reads: at most
 * --share-bytes, by default EMLIO_SERVER_SHARE_BYTES or a quarter of the
 * memory the daemon may use when that is less. Its windows (WELCOME
 * "share_window") are a quarter of it, so up to four groups of jobs at
 * different places in the schedule keep their windows at once. */
static int
s_share_start(emlio_server_t *self, uint64_t limit, uint64_t need)
{
    uint64_t cap = self->cfg.share_bytes;
    if (!cap) {
        cap = EMLIO_SERVER_SHARE_BYTES;
        if (limit && limit / 4 < cap)
            cap = EMLIO_MAX(limit / 4, EMLIO__SHARE_MIN);
    } else if (limit && cap + need > limit / 4 * 3) {
        /* Measured: --share-bytes 256M in a 512 MiB cgroup, three jobs
         * cold, was OOM-killed: the chunks, the engine's buffers and the
         * replies' copies together outgrew it. */
        return emlio__seterr(
            self->err, EMLIO_ELIMIT,
            "--share-bytes %" PRIu64 " MiB and the %" PRIu64
            " MiB the I/O engine needs do not fit in 3/4 of the %" PRIu64
            " MiB this daemon may use: lower --share-bytes (a quarter of "
            "the memory, the default, leaves room for the replies)",
            cap >> 20, need >> 20, limit >> 20);
    }
    if (emlio__share_cache_new(&self->core->share, cap) < 0)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    emlio__share_stats_t st;
    emlio__share_cache_stats(self->core->share, &st);
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "share: up to %" PRIu64 " MiB of chunks for jobs that share "
              "reads (%s), windows of %" PRIu64 " MiB",
              st.capacity >> 20,
              self->cfg.share_all ? "every job: --share-all" : "those that ask",
              emlio__srv_share_window(self->core) >> 20);
    return 0;
}

/* Reading, every record sent is a copy: the default copy budget (1 GiB
 * daemon-wide) is lowered to what the memory limit leaves beside the
 * engine and the shared cache (at least 64 MiB). Three jobs cold in a
 * 512 MiB cgroup were OOM-killed with 522 MB of copies and chunks. A
 * budget set on purpose is kept. */
static void
s_fit_copies(emlio_server_t *self, uint64_t limit, uint64_t need)
{
    if (!limit ||
        self->cfg.max_copy_bytes_total != EMLIO_SERVER_MAX_COPY_BYTES_TOTAL)
        return;
    emlio__share_stats_t st;
    emlio__share_cache_stats(self->core->share, &st);
    uint64_t used = need + st.capacity;
    uint64_t room = limit / 4 * 3 > used ? limit / 4 * 3 - used : 0;
    room = EMLIO_MAX(room, (uint64_t)64 << 20);
    if (room >= self->cfg.max_copy_bytes_total)
        return;
    self->cfg.max_copy_bytes_total = room;
    emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
              "io: copies of replies in flight held to %" PRIu64
              " MiB daemon-wide (--max-copy-bytes-total; the memory limit "
              "less the engine and the shared cache)",
              room >> 20);
}

/* The buffers the device reads into come from one arena registered with
 * every reader's ring (iobuf.h): a direct read then skips pinning and
 * unpinning its pages, which is per 4 KiB page and so per byte. Sized to
 * what the readers hold: twice --read-ahead-bytes (staged, then waiting
 * to be sent), within an eighth of the memory limit. Its pages stay resident,
 * so it takes the heap pool's place inside the engine's share of the limit
 * (EMLIO_SERVER_IO_MIN_MEMORY): the pool then keeps only what the arena leaves
 * of its idle limit (at least 16 MiB, for copies and the shared cache's reads).
 * At a quarter of the limit beside the full pool, three sharing jobs in a 512
 * MiB cgroup were OOM-killed (anon 522 MB). Reads past it take buffers from the
 * heap, as before. */
static void
s_arena_start(emlio_server_t *self, uint64_t ahead, uint64_t limit)
{
    if (!emlio__io_fixed_allowed()) {
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: registered buffers disabled by EMLIO_IO_FIXED=0");
        return;
    }
    uint64_t bytes = 2 * ahead;
    if (limit && limit / 8 < bytes)
        bytes = limit / 8;
    bytes = EMLIO_MAX(bytes, (uint64_t)8 << 20);
    /* Without root, each ring's registration counts against the user's
     * memlock limit (8 MiB by default): one share per reader, and one for
     * the start-up probe, whose ring may still be going away. */
    struct rlimit ml;
    if (geteuid() != 0 && getrlimit(RLIMIT_MEMLOCK, &ml) == 0 &&
        ml.rlim_cur != RLIM_INFINITY) {
        uint64_t share = (uint64_t)ml.rlim_cur / (self->core->readers + 1);
        share &= ~(uint64_t)(EMLIO__IOBUF_ALIGN - 1);
        if (share < ((uint64_t)2 << 20)) {
            emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                      "io: no registered read buffers: the memlock limit "
                      "(%" PRIu64 " KiB, ulimit -l) leaves under 2 MiB per "
                      "reader; reads pin their pages each time",
                      (uint64_t)ml.rlim_cur >> 10);
            return;
        }
        bytes = EMLIO_MIN(bytes, share);
    }
    void *base;
    size_t have;
    if (!emlio__iobuf_arena(&base, &have) &&
        (emlio__iobuf_arena_init((size_t)bytes) < 0 ||
         !emlio__iobuf_arena(&base, &have))) {
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: no memory for %" PRIu64 " MiB of registered read "
                  "buffers: reads pin their pages each time",
                  bytes >> 20);
        return;
    }
    uint64_t idle = EMLIO_MAX(ahead, (uint64_t)EMLIO__IOBUF_DEFAULT_IDLE);
    idle =
        idle > have + ((uint64_t)16 << 20) ? idle - have : (uint64_t)16 << 20;
    emlio__iobuf_set_idle_limit((size_t)idle);
    const char *why = emlio__io_fixed_refusal();
    if (why)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: registered read buffers %s: reads pin their pages "
                  "each time",
                  why);
    else
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: %zu MiB of read buffers registered with io_uring "
                  "(fixed buffers: no page pinning per read)",
                  have >> 20);
}

uint64_t
emlio__srv_share_window(const emlio__srv_core_t *core)
{
    if (!core->share)
        return 0;
    emlio__share_stats_t st;
    emlio__share_cache_stats(core->share, &st);
    return st.capacity / 4;
}

int
emlio__srv_io_choose(emlio_server_t *self)
{
    int asked = emlio__io_mode_parse(self->cfg.io);
    if (asked < 0)
        return emlio__seterr(self->err, EMLIO_EINVAL,
                             "unknown io mode '%s' (auto, map or read)",
                             self->cfg.io);
    emlio__shardset_t *set = &self->core->set;
    const char *bound = "MemAvailable";
    uint64_t limit = emlio__io_memory_limit(&bound);
    emlio__io_mode_t mode =
        emlio__io_choose((emlio__io_mode_t)asked, set->bytes, limit);
    /* Mapped shards (TFRecord, tar) and files read whole (ImageFolder)
     * alike: the engine reads what it can stage. */
    bool readable = false;
    for (size_t i = 0; i < set->n && !readable; i++)
        readable = s_readable(&set->shards[i]);
    self->core->io_auto = asked == EMLIO__IO_AUTO && readable;
    self->core->io_engine =
        readable && (mode == EMLIO__IO_READ || self->core->io_auto);
    int fd = -1;
    for (size_t i = 0; i < set->n; i++) {
        atomic_init(&set->shards[i].io_fd, -1);
        if (fd < 0 && set->shards[i].fd >= 0)
            fd = set->shards[i].fd;
    }
    s_set_all(self, self->core->io_engine && mode == EMLIO__IO_READ);
    int dir = -1; /* no mapped shard open: the data directory's device */
    if (fd < 0 && self->cfg.data_dir)
        dir = fd = open(self->cfg.data_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    self->core->io_depth =
        self->cfg.io_depth ? self->cfg.io_depth : emlio__io_device_depth(fd);
    if (dir >= 0)
        close(dir);
    uint64_t ahead = self->cfg.read_ahead_bytes ? self->cfg.read_ahead_bytes
                                                : EMLIO_SERVER_READ_AHEAD_BYTES;
    uint32_t readers = self->cfg.workers ? self->cfg.workers : 1;
    self->core->read_ahead = ahead / readers;
    self->core->readers = readers;
    char why[160];
    s_why(self, asked == EMLIO__IO_AUTO ? "auto" : "asked", bound, limit, why,
          sizeof(why));
    if (!atomic_load(&self->core->io_reading)) {
        s_log_map(self, "", why);
        if (!self->core->io_engine)
            return 0;
    }
    uint64_t need = EMLIO_SERVER_IO_MIN_MEMORY(ahead);
    if (mode == EMLIO__IO_READ && limit && limit < need)
        return emlio__seterr(
            self->err, EMLIO_ELIMIT,
            "io read: the %s of %" PRIu64 " MiB is below the %" PRIu64
            " MiB the I/O engine needs (twice --read-ahead-bytes %" PRIu64
            " MiB, and 32 MiB of buffers): raise the limit or lower "
            "--read-ahead-bytes",
            bound, limit >> 20, need >> 20, ahead >> 20);
    int rc = s_share_start(self, limit, need);
    if (rc < 0)
        return rc;
    s_fit_copies(self, limit, need);
    /* Idle buffers kept: enough for what the readers stage ahead. */
    emlio__iobuf_set_idle_limit(
        (size_t)EMLIO_MAX(ahead, (uint64_t)EMLIO__IOBUF_DEFAULT_IDLE));
    if (atomic_load(&self->core->io_reading))
        s_log_read(self, "", why);
    const char *refusal = emlio__io_uring_refusal();
    if (refusal)
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: io_uring %s: reads go through pread", refusal);
    else
        s_arena_start(self, ahead, limit);
    return 0;
}

/* ---- --io auto, while serving ------------------------------------------ */

/* While reading: shards whose pages are (nearly) all in the page cache
 * are served from their mappings, and go back to the engine when their
 * pages go. A shard the cache has closed is read (it may come back
 * cold). Checks at most S_RESIDENT_BYTES_PER_LOOK of shards, from
 * *cursor on. */
static void
s_residency(emlio_server_t *self, size_t *cursor)
{
    emlio__shardset_t *set = &self->core->set;
    uint64_t budget = S_RESIDENT_BYTES_PER_LOOK;
    size_t start = *cursor;
    for (size_t k = 0; k < set->n && budget; k++) {
        size_t i = (start + k) % set->n;
        emlio__shard_t *shard = &set->shards[i];
        if (!shard->ops->mapped || !shard->size)
            continue;
        budget -= EMLIO_MIN(budget, shard->size);
        *cursor = i + 1;
        uint64_t bytes = 0;
        bool open = emlio__shard_resident(shard, &bytes);
        uint64_t pct = open ? bytes * 100 / shard->size : 0;
        bool mapped = !emlio__shard_reads_io(shard);
        if (!mapped && open && pct >= S_RESIDENT_IN_PCT) {
            atomic_store(&shard->read_io, false);
            atomic_fetch_add(&self->core->io_mapped, 1);
        } else if (mapped && pct < S_RESIDENT_OUT_PCT) {
            atomic_store(&shard->read_io, true);
            atomic_fetch_sub(&self->core->io_mapped, 1);
        }
    }
}

typedef struct s_watch {
    size_t cursor;         /* the residency pass's next shard */
    unsigned logged;       /* the residency count last logged */
    uint64_t logged_at_ns; /* and when */
} s_watch_t;

/* One look: the memory again (switching all shards when the answer
 * changed), then residency while reading. */
static void
s_look(emlio_server_t *self, s_watch_t *w)
{
    emlio__srv_core_t *core = self->core;
    const char *bound = "MemAvailable";
    uint64_t limit = emlio__io_memory_limit(&bound);
    bool reading = atomic_load(&core->io_reading);
    emlio__io_mode_t now = reading ? EMLIO__IO_READ : EMLIO__IO_MAP;
    emlio__io_mode_t next = emlio__io_rechoose(now, core->set.bytes, limit);
    if (next != now) {
        s_set_all(self, next == EMLIO__IO_READ);
        atomic_fetch_add(&core->io_switches, 1);
        char why[160];
        s_why(self, reading ? "auto, was read" : "auto, was map", bound, limit,
              why, sizeof(why));
        if (next == EMLIO__IO_READ)
            s_log_read(self, "now ", why);
        else
            s_log_map(self, "now ", why);
        w->logged = 0;
    }
    if (next == EMLIO__IO_READ)
        s_residency(self, &w->cursor);
    unsigned mapped = atomic_load(&core->io_mapped);
    uint64_t t = emlio__now_ns();
    /* None to some and back are said at once; counts in between at most
     * every S_RESIDENT_LOG_MS. */
    if (mapped != w->logged &&
        (!mapped || !w->logged ||
         t - w->logged_at_ns >= (uint64_t)S_RESIDENT_LOG_MS * 1000000ull)) {
        emlio_log(self->ctx, EMLIO_LOG_INFO, "server",
                  "io: %u of %zu shards resident in the page cache: served "
                  "from their mappings, the rest read",
                  mapped, core->set.n);
        w->logged = mapped;
        w->logged_at_ns = t;
    }
}

static void *
s_watch_main(void *arg)
{
    emlio_server_t *self = arg;
    s_watch_t w = { 0 };
    unsigned steps = 0;
    while (!atomic_load(&self->thr.stopping)) {
        struct timespec ts = { 0, S_WATCH_STEP_MS * 1000000L };
        nanosleep(&ts, NULL);
        if (++steps * S_WATCH_STEP_MS < S_WATCH_MS)
            continue;
        steps = 0;
        s_look(self, &w);
    }
    return NULL;
}

int
emlio__srv_io_watch_start(emlio_server_t *self)
{
    if (!self->core->io_auto)
        return 0;
    int rc = pthread_create(&self->thr.io_watch, NULL, s_watch_main, self);
    if (rc != 0)
        return emlio__seterr(self->err, -rc,
                             "cannot start the io auto thread: %s",
                             strerror(rc));
    self->thr.io_watch_started = true;
    return 0;
}

void
emlio__srv_io_watch_stop(emlio_server_t *self)
{
    if (!self->thr.io_watch_started)
        return;
    pthread_join(self->thr.io_watch, NULL);
    self->thr.io_watch_started = false;
}
