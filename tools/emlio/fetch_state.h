/* fetch_state.h - the state file of `emlio fetch --state`, bound to the
 * --ids file it was saved with.
 * SPDX-License-Identifier: MIT
 *
 * Layout (little-endian): "EMF3", u64 length of the ids file when the state
 * was saved, u64 FNV-1a 64 of the last FETCH_STATE_TAIL bytes before that
 * length (or of all of them when fewer), u32 n, the ids file's absolute
 * path in n bytes (n = 0 without --ids), then the library's resume blob.
 * A resume checks that it names the same ids file, that the file still has
 * that length (it may be longer: the lines after it are cut) and that its
 * tail still hashes the same, so a lost, cut, rewritten or other ids file
 * is refused instead of being padded with NUL bytes or taken for the old
 * one. Files of the earlier layouts are still read: "EMF2" (no path) and
 * "EMFS" (length only; the ids file is checked for length only).
 */
#ifndef EMLIO_TOOLS_FETCH_STATE_H
#define EMLIO_TOOLS_FETCH_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "emlio.h"

#define FETCH_STATE_TAIL 4096

typedef struct fetch_state {
    uint64_t ids_len;  /* bytes of the ids file that match the state */
    uint64_t ids_hash; /* FNV-1a 64 of its tail */
    bool has_hash;     /* false for the first layout */
    char *ids_path;    /* absolute path it was saved with (owned), or NULL */
    uint8_t *blob;     /* the library's resume blob (owned) */
    size_t blob_len;
} fetch_state_t;

/* Writes the state of client, bound to ids (flushed first; may be NULL),
 * to path atomically (path.tmp, then rename). Returns 0, or -1 after
 * printing "emlio fetch: cannot write ..." with the reason (a full disk
 * says "No space left on device"). */
int fetch_state_save(emlio_client_t *client, const char *path, FILE *ids,
                     const char *ids_path);

/* Reads path into st. Returns 1 when read, 0 when path does not exist, or
 * -1 after printing why it cannot be used. fetch_state_release frees it. */
int fetch_state_load(const char *path, fetch_state_t *st);

/* Checks that the ids file at ids_path is the one st was saved with.
 * Returns 0, or -1 after printing what is wrong and how to go on. */
int fetch_state_check_ids(const fetch_state_t *st, const char *state_path,
                          const char *ids_path);

void fetch_state_release(fetch_state_t *st);

/* Elastic resume (`--resume-from`): reads every state file the last run of
 * the job saved, named by `from` (a directory: its regular files not
 * ending in ".tmp"; else a glob(3) pattern), and has client resume their
 * epoch on its own world size (emlio_client_load_states). own_state, this
 * run's --state (may be NULL), must not be one of them: the other ranks
 * may still be reading it. Returns 0, or -1 after printing why, naming
 * the file. */
int fetch_state_resume_from(emlio_client_t *client, const char *from,
                            const char *own_state);

#endif /* EMLIO_TOOLS_FETCH_STATE_H */
