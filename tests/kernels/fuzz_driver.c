/* SPDX-License-Identifier: BSD-3-Clause */
/* Random-mutation driver: runs the fuzz entry point on mutated seed streams
 * (byte flips, truncations, splices, header lies) for a number of seconds,
 * so the decoders are exercised under ASan in any build, gcc included.
 * Usage: test_codec_fuzz_driver [seconds] [seed] */
#include <time.h>

#include "snap/codec.h"
#include "fuzz_decode.h"
#include "seeds.h"
#include "codec_testutil.h"

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t mutate(uint8_t *b, size_t len, size_t cap)
{
	int nmut = 1 + (int)(tu_next() % 4);
	for (int m = 0; m < nmut && len; m++) {
		size_t at = tu_next() % len;
		switch (tu_next() % 8) {
		case 0: case 1: b[at] ^= (uint8_t)(1u << (tu_next() % 8)); break;
		case 2: b[at] = (uint8_t)tu_next(); break;
		case 3: len = at; break;                                 /* truncate */
		case 4: b[tu_next() % (len < 48 ? len : 48)] = (uint8_t)tu_next(); break; /* header */
		case 5: /* lie in the block table */
			if (len > 52) b[48 + tu_next() % 4] += (uint8_t)(1 + tu_next() % 3);
			break;
		case 6: { /* splice a range elsewhere */
			size_t from = tu_next() % len, n = tu_next() % 16;
			for (size_t k = 0; k < n && from + k < len && at + k < len; k++)
				b[at + k] = b[from + k];
			break; }
		case 7: /* grow with junk */
			if (len + 8 <= cap) { for (int k = 0; k < 8; k++) b[len++] = (uint8_t)tu_next(); }
			break;
		}
	}
	return len;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3.0;
	tu_rng = argc > 2 ? strtoull(argv[2], NULL, 0) : (uint64_t)time(NULL) | 1;
	printf("fuzz driver: %.1f s, seed %llu\n", secs, (unsigned long long)tu_rng);
	static uint8_t seeds[NSEEDS][8192], buf[8192 + 64];
	size_t slen[NSEEDS];
	for (int i = 0; i < NSEEDS; i++) {
		slen[i] = seed_stream(i, seeds[i], sizeof(seeds[i]));
		if (!slen[i] || snap_fuzz_decode(seeds[i], slen[i], -1) != 0) {
			fprintf(stderr, "seed %d does not decode\n", i);
			return 1;
		}
	}
	double t0 = now();
	unsigned long iters = 0, accepted = 0;
	while (now() - t0 < secs) {
		for (int r = 0; r < 200; r++, iters++) {
			int s = (int)(tu_next() % NSEEDS);
			memcpy(buf, seeds[s], slen[s]);
			size_t len = mutate(buf, slen[s], sizeof(buf));
			static const int F[] = { -1 /* as is */, SNAP_CODEC_LOSSLESS,
						 SNAP_CODEC_LOSSY_ABS, SNAP_CODEC_LOSSY_REL };
			int force = F[tu_next() % 4];
			if (snap_fuzz_decode(buf, len, force) == 0)
				accepted++;
		}
	}
	printf("fuzz driver: %lu inputs, %lu decoded without error\n", iters, accepted);
	return 0;
}
