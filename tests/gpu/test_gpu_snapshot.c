/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * GPU regions against a real snapsmp and a real CUDA device:
 *   - stream order: the state is produced by work still queued on the
 *     trainer's stream when snap_save_on_stream() is called, and the next
 *     step's overwrite is queued right after snap_fence_on_stream(), before
 *     the copy can have finished; the restored step must be exactly the one
 *     saved (raw and lossless bit-exact, lossy within its bound);
 *   - the frames the GPU wrote are the C twin's: the manifest of a GPU save
 *     and of a host save of the same values list the same CRC32C and length
 *     for every chunk;
 *   - a GPU-saved step restores into host regions, a host-saved one into
 *     device memory;
 *   - a forgotten fence fails with SNAP_EUNFENCED; pinned memory is the
 *     granted slots and no more;
 *   - kill -9 of the trainer while its copies are in flight (child process,
 *     killed at a random moment after snap_save returned): the restarted
 *     rank restores the previous step or the new one, whole, never torn.
 * Exits 77 (ctest SKIP) without a usable CUDA device, saying why.
 * Usage: test_gpu_snapshot [--big GIB]   (GIB of state on one GPU, saved and
 *        restored once, verified; default off)
 */
#include <cuda_runtime_api.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <sys/stat.h>

#include "../check.h"
#include "../cuda_check.h"
#include "../smp/harness.h"
#include "snap/base.h"
#include "snap/manifest.h"
#include "snap/codec.h"
#include "../smp/status.h"
#include "gpu_data.h"


