/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossless.c - C twin of the lossless block coder.
 *
 * Trained weights spend their entropy in the mantissa; the exponent byte of
 * a block takes only a handful of values. So each value is split into its
 * exponent and its sign:mantissa bits; the exponents are coded with k-bit
 * codes into a per-block table of the most frequent ones (one escape code
 * sends the rare others raw), the sign:mantissa bits are packed as they are.
 * Fixed-length codes keep every 32-value chunk byte-aligned, which is what
 * lets one GPU thread code one chunk. Layout: docs/codec-format.md.
 */
#include <string.h>

#include "snap/codec.h"
#include "codec_impl.h"

/* Whether the AVX2 coders of 2-byte dtypes run (es: element size). */
#if defined(SNAPC_HAVE_AVX2)
#define SNAPC_AVX2_16(es) ((es) == 2 && snapc_isa >= SNAPC_ISA_AVX2)
#else
#define SNAPC_AVX2_16(es) 0
#endif

/* Sort nonzero histogram bins by (count desc, exponent asc): the table order
 * the GPU computes by ranking. Insertion sort: blocks have few distinct
 * exponents. */
static uint32_t sorted_table(const uint32_t *hist, uint32_t nsym, uint8_t *sym,
			     uint32_t *cnt)
{
	uint32_t d = 0;
	for (uint32_t s = 0; s < nsym; s++) {
		if (!hist[s])
			continue;
		uint32_t j = d++;
		while (j > 0 && cnt[j - 1] < hist[s]) {
			cnt[j] = cnt[j - 1];
			sym[j] = sym[j - 1];
			j--;
		}
		cnt[j] = hist[s];
		sym[j] = (uint8_t)s;
	}
	return d;
}

/* Codes and rests of the full chunks of n values (n a multiple of 32), with
 * the dtype's geometry as constants so the split vectorises. */
static inline __attribute__((always_inline)) void
ll_chunks(const uint8_t *src, uint32_t n, const uint32_t es, const uint32_t M,
	  const uint32_t E, uint32_t k, const uint8_t *map, uint32_t escv,
	  uint8_t *codes, uint8_t **escpp, uint8_t *rest)
{
	uint8_t *escp = *escpp;
	const uint32_t R = M + 1, emask = (1u << E) - 1, mmask = (1u << M) - 1;
	uint32_t cbuf[SNAPC_GROUP], rbuf[SNAPC_GROUP];
	void (*const pk)(const uint32_t *, uint8_t *) = snapc_pack_tab[k];
	void (*const pr)(const uint32_t *, uint8_t *) = snapc_pack_tab[R];
	for (uint32_t c0 = 0; c0 < n; c0 += SNAPC_GROUP) {
		uint32_t ev[SNAPC_GROUP];
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			uint32_t v;
			if (es == 4) {
				memcpy(&v, src + 4 * (size_t)(c0 + j), 4);
			} else {
				uint16_t h;
				memcpy(&h, src + 2 * (size_t)(c0 + j), 2);
				v = h;
			}
			ev[j] = (v >> M) & emask;
			rbuf[j] = ((v >> (M + E)) << M) | (v & mmask);
		}
		uint32_t em = 0;
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			cbuf[j] = map[ev[j]];
			em |= (uint32_t)(cbuf[j] == escv) << j;
		}
		while (em) { /* escapes, in value order */
			*escp++ = (uint8_t)ev[__builtin_ctz(em)];
			em &= em - 1;
		}
		pk(cbuf, codes + (size_t)c0 * k / 8);
		pr(rbuf, rest + (size_t)c0 * R / 8);
	}
	*escpp = escp;
}

/* Exponent histogram of n values into hist (zeroed by the caller), with
 * four interleaved counters so that runs of one exponent do not chain their
 * increments; es as a constant so the loads fold. */
static inline __attribute__((always_inline)) void
hist4(const uint8_t *src, uint32_t n, const uint32_t es, const uint32_t M,
      const uint32_t emask, uint32_t *hist)
{
	uint32_t h4[3][256], i;
	memset(h4, 0, sizeof(h4));
	for (i = 0; i + 4 <= n; i += 4) {
		uint32_t v[4];
		if (es == 4) {
			memcpy(v, src + 4 * (size_t)i, 16);
		} else {
			uint16_t h[4];
			memcpy(h, src + 2 * (size_t)i, 8);
			for (int j = 0; j < 4; j++)
				v[j] = h[j];
		}
		hist[(v[0] >> M) & emask]++;
		h4[0][(v[1] >> M) & emask]++;
		h4[1][(v[2] >> M) & emask]++;
		h4[2][(v[3] >> M) & emask]++;
	}
	for (; i < n; i++)
		hist[(snapc_ldel(src, i, es) >> M) & emask]++;
	for (uint32_t s = 0; s <= emask; s++)
		hist[s] += h4[0][s] + h4[1][s] + h4[2][s];
}

