/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Frame regions: a region held as snap/codec.h streams ("frames") goes to
 * disk as they are, one HDF5 chunk per frame of a flat 1-D dataset under
 * filter SNAP_IO_FILTER_CODEC (codecfilter.c). H5Dwrite_chunk allocates and
 * indexes each chunk; the bytes themselves go through io_uring in write.c's
 * bulk pass (deferdrv.c records the write instead of making it).
 * Never decoded and re-encoded on the write path: a lossy frame is quantized
 * once. Reading fetches the chunks with H5Dread_chunk, checks each against
 * the per-frame CRC32C recorded at write time and hands them out raw or
 * decodes them here, so snapio never needs the plugin.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "snap/codec.h"

#include "codecfilter.h"
#include "io_int.h"

/* frame_crc32c above this many bytes goes to dense attribute storage: an
 * HDF5 object header message is limited to 64 KiB. */
#define COMPACT_ATTR_MAX (32u << 10)
#define CHUNK_MAX UINT32_MAX /* HDF5 chunk (and stored chunk) size limit */

static const char *const codec_names[SNAP_CODEC_COUNT_] = {
	[SNAP_CODEC_LOSSLESS] = "lossless", [SNAP_CODEC_LOSSY_ABS] = "lossy-abs", [SNAP_CODEC_LOSSY_REL] = "lossy-rel"};

const char *io_frame_codec_name(int codec)
{
	return codec > 0 && codec < SNAP_CODEC_COUNT_ ? codec_names[codec] : NULL;
}

int io_frame_codec_parse(const char *name)
{
	for (int c = 1; c < SNAP_CODEC_COUNT_; c++)
		if (codec_names[c] && strcmp(name, codec_names[c]) == 0)
			return c;
	return -1;
}

static int float_dtype(int dtype)
{
	return dtype == SNAP_DTYPE_F32 || dtype == SNAP_DTYPE_BF16 || dtype == SNAP_DTYPE_F16;
}

/* Values of frame k of a region of count values cut every chunk values. */
static uint64_t frame_values(uint64_t count, uint64_t chunk, uint32_t k)
{
	uint64_t at = (uint64_t)k * chunk;
	return count - at < chunk ? count - at : chunk;
}

int io_frames_check(const struct snap_io_region *g, struct snap_io_err *err)
{
	if (!float_dtype(g->dtype))
		return io_fail(err, SNAP_EINVAL, "region \"%s\": codec frames need dtype f32, bf16 or f16, not %s",
			       g->name, snap_dtype_name(g->dtype));
	size_t es = snap_dtype_size(g->dtype);
	uint64_t count = g->bytes / es;
	if (count == 0 || g->frame_elems == 0)
		return io_fail(err, SNAP_EINVAL, "region \"%s\": %u frames of %" PRIu64 " values for %" PRIu64
			       " values", g->name, g->nframes, g->frame_elems, count);
	uint64_t chunk = g->frame_elems < count ? g->frame_elems : count;
	if (chunk > CHUNK_MAX / es)
		return io_fail(err, SNAP_EINVAL, "region \"%s\": frames of %" PRIu64 " values exceed the 4 GiB "
			       "HDF5 chunk limit", g->name, g->frame_elems);
	uint64_t want = count / g->frame_elems + (count % g->frame_elems != 0);
	if (g->nframes != want)
		return io_fail(err, SNAP_EINVAL, "region \"%s\": %u frames given, but %" PRIu64 " values in frames "
			       "of %" PRIu64 " make %" PRIu64, g->name, g->nframes, count, g->frame_elems, want);
	if (!g->frame || !g->frame_len || !g->frame_crc)
		return io_fail(err, SNAP_EINVAL, "region \"%s\": frame, frame_len or frame_crc is NULL", g->name);
	for (uint32_t k = 0; k < g->nframes; k++) {
		uint64_t len = g->frame_len[k], vals = frame_values(count, chunk, k);
		if (!g->frame[k] || len == 0 || len > CHUNK_MAX)
			return io_fail(err, SNAP_EINVAL, "region \"%s\" frame %u: NULL or %" PRIu64 " bytes long (must "
				       "be 1 byte to 4 GiB)", g->name, k, len);
		struct snap_codec_info in;
		int e = snap_codec_inspect(g->frame[k], (size_t)len, &in);
		if (e)
			return io_fail(err, SNAP_ECORRUPT, "region \"%s\" frame %u: not a codec stream of %" PRIu64
				       " bytes (%s)", g->name, k, len, snap_strerror(e));
		if (in.dtype != g->dtype || in.count != vals)
			return io_fail(err, SNAP_EINVAL, "region \"%s\" frame %u: header says %" PRIu64 " %s values, "
				       "the frame holds %" PRIu64 " %s values", g->name, k, in.count,
				       snap_dtype_name(in.dtype), vals, snap_dtype_name(g->dtype));
		if (in.stream_len != len)
			return io_fail(err, SNAP_EINVAL, "region \"%s\" frame %u: header says %" PRIu64 " bytes, "
				       "frame_len is %" PRIu64, g->name, k, in.stream_len, len);
	}
	return 0;
}

