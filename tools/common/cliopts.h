/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * cliopts.h - the one option parser of snaptool's commands and snapbench's
 * benchmarks: a command lists its options in a table (long name, short
 * letter, what the value is and where it goes) and cli_parse() runs
 * getopt_long over it. Whole numbers and sizes are read in a range and
 * refused by name ("snapbench ec: --k x: expected a whole number from 1 to
 * 254"), never atoi's silent 0 or "16M" read as 16.
 */
#ifndef SNAP_TOOLS_CLIOPTS_H
#define SNAP_TOOLS_CLIOPTS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct cli;

enum cli_kind {
	CLI_FLAG,   /* no value: *(int *)dst = 1 */
	CLI_STR,    /* *(const char **)dst = the value (argv's own string) */
	CLI_BUF,    /* the value copied into char dst[hi] (truncated to fit) */
	CLI_INT,    /* *(int *)dst, a whole number in [lo, hi] */
	CLI_SIZE,   /* *(uint64_t *)dst, a size (4096, 64K, 16M, 1G) in [lo, hi]; range in words */
	CLI_CALL,   /* call(c, name, value, dst): 0, or -1 after printing why */
	CLI_HELP,   /* -h/--help: cli_parse returns CLI_HELP */
};

struct cli_opt {
	const char *name;    /* long name, without "--"; NULL: the letter only */
	int letter;          /* short option letter, 0 for none */
	enum cli_kind kind;
	void *dst;
	int64_t lo;          /* CLI_INT, CLI_SIZE: the range */
	uint64_t hi;         /* ... and for CLI_BUF the buffer's size */
	const char *range;   /* CLI_SIZE: [lo, hi] in words ("1 byte to 16G") */
	int (*call)(const struct cli *c, const char *opt, const char *v, void *dst);
};

/* Table rows, by kind (designated, so that -Wextra sees every field set):
 * long name, short letter (0: none), where the value goes. */
#define CLI_OPT_HELP { .name = "help", .letter = 'h', .kind = CLI_HELP }
#define CLI_OPT_FLAG(n, l, d) { .name = (n), .letter = (l), .kind = CLI_FLAG, .dst = (d) }
#define CLI_OPT_STR(n, l, d) { .name = (n), .letter = (l), .kind = CLI_STR, .dst = (d) }
/* d: a char array (its sizeof is the room) */
#define CLI_OPT_BUF(n, l, d) { .name = (n), .letter = (l), .kind = CLI_BUF, .dst = (d), .hi = sizeof(d) }
#define CLI_OPT_INT(n, l, d, a, b) { .name = (n), .letter = (l), .kind = CLI_INT, .dst = (d), .lo = (a), .hi = (b) }
#define CLI_OPT_SIZE(n, l, d, a, b, words) \
	{ .name = (n), .letter = (l), .kind = CLI_SIZE, .dst = (d), .lo = (a), .hi = (b), .range = (words) }
#define CLI_OPT_CALL(n, l, d, fn) { .name = (n), .letter = (l), .kind = CLI_CALL, .dst = (d), .call = (fn) }

/* The command being parsed: how its messages start, and where they go. */
struct cli {
	const char *who;          /* "snapbench ec", "snaptool ls": every message's prefix */
	/* printf formats (who, the argument as written) for an unknown option
	 * or one missing its value, and for a short option missing its value
	 * (NULL: the first) */
	const char *unknown_fmt, *missing_fmt;
	int max_pos;              /* positionals allowed; more are refused as unknown; -1: any */
	void (*error)(const char *line);   /* where a message goes (NULL: stderr) */
	/* the command's usage, printed to stdout for --help and to stderr
	 * after a refused option (after a refused value too when
	 * usage_on_value); NULL: the caller prints its own */
	void (*usage)(FILE *f);
	int usage_on_value;
};

enum { CLI_OK = 0, CLI_HELP_ASKED = 1, CLI_EOPT = -1, CLI_EVALUE = -2 };

/*
 * Parse argv[1..argc) (argv[0] is the command's name) against opts[0..n).
 * Returns CLI_OK with the positionals in argv[*first_pos..argc)
 * (first_pos may be NULL), CLI_HELP_ASKED for -h/--help, CLI_EOPT after an
 * unknown option, one missing its value or a positional too many, and
 * CLI_EVALUE after a value its option refuses; both after printing why.
 */
int cli_parse(const struct cli *c, int argc, char **argv, const struct cli_opt *opts, size_t n, int *first_pos);

/* A message "WHO: ..." through c->error (or to stderr). */
void cli_error(const struct cli *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The checks CLI_INT and CLI_SIZE make, for values read elsewhere: 0, or
 * -1 after "WHO: OPT V: expected a whole number from LO to HI" (or "a
 * size from RANGE, like 4096, 64K, 16M or 1G"). */
int cli_int(const struct cli *c, const char *opt, const char *v, int lo, int hi, int *out);
int cli_size(const struct cli *c, const char *opt, const char *v, uint64_t lo, uint64_t hi, const char *range,
	     uint64_t *out);

#endif
