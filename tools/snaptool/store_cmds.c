/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * status, ls, inspect, verify: read-only views of a node store. They open
 * the store without the daemon (read-only, no lock), so they work while
 * snapsmp runs, after it died, and on a store nobody serves.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "snap/base.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/store.h"
#include "snap/wire.h"

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

/* Ask the store's running snapsmp for its budget: 0, or -1 when none answers. */
struct daemon_view {
	uint64_t limit, used, pinned;
	uint32_t slots, pid, pinners;
	uint32_t reserving;       /* slot files still being reserved */
	int heal;                 /* the self-healing counters came (newer daemons) */
	uint64_t repaired_chunks, damaged_steps, scrubbed_bytes, scrub_passes, scrub_rate;
	char last_damage[768];
};

static int daemon_budget(const char *sock_path, struct daemon_view *v)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(sock_path) >= sizeof(a.sun_path))
		return -1;
	memcpy(a.sun_path, sock_path, strlen(sock_path) + 1);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0 ||
	    snap_wire_send(s, SNAP_MSG_STATUS, 0, NULL, 0, -1) != 0) {
		if (s >= 0)
			close(s);
		return -1;
	}
	struct snap_msg_hdr h;
	void *p = NULL;
	int rc = snap_wire_recv(s, &h, &p, NULL, 2000);
	close(s);
	if (rc || h.type != (SNAP_MSG_STATUS | SNAP_MSG_REPLY) || h.status != 0) {
		free(p);
		return -1;
	}
	struct snap_rbuf r;
	snap_rbuf_init(&r, p, h.len);
	v->limit = snap_get_u64(&r);
	v->used = snap_get_u64(&r);
	v->slots = snap_get_u32(&r);
	v->pid = snap_get_u32(&r);
	v->pinned = snap_get_u64(&r);
	v->pinners = snap_get_u32(&r);
	v->reserving = snap_rbuf_left(&r) ? snap_get_u32(&r) : 0;   /* older daemons do not send it */
	if ((v->heal = snap_rbuf_left(&r) != 0)) {
		v->repaired_chunks = snap_get_u64(&r);
		v->damaged_steps = snap_get_u64(&r);
		v->scrubbed_bytes = snap_get_u64(&r);
		v->scrub_passes = snap_get_u64(&r);
		v->scrub_rate = snap_get_u64(&r);
		snap_get_str(&r, v->last_damage, sizeof(v->last_damage));
	}
	free(p);
	return r.bad ? -1 : 0;
}

