/* shard_cache.c - mapped shards opened on demand under a descriptor budget,
 * and the watcher thread of their leases (see shard_cache.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "shard_cache.h"
#include "shardset.h"

/* The real-time signal of lease breaks: above the ones glibc keeps for
 * itself (SIGRTMIN already skips them) and the first few that programs
 * embedding the library tend to pick. Only the watcher thread receives
 * it, and it keeps it blocked. */
#define S_SIGNAL()       (SIGRTMIN + 6)
/* Open shards stat'ed per watcher tick (a path renamed over, an unleased
 * shard whose size changed): bounded, so idle CPU does not grow with the
 * number of shards. */
#define S_SWEEP_PER_TICK 64
#define S_TICK_MS        1000
/* How often the watcher looks again at changed shards still in use. */
#define S_BUSY_TICK_MS   20
#define S_NONE           UINT32_MAX
/* How long an open waits for descriptors when the process has none left. */
#define S_FD_WAIT_MS     1000

struct emlio__shard_cache {
    pthread_mutex_t lock;
    emlio__shardset_t *set;
    size_t budget;
    bool lease; /* the daemon: descriptors, leases, the watcher thread */
    atomic_bool leases_work; /* the last lease asked for was granted */
    uint32_t *slots;         /* indices of the open shards, n_open of them */
    size_t n_open;
    size_t cap;
    size_t hand;  /* the CLOCK hand, an index into slots */
    size_t sweep; /* next slot the slow sweep stats */
    size_t peak;
    uint64_t opens;
    uint64_t closes;
    uint64_t copy_opens; /* opened for copying reads, the budget spent */
    uint64_t err_ns;     /* when an open failure was last logged */
    uint32_t *by_fd;     /* descriptor -> shard index (S_NONE) */
    size_t n_fd;
    uint32_t grace_ms;
    emlio__shardset_log_fn *log;
    void *userdata;
    /* The watcher. */
    pthread_t thread;
    pthread_cond_t ready_cond;
    bool started;
    bool ready;
    pid_t tid;
    int sigfd;
    int wakefd;
    atomic_bool armed;
    atomic_bool stopping;
    atomic_bool dirty; /* a shard was marked changed: look now */
};

static uint32_t
s_index(const emlio__shard_cache_t *self, const emlio__shard_t *shard)
{
    return (uint32_t)(shard - self->set->shards);
}

static void s_log(emlio__shard_cache_t *self, const char *fmt, ...)
    EMLIO_PRINTF(2, 3);

