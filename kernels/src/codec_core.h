/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codec_core.h - the rules the C twin and the CUDA kernels must apply
 * identically: dtype layout, rounding conversions, the quantization decision
 * of the lossy codec, the exponent-table choice of the lossless codec and
 * the byte layout constants. Compiled as C11 and as CUDA (__host__
 * __device__), so one definition decides every byte on both sides.
 *
 * Floating-point here must not be contracted into FMAs (the build passes
 * -ffp-contract=off to the C compiler and --fmad=false to nvcc): a fused
 * multiply-add rounds once where the other side rounds twice.
 */
#ifndef SNAP_CODEC_CORE_H
#define SNAP_CODEC_CORE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define SNAP_HD static __host__ __device__ __forceinline__
#else
#define SNAP_HD static inline
#endif

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "snap codecs assume a little-endian host"
#endif

#define SNAPC_MAGIC 0x43504e53u /* "SNPC" */
#define SNAPC_GROUP 32u         /* values per chunk/group: one GPU thread each */
#define SNAPC_LL_HDR 8u         /* lossless block header bytes */
#define SNAPC_LY_HDR 12u        /* lossy block header bytes */
#define SNAPC_BLOCK_SLACK 16u   /* block_max = SLACK + n * esize */
#define SNAPC_QLIM 1073741824   /* |q| < 2^30 */
#define SNAPC_QOUT INT32_MIN    /* marks an outlier in a q array */

/* dtype geometry: E exponent bits, M mantissa bits; rest = sign:mantissa. */
struct snapc_dt {
	uint32_t esize, E, M;
};

SNAP_HD int snapc_dt_of(int dtype, struct snapc_dt *d)
{
	switch (dtype) {
	case 7: d->esize = 4; d->E = 8; d->M = 23; return 0;  /* F32 */
	case 6: d->esize = 2; d->E = 8; d->M = 7; return 0;   /* BF16 */
	case 5: d->esize = 2; d->E = 5; d->M = 10; return 0;  /* F16 */
	default: return -1;
	}
}

SNAP_HD uint32_t snapc_bits(uint32_t v) /* bits needed for v (0 -> 0) */
{
#if defined(__CUDA_ARCH__)
	return 32u - (uint32_t)__clz(v);
#elif defined(__GNUC__)
	return v ? 32u - (uint32_t)__builtin_clz(v) : 0u;
#else
	uint32_t n = 0;
	while (v) { n++; v >>= 1; }
	return n;
#endif
}

SNAP_HD float snapc_u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
SNAP_HD uint32_t snapc_f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

SNAP_HD float snapc_h2f(uint32_t h)
{
	uint32_t s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0x1f)
		return snapc_u2f(s | 0x7f800000u | (m << 13));
	if (e == 0) {
		if (m == 0)
			return snapc_u2f(s);
		e = 113; /* normalise the subnormal: 2^-14 * m/1024 */
		while (!(m & 0x400)) { m <<= 1; e--; }
		m &= 0x3ff;
		return snapc_u2f(s | (e << 23) | (m << 13));
	}
	return snapc_u2f(s | ((e + 112) << 23) | (m << 13));
}

SNAP_HD uint32_t snapc_f2h(float f) /* round to nearest even */
{
	uint32_t u = snapc_f2u(f), s = (u >> 16) & 0x8000u;
	uint32_t a = u & 0x7fffffffu;
	if (a >= 0x7f800000u) /* Inf, NaN (quieted, payload top bits kept) */
		return s | 0x7c00u | (a > 0x7f800000u ? 0x200u | ((a >> 13) & 0x3ff) : 0);
	if (a >= 0x477ff000u) /* >= 65520 rounds to Inf */
		return s | 0x7c00u;
	if (a < 0x38800000u) { /* below 2^-14: subnormal or zero */
		uint32_t e = a >> 23;
		if (e < 102) /* < 2^-25: rounds to 0 (2^-25 exactly ties to 0) */
			return s;
		uint32_t m = (a & 0x7fffffu) | 0x800000u;
		uint32_t sh = 126 - e; /* 14..24 */
		uint32_t r = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
		if (rem > half || (rem == half && (r & 1)))
			r++;
		return s | r;
	}
	uint32_t r = a - 0x38000000u; /* rebias exponent 127 -> 15 */
	uint32_t h = r >> 13, rem = r & 0x1fff;
	if (rem > 0x1000 || (rem == 0x1000 && (h & 1)))
		h++;
	return s | h;
}

SNAP_HD float snapc_b2f(uint32_t b) { return snapc_u2f(b << 16); }

SNAP_HD uint32_t snapc_f2b(float f) /* round to nearest even */
{
	uint32_t u = snapc_f2u(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)
		return (u >> 16) | 0x40u;
	return (u + 0x7fffu + ((u >> 16) & 1)) >> 16;
}

