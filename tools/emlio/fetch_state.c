/* fetch_state.c - save and resume `emlio fetch --state`, bound to --ids.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include "dataset_util.h"
#include "fetch_state.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define S_HEAD 20 /* magic, ids length, ids hash (then EMF3's path) */

static void
s_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* The little-endian integer in the n bytes at p. */
static uint64_t
s_le64_n(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint64_t
s_le64(const uint8_t *p)
{
    return s_le64_n(p, 8);
}

/* FNV-1a 64 of the FETCH_STATE_TAIL bytes before offset len of fd. Returns
 * 0, or -errno (-ENODATA when the file is shorter than len). */
static int
s_tail_hash(int fd, uint64_t len, uint64_t *out)
{
    uint8_t buf[FETCH_STATE_TAIL];
    uint64_t n = len < sizeof(buf) ? len : sizeof(buf);
    size_t got = 0;
    while (got < n) {
        ssize_t r =
            pread(fd, buf + got, (size_t)(n - got), (off_t)(len - n + got));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -ENODATA;
        got += (size_t)r;
    }
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < got; i++) {
        h ^= buf[i];
        h *= 0x100000001b3ull;
    }
    *out = h;
    return 0;
}

/* The absolute path of path into out (PATH_MAX bytes), symbolic links
 * resolved, also for a file that does not exist yet (its directory
 * resolved). Returns 0, or -1 when even the directory cannot be. */
static int
s_abs_path(const char *path, char *out)
{
    if (realpath(path, out))
        return 0;
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    const char *base = slash ? slash + 1 : path;
    if (!slash)
        snprintf(dir, sizeof(dir), ".");
    else if (slash == path)
        snprintf(dir, sizeof(dir), "/");
    else
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    char real[PATH_MAX];
    if (!*base || !realpath(dir, real))
        return -1;
    int n = snprintf(out, PATH_MAX, "%s%s%s", real,
                     strcmp(real, "/") ? "/" : "", base);
    return n > 0 && n < PATH_MAX ? 0 : -1;
}

static void
s_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

