/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codec.cu - CUDA twin of src/codec.c: stream framing on the GPU.
 *
 * Compress: (REL only) per-block min/max and a parameter kernel; then one
 * kernel, one thread block per stream block, that encodes in shared memory
 * and writes the block at its offset, found by a decoupled look-back
 * (k_encode). Decompress: a scan kernel re-validates the header and table and
 * computes offsets; one thread block per stream block decodes, staged in
 * shared memory both ways.
 * Nothing here allocates; all launches go on the caller's stream.
 */
#include <cuda_runtime.h>

#include "common.cuh"
#include "lossless.cuh"
#include "lossy.cuh"

/* Parameters of a compression: decided on the host (lossless, abs) or by
 * k_params on the device (rel, which needs the range). */
struct snapk_params {
	int codec;
	int pad;
	struct snapc_lyq q;
	double param;
};

/* Scratch: the device-decided parameters, per-block ranges (rel), then two
 * counters and the look-back state of each block, zeroed before a launch. */
struct snapk_layout {
	size_t params, lohi, ctr, total;
	uint32_t full; /* a block's largest frame */
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
	L->full = SNAPC_BLOCK_SLACK + B * dt->esize;
	L->params = 0;
	L->lohi = 256;
	L->ctr = L->lohi + ((8 * n + 255) & ~(size_t)255);
	L->total = L->ctr + 16 + 8 * n;
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

/* Element i of an array at any alignment. */
__device__ static __forceinline__ uint32_t k_ld(const uint8_t *src, uint64_t i, uint32_t es)
{
	return snapc_ldel(src, i, es);
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
		float x = snapc_to_f32(k_ld(src, i, dt.esize), dt.esize, dt.E);
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

/* The rule plan_compress() applies on the host: a bound too small for a
 * float step falls back to lossless. */
__host__ __device__ static void finish_params(struct snapk_params *p)
{
	if (p->codec != SNAP_CODEC_LOSSLESS && snapc_step(p->q.bound, &p->q))
		p->codec = SNAP_CODEC_LOSSLESS;
	if (p->codec == SNAP_CODEC_LOSSLESS) {
		memset(&p->q, 0, sizeof(p->q));
		p->param = 0;
	}
}

/* REL: the bound relative to the finite range of the whole array. */
__global__ static void k_params(double bound, const float *lohi, uint32_t nb,
				struct snapk_params *P)
{
	__shared__ float slo[1024], shi[1024];
	__shared__ int sany[1024];
	float lo = 0, hi = 0;
	int any = 0;
	for (uint32_t b = threadIdx.x; b < nb; b += blockDim.x) {
		float l = lohi[2 * b], h = lohi[2 * b + 1];
		if (l != l) continue;
		if (!any) { lo = l; hi = h; any = 1; }
		lo = fminf(lo, l);
		hi = fmaxf(hi, h);
	}
	slo[threadIdx.x] = lo; shi[threadIdx.x] = hi; sany[threadIdx.x] = any;
	__syncthreads();
	if (threadIdx.x != 0)
		return;
	any = 0;
	for (uint32_t t = 0; t < blockDim.x; t++) {
		if (!sany[t]) continue;
		if (!any) { lo = slo[t]; hi = shi[t]; any = 1; }
		lo = fminf(lo, slo[t]);
		hi = fmaxf(hi, shi[t]);
	}
	struct snapk_params p;
	memset(&p, 0, sizeof(p));
	p.codec = SNAP_CODEC_LOSSY_REL;
	p.q.bound = bound * ((double)hi - (double)lo);
	p.param = bound;
	finish_params(&p);
	*P = p;
}

/* The stream header; its payload length is known once every block has its
 * place. */
__device__ static void put_header(uint8_t *dst, const struct snapk_params *P, int dtype, uint32_t log2B,
				  uint64_t count, uint32_t nb, uint64_t payload, uint64_t *out_len)
{
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
	snapc_st64(dst + 32, payload);
	snapc_st32(dst + 40, nb);
	snapc_st32(dst + 44, 0);
	*out_len = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)nb + payload;
}

__global__ static void k_empty(uint8_t *dst, const struct snapk_params *dP, struct snapk_params hP,
			       int dtype, uint32_t log2B, uint64_t *out_len)
{
	put_header(dst, dP ? dP : &hP, dtype, log2B, 0, 0, 0, out_len);
}

/* Look-back state of a block: flag in the top two bits, bytes below. */
#define LB_AGG (1ull << 62)  /* this block's own length */
#define LB_PRE (2ull << 62)  /* the length of every block up to and including it */
#define LB_VAL(x) ((x) & ((1ull << 62) - 1))

/*
 * One stream block per thread block, in a single pass: stage the input in
 * shared memory (coalesced reads), encode it into a frame in shared memory,
 * find its offset by a decoupled look-back over the blocks before it, and
 * copy the frame to its place in the stream with aligned word stores
 * (coalesced; the stream may be pinned host memory across PCIe). Blocks
 * take their stream index from a counter, so every block a block waits for
 * has started and will finish. The last block to finish writes the header.
 */
__global__ static void __launch_bounds__(SNAPK_ENC_MAX)
k_encode(const uint8_t *src, uint64_t count, uint32_t log2B, struct snapc_dt dt, int dtype,
	 const struct snapk_params *dP, struct snapk_params hP, uint32_t full,
	 uint8_t *dst, uint32_t nb, unsigned long long *ctr, uint64_t *out_len)
{
	extern __shared__ uint32_t dyn[];
	__shared__ uint32_t s_b, s_last;
	__shared__ unsigned long long s_off;
	const uint32_t tid = threadIdx.x, nt = blockDim.x, es = dt.esize;
	const struct snapk_params *P = dP ? dP : &hP;
	volatile unsigned long long *state = ctr + 2;

	if (tid == 0)
		s_b = (uint32_t)atomicAdd(&ctr[0], 1ull);
	__syncthreads();
	const uint32_t b = s_b;
	const uint64_t i0 = (uint64_t)b << log2B;
	const uint32_t n = (uint32_t)min(count - i0, (uint64_t)1 << log2B);
	const uint8_t *s = src + i0 * es;
	uint32_t *stage = dyn, *o = dyn + snapk_si((uint32_t)1 << log2B);
	const uint32_t ow = (full + 3) / 4 + 1;

	for (uint32_t w = tid; w < ow; w += nt)
		o[w] = 0;
	uint32_t done = 0;
	if (((uintptr_t)s & 15) == 0) {
		const uint32_t per = 16 / es, nv = n / per;
		const uint4 *s4 = (const uint4 *)s;
		for (uint32_t v = tid; v < nv; v += nt) {
			uint4 x = __ldg(s4 + v);
			uint32_t wd[4] = { x.x, x.y, x.z, x.w }, i = v * per;
			if (es == 4) {
				for (uint32_t t = 0; t < 4; t++)
					stage[snapk_si(i + t)] = wd[t];
			} else {
				for (uint32_t t = 0; t < 4; t++) {
					stage[snapk_si(i + 2 * t)] = wd[t] & 0xffffu;
					stage[snapk_si(i + 2 * t + 1)] = wd[t] >> 16;
				}
			}
		}
		done = nv * per;
	}
	for (uint32_t i = done + tid; i < n; i += nt)
		stage[snapk_si(i)] = k_ld(s, i, es);
	__syncthreads();

	uint32_t len = P->codec == SNAP_CODEC_LOSSLESS ? ll_encode_block(stage, n, dt, o)
						       : ly_encode_block(stage, n, dt, &P->q, o);
	__syncthreads(); /* the frame is complete */

	/* Look-back by the first warp, 32 predecessors at a time: wait until
	 * each has published, add lengths down to the nearest prefix. */
	if (tid < 32) {
		const uint32_t lane = tid;
		unsigned long long off = 0;
		if (b == 0) {
			if (lane == 0)
				state[0] = LB_PRE | len;
		} else {
			if (lane == 0)
				state[b] = LB_AGG | len;
			for (int64_t top = (int64_t)b - 1;; top -= 32) {
				int64_t j = top - lane;
				unsigned long long x = LB_PRE; /* before block 0: nothing */
				if (j >= 0)
					while (!((x = state[j]) >> 62))
						;
				uint32_t pre = __ballot_sync(0xffffffffu, (x >> 62) == 2);
				uint32_t stop = pre ? (uint32_t)__ffs(pre) - 1 : 31;
				unsigned long long v = lane <= stop ? LB_VAL(x) : 0;
				for (uint32_t d = 16; d; d >>= 1)
					v += __shfl_down_sync(0xffffffffu, v, d);
				off += __shfl_sync(0xffffffffu, v, 0);
				if (pre)
					break;
			}
			if (lane == 0) {
				__threadfence();
				state[b] = LB_PRE | (off + len);
			}
		}
		if (lane == 0)
			s_off = off;
	}
	__syncthreads();

	const uint64_t H = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)nb;
	uint8_t *d = dst + H + s_off;
	/* head (< 4) bytes up to d's next word boundary, then whole words, each
	 * cut from two frame words, then the tail. */
	const uint32_t head = min(len, (uint32_t)((4 - ((uintptr_t)d & 3)) & 3));
	const uint32_t nw = (len - head) / 4;
	const uint8_t *ob = (const uint8_t *)o;
	uint32_t *dw = (uint32_t *)(d + head);
	for (uint32_t w = tid; w < nw; w += nt)
		dw[w] = __funnelshift_r(o[w], o[w + 1], 8 * head);
	if (tid < head)
		d[tid] = ob[tid];
	for (uint32_t i = head + 4 * nw + tid; i < len; i += nt)
		d[i] = ob[i];
	if (tid == 0)
		snapc_st32(dst + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b, len);

