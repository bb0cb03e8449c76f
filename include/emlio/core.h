/* emlio/core.h - what every public header of libemlio shares: version,
 * export marker, error codes, the library context and its log sink.
 * SPDX-License-Identifier: MIT
 *
 * Conventions that hold for every function in this library:
 *   - int returns: >= 0 is success (0, or a count), < 0 is failure. System
 *     errors are -errno; library errors are the EMLIO_E* codes below (all
 *     <= -1000 so they never collide with errno). emlio_strerror() names both.
 *   - Handles keep the text of their last failure: emlio_<module>_errmsg().
 *   - emlio_<x>_destroy(&p) accepts NULL and *p == NULL and sets *p to NULL.
 *   - A handle is used by one thread at a time unless its header says
 *     otherwise. emlio_ctx_t is thread-safe.
 *   - The library never prints; install a log callback with emlio_ctx_set_log.
 */
#ifndef EMLIO_CORE_H
#define EMLIO_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* EMLIO_VERSION_MAJOR/MINOR/PATCH and EMLIO_VERSION_STRING, generated from
 * the VERSION file at build time. */
#include "emlio/version.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EMLIO_MAKE_VERSION(major, minor, patch) \
    ((major)*10000 + (minor)*100 + (patch))
#define EMLIO_VERSION                                            \
    EMLIO_MAKE_VERSION(EMLIO_VERSION_MAJOR, EMLIO_VERSION_MINOR, \
                       EMLIO_VERSION_PATCH)

#if defined(__GNUC__)
#    define EMLIO_EXPORT __attribute__((visibility("default")))
#else
#    define EMLIO_EXPORT
#endif

/* Library error codes. Every one is <= -1000. */
#define EMLIO_EPROTO      -1000 /* malformed or unexpected protocol message */
#define EMLIO_EINCOMPLETE -1001 /* input ends before the structure does */
#define EMLIO_ECLOSED     -1002 /* the handle or peer was closed */
#define EMLIO_ECORRUPT    -1003 /* stored data failed its checksum */
#define EMLIO_EFORMAT     -1004 /* file is not in the expected format */
#define EMLIO_ENOMEM      -1005 /* out of memory */
#define EMLIO_ETIMEDOUT   -1006 /* a deadline passed */
#define EMLIO_EVERSION    -1007 /* peer speaks an incompatible protocol */
#define EMLIO_ENOTFOUND   -1008 /* no such shard, record or file */
#define EMLIO_EINVAL      -1009 /* invalid argument or configuration */
#define EMLIO_EDENIED     -1010 /* authentication or authorization failed */
#define EMLIO_EMISMATCH   -1011 /* peer's dataset differs from what we knew */
#define EMLIO_ELIMIT      -1012 /* a configured limit would be exceeded */
#define EMLIO_ESTATE      -1013 /* saved state does not fit this run */
#define EMLIO_ECREDIT                             \
    -1014 /* a connection's GETs in flight are at \
             the daemon's max_credit: ask again */

/* The run-time version, EMLIO_VERSION of the library actually loaded. */
EMLIO_EXPORT int emlio_version(void);

/* The run-time version as text, EMLIO_VERSION_STRING of the library
 * actually loaded ("0.2.0"). Static; never NULL. */
EMLIO_EXPORT const char *emlio_version_string(void);

/* sizeof() of the public structs as this library was built, so bindings
 * that mirror them (ctypes, cffi) can refuse to run against a library whose
 * layout differs instead of corrupting memory. 0 for an unknown value. */
enum emlio_struct {
    EMLIO_STRUCT_CLIENT_CONFIG = 1,
    EMLIO_STRUCT_CLIENT_STATS = 2,
    EMLIO_STRUCT_SAMPLE = 3,
    EMLIO_STRUCT_SERVER_CONFIG = 4,
    EMLIO_STRUCT_PLAN_SAMPLE = 5,
    EMLIO_STRUCT_STREAM_STATS = 6
};

EMLIO_EXPORT size_t emlio_struct_size(int which);

/* A static, human-readable description of rc (an EMLIO_E* code or -errno).
 * Thread-safe. Never returns NULL. */
EMLIO_EXPORT const char *emlio_strerror(int rc);

/* What to do with a sample that is corrupt: a record whose stored CRC does
 * not match its bytes, or an image that does not decode. Both ends have the
 * policy: emlio_server_config_t.on_corrupt for what the daemon reads and
 * decodes, emlio_client_config_t.on_corrupt for what the client decodes. */
enum emlio_on_corrupt {
    EMLIO_ON_CORRUPT_FAIL = 0, /* fail: the request, or next() of the epoch */
    EMLIO_ON_CORRUPT_SKIP = 1  /* leave the sample out, count and log it */
};

/* Log levels, most severe first. */
enum emlio_log_level {
    EMLIO_LOG_ERROR = 0,
    EMLIO_LOG_WARN = 1,
    EMLIO_LOG_INFO = 2,
    EMLIO_LOG_DEBUG = 3
};

/* A log sink. module is a short static name ("server", "client"); msg has
 * no trailing newline. Called from any library thread: it must be
 * thread-safe. */
typedef void emlio_log_fn(void *userdata, int level, const char *module,
                          const char *msg);

/* The library context: owns the ZeroMQ context and the log sink. Every
 * server and client hangs off one. Thread-safe. */
typedef struct emlio_ctx emlio_ctx_t;

/* Allocates a context. Returns NULL only when out of memory. */
EMLIO_EXPORT emlio_ctx_t *emlio_ctx_new(void);

/* Terminates ZeroMQ and frees the context. Every server and client made from
 * it must be destroyed first. Accepts NULL; sets *self_p to NULL. */
EMLIO_EXPORT void emlio_ctx_destroy(emlio_ctx_t **self_p);

/* Installs a log sink that receives messages at level <= max_level. fn NULL
 * discards everything (the default). Call before creating servers/clients. */
EMLIO_EXPORT void emlio_ctx_set_log(emlio_ctx_t *self, emlio_log_fn *fn,
                                    void *userdata, int max_level);

/* The most verbose level the sink receives (-1 when no sink is installed),
 * so callers can skip formatting messages that would be dropped. */
EMLIO_EXPORT int emlio_ctx_log_level(const emlio_ctx_t *self);

/* Formats a message and hands it to the context's sink under module (a
 * short static name), when level <= emlio_ctx_log_level(). For components
 * built on the library (emliod's exporters) that log through the same sink.
 * Thread-safe. */
EMLIO_EXPORT void emlio_ctx_log(const emlio_ctx_t *self, int level,
                                const char *module, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 4, 5)))
#endif
    ;

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_CORE_H */
