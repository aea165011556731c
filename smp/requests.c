/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The trainers' requests to snapsmp, each handled to completion on the
 * event loop's thread (daemon.c): HELLO (which generation a process
 * belongs to, and whether its rank may connect), REGISTER, ACQUIRE,
 * COMMIT and RECOMMIT, RESTORE (which step, from memory or loaded from
 * disk), and the dispatch that also hands FLUSH to persist.c and captured
 * files' messages to filereq.c. A malformed request gets an error reply
 * and its connection is closed.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files/files.h"
#include "flush/rehydrate.h"
#include "smp_internal.h"
#include "flush/persist.h"
#include "mesh/mesh.h"
#include "base/metrics.h"
#include "snap/io.h"
#include "snap/wire.h"


void smp_close_conn(struct smp *m, struct conn *c)
{
	snap_files_conn_closed(m->files, c);
	/* Logged once the descriptor is closed: a reader of the log (the memory
	 * tests) then finds the connection gone from /proc. */
	close(c->fd);
	if (c->rank && c->rank->conn == c) {
		snap_store_release_owner(m->store, c->rank, c);
		c->rank->conn = NULL;
		c->job->connected--;
		smp_say(m, "job %s rank %u (pid %u) disconnected", c->job->name, c->rank->rank, c->pid);
	}
	free(c->buf);
	free(c->heal_bad);
	c->heal_bad = NULL;
	c->dead = 1;
}

static int on_hello(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, char *err)
{
	char job[SNAP_JOB_MAX + 1];
	snap_get_str(r, job, sizeof(job));
	uint32_t rank = snap_get_u32(r), world = snap_get_u32(r), pid = snap_get_u32(r);
	uint64_t gen = snap_get_u64(r);   /* the generation this process already belongs to; 0: none yet */
	char launch[sizeof(((struct store_job *)0)->launch)] = "";
	if (snap_rbuf_left(r))           /* optional: the client's SNAP_LAUNCH */
		snap_get_str(r, launch, sizeof(launch));
	/* A generation near 2^64 could only come from a broken or hostile
	 * client, and the counter must never wrap. */
	if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job) || world == 0 || rank >= world ||
	    world > (1u << 24) || gen > (UINT64_MAX >> 1)) {
		snap_fmt(err, SMP_ERRLEN, "malformed HELLO (job name, rank %u, world %u or generation invalid)", rank, world);
		return SNAP_EPROTO;
	}
	if (c->job) {
		snap_fmt(err, SMP_ERRLEN, "HELLO sent twice on one connection");
		return SNAP_EPROTO;
	}
	struct store_job *j = snap_store_job(m->store, job, 1);
	struct store_rank *rk = j ? snap_store_rank(m->store, j, rank, 1) : NULL;
	if (!rk) {
		snap_fmt(err, SMP_ERRLEN, "cannot create store directories for job %s rank %u under %s: %s", job, rank,
			 m->store->root, strerror(errno));
		return SNAP_EIO;
	}
	if (rk->conn) {
		snap_fmt(err, SMP_ERRLEN, "job %s rank %u is already connected (pid %u)", job, rank, rk->pid);
		return SNAP_EBUSY;
	}
	/*
	 * A generation is an incarnation of the job's processes, so it changes
	 * only when processes do. A process that was already connected (to this
	 * daemon or to one that died) says which generation it belongs to and
	 * keeps it: after a daemon restart no rank is connected, and treating
	 * the first reconnecting rank as a new incarnation made its next save
	 * withdraw the live ranks' committed steps (issue 10). A process new to
	 * the daemon (gen 0) starts a new incarnation when no rank of the job is
	 * connected, and otherwise joins the running one -- unless it names the
	 * launch that started the running one (SNAP_LAUNCH): a rank of the same
	 * launch that starts after its peers exited is no relaunch, and a new
	 * incarnation would withdraw their committed steps.
	 */
	if (gen != 0 && gen >= j->gen) {
		if (gen > j->gen)   /* a generation a dead daemon started, of which nothing was committed */
			snap_store_set_generation(m->store, j, gen);
		/* A live incarnation rewound when it started: its saves must not
		 * announce a new one to the mesh (snap_store_rewind). */
		j->rewound_gen = gen;
	} else if (gen != 0) {
		smp_say(m, "job %s rank %u (pid %u) of generation %" PRIu64 " reconnected after generation %" PRIu64
		    " started; it joins the new one", job, rank, pid, gen, j->gen);
	} else if (j->connected == 0 && launch[0] && j->gen && !strcmp(launch, j->launch)) {
		smp_say(m, "job %s rank %u (pid %u) joins generation %" PRIu64 " of its launch %s", job, rank, pid, j->gen,
			launch);
	} else if (j->connected == 0) {
		snap_store_new_generation(m->store, j);
		snprintf(j->launch, sizeof(j->launch), "%s", launch);
	}
	j->connected++;
	rk->conn = c;
	rk->pid = pid;
	j->world = world;
	c->job = j;
	c->rank = rk;
	c->pid = pid;
	smp_say(m, "job %s rank %u/%u connected (pid %u)", job, rank, world, pid);
	snap_put_u32(out, m->store->nslots);
	snap_put_u64(out, m->store->mem_limit);
	snap_put_u64(out, m->store->mem_used);
	snap_put_u64(out, j->gen);
	return 0;
}

