/* imagefolder.c - class directories of image files served as shards.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "beneath.h"
#include "imagefolder.h"

typedef struct {
    char *rel;
    uint64_t size;
    struct timespec mtime;
} s_file_t;

/* A directory walked, and its mtime: entries added, removed or renamed in
 * it change that, which is how a cached listing is found stale. */
typedef struct {
    char *rel; /* "" for the class directory itself, else "sub/" */
    struct timespec mtime;
} s_dir_t;

struct emlio__folder {
    char *root;
    char *cls;
    int64_t label;
    emlio__root_t base; /* the data root (descriptor borrowed) */
    /* What the walk left out, and one example of each for the log (short:
     * a tree has thousands of classes). */
    size_t links; /* symlinks */
    char link[256];
    size_t unreadable; /* subdirectories it could not open */
    char unread[256];
    s_file_t *files;
    size_t n;
    size_t cap;
    s_dir_t *dirs;
    size_t n_dirs;
    uint64_t bytes;
    char err[EMLIO_ERRMSG_LEN];
};

bool
emlio__folder_is_image(const char *name)
{
    /* torchvision's IMG_EXTENSIONS. */
    static const char *const exts[] = { ".jpg", ".jpeg", ".png",
                                        ".ppm", ".bmp",  ".pgm",
                                        ".tif", ".tiff", ".webp" };
    size_t n = strlen(name);
    if (name[0] == '.')
        return false;
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(exts); i++) {
        size_t m = strlen(exts[i]);
        if (n > m && strncasecmp(name + n - m, exts[i], m) == 0)
            return true;
    }
    return false;
}

emlio__folder_t *
emlio__folder_new(const char *root, const char *cls, int64_t label,
                  const emlio__root_t *base)
{
    emlio__folder_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->root = emlio_strdup(root);
    self->cls = emlio_strdup(cls);
    self->label = label;
    self->base = *base;
    if (!self->root || !self->cls)
        emlio__folder_destroy(&self);
    return self;
}

void
emlio__folder_destroy(emlio__folder_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__folder_t *self = *self_p;
    for (size_t i = 0; i < self->n; i++)
        emlio_free(self->files[i].rel);
    emlio_free(self->files);
    for (size_t i = 0; i < self->n_dirs; i++)
        emlio_free(self->dirs[i].rel);
    emlio_free(self->dirs);
    emlio_free(self->root);
    emlio_free(self->cls);
    emlio_free(self);
    *self_p = NULL;
}

static int
s_push_dir(emlio__folder_t *self, const char *rel, struct timespec mtime)
{
    s_dir_t *dirs =
        emlio_reallocarray(self->dirs, self->n_dirs + 1, sizeof(*dirs));
    if (!dirs)
        return EMLIO_ENOMEM;
    self->dirs = dirs;
    char *copy = emlio_strdup(rel);
    if (!copy)
        return EMLIO_ENOMEM;
    self->dirs[self->n_dirs++] = (s_dir_t){ copy, mtime };
    return 0;
}

static int
s_push(emlio__folder_t *self, const char *rel, uint64_t size,
       struct timespec mtime)
{
    if (self->n == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 64;
        s_file_t *files = emlio_reallocarray(self->files, cap, sizeof(*files));
        if (!files)
            return EMLIO_ENOMEM;
        self->files = files;
        self->cap = cap;
    }
    char *copy = emlio_strdup(rel);
    if (!copy)
        return EMLIO_ENOMEM;
    self->files[self->n++] = (s_file_t){ copy, size, mtime };
    self->bytes += size;
    return 0;
}

/* Opens CLASS/rel beneath the data root (rel "" is the class directory). */
static int
s_open_rel(const emlio__folder_t *self, const char *rel, unsigned flags,
           struct stat *st)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", self->cls, rel) >=
        (int)sizeof(path))
        return -ENAMETOOLONG;
    return emlio__open_beneath(&self->base, path, flags, st);
}

/* Remembers a symlink the walk left out (not following links, or one that
 * leads out of the root or to something that is not a regular file). */
