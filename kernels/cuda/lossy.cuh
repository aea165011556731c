/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossy.cuh - CUDA twin of src/lossy.c: one thread block per stream block,
 * one thread per 32-value group. Quanta come from the shared snapc_quant();
 * the block-level choices (base, base width, raw fallback) and the placement
 * of codes and outliers are exclusive scans over the groups, so the bytes
 * are those of the C twin.
 */
#ifndef SNAP_CUDA_LOSSY_CUH
#define SNAP_CUDA_LOSSY_CUH

#include "common.cuh"

__device__ static void ly_group_q(const uint8_t *src, uint32_t g, uint32_t n,
				  struct snapc_dt dt, const struct snapc_lyq *qp,
				  int32_t *q, uint32_t *m_out)
{
	uint32_t i0 = g * SNAPC_GROUP, m = min(SNAPC_GROUP, n - i0);
	for (uint32_t j = 0; j < m; j++)
		q[j] = snapc_quant(snapc_ldel(src, i0 + j, dt.esize), qp, dt.esize, dt.E);
	*m_out = m;
}

__device__ static void ly_encode_block(const uint8_t *src, uint32_t n,
				       struct snapc_dt dt, const struct snapc_lyq *qp,
				       uint8_t *out, uint32_t *size_out)
{
	__shared__ int32_t gmin[SNAPK_MAXCHUNK];
	__shared__ uint32_t gw[SNAPK_MAXCHUNK], gcoff[SNAPK_MAXCHUNK], gooff[SNAPK_MAXCHUNK];
	__shared__ uint32_t s_raw, s_wb, s_nout, s_sumw;
	const uint32_t es = dt.esize, ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	for (uint32_t g = tid; g < ng; g += nt) {
		int32_t q[SNAPC_GROUP], lo = INT32_MAX, hi = INT32_MIN;
		uint32_t m, no = 0;
		ly_group_q(src, g, n, dt, qp, q, &m);
		for (uint32_t j = 0; j < m; j++) {
			if (q[j] == SNAPC_QOUT) { no++; continue; }
			lo = min(lo, q[j]);
			hi = max(hi, q[j]);
		}
		gmin[g] = lo <= hi ? lo : SNAPC_QOUT;
		gw[g] = lo <= hi ? snapc_bits((uint32_t)(hi - lo)) : 0;
		gooff[g] = no;
	}
	__syncthreads();
	if (tid == 0) {
		int32_t base = INT32_MAX;
		uint32_t nout = 0, sumw = 0, maxoff = 0;
		for (uint32_t g = 0; g < ng; g++)
			if (gmin[g] != SNAPC_QOUT)
				base = min(base, gmin[g]);
		if (base == INT32_MAX)
			base = 0;
		for (uint32_t g = 0; g < ng; g++) {
			if (gmin[g] == SNAPC_QOUT)
				gmin[g] = base;
			maxoff = max(maxoff, (uint32_t)(gmin[g] - base));
			gcoff[g] = 4 * sumw;
			sumw += gw[g];
			uint32_t no = gooff[g];
			gooff[g] = nout;
			nout += no;
		}
		uint32_t wb = snapc_bits(maxoff);
		uint64_t size = snapc_lossy_size(ng, wb, sumw, nout, es);
		uint64_t raw = SNAPC_LY_HDR + (uint64_t)n * es;
		s_raw = size >= raw;
		s_wb = wb; s_nout = nout; s_sumw = sumw;
		*size_out = (uint32_t)(size >= raw ? raw : size);
		for (uint32_t i = 0; i < SNAPC_LY_HDR; i++)
			out[i] = 0;
		if (size >= raw) {
			out[0] = 1;
		} else {
			out[1] = (uint8_t)wb;
			snapc_st32(out + 4, nout);
			snapc_st32(out + 8, (uint32_t)base);
			uint8_t *p = out + SNAPC_LY_HDR;
			for (uint32_t g = 0; g < ng; g++)
				p[g] = (uint8_t)gw[g];
			p += ng;
			uint32_t buf[SNAPC_GROUP];
			for (uint32_t g0 = 0; g0 < ng; g0 += SNAPC_GROUP) {
				uint32_t m = min(SNAPC_GROUP, ng - g0);
				for (uint32_t j = 0; j < m; j++)
					buf[j] = (uint32_t)(gmin[g0 + j] - base);
				snapc_pack32(buf, m, wb, p + g0 * wb / 8);
			}
		}
	}
	__syncthreads();
	if (s_raw) {
		for (uint32_t i = tid; i < n * es; i += nt)
			out[SNAPC_LY_HDR + i] = src[i];
		return;
	}
	const uint32_t wb = s_wb;
	uint8_t *codes = out + SNAPC_LY_HDR + ng + (ng * wb + 7) / 8;
	uint8_t *oi = codes + 4 * s_sumw, *ov = oi + 2 * s_nout;
	for (uint32_t g = tid; g < ng; g += nt) {
		int32_t q[SNAPC_GROUP];
		uint32_t m, buf[SNAPC_GROUP], o = gooff[g], i0 = g * SNAPC_GROUP;
		ly_group_q(src, g, n, dt, qp, q, &m);
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			if (j >= m || q[j] == SNAPC_QOUT) {
				buf[j] = 0;
				if (j < m) {
					uint32_t i = i0 + j;
					oi[2 * o] = (uint8_t)i;
					oi[2 * o + 1] = (uint8_t)(i >> 8);
					for (uint32_t b = 0; b < es; b++)
						ov[es * o + b] = src[es * i + b];
					o++;
				}
			} else {
				buf[j] = (uint32_t)(q[j] - gmin[g]);
			}
		}
		snapc_pack32_full(buf, gw[g], codes + gcoff[g]);
	}
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

