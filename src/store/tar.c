/* tar.c - WebDataset tar shards: the handle over the mapped archive, its
 * samples and fields, what a prune leaves out, and its table of format
 * operations (format.h). Reading an archive is tar_scan.c; its indexes on
 * disk, tar_index.c.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <sched.h>

#include "iobuf.h"
#include "tar.h"

static int s_ready(const emlio__tar_t *cself);

/* ---- the handle ------------------------------------------------------- */

void
emlio__tar_drop(emlio__tar_t *self)
{
    if (self->table) {
        self->idx.members = NULL;
        self->idx.first = NULL;
        self->table = NULL;
    }
    emlio__tar_index_release(&self->idx);
    emlio_free(self->table_buf);
    emlio_free(self->pruned_key);
    emlio_free(self->pruned_example);
    self->table_buf = NULL;
    self->pruned_key = self->pruned_example = NULL;
    self->pruned = 0;
    atomic_store(&self->table_state, S_TABLE_OK);
}

emlio__tar_t *
emlio__tar_new(const char *path)
{
    emlio__tar_t *self = emlio_calloc(1, sizeof(*self));
    if (self && emlio__mapfile_init(&self->file, path) < 0) {
        emlio_free(self);
        return NULL;
    }
    return self;
}

void
emlio__tar_destroy(emlio__tar_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__tar_t *self = *self_p;
    emlio__tar_drop(self);
    emlio__mapfile_release(&self->file);
    emlio_free(self);
    *self_p = NULL;
}

int
emlio__tar_open(emlio__tar_t *self)
{
    assert(self && !self->file.open);
    size_t indexed = self->file.size;
    int rc = emlio__mapfile_open(&self->file);
    if (rc < 0)
        return rc;
    if (self->table && self->file.size != indexed)
        return emlio__seterr(self->file.err, -ESTALE,
                             "'%s' changed since it was indexed",
                             self->file.path);
    return 0;
}

int
emlio__tar_scan(emlio__tar_t *self)
{
    assert(self && self->file.open);
    emlio__tar_drop(self);
    return emlio__tar_scan_mem(self->file.base, self->file.size,
                               self->file.path, &self->idx, self->file.err);
}

const char *
emlio__tar_errmsg(const emlio__tar_t *self)
{
    return self->file.err;
}

size_t
emlio__tar_count(const emlio__tar_t *self)
{
    return self->idx.n_samples;
}

static bool
s_image_field(const char *f)
{
    static const char *const images[] = { "jpg", "jpeg", "png",  "webp",
                                          "ppm", "pgm",  "tif",  "tiff",
                                          "bmp", "gif",  "image" };
    for (size_t i = 0; i < EMLIO_ARRAY_SIZE(images); i++)
        if (strcmp(f, images[i]) == 0)
            return true;
    return false;
}

/* emlio__tar_find on an index already checked (the prune, which also
 * runs inside the first-read check, calls this one). */
static int
s_find(const emlio__tar_t *self, size_t i, const char *field, size_t *member)
{
    const emlio__tar_index_t *idx = &self->idx;
    if (i >= idx->n_samples)
        return EMLIO_ENOTFOUND;
    if (field) {
        for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++)
            if (strcmp(idx->fields[idx->members[m].field], field) == 0) {
                *member = m;
                return 0;
            }
        return -ENOENT;
    }
    bool found = false;
    for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++) {
        const char *f = idx->fields[idx->members[m].field];
        if (s_image_field(f)) {
            *member = m;
            return 0;
        }
        if (!found && strcmp(f, "cls") != 0) {
            *member = m;
            found = true;
        }
    }
    return found ? 0 : -ENOENT;
}

int
emlio__tar_find(const emlio__tar_t *self, size_t i, const char *field,
                size_t *member)
{
    /* A table that failed its check and could not be rebuilt (the shard
     * read by copying, not mapped) serves nothing until it is. */
    if (i < self->idx.n_samples && s_ready(self) < 0)
        return EMLIO_EFORMAT;
    return s_find(self, i, field, member);
}

/* Whether sample i can be served as field says: a list "jpg,cls,json" (a
 * daemon's --fields) needs every member named; one field needs it; NULL
 * needs an image member. */
