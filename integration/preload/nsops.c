/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files on the preload's side: the namespace operations, stat,
 * access, rename, unlink, truncate and listings, each merging the store's
 * namespace with the real directory.
 */
#include "capfiles_int.h"

/* ---- stat, access -------------------------------------------------------- */

static void patch_stat(struct stat *st, const struct snap_fman *m)
{
	st->st_mode = S_IFREG | (m->mode & 07777);
	st->st_size = (off_t)m->size;
	st->st_nlink = 1;
	st->st_mtim.tv_sec = (time_t)(m->mtime_ns / 1000000000ull);
	st->st_mtim.tv_nsec = (long)(m->mtime_ns % 1000000000ull);
	st->st_ctim = st->st_mtim;
}

/* The stat of abs as the store sees it: 1 found, 0 not ours, -1 error. */
int plf_store_stat(const char *abs, struct stat *st)
{
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *w = plf_find_writing(abs);
	int rfd = w ? pl_real.dup(w->rfd) : -1;
	uint32_t mode = w ? w->mode : 0;
	uint64_t mt = w && atomic_load(&w->tset) ? atomic_load(&w->mtime_ns) : 0;
	pthread_mutex_unlock(&plf_tab_mu);
	if (rfd >= 0) {
		int rc = pl_real.fstatat(rfd, "", st, AT_EMPTY_PATH);
		pl_real.close(rfd);
		st->st_mode = S_IFREG | mode;
		if (mt) {
			st->st_mtim.tv_sec = (time_t)(mt / 1000000000ull);
			st->st_mtim.tv_nsec = (long)(mt % 1000000000ull);
		}
		return rc == 0 ? 1 : -1;
	}
	for (int tries = 0; tries < 16; tries++) {
		struct snap_fman m;
		int r = plf_store_lookup(abs, &m);
		if (r <= 0)
			return r;
		char dp[PATH_MAX];
		plf_data_path(m.id, dp, sizeof(dp));
		int ok = pl_real.fstatat(AT_FDCWD, dp, st, 0) == 0;
		if (ok)
			patch_stat(st, &m);
		snap_fman_free(&m);
		if (ok)
			return 1;
	}
	errno = EIO;
	return -1;
}

int pl_stat(int dirfd, const char *path, struct stat *st, int flags, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (((flags & AT_EMPTY_PATH) && path && !path[0]) || !pl_resolve(dirfd, path, abs))
		return -1;
	int r = plf_store_stat(abs, st);
	char ta[PATH_MAX];
	if (r == 0 && !(flags & AT_SYMLINK_NOFOLLOW) && plf_follow(abs) && pl_resolve(AT_FDCWD, abs, ta))
		r = plf_store_stat(ta, st);
	if (r == 0)
		return -1;
	*handled = 1;
	return r > 0 ? 0 : -1;
}

int pl_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (((flags & AT_EMPTY_PATH) && path && !path[0]) || !pl_resolve(dirfd, path, abs) || !pl_real.statx)
		return -1;
	struct stat st;
	int r = plf_store_stat(abs, &st);
	if (r == 0)
		return -1;
	*handled = 1;
	if (r < 0)
		return -1;
	memset(sx, 0, sizeof(*sx));
	sx->stx_mask = STATX_BASIC_STATS & (mask | STATX_BASIC_STATS);
	sx->stx_blksize = (uint32_t)st.st_blksize;
	sx->stx_nlink = (uint32_t)st.st_nlink;
	sx->stx_uid = st.st_uid;
	sx->stx_gid = st.st_gid;
	sx->stx_mode = (uint16_t)st.st_mode;
	sx->stx_ino = st.st_ino;
	sx->stx_size = (uint64_t)st.st_size;
	sx->stx_blocks = (uint64_t)st.st_blocks;
	sx->stx_atime.tv_sec = st.st_atim.tv_sec;
	sx->stx_atime.tv_nsec = (uint32_t)st.st_atim.tv_nsec;
	sx->stx_mtime.tv_sec = st.st_mtim.tv_sec;
	sx->stx_mtime.tv_nsec = (uint32_t)st.st_mtim.tv_nsec;
	sx->stx_ctime.tv_sec = st.st_ctim.tv_sec;
	sx->stx_ctime.tv_nsec = (uint32_t)st.st_ctim.tv_nsec;
	sx->stx_dev_major = major(st.st_dev);
	sx->stx_dev_minor = minor(st.st_dev);
	return 0;
}

