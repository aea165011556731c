/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Self-healing of a committed slot: the levels hold the same step in
 * different places (the node store, the flushed HDF5 file), so a chunk that
 * fails its CRC32C in the store is read from the flush, checked against the
 * manifest's CRC, written back and checked again. A trainer whose restore
 * found a bad chunk asks for it (REPAIR), and so do the scrub (scrub.c) and
 * `snaptool verify --repair`. Nothing is ever taken from a copy whose own
 * checksum does not match; a step that stays damaged is withdrawn on the
 * rank, so that the newest restorable step is one that restores.
 *
 * On a mesh (--ec) the parity is the level before the flush: the caller
 * (requests.c) has the mesh decode the protected step's stripes first
 * (meshheal.c), counting with smp_repair_count what that repaired, and
 * sends here what is still bad.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/log.h"
#include "flush/rehydrate.h"
#include "heal/repair.h"

/* Open the slot file read-write, recreating it (as zeros: every chunk bad)
 * when it is missing, and growing it back when it is short. */
static int open_slot_rw(const char *path, uint64_t bytes, char *note, size_t notelen, char *err, size_t errlen)
{
	struct stat st;
	char why[128] = "";
	int fd = snap_store_open_regular(path, O_RDWR, &st, why, sizeof(why));
	if (fd < 0 && errno == ENOENT) {
		fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0) {
			snap_fmt(err, errlen, "cannot recreate slot file %s: %s", path, strerror(errno));
			return SNAP_EIO;
		}
		st.st_size = 0;
		snprintf(note, notelen, "slot file was missing; ");
	} else if (fd < 0) {
		snap_fmt(err, errlen, "slot file %s is unusable: %s", path, why[0] ? why : strerror(errno));
		return SNAP_EIO;
	}
	if ((uint64_t)st.st_size < bytes) {
		if (st.st_size)
			snprintf(note, notelen, "slot file was truncated to %" PRIu64 " of %" PRIu64 " bytes; ",
				 (uint64_t)st.st_size, bytes);
		if (ftruncate(fd, (off_t)bytes) != 0) {
			snap_fmt(err, errlen, "cannot grow slot file %s back to %" PRIu64 " bytes: %s", path, bytes,
				 strerror(errno));
			close(fd);
			return SNAP_EIO;
		}
	}
	return fd;
}

/* Chunk t of the slot at p matches the manifest. */
static int chunk_good(const struct snap_manifest *man, const uint8_t *p, uint32_t t)
{
	struct snap_chunk c;
	snap_layout_chunk(&man->layout, t, &c);
	return snap_crc32c(p + c.slot_off, man->len[t]) == man->crc[t];
}

/* Bad chunks of one region from the flushed file; the number rewritten. */
static uint32_t from_flush(const struct snap_smp_config *cfg, const struct store_job *j, const struct store_rank *r,
			   const struct snap_manifest *man, uint8_t *p, uint8_t *bad, uint32_t region, uint8_t *buf,
			   uint32_t *crc, char *err, size_t errlen)
{
	const struct snap_layout *lay = &man->layout;
	uint8_t *only = calloc(lay->nregions, 1);
	if (!only) {
		snap_fmt(err, errlen, "out of memory");
		return 0;
	}
	only[region] = 1;
	uint32_t n = lay->ncrc ? lay->ncrc : 1, done = 0;
	int rc = snap_rehydrate_read(cfg->flush_dir, j->name, r->rank, man->step, lay, only, buf, crc, crc + n, err,
				     errlen);
	free(only);
	if (rc)
		return 0;
	const struct snap_man_region *g = &lay->regions[region];
	for (uint32_t t = g->first_crc; t < g->first_crc + g->nchunks; t++) {
		if (!bad[t])
			continue;
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		/* The flushed chunk must be the one the manifest describes. */
		if (crc[n + t] != man->len[t] || snap_crc32c(buf + c.slot_off, man->len[t]) != man->crc[t]) {
			snap_fmt(err, errlen, "persisted step %" PRIu64 " region \"%s\" chunk %u differs from the "
				 "manifest's (another incarnation's bytes?)", man->step, g->name, c.index);
			continue;
		}
		memcpy(p + c.slot_off, buf + c.slot_off, man->len[t]);
		if (chunk_good(man, p, t)) {
			bad[t] = 0;
			done++;
		}
	}
	return done;
}

