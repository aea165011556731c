/* SPDX-License-Identifier: BSD-3-Clause */
/* libFuzzer target: the lossy decoder. */
#include "fuzz_decode.h"
#include "snap/types.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	snap_fuzz_decode(data, size, SNAP_CODEC_LOSSY_ABS);
	return 0;
}
