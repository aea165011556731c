/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool inspect: the regions of a step on every rank, from the node
 * store (read-only, without the daemon), else from its persisted copy.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/base.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/store.h"
#include "snap/wire.h"

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

static const char inspect_usage[] =
	"usage: snaptool inspect STEP [REGION] [--store DIR] [--flush-dir DIR] [--job NAME]\n"
	"                       [--json] [-q|-v]\n"
	"Regions of a step on every rank: dtype, shape, kind, codec, bytes, CRC32C of each chunk\n"
	"(the first 4 per region; all with REGION or --json). From the node store, else\n"
	"from the persisted copy in the flush directory. Exit 1 if neither holds the step.\n";

/* One region of a slot, as a text line. */
static void print_mem_region(const struct opts *o, const struct store_slot *sl, const struct snap_man_region *g)
{
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
	for (uint32_t c = 0; c < g->nchunks && (o->arg2 || c < 4); c++)
		printf("%s%08x", c ? "," : "", sl->man.crc[g->first_crc + c]);
	printf("%s\n", !o->arg2 && g->nchunks > 4 ? ",..." : "");
}

/* The step in the node store, rank by rank; whether any rank holds it. */
static int inspect_store(const struct opts *o, struct snap_store *s, struct store_job *j, uint64_t step)
{
	int found = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl) {
			st_verbose(o, "rank %u: no committed slot of step %" PRIu64 " in the node store", r, step);
			continue;
		}
		const struct snap_layout *lay = &sl->man.layout;
		if (o->json) {
			json_open_step(o->cfg.client.job, step, found);
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
			if (o->arg2 && strcmp(o->arg2, g->name))
				continue;
			if (o->json)
				json_mem_region(sl, g, n++ == 0);
			else
				print_mem_region(o, sl, g);
		}
		if (o->json)
			printf("]}");
	}
	return found;
}

/* The step's persisted copy, rank by rank; whether there is one. */
static int inspect_disk(const struct opts *o, uint64_t step)
{
	uint32_t world;
	struct snap_io_err e = { 0 };
	if (!o->cfg.flush_dir[0] || snap_io_step_world(o->cfg.flush_dir, o->cfg.client.job, step, &world, &e) != 0)
		return 0;
	st_verbose(o, "step %" PRIu64 " is not in the node store; reading its persisted copy in %s", step,
		   o->cfg.flush_dir);
	for (uint32_t r = 0; r < world; r++) {
		struct disk_walk w = { .only = o->arg2, .json = o->json };
		if (o->json) {
			json_open_step(o->cfg.client.job, step, r > 0);
			printf("{\"rank\":%u,\"world\":%u,\"source\":\"flush directory\",\"slot\":null,\"bytes\":null,"
			       "\"chunk_size\":null,\"regions\":[", r, world);
		} else
			printf("job %s step %" PRIu64 " rank %u/%u: persisted in %s\n", o->cfg.client.job, step, r, world,
			       o->cfg.flush_dir);
		int lrc = snap_io_list_regions(o->cfg.flush_dir, o->cfg.client.job, step, r, print_disk_region, &w, &e);
		if (o->json) {
			printf("],\"error\":");
			lrc ? st_json_str(e.msg) : (void)printf("null");
			printf("}");
		} else if (lrc) {
			printf("  %s\n", e.msg);
		}
	}
	return world > 0;
}

int cmd_inspect(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, inspect_usage, 2);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_parse_step(o.arg1, &step)) || (rc = st_open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.client.job, 0);
	if (!j)
		st_verbose(&o, "node store %s holds no job %s", o.cfg.client.store, o.cfg.client.job);
	int found = inspect_store(&o, s, j, step);
	snap_store_close(s);
	if (!found)
		found = inspect_disk(&o, step);
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
