/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap_copy_stream (common/src/copy.c) against its base version, memcpy:
 * every source and destination alignment within a cache line, lengths
 * around the vector widths and the short-copy cutoff, and guard bytes on
 * both sides of the destination that must stay untouched.
 *
 * test_copy_stream --perf [MiB] prints the speed of both into a buffer at
 * each destination offset (not a test: nothing is asserted).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "../check.h"

#define GUARD 64

static void one(uint8_t *src, uint8_t *dst, uint8_t *want, size_t soff, size_t doff, size_t n)
{
	memset(dst, 0xA5, n + 2 * GUARD + 64);
	memcpy(want, dst, n + 2 * GUARD + 64);
	snap_copy_stream_base(want + GUARD + doff, src + soff, n);
	snap_copy_stream(dst + GUARD + doff, src + soff, n);
	if (memcmp(dst, want, n + 2 * GUARD + 64) != 0) {
		size_t i = 0;
		while (dst[i] == want[i])
			i++;
		fprintf(stderr, "src+%zu dst+%zu n=%zu: first wrong byte at %zd from dst\n", soff, doff, n,
			(ssize_t)i - (ssize_t)(GUARD + doff));
		check_failures++;
	}
}

static int perf(size_t mib)
{
	size_t n = mib << 20, block = 256u << 10;
	uint8_t *src = aligned_alloc(4096, block), *dst = aligned_alloc(4096, n + 4096);
	if (!src || !dst)
		return 1;
	memset(src, 7, block);
	memset(dst, 0, n + 4096);
	printf("%zu MiB in %zu KiB blocks from one cached block (as restore does), GB/s\n", mib, block >> 10);
	printf("  dst offset   memcpy   snap_copy_stream\n");
	for (size_t off = 0; off <= 64; off += 16) {
		double gbps[2];
		for (int f = 0; f < 2; f++) {
			double best = 0;
			for (int rep = 0; rep < 5; rep++) {
				uint64_t t0 = snap_now_ns();
				for (size_t o = 0; o + block <= n; o += block)
					(f ? snap_copy_stream : snap_copy_stream_base)(dst + off + o, src, block);
				double g = (double)n / (double)(snap_now_ns() - t0);
				best = g > best ? g : best;
			}
			gbps[f] = best;
		}
		printf("  %10zu %8.2f %18.2f\n", off, gbps[0], gbps[1]);
	}
	free(src);
	free(dst);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "--perf") == 0)
		return perf(argc > 2 ? (size_t)atoi(argv[2]) : 256);
	size_t max = (1u << 16) + 200;
	uint8_t *src = malloc(max + 64), *dst = malloc(max + 2 * GUARD + 64), *want = malloc(max + 2 * GUARD + 64);
	if (!src || !dst || !want)
		return 1;
	for (size_t i = 0; i < max + 64; i++)
		src[i] = (uint8_t)(i * 131 + 7);
	static const size_t lens[] = { 0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 319, 320, 1000, 4096 + 13,
				       (1u << 16) + 200 };
	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
		for (size_t soff = 0; soff < 64; soff += (lens[l] > 4096 ? 9 : 1))
			for (size_t doff = 0; doff < 64; doff++)
				one(src, dst, want, soff, doff, lens[l]);
	free(src);
	free(dst);
	free(want);
	return check_done("copy_stream");
}
