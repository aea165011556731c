/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The background scrub: snapsmp re-reads the committed slots it holds,
 * chunk by chunk, at --scrub-rate bytes per second, and checks each chunk
 * against its manifest's CRC32C, as ZFS scrubs and Ceph deep-scrubs do. A
 * bad chunk (a bit flipped in memory, a slot file truncated or deleted
 * behind the daemon's back) sends the slot to repair (repair.c): the chunk
 * is rewritten from the flush, or the step is withdrawn on that rank and
 * STATUS says why. Found now, the damage costs a repair; found at restore
 * time, it would cost the step.
 *
 * The scrub runs on the event loop's thread, a slice per poll round (at
 * most SCRUB_SLICE_MS worth of the rate at a time), reading each chunk
 * through the slot file's mapping under a SIGBUS guard (base/busguard.c: a
 * file truncated under a mapping raises SIGBUS; pread cost five times the
 * CRC's CPU time). The mappings are kept from pass to pass (store/slotmap.c):
 * with 4 KiB pages, mapping each chunk afresh spent over twice the CRC's
 * time filling and tearing down page tables (the captured files' too, up
 * to a cap: filescrub.c). Slots being written are
 * skipped. On a mesh (--ec) a bad chunk is repaired from
 * the mesh's parity first and the node's parity pieces are checked too
 * (meshscrub.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "files/files.h"
#include "heal/meshscrub.h"
#include "heal/scrub.h"
#include "mesh/mesh.h"
#include "smp_internal.h"
#include "store/slotmap.h"

#define SCRUB_SLICE_MS 10
#define SCRUB_BUF (256u << 10)   /* stays in L2 between the read and the CRC */
#define SCRUB_SWEEP_NS 1000000000ull   /* kept mappings of deleted slot files go within a second */

struct smp_scrub {
	uint64_t rate;                 /* bytes per second */
	uint64_t last_ns;
	int64_t credit;                /* bytes the rate allows now; negative: a big chunk's debt */
	int idle;                      /* the last look found no committed slot */
	uint32_t job, rank, slot, chunk;   /* the cursor: ordinals in the store's lists */
	uint64_t step;                 /* the step the cursor's slot held when it was reached */
	int held;                      /* the cursor names a slot */
	int fd;                        /* the cursor's slot file, when it could not be mapped */
	const uint8_t *map;            /* the cursor's slot file, kept mapped (maps) */
	uint64_t maplen;
	struct snap_slotmaps maps;
	struct snap_slotmaps fmaps;    /* the captured files' data, kept mapped up to a cap (filescrub.c) */
	uint64_t swept_ns;
	uint8_t *buf;
	unsigned seen;                 /* committed slots and captured files checked in this pass */
	int files;                     /* this pass is past the slots, at the captured files */
	int behind;                    /* the last slice ended with the rate's credit unspent */
};

struct smp_scrub *smp_scrub_new(struct smp *m)
{
	if (!m->cfg->scrub_rate)
		return NULL;
	struct smp_scrub *sc = calloc(1, sizeof(*sc));
	if (!sc || !(sc->buf = malloc(SCRUB_BUF))) {
		free(sc);
		smp_logf(&m->log, SMP_LOG_WARN, "scrub: out of memory; the node store is not scrubbed");
		return NULL;
	}
	/* Resident from the start: the daemon's memory must not grow later
	 * (the memory tests sample it save after save). */
	memset(sc->buf, 0, SCRUB_BUF);
	sc->rate = m->cfg->scrub_rate;
	smp_heal_guard_init();
	sc->fd = -1;
	/* The page tables fill as the rate reads the pages, a slice at a time,
	 * not a whole slot's at once on the thread that serves the trainers. */
	sc->maps.lazy = 1;
	snap_files_scrub_maps_init(&sc->fmaps);
	sc->slot = UINT32_MAX;   /* before the first */
	sc->last_ns = snap_now_ns();
	smp_say(m, "scrub: verifying committed slots at %.1f MiB/s (--scrub-rate)", sc->rate / 1048576.0);
	return sc;
}

void smp_scrub_free(struct smp_scrub *sc)
{
	if (!sc)
		return;
	if (sc->fd >= 0)
		close(sc->fd);
	snap_slotmaps_free(&sc->maps);
	snap_slotmaps_free(&sc->fmaps);
	free(sc->buf);
	free(sc);
}

int smp_scrub_timeout_ms(const struct smp_scrub *sc)
{
	/* Nothing to scrub: look again now and then, not every slice. Behind
	 * the rate: poll without sleeping (requests still wait at most one
	 * slice's 5 ms on the scrub). */
	return !sc ? -1 : sc->idle ? 1000 : sc->behind ? 0 : SCRUB_SLICE_MS;
}

static void drop(struct smp_scrub *sc)
{
	if (sc->fd >= 0)
		close(sc->fd);
	sc->fd = -1;
	sc->map = NULL;
	sc->held = 0;
	sc->chunk = 0;
}

/* The cursor's job (by ordinal), or NULL past the last. */
static struct store_job *nth_job(struct snap_store *s, uint32_t k)
{
	struct store_job *j = s->jobs;
	while (j && k--)
		j = j->next;
	return j;
}

/* Move to the next committed slot: 0 past the last one (the cursor goes
 * back to the first, for the next pass). */
static int advance(struct smp *m, struct smp_scrub *sc, int next)
{
	struct snap_store *s = m->store;
	drop(sc);
	for (;;) {
		if (next && ++sc->slot >= s->nslots) {
			sc->slot = 0;
			sc->rank++;
		}
		next = 1;
		struct store_job *j = nth_job(s, sc->job);
		if (!j) {
			/* Before the first slot: the next step forward lands on it. */
			sc->job = sc->rank = 0;
			sc->slot = UINT32_MAX;
			return 0;
		}
		if (sc->rank >= j->nranks) {
			sc->job++;
			sc->rank = sc->slot = 0;
			next = 0;
			continue;
		}
		struct store_rank *r = j->ranks[sc->rank];
		if (!r) {
			sc->slot = s->nslots - 1;
			continue;
		}
		const struct store_slot *sl = &r->slots[sc->slot];
		if (sl->state == SLOT_COMMITTED && !sl->superseded && sl->man.layout.ncrc) {
			sc->held = 1;
			sc->step = sl->step;
			sc->seen++;
			return 1;
		}
	}
}

/* Read chunk t's stored bytes and check them: 1 good, 0 bad (or unreadable). */
static int chunk_ok(struct smp_scrub *sc, const char *path, const struct snap_manifest *man, uint32_t t,
		    uint64_t *read)
{
	struct snap_chunk c;
	snap_layout_chunk(&man->layout, t, &c);
	uint32_t crc;
	int rc = -2;
	if (sc->map) {
		if (c.slot_off > sc->maplen || man->len[t] > sc->maplen - c.slot_off)
			return 0;
		rc = smp_heal_crc_mapped(sc->map + c.slot_off, man->len[t], &crc);
	}
	if (rc == -2)   /* not mapped, or no guard to read a mapping under */
		rc = sc->fd >= 0 || (sc->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) >= 0 ?
			smp_heal_crc(sc->fd, c.slot_off, man->len[t], sc->buf, SCRUB_BUF, &crc) : -1;
	if (rc)
		return 0;
	*read += man->len[t];
	return crc == man->crc[t];
}

/* The cursor's slot file, mapped (kept from earlier passes) or else open. */
static void open_slot(struct smp_scrub *sc, const char *path, uint64_t slot_bytes)
{
	char err[SNAP_FILE_MAX + 64];
	if (sc->map || sc->fd >= 0)
		return;
	if ((sc->map = snap_slotmap_get(&sc->maps, path, slot_bytes, err, sizeof(err))) != NULL)
		sc->maplen = slot_bytes;
	else
		sc->fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);   /* shorter, or unmappable: read it */
}

