/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The HDF5 file driver rank files and exports are built with. It is sec2
 * (plain POSIX pread/pwrite on one fd) with two differences. A raw-data
 * write that the caller announced beforehand (io_defer_expect: this
 * pointer, this length) is recorded, not made. That is how codec frames and
 * LZ4 chunks reach io_uring: HDF5 must write a filtered chunk through
 * H5Dwrite_chunk to allocate and index it, and it allocates nothing before;
 * so the writer announces each chunk, HDF5 picks its offset, builds the
 * chunk index and "writes" it here, and write.c sends the bytes through
 * io_uring at that offset: frames in the bulk pass after the file is
 * closed, as uncompressed data, LZ4 chunks at once. And a write, truncate
 * or close that fails inside io_defer_close's H5Fclose is kept for the
 * caller, not returned to HDF5 (see io_defer.closing).
 *
 * Nothing else changes: a write that was not announced, metadata included,
 * is a pwrite as in sec2, and the file carries no driver information, so
 * every reader opens it with the default driver. Built against HDF5 1.10's
 * driver interface (Debian 12); the 1.14 fields are set where the headers
 * have them, but that build is untested.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <H5FDpublic.h>

#include "io_int.h"

struct defer_file {
	H5FD_t pub; /* first: HDF5 sees this */
	int fd;
	haddr_t eoa, eof;
	dev_t dev;
	ino_t ino;
	struct io_defer *d;
};

/* What H5Pset_driver copies into the file access list. */
struct defer_fapl {
	struct io_defer *d;
};

/* Largest offset a 64-bit off_t reaches, as sec2 has it. */
#define MAXADDR (((haddr_t)1 << (8 * sizeof(off_t) - 1)) - 1)

static H5FD_t *d_open(const char *name, unsigned flags, hid_t fapl, haddr_t maxaddr)
{
	if (!name || !*name || maxaddr == 0 || maxaddr == HADDR_UNDEF || maxaddr > MAXADDR)
		return NULL;
	int o = (flags & H5F_ACC_RDWR) ? O_RDWR : O_RDONLY;
	if (flags & H5F_ACC_TRUNC) o |= O_TRUNC;
	if (flags & H5F_ACC_CREAT) o |= O_CREAT;
	if (flags & H5F_ACC_EXCL) o |= O_EXCL;
	int fd = open(name, o | O_CLOEXEC, 0666);
	if (fd < 0)
		return NULL;
	struct stat st;
	struct defer_file *f = fstat(fd, &st) == 0 ? calloc(1, sizeof *f) : NULL;
	if (!f) {
		close(fd);
		return NULL;
	}
	const struct defer_fapl *fa = H5Pget_driver_info(fapl);
	f->fd = fd;
	f->eof = (haddr_t)st.st_size;
	f->dev = st.st_dev;
	f->ino = st.st_ino;
	f->d = fa ? fa->d : NULL;
	return &f->pub;
}

/* A failure while HDF5 closes the file: kept for the writer (see
 * io_defer.closing), not returned to HDF5. Otherwise -1 as usual. */
static herr_t failed(const struct defer_file *f)
{
	struct io_defer *d = f->d;
	if (!d || !d->closing)
		return -1;
	if (!d->close_errno)
		d->close_errno = errno ? errno : EIO;
	return 0;
}

static herr_t d_close(H5FD_t *file)
{
	struct defer_file *f = (struct defer_file *)file;
	int rc = close(f->fd) < 0 ? failed(f) : 0;
	free(f);
	return rc;
}

static int d_cmp(const H5FD_t *a, const H5FD_t *b)
{
	const struct defer_file *x = (const struct defer_file *)a, *y = (const struct defer_file *)b;
	if (x->dev != y->dev)
		return x->dev < y->dev ? -1 : 1;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	return 0;
}

static herr_t d_query(const H5FD_t *file, unsigned long *flags)
{
	(void)file;
	/* sec2's, less SWMR and the POSIX handle promise (no SWMR here). */
	*flags = H5FD_FEAT_AGGREGATE_METADATA | H5FD_FEAT_ACCUMULATE_METADATA | H5FD_FEAT_DATA_SIEVE |
		 H5FD_FEAT_AGGREGATE_SMALLDATA;
	return 0;
}

static haddr_t d_get_eoa(const H5FD_t *file, H5FD_mem_t type)
{
	(void)type;
	return ((const struct defer_file *)file)->eoa;
}

static herr_t d_set_eoa(H5FD_t *file, H5FD_mem_t type, haddr_t addr)
{
	(void)type;
	((struct defer_file *)file)->eoa = addr;
	return 0;
}

static haddr_t d_get_eof(const H5FD_t *file, H5FD_mem_t type)
{
	(void)type;
	return ((const struct defer_file *)file)->eof;
}