__device__ static void ly_decode_block(const uint8_t *src, uint32_t len, uint32_t n,
				       struct snapc_dt dt, float step, uint8_t *dst,
				       int *status)
{
	__shared__ uint32_t gcoff[SNAPK_MAXCHUNK];
	__shared__ int s_bad;
	const uint32_t es = dt.esize, E = dt.E, ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	if (len < SNAPC_LY_HDR || src[2] || src[3]) { if (tid == 0) snapk_fail(status, -5); return; }
	const uint32_t mode = src[0], wb = src[1], nout = snapc_ld32(src + 4);
	const int32_t base = (int32_t)snapc_ld32(src + 8);
	if (mode == 1) {
		if (wb || nout || base || len != SNAPC_LY_HDR + n * es) {
			if (tid == 0) snapk_fail(status, -5);
			return;
		}
		for (uint32_t i = tid; i < n * es; i += nt)
			dst[i] = src[SNAPC_LY_HDR + i];
		return;
	}
	if (mode != 0 || wb > 31 || nout > n || len < SNAPC_LY_HDR + ng) {
		if (tid == 0) snapk_fail(status, -5);
		return;
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
	if (s_bad) { if (tid == 0) snapk_fail(status, -5); return; }
	const uint8_t *bases = gw + ng, *codes = bases + (ng * wb + 7) / 8;
	const uint8_t *oi = src + len - (uint64_t)nout * (2 + es), *ov = oi + 2 * nout;
	for (uint32_t g = tid; g < ng; g += nt) {
		uint32_t c[SNAPC_GROUP], i0 = g * SNAPC_GROUP, m = min(SNAPC_GROUP, n - i0);
		int64_t gb = (int64_t)base + ly_field(bases, g, wb);
		snapc_unpack32(codes + gcoff[g], SNAPC_GROUP, gw[g], c);
		for (uint32_t j = 0; j < m; j++)
			snapc_stel(dst, i0 + j, es, snapc_dequant(gb + c[j], step, es, E));
	}
	__syncthreads();
	for (uint32_t o = tid; o < nout; o += nt) {
		uint32_t i = (uint32_t)oi[2 * o] | (uint32_t)oi[2 * o + 1] << 8;
		uint32_t prev = o ? ((uint32_t)oi[2 * o - 2] | (uint32_t)oi[2 * o - 1] << 8) : 0;
		if (i >= n || (o && i <= prev)) {
			snapk_fail(status, -5);
			continue;
		}
		for (uint32_t b = 0; b < es; b++)
			dst[es * i + b] = ov[es * o + b];
	}
}

#endif
