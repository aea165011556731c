/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SIGKILL mid-flush: a child writes a 2-rank step (raw or LZ4 regions and a
 * region of codec frames) and seals it, telling the parent over a pipe as
 * each phase starts (rank 0's file, rank 1's, the seal, the end). The
 * parent watches the step's directory with inotify (every file created,
 * written, closed or renamed into place there is an event), picks a phase
 * and kills the child at the j-th event of that phase, j drawn up to the
 * count a calibration flush showed there: the strike always lands on
 * something the flush did, on any machine, never after a time. The phase
 * bytes read after the kill say where it died. After each kill: every
 * listed step verifies; the killed step is listed and restores bit-exact
 * if its MANIFEST was seen renamed into place, and is not listed if the
 * child died before the seal began; the step persisted before still
 * verifies and restores bit-exact. Retention runs between trials and must
 * clean the leftovers without touching those steps.
 * usage: io_crash DIR [TRIALS]
 */
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io_testutil.h"

#define JOB "crashy"
#define N (128 * 1024)

static float A[N], B[N];
static struct io_t_frames FR; /* A as lossless codec frames */

/* The phases, in the order the child announces them; after phase p's byte
 * the parent has read p + 1 bytes. */
enum { PH_RANK0, PH_RANK1, PH_SEAL, PH_END };

/* A phase starts: one byte to the parent (evfd >= 0). */
static void phase(int evfd)
{
	if (evfd >= 0 && write(evfd, "p", 1) != 1)
		_exit(3);
}

static int flush_step(const char *dir, uint64_t step, int evfd)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = step % 2 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE, .chunk_bytes = 32 << 10,
				 .io_bytes = 64 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	if (!w)
		return 1;
	for (uint32_t r = 0; r < 2; r++) {
		phase(evfd);
		uint64_t g[2] = {2 * N / 256, 256}, off[2] = {r * N / 256, 0}, sh[2] = {N / 256, 256};
		uint64_t g1[1] = {N}, o1[1] = {0};
		struct snap_io_region reg[3] = {io_t_region("layer/w", SNAP_DTYPE_F32, 2, g, off, sh, r ? B : A),
						io_t_region("rng", SNAP_DTYPE_F32, 1, g1, o1, g1, B),
						io_t_region("codec", SNAP_DTYPE_F32, 1, g1, o1, g1, FR.decoded)};
		io_t_frames_attach(&reg[2], &FR);
		if (snap_io_write_rank(w, dir, JOB, step, r, 2, reg, 3, NULL, &err) < 0)
			return 1;
	}
	snap_io_writer_free(w);
	phase(evfd);
	int rc = snap_io_step_seal(dir, JOB, step, 2, &err) < 0;
	phase(evfd);
	return rc;
}

/* A flushing child as the parent sees it. */
struct child {
	pid_t pid;
	int ino, job_wd, step_wd; /* inotify: the job's directory, then the step's */
	int ev;                   /* read end of the phase pipe */
	char step_name[32];
	int events[PH_END + 2];   /* events seen in the step's directory, by the
				   * number of phase bytes read when they came */
	int sealed;               /* its MANIFEST was seen renamed into place */
	int phases;               /* phase bytes read */
	int exited;               /* the pipe hit EOF: the child is gone */
};

static void child_start(struct child *c, const char *dir, uint64_t step)
{
	char jobdir[1100];
	snprintf(jobdir, sizeof jobdir, "%s/" JOB, dir);
	*c = (struct child){.step_wd = -1};
	snprintf(c->step_name, sizeof c->step_name, "step-%" PRIu64, step);
	CHECK((c->ino = inotify_init1(IN_CLOEXEC)) >= 0);
	CHECK((c->job_wd = inotify_add_watch(c->ino, jobdir, IN_CREATE)) >= 0);
	int ev[2];
	CHECK(pipe(ev) == 0);
	c->pid = fork();
	CHECK(c->pid >= 0);
	if (c->pid == 0) {
		close(ev[0]);
		_exit(flush_step(dir, step, ev[1]));
	}
	close(ev[1]);
	c->ev = ev[0];
}

/* Block until the child does something: an event in the step's directory
 * (the directory itself is watched as soon as it is created), a phase
 * byte, or its exit. */
static void child_wait(struct child *c, const char *dir)
{
	struct pollfd p[2] = {{c->ino, POLLIN, 0}, {c->ev, POLLIN, 0}};
	CHECK(poll(p, 2, -1) > 0);
	if (p[1].revents) {
		char b[8];
		ssize_t n = read(c->ev, b, sizeof b);
		c->exited |= n <= 0;
		c->phases += n > 0 ? (int)n : 0;
	}
	if (!(p[0].revents & POLLIN))
		return;
	char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n = read(c->ino, buf, sizeof buf);
	CHECK(n > 0);
	for (char *at = buf; at < buf + n;) {
		const struct inotify_event *e = (const struct inotify_event *)at;
		at += sizeof(*e) + e->len;
		if (e->wd == c->job_wd && e->len && strcmp(e->name, c->step_name) == 0) {
			char sd[1200];
			snprintf(sd, sizeof sd, "%s/" JOB "/%s", dir, c->step_name);
			c->step_wd = inotify_add_watch(c->ino, sd, IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO);
		} else if (e->wd == c->step_wd && c->step_wd >= 0) {
			c->events[c->phases < PH_END + 1 ? c->phases : PH_END + 1]++;
			c->sealed |= (e->mask & IN_MOVED_TO) && e->len && strcmp(e->name, "MANIFEST") == 0;
		}
	}
}

