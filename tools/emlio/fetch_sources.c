/* fetch_sources.c - reads the JSON sources file of `emlio fetch
 * --sources FILE` (fetch_sources.h): a small parser for exactly that
 * shape, so nothing beyond it is accepted silently.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fetch_sources.h"

#define S_MAX_FILE (1 << 20)

typedef struct s_parser {
    const char *path;
    char *p;     /* the text; strings are unescaped in place */
    char *start; /* for line numbers */
    char *err;
    size_t errlen;
} s_parser_t;

static int
s_fail(s_parser_t *ps, const char *fmt, ...)
{
    unsigned line = 1;
    for (const char *c = ps->start; c < ps->p; c++)
        line += *c == '\n';
    int k = snprintf(ps->err, ps->errlen, "%s:%u: ", ps->path, line);
    va_list ap;
    va_start(ap, fmt);
    if (k >= 0 && (size_t)k < ps->errlen)
        vsnprintf(ps->err + k, ps->errlen - (size_t)k, fmt, ap);
    va_end(ap);
    return -1;
}

static void
s_ws(s_parser_t *ps)
{
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r')
        ps->p++;
}

static int
s_expect(s_parser_t *ps, char c)
{
    s_ws(ps);
    if (*ps->p != c)
        return s_fail(ps, "expected '%c'%s", c,
                      *ps->p ? "" : " before the end of the file");
    ps->p++;
    return 0;
}

/* A JSON string, unescaped in place; *out points at it, NUL-terminated.
 * A \uXXXX escape must name an ASCII character: names and endpoints are
 * ASCII, so any other is refused as an error, not read half-way. */
static int
s_string(s_parser_t *ps, char **out)
{
    s_ws(ps);
    if (*ps->p != '"')
        return s_fail(ps, "expected a string");
    char *dst = ++ps->p;
    *out = dst;
    for (;;) {
        char c = *ps->p++;
        if (c == '\0' || (unsigned char)c < 0x20)
            return s_fail(ps, "unterminated string or control byte in one");
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *ps->p++;
            switch (e) {
            case '"':
            case '\\':
            case '/':
                c = e;
                break;
            case 'b':
                c = '\b';
                break;
            case 'f':
                c = '\f';
                break;
            case 'n':
                c = '\n';
                break;
            case 'r':
                c = '\r';
                break;
            case 't':
                c = '\t';
                break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; i++) {
                    char h = *ps->p++;
                    int d = h >= '0' && h <= '9'   ? h - '0'
                            : h >= 'a' && h <= 'f' ? h - 'a' + 10
                            : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                                   : -1;
                    if (d < 0)
                        return s_fail(ps, "bad \\u escape");
                    v = v * 16 + (unsigned)d;
                }
                if (v == 0 || v > 0x7f)
                    return s_fail(ps, "\\u%04x: only ASCII escapes are read",
                                  v);
                c = (char)v;
                break;
            }
            default:
                return s_fail(ps, "bad escape '\\%c'", e ? e : '0');
            }
        }
        *dst++ = c;
    }
    *dst = '\0';
    return 0;
}

static int
s_number(s_parser_t *ps, double *out)
{
    s_ws(ps);
    /* JSON's grammar, not strtod's: no '+', hex, leading '.', inf or
     * nan. */
    size_t span = strspn(ps->p, "0123456789+-.eE");
    if (!(ps->p[0] == '-' || (ps->p[0] >= '0' && ps->p[0] <= '9')) ||
        ps->p[span] == 'x' || ps->p[span] == 'X' ||
        (ps->p[0] == '-' && ps->p[1] == '.'))
        return s_fail(ps, "expected a JSON number");
    char *end;
    errno = 0;
    double v = strtod(ps->p, &end);
    if (end == ps->p || end != ps->p + span || errno || !isfinite(v))
        return s_fail(ps, "expected a finite number");
    ps->p = end;
    *out = v;
    return 0;
}

/* endpoints: a string, or an array of strings joined by commas in place
 * (each string's bytes move left over the quotes and separators). */
