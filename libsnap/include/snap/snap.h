/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/snap.h - the libsnap C API: asynchronous, crash-safe snapshots of a
 * training job's state into node-local memory held by snapsmp.
 *
 * The cycle, once per step:
 *
 *     snap_fence(ctx);          // previous snapshot copied: memory is yours
 *     ...modify registered memory (optimizer step)...
 *     snap_save(ctx, step);     // returns at once; copy threads work behind
 *     ...forward/backward, which only READS the registered memory...
 *
 * Regions are registered once with snap_register() before the first save or
 * restore. A save copies every region into a shared-memory slot owned by the
 * node's snapsmp daemon; when the copy is done the library sends COMMIT with a
 * manifest (layout + CRC32C of every chunk) and the daemon publishes it
 * atomically. A trainer that dies at any instant loses at most the snapshot
 * in progress; the newest committed one stays restorable.
 *
 * Why a fence: the copy runs concurrently with your code. If you modify a
 * registered region before the copy has read it, the snapshot holds a mix of
 * two steps, and nothing downstream can tell. snap_save() therefore refuses
 * (SNAP_EUNFENCED) while the previous save has not been fenced, so forgetting
 * the fence fails loudly on the very next step instead of silently corrupting
 * state. snap_fence() returns at once when the copy is already complete.
 *
 * Thread safety: a snap_ctx is not thread-safe; call it from one thread at a
 * time (normally the training loop). Distinct contexts are independent. The
 * library runs its own copy threads; they touch only registered memory (read)
 * and the mapped slot (write), and are joined by snap_close().
 *
 * Errors: every call returns 0 (or a documented non-negative value) on
 * success, or a negative code from snap/error.h. snap_errmsg() gives a
 * message naming the region, step, file or daemon at fault.
 */
#ifndef SNAP_SNAP_H
#define SNAP_SNAP_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"
/* The version, struct snap_config and struct snap_region live in common/
 * because proto/ shares them with this API (docs/design/components.md). */
#include "snap/config.h"
#include "snap/region.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version macros (SNAP_VERSION_*) are in snap/config.h. */
/* SNAP_VERSION_NUMBER of the loaded library (e.g. 400 for 0.4.0). */
SNAP_API int snap_version(void);
/* "0.4.0" */
SNAP_API const char *snap_version_string(void);

#define SNAP_STEP_LATEST UINT64_MAX

/*
 * Growing the ABI. struct snap_config, struct snap_region and struct
 * snap_region_info only ever gain fields at their end. Every call that
 * takes one is told the size the caller was compiled with (the inline
 * wrappers below pass sizeof), so a program built against an older header
 * keeps working with a newer library (missing fields take their defaults),
 * and a program built against a newer header gets SNAP_EUNSUPPORTED from an
 * older library only if it sets a field that library does not know.
 * Language bindings call the *_size functions with their struct's size.
 */

/* struct snap_config, snap_config_init() and snap_config_from_env(): snap/config.h. */

/* Parse "4096", "4K", "4KiB", "16M", "2G", "1T" into bytes. 0 or SNAP_EINVAL (also for NULL). */
SNAP_API int snap_parse_size(const char *s, uint64_t *out);

typedef struct snap_ctx snap_ctx;

/*
 * Open a context: connect to the node's snapsmp (cfg->socket) and introduce
 * this rank of cfg->job. Retries the connection for cfg->timeout_ms. If ctxp
 * is set to a context even on failure (it is, for every error but
 * SNAP_ENOMEM), read snap_errmsg() and then snap_close() it.
 */
SNAP_API int snap_open(const struct snap_config *cfg, snap_ctx **ctxp);

/* struct snap_region, a region of memory to snapshot: snap/region.h. */