static uint64_t rng_state;
static uint64_t next_rand(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

struct job {
	snap_ctx *ctx;
	void *dev[NDEV];     /* the trainer's state */
	void *src[NDEV];     /* where the "optimizer" produces the next state from */
	uint8_t host[HOSTN];
};

static void upload_step(struct job *j, uint64_t s)
{
	for (int r = 0; r < NDEV; r++) {
		void *h = malloc(bytes_of(r));
		gen(r, s, h);
		CU(cudaMemcpy(j->src[r], h, bytes_of(r), cudaMemcpyHostToDevice));
		free(h);
	}
}

/* Host copies of the device regions hold step s? */
static int device_holds(struct job *j, uint64_t s)
{
	int ok = 1;
	for (int r = 0; r < NDEV; r++) {
		void *h = malloc(bytes_of(r));
		CU(cudaMemcpy(h, j->dev[r], bytes_of(r), cudaMemcpyDeviceToHost));
		if (!matches(r, s, h)) {
			fprintf(stderr, "region %s does not hold step %" PRIu64 "\n", spec[r].name, s);
			ok = 0;
		}
		free(h);
	}
	return ok;
}

/* The trainer loop on the GPU, stream-ordered, then restore checks. */
static void test_stream_order(const struct smp_proc *p, cudaStream_t st)
{
	struct job j = { 0 };
	for (int r = 0; r < NDEV; r++) {
		CU(cudaMalloc(&j.dev[r], bytes_of(r)));
		CU(cudaMalloc(&j.src[r], bytes_of(r)));
	}
	j.ctx = open_ctx(p, "gpu");
	CHECK_RC(register_all(j.ctx, j.dev, j.host, 1), 0);

	for (uint64_t s = 1; s <= 4; s++) {
		upload_step(&j, s);
		CU(cudaDeviceSynchronize());
		/* The "optimizer step": queued, not done, when the save is called.
		 * Twenty passes so the copy would see stale data if it ran early. */
		for (int k = 0; k < 20; k++)
			for (int r = 0; r < NDEV; r++)
				CU(cudaMemcpyAsync(j.dev[r], j.src[r], bytes_of(r), cudaMemcpyDeviceToDevice, st));
		gen_host(s, j.host);
		CHECK_RC(snap_save_on_stream(j.ctx, s, st), 0);
		CHECK_RC(snap_fence_on_stream(j.ctx, st), 0);
		/* The next step's writes, queued at once: they must wait for the copy. */
		for (int r = 0; r < NDEV; r++)
			CU(cudaMemsetAsync(j.dev[r], 0x5a, bytes_of(r), st));
		memset(j.host, 0xee, HOSTN);
		CHECK_RC(snap_wait(j.ctx), 0);
		CU(cudaStreamSynchronize(st));
	}
	uint64_t pinned = 0, latest = 0;
	CHECK_RC(snap_pinned(j.ctx, &pinned), 0);
	CHECK_RC(snap_latest(j.ctx, &latest), 0);
	CHECK(latest == 4);
	printf("pinned by the context: %.1f MiB\n", pinned / 1048576.0);
	CHECK(pinned > 0);
	/* snapsmp knows it too (snaptool status shows it): the commit said so. */
	uint64_t seen = 0;
	uint32_t by = 0;
	CHECK(smp_status_pinned(p->socket, &seen, &by) == 0);
	printf("pinned as snapsmp's STATUS reports it: %.1f MiB by %u process(es)\n", seen / 1048576.0, by);
	CHECK(seen == pinned && by == 1);

	/* Forgotten fence. */
	CHECK_RC(snap_save_on_stream(j.ctx, 5, st), 0);
	CHECK_RC(snap_save_on_stream(j.ctx, 6, st), SNAP_EUNFENCED);
	CHECK_RC(snap_wait(j.ctx), 0);

	/* Restore step 4 (the device memory now holds 0x5a garbage). */
	uint64_t got = 0;
	CHECK_RC(snap_restore(j.ctx, 4, &got), 0);
	CHECK(got == 4);
	CHECK(device_holds(&j, 4));
	uint8_t want[HOSTN];
	gen_host(4, want);
	CHECK(memcmp(want, j.host, HOSTN) == 0);
	CHECK_RC(snap_close(j.ctx), 0);

	/* Pinned memory is what snapsmp granted: the slots (one layout each). */
	struct snap_manifest man;
	CHECK(load_manifest(p->store, "gpu", 4, &man) == 0);
	uint64_t slots_bytes = 3 * man.layout.slot_bytes + 8ull * man.layout.ncrc;
	printf("slot bytes %" PRIu64 ", pinned %" PRIu64 "\n", man.layout.slot_bytes, pinned);
	CHECK(pinned <= slots_bytes);
	snap_manifest_free(&man);

	for (int r = 0; r < NDEV; r++) {
		cudaFree(j.dev[r]);
		cudaFree(j.src[r]);
	}
}

/* GPU frames == C twin frames; GPU save -> host restore; host save -> GPU restore. */
static void test_twins(const struct smp_proc *p, cudaStream_t st)
{
	void *dev[NDEV], *host[NDEV];
	uint8_t hb[HOSTN];
	for (int r = 0; r < NDEV; r++) {
		host[r] = malloc(bytes_of(r));
		gen(r, 7, host[r]);
		CU(cudaMalloc(&dev[r], bytes_of(r)));
		CU(cudaMemcpy(dev[r], host[r], bytes_of(r), cudaMemcpyHostToDevice));
	}
	gen_host(7, hb);
	snap_ctx *g = open_ctx(p, "twin-gpu"), *h = open_ctx(p, "twin-host");
	CHECK_RC(register_all(g, dev, hb, 1), 0);
	CHECK_RC(register_all(h, host, hb, 0), 0);
	CHECK_RC(snap_save_on_stream(g, 7, st), 0);
	CHECK_RC(snap_save(h, 7), 0);
	CHECK_RC(snap_wait(g), 0);
	CHECK_RC(snap_wait(h), 0);
	struct snap_manifest mg, mh;
	if (load_manifest(p->store, "twin-gpu", 7, &mg) == 0 && load_manifest(p->store, "twin-host", 7, &mh) == 0) {
		CHECK(mg.layout.ncrc == mh.layout.ncrc);
		int same = mg.layout.ncrc == mh.layout.ncrc;
		for (uint32_t i = 0; same && i < mg.layout.ncrc; i++)
			same = mg.crc[i] == mh.crc[i] && mg.len[i] == mh.len[i];
		CHECK(same);
		int dev_marked = 1;
		for (uint32_t i = 0; i < NDEV; i++)
			dev_marked &= mg.layout.regions[i].device == SNAP_DEVICE_CUDA;
		CHECK(dev_marked);
		printf("twin frames: %u chunks, same CRC32C and length in the GPU and the host manifest: %s\n",
		       mg.layout.ncrc, same ? "yes" : "NO");
		snap_manifest_free(&mg);
		snap_manifest_free(&mh);
	} else {
		CHECK(!"manifests of the twin saves");
	}
	CHECK_RC(snap_close(g), 0);
	CHECK_RC(snap_close(h), 0);

	/* The GPU-saved step into host memory (what a CPU-only machine does). */
	void *back[NDEV];
	uint8_t hb2[HOSTN];
	for (int r = 0; r < NDEV; r++) {
		back[r] = malloc(bytes_of(r));
		memset(back[r], 0, bytes_of(r));
	}
	snap_ctx *c = open_ctx(p, "twin-gpu");
	CHECK_RC(register_all(c, back, hb2, 0), 0);
	uint64_t got = 0;
	CHECK_RC(snap_restore(c, SNAP_STEP_LATEST, &got), 0);
	for (int r = 0; r < NDEV; r++)
		CHECK(matches(r, 7, back[r]));
	CHECK_RC(snap_close(c), 0);

	/* The host-saved step into device memory. */
	for (int r = 0; r < NDEV; r++)
		CU(cudaMemset(dev[r], 0, bytes_of(r)));
	c = open_ctx(p, "twin-host");
	CHECK_RC(register_all(c, dev, hb2, 1), 0);
	CHECK_RC(snap_restore(c, SNAP_STEP_LATEST, &got), 0);
	for (int r = 0; r < NDEV; r++) {
		CU(cudaMemcpy(back[r], dev[r], bytes_of(r), cudaMemcpyDeviceToHost));
		CHECK(matches(r, 7, back[r]));
	}
	CHECK_RC(snap_close(c), 0);
	for (int r = 0; r < NDEV; r++) {
		cudaFree(dev[r]);
		free(host[r]);
		free(back[r]);
	}
}

/* ---- kill -9 mid-copy ---------------------------------------------------- */

#define KILL_BYTES (1ull << 30)

/* Child: step s+1 saved and committed, its save->commit time sent on fd;
 * then step s+2 saved, and one byte sent once snap_save returned. */
static int child_main(const char *store, int fd)
{
	struct smp_proc p = { 0 };
	snprintf(p.store, sizeof(p.store), "%s", store);
	snprintf(p.socket, sizeof(p.socket), "%s/smp.sock", store);
	void *d;
	CU(cudaMalloc(&d, KILL_BYTES));
	snap_ctx *ctx = open_ctx(&p, "kill");
	struct snap_region g = { .name = "big", .ptr = d, .bytes = KILL_BYTES, .dtype = SNAP_DTYPE_U8,
				 .kind = SNAP_KIND_PARAM, .device = SNAP_DEVICE_CUDA };
	if (snap_register(ctx, &g)) {
		fprintf(stderr, "child register: %s\n", snap_errmsg(ctx));
		return 1;
	}
	uint64_t s = 0;
	int rc = snap_restore(ctx, SNAP_STEP_LATEST, &s);
	if (rc && rc != SNAP_ENOENT)
		return 1;
	for (uint64_t k = s + 1;; k++) {
		CU(cudaMemset(d, (int)(k & 0xff), KILL_BYTES));
		CU(cudaDeviceSynchronize());
		uint64_t t0 = snap_now_ns();
		if (snap_save(ctx, k))
			return 1;
		/* The first save commits before the parent is told anything. */
		if (k == s + 1) {
			if (snap_wait(ctx))
				return 1;
			uint64_t dt = snap_now_ns() - t0;
			if (write(fd, &dt, sizeof(dt)) != sizeof(dt))
				return 1;
		}
		if (k == s + 2) {
			/* The copy is in flight now: the parent strikes within it. */
			char b = '2';
			if (write(fd, &b, 1) != 1)
				return 1;
			snap_wait(ctx);
			pause();
		}
	}
}

static void test_kill(const struct smp_proc *p, const char *self, int trials)
{
	unsigned killed_mid = 0, committed = 0;
	for (int t = 0; t < trials; t++) {
		int pfd[2];
		CHECK(pipe(pfd) == 0);
		pid_t pid = fork();
		if (pid == 0) {
			close(pfd[0]);
			char fdbuf[16];
			snprintf(fdbuf, sizeof(fdbuf), "%d", pfd[1]);
			execl(self, self, "--child", p->store, fdbuf, (char *)NULL);
			_exit(127);
		}
		close(pfd[1]);
		uint64_t dur = 0;
		char b = 0;
		CHECK(read(pfd[0], &dur, sizeof(dur)) == sizeof(dur));
		CHECK(read(pfd[0], &b, 1) == 1 && b == '2');
		/* Strike at a random moment within the copy, whose length the
		 * child measured on the save before (same bytes, same path). */
		uint64_t at = dur ? next_rand() % dur : 0;
		struct timespec ts = { (time_t)(at / 1000000000u), (long)(at % 1000000000u) };
		nanosleep(&ts, NULL);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		close(pfd[0]);

		/* A fresh process: the newest step is whole, whichever it is. */
		snap_ctx *ctx = open_ctx(p, "kill");
		void *d;
		CU(cudaMalloc(&d, KILL_BYTES));
		struct snap_region g = { .name = "big", .ptr = d, .bytes = KILL_BYTES, .dtype = SNAP_DTYPE_U8,
					 .kind = SNAP_KIND_PARAM, .device = SNAP_DEVICE_CUDA };
		CHECK_RC(snap_register(ctx, &g), 0);
		uint64_t s = 0;
		CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &s), 0);
		uint8_t *h = malloc(KILL_BYTES);
		CU(cudaMemcpy(h, d, KILL_BYTES, cudaMemcpyDeviceToHost));
		size_t bad = 0;
		for (size_t i = 0; i < KILL_BYTES; i++)
			bad += h[i] != (uint8_t)(s & 0xff);
		CHECK(bad == 0);
		free(h);
		cudaFree(d);
		snap_close(ctx);
		/* Each trial's child continues from the step restored before it. */
		static uint64_t prev_done;
		CHECK(s == prev_done + 1 || s == prev_done + 2);
		(s == prev_done + 2) ? committed++ : killed_mid++;
		prev_done = s;
	}
	printf("kill -9 mid-copy: %d trials; the in-flight step was lost (previous one restored) in %u, "
	       "had committed in %u; 0 torn\n", trials, killed_mid, committed);
}

