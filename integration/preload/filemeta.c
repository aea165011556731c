/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files on the preload's side: metadata and links. Mode and mtime
 * are the store's own (the manifest carries them, the flush applies them):
 * on a file being written they are kept with it and sent with its commit;
 * on a committed file they make a new version of it (the same bytes, the
 * new mode or mtime), committed at once. What the store does not model (an
 * owner other than the writer's, a hard link to a store file, freopen,
 * a spawned child's own open) moves the file to the real file system first,
 * with one warning, and the real call then acts on it there.
 */
#include <dlfcn.h>
#include <sys/statfs.h>
#include <sys/time.h>
#include <time.h>
#include <utime.h>

#include "capfiles_int.h"

#define EXPORT __attribute__((visibility("default")))

/* A file this process writes at abs, held (refs + 1), or NULL; pl_release(p, 0) when done. */
static struct pl_file *hold_writing(const char *abs)
{
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *p = plf_find_writing(abs);
	if (p)
		p->refs++;
	pthread_mutex_unlock(&plf_tab_mu);
	return p;
}

static struct pl_file *hold_fd(int fd)
{
	struct pl_file *p = pl_get(fd);
	if (!p || p->kind != PL_WRITE || atomic_load(&p->exported))
		return NULL;
	pthread_mutex_lock(&plf_tab_mu);
	p->refs++;
	pthread_mutex_unlock(&plf_tab_mu);
	return p;
}

enum { SET_MODE = 1, SET_MTIME = 2 };

static void set_on(struct pl_file *p, int set, mode_t mode, uint64_t mtime)
{
	if (set & SET_MODE) {
		p->mode = mode & 07777;
		atomic_store(&p->mset, 1);
		if (p->rfd >= 0 && !atomic_load(&p->fallen))
			plf_data_mode(p->rfd, p->mode);
	}
	if (set & SET_MTIME) {
		atomic_store(&p->mtime_ns, mtime);
		atomic_store(&p->tset, 1);
	}
}

/*
 * A committed store file gets a new mode or mtime: a new version of it
 * (opened for update: the same bytes), committed with them. What was not
 * set keeps its value (a chmod does not move the mtime).
 */
static int reversion(const char *abs, int set, mode_t mode, uint64_t mtime)
{
	struct snap_fman m;
	if (plf_store_lookup(abs, &m) <= 0) {
		errno = ENOENT;
		return -1;
	}
	uint64_t old_mtime = m.mtime_ns;
	snap_fman_free(&m);
	int h, fd = pl_open(AT_FDCWD, abs, O_WRONLY | O_CLOEXEC, 0, &h);
	if (fd < 0)
		return -1;
	struct pl_file *p = pl_get(fd);
	if (p) {
		set_on(p, set | SET_MTIME, mode, (set & SET_MTIME) ? mtime : old_mtime);
	}
	p = (unsigned)fd < PL_MAXFD ? atomic_exchange(&pl_tab[fd], NULL) : NULL;
	pl_real.close(fd);
	return p ? pl_release(p, 0) : 0;
}

/*
 * Apply mode/mtime to what the store holds at abs (or at fd): 1 done (rc in
 * *rc), 0 not a store file (the real call acts).
 */
static int store_set(const char *abs, int fd, int set, mode_t mode, uint64_t mtime, int *rc)
{
	struct pl_file *p = fd >= 0 ? hold_fd(fd) : hold_writing(abs);
	if (p) {
		set_on(p, set, mode, mtime);
		pl_release(p, 0);
		*rc = 0;
		return 1;
	}
	if (fd >= 0)
		return 0;
	struct stat st;
	if (plf_store_stat(abs, &st) <= 0)
		return 0;
	*rc = reversion(abs, set, mode, mtime);
	return 1;
}

/* *fd >= 0: a descriptor call; one on a committed file opened for reading acts on its path (*fd = -1). */
static int resolve(int dirfd, const char *path, int *fd, char *abs)
{
	if (*fd >= 0) {
		struct pl_file *p = pl_get(*fd);
		if (p && p->kind == PL_READ) {
			snprintf(abs, PATH_MAX, "%s", p->path);
			*fd = -1;
			return 1;
		}
		return p && p->kind == PL_WRITE;
	}
	return path && pl_resolve(dirfd, path, abs);
}

int pl_meta_mode(int dirfd, const char *path, int fd, mode_t mode, int flags, int *handled)
{
	char abs[PATH_MAX];
	(void)flags;
	*handled = 0;
	int rc = 0;
	if (!resolve(dirfd, path, &fd, abs) || !store_set(abs, fd, SET_MODE, mode, 0, &rc))
		return -1;
	*handled = 1;
	return rc;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

int pl_meta_times(int dirfd, const char *path, int fd, const struct timespec ts[2], int flags, int *handled)
{
	char abs[PATH_MAX];
	(void)flags;
	*handled = 0;
	if (!resolve(dirfd, path, &fd, abs))
		return -1;
	/* The store keeps one time, the mtime; an atime-only change has nothing to change. */
	int set = SET_MTIME;
	uint64_t t = now_ns();
	if (ts && ts[1].tv_nsec == UTIME_OMIT)
		set = 0;
	else if (ts && ts[1].tv_nsec != UTIME_NOW) {
		if (ts[1].tv_nsec < 0 || ts[1].tv_nsec >= 1000000000L || ts[1].tv_sec < 0) {
			errno = EINVAL;
			*handled = 1;
			return -1;
		}
		t = (uint64_t)ts[1].tv_sec * 1000000000ull + (uint64_t)ts[1].tv_nsec;
	}
	int rc = 0;
	if (!set) {
		struct stat st;
		if (fd >= 0 || plf_store_stat(abs, &st) > 0) {
			*handled = 1;
			return 0;
		}
		return -1;
	}
	if (!store_set(abs, fd, set, 0, t, &rc))
		return -1;
	*handled = 1;
	return rc;
}

int pl_meta_owner(int dirfd, const char *path, int fd, uid_t uid, gid_t gid, int flags, int *handled)
{
	char abs[PATH_MAX];
	(void)flags;
	*handled = 0;
	if (fd >= 0 && pl_get(fd) && pl_get(fd)->kind == PL_READ) {
		if (!resolve(dirfd, path, &fd, abs))
			return -1;
	} else if (fd >= 0) {
		struct pl_file *p = hold_fd(fd);
		if (!p)
			return -1;
		snprintf(abs, sizeof(abs), "%s", p->path);
		pl_release(p, 0);
	} else if (!path || !pl_resolve(dirfd, path, abs)) {
		return -1;
	}
	struct stat st;
	if (plf_store_stat(abs, &st) <= 0)
		return -1;
	/* The flushed file belongs to snapsmp's user, the writer's when both are the same. */
	if ((uid == (uid_t)-1 || uid == geteuid()) && (gid == (gid_t)-1 || gid == getegid())) {
		*handled = 1;
		return 0;
	}
	if (fd >= 0)
		pl_export_fd(fd, "its owner changes (the node store keeps the writer's)");
	else
		pl_materialize(abs, "its owner changes (the node store keeps the writer's)");
	return -1;   /* the real call acts on the real file */
}

/* ---- materialize: a committed file moves to the real file system ---------- */

int pl_materialize(const char *abs, const char *why)
{
	struct pl_file *w = hold_writing(abs);
	if (w) {
		int fd = -1;
		for (int i = 0; i < PL_MAXFD && fd < 0; i++)
			if (atomic_load(&pl_tab[i]) == w)
				fd = i;
		pl_release(w, 0);
		if (fd >= 0)
			pl_export_fd(fd, why);
		return 0;
	}
	struct snap_fman m;
	if (plf_store_lookup(abs, &m) <= 0)
		return 0;
	uint32_t mode = m.mode;
	uint64_t mt = m.mtime_ns;
	snap_fman_free(&m);
	int src = plf_open_committed(abs, O_RDONLY | O_CLOEXEC);
	char tmp[PATH_MAX + 64];
	int dst = src < 0 || plf_fallback_name(abs, tmp, sizeof(tmp)) ? -1 :
		pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	struct stat st;
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = (time_t)(mt / 1000000000ull), .tv_nsec = (long)(mt % 1000000000ull) } };
	int ok = dst >= 0 && pl_real.fstatat(src, "", &st, AT_EMPTY_PATH) == 0 &&
		 plf_copy_range(src, dst, (uint64_t)st.st_size) == 0 && fchmod(dst, mode & 07777) == 0 &&
		 futimens(dst, ts) == 0;
	int e = errno;
	if (src >= 0)
		pl_real.close(src);
	if (dst >= 0 && pl_real.close(dst) != 0)
		ok = 0;
	if (!ok) {
		if (dst >= 0)
			pl_real.unlinkat(AT_FDCWD, tmp, 0);
		pl_say("%s: cannot move it to the file system (%s): %s", abs, why, strerror(e));
		errno = e;
		return -1;
	}
	if (plf_install_real(tmp, abs) != 0)
		return -1;
	pl_warn_once(PL_WARN_META, "%s: %s, so it moves to the file system", abs, why);
	return 0;
}

