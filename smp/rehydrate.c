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
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "rehydrate.h"
#include "snap/io.h"

#define MAX_STEPS 256

/*
 * The newest step directory holding a MANIFEST: it was sealed once. If it is
 * not listed as persisted now, a file of it was damaged after the fact
 * (truncated, deleted) -- unlike a directory without MANIFEST, which is a
 * flush that never finished and is rightly ignored.
 */
static int newest_sealed(const char *dir, const char *job, uint64_t *step)
{
	char path[SNAP_PATH_MAX * 2];
	snprintf(path, sizeof(path), "%s/%s", dir, job);
	DIR *d = opendir(path);
	struct dirent *e;
	int found = 0;
	while (d && (e = readdir(d))) {
		char *end;
		if (strncmp(e->d_name, "step-", 5) || !e->d_name[5])
			continue;
		unsigned long long s = strtoull(e->d_name + 5, &end, 10);
		char man[SNAP_PATH_MAX * 3];
		if (*end || (found && s <= *step))
			continue;
		int k = snprintf(man, sizeof(man), "%s/%s/MANIFEST", path, e->d_name);
		if (k > 0 && (size_t)k < sizeof(man) && access(man, F_OK) == 0) {
			*step = s;
			found = 1;
		}
	}
	if (d)
		closedir(d);
	return found;
}

/* Pick the job's disk step for this generation (cached in the job). */
static int choose_step(const struct snap_config *cfg, struct store_job *j, uint64_t *step, char *err, size_t errlen)
{
	if (j->has_disk && j->disk_gen == j->gen) {
		*step = j->disk_step;
		return 0;
	}
	uint64_t steps[MAX_STEPS];
	struct snap_io_err e = { 0 };
	int n = snap_io_list_steps(cfg->flush_dir, j->name, steps, MAX_STEPS, &e);
	if (n < 0) {
		snap_fmt(err, errlen, "cannot list persisted steps of job %s in %s: %s", j->name, cfg->flush_dir, e.msg);
		return n;
	}
	char first[600] = "";
	uint64_t sealed = 0;
	if (newest_sealed(cfg->flush_dir, j->name, &sealed) && (n == 0 || sealed > steps[0])) {
		uint32_t world;
		snap_io_step_world(cfg->flush_dir, j->name, sealed, &world, &e);
		snprintf(first, sizeof(first), "persisted step %" PRIu64 " is damaged: %s", sealed, e.msg);
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
	for (int i = 0; i < n && i < MAX_STEPS; i++) {
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

int snap_rehydrate(const struct snap_config *cfg, struct snap_store *s, struct store_job *j, struct store_rank *r,
		   void *owner, uint32_t *slot, char *err, size_t errlen)
{
	uint64_t step;
	int rc = choose_step(cfg, j, &step, err, errlen);
	if (rc)
		return rc;
	if (snap_store_find(s, r, step, slot))
		return 0;   /* this rank already loaded it in this incarnation */

	int fd;
	if ((rc = snap_store_acquire(s, j, r, step, owner, slot, &fd, err, errlen)))
		return rc;
	const struct snap_layout *lay = &r->layout;
	uint8_t *base = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
	close(fd);
	struct snap_io_dest *d = calloc(lay->nregions ? lay->nregions : 1, sizeof(*d));
	uint32_t *crc = calloc(lay->ncrc ? lay->ncrc : 1, sizeof(*crc));
	if (base == MAP_FAILED || !d || !crc) {
		snap_fmt(err, errlen, "cannot map a slot to restore from disk: %s", strerror(errno));
		rc = SNAP_EIO;
		goto out;
	}
	for (uint32_t i = 0; i < lay->nregions; i++)
		d[i] = (struct snap_io_dest){ lay->regions[i].name, base + lay->regions[i].offset, lay->regions[i].bytes };
	struct snap_io_err e = { 0 };
	if ((rc = snap_io_read_rank(cfg->flush_dir, j->name, step, r->rank, d, lay->nregions, &e))) {
		snap_fmt(err, errlen, "restore of persisted step %" PRIu64 ": %s", step, e.msg);
		goto out;
	}
	snap_layout_crcs(lay, base, crc);
	rc = snap_store_commit(s, j, r, owner, *slot, step, crc, lay->ncrc, 0, err, errlen);
	if (!rc)
		snap_smp_logf("job %s rank %u: loaded persisted step %" PRIu64 " from %s into the node store", j->name,
			      r->rank, step, cfg->flush_dir);
out:
	if (rc)
		snap_store_release_owner(s, r, owner);
	if (base && base != MAP_FAILED)
		munmap(base, lay->slot_bytes);
	free(d);
	free(crc);
	return rc;
}
