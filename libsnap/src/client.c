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

#include "buf.h"
#include "internal.h"
#include "manifest.h"
#include "pool.h"
#include "wire.h"

#define ERRLEN 512
#define SUBBLOCK (256u << 10)   /* copy, then CRC while the block is still in L2 */

struct slot_map {
	uint8_t *base;
	uint64_t size;
	dev_t dev;
	ino_t ino;
};

/* One save in flight: its slot and its chunk checksums. */
struct save_rec {
	uint64_t step;
	uint32_t slot;
	uint8_t *base;
	uint32_t *crc;
	int status;
	char err[ERRLEN];
};

struct snap_ctx {
	struct snap_config cfg;
	char err[ERRLEN];

	int sock;
	pthread_mutex_t sock_mu;

	struct snap_region *regs;
	uint32_t nregs, capregs;
	struct snap_layout layout;
	int frozen;

	struct slot_map *maps;
	unsigned nmaps;
	struct snap_pool *pool;

	pthread_mutex_t mu;
	pthread_cond_t cv;
	int copying;            /* the current save's copy is running */
	int unfenced;           /* a save was started and not fenced */
	unsigned commits_pending;
	uint64_t commits_started, commits_done;  /* order commits by step */
	int pending_err;        /* a commit failed and nobody has been told */
	char pending_msg[ERRLEN];
	struct save_rec rec[2];
	unsigned cur;
	uint64_t last_step;
	int have_last_step;
	int last_status;

	/* restore job */
	const struct snap_manifest *rman;
	const uint8_t *rbase;
	int rphase;             /* 0 verify, 1 copy */
	uint32_t rbad;          /* first bad CRC index + 1 */
	int rdone;
};

static int fail(snap_ctx *ctx, int rc, const char *fmt, ...) SNAP_PRINTF(3, 4);

