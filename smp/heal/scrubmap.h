/* SPDX-License-Identifier: BSD-3-Clause */
/* scrubmap.h - the slot-file mappings the scrub keeps across passes; see scrubmap.c. */
#ifndef SNAP_SCRUBMAP_H
#define SNAP_SCRUBMAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* At most this many files mapped at once (the oldest used goes first). */
#define SMP_SCRUB_MAPS 256

struct smp_scrub_map {
	char *path;
	dev_t dev;
	ino_t ino;
	uint64_t len;      /* the file's size when it was mapped: the mapping's length */
	uint8_t *addr;
	uint64_t used;     /* the cache's clock when last used */
};

struct smp_scrub_maps {
	struct smp_scrub_map v[SMP_SCRUB_MAPS];
	unsigned n;
	uint64_t clock;
};

/*
 * CRC32C of len bytes at off of the file open as fd (at path), through a
 * mapping of the whole file kept from one call to the next while the file
 * is the same one (device, inode, size), read under heal.c's SIGBUS guard.
 * 0 and *crc; -1 when the file is shorter than off + len or its bytes
 * cannot be read (a file truncated under the mapping: the mapping is
 * dropped); -2 when the file cannot be mapped (the caller reads it another
 * way).
 */
int smp_scrub_map_crc(struct smp_scrub_maps *mm, const char *path, int fd, uint64_t off, uint64_t len, uint32_t *crc);

/* Drop the mappings of files that are gone, replaced or resized at their
 * path: what a mapping keeps of a deleted file is freed. How many. */
unsigned smp_scrub_maps_sweep(struct smp_scrub_maps *mm);

void smp_scrub_maps_free(struct smp_scrub_maps *mm);

#endif
