/* classes.h - the class names of a dataset, for clients (WELCOME's
 * `classes`): label i's name at i.
 * SPDX-License-Identifier: MIT
 *
 * Where they come from, first that applies:
 *   - DIR/classes.txt, one name per line, line i for label i (what `emlio
 *     pack` writes next to its shards), opened by the dataset's rule for
 *     paths (beneath.h), at most EMLIO__CLASSES_MAX_FILE bytes, no empty
 *     names;
 *   - shards whose records share one label (an ImageFolder's class
 *     directories: format op shard_label): the shard's name is that
 *     label's class.
 * Otherwise the dataset has no class names, which is not an error.
 */
#ifndef EMLIO_CLASSES_H
#define EMLIO_CLASSES_H

#include <stddef.h>

#include "format.h"

/* The shard set's types (shardset.h), named here without its header. */
typedef struct emlio__shard emlio__shard_t;
typedef struct emlio__shardset emlio__shardset_t;

#define EMLIO__CLASSES_MAX_FILE (16u << 20)

/* Fills *names (n strings, emlio_malloc'd; free with emlio__classes_free)
 * from dir and set. Returns the count (0: none known), or EMLIO_ENOMEM.
 * A classes.txt that cannot be used is logged through log and ignored. */
int emlio__classes_load(const emlio__shardset_t *set, const char *dir,
                        char ***names, emlio__shardset_log_fn *log,
                        void *userdata);

void emlio__classes_free(char **names, size_t n);

#endif /* EMLIO_CLASSES_H */
