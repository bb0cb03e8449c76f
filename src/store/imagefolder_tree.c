/* imagefolder_tree.c - an ImageFolder tree read as shards: its class
 * directories (one shard each, labelled by their sorted order), listed
 * from the file-list cache or walked, with what was left out logged.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include "format.h"
#include "imagefolder.h"
#include "iobuf.h"
#include "ioengine.h"

/* What the listing of the root left out, for the log. */
typedef struct s_left {
    size_t links; /* symlinks not followed (or leading out) */
    char link[256];
    size_t unread; /* directories that cannot be opened */
    char dir[256];
} s_left_t;

/* Whether the load was asked to stop (SIGTERM while loading): then
 * errbuf says so. Asked once per class, so a daemon stops within a class
 * or two whatever the tree's size. */
static bool
s_cancelled(const emlio__tree_load_t *load, const char *dir, char *errbuf)
{
    if (!load->cancel || !atomic_load(load->cancel))
        return false;
    emlio__seterr(errbuf, -ECANCELED, "loading '%s' was interrupted", dir);
    return true;
}

/* The class directories of an ImageFolder root: its non-hidden
 * subdirectories, sorted; symlinks to directories only when the root
 * follows them (torchvision's os.scandir(...).is_dir() does) and only to
 * directories inside it. A directory that cannot be opened (lost+found
 * under a non-root daemon, when the root is a mount point) is no class:
 * left out, with a warning, as are links not followed (counted in left). */
static int
s_classes(const emlio__tree_load_t *load, const char *root, emlio__names_t *out,
          s_left_t *left, char *errbuf)
{
    const emlio__root_t *base = load->root;
    struct stat st;
    int fd = emlio__open_beneath(base, ".", EMLIO__OPEN_DIR, &st);
    DIR *dir = fd >= 0 ? fdopendir(fd) : NULL;
    if (!dir) {
        int rc = fd >= 0 ? -errno : fd;
        if (fd >= 0)
            close(fd);
        return emlio__seterr(errbuf, rc, "cannot open directory '%s': %s", root,
                             emlio__open_why(rc));
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        /* Three system calls a class: 20,000 took most of a second. */
        if (s_cancelled(load, root, errbuf)) {
            rc = -ECANCELED;
            break;
        }
        if (e->d_name[0] == '.' ||
            fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            int lfd = base->follow ? emlio__open_beneath(base, e->d_name,
                                                         EMLIO__OPEN_DIR, &st)
                                   : -ELOOP;
            if (lfd >= 0)
                close(lfd);
            else if (lfd != -ENOTDIR && left->links++ == 0)
                (void)!snprintf(left->link, sizeof(left->link), "%s",
                                e->d_name);
            if (lfd < 0)
                continue;
        } else if (!S_ISDIR(st.st_mode)) {
            continue;
        } else {
            int dfd =
                emlio__open_beneath(base, e->d_name, EMLIO__OPEN_DIR, &st);
            if (dfd >= 0)
                close(dfd);
            if (dfd == -EACCES || dfd == -EPERM) {
                if (left->unread++ == 0)
                    (void)!snprintf(left->dir, sizeof(left->dir), "%s",
                                    e->d_name);
                continue;
            }
        }
        rc = emlio__names_push(out, e->d_name);
    }
    closedir(dir);
    if (rc == 0)
        emlio__names_sort(out);
    return rc;
}

/* The listing cache can be large (ImageNet's is ~52 MB), never this. */
#define S_CACHE_MAX ((uint64_t)1 << 30)

/* Reads the listing cache beneath the root into a fresh buffer: a FIFO,
 * a link out of the root, a directory or a huge file is refused. One
 * read of the size fstat gave, then one more to see the end: a cache
 * being replaced is read whole or found changed. */
