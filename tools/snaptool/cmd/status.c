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
#include <unistd.h>

#include "snap/base.h"
#include "snap/damage.h"
#include "opts.h"
#include "progress.h"
#include "snap/io.h"
#include "snaptool.h"
#include "snap/status.h"
#include "snap/store.h"

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

/* The store's running snapsmp (its state, or all zero when none answers)
 * and the damage the store recorded. */
struct daemon_view {
	struct snap_status st;
	/* Damage beyond repair as the store recorded it (snap/damage.h): there
	 * with or without a daemon, across its restarts. */
	struct snap_damage dmg[SNAP_DAMAGE_KEEP];
	int ndmg;
	char last_rec[1024];
};

static const char status_usage[] =
	"usage: snaptool status [--nodes N] [--store DIR] [--flush-dir DIR] [--job NAME] [--json] [-q|-v]\n"
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
	live ? printf("%" PRIu64, d->st.mem_limit) : printf("null");
	printf(",\"daemon_mem_used\":");
	live ? printf("%" PRIu64, d->st.mem_used) : printf("null");
	printf(",\"daemon_pid\":");
	live ? printf("%u", d->st.pid) : printf("null");
	printf(",\"pinned\":");
	live ? printf("%" PRIu64, d->st.pinned) : printf("null");
	printf(",\"pinned_by\":");
	live ? printf("%u", d->st.pinners) : printf("null");
	printf(",\"daemon_reserving\":");
	live ? printf("%u", d->st.reserving) : printf("null");
	/* Self-healing (docs/self-healing.md): null when no daemon (or an older one) answers. */
	const char *heal[] = { "repaired_chunks", "damaged_steps", "scrubbed_bytes", "scrub_passes", "scrub_rate" };
	const uint64_t hv[] = { d->st.repaired_chunks, d->st.damaged_steps, d->st.scrubbed_bytes, d->st.scrub_passes,
				d->st.scrub_rate };
	for (int i = 0; i < 5; i++)
		d->st.has_heal ? printf(",\"%s\":%" PRIu64, heal[i], hv[i]) : printf(",\"%s\":null", heal[i]);
	printf(",\"damaged_files\":");
	d->st.has_files ? printf("%" PRIu64, d->st.damaged_files) : printf("null");
	/* The reason outlives the daemon: the store's record when none answers. */
	printf(",\"last_damage\":");
	if (d->st.has_heal && strcmp(d->st.last_damage, "none"))
		st_json_str(d->st.last_damage);
	else if (!d->st.has_heal && d->ndmg)
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
	       "%.1f MiB (--mem-limit)\n", s->root, s->mem_used / 1048576.0, d->st.mem_used / 1048576.0, d->st.pid,
	       d->st.mem_limit / 1048576.0);
	/* What trainers pin is the slots themselves, registered with CUDA
	 * (plus a table of frame lengths each): inside the budget above. */
	printf("pinned for GPU copies by %u connected process%s: %.1f MiB (their slots, registered with CUDA)\n",
	       d->st.pinners, d->st.pinners == 1 ? "" : "es", d->st.pinned / 1048576.0);
	/* The scrub's running counts are --json's: this text stays the same from call to call. */
	if (d->st.has_heal) {
		printf("self-healing: %" PRIu64 " chunks repaired, %" PRIu64 " steps damaged beyond repair",
		       d->st.repaired_chunks, d->st.damaged_steps);
		if (d->st.has_files)
			printf(", %" PRIu64 " captured files damaged", d->st.damaged_files);
		printf("; scrub ");
		d->st.scrub_rate ? printf("at %.1f MiB/s (--scrub-rate)\n", d->st.scrub_rate / 1048576.0)
			      : printf("off (--scrub-rate 0)\n");
		if (strcmp(d->st.last_damage, "none"))
			printf("last damage beyond repair: %s\n", d->st.last_damage);
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
	int live = snap_status_ask(o.cfg.client.socket, 2000, &d.st) == 0;
	if ((d.ndmg = snap_damage_load(s->root, d.dmg, SNAP_DAMAGE_KEEP)) > 0)
		snap_damage_line(&d.dmg[d.ndmg - 1], d.last_rec, sizeof(d.last_rec));
	else
		d.ndmg = 0;
	if (live)
		st_verbose(&o, "snapsmp pid %u answers on %s: %.1f of %.1f MiB used, %u slots per rank", d.st.pid,
			   o.cfg.client.socket, d.st.mem_used / 1048576.0, d.st.mem_limit / 1048576.0, d.st.slots);
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
