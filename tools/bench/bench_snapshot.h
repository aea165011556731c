/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_snapshot.h - snapbench snapshot's saves (bench_snapshot.c) and its
 * restore rows (bench_restore.c) share one rank's run. Not an API.
 */
#ifndef SNAP_BENCH_SNAPSHOT_H
#define SNAP_BENCH_SNAPSHOT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "snap/snap.h"

#define MAX_ITERS 64
#define NRES 9   /* per iteration: save blocks, save -> committed, restore, restore by a new context, the same
                   into fresh buffers, the same as the first but verifying every chunk first, read(2) of a
                   file of the same bytes on the store's file system; [7] of iteration 0 only: the job's
                   first save -> committed (a warm-up save, not in the medians); [8] the CPU seconds of
                   the restore into fresh buffers (the rank's process, its copy threads included) */
#define FIRST_SAVE 7
#define CPU_FRESH 8   /* summed over the ranks, not the slowest rank's */

/* What each rank snapshots: its region's codec and its values. */
struct bench_data {
	int codec;
	double bound;
	const float *tile;     /* --input: values tiled over the region; NULL: a ramp */
	size_t ntile;
	int first_after_ms;    /* --first-after: the first save that long after snap_prepare */
};

/*
 * One rank's run: its context, region and the seconds each phase measured
 * (res[NRES * it + column], the columns of NRES). It opens, registers,
 * warms up, then times `iters` save/wait cycles, then the restores. Ranks
 * meet at a barrier before each save, as a training step's allreduce makes
 * them do; without it a fast rank would measure the wait for a slow rank's
 * commit (slot backpressure), not the cost of a save.
 */
struct rank_run {
	const char *store;
	int rank, iters;
	uint64_t bytes;
	pthread_barrier_t *bar;
	const struct bench_data *d;
	struct snap_config cfg;
	snap_ctx *ctx;
	struct snap_region r;
	float *buf;
	double res[NRES * MAX_ITERS];
};

/* The restore rows of one rank, after its saves: columns 2 to 6 and
 * CPU_FRESH of k->res. Each phase meets the other ranks at the barrier
 * even after a failure (rc), so nobody hangs; rc, or the first failure. */
int snapshot_restores(struct rank_run *k, int rc);

/* The ceiling of a restore into fresh buffers: memcpy, 1 thread, into a
 * mapping never touched (a new one each time), so the copy pays every
 * page fault as the restore does. Median wall seconds; *cpu the median
 * CPU seconds of the copy (faults included). */
double snapshot_memcpy_fresh(uint64_t bytes, int iters, double *cpu);

#endif