int
fetch_state_save(emlio_client_t *client, const char *path, FILE *ids,
                 const char *ids_path)
{
    uint8_t head[S_HEAD + 4 + PATH_MAX] = { 'E', 'M', 'F', '3' };
    size_t head_len = S_HEAD + 4;
    if (ids) {
        uint64_t hash = 0;
        off_t off = 0;
        int rc = 0;
        /* ids is write-only; its tail is read back through a second
         * descriptor (the bytes just flushed are in the page cache). */
        int rfd = -1;
        if (fflush(ids) != 0 || (off = ftello(ids)) < 0 ||
            (rfd = open(ids_path, O_RDONLY | O_CLOEXEC)) < 0)
            rc = -errno;
        else
            rc = s_tail_hash(rfd, (uint64_t)off, &hash);
        if (rfd >= 0)
            close(rfd);
        if (rc < 0) {
            fprintf(stderr, "emlio fetch: cannot write '%s': %s\n", ids_path,
                    strerror(-rc));
            return -1;
        }
        s_put_le64(head + 4, (uint64_t)off);
        s_put_le64(head + 12, hash);
        /* The path lets a resume that names another ids file say so. */
        char abs[PATH_MAX];
        if (s_abs_path(ids_path, abs) == 0) {
            size_t n = strlen(abs);
            s_put_le32(head + S_HEAD, (uint32_t)n);
            memcpy(head + S_HEAD + 4, abs, n);
            head_len += n;
        }
    }
    uint8_t *blob;
    size_t len;
    if (emlio_client_save_state(client, &blob, &len) < 0) {
        fprintf(stderr, "emlio fetch: cannot save state '%s': %s\n", path,
                emlio_client_errmsg(client));
        return -1;
    }
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    int ok = f && fwrite(head, 1, head_len, f) == head_len &&
             fwrite(blob, 1, len, f) == len;
    int err = errno;
    if (f && fclose(f) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    emlio_client_free_blob(blob);
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        err = errno;
    }
    if (!ok) {
        fprintf(stderr, "emlio fetch: cannot write state '%s': %s\n", path,
                strerror(err));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int
fetch_state_load(const char *path, fetch_state_t *st)
{
    memset(st, 0, sizeof(*st));
    emlio_buf_t buf = EMLIO_BUF_INIT;
    int rc = dataset_read_file(path, &buf);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0) {
        if (rc == EMLIO_ENOMEM)
            fprintf(stderr, "emlio fetch: out of memory\n");
        else
            fprintf(stderr, "emlio fetch: cannot read state '%s': %s\n", path,
                    strerror(-rc));
        emlio_buf_release(&buf);
        return -1;
    }
    size_t len = 0;
    uint8_t *data = emlio_buf_detach(&buf, &len);
    size_t head = 0;
    uint32_t path_len = 0;
    if (len >= S_HEAD + 4 && !memcmp(data, "EMF3", 4) &&
        (path_len = (uint32_t)s_le64_n(data + S_HEAD, 4)) < PATH_MAX &&
        len - S_HEAD - 4 >= path_len) {
        st->has_hash = true;
        st->ids_hash = s_le64(data + 12);
        head = S_HEAD + 4 + path_len;
        if (path_len &&
            !(st->ids_path = strndup((char *)data + S_HEAD + 4, path_len))) {
            emlio_free(data);
            fprintf(stderr, "emlio fetch: out of memory\n");
            return -1;
        }
    } else if (len >= S_HEAD && !memcmp(data, "EMF2", 4)) {
        st->has_hash = true;
        st->ids_hash = s_le64(data + 12);
        head = S_HEAD;
    } else if (len >= 12 && !memcmp(data, "EMFS", 4)) {
        head = 12;
    } else {
        emlio_free(data);
        fprintf(stderr,
                "emlio fetch: cannot resume from '%s': not a state file\n",
                path);
        return -1;
    }
    st->ids_len = s_le64(data + 4);
    st->blob_len = len - head;
    memmove(data, data + head, st->blob_len);
    st->blob = data;
    return 1;
}

int
fetch_state_check_ids(const fetch_state_t *st, const char *state_path,
                      const char *ids_path)
{
    const char *hint = "drop --ids to resume without it, or delete the "
                       "state file to start over";
    char abs[PATH_MAX];
    if (st->ids_path &&
        (s_abs_path(ids_path, abs) < 0 || strcmp(abs, st->ids_path) != 0)) {
        fprintf(stderr,
                "emlio fetch: cannot resume from '%s': it was saved with "
                "--ids '%s', not '%s'; pass --ids '%s' to go on, %s\n",
                state_path, st->ids_path, ids_path, st->ids_path, hint);
        return -1;
    }
    int fd = open(ids_path, O_RDONLY | O_CLOEXEC);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0) {
        if (fd < 0 && errno == ENOENT && st->ids_len == 0)
            return 0; /* nothing was written yet */
        fprintf(stderr,
                "emlio fetch: cannot resume from '%s': the ids file '%s' it "
                "was saved with (%" PRIu64 " bytes) is %s; %s\n",
                state_path, ids_path, st->ids_len,
                errno == ENOENT ? "gone" : strerror(errno), hint);
        if (fd >= 0)
            close(fd);
        return -1;
    }
    int rc = 0;
    uint64_t hash = 0;
    if ((uint64_t)sb.st_size < st->ids_len) {
        fprintf(stderr,
                "emlio fetch: cannot resume from '%s': the ids file '%s' was "
                "cut to %lld of the %" PRIu64 " bytes it had; %s\n",
                state_path, ids_path, (long long)sb.st_size, st->ids_len, hint);
        rc = -1;
    } else if (st->has_hash && (s_tail_hash(fd, st->ids_len, &hash) < 0 ||
                                hash != st->ids_hash)) {
        fprintf(stderr,
                "emlio fetch: cannot resume from '%s': the ids file '%s' is "
                "not the one it was saved with (its contents changed); %s\n",
                state_path, ids_path, hint);
        rc = -1;
    }
    close(fd);
    return rc;
}

