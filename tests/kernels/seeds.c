/* SPDX-License-Identifier: BSD-3-Clause */
/* Seed streams: 3 dtypes x {lossless, lossy abs, lossy rel, lossy with
 * outliers}, a few hundred values over two or three 256-value blocks. */
#include "snap/codec.h"
#include "seeds.h"
#include "codec_testutil.h"

size_t seed_stream(int i, uint8_t *buf, size_t cap)
{
	static const int dts[] = { SNAP_DTYPE_F32, SNAP_DTYPE_BF16, SNAP_DTYPE_F16 };
	static const int codecs[] = { SNAP_CODEC_LOSSLESS, SNAP_CODEC_LOSSY_ABS,
				      SNAP_CODEC_LOSSY_REL, SNAP_CODEC_LOSSY_ABS };
	int dt = dts[i % 3], kind = (i / 3) % 4;
	size_t n = 300 + 70 * (size_t)kind;
	float f[600];
	uint8_t in[600 * 4];
	uint64_t save = tu_rng;
	tu_rng = 0x1234567ull + (uint64_t)i;
	tu_gen(kind == 3 ? GEN_MIXED : GEN_GAUSS, f, n);
	tu_rng = save;
	snap_codec_convert(dt, in, SNAP_DTYPE_F32, f, n);
	struct snap_codec_params p = { codecs[kind], dt, kind == 2 ? 1e-2 : 1e-3, 256 };
	size_t len = 0;
	if (snap_codec_compress(&p, in, n, buf, cap, &len))
		return 0;
	return len;
}
