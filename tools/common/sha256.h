/* sha256.h - SHA-256 (FIPS 180-4), for per-sample digests in the tools
 * (`emlio fetch --digests`): the determinism checks of transforms compare
 * samples across runs, placements and processes by their SHA-256.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOL_SHA256_H
#define EMLIO_TOOL_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct tool_sha256 {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t used;
} tool_sha256_t;

void tool_sha256_init(tool_sha256_t *c);
void tool_sha256_update(tool_sha256_t *c, const void *data, size_t len);
void tool_sha256_final(tool_sha256_t *c, uint8_t out[32]);
/* The digest of data as 64 lowercase hex digits and a NUL. */
void tool_sha256_hex(const void *data, size_t len, char out[65]);

#endif /* EMLIO_TOOL_SHA256_H */
