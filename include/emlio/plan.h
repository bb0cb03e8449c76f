/* emlio/plan.h - the epoch planner: which rank reads which samples, in which
 * batches, from which daemon.
 * SPDX-License-Identifier: MIT
 *
 * The planner is a pure function of its inputs. Every rank of a job calls it
 * with the same shard inventory, world size, batch size, epoch, seed and
 * policy, and gets its own share of the epoch, with no coordinator:
 *
 *   - across all ranks every sample of the dataset is assigned exactly once
 *     per epoch (padding, when asked for, is marked as such);
 *   - every rank gets the same number of batches;
 *   - the same inputs give the same plan on every machine (the generator is
 *     specified in docs/planner.md, not taken from libc);
 *   - a different epoch gives a different permutation.
 *
 * A plan stores no samples: it keeps a few words per shard and derives
 * each sample's place on demand from a keyed permutation of the epoch
 * (docs/planner.md), so building one costs O(shards), whatever the
 * number of samples, and planning the next epoch ahead costs nothing.
 *
 * Shards are identified by name (their path relative to the daemon's data
 * directory). A shard reported by several daemons is a replica: it is read
 * once per epoch, from one of its holders chosen deterministically.
 *
 * Thread rules: an emlio_plan_t is used by one thread at a time; plans do
 * not share state, so different plans may be built concurrently.
 */
#ifndef EMLIO_PLAN_H
#define EMLIO_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One shard of the inventory, as daemons report it. */
/* The version of the order the planner produces. It changes whenever the
 * same inputs would give another order (docs/planner.md, "Versions"), so
 * that state saved against one order is not applied to another.
 * Version 2: keyed Feistel permutations instead of stored shuffles. */
#define EMLIO_PLAN_VERSION 2

typedef struct emlio_plan_shard {
    const char *name;        /* borrowed; identity of the shard */
    uint64_t records;        /* number of records (samples) */
    uint64_t bytes;          /* file size, for locality and balance */
    const uint32_t *holders; /* borrowed; indices of daemons holding it */
    uint32_t n_holders;      /* >= 1 */
    /* The source it belongs to: an index into params.sources, 0 when the
     * epoch has no sources. Shards of one name in two sources are two
     * shards; replicas are shards of one name within one source. */
    uint32_t source;
} emlio_plan_shard_t;

/* One source of a blended epoch (docs/planner.md, "Sources"): a dataset
 * whose samples the epoch takes in a set proportion. */
typedef struct emlio_plan_source {
    /* Its share of the epoch against the other weighted sources: finite
     * and > 0. Ignored when samples is set. */
    double weight;
    /* Exactly this many samples an epoch (0: by weight). */
    uint64_t samples;
} emlio_plan_source_t;

/* At most this many sources in one epoch: a stratified sample's place is
 * found in O(sources). */
#define EMLIO_PLAN_MAX_SOURCES 1024

enum emlio_shuffle {
    /* File order: shards sorted by name, records in file order. */
    EMLIO_SHUFFLE_NONE = 0,
    /* Shard order permuted per epoch, then records permuted within windows
     * of window_shards consecutive shards. window_shards 0 (the default)
     * is one window of all shards: the whole dataset mixed; a few shards
     * per window favour locality over mixing. */
    EMLIO_SHUFFLE_WINDOW = 1
};

/* Positions [begin, end) of an epoch's global order. */
typedef struct emlio_plan_span {
    uint64_t begin;
    uint64_t end;
} emlio_plan_span_t;

/* An earlier blend of the epoch, when the sources' weights changed in
 * the middle of it (docs/planner.md, "Weights changed mid-epoch"): the
 * weights and epoch size the job ran with for a while, and what it
 * consumed of that blend's positions. Every layer is planned with the
 * params' world x batch_size (stratified batches are cut by it): the
 * global batch must stay the same across the layers, as elastic resume
 * keeps it (emlio_client_load_states refuses another). */
typedef struct emlio_plan_layer {
    const emlio_plan_source_t *sources; /* n_sources, in the params' order */
    uint64_t epoch_samples;             /* as in the params */
    const emlio_plan_span_t *done;      /* as the params' done, of this blend */
    size_t n_done;
} emlio_plan_layer_t;

/* At most this many weight changes in one epoch. */
#define EMLIO_PLAN_MAX_LAYERS 256

