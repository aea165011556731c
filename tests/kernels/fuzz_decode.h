/* SPDX-License-Identifier: BSD-3-Clause */
/* fuzz_decode.h - the fuzz entry point shared by the libFuzzer targets and
 * the random-mutation driver: decode arbitrary bytes as a codec stream. */
#ifndef SNAP_FUZZ_DECODE_H
#define SNAP_FUZZ_DECODE_H
#include <stddef.h>
#include <stdint.h>

/* Decode data as a stream; force_codec >= 0 overwrites the codec byte first
 * so each decoder gets the whole input. Returns the decode result; aborts
 * (a fuzz finding) when single- and multi-threaded decoding, or the detected
 * SIMD level and the scalar level, disagree (verdict or bytes). */
int snap_fuzz_decode(const uint8_t *data, size_t size, int force_codec);
#endif
