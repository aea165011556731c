/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Restore from disk: when the node store holds no restorable step (all
 * daemons were gone, or too many nodes were lost), a trainer's RESTORE loads
 * its rank's file of a persisted step into a fresh slot and commits it, so
 * the trainer restores through the usual path and never links HDF5.
 *
 * The step is chosen once per job incarnation, for all ranks alike: the
 * newest persisted step whose every file verifies. An older one is taken
 * only with SNAP_ALLOW_OLDER=1; otherwise the damage is reported, never
 * skipped silently.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "snap/base.h"
#include "base/log.h"
#include "flush/rehydrate.h"
#include "snap/codec.h"
#include "snap/io.h"

#define REHYDRATE_MAX_STEPS 256

/* Pick the job's disk step for this generation (cached in the job). */
static int choose_step(const struct snap_smp_config *cfg, struct store_job *j, uint64_t *step, char *err, size_t errlen)
{
	if (j->has_disk && j->disk_gen == j->gen) {
		*step = j->disk_step;
		return 0;
	}
	uint64_t steps[REHYDRATE_MAX_STEPS];
	struct snap_io_err e = { 0 };
	int n = snap_io_list_steps(cfg->flush_dir, j->name, steps, REHYDRATE_MAX_STEPS, &e);
	if (n < 0) {
		snap_fmt(err, errlen, "cannot list persisted steps of job %s in %s: %s", j->name, cfg->flush_dir, e.msg);
		return n;
	}
	char first[600] = "";
	uint64_t sealed = 0;
	/* Sealed once but not listed as persisted now: a file of it was damaged
	 * after the fact (truncated, deleted), unlike a flush that never
	 * finished, which is rightly ignored. */
	if (snap_io_sealed_step(cfg->flush_dir, j->name, &sealed) && (n == 0 || sealed > steps[0])) {
		uint32_t world;
		snap_io_step_world(cfg->flush_dir, j->name, sealed, &world, &e);
		snprintf(first, sizeof(first), "persisted step %" PRIu64 " is damaged: %s", sealed, e.msg);
		if (!cfg->allow_older || n == 0) {
			snap_fmt(err, errlen, "newest %s; nothing was restored%s", first,
				 n ? " (set SNAP_ALLOW_OLDER=1 to fall back to an older persisted step)" : "");
			return SNAP_ECORRUPT;
		}
	}
	/* A sealed step that lost its MANIFEST is not persisted by the format,
	 * but its rank files say it was: a loss, treated like a damaged step. */
	uint64_t lost = 0;
	if (!first[0] && snap_io_lost_step(cfg->flush_dir, j->name, n > 0 ? steps[0] : 0, &lost)) {
		snprintf(first, sizeof(first), "persisted step %" PRIu64 " has lost its MANIFEST (its rank files are "
			 "still in %s/%s/step-%" PRIu64 ")", lost, cfg->flush_dir, j->name, lost);
		snap_smp_logf("job %s: warning: %s", j->name, first);
		if (!cfg->allow_older || n == 0) {
			snap_fmt(err, errlen, "newest %s; nothing was restored%s", first,
				 n ? " (set SNAP_ALLOW_OLDER=1 to fall back to an older persisted step)" : "");
			return SNAP_ECORRUPT;
		}
	}
	if (n == 0) {
		snap_fmt(err, errlen, "job %s has no step committed by all of its ranks in the node store, and none "
			 "persisted in %s", j->name, cfg->flush_dir);
		return SNAP_ENOENT;
	}
	for (int i = 0; i < n && i < REHYDRATE_MAX_STEPS; i++) {
		uint32_t world = 0;
		size_t bad = 0;
		int rc = snap_io_step_world(cfg->flush_dir, j->name, steps[i], &world, &e);
		if (!rc && world != j->world) {
			snap_fmt(e.msg, sizeof(e.msg), "persisted step %" PRIu64 " has %u ranks, the job now runs %u",
				 steps[i], world, j->world);
			rc = SNAP_EMISMATCH;
		}
		if (!rc)
			rc = snap_io_verify_step(cfg->flush_dir, j->name, steps[i], &bad, &e);
		if (!rc) {
			if (first[0])
				snap_smp_logf("job %s: falling back to persisted step %" PRIu64 " (SNAP_ALLOW_OLDER=1): %s",
					      j->name, steps[i], first);
			j->has_disk = 1;
			j->disk_gen = j->gen;
			j->disk_step = steps[i];
			*step = steps[i];
			return 0;
		}
		if (!first[0])
			snprintf(first, sizeof(first), "%s", e.msg);
		if (!cfg->allow_older) {
			snap_fmt(err, errlen, "newest persisted step %" PRIu64 " of job %s is damaged: %s; nothing was "
				 "restored (set SNAP_ALLOW_OLDER=1 to fall back to an older persisted step)", steps[i],
				 j->name, e.msg);
			return rc;
		}
	}
	snap_fmt(err, errlen, "no persisted step of job %s in %s verifies; newest failure: %s", j->name,
		 cfg->flush_dir, first);
	return SNAP_ECORRUPT;
}

