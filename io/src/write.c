/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One rank's file for one step. HDF5 lays out the file and writes all
 * metadata; the bulk bytes of uncompressed regions go through io_uring into
 * storage HDF5 allocated early (contiguous layout, 4096-aligned), after the
 * file is closed. Frame regions (codec streams) go as they are, one chunk
 * per frame (frames.c): HDF5 allocates and indexes the chunks, and the
 * driver it writes through (deferdrv.c) leaves their bytes to the same
 * io_uring pass. LZ4 regions are compressed here, chunk by chunk, and handed
 * to H5Dwrite_chunk with filter 32004 in the pipeline; with O_DIRECT the
 * driver records each chunk's offset in the same way and the chunk goes
 * through io_uring at once, copied into the ring's aligned buffers, so the
 * next chunk is compressed while it is written and the chunk buffer stays
 * one (see docs/io-format.md). Without O_DIRECT HDF5 writes LZ4 chunks
 * itself: a buffered io_uring write would read the chunk buffer after it
 * is reused.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
	struct io_defer defer; /* the current file's frame writes; v reused */
	/* write_frames' room for `room` frames, grown as needed and reused: */
	struct io_piece *pieces; /* 2 per frame (the padding before it, it) */
	uint32_t *crc;           /* per frame */
	char *pad;               /* SNAP_IO_ALIGN bytes per frame */
	size_t room;
	/* The bulk pass's descriptors on the current temp file, open from just
	 * after HDF5 creates it (LZ4 chunks are written while HDF5 builds the
	 * file) until it is complete; -1 when closed. */
	int fd, fdd;
	uint64_t lz4_bulk; /* LZ4 bytes queued through io_uring for the current file */
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
	w->fd = w->fdd = -1;
	int e;
	w->uw = io_uw_new(o.queue_depth, o.io_bytes, &e);
	if (!w->uw) {
		free(w);
		if (e == -ENOMEM)
			io_fail(err, SNAP_ENOMEM, "out of memory");
		else
			io_fail(err, SNAP_EUNSUPPORTED, "io_uring setup failed (queue depth %u): %s", o.queue_depth,
				strerror(-e));
		return NULL;
	}
	return w;
}

void snap_io_writer_free(struct snap_io_writer *w)
{
	if (!w)
		return;
	io_uw_free(w->uw);
	free(w->defer.v);
	free(w->pieces);
	free(w->crc);
	free(w->pad);
	free(w);
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

/* Where write_lz4 stopped, for fill_lz4's message. */
enum { LZ4_OK, LZ4_NOMEM, LZ4_HDF5, LZ4_RING };

/* Compresses region i chunk by chunk into b and hands each chunk to
 * H5Dwrite_chunk; with O_DIRECT (w->fdd) the driver records its offset
 * instead of writing and the chunk is queued on the ring here (*ring: the
 * ring's -errno when that fails). */
static int write_lz4(struct snap_io_writer *w, hid_t ds, const struct snap_io_region *g, size_t i,
		     const struct io_chunk_geom *cg, struct lz4buf *b, uint32_t *crc, uint64_t *stored, int *ring)
{
	size_t full = cg->full;
	if (full > b->cap) {
		free(b->raw);
		free(b->enc);
		b->raw = malloc(full);
		b->enc = malloc(io_lz4_bound(full));
		b->cap = b->raw && b->enc ? full : 0;
		if (!b->cap)
			return LZ4_NOMEM;
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
			if (w->fdd >= 0)
				io_defer_expect(&w->defer, b->enc, k, i, 0);
			if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, off, k, b->enc) < 0)
				return LZ4_HDF5;
			if (w->fdd >= 0 && io_defer_taken(&w->defer)) {
				/* Copied into the ring's buffers: b->enc is free on return. */
				struct io_piece pc = {b->enc, k, NULL, i};
				if ((*ring = io_uw_write_pieces(w->uw, &pc, 1, w->defer.v[--w->defer.n].off)) != 0)
					return LZ4_RING;
				w->lz4_bulk += k;
			}
			*stored += k;
		}
	}
	return LZ4_OK;
}

