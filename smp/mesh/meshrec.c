/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The relaunch's view of the erasure-coding records, shared by the rebuild
 * of steps (recover.c) and of captured files (meshcap.c): every node lists
 * its valid records, the lists are gathered, and each unit (a step, or a
 * generation of captured files) is rebuildable when no group misses more
 * than m records of it. Also the agreement on an outcome, and the files of
 * a rebuild: the parity file, and the io (pwrite) both rebuilds write their
 * rebuilt pieces through. Calls nothing above it (mesh_int.h).
 */
#include <dirent.h>
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

/* One record: is it readable, and does it describe this node's place? */
static int record_ok(struct snap_mesh *mesh, const char *p, uint64_t g, char *err, size_t errlen)
{
	void *buf;
	size_t len;
	struct snap_ec_meta *meta = NULL;
	struct snap_ec_meta_info in;
	int rc = mesh_read_file(p, 1u << 30, &buf, &len);
	if (!rc) {
		rc = snap_ec_meta_unpack(buf, len, &meta, err, errlen);
		free(buf);
	}
	if (rc)
		return rc;
	snap_ec_meta_info(meta, &in);
	if (in.step != g || in.group != mesh->grp.id || in.index != mesh->grp.index || in.n != mesh->grp.n ||
	    in.k != mesh->grp.k || in.m != mesh->grp.m) {
		snprintf(err, errlen, "describes unit %" PRIu64 " group %d index %d (%d+%d), this node is group %d index %d"
			 " (%d+%d)", in.step, in.group, in.index, in.k, in.m, mesh->grp.id, mesh->grp.index, mesh->grp.k,
			 mesh->grp.m);
		rc = SNAP_EMISMATCH;
	}
	snap_ec_meta_free(meta);
	return rc;
}

/* This node's valid records of every job, under <root>/<job><sub>/ec. */
static void scan_records(struct snap_mesh *mesh, const char *sub, mesh_rec_check check, struct mesh_rec **out,
			 int *nout)
{
	const char *root = mesh->store->root;
	*out = NULL;
	*nout = 0;
	int cap = 0;
	DIR *d = opendir(root);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char jp[SNAP_FILE_MAX];
		if (!snap_job_name_ok(de->d_name) || snprintf(jp, sizeof(jp), "%s%s", de->d_name, sub) >= (int)sizeof(jp))
			continue;
		uint64_t *steps;
		size_t n;
		if (mesh_list_records(root, jp, &steps, &n))
			continue;
		for (size_t i = 0; i < n; i++) {
			char p[SNAP_FILE_MAX], why[256] = "";
			mesh_ec_path(root, jp, steps[i], "rec", p, sizeof(p));
			int rc = record_ok(mesh, p, steps[i], why, sizeof(why));
			if (!rc && check)
				rc = check(mesh, de->d_name, steps[i], why, sizeof(why));
			if (rc) {
				mesh_warn(mesh, "record %s unusable (%s): this node counts as lost for it", p,
					  why[0] ? why : snap_strerror(rc));
				continue;
			}
			if (*nout == cap) {
				cap = cap ? cap * 2 : 16;
				void *q = realloc(*out, (size_t)cap * sizeof(**out));
				if (!q) {
					/* A record silently left out would make this node's view differ. */
					mesh_warn(mesh, "out of memory listing the erasure-coding records");
					snap_mesh_abort(mesh, 1);
				}
				*out = q;
			}
			struct mesh_rec *e = &(*out)[(*nout)++];
			memset(e, 0, sizeof(*e));
			memcpy(e->job, de->d_name, strnlen(de->d_name, SNAP_JOB_MAX)); /* name_ok: <= SNAP_JOB_MAX */
			e->step = steps[i];
		}
		free(steps);
	}
	if (d)
		closedir(d);
}

