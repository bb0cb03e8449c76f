/* dsindex.c - the dataset index: one mapped file of shard tables (see
 * dsindex.h; format in docs/protocol.md).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "dsindex.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#    error "the dataset index is stored little-endian; add byte swapping"
#endif

#define S_MAGIC      "EMLIOIDX"
#define S_HEADER_LEN 64u
#define S_CRC_AT     60u /* the header's own CRC, last field */
#define S_ALIGN      16u
/* Entries of a shard table beyond this are not an index of ours. */
#define S_MAX_SHARDS ((uint64_t)1 << 32)
#define S_RACY_NS    2000000000ull

_Static_assert(sizeof(emlio__dsindex_entry_t) == 80, "entry layout");

/* The header as stored (64 bytes, little-endian). */
typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t entry_len;
    uint64_t n_shards;
    uint64_t names_len;
    uint64_t file_size;
    uint64_t root_ino;
    uint64_t written_ns;
    uint32_t reserved;
    uint32_t crc; /* CRC-32C of bytes [0, 60), the entries and the names */
} s_header_t;

_Static_assert(sizeof(s_header_t) == S_HEADER_LEN, "header layout");

static uint64_t
s_align(uint64_t v)
{
    return (v + S_ALIGN - 1) & ~(uint64_t)(S_ALIGN - 1);
}

static uint64_t
s_mtime_ns(const struct stat *st)
{
    return (uint64_t)st->st_mtim.tv_sec * 1000000000ull +
           (uint64_t)st->st_mtim.tv_nsec;
}

int
emlio__dsindex_path(const char *dir, const char *index_dir, char *out,
                    size_t len)
{
    int n;
    if (!index_dir || !index_dir[0]) {
        n = snprintf(out, len, "%s/%s", dir, EMLIO__DSINDEX_NAME);
    } else {
        char abs[PATH_MAX];
        if (!realpath(dir, abs))
            return -errno;
        /* FNV-1a of the path: one index per data directory in index_dir. */
        uint64_t h = 0xcbf29ce484222325ull;
        for (const char *p = abs; *p; p++)
            h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
        n = snprintf(out, len, "%s/%016" PRIx64 "%s", index_dir, h,
                     EMLIO__DSINDEX_NAME);
    }
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

static uint32_t
s_header_crc(const uint8_t *map, uint64_t body_len)
{
    uint32_t crc = emlio_crc32c(0, map, S_CRC_AT);
    return emlio_crc32c(crc, map + S_HEADER_LEN, (size_t)body_len);
}

/* Checks every entry: name inside the names area and NUL-terminated,
 * names in strictly increasing order (lookups bisect), table inside the
 * file and aligned. */
static int
s_check_entries(const emlio__dsindex_t *self, uint64_t names_len,
                const char *path, char *errbuf)
{
    for (size_t i = 0; i < self->n; i++) {
        const emlio__dsindex_entry_t *e = &self->entries[i];
        if (e->name_off >= names_len ||
            e->name_len >= names_len - e->name_off ||
            self->names[e->name_off + e->name_len] != '\0' ||
            strlen(self->names + e->name_off) != e->name_len)
            return emlio__seterr(errbuf, EMLIO_EFORMAT,
                                 "dataset index '%s': entry %zu has a bad "
                                 "name",
                                 path, i);
        if (i && strcmp(self->names + self->entries[i - 1].name_off,
                        self->names + e->name_off) >= 0)
            return emlio__seterr(errbuf, EMLIO_EFORMAT,
                                 "dataset index '%s': entries out of order "
                                 "at %zu",
                                 path, i);
        if (e->table_off % S_ALIGN || e->table_off > self->size ||
            e->table_len > self->size - e->table_off)
            return emlio__seterr(errbuf, EMLIO_EFORMAT,
                                 "dataset index '%s': the table of '%s' "
                                 "lies outside the file",
                                 path, self->names + e->name_off);
    }
    return 0;
}

int
emlio__dsindex_parse(emlio__dsindex_t *self, const uint8_t *map, size_t size,
                     uint64_t root_ino, const char *path, char *errbuf)
{
    memset(self, 0, sizeof(*self));
    self->map = map;
    self->size = size;
    s_header_t h;
    if (self->size < S_HEADER_LEN)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s' is truncated (%zu bytes)",
                             path, self->size);
    memcpy(&h, self->map, sizeof(h));
    if (memcmp(h.magic, S_MAGIC, 8) != 0)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "'%s' is not a dataset index (bad magic)", path);
    if (h.version != EMLIO__DSINDEX_VERSION)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s' has version %u; this build "
                             "reads version %u",
                             path, h.version, EMLIO__DSINDEX_VERSION);
    if (h.entry_len != 80)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s' has %u-byte entries; version "
                             "%u has 80",
                             path, h.entry_len, EMLIO__DSINDEX_VERSION);
    if (h.file_size != self->size)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s' is truncated: %zu of "
                             "%" PRIu64 " bytes",
                             path, self->size, h.file_size);
    uint64_t room = self->size - S_HEADER_LEN;
    if (h.n_shards > S_MAX_SHARDS || h.n_shards * 80 > room ||
        h.names_len > room - h.n_shards * 80)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s': shard table larger than "
                             "the file",
                             path);
    if (s_header_crc(self->map, h.n_shards * 80 + h.names_len) != h.crc)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s': header checksum mismatch "
                             "(corrupt)",
                             path);
    if (h.root_ino != root_ino)
        return emlio__seterr(errbuf, EMLIO_EFORMAT,
                             "dataset index '%s' belongs to another data "
                             "directory",
                             path);
    self->n = (size_t)h.n_shards;
    self->entries = (const emlio__dsindex_entry_t *)(self->map + S_HEADER_LEN);
    self->names = (const char *)(self->map + S_HEADER_LEN + self->n * 80);
    self->written_ns = h.written_ns;
    return s_check_entries(self, h.names_len, path, errbuf);
}

