/* server_fields.h - the fields a client names in its HELLO.
 * SPDX-License-Identifier: MIT
 *
 * A client may ask for the fields it wants of every sample, in its own
 * order (HELLO "fields", docs/protocol.md 5.1), as webdataset's
 * to_tuple("jpg", "cls") does. The daemon's --fields is then the limit
 * (and the default for clients that name none); a daemon without it
 * serves any field its shards have. Each distinct list is interned once,
 * with its WELCOMEs, and lives as long as the server: a session points at
 * its list, and so do its GETs in flight on the pipeline threads, which
 * only read it.
 */
#ifndef EMLIO_SERVER_FIELDS_H
#define EMLIO_SERVER_FIELDS_H

#include <stddef.h>

#include "base.h"
#include "net.h"

struct emlio_server;

/* Distinct field lists a daemon keeps: more is refused (EMLIO_ELIMIT).
 * Each holds a WELCOME (the whole inventory) once asked, so the bound is
 * what a client flooding lists can make the daemon hold. */
#define EMLIO__SRV_MAX_FIELDSETS 16

typedef struct emlio__fieldset {
    char **names; /* in the client's order */
    size_t n;
    char *spec;          /* "json,jpg", for messages */
    emlio_buf_t welcome; /* once asked */
    bool encoded;
} emlio__fieldset_t;

typedef struct emlio__srv_fieldsets {
    emlio__fieldset_t *sets[EMLIO__SRV_MAX_FIELDSETS];
    size_t n;
} emlio__srv_fieldsets_t;

/* The list a HELLO asks for, checked against what the daemon serves:
 * *out the interned list, or NULL when the HELLO names none or names
 * exactly the daemon's own --fields. Returns 0, or EMLIO_EINVAL (a name
 * twice, a comma or NUL in one), EMLIO_ENOTFOUND (a field outside --fields, or
 * that no shard has), EMLIO_ELIMIT or EMLIO_ENOMEM, with text (EMLIO_ERRMSG_LEN
 * bytes). Frontend thread. */
int emlio__srv_fields_resolve(struct emlio_server *self,
                              const emlio__msg_hello_t *hello,
                              const emlio__fieldset_t **out, char *text);

/* The full WELCOME for a session of fs (NULL: the daemon's own); NULL
 * when out of memory. Frontend thread. */
const emlio_buf_t *emlio__srv_fields_welcome(struct emlio_server *self,
                                             const emlio__fieldset_t *fs);

/* Frames per sample for a GET of a session of fs (NULL: the daemon's). */
size_t emlio__srv_fields_per(const struct emlio_server *self,
                             const emlio__fieldset_t *fs);

/* Frees every list (the server is destroyed; nothing reads them). */
void emlio__srv_fields_release(emlio__srv_fieldsets_t *sets);

#endif /* EMLIO_SERVER_FIELDS_H */
