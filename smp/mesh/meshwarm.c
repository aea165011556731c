/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * meshwarm.c - a job's files made ready before its first protects need them.
 *
 * A protect reads each slot through a mapping the mesh thread keeps
 * (store/slotmap.c) and writes its parity into the spare the previous protect
 * left (protect.c). So the first SLOTS protects after a start or relaunch
 * mapped their slot files themselves, and the first two created, cleared
 * and mapped a parity file each: on the development VM (shadow paging:
 * every first touch of a page through a new mapping traps to the
 * hypervisor, even after MAP_POPULATE) those protects took 2-3x a steady
 * one. Here a worker thread of the mesh (at nice 10, as the slot
 * reservations) does that work as soon as the files can be known:
 *
 *  - slot files: once REGISTER's reservation of a slot file is done, the
 *    worker maps it read-only and reads a byte of every page; the mesh
 *    thread keeps the mapping as the slot's (snap_slotmap_adopt), so the first
 *    protect of that slot finds it mapped and faulted in. No budget: the
 *    mapping adds no memory to the file's.
 *  - parity: while a job has fewer than two parity files here (the
 *    protected step's and the spare: the steady state, which the budget
 *    already has to allow), the worker creates ec/warm-<i>.parity at the
 *    length the first protect will want, clears and maps it and writes a
 *    byte of every page. The length is m x ceil(node data / k), node data
 *    being this node's registered ranks' slot bytes and manifests: exact
 *    when every node of the group holds as much as this one (the first
 *    protect takes a pool file of another length only when it is longer,
 *    cut to size). Each file is charged to the budget before it is created;
 *    where the budget cannot take it, nothing is created and the log says so
 *    once per job (the first protects then create their own, as before).
 *  - after a relaunch: the kept step's parity and the spare are on disk but
 *    unmapped; the worker maps and touches them for the mesh thread to take.
 *    After a relaunch nothing is queued until the relaunch's restores on
 *    this node ended (relaunch_restoring).
 *
 * Files never outlive the job: the warm parity files live in <job>/ec and
 * go with it (a protect's prune keeps them as it keeps the spare; a
 * relaunch without a kept step removes them), and every round drops a pool
 * mapping whose file is gone, as store/slotmap.c does for slots.
 *
 * This file is the plan (mesh thread): which files, at what length, within
 * the budget, and taking what the worker (warmworker.c) made ready.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mesh/mesh_int.h"
#include "mesh/meshwarm.h"
#include "base/metrics.h"
#include "snap/store.h"

struct wpool {
	void *map;
	uint64_t len;
	dev_t dev;
	ino_t ino;
	char path[SNAP_FILE_MAX];
};

/* One job as the warm-up sees it (mesh thread). */
struct wjob {
	char name[SNAP_JOB_MAX + 1];
	struct wpool pool[MESH_WARM_MAX];
	unsigned npool;
	int no_budget;            /* said once: the budget has no room for the pool */
	uint64_t want;            /* the parity length the pool is made for */
	unsigned slots_done;      /* slot files faulted in since the last log line */
	unsigned slots_total;     /* ... since this daemon started */
	int said_ready;           /* "ready ahead" logged */
	struct wjob *next;
};

static struct mesh_warm *warm_get(struct snap_mesh *mesh)
{
	if (!mesh->warm)
		mesh->warm = mesh_warm_start();
	return mesh->warm;
}

static void uncount(struct snap_mesh *mesh, uint64_t n)
{
	pthread_mutex_lock(&mesh->mu);
	mesh->store->mem_used -= n < mesh->store->mem_used ? n : mesh->store->mem_used;
	pthread_mutex_unlock(&mesh->mu);
}

/* A parity file being made ahead starts (+1) or ends (-1, its bytes
 * uncounted when it was not kept) in one step under the store lock, so a
 * STATUS between them (snaptool status, the budget checks of the tests)
 * sees the bytes as "reserving" (snap_store_reserving), never as a file
 * that should be there. */
