/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codecs in the snapshot path, against a real snapsmp with a flush
 * directory: each codec on f32, bf16 and f16 regions restores within its
 * promise (lossless bit-exact, lossy within the bound on every element, NaN
 * and Inf exact); the config's per-kind defaults apply; bad codec settings
 * are refused naming the region; a flipped byte in a committed frame is
 * caught before any registered byte is written; and a step restored from
 * disk (store wiped) is bit-identical to the same step restored from memory,
 * i.e. the flush wrote the frames as they were and nothing was quantized twice.
 */
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "../check.h"
#include "harness.h"
#include "snap/base.h"
#include "snap/manifest.h"
#include "snap/codec.h"

#define CHUNK (64 * 1024)
#define NW 100003        /* f32 lossless: 7 frames, a short last one */
#define NA 70001         /* bf16 lossy abs: 3 frames */
#define NS 40000         /* f16 lossy rel: 2 frames */
#define NR 50000         /* f32 lossy rel (the config default for OPTIM) */

static float w[NW], r[NR];
static uint16_t a[NA], s[NS];
static uint8_t rng[1000];

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void)
{
	rnd_state ^= rnd_state << 13;
	rnd_state ^= rnd_state >> 7;
	rnd_state ^= rnd_state << 17;
	return rnd_state;
}