/*
 * Codecs. A region may be held compressed (kernels/, snap/codec.h): set
 * codec to SNAP_CODEC_LOSSLESS (bit-exact), SNAP_CODEC_LOSSY_ABS (every
 * restored value within codec_bound of the saved one; NaN and Inf exact) or
 * SNAP_CODEC_LOSSY_REL (bound = codec_bound * (max - min) of each chunk's
 * finite values, never more than that factor of the whole tensor's range).
 * Only f32, bf16 and f16 regions take a codec (SNAP_EINVAL otherwise).
 *
 * The copy threads compress each chunk (SNAP_CHUNK_SIZE of raw bytes) into
 * the slot, so the node store, its parity and the flushed HDF5 files all
 * hold the same compressed frames: a lossy snapshot is quantized exactly
 * once, and a restore from memory or from disk returns the same values.
 * What shrinks is what the flush writes to disk. The node store does not
 * shrink: a slot reserves each chunk's worst case (snap_codec_bound,
 * slightly above the raw size) and is fully allocated, so a save can never
 * run out of memory half-way (see docs/design/snapshot-path.md, "Codecs"). Compression
 * costs copy time (roughly 2 GB/s per copy thread for lossless f32, 3.5 GB/s
 * lossy; see README) against memcpy's ~10 GB/s.
 *
 * A region registered with SNAP_CODEC_NONE takes the configured default of
 * its kind (codec_param / codec_optim) when its dtype is a float type.
 */

/*
 * GPU regions. A region with device = SNAP_DEVICE_CUDA has ptr in CUDA device
 * memory (cudaMalloc or a framework's allocator; the device is read from the
 * pointer, and all CUDA regions of a context must be on one device). The
 * first such registration loads libsnap_cuda.so, installed beside libsnap.so
 * ($SNAP_CUDA_MODULE overrides the path); it needs the NVIDIA driver, not the
 * CUDA toolkit. Without it, or without a device, snap_register() fails with
 * SNAP_EUNSUPPORTED naming the region; host-only jobs never load it.
 *
 * The slots the context maps are page-locked (cudaHostRegister) once, when
 * first mapped: what is pinned is the node store memory snapsmp granted
 * within SNAP_MEM_LIMIT, never a private staging buffer (snap_pinned()).
 * A save copies each chunk on one non-blocking copy stream ordered after the
 * trainer's stream; with a codec the CUDA kernels compress on the device and
 * only the frames cross PCIe, byte-identical to the C codec, so a step saved
 * from a GPU restores on a CPU-only machine and the reverse. The copy
 * threads take each chunk's CRC32C from the pinned copy, as for host memory.
 * snap_restore() copies back to the device (decoding there for codecs).
 */

/*
 * Register one region (snap_register_size: `size` is the caller's
 * sizeof(struct snap_region); see "Growing the ABI"). Allowed until the first snap_save() or snap_restore(),
 * which freeze the layout (SNAP_ESTATE afterwards). Checks the name, dtype,
 * kind, shape against bytes; the struct is copied, the memory is not.
 */
SNAP_API int snap_register_size(snap_ctx *ctx, const struct snap_region *region, size_t size);
static inline int snap_register(snap_ctx *ctx, const struct snap_region *region)
{
	return snap_register_size(ctx, region, sizeof(*region));
}

/*
 * Tell snapsmp the registered layout now, instead of with the first save or
 * restore, and freeze it (a later snap_register fails with SNAP_ESTATE, as
 * after a first save). Call it once every region is registered, before the
 * job's first training step: the daemon then reserves the slot files while
 * that step runs and, in a mesh, maps them and creates the parity files
 * ahead, so the first save and its protect find them ready instead of
 * paying for them (docs/design/store-and-protocol.md, "Warm from the first
 * step"). Optional: without it the first save or restore sends the layout.
 * Errors as the first save's REGISTER: SNAP_ENOSPC when the layout does not
 * fit the daemon's memory budget, SNAP_ESTATE with no region registered.
 */
SNAP_API int snap_prepare(snap_ctx *ctx);

/*
 * Start an asynchronous snapshot of every registered region as `step`.
 * Returns once the copy is queued: it blocks only for one round trip to
 * snapsmp to get a free slot (reconnecting if snapsmp was restarted), longer
 * only when every slot is pinned
 * (another rank has not yet committed the step this rank's older slot is
 * needed for; bounded by timeout_ms, then SNAP_EBUSY). Steps must increase
 * within a context, and after snap_restore() continue from the restored
 * step: saving step s withdraws this rank's committed steps >= s (they
 * belong to the timeline the restore abandoned). Fails with SNAP_EUNFENCED
 * if the previous save was not fenced.
 */
SNAP_API int snap_save(snap_ctx *ctx, uint64_t step);

