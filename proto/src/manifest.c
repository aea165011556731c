/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Layout and manifest encoding. Decoding is written for hostile input: every
 * count is bounded before anything is allocated, and every region is checked
 * against the slot it claims to describe.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/manifest.h"
#include "snap/codec.h"

static int name_cmp(const void *a, const void *b)
{
	const struct snap_man_region *const *x = a, *const *y = b;
	return strcmp((*x)->name, (*y)->name);
}

/* Checks shared by build and decode. */
static int check_region(const struct snap_man_region *g, char *err, size_t errlen)
{
	size_t esz = snap_dtype_size(g->dtype);
	if (esz == 0 || g->kind >= SNAP_KIND_COUNT_ || g->device >= SNAP_DEVICE_COUNT_ ||
	    g->codec >= SNAP_CODEC_COUNT_ || g->ndim > SNAP_MAX_NDIM) {
		snap_fmt(err, errlen, "region \"%s\": unknown dtype, kind, device or codec, or ndim > %d",
			 g->name, SNAP_MAX_NDIM);
		return SNAP_EINVAL;
	}
	if (g->codec != SNAP_CODEC_NONE) {
		struct snap_codec_params p = { .codec = g->codec, .dtype = g->dtype, .bound = g->bound };
		int rc = snap_codec_check(&p);
		if (rc == SNAP_EINVAL) {
			snap_fmt(err, errlen, "region \"%s\": codec %s needs an f32, bf16 or f16 region, not %s", g->name,
				 snap_codec_spec_name(g->codec), snap_dtype_name(g->dtype));
			return rc;
		}
		if (rc) {
			snap_fmt(err, errlen, "region \"%s\": codec bound %g is out of range for %s (see snap/codec.h)",
				 g->name, g->bound, snap_codec_spec_name(g->codec));
			return rc;
		}
	} else if (g->bound != 0) {
		snap_fmt(err, errlen, "region \"%s\": a codec bound without a codec", g->name);
		return SNAP_EINVAL;
	}
	if (g->bytes % esz) {
		snap_fmt(err, errlen, "region \"%s\": %" PRIu64 " bytes is not a whole number of %s elements",
			 g->name, g->bytes, snap_dtype_name(g->dtype));
		return SNAP_EINVAL;
	}
	if (g->ndim == 0)
		return 0;
	uint64_t elems = 1;
	for (int d = 0; d < g->ndim; d++) {
		if (g->shape[d] && elems > UINT64_MAX / g->shape[d]) {
			snap_fmt(err, errlen, "region \"%s\": shape overflows", g->name);
			return SNAP_EINVAL;
		}
		elems *= g->shape[d];
		if (g->shard_offset[d] > g->global_shape[d] ||
		    g->shape[d] > g->global_shape[d] - g->shard_offset[d]) {
			snap_fmt(err, errlen, "region \"%s\": shard [offset %" PRIu64 ", size %" PRIu64
				 "] lies outside global dim %d of size %" PRIu64,
				 g->name, g->shard_offset[d], g->shape[d], d, g->global_shape[d]);
			return SNAP_EINVAL;
		}
	}
	if (elems > UINT64_MAX / esz || elems * esz != g->bytes) {
		snap_fmt(err, errlen, "region \"%s\": shape holds %" PRIu64 " elements but bytes is %" PRIu64,
			 g->name, elems, g->bytes);
		return SNAP_EINVAL;
	}
	return 0;
}