/* Every bad chunk the other levels hold intact, rewritten: how many. */
static uint32_t from_levels(const struct snap_smp_config *cfg, const struct store_job *j, const struct store_rank *r,
			    const struct snap_manifest *man, uint8_t *p, uint8_t *bad, char *err, size_t errlen)
{
	const struct snap_layout *lay = &man->layout;
	if (!cfg->flush_dir[0]) {
		snprintf(err, errlen, "no flush directory (the only other level)");
		return 0;
	}
	uint8_t *buf = malloc(lay->slot_bytes ? lay->slot_bytes : 1);
	uint32_t *crc = calloc(2 * (size_t)(lay->ncrc ? lay->ncrc : 1), sizeof(*crc));
	uint32_t done = 0;
	if (!buf || !crc)
		snprintf(err, errlen, "out of memory to read the flush");
	for (uint32_t g = 0; buf && crc && g < lay->nregions; g++) {
		const struct snap_man_region *reg = &lay->regions[g];
		int any = 0;
		for (uint32_t t = reg->first_crc; t < reg->first_crc + reg->nchunks; t++)
			any |= bad[t];
		if (any)
			done += from_flush(cfg, j, r, man, p, bad, g, buf, crc, err, errlen);
	}
	free(buf);
	free(crc);
	return done;
}

int smp_repair_slot(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j, struct store_rank *r,
		    uint32_t slot, const char *who, int keep, struct smp_heal *h, struct smp_repair_out *out, char *err,
		    size_t errlen)
{
	struct store_slot *sl = &r->slots[slot];
	const struct snap_manifest *man = &sl->man;
	const struct snap_layout *lay = &man->layout;
	memset(out, 0, sizeof(*out));
	out->step = sl->step;
	if (sl->state != SLOT_COMMITTED || sl->superseded) {
		snap_fmt(err, errlen, "job %s rank %u slot %u holds no committed step", j->name, r->rank, slot);
		return SNAP_ENOENT;
	}
	char path[SNAP_FILE_MAX], note[160] = "";
	snap_store_path(s, j->name, r->rank, slot, 0, path, sizeof(path));
	int fd = open_slot_rw(path, lay->slot_bytes, note, sizeof(note), err, errlen);
	if (fd < 0)
		return fd;
	/* The manifest goes with a withdrawal: keep what the end needs. */
	const uint64_t bytes = lay->slot_bytes;
	uint8_t *p = bytes ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map slot file %s: %s", path, strerror(errno));
		return SNAP_EIO;
	}
	uint32_t n = lay->ncrc;
	uint8_t *bad = calloc(n ? n : 1, 1);
	if (!bad) {
		if (p)
			munmap(p, bytes);
		snap_fmt(err, errlen, "out of memory");
		return SNAP_ENOMEM;
	}
	for (uint32_t t = 0; t < n; t++)
		out->bad += bad[t] = !chunk_good(man, p, t);
	int rc = 0;
	out->mended = note[0] != 0;
	if (!out->bad && note[0]) {
		/* Only bytes no chunk covers were lost: the file is whole again. */
		snprintf(out->how, sizeof(out->how), "%sno chunk was damaged", note);
		snap_smp_logf("job %s rank %u step %" PRIu64 " (%s): %s", j->name, r->rank, out->step, who, out->how);
	} else if (out->bad) {
		char why[SMP_REHYDRATE_ERRLEN] = "";
		out->repaired = from_levels(cfg, j, r, man, p, bad, why, sizeof(why));
		h->repaired_chunks += out->repaired;
		uint32_t first = 0;
		while (first < n && !bad[first])
			first++;
		if (out->repaired == out->bad) {
			/* snap_fmt: a long flush path or reason is cut, not an error */
			snap_fmt(out->how, sizeof(out->how), "%s%u bad chunks repaired from the flush (%s step %" PRIu64 ")",
				 note, out->bad, cfg->flush_dir, out->step);
			snap_smp_logf("job %s rank %u step %" PRIu64 " (%s): %s", j->name, r->rank, out->step, who, out->how);
		} else {
			struct snap_chunk c;
			snap_layout_chunk(lay, first, &c);
			snap_fmt(out->how, sizeof(out->how), "%s%u of %u bad chunks repaired; region \"%s\" chunk %u has no "
				 "good copy at any level: %s", note, out->repaired, out->bad, c.g->name, c.index,
				 why[0] ? why : "the flush does not hold it");
			h->damaged_steps++;
			h->damaged_step = out->step;
			h->damaged_rank = r->rank;
			snprintf(h->damaged_job, sizeof(h->damaged_job), "%s", j->name);
			snprintf(h->damaged_why, sizeof(h->damaged_why), "%s", out->how);
			char what[64];
			snprintf(what, sizeof(what), "rank %u step %" PRIu64, r->rank, out->step);
			smp_heal_damage(h, s, j->name, what, out->how);
			char w[520];
			snprintf(w, sizeof(w), "damaged beyond repair (%s): %s", who, out->how);
			if (keep) {
				snap_smp_logf("job %s rank %u step %" PRIu64 ": %s", j->name, r->rank, out->step, w);
				snap_fmt(err, errlen, "job %s rank %u step %" PRIu64 " is damaged beyond repair: %s", j->name,
					 r->rank, out->step, out->how);
				rc = SNAP_ECORRUPT;
			} else if ((rc = snap_store_withdraw(s, j, r, slot, w, err, errlen)) == 0) {
				snap_fmt(err, errlen, "job %s rank %u step %" PRIu64 " is damaged beyond repair and was "
					 "withdrawn: %s", j->name, r->rank, out->step, out->how);
				rc = SNAP_ECORRUPT;
			}
		}
	}
	free(bad);
	if (p)
		munmap(p, bytes);
	return rc;
}

