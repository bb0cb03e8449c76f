/* tar_index.c - a tar shard's indexes on disk: DALI's wds2idx v1.2 file
 * beside the shard (loaded and checked against a walk of the archive,
 * written) and the record table the dataset index keeps for it (dsindex.h;
 * layout in docs/protocol.md 9.1).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "tar.h"

/* Where two indexes of one shard differ, as a sample number; -1 when
 * they are the same (members, offsets, sizes, fields and samples). */
static ssize_t
s_index_diff(const emlio__tar_index_t *a, const emlio__tar_index_t *b)
{
    size_t n = a->n_samples < b->n_samples ? a->n_samples : b->n_samples;
    for (size_t i = 0; i < n; i++) {
        if (a->first[i + 1] - a->first[i] != b->first[i + 1] - b->first[i])
            return (ssize_t)i;
        for (uint32_t k = 0; k < a->first[i + 1] - a->first[i]; k++) {
            const emlio__tar_member_t *ma = &a->members[a->first[i] + k];
            const emlio__tar_member_t *mb = &b->members[b->first[i] + k];
            if (ma->offset != mb->offset || ma->len != mb->len ||
                strcmp(a->fields[ma->field], b->fields[mb->field]) != 0)
                return (ssize_t)i;
        }
    }
    return a->n_samples == b->n_samples ? -1 : (ssize_t)n;
}

/* An index is a hint: it is kept only when it says what a header walk of
 * the shard finds. Checking each listed member's header already touched
 * every header page, so the walk costs about what the check did; what it
 * adds is the members the index left out (samples silently dropped) and
 * the names in the headers themselves (a label member listed as the
 * image, a member moved to another sample). */
static int
s_check_index(emlio__tar_t *self, const char *idx_path)
{
    emlio__tar_index_t walked;
    char err[EMLIO_ERRMSG_LEN];
    int rc = emlio__tar_walk(self->file.base, self->file.size, self->file.path,
                             false, &walked, err);
    if (rc < 0) {
        emlio__tar_index_release(&self->idx);
        return emlio__seterr(self->file.err, rc, "%s", err);
    }
    ssize_t at = s_index_diff(&self->idx, &walked);
    size_t listed = self->idx.n_samples, found = walked.n_samples;
    emlio__tar_index_release(&walked);
    if (at < 0)
        return (int)listed;
    emlio__tar_index_release(&self->idx);
    return emlio__seterr(self->file.err, EMLIO_EFORMAT,
                         "index '%s' does not describe '%s' (%zu samples "
                         "listed, %zu found; first difference at sample %zd)",
                         idx_path, self->file.path, listed, found, at);
}

int
emlio__tar_load_index(emlio__tar_t *self, const char *idx_path)
{
    assert(self && self->file.open);
    char *text;
    size_t got;
    int rc =
        emlio__mapfile_read_beside(&self->file, idx_path, true, &text, &got);
    if (rc < 0)
        return rc;
    emlio__tar_drop(self);
    rc = emlio__tar_parse_index(text, got, idx_path, self->file.base,
                                self->file.size, self->file.path, &self->idx,
                                self->file.err);
    emlio_free(text);
    if (rc >= 0)
        rc = s_check_index(self, idx_path);
    return rc;
}

int
emlio__tar_write_index(const emlio__tar_t *self, const char *idx_path)
{
    const emlio__tar_index_t *idx = &self->idx;
    if (!idx->names || idx->n_samples == 0)
        return -EINVAL;
    emlio_buf_t text = EMLIO_BUF_INIT;
    int rc = emlio_buf_addf(&text, "v1.2 %zu\n", idx->n_samples);
    for (size_t s = 0; s < idx->n_samples && rc == 0; s++) {
        for (uint32_t m = idx->first[s]; m < idx->first[s + 1] && rc == 0;
             m++) {
            const char *nm = idx->names[m];
            for (const char *c = nm; *c; c++)
                if (*c == ' ' || *c == '\n' || *c == '\t' || *c == '\r')
                    rc = -EINVAL;
            if (rc == 0)
                rc = emlio_buf_addf(&text, "%s%s %" PRIu64 " %" PRIu64 " %s",
                                    m == idx->first[s] ? "" : " ",
                                    idx->fields[idx->members[m].field],
                                    idx->members[m].offset, idx->members[m].len,
                                    nm);
        }
        if (rc == 0)
            rc = emlio_buf_addf(&text, "\n");
    }
    if (rc < 0) {
        emlio_buf_release(&text);
        return rc == -EINVAL ? rc : -ENOMEM;
    }
    rc = emlio__write_file_atomic(idx_path, text.data, text.len);
    emlio_buf_release(&text);
    return rc;
}

/* ---- the dataset index's table ---------------------------------------- */

#define S_HEAD 32u /* counts before the strings */

_Static_assert(sizeof(emlio__tar_member_t) == 24, "member layout");

static size_t
s_pad8(size_t n)
{
    return (n + 7) & ~(size_t)7;
}

/* Bytes of the strings area: field names, prune key, example. */
static size_t
s_strings_len(const emlio__tar_index_t *idx, const emlio__tar_pruned_t *p)
{
    size_t n = strlen(p->key) + 1 + strlen(p->example) + 1;
    for (size_t k = 0; k < idx->n_fields; k++)
        n += strlen(idx->fields[k]) + 1;
    return n;
}

