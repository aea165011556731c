/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The exported interposers, directories: listings merged with the store,
 * the working directory (relative captured paths) and the umask (the mode
 * of a new store file).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- directories --------------------------------------------------------- */

EXPORT DIR *opendir(const char *path)
{
	PL_INIT();
	DIR *d = pl_real.opendir(path);
	char abs[PATH_MAX];
	if (d && pl_cfg.enabled && pl_resolve(AT_FDCWD, path, abs))
		pl_dir_opened(d, abs);
	return d;
}

EXPORT DIR *fdopendir(int fd)
{
	PL_INIT();
	DIR *d = pl_real.fdopendir(fd);
	struct pl_file *p = pl_get(fd);
	if (d && p && p->kind == PL_DIR)
		pl_dir_opened(d, p->path);
	return d;
}

EXPORT struct dirent64 *readdir64(DIR *d)
{
	PL_INIT();
	if (__builtin_expect(atomic_load_explicit(&pl_ndirs, memory_order_relaxed) == 0, 1))
		return pl_real.readdir64(d);
	return pl_readdir(d);
}

/* On LP64 glibc, struct dirent and struct dirent64 are the same record. */
_Static_assert(sizeof(struct dirent) == sizeof(struct dirent64), "dirent layouts differ");
EXPORT struct dirent *readdir(DIR *d)
{
	return (struct dirent *)readdir64(d);
}

EXPORT void rewinddir(DIR *d)
{
	PL_INIT();
	pl_real.rewinddir(d);
	if (atomic_load(&pl_ndirs))
		pl_dir_rewound(d);
}

EXPORT int closedir(DIR *d)
{
	PL_INIT();
	if (atomic_load(&pl_ndirs))
		pl_dir_closed(d);
	/* closedir closes its descriptor inside glibc, not through close(). */
	int fd = dirfd(d);
	struct pl_file *p = pl_get(fd) ? atomic_exchange(&pl_tab[fd], NULL) : NULL;
	int r = pl_real.closedir(d);
	if (p)
		pl_release(p, 0);
	return r;
}

EXPORT ssize_t getdents64(int fd, void *buf, size_t n)
{
	PL_INIT();
	struct pl_file *p = pl_get(fd);
	if (p && p->kind == PL_DIR)
		return pl_getdents(p, fd, buf, n);
	if (!pl_real.getdents64) {
		errno = ENOSYS;
		return -1;
	}
	return pl_real.getdents64(fd, buf, n);
}

EXPORT int chdir(const char *path)
{
	PL_INIT();
	int r = pl_real.chdir(path);
	if (r == 0 && pl_cfg.enabled)
		pl_cwd_update();
	return r;
}

EXPORT int fchdir(int fd)
{
	PL_INIT();
	int r = pl_real.fchdir(fd);
	if (r == 0 && pl_cfg.enabled)
		pl_cwd_update();
	return r;
}

EXPORT mode_t umask(mode_t m)
{
	PL_INIT();
	mode_t old = pl_real.umask(m);
	atomic_store(&pl_umask, m & 0777);
	return old;
}