/* ---- the interposers ------------------------------------------------------ */

#define META(call, real_call)                        \
	PL_INIT();                                   \
	if (pl_cfg.enabled) {                        \
		int h_, r_ = call;                   \
		if (h_)                              \
			return r_;                   \
	}                                            \
	return real_call

#define NEXT(fn_t, name)                             \
	static fn_t real_;                           \
	if (!real_) {                                \
		void *p_ = dlsym(RTLD_NEXT, name);   \
		memcpy(&real_, &p_, sizeof(p_));     \
	}

typedef int (*chmod_t)(const char *, mode_t);
typedef int (*fchmod_t)(int, mode_t);
typedef int (*fchmodat_t)(int, const char *, mode_t, int);

EXPORT int chmod(const char *path, mode_t mode)
{
	NEXT(chmod_t, "chmod");
	META(pl_meta_mode(AT_FDCWD, path, -1, mode, 0, &h_), real_(path, mode));
}

EXPORT int lchmod(const char *path, mode_t mode)
{
	NEXT(chmod_t, "lchmod");
	META(pl_meta_mode(AT_FDCWD, path, -1, mode, AT_SYMLINK_NOFOLLOW, &h_), real_(path, mode));
}

EXPORT int fchmod(int fd, mode_t mode)
{
	NEXT(fchmod_t, "fchmod");
	META(pl_meta_mode(AT_FDCWD, NULL, fd, mode, 0, &h_), real_(fd, mode));
}

