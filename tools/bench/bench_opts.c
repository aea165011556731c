/* SPDX-License-Identifier: BSD-3-Clause */
/* Option values for the benchmarks (bench_opts.h). */
#include <stdio.h>
#include <stdlib.h>

#include "snap/base.h"
#include "bench_opts.h"

int bench_opt_int(const char *cmd, const char *opt, const char *v, int lo, int hi, int *out)
{
	char *end;
	long x = strtol(v, &end, 10);
	if (*v == 0 || *end || x < lo || x > hi) {
		fprintf(stderr, "snapbench %s: %s %s: expected a whole number from %d to %d\n", cmd, opt, v, lo, hi);
		return -1;
	}
	*out = (int)x;
	return 0;
}

int bench_opt_size(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t hi, const char *range,
		   uint64_t *out)
{
	uint64_t x;
	if (snap_parse_size(v, &x) || x < lo || x > hi) {
		fprintf(stderr, "snapbench %s: %s %s: expected a size from %s, like 4096, 64K, 16M or 1G\n", cmd, opt,
			v, range);
		return -1;
	}
	*out = x;
	return 0;
}
