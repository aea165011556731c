/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Protect one globally complete step: erasure-code this node's slots of it
 * across its group (ec/ two-phase encode), publish parity + record, agree
 * over the whole mesh that every group has its parity in place, then make
 * it the job's protected step. Runs on the mesh thread; the store lock is
 * taken only to pin/unpin slots and account memory, never during the encode.
 *
 * Retention: the protected step's slots stay pinned (refs) until a newer
 * step is protected, so the newest protected step survives any amount of
 * newer commits; the step being encoded is pinned too. With 2 slots per
 * rank a trainer therefore waits for each protection before it can save
 * the step after next; 3 slots let it run one step ahead (see docs).
 * Memory: parity bytes are added to store->mem_used while they exist; an
 * encode that would exceed mem_limit fails on every node (collective), the
 * previous protected step stays protected.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mesh/mesh_int.h"
#include "base/metrics.h"

struct enc_src {
	struct mesh_slot_ent *ent;
	uint32_t n;
	void **man;       /* manifest copies */
	struct mesh_pin *pins;
	unsigned warm, cold;  /* slots first read through a mapping made ahead / mapped by this protect */
};

/* [lock held] Pin this node's committed slots of step g, copy their manifests. */
static int collect(struct snap_mesh *mesh, const char *job, uint64_t g, struct enc_src *src)
{
	struct snap_store *s = mesh->store;
	struct store_job *j = snap_store_job(s, job, 0);
	uint32_t cap = 0;
	for (uint32_t r = 0; j && r < j->nranks; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], g, &slot);
		if (!sl)
			continue;
		if (src->n == cap) {
			cap = cap ? cap * 2 : 8;
			void *a = realloc(src->ent, cap * sizeof(*src->ent)), *b = a ? realloc(src->man, cap * sizeof(void *)) : NULL;
			if (a)
				src->ent = a;
			if (b)
				src->man = b;
			void *c = b ? realloc(src->pins, cap * sizeof(*src->pins)) : NULL;
			if (c)
				src->pins = c;
			if (!c)
				return SNAP_ENOMEM;
		}
		void *mb = malloc(sl->man_len ? sl->man_len : 1);
		if (!mb)
			return SNAP_ENOMEM;
		memcpy(mb, sl->man_bytes, sl->man_len);
		sl->refs++;
		src->pins[src->n] = (struct mesh_pin){ r, slot };
		src->man[src->n] = mb;
		src->ent[src->n] = (struct mesh_slot_ent){ .rank = r, .slot = slot, .man_len = sl->man_len,
							   .slot_bytes = sl->man.layout.slot_bytes };
		src->n++;
	}
	return 0;
}

/* [lock held] */
static void unpin(struct snap_mesh *mesh, const char *job, const struct mesh_pin *p, uint32_t n)
{
	struct store_job *j = snap_store_job(mesh->store, job, 0);
	for (uint32_t i = 0; j && i < n; i++) {
		struct store_rank *r = p[i].rank < j->nranks ? j->ranks[p[i].rank] : NULL;
		if (r)
			snap_store_unref(mesh->store, j, r, p[i].slot);
	}
}

void mesh_pin_protected(struct snap_mesh *mesh, struct mjob *j, uint64_t g)
{
	struct enc_src src = { 0 };
	collect(mesh, j->name, g, &src);
	for (uint32_t i = 0; i < src.n; i++)
		free(src.man[i]);
	free(src.man);
	free(src.ent);
	j->pins = src.pins;
	j->npins = src.n;
}

/* Fill iov with (manifest, slot) pairs, the slots read through the mesh's
 * kept mappings (store/slotmap.c). A slot or parity file read or written whole is
 * mapped MAP_POPULATE: faulting pages one by one took 23% of the daemons'
 * time during protect on the VM (perf). */
