/* client_inventory.c - one dataset out of several daemons' WELCOMEs: the
 * shards merged by name and proven content, and the classes as one list.
 * SPDX-License-Identifier: MIT
 *
 * Two daemons that report a shard of the same name hold replicas only if
 * what they hold is the same: record count, size and the WELCOME digest
 * (a CRC of the record table or of an ImageFolder class's file list) must
 * agree. A name alone proved nothing: an ImageFolder class split by files
 * over two nodes has the same name and, by coincidence, often the same
 * count, and was read as replicas (half the data delivered, "verified").
 *
 * Class names: label i of a daemon is its class list's name i. Where every
 * daemon sends the same list, that is the job's list. Where they differ:
 * an ImageFolder's labels come from its sorted class directories, so the
 * job's list is the union of the names, sorted as torchvision sorts them,
 * and each daemon's labels are remapped onto it as its samples arrive
 * (emlio__client_label); a dataset whose labels are stored in the samples
 * (TFRecord and tar with classes.txt) cannot be remapped, and daemons that
 * name one label differently are refused.
 */
#include "client_internal.h"

typedef struct s_entry {
    const char *name;
    size_t name_len;
    uint64_t records;
    uint64_t bytes;
    uint64_t digest;
    uint32_t daemon;
    uint32_t local;
    uint32_t source;
} s_entry_t;

#define S_CMP(x, y) ((x) < (y) ? -1 : (x) > (y))

/* Byte order, which is code point order for UTF-8: Python's sorted() on
 * names, as torchvision's ImageFolder sorts its classes. */
static int
s_cmp_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, EMLIO_MIN(alen, blen));
    return c ? c : S_CMP(alen, blen);
}

/* Source, then name: shards of one name in two sources are two shards. */
static int
s_cmp_name(const s_entry_t *a, const s_entry_t *b)
{
    int c = S_CMP(a->source, b->source);
    return c ? c : s_cmp_bytes(a->name, a->name_len, b->name, b->name_len);
}

/* By name, then content, then daemon: the copies of one content of a name
 * sit together, in daemon order. */
static int
s_cmp_entry(const void *pa, const void *pb)
{
    const s_entry_t *a = pa;
    const s_entry_t *b = pb;
    int c = s_cmp_name(a, b);
    if (c == 0)
        c = S_CMP(a->digest, b->digest);
    if (c == 0)
        c = S_CMP(a->records, b->records);
    if (c == 0)
        c = S_CMP(a->bytes, b->bytes);
    return c ? c : S_CMP(a->daemon, b->daemon);
}

/* Whether two entries of one name hold the same content. A digest of 0
 * (a daemon that does not send one) matches any. */
static bool
s_same_content(const s_entry_t *a, const s_entry_t *b)
{
    return a->records == b->records && a->bytes == b->bytes &&
           (!a->digest || !b->digest || a->digest == b->digest);
}

/* Adds one shard (name, maybe with a content suffix) held by entries
 * [i, j), which hold the same content. */
