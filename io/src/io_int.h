/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * io_int.h - what the io/src files share and nothing outside io/ may use.
 *
 * Calls go one way: a file calls only files in the rows below its own.
 *
 *   loadstep.c verify.c retain.c export.c  operations on persisted steps
 *   steps.c                               a step: its MANIFEST or its nodes' parts; listing
 *   stepmanifest.c                        one directory's MANIFEST: seal, read
 *   write.c read.c                        a rank file's datasets, out and back
 *   frames.c                              codec-frame datasets
 *   rankfile.c                            a rank file: names, creation, identity
 *   attr.c names.c uring.c lz4chunk.c     HDF5 attributes, paths, io_uring, LZ4
 *   deferdrv.c                            the HDF5 file driver: frames and LZ4 chunks to io_uring
 *   err.c codecfilter.c                   errors, HDF5 lock, CRC32C; filter 311
 *
 * The sections below follow the same order, bottom row first.
 */
#ifndef SNAP_IO_INT_H
#define SNAP_IO_INT_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <hdf5.h>

#include "snap/io.h"

#define SNAP_IO_FORMAT_NAME "snapio"
#define SNAP_IO_FORMAT_VERSION 1
#define SNAP_IO_MANIFEST "MANIFEST"
/* Present in a step directory from its first rank file until MANIFEST is in
 * place: rank files without MANIFEST and without it mean a sealed step whose
 * MANIFEST was lost afterwards (snap_io_lost_step), not an unfinished flush. */
#define SNAP_IO_INCOMPLETE ".incomplete"
#define SNAP_IO_MAX_NAME 1024
#define SNAP_IO_LZ4_FILTER 32004
#define SNAP_IO_ALIGN 4096

/* Per-dataset metadata of an open rank file (read.c fills it). */
struct io_ds {
	char name[SNAP_IO_MAX_NAME + 1];
	char dataset[3 * SNAP_IO_MAX_NAME + 1];
	struct snap_io_region_info info;
	uint64_t off;          /* file offset of contiguous data, else UINT64_MAX */
	/* What the manifest sums for this dataset: info.crc32c, or for a frame
	 * dataset the CRC32C of its frame_crc32c attribute (LE u32s). */
	uint32_t sumcrc;
	uint64_t chunk_elems;  /* frames: values per HDF5 chunk, min(frame_elems, count) */
};
/* Who a rank file says it is (root attributes). */
struct io_rank_id {
	const char *job;
	uint64_t step;
	uint32_t rank, world;
};

/* ---- err.c ---- */

/* Set the error (code + printf message); returns code. The first
 * error set wins so that the root cause is what the caller reads. */