static int map_sources(struct snap_mesh *mesh, const char *job, struct enc_src *src, struct iovec *iov, char *err,
		       size_t errlen)
{
	for (uint32_t i = 0; i < src->n; i++) {
		const struct mesh_slot_ent *e = &src->ent[i];
		char path[SNAP_FILE_MAX];
		snap_store_path(mesh->store, job, e->rank, e->slot, 0, path, sizeof(path));
		iov[2 * i] = (struct iovec){ src->man[i], e->man_len };
		iov[2 * i + 1] = (struct iovec){ NULL, 0 };
		if (!e->slot_bytes)
			continue;
		mesh_warm_settle_slot(mesh, path);
		const void *p = snap_slotmap_get(&mesh->maps, path, e->slot_bytes, err, errlen);
		if (!p)
			return SNAP_EIO;
		int how = snap_slotmap_last(&mesh->maps);
		if (how != SNAP_SLOTMAP_KEPT)
			smp_metrics_count(how == SNAP_SLOTMAP_WARM ? SMP_CNT_SLOT_MAPS_WARM : SMP_CNT_SLOT_MAPS_COLD, job);
		src->warm += how == SNAP_SLOTMAP_WARM;
		src->cold += how == SNAP_SLOTMAP_COLD;
		iov[2 * i + 1] = (struct iovec){ (void *)p, e->slot_bytes };
	}
	return 0;
}

/* A parity file of plen bytes, mapped read-write, at path.tmp. */
static void *create_parity(const char *tmp, uint64_t plen, char *err, size_t errlen)
{
	int fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		snap_fmt(err, errlen, "cannot create parity file %s: %s", tmp, strerror(errno));
		return NULL;
	}
	void *p = NULL;
	if (ftruncate(fd, (off_t)plen) != 0 || (plen && (errno = posix_fallocate(fd, 0, (off_t)plen)) != 0))
		snap_fmt(err, errlen, "cannot reserve %" PRIu64 " bytes for parity file %s: %s", plen, tmp, strerror(errno));
	else if (plen && (p = mmap(NULL, plen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)) == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map parity file %s: %s", tmp, strerror(errno));
		p = NULL;
	}
	close(fd);
	return p;
}

/* Remove every ec file of job but step keep's parity + record and the
 * spare (older steps and leftovers of killed encodes) and give their bytes
 * back. */
static void drop_other_steps(struct snap_mesh *mesh, const char *job, uint64_t keep)
{
	uint64_t freed = 0;
	mesh_ec_prune(mesh->store->root, job, 1, keep, 3, &freed);   /* the spare and the pool (meshwarm.c) stay */
	pthread_mutex_lock(&mesh->mu);
	mesh->store->mem_used -= freed < mesh->store->mem_used ? freed : mesh->store->mem_used;
	pthread_mutex_unlock(&mesh->mu);
}

/* One protect of step g: what the phases below hand each other. local: this
 * node's first failure (0: none so far), err its message. */
struct protect_run {
	struct enc_src src;
	struct iovec *iov;
	struct snap_ec_encode *enc;
	void *parity, *blob;
	size_t blen;
	uint64_t plen, data_len;
	int local, accounted;
	uint64_t t0, t_map, t_enc;    /* start, slots mapped, exchange done */
	uint64_t cpu0;                /* this thread's CPU time at t0 */
	char err[MESH_ERRLEN];
	const char *ppath, *rpath, *ptmp;  /* parity, record, parity being written */
	const char *parity_how;       /* where the parity file came from: "spare", "made ahead", "new" */
};

static void spare_path(struct snap_mesh *mesh, const char *job, char *out, size_t cap)
{
	char dir[SNAP_FILE_MAX];
	mesh_ec_path(mesh->store->root, job, 0, NULL, dir, sizeof(dir));
	int n = snprintf(out, cap, "%s/%s", dir, MESH_SPARE_PARITY);
	if (n < 0 || (size_t)n >= cap)
		out[0] = '\0';   /* cannot happen: the ec directory's name fits */
}

/* A spare on disk that nothing maps (a relaunch kept it, recover.c, or the
 * step it became the spare of was rebuilt, not protected, here): map it,
 * populated, as the one a protect leaves. Its bytes are in the budget. */
static void adopt_spare(struct mjob *j, const char *spare)
{
	int fd = open(spare, O_RDWR | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
		void *m = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (m != MAP_FAILED) {
			j->spare_map = m;
			j->spare_len = (uint64_t)st.st_size;
		}
	}
	close(fd);
}

