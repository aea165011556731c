/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Relaunch recovery (crash-only mesh), on every node at once, in two parts:
 *
 *   mesh_recover_plan (main thread, before anything is served):
 *   1. each node lists its valid records (<job>/ec/step-<g>.rec that unpack
 *      and describe this node's group and index); a missing or corrupt
 *      record makes the node "lost" for that step;
 *   2. the lists are gathered; per job, the chosen step is the newest one
 *      that every group can rebuild (at most m members without a record).
 *      A node whose store lacks a slot its record lists, or that lacks the
 *      record, must rebuild before it serves; the others serve at once
 *      (mesh.c: snap_mesh_start).
 *
 *   mesh_recover_run (the main thread of a node that rebuilds before it
 *   serves, the mesh thread of one that serves meanwhile; same order of
 *   collectives everywhere):
 *   3. every node runs snap_ec_rebuild for it: survivors pass their files
 *      mapped (chunks whose CRC fails are rewritten, a missing manifest
 *      reads as zeros and comes back), lost nodes get their slot files,
 *      manifests, parity and record recreated bit-exact. A node writes
 *      rebuilt pieces with pwrite() (the rebuild's io, mesh_fio), not
 *      through the fresh mappings, and reads from read-only ones;
 *   4. the outcome is agreed over the mesh. Any failure (more than m
 *      erasures somewhere) marks the job lost: the message names the group,
 *      its lost nodes and the newest step still recoverable, and snapsmp
 *      answers that job's RESTORE/LATEST with SNAP_ELOST while serving the
 *      other jobs. Nothing is written for a job with no rebuildable step.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mesh/mesh_int.h"
#include "base/metrics.h"

/* This node's files of one step, opened for the rebuild: per slot-list
 * entry its manifest (read into memory) and its slot file (mapped, and
 * open for the rebuild's reads and writes), and the parity file. */
struct rebuild_files {
	struct mesh_slot_ent *ent;   /* the slot list of this node, from the record */
	uint32_t n;
	int *fd;                     /* [2n + 1], per iov: slot files, -1 for the
	                                manifests (memory); the parity file last */
	struct iovec *iov;           /* [2n + 1]: (manifest, slot) pairs */
	void **man;                  /* [n + 1] */
	void *parity;
	uint64_t parity_len;
};

/* The slot list and its buffers; the manifests as they are (missing: zeros,
 * a wrong size fails its CRC) and the slot files, created when missing. */
static int open_slot_files(struct snap_mesh *mesh, const char *job, uint64_t g, const struct snap_ec_meta *meta,
			   int have, struct rebuild_files *f, char *err, size_t errlen)
{
	const char *root = mesh->store->root;
	const void *app = NULL;
	size_t alen = 0;
	snap_ec_meta_app(meta, mesh->grp.index, &app, &alen);
	int local = mesh_blob_unpack(app, alen, &f->ent, &f->n);
	if (local)
		snap_fmt(err, errlen, "the slot list of step %" PRIu64 " in the record is malformed", g);
	f->iov = calloc(2 * (size_t)f->n + 1, sizeof(*f->iov));
	f->man = calloc((size_t)f->n + 1, sizeof(void *));
	f->fd = malloc((2 * (size_t)f->n + 1) * sizeof(int));
	for (uint32_t i = 0; f->fd && i <= 2 * f->n; i++)
		f->fd[i] = -1;
	if (!local && (!f->iov || !f->man || !f->fd)) {
		snap_fmt(err, errlen, "out of memory for the slot list of step %" PRIu64, g);
		local = SNAP_ENOMEM;
	}
	if (!local && mesh_mkdirs(root, job, -1)) {
		snap_fmt(err, errlen, "cannot create %s/%s/ec: %s", root, job, strerror(errno));
		local = SNAP_EIO;
	}
	for (uint32_t i = 0; !local && i < f->n; i++) {
		const struct mesh_slot_ent *e = &f->ent[i];
		char sp[SNAP_FILE_MAX], mp[SNAP_FILE_MAX];
		snap_store_path(mesh->store, job, e->rank, e->slot, 0, sp, sizeof(sp));
		snap_store_path(mesh->store, job, e->rank, e->slot, 1, mp, sizeof(mp));
		if (mesh_mkdirs(root, job, (int)e->rank)) {
			local = SNAP_EIO;
			snap_fmt(err, errlen, "cannot create the directory of %s", sp);
			break;
		}
		if (!(f->man[i] = calloc(1, e->man_len ? e->man_len : 1))) {
			local = SNAP_ENOMEM;
			snap_fmt(err, errlen, "out of memory for manifest %s", mp);
			break;
		}
		void *fb;
		size_t fl;
		if (mesh_read_file(mp, 1u << 30, &fb, &fl) == 0) {
			memcpy(f->man[i], fb, fl < e->man_len ? fl : e->man_len); /* a wrong size fails its CRC */
			free(fb);
		}
		f->iov[2 * i] = (struct iovec){ f->man[i], e->man_len };
		if (!e->slot_bytes)
			continue;
		/* Read-only, for the verification and MPI's sends: this node's
		 * writes go through the rebuild's io. A lost node reads and sends
		 * nothing, so its mapping is not populated either. */
		int fd = f->fd[2 * i + 1] = open(sp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		struct stat st;
		void *p = MAP_FAILED;
		if (fd >= 0 && fstat(fd, &st) == 0 &&
		    ((uint64_t)st.st_size >= e->slot_bytes || ftruncate(fd, (off_t)e->slot_bytes) == 0))
			p = mmap(NULL, e->slot_bytes, PROT_READ, MAP_SHARED | (have ? MAP_POPULATE : 0), fd, 0);
		if (p == MAP_FAILED) {
			snap_fmt(err, errlen, "cannot open slot file %s for the rebuild: %s", sp, strerror(errno));
			local = SNAP_EIO;
			break;
		}
		f->iov[2 * i + 1] = (struct iovec){ p, e->slot_bytes };
	}
	return local;
}

/* Manifests and record last: they vouch for the bytes the rebuild wrote. A
 * manifest already right is left alone; an empty parity file is written
 * when the step has no parity bytes here. */
static int publish_rebuilt(struct snap_mesh *mesh, const char *job, const struct rebuild_files *f,
			   const struct snap_ec_meta *meta, const char *rpath, const char *ppath, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < f->n; i++) {
		char mp[SNAP_FILE_MAX];
		void *fb = NULL;
		size_t fl = 0;
		snap_store_path(mesh->store, job, f->ent[i].rank, f->ent[i].slot, 1, mp, sizeof(mp));
		int same = mesh_read_file(mp, 1u << 30, &fb, &fl) == 0 && fl == f->ent[i].man_len &&
			   memcmp(fb, f->man[i], fl) == 0;
		free(fb);
		if (!same && mesh_write_atomic(mp, f->man[i], f->ent[i].man_len)) {
			snap_fmt(err, errlen, "cannot write manifest %s: %s", mp, strerror(errno));
			return SNAP_EIO;
		}
	}
	if (mesh_write_record(rpath, meta)) {
		snap_fmt(err, errlen, "cannot write record %s", rpath);
		return SNAP_EIO;
	}
	if (!f->parity_len)
		mesh_write_atomic(ppath, "", 0);
	return 0;
}

static void rebuild_files_free(struct rebuild_files *f)
{
	for (uint32_t i = 0; f->man && i < f->n; i++) {
		free(f->man[i]);
		if (f->iov && f->iov[2 * i + 1].iov_base)
			munmap(f->iov[2 * i + 1].iov_base, f->ent[i].slot_bytes);
	}
	for (uint32_t i = 0; f->fd && i <= 2 * f->n; i++)
		if (f->fd[i] >= 0)
			close(f->fd[i]);
	free(f->fd);
	if (f->parity)
		munmap(f->parity, f->parity_len);
	free(f->man);
	free(f->iov);
	free(f->ent);
}

/* Rebuild (or verify) step g of job on this node. Returns 0 or an error with
 * msg; cost[0], cost[1]: its wall and CPU time here, in ms. */
static int rebuild_step(struct snap_mesh *mesh, const char *job, uint64_t g, int have, char *err, size_t errlen,
			double cost[2])
{
	uint64_t cpu0 = mesh_thread_cpu_ns();
	const char *root = mesh->store->root;
	char rpath[SNAP_FILE_MAX], ppath[SNAP_FILE_MAX];
	mesh_ec_path(root, job, g, "rec", rpath, sizeof(rpath));
	mesh_ec_path(root, job, g, "parity", ppath, sizeof(ppath));
	/* Collective: who is lost, and the meta every member rebuilds from. */
	struct snap_ec_rebuild *rb = NULL;
	uint64_t t0 = snap_now_ns(), t1, t2;
	int rc = mesh_rebuild_begin(mesh, rpath, have, &rb, err, errlen);
	if (rc)
		return rc;
	const struct snap_ec_meta *meta = snap_ec_rebuild_meta(rb);
	struct snap_ec_meta_info in;
	snap_ec_meta_info(meta, &in);
	struct rebuild_files f = { .parity_len = in.parity_len };
	int local = open_slot_files(mesh, job, g, meta, have, &f, err, errlen);
	if (!local && in.parity_len &&
	    !(f.parity = mesh_open_parity(ppath, in.parity_len, have, &f.fd[2 * f.n], err, errlen)))
		local = SNAP_EIO;
	struct mesh_fio fio = { f.iov, f.fd, 2 * (int)f.n };
	if (!local)
		mesh_fio_attach(rb, &fio);
	/* Collective: a local failure passes nothing and fails the group. */
	struct snap_ec_rebuild_stats st = { 0 };
	t1 = snap_now_ns();
	rc = snap_ec_rebuild_run(rb, local ? NULL : f.iov, local ? 0 : 2 * (int)f.n, local ? NULL : f.parity,
				 local ? 0 : in.parity_len, &st);
	if (rc && !local) {
		snap_fmt(err, errlen, "%s", snap_ec_rebuild_error(rb));
		local = rc;
	}
	t2 = snap_now_ns();
	if (!local)
		local = publish_rebuilt(mesh, job, &f, meta, rpath, ppath, err, errlen);
	if (!local)
		smp_metrics_add(SMP_CNT_REBUILT_CHUNKS, job, st.chunks_rebuilt);
	if (!local && (st.chunks_rebuilt || !have))
		mesh_warn(mesh, "job %s step %" PRIu64 ": %s; %" PRIu64 " chunks rebuilt (%" PRIu64 " corrupt), %" PRIu64
			  " bytes written, CRCs verified, %.1f ms (files %.1f, exchange %.1f, publish %.1f); CPU %.1f ms"
			  " here", job, g, have ? "repaired this node" : "rebuilt this lost node", st.chunks_rebuilt,
			  st.chunks_corrupt, st.bytes_written, (double)(snap_now_ns() - t0) / 1e6, (double)(t1 - t0) / 1e6,
			  (double)(t2 - t1) / 1e6, (double)(snap_now_ns() - t2) / 1e6,
			  (double)(mesh_thread_cpu_ns() - cpu0) / 1e6);
	rebuild_files_free(&f);
	snap_ec_rebuild_free(rb);
	cost[0] = (double)(snap_now_ns() - t0) / 1e6;
	cost[1] = (double)(mesh_thread_cpu_ns() - cpu0) / 1e6;
	return local;
}

/* Before the first round (the budget is counted afterwards by account_parity). The
 * spare parity file stays with a kept step: the next protect writes into it
 * (protect.c), and unlinking it freed its pages on the way to serving. */
static void drop_except(struct snap_mesh *mesh, const char *job, int has_keep, uint64_t keep)
{
	uint64_t freed;
	mesh_ec_prune(mesh->store->root, job, has_keep, keep, has_keep, &freed);
}

/* Does this node's store hold, committed, every slot its record of step g
 * lists (so the rebuild writes no manifest here and the store is not
 * reopened)? Only chunks failing their CRC may then be rewritten, which a
 * restore's own CRC check catches. */
static int store_intact(struct snap_mesh *mesh, const char *job, uint64_t g)
{
	char rpath[SNAP_FILE_MAX];
	mesh_ec_path(mesh->store->root, job, g, "rec", rpath, sizeof(rpath));
	void *buf;
	size_t blen;
	struct snap_ec_meta *meta = NULL;
	if (mesh_read_file(rpath, 1u << 30, &buf, &blen))
		return 0;
	int rc = snap_ec_meta_unpack(buf, blen, &meta, NULL, 0);
	free(buf);
	if (rc)
		return 0;
	const void *app = NULL;
	size_t alen = 0;
	struct mesh_slot_ent *ent = NULL;
	uint32_t n = 0;
	snap_ec_meta_app(meta, mesh->grp.index, &app, &alen);
	int ok = mesh_blob_unpack(app, alen, &ent, &n) == 0;
	struct store_job *sj = ok ? snap_store_job(mesh->store, job, 0) : NULL;
	ok = ok && (n == 0 || sj);
	for (uint32_t i = 0; ok && i < n; i++) {
		struct store_rank *rk = ent[i].rank < sj->nranks ? sj->ranks[ent[i].rank] : NULL;
		uint32_t slot;
		struct store_slot *sl = snap_store_find(mesh->store, rk, g, &slot);
		ok = sl && slot == ent[i].slot && sl->man_len == ent[i].man_len &&
		     sl->man.layout.slot_bytes == ent[i].slot_bytes;
	}
	free(ent);
	snap_ec_meta_free(meta);
	return ok;
}

int mesh_recover_plan(struct snap_mesh *mesh)
{
	struct mesh_recs rs;
	int here = 0;
	mesh_gather_records(mesh, "", NULL, &rs);
	const struct mesh_rec *all = rs.all;
	int total = rs.total;
	/* Jobs in name order (the same list on every node). */
	for (int i = 0; i < total; i++)
		mesh_job(mesh, all[i].job);
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		uint64_t best = 0, newest = 0;
		int found = 0;
		for (int i = 0; i < total; i++) {
			if (strcmp(all[i].job, j->name))
				continue;
			newest = all[i].step > newest ? all[i].step : newest;
			if ((!found || all[i].step > best) && mesh_rebuildable(mesh, &rs, j->name, all[i].step, NULL, 0)) {
				best = all[i].step;
				found = 1;
			}
		}
		if (!found) {
			char why[700];
			mesh_rebuildable(mesh, &rs, j->name, newest, why, sizeof(why));
			j->lost = 1;
			snap_fmt(j->lost_msg, sizeof(j->lost_msg), "job %s cannot be rebuilt from the mesh: newest protected step"
				 " %" PRIu64 ": %s; no step is recoverable by every group (newest step still recoverable"
				 " anywhere in memory: none; %s%s); stores left untouched",
				 j->name, newest, why, mesh->flush_dir[0] ? "falling back to the newest persisted step in "
				 : "fall back to a disk checkpoint", mesh->flush_dir);
			if (mesh->rank == 0)
				mesh_warn(mesh, "%s", j->lost_msg);
			continue;
		}
		if (best < newest) {
			char why[700];
			mesh_rebuildable(mesh, &rs, j->name, newest, why, sizeof(why));
			if (mesh->rank == 0)
				mesh_warn(mesh, "job %s: step %" PRIu64 " cannot be rebuilt (%s); using step %" PRIu64,
					  j->name, newest, why, best);
		}
		j->rl_plan = 1;
		j->rl_step = best;
		j->rl_have = mesh_has_rec(&rs, mesh->rank, j->name, best);
		if (!j->rl_have || !store_intact(mesh, j->name, best))
			here = 1;
	}
	/* Jobs with no record on any node have no protected step: whatever is
	 * in their ec directories (a first encode killed halfway) is garbage. */
	DIR *d = opendir(mesh->store->root);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		int known = 0;
		for (int i = 0; i < total && !known; i++)
			known = strcmp(all[i].job, de->d_name) == 0;
		if (!known && snap_job_name_ok(de->d_name))
			drop_except(mesh, de->d_name, 0, 0);
	}
	if (d)
		closedir(d);
	mesh_recs_free(&rs);
	return here;
}

