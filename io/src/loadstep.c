/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Restore: the regions of one rank of a persisted (sealed) step, listed or
 * read into the caller's buffers. A step is readable once its MANIFEST is
 * in place, so this sits above stepmanifest.c; the reading itself is read.c's.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "io_int.h"

static int by_name(const void *a, const void *b)
{
	return strcmp(((const struct io_ds *)a)->name, ((const struct io_ds *)b)->name);
}

static int open_persisted_rank(const char *dir, const char *job, uint64_t step, uint32_t rank, char *path,
			       size_t cap, hid_t *f, struct io_ds **ds, size_t *n, struct snap_io_err *err)
{
	uint32_t world;
	struct io_manifest_rank *m = NULL;
	int rc = io_check_job(job, err);
	if (rc)
		return rc;
	if ((rc = io_manifest_load(dir, job, step, 1, &world, &m, err)) < 0)
		return rc;
	if (rank >= world) {
		free(m);
		return io_fail(err, SNAP_ENOENT, "step %" PRIu64 " has %" PRIu32 " ranks; no rank %" PRIu32, step, world, rank);
	}
	rc = io_rank_path(path, cap, dir, job, step, rank, &m[rank]);
	free(m);
	if (rc)
		return io_fail(err, SNAP_EINVAL, "path too long");
	struct io_rank_id id = {job, step, rank, world};
	return io_rank_open(path, &id, f, ds, n, err);
}

int snap_io_list_regions(const char *dir, const char *job, uint64_t step, uint32_t rank,
			 int (*fn)(const struct snap_io_region_info *info, void *arg), void *arg,
			 struct snap_io_err *err)
{
	io_err_clear(err);
	if (!dir || !fn)
		return io_fail(err, SNAP_EINVAL, "snap_io_list_regions: NULL dir or callback");
	char path[4096];
	hid_t f;
	struct io_ds *ds = NULL;
	size_t n = 0;
	io_h5_enter();
	int rc = open_persisted_rank(dir, job, step, rank, path, sizeof path, &f, &ds, &n, err);
	if (!rc) {
		for (size_t i = 0; i < n && !rc; i++)
			rc = fn(&ds[i].info, arg);
		H5Fclose(f);
	}
	io_h5_leave();
	free(ds);
	return rc;
}

static int read_dest(hid_t f, const char *path, const struct io_ds *d, const struct snap_io_dest *t,
		     struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	if (!t->frame_cap) {
		if (in->bytes != t->bytes)
			return io_fail(err, SNAP_EMISMATCH, "%s: dataset \"%s\" (region \"%s\") holds %" PRIu64
				       " bytes but the buffer has %zu", path, d->dataset, d->name, in->bytes, t->bytes);
		if (in->bytes && !t->buf)
			return io_fail(err, SNAP_EINVAL, "region \"%s\": NULL buffer", d->name);
		return io_ds_read(f, path, d, t->buf, err);
	}
	if (in->codec != SNAP_IO_CODEC_FRAMES)
		return io_fail(err, SNAP_EMISMATCH, "%s: dataset \"%s\" (region \"%s\") is stored raw, not as codec "
			       "frames: read it with frame_cap 0", path, d->dataset, d->name);
	if (t->frame_elems != in->frame_elems || t->nframes != in->nframes)
		return io_fail(err, SNAP_EMISMATCH, "%s: dataset \"%s\" (region \"%s\") holds %" PRIu32 " frames of %"
			       PRIu64 " values, the destination asks for %" PRIu32 " of %" PRIu64, path, d->dataset,
			       d->name, in->nframes, in->frame_elems, t->nframes, t->frame_elems);
	if (t->frame_cap > SIZE_MAX / t->nframes || t->bytes != t->nframes * t->frame_cap || !t->buf)
		return io_fail(err, SNAP_EINVAL, "region \"%s\": buffer of %zu bytes is not %" PRIu32 " frames x "
			       "frame_cap %" PRIu64 ", or NULL", d->name, t->bytes, t->nframes, t->frame_cap);
	return io_frames_read(f, path, d, t, NULL, err);
}

int snap_io_read_rank(const char *dir, const char *job, uint64_t step, uint32_t rank,
		      const struct snap_io_dest *dests, size_t n, struct snap_io_err *err)
{
	io_err_clear(err);
	if (!dir || (n && !dests))
		return io_fail(err, SNAP_EINVAL, "snap_io_read_rank: NULL dir or dests");
	char path[4096];
	hid_t f;
	struct io_ds *ds = NULL;
	size_t nds = 0;
	io_h5_enter();
	int rc = open_persisted_rank(dir, job, step, rank, path, sizeof path, &f, &ds, &nds, err);
	if (!rc) {
		if (nds)
			qsort(ds, nds, sizeof *ds, by_name);
		for (size_t i = 0; i < n && !rc; i++) {
			struct io_ds key;
			if (!dests[i].name || strlen(dests[i].name) > SNAP_IO_MAX_NAME) {
				rc = io_fail(err, SNAP_EINVAL, "destination %zu: bad name", i);
				break;
			}
			strcpy(key.name, dests[i].name);
			const struct io_ds *d = nds ? bsearch(&key, ds, nds, sizeof *ds, by_name) : NULL;
			if (!d)
				rc = io_fail(err, SNAP_ENOENT, "%s: no region \"%s\"", path, dests[i].name);
			else
				rc = read_dest(f, path, d, &dests[i], err);
		}
		H5Fclose(f);
	}
	io_h5_leave();
	free(ds);
	return rc;
}
