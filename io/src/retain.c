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

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* Retention in one directory (dir itself, or one node's of a pattern):
 * persisted[0..n) are the persisted steps, newest first, as the whole
 * flush directory lists them; floor the oldest one kept. */
static int retain_in(const char *dir, const char *job, const uint64_t *persisted, size_t np, uint64_t floor,
		     struct snap_io_err *err)
{
	char jdir[4096];
	if (io_path_job(jdir, sizeof jdir, dir, job))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
	DIR *d = opendir(jdir);
	if (!d) {
		if (errno == ENOENT)
			return 0;   /* a node directory that never held this job */
		return io_fail(err, io_errno_code(errno), "%s: cannot list: %s", jdir, strerror(errno));
	}
	char **victims = NULL;
	size_t nv = 0, cap = 0;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		uint64_t s;
		int go;
		if (strncmp(e->d_name, ".trash-step-", 12) == 0)
			go = 1;
		else if (io_parse_step_name(e->d_name, &s) == 0) {
			int is_persisted = bsearch(&s, persisted, np, sizeof *persisted, cmp_desc) != NULL;
			/* Incomplete steps newer than the newest persisted may be a
			 * flush under way; older ones are leftovers of a crash. */
			go = is_persisted ? s < floor : s < persisted[0];
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
	/* Oldest persisted step we keep; everything older goes. */
	uint64_t floor = steps[(size_t)n < keep ? (size_t)n - 1 : keep - 1];
	if (!io_is_pattern(dir)) {
		rc = retain_in(dir, job, steps, (size_t)n, floor, err);
		free(steps);
		return rc;
	}
	/* Per-node directories: a step's parts go node by node. A crash in
	 * between leaves parts of a step that no longer lists as persisted,
	 * older than the newest one: the next retention removes them. */
	uint32_t *nodes = NULL;
	size_t nn = 0;
	int removed = 0;
	rc = io_list_nodes(dir, &nodes, &nn, err);
	for (size_t i = 0; i < nn && !rc; i++) {
		char nd[4096];
		if (io_node_dir(nd, sizeof nd, dir, nodes[i]))
			rc = io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
		int k = rc ? rc : retain_in(nd, job, steps, (size_t)n, floor, err);
		if (k < 0)
			rc = k;
		else
			removed += k;
	}
	free(nodes);
	free(steps);
	return rc ? rc : removed;
}
