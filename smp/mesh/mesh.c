/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The mesh of node daemons: configuration, MPI start/stop, and the mesh
 * thread's agreement rounds (see mesh.h for the threading contract).
 *
 * Agreement round (every period_ms, all nodes, in lock step):
 *   1. under the store lock, summarize this node's committed steps: per job,
 *      per (step, world) the number of ranks this node holds it for;
 *   2. MPI_Iallgather(v) of the summaries plus a stop flag, completed with
 *      MPI_Test and short sleeps (Open MPI's blocking waits spin a core,
 *      which trainers on an oversubscribed node would feel);
 *   3. every node computes the same view: a step is globally complete when
 *      the counts over all nodes add up to its world size. "Which ranks does
 *      a node host" is thus answered by its store (ranks with a committed
 *      manifest there), and a rank is assumed to live on one node only;
 *   4. under the lock, publish the newest globally complete step as the
 *      store's restorable step for that job (store.h: mesh_latest);
 *   5. if that step is newer than the job's protected step, every node
 *      calls mesh_protect for it (same decision everywhere: same data).
 */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "mesh/mesh_int.h"
#include "snap/io.h"
#include "snap/smp_config.h"

int snap_mesh_parse_ec(const char *s, int *k, int *m, char *err, size_t errlen)
{
	char *end;
	long a = strtol(s, &end, 10), b;
	if (end == s || *end != '+' || (b = strtol(end + 1, &end, 10), *end) || a < 1 || b < 1 ||
	    a + b > SNAP_EC_MAX_GROUP) {
		snap_fmt(err, errlen, "--ec/SNAP_EC \"%s\": expected K+M with K >= 1, M >= 1 and K+M <= %d (e.g. 4+2)",
			 s, SNAP_EC_MAX_GROUP);
		return SNAP_EINVAL;
	}
	*k = (int)a;
	*m = (int)b;
	return 0;
}

int snap_mesh_init(struct snap_mesh **out, int *argc, char ***argv, int k, int m, char *err, size_t errlen)
{
	*out = NULL;
	int provided = 0;
	if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
		snap_fmt(err, errlen, "MPI_Init_thread failed");
		return SNAP_EIO;
	}
	struct snap_mesh *mesh = calloc(1, sizeof(*mesh));
	if (!mesh) {
		MPI_Finalize();
		return SNAP_ENOMEM;
	}
	*out = mesh;
	mesh->world = MPI_COMM_NULL;
	mesh->group = MPI_COMM_NULL;
	mesh->k = k;
	mesh->m = m;
	mesh->period_ms = 20;
	mesh->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	pthread_mutex_init(&mesh->mu, NULL);
	if (mesh->efd < 0) {
		snap_fmt(err, errlen, "eventfd: %s", strerror(errno));
		return SNAP_EIO;
	}
	if (provided < MPI_THREAD_SERIALIZED) {
		snap_fmt(err, errlen, "this MPI provides thread level %d; the mesh needs MPI_THREAD_SERIALIZED", provided);
		return SNAP_EUNSUPPORTED;
	}
	MPI_Comm_dup(MPI_COMM_WORLD, &mesh->world);
	MPI_Comm_rank(mesh->world, &mesh->rank);
	mesh->log.node = mesh->rank;
	MPI_Comm_size(mesh->world, &mesh->size);
	char why[512] = "";
	int rc = snap_ec_comm_split(mesh->world, k, m, 0, &mesh->grp, &mesh->group, why, sizeof(why));
	if (rc) {
		snap_fmt(err, errlen, "cannot form erasure-coding groups of %d+%d over %d nodes: %s", k, m, mesh->size,
			 why);
		return rc;
	}
	return 0;
}

