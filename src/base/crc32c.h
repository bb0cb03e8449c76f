/* crc32c.h - CRC-32C (Castagnoli), as TFRecord and iSCSI use it.
 * SPDX-License-Identifier: MIT
 *
 * Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at
 * run time with __builtin_cpu_supports) and a slicing-by-8 table otherwise.
 */
#ifndef EMLIO_CRC32C_H
#define EMLIO_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over len bytes; the standard CRC-32C with
 * pre- and post-inversion, so emlio_crc32c(0, "123456789", 9) == 0xe3069283.
 * Thread-safe. */
uint32_t emlio_crc32c(uint32_t crc, const void *data, size_t len);

/* Same result computed with the portable table path (tests compare both). */
uint32_t emlio__crc32c_sw(uint32_t crc, const void *data, size_t len);

/* CRC of the concatenation A||B given crc_a = crc(A), crc_b = crc(B) and
 * len_b = |B| (zlib's crc32_combine for CRC-32C). Lets a record's CRC be
 * checked from the CRCs of its parts in one pass over the bytes. */
uint32_t emlio_crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

/* The CRC that the middle part M of A||M||B must have for the whole to
 * have CRC whole, given crc_head = crc(A), crc_tail = crc(B), mid_len = |M|
 * and tail_len = |B| (|A| is not needed). All are the standard finished
 * CRCs (0 for an empty part), as emlio_crc32c returns them. combine run
 * backwards: the daemon sends a TFRecord sample's CRC derived from the
 * record's stored CRC without reading the sample's bytes, and the client's
 * check of the received bytes then checks them against the disk's CRC. */
uint32_t emlio_crc32c_middle(uint32_t whole, uint32_t crc_head,
                             uint32_t crc_tail, uint64_t mid_len,
                             uint64_t tail_len);

/* Same result with the portable multiply (tests compare both). */
uint32_t emlio__crc32c_middle_sw(uint32_t whole, uint32_t crc_head,
                                 uint32_t crc_tail, uint64_t mid_len,
                                 uint64_t tail_len);

/* TFRecord's masking: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t emlio_crc32c_mask(uint32_t crc);
uint32_t emlio_crc32c_unmask(uint32_t masked);

#endif /* EMLIO_CRC32C_H */
