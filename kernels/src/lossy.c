/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * lossy.c - C twin of the error-bounded block coder.
 *
 * Each value becomes a quantum q = round(x / step), step <= 2 * bound, kept
 * only if the value it decodes to (in the target dtype) is within the bound;
 * otherwise (NaN, Inf, huge, rounding that lands outside) it is an outlier
 * stored verbatim. Per 32-value group the quanta are stored as offsets from
 * the group minimum in the fewest bits that hold them; the group minima are
 * stored as offsets from the block minimum. No prediction: trained weights
 * are uncorrelated, and fixed-length groups keep the GPU side parallel.
 * A block that would not shrink is stored raw. Layout: docs/codec-format.md.
 */
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "snap/codec.h"
#include "codec_impl.h"

#define MAXG (SNAP_CODEC_BLOCK_MAX / SNAPC_GROUP)

/*
 * First candidate, vectorised: for every full group g < ng of a block,
 * q[i] = round(x/step) where that quantum decodes within the bound (same
 * operations as snapc_quant's first try, in the element's dtype), else
 * SNAPC_QOUT with bit i%32 of bad[g] set; lo[g]/hi[g] are the min/max of the
 * accepted quanta (INT32_MAX/INT32_MIN if none). Rejected lanes are redone
 * by snapc_quant, which makes the same first choice and then tries the
 * neighbours, so every level gives snapc_quant's result.
 */
struct first {
	int32_t *q;
	uint32_t *bad;
	int32_t *lo, *hi;
};

#if defined(__SSE2__)
/* es 4: f32, es 2: bf16 (f16 has no SSE2 conversion; it takes the scalar
 * path below the AVX2 level). */