EXPORT int fchmodat(int dirfd, const char *path, mode_t mode, int flags)
{
	NEXT(fchmodat_t, "fchmodat");
	META(pl_meta_mode(dirfd, path, -1, mode, flags, &h_), real_(dirfd, path, mode, flags));
}

typedef int (*chown_t)(const char *, uid_t, gid_t);
typedef int (*fchown_t)(int, uid_t, gid_t);
typedef int (*fchownat_t)(int, const char *, uid_t, gid_t, int);

EXPORT int chown(const char *path, uid_t u, gid_t g)
{
	NEXT(chown_t, "chown");
	META(pl_meta_owner(AT_FDCWD, path, -1, u, g, 0, &h_), real_(path, u, g));
}

EXPORT int lchown(const char *path, uid_t u, gid_t g)
{
	NEXT(chown_t, "lchown");
	META(pl_meta_owner(AT_FDCWD, path, -1, u, g, AT_SYMLINK_NOFOLLOW, &h_), real_(path, u, g));
}

EXPORT int fchown(int fd, uid_t u, gid_t g)
{
	NEXT(fchown_t, "fchown");
	META(pl_meta_owner(AT_FDCWD, NULL, fd, u, g, 0, &h_), real_(fd, u, g));
}

EXPORT int fchownat(int dirfd, const char *path, uid_t u, gid_t g, int flags)
{
	NEXT(fchownat_t, "fchownat");
	if ((flags & AT_EMPTY_PATH) && !path[0]) {
		META(pl_meta_owner(AT_FDCWD, NULL, dirfd, u, g, 0, &h_), real_(dirfd, path, u, g, flags));
	}
	META(pl_meta_owner(dirfd, path, -1, u, g, flags, &h_), real_(dirfd, path, u, g, flags));
}

typedef int (*utimensat_t)(int, const char *, const struct timespec[2], int);
typedef int (*futimens_t)(int, const struct timespec[2]);
typedef int (*utime_t)(const char *, const struct utimbuf *);
typedef int (*utimes_t)(const char *, const struct timeval[2]);
typedef int (*futimes_t)(int, const struct timeval[2]);

