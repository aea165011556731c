/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The trainer side of libsnap: open and close. The region registry and the
 * layout frozen at the first save or restore are registry.c's, the
 * connection to snapsmp conn.c's, the save path save.c's, restore and flush
 * restore.c's (calls go that way: client -> save, restore -> registry ->
 * conn, gpu_copy, pool). See
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

/* ---- open ---------------------------------------------------------------- */

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
