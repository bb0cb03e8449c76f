/* sd_notify.h - tells systemd (Type=notify) that emliod is ready or
 * stopping, by the NOTIFY_SOCKET datagram protocol of sd_notify(3).
 * SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_TOOLS_SD_NOTIFY_H
#define EMLIO_TOOLS_SD_NOTIFY_H

/* Sends "READY=1" and a STATUS line naming endpoint to $NOTIFY_SOCKET.
 * Does nothing when the variable is unset (not started by systemd).
 * Returns 0 when sent or not needed, -errno when sending failed. */
int sd_notify_ready(const char *endpoint);

/* Sends "STOPPING=1". Same returns as sd_notify_ready. */
int sd_notify_stopping(void);

#endif /* EMLIO_TOOLS_SD_NOTIFY_H */