static bool
s_servable(const emlio__tar_t *self, size_t i, const char *field)
{
    const emlio__tar_index_t *idx = &self->idx;
    size_t m;
    if (!field)
        return s_find(self, i, NULL, &m) == 0 &&
               s_image_field(idx->fields[idx->members[m].field]);
    char one[EMLIO_TAR_MAX_NAME + 1];
    for (const char *p = field; *p;) {
        size_t n = strcspn(p, ",");
        if (n > EMLIO_TAR_MAX_NAME)
            return false; /* longer than any member's field */
        memcpy(one, p, n);
        one[n] = '\0';
        if (s_find(self, i, one, &m) != 0)
            return false;
        p += n + (p[n] == ',');
    }
    return true;
}

static size_t
s_prune_now(emlio__tar_t *self, const char *field, char *example, size_t len)
{
    emlio__tar_index_t *idx = &self->idx;
    size_t kept = 0, dropped = 0;
    uint32_t out = 0;
    for (size_t i = 0; i < idx->n_samples; i++) {
        uint32_t a = idx->first[i], z = idx->first[i + 1];
        if (!s_servable(self, i, field)) {
            if (dropped++ == 0 && example) {
                /* The member's own name, from its ustar header. */
                const uint8_t *h =
                    self->file.base + idx->members[a].offset - EMLIO__TAR_BLOCK;
                snprintf(example, len, "'%.*s' in '%s' at offset %" PRIu64,
                         (int)emlio__tarh_strnlen(h, 100), (const char *)h,
                         self->file.path,
                         idx->members[a].offset - EMLIO__TAR_BLOCK);
            }
            for (uint32_t k = a; idx->names && k < z; k++)
                emlio_free(idx->names[k]);
            continue;
        }
        idx->first[kept++] = out;
        for (uint32_t k = a; k < z; k++, out++) {
            idx->members[out] = idx->members[k];
            if (idx->names)
                idx->names[out] = idx->names[k];
        }
    }
    if (dropped) {
        idx->n_samples = kept;
        idx->n_members = out;
        idx->first[kept] = out;
    }
    return dropped;
}

const uint8_t *
emlio__tar_data(const emlio__tar_t *self, size_t member)
{
    return self->file.base + self->idx.members[member].offset;
}

int
emlio__tar_field(const emlio__tar_t *self, size_t i, const char *field,
                 const uint8_t **data, size_t *len)
{
    size_t m;
    int rc = emlio__tar_find(self, i, field, &m);
    if (rc < 0)
        return rc;
    *data = emlio__tar_data(self, m);
    *len = (size_t)self->idx.members[m].len;
    return 0;
}

int
emlio__tar_default_field(const emlio__tar_t *self, size_t i,
                         const uint8_t **data, size_t *len)
{
    return emlio__tar_field(self, i, NULL, data, len);
}

int64_t
emlio__tar_parse_label(const uint8_t *p, size_t n)
{
    size_t k = 0;
    while (k < n && (p[k] == ' ' || p[k] == '\t'))
        k++;
    bool neg = k < n && p[k] == '-';
    if (neg)
        k++;
    int64_t v = 0;
    size_t digits = 0;
    for (; k < n && p[k] >= '0' && p[k] <= '9'; k++, digits++) {
        if (v > (INT64_MAX - 9) / 10)
            return -1;
        v = v * 10 + (p[k] - '0');
    }
    while (k < n &&
           (p[k] == ' ' || p[k] == '\n' || p[k] == '\r' || p[k] == '\t'))
        k++;
    if (!digits || k != n)
        return -1;
    return neg ? -v : v;
}

int64_t
emlio__tar_label(const emlio__tar_t *self, size_t i, const char *field)
{
    const uint8_t *p;
    size_t n;
    if (emlio__tar_field(self, i, field, &p, &n) < 0)
        return -1;
    return emlio__tar_parse_label(p, n);
}

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
            s_prune_now(self, strcmp(key, "*") ? key : NULL, NULL, 0);
    }
    if (rc < 0 || self->idx.n_samples != want) {
        emlio__tar_index_release(&self->idx);
        self->idx.n_samples = want;
        self->idx.first = emlio_calloc(want + 1, sizeof(uint32_t));
        if (!self->idx.first) /* then nothing at all can be read */
            self->idx.n_samples = 0;
    }
}

/* Whether the index may be read: one load once checked. A borrowed
 * table is checked (CRC and bounds) by the first reader, others waiting;
 * one that fails is replaced (s_adopt_table). Always 0: what readers see
 * afterwards is safe to read. */
static int
s_ready(const emlio__tar_t *cself)
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