/* ---- big state ----------------------------------------------------------- */

static void test_big(const struct smp_proc *p, unsigned gib)
{
	uint64_t total = (uint64_t)gib << 30, per = 1ull << 30;
	unsigned nreg = gib;
	void **d = calloc(nreg, sizeof(void *));
	snap_ctx *ctx = open_ctx(p, "big");
	for (unsigned i = 0; i < nreg; i++) {
		CU(cudaMalloc(&d[i], per));
		CU(cudaMemset(d[i], (int)(i + 1), per));
		char name[32];
		snprintf(name, sizeof(name), "layer%u", i);
		struct snap_region g = { .name = name, .ptr = d[i], .bytes = per, .dtype = SNAP_DTYPE_U8,
					 .kind = SNAP_KIND_PARAM, .device = SNAP_DEVICE_CUDA };
		CHECK_RC(snap_register(ctx, &g), 0);
	}
	CU(cudaDeviceSynchronize());
	/* Steps 1-3 each map and pin one of the 3 slots (once per slot, seconds
	 * for 10 GiB: the kernel populates and locks every page); step 4 reuses
	 * step 1's slot, already pinned: that is the steady state. */
	uint64_t tp = snap_now_ns();
	for (uint64_t k = 1; k <= 3; k++) {
		CHECK_RC(snap_save(ctx, k), 0);
		CHECK_RC(snap_wait(ctx), 0);
	}
	printf("big: first three saves (mapping and pinning 3 slots of %u GiB) took %.2f s\n", gib,
	       (snap_now_ns() - tp) / 1e9);
	for (unsigned i = 0; i < nreg; i++)
		CU(cudaMemset(d[i], (int)(i + 1), per));
	CU(cudaDeviceSynchronize());
	uint64_t t0 = snap_now_ns();
	CHECK_RC(snap_save(ctx, 4), 0);
	uint64_t t1 = snap_now_ns();
	CHECK_RC(snap_wait(ctx), 0);
	uint64_t t2 = snap_now_ns();
	for (unsigned i = 0; i < nreg; i++)
		CU(cudaMemset(d[i], 0, per));
	uint64_t s = 0;
	CHECK_RC(snap_restore(ctx, 4, &s), 0);
	uint64_t t3 = snap_now_ns();
	uint8_t *h = malloc(per);
	size_t bad = 0;
	for (unsigned i = 0; i < nreg; i++) {
		CU(cudaMemcpy(h, d[i], per, cudaMemcpyDeviceToHost));
		for (size_t k = 0; k < per; k++)
			bad += h[k] != (uint8_t)(i + 1);
	}
	CHECK(bad == 0);
	printf("big: %u GiB on one GPU: snap_save blocked %.3f ms, committed in %.3f s (%.1f GB/s), "
	       "restored in %.3f s, verified: %s\n", gib, (t1 - t0) / 1e6, (t2 - t0) / 1e9,
	       total / ((t2 - t0) / 1e9) / 1e9, (t3 - t2) / 1e9, bad ? "NO" : "yes");
	free(h);
	snap_close(ctx);
	for (unsigned i = 0; i < nreg; i++)
		cudaFree(d[i]);
	free(d);
}