typedef struct emlio_plan_params {
    uint32_t world;         /* number of ranks, >= 1 */
    uint32_t rank;          /* 0 .. world - 1 */
    uint32_t batch_size;    /* samples per batch, >= 1 */
    uint64_t epoch;         /* 0-based */
    uint64_t seed;          /* shared by all ranks */
    int shuffle;            /* enum emlio_shuffle */
    uint32_t window_shards; /* shards per shuffle window; 0 = all shards */
    bool drop_last;         /* see the remainder rules in docs/planner.md */
    /* The shared schedule (docs/planner.md, "Shared schedule"): the
     * shard order comes from the dataset (its shards' names and record
     * counts) and the epoch, not the seed, so every job over the dataset
     * reads the same windows in the same order; the order inside each
     * window is still the seed's. With EMLIO_SHUFFLE_WINDOW only. */
    bool shared;
    /* The shared schedule's cursor at which this job's epoch 0 begins:
     * 0 for jobs that start together; a job that starts while others
     * read takes theirs (WELCOME "share_cursor"), and so reads what they
     * read from its first batch. Epoch e then visits the cursors
     * share_join + e * segments .. + segments - 1, each segment once. */
    uint64_t share_join;
    /* Elastic resume (docs/planner.md, "Elastic resume"): the positions
     * of this epoch's global order that earlier runs of the job consumed,
     * as n_done sorted, disjoint, non-empty spans (borrowed; copied by
     * build). The plan slices the rest, in global order, among this
     * run's ranks as it would a whole epoch, whatever world size the
     * earlier runs had. NULL and 0: the whole epoch. */
    const emlio_plan_span_t *done;
    size_t n_done;
    /* Sources (docs/planner.md, "Sources"): n_sources >= 1 blends them.
     * The epoch then holds epoch_samples samples (0: the sum of the
     * sources' sizes, a size being `samples` where set, else its record
     * count); sources with `samples` get exactly that many, the rest of
     * the epoch goes to the others in proportion to their weights, each
     * within one sample of its exact share (largest remainders). A source
     * asked for fewer samples than it has is subsampled without repeats,
     * the selection rotating across epochs so that every sample comes
     * before any comes twice; one asked for more is repeated whole, then
     * subsampled for the rest. The order is a pure function of (seed,
     * epoch, the sources in this order, their weights and inventories).
     * Sources are mixed whole: window_shards must be 0 and shared false.
     * stratify: every global batch (world x batch_size positions) holds
     * each source's share of it within one sample, the last one too.
     * Borrowed for the build. 0 and NULL: one dataset, as before. */
    const emlio_plan_source_t *sources;
    size_t n_sources;
    uint64_t epoch_samples;
    bool stratify;
    /* Weights changed mid-epoch: the blends the epoch ran under before
     * this one, oldest first (borrowed for the build). Each takes, of
     * what the ones before it left, what its own quotas still lack from
     * what was delivered: picks the earlier blends planned but did not
     * deliver first, then further picks of the source's stream, so no
     * sample comes twice in the epoch that would not have under one
     * blend. The positions of this plan (and `done`) are then those of
     * the last blend: the samples the epoch still has to deliver. */
    const emlio_plan_layer_t *layers;
    size_t n_layers;
} emlio_plan_params_t;

/* Fills p with defaults: world 1, rank 0, batch 32, epoch 0, seed 0,
 * window shuffle over all shards (window_shards 0), drop_last false. */
EMLIO_EXPORT void emlio_plan_params_init(emlio_plan_params_t *p);

/* One planned sample. */
typedef struct emlio_plan_sample {
    uint32_t shard;  /* index into the shards array given to build */
    uint32_t daemon; /* the holder to read it from */
    uint64_t record; /* record index within the shard */
    uint32_t source; /* its shard's source (0 without sources) */
    bool pad;        /* a repeat added so all ranks have equal batches */
} emlio_plan_sample_t;

typedef struct emlio_plan emlio_plan_t;

/* Allocates an empty plan. Returns NULL only when out of memory. */
EMLIO_EXPORT emlio_plan_t *emlio_plan_new(void);

/* Frees the plan. Accepts NULL; sets *self_p to NULL. */
EMLIO_EXPORT void emlio_plan_destroy(emlio_plan_t **self_p);

/* Computes this rank's share of the epoch described by params over the
 * n shards (any order; the plan does not depend on it). Replaces any
 * previous content. Returns 0, EMLIO_EINVAL (rank >= world, batch_size 0,
 * a shard without holders, two shards of the same name with different
 * record counts: the message says which) or EMLIO_ENOMEM. The shards array
 * is not kept. Time and memory are O(n log n) and O(n), independent of
 * the record counts: no sample is generated here. */
EMLIO_EXPORT int emlio_plan_build(emlio_plan_t *self,
                                  const emlio_plan_shard_t *shards, size_t n,
                                  const emlio_plan_params_t *params);

/* Batches in this rank's plan (equal on every rank). */
EMLIO_EXPORT size_t emlio_plan_batch_count(const emlio_plan_t *self);

