/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Slot policy: which step is restorable, which slot a new save may
 * overwrite, and the commit that publishes a manifest. Retention rule: a
 * save may overwrite a committed step only if a newer step is restorable
 * (committed by every rank of the job); never a slot being written or one
 * pinned by a reader. So the newest restorable step and everything newer
 * (which may yet become restorable) survive. With two slots per rank a fast
 * rank waits (EBUSY) at step s+1 until every rank has committed s; a third
 * slot lets it run one more step ahead.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store/reserve.h"
#include "snap/base.h"
#include "snap/snap.h"   /* SNAP_STEP_LATEST */
#include "snap/store.h"

/* Unlink slot i's manifest (first: from then on a crash finds a free slot), then free it. */
static int drop_slot(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i, char *err,
		     size_t errlen)
{
	char mp[SNAP_FILE_MAX];
	snap_store_path(s, j->name, r->rank, i, 1, mp, sizeof(mp));
	if (unlink(mp) != 0 && errno != ENOENT) {
		snap_fmt(err, errlen, "cannot withdraw manifest %s: %s", mp, strerror(errno));
		return SNAP_EIO;
	}
	snap_store_slot_clear(&r->slots[i]);
	return 0;
}

/* Make a committed slot free again, outside the normal recycling: logged. */
static int withdraw(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i, const char *why,
		    char *err, size_t errlen)
{
	struct store_slot *sl = &r->slots[i];
	snap_store_logf(s, "job %s rank %u: withdrew step %" PRIu64 " (generation %" PRIu64 "): %s%s", j->name, r->rank,
			sl->step, sl->man.gen, why, sl->refs ? " (its slot is freed when its reader is done)" : "");
	if (!sl->refs)
		return drop_slot(s, j, r, i, err, errlen);
	/*
	 * A protect or flush is reading it. Failing here made a restore that
	 * raced an encode fail outright. Unlink the manifest now (a crash from
	 * here on finds the step withdrawn) and keep the slot out of every
	 * count and choice until snap_store_unref() frees it.
	 */
	char mp[SNAP_FILE_MAX];
	snap_store_path(s, j->name, r->rank, i, 1, mp, sizeof(mp));
	if (unlink(mp) != 0 && errno != ENOENT) {
		snap_fmt(err, errlen, "cannot withdraw manifest %s: %s", mp, strerror(errno));
		return SNAP_EIO;
	}
	sl->superseded = 1;
	return 0;
}

int snap_store_withdraw(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i, const char *why,
			char *err, size_t errlen)
{
	return withdraw(s, j, r, i, why, err, errlen);
}

void snap_store_unref(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i)
{
	struct store_slot *sl = &r->slots[i];
	if (sl->refs && --sl->refs == 0 && sl->superseded)
		snap_store_slot_clear(sl);
	(void)s;
	(void)j;
}

/* Record j->gen in <root>/<job>/generation (tmp + rename); a failure costs
 * only the uniqueness of numbers across daemon restarts: logged. */
static void save_generation(struct snap_store *s, const struct store_job *j)
{
	if (s->read_only)
		return;
	char path[SNAP_FILE_MAX], tmp[SNAP_FILE_MAX + 8], text[32];
	snprintf(path, sizeof(path), "%s/%s/generation", s->root, j->name);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int n = snprintf(text, sizeof(text), "%" PRIu64 "\n", j->gen);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	int ok = fd >= 0 && write(fd, text, (size_t)n) == n;
	if (fd >= 0 && close(fd) != 0)
		ok = 0;
	if (!ok || rename(tmp, path) != 0) {
		snap_store_logf(s, "cannot record generation %" PRIu64 " of job %s in %s: %s", j->gen, j->name, path,
				strerror(errno));
		unlink(tmp);
	}
}

void snap_store_new_generation(struct snap_store *s, struct store_job *j)
{
	j->gen++;
	save_generation(s, j);
}

void snap_store_set_generation(struct snap_store *s, struct store_job *j, uint64_t gen)
{
	j->gen = gen;
	save_generation(s, j);
}

