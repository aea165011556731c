/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap_describe() against a real snapsmp: a process that does not know a
 * step's layout learns it, registers it and restores; nothing is frozen by
 * describing; the errors (nothing restorable, too little room, another world
 * size). And what the PyTorch package relies on when a layout changes: a
 * context closed and opened again in the same process, with a new layout,
 * withdraws no committed step (alone, and with other ranks connected or not).
 */
#include <inttypes.h>
#include <stdint.h>

#include "../check.h"
#include "harness.h"

#define ROWS 64
#define COLS 1024

static float w[ROWS * COLS];    /* rows 64..127 of a 256 x 1024 tensor */
static uint8_t bytes[5000];
static int64_t counter;
static float extra[300];

static void fill(uint64_t step)
{
	for (int i = 0; i < ROWS * COLS; i++)
		w[i] = (float)step * 0.5f + (float)i;
	memset(bytes, (int)(step & 0xff), sizeof(bytes));
	counter = (int64_t)step * 7;
	for (int i = 0; i < 300; i++)
		extra[i] = (float)step - (float)i;
}

static int is_step(uint64_t step, int with_extra)
{
	for (int i = 0; i < ROWS * COLS; i++)
		if (w[i] != (float)step * 0.5f + (float)i)
			return 0;
	for (size_t i = 0; i < sizeof(bytes); i++)
		if (bytes[i] != (uint8_t)step)
			return 0;
	for (int i = 0; with_extra && i < 300; i++)
		if (extra[i] != (float)step - (float)i)
			return 0;
	return counter == (int64_t)step * 7;
}

static snap_ctx *open_rank(const struct smp_proc *p, const char *job, int rank, int world)
{
	struct snap_config c;
	snap_config_init(&c);
	snprintf(c.store, sizeof(c.store), "%s", p->store);
	snprintf(c.job, sizeof(c.job), "%s", job);
	c.rank = rank;
	c.world_size = world;
	c.chunk_size = 64 * 1024;
	c.timeout_ms = 20000;
	snap_ctx *ctx;
	if (snap_open(&c, &ctx)) {
		fprintf(stderr, "open %s rank %d: %s\n", job, rank, snap_errmsg(ctx));
		snap_close(ctx);
		return NULL;
	}
	return ctx;
}

static void reg(snap_ctx *ctx, int with_extra)
{
	struct snap_region a = { .name = "model/w", .ptr = w, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32,
				 .kind = SNAP_KIND_PARAM, .ndim = 2, .shape = { ROWS, COLS },
				 .global_shape = { 4 * ROWS, COLS }, .shard_offset = { ROWS, 0 } };
	struct snap_region b = { .name = "meta", .ptr = bytes, .bytes = sizeof(bytes), .dtype = SNAP_DTYPE_U8,
				 .kind = SNAP_KIND_OTHER };
	struct snap_region c = { .name = "optim/0/step", .ptr = &counter, .bytes = 8, .dtype = SNAP_DTYPE_I64,
				 .kind = SNAP_KIND_OPTIM, .ndim = 1, .shape = { 1 }, .global_shape = { 1 } };
	struct snap_region d = { .name = "optim/0/exp_avg", .ptr = extra, .bytes = sizeof(extra),
				 .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_OPTIM, .ndim = 1, .shape = { 300 },
				 .global_shape = { 300 } };
	CHECK_RC(snap_register(ctx, &a), 0);
	CHECK_RC(snap_register(ctx, &b), 0);
	CHECK_RC(snap_register(ctx, &c), 0);
	if (with_extra)
		CHECK_RC(snap_register(ctx, &d), 0);
}

static void save(snap_ctx *ctx, uint64_t step)
{
	fill(step);
	CHECK_RC(snap_save(ctx, step), 0);
	CHECK_RC(snap_wait(ctx), 0);
}

