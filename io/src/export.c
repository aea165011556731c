/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Export: one HDF5 file, one dataset per logical tensor at its global shape,
 * assembled from the rank shards either as HDF5 virtual datasets (no copy)
 * or materialised. Only metadata of every rank file is held at once.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io_int.h"

struct shard {
	char *name, *dataset;
	char *src;              /* the rank file's absolute path (shared by its shards) */
	uint32_t rank;
	int chosen;
	struct snap_io_region_info info;
};

static atomic_uint tmp_seq;

static int shard_cmp(const void *a, const void *b)
{
	const struct shard *x = a, *y = b;
	int c = strcmp(x->name, y->name);
	return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int whole(const struct snap_io_region_info *i)
{
	for (int d = 0; d < i->ndim; d++)
		if (i->shape[d] != i->global_shape[d])
			return 0;
	return 1;
}

static int same_box(const struct snap_io_region_info *a, const struct snap_io_region_info *b)
{
	for (int d = 0; d < a->ndim; d++)
		if (a->shard_offset[d] != b->shard_offset[d] || a->shape[d] != b->shape[d])
			return 0;
	return 1;
}

static int overlap(const struct snap_io_region_info *a, const struct snap_io_region_info *b)
{
	for (int d = 0; d < a->ndim; d++)
		if (a->shard_offset[d] >= b->shard_offset[d] + b->shape[d] ||
		    b->shard_offset[d] >= a->shard_offset[d] + a->shape[d])
			return 0;
	return 1;
}

/* Chooses the shards that make up tensor s[0..n) (sorted by rank). */
static int choose(struct shard *s, size_t n, struct snap_io_err *err)
{
	const struct snap_io_region_info *g = &s[0].info;
	for (size_t i = 1; i < n; i++) {
		const struct snap_io_region_info *h = &s[i].info;
		int same = h->dtype == g->dtype && h->ndim == g->ndim;
		for (int d = 0; same && d < g->ndim; d++)
			same = h->global_shape[d] == g->global_shape[d];
		if (!same)
			return io_fail(err, SNAP_EMISMATCH, "tensor \"%s\": rank %" PRIu32 " and rank %" PRIu32
				       " disagree on dtype or global shape", s[0].name, s[0].rank, s[i].rank);
	}
	for (size_t i = 0; i < n; i++)
		if (whole(&s[i].info)) {
			s[i].chosen = 1;
			return 0;
		}
	uint64_t total = 1, covered = 0;
	for (int d = 0; d < g->ndim; d++)
		total *= g->global_shape[d];
	for (size_t i = 0; i < n; i++) {
		int dup = 0;
		for (size_t k = 0; k < i && !dup; k++) {
			if (!s[k].chosen || !overlap(&s[k].info, &s[i].info))
				continue;
			if (!same_box(&s[k].info, &s[i].info))
				return io_fail(err, SNAP_EMISMATCH, "tensor \"%s\": shards of rank %" PRIu32 " and rank %"
					       PRIu32 " overlap", s[0].name, s[k].rank, s[i].rank);
			dup = 1; /* a replica: the lower rank's copy is used */
		}
		if (dup)
			continue;
		s[i].chosen = 1;
		uint64_t e = 1;
		for (int d = 0; d < g->ndim; d++)
			e *= s[i].info.shape[d];
		covered += e;
	}
	if (covered != total)
		return io_fail(err, SNAP_EMISMATCH, "tensor \"%s\": shards cover %" PRIu64 " of %" PRIu64 " elements",
			       s[0].name, covered, total);
	return 0;
}

/* VDS source names are printf-like ("%b"): a literal '%' is "%%". */
static void vds_escape(const char *in, char *out, size_t cap)
{
	size_t k = 0;
	for (; *in && k + 2 < cap; in++) {
		if (*in == '%')
			out[k++] = '%';
		out[k++] = *in;
	}
	out[k] = '\0';
}

/* Path of `to` relative to directory `from` (both absolute, normalised). */
static void relpath(const char *from, const char *to, char *out, size_t cap)
{
	size_t common = 0, i = 0;
	while (from[i] && to[i] && from[i] == to[i]) {
		i++;
		if (from[i] == '/' || from[i] == '\0')
			if (to[i] == '/')
				common = i;
	}
	if (strcmp(from, "/") == 0)
		common = 0;
	size_t k = 0;
	out[0] = '\0';
	for (const char *p = from + common; *p; p++)
		if (*p == '/')
			k += (size_t)snprintf(out + k, k < cap ? cap - k : 0, "../");
	snprintf(out + k, k < cap ? cap - k : 0, "%s", to + common + 1);
}

static int collect(const char *dir, const char *job, uint64_t step, uint32_t world,
		   const struct io_manifest_rank *m, struct shard **out, size_t *nout, struct snap_io_err *err)
{
	struct shard *s = NULL;
	size_t n = 0, cap = 0;
	int rc = 0;
	for (uint32_t r = 0; r < world && !rc; r++) {
		char path[4096];
		hid_t f;
		struct io_ds *ds = NULL;
		size_t nd = 0;
		if (io_rank_path(path, sizeof path, dir, job, step, r, &m[r])) {
			rc = io_fail(err, SNAP_EINVAL, "flush directory path too long: %s", dir);
			break;
		}
		struct io_rank_id id = {job, step, r, world};
		if ((rc = io_rank_open(path, &id, &f, &ds, &nd, err)) < 0)
			break;
		H5Fclose(f);
		char abs[PATH_MAX];
		if (!realpath(path, abs)) {
			rc = io_fail(err, io_errno_code(errno), "cannot resolve %s: %s", path, strerror(errno));
			free(ds);
			break;
		}
		for (size_t i = 0; i < nd && !rc; i++) {
			if (n == cap) {
				cap = cap ? 2 * cap : 64;
				struct shard *p = realloc(s, cap * sizeof *p);
				if (!p) {
					rc = io_fail(err, SNAP_ENOMEM, "out of memory");
					break;
				}
				s = p;
			}
			struct shard *x = &s[n];
			x->name = strdup(ds[i].name);
			x->dataset = strdup(ds[i].dataset);
			x->rank = r;
			x->src = strdup(abs);
			x->chosen = 0;
			x->info = ds[i].info;
			n++;
			if (!x->name || !x->dataset || !x->src)
				rc = io_fail(err, SNAP_ENOMEM, "out of memory");
		}
		free(ds);
	}
	*out = s;
	*nout = n;
	return rc;
}

static int make_dataset(hid_t f, const char *out, const char *dir_abs, struct shard *s, size_t n, int mode,
			struct snap_io_err *err)
{
	const struct snap_io_region_info *g = &s[0].info;
	char dsname[3 * SNAP_IO_MAX_NAME + 1];
	io_sanitise(s[0].name, dsname, sizeof dsname);
	hsize_t gdims[SNAP_MAX_NDIM];
	for (int d = 0; d < g->ndim; d++)
		gdims[d] = g->global_shape[d];
	hid_t t = io_h5_type(g->dtype), gs = H5Screate_simple(g->ndim, gdims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
	int rc = 0;
	if (t < 0 || gs < 0 || dcpl < 0)
		rc = io_fail_h5(err, SNAP_EIO, "%s: HDF5 setup failed for \"%s\"", out, s[0].name);
	for (size_t i = 0; i < n && !rc && mode == SNAP_IO_EXPORT_VIRTUAL; i++) {
		if (!s[i].chosen)
			continue;
		char rel[PATH_MAX + 64], esc_f[2 * PATH_MAX + 160], esc_d[6200];
		relpath(dir_abs, s[i].src, rel, sizeof rel);
		vds_escape(rel, esc_f, sizeof esc_f);
		vds_escape(s[i].dataset, esc_d, sizeof esc_d);
		hsize_t off[SNAP_MAX_NDIM], cnt[SNAP_MAX_NDIM], flat[1] = {1};
		for (int d = 0; d < g->ndim; d++) {
			off[d] = s[i].info.shard_offset[d];
			cnt[d] = s[i].info.shape[d];
			flat[0] *= cnt[d];
		}
		/* A frame dataset is flat; its values in order are the box's. */
		int frames = s[i].info.codec == SNAP_IO_CODEC_FRAMES;
		hid_t vs = H5Scopy(gs), ss = frames ? H5Screate_simple(1, flat, NULL) : H5Screate_simple(g->ndim, cnt, NULL);
		if (vs < 0 || ss < 0 || H5Sselect_hyperslab(vs, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0 ||
		    H5Pset_virtual(dcpl, vs, esc_f, esc_d, ss) < 0)
			rc = frames ? io_fail_h5(err, SNAP_EUNSUPPORTED, "%s: HDF5 cannot map the flat codec-frame "
						 "dataset \"%s\" of rank %" PRIu32 " into a virtual dataset; export "
						 "steps with codec regions with --copy", out, s[i].dataset, s[i].rank)
				    : io_fail_h5(err, SNAP_EIO, "%s: mapping rank %" PRIu32 " dataset \"%s\" failed", out,
						 s[i].rank, s[i].dataset);
		if (vs >= 0) H5Sclose(vs);
		if (ss >= 0) H5Sclose(ss);
	}
	hid_t ds = -1;
	if (!rc && (ds = H5Dcreate2(f, dsname, t, gs, H5P_DEFAULT, dcpl, H5P_DEFAULT)) < 0)
		rc = io_fail_h5(err, SNAP_EIO, "%s: cannot create dataset \"%s\"", out, dsname);
	uint64_t nsh = 0;
	for (size_t i = 0; i < n; i++)
		nsh += (uint64_t)s[i].chosen;
	if (!rc && (io_attr_str(ds, "name", s[0].name) < 0 || io_attr_str(ds, "dtype", snap_dtype_name(g->dtype)) < 0 ||
		    io_attr_str(ds, "kind", snap_kind_name(g->kind)) < 0 ||
		    io_attr_u64(ds, "global_shape", g->global_shape, (size_t)g->ndim) < 0 ||
		    io_attr_u64(ds, "shards", &nsh, 1) < 0))
		rc = io_fail_h5(err, SNAP_EIO, "%s: attributes of \"%s\" failed", out, dsname);
	if (ds >= 0) H5Dclose(ds);
	if (dcpl >= 0) H5Pclose(dcpl);
	if (gs >= 0) H5Sclose(gs);
	if (t >= 0) H5Tclose(t);
	return rc;
}

/* Copy mode: one rank file open at a time, one shard in memory at a time. */
static int copy_data(hid_t f, const char *out, const char *job, uint64_t step, uint32_t world,
		     struct shard *s, size_t n, struct snap_io_err *err)
{
	int rc = 0;
	for (uint32_t r = 0; r < world && !rc; r++) {
		const char *path = NULL;
		hid_t rf;
		struct io_ds *ds = NULL;
		size_t nd = 0;
		for (size_t i = 0; i < n && !path; i++)
			if (s[i].chosen && s[i].rank == r)
				path = s[i].src;
		if (!path)
			continue;   /* nothing of this rank's file is copied */
		struct io_rank_id id = {job, step, r, world};
		if ((rc = io_rank_open(path, &id, &rf, &ds, &nd, err)) < 0)
			break;
		for (size_t i = 0; i < n && !rc; i++) {
			if (!s[i].chosen || s[i].rank != r)
				continue;
			const struct io_ds *d = NULL;
			for (size_t k = 0; k < nd && !d; k++)
				if (strcmp(ds[k].dataset, s[i].dataset) == 0)
					d = &ds[k];
			if (!d) {
				rc = io_fail(err, SNAP_ENOENT, "%s: dataset \"%s\" vanished", path, s[i].dataset);
				break;
			}
			void *buf = malloc(d->info.bytes ? d->info.bytes : 1);
			if (!buf) {
				rc = io_fail(err, SNAP_ENOMEM, "out of memory for %" PRIu64 " bytes of \"%s\"", d->info.bytes,
					     d->name);
				break;
			}
			if ((rc = io_ds_read(rf, path, d, buf, err)) == 0 && d->info.bytes) {
				char dsname[3 * SNAP_IO_MAX_NAME + 1];
				io_sanitise(s[i].name, dsname, sizeof dsname);
				hsize_t off[SNAP_MAX_NDIM], cnt[SNAP_MAX_NDIM];
				for (int k = 0; k < d->info.ndim; k++) {
					off[k] = d->info.shard_offset[k];
					cnt[k] = d->info.shape[k];
				}
				hid_t od = H5Dopen2(f, dsname, H5P_DEFAULT);
				hid_t fs = od >= 0 ? H5Dget_space(od) : -1, ms = H5Screate_simple(d->info.ndim, cnt, NULL);
				hid_t t = io_h5_type(d->info.dtype);
				if (od < 0 || fs < 0 || ms < 0 || t < 0 ||
				    H5Sselect_hyperslab(fs, H5S_SELECT_SET, off, NULL, cnt, NULL) < 0 ||
				    H5Dwrite(od, t, ms, fs, H5P_DEFAULT, buf) < 0)
					rc = io_fail_h5(err, SNAP_EIO, "%s: writing \"%s\" from rank %" PRIu32 " failed", out,
							dsname, r);
				if (t >= 0) H5Tclose(t);
				if (ms >= 0) H5Sclose(ms);
				if (fs >= 0) H5Sclose(fs);
				if (od >= 0) H5Dclose(od);
			}
			free(buf);
		}
		H5Fclose(rf);
		free(ds);
	}
	return rc;
}

int snap_io_export(const char *dir, const char *job, uint64_t step, const char *out_path, int mode,
		   struct snap_io_err *err)
{
	io_err_clear(err);
	int rc = dir && out_path ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir or output path");
	if (rc)
		return rc;
	if (mode != SNAP_IO_EXPORT_VIRTUAL && mode != SNAP_IO_EXPORT_COPY)
		return io_fail(err, SNAP_EINVAL, "unknown export mode %d", mode);
	uint32_t world;
	struct io_manifest_rank *m = NULL;
	if ((rc = io_manifest_load(dir, job, step, 1, &world, &m, err)) < 0)
		return rc;
	char out_dir[4096], out_abs[PATH_MAX], tmp[4200];
	snprintf(out_dir, sizeof out_dir, "%s", out_path);
	char *slash = strrchr(out_dir, '/');
	if (!slash)
		snprintf(out_dir, sizeof out_dir, ".");
	else if (slash == out_dir)
		out_dir[1] = '\0';
	else
		*slash = '\0';
	if (!realpath(out_dir, out_abs)) {
		free(m);
		return io_fail(err, io_errno_code(errno), "cannot resolve %s: %s", out_dir, strerror(errno));
	}
	/* pid and a sequence number: concurrent exports in one process to
	 * the same out_path must not share a temp file. */
	if (snprintf(tmp, sizeof tmp, "%s.tmp.%d.%u", out_path, (int)getpid(), atomic_fetch_add(&tmp_seq, 1)) >=
	    (int)sizeof tmp) {
		free(m);
		return io_fail(err, SNAP_EINVAL, "output path too long: %s", out_path);
	}
	struct shard *s = NULL;
	size_t n = 0;
	io_h5_enter();
	rc = collect(dir, job, step, world, m, &s, &n, err);
	free(m);
	if (!rc && n)
		qsort(s, n, sizeof *s, shard_cmp);
	/* Through the rank files' driver, which announces nothing here: a
	 * failed write at the close is reported by us, not left in HDF5's
	 * hands (io_defer_close). */
	hid_t f = -1, fapl = -1;
	struct io_defer d = {0};
	if (!rc && ((fapl = H5Pcreate(H5P_FILE_ACCESS)) < 0 || io_defer_fapl(fapl, &d) < 0))
		rc = io_fail_h5(err, SNAP_EIO, "%s: HDF5 property setup failed", tmp);
	errno = 0;
	if (!rc && (f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl)) < 0)
		rc = io_fail_h5(err, errno ? io_errno_code(errno) : SNAP_EIO, "%s: cannot create", tmp);
	if (fapl >= 0)
		H5Pclose(fapl);
	uint64_t st = step;
	if (!rc && (io_attr_str(f, "format", "snapio-export") < 0 || io_attr_str(f, "job", job) < 0 ||
		    io_attr_u64(f, "step", &st, 1) < 0 || io_attr_u32(f, "source_world", world) < 0 ||
		    io_attr_str(f, "mode", mode == SNAP_IO_EXPORT_COPY ? "copy" : "virtual") < 0))
		rc = io_fail_h5(err, SNAP_EIO, "%s: attributes failed", tmp);
	for (size_t i = 0; i < n && !rc;) {
		size_t k = i + 1;
		while (k < n && strcmp(s[k].name, s[i].name) == 0)
			k++;
		rc = choose(&s[i], k - i, err);
		if (!rc)
			rc = make_dataset(f, out_path, out_abs, &s[i], k - i, mode, err);
		i = k;
	}
	if (!rc && mode == SNAP_IO_EXPORT_COPY)
		rc = copy_data(f, out_path, job, step, world, s, n, err);
	int e = f >= 0 ? io_defer_close(f, &d) : 0;
	if (e < 0 && !rc)
		rc = io_fail_h5(err, SNAP_EIO, "%s: close failed", tmp);
	else if (e > 0 && !rc)
		rc = io_fail(err, io_errno_code(e) == SNAP_ENOENT ? SNAP_EIO : io_errno_code(e),
			     "%s: writing the HDF5 file at its close failed: %s", tmp, strerror(e));
	io_h5_leave();
	for (size_t i = 0; i < n; i++) {
		free(s[i].name);
		free(s[i].dataset);
		free(s[i].src);
	}
	free(s);
	if (!rc) { /* the data must be on disk before the name points at it */
		int fd = open(tmp, O_RDONLY | O_CLOEXEC);
		if (fd < 0 || fsync(fd) < 0)
			rc = io_fail(err, io_errno_code(errno), "%s: fsync failed: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
	}
	if (!rc && rename(tmp, out_path) < 0)
		rc = io_fail(err, io_errno_code(errno), "%s: rename failed: %s", out_path, strerror(errno));
	if (rc)
		unlink(tmp);
	return rc;
}
