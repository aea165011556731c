/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * reply.h - answering a request on a client connection (wire.h framing):
 * the daemon's dispatch, and persist.c / files/fileopen.c when a deferred request
 * (FLUSH, FFLUSH with wait) completes later.
 */
#ifndef SNAP_SMP_REPLY_H
#define SNAP_SMP_REPLY_H

#include <stdint.h>

#include "snap/buf.h"

/* An error reply to a request of `type`: rc and the message. */
void smp_reply_err(int fd, uint16_t type, int rc, const char *msg);
/* A success reply carrying out (and pass_fd over SCM_RIGHTS unless < 0). 0 or an error: close the connection. */
int smp_reply_ok(int fd, uint16_t type, const struct snap_wbuf *out, int pass_fd);

#endif