/* Copies str with its NUL to s; returns the byte after it. */
static char *
s_put_str(char *s, const char *str)
{
    size_t n = strlen(str) + 1;
    memcpy(s, str, n);
    return s + n;
}

int
emlio__tar_table_write(const emlio__tar_index_t *idx,
                       const emlio__tar_pruned_t *pruned, uint8_t **out,
                       size_t *len)
{
    size_t strings = s_strings_len(idx, pruned);
    size_t members = idx->n_members * sizeof(*idx->members);
    size_t firsts = (idx->n_samples + 1) * sizeof(uint32_t);
    size_t total = S_HEAD + s_pad8(strings) + members + firsts;
    uint8_t *t = emlio_calloc(1, total);
    if (!t || strings > UINT32_MAX) {
        emlio_free(t);
        return EMLIO_ENOMEM;
    }
    uint64_t head[2] = { idx->n_members, idx->n_samples };
    uint32_t counts[2] = { (uint32_t)idx->n_fields, (uint32_t)strings };
    uint64_t dropped = pruned->dropped;
    memcpy(t, head, 16);
    memcpy(t + 16, counts, 8);
    memcpy(t + 24, &dropped, 8);
    char *s = (char *)t + S_HEAD;
    for (size_t k = 0; k < idx->n_fields; k++)
        s = s_put_str(s, idx->fields[k]);
    s = s_put_str(s, pruned->key);
    s_put_str(s, pruned->example);
    uint8_t *p = t + S_HEAD + s_pad8(strings);
    if (members)
        memcpy(p, idx->members, members);
    if (idx->first)
        memcpy(p + members, idx->first, firsts);
    *out = t;
    *len = total;
    return 0;
}

/* The next NUL-terminated string of s[*at, end); NULL when none. */
static const char *
s_next(const char *s, size_t *at, size_t end)
{
    const char *z = *at < end ? memchr(s + *at, '\0', end - *at) : NULL;
    if (!z)
        return NULL;
    const char *r = s + *at;
    *at = (size_t)(z - s) + 1;
    return r;
}

/* The field names of the strings area, copied. */
static int
s_read_fields(const char *s, size_t *at, size_t end, uint32_t n,
              emlio__tar_index_t *out)
{
    out->fields = emlio_calloc(n ? n : 1, sizeof(*out->fields));
    if (!out->fields)
        return EMLIO_ENOMEM;
    for (uint32_t k = 0; k < n; k++) {
        const char *f = s_next(s, at, end);
        if (!f)
            return EMLIO_EFORMAT;
        out->fields[k] = emlio_strdup(f);
        if (!out->fields[k])
            return EMLIO_ENOMEM;
        out->n_fields++;
    }
    return 0;
}

int
emlio__tar_table_read(const uint8_t *t, size_t len, uint64_t samples,
                      emlio__tar_index_t *out, const char **key,
                      const char **example, uint64_t *dropped)
{
    uint64_t head[2];
    uint32_t counts[2];
    memset(out, 0, sizeof(*out));
    if (len < S_HEAD || ((uintptr_t)t & 7))
        return EMLIO_EFORMAT;
    memcpy(head, t, 16);
    memcpy(counts, t + 16, 8);
    memcpy(dropped, t + 24, 8);
    size_t room = len - S_HEAD;
    if (head[1] != samples || counts[0] > EMLIO_TAR_MAX_FIELDS ||
        counts[1] > room || head[0] > UINT32_MAX || head[1] >= UINT32_MAX ||
        s_pad8(counts[1]) + head[0] * 24 + (head[1] + 1) * 4 != room)
        return EMLIO_EFORMAT;
    const char *s = (const char *)t + S_HEAD;
    size_t at = 0;
    int rc = s_read_fields(s, &at, counts[1], counts[0], out);
    *key = rc == 0 ? s_next(s, &at, counts[1]) : NULL;
    *example = *key ? s_next(s, &at, counts[1]) : NULL;
    if (rc == 0 && !*example)
        rc = EMLIO_EFORMAT;
    if (rc < 0) {
        for (size_t k = 0; k < out->n_fields; k++)
            emlio_free(out->fields[k]);
        emlio_free(out->fields);
        memset(out, 0, sizeof(*out));
        return rc;
    }
    const uint8_t *p = t + S_HEAD + s_pad8(counts[1]);
    out->n_members = (size_t)head[0];
    out->n_samples = (size_t)head[1];
    out->members = (emlio__tar_member_t *)(uintptr_t)p;
    out->first = (uint32_t *)(uintptr_t)(p + head[0] * 24);
    return 0;
}

bool
emlio__tar_table_ok(const emlio__tar_index_t *idx, uint64_t size)
{
    if (idx->first[0] != 0 || idx->first[idx->n_samples] != idx->n_members)
        return false;
    for (size_t i = 0; i < idx->n_samples; i++)
        if (idx->first[i + 1] < idx->first[i])
            return false;
    /* Members in file order, each after the previous one's data and a
     * header: a table that lists one member's bytes as another's (with a
     * valid CRC: whoever can write the index) is refused, since tar has no
     * data CRC to catch it when served. */
    uint64_t end = 0;
    for (size_t m = 0; m < idx->n_members; m++) {
        const emlio__tar_member_t *mem = &idx->members[m];
        if (mem->field >= idx->n_fields || mem->offset < end + 512 ||
            mem->offset % 512 || mem->offset > size ||
            mem->len > size - mem->offset)
            return false;
        end = mem->offset + ((mem->len + 511) & ~(uint64_t)511);
    }
    return true;
}