/* Reads the file's size bytes into private, page-aligned memory (the
 * offsets keep the alignment the tables need) and makes it read-only.
 * Not a shared mapping of the file: the record tables are used for as
 * long as the daemon runs, and an index truncated or rewritten in place
 * under a mapping (`cp` over it, `rsync --inplace`) would turn the next
 * read of a table into SIGBUS or into another table. Read once, the
 * index can only be found stale (its CRCs) and the shard rescanned. A
 * file that shrinks while it is read is refused as changed. */
static int
s_read_private(int fd, size_t size, void **out, const char *path, char *errbuf)
{
    void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED)
        return emlio__seterr(errbuf, -errno,
                             "cannot read dataset index '%s': %s", path,
                             strerror(errno));
    size_t got = 0;
    while (got < size) {
        ssize_t r = pread(fd, (uint8_t *)mem + got, size - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int err = r < 0 ? -errno : EMLIO_EFORMAT;
            munmap(mem, size);
            return emlio__seterr(
                errbuf, err, "cannot read dataset index '%s': %s", path,
                r < 0 ? strerror(errno) : "it shrank while it was read");
        }
        got += (size_t)r;
    }
    (void)mprotect(mem, size, PROT_READ); /* a stray write faults */
    *out = mem;
    return 0;
}

int
emlio__dsindex_open(emlio__dsindex_t *self, const char *path,
                    const struct stat *root, char *errbuf)
{
    memset(self, 0, sizeof(*self));
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0)
        return errno == ENOENT
                   ? -ENOENT
                   : emlio__seterr(errbuf, -errno,
                                   "cannot open dataset index '%s': %s", path,
                                   strerror(errno));
    struct stat st;
    int rc = fstat(fd, &st) < 0 ? -errno : 0;
    if (rc == 0 && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > SIZE_MAX))
        rc = emlio__seterr(errbuf, EMLIO_EFORMAT,
                           "dataset index '%s' is not a regular file", path);
    else if (rc < 0)
        emlio__seterr(errbuf, rc, "cannot stat dataset index '%s'", path);
    void *map = MAP_FAILED;
    if (rc == 0 && st.st_size > 0)
        rc = s_read_private(fd, (size_t)st.st_size, &map, path, errbuf);
    close(fd);
    if (rc < 0)
        return rc;
    rc = emlio__dsindex_parse(self, map == MAP_FAILED ? NULL : map,
                              (size_t)st.st_size, (uint64_t)root->st_ino, path,
                              errbuf);
    if (rc < 0) {
        if (map != MAP_FAILED)
            munmap(map, (size_t)st.st_size);
        memset(self, 0, sizeof(*self));
    }
    return rc;
}

