/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * buf.h - bounded little-endian encoder/decoder for the manifest and wire
 * formats. The reader never reads past its end: every get sets `bad` on
 * underflow and returns zeros from then on, so a parser checks r->bad once
 * at the end instead of after every field. Hostile input therefore costs at
 * most a wrong value, never an out-of-bounds read.
 */
#ifndef SNAP_BUF_H
#define SNAP_BUF_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct snap_wbuf {
	uint8_t *p;
	size_t len, cap;
	int oom;        /* an allocation failed; contents are incomplete */
};

struct snap_rbuf {
	const uint8_t *p;
	size_t len, pos;
	int bad;        /* read past the end or malformed field */
};

int snap_wbuf_reserve(struct snap_wbuf *w, size_t more);
void snap_wbuf_free(struct snap_wbuf *w);
void snap_put_bytes(struct snap_wbuf *w, const void *src, size_t n);
void snap_put_u8(struct snap_wbuf *w, uint8_t v);
void snap_put_u16(struct snap_wbuf *w, uint16_t v);
void snap_put_u32(struct snap_wbuf *w, uint32_t v);
void snap_put_u64(struct snap_wbuf *w, uint64_t v);
/* u16 length + bytes, no terminator. */
void snap_put_str(struct snap_wbuf *w, const char *s);

/*
 * A checksummed record, as the manifests lay it out: magic 8, version u32,
 * crc u32, length u64, then the body; the CRC32C covers everything after the
 * crc field (from byte 16), the length counts the whole record. begin puts
 * the header with crc and length zero and returns where the record starts;
 * seal patches both once the body is in (SNAP_ENOMEM if a put failed).
 */
size_t snap_put_record_header(struct snap_wbuf *w, const char magic[8], uint32_t version);
int snap_seal_record(struct snap_wbuf *w, size_t start);

static inline void snap_rbuf_init(struct snap_rbuf *r, const void *p, size_t len)
{
	r->p = p;
	r->len = len;
	r->pos = 0;
	r->bad = 0;
}

const void *snap_get_bytes(struct snap_rbuf *r, size_t n);
uint8_t snap_get_u8(struct snap_rbuf *r);
uint16_t snap_get_u16(struct snap_rbuf *r);
uint32_t snap_get_u32(struct snap_rbuf *r);
uint64_t snap_get_u64(struct snap_rbuf *r);
/*
 * Read a u16-length string into out[cap] (NUL-terminated). Marks the reader
 * bad if the string is empty, longer than cap-1, or holds a NUL or control
 * byte: names travel into paths and terminals.
 */
void snap_get_str(struct snap_rbuf *r, char *out, size_t cap);

static inline size_t snap_rbuf_left(const struct snap_rbuf *r)
{
	return r->bad ? 0 : r->len - r->pos;
}

#endif