/* The format's prune (format.h): drops the samples that have no member
 * field (a list "jpg,cls,json": that lack any of them; NULL: no image
 * member, where emlio__tar_default_field would pick another one) from the
 * index, so they are neither counted nor served. Returns how many were
 * dropped; example (len bytes) names the first ("'README.txt' in 'a.tar'
 * at offset 0"). A prune remembered from the dataset index answers
 * without a walk. */
static size_t
s_prune(void *impl, const char *field, char *example, size_t len)
{
    emlio__tar_t *self = impl;
    const char *key = field ? field : "*";
    if (self->pruned_key && strcmp(self->pruned_key, key) == 0) {
        if (example && self->pruned)
            snprintf(example, len, "%s",
                     self->pruned_example ? self->pruned_example : "?");
        return (size_t)self->pruned;
    }
    char first[PATH_MAX + 128] = "";
    s_ready(self);
    if (s_unborrow(self) < 0)
        return 0; /* out of memory: nothing left out */
    size_t dropped = s_prune_now(self, field, first, sizeof(first));
    s_remember(self, key, dropped, first);
    if (example && dropped)
        snprintf(example, len, "%s", first);
    return dropped;
}

/* The format's adopt_table: takes the shard's index from a dataset index
 * table (emlio__tar_table_read; borrowed from a mapping that outlives the
 * handle) of a file of size bytes, when it was pruned as prune asks ("-",
 * "*" or a field; a table not pruned is taken for any). Needs no open
 * file. The table is checked against crc and emlio__tar_table_ok when the
 * shard is first read; a bad one is replaced by a rescan of the mapping
 * (pruned the same way), or, when that fails, by samples without members.
 * Returns the sample count or EMLIO_EFORMAT / -ESTALE / EMLIO_ENOMEM. */
