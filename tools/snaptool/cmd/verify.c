/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool verify: recompute every checksum of a step in the node store
 * and of its persisted copy; with --repair, first ask the running snapsmp
 * to repair the step.
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
#include <time.h>
#include <unistd.h>

#include "snap/base.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snap/meshfiles.h"
#include "snaptool.h"
#include "snap/store.h"
#include "snap/wire.h"

/* What the running snapsmp's REPAIR of a step did (smp/heal/repair.c). */
struct repair_view {
	uint64_t step;
	uint32_t ranks, bad, repaired, withdrawn, mended;
	uint32_t by_parity;   /* of the repaired, from the mesh's parity; the rest from the flush */
	int split;            /* the daemon said which level (older ones do not) */
	char how[768];
};

/* Ask the store's snapsmp to verify and repair `step` of job on every rank:
 * 0, or an error code with msg saying why (none answers, or it refused). */
static int daemon_repair(const char *sock_path, const char *job, uint64_t step, struct repair_view *v, char *err,
			 size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(sock_path) >= sizeof(a.sun_path)) {
		snprintf(err, errlen, "socket path %s is too long", sock_path);
		return SNAP_EINVAL;
	}
	memcpy(a.sun_path, sock_path, strlen(sock_path) + 1);
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, job);
	snap_put_u32(&w, UINT32_MAX);
	snap_put_u64(&w, step);
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		snprintf(err, errlen, "no snapsmp answers on %s: %s (the repair is the daemon's)", sock_path,
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
		snprintf(err, errlen, "snapsmp on %s did not answer the repair (%s)", sock_path, snap_strerror(rc));
		free(p);
		return rc ? rc : SNAP_EPROTO;
	}
	if (h.status != 0) {
		/* an error reply carries its message, raw */
		snprintf(err, errlen, "%.*s", (int)(h.len < errlen ? h.len : errlen - 1), p ? (const char *)p : "");
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
	if ((v->split = snap_rbuf_left(&r) >= 4))
		v->by_parity = snap_get_u32(&r);
	free(p);
	if (r.bad) {
		snprintf(err, errlen, "malformed REPAIR reply");
		return SNAP_EPROTO;
	}
	return 0;
}

static const char verify_usage[] =
	"usage: snaptool verify STEP [--repair] [--store DIR] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
	"       snaptool verify STEP --nodes N --store PATTERN [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
	"Recompute the CRC32C of every chunk of a step on every rank in the node store, and\n"
	"of every dataset of its persisted copy if there is one. Exit 3 on a mismatch or\n"
	"when ranks are missing from the node store, 1 if neither holds the step.\n"
	"--repair: first ask the running snapsmp to repair the step: each bad chunk is\n"
	"rewritten from the next level that holds it intact (on a mesh its stripe decoded\n"
	"from parity, then the flushed copy of the same step), checked against the\n"
	"manifest's CRC32C; a rank's copy no level holds intact is withdrawn (on a mesh:\n"
	"given up, and the agreement no longer counts the step), so the step is no longer\n"
	"restorable; then verify what is left. Exit 1 if no snapsmp answers.\n"
	"--nodes N: an erasure-coded mesh, where each node store holds only its own\n"
	"ranks: verify the step in each of the N node stores (\"%n\" in PATTERN = node\n"
	"number) and the persisted copy (a --flush-dir with %n: every node's part).\n"
	"Exit 0 when every rank of the step's world is in some node store and every\n"
	"chunk is intact, 3 naming the node, rank and chunk of a mismatch or the ranks\n"
	"no node store holds. Not with --repair (each node's snapsmp repairs its own).\n"
	"On a terminal, a progress bar (bytes, rate) on stderr; none when piped.\n";