static void first_sse2(const uint8_t *src, uint32_t ng, uint32_t es,
		       const struct snapc_lyq *qp, const struct first *o)
{
	const __m128 vinv = _mm_set1_ps(qp->inv), vstep = _mm_set1_ps(qp->step);
	const __m128 vbf = _mm_set1_ps(qp->bf), vhbf = _mm_set1_ps(qp->hbf);
	const __m128 lim = _mm_set1_ps(1073741824.0f), c23 = _mm_set1_ps(8388608.0f);
	const __m128 sgn = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
	const __m128i qout = _mm_set1_epi32(SNAPC_QOUT), qmax = _mm_set1_epi32(INT32_MAX);
	const __m128i r7fff = _mm_set1_epi32(0x7fff), one = _mm_set1_epi32(1);
	const __m128i hmask = _mm_set1_epi32((int)0xffff0000u);
	for (uint32_t g = 0; g < ng; g++) {
		__m128i vlo = qmax, vhi = qout;
		uint32_t bad = 0;
		for (uint32_t j = 0; j < SNAPC_GROUP; j += 4) {
			uint32_t i = g * SNAPC_GROUP + j;
			__m128 vx;
			if (es == 4) {
				vx = _mm_loadu_ps((const float *)(const void *)(src + 4 * (size_t)i));
			} else {
				__m128i h = _mm_loadl_epi64((const __m128i *)(const void *)(src + 2 * (size_t)i));
				vx = _mm_castsi128_ps(_mm_unpacklo_epi16(_mm_setzero_si128(), h));
			}
			__m128 y = _mm_mul_ps(vx, vinv);
			__m128 a = _mm_andnot_ps(sgn, y);
			__m128 r0 = _mm_sub_ps(_mm_add_ps(a, c23), c23);
			r0 = _mm_or_ps(r0, _mm_and_ps(y, sgn));
			__m128 small = _mm_cmplt_ps(a, c23);
			__m128 rq = _mm_or_ps(_mm_and_ps(small, r0), _mm_andnot_ps(small, y));
			__m128 r = _mm_mul_ps(rq, vstep);
			if (es == 2) { /* round to bf16, nearest even (r is not NaN) */
				__m128i u = _mm_castps_si128(r);
				__m128i odd = _mm_and_si128(_mm_srli_epi32(u, 16), one);
				u = _mm_add_epi32(u, _mm_add_epi32(r7fff, odd));
				r = _mm_castsi128_ps(_mm_and_si128(u, hmask));
			}
			__m128 nr = _mm_xor_ps(r, sgn);
			__m128 s = _mm_add_ps(vx, nr);
			__m128 bp = _mm_sub_ps(s, vx), ap = _mm_sub_ps(s, bp);
			__m128 e = _mm_add_ps(_mm_sub_ps(vx, ap), _mm_sub_ps(nr, bp));
			__m128 as = _mm_andnot_ps(sgn, s);
			__m128 good = _mm_and_ps(_mm_cmplt_ps(a, lim),
				_mm_or_ps(_mm_and_ps(_mm_cmple_ps(as, vbf), _mm_cmpeq_ps(e, zero)),
					  _mm_cmple_ps(as, vhbf)));
			__m128i gi = _mm_castps_si128(good);
			__m128i qi = _mm_cvttps_epi32(_mm_and_ps(rq, good));
			qi = _mm_or_si128(_mm_and_si128(gi, qi), _mm_andnot_si128(gi, qout));
			_mm_storeu_si128((__m128i *)(void *)(o->q + i), qi);
			bad |= (uint32_t)(~_mm_movemask_ps(good) & 0xf) << j;
			/* min/max of the accepted lanes (SSE2 has no pminsd) */
			__m128i ql = _mm_or_si128(_mm_and_si128(gi, qi), _mm_andnot_si128(gi, qmax));
			__m128i lt = _mm_cmplt_epi32(ql, vlo), gt = _mm_cmpgt_epi32(qi, vhi);
			vlo = _mm_or_si128(_mm_and_si128(lt, ql), _mm_andnot_si128(lt, vlo));
			vhi = _mm_or_si128(_mm_and_si128(gt, qi), _mm_andnot_si128(gt, vhi));
		}
		int32_t l[4], h[4];
		_mm_storeu_si128((__m128i *)(void *)l, vlo);
		_mm_storeu_si128((__m128i *)(void *)h, vhi);
		for (int t = 1; t < 4; t++) {
			l[0] = l[t] < l[0] ? l[t] : l[0];
			h[0] = h[t] > h[0] ? h[t] : h[0];
		}
		o->lo[g] = l[0];
		o->hi[g] = h[0];
		o->bad[g] = bad;
	}
}
#endif

#if defined(SNAPC_HAVE_AVX2)
/* The same operations eight lanes at a time; es 4 f32, es 2 with E 8 bf16,
 * E 5 f16 (F16C converts exactly like snapc_h2f / snapc_f2h, nearest even,
 * for every non-NaN value; a NaN x is rejected by the range test anyway). */