static void
s_log(emlio__shard_cache_t *self, const char *fmt, ...)
{
    if (!self->log)
        return;
    char msg[PATH_MAX + 256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    self->log(self->userdata, msg);
}

/* The first number in a small file (/proc/sys/vm/max_map_count); 0 when
 * it cannot be read. */
static uint64_t
s_read_number(const char *path)
{
    FILE *f = fopen(path, "re");
    unsigned long long v = 0;
    if (!f)
        return 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

int
emlio__shard_cache_budget(size_t asked, bool lease, size_t shards,
                          size_t *budget, char *errbuf)
{
    struct rlimit rl = { 0, 0 };
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        rl.rlim_cur = 1u << 20;
    uint64_t nofile = rl.rlim_cur;
    uint64_t maps = s_read_number("/proc/sys/vm/max_map_count");
    if (!lease) { /* mappings only: no descriptor is kept */
        *budget = asked ? asked : (size_t)(maps ? maps / 4 : 16384);
        return 0;
    }
    if (asked) {
        if (asked + EMLIO__SHARD_CACHE_RESERVE > nofile)
            return emlio__seterr(
                errbuf, EMLIO_EINVAL,
                "--max-open-shards %zu does not fit under the open-file "
                "limit of %" PRIu64 " (%d are kept for sockets and "
                "clients): lower it, or raise the limit (ulimit -n, "
                "LimitNOFILE=)",
                asked, nofile, EMLIO__SHARD_CACHE_RESERVE);
        *budget = asked;
        return 0;
    }
    uint64_t keep = EMLIO__SHARD_CACHE_RESERVE + nofile / 4;
    uint64_t room = nofile > keep ? nofile - keep : 0;
    if (maps)
        room = EMLIO_MIN(room, maps / 4);
    uint64_t need = EMLIO_MAX(
        EMLIO_MIN((uint64_t)shards, EMLIO__SHARD_CACHE_MIN_BUDGET), 1);
    if (room < need) {
        uint64_t least = EMLIO__SHARD_CACHE_RESERVE + need;
        while (least < EMLIO__SHARD_CACHE_RESERVE + least / 4 + need)
            least++;
        return emlio__seterr(
            errbuf, EMLIO_EINVAL,
            "the open-file limit of %" PRIu64 " leaves room for %" PRIu64
            " open shards, fewer than the %" PRIu64 " needed: raise it "
            "to at least %" PRIu64 " (ulimit -n, LimitNOFILE=)",
            nofile, room, need, least);
    }
    *budget = (size_t)room;
    return 0;
}

/* Remembers that fd is shard's, growing the table as descriptors do. */
static int
s_note_fd(emlio__shard_cache_t *self, int fd, uint32_t index)
{
    if ((size_t)fd >= self->n_fd) {
        size_t n = EMLIO_MAX((size_t)fd + 1, self->n_fd * 2);
        uint32_t *by_fd = emlio_reallocarray(self->by_fd, n, sizeof(*by_fd));
        if (!by_fd)
            return EMLIO_ENOMEM;
        for (size_t i = self->n_fd; i < n; i++)
            by_fd[i] = S_NONE;
        self->by_fd = by_fd;
        self->n_fd = n;
    }
    self->by_fd[fd] = index;
    return 0;
}

/* Adds shard to the open list (room was made by s_open). */
static void
s_slot_add(emlio__shard_cache_t *self, emlio__shard_t *shard)
{
    shard->slot = (uint32_t)self->n_open;
    self->slots[self->n_open++] = s_index(self, shard);
    self->peak = EMLIO_MAX(self->peak, self->n_open);
}

static void
s_slot_remove(emlio__shard_cache_t *self, emlio__shard_t *shard)
{
    uint32_t k = shard->slot;
    uint32_t last = self->slots[--self->n_open];
    self->slots[k] = last;
    self->set->shards[last].slot = k;
    shard->slot = S_NONE;
    if (self->hand >= self->n_open)
        self->hand = 0;
}

/* Gives back the lease, closes the descriptor and, unless frames still
 * read its (blanked) mapping, unmaps. Called with the lock held, the
 * shard closed to new readers. */
static void
s_drop(emlio__shard_cache_t *self, emlio__shard_t *shard, bool unmap)
{
    if (unmap)
        emlio__mapfile_unmap(emlio__shard_file(shard));
    if (shard->fd >= 0) {
        if (shard->leased)
            (void)fcntl(shard->fd, F_SETLEASE, F_UNLCK);
        if ((size_t)shard->fd < self->n_fd)
            self->by_fd[shard->fd] = S_NONE;
        close(shard->fd);
        shard->fd = -1;
        atomic_store(&shard->io_fd, -1); /* a new descriptor is made ready */
    }
    if (shard->slot != S_NONE)
        s_slot_remove(self, shard);
    self->closes++;
}

/* Closes an idle open shard. Readers add themselves to users before they
 * check is_open, and this clears is_open before it checks users (both
 * sequentially consistent), so either it sees the reader or the reader
 * sees it closed and takes the slow path. Returns whether it closed. */
static bool
s_close_idle(emlio__shard_cache_t *self, emlio__shard_t *shard)
{
    atomic_store(&shard->is_open, false);
    if (atomic_load(&shard->users) != 0) {
        atomic_store(&shard->is_open, true);
        return false;
    }
    s_drop(self, shard, true);
    return true;
}

/* CLOCK: closes the first idle shard not used since the hand last passed
 * it. Returns false when every open shard is in use. */
static bool
s_evict_one(emlio__shard_cache_t *self)
{
    for (size_t step = 0; step < 2 * self->n_open + 1 && self->n_open; step++) {
        if (self->hand >= self->n_open)
            self->hand = 0;
        emlio__shard_t *shard = &self->set->shards[self->slots[self->hand]];
        if (atomic_load(&shard->users) == 0 &&
            !atomic_exchange(&shard->ref, false) && s_close_idle(self, shard))
            return true;
        self->hand++;
    }
    return false;
}

/* Opens shard's file and (lease) takes its lease, signalled to the
 * watcher. */
static int
s_open_leased(emlio__shard_cache_t *self, emlio__shard_t *shard, bool lease,
              struct stat *st)
{
    int fd = emlio__open_beneath(&self->set->root, shard->name, 0, st);
    /* Out of descriptors: an idle shard gives one back; else the
     * connections that took them (a storm of idle ones under a low ulimit
     * -n) are being closed by the frontend's connection cap, so wait for
     * that a little (at most S_FD_WAIT_MS, lock held: every other open
     * would fail now too) rather than fail the client's read. */
    for (int i = 0; (fd == -EMFILE || fd == -ENFILE) && i < S_FD_WAIT_MS / 20;
         i++) {
        if (!s_evict_one(self)) {
            struct timespec ts = { 0, 20 * 1000000 };
            nanosleep(&ts, NULL);
        }
        fd = emlio__open_beneath(&self->set->root, shard->name, 0, st);
    }
    if (fd < 0)
        return fd;
    struct f_owner_ex owner = { .type = F_OWNER_TID, .pid = self->tid };
    /* Lease first, identity after: once the lease is held, any writer
     * breaks it, and anything written before shows in the fstat below. */
    shard->leased = lease && S_ISREG(st->st_mode) && self->tid > 0 &&
                    fcntl(fd, F_SETSIG, S_SIGNAL()) == 0 &&
                    fcntl(fd, F_SETOWN_EX, &owner) == 0 &&
                    fcntl(fd, F_SETLEASE, F_RDLCK) == 0;
    if (lease)
        atomic_store(&self->leases_work, shard->leased);
    if (fstat(fd, st) != 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    return fd;
}

/* Why the file opened now is not the one seen at load, or NULL. */
static const char *
s_differs(const emlio__shard_t *shard, const struct stat *st, char *why,
          size_t len)
{
    uint64_t mtime_ns =
        (uint64_t)st->st_mtim.tv_sec * 1000000000ull + st->st_mtim.tv_nsec;
    if (st->st_dev != shard->dev || st->st_ino != shard->ino)
        snprintf(why, len, "the path now names another file");
    else if ((uint64_t)st->st_size != shard->size)
        snprintf(why, len, "its size went from %" PRIu64 " to %lld bytes",
                 shard->size, (long long)st->st_size);
    else if (mtime_ns != shard->mtime_ns)
        snprintf(why, len, "it was modified (mtime) since it was loaded");
    else
        return NULL;
    return why;
}

/* Opens, leases, checks and maps shard with the lock held; on success it
 * is open and listed. first: the load's open, which records the identity
 * instead of checking it. When the budget is spent and every open shard
 * is in use (zero-copy frames of batches in flight pin their shards: a
 * shuffled batch of 256 samples can pin 256 shards), the shard is opened
 * for copying reads only (no lease, no mapping): its readers pread
 * private copies, so it is idle again as soon as they are done and the
 * next miss closes it. Mapped shards thus stay within the budget, and
 * descriptors beyond it number at most the readers at work. */
static int
s_open(emlio__shard_cache_t *self, emlio__shard_t *shard, bool first,
       char *errbuf)
{
    while (self->n_open >= self->budget && s_evict_one(self))
        ;
    bool copy = self->lease && !first && self->n_open >= self->budget;
    /* With every open shard in use the list grows past the budget. */
    if (emlio__grow(&self->slots, &self->cap, self->n_open,
                    sizeof(*self->slots), 16) < 0)
        return emlio__seterr(errbuf, EMLIO_ENOMEM, "out of memory opening '%s'",
                             shard->name);
    struct stat st;
    const char *path = emlio__shard_file(shard)->path;
    int fd = s_open_leased(self, shard, self->lease && !copy, &st);
    if (fd < 0 && (first || fd != -ENOENT))
        return emlio__seterr(errbuf, fd, "cannot open '%s': %s", path,
                             emlio__open_why(fd));
    char why[128];
    if (fd < 0 || (!first && s_differs(shard, &st, why, sizeof(why)))) {
        if (fd >= 0)
            close(fd);
        emlio__shard_mark_changed(shard, fd < 0 ? "it was removed" : why,
                                  self->log, self->userdata);
        return -ESTALE;
    }
    if (first) {
        shard->dev = st.st_dev;
        shard->ino = st.st_ino;
        shard->size = (uint64_t)st.st_size;
        shard->mtime_ns =
            (uint64_t)st.st_mtim.tv_sec * 1000000000ull + st.st_mtim.tv_nsec;
    }
    int rc = self->lease ? s_note_fd(self, fd, s_index(self, shard)) : 0;
    if (rc == 0 && !copy)
        rc = emlio__mapfile_map_fd(emlio__shard_file(shard), fd, &st);
    if (rc < 0 || !self->lease) { /* the tools keep the mapping only */
        if ((size_t)fd < self->n_fd)
            self->by_fd[fd] = S_NONE;
        close(fd);
        fd = -1;
    }
    if (rc == EMLIO_ENOMEM)
        return emlio__seterr(errbuf, rc, "out of memory opening '%s'",
                             shard->name);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "%s", emlio__shard_file(shard)->err);
    shard->fd = fd;
    s_slot_add(self, shard);
    self->opens++;
    self->copy_opens += copy;
    atomic_store(&shard->ref, !copy); /* copy-only: the first to go */
    atomic_store(&shard->is_open, true);
    return 0;
}

int
emlio__shard_cache_first_open(emlio__shard_cache_t *self, emlio__shard_t *shard,
                              const char *path, char *errbuf)
{
    (void)path; /* the format's handle names the file */
    shard->slot = S_NONE;
    shard->fd = -1;
    pthread_mutex_lock(&self->lock);
    int rc = s_open(self, shard, true, errbuf);
    if (rc == 0)
        atomic_fetch_add(&shard->users, 1);
    pthread_mutex_unlock(&self->lock);
    return rc;
}

void
emlio__shard_cache_adopt(emlio__shard_cache_t *self, emlio__shard_t *shard,
                         const struct stat *st)
{
    (void)self;
    assert(!atomic_load(&shard->is_open)); /* never opened, or closed */
    shard->slot = S_NONE;
    shard->fd = -1;
    shard->dev = st->st_dev;
    shard->ino = st->st_ino;
    shard->size = (uint64_t)st->st_size;
    shard->mtime_ns =
        (uint64_t)st->st_mtim.tv_sec * 1000000000ull + st->st_mtim.tv_nsec;
    atomic_store(&shard->is_open, false);
}

int
emlio__shard_cache_acquire(emlio__shard_cache_t *self, emlio__shard_t *shard)
{
    char err[EMLIO_ERRMSG_LEN] = "out of memory";
    int rc = 0;
    pthread_mutex_lock(&self->lock);
    if (atomic_load(&shard->changed))
        rc = -ESTALE;
    else if (!atomic_load(&shard->is_open))
        rc = s_open(self, shard, false, err);
    if (rc == 0) {
        atomic_fetch_add(&shard->users, 1);
        atomic_store(&shard->ref, true);
        if (atomic_load(&shard->changed)) {
            atomic_fetch_sub(&shard->users, 1);
            rc = -ESTALE;
        }
    }
    /* Once a second at most: every read of a shard that cannot be opened
     * fails alike, and each failed request is answered anyway. */
    uint64_t now = emlio__now_ns();
    bool say = rc < 0 && rc != -ESTALE && now - self->err_ns >= 1000000000ull;
    if (say)
        self->err_ns = now;
    pthread_mutex_unlock(&self->lock);
    if (say)
        s_log(self, "%s", err);
    return rc;
}

/* A changed shard: closed as soon as nothing reads its mapping; after
 * grace_ms, frames still in flight get zero pages instead of the file
 * (their clients reject them by CRC) and the lease is given back anyway,
 * so the writer does not wait for a slow client. */
static bool
s_release_changed(emlio__shard_cache_t *self, emlio__shard_t *shard,
                  uint64_t now)
{
    if (!shard->changed_ns)
        shard->changed_ns = now;
    atomic_store(&shard->is_open, false);
    unsigned users = atomic_load(&shard->users);
    if (users == 0) {
        s_drop(self, shard, true);
        shard->released = true;
        return true;
    }
    /* Copying readers use the descriptor only while they read (their
     * frames are copies): they are waited for, never cut off. */
    if (!shard->leased ||
        now - shard->changed_ns < (uint64_t)self->grace_ms * 1000000ull)
        return false;
    (void)emlio__mapfile_blank(emlio__shard_file(shard));
    s_log(self,
          "shard '%s': %u frames still in flight after %u ms; their bytes "
          "were replaced by zeros",
          shard->name, users, self->grace_ms);
    s_drop(self, shard, false); /* the zero pages stay for those frames */
    shard->released = true;
    return true;
}

/* What a lease-break signal for fd means: the open shard behind it is
 * being written to (a stale signal for a descriptor since reused still
 * holds its lease, and is ignored). Lock held. */
static void
s_lease_broken(emlio__shard_cache_t *self, int fd)
{
    if (fd < 0 || (size_t)fd >= self->n_fd || self->by_fd[fd] == S_NONE)
        return;
    emlio__shard_t *shard = &self->set->shards[self->by_fd[fd]];
    if (shard->fd != fd || !shard->leased || atomic_load(&shard->changed) ||
        fcntl(fd, F_GETLEASE) == F_RDLCK)
        return;
    emlio__shard_mark_changed(shard, "a writer opened it; lease given back",
                              self->log, self->userdata);
    atomic_store(&self->dirty, true);
}

/* Stats up to n open shards, from where the last sweep stopped: the lease
 * (in case a signal was lost), the size of an unleased shard, and whether
 * the path still names the file (logged once: the file we hold is intact
 * and still served). all: every open shard (after a SIGIO overflow). */
static void
s_sweep(emlio__shard_cache_t *self, size_t n, bool all)
{
    n = all ? self->n_open : EMLIO_MIN(n, self->n_open);
    for (size_t k = 0; k < n; k++) {
        if (self->sweep >= self->n_open)
            self->sweep = 0;
        emlio__shard_t *shard = &self->set->shards[self->slots[self->sweep++]];
        struct stat st;
        if (atomic_load(&shard->changed) || shard->fd < 0)
            continue;
        if (shard->leased) {
            s_lease_broken(self, shard->fd);
        } else if (fstat(shard->fd, &st) == 0 &&
                   (uint64_t)st.st_size != shard->size) {
            char why[96];
            snprintf(why, sizeof(why),
                     "its size went from %" PRIu64 " to %lld bytes",
                     shard->size, (long long)st.st_size);
            emlio__shard_mark_changed(shard, why, self->log, self->userdata);
            atomic_store(&self->dirty, true);
        }
        if (all || shard->replaced || atomic_load(&shard->changed))
            continue;
        bool gone = fstatat(self->set->root.fd, shard->name, &st, 0) != 0;
        if (gone || st.st_dev != shard->dev || st.st_ino != shard->ino) {
            shard->replaced = true;
            s_log(self,
                  "shard '%s' was %s on disk; still serving the file opened "
                  "when it was last opened (it is refused once closed and "
                  "reopened; restart emliod to serve the new one)",
                  shard->name, gone ? "removed" : "replaced");
        }
    }
}

/* One watcher round, lock held: changed shards closed, the excess over
 * the budget closed, and (sweep) a bounded slow check. Returns whether a
 * changed shard still waits for its users. */
static bool
s_tick(emlio__shard_cache_t *self, bool sweep, bool overflow)
{
    if (sweep || overflow)
        s_sweep(self, S_SWEEP_PER_TICK, overflow);
    bool waiting = false;
    if (atomic_exchange(&self->dirty, false)) {
        uint64_t now = emlio__now_ns();
        for (size_t k = self->n_open; k-- > 0;) {
            emlio__shard_t *shard = &self->set->shards[self->slots[k]];
            if (atomic_load(&shard->changed))
                waiting |= !s_release_changed(self, shard, now);
        }
    }
    if (waiting)
        atomic_store(&self->dirty, true);
    while (self->n_open > self->budget && s_evict_one(self))
        ;
    return waiting;
}

/* Reads every queued signal; returns whether one was SIGIO (the queue of
 * real-time signals overflowed: some breaks were not named). */
static bool
s_read_signals(emlio__shard_cache_t *self)
{
    bool overflow = false;
    struct signalfd_siginfo si[32];
    ssize_t got;
    while ((got = read(self->sigfd, si, sizeof(si))) > 0) {
        for (size_t i = 0; i < (size_t)got / sizeof(si[0]); i++) {
            if ((int)si[i].ssi_signo == SIGIO)
                overflow = true;
            else if (atomic_load(&self->armed))
                s_lease_broken(self, si[i].ssi_fd);
        }
    }
    return overflow;
}

static void *
s_watch_main(void *arg)
{
    emlio__shard_cache_t *self = arg;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, S_SIGNAL());
    sigaddset(&set, SIGIO);
    /* Blocked since creation (every signal: see emlio__shard_cache_new). */
    int sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    pthread_mutex_lock(&self->lock);
    self->sigfd = sigfd;
    self->tid = sigfd >= 0 ? (pid_t)syscall(SYS_gettid) : 0;
    self->ready = true;
    pthread_cond_broadcast(&self->ready_cond);
    pthread_mutex_unlock(&self->lock);
    uint64_t last_sweep = emlio__now_ns();
    bool waiting = false;
    while (!atomic_load(&self->stopping)) {
        struct pollfd fds[2] = { { self->wakefd, POLLIN, 0 },
                                 { sigfd, POLLIN, 0 } };
        int timeout = !atomic_load(&self->armed) ? -1
                      : waiting                  ? S_BUSY_TICK_MS
                                                 : S_TICK_MS;
        /* Signals wait in the signalfd until the load has armed us. */
        bool armed = atomic_load(&self->armed);
        int n = poll(fds, sigfd >= 0 && armed ? 2 : 1, timeout);
        if (n < 0 && errno != EINTR)
            break;
        uint64_t value;
        if (n > 0 && (fds[0].revents & POLLIN))
            (void)!read(self->wakefd, &value, sizeof(value));
        if (!atomic_load(&self->armed))
            continue;
        uint64_t now = emlio__now_ns();
        bool sweep = now - last_sweep >= S_TICK_MS * 1000000ull;
        pthread_mutex_lock(&self->lock);
        bool overflow = sigfd >= 0 && s_read_signals(self);
        waiting = s_tick(self, sweep, overflow);
        pthread_mutex_unlock(&self->lock);
        last_sweep = sweep ? now : last_sweep;
    }
    return NULL;
}

/* Starts the watcher with every signal blocked from its first
 * instruction, so a lease break can never reach a handler. */
static int
s_start(emlio__shard_cache_t *self)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&self->thread, NULL, s_watch_main, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0)
        return -rc;
    self->started = true;
    pthread_mutex_lock(&self->lock);
    while (!self->ready)
        pthread_cond_wait(&self->ready_cond, &self->lock);
    pthread_mutex_unlock(&self->lock);
    return 0;
}

