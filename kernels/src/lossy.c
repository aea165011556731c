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

/* Same bytes as snapc_pack32_full. Eight values of w bits fill exactly w
 * bytes, so the group is packed as four independent 8-value chains (the
 * single shift/or chain is latency-bound) into scratch, then copied. */
static void pack32_4way(const uint32_t *in, uint32_t w, uint8_t *dst, int spill_ok)
{
	uint8_t lb[4][40];
	uint64_t acc[4] = {0, 0, 0, 0};
	uint32_t nb[4] = {0, 0, 0, 0}, o[4] = {0, 0, 0, 0};
	if (w == 0)
		return;
	for (uint32_t t = 0; t < 8; t++) {
		for (uint32_t c = 0; c < 4; c++) {
			acc[c] |= (uint64_t)in[8 * c + t] << nb[c];
			nb[c] += w;
			snapc_st32(lb[c] + o[c], (uint32_t)acc[c]);
			uint32_t full = nb[c] >= 32;
			o[c] += 4 * full;
			acc[c] >>= 32 * full;
			nb[c] -= 32 * full;
		}
	}
	/* spill_ok: at least 32 bytes of later groups' codes follow, which are
	 * written after this one, so fixed-size copies may overrun into them. */
	for (uint32_t c = 0; c < 4; c++) {
		snapc_st32(lb[c] + o[c], (uint32_t)acc[c]);
		if (spill_ok)
			memcpy(dst + c * w, lb[c], 32);
		else
			memcpy(dst + c * w, lb[c], w);
	}
}

/* Quanta of m <= 32 values. f32 takes a branch-free first pass the compiler
 * vectorises (round(x/step) accepted as is); values it rejects, and the
 * 16-bit dtypes, go through snapc_quant, which makes the same first choice
 * and then tries the neighbours. */
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

static void quant_group(const uint8_t *src, uint32_t m, const struct snapc_dt *dt,
			const struct snapc_lyq *qp, int32_t *q, struct gstat *st)
{
	if (dt->esize == 4) {
		int32_t ok[SNAPC_GROUP], redo = 0;
		uint32_t j = 0;
		const float inv = qp->inv, step = qp->step, bf = qp->bf, hbf = qp->hbf;
#if defined(__SSE2__)
		/* The same operations as below, four lanes at a time. */
		const __m128 vinv = _mm_set1_ps(inv), vstep = _mm_set1_ps(step);
		const __m128 vbf = _mm_set1_ps(bf), vhbf = _mm_set1_ps(hbf);
		const __m128 lim = _mm_set1_ps(1073741824.0f), c23 = _mm_set1_ps(8388608.0f);
		const __m128 sgn = _mm_set1_ps(-0.0f), zero = _mm_setzero_ps();
		const __m128i qout = _mm_set1_epi32(SNAPC_QOUT), qmax = _mm_set1_epi32(INT32_MAX);
		__m128i vlo = qmax, vhi = qout;
		for (; j + 4 <= m; j += 4) {
			__m128 vx = _mm_loadu_ps((const float *)(const void *)(src + 4 * j));
			__m128 y = _mm_mul_ps(vx, vinv);
			__m128 a = _mm_andnot_ps(sgn, y);
			__m128 r0 = _mm_sub_ps(_mm_add_ps(a, c23), c23);
			r0 = _mm_or_ps(r0, _mm_and_ps(y, sgn));
			__m128 small = _mm_cmplt_ps(a, c23);
			__m128 rq = _mm_or_ps(_mm_and_ps(small, r0), _mm_andnot_ps(small, y));
			__m128 nr = _mm_xor_ps(_mm_mul_ps(rq, vstep), sgn);
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
			_mm_storeu_si128((__m128i *)(q + j), qi);
			_mm_storeu_si128((__m128i *)(ok + j), gi);
			redo |= _mm_movemask_ps(good) != 0xf;
			/* min/max of the accepted lanes (SSE2 has no pminsd) */
			__m128i ql = _mm_or_si128(_mm_and_si128(gi, qi), _mm_andnot_si128(gi, qmax));
			__m128i lt = _mm_cmplt_epi32(ql, vlo), gt = _mm_cmpgt_epi32(qi, vhi);
			vlo = _mm_or_si128(_mm_and_si128(lt, ql), _mm_andnot_si128(lt, vlo));
			vhi = _mm_or_si128(_mm_and_si128(gt, qi), _mm_andnot_si128(gt, vhi));
		}
		if (j == m && !redo) {
			int32_t l[4], h[4];
			_mm_storeu_si128((__m128i *)l, vlo);
			_mm_storeu_si128((__m128i *)h, vhi);
			st->lo = l[0]; st->hi = h[0];
			for (int t = 1; t < 4; t++) {
				st->lo = l[t] < st->lo ? l[t] : st->lo;
				st->hi = h[t] > st->hi ? h[t] : st->hi;
			}
			st->nout = 0;
			return;
		}
#endif
		for (; j < m; j++) {
			float x = snapc_u2f(snapc_ld32(src + 4 * j));
			float y = x * inv, a = fabsf(y);
			float rq = snapc_rint(y), r = rq * step;
			float nr = -r, s = x + nr, bp = s - x, ap = s - bp;
			float e = (x - ap) + (nr - bp), as = fabsf(s);
			int32_t good = (a < 1073741824.0f) & (((as <= bf) & (e == 0.0f)) | (as <= hbf));
			float rs = good ? rq : 0.0f;
			q[j] = good ? (int32_t)rs : SNAPC_QOUT;
			ok[j] = good;
			redo |= !good;
		}
		if (redo)
			for (uint32_t j = 0; j < m; j++)
				if (!ok[j])
					q[j] = snapc_quant(snapc_ldel(src, j, 4), qp, 4, 8);
		group_stat(q, m, st);
		return;
	}
	for (uint32_t j = 0; j < m; j++)
		q[j] = snapc_quant(snapc_ldel(src, j, dt->esize), qp, dt->esize, dt->E);
	group_stat(q, m, st);
}

