/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The trainer side of libsnap: open, the region registry, the layout frozen
 * at the first save or restore, and close. The connection to snapsmp is
 * conn.c, the save path save.c, restore and flush restore.c. See
 * snap/snap.h for the contract and docs/design/snapshot-path.md for the protocol.
 *
 * Concurrency: the caller's thread runs the API; the copy pool's threads run
 * chunk copies and, on the thread that finishes the last chunk, the commit
 * round trip. `mu` guards the save state below, `sock_mu` serialises request
 * and reply pairs on the socket (the API thread may ACQUIRE the next slot
 * while a worker still COMMITs the previous step).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/proto.h"
#include "snap/manifest.h"
#include "pool.h"
#include "snap/wire.h"

#include "client.h"

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
	ctx->rhuge = -1;
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
	rc = snap_send_layout(ctx);
	pthread_mutex_unlock(&ctx->sock_mu);
	if (rc)
		return rc;
	ctx->frozen = 1;
	return 0;
}

int snap_prepare(snap_ctx *ctx)
{
	return ctx ? snap_freeze(ctx) : SNAP_EINVAL;
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
	snap_disconnect(ctx);
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
