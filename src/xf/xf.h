/* xf.h - the transforms: JPEG/PNG decode, crop, resize and flip into
 * tensors, byte-identical wherever they run. The one header of src/xf/
 * that the server and the client include (test_layout.sh checks it);
 * the pipeline itself is public (emlio/transform.h).
 * SPDX-License-Identifier: MIT
 *
 *   xfstage.h    the stage both ends run: a batch's encoded samples into
 *                one tensor block, on a low-priority work pool
 *   placement.h  where a client's transforms run (daemon, here, split),
 *                from measured time and energy
 */
#ifndef EMLIO_XF_H
#define EMLIO_XF_H

#include "placement.h"
#include "xfstage.h"

#endif /* EMLIO_XF_H */
