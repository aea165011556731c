/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/types.h - value enums shared by every libsnap component (dtype, kind,
 * device, codec) and the limits on names. kernels/, ec/ and io/ include it
 * without linking libsnap (the name functions are in common/). The numeric values are part of the on-disk and wire
 * formats; never renumber, only append.
 */
#ifndef SNAP_TYPES_H
#define SNAP_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"   /* SNAP_API */

#ifdef __cplusplus
extern "C" {
#endif

enum snap_dtype {
	SNAP_DTYPE_U8 = 0,
	SNAP_DTYPE_I8 = 1,
	SNAP_DTYPE_I16 = 2,
	SNAP_DTYPE_I32 = 3,
	SNAP_DTYPE_I64 = 4,
	SNAP_DTYPE_F16 = 5,
	SNAP_DTYPE_BF16 = 6,
	SNAP_DTYPE_F32 = 7,
	SNAP_DTYPE_F64 = 8,
	SNAP_DTYPE_U16 = 9,
	SNAP_DTYPE_U32 = 10,
	SNAP_DTYPE_U64 = 11,
	SNAP_DTYPE_BOOL = 12,
	SNAP_DTYPE_COUNT_
};

enum snap_kind {
	SNAP_KIND_PARAM = 0,     /* model parameter */
	SNAP_KIND_OPTIM = 1,     /* optimizer state */
	SNAP_KIND_RNG = 2,       /* random number generator state */
	SNAP_KIND_OTHER = 3,     /* anything else (step counters, data loader state) */
	SNAP_KIND_COUNT_
};

enum snap_device {
	SNAP_DEVICE_HOST = 0,
	SNAP_DEVICE_CUDA = 1,    /* CUDA device memory (libsnap_cuda.so, loaded at run time) */
	SNAP_DEVICE_COUNT_
};

enum snap_codec_id {
	SNAP_CODEC_NONE = 0,
	SNAP_CODEC_LOSSLESS = 1,
	SNAP_CODEC_LOSSY_ABS = 2, /* absolute error bound */
	SNAP_CODEC_LOSSY_REL = 3, /* bound relative to the tensor's value range */
	SNAP_CODEC_COUNT_
};

#define SNAP_MAX_NDIM 8
#define SNAP_NAME_MAX 255       /* region name length, bytes */
#define SNAP_JOB_MAX 64         /* job name length: [A-Za-z0-9._-], no leading '.' */
#define SNAP_PATH_MAX 256

/* Bytes per element, 0 for an unknown dtype. */
static inline size_t snap_dtype_size(int dtype)
{
	switch (dtype) {
	case SNAP_DTYPE_U8: case SNAP_DTYPE_I8: case SNAP_DTYPE_BOOL: return 1;
	case SNAP_DTYPE_I16: case SNAP_DTYPE_U16: case SNAP_DTYPE_F16: case SNAP_DTYPE_BF16: return 2;
	case SNAP_DTYPE_I32: case SNAP_DTYPE_U32: case SNAP_DTYPE_F32: return 4;
	case SNAP_DTYPE_I64: case SNAP_DTYPE_U64: case SNAP_DTYPE_F64: return 8;
	default: return 0;
	}
}

/* Short lower-case names ("f32", "bf16", "param", ...); "?" when out of range. */
SNAP_API const char *snap_dtype_name(int dtype);
SNAP_API const char *snap_kind_name(int kind);
/* Parse a name back; returns the enum value or SNAP_EINVAL. */
SNAP_API int snap_dtype_parse(const char *name);
SNAP_API int snap_kind_parse(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_TYPES_H */
