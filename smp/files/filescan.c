/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files, daemon side: a job's namespace at start. Crash-only like
 * the rest of the store: the namespace is the tree of manifests under
 * files/ns, each published by rename(2); what lives only in memory (files
 * being written, which are flushed) is rebuilt here: files being written
 * are gone with their writers' connections, every committed file is checked
 * against its real path again, and flush leftovers are removed.
 */
#include "files/files_int.h"

static int open_dir_at(int dirfd, const char *name, int create)
{
	if (create && mkdirat(dirfd, name, 0700) != 0 && errno != EEXIST)
		return -1;
	return openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

void files_free_job(struct fjob *j)
{
	for (struct fent *e = j->head, *n; e; e = n) {
		n = e->next;
		files_free_entry(e);
	}
	while (j->wip) {
		struct fwip *w = j->wip;
		j->wip = w->next;
		free(w->path);
		free(w);
	}
	for (int *fd = &j->nsfd; fd <= &j->tmpfd; fd++)
		if (*fd >= 0)
			close(*fd);
	if (j->lockfd >= 0)
		close(j->lockfd);
	free(j);
}

struct scan {
	struct snap_files *f;
	struct fjob *j;
	struct fent **list;
	size_t n, cap;
};

static int cmp_mtime(const void *a, const void *b)
{
	const struct fent *x = *(struct fent *const *)a, *y = *(struct fent *const *)b;
	return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* One manifest found at start: keep it if it decodes and its data is whole. */
static void scan_manifest(struct scan *sc, int dfd, const char *name, const char *path)
{
	struct snap_files *f = sc->f;
	struct fjob *j = sc->j;
	char why[256] = "";
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > SNAP_FMAN_MAX) {
		snap_store_logf(f->store, "captured files of job %s: skipping %s: not a readable regular file",
				j->name, path);
		if (fd >= 0)
			close(fd);
		return;
	}
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
	close(fd);
	struct fent *e = calloc(1, sizeof(*e));
	int rc = SNAP_EIO;
	if (e && got == st.st_size)
		rc = snap_fman_decode(buf, (size_t)got, &e->man, why, sizeof(why));
	free(buf);
	if (rc == 0) {
		char dname[17];
		struct stat ds;
		snap_fman_data_name(e->man.id, dname);
		for (size_t i = 0; i < sc->n; i++)
			if (sc->list[i]->id == e->man.id)
				rc = SNAP_ECORRUPT;
		if (rc)
			snprintf(why, sizeof(why), "its data %s is named by another manifest too", dname);
		else if (fstatat(j->datafd, dname, &ds, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(ds.st_mode))
			snprintf(why, sizeof(why), "its data file %s is missing", dname), rc = SNAP_ECORRUPT;
		else if ((uint64_t)ds.st_size != e->man.size)
			snprintf(why, sizeof(why), "its data file holds %" PRIu64 " of %" PRIu64 " bytes",
				 (uint64_t)ds.st_size, e->man.size), rc = SNAP_ECORRUPT;
		else
			e->charge = (uint64_t)ds.st_blocks * 512;
	}
	if (rc == 0 && sc->n == sc->cap) {
		size_t cap = sc->cap ? 2 * sc->cap : 64;
		struct fent **l = realloc(sc->list, cap * sizeof(*l));
		if (l) {
			sc->list = l;
			sc->cap = cap;
		} else {
			rc = SNAP_ENOMEM;
			snprintf(why, sizeof(why), "out of memory");
		}
	}
	if (rc == 0 && !(e->path = strdup(path)))
		rc = SNAP_ENOMEM;
	if (rc) {
		snap_store_logf(f->store, "captured files of job %s: discarding %s: %s", j->name, path,
				why[0] ? why : "unreadable");
		if (rc != SNAP_ENOMEM)
			unlinkat(dfd, name, 0);
		if (e) {
			snap_fman_free(&e->man);
			free(e->path);
			free(e);
		}
		return;
	}
	e->id = e->man.id;
	e->size = e->man.size;
	e->mtime_ns = e->man.mtime_ns;
	e->job = j;
	e->state = F_DIRTY;
	e->check_real = 1;
	sc->list[sc->n++] = e;
}

/* Walk the namespace tree; returns the number of entries left in dir (for pruning). */
static int scan_tree(struct scan *sc, int dfd, char *path, size_t plen, int depth)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 1;
	}
	int left = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		size_t nl = strlen(de->d_name);
		if (plen + 1 + nl >= FILES_PATH_MAX) {
			left++;
			continue;
		}
		path[plen] = '/';
		memcpy(path + plen + 1, de->d_name, nl + 1);
		struct stat st;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			path[plen] = '\0';
			continue;
		}
		if (S_ISDIR(st.st_mode) && depth < FILES_SCAN_DEPTH) {
			int sub = openat(dfd, de->d_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int n = sub >= 0 ? scan_tree(sc, sub, path, plen + 1 + nl, depth + 1) : 1;
			if (sub >= 0)
				close(sub);
			if (n == 0 && unlinkat(dfd, de->d_name, AT_REMOVEDIR) == 0)
				n = 0;
			else
				left++;
		} else {
			scan_manifest(sc, dfd, de->d_name, path);
			left++;
		}
		path[plen] = '\0';
	}
	closedir(d);
	return left;
}

