/* SPDX-License-Identifier: BSD-3-Clause */
/* check.h - the smallest test harness: CHECK() counts failures and says where. */
#ifndef SNAP_CHECK_H
#define SNAP_CHECK_H

#include <stdio.h>

static int check_failures;

#define CHECK(cond)                                                                   \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
			check_failures++;                                             \
		}                                                                     \
	} while (0)

#define CHECK_RC(expr, want)                                                          \
	do {                                                                          \
		int rc_ = (expr);                                                     \
		if (rc_ != (want)) {                                                  \
			fprintf(stderr, "%s:%d: %s returned %d (%s), expected %d\n", __FILE__, __LINE__, #expr, \
				rc_, snap_strerror(rc_), (want));                     \
			check_failures++;                                             \
		}                                                                     \
	} while (0)

static inline int check_done(const char *name)
{
	if (check_failures)
		fprintf(stderr, "%s: %d checks failed\n", name, check_failures);
	else
		printf("%s: all checks passed\n", name);
	return check_failures ? 1 : 0;
}

#endif
