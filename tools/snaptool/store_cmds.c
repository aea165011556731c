/*
 * status, ls, inspect, verify: read-only views of a node store. They open
 * the store without the daemon (read-only, no lock), so they work while
 * snapsmp runs, after it died, and on a store nobody serves.
 */
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "snaptool.h"
#include "store.h"

struct opts {
	struct snap_config cfg;
	int json, job_set;
	const char *arg1, *arg2;   /* positional: STEP [REGION] */
};

static int parse(int argc, char **argv, struct opts *o, const char *usage, int npos)
{
	memset(o, 0, sizeof(*o));
	char err[256];
	snap_config_init(&o->cfg);
	if (snap_config_from_env(&o->cfg, err, sizeof(err))) {
		fprintf(stderr, "snaptool %s: %s\n", argv[0], err);
		return ST_USAGE;
	}
	o->job_set = getenv("SNAP_JOB") != NULL;
	static const struct option lo[] = { { "store", required_argument, NULL, 's' },
					    { "job", required_argument, NULL, 'j' },
					    { "json", no_argument, NULL, 'J' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's': snprintf(o->cfg.store, sizeof(o->cfg.store), "%s", optarg); break;
		case 'j':
			snprintf(o->cfg.job, sizeof(o->cfg.job), "%s", optarg);
			o->job_set = 1;
			break;
		case 'J': o->json = 1; break;
		case 'h': printf("%s", usage); return -1;
		default: fprintf(stderr, "%s", usage); return ST_USAGE;
		}
	}
	if (argc - optind < (npos > 0 ? 1 : 0) || argc - optind > (npos < 0 ? -npos : npos)) {
		fprintf(stderr, "%s", usage);
		return ST_USAGE;
	}
	o->arg1 = optind < argc ? argv[optind] : NULL;
	o->arg2 = optind + 1 < argc ? argv[optind + 1] : NULL;
	return 0;
}

static int open_store(const struct opts *o, struct snap_store **s)
{
	char err[512];
	int rc = snap_store_open(s, o->cfg.store, 64, o->cfg.mem_limit, 1, NULL, err, sizeof(err));
	if (rc)
		fprintf(stderr, "snaptool: %s\n", err);
	return rc ? ST_FAIL : 0;
}

static int parse_step(const char *s, uint64_t *step)
{
	char *end;
	*step = strtoull(s, &end, 10);
	if (!*s || *end) {
		fprintf(stderr, "snaptool: \"%s\" is not a step number\n", s);
		return ST_USAGE;
	}
	return 0;
}

/* Distinct committed steps of a job, newest first. */
static size_t job_steps(const struct snap_store *s, const struct store_job *j, uint64_t *out, size_t cap)
{
	size_t n = 0;
	for (uint32_t r = 0; r < j->nranks; r++)
		for (unsigned i = 0; j->ranks[r] && i < s->nslots; i++) {
			const struct store_slot *sl = &j->ranks[r]->slots[i];
			if (sl->state != SLOT_COMMITTED)
				continue;
			size_t k = 0;
			while (k < n && out[k] != sl->step)
				k++;
			if (k == n && n < cap)
				out[n++] = sl->step;
		}
	for (size_t a = 1; a < n; a++)
		for (size_t b = a; b > 0 && out[b] > out[b - 1]; b--) {
			uint64_t t = out[b];
			out[b] = out[b - 1];
			out[b - 1] = t;
		}
	return n;
}

/* Ranks holding `step`, their bytes, and the world size they recorded. */
static uint32_t step_ranks(struct snap_store *s, struct store_job *j, uint64_t step, uint64_t *bytes, uint32_t *world)
{
	uint32_t n = 0;
	*bytes = 0;
	*world = 0;
	for (uint32_t r = 0; r < j->nranks; r++) {
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, NULL);
		if (sl) {
			n++;
			*bytes += sl->man.layout.slot_bytes;
			*world = sl->man.world;
		}
	}
	return n;
}