static int fail(snap_ctx *ctx, int rc, const char *fmt, ...)
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
static int roundtrip(snap_ctx *ctx, char *errbuf, uint16_t type, const struct snap_wbuf *req,
		     void **reply, uint32_t *rlen, int *fd_out, const char *what)
{
	struct snap_msg_hdr h;
	*reply = NULL;
	if (ctx->sock < 0) {
		snap_fmt(errbuf, ERRLEN, "%s: not connected to snapsmp at %s", what, ctx->cfg.socket);
		return SNAP_ESMP;
	}
	int rc = snap_wire_send(ctx->sock, type, 0, req ? req->p : NULL, req ? (uint32_t)req->len : 0, -1);
	if (!rc)
		rc = snap_wire_recv(ctx->sock, &h, reply, fd_out, -1);
	if (rc) {
		disconnect(ctx);
		snap_fmt(errbuf, ERRLEN, "%s: lost connection to snapsmp at %s (%s)", what, ctx->cfg.socket,
			 snap_strerror(rc));
		return SNAP_ESMP;
	}
	if (h.type != (type | SNAP_MSG_REPLY)) {
		disconnect(ctx);
		free(*reply);
		*reply = NULL;
		snap_fmt(errbuf, ERRLEN, "%s: snapsmp sent an unexpected reply type %u", what, h.type);
		return SNAP_EPROTO;
	}
	if (h.status < 0) {
		int n = (int)(h.len < 400 ? h.len : 400);
		snap_fmt(errbuf, ERRLEN, "%s: %.*s", what, n, *reply ? (const char *)*reply : "");
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
		return fail(ctx, SNAP_ENOMEM, "register: out of memory");
	void *rep;
	uint32_t rlen;
	int rc = roundtrip(ctx, ctx->err, SNAP_MSG_REGISTER, &w, &rep, &rlen, NULL, "register");
	free(rep);
	snap_wbuf_free(&w);
	return rc;
}

/* The daemon decides how many slots a rank has: size the mapping cache to it. */
static int fit_slots(snap_ctx *ctx, const void *rep, uint32_t rlen)
{
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, rlen);
	uint32_t n = snap_get_u32(&r);
	if (r.bad || n < 2 || n > 64)
		return fail(ctx, SNAP_EPROTO, "hello: snapsmp announced %u slots per rank", n);
	if (n <= ctx->nmaps)
		return 0;
	struct slot_map *m = realloc(ctx->maps, n * sizeof(*m));
	if (!m)
		return fail(ctx, SNAP_ENOMEM, "out of memory");
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
			return fail(ctx, SNAP_EIO, "socket: %s", strerror(errno));
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		if (strlen(ctx->cfg.socket) >= sizeof(a.sun_path)) {
			close(s);
			return fail(ctx, SNAP_EINVAL, "socket path %s is too long", ctx->cfg.socket);
		}
		strcpy(a.sun_path, ctx->cfg.socket);
		if (connect(s, (struct sockaddr *)&a, sizeof(a)) == 0) {
			ctx->sock = s;
			struct snap_wbuf w = { 0 };
			snap_put_str(&w, ctx->cfg.job);
			snap_put_u32(&w, (uint32_t)ctx->cfg.rank);
			snap_put_u32(&w, (uint32_t)ctx->cfg.world_size);
			snap_put_u32(&w, (uint32_t)getpid());
			void *rep;
			uint32_t rlen;
			rc = roundtrip(ctx, ctx->err, SNAP_MSG_HELLO, &w, &rep, &rlen, NULL, "hello");
			snap_wbuf_free(&w);
			if (rc == 0)
				rc = fit_slots(ctx, rep, rlen);
			free(rep);
			if (rc == 0 && ctx->frozen)
				rc = do_register(ctx);
			if (rc == 0)
				return 0;
			disconnect(ctx);
			if (rc != SNAP_EBUSY)
				return rc;
		} else {
			rc = fail(ctx, SNAP_ESMP, "cannot connect to snapsmp at %s: %s (is snapsmp running for store %s?)",
				  ctx->cfg.socket, strerror(errno), ctx->cfg.store);
			close(s);
		}
		if (snap_now_ns() >= deadline)
			return rc;
		struct timespec ts = { 0, (long)delay_ms * 1000000L };
		nanosleep(&ts, NULL);
	}
}

static int ensure_connected(snap_ctx *ctx)
{
	pthread_mutex_lock(&ctx->sock_mu);
	int rc = ctx->sock >= 0 ? 0 : connect_smp(ctx);
	pthread_mutex_unlock(&ctx->sock_mu);
	return rc;
}

/* ---- open / register ----------------------------------------------------- */

int snap_open(const struct snap_config *cfg, snap_ctx **ctxp)
{
	*ctxp = NULL;
	snap_ctx *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return SNAP_ENOMEM;
	*ctxp = ctx;
	ctx->sock = -1;
	pthread_mutex_init(&ctx->mu, NULL);
	pthread_mutex_init(&ctx->sock_mu, NULL);
	pthread_cond_init(&ctx->cv, NULL);
	if (cfg)
		ctx->cfg = *cfg;
	else
		snap_config_init(&ctx->cfg);
	int rc = snap_config_check(&ctx->cfg, ctx->err, sizeof(ctx->err));
	if (rc)
		return rc;
	ctx->nmaps = ctx->cfg.slots;
	ctx->maps = calloc(ctx->nmaps, sizeof(*ctx->maps));
	if (!ctx->maps)
		return fail(ctx, SNAP_ENOMEM, "out of memory");
	if ((rc = snap_pool_start(&ctx->pool, ctx->cfg.copy_threads)))
		return fail(ctx, rc, "cannot start %u copy threads", ctx->cfg.copy_threads);
	return ensure_connected(ctx);
}

