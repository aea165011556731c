/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * gpu.h - the device backend: what libsnap.so asks of a GPU, and the table of
 * calls libsnap_cuda.so (libsnap/cuda/backend.cu) exports for it.
 *
 * Why a module loaded at run time: libsnap.so must run on machines with no
 * GPU and no CUDA toolkit. The backend carries the CUDA runtime (statically
 * linked) and the codec kernels, and needs only the driver (libcuda.so.1);
 * libsnap.so dlopens it the first time a region says SNAP_DEVICE_CUDA. A
 * machine without it, or without a driver or device, gets an error naming
 * the region, never a crash.
 *
 * One backend state (struct snap_gpu) per context and device. It owns one
 * non-blocking copy stream, an event per chunk of the current save, a "done"
 * event, device scratch for the compressor and a few restore lanes. Calls
 * may come from any copy thread; the backend serialises what must be.
 * Not installed.
 */
#ifndef SNAP_GPU_H
#define SNAP_GPU_H

#include <stddef.h>
#include <stdint.h>

#include "snap/codec.h"

#define SNAP_GPU_ABI 1
#define SNAP_GPU_SYMBOL "snap_gpu_backend_v1"
#define SNAP_GPU_MODULE "libsnap_cuda.so"

struct snap_gpu;

struct snap_gpu_ops {
	uint32_t abi;           /* SNAP_GPU_ABI */
	uint32_t size;          /* sizeof(struct snap_gpu_ops) */
	/* Is [ptr, ptr + bytes) memory of one CUDA device? 0 and *device, or
	 * SNAP_EINVAL (host or unknown memory) / SNAP_EUNSUPPORTED (no driver
	 * or device); err says which. */
	int (*probe)(const void *ptr, uint64_t bytes, int *device, char *err, size_t errlen);
	int (*open)(struct snap_gpu **g, int device, char *err, size_t errlen);
	void (*close)(struct snap_gpu *g);
	/* Page-lock [base, base + len) (a mapped slot) for DMA, once per mapping. */
	int (*pin)(struct snap_gpu *g, void *base, uint64_t len, char *err, size_t errlen);
	void (*unpin)(struct snap_gpu *g, void *base, uint64_t len);
	uint64_t (*pinned_bytes)(const struct snap_gpu *g);

	/* Save. begin orders the copy stream after `stream` (a cudaStream_t,
	 * NULL the legacy default stream) and sizes the per-chunk events. Then,
	 * in chunk order, copy (D2H into pinned dst) or compress (kernels read
	 * src on the device and write the frame into pinned dst, its length
	 * into the backend's pinned table) enqueue chunk i and record its
	 * event; end records the done event. wait blocks until chunk i landed;
	 * frame_len reads a compressed chunk's length after wait. */
	int (*save_begin)(struct snap_gpu *g, void *stream, uint32_t nchunks, char *err, size_t errlen);
	int (*copy)(struct snap_gpu *g, uint32_t i, void *dst, const void *src, uint64_t n, char *err, size_t errlen);
	int (*compress)(struct snap_gpu *g, uint32_t i, const struct snap_codec_params *p, const void *src,
			uint64_t count, void *dst, uint64_t cap, char *err, size_t errlen);
	int (*save_end)(struct snap_gpu *g, char *err, size_t errlen);
	int (*wait)(struct snap_gpu *g, uint32_t i, char *err, size_t errlen);
	uint64_t (*frame_len)(const struct snap_gpu *g, uint32_t i);
	/* The fence: `stream` waits (on the GPU) for the done event; with
	 * host != 0 the calling thread waits instead. */
	int (*fence)(struct snap_gpu *g, void *stream, int host, char *err, size_t errlen);

	/* Restore, synchronous, callable from several threads at once: raw bytes
	 * host -> device, or a frame (host memory, validated by the caller's CRC
	 * and header checks) decoded on the device into dst. */
	int (*h2d)(struct snap_gpu *g, void *dst, const void *src, uint64_t n, char *err, size_t errlen);
	int (*decode)(struct snap_gpu *g, const void *frame, uint64_t len, void *dst, uint64_t cap, char *err,
		      size_t errlen);
};

/* What the module exports under SNAP_GPU_SYMBOL. */
typedef const struct snap_gpu_ops *(*snap_gpu_entry_fn)(void);

/*
 * Load the backend once per process: $SNAP_CUDA_MODULE if set, else
 * libsnap_cuda.so beside libsnap.so, else the loader's search path. Returns
 * the table, or NULL with err saying why (module absent, no symbol, ABI).
 */
const struct snap_gpu_ops *snap_gpu_load(char *err, size_t errlen);

#endif
