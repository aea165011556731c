/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossy.cuh - CUDA twin of src/lossy.c: one thread block per stream block,
 * one thread per 32-value group. Quanta come from the shared snapc_quant();
 * the block-level choices (base, base width, raw fallback) are reductions
 * and the placement of codes and outliers exclusive scans over the groups,
 * so the bytes are those of the C twin. The encoder reads the block staged
 * in shared memory and writes its frame there (common.cuh).
 */
#ifndef SNAP_CUDA_LOSSY_CUH
#define SNAP_CUDA_LOSSY_CUH

#include "common.cuh"

/* Encodes the n staged values of one stream block into the zeroed frame
 * words o; one thread per 32-value group (blockDim.x >= groups). Returns
 * the block's byte length to every thread. */
__device__ static uint32_t ly_encode_block(const uint32_t *stage, uint32_t n, struct snapc_dt dt,
					   const struct snapc_lyq *qp, uint32_t *o)
{
	__shared__ uint32_t tmp[32];
	__shared__ int32_t s_base;
	__shared__ uint32_t s_maxoff;
	const uint32_t es = dt.esize, ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t g = threadIdx.x, i0 = g * SNAPC_GROUP;
	const uint32_t m = g < ng ? min(SNAPC_GROUP, n - i0) : 0;
	const uint32_t *v = stage + 33 * g;
	int32_t q[SNAPC_GROUP], lo = INT32_MAX, hi = INT32_MIN;
	uint32_t no = 0;

	if (g == 0) {
		s_base = INT32_MAX;
		s_maxoff = 0;
	}
#pragma unroll
	for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
		q[j] = j < m ? snapc_quant(v[j], qp, es, dt.E) : SNAPC_QOUT;
		if (j >= m)
			continue;
		if (q[j] == SNAPC_QOUT) { no++; continue; }
		lo = min(lo, q[j]);
		hi = max(hi, q[j]);
	}
	const uint32_t w = lo <= hi ? snapc_bits((uint32_t)(hi - lo)) : 0;
	__syncthreads();
	if (lo <= hi)
		atomicMin(&s_base, lo);
	__syncthreads();
	/* A group of outliers only takes the base, as in the C twin. */
	const int32_t base = s_base == INT32_MAX ? 0 : s_base;
	const int32_t gmin = lo <= hi ? lo : base;
	if (m)
		atomicMax(&s_maxoff, (uint32_t)(gmin - base));
	uint32_t sumw, nout;
	const uint32_t cw = snapk_exscan(w, tmp, &sumw);    /* syncs: s_maxoff is final */
	uint32_t oo = snapk_exscan(no, tmp, &nout);
	const uint32_t wb = snapc_bits(s_maxoff);
	const uint64_t size = snapc_lossy_size(ng, wb, sumw, nout, es);
	const uint64_t raw = SNAPC_LY_HDR + (uint64_t)n * es;
	if (size >= raw) {
		if (g == 0)
			snapk_or(o, 0, 1, 8);
		for (uint32_t j = 0; j < m; j++)
			snapk_or(o, 8 * ((uint64_t)SNAPC_LY_HDR + (uint64_t)(i0 + j) * es), v[j], 8 * es);
		return (uint32_t)raw;
	}
	if (g == 0) {
		snapk_or(o, 8, wb, 8);
		snapk_or(o, 32, nout, 32);
		snapk_or(o, 64, (uint32_t)base, 32);
	}
	if (!m)
		return (uint32_t)size;
	const uint64_t gws = SNAPC_LY_HDR, bases = gws + ng, codes = bases + ((uint64_t)ng * wb + 7) / 8;
	const uint64_t oi = codes + 4 * (uint64_t)sumw, ov = oi + 2 * (uint64_t)nout;
	snapk_or(o, 8 * (gws + g), w, 8);
	snapk_or(o, 8 * bases + (uint64_t)g * wb, (uint32_t)(gmin - base), wb);
	struct snapk_bw bw = { 8 * (codes + 4 * (uint64_t)cw), 0, 0 };
