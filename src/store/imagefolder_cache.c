/* imagefolder_cache.c - ROOT/.emlio-files, the ImageFolder file-list
 * cache: each class's directories (identity and mtime) and files (size
 * and mtime), so that a start stats directories, not files.
 * SPDX-License-Identifier: MIT
 *
 * Format version 2 (docs/formats.md), binary, host byte order, every
 * table 8-byte aligned so the entries are used where they lie in the
 * buffer read: header (64 bytes) | classes | directories | files | names.
 */
#include "base.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "beneath.h"
#include "imagefolder_list.h"

#define S_MAGIC    "emlio-if"
#define S_VERSION  2u
#define S_ORDER    0x01020304u
#define S_FOLLOW   1u
/* Far beyond any tree (ImageNet's list is ~52 MB); never read past it. */
#define S_MAX      ((uint64_t)1 << 30)
/* A directory whose mtime is this close to (or after) the moment its walk
 * began may have changed again within the same clock tick after it was
 * read (file systems stamp with a coarse clock; FAT keeps 2 s): such a
 * class is listed again at the next start ("racy git"). */
#define S_RACY_NS  ((int64_t)2000000000)
/* No image is this big; a list saying so is a lie (and sums overflow). */
#define S_MAX_FILE ((uint64_t)1 << 48)

typedef struct {
    char magic[8];
    uint32_t version;
    uint32_t order; /* S_ORDER as the writer stored it */
    uint64_t total; /* the file's length */
    uint32_t crc;   /* CRC-32C of bytes [64, total) */
    uint32_t flags; /* S_FOLLOW: listed following symlinks */
    uint64_t n_classes;
    uint64_t n_dirs;
    uint64_t n_files;
    uint64_t names_len;
} s_header_t;

typedef struct {
    uint64_t first_file;
    uint64_t n_files;
    uint64_t first_dir;
    uint64_t n_dirs;
    int64_t listed_ns;
    uint32_t name;
    uint32_t len;
    uint32_t flags; /* EMLIO__FOLDER_RELIST */
    uint32_t pad;
} s_class_t;

_Static_assert(sizeof(s_header_t) == 64, "cache header layout");
_Static_assert(sizeof(s_class_t) == 56, "cache class layout");
_Static_assert(sizeof(emlio__folder_dir_t) == 32, "cache dir layout");
_Static_assert(sizeof(emlio__folder_file_t) == 24, "cache file layout");

/* The tables of a cache in memory (pointers into its buffer). */
typedef struct {
    s_header_t h;
    const s_class_t *classes;
    const emlio__folder_dir_t *dirs;
    const emlio__folder_file_t *files;
    const char *names;
} s_cache_t;

/* Says why a cached listing is not used (once: the first reason). */
static int
s_why(char *why, int rc, const char *cls, const char *what)
{
    if (why && !why[0])
        snprintf(why, EMLIO_ERRMSG_LEN, "%s%s%.200s%s", what,
                 cls ? " (class '" : "", cls ? cls : "", cls ? "')" : "");
    return rc;
}

static int
s_cmp_folders(const void *a, const void *b)
{
    return strcmp((*(emlio__folder_t *const *)a)->cls,
                  (*(emlio__folder_t *const *)b)->cls);
}

/* Appends name (NUL included) at *at; returns its offset. */
static uint32_t
s_put(char *names, size_t *at, const char *name, size_t len)
{
    uint32_t off = (uint32_t)*at;
    memcpy(names + *at, name, len);
    names[*at + len] = '\0';
    *at += len + 1;
    return off;
}

/* Sizes the cache of folders: its total length, or 0 when over S_MAX. */
static uint64_t
s_size(emlio__folder_t *const *folders, size_t n, s_header_t *h)
{
    *h = (s_header_t){ .n_classes = n };
    for (size_t c = 0; c < n; c++) {
        const emlio__folder_t *f = folders[c];
        h->n_dirs += f->n_dirs;
        h->n_files += f->n;
        h->names_len += strlen(f->cls) + 1;
        for (size_t i = 0; i < f->n_dirs; i++)
            h->names_len += f->dirs[i].len + 1u;
        for (size_t i = 0; i < f->n; i++)
            h->names_len += f->files[i].len + 1u;
    }
    uint64_t total = sizeof(s_header_t) + n * sizeof(s_class_t) +
                     h->n_dirs * sizeof(emlio__folder_dir_t) +
                     h->n_files * sizeof(emlio__folder_file_t) + h->names_len;
    return total > S_MAX ? 0 : total;
}

