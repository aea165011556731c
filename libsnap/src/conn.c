/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The connection to snapsmp: HELLO (retried while the daemon starts or a
 * dead predecessor's connection is torn down), REGISTER of the frozen
 * layout again after a reconnect, one request/reply pair at a time, and the
 * context's error messages (snap_fail; a save's failed asynchronous copy).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/proto.h"
#include "snap/wire.h"

#include "client.h"

int snap_fail(snap_ctx *ctx, int rc, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(ctx->err, sizeof(ctx->err), fmt, ap);
	va_end(ap);
	return rc;
}

/* The first failure of a save's asynchronous copy (a pool or GPU thread) is
 * the save's: kept on its record, reported by the next fence or wait. */
void snap_copy_failed(snap_ctx *ctx, struct save_rec *rec, int rc, const char *fmt, ...)
{
	pthread_mutex_lock(&ctx->mu);
	if (!rec->copy_rc) {
		rec->copy_rc = rc;
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(rec->err, SNAP_CLIENT_ERRLEN, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&ctx->mu);
}

const char *snap_errmsg(const snap_ctx *ctx)
{
	return ctx ? ctx->err : "no context";
}

void snap_disconnect(snap_ctx *ctx)
{
	if (ctx->sock >= 0)
		close(ctx->sock);
	ctx->sock = -1;
}

/*
 * One request/reply pair. Caller holds sock_mu. On a failure reply the
 * daemon's message becomes the context message (prefixed by what).
 */
int snap_roundtrip(snap_ctx *ctx, char *errbuf, uint16_t type, const struct snap_wbuf *req,
		     void **reply, uint32_t *rlen, int *fd_out, const char *what)
{
	struct snap_msg_hdr h;
	*reply = NULL;
	if (ctx->sock < 0) {
		snap_fmt(errbuf, SNAP_CLIENT_ERRLEN, "%s: not connected to snapsmp at %s", what, ctx->cfg.socket);
		return SNAP_ESMP;
	}
	int rc = snap_wire_send(ctx->sock, type, 0, req ? req->p : NULL, req ? (uint32_t)req->len : 0, -1);
	if (!rc)
		rc = snap_wire_recv(ctx->sock, &h, reply, fd_out, -1);
	if (rc) {
		snap_disconnect(ctx);
		snap_fmt(errbuf, SNAP_CLIENT_ERRLEN, "%s: lost connection to snapsmp at %s (%s)", what, ctx->cfg.socket,
			 snap_strerror(rc));
		return SNAP_ESMP;
	}
	if (h.type != (type | SNAP_MSG_REPLY)) {
		snap_disconnect(ctx);
		free(*reply);
		*reply = NULL;
		snap_fmt(errbuf, SNAP_CLIENT_ERRLEN, "%s: snapsmp sent an unexpected reply type %u", what, h.type);
		return SNAP_EPROTO;
	}
	if (h.status < 0) {
		int n = (int)(h.len < 400 ? h.len : 400);
		snap_fmt(errbuf, SNAP_CLIENT_ERRLEN, "%s: %.*s", what, n, *reply ? (const char *)*reply : "");
		free(*reply);
		*reply = NULL;
		if (fd_out && *fd_out >= 0) {
			close(*fd_out);
			*fd_out = -1;
		}
		return h.status;
	}
	*rlen = h.len;
	return 0;
}

int snap_send_layout(snap_ctx *ctx)
{
	struct snap_wbuf w = { 0 };
	snap_layout_encode(&w, &ctx->layout);
	if (w.oom)
		return snap_fail(ctx, SNAP_ENOMEM, "register: out of memory");
	void *rep;
	uint32_t rlen;
	int rc = snap_roundtrip(ctx, ctx->err, SNAP_MSG_REGISTER, &w, &rep, &rlen, NULL, "register");
	free(rep);
	snap_wbuf_free(&w);
	return rc;
}

/* The daemon decides how many slots a rank has: size the mapping cache to it.
 * It also says which generation this process belongs to, kept for reconnects. */
static int fit_slots(snap_ctx *ctx, const void *rep, uint32_t rlen)
{
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, rlen);
	uint32_t n = snap_get_u32(&r);
	snap_get_u64(&r);   /* mem_limit */
	snap_get_u64(&r);   /* mem_used */
	uint64_t gen = snap_get_u64(&r);
	if (r.bad || n < 2 || n > 64 || gen == 0)
		return snap_fail(ctx, SNAP_EPROTO, "hello: snapsmp announced %u slots per rank, generation %" PRIu64, n,
				 gen);
	ctx->gen = gen;
	if (n <= ctx->nmaps)
		return 0;
	struct slot_map *m = realloc(ctx->maps, n * sizeof(*m));
	if (!m)
		return snap_fail(ctx, SNAP_ENOMEM, "out of memory");
	memset(m + ctx->nmaps, 0, (n - ctx->nmaps) * sizeof(*m));
	ctx->maps = m;
	ctx->nmaps = n;
	return 0;
}

