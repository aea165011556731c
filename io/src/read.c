/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Reading rank files back: metadata of every dataset, and the raw bytes of
 * one dataset streamed in order through a CRC32C check. Contiguous data is
 * read with pread at the dataset's offset (so a truncated file is named as
 * such); LZ4 chunks are fetched with H5Dread_chunk and decoded here, so
 * restore does not depend on the filter plugin being installed. Codec
 * frames likewise (frames.c). Which file, and whether it is the right
 * one, is rankfile.c's; whether its step is sealed, loadstep.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

struct walk {
	const char *path;
	struct io_ds *ds;
	size_t n, cap;
	int rc;
	struct snap_io_err *err;
};

/* The attributes every region's dataset has (io_attrs_region's) into d;
 * codec gets the codec name. -1 if one is missing or unreadable. */
static int region_attrs(hid_t ds, struct io_ds *d, char *codec, size_t ccap, size_t *ng, size_t *no)
{
	struct snap_io_region_info *in = &d->info;
	char kind[32], dtype[32];
	if (io_get_attr_str(ds, "name", d->name, sizeof d->name) < 0 ||
	    io_get_attr_str(ds, "kind", kind, sizeof kind) < 0 || io_get_attr_str(ds, "dtype", dtype, sizeof dtype) < 0 ||
	    io_get_attr_str(ds, "codec", codec, ccap) < 0 ||
	    io_get_attr_u64(ds, "global_shape", in->global_shape, SNAP_MAX_NDIM, ng) < 0 ||
	    io_get_attr_u64(ds, "shard_offset", in->shard_offset, SNAP_MAX_NDIM, no) < 0)
		return -1;
	in->dtype = snap_dtype_parse(dtype);
	in->kind = snap_kind_parse(kind);
	in->frame_codec = io_frame_codec_parse(codec);
	in->codec = strcmp(codec, "lz4") == 0 ? SNAP_IO_CODEC_LZ4 : strcmp(codec, "none") == 0 ? SNAP_IO_CODEC_NONE : -1;
	return 0;
}

/* A raw or LZ4 dataset: its shape is its dataspace, its CRC an attribute. */
static int plain_meta(hid_t ds, const char *path, const hsize_t *dims, int nd, size_t es, struct io_ds *d,
		      struct snap_io_err *err)
{
	struct snap_io_region_info *in = &d->info;
	in->frame_codec = 0;
	uint32_t c32 = 0;
	if (io_get_attr_u32s(ds, "crc32c", &c32, 1) < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": crc32c attribute missing", path, d->dataset);
	in->crc32c = d->sumcrc = c32;
	in->ndim = nd;
	in->bytes = es;
	for (int k = 0; k < nd; k++) {
		in->shape[k] = dims[k];
		in->bytes *= dims[k];
	}
	return 0;
}

/* The shard lies inside the global shape, both of the dataset's rank. */
static int check_shard(const char *path, const struct io_ds *d, size_t ng, size_t no, struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	if (ng != (size_t)in->ndim || no != (size_t)in->ndim)
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": global_shape/shard_offset attributes do not "
			       "have its %d dims", path, d->dataset, in->ndim);
	for (int k = 0; k < in->ndim; k++)
		if (in->shard_offset[k] > in->global_shape[k] ||
		    in->shape[k] > in->global_shape[k] - in->shard_offset[k])
			return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": shard outside global shape", path,
				       d->dataset);
	return 0;
}

/* Chunked exactly when LZ4 with data; contiguous data's file offset. */
static int layout_meta(hid_t ds, hid_t dcpl, const char *path, struct io_ds *d, struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	H5D_layout_t lay = H5Pget_layout(dcpl);
	if ((lay == H5D_CHUNKED) != (in->codec == SNAP_IO_CODEC_LZ4 && in->bytes > 0))
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": layout does not match codec", path, d->dataset);
	if (lay == H5D_CONTIGUOUS && in->bytes > 0) {
		haddr_t off = H5Dget_offset(ds);
		if (off == HADDR_UNDEF)
			return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": no storage allocated", path,
					  d->dataset);
		d->off = off;
	}
	return 0;
}

