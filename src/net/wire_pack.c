/* wire_pack.c - the offset table of a packed BATCH: the
 * receiver's check of the table from the network against the frames that
 * came with it (docs/protocol.md 5.4.1). Encoding and decoding the table
 * are in wire.c with the rest of the header.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "wire.h"

int
emlio__wire_pack_check(const emlio__wire_span_t *spans, size_t n_spans,
                       size_t want, bool has_packed, size_t packed_len,
                       char *errbuf)
{
    if (n_spans != want) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "pack table lists %zu sample frames, the samples have %zu",
                 n_spans, want);
        return EMLIO_EPROTO;
    }
    uint64_t end = 0; /* of the last span in the packed frame */
    size_t own = 0;
    bool any = false;
    for (size_t i = 0; i < n_spans; i++) {
        const emlio__wire_span_t *s = &spans[i];
        if (s->off == EMLIO_WIRE_PACK_OWN) {
            own++;
            continue;
        }
        any = true;
        if (!has_packed || s->off > packed_len ||
            s->len > packed_len - s->off) {
            snprintf(errbuf, EMLIO_ERRMSG_LEN,
                     "pack table: sample frame %zu (offset %" PRIu64
                     ", %" PRIu64 " bytes) lies outside the packed frame "
                     "(%zu bytes)",
                     i, s->off, s->len, has_packed ? packed_len : 0);
            return EMLIO_EPROTO;
        }
        if (s->off < end) {
            snprintf(errbuf, EMLIO_ERRMSG_LEN,
                     "pack table: sample frame %zu (offset %" PRIu64
                     ") overlaps or precedes the one before it (ending at "
                     "%" PRIu64 ")",
                     i, s->off, end);
            return EMLIO_EPROTO;
        }
        end = s->off + s->len;
    }
    if (has_packed && !any) {
        snprintf(errbuf, EMLIO_ERRMSG_LEN,
                 "packed frame of %zu bytes, but the pack table puts no "
                 "sample frame in it",
                 packed_len);
        return EMLIO_EPROTO;
    }
    return (int)own;
}
