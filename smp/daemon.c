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
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "snap/buf.h"
#include "daemon.h"
#include "files.h"
#include "rehydrate.h"
#include "snap/io.h"
#include "smp_internal.h"
#include "snap/base.h"
#include "log.h"
#include "mesh.h"
#include "reply.h"
#include "snap/wire.h"

#define SMP_MAX_CONNS 4096

static void close_conn(struct smp *m, struct conn *c)
{
	snap_files_conn_closed(m->files, c);
	if (c->rank && c->rank->conn == c) {
		snap_store_release_owner(m->store, c->rank, c);
		c->rank->conn = NULL;
		c->job->connected--;
		smp_say(m, "job %s rank %u (pid %u) disconnected", c->job->name, c->rank->rank, c->pid);
	}
	close(c->fd);
	free(c->buf);
	c->dead = 1;
}

/* ---- requests ------------------------------------------------------------ */

static int on_hello(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, char *err)
{
	char job[SNAP_JOB_MAX + 1];
	snap_get_str(r, job, sizeof(job));
	uint32_t rank = snap_get_u32(r), world = snap_get_u32(r), pid = snap_get_u32(r);
	uint64_t gen = snap_get_u64(r);   /* the generation this process already belongs to; 0: none yet */
	char launch[sizeof(((struct store_job *)0)->launch)] = "";
	if (snap_rbuf_left(r))           /* optional: the client's SNAP_LAUNCH */
		snap_get_str(r, launch, sizeof(launch));
	/* A generation near 2^64 could only come from a broken or hostile
	 * client, and the counter must never wrap. */
	if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job) || world == 0 || rank >= world ||
	    world > (1u << 24) || gen > (UINT64_MAX >> 1)) {
		snap_fmt(err, SMP_ERRLEN, "malformed HELLO (job name, rank %u, world %u or generation invalid)", rank, world);
		return SNAP_EPROTO;
	}
	if (c->job) {
		snap_fmt(err, SMP_ERRLEN, "HELLO sent twice on one connection");
		return SNAP_EPROTO;
	}
	struct store_job *j = snap_store_job(m->store, job, 1);
	struct store_rank *rk = j ? snap_store_rank(m->store, j, rank, 1) : NULL;
	if (!rk) {
		snap_fmt(err, SMP_ERRLEN, "cannot create store directories for job %s rank %u under %s: %s", job, rank,
			 m->store->root, strerror(errno));
		return SNAP_EIO;
	}
	if (rk->conn) {
		snap_fmt(err, SMP_ERRLEN, "job %s rank %u is already connected (pid %u)", job, rank, rk->pid);
		return SNAP_EBUSY;
	}
	/*
	 * A generation is an incarnation of the job's processes, so it changes
	 * only when processes do. A process that was already connected (to this
	 * daemon or to one that died) says which generation it belongs to and
	 * keeps it: after a daemon restart no rank is connected, and treating
	 * the first reconnecting rank as a new incarnation made its next save
	 * withdraw the live ranks' committed steps (issue 10). A process new to
	 * the daemon (gen 0) starts a new incarnation when no rank of the job is
	 * connected, and otherwise joins the running one -- unless it names the
	 * launch that started the running one (SNAP_LAUNCH): a rank of the same
	 * launch that starts after its peers exited is no relaunch, and a new
	 * incarnation would withdraw their committed steps.
	 */
	if (gen != 0 && gen >= j->gen) {
		if (gen > j->gen)   /* a generation a dead daemon started, of which nothing was committed */
			snap_store_set_generation(m->store, j, gen);
		/* A live incarnation rewound when it started: its saves must not
		 * announce a new one to the mesh (snap_store_rewind). */
		j->rewound_gen = gen;
	} else if (gen != 0) {
		smp_say(m, "job %s rank %u (pid %u) of generation %" PRIu64 " reconnected after generation %" PRIu64
		    " started; it joins the new one", job, rank, pid, gen, j->gen);
	} else if (j->connected == 0 && launch[0] && j->gen && !strcmp(launch, j->launch)) {
		smp_say(m, "job %s rank %u (pid %u) joins generation %" PRIu64 " of its launch %s", job, rank, pid, j->gen,
			launch);
	} else if (j->connected == 0) {
		snap_store_new_generation(m->store, j);
		snprintf(j->launch, sizeof(j->launch), "%s", launch);
	}
	j->connected++;
	rk->conn = c;
	rk->pid = pid;
	j->world = world;
	c->job = j;
	c->rank = rk;
	c->pid = pid;
	smp_say(m, "job %s rank %u/%u connected (pid %u)", job, rank, world, pid);
	snap_put_u32(out, m->store->nslots);
	snap_put_u64(out, m->store->mem_limit);
	snap_put_u64(out, m->store->mem_used);
	snap_put_u64(out, j->gen);
	return 0;
}