int snap_mesh_set_flush(struct snap_mesh *mesh, struct snap_flusher *flusher, const struct snap_smp_config *cfg,
			char *err, size_t errlen)
{
	mesh->flusher = flusher;
	snprintf(mesh->flush_dir, sizeof(mesh->flush_dir), "%s", cfg->flush_dir);
	mesh->node_flush_dir[0] = 0;
	if (strstr(cfg->flush_dir, "%n")) {
		const char *at = strstr(cfg->flush_dir, "%n");
		if (strstr(at + 2, "%n")) {
			snap_fmt(err, errlen, "--flush-dir %s: name the node once (%%n)", cfg->flush_dir);
			return SNAP_EINVAL;
		}
		if (snap_mesh_expand(cfg->flush_dir, mesh->rank, mesh->node_flush_dir, sizeof(mesh->node_flush_dir))) {
			snap_fmt(err, errlen, "--flush-dir %s: too long after %%n", cfg->flush_dir);
			return SNAP_EINVAL;
		}
	}
	mesh->flush_every = cfg->flush_every;
	mesh->flush_keep = cfg->flush_keep;
	return 0;
}

int snap_mesh_fd(const struct snap_mesh *mesh)
{
	return mesh ? mesh->efd : -1;
}

int snap_mesh_rank(const struct snap_mesh *mesh)
{
	return mesh->rank;
}

int snap_mesh_size(const struct snap_mesh *mesh)
{
	return mesh->size;
}

void snap_mesh_lock(struct snap_mesh *mesh)
{
	if (mesh)
		pthread_mutex_lock(&mesh->mu);
}

void snap_mesh_unlock(struct snap_mesh *mesh)
{
	if (mesh)
		pthread_mutex_unlock(&mesh->mu);
}

int snap_mesh_job_error(struct snap_mesh *mesh, const char *job, char *err, size_t errlen)
{
	for (struct mjob *j = mesh ? mesh->jobs : NULL; j; j = j->next)
		if (strcmp(j->name, job) == 0 && j->lost) {
			snap_fmt(err, errlen, "%s", j->lost_msg);
			return SNAP_ELOST;
		}
	return 0;
}

int snap_mesh_view_fresh(struct snap_mesh *mesh, const char *job, uint64_t *ticket)
{
	struct mjob *j = mesh_job_find(mesh, job);
	if (j && j->seeded) {
		*ticket = 0;
		return 1;
	}
	if (*ticket == 0) {
		*ticket = mesh->rounds_started + 1;
		return 0;
	}
	if (mesh->rounds_done < *ticket)
		return 0;
	*ticket = 0;
	return 1;
}

int snap_mesh_step_complete(struct snap_mesh *mesh, const char *job, uint64_t step)
{
	for (struct mjob *j = mesh->jobs; j; j = j->next)
		if (strcmp(j->name, job) == 0)
			for (unsigned i = 0; i < j->ncomplete; i++)
				if (j->complete[i] == step)
					return 1;
	return 0;
}

int snap_mesh_job_protected(struct snap_mesh *mesh, const char *job, uint64_t *step)
{
	struct mjob *j = mesh ? mesh_job_find(mesh, job) : NULL;
	if (!j || !j->has_prot)
		return 0;
	*step = j->prot;
	return 1;
}

/* ---- agreement round ---------------------------------------------------- */

struct sent {
	uint64_t step;
	uint32_t world, count;
	uint32_t old;      /* of count: slots no connected process of the current generation wrote */
	uint32_t old_gen;  /* of old: slots an older generation than the current one wrote */
};

struct jsum {
	char name[SNAP_JOB_MAX + 1];
	uint32_t n;
	uint32_t news;     /* store_job.news: this node's new incarnation rewound the job ... */
	uint64_t news_base;/* ... to this step (news 1) or to nothing (news 2) */
	uint64_t launch;   /* launch_id of this node's current generation of the job */
	/* the mesh flush (meshflush.c): this node's part of fl_step ... */
	uint64_t fl_step;
	uint32_t fl_state; /* ... 0 none or writing, 1 written (fl_ranks files), 2 failed */
	uint32_t fl_ranks;
	uint32_t fl_world;
	uint32_t has_persisted;
	uint64_t persisted;/* newest step this node knows persisted */
	uint64_t seal_step;/* node 0: its seal of seal_step ... */
	uint32_t seal_state;/* ... 1 sealed, 2 failed */
	uint32_t cap_dirty;/* captured files changed here since the last generation (meshcap.c) */
	uint32_t heal;     /* a repair from parity of step heal_step is asked for here (meshheal.c) */
	uint64_t heal_step;
};