static int parse_id(const char *s, uint64_t *id)
{
	if (strlen(s) != 16)
		return 0;
	uint64_t v = 0;
	for (int i = 0; i < 16; i++) {
		char c = s[i];
		int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (x < 0)
			return 0;
		v = v << 4 | (uint64_t)x;
	}
	*id = v;
	return 1;
}

static void clear_dir(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dirfd, de->d_name, 0);
	closedir(d);
}

/* Leftover temporaries of flushes a crash interrupted, beside the files they were for. */
static void remove_flush_leftovers(struct snap_files *f, struct fent **list, size_t n)
{
	char done[64][FILES_PATH_MAX / 16];
	int ndone = 0;
	for (size_t i = 0; i < n; i++) {
		char dir[FILES_PATH_MAX];
		const char *base;
		files_split_path(list[i]->path, dir, sizeof(dir), &base);
		int seen = 0;
		for (int k = 0; k < ndone && !seen; k++)
			seen = strcmp(done[k], dir) == 0;
		if (seen)
			continue;
		if (ndone < 64 && strlen(dir) < sizeof(done[0]))
			strcpy(done[ndone++], dir);
		DIR *d = opendir(dir);
		struct dirent *de;
		while (d && (de = readdir(d))) {
			if (de->d_name[0] != '.' || !strstr(de->d_name, ".snapflush-"))
				continue;
			char p[FILES_PATH_MAX];
			if (snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) < (int)sizeof(p)) {
				snap_store_logf(f->store, "removing %s (a flush that did not finish)", p);
				unlink(p);
			}
		}
		if (d)
			closedir(d);
	}
}

struct fjob *files_load_job(struct snap_files *f, const char *name, int create)
{
	struct fjob *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->nsfd = j->datafd = j->tmpfd = j->lockfd = -1;
	snprintf(j->name, sizeof(j->name), "%s", name);
	char jdir[SNAP_FILE_MAX];
	if (snprintf(jdir, sizeof(jdir), "%s/%s", f->store->root, name) >= (int)sizeof(jdir) ||
	    snprintf(j->dir, sizeof(j->dir), "%s/files", jdir) >= (int)sizeof(j->dir)) {
		errno = ENAMETOOLONG;
		goto fail;
	}
	if (create && mkdir(jdir, 0700) != 0 && errno != EEXIST)
		goto fail;
	if (create && mkdir(j->dir, 0700) != 0 && errno != EEXIST)
		goto fail;
	int top = open(j->dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (top < 0)
		goto fail;
	/* Preloaded processes hold the lock for a few system calls at most
	 * (while no snapsmp ran): wait for them, boundedly. */
	j->lockfd = openat(top, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	for (int i = 0; j->lockfd >= 0 && flock(j->lockfd, LOCK_EX | LOCK_NB) != 0; i++) {
		if (i == 10000) {
			errno = EWOULDBLOCK;
			close(top);
			goto fail;
		}
		usleep(1000);
	}
	if (j->lockfd < 0) {
		close(top);
		goto fail;
	}
	j->nsfd = open_dir_at(top, "ns", 1);
	j->datafd = open_dir_at(top, "data", 1);
	j->tmpfd = open_dir_at(top, "tmp", 1);
	close(top);
	if (j->nsfd < 0 || j->datafd < 0 || j->tmpfd < 0)
		goto fail;
	clear_dir(j->tmpfd);
	struct scan sc = { .f = f, .j = j };
	char path[FILES_PATH_MAX] = "";
	scan_tree(&sc, j->nsfd, path, 0, 0);
	if (sc.n)
		qsort(sc.list, sc.n, sizeof(*sc.list), cmp_mtime);
	for (size_t i = 0; i < sc.n; i++) {
		files_hash_insert(j, sc.list[i]);
		files_order_append(j, sc.list[i]);
		f->store->mem_used += sc.list[i]->charge;
	}
	remove_flush_leftovers(f, sc.list, sc.n);
	/* Data no manifest names: a file whose writer died, or one replaced by a crash mid-commit. */
	int fd = openat(j->datafd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	while (d && (de = readdir(d))) {
		uint64_t id;
		if (!parse_id(de->d_name, &id))
			continue;
		if (id > f->last_id)
			f->last_id = id;
		int used = 0;
		for (size_t i = 0; i < sc.n && !used; i++)
			used = sc.list[i]->id == id;
		if (!used) {
			snap_store_logf(f->store, "captured files of job %s: removing data %s of a file never committed",
					j->name, de->d_name);
			unlinkat(j->datafd, de->d_name, 0);
		}
	}
	if (d)
		closedir(d);
	else if (fd >= 0)
		close(fd);
	if (sc.n)
		snap_store_logf(f->store, "captured files of job %s: %zu committed files in the store", j->name, sc.n);
	free(sc.list);
	j->next = f->jobs;
	f->jobs = j;
	return j;
fail:
	snap_store_logf(f->store, "captured files of job %s: cannot use %s: %s", name, j->dir, strerror(errno));
	files_free_job(j);
	return NULL;
}

struct fjob *files_find_job(struct snap_files *f, const char *name, int create)
{
	for (struct fjob *j = f->jobs; j; j = j->next)
		if (strcmp(j->name, name) == 0)
			return j;
	return create ? files_load_job(f, name, 1) : NULL;
}
