/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The scrub on a mesh node (--ec): what scrub.c finds in the slots is
 * repaired from the mesh's parity first, then from the flush, as a restore
 * does (requests.c); and the node's parity pieces of each job's protected
 * step are checked too, one piece at a time, against the CRC32C their
 * erasure-coding record holds for each (ec/'s meta: one per chunk of every
 * parity row). A bad parity piece is rebuilt from the group's data by the
 * same repair.
 *
 * The repair from parity runs on the mesh threads in the next agreement
 * round (meshheal.c); the scrub, on the event loop's thread, does not wait
 * for it: it pauses (smp_mesh_scrub_busy) and finishes the repair when the
 * mesh is done. A copy no level repairs is given up (snap_mesh_give_up):
 * the agreement stops counting its step, nothing is withdrawn.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mesh/mesh.h"
#include "heal/meshscrub.h"
#include "snap/ec.h"
#include "snap/meshfiles.h"
#include "smp_internal.h"

struct smp_mesh_scrub {
	/* a repair from parity under way: 1 a slot's chunks, 2 a parity piece */
	int pending;
	char job[SNAP_JOB_MAX + 1];
	uint32_t rank, slot, before;
	uint64_t step, gen, ticket;
	int row;                      /* pending 2: the piece */
	uint32_t q;
	/* the parity cursor: job ordinal, its protected step's record, piece */
	uint32_t job_ord;
	struct snap_ec_meta *meta;
	char meta_job[SNAP_JOB_MAX + 1];
	uint64_t meta_step;
	int p_row;
	uint32_t p_q;
	uint64_t pass;                /* scrub_passes when its next parity pass may begin */
	/* the parity of this step could not be repaired: not asked again */
	char failed_job[SNAP_JOB_MAX + 1];
	uint64_t failed_step;
};

static struct smp_mesh_scrub *state(struct smp *m)
{
	if (!m->mscrub)
		m->mscrub = calloc(1, sizeof(*m->mscrub));
	return m->mscrub;
}

void smp_mesh_scrub_free(struct smp *m)
{
	if (!m->mscrub)
		return;
	snap_ec_meta_free(m->mscrub->meta);
	free(m->mscrub);
	m->mscrub = NULL;
}

/* The flush and the verdict for a slot, `before` chunks bad before the
 * parity ran (pmsg: why the parity could not). */
static void finish_slot(struct smp *m, struct store_job *j, struct store_rank *r, uint32_t slot, uint32_t before,
			const char *pmsg)
{
	struct smp_repair_out o;
	char err[SMP_ERRLEN];
	int rc = smp_repair_after_parity(m->cfg, m->store, j, r, slot, "scrub", before, pmsg, &m->heal, &o, err,
					 sizeof(err));
	if (rc && rc != SNAP_ECORRUPT) {
		smp_logf(&m->log, SMP_LOG_WARN, "scrub: %s", err);
		return;
	}
	snap_mesh_give_up(m->mesh, j->name, r->rank, o.step, r->slots[slot].man.gen, rc != 0);
}

void smp_mesh_scrub_bad(struct smp *m, struct store_job *j, struct store_rank *r, uint32_t slot)
{
	struct smp_mesh_scrub *ms = state(m);
	struct store_slot *sl = &r->slots[slot];
	uint32_t before = 0;
	char err[SMP_ERRLEN] = "", pmsg[SMP_ERRLEN] = "";
	int hrc = 0;
	if (!ms || ms->pending || smp_repair_count(m->store, j, r, slot, &before, err, sizeof(err)) != 0) {
		finish_slot(m, j, r, slot, 0, "");
		return;
	}
	uint64_t ticket = 0;
	int done = snap_mesh_heal(m->mesh, j->name, sl->step, &ticket, &hrc, pmsg, sizeof(pmsg));
	if (done != 0) {
		/* not the protected step: the flush is the one other level */
		finish_slot(m, j, r, slot, 0, "");
		return;
	}
	ms->pending = 1;
	snprintf(ms->job, sizeof(ms->job), "%s", j->name);
	ms->rank = r->rank;
	ms->slot = slot;
	ms->before = before;
	ms->step = sl->step;
	ms->gen = sl->man.gen;
	ms->ticket = ticket;
}