int snap_register(snap_ctx *ctx, const struct snap_region *r)
{
	if (!ctx || !r)
		return SNAP_EINVAL;
	if (ctx->frozen)
		return fail(ctx, SNAP_ESTATE, "register \"%s\": the layout is frozen after the first save or restore",
			    r->name ? r->name : "(null)");
	if (r->device != SNAP_DEVICE_HOST)
		return fail(ctx, SNAP_EUNSUPPORTED, "register \"%s\": only host memory is supported in this build",
			    r->name ? r->name : "(null)");
	if (r->codec != SNAP_CODEC_NONE)
		return fail(ctx, SNAP_EUNSUPPORTED, "register \"%s\": codecs are not yet wired into the snapshot path",
			    r->name ? r->name : "(null)");
	if (!r->ptr && r->bytes)
		return fail(ctx, SNAP_EINVAL, "register \"%s\": NULL pointer", r->name ? r->name : "(null)");
	if (ctx->nregs == ctx->capregs) {
		uint32_t cap = ctx->capregs ? ctx->capregs * 2 : 16;
		struct snap_region *p = realloc(ctx->regs, cap * sizeof(*p));
		if (!p)
			return fail(ctx, SNAP_ENOMEM, "out of memory");
		ctx->regs = p;
		ctx->capregs = cap;
	}
	/* Validate now, with the region alone, so the error names it at once. */
	struct snap_layout one;
	int rc = snap_layout_build(&one, r, 1, ctx->cfg.chunk_size, ctx->err, sizeof(ctx->err));
	if (rc)
		return rc;
	snap_layout_free(&one);
	for (uint32_t i = 0; i < ctx->nregs; i++)
		if (strcmp(ctx->regs[i].name, r->name) == 0)
			return fail(ctx, SNAP_EINVAL, "register \"%s\": a region of that name is already registered", r->name);
	struct snap_region *d = &ctx->regs[ctx->nregs];
	*d = *r;
	d->name = strdup(r->name);
	if (!d->name)
		return fail(ctx, SNAP_ENOMEM, "out of memory");
	ctx->nregs++;
	return 0;
}

static int freeze(snap_ctx *ctx)
{
	if (ctx->frozen)
		return 0;
	if (ctx->nregs == 0)
		return fail(ctx, SNAP_ESTATE, "no region is registered");
	int rc = snap_layout_build(&ctx->layout, ctx->regs, ctx->nregs, ctx->cfg.chunk_size, ctx->err,
				   sizeof(ctx->err));
	if (rc)
		return rc;
	for (int i = 0; i < 2; i++) {
		ctx->rec[i].crc = calloc(ctx->layout.ncrc ? ctx->layout.ncrc : 1, sizeof(uint32_t));
		if (!ctx->rec[i].crc)
			return fail(ctx, SNAP_ENOMEM, "out of memory");
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
		return fail(ctx, SNAP_EPROTO, "slot %u from snapsmp is smaller than the layout (%" PRIu64 " bytes)", slot,
			    ctx->layout.slot_bytes);
	}
	if (m->base && m->dev == st.st_dev && m->ino == st.st_ino && m->size == (uint64_t)st.st_size) {
		close(fd);
		*base = m->base;
		return 0;
	}
	if (m->base)
		munmap(m->base, m->size);
	m->base = NULL;
	int flags = MAP_SHARED | (ctx->cfg.populate ? MAP_POPULATE : 0);
	void *p = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, flags, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return fail(ctx, SNAP_EIO, "mmap of slot %u (%" PRIu64 " bytes): %s", slot, (uint64_t)st.st_size,
			    strerror(errno));
	m->base = p;
	m->size = (uint64_t)st.st_size;
	m->dev = st.st_dev;
	m->ino = st.st_ino;
	*base = p;
	return 0;
}

