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

/* Scans one shard (a *.tar, else a TFRecord file), checking every data CRC
 * when verify, and writes its index <path>.idx; prints a line for it unless
 * quiet. Returns its record count, or -1 after printing the error (a
 * corrupt file with the offset, an index that cannot be written). */
long formats_index_file(const char *cmd, const char *path, bool verify,
                        bool quiet);

/* Converts the dataset at src (any format) into WebDataset tar shards
 * dst/<prefix>-NNNNN.tar of about shard_bytes each (samples keyed by their
 * position, fields kept, the label as ".cls"), each indexed as written;
 * follow: symlinks inside src are followed (never out of it). Returns the
 * exit status. */
int formats_pack_tar(const char *cmd, const char *src, const char *dst,
                     const char *prefix, uint64_t shard_bytes, bool quiet,
                     bool follow);

#endif /* EMLIO_TOOLS_FORMATS_H */
