/* classes.c - a dataset's class names (see classes.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <sys/stat.h>
#include <unistd.h>

#include "beneath.h"
#include "classes.h"
#include "shardset.h"

void
emlio__classes_free(char **names, size_t n)
{
    for (size_t i = 0; names && i < n; i++)
        emlio_free(names[i]);
    emlio_free(names);
}

/* Reads classes.txt of the data directory into *text (NUL-terminated): 1,
 * 0 when there is none, < 0 (logged) when it is there but unusable. It is
 * opened as every file of the dataset is (beneath.h: inside the root, no
 * symlink the root does not follow, a regular file or nothing). */
static int
s_read_file(const emlio__shardset_t *set, const char *dir, char **text,
            emlio__shardset_log_fn *log, void *userdata)
{
    char msg[PATH_MAX + 128];
    struct stat st;
    int fd = emlio__open_beneath(&set->root, "classes.txt", 0, &st);
    if (fd == -ENOENT)
        return 0;
    if (fd < 0 || st.st_size > (off_t)EMLIO__CLASSES_MAX_FILE) {
        snprintf(msg, sizeof(msg), "ignoring '%s/classes.txt': %s", dir,
                 fd < 0 ? emlio__open_why(fd) : "larger than 16 MiB");
        log(userdata, msg);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    char *buf = emlio_malloc((size_t)st.st_size + 1);
    ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
    close(fd);
    if (got != (ssize_t)st.st_size) {
        snprintf(msg, sizeof(msg), "ignoring '%s/classes.txt': cannot read it",
                 dir);
        log(userdata, msg);
        emlio_free(buf);
        return -1;
    }
    buf[got] = '\0';
    *text = buf;
    return 1;
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
        if (emlio__grow(&v, &cap, n, sizeof(*v), 64) < 0) {
            emlio__classes_free(v, n);
            return EMLIO_ENOMEM;
        }
        if (!(v[n++] = emlio__memdupz(p, len))) {
            emlio__classes_free(v, n - 1);
            return EMLIO_ENOMEM;
        }
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
        int64_t label = s->ops->shard_label ? s->ops->shard_label(s->impl) : -1;
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
        size_t label = (size_t)s->ops->shard_label(s->impl);
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
    if (s_read_file(set, dir, &text, log, userdata) == 1) {
        int n = s_split(dir, text, names, log, userdata);
        emlio_free(text);
        if (n != 0)
            return n;
    }
    return s_from_shards(set, names);
}