static double gauss(void)
{
	double u = ((double)(rnd() >> 11) + 0.5) / 9007199254740992.0, v = (double)(rnd() >> 11) / 9007199254740992.0;
	return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Weight-like values with the hard cases sprinkled in. */
static void fill(uint64_t step)
{
	rnd_state = 88172645463325252ull ^ (step * 0x9e3779b97f4a7c15ull);
	static const float special[] = { NAN, INFINITY, -INFINITY, 1e-40f, -0.0f, FLT_MAX, -FLT_MAX, 3e8f };
	for (int i = 0; i < NW; i++)
		w[i] = (float)(0.02 * gauss());
	for (int i = 0; i < NR; i++)
		r[i] = (float)(1e-3 * gauss());
	float tmp[NA > NS ? NA : NS];
	for (int i = 0; i < NA; i++)
		tmp[i] = (float)(0.05 * gauss());
	snap_codec_convert(SNAP_DTYPE_BF16, a, SNAP_DTYPE_F32, tmp, NA);
	for (int i = 0; i < NS; i++)
		tmp[i] = (float)gauss();
	snap_codec_convert(SNAP_DTYPE_F16, s, SNAP_DTYPE_F32, tmp, NS);
	for (int k = 0; k < 64; k++) {
		float x = special[k % 8];
		w[rnd() % NW] = x;
		r[rnd() % NR] = x;
		snap_codec_convert(SNAP_DTYPE_BF16, &a[rnd() % NA], SNAP_DTYPE_F32, &x, 1);
		snap_codec_convert(SNAP_DTYPE_F16, &s[rnd() % NS], SNAP_DTYPE_F32, &x, 1);
	}
	memset(rng, (int)step, sizeof(rng));
}

struct saved {
	float w[NW], r[NR];
	uint16_t a[NA], s[NS];
	uint8_t rng[1000];
};

static void take(struct saved *o)
{
	memcpy(o->w, w, sizeof(w));
	memcpy(o->r, r, sizeof(r));
	memcpy(o->a, a, sizeof(a));
	memcpy(o->s, s, sizeof(s));
	memcpy(o->rng, rng, sizeof(rng));
}

static int same(const struct saved *o)
{
	return !memcmp(o->w, w, sizeof(w)) && !memcmp(o->r, r, sizeof(r)) && !memcmp(o->a, a, sizeof(a)) &&
	       !memcmp(o->s, s, sizeof(s)) && !memcmp(o->rng, rng, sizeof(rng));
}

/* Largest |x - y| over n values of dtype (as doubles); -1 if a NaN or Inf
 * was not restored exactly. */
static double max_err(int dtype, const void *x, const void *y, size_t n, double *range)
{
	double worst = 0, lo = INFINITY, hi = -INFINITY;
	for (size_t i = 0; i < n; i++) {
		float fx, fy;
		if (dtype == SNAP_DTYPE_F32) {
			fx = ((const float *)x)[i];
			fy = ((const float *)y)[i];
		} else {
			snap_codec_convert(SNAP_DTYPE_F32, &fx, dtype, (const uint16_t *)x + i, 1);
			snap_codec_convert(SNAP_DTYPE_F32, &fy, dtype, (const uint16_t *)y + i, 1);
		}
		if (!isfinite(fx)) {
			if (isnan(fx) ? !isnan(fy) : fx != fy)
				return -1;
			continue;
		}
		lo = fx < lo ? fx : lo;
		hi = fx > hi ? fx : hi;
		double e = fabs((double)fx - (double)fy);
		worst = e > worst ? e : worst;
	}
	if (range)
		*range = hi - lo;
	return worst;
}

static void zero(void)
{
	memset(w, 0, sizeof(w));
	memset(r, 0, sizeof(r));
	memset(a, 0, sizeof(a));
	memset(s, 0, sizeof(s));
	memset(rng, 0, sizeof(rng));
}

/* rel > 0: the config's OPTIM default is rel:<rel>; raw: no codec anywhere. */
static snap_ctx *open_ctx(const struct smp_proc *p, double rel, int raw)
{
	struct snap_config c;
	smp_cfg(&c, p, "codec", 0, 1);
	c.chunk_size = CHUNK;
	if (rel > 0) {
		c.codec_optim = SNAP_CODEC_LOSSY_REL;
		c.codec_optim_bound = rel;
	}
	snap_ctx *ctx;
	if (snap_open(&c, &ctx)) {
		fprintf(stderr, "open: %s\n", snap_errmsg(ctx));
		snap_close(ctx);
		return NULL;
	}
	struct snap_region regs[] = {
		{ .name = "w", .ptr = w, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
		  .codec = SNAP_CODEC_LOSSLESS, .ndim = 1, .shape = { NW }, .global_shape = { NW } },
		{ .name = "exp_avg", .ptr = a, .bytes = sizeof(a), .dtype = SNAP_DTYPE_BF16, .kind = SNAP_KIND_OPTIM,
		  .codec = SNAP_CODEC_LOSSY_ABS, .codec_bound = 1e-2 },
		{ .name = "exp_avg_sq", .ptr = s, .bytes = sizeof(s), .dtype = SNAP_DTYPE_F16, .kind = SNAP_KIND_OPTIM,
		  .codec = SNAP_CODEC_LOSSY_REL, .codec_bound = 1e-3, .ndim = 2, .shape = { 200, 200 },
		  .global_shape = { 400, 200 }, .shard_offset = { 200, 0 } },
		/* No codec of its own: takes the config's OPTIM default when set. */
		{ .name = "momentum", .ptr = r, .bytes = sizeof(r), .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_OPTIM },
		{ .name = "rng", .ptr = rng, .bytes = sizeof(rng), .dtype = SNAP_DTYPE_U8, .kind = SNAP_KIND_RNG },
	};
	for (size_t i = 0; i < sizeof(regs) / sizeof(regs[0]); i++) {
		if (raw) {
			regs[i].codec = SNAP_CODEC_NONE;
			regs[i].codec_bound = 0;
		}
		CHECK_RC(snap_register(ctx, &regs[i]), 0);
	}
	return ctx;
}

/* The published manifest of the step in slot `slot` (rank 0). */
static int read_manifest(const char *store, int slot, struct snap_manifest *m)
{
	char path[512];
	snprintf(path, sizeof(path), "%s/codec/rank-00000/slot-%d.man", store, slot);
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	static uint8_t buf[1 << 16];
	size_t n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	char err[256];
	return snap_manifest_decode(buf, n, m, err, sizeof(err));
}

static const struct snap_man_region *region(const struct snap_manifest *m, const char *name)
{
	for (uint32_t i = 0; i < m->layout.nregions; i++)
		if (!strcmp(m->layout.regions[i].name, name))
			return &m->layout.regions[i];
	return NULL;
}

static void test_register_errors(const struct smp_proc *p)
{
	struct snap_config c;
	smp_cfg(&c, p, "codec-bad", 0, 1);
	snap_ctx *ctx;
	CHECK_RC(snap_open(&c, &ctx), 0);
	int32_t steps[4];
	struct snap_region bad = { .name = "step_counter", .ptr = steps, .bytes = sizeof(steps),
				   .dtype = SNAP_DTYPE_I32, .kind = SNAP_KIND_OTHER, .codec = SNAP_CODEC_LOSSLESS };
	CHECK_RC(snap_register(ctx, &bad), SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "step_counter") && strstr(snap_errmsg(ctx), "i32"));
	struct snap_region nb = { .name = "exp_avg", .ptr = w, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32,
				  .kind = SNAP_KIND_OPTIM, .codec = SNAP_CODEC_LOSSY_ABS, .codec_bound = 0 };
	CHECK_RC(snap_register(ctx, &nb), SNAP_ERANGE);
	CHECK(strstr(snap_errmsg(ctx), "exp_avg") && strstr(snap_errmsg(ctx), "bound"));
	nb.codec = 9;
	CHECK_RC(snap_register(ctx, &nb), SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "exp_avg") != NULL);
	/* A config default never lands on a non-float region. */
	snap_close(ctx);
	c.codec_optim = SNAP_CODEC_LOSSLESS;
	c.codec_param = SNAP_CODEC_LOSSY_ABS;
	c.codec_param_bound = 1e-3;
	CHECK_RC(snap_open(&c, &ctx), 0);
	bad.codec = SNAP_CODEC_NONE;
	bad.kind = SNAP_KIND_OPTIM;
	CHECK_RC(snap_register(ctx, &bad), 0);
	snap_close(ctx);
}

