/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The byte layout of the registered HDF5 LZ4 filter (id 32004), as the
 * hdf5-filter-plugin's H5Zlz4.c writes and reads it:
 *   8 bytes  big-endian original size
 *   4 bytes  big-endian block size
 *   per block: 4 bytes big-endian stored size, then the block, which is
 *   stored raw when LZ4 does not make it smaller (stored size == block size).
 * We encode exactly that so the plugin decodes our chunks, and decode it with
 * LZ4_decompress_safe (the plugin uses the unsafe _fast variant) so a
 * corrupted chunk is an error here rather than a wild read.
 */
#include <string.h>

#include <lz4.h>

#include "io_int.h"

/* LZ4 needs blocks < 1.9 GiB; one block per chunk is the common case. */
#define BLOCK_MAX (1u << 30)

static void be32(unsigned char *p, uint32_t v)
{
	p[0] = (unsigned char)(v >> 24); p[1] = (unsigned char)(v >> 16);
	p[2] = (unsigned char)(v >> 8); p[3] = (unsigned char)v;
}

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

size_t io_lz4_bound(size_t n)
{
	size_t blocks = n / BLOCK_MAX + 1;
	return 12 + blocks * 20 + n + n / 255;
}

size_t io_lz4_encode(const void *src, size_t n, void *dst)
{
	const unsigned char *in = src;
	unsigned char *out = dst;
	uint32_t bs = n < BLOCK_MAX ? (uint32_t)n : BLOCK_MAX;
	be32(out, (uint32_t)((uint64_t)n >> 32));
	be32(out + 4, (uint32_t)n);
	be32(out + 8, bs);
	size_t k = 12;
	for (size_t done = 0; done < n;) {
		int len = (int)(n - done < bs ? n - done : bs);
		int c = LZ4_compress_default((const char *)in + done, (char *)out + k + 4, len,
					     LZ4_compressBound(len));
		if (c <= 0 || c >= len) {
			memcpy(out + k + 4, in + done, (size_t)len);
			c = len;
		}
		be32(out + k, (uint32_t)c);
		k += 4 + (size_t)c;
		done += (size_t)len;
	}
	return k;
}

int io_lz4_decode(const void *src, size_t n, void *dst, size_t cap, size_t *out_n)
{
	const unsigned char *in = src;
	if (n < 12)
		return SNAP_ETRUNC;
	uint64_t orig = (uint64_t)rd32(in) << 32 | rd32(in + 4);
	uint64_t bs = rd32(in + 8);
	if (orig > cap)
		return SNAP_ECORRUPT;
	if (bs > orig)
		bs = orig;
	if (bs == 0 && orig > 0)
		return SNAP_ECORRUPT;
	size_t k = 12;
	for (uint64_t done = 0; done < orig;) {
		uint64_t len = orig - done < bs ? orig - done : bs;
		if (n - k < 4)
			return SNAP_ETRUNC;
		uint32_t c = rd32(in + k);
		k += 4;
		if (c > n - k)
			return SNAP_ETRUNC;
		if (c == len) {
			memcpy((char *)dst + done, in + k, len);
		} else {
			int r = LZ4_decompress_safe((const char *)in + k, (char *)dst + done, (int)c, (int)len);
			if (r < 0 || (uint64_t)r != len)
				return SNAP_ECORRUPT;
		}
		k += c;
		done += len;
	}
	if (k != n)
		return SNAP_ECORRUPT;
	*out_n = orig;
	return 0;
}

static void geom_finish(struct io_chunk_geom *g, const uint64_t *shape, int ndim, size_t es)
{
	g->ndim = ndim;
	uint64_t stride = 1;
	g->outer = 1;
	for (int d = 0; d < ndim; d++) {
		g->shape[d] = shape[d];
		if (d > g->j)
			stride *= shape[d];
		else if (d < g->j)
			g->outer *= shape[d];
	}
	g->cj = g->chunk[g->j];
	g->runs = (shape[g->j] + g->cj - 1) / g->cj;
	g->row_bytes = stride * es;
	g->full = (size_t)(g->cj * g->row_bytes);
}

void io_chunk_plan(const uint64_t *shape, int ndim, size_t es, size_t target, struct io_chunk_geom *g)
{
	uint64_t inner = es;
	int j = -1;
	for (int d = ndim - 1; d >= 0; d--) {
		if (j < 0 && inner * shape[d] <= target) {
			g->chunk[d] = shape[d];
			inner *= shape[d];
		} else if (j < 0) {
			j = d;
			uint64_t c = target / inner;
			g->chunk[d] = c ? c : 1;
		} else {
			g->chunk[d] = 1;
		}
	}
	g->j = j < 0 ? 0 : j;
	geom_finish(g, shape, ndim, es);
}

int io_chunk_from(const uint64_t *shape, int ndim, size_t es, const hsize_t *chunk, struct io_chunk_geom *g)
{
	g->j = 0;
	for (int d = 0; d < ndim; d++) {
		g->chunk[d] = chunk[d];
		if (chunk[d] != shape[d])
			g->j = d;
	}
	for (int d = 0; d < g->j; d++)
		if (chunk[d] != 1)
			return -1;
	if (chunk[g->j] == 0)
		return -1;
	geom_finish(g, shape, ndim, es);
	return 0;
}

void io_chunk_at(const struct io_chunk_geom *g, uint64_t o, uint64_t r, hsize_t *off, uint64_t *src, size_t *len)
{
	uint64_t rem = o;
	for (int d = g->ndim - 1; d > g->j; d--)
		off[d] = 0;
	for (int d = g->j - 1; d >= 0; d--) {
		off[d] = rem % g->shape[d];
		rem /= g->shape[d];
	}
	off[g->j] = r * g->cj;
	uint64_t rows = g->shape[g->j] - off[g->j] < g->cj ? g->shape[g->j] - off[g->j] : g->cj;
	*len = (size_t)(rows * g->row_bytes);
	*src = (o * g->shape[g->j] + off[g->j]) * g->row_bytes;
}