/* Offsets, chunk counts and name uniqueness; fills slot_bytes and ncrc. */
static int finish_layout(struct snap_layout *lay, int assign_offsets, char *err, size_t errlen)
{
	uint64_t end = 0, ncrc = 0;
	lay->raw_bytes = 0;
	for (uint32_t i = 0; i < lay->nregions; i++) {
		struct snap_man_region *g = &lay->regions[i];
		int rc = check_region(g, err, errlen);
		if (rc)
			return rc;
		uint64_t aligned = (end + SNAP_SLOT_ALIGN - 1) / SNAP_SLOT_ALIGN * SNAP_SLOT_ALIGN;
		if (assign_offsets)
			g->offset = aligned;
		if (g->offset != aligned) {
			snap_fmt(err, errlen, "region \"%s\": offset %" PRIu64 " is not the packed offset %" PRIu64,
				 g->name, g->offset, aligned);
			return SNAP_EPROTO;
		}
		if (g->bytes > (1ull << 50) || g->offset > (1ull << 50)) {
			snap_fmt(err, errlen, "region \"%s\": size %" PRIu64 " is beyond 1 PiB", g->name, g->bytes);
			return SNAP_EINVAL;
		}
		uint64_t nch = (g->bytes + lay->chunk_size - 1) / lay->chunk_size;
		g->frame_cap = 0;
		if (g->codec != SNAP_CODEC_NONE) {
			/* Every chunk gets its worst case: the budget holds whatever the data. */
			size_t esz = snap_dtype_size(g->dtype);
			struct snap_codec_params p = { .codec = g->codec, .dtype = g->dtype, .bound = g->bound };
			g->frame_cap = lay->chunk_size % esz ? 0 : snap_codec_bound(&p, lay->chunk_size / esz);
			if (g->frame_cap == 0 || g->frame_cap > UINT32_MAX) {
				snap_fmt(err, errlen, "region \"%s\": chunk size %" PRIu64 " does not suit codec %s",
					 g->name, lay->chunk_size, snap_codec_spec_name(g->codec));
				return SNAP_EINVAL;
			}
			end = g->offset + nch * g->frame_cap;
		} else {
			end = g->offset + g->bytes;
		}
		lay->raw_bytes += g->bytes;
		if (assign_offsets)
			g->nchunks = (uint32_t)nch;
		if (g->nchunks != nch) {
			snap_fmt(err, errlen, "region \"%s\": %u chunks recorded, %" PRIu64 " expected",
				 g->name, g->nchunks, nch);
			return SNAP_EPROTO;
		}
		g->first_crc = (uint32_t)ncrc;
		ncrc += nch;
		if (ncrc > (1u << 26)) {
			snap_fmt(err, errlen, "layout has more than 2^26 chunks: raise the chunk size");
			return SNAP_EINVAL;
		}
	}
	lay->slot_bytes = (end + SNAP_SLOT_ALIGN - 1) / SNAP_SLOT_ALIGN * SNAP_SLOT_ALIGN;
	lay->ncrc = (uint32_t)ncrc;

	const struct snap_man_region **sorted = malloc(sizeof(*sorted) * (lay->nregions ? lay->nregions : 1));
	if (!sorted)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < lay->nregions; i++)
		sorted[i] = &lay->regions[i];
	qsort(sorted, lay->nregions, sizeof(*sorted), name_cmp);
	for (uint32_t i = 1; i < lay->nregions; i++) {
		if (strcmp(sorted[i - 1]->name, sorted[i]->name) == 0) {
			snap_fmt(err, errlen, "region name \"%s\" is registered twice", sorted[i]->name);
			free(sorted);
			return SNAP_EINVAL;
		}
	}
	free(sorted);
	return 0;
}

static int name_ok(const char *name)
{
	size_t n = name ? strlen(name) : 0;
	if (n == 0 || n > SNAP_NAME_MAX)
		return 0;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return 0;
	return 1;
}

int snap_layout_build(struct snap_layout *lay, const struct snap_region *regs, uint32_t n,
		      uint64_t chunk_size, char *err, size_t errlen)
{
	memset(lay, 0, sizeof(*lay));
	if (n > SNAP_MAX_REGIONS || chunk_size < 4096 || chunk_size > (1ull << 31)) {
		snap_fmt(err, errlen, "at most %d regions and a chunk size in [4 KiB, 2 GiB]", SNAP_MAX_REGIONS);
		return SNAP_EINVAL;
	}
	lay->chunk_size = chunk_size;
	lay->nregions = n;
	lay->regions = calloc(n ? n : 1, sizeof(*lay->regions));
	if (!lay->regions)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < n; i++) {
		const struct snap_region *r = &regs[i];
		struct snap_man_region *g = &lay->regions[i];
		if (!name_ok(r->name)) {
			snap_fmt(err, errlen, "region %u: name must be 1-%d printable bytes", i, SNAP_NAME_MAX);
			snap_layout_free(lay);
			return SNAP_EINVAL;
		}
		if (r->ndim < 0 || r->ndim > SNAP_MAX_NDIM || r->dtype < 0 || r->kind < 0 || r->device < 0 || r->codec < 0) {
			snap_fmt(err, errlen, "region \"%s\": negative enum or ndim outside [0, %d]", r->name, SNAP_MAX_NDIM);
			snap_layout_free(lay);
			return SNAP_EINVAL;
		}
		strcpy(g->name, r->name);
		g->dtype = (uint8_t)r->dtype;
		g->kind = (uint8_t)r->kind;
		g->device = (uint8_t)r->device;
		g->codec = (uint8_t)r->codec;
		g->bound = r->codec == SNAP_CODEC_NONE ? 0 : r->codec_bound;
		g->ndim = (uint8_t)r->ndim;
		g->bytes = r->bytes;
		for (int d = 0; d < r->ndim; d++) {
			g->shape[d] = r->shape[d];
			g->global_shape[d] = r->global_shape[d];
			g->shard_offset[d] = r->shard_offset[d];
		}
	}
	int rc = finish_layout(lay, 1, err, errlen);
	if (rc)
		snap_layout_free(lay);
	return rc;
}