/*
 * --fixture OUT.tar.gz: a small step saved from this GPU (job "fixture",
 * step 11), the store tarred for tests/gpu/data: gpu.saved restores it on
 * machines without a GPU.
 */
static int make_fixture(const char *out)
{
	gpu_data_div = 64;
	char store[128], cmd[600];
	snprintf(store, sizeof(store), "/dev/shm/snap-gpu-fixture-%d", (int)getpid());
	rm_rf(store);
	struct smp_proc p = { 0 };
	if (smp_start(&p, store, NULL) != 0)
		return 1;
	void *dev[NDEV];
	uint8_t host[HOSTN];
	for (int r = 0; r < NDEV; r++) {
		void *h = malloc(bytes_of(r));
		gen(r, 11, h);
		CU(cudaMalloc(&dev[r], bytes_of(r)));
		CU(cudaMemcpy(dev[r], h, bytes_of(r), cudaMemcpyHostToDevice));
		free(h);
	}
	gen_host(11, host);
	snap_ctx *ctx = open_ctx(&p, "fixture");
	CHECK_RC(register_all(ctx, dev, host, 1), 0);
	CHECK_RC(snap_save(ctx, 11), 0);
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(snap_close(ctx), 0);
	smp_stop(&p, SIGTERM);
	snprintf(cmd, sizeof(cmd), "tar -C '%s' --exclude=smp.sock -czf '%s' .", store, out);
	CHECK(system(cmd) == 0);
	rm_rf(store);
	return check_done("fixture");
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "--fixture") == 0)
		return make_fixture(argv[2]);
	if (argc == 4 && strcmp(argv[1], "--child") == 0)
		return child_main(argv[2], atoi(argv[3]));
	unsigned big = argc == 3 && strcmp(argv[1], "--big") == 0 ? (unsigned)atoi(argv[2]) : 0;

	/* Kill trials first: their children must fork before this process
	 * touches CUDA (a CUDA context does not survive fork). */
	int ndev = 0;
	pid_t probe = fork();
	if (probe == 0)
		_exit(cudaGetDeviceCount(&ndev) == cudaSuccess && ndev > 0 ? 0 : 77);
	int pst = 0;
	waitpid(probe, &pst, 0);
	if (!WIFEXITED(pst) || WEXITSTATUS(pst) != 0) {
		printf("SKIP: no usable CUDA device (cudaGetDeviceCount found none): the GPU snapshot path is "
		       "not tested on this machine\n");
		return 77;
	}
	rng_state = (uint64_t)getpid() * 2654435761u + 1;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snap-gpu-test-%d", (int)getpid());
	rm_rf(store);
	struct smp_proc p = { 0 };
	const char *extra[] = { "--mem-limit", big ? "40G" : "8G", "--slots", "3", NULL };
	if (smp_start(&p, store, extra) != 0) {
		fprintf(stderr, "cannot start snapsmp\n");
		return 1;
	}
	test_kill(&p, argv[0], 8);

	cudaStream_t st;
	CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	test_stream_order(&p, st);
	test_twins(&p, st);
	if (big)
		test_big(&p, big);
	CU(cudaStreamDestroy(st));
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	return check_done("test_gpu_snapshot");
}
