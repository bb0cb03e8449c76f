/* tar_header.c - the parts of a tar header (see tar_header.h).
 * SPDX-License-Identifier: MIT
 */
#include "emlio_internal.h"

#include "tar.h"
#include "tar_header.h"

/* Octal (NUL/space padded) or GNU base-256 number field. */
bool
emlio__tarh_number(const uint8_t *p, size_t n, uint64_t *out)
{
    uint64_t v = 0;
    if (p[0] & 0x80) { /* base-256, big endian, positive only */
        if (p[0] & 0x40)
            return false;
        v = p[0] & 0x3f;
        for (size_t i = 1; i < n; i++) {
            if (v >> 55)
                return false;
            v = v << 8 | p[i];
        }
        *out = v;
        return true;
    }
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\0'))
        i++;
    bool digits = false;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++) {
        if (v >> 60)
            return false;
        v = v << 3 | (uint64_t)(p[i] - '0');
        digits = true;
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != '\0')
            return false;
    if (!digits)
        v = 0;
    *out = v;
    return true;
}

bool
emlio__tarh_checksum_ok(const uint8_t *h)
{
    uint64_t stored;
    if (!emlio__tarh_number(h + 148, 8, &stored))
        return false;
    uint64_t sum = 0;
    int64_t ssum = 0;
    for (size_t i = 0; i < EMLIO__TAR_BLOCK; i++) {
        uint8_t c = (i >= 148 && i < 156) ? ' ' : h[i];
        sum += c;
        ssum += (int8_t)c;
    }
    return stored == sum || (int64_t)stored == ssum;
}

bool
emlio__tarh_zero_block(const uint8_t *h)
{
    for (size_t i = 0; i < EMLIO__TAR_BLOCK; i++)
        if (h[i])
            return false;
    return true;
}

size_t
emlio__tarh_strnlen(const uint8_t *p, size_t n)
{
    const uint8_t *z = memchr(p, 0, n);
    return z ? (size_t)(z - p) : n;
}

bool
emlio__tarh_regular(uint8_t type)
{
    return type == '0' || type == '\0' || type == '7';
}

/* Reads the "path" and "size" records of a pax extended header
 * data[0, len): "<len> <key>=<value>\n" each. */
int
emlio__tarh_pax(const uint8_t *data, size_t len, char *path, size_t *path_len,
                bool *have_path, uint64_t *size, bool *have_size)
{
    size_t off = 0;
    while (off < len) {
        uint64_t rec = 0;
        size_t i = off;
        while (i < len && data[i] >= '0' && data[i] <= '9' && rec < len) {
            rec = rec * 10 + (uint64_t)(data[i] - '0');
            i++;
        }
        if (i == off || i >= len || data[i] != ' ' || rec > len - off ||
            rec < (uint64_t)(i - off) + 3 || data[off + rec - 1] != '\n')
            return EMLIO_EFORMAT;
        const uint8_t *kv = data + i + 1;
        size_t kv_len = (size_t)(off + rec - 1 - (i + 1));
        const uint8_t *eq = memchr(kv, '=', kv_len);
        if (!eq)
            return EMLIO_EFORMAT;
        size_t klen = (size_t)(eq - kv);
        const uint8_t *val = eq + 1;
        size_t vlen = kv_len - klen - 1;
        if (klen == 4 && memcmp(kv, "path", 4) == 0) {
            if (vlen == 0 || vlen >= EMLIO_TAR_MAX_NAME)
                return EMLIO_EFORMAT;
            memcpy(path, val, vlen);
            *path_len = vlen;
            *have_path = true;
        } else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19)
                return EMLIO_EFORMAT;
            for (size_t k = 0; k < vlen; k++) {
                if (val[k] < '0' || val[k] > '9')
                    return EMLIO_EFORMAT;
                v = v * 10 + (uint64_t)(val[k] - '0');
            }
            *size = v;
            *have_size = true;
        }
        off += (size_t)rec;
    }
    return 0;
}
