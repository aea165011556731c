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
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/io.h"
#include "snap/meshfiles.h"
#include "snap/ec.h"
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

/* One job of the mesh view: text (per step unless levels_only), or one
 * JSON object of the "jobs" array when json (every step; first: no comma). */
static void show_job(struct snap_store **st, int nodes, const char *job, const char *flush_dir, int levels_only,
		     int json, int first_job, struct levels *L)
{
	*L = (struct levels){ 0 };
	uint64_t steps[64];
	int ns = 0;
	for (int n = 0; n < nodes; n++) {
		struct store_job *j = st[n] ? snap_store_job(st[n], job, 0) : NULL;
		for (uint32_t r = 0; j && r < j->nranks; r++)
			for (unsigned i = 0; j->ranks[r] && i < st[n]->nslots; i++)
				if (j->ranks[r]->slots[i].state == SLOT_COMMITTED)
					add_step(steps, &ns, j->ranks[r]->slots[i].step);
		uint64_t *rs;
		size_t nr;
		if (st[n] && !mesh_list_records(st[n]->root, job, &rs, &nr)) {
			for (size_t i = 0; i < nr; i++)
				add_step(steps, &ns, rs[i]);
			free(rs);
		}
	}
	qsort(steps, (size_t)ns, sizeof(steps[0]), cmp_desc);
	if (json) {
		printf("%s{\"job\": ", first_job ? "" : ", ");
		st_json_str(job);
		printf(", \"steps\": [");
	} else {
		printf("job %s (%d nodes)\n", job, nodes);
	}
	uint64_t data_total = 0, parity_total = 0;
	int k = 0, m = 0;
	/* levels_only: every step is looked at, nothing printed per step */
	FILE *out = levels_only || json ? NULL : stdout, *jo = json ? stdout : NULL;
	for (int s = 0; s < ns && (levels_only || json || s < MESH_STATUS_MAXSTEPS); s++) {
		uint32_t ranks = 0, world = 0;
		int jn = 0;   /* JSON list items so far */
		outf(out, "  step %" PRIu64 "\n    data:  ", steps[s]);
		outf(jo, "%s{\"step\": %" PRIu64 ", \"data_nodes\": [", s ? ", " : "", steps[s]);
		for (int n = 0; n < nodes; n++) {
			struct store_job *j = st[n] ? snap_store_job(st[n], job, 0) : NULL;
			int first = 1;
			for (uint32_t r = 0; j && r < j->nranks; r++) {
				struct store_slot *sl = snap_store_find(st[n], j->ranks[r], steps[s], NULL);
				if (!sl)
					continue;
				if (first) {
					outf(out, " node%d(r%u", n, r);
					outf(jo, "%s%d", jn++ ? ", " : "", n);
				} else
					outf(out, ",%u", r);
				first = 0;
				ranks++;
				world = sl->man.world;
			}
			if (!first)
				outf(out, ")");
		}
		outf(out, "%s\n    parity:", ranks ? "" : " none");
		outf(jo, "], \"parity_nodes\": [");
		int holders = 0;
		struct snap_ec_meta_info in, any = { 0 };
		char *have = calloc(nodes > 0 ? (size_t)nodes : 1, 1);   /* nodes > 0 (checked); -O1 cannot see it */
		for (int n = 0; n < nodes; n++)
			if (st[n] && record(st[n]->root, job, steps[s], &in)) {
				outf(out, " node%d", n);
				outf(jo, "%s%d", holders ? ", " : "", n);
				holders++;
				any = in;
				if (have)
					have[n] = 1;
				if (s == 0 || !parity_total) {
					data_total += in.data_len;
					parity_total += in.parity_len;
				}
			}
		outf(out, "%s\n    %s", holders ? "" : " none",
		       world && ranks == world ? "globally complete" : "not globally complete");
		if (world && ranks == world && !L->has_mem) {
			L->has_mem = 1;
			L->mem = steps[s];
		}
		int all_groups_ok = holders > 0;
		if (world)
			outf(out, " (%u of %u ranks)", ranks, world);
		outf(out, "\n");
		outf(jo, "], \"ranks\": %u, \"world\": %u, \"complete\": %s, \"groups\": [", ranks, world,
		     world && ranks == world ? "true" : "false");
		if (holders && have) {
			k = any.k;
			m = any.m;
			for (int first = 0; first < nodes;) {
				struct snap_ec_group g;
				if (snap_ec_group_of(nodes, any.k, any.m, 0, first, &g, NULL, 0))
					break;
				int missing = 0;
				for (int i = 0; i < g.n; i++)
					missing += !have[first + i];
				all_groups_ok &= missing <= g.m;
				outf(out, "    group %d (nodes %d-%d, %d+%d): %s", g.id, first, first + g.n - 1, g.k, g.m,
				       missing == 0 ? "protected" : missing <= g.m ? "rebuildable" : "NOT recoverable");
				outf(jo, "%s{\"group\": %d, \"first_node\": %d, \"last_node\": %d, \"k\": %d, \"m\": %d, "
				     "\"state\": \"%s\", \"missing\": [", g.id ? ", " : "", g.id, first, first + g.n - 1, g.k, g.m,
				     missing == 0 ? "protected" : missing <= g.m ? "rebuildable" : "not recoverable");
				if (missing)
					outf(out, " (no parity/record on");
				for (int i = 0, jm = 0; i < g.n; i++)
					if (!have[first + i]) {
						outf(out, " node%d", first + i);
						outf(jo, "%s%d", jm++ ? ", " : "", first + i);
					}
				outf(out, "%s\n", missing ? ")" : "");
				outf(jo, "]}");
				first += g.n;
			}
		}
		free(have);
		outf(jo, "]}");
		if (all_groups_ok && !L->has_par) {
			L->has_par = 1;
			L->par = steps[s];
		}
	}

	if (levels_only || json)
		;
	else if (k)
		printf("  storage overhead M/K = %d/%d = %.2f (parity %" PRIu64 " bytes for %" PRIu64 " bytes of data)\n",
		       m, k, (double)m / k, parity_total, data_total);
	else
		printf("  no step is protected yet (no parity records)\n");
	disk_level(flush_dir, job, L);
	if (json)
		json_levels(L, k, m, data_total, parity_total);
	else
		print_levels(job, L, flush_dir);
}

