/* fuzz_tfrecord.c - libFuzzer harness for the TFRecord framing scan.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[EMLIO_ERRMSG_LEN];
    emlio_tfrecord_loc_t *locs = NULL;
    size_t n = 0;
    /* Verify on: every data CRC is computed, so every byte is read. */
    int rc = emlio__tfrecord_scan_mem(size ? data : NULL, size, true,
                                      "fuzz.tfrecord", &locs, &n, err);
    if (rc >= 0) {
        /* What the scan accepts must tile the input exactly. */
        uint64_t off = 0;
        for (size_t i = 0; i < n; i++) {
            if (locs[i].offset != off)
                abort();
            off += locs[i].len + EMLIO_TFRECORD_OVERHEAD;
        }
        if (off != size || (size_t)rc != n)
            abort();
    } else if (locs || n) {
        abort();
    }
    emlio_free(locs);
    return 0;
}
