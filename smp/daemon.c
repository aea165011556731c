/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapsmp's event loop: one thread, poll() over the listening socket, a
 * signalfd and every trainer connection. Requests are small and handled to
 * completion (a commit is a manifest write and a rename), so one thread
 * keeps the store's rules simple and race-free.
 *
 * Hostile input: connections are non-blocking and buffered, so a client
 * that sends half a header stalls only itself; every payload is parsed with
 * the bounded reader; a malformed message gets an error reply and the
 * connection is closed; nothing a client sends can touch a committed slot
 * other than through the retention rules in slots.c.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "base/busguard.h"
#include "daemon.h"
#include "files/files.h"
#include "snap/io.h"
#include "smp_internal.h"
#include "flush/persist.h"
#include "heal/meshscrub.h"
#include "heal/scrub.h"
#include "mesh/mesh.h"
#include "base/metrics.h"
#include "snap/wire.h"

#define SMP_MAX_CONNS 4096

/* ---- connections --------------------------------------------------------- */

static void on_readable(struct smp *m, struct conn *c)
{
	for (;;) {
		if (c->cap - c->len < 65536) {
			size_t cap = c->cap ? c->cap * 2 : 65536;
			if (cap > SNAP_WIRE_MAX + SNAP_WIRE_HDR + 65536)
				cap = SNAP_WIRE_MAX + SNAP_WIRE_HDR + 65536;
			uint8_t *p = cap > c->cap ? realloc(c->buf, cap) : NULL;
			if (!p) {
				smp_close_conn(m, c);
				return;
			}
			c->buf = p;
			c->cap = cap;
		}
		union {
			struct cmsghdr align;
			char b[CMSG_SPACE(sizeof(int) * 8)];
		} cb;
		struct iovec iov = { c->buf + c->len, c->cap - c->len };
		struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b, .msg_controllen = sizeof(cb.b) };
		ssize_t n = recvmsg(c->fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		/* Clients never pass descriptors: close any they try to plant. */
		for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); n > 0 && cm; cm = CMSG_NXTHDR(&msg, cm)) {
			if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
				size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
				for (size_t i = 0; i < k; i++) {
					int fd;
					memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
					close(fd);
				}
			}
		}
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			break;
		if (n <= 0) {
			smp_close_conn(m, c);
			return;
		}
		c->len += (size_t)n;
		while (!c->dead && c->len >= SNAP_WIRE_HDR) {
			struct snap_msg_hdr h;
			int rc = snap_wire_parse_hdr(c->buf, &h);
			if (rc) {
				smp_reply_err(c->fd, 0, rc, rc == SNAP_EFORMAT ? "bad magic or unsupported protocol version"
								       : "message longer than the protocol allows");
				smp_close_conn(m, c);
				return;
			}
			if (c->len < SNAP_WIRE_HDR + h.len)
				break;
			smp_dispatch(m, c, &h, c->buf + SNAP_WIRE_HDR);
			if (c->dead)
				return;
			memmove(c->buf, c->buf + SNAP_WIRE_HDR + h.len, c->len - SNAP_WIRE_HDR - h.len);
			c->len -= SNAP_WIRE_HDR + h.len;
		}
		if (c->dead)
			return;
	}
}

static void on_accept(struct smp *m)
{
	int fd = accept4(m->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
		smp_say(m, "refusing connection from uid %d (pid %d): only uid %d may use this store", (int)cred.uid,
		    (int)cred.pid, (int)geteuid());
		smp_reply_err(fd, SNAP_MSG_HELLO, SNAP_EPERM, "snapsmp serves only its own user");
		smp_metrics_count(SMP_CNT_REJECTED, NULL);
		close(fd);
		return;
	}
	if (m->nconns >= SMP_MAX_CONNS) {
		smp_reply_err(fd, SNAP_MSG_HELLO, SNAP_EBUSY, "snapsmp has too many connections");
		smp_metrics_count(SMP_CNT_REJECTED, NULL);
		close(fd);
		return;
	}
	struct conn *c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->fd = fd;
	c->next = m->conns;
	m->conns = c;
	m->nconns++;
}