int cmd_status(int argc, char **argv)
{
	/* --nodes: the erasure-coded mesh of several stores (mesh_status.c). */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--nodes", 7))
			return cmd_mesh_status(argc, argv);
	struct opts o;
	struct snap_store *s;
	int rc = parse(argc, argv, &o, "usage: snaptool status [--store DIR] [--job NAME] [--json]\n"
				       "Steps of every job (or one) in a node store, and memory used.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = open_store(&o, &s)))
		return rc;
	if (o.json)
		printf("{\"store\":\"%s\",\"mem_used\":%" PRIu64 ",\"mem_limit\":%" PRIu64 ",\"jobs\":[", s->root,
		       s->mem_used, o.cfg.mem_limit);
	else
		printf("store %s: %.1f MiB in slot files, budget %.1f MiB (SNAP_MEM_LIMIT)\n", s->root,
		       s->mem_used / 1048576.0, o.cfg.mem_limit / 1048576.0);
	int first = 1;
	for (struct store_job *j = s->jobs; j; j = j->next) {
		if (o.job_set && strcmp(j->name, o.cfg.job))
			continue;
		uint64_t steps[256], latest = 0;
		size_t n = job_steps(s, j, steps, 256);
		int have = snap_store_latest(s, j, &latest) == 0;
		if (o.json) {
			printf("%s{\"job\":\"%s\",\"latest\":", first ? "" : ",", j->name);
			have ? printf("%" PRIu64, latest) : printf("null");
			printf(",\"steps\":[");
		} else {
			printf("job %s: newest restorable step ", j->name);
			have ? printf("%" PRIu64 "\n", latest) : printf("none\n");
			printf("  %-10s %-8s %-12s %s\n", "step", "ranks", "state", "bytes");
		}
		first = 0;
		for (size_t i = 0; i < n; i++) {
			uint64_t bytes;
			uint32_t world, k = step_ranks(s, j, steps[i], &bytes, &world);
			const char *state = k == world ? "restorable" : "partial";
			if (o.json)
				printf("%s{\"step\":%" PRIu64 ",\"ranks\":%u,\"world\":%u,\"state\":\"%s\",\"bytes\":%" PRIu64 "}",
				       i ? "," : "", steps[i], k, world, state, bytes);
			else
				printf("  %-10" PRIu64 " %u/%-6u %-12s %" PRIu64 "\n", steps[i], k, world, state, bytes);
		}
		if (o.json)
			printf("]}");
	}
	if (o.json)
		printf("]}\n");
	snap_store_close(s);
	return ST_OK;
}

int cmd_ls(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	int rc = parse(argc, argv, &o, "usage: snaptool ls [--store DIR] [--job NAME] [--json]\n"
				       "One line per committed snapshot: job, step, rank, slot, bytes.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = open_store(&o, &s)))
		return rc;
	int first = 1;
	if (o.json)
		printf("[");
	else
		printf("%-16s %-10s %-6s %-5s %s\n", "job", "step", "rank", "slot", "bytes");
	for (struct store_job *j = s->jobs; j; j = j->next) {
		if (o.job_set && strcmp(j->name, o.cfg.job))
			continue;
		for (uint32_t r = 0; r < j->nranks; r++)
			for (unsigned i = 0; j->ranks[r] && i < s->nslots; i++) {
				const struct store_slot *sl = &j->ranks[r]->slots[i];
				if (sl->state != SLOT_COMMITTED)
					continue;
				if (o.json)
					printf("%s{\"job\":\"%s\",\"step\":%" PRIu64 ",\"rank\":%u,\"slot\":%u,\"bytes\":%" PRIu64 "}",
					       first ? "" : ",", j->name, sl->step, r, i, sl->man.layout.slot_bytes);
				else
					printf("%-16s %-10" PRIu64 " %-6u %-5u %" PRIu64 "\n", j->name, sl->step, r, i,
					       sl->man.layout.slot_bytes);
				first = 0;
			}
	}
	if (o.json)
		printf("]\n");
	snap_store_close(s);
	return ST_OK;
}

static void print_shape(const struct snap_man_region *g)
{
	if (g->ndim == 0) {
		printf("[%" PRIu64 "]", g->bytes / snap_dtype_size(g->dtype));
		return;
	}
	for (int d = 0; d < g->ndim; d++)
		printf("%s%" PRIu64, d ? "x" : "[", g->shape[d]);
	printf("]");
	for (int d = 0; d < g->ndim; d++)
		if (g->shape[d] != g->global_shape[d] || g->shard_offset[d]) {
			for (int e = 0; e < g->ndim; e++)
				printf("%s%" PRIu64, e ? "," : " @(", g->shard_offset[e]);
			printf(") of ");
			for (int e = 0; e < g->ndim; e++)
				printf("%s%" PRIu64, e ? "x" : "[", g->global_shape[e]);
			printf("]");
			break;
		}
}

int cmd_inspect(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = parse(argc, argv, &o, "usage: snaptool inspect STEP [REGION] [--store DIR] [--job NAME]\n"
				       "Regions of a step on every rank: dtype, shape, kind, codec, bytes, CRC32C of each chunk.\n", -2);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = parse_step(o.arg1, &step)) || (rc = open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.job, 0);
	int found = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl)
			continue;
		found = 1;
		const struct snap_layout *lay = &sl->man.layout;
		printf("job %s step %" PRIu64 " rank %u/%u slot %u: %u regions, %" PRIu64 " bytes, %" PRIu64 "-byte chunks\n",
		       j->name, step, r, sl->man.world, slot, lay->nregions, lay->slot_bytes, lay->chunk_size);
		for (uint32_t i = 0; i < lay->nregions; i++) {
			const struct snap_man_region *g = &lay->regions[i];
			if (o.arg2 && strcmp(o.arg2, g->name))
				continue;
			printf("  %-24s %-5s %-6s codec=%u bytes=%" PRIu64 " shape=", g->name, snap_dtype_name(g->dtype),
			       snap_kind_name(g->kind), g->codec, g->bytes);
			print_shape(g);
			printf(" crc32c=");
			for (uint32_t c = 0; c < g->nchunks && (o.arg2 || c < 4); c++)
				printf("%s%08x", c ? "," : "", sl->man.crc[g->first_crc + c]);
			printf("%s\n", !o.arg2 && g->nchunks > 4 ? ",..." : "");
		}
	}
	snap_store_close(s);
	if (!found) {
		fprintf(stderr, "snaptool inspect: job %s has no committed step %" PRIu64 " in %s\n", o.cfg.job, step,
			o.cfg.store);
		return ST_FAIL;
	}
	return ST_OK;
}