/* Lays out the cache of sorted folders[0, n) into mem[0, total). */
static void
s_fill(uint8_t *mem, const s_header_t *h, emlio__folder_t *const *folders,
       size_t n)
{
    s_class_t *classes = (s_class_t *)(mem + sizeof(*h));
    emlio__folder_dir_t *dirs = (emlio__folder_dir_t *)(classes + n);
    emlio__folder_file_t *files = (emlio__folder_file_t *)(dirs + h->n_dirs);
    char *names = (char *)(files + h->n_files);
    size_t at = 0;
    uint64_t d = 0, k = 0;
    for (size_t c = 0; c < n; c++) {
        const emlio__folder_t *f = folders[c];
        size_t len = strlen(f->cls);
        classes[c] = (s_class_t){
            .first_file = k,
            .n_files = f->n,
            .first_dir = d,
            .n_dirs = f->n_dirs,
            .listed_ns = f->listed_ns,
            .name = s_put(names, &at, f->cls, len),
            .len = (uint32_t)len,
            .flags = f->flags,
        };
        for (size_t i = 0; i < f->n_dirs; i++, d++) {
            dirs[d] = f->dirs[i];
            dirs[d].name =
                s_put(names, &at, f->names + f->dirs[i].name, f->dirs[i].len);
        }
        for (size_t i = 0; i < f->n; i++, k++) {
            files[k] = f->files[i];
            files[k].name =
                s_put(names, &at, f->names + f->files[i].name, f->files[i].len);
        }
    }
}

int
emlio__folder_cache_seal(uint8_t *data, size_t len)
{
    if (len < sizeof(s_header_t))
        return EMLIO_EFORMAT;
    uint32_t crc =
        emlio_crc32c(0, data + sizeof(s_header_t), len - sizeof(s_header_t));
    memcpy(data + offsetof(s_header_t, crc), &crc, sizeof(crc));
    return 0;
}

int
emlio__folder_cache_write(const char *path, bool follow,
                          emlio__folder_t *const *folders, size_t n)
{
    /* Sorted by name, so a load finds each class by binary search. */
    emlio__folder_t **sorted = emlio_calloc(n ? n : 1, sizeof(*sorted));
    if (!sorted)
        return -ENOMEM;
    for (size_t c = 0; c < n; c++)
        sorted[c] = folders[c];
    if (n > 1)
        qsort(sorted, n, sizeof(*sorted), s_cmp_folders);
    s_header_t h;
    uint64_t total = s_size(sorted, n, &h);
    uint8_t *mem = total ? emlio_calloc(1, (size_t)total) : NULL;
    int rc = !total ? -EFBIG : !mem ? -ENOMEM : 0;
    if (rc == 0) {
        memcpy(h.magic, S_MAGIC, sizeof(h.magic));
        h.version = S_VERSION;
        h.order = S_ORDER;
        h.total = total;
        h.flags = follow ? S_FOLLOW : 0;
        memcpy(mem, &h, sizeof(h));
        s_fill(mem, &h, sorted, n);
        emlio__folder_cache_seal(mem, (size_t)total);
        rc = emlio__write_file_atomic(path, mem, (size_t)total);
    }
    emlio_free(mem);
    emlio_free(sorted);
    return rc;
}

/* Is [off, off + len) a NUL-terminated name inside the names, with no
 * NUL before its end? */
static bool
s_name_ok(const s_cache_t *c, uint32_t off, uint32_t len)
{
    return (uint64_t)off + len < c->h.names_len &&
           c->names[(size_t)off + len] == '\0' &&
           !memchr(c->names + off, '\0', len);
}