int mesh_recover_run(struct snap_mesh *mesh)
{
	int changed = 0;
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		if (!j->rl_plan)
			continue;
		uint64_t best = j->rl_step;
		char msg[MESH_ERRLEN] = "";
		double cost[2] = { 0, 0 }, most[2];
		int rc = rebuild_step(mesh, j->name, best, j->rl_have, msg, sizeof(msg), cost);
		changed = 1;
		if (mesh_agree(mesh, rc, msg, sizeof(msg))) {
			pthread_mutex_lock(&mesh->mu);
			j->lost = 1;
			snap_fmt(j->lost_msg, sizeof(j->lost_msg), "job %s: rebuild of step %" PRIu64 " failed: %s", j->name,
				 best, msg);
			/* A serving node answered from the step it seeded: no more;
			 * the ranks it answered are refused their next save
			 * (snap_mesh_restore_check). */
			j->seeded = 0;
			j->rl_done = 1;
			j->rl_failed = 1;
			j->has_prot = 0;
			struct store_job *sj = snap_store_job(mesh->store, j->name, 0);
			if (sj)
				sj->mesh_has_latest = 0;
			pthread_mutex_unlock(&mesh->mu);
			mesh_warn(mesh, "%s", j->lost_msg);
			continue;
		}
		drop_except(mesh, j->name, 1, best);
		pthread_mutex_lock(&mesh->mu);
		j->has_prot = 1;
		j->prot = best;
		j->rl_done = 1;
		/* The relaunch is when the job is least protected: its step goes to
		 * disk from the first rounds on, beside the restores it does not
		 * hold up (the flush thread reads the slots; meshflush.c). */
		j->fl_relaunch = mesh->flusher != NULL;
		pthread_mutex_unlock(&mesh->mu);
		/* The slowest node's time and the CPU the whole mesh spent on it
		 * (what a benchmark compares with the cores it had). */
		MPI_Allreduce(&cost[0], &most[0], 1, MPI_DOUBLE, MPI_MAX, mesh->world);
		MPI_Allreduce(&cost[1], &most[1], 1, MPI_DOUBLE, MPI_SUM, mesh->world);
		if (mesh->rank == 0)
			mesh_say(mesh, "job %s: step %" PRIu64 " verified on every node (rebuilt where lost or corrupt;"
				 " %.1f ms, CPU %.1f ms over the mesh)", j->name, best, most[0], most[1]);
	}
	return changed;
}

int mesh_heal_rebuild(struct snap_mesh *mesh, const char *job, uint64_t g, char *err, size_t errlen)
{
	double cost[2];
	return rebuild_step(mesh, job, g, 1, err, errlen, cost);
}
