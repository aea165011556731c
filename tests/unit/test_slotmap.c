/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Slot files kept mapped (smp/store/slotmap.c) and the scrub's guarded read
 * of such a mapping (smp/heal/heal.c):
 *   - a second get of the same file returns the same mapping (KEPT), a file
 *     replaced at the path (rename over it) or a different length is mapped
 *     afresh (COLD), a file shorter than the length asked is refused;
 *   - a mapping adopted from ahead is WARM at its first get, KEPT after;
 *   - the sweep drops the mappings of deleted and replaced files and keeps
 *     the others; drop and free leave nothing mapped (ASan: nothing leaks);
 *   - a file truncated behind a kept (lazily filled) mapping: the guarded CRC over the lost
 *     pages returns -1 instead of the SIGBUS killing the process, and a
 *     CRC over pages still there is the file's;
 *   - the cap (max_maps, max_bytes): over a round of more files than it
 *     allows, the first ones are kept (KEPT on the next round), each of the
 *     others mapped once a round (COLD), and this process never maps more
 *     than the cap plus one of them (counted in /proc/self/maps).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../smp/store/slotmap.h"
#include "snap/base.h"
#include "../check.h"

/* heal.c's guarded read, declared here: its header pulls in the daemon's types. */
void smp_heal_guard_init(void);
int smp_heal_crc_mapped(const uint8_t *p, size_t len, uint32_t *crc);

#define LEN (256u << 10)

static char dir[64];

static void write_file(const char *path, uint64_t len, int seed)
{
	uint8_t *b = malloc(len);
	for (uint64_t i = 0; i < len; i++)
		b[i] = (uint8_t)(i * 31 + (uint64_t)seed);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0 && write(fd, b, len) == (ssize_t)len);
	if (fd >= 0)
		close(fd);
	free(b);
}