/* Samples of batch i (i < batch_count): *n receives the count (batch_size,
 * or less for the last batch when drop_last is false). The samples are
 * computed on each call into a buffer the plan owns (batch_size entries,
 * allocated by build), so this never fails and costs O(batch_size).
 * Borrowed: valid until the next emlio_plan_batch, build or destroy on
 * this plan; copy them to keep two batches of one plan at once. The plan
 * is const for the caller, but this call writes its buffer: do not call
 * it on one plan from two threads at once. */
EMLIO_EXPORT const emlio_plan_sample_t *
emlio_plan_batch(const emlio_plan_t *self, size_t i, size_t *n);

/* Totals: samples in this rank's plan, of which padding; and, over the
 * whole epoch (all ranks), the dataset size and the samples dropped by
 * drop_last. */
EMLIO_EXPORT uint64_t emlio_plan_sample_count(const emlio_plan_t *self);
EMLIO_EXPORT uint64_t emlio_plan_pad_count(const emlio_plan_t *self);
EMLIO_EXPORT uint64_t emlio_plan_dataset_size(const emlio_plan_t *self);
EMLIO_EXPORT uint64_t emlio_plan_dropped_count(const emlio_plan_t *self);

/* The positions left to plan (the dataset size less params.done), and
 * the slice of them rank `rank` of `world` takes: rest positions
 * [*first, *first + *count) (docs/planner.md, Step 6; past `rest` they
 * are padding). Pure arithmetic, the same that build uses, so that a
 * resume state can be checked without building the plan. Returns 0 or
 * EMLIO_EINVAL (an argument out of range, or a count that overflows). */
EMLIO_EXPORT uint64_t emlio_plan_rest_size(const emlio_plan_t *self);
EMLIO_EXPORT int emlio_plan_slice(uint64_t rest, uint32_t world, uint32_t rank,
                                  uint32_t batch_size, bool drop_last,
                                  uint64_t *first, uint64_t *count);

/* The rest positions [*q0, *q1) that batch k of rank `rank` covers
 * (those past `rest`, padding, left out), and the batches a rank has:
 * contiguous slices, or with stratify each rank's part of global batch k
 * (docs/planner.md, "Stratified batches"). Pure arithmetic, as
 * emlio_plan_slice. Returns 0 or EMLIO_EINVAL. */
EMLIO_EXPORT int emlio_plan_batch_span(uint64_t rest, uint32_t world,
                                       uint32_t rank, uint32_t batch_size,
                                       bool drop_last, bool stratify,
                                       uint64_t k, uint64_t *q0, uint64_t *q1);
EMLIO_EXPORT uint64_t emlio_plan_rank_batches(uint64_t rest, uint32_t world,
                                              uint32_t batch_size,
                                              bool drop_last, bool stratify);

/* The global position of sample k (k < sample_count) of this rank's plan;
 * padding gives the position it repeats. The slice of the epoch it holds
 * is the positions of its samples, padding excepted. */
EMLIO_EXPORT uint64_t emlio_plan_position(const emlio_plan_t *self, uint64_t k);

/* The shared schedule (params.shared): its segments (1 when the plan is
 * not shared), and the cursor of the segment batch i (i < batch_count)
 * begins in: share_join + epoch * segments + its place in the epoch.
 * A client says it in its GETs, so that a daemon can tell a job that
 * joins where the others are (docs/planner.md). 0 when not shared. */
EMLIO_EXPORT uint64_t emlio_plan_segments(const emlio_plan_t *self);
/* The segments of the shared schedule of `shards` distinct shards in
 * windows of window_shards (0: one window of all): what
 * emlio_plan_segments says of such a plan, without building one. */
EMLIO_EXPORT uint64_t emlio_plan_shared_segments(uint64_t shards,
                                                 uint32_t window_shards);
EMLIO_EXPORT uint64_t emlio_plan_batch_cursor(const emlio_plan_t *self,
                                              size_t i);

/* Bytes the plan holds between builds: O(shards + batch_size), never
 * O(samples). A build needs about as much again, briefly, while it sorts
 * the inventory. */
EMLIO_EXPORT size_t emlio_plan_memory(const emlio_plan_t *self);

/* The samples source s (s < params.n_sources) has in the epoch, over all
 * ranks: its quota (after a weight change, what the earlier blends
 * delivered of it plus its part of the rest). 0 past the sources, or for
 * a plan without them. */
EMLIO_EXPORT uint64_t emlio_plan_source_quota(const emlio_plan_t *self,
                                              size_t s);

/* The last failure's text. Never NULL. */
EMLIO_EXPORT const char *emlio_plan_errmsg(const emlio_plan_t *self);

#ifdef __cplusplus
}
#endif

#endif /* EMLIO_PLAN_H */
