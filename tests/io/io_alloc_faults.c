/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Out of memory inside the writer, injected by wrapping the allocator
 * (linked with -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,
 * --wrap=posix_memalign: snapio's own allocations, not HDF5's or libc's).
 * While a step of a codec-frame region and a raw region is written with a
 * writer made for it, the k-th allocation fails, for k = 1, 2, ... until a
 * write no longer reaches a k-th one. Each write must either fail with
 * SNAP_ENOMEM and leave no rank file, or succeed (an allocation it can do
 * without) with a file that verifies; the step written before must still
 * verify and read back. Under ASan, a leak on any of these paths fails the
 * run at exit.
 * usage: io_alloc_faults DIR
 */
#include <errno.h>
#include <unistd.h>

#include "io_testutil.h"

#define JOB "allocs"
#define NV (16 * 1024) /* 16 frames of 1024 values */
#define FRAME 1024

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);

static int calls, fail_at;

static int fail_now(void)
{
	return fail_at && ++calls == fail_at;
}

void *__wrap_malloc(size_t n)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
	if (fail_now()) {
		errno = ENOMEM;
		return NULL;
	}
	return __real_realloc(p, n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
	if (fail_now())
		return ENOMEM;
	return __real_posix_memalign(p, a, n);
}

static float V[NV], R[1000];
static struct io_t_frames F;

static int write_step(const char *dir, uint64_t step, struct snap_io_err *err)
{
	struct snap_io_writer *w = snap_io_writer_new(NULL, err);
	if (!w)
		return err->code ? err->code : SNAP_ENOMEM;
	int rc = io_t_write_fr(w, dir, JOB, step, &F, R, err);
	snap_io_writer_free(w);
	return rc;
}

static void check_step(const char *dir, uint64_t step)
{
	io_t_check_fr(dir, JOB, step, &F, R);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	char dir[1024], cmd[2048];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s/flush'", argv[1], argv[1]);
	CHECK(system(cmd) == 0);
	snprintf(dir, sizeof dir, "%s/flush", argv[1]);
	io_t_weights(V, sizeof V, 7);
	io_t_weights(R, sizeof R, 8);
	io_t_frames_make(&F, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, V, NV, FRAME);

	struct snap_io_err err = {0};
	OK(write_step(dir, 1, &err), &err);
	int failed = 0, survived = 0;
	uint64_t step = 2;
	for (int k = 1;; k++) {
		calls = 0;
		fail_at = k;
		memset(&err, 0, sizeof err);
		int rc = write_step(dir, step, &err);
		fail_at = 0;
		if (calls < k) { /* no k-th allocation: the sweep is over */
			OK(rc, &err);
			check_step(dir, step);
			break;
		}
		char p[2048];
		snprintf(p, sizeof p, "%s/" JOB "/step-%d/rank-0.h5", dir, (int)step);
		if (rc == 0) {
			survived++;
			check_step(dir, step++);
		} else {
			if (rc != SNAP_ENOMEM)
				fprintf(stderr, "allocation %d failing: %s (%d), want SNAP_ENOMEM: %s\n", k, snap_strerror(rc),
					rc, err.msg);
			CHECK(rc == SNAP_ENOMEM);
			printf("  allocation %d: %s\n", k, err.msg);
			CHECK(strstr(err.msg, "out of memory") || strstr(err.msg, "Cannot allocate memory"));
			CHECK(access(p, F_OK) != 0);
			failed++;
		}
		check_step(dir, 1);
	}
	printf("%d allocations failed in turn: %d writes failed with SNAP_ENOMEM and left no file, %d did without"
	       " and verified; step 1 intact\n", failed + survived, failed, survived);
	CHECK(failed > 0);
	io_t_frames_free(&F);
	printf("io_alloc_faults: all good\n");
	return 0;
}
