/* SPDX-License-Identifier: BSD-3-Clause */
/* What snaptool's commands share: options, the store, messages, JSON; see opts.h. */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cliopts.h"
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

static void st_error_line(const char *line)
{
	st_error("%s", line);
}

static int job_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	struct opts *o = dst;
	(void)c, (void)opt;
	snprintf(o->cfg.client.job, sizeof(o->cfg.client.job), "%s", v);
	o->job_set = 1;
	return 0;
}

static int keep_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	unsigned *keep = dst;
	char *end = NULL;
	long n = strtol(v, &end, 10);
	if (end == v || *end || n < 1 || n > 1048576) {
		cli_error(c, "%s \"%s\": expected a number of steps in [1, 1048576]", opt, v);
		return -1;
	}
	*keep = (unsigned)n;
	return 0;
}

static int nodes_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	int *nodes = dst;
	char *end = NULL;
	long n = strtol(v, &end, 10);
	if (end == v || *end || n < 1 || n > 4096) {
		cli_error(c, "%s \"%s\": expected a node count in [1, 4096]", opt, v);
		return -1;
	}
	*nodes = (int)n;
	return 0;
}

/* The options every command takes (each uses those it needs), into o. */
static int st_options(int argc, char **argv, struct opts *o, const char *usage, int *first_pos)
{
	const struct cli_opt lo[] = {
		CLI_OPT_BUF("store", 0, o->cfg.client.store),
		CLI_OPT_CALL("job", 0, o, job_opt),
		CLI_OPT_BUF("flush-dir", 0, o->cfg.flush_dir),
		CLI_OPT_FLAG("json", 0, &o->json),
		CLI_OPT_FLAG("copy", 0, &o->copy),
		CLI_OPT_CALL("keep", 0, &o->keep, keep_opt),
		CLI_OPT_CALL("nodes", 0, &o->nodes, nodes_opt),
		CLI_OPT_FLAG("allow-older", 0, &o->allow_older),
		CLI_OPT_FLAG("repair", 0, &o->repair),
		CLI_OPT_FLAG("quiet", 'q', &o->quiet),
		CLI_OPT_FLAG("verbose", 'v', &o->verbose),
		CLI_OPT_STR(NULL, 'o', &o->output),
		CLI_OPT_HELP,
	};
	char who[64];
	snprintf(who, sizeof(who), "snaptool %s", argv[0]);
	const struct cli c = { .who = who, .unknown_fmt = "%s: unknown option or missing argument: \"%s\"",
			       .missing_fmt = "%s: option needs an argument: \"%s\"", .max_pos = -1,
			       .error = st_error_line };
	int rc = cli_parse(&c, argc, argv, lo, sizeof(lo) / sizeof(lo[0]), first_pos);
	if (rc == CLI_HELP_ASKED)
		printf("%s%s", usage, common_help);
	else if (rc == CLI_EOPT)
		fprintf(stderr, "%s", usage);
	return rc == CLI_HELP_ASKED ? -1 : rc ? ST_USAGE : 0;
}

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
	o->keep = o->cfg.flush_keep;
	o->allow_older = o->cfg.allow_older;
	int first, rc = st_options(argc, argv, o, usage, &first);
	if (rc)
		return rc;
	if (argc - first < (npos > 0 ? 1 : 0) || argc - first > (npos < 0 ? -npos : npos)) {
		st_error("snaptool %s: %s positional arguments", argv[0], argc - first < 1 ? "missing" : "too many");
		fprintf(stderr, "%s", usage);
		return ST_USAGE;
	}
	if (o->quiet && o->verbose) {
		st_error("snaptool %s: --quiet and --verbose exclude each other", argv[0]);
		return ST_USAGE;
	}
	/* status and recover run their mesh view (main() picks it); of the
	 * rest only verify reads every node. */
	if (o->nodes && strcmp(argv[0], "verify")) {
		st_error("snaptool %s: --nodes is for status, recover and verify", argv[0]);
		return ST_USAGE;
	}
	if (o->nodes && st_need_node_pattern(argv[0], o->cfg.client.store))
		return ST_USAGE;
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
	o->arg1 = first < argc ? argv[first] : NULL;
	o->arg2 = first + 1 < argc ? argv[first + 1] : NULL;
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

int st_need_node_pattern(const char *cmd, const char *pat)
{
	if (pat && strstr(pat, "%n"))
		return 0;
	st_error("snaptool %s: --nodes N needs --store with %%n (e.g. /dev/shm/snap/node%%n)", cmd);
	return ST_USAGE;
}

int st_need_flush_dir(const struct opts *o)
{
	if (o->cfg.flush_dir[0])
		return 0;
	st_error("snaptool %s: no flush directory: pass --flush-dir DIR or set SNAP_FLUSH_DIR", o->cmd);
	return ST_USAGE;
}

/* Bytes of the persisted step's files, for the progress of reading them all. */
uint64_t st_step_disk_bytes(const char *flush_dir, const char *job, uint64_t step)
{
	char d[SNAP_PATH_MAX * 2];
	snprintf(d, sizeof(d), "%s/%s/step-%" PRIu64, flush_dir, job, step);
	return st_dir_bytes(d);
}