/* The agreement cannot tolerate a node that skips a collective or folds
 * different data: any local failure in a round stops the whole mesh. */
_Noreturn static void round_fatal(struct snap_mesh *mesh, const char *what)
{
	mesh_warn(mesh, "agreement round: %s; aborting the mesh (a node that left the round or computed a "
		  "different view would hang or split it)", what);
	snap_mesh_abort(mesh, 1);
}

static void put(struct snap_mesh *mesh, uint8_t **p, size_t *len, size_t *cap, const void *src, size_t n)
{
	if (*len + n > *cap) {
		size_t c = (*len + n) * 2 + 256;
		uint8_t *q = realloc(*p, c);
		if (!q)
			round_fatal(mesh, "out of memory for this node's summary");
		*p = q;
		*cap = c;
	}
	memcpy(*p + *len, src, n);
	*len += n;
}

/* A launch (store_job.launch) as 64 bits for the summaries (FNV-1a); 0 for
 * none. Two launches that collide would only keep a dead one's steps
 * counted as they were before any launch was known. */
static uint64_t launch_id(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;
	if (!s[0])
		return 0;
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
	return h ? h : 1;
}

/* [lock held] This node's committed steps: per job a jsum then n sents. */
static uint8_t *summarize(struct snap_mesh *mesh, size_t *len)
{
	uint8_t *p = NULL;
	size_t cap = 0;
	*len = 0;
	struct snap_store *s = mesh->store;
	for (struct store_job *j = s->jobs; j; j = j->next) {
		struct sent e[64];
		uint32_t n = 0;
		for (uint32_t r = 0; r < j->nranks; r++) {
			struct store_rank *rk = j->ranks[r];
			for (uint32_t i = 0; rk && i < s->nslots; i++) {
				const struct store_slot *sl = &rk->slots[i];
				if (sl->state != SLOT_COMMITTED || sl->superseded)
					continue;
				/* a copy given up counts for nothing (meshheal.c) */
				if (mesh_heal_given_up(mesh_job_find(mesh, j->name), rk->rank, sl->step, sl->man.gen))
					continue;
				uint32_t x = 0;
				while (x < n && (e[x].step != sl->step || e[x].world != sl->man.world))
					x++;
				if (x == n) {
					if (n == 64)
						continue;
					e[n++] = (struct sent){ sl->step, sl->man.world, 0, 0, 0 };
				}
				e[x].count++;
				e[x].old += !snap_store_slot_current(j, rk, sl);
				e[x].old_gen += sl->man.gen != j->gen;
			}
		}
		struct jsum h = { .n = n, .news = (uint32_t)j->news, .news_base = j->news_base,
				  .launch = launch_id(j->launch) };
		struct mjob *mj = mesh_job_find(mesh, j->name);
		if (j->mfl_busy || j->mfl_state) {
			h.fl_step = j->mfl_step;
			h.fl_state = j->mfl_busy ? (uint32_t)j->mfl_state : 0;
			h.fl_ranks = j->mfl_ranks;
			h.fl_world = j->mfl_world;
		}
		h.has_persisted = (uint32_t)j->has_persisted;
		h.persisted = j->persisted;
		if (mj && mj->seal_state) {
			h.seal_step = mj->seal_step;
			h.seal_state = (uint32_t)mj->seal_state;
		}
		/* A failed generation is not retried until the files change again. */
		uint64_t v = j->files_ver;
		h.cap_dirty = v && (!mj || (v != mj->cap_done && v != mj->cap_failed));
		if (mj && mj->heal_req) {
			h.heal = 1;
			h.heal_step = mj->heal_req_step;
			mj->heal_req = 0;
		}
		j->news = 0;   /* delivered by this round (a failed round stops the mesh) */
		snprintf(h.name, sizeof(h.name), "%s", j->name);
		put(mesh, &p, len, &cap, &h, sizeof(h));
		put(mesh, &p, len, &cap, e, n * sizeof(*e));
	}
	return p;
}

