/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mesh.h - snapsmp as one rank of an MPI mesh of node daemons (--ec K+M).
 *
 * Without --ec none of this runs and snapsmp never calls MPI. With it:
 *   - every mesh rank is a node with its own store root and socket ("%n" in
 *     --store / --socket is replaced by the mesh rank);
 *   - a mesh thread agrees with the other nodes, every period, which steps
 *     are globally complete (committed by every rank of the job, whichever
 *     node hosts it) and publishes the newest one as the store's restorable
 *     step (store->mesh, job->mesh_latest: LATEST, RESTORE and retention);
 *   - it erasure-codes the newest globally complete step across each group
 *     (protect.c) and agrees when every group has its parity in place;
 *   - at start it rebuilds lost or corrupt stores from the survivors
 *     (recover.c): a node that lost data before it serves, the others on
 *     the mesh thread while they serve.
 *
 * Concurrency: one mutex (snap_mesh_lock) guards the store. The poll thread
 * holds it while it handles events; the mesh thread takes it only to read
 * the store's committed steps and to pin/unpin slots (refs), never across an
 * MPI call or the encode, so commits never wait for the erasure coding.
 * All MPI calls after start are made by the mesh thread alone
 * (MPI_THREAD_SERIALIZED: main thread before start and after stop).
 */
#ifndef SNAP_MESH_H
#define SNAP_MESH_H

#include <stddef.h>
#include <stdint.h>

#include "snap/meshfiles.h" /* snap_mesh_expand */
#include "snap/store.h"

struct snap_mesh;

/* "K+M" (e.g. "4+2") -> k, m; SNAP_EINVAL with a message otherwise. */
int snap_mesh_parse_ec(const char *s, int *k, int *m, char *err, size_t errlen);

/*
 * MPI_Init, then form the groups (snap_ec_comm_split). On a refused shape
 * every rank returns SNAP_EINVAL with the same message (callers print it on
 * rank 0 and then call snap_mesh_finalize).
 */
int snap_mesh_init(struct snap_mesh **out, int *argc, char ***argv, int k, int m, char *err, size_t errlen);
int snap_mesh_rank(const struct snap_mesh *mesh);
int snap_mesh_size(const struct snap_mesh *mesh);

/*
 * [collective] With the store open and locked: plan the relaunch's
 * rebuild, seed the view with its steps, then either rebuild here (a node
 * whose copy is not intact: may close and reopen *store) and agree on the
 * first global view, or leave both to the mesh thread, which runs them
 * before its rounds while the caller serves; then start the mesh thread.
 * A job that cannot be rebuilt is not an error here: it is marked lost
 * (see snap_mesh_job_error) and the rest is served.
 */
int snap_mesh_start(struct snap_mesh *mesh, struct snap_store **store, unsigned slots, uint64_t mem_limit,
		    int quiet, char *err, size_t errlen);

/*
 * --flush-dir in a mesh (meshflush.c), before snap_mesh_start: the nodes
 * flush protected steps together into cfg->flush_dir, which must be one
 * directory every node reaches (SNAP_EUNSUPPORTED for a per-node "%n"
 * path). flusher is this node's flush thread; the mesh hands it this
 * node's ranks of each step, the poll loop collects them (persist.c).
 */
struct snap_flusher;
struct snap_smp_config;
int snap_mesh_set_flush(struct snap_mesh *mesh, struct snap_flusher *flusher, const struct snap_smp_config *cfg,
			char *err, size_t errlen);
/* Readable (an eventfd: read 8 bytes) when the mesh's flush state changed:
 * a flush persisted or failed, a wanted one was decided, the mesh stopped.
 * -1 for a NULL mesh. */
int snap_mesh_fd(const struct snap_mesh *mesh);

/* Guard the store against the mesh thread. NULL mesh: no-ops. */
void snap_mesh_lock(struct snap_mesh *mesh);
void snap_mesh_unlock(struct snap_mesh *mesh);

/* [lock held] SNAP_ELOST with the rebuild failure's message for a job whose
 * in-memory copy is gone (more than m losses in a group), else 0. */
