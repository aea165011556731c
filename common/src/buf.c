/* SPDX-License-Identifier: BSD-3-Clause */
/* Bounded little-endian encoding; see buf.h. x86 and ARM are little-endian,
 * but we encode byte by byte so the format never depends on the host. */
#include "snap/base.h"
#include "snap/buf.h"

int snap_wbuf_reserve(struct snap_wbuf *w, size_t more)
{
	if (w->oom)
		return -1;
	if (w->len + more <= w->cap)
		return 0;
	size_t cap = w->cap ? w->cap : 256;
	while (cap < w->len + more)
		cap *= 2;
	uint8_t *p = realloc(w->p, cap);
	if (!p) {
		w->oom = 1;
		return -1;
	}
	w->p = p;
	w->cap = cap;
	return 0;
}

void snap_wbuf_free(struct snap_wbuf *w)
{
	free(w->p);
	memset(w, 0, sizeof(*w));
}

void snap_put_bytes(struct snap_wbuf *w, const void *src, size_t n)
{
	if (n == 0 || snap_wbuf_reserve(w, n))
		return;
	memcpy(w->p + w->len, src, n);
	w->len += n;
}

static void put_le(struct snap_wbuf *w, uint64_t v, int n)
{
	uint8_t b[8];
	for (int i = 0; i < n; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	snap_put_bytes(w, b, (size_t)n);
}

void snap_put_u8(struct snap_wbuf *w, uint8_t v) { put_le(w, v, 1); }
void snap_put_u16(struct snap_wbuf *w, uint16_t v) { put_le(w, v, 2); }
void snap_put_u32(struct snap_wbuf *w, uint32_t v) { put_le(w, v, 4); }
void snap_put_u64(struct snap_wbuf *w, uint64_t v) { put_le(w, v, 8); }

void snap_put_str(struct snap_wbuf *w, const char *s)
{
	size_t n = strlen(s);
	if (n > UINT16_MAX)
		n = UINT16_MAX;
	snap_put_u16(w, (uint16_t)n);
	snap_put_bytes(w, s, n);
}

const void *snap_get_bytes(struct snap_rbuf *r, size_t n)
{
	if (r->bad || n > r->len - r->pos) {
		r->bad = 1;
		return NULL;
	}
	const void *p = r->p + r->pos;
	r->pos += n;
	return p;
}

static uint64_t get_le(struct snap_rbuf *r, int n)
{
	const uint8_t *b = snap_get_bytes(r, (size_t)n);
	uint64_t v = 0;
	if (!b)
		return 0;
	for (int i = 0; i < n; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

uint8_t snap_get_u8(struct snap_rbuf *r) { return (uint8_t)get_le(r, 1); }
uint16_t snap_get_u16(struct snap_rbuf *r) { return (uint16_t)get_le(r, 2); }
uint32_t snap_get_u32(struct snap_rbuf *r) { return (uint32_t)get_le(r, 4); }
uint64_t snap_get_u64(struct snap_rbuf *r) { return get_le(r, 8); }

void snap_get_str(struct snap_rbuf *r, char *out, size_t cap)
{
	uint16_t n = snap_get_u16(r);
	const char *s = snap_get_bytes(r, n);
	out[0] = '\0';
	if (!s || n == 0 || n >= cap) {
		r->bad = 1;
		return;
	}
	for (uint16_t i = 0; i < n; i++) {
		if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
			r->bad = 1;
			return;
		}
	}
	memcpy(out, s, n);
	out[n] = '\0';
}

size_t snap_put_record_header(struct snap_wbuf *w, const char magic[8], uint32_t version)
{
	size_t start = w->len;
	snap_put_bytes(w, magic, 8);
	snap_put_u32(w, version);
	snap_put_u32(w, 0);   /* crc, patched by snap_seal_record */
	snap_put_u64(w, 0);   /* length, likewise */
	return start;
}

int snap_seal_record(struct snap_wbuf *w, size_t start)
{
	if (w->oom)
		return SNAP_ENOMEM;
	uint64_t len = w->len - start;
	for (int i = 0; i < 8; i++)
		w->p[start + 16 + i] = (uint8_t)(len >> (8 * i));
	uint32_t crc = snap_crc32c(w->p + start + 16, len - 16);
	for (int i = 0; i < 4; i++)
		w->p[start + 12 + i] = (uint8_t)(crc >> (8 * i));
	return 0;
}
