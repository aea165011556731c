/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One rank's file for one step. HDF5 lays out the file and writes all
 * metadata; the bulk bytes of uncompressed regions go through io_uring into
 * storage HDF5 allocated early (contiguous layout, 4096-aligned), after the
 * file is closed. LZ4 regions are compressed here, chunk by chunk, and
 * handed to H5Dwrite_chunk with filter 32004 in the pipeline, so that path
 * is HDF5's own pwrite, not io_uring (see docs/io-format.md). Frame regions
 * (codec streams) go as they are, one chunk per frame (frames.c).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io_int.h"

struct snap_io_writer {
	struct snap_io_opts o;
	struct io_uring_writer *uw;
};

struct snap_io_writer *snap_io_writer_new(const struct snap_io_opts *opts, struct snap_io_err *err)
{
	io_err_clear(err);
	struct snap_io_opts o = opts ? *opts : (struct snap_io_opts){0};
	if (!o.chunk_bytes) o.chunk_bytes = 4u << 20;
	if (!o.io_bytes) o.io_bytes = 4u << 20;
	if (!o.queue_depth) o.queue_depth = 8;
	if (!o.mode) o.mode = 0600;
	if (o.mode > 0777 || (o.mode & 0600) != 0600) {
		io_fail(err, SNAP_EINVAL, "file mode %03o: expected permission bits that include 0600", o.mode);
		return NULL;
	}
	if (o.codec != SNAP_IO_CODEC_NONE && o.codec != SNAP_IO_CODEC_LZ4) {
		io_fail(err, SNAP_EINVAL, "unknown codec %d", o.codec);
		return NULL;
	}
	if (o.io_bytes % SNAP_IO_ALIGN || o.io_bytes > (1u << 30) || o.queue_depth > 256 ||
	    o.chunk_bytes > (1u << 30)) {
		io_fail(err, SNAP_EINVAL, "bad writer options: io_bytes %zu (multiple of %d, <= 1 GiB), "
			"queue_depth %u (<= 256), chunk_bytes %zu (<= 1 GiB)",
			o.io_bytes, SNAP_IO_ALIGN, o.queue_depth, o.chunk_bytes);
		return NULL;
	}
	struct snap_io_writer *w = calloc(1, sizeof *w);
	if (!w) {
		io_fail(err, SNAP_ENOMEM, "out of memory");
		return NULL;
	}
	w->o = o;
	w->uw = io_uw_new(o.queue_depth, o.io_bytes);
	if (!w->uw) {
		free(w);
		io_fail(err, SNAP_EUNSUPPORTED, "io_uring setup failed (queue depth %u)", o.queue_depth);
		return NULL;
	}
	return w;
}

void snap_io_writer_free(struct snap_io_writer *w)
{
	if (!w)
		return;
	io_uw_free(w->uw);
	free(w);
}

hid_t io_h5_type(int dtype)
{
	hid_t base;
	switch (dtype) {
	case SNAP_DTYPE_U8: case SNAP_DTYPE_BOOL: base = H5T_STD_U8LE; break;
	case SNAP_DTYPE_I8: base = H5T_STD_I8LE; break;
	case SNAP_DTYPE_I16: base = H5T_STD_I16LE; break;
	case SNAP_DTYPE_I32: base = H5T_STD_I32LE; break;
	case SNAP_DTYPE_I64: base = H5T_STD_I64LE; break;
	case SNAP_DTYPE_U16: case SNAP_DTYPE_BF16: base = H5T_STD_U16LE; break;
	case SNAP_DTYPE_U32: base = H5T_STD_U32LE; break;
	case SNAP_DTYPE_U64: base = H5T_STD_U64LE; break;
	case SNAP_DTYPE_F32: base = H5T_IEEE_F32LE; break;
	case SNAP_DTYPE_F64: base = H5T_IEEE_F64LE; break;
	case SNAP_DTYPE_F16: {
		/* IEEE half, built the way h5py builds it so h5py reads float16. */
		hid_t t = H5Tcopy(H5T_IEEE_F32LE);
		if (t < 0 || H5Tset_fields(t, 15, 10, 5, 0, 10) < 0 || H5Tset_size(t, 2) < 0 ||
		    H5Tset_ebias(t, 15) < 0) {
			if (t >= 0)
				H5Tclose(t);
			return -1;
		}
		return t;
	}
	default: return -1;
	}
	return H5Tcopy(base);
}

