/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snaptool status: the steps of every job in a node store, the running
 * snapsmp's budget and self-healing counters (asked over its socket), and
 * what the flush directory holds. Opens the store read-only, without the
 * daemon, so it works while snapsmp runs, after it died, and on a store
 * nobody serves. With --nodes, main() runs the mesh view (mesh_status.c).
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
#include "snap/damage.h"
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
	int has_files;            /* damaged_files came (newer daemons) */
	uint64_t damaged_files;
	/* Damage beyond repair as the store recorded it (snap/damage.h): there
	 * with or without a daemon, across its restarts. */
	struct snap_damage dmg[SNAP_DAMAGE_KEEP];
	int ndmg;
	char last_rec[1024];
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
		if ((v->has_files = snap_rbuf_left(&r) != 0))
			v->damaged_files = snap_get_u64(&r);
	}
	free(p);
	return r.bad ? -1 : 0;
}

static const char status_usage[] =
	"usage: snaptool status [--store DIR] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
	"Steps of every job (or one) in a node store (restorable = committed by every\n"
	"rank, partial = some ranks), memory used against the running snapsmp's budget\n"
	"(--mem-limit, asked over its socket; \"unknown\" when none answers), and the\n"
	"steps persisted in the flush directory, and the last damage beyond repair with why\n"
	"(the store's record: shown with or without a running snapsmp). Exit 1 if the\n"
	"store cannot be read.\n"
	"With --nodes N and a --store holding %n (snapsmp --ec): the mesh view of N node\n"
	"stores: per step, which nodes hold data and parity, whether each group is\n"
	"protected, the storage overhead M/K, and per level (node stores, parity, disk\n"
	"with --flush-dir) the step it holds and the one a relaunch restores; and each\n"
	"node's last damage beyond repair (its store's record; --json: every record).\n";

/* The store and the daemon, as the document's first keys (up to "jobs":[). */
static void status_json_head(const struct snap_store *s, const struct daemon_view *d, int live)
{
	printf("{\"store\":");
	st_json_str(s->root);
	printf(",\"mem_used\":%" PRIu64 ",\"mem_limit\":", s->mem_used);
	live ? printf("%" PRIu64, d->limit) : printf("null");
	printf(",\"daemon_mem_used\":");
	live ? printf("%" PRIu64, d->used) : printf("null");
	printf(",\"daemon_pid\":");
	live ? printf("%u", d->pid) : printf("null");
	printf(",\"pinned\":");
	live ? printf("%" PRIu64, d->pinned) : printf("null");
	printf(",\"pinned_by\":");
	live ? printf("%u", d->pinners) : printf("null");
	printf(",\"daemon_reserving\":");
	live ? printf("%u", d->reserving) : printf("null");
	/* Self-healing (docs/self-healing.md): null when no daemon (or an older one) answers. */
	const char *heal[] = { "repaired_chunks", "damaged_steps", "scrubbed_bytes", "scrub_passes", "scrub_rate" };
	const uint64_t hv[] = { d->repaired_chunks, d->damaged_steps, d->scrubbed_bytes, d->scrub_passes, d->scrub_rate };
	for (int i = 0; i < 5; i++)
		d->heal ? printf(",\"%s\":%" PRIu64, heal[i], hv[i]) : printf(",\"%s\":null", heal[i]);
	printf(",\"damaged_files\":");
	d->has_files ? printf("%" PRIu64, d->damaged_files) : printf("null");
	/* The reason outlives the daemon: the store's record when none answers. */
	printf(",\"last_damage\":");
	if (d->heal && strcmp(d->last_damage, "none"))
		st_json_str(d->last_damage);
	else if (!d->heal && d->ndmg)
		st_json_str(d->last_rec);
	else
		printf("null");
	printf(",\"damage\":[");
	for (int i = 0; i < d->ndmg; i++) {
		printf("%s{\"time\":%" PRIu64 ",\"job\":", i ? "," : "", d->dmg[i].time_s);
		st_json_str(d->dmg[i].job);
		printf(",\"what\":");
		st_json_str(d->dmg[i].what);
		printf(",\"why\":");
		st_json_str(d->dmg[i].why);
		printf("}");
	}
	printf("],\"jobs\":[");
}

