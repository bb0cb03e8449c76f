/* formats.h - `emlio inspect`, `index` and `pack` for every format emliod
 * serves (TFRecord, WebDataset tar, ImageFolder), through emlio/dataset.h.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_FORMATS_H
#define EMLIO_TOOLS_FORMATS_H

#include <stdbool.h>
#include <stdint.h>

/* Whether path names a tar shard ("*.tar"). */
bool formats_is_tar(const char *path);

/* Prints a summary of the data directory (or the one tar shard) at path:
 * formats, shards, records, bytes, the fields of the first `sample`
 * records of each shard (0 = all) and the label range. Returns the exit
 * status. */
int formats_inspect(const char *cmd, const char *path, bool json,
                    uint64_t sample);

/* Scans every tar shard under path (a directory, or the directory of the
 * tar named) and rewrites its wds2idx index. Adds the samples to *records;
 * returns the number of shards indexed or -1 after printing the error. */
long formats_index_tars(const char *cmd, const char *path, bool quiet,
                        uint64_t *records);

/* Converts the dataset at src (any format) into WebDataset tar shards
 * dst/<prefix>-NNNNN.tar of about shard_bytes each (samples keyed by their
 * position, fields kept, the label as ".cls"), then indexes them. Returns
 * the exit status. */
int formats_pack_tar(const char *cmd, const char *src, const char *dst,
                     const char *prefix, uint64_t shard_bytes, bool quiet);

#endif /* EMLIO_TOOLS_FORMATS_H */
