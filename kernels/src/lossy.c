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

#include "snap/codec.h"
#include "codec_impl.h"

#define MAXG (SNAP_CODEC_BLOCK_MAX / SNAPC_GROUP)

int snapc_ly_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    const struct snapc_lyq *qp, uint8_t *dst, size_t cap,
		    size_t *len)
{
	const uint32_t es = dt->esize, E = dt->E;
	const float step = qp->step, inv = qp->inv;
	const double bound = qp->bound;
	int32_t q[SNAP_CODEC_BLOCK_MAX];
	int32_t gmin[MAXG];
	uint32_t gw[MAXG];
	uint32_t ng = (n + SNAPC_GROUP - 1) / SNAPC_GROUP, nout = 0;
	uint64_t sum_w = 0;
	int32_t base = INT32_MAX;

	for (uint32_t g = 0; g < ng; g++) {
		uint32_t i0 = g * SNAPC_GROUP, i1 = i0 + SNAPC_GROUP < n ? i0 + SNAPC_GROUP : n;
		int32_t lo = INT32_MAX, hi = INT32_MIN;
		for (uint32_t i = i0; i < i1; i++) {
			int32_t qi = snapc_quant(snapc_ldel(src, i, es), step, inv, bound, es, E);
			q[i] = qi;
			if (qi == SNAPC_QOUT) {
				nout++;
				continue;
			}
			lo = qi < lo ? qi : lo;
			hi = qi > hi ? qi : hi;
		}
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
	for (uint32_t g = 0; g < ng; g++) {
		uint32_t i0 = g * SNAPC_GROUP;
		for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
			uint32_t i = i0 + j;
			if (i >= n || q[i] == SNAPC_QOUT) {
				buf[j] = 0;
				if (i < n) {
					oi[0] = (uint8_t)i;
					oi[1] = (uint8_t)(i >> 8);
					oi += 2;
					memcpy(ov, src + (size_t)i * es, es);
					ov += es;
				}
			} else {
				buf[j] = (uint32_t)(q[i] - gmin[g]);
			}
		}
		snapc_pack32(buf, SNAPC_GROUP, gw[g], p);
		p += 4 * gw[g];
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
