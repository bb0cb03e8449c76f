/* imagefolder.c - class directories of image files served as shards.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
    int dirfd;
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
emlio__folder_new(const char *root, const char *cls, int64_t label)
{
    emlio__folder_t *self = emlio_calloc(1, sizeof(*self));
    if (!self)
        return NULL;
    self->root = emlio_strdup(root);
    self->cls = emlio_strdup(cls);
    self->label = label;
    self->dirfd = -1;
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
    if (self->dirfd >= 0)
        close(self->dirfd);
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

/* Walks dirfd/rel ("" or "sub/"), following no symlinked directories. */
static int
s_walk(emlio__folder_t *self, const char *rel, int depth)
{
    if (depth > 32)
        return 0;
    int fd = rel[0] ? openat(self->dirfd, rel,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                    : dup(self->dirfd);
    if (fd < 0)
        return emlio__seterr(self->err, -errno,
                             "cannot open directory '%s/%s/%s': %s", self->root,
                             self->cls, rel, strerror(errno));
    struct stat dst;
    if (fstat(fd, &dst) != 0 || s_push_dir(self, rel, dst.st_mtim) < 0) {
        close(fd);
        return EMLIO_ENOMEM;
    }
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return -errno;
    }
    rewinddir(dir);
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(dir)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char child[PATH_MAX];
        if (snprintf(child, sizeof(child), "%s%s", rel, e->d_name) >=
            (int)sizeof(child))
            continue;
        struct stat st;
        if (fstatat(self->dirfd, child, &st, 0) != 0)
            continue;
        if (S_ISDIR(st.st_mode)) {
            struct stat lst;
            if (fstatat(self->dirfd, child, &lst, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISDIR(lst.st_mode)) {
                char sub[PATH_MAX];
                if (snprintf(sub, sizeof(sub), "%s/", child) < (int)sizeof(sub))
                    rc = s_walk(self, sub, depth + 1);
            }
        } else if (S_ISREG(st.st_mode) && emlio__folder_is_image(e->d_name)) {
            rc = s_push(self, child, (uint64_t)st.st_size, st.st_mtim);
        }
    }
    closedir(dir);
    return rc;
}

static int
s_cmp_files(const void *a, const void *b)
{
    return strcmp(((const s_file_t *)a)->rel, ((const s_file_t *)b)->rel);
}

int
emlio__folder_scan(emlio__folder_t *self)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s", self->root, self->cls) >=
        (int)sizeof(path))
        return emlio__seterr(self->err, -ENAMETOOLONG, "path too long: '%s'",
                             self->cls);
    if (self->dirfd < 0) {
        self->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (self->dirfd < 0)
            return emlio__seterr(self->err, -errno,
                                 "cannot open directory '%s': %s", path,
                                 strerror(errno));
    }
    int rc = s_walk(self, "", 0);
    if (rc < 0)
        return rc;
    if (self->n > 1) /* qsort(NULL, 0) is undefined */
        qsort(self->files, self->n, sizeof(*self->files), s_cmp_files);
    return self->n > INT_MAX ? EMLIO_EFORMAT : (int)self->n;
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
    int fd;
    do
        fd = openat(self->dirfd, f->rel, O_RDONLY | O_CLOEXEC | O_NOATIME);
    while (fd < 0 && errno == EINTR);
    if (fd < 0 && errno == EPERM) /* O_NOATIME on a file we do not own */
        fd = openat(self->dirfd, f->rel, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* The listing may come from a cache: a file rewritten since (size or
     * mtime) is reported, not served as something the list did not see. */
    struct stat st;
    if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != f->size ||
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
}

int
emlio__folder_cache_load(const char *text, size_t len,
                         struct timespec root_mtime,
                         emlio__folder_t *const *folders, size_t n)
{
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
                rc = -ESTALE;
            else
                cur = folders[cls++];
        } else if (!cur) {
            rc = EMLIO_EFORMAT;
        } else if (f[0][0] == 'D' && k >= 3) {
            /* k == 3: the class root, whose relative path is empty. */
            char *rel = k == 4 ? s_strndup(f[3], fl[3]) : emlio_strdup("");
            struct stat st;
            char path[PATH_MAX];
            if (!rel || !s_num(f[1], fl[1], &a) || !s_num(f[2], fl[2], &b)) {
                rc = rel ? EMLIO_EFORMAT : EMLIO_ENOMEM;
            } else if (snprintf(path, sizeof(path), "%s/%s/%s", cur->root,
                                cur->cls, rel) >= (int)sizeof(path) ||
                       stat(path, &st) != 0 || st.st_mtim.tv_sec != a ||
                       st.st_mtim.tv_nsec != b) {
                rc = -ESTALE;
            } else {
                rc = s_push_dir(cur, rel,
                                (struct timespec){ (time_t)a, (long)b });
            }
            emlio_free(rel);
        } else if (f[0][0] == 'F' && k == 5 && s_num(f[1], fl[1], &a) &&
                   s_num(f[2], fl[2], &b) && s_num(f[3], fl[3], &c)) {
            char *rel = s_strndup(f[4], fl[4]);
            rc = rel ? s_push(cur, rel, (uint64_t)a,
                              (struct timespec){ (time_t)b, (long)c })
                     : EMLIO_ENOMEM;
            emlio_free(rel);
        } else {
            rc = EMLIO_EFORMAT;
        }
    }
    if (rc == 0 && cls != n)
        rc = -ESTALE;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[PATH_MAX];
        emlio__folder_t *self = folders[i];
        if (self->n == 0 || self->n_dirs == 0) {
            rc = -ESTALE;
            break;
        }
        snprintf(path, sizeof(path), "%s/%s", self->root, self->cls);
        self->dirfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (self->dirfd < 0)
            rc = -errno;
    }
    if (rc < 0)
        for (size_t i = 0; i < n; i++) {
            s_reset(folders[i]);
            if (folders[i]->dirfd >= 0)
                close(folders[i]->dirfd);
            folders[i]->dirfd = -1;
        }
    return rc;
}
