/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The region registry: snap_register* adds a region (with its kind's default
 * codec), and the first save or restore freezes the registry into the slot
 * layout and sends it to snapsmp (REGISTER). Below save.c and restore.c,
 * which freeze; above conn.c. See client.h.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "snap/manifest.h"
#include "client.h"

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