int io_attr_str(hid_t obj, const char *name, const char *val)
{
	hid_t t = H5Tcopy(H5T_C_S1), s = H5Screate(H5S_SCALAR), a = -1;
	int rc = -1;
	if (t >= 0 && s >= 0 && H5Tset_size(t, strlen(val) + 1) >= 0 && H5Tset_strpad(t, H5T_STR_NULLTERM) >= 0 &&
	    (a = H5Acreate2(obj, name, t, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 && H5Awrite(a, t, val) >= 0)
		rc = 0;
	if (a >= 0) H5Aclose(a);
	if (s >= 0) H5Sclose(s);
	if (t >= 0) H5Tclose(t);
	return rc;
}

int io_attr_u64(hid_t obj, const char *name, const uint64_t *v, size_t n)
{
	hsize_t dims[1] = {n};
	hid_t s = H5Screate_simple(1, dims, NULL), a = -1;
	int rc = -1;
	if (s >= 0 && (a = H5Acreate2(obj, name, H5T_STD_U64LE, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
	    H5Awrite(a, H5T_NATIVE_UINT64, v) >= 0)
		rc = 0;
	if (a >= 0) H5Aclose(a);
	if (s >= 0) H5Sclose(s);
	return rc;
}

int io_attr_u32(hid_t obj, const char *name, uint32_t v)
{
	hid_t s = H5Screate(H5S_SCALAR), a = -1;
	int rc = -1;
	if (s >= 0 && (a = H5Acreate2(obj, name, H5T_STD_U32LE, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
	    H5Awrite(a, H5T_NATIVE_UINT32, &v) >= 0)
		rc = 0;
	if (a >= 0) H5Aclose(a);
	if (s >= 0) H5Sclose(s);
	return rc;
}

int io_attr_u32s(hid_t obj, const char *name, const uint32_t *v, size_t n)
{
	hsize_t dims[1] = {n};
	hid_t s = H5Screate_simple(1, dims, NULL), a = -1;
	int rc = -1;
	if (s >= 0 && (a = H5Acreate2(obj, name, H5T_STD_U32LE, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
	    H5Awrite(a, H5T_NATIVE_UINT32, v) >= 0)
		rc = 0;
	if (a >= 0) H5Aclose(a);
	if (s >= 0) H5Sclose(s);
	return rc;
}

int io_attrs_region(hid_t ds, const struct snap_io_region *g, const char *codec, uint64_t step)
{
	if (io_attr_str(ds, "name", g->name) < 0 || io_attr_str(ds, "kind", snap_kind_name(g->kind)) < 0 ||
	    io_attr_str(ds, "dtype", snap_dtype_name(g->dtype)) < 0 || io_attr_str(ds, "codec", codec) < 0 ||
	    io_attr_u64(ds, "step", &step, 1) < 0 ||
	    io_attr_u64(ds, "global_shape", g->global_shape, (size_t)g->ndim) < 0 ||
	    io_attr_u64(ds, "shard_offset", g->shard_offset, (size_t)g->ndim) < 0)
		return -1;
	return 0;
}

static int name_cmp(const void *a, const void *b)
{
	const struct snap_io_region *x = *(const struct snap_io_region *const *)a;
	const struct snap_io_region *y = *(const struct snap_io_region *const *)b;
	return strcmp(x->name, y->name);
}

static int check_regions(const struct snap_io_region *r, size_t n, struct snap_io_err *err)
{
	char tmp[3 * SNAP_IO_MAX_NAME + 1];
	for (size_t i = 0; i < n; i++) {
		const struct snap_io_region *g = &r[i];
		if (!g->name || io_sanitise(g->name, tmp, sizeof tmp) < 0)
			return io_fail(err, SNAP_EINVAL, "region %zu: name missing, empty or longer than %d bytes",
				       i, SNAP_IO_MAX_NAME);
		size_t es = snap_dtype_size(g->dtype);
		if (!es || g->kind < 0 || g->kind >= SNAP_KIND_COUNT_ || g->ndim < 1 || g->ndim > SNAP_MAX_NDIM)
			return io_fail(err, SNAP_EINVAL, "region \"%s\": bad dtype %d, kind %d or ndim %d",
				       g->name, g->dtype, g->kind, g->ndim);
		uint64_t elems = 1;
		for (int d = 0; d < g->ndim; d++) {
			if (g->shard_offset[d] > g->global_shape[d] ||
			    g->shape[d] > g->global_shape[d] - g->shard_offset[d])
				return io_fail(err, SNAP_EINVAL, "region \"%s\": shard [%" PRIu64 "+%" PRIu64
					       ") outside global dim %d of %" PRIu64, g->name, g->shard_offset[d],
					       g->shape[d], d, g->global_shape[d]);
			if (g->shape[d] && elems > UINT64_MAX / g->shape[d])
				return io_fail(err, SNAP_EINVAL, "region \"%s\": shape overflows", g->name);
			elems *= g->shape[d];
		}
		if (elems > SIZE_MAX / es || elems * es != g->bytes)
			return io_fail(err, SNAP_EINVAL, "region \"%s\": %zu bytes but shape x %s needs %" PRIu64,
				       g->name, g->bytes, snap_dtype_name(g->dtype), elems * es);
		int e = g->nframes ? io_frames_check(g, err) : 0;
		if (e)
			return e;
		if (!g->nframes && g->bytes && !g->data)
			return io_fail(err, SNAP_EINVAL, "region \"%s\": data is NULL", g->name);
	}
	const struct snap_io_region **s = malloc((n ? n : 1) * sizeof *s);
	if (!s)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		s[i] = &r[i];
	qsort(s, n, sizeof *s, name_cmp);
	int rc = 0;
	for (size_t i = 1; i < n && !rc; i++)
		if (strcmp(s[i - 1]->name, s[i]->name) == 0)
			rc = io_fail(err, SNAP_EINVAL, "region name \"%s\" given twice", s[i]->name);
	free(s);
	return rc;
}

struct lz4buf {
	unsigned char *raw, *enc;
	size_t cap;
};

static int write_lz4(hid_t ds, const struct snap_io_region *g, const struct io_chunk_geom *cg,
		     struct lz4buf *b, uint32_t *crc, uint64_t *stored)
{
	size_t full = cg->full;
	if (full > b->cap) {
		free(b->raw);
		free(b->enc);
		b->raw = malloc(full);
		b->enc = malloc(io_lz4_bound(full));
		b->cap = b->raw && b->enc ? full : 0;
		if (!b->cap)
			return SNAP_ENOMEM;
	}
	const unsigned char *src = g->data;
	for (uint64_t o = 0; o < cg->outer; o++) {
		for (uint64_t r = 0; r < cg->runs; r++) {
			hsize_t off[SNAP_MAX_NDIM];
			uint64_t at;
			size_t len;
			io_chunk_at(cg, o, r, off, &at, &len);
			const unsigned char *p = src + (size_t)at;
			*crc = io_crc_update(*crc, p, len);
			const void *in = p;
			if (len < full) { /* edge chunk: HDF5 stores it full size */
				memcpy(b->raw, p, len);
				memset(b->raw + len, 0, full - len);
				in = b->raw;
			}
			size_t k = io_lz4_encode(in, full, b->enc);
			if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, off, k, b->enc) < 0)
				return SNAP_EIO;
			*stored += k;
		}
	}
	return 0;
}

struct plan {
	haddr_t off;
	uint32_t expect;
};

static atomic_uint tmp_seq;

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* HDF5 phase: the whole file but the uncompressed bulk bytes. */
static int build_file(struct snap_io_writer *w, const char *tmp, const char *final, const char *job,
		      uint64_t step, uint32_t rank, uint32_t world, const struct snap_io_region *r,
		      size_t n, struct plan *plan, uint64_t *stored, struct snap_io_err *err)
{
	int rc = 0;
	char dsname[3 * SNAP_IO_MAX_NAME + 1];
	struct lz4buf lb = {0};
	hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
	if (fapl < 0 || H5Pset_alignment(fapl, SNAP_IO_ALIGN, SNAP_IO_ALIGN) < 0) {
		if (fapl >= 0)
			H5Pclose(fapl);
		return io_fail_h5(err, SNAP_EIO, "%s: HDF5 property setup failed", final);
	}
	/* Create the file ourselves with the configured bits (fchmod: the umask
	 * must not widen or narrow them), then let HDF5 take it over. */
	int tfd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (tfd < 0 || fchmod(tfd, w->o.mode) != 0) {
		int e = errno;
		if (tfd >= 0) {
			close(tfd);
			unlink(tmp);
		}
		H5Pclose(fapl);
		return io_fail(err, io_errno_code(e), "%s: cannot create temp file %s: %s", final, tmp, strerror(e));
	}
	close(tfd);
	errno = 0;
	f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
	H5Pclose(fapl);
	if (f < 0) {
		int e = errno;
		return io_fail_h5(err, e ? io_errno_code(e) : SNAP_EIO, "%s: cannot create temp file %s", final, tmp);
	}
	uint64_t u[2] = {step, SNAP_IO_FORMAT_VERSION};
	if (io_attr_str(f, "format", SNAP_IO_FORMAT_NAME) < 0 || io_attr_u64(f, "format_version", &u[1], 1) < 0 ||
	    io_attr_str(f, "job", job) < 0 || io_attr_u64(f, "step", &u[0], 1) < 0 ||
	    io_attr_u32(f, "rank", rank) < 0 || io_attr_u32(f, "world", world) < 0) {
		rc = io_fail_h5(err, SNAP_EIO, "%s: writing file attributes failed", final);
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		const struct snap_io_region *g = &r[i];
		int lz4 = w->o.codec == SNAP_IO_CODEC_LZ4 && g->bytes > 0;
		io_sanitise(g->name, dsname, sizeof dsname);
		plan[i].off = HADDR_UNDEF;
		if (g->nframes) {
			rc = io_frames_write(f, final, dsname, g, step, stored, err);
			continue;
		}
		plan[i].expect = g->has_crc ? g->crc32c : snap_io_crc32c(g->data, g->bytes);
		hsize_t dims[SNAP_MAX_NDIM];
		for (int d = 0; d < g->ndim; d++)
			dims[d] = g->shape[d];
		hid_t t = io_h5_type(g->dtype), s = H5Screate_simple(g->ndim, dims, NULL);
		hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
		int ok = t >= 0 && s >= 0 && dcpl >= 0 && H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
		struct io_chunk_geom cg;
		if (lz4)
			io_chunk_plan(g->shape, g->ndim, snap_dtype_size(g->dtype), w->o.chunk_bytes, &cg);
		if (ok && lz4) {
			unsigned cd[1] = {(unsigned)cg.full};
			ok = H5Pset_chunk(dcpl, g->ndim, cg.chunk) >= 0 &&
			     H5Pset_filter(dcpl, SNAP_IO_LZ4_FILTER, H5Z_FLAG_OPTIONAL, 1, cd) >= 0;
		} else if (ok) {
			ok = H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
			     H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0;
		}
		if (ok)
			ds = H5Dcreate2(f, dsname, t, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
		if (ds < 0) {
			rc = io_fail_h5(err, SNAP_EIO, "%s: cannot create dataset \"%s\"", final, dsname);
		} else if (io_attrs_region(ds, g, lz4 ? "lz4" : "none", step) < 0 ||
			   io_attr_u32(ds, "crc32c", plan[i].expect) < 0) {
			rc = io_fail_h5(err, SNAP_EIO, "%s: writing attributes of dataset \"%s\" failed", final, dsname);
		} else if (lz4) {
			uint32_t c = 0xFFFFFFFFu;
			errno = 0;
			int e = write_lz4(ds, g, &cg, &lb, &c, stored);
			if (e == SNAP_ENOMEM)
				rc = io_fail(err, e, "%s: out of memory for LZ4 chunk of dataset \"%s\"", final, dsname);
			else if (e)
				rc = io_fail_h5(err, errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO,
						"%s: writing LZ4 chunk of dataset \"%s\" failed", final, dsname);
			else if ((c ^ 0xFFFFFFFFu) != plan[i].expect)
				rc = io_fail(err, SNAP_ECORRUPT, "%s: region \"%s\" (dataset \"%s\") does not match its "
					     "CRC32C %08x: source memory changed or is corrupt", final, g->name, dsname,
					     plan[i].expect);
		} else if (g->bytes) {
			plan[i].off = H5Dget_offset(ds);
			if (plan[i].off == HADDR_UNDEF)
				rc = io_fail_h5(err, SNAP_EIO, "%s: no storage for dataset \"%s\"", final, dsname);
			*stored += g->bytes;
		}
		if (ds >= 0) H5Dclose(ds);
		if (dcpl >= 0) H5Pclose(dcpl);
		if (s >= 0) H5Sclose(s);
		if (t >= 0) H5Tclose(t);
	}
out:
	free(lb.raw);
	free(lb.enc);
	errno = 0;
	if (H5Fclose(f) < 0 && !rc) {
		int e = errno;
		rc = io_fail_h5(err, e == ENOSPC ? SNAP_ENOSPC : SNAP_EIO, "%s: closing HDF5 file failed", final);
	}
	return rc;
}

static int bulk_write(struct snap_io_writer *w, const char *tmp, const char *final,
		      const struct snap_io_region *r, size_t n, const struct plan *plan, int *direct,
		      struct snap_io_err *err)
{
	int fd = open(tmp, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return io_fail(err, io_errno_code(e), "%s: cannot reopen %s: %s", final, tmp, strerror(e));
	}
	int fdd = -1;
	if (!(w->o.flags & SNAP_IO_NO_DIRECT))
		fdd = open(tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
	*direct = fdd >= 0;
	int rc = 0;
	char dsname[3 * SNAP_IO_MAX_NAME + 1];
	int e = io_uw_begin(w->uw, fdd, fd);
	if (e) {
		if (fdd >= 0)
			close(fdd);
		close(fd);
		return io_fail(err, SNAP_EIO, "%s: rebuilding the io_uring ring after an earlier failure failed: %s",
			       final, strerror(-e));
	}
	/* Writes of all regions stay in flight together; the CRC is complete
	 * once a region is queued, so it is checked per region here, and the
	 * writes are drained once at the end. Each write carries its region's
	 * index so a failure still names the dataset. */
	size_t bad_crc = SIZE_MAX;
	for (size_t i = 0; i < n; i++) {
		if (plan[i].off == HADDR_UNDEF)
			continue;
		uint32_t c = 0xFFFFFFFFu;
		if ((e = io_uw_write(w->uw, r[i].data, r[i].bytes, plan[i].off, &c, i)) != 0)
			break;
		if ((c ^ 0xFFFFFFFFu) != plan[i].expect) {
			bad_crc = i;
			break;
		}
	}
	int d = io_uw_drain(w->uw);
	if (!e)
		e = d;
	/* The lower region index is the first failure in file order. */
	size_t bad_io = e ? io_uw_error_tag(w->uw) : SIZE_MAX;
	if (e && bad_io <= bad_crc) {
		io_sanitise(r[bad_io].name, dsname, sizeof dsname);
		rc = io_fail(err, io_errno_code(-e) == SNAP_ENOENT ? SNAP_EIO : io_errno_code(-e),
			     "%s: writing data of dataset \"%s\" failed: %s", final, dsname, strerror(-e));
	} else if (bad_crc < n) {
		io_sanitise(r[bad_crc].name, dsname, sizeof dsname);
		rc = io_fail(err, SNAP_ECORRUPT, "%s: region \"%s\" (dataset \"%s\") does not match its "
			     "CRC32C %08x: source memory changed or is corrupt", final, r[bad_crc].name, dsname,
			     plan[bad_crc].expect);
	}
	if (!rc && fsync(fd) < 0) {
		e = errno;
		rc = io_fail(err, io_errno_code(e), "%s: fsync failed: %s", final, strerror(e));
	}
	if (io_uw_inflight(w->uw) > 0) {
		/* The drain gave up with writes in flight (rc is set): keep their
		 * fds open, leaked, so the numbers are not reused under them. */
		return rc ? rc : io_fail(err, SNAP_EIO, "%s: io_uring writes still in flight", final);
	}
	if (fdd >= 0)
		close(fdd);
	if (close(fd) < 0 && !rc) {
		e = errno;
		rc = io_fail(err, io_errno_code(e), "%s: close failed: %s", final, strerror(e));
	}
	return rc;
}

/*
 * A failed write leaves nothing behind: when the unfinished-flush mark is
 * the step directory's only entry (no rank file, no other writer's temp
 * file), remove it too. A writer starting at that very moment could end up
 * with a rank file and no mark; if its flush is then never sealed, the step
 * reads as lost (restore asks for SNAP_ALLOW_OLDER), which errs on the
 * safe side.
 */
static void drop_lone_mark(const char *sdir, const char *mark)
{
	DIR *d = opendir(sdir);
	if (!d)
		return;
	int others = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		others += strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, SNAP_IO_INCOMPLETE);
	closedir(d);
	if (!others)
		unlink(mark);
}

int snap_io_write_rank(struct snap_io_writer *w, const char *dir, const char *job,
		       uint64_t step, uint32_t rank, uint32_t world,
		       const struct snap_io_region *regions, size_t n,
		       struct snap_io_write_stats *stats, struct snap_io_err *err)
{
	io_err_clear(err);
	double t0 = now_s();
	int rc;
	if (!w || !dir || (n && !regions))
		return io_fail(err, SNAP_EINVAL, "snap_io_write_rank: NULL writer, dir or regions");
	if ((rc = io_check_job(job, err)) < 0)
		return rc;
	if (rank >= world)
		return io_fail(err, SNAP_EINVAL, "rank %" PRIu32 " not below world size %" PRIu32, rank, world);
	if ((rc = check_regions(regions, n, err)) < 0)
		return rc;
	char sdir[4096], final[4096], tmp[4200], man[4200];
	if (io_path_step(sdir, sizeof sdir, dir, job, step) || io_path_rank(final, sizeof final, dir, job, step, rank))
		return io_fail(err, SNAP_EINVAL, "flush directory path too long: %s", dir);
	snprintf(man, sizeof man, "%s/%s", sdir, SNAP_IO_MANIFEST);
	if (access(man, F_OK) == 0)
		return io_fail(err, SNAP_ESTATE, "%s: step %" PRIu64 " is already persisted; not rewriting it", sdir, step);
	if ((rc = io_mkdirs(sdir, io_dir_mode(w->o.mode), err)) < 0)
		return rc;
	/* Mark the step unfinished before any rank file can appear (the rank
	 * file's directory fsync below makes the mark durable with it). */
	char mark[4200];
	snprintf(mark, sizeof mark, "%s/%s", sdir, SNAP_IO_INCOMPLETE);
	int mfd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (mfd < 0) {
		int e = errno;
		return io_fail(err, io_errno_code(e), "%s: cannot create %s: %s", final, mark, strerror(e));
	}
	close(mfd);
	snprintf(tmp, sizeof tmp, "%s/.rank-%" PRIu32 ".h5.tmp.%d.%u", sdir, rank, (int)getpid(),
		 atomic_fetch_add(&tmp_seq, 1));
	struct plan *plan = calloc(n ? n : 1, sizeof *plan);
	if (!plan)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	uint64_t stored = 0;
	io_h5_enter();
	rc = build_file(w, tmp, final, job, step, rank, world, regions, n, plan, &stored, err);
	io_h5_leave();
	int direct = 0;
	if (!rc)
		rc = bulk_write(w, tmp, final, regions, n, plan, &direct, err);
	free(plan);
	struct stat st = {0};
	if (!rc && stat(tmp, &st) < 0)
		rc = io_fail(err, SNAP_EIO, "%s: temp file vanished: %s", final, strerror(errno));
	if (!rc && rename(tmp, final) < 0) {
		int e = errno;
		rc = io_fail(err, io_errno_code(e), "%s: rename from %s failed: %s", final, tmp, strerror(e));
	}
	if (rc) {
		unlink(tmp);
		drop_lone_mark(sdir, mark);
		return rc;
	}
	/* The file is complete, fsynced and in place: it stays (see io.h). */
	if ((rc = io_fsync_dir(sdir)) < 0)
		return io_fail(err, io_errno_code(-rc), "%s: fsync of directory failed: %s (%s is complete and in "
			       "place; only its directory entry may not be durable)", sdir, strerror(-rc), final);
	if (stats) {
		uint64_t raw = 0;
		for (size_t i = 0; i < n; i++)
			raw += regions[i].bytes;
		stats->raw_bytes = raw;
		stats->stored_bytes = stored;
		stats->file_bytes = (uint64_t)st.st_size;
		stats->seconds = now_s() - t0;
		stats->direct = direct;
	}
	return 0;
}
