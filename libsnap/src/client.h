/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * client.h - the trainer-side context, shared by client.c (open,
 * registry, close), conn.c (the socket to snapsmp), save.c
 * (save/fence/commit), restore.c (latest, restore, flush) and the GPU
 * path (gpu.c, gpu_copy.c). Not installed.
 */
#ifndef SNAP_CLIENT_H
#define SNAP_CLIENT_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "snap/buf.h"
#include "snap/proto.h"
#include "snap/manifest.h"
#include "snap/snap.h"
#include "pool.h"
#include "snap/codec.h"

struct snap_gpu;
struct snap_gpu_ops;

#define SNAP_CLIENT_ERRLEN 512
#define SUBBLOCK (256u << 10)   /* copy, then CRC while the block is still in L2 */

struct slot_map {
	uint8_t *base;
	uint64_t size;
	dev_t dev;
	ino_t ino;
	int pinned;             /* registered with the CUDA backend */
};

/* One save in flight: its slot and its chunk checksums. */
struct save_rec {
	uint64_t step;
	uint32_t slot;
	uint64_t epoch;         /* the connection (ctx->epoch) its slot was acquired on */
	uint8_t *base;
	uint32_t *crc;
	uint32_t *len;          /* bytes stored per chunk */
	int copy_rc;            /* first failed chunk's error (codec), under mu */
	char err[SNAP_CLIENT_ERRLEN];
};

struct snap_ctx {
	struct snap_config cfg;
	char err[SNAP_CLIENT_ERRLEN];

	int sock;
	pthread_mutex_t sock_mu;
	uint64_t epoch;         /* connections made so far; written under sock_mu and mu */
	uint64_t gen;           /* the job generation this process belongs to (0: none yet) */

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
	char pending_msg[SNAP_CLIENT_ERRLEN];
	struct save_rec rec[2];
	unsigned cur;
	uint64_t last_step;
	int have_last_step;

	/* restore job */
	const struct snap_manifest *rman;
	const uint8_t *rbase;   /* the slot, mapped; NULL: read it from rfd */
	int rfresh;             /* not the saving process's slot: its buffers may be untouched */
	int rfd;
	uint8_t **rbounce;      /* rfd: one SUBBLOCK per copy thread, a stack */
	unsigned nrbounce;
	int rio;                /* rfd: the first read's errno (under mu) */
	uint32_t rio_chunk;
	int rphase;             /* 0 verify, 1 copy */
	int rinline;            /* phase 1 also verifies; no phase 0 (restore_verify) */
	int rhuge;              /* the store is on huge pages: 1, 0, or -1 not asked yet */
	uint32_t rbad;          /* first bad chunk index + 1 */
	uint32_t rdecode;       /* first chunk index + 1 whose frame failed to decode */
	int rdone;
	int rgpu;               /* a device copy or decode failed: */
	char rgpu_msg[SNAP_CLIENT_ERRLEN];  /* the first one's message */

	/* CUDA regions (gpu.h, gpu_copy.c). The copy threads enqueue device
	 * chunks in order (genq), a window ahead of the chunk each CRCs. */
	const struct snap_gpu_ops *gops;
	struct snap_gpu *gpu;
	int gdev;
	uint32_t nhost;         /* registered host regions */
	pthread_mutex_t gmu;    /* genq, and the enqueue calls' order */
	uint32_t genq;
	int gended;             /* the save's done event is recorded (under mu) */
};

/* conn.c */
/* Set the context message; returns rc. */
int snap_fail(snap_ctx *ctx, int rc, const char *fmt, ...) SNAP_PRINTF(3, 4);
/* Close the socket (a reconnect follows on the next request). */
void snap_disconnect(snap_ctx *ctx);
/* REGISTER of ctx->layout; the caller holds sock_mu. */
int snap_send_layout(snap_ctx *ctx);
/* One request/reply pair; the caller holds sock_mu. See conn.c. */
int snap_roundtrip(snap_ctx *ctx, char *errbuf, uint16_t type, const struct snap_wbuf *req, void **reply,
		   uint32_t *rlen, int *fd_out, const char *what);
/* Connect: HELLO, REGISTER when frozen, retried until timeout_ms; the
 * caller holds sock_mu and has no socket. */
int snap_connect(snap_ctx *ctx);
/* Connect (HELLO, REGISTER when frozen) if not connected; takes sock_mu. */
int snap_ensure_connected(snap_ctx *ctx);
/* client.c: build and register the layout on the first save or restore. */
int snap_freeze(snap_ctx *ctx);
/* save.c: record the first failure of a save's copy (any copy thread). */
void snap_copy_failed(snap_ctx *ctx, struct save_rec *rec, int rc, const char *fmt, ...) SNAP_PRINTF(4, 5);

/* gpu_copy.c: the CUDA side of register, map, save, fence, restore. */
#define SNAP_GPU_AHEAD 16       /* chunks enqueued ahead of the one being CRCed */
int snap_gpu_attach(snap_ctx *ctx, const struct snap_region *r);
int snap_gpu_pin(snap_ctx *ctx, struct slot_map *m);
void snap_gpu_unpin(snap_ctx *ctx, struct slot_map *m);
int snap_gpu_save_begin(snap_ctx *ctx, void *stream);
void snap_gpu_enqueue(snap_ctx *ctx, struct save_rec *rec, uint32_t upto);
int snap_gpu_fence(snap_ctx *ctx, void *stream);
void snap_gpu_chunk(snap_ctx *ctx, struct save_rec *rec, uint32_t t, const struct snap_chunk *c);
int snap_gpu_restore_chunk(snap_ctx *ctx, void *dst, const uint8_t *src, uint64_t stored,
			   const struct snap_chunk *c);
void snap_gpu_close(snap_ctx *ctx);

#endif