struct plan {
	haddr_t off;
	uint32_t expect;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The dataset of a plain region: LZ4 chunks (cg not NULL) or contiguous
 * storage allocated now, so that bulk_write can fill it after the close. */
static int create_ds(hid_t f, const char *final, const char *dsname, const struct snap_io_region *g,
		     const struct io_chunk_geom *cg, hid_t *out, struct snap_io_err *err)
{
	hsize_t dims[SNAP_MAX_NDIM];
	for (int d = 0; d < g->ndim; d++)
		dims[d] = g->shape[d];
	hid_t t = io_h5_type(g->dtype), s = H5Screate_simple(g->ndim, dims, NULL);
	hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE), ds = -1;
	int ok = t >= 0 && s >= 0 && dcpl >= 0 && H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0;
	if (ok && cg) {
		unsigned cd[1] = {(unsigned)cg->full};
		ok = H5Pset_chunk(dcpl, g->ndim, cg->chunk) >= 0 &&
		     H5Pset_filter(dcpl, SNAP_IO_LZ4_FILTER, H5Z_FLAG_OPTIONAL, 1, cd) >= 0;
	} else if (ok) {
		ok = H5Pset_layout(dcpl, H5D_CONTIGUOUS) >= 0 &&
		     H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_EARLY) >= 0;
	}
	if (ok)
		ds = H5Dcreate2(f, dsname, t, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
	/* Before the closes below, which would clear HDF5's error stack. */
	int rc = ds < 0 ? io_fail_h5(err, SNAP_EIO, "%s: cannot create dataset \"%s\"", final, dsname) : 0;
	if (dcpl >= 0) H5Pclose(dcpl);
	if (s >= 0) H5Sclose(s);
	if (t >= 0) H5Tclose(t);
	*out = ds;
	return rc;
}

/* Fills an LZ4 dataset and checks the source against its expected CRC. */
static int fill_lz4(struct snap_io_writer *w, hid_t ds, const char *final, const char *dsname,
		    const struct snap_io_region *g, size_t i, const struct io_chunk_geom *cg, struct lz4buf *lb,
		    uint32_t expect, uint64_t *stored, struct snap_io_err *err)
{
	uint32_t c = 0xFFFFFFFFu;
	int ring = 0;
	errno = 0;
	int e = write_lz4(w, ds, g, i, cg, lb, &c, stored, &ring);
	if (e == LZ4_NOMEM)
		return io_fail(err, SNAP_ENOMEM, "%s: out of memory for LZ4 chunk of dataset \"%s\"", final, dsname);
	if (e == LZ4_RING)
		return io_fail(err, io_errno_code(-ring) == SNAP_ENOENT ? SNAP_EIO : io_errno_code(-ring),
			       "%s: writing LZ4 chunk of dataset \"%s\" failed: %s", final, dsname, strerror(-ring));
	if (e)
		return io_fail_h5(err, errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO,
				  "%s: writing LZ4 chunk of dataset \"%s\" failed", final, dsname);
	if ((c ^ 0xFFFFFFFFu) != expect)
		return io_fail(err, SNAP_ECORRUPT, "%s: region \"%s\" (dataset \"%s\") does not match its "
			       "CRC32C %08x: source memory changed or is corrupt", final, g->name, dsname, expect);
	return 0;
}

/* One region's dataset and attributes; LZ4 data written now, frame chunks
 * allocated (their writes recorded in w->defer) and contiguous data's file
 * offset recorded in p, both for bulk_write. */