/* Header and table bounds: everything later indexes inside the buffer. */
static int
s_open_tables(const uint8_t *data, size_t len, bool follow, s_cache_t *c,
              char *why)
{
    if (len < sizeof(s_header_t))
        return s_why(why, EMLIO_EFORMAT, NULL, "too short");
    memcpy(&c->h, data, sizeof(c->h));
    const s_header_t *h = &c->h;
    if (memcmp(h->magic, S_MAGIC, sizeof(h->magic)) != 0 ||
        h->version != S_VERSION)
        return s_why(why, EMLIO_EFORMAT, NULL, "not a version 2 file list");
    if (h->order != S_ORDER)
        return s_why(why, -ESTALE, NULL, "written on another byte order");
    if (h->total != len || len > S_MAX)
        return s_why(why, EMLIO_EFORMAT, NULL, "truncated or extended");
    if (h->crc != emlio_crc32c(0, data + sizeof(*h), len - sizeof(*h)))
        return s_why(why, EMLIO_EFORMAT, NULL, "checksum mismatch");
    if (!!(h->flags & S_FOLLOW) != follow)
        return s_why(why, -ESTALE, NULL,
                     follow ? "written without --follow-symlinks"
                            : "written with --follow-symlinks");
    /* Each count is below len before any product is taken. */
    if (h->n_classes > len || h->n_dirs > len || h->n_files > len ||
        h->names_len > len || h->names_len > UINT32_MAX ||
        sizeof(*h) + h->n_classes * sizeof(s_class_t) +
                h->n_dirs * sizeof(emlio__folder_dir_t) +
                h->n_files * sizeof(emlio__folder_file_t) + h->names_len !=
            len)
        return s_why(why, EMLIO_EFORMAT, NULL, "tables do not add up");
    c->classes = (const s_class_t *)(data + sizeof(*h));
    c->dirs = (const emlio__folder_dir_t *)(c->classes + h->n_classes);
    c->files = (const emlio__folder_file_t *)(c->dirs + h->n_dirs);
    c->names = (const char *)(c->files + h->n_files);
    for (uint64_t i = 0; i < h->n_classes; i++) {
        const s_class_t *k = &c->classes[i];
        const char *name = c->names + k->name;
        if (!s_name_ok(c, k->name, k->len) || !emlio__rel_ok(name, k->len) ||
            memchr(name, '/', k->len) || k->n_dirs == 0 ||
            k->first_dir > h->n_dirs || k->n_dirs > h->n_dirs - k->first_dir ||
            k->first_file > h->n_files ||
            k->n_files > h->n_files - k->first_file ||
            (i && strcmp(c->names + c->classes[i - 1].name, name) >= 0))
            return s_why(why, EMLIO_EFORMAT, NULL, "a bad class entry");
    }
    return 0;
}

static int
s_cmp_dir_name(const void *key, const void *elem, const char *names)
{
    return strcmp((const char *)key,
                  names + ((const emlio__folder_dir_t *)elem)->name);
}

