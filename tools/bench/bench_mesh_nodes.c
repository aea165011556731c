/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh_nodes.c - `snapbench mesh`'s mesh: mpiexec -np N snapsmp --ec
 * K+M in a session of its own, killed by its session (Open MPI moves its
 * ranks into process groups of their own), and the daemons' log lines the
 * benchmark reads its figures from.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_mesh.h"
#include "bench_util.h"

/* 0, or -1 when it does not fit (--dir is checked against that up front). */
int node_path(const struct mesh *ms, int n, const char *leaf, char *out, size_t cap)
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

int mesh_alive(struct mesh *ms)
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
void mesh_kill(struct mesh *ms)
{
	if (ms->pid <= 0)
		return;
	kill(ms->pid, SIGSTOP);   /* it spawns nothing more */
	pid_t pids[4 * MAX_NODES];
	int n = session_pids(ms->pid, pids, 4 * MAX_NODES);
	unsigned long jobid = mpi_jobid(pids, n);
	/* Wait until every node has exited, on pidfds: one becomes readable once
	 * the whole thread group is gone. A killed daemon's leader is a zombie at
	 * once while its other threads still free the memory it held (perf: a
	 * lost node's 1 GiB store, unlinked by the bench, was still being freed
	 * 0.6 s into the relaunch it was timing). */
	struct pollfd pfd[4 * MAX_NODES];
	int np = 0;
	for (int i = 0; i < n; i++)
		if ((pfd[np].fd = (int)syscall(SYS_pidfd_open, pids[i], 0)) >= 0)
			pfd[np++].events = POLLIN;
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
	double t0 = bench_mono();
	for (int left = np; left > 0 && bench_mono() - t0 < 30;) {
		if (poll(pfd, (nfds_t)np, 1000) < 0 && errno != EINTR)
			break;
		for (int i = 0; i < np; i++)
			if (pfd[i].fd >= 0 && pfd[i].revents) {
				close(pfd[i].fd);
				pfd[i].fd = -1;   /* poll skips it from now on */
				left--;
			}
	}
	for (int i = 0; i < np; i++)
		if (pfd[i].fd >= 0)
			close(pfd[i].fd);
	kill(ms->pid, SIGKILL);
	waitpid(ms->pid, NULL, 0);
	ms->pid = 0;
	remove_mpi_segments(jobid);
}

/* SIGTERM to the nodes (not mpiexec, which would SIGKILL them a second
 * later): each shuts down cleanly, and mpiexec exits once all have. */
int mesh_stop(struct mesh *ms)
{
	pid_t pids[4 * MAX_NODES];
	int n = session_pids(ms->pid, pids, 4 * MAX_NODES);
	for (int i = 0; i < n; i++)
		kill(pids[i], SIGTERM);
	double t0 = bench_mono();
	while (mesh_alive(ms) && bench_mono() - t0 < WAIT_S)
		bm_nap_ms(10);
	if (ms->pid > 0) {
		mesh_kill(ms);
		return -1;
	}
	return 0;
}

/* Start the mesh; its nodes serve once their sockets appear (mesh_serving). */
int mesh_launch(struct mesh *ms)
{
	char sock[PATH_MAX + 16];
	for (int n = 0; n < ms->nodes; n++) {
		if (!node_path(ms, n, "smp.sock", sock, sizeof(sock)))
			unlink(sock);
	}
	int fd = open(ms->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0) {
		bm_fail("cannot create the daemons' log %s: %s", ms->log, strerror(errno));
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
		bm_fail("fork: %s", strerror(errno));
		return -1;
	}
	if (pid == 0) {
		setsid();
		dup2(fd, 1);
		dup2(fd, 2);
		signal(SIGINT, SIG_DFL);
		signal(SIGTERM, SIG_DFL);
		signal(SIGPIPE, SIG_DFL);   /* ignored only by the benchmark itself; exec keeps SIG_IGN */
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
		/* mpiexec's session directory (8 MiB of PMIx segments) in the
		 * benchmark's own folder, removed with it: the Rebuild phase
		 * SIGKILLs mpiexec, which then leaves it in /tmp/ompi.HOST.UID,
		 * and a dozen runs left 100 MB there. */
		char sess[PATH_MAX + 16];
		if (snprintf(sess, sizeof(sess), "%s/mpi-session", ms->base) < (int)sizeof(sess))
			setenv("OMPI_MCA_orte_tmpdir_base", sess, 1);
		execlp(ms->mpiexec, ms->mpiexec, "-np", np, "--oversubscribe", ms->smp, "--ec", ec, "--store", store,
		       "--slots", slots, "--mem-limit", mem, "--log-level", "info", "--log", "stderr", (char *)NULL);
		fprintf(stderr, "snapbench mesh: cannot run %s: %s\n", ms->mpiexec, strerror(errno));
		_exit(127);
	}
	close(fd);
	ms->pid = pid;
	return 0;
}

/* Wait until every node serves (a fresh socket: a killed node leaves its old
 * one, which mesh_launch removed, and a relaunch rebuilds before binding). */
int mesh_serving(struct mesh *ms)
{
	char sock[PATH_MAX + 16];
	double t0 = bench_mono();
	for (;;) {
		int up = 0;
		for (int n = 0; n < ms->nodes; n++) {
			struct stat st;
			up += !node_path(ms, n, "smp.sock", sock, sizeof(sock)) && stat(sock, &st) == 0 &&
			      S_ISSOCK(st.st_mode);
		}
		if (up == ms->nodes)
			return 0;
		if (!mesh_alive(ms) || bm_stop || bench_mono() - t0 > WAIT_S) {
			if (!bm_stop)
				bm_fail("the mesh did not start (%d of %d nodes serving); see %s", up, ms->nodes, ms->log);
			mesh_kill(ms);
			return -1;
		}
		bm_nap_ms(5);
	}
}

