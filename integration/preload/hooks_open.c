/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The exported interposers, open/close family: open and its fortified and
 * stdio forms, close, fclose, and the dup family that shares a descriptor.
 * Each one is a thin shell: initialize once, ask capfiles.c whether the call
 * concerns a captured file, else call the real function. The other
 * families: hooks_io.c (writes), hooks_ns.c (stat, access, rename,
 * unlink), hooks_dir.c (listings, the working directory), filemeta.c (mode,
 * owner, times, links), spawn.c (fork, exec, the process's end).
 * docs/preload.md has the table.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

/* ---- open ---------------------------------------------------------------- */

static int do_open(int dirfd, const char *path, int flags, mode_t mode)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int handled, fd = pl_open(dirfd, path, flags, mode, &handled);
		if (handled)
			return fd;
	}
	return pl_real.openat(dirfd, path, flags, mode);
}

static mode_t va_mode(int flags, va_list ap)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE ? (mode_t)va_arg(ap, int) : 0;
}

EXPORT int open(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_mode(flags, ap);
	va_end(ap);
	return do_open(AT_FDCWD, path, flags, mode);
}

EXPORT int open64(const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_mode(flags, ap);
	va_end(ap);
	return do_open(AT_FDCWD, path, flags, mode);
}

EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_mode(flags, ap);
	va_end(ap);
	return do_open(dirfd, path, flags, mode);
}

EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	va_list ap;
	va_start(ap, flags);
	mode_t mode = va_mode(flags, ap);
	va_end(ap);
	return do_open(dirfd, path, flags, mode);
}

/*
 * _FORTIFY_SOURCE callers of open without a mode. With O_CREAT that is a bug
 * glibc's own __open_2 reports (and stops the program): let it.
 */
static int needs_mode(int flags)
{
	return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE;
}

EXPORT int __open_2(const char *path, int flags)
{
	PL_INIT();
	if (needs_mode(flags) && pl_real.open_2)
		return pl_real.open_2(path, flags);
	return do_open(AT_FDCWD, path, flags, 0);
}

EXPORT int __open64_2(const char *path, int flags)
{
	return __open_2(path, flags);
}

EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	PL_INIT();
	if (needs_mode(flags) && pl_real.openat_2)
		return pl_real.openat_2(dirfd, path, flags);
	return do_open(dirfd, path, flags, 0);
}

EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
	return __openat_2(dirfd, path, flags);
}

