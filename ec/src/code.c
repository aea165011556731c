/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * code.c - the Reed-Solomon code (ISA-L Cauchy matrix), CRC32C, iovec
 * walking, and the single-process group encoder that shares the mesh's
 * per-unit kernel.
 */
#include <stdlib.h>
#include <string.h>

#include <isa-l/erasure_code.h>

#include "ec_internal.h"

int ec_code_init(struct ec_code *c, int k, int m)
{
	memset(c, 0, sizeof(*c));
	if (k < 1 || m < 1 || k + m > SNAP_EC_MAX_GROUP)
		return SNAP_EINVAL;
	c->k = k;
	c->m = m;
	c->n = k + m;
	c->gen = malloc((size_t)c->n * (size_t)k);
	c->enc_tbls = malloc((size_t)32 * (size_t)k * (size_t)m);
	if (!c->gen || !c->enc_tbls) {
		ec_code_fini(c);
		return SNAP_ENOMEM;
	}
	/* Cauchy: every k x k submatrix is invertible, for any k + m <= 256. */
	gf_gen_cauchy1_matrix(c->gen, c->n, k);
	for (int p = 0; p < m; p++)
		ec_init_tables(k, 1, c->gen + (size_t)(k + p) * (size_t)k,
			       c->enc_tbls + (size_t)32 * (size_t)k * (size_t)p);
	return 0;
}

void ec_code_fini(struct ec_code *c)
{
	free(c->gen);
	free(c->enc_tbls);
	c->gen = NULL;
	c->enc_tbls = NULL;
}

int ec_code_row(const struct ec_code *c, const int *surv, int out, uint8_t *coef)
{
	int k = c->k;
	int ident = 1;
	for (int i = 0; i < k; i++)
		ident &= surv[i] == i;
	if (ident) {
		memcpy(coef, c->gen + (size_t)out * (size_t)k, (size_t)k);
		return 0;
	}
	uint8_t *b = malloc((size_t)k * (size_t)k * 2);
	if (!b)
		return SNAP_ENOMEM;
	uint8_t *inv = b + (size_t)k * (size_t)k;
	for (int i = 0; i < k; i++)
		memcpy(b + (size_t)i * (size_t)k, c->gen + (size_t)surv[i] * (size_t)k, (size_t)k);
	if (gf_invert_matrix(b, inv, k) != 0) {
		free(b);
		return SNAP_ECORRUPT; /* cannot happen for a Cauchy code */
	}
	const uint8_t *row = c->gen + (size_t)out * (size_t)k;
	for (int j = 0; j < k; j++) {
		uint8_t acc = 0;
		for (int i = 0; i < k; i++)
			acc ^= gf_mul(row[i], inv[(size_t)i * (size_t)k + (size_t)j]);
		coef[j] = acc;
	}
	free(b);
	return 0;
}

uint32_t ec_crc_padded(uint32_t crc, const void *p, uint64_t v, uint64_t zeros)
{
	static const unsigned char zero[4096];
	crc = snap_crc32c_update(crc, p, v);
	while (zeros) {
		size_t n = zeros > sizeof(zero) ? sizeof(zero) : (size_t)zeros;
		crc = snap_crc32c_update(crc, zero, n);
		zeros -= n;
	}
	return crc;
}

int ec_iov_init(struct ec_iov *v, const struct iovec *iov, int cnt)
{
	memset(v, 0, sizeof(*v));
	if (cnt < 0 || (cnt > 0 && !iov))
		return SNAP_EINVAL;
	v->start = malloc(sizeof(uint64_t) * ((size_t)cnt + 1));
	if (!v->start)
		return SNAP_ENOMEM;
	v->iov = iov;
	v->cnt = cnt;
	uint64_t t = 0;
	for (int i = 0; i < cnt; i++) {
		if (iov[i].iov_len && !iov[i].iov_base) {
			free(v->start);
			v->start = NULL;
			return SNAP_EINVAL;
		}
		v->start[i] = t;
		t += iov[i].iov_len;
	}
	v->start[cnt] = t;
	v->total = t;
	return 0;
}

void ec_iov_fini(struct ec_iov *v)
{
	free(v->start);
	v->start = NULL;
}

/* Index of the iovec holding byte `off` (off < total). */
static int iov_find(const struct ec_iov *v, uint64_t off)
{
	int lo = 0, hi = v->cnt - 1;
	while (lo < hi) {
		int mid = (lo + hi + 1) / 2;
		if (v->start[mid] <= off)
			lo = mid;
		else
			hi = mid - 1;
	}
	while (lo < v->cnt - 1 && v->start[lo + 1] <= off) /* skip empty iovecs */
		lo++;
	return lo;
}

uint8_t *ec_iov_contig(const struct ec_iov *v, uint64_t off, uint64_t len)
{
	if (len == 0 || off + len > v->total)
		return NULL;
	int i = iov_find(v, off);
	if (off + len > v->start[i] + v->iov[i].iov_len)
		return NULL;
	return (uint8_t *)v->iov[i].iov_base + (off - v->start[i]);
}

/* Calls fn on each contiguous piece of [off, off+len). */
#define IOV_WALK(v, off, len, PTR, N, BODY)                                         \
	do {                                                                        \
		uint64_t o_ = (off), l_ = (len);                                    \
		int i_ = l_ ? iov_find((v), o_) : 0;                                \
		while (l_) {                                                        \
			uint64_t in_ = o_ - (v)->start[i_];                         \
			uint64_t N = (v)->iov[i_].iov_len - in_;                    \
			if (N > l_)                                                 \
				N = l_;                                             \
			uint8_t *PTR = (uint8_t *)(v)->iov[i_].iov_base + in_;      \
			BODY;                                                       \
			o_ += N;                                                    \
			l_ -= N;                                                    \
			i_++;                                                       \
		}                                                                   \
	} while (0)