int mesh_start(struct mesh *ms)
{
	return mesh_launch(ms) || mesh_serving(ms) ? -1 : 0;
}

/* Read what the log gained since the last call (complete lines only). */
int log_refresh(struct mesh *ms)
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

/* Every node's line for step s, in order of appearance; returns how many. */
int find_protected(const struct mesh *ms, uint64_t s, struct prot *out, int cap)
{
	char pat[96];
	int n = 0, plen = snprintf(pat, sizeof(pat), "job " JOB " step %" PRIu64 " protected (group ", s);
	for (const char *p = ms->text ? strstr(ms->text, pat) : NULL; p && n < cap; p = strstr(p + plen, pat)) {
		int g, k, m;
		const char *cpu = strstr(p + plen, "; CPU ");
		if (sscanf(p + plen, "%d, %d+%d, %" SCNu64 " data + %" SCNu64 " parity bytes here, %lf ms", &g, &k, &m,
			   &out[n].data, &out[n].parity, &out[n].ms) == 6 &&
		    cpu && sscanf(cpu, "; CPU %lf ms)", &out[n].cpu_ms) == 1)
			n++;
	}
	return n;
}

int find_rebuilt(const struct mesh *ms, uint64_t s, struct rebuilt *out, int cap)
{
	char pat[96];
	int n = 0, plen = snprintf(pat, sizeof(pat), "job " JOB " step %" PRIu64 ": rebuilt this lost node; ", s);
	for (const char *p = ms->text ? strstr(ms->text, pat) : NULL; p && n < cap; p = strstr(p + plen, pat)) {
		uint64_t chunks, corrupt;
		if (sscanf(p + plen, "%" SCNu64 " chunks rebuilt (%" SCNu64 " corrupt), %" SCNu64
			   " bytes written, CRCs verified, %lf ms (files %lf, exchange %lf, publish %lf)", &chunks,
			   &corrupt, &out[n].bytes, &out[n].ms, &out[n].files, &out[n].exchange, &out[n].publish) == 7) {
			const char *c = strstr(p + plen, " publish "), *eol = strchr(p + plen, '\n');
			c = c ? strchr(c, ')') : NULL;
			if (!c || (eol && c > eol) || sscanf(c, "); CPU %lf ms here", &out[n].cpu_ms) != 1)
				out[n].cpu_ms = -1;
			n++;
		}
	}
	return n;
}

double find_rebuild_cpu(const struct mesh *ms, uint64_t s)
{
	char pat[96];
	double wall, cpu;
	int plen = snprintf(pat, sizeof(pat), "job " JOB ": step %" PRIu64 " verified on every node (", s);
	const char *p = ms->text ? strstr(ms->text, pat) : NULL;
	const char *c = p ? strstr(p + plen, "; ") : NULL;
	if (c && sscanf(c, "; %lf ms, CPU %lf ms over the mesh)", &wall, &cpu) == 2)
		return cpu;
	return -1;
}

/* Wait until every node logged step s protected. */
int wait_protected(struct mesh *ms, uint64_t s, struct prot *lines)
{
	double t0 = bench_mono();
	for (;;) {
		if (log_refresh(ms)) {
			bm_fail("cannot read %s", ms->log);
			return -1;
		}
		if (find_protected(ms, s, lines, ms->nodes) >= ms->nodes)
			return 0;
		if (bm_stop || !mesh_alive(ms) || bench_mono() - t0 > WAIT_S) {
			if (!bm_stop)
				bm_fail("step %" PRIu64 " was not protected on every node: %s; see %s", s,
					mesh_alive(ms) ? "timed out" : "the mesh died", ms->log);
			return -1;
		}
		bm_nap_ms(2);
	}
}

/* Wait until every lost node logged its rebuild of step s, and node 0 the
 * rebuild's verification: the lines come through mpirun's forwarding of the
 * daemons' stderr, which may lag behind the sockets the nodes then bind. */
int wait_rebuilt(struct mesh *ms, uint64_t s, struct rebuilt *out, int cap)
{
	double t0 = bench_mono();
	for (;;) {
		if (log_refresh(ms)) {
			bm_fail("cannot read %s", ms->log);
			return -1;
		}
		int n = find_rebuilt(ms, s, out, cap);
		if (n >= ms->lost && find_rebuild_cpu(ms, s) >= 0)
			return n;
		if (bm_stop || !mesh_alive(ms) || bench_mono() - t0 > WAIT_S) {
			if (!bm_stop)
				bm_fail("%d of %d lost nodes logged their rebuild of step %" PRIu64 "%s: %s; see %s", n,
					ms->lost, s, find_rebuild_cpu(ms, s) >= 0 ? "" : ", node 0 not its verification",
					mesh_alive(ms) ? "timed out" : "the mesh died", ms->log);
			return -1;
		}
		bm_nap_ms(2);
	}
}

int wait_ready(struct mesh *ms)
{
	double t0 = bench_mono();
	for (;;) {
		if (log_refresh(ms)) {
			bm_fail("cannot read %s", ms->log);
			return -1;
		}
		int n = 0;
		for (const char *p = ms->text; p && (p = strstr(p, "job " JOB ": ready ahead of its first protects")); p++)
			n++;
		if (n >= ms->nodes)
			return 0;
		if (bm_stop || !mesh_alive(ms) || bench_mono() - t0 > WAIT_S) {
			if (!bm_stop)
				bm_fail("not every node logged its files ready ahead of the first protect: %s; see %s",
					mesh_alive(ms) ? "timed out" : "the mesh died", ms->log);
			return -1;
		}
		bm_nap_ms(2);
	}
}
