/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * leak_shim.c - a planted fault for the memory tests, test-only (LD_PRELOAD
 * into snapsmp by check_memory.py --plant-leak): every rename(2) leaks
 * SNAP_TEST_LEAK_BYTES bytes (default 256), written to so they are
 * resident, as a daemon that forgot a buffer at each commit would (snapsmp
 * renames once per rank's commit: a manifest write and a rename). With
 * SNAP_TEST_LEAK_UNTOUCHED=1 the bytes are never written (a big block
 * malloc maps on its own: in VmData, not in RssAnon).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dlsym(RTLD_NEXT) */
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rename(const char *from, const char *to)
{
	static int (*real)(const char *, const char *);
	static size_t bytes;
	static int untouched;
	if (!real) {
		const char *e = getenv("SNAP_TEST_LEAK_BYTES"), *u = getenv("SNAP_TEST_LEAK_UNTOUCHED");
		bytes = e ? strtoul(e, NULL, 10) : 256;
		untouched = u && strcmp(u, "1") == 0;
		real = (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
	}
	char *volatile lost = malloc(bytes); /* never freed: the plant */
	if (lost && !untouched)
		memset(lost, 0xa5, bytes);
	return real(from, to);
}
