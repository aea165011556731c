/* SPDX-License-Identifier: BSD-3-Clause */
/* Options shared by snaptool's store and disk subcommands; see opts.h. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opts.h"
#include "progress.h"
#include "snaptool.h"

/* Every command's --help ends with these (docs/snaptool.md and the man page
 * are generated from the help texts). */
static const char common_help[] =
	"  --json         one JSON document on stdout (schema: docs/snaptool-json.md); on\n"
	"                 failure {\"error\": MESSAGE, \"exit\": CODE}\n"
	"  -q, --quiet    nothing on stdout (except the --json document); errors on stderr\n"
	"  -v, --verbose  detail lines on stderr (what was opened, checked, skipped)\n";

int st_parse(int argc, char **argv, struct opts *o, const char *usage, int npos)
{
	memset(o, 0, sizeof(*o));
	o->cmd = argv[0];
	char err[256];
	snap_smp_config_init(&o->cfg);
	if (snap_smp_config_from_env(&o->cfg, err, sizeof(err))) {
		st_error("snaptool %s: %s", argv[0], err);
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
					    { "repair", no_argument, NULL, 'R' },
					    { "quiet", no_argument, NULL, 'q' },
					    { "verbose", no_argument, NULL, 'v' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	int c;
	optind = 1;
	opterr = 0;   /* our message, so that --json can carry it */
	o->keep = o->cfg.flush_keep;
	o->allow_older = o->cfg.allow_older;
	while ((c = getopt_long(argc, argv, "hqvo:", lo, NULL)) != -1) {
		switch (c) {
		case 's': snprintf(o->cfg.client.store, sizeof(o->cfg.client.store), "%s", optarg); break;
		case 'j':
			snprintf(o->cfg.client.job, sizeof(o->cfg.client.job), "%s", optarg);
			o->job_set = 1;
			break;
		case 'J': o->json = 1; break;
		case 'q': o->quiet = 1; break;
		case 'v': o->verbose = 1; break;
		case 'F': snprintf(o->cfg.flush_dir, sizeof(o->cfg.flush_dir), "%s", optarg); break;
		case 'c': o->copy = 1; break;
		case 'R': o->repair = 1; break;
		case 'o': o->output = optarg; break;
		case 'O': o->allow_older = 1; break;
		case 'k':
			o->keep = (unsigned)atoi(optarg);
			if (o->keep < 1) {
				st_error("snaptool %s: --keep must be at least 1", argv[0]);
				return ST_USAGE;
			}
			break;
		case 'h':
			printf("%s%s", usage, common_help);
			return -1;
		default:
			st_error("snaptool %s: %s \"%s\"", argv[0],
				 optopt && strchr("o", optopt) ? "option needs an argument:" : "unknown option or missing argument:",
				 argv[optind - 1]);
			fprintf(stderr, "%s", usage);
			return ST_USAGE;
		}
	}
	if (argc - optind < (npos > 0 ? 1 : 0) || argc - optind > (npos < 0 ? -npos : npos)) {
		st_error("snaptool %s: %s positional arguments", argv[0], argc - optind < 1 ? "missing" : "too many");
		fprintf(stderr, "%s", usage);
		return ST_USAGE;
	}
	if (o->quiet && o->verbose) {
		st_error("snaptool %s: --quiet and --verbose exclude each other", argv[0]);
		return ST_USAGE;
	}
	if (snap_config_socket(&o->cfg.client, err, sizeof(err))) {
		st_error("snaptool %s: %s", argv[0], err);
		return ST_USAGE;
	}
	st_progress_off = o->quiet;
	/* Quiet: the commands print as usual into nothing; errors and the
	 * warnings of a store scan still reach stderr. */
	if (o->quiet && !o->json && !freopen("/dev/null", "w", stdout)) {
		st_error("snaptool %s: --quiet: cannot open /dev/null", argv[0]);
		return ST_FAIL;
	}
	o->arg1 = optind < argc ? argv[optind] : NULL;
	o->arg2 = optind + 1 < argc ? argv[optind + 1] : NULL;
	return 0;
}

void st_log(const char *msg)
{
	fprintf(stderr, "snaptool: %s\n", msg);
}

static unsigned store_njobs(const struct snap_store *s)
{
	unsigned n = 0;
	for (const struct store_job *j = s->jobs; j; j = j->next)
		n++;
	return n;
}

int st_open_store(const struct opts *o, struct snap_store **s)
{
	char err[512];
	/* What the scan skips (a FIFO where a manifest belongs, a torn manifest)
	 * is said on stderr: a recovery tool must not hide it. */
	int rc = snap_store_open(s, o->cfg.client.store, 64, o->cfg.mem_limit, 1, st_log, err, sizeof(err));
	if (rc)
		st_error("snaptool %s: %s", o->cmd, err);
	else
		st_verbose(o, "store %s: %u jobs, %.1f MiB in slot files", (*s)->root, store_njobs(*s),
			   (double)(*s)->mem_used / 1048576.0);
	return rc ? ST_FAIL : 0;
}

int st_parse_step(const char *s, uint64_t *step)
{
	if (!s) {   /* st_parse lets a command make its first positional optional */
		st_error("snaptool: a STEP is required");
		return ST_USAGE;
	}
	char *end;
	*step = strtoull(s, &end, 10);
	if (!*s || *end) {
		st_error("snaptool: \"%s\" is not a step number", s);
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

int st_json_mode;
static int json_done;
static char last_error[1024];

void st_json_done(void)
{
	json_done = 1;
	fflush(stdout);
}

void st_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(last_error, sizeof(last_error), fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s\n", last_error);
}

void st_json_error(const char *cmd, int rc)
{
	if (!st_json_mode || json_done || rc == ST_OK)
		return;
	printf("{\"error\":");
	if (last_error[0]) {
		st_json_str(last_error);
	} else {
		/* A path that printed no st_error (getopt of --nodes, snapbench). */
		char msg[160];
		snprintf(msg, sizeof(msg), "snaptool %s: failed with exit code %d (see stderr)", cmd, rc);
		st_json_str(msg);
	}
	printf(",\"exit\":%d}\n", rc);
	st_json_done();
}

void st_verbose(const struct opts *o, const char *fmt, ...)
{
	if (!o->verbose)
		return;
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "snaptool %s: ", o->cmd);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}