static int
s_add_shard(emlio_client_t *self, const s_entry_t *e, size_t i, size_t j,
            bool suffix)
{
    emlio__cshard_t *shard = &self->inv.shards[self->inv.n_shards];
    /* "cat@3fa2c1d0": the content's digest tells apart the parts of a
     * split class wherever they sit and whatever the endpoints' order. */
    size_t len = e[i].name_len + (suffix ? 9 : 0);
    shard->name = emlio_malloc(len + 1);
    shard->holders = emlio_calloc(j - i, sizeof(uint32_t));
    if (!shard->name || !shard->holders) {
        emlio_free(shard->name);
        emlio_free(shard->holders);
        shard->name = NULL;
        shard->holders = NULL;
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    memcpy(shard->name, e[i].name, e[i].name_len);
    if (suffix)
        snprintf(shard->name + e[i].name_len, 10, "@%08" PRIx32,
                 (uint32_t)e[i].digest);
    shard->name[len] = '\0';
    shard->records = e[i].records;
    shard->bytes = e[i].bytes;
    shard->source = e[i].source;
    self->inv.n_shards++;
    for (size_t k = i; k < j; k++) {
        shard->holders[shard->n_holders++] = e[k].daemon;
        self->conn.daemons[e[k].daemon].local_id[self->inv.n_shards - 1] =
            e[k].local;
    }
    return 0;
}

/* The refusal of a name whose holders differ: both daemons, both contents,
 * and what to do. */
static int
s_refuse(emlio_client_t *self, const s_entry_t *a, const s_entry_t *b)
{
    const char *ea = self->conn.daemons[a->daemon].endpoint;
    const char *eb = self->conn.daemons[b->daemon].endpoint;
    return emlio__seterr(
        self->err, EMLIO_EMISMATCH,
        "shard '%.*s' differs between daemon '%s' (%" PRIu64
        " records, %" PRIu64 " bytes, digest %08" PRIx32 ") and daemon '%s' "
        "(%" PRIu64 " records, %" PRIu64 " bytes, digest %08" PRIx32
        "): they are not copies of one file. Serve it from one daemon or "
        "rename one; if the daemons hold different files of one ImageFolder "
        "class, connect with --disjoint-shards",
        (int)a->name_len, a->name, ea, a->records, a->bytes,
        (uint32_t)a->digest, eb, b->records, b->bytes, (uint32_t)b->digest);
}

/* The global shard table: the union of inventories by name, replicas only
 * where the content is the same (see the top of the file). */
static int
s_merge_shards(emlio_client_t *self, s_entry_t *e, size_t n)
{
    qsort(e, n, sizeof(*e), s_cmp_entry);
    self->inv.shards = emlio_calloc(n ? n : 1, sizeof(*self->inv.shards));
    if (!self->inv.shards)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        uint32_t **ids = &self->conn.daemons[d].local_id;
        *ids = emlio_calloc(n ? n : 1, sizeof(uint32_t));
        if (!*ids)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        memset(*ids, 0xff, (n ? n : 1) * sizeof(uint32_t));
    }
    for (size_t i = 0; i < n;) {
        size_t j = i + 1; /* [i, j): one name */
        bool mixed = false;
        while (j < n && s_cmp_name(&e[j], &e[i]) == 0) {
            mixed |= !s_same_content(&e[j - 1], &e[j]);
            j++;
        }
        if (mixed && !self->cfg.disjoint_shards) {
            size_t k = i + 1;
            while (s_same_content(&e[k - 1], &e[k]))
                k++;
            return s_refuse(self, &e[k - 1], &e[k]);
        }
        for (size_t a = i; a < j;) {
            size_t b = a + 1; /* [a, b): one content of the name */
            while (b < j && s_same_content(&e[a], &e[b]))
                b++;
            int rc = s_add_shard(self, e, a, b, mixed);
            if (rc < 0)
                return rc;
            a = b;
        }
        i = j;
    }
    return 0;
}

/* ---- classes --------------------------------------------------------------
 */

typedef struct s_name {
    const char *s;
    size_t len;
} s_name_t;

static int
s_cmp_names(const void *pa, const void *pb)
{
    const s_name_t *a = pa;
    const s_name_t *b = pb;
    return s_cmp_bytes(a->s, a->len, b->s, b->len);
}

static bool
s_str_eq(const emlio__wire_str_t *a, const emlio__wire_str_t *b)
{
    return a->len == b->len && !memcmp(a->s, b->s, a->len);
}

static bool
s_lists_equal(const emlio__msg_welcome_t *a, const emlio__msg_welcome_t *b)
{
    if (a->n_classes != b->n_classes)
        return false;
    for (size_t i = 0; i < a->n_classes; i++)
        if (!s_str_eq(&a->classes[i], &b->classes[i]))
            return false;
    return true;
}

static bool
s_is_imagefolder(const emlio__msg_welcome_t *m)
{
    return m->format && m->format_len == 11 &&
           !memcmp(m->format, "imagefolder", 11);
}

static int
s_set_classes(emlio_client_t *self, const s_name_t *names, size_t n)
{
    self->inv.classes = emlio_calloc(n, sizeof(char *));
    if (!self->inv.classes)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    self->inv.n_classes = n;
    for (size_t i = 0; i < n; i++) {
        self->inv.classes[i] = emlio__memdupz(names[i].s, names[i].len);
        if (!self->inv.classes[i])
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    }
    return 0;
}

/* Labels stored in the samples: label i must name one class on every
 * daemon that knows it; the job's list is the longest. */
static int
s_classes_by_index(emlio_client_t *self, const emlio__wire_msg_t *msgs,
                   s_name_t *names, size_t *n_out)
{
    size_t n = 0;
    uint32_t *who = NULL; /* the daemon that named label i first */
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        n = EMLIO_MAX(n, msgs[d].welcome.n_classes);
    who = emlio_calloc(n, sizeof(*who));
    if (!who)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        names[i].s = NULL;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (size_t i = 0; i < msgs[d].welcome.n_classes; i++) {
            const emlio__wire_str_t *c = &msgs[d].welcome.classes[i];
            if (!names[i].s) {
                names[i] = (s_name_t){ c->s, c->len };
                who[i] = d;
            } else if (names[i].len != c->len ||
                       memcmp(names[i].s, c->s, c->len)) {
                int rc = emlio__seterr(
                    self->err, EMLIO_EMISMATCH,
                    "daemons '%s' and '%s' name label %zu differently "
                    "('%.*s' and '%.*s'); their samples carry their labels, "
                    "so the daemons must serve one class list "
                    "(classes.txt)",
                    self->conn.daemons[who[i]].endpoint,
                    self->conn.daemons[d].endpoint, i, (int)names[i].len,
                    names[i].s, (int)c->len, c->s);
                emlio_free(who);
                return rc;
            }
        }
    emlio_free(who);
    *n_out = n;
    return 0;
}

