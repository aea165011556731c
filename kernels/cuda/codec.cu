/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codec.cu - CUDA twin of src/codec.c: stream framing on the GPU.
 *
 * Compress: (REL only) per-block min/max and a one-thread parameter kernel;
 * one thread block per stream block encodes into a worst-case slot in
 * scratch and records its size; a single-block scan turns sizes into the
 * block table, header and offsets; a copy kernel packs the slots into the
 * stream. Decompress: a scan kernel re-validates the header and table and
 * computes offsets; one thread block per stream block decodes.
 * Nothing here allocates; all launches go on the caller's stream.
 */
#include <cuda_runtime.h>

#include "common.cuh"
#include "lossless.cuh"
#include "lossy.cuh"

/* Parameters the device decides (REL bound, LOSSLESS fallback). */
struct snapk_params {
	int codec;
	int pad;
	struct snapc_lyq q;
	double param;
};

struct snapk_layout {
	size_t params, lohi, sizes, offs, slots, total, full;
};

static int layout_of(const struct snap_codec_params *p, size_t count,
		     struct snapk_layout *L, uint32_t *nb, struct snapc_dt *dt,
		     uint32_t *log2B)
{
	if (snap_codec_check(p) || snapc_dt_of(p->dtype, dt))
		return SNAP_EINVAL;
	uint32_t B = p->block_elems ? p->block_elems : SNAP_CODEC_BLOCK_DEFAULT;
	*log2B = snapc_bits(B) - 1;
	uint64_t n = (count + B - 1) / B;
	if (n > UINT32_MAX)
		return SNAP_EINVAL;
	*nb = (uint32_t)n;
	L->full = SNAPC_BLOCK_SLACK + (size_t)B * dt->esize;
	L->params = 0;
	L->lohi = 256;
	L->sizes = L->lohi + ((8 * n + 255) & ~(size_t)255);
	L->offs = L->sizes + ((4 * n + 255) & ~(size_t)255);
	L->slots = L->offs + ((8 * n + 255) & ~(size_t)255);
	L->total = L->slots + n * L->full;
	return 0;
}

extern "C" size_t snap_codec_cuda_scratch_size(const struct snap_codec_params *p,
					       size_t count)
{
	struct snapk_layout L;
	struct snapc_dt dt;
	uint32_t nb, l2;
	return layout_of(p, count, &L, &nb, &dt, &l2) ? 0 : L.total;
}

__global__ static void k_range(const uint8_t *src, uint64_t count, uint32_t log2B,
			       struct snapc_dt dt, float *lohi)
{
	__shared__ float slo[256], shi[256];
	__shared__ int sany[256];
	uint64_t i0 = (uint64_t)blockIdx.x << log2B, i1 = min(count, i0 + ((uint64_t)1 << log2B));
	float lo = 0, hi = 0;
	int any = 0;
	for (uint64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
		float x = snapc_to_f32(snapc_ldel(src, i, dt.esize), dt.esize, dt.E);
		if (!(fabsf(x) <= 3.40282347e38f))
			continue;
		if (!any) { lo = hi = x; any = 1; }
		lo = fminf(lo, x);
		hi = fmaxf(hi, x);
	}
	slo[threadIdx.x] = lo; shi[threadIdx.x] = hi; sany[threadIdx.x] = any;
	__syncthreads();
	if (threadIdx.x == 0) {
		int a = 0;
		for (uint32_t t = 0; t < blockDim.x; t++) {
			if (!sany[t]) continue;
			if (!a) { lo = slo[t]; hi = shi[t]; a = 1; }
			lo = fminf(lo, slo[t]);
			hi = fmaxf(hi, shi[t]);
		}
		lohi[2 * blockIdx.x] = a ? lo : NAN;
		lohi[2 * blockIdx.x + 1] = hi;
	}
}