static int on_register(struct smp *m, struct conn *c, struct snap_rbuf *r, char *err)
{
	struct snap_layout lay;
	char why[512];
	int rc = snap_layout_decode(r, &lay, why, sizeof(why));
	if (rc) {
		snap_fmt(err, SMP_ERRLEN, "malformed layout: %s", why);
		return rc;
	}
	if (snap_rbuf_left(r)) {
		snap_layout_free(&lay);
		snap_fmt(err, SMP_ERRLEN, "REGISTER carries %zu trailing bytes", snap_rbuf_left(r));
		return SNAP_EPROTO;
	}
	struct store_job *j = c->job;
	uint64_t pre = j->slots_precreated, reused = j->slots_reused, bytes = lay.slot_bytes;
	rc = snap_store_register(m->store, j, c->rank, &lay, err, SMP_ERRLEN);
	snap_layout_free(&lay);
	if (rc == 0 && (j->slots_precreated != pre || j->slots_reused != reused)) {
		smp_metrics_add(SMP_CNT_SLOTS_PRECREATED, j->name, j->slots_precreated - pre);
		smp_metrics_add(SMP_CNT_SLOTS_REUSED, j->name, j->slots_reused - reused);
		smp_say(m, "job %s rank %u: %" PRIu64 " slot file(s) of %" PRIu64 " bytes reused, %" PRIu64
			" being reserved ahead of the first save", j->name, c->rank->rank, j->slots_reused - reused, bytes,
			j->slots_precreated - pre);
	}
	return rc;
}

/* Whether an error message begins with "job NAME" of c's job (the log
 * prefixes the job otherwise). */
static int names_job(const struct conn *c, const char *err)
{
	size_t n = c->job ? strlen(c->job->name) : 0;
	return c->job && !strncmp(err, "job ", 4) && !strncmp(err + 4, c->job->name, n) &&
	       (err[4 + n] == ' ' || err[4 + n] == ':');
}

/* A save of a rank that restored while the relaunch's rebuild ran: refused
 * by name once that rebuild failed, so that no rank trains on from a step
 * the others cannot restore. */
static int provisional_ok(struct smp *m, struct conn *c, char *err)
{
	if (!c->provisional)
		return 0;
	int rc = snap_mesh_restore_check(m->mesh, c->job->name, c->rank->rank, c->provisional_step, err, SMP_ERRLEN);
	if (rc == 0)
		c->provisional = 0;
	return rc < 0 ? rc : 0;   /* the error is logged with the reply */
}

static int on_acquire(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, int *fd, char *err)
{
	uint64_t step = snap_get_u64(r);
	if (r->bad || snap_rbuf_left(r) || step == SNAP_STEP_LATEST) {
		snap_fmt(err, SMP_ERRLEN, "malformed ACQUIRE");
		return SNAP_EPROTO;
	}
	uint32_t slot;
	uint64_t late = c->job->slots_late;
	int rc = provisional_ok(m, c, err);
	if (rc)
		return rc;
	rc = snap_store_acquire(m->store, c->job, c->rank, step, c, &slot, fd, err, SMP_ERRLEN);
	if (c->job->slots_late != late) {
		smp_metrics_add(SMP_CNT_SLOTS_LATE, c->job->name, c->job->slots_late - late);
		smp_logf(&m->log, SMP_LOG_DEBUG, "job %s rank %u: the save of step %" PRIu64 " reserved its slot file "
			 "itself (not ready ahead)", c->job->name, c->rank->rank, step);
	}
	if (rc)
		return rc;
	snap_put_u32(out, slot);
	snap_put_u64(out, c->rank->layout.slot_bytes);
	if (smp_metrics_on() && slot < sizeof(c->acquire_ns) / sizeof(c->acquire_ns[0]))
		c->acquire_ns[slot] = snap_now_ns();
	return 0;
}

