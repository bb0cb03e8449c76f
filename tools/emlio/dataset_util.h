/* dataset_util.h - helpers shared by the dataset subcommands of `emlio`
 * (synth, pack, index, inspect): messages, number parsing, paths, file
 * listing and atomic writes.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_DATASET_UTIL_H
#define EMLIO_TOOLS_DATASET_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#if defined(__GNUC__)
#    define DATASET_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#    define DATASET_PRINTF(fmt, args)
#endif

/* Prints "emlio <cmd>: <message>\n" to stderr. */
void dataset_error(const char *cmd, const char *fmt, ...) DATASET_PRINTF(2, 3);
/* An emlio_dataset_log_fn: "emlio CMD: warning: msg" on stderr, cmd being
 * the command's name (a const char *). */
void dataset_warn(void *cmd, const char *msg);

/* emlio_strerror(rc) with its first letter lowercased, in buf (returned). */
const char *dataset_strerror(int rc, char *buf, size_t len);

/* Parses a non-negative decimal integer into *out. With allow_suffix, a
 * K, M, G or T suffix (optionally followed by "i" and/or "B") multiplies by
 * 1024^n. Returns 0, or -1 when s is not such a number or overflows. */
int dataset_parse_u64(const char *s, bool allow_suffix, uint64_t *out);

/* A growable list of owned strings. */
typedef struct dataset_strv {
    char **items;
    size_t n;
    size_t cap;
} dataset_strv_t;

#define DATASET_STRV_INIT \
    {                     \
        NULL, 0, 0        \
    }

/* Appends a copy of s. Returns 0 or EMLIO_ENOMEM. */
int dataset_strv_push(dataset_strv_t *self, const char *s);
/* Sorts by strcmp (byte order, as Python's sorted() orders UTF-8 names). */
void dataset_strv_sort(dataset_strv_t *self);
/* Frees every string and the array; leaves the list empty. */
void dataset_strv_release(dataset_strv_t *self);

/* Returns "a/b" in a new string (the caller frees it with emlio_free), or
 * NULL when out of memory. A trailing '/' on a is not doubled. */
char *dataset_path_join(const char *a, const char *b);

/* Lists the names in dir (not "." or ".."), sorted; when want is 'd' only
 * directories, when 'f' only regular files (symlinks are followed), when 0
 * everything. Returns 0 or -errno. */
int dataset_list_dir(const char *dir, int want, dataset_strv_t *out);

/* Creates dir and its missing parents (mode 0777 before umask).
 * Returns 0 or -errno. */
int dataset_mkdir_p(const char *dir);

/* Writes len bytes to path via a temporary file in the same directory that
 * is fsync'ed and renamed over path. Returns 0 or -errno. */
int dataset_write_file_atomic(const char *path, const void *data, size_t len);

/* Writes all len bytes to fd, retrying on EINTR and short writes.
 * Returns 0 or -errno. */
int dataset_write_all(int fd, const void *data, size_t len);

/* Reads the whole regular file at path into *out (cleared first; out is an
 * emlio_buf_t). Returns 0, -errno or EMLIO_ENOMEM. */
struct emlio_buf;
int dataset_read_file(const char *path, struct emlio_buf *out);

/* Seconds on the monotonic clock. */
double dataset_now(void);

/* A small, fast, seedable PRNG (splitmix64), so every output of the tools
 * is a pure function of --seed. */
static inline uint64_t
dataset_rand_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* A uniform integer in [0, n) (n > 0), with negligible bias for n < 2^32. */
static inline uint64_t
dataset_rand_below(uint64_t *state, uint64_t n)
{
    return (uint64_t)(((unsigned __int128)dataset_rand_next(state) * n) >> 64);
}

#endif /* EMLIO_TOOLS_DATASET_UTIL_H */
