/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The bulk byte mover: writes memory to known file offsets through io_uring
 * with up to qd writes of io_bytes in flight. With an O_DIRECT fd, the
 * 4096-aligned middle of every range goes direct (from the source when it is
 * aligned too, else through one of qd aligned bounce buffers) and the
 * unaligned head and tail go through the page cache with pwrite; without
 * one, every piece is a buffered io_uring write straight from the source.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "io_int.h"

struct req {
	int busy;
	int fd;
	const void *ptr;
	size_t len;
	uint64_t off;
	size_t tag;            /* the caller's tag of the range it belongs to */
	void *bounce;          /* lazily allocated, io_bytes, 4096-aligned */
};

struct io_uring_writer {
	struct io_uring ring;
	unsigned qd, inflight;
	size_t io_bytes;
	int fd_direct, fd_buf;
	int error;             /* first -errno */
	size_t error_tag;      /* tag of the range that failed first */
	size_t cur_tag;        /* tag of the range being queued */
	int poisoned;          /* a submit or a wait failed: rebuild the ring before reuse */
	int ring_ok;           /* ring is initialised */
	struct req *reqs;
};

/* How long a drain keeps retrying a failing wait (1 ms apart) before it
 * gives up with writes still in flight. */
#define DRAIN_TRIES 1000

struct io_uring_writer *io_uw_new(unsigned qd, size_t io_bytes, int *e)
{
	struct io_uring_writer *u = calloc(1, sizeof *u);
	*e = -ENOMEM;
	if (!u)
		return NULL;
	u->reqs = calloc(qd, sizeof *u->reqs);
	if (!u->reqs || (*e = io_uring_queue_init(qd, &u->ring, 0)) < 0) {
		free(u->reqs);
		free(u);
		return NULL;
	}
	u->ring_ok = 1;
	u->qd = qd;
	u->io_bytes = io_bytes;
	u->fd_direct = u->fd_buf = -1;
	return u;
}

void io_uw_free(struct io_uring_writer *u)
{
	if (!u)
		return;
	io_uw_drain(u);
	if (u->ring_ok)
		io_uring_queue_exit(&u->ring);
	/* Bounce buffers the kernel may still read from are leaked, not freed. */
	for (unsigned i = 0; i < u->qd && u->inflight == 0; i++)
		free(u->reqs[i].bounce);
	free(u->reqs);
	free(u);
}

/* After a failed submit the prepared SQE is still in the submission ring
 * (the next submit would send it, with an fd and pointer long gone), and
 * after a failed wait the ring's state is unknown: start from a new ring. */
static int rebuild(struct io_uring_writer *u)
{
	io_uw_drain(u);
	if (u->inflight > 0)
		return -EBUSY; /* the kernel may still use the old requests */
	if (u->ring_ok)
		io_uring_queue_exit(&u->ring);
	u->ring_ok = 0;
	for (unsigned i = 0; i < u->qd; i++)
		u->reqs[i].busy = 0;
	int rc = io_uring_queue_init(u->qd, &u->ring, 0);
	if (rc < 0)
		return rc;
	u->ring_ok = 1;
	u->poisoned = 0;
	return 0;
}

int io_uw_begin(struct io_uring_writer *u, int fd_direct, int fd_buf)
{
	int rc = u->poisoned ? rebuild(u) : 0;
	u->fd_direct = fd_direct;
	u->fd_buf = fd_buf;
	u->error = 0;
	u->error_tag = 0;
	return rc;
}

int io_uw_direct(const struct io_uring_writer *u)
{
	return u->fd_direct >= 0;
}

unsigned io_uw_inflight(const struct io_uring_writer *u)
{
	return u->inflight;
}

static void note(struct io_uring_writer *u, int e, size_t tag)
{
	if (!u->error) {
		u->error = e;
		u->error_tag = tag;
	}
}

size_t io_uw_error_tag(const struct io_uring_writer *u)
{
	return u->error_tag;
}

/* A short write finishes synchronously so the real errno (ENOSPC) shows. */
static void finish_short(struct io_uring_writer *u, struct req *r, size_t done)
{
	const char *p = (const char *)r->ptr + done;
	size_t left = r->len - done;
	uint64_t off = r->off + done;
	while (left > 0) {
		ssize_t k = pwrite(u->fd_buf, p, left, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			note(u, k < 0 ? -errno : -ENOSPC, r->tag);
			return;
		}
		p += k;
		left -= (size_t)k;
		off += (uint64_t)k;
	}
}

