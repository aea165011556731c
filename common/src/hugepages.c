/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hugepages.c - whether the files of a store get transparent huge pages.
 *
 * The node store is a tmpfs (/dev/shm by default). Every process that maps
 * a slot afresh (the mesh daemons at protect and at a relaunch's rebuild, a
 * relaunched trainer's restore) faults its pages in one by one, and on the
 * shadow-paged VMs this project is measured on each 4 KiB fault traps to
 * the hypervisor. With huge pages a fault maps 2 MiB. Measured here with
 * `snaptool bench mesh` (3+1, 256 MiB per node), /dev/shm (huge=never)
 * against a tmpfs mounted with huge=within_size, runs alternated: the
 * rebuild 611/623 -> 349/293 ms, a steady protect 339/293 -> 241/218 ms,
 * relaunch -> every rank restored 2.56/2.21 -> 1.85/1.59 s.
 *
 * A tmpfs mount takes huge=never|always|within_size|advise (the default is
 * never); /sys/kernel/mm/transparent_hugepage/shmem_enabled "force" or
 * "deny" overrides every mount. huge=advise gives libsnap nothing: snapsmp
 * reserves slot files with fallocate, outside any mapping, so an madvise
 * on a later mapping would come too late.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>

#include "snap/base.h"

#define TMPFS_MAGIC_ 0x01021994

/* The bracketed word of shmem_enabled ("always within_size advise [never] deny force"). */
static void shmem_enabled(char *out, size_t cap)
{
	char line[256];
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	out[0] = 0;
	if (!f)
		return;
	if (fgets(line, sizeof(line), f)) {
		char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
		if (a && b)
			snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
	}
	fclose(f);
}

/* mountinfo escapes blanks and backslashes in paths as \ooo. */
static void unescape(char *s)
{
	char *w = s;
	for (char *r = s; *r; r++) {
		if (r[0] == '\\' && r[1] >= '0' && r[1] <= '7' && r[2] >= '0' && r[2] <= '7' && r[3] >= '0' && r[3] <= '7') {
			*w++ = (char)((r[1] - '0') * 64 + (r[2] - '0') * 8 + (r[3] - '0'));
			r += 3;
		} else {
			*w++ = *r;
		}
	}
	*w = 0;
}

/* Drops the rest of a line fgets cut at its buffer's end. */
static void skip_rest(FILE *f)
{
	int c;
	while ((c = getc(f)) != EOF && c != '\n')
		;
}

int snap_mountinfo_huge(FILE *f, const char *path, char *out, size_t cap)
{
	char line[4096];
	size_t best = 0;
	int found = 0;
	out[0] = 0;
	while (fgets(line, sizeof(line), f)) {
		size_t ll = strlen(line);
		if (ll == sizeof(line) - 1 && line[ll - 1] != '\n') {
			skip_rest(f);   /* a line this long is not parsed by halves */
			continue;
		}
		/* id parent major:minor root mountpoint opts [tags] - fstype source superopts */
		char mp[PATH_MAX], *sep = strstr(line, " - ");
		if (!sep || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1 || mp[0] != '/')
			continue;
		unescape(mp);
		size_t n = strlen(mp);
		int under = !strcmp(mp, "/") || (!strncmp(path, mp, n) && (path[n] == '/' || path[n] == 0));
		if (!under || n < best)
			continue;   /* a later mount over the same point wins: >= */
		best = n;
		found = 1;
		char fstype[64], super[2048];
		out[0] = 0;
		if (sscanf(sep + 3, "%63s %*s %2047s", fstype, super) == 2 && !strcmp(fstype, "tmpfs")) {
			char *save = NULL;
			for (char *o = strtok_r(super, ",", &save); o; o = strtok_r(NULL, ",", &save))
				if (!strncmp(o, "huge=", 5))
					snprintf(out, cap, "%s", o + 5);
		}
	}
	return found ? 0 : -1;
}

/* The huge= option of the tmpfs mount holding path ("" when it has none). */
static int mount_huge(const char *path, char *out, size_t cap)
{
	FILE *f = fopen("/proc/self/mountinfo", "r");
	if (!f)
		return -1;
	int rc = snap_mountinfo_huge(f, path, out, cap);
	fclose(f);
	return rc;
}

int snap_store_hugepages(const char *dir, char *desc, size_t len)
{
	struct statfs sf;
	char real[PATH_MAX], forced[32], huge[32];
	if (statfs(dir, &sf) != 0) {
		snap_fmt(desc, len, "cannot stat %s: %s", dir, strerror(errno));
		return -1;
	}
	if ((unsigned long)sf.f_type != TMPFS_MAGIC_) {
		snap_fmt(desc, len, "not a tmpfs");
		return -1;
	}
	shmem_enabled(forced, sizeof(forced));
	if (!strcmp(forced, "force") || !strcmp(forced, "deny")) {
		snap_fmt(desc, len, "tmpfs, shmem_enabled=%s", forced);
		return forced[0] == 'f';
	}
	if (!realpath(dir, real) || mount_huge(real, huge, sizeof(huge))) {
		snap_fmt(desc, len, "tmpfs, its mount not found in /proc/self/mountinfo");
		return 0;
	}
	snap_fmt(desc, len, "tmpfs, huge=%s", huge[0] ? huge : "never");   /* mountinfo omits the default */
	return !strcmp(huge, "always") || !strcmp(huge, "within_size");
}