/* --repair: the daemon's repair, said in text (--json says it in the document). */
static int verify_repair(const struct opts *o, uint64_t step, struct repair_view *rv)
{
	char msg[768] = "";
	if (daemon_repair(o->cfg.client.socket, o->cfg.client.job, step, rv, msg, sizeof(msg))) {
		st_error("snaptool verify --repair: %s", msg);
		return ST_FAIL;
	}
	if (o->json)
		return ST_OK;
	/* The level each repaired chunk came from, as the daemon counted it. */
	char from[96];
	uint32_t flush = rv->repaired - (rv->by_parity < rv->repaired ? rv->by_parity : rv->repaired);
	if (!rv->split)
		snprintf(from, sizeof(from), "repaired");
	else if (rv->by_parity && flush)
		snprintf(from, sizeof(from), "repaired (%u from parity, %u from the flush)", rv->by_parity, flush);
	else
		snprintf(from, sizeof(from), "repaired%s", !rv->repaired ? "" : flush ? " from the flush" : " from parity");
	printf("repair: %u rank%s checked, %u bad chunks, %u %s, %u rank%s withdrawn%s%s\n", rv->ranks,
	       rv->ranks == 1 ? "" : "s", rv->bad, rv->repaired, from, rv->withdrawn, rv->withdrawn == 1 ? "" : "s",
	       rv->bad || rv->mended ? ": " : "", rv->bad || rv->mended ? rv->how : "");
	return ST_OK;
}

/* What verify found in the node store(s). */
struct verify_tally {
	uint32_t ranks, bad, world;
	int node;             /* --nodes: the node whose store is being read; -1 without */
	struct st_progress bar;
};

/* "node2: " before a rank's line when --nodes reads several stores. */
static const char *node_tag(const struct verify_tally *v, char *buf, size_t cap)
{
	if (v->node < 0)
		return "";
	snprintf(buf, cap, "node%d: ", v->node);
	return buf;
}

/* The chunks of one mapped slot against its manifest; how many are bad. */
static uint32_t verify_chunks(const struct opts *o, uint32_t r, const struct store_slot *sl, const uint8_t *p,
			      struct verify_tally *v)
{
	char tag[32];
	const struct snap_layout *lay = &sl->man.layout;
	uint32_t badc = 0;
	for (uint32_t t = 0; t < lay->ncrc; t++) {
		struct snap_chunk c;
		snap_layout_chunk(lay, t, &c);
		if (snap_crc32c(p + c.slot_off, sl->man.len[t]) != sl->man.crc[t]) {
			if (o->json) {
				printf("%s{\"region\":", badc ? "," : "");
				st_json_str(c.g->name);
				printf(",\"chunk\":%u}", c.index);
			} else {
				st_progress_hide(&v->bar);
				printf("%srank %u: region \"%s\" chunk %u: CRC32C mismatch\n", node_tag(v, tag, sizeof(tag)), r,
				       c.g->name, c.index);
			}
			badc++;
		}
		st_progress_add(&v->bar, sl->man.len[t]);
	}
	return badc;
}

/* Rank r's slot of the step, mapped and checked; printed as found. */
static void verify_rank(const struct opts *o, struct snap_store *s, struct store_job *j, uint32_t r,
			struct store_slot *sl, uint32_t slot, struct verify_tally *v)
{
	char err[512] = "", tag[32];
	v->world = sl->man.world > v->world ? sl->man.world : v->world;
	const struct snap_layout *lay = &sl->man.layout;
	if (o->json) {
		printf("%s{\"rank\":%u,", v->ranks ? "," : "", r);
		if (v->node >= 0)
			printf("\"node\":%d,", v->node);
		printf("\"slot\":%u,\"chunks\":%u,\"bad_chunks\":[", slot, lay->ncrc);
	}
	v->ranks++;
	st_verbose(o, "rank %u: slot %u, %u chunks, %" PRIu64 " bytes", r, slot, lay->ncrc, lay->slot_bytes);
	const uint8_t *p = NULL;
	int fd = snap_store_open_slot(s, j, j->ranks[r], slot, err, sizeof(err));
	if (fd >= 0) {
		p = lay->slot_bytes ? mmap(NULL, lay->slot_bytes, PROT_READ, MAP_SHARED, fd, 0) : NULL;
		close(fd);
		if (p == MAP_FAILED)
			snprintf(err, sizeof(err), "cannot map slot %u", slot);
	}
	if (fd < 0 || p == MAP_FAILED) {
		st_progress_hide(&v->bar);
		if (o->json) {
			printf("],\"state\":\"unreadable\",\"error\":");
			st_json_str(err);
			printf("}");
		} else {
			printf("%srank %u: %s\n", node_tag(v, tag, sizeof(tag)), r, err);
		}
		v->bad++;
		return;
	}
	uint32_t badc = verify_chunks(o, r, sl, p, v);
	if (p)
		munmap((void *)p, lay->slot_bytes);
	if (o->json) {
		printf("],\"state\":\"%s\",\"error\":null}", badc ? "corrupt" : "ok");
	} else {
		st_progress_hide(&v->bar);
		printf("%srank %u: %s (%u chunks)\n", node_tag(v, tag, sizeof(tag)), r, badc ? "CORRUPT" : "ok", lay->ncrc);
	}
	v->bad += badc > 0;
}

