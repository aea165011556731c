/* Placeholder until the flush benchmark lands; reports honestly that it is missing. */
#include <stdio.h>
#include "snaptool.h"

int cmd_bench_flush(int argc, char **argv)
{
	(void)argc; (void)argv;
	fprintf(stderr, "snaptool bench flush: not implemented yet\n");
	return ST_FAIL;
}