int
emlio__shard_cache_new(emlio__shard_cache_t **self_p, emlio__shardset_t *set,
                       size_t budget, bool lease, uint32_t grace_ms,
                       emlio__shardset_log_fn *log, void *userdata,
                       char *errbuf)
{
    emlio__shard_cache_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return emlio__seterr(errbuf, EMLIO_ENOMEM, "out of memory");
    pthread_mutex_init(&self->lock, NULL);
    pthread_cond_init(&self->ready_cond, NULL);
    self->set = set;
    self->budget = EMLIO_MAX(budget, 1);
    self->grace_ms = grace_ms;
    self->log = log;
    self->userdata = userdata;
    self->sigfd = -1;
    self->lease = lease;
    self->wakefd = -1;
    if (!lease) { /* the tools: nothing to watch */
        *self_p = self;
        return 0;
    }
    self->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    int rc = self->wakefd < 0 ? -errno : s_start(self);
    if (rc < 0) {
        emlio__shard_cache_destroy(&self);
        return emlio__seterr(errbuf, rc, "cannot start the shard watcher: %s",
                             emlio_strerror(rc));
    }
    if (self->sigfd < 0)
        s_log(self, "no signalfd: lease breaks are noticed by the 1 s "
                    "sweep of open shards only");
    *self_p = self;
    return 0;
}

