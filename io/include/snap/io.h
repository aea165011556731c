/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/io.h - persistence of snapshots to HDF5 (libsnap's io/ component).
 *
 * io/ knows nothing of sockets, slots or daemons: it takes one step's regions
 * of one rank as memory pointers plus metadata and writes one HDF5 file; it
 * seals a step once every rank's file is in place; it lists, verifies, reads
 * back, exports and garbage-collects persisted steps.
 *
 * On-disk layout (docs/io-format.md has the full format):
 *
 *   <dir>/<job>/step-<step>/rank-<rank>.h5   one file per rank, written as a
 *                                             hidden temp file, fsynced, renamed
 *   <dir>/<job>/step-<step>/MANIFEST         written last, atomically, by
 *                                             snap_io_step_seal()
 *
 * A step is "persisted" only when its MANIFEST parses, its own CRC32C matches
 * and every rank file it lists exists with the listed size. A crash at any
 * instant leaves either a persisted step or one that no call here reports
 * as persisted.
 *
 * Per-node flush directories: a dir containing "%n" (once, inside one path
 * component: "/pfs/ckpt/node%n") stands for one directory per node, "%n"
 * replaced by the node's number in decimal. Each node writes its ranks'
 * files into its own directory and seals them there as a part
 * (snap_io_part_seal: a MANIFEST listing only those ranks). Every call that
 * reads (listing, world, regions, read, verify, export, lost step) and
 * retention accept the pattern and see the union of the node directories
 * that exist: a step is persisted when its sealed parts agree on the world
 * and list every rank exactly once. The directories must therefore all be
 * reachable where the pattern is read. Writing and sealing take one node's
 * directory, never the pattern; the whole-step calls refuse a lone part.
 *
 * Checksums are CRC32C (Castagnoli) of the raw, uncompressed bytes in the
 * standard convention: init 0xFFFFFFFF, final xor 0xFFFFFFFF, i.e.
 * crc32_iscsi(buf, len, 0xFFFFFFFF) ^ 0xFFFFFFFF with ISA-L; the check value
 * of "123456789" is 0xE3069283. snap_io_crc32c() computes it.
 *
 * Errors: every call returns 0 (or a non-negative count) on success and a
 * negative code from snap/error.h on failure. Calls that take a
 * struct snap_io_err * (which may be NULL) fill it with the code and a
 * one-line message naming the file and, where one is at fault, the dataset.
 * HDF5's own error printing is silenced inside every call and its innermost
 * message is folded into ours.
 *
 * Threads: no call starts a thread. Calls may be made from any thread; HDF5
 * work is serialised by one process-wide lock. A writer handle is used by one
 * thread at a time.
 */
#ifndef SNAP_IO_H
#define SNAP_IO_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SNAP_IO_ERRMSG 512

struct snap_io_err {
	int code;                    /* the value the call returned */
	char msg[SNAP_IO_ERRMSG];    /* "" on success */
};

enum snap_io_codec {
	SNAP_IO_CODEC_NONE = 0,      /* contiguous dataset, raw bytes via io_uring */
	SNAP_IO_CODEC_LZ4 = 1,       /* chunked dataset, HDF5 filter 32004 */
	/* Reported only (snap_io_region_info.codec), never a writer option: a
	 * frame region (snap_io_region.nframes > 0), stored as its snap/codec.h
	 * streams, one HDF5 chunk each, under filter SNAP_IO_FILTER_CODEC.
	 * Frame regions are written so whatever the writer's codec is. */
	SNAP_IO_CODEC_FRAMES = 2,
};

/* HDF5 filter id of codec frames. In HDF5's range for unregistered filters
 * (256-511): not yet registered with The HDF Group. h5py/h5dump need the
 * plugin libh5z_snapcodec.so (built in io/plugin) on HDF5_PLUGIN_PATH to
 * read frame datasets; snapio itself never needs it. */
#define SNAP_IO_FILTER_CODEC 311

enum snap_io_flags {
	/* Do not open the file with O_DIRECT (it is also skipped, silently,
	 * where the filesystem refuses it, e.g. tmpfs). */
	SNAP_IO_NO_DIRECT = 1u << 0,
};

/* Writer options. Zero-initialise and set what you need: a 0 field takes
 * the default shown. */
struct snap_io_opts {
	int codec;             /* enum snap_io_codec; default NONE */
	size_t chunk_bytes;    /* LZ4: target uncompressed chunk size; 4 MiB */
	size_t io_bytes;       /* bytes per io_uring write; 4 MiB */
	unsigned queue_depth;  /* io_uring writes in flight; 8 */
	unsigned flags;        /* enum snap_io_flags */
	unsigned mode;         /* permission bits of the files written, whatever the umask;
	                          0 means 0600. Directories created get x where r is set.
	                          snap_io_step_seal gives MANIFEST its step directory's bits
	                          less x. */
};

/* One region of one rank for one step. The data are the raw bytes of the
 * local shard in C order: bytes == prod(shape) * snap_dtype_size(dtype);
 * or, for a frame region (nframes > 0), the shard as snap/codec.h streams. */
struct snap_io_region {
	const char *name;      /* the region's name; any bytes but NUL, <= 1024 */
	int dtype;             /* enum snap_dtype */
	int kind;              /* enum snap_kind */
	int ndim;              /* 1..SNAP_MAX_NDIM (store scalars as shape [1]) */
	uint64_t global_shape[SNAP_MAX_NDIM]; /* the whole logical tensor */
	uint64_t shard_offset[SNAP_MAX_NDIM]; /* where this shard starts in it */
	uint64_t shape[SNAP_MAX_NDIM];        /* this shard's local dims */
	const void *data;
	size_t bytes;
	uint32_t crc32c;       /* CRC32C of data[0..bytes), when has_crc */
	int has_crc;           /* 0: the writer computes it (no source check) */
	/* Frame regions: nframes > 0 means the region is stored as snap/codec.h
	 * streams, frame i holding values [i*frame_elems, min((i+1)*frame_elems,
	 * count)), count = prod(shape) (so count > 0). data/crc32c/has_crc are
	 * then ignored; bytes is still the raw size (count * dtype size) and
	 * dtype must be f32, bf16 or f16. The streams go to disk as they are
	 * (never decoded and re-encoded, so lossy values are quantized once).
	 * Checked before anything is written: nframes == ceil(count /
	 * frame_elems); every frame non-NULL with 0 < frame_len < 4 GiB equal to
	 * the stream length its header gives; each header (snap_codec_inspect)
	 * parses (else SNAP_ECORRUPT) and says this dtype and exactly the
	 * frame's value count (else SNAP_EINVAL); min(frame_elems, count) *
	 * dtype size < 4 GiB (one HDF5 chunk). Errors name region and frame.
	 * Zero-initialised (nframes 0): a raw region as before. */
	uint32_t nframes;
	uint64_t frame_elems;        /* values per frame (the last may hold fewer) */
	const void *const *frame;    /* nframes stream pointers (any alignment) */
	const uint64_t *frame_len;   /* their lengths in bytes */
	const uint32_t *frame_crc;   /* CRC32C of each stream as stored; checked
				      * while writing, SNAP_ECORRUPT naming
				      * region and frame on mismatch */
};

/* What one snap_io_write_rank() did. */
struct snap_io_write_stats {
	uint64_t raw_bytes;     /* sum of region bytes (raw size of frame regions) */
	uint64_t stored_bytes;  /* bytes of dataset storage (after LZ4; frame lengths) */
	uint64_t file_bytes;    /* size of the final file */
	double seconds;         /* wall time, create to rename + directory fsync */
	int direct;             /* 1 if bulk writes went with O_DIRECT */
	uint64_t bulk_bytes;    /* bytes written by snapio's io_uring pass, not HDF5:
				   uncompressed data, codec frames, and LZ4
				   chunks when direct (else HDF5 writes those) */
};

/* CRC32C of buf[0..len) in the convention above. */
uint32_t snap_io_crc32c(const void *buf, size_t len);

/* ---- writing ---------------------------------------------------------- */

struct snap_io_writer;

/* A writer owns an io_uring ring and queue_depth aligned buffers of io_bytes
 * each (its whole memory footprint; LZ4 adds two chunk buffers while a
 * write runs). opts may be NULL for defaults. Returns NULL and fills err on
 * failure (bad options, io_uring unavailable, out of memory). */
struct snap_io_writer *snap_io_writer_new(const struct snap_io_opts *opts, struct snap_io_err *err);

/* Releases the ring and buffers. NULL is a no-op. */
void snap_io_writer_free(struct snap_io_writer *w);

/*
 * Writes <dir>/<job>/step-<step>/rank-<rank>.h5 holding the n regions, then
 * fsyncs it, renames it into place and fsyncs the directory. Creates the
 * directories as needed. Each region becomes one dataset in the root group;
 * see docs/io-format.md for names, types and attributes.
 *
 * Checks before writing anything: job is [A-Za-z0-9._-]{1,128} not starting
 * with '.'; rank < world; each region's dtype, kind, ndim, shapes, bytes are
 * consistent; names are unique; frame regions as described at struct
 * snap_io_region. Checks while writing: when has_crc, the bytes still have
 * that CRC, and each frame its frame_crc (SNAP_ECORRUPT names the region,
 * and the frame, otherwise).
 *
 * Refuses (SNAP_ESTATE) to write into a step that is already persisted.
 * An existing rank file of an unsealed step is replaced atomically.
 * On any failure the temp file is removed and no rank file appears, with
 * one exception: when only the final fsync of the step directory fails
 * (the message says "fsync of directory failed"), the rank file is already
 * renamed into place, complete and fsynced, and is left there; only the
 * durability of its directory entry across a crash is unknown. Writing the
 * rank again (or sealing, which fsyncs the directory again) settles it.
 * ENOSPC from the disk is SNAP_ENOSPC; permission problems SNAP_EPERM;
 * other I/O failures SNAP_EIO. stats may be NULL.
 */
int snap_io_write_rank(struct snap_io_writer *w, const char *dir, const char *job,
		       uint64_t step, uint32_t rank, uint32_t world,
		       const struct snap_io_region *regions, size_t n,
		       struct snap_io_write_stats *stats, struct snap_io_err *err);

/*
 * Seals a step: checks that rank-0..world-1 files all exist and are
 * well-formed snapio files of this job, step, rank and world (metadata only;
 * no data is read), then writes MANIFEST atomically (temp, fsync, rename,
 * directory fsync). Call it once the caller knows every rank's file is
 * written (on one node, after all nodes reported their flush done).
 * Idempotent: sealing a persisted step with the same world returns 0.
 * Missing rank files: SNAP_ENOENT naming the first missing one.
 */
int snap_io_step_seal(const char *dir, const char *job, uint64_t step, uint32_t world,
		      struct snap_io_err *err);

/*
 * Seals one node's part of a step in its own directory (dir is that node's
 * directory, not the pattern): checks the n listed rank files as
 * snap_io_step_seal does, then writes a MANIFEST that lists only them
 * ("part n"). The step becomes persisted, read through the pattern, once
 * the parts of all nodes list every rank 0..world-1. Idempotent for the
 * same world and ranks; another world or rank set: SNAP_ESTATE. Ranks
 * must be below world and distinct (SNAP_EINVAL).
 */
int snap_io_part_seal(const char *dir, const char *job, uint64_t step, uint32_t world, const uint32_t *ranks,
		      size_t n, struct snap_io_err *err);

/*
 * Withdraws a node's sealed part of a step that is not persisted (dir is
 * that node's directory): marks the step unfinished, then removes the
 * part's MANIFEST, so the rank files can be written again. A flush of the
 * step calls it on every node first: a part left sealed by an earlier try,
 * or by an earlier incarnation of the job whose step had other bytes,
 * would otherwise join the new parts (or list a rank twice). Returns 1
 * when a part was withdrawn, 0 when there was none; a whole step's
 * MANIFEST is never withdrawn (SNAP_ESTATE).
 */
int snap_io_part_withdraw(const char *dir, const char *job, uint64_t step, struct snap_io_err *err);

/* ---- finding persisted steps ------------------------------------------ */

/* Fills steps[0..cap) with the job's persisted steps, newest first, and
 * returns how many there are in all (which may exceed cap; steps may be NULL
 * when cap is 0). A job directory that does not exist has 0 steps. */
int snap_io_list_steps(const char *dir, const char *job, uint64_t *steps, size_t cap,
		       struct snap_io_err *err);

/* Newest persisted step of the job into *step; SNAP_ENOENT if there is none. */
int snap_io_newest_step(const char *dir, const char *job, uint64_t *step, struct snap_io_err *err);

/*
 * Evidence of a lost persisted step: the newest step directory above
 * newer_than that holds a rank file but neither MANIFEST nor the mark an
 * unfinished flush leaves (.incomplete, removed when the step is sealed),
 * i.e. a step that was sealed and then lost its MANIFEST. 1 and *step, or 0.
 */
int snap_io_lost_step(const char *dir, const char *job, uint64_t newer_than, uint64_t *step);

/*
 * The newest step that was sealed, whatever became of its files since: its
 * MANIFEST (per node: parts listing every rank) is in place, or is there
 * but torn. Newer than snap_io_newest_step's, it is a persisted step that
 * was damaged (a rank file truncated or deleted), never an unfinished flush.
 * 1 and *step, or 0.
 */
int snap_io_sealed_step(const char *dir, const char *job, uint64_t *step);

/* World size recorded in a persisted step's MANIFEST; SNAP_ENOENT if the step
 * is not persisted. */
int snap_io_step_world(const char *dir, const char *job, uint64_t step, uint32_t *world,
		       struct snap_io_err *err);

/* ---- reading back ----------------------------------------------------- */

/* What a rank file says about one region. Pointers are valid only during
 * the callback. */
struct snap_io_region_info {
	const char *name;       /* original region name */
	const char *dataset;    /* HDF5 dataset name (sanitised) */
	int dtype, kind, ndim;
	int codec;              /* enum snap_io_codec: NONE, LZ4 or FRAMES */
	uint64_t global_shape[SNAP_MAX_NDIM];
	uint64_t shard_offset[SNAP_MAX_NDIM];
	uint64_t shape[SNAP_MAX_NDIM];  /* the real local shape, frames too */
	uint64_t bytes;         /* raw bytes (decoded size for frames) */
	uint64_t stored_bytes;  /* bytes on disk (for frames: sum of their lengths) */
	uint32_t crc32c;        /* recorded CRC32C of the raw bytes; 0 for frames
				 * (the raw bytes never existed on the writer) */
	/* Frame datasets (codec FRAMES) only; 0 otherwise. */
	int frame_codec;        /* SNAP_CODEC_LOSSLESS/_LOSSY_ABS/_LOSSY_REL of
				 * the first frame's header (the `codec` attribute) */
	uint32_t nframes;
	uint64_t frame_elems;   /* the writer's frame_elems */
};

/* Calls fn once per region of a persisted step's rank file, in file order;
 * a non-zero return from fn stops the walk and is returned. */
int snap_io_list_regions(const char *dir, const char *job, uint64_t step, uint32_t rank,
			 int (*fn)(const struct snap_io_region_info *info, void *arg), void *arg,
			 struct snap_io_err *err);

/* A caller buffer to restore one region into, looked up by original name.
 * Zero-initialise: the frame fields left 0 ask for the raw values. */
struct snap_io_dest {
	const char *name;
	void *buf;
	size_t bytes;           /* must equal the region's raw bytes (unless frame_cap > 0) */
	/* Reading a frame region raw: frame_cap > 0 asks for the stored frames,
	 * frame i copied to buf + i*frame_cap (buf holds nframes*frame_cap
	 * bytes; bytes must equal that product, else SNAP_EINVAL). frame_elems
	 * and nframes must match the file's (else SNAP_EMISMATCH naming the
	 * dataset), and so must every frame fit frame_cap (SNAP_EMISMATCH
	 * naming dataset and frame). frame_len/frame_crc (caller arrays of
	 * nframes entries; either may be NULL) receive each frame's length and
	 * CRC32C, which were verified against the file's recorded CRCs. A
	 * dataset stored raw (not as frames) with frame_cap > 0: SNAP_EMISMATCH.
	 * frame_cap == 0 on a frame dataset decodes the values into buf instead
	 * (bytes = raw size): each frame's CRC is verified first, then its
	 * header (dtype, value count) and its decoding. */
	uint64_t frame_cap;
	uint64_t frame_elems;
	uint32_t nframes;
	uint64_t *frame_len;
	uint32_t *frame_crc;
};

/*
 * Restores n regions of a persisted step's rank file into caller buffers and
 * verifies each against its recorded CRC32C (frame datasets: each frame
 * against its recorded CRC32C, raw or decoded as struct snap_io_dest says;
 * decoding needs no plugin). Errors name file and dataset (and frame):
 * SNAP_ENOENT (step not persisted, file or region missing), SNAP_EMISMATCH
 * (bytes differ from the region's, frame fields do not fit the dataset, or
 * the file's own job/step/rank/world
 * attributes are not this step's rank of the manifest's world, e.g. another
 * rank's file copied over it), SNAP_ETRUNC (file shorter than its
 * data), SNAP_ECORRUPT (checksum, LZ4 framing or codec stream wrong), SNAP_EIO.
 * On failure the buffers' contents are unspecified.
 */
int snap_io_read_rank(const char *dir, const char *job, uint64_t step, uint32_t rank,
		      const struct snap_io_dest *dests, size_t n, struct snap_io_err *err);

/*
 * Verifies a persisted step: MANIFEST, every rank file's size, and every
 * dataset's CRC32C, recomputed from the disk with bounded memory (one 4 MiB
 * buffer, one LZ4 chunk or one codec frame; frames are checked against their
 * recorded per-frame CRC32C, not decoded). Checks everything; returns 0 if all is well,
 * else the first error's code with a message naming the first bad file and
 * dataset and how many datasets failed in all. *bad (may be NULL) gets that
 * count.
 */
int snap_io_verify_step(const char *dir, const char *job, uint64_t step, size_t *bad,
			struct snap_io_err *err);

/* ---- retention -------------------------------------------------------- */

/*
 * Keeps the newest `keep` (>= 1) persisted steps and deletes older ones;
 * also deletes incomplete step directories older than the newest persisted
 * step and leftovers of interrupted deletions. Never touches the newest
 * persisted step nor incomplete steps newer than it (a flush may be under
 * way). A step is first renamed out of the step-N namespace (so it stops
 * being listed atomically) and then removed. Returns the number of step
 * directories removed.
 */
int snap_io_retain(const char *dir, const char *job, unsigned keep, struct snap_io_err *err);

/* ---- export ----------------------------------------------------------- */

enum snap_io_export_mode {
	SNAP_IO_EXPORT_VIRTUAL = 0, /* HDF5 virtual datasets over the rank files */
	SNAP_IO_EXPORT_COPY = 1,    /* materialised, contiguous, uncompressed */
};

/*
 * Writes one HDF5 file where each logical tensor (region name) is a single
 * dataset of its global shape. Shards are placed by shard_offset + shape;
 * a tensor any rank holds whole (shape == global_shape) takes the lowest
 * such rank's copy; identical shards on several ranks (replicas) take the
 * lowest rank's. Shards that overlap otherwise, or do not cover the tensor,
 * or disagree on dtype/global shape: SNAP_EMISMATCH naming the tensor.
 * VIRTUAL stores source paths relative to the output file's directory, so
 * keep the export next to (or move it together with) the flush directory;
 * reading it needs the LZ4 plugin when the step was written with LZ4.
 * COPY reads every shard through snap_io_read_rank's verification and needs
 * memory for the largest shard; frame shards are decoded, so a COPY export
 * is plain contiguous values that need no plugin. VIRTUAL over frame shards
 * maps each flat frame dataset onto its N-D box (reading it then needs the
 * codec plugin, see SNAP_IO_FILTER_CODEC); where HDF5 refuses that mapping
 * the export fails with SNAP_EUNSUPPORTED saying to use COPY. out_path is written to a temp file and
 * renamed. The step must be persisted.
 */
int snap_io_export(const char *dir, const char *job, uint64_t step, const char *out_path,
		   int mode, struct snap_io_err *err);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_IO_H */
