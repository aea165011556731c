/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * flock on captured files.
 *
 * A file being written into the store is the store's private copy, which no
 * other process opens: a lock on it would keep out nobody that a plain run's
 * lock keeps out (HDF5 locks every file it opens, and refuses a file another
 * process has open for writing). So a file being written moves to the real
 * file system at its path (pl_export_fd, one warning) and the real call locks
 * the file every other process opens.
 *
 * fcntl's record locks (and lockf, made of them) are not moved: SQLite takes
 * them after its open and takes a file whose inode changed under its
 * descriptor for a moved database (read-only from then on). They lock the
 * store's copy (docs/preload.md).
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
static flock_t real_flock;

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
