/* placement.h - where a client's transforms run: on the daemons, on this
 * host, or split between them. Pure logic: the client feeds it what it
 * measured, it answers. SPDX-License-Identifier: MIT
 *
 * decode_at = auto (docs/transform.md) asks, once per epoch: which share f
 * of the batches should the daemons decode, the rest being decoded here?
 * Each choice has a rate (images/s) and an energy per image:
 *
 *   rate(f)  = min(server:   server.threads / server.cpu_s        / f,
 *                  client:   client.threads / client.cpu_s        / (1 - f),
 *                  link:     link_Bps / (f * tensor_B + (1-f) * encoded_B),
 *                  consumer: consumer_ips)
 *   J(f)     = f * server.cpu_s * server.core_w
 *            + (1 - f) * client.cpu_s * client.core_w
 *            + (f * tensor_B + (1-f) * encoded_B) * j_per_byte
 *
 * (the stages run in parallel, so the slowest bounds the rate; the energy of
 * a transform is the CPU time it takes times the power of a busy core on
 * that host, which is the energy meter's model term where no counter
 * exists). The answer is the f in {0, 1/8, ..., 1} with the least J(f) whose
 * rate is at least EMLIO_PLACE_SLACK of the fastest choice's: energy is
 * saved only where it costs at most 10% of the speed. Unknown figures
 * (never measured yet) borrow the other side's (the same code runs on
 * both), or the priors below when neither side has been measured; a side
 * with no threads takes no share.
 */
#ifndef EMLIO_PLACEMENT_H
#define EMLIO_PLACEMENT_H

#include <stdbool.h>
#include <stddef.h>

#define EMLIO_PLACE_STEPS        8           /* f in steps of 1/8 */
#define EMLIO_PLACE_SLACK        (1.0 / 1.1) /* at most 10% slower than the best */
/* Priors while neither side has been measured: a crop-aware JPEG decode
 * and RandomResizedCrop of a ~110 KB image on one core of our VMs
 * (docs/transform.md), and the energy model's busy-core power. */
#define EMLIO_PLACE_PRIOR_CPU_S  0.002
#define EMLIO_PLACE_PRIOR_CORE_W 3.2

/* One side's figures. */
typedef struct emlio__place_side {
    double threads; /* transform threads it gives this client (0 = none) */
    double cpu_s;   /* CPU seconds per image, measured; 0 = unknown */
    double core_w;  /* watts of one busy core; 0 = unknown */
} emlio__place_side_t;

typedef struct emlio__place_input {
    emlio__place_side_t client, server;
    double link_Bps;     /* bytes/s the path carries; 0 = unknown (no cap) */
    double encoded_B;    /* mean encoded (JPEG/PNG) bytes per image */
    double tensor_B;     /* bytes of one output tensor (H x W x 3) */
    double j_per_byte;   /* transport energy per byte, both ends; 0 = none */
    double consumer_ips; /* images/s the training loop takes; 0 = no cap */
} emlio__place_input_t;

typedef struct emlio__place_choice {
    double server_share;     /* f: share of batches decoded by the daemons */
    double images_per_s;     /* predicted rate of this choice */
    double j_per_image;      /* predicted energy per image of this choice */
    double best_ips;         /* the fastest choice's rate */
    double best_ips_share;   /* ... and its f */
    double best_j_per_image; /* ... and its energy per image */
    const char *bound;       /* what bounds the chosen rate: "server",
                                "client", "link" or "consumer" */
    char why[320];           /* one line: the choice and its figures */
} emlio__place_choice_t;

/* Chooses the share. Never fails: with nothing measured it answers from
 * the priors (equal costs: the split that is fastest). */
void emlio__place_choose(const emlio__place_input_t *in,
                         emlio__place_choice_t *out);

/* The predicted rate and energy per image of share f (for tests and the
 * benchmark); *bound names the bottleneck. */
double emlio__place_rate(const emlio__place_input_t *in, double f,
                         const char **bound);
double emlio__place_joules(const emlio__place_input_t *in, double f);

#endif /* EMLIO_PLACEMENT_H */