static int reap_one(struct io_uring_writer *u)
{
	struct io_uring_cqe *cqe;
	int rc;
	do
		rc = io_uring_wait_cqe(&u->ring, &cqe);
	while (rc == -EINTR);
	if (rc < 0) {
		note(u, rc, u->cur_tag);
		u->poisoned = 1;
		return rc;
	}
	struct req *r = io_uring_cqe_get_data(cqe);
	int res = cqe->res;
	io_uring_cqe_seen(&u->ring, cqe);
	if (res < 0)
		note(u, res, r->tag);
	else if ((size_t)res < r->len)
		finish_short(u, r, (size_t)res);
	r->busy = 0;
	u->inflight--;
	return 0;
}

static struct req *free_req(struct io_uring_writer *u)
{
	for (;;) {
		for (unsigned i = 0; i < u->qd; i++)
			if (!u->reqs[i].busy)
				return &u->reqs[i];
		if (reap_one(u) < 0)
			return NULL;
	}
}

static int submit(struct io_uring_writer *u, struct req *r)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	if (!sqe) {
		u->poisoned = 1;
		return -EBUSY; /* cannot happen: one sqe per free req */
	}
	io_uring_prep_write(sqe, r->fd, r->ptr, (unsigned)r->len, r->off);
	io_uring_sqe_set_data(sqe, r);
	r->busy = 1;
	u->inflight++;
	int rc = io_uring_submit(&u->ring);
	if (rc < 0) {
		/* Not taken by the kernel, but still queued in the ring: no
		 * submit may follow until the ring is rebuilt. */
		r->busy = 0;
		u->inflight--;
		u->poisoned = 1;
		return rc;
	}
	return 0;
}

