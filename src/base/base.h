/* base.h - the foundation every other room of src/ stands on, and the
 * first include of their files: the prelude (emlio_internal.h: feature
 * macros, system headers, banned functions, allocation and errors) and
 * the toolbox below. The one header of src/base/ that other folders
 * include (test_layout.sh checks it).
 * SPDX-License-Identifier: MIT
 *
 *   buf.h          the growable byte buffer (public API: emlio/buf.h)
 *   crc32c.h       CRC-32C as TFRecord uses it, and its combinations
 *   counter_rng.h  the counter-based generator of the transforms
 *   keyindex.h     an index from byte keys to the slots of an array
 *   queue.h        a bounded blocking queue between threads
 *   workpool.h     low-priority worker threads for small units of work
 */
#ifndef EMLIO_BASE_H
#define EMLIO_BASE_H

#include "emlio_internal.h"

#include "buf.h"
#include "counter_rng.h"
#include "crc32c.h"
#include "keyindex.h"
#include "queue.h"
#include "workpool.h"

#endif /* EMLIO_BASE_H */
