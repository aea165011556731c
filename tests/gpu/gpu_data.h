/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * gpu_data.h - the regions and values the GPU tests save, shared by
 * test_gpu_snapshot (on a GPU) and test_gpu_saved (on any machine, from a
 * store a GPU filled): raw f32, lossless bf16, lossy f32 and host bytes,
 * weight-like values that depend on the step. No CUDA here.
 */
#ifndef SNAP_TEST_GPU_DATA_H
#define SNAP_TEST_GPU_DATA_H

#include <glob.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "../check.h"
#include "../smp/harness.h"
#include "snap/manifest.h"
#include "snap/codec.h"

/* Sizes are divided by this (the fixture committed for CI is small). */
static size_t gpu_data_div = 1;

#define CHUNK (1u << 20)

/* The regions of the test job: raw f32, lossless bf16, lossy f32, host bytes. */
enum { R_RAW, R_BF16, R_LOSSY, NDEV };
static const struct {
	const char *name;
	int dtype, codec;
	double bound;
	size_t n;            /* elements */
} spec[NDEV] = {
	{ "w.raw", SNAP_DTYPE_F32, SNAP_CODEC_NONE, 0, (40u << 20) / 4 + 777 },
	{ "w.bf16", SNAP_DTYPE_BF16, SNAP_CODEC_LOSSLESS, 0, (6u << 20) / 2 + 5 },
	{ "adam.f32", SNAP_DTYPE_F32, SNAP_CODEC_LOSSY_ABS, 1e-3, (12u << 20) / 4 + 3 },
};
#define HOSTN 4099

static size_t n_of(int r)
{
	return spec[r].n / gpu_data_div + 3;
}


/* Weight-like values of step s (so lossy really quantizes), a special value now and then. */
static void gen(int r, uint64_t s, void *out)
{
	size_t n = n_of(r);
	float *f = malloc(n * 4);
	uint64_t x = 0x9e3779b97f4a7c15ull * (s + 1) + (uint64_t)r * 7919;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		f[i] = (float)((int64_t)(x % 100001) - 50000) * 1e-6f;
		if (i % 997 == 13)
			f[i] = i % 3 ? 1e8f : NAN;
	}
	if (spec[r].dtype == SNAP_DTYPE_F32)
		memcpy(out, f, n * 4);
	else
		snap_codec_convert(spec[r].dtype, out, SNAP_DTYPE_F32, f, n);
	free(f);
}

static void gen_host(uint64_t s, uint8_t *h)
{
	for (int i = 0; i < HOSTN; i++)
		h[i] = (uint8_t)(s * 31 + (uint64_t)i);
}

static size_t bytes_of(int r)
{
	return n_of(r) * snap_dtype_size(spec[r].dtype);
}

/* Does restored region r (host copy) hold step s? Exact, or within the bound. */
static int matches(int r, uint64_t s, const void *got)
{
	size_t b = bytes_of(r);
	void *want = malloc(b);
	gen(r, s, want);
	int ok = 1;
	if (spec[r].codec != SNAP_CODEC_LOSSY_ABS) {
		ok = memcmp(want, got, b) == 0;
	} else {
		const float *w = want, *g = got;
		for (size_t i = 0; i < n_of(r) && ok; i++) {
			if (isnan(w[i]))
				ok = isnan(g[i]);
			else if (isinf(w[i]))
				ok = w[i] == g[i];
			else
				ok = fabs((double)w[i] - (double)g[i]) <= spec[r].bound;
		}
		/* ...and not bit-exact everywhere: the codec really quantized. */
		if (ok && memcmp(want, got, b) == 0)
			ok = 0;
	}
	free(want);
	return ok;
}

static snap_ctx *open_ctx(const struct smp_proc *p, const char *job)
{
	struct snap_config c;
	smp_cfg(&c, p, job, 0, 1);
	c.chunk_size = CHUNK;
	c.copy_threads = 4;
	c.timeout_ms = 20000;
	snap_ctx *ctx = NULL;
	int rc = snap_open(&c, &ctx);
	if (rc) {
		fprintf(stderr, "open %s: %s\n", job, snap_errmsg(ctx));
		exit(1);
	}
	return ctx;
}

/* Register the job's regions; device != 0: the three float regions on the GPU. */
static int register_all(snap_ctx *ctx, void *const ptr[NDEV], uint8_t *host, int device)
{
	for (int r = 0; r < NDEV; r++) {
		struct snap_region g = { .name = spec[r].name, .ptr = ptr[r], .bytes = bytes_of(r),
					 .dtype = spec[r].dtype, .kind = SNAP_KIND_PARAM,
					 .device = device ? SNAP_DEVICE_CUDA : SNAP_DEVICE_HOST,
					 .codec = spec[r].codec, .codec_bound = spec[r].bound };
		int rc = snap_register(ctx, &g);
		if (rc) {
			fprintf(stderr, "register %s: %s\n", spec[r].name, snap_errmsg(ctx));
			return rc;
		}
	}
	struct snap_region h = { .name = "rng", .ptr = host, .bytes = HOSTN, .dtype = SNAP_DTYPE_U8,
				 .kind = SNAP_KIND_RNG };
	return snap_register(ctx, &h);
}

/* The manifest of `job` rank 0 for `step` (decoded), from the store. */
static int load_manifest(const char *store, const char *job, uint64_t step, struct snap_manifest *man)
{
	char pat[400];
	snprintf(pat, sizeof(pat), "%s/%s/rank-00000/slot-*.man", store, job);
	glob_t g;
	if (glob(pat, 0, NULL, &g))
		return -1;
	int found = -1;
	for (size_t i = 0; i < g.gl_pathc && found; i++) {
		FILE *f = fopen(g.gl_pathv[i], "rb");
		if (!f)
			continue;
		static uint8_t buf[1 << 20];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		char err[200];
		if (snap_manifest_decode(buf, n, man, err, sizeof(err)) == 0) {
			if (man->step == step)
				found = 0;
			else
				snap_manifest_free(man);
		}
	}
	globfree(&g);
	return found;
}

#endif
