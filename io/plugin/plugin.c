/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libh5z_snapcodec.so: HDF5 dynamic filter plugin for libsnap codec frames
 * (filter SNAP_IO_FILTER_CODEC). Point HDF5_PLUGIN_PATH at the directory
 * holding it and h5py, h5dump or any HDF5 1.10+ reader decodes frame
 * datasets. The filter itself is io/src/codecfilter.c, shared with snapio.
 */
#include <H5PLextern.h>

#include "codecfilter.h"

H5PL_type_t H5PLget_plugin_type(void)
{
	return H5PL_TYPE_FILTER;
}

const void *H5PLget_plugin_info(void)
{
	return &io_codec_filter_class;
}