/* Raw element bits (as stored) -> float, and float -> element bits. */
SNAP_HD float snapc_to_f32(uint32_t bits, uint32_t esize, uint32_t E)
{
	if (esize == 4) return snapc_u2f(bits);
	return E == 8 ? snapc_b2f(bits) : snapc_h2f(bits);
}

SNAP_HD uint32_t snapc_from_f32(float f, uint32_t esize, uint32_t E)
{
	if (esize == 4) return snapc_f2u(f);
	return E == 8 ? snapc_f2b(f) : snapc_f2h(f);
}

/* ---- lossy: quantization decision ------------------------------------ */

/* Quantizer constants, all derived from the header's bound by snapc_step:
 * step = largest float <= 2*bound, inv = 1/step, bf = largest float <= bound,
 * hbf = largest float <= bound/2. */
struct snapc_lyq {
	float step, inv, bf, hbf;
	double bound;
};

SNAP_HD float snapc_down(double v) /* largest float <= v (v >= 0, finite) */
{
	float f = (float)v;
	if ((double)f > v)
		f = nextafterf(f, 0.0f);
	return f;
}

/* 0 and q filled for a bound in (0, 1e300) whose 2*bound is at least the
 * smallest normal float, else -1 and q untouched. Larger bounds cap the step
 * at FLT_MAX (snapc_down never returns Inf). */
SNAP_HD int snapc_step(double bound, struct snapc_lyq *q)
{
	if (!(bound > 0.0) || !(bound < 1.0e300))
		return -1;
	float f = snapc_down(2.0 * bound);
	if (!(f >= 1.17549435e-38f)) /* 2*bound under the smallest normal */
		return -1;
	q->step = f;
	q->inv = 1.0f / f;
	q->bf = snapc_down(bound);
	q->hbf = snapc_down(0.5 * bound);
	q->bound = bound;
	return 0;
}

/* Round to nearest even for |y| < 2^30 without libm (rintf is a call on
 * baseline x86-64): adding 2^23 pushes the fraction out in the FPU's
 * rounding; floats >= 2^23 are integers already. */
SNAP_HD float snapc_rint(float y)
{
	float a = fabsf(y);
	float r = (a + 8388608.0f) - 8388608.0f;
	return a < 8388608.0f ? copysignf(r, y) : y;
}

/* |x - r| <= bound, decided exactly: TwoSum gives s + e == x - r exactly;
 * an exact difference (e == 0) is compared with the largest float <= bound
 * (equivalent for a float s); an inexact one is accepted only if |s| is
 * within half the bound. Inf/NaN compare false. */
SNAP_HD int snapc_within(float x, float r, const struct snapc_lyq *q)
{
	float nr = -r, s = x + nr;
	float bp = s - x, ap = s - bp;
	float e = (x - ap) + (nr - bp);
	float as = fabsf(s);
	return (as <= q->bf && e == 0.0f) || as <= q->hbf;
}

/* Decoded value of quantum q, as element bits. */
SNAP_HD uint32_t snapc_dequant(int64_t q, float step, uint32_t esize, uint32_t E)
{
	return snapc_from_f32((float)q * step, esize, E);
}

/* Quantum for element bits v, or SNAPC_QOUT when v must be an outlier.
 * Tries round(x/step) then its two neighbours; the first whose decoded value
 * (in the element's dtype) is within the bound wins. */
SNAP_HD int32_t snapc_quant(uint32_t v, const struct snapc_lyq *qp,
			    uint32_t esize, uint32_t E)
{
	float x = snapc_to_f32(v, esize, E);
	float y = x * qp->inv;
	if (!(fabsf(y) < 1073741824.0f)) /* NaN, Inf, too large */
		return SNAPC_QOUT;
	int32_t q0 = (int32_t)snapc_rint(y);
	for (int t = 0; t < 3; t++) {
		int32_t q = q0 + (t == 0 ? 0 : t == 1 ? -1 : 1);
		if (q <= -SNAPC_QLIM || q >= SNAPC_QLIM)
			continue;
		float r = snapc_to_f32(snapc_dequant(q, qp->step, esize, E), esize, E);
		if (snapc_within(x, r, qp))
			return q;
	}
	return SNAPC_QOUT;
}

/* ---- lossless: exponent table choice --------------------------------- */

/* Given the nonzero exponent counts sorted by (count desc, exponent asc) in
 * c[0..distinct), n values and E exponent bits, pick the code width k and
 * table size T minimising the block's exponent bytes: k == E stores raw
 * exponents (T = 0); k == 0 needs a single exponent (T = 1); otherwise T =
 * min(2^k - 1, distinct) symbols get codes 0..T-1 and 2^k - 1 escapes to a
 * raw exponent byte. Ties go to the larger k tried first (raw). */
