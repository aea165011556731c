/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool status --nodes N --store PATTERN: the erasure-coded mesh seen
 * offline from all its node stores at once (PATTERN's "%n" is the node).
 * Per job and step: which nodes hold data (and for which ranks), which hold
 * parity, whether the step is globally complete, and per group whether it
 * is protected (every member has its record); then the storage overhead.
 * Reads files only (read-only store open, no lock), like the other views.
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/meshfiles.h"
#include "snap/ec.h"
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

static void show_job(struct snap_store **st, int nodes, const char *job)
{
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
	printf("job %s (%d nodes)\n", job, nodes);
	uint64_t data_total = 0, parity_total = 0;
	int k = 0, m = 0;
	for (int s = 0; s < ns && s < MESH_STATUS_MAXSTEPS; s++) {
		uint32_t ranks = 0, world = 0;
		printf("  step %" PRIu64 "\n    data:  ", steps[s]);
		for (int n = 0; n < nodes; n++) {
			struct store_job *j = st[n] ? snap_store_job(st[n], job, 0) : NULL;
			int first = 1;
			for (uint32_t r = 0; j && r < j->nranks; r++) {
				struct store_slot *sl = snap_store_find(st[n], j->ranks[r], steps[s], NULL);
				if (!sl)
					continue;
				if (first)
					printf(" node%d(r%u", n, r);
				else
					printf(",%u", r);
				first = 0;
				ranks++;
				world = sl->man.world;
			}
			if (!first)
				printf(")");
		}
		printf("%s\n    parity:", ranks ? "" : " none");
		int holders = 0;
		struct snap_ec_meta_info in, any = { 0 };
		char *have = calloc((size_t)nodes, 1);
		for (int n = 0; n < nodes; n++)
			if (st[n] && record(st[n]->root, job, steps[s], &in)) {
				printf(" node%d", n);
				holders++;
				any = in;
				if (have)
					have[n] = 1;
				if (s == 0 || !parity_total) {
					data_total += in.data_len;
					parity_total += in.parity_len;
				}
			}
		printf("%s\n    %s", holders ? "" : " none",
		       world && ranks == world ? "globally complete" : "not globally complete");
		if (world)
			printf(" (%u of %u ranks)", ranks, world);
		printf("\n");
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
				printf("    group %d (nodes %d-%d, %d+%d): %s", g.id, first, first + g.n - 1, g.k, g.m,
				       missing == 0 ? "protected" : missing <= g.m ? "rebuildable" : "NOT recoverable");
				if (missing) {
					printf(" (no parity/record on");
					for (int i = 0; i < g.n; i++)
						if (!have[first + i])
							printf(" node%d", first + i);
					printf(")");
				}
				printf("\n");
				first += g.n;
			}
		}
		free(have);
	}
	if (k)
		printf("  storage overhead M/K = %d/%d = %.2f (parity %" PRIu64 " bytes for %" PRIu64 " bytes of data)\n",
		       m, k, (double)m / k, parity_total, data_total);
	else
		printf("  no step is protected yet (no parity records)\n");
}

int cmd_mesh_status(int argc, char **argv)
{
	static const struct option lo[] = { { "store", required_argument, NULL, 's' },
					    { "nodes", required_argument, NULL, 'n' },
					    { "job", required_argument, NULL, 'j' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	const char *pat = getenv("SNAP_STORE"), *job = NULL;
	int nodes = 0, o;
	optind = 1;
	while ((o = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (o) {
		case 's': pat = optarg; break;
		case 'n': nodes = atoi(optarg); break;
		case 'j': job = optarg; break;
		case 'h':
			printf("usage: snaptool status --nodes N --store PATTERN [--job NAME]\n"
			       "The erasure-coded mesh of N node stores (\"%%n\" in PATTERN = node number):\n"
			       "per step the nodes holding data and parity, and whether each group is protected.\n");
			return ST_OK;
		default: return ST_USAGE;
		}
	}
	if (!pat || nodes < 1 || nodes > 4096 || !strstr(pat, "%n")) {
		fprintf(stderr, "snaptool status: --nodes N needs --store with %%n (e.g. /dev/shm/snap/node%%n)\n");
		return ST_USAGE;
	}
	struct snap_store **st = calloc((size_t)nodes, sizeof(*st));
	if (!st)
		return ST_FAIL;
	char root[SNAP_PATH_MAX], err[512];
	for (int n = 0; n < nodes; n++) {
		if (snap_mesh_expand(pat, n, root, sizeof(root))) {
			fprintf(stderr, "snaptool status: --store %s: node %d's path does not fit %zu bytes\n", pat, n,
				sizeof(root));
			while (n-- > 0)
				snap_store_close(st[n]);
			free(st);
			return ST_USAGE;
		}
		if (snap_store_open(&st[n], root, 64, UINT64_MAX, 1, NULL, err, sizeof(err)))
			printf("node%d: %s: no store (lost or not started)\n", n, root);
	}
	/* Every job any node knows, each once. */
	for (int n = 0; n < nodes; n++)
		for (struct store_job *j = st[n] ? st[n]->jobs : NULL; j; j = j->next) {
			int seen = 0;
			for (int p = 0; p < n && !seen; p++)
				seen = st[p] && snap_store_job(st[p], j->name, 0);
			if (!seen && (!job || !strcmp(job, j->name)))
				show_job(st, nodes, j->name);
		}
	for (int n = 0; n < nodes; n++)
		snap_store_close(st[n]);
	free(st);
	return ST_OK;
}