static int on_register(struct smp *m, struct conn *c, struct snap_rbuf *r, char *err)
{
	struct snap_layout lay;
	char why[512];
	int rc = snap_layout_decode(r, &lay, why, sizeof(why));
	if (rc) {
		snap_fmt(err, SMP_ERRLEN, "malformed layout: %s", why);
		return rc;
	}
	if (snap_rbuf_left(r)) {
		snap_layout_free(&lay);
		snap_fmt(err, SMP_ERRLEN, "REGISTER carries %zu trailing bytes", snap_rbuf_left(r));
		return SNAP_EPROTO;
	}
	rc = snap_store_register(m->store, c->job, c->rank, &lay, err, SMP_ERRLEN);
	snap_layout_free(&lay);
	return rc;
}

static int on_acquire(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, int *fd, char *err)
{
	uint64_t step = snap_get_u64(r);
	if (r->bad || snap_rbuf_left(r) || step == SNAP_STEP_LATEST) {
		snap_fmt(err, SMP_ERRLEN, "malformed ACQUIRE");
		return SNAP_EPROTO;
	}
	uint32_t slot;
	int rc = snap_store_acquire(m->store, c->job, c->rank, step, c, &slot, fd, err, SMP_ERRLEN);
	if (rc)
		return rc;
	snap_put_u32(out, slot);
	snap_put_u64(out, c->rank->layout.slot_bytes);
	return 0;
}

static int on_commit(struct smp *m, struct conn *c, struct snap_rbuf *r, int again, char *err)
{
	uint32_t slot = snap_get_u32(r);
	uint64_t step = snap_get_u64(r);
	uint32_t ncrc = snap_get_u32(r);
	if (r->bad || snap_rbuf_left(r) != (size_t)ncrc * 8) {
		/* EPROTO closes the connection, which frees the slots it was writing. */
		snap_fmt(err, SMP_ERRLEN, "malformed COMMIT (%u chunks announced, %zu bytes follow)", ncrc, snap_rbuf_left(r));
		return SNAP_EPROTO;
	}
	uint32_t *crc = malloc(sizeof(uint32_t) * (ncrc ? 2 * (size_t)ncrc : 1));
	if (!crc)
		return SNAP_ENOMEM;
	for (uint32_t i = 0; i < 2 * ncrc; i++)
		crc[i] = snap_get_u32(r);
	int rc = again ? snap_store_recommit(m->store, c->job, c->rank, c, slot, step, crc, crc + ncrc, ncrc,
					     m->cfg->verify_commit, err, SMP_ERRLEN)
		       : snap_store_commit(m->store, c->job, c->rank, c, slot, step, crc, crc + ncrc, ncrc,
					   m->cfg->verify_commit, err, SMP_ERRLEN);
	free(crc);
	if (rc == 0) {
		smp_logf(&m->log, SMP_LOG_DEBUG, "job %s rank %u committed step %" PRIu64 " (slot %u)", c->job->name,
			 c->rank->rank, step, slot);
		persist_on_commit(m, c->job);
	}
	return rc;
}

