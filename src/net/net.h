/* net.h - the network: what crosses between a client and a daemon, and
 * how the host's TCP carries it. The one header of src/net/ that the
 * server and the client include (test_layout.sh checks it).
 * SPDX-License-Identifier: MIT
 *
 *   wire.h      the protocol (version 4): one decoded struct per message
 *               type, encoders, and the limits every decoder enforces
 *   security.h  CURVE: the authorized-keys set and the ZAP handler
 *   netpath.h   socket-buffer limits and sizing, TCP_INFO samples
 *   tuner.h     how many streams a client needs, and what bounds its rate
 *   iolanes.h   which ZeroMQ I/O threads carry a client's streams
 */
#ifndef EMLIO_NET_H
#define EMLIO_NET_H

#include "iolanes.h"
#include "netpath.h"
#include "security.h"
#include "tuner.h"
#include "wire.h"

#endif /* EMLIO_NET_H */