static void
s_skip_link(emlio__folder_t *self, const char *child)
{
    if (self->links++ == 0)
        (void)!snprintf(self->link, sizeof(self->link), "%.120s/%.120s",
                        self->cls, child);
}

/* Walks CLASS/rel ("" or "sub/"), following no symlinked directories.
 * light: trust the directory entry's type and stat nothing (checking a
 * cached listing's names); sizes and mtimes are then left 0. */
static int
s_walk(emlio__folder_t *self, const char *rel, int depth, bool light)
{
    if (depth > 32)
        return 0;
    struct stat dst;
    int fd = s_open_rel(self, rel, EMLIO__OPEN_DIR, &dst);
    if (fd < 0 && depth > 0 && (fd == -EACCES || fd == -EPERM)) {
        /* An unreadable subdirectory (lost+found under a non-root
         * daemon) is left out, as find(1) goes on; the class directory
         * itself must be readable. */
        if (self->unreadable++ == 0)
            (void)!snprintf(self->unread, sizeof(self->unread), "%.120s/%.120s",
                            self->cls, rel);
        return 0;
    }
    if (fd < 0)
        return emlio__seterr(self->err, fd,
                             "cannot open directory '%s/%s/%s': %s", self->root,
                             self->cls, rel, emlio__open_why(fd));
    if (s_push_dir(self, rel, dst.st_mtim) < 0) {
        close(fd);
        return EMLIO_ENOMEM;
    }
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
            (int)sizeof(child))
            continue;
        struct stat st = { 0 };
        unsigned char type = e->d_type;
        if (type == DT_UNKNOWN || (!light && type != DT_DIR)) {
            if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
                continue;
            type = S_ISDIR(st.st_mode)   ? DT_DIR
                   : S_ISREG(st.st_mode) ? DT_REG
                   : S_ISLNK(st.st_mode) ? DT_LNK
                                         : DT_UNKNOWN;
        }
        if (type == DT_DIR) {
            char sub[PATH_MAX];
            if (snprintf(sub, sizeof(sub), "%s/", child) < (int)sizeof(sub))
                rc = s_walk(self, sub, depth + 1, light);
            continue;
        }
        if (!emlio__folder_is_image(e->d_name))
            continue;
        if (type == DT_LNK) {
            /* Followed only when asked, and only to a regular file inside
             * the root: the file served is the one opened. */
            int lfd =
                self->base.follow ? s_open_rel(self, child, 0, &st) : -ELOOP;
            if (lfd < 0) {
                s_skip_link(self, child);
                continue;
            }
            close(lfd);
            type = DT_REG;
        }
        if (type == DT_REG)
            rc = s_push(self, child, (uint64_t)st.st_size, st.st_mtim);
    }
    closedir(dir);
    return rc;
}

static int
s_cmp_files(const void *a, const void *b)
{
    return strcmp(((const s_file_t *)a)->rel, ((const s_file_t *)b)->rel);
}

static int
s_cmp_dirs(const void *a, const void *b)
{
    return strcmp(((const s_dir_t *)a)->rel, ((const s_dir_t *)b)->rel);
}

int
emlio__folder_scan(emlio__folder_t *self)
{
    int rc = s_walk(self, "", 0, false);
    if (rc < 0)
        return rc;
    if (self->n > 1) /* qsort(NULL, 0) is undefined */
        qsort(self->files, self->n, sizeof(*self->files), s_cmp_files);
    return self->n > INT_MAX ? EMLIO_EFORMAT : (int)self->n;
}

size_t
emlio__folder_links(const emlio__folder_t *self, const char **example)
{
    *example = self->link;
    return self->links;
}

size_t
emlio__folder_unreadable(const emlio__folder_t *self, const char **example)
{
    *example = self->unread;
    return self->unreadable;
}

size_t
emlio__folder_count(const emlio__folder_t *self)
{
    return self->n;
}

uint64_t
emlio__folder_size(const emlio__folder_t *self)
{
    return self->bytes;
}

int64_t
emlio__folder_label(const emlio__folder_t *self)
{
    return self->label;
}

const char *
emlio__folder_file(const emlio__folder_t *self, size_t i)
{
    return i < self->n ? self->files[i].rel : "";
}

