/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Read failures inside the writer, injected by wrapping pread (linked with
 * -Wl,--wrap=pread: snapio's own reads, not HDF5's or libc's): the bulk
 * pass's reads of the padding between codec frames that it merges into one
 * O_DIRECT run (write.c), and any read the file driver makes for HDF5
 * (deferdrv.c; HDF5 made none while writing these new files, on 1.10). While
 * a step of frame regions is written, the k-th pread fails,
 * for k = 1, 2, ... until a write no longer reaches a k-th one. Every failed
 * write must say SNAP_EIO naming the rank file and leave no rank file;
 * afterwards every step written reads back bit-exact and verifies. At least
 * one failure must have hit the padding ("between two frames"), else the
 * sweep proved nothing. Without O_DIRECT (nothing is merged then) that check
 * is an optional case, counted as skipped in the summary (tests/skiprule.h).
 * usage: io_pread_faults DIR
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "io_testutil.h"
#include "../skiprule.h"

#define JOB "preads"
#define NV (64 * 1024) /* values in the frame region: 64 frames of 1024 */
#define FRAME 1024

ssize_t __real_pread(int fd, void *buf, size_t n, off_t off);
ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off);

static int calls, fail_at;

ssize_t __wrap_pread(int fd, void *buf, size_t n, off_t off)
{
	if (fail_at && ++calls == fail_at) {
		errno = EIO;
		return -1;
	}
	return __real_pread(fd, buf, n, off);
}

static float V[NV], R[1000];
static struct io_t_frames F;

static int write_step(struct snap_io_writer *w, const char *dir, uint64_t step, struct snap_io_err *err)
{
	return io_t_write_fr(w, dir, JOB, step, &F, R, err);
}

static void check_step(const char *dir, uint64_t step)
{
	io_t_check_fr(dir, JOB, step, &F, R);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	char dir[1024], cmd[2048], probe[1100];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/flush'", argv[1], argv[1]);
	CHECK(system(cmd) == 0);
	snprintf(dir, sizeof dir, "%s/flush", argv[1]);
	io_t_weights(V, sizeof V, 5);
	io_t_weights(R, sizeof R, 6);
	io_t_frames_make(&F, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, V, NV, FRAME);

	snprintf(probe, sizeof probe, "%s/probe", dir);
	int pf = open(probe, O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	int direct = pf >= 0;
	if (pf >= 0)
		close(pf);
	unlink(probe);
	/* Without O_DIRECT nothing is merged, so no read of padding exists. */
	skiprule_optional("the padding check", "a flush directory that takes O_DIRECT", direct);

	struct snap_io_err err = {0};
	struct snap_io_writer *w = snap_io_writer_new(NULL, &err);
	CHECK(w);
	OK(write_step(w, dir, 1, &err), &err);
	int failed = 0, padding = 0, k;
	for (k = 1;; k++) {
		calls = 0;
		fail_at = k;
		int rc = write_step(w, dir, 2, &err);
		fail_at = 0;
		if (calls < k) { /* no k-th read: the sweep is over */
			OK(rc, &err);
			break;
		}
		EXPECT_ERR(rc, SNAP_EIO, &err, "rank-0.h5");
		padding += strstr(err.msg, "between two frames") != NULL;
		failed++;
		char p[2048];
		snprintf(p, sizeof p, "%s/" JOB "/step-2/rank-0.h5", dir);
		CHECK(access(p, F_OK) != 0);
		check_step(dir, 1);
		memset(&err, 0, sizeof err);
	}
	check_step(dir, 2);
	printf("%d reads failed in turn (%d of the padding between frames); each write failed cleanly, step 1 intact\n",
	       failed, padding);
	if (direct)
		CHECK(padding > 0);
	snap_io_writer_free(w);
	io_t_frames_free(&F);
	skiprule_summary("io_pread_faults");
	return 0;
}
