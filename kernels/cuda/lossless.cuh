/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossless.cuh - CUDA twin of src/lossless.c: one thread block codes one
 * stream block, one thread one 32-value chunk at a time. The exponent table
 * is ranked in parallel with the C twin's order (count desc, exponent asc);
 * escapes are placed by an exclusive scan of per-chunk escape counts, so the
 * bytes are those of the C twin.
 */
#ifndef SNAP_CUDA_LOSSLESS_CUH
#define SNAP_CUDA_LOSSLESS_CUH

#include "common.cuh"

__device__ static void ll_encode_block(const uint8_t *src, uint32_t n,
				       struct snapc_dt dt, uint8_t *out,
				       uint32_t *size_out)
{
	__shared__ uint32_t hist[256], cnt[256], chunk_esc[SNAPK_MAXCHUNK + 1];
	__shared__ uint8_t sym[256], rank_of[256];
	__shared__ uint32_t s_k, s_T, s_nesc;
	const uint32_t E = dt.E, M = dt.M, R = M + 1, es = dt.esize;
	const uint32_t emask = (1u << E) - 1, mmask = (1u << M) - 1;
	const uint32_t nc = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	for (uint32_t s = tid; s < 256; s += nt)
		hist[s] = 0;
	__syncthreads();
	for (uint32_t i = tid; i < n; i += nt)
		atomicAdd(&hist[(snapc_ldel(src, i, es) >> M) & emask], 1u);
	__syncthreads();
	for (uint32_t s = tid; s < 256; s += nt) {
		uint32_t h = hist[s], r = 0;
		if (!h)
			continue;
		for (uint32_t t = 0; t < 256; t++)
			r += hist[t] > h || (hist[t] == h && t < s);
		cnt[r] = h;
		sym[r] = (uint8_t)s;
		rank_of[s] = (uint8_t)r;
	}
	__syncthreads();
	if (tid == 0) {
		uint32_t distinct = 0, k, T;
		for (uint32_t s = 0; s <= emask; s++)
			distinct += hist[s] != 0;
		snapc_choose_k(cnt, distinct, n, E, &k, &T);
		uint32_t nesc = 0;
		if (k != E) {
			nesc = n;
			for (uint32_t i = 0; i < T; i++)
				nesc -= cnt[i];
		}
		s_k = k; s_T = T; s_nesc = nesc;
	}
	__syncthreads();
	const uint32_t k = s_k, T = s_T, nesc = s_nesc;
	const uint32_t esc = k ? (1u << k) - 1 : 0;
	const uint32_t code_bytes = (n * k + 7) / 8;
	uint8_t *codes = out + SNAPC_LL_HDR + T;
	uint8_t *escp = codes + code_bytes, *rest = escp + nesc;

	/* Code of exponent e, as the C twin's map[]. */
#define LL_CODE(e) (k == E ? (e) : (hist[(e)] && rank_of[(e)] < T) ? rank_of[(e)] : esc)
	for (uint32_t c = tid; c < nc; c += nt) {
		uint32_t c0 = c * SNAPC_GROUP, m = min(SNAPC_GROUP, n - c0), ne = 0;
		for (uint32_t j = 0; j < m; j++) {
			uint32_t e = (snapc_ldel(src, c0 + j, es) >> M) & emask;
			ne += (k && k != E && LL_CODE(e) == esc);
		}
		chunk_esc[c] = ne;
	}
	__syncthreads();
	if (tid == 0) {
		snapk_exscan1(chunk_esc, nc);
		out[0] = (uint8_t)k;
		out[1] = (uint8_t)T;
		out[2] = out[3] = 0;
		snapc_st32(out + 4, nesc);
		for (uint32_t i = 0; i < T; i++)
			out[SNAPC_LL_HDR + i] = sym[i];
	}
	__syncthreads();
	for (uint32_t c = tid; c < nc; c += nt) {
		uint32_t c0 = c * SNAPC_GROUP, m = min(SNAPC_GROUP, n - c0);
		uint32_t cb[SNAPC_GROUP], rb[SNAPC_GROUP];
		uint8_t *ep = escp + chunk_esc[c];
		for (uint32_t j = 0; j < m; j++) {
			uint32_t v = snapc_ldel(src, c0 + j, es);
			uint32_t e = (v >> M) & emask, code = LL_CODE(e);
			cb[j] = code;
			if (k && k != E && code == esc)
				*ep++ = (uint8_t)e;
			rb[j] = ((v >> (M + E)) << M) | (v & mmask);
		}
		snapc_pack32(cb, m, k, codes + c0 * k / 8);
		snapc_pack32(rb, m, R, rest + c0 * R / 8);
	}
#undef LL_CODE
	if (tid == 0)
		*size_out = SNAPC_LL_HDR + T + code_bytes + nesc + (n * R + 7) / 8;
}