static void ahead(struct snap_mesh *mesh, int d, uint64_t drop)
{
	pthread_mutex_lock(&mesh->mu);
	struct snap_store *s = mesh->store;
	s->ahead = d < 0 && !s->ahead ? 0 : s->ahead + (unsigned)d;
	s->mem_used -= drop < s->mem_used ? drop : s->mem_used;
	pthread_mutex_unlock(&mesh->mu);
}

static struct wjob *wjob_get(struct snap_mesh *mesh, struct mesh_warm *w, const char *name)
{
	for (struct wjob *j = w->jobs; j; j = j->next)
		if (!strcmp(j->name, name))
			return j;
	struct wjob *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->next = w->jobs;
	w->jobs = j;
	/* Pool files an earlier daemon left (a relaunch that kept a step keeps
	 * them, counted at start): this one's pool starts empty. */
	char dir[SNAP_FILE_MAX];
	if (mesh_ec_path(mesh->store->root, name, 0, NULL, dir, sizeof(dir)) == 0) {
		for (unsigned i = 0; i < MESH_WARM_MAX; i++) {
			char p[SNAP_FILE_MAX + 32], f[32];
			struct stat st;
			snprintf(f, sizeof(f), MESH_WARM_PARITY, i);
			snprintf(p, sizeof(p), "%s/%s", dir, f);
			if (lstat(p, &st) == 0 && S_ISREG(st.st_mode) && unlink(p) == 0)
				uncount(mesh, (uint64_t)st.st_size);
		}
	}
	return j;
}

static void pool_drop(struct snap_mesh *mesh, struct wjob *j, unsigned i, int remove)
{
	struct wpool *p = &j->pool[i];
	munmap(p->map, p->len);
	if (remove)
		unlink(p->path);
	uncount(mesh, p->len);
	j->pool[i] = j->pool[--j->npool];
}

/* Parity files of job j here: the protected step's, the spare (mapped or on
 * disk), the pool and the pool files under way. */
static unsigned parity_files(struct snap_mesh *mesh, struct mesh_warm *w, const struct wjob *wj)
{
	struct mjob *j = mesh_job_find(mesh, wj->name);
	char spare[SNAP_FILE_MAX + 32], dir[SNAP_FILE_MAX];
	struct stat st;
	unsigned n = wj->npool;
	if (j && j->has_prot)
		n++;
	mesh_ec_path(mesh->store->root, wj->name, 0, NULL, dir, sizeof(dir));
	snprintf(spare, sizeof(spare), "%s/%s", dir, MESH_SPARE_PARITY);
	if ((j && j->spare_map) || stat(spare, &st) == 0)
		n++;
	return n + mesh_warm_queued(w, wj->name, W_PARITY);
}

/* Whether r's path still names the file the worker mapped, at its length: a
 * protect may have renamed another file there since (the spare it took,
 * the protected step's parity that became the spare). */
static int same_file(const struct wreq *r)
{
	struct stat st;
	return stat(r->path, &st) == 0 && st.st_dev == r->dev && st.st_ino == r->ino && (uint64_t)st.st_size == r->len;
}