static void scrub_slice(struct smp *m, struct smp_scrub *sc);

void smp_scrub_tick(struct smp *m)
{
	struct smp_scrub *sc = m->scrub;
	if (!sc)
		return;
	scrub_slice(m, sc);
	/* No descriptor is held between slices: what the daemon has open stays
	 * what its trainers and flushes need (the memory tests compare it). */
	if (sc->fd >= 0)
		close(sc->fd);
	sc->fd = -1;
	uint64_t now = snap_now_ns();
	if (now - sc->swept_ns >= SCRUB_SWEEP_NS) {
		sc->swept_ns = now;
		sc->map = NULL;   /* looked up again: the sweep may drop it */
		snap_slotmaps_sweep(&sc->maps);
		snap_slotmaps_sweep(&sc->fmaps);
	}
}

/* The captured files' turn: 1 while there is more of this pass to do. */
static int files_turn(struct smp *m, struct smp_scrub *sc, uint64_t deadline)
{
	int wrapped = 0;
	uint64_t got = snap_files_scrub(m->files, &m->heal, &sc->fmaps, sc->buf, SCRUB_BUF, sc->credit, deadline,
					&wrapped, &sc->seen);
	sc->credit -= (int64_t)got;
	m->heal.scrubbed_bytes += got;
	if (!wrapped)
		return 1;
	/* A pass over the slots, then the files, is done. */
	sc->files = 0;
	sc->idle = sc->seen == 0;
	if (sc->seen)
		m->heal.scrub_passes++;
	sc->seen = 0;
	return !sc->idle;
}

