/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool status --nodes N --store PATTERN: the erasure-coded mesh seen
 * offline from all its node stores at once (PATTERN's "%n" is the node).
 * Per job and step: which nodes hold data (and for which ranks), which hold
 * parity, whether the step is globally complete, and per group whether it
 * is protected (every member has its record); then the storage overhead,
 * and from which level a relaunch would restore (see levels()).
 * snaptool recover --nodes N prints only the levels, with recover's exit
 * codes. Reads files only (read-only store open, no lock), like the other
 * views.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/damage.h"
#include "snap/io.h"
#include "snap/meshfiles.h"
#include "snap/ec.h"
#include "cliopts.h"
#include "opts.h"
#include "snaptool.h"
#include "snap/store.h"

#define MESH_STATUS_MAXSTEPS 8

/* Record of step on node: 1 with info when it unpacks. */
static int record(const char *root, const char *job, uint64_t step, struct snap_ec_meta_info *in)
{
	char p[SNAP_FILE_MAX];
	void *buf;
	size_t len;
	struct snap_ec_meta *meta = NULL;
	if (mesh_ec_path(root, job, step, "rec", p, sizeof(p)) || mesh_read_file(p, 1u << 30, &buf, &len))
		return 0;
	int ok = snap_ec_meta_unpack(buf, len, &meta, NULL, 0) == 0;
	free(buf);
	if (ok)
		snap_ec_meta_info(meta, in);
	snap_ec_meta_free(meta);
	return ok;
}

/* fprintf, or nothing for a NULL stream. */
__attribute__((format(printf, 2, 3))) static void outf(FILE *out, const char *fmt, ...)
{
	if (!out)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(out, fmt, ap);
	va_end(ap);
}

static void add_step(uint64_t *steps, int *n, uint64_t s)
{
	for (int i = 0; i < *n; i++)
		if (steps[i] == s)
			return;
	if (*n < 64)
		steps[(*n)++] = s;
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x > y ? -1 : x < y;
}

/* What each level of the hierarchy holds of a job (0 in has_*: nothing). */
struct levels {
	int has_mem, has_par, has_disk;
	uint64_t mem, par, disk;     /* newest globally complete / rebuildable / persisted step */
	char disk_why[600];
};

/*
 * Where a relaunch of the mesh restores from, mirroring snapsmp: relaunch
 * recovery rebuilds the newest step whose every group misses at most M
 * members' records (level 2; nothing to rebuild when none is missing),
 * then the trainers restore the newest globally complete step (level 1 if
 * that is in the stores as they are), else the newest persisted step on
 * disk (level 3), else nothing. Returns the level (1-3) or 0, *step.
 */
static int relaunch_level(const struct levels *L, uint64_t *step)
{
	if (L->has_mem && (!L->has_par || L->mem >= L->par)) {
		*step = L->mem;
		return 1;
	}
	if (L->has_par) {
		*step = L->par;
		return 2;
	}
	if (L->has_disk) {
		*step = L->disk;
		return 3;
	}
	return 0;
}

static void disk_level(const char *flush_dir, const char *job, struct levels *L)
{
	if (!flush_dir || !flush_dir[0]) {
		snprintf(L->disk_why, sizeof(L->disk_why), "no flush directory given (--flush-dir / SNAP_FLUSH_DIR)");
		return;
	}
	uint64_t newest = 0, sealed = 0;
	uint32_t w;
	struct snap_io_err e = { 0 };
	int have = snap_io_newest_step(flush_dir, job, &newest, &e) == 0;
	/* A newer step sealed and damaged since: restore from disk refuses
	 * to go past it without SNAP_ALLOW_OLDER, so no level-3 step is promised. */
	if (snap_io_sealed_step(flush_dir, job, &sealed) && (!have || sealed > newest) &&
	    snap_io_step_world(flush_dir, job, sealed, &w, &e) != 0) {
		snprintf(L->disk_why, sizeof(L->disk_why), "persisted step %" PRIu64 " is damaged (%s); restore from "
			 "disk refuses it without SNAP_ALLOW_OLDER=1", sealed, e.msg);
	} else if (have) {
		L->has_disk = 1;
		L->disk = newest;
	} else {
		snprintf(L->disk_why, sizeof(L->disk_why), "nothing persisted in %s", flush_dir);
	}
}

static void print_levels(const char *job, const struct levels *L, const char *flush_dir)
{
	static const char *name[] = { "nothing", "the node stores", "parity (rebuilt at relaunch)",
				      "disk (the newest persisted step)" };
	printf("  level 1, node stores: ");
	L->has_mem ? printf("step %" PRIu64 " globally complete\n", L->mem) : printf("no globally complete step\n");
	printf("  level 2, parity:      ");
	L->has_par ? printf("step %" PRIu64 " protected or rebuildable in every group\n", L->par)
		   : printf("no step rebuildable in every group\n");
	printf("  level 3, disk:        ");
	L->has_disk ? printf("step %" PRIu64 " persisted in %s (snaptool verify checks its bytes)\n", L->disk, flush_dir)
		    : printf("%s\n", L->disk_why);
	uint64_t step = 0;
	int lv = relaunch_level(L, &step);
	if (lv)
		printf("  a relaunch restores step %" PRIu64 " from %s (level %d)\n", step, name[lv], lv);
	else
		printf("  NOTHING IS RECOVERABLE for job %s\n", job);
}

/* The job's levels and relaunch choice, as JSON (docs/snaptool-json.md, "mesh"). */
static void json_levels(const struct levels *L, int k, int m, uint64_t data_total, uint64_t parity_total)
{
	uint64_t step = 0;
	int lv = relaunch_level(L, &step);
	printf("], \"k\": ");
	k ? printf("%d, \"m\": %d", k, m) : printf("null, \"m\": null");
	printf(", \"data_bytes\": %" PRIu64 ", \"parity_bytes\": %" PRIu64 ", \"levels\": {\"node_stores\": ", data_total,
	       parity_total);
	L->has_mem ? printf("%" PRIu64, L->mem) : printf("null");
	printf(", \"parity\": ");
	L->has_par ? printf("%" PRIu64, L->par) : printf("null");
	printf(", \"disk\": ");
	L->has_disk ? printf("%" PRIu64, L->disk) : printf("null");
	printf("}, \"disk_why\": ");
	L->has_disk ? printf("null") : st_json_str(L->disk_why);
	printf(", \"restore_level\": %d, \"restore_step\": ", lv);
	lv ? printf("%" PRIu64 "}", step) : printf("null}");
}

/* One job of the mesh view being printed: text to out, JSON to jo (either NULL). */
struct job_view {
	struct snap_store **st;
	int nodes;
	const char *job;
	FILE *out, *jo;
	uint64_t data_total, parity_total;
	int k, m;            /* the shape the parity records give (0: none seen) */
};

/* Every step any node holds of the job (committed slots, parity records), newest first. */
static int job_all_steps(const struct job_view *v, uint64_t *steps)
{
	int ns = 0;
	for (int n = 0; n < v->nodes; n++) {
		struct snap_store *st = v->st[n];
		struct store_job *j = st ? snap_store_job(st, v->job, 0) : NULL;
		for (uint32_t r = 0; j && r < j->nranks; r++)
			for (unsigned i = 0; j->ranks[r] && i < st->nslots; i++)
				if (j->ranks[r]->slots[i].state == SLOT_COMMITTED)
					add_step(steps, &ns, j->ranks[r]->slots[i].step);
		uint64_t *rs;
		size_t nr;
		if (st && !mesh_list_records(st->root, v->job, &rs, &nr)) {
			for (size_t i = 0; i < nr; i++)
				add_step(steps, &ns, rs[i]);
			free(rs);
		}
	}
	qsort(steps, (size_t)ns, sizeof(steps[0]), cmp_desc);
	return ns;
}

/* The nodes holding the step's data, and for which ranks; *ranks of *world. */
static void step_data(const struct job_view *v, uint64_t step, uint32_t *ranks, uint32_t *world)
{
	int jn = 0;   /* JSON list items so far */
	for (int n = 0; n < v->nodes; n++) {
		struct store_job *j = v->st[n] ? snap_store_job(v->st[n], v->job, 0) : NULL;
		int first = 1;
		for (uint32_t r = 0; j && r < j->nranks; r++) {
			struct store_slot *sl = snap_store_find(v->st[n], j->ranks[r], step, NULL);
			if (!sl)
				continue;
			if (first) {
				outf(v->out, " node%d(r%u", n, r);
				outf(v->jo, "%s%d", jn++ ? ", " : "", n);
			} else
				outf(v->out, ",%u", r);
			first = 0;
			(*ranks)++;
			*world = sl->man.world;
		}
		if (!first)
			outf(v->out, ")");
	}
}

/* The nodes holding the step's parity record (have[n] set); how many.
 * *any: one of the records; the sizes count once, from the first step. */
static int step_parity(struct job_view *v, uint64_t step, int s, char *have, struct snap_ec_meta_info *any)
{
	int holders = 0;
	struct snap_ec_meta_info in;
	for (int n = 0; n < v->nodes; n++)
		if (v->st[n] && record(v->st[n]->root, v->job, step, &in)) {
			outf(v->out, " node%d", n);
			outf(v->jo, "%s%d", holders ? ", " : "", n);
			holders++;
			*any = in;
			if (have)
				have[n] = 1;
			if (s == 0 || !v->parity_total) {
				v->data_total += in.data_len;
				v->parity_total += in.parity_len;
			}
		}
	return holders;
}

/* Each group of the step's shape: protected, rebuildable or not; whether all can be restored. */
static int step_groups(const struct job_view *v, const struct snap_ec_meta_info *any, const char *have)
{
	int all_ok = 1;
	for (int first = 0; first < v->nodes;) {
		struct snap_ec_group g;
		if (snap_ec_group_of(v->nodes, any->k, any->m, 0, first, &g, NULL, 0))
			break;
		int missing = 0;
		for (int i = 0; i < g.n; i++)
			missing += !have[first + i];
		all_ok &= missing <= g.m;
		outf(v->out, "    group %d (nodes %d-%d, %d+%d): %s", g.id, first, first + g.n - 1, g.k, g.m,
		     missing == 0 ? "protected" : missing <= g.m ? "rebuildable" : "NOT recoverable");
		outf(v->jo, "%s{\"group\": %d, \"first_node\": %d, \"last_node\": %d, \"k\": %d, \"m\": %d, "
		     "\"state\": \"%s\", \"missing\": [", g.id ? ", " : "", g.id, first, first + g.n - 1, g.k, g.m,
		     missing == 0 ? "protected" : missing <= g.m ? "rebuildable" : "not recoverable");
		if (missing)
			outf(v->out, " (no parity/record on");
		for (int i = 0, jm = 0; i < g.n; i++)
			if (!have[first + i]) {
				outf(v->out, " node%d", first + i);
				outf(v->jo, "%s%d", jm++ ? ", " : "", first + i);
			}
		outf(v->out, "%s\n", missing ? ")" : "");
		outf(v->jo, "]}");
		first += g.n;
	}
	return all_ok;
}

/* Step number s of the job (the s-th newest): data, parity, groups; the levels it reaches. */
static void show_step(struct job_view *v, uint64_t step, int s, struct levels *L)
{
	uint32_t ranks = 0, world = 0;
	outf(v->out, "  step %" PRIu64 "\n    data:  ", step);
	outf(v->jo, "%s{\"step\": %" PRIu64 ", \"data_nodes\": [", s ? ", " : "", step);
	step_data(v, step, &ranks, &world);
	outf(v->out, "%s\n    parity:", ranks ? "" : " none");
	outf(v->jo, "], \"parity_nodes\": [");
	struct snap_ec_meta_info any = { 0 };
	char *have = calloc(v->nodes > 0 ? (size_t)v->nodes : 1, 1);   /* nodes > 0 (checked); -O1 cannot see it */
	int holders = step_parity(v, step, s, have, &any);
	int complete = world && ranks == world;
	outf(v->out, "%s\n    %s", holders ? "" : " none", complete ? "globally complete" : "not globally complete");
	if (complete && !L->has_mem) {
		L->has_mem = 1;
		L->mem = step;
	}
	int all_groups_ok = holders > 0;
	if (world)
		outf(v->out, " (%u of %u ranks)", ranks, world);
	outf(v->out, "\n");
	outf(v->jo, "], \"ranks\": %u, \"world\": %u, \"complete\": %s, \"groups\": [", ranks, world,
	     complete ? "true" : "false");
	if (holders && have) {
		v->k = any.k;
		v->m = any.m;
		all_groups_ok &= step_groups(v, &any, have);
	}
	free(have);
	outf(v->jo, "]}");
	if (all_groups_ok && !L->has_par) {
		L->has_par = 1;
		L->par = step;
	}
}

/* One job of the mesh view: text (per step unless levels_only), or one
 * JSON object of the "jobs" array when json (every step; first: no comma). */
static void show_job(struct snap_store **st, int nodes, const char *job, const char *flush_dir, int levels_only,
		     int json, int first_job, struct levels *L)
{
	*L = (struct levels){ 0 };
	/* levels_only: every step is looked at, nothing printed per step */
	struct job_view v = { .st = st, .nodes = nodes, .job = job, .out = levels_only || json ? NULL : stdout,
			      .jo = json ? stdout : NULL };
	uint64_t steps[64];
	int ns = job_all_steps(&v, steps);
	if (json) {
		printf("%s{\"job\": ", first_job ? "" : ", ");
		st_json_str(job);
		printf(", \"steps\": [");
	} else {
		printf("job %s (%d nodes)\n", job, nodes);
	}
	for (int s = 0; s < ns && (levels_only || json || s < MESH_STATUS_MAXSTEPS); s++)
		show_step(&v, steps[s], s, L);
	if (levels_only || json)
		;
	else if (v.k)
		printf("  storage overhead M/K = %d/%d = %.2f (parity %" PRIu64 " bytes for %" PRIu64 " bytes of data)\n",
		       v.m, v.k, (double)v.m / v.k, v.parity_total, v.data_total);
	else
		printf("  no step is protected yet (no parity records)\n");
	disk_level(flush_dir, job, L);
	if (json)
		json_levels(L, v.k, v.m, v.data_total, v.parity_total);
	else
		print_levels(job, L, flush_dir);
}

struct mesh_args {
	const char *pat, *job, *flush_dir, *cmd;
	int nodes, json, quiet, recover;
};

static void mesh_help(const char *cmd, int recover)
{
	printf("usage: snaptool %s --nodes N --store PATTERN [--flush-dir DIR] [--job NAME]\n"
	       "The erasure-coded mesh of N node stores (\"%%n\" in PATTERN = node number)%s\n"
	       "and, per job, what each level holds (node stores, parity, the shared flush\n"
	       "directory) and from which a relaunch restores.%s\n"
	       "  -q, --quiet    nothing on stdout; the exit code tells%s\n"
	       "  -v, --verbose  accepted; the mesh view is already complete\n"
	       "  --json         one JSON document (docs/snaptool-json.md, \"mesh\")\n", cmd,
	       recover ? "" : ":\nper step the nodes holding data and parity, whether each group is protected,",
	       recover ? " Exit 0 if every job shown is recoverable,\n3 if one is not" : "",
	       recover ? "" : " (0, or 1/2 on errors)");
}

static void st_error_line(const char *line)
{
	st_error("%s", line);
}

/* 0 with a filled, -1 after --help, or an exit code after a message. */
static int mesh_parse(int argc, char **argv, int recover, struct mesh_args *a)
{
	const char *nodes = NULL;
	int verbose;   /* the mesh view prints every detail it has */
	*a = (struct mesh_args){ .pat = getenv("SNAP_STORE"), .flush_dir = getenv("SNAP_FLUSH_DIR"),
				 .cmd = recover ? "recover" : "status", .recover = recover };
	const struct cli_opt lo[] = {
		CLI_OPT_STR("store", 0, &a->pat),        CLI_OPT_STR("nodes", 0, &nodes),
		CLI_OPT_STR("job", 0, &a->job),          CLI_OPT_STR("flush-dir", 0, &a->flush_dir),
		CLI_OPT_HELP,                            CLI_OPT_FLAG("json", 0, &a->json),
		CLI_OPT_FLAG("quiet", 'q', &a->quiet),   CLI_OPT_FLAG("verbose", 'v', &verbose),
	};
	char who[64];
	snprintf(who, sizeof(who), "snaptool %s --nodes", a->cmd);
	const struct cli c = { .who = who, .unknown_fmt = "%s: unknown option or missing argument: \"%s\"",
			       .max_pos = -1, .error = st_error_line };
	int rc = cli_parse(&c, argc, argv, lo, sizeof(lo) / sizeof(lo[0]), NULL);
	if (rc == CLI_HELP_ASKED) {
		mesh_help(a->cmd, recover);
		return -1;
	}
	if (rc)
		return ST_USAGE;
	char *end = NULL;
	long n = nodes ? strtol(nodes, &end, 10) : 0;
	if (!nodes || end == nodes || *end || n < 1 || n > 4096) {
		st_error("snaptool %s: --nodes \"%s\": expected a node count in [1, 4096]", a->cmd, nodes ? nodes : "");
		return ST_USAGE;
	}
	a->nodes = (int)n;
	if (a->quiet && !a->json && !freopen("/dev/null", "w", stdout)) {
		st_error("snaptool %s: --quiet: cannot open /dev/null", a->cmd);
		return ST_FAIL;
	}
	if (st_need_node_pattern(a->cmd, a->pat))
		return ST_USAGE;
	if (a->job && !snap_job_name_ok(a->job)) {
		st_error("snaptool %s: --job %s: not a job name", a->cmd, a->job);
		return ST_USAGE;
	}
	return 0;
}

/* Every node's store, NULL where there is none; ST_OK or ST_USAGE. */
static int mesh_open(const struct mesh_args *a, struct snap_store **st)
{
	char root[SNAP_PATH_MAX], err[512];
	for (int n = 0; n < a->nodes; n++) {
		if (snap_mesh_expand(a->pat, n, root, sizeof(root))) {
			fprintf(stderr, "snaptool %s: --store %s: node %d's path does not fit %zu bytes\n", a->cmd, a->pat,
				n, sizeof(root));
			while (n-- > 0)
				snap_store_close(st[n]);
			return ST_USAGE;
		}
		if (snap_store_open(&st[n], root, 64, UINT64_MAX, 1, NULL, err, sizeof(err)) && !a->json)
			printf("node%d: %s: no store (lost or not started)\n", n, root);
	}
	return ST_OK;
}

/* Every job any node knows, each once; a named job also when only the
 * disk knows it (every store lost). How many have nothing to restore. */
static int mesh_jobs(const struct mesh_args *a, struct snap_store **st)
{
	int shown = 0, lost = 0, nodes = a->nodes;
	struct levels L;
	uint64_t step;
	for (int n = 0; n < nodes; n++)
		for (struct store_job *j = st[n] ? st[n]->jobs : NULL; j; j = j->next) {
			int seen = 0;
			for (int p = 0; p < n && !seen; p++)
				seen = st[p] && snap_store_job(st[p], j->name, 0);
			if (!seen && (!a->job || !strcmp(a->job, j->name))) {
				show_job(st, nodes, j->name, a->flush_dir, a->recover, a->json, !shown, &L);
				lost += !relaunch_level(&L, &step);
				shown++;
			}
		}
	if (!shown && a->job) {
		show_job(st, nodes, a->job, a->flush_dir, a->recover, a->json, 1, &L);
		lost += !relaunch_level(&L, &step);
	}
	return lost;
}

/* Damage beyond repair each node's store recorded (snap/damage.h), as
 * snaptool status shows one store's: text, the newest record per node; JSON,
 * every record with its node. */
static void mesh_damage(const struct mesh_args *a, struct snap_store **st)
{
	struct snap_damage *d = malloc(SNAP_DAMAGE_KEEP * sizeof(*d));
	int shown = 0;
	if (a->json)
		printf(", \"damage\": [");
	for (int n = 0; d && n < a->nodes; n++) {
		int nd = st[n] ? snap_damage_load(st[n]->root, d, SNAP_DAMAGE_KEEP) : 0, last = -1;
		for (int i = 0; i < nd; i++) {
			if (a->job && strcmp(a->job, d[i].job))
				continue;
			last = i;
			if (!a->json)
				continue;
			printf("%s{\"node\": %d, \"time\": %" PRIu64 ", \"job\": ", shown++ ? ", " : "", n, d[i].time_s);
			st_json_str(d[i].job);
			printf(", \"what\": ");
			st_json_str(d[i].what);
			printf(", \"why\": ");
			st_json_str(d[i].why);
			printf("}");
		}
		if (last >= 0 && !a->json && !a->recover) {
			char line[1024];
			snap_damage_line(&d[last], line, sizeof(line));
			printf("node%d: last damage beyond repair (recorded in the store): %s\n", n, line);
		}
	}
	if (a->json)
		printf("]");
	free(d);
}

static int mesh_view(int argc, char **argv, int recover)
{
	struct mesh_args a;
	int rc = mesh_parse(argc, argv, recover, &a);
	if (rc)
		return rc < 0 ? ST_OK : rc;
	struct snap_store **st = calloc((size_t)a.nodes, sizeof(*st));
	if (!st)
		return ST_FAIL;
	if ((rc = mesh_open(&a, st))) {
		free(st);
		return rc;
	}
	if (a.json) {
		printf("{\"nodes\": %d, \"store\": ", a.nodes);
		st_json_str(a.pat);
		printf(", \"missing_nodes\": [");
		for (int n = 0, c = 0; n < a.nodes; n++)
			if (!st[n])
				printf("%s%d", c++ ? ", " : "", n);
		printf("], \"jobs\": [");
	}
	int lost = mesh_jobs(&a, st);
	if (a.json)
		printf("]");
	mesh_damage(&a, st);
	if (a.json) {
		printf("}\n");
		st_json_done();
	}
	for (int n = 0; n < a.nodes; n++)
		snap_store_close(st[n]);
	free(st);
	return recover && lost ? ST_LOST : ST_OK;
}

int cmd_mesh_status(int argc, char **argv)
{
	return mesh_view(argc, argv, 0);
}

int cmd_mesh_recover(int argc, char **argv)
{
	return mesh_view(argc, argv, 1);
}