int snap_mesh_job_error(struct snap_mesh *mesh, const char *job, char *err, size_t errlen);
/*
 * [lock held] Has an agreement round that began after the caller first asked
 * completed? *ticket is the caller's state: 0 the first time (a ticket is
 * taken, returns 0), then returns 0 until that round's view is published,
 * then 1 (ticket back to 0). A restore of the newest step uses it: the view
 * of a round that began before the trainers' last commits lags behind them,
 * and ranks told different "newest" steps by successive rounds restored
 * different steps. After a relaunch, while the mesh thread rebuilds other
 * nodes, the view seeded with the relaunch's step is fresh (no round runs
 * until the rebuild ends) until a rank here commits a newer step.
 */
int snap_mesh_view_fresh(struct snap_mesh *mesh, const char *job, uint64_t *ticket);
/* [lock held] A rank of job served here restored (committed 0) or committed
 * step (committed 1): the relaunch's restores and seeded view follow it. */
void snap_mesh_rank_active(struct snap_mesh *mesh, const char *job, uint32_t rank, int committed, uint64_t step);
/*
 * [lock held] A restore answered here while the relaunch's rebuild still
 * ran elsewhere is provisional: the step it gave stands only if that
 * rebuild succeeds on every node. snap_mesh_restore_provisional says
 * whether a restore of job answered now is (1) or not (0);
 * snap_mesh_restore_check, for a trainer that restored provisionally and
 * now saves, returns 1 while the outcome is pending, 0 once the rebuild
 * succeeded, and SNAP_ELOST with err when it failed: that rank holds a step
 * the job's other ranks cannot restore, and must not go on from it.
 */
int snap_mesh_restore_provisional(struct snap_mesh *mesh, const char *job);
int snap_mesh_restore_check(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, char *err,
			    size_t errlen);
/* [lock held] 1 when the last agreement found `step` globally complete. */
int snap_mesh_step_complete(struct snap_mesh *mesh, const char *job, uint64_t step);
/* [lock held] 1 and *step: the job's newest step whose parity every node
 * holds; 0 when none (or no mesh). */
int snap_mesh_job_protected(struct snap_mesh *mesh, const char *job, uint64_t *step);

/*
 * [lock held] Repair of step of job from the mesh's parity (meshheal.c):
 * the next agreement round runs the relaunch's rebuild of the job's
 * protected step on every node (each chunk of data or parity that fails
 * its recorded CRC32C is decoded from its stripe and rewritten, a missing
 * or short slot or parity file comes back). *ticket is the caller's state,
 * 0 the first time. Returns 0 while it runs (ask again later), 1 when done
 * (*rc: 0, or the rebuild's error with msg naming why), SNAP_ENOENT with
 * msg when the mesh holds no parity of step (not its protected step),
 * SNAP_ELOST when the mesh stopped.
 */
int snap_mesh_heal(struct snap_mesh *mesh, const char *job, uint64_t step, uint64_t *ticket, int *rc, char *err,
		   size_t errlen);
/* [lock held] Is this copy given up (snap_mesh_give_up)? */
int snap_mesh_given_up(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, uint64_t gen);
/* [lock held] 1 and *step: the step of job whose parity a repair can use
 * (its protected step; meshheal.c, for the scrub); 0 when none. */
int snap_mesh_parity_step(struct snap_mesh *mesh, const char *job, uint64_t *step);
/*
 * [lock held] This node's copy of (rank, step) of job, written by
 * generation gen, is given up (no level holds it intact; given_up 0: it was
 * repaired after all). A copy given up
 * is left out of this node's summaries, so the next agreement no longer
 * finds step globally complete and the newest restorable step is an older
 * one on every node; its files stay (only the agreement drops steps).
 */
void snap_mesh_give_up(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, uint64_t gen,
		       int given_up);

/* Stop the mesh thread (every node stops at the same agreement round; a
 * node whose stop came from a peer gets SIGTERM so its poll loop ends).
 * The round waits for a mesh flush under way or wanted unless now. */
void snap_mesh_stop(struct snap_mesh *mesh, int now);
/* Error exit of a mesh node (snapsmp's main, and the mesh thread when an
 * agreement round cannot go on): MPI_Abort, so that peers waiting in a
 * collective do not hang. Does not return. (meshutil.c) */
_Noreturn void snap_mesh_abort(struct snap_mesh *mesh, int code);
/* Free communicators, MPI_Finalize, free. */
void snap_mesh_finalize(struct snap_mesh *mesh);

#endif