static herr_t d_get_handle(H5FD_t *file, hid_t fapl, void **handle)
{
	(void)fapl;
	*handle = &((struct defer_file *)file)->fd;
	return 0;
}

static herr_t d_read(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, void *buf)
{
	(void)type;
	(void)dxpl;
	struct defer_file *f = (struct defer_file *)file;
	if (addr == HADDR_UNDEF || addr + size > f->eoa)
		return -1;
	char *p = buf;
	while (size > 0) {
		ssize_t k = pread(f->fd, p, size, (off_t)addr);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -1;
		if (k == 0) {
			memset(p, 0, size); /* past the end of the file: zeros, as in sec2 */
			break;
		}
		p += k;
		size -= (size_t)k;
		addr += (haddr_t)k;
	}
	return 0;
}

static int record(struct io_defer *d, haddr_t addr, size_t size, const void *buf)
{
	if (d->n == d->cap) {
		size_t cap = d->cap ? 2 * d->cap : 64;
		struct io_deferred *v = realloc(d->v, cap * sizeof *v);
		if (!v)
			return -1;
		d->v = v;
		d->cap = cap;
	}
	d->v[d->n++] = (struct io_deferred){(uint64_t)addr, buf, size, d->want_region, d->want_frame};
	d->want = NULL;
	return 0;
}

static herr_t d_write(H5FD_t *file, H5FD_mem_t type, hid_t dxpl, haddr_t addr, size_t size, const void *buf)
{
	(void)dxpl;
	struct defer_file *f = (struct defer_file *)file;
	if (addr == HADDR_UNDEF || addr + size > f->eoa)
		return -1;
	struct io_defer *d = f->d;
	if (d && type == H5FD_MEM_DRAW && d->want && buf == d->want && size == d->want_len)
		return record(d, addr, size, buf) == 0 ? 0 : -1;
	const char *p = buf;
	haddr_t at = addr;
	for (size_t left = size; left > 0;) {
		ssize_t k = pwrite(f->fd, p, left, (off_t)at);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (k == 0)
				errno = ENOSPC;
			return failed(f);
		}
		p += k;
		left -= (size_t)k;
		at += (haddr_t)k;
	}
	if (addr + size > f->eof)
		f->eof = addr + size;
	return 0;
}

/* The file grows to its allocated end here even when its last bytes were a
 * recorded frame, so the bulk pass writes inside the file. */
static herr_t d_truncate(H5FD_t *file, hid_t dxpl, hbool_t closing)
{
	(void)dxpl;
	(void)closing;
	struct defer_file *f = (struct defer_file *)file;
	if (f->eoa == f->eof)
		return 0;
	if (ftruncate(f->fd, (off_t)f->eoa) < 0)
		return failed(f);
	f->eof = f->eoa;
	return 0;
}

static const H5FD_class_t defer_class = {
#ifdef H5FD_CLASS_VERSION /* HDF5 >= 1.14 (untested) */
	.version = H5FD_CLASS_VERSION,
	.value = 600, /* in the range HDF5 leaves to unregistered drivers */
#endif
	.name = "snapio-defer",
	.maxaddr = MAXADDR,
	.fc_degree = H5F_CLOSE_WEAK,
	.fapl_size = sizeof(struct defer_fapl),
	.open = d_open,
	.close = d_close,
	.cmp = d_cmp,
	.query = d_query,
	.get_eoa = d_get_eoa,
	.set_eoa = d_set_eoa,
	.get_eof = d_get_eof,
	.get_handle = d_get_handle,
	.read = d_read,
	.write = d_write,
	.truncate = d_truncate,
	.fl_map = H5FD_FLMAP_DICHOTOMY,
};

/* Registered once per HDF5 lifetime: H5close drops the ID. Callers hold the
 * io HDF5 lock. */
static hid_t driver_id = -1;

int io_defer_fapl(hid_t fapl, struct io_defer *d)
{
	if (driver_id < 0 || H5Iis_valid(driver_id) <= 0)
		driver_id = H5FDregister(&defer_class);
	if (driver_id < 0)
		return -1;
	struct defer_fapl fa = {d};
	return H5Pset_driver(fapl, driver_id, &fa) < 0 ? -1 : 0;
}

void io_defer_expect(struct io_defer *d, const void *src, size_t len, size_t region, uint32_t frame)
{
	d->want = src;
	d->want_len = len;
	d->want_region = region;
	d->want_frame = frame;
}

int io_defer_taken(struct io_defer *d)
{
	int taken = d->want == NULL;
	d->want = NULL;
	return taken;
}

int io_defer_close(hid_t f, struct io_defer *d)
{
	d->closing = 1;
	d->close_errno = 0;
	errno = 0;
	int rc = H5Fclose(f) < 0 ? -1 : 0;
	d->closing = 0;
	return d->close_errno ? d->close_errno : rc;
}