EXPORT int utimensat(int dirfd, const char *path, const struct timespec ts[2], int flags)
{
	NEXT(utimensat_t, "utimensat");
	META(pl_meta_times(dirfd, path, -1, ts, flags, &h_), real_(dirfd, path, ts, flags));
}

EXPORT int futimens(int fd, const struct timespec ts[2])
{
	NEXT(futimens_t, "futimens");
	META(pl_meta_times(AT_FDCWD, NULL, fd, ts, 0, &h_), real_(fd, ts));
}

static const struct timespec *tv_ts(const struct timeval *tv, struct timespec ts[2])
{
	if (!tv)
		return NULL;
	for (int i = 0; i < 2; i++) {
		ts[i].tv_sec = tv[i].tv_sec;
		ts[i].tv_nsec = tv[i].tv_usec * 1000;
	}
	return ts;
}

EXPORT int utime(const char *path, const struct utimbuf *b)
{
	NEXT(utime_t, "utime");
	struct timespec ts[2] = { { .tv_sec = b ? b->actime : 0 }, { .tv_sec = b ? b->modtime : 0 } };
	META(pl_meta_times(AT_FDCWD, path, -1, b ? ts : NULL, 0, &h_), real_(path, b));
}

EXPORT int utimes(const char *path, const struct timeval tv[2])
{
	NEXT(utimes_t, "utimes");
	struct timespec ts[2];
	META(pl_meta_times(AT_FDCWD, path, -1, tv_ts(tv, ts), 0, &h_), real_(path, tv));
}

EXPORT int lutimes(const char *path, const struct timeval tv[2])
{
	NEXT(utimes_t, "lutimes");
	struct timespec ts[2];
	META(pl_meta_times(AT_FDCWD, path, -1, tv_ts(tv, ts), AT_SYMLINK_NOFOLLOW, &h_), real_(path, tv));
}

EXPORT int futimes(int fd, const struct timeval tv[2])
{
	NEXT(futimes_t, "futimes");
	struct timespec ts[2];
	META(pl_meta_times(AT_FDCWD, NULL, fd, tv_ts(tv, ts), 0, &h_), real_(fd, tv));
}

/* ---- links ----------------------------------------------------------------- */

/* newpath names a store file: the real link call would not see it. */
static int store_has(int dirfd, const char *path)
{
	char abs[PATH_MAX];
	struct stat st;
	return path && pl_resolve(dirfd, path, abs) && plf_store_stat(abs, &st) > 0;
}

typedef int (*linkat_t)(int, const char *, int, const char *, int);
EXPORT int linkat(int od, const char *old, int nd, const char *new, int flags)
{
	PL_INIT();
	NEXT(linkat_t, "linkat");
	if (pl_cfg.enabled) {
		if (store_has(nd, new)) {
			errno = EEXIST;
			return -1;
		}
		/* A hard link to a store file: both names must be one real inode. */
		char abs[PATH_MAX];
		if (!((flags & AT_EMPTY_PATH) && !old[0]) && pl_resolve(od, old, abs))
			pl_materialize(abs, "it gets a hard link");
	}
	return real_(od, old, nd, new, flags);
}

EXPORT int link(const char *old, const char *new)
{
	return linkat(AT_FDCWD, old, AT_FDCWD, new, 0);
}

typedef int (*symlinkat_t)(const char *, int, const char *);
EXPORT int symlinkat(const char *target, int nd, const char *new)
{
	PL_INIT();
	NEXT(symlinkat_t, "symlinkat");
	if (pl_cfg.enabled && store_has(nd, new)) {
		errno = EEXIST;
		return -1;
	}
	return real_(target, nd, new);
}

EXPORT int symlink(const char *target, const char *new)
{
	return symlinkat(target, AT_FDCWD, new);
}

typedef ssize_t (*readlinkat_t)(int, const char *, char *, size_t);
EXPORT ssize_t readlinkat(int dirfd, const char *path, char *buf, size_t n)
{
	PL_INIT();
	NEXT(readlinkat_t, "readlinkat");
	if (pl_cfg.enabled && store_has(dirfd, path)) {
		errno = EINVAL;   /* a regular file, not a link */
		return -1;
	}
	return real_(dirfd, path, buf, n);
}

EXPORT ssize_t readlink(const char *path, char *buf, size_t n)
{
	return readlinkat(AT_FDCWD, path, buf, n);
}

/* ---- calls that open inside glibc -------------------------------------------- */

