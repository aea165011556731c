/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The mesh's flush (--ec K+M with --flush-dir): the nodes persist a
 * protected step together, into one directory they all reach (a parallel
 * file system, or one disk when the nodes share a machine), or with
 * --flush-dir D/node%n each into its own directory.
 *
 * Every decision here is taken by every node from the same gathered data, so
 * the nodes move through the same states in the same round:
 *   idle    -> writing  when a node asked (SIGUSR1, SIGTERM, --flush-interval,
 *                       FLUSH), --flush-every protected steps went by, or a
 *                       relaunch just rebuilt the step (first round), and
 *                       the newest protected step is newer than the persisted
 *                       one. Each node pins its ranks' slots of that step and
 *                       hands them to its flush thread (node_only: rank files,
 *                       no seal);
 *   writing -> sealing  when the nodes' written rank files add up to the
 *                       step's world. Node 0 writes the MANIFEST (io's seal
 *                       checks every rank file) and applies retention.
 *                       Per node, each flush thread withdrew its node's old
 *                       part of the step, then wrote and sealed its ranks as
 *                       a part before reporting them written; once every
 *                       node reported, node 0 reads the parts' union back
 *                       through the pattern instead of writing a MANIFEST;
 *   writing -> idle     when a node's part failed, or every node holding the
 *                       job is done and ranks are missing;
 *   sealing -> idle     when node 0's summary reports the seal: the step is
 *                       persisted on every node from the same round on.
 * So a step is persisted only once every node has written its part, and the
 * MANIFEST in the shared directory (per node: the parts, which io joins) is
 * the record that any node and snaptool read. A mesh killed at any moment
 * leaves an unsealed step (never listed as persisted; retention removes
 * it) or a persisted one.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "flush/flush.h"
#include "mesh/mesh_int.h"
#include "base/metrics.h"
#include "snap/io.h"

/* Tell the poll loop to look at the jobs' flush state again. */
static void poke(struct snap_mesh *mesh)
{
	uint64_t one = 1;
	ssize_t n = write(mesh->efd, &one, sizeof(one));
	(void)n;   /* a full counter wakes the loop as well */
}

/* [lock held] Withdraw an old part of step g from one node's directory
 * (snap_io_part_withdraw), saying so only when that fails. */
static void withdraw_in(struct snap_mesh *mesh, const char *dir, struct mjob *j, uint64_t g)
{
	struct snap_io_err e = { 0 };
	if (snap_io_part_withdraw(dir, j->name, g, &e) < 0)
		mesh_warn(mesh, "job %s step %" PRIu64 ": %s", j->name, g, e.msg);
}

/* [lock held] Per node, node 0: the directories of nodes past this mesh
 * (it had more nodes before) hold no part of the step it flushes now; an
 * old one there would list its ranks twice. Nodes 0..size-1 see to their own. */
static void withdraw_past(struct snap_mesh *mesh, struct mjob *j, uint64_t g)
{
	for (int n = mesh->size;; n++) {
		char nd[SNAP_PATH_MAX];
		struct stat st;
		if (snap_mesh_expand(mesh->flush_dir, n, nd, sizeof(nd)) || stat(nd, &st) != 0)
			return;   /* the first missing node directory ends the search */
		withdraw_in(mesh, nd, j, g);
	}
}