/* Take the worker's finished requests. */
static void adopt(struct snap_mesh *mesh, struct mesh_warm *w)
{
	for (;;) {
		struct wreq *r = mesh_warm_done(w);
		if (!r)
			return;
		struct wjob *wj = wjob_get(mesh, w, r->job);
		struct mjob *j = mesh_job_find(mesh, r->job);
		int used = 0;
		if (r->kind == W_SLOT && !r->err_no) {
			used = snap_slotmap_adopt(&mesh->maps, r->path, r->dev, r->ino, r->len, r->addr) == 0;
			if (used && wj) {
				wj->slots_done++;
				wj->slots_total++;
				smp_metrics_count(SMP_CNT_SLOTS_PREFAULTED, r->job);
			}
		} else if (r->kind == W_PARITY) {
			/* A protect may have made the pool unnecessary meanwhile. */
			if (!r->err_no && wj && wj->npool < MESH_WARM_MAX && r->len == wj->want &&
			    parity_files(mesh, w, wj) < MESH_WARM_MAX) {
				struct wpool *p = &wj->pool[wj->npool++];
				*p = (struct wpool){ r->addr, r->len, r->dev, r->ino, "" };
				snprintf(p->path, sizeof(p->path), "%s", r->path);
				used = 1;
				smp_metrics_count(SMP_CNT_PARITY_PRECREATED, r->job);
				mesh_say(mesh, "job %s: parity file %s (%" PRIu64 " bytes) created and faulted in ahead of "
					 "the first protects", r->job, r->path, r->len);
			} else {
				if (!r->err_no)
					unlink(r->path);
				else
					mesh_say(mesh, "job %s: could not create parity file %s ahead of the first protects: %s",
						 r->job, r->path, strerror(r->err_no));
			}
			ahead(mesh, -1, used ? 0 : r->len);
		} else if (r->kind == W_PROT && !r->err_no && j && j->has_prot && j->prot == r->step && !j->par_map &&
			   same_file(r)) {
			j->par_map = r->addr;
			j->par_len = r->len;
			used = 1;
		} else if (r->kind == W_SPARE && !r->err_no && j && !j->spare_map && same_file(r)) {
			j->spare_map = r->addr;
			j->spare_len = r->len;
			used = 1;
		}
		if (!used && !r->err_no && r->addr)
			munmap(r->addr, r->len);
		free(r);
	}
}

/* Pool files whose file is gone or replaced (the job's directory removed by
 * hand): their pages would outlive it. */
static unsigned sweep(struct snap_mesh *mesh, struct mesh_warm *w)
{
	unsigned n = 0;
	for (struct wjob *j = w->jobs; j; j = j->next) {
		for (unsigned i = 0; i < j->npool;) {
			struct stat st;
			const struct wpool *p = &j->pool[i];
			if (stat(p->path, &st) != 0 || st.st_dev != p->dev || st.st_ino != p->ino ||
			    (uint64_t)st.st_size != p->len) {
				pool_drop(mesh, j, i, 0);
				n++;
			} else {
				i++;
			}
		}
	}
	return n;
}

/* At least the encoded length of a manifest of layout l (what a protect
 * adds to the node's data per rank): the header and job name, per region
 * its name and fields with 8 dimensions, per chunk a CRC and a length. The
 * pool file is then a little longer than the protect wants, and cut to
 * size when taken (mesh_warm_take_parity). */
static uint64_t manifest_bound(const struct snap_layout *l)
{
	return 128 + SNAP_JOB_MAX + (uint64_t)l->nregions * (2 + 255 + 5 + 8 * 4 + 8 * 24) + 8ull * l->ncrc;
}

struct cand {
	char path[SNAP_FILE_MAX];
	uint64_t len;
	int job;   /* index into the round's job names */
};

/* [lock held] This node's reserved slot files of registered ranks, and per
 * job the data a protect of them would encode here. */
