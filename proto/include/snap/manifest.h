/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * manifest.h - the snapshot description: a layout (the registered regions and
 * where each sits in a slot) plus, once committed, the step and a CRC32C per
 * chunk of every region. The same layout encoding travels in REGISTER
 * messages; the manifest is what snapsmp publishes atomically next to a slot
 * file. Format: docs/design/store-and-protocol.md, "Manifest".
 */
#ifndef SNAP_MANIFEST_H
#define SNAP_MANIFEST_H

#include <stdint.h>

#include "snap/buf.h"
#include "snap/region.h"

#define SNAP_MAN_MAGIC "SNAPMAN\0"
#define SNAP_MAN_VERSION 2           /* 2: codec bound per region, stored length per chunk */
#define SNAP_MAN_HEADER 24          /* magic 8, version 4, crc 4, length 8 */
#define SNAP_MAX_REGIONS 65536
#define SNAP_SLOT_ALIGN 4096        /* regions start page-aligned in a slot */

struct snap_man_region {
	char name[SNAP_NAME_MAX + 1];
	uint8_t dtype, kind, device, codec, ndim;
	double bound;                   /* codec bound or factor (snap/codec.h); 0 without a codec */
	uint64_t offset;                /* byte offset in the slot */
	uint64_t bytes;                 /* raw bytes of the region */
	uint64_t frame_cap;             /* codec: slot bytes reserved per chunk (its worst case); 0 raw */
	uint64_t shape[SNAP_MAX_NDIM];
	uint64_t global_shape[SNAP_MAX_NDIM];
	uint64_t shard_offset[SNAP_MAX_NDIM];
	uint32_t nchunks;               /* ceil(bytes / chunk_size) */
	uint32_t first_crc;             /* index of this region's first CRC in crc[] */
};

struct snap_layout {
	uint32_t nregions;
	struct snap_man_region *regions;
	uint64_t slot_bytes;            /* end of the last region, page-rounded */
	uint64_t raw_bytes;             /* sum of region bytes */
	uint64_t chunk_size;
	uint32_t ncrc;                  /* sum of nchunks */
};

struct snap_manifest {
	char job[SNAP_JOB_MAX + 1];
	uint32_t rank, world;
	uint64_t step;
	uint32_t slot;
	uint64_t wall_ns;               /* CLOCK_REALTIME at commit, for humans */
	uint64_t gen;                   /* job generation (incarnation) that committed it */
	struct snap_layout layout;
	uint32_t *crc;                  /* layout.ncrc entries: CRC32C of each chunk as stored */
	uint32_t *len;                  /* layout.ncrc entries: bytes stored per chunk (the raw
	                                   length, or a codec chunk's frame length) */
};

/*
 * Chunk t of a layout. A raw chunk is stored as is at slot_off; a codec
 * chunk (g->codec != NONE) is one snap/codec.h stream ("frame") of the raw
 * range, stored at slot_off in an area of cap bytes.
 */
struct snap_chunk {
	const struct snap_man_region *g;
	uint32_t index;                 /* within the region */
	uint64_t raw_off, raw_len;      /* the raw bytes it holds, relative to the region */
	uint64_t slot_off, cap;         /* where it is stored in the slot, and the room there */
};

/*
 * Place regions in a slot (page-aligned, in registration order) and count
 * chunks. Checks every field: dtype/kind known, shape product == bytes,
 * shard inside the global shape, names unique. On error writes a message
 * naming the region into err.
 */
int snap_layout_build(struct snap_layout *lay, const struct snap_region *regs, uint32_t n,
		      uint64_t chunk_size, char *err, size_t errlen);
void snap_layout_encode(struct snap_wbuf *w, const struct snap_layout *lay);
/* Decode and validate (same checks as build, plus offsets). */
int snap_layout_decode(struct snap_rbuf *r, struct snap_layout *lay, char *err, size_t errlen);
void snap_layout_free(struct snap_layout *lay);
/* 0 if equal; else SNAP_EMISMATCH with a message naming the first difference. */
int snap_layout_compare(const struct snap_layout *have, const struct snap_layout *want, char *err, size_t errlen);

/* Chunk t of the layout (0 <= t < ncrc). */
void snap_layout_chunk(const struct snap_layout *lay, uint32_t t, struct snap_chunk *c);
/*
 * Check stored lengths against the layout: a raw chunk's must be its raw
 * length, a codec chunk's at least a stream header and at most its cap.
 * Returns 0 or SNAP_EPROTO naming the region and chunk.
 */
int snap_layout_check_lens(const struct snap_layout *lay, const uint32_t *len, char *err, size_t errlen);
/*
 * Check every chunk of a slot mapped at base against crc[] and len[] (already
 * checked by snap_layout_check_lens). Returns the number of bad chunks;
 * *first_bad (may be NULL) gets the first one's index.
 */
uint32_t snap_layout_verify(const struct snap_layout *lay, const uint8_t *base, const uint32_t *crc,
			    const uint32_t *len, uint32_t *first_bad);

/* Serialize with header and checksum. Returns 0 or SNAP_ENOMEM. */
int snap_manifest_encode(const struct snap_manifest *m, struct snap_wbuf *w);
/*
 * Parse and verify (magic, version, length, checksum, every field). On error
 * returns SNAP_EFORMAT, SNAP_ETRUNC, SNAP_ECORRUPT or SNAP_EPROTO with a
 * message. On success the caller owns *m (snap_manifest_free).
 */
int snap_manifest_decode(const void *buf, size_t len, struct snap_manifest *m, char *err, size_t errlen);
void snap_manifest_free(struct snap_manifest *m);

#endif