	/* The last block out writes the header: every block published its
	 * prefix before counting itself out, so block nb - 1's, the payload
	 * length, is there. */
	__threadfence();
	__syncthreads();
	if (tid == 0)
		s_last = atomicAdd(&ctr[1], 1ull) == nb - 1;
	__syncthreads();
	if (s_last && tid == 0) {
		__threadfence();
		put_header(dst, P, dtype, log2B, count, nb, LB_VAL(state[nb - 1]), out_len);
	}
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
	const uint8_t *src = (const uint8_t *)d_src;
	uint8_t *dst = (uint8_t *)d_dst;
	struct snapk_params hp, *dP = NULL;
	memset(&hp, 0, sizeof(hp));
	hp.codec = p->codec;
	if (p->codec == SNAP_CODEC_LOSSY_ABS)
		hp.q.bound = hp.param = p->bound;
	if (p->codec == SNAP_CODEC_LOSSY_REL) {
		dP = (struct snapk_params *)(sc + L.params);
		float *lohi = (float *)(sc + L.lohi);
		if (nb)
			k_range<<<nb, 256, 0, st>>>(src, count, log2B, dt, lohi);
		k_params<<<1, 1024, 0, st>>>(p->bound, lohi, nb, dP);
	} else {
		finish_params(&hp);
	}
	if (!nb) {
		k_empty<<<1, 1, 0, st>>>(dst, dP, hp, p->dtype, log2B, d_out_len);
		return cudaGetLastError() == cudaSuccess ? 0 : SNAP_EIO;
	}
	unsigned long long *ctr = (unsigned long long *)(sc + L.ctr);
	if (cudaMemsetAsync(ctr, 0, 16 + 8 * (size_t)nb, st) != cudaSuccess)
		return SNAP_EIO;
	uint32_t B = 1u << log2B, threads = max(32u, B / SNAPC_GROUP);
	size_t shm = 4 * ((size_t)snapk_si(B) + (L.full + 3) / 4 + 1);
	if (shm > 48 * 1024 &&
	    cudaFuncSetAttribute(k_encode, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm) != cudaSuccess)
		return SNAP_EIO;
	k_encode<<<nb, threads, shm, st>>>(src, count, log2B, dt, p->dtype, dP, hp, L.full, dst, nb, ctr,
					    d_out_len);
	return cudaGetLastError() == cudaSuccess ? 0 : SNAP_EIO;
}