int main(void)
{
	struct smp_proc p = { 0 };
	char store[128], flush[160], flushdir[200];
	snprintf(store, sizeof(store), "/dev/shm/snaptest-codec-%d", (int)getpid());
	snprintf(flush, sizeof(flush), "/tmp/snaptest-codec-flush-%d", (int)getpid());
	snprintf(flushdir, sizeof(flushdir), "--flush-dir=%s", flush);
	rm_rf(store);
	rm_rf(flush);
	const char *args[] = { flushdir, NULL };
	CHECK_RC(smp_start(&p, store, args), 0);

	test_register_errors(&p);

	/* 1. Each codec restores within its promise, from memory. */
	snap_ctx *ctx = open_ctx(&p, 1e-3, 0);
	CHECK(ctx != NULL);
	if (!ctx)
		return check_done("test_codec");
	static struct saved orig, mem;
	fill(7);
	take(&orig);
	CHECK_RC(snap_save(ctx, 7), 0);
	CHECK_RC(snap_wait(ctx), 0);
	zero();
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, 7, &got), 0);
	CHECK(got == 7);
	CHECK(!memcmp(w, orig.w, sizeof(w)));                       /* lossless: bit-exact */
	CHECK(!memcmp(rng, orig.rng, sizeof(rng)));                 /* raw */
	double range, e;
	e = max_err(SNAP_DTYPE_BF16, orig.a, a, NA, NULL);
	CHECK(e >= 0 && e <= 1e-2);
	CHECK(e > 0);                                               /* it really was lossy */
	e = max_err(SNAP_DTYPE_F16, orig.s, s, NS, &range);
	CHECK(e >= 0 && e <= 1e-3 * range);
	e = max_err(SNAP_DTYPE_F32, orig.r, r, NR, &range);        /* the config default (rel 1e-3) */
	CHECK(e >= 0 && e <= 1e-3 * range && e > 0);
	take(&mem);

	/* The manifest says what each region holds, and frames are smaller. */
	struct snap_manifest m;
	int slot = -1;
	for (int i = 0; i < 3 && slot < 0; i++)
		if (read_manifest(store, i, &m) == 0) {
			if (m.step == 7)
				slot = i;
			else
				snap_manifest_free(&m);
		}
	CHECK(slot >= 0);
	if (slot >= 0) {
		const struct snap_man_region *g = region(&m, "momentum");
		CHECK(g && g->codec == SNAP_CODEC_LOSSY_REL && g->bound == 1e-3);
		g = region(&m, "rng");
		CHECK(g && g->codec == SNAP_CODEC_NONE);
		g = region(&m, "exp_avg");
		CHECK(g && g->codec == SNAP_CODEC_LOSSY_ABS && g->nchunks == 3);
		uint64_t stored = 0;
		for (uint32_t k = 0; g && k < g->nchunks; k++)
			stored += m.len[g->first_crc + k];
		CHECK(g && stored * 2 < g->bytes);                  /* bf16 at 1e-2: well over 2x */

		/* 2. A flipped byte in a committed frame, step 7 persisted: the frame
		 * is read back from the flushed file (a codec frame, checked against
		 * the manifest's CRC), written back into the slot, and the restore
		 * gives the very values it gave before (docs/self-healing.md). */
		CHECK_RC(snap_flush(ctx, 7, 1), 0);
		char path[512];
		snprintf(path, sizeof(path), "%s/codec/rank-00000/slot-%d", store, slot);
		int fd = open(path, O_RDWR);
		CHECK(fd >= 0);
		uint64_t off = g ? g->offset + g->frame_cap + 100 : 0;  /* inside frame 1 */
		uint8_t b = 0, good = 0;
		CHECK(pread(fd, &good, 1, (off_t)off) == 1);
		b = good ^ 0x10;
		CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
		zero();
		CHECK_RC(snap_restore(ctx, 7, NULL), 0);
		CHECK(strstr(snap_errmsg(ctx), "1 bad chunks repaired from the flush") != NULL);
		CHECK(same(&mem));
		CHECK(pread(fd, &b, 1, (off_t)off) == 1 && b == good);
		/* A new context (restore_verify auto) checks each frame just before
		 * decoding it: the other frames were decoded already when it finds
		 * the bad one; the re-read after the repair writes every byte again. */
		snap_close(ctx);
		ctx = open_ctx(&p, 1e-3, 0);
		CHECK(ctx != NULL);
		if (!ctx)
			return check_done("test_codec");
		b = good ^ 0x01;
		CHECK(pwrite(fd, &b, 1, (off_t)off) == 1);
		fill(99);
		CHECK_RC(snap_restore(ctx, 7, NULL), 0);
		CHECK(strstr(snap_errmsg(ctx), "1 bad chunks repaired from the flush") != NULL);
		CHECK(same(&mem));
		close(fd);
		snap_manifest_free(&m);
	}

	/* 3. Flush the step, wipe the store, restore from disk: the very same
	 * values as from memory (frames persisted as they were, not requantized). */
	int frc = snap_flush(ctx, 7, 1);
	CHECK_RC(frc, 0);
	if (frc)
		fprintf(stderr, "flush: %s\n", snap_errmsg(ctx));
	snap_close(ctx);
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	CHECK_RC(smp_start(&p, store, args), 0);
	ctx = open_ctx(&p, 1e-3, 0);
	CHECK(ctx != NULL);
	if (ctx) {
		zero();
		CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
		CHECK(got == 7);
		CHECK(same(&mem));
		snap_close(ctx);
	}

	/* 4. The same disk step registered differently: a region now raw gets
	 * the frames decoded; a region now promising a tighter bound than it
	 * was saved with is refused (the frames would not keep that promise). */
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	CHECK_RC(smp_start(&p, store, args), 0);
	ctx = open_ctx(&p, 0, 0);   /* momentum now raw: its frames are decoded into the slot */
	if (ctx) {
		zero();
		CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
		CHECK(same(&mem));
		snap_close(ctx);
	}
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	CHECK_RC(smp_start(&p, store, args), 0);
	ctx = open_ctx(&p, 1e-5, 0);   /* tighter than the 1e-3 it was saved with */
	if (ctx) {
		fill(99);
		static struct saved before;
		take(&before);
		CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, NULL), SNAP_EMISMATCH);
		CHECK(strstr(snap_errmsg(ctx), "momentum") != NULL);
		CHECK(same(&before));
	}
	snap_close(ctx);

	/* 5. A step persisted raw, restored into codec regions: compressed on
	 * the way into the slot (quantized once), then restored within bounds. */
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	rm_rf(flush);
	CHECK_RC(smp_start(&p, store, args), 0);
	ctx = open_ctx(&p, 0, 1);   /* no codec at all, not even the config default */
	if (ctx) {
		fill(11);
		take(&orig);
		CHECK_RC(snap_save(ctx, 11), 0);
		CHECK_RC(snap_wait(ctx), 0);
		CHECK_RC(snap_flush(ctx, 11, 1), 0);
		snap_close(ctx);
	}
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	CHECK_RC(smp_start(&p, store, args), 0);
	ctx = open_ctx(&p, 1e-3, 0);
	if (ctx) {
		zero();
		int rrc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
		CHECK_RC(rrc, 0);
		if (rrc)
			fprintf(stderr, "restore: %s\n", snap_errmsg(ctx));
		CHECK(got == 11);
		CHECK(!memcmp(w, orig.w, sizeof(w)) && !memcmp(rng, orig.rng, sizeof(rng)));
		e = max_err(SNAP_DTYPE_BF16, orig.a, a, NA, NULL);
		CHECK(e >= 0 && e <= 1e-2 && e > 0);
		e = max_err(SNAP_DTYPE_F16, orig.s, s, NS, &range);
		CHECK(e >= 0 && e <= 1e-3 * range);
		e = max_err(SNAP_DTYPE_F32, orig.r, r, NR, &range);
		CHECK(e >= 0 && e <= 1e-3 * range && e > 0);
		snap_close(ctx);
	}

	smp_stop(&p, SIGTERM);
	rm_rf(store);
	rm_rf(flush);
	return check_done("test_codec");
}
