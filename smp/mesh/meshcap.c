/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files (LD_PRELOAD, files/fileopen.c) across the erasure-coded mesh.
 *
 * A captured file has no step: programs write, rename and delete files
 * whenever they like. So the mesh protects *generations*: when any node's
 * namespace of a job changed (files/fileopen.c bumps store_job.files_ver), every
 * node takes a snapshot of its committed files and the mesh encodes them
 * together, like a step. This node's part of generation G is
 *
 *   catalog | data of file 1 | data of file 2 | ...
 *
 * where the catalog lists each file's path, manifest and size. Survivors
 * must be able to present those same bytes at a relaunch even if the
 * program deleted or replaced the files since, so the snapshot holds them:
 *
 *   <root>/<job>/files/ec/step-<G>.parity, step-<G>.rec   as for steps
 *   <root>/<job>/files/ec/spare.parity                    the parity file of
 *                         the generation before G, which G+1 writes into
 *   <root>/<job>/files/ec/g-<G>/catalog                   this node's catalog
 *   <root>/<job>/files/ec/g-<G>/<data id>                 hard links to the data
 *
 * Data files are never modified after their commit (an update is a new
 * file), so a hard link is a snapshot that costs no memory while the file
 * lives; a deleted file's bytes stay until the next generation replaces G
 * (one agreement round later). A relaunch rebuilds the newest generation
 * every group can rebuild: a lost node gets its catalog, data and
 * namespace back (a path its store already names is left alone: that is
 * newer), then files/fileopen.c opens the store as usual and flushes what the real
 * paths lack.
 *
 * Cost: each generation re-encodes all of the job's captured files on
 * every node, not only what changed (see docs/design/captured-files.md).
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

#include "mesh/capgen.h"
#include "mesh/mesh_int.h"
#include "snap/fileman.h"

/* ---- protect: snapshot, encode, publish, agree ---------------------------- */

struct walk {
	struct cap_list *l;
	int datafd, gfd;
	uint64_t bytes;
};

/* One manifest of the namespace: link its data into the generation. Files
 * whose manifest or data is not sound are left out (files/fileopen.c discards them
 * at its next start anyway). */
static int walk_file(struct walk *w, int dfd, const char *name, const char *path)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st, ds;
	if (fd < 0)
		return 0;
	if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > SNAP_FMAN_MAX) {
		close(fd);
		return 0;
	}
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
	close(fd);
	struct snap_fman m;
	char dname[17];
	int rc = 0;
	if (got == st.st_size && snap_fman_decode(buf, (size_t)got, &m, NULL, 0) == 0) {
		snap_fman_data_name(m.id, dname);
		if (fstatat(w->datafd, dname, &ds, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(ds.st_mode) &&
		    (uint64_t)ds.st_size == m.size &&
		    (linkat(w->datafd, dname, w->gfd, dname, 0) == 0 || errno == EEXIST)) {
			rc = cap_list_add(w->l, path, buf, (uint32_t)got, m.id, m.size);
			w->bytes += m.size;
		}
		snap_fman_free(&m);
	}
	free(buf);
	return rc;
}

static int walk_tree(struct walk *w, int dfd, char *path, size_t plen, int depth)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	int rc = 0;
	struct dirent *de;
	while (!rc && (de = readdir(d))) {
		size_t nl = strlen(de->d_name);
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || plen + 1 + nl >= CAP_PATH_MAX ||
		    fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		path[plen] = '/';
		memcpy(path + plen + 1, de->d_name, nl + 1);
		if (S_ISDIR(st.st_mode) && depth < CAP_DEPTH) {
			int sub = openat(dfd, de->d_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0) {
				rc = walk_tree(w, sub, path, plen + 1 + nl, depth + 1);
				close(sub);
			}
		} else if (S_ISREG(st.st_mode)) {
			rc = walk_file(w, dfd, de->d_name, path);
		}
		path[plen] = '\0';
	}
	closedir(d);
	return rc;
}

static int cmp_ent(const void *a, const void *b)
{
	return strcmp(((const struct cap_ent *)a)->path, ((const struct cap_ent *)b)->path);
}