static int sync_write(int fd, const void *src, size_t len, uint64_t off)
{
	const char *p = src;
	while (len > 0) {
		ssize_t k = pwrite(fd, p, len, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -ENOSPC;
		p += k;
		len -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

int io_uw_write(struct io_uring_writer *u, const void *src, size_t len, uint64_t off, uint32_t *crc,
		size_t tag)
{
	const char *s = src;
	u->cur_tag = tag;
	if (u->poisoned) {
		note(u, -EIO, tag);
		return u->error;
	}
	uint64_t end = off + len;
	uint64_t a = off, b = off;
	if (u->fd_direct >= 0) {
		a = (off + SNAP_IO_ALIGN - 1) / SNAP_IO_ALIGN * SNAP_IO_ALIGN;
		b = end / SNAP_IO_ALIGN * SNAP_IO_ALIGN;
		if (a >= b)
			a = b = end;
	}
	if (a > off) {
		*crc = io_crc_update(*crc, s, a - off);
		int rc = sync_write(u->fd_buf, s, a - off, off);
		if (rc) {
			note(u, rc, tag);
			return u->error;
		}
	}
	uint64_t mid_end = u->fd_direct >= 0 ? b : end;
	for (uint64_t p = a; p < mid_end && !u->error;) {
		size_t k = mid_end - p < u->io_bytes ? mid_end - p : u->io_bytes;
		const char *from = s + (p - off);
		struct req *r = free_req(u);
		if (!r)
			break;
		*crc = io_crc_update(*crc, from, k);
		r->fd = u->fd_direct >= 0 ? u->fd_direct : u->fd_buf;
		r->len = k;
		r->off = p;
		r->tag = tag;
		if (u->fd_direct >= 0 && ((uintptr_t)from % SNAP_IO_ALIGN) != 0) {
			if (!r->bounce && posix_memalign(&r->bounce, SNAP_IO_ALIGN, u->io_bytes) != 0) {
				r->bounce = NULL;
				note(u, -ENOMEM, tag);
				return u->error;
			}
			memcpy(r->bounce, from, k);
			r->ptr = r->bounce;
		} else {
			r->ptr = from;
		}
		int rc = submit(u, r);
		if (rc) {
			note(u, rc, tag);
			return u->error;
		}
		p += k;
	}
	if (u->error)
		return u->error;
	if (u->fd_direct >= 0 && end > b && b >= a) {
		*crc = io_crc_update(*crc, s + (b - off), end - b);
		int rc = sync_write(u->fd_buf, s + (b - off), end - b, b);
		if (rc) {
			note(u, rc, tag);
			return u->error;
		}
	}
	return 0;
}

/* Walks a list of pieces that lie back to back in the file. */
struct cursor {
	const struct io_piece *pc;
	size_t n, i, at; /* piece i, byte at of it */
};

/* Copies the next k bytes into dst, updating the pieces' CRCs. */
static void take(struct cursor *c, char *dst, size_t k)
{
	while (k > 0) {
		const struct io_piece *p = &c->pc[c->i];
		size_t m = p->len - c->at < k ? p->len - c->at : k;
		const char *src = (const char *)p->src + c->at;
		if (p->crc)
			*p->crc = io_crc_update(*p->crc, src, m);
		memcpy(dst, src, m);
		dst += m;
		k -= m;
		if ((c->at += m) == p->len) {
			c->i++;
			c->at = 0;
		}
	}
}

/* The next k bytes of the run, for file offset at, through a small buffer
 * and pwrite. */
static int take_sync(struct io_uring_writer *u, struct cursor *c, uint64_t at, size_t k)
{
	char buf[SNAP_IO_ALIGN];
	while (k > 0) {
		size_t m = k < sizeof buf ? k : sizeof buf, tag = c->pc[c->i].tag;
		take(c, buf, m);
		int rc = sync_write(u->fd_buf, buf, m, at);
		if (rc) {
			note(u, rc, tag);
			return rc;
		}
		at += m;
		k -= m;
	}
	return 0;
}

int io_uw_write_pieces(struct io_uring_writer *u, const struct io_piece *pc, size_t n, uint64_t off)
{
	uint64_t end = off;
	for (size_t i = 0; i < n; i++)
		end += pc[i].len;
	if (n == 0 || u->poisoned || u->fd_direct < 0) {
		/* Buffered: each piece at its offset, nothing to gain by merging. */
		uint64_t at = off;
		for (size_t i = 0; i < n; i++) {
			uint32_t ignore = 0;
			int rc = io_uw_write(u, pc[i].src, pc[i].len, at, pc[i].crc ? pc[i].crc : &ignore, pc[i].tag);
			if (rc)
				return rc;
			at += pc[i].len;
		}
		return 0;
	}
	uint64_t a = (off + SNAP_IO_ALIGN - 1) / SNAP_IO_ALIGN * SNAP_IO_ALIGN, b = end / SNAP_IO_ALIGN * SNAP_IO_ALIGN;
	if (a >= b)
		a = b = end;
	struct cursor c = {pc, n, 0, 0};
	while (c.i < n && pc[c.i].len == 0)
		c.i++;
	if (a > off && take_sync(u, &c, off, (size_t)(a - off)))
		return u->error;
	for (uint64_t p = a; p < b && !u->error;) {
		size_t k = b - p < u->io_bytes ? (size_t)(b - p) : u->io_bytes;
		u->cur_tag = pc[c.i].tag;
		struct req *r = free_req(u);
		if (!r)
			break;
		if (!r->bounce && posix_memalign(&r->bounce, SNAP_IO_ALIGN, u->io_bytes) != 0) {
			r->bounce = NULL;
			note(u, -ENOMEM, pc[c.i].tag);
			return u->error;
		}
		r->tag = pc[c.i].tag;
		take(&c, r->bounce, k);
		r->ptr = r->bounce;
		r->fd = u->fd_direct;
		r->len = k;
		r->off = p;
		int rc = submit(u, r);
		if (rc) {
			note(u, rc, r->tag);
			return u->error;
		}
		p += k;
	}
	if (u->error)
		return u->error;
	if (end > b && b >= a && take_sync(u, &c, b, (size_t)(end - b)))
		return u->error;
	return 0;
}

int io_uw_drain(struct io_uring_writer *u)
{
	/* A failed wait leaves the writes in flight, and their fds and
	 * buffers must outlive them: keep waiting (the failure is recorded). */
	for (unsigned fails = 0; u->inflight > 0 && u->ring_ok && fails < DRAIN_TRIES;) {
		if (reap_one(u) == 0) {
			fails = 0;
		} else {
			fails++;
			usleep(1000);
		}
	}
	return u->error;
}