const emlio__dsindex_entry_t *
emlio__dsindex_find(const emlio__dsindex_t *self, const char *name)
{
    size_t lo = 0, hi = self->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const emlio__dsindex_entry_t *e = &self->entries[mid];
        int c = strcmp(name, self->names + e->name_off);
        if (c == 0)
            return e;
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

bool
emlio__dsindex_fresh(const emlio__dsindex_t *self,
                     const emlio__dsindex_entry_t *entry, const struct stat *st,
                     const char *format)
{
    uint64_t mtime = s_mtime_ns(st);
    return entry->size == (uint64_t)st->st_size && entry->mtime_ns == mtime &&
           entry->ino == (uint64_t)st->st_ino &&
           strncmp(entry->format, format, sizeof(entry->format)) == 0 &&
           mtime + S_RACY_NS <= self->written_ns;
}

const void *
emlio__dsindex_table(const emlio__dsindex_t *self,
                     const emlio__dsindex_entry_t *entry)
{
    return self->map + entry->table_off;
}

static int
s_cmp_items(const void *a, const void *b)
{
    return strcmp(((const emlio__dsindex_item_t *)a)->name,
                  ((const emlio__dsindex_item_t *)b)->name);
}

/* Buffered writes to fd; the first error sticks. */
typedef struct {
    int fd;
    int rc;
    size_t len;
    uint8_t buf[1 << 16];
} s_out_t;

static void
s_flush(s_out_t *o)
{
    for (size_t off = 0; o->rc == 0 && off < o->len;) {
        ssize_t n = write(o->fd, o->buf + off, o->len - off);
        if (n < 0 && errno != EINTR)
            o->rc = -errno;
        off += n > 0 ? (size_t)n : 0;
    }
    o->len = 0;
}

static void
s_put(s_out_t *o, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len && o->rc == 0) {
        size_t take = EMLIO_MIN(len, sizeof(o->buf) - o->len);
        memcpy(o->buf + o->len, p, take);
        o->len += take;
        p += take;
        len -= take;
        if (o->len == sizeof(o->buf))
            s_flush(o);
    }
}