typedef FILE *(*freopen_t)(const char *, const char *, FILE *);
static FILE *do_freopen(const char *path, const char *mode, FILE *f, const char *name)
{
	PL_INIT();
	NEXT(freopen_t, name);
	char abs[PATH_MAX];
	if (pl_cfg.enabled && path && pl_resolve(AT_FDCWD, path, abs))
		pl_materialize(abs, "freopen opens it inside the C library");
	return real_(path, mode, f);
}

EXPORT FILE *freopen(const char *path, const char *mode, FILE *f)
{
	return do_freopen(path, mode, f, "freopen");
}

EXPORT FILE *freopen64(const char *path, const char *mode, FILE *f)
{
	return do_freopen(path, mode, f, "freopen64");
}

typedef int (*statfs_t)(const char *, struct statfs *);
EXPORT int statfs(const char *path, struct statfs *b)
{
	PL_INIT();
	NEXT(statfs_t, "statfs");
	char abs[PATH_MAX], dir[PATH_MAX];
	if (pl_cfg.enabled && store_has(AT_FDCWD, path) && pl_resolve(AT_FDCWD, path, abs) &&
	    !plf_split_dir(abs, dir, sizeof(dir)))
		return real_(dir, b);   /* the file system its directory is on, where it is flushed to */
	return real_(path, b);
}

EXPORT int statfs64(const char *path, struct statfs64 *b)
{
	return statfs(path, (struct statfs *)b);
}

/* ---- extended attributes ------------------------------------------------------- */

/* The store keeps no extended attributes (nor ACLs beyond the mode): a
 * program that sets one hears ENOTSUP, as on a file system without them,
 * and ACL writers (cp -a, install) then set the mode instead. */
typedef int (*setxattr_t)(const char *, const char *, const void *, size_t, int);
typedef int (*fsetxattr_t)(int, const char *, const void *, size_t, int);
typedef ssize_t (*getxattr_t)(const char *, const char *, void *, size_t);
typedef ssize_t (*listxattr_t)(const char *, char *, size_t);

static int fd_is_store(int fd)
{
	struct pl_file *p = pl_get(fd);
	return p && p->kind == PL_WRITE && !atomic_load(&p->exported) && !atomic_load(&p->fallen);
}

EXPORT int setxattr(const char *path, const char *name, const void *v, size_t n, int flags)
{
	PL_INIT();
	NEXT(setxattr_t, "setxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path)) {
		errno = ENOTSUP;
		return -1;
	}
	return real_(path, name, v, n, flags);
}

EXPORT int lsetxattr(const char *path, const char *name, const void *v, size_t n, int flags)
{
	PL_INIT();
	NEXT(setxattr_t, "lsetxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path)) {
		errno = ENOTSUP;
		return -1;
	}
	return real_(path, name, v, n, flags);
}

EXPORT int fsetxattr(int fd, const char *name, const void *v, size_t n, int flags)
{
	PL_INIT();
	NEXT(fsetxattr_t, "fsetxattr");
	if (pl_cfg.enabled && fd_is_store(fd)) {
		errno = ENOTSUP;
		return -1;
	}
	return real_(fd, name, v, n, flags);
}

static ssize_t no_attr(int list)
{
	if (list)
		return 0;   /* an empty list */
	errno = ENODATA;
	return -1;
}

EXPORT ssize_t getxattr(const char *path, const char *name, void *v, size_t n)
{
	PL_INIT();
	NEXT(getxattr_t, "getxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path))
		return no_attr(0);
	return real_(path, name, v, n);
}

EXPORT ssize_t lgetxattr(const char *path, const char *name, void *v, size_t n)
{
	PL_INIT();
	NEXT(getxattr_t, "lgetxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path))
		return no_attr(0);
	return real_(path, name, v, n);
}

EXPORT ssize_t listxattr(const char *path, char *list, size_t n)
{
	PL_INIT();
	NEXT(listxattr_t, "listxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path))
		return no_attr(1);
	return real_(path, list, n);
}

EXPORT ssize_t llistxattr(const char *path, char *list, size_t n)
{
	PL_INIT();
	NEXT(listxattr_t, "llistxattr");
	if (pl_cfg.enabled && store_has(AT_FDCWD, path))
		return no_attr(1);
	return real_(path, list, n);
}