/* [lock held] This node's part of step g: its ranks' files, or none. */
static void start_part(struct snap_mesh *mesh, struct mjob *j, uint64_t g)
{
	if (mesh->rank == 0 && mesh->node_flush_dir[0])
		withdraw_past(mesh, j, g);
	struct store_job *sj = snap_store_job(mesh->store, j->name, 0);
	if (!sj) {
		/* No rank of this job here now (nothing to report), but an old part
		 * of the step in this node's directory must not join the new ones.
		 * Done before the next round, so before node 0 reads the union. */
		if (mesh->node_flush_dir[0])
			withdraw_in(mesh, mesh->node_flush_dir, j, g);
		return;
	}
	sj->mfl_step = g;
	sj->mfl_busy = 1;
	sj->mfl_ranks = 0;
	sj->mfl_world = 0;
	sj->mfl_bytes = 0;
	sj->mfl_msg[0] = 0;
	struct flush_req *q = NULL;
	char err[sizeof(sj->mfl_msg)];
	int rc = flush_req_build(mesh->store, sj, g, 1, &q, err, sizeof(err));
	if (rc) {
		sj->mfl_state = 2;
		snprintf(sj->mfl_msg, sizeof(sj->mfl_msg), "%s", err);
		mesh_warn(mesh, "job %s step %" PRIu64 ": cannot flush this node's ranks: %s", j->name, g, err);
		return;
	}
	sj->mfl_world = q->world;
	/* Per node, a node without ranks of the step still withdraws an old
	 * part of it (through its flush thread, in order with earlier tries). */
	if (q->nranks == 0 && !mesh->node_flush_dir[0]) {
		sj->mfl_state = 1;
		snap_flush_req_free(q);
		return;
	}
	sj->mfl_state = 0;
	sj->flushing = 1;
	q->try_no = ++sj->mfl_try;
	if (mesh->node_flush_dir[0])
		snprintf(q->part_dir, sizeof(q->part_dir), "%s", mesh->node_flush_dir);
	if (q->nranks)
		mesh_say(mesh, "job %s step %" PRIu64 ": flushing %u rank file(s) of this node to %s", j->name, g,
			 q->nranks, mesh->node_flush_dir[0] ? mesh->node_flush_dir : mesh->flush_dir);
	snap_flusher_submit(mesh->flusher, q);
}

/* [lock held] The flush of j ended everywhere (ok or not). */
static void finish(struct snap_mesh *mesh, struct mjob *j, int ok, const char *why)
{
	struct store_job *sj = snap_store_job(mesh->store, j->name, 0);
	if (ok) {
		j->has_persisted = 1;
		j->persisted = j->fl_step;
	}
	if (sj) {
		sj->mfl_busy = j->fl_want;
		if (ok) {
			sj->has_persisted = 1;
			sj->persisted = j->fl_step;
			sj->mfl_ns = snap_now_ns() - j->fl_t0;
			smp_metrics_observe(SMP_HIST_FLUSH, j->name, (double)sj->mfl_ns / 1e9);
			sj->mfl_failed = 0;
		} else {
			sj->mfl_failed = 1;
			smp_metrics_count(SMP_CNT_FLUSH_FAILED, j->name);
			sj->mfl_failed_step = j->fl_step;
			snprintf(sj->mfl_msg, sizeof(sj->mfl_msg), "%s", why);
		}
	}
	j->fl_busy = 0;
}

/* Node 0: seal the step and apply retention (outside the lock: disk work).
 * Per-node directories: each node's flush thread sealed its part, so this
 * reads the parts' union back, which is what every reader will see. */
static void seal(struct snap_mesh *mesh, struct mjob *j)
{
	struct snap_io_err e = { 0 };
	uint32_t world = 0;
	j->seal_step = j->fl_step;
	int rc;
	if (!mesh->node_flush_dir[0]) {
		rc = snap_io_step_seal(mesh->flush_dir, j->name, j->fl_step, j->fl_world, &e);
	} else {
		rc = snap_io_step_world(mesh->flush_dir, j->name, j->fl_step, &world, &e);
		if (!rc && world != j->fl_world) {
			snprintf(e.msg, sizeof(e.msg), "%s: the parts say world %" PRIu32 ", the flush %" PRIu32,
				 mesh->flush_dir, world, j->fl_world);
			rc = SNAP_EMISMATCH;
		}
	}
	if (rc) {
		j->seal_state = 2;
		mesh_warn(mesh, "job %s step %" PRIu64 ": sealing the persisted step failed: %s", j->name, j->fl_step,
			  e.msg);
		return;
	}
	j->seal_state = 1;
	if (snap_io_retain(mesh->flush_dir, j->name, mesh->flush_keep ? mesh->flush_keep : 1, &e) < 0)
		mesh_warn(mesh, "job %s: step %" PRIu64 " persisted, but retention failed: %s", j->name, j->fl_step, e.msg);
}