#if defined(SNAPC_HAVE_AVX2)
/*
 * 2-byte dtypes with AVX2 (bf16: E 8, M 7; f16: E 5, M 10), a chunk of 32
 * values (two vectors of 16) at a time: a first pass writes the exponents
 * as bytes (for the histogram and the codes), a second codes them and
 * splits off the rests. Same bytes as the scalar coder.
 */
#define LDU(p) _mm256_loadu_si256((const __m256i *)(const void *)(p))
#define STU(p, v) _mm256_storeu_si256((__m256i *)(void *)(p), (v))
#define STU128(p, v) _mm_storeu_si128((__m128i *)(void *)(p), (v))

/* Left-packing of the escapes of 8 values: leftpack[m] holds, byte by
 * byte, the positions of the set bits of m (a pshufb control), leftpack_n[m]
 * their number. */
static uint64_t leftpack[256];
static uint8_t leftpack_n[256];
/* Its inverse for the decoder: byte j of expand[m] is the rank of bit j
 * among the set bits of m, or 0x80 (a zero byte) where bit j is clear. */
static uint64_t expand[256];

__attribute__((constructor)) static void leftpack_init(void)
{
	for (uint32_t m = 0; m < 256; m++) {
		uint32_t c = 0;
		uint64_t x = 0;
		for (uint32_t j = 0; j < 8; j++) {
			if (m >> j & 1) {
				leftpack[m] |= (uint64_t)j << (8 * c);
				x |= (uint64_t)c++ << (8 * j);
			} else {
				x |= (uint64_t)0x80 << (8 * j);
			}
		}
		leftpack_n[m] = (uint8_t)c;
		expand[m] = x;
	}
}

/* 32 words (a then b, each < 256) as 32 bytes in order. */
static inline SNAPC_AVX2_FN __m256i bytes_of(__m256i a, __m256i b)
{
	return _mm256_permute4x64_epi64(_mm256_packus_epi16(a, b), 0xd8);
}

/* Exponents of the first n values (n a multiple of 32) as bytes. */
static SNAPC_AVX2_FN void exps16_avx2(const uint8_t *src, uint32_t n, uint32_t M,
				      uint32_t emask, uint8_t *ebuf)
{
	const __m128i sh = _mm_cvtsi32_si128((int)M);
	const __m256i em = _mm256_set1_epi16((short)emask);
	for (uint32_t i = 0; i < n; i += SNAPC_GROUP) {
		__m256i a = _mm256_and_si256(_mm256_srl_epi16(LDU(src + 2 * (size_t)i), sh), em);
		__m256i b = _mm256_and_si256(_mm256_srl_epi16(LDU(src + 2 * (size_t)i + 32), sh), em);
		STU(ebuf + i, bytes_of(a, b));
	}
}

/* rest = sign << M | mantissa of 16 elements (E 8: M 7, E 5: M 10), and
 * back to elements with their exponents e (16 words). */
static inline SNAPC_AVX2_FN __m256i rest16(__m256i v, uint32_t E)
{
	const int M = E == 8 ? 7 : 10;
	return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi16((short)((1 << M) - 1))),
			       _mm256_and_si256(_mm256_srli_epi16(v, (int)E), _mm256_set1_epi16((short)(1 << M))));
}

static inline SNAPC_AVX2_FN __m256i elem16(__m256i r, __m256i e, uint32_t E)
{
	const int M = E == 8 ? 7 : 10;
	return _mm256_or_si256(_mm256_or_si256(
		_mm256_and_si256(r, _mm256_set1_epi16((short)((1 << M) - 1))),
		_mm256_slli_epi16(_mm256_and_si256(r, _mm256_set1_epi16((short)(1 << M))), (int)E)),
		_mm256_slli_epi16(e, M));
}

/* 16 words of 11 bits, LSB first: 22 bytes at d, and the 5 bytes after
 * them overwritten. */
