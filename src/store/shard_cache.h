/* shard_cache.h - mapped shards opened on demand under a descriptor budget,
 * and the thread that receives their lease breaks.
 * SPDX-License-Identifier: MIT
 *
 * A daemon serving 100,000 shards cannot keep one descriptor, one mapping
 * and one lease per shard for its whole life: the open-file limit
 * (RLIMIT_NOFILE) and vm.max_map_count (65,530 by default) forbid it. The
 * cache keeps at most `budget` mapped shards open (descriptor + read lease
 * + mapping). A reader that needs a closed shard opens it (and, when the
 * budget is spent, first closes the least recently used idle shard: CLOCK,
 * the second-chance approximation of LRU, so the read path sets one bit
 * and takes no lock). A shard in use (users > 0: a reader, or a zero-copy
 * frame ZeroMQ still holds) is never closed. When every open shard is in
 * use, the reader does not wait (a wait could deadlock on frames a slow
 * client holds): the shard is opened for copying reads only (no lease, no
 * mapping; pread into private copies), so it pins nothing and is closed
 * at the next miss or by the watcher. Mappings thus never exceed the
 * budget; descriptors exceed it by at most the readers at work. Every
 * reopen checks that
 * the path still names the file seen at load (device, inode, size, mtime);
 * otherwise the shard is marked changed, refused and logged once.
 *
 * Lease breaks are not polled: each descriptor asks (F_SETSIG +
 * F_SETOWN_EX) for a real-time signal carrying its number (si_fd) on a
 * watcher thread that keeps every signal blocked and reads them from a
 * signalfd. No signal handler is installed and no other thread of the
 * process sees these signals. When the kernel's queue of real-time signals
 * overflows it sends SIGIO instead; the watcher then checks every open
 * shard's lease. Otherwise the watcher wakes once a second to close shards
 * over budget and to stat a bounded number of open shards (a path renamed
 * over, an unleased shard that changed size): idle CPU does not grow with
 * the shard count.
 *
 * Thread rules: emlio__shard_acquire (shardset.h) may be called from any
 * thread; the functions below are called by the shard set only.
 */
#ifndef EMLIO_SHARD_CACHE_H
#define EMLIO_SHARD_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "format.h"

/* The shard set's types (shardset.h), named here without its header. */
typedef struct emlio__shard emlio__shard_t;
typedef struct emlio__shardset emlio__shardset_t;

typedef struct emlio__shard_cache emlio__shard_cache_t;

/* Descriptors the daemon keeps for everything but shards and client
 * connections (ZeroMQ's sockets, pipes and epoll sets, logs, index files,
 * the data root: about 25 at start) when it derives the budget from the
 * open-file limit; connections get a quarter of the limit on top. */
#define EMLIO__SHARD_CACHE_RESERVE    64
/* The smallest budget (or the shard count, when smaller): a batch of a
 * shuffled plan reads from several shards at once; fewer open shards
 * would reopen on almost every read. */
#define EMLIO__SHARD_CACHE_MIN_BUDGET 8

/* What the cache has done, for the start-up log and tests. */
typedef struct emlio__shard_cache_stats {
    size_t budget;
    size_t open; /* shards open now (descriptor and mapping) */
    size_t peak; /* most shards open at once */
    uint64_t opens;
    uint64_t closes;
    uint64_t copy_opens; /* of opens, for copying reads (budget spent) */
} emlio__shard_cache_stats_t;

/* The budget to use: asked when not 0, else, for a cache that leases (the
 * daemon's), derived from RLIMIT_NOFILE
 * (the soft limit, less EMLIO__SHARD_CACHE_RESERVE and a quarter of the
 * limit for clients) and from vm.max_map_count (at most a quarter of it).
 * A limit too small for EMLIO__SHARD_CACHE_MIN_BUDGET shards (or for all
 * of the set's shards, when fewer), or an asked
 * budget that does not fit under it, is EMLIO_EINVAL with errbuf saying
 * what to raise. Returns 0. */
int emlio__shard_cache_budget(size_t asked, bool lease, size_t shards,
                              size_t *budget, char *errbuf);

/* Creates the cache of set's mapped shards with room for budget of them
 * open at once. lease (the daemon): open shards keep their descriptor and
 * a read lease, and the watcher thread starts (idle until armed); without
 * it (the tools) a shard keeps only its mapping, descriptors are closed
 * at once, nothing is watched, and the budget only bounds the mappings
 * (vm.max_map_count: a quarter of it by default). log
 * (with userdata) reports changed shards. grace_ms: how long frames of a
 * shard whose lease is being broken may keep its bytes before they are
 * replaced by zeros. Returns 0, EMLIO_ENOMEM or -errno (errbuf set). */
int emlio__shard_cache_new(emlio__shard_cache_t **self_p,
                           emlio__shardset_t *set, size_t budget, bool lease,
                           uint32_t grace_ms, emlio__shardset_log_fn *log,
                           void *userdata, char *errbuf);

/* Closes every open shard (leases given back, mappings dropped), then
 * stops the watcher. Accepts NULL; sets *self_p NULL. */
void emlio__shard_cache_destroy(emlio__shard_cache_t **self_p);

/* Whether the last read lease the cache asked for was granted: what a
 * closed shard can expect when it is opened (emlio__shard_zero_copy).
 * False until a lease was asked for. Safe from any thread. */
bool emlio__shard_cache_leases_work(const emlio__shard_cache_t *self);

/* The first open of shard at load: opens it beneath the set's root, takes
 * the lease (before mapping, so no writer can shrink it unseen), records
 * the identity later reopens must match, and maps it. On success the
 * shard is open with one user (the loader's, ended by
 * emlio__shard_release). Returns 0 or < 0 with errbuf naming path. */
int emlio__shard_cache_first_open(emlio__shard_cache_t *self,
                                  emlio__shard_t *shard, const char *path,
                                  char *errbuf);

/* For a load that does not open the shard (its index read elsewhere, e.g.
 * a dataset-wide index): records st (an fstatat of the shard's file at
 * load) as the identity every open must match, and leaves the shard
 * closed, to be opened by its first reader. The format's handle must hold
 * its index and size already. */
void emlio__shard_cache_adopt(emlio__shard_cache_t *self, emlio__shard_t *shard,
                              const struct stat *st);

/* The slow path of emlio__shard_acquire: opens the shard if needed and
 * adds a user. Returns 0, -ESTALE (the shard changed on disk, now or
 * found at this reopen) or another -errno (cannot open it now, e.g.
 * -EMFILE). */
int emlio__shard_cache_acquire(emlio__shard_cache_t *self,
                               emlio__shard_t *shard);

/* Starts the watcher on the shards as they are now ordered (after the
 * load sorted them). */
void emlio__shard_cache_arm(emlio__shard_cache_t *self);

/* Wakes the watcher: a shard was marked changed and should be closed as
 * soon as its users are gone. Safe from any thread. */
void emlio__shard_cache_poke(emlio__shard_cache_t *self);

void emlio__shard_cache_stats(emlio__shard_cache_t *self,
                              emlio__shard_cache_stats_t *out);

#endif /* EMLIO_SHARD_CACHE_H */
