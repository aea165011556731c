/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * meta.c - the per-step EC metadata record: what every group member needs to
 * verify its own chunks and to tell a replacement what it held.
 */
#include <stdlib.h>
#include <string.h>

#include "ec_internal.h"

int ec_meta_alloc(struct snap_ec_meta *mt, uint64_t app_total)
{
	size_t n = (size_t)mt->n;
	size_t ncrc = n * (size_t)(mt->k + mt->m) * mt->nchunks;
	mt->len = calloc(n, sizeof(uint64_t));
	mt->app_len = calloc(n, sizeof(uint32_t));
	mt->app_off = calloc(n, sizeof(uint64_t));
	mt->app = malloc(app_total ? (size_t)app_total : 1);
	mt->crc = calloc(ncrc ? ncrc : 1, sizeof(uint32_t));
	mt->app_total = app_total;
	if (!mt->len || !mt->app_len || !mt->app_off || !mt->app || !mt->crc)
		return SNAP_ENOMEM;
	return 0;
}

void snap_ec_meta_free(struct snap_ec_meta *mt)
{
	if (!mt)
		return;
	free(mt->len);
	free(mt->app_len);
	free(mt->app_off);
	free(mt->app);
	free(mt->crc);
	free(mt);
}

struct snap_ec_meta *ec_meta_dup(const struct snap_ec_meta *src)
{
	struct snap_ec_meta *mt = malloc(sizeof(*mt));
	if (!mt)
		return NULL;
	*mt = *src;
	mt->len = NULL;
	mt->app_len = NULL;
	mt->app_off = NULL;
	mt->app = NULL;
	mt->crc = NULL;
	if (ec_meta_alloc(mt, src->app_total)) {
		snap_ec_meta_free(mt);
		return NULL;
	}
	size_t n = (size_t)mt->n;
	memcpy(mt->len, src->len, n * sizeof(uint64_t));
	memcpy(mt->app_len, src->app_len, n * sizeof(uint32_t));
	memcpy(mt->app_off, src->app_off, n * sizeof(uint64_t));
	memcpy(mt->app, src->app, (size_t)src->app_total);
	memcpy(mt->crc, src->crc, n * (size_t)(mt->k + mt->m) * mt->nchunks * sizeof(uint32_t));
	return mt;
}

void snap_ec_meta_info(const struct snap_ec_meta *mt, struct snap_ec_meta_info *info)
{
	if (!mt || !info)
		return;
	memset(info, 0, sizeof(*info));
	info->step = mt->step;
	info->group = mt->group;
	info->first_rank = mt->first_rank;
	info->n = mt->n;
	info->k = mt->k;
	info->m = mt->m;
	info->index = mt->index;
	info->chunk_size = mt->chunk_size;
	info->nchunks = mt->nchunks;
	info->seg_len = mt->seg_len;
	info->data_len = mt->len[mt->index];
	info->parity_len = (uint64_t)mt->m * mt->seg_len;
	for (int j = 0; j < mt->n; j++)
		info->max_len = mt->len[j] > info->max_len ? mt->len[j] : info->max_len;
}

uint64_t snap_ec_meta_member_len(const struct snap_ec_meta *mt, int index)
{
	if (!mt || index < 0 || index >= mt->n)
		return 0;
	return mt->len[index];
}

int snap_ec_meta_app(const struct snap_ec_meta *mt, int index, const void **app, size_t *app_len)
{
	if (!mt || index < 0 || index >= mt->n || !app || !app_len)
		return SNAP_EINVAL;
	*app_len = mt->app_len[index];
	*app = *app_len ? mt->app + mt->app_off[index] : NULL;
	return 0;
}

static uint8_t *put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 4;
}

static uint8_t *put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return p + 8;
}

static uint32_t get32(const uint8_t **p)
{
	uint32_t v = 0;
	for (int i = 0; i < 4; i++)
		v |= (uint32_t)(*p)[i] << (8 * i);
	*p += 4;
	return v;
}

static uint64_t get64(const uint8_t **p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)(*p)[i] << (8 * i);
	*p += 8;
	return v;
}

static uint64_t packed_size(int n, int km, uint64_t nchunks, uint64_t app_total)
{
	return EC_META_FIXED + (uint64_t)n * 12 + app_total + (uint64_t)n * (uint64_t)km * nchunks * 4 + 4;
}

