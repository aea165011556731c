/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pack.c - fixed-width bit packing of 32-value chunks, one unrolled routine
 * per width (the shifts fold into constants, no branches), and the run-time
 * choice of the SIMD level of the C twin's fast paths.
 *
 * snapc_pack_tab[w] writes the same 4*w bytes as snapc_pack32(in, 32, w)
 * (codec_core.h); snapc_unpack_tab[w] reads them back like snapc_unpack32.
 */
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "codec_impl.h"

static inline __attribute__((always_inline)) void pack_body(const uint32_t *in,
							     uint8_t *dst,
							     const uint32_t w)
{
	uint64_t acc = 0;
	uint32_t nb = 0;
#pragma GCC unroll 32
	for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
		acc |= (uint64_t)in[j] << nb;
		nb += w;
		if (nb >= 32) {
			uint32_t v = (uint32_t)acc;
			memcpy(dst, &v, 4);
			dst += 4;
			acc >>= 32;
			nb -= 32;
		}
	}
}

static inline __attribute__((always_inline)) void unpack_body(const uint8_t *src,
							       uint32_t *out,
							       const uint32_t w)
{
	const uint32_t mask = (uint32_t)((1ull << w) - 1);
	uint64_t acc = 0;
	uint32_t nb = 0;
#pragma GCC unroll 32
	for (uint32_t j = 0; j < SNAPC_GROUP; j++) {
		if (nb < w) {
			uint32_t v;
			memcpy(&v, src, 4);
			src += 4;
			acc |= (uint64_t)v << nb;
			nb += 32;
		}
		out[j] = (uint32_t)acc & mask;
		acc >>= w;
		nb -= w;
	}
}

static void pack_0(const uint32_t *in, uint8_t *dst) { (void)in; (void)dst; }
static void unpack_0(const uint8_t *src, uint32_t *out)
{
	(void)src;
	memset(out, 0, SNAPC_GROUP * sizeof(*out));
}

#define PW(W)                                                                  \
	static void pack_##W(const uint32_t *in, uint8_t *dst) { pack_body(in, dst, W); } \
	static void unpack_##W(const uint8_t *src, uint32_t *out) { unpack_body(src, out, W); }
PW(1) PW(2) PW(3) PW(4) PW(5) PW(6) PW(7) PW(8) PW(9) PW(10) PW(11) PW(12)
PW(13) PW(14) PW(15) PW(16) PW(17) PW(18) PW(19) PW(20) PW(21) PW(22) PW(23)
PW(24) PW(25) PW(26) PW(27) PW(28) PW(29) PW(30) PW(31)
#undef PW

void (*const snapc_pack_tab[32])(const uint32_t *, uint8_t *) = {
	pack_0, pack_1, pack_2, pack_3, pack_4, pack_5, pack_6, pack_7,
	pack_8, pack_9, pack_10, pack_11, pack_12, pack_13, pack_14, pack_15,
	pack_16, pack_17, pack_18, pack_19, pack_20, pack_21, pack_22, pack_23,
	pack_24, pack_25, pack_26, pack_27, pack_28, pack_29, pack_30, pack_31,
};

void (*const snapc_unpack_tab[32])(const uint8_t *, uint32_t *) = {
	unpack_0, unpack_1, unpack_2, unpack_3, unpack_4, unpack_5, unpack_6, unpack_7,
	unpack_8, unpack_9, unpack_10, unpack_11, unpack_12, unpack_13, unpack_14, unpack_15,
	unpack_16, unpack_17, unpack_18, unpack_19, unpack_20, unpack_21, unpack_22, unpack_23,
	unpack_24, unpack_25, unpack_26, unpack_27, unpack_28, unpack_29, unpack_30, unpack_31,
};

/* ---- SIMD level ------------------------------------------------------ */

int snapc_isa_detected = SNAPC_ISA_SCALAR;
int snapc_isa = SNAPC_ISA_SCALAR;

__attribute__((constructor)) static void snapc_isa_init(void)
{
	int lvl = SNAPC_ISA_SCALAR;
#if defined(__SSE2__)
	lvl = SNAPC_ISA_SSE2;
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
	unsigned a, b, c, d;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) &&
	    (c & (1u << 29))) /* F16C */
		lvl = SNAPC_ISA_AVX2;
#endif
	snapc_isa_detected = snapc_isa = lvl;
}

int snapc_set_isa(int level)
{
	if (level < SNAPC_ISA_SCALAR)
		level = SNAPC_ISA_SCALAR;
	if (level > snapc_isa_detected)
		level = snapc_isa_detected;
	snapc_isa = level;
	return level;
}