static int build_region(struct snap_io_writer *w, hid_t f, const char *final, const struct snap_io_region *g,
			size_t i, uint64_t step, struct plan *p, struct lz4buf *lb, uint64_t *stored,
			struct snap_io_err *err)
{
	char dsname[3 * SNAP_IO_MAX_NAME + 1];
	int lz4 = w->o.codec == SNAP_IO_CODEC_LZ4 && g->bytes > 0;
	io_sanitise(g->name, dsname, sizeof dsname);
	p->off = HADDR_UNDEF;
	if (g->nframes)
		return io_frames_write(f, final, dsname, g, i, step, &w->defer, stored, err);
	p->expect = g->has_crc ? g->crc32c : snap_io_crc32c(g->data, g->bytes);
	struct io_chunk_geom cg;
	if (lz4)
		io_chunk_plan(g->shape, g->ndim, snap_dtype_size(g->dtype), w->o.chunk_bytes, &cg);
	hid_t ds;
	int rc = create_ds(f, final, dsname, g, lz4 ? &cg : NULL, &ds, err);
	if (rc)
		return rc;
	if (io_attrs_region(ds, g, lz4 ? "lz4" : "none", step) < 0 || io_attr_u32(ds, "crc32c", p->expect) < 0) {
		rc = io_fail_h5(err, SNAP_EIO, "%s: writing attributes of dataset \"%s\" failed", final, dsname);
	} else if (lz4) {
		rc = fill_lz4(w, ds, final, dsname, g, i, &cg, lb, p->expect, stored, err);
	} else if (g->bytes) {
		p->off = H5Dget_offset(ds);
		if (p->off == HADDR_UNDEF)
			rc = io_fail_h5(err, SNAP_EIO, "%s: no storage for dataset \"%s\"", final, dsname);
		*stored += g->bytes;
	}
	H5Dclose(ds);
	return rc;
}

/* Opens the bulk pass's descriptors on tmp (O_DIRECT where the filesystem
 * takes it) and starts the ring on them. */
static int bulk_open(struct snap_io_writer *w, const char *tmp, const char *final, struct snap_io_err *err)
{
	w->lz4_bulk = 0;
	w->fd = open(tmp, O_RDWR | O_CLOEXEC); /* read: write_frames' padding */
	if (w->fd < 0) {
		int e = errno;
		return io_fail(err, io_errno_code(e), "%s: cannot reopen %s: %s", final, tmp, strerror(e));
	}
	if (!(w->o.flags & SNAP_IO_NO_DIRECT))
		w->fdd = open(tmp, O_WRONLY | O_DIRECT | O_CLOEXEC);
	int e = io_uw_begin(w->uw, w->fdd, w->fd);
	if (e) {
		if (w->fdd >= 0)
			close(w->fdd);
		close(w->fd);
		w->fd = w->fdd = -1;
		return io_fail(err, SNAP_EIO, "%s: rebuilding the io_uring ring after an earlier failure failed: %s",
			       final, strerror(-e));
	}
	return 0;
}

/* Drains the ring and closes the bulk descriptors; rc is the write's result
 * so far, returned unless closing fails first. Writes still in flight after
 * a failed drain keep their descriptors open, leaked, so the numbers are not
 * reused under them. */
static int bulk_close(struct snap_io_writer *w, const char *final, int rc, struct snap_io_err *err)
{
	if (w->fd < 0)
		return rc;
	io_uw_drain(w->uw);
	int fd = w->fd, fdd = w->fdd;
	w->fd = w->fdd = -1;
	if (io_uw_inflight(w->uw) > 0)
		return rc ? rc : io_fail(err, SNAP_EIO, "%s: io_uring writes still in flight", final);
	if (fdd >= 0)
		close(fdd);
	if (close(fd) < 0 && !rc) {
		int e = errno;
		rc = io_fail(err, io_errno_code(e), "%s: close failed: %s", final, strerror(e));
	}
	return rc;
}

/* HDF5 phase: the whole file but the bulk bytes (uncompressed data, frames);
 * LZ4 chunks are queued on the ring as they are made. */
