/* SPDX-License-Identifier: BSD-3-Clause */
/* Message framing and descriptor passing; see wire.h. */
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "snap/buf.h"
#include "snap/base.h"
#include "snap/wire.h"

int snap_wire_parse_hdr(const void *b, struct snap_msg_hdr *h)
{
	struct snap_rbuf r;
	snap_rbuf_init(&r, b, SNAP_WIRE_HDR);
	h->magic = snap_get_u32(&r);
	h->version = snap_get_u16(&r);
	h->type = snap_get_u16(&r);
	h->len = snap_get_u32(&r);
	h->status = (int32_t)snap_get_u32(&r);
	if (h->magic != SNAP_WIRE_MAGIC || h->version != SNAP_WIRE_VERSION)
		return SNAP_EFORMAT;
	if (h->len > SNAP_WIRE_MAX)
		return SNAP_EPROTO;
	return 0;
}

void snap_wire_put_hdr(void *b, uint16_t type, int32_t status, uint32_t len)
{
	uint8_t *p = b;
	uint32_t v[4] = { SNAP_WIRE_MAGIC, SNAP_WIRE_VERSION | ((uint32_t)type << 16), len, (uint32_t)status };
	for (int i = 0; i < 4; i++)
		for (int k = 0; k < 4; k++)
			p[4 * i + k] = (uint8_t)(v[i] >> (8 * k));
}

int snap_wire_send(int sock, uint16_t type, int32_t status, const void *payload, uint32_t len, int pass_fd)
{
	uint8_t hdr[SNAP_WIRE_HDR];
	snap_wire_put_hdr(hdr, type, status, len);
	struct iovec iov[2] = { { hdr, sizeof(hdr) }, { (void *)payload, len } };
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(int))];
	} cbuf;
	struct msghdr msg = { .msg_iov = iov, .msg_iovlen = len ? 2 : 1 };
	if (pass_fd >= 0) {
		memset(&cbuf, 0, sizeof(cbuf));
		msg.msg_control = cbuf.buf;
		msg.msg_controllen = sizeof(cbuf.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
	}
	size_t total = sizeof(hdr) + len, sent = 0;
	while (sent < total) {
		ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN) {
				struct pollfd p = { .fd = sock, .events = POLLOUT };
				if (poll(&p, 1, 5000) <= 0)
					return SNAP_ESMP;
				continue;
			}
			return SNAP_ESMP;
		}
		sent += (size_t)n;
		/* The descriptor rides on the first byte only; advance the iovecs. */
		msg.msg_control = NULL;
		msg.msg_controllen = 0;
		while (n > 0 && msg.msg_iovlen > 0) {
			size_t take = (size_t)n < msg.msg_iov[0].iov_len ? (size_t)n : msg.msg_iov[0].iov_len;
			msg.msg_iov[0].iov_base = (char *)msg.msg_iov[0].iov_base + take;
			msg.msg_iov[0].iov_len -= take;
			n -= (ssize_t)take;
			if (msg.msg_iov[0].iov_len == 0) {
				msg.msg_iov++;
				msg.msg_iovlen--;
			}
		}
	}
	return 0;
}

/* Read exactly n bytes, collecting at most one passed descriptor. */
static int read_full(int sock, void *buf, size_t n, int *fd_got, uint64_t deadline_ns)
{
	size_t got = 0;
	while (got < n) {
		if (deadline_ns) {
			uint64_t now = snap_now_ns();
			int ms = now >= deadline_ns ? 0 : (int)((deadline_ns - now) / 1000000) + 1;
			struct pollfd p = { .fd = sock, .events = POLLIN };
			int pr = poll(&p, 1, ms);
			if (pr < 0 && errno == EINTR)
				continue;
			if (pr == 0)
				return SNAP_ETIMEDOUT;
			if (pr < 0)
				return SNAP_ESMP;
		}
		union {
			struct cmsghdr align;
			char buf[CMSG_SPACE(sizeof(int) * 4)];
		} cbuf;
		struct iovec iov = { (char *)buf + got, n - got };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
				      .msg_controllen = sizeof(cbuf.buf) };
		ssize_t r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return SNAP_ESMP;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < nfd; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				if (*fd_got < 0)
					*fd_got = fd;
				else
					close(fd);
			}
		}
		got += (size_t)r;
	}
	return 0;
}

int snap_wire_recv(int sock, struct snap_msg_hdr *h, void **payload, int *fd_out, int timeout_ms)
{
	uint8_t hdr[SNAP_WIRE_HDR];
	int fd = -1, rc;
	uint64_t deadline = timeout_ms >= 0 ? snap_now_ns() + (uint64_t)timeout_ms * 1000000ull : 0;
	*payload = NULL;
	if (fd_out)
		*fd_out = -1;
	if ((rc = read_full(sock, hdr, sizeof(hdr), &fd, deadline)))
		goto fail;
	if ((rc = snap_wire_parse_hdr(hdr, h)))
		goto fail;
	if (h->len) {
		*payload = malloc(h->len);
		if (!*payload) {
			rc = SNAP_ENOMEM;
			goto fail;
		}
		if ((rc = read_full(sock, *payload, h->len, &fd, deadline))) {
			free(*payload);
			*payload = NULL;
			goto fail;
		}
	}
	if (fd_out)
		*fd_out = fd;
	else if (fd >= 0)
		close(fd);
	return 0;
fail:
	if (fd >= 0)
		close(fd);
	return rc;
}
