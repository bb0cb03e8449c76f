/* server_fields.c - the fields a client names in its HELLO (see
 * server_fields.h).
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include "server_fields.h"
#include "server_internal.h"

/* Whether name (len bytes) is one of the daemon's --fields. */
static bool
s_in_own(const emlio_server_t *self, const char *name, size_t len)
{
    for (size_t i = 0; i < self->own.n_fields; i++)
        if (strlen(self->own.fields[i]) == len &&
            memcmp(self->own.fields[i], name, len) == 0)
            return true;
    return false;
}

/* Whether some shard has field name (a TFRecord's Example keys are only
 * known per record: they count as "may have"). */
static bool
s_somewhere(const emlio_server_t *self, const char *name)
{
    const emlio__shardset_t *set = &self->core->set;
    for (size_t i = 0; i < set->n; i++)
        if (set->shards[i].ops->has_field(set->shards[i].impl, name) != 0)
            return true;
    return false;
}

/* Checks the HELLO's names; 0 or an error with text. */
static int
s_check(const emlio_server_t *self, const emlio__msg_hello_t *hello, char *text)
{
    for (size_t i = 0; i < hello->n_fields; i++) {
        const emlio__wire_str_t *f = &hello->fields[i];
        int shown = (int)EMLIO_MIN(f->len, 64);
        if (memchr(f->s, ',', f->len) || memchr(f->s, '\0', f->len))
            return emlio__seterr(text, EMLIO_EINVAL,
                                 "bad field name '%.*s': no commas or NULs",
                                 shown, f->s);
        for (size_t j = 0; j < i; j++)
            if (hello->fields[j].len == f->len &&
                memcmp(hello->fields[j].s, f->s, f->len) == 0)
                return emlio__seterr(text, EMLIO_EINVAL,
                                     "field '%.*s' asked for twice", shown,
                                     f->s);
        if (self->own.n_fields) {
            if (!s_in_own(self, f->s, f->len))
                return emlio__seterr(
                    text, EMLIO_ENOTFOUND,
                    "field '%.*s' is not one this daemon serves (--fields "
                    "%.200s)",
                    shown, f->s, self->own.fields_spec);
            continue;
        }
        char name[EMLIO_WIRE_MAX_NAME + 1];
        memcpy(name, f->s, f->len);
        name[f->len] = '\0';
        if (!s_somewhere(self, name))
            return emlio__seterr(text, EMLIO_ENOTFOUND,
                                 "no shard under '%.200s' has field '%.*s'",
                                 self->own.data_dir, shown, f->s);
    }
    return 0;
}

/* Whether fs lists exactly the HELLO's names, in its order. */
static bool
s_same(const emlio__fieldset_t *fs, const emlio__msg_hello_t *hello)
{
    if (fs->n != hello->n_fields)
        return false;
    for (size_t i = 0; i < fs->n; i++)
        if (strlen(fs->names[i]) != hello->fields[i].len ||
            memcmp(fs->names[i], hello->fields[i].s, hello->fields[i].len))
            return false;
    return true;
}

static void
s_free(emlio__fieldset_t *fs)
{
    if (!fs)
        return;
    for (size_t i = 0; i < fs->n; i++)
        emlio_free(fs->names[i]);
    emlio_free(fs->names);
    emlio_free(fs->spec);
    emlio_buf_release(&fs->welcome);
    emlio_free(fs);
}

static emlio__fieldset_t *
s_new(const emlio__msg_hello_t *hello)
{
    emlio__fieldset_t *fs = emlio_calloc(1, sizeof(*fs));
    if (!fs)
        return NULL;
    emlio_buf_init(&fs->welcome);
    size_t total = 0;
    fs->names = emlio_calloc(hello->n_fields, sizeof(*fs->names));
    for (size_t i = 0; fs->names && i < hello->n_fields; i++) {
        const emlio__wire_str_t *f = &hello->fields[i];
        fs->names[i] = emlio__memdupz(f->s, f->len);
        if (!fs->names[i])
            break;
        fs->n++;
        total += f->len + 1;
    }
    fs->spec = fs->n == hello->n_fields ? emlio_malloc(total) : NULL;
    if (!fs->spec) {
        s_free(fs);
        return NULL;
    }
    char *p = fs->spec;
    for (size_t i = 0; i < fs->n; i++) {
        size_t n = strlen(fs->names[i]);
        memcpy(p, fs->names[i], n);
        p += n;
        *p++ = i + 1 < fs->n ? ',' : '\0';
    }
    return fs;
}

int
emlio__srv_fields_resolve(emlio_server_t *self, const emlio__msg_hello_t *hello,
                          const emlio__fieldset_t **out, char *text)
{
    *out = NULL;
    if (!hello->n_fields)
        return 0;
    int rc = s_check(self, hello, text);
    if (rc < 0)
        return rc;
    bool own = self->own.n_fields == hello->n_fields;
    for (size_t i = 0; own && i < hello->n_fields; i++)
        own = strlen(self->own.fields[i]) == hello->fields[i].len &&
              memcmp(self->own.fields[i], hello->fields[i].s,
                     hello->fields[i].len) == 0;
    if (own)
        return 0; /* the daemon's own list: its WELCOME and reads */
    emlio__srv_fieldsets_t *sets = &self->fieldsets;
    for (size_t i = 0; i < sets->n; i++)
        if (s_same(sets->sets[i], hello)) {
            *out = sets->sets[i];
            return 0;
        }
    if (sets->n == EMLIO__SRV_MAX_FIELDSETS)
        return emlio__seterr(text, EMLIO_ELIMIT,
                             "too many distinct field lists asked of this "
                             "daemon (limit %d)",
                             EMLIO__SRV_MAX_FIELDSETS);
    emlio__fieldset_t *fs = s_new(hello);
    if (!fs)
        return emlio__seterr(text, EMLIO_ENOMEM, "out of memory");
    sets->sets[sets->n++] = fs;
    *out = fs;
    return 0;
}

const emlio_buf_t *
emlio__srv_fields_welcome(emlio_server_t *self, const emlio__fieldset_t *cfs)
{
    if (!cfs)
        return &self->net.welcome;
    /* Interned lists are the frontend's own: it alone encodes them. */
    emlio__fieldset_t *fs = (emlio__fieldset_t *)cfs;
    if (!fs->encoded) {
        if (emlio__srv_encode_welcome(self, fs->names, fs->n, &fs->welcome) < 0)
            return NULL;
        fs->encoded = true;
    }
    return &fs->welcome;
}

size_t
emlio__srv_fields_per(const emlio_server_t *self, const emlio__fieldset_t *fs)
{
    if (fs)
        return fs->n;
    return self->own.n_fields ? self->own.n_fields : 1;
}

void
emlio__srv_fields_release(emlio__srv_fieldsets_t *sets)
{
    for (size_t i = 0; i < sets->n; i++)
        s_free(sets->sets[i]);
    sets->n = 0;
}
