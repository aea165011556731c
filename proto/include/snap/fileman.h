/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * fileman.h - the manifest of a captured file (integration/preload): a file
 * that a preloaded process wrote under a captured directory and that the
 * node store holds. Unlike a snapshot slot it has no layout: it is a byte
 * stream whose size was known only at close. Its manifest sits in the
 * store's namespace tree at the file's own path (smp/files/fileopen.c), so its name
 * is the file's name and a rename of the manifest is the file's rename.
 *
 *   magic "SNAPFIL\0" 8 | version u32 | crc u32 (CRC32C of bytes 16..end)
 *   length u64 | id u64 | size u64 | mtime_ns u64 | mode u32 | chunk u32
 *   nchunks u32 | crc u32 x nchunks (CRC32C of each chunk of the bytes)
 *
 * Decoded with the bounded reader; every field is checked, so a hostile or
 * torn manifest is refused with a reason, never half-believed.
 */
#ifndef SNAP_FILEMAN_H
#define SNAP_FILEMAN_H

#include <stddef.h>
#include <stdint.h>

#include "snap/buf.h"

#define SNAP_FMAN_MAGIC "SNAPFIL\0"
#define SNAP_FMAN_VERSION 1
#define SNAP_FMAN_HEADER 24
#define SNAP_FMAN_MAX (64u << 20)     /* 16M chunks: 64 TiB at 4 MiB */

struct snap_fman {
	uint64_t id;        /* data file: <store>/<job>/files/data/<id, 16 hex digits> */
	uint64_t size;      /* bytes of the file */
	uint64_t mtime_ns;  /* CLOCK_REALTIME at commit */
	uint32_t mode;      /* permission bits the file was created with (umask applied) */
	uint32_t chunk;     /* CRC granularity, 4 KiB .. 2 GiB */
	uint32_t nchunks;   /* ceil(size / chunk) */
	uint32_t *crc;      /* nchunks CRC32Cs */
};

/* ceil(size / chunk), or UINT32_MAX when that does not fit. */
uint32_t snap_fman_nchunks(uint64_t size, uint32_t chunk);
int snap_fman_encode(const struct snap_fman *m, struct snap_wbuf *w);
/* 0, or SNAP_EFORMAT/SNAP_ECORRUPT/SNAP_ENOMEM with why[] saying what is wrong. */
int snap_fman_decode(const void *buf, size_t len, struct snap_fman *m, char *err, size_t errlen);
void snap_fman_free(struct snap_fman *m);
/* CRC32C of each chunk of p[0..size) into crc[snap_fman_nchunks(size, chunk)]. */
void snap_fman_crcs(const void *p, uint64_t size, uint32_t chunk, uint32_t *crc);
/* Index of the first chunk of p[0..m->size) whose CRC differs, or -1. */
int64_t snap_fman_verify(const struct snap_fman *m, const void *p);
/* The data file's name for an id: 16 lower-case hex digits. */
void snap_fman_data_name(uint64_t id, char out[17]);

#endif
