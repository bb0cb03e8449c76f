/* fuzz_tar.c - libFuzzer harness for the WebDataset tar header walk and
 * the wds2idx index parser.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* What the walk accepts must be consistent: members inside the input, at
 * block boundaries, in increasing order, samples tiling the members; and
 * its own index, written in DALI's format, must load back identically. */
int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[EMLIO_ERRMSG_LEN];
    emlio__tar_index_t idx;
    int rc =
        emlio__tar_scan_mem(size ? data : NULL, size, "fuzz.tar", &idx, err);
    if (rc < 0) {
        if (idx.members || idx.n_members || idx.first || idx.fields)
            abort();
        return 0;
    }
    if ((size_t)rc != idx.n_samples)
        abort();
    uint64_t end = 0;
    for (size_t i = 0; i < idx.n_members; i++) {
        const emlio__tar_member_t *m = &idx.members[i];
        if (m->offset % 512 || m->offset < end + 512 || m->offset > size ||
            m->len > size - m->offset || m->field >= idx.n_fields)
            abort();
        end = m->offset + m->len;
    }
    for (size_t s = 0; s < idx.n_samples; s++)
        if (idx.first[s] >= idx.first[s + 1])
            abort();
    if (idx.n_samples && idx.first[idx.n_samples] != idx.n_members)
        abort();
    /* Round trip through the index text (names without white space). */
    emlio_buf_t text = EMLIO_BUF_INIT;
    bool writable = idx.n_samples > 0;
    int wrc = emlio_buf_addf(&text, "v1.2 %zu\n", idx.n_samples);
    for (size_t s = 0; s < idx.n_samples && wrc == 0 && writable; s++) {
        for (uint32_t m = idx.first[s]; m < idx.first[s + 1]; m++) {
            const char *nm = idx.names[m];
            if (strpbrk(nm, " \n\t\r") || strlen(nm) == 0)
                writable = false;
            wrc |= emlio_buf_addf(
                &text, "%s%s %" PRIu64 " %" PRIu64 " %s",
                m == idx.first[s] ? "" : " ", idx.fields[idx.members[m].field],
                idx.members[m].offset, idx.members[m].len, nm);
        }
        wrc |= emlio_buf_addf(&text, "\n");
    }
    if (writable && wrc == 0) {
        emlio__tar_index_t back;
        int brc = emlio__tar_parse_index((const char *)text.data, text.len,
                                         "fuzz.idx", data, size, "fuzz.tar",
                                         &back, err);
        /* A name holding NUL bytes or a field that lower-cases differently
         * may not round-trip; everything else must. */
        if (brc >= 0 && (size_t)brc != idx.n_samples)
            abort();
        if (brc >= 0)
            for (size_t i = 0; i < back.n_members; i++)
                if (back.members[i].offset != idx.members[i].offset ||
                    back.members[i].len != idx.members[i].len)
                    abort();
        emlio__tar_index_release(&back);
    }
    /* The parser alone on arbitrary text against this input. */
    emlio__tar_index_t other;
    if (emlio__tar_parse_index((const char *)data, size, "fuzz.idx", data, size,
                               "fuzz.tar", &other, err) >= 0)
        emlio__tar_index_release(&other);
    emlio_buf_release(&text);
    emlio__tar_index_release(&idx);
    return 0;
}
