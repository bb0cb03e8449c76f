/* shardset_load.c - loading the shard files of a directory in parallel,
 * their records from the dataset index (dsindex.h) when it is current.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#if defined(__GLIBC__)
#    include <malloc.h>
#endif
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>

#include "shard_cache.h"
#include "shardset.h"

/* Threads that stat, map and (re)index shards. A cached start is a stat
 * and a lookup per shard; a first start is scans bound by memory
 * bandwidth, which more than a few threads do not speed up. */
#define S_MAX_THREADS       4
/* Below this many shards per thread, a thread costs more than it saves. */
#define S_SHARDS_PER_THREAD 16

/* One load of shard files: shared by its threads. */
typedef struct {
    emlio__shardset_t *set;
    const char *dir;
    size_t first; /* the shards of this load: set->shards[first, set->n) */
    const emlio__shardset_opts_t *opts;
    const char *prune_key; /* what tables must be pruned for: "-", "*", field */
    emlio__shardset_log_fn *log;
    void *userdata;
    pthread_mutex_t lock;    /* the log and the first error */
    struct stat *st;         /* each shard as it was loaded */
    bool *from_index;        /* whose records came from the dataset index */
    atomic_size_t next;      /* the next shard to take */
    atomic_size_t opened;    /* shards opened here (not from the index) */
    atomic_size_t leased;    /* of those, shards that got a read lease */
    atomic_size_t unwritten; /* .idx files that could not be written */
    atomic_bool failed;
    size_t err_at; /* the first shard (in order) that failed */
    int rc;
    char *errbuf;
} s_load_t;

/* The caller's log, one line at a time from any thread. */
static void
s_log(void *userdata, const char *msg)
{
    s_load_t *load = userdata;
    if (!load->log)
        return;
    pthread_mutex_lock(&load->lock);
    load->log(load->userdata, msg);
    pthread_mutex_unlock(&load->lock);
}

/* A shard's .idx could not be written: the first failure is logged with
 * what to do about it, the rest only counted (a read-only data directory
 * fails every shard alike; s_log_unwritten says how many). */
static void
s_idx_unwritten(s_load_t *load, const char *idx, int wrc)
{
    if (atomic_fetch_add(&load->unwritten, 1) > 0)
        return;
    const char *advice = emlio__write_advice(
        wrc,
        "; pass --no-write-index not to try (the dataset index, which "
        "--index-dir can place elsewhere, keeps the same tables)",
        "; the file system is full: the next start scans the shard again");
    char msg[PATH_MAX + 256];
    snprintf(msg, sizeof(msg), "cannot write index '%s': %s%s", idx,
             emlio_strerror(wrc), advice);
    s_log(load, msg);
}

static void
s_log_unwritten(s_load_t *load)
{
    size_t n = atomic_load(&load->unwritten);
    if (n < 2)
        return;
    char msg[128];
    snprintf(msg, sizeof(msg),
             "%zu more .idx files could not be written (logged once)", n - 1);
    s_log(load, msg);
}

/* Loads the DALI index cached beside a mapped shard (TFRecord .idx or tar
 * wds2idx), or scans the shard and caches a new one (an empty tar gets
 * none). A stale or broken index is logged and rebuilt; a failed write is
 * only logged. Returns the record count or < 0 with errbuf set. */
static int
s_index_mapped(emlio__shard_t *shard, s_load_t *load, char *errbuf)
{
    const emlio__shardset_opts_t *opts = load->opts;
    const emlio__format_ops_t *ops = shard->ops;
    const char *path = emlio__shard_file(shard)->path;
    char idx[PATH_MAX];
    char msg[PATH_MAX + EMLIO_ERRMSG_LEN + 64];
    if (snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx))
        return emlio__seterr(errbuf, -ENAMETOOLONG, "path too long: '%s'",
                             path);
    int rc = opts->rescan ? -ENOENT : ops->load_index(shard->impl, idx);
    if (rc >= 0)
        return rc;
    if (rc != -ENOENT) {
        snprintf(msg, sizeof(msg), "ignoring index '%s': %s; rescanning", idx,
                 emlio__shard_file(shard)->err);
        s_log(load, msg);
    }
    rc = ops->scan(shard->impl, opts->verify_data);
    if (rc < 0)
        return emlio__seterr(errbuf, rc, "%s", emlio__shard_file(shard)->err);
    if (opts->write_index) {
        int wrc = ops->write_index(shard->impl, idx);
        if (wrc < 0)
            s_idx_unwritten(load, idx, wrc);
    }
    return rc;
}

/* Takes shard i's records from its dataset index entry when that still
 * describes the file; true when it did. */
