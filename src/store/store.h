/* store.h - the store: how a dataset's bytes get from the device into
 * memory. The one header of src/store/ that the server and the client
 * include (test_layout.sh checks it); what is not named here stays inside.
 * SPDX-License-Identifier: MIT
 *
 * From the top down, as the server calls it:
 *
 *   shardset.h     the shards of one data directory, found, indexed and
 *                  read as views (emlio__shard_read); leases and copying
 *                  reads when a shard changes under the daemon
 *   shard_cache.h  the mapped shards open at once, under a descriptor
 *                  budget, and the thread that takes their lease breaks
 *   ioengine.h     exact-size reads (io_uring or pread) of records the
 *                  page cache does not hold, in the order they are asked
 *   iobuf.h        the pooled buffers those reads land in
 *   sharecache.h   one read of a shard window serving every sharing job
 *   format.h       one table of operations per file format (TFRecord,
 *                  tar, ImageFolder), below the shard set: the shard set
 *                  calls down, the formats never call back up
 *   classes.h      a dataset's class names, for WELCOME
 *
 * The readers (tfrecord, tar, imagefolder), the mapped-file handle, the
 * dataset index and the path rules (beneath.h) are the store's own.
 */
#ifndef EMLIO_STORE_H
#define EMLIO_STORE_H

#include "classes.h"
#include "format.h"
#include "iobuf.h"
#include "ioengine.h"
#include "shard_cache.h"
#include "shardset.h"
#include "sharecache.h"

#endif /* EMLIO_STORE_H */