static void copy_task(void *arg, uint32_t t)
{
	snap_ctx *ctx = arg;
	struct save_rec *rec = &ctx->rec[ctx->cur];
	/* Task t is chunk t of the whole layout; regions are in registration order. */
	uint64_t slot_off, n;
	const struct snap_man_region *g = snap_layout_chunk(&ctx->layout, t, &slot_off, &n);
	const uint8_t *src = (const uint8_t *)ctx->regs[g - ctx->layout.regions].ptr + (slot_off - g->offset);
	uint8_t *dst = rec->base + slot_off;
	uint32_t crc = 0;
	for (uint64_t done = 0; done < n; done += SUBBLOCK) {
		size_t k = n - done < SUBBLOCK ? (size_t)(n - done) : SUBBLOCK;
		memcpy(dst + done, src + done, k);
		crc = snap_crc32c_update(crc, dst + done, k);
	}
	rec->crc[t] = crc;
}

static int send_commit(snap_ctx *ctx, struct save_rec *rec)
{
	struct snap_wbuf w = { 0 };
	snap_put_u32(&w, rec->slot);
	snap_put_u64(&w, rec->step);
	snap_put_u32(&w, ctx->layout.ncrc);
	for (uint32_t i = 0; i < ctx->layout.ncrc; i++)
		snap_put_u32(&w, rec->crc[i]);
	if (w.oom) {
		snap_fmt(rec->err, ERRLEN, "commit of step %" PRIu64 ": out of memory", rec->step);
		return SNAP_ENOMEM;
	}
	char what[64];
	snprintf(what, sizeof(what), "commit of step %" PRIu64, rec->step);
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	int rc = roundtrip(ctx, rec->err, SNAP_MSG_COMMIT, &w, &rep, &rlen, NULL, what);
	pthread_mutex_unlock(&ctx->sock_mu);
	free(rep);
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

	rec->err[0] = '\0';
	int rc = send_commit(ctx, rec);

	pthread_mutex_lock(&ctx->mu);
	rec->status = rc;
	ctx->last_status = rc;
	if (rc) {
		ctx->pending_err = rc;
		memcpy(ctx->pending_msg, rec->err, ERRLEN);
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
		memcpy(ctx->err, ctx->pending_msg, ERRLEN);
		ctx->pending_err = 0;
	}
	return rc;
}

