/* SPDX-License-Identifier: BSD-3-Clause */
/* Malformed streams: truncation at every byte offset, random byte flips,
 * lying header fields and block tables. Decoding must return an error or a
 * well-formed result, never touch memory outside its buffers (run under
 * ASan) and never accept a stream whose announced length is not there. */
#include "snap/codec.h"
#include "seeds.h"
#include "codec_testutil.h"

static uint8_t seed[8192];

static int decode(const uint8_t *s, size_t len)
{
	struct snap_codec_info info;
	int rc = snap_codec_inspect(s, len, &info);
	if (rc)
		return rc;
	size_t bytes = (size_t)info.count * snap_dtype_size(info.dtype);
	if (bytes > (64u << 20))
		return SNAP_ERANGE;
	uint8_t *out = malloc(bytes ? bytes : 1); /* exact size: ASan sees overruns */
	rc = snap_codec_decompress(s, len, out, bytes, NULL);
	free(out);
	return rc;
}

static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void putd(uint8_t *p, double v) { memcpy(p, &v, 8); }

static void lies(const uint8_t *s, size_t len, int i)
{
	uint8_t *b = malloc(len + 64);
	struct { size_t at; int kind; uint64_t v; } L[] = {
		{ 0, 1, 0x43504e54 },   /* magic */
		{ 4, 0, 2 },            /* version */
		{ 4, 0, 0 },
		{ 5, 0, 0 },            /* codec none */
		{ 5, 0, 4 },            /* codec beyond */
		{ 6, 0, 8 },            /* dtype f64 */
		{ 6, 0, 0 },
		{ 7, 0, 7 },            /* block 128 */
		{ 7, 0, 15 },           /* block 32768 */
		{ 7, 0, 9 },            /* block 512: nblocks no longer matches */
		{ 8, 2, 0 },            /* count 0 with blocks */
		{ 8, 2, 1ull << 40 },   /* huge count */
		{ 8, 2, ~0ull },
		{ 32, 2, 0 },           /* payload */
		{ 32, 2, ~0ull },
		{ 40, 1, 0 },           /* nblocks */
		{ 40, 1, 0xffffffff },
		{ 44, 1, 1 },           /* reserved */
		{ 48, 1, 0 },           /* first block size */
		{ 48, 1, 0xffffffff },
		{ 16, 3, 0 },           /* bound 0 */
		{ 16, 4, 0 },           /* bound NaN */
		{ 16, 5, 0 },           /* bound negative */
		{ 16, 6, 0 },           /* bound 1e-300 */
	};
	for (size_t t = 0; t < sizeof(L) / sizeof(*L); t++) {
		memcpy(b, s, len);
		switch (L[t].kind) {
		case 0: b[L[t].at] = (uint8_t)L[t].v; break;
		case 1: { uint32_t v = (uint32_t)L[t].v; memcpy(b + L[t].at, &v, 4); break; }
		case 2: put64(b + L[t].at, L[t].v); break;
		case 3: putd(b + 16, 0.0); break;
		case 4: putd(b + 16, NAN); break;
		case 5: putd(b + 16, -1e-3); break;
		case 6: putd(b + 16, 1e-300); break;
		}
		/* Every lie must be refused but bound 0 in a lossless header,
		 * which is what such a header says (any other bound is a lie). */
		int lossless = s[5] == SNAP_CODEC_LOSSLESS;
		int must = !(lossless && L[t].kind == 3);
		int rc = decode(b, len);
		if (must)
			CHECK(rc < 0, "seed %d lie %zu accepted", i, t);
	}
	/* Move bytes between two block sizes: sum kept, blocks misparse. */
	uint32_t nb;
	memcpy(&nb, s + 40, 4);
	if (nb >= 2) {
		memcpy(b, s, len);
		uint32_t a0, a1;
		memcpy(&a0, b + 48, 4); memcpy(&a1, b + 52, 4);
		a0 += 3; a1 -= 3;
		memcpy(b + 48, &a0, 4); memcpy(b + 52, &a1, 4);
		CHECK(decode(b, len) < 0, "seed %d: shifted block table accepted", i);
	}
	/* Count one less/more than the blocks hold. */
	uint64_t cnt;
	memcpy(&cnt, s + 8, 8);
	memcpy(b, s, len);
	put64(b + 8, cnt + 300);
	CHECK(decode(b, len) < 0, "seed %d: count+300 accepted", i);
	free(b);
}

int main(void)
{
	unsigned long flips = 0, flip_ok = 0;
	for (int i = 0; i < NSEEDS; i++) {
		size_t len = seed_stream(i, seed, sizeof(seed));
		CHECK(len > 0 && decode(seed, len) == 0, "seed %d invalid", i);
		/* Truncation at every offset: a heap copy of exactly that size. */
		for (size_t cut = 0; cut < len; cut++) {
			uint8_t *t = malloc(cut ? cut : 1);
			memcpy(t, seed, cut);
			int rc = decode(t, cut);
			CHECK(rc == SNAP_ETRUNC, "seed %d cut %zu/%zu rc %d", i, cut, len, rc);
			free(t);
		}
		lies(seed, len, i);
		/* Random flips of 1..4 bytes anywhere. */
		uint8_t *m = malloc(len);
		for (int r = 0; r < 3000; r++, flips++) {
			memcpy(m, seed, len);
			int nf = 1 + (int)(tu_next() % 4);
			for (int f = 0; f < nf; f++)
				m[tu_next() % len] ^= (uint8_t)(1 + tu_next() % 255);
			if (decode(m, len) == 0)
				flip_ok++;
		}
		free(m);
	}
	printf("flips: %lu streams, %lu still decoded (payload flips are for the manifest CRC to catch)\n",
	       flips, flip_ok);
	if (tu_failures) {
		fprintf(stderr, "%d failures\n", tu_failures);
		return 1;
	}
	printf("malformed-stream tests passed\n");
	return 0;
}