static int listen_on(struct smp *m, char *err, size_t errlen)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(m->cfg->client.socket) >= sizeof(a.sun_path)) {
		snap_fmt(err, errlen, "socket path %s is longer than %zu bytes", m->cfg->client.socket, sizeof(a.sun_path) - 1);
		return SNAP_EINVAL;
	}
	strcpy(a.sun_path, m->cfg->client.socket);
	m->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	/* We hold the store lock, so an existing socket file is a dead daemon's. */
	unlink(m->cfg->client.socket);
	mode_t old = umask(077);
	int rc = m->lfd < 0 || bind(m->lfd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(m->lfd, 512) != 0;
	umask(old);
	if (rc) {
		snap_fmt(err, errlen, "cannot listen on %s: %s", m->cfg->client.socket, strerror(errno));
		return SNAP_EIO;
	}
	return 0;
}

/* The newest step each job already has on disk, so a restart does not re-flush it. */
static void load_persisted(struct smp *m)
{
	for (struct store_job *j = m->store->jobs; m->flusher && j; j = j->next) {
		struct snap_io_err e = { 0 };
		uint64_t step;
		if (snap_io_newest_step(m->cfg->flush_dir, j->name, &step, &e) == 0) {
			j->has_persisted = 1;
			j->persisted = step;
		}
		j->last_flush_ns = snap_now_ns();
	}
}

static int on_signal(struct smp *m)
{
	struct signalfd_siginfo si;
	if (read(m->sigfd, &si, sizeof(si)) != sizeof(si))
		return 0;
	if (si.ssi_signo == SIGUSR1) {
		persist_all(m, "SIGUSR1 (preemption notice)");
		snap_files_flush_all(m->files, "SIGUSR1 (preemption notice)");
		return 0;
	}
	int own = si.ssi_pid == (uint32_t)getpid();
	if (m->draining && (own || !m->drain_asked)) {
		/* The mesh thread's own SIGTERM (a peer ended the mesh) is no
		 * second signal, and neither is the first one from outside when
		 * the drain began with our own: a job's scancel or the mesh's
		 * launcher signals every node, and a node whose peer shut down
		 * first must still finish its flush (what the drain does here,
		 * flushing the captured files, needs no peer). */
		m->drain_asked |= !own;
		return !persist_busy(m) && !snap_files_busy(m->files);
	}
	if (m->draining)
		return 1;   /* a second signal from outside: stop now */
	smp_say(m, "signal %u: shutting down%s", si.ssi_signo, m->flusher ? " after flushing the newest steps" : "");
	m->draining = 1;
	m->drain_asked = !own;
	persist_all(m, "shutdown");
	snap_files_flush_all(m->files, "shutdown");
	return !persist_busy(m) && !snap_files_busy(m->files);
}

/* Open the store; in a mesh, rebuild what a relaunch lost, first global
 * view, mesh thread. */
static int serve_open_store(struct smp *m, int quiet, char *err, size_t errlen)
{
	const struct snap_smp_config *cfg = m->cfg;
	int rc = snap_store_open(&m->store, cfg->client.store, cfg->slots, cfg->mem_limit, 0,
				 quiet ? NULL : snap_smp_log, err, errlen);
	if (rc)
		return rc;
	/* The flush thread first: a mesh hands it work from its first round. */
	if (cfg->flush_dir[0] && ((rc = snap_flusher_start(&m->flusher, cfg, err, errlen)) ||
				  (m->mesh && (rc = snap_mesh_set_flush(m->mesh, m->flusher, cfg, err, errlen))))) {
		snap_store_close(m->store);
		m->store = NULL;
		return rc;
	}
	/* Before the mesh thread's warm-up and the scrub read mappings of files
	 * that may be cut underneath; after MPI_Init, whose own SIGBUS handler
	 * it keeps for any other fault. */
	smp_bus_guard_init();
	if (m->mesh && (rc = snap_mesh_start(m->mesh, &m->store, cfg->slots, cfg->mem_limit, quiet, err, errlen))) {
		snap_store_close(m->store);
		m->store = NULL;
		return rc;
	}
	return 0;
}

/* --metrics-file: the writer starts before the threads that record into it
 * (flush, mesh). The node label: SLURM's name for the node where it runs
 * (several fake nodes share a host name), else the host name. */
static int serve_metrics(struct smp *m, char *err, size_t errlen)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	m->metrics_start_s = (double)ts.tv_sec + ts.tv_nsec / 1e9;
	if (!m->cfg->metrics_file[0])
		return 0;
	char host[256] = "";
	const char *node = getenv("SLURMD_NODENAME");
	if (!node || !*node) {
		if (gethostname(host, sizeof(host) - 1) != 0)
			snprintf(host, sizeof(host), "unknown");
		node = host;
	}
	return smp_metrics_start(m->cfg->metrics_file, node, m->mesh ? snap_mesh_rank(m->mesh) : -1, err, errlen);
}

