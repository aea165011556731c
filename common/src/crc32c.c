/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CRC32C (Castagnoli), the one implementation every libsnap format uses:
 * manifests, chunks, parity, HDF5 attributes. ISA-L does the bytes.
 */
#include <stddef.h>
#include <stdint.h>

#include <isa-l/crc.h>

#include "snap/base.h"

uint32_t snap_crc32c_update(uint32_t crc, const void *buf, size_t len)
{
	/* ISA-L's crc32_iscsi takes and returns the raw (non-inverted) register,
	 * and an int length: feed it at most 1 GiB at a time. */
	const unsigned char *p = buf;
	crc = ~crc;
	while (len > 0) {
		size_t n = len < (1u << 30) ? len : (1u << 30);
		crc = crc32_iscsi((unsigned char *)p, (int)n, crc);
		p += n;
		len -= n;
	}
	return ~crc;
}

uint32_t snap_crc32c(const void *buf, size_t len)
{
	return snap_crc32c_update(0, buf, len);
}

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec)
{
	uint32_t sum = 0;
	for (; vec; vec >>= 1, mat++)
		if (vec & 1)
			sum ^= *mat;
	return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat)
{
	for (int n = 0; n < 32; n++)
		square[n] = gf2_times(mat, mat[n]);
}

uint32_t snap_crc32c_combine(uint32_t crc1, uint32_t crc2, uint64_t len2)
{
	uint32_t even[32], odd[32];
	if (len2 == 0)
		return crc1;
	odd[0] = 0x82F63B78u;              /* reflected Castagnoli polynomial: one zero bit */
	for (int n = 1; n < 32; n++)
		odd[n] = 1u << (n - 1);
	gf2_square(even, odd);             /* two zero bits */
	gf2_square(odd, even);             /* four zero bits */
	do {                               /* apply len2 zero bytes to crc1 */
		gf2_square(even, odd);
		if (len2 & 1)
			crc1 = gf2_times(even, crc1);
		len2 >>= 1;
		if (!len2)
			break;
		gf2_square(odd, even);
		if (len2 & 1)
			crc1 = gf2_times(odd, crc1);
		len2 >>= 1;
	} while (len2);
	return crc1 ^ crc2;
}