static void status_text_head(const struct opts *o, const struct snap_store *s, const struct daemon_view *d, int live)
{
	if (!live) {
		printf("store %s: %.1f MiB in slot files; no snapsmp answers on %s, so its budget is unknown\n", s->root,
		       s->mem_used / 1048576.0, o->cfg.client.socket);
		if (d->ndmg)
			printf("last damage beyond repair (recorded in the store): %s\n", d->last_rec);
		return;
	}
	printf("store %s: %.1f MiB in slot files, %.1f MiB counted by snapsmp (pid %u) against its budget of "
	       "%.1f MiB (--mem-limit)\n", s->root, s->mem_used / 1048576.0, d->used / 1048576.0, d->pid,
	       d->limit / 1048576.0);
	/* What trainers pin is the slots themselves, registered with CUDA
	 * (plus a table of frame lengths each): inside the budget above. */
	printf("pinned for GPU copies by %u connected process%s: %.1f MiB (their slots, registered with CUDA)\n",
	       d->pinners, d->pinners == 1 ? "" : "es", d->pinned / 1048576.0);
	/* The scrub's running counts are --json's: this text stays the same from call to call. */
	if (d->heal) {
		printf("self-healing: %" PRIu64 " chunks repaired, %" PRIu64 " steps damaged beyond repair",
		       d->repaired_chunks, d->damaged_steps);
		if (d->has_files)
			printf(", %" PRIu64 " captured files damaged", d->damaged_files);
		printf("; scrub ");
		d->scrub_rate ? printf("at %.1f MiB/s (--scrub-rate)\n", d->scrub_rate / 1048576.0)
			      : printf("off (--scrub-rate 0)\n");
		if (strcmp(d->last_damage, "none"))
			printf("last damage beyond repair: %s\n", d->last_damage);
	} else if (d->ndmg) {
		printf("last damage beyond repair (recorded in the store): %s\n", d->last_rec);
	}
}

/* The job's steps persisted in the flush directory. */
static void status_persisted(const struct opts *o, const struct store_job *j)
{
	uint64_t disk[64];
	struct snap_io_err e = { 0 };
	int nd = o->cfg.flush_dir[0] ? snap_io_list_steps(o->cfg.flush_dir, j->name, disk, 64, &e) : 0;
	if (nd < 0)
		st_verbose(o, "job %s: flush directory %s unreadable: %s", j->name, o->cfg.flush_dir, e.msg);
	if (o->json) {
		printf("],\"persisted\":[");
		for (int i = 0; i < nd && i < 64; i++)
			printf("%s%" PRIu64, i ? "," : "", disk[i]);
		printf("]}");
	} else if (o->cfg.flush_dir[0]) {
		printf("  persisted in %s:", o->cfg.flush_dir);
		if (nd < 0)
			printf(" unreadable: %s", e.msg);
		else if (nd == 0)
			printf(" none");
		for (int i = 0; i < nd && i < 64; i++)
			printf(" %" PRIu64, disk[i]);
		printf("\n");
	}
}

/* One job: its newest restorable step, each step's ranks, what is persisted. */
static void status_job(const struct opts *o, struct snap_store *s, struct store_job *j, int first)
{
	uint64_t steps[256], latest = 0;
	size_t n = job_steps(s, j, steps, 256);
	int have = snap_store_latest(s, j, &latest) == 0;
	if (o->json) {
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
	for (size_t i = 0; i < n; i++) {
		uint64_t bytes;
		uint32_t world, k = step_ranks(s, j, steps[i], &bytes, &world);
		const char *state = k == world ? "restorable" : "partial";
		if (o->json)
			printf("%s{\"step\":%" PRIu64 ",\"ranks\":%u,\"world\":%u,\"state\":\"%s\",\"bytes\":%" PRIu64 "}",
			       i ? "," : "", steps[i], k, world, state, bytes);
		else
			printf("  %-10" PRIu64 " %u/%-6u %-12s %" PRIu64 "\n", steps[i], k, world, state, bytes);
	}
	status_persisted(o, j);
}

int cmd_status(int argc, char **argv)
{
	struct opts o;
	struct snap_store *s;
	int rc = st_parse(argc, argv, &o, status_usage, 0);
	if (rc)
		return rc < 0 ? 0 : rc;
	if ((rc = st_open_store(&o, &s)))
		return rc;
	/* The budget is the running daemon's (--mem-limit), not our default. */
	static struct daemon_view d;
	int live = daemon_budget(o.cfg.client.socket, &d) == 0;
	if ((d.ndmg = snap_damage_load(s->root, d.dmg, SNAP_DAMAGE_KEEP)) > 0)
		snap_damage_line(&d.dmg[d.ndmg - 1], d.last_rec, sizeof(d.last_rec));
	else
		d.ndmg = 0;
	if (live)
		st_verbose(&o, "snapsmp pid %u answers on %s: %.1f of %.1f MiB used, %u slots per rank", d.pid,
			   o.cfg.client.socket, d.used / 1048576.0, d.limit / 1048576.0, d.slots);
	else
		st_verbose(&o, "no snapsmp answers on %s", o.cfg.client.socket);
	if (o.json)
		status_json_head(s, &d, live);
	else
		status_text_head(&o, s, &d, live);
	int first = 1;
	for (struct store_job *j = s->jobs; j; j = j->next)
		if (!o.job_set || !strcmp(j->name, o.cfg.client.job)) {
			status_job(&o, s, j, first);
			first = 0;
		}
	if (o.json) {
		printf("]}\n");
		st_json_done();
	}
	snap_store_close(s);
	return ST_OK;
}