/* ---- decode ------------------------------------------------------------ */

extern "C" size_t snap_codec_cuda_decode_scratch_size(const struct snap_codec_info *info)
{
	return info ? 8 * ((size_t)info->nblocks + 1) : 0;
}

/* Device-side re-check of what the host validated, then block offsets: an
 * exclusive scan of the block table, 1024 entries at a time. */
__global__ static void k_dframe(const uint8_t *s, uint64_t src_len, struct snap_codec_info I,
				uint32_t log2B, size_t esize, uint64_t *offs, int *status)
{
	__shared__ int bad;
	__shared__ uint32_t tmp[32];
	const uint32_t t = threadIdx.x;
	if (t == 0) {
		uint64_t u;
		memcpy(&u, &I.bound, 8);
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
	const uint32_t minb = I.codec == SNAP_CODEC_LOSSLESS ? SNAPC_LL_HDR : SNAPC_LY_HDR;
	uint64_t off = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)I.nblocks;
	for (uint32_t b0 = 0; b0 < I.nblocks; b0 += blockDim.x) {
		uint32_t b = b0 + t, bl = 0;
		if (b < I.nblocks) {
			bl = snapc_ld32(s + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b);
			uint64_t i0 = (uint64_t)b << log2B;
			uint64_t n = min(I.count - i0, (uint64_t)1 << log2B);
			if (bl < minb || bl > SNAPC_BLOCK_SLACK + n * esize) {
				atomicOr(&bad, 1);
				bl = 0;
			}
		}
		uint32_t total, at = snapk_exscan(bl, tmp, &total);
		if (b < I.nblocks)
			offs[b] = off + at;
		off += total;
	}
	if (t == 0 && (bad || off != I.stream_len || off > src_len ||
		       off - SNAP_CODEC_HEADER_BYTES - 4 * (uint64_t)I.nblocks != snapc_ld64(s + 32)))
		*status = SNAP_ECORRUPT;
}