static unsigned scan(struct snap_mesh *mesh, struct cand **out, char (**names)[SNAP_JOB_MAX + 1], uint64_t **data,
		     unsigned **unready, unsigned *njobs)
{
	struct snap_store *s = mesh->store;
	unsigned n = 0, cap = 0, nj = 0;
	/* Reservations the store's thread finished since the poll thread last
	 * looked (it looks only when a request comes). */
	snap_store_reap(s);
	*out = NULL;
	*names = NULL;
	*data = NULL;
	for (struct store_job *j = s->jobs; j; j = j->next)
		nj++;
	*unready = NULL;
	if (!nj || !(*names = calloc(nj, sizeof(**names))) || !(*data = calloc(nj, sizeof(**data))) ||
	    !(*unready = calloc(nj, sizeof(**unready))))
		return *njobs = 0;
	unsigned ji = 0;
	for (struct store_job *j = s->jobs; j; j = j->next, ji++) {
		snprintf((*names)[ji], sizeof((*names)[ji]), "%s", j->name);
		/* A job whose directory was removed (by hand: the daemon never
		 * removes one) gets nothing made again, nor its directory back. */
		char dir[SNAP_FILE_MAX];
		struct stat st;
		int n0 = snprintf(dir, sizeof(dir), "%s/%s", s->root, j->name);
		if (n0 < 0 || (size_t)n0 >= sizeof(dir) || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		for (uint32_t k = 0; k < j->nranks; k++) {
			const struct store_rank *r = j->ranks[k];
			if (!r || !r->has_layout || !r->layout.slot_bytes)
				continue;
			(*data)[ji] += r->layout.slot_bytes + manifest_bound(&r->layout);
			for (uint32_t i = 0; i < s->nslots; i++) {
				const struct store_slot *sl = &r->slots[i];
				if (sl->resv || sl->size < r->layout.slot_bytes) {
					(*unready)[ji]++;   /* not reserved yet */
					continue;
				}
				if (n == cap) {
					cap = cap ? 2 * cap : 16;
					struct cand *v = realloc(*out, cap * sizeof(**out));
					if (!v)
						return *njobs = nj, n;
					*out = v;
				}
				(*out)[n].len = sl->state == SLOT_COMMITTED ? sl->man.layout.slot_bytes : r->layout.slot_bytes;
				(*out)[n].job = (int)ji;
				snap_store_path(s, j->name, r->rank, i, 0, (*out)[n].path, sizeof((*out)[n].path));
				n++;
			}
		}
	}
	*njobs = nj;
	return n;
}

/* Pool files for job wj up to two parity files in all, of want bytes each. */
static void fill_pool(struct snap_mesh *mesh, struct mesh_warm *w, struct wjob *wj, uint64_t want)
{
	struct mjob *j = mesh_job_find(mesh, wj->name);
	/* Only for a job's first protects: from then on the protected step's
	 * parity and the spare take turns, and a relaunch that kept a step
	 * finds both (map_kept faults them in). */
	if (j && (j->lost || j->has_prot))
		return;
	if (want != wj->want) {
		/* Another rank registered here since: the pool's length is wrong. */
		while (wj->npool)
			pool_drop(mesh, wj, wj->npool - 1, 1);
		wj->want = want;
	}
	unsigned have = parity_files(mesh, w, wj);
	for (unsigned idx = 0; have < MESH_WARM_MAX && idx < MESH_WARM_MAX; idx++) {
		char dir[SNAP_FILE_MAX], f[32], path[SNAP_FILE_MAX + 32], why[256];
		snprintf(f, sizeof(f), MESH_WARM_PARITY, idx);
		if (mesh_ec_path(mesh->store->root, wj->name, 0, NULL, dir, sizeof(dir)))
			return;
		snprintf(path, sizeof(path), "%s/%s", dir, f);
		int taken = 0;
		for (unsigned i = 0; i < wj->npool; i++)
			taken |= !strcmp(wj->pool[i].path, path);
		if (taken || mesh_warm_pending(w, path))
			continue;
		if (mesh_mkdirs(mesh->store->root, wj->name, -1))
			return;
		ahead(mesh, 1, 0);
		if (mesh_charge_parity(mesh, want, why, sizeof(why)) != 0) {
			ahead(mesh, -1, 0);
			if (!wj->no_budget)
				mesh_say(mesh, "job %s: no parity file created ahead of the first protects (%" PRIu64
					 " bytes each): %s; the first protects create their own", wj->name, want, why);
			wj->no_budget = 1;
			return;
		}
		if (mesh_warm_queue(w, W_PARITY, wj->name, path, want, 0, idx) != 0) {
			ahead(mesh, -1, want);
			return;
		}
		have++;
	}
}

/* After a relaunch: the kept step's parity and the spare, on disk, unmapped. */
static void map_kept(struct snap_mesh *mesh, struct mesh_warm *w)
{
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		char p[SNAP_FILE_MAX + 32], dir[SNAP_FILE_MAX];
		struct stat st;
		if (j->lost)
			continue;
		if (j->has_prot && !j->par_map &&
		    mesh_ec_path(mesh->store->root, j->name, j->prot, "parity", p, sizeof(p)) == 0 && stat(p, &st) == 0 &&
		    st.st_size > 0 && !mesh_warm_pending(w, p))
			mesh_warm_queue(w, W_PROT, j->name, p, 0, j->prot, 0);
		if (!j->spare_map && mesh_ec_path(mesh->store->root, j->name, 0, NULL, dir, sizeof(dir)) == 0) {
			snprintf(p, sizeof(p), "%s/%s", dir, MESH_SPARE_PARITY);
			if (stat(p, &st) == 0 && st.st_size > 0 && !mesh_warm_pending(w, p))
				mesh_warm_queue(w, W_SPARE, j->name, p, 0, 0, 0);
		}
	}
}

