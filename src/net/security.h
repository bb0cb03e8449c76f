/* security.h - internal side of CURVE: the authorized-keys set and the ZAP
 * handler thread that admits clients by their public key.
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_SECURITY_PRIV_H
#define EMLIO_SECURITY_PRIV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emlio/security.h"

typedef struct emlio__zap emlio__zap_t;

/* Loads every key file under dir (regular files whose first line is a Z85
 * key; others are skipped and counted in *skipped) and binds a ZAP handler
 * on ZeroMQ's well-known endpoint in ctx, answering in its own thread:
 * CURVE clients whose key is in the set get "200", all others "400". With
 * dir NULL, any CURVE client is admitted (encryption without client
 * authentication). One handler per emlio_ctx_t. Returns the handler or NULL
 * with errbuf set (-errno or EMLIO_E* in *rc). */
emlio__zap_t *emlio__zap_start(emlio_ctx_t *ctx, const char *dir, int *rc,
                               size_t *n_keys, char *errbuf);

/* Stops the thread, unbinds and frees. Accepts NULL; sets *self_p NULL. */
void emlio__zap_stop(emlio__zap_t **self_p);

/* Clients admitted and refused so far. */
uint64_t emlio__zap_admitted(const emlio__zap_t *self);
uint64_t emlio__zap_refused(const emlio__zap_t *self);

#endif /* EMLIO_SECURITY_PRIV_H */