int snap_store_rewind(struct snap_store *s, struct store_job *j, int has_base, uint64_t base, char *err,
		      size_t errlen)
{
	for (uint32_t k = 0; k < j->nranks; k++) {
		struct store_rank *r = j->ranks[k];
		for (uint32_t i = 0; r && i < s->nslots; i++) {
			const struct store_slot *sl = &r->slots[i];
			if (sl->state != SLOT_COMMITTED || sl->superseded || sl->man.gen >= j->gen ||
			    (has_base && sl->step <= base))
				continue;
			int rc = withdraw(s, j, r, i, "an older incarnation's step past the restored one", err, errlen);
			if (rc)
				return rc;
		}
	}
	if (s->mesh && j->rewound_gen != j->gen) {
		/* The first rewind of this incarnation here: tell every node. */
		if (!has_base)
			j->news = 2;
		else if (j->news != 2 && (j->news == 0 || base < j->news_base)) {
			j->news = 1;
			j->news_base = base;
		}
		j->rewound_gen = j->gen;
	}
	return 0;
}

int snap_store_slot_current(const struct store_job *j, const struct store_rank *r, const struct store_slot *sl)
{
	return r->conn && sl->man.gen == j->gen;
}

unsigned snap_store_supersede(struct snap_store *s, struct store_job *j, int has_base, uint64_t base,
			      int same_launch)
{
	unsigned n = 0;
	char err[256];
	for (uint32_t k = 0; k < j->nranks; k++) {
		struct store_rank *r = j->ranks[k];
		for (uint32_t i = 0; r && i < s->nslots; i++) {
			struct store_slot *sl = &r->slots[i];
			if (sl->state != SLOT_COMMITTED || sl->superseded || (has_base && sl->step <= base) ||
			    snap_store_slot_current(j, r, sl) || (same_launch && sl->man.gen == j->gen))
				continue;
			if (withdraw(s, j, r, i, "a dead incarnation's step past the step its successor restored", err,
				     sizeof(err)) != 0)
				snap_store_logf(s, "job %s rank %u: %s", j->name, r->rank, err);
			else
				n++;
		}
	}
	return n;
}

struct store_slot *snap_store_find(const struct snap_store *s, struct store_rank *r, uint64_t step, uint32_t *slot)
{
	for (uint32_t i = 0; r && i < s->nslots; i++) {
		if (r->slots[i].state == SLOT_COMMITTED && !r->slots[i].superseded && r->slots[i].step == step) {
			if (slot)
				*slot = i;
			return &r->slots[i];
		}
	}
	return NULL;
}

int snap_store_latest(const struct snap_store *s, const struct store_job *j, uint64_t *step)
{
	if (s->mesh) {
		/* Only a global agreement can tell (smp/mesh/mesh.c); retention follows it too. */
		if (!j->mesh_has_latest)
			return SNAP_ENOENT;
		*step = j->mesh_latest;
		return 0;
	}
	struct store_rank *r0 = j->nranks ? j->ranks[0] : NULL;
	int found = 0;
	for (uint32_t i = 0; r0 && i < s->nslots; i++) {
		const struct store_slot *c = &r0->slots[i];
		if (c->state != SLOT_COMMITTED || c->superseded || (found && c->step <= *step))
			continue;
		uint32_t world = c->man.world, r;
		for (r = 1; r < world; r++) {
			struct store_rank *rk = r < j->nranks ? j->ranks[r] : NULL;
			struct store_slot *o = snap_store_find(s, rk, c->step, NULL);
			if (!o || o->man.world != world)
				break;
		}
		if (r == world) {
			*step = c->step;
			found = 1;
		}
	}
	return found ? 0 : SNAP_ENOENT;
}

/* A reservation has ended: on failure the slot is empty again and its
 * bytes go back to the budget; the save that picks it tries once more, in
 * its ACQUIRE, and reports why. */