static int
s_adopt_table(void *impl, const void *table, size_t len, uint64_t records,
              uint64_t size, uint32_t crc, const char *prune)
{
    emlio__tar_t *self = impl;
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

/* The format's index_table: the table to store in the dataset index (*len
 * bytes; valid until the next adopt, scan or load). NULL when out of
 * memory. */
static const void *
s_index_table(void *impl, size_t *len)
{
    emlio__tar_t *self = impl;
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

/* The format's advise: page-cache advice for samples [first, first + n),
 * over their members with their headers. */
static void
s_advise(const void *impl, size_t first, size_t n, int advice)
{
    const emlio__tar_t *self = impl;
    const emlio__tar_index_t *idx = &self->idx;
    if (!self->file.base || first >= idx->n_samples || n == 0)
        return;
    s_ready(self);
    if (idx->first[first] == idx->first[EMLIO_MIN(first + n, idx->n_samples)])
        return; /* no members (a table that failed its check) */
    size_t last = EMLIO_MIN(first + n, idx->n_samples) - 1;
    const emlio__tar_member_t *a = &idx->members[idx->first[first]];
    const emlio__tar_member_t *z = &idx->members[idx->first[last + 1] - 1];
    /* Anything but "not needed" is "needed soon"; best effort. */
    (void)emlio__mapfile_advise(
        &self->file, a->offset - EMLIO__TAR_BLOCK, z->offset + z->len,
        advice == EMLIO_ADVISE_DONTNEED ? EMLIO_ADVISE_DONTNEED
                                        : EMLIO_ADVISE_WILLNEED);
}

/* ---- the format's table (format.h) ----
 * The entries that only call one of the typed emlio__tar_* functions
 * (which the tests call too) adapt the handle's type and do nothing else. */

static void *
s_create(const char *path)
{
    return emlio__tar_new(path);
}

/* The mapped file, for the shard set to confine, map, unmap and blank. */
static emlio__mapfile_t *
s_file(void *impl)
{
    return &((emlio__tar_t *)impl)->file;
}

/* The format's size: the archive's, kept while it is unmapped. */
static uint64_t
s_size(const void *impl)
{
    return ((const emlio__tar_t *)impl)->file.size;
}

/* The index, once a borrowed table passed its check (s_ready). */
static const emlio__tar_index_t *
s_index(const void *impl)
{
    const emlio__tar_t *self = impl;
    s_ready(self);
    return &self->idx;
}

/* The format's offset: sample i's first member's data, for messages. */
static uint64_t
s_offset(const void *impl, size_t i)
{
    const emlio__tar_t *self = impl;
    if (i >= self->idx.n_samples || s_ready(self) < 0 ||
        self->idx.first[i] >= self->idx.n_members)
        return 0;
    return self->idx.members[self->idx.first[i]].offset;
}

static int
s_open(void *impl)
{
    return emlio__tar_open(impl);
}

static int
s_load_index(void *impl, const char *idx)
{
    return emlio__tar_load_index(impl, idx);
}

static int
s_scan(void *impl, bool verify_data)
{
    (void)verify_data; /* tar has no checksum of the data */
    return emlio__tar_scan(impl);
}

/* An empty tar gets no index; nor does one taken from the dataset index,
 * which keeps no member names (its .idx cannot be written without a
 * scan). */
static int
s_write_index(const void *impl, const char *idx)
{
    if (emlio__tar_count(impl) == 0 || !s_index(impl)->names)
        return 0;
    return emlio__tar_write_index(impl, idx);
}

static void
s_destroy(void *impl)
{
    emlio__tar_t *tar = impl;
    emlio__tar_destroy(&tar);
}

static size_t
s_count(const void *impl)
{
    return emlio__tar_count(impl);
}

/* Member i with the header block before it, which must still describe it:
 * a rewritten archive whose members moved is refused, not served. */
static int
s_read_copy(const void *impl, emlio__read_ctx_t *ctx, size_t i,
            uint8_t **buf_out, const uint8_t **data, size_t *len,
            uint32_t *stored)
{
    const emlio__tar_index_t *idx = s_index(impl);
    *buf_out = NULL;
    *stored = 0;
    if (i >= idx->n_members)
        return EMLIO_ENOTFOUND;
    const emlio__tar_member_t *m = &idx->members[i];
    if (m->offset < 512 || m->len > SIZE_MAX - 512)
        return EMLIO_EFORMAT;
    uint8_t *buf;
    const uint8_t *head;
    int rc =
        ctx->pread(ctx, m->offset - 512, (size_t)m->len + 512, &buf, &head);
    if (rc < 0)
        return rc;
    if (!emlio__tar_header_ok(head, m->len)) {
        emlio__iobuf_free(buf);
        ctx->changed = "a member's header no longer matches";
        return -ESTALE;
    }
    *buf_out = buf;
    *data = head + 512;
    *len = (size_t)m->len;
    return 0;
}

/* Sample i's members with their headers: one range, since a sample's
 * members are consecutive in the archive. */
static int
s_extent(const void *impl, size_t i, uint64_t *offset, size_t *len)
{
    const emlio__tar_index_t *idx = s_index(impl);
    if (i >= idx->n_samples || idx->first[i] >= idx->first[i + 1] ||
        idx->first[i + 1] > idx->n_members)
        return EMLIO_ENOTFOUND;
    const emlio__tar_member_t *m = &idx->members[idx->first[i]];
    if (m->offset < 512)
        return EMLIO_EFORMAT;
    uint64_t from = m->offset - 512, to = from;
    for (uint32_t k = idx->first[i]; k < idx->first[i + 1]; k++) {
        const emlio__tar_member_t *mk = &idx->members[k];
        if (mk->offset < from + 512 || mk->len > UINT64_MAX - mk->offset)
            return EMLIO_EFORMAT;
        to = EMLIO_MAX(to, mk->offset + mk->len);
    }
    if (to - from > SIZE_MAX)
        return EMLIO_EFORMAT;
    *offset = from;
    *len = (size_t)(to - from);
    return 0;
}

static int
s_has_field(const void *impl, const char *field)
{
    const emlio__tar_index_t *idx = s_index(impl);
    for (size_t k = 0; k < idx->n_fields; k++)
        if (strcmp(idx->fields[k], field) == 0)
            return 1;
    return 0;
}

/* Points view at member m of a shard the caller has acquired: into the
 * mapping (held: the view keeps a use of the shard) when ctx says so,
 * else into a private copy read with ctx->pread. */
static int
s_member_view(const void *impl, emlio__read_ctx_t *ctx, size_t m,
              emlio__view_t *view)
{
    if (ctx->maps) {
        emlio__view_map(view, emlio__tar_data(impl, m),
                        (size_t)s_index(impl)->members[m].len);
        return 0;
    }
    uint32_t stored;
    return s_read_copy(impl, ctx, m, &view->owned, &view->data, &view->len,
                       &stored);
}

/* A label member that is not an integer is an error, not a silent -1
 * (every label -1 is what a --label-field typo looked like). */
static int
s_parse(const uint8_t *data, size_t len, const emlio__read_opts_t *o,
        int64_t *label, const char **missing)
{
    *label = emlio__tar_parse_label(data, len);
    if (*label != -1)
        return 0;
    size_t k = 0; /* "-1" itself, white space around it allowed */
    while (k < len && (data[k] == ' ' || data[k] == '\t'))
        k++;
    if (len - k >= 2 && data[k] == '-' && data[k + 1] == '1')
        return 0;
    *missing = o->label_field;
    return EMLIO__FORMAT_EBADLABEL;
}

/* The label of sample `record` from its label member (-1 when it has
 * none; EMLIO__FORMAT_EBADLABEL when it is not a number), read as the
 * sample's data is. */
static int
s_label(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
        const emlio__read_opts_t *o, int64_t *label, const char **missing)
{
    size_t m;
    *label = -1;
    if (emlio__tar_find(impl, (size_t)record, o->label_field, &m) < 0)
        return 0;
    if (ctx->maps) {
        const emlio__tar_member_t *mem = &s_index(impl)->members[m];
        return s_parse(emlio__tar_data(impl, m), (size_t)mem->len, o, label,
                       missing);
    }
    uint8_t *copy;
    const uint8_t *data;
    size_t len;
    uint32_t stored;
    int rc = s_read_copy(impl, ctx, m, &copy, &data, &len, &stored);
    if (rc < 0)
        return rc;
    rc = s_parse(data, len, o, label, missing);
    emlio__iobuf_free(copy);
    return rc;
}

/* One frame per field named in o->fields, or the configured member (the
 * first image member by default) alone; the label from the label member.
 * A sample without a member asked for is EMLIO__FORMAT_EMISSING. */
static int
s_read(const void *impl, emlio__read_ctx_t *ctx, uint64_t record,
       const emlio__read_opts_t *o, emlio__view_t *views, const char **missing)
{
    size_t nf = o->n_fields ? o->n_fields : 1;
    int rc = 0;
    for (size_t f = 0; f < nf && rc == 0; f++) {
        const char *field = o->n_fields ? o->fields[f] : o->field;
        size_t m;
        rc = emlio__tar_find(impl, (size_t)record, field, &m);
        if (rc == -ENOENT && o->n_fields)
            *missing = field;
        if (rc == -ENOENT)
            rc = EMLIO__FORMAT_EMISSING;
        else if (rc == 0)
            rc = s_member_view(impl, ctx, m, &views[f]);
    }
    if (rc == 0)
        rc = s_label(impl, ctx, record, o, &views[0].label, missing);
    if (rc == 0 && !o->n_fields)
        views[0].crc = emlio_crc32c(0, views[0].data, views[0].len);
    return rc;
}

/* Every member of the sample, in order; the label from "cls". */
static int
s_record(const void *impl, size_t r, emlio_dataset_field_fn *fn, void *userdata,
         int64_t *label)
{
    const emlio__tar_index_t *idx = s_index(impl);
    int rc = 0;
    *label = emlio__tar_label(impl, r, "cls");
    for (uint32_t m = idx->first[r]; m < idx->first[r + 1] && rc == 0; m++) {
        const char *field = idx->fields[idx->members[m].field];
        const uint8_t *data;
        size_t len;
        rc = emlio__tar_field(impl, r, field, &data, &len);
        if (rc == 0)
            rc = fn(userdata, field, data, len);
    }
    return rc;
}

/* Every member of the sample, with their headers. */
static uint64_t
s_record_bytes(const void *impl, size_t i)
{
    const emlio__tar_index_t *idx = s_index(impl);
    uint64_t n = 0;
    if (i >= idx->n_samples)
        return 0;
    for (uint32_t m = idx->first[i]; m < idx->first[i + 1]; m++)
        n += idx->members[m].len + 512;
    return n;
}

const emlio__format_ops_t emlio__format_tar = {
    .name = "tar",
    .suffix = ".tar",
    .what = "*.tar shards",
    .mapped = true,
    .create = s_create,
    .file = s_file,
    .open = s_open,
    .load_index = s_load_index,
    .scan = s_scan,
    .write_index = s_write_index,
    .index_table = s_index_table,
    .adopt_table = s_adopt_table,
    .read_copy = s_read_copy,
    .extent = s_extent,
    .destroy = s_destroy,
    .count = s_count,
    .size = s_size,
    .record_bytes = s_record_bytes,
    .prune = s_prune,
    .offset = s_offset,
    .advise = s_advise,
    .has_field = s_has_field,
    .read = s_read,
    .record = s_record,
};
