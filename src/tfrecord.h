/* tfrecord.h - internal helpers of the TFRecord module (writing side).
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TFRECORD_PRIV_H
#define EMLIO_TFRECORD_PRIV_H

#include "buf.h"
#include "emlio/tfrecord.h"

/* Appends one framed record (length, masked length CRC, data, masked data
 * CRC) to out. Returns 0 or EMLIO_ENOMEM. Used by `emlio pack` and tests. */
int emlio__tfrecord_append(emlio_buf_t *out, const uint8_t *data, size_t len);

#endif /* EMLIO_TFRECORD_PRIV_H */