static void reserved(struct snap_store *s, const struct store_job *j, const struct store_rank *r, uint32_t i, int e)
{
	struct store_slot *sl = &r->slots[i];
	sl->resv = 0;
	if (!e)
		return;
	snap_store_logf(s, "job %s rank %u: could not reserve %" PRIu64 " bytes for slot %u in the background: %s%s",
			j->name, r->rank, sl->size, i, strerror(e), e == ENOSPC ? " (the store is full)" : "");
	s->mem_used -= sl->size < s->mem_used ? sl->size : s->mem_used;
	sl->size = 0;
}

/* Wait for slot i's reservation, if one is under way. */
static void settle(struct snap_store *s, const struct store_job *j, const struct store_rank *r, uint32_t i)
{
	if (r->slots[i].resv)
		reserved(s, j, r, i, snap_reserver_wait(s->resv, r->slots[i].resv));
}

void snap_store_reap(struct snap_store *s)
{
	uint64_t t;
	int e;
	while (s && s->resv && snap_reserver_take(s->resv, &t, &e)) {
		for (struct store_job *j = s->jobs; j; j = j->next)
			for (uint32_t k = 0; k < j->nranks; k++)
				for (uint32_t i = 0; j->ranks[k] && i < s->nslots; i++)
					if (j->ranks[k]->slots[i].resv == t)
						reserved(s, j, j->ranks[k], i, e);
	}
}

unsigned snap_store_reserving(struct snap_store *s)
{
	unsigned n = 0;
	snap_store_reap(s);
	for (struct store_job *j = s->jobs; j; j = j->next)
		for (uint32_t k = 0; k < j->nranks; k++)
			for (uint32_t i = 0; j->ranks[k] && i < s->nslots; i++)
				n += j->ranks[k]->slots[i].resv != 0;
	return n + s->ahead;
}

/* Resize a slot file to `bytes` and reserve its memory (no SIGBUS later). */
static int size_slot(struct snap_store *s, const struct store_job *j, struct store_rank *r, uint32_t i,
		     uint64_t bytes, char *err, size_t errlen)
{
	struct store_slot *sl = &r->slots[i];
	char path[SNAP_FILE_MAX];
	settle(s, j, r, i);
	snap_store_path(s, j->name, r->rank, i, 0, path, sizeof(path));
	int e = snap_reserve_file(path, bytes);
	if (e == ENOSPC)
		snap_fmt(err, errlen, "store %s is full: cannot reserve %" PRIu64 " bytes for %s: %s", s->root, bytes,
			 path, strerror(e));
	else if (e)
		snap_fmt(err, errlen, "cannot reserve %" PRIu64 " bytes for slot file %s: %s", bytes, path, strerror(e));
	if (e)
		bytes = 0;   /* snap_reserve_file left it empty */
	s->mem_used = s->mem_used - sl->size + bytes;
	sl->size = bytes;
	return e == ENOSPC ? SNAP_ENOSPC : e ? SNAP_EIO : 0;
}

/* size_slot by the reservation thread; the bytes count from now on. */
static int size_slot_later(struct snap_store *s, const struct store_job *j, struct store_rank *r, uint32_t i,
			   uint64_t bytes, char *err, size_t errlen)
{
	struct store_slot *sl = &r->slots[i];
	char path[SNAP_FILE_MAX];
	uint64_t t;
	settle(s, j, r, i);
	snap_store_path(s, j->name, r->rank, i, 0, path, sizeof(path));
	if ((!s->resv && !(s->resv = snap_reserver_new())) || snap_reserver_submit(s->resv, path, bytes, &t))
		return size_slot(s, j, r, i, bytes, err, errlen);
	s->mem_used = s->mem_used - sl->size + bytes;
	sl->size = bytes;
	sl->resv = t;
	return 0;
}

