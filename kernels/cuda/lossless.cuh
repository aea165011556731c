/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossless.cuh - CUDA twin of src/lossless.c: one thread block codes one
 * stream block, one thread one 32-value chunk. The exponent table is ranked
 * in parallel with the C twin's order (count desc, exponent asc); escapes
 * are placed by an exclusive scan of per-chunk escape counts, so the bytes
 * are those of the C twin. The encoder reads the block staged in shared
 * memory and writes its frame there (common.cuh).
 */
#ifndef SNAP_CUDA_LOSSLESS_CUH
#define SNAP_CUDA_LOSSLESS_CUH

#include "common.cuh"

/* Encodes the n staged values of one stream block into the zeroed frame
 * words o (byte 0 = the block's first byte); one thread per chunk
 * (blockDim.x >= chunks). Returns the block's byte length to every thread. */
__device__ static uint32_t ll_encode_block(const uint32_t *stage, uint32_t n, struct snapc_dt dt,
					   uint32_t *o)
{
	__shared__ uint32_t hist[256], cnt[256], tmp[32];
	__shared__ uint8_t sym[256], rank_of[256];
	__shared__ uint32_t s_k, s_T, s_nesc;
	const uint32_t E = dt.E, M = dt.M, R = M + 1;
	const uint32_t emask = (1u << E) - 1, mmask = (1u << M) - 1;
	const uint32_t nc = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x, lane = tid & 31;

	for (uint32_t s = tid; s < 256; s += nt)
		hist[s] = 0;
	__syncthreads();
	/* Exponent histogram; lanes with the same exponent add once. */
	for (uint32_t i0 = 0; i0 < n; i0 += nt) {
		uint32_t i = i0 + tid;
		uint32_t e = i < n ? (stage[snapk_si(i)] >> M) & emask : 0x100u;
		uint32_t same = __match_any_sync(0xffffffffu, e);
		if (i < n && lane == (uint32_t)__ffs(same) - 1)
			atomicAdd(&hist[e], (uint32_t)__popc(same));
	}
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
		snapk_or(o, 0, k, 8);
		snapk_or(o, 8, T, 8);
		snapk_or(o, 32, nesc, 32);
		for (uint32_t i = 0; i < T; i++)
			snapk_or(o, 8 * (uint64_t)(SNAPC_LL_HDR + i), sym[i], 8);
	}
	__syncthreads();
	const uint32_t k = s_k, T = s_T, nesc = s_nesc;
	const uint32_t esc = k ? (1u << k) - 1 : 0;
	const uint32_t code_bytes = (n * k + 7) / 8;
	const uint32_t codes = SNAPC_LL_HDR + T, escp = codes + code_bytes, rest = escp + nesc;
	const bool escapes = k && k != E;

	/* Code of exponent e, as the C twin's map[]. */
#define LL_CODE(e) (k == E ? (e) : (hist[(e)] && rank_of[(e)] < T) ? rank_of[(e)] : esc)
	const uint32_t c = tid, c0 = c * SNAPC_GROUP;
	const uint32_t m = c < nc ? min(SNAPC_GROUP, n - c0) : 0;
	const uint32_t *v = stage + 33 * c;
	uint32_t ne = 0;
	struct snapk_bw cw = { 8 * (uint64_t)codes + (uint64_t)c0 * k, 0, 0 };
	struct snapk_bw rw = { 8 * (uint64_t)rest + (uint64_t)c0 * R, 0, 0 };
	for (uint32_t j = 0; j < m; j++) {
		uint32_t x = v[j], e = (x >> M) & emask, code = LL_CODE(e);
		ne += escapes && code == esc;
		if (k)
			snapk_put(o, &cw, code, k);
		snapk_put(o, &rw, ((x >> (M + E)) << M) | (x & mmask), R);
	}
	snapk_flush(o, &cw);
	snapk_flush(o, &rw);
	uint32_t total, at = snapk_exscan(ne, tmp, &total);
	for (uint32_t j = 0; ne && j < m; j++) {
		uint32_t e = (v[j] >> M) & emask;
		if (LL_CODE(e) == esc)
			snapk_or(o, 8 * (uint64_t)(escp + at++), e, 8);
	}
#undef LL_CODE
	return SNAPC_LL_HDR + T + code_bytes + nesc + (n * R + 7) / 8;
}

/* Decodes one block (src: its bytes staged in shared memory) into the
 * staged values out (snapk_si order). Returns 0 when the block is sound, to
 * every thread; else reports SNAP_ECORRUPT through status. */
__device__ static int ll_decode_block(const uint8_t *src, uint32_t len, uint32_t n,
				      struct snapc_dt dt, uint32_t *out, int *status)
{
	__shared__ uint32_t chunk_esc[SNAPK_MAXCHUNK + 1];
	__shared__ int s_bad;
	const uint32_t E = dt.E, M = dt.M, R = M + 1;
	const uint32_t mmask = (1u << M) - 1;
	const uint32_t nc = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;
	const uint32_t tid = threadIdx.x, nt = blockDim.x;

	if (len < SNAPC_LL_HDR) { if (tid == 0) snapk_fail(status, -5); return -1; }
	const uint32_t k = src[0], T = src[1], nesc = snapc_ld32(src + 4);
	bool bad = k > E || src[2] || src[3];
	bad = bad || (k == E ? T != 0 : k == 0 ? T != 1 : (T < 1 || T > (1u << k) - 1));
	bad = bad || ((k == E || k == 0) && nesc != 0) || nesc > n;
	const uint64_t code_bytes = ((uint64_t)n * k + 7) / 8;
	bad = bad || len != SNAPC_LL_HDR + T + code_bytes + nesc + ((uint64_t)n * R + 7) / 8;
	for (uint32_t i = 0; !bad && i < T; i++)
		bad = (src[SNAPC_LL_HDR + i] >> E) != 0;
	if (bad) { if (tid == 0) snapk_fail(status, -5); return -1; }
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
				atomicOr(&s_bad, 1);
		}
		chunk_esc[c] = ne;
	}
	__syncthreads();
	if (tid == 0 && snapk_exscan1(chunk_esc, nc) != nesc)
		s_bad = 1;
	__syncthreads();
	if (s_bad) { if (tid == 0) snapk_fail(status, -5); return -1; }
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
				atomicOr(&s_bad, 1);
				e = 0;
			}
			uint32_t r = rb[j];
			out[snapk_si(c0 + j)] = ((r >> M) << (M + E)) | (e << M) | (r & mmask);
		}
	}
	__syncthreads();
	return s_bad ? -1 : 0;
}

#endif
