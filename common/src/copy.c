/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copy to memory nobody will read soon: the restore's last pass into a
 * trainer's buffers, from a bounce block still in cache or from the slot's
 * mapping.
 *
 * Why not memcpy: for blocks of a few hundred KiB glibc copies with
 * `rep movsb`, and so does the kernel's pread() into user memory. On the
 * AMD EPYC development VM that runs at 1.2-1.7 GB/s when the destination
 * sits 16 bytes off the source's alignment (malloc'd arrays: 16 past a
 * page) against 3.5-5 GB/s aligned, and every store first reads its line
 * (read for ownership). Non-temporal stores to a 16-byte aligned
 * destination run at 17-19 GB/s from L2 whatever the source's alignment
 * (`test_copy_stream --perf`; the test checks the bytes at every
 * alignment). `snapbench snapshot`'s restore rows are the speed that
 * matters.
 */
#include <stdint.h>
#include <string.h>

#include "snap/base.h"

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define HAVE_STREAM 1
#endif

void snap_copy_stream_base(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

void snap_copy_stream(void *dst, const void *src, size_t n)
{
#ifdef HAVE_STREAM
	uint8_t *d = dst;
	const uint8_t *s = src;
	if (n < 256) {   /* too short to gain anything */
		memcpy(d, s, n);
		return;
	}
	size_t head = (size_t)(-(uintptr_t)d & 15);
	memcpy(d, s, head);
	d += head;
	s += head;
	n -= head;
	for (; n >= 64; n -= 64, d += 64, s += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
		_mm_stream_si128((__m128i *)d, a);
		_mm_stream_si128((__m128i *)(d + 16), b);
		_mm_stream_si128((__m128i *)(d + 32), c);
		_mm_stream_si128((__m128i *)(d + 48), e);
	}
	/* Streaming stores are weakly ordered: make them visible before the
	 * caller says the copy is done (another thread may read dst next). */
	_mm_sfence();
	memcpy(d, s, n);
#else
	snap_copy_stream_base(dst, src, n);
#endif
}