int snap_ec_meta_pack(const struct snap_ec_meta *mt, void *buf, size_t cap, size_t *need)
{
	if (!mt || !need || (cap && !buf))
		return SNAP_EINVAL;
	int km = mt->k + mt->m;
	uint64_t sz = packed_size(mt->n, km, mt->nchunks, mt->app_total);
	*need = (size_t)sz;
	if (cap < sz)
		return SNAP_EOVERFLOW;
	uint8_t *p = buf;
	memcpy(p, EC_META_MAGIC, 8);
	p += 8;
	p = put32(p, EC_META_VERSION);
	p = put32(p, (uint32_t)mt->group);
	p = put32(p, (uint32_t)mt->first_rank);
	p = put32(p, (uint32_t)mt->n);
	p = put32(p, (uint32_t)mt->k);
	p = put32(p, (uint32_t)mt->m);
	p = put32(p, (uint32_t)mt->index);
	p = put32(p, mt->chunk_size);
	p = put32(p, mt->nchunks);
	p = put64(p, mt->step);
	p = put64(p, mt->seg_len);
	p = put64(p, mt->app_total);
	for (int j = 0; j < mt->n; j++)
		p = put64(p, mt->len[j]);
	for (int j = 0; j < mt->n; j++)
		p = put32(p, mt->app_len[j]);
	memcpy(p, mt->app, (size_t)mt->app_total);
	p += mt->app_total;
	size_t ncrc = (size_t)mt->n * (size_t)km * mt->nchunks;
	for (size_t i = 0; i < ncrc; i++)
		p = put32(p, mt->crc[i]);
	put32(p, snap_crc32c_update(0, buf, (size_t)(p - (uint8_t *)buf)));
	return 0;
}

int snap_ec_meta_unpack(const void *buf, size_t len, struct snap_ec_meta **out, char *err,
			size_t errlen)
{
	if (!buf || !out)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec meta: NULL argument");
	*out = NULL;
	const uint8_t *p = buf;
	if (len < EC_META_FIXED + 4)
		return ec_errf(err, errlen, SNAP_ETRUNC, "ec meta: %zu bytes, shorter than its header", len);
	if (memcmp(p, EC_META_MAGIC, 8) != 0)
		return ec_errf(err, errlen, SNAP_EFORMAT, "ec meta: bad magic");
	p += 8;
	uint32_t ver = get32(&p);
	if (ver != EC_META_VERSION)
		return ec_errf(err, errlen, SNAP_EFORMAT, "ec meta: version %u, expected %u", ver, EC_META_VERSION);
	struct snap_ec_meta h = { 0 };
	h.group = (int)get32(&p);
	h.first_rank = (int)get32(&p);
	h.n = (int)get32(&p);
	h.k = (int)get32(&p);
	h.m = (int)get32(&p);
	h.index = (int)get32(&p);
	h.chunk_size = get32(&p);
	h.nchunks = get32(&p);
	h.step = get64(&p);
	h.seg_len = get64(&p);
	uint64_t app_total = get64(&p);
	if (h.k < 1 || h.m < 1 || h.n != h.k + h.m || h.n > SNAP_EC_MAX_GROUP || h.index < 0 ||
	    h.index >= h.n || h.group < 0 || h.first_rank < 0 || h.chunk_size < SNAP_EC_MIN_CHUNK ||
	    h.chunk_size > SNAP_EC_MAX_CHUNK || h.chunk_size % 64 ||
	    app_total > (uint64_t)h.n * SNAP_EC_APP_MAX ||
	    h.nchunks != (h.seg_len + h.chunk_size - 1) / h.chunk_size)
		return ec_errf(err, errlen, SNAP_ECORRUPT, "ec meta: inconsistent header fields");
	uint64_t sz = packed_size(h.n, h.n, h.nchunks, app_total);
	if (len < sz)
		return ec_errf(err, errlen, SNAP_ETRUNC, "ec meta: %zu bytes, header says %llu", len,
			       (unsigned long long)sz);
	const uint8_t *tail = (const uint8_t *)buf + sz - 4;
	if (snap_crc32c_update(0, buf, (size_t)(sz - 4)) != get32(&tail))
		return ec_errf(err, errlen, SNAP_ECORRUPT, "ec meta: CRC32C mismatch (record corrupt)");
	struct snap_ec_meta *mt = malloc(sizeof(*mt));
	if (!mt)
		return ec_errf(err, errlen, SNAP_ENOMEM, "ec meta: out of memory");
	*mt = h;
	if (ec_meta_alloc(mt, app_total)) {
		snap_ec_meta_free(mt);
		return ec_errf(err, errlen, SNAP_ENOMEM, "ec meta: out of memory");
	}
	uint64_t maxl = 0, sum = 0;
	for (int j = 0; j < mt->n; j++) {
		mt->len[j] = get64(&p);
		maxl = mt->len[j] > maxl ? mt->len[j] : maxl;
	}
	for (int j = 0; j < mt->n; j++) {
		mt->app_len[j] = get32(&p);
		mt->app_off[j] = sum;
		sum += mt->app_len[j];
	}
	if (sum != app_total || mt->seg_len != snap_ec_seg_len(mt->k, maxl)) {
		snap_ec_meta_free(mt);
		return ec_errf(err, errlen, SNAP_ECORRUPT, "ec meta: lengths disagree with the segment size");
	}
	memcpy(mt->app, p, (size_t)app_total);
	p += app_total;
	size_t ncrc = (size_t)mt->n * (size_t)mt->n * mt->nchunks;
	for (size_t i = 0; i < ncrc; i++)
		mt->crc[i] = get32(&p);
	*out = mt;
	return 0;
}