int cmd_status(int argc, char **argv)
{
	/* --nodes: the erasure-coded mesh of several stores (mesh_status.c). */
	for (int i = 1; i < argc; i++)
		if (!strncmp(argv[i], "--nodes", 7))
			return cmd_mesh_status(argc, argv, 0);
	struct opts o;
	struct snap_store *s;
	int rc = st_parse(argc, argv, &o, "usage: snaptool status [--store DIR] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
				       "Steps of every job (or one) in a node store (restorable = committed by every\n"
				       "rank, partial = some ranks), memory used against the running snapsmp's budget\n"
				       "(--mem-limit, asked over its socket; \"unknown\" when none answers), and the\n"
				       "steps persisted in the flush directory. Exit 1 if the store cannot be read.\n"
				       "With --nodes N and a --store holding %n (snapsmp --ec): the mesh view of N node\n"
				       "stores: per step, which nodes hold data and parity, whether each group is\n"
				       "protected, the storage overhead M/K, and per level (node stores, parity, disk\n"
				       "with --flush-dir) the step it holds and the one a relaunch restores.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_open_store(&o, &s)))
		return rc;
	/* The budget is the running daemon's (--mem-limit), not our default. */
	struct daemon_view d = { 0 };
	int live = daemon_budget(o.cfg.client.socket, &d) == 0;
	if (live)
		st_verbose(&o, "snapsmp pid %u answers on %s: %.1f of %.1f MiB used, %u slots per rank", d.pid,
			   o.cfg.client.socket, d.used / 1048576.0, d.limit / 1048576.0, d.slots);
	else
		st_verbose(&o, "no snapsmp answers on %s", o.cfg.client.socket);
	if (o.json) {
		printf("{\"store\":");
		st_json_str(s->root);
		printf(",\"mem_used\":%" PRIu64 ",\"mem_limit\":", s->mem_used);
		live ? printf("%" PRIu64, d.limit) : printf("null");
		printf(",\"daemon_mem_used\":");
		live ? printf("%" PRIu64, d.used) : printf("null");
		printf(",\"daemon_pid\":");
		live ? printf("%u", d.pid) : printf("null");
		printf(",\"pinned\":");
		live ? printf("%" PRIu64, d.pinned) : printf("null");
		printf(",\"pinned_by\":");
		live ? printf("%u", d.pinners) : printf("null");
		printf(",\"daemon_reserving\":");
		live ? printf("%u", d.reserving) : printf("null");
		/* Self-healing (docs/self-healing.md): null when no daemon (or an older one) answers. */
		const char *heal[] = { "repaired_chunks", "damaged_steps", "scrubbed_bytes", "scrub_passes", "scrub_rate" };
		const uint64_t hv[] = { d.repaired_chunks, d.damaged_steps, d.scrubbed_bytes, d.scrub_passes, d.scrub_rate };
		for (int i = 0; i < 5; i++)
			d.heal ? printf(",\"%s\":%" PRIu64, heal[i], hv[i]) : printf(",\"%s\":null", heal[i]);
		printf(",\"last_damage\":");
		d.heal && strcmp(d.last_damage, "none") ? st_json_str(d.last_damage) : (void)printf("null");
		printf(",\"jobs\":[");
	} else if (live) {
		printf("store %s: %.1f MiB in slot files, %.1f MiB counted by snapsmp (pid %u) against its budget of "
		       "%.1f MiB (--mem-limit)\n", s->root, s->mem_used / 1048576.0, d.used / 1048576.0, d.pid,
		       d.limit / 1048576.0);
		/* What trainers pin is the slots themselves, registered with CUDA
		 * (plus a table of frame lengths each): inside the budget above. */
		printf("pinned for GPU copies by %u connected process%s: %.1f MiB (their slots, registered with CUDA)\n",
		       d.pinners, d.pinners == 1 ? "" : "es", d.pinned / 1048576.0);
		/* The scrub's running counts are --json's: this text stays the same from call to call. */
		if (d.heal) {
			printf("self-healing: %" PRIu64 " chunks repaired, %" PRIu64 " steps damaged beyond repair; scrub ",
			       d.repaired_chunks, d.damaged_steps);
			d.scrub_rate ? printf("at %.1f MiB/s (--scrub-rate)\n", d.scrub_rate / 1048576.0)
				     : printf("off (--scrub-rate 0)\n");
			if (strcmp(d.last_damage, "none"))
				printf("last damage beyond repair: %s\n", d.last_damage);
		}
	} else {
		printf("store %s: %.1f MiB in slot files; no snapsmp answers on %s, so its budget is unknown\n", s->root,
		       s->mem_used / 1048576.0, o.cfg.client.socket);
	}
	int first = 1;
	for (struct store_job *j = s->jobs; j; j = j->next) {
		if (o.job_set && strcmp(j->name, o.cfg.client.job))
			continue;
		uint64_t steps[256], latest = 0;
		size_t n = job_steps(s, j, steps, 256);
		int have = snap_store_latest(s, j, &latest) == 0;
		if (o.json) {
			printf("%s{\"job\":", first ? "" : ",");
			st_json_str(j->name);
			printf(",\"latest\":");
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
		uint64_t disk[64];
		struct snap_io_err e = { 0 };
		int nd = o.cfg.flush_dir[0] ? snap_io_list_steps(o.cfg.flush_dir, j->name, disk, 64, &e) : 0;
		if (nd < 0)
			st_verbose(&o, "job %s: flush directory %s unreadable: %s", j->name, o.cfg.flush_dir, e.msg);
		if (o.json) {
			printf("],\"persisted\":[");
			for (int i = 0; i < nd && i < 64; i++)
				printf("%s%" PRIu64, i ? "," : "", disk[i]);
			printf("]}");
		} else if (o.cfg.flush_dir[0]) {
			printf("  persisted in %s:", o.cfg.flush_dir);
			if (nd < 0)
				printf(" unreadable: %s", e.msg);
			else if (nd == 0)
				printf(" none");
			for (int i = 0; i < nd && i < 64; i++)
				printf(" %" PRIu64, disk[i]);
			printf("\n");
		}
	}
	if (o.json) {
		printf("]}\n");
		st_json_done();
	}
	snap_store_close(s);
	return ST_OK;
}

int cmd_ls(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	int rc = st_parse(argc, argv, &o, "usage: snaptool ls [--store DIR] [--job NAME] [--json] [-q|-v]\n"
				       "One line per committed snapshot: job, step, rank, slot, bytes.\n", 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_open_store(&o, &s)))
		return rc;
	int first = 1;
	if (o.json)
		printf("[");
	else
		printf("%-16s %-10s %-6s %-5s %s\n", "job", "step", "rank", "slot", "bytes");
	for (struct store_job *j = s->jobs; j; j = j->next) {
		if (o.job_set && strcmp(j->name, o.cfg.client.job))
			continue;
		for (uint32_t r = 0; r < j->nranks; r++)
			for (unsigned i = 0; j->ranks[r] && i < s->nslots; i++) {
				const struct store_slot *sl = &j->ranks[r]->slots[i];
				if (sl->state != SLOT_COMMITTED) {
					st_verbose(&o, "job %s rank %u slot %u: %s (not listed)", j->name, r, i,
						   sl->state == SLOT_WRITING ? "being written" : "free");
					continue;
				}
				if (o.json) {
					printf("%s{\"job\":", first ? "" : ",");
					st_json_str(j->name);
					printf(",\"step\":%" PRIu64 ",\"rank\":%u,\"slot\":%u,\"bytes\":%" PRIu64 "}", sl->step,
					       r, i, sl->man.layout.slot_bytes);
				} else
					printf("%-16s %-10" PRIu64 " %-6u %-5u %" PRIu64 "\n", j->name, sl->step, r, i,
					       sl->man.layout.slot_bytes);
				first = 0;
			}
	}
	if (o.json) {
		printf("]\n");
		st_json_done();
	}
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

static void json_dims(const char *key, const uint64_t *v, int n)
{
	printf(",\"%s\":[", key);
	for (int d = 0; d < n; d++)
		printf("%s%" PRIu64, d ? "," : "", v[d]);
	printf("]");
}

/* One region of inspect --json (the fields docs/snaptool-json.md lists). */
static void json_region_head(const char *name, int dtype, int kind, const char *codec, uint64_t bytes, uint64_t stored)
{
	printf("{\"name\":");
	st_json_str(name);
	printf(",\"dtype\":\"%s\",\"kind\":\"%s\",\"codec\":\"%s\",\"bytes\":%" PRIu64 ",\"stored_bytes\":%" PRIu64,
	       snap_dtype_name(dtype), snap_kind_name(kind), codec, bytes, stored);
}

struct disk_walk {
	const char *only;   /* REGION, or NULL for all */
	int json, n;
};

static const char *disk_codec(const struct snap_io_region_info *g)
{
	return g->codec == SNAP_IO_CODEC_FRAMES ? snap_codec_spec_name(g->frame_codec)
	       : g->codec == SNAP_IO_CODEC_LZ4	 ? "lz4"
						 : "none";
}

static int print_disk_region(const struct snap_io_region_info *g, void *arg)
{
	struct disk_walk *w = arg;
	if (w->only && strcmp(w->only, g->name))
		return 0;
	if (w->json) {
		printf("%s", w->n++ ? "," : "");
		json_region_head(g->name, g->dtype, g->kind, disk_codec(g), g->bytes, g->stored_bytes);
		printf(",\"bound\":null");
		json_dims("shape", g->shape, g->ndim);
		json_dims("global_shape", g->global_shape, g->ndim);
		json_dims("shard_offset", g->shard_offset, g->ndim);
		printf(",\"dataset\":");
		st_json_str(g->dataset);
		if (g->codec == SNAP_IO_CODEC_FRAMES)
			printf(",\"frames\":%u,\"crc32c\":[]}", g->nframes);
		else
			printf(",\"frames\":null,\"crc32c\":[\"%08x\"]}", g->crc32c);
		return 0;
	}
	printf("  %-24s %-5s %-6s codec=%s", g->name, snap_dtype_name(g->dtype), snap_kind_name(g->kind), disk_codec(g));
	printf(" bytes=%" PRIu64 " stored=%" PRIu64 " shape=", g->bytes, g->stored_bytes);
	for (int d = 0; d < g->ndim; d++)
		printf("%s%" PRIu64, d ? "x" : "[", g->shape[d]);
	if (g->codec == SNAP_IO_CODEC_FRAMES)
		printf("] frames=%u dataset=%s\n", g->nframes, g->dataset);
	else
		printf("] crc32c=%08x dataset=%s\n", g->crc32c, g->dataset);
	return 0;
}

static void json_mem_region(const struct store_slot *sl, const struct snap_man_region *g, int first)
{
	uint64_t stored = 0;
	for (uint32_t c = 0; c < g->nchunks; c++)
		stored += sl->man.len[g->first_crc + c];
	printf("%s", first ? "" : ",");
	json_region_head(g->name, g->dtype, g->kind, snap_codec_spec_name(g->codec), g->bytes,
			 g->codec == SNAP_CODEC_NONE ? g->bytes : stored);
	if ((g->codec == SNAP_CODEC_LOSSY_ABS || g->codec == SNAP_CODEC_LOSSY_REL) && isfinite(g->bound))
		printf(",\"bound\":%.17g", g->bound);
	else
		printf(",\"bound\":null");
	if (g->ndim == 0) {   /* a flat region: its element count, whole */
		uint64_t n = g->bytes / snap_dtype_size(g->dtype), zero = 0;
		json_dims("shape", &n, 1);
		json_dims("global_shape", &n, 1);
		json_dims("shard_offset", &zero, 1);
	} else {
		json_dims("shape", g->shape, g->ndim);
		json_dims("global_shape", g->global_shape, g->ndim);
		json_dims("shard_offset", g->shard_offset, g->ndim);
	}
	printf(",\"dataset\":null,\"frames\":null,\"crc32c\":[");
	for (uint32_t c = 0; c < g->nchunks; c++)
		printf("%s\"%08x\"", c ? "," : "", sl->man.crc[g->first_crc + c]);
	printf("]}");
}

/* {"job":...,"step":...,"ranks":[ before the first rank, "," before the others. */
static void json_open_step(const char *job, uint64_t step, int found)
{
	if (found) {
		printf(",");
		return;
	}
	printf("{\"job\":");
	st_json_str(job);
	printf(",\"step\":%" PRIu64 ",\"ranks\":[", step);
}

int cmd_inspect(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, "usage: snaptool inspect STEP [REGION] [--store DIR] [--flush-dir DIR] [--job NAME]\n"
				       "                       [--json] [-q|-v]\n"
				       "Regions of a step on every rank: dtype, shape, kind, codec, bytes, CRC32C of each chunk\n"
				       "(the first 4 per region; all with REGION or --json). From the node store, else\n"
				       "from the persisted copy in the flush directory. Exit 1 if neither holds the step.\n", 2);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_parse_step(o.arg1, &step)) || (rc = st_open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.client.job, 0);
	if (!j)
		st_verbose(&o, "node store %s holds no job %s", o.cfg.client.store, o.cfg.client.job);
	int found = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl) {
			st_verbose(&o, "rank %u: no committed slot of step %" PRIu64 " in the node store", r, step);
			continue;
		}
		const struct snap_layout *lay = &sl->man.layout;
		if (o.json) {
			json_open_step(o.cfg.client.job, step, found);
			printf("{\"rank\":%u,\"world\":%u,\"source\":\"node store\",\"slot\":%u,\"bytes\":%" PRIu64
			       ",\"chunk_size\":%" PRIu64 ",\"error\":null,\"regions\":[",
			       r, sl->man.world, slot, lay->slot_bytes, lay->chunk_size);
		} else {
			printf("job %s step %" PRIu64 " rank %u/%u slot %u: %u regions, %" PRIu64 " bytes, %" PRIu64
			       "-byte chunks\n", j->name, step, r, sl->man.world, slot, lay->nregions, lay->slot_bytes,
			       lay->chunk_size);
		}
		found = 1;
		int n = 0;
		for (uint32_t i = 0; i < lay->nregions; i++) {
			const struct snap_man_region *g = &lay->regions[i];
			if (o.arg2 && strcmp(o.arg2, g->name))
				continue;
			if (o.json) {
				json_mem_region(sl, g, n++ == 0);
				continue;
			}
			printf("  %-24s %-5s %-6s codec=%s", g->name, snap_dtype_name(g->dtype), snap_kind_name(g->kind),
			       snap_codec_spec_name(g->codec));
			if (g->codec == SNAP_CODEC_LOSSY_ABS || g->codec == SNAP_CODEC_LOSSY_REL)
				printf(":%g", g->bound);
			printf(" bytes=%" PRIu64, g->bytes);
			if (g->codec != SNAP_CODEC_NONE) {
				uint64_t stored = 0;
				for (uint32_t c = 0; c < g->nchunks; c++)
					stored += sl->man.len[g->first_crc + c];
				printf(" stored=%" PRIu64 " (%.3fx)", stored, stored ? (double)g->bytes / (double)stored : 0.0);
			}
			printf(" shape=");
			print_shape(g);
			printf(" crc32c=");
			for (uint32_t c = 0; c < g->nchunks && (o.arg2 || c < 4); c++)
				printf("%s%08x", c ? "," : "", sl->man.crc[g->first_crc + c]);
			printf("%s\n", !o.arg2 && g->nchunks > 4 ? ",..." : "");
		}
		if (o.json)
			printf("]}");
	}
	snap_store_close(s);
	uint32_t world;
	struct snap_io_err e = { 0 };
	if (!found && o.cfg.flush_dir[0] && snap_io_step_world(o.cfg.flush_dir, o.cfg.client.job, step, &world, &e) == 0) {
		st_verbose(&o, "step %" PRIu64 " is not in the node store; reading its persisted copy in %s", step,
			   o.cfg.flush_dir);
		for (uint32_t r = 0; r < world; r++) {
			struct disk_walk w = { .only = o.arg2, .json = o.json };
			if (o.json) {
				json_open_step(o.cfg.client.job, step, found);
				printf("{\"rank\":%u,\"world\":%u,\"source\":\"flush directory\",\"slot\":null,\"bytes\":null,"
				       "\"chunk_size\":null,\"regions\":[", r, world);
			} else
				printf("job %s step %" PRIu64 " rank %u/%u: persisted in %s\n", o.cfg.client.job, step, r, world,
				       o.cfg.flush_dir);
			found = 1;
			int lrc = snap_io_list_regions(o.cfg.flush_dir, o.cfg.client.job, step, r, print_disk_region, &w, &e);
			if (o.json) {
				printf("],\"error\":");
				lrc ? st_json_str(e.msg) : (void)printf("null");
				printf("}");
			} else if (lrc) {
				printf("  %s\n", e.msg);
			}
		}
	}
	if (!found) {
		st_error("snaptool inspect: job %s has no step %" PRIu64 " in %s%s%s", o.cfg.client.job, step,
			 o.cfg.client.store, o.cfg.flush_dir[0] ? " nor in " : "", o.cfg.flush_dir);
		return ST_FAIL;
	}
	if (o.json) {
		printf("]}\n");
		st_json_done();
	}
	return ST_OK;
}