__device__ static void ll_decode_block(const uint8_t *src, uint32_t len, uint32_t n,
				       struct snapc_dt dt, uint8_t *dst, int *status)
{
	__shared__ uint32_t chunk_esc[SNAPK_MAXCHUNK + 1];
	__shared__ int s_bad;
	const uint32_t E = dt.E, M = dt.M, R = M + 1, es = dt.esize;
	const uint32_t mmask = (1u << M) - 1;
	const uint32_t nc = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	if (len < SNAPC_LL_HDR) { if (tid == 0) snapk_fail(status, -5); return; }
	const uint32_t k = src[0], T = src[1], nesc = snapc_ld32(src + 4);
	bool bad = k > E || src[2] || src[3];
	bad = bad || (k == E ? T != 0 : k == 0 ? T != 1 : (T < 1 || T > (1u << k) - 1));
	bad = bad || ((k == E || k == 0) && nesc != 0) || nesc > n;
	const uint64_t code_bytes = ((uint64_t)n * k + 7) / 8;
	bad = bad || len != SNAPC_LL_HDR + T + code_bytes + nesc + ((uint64_t)n * R + 7) / 8;
	for (uint32_t i = 0; !bad && i < T; i++)
		bad = (src[SNAPC_LL_HDR + i] >> E) != 0;
	if (bad) { if (tid == 0) snapk_fail(status, -5); return; }
	const uint8_t *tab = src + SNAPC_LL_HDR, *codes = tab + T;
	const uint8_t *escp = codes + code_bytes, *rest = escp + nesc;
	const uint32_t esc = k ? (1u << k) - 1 : 0;

	if (tid == 0)
		s_bad = 0;
	__syncthreads();
	for (uint32_t c = tid; c < nc; c += nt) {
		uint32_t c0 = c * SNAPC_GROUP, m = min(SNAPC_GROUP, n - c0), ne = 0;
		uint32_t cb[SNAPC_GROUP];
		snapc_unpack32(codes + c0 * k / 8, m, k, cb);
		for (uint32_t j = 0; j < m && k && k != E; j++) {
			ne += cb[j] == esc;
			if (cb[j] >= T && cb[j] != esc)
				s_bad = 1;
		}
		chunk_esc[c] = ne;
	}
	__syncthreads();
	if (tid == 0 && snapk_exscan1(chunk_esc, nc) != nesc)
		s_bad = 1;
	__syncthreads();
	if (s_bad) { if (tid == 0) snapk_fail(status, -5); return; }
	for (uint32_t c = tid; c < nc; c += nt) {
		uint32_t c0 = c * SNAPC_GROUP, m = min(SNAPC_GROUP, n - c0);
		uint32_t cb[SNAPC_GROUP], rb[SNAPC_GROUP];
		const uint8_t *ep = escp + chunk_esc[c];
		snapc_unpack32(codes + c0 * k / 8, m, k, cb);
		snapc_unpack32(rest + c0 * R / 8, m, R, rb);
		for (uint32_t j = 0; j < m; j++) {
			uint32_t e, code = cb[j];
			if (k == E)
				e = code;
			else if (k == 0)
				e = tab[0];
			else if (code < T)
				e = tab[code];
			else
				e = *ep++;
			if (e >> E) {
				snapk_fail(status, -5);
				e = 0;
			}
			uint32_t r = rb[j];
			snapc_stel(dst, c0 + j, es, ((r >> M) << (M + E)) | (e << M) | (r & mmask));
		}
	}
}

#endif