/* One protect of generation g: what the phases below hand each other. */
struct cap_run {
	struct cap_list l;
	void *cat;
	size_t cat_len;
	struct iovec *iov;
	uint32_t niov;
	struct cap_blob blob;
	struct snap_ec_encode *enc;
	void *parity;
	uint64_t plen, data_len, ver;
	int local, accounted;
	const char *parity_how;   /* "reused" (the spare) or "new" */
	char err[MESH_ERRLEN];
	char gdir[SNAP_FILE_MAX], ppath[SNAP_FILE_MAX], rpath[SNAP_FILE_MAX], ptmp[SNAP_FILE_MAX + 8];
};

/* [lock held] The snapshot: link every committed file's data into g-<g>
 * and write the catalog. The lock keeps the namespace still meanwhile
 * (the poll thread changes it only under the mesh lock). */
static void cap_snapshot(struct snap_mesh *mesh, struct mjob *j, struct cap_run *p)
{
	struct store_job *sj = snap_store_job(mesh->store, j->name, 0);
	char ns[SNAP_FILE_MAX], data[SNAP_FILE_MAX];
	p->ver = sj ? sj->files_ver : 0;
	cap_remove_gen_dir(p->gdir);   /* a leftover of a killed attempt with this number */
	if (cap_make_dirs(mesh, j->name) || mkdir(p->gdir, 0700) != 0) {
		snap_fmt(p->err, sizeof(p->err), "cannot create %s: %s", p->gdir, strerror(errno));
		p->local = SNAP_EIO;
		return;
	}
	cap_files_path(mesh, j->name, "ns", ns, sizeof(ns));
	cap_files_path(mesh, j->name, "data", data, sizeof(data));
	struct walk w = { .l = &p->l, .datafd = open(data, O_PATH | O_DIRECTORY | O_CLOEXEC),
			  .gfd = open(p->gdir, O_PATH | O_DIRECTORY | O_CLOEXEC) };
	int nsfd = open(ns, O_PATH | O_DIRECTORY | O_CLOEXEC);
	char path[CAP_PATH_MAX] = "";
	if (w.gfd < 0)
		p->local = SNAP_EIO;
	else if (nsfd >= 0 && w.datafd >= 0)
		p->local = walk_tree(&w, nsfd, path, 0, 0);
	if (nsfd >= 0)
		close(nsfd);
	if (w.datafd >= 0)
		close(w.datafd);
	if (w.gfd >= 0)
		close(w.gfd);
	if (p->local) {
		snap_fmt(p->err, sizeof(p->err), "cannot take the snapshot of the captured files in %s", p->gdir);
		return;
	}
	if (p->l.n)
		qsort(p->l.e, p->l.n, sizeof(*p->l.e), cmp_ent);
	char cpath[SNAP_FILE_MAX + 16];
	snprintf(cpath, sizeof(cpath), "%s/catalog", p->gdir);
	if (!(p->cat = cap_catalog_pack(&p->l, &p->cat_len)) || mesh_write_atomic(cpath, p->cat, p->cat_len)) {
		snap_fmt(p->err, sizeof(p->err), "cannot write %s", cpath);
		p->local = SNAP_EIO;
		return;
	}
	p->data_len = p->cat_len + w.bytes;
	p->blob = (struct cap_blob){ CAP_BLOB_MAGIC, p->l.n, p->cat_len };
}

/* This generation's parity file at p->ptmp, mapped read-write, its plen
 * bytes charged to the budget: the spare (the generation before the
 * protected one left it) renamed and resized, so its pages are not
 * allocated and cleared again, else a new file. A kill anywhere here
 * leaves a .tmp without a record: never restorable, pruned at the
 * relaunch. */
static void cap_take_parity(struct snap_mesh *mesh, const char *job, struct cap_run *p)
{
	char spare[SNAP_FILE_MAX];
	struct stat st;
	p->parity_how = "new";
	if (p->plen && cap_spare_path(mesh, job, spare, sizeof(spare)) == 0 && lstat(spare, &st) == 0 &&
	    S_ISREG(st.st_mode) && rename(spare, p->ptmp) == 0) {
		/* Its bytes were counted as the spare's; the charge below
		 * counts plen of them as this generation's parity. */
		uint64_t have = (uint64_t)st.st_size;
		pthread_mutex_lock(&mesh->mu);
		mesh->store->mem_used -= have < mesh->store->mem_used ? have : mesh->store->mem_used;
		pthread_mutex_unlock(&mesh->mu);
		p->parity_how = "reused";
	}
	/* On failure the caller unlinks p->ptmp, the spare with it. */
	p->accounted = !(p->local = mesh_charge_parity(mesh, p->plen, p->err, sizeof(p->err)));
	if (!p->local && p->plen && !(p->parity = mesh_map_parity(p->ptmp, p->plen, p->err, sizeof(p->err))))
		p->local = SNAP_EIO;
}

