/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh.c - `snapbench mesh`: erasure coding through the real daemons,
 * side by side in one run with the limits `snapbench ec` measures.
 *
 *   snapbench mesh [--k K] [--m M] [--nodes N] [--size BYTES] [--steps S] [--dir D] [--json]
 *
 * `mpiexec -np N snapsmp --ec K+M`, one store per simulated node under D
 * (default /dev/shm), and one trainer process per node (rank = node, a
 * libsnap context of its own) saving SIZE bytes per step.
 *
 * Protect. The trainers save one step at a time, and the next step starts
 * only once every node logged this one protected, so protects do not
 * compete with saves for the cores. Two figures per step: the daemons' own
 * protect time (the slowest node's log line: map + encode + publish and
 * agree) and save -> protected as the job sees it (from the moment the
 * trainers are told to save until the last node's line appears). The
 * first SLOTS + 1 steps are cold (each slot file is mapped once, and from
 * then on the previous protected step's parity file is reused,
 * docs/design.md "Protect"); the steady figures are medians of the rest.
 *
 * Rebuild. SIGKILL of the whole mesh, the stores of the first M nodes of
 * group 0 deleted, relaunch: the slowest rebuilt node's logged time, and
 * relaunch -> serving. Then a new trainer process per node (a relaunched
 * job) restores the newest step and checks every byte.
 *
 * Then `snapbench ec` with the same K, M and SIZE gives, in the same run,
 * MPI moving the same traffic (the target for protect: >= 0.7 of it), raw
 * ISA-L decode (the target for rebuild: >= 0.5 of it) and the library's
 * own end-to-end figures over warm buffers. Every rate is GB (1e9 bytes) of
 * protected data (N x SIZE) per second.
 *
 * The daemons' log goes to a file in $TMPDIR (default /tmp), removed after
 * a successful run and named in the error otherwise. SIGINT or SIGTERM stop
 * the run: the mesh and the trainers are killed and the stores removed.
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_proc.h"
#include "bench_util.h"
#include "snap/base.h"
#include "snap/ec.h"
#include "snap/snap.h"
#include "snapbench.h"

#define JOB "bench"
#define SLOTS 3
#define MAX_NODES 256
#define MAX_STEPS 1000
#define WAIT_S 600.0   /* for any one event: generous, a benchmark reports rather than races */

static volatile sig_atomic_t stop_sig;

static void on_signal(int sig)
{
	stop_sig = sig;
}

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void nap_ms(int ms)
{
	struct timespec ts = { 0, ms * 1000000L };
	nanosleep(&ts, NULL);
}

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "snapbench mesh: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* ------------------------------------------------------------------ */
/* The mesh: mpiexec in a session of its own                           */
/* ------------------------------------------------------------------ */

struct mesh {
	int k, m, nodes;
	char base[PATH_MAX];     /* node n's store: base/node<n> */
	char log[PATH_MAX];      /* the daemons' stdout and stderr */
	const char *dir;         /* --dir */
	int huge;                /* snap_store_hugepages(dir) */
	char fs[160];            /* and what decided it */
	char smp[PATH_MAX];
	const char *mpiexec;
	uint64_t mem_limit;
	pid_t pid;               /* mpiexec, leader of the session */
	char *text;              /* what the log holds so far */
	size_t len, cap;
	off_t read_at;
};

/* 0, or -1 when it does not fit (--dir is checked against that up front). */
static int node_path(const struct mesh *ms, int n, const char *leaf, char *out, size_t cap)
{
	int len = snprintf(out, cap, "%s/node%d%s%s", ms->base, n, leaf ? "/" : "", leaf ? leaf : "");
	return len < 0 || (size_t)len >= cap ? -1 : 0;
}

/* The start of /proc/PID/NAME into buf (NUL terminated); its length, 0 if unreadable. */
static size_t read_proc(pid_t pid, const char *name, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
	FILE *f = fopen(path, "r");
	size_t got = f ? fread(buf, 1, cap - 1, f) : 0;
	if (f)
		fclose(f);
	buf[got] = 0;
	return got;
}

/* Pids in mpiexec's session other than mpiexec itself, not zombies (Open MPI
 * moves its ranks into process groups of their own, but they stay in the
 * session). Returns how many were put in out (at most cap). */
static int session_pids(pid_t sid, pid_t *out, int cap)
{
	int n = 0;
	DIR *d = opendir("/proc");
	for (struct dirent *e; d && (e = readdir(d)) != NULL;) {
		char st[512];
		pid_t pid = (pid_t)atoi(e->d_name);
		if (pid <= 0 || pid == sid || !read_proc(pid, "stat", st, sizeof(st)))
			continue;
		char *rp = strrchr(st, ')'), state;
		int ppid, pgrp, session;
		if (rp && sscanf(rp + 2, "%c %d %d %d", &state, &ppid, &pgrp, &session) == 4 && session == sid &&
		    state != 'Z' && n < cap)
			out[n++] = pid;
	}
	if (d)
		closedir(d);
	return n;
}

static int mesh_alive(struct mesh *ms)
{
	int st;
	if (ms->pid <= 0)
		return 0;
	if (waitpid(ms->pid, &st, WNOHANG) == ms->pid) {
		ms->pid = 0;
		return 0;
	}
	return 1;
}

/* Open MPI's job id of the mesh, read from a rank's environment while it
 * runs; 0 if none can be read. */
static unsigned long mpi_jobid(const pid_t *pids, int n)
{
	for (int i = 0; i < n; i++) {
		char env[1 << 16];
		size_t got = read_proc(pids[i], "environ", env, sizeof(env));
		for (size_t at = 0; at < got; at += strlen(env + at) + 1)
			if (!strncmp(env + at, "OMPI_MCA_ess_base_jobid=", 24))
				return strtoul(env + at + 24, NULL, 10);
	}
	return 0;
}

/* A SIGKILLed Open MPI job leaves its shared-memory segments behind
 * (/dev/shm/vader_segment.HOST.UID.JOBID.RANK; only a clean exit removes
 * them): remove this mesh's. */
static void remove_mpi_segments(unsigned long jobid)
{
	char pat[128];
	glob_t g;
	if (!jobid)
		return;
	snprintf(pat, sizeof(pat), "/dev/shm/vader_segment.*.%u.%lx.*", (unsigned)geteuid(), jobid);
	if (glob(pat, 0, NULL, &g) == 0)
		for (size_t i = 0; i < g.gl_pathc; i++)
			unlink(g.gl_pathv[i]);
	globfree(&g);
}

/* SIGKILL of every node at once: mpiexec is stopped first, or seeing one
 * rank die it would SIGTERM the others, which would then shut down cleanly
 * instead of dying. Waits until no process of the session is left (the
 * nodes hold their stores' locks). */
static void mesh_kill(struct mesh *ms)
{
	if (ms->pid <= 0)
		return;
	kill(ms->pid, SIGSTOP);
	pid_t pids[4 * MAX_NODES];
	double t0 = mono();
	int n = session_pids(ms->pid, pids, 4 * MAX_NODES);
	unsigned long jobid = mpi_jobid(pids, n);
	for (; n > 0 && mono() - t0 < 30; n = session_pids(ms->pid, pids, 4 * MAX_NODES)) {
		for (int i = 0; i < n; i++)
			kill(pids[i], SIGKILL);
		nap_ms(10);
	}
	kill(ms->pid, SIGKILL);
	waitpid(ms->pid, NULL, 0);
	ms->pid = 0;
	remove_mpi_segments(jobid);
}

/* SIGTERM to the nodes (not mpiexec, which would SIGKILL them a second
 * later): each shuts down cleanly, and mpiexec exits once all have. */
static int mesh_stop(struct mesh *ms)
{
	pid_t pids[4 * MAX_NODES];
	int n = session_pids(ms->pid, pids, 4 * MAX_NODES);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGTERM);
	double t0 = mono();
	while (mesh_alive(ms) && mono() - t0 < WAIT_S)
		nap_ms(10);
	if (ms->pid > 0) {
		mesh_kill(ms);
		return -1;
	}
	return 0;
}