int io_frame_crc_fail(const char *final, const struct snap_io_region *g, const char *dsname, uint32_t k,
		      uint32_t got, struct snap_io_err *err)
{
	return io_fail(err, SNAP_ECORRUPT, "%s: region \"%s\" (dataset \"%s\") frame %u does not match its CRC32C "
		       "%08x (it gives %08x): source memory changed or is corrupt", final, g->name, dsname, k,
		       g->frame_crc[k], got);
}

int io_frames_write(hid_t f, const char *final, const char *dsname, const struct snap_io_region *g, size_t i,
		    uint64_t step, struct io_defer *defer, uint64_t *stored, struct snap_io_err *err)
{
	size_t es = snap_dtype_size(g->dtype);
	uint64_t count = g->bytes / es, chunk = g->frame_elems < count ? g->frame_elems : count;
	struct snap_codec_info first;
	if (snap_codec_inspect(g->frame[0], (size_t)g->frame_len[0], &first) != 0) /* checked before: cannot fail */
		return io_fail(err, SNAP_ECORRUPT, "region \"%s\" frame 0: not a codec stream", g->name);
	/* HDF5 creates a dataset with a mandatory filter only if it knows the
	 * filter; registering again (H5close may have run) is harmless. */
	if (H5Zregister(&io_codec_filter_class) < 0)
		return io_fail_h5(err, SNAP_EIO, "%s: cannot register HDF5 filter %d", final, SNAP_IO_FILTER_CODEC);
	hsize_t dims[1] = {count}, cdims[1] = {chunk};
	unsigned cd[SNAP_IO_CODEC_CD_N] = {SNAP_IO_CODEC_CD_VERSION, (unsigned)g->dtype, (unsigned)chunk,
				      (unsigned)(chunk >> 32)};
	hid_t t = io_h5_type(g->dtype), s = H5Screate_simple(1, dims, NULL), dcpl = H5Pcreate(H5P_DATASET_CREATE);
	hid_t ds = -1;
	int rc = 0;
	if (t >= 0 && s >= 0 && dcpl >= 0 && H5Pset_chunk(dcpl, 1, cdims) >= 0 &&
	    H5Pset_filter(dcpl, SNAP_IO_FILTER_CODEC, H5Z_FLAG_MANDATORY, SNAP_IO_CODEC_CD_N, cd) >= 0 &&
	    H5Pset_alloc_time(dcpl, H5D_ALLOC_TIME_INCR) >= 0 && H5Pset_fill_time(dcpl, H5D_FILL_TIME_NEVER) >= 0 &&
	    ((uint64_t)g->nframes * 4 <= COMPACT_ATTR_MAX || H5Pset_attr_phase_change(dcpl, 0, 0) >= 0))
		ds = H5Dcreate2(f, dsname, t, s, H5P_DEFAULT, dcpl, H5P_DEFAULT);
	if (ds < 0) {
		rc = io_fail_h5(err, SNAP_EIO, "%s: cannot create dataset \"%s\"", final, dsname);
	} else if (io_attrs_region(ds, g, io_frame_codec_name(first.codec), step) < 0 ||
		   io_attr_u64(ds, "shape", g->shape, (size_t)g->ndim) < 0 ||
		   io_attr_u64(ds, "frame_elems", &g->frame_elems, 1) < 0 ||
		   io_attr_u32s(ds, "frame_crc32c", g->frame_crc, g->nframes) < 0) {
		rc = io_fail_h5(err, SNAP_EIO, "%s: writing attributes of dataset \"%s\" failed", final, dsname);
	}
	for (uint32_t k = 0; k < g->nframes && !rc; k++) {
		size_t len = (size_t)g->frame_len[k];
		hsize_t off[1] = {(hsize_t)k * chunk};
		io_defer_expect(defer, g->frame[k], len, i, k);
		errno = 0;
		if (H5Dwrite_chunk(ds, H5P_DEFAULT, 0, off, len, g->frame[k]) < 0) {
			int e = errno; /* ENOMEM: the driver could not record the write */
			rc = io_fail_h5(err, e == ENOSPC ? SNAP_ENOSPC : e == ENOMEM ? SNAP_ENOMEM : SNAP_EIO,
					"%s: writing frame %u of dataset \"%s\" failed%s", final, k, dsname,
					e == ENOMEM ? " (out of memory)" : "");
		} else if (!io_defer_taken(defer)) {
			uint32_t c = snap_io_crc32c(g->frame[k], len);
			if (c != g->frame_crc[k])
				rc = io_frame_crc_fail(final, g, dsname, k, c, err);
		}
		*stored += len;
	}
	io_defer_taken(defer);
	if (ds >= 0) H5Dclose(ds);
	if (dcpl >= 0) H5Pclose(dcpl);
	if (s >= 0) H5Sclose(s);
	if (t >= 0) H5Tclose(t);
	return rc;
}