/* How many ranks of the step the store holds, their bytes added to *total,
 * the largest world their manifests give into *world; each held rank set in
 * held (cap entries; NULL: not asked). */
static uint32_t step_present(struct snap_store *s, struct store_job *j, uint64_t step, uint64_t *total,
			     uint32_t *world, uint8_t *held, uint32_t cap)
{
	uint32_t present = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, NULL);
		if (!sl)
			continue;
		present++;
		if (held && r < cap)
			held[r] = 1;
		if (sl->man.world > *world)
			*world = sl->man.world;
		for (uint32_t t = 0; t < sl->man.layout.ncrc; t++)
			*total += sl->man.len[t];
	}
	return present;
}

/* Every rank's slot of the step in the node store. */
static void verify_store(const struct opts *o, struct snap_store *s, struct store_job *j, uint64_t step,
			 uint32_t present, uint64_t total, struct verify_tally *v)
{
	if (present)
		st_progress_begin(&v->bar, "verify", total);
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (sl)
			verify_rank(o, s, j, r, sl, slot, v);
	}
	if (present)
		st_progress_end(&v->bar);
}

/* The persisted copy, when there is one: snap_io_verify_step's code, or
 * SNAP_ENOENT when there is none. */
static int verify_disk(const struct opts *o, uint64_t step, int on_disk, uint32_t dworld, struct snap_io_err *e)
{
	if (!on_disk) {
		if (o->json)
			printf(",\"persisted\":null");
		st_verbose(o, "no persisted copy of step %" PRIu64 "%s%s", step,
			   o->cfg.flush_dir[0] ? " in " : " (no --flush-dir)", o->cfg.flush_dir);
		return SNAP_ENOENT;
	}
	size_t dbad = 0;
	struct st_progress dbar;
	st_progress_begin(&dbar, "verify disk", st_step_disk_bytes(o->cfg.flush_dir, o->cfg.client.job, step));
	st_progress_watch_reads(&dbar);
	int disk_rc = snap_io_verify_step(o->cfg.flush_dir, o->cfg.client.job, step, &dbad, e);
	st_progress_unwatch(&dbar);
	if (!disk_rc)
		st_progress_set(&dbar, dbar.total);
	st_progress_end(&dbar);
	if (o->json) {
		printf(",\"persisted\":{\"dir\":");
		st_json_str(o->cfg.flush_dir);
		printf(",\"world\":%u,\"state\":\"%s\",\"bad_datasets\":%zu,\"error\":", dworld,
		       disk_rc ? "corrupt" : "ok", dbad);
		disk_rc ? st_json_str(e->msg) : (void)printf("null");
		printf("}");
	} else {
		printf("persisted copy in %s: %s%s\n", o->cfg.flush_dir, disk_rc ? "CORRUPT: " : "ok",
		       disk_rc ? e->msg : "");
	}
	return disk_rc;
}

static void verify_json_head(const struct opts *o, uint64_t step, const struct repair_view *rv)
{
	printf("{\"job\":");
	st_json_str(o->cfg.client.job);
	printf(",\"step\":%" PRIu64 ",", step);
	if (o->nodes) {
		printf("\"nodes\":%d,\"store\":", o->nodes);
		st_json_str(o->cfg.client.store);
		printf(",");
	}
	printf("\"repair\":");
	if (o->repair) {
		printf("{\"ranks\":%u,\"bad_chunks\":%u,\"repaired_chunks\":%u,\"withdrawn_ranks\":%u,"
		       "\"mended_files\":%u,", rv->ranks, rv->bad, rv->repaired, rv->withdrawn, rv->mended);
		/* null: an older daemon did not say which level */
		printf("\"repaired_from_parity\":");
		rv->split ? printf("%u", rv->by_parity) : printf("null");
		printf(",\"repaired_from_flush\":");
		rv->split ? printf("%u", rv->repaired - (rv->by_parity < rv->repaired ? rv->by_parity : rv->repaired))
			  : printf("null");
		printf(",\"how\":");
		st_json_str(rv->how);
		printf("}");
	} else {
		printf("null");
	}
	printf(",\"ranks\":[");
}

