/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * consumer: a program built outside libsnap's tree against an installed
 * libsnap (pkg-config or find_package), as a user's trainer would be. It
 * saves three steps of one lossless-codec region through the installed
 * snapsmp, restores the newest, flushes it to HDF5, and writes the bytes it
 * expects there so the caller can compare what h5dump decodes through the
 * installed plugin. It prints the file libsnap.so was loaded from, so the
 * caller can check it is the installed one and not the build tree's.
 * usage: consumer EXPECT_FILE     (SNAP_STORE, SNAP_JOB... from the environment)
 * Exit codes: 0 ok, 1 libsnap error, 2 usage, 3 restored bytes differ.
 */
#define _GNU_SOURCE   /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <snap/snap.h>

#define N 65536   /* floats: 256 KiB */

static void fill(float *w, uint64_t step)
{
	for (size_t i = 0; i < N; i++)
		w[i] = (float)((double)((i * 2654435761u + step * 40503u) % 100003u) * 1e-5 - 0.5);
}

static int fail(snap_ctx *ctx, const char *what, int rc)
{
	fprintf(stderr, "consumer: %s: %s (%s)\n", what, ctx ? snap_errmsg(ctx) : "", snap_strerror(rc));
	snap_close(ctx);
	return 1;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: consumer EXPECT_FILE\n");
		return 2;
	}
	static float w[N], want[N];
	struct snap_config cfg;
	char err[256];
	snap_ctx *ctx = NULL;
	snap_config_init(&cfg);
	if (snap_config_from_env(&cfg, err, sizeof(err))) {
		fprintf(stderr, "consumer: %s\n", err);
		return 2;
	}
	int rc = snap_open(&cfg, &ctx);
	if (rc)
		return fail(ctx, "snap_open", rc);
	struct snap_region r = { .name = "w", .ptr = w, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32,
				 .kind = SNAP_KIND_PARAM, .codec = SNAP_CODEC_LOSSLESS };
	if ((rc = snap_register(ctx, &r)))
		return fail(ctx, "snap_register", rc);
	uint64_t step = 0;
	rc = snap_restore(ctx, SNAP_STEP_LATEST, &step);
	if (rc != SNAP_ENOENT)   /* each run uses a job of its own */
		return fail(ctx, "snap_restore of a new job (want SNAP_ENOENT)", rc);
	for (uint64_t s = 1; s <= 3; s++) {
		if ((rc = snap_fence(ctx)))
			return fail(ctx, "snap_fence", rc);
		fill(w, s);
		if ((rc = snap_save(ctx, s)))
			return fail(ctx, "snap_save", rc);
	}
	if ((rc = snap_wait(ctx)))
		return fail(ctx, "snap_wait", rc);
	memset(w, 0, sizeof(w));
	if ((rc = snap_restore(ctx, SNAP_STEP_LATEST, &step)))
		return fail(ctx, "snap_restore", rc);
	fill(want, 3);
	if (step != 3 || memcmp(w, want, sizeof(w)) != 0) {
		fprintf(stderr, "consumer: restored step %llu differs from step 3\n", (unsigned long long)step);
		snap_close(ctx);
		return 3;
	}
	if ((rc = snap_flush(ctx, SNAP_STEP_LATEST, 1)))
		return fail(ctx, "snap_flush", rc);
	if ((rc = snap_close(ctx)))
		return fail(NULL, "snap_close", rc);
	FILE *f = fopen(argv[1], "wb");
	if (!f || fwrite(want, sizeof(want), 1, f) != 1 || fclose(f)) {
		perror(argv[1]);
		return 1;
	}
	Dl_info di;
	printf("consumer: restored step %llu bit-exact, flushed; libsnap.so from %s\n",
	       (unsigned long long)step, dladdr((void *)&snap_open, &di) && di.dli_fname ? di.dli_fname : "?");
	return 0;
}