void mesh_gather_records(struct snap_mesh *mesh, const char *sub, mesh_rec_check check, struct mesh_recs *r)
{
	struct mesh_rec *mine = NULL;
	int nmine = 0;
	memset(r, 0, sizeof(*r));
	scan_records(mesh, sub, check, &mine, &nmine);
	r->cnt = calloc((size_t)mesh->size, sizeof(int));
	r->dsp = calloc((size_t)mesh->size, sizeof(int));
	int *bc = calloc((size_t)mesh->size, sizeof(int)), *bd = calloc((size_t)mesh->size, sizeof(int));
	if (!r->cnt || !r->dsp || !bc || !bd) {
		/* Peers are about to enter the collectives below: abort, never hang them. */
		mesh_warn(mesh, "out of memory before the relaunch agreement");
		snap_mesh_abort(mesh, 1);
	}
	MPI_Allgather(&nmine, 1, MPI_INT, r->cnt, 1, MPI_INT, mesh->world);
	for (int i = 0; i < mesh->size; i++) {
		r->dsp[i] = r->total;
		r->total += r->cnt[i];
		bc[i] = r->cnt[i] * (int)sizeof(struct mesh_rec);
		bd[i] = r->dsp[i] * (int)sizeof(struct mesh_rec);
	}
	r->all = calloc((size_t)r->total + 1, sizeof(*r->all));
	if (!r->all) {
		mesh_warn(mesh, "out of memory gathering the erasure-coding records");
		snap_mesh_abort(mesh, 1);
	}
	MPI_Allgatherv(mine, nmine * (int)sizeof(struct mesh_rec), MPI_BYTE, r->all, bc, bd, MPI_BYTE, mesh->world);
	free(bc);
	free(bd);
	free(mine);
}

void mesh_recs_free(struct mesh_recs *r)
{
	free(r->all);
	free(r->cnt);
	free(r->dsp);
	memset(r, 0, sizeof(*r));
}

int mesh_has_rec(const struct mesh_recs *r, int node, const char *job, uint64_t g)
{
	for (int i = r->dsp[node]; i < r->dsp[node] + r->cnt[node]; i++)
		if (r->all[i].step == g && strcmp(r->all[i].job, job) == 0)
			return 1;
	return 0;
}

int mesh_rebuildable(struct snap_mesh *mesh, const struct mesh_recs *r, const char *job, uint64_t g, char *err,
		     size_t errlen)
{
	for (int first = 0; first < mesh->size;) {
		struct snap_ec_group gg;
		if (snap_ec_group_of(mesh->size, mesh->k, mesh->m, 0, first, &gg, NULL, 0))
			return 0;
		int lost = 0;
		char names[512] = "";
		size_t o = 0;
		for (int i = 0; i < gg.n; i++)
			if (!mesh_has_rec(r, first + i, job, g)) {
				lost++;
				int w = snprintf(names + o, sizeof(names) - o, "%s%d", o ? "," : "", first + i);
				if (w > 0 && (size_t)w < sizeof(names) - o)
					o += (size_t)w;
			}
		if (lost > gg.m) {
			if (err)
				snap_fmt(err, errlen, "group %d (nodes %d-%d, %d+%d) lost nodes %s: %d > m=%d", gg.id, first,
					 first + gg.n - 1, gg.k, gg.m, names, lost, gg.m);
			return 0;
		}
		first += gg.n;
	}
	return 1;
}

int mesh_agree(struct snap_mesh *mesh, int rc, char *err, size_t errlen)
{
	/* The first node whose failure is its own: the others only echo it
	 * (ec's SNAP_EC_ERR_ELSEWHERE), and "node 0: failed on another group
	 * member" tells an operator nothing. */
	int n = mesh->size, echo = rc && strstr(err, SNAP_EC_ERR_ELSEWHERE) != NULL;
	int me = !rc ? 2 * n : echo ? n + mesh->rank : mesh->rank, key = 0;
	MPI_Allreduce(&me, &key, 1, MPI_INT, MPI_MIN, mesh->world);
	if (key == 2 * n)
		return 0;
	int first = key % n;
	char buf[MESH_ERRLEN] = "";
	if (mesh->rank == first)
		snprintf(buf, sizeof(buf), "%s", err);
	MPI_Bcast(buf, sizeof(buf), MPI_CHAR, first, mesh->world);
	snap_fmt(err, errlen, "node %d: %s", first, buf);
	return SNAP_ELOST;
}

