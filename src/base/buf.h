/* buf.h - the byte buffer of the library's own sources; the API is public
 * (emlio/buf.h). SPDX-License-Identifier: MIT
 */
#ifndef EMLIO_BUF_PRIV_H
#define EMLIO_BUF_PRIV_H

#include "emlio/buf.h"

#endif /* EMLIO_BUF_PRIV_H */
