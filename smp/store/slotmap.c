/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * slotmap.c - slot-file mappings kept from one read to the next: the mesh
 * thread's for its protects (mesh/protect.c), the scrub's for its passes
 * (heal/scrub.c), each its own struct snap_slotmaps.
 *
 * A trainer writes the same SNAP_SLOTS slot files step after step, so a
 * reader maps each once and keeps the mapping while the path names the same
 * file (device, inode, at least the mapped length). Mapping afresh for
 * every protect cost more than the copy: on the shadow-paged VMs this
 * project is measured on, the first touch of each page through a new
 * mapping traps to the hypervisor even after MAP_POPULATE filled the page
 * tables. A CRC32C pass over a freshly mapped 256 MiB slot ran at 1.7 GB/s,
 * a second pass over the same mapping at 26 GB/s, and mmap + munmap took
 * another 20 + 48 ms (see docs/design/mesh-and-ec.md, "Protect").
 *
 * Memory: a mapping holds no memory of its own (its page tables take 2 MiB
 * per GiB of 4 KiB pages), but it keeps the pages of a file the store has
 * since deleted or replaced. snap_slotmaps_sweep drops such mappings; the
 * mesh sweeps every round, the scrub every second, so a deleted slot
 * file's pages outlive the store's count of them by at most that long.
 *
 * A cap (max_maps, max_bytes) bounds what a reader of many files keeps
 * (the scrub of captured files: a job may hold thousands): the mappings
 * made while there is room are kept, and a mapping over the cap is kept
 * only until the next one over it (the spill). A reader that goes round
 * the same files in the same order, as the scrub does, then finds the
 * first files of its round mapped every pass and maps each of the others
 * once a pass, not once a chunk; dropping the least recently used instead
 * would unmap every file just before its next turn.
 *
 * One thread uses a struct snap_slotmaps; it needs no lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snap/base.h"
#include "store/slotmap.h"

static int same_file(const struct snap_slotmap *e, const struct stat *st)
{
	return st->st_dev == e->dev && st->st_ino == e->ino && (uint64_t)st->st_size >= e->len;
}

static void drop(struct snap_slotmaps *mm, unsigned i)
{
	munmap(mm->v[i].addr, mm->v[i].len);
	if (!mm->v[i].spill)
		mm->bytes -= mm->v[i].len;
	free(mm->v[i].path);
	mm->v[i] = mm->v[--mm->n];
}

/* Add a mapping to the list: 0, or -1 out of memory (the caller unmaps). */
static int keep(struct snap_slotmaps *mm, const char *path, dev_t dev, ino_t ino, uint64_t len, void *addr, int warm)
{
	unsigned kept = mm->n;
	for (unsigned i = 0; i < mm->n; i++)
		kept -= mm->v[i].spill;
	int spill = (mm->max_maps && kept >= mm->max_maps) || (mm->max_bytes && len > mm->max_bytes - mm->bytes);
	for (unsigned i = 0; spill && i < mm->n; i++)
		if (mm->v[i].spill) {
			drop(mm, i);   /* the one over the cap before this */
			break;
		}
	char *dup = strdup(path);
	if (dup && mm->n == mm->cap) {
		unsigned cap = mm->cap ? 2 * mm->cap : 16;
		struct snap_slotmap *v = realloc(mm->v, cap * sizeof(*v));
		if (v) {
			mm->v = v;
			mm->cap = cap;
		}
	}
	if (!dup || mm->n == mm->cap) {
		free(dup);
		return -1;
	}
	mm->v[mm->n++] = (struct snap_slotmap){ dup, dev, ino, len, addr, warm, spill };
	if (!spill)
		mm->bytes += len;
	return 0;
}

const void *snap_slotmap_get(struct snap_slotmaps *mm, const char *path, uint64_t len, char *err, size_t errlen)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		snap_fmt(err, errlen, "cannot open slot file %s: %s", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	for (unsigned i = 0; i < mm->n; i++) {
		struct snap_slotmap *e = &mm->v[i];
		if (strcmp(e->path, path))
			continue;
		if (e->len == len && same_file(e, &st)) {
			close(fd);
			mm->last = e->warm ? SNAP_SLOTMAP_WARM : SNAP_SLOTMAP_KEPT;
			e->warm = 0;
			return e->addr;
		}
		drop(mm, i);   /* replaced, resized or another length wanted */
		break;
	}
	void *p = MAP_FAILED;
	mm->last = SNAP_SLOTMAP_COLD;
	if ((uint64_t)st.st_size < len)
		errno = EINVAL;   /* mapping past the end would SIGBUS on first read */
	else
		p = mmap(NULL, len, PROT_READ, MAP_SHARED | (mm->lazy ? 0 : MAP_POPULATE), fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map %llu bytes of slot file %s: %s", (unsigned long long)len, path,
			 strerror(errno));
		return NULL;
	}
	if (keep(mm, path, st.st_dev, st.st_ino, len, p, 0) != 0) {
		munmap(p, len);
		snap_fmt(err, errlen, "out of memory for the mapping of %s", path);
		return NULL;
	}
	return p;
}

int snap_slotmap_last(const struct snap_slotmaps *mm)
{
	return mm->last;
}

int snap_slotmap_has(const struct snap_slotmaps *mm, const char *path, uint64_t len)
{
	for (unsigned i = 0; i < mm->n; i++)
		if (!strcmp(mm->v[i].path, path) && mm->v[i].len == len)
			return 1;
	return 0;
}

int snap_slotmap_adopt(struct snap_slotmaps *mm, const char *path, dev_t dev, ino_t ino, uint64_t len, void *addr)
{
	for (unsigned i = 0; i < mm->n; i++) {
		if (strcmp(mm->v[i].path, path))
			continue;
		if (mm->v[i].len == len && mm->v[i].dev == dev && mm->v[i].ino == ino)
			return -1;   /* a protect mapped it meanwhile */
		drop(mm, i);     /* an older file or length at the path */
		break;
	}
	return keep(mm, path, dev, ino, len, addr, 1);
}

void snap_slotmap_drop(struct snap_slotmaps *mm, const char *path)
{
	for (unsigned i = 0; i < mm->n; i++)
		if (!strcmp(mm->v[i].path, path)) {
			drop(mm, i);
			return;
		}
}

unsigned snap_slotmaps_sweep(struct snap_slotmaps *mm)
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

void snap_slotmaps_free(struct snap_slotmaps *mm)
{
	while (mm->n)
		drop(mm, mm->n - 1);
	free(mm->v);
	*mm = (struct snap_slotmaps){ 0 };
}