/* Advance one job; returns 1 while its flush is under way or wanted. */
static int advance(struct snap_mesh *mesh, struct mjob *j, int wanted)
{
	if (j->f_has_persisted && (!j->has_persisted || j->f_persisted > j->persisted)) {
		j->has_persisted = 1;
		j->persisted = j->f_persisted;
	}
	if (j->has_prot && (!j->fl_counted || j->prot != j->fl_last_prot)) {
		j->fl_counted = 1;
		j->fl_last_prot = j->prot;
		j->since_flush++;
	}
	if (wanted)
		j->fl_want = 1;
	if (j->f_world)
		j->fl_world = j->f_world;
	if (j->fl_busy == 1) {
		char why[256];
		if (j->f_fail_node >= 0) {
			snprintf(why, sizeof(why), "flush of step %" PRIu64 " of job %s failed on node %d (see its log)",
				 j->fl_step, j->name, j->f_fail_node);
		} else if (j->fl_world && j->f_ok >= j->fl_world &&
			   (!mesh->node_flush_dir[0] || j->f_done >= j->f_nodes)) {
			/* per node: also every node without ranks of the step has
			 * withdrawn its old part, or the union could still list it */
			j->fl_busy = 2;
			if (mesh->rank == 0)
				seal(mesh, j);
			return 1;
		} else if (j->f_done < j->f_nodes) {
			return 1;
		} else {
			snprintf(why, sizeof(why), "flush of step %" PRIu64 " of job %s: the nodes wrote %u of %u rank files",
				 j->fl_step, j->name, j->f_ok, j->fl_world);
		}
		mesh_warn(mesh, "%s", why);
		pthread_mutex_lock(&mesh->mu);
		finish(mesh, j, 0, why);
		pthread_mutex_unlock(&mesh->mu);
		poke(mesh);
	} else if (j->fl_busy == 2) {
		if (!j->f_seal)
			return 1;
		char why[256];
		snprintf(why, sizeof(why), "sealing step %" PRIu64 " of job %s failed on node 0 (see its log)", j->fl_step,
			 j->name);
		if (j->f_seal == 1)
			mesh_say(mesh, "job %s step %" PRIu64 " persisted: every node flushed its ranks (%.2f s)", j->name,
				 j->fl_step, (snap_now_ns() - j->fl_t0) / 1e9);
		pthread_mutex_lock(&mesh->mu);
		finish(mesh, j, j->f_seal == 1, why);
		pthread_mutex_unlock(&mesh->mu);
		poke(mesh);
	}
	if (j->fl_busy)
		return 1;
	int newer = j->has_prot && (!j->has_persisted || j->prot > j->persisted);
	int due = j->fl_want || j->fl_relaunch || (mesh->flush_every && j->since_flush >= mesh->flush_every);
	if (j->fl_relaunch && newer && mesh->rank == 0)
		mesh_say(mesh, "job %s: step %" PRIu64 " the relaunch restored is not persisted: flushing it now",
			 j->name, j->prot);
	j->fl_relaunch = 0;   /* decided once, in the first round: every node alike */
	if (!newer || !due) {
		if (j->fl_want && !newer) {
			j->fl_want = 0;   /* nothing newer than the persisted step is protected */
			pthread_mutex_lock(&mesh->mu);
			struct store_job *sj = snap_store_job(mesh->store, j->name, 0);
			if (sj)
				sj->mfl_busy = 0;
			pthread_mutex_unlock(&mesh->mu);
			poke(mesh);
		}
		return 0;
	}
	j->fl_busy = 1;
	j->fl_step = j->prot;
	j->fl_world = 0;   /* the nodes holding ranks report it */
	j->fl_want = 0;
	j->since_flush = 0;
	j->fl_t0 = snap_now_ns();
	pthread_mutex_lock(&mesh->mu);
	start_part(mesh, j, j->fl_step);
	pthread_mutex_unlock(&mesh->mu);
	return 1;
}

int mesh_flush_round(struct snap_mesh *mesh, int wanted)
{
	int busy = 0;
	if (!mesh->flusher)
		return 0;   /* nothing asks: persist_request refuses without a flush directory */
	for (struct mjob *j = mesh->jobs; j; j = j->next)
		if (!j->lost)
			busy |= advance(mesh, j, wanted);
	if (wanted) {
		pthread_mutex_lock(&mesh->mu);
		mesh->store->mesh_flush_taken = 0;
		pthread_mutex_unlock(&mesh->mu);
		poke(mesh);
	}
	return busy;
}
