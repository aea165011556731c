/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapbench.h - the benchmarks of the snapbench program, one file each.
 * Same contract as snaptool's subcommands (snaptool bench NAME execs
 * snapbench NAME): parse its own argv (argv[0] is the benchmark's name),
 * print --help to stdout and errors to stderr, return the exit code:
 *   0 success, 1 the run failed, 2 usage error.
 */
#ifndef SNAPBENCH_H
#define SNAPBENCH_H

enum { SB_OK = 0, SB_FAIL = 1, SB_USAGE = 2 };

/* The struct cli (cliopts.h) of benchmark NAME: messages "snapbench NAME:
 * ...", no positionals, its usage function (and after a refused value too
 * when on_value). */
#define BENCH_CLI(name, usage_fn, on_value)                                                          \
	{ .who = "snapbench " name, .unknown_fmt = "%s: unknown or incomplete option '%s'", .max_pos = 0, \
	  .usage = (usage_fn), .usage_on_value = (on_value) }

int cmd_bench_snapshot(int argc, char **argv);
int cmd_bench_codec(int argc, char **argv);
int cmd_bench_ec(int argc, char **argv);
int cmd_bench_flush(int argc, char **argv);
int cmd_bench_mesh(int argc, char **argv);
int cmd_bench_scrub(int argc, char **argv);

#endif
