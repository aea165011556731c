/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SIGKILL mid-flush: a child writes a 2-rank step (raw or LZ4 regions and a
 * region of codec frames) and seals it; the parent
 * kills it at a random moment within the flush's measured duration. After
 * each kill: every listed step verifies, the killed step is either listed
 * and verifies or is not listed, and the step persisted before still
 * verifies and restores bit-exact. Retention runs between trials and must
 * clean the leftovers without touching those steps.
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

static int flush_step(const char *dir, uint64_t step)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = step % 2 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE, .chunk_bytes = 32 << 10,
				 .io_bytes = 64 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	if (!w)
		return 1;
	for (uint32_t r = 0; r < 2; r++) {
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
	return snap_io_step_seal(dir, JOB, step, 2, &err) < 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
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

	double t0 = now();
	CHECK(flush_step(dir, 1) == 0);
	double dur = now() - t0;
	CHECK(flush_step(dir, 2) == 0);
	dur = (now() - t0) / 2; /* mean of the two flushes */
	printf("one flush takes %.1f ms\n", dur * 1e3);
	srand(12345);
	int persisted = 0, torn = 0;
	for (int t = 0; t < trials; t++) {
		uint64_t prev;
		OK(snap_io_newest_step(dir, JOB, &prev, &err), &err);
		uint64_t step = 10 + (uint64_t)t;
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0)
			_exit(flush_step(dir, step));
		useconds_t delay = (useconds_t)((double)rand() / RAND_MAX * dur * 1.3e6);
		usleep(delay);
		kill(pid, SIGKILL);
		int status;
		CHECK(waitpid(pid, &status, 0) == pid);
		CHECK(!WIFEXITED(status) || WEXITSTATUS(status) == 0);

		uint64_t steps[64];
		int n = snap_io_list_steps(dir, JOB, steps, 64, &err);
		CHECK(n >= 1 && n <= 64);
		int listed = 0;
		for (int i = 0; i < n; i++) {
			OK(snap_io_verify_step(dir, JOB, steps[i], &bad, &err), &err);
			listed |= steps[i] == step;
		}
		if (listed) {
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
	printf("io_crash: %d trials: %d killed after persisting, %d killed before; all consistent\n", trials,
	       persisted, torn);
	CHECK(torn > 0); /* the kills must land mid-flush at least sometimes */
	io_t_frames_free(&FR);
	return 0;
}