static int
s_slurp(const emlio__root_t *base, const char *rel, uint8_t **out, size_t *len)
{
    struct stat st;
    int fd = emlio__open_beneath(base, rel, 0, &st);
    if (fd < 0)
        return fd;
    if ((uint64_t)st.st_size > S_CACHE_MAX) {
        close(fd);
        return -EFBIG;
    }
    size_t want = (size_t)st.st_size;
    uint8_t *buf = emlio_malloc(want + 1);
    size_t got = 0;
    int rc = buf ? 0 : -ENOMEM;
    while (rc == 0 && got < want + 1) {
        ssize_t r = read(fd, buf + got, want + 1 - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : 0;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (rc == 0 && got != want)
        rc = -ESTALE;
    if (rc < 0) {
        emlio_free(buf);
        return rc;
    }
    *out = buf;
    *len = want;
    return 0;
}

/* Fills what it can of folders[0, n) from ROOT/.emlio-files (the others
 * are left to list: all of them when the cache is missing or unusable);
 * one log line when it is there and not wholly used. */
static void
s_cache_load(const emlio__root_t *base, const char *cache,
             emlio__folder_t **folders, size_t n, bool *rewrite,
             emlio__shardset_log_fn *log, void *userdata)
{
    uint8_t *data = NULL;
    size_t len = 0;
    char why[EMLIO_ERRMSG_LEN] = "";
    *rewrite = true;
    int rc = s_slurp(base, ".emlio-files", &data, &len);
    if (rc == -ENOENT)
        return;
    if (rc < 0)
        snprintf(why, sizeof(why), "cannot read it: %s", emlio__open_why(rc));
    else
        rc = emlio__folder_cache_load(&data, len, base->follow, folders, n,
                                      rewrite, why);
    emlio_free(data);
    char msg[PATH_MAX + EMLIO_ERRMSG_LEN + 96];
    if (rc < 0)
        snprintf(msg, sizeof(msg),
                 "file list '%s' does not describe the tree (%s); listing "
                 "the tree",
                 cache, why[0] ? why : emlio_strerror(rc));
    else if (rc > 0)
        snprintf(msg, sizeof(msg),
                 "file list '%s' is out of date for %d of %zu classes (%s); "
                 "listing those",
                 cache, rc, n, why);
    if (rc != 0 && log)
        log(userdata, msg);
}

/* Logs what the walk left out: symlinks and unreadable subdirectories,
 * one line each with a count and an example. */
static void
s_log_skipped(emlio__folder_t *const *folders, size_t n, const s_left_t *left,
              emlio__shardset_log_fn *log, void *userdata)
{
    size_t links = left->links, unread = left->unread, empty = 0;
    const char *link = left->link, *dir = left->dir, *file = "";
    for (size_t i = 0; i < n; i++) {
        const char *ex;
        size_t k = emlio__folder_links(folders[i], &ex);
        if (k && !links)
            link = ex;
        links += k;
        k = emlio__folder_unreadable(folders[i], &ex);
        if (k && !unread)
            dir = ex;
        unread += k;
        k = emlio__folder_empty(folders[i], &ex);
        if (k && !empty)
            file = ex;
        empty += k;
    }
    char msg[2 * PATH_MAX];
    if (links && log) {
        snprintf(msg, sizeof(msg),
                 "left out %zu symbolic link%s (e.g. '%s'): links are "
                 "followed only with --follow-symlinks, and only to regular "
                 "files and directories inside the data root",
                 links, links == 1 ? "" : "s", link);
        log(userdata, msg);
    }
    if (unread && log) {
        snprintf(msg, sizeof(msg),
                 "left out %zu unreadable director%s (e.g. '%s')", unread,
                 unread == 1 ? "y" : "ies", dir);
        log(userdata, msg);
    }
    if (empty && log) {
        snprintf(msg, sizeof(msg),
                 "left out %zu empty image file%s (e.g. '%s'): 0 bytes are "
                 "no image",
                 empty, empty == 1 ? "" : "s", file);
        log(userdata, msg);
    }
}

/* The class directories as shards (folders[i] for classes->v[i], the
 * shard set's once added): their listing from ROOT/.emlio-files when it
 * still describes the tree, else from a walk (then cached). */
static int
s_load_folders(const emlio__tree_load_t *load, const char *dir,
               const emlio__names_t *classes, emlio__folder_t **folders,
               char *errbuf)
{
    int rc = 0;
    for (size_t i = 0; i < classes->n && rc == 0; i++) {
        /* 20,000 classes took a second to add under ASan, and a SIGTERM
         * meanwhile waited for all of them. */
        if (s_cancelled(load, dir, errbuf))
            return -ECANCELED;
        emlio__folder_t *folder =
            emlio__folder_new(dir, classes->v[i], (int64_t)i, load->root);
        rc =
            folder ? load->add(load->arg, classes->v[i], folder) : EMLIO_ENOMEM;
        if (rc == 0)
            folders[i] = folder;
    }
    char cache[PATH_MAX];
    snprintf(cache, sizeof(cache), "%s/.emlio-files", dir);
    bool rewrite = true;
    if (rc == 0 && !load->rescan)
        s_cache_load(load->root, cache, folders, classes->n, &rewrite,
                     load->log, load->userdata);
    /* Only the classes the cache did not describe are walked. */
    for (size_t i = 0; i < classes->n && rc >= 0; i++) {
        if (emlio__folder_cached(folders[i]))
            continue;
        if (s_cancelled(load, dir, errbuf))
            rc = -ECANCELED;
        else if ((rc = emlio__folder_scan(folders[i])) < 0)
            emlio__seterr(errbuf, rc, "%s", emlio__folder_errmsg(folders[i]));
    }
    for (size_t i = 0; i < classes->n && rc >= 0; i++)
        if (emlio__folder_count(folders[i]) == 0) /* as torchvision */
            rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                               "class directory '%s/%s' has no images", dir,
                               classes->v[i]);
    if (rc >= 0 && rewrite && load->write_index) {
        int wrc = emlio__folder_cache_write(cache, load->root->follow, folders,
                                            classes->n);
        if (wrc < 0 && load->log) {
            /* The file list lives in the data directory, whatever
             * --index-dir says: the remedy for a denied write is not to
             * try. */
            const char *advice =
                emlio__write_advice(wrc, "; pass --no-write-index not to try",
                                    "; the file system is full");
            char msg[PATH_MAX + 192];
            snprintf(msg, sizeof(msg),
                     "cannot write file list '%s': %s; the next start walks "
                     "the class directories again%s",
                     cache, emlio_strerror(wrc), advice);
            load->log(load->userdata, msg);
        }
    }
    return rc < 0 ? rc : 0;
}

/* Every read opens its file (nothing is held between reads), so serving
 * needs one free descriptor per reader thread besides the daemon's own
 * (~22 when listening: ZeroMQ's sockets and pollers) and each client's:
 * 64 free at load. Fewer and every read would fail "too many open files"
 * after "listening"; refuse to start instead, saying so. */
#define S_FD_HEADROOM 64

static int
s_fd_headroom(const emlio__root_t *base, char *errbuf)
{
    int fds[S_FD_HEADROOM];
    int n = 0;
    while (n < S_FD_HEADROOM &&
           (fds[n] = fcntl(base->fd, F_DUPFD_CLOEXEC, 0)) >= 0)
        n++;
    int err = errno;
    for (int i = 0; i < n; i++)
        close(fds[i]);
    if (n == S_FD_HEADROOM)
        return 0;
    if (err != EMFILE && err != ENFILE)
        return 0; /* not a limit: the reads will say what is wrong */
    struct rlimit lim = { 0 };
    getrlimit(RLIMIT_NOFILE, &lim);
    return emlio__seterr(errbuf, -EMFILE,
                         "too few file descriptors to serve an ImageFolder: "
                         "%d free of a limit of %llu (each read opens its "
                         "file; at least %d must be free at start-up): raise "
                         "ulimit -n or LimitNOFILE=",
                         n, (unsigned long long)lim.rlim_cur, S_FD_HEADROOM);
}

int
emlio__folder_load_tree(const emlio__tree_load_t *load, const char *dir,
                        char *errbuf)
{
    emlio__names_t classes = { 0 };
    s_left_t left = { 0 };
    emlio__folder_t **folders = NULL;
    int rc = s_classes(load, dir, &classes, &left, errbuf);
    if (rc == 0 && classes.n) {
        folders = emlio_calloc(classes.n, sizeof(*folders));
        rc = folders ? s_load_folders(load, dir, &classes, folders, errbuf)
                     : EMLIO_ENOMEM;
    }
    if (rc >= 0)
        s_log_skipped(folders, classes.n, &left, load->log, load->userdata);
    if (rc >= 0 && load->root->fd >= 0)
        rc = s_fd_headroom(load->root, errbuf);
    size_t n = classes.n;
    emlio_free(folders);
    emlio__names_release(&classes);
    return rc < 0 ? rc : (int)n;
}
