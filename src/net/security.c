/* security.c - CURVE key helpers and the ZAP handler that admits clients
 * whose public key is authorized.
 * SPDX-License-Identifier: MIT
 */
#include "base.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "security.h"

#define S_ZAP_ENDPOINT "inproc://zeromq.zap.01"
#define S_POLL_MS      100

int
emlio_curve_keypair(char public_key[EMLIO_CURVE_KEY_LEN],
                    char secret_key[EMLIO_CURVE_KEY_LEN])
{
    if (zmq_curve_keypair(public_key, secret_key) != 0)
        return EMLIO_EINVAL;
    return 0;
}

int
emlio_curve_public(char public_key[EMLIO_CURVE_KEY_LEN], const char *secret_key)
{
    if (!secret_key || strlen(secret_key) != 40 ||
        zmq_curve_public(public_key, secret_key) != 0)
        return EMLIO_EINVAL;
    return 0;
}

static bool
s_is_z85(const char *key, size_t len)
{
    uint8_t raw[32];
    char copy[EMLIO_CURVE_KEY_LEN];
    if (len != 40)
        return false;
    memcpy(copy, key, 40);
    copy[40] = 0;
    return zmq_z85_decode(raw, copy) != NULL;
}

int
emlio_curve_read_key(const char *path, char key[EMLIO_CURVE_KEY_LEN])
{
    char line[256];
    FILE *f = fopen(path, "r");
    if (!f)
        return -errno;
    bool got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    if (!got)
        return EMLIO_EFORMAT;
    char *start = line;
    while (*start == ' ' || *start == '\t')
        start++;
    size_t len = strcspn(start, " \t\r\n");
    if (!s_is_z85(start, len))
        return EMLIO_EFORMAT;
    memcpy(key, start, 40);
    key[40] = 0;
    return 0;
}

int
emlio_curve_write_key(const char *path, const char *key, unsigned mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
    if (fd < 0)
        return -errno;
    char line[EMLIO_CURVE_KEY_LEN + 1];
    int n = snprintf(line, sizeof(line), "%.40s\n", key);
    ssize_t w = write(fd, line, (size_t)n);
    int err = w == n ? 0 : (w < 0 ? -errno : -EIO);
    if (close(fd) != 0 && err == 0)
        err = -errno;
    return err;
}

/* ---- the ZAP handler ---------------------------------------------------- */

struct emlio__zap {
    void *zmq;
    void *rep;
    uint8_t (*keys)[32];
    size_t n_keys;
    bool any; /* no key list: every CURVE client is admitted */
    pthread_t thread;
    atomic_bool stop;
    atomic_uint_fast64_t admitted;
    atomic_uint_fast64_t refused;
};

static int
s_cmp_key(const void *a, const void *b)
{
    return memcmp(a, b, 32);
}

static int
s_load_keys(emlio__zap_t *self, const char *dir, char *errbuf)
{
    DIR *d = opendir(dir);
    if (!d)
        return emlio__seterr(errbuf, -errno,
                             "cannot open authorized keys '%s': %s", dir,
                             strerror(errno));
    size_t cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char path[PATH_MAX];
        char key[EMLIO_CURVE_KEY_LEN];
        struct stat st;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
            emlio_curve_read_key(path, key) != 0)
            continue; /* not a key file: READMEs and the like */
        if (emlio__grow(&self->keys, &cap, self->n_keys, sizeof(*self->keys),
                        16) < 0) {
            rc = EMLIO_ENOMEM;
            break;
        }
        zmq_z85_decode(self->keys[self->n_keys++], key);
    }
    closedir(d);
    if (rc == 0 && self->n_keys == 0)
        rc = emlio__seterr(errbuf, EMLIO_ENOTFOUND,
                           "no public keys in authorized keys '%s'", dir);
    if (rc == 0)
        qsort(self->keys, self->n_keys, 32, s_cmp_key);
    return rc;
}

/* Answers one ZAP request (RFC 27): version, request id, domain, address,
 * identity, mechanism, then the mechanism's credentials. */