/*
 * One stream block per thread block: stage its bytes in shared memory with
 * aligned word loads, decode into staged values, then write them out with
 * coalesced stores (the first version read bytes and wrote elements one
 * thread per chunk, 32 cache lines per warp access).
 */
__global__ static void __launch_bounds__(SNAPK_THREADS)
k_decode(const uint8_t *s, struct snap_codec_info I, uint32_t log2B, struct snapc_dt dt,
	 float step, const uint64_t *offs, uint8_t *dst, int *status)
{
	extern __shared__ uint32_t dyn[];
	if (*status)
		return;
	const uint32_t b = blockIdx.x, tid = threadIdx.x, nt = blockDim.x, es = dt.esize;
	const uint64_t i0 = (uint64_t)b << log2B;
	const uint32_t n = (uint32_t)min(I.count - i0, (uint64_t)1 << log2B);
	const uint32_t len = snapc_ld32(s + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b);
	uint32_t *out = dyn, *in = dyn + snapk_si((uint32_t)1 << log2B);
	/* The words holding the block's bytes, as they lie; its first byte is
	 * then at byte (p & 3) of the copy. k_dframe bounded len. */
	const uint8_t *p = s + offs[b];
	const uint32_t *pw = (const uint32_t *)((uintptr_t)p & ~(uintptr_t)3);
	const uint32_t lead = (uint32_t)((uintptr_t)p & 3), end = lead + len, nw = (end + 3) / 4;
	for (uint32_t w = tid; w < nw; w += nt) {
		if (4 * w + 4 <= end) {
			in[w] = pw[w];
		} else { /* the last word: no read past the stream */
			uint32_t x = 0;
			for (uint32_t k = 4 * w; k < end; k++)
				x |= (uint32_t)((const uint8_t *)pw)[k] << (8 * (k - 4 * w));
			in[w] = x;
		}
	}
	__syncthreads();
	const uint8_t *src = (const uint8_t *)in + lead;
	int rc = I.codec == SNAP_CODEC_LOSSLESS ? ll_decode_block(src, len, n, dt, out, status)
						: ly_decode_block(src, len, n, dt, step, out, status);
	__syncthreads();
	if (rc)
		return;
	uint8_t *d = dst + i0 * es;
	uint32_t done = 0;
	if (((uintptr_t)d & 15) == 0) {
		const uint32_t per = 16 / es, nv = n / per;
		uint4 *d4 = (uint4 *)d;
		for (uint32_t v = tid; v < nv; v += nt) {
			uint32_t i = v * per, wd[4];
			for (uint32_t t = 0; t < 4; t++)
				wd[t] = es == 4 ? out[snapk_si(i + t)]
						: out[snapk_si(i + 2 * t)] | out[snapk_si(i + 2 * t + 1)] << 16;
			d4[v] = make_uint4(wd[0], wd[1], wd[2], wd[3]);
		}
		done = nv * per;
	}
	for (uint32_t i = done + tid; i < n; i += nt)
		snapc_stel(d, i, es, out[snapk_si(i)]);
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
	k_dframe<<<1, 1024, 0, st>>>((const uint8_t *)d_src, src_len, *info, log2B, dt.esize,
				     offs, d_status);
	if (info->nblocks) {
		uint32_t B = 1u << log2B;
		size_t shm = 4 * ((size_t)snapk_si(B) + (SNAPC_BLOCK_SLACK + B * dt.esize + 3 + 3) / 4);
		if (shm > 48 * 1024 &&
		    cudaFuncSetAttribute(k_decode, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shm) !=
			    cudaSuccess)
			return SNAP_EIO;
		k_decode<<<info->nblocks, SNAPK_THREADS, shm, st>>>((const uint8_t *)d_src, *info, log2B, dt,
								    q.step, offs, (uint8_t *)d_dst, d_status);
	}
	return cudaGetLastError() == cudaSuccess ? 0 : SNAP_EIO;
}