/* The frame_crc32c attribute of an open frame dataset: n values, malloc'd. */
static int load_crcs(hid_t ds, const char *path, const char *link, uint64_t n, uint32_t **out,
		     struct snap_io_err *err)
{
	*out = NULL;
	if (io_attr_npoints(ds, "frame_crc32c") != (int64_t)n)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": frame_crc32c attribute missing or not "
				  "%" PRIu64 " values", path, link, n);
	uint32_t *crc = malloc((size_t)n * sizeof *crc);
	if (!crc)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	if (io_get_attr_u32s(ds, "frame_crc32c", crc, (size_t)n) < 0) {
		free(crc);
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": frame_crc32c unreadable", path, link);
	}
	*out = crc;
	return 0;
}

int io_frames_meta(hid_t ds, const char *path, const hsize_t *dims, int nd, hid_t dcpl, struct io_ds *d,
		   struct snap_io_err *err)
{
	struct snap_io_region_info *in = &d->info;
	const char *link = d->dataset;
	size_t ns = 0;
	uint64_t fe = 0, count = 1;
	if (!float_dtype(in->dtype) || io_get_attr_u64(ds, "shape", in->shape, SNAP_MAX_NDIM, &ns) < 0 ||
	    io_get_attr_u64(ds, "frame_elems", &fe, 1, NULL) < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": codec frames of a non-float dtype, or "
				  "shape/frame_elems attributes missing", path, link);
	in->ndim = (int)ns;
	for (size_t k = 0; k < ns; k++) {
		if (in->shape[k] && count > UINT64_MAX / in->shape[k])
			return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": shape overflows", path, link);
		count *= in->shape[k];
	}
	size_t es = snap_dtype_size(in->dtype);
	uint64_t nframes = fe ? count / fe + (count % fe != 0) : 0;
	if (nd != 1 || dims[0] != count || count == 0 || fe == 0 || nframes > UINT32_MAX || count > UINT64_MAX / es)
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": %" PRIu64 " values, shape and frame_elems "
			       "%" PRIu64 " disagree", path, link, nd == 1 ? (uint64_t)dims[0] : 0, fe);
	uint64_t chunk = fe < count ? fe : count;
	hsize_t cdims[1] = {0};
	unsigned flags = 0, cd[SNAP_IO_CODEC_CD_N + 4] = {0};
	size_t ncd = SNAP_IO_CODEC_CD_N + 4;
	if (H5Pget_layout(dcpl) != H5D_CHUNKED || H5Pget_chunk(dcpl, 1, cdims) != 1 || cdims[0] != chunk ||
	    H5Pget_nfilters(dcpl) != 1 ||
	    H5Pget_filter2(dcpl, 0, &flags, &ncd, cd, 0, NULL, NULL) != SNAP_IO_FILTER_CODEC || ncd != SNAP_IO_CODEC_CD_N ||
	    cd[0] != SNAP_IO_CODEC_CD_VERSION || cd[1] != (unsigned)in->dtype ||
	    ((uint64_t)cd[2] | (uint64_t)cd[3] << 32) != chunk)
		return io_fail_h5(err, SNAP_EFORMAT, "%s: dataset \"%s\": not the chunk layout and filter %d snapio "
				  "writes for codec frames", path, link, SNAP_IO_FILTER_CODEC);
	uint32_t *crc;
	int rc = load_crcs(ds, path, link, nframes, &crc, err);
	if (rc)
		return rc;
	uint32_t c = 0xFFFFFFFFu;
	for (uint64_t k = 0; k < nframes; k++)
		c = io_crc_u32le(c, crc[k]);
	free(crc);
	d->sumcrc = c ^ 0xFFFFFFFFu;
	in->codec = SNAP_IO_CODEC_FRAMES;
	in->bytes = count * es;
	in->crc32c = 0;
	in->nframes = (uint32_t)nframes;
	in->frame_elems = fe;
	d->chunk_elems = chunk;
	return 0;
}