/* The step's ranks no node store holds, as "2,3" (text) or "2,3" inside a
 * JSON array; how many. */
static uint32_t missing_ranks(const uint8_t *held, uint32_t world, char *buf, size_t cap)
{
	uint32_t n = 0;
	size_t at = 0;
	buf[0] = 0;
	for (uint32_t r = 0; r < world; r++)
		if (!held[r]) {
			if (at < cap)
				at += (size_t)snprintf(buf + at, cap - at, "%s%u", n ? "," : "", r);
			n++;
		}
	if (at >= cap && cap > 4)
		snprintf(buf + cap - 4, 4, "...");
	return n;
}

/* Every node's store, NULL where there is none (said in text); ST_OK or ST_USAGE. */
static int nodes_open(const struct opts *o, struct snap_store **st)
{
	char root[SNAP_PATH_MAX], err[512];
	for (int n = 0; n < o->nodes; n++) {
		if (snap_mesh_expand(o->cfg.client.store, n, root, sizeof(root))) {
			st_error("snaptool verify: --store %s: node %d's path does not fit %zu bytes", o->cfg.client.store,
				 n, sizeof(root));
			while (n-- > 0)
				snap_store_close(st[n]);
			return ST_USAGE;
		}
		if (snap_store_open(&st[n], root, 64, o->cfg.mem_limit, 1, st_log, err, sizeof(err))) {
			st[n] = NULL;
			st_verbose(o, "node%d: %s", n, err);
			if (!o->json)
				printf("node%d: %s: no store (lost or not started)\n", n, root);
		}
	}
	return ST_OK;
}

/*
 * --nodes: the step in every node store of a mesh. Each node holds its own
 * ranks, so the step is whole when every rank of its world is in some
 * node's store; a step only persisted (evicted from every store) is judged
 * by the persisted copy, as without --nodes.
 */
static int verify_nodes(const struct opts *o, uint64_t step)
{
	struct snap_store **st = calloc((size_t)o->nodes, sizeof(*st));
	int rc;
	if (!st)
		return ST_FAIL;
	if ((rc = nodes_open(o, st))) {
		free(st);
		return rc;
	}
	const char *job = o->cfg.client.job;
	uint32_t present = 0, world = 0, dworld = 0, cap = 0;
	uint64_t total = 0;
	for (int n = 0; n < o->nodes; n++) {
		struct store_job *j = st[n] ? snap_store_job(st[n], job, 0) : NULL;
		present += step_present(st[n], j, step, &total, &world, NULL, 0);
		if (j && j->nranks > cap)
			cap = j->nranks;
	}
	struct snap_io_err e = { 0 };
	int on_disk = o->cfg.flush_dir[0] && snap_io_step_world(o->cfg.flush_dir, job, step, &dworld, &e) == 0;
	uint8_t *held = calloc(cap > world ? cap : world ? world : 1, 1);
	if (!held || (!present && !on_disk)) {
		if (held)
			st_error("snaptool verify: job %s has no step %" PRIu64 " in any of the %d node stores %s%s%s", job,
				 step, o->nodes, o->cfg.client.store, o->cfg.flush_dir[0] ? " nor in " : "",
				 o->cfg.flush_dir);
		for (int n = 0; n < o->nodes; n++)
			snap_store_close(st[n]);
		free(st);
		free(held);
		return ST_FAIL;
	}
	if (o->json)
		verify_json_head(o, step, NULL);
	struct verify_tally v = { 0 };
	for (int n = 0; n < o->nodes; n++) {
		struct store_job *j = st[n] ? snap_store_job(st[n], job, 0) : NULL;
		uint64_t ntotal = 0;
		uint32_t nworld = 0, np = step_present(st[n], j, step, &ntotal, &nworld, held, cap > world ? cap : world);
		if (st[n] && !np)
			st_verbose(o, "node%d: %s holds no rank of step %" PRIu64, n, st[n]->root, step);
		v.node = n;
		verify_store(o, st[n], j, step, np, ntotal, &v);
	}
	char miss[256];
	uint32_t held_ranks = 0;
	for (uint32_t r = 0; r < world; r++)
		held_ranks += held[r];
	uint32_t nmiss = present ? missing_ranks(held, world, miss, sizeof(miss)) : 0;
	if (!present)
		miss[0] = 0;
	if (o->json) {
		printf("],\"ranks_present\":%u,\"world\":", held_ranks);
		present ? printf("%u", world) : printf("null");
		printf(",\"missing_nodes\":[");
		for (int n = 0, c = 0; n < o->nodes; n++)
			if (!st[n])
				printf("%s%d", c++ ? "," : "", n);
		printf("],\"missing_ranks\":[%s]", miss);
	}
	int disk_rc = verify_disk(o, step, on_disk, dworld, &e);
	const char *result = v.bad || disk_rc > 0 || (disk_rc && disk_rc != SNAP_ENOENT) ? "corrupt"
			     : nmiss							  ? "incomplete"
											  : "ok";
	if (o->json) {
		printf(",\"result\":\"%s\"}\n", result);
		st_json_done();
	} else if (present) {
		printf("step %" PRIu64 ": %u of %u ranks present in %d node stores, %u corrupt\n", step, held_ranks, world,
		       o->nodes, v.bad);
		if (nmiss)
			printf("step %" PRIu64 ": rank%s %s in no node store\n", step, nmiss == 1 ? "" : "s", miss);
	}
	for (int n = 0; n < o->nodes; n++)
		snap_store_close(st[n]);
	free(st);
	free(held);
	return strcmp(result, "ok") ? ST_LOST : ST_OK;
}