/* The codec and quantizer, decided as plan_compress() does on the host. */
__global__ static void k_params(int codec, double bound, const float *lohi,
				uint32_t nb, struct snapk_params *P)
{
	struct snapk_params p;
	memset(&p, 0, sizeof(p));
	p.codec = codec;
	if (codec == SNAP_CODEC_LOSSY_ABS) {
		p.q.bound = p.param = bound;
	} else if (codec == SNAP_CODEC_LOSSY_REL) {
		float lo = 0, hi = 0;
		int any = 0;
		for (uint32_t b = 0; b < nb; b++) {
			float l = lohi[2 * b], h = lohi[2 * b + 1];
			if (l != l) continue;
			if (!any) { lo = l; hi = h; any = 1; }
			lo = fminf(lo, l);
			hi = fmaxf(hi, h);
		}
		p.q.bound = bound * ((double)hi - (double)lo);
		p.param = bound;
	}
	if (p.codec != SNAP_CODEC_LOSSLESS) {
		double b = p.q.bound;
		if (snapc_step(b, &p.q))
			p.codec = SNAP_CODEC_LOSSLESS;
	}
	if (p.codec == SNAP_CODEC_LOSSLESS) {
		memset(&p.q, 0, sizeof(p.q));
		p.param = 0;
	}
	*P = p;
}

__global__ static void __launch_bounds__(SNAPK_THREADS)
k_encode(const uint8_t *src, uint64_t count, uint32_t log2B, struct snapc_dt dt,
	 const struct snapk_params *P, uint8_t *slots, size_t full, uint32_t *sizes)
{
	uint32_t b = blockIdx.x;
	uint64_t i0 = (uint64_t)b << log2B;
	uint32_t n = (uint32_t)min(count - i0, (uint64_t)1 << log2B);
	const uint8_t *s = src + i0 * dt.esize;
	uint8_t *out = slots + (size_t)b * full;
	if (P->codec == SNAP_CODEC_LOSSLESS) {
		ll_encode_block(s, n, dt, out, &sizes[b]);
	} else {
		struct snapc_lyq q = P->q;
		ly_encode_block(s, n, dt, &q, out, &sizes[b]);
	}
}

/* Exclusive scan of the block sizes; writes table, header and length. */
__global__ static void k_frame(const uint32_t *sizes, uint32_t nb, uint64_t *offs,
			       uint8_t *dst, const struct snapk_params *P, int dtype,
			       uint32_t log2B, uint64_t count, uint64_t *out_len)
{
	__shared__ uint64_t sc[1024];
	__shared__ uint64_t carry;
	uint32_t t = threadIdx.x;
	if (t == 0)
		carry = 0;
	__syncthreads();
	for (uint32_t b0 = 0; b0 < nb; b0 += blockDim.x) {
		uint32_t b = b0 + t;
		uint64_t v = b < nb ? sizes[b] : 0;
		sc[t] = v;
		__syncthreads();
		for (uint32_t d = 1; d < blockDim.x; d <<= 1) {
			uint64_t add = t >= d ? sc[t - d] : 0;
			__syncthreads();
			sc[t] += add;
			__syncthreads();
		}
		if (b < nb) {
			offs[b] = carry + sc[t] - v;
			snapc_st32(dst + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b, (uint32_t)v);
		}
		__syncthreads();
		if (t == blockDim.x - 1)
			carry += sc[t];
		__syncthreads();
	}
	if (t == 0) {
		uint64_t u;
		snapc_st32(dst, SNAPC_MAGIC);
		dst[4] = SNAP_CODEC_VERSION;
		dst[5] = (uint8_t)P->codec;
		dst[6] = (uint8_t)dtype;
		dst[7] = (uint8_t)log2B;
		snapc_st64(dst + 8, count);
		memcpy(&u, &P->q.bound, 8);
		snapc_st64(dst + 16, u);
		memcpy(&u, &P->param, 8);
		snapc_st64(dst + 24, u);
		snapc_st64(dst + 32, carry);
		snapc_st32(dst + 40, nb);
		snapc_st32(dst + 44, 0);
		*out_len = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)nb + carry;
	}
}