/* ImageFolder daemons with different class lists: the union, sorted, and
 * each daemon's labels mapped onto it. */
static int
s_classes_union(emlio_client_t *self, const emlio__wire_msg_t *msgs,
                s_name_t *names, size_t total, size_t *n_out)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (size_t i = 0; i < msgs[d].welcome.n_classes; i++)
            names[n++] = (s_name_t){ msgs[d].welcome.classes[i].s,
                                     msgs[d].welcome.classes[i].len };
    assert(n == total);
    qsort(names, n, sizeof(*names), s_cmp_names);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || s_cmp_names(&names[u - 1], &names[i]) != 0)
            names[u++] = names[i];
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        emlio__cdaemon_t *daemon = &self->conn.daemons[d];
        if (!msgs[d].welcome.n_classes)
            continue;
        daemon->label_map =
            emlio_calloc(msgs[d].welcome.n_classes, sizeof(*daemon->label_map));
        if (!daemon->label_map)
            return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
        daemon->n_label_map = msgs[d].welcome.n_classes;
        for (size_t i = 0; i < msgs[d].welcome.n_classes; i++) {
            s_name_t key = { msgs[d].welcome.classes[i].s,
                             msgs[d].welcome.classes[i].len };
            const s_name_t *p =
                bsearch(&key, names, u, sizeof(*names), s_cmp_names);
            assert(p);
            daemon->label_map[i] = (int64_t)(p - names);
        }
    }
    emlio_log(self->ctx, EMLIO_LOG_INFO, "client",
              "the daemons' ImageFolder classes differ: one list of %zu "
              "classes, sorted, with each daemon's labels mapped onto it",
              u);
    *n_out = u;
    return 0;
}

/* The job's class list and, where needed, each daemon's label map. */
static int
s_merge_classes(emlio_client_t *self, const emlio__wire_msg_t *msgs)
{
    const emlio__msg_welcome_t *first = NULL;
    bool same = true, folders = true;
    size_t total = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        if (!msgs[d].welcome.n_classes)
            continue;
        if (!first)
            first = &msgs[d].welcome;
        same &= s_lists_equal(first, &msgs[d].welcome);
        folders &= s_is_imagefolder(&msgs[d].welcome);
        total += msgs[d].welcome.n_classes;
    }
    if (!first)
        return 0;
    s_name_t *names = emlio_calloc(total, sizeof(*names));
    if (!names)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    size_t n = first->n_classes;
    int rc = 0;
    if (same)
        for (size_t i = 0; i < n; i++)
            names[i] = (s_name_t){ first->classes[i].s, first->classes[i].len };
    else if (folders)
        rc = s_classes_union(self, msgs, names, total, &n);
    else
        rc = s_classes_by_index(self, msgs, names, &n);
    if (rc == 0)
        rc = s_set_classes(self, names, n);
    emlio_free(names);
    return rc;
}

int
emlio__client_merge_inventory(emlio_client_t *self,
                              const emlio__wire_msg_t *msgs)
{
    size_t n = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++) {
        const emlio__msg_welcome_t *m = &msgs[d].welcome;
        if (m->format && !self->inv.format[0] &&
            m->format_len < sizeof(self->inv.format)) {
            memcpy(self->inv.format, m->format, m->format_len);
            self->inv.format[m->format_len] = '\0';
        }
        n += m->n_shards;
    }
    s_entry_t *e = emlio_calloc(n ? n : 1, sizeof(*e));
    if (!e)
        return emlio__seterr(self->err, EMLIO_ENOMEM, "out of memory");
    size_t k = 0;
    for (uint32_t d = 0; d < self->conn.n_daemons; d++)
        for (size_t i = 0; i < msgs[d].welcome.n_shards; i++) {
            const emlio__wire_shard_t *s = &msgs[d].welcome.shards[i];
            e[k++] = (s_entry_t){ s->name,     s->name_len,
                                  s->records,  s->bytes,
                                  s->digest,   d,
                                  (uint32_t)i, self->conn.daemons[d].source };
        }
    int rc = s_merge_shards(self, e, n);
    emlio_free(e);
    return rc < 0 ? rc : s_merge_classes(self, msgs);
}