static SNAPC_AVX2_FN void first_avx2(const uint8_t *src, uint32_t ng, uint32_t es,
				     uint32_t E, const struct snapc_lyq *qp,
				     const struct first *o)
{
	const __m256 vinv = _mm256_set1_ps(qp->inv), vstep = _mm256_set1_ps(qp->step);
	const __m256 vbf = _mm256_set1_ps(qp->bf), vhbf = _mm256_set1_ps(qp->hbf);
	const __m256 lim = _mm256_set1_ps(1073741824.0f);
	const __m256 sgn = _mm256_set1_ps(-0.0f), zero = _mm256_setzero_ps();
	const __m256i qout = _mm256_set1_epi32(SNAPC_QOUT), qmax = _mm256_set1_epi32(INT32_MAX);
	const __m256i r7fff = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
	const __m256i hmask = _mm256_set1_epi32((int)0xffff0000u);
	for (uint32_t g = 0; g < ng; g++) {
		__m256i vlo = qmax, vhi = qout;
		uint32_t bad = 0;
		for (uint32_t j = 0; j < SNAPC_GROUP; j += 8) {
			uint32_t i = g * SNAPC_GROUP + j;
			__m256 vx;
			if (es == 4) {
				vx = _mm256_loadu_ps((const float *)(const void *)(src + 4 * (size_t)i));
			} else {
				__m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * (size_t)i));
				if (E == 8)
					vx = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
				else
					vx = _mm256_cvtph_ps(h);
			}
			__m256 y = _mm256_mul_ps(vx, vinv);
			__m256 a = _mm256_andnot_ps(sgn, y);
			/* rint(y): exact for |y| < 2^30 (no FMA, round to nearest even) */
			__m256 rq = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
			__m256 r = _mm256_mul_ps(rq, vstep);
			if (es == 2 && E == 8) {
				__m256i u = _mm256_castps_si256(r);
				__m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
				u = _mm256_add_epi32(u, _mm256_add_epi32(r7fff, odd));
				r = _mm256_castsi256_ps(_mm256_and_si256(u, hmask));
			} else if (es == 2) {
				r = _mm256_cvtph_ps(_mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
			}
			__m256 nr = _mm256_xor_ps(r, sgn);
			__m256 s = _mm256_add_ps(vx, nr);
			__m256 bp = _mm256_sub_ps(s, vx), ap = _mm256_sub_ps(s, bp);
			__m256 e = _mm256_add_ps(_mm256_sub_ps(vx, ap), _mm256_sub_ps(nr, bp));
			__m256 as = _mm256_andnot_ps(sgn, s);
			__m256 good = _mm256_and_ps(_mm256_cmp_ps(a, lim, _CMP_LT_OQ),
				_mm256_or_ps(_mm256_and_ps(_mm256_cmp_ps(as, vbf, _CMP_LE_OQ),
							   _mm256_cmp_ps(e, zero, _CMP_EQ_OQ)),
					     _mm256_cmp_ps(as, vhbf, _CMP_LE_OQ)));
			__m256i gi = _mm256_castps_si256(good);
			__m256i qi = _mm256_cvttps_epi32(_mm256_and_ps(rq, good));
			qi = _mm256_blendv_epi8(qout, qi, gi);
			_mm256_storeu_si256((__m256i *)(void *)(o->q + i), qi);
			bad |= (uint32_t)(~_mm256_movemask_ps(good) & 0xff) << j;
			vlo = _mm256_min_epi32(vlo, _mm256_blendv_epi8(qmax, qi, gi));
			vhi = _mm256_max_epi32(vhi, qi); /* rejected lanes hold INT32_MIN */
		}
		__m128i l = _mm_min_epi32(_mm256_castsi256_si128(vlo), _mm256_extracti128_si256(vlo, 1));
		__m128i h = _mm_max_epi32(_mm256_castsi256_si128(vhi), _mm256_extracti128_si256(vhi, 1));
		l = _mm_min_epi32(l, _mm_shuffle_epi32(l, 0x4e));
		h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0x4e));
		l = _mm_min_epi32(l, _mm_shuffle_epi32(l, 0xb1));
		h = _mm_max_epi32(h, _mm_shuffle_epi32(h, 0xb1));
		o->lo[g] = _mm_cvtsi128_si32(l);
		o->hi[g] = _mm_cvtsi128_si32(h);
		o->bad[g] = bad;
	}
}
#endif

struct gstat {
	int32_t lo, hi;
	uint32_t nout;
};

static void group_stat(const int32_t *q, uint32_t m, struct gstat *st)
{
	int32_t lo = INT32_MAX, hi = INT32_MIN;
	uint32_t nout = 0;
	for (uint32_t i = 0; i < m; i++) {
		int32_t qi = q[i], out = qi == SNAPC_QOUT;
		nout += (uint32_t)out;
		lo = out ? lo : qi < lo ? qi : lo;
		hi = out ? hi : qi > hi ? qi : hi;
	}
	st->lo = lo;
	st->hi = hi;
	st->nout = nout;
}

/* Quanta of a block: q[0..n), per group lo/hi of the accepted quanta, and
 * the outlier count of each group. */