static int on_commit(struct smp *m, struct conn *c, struct snap_rbuf *r, int again, char *err)
{
	uint32_t slot = snap_get_u32(r);
	uint64_t step = snap_get_u64(r);
	uint32_t ncrc = snap_get_u32(r);
	if (r->bad || snap_rbuf_left(r) != (size_t)ncrc * 8 + 8) {
		/* EPROTO closes the connection, which frees the slots it was writing. */
		snap_fmt(err, SMP_ERRLEN, "malformed COMMIT (%u chunks announced, %zu bytes follow)", ncrc, snap_rbuf_left(r));
		return SNAP_EPROTO;
	}
	uint32_t *crc = malloc(sizeof(uint32_t) * (ncrc ? 2 * (size_t)ncrc : 1));
	if (!crc)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < 2 * ncrc; i++)
		crc[i] = snap_get_u32(r);
	c->pinned = snap_get_u64(r);
	int rc = provisional_ok(m, c, err);
	if (rc) {
		free(crc);
		return rc;
	}
	uint64_t t0 = smp_metrics_on() ? snap_now_ns() : 0;
	rc = again ? snap_store_recommit(m->store, c->job, c->rank, c, slot, step, crc, crc + ncrc, ncrc,
					     m->cfg->verify_commit, err, SMP_ERRLEN)
		       : snap_store_commit(m->store, c->job, c->rank, c, slot, step, crc, crc + ncrc, ncrc,
					   m->cfg->verify_commit, err, SMP_ERRLEN);
	free(crc);
	if (rc == 0 && t0) {
		uint64_t t1 = snap_now_ns();
		smp_metrics_observe(SMP_HIST_COMMIT, c->job->name, (double)(t1 - t0) / 1e9);
		uint64_t *acq = slot < sizeof(c->acquire_ns) / sizeof(c->acquire_ns[0]) ? &c->acquire_ns[slot] : NULL;
		if (!again && acq && *acq)
			smp_metrics_observe(SMP_HIST_SAVE, c->job->name, (double)(t0 - *acq) / 1e9);
		if (acq)
			*acq = 0;
	}
	if (rc == 0) {
		smp_logf(&m->log, SMP_LOG_DEBUG, "job %s rank %u committed step %" PRIu64 " (slot %u)", c->job->name,
			 c->rank->rank, step, slot);
		snap_mesh_rank_active(m->mesh, c->job->name, c->rank->rank, 1, step);
		persist_on_commit(m, c->job);
	}
	return rc;
}

/* Damaged manifests the store's scan at start discarded, over the job's ranks. */
static uint32_t discarded_manifests(const struct store_job *j)
{
	uint32_t n = 0;
	for (uint32_t r = 0; r < j->nranks; r++)
		n += j->ranks[r] ? j->ranks[r]->discarded : 0;
	return n;
}

/*
 * A SNAP_STEP_LATEST that resolved to step `got` on one node with a flush
 * directory, after the scan at start discarded a damaged store manifest:
 * when the flush shows a newer step (sealed, or its MANIFEST lost) that no
 * level holds whole, the restore passed over it, and the trainer is told
 * (the RESTORE reply's note; snap_restore() says it fell back): the store
 * lost the step and nothing on its side would otherwise ever meet it.
 * 1 with *over and why set.
 */
