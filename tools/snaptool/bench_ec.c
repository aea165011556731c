/* Placeholder until the ec benchmark lands; reports honestly that it is missing. */
#include <stdio.h>
#include "snaptool.h"

int cmd_bench_ec(int argc, char **argv)
{
	(void)argc; (void)argv;
	fprintf(stderr, "snaptool bench ec: not implemented yet\n");
	return ST_FAIL;
}
