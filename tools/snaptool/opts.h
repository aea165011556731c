/* SPDX-License-Identifier: BSD-3-Clause */
/* opts.h - options shared by snaptool's store and disk subcommands. */
#ifndef SNAPTOOL_OPTS_H
#define SNAPTOOL_OPTS_H

#include "snap/proto.h"
#include "snap/smp_config.h"
#include "snap/snap.h"
#include "snap/store.h"

struct opts {
	struct snap_smp_config cfg;   /* cfg.client: store, socket, job */
	int json, job_set, copy, allow_older;
	unsigned keep;
	const char *output;
	const char *arg1, *arg2;   /* positional: STEP [REGION] */
};

/*
 * Parse --store --job --flush-dir --json --copy -o --keep --allow-older
 * --help and up to |npos| positionals (npos > 0: at least one required).
 * Returns 0, ST_USAGE, or -1 after printing --help (the caller exits 0).
 */
int st_parse(int argc, char **argv, struct opts *o, const char *usage, int npos);
/* Open the node store read-only; prints the error. 0 or ST_FAIL. */
/* stderr logger for store scans. */
void st_log(const char *msg);
int st_open_store(const struct opts *o, struct snap_store **s);
/* Print s as a JSON string (quoted, escaped): paths and names given by the
 * user may hold quotes, backslashes or control characters. */
void st_json_str(const char *s);
/* A decimal step number, or ST_USAGE with a message. */
int st_parse_step(const char *s, uint64_t *step);

#endif
