/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SIGKILL mid-flush: a child writes a 2-rank step (raw or LZ4 regions and a
 * region of codec frames) and seals it, telling the parent over a pipe as
 * each phase starts (rank 0's file, rank 1's, the seal). The parent picks a
 * phase, waits for the child to say it started, and kills it at a random
 * moment within that phase's duration (measured by two flushes first), so
 * every kill lands in the phase it means to on any machine: a slower one
 * only moves the strike earlier inside the phase. After each kill: every
 * listed step verifies, the killed step is either listed and verifies or is
 * not listed (a kill inside a rank's file never persists it), and the step
 * persisted before still verifies and restores bit-exact. Retention runs
 * between trials and must clean the leftovers without touching those steps.
 * usage: io_crash DIR [TRIALS]
 */
#include <inttypes.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"

#define JOB "crashy"
#define N (128 * 1024)

static float A[N], B[N];
static struct io_t_frames FR; /* A as lossless codec frames */

enum { PH_RANK0, PH_RANK1, PH_SEAL, PHASES };
static const char *const phase_name[PHASES] = {"rank 0's file", "rank 1's file", "the seal"};

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A phase starts: one byte to the parent (evfd >= 0), and its start time;
 * PHASES is the end of the flush. */
static void phase(int evfd, double *at, int p)
{
	if (evfd >= 0 && write(evfd, "p", 1) != 1)
		_exit(3);
	if (at)
		at[p] = now();
}

static int flush_step(const char *dir, uint64_t step, int evfd, double *at)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = step % 2 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE, .chunk_bytes = 32 << 10,
				 .io_bytes = 64 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	if (!w)
		return 1;
	for (uint32_t r = 0; r < 2; r++) {
		phase(evfd, at, r ? PH_RANK1 : PH_RANK0);
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
	phase(evfd, at, PH_SEAL);
	int rc = snap_io_step_seal(dir, JOB, step, 2, &err) < 0;
	phase(evfd, at, PHASES);
	return rc;
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

	/* Each phase's duration: the shorter of two flushes (a strike meant for
	 * a phase that then ran faster lands after it; the pipe tells). */
	double dur[PHASES] = {1e9, 1e9, 1e9};
	for (uint64_t s = 1; s <= 2; s++) {
		double at[PHASES + 1];
		CHECK(flush_step(dir, s, -1, at) == 0);
		for (int p = 0; p < PHASES; p++)
			dur[p] = at[p + 1] - at[p] < dur[p] ? at[p + 1] - at[p] : dur[p];
	}
	printf("phases: %s %.1f ms, %s %.1f ms, %s %.1f ms\n", phase_name[0], dur[0] * 1e3, phase_name[1],
	       dur[1] * 1e3, phase_name[2], dur[2] * 1e3);
	srand(12345);
	int persisted = 0, torn = 0, struck[PHASES] = {0}, inside[PHASES] = {0};
	for (int t = 0; t < trials; t++) {
		uint64_t prev;
		OK(snap_io_newest_step(dir, JOB, &prev, &err), &err);
		uint64_t step = 10 + (uint64_t)t;
		int ev[2];
		CHECK(pipe(ev) == 0);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			close(ev[0]);
			_exit(flush_step(dir, step, ev[1], NULL));
		}
		close(ev[1]);
		/* two trials in three strike a rank's file (rank 0, then rank 1),
		 * the third a phase at random */
		int p = t % 3 == 2 ? rand() % PHASES : t % 3;
		char c;
		for (int seen = 0; seen <= p; seen++)
			CHECK(read(ev[0], &c, 1) == 1); /* the child said phase `seen` started */
		usleep((useconds_t)((double)rand() / RAND_MAX * dur[p] * 1e6));
		kill(pid, SIGKILL);
		int status;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(!WIFEXITED(status) || WEXITSTATUS(status) == 0);
		/* no byte after phase p's: the child died inside it */
		int in = read(ev[0], &c, 1) == 0;
		close(ev[0]);
		struck[p]++;
		inside[p] += in;

		uint64_t steps[64];
		int n = snap_io_list_steps(dir, JOB, steps, 64, &err);
		CHECK(n >= 1 && n <= 64);
		int listed = 0;
		for (int i = 0; i < n; i++) {
			OK(snap_io_verify_step(dir, JOB, steps[i], &bad, &err), &err);
			listed |= steps[i] == step;
		}
		if (listed) {
			CHECK(!in || p == PH_SEAL); /* killed inside a rank's file: nothing to persist yet */
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
	printf("io_crash: %d trials, killed inside %s %d of %d times, inside %s %d of %d, inside %s %d of %d: %d "
	       "killed after persisting, %d before; all consistent\n", trials, phase_name[0], inside[0], struck[0],
	       phase_name[1], inside[1], struck[1], phase_name[2], inside[2], struck[2], persisted, torn);
	/* the kills must land inside the rank files' writes, and did tear them */
	CHECK(inside[PH_RANK0] > 0 && inside[PH_RANK1] > 0 && torn >= inside[PH_RANK0] + inside[PH_RANK1]);
	io_t_frames_free(&FR);
	return 0;
}
