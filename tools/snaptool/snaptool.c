/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool: inspect, verify, flush, export and recover libsnap snapshots.
 * One file per subcommand (cmd/); this one only dispatches. The benchmarks are a
 * program of their own, snapbench (`snaptool bench` execs it). Exit codes
 * (docs/snaptool.md): 0 success, 1 operation failed, 2 usage error, 3 data
 * lost or corrupt.
 */
#include <stdio.h>
#include <string.h>

#include "opts.h"
#include "snaptool.h"

struct cmd {
	const char *name;
	int (*fn)(int, char **);
	const char *help;
	int (*mesh)(int, char **);   /* with --nodes: the erasure-coded mesh (mesh_status.c) */
};

static const struct cmd cmds[] = {
	{ "status", cmd_status, "steps of every job in the node store: committed / restorable, memory used",
	  cmd_mesh_status },
	{ "ls", cmd_ls, "steps and ranks held for a job, one line each", NULL },
	{ "inspect", cmd_inspect, "regions of a step: dtype, shape, kind, codec, checksums", NULL },
	{ "verify", cmd_verify, "recompute every checksum of a step in the node store and on disk", NULL },
	{ "flush", cmd_flush, "persist a step to HDF5 now (asks snapsmp) and wait", NULL },
	{ "recover", cmd_recover, "what is recoverable after failures, and from where", cmd_mesh_recover },
	{ "export", cmd_export, "one consolidated HDF5 file of a persisted step (global shapes)", NULL },
	{ "gc", cmd_gc, "apply retention to the flush directory", NULL },
	{ "bench", cmd_bench, "benchmarks (snapshot, codec, ec, flush): runs snapbench", NULL },
};

/* The command's --nodes variant when argv asks for it, else the command. */
static int (*pick(const struct cmd *c, int argc, char **argv))(int, char **)
{
	for (int i = 1; c->mesh && i < argc; i++)
		if (!strncmp(argv[i], "--nodes", 7))
			return c->mesh;
	return c->fn;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: snaptool COMMAND [options]   (snaptool COMMAND --help for each)\n\ncommands:\n");
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		fprintf(f, "  %-16s %s\n", cmds[i].name, cmds[i].help);
	fprintf(f, "\nThe store, job and flush directory come from --store/--job/--flush-dir or\n"
		   "SNAP_STORE/SNAP_JOB/SNAP_FLUSH_DIR. A mesh's per-node flush directories are given as\n"
		   "their pattern (--flush-dir 'D/node%%n'): every command reads the nodes' parts together.\n"
		   "Every command takes --json (one document on stdout, docs/snaptool-json.md; bench\n"
		   "passes it to snapbench), -q/--quiet (nothing on stdout) and -v/--verbose (detail on\n"
		   "stderr). Long commands draw a progress bar on stderr when it is a terminal.\n"
		   "exit codes: 0 success, 1 failed, 2 usage error, 3 data lost or corrupt\n");
}

int main(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? ST_USAGE : ST_OK;
	}
	/* Seen before the command parses its options, so that even a usage
	 * error answers with a JSON document. bench passes --json to snapbench. */
	for (int i = 2; i < argc && strcmp(argv[1], "bench"); i++)
		if (!strcmp(argv[i], "--json"))
			st_json_mode = 1;
		else if (!strcmp(argv[i], "--"))
			break;
	for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++)
		if (!strcmp(argv[1], cmds[i].name)) {
			int rc = pick(&cmds[i], argc - 1, argv + 1)(argc - 1, argv + 1);
			st_json_error(cmds[i].name, rc);
			return rc;
		}
	fprintf(stderr, "snaptool: unknown command \"%s\"\n", argv[1]);
	usage(stderr);
	return ST_USAGE;
}
