/* opts.c - the option parser shared by emliod and every `emlio` command.
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opts.h"

static const opt_t *
s_find_long(const opt_t *const *tables, const char *name, size_t len)
{
    for (size_t t = 0; tables[t]; t++)
        for (const opt_t *o = tables[t]; o->name; o++)
            if (strlen(o->name) == len && !strncmp(o->name, name, len))
                return o;
    return NULL;
}

static const opt_t *
s_find_short(const opt_t *const *tables, char c)
{
    for (size_t t = 0; tables[t]; t++)
        for (const opt_t *o = tables[t]; o->name; o++)
            if (o->short_name && o->short_name == c)
                return o;
    return NULL;
}

static bool
s_takes_value(const opt_t *o)
{
    return o->kind != OPT_FLAG && o->kind != OPT_UNSET && o->kind != OPT_HELP;
}

int
opt_parse_u64(const char *prog, const char *opt, const char *arg, uint64_t max,
              uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(arg, &end, 10);
    if (errno || *end || end == arg || arg[0] == '-' || v > max) {
        fprintf(stderr, "%s: invalid value '%s' for %s\n", prog, arg, opt);
        return -1;
    }
    *out = v;
    return 0;
}

static int
s_set_int(const char *where, const opt_t *o, const char *value)
{
    char opt[64];
    snprintf(opt, sizeof(opt), "--%s", o->name);
    uint64_t type_max = o->kind == OPT_U64   ? UINT64_MAX
                        : o->kind == OPT_U32 ? UINT32_MAX
                                             : (uint64_t)INT32_MAX;
    uint64_t max = o->max && o->max < type_max ? o->max : type_max;
    uint64_t v;
    if (opt_parse_u64(where, opt, value, type_max, &v) < 0)
        return -1;
    if (v > max) {
        fprintf(stderr, "%s: invalid value '%s' for %s: above %llu\n", where,
                value, opt, (unsigned long long)max);
        return -1;
    }
    if (v < o->min) {
        fprintf(stderr, "%s: invalid value '%s' for %s: below %llu\n", where,
                value, opt, (unsigned long long)o->min);
        return -1;
    }
    if (o->kind == OPT_U64)
        *(uint64_t *)o->dest = v;
    else if (o->kind == OPT_U32)
        *(uint32_t *)o->dest = (uint32_t)v;
    else
        *(int *)o->dest = (int)v;
    return 0;
}

/* A size: decimal, then an optional K/M/G/T (times 1024 each), "i" and
 * "B" ("64M", "64MiB", "1g"). Returns 0 or -1. */
static int
s_parse_size(const char *s, uint64_t *out)
{
    if (!isdigit((unsigned char)s[0]))
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    const char *u = *end ? strchr("KMGT", toupper((unsigned char)*end)) : NULL;
    if (u) {
        int shift = 10 * (int)(u - "KMGT" + 1);
        if (v > (UINT64_MAX >> shift))
            return -1;
        v <<= shift;
        end++;
        end += *end == 'i';
        end += *end == 'B' || *end == 'b';
    }
    if (*end)
        return -1;
    *out = v;
    return 0;
}

static int
s_set_size(const char *where, const opt_t *o, const char *value)
{
    uint64_t v;
    uint64_t max = o->max ? o->max : UINT64_MAX;
    if (s_parse_size(value, &v) < 0 || v < o->min || v > max) {
        fprintf(stderr,
                "%s: invalid value '%s' for --%s: expected a size from %llu "
                "to %llu (K, M, G suffixes allowed)\n",
                where, value, o->name, (unsigned long long)o->min,
                (unsigned long long)max);
        return -1;
    }
    *(uint64_t *)o->dest = v;
    return 0;
}

static int
s_set_double(const char *where, const opt_t *o, const char *value)
{
    char *end;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || *end || end == value || !(v >= o->dmin && v <= o->dmax)) {
        fprintf(stderr, "%s: invalid value '%s' for --%s: expected %g to %g\n",
                where, value, o->name, o->dmin, o->dmax);
        return -1;
    }
    *(double *)o->dest = v;
    return 0;
}