static void quant_block(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
			const struct snapc_lyq *qp, int32_t *q, int32_t *lo,
			int32_t *hi, uint32_t *gout)
{
	const uint32_t es = dt->esize, E = dt->E;
	uint32_t ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP, nfull = n / SNAPC_GROUP;
	uint32_t bad[MAXG];
	struct first o = { q, bad, lo, hi };
	uint32_t done = 0;
	int isa = snapc_isa;
	(void)o; (void)E; (void)isa;
#if defined(SNAPC_HAVE_AVX2)
	if (isa >= SNAPC_ISA_AVX2) {
		first_avx2(src, nfull, es, E, qp, &o);
		done = nfull;
	}
#endif
#if defined(__SSE2__)
	if (!done && isa >= SNAPC_ISA_SSE2 && (es == 4 || E == 8)) {
		first_sse2(src, nfull, es, qp, &o);
		done = nfull;
	}
#endif
	for (uint32_t g = 0; g < ng; g++) {
		uint32_t i0 = g * SNAPC_GROUP;
		if (g < done) {
			uint32_t b = bad[g];
			gout[g] = 0;
			if (!b)
				continue;
			while (b) {
				uint32_t j = (uint32_t)__builtin_ctz(b);
				b &= b - 1;
				q[i0 + j] = snapc_quant(snapc_ldel(src, i0 + j, es), qp, es, E);
			}
		} else {
			uint32_t m = n - i0 < SNAPC_GROUP ? n - i0 : SNAPC_GROUP;
			for (uint32_t j = 0; j < m; j++)
				q[i0 + j] = snapc_quant(snapc_ldel(src, i0 + j, es), qp, es, E);
		}
		uint32_t m = n - i0 < SNAPC_GROUP ? n - i0 : SNAPC_GROUP;
		struct gstat st;
		group_stat(q + i0, m, &st);
		lo[g] = st.lo;
		hi[g] = st.hi;
		gout[g] = st.nout;
	}
}