/* The generation's bytes as iov: the catalog, then each data file mapped
 * (through its link in the generation, which the program cannot remove). */
static void cap_encode(struct snap_mesh *mesh, const char *job, uint64_t g, struct cap_run *p)
{
	struct snap_ec_opts opts = { 0 };
	char why[512] = "";
	int local = p->local;
	int rc = snap_ec_encode_begin(mesh->group, &mesh->grp, g, local ? 0 : p->data_len, local ? NULL : &p->blob,
				      local ? 0 : sizeof(p->blob), &opts, &p->enc, why, sizeof(why));
	if (rc && !p->local) {
		snap_fmt(p->err, sizeof(p->err), "%s", why);
		p->local = rc;
	}
	if (rc)
		return;
	p->plen = snap_ec_encode_parity_len(p->enc);
	if (!p->local)
		cap_take_parity(mesh, job, p);
	local = p->local;
	rc = snap_ec_encode_run(p->enc, local ? NULL : p->iov, local ? 0 : (int)p->niov, local ? NULL : p->parity,
				local ? 0 : p->plen);
	if (rc && !p->local) {
		snap_fmt(p->err, sizeof(p->err), "%s", snap_ec_encode_error(p->enc));
		p->local = rc;
	}
	if (p->parity)
		munmap(p->parity, p->plen);
	p->parity = NULL;
	/* Parity first, then the record that vouches for it. */
	if (!p->local && ((p->plen ? rename(p->ptmp, p->ppath) : mesh_write_atomic(p->ppath, "", 0)) != 0 ||
			  mesh_write_record(p->rpath, snap_ec_encode_meta(p->enc)) != 0)) {
		snap_fmt(p->err, sizeof(p->err), "cannot publish %s: %s", p->rpath, strerror(errno));
		p->local = SNAP_EIO;
	}
}

/* Generation `before`, protected until now: its parity file becomes the
 * spare the next generation writes into (counted in the budget as it was),
 * its record goes first, so no moment has a record without its parity.
 * Where a spare is there already (a generation of no parity bytes did not
 * take it), the file goes with the prune instead. */
static void keep_spare(struct snap_mesh *mesh, const char *job, uint64_t before)
{
	char jf[SNAP_FILE_MAX], old[SNAP_FILE_MAX], rec[SNAP_FILE_MAX], spare[SNAP_FILE_MAX];
	struct stat st;
	cap_ec_job(job, jf, sizeof(jf));
	if (mesh_ec_path(mesh->store->root, jf, before, "parity", old, sizeof(old)) ||
	    mesh_ec_path(mesh->store->root, jf, before, "rec", rec, sizeof(rec)) ||
	    cap_spare_path(mesh, job, spare, sizeof(spare)) || lstat(old, &st) != 0 || !S_ISREG(st.st_mode) ||
	    st.st_size == 0)
		return;
	if (unlink(rec) != 0 && errno != ENOENT)
		return;
	(void)renameat2(AT_FDCWD, old, AT_FDCWD, spare, RENAME_NOREPLACE);
}