static int build_file(struct snap_io_writer *w, const char *tmp, const char *final, const struct io_rank_id *id,
		      const struct snap_io_region *r, size_t n, struct plan *plan, uint64_t *stored,
		      struct snap_io_err *err)
{
	hid_t f;
	w->defer.n = 0;
	w->defer.want = NULL;
	int rc = io_rank_create(tmp, final, w->o.mode, id, &w->defer, &f, err);
	if (rc)
		return rc;
	rc = bulk_open(w, tmp, final, err);
	struct lz4buf lb = {0};
	for (size_t i = 0; i < n && !rc; i++)
		rc = build_region(w, f, final, &r[i], i, id->step, &plan[i], &lb, stored, err);
	free(lb.raw);
	free(lb.enc);
	int e = io_defer_close(f, &w->defer);
	if (e < 0 && !rc)
		rc = io_fail_h5(err, SNAP_EIO, "%s: closing HDF5 file failed", final);
	else if (e > 0 && !rc)
		rc = io_fail(err, io_errno_code(e) == SNAP_ENOENT ? SNAP_EIO : io_errno_code(e),
			     "%s: writing the HDF5 file's metadata at its close failed: %s", final, strerror(e));
	return rc;
}

static int by_offset(const void *a, const void *b)
{
	uint64_t x = ((const struct io_deferred *)a)->off, y = ((const struct io_deferred *)b)->off;
	return (x > y) - (x < y);
}

/*
 * The frames deferdrv.c recorded, in file order. Chunks start 4096-aligned,
 * so consecutive frames are apart by their padding (< 4096 bytes): a run of
 * such frames goes as one range, the padding read back from the file (HDF5
 * may have put metadata there) and written again as it is, so a run of
 * small frames makes io_bytes-sized O_DIRECT writes, not one small write
 * and one page-cache tail per frame. Without O_DIRECT nothing is gained by
 * merging: each frame goes alone and no padding is read. *e: the io_uring writer's -errno; *bad:
 * the first frame failing its CRC32C (SIZE_MAX: none) and *bad_got what it
 * gave. Returns 0, or a negative code with err set when it failed itself
 * (memory, reading the padding).
 */
static int write_frames(struct snap_io_writer *w, int fd, const char *final, const struct snap_io_region *r,
			size_t *bad, uint32_t *bad_got, uint64_t *bytes, int *e, struct snap_io_err *err)
{
	struct io_defer *d = &w->defer;
	*bad = SIZE_MAX;
	*e = 0;
	if (d->n > w->room) {
		struct io_piece *pc = realloc(w->pieces, 2 * d->n * sizeof *pc);
		if (pc)
			w->pieces = pc;
		uint32_t *crc = realloc(w->crc, d->n * sizeof *crc);
		if (crc)
			w->crc = crc;
		char *pad = realloc(w->pad, d->n * (size_t)SNAP_IO_ALIGN);
		if (pad)
			w->pad = pad;
		if (!pc || !crc || !pad)
			return io_fail(err, SNAP_ENOMEM, "%s: out of memory for %zu frames", final, d->n);
		w->room = d->n;
	}
	qsort(d->v, d->n, sizeof *d->v, by_offset);
	int merge = io_uw_direct(w->uw);
	for (size_t j = 0, k; j < d->n && !*e && *bad == SIZE_MAX; j = k) {
		size_t np = 0;
		uint64_t at = d->v[j].off;
		for (k = j; k < d->n; k++) {
			const struct io_deferred *x = &d->v[k];
			if (k > j && (!merge || x->off < at || x->off - at >= SNAP_IO_ALIGN))
				break;
			if (x->off > at) {
				size_t gap = (size_t)(x->off - at);
				char *p = w->pad + k * (size_t)SNAP_IO_ALIGN;
				ssize_t got = pread(fd, p, gap, (off_t)at);
				if (got != (ssize_t)gap) {
					int en = got < 0 ? errno : EIO;
					return io_fail(err, io_errno_code(en), "%s: reading %zu bytes at %" PRIu64 " between "
						       "two frames failed: %s", final, gap, at, strerror(en));
				}
				w->pieces[np++] = (struct io_piece){p, gap, NULL, x->region};
			}
			w->crc[k] = 0xFFFFFFFFu;
			w->pieces[np++] = (struct io_piece){x->src, x->len, &w->crc[k], x->region};
			at = x->off + x->len;
		}
		*e = io_uw_write_pieces(w->uw, w->pieces, np, d->v[j].off);
		for (size_t i = j; i < k && !*e; i++) {
			const struct io_deferred *x = &d->v[i];
			if ((w->crc[i] ^ 0xFFFFFFFFu) != r[x->region].frame_crc[x->frame] && *bad == SIZE_MAX) {
				*bad = i;
				*bad_got = w->crc[i] ^ 0xFFFFFFFFu;
			}
			*bytes += x->len;
		}
	}
	return 0;
}

