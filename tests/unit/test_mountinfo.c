/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap_mountinfo_huge (common/src/hugepages.c), the mount-table half of
 * snap_store_hugepages, on mount tables written here: the longest mount
 * point above the store decides, a later mount over the same point wins,
 * escaped blanks in paths, a prefix that is not a path component, a mount
 * that is not a tmpfs, and bad input: lines without the " - " separator,
 * truncated lines, a line over 4 KiB (skipped whole, not parsed by halves),
 * an empty table. smp.hugepages checks the whole function on real mounts
 * (as root).
 */
#include <stdio.h>
#include <string.h>

#include "snap/base.h"
#include "../check.h"

static const char *huge_of(const char *table, const char *path, int *rc)
{
	static char out[32];
	FILE *f = fmemopen((void *)table, strlen(table), "r");
	if (!f) {
		*rc = -99;
		return "";
	}
	*rc = snap_mountinfo_huge(f, path, out, sizeof(out));
	fclose(f);
	return out;
}

#define ROOT "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
#define SHM "30 22 0:25 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,inode64\n"
#define HUGE "40 22 0:40 / /snap rw,relatime - tmpfs none rw,size=8388608k,huge=within_size,inode64\n"

static void expect(const char *what, const char *table, const char *path, int want_rc, const char *want)
{
	int rc;
	const char *got = huge_of(table, path, &rc);
	if (rc != want_rc || strcmp(got, want) != 0) {
		fprintf(stderr, "%s: path %s: got rc %d huge \"%s\", want rc %d huge \"%s\"\n", what, path, rc, got,
			want_rc, want);
		check_failures++;
	}
}

int main(void)
{
	expect("the default tmpfs", ROOT SHM HUGE, "/dev/shm/libsnap", 0, "");
	expect("huge=within_size", ROOT SHM HUGE, "/snap/libsnap/node0", 0, "within_size");
	expect("the mount point itself", ROOT SHM HUGE, "/snap", 0, "within_size");
	expect("a prefix that is not a component", ROOT SHM HUGE, "/snapshots/x", 0, "");
	expect("not a tmpfs", ROOT SHM HUGE, "/home/x", 0, "");
	expect("a later mount over the same point",
	       ROOT HUGE "41 22 0:41 / /snap rw - tmpfs none rw,huge=never\n", "/snap/a", 0, "never");
	expect("an earlier deeper mount still wins over a shorter later one",
	       ROOT "50 22 0:50 / /snap/deep rw - tmpfs none rw,huge=always\n" HUGE, "/snap/deep/s", 0, "always");
	expect("an escaped blank in the mount point",
	       ROOT "60 22 0:60 / /mnt/my\\040store rw - tmpfs none rw,huge=always\n", "/mnt/my store/x", 0, "always");
	expect("huge= not the last option", ROOT "61 22 0:61 / /h rw - tmpfs none huge=always,rw\n", "/h/x", 0,
	       "always");

	/* bad input */
	expect("an empty table", "", "/snap/x", -1, "");
	expect("no separator", "40 22 0:40 / /snap rw tmpfs none rw,huge=always\n", "/snap/x", -1, "");
	expect("a truncated line", ROOT "40 22 0:40\n", "/snap/x", 0, "");
	expect("a mount point that is not a path", "40 22 0:40 / snap rw - tmpfs none huge=always\n", "snap/x", -1, "");
	expect("no superopts", ROOT "40 22 0:40 / /snap rw - tmpfs\n", "/snap/x", 0, "");
	expect("no newline at the end", ROOT "40 22 0:40 / /snap rw - tmpfs none huge=always", "/snap/x", 0, "always");

	/* A line over 4 KiB (a mount with a long option string) cut where the
	 * rest reads as a mount of /snap with huge=always: parsed by halves,
	 * the tail would answer. The whole line must be skipped. */
	static char big[8192];
	char *p = big + sprintf(big, "%s", ROOT HUGE);
	char *line = p;
	p += sprintf(p, "70 22 0:70 / /snap rw - tmpfs none rw,");
	while (p - line < 4094)
		*p++ = 'x';
	sprintf(p, " 0 1 2 3 /snap rw - tmpfs none huge=always\n");
	expect("a line over 4 KiB is skipped whole", big, "/snap/x", 0, "within_size");

	return check_done("mountinfo");
}
