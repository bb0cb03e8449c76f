/* beneath.h - the one rule for paths: every file the daemon and the
 * dataset tools read resolves inside the data root, and is what it claims.
 * SPDX-License-Identifier: MIT
 *
 * What is on disk is as untrusted as what comes off the network: an image
 * that is a symlink to /etc/shadow, a cache naming "../../etc/shadow", a
 * FIFO put in place of a shard. Every open of a file under a data root goes
 * through emlio__open_beneath, which
 * - resolves the path beneath the root's descriptor (openat2 with
 *   RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS, and RESOLVE_NO_SYMLINKS unless
 *   the root follows symlinks; on kernels without openat2, a walk one
 *   component at a time with O_NOFOLLOW, or, when following, a check of
 *   the opened descriptor's path against the root's);
 * - opens with O_NONBLOCK and checks fstat before anything is read, so a
 *   FIFO, socket or device is refused at once instead of blocking a reader
 *   (only regular files, or directories when asked for, are accepted).
 * Thread-safe: the root's descriptor is only read.
 */
#ifndef EMLIO_BENEATH_H
#define EMLIO_BENEATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

/* A data root. fd < 0: no root, paths are opened as given (a file named
 * on a tool's command line), still only when regular. */
typedef struct emlio__root {
    int fd;      /* O_PATH | O_DIRECTORY descriptor of the root, or -1 */
    bool follow; /* follow symlinks that resolve inside the root */
    bool owned;  /* opened by emlio__root_open: root_close closes it */
} emlio__root_t;

#define EMLIO__ROOT_NONE ((emlio__root_t){ -1, true, false })

/* Flags of emlio__open_beneath. */
#define EMLIO__OPEN_DIR       1u /* want a directory, not a regular file */
#define EMLIO__OPEN_NOOPENAT2 2u /* use the fallback (tests) */
#define EMLIO__OPEN_NOATIME                   \
    4u /* O_NOATIME where permitted (reads of \
          files that are only served) */

/* Opens dir as a root (O_PATH | O_DIRECTORY, following a symlink named by
 * the operator). Returns 0 or -errno. */
int emlio__root_open(emlio__root_t *root, const char *dir, bool follow);
/* Closes the descriptor emlio__root_open opened (a zeroed or copied root
 * is left alone: fd 0 is not ours) and sets it to -1. */
void emlio__root_close(emlio__root_t *root);

/* Opens rel (relative to the root; with no root, a path as given)
 * read-only and close-on-exec, and fills *st. Returns the descriptor, or:
 * -ELOOP (a symlink while the root does not follow them), -EXDEV (resolves
 * outside the root, or an absolute path or ".." that would), -ENOTDIR /
 * -EISDIR, EMLIO_EFORMAT (not a regular file: FIFO, socket, device),
 * -errno. emlio__open_why words the code. */
int emlio__open_beneath(const emlio__root_t *root, const char *rel,
                        unsigned flags, struct stat *st);

/* Why emlio__open_beneath refused, for "cannot open 'x': why". */
const char *emlio__open_why(int rc);

/* Is rel a path a listing may name: relative, non-empty components, no
 * "." or ".." component, no hidden component (what a walk never lists)? */
bool emlio__rel_ok(const char *rel, size_t len);

#endif /* EMLIO_BENEATH_H */
