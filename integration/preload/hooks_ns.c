/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The exported interposers, namespace family: stat in every glibc spelling,
 * access, rename, unlink, rmdir. Path calls cost one prefix comparison
 * when the path is not captured.
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

/* ---- stat, access -------------------------------------------------------- */

static int do_stat(int dirfd, const char *path, struct stat *st, int flags)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_stat(dirfd, path, st, flags, &h);
		if (h)
			return r;
	}
	return pl_real.fstatat(dirfd, path, st, flags);
}

EXPORT int stat(const char *path, struct stat *st)
{
	return do_stat(AT_FDCWD, path, st, 0);
}

EXPORT int stat64(const char *path, struct stat64 *st)
{
	return do_stat(AT_FDCWD, path, (struct stat *)st, 0);
}

EXPORT int lstat(const char *path, struct stat *st)
{
	return do_stat(AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

EXPORT int lstat64(const char *path, struct stat64 *st)
{
	return do_stat(AT_FDCWD, path, (struct stat *)st, AT_SYMLINK_NOFOLLOW);
}

EXPORT int fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
	return do_stat(dirfd, path, st, flags);
}

EXPORT int fstatat64(int dirfd, const char *path, struct stat64 *st, int flags)
{
	return do_stat(dirfd, path, (struct stat *)st, flags);
}

/* The pre-2.33 glibc entry points that older binaries still call. */
int __xstat(int ver, const char *path, struct stat *st);
int __xstat64(int ver, const char *path, struct stat64 *st);
int __lxstat(int ver, const char *path, struct stat *st);
int __lxstat64(int ver, const char *path, struct stat64 *st);
int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags);
int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags);

static int do_xstat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_stat(dirfd, path, st, flags, &h);
		if (h)
			return r;
	}
	if (dirfd == AT_FDCWD && flags == 0 && pl_real.xstat)
		return pl_real.xstat(ver, path, st);
	if (dirfd == AT_FDCWD && flags == AT_SYMLINK_NOFOLLOW && pl_real.lxstat)
		return pl_real.lxstat(ver, path, st);
	if (pl_real.fxstatat)
		return pl_real.fxstatat(ver, dirfd, path, st, flags);
	return pl_real.fstatat(dirfd, path, st, flags);
}

EXPORT int __xstat(int ver, const char *path, struct stat *st)
{
	return do_xstat(ver, AT_FDCWD, path, st, 0);
}

EXPORT int __xstat64(int ver, const char *path, struct stat64 *st)
{
	return do_xstat(ver, AT_FDCWD, path, (struct stat *)st, 0);
}

EXPORT int __lxstat(int ver, const char *path, struct stat *st)
{
	return do_xstat(ver, AT_FDCWD, path, st, AT_SYMLINK_NOFOLLOW);
}

EXPORT int __lxstat64(int ver, const char *path, struct stat64 *st)
{
	return do_xstat(ver, AT_FDCWD, path, (struct stat *)st, AT_SYMLINK_NOFOLLOW);
}

EXPORT int __fxstatat(int ver, int dirfd, const char *path, struct stat *st, int flags)
{
	return do_xstat(ver, dirfd, path, st, flags);
}

EXPORT int __fxstatat64(int ver, int dirfd, const char *path, struct stat64 *st, int flags)
{
	return do_xstat(ver, dirfd, path, (struct stat *)st, flags);
}

EXPORT int statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_statx(dirfd, path, flags, mask, sx, &h);
		if (h)
			return r;
	}
	if (!pl_real.statx) {
		errno = ENOSYS;
		return -1;
	}
	return pl_real.statx(dirfd, path, flags, mask, sx);
}

EXPORT int access(const char *path, int mode)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_access(AT_FDCWD, path, mode, &h);
		if (h)
			return r;
	}
	return pl_real.faccessat(AT_FDCWD, path, mode, 0);
}

/* glibc's euidaccess reaches access past the PLT (sort checks its inputs with it). */
EXPORT int euidaccess(const char *path, int mode)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_access(AT_FDCWD, path, mode, &h);
		if (h)
			return r;
	}
	return pl_real.faccessat(AT_FDCWD, path, mode, AT_EACCESS);
}

EXPORT int eaccess(const char *path, int mode)
{
	return euidaccess(path, mode);
}

EXPORT int faccessat(int dirfd, const char *path, int mode, int flags)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_access(dirfd, path, mode, &h);
		if (h)
			return r;
	}
	return pl_real.faccessat(dirfd, path, mode, flags);
}

/* ---- names --------------------------------------------------------------- */

static int do_rename(int od, const char *old, int nd, const char *new, unsigned flags)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_rename(od, old, nd, new, flags, &h);
		if (h)
			return r;
	}
	if (flags)
		return pl_real.renameat2(od, old, nd, new, flags);
	return pl_real.renameat(od, old, nd, new);
}

EXPORT int rename(const char *old, const char *new)
{
	return do_rename(AT_FDCWD, old, AT_FDCWD, new, 0);
}

EXPORT int renameat(int od, const char *old, int nd, const char *new)
{
	return do_rename(od, old, nd, new, 0);
}

EXPORT int renameat2(int od, const char *old, int nd, const char *new, unsigned flags)
{
	return do_rename(od, old, nd, new, flags);
}

static int do_unlink(int dirfd, const char *path, int flags)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_unlink(dirfd, path, flags, &h);
		if (h)
			return r;
	}
	return pl_real.unlinkat(dirfd, path, flags);
}

EXPORT int unlink(const char *path)
{
	return do_unlink(AT_FDCWD, path, 0);
}

EXPORT int unlinkat(int dirfd, const char *path, int flags)
{
	return do_unlink(dirfd, path, flags);
}

EXPORT int rmdir(const char *path)
{
	return do_unlink(AT_FDCWD, path, AT_REMOVEDIR);
}
