/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * HDF5 attributes, both directions, and the file type of each dtype: the
 * lowest HDF5 layer, shared by the rank-file writer and reader, frames and
 * export, so none of them calls another for these.
 */
#include <string.h>

#include "io_int.h"

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

/* One numeric attribute of file type ft, read from buf as mt: a scalar
 * (scalar != 0) or an array of n values (n may be 0: an empty array). */
static int attr_num(hid_t obj, const char *name, hid_t ft, hid_t mt, const void *buf, size_t n, int scalar)
{
	hsize_t dims[1] = {n};
	hid_t s = scalar ? H5Screate(H5S_SCALAR) : H5Screate_simple(1, dims, NULL), a = -1;
	int rc = -1;
	if (s >= 0 && (a = H5Acreate2(obj, name, ft, s, H5P_DEFAULT, H5P_DEFAULT)) >= 0 && H5Awrite(a, mt, buf) >= 0)
		rc = 0;
	if (a >= 0) H5Aclose(a);
	if (s >= 0) H5Sclose(s);
	return rc;
}

int io_attr_u64(hid_t obj, const char *name, const uint64_t *v, size_t n)
{
	return attr_num(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, v, n, 0);
}

int io_attr_u32(hid_t obj, const char *name, uint32_t v)
{
	return attr_num(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, &v, 1, 1);
}

int io_attr_u32s(hid_t obj, const char *name, const uint32_t *v, size_t n)
{
	return attr_num(obj, name, H5T_STD_U32LE, H5T_NATIVE_UINT32, v, n, 0);
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

int io_get_attr_str(hid_t obj, const char *name, char *out, size_t cap)
{
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT), t = -1, mt = -1;
	int rc = -1;
	if (a < 0)
		return -1;
	t = H5Aget_type(a);
	size_t sz = t >= 0 ? H5Tget_size(t) : 0;
	if (t >= 0 && H5Tget_class(t) == H5T_STRING && !H5Tis_variable_str(t) && sz > 0 && sz < cap) {
		mt = H5Tcopy(H5T_C_S1);
		if (mt >= 0 && H5Tset_size(mt, sz) >= 0 && H5Aread(a, mt, out) >= 0) {
			out[sz] = '\0';
			rc = 0;
		}
	}
	if (mt >= 0) H5Tclose(mt);
	if (t >= 0) H5Tclose(t);
	H5Aclose(a);
	return rc;
}

int io_get_attr_u64(hid_t obj, const char *name, uint64_t *v, size_t max, size_t *n)
{
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT), s = -1;
	int rc = -1;
	if (a < 0)
		return -1;
	s = H5Aget_space(a);
	hssize_t k = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
	if (k >= 1 && (size_t)k <= max && H5Aread(a, H5T_NATIVE_UINT64, v) >= 0) {
		if (n)
			*n = (size_t)k;
		rc = 0;
	}
	if (s >= 0) H5Sclose(s);
	H5Aclose(a);
	return rc;
}

int io_get_attr_u32s(hid_t obj, const char *name, uint32_t *v, size_t n)
{
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT), s = -1;
	int rc = -1;
	if (a < 0)
		return -1;
	s = H5Aget_space(a);
	hssize_t k = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
	if (k >= 0 && (size_t)k == n && H5Aread(a, H5T_NATIVE_UINT32, v) >= 0)
		rc = 0;
	if (s >= 0) H5Sclose(s);
	H5Aclose(a);
	return rc;
}

int64_t io_attr_npoints(hid_t obj, const char *name)
{
	if (H5Aexists(obj, name) <= 0)
		return -1;
	hid_t a = H5Aopen(obj, name, H5P_DEFAULT), s = a >= 0 ? H5Aget_space(a) : -1;
	hssize_t k = s >= 0 ? H5Sget_simple_extent_npoints(s) : -1;
	if (s >= 0) H5Sclose(s);
	if (a >= 0) H5Aclose(a);
	return k;
}