int snap_store_register(struct snap_store *s, struct store_job *j, struct store_rank *r,
			struct snap_layout *lay, char *err, size_t errlen)
{
	uint64_t mine = 0, need = 0;
	snap_store_reap(s);
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct store_slot *sl = &r->slots[i];
		mine += sl->size;
		need += sl->state == SLOT_COMMITTED && sl->size > lay->slot_bytes ? sl->size : lay->slot_bytes;
	}
	if (s->mem_used - mine + need > s->mem_limit) {
		snap_fmt(err, errlen, "job %s rank %u needs %u slots x %" PRIu64 " bytes; that would exceed the memory budget"
			 " SNAP_MEM_LIMIT=%" PRIu64 " (%" PRIu64 " bytes already used by other ranks)", j->name, r->rank,
			 s->nslots, lay->slot_bytes, s->mem_limit, s->mem_used - mine);
		return SNAP_ENOSPC;
	}
	for (uint32_t i = 0; i < s->nslots; i++) {
		struct store_slot *sl = &r->slots[i];
		if (sl->size == lay->slot_bytes && lay->slot_bytes)
			j->slots_reused++;   /* a relaunch with the same layout: its file is ready */
		if (sl->state == SLOT_COMMITTED || sl->size == lay->slot_bytes)
			continue;
		/* a free slot's file is reserved in the background */
		int rc = (sl->state == SLOT_FREE ? size_slot_later : size_slot)(s, j, r, i, lay->slot_bytes, err, errlen);
		if (rc)
			return rc;
		j->slots_precreated += sl->state == SLOT_FREE && sl->resv != 0;
	}
	snap_layout_free(&r->layout);
	r->layout = *lay;
	r->has_layout = 1;
	memset(lay, 0, sizeof(*lay));
	return 0;
}

/*
 * Saving step s continues a timeline at s: this rank's committed steps >= s
 * belong to a timeline a restore abandoned, and so do other ranks' steps >= s
 * from older generations.
 */
static int continue_timeline(struct snap_store *s, struct store_job *j, struct store_rank *r, uint64_t step,
			     char *err, size_t errlen)
{
	int rc = snap_store_rewind(s, j, 1, step - 1, err, errlen);
	for (uint32_t i = 0; !rc && i < s->nslots; i++)
		if (r->slots[i].state == SLOT_COMMITTED && !r->slots[i].superseded && r->slots[i].step >= step)
			rc = withdraw(s, j, r, i, "a save of the same or an older step", err, errlen);
	return rc;
}

int snap_store_acquire(struct snap_store *s, struct store_job *j, struct store_rank *r, uint64_t step,
		       void *owner, uint32_t *slot, int *fd, char *err, size_t errlen)
{
	if (!r->has_layout) {
		snap_fmt(err, errlen, "job %s rank %u: REGISTER a layout before the first save", j->name, r->rank);
		return SNAP_EPROTO;
	}
	snap_store_reap(s);
	int rc = continue_timeline(s, j, r, step, err, errlen);
	if (rc)
		return rc;
	uint64_t latest = 0;
	int have_latest = snap_store_latest(s, j, &latest) == 0;
	/* A free slot whose file is reserved first, then one being reserved, then
	 * one without its file (a failed reservation: a full store would refuse
	 * it again while another slot holds the room), then the oldest step. */
	int best = -1, best_rank = 4;
	for (uint32_t i = 0; i < s->nslots; i++) {
		const struct store_slot *sl = &r->slots[i];
		if (sl->state == SLOT_WRITING || sl->refs)
			continue;
		/* Only a step older than a restorable one may go: anything newer
		 * may still become the job's restorable step. */
		if (sl->state == SLOT_COMMITTED && !(have_latest && sl->step < latest))
			continue;
		int rank = sl->state == SLOT_COMMITTED ? 3 : sl->size != r->layout.slot_bytes ? 2 : sl->resv ? 1 : 0;
		if (rank < best_rank || (rank == 3 && best_rank == 3 && sl->step < r->slots[best].step)) {
			best = (int)i;
			best_rank = rank;
		}
	}
	if (best < 0) {
		snap_fmt(err, errlen, "no free slot for job %s rank %u: its %u slots hold steps not older than the "
			 "newest restorable one, or are being written; waiting for the other ranks to commit",
			 j->name, r->rank, s->nslots);
		return SNAP_EBUSY;
	}
	struct store_slot *sl = &r->slots[best];
	char path[SNAP_FILE_MAX];
	snap_store_path(s, j->name, r->rank, (uint32_t)best, 0, path, sizeof(path));
	if ((rc = drop_slot(s, j, r, (uint32_t)best, err, errlen)))
		return rc;
	/* Its file not reserved yet: this save pays for what REGISTER was
	 * meant to have done ahead of it. */
	j->slots_late += sl->resv != 0 || sl->size != r->layout.slot_bytes;
	settle(s, j, r, (uint32_t)best);
	if (sl->size != r->layout.slot_bytes) {
		int rc = size_slot(s, j, r, (uint32_t)best, r->layout.slot_bytes, err, errlen);
		if (rc)
			return rc;
	}
	*fd = open(path, O_RDWR | O_CLOEXEC);
	if (*fd < 0) {
		snap_fmt(err, errlen, "cannot open slot file %s: %s", path, strerror(errno));
		return SNAP_EIO;
	}
	sl->state = SLOT_WRITING;
	sl->step = step;
	sl->owner = owner;
	*slot = (uint32_t)best;
	return 0;
}

