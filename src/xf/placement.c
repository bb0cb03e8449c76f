/* placement.c - the share of transforms the daemons run (decode_at=auto).
 * SPDX-License-Identifier: MIT
 * The model and the rule are in placement.h.
 */
#include "base.h"

#include <math.h>

#include "placement.h"

/* A side's figures with the unknowns borrowed from the other side: the
 * same code decodes the same images on both, so until one side has been
 * measured the other's cost is the best guess. */
static emlio__place_side_t
s_fill(emlio__place_side_t self, emlio__place_side_t other)
{
    if (self.cpu_s <= 0)
        self.cpu_s = other.cpu_s;
    if (self.core_w <= 0)
        self.core_w = other.core_w;
    return self;
}

static void
s_sides(const emlio__place_input_t *in, emlio__place_side_t *client,
        emlio__place_side_t *server)
{
    *client = s_fill(in->client, in->server);
    *server = s_fill(in->server, in->client);
    if (client->cpu_s <= 0)
        client->cpu_s = server->cpu_s = EMLIO_PLACE_PRIOR_CPU_S;
    if (client->core_w <= 0)
        client->core_w = server->core_w = EMLIO_PLACE_PRIOR_CORE_W;
}

/* Images/s one side sustains for a share `share` of the images. */
static double
s_side_rate(emlio__place_side_t side, double share)
{
    if (share <= 0)
        return INFINITY;
    if (side.threads <= 0)
        return 0;
    return side.threads / side.cpu_s / share;
}

static double
s_wire_bytes(const emlio__place_input_t *in, double f)
{
    return f * in->tensor_B + (1 - f) * in->encoded_B;
}

double
emlio__place_rate(const emlio__place_input_t *in, double f, const char **bound)
{
    emlio__place_side_t client, server;
    s_sides(in, &client, &server);
    double rate = s_side_rate(server, f);
    const char *what = "server";
    double r = s_side_rate(client, 1 - f);
    if (r < rate) {
        rate = r;
        what = "client";
    }
    double bytes = s_wire_bytes(in, f);
    if (in->link_Bps > 0 && bytes > 0 && in->link_Bps / bytes < rate) {
        rate = in->link_Bps / bytes;
        what = "link";
    }
    if (in->consumer_ips > 0 && in->consumer_ips < rate) {
        rate = in->consumer_ips;
        what = "consumer";
    }
    if (bound)
        *bound = what;
    return rate;
}

double
emlio__place_joules(const emlio__place_input_t *in, double f)
{
    emlio__place_side_t client, server;
    s_sides(in, &client, &server);
    return f * server.cpu_s * server.core_w +
           (1 - f) * client.cpu_s * client.core_w +
           s_wire_bytes(in, f) * in->j_per_byte;
}

void
emlio__place_choose(const emlio__place_input_t *in, emlio__place_choice_t *out)
{
    memset(out, 0, sizeof(*out));
    double rate[EMLIO_PLACE_STEPS + 1];
    double joules[EMLIO_PLACE_STEPS + 1];
    size_t fastest = 0;
    for (size_t k = 0; k <= EMLIO_PLACE_STEPS; k++) {
        double f = (double)k / EMLIO_PLACE_STEPS;
        rate[k] = emlio__place_rate(in, f, NULL);
        joules[k] = emlio__place_joules(in, f);
        /* Ties go to the cheaper share, then to the smaller f (fewer
         * bytes asked of the daemons). */
        if (rate[k] > rate[fastest] ||
            (rate[k] == rate[fastest] && joules[k] < joules[fastest]))
            fastest = k;
    }
    size_t pick = fastest;
    for (size_t k = 0; k <= EMLIO_PLACE_STEPS; k++) {
        if (rate[k] < rate[fastest] * EMLIO_PLACE_SLACK)
            continue;
        if (joules[k] < joules[pick] ||
            (joules[k] == joules[pick] && rate[k] > rate[pick]))
            pick = k;
    }
    out->server_share = (double)pick / EMLIO_PLACE_STEPS;
    out->images_per_s = emlio__place_rate(in, out->server_share, &out->bound);
    out->j_per_image = joules[pick];
    out->best_ips = rate[fastest];
    out->best_ips_share = (double)fastest / EMLIO_PLACE_STEPS;
    out->best_j_per_image = joules[fastest];
    snprintf(out->why, sizeof(out->why),
             "server share %.3f: %.0f images/s (bound by %s), %.4f J/image; "
             "fastest share %.3f: %.0f images/s, %.4f J/image",
             out->server_share, out->images_per_s, out->bound, out->j_per_image,
             out->best_ips_share, out->best_ips, out->best_j_per_image);
}