int cmd_verify(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = parse(argc, argv, &o, "usage: snaptool verify STEP [--store DIR] [--job NAME]\n"
				       "Recompute the CRC32C of every chunk of a step on every rank. Exit 3 on a mismatch.\n", 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = parse_step(o.arg1, &step)) || (rc = open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.job, 0);
	uint32_t ranks = 0, bad = 0, world = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		char err[512];
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl)
			continue;
		ranks++;
		world = sl->man.world;
		int fd = snap_store_open_slot(s, j, j->ranks[r], slot, err, sizeof(err));
		if (fd < 0) {
			printf("rank %u: %s\n", r, err);
			bad++;
			continue;
		}
		const struct snap_layout *lay = &sl->man.layout;
		const uint8_t *p = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ, MAP_SHARED, fd, 0) : NULL;
		close(fd);
		if (p == MAP_FAILED) {
			printf("rank %u: cannot map slot %u\n", r, slot);
			bad++;
			continue;
		}
		uint32_t badc = 0;
		for (uint32_t i = 0; i < lay->nregions; i++) {
			const struct snap_man_region *g = &lay->regions[i];
			for (uint32_t c = 0; c < g->nchunks; c++) {
				uint64_t off = (uint64_t)c * lay->chunk_size;
				uint64_t n = g->bytes - off < lay->chunk_size ? g->bytes - off : lay->chunk_size;
				if (snap_crc32c(p + g->offset + off, n) != sl->man.crc[g->first_crc + c]) {
					printf("rank %u: region \"%s\" chunk %u: CRC32C mismatch\n", r, g->name, c);
					badc++;
				}
			}
		}
		if (p)
			munmap((void *)p, lay->slot_bytes);
		printf("rank %u: %s (%u chunks)\n", r, badc ? "CORRUPT" : "ok", lay->ncrc);
		bad += badc > 0;
	}
	snap_store_close(s);
	if (!ranks) {
		fprintf(stderr, "snaptool verify: job %s has no committed step %" PRIu64 " in %s\n", o.cfg.job, step,
			o.cfg.store);
		return ST_FAIL;
	}
	printf("step %" PRIu64 ": %u of %u ranks present, %u corrupt\n", step, ranks, world, bad);
	return bad || ranks < world ? ST_LOST : ST_OK;
}
