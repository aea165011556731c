/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The exported interposers, read/write family. Descriptor calls on
 * non-captured files cost one table load. The list covers what CPython,
 * libstdc++ (torch.save: fopen64, writev, write, fclose) and coreutils use;
 * lseek, read, pread, fstat, mmap and fsync need no hook: a captured
 * descriptor is the store's own file, and they act on it natively.
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

static int on_store(int fd)
{
	struct stat a, b;
	return fstat(fd, &a) == 0 && stat(pl_cfg.data, &b) == 0 && a.st_dev == b.st_dev;
}

/* copy_file_range between file systems fails with EXDEV (Linux 5.19 on),
 * and a store file is on the store's file system, not the one the program
 * named: where a plain run copies within one file system, the preloaded one
 * would cross two. The copy is then done as read + write, with the call's
 * offset rules (the pointer's offset, else the descriptor's, moved on). */
static ssize_t copy_by_hand(int in, off64_t *inoff, int out, off64_t *outoff, size_t len)
{
	char buf[65536];
	size_t done = 0;
	while (done < len) {
		size_t want = len - done < sizeof buf ? len - done : sizeof buf;
		ssize_t r = inoff ? pread(in, buf, want, *inoff) : read(in, buf, want);
		if (r <= 0)
			return r < 0 && done == 0 ? -1 : (ssize_t)done;
		ssize_t w = 0;
		while (w < r) {
			ssize_t k = outoff ? pl_real.pwrite(out, buf + w, (size_t)(r - w), *outoff + w)
					   : pl_real.write(out, buf + w, (size_t)(r - w));
			if (k < 0)
				break;
			w += k;
		}
		if (inoff)
			*inoff += w;
		else if (w < r)
			lseek64(in, (off64_t)w - r, SEEK_CUR);   /* what was read but not written stays unread */
		if (outoff)
			*outoff += w;
		done += (size_t)w;
		if (w < r)
			return done ? (ssize_t)done : -1;
	}
	return (ssize_t)done;
}

static ssize_t copy_range(int in, off64_t *inoff, int out, off64_t *outoff, size_t len, unsigned flags, int captured)
{
	ssize_t r = pl_real.copy_file_range(in, inoff, out, outoff, len, flags);
	if (r < 0 && errno == EXDEV && flags == 0 && pl_cfg.enabled && (captured || on_store(in)))
		return copy_by_hand(in, inoff, out, outoff, len);
	return r;
}

EXPORT ssize_t copy_file_range(int in, off64_t *inoff, int out, off64_t *outoff, size_t len, unsigned flags)
{
	int fd = out;
	WRITE_HOOK(copy_range(in, inoff, out, outoff, len, flags, p != NULL), outoff ? *outoff : -1,
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