EXPORT int creat(const char *path, mode_t mode)
{
	return do_open(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

EXPORT int creat64(const char *path, mode_t mode)
{
	return do_open(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

/* fopen's mode string as open flags; glibc's own extensions "x" (O_EXCL) and "e" (O_CLOEXEC) included. */
static int mode_flags(const char *m, char *fdmode)
{
	int flags;
	switch (m[0]) {
	case 'r': flags = 0; break;
	case 'w': flags = O_CREAT | O_TRUNC; break;
	case 'a': flags = O_CREAT | O_APPEND; break;
	default: return -1;
	}
	int plus = 0;
	for (const char *c = m + 1; *c && *c != ','; c++) {
		if (*c == '+')
			plus = 1;
		else if (*c == 'x')
			flags |= O_EXCL;
		else if (*c == 'e')
			flags |= O_CLOEXEC;
	}
	flags |= plus ? O_RDWR : m[0] == 'r' ? O_RDONLY : O_WRONLY;
	fdmode[0] = m[0];
	fdmode[1] = plus ? '+' : '\0';
	fdmode[2] = '\0';
	return flags;
}

static FILE *do_fopen(const char *path, const char *mode, FILE *(*real)(const char *, const char *))
{
	PL_INIT();
	char abs[PATH_MAX], fdmode[4];
	int flags;
	if (!pl_cfg.enabled || !path || !mode || !pl_resolve(AT_FDCWD, path, abs) ||
	    (flags = mode_flags(mode, fdmode)) < 0)
		return real(path, mode);
	int handled, fd = pl_open(AT_FDCWD, path, flags, 0666, &handled);
	if (!handled)
		return real(path, mode);
	if (fd < 0)
		return NULL;
	FILE *f = pl_real.fdopen(fd, fdmode);
	if (!f) {
		int e = errno;
		close(fd);
		errno = e;
	}
	return f;
}

EXPORT FILE *fopen(const char *path, const char *mode)
{
	PL_INIT();
	return do_fopen(path, mode, pl_real.fopen);
}

EXPORT FILE *fopen64(const char *path, const char *mode)
{
	PL_INIT();
	return do_fopen(path, mode, pl_real.fopen64);
}

/* ---- close --------------------------------------------------------------- */

EXPORT int close(int fd)
{
	PL_INIT();
	struct pl_file *p = (unsigned)fd < PL_MAXFD && atomic_load_explicit(&pl_tab[fd], memory_order_relaxed)
				    ? atomic_exchange(&pl_tab[fd], NULL)
				    : NULL;
	int r = pl_real.close(fd);
	if (p) {
		int e = errno, c = pl_release(p, 0);
		if (r == 0 && c != 0)
			return -1;
		errno = e;
	}
	return r;
}

EXPORT int fclose(FILE *f)
{
	PL_INIT();
	int fd = fileno(f);
	struct pl_file *p = pl_get(fd) ? atomic_exchange(&pl_tab[fd], NULL) : NULL;
	int r = pl_real.fclose(f);
	if (p) {
		/* A failed final flush means the file is not what the program wrote: discard, report. */
		int e = errno, c = pl_release(p, r != 0);
		if (r == 0 && c != 0)
			return EOF;
		errno = e;
	}
	return r;
}

/* ---- descriptors --------------------------------------------------------- */

EXPORT int dup(int fd)
{
	PL_INIT();
	int r = pl_real.dup(fd);
	if (r >= 0 && pl_get(fd))
		pl_dup_track(fd, r);
	return r;
}

EXPORT int dup2(int fd, int to)
{
	PL_INIT();
	int r = pl_real.dup2(fd, to);
	if (r >= 0 && fd != to && (pl_get(fd) || pl_get(to)))
		pl_dup_track(fd, to);
	return r;
}

EXPORT int dup3(int fd, int to, int flags)
{
	PL_INIT();
	int r = pl_real.dup3(fd, to, flags);
	if (r >= 0 && (pl_get(fd) || pl_get(to)))
		pl_dup_track(fd, to);
	return r;
}

static int do_fcntl(int fd, int cmd, void *arg)
{
	PL_INIT();
	int r = pl_real.fcntl(fd, cmd, arg);
	if (r >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && pl_get(fd))
		pl_dup_track(fd, r);
	return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);   /* int or pointer: passed on as the same register */
	va_end(ap);
	return do_fcntl(fd, cmd, arg);
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return do_fcntl(fd, cmd, arg);
}

/* ---- temporaries ----------------------------------------------------------- */

/*
 * glibc's mkstemp family opens past the PLT: in a captured directory the
 * name is made here and opened through the hooks, so the temporary (sed -i,
 * zip, tempfile) is a store file like any other.
 */
static int do_mkstemp(char *tmpl, int suffixlen, int flags)
{
	PL_INIT();
	char abs[PATH_MAX];
	size_t len = tmpl ? strlen(tmpl) : 0;
	if (!pl_cfg.enabled || suffixlen < 0 || len < 6 + (size_t)suffixlen || !pl_resolve(AT_FDCWD, tmpl, abs)) {
		/* mkstemp(t) is mkostemps(t, 0, 0), and so on */
		int (*real)(char *, int, int) = NULL;
		void *p = dlsym(RTLD_NEXT, "mkostemps");
		memcpy(&real, &p, sizeof(p));
		return real(tmpl, suffixlen, flags);
	}
	char *x = tmpl + len - suffixlen - 6;
	if (memcmp(x, "XXXXXX", 6) != 0) {
		errno = EINVAL;
		return -1;
	}
	static const char set[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
	uint64_t v = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20) ^ (uint64_t)(uintptr_t)&v;
	for (int tries = 0; tries < 10000; tries++) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		v = v * 6364136223846793005ull + (uint64_t)ts.tv_nsec + 1442695040888963407ull;
		uint64_t r = v;
		for (int i = 0; i < 6; i++, r /= 62)
			x[i] = set[r % 62];
		int fd = do_open(AT_FDCWD, tmpl, O_RDWR | O_CREAT | O_EXCL | (flags & ~O_ACCMODE), 0600);
		if (fd >= 0 || errno != EEXIST)
			return fd;
	}
	errno = EEXIST;
	return -1;
}

EXPORT int mkstemp(char *tmpl)
{
	return do_mkstemp(tmpl, 0, 0);
}

EXPORT int mkstemp64(char *tmpl)
{
	return do_mkstemp(tmpl, 0, 0);
}

EXPORT int mkostemp(char *tmpl, int flags)
{
	return do_mkstemp(tmpl, 0, flags);
}

EXPORT int mkstemps(char *tmpl, int suffixlen)
{
	return do_mkstemp(tmpl, suffixlen, 0);
}

EXPORT int mkostemps(char *tmpl, int suffixlen, int flags)
{
	return do_mkstemp(tmpl, suffixlen, flags);
}