/* A request for path (kind, or any kind when path is given) finished: done
 * here when the worker has not started it, waited for when it has. Then
 * every finished request is taken (adopt). */
static void settle(struct snap_mesh *mesh, struct mesh_warm *w, const char *path, const char *job, int kind)
{
	mesh_warm_wait(w, path, job, kind);
	adopt(mesh, w);
}

void mesh_warm_settle_slot(struct snap_mesh *mesh, const char *path)
{
	if (mesh->warm)
		settle(mesh, mesh->warm, path, NULL, 0);
}

/* After a relaunch the warm-up waits until the relaunch's restores here
 * ended: every rank whose slot of the relaunch's step this node holds has
 * restored, or committed a step since (snap_mesh_rank_active). Its page
 * faults and writes would share the node's memory bandwidth and cores with
 * those restores; the first protect needs all ranks' commits anyway. A job
 * whose trainers do not come back holds it MESH_WARM_HOLD_S at most (the
 * rounds' first call starts the clock), so other jobs still get theirs. */
#define MESH_WARM_HOLD_S 10
static int relaunch_restoring(struct snap_mesh *mesh)
{
	if (mesh->rl_said)
		return 0;
	pthread_mutex_lock(&mesh->mu);
	unsigned left = mesh->rl_left;
	pthread_mutex_unlock(&mesh->mu);
	uint64_t now = snap_now_ns();
	if (!mesh->rl_t0)
		mesh->rl_t0 = now;
	if (left && now - mesh->rl_t0 < (uint64_t)MESH_WARM_HOLD_S * 1000000000ull)
		return 1;
	mesh->rl_said = 1;
	if (left)
		mesh_say(mesh, "relaunch restores: %u rank(s) here neither restored nor committed in %d s; warm-up of "
			 "the next protect starts", left, MESH_WARM_HOLD_S);
	else
		mesh_say(mesh, "relaunch restores ended here (%.1f ms after the rounds began); warm-up of the next "
			 "protect starts", (double)(now - mesh->rl_t0) / 1e6);
	return 0;
}

