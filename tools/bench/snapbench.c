/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapbench: libsnap's benchmarks, each side by side with the physical limit
 * and with what users would do instead. A program of its own so that the
 * admin tool, snaptool, links none of what the benchmarks compare against
 * (LZ4, ZFP); `snaptool bench NAME ...` execs this program.
 * This file only dispatches; one file per benchmark.
 */
#include <stdio.h>
#include <string.h>

#include "snapbench.h"

static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
} benches[] = {
	{ "snapshot", cmd_bench_snapshot, "save/commit through snapsmp vs memcpy vs torch.save" },
	{ "codec", cmd_bench_codec, "our codecs vs lz4 vs ZFP on a tensor file" },
	{ "ec", cmd_bench_ec, "erasure coding vs raw ISA-L and MPI" },
	{ "mesh", cmd_bench_mesh, "erasure coding through the real daemons: protect, rebuild, restore" },
	{ "flush", cmd_bench_flush, "flush to HDF5 vs fio vs h5py" },
	{ "scrub", cmd_bench_scrub, "snapsmp's background scrub vs CRC32C, and its cost on a running job" },
};

static void usage(FILE *f)
{
	fprintf(f, "usage: snapbench BENCHMARK [options]   (snapbench BENCHMARK --help for each)\n"
		   "Measure libsnap against the physical limit and the alternatives, in one run.\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		fprintf(f, "  %-16s %s\n", benches[i].name, benches[i].help);
	fprintf(f, "\nAlso run as snaptool bench BENCHMARK [options].\n"
		   "exit codes: 0 success, 1 failed, 2 usage error\n");
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? SB_USAGE : SB_OK;
	}
	for (size_t i = 0; i < sizeof(benches) / sizeof(benches[0]); i++)
		if (!strcmp(argv[1], benches[i].name))
			return benches[i].fn(argc - 1, argv + 1);
	fprintf(stderr, "snapbench: unknown benchmark \"%s\"\n", argv[1]);
	usage(stderr);
	return SB_USAGE;
}
