/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The relaunch's state while it serves (mesh.c starts it, recover.c runs the
 * rebuild): the view seeded with each job's relaunch step, the restores the
 * warm-up waits for, and whether a restore answered during the rebuild
 * stands (provisional until the rebuild is agreed); the budget's count of
 * the ec files before and after the rebuild.
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "mesh/mesh_int.h"
#include "snap/io.h"

/* [lock held] Before serving: the view of the round just run, with each
 * planned job's relaunch step in it. That step is globally complete once
 * the rebuild is done (every rank's slot is back where it was lost), and
 * the first round after the rebuild finds the same: it is the view a
 * restore of the newest step gets while the rebuild runs. */
void mesh_seed_view(struct snap_mesh *mesh)
{
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		if (!j->rl_plan || j->lost)
			continue;
		unsigned i = 0;
		while (i < j->ncomplete && j->complete[i] > j->rl_step)
			i++;
		if (i == j->ncomplete || j->complete[i] != j->rl_step) {
			unsigned n = j->ncomplete < MESH_MAX_COMPLETE ? j->ncomplete + 1 : MESH_MAX_COMPLETE;
			if (i < n) {
				memmove(&j->complete[i + 1], &j->complete[i], (n - i - 1) * sizeof(j->complete[0]));
				j->complete[i] = j->rl_step;
				j->ncomplete = n;
			}
		}
		struct store_job *sj = snap_store_job(mesh->store, j->name, 1);
		if (sj && j->ncomplete) {
			sj->mesh_has_latest = 1;
			sj->mesh_latest = j->complete[0];
			j->seeded = 1;
		}
	}
}

/* [lock held] The relaunch's restores here: every rank whose slot of a
 * relaunch step this node holds (the pins) is waited for. */
void mesh_hold_warm(struct snap_mesh *mesh)
{
	mesh->rl_left = 0;
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		free(j->rl_seen);
		j->rl_seen = NULL;
		if (!j->rl_plan || j->lost || !j->npins || !(j->rl_seen = calloc(j->npins, 1)))
			continue;
		mesh->rl_left += j->npins;
	}
	mesh->rl_said = mesh->rl_left == 0;   /* nothing to wait for, nothing to say */
}

void snap_mesh_rank_active(struct snap_mesh *mesh, const char *job, uint32_t rank, int committed, uint64_t step)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	if (!j)
		return;
	/* This node's ranks commit past the seeded step: the next restore of
	 * the newest step waits for a round's view again. */
	if (committed && j->seeded && (!j->ncomplete || step > j->complete[0]))
		j->seeded = 0;
	for (uint32_t i = 0; j->rl_seen && i < j->npins; i++)
		if (j->pins[i].rank == rank && !j->rl_seen[i]) {
			j->rl_seen[i] = 1;
			mesh->rl_left -= mesh->rl_left > 0;
		}
}

int snap_mesh_restore_provisional(struct snap_mesh *mesh, const char *job)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	return j && j->rl_plan && !j->rl_done;
}

int snap_mesh_restore_check(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, char *err,
			    size_t errlen)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	if (!j || !j->rl_done)
		return j != NULL;
	if (!j->rl_failed)
		return 0;
	snap_fmt(err, errlen, "job %s rank %u restored step %" PRIu64 " on node %d while the relaunch rebuilt the "
		 "lost nodes, and that rebuild failed (%s): the job's other ranks cannot restore step %" PRIu64
		 "; restart every rank so that they restore the same step", job, rank, step, mesh->rank, j->lost_msg,
		 step);
	return SNAP_ELOST;
}

/* [lock held] Count parity files (and any other non-record ec file) in the
 * budget: they are store memory too. */
/* Every job directory's parity, not only the store's jobs': a lost node's
 * store knows no job yet when its captured files' generation was rebuilt
 * (they live under <job>/files, which the store's scan does not list). */
static uint64_t account_parity(struct snap_mesh *mesh)
{
	struct snap_store *s = mesh->store;
	DIR *d = opendir(s->root);
	struct dirent *e;
	uint64_t n = 0;
	while (d && (e = readdir(d))) {
		if (!snap_job_name_ok(e->d_name))
			continue;
		n += mesh_ec_bytes(s->root, e->d_name) + mesh_cap_parity_bytes(s->root, e->d_name);
	}
	if (d)
		closedir(d);
	s->mem_used += n;
	return n;
}

/* After the relaunch's recovery, before the first round: the budget counts
 * the ec files, the flush knows what is persisted, the protected slots are
 * pinned. */
void mesh_after_recovery(struct snap_mesh *mesh, struct snap_store *store, int pin_planned)
{
	mesh->ec_counted = account_parity(mesh);
	/* What is persisted already, before the rounds report it: the first
	 * round decides whether a relaunch's step is flushed (meshflush.c), and
	 * must not write again a step the flush directory holds. */
	for (struct store_job *sj = store->jobs; mesh->flusher && sj; sj = sj->next) {
		struct snap_io_err e = { 0 };
		uint64_t step;
		if (snap_io_newest_step(mesh->flush_dir, sj->name, &step, &e) == 0) {
			sj->has_persisted = 1;
			sj->persisted = step;
		}
	}
	/* A node serving while it verifies takes the planned step as protected
	 * now (the rebuild withdraws it if it fails): its slots pinned, so a
	 * trainer's save cannot take them from under the rebuild, and a
	 * restore that finds a chunk failing its CRC asks the parity for it
	 * (snap_mesh_heal: answered once the rounds run, after the rebuild). */
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		if (pin_planned && j->rl_plan && !j->lost) {
			j->has_prot = 1;
			j->prot = j->rl_step;
		}
		if (j->has_prot)
			mesh_pin_protected(mesh, j, j->prot);
	}
	mesh_hold_warm(mesh);
}

/* The relaunch's rebuild on the mesh thread of a node that serves
 * meanwhile, then the budget's count of the ec files it left. */
void mesh_rebuild_behind(struct snap_mesh *mesh)
{
	uint64_t t0 = snap_now_ns();
	mesh_recover_run(mesh);
	pthread_mutex_lock(&mesh->mu);
	struct snap_store *s = mesh->store;
	s->mem_used -= mesh->ec_counted < s->mem_used ? mesh->ec_counted : s->mem_used;
	mesh->ec_counted = account_parity(mesh);
	pthread_mutex_unlock(&mesh->mu);
	mesh_say(mesh, "relaunch rebuild done here (%.1f ms, restores served meanwhile)",
		 (double)(snap_now_ns() - t0) / 1e6);
}
