/* fuzz_filelist.c - libFuzzer harness for the ImageFolder file list
 * (ROOT/.emlio-files, version 2): header, tables and names. The input is
 * the file; its checksum is sealed first (as a forger would), so the
 * checks behind it are reached, then the list is checked as written by
 * follow and no-follow roots alike.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "imagefolder.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An aligned copy of exactly size bytes: ASan catches any read past
     * it, and the tables are used where they lie, as a load does. */
    uint8_t *copy = emlio_malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    char why[EMLIO_ERRMSG_LEN];
    for (int follow = 0; follow < 2; follow++) {
        int rc = emlio__folder_cache_check(copy, size, follow, why);
        if (rc != 0 && rc != EMLIO_EFORMAT && rc != -ESTALE)
            abort();
        if (rc != 0 && !why[0])
            abort(); /* every refusal says why */
    }
    emlio__folder_cache_seal(copy, size);
    for (int follow = 0; follow < 2; follow++)
        (void)emlio__folder_cache_check(copy, size, follow, why);
    emlio_free(copy);
    return 0;
}
