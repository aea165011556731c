/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool bench: the benchmarks live in their own program, snapbench, so
 * that snaptool links none of what they compare against (LZ4, ZFP). This
 * execs `snapbench NAME ...` from snaptool's own directory (the build tree
 * and an installed bin/ hold both), else from PATH.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snaptool.h"

static const char help[] =
	"usage: snaptool bench BENCHMARK [options]\n"
	"Runs snapbench BENCHMARK [options]: the snapbench beside snaptool, else the one on PATH.\n"
	"BENCHMARK: snapshot, codec, ec or flush (snapbench --help; snapbench BENCHMARK --help\n"
	"for each one's options and figures).\n";

int cmd_bench(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
		fputs(help, argc < 2 ? stderr : stdout);
		return argc < 2 ? ST_USAGE : ST_OK;
	}
	char **args = calloc((size_t)argc + 1, sizeof(*args));
	if (!args) {
		fprintf(stderr, "snaptool bench: out of memory\n");
		return ST_FAIL;
	}
	args[0] = "snapbench";
	for (int i = 1; i < argc; i++)
		args[i] = argv[i];

	char self[PATH_MAX], beside[PATH_MAX + 16] = "";
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	char *slash = NULL;
	int beside_err = 0;
	if (n > 0) {
		self[n] = '\0';
		slash = strrchr(self, '/');
	}
	if (slash) {
		*slash = '\0';
		snprintf(beside, sizeof(beside), "%s/snapbench", self);
		execv(beside, args);
		beside_err = errno;
	}
	execvp("snapbench", args);
	int path_err = errno;
	if (beside[0])
		fprintf(stderr, "snaptool bench: cannot run snapbench: %s: %s; snapbench on PATH: %s\n", beside,
			strerror(beside_err), strerror(path_err));
	else
		fprintf(stderr, "snaptool bench: cannot run snapbench (no /proc/self/exe to look beside; on PATH: %s)\n",
			strerror(path_err));
	fprintf(stderr, "snaptool bench: snapbench is built and installed with snaptool; run it directly "
		"or put its directory on PATH\n");
	free(args);
	return ST_FAIL;
}