static int
s_set_choice(const char *where, const opt_t *o, const char *value)
{
    for (const opt_choice_t *c = o->choices; c->name; c++) {
        if (!strcmp(c->name, value)) {
            *(int *)o->dest = c->value;
            return 0;
        }
    }
    fprintf(stderr, "%s: invalid --%s '%s': expected", where, o->name, value);
    for (const opt_choice_t *c = o->choices; c->name; c++)
        fprintf(stderr, "%s %s", c == o->choices ? "" : ",", c->name);
    fprintf(stderr, "\n");
    return -1;
}

/* Stores value (NULL for flags) as o says. */
static int
s_set(const char *where, const opt_t *o, const char *value)
{
    int rc = 0;
    switch (o->kind) {
    case OPT_FLAG:
    case OPT_UNSET:
        *(bool *)o->dest = o->kind == OPT_FLAG;
        break;
    case OPT_STR:
        *(const char **)o->dest = value;
        break;
    case OPT_LIST: {
        opt_list_t *list = o->dest;
        if (list->n == OPT_LIST_MAX) {
            fprintf(stderr, "%s: --%s given more than %d times\n", where,
                    o->name, OPT_LIST_MAX);
            return -1;
        }
        list->v[list->n++] = value;
        break;
    }
    case OPT_U64:
    case OPT_U32:
    case OPT_INT:
        rc = s_set_int(where, o, value);
        break;
    case OPT_DOUBLE:
        rc = s_set_double(where, o, value);
        break;
    case OPT_SIZE:
        rc = s_set_size(where, o, value);
        break;
    case OPT_CHOICE:
        rc = s_set_choice(where, o, value);
        break;
    default:
        break;
    }
    if (rc == 0 && o->seen)
        *o->seen = true;
    return rc;
}

int
opt_apply(const char *where, const opt_t *const *tables, const char *name,
          const char *value)
{
    const opt_t *o = s_find_long(tables, name, strlen(name));
    if (!o || o->kind == OPT_HELP) {
        fprintf(stderr, "%s: unknown option '%s'\n", where, name);
        return -1;
    }
    if (s_takes_value(o) != (value != NULL)) {
        fprintf(stderr, "%s: option '%s' %s\n", where, name,
                value ? "takes no value" : "needs a value");
        return -1;
    }
    return s_set(where, o, value);
}

/* Finds the option that argv[*i] names and its value (advancing *i past a
 * separate value). Returns the option, or NULL after printing why. */
static const opt_t *
s_next(const char *prog, const opt_t *const *tables, int argc, char **argv,
       int *i, const char **value)
{
    const char *arg = argv[*i];
    const char *inline_value = NULL;
    const opt_t *o;
    if (arg[0] == '-' && arg[1] == '-' && arg[2]) {
        const char *eq = strchr(arg + 2, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        o = s_find_long(tables, arg + 2, len);
        inline_value = eq ? eq + 1 : NULL;
    } else if (arg[0] == '-' && arg[1] && !arg[2]) {
        o = s_find_short(tables, arg[1]);
    } else {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, arg);
        return NULL;
    }
    if (!o) {
        fprintf(stderr, "%s: unknown option '%s'\n", prog, arg);
        return NULL;
    }
    *value = NULL;
    if (!s_takes_value(o)) {
        if (inline_value) {
            fprintf(stderr, "%s: option '%s' takes no value\n", prog, arg);
            return NULL;
        }
    } else if (inline_value) {
        *value = inline_value;
    } else if (*i + 1 < argc) {
        *value = argv[++*i];
    } else {
        fprintf(stderr, "%s: option '%s' needs a value\n", prog, arg);
        return NULL;
    }
    return o;
}

int
opt_parse(const char *prog, const opt_t *const *tables, int argc, char **argv)
{
    return opt_parse_args(prog, tables, argc, argv, 0, NULL);
}

int
opt_parse_args(const char *prog, const opt_t *const *tables, int argc,
               char **argv, int flags, int *npos)
{
    bool help = false;
    int n = 0;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        bool positional = arg[0] != '-' || !arg[1];
        bool dashes = !strcmp(arg, "--");
        if (npos && (dashes || (positional && (flags & OPT_STOP_AT_ARG)))) {
            /* The rest is positional. Writing behind i is safe: each
             * argument kept so far used up at least one slot. */
            for (int j = dashes ? i + 1 : i; j < argc; j++)
                argv[1 + n++] = argv[j];
            break;
        }
        if (npos && positional) {
            argv[1 + n++] = argv[i];
            continue;
        }
        const char *value;
        const opt_t *o = s_next(prog, tables, argc, argv, &i, &value);
        if (!o)
            return -1;
        if (o->kind == OPT_HELP)
            help = true;
        else if (s_set(prog, o, value) < 0)
            return -1;
    }
    if (npos)
        *npos = n;
    return help ? OPT_HELP_SHOWN : 0;
}

