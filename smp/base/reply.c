/* SPDX-License-Identifier: BSD-3-Clause */
/* Replies on a client connection; see reply.h. */
#include <string.h>

#include "base/reply.h"
#include "snap/wire.h"

void smp_reply_err(int fd, uint16_t type, int rc, const char *msg)
{
	snap_wire_send(fd, type | SNAP_MSG_REPLY, rc, msg, (uint32_t)strlen(msg), -1);
}

int smp_reply_ok(int fd, uint16_t type, const struct snap_wbuf *out, int pass_fd)
{
	return snap_wire_send(fd, type | SNAP_MSG_REPLY, 0, out->p, (uint32_t)out->len, pass_fd);
}
