/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A persisted step as readers see it: the MANIFEST of its directory or,
 * with per-node flush directories (a directory naming the node as %n), the
 * union of the node directories' part MANIFESTs. A step is persisted there
 * when the parts agree on the world and together list every rank
 * 0..world-1 exactly once. Parts that do not cover the world yet are a
 * flush under way, or one a crash interrupted: such a step is not listed,
 * exactly like a step directory without MANIFEST.
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

/* The union of the parts of `step` under pattern; see the top of the file. */
static int load_union(const char *pattern, const char *job, uint64_t step, int check_files, uint32_t *world,
		      struct io_manifest_rank **ranks, struct snap_io_err *err)
{
	uint32_t *nodes = NULL;
	size_t nn = 0;
	int rc = io_list_nodes(pattern, &nodes, &nn, err);
	if (rc)
		return rc;
	struct io_manifest_rank *all = NULL;
	uint32_t w = 0, covered = 0, wnode = 0;
	for (size_t i = 0; i < nn && !rc; i++) {
		char nd[4096], man[4300];
		if (io_node_dir(nd, sizeof nd, pattern, nodes[i]) || io_path_step(man, sizeof man - 16, nd, job, step)) {
			rc = io_fail(err, SNAP_EINVAL, "path too long: %s", pattern);
			break;
		}
		strcat(man, "/" SNAP_IO_MANIFEST);
		struct stat st;
		if (lstat(man, &st) < 0 && errno == ENOENT)
			continue;   /* this node wrote no part of the step, or has not sealed it yet */
		uint32_t pw = 0;
		int part = 0;
		struct io_manifest_rank *pr = NULL;
		if ((rc = io_manifest_read(nd, job, step, check_files, &pw, &part, &pr, err)))
			break;
		if (!all) {
			w = pw;
			wnode = nodes[i];
			if (!(all = calloc(w, sizeof *all)))
				rc = io_fail(err, SNAP_ENOMEM, "out of memory");
		} else if (pw != w) {
			rc = io_fail(err, SNAP_ECORRUPT, "%s: a part of world %" PRIu32 ", but node %" PRIu32
				     "'s part of step %" PRIu64 " says world %" PRIu32, man, pw, wnode, step, w);
		}
		for (uint32_t r = 0; r < w && !rc; r++) {
			if (!pr[r].present)
				continue;
			if (all[r].present) {
				rc = io_fail(err, SNAP_ECORRUPT, "%s: rank %" PRIu32 " of step %" PRIu64 " is also in node %"
					     PRId64 "'s part", man, r, step, all[r].node);
				break;
			}
			all[r] = pr[r];
			all[r].node = nodes[i];
			covered++;
		}
		free(pr);
	}
	free(nodes);
	if (!rc && !all)
		rc = io_fail(err, SNAP_ENOENT, "step %" PRIu64 " of job %s is not persisted (no node directory of %s "
			     "holds a sealed part of it)", step, job, pattern);
	for (uint32_t r = 0; !rc && covered < w && r < w; r++)
		if (!all[r].present)
			rc = io_fail(err, SNAP_ENOENT, "step %" PRIu64 " of job %s is not persisted: %" PRIu32 " of %"
				     PRIu32 " ranks are in sealed parts under %s, rank %" PRIu32 " is not", step, job,
				     covered, w, pattern, r);
	if (rc) {
		free(all);
		return rc;
	}
	*world = w;
	if (ranks)
		*ranks = all;
	else
		free(all);
	return 0;
}

int io_manifest_load(const char *dir, const char *job, uint64_t step, int check_files, uint32_t *world,
		     struct io_manifest_rank **ranks, struct snap_io_err *err)
{
	if (io_is_pattern(dir))
		return load_union(dir, job, step, check_files, world, ranks, err);
	int part = 0;
	struct io_manifest_rank *r = NULL;
	int rc = io_manifest_read(dir, job, step, check_files, world, &part, &r, err);
	if (!rc && part) {
		free(r);
		return io_fail(err, SNAP_EINVAL, "%s/%s/step-%" PRIu64 ": its MANIFEST is one node's part of the step; "
			       "read the step through the per-node directories' pattern (the node number as %%n)", dir,
			       job, step);
	}
	if (rc)
		return rc;
	if (ranks)
		*ranks = r;
	else
		free(r);
	return 0;
}