/* Is dir (a "sub/" prefix, NUL-terminated) among the class's dirs? */
static bool
s_has_dir(const s_cache_t *c, const s_class_t *k, const char *dir)
{
    size_t lo = 0, hi = (size_t)k->n_dirs;
    const emlio__folder_dir_t *dirs = c->dirs + k->first_dir;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = s_cmp_dir_name(dir, &dirs[mid], c->names);
        if (cmp == 0)
            return true;
        if (cmp < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return false;
}

/* Names as a walk writes them: the class directory first (""), then
 * "sub/" directories; files relative, nothing hidden, no "..", images
 * only, in a listed directory; each table sorted without repeats. */
static int
s_check_class(const s_cache_t *c, const s_class_t *k, char *why)
{
    const char *cls = c->names + k->name;
    const emlio__folder_dir_t *dirs = c->dirs + k->first_dir;
    for (uint64_t i = 0; i < k->n_dirs; i++) {
        const char *rel = c->names + dirs[i].name;
        size_t rl = dirs[i].len;
        if (!s_name_ok(c, dirs[i].name, dirs[i].len) || (i == 0) != (rl == 0) ||
            (rl && (rel[rl - 1] != '/' || !emlio__rel_ok(rel, rl - 1))) ||
            (i && strcmp(c->names + dirs[i - 1].name, rel) >= 0))
            return s_why(why, EMLIO_EFORMAT, cls, "a bad directory entry");
    }
    const emlio__folder_file_t *files = c->files + k->first_file;
    char parent[PATH_MAX];
    for (uint64_t i = 0; i < k->n_files; i++) {
        if (!s_name_ok(c, files[i].name, files[i].len))
            return s_why(why, EMLIO_EFORMAT, cls, "a bad file entry");
        const char *rel = c->names + files[i].name;
        const char *slash = strrchr(rel, '/');
        bool ok = emlio__rel_ok(rel, files[i].len) &&
                  emlio__folder_is_image(slash ? slash + 1 : rel) &&
                  files[i].size <= S_MAX_FILE &&
                  (!i || strcmp(c->names + files[i - 1].name, rel) < 0);
        if (ok && slash) {
            size_t pl = (size_t)(slash - rel) + 1;
            ok = pl < sizeof(parent);
            if (ok) {
                memcpy(parent, rel, pl);
                parent[pl] = '\0';
                ok = s_has_dir(c, k, parent);
            }
        }
        if (!ok)
            return s_why(why, EMLIO_EFORMAT, cls, "a bad file entry");
    }
    return 0;
}

int
emlio__folder_cache_check(const uint8_t *data, size_t len, bool follow,
                          char *why)
{
    if (why)
        why[0] = '\0';
    s_cache_t c;
    int rc = s_open_tables(data, len, follow, &c, why);
    for (uint64_t i = 0; rc == 0 && i < c.h.n_classes; i++)
        rc = s_check_class(&c, &c.classes[i], why);
    return rc;
}

/* Is the class as listed still the tree's? Each directory it lists is
 * opened (beneath the root) and compared by identity and mtime: a file
 * added, removed or renamed in any of them changes that. No file is
 * stat'ed; each is checked when read. */
static int
s_fresh(const s_cache_t *c, const s_class_t *k, const emlio__folder_t *f,
        char *why)
{
    if (k->flags & EMLIO__FOLDER_RELIST)
        return s_why(why, -ESTALE, f->cls,
                     "it left out links or unreadable directories");
    const emlio__folder_dir_t *dirs = c->dirs + k->first_dir;
    for (uint64_t i = 0; i < k->n_dirs; i++) {
        struct stat st;
        int fd = emlio__folder_open(f, c->names + dirs[i].name, EMLIO__OPEN_DIR,
                                    &st);
        if (fd < 0)
            return s_why(why, -ESTALE, f->cls, "a directory is gone");
        close(fd);
        if ((uint64_t)st.st_dev != dirs[i].dev ||
            (uint64_t)st.st_ino != dirs[i].ino ||
            emlio__folder_ns(st.st_mtim) != dirs[i].mtime_ns)
            return s_why(why, -ESTALE, f->cls, "a directory changed");
        if (dirs[i].mtime_ns >= k->listed_ns - S_RACY_NS)
            return s_why(why, -ESTALE, f->cls,
                         "a directory changed as it was listed");
    }
    return 0;
}

/* Points folder f at class k of the cache (sharing its block). */
static void
s_adopt(emlio__folder_t *f, const s_cache_t *c, const s_class_t *k,
        emlio__folder_blob_t *blob)
{
    atomic_fetch_add(&blob->refs, 1);
    f->blob = blob;
    f->dirs = c->dirs + k->first_dir;
    f->n_dirs = (size_t)k->n_dirs;
    f->files = c->files + k->first_file;
    f->n = (size_t)k->n_files;
    f->names = c->names;
    f->names_len = (size_t)c->h.names_len;
    f->listed_ns = k->listed_ns;
    f->flags = k->flags;
    f->cached = true;
    f->bytes = 0;
    for (size_t i = 0; i < f->n; i++)
        f->bytes += f->files[i].size;
}

static const s_class_t *
s_find(const s_cache_t *c, const char *cls)
{
    size_t lo = 0, hi = (size_t)c->h.n_classes;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(cls, c->names + c->classes[mid].name);
        if (cmp == 0)
            return &c->classes[mid];
        if (cmp < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}

int
emlio__folder_cache_load(uint8_t **data_p, size_t len, bool follow,
                         emlio__folder_t *const *folders, size_t n,
                         bool *rewrite, char *why)
{
    if (why)
        why[0] = '\0';
    *rewrite = true;
    s_cache_t c;
    int rc = s_open_tables(*data_p, len, follow, &c, why);
    if (rc < 0)
        return rc;
    emlio__folder_blob_t *blob = emlio__folder_blob_new(*data_p);
    if (!blob)
        return EMLIO_ENOMEM;
    *data_p = NULL;
    size_t stale = 0, matched = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const s_class_t *k = s_find(&c, folders[i]->cls);
        if (!k) {
            stale++;
            s_why(why, 0, folders[i]->cls, "a new class");
            continue;
        }
        matched++;
        rc = s_check_class(&c, k, why);
        if (rc == 0 && s_fresh(&c, k, folders[i], why) < 0)
            stale++;
        else if (rc == 0)
            s_adopt(folders[i], &c, k, blob);
    }
    if (rc < 0)
        for (size_t i = 0; i < n; i++)
            emlio__folder_forget(folders[i]);
    emlio__folder_blob_drop(&blob);
    /* Classes gone from the tree are dropped from the list next time. */
    *rewrite = stale > 0 || matched != c.h.n_classes;
    if (rc == 0 && !stale && matched != c.h.n_classes)
        s_why(why, 0, NULL, "classes removed");
    return rc < 0 ? rc : (int)stale;
}
