/* SPDX-License-Identifier: BSD-3-Clause */
/* common.cuh - what the CUDA twin's kernels share. */
#ifndef SNAP_CUDA_COMMON_CUH
#define SNAP_CUDA_COMMON_CUH

#include <stdint.h>

#include "codec_core.h"
#include "snap/codec.h"

#define SNAPK_MAXCHUNK (SNAP_CODEC_BLOCK_MAX / SNAPC_GROUP)
#define SNAPK_THREADS 128

/* First error wins; later ones are dropped. */
__device__ static void snapk_fail(int *status, int err)
{
	atomicCAS(status, 0, err);
}

/* In-place exclusive prefix sum of a[0..n) by the one calling thread (the
 * others wait at a barrier); returns the total. */
__device__ static uint32_t snapk_exscan1(uint32_t *a, uint32_t n)
{
	uint32_t acc = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint32_t v = a[i];
		a[i] = acc;
		acc += v;
	}
	return acc;
}

#endif
