/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Opening a captured file: a file this process is writing, a committed one
 * read from the store, a new one created in the store (its data file made
 * and its first reservation asked for), or, when the store cannot take it,
 * a hidden temporary beside the real path (the fall back). What happens to
 * a file afterwards (growth, commit, export) is capfiles.c.
 */
#include "capfiles_int.h"

/* A committed store file opened for reading: remember its path (fchmod, futimens, fchown on it). */
static int track_read(int fd, const char *abs)
{
	if (fd < 0 || (unsigned)fd >= PL_MAXFD)
		return fd;
	struct pl_file *p = calloc(1, sizeof(*p));
	if (!p || !(p->path = strdup(abs))) {
		free(p);
		return fd;   /* untracked: metadata calls on it act on the data file only */
	}
	p->kind = PL_READ;
	plf_track_new(fd, p);
	return fd;
}

/* The data file of a file this process writes at abs, into buf; "" when
 * there is none. */
static void writing_data(const char *abs, char *buf, size_t cap)
{
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *w = plf_find_writing(abs);
	buf[0] = '\0';
	if (w)
		snprintf(buf, cap, "%s", w->data);
	pthread_mutex_unlock(&plf_tab_mu);
}

/* Copy the current bytes of abs (a file this process writes, a committed one, a real one) into wfd. */
static int copy_current(const char *abs, int wfd)
{
	char cp[PATH_MAX];
	writing_data(abs, cp, sizeof(cp));
	int src = cp[0] ? pl_real.openat(AT_FDCWD, cp, O_RDONLY | O_CLOEXEC) : plf_open_committed(abs, O_RDONLY | O_CLOEXEC);
	if (src == -2)
		src = pl_real.openat(AT_FDCWD, abs, O_RDONLY | O_CLOEXEC);
	struct stat st;
	int rc = src >= 0 && pl_real.fstatat(src, "", &st, AT_EMPTY_PATH) == 0 ? plf_copy_range(src, wfd, (uint64_t)st.st_size) : -1;
	if (src >= 0)
		pl_real.close(src);
	return rc;
}

static struct pl_file *new_write(const char *abs, int acc, int flags, uint32_t fmode)
{
	struct pl_file *p = calloc(1, sizeof(*p));
	if (!p || !(p->path = strdup(abs))) {
		free(p);
		return NULL;
	}
	p->kind = PL_WRITE;
	p->accmode = acc;
	p->append = (flags & O_APPEND) != 0;
	p->mode = fmode;
	p->owner = getpid();
	p->rfd = -1;
	pthread_mutex_init(&p->mu, NULL);
	return p;
}

#define KEEP_FLAGS (O_ACCMODE | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_SYNC | O_DSYNC | O_NOATIME)

/*
 * The file system instead of the store (no snapsmp, or it refused): the
 * bytes go to a hidden temporary beside abs, renamed over abs at the last
 * close. So even here a process killed mid-write leaves no torn file.
 */
static int open_fallback(const char *abs, int flags, uint32_t fmode, int exists)
{
	char tmp[PATH_MAX + 64];
	struct pl_file *p = new_write(abs, flags & O_ACCMODE, flags, fmode);
	if (!p || plf_fallback_name(abs, tmp, sizeof(tmp)) || !(p->data = strdup(tmp))) {
		if (p)
			plf_free_file(p);
		errno = ENOMEM;
		return -1;
	}
	p->realtmp = 1;
	atomic_store(&p->fallen, 1);
	int fd = pl_real.openat(AT_FDCWD, tmp, (flags & KEEP_FLAGS) | O_CREAT | O_EXCL | O_NOFOLLOW, fmode);
	int e = errno;
	if (fd >= 0 && !(flags & O_TRUNC) && exists) {
		int wfd = pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CLOEXEC);
		if (wfd < 0 || copy_current(abs, wfd) != 0)
			e = errno, pl_real.close(fd), fd = -1;
		if (wfd >= 0)
			pl_real.close(wfd);
	}
	if (fd >= 0)
		p->rfd = pl_hide_fd(pl_real.openat(AT_FDCWD, tmp, O_RDONLY | O_CLOEXEC));
	if (fd < 0 || p->rfd < 0 || (unsigned)fd >= PL_MAXFD) {
		if (fd >= 0)
			e = EMFILE, pl_real.close(fd);
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		plf_free_file(p);
		errno = e;
		return -1;
	}
	plf_track_new(fd, p);
	return fd;
}

