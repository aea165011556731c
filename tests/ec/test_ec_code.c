/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * test_ec_code.c - the single-process encoder against a naive GF(2^8)
 * reference written from the placement rules in snap/ec.h (not from the
 * library's helpers): unequal and zero lengths, odd chunk sizes, bad input,
 * and meta records that are garbage or truncated.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/ec.h"

static int failures;
#define CHECK(c, ...)                                                        \
	do {                                                                 \
		if (!(c)) {                                                  \
			failures++;                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
		}                                                            \
	} while (0)

/* GF(2^8), polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d), bit by bit. */
static uint8_t gmul(uint8_t a, uint8_t b)
{
	uint8_t r = 0;
	while (b) {
		if (b & 1)
			r ^= a;
		a = (uint8_t)((a << 1) ^ ((a & 0x80) ? 0x1d : 0));
		b >>= 1;
	}
	return r;
}

static uint8_t ginv(uint8_t a)
{
	for (int x = 1; x < 256; x++)
		if (gmul(a, (uint8_t)x) == 1)
			return (uint8_t)x;
	return 0;
}

static uint64_t rng_state;
static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

/* Parity row p of node h: stripe s = h - p; data segment t of that stripe
 * comes from node s + m + t; Cauchy coefficient 1 / ((k + p) ^ t). */
static void reference(int k, int m, const uint8_t *const *data, const uint64_t *len, uint64_t seg,
		      uint8_t **par)
{
	int n = k + m;
	for (int h = 0; h < n; h++)
		for (int p = 0; p < m; p++) {
			int s = ((h - p) % n + n) % n;
			uint8_t *out = par[h] + (uint64_t)p * seg;
			memset(out, 0, seg);
			for (int t = 0; t < k; t++) {
				int j = (s + m + t) % n;
				uint8_t c = ginv((uint8_t)((k + p) ^ t));
				for (uint64_t b = 0; b < seg; b++) {
					uint64_t o = (uint64_t)t * seg + b;
					if (o < len[j])
						out[b] ^= gmul(c, data[j][o]);
				}
			}
		}
}

static void one_case(int k, int m, uint32_t chunk, const uint64_t *len)
{
	int n = k + m;
	uint8_t *data[SNAP_EC_MAX_GROUP], *par[SNAP_EC_MAX_GROUP], *ref[SNAP_EC_MAX_GROUP];
	uint64_t maxl = 0;
	for (int j = 0; j < n; j++)
		maxl = len[j] > maxl ? len[j] : maxl;
	uint64_t seg = snap_ec_seg_len(k, maxl);
	for (int j = 0; j < n; j++) {
		data[j] = malloc(len[j] + 1);
		for (uint64_t b = 0; b < len[j]; b++)
			data[j][b] = (uint8_t)rnd();
		par[j] = malloc((size_t)m * seg + 1);
		memset(par[j], 0xEE, (size_t)m * seg + 1);
		ref[j] = malloc((size_t)m * seg + 1);
	}
	char err[256];
	int rc = snap_ec_encode_group_local(k, m, chunk, (const void *const *)data, len,
					    (void *const *)par, err, sizeof(err));
	CHECK(rc == 0, "%d+%d: %s", k, m, err);
	reference(k, m, (const uint8_t *const *)data, len, seg, ref);
	for (int j = 0; j < n; j++) {
		CHECK(memcmp(par[j], ref[j], (size_t)m * seg) == 0, "%d+%d chunk %u node %d parity differs",
		      k, m, chunk, j);
		CHECK(par[j][(size_t)m * seg] == 0xEE, "wrote past the parity end");
		free(data[j]);
		free(par[j]);
		free(ref[j]);
	}
}

int main(void)
{
	rng_state = 0x9E3779B97F4A7C15ull;
	static const int shapes[][2] = { { 4, 2 }, { 3, 1 }, { 6, 2 }, { 1, 1 }, { 1, 3 }, { 10, 4 } };
	static const uint32_t chunks[] = { 64, 128, 4096, 0 };
	uint64_t len[SNAP_EC_MAX_GROUP];
	for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
		int k = shapes[si][0], m = shapes[si][1], n = k + m;
		for (size_t ci = 0; ci < sizeof(chunks) / sizeof(chunks[0]); ci++) {
			for (int j = 0; j < n; j++) /* unequal */
				len[j] = rnd() % 9000;
			one_case(k, m, chunks[ci], len);
			for (int j = 0; j < n; j++) /* equal, not a multiple of k */
				len[j] = 4097;
			one_case(k, m, chunks[ci], len);
			for (int j = 0; j < n; j++) /* some empty */
				len[j] = (j % 2) ? 0 : 1 + rnd() % 3000;
			one_case(k, m, chunks[ci], len);
			for (int j = 0; j < n; j++) /* all empty: nothing to do */
				len[j] = 0;
			one_case(k, m, chunks[ci], len);
		}
	}

	/* bad input */
	char err[256];
	const void *d[6] = { 0 };
	void *p[6] = { 0 };
	uint64_t l6[6] = { 0 };
	CHECK(snap_ec_encode_group_local(0, 2, 0, d, l6, p, err, sizeof(err)) == SNAP_EINVAL, "k=0");
	CHECK(snap_ec_encode_group_local(4, 2, 100, d, l6, p, err, sizeof(err)) == SNAP_EINVAL &&
	      strstr(err, "chunk_size"), "chunk not multiple of 64: %s", err);
	CHECK(snap_ec_encode_group_local(4, 2, 0, d, l6, p, err, sizeof(err)) == SNAP_EINVAL &&
	      strstr(err, "NULL parity"), "NULL parity: %s", err);
	l6[1] = 5;
	uint8_t bufs[6][8];
	for (int j = 0; j < 6; j++)
		p[j] = bufs[j];
	CHECK(snap_ec_encode_group_local(4, 2, 0, d, l6, p, err, sizeof(err)) == SNAP_EINVAL &&
	      strstr(err, "NULL data"), "NULL data: %s", err);
	CHECK(snap_ec_encode_group_local(4, 2, 0, NULL, l6, p, err, sizeof(err)) == SNAP_EINVAL, "NULL");

	/* meta records that are not records */
	struct snap_ec_meta *mt = (struct snap_ec_meta *)1;
	uint8_t junk[200];
	memset(junk, 0x41, sizeof(junk));
	CHECK(snap_ec_meta_unpack(junk, sizeof(junk), &mt, err, sizeof(err)) == SNAP_EFORMAT && !mt,
	      "junk: %s", err);
	CHECK(snap_ec_meta_unpack(junk, 10, &mt, err, sizeof(err)) == SNAP_ETRUNC, "short");
	memcpy(junk, "SNAPECM1\x07\0\0\0", 12);
	CHECK(snap_ec_meta_unpack(junk, sizeof(junk), &mt, err, sizeof(err)) == SNAP_EFORMAT &&
	      strstr(err, "version"), "version: %s", err);
	CHECK(snap_ec_meta_unpack(NULL, 0, &mt, err, sizeof(err)) == SNAP_EINVAL, "NULL");
	CHECK(snap_ec_verify(NULL, NULL, 0, NULL, 0, NULL, err, sizeof(err)) == SNAP_EINVAL, "verify NULL");

	if (failures) {
		fprintf(stderr, "test_ec_code: %d failures\n", failures);
		return 1;
	}
	printf("test_ec_code: ok\n");
	return 0;
}