void ec_iov_read(const struct ec_iov *v, uint64_t off, void *dst, uint64_t len)
{
	uint8_t *d = dst;
	IOV_WALK(v, off, len, p, n, { memcpy(d, p, n); d += n; });
}

void ec_iov_write(const struct ec_iov *v, uint64_t off, const void *src, uint64_t len)
{
	const uint8_t *s = src;
	IOV_WALK(v, off, len, p, n, { memcpy(p, s, n); s += n; });
}

int ec_io_write(const struct ec_iov *v, uint64_t off, const void *src, uint64_t len, const struct snap_ec_io *io)
{
	const uint8_t *s = src;
	int rc = 0;
	IOV_WALK(v, off, len, p, n, {
		(void)p;
		if (!rc)
			rc = io->write(io->arg, i_, in_, s, n);
		s += n;
	});
	return rc;
}

int ec_io_read(const struct ec_iov *v, uint64_t off, void *dst, uint64_t len, const struct snap_ec_io *io)
{
	uint8_t *d = dst;
	int rc = 0;
	IOV_WALK(v, off, len, p, n, {
		(void)p;
		if (!rc)
			rc = io->read(io->arg, i_, in_, d, n);
		d += n;
	});
	return rc;
}

uint32_t ec_iov_crc(const struct ec_iov *v, uint64_t off, uint64_t len, uint32_t crc)
{
	IOV_WALK(v, off, len, p, n, { crc = snap_crc32c_update(crc, p, n); });
	return crc;
}

int ec_opts_resolve(const struct snap_ec_opts *o, int n, uint32_t *chunk, uint32_t *window,
		    char *err, size_t errlen)
{
	uint32_t c = o && o->chunk_size ? o->chunk_size : SNAP_EC_DEFAULT_CHUNK;
	uint32_t w = o && o->window ? o->window : (uint32_t)n;
	if (c < SNAP_EC_MIN_CHUNK || c > SNAP_EC_MAX_CHUNK || c % 64)
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec: chunk_size %u must be a multiple of 64 in [%u, %u]", c,
			       SNAP_EC_MIN_CHUNK, SNAP_EC_MAX_CHUNK);
	if (w > 4096)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: window %u too large (max 4096)", w);
	*chunk = c;
	*window = w;
	return 0;
}

int snap_ec_encode_group_local(int k, int m, uint32_t chunk_size, const void *const *data,
			       const uint64_t *len, void *const *parity, char *err, size_t errlen)
{
	struct snap_ec_opts o = { .chunk_size = chunk_size, .window = 0 };
	uint32_t chunk, window;
	struct ec_code code;
	int rc;
	if (k < 1 || m < 1 || k + m > SNAP_EC_MAX_GROUP || !data || !len || !parity)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: encode_group_local: bad arguments");
	int n = k + m;
	if ((rc = ec_opts_resolve(&o, n, &chunk, &window, err, errlen)))
		return rc;
	struct snap_ec_meta mt = { .n = n, .k = k, .m = m, .chunk_size = chunk };
	uint64_t maxl = 0;
	for (int j = 0; j < n; j++) {
		if (len[j] && !data[j])
			return ec_errf(err, errlen, SNAP_EINVAL, "ec: member %d: NULL data", j);
		if (!parity[j])
			return ec_errf(err, errlen, SNAP_EINVAL, "ec: member %d: NULL parity", j);
		maxl = len[j] > maxl ? len[j] : maxl;
	}
	mt.seg_len = snap_ec_seg_len(k, maxl);
	mt.nchunks = (uint32_t)((mt.seg_len + chunk - 1) / chunk);
	mt.len = (uint64_t *)len;
	if ((rc = ec_code_init(&code, k, m)))
		return ec_errf(err, errlen, rc, "ec: out of memory");
	/* The same kernel as a mesh decoder: all m rows of a (chunk, stripe)
	 * unit over its k zero-padded source pieces. Only padded pieces are
	 * copied. */
	uint8_t *pad = calloc((size_t)k + 1, chunk);
	const uint8_t **src = malloc(sizeof(*src) * (size_t)k);
	if (!pad || !src) {
		free(pad);
		free(src);
		ec_code_fini(&code);
		return ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory");
	}
	const uint8_t *zero = pad + (size_t)k * chunk;
	for (uint32_t q = 0; q < mt.nchunks; q++) {
		uint64_t clen = ec_chunk_len(&mt, q);
		for (int s = 0; s < n; s++) {
			for (int t = 0; t < k; t++) {
				int j = (s + m + t) % n;
				uint64_t v = ec_valid(&mt, j, t, q);
				const uint8_t *p = (const uint8_t *)data[j] +
						   (uint64_t)t * mt.seg_len + (uint64_t)q * chunk;
				if (v == clen) {
					src[t] = p;
				} else if (v == 0) {
					src[t] = zero;
				} else {
					uint8_t *b = pad + (size_t)t * chunk;
					memcpy(b, p, v);
					memset(b + v, 0, clen - v);
					src[t] = b;
				}
			}
			unsigned char *dst[SNAP_EC_MAX_GROUP];
			for (int p = 0; p < m; p++)
				dst[p] = (uint8_t *)parity[(s + p) % n] + (uint64_t)p * mt.seg_len +
					 (uint64_t)q * chunk;
			ec_encode_data((int)clen, k, m, code.enc_tbls, (unsigned char **)src, dst);
		}
	}
	free(pad);
	free(src);
	ec_code_fini(&code);
	return 0;
}