/*
 * A frame loaded from disk must keep the registered region's promise: a
 * lossless frame keeps any; a lossy one only under the same codec with a
 * bound no looser. Otherwise it is refused, never relabelled.
 */
static int frame_fits(const struct snap_man_region *g, const uint8_t *frame, uint64_t len, char *err, size_t errlen)
{
	struct snap_codec_info in;
	int rc = snap_codec_inspect(frame, len, &in);
	if (rc) {
		snap_fmt(err, errlen, "region \"%s\": a persisted frame has a bad header (%s)", g->name, snap_strerror(rc));
		return SNAP_ECORRUPT;
	}
	if (in.codec == SNAP_CODEC_LOSSLESS || (in.codec == g->codec && in.param <= g->bound))
		return 0;
	snap_fmt(err, errlen, "region \"%s\" is registered with codec %s:%g but was persisted as %s:%g, which "
		 "does not keep that promise; register it with the codec it was saved with", g->name,
		 snap_codec_spec_name(g->codec), g->bound, snap_codec_spec_name(in.codec), in.param);
	return SNAP_EMISMATCH;
}

/* One rank's persisted step being loaded into a slot. */
struct load {
	const struct snap_layout *lay;
	uint8_t *base;
	struct snap_io_dest *d;    /* per region */
	uint8_t **raw;             /* per region: codec region persisted raw, read here to compress */
	uint64_t *flen;            /* per chunk: frame lengths */
	uint32_t *crc, *len;       /* per chunk: what the manifest will say */
	const uint8_t *only;       /* per region: read it (NULL: all) */
};

static int wanted(const struct load *L, uint32_t region)
{
	return !L->only || L->only[region];
}

/* Mark the codec regions whose dataset holds raw values, not frames. */
static int note_raw(const struct snap_io_region_info *in, void *arg)
{
	struct load *L = arg;
	for (uint32_t i = 0; i < L->lay->nregions; i++) {
		const struct snap_man_region *g = &L->lay->regions[i];
		if (wanted(L, i) && g->codec != SNAP_CODEC_NONE && in->codec != SNAP_IO_CODEC_FRAMES &&
		    !strcmp(g->name, in->name) && !L->raw[i] && !(L->raw[i] = malloc(g->bytes ? g->bytes : 1)))
			return SNAP_ENOMEM;
	}
	return 0;
}

/* Where io puts each region: raw bytes (into the slot, or into a buffer to
 * compress), or the frames at their slot areas. */
static size_t plan_dests(struct load *L)
{
	const struct snap_layout *lay = L->lay;
	size_t nd = 0;
	for (uint32_t i = 0; i < lay->nregions; i++) {
		const struct snap_man_region *g = &lay->regions[i];
		if (!wanted(L, i))
			continue;
		struct snap_io_dest *d = &L->d[nd++];
		*d = (struct snap_io_dest){ .name = g->name, .buf = L->base + g->offset, .bytes = g->bytes };
		if (L->raw[i]) {
			d->buf = L->raw[i];
		} else if (g->codec != SNAP_CODEC_NONE) {
			d->bytes = (uint64_t)g->nchunks * g->frame_cap;
			d->frame_cap = g->frame_cap;
			d->frame_elems = lay->chunk_size / snap_dtype_size(g->dtype);
			d->nframes = g->nchunks;
			d->frame_len = L->flen + g->first_crc;
			d->frame_crc = L->crc + g->first_crc;
		}
	}
	return nd;
}

/* The manifest's CRCs and lengths: raw chunks are CRC'd here, raw values of
 * a codec region compressed here (the one quantization), frames read from
 * disk were CRC-checked by io and must keep the region's promise. */
static int chunk_sums(struct load *L, char *err, size_t errlen)
{
	const struct snap_layout *lay = L->lay;
	for (uint32_t t = 0; t < lay->ncrc; t++) {
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		if (!wanted(L, (uint32_t)(c.g - lay->regions)))
			continue;
		uint8_t *dst = L->base + c.slot_off;
		const uint8_t *raw = L->raw[c.g - lay->regions];
		if (c.g->codec == SNAP_CODEC_NONE) {
			L->len[t] = (uint32_t)c.raw_len;
			L->crc[t] = snap_crc32c(dst, c.raw_len);
		} else if (raw) {
			struct snap_codec_params p = { .codec = c.g->codec, .dtype = c.g->dtype, .bound = c.g->bound };
			size_t n = 0;
			int rc = snap_codec_compress(&p, raw + c.raw_off, c.raw_len / snap_dtype_size(c.g->dtype), dst,
						     c.cap, &n);
			if (rc) {
				snap_fmt(err, errlen, "region \"%s\" chunk %u: compression failed: %s", c.g->name,
					 c.index, snap_strerror(rc));
				return rc;
			}
			L->len[t] = (uint32_t)n;
			L->crc[t] = snap_crc32c(dst, n);
		} else {
			L->len[t] = (uint32_t)L->flen[t];
			int rc = frame_fits(c.g, dst, L->flen[t], err, errlen);
			if (rc)
				return rc;
		}
	}
	/* A partial read (repair) leaves the other chunks' lengths 0. */
	return L->only ? 0 : snap_layout_check_lens(lay, L->len, err, errlen);
}

