/* SPDX-License-Identifier: BSD-3-Clause */
/* snap_strerror and the dtype/kind name tables. */
#include <string.h>

#include "snap/error.h"
#include "snap/types.h"

const char *snap_strerror(int err)
{
	switch (err) {
	case SNAP_OK: return "success";
	case SNAP_EINVAL: return "invalid argument";
	case SNAP_ENOMEM: return "out of memory";
	case SNAP_EIO: return "I/O error";
	case SNAP_ENOENT: return "not found";
	case SNAP_ECORRUPT: return "checksum mismatch: data is corrupt or torn";
	case SNAP_EPROTO: return "protocol error";
	case SNAP_ESMP: return "snapshot daemon (snapsmp) unreachable";
	case SNAP_EBUSY: return "busy: slot, rank or store in use";
	case SNAP_EUNFENCED: return "previous snapshot not fenced (call snap_fence first)";
	case SNAP_ENOSPC: return "memory budget or store space exhausted";
	case SNAP_EMISMATCH: return "registered regions do not match the snapshot";
	case SNAP_EPERM: return "permission denied";
	case SNAP_ESTATE: return "operation not valid in the current state";
	case SNAP_ETIMEDOUT: return "timed out";
	case SNAP_EFORMAT: return "unknown format or version";
	case SNAP_EUNSUPPORTED: return "not supported by this build";
	case SNAP_ETRUNC: return "truncated input";
	case SNAP_EOVERFLOW: return "output buffer too small";
	case SNAP_ERANGE: return "value out of range";
	case SNAP_ELOST: return "data lost: more failures than the redundancy covers";
	default: return "unknown error";
	}
}

static const char *const dtype_names[SNAP_DTYPE_COUNT_] = {
	[SNAP_DTYPE_U8] = "u8", [SNAP_DTYPE_I8] = "i8", [SNAP_DTYPE_I16] = "i16",
	[SNAP_DTYPE_I32] = "i32", [SNAP_DTYPE_I64] = "i64", [SNAP_DTYPE_F16] = "f16",
	[SNAP_DTYPE_BF16] = "bf16", [SNAP_DTYPE_F32] = "f32", [SNAP_DTYPE_F64] = "f64",
	[SNAP_DTYPE_U16] = "u16", [SNAP_DTYPE_U32] = "u32", [SNAP_DTYPE_U64] = "u64",
	[SNAP_DTYPE_BOOL] = "bool",
};

static const char *const kind_names[SNAP_KIND_COUNT_] = {
	[SNAP_KIND_PARAM] = "param", [SNAP_KIND_OPTIM] = "optim",
	[SNAP_KIND_RNG] = "rng", [SNAP_KIND_OTHER] = "other",
};

const char *snap_dtype_name(int dtype)
{
	return dtype >= 0 && dtype < SNAP_DTYPE_COUNT_ ? dtype_names[dtype] : "?";
}

const char *snap_kind_name(int kind)
{
	return kind >= 0 && kind < SNAP_KIND_COUNT_ ? kind_names[kind] : "?";
}

int snap_dtype_parse(const char *name)
{
	for (int i = 0; name && i < SNAP_DTYPE_COUNT_; i++)
		if (strcmp(name, dtype_names[i]) == 0)
			return i;
	return SNAP_EINVAL;
}

int snap_kind_parse(const char *name)
{
	for (int i = 0; name && i < SNAP_KIND_COUNT_; i++)
		if (strcmp(name, kind_names[i]) == 0)
			return i;
	return SNAP_EINVAL;
}