/* Complete a nonblocking collective without spinning a core. */
static void wait_req(struct snap_mesh *mesh, MPI_Request *req)
{
	int done = 0;
	struct timespec ts = { 0, 200000 };
	for (;;) {
		if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS)
			round_fatal(mesh, "MPI_Test failed");
		if (done)
			return;
		nanosleep(&ts, NULL);
	}
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x > y ? -1 : x < y;
}

/* One node's report on the job's flush (meshflush.c reads the sums). */
static void fold_flush(struct mjob *j, int node, const struct jsum *h)
{
	j->f_nodes++;
	if (j->fl_busy && h->fl_step == j->fl_step && h->fl_state) {
		j->f_done++;
		if (h->fl_state == 1)
			j->f_ok += h->fl_ranks;
		else if (j->f_fail_node < 0)
			j->f_fail_node = node;
	}
	if (j->fl_busy && h->fl_step == j->fl_step && h->fl_world > j->f_world)
		j->f_world = h->fl_world;
	if (h->has_persisted && (!j->f_has_persisted || h->persisted > j->f_persisted)) {
		j->f_has_persisted = 1;
		j->f_persisted = h->persisted;
	}
	if (node == 0 && j->fl_busy == 2 && h->seal_state && h->seal_step == j->fl_step)
		j->f_seal = (int)h->seal_state;
}