static void test_describe_then_restore(const struct smp_proc *p)
{
	snap_ctx *ctx = open_rank(p, "d", 0, 1);
	CHECK(ctx != NULL);
	if (!ctx)
		return;
	uint32_t n = 99;
	uint64_t step = 0;
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, NULL, 0, &n), SNAP_ENOENT);
	CHECK(n == 0);
	reg(ctx, 0);
	save(ctx, 5);
	CHECK_RC(snap_close(ctx), 0);

	/* The layout changes (optimizer state appears): close, open, register again. */
	ctx = open_rank(p, "d", 0, 1);
	reg(ctx, 1);
	save(ctx, 6);
	CHECK_RC(snap_close(ctx), 0);

	/* A fresh context knows nothing: it asks. */
	ctx = open_rank(p, "d", 0, 1);
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, NULL, 0, NULL), SNAP_EINVAL);
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, NULL, 1, &n), SNAP_EINVAL);
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, NULL, 0, &n), SNAP_EOVERFLOW);
	CHECK(step == 6 && n == 4);
	struct snap_region_info info[4];
	memset(info, 0x5a, sizeof(info));
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, info, 2, &n), SNAP_EOVERFLOW);
	CHECK(n == 4 && strcmp(info[0].name, "model/w") == 0 && strcmp(info[1].name, "meta") == 0);
	CHECK(strstr(snap_errmsg(ctx), "4 regions") != NULL);
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, info, 4, &n), 0);
	CHECK(step == 6 && n == 4);
	CHECK(info[0].dtype == SNAP_DTYPE_F32 && info[0].kind == SNAP_KIND_PARAM && info[0].ndim == 2 &&
	      info[0].bytes == sizeof(w) && info[0].shape[0] == ROWS && info[0].shape[1] == COLS &&
	      info[0].global_shape[0] == 4 * ROWS && info[0].shard_offset[0] == ROWS && info[0].shard_offset[1] == 0 &&
	      info[0].codec == SNAP_CODEC_NONE && info[0].device == SNAP_DEVICE_HOST);
	CHECK(info[1].dtype == SNAP_DTYPE_U8 && info[1].kind == SNAP_KIND_OTHER && info[1].ndim == 0 &&
	      info[1].bytes == sizeof(bytes));
	CHECK(info[2].dtype == SNAP_DTYPE_I64 && info[2].kind == SNAP_KIND_OPTIM && info[2].bytes == 8);
	CHECK(strcmp(info[3].name, "optim/0/exp_avg") == 0 && info[3].shape[0] == 300);

	/* The older layout is still there: the re-opened context withdrew nothing. */
	CHECK_RC(snap_describe(ctx, 5, &step, info, 4, &n), 0);
	CHECK(step == 5 && n == 3);
	CHECK_RC(snap_describe(ctx, 4, &step, info, 4, &n), SNAP_ENOENT);

	/* Describing froze nothing: register what step 5 holds and restore it. */
	reg(ctx, 0);
	fill(0);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, 5, &got), 0);
	CHECK(got == 5 && is_step(5, 0));
	CHECK_RC(snap_close(ctx), 0);
}

static void test_world_mismatch(const struct smp_proc *p)
{
	snap_ctx *ctx = open_rank(p, "d", 0, 2);
	uint32_t n = 0;
	uint64_t step = 0;
	CHECK_RC(snap_describe(ctx, SNAP_STEP_LATEST, &step, NULL, 0, &n), SNAP_EMISMATCH);
	CHECK(strstr(snap_errmsg(ctx), "world size") != NULL);
	snap_close(ctx);
}

static uint64_t latest(snap_ctx *ctx)
{
	uint64_t s = 0;
	return snap_latest(ctx, &s) == 0 ? s : 0;
}

/*
 * Two ranks of a job in this process. Each re-opens its context with a new
 * layout, first while the other stays connected, then while it is not (the
 * job's next connection starts a new generation). Step 3 stays restorable
 * throughout, until step 4 replaces it as the newest.
 */
static void test_reopen_two_ranks(const struct smp_proc *p)
{
	snap_ctx *r0 = open_rank(p, "two", 0, 2), *r1 = open_rank(p, "two", 1, 2);
	CHECK(r0 && r1);
	if (!r0 || !r1)
		return;
	reg(r0, 0);
	reg(r1, 0);
	for (uint64_t s = 1; s <= 3; s++) {
		save(r0, s);
		save(r1, s);
	}
	CHECK(latest(r0) == 3);
	/* rank 0 re-opens while rank 1 is connected */
	CHECK_RC(snap_close(r0), 0);
	r0 = open_rank(p, "two", 0, 2);
	reg(r0, 1);
	CHECK(latest(r0) == 3);
	/* both go: rank 1 re-opens with no rank connected, a new generation */
	CHECK_RC(snap_close(r0), 0);
	CHECK_RC(snap_close(r1), 0);
	r1 = open_rank(p, "two", 1, 2);
	reg(r1, 1);
	CHECK(latest(r1) == 3);
	save(r1, 4);                       /* rank 1 ahead: 4 is partial */
	CHECK(latest(r1) == 3);
	r0 = open_rank(p, "two", 0, 2);    /* joins rank 1's generation */
	reg(r0, 1);
	CHECK(latest(r0) == 3);
	save(r0, 4);
	CHECK(latest(r0) == 4);
	/* and the older layout's step 3 is still committed by both */
	uint32_t n = 0;
	uint64_t step = 0;
	struct snap_region_info info[4];
	CHECK_RC(snap_describe(r0, 3, &step, info, 4, &n), 0);
	CHECK(step == 3 && n == 3);
	snap_close(r0);
	snap_close(r1);
}

int main(void)
{
	struct smp_proc p;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snaptest-describe-%d", (int)getpid());
	rm_rf(store);
	if (smp_start(&p, store, NULL) != 0) {
		fprintf(stderr, "cannot start %s\n", SNAPSMP_PATH);
		return 1;
	}
	test_describe_then_restore(&p);
	test_world_mismatch(&p);
	test_reopen_two_ranks(&p);
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	return check_done("test_describe");
}