/* Start the mesh and wait until every node serves (a fresh socket: a
 * killed node leaves its old one, and a relaunch rebuilds before binding). */
static int mesh_start(struct mesh *ms)
{
	char sock[PATH_MAX + 16];
	for (int n = 0; n < ms->nodes; n++) {
		if (!node_path(ms, n, "smp.sock", sock, sizeof(sock)))
			unlink(sock);
	}
	int fd = open(ms->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		fail("cannot create the daemons' log %s: %s", ms->log, strerror(errno));
		return -1;
	}
	char np[16], ec[32], store[PATH_MAX + 16], slots[16], mem[32];
	snprintf(np, sizeof(np), "%d", ms->nodes);
	snprintf(ec, sizeof(ec), "%d+%d", ms->k, ms->m);
	snprintf(store, sizeof(store), "%s/node%%n", ms->base);
	snprintf(slots, sizeof(slots), "%d", SLOTS);
	snprintf(mem, sizeof(mem), "%" PRIu64, ms->mem_limit);
	pid_t pid = fork();
	if (pid < 0) {
		close(fd);
		fail("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		setsid();
		dup2(fd, 1);
		dup2(fd, 2);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		/* the daemons take every setting from their flags, none from a
		 * SNAP_* variable the caller happens to have (a flush directory) */
		extern char **environ;
		for (int again = 1; again;) {
			again = 0;
			for (char **e = environ; *e; e++)
				if (!strncmp(*e, "SNAP_", 5)) {
					char name[256];
					size_t l = strcspn(*e, "=");
					snprintf(name, sizeof(name), "%.*s", (int)l, *e);
					unsetenv(name);
					again = 1;
					break;
				}
		}
		if (geteuid() == 0) {
			setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
			setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
		}
		/* more ranks than cores here: spinning ranks would starve the others */
		setenv("OMPI_MCA_mpi_yield_when_idle", "1", 0);
		execlp(ms->mpiexec, ms->mpiexec, "-np", np, "--oversubscribe", ms->smp, "--ec", ec, "--store", store,
		       "--slots", slots, "--mem-limit", mem, "--log-level", "info", "--log", "stderr", (char *)NULL);
		fprintf(stderr, "snapbench mesh: cannot run %s: %s\n", ms->mpiexec, strerror(errno));
		_exit(127);
	}
	close(fd);
	ms->pid = pid;
	double t0 = mono();
	for (;;) {
		int up = 0;
		for (int n = 0; n < ms->nodes; n++) {
			struct stat st;
			up += !node_path(ms, n, "smp.sock", sock, sizeof(sock)) && stat(sock, &st) == 0 &&
			      S_ISSOCK(st.st_mode);
		}
		if (up == ms->nodes)
			return 0;
		if (!mesh_alive(ms) || stop_sig || mono() - t0 > WAIT_S) {
			if (!stop_sig)
				fail("the mesh did not start (%d of %d nodes serving); see %s", up, ms->nodes, ms->log);
			mesh_kill(ms);
			return -1;
		}
		nap_ms(5);
	}
}

/* Read what the log gained since the last call (complete lines only). */
static int log_refresh(struct mesh *ms)
{
	int fd = open(ms->log, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	for (;;) {
		if (ms->cap - ms->len < 65536) {
			size_t cap = ms->cap ? 2 * ms->cap : 1 << 20;
			char *t = realloc(ms->text, cap + 1);
			if (!t) {
				close(fd);
				return -1;
			}
			ms->text = t;
			ms->cap = cap;
		}
		ssize_t r = pread(fd, ms->text + ms->len, ms->cap - ms->len, ms->read_at);
		if (r <= 0)
			break;
		ms->len += (size_t)r;
		ms->read_at += r;
	}
	close(fd);
	/* keep a partial last line for the next call */
	size_t keep = ms->len;
	while (keep > 0 && ms->text[keep - 1] != '\n')
		keep--;
	ms->read_at -= (off_t)(ms->len - keep);
	ms->len = keep;
	ms->text[ms->len] = 0;
	return 0;
}

/* One node's "protected" line for step s. */
struct prot {
	uint64_t data, parity;
	double ms;
};

/* Every node's line for step s, in order of appearance; returns how many. */
static int find_protected(const struct mesh *ms, uint64_t s, struct prot *out, int cap)
{
	char pat[96];
	int n = 0, plen = snprintf(pat, sizeof(pat), "job " JOB " step %" PRIu64 " protected (group ", s);
	for (const char *p = ms->text ? strstr(ms->text, pat) : NULL; p && n < cap; p = strstr(p + plen, pat)) {
		int g, k, m;
		if (sscanf(p + plen, "%d, %d+%d, %" SCNu64 " data + %" SCNu64 " parity bytes here, %lf ms", &g, &k, &m,
			   &out[n].data, &out[n].parity, &out[n].ms) == 6)
			n++;
	}
	return n;
}

struct rebuilt {
	double ms, files, exchange, publish;
	uint64_t bytes;
};

static int find_rebuilt(const struct mesh *ms, uint64_t s, struct rebuilt *out, int cap)
{
	char pat[96];
	int n = 0, plen = snprintf(pat, sizeof(pat), "job " JOB " step %" PRIu64 ": rebuilt this lost node; ", s);
	for (const char *p = ms->text ? strstr(ms->text, pat) : NULL; p && n < cap; p = strstr(p + plen, pat)) {
		uint64_t chunks, corrupt;
		if (sscanf(p + plen, "%" SCNu64 " chunks rebuilt (%" SCNu64 " corrupt), %" SCNu64
			   " bytes written, CRCs verified, %lf ms (files %lf, exchange %lf, publish %lf)", &chunks,
			   &corrupt, &out[n].bytes, &out[n].ms, &out[n].files, &out[n].exchange, &out[n].publish) == 7)
			n++;
	}
	return n;
}

/* ------------------------------------------------------------------ */
/* Trainers: one process per node                                      */
/* ------------------------------------------------------------------ */

enum { T_READY = 1, T_DONE = 2, T_RESTORED = 3, T_FAILED = 4 };

struct tmsg {       /* child -> parent, one write (atomic on a pipe) */
	int rank, what, rc;
	uint64_t step;
	double secs;
};

/* What rank r holds at step s: different at every step and rank, so a
 * restore of the wrong step or node fails the check. */
static void fill(uint64_t *w, uint64_t words, int r, uint64_t s)
{
	uint64_t x = ((uint64_t)r << 48) ^ (s << 32);
	for (uint64_t i = 0; i < words; i++)
		w[i] = x ^ (i * 0x9E3779B97F4A7C15ull);
}

static uint64_t check(const uint64_t *w, uint64_t words, int r, uint64_t s)
{
	uint64_t x = ((uint64_t)r << 48) ^ (s << 32);
	for (uint64_t i = 0; i < words; i++)
		if (w[i] != (x ^ (i * 0x9E3779B97F4A7C15ull)))
			return i;
	return words;
}

static void tsend(int fd, int rank, int what, int rc, uint64_t step, double secs)
{
	struct tmsg t = { rank, what, rc, step, secs };
	if (write(fd, &t, sizeof(t)) != (ssize_t)sizeof(t))
		_exit(1);
}

/*
 * One trainer. steps > 0: for each step fill, say READY, wait for the go
 * byte, save and wait for the commit, say DONE. steps == 0: restore the
 * newest step (a relaunched job), check it is `last` and every byte, say
 * RESTORED.
 */
static int trainer(const struct mesh *ms, int rank, uint64_t size, int steps, uint64_t last, int gofd, int resfd)
{
	struct snap_config cfg;
	snap_config_init(&cfg);
	if (node_path(ms, rank, NULL, cfg.store, sizeof(cfg.store)))
		return 1;
	snprintf(cfg.job, sizeof(cfg.job), JOB);
	cfg.rank = rank;
	cfg.world_size = ms->nodes;
	cfg.copy_threads = 1;           /* as many trainers as nodes share this machine's cores */
	cfg.timeout_ms = 120000;
	uint64_t words = size / 8;
	uint64_t *buf = malloc(words * 8);
	int quiet = 0;
	snap_ctx *ctx = NULL;
	int rc = buf ? snap_open(&cfg, &ctx) : SNAP_ENOMEM;
	struct snap_region reg = { .name = "weights", .ptr = buf, .bytes = words * 8, .dtype = SNAP_DTYPE_U8 };
	if (!rc)
		rc = snap_register(ctx, &reg);
	for (int s = 1; !rc && s <= steps; s++) {
		fill(buf, words, rank, (uint64_t)s);
		tsend(resfd, rank, T_READY, 0, (uint64_t)s, 0);
		char go;
		if (read(gofd, &go, 1) != 1) {   /* the run was stopped: say nothing */
			quiet = 1;
			rc = SNAP_ESTATE;
			break;
		}
		double t0 = mono();
		rc = snap_save(ctx, (uint64_t)s);
		if (!rc)
			rc = snap_wait(ctx);
		if (!rc)
			tsend(resfd, rank, T_DONE, 0, (uint64_t)s, mono() - t0);
	}
	if (!rc && !steps) {
		uint64_t got = 0;
		memset(buf, 0, words * 8);
		double t0 = mono();
		rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
		double t = mono() - t0;
		uint64_t bad = rc ? 0 : check(buf, words, rank, last);
		if (!rc && (got != last || bad != words)) {
			fprintf(stderr, "snapbench mesh: rank %d restored step %" PRIu64 " (want %" PRIu64 "), first bad word %"
				PRIu64 " of %" PRIu64 "\n", rank, got, last, bad, words);
			tsend(resfd, rank, T_FAILED, 3, got, t);
			snap_close(ctx);
			return 3;
		}
		if (!rc)
			tsend(resfd, rank, T_RESTORED, 0, got, t);
	}
	if (rc && !quiet) {
		fprintf(stderr, "snapbench mesh: rank %d: %s\n", rank, ctx ? snap_errmsg(ctx) : snap_strerror(rc));
		tsend(resfd, rank, T_FAILED, rc, 0, 0);
	}
	if (ctx)
		snap_close(ctx);
	free(buf);
	return rc ? 1 : 0;
}

struct crew {
	int n;
	pid_t pid[MAX_NODES];
	int go[MAX_NODES];       /* write ends, parent -> trainer */
	int res;                 /* read end, every trainer -> parent */
	/* read while waiting for something else: a fast trainer's READY for
	 * the next step can come before a slow one's DONE for this one */
	struct tmsg early[2 * MAX_NODES];
	int nearly;
};

static void crew_end(struct crew *c, int kill_them)
{
	for (int i = 0; i < c->n; i++) {
		if (c->go[i] >= 0)
			close(c->go[i]);
		c->go[i] = -1;
		if (c->pid[i] > 0) {
			if (kill_them)
				kill(c->pid[i], SIGKILL);
			waitpid(c->pid[i], NULL, 0);
		}
		c->pid[i] = 0;
	}
	if (c->res >= 0)
		close(c->res);
	c->res = -1;
	c->n = 0;
}

/* Whether every trainer exited 0 (waits for them; their go pipes closed). */
static int crew_join(struct crew *c)
{
	int ok = 1;
	for (int i = 0; i < c->n; i++) {
		if (c->go[i] >= 0)
			close(c->go[i]);
		c->go[i] = -1;
		int st;
		if (c->pid[i] > 0 && waitpid(c->pid[i], &st, 0) == c->pid[i])
			ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
		c->pid[i] = 0;
	}
	crew_end(c, 0);
	return ok;
}

static int crew_start(struct crew *c, const struct mesh *ms, uint64_t size, int steps, uint64_t last)
{
	int res[2];
	c->n = 0;
	c->nearly = 0;
	c->res = -1;
	if (pipe2(res, O_CLOEXEC)) {
		fail("pipe: %s", strerror(errno));
		return -1;
	}
	c->res = res[0];
	fflush(NULL);
	for (int r = 0; r < ms->nodes; r++) {
		int go[2];
		if (pipe2(go, O_CLOEXEC)) {
			fail("pipe: %s", strerror(errno));
			break;
		}
		pid_t pid = fork();
		if (pid == 0) {
			signal(SIGINT, SIG_DFL);
			signal(SIGTERM, SIG_DFL);
			close(go[1]);
			close(res[0]);
			for (int i = 0; i < c->n; i++)
				close(c->go[i]);
			_exit(trainer(ms, r, size, steps, last, go[0], res[1]));
		}
		close(go[0]);
		if (pid < 0) {
			close(go[1]);
			fail("fork: %s", strerror(errno));
			break;
		}
		c->pid[c->n] = pid;
		c->go[c->n++] = go[1];
	}
	close(res[1]);
	if (c->n < ms->nodes) {
		crew_end(c, 1);
		return -1;
	}
	return 0;
}

/* Wait for one `what` message from every trainer about step s; secs gets
 * the largest `secs` they report. A failure, a trainer that died, the
 * mesh gone or a signal end the wait with -1. */
static int crew_collect(struct crew *c, struct mesh *ms, int what, uint64_t s, double *secs)
{
	int got = 0;
	double t0 = mono();
	*secs = 0;
	for (int i = 0; i < c->nearly;) {
		if (c->early[i].what == what && c->early[i].step == s) {
			got++;
			*secs = c->early[i].secs > *secs ? c->early[i].secs : *secs;
			c->early[i] = c->early[--c->nearly];
		} else {
			i++;
		}
	}
	while (got < c->n) {
		struct pollfd p = { c->res, POLLIN, 0 };
		int r = poll(&p, 1, 100);
		if (r > 0) {
			struct tmsg t;
			ssize_t n = read(c->res, &t, sizeof(t));
			if (n != (ssize_t)sizeof(t)) {
				fail("a trainer exited early (see its message above)");
				return -1;
			}
			if (t.what == T_FAILED) {
				fail("rank %d failed at step %" PRIu64 " (%s)", t.rank, s,
				     t.rc == 3 ? "restored bytes differ" : snap_strerror(t.rc));
				return -1;
			}
			if (t.what == what && t.step == s) {
				got++;
				*secs = t.secs > *secs ? t.secs : *secs;
			} else if (c->nearly < 2 * MAX_NODES) {
				c->early[c->nearly++] = t;
			} else {
				fail("unexpected message from rank %d", t.rank);
				return -1;
			}
			continue;
		}
		if (r < 0 && errno != EINTR)
			return -1;
		if (stop_sig || !mesh_alive(ms) || mono() - t0 > WAIT_S) {
			if (!stop_sig)
				fail("%d of %d trainers reported step %" PRIu64 "; %s", got, c->n, s,
				     mesh_alive(ms) ? "timed out" : "the mesh died");
			return -1;
		}
	}
	return 0;
}

/* Wait until every node logged step s protected. */
static int wait_protected(struct mesh *ms, uint64_t s, struct prot *lines)
{
	double t0 = mono();
	for (;;) {
		if (log_refresh(ms)) {
			fail("cannot read %s", ms->log);
			return -1;
		}
		if (find_protected(ms, s, lines, ms->nodes) >= ms->nodes)
			return 0;
		if (stop_sig || !mesh_alive(ms) || mono() - t0 > WAIT_S) {
			if (!stop_sig)
				fail("step %" PRIu64 " was not protected on every node; see %s", s, ms->log);
			return -1;
		}
		nap_ms(2);
	}
}

/* ------------------------------------------------------------------ */

static void usage(FILE *f)
{
	fprintf(f, "usage: snapbench mesh [--k K] [--m M] [--nodes N] [--size BYTES] [--steps S] [--dir D] [--json]\n"
		   "Erasure coding through the real daemons: mpiexec -np N snapsmp --ec K+M on this host, one\n"
		   "trainer per node saving BYTES per step, then the mesh SIGKILLed, M nodes' stores deleted and\n"
		   "rebuilt at relaunch; beside MPI moving the same bytes and raw ISA-L (snapbench ec), same run.\n"
		   "  --k, --m   group shape (default 3+1)\n"
		   "  --nodes    simulated nodes, >= K+M (default K+M)\n"
		   "  --size     bytes per node (default 256M)\n"
		   "  --steps    steps saved, >= %d: the first %d are cold (default 8)\n"
		   "  --dir      where the node stores go (default /dev/shm)\n"
		   "  --json     one JSON line instead of the table\n"
		   "snapsmp is found beside snapbench (or $SNAPSMP), mpiexec is $MPIEXEC or on PATH.\n",
		SLOTS + 2, SLOTS + 1);
}

static int parse_int(const char *opt, const char *v, int lo, int hi, int *out)
{
	char *end;
	long x = strtol(v, &end, 10);
	if (*v == 0 || *end || x < lo || x > hi) {
		fail("%s %s: expected a whole number from %d to %d", opt, v, lo, hi);
		return -1;
	}
	*out = (int)x;
	return 0;
}

struct result {
	double commit_s[MAX_STEPS], prot_s[MAX_STEPS], wall_s[MAX_STEPS];
	uint64_t data, parity;
	double serving, restored, restore_max, rebuild_ms, files, exchange, publish;
	double lib_move, lib_raw_enc, lib_mesh, lib_raw_dec, lib_reb;
};

static double median_of(const double *v, int from, int to)
{
	double t[MAX_STEPS];
	int n = 0;
	for (int i = from; i < to; i++)
		t[n++] = v[i];
	return bench_median(t, n);
}

/* The run itself; the caller cleans up. */
static int run(struct mesh *ms, uint64_t size, int steps, struct result *R)
{
	struct crew c = { .res = -1 };
	struct prot lines[MAX_NODES];
	if (mesh_start(ms) || crew_start(&c, ms, size, steps, 0))
		goto bad;
	for (int s = 1; s <= steps; s++) {
		double d;
		if (crew_collect(&c, ms, T_READY, (uint64_t)s, &d))
			goto bad;
		double t0 = mono();
		for (int i = 0; i < c.n; i++)
			if (write(c.go[i], "g", 1) != 1) {
				fail("a trainer is gone");
				goto bad;
			}
		if (crew_collect(&c, ms, T_DONE, (uint64_t)s, &R->commit_s[s - 1]) || wait_protected(ms, (uint64_t)s, lines))
			goto bad;
		R->wall_s[s - 1] = mono() - t0;
		R->prot_s[s - 1] = 0;
		R->data = R->parity = 0;
		for (int n = 0; n < ms->nodes; n++) {
			R->prot_s[s - 1] = lines[n].ms / 1e3 > R->prot_s[s - 1] ? lines[n].ms / 1e3 : R->prot_s[s - 1];
			R->data += lines[n].data;
			R->parity += lines[n].parity;
		}
	}
	if (!crew_join(&c)) {
		fail("a trainer did not close cleanly (see above)");
		goto bad;
	}

	/* the loss: every node at once, then M nodes' stores */
	mesh_kill(ms);
	for (int n = 0; n < ms->m; n++) {
		char dir[PATH_MAX + 16];
		if (node_path(ms, n, NULL, dir, sizeof(dir)) || bench_rm_tree(dir)) {
			fail("cannot remove %s: %s", dir, strerror(errno));
			goto bad;
		}
	}
	double t0 = mono();
	if (mesh_start(ms))
		goto bad;
	R->serving = mono() - t0;
	struct rebuilt rb[MAX_NODES];
	if (log_refresh(ms))
		goto bad;
	int nrb = find_rebuilt(ms, (uint64_t)steps, rb, MAX_NODES);
	if (nrb != ms->m) {
		fail("%d of %d lost nodes logged their rebuild of step %d; see %s", nrb, ms->m, steps, ms->log);
		goto bad;
	}
	R->rebuild_ms = R->files = R->exchange = R->publish = 0;
	for (int i = 0; i < nrb; i++) {
		R->rebuild_ms = rb[i].ms > R->rebuild_ms ? rb[i].ms : R->rebuild_ms;
		R->files = rb[i].files > R->files ? rb[i].files : R->files;
		R->exchange = rb[i].exchange > R->exchange ? rb[i].exchange : R->exchange;
		R->publish = rb[i].publish > R->publish ? rb[i].publish : R->publish;
	}
	if (crew_start(&c, ms, size, 0, (uint64_t)steps) ||
	    crew_collect(&c, ms, T_RESTORED, (uint64_t)steps, &R->restore_max) || !crew_join(&c)) {
		fail("after the rebuild the trainers did not all restore step %d intact", steps);
		goto bad;
	}
	R->restored = mono() - t0;
	if (mesh_stop(ms))
		fail("the mesh did not shut down cleanly after SIGTERM; see %s", ms->log);
	return 0;
bad:
	crew_end(&c, 1);
	mesh_kill(ms);
	return -1;
}

/* `snapbench ec` with the same shape and size, for the limits. */
static int library(const struct mesh *ms, uint64_t size, struct result *R)
{
	char self[PATH_MAX], k[16], m[16], sz[32];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -1;
	self[n] = 0;
	snprintf(k, sizeof(k), "%d", ms->k);
	snprintf(m, sizeof(m), "%d", ms->m);
	snprintf(sz, sizeof(sz), "%" PRIu64, size);
	char *const av[] = { self, "ec", "--k", k, "--m", m, "--size", sz, "--reps", "3", "--json", NULL };
	static char out[1 << 16];
	int st = bench_run_capture(av, out, sizeof(out));
	const char *line = strchr(out, '{');
	if (st != 0 || !line) {
		fail("snapbench ec failed (exit %d)", st);
		return -1;
	}
	R->lib_move = bench_jnum(line, "mpi_move_gbps");
	R->lib_raw_enc = bench_jnum(line, "raw_encode_gbps");
	R->lib_mesh = bench_jnum(line, "mesh_encode_gbps");
	R->lib_raw_dec = bench_jnum(line, "raw_decode_gbps");
	R->lib_reb = bench_jnum(line, "rebuild_gbps");
	return 0;
}

static void report(const struct mesh *ms, uint64_t size, int steps, const struct result *R, int json)
{
	int cold = SLOTS + 1;
	double steady = median_of(R->prot_s, cold, steps), wall = median_of(R->wall_s, cold, steps);
	double commit = median_of(R->commit_s, cold, steps), cold_max = 0, gb = (double)R->data / 1e9;
	for (int i = 0; i < cold; i++)
		cold_max = R->prot_s[i] > cold_max ? R->prot_s[i] : cold_max;
	double prot = gb / steady, reb = gb / (R->rebuild_ms / 1e3);
	if (json) {
		printf("{\"shape\":\"%d+%d\",\"k\":%d,\"m\":%d,\"nodes\":%d,\"size\":%" PRIu64 ",\"steps\":%d,"
		       "\"store_hugepages\":%s,\"protected_bytes\":%" PRIu64 ",\"parity_bytes\":%" PRIu64
		       ",\"protect_cold_s\":[", ms->k, ms->m, ms->k, ms->m, ms->nodes, size, steps,
		       ms->huge == 1 ? "true" : "false", R->data, R->parity);
		for (int i = 0; i < cold; i++)
			printf("%s%.6f", i ? "," : "", R->prot_s[i]);
		printf("],\"protect_steady_s\":%.6f,\"protect_gbps\":%.3f,\"protect_cold_gbps\":%.3f,"
		       "\"commit_s\":%.6f,\"save_to_protected_s\":%.6f,\"lost_nodes\":[",
		       steady, prot, gb / cold_max, commit, wall);
		for (int i = 0; i < ms->m; i++)
			printf("%s%d", i ? "," : "", i);
		printf("],\"rebuild_s\":%.6f,\"rebuild_phases_ms\":{\"files\":%.1f,\"exchange\":%.1f,\"publish\":%.1f},"
		       "\"rebuild_gbps\":%.3f,\"relaunch_to_serving_s\":%.3f,\"relaunch_to_restored_s\":%.3f,"
		       "\"restore_s\":%.6f,\"restored_bytes_checked\":%" PRIu64 ",",
		       R->rebuild_ms / 1e3, R->files, R->exchange, R->publish, reb, R->serving, R->restored,
		       R->restore_max, (uint64_t)ms->nodes * (size / 8 * 8));
		printf("\"library\":{\"mpi_move_gbps\":%.3f,\"raw_encode_gbps\":%.3f,\"mesh_encode_gbps\":%.3f,"
		       "\"raw_decode_gbps\":%.3f,\"rebuild_gbps\":%.3f},\"protect_vs_mpi_move\":%.3f,"
		       "\"rebuild_vs_raw_decode\":%.3f}\n",
		       R->lib_move, R->lib_raw_enc, R->lib_mesh, R->lib_raw_dec, R->lib_reb, prot / R->lib_move,
		       reb / R->lib_raw_dec);
		return;
	}
	printf("mesh bench: %d nodes (%d+%d) of real snapsmp daemons on this host, %.1f MiB per node, "
	       "%.3f GB of protected data per step; GB/s of protected data\n",
	       ms->nodes, ms->k, ms->m, size / 1048576.0, gb);
	printf("stores under %s: %s huge pages (%s)\n", ms->dir, ms->huge == 1 ? "with" : "without", ms->fs);
	printf("  %-40s %8s %10s  %s\n", "", "GB/s", "seconds", "");
	printf("  %-40s %8.2f %10.4f  the daemons' own time, slowest node\n", "protect, steady (median)", prot, steady);
	printf("  %-40s %8.2f %10.4f  the slowest of steps 1-%d\n", "protect, cold", gb / cold_max, cold_max, cold);
	printf("  %-40s %8.2f %10.4f  as the job sees it (median)\n", "save -> protected", gb / wall, wall);
	printf("  %-40s %8.2f %10.4f  (median)\n", "save -> committed", gb / commit, commit);
	printf("  %-40s %8.2f %10s  MPI alone, same traffic (snapbench ec)\n", "MPI move", R->lib_move, "");
	printf("  %-40s %8.2f %10s  the ec/ library over MPI, warm buffers\n", "protect, library", R->lib_mesh, "");
	printf("  %-40s %8.2f %10s  (target >= 0.7)\n", "protect / MPI move", prot / R->lib_move, "");
	printf("  %-40s %8.2f %10.4f  files %.0f, exchange %.0f, publish %.0f ms\n", "rebuild of the lost node(s)",
	       reb, R->rebuild_ms / 1e3, R->files, R->exchange, R->publish);
	printf("  %-40s %8.2f %10s  1 process (snapbench ec)\n", "raw ISA-L decode", R->lib_raw_dec, "");
	printf("  %-40s %8.2f %10s  the ec/ library over MPI\n", "rebuild, library", R->lib_reb, "");
	printf("  %-40s %8.3f %10s  (target >= 0.5)\n", "rebuild / raw decode", reb / R->lib_raw_dec, "");
	printf("  %-40s %8s %10.3f\n", "relaunch -> serving", "", R->serving);
	printf("  %-40s %8s %10.3f  every rank restored and checked step %d\n", "relaunch -> restored", "", R->restored,
	       steps);
}

int cmd_bench_mesh(int argc, char **argv)
{
	int k = 3, m = 1, nodes = 0, steps = 8, json = 0;
	uint64_t size = 256ull << 20;
	const char *dir = "/dev/shm";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return SB_OK;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else if (v && !strcmp(a, "--k")) {
			bad = parse_int(a, v, 1, SNAP_EC_MAX_GROUP - 1, &k), i++;
		} else if (v && !strcmp(a, "--m")) {
			bad = parse_int(a, v, 1, SNAP_EC_MAX_GROUP - 1, &m), i++;
		} else if (v && !strcmp(a, "--nodes")) {
			bad = parse_int(a, v, 2, MAX_NODES, &nodes), i++;
		} else if (v && !strcmp(a, "--steps")) {
			bad = parse_int(a, v, SLOTS + 2, MAX_STEPS, &steps), i++;
		} else if (v && !strcmp(a, "--size")) {
			if ((bad = snap_parse_size(v, &size) || size < 8 || size > (64ull << 30)))
				fail("--size %s: expected a size from 8 bytes to 64G, like 4096, 64K, 16M or 1G", v);
			i++;
		} else if (v && !strcmp(a, "--dir")) {
			dir = v, i++;
		} else {
			fail("unknown or incomplete option '%s'", a);
			bad = 1;
		}
		if (bad) {
			usage(stderr);
			return SB_USAGE;
		}
	}
	nodes = nodes ? nodes : k + m;
	struct snap_ec_group g;
	char err[256];
	if (nodes < k + m || nodes > MAX_NODES || snap_ec_group_of(nodes, k, m, 0, 0, &g, err, sizeof(err))) {
		fail("--nodes %d in groups of %d+%d: %s", nodes, k, m,
		     nodes < k + m ? "need at least K+M nodes (group 0, the one that loses nodes, is measured)"
				   : nodes > MAX_NODES ? "too many" : err);
		return SB_USAGE;
	}
	struct mesh ms = { .k = k, .m = m, .nodes = nodes, .dir = dir };
	static const char *const cand[] = { "%s/snapsmp", "%s/../smp/snapsmp" };
	bench_find_prog(ms.smp, sizeof(ms.smp), "SNAPSMP", "snapsmp", cand, 2);
	ms.mpiexec = getenv("MPIEXEC") && *getenv("MPIEXEC") ? getenv("MPIEXEC") : "mpiexec";
	/* 3 slots of data and the parity of 2 steps (the protected one and the next), and room */
	ms.mem_limit = 4 * size + 4 * ((uint64_t)m * size / (uint64_t)k + 1) + (64ull << 20);
	const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(ms.base, sizeof(ms.base), "%s/snapbench-mesh-%d", dir, (int)getpid());
	snprintf(ms.log, sizeof(ms.log), "%s/snapbench-mesh-%d.log", tmp, (int)getpid());
	char probe[SNAP_PATH_MAX];
	if (node_path(&ms, nodes - 1, "smp.sock", probe, sizeof(probe))) {
		fail("--dir %s: too long: the node stores' socket paths must fit in %d bytes", dir, SNAP_PATH_MAX - 1);
		return SB_USAGE;
	}
	if (mkdir(ms.base, 0700)) {
		fail("cannot create %s: %s", ms.base, strerror(errno));
		return SB_FAIL;
	}
	ms.huge = snap_store_hugepages(ms.base, ms.fs, sizeof(ms.fs));
	unlink(ms.log);
	struct sigaction sa = { .sa_handler = on_signal }, old_int, old_term;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	static struct result R;
	int rc = run(&ms, size, steps, &R);
	if (bench_rm_tree(ms.base))
		fail("could not remove %s: %s", ms.base, strerror(errno));
	free(ms.text);
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (stop_sig) {
		fail("stopped by signal %d; the mesh and the trainers were killed, the stores removed", (int)stop_sig);
		unlink(ms.log);
		return SB_FAIL;
	}
	if (rc)
		return SB_FAIL;   /* the log stays, named in the message */
	unlink(ms.log);
	if (library(&ms, size, &R))
		return SB_FAIL;
	report(&ms, size, steps, &R, json);
	return SB_OK;
}