int pl_access(int dirfd, const char *path, int mode, int *handled)
{
	char abs[PATH_MAX];
	struct stat st;
	*handled = 0;
	if (!pl_resolve(dirfd, path, abs))
		return -1;
	int r = plf_store_stat(abs, &st);
	if (r == 0)
		return -1;
	*handled = 1;
	if (r < 0)
		return -1;
	if ((mode & X_OK) && !(st.st_mode & 0111)) {
		errno = EACCES;
		return -1;
	}
	return 0;
}

/* ---- rename, unlink, truncate -------------------------------------------- */

static int exists_anywhere(const char *abs)
{
	struct stat st;
	return plf_store_stat(abs, &st) != 0 || pl_real.fstatat(AT_FDCWD, abs, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Move a store file out of the captured directories: its bytes to `to`, then unlink it. */
static int move_out(const char *from, const char *to)
{
	int src = plf_open_committed(from, O_RDONLY | O_CLOEXEC);
	if (src < 0)
		return -1;
	char tmp[PATH_MAX + 32];
	struct stat st;
	snprintf(tmp, sizeof(tmp), "%s.snapmove-%d", to, (int)getpid());
	pl_real.fstatat(src, "", &st, AT_EMPTY_PATH);
	int fd = pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, st.st_mode & 07777);
	int ok = fd >= 0 && plf_copy_range(src, fd, (uint64_t)st.st_size) == 0;
	int e = errno;
	pl_real.close(src);
	if (fd >= 0 && pl_real.close(fd) != 0)
		ok = 0;
	if (ok && pl_real.renameat(AT_FDCWD, tmp, AT_FDCWD, to) != 0)
		ok = 0, e = errno;
	if (!ok) {
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		errno = e;
		return -1;
	}
	int h;
	return pl_unlink(AT_FDCWD, from, 0, &h);
}

/* No snapsmp runs and we hold the files lock (or there is no store): rename in the namespace and on disk ourselves. */
static int rename_direct(int lockfd, const char *from, const char *to)
{
	char a[PATH_MAX], z[PATH_MAX], dir[PATH_MAX];
	struct snap_fman m;
	struct stat st;
	int in_store = lockfd >= 0 && plf_store_lookup(from, &m) > 0;
	if (in_store)
		snap_fman_free(&m);
	if (in_store) {
		if (plf_ns_path(from, a, sizeof(a)) || plf_ns_path(to, z, sizeof(z)) || plf_split_dir(to, dir, sizeof(dir))) {
			errno = ENAMETOOLONG;
			return -1;
		}
		if (pl_real.fstatat(AT_FDCWD, dir, &st, 0) != 0 || !S_ISDIR(st.st_mode)) {
			errno = ENOENT;
			return -1;
		}
		plf_ns_parents(z);
		if (pl_real.renameat(AT_FDCWD, a, AT_FDCWD, z) != 0)
			return -1;
		/* A real copy of `from` (flushed or older) follows, so the disk keeps
		 * in step; the store's copy wins wherever they differ (the next
		 * snapsmp flushes it). */
		pl_real.renameat(AT_FDCWD, from, AT_FDCWD, to);
		return 0;
	}
	if (pl_real.fstatat(AT_FDCWD, from, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return -1;
	if (lockfd >= 0 && !S_ISDIR(st.st_mode) && !plf_ns_path(to, z, sizeof(z)))
		pl_real.unlinkat(AT_FDCWD, z, 0);   /* the store's `to` must not shadow the file that replaces it */
	return pl_real.renameat(AT_FDCWD, from, AT_FDCWD, to);
}

/* The other versions of `abs` go (a store copy, an older real file): the name belongs to an open file now. */
static void drop_other_versions(const char *abs)
{
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, abs);
	snap_put_u8(&b, 0);
	uint32_t e;
	int lockfd, unsure;
	if (plf_mutate(SNAP_MSG_FUNLINK, &b, &e, &lockfd, &unsure) == 1) {
		char p[PATH_MAX];
		if (lockfd >= 0 && !plf_ns_path(abs, p, sizeof(p)))
			pl_real.unlinkat(AT_FDCWD, p, 0);
		pl_real.unlinkat(AT_FDCWD, abs, 0);
		plf_store_unlock(lockfd);
	}
	snap_wbuf_free(&b);
}

static void rename_writing(struct pl_file *w, const char *to)
{
	pthread_mutex_lock(&plf_tab_mu);
	char *np = strdup(to);
	if (np) {
		free(w->path);
		w->path = np;
	}
	pthread_mutex_unlock(&plf_tab_mu);
}

int pl_rename(int od, const char *old, int nd, const char *new, unsigned flags, int *handled)
{
	char from[PATH_MAX], to[PATH_MAX];
	int co = pl_resolve(od, old, from), cn = pl_resolve(nd, new, to);
	*handled = 0;
	if (!co && !cn)
		return -1;
	if (flags & ~(unsigned)RENAME_NOREPLACE) {
		/* RENAME_EXCHANGE, RENAME_WHITEOUT: the store's one-name rename cannot
		 * give them; the files move to the real file system and the real call
		 * acts on them there. */
		if (co)
			pl_materialize(from, "renameat2 exchanges or whites it out");
		if (cn)
			pl_materialize(to, "renameat2 exchanges or whites it out");
		return -1;
	}
	*handled = 1;
	if ((flags & RENAME_NOREPLACE) && exists_anywhere(to)) {
		errno = EEXIST;
		return -1;
	}
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *w = co ? plf_find_writing(from) : NULL;
	int wtmp = w && w->realtmp;
	pthread_mutex_unlock(&plf_tab_mu);
	if (co && !cn) {
		if (w) {
			errno = EXDEV;   /* an open, uncommitted file cannot leave the store; movers copy on EXDEV */
			return -1;
		}
		struct stat st;
		if (plf_store_stat(from, &st) > 0)
			return move_out(from, to);
		return pl_real.renameat(od, old, nd, new);
	}
	if (!co && cn) {
		/* A real file moves in: it replaces the store's copy of `to`. */
		struct stat st;
		if (pl_real.fstatat(od, old, &st, AT_SYMLINK_NOFOLLOW) != 0)
			return -1;
		if (!S_ISDIR(st.st_mode))
			plf_store_forget(to);
		return pl_real.renameat(od, old, nd, new);
	}
	if (wtmp) {
		/* Open and headed for the file system: it takes the new name at its close. */
		drop_other_versions(from);
		rename_writing(w, to);
		return 0;
	}
	if (!w && !exists_anywhere(from)) {
		errno = ENOENT;
		return -1;
	}
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, from);
	snap_put_str(&b, to);
	snap_put_u8(&b, w ? 1 : 0);
	uint32_t e;
	int lockfd, unsure;
	int direct = plf_mutate(SNAP_MSG_FRENAME, &b, &e, &lockfd, &unsure);
	snap_wbuf_free(&b);
	if (direct) {
		if (w) {
			/* Its commit will fail (its snapsmp is gone) and put it on disk under the new name. */
			e = 0;
			char p[PATH_MAX];
			if (lockfd >= 0 && !plf_ns_path(from, p, sizeof(p)))
				pl_real.unlinkat(AT_FDCWD, p, 0);
			pl_real.unlinkat(AT_FDCWD, from, 0);
		} else {
			e = rename_direct(lockfd, from, to) == 0 ? 0 : (uint32_t)errno;
		}
		plf_store_unlock(lockfd);
	}
	/* A snapsmp that died after doing it but before saying so. */
	if (e == ENOENT && unsure && exists_anywhere(to) && !exists_anywhere(from))
		e = 0;
	if (e) {
		errno = (int)e;
		return -1;
	}
	if (w)
		rename_writing(w, to);
	return 0;
}

int pl_unlink(int dirfd, const char *path, int flags, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (!pl_resolve(dirfd, path, abs))
		return -1;
	*handled = 1;
	if (flags & AT_REMOVEDIR) {
		/* Store files keep a directory non-empty even when the real one is empty. */
		char p[PATH_MAX];
		if (!plf_ns_path(abs, p, sizeof(p))) {
			DIR *d = pl_real.opendir(p);
			struct dirent64 *e;
			int files = 0;
			while (d && (e = pl_real.readdir64(d)))
				files += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
			if (d)
				pl_real.closedir(d);
			if (files && pl_real.unlinkat(AT_FDCWD, p, AT_REMOVEDIR) != 0) {
				errno = ENOTEMPTY;
				return -1;
			}
			if (!files)
				pl_real.unlinkat(AT_FDCWD, p, AT_REMOVEDIR);
		}
		return pl_real.unlinkat(dirfd, path, AT_REMOVEDIR);
	}
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *w = plf_find_writing(abs);
	if (w)
		w->unlinked = 1;   /* discarded at its close, like the inode of an unlinked open file */
	pthread_mutex_unlock(&plf_tab_mu);
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, abs);
	snap_put_u8(&b, 0);
	uint32_t e;
	int lockfd, unsure;
	if (plf_mutate(SNAP_MSG_FUNLINK, &b, &e, &lockfd, &unsure) == 1) {
		char p[PATH_MAX];
		int in_store = lockfd >= 0 && !plf_ns_path(abs, p, sizeof(p)) && pl_real.unlinkat(AT_FDCWD, p, 0) == 0;
		e = 0;
		if (pl_real.unlinkat(AT_FDCWD, abs, 0) != 0 && !(in_store && errno == ENOENT))
			e = (uint32_t)errno;
		plf_store_unlock(lockfd);
	}
	snap_wbuf_free(&b);
	if (e == ENOENT && (w || unsure))
		e = 0;
	if (e) {
		errno = (int)e;
		return -1;
	}
	return 0;
}