/* The signals the poll loop takes through a signalfd. */
static void serve_signals(sigset_t *set)
{
	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	sigaddset(set, SIGUSR1);
}

/* Signals through a signalfd, the listening socket. */
static int serve_listen(struct smp *m, char *err, size_t errlen)
{
	sigset_t set;
	serve_signals(&set);
	m->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	int rc = 0;
	if (m->sigfd < 0 || (rc = listen_on(m, err, errlen))) {
		if (!rc)
			snap_fmt(err, errlen, "signalfd: %s", strerror(errno));
		return rc ? rc : SNAP_EIO;
	}
	return 0;
}

/* Captured files and what is already persisted, then say what is served. */
static int serve_load(struct smp *m, char *err, size_t errlen)
{
	const struct snap_smp_config *cfg = m->cfg;
	/* The mesh thread runs already: the store is shared from here on. */
	snap_mesh_lock(m->mesh);
	int rc = snap_files_open(&m->files, m->store, cfg, err, errlen);
	if (rc) {
		snap_mesh_unlock(m->mesh);
		return rc;
	}
	load_persisted(m);
	smp_say(m, "serving store %s on %s (%u slots per rank, budget %" PRIu64 " bytes, %" PRIu64 " in use)%s%s",
		cfg->client.store, cfg->client.socket, cfg->slots, cfg->mem_limit, m->store->mem_used,
		cfg->flush_dir[0] ? ", flushing to " : "", cfg->flush_dir);
	snap_mesh_unlock(m->mesh);
	char why[160];
	int huge = snap_store_hugepages(cfg->client.store, why, sizeof(why));
	if (huge == 1)
		smp_say(m, "store %s gets huge pages (%s)", cfg->client.store, why);
	else if (huge == 0)
		smp_say(m, "store %s gets no huge pages (%s): every process that maps a slot afresh (a protect, the "
			"rebuild at relaunch, a relaunched trainer's restore) faults it in 4 KiB at a time; a tmpfs "
			"mounted with -o huge=within_size made them 1.3-2x faster (docs/deploy.md, \"Huge pages\")",
			cfg->client.store, why);
	return 0;
}

enum { SMP_POLL_FIXED = 5 };   /* signalfd, listening socket, flusher, captured-file flusher, mesh */

/* The poll set: the fixed descriptors, then one per connection (pc[k]). */
static unsigned poll_set(struct smp *m, struct pollfd *pfd, struct conn **pc)
{
	pfd[0] = (struct pollfd){ .fd = m->sigfd, .events = POLLIN };
	pfd[1] = (struct pollfd){ .fd = m->draining ? -1 : m->lfd, .events = POLLIN };
	pfd[2] = (struct pollfd){ .fd = m->flusher ? snap_flusher_fd(m->flusher) : -1, .events = POLLIN };
	pfd[3] = (struct pollfd){ .fd = snap_files_fd(m->files), .events = POLLIN };
	pfd[4] = (struct pollfd){ .fd = snap_mesh_fd(m->mesh), .events = POLLIN };
	unsigned k = SMP_POLL_FIXED;
	for (struct conn *c = m->conns; c; c = c->next, k++) {
		pfd[k] = (struct pollfd){ .fd = c->fd, .events = POLLIN };
		pc[k] = c;
	}
	return k;
}

/* [mesh lock held] One round of events. Returns 1 when the daemon stops. */
static int serve_events(struct smp *m, const struct pollfd *pfd, struct conn *const *pc, unsigned k)
{
	int stop = 0;
	if (pfd[0].revents && on_signal(m))
		stop = 1;
	for (unsigned i = SMP_POLL_FIXED; i < k; i++)
		if (pfd[i].revents && !pc[i]->dead)
			on_readable(m, pc[i]);
	if (pfd[1].revents)
		on_accept(m);
	if (pfd[2].revents)
		persist_collect(m);
	if (pfd[3].revents)
		snap_files_collect(m);
	if (pfd[4].revents) {
		uint64_t n;
		if (read(pfd[4].fd, &n, sizeof(n)) < 0 && errno != EAGAIN)
			smp_say(m, "reading the mesh's eventfd: %s", strerror(errno));
		persist_mesh_update(m);
	}
	persist_tick(m);
	smp_export_tick(m);
	if (!m->draining)
		smp_scrub_tick(m);
	if (m->draining && !persist_busy(m) && !snap_files_busy(m->files))
		stop = 1;
	return stop;
}

