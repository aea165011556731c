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

int snapc_ll_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    uint8_t *dst, size_t cap, size_t *len)
{
	const uint32_t E = dt->E, M = dt->M, R = M + 1, es = dt->esize;
	const uint32_t emask = (1u << E) - 1, mmask = (1u << M) - 1;
	uint32_t hist[256] = {0}, cnt[256];
	uint8_t sym[256], map[256];
	uint32_t i;

	if (es == 4)
		hist4(src, n, 4, 23, 0xff, hist);
	else
		hist4(src, n, 2, M, emask, hist);
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
	if (snapc_isa > SNAPC_ISA_SCALAR) {
		uint32_t nfull = n / SNAPC_GROUP * SNAPC_GROUP;
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
	if (snapc_isa > SNAPC_ISA_SCALAR) {
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