/* This protect's parity file at p->ptmp, mapped read-write, its plen bytes
 * charged to the budget: the spare when it has the right length (its pages
 * and mapping are reused: nothing to clear or fault), else a new file. */
static int take_parity(struct snap_mesh *mesh, struct mjob *j, struct protect_run *p)
{
	char spare[SNAP_FILE_MAX];
	spare_path(mesh, j->name, spare, sizeof(spare));
	if (!j->spare_map)
		adopt_spare(j, spare);
	void *m = j->spare_map;
	uint64_t have = j->spare_len;
	j->spare_map = NULL;
	j->spare_len = 0;
	if (!m && mesh_warm_take_parity(mesh, j->name, p->plen, p->ptmp, &m, &have) == 0) {
		/* made ahead (meshwarm.c): renamed, cut to plen and uncounted there */
		p->parity_how = "made ahead";
		p->accounted = !(p->local = mesh_charge_parity(mesh, p->plen, p->err, sizeof(p->err)));
		if (!p->local) {
			p->parity = m;
		} else {
			munmap(m, have);
			unlink(p->ptmp);
		}
		return p->local;
	}
	p->parity_how = m ? "spare" : "new";
	if (m) {
		/* Its bytes were counted as the spare's; the charge below
		 * counts them (or a new file) as this parity's. */
		pthread_mutex_lock(&mesh->mu);
		mesh->store->mem_used -= have < mesh->store->mem_used ? have : mesh->store->mem_used;
		pthread_mutex_unlock(&mesh->mu);
		if (have != p->plen || rename(spare, p->ptmp) != 0) {
			munmap(m, have);
			unlink(spare);
			m = NULL;
			p->parity_how = "new";
		}
	}
	p->accounted = !(p->local = mesh_charge_parity(mesh, p->plen, p->err, sizeof(p->err)));
	if (!p->local && m)
		p->parity = m;
	else if (!p->local && !(p->parity = create_parity(p->ptmp, p->plen, p->err, sizeof(p->err))))
		p->local = SNAP_EIO;
	if (m && !p->parity) {
		munmap(m, have);
		unlink(p->ptmp);
	}
	return p->local;
}

/* Local: pin and map this node's slots of step g, build the slot list. */
static void protect_prepare(struct snap_mesh *mesh, struct mjob *j, uint64_t g, struct protect_run *p)
{
	pthread_mutex_lock(&mesh->mu);
	p->local = collect(mesh, j->name, g, &p->src);
	pthread_mutex_unlock(&mesh->mu);
	if (p->local)
		snap_fmt(p->err, sizeof(p->err), "out of memory collecting step %" PRIu64, g);
	p->blen = mesh_blob_size(p->src.n);
	if (!p->local && p->blen > SNAP_EC_APP_MAX) {
		snap_fmt(p->err, sizeof(p->err), "%u ranks on one node do not fit the %u-byte slot list", p->src.n,
			 SNAP_EC_APP_MAX);
		p->local = SNAP_EINVAL;
	}
	if (!p->local && (!(p->blob = malloc(p->blen)) || !(p->iov = calloc(2 * (size_t)p->src.n + 1, sizeof(*p->iov))))) {
		snap_fmt(p->err, sizeof(p->err), "out of memory for the slot list of step %" PRIu64, g);
		p->local = SNAP_ENOMEM;
	}
	if (!p->local) {
		mesh_blob_pack(p->src.ent, p->src.n, p->blob);
		p->local = map_sources(mesh, j->name, &p->src, p->iov, p->err, sizeof(p->err));
	}
	for (uint32_t i = 0; i < p->src.n; i++)
		p->data_len += p->src.ent[i].man_len + p->src.ent[i].slot_bytes;
	if (!p->local && mesh_mkdirs(mesh->store->root, j->name, -1)) {
		snap_fmt(p->err, sizeof(p->err), "cannot create %s/%s/ec: %s", mesh->store->root, j->name, strerror(errno));
		p->local = SNAP_EIO;
	}
}

/* Collective over the group (both ec phases), whatever failed here: a member
 * after a local failure passes a zero length / no parity and the library
 * fails the whole group instead of hanging it. Between the phases, the
 * parity is charged to the budget and its file created. */
