/* tar_header.h - the parts of a tar header, as bytes: numbers (octal or
 * GNU base-256), the checksum (unsigned or signed), end-of-archive blocks,
 * member types, and pax extended headers. Pure functions, for tar.c.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TAR_HEADER_H
#define EMLIO_TAR_HEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EMLIO__TAR_BLOCK 512

/* Octal (NUL/space padded) or GNU base-256 number field p[0, n). */
bool emlio__tarh_number(const uint8_t *p, size_t n, uint64_t *out);
/* Whether the 512-byte header h carries a right checksum. */
bool emlio__tarh_checksum_ok(const uint8_t *h);
/* Whether h is all zero (the end of an archive). */
bool emlio__tarh_zero_block(const uint8_t *h);
/* The length of the NUL-terminated field p[0, n). */
size_t emlio__tarh_strnlen(const uint8_t *p, size_t n);
/* Whether typeflag names a regular file member. */
bool emlio__tarh_regular(uint8_t type);
/* Reads the "path" (into path[0, EMLIO_TAR_MAX_NAME)) and "size" records
 * of a pax extended header data[0, len). 0 or EMLIO_EFORMAT. */
int emlio__tarh_pax(const uint8_t *data, size_t len, char *path,
                    size_t *path_len, bool *have_path, uint64_t *size,
                    bool *have_size);

#endif /* EMLIO_TAR_HEADER_H */
