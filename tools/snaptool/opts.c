/* SPDX-License-Identifier: BSD-3-Clause */
/* Options shared by snaptool's store and disk subcommands; see opts.h. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "snaptool.h"

int st_parse(int argc, char **argv, struct opts *o, const char *usage, int npos)
{
	memset(o, 0, sizeof(*o));
	char err[256];
	snap_smp_config_init(&o->cfg);
	if (snap_smp_config_from_env(&o->cfg, err, sizeof(err))) {
		fprintf(stderr, "snaptool %s: %s\n", argv[0], err);
		return ST_USAGE;
	}
	o->job_set = getenv("SNAP_JOB") != NULL;
	static const struct option lo[] = { { "store", required_argument, NULL, 's' },
					    { "job", required_argument, NULL, 'j' },
					    { "flush-dir", required_argument, NULL, 'F' },
					    { "json", no_argument, NULL, 'J' },
					    { "copy", no_argument, NULL, 'c' },
					    { "keep", required_argument, NULL, 'k' },
					    { "allow-older", no_argument, NULL, 'O' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	int c;
	optind = 1;
	o->keep = o->cfg.flush_keep;
	o->allow_older = o->cfg.allow_older;
	while ((c = getopt_long(argc, argv, "ho:", lo, NULL)) != -1) {
		switch (c) {
		case 's': snprintf(o->cfg.client.store, sizeof(o->cfg.client.store), "%s", optarg); break;
		case 'j':
			snprintf(o->cfg.client.job, sizeof(o->cfg.client.job), "%s", optarg);
			o->job_set = 1;
			break;
		case 'J': o->json = 1; break;
		case 'F': snprintf(o->cfg.flush_dir, sizeof(o->cfg.flush_dir), "%s", optarg); break;
		case 'c': o->copy = 1; break;
		case 'o': o->output = optarg; break;
		case 'O': o->allow_older = 1; break;
		case 'k':
			o->keep = (unsigned)atoi(optarg);
			if (o->keep < 1) {
				fprintf(stderr, "--keep must be at least 1\n");
				return ST_USAGE;
			}
			break;
		case 'h': printf("%s", usage); return -1;
		default: fprintf(stderr, "%s", usage); return ST_USAGE;
		}
	}
	if (argc - optind < (npos > 0 ? 1 : 0) || argc - optind > (npos < 0 ? -npos : npos)) {
		fprintf(stderr, "%s", usage);
		return ST_USAGE;
	}
	if (snap_config_socket(&o->cfg.client, err, sizeof(err))) {
		fprintf(stderr, "snaptool %s: %s\n", argv[0], err);
		return ST_USAGE;
	}
	o->arg1 = optind < argc ? argv[optind] : NULL;
	o->arg2 = optind + 1 < argc ? argv[optind + 1] : NULL;
	return 0;
}

void st_log(const char *msg)
{
	fprintf(stderr, "snaptool: %s\n", msg);
}

int st_open_store(const struct opts *o, struct snap_store **s)
{
	char err[512];
	/* What the scan skips (a FIFO where a manifest belongs, a torn manifest)
	 * is said on stderr: a recovery tool must not hide it. */
	int rc = snap_store_open(s, o->cfg.client.store, 64, o->cfg.mem_limit, 1, st_log, err, sizeof(err));
	if (rc)
		fprintf(stderr, "snaptool: %s\n", err);
	return rc ? ST_FAIL : 0;
}

int st_parse_step(const char *s, uint64_t *step)
{
	if (!s) {   /* st_parse lets a command make its first positional optional */
		fprintf(stderr, "snaptool: a STEP is required\n");
		return ST_USAGE;
	}
	char *end;
	*step = strtoull(s, &end, 10);
	if (!*s || *end) {
		fprintf(stderr, "snaptool: \"%s\" is not a step number\n", s);
		return ST_USAGE;
	}
	return 0;
}

void st_json_str(const char *s)
{
	putchar('"');
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\')
			printf("\\%c", *p);
		else if (*p < 0x20)
			printf("\\u%04x", *p);
		else
			putchar(*p);
	}
	putchar('"');
}