void
emlio__shard_cache_arm(emlio__shard_cache_t *self)
{
    pthread_mutex_lock(&self->lock);
    /* The load sorted the shards: their indices moved. */
    for (size_t i = 0; i < self->n_fd; i++)
        self->by_fd[i] = S_NONE;
    self->n_open = 0;
    for (size_t i = 0; i < self->set->n; i++) {
        emlio__shard_t *shard = &self->set->shards[i];
        if (!shard->ops->mapped || !atomic_load(&shard->is_open))
            continue;
        s_slot_add(self, shard);
        if (shard->fd >= 0)
            self->by_fd[shard->fd] = (uint32_t)i;
    }
    atomic_store(&self->armed, true);
    pthread_mutex_unlock(&self->lock);
    emlio__shard_cache_poke(self);
}

void
emlio__shard_cache_poke(emlio__shard_cache_t *self)
{
    uint64_t one = 1;
    atomic_store(&self->dirty, true);
    if (self->wakefd >= 0)
        (void)!write(self->wakefd, &one, sizeof(one));
}

void
emlio__shard_cache_stats(emlio__shard_cache_t *self,
                         emlio__shard_cache_stats_t *out)
{
    pthread_mutex_lock(&self->lock);
    out->budget = self->budget;
    out->open = self->n_open;
    out->peak = self->peak;
    out->opens = self->opens;
    out->closes = self->closes;
    out->copy_opens = self->copy_opens;
    pthread_mutex_unlock(&self->lock);
}

void
emlio__shard_cache_destroy(emlio__shard_cache_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__shard_cache_t *self = *self_p;
    /* Leases first: a break signalled to a thread that is gone could reach
     * a new thread given the same id, and kill the process. */
    pthread_mutex_lock(&self->lock);
    while (self->n_open) {
        emlio__shard_t *shard = &self->set->shards[self->slots[0]];
        atomic_store(&shard->is_open, false);
        s_drop(self, shard, true);
    }
    pthread_mutex_unlock(&self->lock);
    if (self->started) {
        atomic_store(&self->stopping, true);
        emlio__shard_cache_poke(self);
        pthread_join(self->thread, NULL);
    }
    if (self->sigfd >= 0)
        close(self->sigfd);
    if (self->wakefd >= 0)
        close(self->wakefd);
    pthread_cond_destroy(&self->ready_cond);
    pthread_mutex_destroy(&self->lock);
    emlio_free(self->slots);
    emlio_free(self->by_fd);
    emlio_free(self);
    *self_p = NULL;
}

bool
emlio__shard_cache_leases_work(const emlio__shard_cache_t *self)
{
    return atomic_load(&self->leases_work);
}