/* A step is restorable only when every rank of its world committed it. */
static int pick_restore(struct smp *m, struct conn *c, uint64_t want, uint32_t *slot, char *err)
{
	uint64_t latest;
	struct store_job *j = c->job;
	/* A job the relaunch could not rebuild falls back to disk, if any. */
	int lost = snap_mesh_job_error(m->mesh, j->name, err, SMP_ERRLEN);
	if (lost && (want != SNAP_STEP_LATEST || !m->cfg->flush_dir[0]))
		return lost;
	if (want == SNAP_STEP_LATEST && m->mesh && !snap_mesh_view_fresh(m->mesh, &c->restore_ticket)) {
		/* the client retries EBUSY: the answer comes from a view newer than this request */
		snap_fmt(err, SMP_ERRLEN, "job %s: waiting for an agreement round newer than this restore; retry", j->name);
		return SNAP_EBUSY;
	}
	int have = snap_store_latest(m->store, j, &latest) == 0;
	if (want == SNAP_STEP_LATEST) {
		if (!have && m->cfg->flush_dir[0]) {
			/* Nothing restorable in memory: fall back to the newest persisted step. */
			char lost_msg[SMP_ERRLEN];
			snprintf(lost_msg, sizeof(lost_msg), "%s", err);
			int rc = snap_rehydrate(m->cfg, m->store, j, c->rank, c, slot, err, SMP_ERRLEN);
			if (rc == 0)
				smp_say(m, "job %s rank %u: restoring persisted step %" PRIu64 " from %s (level: disk)%s", j->name,
				    c->rank->rank, c->rank->slots[*slot].step, m->cfg->flush_dir,
				    lost ? ", the mesh could not rebuild it" : ", nothing restorable in memory");
			if (rc != SNAP_ENOENT)
				return rc ? rc : snap_store_rewind(m->store, j, 1, c->rank->slots[*slot].step, err, SMP_ERRLEN);
			if (lost) {
				snap_fmt(err, SMP_ERRLEN, "%s; and no step of it is persisted in %s", lost_msg, m->cfg->flush_dir);
				return lost;
			}
		}
		if (!have) {
			/* Starting fresh: no older incarnation's partial step may join the new timeline. */
			int rc = snap_store_rewind(m->store, j, 0, 0, err, SMP_ERRLEN);
			if (rc)
				return rc;
			snap_fmt(err, SMP_ERRLEN, "job %s has no step committed by all of its ranks in store %s", j->name,
				 m->store->root);
			return SNAP_ENOENT;
		}
		want = latest;
	}
	struct store_slot *sl = snap_store_find(m->store, c->rank, want, slot);
	if (!sl) {
		snap_fmt(err, SMP_ERRLEN, "job %s rank %u has no committed snapshot of step %" PRIu64 " in store %s", j->name,
			 c->rank->rank, want, m->store->root);
		return SNAP_ENOENT;
	}
	/* A snapshot of a job with another number of ranks holds other shards:
	 * restoring it would hand this rank the wrong part of the model. */
	if (sl->man.world != j->world) {
		snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s was saved by a job of world size %u, this job has %u "
			 "ranks (world size mismatch; resharding is not supported: export the persisted step with "
			 "snaptool export and load it by global shape)", want, j->name, sl->man.world, j->world);
		return SNAP_EMISMATCH;
	}
	/* mesh: other nodes hold the other ranks; the agreement vouches for them. */
	if (m->mesh && !snap_mesh_step_complete(m->mesh, j->name, want)) {
		snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s is not globally complete in the mesh", want, j->name);
		return SNAP_ENOENT;
	}
	for (uint32_t r = 0; !m->mesh && r < sl->man.world; r++) {
		struct store_rank *rk = r < j->nranks ? j->ranks[r] : NULL;
		if (!snap_store_find(m->store, rk, want, NULL)) {
			snap_fmt(err, SMP_ERRLEN, "step %" PRIu64 " of job %s is incomplete: rank %u has not committed it", want,
				 j->name, r);
			return SNAP_ENOENT;
		}
	}
	return snap_store_rewind(m->store, j, 1, want, err, SMP_ERRLEN);
}