static char *
s_trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

/* A config file is a few hundred bytes; this is far beyond any. */
#define S_CONFIG_MAX (1u << 20)

/* Reads the whole config file into a NUL-terminated buffer (*len bytes
 * before the NUL). Only a regular file of at most S_CONFIG_MAX bytes is
 * read (a directory, a FIFO or /dev/zero is refused, not read until
 * memory runs out); NULL with *why saying why otherwise. */
static char *
s_read_text(const char *path, size_t *len, const char **why)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        *why = strerror(errno);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    *why = S_ISDIR(st.st_mode)         ? "it is a directory"
           : !S_ISREG(st.st_mode)      ? "not a regular file"
           : st.st_size > S_CONFIG_MAX ? "larger than 1 MiB"
                                       : NULL;
    char *text = *why ? NULL : malloc((size_t)st.st_size + 2);
    if (!*why && !text)
        *why = strerror(ENOMEM);
    size_t got = 0;
    while (text && got < (size_t)st.st_size + 1) {
        ssize_t n = read(fd, text + got, (size_t)st.st_size + 1 - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            *why = strerror(errno);
            free(text);
            text = NULL;
        }
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (text && got > (size_t)st.st_size) {
        *why = "it grew while being read";
        free(text);
        text = NULL;
    }
    if (text)
        text[got] = '\0';
    *len = got;
    return text;
}

/* Applies one config line ("name", "name value" or "name = value"). */
static int
s_config_line(const char *where, const opt_t *const *tables, char *line)
{
    line = s_trim(line);
    if (!*line || *line == '#')
        return 0;
    if (line[0] == '-' && line[1] == '-')
        line += 2;
    char *value = line + strcspn(line, " \t=");
    if (*value) {
        *value++ = '\0';
        value = s_trim(value);
        if (*value == '=')
            value = s_trim(value + 1);
    }
    return opt_apply(where, tables, line, *value ? value : NULL);
}

int
opt_load_config(const char *prog, const opt_t *const *tables, const char *path,
                char **text_out)
{
    size_t len = 0;
    const char *why = NULL;
    char *text = s_read_text(path, &len, &why);
    *text_out = text;
    if (!text) {
        fprintf(stderr, "%s: cannot read config '%s': %s\n", prog, path, why);
        return -1;
    }
    /* A NUL would silently end the text here: say where it is. */
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        unsigned line = 1;
        for (const char *c = text; c < nul; c++)
            line += *c == '\n';
        fprintf(stderr, "%s: %s:%u: NUL byte in the config file\n", prog, path,
                line);
        return -1;
    }
    unsigned lineno = 0;
    for (char *line = text; line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char where[512];
        snprintf(where, sizeof(where), "%s: %s:%u", prog, path, ++lineno);
        if (s_config_line(where, tables, line) < 0)
            return -1;
        line = nl ? nl + 1 : NULL;
    }
    return 0;
}

void
opt_usage(FILE *out, const opt_t *const *tables)
{
    for (size_t t = 0; tables[t]; t++) {
        for (const opt_t *o = tables[t]; o->name; o++) {
            char head[64];
            char short_name[8] = "";
            if (o->short_name)
                snprintf(short_name, sizeof(short_name), "-%c, ",
                         o->short_name);
            int n =
                snprintf(head, sizeof(head), "  %s--%s%s%s", short_name,
                         o->name, o->meta ? " " : "", o->meta ? o->meta : "");
            fprintf(out, "%-23s", head);
            if (n >= 23)
                fprintf(out, "\n%-23s", "");
            for (const char *h = o->help; *h; h++) {
                fputc(*h, out);
                if (*h == '\n')
                    fprintf(out, "%-23s", "");
            }
            fputc('\n', out);
        }
    }
}