/* The header and entries of items (sorted), tables from body on. */
static void
s_layout(const struct stat *root, const emlio__dsindex_item_t *items, size_t n,
         s_header_t *h, emlio__dsindex_entry_t *entries)
{
    uint64_t names_len = 0;
    for (size_t i = 0; i < n; i++)
        names_len += strlen(items[i].name) + 1;
    uint64_t off = s_align(S_HEADER_LEN + (uint64_t)n * 80 + names_len);
    memset(h, 0, sizeof(*h));
    memcpy(h->magic, S_MAGIC, 8);
    h->version = EMLIO__DSINDEX_VERSION;
    h->entry_len = 80;
    h->n_shards = n;
    h->names_len = names_len;
    h->root_ino = (uint64_t)root->st_ino;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    h->written_ns =
        (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
    uint64_t name_off = 0;
    for (size_t i = 0; i < n; i++) {
        const emlio__dsindex_item_t *it = &items[i];
        emlio__dsindex_entry_t *e = &entries[i];
        memset(e, 0, sizeof(*e));
        e->name_off = name_off;
        e->name_len = (uint32_t)strlen(it->name);
        name_off += e->name_len + 1;
        snprintf(e->format, sizeof(e->format), "%s", it->format);
        e->size = (uint64_t)it->st->st_size;
        e->mtime_ns = s_mtime_ns(it->st);
        e->ino = (uint64_t)it->st->st_ino;
        e->records = it->records;
        e->table_off = off;
        e->table_len = it->table_len;
        e->table_crc =
            it->crc_known ? it->crc : emlio_crc32c(0, it->table, it->table_len);
        off = s_align(off + it->table_len);
    }
    h->file_size = off;
}

/* Streams the laid-out index to fd. */
static int
s_emit(int fd, s_header_t *h, const emlio__dsindex_entry_t *entries,
       const emlio__dsindex_item_t *items, size_t n)
{
    s_out_t *o = emlio_malloc(sizeof(*o));
    if (!o)
        return -ENOMEM;
    o->fd = fd;
    o->rc = 0;
    o->len = 0;
    uint32_t crc = emlio_crc32c(0, h, S_CRC_AT);
    crc = emlio_crc32c(crc, entries, n * 80);
    for (size_t i = 0; i < n; i++)
        crc = emlio_crc32c(crc, items[i].name, strlen(items[i].name) + 1);
    h->crc = crc;
    s_put(o, h, sizeof(*h));
    s_put(o, entries, n * 80);
    uint64_t at = S_HEADER_LEN + (uint64_t)n * 80;
    for (size_t i = 0; i < n; i++) {
        s_put(o, items[i].name, strlen(items[i].name) + 1);
        at += strlen(items[i].name) + 1;
    }
    static const uint8_t zeros[S_ALIGN];
    for (size_t i = 0; i < n; i++) {
        s_put(o, zeros, (size_t)(entries[i].table_off - at));
        s_put(o, items[i].table, items[i].table_len);
        at = entries[i].table_off + items[i].table_len;
    }
    s_put(o, zeros, (size_t)(h->file_size - at));
    s_flush(o);
    int rc = o->rc;
    emlio_free(o);
    return rc;
}

/* Temporary files of earlier writes of path that a crash (kill -9, power
 * loss) left behind: "<path>.tmpXXXXXX" untouched for S_STALE_TEMP_S,
 * removed so they do not pile up beside the data (a cut 100M-sample index
 * is gigabytes). A younger one may be another daemon's write in progress,
 * and is left alone. Best effort. */
#define S_STALE_TEMP_S 60

static void
s_remove_stale_temps(const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char dir[PATH_MAX] = ".";
    if (slash) {
        size_t dlen = slash == path ? 1 : (size_t)(slash - path);
        if (dlen >= sizeof(dir))
            return;
        memcpy(dir, path, dlen);
        dir[dlen] = '\0';
    }
    DIR *d = opendir(dir);
    if (!d)
        return;
    size_t blen = strlen(base);
    time_t now = time(NULL);
    for (struct dirent *e; (e = readdir(d));) {
        struct stat st;
        if (strncmp(e->d_name, base, blen) != 0 ||
            strncmp(e->d_name + blen, ".tmp", 4) != 0 ||
            strlen(e->d_name) != blen + 10 ||
            fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
            !S_ISREG(st.st_mode) || now - st.st_mtime < S_STALE_TEMP_S)
            continue;
        (void)unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
}

int
emlio__dsindex_write(const char *path, const struct stat *root,
                     emlio__dsindex_item_t *items, size_t n)
{
    qsort(items, n, sizeof(*items), s_cmp_items);
    emlio__dsindex_entry_t *entries =
        emlio_reallocarray(NULL, n ? n : 1, sizeof(*entries));
    char tmp[PATH_MAX];
    if (!entries)
        return -ENOMEM;
    if (snprintf(tmp, sizeof(tmp), "%s.tmpXXXXXX", path) >= (int)sizeof(tmp)) {
        emlio_free(entries);
        return -ENAMETOOLONG;
    }
    s_header_t h;
    s_layout(root, items, n, &h, entries);
    s_remove_stale_temps(path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    int rc = fd < 0 ? -errno : 0;
    if (rc == 0 && fchmod(fd, 0644) < 0)
        rc = -errno;
    if (rc == 0)
        rc = s_emit(fd, &h, entries, items, n);
    /* No fsync: a file cut short by a crash fails its size or checksum
     * checks and is rebuilt; waiting for the disk would double a first
     * start. */
    if (fd >= 0 && close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0 && fd >= 0)
        unlink(tmp);
    emlio_free(entries);
    return rc;
}

void
emlio__dsindex_close(emlio__dsindex_t *self)
{
    if (self->map)
        munmap((void *)self->map, self->size);
    memset(self, 0, sizeof(*self));
}