static inline SNAPC_AVX2_FN void pack11x16(__m256i r, uint8_t *d)
{
	__m256i x = _mm256_madd_epi16(r, _mm256_set1_epi32(1 | 2048 << 16)); /* 22 bits */
	x = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi64x(0xffffffff)),
			    _mm256_slli_epi64(_mm256_srli_epi64(x, 32), 22)); /* 44 bits */
	__m256i a = _mm256_sllv_epi64(x, _mm256_set_epi64x(44, 0, 44, 0));
	__m256i b = _mm256_srlv_epi64(x, _mm256_set_epi64x(20, 64, 20, 64));
	a = _mm256_or_si256(a, _mm256_bsrli_epi128(a, 8));
	x = _mm256_blend_epi32(a, b, 0xcc); /* 88 bits per lane */
	STU128(d, _mm256_castsi256_si128(x));
	STU128(d + 11, _mm256_extracti128_si256(x, 1));
}

/* Codes, escapes and rests of the first nfull values (a multiple of 32),
 * whose exponent bytes are ebuf; map as in snapc_ll_encode, sym[0..T) the
 * table. The codes are packed into a staging area first (the vector stores
 * run past a chunk) and copied out exactly; the escapes are gathered at the
 * front of ebuf (overwriting it) and copied to *escpp, which is advanced. */
static SNAPC_AVX2_FN void chunks16_avx2(const uint8_t *src, uint8_t *ebuf,
					uint32_t nfull, uint32_t E, uint32_t k,
					const uint8_t *sym, uint32_t T,
					const uint8_t *map, uint8_t *codes,
					uint8_t **escpp, uint8_t *rest)
{
	uint8_t stage[SNAP_CODEC_BLOCK_MAX + 32], tmp[64];
	uint32_t nesc = 0;
	const uint32_t esc = k ? (1u << k) - 1 : 0;
	const int escapes = k && k != E;
	/* code of an exponent: table symbols lie in nr 16-wide windows from
	 * lo; lut[r] holds code ^ esc at symbol - (lo + 16 r), 0 elsewhere. */
	uint32_t lo = 255, hi = 0, nr = 0;
	__m256i lut[4];
	for (uint32_t t = 0; t < T; t++) {
		lo = sym[t] < lo ? sym[t] : lo;
		hi = sym[t] > hi ? sym[t] : hi;
	}
	if (escapes && (hi - lo) / 16 < 4) {
		uint8_t tb[4][16];
		memset(tb, 0, sizeof(tb));
		nr = (hi - lo) / 16 + 1;
		for (uint32_t t = 0; t < T; t++)
			tb[(sym[t] - lo) / 16][(sym[t] - lo) % 16] = (uint8_t)(t ^ esc);
		for (uint32_t r = 0; r < nr; r++)
			lut[r] = _mm256_broadcastsi128_si256(
				_mm_loadu_si128((const __m128i *)(const void *)tb[r]));
	}
	const __m256i vesc = _mm256_set1_epi8((char)esc), v15 = _mm256_set1_epi8(15);
	/* k-bit packing (1 <= k <= 7): byte pairs, word pairs, dword pairs
	 * merged by multiply-adds and a shift, leaving k bytes per qword that
	 * one shuffle moves together (2k bytes per lane). */
	const __m256i mul1 = _mm256_set1_epi16((short)(1 | (1u << k) << 8));
	const __m256i mul2 = _mm256_set1_epi32((int)(1 | (1u << 2 * k) << 16));
	const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
	const __m128i c4k = _mm_cvtsi32_si128((int)(4 * k));
	uint8_t sh[16];
	for (uint32_t j = 0; j < 16; j++)
		sh[j] = j < k ? (uint8_t)j : j < 2 * k ? (uint8_t)(8 + j - k) : 0x80;
	const __m256i cmp = _mm256_broadcastsi128_si256(
		_mm_loadu_si128((const __m128i *)(const void *)sh));

	for (uint32_t c0 = 0; c0 < nfull; c0 += SNAPC_GROUP) {
		__m256i a = LDU(src + 2 * (size_t)c0), b = LDU(src + 2 * (size_t)c0 + 32);
		a = rest16(a, E);
		b = rest16(b, E);
		if (E == 8) { /* one byte */
			STU(rest + c0, bytes_of(a, b));
		} else { /* 11 bits, 44 bytes a chunk */
			int last = c0 + SNAPC_GROUP == nfull;
			uint8_t *d = last ? tmp : rest + (size_t)c0 * 11 / 8;
			pack11x16(a, d);
			pack11x16(b, d + 22);
			if (last)
				memcpy(rest + (size_t)c0 * 11 / 8, tmp, 44);
		}
		if (!k)
			continue;
		__m256i code = LDU(ebuf + c0);
		if (escapes) {
			if (nr) {
				__m256i acc = _mm256_setzero_si256();
				for (uint32_t r = 0; r < nr; r++) {
					__m256i idx = _mm256_sub_epi8(code, _mm256_set1_epi8((char)(lo + 16 * r)));
					__m256i in = _mm256_cmpeq_epi8(_mm256_min_epu8(idx, v15), idx);
					acc = _mm256_or_si256(acc, _mm256_and_si256(in,
						_mm256_shuffle_epi8(lut[r], idx)));
				}
				code = _mm256_xor_si256(acc, vesc);
			} else {
				for (uint32_t j = 0; j < SNAPC_GROUP; j++)
					tmp[j] = map[ebuf[c0 + j]];
				code = LDU(tmp);
			}
			/* escapes, in value order, packed left into ebuf itself:
			 * the 8-byte stores end before the group read next */
			uint32_t em = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, vesc));
			for (uint32_t g = 0; g < SNAPC_GROUP; g += 8) {
				uint32_t m = (em >> g) & 0xff;
				__m128i e8 = _mm_loadl_epi64((const __m128i *)(const void *)(ebuf + c0 + g));
				e8 = _mm_shuffle_epi8(e8, _mm_cvtsi64_si128((long long)leftpack[m]));
				_mm_storel_epi64((__m128i *)(void *)(ebuf + nesc), e8);
				nesc += leftpack_n[m];
			}
		}
		uint8_t *d = stage + (size_t)c0 * k / 8;
		if (k == 8) {
			STU(d, code);
			continue;
		}
		__m256i x = _mm256_maddubs_epi16(mul1, code);
		x = _mm256_madd_epi16(x, mul2);
		x = _mm256_or_si256(_mm256_and_si256(x, lo32),
				    _mm256_sll_epi64(_mm256_srli_epi64(x, 32), c4k));
		x = _mm256_shuffle_epi8(x, cmp);
		STU128(d, _mm256_castsi256_si128(x));
		STU128(d + 2 * k, _mm256_extracti128_si256(x, 1));
	}
	memcpy(codes, stage, (size_t)nfull * k / 8);
	memcpy(*escpp, ebuf, nesc);
	*escpp += nesc;
}