int smp_repair_count(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t slot, uint32_t *bad,
		     char *err, size_t errlen)
{
	const struct snap_manifest *man = &r->slots[slot].man;
	const struct snap_layout *lay = &man->layout;
	char path[SNAP_FILE_MAX];
	snap_store_path(s, j->name, r->rank, slot, 0, path, sizeof(path));
	*bad = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0 && errno != ENOENT) {
		snap_fmt(err, errlen, "cannot open slot file %s: %s", path, strerror(errno));
		return SNAP_EIO;
	}
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rc = 0;
	struct stat st;
	int short_file = fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size < lay->slot_bytes;
	for (uint32_t t = 0; t < lay->ncrc && !rc; t++) {
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		if (man->len[t] > cap) {
			void *q = realloc(buf, man->len[t]);
			if (!q) {
				snap_fmt(err, errlen, "out of memory");
				rc = SNAP_ENOMEM;
				break;
			}
			buf = q;
			cap = man->len[t];
		}
		ssize_t k = fd < 0 ? 0 : pread(fd, buf, man->len[t], (off_t)c.slot_off);
		if (k < 0 && errno == EINTR) {
			t--;
			continue;
		}
		*bad += k != (ssize_t)man->len[t] || snap_crc32c(buf, man->len[t]) != man->crc[t];
	}
	free(buf);
	if (fd >= 0)
		close(fd);
	if (short_file)
		*bad |= SMP_REPAIR_SHORT;
	return rc;
}

int smp_repair_after_parity(const struct snap_smp_config *cfg, struct snap_store *s, struct store_job *j,
			    struct store_rank *r, uint32_t slot, const char *who, uint32_t before, const char *pmsg,
			    struct smp_heal *h, struct smp_repair_out *out, char *err, size_t errlen)
{
	uint64_t step = r->slots[slot].step;
	int was_short = (before & SMP_REPAIR_SHORT) != 0;
	before &= ~SMP_REPAIR_SHORT;
	int rc = smp_repair_slot(cfg, s, j, r, slot, who, 1, h, out, err, errlen);
	if (rc && rc != SNAP_ECORRUPT)
		return rc;
	if (was_short && !out->mended) {
		/* the repair from parity brought the file back at its size */
		out->mended = 1;
		char how[sizeof(out->how)];
		snap_fmt(how, sizeof(how), "slot file was missing or truncated; %s", out->how);
		memcpy(out->how, how, sizeof(how));
	}
	/* What the parity repaired: bad before it, good now. */
	uint32_t by_parity = before > out->bad ? before - out->bad : 0;
	char par[SMP_REHYDRATE_ERRLEN] = "";
	if (by_parity) {
		h->repaired_chunks += by_parity;
		snprintf(par, sizeof(par), "%u bad chunks repaired from parity (the mesh decoded step %" PRIu64
			 "'s stripes)", by_parity, step);
		snap_smp_logf("job %s rank %u step %" PRIu64 " (%s): %s", j->name, r->rank, step, who, par);
	} else if (before && pmsg && pmsg[0]) {
		snprintf(par, sizeof(par), "parity could not repair them (%s)", pmsg);
	}
	if (par[0]) {
		/* after the mended-file note, before what the flush did */
		const char *note = "slot file was missing or truncated; ";
		size_t nl = strncmp(out->how, note, strlen(note)) == 0 ? strlen(note) : 0;
		char how[sizeof(out->how)];
		snap_fmt(how, sizeof(how), "%.*s%s%s%s", (int)nl, out->how, par, out->how[nl] ? "; then " : "",
			 out->how + nl);
		memcpy(out->how, how, sizeof(how));
	}
	out->bad += by_parity;
	out->repaired += by_parity;
	out->by_parity = by_parity;
	return rc;
}