SNAP_HD void snapc_choose_k(const uint32_t *c, uint32_t distinct, uint32_t n,
			    uint32_t E, uint32_t *k_out, uint32_t *T_out)
{
	uint32_t bk = E, bT = 0;
	uint64_t best = ((uint64_t)n * E + 7) / 8;
	if (distinct == 1 && 1 < best) { best = 1; bk = 0; bT = 1; }
	uint32_t covered = 0, t = 0;
	for (uint32_t k = 1; k < E; k++) {
		uint32_t T = (1u << k) - 1;
		if (T > distinct) T = distinct;
		while (t < T) covered += c[t++];
		uint64_t cost = ((uint64_t)n * k + 7) / 8 + T + (n - covered);
		if (cost < best) { best = cost; bk = k; bT = T; }
	}
	*k_out = bk;
	*T_out = bT;
}

/* ---- little-endian helpers ------------------------------------------- */

SNAP_HD uint32_t snapc_ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
SNAP_HD uint64_t snapc_ld64(const uint8_t *p)
{
	return (uint64_t)snapc_ld32(p) | (uint64_t)snapc_ld32(p + 4) << 32;
}
SNAP_HD void snapc_st32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); p[2] = (uint8_t)(v >> 16); p[3] = (uint8_t)(v >> 24);
}
SNAP_HD void snapc_st64(uint8_t *p, uint64_t v)
{
	snapc_st32(p, (uint32_t)v);
	snapc_st32(p + 4, (uint32_t)(v >> 32));
}
/* Element bits at index i of an element array (any alignment). */
SNAP_HD uint32_t snapc_ldel(const uint8_t *p, size_t i, uint32_t esize)
{
	p += i * esize;
	return esize == 4 ? snapc_ld32(p) : (uint32_t)p[0] | (uint32_t)p[1] << 8;
}
SNAP_HD void snapc_stel(uint8_t *p, size_t i, uint32_t esize, uint32_t v)
{
	p += i * esize;
	if (esize == 4) snapc_st32(p, v);
	else { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
}

/* Pack m <= 32 values of w <= 31 bits (each < 2^w), LSB first, into exactly
 * ceil(m*w/8) bytes at dst. 32 values of w bits fill 4*w bytes, so chunks of
 * 32 stay byte-aligned and can be packed independently (one GPU thread). */
SNAP_HD void snapc_pack32(const uint32_t *in, uint32_t m, uint32_t w, uint8_t *dst)
{
	uint64_t acc = 0;
	uint32_t nb = 0, o = 0;
	if (w == 0)
		return;
	for (uint32_t j = 0; j < m; j++) {
		acc |= (uint64_t)in[j] << nb;
		nb += w;
		if (nb >= 32) {
			snapc_st32(dst + o, (uint32_t)acc);
			o += 4;
			acc >>= 32;
			nb -= 32;
		}
	}
	while (nb > 0) {
		dst[o++] = (uint8_t)acc;
		acc >>= 8;
		nb = nb > 8 ? nb - 8 : 0;
	}
}

/* snapc_pack32 for a full chunk of 32 values (4*w bytes), without the
 * unpredictable flush branch: every step stores the pending word (always
 * inside the 4*w bytes) and advances only when it is full. */
SNAP_HD void snapc_pack32_full(const uint32_t *in, uint32_t w, uint8_t *dst)
{
	uint64_t acc = 0;
	uint32_t nb = 0, o = 0;
	if (w == 0)
		return;
	for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
		acc |= (uint64_t)in[j] << nb;
		nb += w;
		snapc_st32(dst + o, (uint32_t)acc);
		uint32_t full = nb >= 32;
		o += 4 * full;
		acc >>= 32 * full;
		nb -= 32 * full;
	}
}

/* Inverse of snapc_pack32: reads exactly ceil(m*w/8) bytes. */
SNAP_HD void snapc_unpack32(const uint8_t *src, uint32_t m, uint32_t w, uint32_t *out)
{
	uint32_t buf[34];
	uint32_t nbytes = (m * w + 7) / 8, nw = nbytes / 4, j;
	if (w == 0) {
		for (j = 0; j < m; j++) out[j] = 0;
		return;
	}
	for (j = 0; j < nw; j++) buf[j] = snapc_ld32(src + 4 * j);
	buf[nw] = 0;
	for (j = 4 * nw; j < nbytes; j++) buf[nw] |= (uint32_t)src[j] << (8 * (j - 4 * nw));
	for (j = nw + 1; j < 34; j++) buf[j] = 0;
	uint32_t mask = (uint32_t)((1ull << w) - 1);
	for (j = 0; j < m; j++) {
		uint32_t bit = j * w, lo = bit >> 5;
		uint64_t x = ((uint64_t)buf[lo + 1] << 32 | buf[lo]) >> (bit & 31);
		out[j] = (uint32_t)x & mask;
	}
}

/* Lossy block size in bytes for the quantized layout. */
SNAP_HD uint64_t snapc_lossy_size(uint32_t ng, uint32_t wb, uint64_t sum_w,
				  uint32_t nout, uint32_t esize)
{
	return SNAPC_LY_HDR + ng + ((uint64_t)ng * wb + 7) / 8 + 4 * sum_w +
	       (uint64_t)nout * (2 + esize);
}

#endif /* SNAP_CODEC_CORE_H */