uint64_t
emlio__folder_file_size(const emlio__folder_t *self, size_t i)
{
    return i < self->n ? self->files[i].size : 0;
}

const char *
emlio__folder_errmsg(const emlio__folder_t *self)
{
    return self->err;
}

int
emlio__folder_read(const emlio__folder_t *self, size_t i, uint8_t **data,
                   size_t *len)
{
    *data = NULL;
    *len = 0;
    if (i >= self->n)
        return EMLIO_ENOTFOUND;
    const s_file_t *f = &self->files[i];
    /* Beneath the root, regular, never blocking: a file replaced by a
     * symlink out of the root or by a FIFO since the listing is refused
     * as a changed file. */
    struct stat st;
    int fd = s_open_rel(self, f->rel, EMLIO__OPEN_NOATIME, &st);
    if (fd == EMLIO_EFORMAT || fd == -ELOOP || fd == -EXDEV || fd == -EISDIR)
        return EMLIO_EFORMAT;
    if (fd < 0)
        return fd;
    /* The listing may come from a cache: a file rewritten since (size or
     * mtime) is reported, not served as something the list did not see. */
    if ((uint64_t)st.st_size != f->size ||
        st.st_mtim.tv_sec != f->mtime.tv_sec ||
        st.st_mtim.tv_nsec != f->mtime.tv_nsec) {
        close(fd);
        return EMLIO_EFORMAT;
    }
    /* One byte more than listed: a grown file reads long, a shrunk one
     * short; either is a changed file. */
    size_t want = (size_t)f->size;
    uint8_t *buf = emlio_malloc(want + 1);
    if (!buf) {
        close(fd);
        return EMLIO_ENOMEM;
    }
    size_t got = 0;
    int rc = 0;
    while (got < want + 1) {
        ssize_t r = pread(fd, buf + got, want + 1 - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            rc = -errno;
            break;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (rc == 0 && got != want)
        rc = EMLIO_EFORMAT;
    if (rc < 0) {
        emlio_free(buf);
        return rc;
    }
    *data = buf;
    *len = want;
    return 0;
}

/* ---- the listing cache ------------------------------------------------- */

#define CACHE_MAGIC "emlio-imagefolder 1\n"

static bool
s_plain(const char *name)
{
    return !strpbrk(name, "\t\n\r");
}

int
emlio__folder_cache_write(const char *path, struct timespec root_mtime,
                          emlio__folder_t *const *folders, size_t n)
{
    emlio_buf_t text = EMLIO_BUF_INIT;
    int rc = emlio_buf_addf(&text, CACHE_MAGIC "R\t%lld\t%ld\n",
                            (long long)root_mtime.tv_sec, root_mtime.tv_nsec);
    for (size_t c = 0; c < n && rc == 0; c++) {
        const emlio__folder_t *f = folders[c];
        if (!s_plain(f->cls))
            rc = -EINVAL;
        else
            rc = emlio_buf_addf(&text, "C\t%s\n", f->cls);
        for (size_t i = 0; i < f->n_dirs && rc == 0; i++)
            rc = s_plain(f->dirs[i].rel)
                     ? emlio_buf_addf(&text, "D\t%lld\t%ld\t%s\n",
                                      (long long)f->dirs[i].mtime.tv_sec,
                                      f->dirs[i].mtime.tv_nsec, f->dirs[i].rel)
                     : -EINVAL;
        for (size_t i = 0; i < f->n && rc == 0; i++)
            rc =
                s_plain(f->files[i].rel)
                    ? emlio_buf_addf(&text, "F\t%" PRIu64 "\t%lld\t%ld\t%s\n",
                                     f->files[i].size,
                                     (long long)f->files[i].mtime.tv_sec,
                                     f->files[i].mtime.tv_nsec, f->files[i].rel)
                    : -EINVAL;
    }
    if (rc == 0)
        rc = emlio__write_file_atomic(path, text.data, text.len);
    emlio_buf_release(&text);
    return rc == EMLIO_ENOMEM ? -ENOMEM : rc;
}

/* Splits the next line of [*p, end) into at most max tab-separated fields
 * (the last takes the rest of the line). Returns the field count. */
static size_t
s_fields(const char **p, const char *end, const char **f, size_t *len,
         size_t max)
{
    const char *eol = memchr(*p, '\n', (size_t)(end - *p));
    if (!eol)
        return 0;
    size_t n = 0;
    const char *s = *p;
    while (n < max) {
        const char *tab =
            n + 1 < max ? memchr(s, '\t', (size_t)(eol - s)) : NULL;
        f[n] = s;
        len[n] = (size_t)((tab ? tab : eol) - s);
        n++;
        if (!tab)
            break;
        s = tab + 1;
    }
    *p = eol + 1;
    return n;
}

static bool
s_num(const char *s, size_t len, int64_t *out)
{
    int64_t v = 0;
    if (len == 0 || len > 18)
        return false;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

static char *
s_strndup(const char *s, size_t len)
{
    char *copy = emlio_malloc(len + 1);
    if (copy) {
        memcpy(copy, s, len);
        copy[len] = '\0';
    }
    return copy;
}

/* Forgets a partly filled listing. */
static void
s_reset(emlio__folder_t *self)
{
    for (size_t i = 0; i < self->n; i++)
        emlio_free(self->files[i].rel);
    for (size_t i = 0; i < self->n_dirs; i++)
        emlio_free(self->dirs[i].rel);
    emlio_free(self->files);
    emlio_free(self->dirs);
    self->files = NULL;
    self->dirs = NULL;
    self->n = self->cap = self->n_dirs = 0;
    self->bytes = 0;
    self->links = self->unreadable = 0;
}

/* Says why a cached listing is not used (once: the first reason). */
static int
s_why(char *why, int rc, const emlio__folder_t *cls, const char *what)
{
    if (why && !why[0])
        snprintf(why, EMLIO_ERRMSG_LEN, "%s%s%s%s", what,
                 cls ? " (class '" : "", cls ? cls->cls : "", cls ? "')" : "");
    return rc;
}

/* Compares a cached listing with the class directory's entries now (names
 * only, from the directory entries: no stat per file; each file's size
 * and mtime are checked when it is read). The cache is a hint: a file it
 * lists that is not there, one it leaves out, a directory that is not
 * walked, all make it stale. */
static int
s_check_listing(emlio__folder_t *self, char *why)
{
    emlio__folder_t *now =
        emlio__folder_new(self->root, self->cls, self->label, &self->base);
    if (!now)
        return EMLIO_ENOMEM;
    int rc = s_walk(now, "", 0, true);
    if (rc == 0 && now->n > 1)
        qsort(now->files, now->n, sizeof(*now->files), s_cmp_files);
    if (rc == 0 && now->n_dirs > 1)
        qsort(now->dirs, now->n_dirs, sizeof(*now->dirs), s_cmp_dirs);
    s_dir_t *dirs = NULL;
    if (rc == 0 && self->n_dirs) {
        dirs = emlio_reallocarray(NULL, self->n_dirs, sizeof(*dirs));
        if (!dirs)
            rc = EMLIO_ENOMEM;
        else
            memcpy(dirs, self->dirs, self->n_dirs * sizeof(*dirs));
    }
    if (dirs && self->n_dirs > 1)
        qsort(dirs, self->n_dirs, sizeof(*dirs), s_cmp_dirs);
    if (rc == 0 && (now->n != self->n || now->n_dirs != self->n_dirs)) {
        char what[128];
        snprintf(what, sizeof(what),
                 "%zu files and %zu directories listed, "
                 "%zu and %zu found",
                 self->n, self->n_dirs, now->n, now->n_dirs);
        rc = s_why(why, -ESTALE, self, what);
    }
    for (size_t i = 0; rc == 0 && i < now->n; i++)
        if (strcmp(now->files[i].rel, self->files[i].rel) != 0)
            rc = s_why(why, -ESTALE, self, "other files");
    for (size_t i = 0; rc == 0 && i < now->n_dirs; i++)
        if (strcmp(now->dirs[i].rel, dirs[i].rel) != 0)
            rc = s_why(why, -ESTALE, self, "other directories");
    if (rc == 0 && self->n == 0)
        rc = s_why(why, -ESTALE, self, "no files");
    /* What the walk left out is logged whether or not the list is used. */
    self->links = now->links;
    memcpy(self->link, now->link, sizeof(self->link));
    self->unreadable = now->unreadable;
    memcpy(self->unread, now->unread, sizeof(self->unread));
    emlio_free(dirs);
    emlio__folder_destroy(&now);
    return rc;
}

int
emlio__folder_cache_load(const char *text, size_t len,
                         struct timespec root_mtime,
                         emlio__folder_t *const *folders, size_t n, char *why)
{
    if (why)
        why[0] = '\0';
    const char *p = text;
    const char *end = text + len;
    size_t ml = strlen(CACHE_MAGIC);
    if (len < ml || memcmp(text, CACHE_MAGIC, ml) != 0)
        return EMLIO_EFORMAT;
    p += ml;
    const char *f[5];
    size_t fl[5];
    int64_t a, b, c;
    if (s_fields(&p, end, f, fl, 3) != 3 || fl[0] != 1 || f[0][0] != 'R' ||
        !s_num(f[1], fl[1], &a) || !s_num(f[2], fl[2], &b))
        return EMLIO_EFORMAT;
    /* The root's own mtime changes when this cache is written into it;
     * its classes are compared one by one below instead. */
    (void)root_mtime;
    size_t cls = 0;
    emlio__folder_t *cur = NULL;
    int rc = 0;
    while (p < end && rc == 0) {
        size_t k = s_fields(&p, end, f, fl, 5);
        if (k < 2 || fl[0] != 1) {
            rc = EMLIO_EFORMAT;
        } else if (f[0][0] == 'C' && k == 2) {
            /* Recomputed from the tree: the cache must list the same
             * classes in the same order. */
            if (cls >= n || strlen(folders[cls]->cls) != fl[1] ||
                memcmp(folders[cls]->cls, f[1], fl[1]))
                rc = s_why(why, -ESTALE, NULL, "other classes");
            else
                cur = folders[cls++];
        } else if (!cur) {
            rc = EMLIO_EFORMAT;
        } else if (f[0][0] == 'D' && k >= 3) {
            /* k == 3: the class root, whose relative path is empty. */
            char *rel = k == 4 ? s_strndup(f[3], fl[3]) : emlio_strdup("");
            size_t rl = rel ? strlen(rel) : 0;
            if (!rel)
                rc = EMLIO_ENOMEM;
            else if (!s_num(f[1], fl[1], &a) || !s_num(f[2], fl[2], &b) ||
                     (rl &&
                      (rel[rl - 1] != '/' || !emlio__rel_ok(rel, rl - 1))))
                rc = s_why(why, EMLIO_EFORMAT, cur, "a bad directory line");
            else
                rc = s_push_dir(cur, rel,
                                (struct timespec){ (time_t)a, (long)b });
            emlio_free(rel);
        } else if (f[0][0] == 'F' && k == 5 && s_num(f[1], fl[1], &a) &&
                   s_num(f[2], fl[2], &b) && s_num(f[3], fl[3], &c)) {
            /* Names as a walk writes them: relative, nothing hidden, no
             * "..", sorted without repeats. */
            char *rel = s_strndup(f[4], fl[4]);
            if (!rel)
                rc = EMLIO_ENOMEM;
            else if (!emlio__rel_ok(rel, fl[4]))
                rc = s_why(why, EMLIO_EFORMAT, cur, "a bad file name");
            else if (cur->n && strcmp(cur->files[cur->n - 1].rel, rel) >= 0)
                rc = s_why(why, EMLIO_EFORMAT, cur,
                           "files out of order or repeated");
            else
                rc = s_push(cur, rel, (uint64_t)a,
                            (struct timespec){ (time_t)b, (long)c });
            emlio_free(rel);
        } else {
            rc = EMLIO_EFORMAT;
        }
    }
    if (rc == 0 && cls != n)
        rc = s_why(why, -ESTALE, NULL, "other classes");
    for (size_t i = 0; i < n && rc == 0; i++)
        rc = s_check_listing(folders[i], why);
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            s_reset(folders[i]);
    return rc;
}
