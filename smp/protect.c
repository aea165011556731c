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

#include "mesh_int.h"

struct enc_src {
	struct mesh_slot_ent *ent;
	uint32_t n;
	void **man;       /* manifest copies */
	void **map;       /* slot mappings */
	struct mesh_pin *pins;
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

/* Map this node's slot files read-only; fill iov (manifest, slot) pairs. */
static int map_sources(struct snap_mesh *mesh, const char *job, struct enc_src *src, struct iovec *iov, char *err,
		       size_t errlen)
{
	src->map = calloc(src->n ? src->n : 1, sizeof(void *));
	if (!src->map)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < src->n; i++) {
		const struct mesh_slot_ent *e = &src->ent[i];
		char path[SNAP_FILE_MAX];
		snap_store_path(mesh->store, job, e->rank, e->slot, 0, path, sizeof(path));
		iov[2 * i] = (struct iovec){ src->man[i], e->man_len };
		iov[2 * i + 1] = (struct iovec){ NULL, 0 };
		if (!e->slot_bytes)
			continue;
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		void *p = fd >= 0 ? mmap(NULL, e->slot_bytes, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
		if (fd >= 0)
			close(fd);
		if (p == MAP_FAILED) {
			snap_fmt(err, errlen, "cannot map slot file %s: %s", path, strerror(errno));
			return SNAP_EIO;
		}
		src->map[i] = p;
		iov[2 * i + 1] = (struct iovec){ p, e->slot_bytes };
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
	else if (plen && (p = mmap(NULL, plen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map parity file %s: %s", tmp, strerror(errno));
		p = NULL;
	}
	close(fd);
	return p;
}

/* Remove every ec file of job but step keep's parity + record (older
 * steps and leftovers of killed encodes) and give their bytes back. */
static void drop_other_steps(struct snap_mesh *mesh, const char *job, uint64_t keep)
{
	uint64_t freed = 0;
	mesh_ec_prune(mesh->store->root, job, 1, keep, &freed);
	pthread_mutex_lock(&mesh->mu);
	mesh->store->mem_used -= freed < mesh->store->mem_used ? freed : mesh->store->mem_used;
	pthread_mutex_unlock(&mesh->mu);
}

int mesh_protect(struct snap_mesh *mesh, struct mjob *j, uint64_t g)
{
	char err[MESH_ERRLEN] = "";
	struct enc_src src = { 0 };
	struct iovec *iov = NULL;
	struct snap_ec_encode *enc = NULL;
	void *parity = NULL, *blob = NULL, *rec = NULL;
	uint64_t plen = 0, data_len = 0, t0 = snap_now_ns();
	int local = 0, accounted = 0;
	char ppath[SNAP_FILE_MAX], rpath[SNAP_FILE_MAX], ptmp[SNAP_FILE_MAX + 8];
	mesh_ec_path(mesh->store->root, j->name, g, "parity", ppath, sizeof(ppath));
	mesh_ec_path(mesh->store->root, j->name, g, "rec", rpath, sizeof(rpath));
	snprintf(ptmp, sizeof(ptmp), "%s.tmp", ppath);

	pthread_mutex_lock(&mesh->mu);
	local = collect(mesh, j->name, g, &src);
	pthread_mutex_unlock(&mesh->mu);
	if (local)
		snap_fmt(err, sizeof(err), "out of memory collecting step %" PRIu64, g);
	size_t blen = mesh_blob_size(src.n);
	if (!local && blen > SNAP_EC_APP_MAX) {
		snap_fmt(err, sizeof(err), "%u ranks on one node do not fit the %u-byte slot list", src.n, SNAP_EC_APP_MAX);
		local = SNAP_EINVAL;
	}
	if (!local && (!(blob = malloc(blen)) || !(iov = calloc(2 * (size_t)src.n + 1, sizeof(*iov))))) {
		snap_fmt(err, sizeof(err), "out of memory for the slot list of step %" PRIu64, g);
		local = SNAP_ENOMEM;
	}
	if (!local) {
		mesh_blob_pack(src.ent, src.n, blob);
		local = map_sources(mesh, j->name, &src, iov, err, sizeof(err));
	}
	for (uint32_t i = 0; i < src.n; i++)
		data_len += src.ent[i].man_len + src.ent[i].slot_bytes;
	if (!local && mesh_mkdirs(mesh->store->root, j->name, -1)) {
		snap_fmt(err, sizeof(err), "cannot create %s/%s/ec: %s", mesh->store->root, j->name, strerror(errno));
		local = SNAP_EIO;
	}
	/* Every member must take part in both collective phases, even after a
	 * local failure: it then passes a zero length / no parity and the
	 * library fails the whole group instead of hanging it. */
	struct snap_ec_opts opts = { 0 }; /* default chunk and window */
	char why[512] = "";
	int rc = snap_ec_encode_begin(mesh->group, &mesh->grp, g, local ? 0 : data_len, local ? NULL : blob,
				      local ? 0 : blen, &opts, &enc, why, sizeof(why));
	if (rc && !local) {
		snap_fmt(err, sizeof(err), "%s", why);
		local = rc;
	}
	if (!rc) {
		plen = snap_ec_encode_parity_len(enc);
		pthread_mutex_lock(&mesh->mu);
		struct snap_store *s = mesh->store;
		if (!local && s->mem_used + plen > s->mem_limit) {
			snap_fmt(err, sizeof(err), "parity of %" PRIu64 " bytes would exceed the memory budget"
				 " SNAP_MEM_LIMIT=%" PRIu64 " (%" PRIu64 " in use)", plen, s->mem_limit, s->mem_used);
			local = SNAP_ENOSPC;
		} else if (!local) {
			s->mem_used += plen;
			accounted = 1;
		}
		pthread_mutex_unlock(&mesh->mu);
		if (!local && plen && !(parity = create_parity(ptmp, plen, err, sizeof(err))))
			local = SNAP_EIO;
		rc = snap_ec_encode_run(enc, local ? NULL : iov, local ? 0 : 2 * (int)src.n, local ? NULL : parity,
					local ? 0 : plen);
		if (rc && !local) {
			snap_fmt(err, sizeof(err), "%s", snap_ec_encode_error(enc));
			local = rc;
		}
	}
	size_t need = 0;
	if (!local) {
		snap_ec_meta_pack(snap_ec_encode_meta(enc), NULL, 0, &need);
		if (!(rec = malloc(need)) || snap_ec_meta_pack(snap_ec_encode_meta(enc), rec, need, &need))
			local = SNAP_ENOMEM;
	}
	if (parity)
		munmap(parity, plen);
	/* Parity first, then the record that vouches for it. */
	if (!local && ((plen ? rename(ptmp, ppath) : mesh_write_atomic(ppath, "", 0)) != 0 ||
		       mesh_write_atomic(rpath, rec, need) != 0)) {
		snap_fmt(err, sizeof(err), "cannot publish %s: %s", rpath, strerror(errno));
		local = SNAP_EIO;
	}
	int ok = local == 0, all = 0;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mesh->world);

	pthread_mutex_lock(&mesh->mu);
	if (all) {
		unpin(mesh, j->name, j->pins, j->npins);
		free(j->pins);
		j->pins = src.pins;
		j->npins = src.n;
		src.pins = NULL;
		j->has_prot = 1;
		j->prot = g;
	} else {
		unpin(mesh, j->name, src.pins, src.n);
		j->has_failed = 1;
		j->failed = g;
		if (accounted)
			mesh->store->mem_used -= plen;
	}
	pthread_mutex_unlock(&mesh->mu);
	if (all) {
		drop_other_steps(mesh, j->name, g);
		mesh_say(mesh, "job %s step %" PRIu64 " protected (group %d, %d+%d, %" PRIu64 " data + %" PRIu64
			 " parity bytes here, %.1f ms)", j->name, g, mesh->grp.id, mesh->grp.k, mesh->grp.m, data_len, plen,
			 (double)(snap_now_ns() - t0) / 1e6);
	} else {
		unlink(rpath);
		unlink(ppath);
		unlink(ptmp);
		if (local)
			mesh_warn(mesh, "job %s step %" PRIu64 ": protect failed on node %d (group %d): %s; step %s stays "
				  "the protected one", j->name, g, mesh->rank, mesh->grp.id, err[0] ? err : snap_strerror(local),
				  j->has_prot ? "the previous" : "none");
		else
			mesh_say(mesh, "job %s step %" PRIu64 ": protect failed on another node; keeping the previous one",
				 j->name, g);
	}
	for (uint32_t i = 0; i < src.n; i++) {
		free(src.man[i]);
		if (src.map && src.map[i])
			munmap(src.map[i], src.ent[i].slot_bytes);
	}
	free(src.man);
	free(src.map);
	free(src.ent);
	free(src.pins);
	free(iov);
	free(blob);
	free(rec);
	snap_ec_encode_free(enc);
	return all ? 0 : SNAP_EIO;
}