/* Exponent histogram from exponent bytes: eight 16-bit counter sets
 * (each sees at most n/8 <= 2048 values), so that runs of one exponent do
 * not chain their increments. */
static void hist_bytes(const uint8_t *e, uint32_t n, uint32_t nsym, uint32_t *hist)
{
	uint16_t h8[8][256];
	uint32_t i;
	memset(h8, 0, sizeof(h8));
	for (i = 0; i + 8 <= n; i += 8) {
		uint64_t w;
		memcpy(&w, e + i, 8);
		for (int j = 0; j < 8; j++)
			h8[j][(w >> 8 * j) & 0xff]++;
	}
	for (; i < n; i++)
		hist[e[i]]++;
	for (uint32_t s = 0; s < nsym; s++)
		for (int j = 0; j < 8; j++)
			hist[s] += h8[j][s];
}
#endif

int snapc_ll_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    uint8_t *dst, size_t cap, size_t *len)
{
	const uint32_t E = dt->E, M = dt->M, R = M + 1, es = dt->esize;
	const uint32_t emask = (1u << E) - 1, mmask = (1u << M) - 1;
	uint32_t hist[256] = {0}, cnt[256];
	uint8_t sym[256], map[256];
	uint32_t i;
	const int avx2_16 = SNAPC_AVX2_16(es);
#if defined(SNAPC_HAVE_AVX2)
	uint8_t ebuf[SNAP_CODEC_BLOCK_MAX];
#endif
	const uint32_t nfull = n / SNAPC_GROUP * SNAPC_GROUP;

	if (avx2_16) {
#if defined(SNAPC_HAVE_AVX2)
		exps16_avx2(src, nfull, M, emask, ebuf);
		for (i = nfull; i < n; i++)
			ebuf[i] = (uint8_t)((snapc_ldel(src, i, 2) >> M) & emask);
		hist_bytes(ebuf, n, emask + 1, hist);
#endif
	} else if (es == 4) {
		hist4(src, n, 4, 23, 0xff, hist);
	} else {
		hist4(src, n, 2, M, emask, hist);
	}
	uint32_t distinct = sorted_table(hist, emask + 1, sym, cnt);
	uint32_t k, T;
	snapc_choose_k(cnt, distinct, n, E, &k, &T);

	uint32_t esc = k ? (1u << k) - 1 : 0, nesc = 0;
	if (k == E) {
		for (i = 0; i <= emask; i++) map[i] = (uint8_t)i;
	} else {
		memset(map, (int)esc, sizeof(map));
		for (i = 0; i < T; i++) map[sym[i]] = (uint8_t)i;
		nesc = n;
		for (i = 0; i < T; i++) nesc -= cnt[i];
	}
	size_t code_bytes = ((size_t)n * k + 7) / 8, rest_bytes = ((size_t)n * R + 7) / 8;
	size_t size = SNAPC_LL_HDR + T + code_bytes + nesc + rest_bytes;
	if (size > cap)
		return SNAP_EOVERFLOW;

	dst[0] = (uint8_t)k;
	dst[1] = (uint8_t)T;
	dst[2] = dst[3] = 0;
	snapc_st32(dst + 4, nesc);
	memcpy(dst + SNAPC_LL_HDR, sym, T);
	uint8_t *codes = dst + SNAPC_LL_HDR + T;
	uint8_t *escp = codes + code_bytes;
	uint8_t *rest = escp + nesc;

	uint32_t cbuf[SNAPC_GROUP], rbuf[SNAPC_GROUP];
	uint32_t c0 = 0;
	if (avx2_16) {
#if defined(SNAPC_HAVE_AVX2)
		chunks16_avx2(src, ebuf, nfull, E, k, sym, T, map, codes, &escp, rest);
		c0 = nfull;
#endif
	} else if (snapc_isa > SNAPC_ISA_SCALAR) {
		const uint32_t escv = (k && k != E) ? esc : 0x100u;
		if (es == 4)
			ll_chunks(src, nfull, 4, 23, 8, k, map, escv, codes, &escp, rest);
		else if (E == 8)
			ll_chunks(src, nfull, 2, 7, 8, k, map, escv, codes, &escp, rest);
		else
			ll_chunks(src, nfull, 2, 10, 5, k, map, escv, codes, &escp, rest);
		c0 = nfull;
	}
	for (; c0 < n; c0 += SNAPC_GROUP) {
		uint32_t m = n - c0 < SNAPC_GROUP ? n - c0 : SNAPC_GROUP;
		for (uint32_t j = 0; j < m; j++) {
			uint32_t v = snapc_ldel(src, c0 + j, es);
			uint32_t e = (v >> M) & emask, code = map[e];
			cbuf[j] = code;
			if (k != E && code == esc && k)
				*escp++ = (uint8_t)e;
			rbuf[j] = ((v >> (M + E)) << M) | (v & mmask);
		}
		snapc_pack32(cbuf, m, k, codes + (size_t)c0 * k / 8);
		if (es == 4) {
			uint8_t *r = rest + (size_t)c0 * 3;
			for (uint32_t j = 0; j < m; j++, r += 3) {
				r[0] = (uint8_t)rbuf[j];
				r[1] = (uint8_t)(rbuf[j] >> 8);
				r[2] = (uint8_t)(rbuf[j] >> 16);
			}
		} else if (R == 8) {
			for (uint32_t j = 0; j < m; j++)
				rest[c0 + j] = (uint8_t)rbuf[j];
		} else {
			snapc_pack32(rbuf, m, R, rest + (size_t)c0 * R / 8);
		}
	}
	*len = size;
	return 0;
}