static void kept_and_replaced(void)
{
	char a[128], b[128], tmp[128], err[256];
	snprintf(a, sizeof(a), "%s/slot-0", dir);
	snprintf(b, sizeof(b), "%s/slot-1", dir);
	snprintf(tmp, sizeof(tmp), "%s/slot-0.tmp", dir);
	write_file(a, LEN, 1);
	write_file(b, LEN, 2);
	struct snap_slotmaps mm = { 0 };
	const uint8_t *p = snap_slotmap_get(&mm, a, LEN, err, sizeof(err));
	CHECK(p && snap_slotmap_last(&mm) == SNAP_SLOTMAP_COLD && p[5] == (uint8_t)(5 * 31 + 1));
	CHECK(snap_slotmap_get(&mm, a, LEN, err, sizeof(err)) == p && snap_slotmap_last(&mm) == SNAP_SLOTMAP_KEPT);
	CHECK(snap_slotmap_has(&mm, a, LEN) && !snap_slotmap_has(&mm, a, LEN / 2) && !snap_slotmap_has(&mm, b, LEN));
	/* Another length asked: mapped afresh. */
	const uint8_t *h = snap_slotmap_get(&mm, a, LEN / 2, err, sizeof(err));
	CHECK(h && snap_slotmap_last(&mm) == SNAP_SLOTMAP_COLD && mm.n == 1);
	CHECK(snap_slotmap_get(&mm, a, LEN, err, sizeof(err)) && mm.n == 1);
	/* Longer than the file: refused, named. */
	CHECK(snap_slotmap_get(&mm, b, 2 * LEN, err, sizeof(err)) == NULL && strstr(err, b));
	/* Replaced at its path: the new file's bytes, through a new mapping. */
	write_file(tmp, LEN, 7);
	CHECK(rename(tmp, a) == 0);
	p = snap_slotmap_get(&mm, a, LEN, err, sizeof(err));
	CHECK(p && snap_slotmap_last(&mm) == SNAP_SLOTMAP_COLD && p[5] == (uint8_t)(5 * 31 + 7));
	/* A mapping made ahead is warm at its first get, kept after. */
	int fd = open(b, O_RDONLY | O_CLOEXEC);
	struct stat st;
	CHECK(fd >= 0 && fstat(fd, &st) == 0);
	void *w = mmap(NULL, LEN, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	CHECK(w != MAP_FAILED && snap_slotmap_adopt(&mm, b, st.st_dev, st.st_ino, LEN, w) == 0);
	CHECK(snap_slotmap_get(&mm, b, LEN, err, sizeof(err)) == w && snap_slotmap_last(&mm) == SNAP_SLOTMAP_WARM);
	CHECK(snap_slotmap_get(&mm, b, LEN, err, sizeof(err)) == w && snap_slotmap_last(&mm) == SNAP_SLOTMAP_KEPT);
	/* The sweep: b deleted, a replaced again; neither stays mapped. */
	CHECK(snap_slotmaps_sweep(&mm) == 0 && mm.n == 2);
	write_file(tmp, LEN, 9);
	CHECK(rename(tmp, a) == 0 && unlink(b) == 0);
	CHECK(snap_slotmaps_sweep(&mm) == 2 && mm.n == 0);
	write_file(b, LEN, 2);
	CHECK(snap_slotmap_get(&mm, b, LEN, err, sizeof(err)) && mm.n == 1);
	snap_slotmap_drop(&mm, b);
	snap_slotmap_drop(&mm, a);   /* not mapped: nothing happens */
	CHECK(mm.n == 0);
	CHECK(snap_slotmap_get(&mm, a, LEN, err, sizeof(err)) && snap_slotmap_get(&mm, b, LEN, err, sizeof(err)));
	snap_slotmaps_free(&mm);
	CHECK(mm.n == 0 && mm.v == NULL);
	unlink(a);
	unlink(b);
}

static void truncated_behind(void)
{
	char a[128], err[256];
	snprintf(a, sizeof(a), "%s/slot-2", dir);
	write_file(a, LEN, 3);
	struct snap_slotmaps mm = { .lazy = 1 };   /* as the scrub maps: page tables filled by the reads */
	const uint8_t *p = snap_slotmap_get(&mm, a, LEN, err, sizeof(err));
	CHECK(p != NULL);
	if (!p)
		return;
	uint32_t crc = 0, want = snap_crc32c(p, LEN), before = snap_crc32c(p, 4096);
	CHECK(smp_heal_crc_mapped(p, LEN, &crc) == 0 && crc == want);
	CHECK(truncate(a, 8192) == 0);
	crc = 0;
	CHECK(smp_heal_crc_mapped(p, 4096, &crc) == 0 && crc == before);   /* still there */
	CHECK(smp_heal_crc_mapped(p, LEN, &crc) == -1);                  /* a lost page: SIGBUS caught */
	CHECK(smp_heal_crc_mapped(p + 16384, 4096, &crc) == -1);
	CHECK(snap_slotmaps_sweep(&mm) == 1);   /* shorter than mapped: dropped */
	snap_slotmaps_free(&mm);
	unlink(a);
}

/* Mappings of files under dir in /proc/self/maps. */
static int mapped_here(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int n = 0;
	while (f && fgets(line, sizeof(line), f))
		n += strstr(line, dir) != NULL;
	if (f)
		fclose(f);
	return n;
}

/* One round over nfiles files, two chunks each (as the scrub reads them):
 * the number of COLD gets, and the most mappings seen at once. */
static int round_of(struct snap_slotmaps *mm, int nfiles, int *most)
{
	int cold = 0;
	for (int i = 0; i < nfiles; i++) {
		char path[128], err[256];
		snprintf(path, sizeof(path), "%s/file-%d", dir, i);
		for (int k = 0; k < 2; k++) {
			const uint8_t *p = snap_slotmap_get(mm, path, LEN, err, sizeof(err));
			CHECK(p && p[LEN - 1] == (uint8_t)((LEN - 1) * 31 + (uint64_t)i));
			cold += snap_slotmap_last(mm) == SNAP_SLOTMAP_COLD;
		}
		int now = mapped_here();
		*most = now > *most ? now : *most;
	}
	return cold;
}

static void capped(void)
{
	enum { NFILES = 12, CAP = 4 };
	for (int i = 0; i < NFILES; i++) {
		char path[128];
		snprintf(path, sizeof(path), "%s/file-%d", dir, i);
		write_file(path, LEN, i);
	}
	/* by count, then by bytes (3 files' worth) */
	for (int by_bytes = 0; by_bytes < 2; by_bytes++) {
		struct snap_slotmaps mm = { .lazy = 1 };
		if (by_bytes)
			mm.max_bytes = 3 * (uint64_t)LEN + LEN / 2;
		else
			mm.max_maps = CAP;
		int keep = by_bytes ? 3 : CAP, most = 0;
		int cold1 = round_of(&mm, NFILES, &most), cold2 = round_of(&mm, NFILES, &most);
		if (cold1 != NFILES || cold2 != NFILES - keep || most > keep + 1 || mm.n > (unsigned)keep + 1 ||
		    mm.bytes > (uint64_t)keep * LEN) {
			fprintf(stderr, "cap by %s: %d then %d files mapped afresh (want %d, %d), at most %d mapped "
				"(cap %d + 1), %u kept, %llu bytes\n", by_bytes ? "bytes" : "count", cold1, cold2, NFILES,
				NFILES - keep, most, keep, mm.n, (unsigned long long)mm.bytes);
			CHECK(0);
		}
		snap_slotmaps_free(&mm);
		CHECK(mapped_here() == 0);
	}
	for (int i = 0; i < NFILES; i++) {
		char path[128];
		snprintf(path, sizeof(path), "%s/file-%d", dir, i);
		unlink(path);
	}
}

int main(void)
{
	snprintf(dir, sizeof(dir), "/dev/shm/snap-slotmap-%d", (int)getpid());
	if (mkdir(dir, 0700) != 0) {
		fprintf(stderr, "mkdir %s: %s\n", dir, strerror(errno));
		return 1;
	}
	kept_and_replaced();
	smp_heal_guard_init();
	truncated_behind();
	capped();
	rmdir(dir);
	return check_done("test_slotmap");
}
