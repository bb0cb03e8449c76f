/* emlio.h - the public interface of libemlio, the EMLIO data-loading library.
 * Include this one header; it pulls in every public module header.
 * SPDX-License-Identifier: MIT
 *
 * EMLIO moves batch assembly to the storage node: a daemon (emliod) memory-maps
 * TFRecord shards, packs whole batches and streams them over ZeroMQ/TCP; the
 * client keeps many batches in flight and hands them over as they arrive.
 * emlio/core.h states the conventions every function follows.
 *
 * Build with `pkg-config --cflags --libs libemlio`.
 */
#ifndef EMLIO_H
#define EMLIO_H

#include "emlio/core.h"
#include "emlio/dataset.h"

#include "emlio/buf.h"
#include "emlio/client.h"
#include "emlio/energy.h"
#include "emlio/example.h"
#include "emlio/plan.h"
#include "emlio/security.h"
#include "emlio/server.h"
#include "emlio/tfrecord.h"
#include "emlio/transform.h"

#endif /* EMLIO_H */