/* [mesh lock held] Free the connections closed in this round. */
static void reap_conns(struct smp *m)
{
	for (struct conn **pp = &m->conns; *pp;) {
		if ((*pp)->dead) {
			struct conn *d = *pp;
			*pp = d->next;
			free(d);
			m->nconns--;
		} else {
			pp = &(*pp)->next;
		}
	}
}

/* Until a signal (or a peer's stop, in a mesh) ends it. 0, or an error. */
static int serve_loop(struct smp *m, char *err, size_t errlen)
{
	struct pollfd *pfd = NULL;
	struct conn **pc = NULL;
	int rc = 0;
	for (int stop = 0; !stop;) {
		unsigned n = SMP_POLL_FIXED + m->nconns;
		struct pollfd *np = realloc(pfd, n * sizeof(*pfd));
		struct conn **nc = realloc(pc, n * sizeof(*pc));
		if (np)
			pfd = np;
		if (nc)
			pc = nc;
		if (!np || !nc) {
			snap_fmt(err, errlen, "out of memory");
			rc = SNAP_ENOMEM;
			break;
		}
		unsigned k = poll_set(m, pfd, pc);
		/* Draining: the scrub has stopped, and must not keep the poll from sleeping. */
		int wait = smp_export_timeout_ms(m, persist_timeout_ms(m));
		int scrub = m->draining ? -1 : smp_scrub_timeout_ms(m->scrub);
		if (scrub >= 0 && (wait < 0 || scrub < wait))
			wait = scrub;
		if (poll(pfd, k, wait) < 0 && errno != EINTR) {
			snap_fmt(err, errlen, "poll: %s", strerror(errno));
			rc = SNAP_EIO;
			break;
		}
		snap_mesh_lock(m->mesh); /* the mesh thread reads the store and pins slots */
		stop = serve_events(m, pfd, pc, k);
		reap_conns(m);
		snap_store_reap(m->store);   /* a slot reservation that failed is logged */
		snap_mesh_unlock(m->mesh);
	}
	free(pfd);
	free(pc);
	return rc;
}

/* Stop the mesh thread first: from then on this thread owns the store alone. */
static void serve_shutdown(struct smp *m)
{
	/* After a drain nothing is pending; after a second signal or an error
	 * the mesh must not wait for a flush. */
	snap_mesh_lock(m->mesh);
	int now = !m->store || persist_busy(m);
	snap_mesh_unlock(m->mesh);
	snap_mesh_stop(m->mesh, now);
	while (m->conns) {
		struct conn *c = m->conns;
		m->conns = c->next;
		if (!c->dead)
			smp_close_conn(m, c);
		free(c);
	}
	if (m->lfd >= 0) {
		close(m->lfd);
		unlink(m->cfg->client.socket);
	}
	if (m->sigfd >= 0)
		close(m->sigfd);
	snap_flusher_stop(m->flusher);
	smp_metrics_stop();
	snap_files_close(m->files);
	snap_store_close(m->store);
}

/* Tell snapsmp --detach's waiting parent that clients can connect now. */
static void say_ready(int ready_fd)
{
	if (ready_fd < 0)
		return;
	ssize_t n;
	do
		n = write(ready_fd, "1", 1);
	while (n < 0 && errno == EINTR);
	close(ready_fd);
}

int snap_smp_serve(const struct snap_smp_config *cfg, int quiet, struct snap_mesh *mesh, int ready_fd, int *serving,
		   char *err, size_t errlen)
{
	struct smp m = { .cfg = cfg, .lfd = -1, .sigfd = -1, .log = { .quiet = quiet, .node = -1 }, .mesh = mesh };
	/* Blocked before any thread starts (the flush thread does in
	 * serve_open_store): threads inherit the mask, so only the signalfd
	 * sees SIGTERM instead of its default action killing the process. */
	sigset_t set;
	serve_signals(&set);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	int rc = serve_metrics(&m, err, errlen);
	if (rc)
		return rc;
	rc = serve_open_store(&m, quiet, err, errlen);
	if (rc) {
		smp_metrics_stop();
		return rc;
	}
	if (!(rc = serve_listen(&m, err, errlen)) && !(rc = serve_load(&m, err, errlen))) {
		smp_heal_load(&m.heal, m.store);
		m.scrub = smp_scrub_new(&m);
		*serving = 1;
		say_ready(ready_fd);
		rc = serve_loop(&m, err, errlen);
	}
	smp_scrub_free(m.scrub);
	smp_mesh_scrub_free(&m);
	serve_shutdown(&m);
	return rc;
}