int io_rank_path(char *out, size_t cap, const char *dir, const char *job, uint64_t step, uint32_t rank,
		 const struct io_manifest_rank *m)
{
	char nd[4096];
	if (m && m->node >= 0) {
		if (io_node_dir(nd, sizeof nd, dir, (uint32_t)m->node))
			return SNAP_EINVAL;
		dir = nd;
	}
	return io_path_rank(out, cap, dir, job, step, rank);
}

static int desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? 1 : x > y ? -1 : 0;
}

/* "step-<decimal>" with no sign, no leading zeros, no junk. */
int io_parse_step_name(const char *name, uint64_t *step)
{
	if (strncmp(name, "step-", 5) != 0 || name[5] < '0' || name[5] > '9' || (name[5] == '0' && name[6]))
		return -1;
	uint64_t v = 0;
	for (const char *p = name + 5; *p; p++) {
		if (*p < '0' || *p > '9' || v > (UINT64_MAX - 9) / 10)
			return -1;
		v = v * 10 + (uint64_t)(*p - '0');
	}
	*step = v;
	return 0;
}

/* Appends the step numbers of dir/job's step directories to *all (no
 * duplicates). A job directory that does not exist adds none. */
static int add_step_names(const char *dir, const char *job, uint64_t **all, size_t *n, size_t *cap,
			  struct snap_io_err *err)
{
	char jdir[4096];
	if (io_path_job(jdir, sizeof jdir, dir, job))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
	DIR *d = opendir(jdir);
	if (!d) {
		if (errno == ENOENT)
			return 0;
		return io_fail(err, io_errno_code(errno), "%s: cannot list: %s", jdir, strerror(errno));
	}
	size_t first = *n;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		uint64_t s;
		if (io_parse_step_name(e->d_name, &s) < 0)
			continue;
		size_t i = 0;
		while (i < first && (*all)[i] != s)
			i++;   /* only across node directories: one directory has no duplicates */
		if (i < first)
			continue;
		if (*n == *cap) {
			*cap = *cap ? 2 * *cap : 16;
			uint64_t *p = realloc(*all, *cap * sizeof *p);
			if (!p) {
				rc = io_fail(err, SNAP_ENOMEM, "out of memory");
				break;
			}
			*all = p;
		}
		(*all)[(*n)++] = s;
	}
	closedir(d);
	return rc;
}

/* The numbers of the job's step directories in dir, or per node in every
 * node's directory (each number once); *all malloc'd (NULL when none). */
static int step_names(const char *dir, const char *job, uint64_t **all, size_t *n, struct snap_io_err *err)
{
	size_t cap = 0;
	*all = NULL;
	*n = 0;
	if (!io_is_pattern(dir))
		return add_step_names(dir, job, all, n, &cap, err);
	uint32_t *nodes = NULL;
	size_t nn = 0;
	int rc = io_list_nodes(dir, &nodes, &nn, err);
	for (size_t i = 0; i < nn && !rc; i++) {
		char nd[4096];
		rc = io_node_dir(nd, sizeof nd, dir, nodes[i]) ? io_fail(err, SNAP_EINVAL, "path too long: %s", dir)
			: add_step_names(nd, job, all, n, &cap, err);
	}
	free(nodes);
	return rc;
}

int snap_io_list_steps(const char *dir, const char *job, uint64_t *steps, size_t cap, struct snap_io_err *err)
{
	io_err_clear(err);
	int rc = dir ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir");
	if (rc)
		return rc;
	uint64_t *all = NULL;
	size_t n = 0;
	rc = step_names(dir, job, &all, &n, err);
	if (rc) {
		free(all);
		return rc;
	}
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		uint32_t w;
		if (io_manifest_load(dir, job, all[i], 1, &w, NULL, NULL) == 0)
			all[k++] = all[i];
	}
	n = k;
	if (n) /* all is NULL when no step is persisted: qsort(NULL, 0) is undefined */
		qsort(all, n, sizeof *all, desc);
	for (size_t i = 0; i < n && i < cap; i++)
		steps[i] = all[i];
	free(all);
	return n > (size_t)INT32_MAX ? INT32_MAX : (int)n;
}