void snap_layout_encode(struct snap_wbuf *w, const struct snap_layout *lay)
{
	snap_put_u64(w, lay->chunk_size);
	snap_put_u32(w, lay->nregions);
	for (uint32_t i = 0; i < lay->nregions; i++) {
		const struct snap_man_region *g = &lay->regions[i];
		snap_put_str(w, g->name);
		snap_put_u8(w, g->dtype);
		snap_put_u8(w, g->kind);
		snap_put_u8(w, g->device);
		snap_put_u8(w, g->codec);
		snap_put_u8(w, g->ndim);
		uint64_t bits;
		memcpy(&bits, &g->bound, sizeof(bits));
		snap_put_u64(w, bits);
		snap_put_u64(w, g->offset);
		snap_put_u64(w, g->bytes);
		snap_put_u32(w, g->nchunks);
		for (int d = 0; d < g->ndim; d++) {
			snap_put_u64(w, g->shape[d]);
			snap_put_u64(w, g->global_shape[d]);
			snap_put_u64(w, g->shard_offset[d]);
		}
	}
}

int snap_layout_decode(struct snap_rbuf *r, struct snap_layout *lay, char *err, size_t errlen)
{
	memset(lay, 0, sizeof(*lay));
	lay->chunk_size = snap_get_u64(r);
	lay->nregions = snap_get_u32(r);
	/* A region takes at least 36 encoded bytes: bound the allocation by the input. */
	if (r->bad || lay->chunk_size < 4096 || lay->chunk_size > (1ull << 31) ||
	    lay->nregions > SNAP_MAX_REGIONS || lay->nregions > snap_rbuf_left(r) / 36) {
		snap_fmt(err, errlen, "layout header is malformed (chunk size %" PRIu64 ", %u regions)",
			 lay->chunk_size, lay->nregions);
		lay->nregions = 0;
		return SNAP_EPROTO;
	}
	lay->regions = calloc(lay->nregions ? lay->nregions : 1, sizeof(*lay->regions));
	if (!lay->regions)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < lay->nregions && !r->bad; i++) {
		struct snap_man_region *g = &lay->regions[i];
		snap_get_str(r, g->name, sizeof(g->name));
		g->dtype = snap_get_u8(r);
		g->kind = snap_get_u8(r);
		g->device = snap_get_u8(r);
		g->codec = snap_get_u8(r);
		g->ndim = snap_get_u8(r);
		uint64_t bits = snap_get_u64(r);
		memcpy(&g->bound, &bits, sizeof(bits));
		g->offset = snap_get_u64(r);
		g->bytes = snap_get_u64(r);
		g->nchunks = snap_get_u32(r);
		if (g->ndim > SNAP_MAX_NDIM)
			r->bad = 1;
		for (int d = 0; d < g->ndim && !r->bad; d++) {
			g->shape[d] = snap_get_u64(r);
			g->global_shape[d] = snap_get_u64(r);
			g->shard_offset[d] = snap_get_u64(r);
		}
	}
	if (r->bad) {
		snap_fmt(err, errlen, "layout is truncated or holds a malformed region name");
		snap_layout_free(lay);
		return SNAP_EPROTO;
	}
	int rc = finish_layout(lay, 0, err, errlen);
	if (rc) {
		snap_layout_free(lay);
		return rc == SNAP_ENOMEM ? rc : SNAP_EPROTO;
	}
	return 0;
}

