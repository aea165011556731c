/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The exported interposers. Each one is a thin shell: initialize once, ask
 * files.c whether the call concerns a captured file, else call the real
 * function. Descriptor calls on non-captured files cost one table load;
 * path calls one prefix comparison. The list covers what CPython,
 * libstdc++ (torch.save: fopen64, writev, write, fclose) and glibc's
 * fortified callers (__open_2, __openat_2) use; lseek, read, pread, fstat,
 * mmap and fsync need no hook: a captured descriptor is the store's own
 * file, and they act on it natively.
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

/* ---- writes -------------------------------------------------------------- */

static uint64_t iov_len(const struct iovec *iov, int cnt)
{
	uint64_t n = 0;
	for (int i = 0; i < cnt; i++)
		n += iov[i].iov_len;
	return n;
}

#define WRITE_HOOK(call, off, n)                                                 \
	PL_INIT();                                                               \
	struct pl_file *p = pl_get(fd);                                          \
	if (__builtin_expect(p == NULL, 1))                                      \
		return call;                                                     \
	pl_prewrite(p, fd, (off), (n));                                          \
	ssize_t r = call;                                                        \
	if (r < 0 && errno == ENOSPC && pl_write_failed(p, fd))                  \
		r = call;                                                        \
	return r

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	WRITE_HOOK(pl_real.write(fd, buf, n), -1, n);
}

EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
	WRITE_HOOK(pl_real.pwrite(fd, buf, n, off), off, n);
}

EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
	WRITE_HOOK(pl_real.pwrite(fd, buf, n, off), off, n);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	WRITE_HOOK(pl_real.writev(fd, iov, cnt), -1, iov_len(iov, cnt));
}

EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	WRITE_HOOK(pl_real.pwritev(fd, iov, cnt, off), off, iov_len(iov, cnt));
}

EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
	WRITE_HOOK(pl_real.pwritev(fd, iov, cnt, off), off, iov_len(iov, cnt));
}

EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	WRITE_HOOK(pl_real.pwritev2(fd, iov, cnt, off, flags), off, iov_len(iov, cnt));
}

EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
	WRITE_HOOK(pl_real.pwritev2(fd, iov, cnt, off, flags), off, iov_len(iov, cnt));
}

/* The most a copy from `in` can write: a regular input has only so many
 * bytes left, and programs ask for far more (cp's copy_file_range asks for
 * nearly SSIZE_MAX, which would otherwise be reserved). */
static size_t copy_len(int in, const off64_t *off, size_t count)
{
	struct stat st;
	if (fstat(in, &st) != 0 || !S_ISREG(st.st_mode))
		return count;
	off64_t pos = off ? *off : lseek64(in, 0, SEEK_CUR);
	if (pos < 0 || pos >= st.st_size)
		return 0;
	uint64_t left = (uint64_t)(st.st_size - pos);
	return left < count ? (size_t)left : count;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	int fd = out;   /* the offset is the input's */
	WRITE_HOOK(pl_real.sendfile(out, in, off, count), -1, copy_len(in, off, count));
}

EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t count)
{
	int fd = out;
	WRITE_HOOK(pl_real.sendfile(out, in, off, count), -1, copy_len(in, off, count));
}

EXPORT ssize_t copy_file_range(int in, off64_t *inoff, int out, off64_t *outoff, size_t len, unsigned flags)
{
	int fd = out;
	WRITE_HOOK(pl_real.copy_file_range(in, inoff, out, outoff, len, flags), outoff ? *outoff : -1,
		   copy_len(in, inoff, len));
}

EXPORT size_t fwrite(const void *buf, size_t size, size_t n, FILE *f)
{
	PL_INIT();
	struct pl_file *p = pl_get(fileno(f));
	if (__builtin_expect(p == NULL, 1))
		return pl_real.fwrite(buf, size, n, f);
	/* glibc's stream writes do not come back through write(): reserve here. */
	off_t pos = ftello(f);
	pl_prewrite(p, fileno(f), pos >= 0 ? pos : -1, (uint64_t)size * n);
	return pl_real.fwrite(buf, size, n, f);
}

EXPORT int ftruncate(int fd, off_t len)
{
	PL_INIT();
	struct pl_file *p = pl_get(fd);
	if (p && len > 0)
		pl_prewrite(p, fd, 0, (uint64_t)len);
	return pl_real.ftruncate(fd, len);
}

EXPORT int ftruncate64(int fd, off64_t len)
{
	return ftruncate(fd, len);
}

EXPORT int truncate(const char *path, off_t len)
{
	PL_INIT();
	if (pl_cfg.enabled) {
		int h, r = pl_truncate(path, len, &h);
		if (h)
			return r;
	}
	return pl_real.truncate(path, len);
}

EXPORT int truncate64(const char *path, off64_t len)
{
	return truncate(path, len);
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
