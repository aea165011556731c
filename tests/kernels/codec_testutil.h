/* SPDX-License-Identifier: BSD-3-Clause */
/* codec_testutil.h - shared helpers of the codec tests: checks, a seeded RNG and
 * the array generators (ordinary, adversarial) in f32 bits. */
#ifndef SNAP_KERNELS_TESTUTIL_H
#define SNAP_KERNELS_TESTUTIL_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tu_failures __attribute__((unused));

#define CHECK(cond, ...) do { \
	if (!(cond)) { \
		tu_failures++; \
		fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
		fprintf(stderr, __VA_ARGS__); \
		fputc('\n', stderr); \
		if (tu_failures > 20) exit(1); \
	} \
} while (0)

static uint64_t tu_rng = 0x9e3779b97f4a7c15ull;
static inline uint64_t tu_next(void)
{
	uint64_t x = tu_rng;
	x ^= x << 13; x ^= x >> 7; x ^= x << 17;
	return tu_rng = x;
}
static inline double tu_unif(void) { return (double)(tu_next() >> 11) / 9007199254740992.0; }
static inline double tu_gauss(void)
{
	double u = tu_unif() + 1e-300, v = tu_unif();
	return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static inline float tu_bits2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

enum { GEN_CONST, GEN_ZERO, GEN_RAMP, GEN_GAUSS, GEN_RANDBITS, GEN_SPECIAL,
       GEN_HUGE, GEN_MIXED, GEN_DENORM, GEN_COUNT };
static const char *const tu_gen_name[GEN_COUNT] = {
	"const", "zero", "ramp", "gauss", "randbits", "special", "huge", "mixed", "denorm" };

/* Fill n f32 values of kind g. */
static inline void tu_gen(int g, float *x, size_t n)
{
	static const uint32_t sp[] = { 0x7fc00000u, 0xffc00001u, 0x7f800001u, 0x7f800000u,
		0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u, 0x007fffffu,
		0x00800000u, 0x80000000u, 0x00000000u, 0x4cbebc20u /* 1e8 */, 0x3a83126fu };
	float c = (float)(tu_gauss() * 3.0);
	for (size_t i = 0; i < n; i++) {
		switch (g) {
		case GEN_CONST: x[i] = c; break;
		case GEN_ZERO: x[i] = 0.0f; break;
		case GEN_RAMP: x[i] = -3.0f + 0.001f * (float)i; break;
		case GEN_GAUSS: x[i] = (float)(tu_gauss() * 0.05); break;
		case GEN_RANDBITS: x[i] = tu_bits2f((uint32_t)tu_next()); break;
		case GEN_SPECIAL: x[i] = tu_bits2f(sp[tu_next() % (sizeof(sp) / 4)]); break;
		case GEN_HUGE: x[i] = (float)(tu_gauss() * 1e12); break;
		case GEN_MIXED:
			x[i] = (tu_next() % 50) ? (float)(tu_gauss() * 0.1)
						: tu_bits2f(sp[tu_next() % (sizeof(sp) / 4)]);
			break;
		case GEN_DENORM: x[i] = tu_bits2f((uint32_t)(tu_next() & 0x807fffffu)); break;
		}
	}
}

#endif