static int ds_meta(hid_t file, const char *path, const char *link, struct io_ds *d, struct snap_io_err *err)
{
	memset(d, 0, sizeof *d);
	snprintf(d->dataset, sizeof d->dataset, "%s", link);
	hid_t ds = H5Dopen2(file, link, H5P_DEFAULT);
	if (ds < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: cannot open dataset \"%s\"", path, link);
	struct snap_io_region_info *in = &d->info;
	char codec[32];
	size_t ng = 0, no = 0;
	int rc = 0;
	hid_t s = H5Dget_space(ds), t = H5Dget_type(ds), dcpl = H5Dget_create_plist(ds);
	int nd = s >= 0 ? H5Sget_simple_extent_ndims(s) : -1;
	hsize_t dims[SNAP_MAX_NDIM];
	if (nd < 1 || nd > SNAP_MAX_NDIM || t < 0 || dcpl < 0 || H5Sget_simple_extent_dims(s, dims, NULL) < 0 ||
	    region_attrs(ds, d, codec, sizeof codec, &ng, &no) < 0) {
		rc = io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": metadata missing or unreadable", path, link);
		goto out;
	}
	size_t es = in->dtype >= 0 ? snap_dtype_size(in->dtype) : 0;
	if (!es || in->kind < 0 || (in->codec < 0 && in->frame_codec < 0) || H5Tget_size(t) != es) {
		rc = io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": inconsistent dtype/kind/codec attributes",
			     path, link);
		goto out;
	}
	if (in->frame_codec > 0)
		rc = io_frames_meta(ds, path, dims, nd, dcpl, d, err);
	else
		rc = plain_meta(ds, path, dims, nd, es, d, err);
	if (rc < 0 || (rc = check_shard(path, d, ng, no, err)) < 0)
		goto out;
	in->stored_bytes = H5Dget_storage_size(ds);
	d->off = UINT64_MAX;
	/* A frame dataset's layout was checked by io_frames_meta. */
	if (in->codec != SNAP_IO_CODEC_FRAMES)
		rc = layout_meta(ds, dcpl, path, d, err);
out:
	if (dcpl >= 0) H5Pclose(dcpl);
	if (t >= 0) H5Tclose(t);
	if (s >= 0) H5Sclose(s);
	H5Dclose(ds);
	return rc;
}

static herr_t walk_cb(hid_t g, const char *name, const H5L_info_t *li, void *arg)
{
	struct walk *w = arg;
	(void)li;
	if (w->n == w->cap) {
		size_t nc = w->cap ? 2 * w->cap : 16;
		struct io_ds *p = realloc(w->ds, nc * sizeof *p);
		if (!p) {
			w->rc = io_fail(w->err, SNAP_ENOMEM, "out of memory");
			return -1;
		}
		w->ds = p;
		w->cap = nc;
	}
	w->rc = ds_meta(g, w->path, name, &w->ds[w->n], w->err);
	if (w->rc)
		return -1;
	w->n++;
	return 0;
}

int io_rank_open(const char *path, const struct io_rank_id *expect, hid_t *file, struct io_ds **ds, size_t *n,
		 struct snap_io_err *err)
{
	hid_t f;
	int rc = io_rank_open_file(path, expect, &f, err);
	if (rc)
		return rc;
	struct walk w = {.path = path, .err = err};
	hsize_t idx = 0;
	if (H5Literate(f, H5_INDEX_NAME, H5_ITER_INC, &idx, walk_cb, &w) < 0)
		rc = w.rc ? w.rc : io_fail_h5(err, SNAP_ECORRUPT, "%s: cannot list datasets", path);
	if (rc) {
		free(w.ds);
		H5Fclose(f);
		return rc;
	}
	*file = f;
	*ds = w.ds;
	*n = w.n;
	for (size_t i = 0; i < w.n; i++) {
		w.ds[i].info.name = w.ds[i].name;
		w.ds[i].info.dataset = w.ds[i].dataset;
	}
	return 0;
}

static int read_contig(const char *path, const struct io_ds *d, void *buf, uint32_t *crc, struct snap_io_err *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return io_fail(err, io_errno_code(errno), "%s: cannot open: %s", path, strerror(errno));
	struct stat st;
	int rc = 0;
	if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < d->off + d->info.bytes) {
		rc = io_fail(err, SNAP_ETRUNC, "%s: truncated: dataset \"%s\" needs bytes up to %" PRIu64
			     " but the file has %" PRIu64, path, d->dataset, d->off + d->info.bytes, (uint64_t)st.st_size);
		close(fd);
		return rc;
	}
	size_t blk = 4u << 20;
	char *tmp = buf ? NULL : malloc(blk);
	if (!buf && !tmp) {
		close(fd);
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	}
	for (uint64_t pos = 0; pos < d->info.bytes && !rc;) {
		size_t k = d->info.bytes - pos < blk ? (size_t)(d->info.bytes - pos) : blk;
		char *dst = buf ? (char *)buf + pos : tmp;
		ssize_t got = pread(fd, dst, k, (off_t)(d->off + pos));
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			rc = io_fail(err, got < 0 ? SNAP_EIO : SNAP_ETRUNC, "%s: reading dataset \"%s\" failed: %s", path,
				     d->dataset, got < 0 ? strerror(errno) : "unexpected end of file");
		else {
			*crc = io_crc_update(*crc, dst, (size_t)got);
			pos += (uint64_t)got;
		}
	}
	free(tmp);
	close(fd);
	return rc;
}