void snap_store_release_owner(const struct snap_store *s, struct store_rank *r, void *owner)
{
	for (uint32_t i = 0; i < s->nslots; i++)
		if (r->slots[i].state == SLOT_WRITING && r->slots[i].owner == owner)
			r->slots[i].state = SLOT_FREE;
}

/* Recompute every chunk's CRC from the slot file (SNAP_VERIFY_COMMIT). */
static int verify_slot(const char *path, const struct snap_layout *lay, const uint32_t *crc, const uint32_t *len,
		       char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		snap_fmt(err, errlen, "cannot open %s: %s", path, strerror(errno));
		return SNAP_EIO;
	}
	const uint8_t *p = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : NULL;
	close(fd);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map %s: %s", path, strerror(errno));
		return SNAP_EIO;
	}
	int rc = 0;
	uint32_t bad;
	if (snap_layout_verify(lay, p, crc, len, &bad)) {
		struct snap_chunk c;
		snap_layout_chunk(lay, bad, &c);
		snap_fmt(err, errlen, "region \"%s\" chunk %u: data does not match the CRC the trainer sent", c.g->name,
			 c.index);
		rc = SNAP_ECORRUPT;
	}
	if (p)
		munmap((void *)p, lay->slot_bytes);
	return rc;
}

static int write_file(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			int e = n < 0 ? errno : ENOSPC;
			close(fd);
			errno = e;
			return -1;
		}
		p += n;
		len -= (size_t)n;
	}
	return close(fd);
}

int snap_store_commit(struct snap_store *s, struct store_job *j, struct store_rank *r, void *owner,
		      uint32_t slot, uint64_t step, const uint32_t *crc, const uint32_t *len, uint32_t ncrc,
		      int verify, char *err, size_t errlen)
{
	if (slot >= s->nslots || r->slots[slot].state != SLOT_WRITING || r->slots[slot].owner != owner ||
	    r->slots[slot].step != step) {
		snap_fmt(err, errlen, "commit of step %" PRIu64 " into slot %u: that slot was not acquired for this step",
			 step, slot);
		return SNAP_EPROTO;
	}
	struct store_slot *sl = &r->slots[slot];
	if (!r->has_layout || ncrc != r->layout.ncrc) {
		snap_fmt(err, errlen, "commit of step %" PRIu64 ": %u checksums sent, layout has %u chunks", step, ncrc,
			 r->layout.ncrc);
		sl->state = SLOT_FREE;
		return SNAP_EPROTO;
	}
	char path[SNAP_FILE_MAX], mpath[SNAP_FILE_MAX], tmp[SNAP_FILE_MAX + 8];
	snap_store_path(s, j->name, r->rank, slot, 0, path, sizeof(path));
	snap_store_path(s, j->name, r->rank, slot, 1, mpath, sizeof(mpath));
	snprintf(tmp, sizeof(tmp), "%s.tmp", mpath);
	int rc = snap_layout_check_lens(&r->layout, len, err, errlen);
	if (!rc && verify)
		rc = verify_slot(path, &r->layout, crc, len, err, errlen);
	if (rc) {
		sl->state = SLOT_FREE;
		return rc;
	}
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	struct snap_manifest m = {
		.rank = r->rank, .world = j->world, .step = step, .slot = slot,
		.wall_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec, .gen = j->gen,
		.layout = r->layout, .crc = (uint32_t *)crc, .len = (uint32_t *)len,
	};
	snprintf(m.job, sizeof(m.job), "%s", j->name);
	struct snap_wbuf w = { 0 };
	if ((rc = snap_manifest_encode(&m, &w))) {
		snap_fmt(err, errlen, "commit of step %" PRIu64 ": out of memory", step);
	} else if (write_file(tmp, w.p, w.len) != 0 || rename(tmp, mpath) != 0) {
		/* a full store: its slot files fit (reserved), the manifest not */
		int full = errno == ENOSPC;
		snap_fmt(err, errlen, "%s%s%scannot publish manifest %s: %s", full ? "store " : "", full ? s->root : "",
			 full ? " is full: " : "", mpath, strerror(errno));
		rc = full ? SNAP_ENOSPC : SNAP_EIO;
		unlink(tmp);
	} else {
		/* Keep a parsed copy (decoding is the simplest deep copy). */
		rc = snap_manifest_decode(w.p, w.len, &sl->man, err, errlen);
	}
	if (rc) {
		snap_wbuf_free(&w);
		sl->state = SLOT_FREE;
		return rc;
	}
	sl->state = SLOT_COMMITTED;
	sl->man_bytes = w.p;
	sl->man_len = (uint32_t)w.len;
	sl->owner = NULL;
	return 0;
}

