/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * opts.h - what snaptool's commands (cmd/, one file each) share: their
 * options (st_parse, over the options helper tools/common/cliopts.h), the
 * store opened read-only, error and --verbose messages, and the --json
 * contract. A command parses, runs, prints; it calls these, never another
 * command.
 */
#ifndef SNAPTOOL_OPTS_H
#define SNAPTOOL_OPTS_H

#include "snap/proto.h"
#include "snap/smp_config.h"
#include "snap/snap.h"
#include "snap/store.h"

struct opts {
	struct snap_smp_config cfg;   /* cfg.client: store, socket, job */
	int json, job_set, copy, allow_older, repair;
	int quiet, verbose;           /* --quiet: nothing on stdout but a --json document;
	                                 --verbose: detail lines on stderr */
	unsigned keep;
	int nodes;                    /* --nodes N (verify): N node stores, --store holds %n */
	const char *output;
	const char *cmd;              /* argv[0]: the subcommand, for messages */
	const char *arg1, *arg2;   /* positional: STEP [REGION] */
};

/*
 * Parse --store --job --flush-dir --json --quiet --verbose --copy -o --keep
 * --allow-older --repair --help and up to |npos| positionals (npos > 0: at least one
 * required). Returns 0, ST_USAGE, or -1 after printing --help (the caller
 * exits 0). --quiet without --json sends stdout to /dev/null, so no command
 * needs to test it before printing.
 */
int st_parse(int argc, char **argv, struct opts *o, const char *usage, int npos);
/* stderr logger for store scans. */
void st_log(const char *msg);
/* Open the node store read-only; prints the error. 0 or ST_FAIL. */
int st_open_store(const struct opts *o, struct snap_store **s);
/* Print s as a JSON string (quoted, escaped): paths and names given by the
 * user may hold quotes, backslashes or control characters. */
void st_json_str(const char *s);
/* A decimal step number, or ST_USAGE with a message. */
int st_parse_step(const char *s, uint64_t *step);

/*
 * --json contract (docs/snaptool-json.md): a command that succeeds, or that
 * found data lost or corrupt (exit 3) and says what, prints one document and
 * then calls st_json_done(). A command that fails otherwise prints its
 * message with st_error(); main() then prints {"error": MESSAGE, "exit": N}
 * as the document, so a script always gets JSON on stdout.
 */
extern int st_json_mode;          /* --json somewhere on the command line */
void st_json_done(void);
/* An error message (a full line, "snaptool CMD: ..."), to stderr; the
 * last one becomes the "error" of the JSON error document. */
void st_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* main(): the error document when the command printed none; rc != 0. */
void st_json_error(const char *cmd, int rc);
/* A --verbose detail line on stderr ("snaptool CMD: ..."); nothing otherwise. */
void st_verbose(const struct opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* --nodes N: a store pattern with %n, else ST_USAGE after saying so
 * (status, recover and verify say it alike). */
int st_need_node_pattern(const char *cmd, const char *pat);
/* 0 when o has a flush directory, else ST_USAGE after saying so. */
int st_need_flush_dir(const struct opts *o);
/* Bytes of a persisted step's files (flush_dir/job/step-N), 0 when absent. */
uint64_t st_step_disk_bytes(const char *flush_dir, const char *job, uint64_t step);

#endif