static void protect_encode(struct snap_mesh *mesh, struct mjob *j, uint64_t g, struct protect_run *p)
{
	struct snap_ec_opts opts = { 0 }; /* default chunk and window */
	char why[512] = "";
	int local = p->local;
	int rc = snap_ec_encode_begin(mesh->group, &mesh->grp, g, local ? 0 : p->data_len, local ? NULL : p->blob,
				      local ? 0 : p->blen, &opts, &p->enc, why, sizeof(why));
	if (rc && !p->local) {
		snap_fmt(p->err, sizeof(p->err), "%s", why);
		p->local = rc;
	}
	if (rc)
		return;
	p->plen = snap_ec_encode_parity_len(p->enc);
	if (!p->local && p->plen)
		take_parity(mesh, j, p);
	else if (!p->local)
		p->accounted = !(p->local = mesh_charge_parity(mesh, 0, p->err, sizeof(p->err)));
	local = p->local;
	rc = snap_ec_encode_run(p->enc, local ? NULL : p->iov, local ? 0 : 2 * (int)p->src.n, local ? NULL : p->parity,
				local ? 0 : p->plen);
	if (rc && !p->local) {
		snap_fmt(p->err, sizeof(p->err), "%s", snap_ec_encode_error(p->enc));
		p->local = rc;
	}
}

/* Local: parity first, then the record that vouches for it. The parity
 * stays mapped (protect_agree keeps or drops it). */
static void protect_publish(struct protect_run *p)
{
	if (!p->local && ((p->plen ? rename(p->ptmp, p->ppath) : mesh_write_atomic(p->ppath, "", 0)) != 0 ||
			  mesh_write_record(p->rpath, snap_ec_encode_meta(p->enc)) != 0)) {
		snap_fmt(p->err, sizeof(p->err), "cannot publish %s: %s", p->rpath, strerror(errno));
		p->local = SNAP_EIO;
	}
}

/* Collective over the mesh: did every node publish? Then g becomes the
 * protected step (its pins replace the old ones); else this attempt's
 * pins, budget and files go, and g is not tried again. */
static int protect_agree(struct snap_mesh *mesh, struct mjob *j, uint64_t g, struct protect_run *p)
{
	int ok = p->local == 0, all = 0;
	uint64_t before = j->prot;   /* par_map is this step's parity, when set */
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mesh->world);

	pthread_mutex_lock(&mesh->mu);
	if (all) {
		unpin(mesh, j->name, j->pins, j->npins);
		free(j->pins);
		j->pins = p->src.pins;
		j->npins = p->src.n;
		p->src.pins = NULL;
		j->has_prot = 1;
		j->prot = g;
	} else {
		unpin(mesh, j->name, p->src.pins, p->src.n);
		j->has_failed = 1;
		j->failed = g;
		if (p->accounted)
			mesh->store->mem_used -= p->plen;
	}
	pthread_mutex_unlock(&mesh->mu);
	if (all) {
		/* The step protected until now: its parity file becomes the
		 * spare the next protect writes into. */
		char spare[SNAP_FILE_MAX], old[SNAP_FILE_MAX];
		spare_path(mesh, j->name, spare, sizeof(spare));
		mesh_ec_path(mesh->store->root, j->name, before, "parity", old, sizeof(old));
		if (j->par_map && rename(old, spare) == 0) {
			j->spare_map = j->par_map;
			j->spare_len = j->par_len;
		} else if (j->par_map) {
			munmap(j->par_map, j->par_len);
		} else {
			/* A step the relaunch rebuilt is not mapped: its file becomes
			 * the spare all the same (mapped when taken), unless one is
			 * there; then it goes with the other steps, counted. */
			(void)renameat2(AT_FDCWD, old, AT_FDCWD, spare, RENAME_NOREPLACE);
		}
		j->par_map = p->parity;
		j->par_len = p->plen;
		p->parity = NULL;
		drop_other_steps(mesh, j->name, g);
		uint64_t t = snap_now_ns();
		smp_metrics_observe(SMP_HIST_PROTECT, j->name, (double)(t - p->t0) / 1e9);
		if (p->parity_how)
			smp_metrics_count(strcmp(p->parity_how, "new") ? SMP_CNT_PARITY_WARM : SMP_CNT_PARITY_COLD, j->name);
		if (p->src.warm || p->src.cold || (p->parity_how && strcmp(p->parity_how, "spare")))
			mesh_say(mesh, "job %s step %" PRIu64 ": slot files read first through mappings made ahead %u, "
				 "mapped by this protect %u; parity file: %s", j->name, g, p->src.warm, p->src.cold,
				 p->parity_how ? p->parity_how : "none");
		mesh_say(mesh, "job %s step %" PRIu64 " protected (group %d, %d+%d, %" PRIu64 " data + %" PRIu64
			 " parity bytes here, %.1f ms: map %.1f, encode %.1f, publish and agree %.1f; CPU %.1f ms)",
			 j->name, g, mesh->grp.id, mesh->grp.k, mesh->grp.m, p->data_len, p->plen,
			 (double)(t - p->t0) / 1e6, (double)(p->t_map - p->t0) / 1e6, (double)(p->t_enc - p->t_map) / 1e6,
			 (double)(t - p->t_enc) / 1e6, (double)(mesh_thread_cpu_ns() - p->cpu0) / 1e6);
	} else {
		smp_metrics_count(SMP_CNT_PROTECT_FAILED, j->name);
		if (p->parity)
			munmap(p->parity, p->plen);
		p->parity = NULL;
		unlink(p->rpath);
		unlink(p->ppath);
		unlink(p->ptmp);
		if (p->local)
			mesh_warn(mesh, "job %s step %" PRIu64 ": protect failed on node %d (group %d): %s; step %s stays "
				  "the protected one", j->name, g, mesh->rank, mesh->grp.id,
				  p->err[0] ? p->err : snap_strerror(p->local), j->has_prot ? "the previous" : "none");
		else
			mesh_say(mesh, "job %s step %" PRIu64 ": protect failed on another node; keeping the previous one",
				 j->name, g);
	}
	return all;
}