/*
 * snap_save() ordered after the work already queued on `stream` (a
 * cudaStream_t; NULL: the legacy default stream, which is what snap_save()
 * uses): the copy of CUDA regions starts once that work is done, so the
 * snapshot holds what the optimizer step queued before it. Returns without
 * waiting for the GPU. Without CUDA regions the stream is ignored.
 */
SNAP_API int snap_save_on_stream(snap_ctx *ctx, uint64_t step, void *stream);

/*
 * Wait until the copy of the last save has read all registered memory. After
 * it returns 0 the caller may modify registered memory. Returns at once if
 * there is nothing to wait for. A failed copy is reported here and by
 * snap_wait().
 */
SNAP_API int snap_fence(snap_ctx *ctx);

/*
 * The stream-ordered fence: work queued on `stream` after this call (the
 * next optimizer step) waits, on the GPU, until the copy of the last save
 * has read the CUDA regions; the calling thread does not wait for the copy.
 * It waits only until the copy threads have queued the last chunk (they do
 * so a few chunks ahead of the copy; microseconds per chunk) and, if the
 * context also has host regions, until those are copied. It counts as the
 * fence for snap_save()'s SNAP_EUNFENCED check. The next snap_save() waits
 * for the copy to finish if it is still running. Without CUDA regions it is
 * snap_fence().
 */
SNAP_API int snap_fence_on_stream(snap_ctx *ctx, void *stream);

/*
 * Host memory this context has page-locked for GPU copies: its mapped slots
 * (memory snapsmp granted within SNAP_MEM_LIMIT) plus a table of 8 bytes per
 * chunk. 0 without CUDA regions.
 */
SNAP_API int snap_pinned(snap_ctx *ctx, uint64_t *bytes);

/*
 * Wait until the last save is committed by snapsmp (implies the fence).
 * Returns that save's outcome: 0 once snapsmp has published it.
 */
SNAP_API int snap_wait(snap_ctx *ctx);

/*
 * The newest step restorable for this job on this node: committed by every
 * rank of the job. SNAP_ENOENT when there is none.
 */
SNAP_API int snap_latest(snap_ctx *ctx, uint64_t *step);

/*
 * Restore `step` (or SNAP_STEP_LATEST) into the registered regions. Every
 * chunk's CRC32C is verified; with restore_verify FIRST (by default, once
 * this context has saved or restored) before any registered byte is
 * written, so on failure your memory is untouched; with INLINE (by default,
 * in a new context) as each chunk is copied, so a bad chunk is reported
 * after the others were copied. SNAP_EMISMATCH if the registered layout
 * differs from the snapshot's (the message names the region), or if the
 * snapshot was taken by a job of another world size (no resharding);
 * SNAP_ECORRUPT naming the region and chunk on a checksum mismatch;
 * SNAP_EIO if the slot file cannot be read. Failures after the copy began
 * (a read or device copy error, a frame that passes its CRC but does not
 * decode, any bad chunk under INLINE) say in the message that memory is
 * partly overwritten: restore another step before using it.
 *
 * Self-healing (docs/self-healing.md): a chunk that fails its check (or a
 * slot file that is missing or short) makes snapsmp verify the step and
 * rewrite each bad chunk from the flushed HDF5 copy of the same step,
 * checked against the manifest's CRC32C; the step is then read again whole,
 * so every registered byte is written by the pass that succeeds. A copy no
 * level holds intact is withdrawn. SNAP_STEP_LATEST then means the newest
 * step that restores: the next older one, every registered byte written
 * again, and *restored says which. An explicit step never falls back: it
 * fails with SNAP_ECORRUPT ("no level holds a good copy"). A newer step
 * snapsmp passed over before this call met it (its store manifest was
 * discarded as damaged when snapsmp started and its flushed copy is damaged
 * too) is a fallback as well. After a success that repaired chunks or fell
 * back, snap_errmsg() says so ("restore fell back to step M: step N ...";
 * "" otherwise);
 * a failure after a fallback says what state the memory is in.
 * *restored (may be NULL) receives the step restored. No fence is needed
 * first: it waits for the previous save itself, as snap_wait() does (copy
 * and commit), and returns that save's error if it failed.
 */
SNAP_API int snap_restore(snap_ctx *ctx, uint64_t step, uint64_t *restored);

