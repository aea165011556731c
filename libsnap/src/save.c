/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The save path: a slot acquired from snapsmp and mapped once per slot
 * file, the chunk copies (and codec compression) on the copy pool's
 * threads, the COMMIT round trip from the thread that finishes the last
 * chunk, then fence and wait. A commit that outlives its connection is
 * resent on the next one or failed, never lost (recommit).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/proto.h"
#include "snap/manifest.h"
#include "pool.h"
#include "snap/wire.h"

#include "client.h"

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
		int rc = ctx->sock >= 0 ? 0 : snap_connect(ctx);
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
	/* What this process holds pinned for its GPU regions, so snaptool
	 * status can show it beside the budget it lies within. */
	uint64_t pinned = 0;
	snap_pinned(ctx, &pinned);
	snap_put_u64(&w, pinned);
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
		snap_disconnect(ctx);
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
