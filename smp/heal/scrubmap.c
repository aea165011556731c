/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The slot-file mappings the scrub keeps from one pass to the next, as the
 * mesh keeps its own (mesh/meshmap.c).
 *
 * Why: on a store of 4 KiB pages, mapping each chunk for one read and
 * unmapping it after spent most of the scrub's CPU time in the kernel's
 * page tables (filling them: filemap_map_pages; tearing them down: munmap),
 * and the scrub ran at 0.25-0.35 of a plain CRC32C of the same bytes. A
 * slot file is rewritten in place step after step (same inode, same size),
 * so one mapping of the whole file, kept while the path names the same
 * file, is filled once and read by every later pass (docs/benchmarks.md,
 * "Scrub").
 *
 * Memory: a shared mapping of a tmpfs file holds no memory of its own: its
 * pages are the file's, counted by the store's budget. It costs page
 * tables (8 bytes per 4 KiB page mapped: 2 MiB per GiB of slots, bounded by
 * the store's size) and address space. What it would keep is the pages of
 * a file the store has since deleted or replaced; the scrub sweeps its
 * mappings once a second (smp_scrub_maps_sweep), so such pages outlive the
 * file by at most that. At most SMP_SCRUB_MAPS files are mapped.
 *
 * A file truncated behind the daemon's back raises SIGBUS on the lost pages:
 * every read runs under heal.c's guard, and a fault drops the mapping.
 * Only the poll thread scrubs; no lock.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "heal/repair.h"
#include "heal/scrubmap.h"

static void drop(struct smp_scrub_maps *mm, unsigned i)
{
	munmap(mm->v[i].addr, mm->v[i].len);
	free(mm->v[i].path);
	mm->v[i] = mm->v[--mm->n];
}

static int same_file(const struct smp_scrub_map *e, const struct stat *st)
{
	return st->st_dev == e->dev && st->st_ino == e->ino && (uint64_t)st->st_size == e->len;
}

/* The mapping of the file open as fd at path: the kept one, or a new one (NULL: cannot). */
static struct smp_scrub_map *lookup(struct smp_scrub_maps *mm, const char *path, int fd, const struct stat *st)
{
	for (unsigned i = 0; i < mm->n; i++) {
		struct smp_scrub_map *e = &mm->v[i];
		if (strcmp(e->path, path))
			continue;
		if (same_file(e, st))
			return e;
		drop(mm, i);   /* replaced or resized */
		break;
	}
	if (!st->st_size)
		return NULL;
	if (mm->n == SMP_SCRUB_MAPS) {
		unsigned old = 0;
		for (unsigned i = 1; i < mm->n; i++)
			if (mm->v[i].used < mm->v[old].used)
				old = i;
		drop(mm, old);
	}
	char *dup = strdup(path);
	/* Filled in one call: the first pass pays the page tables, the later ones nothing. */
	void *p = dup ? mmap(NULL, (size_t)st->st_size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
	if (p == MAP_FAILED) {
		free(dup);
		return NULL;
	}
	mm->v[mm->n] = (struct smp_scrub_map){ dup, st->st_dev, st->st_ino, (uint64_t)st->st_size, p, 0 };
	return &mm->v[mm->n++];
}

int smp_scrub_map_crc(struct smp_scrub_maps *mm, const char *path, int fd, uint64_t off, uint64_t len, uint32_t *crc)
{
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < off + len)
		return -1;   /* short: its bytes are gone */
	if (!len) {
		*crc = 0;
		return 0;
	}
	struct smp_scrub_map *e = lookup(mm, path, fd, &st);
	if (!e)
		return -2;
	e->used = ++mm->clock;
	int rc = smp_heal_crc_mapped(e->addr + off, (size_t)len, crc);
	if (rc == -1)
		drop(mm, (unsigned)(e - mm->v));   /* truncated under it: the pages are gone */
	return rc;
}

unsigned smp_scrub_maps_sweep(struct smp_scrub_maps *mm)
{
	unsigned dropped = 0;
	for (unsigned i = 0; i < mm->n;) {
		struct stat st;
		if (stat(mm->v[i].path, &st) != 0 || !same_file(&mm->v[i], &st)) {
			drop(mm, i);
			dropped++;
		} else {
			i++;
		}
	}
	return dropped;
}

void smp_scrub_maps_free(struct smp_scrub_maps *mm)
{
	while (mm->n)
		drop(mm, mm->n - 1);
	mm->clock = 0;
}
