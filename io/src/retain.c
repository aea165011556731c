/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Retention. A step leaves the step-N namespace by one rename (to
 * .trash-step-N.<pid>) before anything inside it is deleted, so a crash
 * mid-delete never leaves a half-deleted step that lists as persisted; the
 * trash is removed next time.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_int.h"

static int trash(const char *jdir, const char *name, struct snap_io_err *err)
{
	char from[4200], to[4300];
	snprintf(from, sizeof from, "%s/%s", jdir, name);
	snprintf(to, sizeof to, "%s/.trash-%s.%d", jdir, name, (int)getpid());
	if (rename(from, to) < 0) {
		int e = errno;
		return io_fail(err, io_errno_code(e), "%s: cannot move aside for deletion: %s", from, strerror(e));
	}
	io_fsync_dir(jdir);
	int rc = io_rmtree(to);
	if (rc < 0)
		return io_fail(err, io_errno_code(-rc), "%s: deletion incomplete: %s", to, strerror(-rc));
	return 0;
}

int snap_io_retain(const char *dir, const char *job, unsigned keep, struct snap_io_err *err)
{
	io_err_clear(err);
	int rc = dir ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir");
	if (rc)
		return rc;
	if (keep < 1)
		return io_fail(err, SNAP_EINVAL, "retention must keep at least 1 persisted step");
	int n = snap_io_list_steps(dir, job, NULL, 0, err);
	if (n <= 0)
		return n;
	uint64_t *steps = malloc((size_t)n * sizeof *steps);
	if (!steps)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	n = snap_io_list_steps(dir, job, steps, (size_t)n, err);
	if (n <= 0) {
		free(steps);
		return n;
	}
	uint64_t newest = steps[0];
	/* Oldest persisted step we keep; everything older goes. */
	uint64_t floor = steps[(size_t)n < keep ? (size_t)n - 1 : keep - 1];
	free(steps);
	char jdir[4096];
	io_path_job(jdir, sizeof jdir, dir, job);
	DIR *d = opendir(jdir);
	if (!d)
		return io_fail(err, io_errno_code(errno), "%s: cannot list: %s", jdir, strerror(errno));
	char **victims = NULL;
	size_t nv = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		uint64_t s;
		int go;
		if (strncmp(e->d_name, ".trash-step-", 12) == 0)
			go = 1;
		else if (io_parse_step_name(e->d_name, &s) == 0) {
			uint32_t w;
			int persisted = io_manifest_load(dir, job, s, 1, &w, NULL, NULL) == 0;
			/* Incomplete steps newer than the newest persisted may be a
			 * flush under way; older ones are leftovers of a crash. */
			go = persisted ? s < floor : s < newest;
		} else
			go = 0;
		if (!go)
			continue;
		if (nv == cap) {
			cap = cap ? 2 * cap : 16;
			char **p = realloc(victims, cap * sizeof *p);
			if (!p)
				break;
			victims = p;
		}
		if (!(victims[nv] = strdup(e->d_name)))
			break;
		nv++;
	}
	closedir(d);
	int removed = 0;
	for (size_t i = 0; i < nv; i++) {
		if (strncmp(victims[i], ".trash-", 7) == 0) {
			char p[4200];
			snprintf(p, sizeof p, "%s/%s", jdir, victims[i]);
			int r = io_rmtree(p);
			if (r < 0 && !rc)
				rc = io_fail(err, io_errno_code(-r), "%s: deletion incomplete: %s", p, strerror(-r));
		} else if (trash(jdir, victims[i], err) == 0) {
			removed++;
		} else if (!rc) {
			rc = err ? err->code : SNAP_EIO;
		}
		free(victims[i]);
	}
	free(victims);
	return rc ? rc : removed;
}
