/* SPDX-License-Identifier: BSD-3-Clause */
/* The fuzz entry point: inspect and decode untrusted bytes, with an exactly
 * sized output buffer so that any overrun is caught by ASan; single- and
 * multi-threaded decoding, and the detected SIMD level and the scalar
 * reference, must agree. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/codec.h"
#include "codec_impl.h"
#include "fuzz_decode.h"

int snap_fuzz_decode(const uint8_t *data, size_t size, int force_codec)
{
	uint8_t *copy = malloc(size ? size : 1);
	if (!copy)
		return SNAP_ENOMEM;
	if (size)
		memcpy(copy, data, size);
	if (force_codec >= 0 && size >= 32 && copy[5] != force_codec) {
		/* Make the header fit the forced codec, so that the bytes after
		 * it reach that codec's block decoder. */
		copy[5] = (uint8_t)force_codec;
		if (force_codec == SNAP_CODEC_LOSSLESS) {
			memset(copy + 16, 0, 16);
		} else {
			double b = 1e-3;
			memcpy(copy + 16, &b, 8);
			memcpy(copy + 24, &b, 8);
		}
	}
	struct snap_codec_info info;
	int rc = snap_codec_inspect(copy, size, &info);
	if (rc == 0) {
		size_t es = snap_dtype_size(info.dtype);
		size_t bytes = (size_t)info.count * es;
		if (bytes <= ((size_t)64 << 20)) {
			uint8_t *a = malloc(bytes ? bytes : 1), *b = malloc(bytes ? bytes : 1);
			if (a && b) {
				size_t n = 0;
				rc = snap_codec_decompress(copy, size, a, bytes, &n);
				int rc2 = snap_codec_decompress_mt(copy, size, b, bytes, NULL, 3);
				if ((rc == 0) != (rc2 == 0) || (rc == 0 && (n != info.count || memcmp(a, b, bytes)))) {
					fprintf(stderr, "fuzz: single/multi-thread decode disagree (%d vs %d)\n", rc, rc2);
					abort();
				}
				/* The SIMD level's decoders against the scalar reference:
				 * same verdict, same bytes. */
				int level = snapc_isa;
				if (level != SNAPC_ISA_SCALAR) {
					snapc_set_isa(SNAPC_ISA_SCALAR);
					int rc3 = snap_codec_decompress(copy, size, b, bytes, NULL);
					snapc_set_isa(level);
					if ((rc == 0) != (rc3 == 0) || (rc == 0 && memcmp(a, b, bytes))) {
						fprintf(stderr, "fuzz: level %d and scalar decode disagree (%d vs %d)\n",
							level, rc, rc3);
						abort();
					}
				}
			}
			free(a);
			free(b);
		}
	} else {
		/* The decoder must refuse what inspect refused. */
		uint8_t out[64];
		if (snap_codec_decompress(copy, size, out, sizeof(out), NULL) == 0) {
			fprintf(stderr, "fuzz: decode accepted a stream inspect refused\n");
			abort();
		}
	}
	free(copy);
	return rc;
}
