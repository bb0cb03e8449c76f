/* cmd_keygen.c - `emlio keygen NAME`: writes a CURVE key pair as NAME.key
 * (public, to hand to peers) and NAME.key_secret (secret, mode 0600).
 * SPDX-License-Identifier: MIT
 */
#include "tool_util.h"

#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "commands.h"
#include "emlio.h"

static void
s_usage(FILE *out, const opt_t *const *tables)
{
    fprintf(out,
            "usage: emlio keygen NAME\n\n"
            "Writes a CURVE key pair: NAME.key holds the public key (give\n"
            "it to peers: a daemon's to its clients, a client's to the\n"
            "daemon's --authorized-keys directory), NAME.key_secret the\n"
            "secret key (mode 0600, keep it private). Existing files are\n"
            "never overwritten.\n\noptions:\n");
    opt_usage(out, tables);
}

int
cmd_keygen(int argc, char **argv)
{
    const opt_t table[] = {
        OPT("help", 'h', OPT_HELP, NULL, NULL, "show this help"),
        OPT_END,
    };
    const opt_t *tables[] = { table, NULL };
    int npos = 0;
    int status =
        cli_parse_args("keygen", tables, argc, argv, 0, &npos, s_usage);
    if (status >= 0)
        return status;
    if (npos != 1) {
        fprintf(stderr, "emlio keygen: expected one NAME, got %d\n", npos);
        s_usage(stderr, tables);
        return 2;
    }
    char pub[EMLIO_CURVE_KEY_LEN];
    char sec[EMLIO_CURVE_KEY_LEN];
    if (emlio_curve_keypair(pub, sec) < 0) {
        fprintf(stderr, "emlio keygen: this libzmq has no CURVE support\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof(path), "%s.key_secret", argv[1]);
    int rc = emlio_curve_write_key(path, sec, 0600);
    memset(sec, 0, sizeof(sec));
    if (rc < 0) {
        fprintf(stderr, "emlio keygen: cannot write '%s': %s\n", path,
                emlio_strerror(rc));
        return 1;
    }
    snprintf(path, sizeof(path), "%s.key", argv[1]);
    rc = emlio_curve_write_key(path, pub, 0644);
    if (rc < 0) {
        fprintf(stderr, "emlio keygen: cannot write '%s': %s\n", path,
                emlio_strerror(rc));
        return 1;
    }
    printf("%s\n", pub);
    return 0;
}
