/* dataset_util.c - helpers shared by the dataset subcommands of `emlio`.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dataset_util.h"
#include "emlio/buf.h"

void
dataset_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "emlio %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void
dataset_warn(void *cmd, const char *msg)
{
    fprintf(stderr, "emlio %s: warning: %s\n", (const char *)cmd, msg);
}

const char *
dataset_strerror(int rc, char *buf, size_t len)
{
    snprintf(buf, len, "%s", emlio_strerror(rc));
    if (len && buf[0])
        buf[0] = (char)tolower((unsigned char)buf[0]);
    return buf;
}

int
dataset_parse_u64(const char *s, bool allow_suffix, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return -1;
    uint64_t v = 0;
    const char *p = s;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (*p && allow_suffix) {
        static const char units[] = "KMGT";
        const char *u = strchr(units, toupper((unsigned char)*p));
        if (!u)
            return -1;
        int shift = 10 * (int)(u - units + 1);
        if (v > (UINT64_MAX >> shift))
            return -1;
        v <<= shift;
        p++;
        if (*p == 'i')
            p++;
        if (*p == 'B' || *p == 'b')
            p++;
    }
    if (*p)
        return -1;
    *out = v;
    return 0;
}

int
dataset_strv_push(dataset_strv_t *self, const char *s)
{
    if (self->n == self->cap) {
        size_t cap = self->cap ? self->cap * 2 : 16;
        char **items = reallocarray(self->items, cap, sizeof(*items));
        if (!items)
            return EMLIO_ENOMEM;
        self->items = items;
        self->cap = cap;
    }
    char *copy = strdup(s);
    if (!copy)
        return EMLIO_ENOMEM;
    self->items[self->n++] = copy;
    return 0;
}

static int
s_strcmp_p(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void
dataset_strv_sort(dataset_strv_t *self)
{
    if (self->n > 1)
        qsort(self->items, self->n, sizeof(*self->items), s_strcmp_p);
}

void
dataset_strv_release(dataset_strv_t *self)
{
    for (size_t i = 0; i < self->n; i++)
        free(self->items[i]);
    free(self->items);
    self->items = NULL;
    self->n = 0;
    self->cap = 0;
}

char *
dataset_path_join(const char *a, const char *b)
{
    size_t la = strlen(a);
    size_t lb = strlen(b);
    bool slash = la > 0 && a[la - 1] != '/';
    char *path = malloc(la + slash + lb + 1);
    if (!path)
        return NULL;
    memcpy(path, a, la);
    if (slash)
        path[la] = '/';
    memcpy(path + la + slash, b, lb + 1);
    return path;
}

int
dataset_list_dir(const char *dir, int want, dataset_strv_t *out)
{
    DIR *d = opendir(dir);
    if (!d)
        return -errno;
    int rc = 0;
    for (;;) {
        errno = 0;
        struct dirent *e = readdir(d);
        if (!e) {
            rc = errno ? -errno : 0;
            break;
        }
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (want) {
            struct stat st;
            /* fstatat follows symlinks, as torchvision's is_dir() does. */
            if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
                continue; /* a dangling link or a racing unlink */
            if (want == 'd' && !S_ISDIR(st.st_mode))
                continue;
            if (want == 'f' && !S_ISREG(st.st_mode))
                continue;
        }
        rc = dataset_strv_push(out, e->d_name);
        if (rc < 0)
            break;
    }
    closedir(d);
    dataset_strv_sort(out);
    return rc;
}

int
dataset_mkdir_p(const char *dir)
{
    if (!dir[0])
        return -ENOENT;
    char *path = strdup(dir);
    if (!path)
        return EMLIO_ENOMEM;
    int rc = 0;
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0777) < 0 && errno != EEXIST) {
            rc = -errno;
            break;
        }
        *p = saved;
        if (!saved)
            break;
    }
    if (rc == 0) {
        struct stat st;
        if (stat(dir, &st) < 0)
            rc = -errno;
        else if (!S_ISDIR(st.st_mode))
            rc = -ENOTDIR;
    }
    free(path);
    return rc;
}

int
dataset_write_all(int fd, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int
dataset_write_file_atomic(const char *path, const void *data, size_t len)
{
    emlio_buf_t tmp_path = EMLIO_BUF_INIT;
    if (emlio_buf_addf(&tmp_path, "%s.tmp.%ld", path, (long)getpid()) < 0)
        return EMLIO_ENOMEM;
    const char *tmp = (const char *)tmp_path.data;
    int rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    rc = dataset_write_all(fd, data, len);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
out:
    emlio_buf_release(&tmp_path);
    return rc;
}

int
dataset_read_file(const char *path, emlio_buf_t *out)
{
    emlio_buf_clear(out);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    struct stat st;
    if (fstat(fd, &st) < 0) {
        rc = -errno;
        goto out;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
        goto out;
    }
    /* Read until EOF rather than trusting st_size: the file may change. */
    size_t want = st.st_size > 0 ? (size_t)st.st_size : 4096;
    for (;;) {
        rc = emlio_buf_grow(out, want);
        if (rc < 0)
            goto out;
        ssize_t n = read(fd, out->data + out->len, out->cap - out->len - 1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            goto out;
        }
        if (n == 0)
            break;
        out->len += (size_t)n;
        want = 4096;
    }
out:
    close(fd);
    return rc;
}

double
dataset_now(void)
{
    return (double)tool_now_ns() * 1e-9;
}