int snapc_ly_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    const struct snapc_lyq *qp, uint8_t *dst, size_t cap,
		    size_t *len)
{
	const uint32_t es = dt->esize;
	int32_t q[SNAP_CODEC_BLOCK_MAX];
	int32_t gmin[MAXG];
	uint32_t gw[MAXG];
	uint32_t ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP, nout = 0;
	uint64_t sum_w = 0;
	int32_t base = INT32_MAX;

	for (uint32_t g = 0; g < ng; g++) {
		uint32_t i0 = g * SNAPC_GROUP, i1 = i0 + SNAPC_GROUP < n ? i0 + SNAPC_GROUP : n;
		struct gstat st;
		quant_group(src + (size_t)i0 * es, i1 - i0, dt, qp, q + i0, &st);
		int32_t lo = st.lo, hi = st.hi;
		nout += st.nout;
		if (lo <= hi) {
			gmin[g] = lo;
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
		snapc_pack32(buf, m, wb, p + (size_t)g0 * wb / 8);
	}
	p += ((size_t)ng * wb + 7) / 8;
	uint8_t *oi = p + 4 * sum_w, *ov = oi + 2 * (size_t)nout;
	const uint8_t *codes_end = oi;
	for (uint32_t i = n; i < ng * SNAPC_GROUP; i++)
		q[i] = SNAPC_QOUT; /* padding codes 0, like outliers */
	for (uint32_t g = 0; g < ng; g++) {
		const int32_t *qg = q + g * SNAPC_GROUP, gm = gmin[g];
		for (uint32_t j = 0; j < SNAPC_GROUP; j++)
			buf[j] = qg[j] == SNAPC_QOUT ? 0 : (uint32_t)(qg[j] - gm);
		pack32_4way(buf, gw[g], p, p + 4 * gw[g] + 32 <= codes_end);
		p += 4 * gw[g];
	}
	for (uint32_t i = 0; nout && i < n; i++) {
		if (q[i] != SNAPC_QOUT)
			continue;
		oi[0] = (uint8_t)i;
		oi[1] = (uint8_t)(i >> 8);
		oi += 2;
		memcpy(ov, src + (size_t)i * es, es);
		ov += es;
	}
	*len = (size_t)size;
	return 0;
}

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
	for (uint32_t g0 = 0; g0 < ng; g0 += SNAPC_GROUP) {
		uint32_t mg = ng - g0 < SNAPC_GROUP ? ng - g0 : SNAPC_GROUP;
		snapc_unpack32(bases + (size_t)g0 * wb / 8, mg, wb, offs);
		for (uint32_t j = 0; j < mg; j++) {
			uint32_t g = g0 + j, w = gw[g], i0 = g * SNAPC_GROUP;
			uint32_t m = n - i0 < SNAPC_GROUP ? n - i0 : SNAPC_GROUP;
			int64_t gb = (int64_t)base + offs[j];
			snapc_unpack32(p, SNAPC_GROUP, w, codes);
			p += 4 * w;
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