static void scrub_slice(struct smp *m, struct smp_scrub *sc)
{
	uint64_t now = snap_now_ns(), dt = now - sc->last_ns;
	sc->last_ns = now;
	/* At most one slice's worth banked: an idle loop must not save up a
	 * burst. A chunk bigger than a slice is read whole and repaid later. */
	int64_t cap = (int64_t)(sc->rate / (1000 / SCRUB_SLICE_MS)) + 1;
	sc->credit += (int64_t)((double)sc->rate * (double)dt / 1e9);
	if (sc->credit > cap)
		sc->credit = cap;
	/* Whatever the rate, a slice ends after half a slice of wall time: the
	 * trainers' requests wait on this thread. */
	const uint64_t deadline = now + SCRUB_SLICE_MS * 500000ull;
	while (sc->credit > 0 && snap_now_ns() < deadline) {
		/* mesh: a repair from parity under way pauses the scrub; the
		 * parity pieces take their turn once a pass (meshscrub.c) */
		if (m->mesh && smp_mesh_scrub_busy(m))
			return;
		uint64_t pgot = m->mesh ? smp_mesh_scrub_parity(m, sc->buf, SCRUB_BUF) : 0;
		if (pgot) {
			sc->credit -= (int64_t)pgot;
			m->heal.scrubbed_bytes += pgot;
			continue;
		}
		if (sc->files) {
			if (!files_turn(m, sc, deadline))
				break;
			continue;
		}
		if (!sc->held && !advance(m, sc, 1)) {
			sc->files = 1;   /* the slots are done: the captured files' turn */
			continue;
		}
		sc->idle = 0;
		struct store_job *j = nth_job(m->store, sc->job);
		struct store_rank *r = j && sc->rank < j->nranks ? j->ranks[sc->rank] : NULL;
		struct store_slot *sl = r ? &r->slots[sc->slot] : NULL;
		if (!sl || sl->state != SLOT_COMMITTED || sl->superseded || sl->step != sc->step ||
		    sc->chunk >= sl->man.layout.ncrc) {
			drop(sc);   /* recycled under the cursor, or done */
			continue;
		}
		char path[SNAP_FILE_MAX];
		snap_store_path(m->store, j->name, r->rank, sc->slot, 0, path, sizeof(path));
		open_slot(sc, path, sl->man.layout.slot_bytes);
		uint64_t got = 0;
		int ok = chunk_ok(sc, path, &sl->man, sc->chunk, &got);
		sc->credit -= (int64_t)(got ? got : 4096);
		m->heal.scrubbed_bytes += got;
		if (ok) {
			sc->chunk++;
			continue;
		}
		struct smp_repair_out o;
		char err[SMP_ERRLEN];
		uint32_t chunk = sc->chunk;
		drop(sc);
		snap_slotmap_drop(&sc->maps, path);   /* read afresh after the repair */
		/* mesh: a copy given up was reported then; every pass would again */
		if (m->mesh && snap_mesh_given_up(m->mesh, j->name, r->rank, sl->step, sl->man.gen))
			continue;
		smp_logf(&m->log, SMP_LOG_WARN, "scrub: job %s rank %u step %" PRIu64 ": chunk %u fails its CRC32C in %s",
			 j->name, r->rank, sl->step, chunk, path);
		if (m->mesh) {
			smp_mesh_scrub_bad(m, j, r, sc->slot);
			continue;
		}
		int rc = smp_repair_slot(m->cfg, m->store, j, r, sc->slot, "scrub", 0, &m->heal, &o, err, sizeof(err));
		if (rc && rc != SNAP_ECORRUPT)
			smp_logf(&m->log, SMP_LOG_WARN, "scrub: %s", err);
	}
	/* Credit left when the slice's time ran out: the rate is more than one
	 * slice per poll round gets through, so the next round does not sleep. */
	sc->behind = !sc->idle && sc->credit > 0;
}