/* SIGKILL at the j-th event of phase p (at once if that phase is over;
 * none if the child finishes first, as with p < 0); reap it and read every
 * phase byte it wrote. Returns 1 if it was killed. */
static int child_strike(struct child *c, const char *dir, int p, int j)
{
	while (!c->exited && (p < 0 || c->phases < p + 1 || (c->phases == p + 1 && c->events[p + 1] < j)))
		child_wait(c, dir);
	int killed = !c->exited && kill(c->pid, SIGKILL) == 0;
	int status;
	CHECK(waitpid(c->pid, &status, 0) == c->pid);
	CHECK(!WIFEXITED(status) || WEXITSTATUS(status) == 0);
	char b[8];
	ssize_t n;
	while ((n = read(c->ev, b, sizeof b)) > 0)
		c->phases += (int)n;
	close(c->ev);
	close(c->ino);
	return killed && WIFSIGNALED(status);
}

static void check_restores(const char *dir, uint64_t step)
{
	static float a[N], rng[N], dec[N];
	struct snap_io_err err = {0};
	struct snap_io_dest d[3] = {{.name = "layer/w", .buf = a, .bytes = sizeof a},
				    {.name = "rng", .buf = rng, .bytes = sizeof rng},
				    {.name = "codec", .buf = dec, .bytes = sizeof dec}};
	OK(snap_io_read_rank(dir, JOB, step, 1, d, 3, &err), &err);
	CHECK(memcmp(a, B, sizeof a) == 0 && memcmp(rng, B, sizeof rng) == 0 && memcmp(dec, FR.decoded, sizeof dec) == 0);
}

int main(int argc, char **argv)
{
	CHECK(argc >= 2);
	int trials = argc > 2 ? atoi(argv[2]) : 60;
	char dir[1024], cmd[2048];
	snprintf(dir, sizeof dir, "%s/flush", argv[1]);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", argv[1]);
	CHECK(system(cmd) == 0);
	io_t_weights(A, sizeof A, 1);
	io_t_weights(B, sizeof B, 2);
	io_t_frames_make(&FR, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, A, N, 16384);
	struct snap_io_err err = {0};
	size_t bad;

	CHECK(flush_step(dir, 1, -1) == 0);
	CHECK(flush_step(dir, 2, -1) == 0);
	/* How many events each phase of a whole flush shows (the strikes are
	 * drawn below that). */
	struct child c;
	child_start(&c, dir, 3);
	CHECK(child_strike(&c, dir, -1, 0) == 0 && c.phases == PH_END + 1);
	int calib[PH_END + 2];
	memcpy(calib, c.events, sizeof calib);
	printf("a flush shows %d, %d and %d events in its step directory writing rank 0's file, rank 1's and sealing\n",
	       calib[1], calib[2], calib[3]);
	CHECK(calib[1] > 0 && calib[2] > 0);
	srand(12345);
	int persisted = 0, torn = 0, before_seal = 0, in_rank[2] = {0}, in_seal = 0, finished = 0;
	for (int t = 0; t < trials; t++) {
		uint64_t prev;
		OK(snap_io_newest_step(dir, JOB, &prev, &err), &err);
		uint64_t step = 10 + (uint64_t)t;
		child_start(&c, dir, step);
		/* two trials in three strike a rank's file (rank 0, then rank 1),
		 * the third a phase at random */
		int p = t % 3 == 2 ? rand() % (PH_SEAL + 1) : t % 3;
		int killed = child_strike(&c, dir, p, 1 + rand() % (calib[p + 1] > 0 ? calib[p + 1] : 1));
		/* the phase bytes it wrote: rank 0, rank 1, the seal, the end */
		int died_before_seal = killed && c.phases <= PH_RANK1 + 1;
		in_rank[0] += killed && c.phases == PH_RANK0 + 1;
		in_rank[1] += killed && c.phases == PH_RANK1 + 1;
		before_seal += died_before_seal;
		in_seal += killed && c.phases == PH_SEAL + 1;
		finished += !killed;

		uint64_t steps[64];
		int n = snap_io_list_steps(dir, JOB, steps, 64, &err);
		CHECK(n >= 1 && n <= 64);
		int listed = 0;
		for (int i = 0; i < n; i++) {
			OK(snap_io_verify_step(dir, JOB, steps[i], &bad, &err), &err);
			listed |= steps[i] == step;
		}
		if (!killed || c.sealed)
			CHECK(listed); /* finished, or its MANIFEST was in place before the kill */
		if (listed) {
			CHECK(!died_before_seal); /* killed inside a rank's file: nothing to persist yet */
			persisted++;
			check_restores(dir, step);
		} else {
			torn++;
			uint32_t w;
			CHECK(snap_io_step_world(dir, JOB, step, &w, &err) < 0);
		}
		OK(snap_io_verify_step(dir, JOB, prev, &bad, &err), &err);
		check_restores(dir, prev);
		CHECK(snap_io_retain(dir, JOB, 3, &err) >= 0);
		OK(snap_io_verify_step(dir, JOB, prev, &bad, &err), &err);
	}
	printf("io_crash: %d trials: killed while writing rank 0's file %d times, rank 1's %d, while sealing %d, after "
	       "%d; %d ran to the end; %d persisted, %d torn; all consistent\n", trials, in_rank[0], in_rank[1], in_seal,
	       trials - before_seal - in_seal - finished, finished, persisted, torn);
	/* the kills must land inside both rank files' writes, and did tear them */
	CHECK(in_rank[0] > 0 && in_rank[1] > 0 && torn >= before_seal);
	io_t_frames_free(&FR);
	return 0;
}