static bool
s_from_index(s_load_t *load, size_t i)
{
    emlio__shard_t *shard = &load->set->shards[i];
    const emlio__dsindex_t *ix = &load->set->index;
    const emlio__dsindex_entry_t *e = shard->ops->adopt_table && ix->n
                                          ? emlio__dsindex_find(ix, shard->name)
                                          : NULL;
    if (!e || !emlio__dsindex_fresh(ix, e, &load->st[i], shard->ops->name))
        return false;
    return shard->ops->adopt_table(shard->impl, emlio__dsindex_table(ix, e),
                                   (size_t)e->table_len, e->records, e->size,
                                   e->table_crc, load->prune_key) >= 0;
}

/* A shard served from the dataset index whose DALI sidecar is gone gets
 * it back, as a scan would have written it (DALI users read them); one
 * fstatat per shard, no byte of the shard. */
static void
s_keep_sidecar(emlio__shard_t *shard, s_load_t *load)
{
    char rel[PATH_MAX], idx[PATH_MAX];
    const char *path = emlio__shard_file(shard)->path;
    struct stat st;
    if (snprintf(rel, sizeof(rel), "%s.idx", shard->name) >= (int)sizeof(rel) ||
        snprintf(idx, sizeof(idx), "%s.idx", path) >= (int)sizeof(idx) ||
        fstatat(load->set->root.fd, rel, &st, AT_SYMLINK_NOFOLLOW) == 0 ||
        errno != ENOENT)
        return;
    int rc = shard->ops->write_index(shard->impl, idx);
    if (rc < 0)
        s_idx_unwritten(load, idx, rc);
}

/* Prunes shard i here, in parallel, so that the table the dataset index
 * keeps is the pruned one (the format remembers the outcome: the load's
 * own prune pass then only counts and logs). A table from the index that
 * the prune changed (it was stored unpruned) counts as rescanned, so the
 * index is written again. */
static void
s_prune_one(s_load_t *load, size_t i)
{
    emlio__shard_t *shard = &load->set->shards[i];
    char example[PATH_MAX + 64];
    if (!load->opts->prune || !shard->ops->prune)
        return;
    size_t len = 0;
    const void *before =
        load->from_index[i] ? shard->ops->index_table(shard->impl, &len) : NULL;
    shard->ops->prune(shard->impl, load->opts->prune_field, example,
                      sizeof(example));
    if (before && shard->ops->index_table(shard->impl, &len) != before)
        load->from_index[i] = false;
}

/* Stats shard i and takes its records from the dataset index, leaving the
 * file closed for the shard cache to open at its first read; or else opens
 * it through the cache (leased when the daemon asks), takes its records
 * from its .idx file or a scan, and gives it back to the cache. */
static int
s_load_one(s_load_t *load, size_t i, char *errbuf)
{
    emlio__shardset_t *set = load->set;
    emlio__shard_t *shard = &set->shards[i];
    const char *path = emlio__shard_file(shard)->path;
    struct stat *st = &load->st[i];
    /* The identity the index entry is checked against (and written with):
     * taken before any open, so a file replaced in between is found stale
     * at the next start rather than indexed under the wrong identity. */
    if (fstatat(set->root.fd, shard->name, st,
                set->root.follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0)
        return emlio__seterr(errbuf, -errno, "cannot stat '%s': %s", path,
                             strerror(errno));
    load->from_index[i] = !load->opts->rescan && s_from_index(load, i);
    if (load->from_index[i]) {
        emlio__shard_cache_adopt(set->cache, shard, st);
        if (load->opts->write_index)
            s_keep_sidecar(shard, load);
        s_prune_one(load, i);
        return 0;
    }
    int rc = emlio__shard_cache_first_open(set->cache, shard, path, errbuf);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&load->opened, 1);
    atomic_fetch_add(&load->leased, shard->leased);
    rc = s_index_mapped(shard, load, errbuf);
    /* The scan faulted in the whole mapping: drop this process's page
     * table entries (the page cache keeps the data), so a first start's
     * RSS is not the dataset's size. */
    if (rc > 0)
        emlio__shard_advise(shard, 0, (size_t)rc, EMLIO_ADVISE_DONTNEED);
    if (rc >= 0)
        s_prune_one(load, i);
    emlio__shard_release(shard);
    return rc < 0 ? rc : 0;
}

/* A thread of the load: takes shards in order until none is left or one
 * failed; the failure of the earliest shard is the one reported. */
