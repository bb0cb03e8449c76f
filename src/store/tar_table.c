/* tar_table.c - a tar shard's index as a record table of the dataset
 * index (dsindex.h; layout in docs/protocol.md 9.1): written from an
 * emlio__tar_index_t, read back with members and sample starts borrowed
 * from the mapping, and checked against the shard's size.
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include <sched.h>

#include "crc32c.h"
#include "tar.h"
#include "tar_impl.h"

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

/* ---- the handle's table ----------------------------------------------- */

/* Copies a borrowed table's arrays, so the index may change. */
static int
s_unborrow(emlio__tar_t *self)
{
    emlio__tar_index_t *idx = &self->idx;
    if (!self->table)
        return 0;
    size_t nm = idx->n_members, ns = idx->n_samples + 1;
    emlio__tar_member_t *members = emlio_reallocarray(NULL, nm + 1, 24);
    uint32_t *first = emlio_reallocarray(NULL, ns, sizeof(*first));
    if (!members || !first) {
        emlio_free(members);
        emlio_free(first);
        return EMLIO_ENOMEM;
    }
    memcpy(members, idx->members, nm * sizeof(*members));
    memcpy(first, idx->first, ns * sizeof(*first));
    idx->members = members;
    idx->first = first;
    self->table = NULL;
    return 0;
}

/* Remembers a prune's outcome under key (see emlio__tar_pruned_t). */
static void
s_remember(emlio__tar_t *self, const char *key, uint64_t dropped,
           const char *example)
{
    emlio_free(self->pruned_key);
    emlio_free(self->pruned_example);
    self->pruned_key = emlio_strdup(key);
    self->pruned_example = emlio_strdup(example);
    self->pruned = dropped;
}

/* A borrowed table that fails its check is rebuilt from the mapping and
 * pruned as it was; failing that, its samples have no members (every
 * read of them fails) rather than members outside the file. */
static void
s_table_replace(emlio__tar_t *self)
{
    emlio__tar_index_t walked;
    char err[EMLIO_ERRMSG_LEN];
    size_t want = self->idx.n_samples;
    int rc = self->file.base
                 ? emlio__tar_scan_mem(self->file.base, self->file.size,
                                       self->file.path, &walked, err)
                 : EMLIO_EFORMAT;
    /* Not emlio__tar_drop: readers wait on table_state until this is
     * done, and what the prune left out stays as it was remembered. */
    self->idx.members = NULL; /* borrowed */
    self->idx.first = NULL;
    self->table = NULL;
    emlio__tar_index_release(&self->idx);
    if (rc >= 0) {
        self->idx = walked;
        const char *key = self->pruned_key;
        if (key)
            emlio__tar_prune_now(self, strcmp(key, "*") ? key : NULL, NULL, 0);
    }
    if (rc < 0 || self->idx.n_samples != want) {
        emlio__tar_index_release(&self->idx);
        self->idx.n_samples = want;
        self->idx.first = emlio_calloc(want + 1, sizeof(uint32_t));
        if (!self->idx.first) /* then nothing at all can be read */
            self->idx.n_samples = 0;
    }
}

int
emlio__tar_ready(const emlio__tar_t *cself)
{
    emlio__tar_t *self = (emlio__tar_t *)(uintptr_t)cself;
    int state = atomic_load_explicit(&self->table_state, memory_order_acquire);
    if (state == S_TABLE_OK)
        return 0;
    state = S_TABLE_UNCHECKED;
    if (!atomic_compare_exchange_strong(&self->table_state, &state,
                                        S_TABLE_CHECKING)) {
        while ((state = atomic_load(&self->table_state)) == S_TABLE_CHECKING)
            sched_yield();
        return state == S_TABLE_OK ? 0 : EMLIO_EFORMAT;
    }
    if (emlio_crc32c(0, self->table, self->table_len) != self->table_crc ||
        !emlio__tar_table_ok(&self->idx, self->file.size)) {
        if (!self->file.base) {
            /* Closed by the shard cache: nothing to rebuild from now (a
             * size estimate asked); the read that maps it checks again. */
            atomic_store(&self->table_state, S_TABLE_UNCHECKED);
            return EMLIO_EFORMAT;
        }
        s_table_replace(self);
    }
    atomic_store(&self->table_state, S_TABLE_OK);
    return 0;
}

size_t
emlio__tar_prune(emlio__tar_t *self, const char *field, char *example,
                 size_t len)
{
    const char *key = field ? field : "*";
    if (self->pruned_key && strcmp(self->pruned_key, key) == 0) {
        if (example && self->pruned)
            snprintf(example, len, "%s",
                     self->pruned_example ? self->pruned_example : "?");
        return (size_t)self->pruned;
    }
    char first[PATH_MAX + 128] = "";
    emlio__tar_ready(self);
    if (s_unborrow(self) < 0)
        return 0; /* out of memory: nothing left out */
    size_t dropped = emlio__tar_prune_now(self, field, first, sizeof(first));
    s_remember(self, key, dropped, first);
    if (example && dropped)
        snprintf(example, len, "%s", first);
    return dropped;
}

int
emlio__tar_adopt(emlio__tar_t *self, const void *table, size_t len,
                 uint64_t records, uint64_t size, uint32_t crc,
                 const char *prune)
{
    emlio__tar_index_t idx;
    const char *key, *example;
    uint64_t dropped;
    if (self->file.open && size != self->file.size)
        return emlio__seterr(self->file.err, -ESTALE,
                             "'%s' changed since it was indexed",
                             self->file.path);
    int rc = emlio__tar_table_read(table, len, records, &idx, &key, &example,
                                   &dropped);
    if (rc == 0 && strcmp(key, "-") != 0 && strcmp(key, prune) != 0) {
        idx.members = NULL; /* pruned for another field */
        idx.first = NULL;
        emlio__tar_index_release(&idx);
        rc = EMLIO_EFORMAT;
    }
    if (rc < 0)
        return emlio__seterr(self->file.err, rc,
                             "index table of '%s' does not fit",
                             self->file.path);
    emlio__tar_drop(self);
    self->idx = idx;
    self->table = table;
    self->table_len = len;
    self->table_crc = crc;
    self->file.size = (size_t)size;
    if (strcmp(key, "-") != 0)
        s_remember(self, key, dropped, example);
    atomic_store(&self->table_state, S_TABLE_UNCHECKED);
    return (int)records;
}

const void *
emlio__tar_table(emlio__tar_t *self, size_t *len)
{
    if (self->table) { /* as adopted: not pruned or replaced since */
        *len = self->table_len;
        return self->table;
    }
    emlio_free(self->table_buf);
    self->table_buf = NULL;
    emlio__tar_pruned_t p = {
        .key = self->pruned_key ? self->pruned_key : "-",
        .dropped = self->pruned,
        .example = self->pruned_example ? self->pruned_example : "",
    };
    if (emlio__tar_table_write(&self->idx, &p, &self->table_buf, len) < 0)
        return NULL;
    return self->table_buf;
}
