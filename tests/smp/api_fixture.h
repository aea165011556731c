/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * api_fixture.h - what test_api.c and test_restore_faults.c share: one
 * rank's regions (w: 1 MiB of floats in 256 KiB chunks, rng: 100 bytes),
 * values that say which step they hold, contexts that register them, and
 * the slot file holding a step, to corrupt.
 */
#ifndef SNAP_TEST_API_FIXTURE_H
#define SNAP_TEST_API_FIXTURE_H

#include <fcntl.h>
#include <stdint.h>
#include <string.h>

#include "../check.h"
#include "harness.h"
#include "snap/manifest.h"

#define N (256 * 1024)   /* floats: 1 MiB, several 256 KiB chunks */

/* Region "w" lives at wp: w, 64-byte aligned like PyTorch's tensors, or
 * w_mis, 16 bytes past that like numpy's large arrays. */
static float w[N] __attribute__((aligned(64)));
static float w_mis_store[N + 16] __attribute__((aligned(64)));
static float *const w_mis = w_mis_store + 4;
static float *wp = w;
static uint8_t rng[100];

static inline void fill(uint64_t step)
{
	for (int i = 0; i < N; i++)
		wp[i] = (float)step + (float)i * 1e-3f;
	memset(rng, (int)step, sizeof(rng));
}

static inline int is_step(uint64_t step)
{
	for (int i = 0; i < N; i++)
		if (wp[i] != (float)step + (float)i * 1e-3f)
			return 0;
	for (size_t i = 0; i < sizeof(rng); i++)
		if (rng[i] != (uint8_t)step)
			return 0;
	return 1;
}

/* w[from, to) holds step's values (a restore copied those chunks). */
static inline int holds(uint64_t step, int from, int to)
{
	for (int i = from; i < to; i++)
		if (wp[i] != (float)step + (float)i * 1e-3f)
			return 0;
	return 1;
}

static inline snap_ctx *open_job_verify(const struct smp_proc *p, const char *job, int with_regions, int verify)
{
	struct snap_config c;
	smp_cfg(&c, p, job, 0, 1);
	c.chunk_size = 256 * 1024;
	c.restore_verify = verify;
	snap_ctx *ctx;
	int rc = snap_open(&c, &ctx);
	if (rc) {
		fprintf(stderr, "open %s: %s\n", job, snap_errmsg(ctx));
		snap_close(ctx);
		return NULL;
	}
	if (with_regions) {
		struct snap_region a = { .name = "w", .ptr = wp, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32,
					 .kind = SNAP_KIND_PARAM, .ndim = 1, .shape = { N }, .global_shape = { N } };
		struct snap_region b = { .name = "rng", .ptr = rng, .bytes = sizeof(rng), .dtype = SNAP_DTYPE_U8,
					 .kind = SNAP_KIND_RNG };
		CHECK_RC(snap_register(ctx, &a), 0);
		CHECK_RC(snap_register(ctx, &b), 0);
	}
	return ctx;
}

static inline snap_ctx *open_job(const struct smp_proc *p, const char *job, int with_regions)
{
	return open_job_verify(p, job, with_regions, SNAP_VERIFY_AUTO);
}

/* Slot file of `job` rank 0 holding `step`, found through its manifest. */
static inline int slot_of(const char *store, const char *job, uint64_t step, char *path, size_t cap)
{
	for (int i = 0; i < 2; i++) {
		char m[512];
		snprintf(m, sizeof(m), "%s/%s/rank-00000/slot-%d.man", store, job, i);
		FILE *f = fopen(m, "rb");
		if (!f)
			continue;
		uint8_t buf[4096];
		size_t n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		struct snap_manifest man;
		char err[128];
		if (snap_manifest_decode(buf, n, &man, err, sizeof(err)) == 0) {
			uint64_t s = man.step;
			snap_manifest_free(&man);
			if (s == step) {
				snprintf(path, cap, "%s/%s/rank-00000/slot-%d", store, job, i);
				return 0;
			}
		}
	}
	return -1;
}

static inline void flip_byte(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b = 0;
	CHECK(fd >= 0 && pread(fd, &b, 1, off) == 1);
	b ^= 0x40;
	CHECK(pwrite(fd, &b, 1, off) == 1);
	close(fd);
}

/* A context of `job` (restore_verify `verify`) that saved steps 1 and 2;
 * path gets step 2's slot file. NULL if it could not be opened. */
static inline snap_ctx *open_saved(const struct smp_proc *p, const char *job, int verify, char *path, size_t cap)
{
	snap_ctx *ctx = open_job_verify(p, job, 1, verify);
	CHECK(ctx != NULL);
	for (uint64_t s = 1; ctx && s <= 2; s++) {
		fill(s);
		CHECK_RC(snap_save(ctx, s), 0);
		CHECK_RC(snap_wait(ctx), 0);
	}
	CHECK_RC(slot_of(p->store, job, 2, path, cap), 0);
	return ctx;
}

#endif