void snap_layout_free(struct snap_layout *lay)
{
	free(lay->regions);
	memset(lay, 0, sizeof(*lay));
}

int snap_layout_compare(const struct snap_layout *have, const struct snap_layout *want, char *err, size_t errlen)
{
	for (uint32_t i = 0; i < want->nregions; i++) {
		const struct snap_man_region *w = &want->regions[i], *h = NULL;
		for (uint32_t j = 0; j < have->nregions && !h; j++) {
			/* Same position first: layouts usually match in order. */
			uint32_t k = (i + j) % have->nregions;
			if (strcmp(have->regions[k].name, w->name) == 0)
				h = &have->regions[k];
		}
		if (!h) {
			snap_fmt(err, errlen, "region \"%s\" is registered but not in the snapshot", w->name);
			return SNAP_EMISMATCH;
		}
		if (h->bytes != w->bytes || h->dtype != w->dtype) {
			snap_fmt(err, errlen, "region \"%s\": registered as %" PRIu64 " bytes of %s, snapshot holds %"
				 PRIu64 " bytes of %s", w->name, w->bytes, snap_dtype_name(w->dtype), h->bytes,
				 snap_dtype_name(h->dtype));
			return SNAP_EMISMATCH;
		}
	}
	if (have->nregions != want->nregions) {
		for (uint32_t j = 0; j < have->nregions; j++) {
			int found = 0;
			for (uint32_t i = 0; i < want->nregions && !found; i++)
				found = strcmp(have->regions[j].name, want->regions[i].name) == 0;
			if (!found) {
				snap_fmt(err, errlen, "snapshot holds region \"%s\", which is not registered",
					 have->regions[j].name);
				return SNAP_EMISMATCH;
			}
		}
	}
	return 0;
}

void snap_layout_chunk(const struct snap_layout *lay, uint32_t t, struct snap_chunk *c)
{
	/* Binary search: regions' first_crc values increase. */
	uint32_t lo = 0, hi = lay->nregions;
	while (hi - lo > 1) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (lay->regions[mid].first_crc <= t)
			lo = mid;
		else
			hi = mid;
	}
	/* The last region starting at or before t holds it: an empty region
	 * shares its first_crc with the next one, which the search prefers. */
	const struct snap_man_region *g = &lay->regions[lo];
	c->g = g;
	c->index = t - g->first_crc;
	c->raw_off = (uint64_t)c->index * lay->chunk_size;
	c->raw_len = g->bytes - c->raw_off < lay->chunk_size ? g->bytes - c->raw_off : lay->chunk_size;
	c->cap = g->frame_cap ? g->frame_cap : c->raw_len;
	c->slot_off = g->offset + (g->frame_cap ? (uint64_t)c->index * g->frame_cap : c->raw_off);
}

int snap_layout_check_lens(const struct snap_layout *lay, const uint32_t *len, char *err, size_t errlen)
{
	for (uint32_t t = 0; t < lay->ncrc; t++) {
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		int ok = c.g->frame_cap ? len[t] >= SNAP_CODEC_HEADER_BYTES && len[t] <= c.cap : len[t] == c.raw_len;
		if (!ok) {
			snap_fmt(err, errlen, "region \"%s\" chunk %u: %u bytes stored, the layout allows %s%" PRIu64,
				 c.g->name, c.index, len[t], c.g->frame_cap ? "at most " : "exactly ", c.cap);
			return SNAP_EPROTO;
		}
	}
	return 0;
}

uint32_t snap_layout_verify(const struct snap_layout *lay, const uint8_t *base, const uint32_t *crc,
			    const uint32_t *len, uint32_t *first_bad)
{
	uint32_t bad = 0;
	for (uint32_t t = 0; t < lay->ncrc; t++) {
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		if (snap_crc32c(base + c.slot_off, len[t]) != crc[t]) {
			if (!bad && first_bad)
				*first_bad = t;
			bad++;
		}
	}
	return bad;
}