static int passed_over(struct smp *m, struct conn *c, uint64_t got, uint64_t *over, char *why)
{
	uint64_t sealed = 0;
	if (m->mesh || !m->cfg->flush_dir[0] || !discarded_manifests(c->job))
		return 0;
	if (!(snap_io_sealed_step(m->cfg->flush_dir, c->job->name, &sealed) && sealed > got) &&
	    !snap_io_lost_step(m->cfg->flush_dir, c->job->name, got, &sealed))
		return 0;
	*over = sealed;
	snap_fmt(why, SMP_ERRLEN, "step %" PRIu64 " was persisted but neither the node store nor %s holds it whole "
		 "(the store's manifest of it was discarded as damaged when snapsmp started)", sealed, m->cfg->flush_dir);
	smp_logf(&m->log, SMP_LOG_WARN, "job %s rank %u: %s; restoring step %" PRIu64, c->job->name, c->rank->rank, why,
		 got);
	return 1;
}

/*
 * One node with a flush directory: the flush may hold a newer step than the
 * store, when the store lost it (its manifest damaged and discarded by the
 * scan at start). SNAP_STEP_LATEST is the newest step some level holds
 * whole: 1 when the disk's newer step was loaded into *slot, 0 to use the
 * store's `latest` (passed_over() then says whether a newer step on disk
 * is damaged too; a load that fails counts as damage), SNAP_ESTATE when
 * the disk's step is whole but the rank registered no layout to load it
 * with (not EPROTO: that closes the connection the layout comes on). Only
 * with that evidence: a newer step on disk is otherwise one of a timeline
 * a restore of an older step abandoned (the flush keeps no generation),
 * and the store's newest is the job's.
 */
static int newer_on_disk(struct smp *m, struct conn *c, uint64_t latest, uint32_t *slot, char *err)
{
	struct store_job *j = c->job;
	uint64_t disk = 0;
	size_t bad = 0;
	struct snap_io_err e = { 0 };
	if (m->mesh || !m->cfg->flush_dir[0] || !discarded_manifests(j))
		return 0;
	if (snap_io_newest_step(m->cfg->flush_dir, j->name, &disk, &e) || disk <= latest ||
	    snap_io_verify_step(m->cfg->flush_dir, j->name, disk, &bad, &e))
		return 0;
	if (!c->rank->has_layout) {
		/* a describe before any REGISTER (libsnap.torch reads the layout
		 * from the HDF5 files on this answer, as with an empty store) */
		snap_fmt(err, SMP_ERRLEN, "job %s rank %u: persisted step %" PRIu64 " in %s is newer than the node store's "
			 "newest (%" PRIu64 ": a newer manifest was discarded as damaged); REGISTER its layout first so "
			 "that snapsmp can load it", j->name, c->rank->rank, disk, m->cfg->flush_dir, latest);
		return SNAP_ESTATE;
	}
	if (snap_rehydrate(m->cfg, m->store, j, c->rank, c, slot, err, SMP_ERRLEN))
		return 0;
	if (c->rank->slots[*slot].step > latest) {
		smp_say(m, "job %s rank %u: restoring persisted step %" PRIu64 " from %s (level: disk): the node "
			"store's newest is step %" PRIu64, j->name, c->rank->rank, c->rank->slots[*slot].step,
			m->cfg->flush_dir, latest);
		return 1;
	}
	return 0;   /* the disk's choice is older after all: the store's stands */
}

/* A step is restorable only when every rank of its world committed it.
 * *over: a newer step SNAP_STEP_LATEST passed over (why says why), else
 * SNAP_STEP_LATEST. */