void
fetch_state_release(fetch_state_t *st)
{
    emlio_free(st->blob);
    free(st->ids_path);
    memset(st, 0, sizeof(*st));
}

/* The state files `from` names into g (a directory's as a glob would list
 * them: sorted). Returns 0, or -1 after printing why. */
static int
s_list_states(const char *from, glob_t *g)
{
    struct stat sb;
    char pattern[4096];
    if (stat(from, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if (snprintf(pattern, sizeof(pattern), "%s/*", from) >=
            (int)sizeof(pattern)) {
            fprintf(stderr, "emlio fetch: --resume-from '%s': path too long\n",
                    from);
            return -1;
        }
        from = pattern;
    }
    int rc = glob(from, GLOB_ERR, NULL, g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g->gl_pathc == 0)) {
        fprintf(stderr,
                "emlio fetch: --resume-from '%s': no state file there\n", from);
        return -1;
    }
    if (rc != 0) {
        fprintf(stderr, "emlio fetch: --resume-from '%s': cannot list: %s\n",
                from, rc == GLOB_NOSPACE ? "out of memory" : strerror(errno));
        return -1;
    }
    return 0;
}

static bool
s_is_state_file(const char *path)
{
    struct stat sb;
    size_t n = strlen(path);
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode) &&
           !(n >= 4 && strcmp(path + n - 4, ".tmp") == 0);
}

int
fetch_state_resume_from(emlio_client_t *client, const char *from,
                        const char *own_state)
{
    glob_t g;
    if (s_list_states(from, &g) < 0)
        return -1;
    fetch_state_t *st = calloc(g.gl_pathc, sizeof(*st));
    const char **path = calloc(g.gl_pathc, sizeof(*path));
    const uint8_t **blobs = calloc(g.gl_pathc, sizeof(*blobs));
    size_t *lens = calloc(g.gl_pathc, sizeof(*lens));
    size_t n = 0;
    int rc = st && path && blobs && lens ? 0 : -1;
    if (rc < 0)
        fprintf(stderr, "emlio fetch: out of memory\n");
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) {
        const char *p = g.gl_pathv[i];
        if (!s_is_state_file(p))
            continue;
        struct stat a, b;
        if (own_state && stat(own_state, &a) == 0 && stat(p, &b) == 0 &&
            a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            fprintf(stderr,
                    "emlio fetch: --state '%s' is one of the --resume-from "
                    "states: save this run's states elsewhere (the other "
                    "ranks may still read it)\n",
                    own_state);
            rc = -1;
            break;
        }
        if (fetch_state_load(p, &st[n]) <= 0) {
            rc = -1;
            break;
        }
        path[n] = p;
        blobs[n] = st[n].blob;
        lens[n] = st[n].blob_len;
        n++;
    }
    if (rc == 0 && n == 0) {
        fprintf(stderr,
                "emlio fetch: --resume-from '%s': no state file there\n", from);
        rc = -1;
    }
    if (rc == 0 && emlio_client_load_states(client, blobs, lens, n) < 0) {
        fprintf(stderr, "emlio fetch: cannot resume from '%s': %s\n", from,
                emlio_client_errmsg(client));
        for (size_t i = 0; i < n && n > 1; i++)
            fprintf(stderr, "  resume state %zu of %zu: %s\n", i, n, path[i]);
        rc = -1;
    }
    for (size_t i = 0; st && i < n; i++)
        fetch_state_release(&st[i]);
    free(st);
    free(path);
    free(blobs);
    free(lens);
    globfree(&g);
    return rc;
}
