/* SPDX-License-Identifier: BSD-3-Clause */
/* Full verification of a persisted step: manifest, files, every checksum. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_int.h"

static int verify_rank(const char *dir, const char *job, uint64_t step, uint32_t rank, uint32_t world,
		       const struct io_manifest_rank *m, size_t *bad, struct snap_io_err *err)
{
	char path[4096];
	if (io_rank_path(path, sizeof path, dir, job, step, rank, m)) {
		(*bad)++;
		return io_fail(err, SNAP_EINVAL, "flush directory path too long: %s", dir);
	}
	struct stat st;
	if (stat(path, &st) < 0) {
		(*bad)++;
		return io_fail(err, SNAP_ENOENT, "%s: missing (step %" PRIu64 " is damaged)", path, step);
	}
	if ((uint64_t)st.st_size != m->size) {
		(*bad)++;
		return io_fail(err, (uint64_t)st.st_size < m->size ? SNAP_ETRUNC : SNAP_ECORRUPT,
			       "%s: truncated or replaced: %" PRIu64 " bytes, manifest says %" PRIu64, path,
			       (uint64_t)st.st_size, m->size);
	}
	hid_t f;
	struct io_ds *ds = NULL;
	size_t n = 0;
	struct io_rank_id id = {job, step, rank, world};
	int rc = io_rank_open(path, &id, &f, &ds, &n, err);
	if (rc) {
		(*bad)++;
		return rc;
	}
	int first = 0;
	if (n != m->ndatasets || io_ds_crcsum(ds, n) != m->crcsum)
		first = io_fail(err, SNAP_ECORRUPT, "%s: datasets or their checksums differ from the manifest "
				"(%zu datasets, manifest says %" PRIu64 ")", path, n, m->ndatasets);
	if (first)
		(*bad)++;
	for (size_t i = 0; i < n; i++) {
		int r = io_ds_read(f, path, &ds[i], NULL, err);
		if (r) {
			(*bad)++;
			if (!first)
				first = r;
		}
	}
	H5Fclose(f);
	free(ds);
	return first;
}

int snap_io_verify_step(const char *dir, const char *job, uint64_t step, size_t *bad, struct snap_io_err *err)
{
	io_err_clear(err);
	size_t nbad = 0;
	if (bad)
		*bad = 0;
	int rc = dir ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir");
	if (rc)
		return rc;
	uint32_t world;
	struct io_manifest_rank *m = NULL;
	/* Sizes are checked per file below, so one bad file does not hide the rest. */
	if ((rc = io_manifest_load(dir, job, step, 0, &world, &m, err)) < 0) {
		if (bad)
			*bad = 1;
		return rc;
	}
	io_h5_enter();
	for (uint32_t r = 0; r < world; r++) {
		int e = verify_rank(dir, job, step, r, world, &m[r], &nbad, err);
		if (e && !rc)
			rc = e;
	}
	io_h5_leave();
	free(m);
	if (bad)
		*bad = nbad;
	if (rc && err && nbad > 1) {
		size_t k = strlen(err->msg);
		snprintf(err->msg + k, sizeof err->msg - k, " [and %zu more problems]", nbad - 1);
	}
	return rc;
}