static int pick_restore(struct smp *m, struct conn *c, uint64_t want, uint32_t *slot, uint64_t *over, char *why,
			char *err)
{
	*over = SNAP_STEP_LATEST;
	uint64_t latest;
	struct store_job *j = c->job;
	/* A job the relaunch could not rebuild falls back to disk, if any. */
	int lost = snap_mesh_job_error(m->mesh, j->name, err, SMP_ERRLEN);
	if (lost && (want != SNAP_STEP_LATEST || !m->cfg->flush_dir[0]))
		return lost;
	if (want == SNAP_STEP_LATEST && m->mesh && !snap_mesh_view_fresh(m->mesh, j->name, &c->restore_ticket)) {
		/* the client retries EBUSY: the answer comes from a view newer than this request */
		snap_fmt(err, SMP_ERRLEN, "job %s: waiting for an agreement round newer than this restore; retry", j->name);
		return SNAP_EBUSY;
	}
	int have = snap_store_latest(m->store, j, &latest) == 0;
	if (want == SNAP_STEP_LATEST) {
		if (!have && m->cfg->flush_dir[0]) {
			/* Nothing restorable in memory: fall back to the newest persisted step. */
			char lost_msg[SMP_ERRLEN];
			snprintf(lost_msg, sizeof(lost_msg), "%s", err);
			int rc = snap_rehydrate(m->cfg, m->store, j, c->rank, c, slot, err, SMP_ERRLEN);
			if (rc == 0)
				smp_say(m, "job %s rank %u: restoring persisted step %" PRIu64 " from %s (level: disk)%s", j->name,
				    c->rank->rank, c->rank->slots[*slot].step, m->cfg->flush_dir,
				    lost ? ", the mesh could not rebuild it" : ", nothing restorable in memory");
			if (rc == 0)
				passed_over(m, c, c->rank->slots[*slot].step, over, why);
			if (rc != SNAP_ENOENT)
				return rc ? rc : snap_store_rewind(m->store, j, 1, c->rank->slots[*slot].step, err, SMP_ERRLEN);
			if (lost) {
				snap_fmt(err, SMP_ERRLEN, "%s; and no step of it is persisted in %s", lost_msg, m->cfg->flush_dir);
				return lost;
			}
		}
		if (!have) {
			/* Starting fresh: no older incarnation's partial step may join the new timeline. */
			int rc = snap_store_rewind(m->store, j, 0, 0, err, SMP_ERRLEN);
			if (rc)
				return rc;
			snap_fmt(err, SMP_ERRLEN, "job %s has no step committed by all of its ranks in store %s", j->name,
				 m->store->root);
			return SNAP_ENOENT;
		}
		int rc = newer_on_disk(m, c, latest, slot, err);
		if (rc < 0)
			return rc;
		if (rc)
			return snap_store_rewind(m->store, j, 1, c->rank->slots[*slot].step, err, SMP_ERRLEN);
		want = latest;
		passed_over(m, c, latest, over, why);
	}
	struct store_slot *sl = snap_store_find(m->store, c->rank, want, slot);
	if (!sl) {
		snap_fmt(err, SMP_ERRLEN, "job %s rank %u has no committed snapshot of step %" PRIu64 " in store %s", j->name,
			 c->rank->rank, want, m->store->root);
		return SNAP_ENOENT;
	}
	/* A snapshot of a job with another number of ranks holds other shards:
	 * restoring it would hand this rank the wrong part of the model. */
	if (sl->man.world != j->world) {
		snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s was saved by a job of world size %u, this job has %u "
			 "ranks (world size mismatch; resharding is not supported: export the persisted step with "
			 "snaptool export and load it by global shape)", want, j->name, sl->man.world, j->world);
		return SNAP_EMISMATCH;
	}
	/* mesh: other nodes hold the other ranks; the agreement vouches for them. */
	if (m->mesh && !snap_mesh_step_complete(m->mesh, j->name, want)) {
		snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s is not globally complete in the mesh", want, j->name);
		return SNAP_ENOENT;
	}
	for (uint32_t r = 0; !m->mesh && r < sl->man.world; r++) {
		struct store_rank *rk = r < j->nranks ? j->ranks[r] : NULL;
		if (!snap_store_find(m->store, rk, want, NULL)) {
			snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s is incomplete: rank %u has not committed it", want,
				 j->name, r);
			return SNAP_ENOENT;
		}
	}
	return snap_store_rewind(m->store, j, 1, want, err, SMP_ERRLEN);
}

static int on_restore(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, int *fd, char *err)
{
	uint64_t want = snap_get_u64(r);
	if (r->bad || snap_rbuf_left(r)) {
		snap_fmt(err, SMP_ERRLEN, "malformed RESTORE");
		return SNAP_EPROTO;
	}
	uint32_t slot;
	uint64_t over;
	char why[SMP_ERRLEN];
	int rc = pick_restore(m, c, want, &slot, &over, why, err);
	if (rc)
		return rc;
	rc = snap_store_open_slot(m->store, c->job, c->rank, slot, err, SMP_ERRLEN);
	if (rc < 0)
		return rc;
	*fd = rc;
	snap_put_bytes(out, c->rank->slots[slot].man_bytes, c->rank->slots[slot].man_len);
	if (over != SNAP_STEP_LATEST) {
		/* the note after the manifest (whose header says its own length) */
		snap_put_u64(out, over);
		snap_put_str(out, why);
	}
	snap_mesh_rank_active(m->mesh, c->job->name, c->rank->rank, 0, 0);
	c->provisional = snap_mesh_restore_provisional(m->mesh, c->job->name);
	c->provisional_step = c->rank->slots[slot].step;
	return 0;
}