/* Fold every node's summary into the per-job globally complete steps. */
static void compute_view(struct snap_mesh *mesh, const uint8_t *all, const int *counts, const int *displs)
{
	struct agg {
		struct mjob *job;
		struct sent e;
	} *a = NULL;
	size_t na = 0, cap = 0;
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		j->news = 0;
		j->news_launch = 0;
		j->f_nodes = j->f_done = j->f_ok = j->f_world = 0;
		j->f_fail_node = -1;
		j->f_seal = j->f_has_persisted = 0;
		j->cap_want = 0;
		j->heal_now = 0;
	}
	/* Two passes: which launch rewound (news) decides what the second
	 * pass counts as a dead incarnation's slots on each node. */
	for (int pass = 0; pass < 2; pass++)
		for (int node = 0; node < mesh->size; node++) {
			const uint8_t *p = all + displs[node], *end = p + counts[node];
			while (p + sizeof(struct jsum) <= end) {
				struct jsum h;
				memcpy(&h, p, sizeof(h));
				p += sizeof(h);
				h.name[SNAP_JOB_MAX] = 0;
				struct mjob *j = mesh_job(mesh, h.name);
				if (!j)
					round_fatal(mesh, "out of memory for a job entry");
				if (pass == 0) {
					fold_flush(j, node, &h);
					j->cap_want |= h.cap_dirty != 0;
					/* prot is agreed: every node decides alike */
					j->heal_now |= h.heal && j->has_prot && h.heal_step == j->prot;
					/* two launches rewinding in one round: neither is trusted */
					if (h.news)
						j->news_launch = !j->news || j->news_launch == h.launch ? h.launch : 0;
					if (h.news == 2 ||
					    (h.news == 1 && j->news != 2 && (j->news == 0 || h.news_base < j->news_base))) {
						j->news = (int)h.news;
						j->news_base = h.news_base;
					}
					size_t skip = (size_t)h.n * sizeof(struct sent);
					p = skip < (size_t)(end - p) ? p + skip : end;
					continue;
				}
				/* A node whose current generation is the launch that rewound:
				 * its exited ranks' steps are that launch's, not a dead one's. */
				int same = j->news && j->news_launch && h.launch == j->news_launch;
				for (uint32_t i = 0; i < h.n && p + sizeof(struct sent) <= end; i++, p += sizeof(struct sent)) {
					struct sent e;
					memcpy(&e, p, sizeof(e));
					size_t x = 0;
					while (x < na && (a[x].job != j || a[x].e.step != e.step || a[x].e.world != e.world))
						x++;
					if (x == na) {
						if (na == cap) {
							cap = cap ? cap * 2 : 64;
							void *q = realloc(a, cap * sizeof(*a));
							if (!q)
								round_fatal(mesh, "out of memory folding the summaries");
							a = q;
						}
						a[na++] = (struct agg){ j, { e.step, e.world, 0, 0, 0 } };
					}
					a[x].e.count += e.count;
					a[x].e.old += same ? e.old_gen : e.old;
				}
			}
		}
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		uint64_t steps[256];
		unsigned n = 0;
		/*
		 * A new incarnation of the job rewound to news_base on some node:
		 * slots past it that no live process of the current generation
		 * wrote are a dead timeline's, wherever they are (a node none of
		 * whose ranks has reconnected yet cannot know). They count for
		 * nothing, already in this round, and each node drops its own.
		 */
		for (size_t x = 0; x < na && n < 256; x++) {
			if (a[x].job != j)
				continue;
			uint32_t c = a[x].e.count;
			if (j->news == 2 || (j->news == 1 && a[x].e.step > j->news_base))
				c -= a[x].e.old;
			if (c == a[x].e.world)
				steps[n++] = a[x].e.step;
		}
		qsort(steps, n, sizeof(steps[0]), cmp_desc);
		j->ncomplete = n < MESH_MAX_COMPLETE ? n : MESH_MAX_COMPLETE;
		memcpy(j->complete, steps, j->ncomplete * sizeof(steps[0]));
		struct store_job *sj = snap_store_job(mesh->store, j->name, 1);
		if (j->news && j->lost) {
			/* Its trainers restored from disk (or started afresh): a new
			 * timeline the mesh protects again. */
			j->lost = 0;
			mesh_say(mesh, "job %s: a new incarnation restarted it from %s; protecting it again", j->name,
				 j->news == 1 ? "a persisted step" : "nothing");
		}
		if (sj && j->news) {
			int same = j->news_launch && j->news_launch == launch_id(sj->launch);
			unsigned dropped = snap_store_supersede(mesh->store, sj, j->news == 1, j->news_base, same);
			if (dropped)
				mesh_say(mesh, "job %s: a new incarnation rewound it to %s%" PRIu64 "; %u slot(s) here of "
					 "a dead one's later steps dropped", j->name, j->news == 1 ? "step " : "nothing, ",
					 j->news == 1 ? j->news_base : 0, dropped);
		}
		if (sj && j->ncomplete && !j->lost && (!sj->mesh_has_latest || j->complete[0] > sj->mesh_latest))
			mesh_say(mesh, "job %s step %" PRIu64 " restorable: every rank committed it", j->name, j->complete[0]);
		if (sj) {
			sj->mesh_has_latest = j->ncomplete > 0 && !j->lost;
			sj->mesh_latest = j->ncomplete ? j->complete[0] : 0;
		}
	}
	free(a);
}