int pl_open(int dirfd, const char *path, int flags, mode_t mode, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if ((flags & O_PATH) || (flags & O_TMPFILE) == O_TMPFILE || !pl_resolve(dirfd, path, abs))
		return -1;
	*handled = 1;
	int acc = flags & O_ACCMODE, writing_ = acc != O_RDONLY || (flags & O_TRUNC);
	struct stat rst;
	if ((flags & O_DIRECTORY) || !writing_) {
		if (!(flags & O_DIRECTORY)) {
			/* A file this process is writing, then the store, then the real file. */
			char dp[PATH_MAX];
			writing_data(abs, dp, sizeof(dp));
			if (dp[0])
				return pl_real.openat(AT_FDCWD, dp, flags & ~(O_CREAT | O_EXCL));
			int fd = plf_open_committed(abs, flags);
			if (fd != -2)
				return track_read(fd, abs);
			char to[PATH_MAX], ta[PATH_MAX];
			snprintf(to, sizeof(to), "%s", abs);
			if (!(flags & O_NOFOLLOW) && plf_follow(to) && pl_resolve(AT_FDCWD, to, ta) &&
			    (fd = plf_open_committed(ta, flags)) != -2)
				return track_read(fd, ta);
		}
		int fd = pl_real.openat(dirfd, path, flags, mode);
		if (fd >= 0 && pl_real.fstatat(fd, "", &rst, AT_EMPTY_PATH) == 0 && S_ISDIR(rst.st_mode))
			pl_track_dir(fd, abs);
		return fd;
	}

	/* Writing. What exists at abs now: a file of ours being written, a committed one, a real one. */
	struct snap_fman m;
	uint32_t old_mode = 0;   /* an existing file keeps its mode, as with open(2) */
	int in_store = plf_store_lookup(abs, &m);
	if (in_store < 0)
		in_store = 0;   /* unreadable manifest: a new file replaces it */
	if (in_store) {
		old_mode = m.mode;
		snap_fman_free(&m);
	}
	pthread_mutex_lock(&plf_tab_mu);
	struct pl_file *cur = plf_find_writing(abs);
	int in_writing = cur != NULL;
	if (cur)
		old_mode = cur->mode;
	pthread_mutex_unlock(&plf_tab_mu);
	int in_real = pl_real.fstatat(AT_FDCWD, abs, &rst, 0) == 0;
	if (in_real && S_ISDIR(rst.st_mode)) {
		errno = EISDIR;
		return -1;
	}
	if (in_real && !in_store && !in_writing)
		old_mode = rst.st_mode & 07777;
	int exists = in_store || in_writing || in_real;
	if ((flags & O_CREAT) && (flags & O_EXCL) && exists) {
		errno = EEXIST;
		return -1;
	}
	if (!(flags & O_CREAT) && !exists) {
		errno = ENOENT;
		return -1;
	}
	char dir[PATH_MAX];
	struct stat dst;
	if (plf_split_dir(abs, dir, sizeof(dir)) || pl_real.fstatat(AT_FDCWD, dir, &dst, 0) != 0) {
		errno = ENOENT;
		return -1;
	}
	if (!S_ISDIR(dst.st_mode)) {
		errno = ENOTDIR;
		return -1;
	}
	uint32_t fmode = exists ? old_mode : (uint32_t)(mode & ~atomic_load(&pl_umask) & 07777);
	if (!pl_connected())
		return open_fallback(abs, flags, fmode, exists);   /* warned once by pl_connected */
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, abs);
	snap_put_u32(&w, fmode);
	snap_put_u8(&w, (flags & O_CREAT) && (flags & O_EXCL) ? 1 : 0);
	void *pl;
	uint32_t len;
	char msg[512];
	int rc = pl_rpc(SNAP_MSG_FCREATE, &w, &pl, &len, msg, sizeof(msg));
	snap_wbuf_free(&w);
	uint32_t err = 0;
	uint64_t id = 0;
	if (rc == 0) {
		struct snap_rbuf r;
		snap_rbuf_init(&r, pl, len);
		err = snap_get_u32(&r);
		id = snap_get_u64(&r);
		if (r.bad)
			rc = SNAP_EPROTO;
		free(pl);
	}
	if (rc == 0 && err == EEXIST) {
		errno = EEXIST;
		return -1;
	}
	if (rc || err) {
		pl_warn_once(PL_WARN_FALLBACK, "%s: the node store refused it (%s); writing it to the file system", abs,
			     rc ? msg : strerror((int)err));
		return open_fallback(abs, flags, fmode, exists);
	}
	struct pl_file *p = new_write(abs, acc, flags, fmode);
	char dp[PATH_MAX];
	plf_data_path(id, dp, sizeof(dp));
	if (!p || !(p->data = strdup(dp))) {
		if (p)
			plf_free_file(p);
		plf_send_abort(id);
		errno = ENOMEM;
		return -1;
	}
	p->id = id;
	int fd = pl_real.openat(AT_FDCWD, dp, (flags & KEEP_FLAGS) | O_NOFOLLOW);
	p->rfd = fd >= 0 ? pl_hide_fd(pl_real.openat(AT_FDCWD, dp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) : -1;
	int ok = fd >= 0 && p->rfd >= 0 && (unsigned)fd < PL_MAXFD;
	if (ok)
		plf_data_mode(fd, fmode);
	if (ok && !(flags & O_TRUNC) && exists) {
		/* Opened for update: the new version starts as a copy of the current one. */
		struct stat st;
		int wfd = pl_real.openat(AT_FDCWD, dp, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
		ok = wfd >= 0 && copy_current(abs, wfd) == 0 && pl_real.fstatat(wfd, "", &st, AT_EMPTY_PATH) == 0 &&
		     (!st.st_size || plf_request_grow(p, (uint64_t)st.st_size, msg, sizeof(msg)) == 0);
		if (wfd >= 0)
			pl_real.close(wfd);
	}
	if (!ok) {
		if (fd >= 0)
			pl_real.close(fd);
		plf_send_abort(id);
		plf_free_file(p);
		pl_warn_once(PL_WARN_FALLBACK, "%s: cannot prepare its store file; writing it to the file system", abs);
		return open_fallback(abs, flags, fmode, exists);
	}
	plf_track_new(fd, p);
	return fd;
}