static void *
s_worker(void *arg)
{
    s_load_t *load = arg;
    char errbuf[EMLIO_ERRMSG_LEN];
    for (;;) {
        size_t i = atomic_fetch_add(&load->next, 1);
        if (i >= load->set->n || atomic_load(&load->failed))
            break;
        int rc = emlio__shardset_cancelled(load->opts)
                     ? emlio__seterr(errbuf, -ECANCELED,
                                     "loading '%s' was interrupted", load->dir)
                     : s_load_one(load, i, errbuf);
        if (rc >= 0)
            continue;
        pthread_mutex_lock(&load->lock);
        if (i < load->err_at) {
            load->err_at = i;
            load->rc = rc;
            snprintf(load->errbuf, EMLIO_ERRMSG_LEN, "%s", errbuf);
        }
        pthread_mutex_unlock(&load->lock);
        atomic_store(&load->failed, true);
    }
    return NULL;
}

/* Runs s_worker on this thread and up to S_MAX_THREADS - 1 more. */
static void
s_run_workers(s_load_t *load)
{
    size_t shards = load->set->n - load->first;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    size_t want =
        EMLIO_MIN((size_t)S_MAX_THREADS, shards / S_SHARDS_PER_THREAD);
    want = EMLIO_MIN(want, cpus > 0 ? (size_t)cpus : 1);
    pthread_t threads[S_MAX_THREADS];
    size_t started = 0;
    while (started + 1 < want &&
           pthread_create(&threads[started], NULL, s_worker, load) == 0)
        started++;
    s_worker(load);
    for (size_t t = 0; t < started; t++)
        pthread_join(threads[t], NULL);
}

/* Opens the dataset index at path, unless a rescan is asked for; a broken
 * one is logged and left out (it is rebuilt). */
static void
s_open_index(s_load_t *load, const char *path, const struct stat *root)
{
    char err[EMLIO_ERRMSG_LEN];
    if (load->opts->rescan)
        return;
    int rc = emlio__dsindex_open(&load->set->index, path, root, err);
    if (rc < 0 && rc != -ENOENT) {
        char msg[EMLIO_ERRMSG_LEN + 64];
        snprintf(msg, sizeof(msg), "%s; rebuilding it", err);
        s_log(load, msg);
    }
}

uint64_t
emlio__shard_identity(emlio__shardset_t *self, size_t i)
{
    emlio__shard_t *shard = &self->shards[i];
    const uint64_t known = UINT64_C(1) << 32;
    if (shard->ops->identity)
        return known | shard->ops->identity(shard->impl);
    if (!shard->ops->index_table)
        return 0;
    size_t len = 0;
    const void *table = shard->ops->index_table(shard->impl, &len);
    if (!table)
        return 0;
    /* A table still borrowed from the index has its CRC there: a start
     * touches no table (it is checked on first use). */
    const emlio__dsindex_entry_t *e =
        emlio__dsindex_find(&self->index, shard->name);
    if (e && table == emlio__dsindex_table(&self->index, e))
        return known | e->table_crc;
    return known | emlio_crc32c(0, table, len);
}

/* Writes the dataset index of this load's shards and takes every table
 * from the new file, so that rescanned shards give back their heap
 * tables. A failure is logged: the daemon runs, the next start rescans. */
static void
s_write_index(s_load_t *load, const char *path, const struct stat *root)
{
    emlio__shardset_t *set = load->set;
    emlio__dsindex_item_t *items =
        emlio_reallocarray(NULL, set->n - load->first + 1, sizeof(*items));
    size_t n = 0;
    for (size_t i = load->first; items && i < set->n; i++) {
        const emlio__shard_t *shard = &set->shards[i];
        if (!shard->ops->index_table)
            continue;
        emlio__dsindex_item_t *it = &items[n++];
        *it = (emlio__dsindex_item_t){
            .name = shard->name,
            .format = shard->ops->name,
            .st = &load->st[i],
            .records = emlio__shard_count(shard),
        };
        it->table = shard->ops->index_table(shard->impl, &it->table_len);
        const emlio__dsindex_entry_t *e =
            emlio__dsindex_find(&set->index, shard->name);
        it->crc_known = e && it->table == emlio__dsindex_table(&set->index, e);
        it->crc = e ? e->table_crc : 0;
        if (!it->table) {
            emlio_free(items);
            items = NULL;
        }
    }
    int rc = items ? emlio__dsindex_write(path, root, items, n) : -ENOMEM;
    emlio_free(items);
    emlio__dsindex_t fresh;
    char err[EMLIO_ERRMSG_LEN];
    if (rc == 0)
        rc = emlio__dsindex_open(&fresh, path, root, err);
    if (rc < 0) {
        const char *advice = emlio__write_advice(
            rc, " (give emliod a writable --index-dir)",
            " (the file system is full: free space there, or give "
            "--index-dir on another one)");
        char msg[PATH_MAX + 320];
        snprintf(msg, sizeof(msg),
                 "cannot write dataset index '%s': %s; the next start reads "
                 "the shards' indexes again%s",
                 path, emlio_strerror(rc), advice);
        s_log(load, msg);
        return;
    }
    emlio__dsindex_t old = set->index;
    set->index = fresh;
    bool old_used = false;
    for (size_t i = load->first; i < set->n; i++) {
        bool before = load->from_index[i];
        load->from_index[i] = s_from_index(load, i);
        old_used |= before && !load->from_index[i];
    }
    if (old_used) /* a table still points into it: unmapped at release */
        set->index_prev = old;
    else
        emlio__dsindex_close(&old);
#if defined(__GLIBC__)
    /* The scans' tables (16 B a record) were freed into the threads'
     * arenas, which keep them: give the pages back, or a first start
     * leaves the heap a cached start does without. */
    malloc_trim(0);
#endif
}

