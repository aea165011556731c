/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * slotmap.h - slot files kept mapped read-only from one use to the next
 * (slotmap.c). One struct snap_slotmaps per thread: it has no lock.
 */
#ifndef SNAP_SMP_SLOTMAP_H
#define SNAP_SMP_SLOTMAP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct snap_slotmap {
	char *path;
	dev_t dev;
	ino_t ino;
	uint64_t len;
	void *addr;
	int warm;                     /* faulted in ahead (mesh/meshwarm.c), not read yet */
	int spill;                    /* over the cap: kept only until the next mapping over it */
};
struct snap_slotmaps {
	struct snap_slotmap *v;
	unsigned n, cap;
	int last;                     /* snap_slotmap_last */
	int lazy;                     /* map without MAP_POPULATE: the page tables fill as the pages
	                                 are read (a reader on the event loop must not stall on a big
	                                 slot's whole page tables at once) */
	unsigned max_maps;            /* the cap (0: none): at most max_maps mappings of at most */
	uint64_t max_bytes;           /* max_bytes in all are kept, plus one over it (see slotmap.c) */
	uint64_t bytes;               /* mapped by the kept ones (not the spill) */
};

/* The first len bytes of slot file path, mapped read-only (MAP_POPULATE
 * unless mm->lazy) the first time and kept while path names the same file; NULL with err
 * set when it cannot be opened, is shorter than len or cannot be mapped.
 * A file truncated behind the mapping raises SIGBUS on the lost pages: a
 * reader that does not pin the slot reads under a guard (heal/heal.c). */
const void *snap_slotmap_get(struct snap_slotmaps *mm, const char *path, uint64_t len, char *err, size_t errlen);
/* How the last snap_slotmap_get found its mapping: SNAP_SLOTMAP_KEPT (read
 * before), SNAP_SLOTMAP_WARM (faulted in ahead, first read now),
 * SNAP_SLOTMAP_COLD (mapped by that call). */
enum { SNAP_SLOTMAP_KEPT, SNAP_SLOTMAP_WARM, SNAP_SLOTMAP_COLD };
int snap_slotmap_last(const struct snap_slotmaps *mm);
/* Whether path is mapped (at len bytes). */
int snap_slotmap_has(const struct snap_slotmaps *mm, const char *path, uint64_t len);
/* Keep addr (len bytes of path, faulted in ahead) as path's mapping,
 * marked warm. 0, or -1 (path already mapped, or out of memory): the
 * caller unmaps it. */
int snap_slotmap_adopt(struct snap_slotmaps *mm, const char *path, dev_t dev, ino_t ino, uint64_t len, void *addr);
/* Drop path's mapping, if any. */
void snap_slotmap_drop(struct snap_slotmaps *mm, const char *path);
/* Drop every mapping whose path no longer names the file it maps (deleted,
 * replaced, shorter); returns how many went. */
unsigned snap_slotmaps_sweep(struct snap_slotmaps *mm);
void snap_slotmaps_free(struct snap_slotmaps *mm);

#endif
