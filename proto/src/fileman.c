/* SPDX-License-Identifier: BSD-3-Clause */
/* Captured-file manifests; see fileman.h for the format. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "snap/fileman.h"
#include "snap/base.h"

uint32_t snap_fman_nchunks(uint64_t size, uint32_t chunk)
{
	if (chunk == 0)
		return UINT32_MAX;
	uint64_t n = size / chunk + (size % chunk != 0);
	return n >= UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

int snap_fman_encode(const struct snap_fman *m, struct snap_wbuf *w)
{
	size_t start = snap_put_record_header(w, SNAP_FMAN_MAGIC, SNAP_FMAN_VERSION);
	snap_put_u64(w, m->id);
	snap_put_u64(w, m->size);
	snap_put_u64(w, m->mtime_ns);
	snap_put_u32(w, m->mode);
	snap_put_u32(w, m->chunk);
	snap_put_u32(w, m->nchunks);
	for (uint32_t i = 0; i < m->nchunks; i++)
		snap_put_u32(w, m->crc[i]);
	return snap_seal_record(w, start);
}

int snap_fman_decode(const void *buf, size_t len, struct snap_fman *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	struct snap_rbuf r;
	snap_rbuf_init(&r, buf, len);
	const void *magic = snap_get_bytes(&r, 8);
	uint32_t version = snap_get_u32(&r), crc = snap_get_u32(&r);
	uint64_t length = snap_get_u64(&r);
	if (r.bad || memcmp(magic, SNAP_FMAN_MAGIC, 8) != 0) {
		snap_fmt(err, errlen, "not a captured-file manifest (bad magic or shorter than its header)");
		return SNAP_EFORMAT;
	}
	if (version != SNAP_FMAN_VERSION) {
		snap_fmt(err, errlen, "captured-file manifest version %u, this build reads version %u", version,
			 SNAP_FMAN_VERSION);
		return SNAP_EFORMAT;
	}
	if (length != len || len > SNAP_FMAN_MAX) {
		snap_fmt(err, errlen, "manifest says %" PRIu64 " bytes, %zu present (torn)", length, len);
		return SNAP_ECORRUPT;
	}
	if (snap_crc32c((const uint8_t *)buf + 16, len - 16) != crc) {
		snap_fmt(err, errlen, "manifest checksum mismatch");
		return SNAP_ECORRUPT;
	}
	m->id = snap_get_u64(&r);
	m->size = snap_get_u64(&r);
	m->mtime_ns = snap_get_u64(&r);
	m->mode = snap_get_u32(&r);
	m->chunk = snap_get_u32(&r);
	m->nchunks = snap_get_u32(&r);
	if (r.bad || m->mode > 07777 || m->chunk < 4096 || m->chunk > (1u << 31) ||
	    m->nchunks != snap_fman_nchunks(m->size, m->chunk) || snap_rbuf_left(&r) != (size_t)m->nchunks * 4) {
		snap_fmt(err, errlen, "malformed captured-file manifest (size %" PRIu64 ", chunk %u, %u chunks, mode %o)",
			 m->size, m->chunk, m->nchunks, m->mode);
		return SNAP_ECORRUPT;
	}
	m->crc = malloc(sizeof(uint32_t) * (m->nchunks ? m->nchunks : 1));
	if (!m->crc)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < m->nchunks; i++)
		m->crc[i] = snap_get_u32(&r);
	return 0;
}

void snap_fman_free(struct snap_fman *m)
{
	free(m->crc);
	m->crc = NULL;
}

void snap_fman_crcs(const void *p, uint64_t size, uint32_t chunk, uint32_t *crc)
{
	const uint8_t *b = p;
	for (uint64_t off = 0, i = 0; off < size; off += chunk, i++)
		crc[i] = snap_crc32c(b + off, size - off < chunk ? (size_t)(size - off) : chunk);
}

int64_t snap_fman_verify(const struct snap_fman *m, const void *p)
{
	const uint8_t *b = p;
	for (uint64_t off = 0, i = 0; off < m->size; off += m->chunk, i++)
		if (snap_crc32c(b + off, m->size - off < m->chunk ? (size_t)(m->size - off) : m->chunk) != m->crc[i])
			return (int64_t)i;
	return -1;
}

void snap_fman_data_name(uint64_t id, char out[17])
{
	snprintf(out, 17, "%016" PRIx64, id);
}