int snap_store_recommit(struct snap_store *s, struct store_job *j, struct store_rank *r, void *owner,
			uint32_t slot, uint64_t step, const uint32_t *crc, const uint32_t *len, uint32_t ncrc,
			int verify, char *err, size_t errlen)
{
	if (slot >= s->nslots || !r->has_layout || step == SNAP_STEP_LATEST) {
		snap_fmt(err, errlen, "recommit of step %" PRIu64 " into slot %u: no such slot, or no layout registered",
			 step, slot);
		return SNAP_EPROTO;
	}
	struct store_slot *sl = &r->slots[slot];
	settle(s, j, r, slot);
	if (sl->state == SLOT_COMMITTED && sl->step == step && sl->man.gen == j->gen && ncrc == sl->man.layout.ncrc &&
	    memcmp(crc, sl->man.crc, ncrc * sizeof(*crc)) == 0 && memcmp(len, sl->man.len, ncrc * sizeof(*len)) == 0)
		return 0;   /* the dead daemon published it before it died */
	if (sl->state != SLOT_FREE || sl->refs || sl->size != r->layout.slot_bytes) {
		snap_fmt(err, errlen, "recommit of step %" PRIu64 " into slot %u: the slot was handed out or committed "
			 "since; the step is lost on this rank", step, slot);
		return SNAP_ESTATE;
	}
	int rc = continue_timeline(s, j, r, step, err, errlen);
	if (rc)
		return rc;
	sl->state = SLOT_WRITING;
	sl->step = step;
	sl->owner = owner;
	return snap_store_commit(s, j, r, owner, slot, step, crc, len, ncrc, verify, err, errlen);
}

int snap_store_open_slot(struct snap_store *s, const struct store_job *j, const struct store_rank *r,
			 uint32_t slot, char *err, size_t errlen)
{
	char path[SNAP_FILE_MAX];
	snap_store_path(s, j->name, r->rank, slot, 0, path, sizeof(path));
	struct stat st;
	char why[128];
	int fd = snap_store_open_regular(path, O_RDONLY, &st, why, sizeof(why));
	if (fd < 0) {
		snap_fmt(err, errlen, "slot file %s is unusable: %s", path, why[0] ? why : "missing");
		return SNAP_ECORRUPT;
	}
	if ((uint64_t)st.st_size < r->slots[slot].man.layout.slot_bytes) {
		snap_fmt(err, errlen, "slot file %s is truncated: %" PRIu64 " of %" PRIu64 " bytes", path,
			 (uint64_t)st.st_size, r->slots[slot].man.layout.slot_bytes);
		close(fd);
		return SNAP_ECORRUPT;
	}
	return fd;
}
