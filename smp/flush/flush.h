/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * flush.h - snapsmp's background flush: one thread that writes restorable
 * steps to HDF5 (io/) while the daemon keeps serving trainers.
 *
 * The daemon owns the store; the flush thread never touches it. For each
 * flush the daemon (or the mesh thread, under the mesh lock) builds a
 * request with flush_req_build, which pins the step's slots (refs, so retention cannot recycle
 * them), hands over a self-contained request (slot file paths and manifest
 * copies), and unpins when the result comes back through the notification
 * descriptor. Each region's CRC32C is derived from the manifest's chunk CRCs
 * (no extra pass) and the writer checks the bytes against it as it writes
 * them, so a bit flip in the store is never persisted. Then the thread seals
 * the step (persisted) and applies retention.
 */
#ifndef SNAP_FLUSH_H
#define SNAP_FLUSH_H

#include <stdint.h>

#include "snap/smp_config.h"
#include "snap/manifest.h"
#include "snap/store.h"

struct flush_rank {
	uint32_t slot;
	char path[SNAP_FILE_MAX];
	struct snap_manifest man;
};

struct flush_req {
	char job[SNAP_JOB_MAX + 1];
	uint64_t step;
	uint32_t world;
	uint32_t nranks;                   /* entries in ranks: every rank of the world, or in a
	                                      mesh (node_only) the ranks this node holds */
	int node_only;                     /* mesh: write these ranks' files only; node 0 seals the
	                                      step once every node has written its part ... */
	char part_dir[SNAP_PATH_MAX];      /* ... or, with per-node flush directories, this node's
	                                      directory: the thread withdraws its earlier part of the
	                                      step, writes the ranks (maybe none) and seals them there */
	uint64_t try_no;                   /* mesh: store_job.mfl_try when it was queued */
	int withdrawn;                     /* result: an earlier part of the step was withdrawn */
	struct flush_rank *ranks;          /* nranks entries */
	/* result, filled by the thread */
	int rc;
	char err[640];
	uint64_t bytes;
	uint32_t direct;                   /* rank files whose bulk bytes went with O_DIRECT */
	double seconds;
	struct flush_req *next;
};

struct snap_flusher;

/* Start the thread. flush_dir must be set in cfg. */
int snap_flusher_start(struct snap_flusher **fp, const struct snap_smp_config *cfg, char *err, size_t errlen);

/* Queue a request (takes ownership). */
void snap_flusher_submit(struct snap_flusher *f, struct flush_req *req);

/* Readable when finished requests are waiting; drain it with snap_flusher_done. */
int snap_flusher_fd(const struct snap_flusher *f);

/* Pop one finished request, or NULL. The caller unpins and frees it. */
struct flush_req *snap_flusher_done(struct snap_flusher *f);

void snap_flush_req_free(struct flush_req *req);

/*
 * [store owner's thread, or the mesh lock held] A self-contained request for
 * step `step` of job j, its slots pinned (refs). Every rank of the step's
 * world must hold the step here (SNAP_ENOENT naming the first that does
 * not) unless node_only, which takes the ranks this node holds (maybe none:
 * then *out has nranks 0 and world 0).
 */
int flush_req_build(struct snap_store *s, struct store_job *j, uint64_t step, int node_only, struct flush_req **out,
		    char *err, size_t errlen);
/* Drop the pins flush_req_build took (before snap_flush_req_free). */
void flush_req_unpin(struct snap_store *s, const struct flush_req *q);

/* Finish the queue, stop and join the thread. NULL is a no-op. */
void snap_flusher_stop(struct snap_flusher *f);

#endif