/* Bytes of the persisted step's files, for the progress of reading them all. */
uint64_t st_step_disk_bytes(const char *flush_dir, const char *job, uint64_t step)
{
	char d[SNAP_PATH_MAX * 2];
	snprintf(d, sizeof(d), "%s/%s/step-%" PRIu64, flush_dir, job, step);
	return st_dir_bytes(d);
}

/* What the running snapsmp's REPAIR of a step did (smp/repair.c). */
struct repair_view {
	uint64_t step;
	uint32_t ranks, bad, repaired, withdrawn, mended;
	char how[768];
};

/* Ask the store's snapsmp to verify and repair `step` of job on every rank:
 * 0, or an error code with msg saying why (none answers, or it refused). */
static int daemon_repair(const char *sock_path, const char *job, uint64_t step, struct repair_view *v, char *msg,
			 size_t msglen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(sock_path) >= sizeof(a.sun_path)) {
		snprintf(msg, msglen, "socket path %s is too long", sock_path);
		return SNAP_EINVAL;
	}
	memcpy(a.sun_path, sock_path, strlen(sock_path) + 1);
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, job);
	snap_put_u32(&w, UINT32_MAX);
	snap_put_u64(&w, step);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		snprintf(msg, msglen, "no snapsmp answers on %s: %s (the repair is the daemon's)", sock_path,
			 strerror(errno));
		snap_wbuf_free(&w);
		if (s >= 0)
			close(s);
		return SNAP_EIO;
	}
	struct snap_msg_hdr h;
	void *p = NULL;
	int rc;
	/* EBUSY: a mesh node waits for its next agreement round to decode the
	 * bad chunks from parity; the same connection asks again. */
	for (unsigned tries = 0;; tries++) {
		if (snap_wire_send(s, SNAP_MSG_REPAIR, 0, w.p, (uint32_t)w.len, -1) != 0) {
			rc = SNAP_EIO;
			break;
		}
		/* A repair reads the flushed files: allow it time. */
		rc = snap_wire_recv(s, &h, &p, NULL, 600000);
		if (rc || h.status != SNAP_EBUSY || tries >= 12000)
			break;
		free(p);
		p = NULL;
		struct timespec ts = { 0, 5000000L };
		nanosleep(&ts, NULL);
	}
	snap_wbuf_free(&w);
	close(s);
	struct snap_rbuf r;
	snap_rbuf_init(&r, p, rc ? 0 : h.len);
	if (rc || h.type != (SNAP_MSG_REPAIR | SNAP_MSG_REPLY)) {
		snprintf(msg, msglen, "snapsmp on %s did not answer the repair (%s)", sock_path, snap_strerror(rc));
		free(p);
		return rc ? rc : SNAP_EPROTO;
	}
	if (h.status != 0) {
		/* an error reply carries its message, raw */
		snprintf(msg, msglen, "%.*s", (int)(h.len < msglen ? h.len : msglen - 1), p ? (const char *)p : "");
		free(p);
		return h.status;
	}
	v->step = snap_get_u64(&r);
	v->ranks = snap_get_u32(&r);
	v->bad = snap_get_u32(&r);
	v->repaired = snap_get_u32(&r);
	v->withdrawn = snap_get_u32(&r);
	v->mended = snap_get_u32(&r);
	snap_get_str(&r, v->how, sizeof(v->how));
	free(p);
	if (r.bad) {
		snprintf(msg, msglen, "malformed REPAIR reply");
		return SNAP_EPROTO;
	}
	return 0;
}

