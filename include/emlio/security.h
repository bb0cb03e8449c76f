/* emlio/security.h - CURVE keys for authenticated, encrypted streams.
 * SPDX-License-Identifier: MIT
 *
 * EMLIO uses ZeroMQ's CURVE mechanism (CurveZMQ: Curve25519 key exchange,
 * per-connection keys, authenticated encryption). A daemon has a key pair;
 * each client has one too. The daemon admits only clients whose public key
 * is in its authorized-keys directory (see emlio/server.h); a client must
 * know the daemon's public key (see emlio/client.h).
 *
 * Keys are 40-character Z85 strings. Key files hold the key on their first
 * line; `emlio keygen NAME` writes NAME.key (public) and NAME.key_secret
 * (secret, mode 0600). Thread-safe.
 */
#ifndef EMLIO_SECURITY_H
#define EMLIO_SECURITY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a Z85 key string including its NUL. */
#define EMLIO_CURVE_KEY_LEN 41

/* Generates a new key pair. Returns 0, or EMLIO_EINVAL when the ZeroMQ
 * library was built without CURVE support. */
EMLIO_EXPORT int emlio_curve_keypair(char public_key[EMLIO_CURVE_KEY_LEN],
                                     char secret_key[EMLIO_CURVE_KEY_LEN]);

/* Derives the public key of a secret key. Returns 0 or EMLIO_EINVAL. */
EMLIO_EXPORT int emlio_curve_public(char public_key[EMLIO_CURVE_KEY_LEN],
                                    const char *secret_key);

/* Reads the key on the first line of the file at path (surrounding blanks
 * ignored) and checks that it is 40 valid Z85 characters. Returns 0, -errno
 * (cannot read it) or EMLIO_EFORMAT (not a key). */
EMLIO_EXPORT int emlio_curve_read_key(const char *path,
                                      char key[EMLIO_CURVE_KEY_LEN]);

/* Writes key and a newline to path, created with mode (0600 for secrets)
 * and failing if it exists. Returns 0 or -errno. */
EMLIO_EXPORT int emlio_curve_write_key(const char *path, const char *key,
                                       unsigned mode);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_SECURITY_H */