int mesh_cap_protect(struct snap_mesh *mesh, struct mjob *j)
{
	uint64_t t0 = snap_now_ns(), g = ++j->cap_seq;
	char jf[SNAP_FILE_MAX];
	struct cap_run run = { 0 }, *p = &run;
	cap_ec_job(j->name, jf, sizeof(jf));
	mesh_ec_path(mesh->store->root, jf, g, "parity", p->ppath, sizeof(p->ppath));
	mesh_ec_path(mesh->store->root, jf, g, "rec", p->rpath, sizeof(p->rpath));
	snap_fmt(p->ptmp, sizeof(p->ptmp), "%s.tmp", p->ppath);
	if (cap_gen_dir(mesh, j->name, g, p->gdir, sizeof(p->gdir))) {
		snap_fmt(p->err, sizeof(p->err), "the store path is too long");
		p->local = SNAP_EINVAL;
	}
	if (!p->local) {
		pthread_mutex_lock(&mesh->mu);
		cap_snapshot(mesh, j, p);
		pthread_mutex_unlock(&mesh->mu);
	}
	if (!p->local)
		p->local = cap_map_gen(p->gdir, &p->l, p->cat, p->cat_len, NULL, &p->iov, p->err, sizeof(p->err));
	p->niov = p->l.n + 1;
	cap_encode(mesh, j->name, g, p);

	int ok = p->local == 0, all = 0;
	MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, mesh->world);
	uint64_t freed = 0;
	if (all) {
		if (j->has_cap)
			keep_spare(mesh, j->name, j->cap_gen);
		freed = cap_prune(mesh, j->name, 1, g);
	} else {
		unlink(p->rpath);
		unlink(p->ppath);
		unlink(p->ptmp);
		cap_remove_gen_dir(p->gdir);
		if (p->local)
			mesh_warn(mesh, "job %s: captured files generation %" PRIu64 " not protected, it failed here: %s; "
				  "generation %s stays the protected one", j->name, g, p->err[0] ? p->err : snap_strerror(p->local),
				  j->has_cap ? "the previous" : "none");
		else
			mesh_say(mesh, "job %s: captured files generation %" PRIu64 " failed on another node; keeping the"
				 " previous one", j->name, g);
	}
	pthread_mutex_lock(&mesh->mu);
	struct snap_store *s = mesh->store;
	if (!all && p->accounted)
		freed += p->plen;
	s->mem_used -= freed < s->mem_used ? freed : s->mem_used;
	if (all) {
		j->has_cap = 1;
		j->cap_gen = g;
		j->cap_done = p->ver;
	} else {
		j->cap_failed = p->ver;   /* not again until the files change */
	}
	pthread_mutex_unlock(&mesh->mu);
	/* Said once the budget counts what the files hold (the tests compare them). */
	if (all)
		mesh_say(mesh, "job %s captured files generation %" PRIu64 " protected (%u files, %" PRIu64 " data + %" PRIu64
			 " parity bytes here, parity file %s, %.1f ms)", j->name, g, p->l.n, p->data_len, p->plen,
			 p->parity_how ? p->parity_how : "none", (double)(snap_now_ns() - t0) / 1e6);
	cap_unmap_gen(p->iov, p->l.n);
	cap_list_free(&p->l);
	free(p->cat);
	snap_ec_encode_free(p->enc);
	return all ? 0 : SNAP_EIO;
}

/* ---- relaunch: rebuild the newest generation ------------------------------ */

/* This node's catalog of generation g, read and checked. */
static int cap_check(struct snap_mesh *mesh, const char *job, uint64_t g, char *err, size_t errlen)
{
	struct cap_list l = { 0 };
	void *cat = NULL;
	size_t len;
	int rc = cap_read_catalog(mesh, job, g, &l, &cat, &len, err, errlen);
	free(cat);
	cap_list_free(&l);
	return rc;
}