__global__ static void k_gather(const uint8_t *slots, size_t full, const uint32_t *sizes,
				const uint64_t *offs, uint8_t *dst, uint64_t H)
{
	uint32_t b = blockIdx.x;
	const uint8_t *s = slots + (size_t)b * full;
	uint8_t *d = dst + H + offs[b];
	for (uint32_t i = threadIdx.x; i < sizes[b]; i += blockDim.x)
		d[i] = s[i];
}

extern "C" int snap_codec_cuda_compress(const struct snap_codec_params *p,
					const void *d_src, size_t count, void *d_dst,
					size_t dst_cap, void *d_scratch,
					size_t scratch_len, uint64_t *d_out_len,
					void *stream)
{
	struct snapk_layout L;
	struct snapc_dt dt;
	uint32_t nb, log2B;
	int rc = layout_of(p, count, &L, &nb, &dt, &log2B);
	if (rc)
		return rc;
	if ((!d_src && count) || !d_dst || !d_out_len || (!d_scratch && L.total))
		return SNAP_EINVAL;
	if (dst_cap < snap_codec_bound(p, count))
		return SNAP_EOVERFLOW;
	if (scratch_len < L.total)
		return SNAP_EINVAL;
	cudaStream_t st = (cudaStream_t)stream;
	uint8_t *sc = (uint8_t *)d_scratch;
	struct snapk_params *P = (struct snapk_params *)(sc + L.params);
	float *lohi = (float *)(sc + L.lohi);
	uint32_t *sizes = (uint32_t *)(sc + L.sizes);
	uint64_t *offs = (uint64_t *)(sc + L.offs);
	const uint8_t *src = (const uint8_t *)d_src;

	if (p->codec == SNAP_CODEC_LOSSY_REL && nb)
		k_range<<<nb, 256, 0, st>>>(src, count, log2B, dt, lohi);
	k_params<<<1, 1, 0, st>>>(p->codec, p->bound, lohi, nb, P);
	if (nb)
		k_encode<<<nb, SNAPK_THREADS, 0, st>>>(src, count, log2B, dt, P,
						       sc + L.slots, L.full, sizes);
	k_frame<<<1, 1024, 0, st>>>(sizes, nb, offs, (uint8_t *)d_dst, P, p->dtype,
				    log2B, count, d_out_len);
	if (nb)
		k_gather<<<nb, 256, 0, st>>>(sc + L.slots, L.full, sizes, offs,
					     (uint8_t *)d_dst,
					     SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)nb);
	return cudaGetLastError() == cudaSuccess ? 0 : SNAP_EIO;
}

/* ---- decode ------------------------------------------------------------ */

extern "C" size_t snap_codec_cuda_decode_scratch_size(const struct snap_codec_info *info)
{
	return info ? 8 * ((size_t)info->nblocks + 1) : 0;
}

