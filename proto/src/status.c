/* SPDX-License-Identifier: BSD-3-Clause */
/* The STATUS reply, read; see status.h. The daemon writes it in smp/requests.c. */
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/status.h"
#include "snap/wire.h"

int snap_status_decode(const void *payload, size_t len, struct snap_status *st)
{
	struct snap_rbuf r;
	memset(st, 0, sizeof(*st));
	snap_rbuf_init(&r, payload, len);
	st->mem_limit = snap_get_u64(&r);
	st->mem_used = snap_get_u64(&r);
	st->slots = snap_get_u32(&r);
	st->pid = snap_get_u32(&r);
	st->pinned = snap_get_u64(&r);
	st->pinners = snap_get_u32(&r);
	/* Older daemons end after pinners, then after reserving, then before
	 * damaged_files. */
	st->reserving = snap_rbuf_left(&r) ? snap_get_u32(&r) : 0;
	if ((st->has_heal = snap_rbuf_left(&r) != 0)) {
		st->repaired_chunks = snap_get_u64(&r);
		st->damaged_steps = snap_get_u64(&r);
		st->scrubbed_bytes = snap_get_u64(&r);
		st->scrub_passes = snap_get_u64(&r);
		st->scrub_rate = snap_get_u64(&r);
		snap_get_str(&r, st->last_damage, sizeof(st->last_damage));
		if ((st->has_files = snap_rbuf_left(&r) != 0))
			st->damaged_files = snap_get_u64(&r);
	}
	if (r.bad) {
		memset(st, 0, sizeof(*st));
		return -1;
	}
	return 0;
}

int snap_status_ask(const char *sock, int timeout_ms, struct snap_status *st)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	memset(st, 0, sizeof(*st));
	if (strlen(sock) >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, sock, strlen(sock) + 1);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    snap_wire_send(s, SNAP_MSG_STATUS, 0, NULL, 0, -1) != 0) {
		if (s >= 0)
			close(s);
		return -1;
	}
	struct snap_msg_hdr h;
	void *p = NULL;
	int rc = snap_wire_recv(s, &h, &p, NULL, timeout_ms);
	close(s);
	if (rc || h.type != (SNAP_MSG_STATUS | SNAP_MSG_REPLY) || h.status != 0) {
		free(p);
		return -1;
	}
	rc = snap_status_decode(p, h.len, st);
	free(p);
	return rc;
}
