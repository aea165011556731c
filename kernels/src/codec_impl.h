/* SPDX-License-Identifier: BSD-3-Clause */
/* codec_impl.h - block coders of the C twin, shared by codec.c. */
#ifndef SNAP_CODEC_IMPL_H
#define SNAP_CODEC_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "codec_core.h"

/* Encode n (1..SNAP_CODEC_BLOCK_MAX) values at src into at most cap bytes;
 * *len gets the block size. 0 or SNAP_EOVERFLOW. */
int snapc_ll_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    uint8_t *dst, size_t cap, size_t *len);
/* Decode a block of exactly len bytes into n values. 0 or SNAP_ECORRUPT. */
int snapc_ll_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, uint8_t *dst);

int snapc_ly_encode(const uint8_t *src, uint32_t n, const struct snapc_dt *dt,
		    const struct snapc_lyq *qp, uint8_t *dst, size_t cap,
		    size_t *len);
int snapc_ly_decode(const uint8_t *src, size_t len, uint32_t n,
		    const struct snapc_dt *dt, const struct snapc_lyq *qp,
		    uint8_t *dst);

/* Fixed-width packing of one full 32-value chunk (4*w bytes), w = 0..31:
 * the bytes of snapc_pack32(in, 32, w, dst) / snapc_unpack32(src, 32, w, out). */
extern void (*const snapc_pack_tab[32])(const uint32_t *, uint8_t *);
extern void (*const snapc_unpack_tab[32])(const uint8_t *, uint32_t *);

/* SIMD level of the C twin's fast paths, chosen at load time. Every level
 * writes the same bytes; SCALAR is the plain reference (snapc_quant,
 * snapc_pack32). snapc_set_isa (tests) picks a level up to the detected one
 * and returns the level set; not thread-safe against running coders. */
enum { SNAPC_ISA_SCALAR = 0, SNAPC_ISA_SSE2 = 1, SNAPC_ISA_AVX2 = 2 /* + F16C */ };
extern int snapc_isa, snapc_isa_detected;
int snapc_set_isa(int level);

/* The AVX2 (+F16C) fast paths are compiled on x86-64 with GCC/clang as
 * functions of their own target, whatever the baseline of the build, and
 * run only when snapc_isa says so. */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define SNAPC_HAVE_AVX2 1
#define SNAPC_AVX2_FN __attribute__((target("avx2,f16c")))
#endif

#endif
