/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A step saved from a GPU restores on a machine without one. The fixture
 * data/gpu_saved_store.tar.gz is a node store an NVIDIA H100 filled
 * (test_gpu_snapshot --fixture): job "fixture", step 11, raw f32, lossless
 * bf16 and lossy f32 regions in device memory (frames made by the CUDA
 * kernels) and a host region. Here a real snapsmp serves it and the step is
 * restored into host memory: raw and lossless bit-exact, lossy within its
 * bound, the manifest saying the regions were on the GPU. A flipped byte in
 * a GPU-made frame is refused, naming the region. Runs in CI.
 * Usage: test_gpu_saved FIXTURE.tar.gz
 */
#include <sys/stat.h>

#include "gpu_data.h"

static void restore_into_host(const struct smp_proc *p, int want_rc)
{
	void *back[NDEV];
	uint8_t hb[HOSTN];
	for (int r = 0; r < NDEV; r++)
		back[r] = calloc(1, bytes_of(r));
	snap_ctx *ctx = open_ctx(p, "fixture");
	CHECK_RC(register_all(ctx, back, hb, 0), 0);
	uint64_t got = 0;
	int rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
	CHECK_RC(rc, want_rc);
	if (rc == 0) {
		CHECK(got == 11);
		for (int r = 0; r < NDEV; r++)
			CHECK(matches(r, 11, back[r]));
		uint8_t want[HOSTN];
		gen_host(11, want);
		CHECK(memcmp(want, hb, HOSTN) == 0);
	} else {
		printf("refused as it should be: %s\n", snap_errmsg(ctx));
		CHECK(strstr(snap_errmsg(ctx), "adam.f32") != NULL);
	}
	snap_close(ctx);
	for (int r = 0; r < NDEV; r++)
		free(back[r]);
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_gpu_saved FIXTURE.tar.gz\n");
		return 2;
	}
	gpu_data_div = 64;
	char store[128], cmd[600];
	snprintf(store, sizeof(store), "/dev/shm/snap-gpu-saved-%d", (int)getpid());
	rm_rf(store);
	mkdir(store, 0700);
	snprintf(cmd, sizeof(cmd), "tar -C '%s' -xzf '%s'", store, argv[1]);
	if (system(cmd) != 0) {
		fprintf(stderr, "cannot unpack %s\n", argv[1]);
		return 1;
	}
	struct snap_manifest man;
	CHECK(load_manifest(store, "fixture", 11, &man) == 0);
	int on_gpu = 1;
	for (int r = 0; r < NDEV; r++)
		on_gpu &= man.layout.regions[r].device == SNAP_DEVICE_CUDA;
	CHECK(on_gpu);
	uint64_t lossy_off = man.layout.regions[R_LOSSY].offset;
	uint32_t slot = man.slot;
	snap_manifest_free(&man);

	struct smp_proc p = { 0 };
	if (smp_start(&p, store, NULL) != 0) {
		fprintf(stderr, "cannot start snapsmp\n");
		return 1;
	}
	restore_into_host(&p, 0);

	/* Flip a byte inside the first GPU-made lossy frame: refused. */
	smp_stop(&p, SIGKILL);
	char path[300];
	snprintf(path, sizeof(path), "%s/fixture/rank-00000/slot-%u", store, slot);
	FILE *f = fopen(path, "r+b");
	CHECK(f != NULL);
	if (f) {
		uint8_t b = 0;
		long at = (long)lossy_off + 100;
		CHECK(fseek(f, at, SEEK_SET) == 0 && fread(&b, 1, 1, f) == 1);
		b ^= 0x10;
		CHECK(fseek(f, at, SEEK_SET) == 0 && fwrite(&b, 1, 1, f) == 1);
		fclose(f);
	}
	CHECK(smp_start(&p, store, NULL) == 0);
	restore_into_host(&p, SNAP_ECORRUPT);
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	return check_done("test_gpu_saved");
}