/*
 * Mesh: before the flush, the mesh's parity (meshheal.c). When a requested
 * rank's copy of the protected step has bad chunks, the mesh threads decode
 * them in the next agreement round; the request answers EBUSY until then
 * (the client asks again, as a RESTORE waits for a fresh view) and keeps in
 * c what it found before, so that what the parity repaired is counted. 1:
 * the parity level is done (or not used) and *before the counts (NULL: no
 * parity repair ran), pmsg its failure; SNAP_EBUSY: ask again; another
 * error: the repair cannot go on.
 */
static int repair_mesh_level(struct smp *m, struct conn *c, struct store_job *j, uint32_t rank, uint64_t step,
			     uint32_t **before, char *pmsg, size_t plen, char *err)
{
	*before = NULL;
	uint64_t prot;
	if (!snap_mesh_job_protected(m->mesh, j->name, &prot) || prot != step)
		return 1;   /* no parity of this step: the flush is the one other level */
	if (c->heal_ticket && c->heal_step != step) {
		c->heal_ticket = 0;
		free(c->heal_bad);
		c->heal_bad = NULL;
	}
	int done = 0, hrc = 0;
	if (!c->heal_ticket) {
		uint32_t *bad = calloc(j->nranks ? j->nranks : 1, sizeof(*bad)), total = 0;   /* total: any */
		if (!bad) {
			snap_fmt(err, SMP_ERRLEN, "repair: out of memory");
			return SNAP_ENOMEM;
		}
		for (uint32_t k = 0; k < j->nranks; k++) {
			struct store_rank *rk = j->ranks[k];
			uint32_t slot;
			char e[SMP_ERRLEN];
			if (!rk || (rank != UINT32_MAX && rk->rank != rank) || !snap_store_find(m->store, rk, step, &slot))
				continue;
			if (smp_repair_count(m->store, j, rk, slot, &bad[k], e, sizeof(e)) == 0)
				total |= bad[k] != 0;   /* (a count, or SMP_REPAIR_SHORT) */
		}
		if (!total) {
			free(bad);
			return 1;
		}
		done = snap_mesh_heal(m->mesh, j->name, step, &c->heal_ticket, &hrc, pmsg, plen);
		if (done == 0) {
			c->heal_bad = bad;
			c->heal_n = j->nranks;
			c->heal_step = step;
		} else {
			free(bad);
		}
	} else {
		done = snap_mesh_heal(m->mesh, j->name, step, &c->heal_ticket, &hrc, pmsg, plen);
	}
	if (done == 0) {
		snap_fmt(err, SMP_ERRLEN, "job %s step %" PRIu64 ": the mesh is decoding the bad chunks from parity; "
			 "ask again", j->name, step);
		return SNAP_EBUSY;
	}
	if (done == 1 && !hrc)
		pmsg[0] = 0;
	*before = c->heal_bad;   /* NULL when the mesh could not run it */
	c->heal_bad = NULL;
	if (*before && c->heal_n < j->nranks) {
		/* ranks the request did not know of: none of them were counted */
		uint32_t *q = realloc(*before, j->nranks * sizeof(**before));
		if (q)
			memset(q + c->heal_n, 0, (j->nranks - c->heal_n) * sizeof(*q));
		else
			free(*before);
		*before = q;
	}
	return 1;
}

/*
 * REPAIR: verify a step's committed slots against their manifests and
 * repair what another level holds: on a mesh the protected step's parity
 * first (repair_mesh_level), then the flush (repair.c). One rank's, asked
 * by a trainer whose restore found a bad chunk, or every rank's (snaptool
 * verify --repair). A slot left damaged is withdrawn: the step is no longer
 * restorable, and the newest restorable step is an older one. On a mesh it
 * is given up instead (snap_mesh_give_up): the next agreement no longer
 * counts the step, with the same effect on every node.
 */