int io_fail(struct snap_io_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
void io_err_clear(struct snap_io_err *err);
/* Same, with HDF5's innermost error description appended. */
int io_fail_h5(struct snap_io_err *err, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* errno -> SNAP_E* */
int io_errno_code(int e);

/* Enter/leave the HDF5 section: takes the process-wide lock and silences
 * HDF5's automatic error printing (restored on leave). */
void io_h5_enter(void);
void io_h5_leave(void);

/* CRC32C running state (state starts at 0xFFFFFFFF, final ^ ~0). */
uint32_t io_crc_update(uint32_t state, const void *buf, size_t len);
/* The same over v as 4 little-endian bytes (checksums of checksums). */
uint32_t io_crc_u32le(uint32_t state, uint32_t v);

/* ---- names.c ---- */

int io_check_job(const char *job, struct snap_io_err *err);
/* Injective escape of a region name into an HDF5 link name. out has room
 * for 3 * SNAP_IO_MAX_NAME + 1 bytes. */
int io_sanitise(const char *name, char *out, size_t cap);
/* Paths. Return SNAP_EINVAL when they do not fit. */
int io_path_job(char *out, size_t cap, const char *dir, const char *job);
int io_path_step(char *out, size_t cap, const char *dir, const char *job, uint64_t step);
/* Per-node flush directories: dir names the node as "%n" (io.h). */
int io_is_pattern(const char *dir);
/* pattern with "%n" replaced by node (a plain dir is copied); 0 or SNAP_EINVAL. */
int io_node_dir(char *out, size_t cap, const char *pattern, uint32_t node);
/* The node numbers whose directories exist, ascending (*nodes malloc'd,
 * NULL when none). "%n" must appear once, inside one path component. */
int io_list_nodes(const char *pattern, uint32_t **nodes, size_t *count, struct snap_io_err *err);
/* mkdir -p with fsync of each parent that gained an entry. */
/* Create path and its missing parents with exactly `mode` (chmod after
 * mkdir, so the umask does not change it); existing ones are left alone. */
int io_mkdirs(const char *path, unsigned mode, struct snap_io_err *err);
/* A directory's bits for files of mode `m`: x added where r is set. */
static inline unsigned io_dir_mode(unsigned m) { return m | ((m & 0444) >> 2); }
int io_fsync_dir(const char *path);
/* rm -r of a directory tree (no symlink following). */
int io_rmtree(const char *path);

/* ---- attr.c ---- */

/* Writing (the attribute must not exist yet); 0 or -1. */
int io_attr_str(hid_t obj, const char *name, const char *val);
int io_attr_u64(hid_t obj, const char *name, const uint64_t *v, size_t n);
int io_attr_u32(hid_t obj, const char *name, uint32_t v);
/* The attributes every region's dataset has: name, kind, dtype, codec,
 * step, global_shape, shard_offset. */
int io_attrs_region(hid_t ds, const struct snap_io_region *g, const char *codec, uint64_t step);
/* u32[n] (a 1-D attribute even when n is 1). */
int io_attr_u32s(hid_t obj, const char *name, const uint32_t *v, size_t n);
/* Reading; 0 or -1 (missing, wrong type or size). */
int io_get_attr_str(hid_t obj, const char *name, char *out, size_t cap);
int io_get_attr_u64(hid_t obj, const char *name, uint64_t *v, size_t max, size_t *n);
/* Exactly n u32 values of a 1-D or scalar attribute; -1 otherwise. */
int io_get_attr_u32s(hid_t obj, const char *name, uint32_t *v, size_t n);
/* Elements of an attribute's dataspace; -1 if it has none. */
int64_t io_attr_npoints(hid_t obj, const char *name);
/* The HDF5 file type that stores a dtype (caller closes it). */
hid_t io_h5_type(int dtype);

/* ---- uring.c ---- */

/* Bulk writes of memory to file offsets. */
struct io_uring_writer;
/* NULL with *e = -ENOMEM (out of memory) or io_uring_queue_init's -errno. */
struct io_uring_writer *io_uw_new(unsigned qd, size_t io_bytes, int *e);
void io_uw_free(struct io_uring_writer *u);
/* Starts a file: fd_direct may be -1 (no O_DIRECT); fd_buf is a plain fd.
 * A writer whose submit or wait failed earlier is poisoned: this rebuilds
 * its ring first and returns -errno if that fails. */
int io_uw_begin(struct io_uring_writer *u, int fd_direct, int fd_buf);
/* Queues src[0..len) for file offset off; updates *crc (running state, not
 * finalised) in order, so *crc is complete when this returns even though
 * writes may still be in flight. tag is the caller's name for the range
 * (a region index) and is recorded with each write. Returns 0 or -errno of
 * the first failed write so far (of this range or an earlier one). */
int io_uw_write(struct io_uring_writer *u, const void *src, size_t len, uint64_t off, uint32_t *crc,
		size_t tag);
/* A piece of a file range written from several sources (io_uw_write_pieces). */
struct io_piece {
	const void *src;
	size_t len;
	uint32_t *crc; /* running CRC32C state updated with these bytes; NULL: none */
	size_t tag;    /* io_uw_write's tag, for a write that starts in this piece */
};
/* Queues pieces[0..n), which lie back to back in the file from off: one
 * O_DIRECT write per io_bytes of the whole range, assembled in the bounce
 * buffers, so small sources make no small writes; only the range's own head
 * and tail go through the page cache. Without O_DIRECT each piece is an
 * io_uw_write of its own. Each piece's crc is complete when this returns. */
int io_uw_write_pieces(struct io_uring_writer *u, const struct io_piece *pieces, size_t n, uint64_t off);
/* Waits for everything in flight; returns 0 or the first -errno. A failed
 * wait is retried (for about a second) rather than leaving writes in
 * flight; io_uw_inflight says whether any still are, in which case their
 * fds must stay open. */
int io_uw_drain(struct io_uring_writer *u);
unsigned io_uw_inflight(const struct io_uring_writer *u);
/* 1 when the current file has an O_DIRECT fd (io_uw_begin). */
int io_uw_direct(const struct io_uring_writer *u);
/* The tag of the range whose write failed first (valid when a write or
 * drain returned an error since io_uw_begin). */
size_t io_uw_error_tag(const struct io_uring_writer *u);

/* ---- deferdrv.c ---- */

/* A raw-data write HDF5 asked for and the driver recorded instead of
 * making (see deferdrv.c): the bulk pass makes it. */
struct io_deferred {
	uint64_t off;
	const void *src;
	size_t len;
	size_t region;  /* index of the region in the writer's call */
	uint32_t frame; /* frame of that region */
};
/* One file's announced write and recorded ones. The caller owns v. */
struct io_defer {
	const void *want;
	size_t want_len, want_region;
	uint32_t want_frame;
	struct io_deferred *v;
	size_t n, cap;
	/* Set just before H5Fclose: from then on a failed write, truncate or
	 * close is kept in close_errno (the first) and reported to HDF5 as
	 * done. HDF5 1.10 leaves a file whose close failed half torn down in its
	 * ID table, and crashes when the library shuts down (H5F__close_cb);
	 * the writer reports close_errno itself and discards the file. */
	int closing, close_errno;
};
/* Sets fapl to the driver, recording into d; 0 or -1 (HDF5 lock held). */
int io_defer_fapl(hid_t fapl, struct io_defer *d);
/* The next raw write from src[0..len) is to be recorded, not made. */
void io_defer_expect(struct io_defer *d, const void *src, size_t len, size_t region, uint32_t frame);
/* 1 if the announced write was recorded; clears the announcement. */
int io_defer_taken(struct io_defer *d);
/* H5Fclose of file f, made through the driver with d: 0; the errno of the
 * first write, truncate or close that failed during it (kept from HDF5,
 * see io_defer.closing; the file is to be discarded); or -1 when HDF5
 * failed by itself (its error stack says why). */
int io_defer_close(hid_t f, struct io_defer *d);

/* ---- lz4chunk.c ---- */

/* The byte layout of HDF5 filter 32004. */
size_t io_lz4_bound(size_t n);
/* Encodes src[0..n) into dst (io_lz4_bound(n) bytes); returns encoded size. */
size_t io_lz4_encode(const void *src, size_t n, void *dst);
/* Decodes exactly; returns 0 or SNAP_ECORRUPT / SNAP_ETRUNC. *out_n gets
 * the original size, which must be <= cap. */
int io_lz4_decode(const void *src, size_t n, void *dst, size_t cap, size_t *out_n);

/* How an LZ4 dataset is cut into chunks, shared by writer and
 * reader so they cannot disagree. Chunk shape: ones before dim j, a run of
 * cj along dim j, whole dims after it; so chunk (o, r) -- o counts the
 * index tuples of the dims before j, r the runs along j -- is one
 * contiguous range of the C-order data, and only the last run is short. */
struct io_chunk_geom {
	int ndim, j;
	uint64_t shape[SNAP_MAX_NDIM];
	hsize_t chunk[SNAP_MAX_NDIM];
	uint64_t cj, outer, runs;
	uint64_t row_bytes;    /* bytes of one index along dim j */
	size_t full;           /* bytes of a full chunk (edge chunks are padded to it) */
};
/* Writer: whole trailing dims while they fit target bytes, then a run. */
void io_chunk_plan(const uint64_t *shape, int ndim, size_t es, size_t target, struct io_chunk_geom *g);
/* Reader: from a dataset's stored chunk shape; -1 if snapio does not
 * write that shape. */
int io_chunk_from(const uint64_t *shape, int ndim, size_t es, const hsize_t *chunk, struct io_chunk_geom *g);
/* Chunk (o, r): its HDF5 offset, its byte offset in the data, its bytes. */
void io_chunk_at(const struct io_chunk_geom *g, uint64_t o, uint64_t r, hsize_t *off, uint64_t *src, size_t *len);

/* ---- rankfile.c ---- */

/* "<sdir>/rank-<rank>.h5" (sdir: a step directory); SNAP_EINVAL if it does
 * not fit. io_path_rank: the same under dir/job/step. */
int io_rank_name(char *out, size_t cap, const char *sdir, uint32_t rank);
int io_path_rank(char *out, size_t cap, const char *dir, const char *job, uint64_t step, uint32_t rank);
/* Whether a directory entry is named like a rank file ("rank-*.h5"). */
int io_is_rank_name(const char *name);
/* A temp name beside the rank file, unique in this process and among
 * processes: "<sdir>/.rank-<rank>.h5.tmp.<pid>.<seq>". */
int io_rank_tmp_name(char *out, size_t cap, const char *sdir, uint32_t rank);
/* Creates tmp (O_EXCL) with exactly `mode`, hands it to HDF5 (4096-aligned
 * allocation, through deferdrv.c recording into defer) and writes the root
 * attributes of id; *file is open on 0. final names the file in messages. */
int io_rank_create(const char *tmp, const char *final, unsigned mode, const struct io_rank_id *id,
		   struct io_defer *defer, hid_t *file, struct snap_io_err *err);
/* Opens a rank file read-only and checks its root attributes. When expect
 * is not NULL, the file's job, step, rank and world must equal it
 * (SNAP_EMISMATCH naming the file and the fields otherwise): a rank file
 * swapped with another rank's has valid checksums but is the wrong shard.
 * Anything but a regular file is refused before HDF5 sees it. */
int io_rank_open_file(const char *path, const struct io_rank_id *expect, hid_t *file, struct snap_io_err *err);

/* ---- frames.c ---- */

/* The codec attribute names of frame datasets: SNAP_CODEC_* id <-> name. */
const char *io_frame_codec_name(int codec);
int io_frame_codec_parse(const char *name);
/* Checks a frame region's fields (writer, before writing). */
int io_frames_check(const struct snap_io_region *g, struct snap_io_err *err);
/* Creates the frame dataset of region g, index i of the writer's call
 * (writer). Each frame's chunk is allocated through H5Dwrite_chunk and its
 * write recorded in defer for the bulk pass, which checks frame_crc; a
 * frame HDF5 wrote itself (the driver did not record it) is checked here. */
int io_frames_write(hid_t f, const char *final, const char *dsname, const struct snap_io_region *g, size_t i,
		    uint64_t step, struct io_defer *defer, uint64_t *stored, struct snap_io_err *err);
/* SNAP_ECORRUPT: frame k of g (dataset dsname) gives CRC32C got. */
int io_frame_crc_fail(const char *final, const struct snap_io_region *g, const char *dsname, uint32_t k,
		      uint32_t got, struct snap_io_err *err);
/* Reads what ds_meta needs of a frame dataset (shape, frame_elems,
 * frame_crc32c, chunk layout and filter) into d, checked for consistency;
 * ds is the open dataset, dims/nd its dataspace. */
int io_frames_meta(hid_t ds, const char *path, const hsize_t *dims, int nd, hid_t dcpl, struct io_ds *d,
		   struct snap_io_err *err);
/* A frame dataset read back, each frame CRC-checked against the
 * frame_crc32c attribute first. raw: frame k goes to raw->buf + k*frame_cap
 * with its length and CRC32C in raw->frame_len/frame_crc (if not NULL);
 * raw NULL and vals not NULL: decoded values into vals[0..info.bytes);
 * both NULL: CRCs only. One frame's buffer at a time. */
int io_frames_read(hid_t file, const char *path, const struct io_ds *d, const struct snap_io_dest *raw,
		   void *vals, struct snap_io_err *err);

/* ---- read.c ---- */

/* io_rank_open_file, then every dataset's metadata: *ds a malloc'd array of
 * *n entries, *file open, on 0. */
int io_rank_open(const char *path, const struct io_rank_id *expect, hid_t *file, struct io_ds **ds,
		 size_t *n, struct snap_io_err *err);

/* Reads one dataset's raw bytes (CRC-verified) into buf[0..info.bytes);
 * frames are decoded. buf NULL: verify only (frames: their CRCs). */
int io_ds_read(hid_t file, const char *path, const struct io_ds *d, void *buf,
	       struct snap_io_err *err);

/* ---- stepmanifest.c ---- */

struct io_manifest_rank {
	uint64_t size;
	uint64_t ndatasets;
	uint64_t raw_bytes;
	uint32_t crcsum;
	int present;        /* listed (a part lists only its own ranks) */
	int64_t node;       /* per-node directories: the node whose part lists it; else -1 */
};
/* Reads and checks one directory's MANIFEST of the step (and, when
 * check_files, that every rank file it lists exists with its size): world
 * and whether it is a node's part out; ranks may be NULL, else gets a
 * malloc'd array of world entries, the listed ones present. */
int io_manifest_read(const char *dir, const char *job, uint64_t step, int check_files, uint32_t *world, int *part,
		     struct io_manifest_rank **ranks, struct snap_io_err *err);
/* The manifest's checksum over datasets' sumcrc, in order. */
uint32_t io_ds_crcsum(const struct io_ds *ds, size_t n);

/* ---- steps.c ---- */

/* A persisted step's MANIFEST, or with a pattern dir the union of its
 * parts, every rank present (world entries; ranks may be NULL). A lone
 * part read without the pattern: SNAP_EINVAL saying so. */
int io_manifest_load(const char *dir, const char *job, uint64_t step, int check_files,
		     uint32_t *world, struct io_manifest_rank **ranks, struct snap_io_err *err);
/* A rank file's path: in dir, or in m's node directory of a pattern. */
int io_rank_path(char *out, size_t cap, const char *dir, const char *job, uint64_t step, uint32_t rank,
		 const struct io_manifest_rank *m);
/* "step-<decimal>" -> step; -1 if the name is anything else. */
int io_parse_step_name(const char *name, uint64_t *step);

#endif
