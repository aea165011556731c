/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * io_uring failures inside the bulk writer, injected by wrapping liburing
 * (linked with -Wl,--wrap=io_uring_submit,--wrap=__io_uring_get_cqe):
 *  - a failed io_uring_submit leaves its prepared SQE in the ring; the write
 *    must fail naming the dataset, and the next write with the same writer
 *    must not send that stale SQE (old fd, old buffer) but rebuild the ring;
 *  - a failed wait leaves writes in flight; they are drained before the fds
 *    close, and the next write works.
 * Each buffered, with O_DIRECT, and with O_DIRECT and LZ4 (whose chunks go
 * through the ring while HDF5 is still building the file).
 * After each failure no rank file appears, and the next file reads back
 * bit-exact and verifies.
 * usage: io_uring_faults DIR
 */
#include <errno.h>
#include <signal.h>
#include <unistd.h>

#include <liburing.h>

#include "io_testutil.h"

#define JOB "ringy"
#define N (1024 * 1024 / 4)

static float A[N], B[N];
static int submits, fail_submit_at, waits, fail_wait_at;

int __real_io_uring_submit(struct io_uring *ring);
int __wrap_io_uring_submit(struct io_uring *ring);
int __real___io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
			      unsigned wait_nr, sigset_t *sigmask);
int __wrap___io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
			      unsigned wait_nr, sigset_t *sigmask);

int __wrap_io_uring_submit(struct io_uring *ring)
{
	if (++submits == fail_submit_at)
		return -EAGAIN; /* the SQE stays prepared in the ring */
	return __real_io_uring_submit(ring);
}

int __wrap___io_uring_get_cqe(struct io_uring *ring, struct io_uring_cqe **cqe_ptr, unsigned submit,
			      unsigned wait_nr, sigset_t *sigmask)
{
	if (++waits == fail_wait_at)
		return -EIO; /* the writes stay in flight */
	return __real___io_uring_get_cqe(ring, cqe_ptr, submit, wait_nr, sigmask);
}

static int write_one(struct snap_io_writer *w, const char *dir, uint64_t step, const float *data,
		     struct snap_io_err *err)
{
	uint64_t g[1] = {N}, off[1] = {0}, sh[1] = {N}, g2[1] = {1000}, o2[1] = {0}, s2[1] = {1000};
	struct snap_io_region r[2] = {io_t_region("small", SNAP_DTYPE_F32, 1, g2, o2, s2, data + 7),
				      io_t_region("big", SNAP_DTYPE_F32, 1, g, off, sh, data)};
	return snap_io_write_rank(w, dir, JOB, step, 0, 1, r, 2, NULL, err);
}

static void check_step(const char *dir, uint64_t step, const float *data)
{
	static float big[N], small[1000];
	struct snap_io_err err = {0};
	size_t bad;
	OK(snap_io_step_seal(dir, JOB, step, 1, &err), &err);
	OK(snap_io_verify_step(dir, JOB, step, &bad, &err), &err);
	struct snap_io_dest d[2] = {{.name = "big", .buf = big, .bytes = sizeof big},
				    {.name = "small", .buf = small, .bytes = sizeof small}};
	OK(snap_io_read_rank(dir, JOB, step, 0, d, 2, &err), &err);
	CHECK(memcmp(big, data, sizeof big) == 0 && memcmp(small, data + 7, sizeof small) == 0);
}

static void no_rank_file(const char *dir, uint64_t step)
{
	char p[4096];
	snprintf(p, sizeof p, "%s/" JOB "/step-%d/rank-0.h5", dir, (int)step);
	CHECK(access(p, F_OK) != 0);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	char dir[1024], cmd[2048];
	snprintf(dir, sizeof dir, "%s/flush", argv[1]);
	snprintf(cmd, sizeof cmd, "rm -rf '%s'", argv[1]);
	CHECK(system(cmd) == 0);
	io_t_weights(A, sizeof A, 3);
	io_t_weights(B, sizeof B, 4);
	struct snap_io_err err = {0};
	/* 64 KiB writes, 4 in flight: the 1 MiB region takes 16 submits. */
	struct snap_io_opts o = {.io_bytes = 64 << 10, .queue_depth = 4};

	static const char *mode[3] = {"buffered", "direct", "direct lz4"};
	for (int m = 0; m < 3; m++) {
		int direct = m > 0;
		o.flags = direct ? 0 : SNAP_IO_NO_DIRECT;
		o.codec = m == 2 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE;
		/* LZ4: 8 chunks of "big", 2 writes each, one in flight, so the
		 * second write of a chunk waits for the first (the chunks are
		 * compressed between writes: with 4 in flight nothing waits). */
		o.chunk_bytes = 128 << 10;
		o.queue_depth = m == 2 ? 1 : 4;
		uint64_t s0 = 10 * (uint64_t)m;
		printf("%s: failed submit, then the same writer writes other data\n", mode[m]);
		struct snap_io_writer *w = snap_io_writer_new(&o, &err);
		CHECK(w);
		submits = 0;
		fail_submit_at = 6;
		EXPECT_ERR(write_one(w, dir, s0 + 1, A, &err), SNAP_EIO, &err, "rank-0.h5", "\"big\"");
		CHECK(submits >= fail_submit_at);
		fail_submit_at = 0;
		no_rank_file(dir, s0 + 1);
		OK(write_one(w, dir, s0 + 1, B, &err), &err);
		check_step(dir, s0 + 1, B);

		printf("%s: failed wait with writes in flight, then the same writer\n", mode[m]);
		/* A wait happens only when a completion is not there yet: each
		 * write that needed none is a good write (checked) and the case
		 * is tried again on a new step, up to 8 times; never skipped. */
		int rc = 0, tries = 0;
		uint64_t step;
		do {
			step = s0 + 2 + (uint64_t)tries++;
			waits = 0;
			fail_wait_at = 1;
			rc = write_one(w, dir, step, A, &err);
			fail_wait_at = 0;
			if (waits == 0) {
				OK(rc, &err);
				check_step(dir, step, A);
			}
		} while (waits == 0 && tries < 8);
		if (waits == 0) {
			fprintf(stderr, "%s: no write had to be waited for in %d tries: the failed wait was never injected\n",
				mode[m], tries);
			exit(1);
		}
		printf("  the wait failed on try %d\n", tries);
		EXPECT_ERR(rc, SNAP_EIO, &err, "rank-0.h5", "\"big\"");
		no_rank_file(dir, step);
		OK(write_one(w, dir, step, B, &err), &err);
		check_step(dir, step, B);
		snap_io_writer_free(w);
	}
	printf("io_uring_faults: all good\n");
	return 0;
}