static void protect_free(struct protect_run *p)
{
	for (uint32_t i = 0; i < p->src.n; i++)
		free(p->src.man[i]);
	free(p->src.man);
	free(p->src.ent);
	free(p->src.pins);
	free(p->iov);
	free(p->blob);
	snap_ec_encode_free(p->enc);
}

unsigned mesh_parity_sweep(struct snap_mesh *mesh)
{
	unsigned dropped = 0;
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		char path[SNAP_FILE_MAX];
		struct stat st;
		mesh_ec_path(mesh->store->root, j->name, j->prot, "parity", path, sizeof(path));
		if (j->par_map && (stat(path, &st) != 0 || (uint64_t)st.st_size != j->par_len)) {
			munmap(j->par_map, j->par_len);
			j->par_map = NULL;
			dropped++;
		}
		spare_path(mesh, j->name, path, sizeof(path));
		if (j->spare_map && (stat(path, &st) != 0 || (uint64_t)st.st_size != j->spare_len)) {
			munmap(j->spare_map, j->spare_len);
			j->spare_map = NULL;
			j->spare_len = 0;
			dropped++;
		}
	}
	return dropped;
}

int mesh_protect(struct snap_mesh *mesh, struct mjob *j, uint64_t g)
{
	char ppath[SNAP_FILE_MAX], rpath[SNAP_FILE_MAX], ptmp[SNAP_FILE_MAX + 8];
	mesh_ec_path(mesh->store->root, j->name, g, "parity", ppath, sizeof(ppath));
	mesh_ec_path(mesh->store->root, j->name, g, "rec", rpath, sizeof(rpath));
	snprintf(ptmp, sizeof(ptmp), "%s.tmp", ppath);
	struct protect_run run = { .ppath = ppath, .rpath = rpath, .ptmp = ptmp, .t0 = snap_now_ns(),
				   .cpu0 = mesh_thread_cpu_ns() }, *p = &run;
	protect_prepare(mesh, j, g, p);
	p->t_map = snap_now_ns();
	protect_encode(mesh, j, g, p);
	p->t_enc = snap_now_ns();
	protect_publish(p);
	int all = protect_agree(mesh, j, g, p);
	protect_free(p);
	return all ? 0 : SNAP_EIO;
}
