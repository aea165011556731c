/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The trainer side of libsnap: region registry, connection to snapsmp, and
 * the save / fence / commit / restore cycle. See snap/snap.h for the contract
 * and docs/design.md for the protocol.
 *
 * Concurrency: the caller's thread runs the API; the copy pool's threads run
 * chunk copies and, on the thread that finishes the last chunk, the commit
 * round trip. `mu` guards the save state below, `sock_mu` serialises request
 * and reply pairs on the socket (the API thread may ACQUIRE the next slot
 * while a worker still COMMITs the previous step).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/proto.h"
#include "snap/manifest.h"
#include "pool.h"
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

const char *snap_errmsg(const snap_ctx *ctx)
{
	return ctx ? ctx->err : "no context";
}

/* ---- connection ---------------------------------------------------------- */

static void disconnect(snap_ctx *ctx)
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
		disconnect(ctx);
		snap_fmt(errbuf, SNAP_CLIENT_ERRLEN, "%s: lost connection to snapsmp at %s (%s)", what, ctx->cfg.socket,
			 snap_strerror(rc));
		return SNAP_ESMP;
	}
	if (h.type != (type | SNAP_MSG_REPLY)) {
		disconnect(ctx);
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

static int do_register(snap_ctx *ctx)
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
static int connect_smp(snap_ctx *ctx)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	int rc;
	for (unsigned delay_ms = 1;; delay_ms = delay_ms < 100 ? delay_ms * 2 : 100) {
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
				rc = do_register(ctx);
			if (rc == 0) {
				/* Slots handed out on earlier connections are unknown to this one. */
				pthread_mutex_lock(&ctx->mu);
				ctx->epoch++;
				pthread_mutex_unlock(&ctx->mu);
				return 0;
			}
			disconnect(ctx);
			/* EBUSY: our dead predecessor's connection is not torn down yet;
			 * ESMP: the daemon died during the handshake (a restart is due). */
			if (rc != SNAP_EBUSY && rc != SNAP_ESMP)
				return rc;
		} else {
			rc = snap_fail(ctx, SNAP_ESMP, "cannot connect to snapsmp at %s: %s (is snapsmp running for store %s?)",
				  ctx->cfg.socket, strerror(errno), ctx->cfg.store);
			close(s);
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
	int rc = ctx->sock >= 0 ? 0 : connect_smp(ctx);
	pthread_mutex_unlock(&ctx->sock_mu);
	return rc;
}

/* ---- open / register ----------------------------------------------------- */

int snap_open(const struct snap_config *cfg, snap_ctx **ctxp)
{
	if (!ctxp)
		return SNAP_EINVAL;
	*ctxp = NULL;
	snap_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return SNAP_ENOMEM;
	*ctxp = ctx;
	ctx->sock = -1;
	pthread_mutex_init(&ctx->mu, NULL);
	pthread_mutex_init(&ctx->sock_mu, NULL);
	pthread_mutex_init(&ctx->gmu, NULL);
	pthread_cond_init(&ctx->cv, NULL);
	int rc = 0;
	if (cfg)
		rc = snap_config_get(&ctx->cfg, cfg, ctx->err, sizeof(ctx->err));
	else
		snap_config_init(&ctx->cfg);
	if (!rc)
		rc = snap_config_check(&ctx->cfg, ctx->err, sizeof(ctx->err));
	if (!rc)
		rc = snap_config_socket(&ctx->cfg, ctx->err, sizeof(ctx->err));
	if (rc)
		return rc;
	/* The fewest slots a daemon grants; fit_slots() grows the cache to its count. */
	ctx->nmaps = 2;
	ctx->maps = calloc(ctx->nmaps, sizeof(*ctx->maps));
	if (!ctx->maps)
		return snap_fail(ctx, SNAP_ENOMEM, "out of memory");
	if ((rc = snap_pool_start(&ctx->pool, ctx->cfg.copy_threads)))
		return snap_fail(ctx, rc, "cannot start %u copy threads", ctx->cfg.copy_threads);
	return snap_ensure_connected(ctx);
}

/* A float region registered without a codec takes its kind's configured one. */
static void default_codec(const struct snap_config *cfg, struct snap_region *r)
{
	if (r->codec != SNAP_CODEC_NONE ||
	    (r->dtype != SNAP_DTYPE_F32 && r->dtype != SNAP_DTYPE_BF16 && r->dtype != SNAP_DTYPE_F16))
		return;
	if (r->kind == SNAP_KIND_PARAM) {
		r->codec = cfg->codec_param;
		r->codec_bound = cfg->codec_param_bound;
	} else if (r->kind == SNAP_KIND_OPTIM) {
		r->codec = cfg->codec_optim;
		r->codec_bound = cfg->codec_optim_bound;
	}
}

/* sizeof(struct snap_region) in 0.4, the first sized layout. */
#define SNAP_REGION_SIZE_0_4 (offsetof(struct snap_region, shard_offset) + SNAP_MAX_NDIM * sizeof(uint64_t))

int snap_register_size(snap_ctx *ctx, const struct snap_region *user, size_t size)
{
	if (!ctx)
		return SNAP_EINVAL;
	if (!user)
		return snap_fail(ctx, SNAP_EINVAL, "register: NULL region");
	/* A region of an older header lacks the newest fields: they keep
	 * these zero defaults (see "Growing the ABI" in snap.h). */
	struct snap_region whole = { 0 }, *r = &whole;
	int rc = snap_abi_copyin(&whole, sizeof(whole), user, size, SNAP_REGION_SIZE_0_4);
	if (rc == SNAP_EINVAL)
		return snap_fail(ctx, rc, "register: struct snap_region size %zu is smaller than any released layout", size);
	if (rc)
		return snap_fail(ctx, rc, "register \"%s\": the region sets fields this libsnap (%s) does not know: the "
				 "program was built against a newer snap/snap.h", user->name ? user->name : "(null)",
				 snap_version_string());
	if (ctx->frozen)
		return snap_fail(ctx, SNAP_ESTATE, "register \"%s\": the layout is frozen after the first save or restore",
			    r->name ? r->name : "(null)");
	if (r->device != SNAP_DEVICE_HOST && r->device != SNAP_DEVICE_CUDA)
		return snap_fail(ctx, SNAP_EINVAL, "register \"%s\": unknown device %d", r->name ? r->name : "(null)",
			    r->device);
	if (!r->ptr && r->bytes)
		return snap_fail(ctx, SNAP_EINVAL, "register \"%s\": NULL pointer", r->name ? r->name : "(null)");
	if (ctx->nregs == ctx->capregs) {
		uint32_t cap = ctx->capregs ? ctx->capregs * 2 : 16;
		struct snap_region *p = realloc(ctx->regs, cap * sizeof(*p));
		if (!p)
			return snap_fail(ctx, SNAP_ENOMEM, "out of memory");
		ctx->regs = p;
		ctx->capregs = cap;
	}
	struct snap_region eff = *r;
	default_codec(&ctx->cfg, &eff);
	/* Validate now, with the region alone, so the error names it at once. */
	struct snap_layout one;
	rc = snap_layout_build(&one, &eff, 1, ctx->cfg.chunk_size, ctx->err, sizeof(ctx->err));
	if (rc)
		return rc;
	snap_layout_free(&one);
	for (uint32_t i = 0; i < ctx->nregs; i++)
		if (strcmp(ctx->regs[i].name, r->name) == 0)
			return snap_fail(ctx, SNAP_EINVAL, "register \"%s\": a region of that name is already registered", r->name);
	if (r->device == SNAP_DEVICE_CUDA && r->bytes && (rc = snap_gpu_attach(ctx, r)))
		return rc;
	ctx->nhost += r->device == SNAP_DEVICE_HOST;
	struct snap_region *d = &ctx->regs[ctx->nregs];
	*d = eff;
	d->name = strdup(r->name);
	if (!d->name)
		return snap_fail(ctx, SNAP_ENOMEM, "out of memory");
	ctx->nregs++;
	return 0;
}

int snap_freeze(snap_ctx *ctx)
{
	if (ctx->frozen)
		return 0;
	if (ctx->nregs == 0)
		return snap_fail(ctx, SNAP_ESTATE, "no region is registered");
	/* The layout is built once; a REGISTER refused (budget) may be retried. */
	int rc;
	if (!ctx->layout.regions &&
	    (rc = snap_layout_build(&ctx->layout, ctx->regs, ctx->nregs, ctx->cfg.chunk_size, ctx->err,
				    sizeof(ctx->err))))
		return rc;
	for (int i = 0; i < 2; i++) {
		if (!ctx->rec[i].crc)
			ctx->rec[i].crc = calloc(ctx->layout.ncrc ? ctx->layout.ncrc : 1, sizeof(uint32_t));
		if (!ctx->rec[i].len)
			ctx->rec[i].len = calloc(ctx->layout.ncrc ? ctx->layout.ncrc : 1, sizeof(uint32_t));
		if (!ctx->rec[i].crc || !ctx->rec[i].len)
			return snap_fail(ctx, SNAP_ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&ctx->sock_mu);
	rc = do_register(ctx);
	pthread_mutex_unlock(&ctx->sock_mu);
	if (rc)
		return rc;
	ctx->frozen = 1;
	return 0;
}

/* ---- save ---------------------------------------------------------------- */

/* Map (or reuse the mapping of) the slot file snapsmp passed. Takes fd. */
static int map_slot(snap_ctx *ctx, uint32_t slot, int fd, uint8_t **base)
{
	struct stat st;
	struct slot_map *m = &ctx->maps[slot];
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < ctx->layout.slot_bytes) {
		close(fd);
		return snap_fail(ctx, SNAP_EPROTO, "slot %u from snapsmp is smaller than the layout (%" PRIu64 " bytes)", slot,
			    ctx->layout.slot_bytes);
	}
	if (m->base && m->dev == st.st_dev && m->ino == st.st_ino && m->size == (uint64_t)st.st_size) {
		close(fd);
		*base = m->base;
		return 0;
	}
	if (m->base) {
		snap_gpu_unpin(ctx, m);
		munmap(m->base, m->size);
	}
	m->base = NULL;
	int flags = MAP_SHARED | (ctx->cfg.populate ? MAP_POPULATE : 0);
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, flags, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return snap_fail(ctx, SNAP_EIO, "mmap of slot %u (%" PRIu64 " bytes): %s", slot, (uint64_t)st.st_size,
			    strerror(errno));
	m->base = p;
	m->size = (uint64_t)st.st_size;
	m->dev = st.st_dev;
	m->ino = st.st_ino;
	/* Pinned once per mapping, not per save: registering costs ~ms per GiB. */
	int rc = snap_gpu_pin(ctx, m);
	if (rc) {
		munmap(p, m->size);
		m->base = NULL;
		return rc;
	}
	*base = p;
	return 0;
}

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

/* Compress chunk c of a codec region into its frame area; CRC the frame. */
static void compress_chunk(snap_ctx *ctx, struct save_rec *rec, uint32_t t, const struct snap_chunk *c,
			   const uint8_t *src)
{
	const struct snap_man_region *g = c->g;
	struct snap_codec_params p = { .codec = g->codec, .dtype = g->dtype, .bound = g->bound };
	size_t n = 0;
	int rc = snap_codec_compress(&p, src, c->raw_len / snap_dtype_size(g->dtype), rec->base + c->slot_off,
				     c->cap, &n);
	if (rc) {
		snap_copy_failed(ctx, rec, rc, "save of step %" PRIu64 ": region \"%s\" chunk %u: compression "
				 "failed: %s", rec->step, g->name, c->index, snap_strerror(rc));
		n = 0;
	}
	rec->len[t] = (uint32_t)n;
	rec->crc[t] = snap_crc32c(rec->base + c->slot_off, n);
}

static void copy_task(void *arg, uint32_t t)
{
	snap_ctx *ctx = arg;
	struct save_rec *rec = &ctx->rec[ctx->cur];
	/* Task t is chunk t of the whole layout; regions are in registration order. */
	struct snap_chunk c;
	snap_layout_chunk(&ctx->layout, t, &c);
	const struct snap_region *reg = &ctx->regs[c.g - ctx->layout.regions];
	if (ctx->gpu) {
		snap_gpu_enqueue(ctx, rec, t + SNAP_GPU_AHEAD);
		if (reg->device == SNAP_DEVICE_CUDA) {
			snap_gpu_chunk(ctx, rec, t, &c);
			return;
		}
	}
	const uint8_t *src = (const uint8_t *)reg->ptr + c.raw_off;
	if (c.g->codec != SNAP_CODEC_NONE) {
		compress_chunk(ctx, rec, t, &c, src);
		return;
	}
	uint8_t *dst = rec->base + c.slot_off;
	uint64_t n = c.raw_len;
	uint32_t crc = 0;
	for (uint64_t done = 0; done < n; done += SUBBLOCK) {
		size_t k = n - done < SUBBLOCK ? (size_t)(n - done) : SUBBLOCK;
		memcpy(dst + done, src + done, k);
		crc = snap_crc32c_update(crc, dst + done, k);
	}
	rec->crc[t] = crc;
	rec->len[t] = (uint32_t)n;
}

/*
 * The daemon went away after handing out rec's slot: the COMMIT failed on the
 * way, or the slot came from an earlier connection. The slot file still holds
 * the step's bytes (slot files outlive snapsmp, and this rank is their only
 * writer), so the step is not lost: reconnect and RECOMMIT the same slot. The
 * new daemon publishes it if the slot is still free, or confirms it if the
 * dead one had published it already. Meanwhile acquire() hands out no slot on
 * the new connection (wait_for_stale_commits), so no newer save can take this
 * one first. Caller holds sock_mu.
 */
static int recommit(snap_ctx *ctx, struct save_rec *rec, const struct snap_wbuf *w, const char *what)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	for (unsigned delay_ms = 1;; delay_ms = delay_ms < 100 ? delay_ms * 2 : 100) {
		int rc = ctx->sock >= 0 ? 0 : connect_smp(ctx);
		if (rc) {
			memcpy(rec->err, ctx->err, SNAP_CLIENT_ERRLEN);
			return rc;
		}
		void *rep;
		uint32_t rlen;
		rc = snap_roundtrip(ctx, rec->err, SNAP_MSG_RECOMMIT, w, &rep, &rlen, NULL, what);
		free(rep);
		if (rc == 0) {
			pthread_mutex_lock(&ctx->mu);
			rec->epoch = ctx->epoch;
			pthread_mutex_unlock(&ctx->mu);
		}
		if (rc != SNAP_ESMP || snap_now_ns() >= deadline)
			return rc;
		struct timespec ts = { 0, (long)delay_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
}

static int send_commit(snap_ctx *ctx, struct save_rec *rec)
{
	struct snap_wbuf w = { 0 };
	snap_put_u32(&w, rec->slot);
	snap_put_u64(&w, rec->step);
	snap_put_u32(&w, ctx->layout.ncrc);
	for (uint32_t i = 0; i < ctx->layout.ncrc; i++)
		snap_put_u32(&w, rec->crc[i]);
	for (uint32_t i = 0; i < ctx->layout.ncrc; i++)
		snap_put_u32(&w, rec->len[i]);
	if (w.oom) {
		snap_fmt(rec->err, SNAP_CLIENT_ERRLEN, "commit of step %" PRIu64 ": out of memory", rec->step);
		return SNAP_ENOMEM;
	}
	char what[64];
	snprintf(what, sizeof(what), "commit of step %" PRIu64, rec->step);
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	pthread_mutex_lock(&ctx->mu);
	int same = ctx->sock >= 0 && rec->epoch == ctx->epoch;
	pthread_mutex_unlock(&ctx->mu);
	int rc = SNAP_ESMP;
	if (same) {
		rc = snap_roundtrip(ctx, rec->err, SNAP_MSG_COMMIT, &w, &rep, &rlen, NULL, what);
		free(rep);
	}
	if (rc == SNAP_ESMP)
		rc = recommit(ctx, rec, &w, what);
	pthread_mutex_unlock(&ctx->sock_mu);
	snap_wbuf_free(&w);
	return rc;
}

/* Runs on the copy thread that finished the save's last chunk. */
static void copy_done(void *arg)
{
	snap_ctx *ctx = arg;
	pthread_mutex_lock(&ctx->mu);
	struct save_rec *rec = &ctx->rec[ctx->cur];
	uint64_t my_turn = ctx->commits_started++;
	ctx->copying = 0;
	pthread_cond_broadcast(&ctx->cv);          /* the fence may return now */
	while (ctx->commits_done != my_turn)       /* commits leave in step order */
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	pthread_mutex_unlock(&ctx->mu);

	/* A chunk that failed to compress leaves the slot uncommitted. Hanging
	 * up makes the daemon free it; the next call reconnects. */
	int rc = rec->copy_rc;
	if (rc) {
		pthread_mutex_lock(&ctx->sock_mu);
		disconnect(ctx);
		pthread_mutex_unlock(&ctx->sock_mu);
	} else {
		rec->err[0] = '\0';
		rc = send_commit(ctx, rec);
	}

	pthread_mutex_lock(&ctx->mu);
	if (rc) {
		ctx->pending_err = rc;
		memcpy(ctx->pending_msg, rec->err, SNAP_CLIENT_ERRLEN);
	}
	ctx->commits_done++;
	ctx->commits_pending--;
	pthread_cond_broadcast(&ctx->cv);
	pthread_mutex_unlock(&ctx->mu);
}

/* Report (once) a commit that failed after its save returned. Caller holds mu. */
static int take_pending(snap_ctx *ctx)
{
	int rc = ctx->pending_err;
	if (rc) {
		memcpy(ctx->err, ctx->pending_msg, SNAP_CLIENT_ERRLEN);
		ctx->pending_err = 0;
	}
	return rc;
}

/*
 * Before asking for a slot, let commits whose slots the current connection
 * does not know about (they came from a daemon that died) be recommitted:
 * the new daemon sees those slots as free and could hand one out for this
 * save, which would overwrite a step this rank is about to commit. With
 * `all`, wait for every pending commit (the connection is lost, and a
 * reconnect would make them all such commits).
 */
static void wait_for_stale_commits(snap_ctx *ctx, int all)
{
	pthread_mutex_lock(&ctx->mu);
	for (;;) {
		int stale = 0;
		for (unsigned k = 0; k < ctx->commits_pending && k < 2; k++)
			stale |= all || ctx->rec[ctx->cur ^ k].epoch != ctx->epoch;
		if (!stale)
			break;
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	}
	pthread_mutex_unlock(&ctx->mu);
}

#define RETRY_LATER 1   /* not an error code: go round the loop again */

static int acquire(snap_ctx *ctx, uint64_t step, uint32_t *slot, int *fd, uint64_t *epoch)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	char what[64];
	snprintf(what, sizeof(what), "save of step %" PRIu64, step);
	for (unsigned delay_us = 50;; delay_us = delay_us < 20000 ? delay_us * 2 : 20000) {
		pthread_mutex_lock(&ctx->sock_mu);
		int down = ctx->sock < 0;
		pthread_mutex_unlock(&ctx->sock_mu);
		wait_for_stale_commits(ctx, down);
		int rc = snap_ensure_connected(ctx);
		if (rc)
			return rc;
		struct snap_wbuf w = { 0 };
		snap_put_u64(&w, step);
		void *rep;
		uint32_t rlen = 0;
		pthread_mutex_lock(&ctx->sock_mu);
		pthread_mutex_lock(&ctx->mu);
		int stale = 0;
		for (unsigned k = 0; k < ctx->commits_pending && k < 2; k++)
			stale |= ctx->rec[ctx->cur ^ k].epoch != ctx->epoch;
		*epoch = ctx->epoch;
		pthread_mutex_unlock(&ctx->mu);
		/* A worker may have reconnected since the wait: wait again. */
		rc = stale ? RETRY_LATER : snap_roundtrip(ctx, ctx->err, SNAP_MSG_ACQUIRE, &w, &rep, &rlen, fd, what);
		pthread_mutex_unlock(&ctx->sock_mu);
		if (rc == RETRY_LATER) {
			snap_wbuf_free(&w);
			continue;
		}
		snap_wbuf_free(&w);
		if (rc == 0) {
			struct snap_rbuf r;
			snap_rbuf_init(&r, rep, rlen);
			*slot = snap_get_u32(&r);
			free(rep);
			if (r.bad || *slot >= ctx->nmaps || *fd < 0) {
				if (*fd >= 0)
					close(*fd);
				return snap_fail(ctx, SNAP_EPROTO, "%s: malformed ACQUIRE reply", what);
			}
			return 0;
		}
		/* EBUSY: every slot is pinned until other ranks commit; wait.
		 * ESMP: the daemon restarted; nothing was handed out, so
		 * reconnect (HELLO + REGISTER) and ask again. */
		if ((rc != SNAP_EBUSY && rc != SNAP_ESMP) || snap_now_ns() >= deadline)
			return rc;
		struct timespec ts = { 0, (long)delay_us * 1000L };
		nanosleep(&ts, NULL);
	}
}

int snap_save(snap_ctx *ctx, uint64_t step)
{
	return snap_save_on_stream(ctx, step, NULL);
}

int snap_save_on_stream(snap_ctx *ctx, uint64_t step, void *stream)
{
	if (!ctx)
		return SNAP_EINVAL;
	pthread_mutex_lock(&ctx->mu);
	int rc = take_pending(ctx);
	if (!rc && ctx->unfenced)
		rc = snap_fail(ctx, SNAP_EUNFENCED, "save of step %" PRIu64 ": the save of step %" PRIu64
			  " was not fenced; call snap_fence() before modifying registered memory", step, ctx->last_step);
	if (!rc && ctx->have_last_step && step <= ctx->last_step)
		rc = snap_fail(ctx, SNAP_EINVAL, "save of step %" PRIu64 ": steps must increase (last was %" PRIu64 ")", step,
			  ctx->last_step);
	pthread_mutex_unlock(&ctx->mu);
	if (rc || (rc = snap_freeze(ctx)))
		return rc;
	if (ctx->gpu) {
		/* After a stream-ordered fence the previous copy may still run; its
		 * events must have fired before this save records them again. */
		pthread_mutex_lock(&ctx->mu);
		while (ctx->copying)
			pthread_cond_wait(&ctx->cv, &ctx->mu);
		pthread_mutex_unlock(&ctx->mu);
		if ((rc = snap_gpu_save_begin(ctx, stream)))
			return rc;
	}

	uint32_t slot;
	int fd;
	uint64_t epoch;
	if ((rc = acquire(ctx, step, &slot, &fd, &epoch)))
		return rc;
	uint8_t *base = NULL;
	if ((rc = map_slot(ctx, slot, fd, &base)))
		return rc;

	pthread_mutex_lock(&ctx->mu);
	/* Keep at most one commit outstanding: the record we reuse must be free. */
	while (ctx->commits_pending >= 2)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	ctx->cur ^= 1;
	struct save_rec *rec = &ctx->rec[ctx->cur];
	rec->step = step;
	rec->slot = slot;
	rec->epoch = epoch;
	rec->base = base;
	rec->copy_rc = 0;
	ctx->genq = 0;
	ctx->gended = 0;
	ctx->copying = 1;
	ctx->unfenced = 1;
	ctx->commits_pending++;
	ctx->last_step = step;
	ctx->have_last_step = 1;
	pthread_mutex_unlock(&ctx->mu);
	snap_pool_submit(ctx->pool, ctx->layout.ncrc, copy_task, copy_done, ctx);
	return 0;
}

int snap_fence(snap_ctx *ctx)
{
	if (!ctx)
		return SNAP_EINVAL;
	pthread_mutex_lock(&ctx->mu);
	while (ctx->copying)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	ctx->unfenced = 0;
	int rc = take_pending(ctx);
	pthread_mutex_unlock(&ctx->mu);
	return rc;
}

int snap_fence_on_stream(snap_ctx *ctx, void *stream)
{
	if (!ctx)
		return SNAP_EINVAL;
	if (!ctx->gpu)
		return snap_fence(ctx);
	pthread_mutex_lock(&ctx->mu);
	/* Host regions are read by copy threads: only the host can wait for
	 * them. Device regions are read by work on the copy stream: once it is
	 * all enqueued, the trainer's stream can wait for it on the GPU. */
	while (ctx->copying && (ctx->nhost || !ctx->gended || ctx->rec[ctx->cur].copy_rc))
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	int in_flight = ctx->copying;
	ctx->unfenced = 0;
	int rc = take_pending(ctx);
	pthread_mutex_unlock(&ctx->mu);
	return !rc && in_flight ? snap_gpu_fence(ctx, stream) : rc;
}

int snap_wait(snap_ctx *ctx)
{
	if (!ctx)
		return SNAP_EINVAL;
	pthread_mutex_lock(&ctx->mu);
	while (ctx->copying || ctx->commits_pending)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	ctx->unfenced = 0;
	int rc = take_pending(ctx);
	pthread_mutex_unlock(&ctx->mu);
	return rc;
}

/* ---- close --------------------------------------------------------------- */

int snap_close(snap_ctx *ctx)
{
	if (!ctx)
		return 0;
	int rc = 0;
	if (ctx->pool) {
		rc = snap_wait(ctx);
		snap_pool_stop(ctx->pool);
	}
	snap_gpu_close(ctx);   /* unpins the slots: before they are unmapped */
	disconnect(ctx);
	for (unsigned i = 0; ctx->maps && i < ctx->nmaps; i++)
		if (ctx->maps[i].base)
			munmap(ctx->maps[i].base, ctx->maps[i].size);
	free(ctx->maps);
	for (uint32_t i = 0; i < ctx->nregs; i++)
		free((char *)ctx->regs[i].name);
	free(ctx->regs);
	snap_layout_free(&ctx->layout);
	for (int i = 0; i < 2; i++) {
		free(ctx->rec[i].crc);
		free(ctx->rec[i].len);
	}
	pthread_mutex_destroy(&ctx->mu);
	pthread_mutex_destroy(&ctx->sock_mu);
	pthread_mutex_destroy(&ctx->gmu);
	pthread_cond_destroy(&ctx->cv);
	free(ctx);
	return rc;
}