#pragma unroll
	for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
		bool in = q[j] != SNAPC_QOUT;
		if (w)
			snapk_put(o, &bw, in ? (uint32_t)(q[j] - gmin) : 0, w);
		if (!in && j < m) {
			uint32_t i = i0 + j;
			snapk_or(o, 8 * (oi + 2 * (uint64_t)oo), i & 0xffffu, 16);
			snapk_or(o, 8 * (ov + (uint64_t)es * oo), v[j], 8 * es);
			oo++;
		}
	}
	if (w)
		snapk_flush(o, &bw);
	return (uint32_t)size;
}

/* wb-bit field number g of a packed array (bits LSB first). */
__device__ static uint32_t ly_field(const uint8_t *p, uint32_t g, uint32_t wb)
{
	uint64_t bit = (uint64_t)g * wb, v = 0;
	uint32_t first = (uint32_t)(bit >> 3), nbytes = (uint32_t)((bit + wb + 7) >> 3) - first;
	for (uint32_t i = 0; i < nbytes; i++)
		v |= (uint64_t)p[first + i] << (8 * i);
	return wb ? (uint32_t)(v >> (bit & 7)) & (uint32_t)((1ull << wb) - 1) : 0;
}

/* Decodes one block (src: its bytes staged in shared memory) into the
 * staged values out (snapk_si order). Returns 0 when the block is sound, to
 * every thread; else reports SNAP_ECORRUPT through status. */
__device__ static int ly_decode_block(const uint8_t *src, uint32_t len, uint32_t n,
				      struct snapc_dt dt, float step, uint32_t *out,
				      int *status)
{
	__shared__ uint32_t gcoff[SNAPK_MAXCHUNK];
	__shared__ int s_bad;
	const uint32_t es = dt.esize, E = dt.E, ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	if (len < SNAPC_LY_HDR || src[2] || src[3]) { if (tid == 0) snapk_fail(status, -5); return -1; }
	const uint32_t mode = src[0], wb = src[1], nout = snapc_ld32(src + 4);
	const int32_t base = (int32_t)snapc_ld32(src + 8);
	if (mode == 1) {
		if (wb || nout || base || len != SNAPC_LY_HDR + n * es) {
			if (tid == 0) snapk_fail(status, -5);
			return -1;
		}
		for (uint32_t i = tid; i < n; i += nt)
			out[snapk_si(i)] = snapc_ldel(src + SNAPC_LY_HDR, i, es);
		return 0;
	}
	if (mode != 0 || wb > 31 || nout > n || len < SNAPC_LY_HDR + ng) {
		if (tid == 0) snapk_fail(status, -5);
		return -1;
	}
	const uint8_t *gw = src + SNAPC_LY_HDR;
	if (tid == 0) {
		uint32_t sumw = 0;
		int bad = 0;
		for (uint32_t g = 0; g < ng; g++) {
			bad |= gw[g] > 31;
			gcoff[g] = 4 * sumw;
			sumw += gw[g];
		}
		s_bad = bad || len != snapc_lossy_size(ng, wb, sumw, nout, es);
	}
	__syncthreads();
	if (s_bad) { if (tid == 0) snapk_fail(status, -5); return -1; }
	const uint8_t *bases = gw + ng, *codes = bases + (ng * wb + 7) / 8;
	const uint8_t *oi = src + len - (uint64_t)nout * (2 + es), *ov = oi + 2 * nout;
	for (uint32_t g = tid; g < ng; g += nt) {
		uint32_t c[SNAPC_GROUP], i0 = g * SNAPC_GROUP, m = min(SNAPC_GROUP, n - i0);
		int64_t gb = (int64_t)base + ly_field(bases, g, wb);
		snapc_unpack32(codes + gcoff[g], SNAPC_GROUP, gw[g], c);
		for (uint32_t j = 0; j < m; j++)
			out[snapk_si(i0 + j)] = snapc_dequant(gb + c[j], step, es, E);
	}
	__syncthreads();
	for (uint32_t o = tid; o < nout; o += nt) {
		uint32_t i = (uint32_t)oi[2 * o] | (uint32_t)oi[2 * o + 1] << 8;
		uint32_t prev = o ? ((uint32_t)oi[2 * o - 2] | (uint32_t)oi[2 * o - 1] << 8) : 0;
		if (i >= n || (o && i <= prev)) {
			snapk_fail(status, -5);
			atomicOr(&s_bad, 1);
			continue;
		}
		out[snapk_si(i)] = snapc_ldel(ov, o, es);
	}
	__syncthreads();
	return s_bad ? -1 : 0;
}

#endif
