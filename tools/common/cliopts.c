/* SPDX-License-Identifier: BSD-3-Clause */
/* The options helper of snaptool and snapbench (cliopts.h). */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "cliopts.h"

#define CLI_MAX_OPTS 32

void cli_error(const struct cli *c, const char *fmt, ...)
{
	char line[1024];
	int at = snprintf(line, sizeof(line), "%s: ", c->who);
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line + at, sizeof(line) - (size_t)at, fmt, ap);
	va_end(ap);
	if (c->error)
		c->error(line);
	else
		fprintf(stderr, "%s\n", line);
}

int cli_int(const struct cli *c, const char *opt, const char *v, int lo, int hi, int *out)
{
	char *end;
	long x = strtol(v, &end, 10);
	if (*v == 0 || *end || x < lo || x > hi) {
		cli_error(c, "%s %s: expected a whole number from %d to %d", opt, v, lo, hi);
		return -1;
	}
	*out = (int)x;
	return 0;
}

int cli_size(const struct cli *c, const char *opt, const char *v, uint64_t lo, uint64_t hi, const char *range,
	     uint64_t *out)
{
	uint64_t x;
	if (snap_parse_size(v, &x) || x < lo || x > hi) {
		cli_error(c, "%s %s: expected a size from %s, like 4096, 64K, 16M or 1G", opt, v, range);
		return -1;
	}
	*out = x;
	return 0;
}

/* Store one option's value; 0 or -1 (message printed). */
static int cli_take(const struct cli *c, const struct cli_opt *o, const char *v)
{
	char opt[64];
	if (o->name)
		snprintf(opt, sizeof(opt), "--%s", o->name);
	else
		snprintf(opt, sizeof(opt), "-%c", o->letter);
	switch (o->kind) {
	case CLI_FLAG: *(int *)o->dst = 1; return 0;
	case CLI_STR: *(const char **)o->dst = v; return 0;
	case CLI_BUF: snprintf(o->dst, (size_t)o->hi, "%s", v); return 0;
	case CLI_INT: return cli_int(c, opt, v, (int)o->lo, (int)o->hi, o->dst);
	case CLI_SIZE: return cli_size(c, opt, v, (uint64_t)o->lo, o->hi, o->range, o->dst);
	case CLI_CALL: return o->call(c, opt, v, o->dst);
	case CLI_HELP: return 0;
	}
	return 0;
}

/* getopt_long's tables from ours: val is the index into opts, offset past
 * the letters so that the two never meet. */
static int cli_tables(const struct cli_opt *opts, size_t n, struct option *lo, char *shorts, size_t cap)
{
	size_t s = 0, l = 0;
	if (n >= CLI_MAX_OPTS)
		return -1;
	shorts[s++] = ':';   /* ':' for a missing value, '?' for an unknown option */
	for (size_t i = 0; i < n; i++) {
		int arg = opts[i].kind == CLI_FLAG || opts[i].kind == CLI_HELP ? no_argument : required_argument;
		if (opts[i].name)
			lo[l++] = (struct option){ opts[i].name, arg, NULL, 256 + (int)i };
		if (opts[i].letter && s + 3 < cap) {
			shorts[s++] = (char)opts[i].letter;
			if (arg == required_argument)
				shorts[s++] = ':';
		}
	}
	lo[l] = (struct option){ NULL, 0, NULL, 0 };
	shorts[s] = 0;
	return 0;
}

static const struct cli_opt *cli_by_letter(const struct cli_opt *opts, size_t n, int letter)
{
	for (size_t i = 0; i < n; i++)
		if (opts[i].letter == letter)
			return &opts[i];
	return NULL;
}

static int cli_unknown(const struct cli *c, const char *fmt, const char *arg)
{
	char line[1024];
	snprintf(line, sizeof(line), fmt, c->who, arg);
	if (c->error)
		c->error(line);
	else
		fprintf(stderr, "%s\n", line);
	return CLI_EOPT;
}

static int cli_options(const struct cli *c, int argc, char **argv, const struct cli_opt *opts, size_t n,
		       int *first_pos)
{
	struct option lo[CLI_MAX_OPTS + 1];
	char shorts[2 * CLI_MAX_OPTS + 2];
	if (cli_tables(opts, n, lo, shorts, sizeof(shorts))) {
		cli_error(c, "more than %d options: raise CLI_MAX_OPTS", CLI_MAX_OPTS - 1);
		return CLI_EOPT;
	}
	int ch;
	optind = 1;
	opterr = 0;   /* our message, so that snaptool --json can carry it */
	while ((ch = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
		const struct cli_opt *o = ch >= 256 ? &opts[ch - 256] : cli_by_letter(opts, n, ch);
		if (ch == ':' && argv[optind - 1][1] != '-' && c->missing_fmt)
			return cli_unknown(c, c->missing_fmt, argv[optind - 1]);
		if (ch == ':' || ch == '?' || !o)
			return cli_unknown(c, c->unknown_fmt, argv[optind - 1]);
		if (o->kind == CLI_HELP)
			return CLI_HELP_ASKED;
		if (cli_take(c, o, optarg))
			return CLI_EVALUE;
	}
	if (c->max_pos >= 0 && argc - optind > c->max_pos)
		return cli_unknown(c, c->unknown_fmt, argv[optind + c->max_pos]);
	if (first_pos)
		*first_pos = optind;
	return CLI_OK;
}

int cli_parse(const struct cli *c, int argc, char **argv, const struct cli_opt *opts, size_t n, int *first_pos)
{
	int rc = cli_options(c, argc, argv, opts, n, first_pos);
	if (c->usage && rc == CLI_HELP_ASKED)
		c->usage(stdout);
	else if (c->usage && (rc == CLI_EOPT || (rc == CLI_EVALUE && c->usage_on_value)))
		c->usage(stderr);
	return rc;
}