/* Decode the full chunks of n values (n a multiple of 32): dtab maps codes
 * below lim to exponents; a code at or above lim must be the escape code
 * with an escape byte left. 0 or SNAP_ECORRUPT. */
static inline __attribute__((always_inline)) int
ll_dchunks(const uint8_t *codes, const uint8_t *rest, uint32_t n, const uint32_t es,
	   const uint32_t M, const uint32_t E, uint32_t k, const uint8_t *dtab,
	   uint32_t lim, uint32_t esc, const uint8_t **escpp, const uint8_t *escend,
	   uint8_t *dst)
{
	const uint32_t R = M + 1, mmask = (1u << M) - 1;
	const uint8_t *escp = *escpp;
	uint32_t cbuf[SNAPC_GROUP], rbuf[SNAPC_GROUP], ev[SNAPC_GROUP];
	void (*const uk)(const uint8_t *, uint32_t *) = snapc_unpack_tab[k];
	void (*const ur)(const uint8_t *, uint32_t *) = snapc_unpack_tab[R];
	for (uint32_t c0 = 0; c0 < n; c0 += SNAPC_GROUP) {
		uk(codes + (size_t)c0 * k / 8, cbuf);
		ur(rest + (size_t)c0 * R / 8, rbuf);
		uint32_t over = 0;
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			over |= (uint32_t)(cbuf[j] >= lim) << j;
			ev[j] = dtab[cbuf[j] & 0xff];
		}
		while (over) {
			uint32_t j = (uint32_t)__builtin_ctz(over);
			over &= over - 1;
			if (cbuf[j] != esc || escp >= escend || (*escp >> E))
				return SNAP_ECORRUPT;
			ev[j] = *escp++;
		}
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			uint32_t r = rbuf[j];
			uint32_t v = ((r >> M) << (M + E)) | (ev[j] << M) | (r & mmask);
			if (es == 4) {
				memcpy(dst + 4 * (size_t)(c0 + j), &v, 4);
			} else {
				uint16_t h = (uint16_t)v;
				memcpy(dst + 2 * (size_t)(c0 + j), &h, 2);
			}
		}
	}
	*escpp = escp;
	return 0;
}