/* Connect and say HELLO, retrying while the daemon starts or a dead
 * predecessor's connection for this rank is still being torn down. */
int snap_connect(snap_ctx *ctx)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	int rc, started = ctx->cfg.autostart == SNAP_AUTOSTART_OFF;
	/* Up to 16 ms apart: a relaunched trainer waits here for its node's
	 * rebuild, and a failed connect costs microseconds. */
	for (unsigned delay_ms = 1;; delay_ms = delay_ms < 16 ? delay_ms * 2 : 16) {
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (s < 0)
			return snap_fail(ctx, SNAP_EIO, "socket: %s", strerror(errno));
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		if (strlen(ctx->cfg.socket) >= sizeof(a.sun_path)) {
			close(s);
			return snap_fail(ctx, SNAP_EINVAL, "socket path %s is too long", ctx->cfg.socket);
		}
		strcpy(a.sun_path, ctx->cfg.socket);
		if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
			ctx->sock = s;
			struct snap_wbuf w = { 0 };
			snap_put_str(&w, ctx->cfg.job);
			snap_put_u32(&w, (uint32_t)ctx->cfg.rank);
			snap_put_u32(&w, (uint32_t)ctx->cfg.world_size);
			snap_put_u32(&w, (uint32_t)getpid());
			/* A live process keeps its generation across daemon restarts. */
			snap_put_u64(&w, ctx->gen);
			if (ctx->cfg.launch[0])
				snap_put_str(&w, ctx->cfg.launch);
			void *rep;
			uint32_t rlen;
			rc = snap_roundtrip(ctx, ctx->err, SNAP_MSG_HELLO, &w, &rep, &rlen, NULL, "hello");
			snap_wbuf_free(&w);
			if (rc == 0)
				rc = fit_slots(ctx, rep, rlen);
			free(rep);
			if (rc == 0 && ctx->frozen)
				rc = snap_send_layout(ctx);
			if (rc == 0) {
				/* Slots handed out on earlier connections are unknown to this one. */
				pthread_mutex_lock(&ctx->mu);
				ctx->epoch++;
				pthread_mutex_unlock(&ctx->mu);
				return 0;
			}
			snap_disconnect(ctx);
			/* EBUSY: our dead predecessor's connection is not torn down yet;
			 * ESMP: the daemon died during the handshake (a restart is due). */
			if (rc != SNAP_EBUSY && rc != SNAP_ESMP)
				return rc;
		} else {
			int e = errno;
			close(s);
			/* No listener (no socket file, or a dead daemon's): start one
			 * once, then connect to whichever won the store's lock. */
			if (!started && (e == ENOENT || e == ECONNREFUSED)) {
				started = 1;
				rc = snap_smp_autostart(ctx->cfg.store, ctx->cfg.socket, deadline, ctx->err, sizeof(ctx->err));
				if (rc)
					return rc;
				continue;
			}
			rc = snap_fail(ctx, SNAP_ESMP, "cannot connect to snapsmp at %s: %s (is snapsmp running for store %s?%s)",
				  ctx->cfg.socket, strerror(e), ctx->cfg.store,
				  ctx->cfg.autostart == SNAP_AUTOSTART_OFF ? " SNAP_AUTOSTART=0: libsnap does not start it" : "");
		}
		if (snap_now_ns() >= deadline)
			return rc;
		struct timespec ts = { 0, (long)delay_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
}

int snap_ensure_connected(snap_ctx *ctx)
{
	pthread_mutex_lock(&ctx->sock_mu);
	int rc = ctx->sock >= 0 ? 0 : snap_connect(ctx);
	pthread_mutex_unlock(&ctx->sock_mu);
	return rc;
}