int snap_ec_meta_parity_piece(const struct snap_ec_meta *mt, int row, uint32_t q, uint64_t *off, uint64_t *len,
			      uint32_t *crc)
{
	if (!mt || row < 0 || row >= mt->m || q >= mt->nchunks)
		return SNAP_EINVAL;
	*off = (uint64_t)row * mt->seg_len + (uint64_t)q * mt->chunk_size;
	*len = ec_chunk_len(mt, q);
	*crc = *ec_meta_crc(mt, mt->index, mt->k + row, q);
	return 0;
}

uint32_t ec_piece_crc(const struct snap_ec_meta *mt, int me, const struct ec_iov *v, const uint8_t *parity,
		      int slot, uint32_t q)
{
	uint64_t clen = ec_chunk_len(mt, q);
	if (slot < mt->k) {
		uint64_t vb = ec_valid(mt, me, slot, q);
		uint64_t off = (uint64_t)slot * mt->seg_len + (uint64_t)q * mt->chunk_size;
		return ec_crc_padded(ec_iov_crc(v, off, vb, 0), NULL, 0, clen - vb);
	}
	return snap_crc32c_update(0, parity + (uint64_t)(slot - mt->k) * mt->seg_len + (uint64_t)q * mt->chunk_size, clen);
}

int ec_piece_crc_io(const struct snap_ec_meta *mt, int me, const struct ec_iov *v, const struct snap_ec_io *io,
		    int slot, uint32_t q, uint8_t *buf, uint32_t *crc)
{
	uint64_t clen = ec_chunk_len(mt, q);
	uint64_t len = slot < mt->k ? ec_valid(mt, me, slot, q) : clen;
	uint64_t off = (uint64_t)(slot < mt->k ? slot : slot - mt->k) * mt->seg_len + (uint64_t)q * mt->chunk_size;
	int rc = slot < mt->k ? ec_io_read(v, off, buf, len, io) : io->read(io->arg, -1, off, buf, len);
	if (!rc)
		*crc = ec_crc_padded(0, buf, len, clen - len);
	return rc;
}

int snap_ec_verify(const struct snap_ec_meta *mt, const struct iovec *iov, int iovcnt,
		   const void *parity, uint64_t parity_len, uint32_t *nbad, char *err, size_t errlen)
{
	struct ec_iov v;
	uint32_t bad = 0;
	if (nbad)
		*nbad = 0;
	if (!mt)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec verify: NULL meta");
	if (ec_iov_init(&v, iov, iovcnt))
		return ec_errf(err, errlen, SNAP_EINVAL, "ec verify: bad iovec list");
	uint64_t plen = (uint64_t)mt->m * mt->seg_len;
	int me = mt->index;
	if (v.total != mt->len[me] || parity_len != plen || (plen && !parity)) {
		ec_iov_fini(&v);
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec verify: buffers hold %llu data + %llu parity bytes, meta says %llu + %llu",
			       (unsigned long long)v.total, (unsigned long long)parity_len,
			       (unsigned long long)mt->len[me], (unsigned long long)plen);
	}
	if (err && errlen)
		err[0] = 0;
	for (int slot = 0; slot < mt->k + mt->m; slot++) {
		for (uint32_t q = 0; q < mt->nchunks; q++) {
			const char *what = slot < mt->k ? "data segment" : "parity row";
			int idx = slot < mt->k ? slot : slot - mt->k;
			if (ec_piece_crc(mt, me, &v, parity, slot, q) != *ec_meta_crc(mt, me, slot, q)) {
				if (bad == 0)
					ec_errf(err, errlen, SNAP_ECORRUPT,
						"ec verify: group %d index %d step %llu: %s %d chunk %u CRC mismatch",
						mt->group, me, (unsigned long long)mt->step, what, idx, q);
				bad++;
			}
		}
	}
	ec_iov_fini(&v);
	if (nbad)
		*nbad = bad;
	return bad ? SNAP_ECORRUPT : 0;
}