static int on_repair(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, char *err)
{
	char job[SNAP_JOB_MAX + 1];
	snap_get_str(r, job, sizeof(job));
	uint32_t rank = snap_get_u32(r);
	uint64_t step = snap_get_u64(r);
	if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job)) {
		snap_fmt(err, SMP_ERRLEN, "malformed REPAIR");
		return SNAP_EPROTO;
	}
	struct store_job *j = snap_store_job(m->store, job, 0);
	if (!j) {
		snap_fmt(err, SMP_ERRLEN, "repair: store %s holds no job %s", m->store->root, job);
		return SNAP_ENOENT;
	}
	if (step == SNAP_STEP_LATEST && snap_store_latest(m->store, j, &step) != 0) {
		snap_fmt(err, SMP_ERRLEN, "repair: job %s has no restorable step in store %s", job, m->store->root);
		return SNAP_ENOENT;
	}
	uint32_t *before = NULL;
	char pmsg[SMP_ERRLEN] = "";
	if (m->mesh) {
		int rc = repair_mesh_level(m, c, j, rank, step, &before, pmsg, sizeof(pmsg), err);
		if (rc != 1)
			return rc;
	}
	uint32_t checked = 0, bad = 0, fixed = 0, withdrawn = 0, mended = 0, by_parity = 0;
	char how[SMP_ERRLEN] = "";
	for (uint32_t k = 0; k < j->nranks; k++) {
		struct store_rank *rk = j->ranks[k];
		uint32_t slot;
		if (!rk || (rank != UINT32_MAX && rk->rank != rank) || !snap_store_find(m->store, rk, step, &slot))
			continue;
		struct smp_repair_out o;
		char e[SMP_ERRLEN];
		const char *who = c->job ? "a restore found it" : "asked by a tool";
		int rc = m->mesh ? smp_repair_after_parity(m->cfg, m->store, j, rk, slot, who, before ? before[k] : 0, pmsg,
							    &m->heal, &o, e, sizeof(e))
				 : smp_repair_slot(m->cfg, m->store, j, rk, slot, who, 0, &m->heal, &o, e, sizeof(e));
		if (rc && rc != SNAP_ECORRUPT) {
			free(before);
			snap_fmt(err, SMP_ERRLEN, "repair of job %s rank %u step %" PRIu64 ": %s", job, rk->rank, step, e);
			return rc;
		}
		checked++;
		bad += o.bad;
		fixed += o.repaired;
		by_parity += o.by_parity;
		withdrawn += rc != 0;
		mended += o.mended;
		if (m->mesh)
			snap_mesh_give_up(m->mesh, job, rk->rank, step, rk->slots[slot].man.gen, rc != 0);
		size_t used = strlen(how);
		if (o.how[0] && used + 2 < sizeof(how))
			snprintf(how + used, sizeof(how) - used, "%srank %u: %s", used ? "; " : "", rk->rank, o.how);
	}
	free(before);
	if (!checked) {
		snap_fmt(err, SMP_ERRLEN, "repair: job %s has no committed step %" PRIu64 "%s in store %s", job, step,
			 rank == UINT32_MAX ? "" : " of that rank", m->store->root);
		return SNAP_ENOENT;
	}
	snap_put_u64(out, step);
	snap_put_u32(out, checked);
	snap_put_u32(out, bad);
	snap_put_u32(out, fixed);
	snap_put_u32(out, withdrawn);
	snap_put_u32(out, mended);
	snap_put_str(out, how[0] ? how : "every chunk intact");   /* a wire string is never empty */
	snap_put_u32(out, by_parity);
	return 0;
}