void mesh_warm_round(struct snap_mesh *mesh)
{
	if (relaunch_restoring(mesh))
		return;
	struct mesh_warm *w = warm_get(mesh);
	if (!w)
		return;   /* no thread: the protects do it all, as before */
	adopt(mesh, w);
	unsigned dropped = sweep(mesh, w);
	if (dropped)
		mesh_say(mesh, "dropped %u parity file(s) made ahead whose files were deleted or replaced", dropped);
	for (struct wjob *j = w->jobs; j; j = j->next) {
		if (j->slots_done)
			mesh_say(mesh, "job %s: %u slot file(s) mapped and faulted in ahead of their first protect", j->name,
				 j->slots_done);
		j->slots_done = 0;
	}
	struct cand *c;
	char(*names)[SNAP_JOB_MAX + 1];
	uint64_t *data;
	unsigned nj, *unready;
	pthread_mutex_lock(&mesh->mu);
	unsigned n = scan(mesh, &c, &names, &data, &unready, &nj);
	pthread_mutex_unlock(&mesh->mu);
	for (unsigned i = 0; i < n; i++) {
		if (snap_slotmap_has(&mesh->maps, c[i].path, c[i].len))
			continue;
		unready[c[i].job]++;
		if (!mesh_warm_pending(w, c[i].path))
			mesh_warm_queue(w, W_SLOT, names[c[i].job], c[i].path, c[i].len, 0, 0);
	}
	for (unsigned i = 0; i < nj; i++) {
		struct wjob *wj = data[i] ? wjob_get(mesh, w, names[i]) : NULL;
		if (!wj)
			continue;
		fill_pool(mesh, w, wj, (uint64_t)mesh->grp.m * snap_ec_seg_len(mesh->grp.k, data[i]));
		unsigned files = parity_files(mesh, w, wj);
		/* Said once, when nothing is left to do for the job's first
		 * protects here: what a job's first step has to cover. */
		struct mjob *mj = mesh_job_find(mesh, wj->name);
		int first = !(mj && mj->has_prot), left = mesh_warm_pending_job(w, wj->name);
		if (!wj->said_ready && !unready[i] && !left && (!first || wj->no_budget || files >= MESH_WARM_MAX)) {
			wj->said_ready = 1;
			mesh_say(mesh, "job %s: ready ahead of its first protects: %u slot file(s) faulted in, %u parity "
				 "file(s) in place%s", wj->name, wj->slots_total, files,
				 wj->no_budget ? " (none made: budget)" : "");
		}
	}
	map_kept(mesh, w);
	free(c);
	free(names);
	free(data);
	free(unready);
}

int mesh_warm_take_parity(struct snap_mesh *mesh, const char *job, uint64_t plen, const char *to, void **map,
			  uint64_t *len)
{
	struct mesh_warm *w = mesh->warm;
	struct wjob *wj = NULL;
	if (w)
		settle(mesh, w, NULL, job, W_PARITY);   /* a pool file under way: wait for it, not make another */
	for (struct wjob *j = w ? w->jobs : NULL; j; j = j->next)
		if (!strcmp(j->name, job))
			wj = j;
	for (unsigned i = 0; wj && i < wj->npool;) {
		struct wpool *p = &wj->pool[i];
		if (p->len < plen) {
			/* Made for this node's data, and another node of the group
			 * holds more: it can never serve. Its bytes go back before the
			 * protect charges its own file, so the budget sees no third
			 * parity file. */
			pool_drop(mesh, wj, i, 1);
			continue;
		}
		if (rename(p->path, to) != 0) {
			pool_drop(mesh, wj, i, 1);
			return -1;
		}
		/* Longer than wanted (the manifests' bound, or this node holds
		 * less than another of the group): cut to size, keeping the
		 * pages in front. */
		uint64_t keep = (plen + MESH_WARM_PAGE - 1) / MESH_WARM_PAGE * MESH_WARM_PAGE;
		if (p->len > plen && truncate(to, (off_t)plen) != 0) {
			pool_drop(mesh, wj, i, 0);
			unlink(to);
			return -1;
		}
		if (keep < p->len)
			munmap((char *)p->map + keep, p->len - keep);
		*map = p->map;
		*len = p->len > plen ? plen : p->len;
		uncount(mesh, p->len);   /* the caller charges plen as this step's parity */
		wj->pool[i] = wj->pool[--wj->npool];
		return 0;
	}
	return -1;
}

void mesh_warm_free(struct snap_mesh *mesh)
{
	struct mesh_warm *w = mesh->warm;
	if (!w)
		return;
	mesh_warm_stop(w);
	while (w->jobs) {
		struct wjob *j = w->jobs;
		w->jobs = j->next;
		for (unsigned i = 0; i < j->npool; i++)
			munmap(j->pool[i].map, j->pool[i].len);
		free(j);
	}
	mesh_warm_destroy(w);
	mesh->warm = NULL;
}