int pl_truncate(const char *path, off_t len, int *handled)
{
	char abs[PATH_MAX];
	struct stat st;
	*handled = 0;
	if (!pl_resolve(AT_FDCWD, path, abs) || plf_store_stat(abs, &st) <= 0)
		return -1;
	*handled = 1;
	/* A new version of the file, through the hooks (copy, truncate, commit). */
	int h, fd = pl_open(AT_FDCWD, abs, O_WRONLY | O_CLOEXEC, 0, &h);
	if (!h)
		return pl_real.truncate(path, len);
	if (fd < 0)
		return -1;
	struct pl_file *p = pl_get(fd);
	if (p)
		pl_prewrite(p, fd, 0, (uint64_t)len);
	int rc = pl_real.ftruncate(fd, len);
	int e = errno;
	struct pl_file *q = (unsigned)fd < PL_MAXFD ? atomic_exchange(&pl_tab[fd], NULL) : NULL;
	pl_real.close(fd);
	int rr = q ? pl_release(q, rc != 0) : 0;
	if (rc) {
		errno = e;
		return -1;
	}
	return rr;
}

/* ---- listings ------------------------------------------------------------ */

static int name_hidden(const char *n)
{
	/* the flush's and the fallback's temporary files */
	return n[0] == '.' && (strstr(n, ".snapflush-") || strstr(n, ".snapfallback-"));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of the committed files in the store's copy of directory abs, sorted. */
static void list_store(const char *abs, char ***names, size_t *n)
{
	*names = NULL;
	*n = 0;
	char p[PATH_MAX];
	if (plf_ns_path(abs, p, sizeof(p)))
		return;
	int dfd = pl_real.openat(AT_FDCWD, p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? pl_real.fdopendir(dfd) : NULL;
	if (!d) {
		if (dfd >= 0)
			pl_real.close(dfd);
		return;
	}
	size_t cap = 0;
	struct dirent64 *e;
	while ((e = pl_real.readdir64(d))) {
		struct stat st;
		if (e->d_type == DT_DIR || !strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (e->d_type != DT_REG && (pl_real.fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)))
			continue;
		if (*n == cap) {
			cap = cap ? 2 * cap : 16;
			char **q = realloc(*names, cap * sizeof(*q));
			if (!q)
				break;
			*names = q;
		}
		if (!((*names)[*n] = strdup(e->d_name)))
			break;
		(*n)++;
	}
	pl_real.closedir(d);
	if (*n)
		qsort(*names, *n, sizeof(**names), cmp_str);
}

static ssize_t find_name(char **names, size_t n, const char *name)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(names[mid], name);
		if (c == 0)
			return (ssize_t)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

struct pl_dir {
	DIR *d;
	char **names;
	uint8_t *seen;
	size_t n, next;
	struct dirent64 ent;
	struct pl_dir *link;
};
static struct pl_dir *dirs;
pthread_mutex_t plf_dir_mu = PTHREAD_MUTEX_INITIALIZER;
atomic_int pl_ndirs;

void pl_dir_opened(DIR *d, const char *abs)
{
	struct pl_dir *x = calloc(1, sizeof(*x));
	if (!x)
		return;
	x->d = d;
	list_store(abs, &x->names, &x->n);
	x->seen = calloc(x->n ? x->n : 1, 1);
	pthread_mutex_lock(&plf_dir_mu);
	x->link = dirs;
	dirs = x;
	atomic_fetch_add(&pl_ndirs, 1);
	pthread_mutex_unlock(&plf_dir_mu);
}

static struct pl_dir *find_dir(DIR *d)
{
	struct pl_dir *x;
	pthread_mutex_lock(&plf_dir_mu);
	for (x = dirs; x && x->d != d; x = x->link) {
	}
	pthread_mutex_unlock(&plf_dir_mu);
	return x;
}

struct dirent64 *pl_readdir(DIR *d)
{
	struct pl_dir *x = find_dir(d);
	if (!x)
		return pl_real.readdir64(d);
	struct dirent64 *e;
	while ((e = pl_real.readdir64(d))) {
		if (name_hidden(e->d_name))
			continue;
		ssize_t i = find_name(x->names, x->n, e->d_name);
		if (i >= 0)
			x->seen[i] = 1;
		return e;
	}
	/* The real directory is exhausted: the store's files it does not have. */
	while (x->next < x->n && x->seen[x->next])
		x->next++;
	if (x->next == x->n)
		return NULL;
	const char *name = x->names[x->next++];
	memset(&x->ent, 0, sizeof(x->ent));
	x->ent.d_ino = 1 + (ino64_t)x->next;
	x->ent.d_type = DT_REG;
	x->ent.d_reclen = sizeof(x->ent);
	snprintf(x->ent.d_name, sizeof(x->ent.d_name), "%s", name);
	return &x->ent;
}

void pl_dir_rewound(DIR *d)
{
	struct pl_dir *x = find_dir(d);
	if (x) {
		memset(x->seen, 0, x->n ? x->n : 1);
		x->next = 0;
	}
}

void pl_dir_closed(DIR *d)
{
	pthread_mutex_lock(&plf_dir_mu);
	for (struct pl_dir **pp = &dirs; *pp; pp = &(*pp)->link) {
		struct pl_dir *x = *pp;
		if (x->d != d)
			continue;
		*pp = x->link;
		atomic_fetch_sub(&pl_ndirs, 1);
		for (size_t i = 0; i < x->n; i++)
			free(x->names[i]);
		free(x->names);
		free(x->seen);
		free(x);
		break;
	}
	pthread_mutex_unlock(&plf_dir_mu);
}

/* getdents64 on a captured directory descriptor: the real entries, then the store's. */
ssize_t pl_getdents(struct pl_file *p, int fd, void *buf, size_t n)
{
	if (!p->listed) {
		list_store(p->path, &p->names, &p->nnames);
		p->seen = calloc(p->nnames ? p->nnames : 1, 1);
		p->listed = 1;
	}
	ssize_t r = pl_real.getdents64(fd, buf, n);
	if (r > 0) {
		for (ssize_t off = 0; off < r;) {
			struct dirent64 *e = (struct dirent64 *)((char *)buf + off);
			ssize_t i = find_name(p->names, p->nnames, e->d_name);
			if (i >= 0 && p->seen)
				p->seen[i] = 1;
			off += e->d_reclen;
		}
		return r;
	}
	if (r < 0)
		return r;
	size_t used = 0;
	while (p->emitted < p->nnames) {
		size_t k = p->emitted;
		if (p->seen && p->seen[k]) {
			p->emitted++;
			continue;
		}
		size_t nl = strlen(p->names[k]);
		size_t rec = (offsetof(struct dirent64, d_name) + nl + 1 + 7) & ~(size_t)7;
		if (used + rec > n)
			break;
		struct dirent64 *e = (struct dirent64 *)((char *)buf + used);
		memset(e, 0, rec);
		e->d_ino = 1 + k;
		e->d_off = (off64_t)(used + rec);
		e->d_reclen = (unsigned short)rec;
		e->d_type = DT_REG;
		memcpy(e->d_name, p->names[k], nl + 1);
		used += rec;
		p->emitted++;
	}
	if (used == 0 && p->emitted < p->nnames) {
		errno = EINVAL;   /* buffer too small for one entry, as the kernel says */
		return -1;
	}
	return (ssize_t)used;
}