#if defined(SNAPC_HAVE_AVX2)
/* Inverse of pack11x16: 16 words of 11 bits from the 22 bytes at d (reads
 * 27 bytes). */
static inline SNAPC_AVX2_FN __m256i unpack11x16(const uint8_t *d)
{
	__m256i x = _mm256_loadu2_m128i((const __m128i *)(const void *)(d + 11),
					(const __m128i *)(const void *)d);
	__m256i a = _mm256_srlv_epi64(_mm256_unpacklo_epi64(x, x), _mm256_set_epi64x(44, 0, 44, 0));
	__m256i b = _mm256_sllv_epi64(x, _mm256_set_epi64x(20, 64, 20, 64));
	x = _mm256_and_si256(_mm256_or_si256(a, b), _mm256_set1_epi64x(0xfffffffffffll));
	x = _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi64x(0x3fffff)),
			    _mm256_slli_epi64(_mm256_srli_epi64(x, 22), 32));
	return _mm256_or_si256(_mm256_and_si256(x, _mm256_set1_epi32(0x7ff)),
			       _mm256_slli_epi32(_mm256_srli_epi32(x, 11), 16));
}

/* ll_dchunks for the 2-byte dtypes with AVX2: codes unpacked by shifts and
 * masks, table codes looked up in 16-wide windows, escapes expanded into
 * their lanes 8 at a time after the same checks as the scalar decoder. */