void smp_dispatch(struct smp *m, struct conn *c, const struct snap_msg_hdr *h, const uint8_t *payload)
{
	struct snap_rbuf r;
	struct snap_wbuf out = { 0 };
	char err[SMP_ERRLEN] = "";
	int fd = -1, rc, deferred = 0;
	snap_rbuf_init(&r, payload, h->len);
	if (h->type == SNAP_MSG_FLUSH) {
		rc = persist_on_flush_msg(m, c, &r, err, &deferred);
	} else if (h->type >= SNAP_MSG_FATTACH && h->type <= SNAP_MSG_FFLUSH) {
		rc = snap_files_dispatch(m, c, h->type, &r, &out, err, SMP_ERRLEN, &deferred);
	} else if (h->type == SNAP_MSG_STATUS) {
		/* The daemon's own budget, for snaptool status (its defaults are not ours). */
		rc = 0;
		if (snap_rbuf_left(&r)) {
			snap_fmt(err, SMP_ERRLEN, "STATUS carries a payload");
			rc = SNAP_EPROTO;
		}
		snap_put_u64(&out, m->store->mem_limit);
		snap_put_u64(&out, m->store->mem_used);
		snap_put_u32(&out, m->store->nslots);
		snap_put_u32(&out, (uint32_t)getpid());
		/* Pinned by the trainers connected now: part of mem_used, not more. */
		uint64_t pinned = 0;
		uint32_t pinners = 0;
		for (struct conn *k = m->conns; k; k = k->next) {
			if (k->dead)
				continue;
			pinned += k->pinned;
			pinners += k->pinned != 0;
		}
		snap_put_u64(&out, pinned);
		snap_put_u32(&out, pinners);
		/* Slot files still being reserved: counted in mem_used already. */
		snap_put_u32(&out, snap_store_reserving(m->store));
		snap_put_u64(&out, m->heal.repaired_chunks);
		snap_put_u64(&out, m->heal.damaged_steps);
		snap_put_u64(&out, m->heal.scrubbed_bytes);
		snap_put_u64(&out, m->heal.scrub_passes);
		snap_put_u64(&out, m->cfg->scrub_rate);
		/* A wire string is never empty. */
		snap_put_str(&out, m->heal.last_damage[0] ? m->heal.last_damage : "none");
		snap_put_u64(&out, m->heal.damaged_files);
	} else if (h->type == SNAP_MSG_REPAIR) {
		rc = on_repair(m, c, &r, &out, err);
	} else if (h->type != SNAP_MSG_HELLO && !c->job) {
		snap_fmt(err, SMP_ERRLEN, "send HELLO first");
		rc = SNAP_EPROTO;
	} else {
		switch (h->type) {
		case SNAP_MSG_HELLO: rc = on_hello(m, c, &r, &out, err); break;
		case SNAP_MSG_REGISTER: rc = on_register(m, c, &r, err); break;
		case SNAP_MSG_ACQUIRE: rc = on_acquire(m, c, &r, &out, &fd, err); break;
		case SNAP_MSG_COMMIT: rc = on_commit(m, c, &r, 0, err); break;
		case SNAP_MSG_RECOMMIT: rc = on_commit(m, c, &r, 1, err); break;
		case SNAP_MSG_LATEST: {
			uint64_t step;
			rc = snap_mesh_job_error(m->mesh, c->job->name, err, SMP_ERRLEN);
			if (rc == 0)
				rc = snap_store_latest(m->store, c->job, &step);
			if (rc == SNAP_ELOST)
				break;
			if (rc == 0)
				snap_put_u64(&out, step);
			else
				snap_fmt(err, SMP_ERRLEN, "job %s has no step committed by all of its ranks", c->job->name);
			break;
		}
		case SNAP_MSG_RESTORE: rc = on_restore(m, c, &r, &out, &fd, err); break;
		default:
			snap_fmt(err, SMP_ERRLEN, "unknown message type %u", h->type);
			rc = SNAP_EPROTO;
		}
	}
	if (rc == 0 && out.oom) {
		rc = SNAP_ENOMEM;
		snap_fmt(err, SMP_ERRLEN, "snapsmp is out of memory");
	}
	if (rc == 0 && deferred) {
		/* answered when the flush ends (persist_collect) */
	} else if (rc == 0) {
		if (smp_reply_ok(c->fd, h->type, &out, fd) != 0)
			smp_close_conn(m, c);
	} else {
		if (rc != SNAP_EBUSY)
			smp_metrics_count(SMP_CNT_REQ_ERRORS, NULL);
		if (rc != SNAP_EBUSY && !names_job(c, err))
			smp_say(m, "%s%s: %s", c->job ? "job " : c->fjob ? "captured files" : "peer", c->job ? c->job->name : "",
			    err);
		else if (rc != SNAP_EBUSY)
			smp_say(m, "%s", err);   /* it begins "job NAME" already */
		smp_reply_err(c->fd, h->type, rc, err);
		if (rc == SNAP_EPROTO || rc == SNAP_EFORMAT)
			smp_close_conn(m, c);
	}
	if (fd >= 0)
		close(fd);
	snap_wbuf_free(&out);
}