/* One round. Returns 1 when the mesh agreed to stop. protect: 0 in round 0. */
static int round_(struct snap_mesh *mesh, int protect)
{
	size_t len;
	pthread_mutex_lock(&mesh->mu);
	uint8_t *mine = summarize(mesh, &len);
	uint64_t number = ++mesh->rounds_started;
	/* A wanted flush stays "taken" (persist_busy) until decided below. */
	int want = mesh->store->mesh_flush_wanted;
	mesh->store->mesh_flush_wanted = 0;
	mesh->store->mesh_flush_taken |= want;
	pthread_mutex_unlock(&mesh->mu);
	int hdr[3] = { (int)len, atomic_load(&mesh->stop_req), want };
	int *hdrs = malloc(sizeof(int) * 3 * (size_t)mesh->size);
	int *counts = malloc(sizeof(int) * (size_t)mesh->size), *displs = malloc(sizeof(int) * (size_t)mesh->size);
	int stop = 0;
	if (!hdrs || !counts || !displs)
		round_fatal(mesh, "out of memory for the gathered headers");
	MPI_Request req;
	if (MPI_Iallgather(hdr, 3, MPI_INT, hdrs, 3, MPI_INT, mesh->world, &req) != MPI_SUCCESS)
		round_fatal(mesh, "MPI_Iallgather failed");
	wait_req(mesh, &req);
	size_t total = 0;
	int wanted = 0;
	for (int i = 0; i < mesh->size; i++) {
		counts[i] = hdrs[3 * i];
		displs[i] = (int)total;
		total += (size_t)hdrs[3 * i];
		stop = stop > hdrs[3 * i + 1] ? stop : hdrs[3 * i + 1];
		wanted |= hdrs[3 * i + 2];
	}
	uint8_t *all = malloc(total ? total : 1);
	if (!all)
		round_fatal(mesh, "out of memory for the gathered summaries");
	if (MPI_Iallgatherv(mine, (int)len, MPI_BYTE, all, counts, displs, MPI_BYTE, mesh->world, &req) != MPI_SUCCESS)
		round_fatal(mesh, "MPI_Iallgatherv failed");
	wait_req(mesh, &req);
	pthread_mutex_lock(&mesh->mu);
	compute_view(mesh, all, counts, displs);
	mesh->rounds_done = number;
	/* A round after the relaunch's rebuild: its view is the real one. */
	for (struct mjob *j = mesh->jobs; j; j = j->next)
		j->seeded = 0;
	pthread_mutex_unlock(&mesh->mu);
	free(all);
	free(hdrs);
	free(counts);
	free(displs);
	free(mine);
	if (!protect)
		return stop;
	/* Logged after the munmap: a reader of the log (fault.mesh) then finds
	 * the mappings gone from /proc. */
	unsigned dropped = snap_slotmaps_sweep(&mesh->maps) + mesh_parity_sweep(mesh);
	if (dropped)
		mesh_say(mesh, "dropped %u mapping(s) of store files deleted or replaced under the mesh", dropped);
	/* Repairs first: a protect below moves the parity on to a newer step. */
	if (!stop)
		mesh_heal_round(mesh, number);
	mesh_warm_round(mesh);
	for (struct mjob *j = mesh->jobs; j && !stop; j = j->next) {
		if (j->lost || !j->ncomplete)
			continue;
		uint64_t g = j->complete[0];
		if ((j->has_prot && g <= j->prot) || (j->has_failed && j->failed == g))
			continue;
		mesh_protect(mesh, j, g);
	}
	for (struct mjob *j = mesh->jobs; j && !stop; j = j->next)
		if (j->cap_want)
			mesh_cap_protect(mesh, j);
	/* A stop (1) waits for a flush under way or wanted, e.g. the one a
	 * SIGTERM asked for; a stop now (2: a second signal) does not. */
	int flushing = mesh_flush_round(mesh, wanted);
	return stop == 2 || (stop && !flushing);
}

static void *mesh_main(void *arg)
{
	struct snap_mesh *mesh = arg;
	struct timespec ts = { 0, (long)mesh->period_ms * 1000000L };
	if (mesh->rebuild_pending) {
		mesh_rebuild_behind(mesh);
		round_(mesh, 0);
	}
	/* Tests and operators wait on it: every byte is back on every node. */
	mesh_say(mesh, "recovery done; agreement rounds running");
	while (!round_(mesh, 1))
		nanosleep(&ts, NULL);
	pthread_mutex_lock(&mesh->mu);
	mesh->store->mesh_stopped = 1;   /* nothing is agreed any more: drains end */
	pthread_mutex_unlock(&mesh->mu);
	if (mesh->efd >= 0) {
		uint64_t one = 1;
		ssize_t n = write(mesh->efd, &one, sizeof(one));
		(void)n;
	}
	/* A peer stopped: end our poll loop too (it is waiting on a signalfd). */
	if (!atomic_load(&mesh->stop_req))
		kill(getpid(), SIGTERM);
	return NULL;
}