/* The parity file open read-write at plen bytes (created or resized); -1
 * with errno set on failure. */
static int parity_fd(const char *ppath, uint64_t plen)
{
	int fd = open(ppath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	struct stat st;
	if (fd >= 0 && (fstat(fd, &st) != 0 || ((uint64_t)st.st_size != plen && ftruncate(fd, (off_t)plen) != 0))) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

void *mesh_map_parity(const char *ppath, uint64_t plen, char *err, size_t errlen)
{
	int fd = parity_fd(ppath, plen);
	void *p = fd < 0 ? MAP_FAILED : mmap(NULL, plen, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	int e = errno;
	if (fd >= 0)
		close(fd);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map parity file %s: %s", ppath, strerror(e));
		return NULL;
	}
	return p;
}

void *mesh_open_parity(const char *ppath, uint64_t plen, int have, int *fdp, char *err, size_t errlen)
{
	int fd = parity_fd(ppath, plen);
	void *p = fd < 0 ? MAP_FAILED : mmap(NULL, plen, PROT_READ, MAP_SHARED | (have ? MAP_POPULATE : 0), fd, 0);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot open parity file %s for the rebuild: %s", ppath, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	*fdp = fd;
	return p;
}

/* pwrite() of the whole range, or a copy when the piece is memory. */
static int fio_write(void *arg, int iov, uint64_t off, const void *buf, size_t len)
{
	struct mesh_fio *f = arg;
	const uint8_t *p = buf;
	int fd = f->fd[iov < 0 ? f->n : iov];
	if (fd < 0) {
		memcpy((uint8_t *)f->iov[iov].iov_base + off, p, len);
		return 0;
	}
	while (len) {
		ssize_t k = pwrite(fd, p, len, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 && errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
		p += k;
		len -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

int mesh_fio_attach(struct snap_ec_rebuild *rb, struct mesh_fio *f)
{
	struct snap_ec_io io = { NULL, fio_write, f };
	return snap_ec_rebuild_set_io(rb, &io);
}

int mesh_rebuild_begin(struct snap_mesh *mesh, const char *rpath, int have, struct snap_ec_rebuild **rb, char *err,
		       size_t errlen)
{
	struct snap_ec_meta *mine = NULL;
	void *buf;
	size_t blen;
	char why[MESH_ERRLEN] = "";
	if (have && !mesh_read_file(rpath, 1u << 30, &buf, &blen)) {
		snap_ec_meta_unpack(buf, blen, &mine, NULL, 0);
		free(buf);
	}
	struct snap_ec_opts opts = { 0 }; /* the chunk size comes from the meta */
	int rc = snap_ec_rebuild_begin(mesh->group, &mesh->grp, mine, &opts, rb, why, sizeof(why));
	snap_ec_meta_free(mine);
	if (rc)
		snap_fmt(err, errlen, "%s", why);
	return rc;
}

int mesh_write_record(const char *rpath, const struct snap_ec_meta *meta)
{
	size_t need = 0;
	snap_ec_meta_pack(meta, NULL, 0, &need);
	void *rec = malloc(need);
	int rc = !rec || snap_ec_meta_pack(meta, rec, need, &need) ? SNAP_ENOMEM : mesh_write_atomic(rpath, rec, need);
	free(rec);
	return rc;
}

int mesh_charge_parity(struct snap_mesh *mesh, uint64_t plen, char *err, size_t errlen)
{
	int rc = 0;
	pthread_mutex_lock(&mesh->mu);
	struct snap_store *s = mesh->store;
	if (s->mem_used + plen > s->mem_limit) {
		snap_fmt(err, errlen, "parity of %" PRIu64 " bytes would exceed the memory budget SNAP_MEM_LIMIT=%" PRIu64
			 " (%" PRIu64 " in use)", plen, s->mem_limit, s->mem_used);
		rc = SNAP_ENOSPC;
	} else {
		s->mem_used += plen;
	}
	pthread_mutex_unlock(&mesh->mu);
	return rc;
}