static int
s_endpoints(s_parser_t *ps, char **out)
{
    s_ws(ps);
    if (*ps->p != '[')
        return s_string(ps, out);
    ps->p++;
    char *joined = NULL, *end = NULL;
    s_ws(ps);
    if (*ps->p == ']')
        return s_fail(ps, "an empty list of endpoints");
    for (;;) {
        char *s;
        if (s_string(ps, &s) < 0)
            return -1;
        size_t len = strlen(s);
        if (!joined) {
            joined = end = s;
        } else {
            *end++ = ',';
            memmove(end, s, len);
        }
        end += len;
        *end = '\0';
        s_ws(ps);
        if (*ps->p == ']')
            break;
        if (s_expect(ps, ',') < 0)
            return -1;
    }
    ps->p++;
    *out = joined;
    return 0;
}

static int
s_source(s_parser_t *ps, emlio_source_t *src)
{
    bool have_name = false, have_eps = false, have_w = false, have_n = false;
    *src = (emlio_source_t){ NULL, NULL, 1.0, 0 };
    if (s_expect(ps, '{') < 0)
        return -1;
    for (;;) {
        char *key;
        if (s_string(ps, &key) < 0 || s_expect(ps, ':') < 0)
            return -1;
        bool *seen = !strcmp(key, "name")        ? &have_name
                     : !strcmp(key, "endpoints") ? &have_eps
                     : !strcmp(key, "weight")    ? &have_w
                     : !strcmp(key, "samples")   ? &have_n
                                                 : NULL;
        if (!seen)
            return s_fail(ps,
                          "unknown key '%s' (name, endpoints, weight, "
                          "samples)",
                          key);
        if (*seen)
            return s_fail(ps, "key '%s' given twice", key);
        *seen = true;
        int rc;
        double v = 0;
        if (seen == &have_name) {
            rc = s_string(ps, (char **)&src->name);
        } else if (seen == &have_eps) {
            rc = s_endpoints(ps, (char **)&src->endpoints);
        } else if ((rc = s_number(ps, &v)) == 0 && seen == &have_w) {
            if (v <= 0)
                return s_fail(ps, "weight %g is not positive", v);
            src->weight = v;
        } else if (rc == 0) {
            if (v < 1 || v != floor(v) || v > 9007199254740992.0)
                return s_fail(ps, "samples %g is not a whole number >= 1", v);
            src->samples = (uint64_t)v;
        }
        if (rc < 0)
            return -1;
        s_ws(ps);
        if (*ps->p == '}')
            break;
        if (s_expect(ps, ',') < 0)
            return -1;
    }
    ps->p++;
    if (!have_name || !have_eps)
        return s_fail(ps, "a source needs a name and endpoints");
    if (have_w && have_n)
        return s_fail(ps,
                      "source '%s' gives both a weight and samples: "
                      "give one, not both",
                      src->name);
    return 0;
}

static char *
s_slurp(const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(S_MAX_FILE + 1);
    size_t len = text ? fread(text, 1, S_MAX_FILE + 1, f) : 0;
    bool bad = !text || ferror(f);
    fclose(f);
    if (bad || len > S_MAX_FILE || memchr(text, '\0', len)) {
        snprintf(err, errlen, "'%s': %s", path,
                 !text              ? "out of memory"
                 : bad              ? "cannot read it"
                 : len > S_MAX_FILE ? "larger than 1 MiB"
                                    : "holds a NUL byte: not a JSON text");
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

int
fetch_sources_load(const char *path, emlio_source_t *out, size_t cap, size_t *n,
                   char **text, char *err, size_t errlen)
{
    *n = 0;
    *text = s_slurp(path, err, errlen);
    if (!*text)
        return -1;
    s_parser_t ps = { path, *text, *text, err, errlen };
    if (s_expect(&ps, '[') < 0)
        return -1;
    s_ws(&ps);
    if (*ps.p == ']')
        return s_fail(&ps, "no source in the list");
    for (;;) {
        if (*n == cap)
            return s_fail(&ps, "more than %zu sources", cap);
        if (s_source(&ps, &out[*n]) < 0)
            return -1;
        (*n)++;
        s_ws(&ps);
        if (*ps.p == ']')
            break;
        if (s_expect(&ps, ',') < 0)
            return -1;
    }
    ps.p++;
    s_ws(&ps);
    if (*ps.p)
        return s_fail(&ps, "bytes after the list of sources");
    return 0;
}