/* Device-side re-check of what the host validated, then block offsets. */
__global__ static void k_dframe(const uint8_t *s, uint64_t src_len, struct snap_codec_info I,
				uint32_t log2B, size_t esize, uint64_t *offs, int *status)
{
	__shared__ int bad;
	uint32_t t = threadIdx.x;
	if (t == 0) {
		uint64_t u;
		double b;
		memcpy(&u, &I.bound, 8);
		memcpy(&b, &u, 8);
		bad = src_len < SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)I.nblocks ||
		      snapc_ld32(s) != SNAPC_MAGIC || s[4] != SNAP_CODEC_VERSION ||
		      s[5] != I.codec || s[6] != I.dtype || s[7] != log2B ||
		      snapc_ld64(s + 8) != I.count || snapc_ld64(s + 16) != u ||
		      snapc_ld32(s + 40) != I.nblocks;
		*status = 0;
	}
	__syncthreads();
	if (bad) {
		if (t == 0) *status = SNAP_ECORRUPT;
		return;
	}
	if (t == 0) {
		/* Sequential: the table is small next to the payload. */
		uint64_t off = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)I.nblocks;
		uint32_t minb = I.codec == SNAP_CODEC_LOSSLESS ? SNAPC_LL_HDR : SNAPC_LY_HDR;
		for (uint32_t b = 0; b < I.nblocks; b++) {
			uint32_t bl = snapc_ld32(s + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b);
			uint64_t i0 = (uint64_t)b << log2B;
			uint64_t n = min(I.count - i0, (uint64_t)1 << log2B);
			if (bl < minb || bl > SNAPC_BLOCK_SLACK + n * esize) {
				*status = SNAP_ECORRUPT;
				return;
			}
			offs[b] = off;
			off += bl;
		}
		if (off != I.stream_len || off > src_len ||
		    off - SNAP_CODEC_HEADER_BYTES - 4 * (uint64_t)I.nblocks != snapc_ld64(s + 32))
			*status = SNAP_ECORRUPT;
	}
}

__global__ static void __launch_bounds__(SNAPK_THREADS)
k_decode(const uint8_t *s, struct snap_codec_info I, uint32_t log2B, struct snapc_dt dt,
	 float step, const uint64_t *offs, uint8_t *dst, int *status)
{
	if (*status)
		return;
	uint32_t b = blockIdx.x;
	uint64_t i0 = (uint64_t)b << log2B;
	uint32_t n = (uint32_t)min(I.count - i0, (uint64_t)1 << log2B);
	uint32_t len = snapc_ld32(s + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b);
	uint8_t *d = dst + i0 * dt.esize;
	if (I.codec == SNAP_CODEC_LOSSLESS)
		ll_decode_block(s + offs[b], len, n, dt, d, status);
	else
		ly_decode_block(s + offs[b], len, n, dt, step, d, status);
}

extern "C" int snap_codec_cuda_decompress(const struct snap_codec_info *info,
					  const void *d_src, size_t src_len, void *d_dst,
					  size_t dst_cap, void *d_scratch,
					  size_t scratch_len, int *d_status, void *stream)
{
	struct snapc_dt dt;
	if (!info || !d_src || !d_status || snapc_dt_of(info->dtype, &dt) ||
	    info->block_elems < SNAP_CODEC_BLOCK_MIN || info->block_elems > SNAP_CODEC_BLOCK_MAX ||
	    (info->block_elems & (info->block_elems - 1)) ||
	    info->nblocks != (info->count + info->block_elems - 1) / info->block_elems)
		return SNAP_EINVAL;
	if (src_len < info->stream_len)
		return SNAP_ETRUNC;
	if (info->count > dst_cap / dt.esize)
		return SNAP_EOVERFLOW;
	if (!d_dst && info->count) /* as snap_codec_decompress */
		return SNAP_EINVAL;
	if (scratch_len < snap_codec_cuda_decode_scratch_size(info) || !d_scratch)
		return SNAP_EINVAL;
	struct snapc_lyq q;
	memset(&q, 0, sizeof(q));
	if (info->codec != SNAP_CODEC_LOSSLESS && snapc_step(info->bound, &q))
		return SNAP_ECORRUPT;
	uint32_t log2B = snapc_bits(info->block_elems) - 1;
	cudaStream_t st = (cudaStream_t)stream;
	uint64_t *offs = (uint64_t *)d_scratch;
	k_dframe<<<1, 32, 0, st>>>((const uint8_t *)d_src, src_len, *info, log2B, dt.esize,
				   offs, d_status);
	if (info->nblocks)
		k_decode<<<info->nblocks, SNAPK_THREADS, 0, st>>>((const uint8_t *)d_src, *info,
			log2B, dt, q.step, offs, (uint8_t *)d_dst, d_status);
	return cudaGetLastError() == cudaSuccess ? 0 : SNAP_EIO;
}
