/* SPDX-License-Identifier: BSD-3-Clause */
/* The HDF5 filter of codec frames (see codecfilter.h); no snapio state. */
#include <stdint.h>
#include <string.h>

#include "snap/codec.h"
#include "snap/io.h"

#include "codecfilter.h"

static size_t codec_filter(unsigned flags, size_t cd_nelmts, const unsigned cd_values[], size_t nbytes,
			   size_t *buf_size, void **buf)
{
	if (!(flags & H5Z_FLAG_REVERSE) || cd_nelmts < SNAP_IO_CODEC_CD_N || cd_values[0] != SNAP_IO_CODEC_CD_VERSION)
		return 0; /* encoding refused; an unknown layout is not guessed at */
	int dtype = (int)cd_values[1];
	if (dtype != SNAP_DTYPE_F32 && dtype != SNAP_DTYPE_BF16 && dtype != SNAP_DTYPE_F16)
		return 0;
	size_t es = snap_dtype_size(dtype);
	uint64_t elems = (uint64_t)cd_values[2] | (uint64_t)cd_values[3] << 32;
	if (elems == 0 || elems > SIZE_MAX / es)
		return 0;
	struct snap_codec_info in;
	if (snap_codec_inspect(*buf, nbytes, &in) != 0 || in.dtype != dtype || in.count == 0 || in.count > elems)
		return 0;
	size_t out_bytes = (size_t)elems * es;
	unsigned char *out = H5allocate_memory(out_bytes, 0);
	if (!out)
		return 0;
	size_t got = 0;
	if (snap_codec_decompress(*buf, nbytes, out, out_bytes, &got) != 0 || got != in.count) {
		H5free_memory(out);
		return 0;
	}
	memset(out + got * es, 0, out_bytes - got * es);
	H5free_memory(*buf);
	*buf = out;
	*buf_size = out_bytes;
	return out_bytes;
}

const H5Z_class2_t io_codec_filter_class = {
	.version = H5Z_CLASS_T_VERS,
	.id = SNAP_IO_FILTER_CODEC,
	/* HDF5 creates a dataset only with filters that say they encode; this
	 * one says so and then refuses (returns 0) if ever asked to. */
	.encoder_present = 1,
	.decoder_present = 1,
	.name = "snap codec frames (libsnap snap/codec.h streams, decode only)",
	.can_apply = NULL,
	.set_local = NULL,
	.filter = codec_filter,
};