/* A reusable buffer for one frame at a time. */
struct framebuf {
	unsigned char *p;
	size_t cap;
};

/* Frame k's chunk, checked against its recorded CRC32C want: into raw's
 * slot k when raw is not NULL, else into fb. *out and *out_sz say where
 * and how long. */
static int fetch_frame(hid_t ds, const char *path, const struct io_ds *d, uint32_t k, uint32_t want,
		       const struct snap_io_dest *raw, struct framebuf *fb, unsigned char **out, hsize_t *out_sz,
		       struct snap_io_err *err)
{
	const char *link = d->dataset;
	hsize_t off[1] = {(hsize_t)k * d->chunk_elems}, sz = 0;
	uint32_t filters = 0;
	if (H5Dget_chunk_storage_size(ds, off, &sz) < 0 || sz == 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\" frame %u: chunk missing", path, link, k);
	unsigned char *dst;
	if (raw) {
		if (sz > raw->frame_cap)
			return io_fail(err, SNAP_EMISMATCH, "%s: dataset \"%s\" (region \"%s\") frame %u is %" PRIu64
				       " bytes, more than frame_cap %" PRIu64, path, link, d->name, k, (uint64_t)sz,
				       raw->frame_cap);
		dst = (unsigned char *)raw->buf + (size_t)(k * raw->frame_cap);
	} else {
		if (sz > fb->cap) {
			free(fb->p);
			fb->p = malloc((size_t)sz);
			fb->cap = fb->p ? (size_t)sz : 0;
			if (!fb->p)
				return io_fail(err, SNAP_ENOMEM, "out of memory for a %" PRIu64 "-byte frame", (uint64_t)sz);
		}
		dst = fb->p;
	}
	if (H5Dread_chunk(ds, H5P_DEFAULT, off, &filters, dst) < 0)
		return io_fail_h5(err, SNAP_ETRUNC, "%s: dataset \"%s\" frame %u: reading its chunk failed "
				  "(truncated file?)", path, link, k);
	if (filters != 0)
		return io_fail(err, SNAP_EFORMAT, "%s: dataset \"%s\" frame %u: chunk stored without the codec "
			       "filter", path, link, k);
	uint32_t c = snap_io_crc32c(dst, (size_t)sz);
	if (c != want)
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\" (region \"%s\") frame %u: CRC32C mismatch: "
			       "recorded %08x, data gives %08x", path, link, d->name, k, want, c);
	*out = dst;
	*out_sz = sz;
	return 0;
}

/* Frame k (src[0..sz)) decoded into its place in vals. */
static int decode_frame(const char *path, const struct io_ds *d, uint32_t k, const unsigned char *src, size_t sz,
			void *vals, struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	size_t es = snap_dtype_size(in->dtype);
	uint64_t want = frame_values(in->bytes / es, d->chunk_elems, k);
	struct snap_codec_info fi;
	size_t got = 0;
	int e = snap_codec_inspect(src, sz, &fi);
	if (!e && (fi.dtype != in->dtype || fi.count != want))
		e = SNAP_EMISMATCH;
	if (!e)
		e = snap_codec_decompress(src, sz, (unsigned char *)vals + (size_t)(k * d->chunk_elems) * es,
					  (size_t)want * es, &got);
	if (!e && got != want)
		e = SNAP_EMISMATCH;
	if (e)
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\" (region \"%s\") frame %u: does not decode "
			       "to its %" PRIu64 " %s values (%s)", path, d->dataset, d->name, k, want,
			       snap_dtype_name(in->dtype), snap_strerror(e));
	return 0;
}

int io_frames_read(hid_t file, const char *path, const struct io_ds *d, const struct snap_io_dest *raw,
		   void *vals, struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	const char *link = d->dataset;
	hid_t ds = H5Dopen2(file, link, H5P_DEFAULT);
	if (ds < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: cannot open dataset \"%s\"", path, link);
	uint32_t *crc;
	struct framebuf fb = {0};
	int rc = load_crcs(ds, path, link, in->nframes, &crc, err);
	for (uint32_t k = 0; k < in->nframes && !rc; k++) {
		unsigned char *dst = NULL;
		hsize_t sz = 0;
		if ((rc = fetch_frame(ds, path, d, k, crc[k], raw, &fb, &dst, &sz, err)) != 0)
			break;
		if (raw) {
			if (raw->frame_len)
				raw->frame_len[k] = sz;
			if (raw->frame_crc)
				raw->frame_crc[k] = crc[k];
		} else if (vals) {
			rc = decode_frame(path, d, k, dst, (size_t)sz, vals, err);
		}
	}
	free(fb.p);
	free(crc);
	H5Dclose(ds);
	return rc;
}