static SNAPC_AVX2_FN int dchunks16_avx2(const uint8_t *codes, const uint8_t *rest,
					uint32_t n, uint32_t E, uint32_t k,
					const uint8_t *tab, uint32_t T,
					const uint8_t **escpp, const uint8_t *escend,
					uint8_t *dst)
{
	const uint8_t *escp = *escpp;
	const uint32_t esc = k ? (1u << k) - 1 : 0, nr = k && k != E ? (T + 15) / 16 : 0;
	uint8_t tb[8][16], tmp[64];
	__m256i lut[8];
	memset(tb, 0, sizeof(tb));
	memcpy(tb, tab, T);
	for (uint32_t r = 0; r < nr; r++)
		lut[r] = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)tb[r]));
	uint8_t sh[16];
	for (uint32_t j = 0; j < 16; j++)
		sh[j] = j % 8 < k ? (uint8_t)(j / 8 * k + j % 8) : 0x80;
	const __m256i exq = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)sh));
	const __m256i m4k = _mm256_set1_epi64x((long long)((1ull << 4 * k) - 1));
	const __m256i m2k = _mm256_set1_epi32((int)((1u << 2 * k) - 1));
	const __m256i mk = _mm256_set1_epi16((short)((1u << k) - 1));
	const __m128i c4k = _mm_cvtsi32_si128((int)(4 * k)), c2k = _mm_cvtsi32_si128((int)(2 * k));
	const __m128i ck = _mm_cvtsi32_si128((int)k);
	const __m256i vT = _mm256_set1_epi8((char)(T ? T : 1)), vesc = _mm256_set1_epi8((char)esc);
	const __m256i v15 = _mm256_set1_epi8(15), ebad = _mm256_set1_epi8((char)(0xff << E));
	const __m256i e0 = _mm256_set1_epi8((char)(T ? tab[0] : 0));
	for (uint32_t c0 = 0; c0 < n; c0 += SNAPC_GROUP) {
		const uint8_t *d = codes + (size_t)c0 * k / 8;
		__m256i e;
		if (k == 0) {
			e = e0;
		} else if (k == 8) {
			e = LDU(d);
		} else { /* k bytes per 8 codes; reads 2k + 16 bytes */
			__m256i x = _mm256_loadu2_m128i((const __m128i *)(const void *)(d + 2 * k),
							(const __m128i *)(const void *)d);
			x = _mm256_shuffle_epi8(x, exq);
			x = _mm256_or_si256(_mm256_and_si256(x, m4k),
					    _mm256_slli_epi64(_mm256_srl_epi64(x, c4k), 32));
			x = _mm256_or_si256(_mm256_and_si256(x, m2k),
					    _mm256_slli_epi32(_mm256_srl_epi32(x, c2k), 16));
			e = _mm256_or_si256(_mm256_and_si256(x, mk),
					    _mm256_slli_epi16(_mm256_srl_epi16(x, ck), 8));
		}
		if (nr) {
			__m256i code = e, acc = _mm256_setzero_si256();
			for (uint32_t r = 0; r < nr; r++) {
				__m256i idx = _mm256_sub_epi8(code, _mm256_set1_epi8((char)(16 * r)));
				__m256i in = _mm256_cmpeq_epi8(_mm256_min_epu8(idx, v15), idx);
				acc = _mm256_or_si256(acc, _mm256_and_si256(in, _mm256_shuffle_epi8(lut[r], idx)));
			}
			e = acc;
			__m256i over = _mm256_cmpeq_epi8(_mm256_max_epu8(code, vT), code);
			uint32_t om = (uint32_t)_mm256_movemask_epi8(over);
			if (om) { /* codes >= T: escapes, 8 lanes at a time */
				uint32_t em = (uint32_t)_mm256_movemask_epi8(_mm256_cmpeq_epi8(code, vesc));
				uint32_t cnt = leftpack_n[om & 0xff] + leftpack_n[om >> 8 & 0xff] +
					       leftpack_n[om >> 16 & 0xff] + leftpack_n[om >> 24];
				if ((om & ~em) || (size_t)(escend - escp) < cnt)
					return SNAP_ECORRUPT;
				for (uint32_t g = 0; g < SNAPC_GROUP; g += 8) {
					uint32_t m = om >> g & 0xff;
					__m128i x = _mm_loadl_epi64((const __m128i *)(const void *)escp);
					x = _mm_shuffle_epi8(x, _mm_cvtsi64_si128((long long)expand[m]));
					_mm_storel_epi64((__m128i *)(void *)(tmp + g), x);
					escp += leftpack_n[m];
				}
				__m256i x = LDU(tmp);
				if (!_mm256_testz_si256(x, ebad))
					return SNAP_ECORRUPT;
				e = _mm256_blendv_epi8(e, x, over);
			}
		}
		__m256i ra, rb;
		if (E == 8) {
			__m256i r = LDU(rest + c0);
			ra = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(r));
			rb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(r, 1));
		} else { /* 44 bytes; the last chunk from a copy, not to read past them */
			const uint8_t *r = rest + (size_t)c0 * 11 / 8;
			if (c0 + SNAPC_GROUP == n) {
				memcpy(tmp, r, 44);
				r = tmp;
			}
			ra = unpack11x16(r);
			rb = unpack11x16(r + 22);
		}
		__m256i ea = _mm256_cvtepu8_epi16(_mm256_castsi256_si128(e));
		__m256i eb = _mm256_cvtepu8_epi16(_mm256_extracti128_si256(e, 1));
		STU(dst + 2 * (size_t)c0, elem16(ra, ea, E));
		STU(dst + 2 * (size_t)c0 + 32, elem16(rb, eb, E));
	}
	*escpp = escp;
	return 0;
}
#endif

