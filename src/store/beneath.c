/* beneath.c - opening files under a data root and nowhere else (see
 * beneath.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "beneath.h"

int
emlio__root_open(emlio__root_t *root, const char *dir, bool follow)
{
    root->follow = follow;
    root->fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    root->owned = root->fd >= 0;
    return root->fd < 0 ? -errno : 0;
}

void
emlio__root_close(emlio__root_t *root)
{
    if (root->owned && root->fd >= 0)
        close(root->fd);
    root->fd = -1;
    root->owned = false;
}

bool
emlio__rel_ok(const char *rel, size_t len)
{
    if (len == 0 || rel[0] == '/')
        return false;
    size_t start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && rel[i] == '\0')
            return false;
        if (i < len && rel[i] != '/')
            continue;
        /* Component [start, i): non-empty ("a//b" and a trailing "/" are
         * not what a walk writes) and not hidden, which covers "." and
         * "..". */
        if (i == start || rel[start] == '.')
            return false;
        start = i + 1;
    }
    return true;
}

const char *
emlio__open_why(int rc)
{
    switch (rc) {
    case -ELOOP:
        return "it is a symbolic link (links are followed only with "
               "--follow-symlinks, and only inside the data root)";
    case -EXDEV:
        return "it resolves outside the data root";
    case EMLIO_EFORMAT:
        return "not a regular file";
    case -EMFILE:
    case -ENFILE:
        return "too many open files (each open shard holds one "
               "descriptor: lower --max-open-shards, or raise the limit, "
               "ulimit -n or LimitNOFILE=)";
    default:
        return emlio_strerror(rc);
    }
}

/* openat2 beneath the root; -ENOSYS when the kernel lacks it. */
static int
s_openat2(const emlio__root_t *root, const char *rel, int oflags)
{
    struct open_how how = {
        .flags = (uint64_t)oflags,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS |
                   (root->follow ? 0 : RESOLVE_NO_SYMLINKS),
    };
    long fd;
    do
        fd = syscall(SYS_openat2, root->fd, rel, &how, sizeof(how));
    while (fd < 0 && (errno == EINTR || errno == EAGAIN));
    return fd < 0 ? -errno : (int)fd;
}

/* Without following: one component at a time, each with O_NOFOLLOW, no
 * "..", so nothing can lead out of the root. */
static int
s_walk_open(const emlio__root_t *root, const char *rel, int oflags)
{
    if (rel[0] == '/')
        return -EXDEV;
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", rel) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    int dir = root->fd;
    char *name = buf;
    for (;;) {
        char *slash = strchr(name, '/');
        if (slash)
            *slash = '\0';
        int fd;
        if (strcmp(name, "..") == 0)
            fd = -EXDEV;
        else if (slash) /* an intermediate directory */
            fd = openat(dir, *name ? name : ".",
                        O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        else
            fd = openat(dir, name, oflags | O_NOFOLLOW);
        if (fd == -1)
            fd = -errno;
        if (dir != root->fd)
            close(dir);
        if (fd < 0 || !slash)
            return fd;
        dir = fd;
        name = slash + 1;
    }
}

/* With following: open, then ask where the descriptor landed. */
static int
s_check_open(const emlio__root_t *root, const char *rel, int oflags)
{
    if (rel[0] == '/')
        return -EXDEV;
    int fd = openat(root->fd, rel, oflags);
    if (fd < 0)
        return -errno;
    char link[64], at[PATH_MAX], base[PATH_MAX];
    snprintf(link, sizeof(link), "/proc/self/fd/%d", root->fd);
    ssize_t nb = readlink(link, base, sizeof(base) - 1);
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    ssize_t na = readlink(link, at, sizeof(at) - 1);
    /* No /proc: fail closed. */
    bool inside = nb > 0 && na > nb && (size_t)nb < sizeof(base) &&
                  memcmp(at, base, (size_t)nb) == 0 &&
                  (at[nb] == '/' || (nb == 1 && base[0] == '/'));
    if (nb > 0 && na == nb && memcmp(at, base, (size_t)nb) == 0)
        inside = true; /* the root itself */
    if (!inside) {
        close(fd);
        return -EXDEV;
    }
    return fd;
}

static int
s_open_checked(const emlio__root_t *root, const char *rel, unsigned flags,
               struct stat *st)
{
    /* O_NONBLOCK: opening a FIFO for reading must not wait for a writer;
     * fstat below then refuses it before any read. */
    int oflags = O_RDONLY | O_CLOEXEC | O_NONBLOCK |
                 ((flags & EMLIO__OPEN_DIR) ? O_DIRECTORY : 0) |
                 ((flags & EMLIO__OPEN_NOATIME) ? O_NOATIME : 0);
    int fd;
    if (!root || root->fd < 0) {
        do
            fd = open(rel, oflags);
        while (fd < 0 && errno == EINTR);
        if (fd < 0)
            fd = -errno;
    } else {
        fd = (flags & EMLIO__OPEN_NOOPENAT2) ? -ENOSYS
                                             : s_openat2(root, rel, oflags);
        /* No openat2, or seccomp refusing it (an EPERM that is not
         * O_NOATIME's, which the caller retries without). */
        if (fd == -ENOSYS || (fd == -EPERM && !(oflags & O_NOATIME)))
            fd = root->follow ? s_check_open(root, rel, oflags)
                              : s_walk_open(root, rel, oflags);
    }
    if (fd < 0)
        return fd;
    int rc = 0;
    if (fstat(fd, st) != 0)
        rc = -errno;
    else if ((flags & EMLIO__OPEN_DIR) ? !S_ISDIR(st->st_mode)
                                       : !S_ISREG(st->st_mode))
        rc = S_ISDIR(st->st_mode) ? -EISDIR : EMLIO_EFORMAT;
    /* Regular files and directories never block; clear the flag so reads
     * behave as callers expect. */
    else if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0)
        rc = -errno;
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

int
emlio__open_beneath(const emlio__root_t *root, const char *rel, unsigned flags,
                    struct stat *st)
{
    /* O_NOATIME is refused (EPERM) on files the process does not own:
     * then open without it. */
    int fd = s_open_checked(root, rel, flags, st);
    if (fd == -EPERM && (flags & EMLIO__OPEN_NOATIME))
        fd = s_open_checked(root, rel, flags & ~EMLIO__OPEN_NOATIME, st);
    return fd;
}
