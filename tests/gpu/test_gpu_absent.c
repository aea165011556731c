/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU regions where there is no GPU path: what CI checks on every machine.
 * A CUDA region is refused with SNAP_EUNSUPPORTED (no backend, no driver or
 * no device) or SNAP_EINVAL (a GPU machine, but the pointer is host memory),
 * and the message names the region and the reason; a broken
 * SNAP_CUDA_MODULE is named too. The context stays usable: host regions
 * registered beside it save and restore as ever. Runs against a real
 * snapsmp; needs no CUDA toolkit (libsnap.so never links CUDA).
 */
#include <stdint.h>
#include <stdlib.h>

#include "../check.h"
#include "../smp/harness.h"

static float host[1 << 16];

static snap_ctx *open_ctx(const struct smp_proc *p)
{
	struct snap_config c;
	smp_cfg(&c, p, "absent", 0, 1);
	c.chunk_size = 64 * 1024;
	snap_ctx *ctx = NULL;
	CHECK_RC(snap_open(&c, &ctx), 0);
	return ctx;
}

static void refused(snap_ctx *ctx, const char *why_part)
{
	struct snap_region g = { .name = "layer0.weight", .ptr = host, .bytes = sizeof(host),
				 .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM, .device = SNAP_DEVICE_CUDA };
	int rc = snap_register(ctx, &g);
	printf("CUDA region refused: rc %d (%s): %s\n", rc, snap_strerror(rc), snap_errmsg(ctx));
	CHECK(rc == SNAP_EUNSUPPORTED || rc == SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "\"layer0.weight\"") != NULL);
	if (why_part)
		CHECK(strstr(snap_errmsg(ctx), why_part) != NULL);
	struct snap_region bad = g;
	bad.name = "odd";
	bad.device = 7;
	CHECK_RC(snap_register(ctx, &bad), SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "unknown device 7") != NULL);
}

int main(void)
{
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snap-gpu-absent-%d", (int)getpid());
	rm_rf(store);
	struct smp_proc p = { 0 };
	if (smp_start(&p, store, NULL) != 0) {
		fprintf(stderr, "cannot start snapsmp\n");
		return 1;
	}

	/* An explicit module path that does not exist is the reason given. */
	setenv("SNAP_CUDA_MODULE", "/nonexistent/libsnap_cuda.so", 1);
	pid_t pid = fork();
	if (pid == 0) {
		snap_ctx *ctx = open_ctx(&p);
		refused(ctx, "SNAP_CUDA_MODULE=/nonexistent/libsnap_cuda.so");
		snap_close(ctx);
		fflush(stdout);
		_exit(check_failures ? 1 : 0);
	}
	int st = 0;
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	unsetenv("SNAP_CUDA_MODULE");

	/* This machine as it is: no backend built, or no device, or (on a GPU
	 * machine) host memory passed as device memory. */
	snap_ctx *ctx = open_ctx(&p);
	refused(ctx, NULL);
	for (size_t i = 0; i < sizeof(host) / 4; i++)
		host[i] = (float)i;
	struct snap_region h = { .name = "host", .ptr = host, .bytes = sizeof(host), .dtype = SNAP_DTYPE_F32,
				 .kind = SNAP_KIND_PARAM };
	CHECK_RC(snap_register(ctx, &h), 0);
	CHECK_RC(snap_save_on_stream(ctx, 1, NULL), 0);   /* no CUDA region: the stream is ignored */
	CHECK_RC(snap_fence_on_stream(ctx, NULL), 0);
	CHECK_RC(snap_wait(ctx), 0);
	uint64_t pinned = 1;
	CHECK_RC(snap_pinned(ctx, &pinned), 0);
	CHECK(pinned == 0);
	memset(host, 0, sizeof(host));
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 1 && host[12345] == 12345.0f);
	CHECK_RC(snap_close(ctx), 0);
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	return check_done("test_gpu_absent");
}
