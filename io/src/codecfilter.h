/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codecfilter.h - the HDF5 filter that decodes snap/codec.h frames (filter
 * id SNAP_IO_FILTER_CODEC, unregistered range). One source, two users:
 * snapio registers it in-process (H5Zregister) so HDF5 lets it create
 * datasets with the filter as mandatory, and io/plugin builds it into
 * libh5z_snapcodec.so for h5py, h5dump and any other HDF5 reader.
 *
 * cd_values (SNAP_IO_CODEC_CD_N of them):
 *   [0] SNAP_IO_CODEC_CD_VERSION (1)
 *   [1] dtype, the enum snap_dtype id (f32 7, f16 5, bf16 6)
 *   [2] values per chunk, low 32 bits
 *   [3] values per chunk, high 32 bits
 *
 * Decoding turns one chunk (one codec stream) into values per chunk x dtype
 * size bytes, zero-padding a stream with fewer values (the short last frame:
 * HDF5 hands edge chunks over as full chunks). A stream whose header does not
 * parse, names another dtype, or holds no or too many values is an error.
 * Encoding is refused: frames are only ever written pre-compressed, with
 * H5Dwrite_chunk.
 */
#ifndef SNAP_IO_CODECFILTER_H
#define SNAP_IO_CODECFILTER_H

#include <hdf5.h>

#define SNAP_IO_CODEC_CD_N 4
#define SNAP_IO_CODEC_CD_VERSION 1

extern const H5Z_class2_t io_codec_filter_class;

#endif
