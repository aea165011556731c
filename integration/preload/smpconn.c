/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The preload's connection to snapsmp: one Unix socket per process, opened
 * at the first captured write, one request at a time. When no snapsmp
 * answers, the first attempt starts one (SNAP_AUTOSTART, as libsnap.so
 * does) and waits for it. No snapsmp is still not an error here: the caller
 * falls back to the file system. A failed connect is retried at most once a
 * second, so a job without snapsmp pays for one connect(2) per second of
 * captured opens, not one per open.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "snap/base.h"
#include "snap/proto.h"
#include "preload.h"
#include "snap/wire.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int sock = -1;
static uint64_t next_try_ns;
static int autostart_failed;   /* said once; the process does not try again */

static void drop(void)
{
	if (sock >= 0)
		pl_real.close(sock);
	sock = -1;
}

static int attach(int s)
{
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, pl_cfg.job);
	snap_put_u32(&w, (uint32_t)getpid());
	int rc = w.oom ? SNAP_ENOMEM : snap_wire_send(s, SNAP_MSG_FATTACH, 0, w.p, (uint32_t)w.len, -1);
	snap_wbuf_free(&w);
	struct snap_msg_hdr h;
	void *pl = NULL;
	if (!rc)
		rc = snap_wire_recv(s, &h, &pl, NULL, (int)pl_cfg.timeout_ms);
	if (!rc && (h.type != (SNAP_MSG_FATTACH | SNAP_MSG_REPLY) || h.status != 0)) {
		pl_say("snapsmp at %s refused captured files of job %s: %.*s", pl_cfg.socket, pl_cfg.job,
		       h.status ? (int)h.len : 0, pl ? (const char *)pl : "");
		rc = SNAP_ESMP;
	}
	free(pl);
	return rc;
}

/* A connected and attached socket, or -1 with errno. */
static int try_connect(void)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(pl_cfg.socket) >= sizeof(a.sun_path)) {
		errno = ENAMETOOLONG;
		return -1;
	}
	strcpy(a.sun_path, pl_cfg.socket);
	/* Above the descriptors programs use (a shell's exec 3> must not close it). */
	int s = pl_hide_fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
	if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
		if (attach(s) == 0)
			return s;
		errno = ECONNRESET;
	}
	int e = errno;
	if (s >= 0)
		pl_real.close(s);
	errno = e;
	return -1;
}

/* No listener at the socket: start snapsmp and connect to whichever won the
 * store's lock, until the timeout. The socket, or -1 with errno. */
static int autostart(uint64_t now)
{
	uint64_t deadline = now + (uint64_t)pl_cfg.timeout_ms * 1000000ull;
	char err[768];
	/* Its posix_spawn resolves to our own hook, which would export this
	 * process's store files (taking their locks) under the connection's
	 * lock: the daemon is no child that shares our descriptors. */
	pl_spawning_daemon = 1;
	int rc = snap_smp_autostart(pl_cfg.store, pl_cfg.socket, deadline, err, sizeof(err));
	pl_spawning_daemon = 0;
	if (rc) {
		autostart_failed = 1;
		pl_say("%s", err);
		errno = ECONNREFUSED;
		return -1;
	}
	for (unsigned delay_ms = 1;; delay_ms = delay_ms < 16 ? delay_ms * 2 : 16) {
		int s = try_connect();
		if (s >= 0 || (errno != ENOENT && errno != ECONNREFUSED) || snap_now_ns() >= deadline)
			return s;
		struct timespec ts = { 0, (long)delay_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
}

/* Under mu. force: try now even within a second of a failed attempt. */
static int ensure(int force)
{
	if (sock >= 0)
		return 0;
	uint64_t now = snap_now_ns();
	if (now < next_try_ns && !force)
		return SNAP_ESMP;
	int s = try_connect();
	if (s < 0 && (errno == ENOENT || errno == ECONNREFUSED) && pl_cfg.autostart && !autostart_failed)
		s = autostart(now);
	if (s >= 0) {
		sock = s;
		return 0;
	}
	int e = errno;
	next_try_ns = snap_now_ns() + 1000000000ull;
	pl_warn_once(PL_WARN_ABSENT,
		     "snapsmp is not running at %s (%s): files under SNAP_CAPTURE are written to the file system "
		     "directly, without the node store", pl_cfg.socket, strerror(e));
	return SNAP_ESMP;
}

int pl_connected(void)
{
	pthread_mutex_lock(&mu);
	int ok = ensure(0) == 0;
	pthread_mutex_unlock(&mu);
	return ok;
}

int pl_rpc(uint16_t type, const struct snap_wbuf *req, void **payload, uint32_t *len, char *err, size_t errlen)
{
	int sent;
	return pl_rpc_ex(type, req, payload, len, err, errlen, 0, &sent);
}

int pl_rpc_ex(uint16_t type, const struct snap_wbuf *req, void **payload, uint32_t *len, char *err, size_t errlen,
	      int force, int *sent)
{
	*payload = NULL;
	*len = 0;
	*sent = 0;
	if (req->oom)
		return SNAP_ENOMEM;
	pthread_mutex_lock(&mu);
	int rc = ensure(force);
	struct snap_msg_hdr h;
	void *pl = NULL;
	if (!rc)
		rc = snap_wire_send(sock, type, 0, req->p, (uint32_t)req->len, -1);
	if (!rc) {
		*sent = 1;   /* from here on the daemon may have acted on it even if no reply comes */
		rc = snap_wire_recv(sock, &h, &pl, NULL, (int)pl_cfg.timeout_ms);
	}
	if (!rc && h.type != (type | SNAP_MSG_REPLY))
		rc = SNAP_EPROTO;
	if (rc) {
		/* Lost or confused: the daemon discards what this connection was
		 * writing, so the caller falls back; the next request reconnects. */
		free(pl);
		drop();
		snap_fmt(err, errlen, "lost the connection to snapsmp at %s", pl_cfg.socket);
		pthread_mutex_unlock(&mu);
		return rc == SNAP_EPROTO ? SNAP_EPROTO : SNAP_ESMP;
	}
	pthread_mutex_unlock(&mu);
	if (h.status) {
		snap_fmt(err, errlen, "%.*s", (int)h.len, pl ? (const char *)pl : "");
		free(pl);
		return h.status < 0 ? h.status : SNAP_EPROTO;
	}
	*payload = pl;
	*len = h.len;
	return 0;
}

void pl_conn_atfork_prepare(void)
{
	pthread_mutex_lock(&mu);
}

void pl_conn_atfork_parent(void)
{
	pthread_mutex_unlock(&mu);
}

void pl_conn_atfork_child(void)
{
	/* The socket is the parent's conversation: a child opens its own. */
	drop();
	next_try_ns = 0;
	pthread_mutex_unlock(&mu);
}