/* The bulk bytes into the closed file: uncompressed regions at plan[i].off,
 * then the frames deferdrv.c recorded, each checked against its CRC32C as
 * it is queued; then everything in flight (the LZ4 chunks too) is drained
 * and the file fsynced. *bytes: how many went through the ring. */
static int bulk_write(struct snap_io_writer *w, const char *final, const struct snap_io_region *r, size_t n,
		      const struct plan *plan, uint64_t *bytes, struct snap_io_err *err)
{
	int rc = 0, e = 0, fd = w->fd;
	char dsname[3 * SNAP_IO_MAX_NAME + 1];
	/* Writes of all regions stay in flight together; the CRC is complete
	 * once a region is queued, so it is checked per region here, and the
	 * writes are drained once at the end. Each write carries its region's
	 * index so a failure still names the dataset. */
	size_t bad_crc = SIZE_MAX;
	uint32_t bad_frame = 0, bad_got = 0;
	*bytes = w->lz4_bulk;
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
		*bytes += r[i].bytes;
	}
	int own = 0; /* write_frames' own failure, in err */
	if (!e && bad_crc == SIZE_MAX && w->defer.n) {
		size_t bad = SIZE_MAX;
		own = write_frames(w, fd, final, r, &bad, &bad_got, bytes, &e, err);
		if (bad != SIZE_MAX) {
			bad_crc = w->defer.v[bad].region;
			bad_frame = w->defer.v[bad].frame;
		}
	}
	int d = io_uw_drain(w->uw);
	if (!e)
		e = d;
	/* The lower region index is the first failure in file order. */
	size_t bad_io = e ? io_uw_error_tag(w->uw) : SIZE_MAX;
	if (own) {
		rc = own;
	} else if (e && bad_io <= bad_crc) {
		io_sanitise(r[bad_io].name, dsname, sizeof dsname);
		rc = io_fail(err, io_errno_code(-e) == SNAP_ENOENT ? SNAP_EIO : io_errno_code(-e),
			     "%s: writing data of dataset \"%s\" failed: %s", final, dsname, strerror(-e));
	} else if (bad_crc < n && r[bad_crc].nframes) {
		io_sanitise(r[bad_crc].name, dsname, sizeof dsname);
		rc = io_frame_crc_fail(final, &r[bad_crc], dsname, bad_frame, bad_got, err);
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
	if (io_is_pattern(dir))
		return io_fail(err, SNAP_EINVAL, "%s: a rank file is written into one node's directory, not the "
			       "per-node pattern", dir);
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
	io_rank_tmp_name(tmp, sizeof tmp, sdir, rank);
	struct plan *plan = calloc(n ? n : 1, sizeof *plan);
	if (!plan)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	uint64_t stored = 0;
	io_h5_enter();
	struct io_rank_id id = {job, step, rank, world};
	rc = build_file(w, tmp, final, &id, regions, n, plan, &stored, err);
	io_h5_leave();
	int direct = w->fdd >= 0;
	uint64_t bulk = 0;
	if (!rc)
		rc = bulk_write(w, final, regions, n, plan, &bulk, err);
	rc = bulk_close(w, final, rc, err);
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
		stats->bulk_bytes = bulk;
	}
	return 0;
}
