/* classes.c - a dataset's class names (see classes.h).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "classes.h"
#include "shardset.h"

void
emlio__classes_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        emlio_free(names[i]);
    emlio_free(names);
}

/* Reads dir/classes.txt into *text (NUL-terminated): 1, 0 when there is
 * none, < 0 (logged) when it is there but unusable. */
static int
s_read_file(const char *dir, char **text, emlio__shardset_log_fn *log,
            void *userdata)
{
    char path[PATH_MAX];
    char msg[PATH_MAX + 128];
    snprintf(path, sizeof(path), "%s/classes.txt", dir);
    /* Not a symlink, never a FIFO or device: O_NOFOLLOW, O_NONBLOCK and a
     * regular-file check before the first read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        snprintf(msg, sizeof(msg), "ignoring '%s': %s", path, strerror(errno));
        log(userdata, msg);
        return -1;
    }
    struct stat st;
    int rc = -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        st.st_size > (off_t)EMLIO__CLASSES_MAX_FILE) {
        snprintf(msg, sizeof(msg),
                 "ignoring '%s': not a regular file of at most %u bytes", path,
                 EMLIO__CLASSES_MAX_FILE);
        log(userdata, msg);
        close(fd);
        return -1;
    }
    char *buf = emlio_malloc((size_t)st.st_size + 1);
    ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
    close(fd);
    if (got == (ssize_t)st.st_size) {
        buf[got] = '\0';
        *text = buf;
        rc = 1;
    } else {
        snprintf(msg, sizeof(msg), "ignoring '%s': cannot read it", path);
        log(userdata, msg);
        emlio_free(buf);
    }
    return rc;
}

/* Splits text into lines (a final newline ends the last one; \r\n too).
 * Returns the count, 0 (an empty or NUL-holding name: logged), or
 * EMLIO_ENOMEM. */
static int
s_split(const char *dir, char *text, char ***names, emlio__shardset_log_fn *log,
        void *userdata)
{
    size_t n = 0, cap = 0;
    char **v = NULL;
    char *p = text;
    while (*p) {
        char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len && p[len - 1] == '\r')
            len--;
        if (len == 0 || len > 4096) {
            char msg[PATH_MAX + 128];
            snprintf(msg, sizeof(msg),
                     "ignoring '%s/classes.txt': line %zu is empty or "
                     "longer than 4096 bytes",
                     dir, n + 1);
            log(userdata, msg);
            emlio__classes_free(v, n);
            return 0;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            char **w = emlio_reallocarray(v, cap, sizeof(*w));
            if (!w) {
                emlio__classes_free(v, n);
                return EMLIO_ENOMEM;
            }
            v = w;
        }
        if (!(v[n] = emlio_malloc(len + 1))) {
            emlio__classes_free(v, n);
            return EMLIO_ENOMEM;
        }
        memcpy(v[n], p, len);
        v[n++][len] = '\0';
        p = nl ? nl + 1 : p + len;
    }
    *names = v;
    return (int)n;
}

/* Names from shards that carry one label each (ImageFolder classes). */
static int
s_from_shards(const emlio__shardset_t *set, char ***names)
{
    size_t n = 0;
    for (size_t i = 0; i < set->n; i++) {
        const emlio__shard_t *s = &set->shards[i];
        int64_t label = s->ops->shard_label ? s->ops->shard_label(s) : -1;
        if (label < 0)
            return 0; /* some shard mixes labels: no names */
        if ((size_t)label + 1 > n)
            n = (size_t)label + 1;
    }
    if (n == 0 || n > set->n)
        return 0;
    char **v = emlio_calloc(n, sizeof(*v));
    if (!v)
        return EMLIO_ENOMEM;
    for (size_t i = 0; i < set->n; i++) {
        const emlio__shard_t *s = &set->shards[i];
        size_t label = (size_t)s->ops->shard_label(s);
        if (!v[label] && !(v[label] = emlio_strdup(s->name))) {
            emlio__classes_free(v, n);
            return EMLIO_ENOMEM;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (!v[i]) { /* a label without a shard: no names */
            emlio__classes_free(v, n);
            return 0;
        }
    *names = v;
    return (int)n;
}

int
emlio__classes_load(const emlio__shardset_t *set, const char *dir,
                    char ***names, emlio__shardset_log_fn *log, void *userdata)
{
    *names = NULL;
    char *text = NULL;
    if (s_read_file(dir, &text, log, userdata) == 1) {
        int n = s_split(dir, text, names, log, userdata);
        emlio_free(text);
        if (n != 0)
            return n;
    }
    return s_from_shards(set, names);
}