/* Adds one shard per found name (names taken over), unloaded. */
static int
s_add_shards(emlio__shardset_t *self, const char *dir, emlio__names_t *found)
{
    for (size_t k = 0; emlio__formats[k]; k++) {
        const emlio__format_ops_t *ops = emlio__formats[k];
        for (size_t j = 0; j < found[k].n; j++) {
            char path[PATH_MAX];
            emlio__shard_t *shard = &self->shards[self->n];
            snprintf(path, sizeof(path), "%s/%s", dir, found[k].v[j]);
            shard->name = found[k].v[j];
            shard->ops = ops;
            shard->fd = -1;
            shard->cache = self->cache; /* opens and closes it from now on */
            found[k].v[j] = NULL;
            self->n++; /* counted now, so release frees it */
            shard->impl = ops->create(path);
            if (!shard->impl)
                return EMLIO_ENOMEM;
            emlio__mapfile_confine(emlio__shard_file(shard), &self->root,
                                   shard->name);
        }
    }
    return 0;
}

/* Whether the index file must be written: a table not from it, or an
 * entry for a shard that is gone. */
static bool
s_index_stale(const s_load_t *load)
{
    const emlio__shardset_t *set = load->set;
    size_t indexable = 0, adopted = 0;
    for (size_t i = load->first; i < set->n; i++) {
        indexable += set->shards[i].ops->index_table != NULL;
        adopted += load->from_index[i];
    }
    return indexable && (adopted < indexable || set->index.n != adopted);
}

int
emlio__shardset_load_files(emlio__shardset_t *self, const char *dir,
                           const struct stat *root, emlio__names_t *found,
                           const emlio__shardset_opts_t *opts,
                           emlio__shardset_log_fn *log, void *userdata,
                           char *errbuf)
{
    size_t files = 0;
    for (size_t k = 0; emlio__formats[k]; k++)
        files += found[k].n;
    const char *prune_key = !opts->prune        ? "-"
                            : opts->prune_field ? opts->prune_field
                                                : "*";
    s_load_t load = { .set = self,
                      .dir = dir,
                      .prune_key = prune_key,
                      .first = self->n,
                      .opts = opts,
                      .log = log,
                      .userdata = userdata,
                      .err_at = SIZE_MAX,
                      .errbuf = errbuf };
    int rc = emlio__shardset_grow(self, files);
    if (rc == 0)
        rc = s_add_shards(self, dir, found);
    load.st = emlio_calloc(self->n + 1, sizeof(*load.st));
    load.from_index = emlio_calloc(self->n + 1, sizeof(*load.from_index));
    if (rc < 0 || !load.st || !load.from_index) {
        emlio_free(load.st);
        emlio_free(load.from_index);
        return emlio__seterr(errbuf, EMLIO_ENOMEM, "out of memory");
    }
    pthread_mutex_init(&load.lock, NULL);
    atomic_init(&load.next, load.first);
    atomic_init(&load.opened, 0);
    atomic_init(&load.leased, 0);
    atomic_init(&load.unwritten, 0);
    char path[PATH_MAX];
    bool have_path =
        emlio__dsindex_path(dir, opts->index_dir, path, sizeof(path)) == 0;
    if (have_path)
        s_open_index(&load, path, root);
    s_run_workers(&load);
    s_log_unwritten(&load);
    rc = load.rc;
    for (size_t i = load.first; i < self->n; i++)
        self->rescanned += !load.from_index[i];
    if (rc == 0) {
        self->mapped += self->n - load.first;
        self->opened += atomic_load(&load.opened);
        self->leased += atomic_load(&load.leased);
    }
    if (rc == 0 && have_path && opts->write_index && s_index_stale(&load))
        s_write_index(&load, path, root);
    for (size_t i = load.first; i < self->n; i++)
        self->indexed += load.from_index[i];
    pthread_mutex_destroy(&load.lock);
    emlio_free(load.st);
    emlio_free(load.from_index);
    return rc;
}