/* snap_io_lost_step within one directory. */
static int lost_in(const char *dir, const char *job, uint64_t newer_than, uint64_t *step)
{
	char jdir[4096];
	if (io_path_job(jdir, sizeof jdir, dir, job))
		return 0;
	DIR *d = opendir(jdir);
	if (!d)
		return 0;
	int found = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		uint64_t s;
		if (io_parse_step_name(e->d_name, &s) < 0 || s <= newer_than || (found && s <= *step))
			continue;
		char sdir[4400], p[4500];
		if (snprintf(sdir, sizeof sdir, "%s/%s", jdir, e->d_name) >= (int)sizeof sdir)
			continue;
		snprintf(p, sizeof p, "%s/%s", sdir, SNAP_IO_MANIFEST);
		struct stat st;
		if (lstat(p, &st) == 0)
			continue;   /* sealed (listed, or damaged: the caller's other checks) */
		snprintf(p, sizeof p, "%s/%s", sdir, SNAP_IO_INCOMPLETE);
		if (lstat(p, &st) == 0 || errno != ENOENT)
			continue;   /* a flush that never finished */
		DIR *sd = opendir(sdir);
		struct dirent *f;
		int rank_file = 0;
		while (sd && !rank_file && (f = readdir(sd)) != NULL)
			rank_file = io_is_rank_name(f->d_name);
		if (sd)
			closedir(sd);
		if (rank_file) {
			*step = s;
			found = 1;
		}
	}
	closedir(d);
	return found;
}

int snap_io_lost_step(const char *dir, const char *job, uint64_t newer_than, uint64_t *step)
{
	if (!dir || io_check_job(job, NULL) < 0)
		return 0;
	if (!io_is_pattern(dir))
		return lost_in(dir, job, newer_than, step);
	uint32_t *nodes = NULL;
	size_t nn = 0;
	int found = 0;
	if (io_list_nodes(dir, &nodes, &nn, NULL))
		return 0;
	for (size_t i = 0; i < nn; i++) {
		char nd[4096];
		uint64_t s;
		if (!io_node_dir(nd, sizeof nd, dir, nodes[i]) && lost_in(nd, job, newer_than, &s) && (!found || s > *step)) {
			*step = s;
			found = 1;
		}
	}
	free(nodes);
	return found;
}

int snap_io_sealed_step(const char *dir, const char *job, uint64_t *step)
{
	if (!dir || io_check_job(job, NULL) < 0)
		return 0;
	uint64_t *all = NULL;
	size_t n = 0;
	int rc = step_names(dir, job, &all, &n, NULL);
	int found = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		if (found && all[i] <= *step)
			continue;
		uint32_t w;
		/* files unchecked: damage to them is what the caller looks for; a
		 * torn MANIFEST (or part), or something else in its place, is
		 * damage too, never an unfinished flush (which has none) */
		int r = io_manifest_load(dir, job, all[i], 0, &w, NULL, NULL);
		if (r == 0 || r == SNAP_ECORRUPT || r == SNAP_EFORMAT) {
			*step = all[i];
			found = 1;
		}
	}
	free(all);
	return found;
}

int snap_io_newest_step(const char *dir, const char *job, uint64_t *step, struct snap_io_err *err)
{
	uint64_t s = 0;
	int n = snap_io_list_steps(dir, job, &s, 1, err);
	if (n < 0)
		return n;
	if (n == 0)
		return io_fail(err, SNAP_ENOENT, "%s/%s: no persisted step", dir, job);
	*step = s;
	return 0;
}

int snap_io_step_world(const char *dir, const char *job, uint64_t step, uint32_t *world, struct snap_io_err *err)
{
	io_err_clear(err);
	int rc = dir ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir");
	if (rc)
		return rc;
	return io_manifest_load(dir, job, step, 1, world, NULL, err);
}