int cmd_mesh_status(int argc, char **argv, int recover)
{
	static const struct option lo[] = { { "store", required_argument, NULL, 's' },
					    { "nodes", required_argument, NULL, 'n' },
					    { "job", required_argument, NULL, 'j' },
					    { "flush-dir", required_argument, NULL, 'F' },
					    { "help", no_argument, NULL, 'h' },
					    { "json", no_argument, NULL, 'J' },
					    { "quiet", no_argument, NULL, 'q' },
					    { "verbose", no_argument, NULL, 'v' },
					    { NULL, 0, NULL, 0 } };
	const char *pat = getenv("SNAP_STORE"), *job = NULL, *flush_dir = getenv("SNAP_FLUSH_DIR");
	const char *cmd = recover ? "recover" : "status";
	int nodes = 0, o, json = 0, quiet = 0;
	optind = 1;
	opterr = 0;
	while ((o = getopt_long(argc, argv, "hqv", lo, NULL)) != -1) {
		switch (o) {
		case 's': pat = optarg; break;
		case 'n': nodes = atoi(optarg); break;
		case 'j': job = optarg; break;
		case 'F': flush_dir = optarg; break;
		case 'J': json = 1; break;
		case 'q': quiet = 1; break;
		case 'v': break;   /* the mesh view prints every detail it has */
		case 'h':
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
			return ST_OK;
		default:
			st_error("snaptool %s --nodes: unknown option or missing argument: \"%s\"", cmd, argv[optind - 1]);
			return ST_USAGE;
		}
	}
	if (quiet && !json && !freopen("/dev/null", "w", stdout)) {
		st_error("snaptool %s: --quiet: cannot open /dev/null", cmd);
		return ST_FAIL;
	}
	if (!pat || nodes < 1 || nodes > 4096 || !strstr(pat, "%n")) {
		st_error("snaptool %s: --nodes N needs --store with %%n (e.g. /dev/shm/snap/node%%n)", cmd);
		return ST_USAGE;
	}
	if (job && !snap_job_name_ok(job)) {
		st_error("snaptool %s: --job %s: not a job name", cmd, job);
		return ST_USAGE;
	}
	struct snap_store **st = calloc((size_t)nodes, sizeof(*st));
	if (!st)
		return ST_FAIL;
	char root[SNAP_PATH_MAX], err[512];
	for (int n = 0; n < nodes; n++) {
		if (snap_mesh_expand(pat, n, root, sizeof(root))) {
			fprintf(stderr, "snaptool %s: --store %s: node %d's path does not fit %zu bytes\n", cmd, pat, n,
				sizeof(root));
			while (n-- > 0)
				snap_store_close(st[n]);
			free(st);
			return ST_USAGE;
		}
		if (snap_store_open(&st[n], root, 64, UINT64_MAX, 1, NULL, err, sizeof(err)) && !json)
			printf("node%d: %s: no store (lost or not started)\n", n, root);
	}
	if (json) {
		printf("{\"nodes\": %d, \"store\": ", nodes);
		st_json_str(pat);
		printf(", \"missing_nodes\": [");
		for (int n = 0, c = 0; n < nodes; n++)
			if (!st[n])
				printf("%s%d", c++ ? ", " : "", n);
		printf("], \"jobs\": [");
	}
	/* Every job any node knows, each once; a named job also when only the
	 * disk knows it (every store lost). */
	int shown = 0, lost = 0;
	struct levels L;
	for (int n = 0; n < nodes; n++)
		for (struct store_job *j = st[n] ? st[n]->jobs : NULL; j; j = j->next) {
			int seen = 0;
			for (int p = 0; p < n && !seen; p++)
				seen = st[p] && snap_store_job(st[p], j->name, 0);
			if (!seen && (!job || !strcmp(job, j->name))) {
				show_job(st, nodes, j->name, flush_dir, recover, json, !shown, &L);
				uint64_t step;
				lost += !relaunch_level(&L, &step);
				shown++;
			}
		}
	if (!shown && job) {
		show_job(st, nodes, job, flush_dir, recover, json, 1, &L);
		uint64_t step;
		lost += !relaunch_level(&L, &step);
	}
	if (json) {
		printf("]}\n");
		st_json_done();
	}
	for (int n = 0; n < nodes; n++)
		snap_store_close(st[n]);
	free(st);
	return recover && lost ? ST_LOST : ST_OK;
}
