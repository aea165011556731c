/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Locks on captured files: flock, fcntl's record locks, lockf.
 *
 * A file being written into the store is the store's private copy, which no
 * other process opens: a lock on it would keep out nobody that a plain run's
 * lock keeps out (HDF5 locks every file it opens, and refuses a file another
 * process has open for writing). So a file being written moves to the real
 * file system at its path (pl_export_fd, one warning) and the real call locks
 * the file every other process opens.
 *
 * Moving it replaces the real file at the path. Another process may hold a
 * lock on that file (its own writer moved there when it locked): the plain
 * run's lock would meet that lock, so this one asks the real file first and
 * fails or waits as the plain call would. A lock refused leaves the
 * descriptor on the real file (its store copy dropped): a plain run's
 * descriptor is that file, and committing the copy at close would put
 * back bytes the lock holder has since overwritten.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "capfiles_int.h"
#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

typedef int (*flock_t)(int, int);
typedef int (*lockf_t)(int, int, off_t);
static flock_t real_flock;
static lockf_t real_lockf;

static void *next_sym(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}

/* The real file at the path of the store file behind fd, opened for the probe: -1 if none. */
static int open_real_at(int fd)
{
	struct pl_file *p = pl_get(fd);
	char path[PATH_MAX];
	pthread_mutex_lock(&plf_tab_mu);
	int ok = p && p->kind == PL_WRITE && !atomic_load(&p->exported) && p->path &&
		 snprintf(path, sizeof(path), "%s", p->path) < (int)sizeof(path);
	pthread_mutex_unlock(&plf_tab_mu);
	return ok ? pl_real.openat(AT_FDCWD, path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
}

int pl_lock_cmd(int cmd, const void *arg)
{
	if (cmd != F_SETLK && cmd != F_SETLKW && cmd != F_OFD_SETLK && cmd != F_OFD_SETLKW)
		return 0;
	return arg && ((const struct flock *)arg)->l_type != F_UNLCK;
}

int pl_lock_aside(int fd, int cmd, const void *arg, const char *why)
{
	int rfd = open_real_at(fd);
	if (rfd >= 0) {
		/* An open file description's lock (OFD) conflicts with every other; a process's
		 * record lock conflicts with other processes' only, as the probe's would. */
		struct flock l = *(const struct flock *)arg;
		int ofd = cmd == F_OFD_SETLK || cmd == F_OFD_SETLKW;
		int wait = cmd == F_SETLKW || cmd == F_OFD_SETLKW;
		int r = pl_real.fcntl(rfd, ofd ? F_OFD_GETLK : F_GETLK, &l);
		int busy = r == 0 && l.l_type != F_UNLCK;
		if (busy && wait) {
			/* Wait as the plain call would; the probe's lock goes with its close. */
			l = *(const struct flock *)arg;
			busy = pl_real.fcntl(rfd, ofd ? F_OFD_SETLKW : F_SETLKW, &l) != 0;
		}
		int e = busy && wait ? errno : EAGAIN;
		pl_real.close(rfd);
		if (busy) {
			pl_attach_real(fd, why);
			errno = e;
			return -1;
		}
	}
	pl_export_fd(fd, why);
	return 0;
}

EXPORT int flock(int fd, int op)
{
	PL_INIT();
	if (!real_flock) {
		void *f = next_sym("flock");
		memcpy(&real_flock, &f, sizeof(f));
	}
	if (!(op & LOCK_UN) && pl_get(fd)) {
		int rfd = open_real_at(fd);
		if (rfd >= 0) {
			int r = real_flock(rfd, op);   /* meets another process's flock, or waits for it */
			int e = errno;
			pl_real.close(rfd);   /* releases the probe's lock */
			if (r != 0) {
				pl_attach_real(fd, "flock finds it locked");
				errno = e;
				return -1;
			}
		}
		pl_export_fd(fd, "flock locks it");
	}
	return real_flock(fd, op);
}

EXPORT int lockf(int fd, int cmd, off_t len)
{
	PL_INIT();
	if (!real_lockf) {
		void *f = next_sym("lockf");
		memcpy(&real_lockf, &f, sizeof(f));
	}
	if ((cmd == F_LOCK || cmd == F_TLOCK) && pl_get(fd)) {
		/* lockf is a record lock from the current offset for len bytes (0: to the end). */
		struct flock l = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = lseek(fd, 0, SEEK_CUR), .l_len = len };
		if (pl_lock_aside(fd, cmd == F_LOCK ? F_SETLKW : F_SETLK, &l, "lockf locks it") != 0)
			return -1;
	}
	return real_lockf(fd, cmd, len);
}

EXPORT int lockf64(int fd, int cmd, off64_t len)
{
	return lockf(fd, cmd, (off_t)len);
}