int snap_rehydrate_read(const char *flush_dir, const char *job, uint32_t rank, uint64_t step,
			const struct snap_layout *lay, const uint8_t *only, uint8_t *base, uint32_t *crc, uint32_t *len,
			char *err, size_t errlen)
{
	size_t n = lay->ncrc ? lay->ncrc : 1, nr = lay->nregions ? lay->nregions : 1;
	struct load L = { .lay = lay, .base = base, .crc = crc, .len = len, .only = only };
	L.d = calloc(nr, sizeof(*L.d));
	L.raw = calloc(nr, sizeof(*L.raw));
	L.flen = calloc(n, sizeof(*L.flen));
	struct snap_io_err e = { 0 };
	char why[SNAP_IO_ERRMSG];
	int rc;
	if (!L.d || !L.raw || !L.flen) {
		snap_fmt(err, errlen, "out of memory to read persisted step %" PRIu64, step);
		rc = SNAP_ENOMEM;
	} else if ((rc = snap_io_list_regions(flush_dir, job, step, rank, note_raw, &L, &e))) {
		snap_fmt(err, errlen, "persisted step %" PRIu64 ": %s", step,
			 rc == SNAP_ENOMEM ? "out of memory for a region to compress" : e.msg);
	} else {
		size_t nd = plan_dests(&L);
		if ((rc = snap_io_read_rank(flush_dir, job, step, rank, L.d, nd, &e)))
			snap_fmt(err, errlen, "persisted step %" PRIu64 ": %s", step, e.msg);
		else if ((rc = chunk_sums(&L, why, sizeof(why))))
			snap_fmt(err, errlen, "persisted step %" PRIu64 ": %s", step, why);
	}
	for (uint32_t i = 0; L.raw && i < lay->nregions; i++)
		free(L.raw[i]);
	free(L.raw);
	free(L.d);
	free(L.flen);
	return rc;
}

int snap_rehydrate(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j, struct store_rank *r,
		   void *owner, uint32_t *slot, char *err, size_t errlen)
{
	uint64_t step = 0;   /* set by choose_step on success; gcc -O1 cannot tell */
	int rc = choose_step(cfg, j, &step, err, errlen);
	if (rc)
		return rc;
	/* This rank already loaded it in this incarnation. An older
	 * incarnation's slot of the same step is not reused: it may hold other
	 * bytes (a dead timeline's), and in a mesh the rewind this load
	 * announces (to step - 1, see snap_store_acquire) withdraws it on every
	 * node, which left a rank restored from a withdrawn slot and its job
	 * stalled (fault.mesh_flush). */
	const struct store_slot *had = snap_store_find(s, r, step, slot);
	if (had && had->man.gen == j->gen)
		return 0;

	int fd;
	if ((rc = snap_store_acquire(s, j, r, step, owner, slot, &fd, err, errlen)))
		return rc;
	const struct snap_layout *lay = &r->layout;
	size_t n = lay->ncrc ? lay->ncrc : 1;
	uint8_t *base = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	uint32_t *crc = calloc(2 * n, sizeof(*crc));
	char why[SMP_REHYDRATE_ERRLEN];
	if (base == MAP_FAILED || !crc) {
		snap_fmt(err, errlen, "cannot map a slot to restore from disk: %s", strerror(errno));
		rc = SNAP_EIO;
	} else if ((rc = snap_rehydrate_read(cfg->flush_dir, j->name, r->rank, step, lay, NULL, base, crc, crc + n, why,
					     sizeof(why)))) {
		snap_fmt(err, errlen, "restore of %s", why);
	} else if (!(rc = snap_store_commit(s, j, r, owner, *slot, step, crc, crc + n, lay->ncrc, 0, err, errlen))) {
		snap_smp_logf("job %s rank %u: loaded persisted step %" PRIu64 " from %s into the node store", j->name,
			      r->rank, step, cfg->flush_dir);
	}
	if (rc)
		snap_store_release_owner(s, r, owner);
	if (base && base != MAP_FAILED)
		munmap(base, lay->slot_bytes);
	free(crc);
	return rc;
}
