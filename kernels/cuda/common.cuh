/* SPDX-License-Identifier: BSD-3-Clause */
/* common.cuh - what the CUDA twin's kernels share. */
#ifndef SNAP_CUDA_COMMON_CUH
#define SNAP_CUDA_COMMON_CUH

#include <stdint.h>

#include "codec_core.h"
#include "snap/codec.h"

#define SNAPK_MAXCHUNK (SNAP_CODEC_BLOCK_MAX / SNAPC_GROUP)
#define SNAPK_THREADS 128     /* decoder threads per block */
#define SNAPK_ENC_MAX 512     /* encoder threads per block: one per 32-value chunk */

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

/*
 * The encoders work on a block staged in shared memory and build its
 * frame there too, so global memory sees only coalesced reads of the input
 * and coalesced writes of the frame (the first version read and wrote
 * bytes one thread per 32-value chunk, 32 cache lines per warp access).
 *
 * Staging: element i of the block, widened to 32 bits, at word
 * i + i / 32, so the 32 lanes of a warp reading "their" chunk's j-th value
 * (words 33c + j) hit 32 different banks.
 */
__host__ __device__ static __forceinline__ uint32_t snapk_si(uint32_t i)
{
	return i + (i >> 5);
}

/* The frame under construction is a zeroed array of little-endian words,
 * so a bit field is ORed in at its bit position; atomics because fields
 * of neighbouring threads share boundary words. v < 2^w, w <= 32. */
__device__ static __forceinline__ void snapk_or(uint32_t *o, uint64_t bit, uint32_t v, uint32_t w)
{
	if (!v)
		return;
	uint32_t wi = (uint32_t)(bit >> 5), sh = (uint32_t)bit & 31;
	atomicOr(&o[wi], v << sh);
	if (sh && sh + w > 32)
		atomicOr(&o[wi + 1], v >> (32 - sh));
}

/* Streams values of w bits LSB first from bit position pos, a word at a
 * time (the same bits snapc_pack32 lays down as bytes). */
struct snapk_bw {
	uint64_t pos, acc;
	uint32_t nb;
};

__device__ static __forceinline__ void snapk_put(uint32_t *o, struct snapk_bw *b, uint32_t v, uint32_t w)
{
	b->acc |= (uint64_t)v << b->nb;
	b->nb += w;
	if (b->nb >= 32) {
		snapk_or(o, b->pos, (uint32_t)b->acc, 32);
		b->pos += 32;
		b->acc >>= 32;
		b->nb -= 32;
	}
}

__device__ static __forceinline__ void snapk_flush(uint32_t *o, struct snapk_bw *b)
{
	if (b->nb)
		snapk_or(o, b->pos, (uint32_t)b->acc, b->nb);
}

/* Exclusive prefix sum over the block's threads (blockDim.x a multiple of
 * 32, at most 1024); every thread gets its offset and the total. tmp: 32
 * words of shared memory, reusable once this returns. */
__device__ static uint32_t snapk_exscan(uint32_t v, uint32_t *tmp, uint32_t *total)
{
	const uint32_t lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
	uint32_t x = v;
	for (uint32_t d = 1; d < 32; d <<= 1) {
		uint32_t y = __shfl_up_sync(0xffffffffu, x, d);
		if (lane >= d)
			x += y;
	}
	if (lane == 31)
		tmp[w] = x;
	__syncthreads();
	if (w == 0) {
		uint32_t t = lane < nw ? tmp[lane] : 0;
		for (uint32_t d = 1; d < 32; d <<= 1) {
			uint32_t y = __shfl_up_sync(0xffffffffu, t, d);
			if (lane >= d)
				t += y;
		}
		tmp[lane] = t;
	}
	__syncthreads();
	uint32_t ex = x - v + (w ? tmp[w - 1] : 0);
	*total = tmp[nw - 1];
	__syncthreads();
	return ex;
}

#endif
