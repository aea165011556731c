/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * status.h - ask a test's snapsmp for its STATUS reply, as snaptool status
 * does (needs snapproto).
 */
#ifndef SNAP_TEST_STATUS_H
#define SNAP_TEST_STATUS_H

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/wire.h"

/* The bytes the connected trainers reported pinned and how many report
 * some; 0, or -1 if the daemon does not answer or the reply is malformed. */
static inline int smp_status_pinned(const char *sock, uint64_t *pinned, uint32_t *pinners)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(sock) >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, sock, strlen(sock) + 1);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct snap_msg_hdr h;
	void *pl = NULL;
	int bad = s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) ||
		  snap_wire_send(s, SNAP_MSG_STATUS, 0, NULL, 0, -1) || snap_wire_recv(s, &h, &pl, NULL, 5000) ||
		  h.status != 0;
	if (s >= 0)
		close(s);
	if (!bad) {
		struct snap_rbuf r;
		snap_rbuf_init(&r, pl, h.len);
		snap_get_u64(&r); /* mem_limit */
		snap_get_u64(&r); /* mem_used */
		snap_get_u32(&r); /* slots */
		snap_get_u32(&r); /* pid */
		*pinned = snap_get_u64(&r);
		*pinners = snap_get_u32(&r);
		snap_get_u32(&r); /* slot files being reserved */
		for (int i = 0; i < 5; i++)
			snap_get_u64(&r); /* repaired chunks, damaged steps, scrubbed bytes, scrub passes, scrub rate */
		char last[1024];
		snap_get_str(&r, last, sizeof(last)); /* the last damage */
		snap_get_u64(&r); /* captured files damaged */
		bad = r.bad || snap_rbuf_left(&r) != 0;
	}
	free(pl);
	return bad ? -1 : 0;
}

#endif