int cmd_verify(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	uint64_t step;
	int rc = st_parse(argc, argv, &o, verify_usage, 1);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_parse_step(o.arg1, &step)))
		return rc;
	if (o.nodes && o.repair) {
		st_error("snaptool verify: --repair and --nodes exclude each other: each node's snapsmp repairs its "
			 "own store (snaptool verify --repair --store NODE_STORE on that node)");
		return ST_USAGE;
	}
	if (o.nodes)
		return verify_nodes(&o, step);
	struct repair_view rv = { 0 };
	if (o.repair && (rc = verify_repair(&o, step, &rv)))
		return rc;
	if ((rc = st_open_store(&o, &s)))
		return rc;
	struct store_job *j = snap_store_job(s, o.cfg.client.job, 0);
	uint32_t present, dworld = 0, mworld = 0;
	uint64_t total = 0;
	present = step_present(s, j, step, &total, &mworld, NULL, 0);
	struct snap_io_err e = { 0 };
	int on_disk = o.cfg.flush_dir[0] && snap_io_step_world(o.cfg.flush_dir, o.cfg.client.job, step, &dworld, &e) == 0;
	if (!present && !on_disk) {
		snap_store_close(s);
		st_error("snaptool verify: job %s has no step %" PRIu64 " in %s%s%s", o.cfg.client.job, step,
			 o.cfg.client.store, o.cfg.flush_dir[0] ? " nor in " : "", o.cfg.flush_dir);
		return ST_FAIL;
	}
	if (o.json)
		verify_json_head(&o, step, &rv);
	struct verify_tally v = { .node = -1 };
	verify_store(&o, s, j, step, present, total, &v);
	snap_store_close(s);
	if (o.json) {
		printf("],\"ranks_present\":%u,\"world\":", v.ranks);
		v.ranks ? printf("%u", v.world) : printf("null");
	}
	int disk_rc = verify_disk(&o, step, on_disk, dworld, &e);
	const char *result = v.bad || disk_rc > 0 || (disk_rc && disk_rc != SNAP_ENOENT) ? "corrupt"
			     : v.ranks && v.ranks < v.world			      ? "incomplete"
										      : "ok";
	if (o.json) {
		printf(",\"result\":\"%s\"}\n", result);
		st_json_done();
	} else if (v.ranks) {
		printf("step %" PRIu64 ": %u of %u ranks present in the node store, %u corrupt\n", step, v.ranks, v.world,
		       v.bad);
	}
	return strcmp(result, "ok") ? ST_LOST : ST_OK;
}