int snapc_ly_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    const struct snapc_lyq *qp, uint8_t *dst, size_t cap,
		    size_t *len)
{
	const uint32_t es = dt->esize;
	int32_t q[SNAP_CODEC_BLOCK_MAX];
	int32_t gmin[MAXG], ghi[MAXG];
	uint32_t gw[MAXG], gout[MAXG];
	uint32_t ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP, nout = 0;
	uint64_t sum_w = 0;
	int32_t base = INT32_MAX;

	quant_block(src, n, dt, qp, q, gmin, ghi, gout);
	for (uint32_t g = 0; g < ng; g++) {
		int32_t lo = gmin[g], hi = ghi[g];
		nout += gout[g];
		if (lo <= hi) {
			gw[g] = snapc_bits((uint32_t)(hi - lo));
			base = lo < base ? lo : base;
		} else {
			gmin[g] = SNAPC_QOUT;
			gw[g] = 0;
		}
		sum_w += gw[g];
	}
	if (base == INT32_MAX)
		base = 0;
	uint32_t maxoff = 0;
	for (uint32_t g = 0; g < ng; g++) {
		if (gmin[g] == SNAPC_QOUT)
			gmin[g] = base;
		uint32_t off = (uint32_t)(gmin[g] - base);
		maxoff = off > maxoff ? off : maxoff;
	}
	uint32_t wb = snapc_bits(maxoff);
	uint64_t size = snapc_lossy_size(ng, wb, sum_w, nout, es);
	uint64_t raw = SNAPC_LY_HDR + (uint64_t)n * es;

	if (size >= raw) {
		if (raw > cap)
			return SNAP_EOVERFLOW;
		memset(dst, 0, SNAPC_LY_HDR);
		dst[0] = 1;
		memcpy(dst + SNAPC_LY_HDR, src, (size_t)n * es);
		*len = (size_t)raw;
		return 0;
	}
	if (size > cap)
		return SNAP_EOVERFLOW;
	const int fast = snapc_isa > SNAPC_ISA_SCALAR;
	dst[0] = 0;
	dst[1] = (uint8_t)wb;
	dst[2] = dst[3] = 0;
	snapc_st32(dst + 4, nout);
	snapc_st32(dst + 8, (uint32_t)base);
	uint8_t *p = dst + SNAPC_LY_HDR;
	for (uint32_t g = 0; g < ng; g++)
		*p++ = (uint8_t)gw[g];
	uint32_t buf[SNAPC_GROUP];
	for (uint32_t g0 = 0; g0 < ng; g0 += SNAPC_GROUP) {
		uint32_t m = ng - g0 < SNAPC_GROUP ? ng - g0 : SNAPC_GROUP;
		for (uint32_t j = 0; j < m; j++)
			buf[j] = (uint32_t)(gmin[g0 + j] - base);
		if (fast && m == SNAPC_GROUP)
			snapc_pack_tab[wb](buf, p + (size_t)g0 * wb / 8);
		else
			snapc_pack32(buf, m, wb, p + (size_t)g0 * wb / 8);
	}
	p += ((size_t)ng * wb + 7) / 8;
	uint8_t *oi = p + 4 * sum_w, *ov = oi + 2 * (size_t)nout;
	for (uint32_t i = n; i < ng * SNAPC_GROUP; i++)
		q[i] = SNAPC_QOUT; /* padding codes 0, like outliers */
	for (uint32_t g = 0; g < ng; g++) {
		const int32_t *qg = q + g * SNAPC_GROUP, gm = gmin[g];
		uint32_t w = gw[g];
		if (!w)
			continue;
		if (gout[g] || g + 1 == ng) {
			for (uint32_t j = 0; j < SNAPC_GROUP; j++)
				buf[j] = qg[j] == SNAPC_QOUT ? 0 : (uint32_t)(qg[j] - gm);
		} else {
			for (uint32_t j = 0; j < SNAPC_GROUP; j++)
				buf[j] = (uint32_t)qg[j] - (uint32_t)gm;
		}
		if (fast)
			snapc_pack_tab[w](buf, p);
		else
			snapc_pack32(buf, SNAPC_GROUP, w, p);
		p += 4 * w;
	}
	for (uint32_t g = 0; nout && g < ng; g++) {
		if (!gout[g])
			continue;
		for (uint32_t i = g * SNAPC_GROUP; i < (g + 1) * SNAPC_GROUP && i < n; i++) {
			if (q[i] != SNAPC_QOUT)
				continue;
			oi[0] = (uint8_t)i;
			oi[1] = (uint8_t)(i >> 8);
			oi += 2;
			memcpy(ov, src + (size_t)i * es, es);
			ov += es;
		}
	}
	*len = (size_t)size;
	return 0;
}

#if defined(SNAPC_HAVE_AVX2)
/* x' = dtype((float)(gb + code) * step) for a full group; the caller checks
 * that gb + code fits int32, so the int -> float rounding is the scalar one. */
static SNAPC_AVX2_FN void dequant_avx2(const uint32_t *codes, int32_t gb, float step,
				       uint32_t es, uint32_t E, uint8_t *dst)
{
	const __m256i vgb = _mm256_set1_epi32(gb), r7fff = _mm256_set1_epi32(0x7fff);
	const __m256i one = _mm256_set1_epi32(1);
	const __m256 vstep = _mm256_set1_ps(step);
	for (uint32_t j = 0; j < SNAPC_GROUP; j += 8) {
		__m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(codes + j));
		__m256 r = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(vgb, c)), vstep);
		if (es == 4) {
			_mm256_storeu_ps((float *)(void *)(dst + 4 * j), r);
		} else if (E == 8) {
			__m256i u = _mm256_castps_si256(r);
			__m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
			u = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(r7fff, odd)), 16);
			__m128i h = _mm_packus_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
			_mm_storeu_si128((__m128i *)(void *)(dst + 2 * j), h);
		} else {
			__m128i h = _mm256_cvtps_ph(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
			_mm_storeu_si128((__m128i *)(void *)(dst + 2 * j), h);
		}
	}
}
#endif