static void
s_zap_answer(emlio__zap_t *self)
{
    zmq_msg_t parts[8];
    int n = 0;
    int more = 1;
    while (more && n < 8) {
        zmq_msg_init(&parts[n]);
        if (zmq_msg_recv(&parts[n], self->rep, 0) < 0) {
            zmq_msg_close(&parts[n]);
            break;
        }
        more = zmq_msg_more(&parts[n]);
        n++;
    }
    while (more) { /* more frames than RFC 27 has: drain */
        zmq_msg_t extra;
        zmq_msg_init(&extra);
        if (zmq_msg_recv(&extra, self->rep, 0) < 0)
            more = 0;
        else
            more = zmq_msg_more(&extra);
        zmq_msg_close(&extra);
    }
    const char *status = "400";
    const char *text = "client key not authorized";
    if (n >= 7 && zmq_msg_size(&parts[5]) == 5 &&
        !memcmp(zmq_msg_data(&parts[5]), "CURVE", 5) &&
        zmq_msg_size(&parts[6]) == 32) {
        if (self->any || bsearch(zmq_msg_data(&parts[6]), self->keys,
                                 self->n_keys, 32, s_cmp_key)) {
            status = "200";
            text = "OK";
        }
    } else {
        text = "only CURVE clients are accepted";
    }
    atomic_fetch_add(status[0] == '2' ? &self->admitted : &self->refused, 1);
    const void *reply[6] = { "1.0", NULL, status, text, "", "" };
    size_t lens[6] = { 3, 0, 3, strlen(text), 0, 0 };
    if (n >= 2) {
        reply[1] = zmq_msg_data(&parts[1]);
        lens[1] = zmq_msg_size(&parts[1]);
    }
    for (int i = 0; i < 6; i++)
        zmq_send(self->rep, reply[i], lens[i], i < 5 ? ZMQ_SNDMORE : 0);
    for (int i = 0; i < n; i++)
        zmq_msg_close(&parts[i]);
}

static void *
s_zap_main(void *arg)
{
    emlio__zap_t *self = arg;
    zmq_pollitem_t item = { self->rep, 0, ZMQ_POLLIN, 0 };
    while (!atomic_load(&self->stop)) {
        int rc = zmq_poll(&item, 1, S_POLL_MS);
        if (rc > 0 && (item.revents & ZMQ_POLLIN))
            s_zap_answer(self);
    }
    return NULL;
}

emlio__zap_t *
emlio__zap_start(emlio_ctx_t *ctx, const char *dir, int *rc, size_t *n_keys,
                 char *errbuf)
{
    emlio__zap_t *self = emlio_calloc(1, sizeof(*self));
    if (!self) {
        *rc = emlio__seterr(errbuf, EMLIO_ENOMEM, "out of memory");
        return NULL;
    }
    self->zmq = emlio__ctx_zmq(ctx);
    self->any = dir == NULL;
    if (dir && (*rc = s_load_keys(self, dir, errbuf)) < 0)
        goto fail;
    self->rep = zmq_socket(self->zmq, ZMQ_REP);
    int zero = 0;
    if (!self->rep ||
        zmq_setsockopt(self->rep, ZMQ_LINGER, &zero, sizeof(zero)) != 0 ||
        zmq_bind(self->rep, S_ZAP_ENDPOINT) != 0) {
        *rc = emlio__seterr(errbuf, -errno,
                            "cannot start the authentication handler: %s "
                            "(one curve server per context)",
                            zmq_strerror(errno));
        goto fail;
    }
    int err = pthread_create(&self->thread, NULL, s_zap_main, self);
    if (err != 0) {
        *rc = emlio__seterr(errbuf, -err,
                            "cannot start the authentication thread: %s",
                            strerror(err));
        goto fail;
    }
    *n_keys = self->n_keys;
    *rc = 0;
    return self;
fail:
    if (self->rep)
        zmq_close(self->rep);
    emlio_free(self->keys);
    emlio_free(self);
    return NULL;
}

void
emlio__zap_stop(emlio__zap_t **self_p)
{
    if (!self_p || !*self_p)
        return;
    emlio__zap_t *self = *self_p;
    atomic_store(&self->stop, true);
    pthread_join(self->thread, NULL);
    zmq_close(self->rep);
    emlio_free(self->keys);
    emlio_free(self);
    *self_p = NULL;
}

uint64_t
emlio__zap_admitted(const emlio__zap_t *self)
{
    return self ? atomic_load(&self->admitted) : 0;
}

uint64_t
emlio__zap_refused(const emlio__zap_t *self)
{
    return self ? atomic_load(&self->refused) : 0;
}
