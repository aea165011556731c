/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh_trainers.c - `snapbench mesh`'s trainers: one forked process
 * per node with a libsnap context of its own (rank = node), driven step by
 * step over a pipe each, reporting over one shared pipe.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_mesh.h"
#include "bench_util.h"
#include "snap/snap.h"

/* Word i of what rank r holds at step s: different at every step and rank,
 * so a restore of the wrong step or node fails the check. */
static uint64_t word(int r, uint64_t s, uint64_t i)
{
	return ((uint64_t)r << 48) ^ (s << 32) ^ (i * 0x9E3779B97F4A7C15ull);
}

static void tsend(int fd, int rank, int what, int rc, uint64_t step, double secs)
{
	struct tmsg t = { rank, what, rc, step, secs };
	if (write(fd, &t, sizeof(t)) != (ssize_t)sizeof(t))
		_exit(1);
}

/*
 * One trainer. steps > 0: for each step wait for a byte, fill, say READY,
 * wait for the go byte, save and wait for the commit, say DONE. The first
 * byte comes once the previous step is protected: filling 4 x 256 MiB
 * beside a protect took a third of the 2 cores here and slowed it by as
 * much, a cost no training step puts on the CPU at that moment (and none
 * the MPI figure it is compared with pays). steps == 0: restore the newest
 * step (a relaunched job), check it is `last` and every byte, say RESTORED.
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
	cfg.autostart = SNAP_AUTOSTART_OFF;   /* wait for the mesh's daemon; never start a lone one on its store */
	uint64_t words = size / 8;
	uint64_t *buf = malloc(words * 8);
	int quiet = 0;
	snap_ctx *ctx = NULL;
	int rc = buf ? snap_open(&cfg, &ctx) : SNAP_ENOMEM;
	struct snap_region reg = { .name = "weights", .ptr = buf, .bytes = words * 8, .dtype = SNAP_DTYPE_U8 };
	if (!rc)
		rc = snap_register(ctx, &reg);
	/* As a trainer does before its first step: the daemons prepare the
	 * slot and parity files while it runs (here: the first fill). */
	if (!rc && steps)
		rc = snap_prepare(ctx);
	for (int s = 1; !rc && s <= steps; s++) {
		char go;
		if (read(gofd, &go, 1) != 1) {   /* the run was stopped: say nothing */
			quiet = 1;
			rc = SNAP_ESTATE;
			break;
		}
		for (uint64_t i = 0; i < words; i++)
			buf[i] = word(rank, (uint64_t)s, i);
		tsend(resfd, rank, T_READY, 0, (uint64_t)s, 0);
		if (read(gofd, &go, 1) != 1) {
			quiet = 1;
			rc = SNAP_ESTATE;
			break;
		}
		double t0 = bench_mono();
		rc = snap_save(ctx, (uint64_t)s);
		if (!rc)
			rc = snap_wait(ctx);
		if (!rc)
			tsend(resfd, rank, T_DONE, 0, (uint64_t)s, bench_mono() - t0);
	}
	if (!rc && !steps) {
		uint64_t got = 0;
		memset(buf, 0, words * 8);
		double t0 = bench_mono();
		rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
		double t = bench_mono() - t0;
		uint64_t bad = 0;
		while (!rc && bad < words && buf[bad] == word(rank, last, bad))
			bad++;
		if (!rc && (got != last || bad != words)) {
			fprintf(stderr, "snapbench mesh: rank %d restored step %" PRIu64 " (want %" PRIu64 "), first bad word %"
				PRIu64 " of %" PRIu64 "\n", rank, got, last, bad, words);
			tsend(resfd, rank, T_FAILED, 3, got, t);
			quiet = 1;
			rc = 3;
		} else if (!rc) {
			tsend(resfd, rank, T_RESTORED, 0, got, t);
		}
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

void crew_end(struct crew *c, int kill_them)
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

int crew_tell(struct crew *c, const char *what, int s)
{
	for (int i = 0; i < c->n; i++)
		if (write(c->go[i], "g", 1) != 1) {   /* EPIPE: SIGPIPE is ignored during the run */
			bm_fail("the trainer of rank %d is gone (%s) before the %s of step %d", i, strerror(errno), what, s);
			return -1;
		}
	return 0;
}

/* Says how the trainer of `rank` ended, when that was not exit 0. */
static void say_ended(int rank, int st, const char *when)
{
	if (WIFSIGNALED(st))
		bm_fail("the trainer of rank %d was killed by signal %d %s", rank, WTERMSIG(st), when);
	else
		bm_fail("the trainer of rank %d exited with status %d %s", rank, WEXITSTATUS(st), when);
}

/* Whether every trainer exited 0 (waits for them; their go pipes closed);
 * says which did not. */
int crew_join(struct crew *c)
{
	int ok = 1;
	for (int i = 0; i < c->n; i++) {
		if (c->go[i] >= 0)
			close(c->go[i]);
		c->go[i] = -1;
		int st;
		if (c->pid[i] > 0 && waitpid(c->pid[i], &st, 0) == c->pid[i] && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
			say_ended(i, st, "before it finished");
			ok = 0;
		}
		c->pid[i] = 0;
	}
	crew_end(c, 0);
	return ok;
}

int crew_start(struct crew *c, const struct mesh *ms, uint64_t size, int steps, uint64_t last)
{
	int res[2];
	c->n = 0;
	c->nearly = 0;
	c->res = -1;
	if (pipe2(res, O_CLOEXEC)) {
		bm_fail("pipe: %s", strerror(errno));
		return -1;
	}
	c->res = res[0];
	fflush(NULL);
	for (int r = 0; r < ms->nodes; r++) {
		int go[2];
		if (pipe2(go, O_CLOEXEC)) {
			bm_fail("pipe: %s", strerror(errno));
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
			bm_fail("fork: %s", strerror(errno));
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

/* A trainer that died before it reported (reaped here, so nobody waits for
 * it again): says which and how, and returns 1; else 0. The others keep the
 * results pipe open, so its end of file never comes. A trainer that has
 * reported may exit (the restoring ones do). */
static int crew_lost_one(struct crew *c, const char *reported, uint64_t s)
{
	for (int i = 0; i < c->n; i++) {
		int st;
		if (reported[i] || c->pid[i] <= 0 || waitpid(c->pid[i], &st, WNOHANG) != c->pid[i])
			continue;
		c->pid[i] = 0;
		char when[64];
		snprintf(when, sizeof(when), "while step %" PRIu64 " was under way", s);
		say_ended(i, st, when);
		return 1;
	}
	return 0;
}

/* Wait for one `what` message from every trainer about step s; secs gets
 * the largest `secs` they report. A failure, a trainer that died, the
 * mesh gone or a signal end the wait with -1. */
int crew_collect(struct crew *c, struct mesh *ms, int what, uint64_t s, double *secs)
{
	int got = 0;
	char reported[MAX_NODES] = { 0 };
	double t0 = bench_mono();
	*secs = 0;
	c->first_at = 0;
	for (int i = 0; i < c->nearly;) {
		if (c->early[i].what == what && c->early[i].step == s) {
			c->first_at = c->first_at ? c->first_at : t0;   /* arrived before: no later than now */
			got++;
			reported[(unsigned)c->early[i].rank % MAX_NODES] = 1;
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
				bm_fail("a trainer exited early (see its message above)");
				return -1;
			}
			if (t.what == T_FAILED) {
				bm_fail("rank %d failed at step %" PRIu64 " (%s)", t.rank, s,
				     t.rc == 3 ? "restored bytes differ" : snap_strerror(t.rc));
				return -1;
			}
			if (t.what == what && t.step == s) {
				c->first_at = c->first_at ? c->first_at : bench_mono();
				got++;
				reported[(unsigned)t.rank % MAX_NODES] = 1;
				*secs = t.secs > *secs ? t.secs : *secs;
			} else if (c->nearly < 2 * MAX_NODES) {
				c->early[c->nearly++] = t;
			} else {
				bm_fail("unexpected message from rank %d", t.rank);
				return -1;
			}
			continue;
		}
		if (r < 0 && errno != EINTR)
			return -1;
		if (!bm_stop && crew_lost_one(c, reported, s))
			return -1;
		if (bm_stop || !mesh_alive(ms) || bench_mono() - t0 > WAIT_S) {
			if (!bm_stop)
				bm_fail("%d of %d trainers reported step %" PRIu64 "; %s", got, c->n, s,
				     mesh_alive(ms) ? "timed out" : "the mesh died");
			return -1;
		}
	}
	return 0;
}