int cmd_verify(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, "usage: snaptool verify STEP [--repair] [--store DIR] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
				       "Recompute the CRC32C of every chunk of a step on every rank in the node store, and\n"
				       "of every dataset of its persisted copy if there is one. Exit 3 on a mismatch or\n"
				       "when ranks are missing from the node store, 1 if neither holds the step.\n"
				       "--repair: first ask the running snapsmp to repair the step: each bad chunk is\n"
				       "rewritten from the next level that holds it intact (on a mesh its stripe decoded\n"
				       "from parity, then the flushed copy of the same step), checked against the\n"
				       "manifest's CRC32C; a rank's copy no level holds intact is withdrawn (on a mesh:\n"
				       "given up, and the agreement no longer counts the step), so the step is no longer\n"
				       "restorable; then verify what is left. Exit 1 if no snapsmp answers.\n"
				       "On a terminal, a progress bar (bytes, rate) on stderr; none when piped.\n", 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_parse_step(o.arg1, &step)))
		return rc;
	struct repair_view rv = { 0 };
	if (o.repair) {
		char msg[768] = "";
		int r2 = daemon_repair(o.cfg.client.socket, o.cfg.client.job, step, &rv, msg, sizeof(msg));
		if (r2) {
			st_error("snaptool verify --repair: %s", msg);
			return ST_FAIL;
		}
		if (!o.json)
			printf("repair: %u rank%s checked, %u bad chunks, %u repaired from the flush, %u rank%s withdrawn%s%s\n",
			       rv.ranks, rv.ranks == 1 ? "" : "s", rv.bad, rv.repaired, rv.withdrawn,
			       rv.withdrawn == 1 ? "" : "s", rv.bad || rv.mended ? ": " : "", rv.bad || rv.mended ? rv.how : "");
	}
	if ((rc = st_open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.client.job, 0);
	uint32_t ranks = 0, present = 0, bad = 0, world = 0, dworld = 0;
	uint64_t total = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, NULL);
		present += sl != NULL;
		for (uint32_t t = 0; sl && t < sl->man.layout.ncrc; t++)
			total += sl->man.len[t];
	}
	struct snap_io_err e = { 0 };
	int on_disk = o.cfg.flush_dir[0] && snap_io_step_world(o.cfg.flush_dir, o.cfg.client.job, step, &dworld, &e) == 0;
	if (!present && !on_disk) {
		snap_store_close(s);
		st_error("snaptool verify: job %s has no step %" PRIu64 " in %s%s%s", o.cfg.client.job, step,
			 o.cfg.client.store, o.cfg.flush_dir[0] ? " nor in " : "", o.cfg.flush_dir);
		return ST_FAIL;
	}
	if (o.json) {
		printf("{\"job\":");
		st_json_str(o.cfg.client.job);
		printf(",\"step\":%" PRIu64 ",\"repair\":", step);
		if (o.repair) {
			printf("{\"ranks\":%u,\"bad_chunks\":%u,\"repaired_chunks\":%u,\"withdrawn_ranks\":%u,"
			       "\"mended_files\":%u,\"how\":", rv.ranks, rv.bad, rv.repaired, rv.withdrawn, rv.mended);
			st_json_str(rv.how);
			printf("}");
		} else {
			printf("null");
		}
		printf(",\"ranks\":[");
	}
	struct st_progress bar;
	if (present)
		st_progress_begin(&bar, "verify", total);
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		char err[512] = "";
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl)
			continue;
		world = sl->man.world;
		const struct snap_layout *lay = &sl->man.layout;
		if (o.json)
			printf("%s{\"rank\":%u,\"slot\":%u,\"chunks\":%u,\"bad_chunks\":[", ranks ? "," : "", r, slot, lay->ncrc);
		ranks++;
		st_verbose(&o, "rank %u: slot %u, %u chunks, %" PRIu64 " bytes", r, slot, lay->ncrc, lay->slot_bytes);
		const uint8_t *p = NULL;
		int fd = snap_store_open_slot(s, j, j->ranks[r], slot, err, sizeof(err));
		if (fd >= 0) {
			p = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ, MAP_SHARED, fd, 0) : NULL;
			close(fd);
			if (p == MAP_FAILED)
				snprintf(err, sizeof(err), "cannot map slot %u", slot);
		}
		if (fd < 0 || p == MAP_FAILED) {
			st_progress_hide(&bar);
			if (o.json) {
				printf("],\"state\":\"unreadable\",\"error\":");
				st_json_str(err);
				printf("}");
			} else {
				printf("rank %u: %s\n", r, err);
			}
			bad++;
			continue;
		}
		uint32_t badc = 0;
		for (uint32_t t = 0; t < lay->ncrc; t++) {
			struct snap_chunk c;
			snap_layout_chunk(lay, t, &c);
			if (snap_crc32c(p + c.slot_off, sl->man.len[t]) != sl->man.crc[t]) {
				if (o.json) {
					printf("%s{\"region\":", badc ? "," : "");
					st_json_str(c.g->name);
					printf(",\"chunk\":%u}", c.index);
				} else {
					st_progress_hide(&bar);
					printf("rank %u: region \"%s\" chunk %u: CRC32C mismatch\n", r, c.g->name, c.index);
				}
				badc++;
			}
			st_progress_add(&bar, sl->man.len[t]);
		}
		if (p)
			munmap((void *)p, lay->slot_bytes);
		if (o.json) {
			printf("],\"state\":\"%s\",\"error\":null}", badc ? "corrupt" : "ok");
		} else {
			st_progress_hide(&bar);
			printf("rank %u: %s (%u chunks)\n", r, badc ? "CORRUPT" : "ok", lay->ncrc);
		}
		bad += badc > 0;
	}
	if (present)
		st_progress_end(&bar);
	snap_store_close(s);
	int disk_rc = SNAP_ENOENT;
	if (o.json) {
		printf("],\"ranks_present\":%u,\"world\":", ranks);
		ranks ? printf("%u", world) : printf("null");
	}
	if (on_disk) {
		size_t dbad = 0;
		struct st_progress dbar;
		st_progress_begin(&dbar, "verify disk", st_step_disk_bytes(o.cfg.flush_dir, o.cfg.client.job, step));
		st_progress_watch_reads(&dbar);
		disk_rc = snap_io_verify_step(o.cfg.flush_dir, o.cfg.client.job, step, &dbad, &e);
		st_progress_unwatch(&dbar);
		if (!disk_rc)
			st_progress_set(&dbar, dbar.total);
		st_progress_end(&dbar);
		if (o.json) {
			printf(",\"persisted\":{\"dir\":");
			st_json_str(o.cfg.flush_dir);
			printf(",\"world\":%u,\"state\":\"%s\",\"bad_datasets\":%zu,\"error\":", dworld,
			       disk_rc ? "corrupt" : "ok", dbad);
			disk_rc ? st_json_str(e.msg) : (void)printf("null");
			printf("}");
		} else {
			printf("persisted copy in %s: %s%s\n", o.cfg.flush_dir, disk_rc ? "CORRUPT: " : "ok",
			       disk_rc ? e.msg : "");
		}
	} else {
		if (o.json)
			printf(",\"persisted\":null");
		st_verbose(&o, "no persisted copy of step %" PRIu64 "%s%s", step,
			   o.cfg.flush_dir[0] ? " in " : " (no --flush-dir)", o.cfg.flush_dir);
	}
	const char *result = bad || disk_rc > 0 || (disk_rc && disk_rc != SNAP_ENOENT) ? "corrupt"
			     : ranks && ranks < world				  ? "incomplete"
										  : "ok";
	if (o.json) {
		printf(",\"result\":\"%s\"}\n", result);
		st_json_done();
	} else if (ranks) {
		printf("step %" PRIu64 ": %u of %u ranks present in the node store, %u corrupt\n", step, ranks, world, bad);
	}
	return strcmp(result, "ok") ? ST_LOST : ST_OK;
}
