/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Self-healing from the mesh's parity while snapsmp serves (--ec K+M). A
 * chunk of the protected step that fails its CRC32C on some node (found by
 * a restore or the scrub) is decoded from the surviving data and parity
 * pieces of its stripe by the same rebuild the relaunch runs (recover.c,
 * ec/'s snap_ec_rebuild): pieces whose own CRC fails are erasures, never
 * sources, and every rebuilt piece is checked against its recorded CRC
 * before it is written.
 *
 * Who asks and who decodes: the poll thread of the node that found the
 * damage sets a request on the job (snap_mesh_heal); the next agreement
 * round carries it in that node's summary, so every node sees it in the
 * same round and the mesh threads run the rebuild of the protected step
 * together (collective over each group, MPI on the mesh thread alone). The
 * poll thread never waits: the request is answered once a round numbered
 * at least its ticket has finished its repairs (as a restore of the newest
 * step waits for a fresh view).
 *
 * Copies no level can repair are given up here (snap_mesh_give_up): the
 * summaries leave them out, so the agreement stops counting the step as
 * globally complete, and every node's newest restorable step becomes an
 * older one. Nothing is withdrawn: the files stay for the agreement (and a
 * relaunch's rebuild) to decide on.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "mesh/mesh_int.h"

int snap_mesh_heal(struct snap_mesh *mesh, const char *job, uint64_t step, uint64_t *ticket, int *rc, char *err,
		   size_t errlen)
{
	struct mjob *j = mesh_job_find(mesh, job);
	if (!j || !j->has_prot || j->prot != step || j->lost) {
		*ticket = 0;
		if (j && j->has_prot && !j->lost)
			snap_fmt(err, errlen, "the mesh's parity is of step %" PRIu64 ", not of step %" PRIu64, j->prot, step);
		else
			snap_fmt(err, errlen, "the mesh holds no parity of job %s", job);
		return SNAP_ENOENT;
	}
	if (mesh->store->mesh_stopped) {
		*ticket = 0;
		snap_fmt(err, errlen, "the mesh stopped before it could repair step %" PRIu64, step);
		return SNAP_ELOST;
	}
	if (*ticket == 0) {
		/* No record here and no job directory: the job's files were
		 * removed (by hand: what remains is not damage; every node would
		 * rebuild them). A record lost from a job that is still there is
		 * damage like any other: the rebuild counts this node lost for
		 * the step and writes its record back with its pieces. */
		char rpath[SNAP_FILE_MAX], jpath[SNAP_FILE_MAX];
		struct stat st;
		mesh_ec_path(mesh->store->root, job, step, "rec", rpath, sizeof(rpath));
		snprintf(jpath, sizeof(jpath), "%s/%s", mesh->store->root, job);
		if (stat(rpath, &st) != 0 && stat(jpath, &st) != 0) {
			snap_fmt(err, errlen, "this node holds no erasure-coding record of step %" PRIu64 " (%s), nor the job (%s: %s)", step,
				 rpath, jpath, strerror(errno));
			return SNAP_ENOENT;
		}
		/* The next round to start carries it: this one's summary is taken. */
		j->heal_req = 1;
		j->heal_req_step = step;
		*ticket = mesh->rounds_started + 1;
		return 0;
	}
	if (mesh->heal_done < *ticket)
		return 0;
	uint64_t t = *ticket;
	*ticket = 0;
	if (j->heal_round < t || j->heal_step != step) {
		/* A newer step was protected in between: this one's parity is gone. */
		snap_fmt(err, errlen, "the mesh's parity moved on to step %" PRIu64 " before it repaired step %" PRIu64,
			 j->prot, step);
		return SNAP_ENOENT;
	}
	*rc = j->heal_rc;
	snap_fmt(err, errlen, "%s", j->heal_msg);
	return 1;
}

int snap_mesh_given_up(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, uint64_t gen)
{
	return mesh && mesh_heal_given_up(mesh_job_find(mesh, job), rank, step, gen);
}

int snap_mesh_parity_step(struct snap_mesh *mesh, const char *job, uint64_t *step)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	if (!j || !j->has_prot || j->lost)
		return 0;
	*step = j->prot;
	return 1;
}

void snap_mesh_give_up(struct snap_mesh *mesh, const char *job, uint32_t rank, uint64_t step, uint64_t gen,
		       int given_up)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	if (!j)
		return;
	unsigned i = 0;
	while (i < j->ndamaged &&
	       (j->damaged[i].rank != rank || j->damaged[i].step != step || j->damaged[i].gen != gen))
		i++;
	if (!given_up && i < j->ndamaged) {
		j->damaged[i] = j->damaged[--j->ndamaged];
	} else if (given_up && i == j->ndamaged) {
		if (j->ndamaged == MESH_MAX_DAMAGED) {
			/* the oldest step goes first: it is the least likely asked for */
			unsigned o = 0;
			for (unsigned x = 1; x < j->ndamaged; x++)
				o = j->damaged[x].step < j->damaged[o].step ? x : o;
			j->damaged[o] = j->damaged[--j->ndamaged];
		}
		j->damaged[j->ndamaged++] = (struct mesh_given_up){ rank, step, gen };
	}
}

int mesh_heal_given_up(const struct mjob *j, uint32_t rank, uint64_t step, uint64_t gen)
{
	for (unsigned i = 0; j && i < j->ndamaged; i++)
		if (j->damaged[i].rank == rank && j->damaged[i].step == step && j->damaged[i].gen == gen)
			return 1;
	return 0;
}

void mesh_heal_round(struct snap_mesh *mesh, uint64_t number)
{
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		if (!j->heal_now || !j->has_prot || j->lost)
			continue;
		char msg[MESH_ERRLEN] = "";
		uint64_t t0 = snap_now_ns();
		int rc = mesh_heal_rebuild(mesh, j->name, j->prot, msg, sizeof(msg));
		if (j->par_map) {
			/* The rebuild may have recreated the parity file (deleted
			 * under the mesh): a kept mapping of the old one must not
			 * become the spare a protect writes into. */
			munmap(j->par_map, j->par_len);
			j->par_map = NULL;
		}
		if (rc)
			mesh_warn(mesh, "job %s step %" PRIu64 ": repair from parity failed: %s", j->name, j->prot, msg);
		else
			mesh_say(mesh, "job %s step %" PRIu64 ": repair from parity done on group %d (%.1f ms)", j->name,
				 j->prot, mesh->grp.id, (double)(snap_now_ns() - t0) / 1e6);
		pthread_mutex_lock(&mesh->mu);
		j->heal_round = number;
		j->heal_step = j->prot;
		j->heal_rc = rc;
		snprintf(j->heal_msg, sizeof(j->heal_msg), "%s", rc ? msg : "");
		pthread_mutex_unlock(&mesh->mu);
	}
	pthread_mutex_lock(&mesh->mu);
	mesh->heal_done = number;
	pthread_mutex_unlock(&mesh->mu);
}