/*
 * Ask snapsmp to persist `step` (or SNAP_STEP_LATEST, the newest restorable
 * step) to its flush directory (HDF5) now. With wait != 0, returns once the
 * step is persisted (every rank's file complete, fsynced and sealed) or the
 * flush failed. SNAP_EUNSUPPORTED if snapsmp runs without a flush directory.
 * Flushing never blocks saves: it reads the snapshot in the node store.
 */
SNAP_API int snap_flush(snap_ctx *ctx, uint64_t step, int wait);

/*
 * A region of a committed step, as snap_describe() reports it: the fields of
 * struct snap_region that the manifest records (the name is copied).
 */
struct snap_region_info {
	char name[SNAP_NAME_MAX + 1];
	uint64_t bytes;
	int dtype;                     /* enum snap_dtype */
	int kind;                      /* enum snap_kind */
	int device;                    /* where it was saved from (restore may differ) */
	int codec;                     /* enum snap_codec_id it is held with */
	double codec_bound;
	int ndim;                      /* as registered: 0 for a flat region */
	uint64_t shape[SNAP_MAX_NDIM];
	uint64_t global_shape[SNAP_MAX_NDIM];
	uint64_t shard_offset[SNAP_MAX_NDIM];
};

/*
 * Describe `step` (or SNAP_STEP_LATEST) of this rank as snap_restore() would
 * find it, so that a process which does not know the saved layout yet (a
 * framework creates optimizer state lazily) can register a matching one and
 * then restore. Allowed before any registration; does not freeze the layout
 * and writes no registered memory. It asks snapsmp for the step exactly as
 * snap_restore() does, with the same effect on the store: committed steps
 * newer than it that an older incarnation of the job wrote are withdrawn (on
 * SNAP_ENOENT, all of them: the job starts afresh). SNAP_ENOENT when nothing
 * is restorable; SNAP_EMISMATCH when the step was saved by a job of another
 * world size. A step snapsmp would have to load from its flush directory
 * needs a registered layout to load into: read that layout from the HDF5
 * files (docs/io-format.md) instead.
 *
 * *step_out (may be NULL) receives the step, *nregions the number of its
 * regions, and regions[0..cap-1] their descriptions in slot order. With
 * cap < *nregions the call fills cap of them and returns SNAP_EOVERFLOW:
 * call again with room for *nregions (cap 0 and regions NULL to ask).
 * Checksums are not verified here; snap_restore() does that. When
 * SNAP_STEP_LATEST passed over a newer step no level holds whole (its store
 * manifest discarded as damaged, its flushed copy damaged too), snap_errmsg()
 * says so after the success ("restore would fall back to step M: step N
 * ..."; "" otherwise), as snap_restore() of it would. SNAP_ESTATE when the
 * newest step is a persisted one newer than the node store's (the store
 * discarded its damaged manifest) and this context registered no layout
 * yet: snapsmp loads it only into a registered layout (read it from the
 * HDF5 files, register it, then snap_restore(SNAP_STEP_LATEST)).
 * snap_describe_size: `size` is the caller's sizeof(struct snap_region_info),
 * the stride of regions[].
 */
SNAP_API int snap_describe_size(snap_ctx *ctx, uint64_t step, uint64_t *step_out, struct snap_region_info *regions,
			       uint32_t cap, uint32_t *nregions, size_t size);
static inline int snap_describe(snap_ctx *ctx, uint64_t step, uint64_t *step_out, struct snap_region_info *regions,
				uint32_t cap, uint32_t *nregions)
{
	return snap_describe_size(ctx, step, step_out, regions, cap, nregions, sizeof(*regions));
}

/*
 * CRC32C (Castagnoli; crc32c("123456789") == 0xE3069283) as every libsnap
 * format uses it (manifests, chunks, HDF5 attributes), for tools that verify
 * a store or a file without linking the rest. Thread-safe.
 */
SNAP_API uint32_t snap_crc32c(const void *buf, size_t len);

/* The message for the last error on ctx ("" if none), or after a
 * snap_restore() that repaired or fell back, what it did. Valid until the
 * next call. */
SNAP_API const char *snap_errmsg(const snap_ctx *ctx);

/*
 * Wait for an in-flight snapshot to commit, stop the copy threads, unmap the
 * slots and disconnect. Returns the in-flight snapshot's outcome. ctx is freed
 * in all cases; NULL is a no-op.
 */
SNAP_API int snap_close(snap_ctx *ctx);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_SNAP_H */
