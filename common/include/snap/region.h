/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/region.h - struct snap_region, one region of memory
 * a client registers; the snapshot layout (snap/manifest.h) is built from
 * it.
 * Part of the public API: snap/snap.h includes it, and a user includes
 * snap/snap.h, not this header. It lives in common/ because proto/ (what a
 * client and snapsmp agree on) needs the same definitions without
 * depending on libsnap/.
 */
#ifndef SNAP_REGION_H
#define SNAP_REGION_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * A region of memory to snapshot. ptr must stay valid and keep its size until
 * snap_close(). ndim == 0 means a flat 1-D tensor of bytes/dtype_size
 * elements, unsharded. Otherwise shape[] is this rank's shard, and
 * global_shape[] / shard_offset[] place it in the logical tensor (used by
 * export to reassemble shards; pass global_shape == shape and zero offsets
 * for an unsharded tensor).
 */
struct snap_region {
	const char *name;              /* unique, 1..SNAP_NAME_MAX bytes, no NUL/control chars */
	void *ptr;
	uint64_t bytes;
	int dtype;                     /* enum snap_dtype */
	int kind;                      /* enum snap_kind */
	int device;                    /* SNAP_DEVICE_HOST or SNAP_DEVICE_CUDA; see "GPU regions" */
	int codec;                     /* enum snap_codec_id; see "Codecs" below */
	double codec_bound;            /* LOSSY_ABS: the absolute bound; LOSSY_REL: the factor */
	int ndim;
	uint64_t shape[SNAP_MAX_NDIM];
	uint64_t global_shape[SNAP_MAX_NDIM];
	uint64_t shard_offset[SNAP_MAX_NDIM];
};

#ifdef __cplusplus
}
#endif

#endif