/* mkdir -p of the parents of rel under dirfd. */
static int mkparents(int dirfd, const char *rel)
{
	char buf[CAP_PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", rel);
	for (char *s = strchr(buf, '/'); s; s = strchr(s + 1, '/')) {
		*s = 0;
		if (mkdirat(dirfd, buf, 0700) != 0 && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return 0;
}

static int write_file_at(int dirfd, const char *name, const void *buf, size_t len)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	const char *q = buf;
	while (len) {
		ssize_t n = write(fd, q, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			close(fd);
			return -1;
		}
		q += n;
		len -= (size_t)n;
	}
	return close(fd);
}

static int open_files_dir(struct snap_mesh *mesh, const char *job, const char *sub)
{
	char p[SNAP_FILE_MAX];
	if (cap_files_path(mesh, job, sub, p, sizeof(p)) || (mkdir(p, 0700) != 0 && errno != EEXIST))
		return -1;
	return open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* A lost node's rebuilt part: cut it back into the catalog and data files
 * of the generation, then give the store every file whose path it does not
 * name (data linked, manifest published by rename, as files/fileopen.c does). */
static int install_lost(struct snap_mesh *mesh, const char *job, const char *gdir, const uint8_t *seg, uint64_t len,
			const struct cap_blob *b, int *restored, char *err, size_t errlen)
{
	struct cap_list l = { 0 };
	char why[512] = "";
	int rc = b->cat_len <= len ? cap_catalog_parse(seg, (size_t)b->cat_len, &l, why, sizeof(why)) : SNAP_ECORRUPT;
	uint64_t total = b->cat_len;
	for (uint32_t i = 0; !rc && i < l.n; i++)
		total += l.e[i].size;
	if (!rc && (total != len || l.n != b->nfiles)) {
		snap_fmt(why, sizeof(why), "the catalog lists %u files, %" PRIu64 " bytes; the record %u files, %" PRIu64,
			 l.n, total, b->nfiles, len);
		rc = SNAP_ECORRUPT;
	}
	if (rc) {
		snap_fmt(err, errlen, "the rebuilt catalog is not sound: %s", why[0] ? why : snap_strerror(rc));
		cap_list_free(&l);
		return rc;
	}
	int gfd = open(gdir, O_PATH | O_DIRECTORY | O_CLOEXEC), nsfd = open_files_dir(mesh, job, "ns");
	int datafd = open_files_dir(mesh, job, "data"), tmpfd = open_files_dir(mesh, job, "tmp");
	rc = gfd < 0 || nsfd < 0 || datafd < 0 || tmpfd < 0 || write_file_at(gfd, "catalog", seg, (size_t)b->cat_len);
	const uint8_t *q = seg + b->cat_len;
	for (uint32_t i = 0; !rc && i < l.n; q += l.e[i].size, i++) {
		char dname[17], tname[32];
		struct stat st;
		snap_fman_data_name(l.e[i].id, dname);
		snprintf(tname, sizeof(tname), "%s.man", dname);
		rc = write_file_at(gfd, dname, q, (size_t)l.e[i].size);
		if (rc || fstatat(nsfd, l.e[i].path + 1, &st, AT_SYMLINK_NOFOLLOW) == 0)
			continue;   /* a file the store names already is newer than this generation */
		rc = (linkat(gfd, dname, datafd, dname, 0) != 0 && errno != EEXIST) ||
		     write_file_at(tmpfd, tname, l.e[i].man, l.e[i].man_len) || mkparents(nsfd, l.e[i].path + 1) ||
		     renameat(tmpfd, tname, nsfd, l.e[i].path + 1);
		if (!rc)
			(*restored)++;
	}
	if (rc)
		snap_fmt(err, errlen, "cannot write the rebuilt captured files of job %s under %s: %s", job, gdir,
			 strerror(errno));
	int fds[] = { gfd, nsfd, datafd, tmpfd };
	for (unsigned i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
		if (fds[i] >= 0)
			close(fds[i]);
	cap_list_free(&l);
	return rc ? SNAP_EIO : 0;
}

/* n file descriptors, all -1. */
static int *fds_new(int n)
{
	int *fds = malloc((size_t)n * sizeof(int));
	for (int i = 0; fds && i < n; i++)
		fds[i] = -1;
	return fds;
}

/* The rebuild of generation g on this node (collective over the group).
 * Rebuilt pieces are written through the rebuild's io (mesh_fio): into a
 * survivor's catalog and data files (read through read-only mappings,
 * repaired in place), or into a lost node's generation as one segment file
 * (the catalog, then the files), which install_lost splits once whole. */
static int cap_rebuild(struct snap_mesh *mesh, const char *job, uint64_t g, int have, char *err, size_t errlen)
{
	const char *root = mesh->store->root;
	char jf[SNAP_FILE_MAX], rpath[SNAP_FILE_MAX], ppath[SNAP_FILE_MAX], gdir[SNAP_FILE_MAX];
	cap_ec_job(job, jf, sizeof(jf));
	mesh_ec_path(root, jf, g, "rec", rpath, sizeof(rpath));
	mesh_ec_path(root, jf, g, "parity", ppath, sizeof(ppath));
	cap_gen_dir(mesh, job, g, gdir, sizeof(gdir));
	struct snap_ec_rebuild *rb = NULL;
	uint64_t t0 = snap_now_ns();
	int rc = mesh_rebuild_begin(mesh, rpath, have, &rb, err, errlen);
	if (rc)
		return rc;
	const struct snap_ec_meta *meta = snap_ec_rebuild_meta(rb);
	struct snap_ec_meta_info in;
	snap_ec_meta_info(meta, &in);
	uint64_t mlen = snap_ec_meta_member_len(meta, mesh->grp.index);
	const void *app = NULL;
	size_t alen = 0;
	struct cap_blob b = { 0 };
	snap_ec_meta_app(meta, mesh->grp.index, &app, &alen);
	int local = 0;
	if (alen != sizeof(b) || (memcpy(&b, app, sizeof(b)), b.magic != CAP_BLOB_MAGIC) || b.cat_len > mlen) {
		snap_fmt(err, errlen, "the record of captured files generation %" PRIu64 " describes no catalog", g);
		local = SNAP_ECORRUPT;
	}
	struct cap_list l = { 0 };
	void *cat = NULL, *seg = NULL, *parity = NULL;
	size_t cat_len = 0;
	struct iovec *iov = NULL, one;
	int niov = 0, *fds = NULL;
	char segp[SNAP_FILE_MAX + 16];
	snprintf(segp, sizeof(segp), "%s/segment.tmp", gdir);
	if (!local && have) {
		local = cap_read_catalog(mesh, job, g, &l, &cat, &cat_len, err, errlen);
		free(cat);
		cat = NULL;
		niov = (int)l.n + 1;
		if (!local && !(fds = fds_new(niov + 1))) {
			snap_fmt(err, errlen, "out of memory for the files of generation %" PRIu64, g);
			local = SNAP_ENOMEM;
		}
		char cp[SNAP_FILE_MAX + 16];
		snprintf(cp, sizeof(cp), "%s/catalog", gdir);
		int fd = local ? -1 : open(cp, O_RDWR | O_CLOEXEC);
		if (fds)
			fds[0] = fd;
		if (fd >= 0 && (cat = mmap(NULL, cat_len, PROT_READ, MAP_SHARED, fd, 0)) == MAP_FAILED)
			cat = NULL;
		if (!local && !cat) {
			snap_fmt(err, errlen, "cannot map %s", cp);
			local = SNAP_EIO;
		}
		if (!local)
			local = cap_map_gen(gdir, &l, cat, cat_len, fds, &iov, err, errlen);
	} else if (!local) {
		cap_remove_gen_dir(gdir);
		niov = 1;
		int fd = !cap_make_dirs(mesh, job) && mkdir(gdir, 0700) == 0 ? open(segp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600) : -1;
		if (fd >= 0 && ftruncate(fd, (off_t)mlen) == 0 && mlen)
			seg = mmap(NULL, mlen, PROT_READ, MAP_SHARED, fd, 0);   /* sends nothing: not populated */
		if (fd >= 0 && (fds = fds_new(2)))
			fds[0] = fd;
		else if (fd >= 0)
			close(fd);
		if (!fds || seg == MAP_FAILED) {
			seg = NULL;
			snap_fmt(err, errlen, "cannot create %s for the rebuild: %s", segp, fds ? strerror(errno) : "out of memory");
			local = SNAP_EIO;
		}
		one = (struct iovec){ seg, mlen };
		iov = &one;
	}
	if (!local && in.parity_len && !(parity = mesh_open_parity(ppath, in.parity_len, have, &fds[niov], err, errlen)))
		local = SNAP_EIO;
	struct mesh_fio fio = { iov, fds, niov };
	if (!local)
		mesh_fio_attach(rb, &fio);
	struct snap_ec_rebuild_stats st = { 0 };
	rc = snap_ec_rebuild_run(rb, local ? NULL : iov, local ? 0 : niov, local ? NULL : parity,
				 local ? 0 : in.parity_len, &st);
	if (rc && !local) {
		snap_fmt(err, errlen, "%s", snap_ec_rebuild_error(rb));
		local = rc;
	}
	int restored = 0;
	if (!local && !have && seg) {
		/* whole now, and in the page cache: populated in one go, not a fault per page */
		munmap(seg, mlen);
		if ((seg = mmap(NULL, mlen, PROT_READ, MAP_SHARED | MAP_POPULATE, fds[0], 0)) == MAP_FAILED) {
			seg = NULL;
			snap_fmt(err, errlen, "cannot map the rebuilt %s: %s", segp, strerror(errno));
			local = SNAP_EIO;
		}
	}
	if (!local && !have)
		local = install_lost(mesh, job, gdir, seg ? seg : "", mlen, &b, &restored, err, errlen);
	if (!local) {
		if (mesh_write_record(rpath, meta)) {
			snap_fmt(err, errlen, "cannot write record %s", rpath);
			local = SNAP_EIO;
		}
		if (!in.parity_len)
			mesh_write_atomic(ppath, "", 0);
	}
	if (!local && (st.chunks_rebuilt || !have))
		mesh_warn(mesh, "job %s captured files generation %" PRIu64 ": %s; %" PRIu64 " chunks rebuilt (%" PRIu64
			  " corrupt), %" PRIu64 " bytes written, %d files given back to the store, CRCs verified, %.1f ms",
			  job, g, have ? "repaired this node" : "rebuilt this lost node", st.chunks_rebuilt,
			  st.chunks_corrupt, st.bytes_written, restored, (double)(snap_now_ns() - t0) / 1e6);
	if (seg)
		munmap(seg, mlen);
	unlink(segp);
	if (have)
		cap_unmap_gen(iov, l.n);
	if (cat)
		munmap(cat, cat_len);
	if (parity)
		munmap(parity, in.parity_len);
	for (int i = 0; fds && i <= niov; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(fds);
	cap_list_free(&l);
	snap_ec_rebuild_free(rb);
	return local;
}

int mesh_cap_recover(struct snap_mesh *mesh)
{
	struct mesh_recs rs;
	int changed = 0;
	mesh_gather_records(mesh, "/files", cap_check, &rs);
	for (int i = 0; i < rs.total; i++)
		if (!mesh_job(mesh, rs.all[i].job)) {
			mesh_warn(mesh, "out of memory for a job entry");
			snap_mesh_abort(mesh, 1);
		}
	for (struct mjob *j = mesh->jobs; j; j = j->next) {
		uint64_t best = 0, newest = 0;
		int found = 0, any = 0;
		for (int i = 0; i < rs.total; i++) {
			if (strcmp(rs.all[i].job, j->name))
				continue;
			any = 1;
			newest = rs.all[i].step > newest ? rs.all[i].step : newest;
			if ((!found || rs.all[i].step > best) && mesh_rebuildable(mesh, &rs, j->name, rs.all[i].step, NULL, 0)) {
				best = rs.all[i].step;
				found = 1;
			}
		}
		if (!any) {
			cap_prune(mesh, j->name, 0, 0);   /* leftovers of a first generation killed halfway */
			continue;
		}
		j->cap_seq = newest;
		char msg[MESH_ERRLEN] = "";
		if (!found) {
			mesh_rebuildable(mesh, &rs, j->name, newest, msg, sizeof(msg));
			if (mesh->rank == 0)
				mesh_warn(mesh, "job %s: no generation of its captured files can be rebuilt (newest %" PRIu64
					  ": %s); the lost nodes' captured files are gone from memory (copies already "
					  "flushed to their real paths remain); stores left untouched", j->name, newest, msg);
			continue;
		}
		int rc = cap_rebuild(mesh, j->name, best, mesh_has_rec(&rs, mesh->rank, j->name, best), msg, sizeof(msg));
		changed = 1;
		if (mesh_agree(mesh, rc, msg, sizeof(msg))) {
			mesh_warn(mesh, "job %s: rebuild of captured files generation %" PRIu64 " failed: %s", j->name, best, msg);
			continue;
		}
		cap_prune(mesh, j->name, 1, best);
		j->has_cap = 1;
		j->cap_gen = best;
		if (mesh->rank == 0)
			mesh_say(mesh, "job %s: captured files generation %" PRIu64 " verified on every node (rebuilt where "
				 "lost or corrupt)", j->name, best);
	}
	/* Jobs no node has a generation of: whatever their files/ec holds is a
	 * first encode killed halfway. */
	DIR *d = opendir(mesh->store->root);
	struct dirent *de;
	while (d && (de = readdir(d)))
		if (snap_job_name_ok(de->d_name) && !mesh_job_find(mesh, de->d_name))
			cap_prune(mesh, de->d_name, 0, 0);
	if (d)
		closedir(d);
	mesh_recs_free(&rs);
	return changed;
}
