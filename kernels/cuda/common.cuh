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

#endif