/* Read piece (off, len) of the parity file and check it: 1 good, 0 bad. */
static int piece_ok(int fd, uint64_t off, uint64_t len, uint32_t crc, uint8_t *buf, size_t cap, uint64_t *read)
{
	uint32_t c = 0;
	for (uint64_t done = 0; done < len;) {
		size_t k = len - done < cap ? (size_t)(len - done) : cap;
		ssize_t n = fd < 0 ? 0 : pread(fd, buf, k, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		c = snap_crc32c_update(c, buf, (size_t)n);
		done += (uint64_t)n;
		*read += (uint64_t)n;
	}
	return c == crc;
}

static int check_piece(struct smp *m, const char *job, uint64_t step, const struct snap_ec_meta *meta, int row,
		       uint32_t q, uint8_t *buf, size_t cap, uint64_t *read)
{
	char path[SNAP_FILE_MAX];
	uint64_t off, len;
	uint32_t crc;
	if (snap_ec_meta_parity_piece(meta, row, q, &off, &len, &crc) != 0)
		return 1;
	mesh_ec_path(m->store->root, job, step, "parity", path, sizeof(path));
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	int ok = piece_ok(fd, off, len, crc, buf, cap, read);
	if (fd >= 0)
		close(fd);
	return ok;
}

int smp_mesh_scrub_busy(struct smp *m)
{
	struct smp_mesh_scrub *ms = m->mscrub;
	if (!ms || !ms->pending)
		return 0;
	int hrc = 0;
	char pmsg[SMP_ERRLEN] = "";
	int done = snap_mesh_heal(m->mesh, ms->job, ms->step, &ms->ticket, &hrc, pmsg, sizeof(pmsg));
	if (done == 0)
		return 1;
	if (done == 1 && !hrc)
		pmsg[0] = 0;
	int what = ms->pending;
	ms->pending = 0;
	struct store_job *j = snap_store_job(m->store, ms->job, 0);
	if (what == 2) {
		uint64_t read = 0;
		uint8_t buf[4096];
		int ok = ms->meta && !strcmp(ms->meta_job, ms->job) && ms->meta_step == ms->step &&
			 check_piece(m, ms->job, ms->step, ms->meta, ms->row, ms->q, buf, sizeof(buf), &read);
		if (ok) {
			m->heal.repaired_chunks++;
			smp_logf(&m->log, SMP_LOG_WARN, "scrub: job %s step %" PRIu64 ": parity row %d chunk %u repaired "
				 "from parity (the mesh decoded it from the group's data)", ms->job, ms->step, ms->row, ms->q);
		} else {
			smp_logf(&m->log, SMP_LOG_WARN, "scrub: job %s step %" PRIu64 ": parity row %d chunk %u is still "
				 "bad: %s; its parity is not checked again", ms->job, ms->step, ms->row, ms->q,
				 pmsg[0] ? pmsg : "the repair did not mend it");
			snprintf(ms->failed_job, sizeof(ms->failed_job), "%s", ms->job);
			ms->failed_step = ms->step;
		}
		return 0;
	}
	/* The slot, if it still holds that step of that generation. */
	struct store_rank *r = j && ms->rank < j->nranks ? j->ranks[ms->rank] : NULL;
	struct store_slot *sl = r && ms->slot < m->store->nslots ? &r->slots[ms->slot] : NULL;
	if (sl && sl->state == SLOT_COMMITTED && !sl->superseded && sl->step == ms->step && sl->man.gen == ms->gen)
		finish_slot(m, j, r, ms->slot, ms->before, pmsg);
	return 0;
}

static void next_job(struct smp_mesh_scrub *ms)
{
	ms->job_ord++;
	ms->p_row = 0;
	ms->p_q = 0;
}

uint64_t smp_mesh_scrub_parity(struct smp *m, uint8_t *buf, size_t cap)
{
	struct smp_mesh_scrub *ms = state(m);
	if (!ms || ms->pending || ms->pass > m->heal.scrub_passes)
		return 0;
	for (;;) {
		struct store_job *j = m->store->jobs;
		for (uint32_t k = ms->job_ord; j && k; k--)
			j = j->next;
		if (!j) {
			/* a parity pass ends; the next one after the slots' pass */
			ms->job_ord = 0;
			ms->p_row = 0;
			ms->p_q = 0;
			ms->pass = m->heal.scrub_passes + 1;
			return 0;
		}
		uint64_t prot;
		if (!snap_mesh_parity_step(m->mesh, j->name, &prot)) {
			next_job(ms);
			continue;
		}
		if (ms->failed_step == prot && !strcmp(ms->failed_job, j->name)) {
			next_job(ms);
			continue;
		}
		char rpath[SNAP_FILE_MAX];
		struct stat st;
		mesh_ec_path(m->store->root, j->name, prot, "rec", rpath, sizeof(rpath));
		if (stat(rpath, &st) != 0) {
			/* removed with the job's files: nothing to check or repair */
			snap_ec_meta_free(ms->meta);
			ms->meta = NULL;
			next_job(ms);
			continue;
		}
		if (!ms->meta || strcmp(ms->meta_job, j->name) || ms->meta_step != prot) {
			char why[256] = "";
			void *rb = NULL;
			size_t rl = 0;
			snap_ec_meta_free(ms->meta);
			ms->meta = NULL;
			if (mesh_read_file(rpath, 1u << 30, &rb, &rl) != 0 ||
			    snap_ec_meta_unpack(rb, rl, &ms->meta, why, sizeof(why)) != 0) {
				free(rb);
				/* The relaunch counts this node as lost for the step; a
				 * repair's rebuild writes the record back. */
				smp_logf(&m->log, SMP_LOG_WARN, "scrub: job %s step %" PRIu64 ": record %s unreadable (%s): "
					 "its parity is not checked", j->name, prot, rpath, why[0] ? why : strerror(errno));
				next_job(ms);
				return 4096;
			}
			free(rb);
			snprintf(ms->meta_job, sizeof(ms->meta_job), "%s", j->name);
			ms->meta_step = prot;
			ms->p_row = 0;
			ms->p_q = 0;
		}
		struct snap_ec_meta_info in;
		snap_ec_meta_info(ms->meta, &in);
		if (ms->p_q >= in.nchunks) {
			ms->p_q = 0;
			ms->p_row++;
		}
		if (ms->p_row >= in.m || !in.parity_len) {
			next_job(ms);
			continue;
		}
		int row = ms->p_row;
		uint32_t q = ms->p_q++;
		uint64_t read = 0;
		if (check_piece(m, j->name, prot, ms->meta, row, q, buf, cap, &read))
			return read ? read : 1;
		char pmsg[SMP_ERRLEN] = "";
		int hrc = 0;
		smp_logf(&m->log, SMP_LOG_WARN, "scrub: job %s step %" PRIu64 ": parity row %d chunk %u fails its CRC32C",
			 j->name, prot, row, q);
		ms->ticket = 0;
		if (snap_mesh_heal(m->mesh, j->name, prot, &ms->ticket, &hrc, pmsg, sizeof(pmsg)) == 0) {
			ms->pending = 2;
			snprintf(ms->job, sizeof(ms->job), "%s", j->name);
			ms->step = prot;
			ms->row = row;
			ms->q = q;
		}
		return read > 4096 ? read : 4096;
	}
}
