/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The CUDA side of the trainer's pipeline: one pipeline with the host path,
 * not a second one. A save's tasks are still chunk t of the layout, run by
 * the same copy threads; for a chunk of a CUDA region the task waits for the
 * chunk's event instead of copying, then takes the CRC32C of the pinned copy
 * as the host path does, so COMMIT and everything downstream (EC, flush,
 * restore, snaptool) cannot tell where the bytes came from.
 *
 * Who enqueues the device work: the copy threads, in chunk order, each
 * making sure the chunks up to SNAP_GPU_AHEAD past its own are on the copy
 * stream before it waits. So snap_save() itself makes two CUDA calls (an
 * event on the trainer's stream and a wait on it), whatever the size, and
 * the DMA engine always has a window of work queued.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "client.h"
#include "gpu.h"

int snap_gpu_attach(snap_ctx *ctx, const struct snap_region *r)
{
	char why[400];
	if (!ctx->gops && !(ctx->gops = snap_gpu_load(why, sizeof(why))))
		return snap_fail(ctx, SNAP_EUNSUPPORTED, "register \"%s\": a CUDA region needs the CUDA backend: %s",
				 r->name, why);
	int dev = -1;
	int rc = ctx->gops->probe(r->ptr, r->bytes, &dev, why, sizeof(why));
	if (rc)
		return snap_fail(ctx, rc, "register \"%s\": SNAP_DEVICE_CUDA region: %s", r->name, why);
	if (ctx->gpu && dev != ctx->gdev)
		return snap_fail(ctx, SNAP_EINVAL, "register \"%s\": on CUDA device %d, but this context's CUDA "
				 "regions are on device %d (one device per rank)", r->name, dev, ctx->gdev);
	if (!ctx->gpu) {
		if ((rc = ctx->gops->open(&ctx->gpu, dev, why, sizeof(why)))) {
			ctx->gops->close(ctx->gpu);
			ctx->gpu = NULL;
			return snap_fail(ctx, rc, "register \"%s\": CUDA device %d: %s", r->name, dev, why);
		}
		ctx->gdev = dev;
	}
	return 0;
}

int snap_gpu_pin(snap_ctx *ctx, struct slot_map *m)
{
	char why[400];
	if (!ctx->gpu || m->pinned)
		return 0;
	int rc = ctx->gops->pin(ctx->gpu, m->base, m->size, why, sizeof(why));
	if (rc)
		return snap_fail(ctx, rc, "pinning a slot for the GPU copy: %s", why);
	m->pinned = 1;
	return 0;
}

void snap_gpu_unpin(snap_ctx *ctx, struct slot_map *m)
{
	if (m->pinned)
		ctx->gops->unpin(ctx->gpu, m->base, m->size);
	m->pinned = 0;
}

int snap_gpu_save_begin(snap_ctx *ctx, void *stream)
{
	char why[400];
	int rc = ctx->gops->save_begin(ctx->gpu, stream, ctx->layout.ncrc, why, sizeof(why));
	return rc ? snap_fail(ctx, rc, "save: ordering the copy after the trainer's stream: %s", why) : 0;
}

static void enqueue_one(snap_ctx *ctx, struct save_rec *rec, uint32_t i)
{
	struct snap_chunk c;
	snap_layout_chunk(&ctx->layout, i, &c);
	const struct snap_region *reg = &ctx->regs[c.g - ctx->layout.regions];
	if (reg->device != SNAP_DEVICE_CUDA)
		return;
	char why[400];
	const uint8_t *src = (const uint8_t *)reg->ptr + c.raw_off;
	int rc;
	if (c.g->codec == SNAP_CODEC_NONE) {
		rc = ctx->gops->copy(ctx->gpu, i, rec->base + c.slot_off, src, c.raw_len, why, sizeof(why));
	} else {
		struct snap_codec_params p = { .codec = c.g->codec, .dtype = c.g->dtype, .bound = c.g->bound };
		rc = ctx->gops->compress(ctx->gpu, i, &p, src, c.raw_len / snap_dtype_size(c.g->dtype),
					 rec->base + c.slot_off, c.cap, why, sizeof(why));
	}
	if (rc)
		snap_copy_failed(ctx, rec, rc, "save of step %" PRIu64 ": region \"%s\" chunk %u: %s", rec->step,
				 c.g->name, c.index, why);
}

void snap_gpu_enqueue(snap_ctx *ctx, struct save_rec *rec, uint32_t upto)
{
	uint32_t n = ctx->layout.ncrc;
	if (upto >= n)
		upto = n - 1;
	pthread_mutex_lock(&ctx->gmu);
	if (ctx->genq > upto) {         /* the common case: already queued */
		pthread_mutex_unlock(&ctx->gmu);
		return;
	}
	while (ctx->genq <= upto)
		enqueue_one(ctx, rec, ctx->genq++);
	if (ctx->genq == n) {           /* this call queued the last chunk */
		char why[400];
		int rc = ctx->gops->save_end(ctx->gpu, why, sizeof(why));
		if (rc)
			snap_copy_failed(ctx, rec, rc, "save of step %" PRIu64 ": %s", rec->step, why);
		pthread_mutex_lock(&ctx->mu);
		ctx->gended = 1;
		pthread_cond_broadcast(&ctx->cv);
		pthread_mutex_unlock(&ctx->mu);
	}
	pthread_mutex_unlock(&ctx->gmu);
}

int snap_gpu_fence(snap_ctx *ctx, void *stream)
{
	char why[400];
	int rc = ctx->gops->fence(ctx->gpu, stream, 0, why, sizeof(why));
	return rc ? snap_fail(ctx, rc, "fence: %s", why) : 0;
}

void snap_gpu_chunk(snap_ctx *ctx, struct save_rec *rec, uint32_t t, const struct snap_chunk *c)
{
	char why[400];
	uint64_t n = c->raw_len;
	int rc = ctx->gops->wait(ctx->gpu, t, why, sizeof(why));
	if (rc) {
		snap_copy_failed(ctx, rec, rc, "save of step %" PRIu64 ": region \"%s\" chunk %u: %s", rec->step,
				 c->g->name, c->index, why);
		n = 0;
	} else if (c->g->codec != SNAP_CODEC_NONE) {
		n = ctx->gops->frame_len(ctx->gpu, t);
		if (n > c->cap) {
			snap_copy_failed(ctx, rec, SNAP_EPROTO, "save of step %" PRIu64 ": region \"%s\" chunk %u: "
					 "the GPU compressor reports %" PRIu64 " bytes for a %" PRIu64 "-byte area",
					 rec->step, c->g->name, c->index, n, c->cap);
			n = 0;
		}
	}
	rec->len[t] = (uint32_t)n;
	rec->crc[t] = snap_crc32c(rec->base + c->slot_off, n);
}

int snap_gpu_restore_chunk(snap_ctx *ctx, void *dst, const uint8_t *src, uint64_t stored,
			   const struct snap_chunk *c)
{
	char why[400];
	int rc = c->g->codec == SNAP_CODEC_NONE
			 ? ctx->gops->h2d(ctx->gpu, dst, src, c->raw_len, why, sizeof(why))
			 : ctx->gops->decode(ctx->gpu, src, stored, dst, c->raw_len, why, sizeof(why));
	if (rc) {
		pthread_mutex_lock(&ctx->mu);
		if (!ctx->rgpu) {
			ctx->rgpu = rc;
			snap_fmt(ctx->rgpu_msg, SNAP_CLIENT_ERRLEN, "region \"%s\" chunk %u: %s", c->g->name, c->index, why);
		}
		pthread_mutex_unlock(&ctx->mu);
	}
	return rc;
}

void snap_gpu_close(snap_ctx *ctx)
{
	if (!ctx->gpu)
		return;
	for (unsigned i = 0; ctx->maps && i < ctx->nmaps; i++)
		snap_gpu_unpin(ctx, &ctx->maps[i]);
	ctx->gops->close(ctx->gpu);
	ctx->gpu = NULL;
}

int snap_pinned(snap_ctx *ctx, uint64_t *bytes)
{
	if (!ctx || !bytes)
		return SNAP_EINVAL;
	*bytes = ctx->gpu ? ctx->gops->pinned_bytes(ctx->gpu) : 0;
	return 0;
}