static int read_lz4(hid_t file, const char *path, const struct io_ds *d, void *buf, uint32_t *crc,
		    struct snap_io_err *err)
{
	const struct snap_io_region_info *in = &d->info;
	hid_t ds = H5Dopen2(file, d->dataset, H5P_DEFAULT);
	if (ds < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: cannot open dataset \"%s\"", path, d->dataset);
	hid_t dcpl = H5Dget_create_plist(ds);
	hsize_t chunk[SNAP_MAX_NDIM];
	int nc = dcpl >= 0 ? H5Pget_chunk(dcpl, in->ndim, chunk) : -1;
	if (dcpl >= 0)
		H5Pclose(dcpl);
	if (nc != in->ndim) {
		H5Dclose(ds);
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": no chunk layout", path, d->dataset);
	}
	struct io_chunk_geom cg;
	if (io_chunk_from(in->shape, in->ndim, snap_dtype_size(in->dtype), chunk, &cg) < 0) {
		H5Dclose(ds);
		return io_fail(err, SNAP_EFORMAT, "%s: dataset \"%s\": chunk shape not written by snapio", path,
			       d->dataset);
	}
	int rc = 0;
	size_t full = cg.full, enc_cap = 0;
	unsigned char *raw = malloc(full), *enc = NULL;
	if (!raw)
		rc = io_fail(err, SNAP_ENOMEM, "out of memory for a %zu-byte chunk", full);
	for (uint64_t o = 0; o < cg.outer && !rc; o++) {
		for (uint64_t r = 0; r < cg.runs && !rc; r++) {
			hsize_t off[SNAP_MAX_NDIM];
			uint64_t at;
			size_t len;
			io_chunk_at(&cg, o, r, off, &at, &len);
			hsize_t sz = 0;
			uint32_t filters = 0;
			if (H5Dget_chunk_storage_size(ds, off, &sz) < 0 || sz == 0) {
				rc = io_fail_h5(err, SNAP_ECORRUPT, "%s: dataset \"%s\": chunk %" PRIu64 ":%" PRIu64
						" missing", path, d->dataset, o, r);
				break;
			}
			if (sz > enc_cap) {
				free(enc);
				enc = malloc(sz);
				enc_cap = enc ? sz : 0;
				if (!enc) {
					rc = io_fail(err, SNAP_ENOMEM, "out of memory");
					break;
				}
			}
			size_t got = 0;
			if (H5Dread_chunk(ds, H5P_DEFAULT, off, &filters, enc) < 0) {
				rc = io_fail_h5(err, SNAP_ETRUNC, "%s: dataset \"%s\": reading chunk %" PRIu64 ":%" PRIu64
						" failed (truncated file?)", path, d->dataset, o, r);
			} else if (filters != 0) {
				rc = io_fail(err, SNAP_EFORMAT, "%s: dataset \"%s\": chunk stored without the LZ4 filter",
					     path, d->dataset);
			} else if (io_lz4_decode(enc, sz, raw, full, &got) < 0 || got != full) {
				rc = io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\": LZ4 chunk %" PRIu64 ":%" PRIu64
					     " is corrupt", path, d->dataset, o, r);
			} else {
				*crc = io_crc_update(*crc, raw, len);
				if (buf)
					memcpy((char *)buf + at, raw, len);
			}
		}
	}
	free(raw);
	free(enc);
	H5Dclose(ds);
	return rc;
}

int io_ds_read(hid_t file, const char *path, const struct io_ds *d, void *buf, struct snap_io_err *err)
{
	uint32_t crc = 0xFFFFFFFFu;
	int rc = 0;
	if (d->info.codec == SNAP_IO_CODEC_FRAMES)
		return io_frames_read(file, path, d, NULL, buf, err);
	if (d->info.bytes == 0)
		rc = 0;
	else if (d->off != UINT64_MAX)
		rc = read_contig(path, d, buf, &crc, err);
	else
		rc = read_lz4(file, path, d, buf, &crc, err);
	if (rc)
		return rc;
	crc ^= 0xFFFFFFFFu;
	if (crc != d->info.crc32c)
		return io_fail(err, SNAP_ECORRUPT, "%s: dataset \"%s\" (region \"%s\"): CRC32C mismatch: recorded "
			       "%08x, data gives %08x", path, d->dataset, d->name, d->info.crc32c, crc);
	return 0;
}
