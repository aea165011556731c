/* Placeholder until the codec benchmark lands; reports honestly that it is missing. */
#include <stdio.h>
#include "snaptool.h"

int cmd_bench_codec(int argc, char **argv)
{
	(void)argc; (void)argv;
	fprintf(stderr, "snaptool bench codec: not implemented yet\n");
	return ST_FAIL;
}