static int on_restore(struct smp *m, struct conn *c, struct snap_rbuf *r, struct snap_wbuf *out, int *fd, char *err)
{
	uint64_t want = snap_get_u64(r);
	if (r->bad || snap_rbuf_left(r)) {
		snap_fmt(err, SMP_ERRLEN, "malformed RESTORE");
		return SNAP_EPROTO;
	}
	uint32_t slot;
	int rc = pick_restore(m, c, want, &slot, err);
	if (rc)
		return rc;
	rc = snap_store_open_slot(m->store, c->job, c->rank, slot, err, SMP_ERRLEN);
	if (rc < 0)
		return rc;
	*fd = rc;
	snap_put_bytes(out, c->rank->slots[slot].man_bytes, c->rank->slots[slot].man_len);
	return 0;
}

static void dispatch(struct smp *m, struct conn *c, const struct snap_msg_hdr *h, const uint8_t *payload)
{
	struct snap_rbuf r;
	struct snap_wbuf out = { 0 };
	char err[SMP_ERRLEN] = "";
	int fd = -1, rc, deferred = 0;
	snap_rbuf_init(&r, payload, h->len);
	if (h->type == SNAP_MSG_FLUSH) {
		rc = persist_on_flush_msg(m, c, &r, err, &deferred);
	} else if (h->type >= SNAP_MSG_FATTACH && h->type <= SNAP_MSG_FFLUSH) {
		rc = snap_files_dispatch(m, c, h->type, &r, &out, err, SMP_ERRLEN, &deferred);
	} else if (h->type == SNAP_MSG_STATUS) {
		/* The daemon's own budget, for snaptool status (its defaults are not ours). */
		rc = 0;
		if (snap_rbuf_left(&r)) {
			snap_fmt(err, SMP_ERRLEN, "STATUS carries a payload");
			rc = SNAP_EPROTO;
		}
		snap_put_u64(&out, m->store->mem_limit);
		snap_put_u64(&out, m->store->mem_used);
		snap_put_u32(&out, m->store->nslots);
		snap_put_u32(&out, (uint32_t)getpid());
	} else if (h->type != SNAP_MSG_HELLO && !c->job) {
		snap_fmt(err, SMP_ERRLEN, "send HELLO first");
		rc = SNAP_EPROTO;
	} else {
		switch (h->type) {
		case SNAP_MSG_HELLO: rc = on_hello(m, c, &r, &out, err); break;
		case SNAP_MSG_REGISTER: rc = on_register(m, c, &r, err); break;
		case SNAP_MSG_ACQUIRE: rc = on_acquire(m, c, &r, &out, &fd, err); break;
		case SNAP_MSG_COMMIT: rc = on_commit(m, c, &r, 0, err); break;
		case SNAP_MSG_RECOMMIT: rc = on_commit(m, c, &r, 1, err); break;
		case SNAP_MSG_LATEST: {
			uint64_t step;
			rc = snap_mesh_job_error(m->mesh, c->job->name, err, SMP_ERRLEN);
			if (rc == 0)
				rc = snap_store_latest(m->store, c->job, &step);
			if (rc == SNAP_ELOST)
				break;
			if (rc == 0)
				snap_put_u64(&out, step);
			else
				snap_fmt(err, SMP_ERRLEN, "job %s has no step committed by all of its ranks", c->job->name);
			break;
		}
		case SNAP_MSG_RESTORE: rc = on_restore(m, c, &r, &out, &fd, err); break;
		default:
			snap_fmt(err, SMP_ERRLEN, "unknown message type %u", h->type);
			rc = SNAP_EPROTO;
		}
	}
	if (rc == 0 && out.oom) {
		rc = SNAP_ENOMEM;
		snap_fmt(err, SMP_ERRLEN, "snapsmp is out of memory");
	}
	if (rc == 0 && deferred) {
		/* answered when the flush ends (persist_collect) */
	} else if (rc == 0) {
		if (smp_reply_ok(c->fd, h->type, &out, fd) != 0)
			close_conn(m, c);
	} else {
		if (rc != SNAP_EBUSY)
			smp_say(m, "%s%s: %s", c->job ? "job " : c->fjob ? "captured files" : "peer", c->job ? c->job->name : "",
			    err);
		smp_reply_err(c->fd, h->type, rc, err);
		if (rc == SNAP_EPROTO || rc == SNAP_EFORMAT)
			close_conn(m, c);
	}
	if (fd >= 0)
		close(fd);
	snap_wbuf_free(&out);
}

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
				close_conn(m, c);
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
			close_conn(m, c);
			return;
		}
		c->len += (size_t)n;
		while (!c->dead && c->len >= SNAP_WIRE_HDR) {
			struct snap_msg_hdr h;
			int rc = snap_wire_parse_hdr(c->buf, &h);
			if (rc) {
				smp_reply_err(c->fd, 0, rc, rc == SNAP_EFORMAT ? "bad magic or unsupported protocol version"
								       : "message longer than the protocol allows");
				close_conn(m, c);
				return;
			}
			if (c->len < SNAP_WIRE_HDR + h.len)
				break;
			dispatch(m, c, &h, c->buf + SNAP_WIRE_HDR);
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
		close(fd);
		return;
	}
	if (m->nconns >= SMP_MAX_CONNS) {
		smp_reply_err(fd, SNAP_MSG_HELLO, SNAP_EBUSY, "snapsmp has too many connections");
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
	if (m->draining && si.ssi_pid == (uint32_t)getpid())
		/* The mesh thread's own SIGTERM (a peer ended the mesh) is no
		 * second signal: what the drain still does here, flushing the
		 * captured files, needs no peer. */
		return !persist_busy(m) && !snap_files_busy(m->files);
	if (m->draining)
		return 1;   /* a second signal: stop now */
	smp_say(m, "signal %u: shutting down%s", si.ssi_signo, m->flusher ? " after flushing the newest steps" : "");
	m->draining = 1;
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
	if (m->mesh && (rc = snap_mesh_start(m->mesh, &m->store, cfg->slots, cfg->mem_limit, quiet, err, errlen))) {
		snap_store_close(m->store);
		m->store = NULL;
		return rc;
	}
	return 0;
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
		if (poll(pfd, k, persist_timeout_ms(m)) < 0 && errno != EINTR) {
			snap_fmt(err, errlen, "poll: %s", strerror(errno));
			rc = SNAP_EIO;
			break;
		}
		snap_mesh_lock(m->mesh); /* the mesh thread reads the store and pins slots */
		stop = serve_events(m, pfd, pc, k);
		reap_conns(m);
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
			close_conn(m, c);
		free(c);
	}
	if (m->lfd >= 0) {
		close(m->lfd);
		unlink(m->cfg->client.socket);
	}
	if (m->sigfd >= 0)
		close(m->sigfd);
	snap_flusher_stop(m->flusher);
	snap_files_close(m->files);
	snap_store_close(m->store);
}

int snap_smp_serve(const struct snap_smp_config *cfg, int quiet, struct snap_mesh *mesh, char *err, size_t errlen)
{
	struct smp m = { .cfg = cfg, .lfd = -1, .sigfd = -1, .log = { .quiet = quiet, .node = -1 }, .mesh = mesh };
	/* Blocked before any thread starts (the flush thread does in
	 * serve_open_store): threads inherit the mask, so only the signalfd
	 * sees SIGTERM instead of its default action killing the process. */
	sigset_t set;
	serve_signals(&set);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	int rc = serve_open_store(&m, quiet, err, errlen);
	if (rc)
		return rc;
	if (!(rc = serve_listen(&m, err, errlen)) && !(rc = serve_load(&m, err, errlen)))
		rc = serve_loop(&m, err, errlen);
	serve_shutdown(&m);
	return rc;
}
