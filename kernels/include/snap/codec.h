/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/codec.h - float codecs for checkpoint tensors (f32, bf16, f16).
 *
 * Two codecs share one self-describing stream format (docs/codec-format.md):
 *
 *   SNAP_CODEC_LOSSLESS   bit-exact. Each value is split into its exponent
 *                         and its sign+mantissa bits; the exponents of a block
 *                         are coded with a small per-block table of the most
 *                         frequent exponents (k-bit fixed-length codes plus
 *                         escapes), the sign+mantissa bits are stored packed.
 *   SNAP_CODEC_LOSSY_ABS  every decoded value x' satisfies |x - x'| <= bound
 *                         (checked by the encoder on the value as decoded in
 *                         the target dtype); NaN, +-Inf and any value that
 *                         cannot be quantized within the bound are stored
 *                         exactly as outliers.
 *   SNAP_CODEC_LOSSY_REL  as LOSSY_ABS with bound = rel * (max - min) over the
 *                         finite values of the tensor. When that bound
 *                         degenerates (constant or all non-finite tensor), the
 *                         stream is written LOSSLESS instead; the decoder
 *                         reads the codec from the stream.
 *
 * Data is cut into independent blocks of block_elems values; blocks are the
 * unit of parallelism on the CPU (the *_mt calls) and on the GPU (the
 * snap_codec_cuda_* calls, built only when nvcc was found). The CUDA kernels
 * produce byte-identical streams to the C code here, so either side decodes
 * what the other wrote.
 *
 * Every call returns 0 on success or a negative code from snap/error.h.
 * No call allocates heap memory except the *_mt helpers, which start and join
 * their threads (each thread's stack) inside the call. Decoding never reads
 * beyond src_len bytes nor writes beyond dst_cap bytes, whatever the input.
 * Values are little-endian in memory; f16 is IEEE binary16, bf16 the upper
 * half of an IEEE binary32.
 */
#ifndef SNAP_CODEC_H
#define SNAP_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "snap/error.h"
#include "snap/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SNAP_CODEC_VERSION 1
#define SNAP_CODEC_HEADER_BYTES 48
#define SNAP_CODEC_BLOCK_DEFAULT 4096u
#define SNAP_CODEC_BLOCK_MIN 256u
#define SNAP_CODEC_BLOCK_MAX 16384u /* 2^14 */

/* What to produce. dtype: SNAP_DTYPE_F32, _BF16 or _F16. codec: one of the
 * SNAP_CODEC_LOSSLESS/_LOSSY_ABS/_LOSSY_REL ids of snap/types.h. bound: the
 * absolute bound (ABS, > 0) or the relative factor (REL, > 0); ignored for
 * LOSSLESS. block_elems: 0 for SNAP_CODEC_BLOCK_DEFAULT, otherwise a power of
 * two in [SNAP_CODEC_BLOCK_MIN, SNAP_CODEC_BLOCK_MAX]. */
struct snap_codec_params {
	int codec;
	int dtype;
	double bound;
	uint32_t block_elems;
};

/* What a stream header says, as returned by snap_codec_inspect(). */
struct snap_codec_info {
	int version;
	int codec;            /* as written; LOSSY_* streams decode alike */
	int dtype;
	uint32_t block_elems;
	uint64_t count;       /* values */
	double bound;         /* absolute bound the encoder enforced; 0 if lossless */
	double param;         /* the caller's bound or relative factor; 0 if lossless */
	uint32_t nblocks;
	uint64_t stream_len;  /* header + block table + payload, in bytes */
};

/* Validate params. Returns 0, SNAP_EINVAL (bad codec/dtype/block size) or
 * SNAP_ERANGE: the bound (ABS) or factor (REL) is not positive or not below
 * 1e300, or an ABS bound is too small for a float quantization step (2*bound
 * under the smallest normal float, ~1.18e-38). Large ABS bounds up to 1e300
 * are accepted: the step is capped at FLT_MAX. */
int snap_codec_check(const struct snap_codec_params *p);

/* Worst-case stream size in bytes for count values under p: a destination of
 * this size never overflows. 0 when p is invalid or the size overflows. */
size_t snap_codec_bound(const struct snap_codec_params *p, size_t count);

/* Compress count values at src (any alignment) into dst. *out_len receives
 * the stream length. Returns SNAP_EOVERFLOW when dst_cap is too small (a
 * dst_cap of snap_codec_bound() always suffices). */
int snap_codec_compress(const struct snap_codec_params *p, const void *src,
			size_t count, void *dst, size_t dst_cap,
			size_t *out_len);

/* As snap_codec_compress() on nthreads threads (0 or 1: the calling thread
 * only). Blocks go to threads in contiguous ranges, each written at its
 * worst-case offset and then moved down, so dst_cap must be at least
 * snap_codec_bound() (else SNAP_EOVERFLOW). The stream is byte-identical to
 * the single-threaded one. A thread that cannot be started leaves its share
 * to the calling thread. */
int snap_codec_compress_mt(const struct snap_codec_params *p, const void *src,
			   size_t count, void *dst, size_t dst_cap,
			   size_t *out_len, unsigned nthreads);

/* Parse and validate the header and block table of a stream. Returns
 * SNAP_ETRUNC if src_len is shorter than the header, the table or the
 * payload it announces; SNAP_EFORMAT for a bad magic, version, codec, dtype
 * or block size; SNAP_ECORRUPT for inconsistent fields. */
int snap_codec_inspect(const void *src, size_t src_len,
		       struct snap_codec_info *info);

/* Decode a stream into dst (dst_cap bytes, any alignment). *count_out (may be
 * NULL) receives the value count. SNAP_EOVERFLOW if dst_cap < count * size of
 * the dtype; the errors of snap_codec_inspect(); SNAP_ECORRUPT for a block
 * whose contents do not parse. On error dst may hold partial output. */
int snap_codec_decompress(const void *src, size_t src_len, void *dst,
			  size_t dst_cap, size_t *count_out);

/* As snap_codec_decompress() on nthreads threads. */
int snap_codec_decompress_mt(const void *src, size_t src_len, void *dst,
			     size_t dst_cap, size_t *count_out,
			     unsigned nthreads);

/* Convert count values between SNAP_DTYPE_F32, _BF16 and _F16 with IEEE
 * round-to-nearest-even (NaN stays NaN, quiet). Same rounding as the codecs
 * use. src and dst must not overlap. */
int snap_codec_convert(int dst_dtype, void *dst, int src_dtype,
		       const void *src, size_t count);

/*
 * GPU (snapkernels_cuda only; SNAP_EUNSUPPORTED is never returned by a build
 * that has them, and the symbols are absent otherwise). All pointers named
 * d_* are device memory; stream is a cudaStream_t (NULL: the default stream).
 * Calls only enqueue work: results are valid once the stream has completed.
 * No call allocates; scratch is provided by the caller.
 */

/* Device scratch bytes snap_codec_cuda_compress() needs for count values. */
size_t snap_codec_cuda_scratch_size(const struct snap_codec_params *p,
				    size_t count);

/* Enqueue compression of count values at d_src into d_dst, which must hold
 * snap_codec_bound() bytes (checked here, SNAP_EOVERFLOW). The stream length
 * is written as a uint64_t to *d_out_len. Returns SNAP_EIO if a launch
 * fails. */
int snap_codec_cuda_compress(const struct snap_codec_params *p,
			     const void *d_src, size_t count, void *d_dst,
			     size_t dst_cap, void *d_scratch,
			     size_t scratch_len, uint64_t *d_out_len,
			     void *stream);

/* Device scratch bytes snap_codec_cuda_decompress() needs for a stream. */
size_t snap_codec_cuda_decode_scratch_size(const struct snap_codec_info *info);

/* Enqueue decoding of the stream at d_src, whose header the caller has read
 * and validated on the host with snap_codec_inspect() into *info (copy the
 * first SNAP_CODEC_HEADER_BYTES + 4 * nblocks bytes, or the whole stream, to
 * the host for that; the size of the grid comes from it). The kernels
 * re-check the device copy against *info and every block; *d_status (device
 * int) receives 0 or a negative SNAP_E* code. dst_cap must hold count values
 * (SNAP_EOVERFLOW). */
int snap_codec_cuda_decompress(const struct snap_codec_info *info,
			       const void *d_src, size_t src_len, void *d_dst,
			       size_t dst_cap, void *d_scratch,
			       size_t scratch_len, int *d_status,
			       void *stream);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_CODEC_H */