int snap_mesh_start(struct snap_mesh *mesh, struct snap_store **store, unsigned slots, uint64_t mem_limit,
		    int quiet, char *err, size_t errlen)
{
	mesh->log.quiet = quiet;
	mesh->store = *store;
	char root[SNAP_PATH_MAX];
	snprintf(root, sizeof(root), "%s", (*store)->root);
	char gline[256];
	snap_ec_describe(&mesh->grp, gline, sizeof(gline));
	mesh_say(mesh, "mesh of %d nodes, %s", mesh->size, gline);
	/*
	 * Collectives in the same order on every node: the plan (records
	 * gathered, a step per job), a round over the stores as they are (the
	 * view seeded with the planned steps), the captured files (before
	 * files/fileopen.c opens them), the rebuild, the first round. A node
	 * that has to rebuild its own copy does it all here before it serves
	 * (its store is reopened); the others serve at once and their mesh
	 * thread runs the rebuild and the first round before its loop.
	 */
	int here = mesh_recover_plan(mesh), planned = 0;
	for (struct mjob *j = mesh->jobs; j; j = j->next)
		planned |= j->rl_plan;
	pthread_mutex_lock(&mesh->mu);
	(*store)->mesh = 1;
	pthread_mutex_unlock(&mesh->mu);
	if (planned) {
		round_(mesh, 0);
		pthread_mutex_lock(&mesh->mu);
		mesh_seed_view(mesh);
		pthread_mutex_unlock(&mesh->mu);
	}
	mesh_cap_recover(mesh);
	if (here) {
		uint64_t t0 = snap_now_ns();
		mesh_recover_run(mesh);
		/* Rescan so the rebuilt manifests become committed slots. */
		snap_store_close(*store);
		*store = NULL;
		int rc = snap_store_open(store, root, slots, mem_limit, 0, quiet ? NULL : snap_smp_log, err, errlen);
		if (rc)
			return rc;
		mesh->store = *store;
		(*store)->mesh = 1;
		mesh_say(mesh, "relaunch rebuild done here (%.1f ms, before serving: this node's copy was lost or "
			 "incomplete)", (double)(snap_now_ns() - t0) / 1e6);
	}
	mesh->rebuild_pending = planned && !here;
	pthread_mutex_lock(&mesh->mu);
	mesh_after_recovery(mesh, *store, mesh->rebuild_pending);
	pthread_mutex_unlock(&mesh->mu);
	if (!mesh->rebuild_pending)
		round_(mesh, 0);
	if (pthread_create(&mesh->thr, NULL, mesh_main, mesh) != 0) {
		snap_fmt(err, errlen, "cannot start the mesh thread: %s", strerror(errno));
		return SNAP_EIO;
	}
	mesh->thr_started = 1;
	return 0;
}

void snap_mesh_stop(struct snap_mesh *mesh, int now)
{
	if (!mesh || !mesh->thr_started)
		return;
	atomic_store(&mesh->stop_req, now ? 2 : 1);
	pthread_join(mesh->thr, NULL);
	mesh->thr_started = 0;
}

void snap_mesh_finalize(struct snap_mesh *mesh)
{
	if (!mesh)
		return;
	snap_mesh_stop(mesh, 1);
	if (mesh->efd >= 0)
		close(mesh->efd);
	mesh_warm_free(mesh);
	snap_slotmaps_free(&mesh->maps);
	while (mesh->jobs) {
		struct mjob *j = mesh->jobs;
		mesh->jobs = j->next;
		if (j->par_map)
			munmap(j->par_map, j->par_len);
		if (j->spare_map)
			munmap(j->spare_map, j->spare_len);
		free(j->pins);
		free(j->rl_seen);
		free(j);
	}
	if (mesh->group != MPI_COMM_NULL)
		MPI_Comm_free(&mesh->group);
	if (mesh->world != MPI_COMM_NULL)
		MPI_Comm_free(&mesh->world);
	pthread_mutex_destroy(&mesh->mu);
	free(mesh);
	MPI_Finalize();
}