int snap_manifest_encode(const struct snap_manifest *m, struct snap_wbuf *w)
{
	size_t start = snap_put_record_header(w, SNAP_MAN_MAGIC, SNAP_MAN_VERSION);
	snap_put_str(w, m->job);
	snap_put_u32(w, m->rank);
	snap_put_u32(w, m->world);
	snap_put_u64(w, m->step);
	snap_put_u32(w, m->slot);
	snap_put_u64(w, m->wall_ns);
	snap_put_u64(w, m->gen);
	snap_layout_encode(w, &m->layout);
	for (uint32_t i = 0; i < m->layout.ncrc; i++)
		snap_put_u32(w, m->crc[i]);
	for (uint32_t i = 0; i < m->layout.ncrc; i++)
		snap_put_u32(w, m->len[i]);
	return snap_seal_record(w, start);
}

int snap_manifest_decode(const void *buf, size_t len, struct snap_manifest *m, char *err, size_t errlen)
{
	memset(m, 0, sizeof(*m));
	struct snap_rbuf r;
	snap_rbuf_init(&r, buf, len);
	const void *magic = snap_get_bytes(&r, 8);
	uint32_t version = snap_get_u32(&r);
	uint32_t crc = snap_get_u32(&r);
	uint64_t total = snap_get_u64(&r);
	if (r.bad || memcmp(magic, SNAP_MAN_MAGIC, 8) != 0) {
		snap_fmt(err, errlen, "not a libsnap manifest (bad magic or shorter than its header)");
		return SNAP_EFORMAT;
	}
	if (version != SNAP_MAN_VERSION) {
		snap_fmt(err, errlen, "manifest version %u is not supported (this build reads %d)", version, SNAP_MAN_VERSION);
		return SNAP_EFORMAT;
	}
	if (total != len) {
		snap_fmt(err, errlen, "manifest says %" PRIu64 " bytes but %zu are present", total, len);
		return total > len ? SNAP_ETRUNC : SNAP_ECORRUPT;
	}
	if (snap_crc32c((const uint8_t *)buf + 16, len - 16) != crc) {
		snap_fmt(err, errlen, "manifest checksum mismatch");
		return SNAP_ECORRUPT;
	}
	snap_get_str(&r, m->job, sizeof(m->job));
	m->rank = snap_get_u32(&r);
	m->world = snap_get_u32(&r);
	m->step = snap_get_u64(&r);
	m->slot = snap_get_u32(&r);
	m->wall_ns = snap_get_u64(&r);
	m->gen = snap_get_u64(&r);
	if (r.bad || !snap_job_name_ok(m->job) || m->world == 0 || m->rank >= m->world) {
		snap_fmt(err, errlen, "manifest header fields are invalid (job, rank %u, world %u)", m->rank, m->world);
		return SNAP_EPROTO;
	}
	int rc = snap_layout_decode(&r, &m->layout, err, errlen);
	if (rc)
		return rc;
	if (snap_rbuf_left(&r) != (size_t)m->layout.ncrc * 8) {
		snap_fmt(err, errlen, "manifest holds %zu checksum and length bytes, layout needs %zu",
			 snap_rbuf_left(&r), (size_t)m->layout.ncrc * 8);
		snap_manifest_free(m);
		return SNAP_EPROTO;
	}
	m->crc = malloc(sizeof(uint32_t) * (m->layout.ncrc ? m->layout.ncrc : 1));
	m->len = malloc(sizeof(uint32_t) * (m->layout.ncrc ? m->layout.ncrc : 1));
	if (!m->crc || !m->len) {
		snap_manifest_free(m);
		return SNAP_ENOMEM;
	}
	for (uint32_t i = 0; i < m->layout.ncrc; i++)
		m->crc[i] = snap_get_u32(&r);
	for (uint32_t i = 0; i < m->layout.ncrc; i++)
		m->len[i] = snap_get_u32(&r);
	if ((rc = snap_layout_check_lens(&m->layout, m->len, err, errlen))) {
		snap_manifest_free(m);
		return rc;
	}
	return 0;
}

void snap_manifest_free(struct snap_manifest *m)
{
	snap_layout_free(&m->layout);
	free(m->crc);
	free(m->len);
	m->crc = NULL;
	m->len = NULL;
}
