/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_opts.h - reading the benchmarks' option values: whole numbers and
 * sizes in a range, refused by name (never atoi's silent 0 or "16M" read as
 * 16).
 */
#ifndef SNAP_BENCH_OPTS_H
#define SNAP_BENCH_OPTS_H

#include <stdint.h>

/* v as a whole number in [lo, hi] into *out: 0, or -1 after printing
 * "snapbench CMD: OPT V: expected a whole number from LO to HI". */
int bench_opt_int(const char *cmd, const char *opt, const char *v, int lo, int hi, int *out);

/* v as a size (snap_parse_size: 4096, 64K, 16M, 1G) in [lo, hi] into *out:
 * 0, or -1 after printing "snapbench CMD: OPT V: expected a size from
 * RANGE, like ...", range being the caller's words for [lo, hi]. */
int bench_opt_size(const char *cmd, const char *opt, const char *v, uint64_t lo, uint64_t hi, const char *range,
		   uint64_t *out);

#endif