static int acquire(snap_ctx *ctx, uint64_t step, uint32_t *slot, int *fd)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	char what[64];
	snprintf(what, sizeof(what), "save of step %" PRIu64, step);
	for (unsigned delay_us = 50;; delay_us = delay_us < 20000 ? delay_us * 2 : 20000) {
		int rc = ensure_connected(ctx);
		if (rc)
			return rc;
		struct snap_wbuf w = { 0 };
		snap_put_u64(&w, step);
		void *rep;
		uint32_t rlen = 0;
		pthread_mutex_lock(&ctx->sock_mu);
		rc = roundtrip(ctx, ctx->err, SNAP_MSG_ACQUIRE, &w, &rep, &rlen, fd, what);
		pthread_mutex_unlock(&ctx->sock_mu);
		snap_wbuf_free(&w);
		if (rc == 0) {
			struct snap_rbuf r;
			snap_rbuf_init(&r, rep, rlen);
			*slot = snap_get_u32(&r);
			free(rep);
			if (r.bad || *slot >= ctx->nmaps || *fd < 0) {
				if (*fd >= 0)
					close(*fd);
				return fail(ctx, SNAP_EPROTO, "%s: malformed ACQUIRE reply", what);
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
	if (!ctx)
		return SNAP_EINVAL;
	pthread_mutex_lock(&ctx->mu);
	int rc = take_pending(ctx);
	if (!rc && ctx->unfenced)
		rc = fail(ctx, SNAP_EUNFENCED, "save of step %" PRIu64 ": the save of step %" PRIu64
			  " was not fenced; call snap_fence() before modifying registered memory", step, ctx->last_step);
	if (!rc && ctx->have_last_step && step <= ctx->last_step)
		rc = fail(ctx, SNAP_EINVAL, "save of step %" PRIu64 ": steps must increase (last was %" PRIu64 ")", step,
			  ctx->last_step);
	/* Keep at most one commit outstanding: its record must not be reused. */
	while (!rc && ctx->commits_pending >= 2)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	pthread_mutex_unlock(&ctx->mu);
	if (rc || (rc = freeze(ctx)))
		return rc;

	uint32_t slot;
	int fd;
	if ((rc = acquire(ctx, step, &slot, &fd)))
		return rc;
	uint8_t *base = NULL;
	if ((rc = map_slot(ctx, slot, fd, &base)))
		return rc;

	pthread_mutex_lock(&ctx->mu);
	while (ctx->commits_pending >= 2)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	ctx->cur ^= 1;
	struct save_rec *rec = &ctx->rec[ctx->cur];
	rec->step = step;
	rec->slot = slot;
	rec->base = base;
	rec->status = 0;
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

/* ---- latest / restore ---------------------------------------------------- */

int snap_latest(snap_ctx *ctx, uint64_t *step)
{
	if (!ctx || !step)
		return SNAP_EINVAL;
	int rc = ensure_connected(ctx);
	if (rc)
		return rc;
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	rc = roundtrip(ctx, ctx->err, SNAP_MSG_LATEST, NULL, &rep, &rlen, NULL, "latest");
	pthread_mutex_unlock(&ctx->sock_mu);
	if (rc)
		return rc;
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, rlen);
	*step = snap_get_u64(&r);
	free(rep);
	return r.bad ? fail(ctx, SNAP_EPROTO, "latest: malformed reply") : 0;
}

static void restore_task(void *arg, uint32_t t)
{
	snap_ctx *ctx = arg;
	uint64_t slot_off, n;
	const struct snap_man_region *g = snap_layout_chunk(&ctx->rman->layout, t, &slot_off, &n);
	uint64_t off = slot_off - g->offset;
	const uint8_t *src = ctx->rbase + slot_off;
	if (ctx->rphase == 0) {
		if (snap_crc32c(src, n) != ctx->rman->crc[t]) {
			pthread_mutex_lock(&ctx->mu);
			if (!ctx->rbad || t + 1 < ctx->rbad)
				ctx->rbad = t + 1;
			pthread_mutex_unlock(&ctx->mu);
		}
		return;
	}
	/* Copy into the registered region of the same name. */
	for (uint32_t i = 0; i < ctx->nregs; i++) {
		if (strcmp(ctx->regs[i].name, g->name) == 0) {
			memcpy((uint8_t *)ctx->regs[i].ptr + off, src, n);
			return;
		}
	}
}

static void restore_done(void *arg)
{
	snap_ctx *ctx = arg;
	pthread_mutex_lock(&ctx->mu);
	ctx->rdone = 1;
	pthread_cond_broadcast(&ctx->cv);
	pthread_mutex_unlock(&ctx->mu);
}

static void run_restore_phase(snap_ctx *ctx, int phase)
{
	ctx->rphase = phase;
	ctx->rdone = 0;
	snap_pool_submit(ctx->pool, ctx->rman->layout.ncrc, restore_task, restore_done, ctx);
	pthread_mutex_lock(&ctx->mu);
	while (!ctx->rdone)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	pthread_mutex_unlock(&ctx->mu);
}

int snap_restore(snap_ctx *ctx, uint64_t step, uint64_t *restored)
{
	if (!ctx)
		return SNAP_EINVAL;
	int rc = snap_wait(ctx);
	if (rc)
		return rc;
	if ((rc = freeze(ctx)) || (rc = ensure_connected(ctx)))
		return rc;

	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, step);
	void *rep;
	uint32_t rlen;
	int fd = -1;
	pthread_mutex_lock(&ctx->sock_mu);
	rc = roundtrip(ctx, ctx->err, SNAP_MSG_RESTORE, &w, &rep, &rlen, &fd, "restore");
	pthread_mutex_unlock(&ctx->sock_mu);
	snap_wbuf_free(&w);
	if (rc)
		return rc;
	struct snap_manifest man;
	char merr[256];
	rc = snap_manifest_decode(rep, rlen, &man, merr, sizeof(merr));
	free(rep);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return fail(ctx, rc, "restore: manifest from snapsmp is invalid: %s", merr);
	}
	char where[160];
	snprintf(where, sizeof(where), "restore of step %" PRIu64 " (job %s, rank %u)", man.step, man.job, man.rank);
	struct stat st;
	uint8_t *base = MAP_FAILED;
	if (fd < 0) {
		rc = fail(ctx, SNAP_EPROTO, "%s: snapsmp passed no slot file", where);
	} else if (strcmp(man.job, ctx->cfg.job) != 0 || man.rank != (uint32_t)ctx->cfg.rank) {
		rc = fail(ctx, SNAP_EPROTO, "%s: snapsmp sent the snapshot of another job or rank", where);
	} else if ((rc = snap_layout_compare(&man.layout, &ctx->layout, merr, sizeof(merr)))) {
		fail(ctx, rc, "%s: %s", where, merr);
	} else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < man.layout.slot_bytes) {
		rc = fail(ctx, SNAP_ECORRUPT, "%s: slot file %u is truncated (%" PRIu64 " of %" PRIu64 " bytes)", where,
			  man.slot, (uint64_t)st.st_size, man.layout.slot_bytes);
	} else if (man.layout.slot_bytes &&
		   (base = mmap(NULL, man.layout.slot_bytes, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		rc = fail(ctx, SNAP_EIO, "%s: mmap: %s", where, strerror(errno));
	}
	if (fd >= 0)
		close(fd);
	if (!rc) {
		ctx->rman = &man;
		ctx->rbase = base;
		ctx->rbad = 0;
		run_restore_phase(ctx, 0);
		if (ctx->rbad) {
			uint32_t t = ctx->rbad - 1;
			uint64_t slot_off, len;
			const struct snap_man_region *g = snap_layout_chunk(&man.layout, t, &slot_off, &len);
			rc = fail(ctx, SNAP_ECORRUPT, "%s: region \"%s\" chunk %u (bytes %" PRIu64 "+%" PRIu64
				  ") fails its CRC32C check in slot %u; registered memory left untouched", where, g->name,
				  t - g->first_crc, slot_off - g->offset, len, man.slot);
		} else {
			run_restore_phase(ctx, 1);
			if (restored)
				*restored = man.step;
			/* The next save continues from here (see the timeline rule in slots.c). */
			ctx->last_step = man.step;
			ctx->have_last_step = 1;
		}
		ctx->rman = NULL;
	}
	if (base != MAP_FAILED)
		munmap(base, man.layout.slot_bytes);
	snap_manifest_free(&man);
	return rc;
}

int snap_flush(snap_ctx *ctx, uint64_t step, int wait)
{
	if (!ctx)
		return SNAP_EINVAL;
	int rc = ensure_connected(ctx);
	if (rc)
		return rc;
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, ctx->cfg.job);
	snap_put_u64(&w, step);
	snap_put_u8(&w, wait ? 1 : 0);
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	rc = roundtrip(ctx, ctx->err, SNAP_MSG_FLUSH, &w, &rep, &rlen, NULL, "flush");
	pthread_mutex_unlock(&ctx->sock_mu);
	snap_wbuf_free(&w);
	free(rep);
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
	disconnect(ctx);
	for (unsigned i = 0; ctx->maps && i < ctx->nmaps; i++)
		if (ctx->maps[i].base)
			munmap(ctx->maps[i].base, ctx->maps[i].size);
	free(ctx->maps);
	for (uint32_t i = 0; i < ctx->nregs; i++)
		free((char *)ctx->regs[i].name);
	free(ctx->regs);
	snap_layout_free(&ctx->layout);
	free(ctx->rec[0].crc);
	free(ctx->rec[1].crc);
	pthread_mutex_destroy(&ctx->mu);
	pthread_mutex_destroy(&ctx->sock_mu);
	pthread_cond_destroy(&ctx->cv);
	free(ctx);
	return rc;
}
