/* snaptool: dispatch to subcommands (temporary minimal table; grows with the CLI). */
#include <stdio.h>
#include <string.h>

#include "snaptool.h"

int main(int argc, char **argv)
{
	if (argc >= 3 && strcmp(argv[1], "bench") == 0) {
		if (strcmp(argv[2], "codec") == 0) return cmd_bench_codec(argc - 2, argv + 2);
		if (strcmp(argv[2], "ec") == 0) return cmd_bench_ec(argc - 2, argv + 2);
		if (strcmp(argv[2], "flush") == 0) return cmd_bench_flush(argc - 2, argv + 2);
	}
	fprintf(stderr, "usage: snaptool bench codec|ec|flush ...\n");
	return ST_USAGE;
}
