/* fuzz_index.c - libFuzzer harness for the DALI index text parser.
 * SPDX-License-Identifier: MIT
 *
 * The input is split at its first NUL byte: what comes before is the index
 * text, what follows is the shard it is checked against. Inputs without a
 * NUL check the whole input as text against a fixed three-record shard
 * built here, so plain text seeds reach the deep checks too.
 */
#include "emlio_internal.h"

#include "tfrecord.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *text = (const char *)data;
    size_t text_len = size;
    const uint8_t *shard = NULL;
    size_t shard_len = 0;
    emlio_buf_t fixed = EMLIO_BUF_INIT;
    const uint8_t *nul = size ? memchr(data, 0, size) : NULL;
    if (nul) {
        text_len = (size_t)(nul - data);
        shard = nul + 1;
        shard_len = size - text_len - 1;
    } else {
        /* Records of 0, 5 and 20 bytes: index "0 16\n16 21\n37 36\n". */
        static const uint8_t payload[20] = "abcdefghijklmnopqrst";
        if (emlio_tfrecord_append(&fixed, payload, 0) < 0 ||
            emlio_tfrecord_append(&fixed, payload, 5) < 0 ||
            emlio_tfrecord_append(&fixed, payload, 20) < 0) {
            emlio_buf_release(&fixed);
            return 0;
        }
        shard = fixed.data;
        shard_len = fixed.len;
    }
    /* Copy the text so a read past text_len is caught by ASan rather than
     * landing on the shard bytes that follow it. */
    char *copy = emlio_malloc(text_len);
    if (!copy) {
        emlio_buf_release(&fixed);
        return 0;
    }
    if (text_len)
        memcpy(copy, text, text_len);
    char err[EMLIO_ERRMSG_LEN];
    emlio_tfrecord_loc_t *locs = NULL;
    size_t n = 0;
    int rc = emlio__tfrecord_parse_index(copy, text_len, "fuzz.idx",
                                         shard_len ? shard : NULL, shard_len,
                                         "fuzz.tfrecord", &locs, &n, err);
    if (rc >= 0) {
        /* An accepted index tiles the shard exactly, like a scan would. */
        emlio_tfrecord_loc_t *scanned = NULL;
        size_t m = 0;
        if (emlio__tfrecord_scan_mem(shard_len ? shard : NULL, shard_len, false,
                                     "fuzz.tfrecord", &scanned, &m,
                                     err) != rc ||
            m != n || (n && memcmp(scanned, locs, n * sizeof(*locs)) != 0))
            abort();
        emlio_free(scanned);
    }
    emlio_free(locs);
    emlio_free(copy);
    emlio_buf_release(&fixed);
    return 0;
}
