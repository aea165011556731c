/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool.h - subcommands of the snaptool CLI. Each lives in its own file
 * under cmd/ and has one shape: parse (st_parse, or cli_parse for its own
 * options), run, print text or --json; opts.h has what they share, and no
 * command calls another. Each parses its own argv (argv[0] is the
 * subcommand name), prints --help to stdout and errors to stderr, and
 * returns the process exit code documented in docs/snaptool.md:
 *   0 success, 1 operation failed, 2 usage error, 3 data lost/corrupt.
 */
#ifndef SNAPTOOL_H
#define SNAPTOOL_H

enum { ST_OK = 0, ST_FAIL = 1, ST_USAGE = 2, ST_LOST = 3 };

int cmd_status(int argc, char **argv);
int cmd_mesh_status(int argc, char **argv);   /* status --nodes N */
int cmd_mesh_recover(int argc, char **argv);  /* recover --nodes N */
int cmd_ls(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_flush(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_recover(int argc, char **argv);
int cmd_bench(int argc, char **argv);      /* execs snapbench */

#endif
