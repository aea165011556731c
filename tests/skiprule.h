/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * skiprule.h - the suite's one rule for what cannot run (tests/skiprule.py is
 * the same for the Python scripts; tests/unit/check_skips.py enforces it):
 *
 * - A test that cannot run its subject calls skiprule_skip_test() before it
 *   has run any case: one line naming why, exit 77 (its add_test declares
 *   SKIP_RETURN_CODE 77). Called after a case ran, it is a failure (exit 1):
 *   a skip must never hide what was already checked.
 * - A case that cannot run inside a test that otherwise runs is declared
 *   optional with what it needs (skiprule_optional()); whether it runs is
 *   decided from what this process has (its capabilities, the file system),
 *   never from the case's own failure, so a failing mount as root fails the
 *   test. SNAP_TEST_ALL=1 makes every optional case required (CI, as root).
 * - The summary line (skiprule_summary()) counts the cases skipped.
 */
#ifndef SNAP_SKIPRULE_H
#define SNAP_SKIPRULE_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int skiprule_cases_run;     /* cases begun: after one, no whole-test skip */
static int skiprule_skipped;
static char skiprule_names[1024];

/* A case begins (what makes a later whole-test skip a failure). */
static inline void skiprule_case(void)
{
	skiprule_cases_run++;
}

static inline void skiprule_skip_test(const char *test, const char *why)
{
	if (skiprule_cases_run) {
		fprintf(stderr, "%s: FAILED: decided to skip (%s) after %d cases ran\n", test, why,
			skiprule_cases_run);
		exit(1);
	}
	printf("%s: SKIP (exit 77): %s\n", test, why);
	fflush(stdout);
	exit(77);
}

/* Whether this process may mount(2): CAP_SYS_ADMIN in its effective set,
 * read from /proc/self/status (not tried: a failed mount with the
 * capability is a failure of the case, not a reason to skip it). */
static inline int skiprule_can_mount(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int can = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (strncmp(line, "CapEff:", 7) == 0)
			can = (int)((strtoull(line + 7, NULL, 16) >> 21) & 1);
	fclose(f);
	return can;
}

/* Whether the optional case `name` runs: yes when have; otherwise it is
 * counted as skipped, saying what it needs, and with SNAP_TEST_ALL=1 set
 * that is a failure. */
static inline int skiprule_optional(const char *name, const char *needs, int have)
{
	if (have)
		return 1;
	const char *all = getenv("SNAP_TEST_ALL");
	if (all && strcmp(all, "1") == 0) {
		fprintf(stderr, "FAILED: case \"%s\" cannot run (needs %s) and SNAP_TEST_ALL=1 requires it\n", name,
			needs);
		exit(1);
	}
	printf("  optional case not run: %s (needs %s)\n", name, needs);
	skiprule_skipped++;
	size_t n = strlen(skiprule_names);
	snprintf(skiprule_names + n, sizeof skiprule_names - n, "%s%s", n ? ", " : "", name);
	return 0;
}

/* The summary line: "TEST: all good, N optional cases skipped (names)". */
static inline void skiprule_summary(const char *test)
{
	if (skiprule_skipped)
		printf("%s: all good, %d optional cases skipped (%s)\n", test, skiprule_skipped, skiprule_names);
	else
		printf("%s: all good, 0 cases skipped\n", test);
}

#endif