int snapc_ly_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, const struct snapc_lyq *qp,
		    uint8_t *dst)
{
	const uint32_t es = dt->esize, E = dt->E;
	const float step = qp->step;
	uint32_t ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP;

	if (len < SNAPC_LY_HDR || src[2] || src[3])
		return SNAP_ECORRUPT;
	uint32_t mode = src[0], wb = src[1], nout = snapc_ld32(src + 4);
	int32_t base = (int32_t)snapc_ld32(src + 8);
	if (mode == 1) {
		if (wb || nout || base || len != SNAPC_LY_HDR + (size_t)n * es)
			return SNAP_ECORRUPT;
		memcpy(dst, src + SNAPC_LY_HDR, (size_t)n * es);
		return 0;
	}
	if (mode != 0 || wb > 31 || nout > n || len < SNAPC_LY_HDR + (size_t)ng)
		return SNAP_ECORRUPT;
	const uint8_t *gw = src + SNAPC_LY_HDR;
	uint64_t sum_w = 0;
	for (uint32_t g = 0; g < ng; g++) {
		if (gw[g] > 31)
			return SNAP_ECORRUPT;
		sum_w += gw[g];
	}
	if (len != snapc_lossy_size(ng, wb, sum_w, nout, es))
		return SNAP_ECORRUPT;
	const uint8_t *bases = gw + ng;
	const uint8_t *p = bases + ((size_t)ng * wb + 7) / 8;
	const uint8_t *oi = p + 4 * sum_w, *ov = oi + 2 * (size_t)nout;
	uint32_t offs[SNAPC_GROUP], codes[SNAPC_GROUP];
	const int fast = snapc_isa > SNAPC_ISA_SCALAR, avx2 = snapc_isa >= SNAPC_ISA_AVX2;
	(void)avx2;
	for (uint32_t g0 = 0; g0 < ng; g0 += SNAPC_GROUP) {
		uint32_t mg = ng - g0 < SNAPC_GROUP ? ng - g0 : SNAPC_GROUP;
		if (fast && mg == SNAPC_GROUP)
			snapc_unpack_tab[wb](bases + (size_t)g0 * wb / 8, offs);
		else
			snapc_unpack32(bases + (size_t)g0 * wb / 8, mg, wb, offs);
		for (uint32_t j = 0; j < mg; j++) {
			uint32_t g = g0 + j, w = gw[g], i0 = g * SNAPC_GROUP;
			uint32_t m = n - i0 < SNAPC_GROUP ? n - i0 : SNAPC_GROUP;
			int64_t gb = (int64_t)base + offs[j];
			if (fast)
				snapc_unpack_tab[w](p, codes);
			else
				snapc_unpack32(p, SNAPC_GROUP, w, codes);
			p += 4 * w;
#if defined(SNAPC_HAVE_AVX2)
			if (avx2 && m == SNAPC_GROUP && gb >= INT32_MIN &&
			    gb + (int64_t)((1ull << w) - 1) <= INT32_MAX) {
				dequant_avx2(codes, (int32_t)gb, step, es, E, dst + (size_t)i0 * es);
				continue;
			}
#endif
			if (es == 4) {
				for (uint32_t t = 0; t < m; t++) {
					float r = (float)(gb + codes[t]) * step;
					memcpy(dst + 4 * (size_t)(i0 + t), &r, 4);
				}
			} else {
				for (uint32_t t = 0; t < m; t++)
					snapc_stel(dst, i0 + t, es,
						   snapc_dequant(gb + codes[t], step, es, E));
			}
		}
	}
	uint32_t prev = 0;
	for (uint32_t o = 0; o < nout; o++) {
		uint32_t i = (uint32_t)oi[2 * o] | (uint32_t)oi[2 * o + 1] << 8;
		if (i >= n || (o && i <= prev))
			return SNAP_ECORRUPT;
		prev = i;
		memcpy(dst + (size_t)i * es, ov + (size_t)o * es, es);
	}
	return 0;
}