int snapc_ll_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, uint8_t *dst)
{
	const uint32_t E = dt->E, M = dt->M, R = M + 1, es = dt->esize;
	const uint32_t mmask = (1u << M) - 1;
	uint8_t tab[256];

	if (len < SNAPC_LL_HDR)
		return SNAP_ECORRUPT;
	uint32_t k = src[0], T = src[1], nesc = snapc_ld32(src + 4);
	if (k > E || src[2] || src[3])
		return SNAP_ECORRUPT;
	if (k == E ? T != 0 : k == 0 ? T != 1 : (T < 1 || T > (1u << k) - 1))
		return SNAP_ECORRUPT;
	if ((k == E || k == 0) && nesc != 0)
		return SNAP_ECORRUPT;
	if (nesc > n)
		return SNAP_ECORRUPT;
	size_t code_bytes = ((size_t)n * k + 7) / 8, rest_bytes = ((size_t)n * R + 7) / 8;
	if (len != SNAPC_LL_HDR + T + code_bytes + nesc + rest_bytes)
		return SNAP_ECORRUPT;
	for (uint32_t i = 0; i < T; i++) {
		tab[i] = src[SNAPC_LL_HDR + i];
		if (tab[i] >> E)
			return SNAP_ECORRUPT;
	}
	const uint8_t *codes = src + SNAPC_LL_HDR + T;
	const uint8_t *escp = codes + code_bytes, *escend = escp + nesc;
	const uint8_t *rest = escend;
	const uint32_t esc = k ? (1u << k) - 1 : 0;

	uint32_t cbuf[SNAPC_GROUP], rbuf[SNAPC_GROUP];
	uint32_t c0 = 0;
	if (SNAPC_AVX2_16(es)) {
#if defined(SNAPC_HAVE_AVX2)
		c0 = n / SNAPC_GROUP * SNAPC_GROUP;
		int rc = dchunks16_avx2(codes, rest, c0, E, k, tab, T, &escp, escend, dst);
		if (rc)
			return rc;
#endif
	} else if (snapc_isa > SNAPC_ISA_SCALAR) {
		uint8_t dtab[256];
		uint32_t lim, nfull = n / SNAPC_GROUP * SNAPC_GROUP;
		int rc;
		memset(dtab, 0, sizeof(dtab));
		if (k == E) {
			for (uint32_t i = 0; i < 256; i++) dtab[i] = (uint8_t)i;
			lim = 256;
		} else {
			memcpy(dtab, tab, T);
			lim = T;
		}
		if (es == 4)
			rc = ll_dchunks(codes, rest, nfull, 4, 23, 8, k, dtab, lim, esc, &escp, escend, dst);
		else if (E == 8)
			rc = ll_dchunks(codes, rest, nfull, 2, 7, 8, k, dtab, lim, esc, &escp, escend, dst);
		else
			rc = ll_dchunks(codes, rest, nfull, 2, 10, 5, k, dtab, lim, esc, &escp, escend, dst);
		if (rc)
			return rc;
		c0 = nfull;
	}
	for (; c0 < n; c0 += SNAPC_GROUP) {
		uint32_t m = n - c0 < SNAPC_GROUP ? n - c0 : SNAPC_GROUP;
		snapc_unpack32(codes + (size_t)c0 * k / 8, m, k, cbuf);
		if (es == 4) {
			const uint8_t *r = rest + (size_t)c0 * 3;
			for (uint32_t j = 0; j < m; j++, r += 3)
				rbuf[j] = (uint32_t)r[0] | (uint32_t)r[1] << 8 | (uint32_t)r[2] << 16;
		} else if (R == 8) {
			for (uint32_t j = 0; j < m; j++)
				rbuf[j] = rest[c0 + j];
		} else {
			snapc_unpack32(rest + (size_t)c0 * R / 8, m, R, rbuf);
		}
		for (uint32_t j = 0; j < m; j++) {
			uint32_t e, code = cbuf[j];
			if (k == E) {
				e = code;
			} else if (k == 0) {
				e = tab[0];
			} else if (code < T) {
				e = tab[code];
			} else if (code == esc && escp < escend) {
				e = *escp++;
				if (e >> E)
					return SNAP_ECORRUPT;
			} else {
				return SNAP_ECORRUPT;
			}
			uint32_t r = rbuf[j];
			uint32_t v = ((r >> M) << (M + E)) | (e << M) | (r & mmask);
			snapc_stel(dst, c0 + j, es, v);
		}
	}
	if (escp != escend)
		return SNAP_ECORRUPT;
	return 0;
}
