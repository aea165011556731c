/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * trainer: an example training job for libsnap. Each rank holds a few
 * regions (parameters, optimizer state, RNG state) whose contents are a
 * deterministic function of (rank, region, step), so any process can check
 * that a restored state is exactly the state of the step it claims to be.
 *
 * Each step: fence (the previous snapshot has read our memory), "optimizer
 * step" (rewrite every region for the new step), save, "forward/backward"
 * (compute that only reads memory), wait for the commit, and log
 * "committed <step>" to --log. The fault tests kill this program at random
 * moments and check the restart against that log.
 *
 * Rank, world size, job and store come from SNAP_* variables (snap.h), and
 * so do codecs (SNAP_CODEC_PARAM, SNAP_CODEC_OPTIM): the check then allows
 * a lossy codec's bound instead of demanding bit-exact floats.
 * Exit codes: 0 done, 1 libsnap error, 2 usage, 3 restored state is wrong.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "snap/snap.h"

#define NREG 3

static const char *const names[NREG] = { "model.weight", "optim.exp_avg", "rng.state" };
static const int kinds[NREG] = { SNAP_KIND_PARAM, SNAP_KIND_OPTIM, SNAP_KIND_RNG };
static const int dtypes[NREG] = { SNAP_DTYPE_F32, SNAP_DTYPE_F32, SNAP_DTYPE_U8 };

static uint64_t splitmix(uint64_t *x)
{
	uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/*
 * The state of region i of `rank` after `step`. Float regions hold
 * weight-like values (uniform in +-0.05, so a lossy codec really quantizes)
 * with a NaN, an Inf or a huge value every 997 elements; others random bytes.
 */
static void fill(uint8_t *p, size_t n, int rank, int i, uint64_t step)
{
	uint64_t x = ((uint64_t)rank << 40) ^ ((uint64_t)i << 32) ^ step;
	size_t k = 0;
	if (dtypes[i] == SNAP_DTYPE_F32) {
		static const float special[4] = { NAN, INFINITY, -3e38f, 1e-42f };
		for (; k + 4 <= n; k += 4) {
			uint64_t v = splitmix(&x);
			float f = (k / 4) % 997 == 996 ? special[v & 3] : (float)((int32_t)(v >> 32) * (0.05 / 2147483648.0));
			memcpy(p + k, &f, 4);
		}
		return;
	}
	for (; k + 8 <= n; k += 8) {
		uint64_t v = splitmix(&x);
		memcpy(p + k, &v, 8);
	}
	for (uint64_t v = splitmix(&x); k < n; k++, v >>= 8)
		p[k] = (uint8_t)v;
}

/*
 * Under a lossy codec (SNAP_CODEC_PARAM / SNAP_CODEC_OPTIM) the restored
 * floats must be within the bound: |x - x'| <= bound (abs), or <= factor *
 * (max - min) of the finite values (rel), and non-finite values bit-exact.
 */
static int within(const float *want, const float *got, size_t n, int codec, double bound)
{
	double lo = INFINITY, hi = -INFINITY;
	for (size_t k = 0; k < n; k++)
		if (isfinite(want[k])) {
			lo = want[k] < lo ? want[k] : lo;
			hi = want[k] > hi ? want[k] : hi;
		}
	double tol = codec == SNAP_CODEC_LOSSY_REL ? bound * (hi - lo) : bound;
	for (size_t k = 0; k < n; k++) {
		if (!isfinite(want[k]) ? memcmp(&want[k], &got[k], 4) != 0 : !(fabs((double)want[k] - got[k]) <= tol))
			return 0;
	}
	return 1;
}

/* Index of the first region that is not the state of `step`, or -1. */
static int check(const struct snap_config *cfg, uint8_t *const *bufs, const size_t *sizes, int rank, uint64_t step,
		 uint8_t *scratch)
{
	for (int i = 0; i < NREG; i++) {
		fill(scratch, sizes[i], rank, i, step);
		int codec = kinds[i] == SNAP_KIND_PARAM ? cfg->codec_param
			    : kinds[i] == SNAP_KIND_OPTIM ? cfg->codec_optim : SNAP_CODEC_NONE;
		double bound = kinds[i] == SNAP_KIND_PARAM ? cfg->codec_param_bound : cfg->codec_optim_bound;
		if (dtypes[i] == SNAP_DTYPE_F32 && (codec == SNAP_CODEC_LOSSY_ABS || codec == SNAP_CODEC_LOSSY_REL)) {
			if (!within((const float *)scratch, (const float *)bufs[i], sizes[i] / 4, codec, bound))
				return i;
		} else if (memcmp(scratch, bufs[i], sizes[i]) != 0) {
			return i;
		}
	}
	return -1;
}

static void logline(int fd, const char *fmt, uint64_t v)
{
	char b[64];
	int n = snprintf(b, sizeof(b), fmt, v);
	if (fd >= 0 && write(fd, b, (size_t)n) != n)
		perror("trainer: log");
}

/* Tests hold a trainer at a point of its run: a byte on the FIFO lets it go on. */
static int wait_go(const char *fifo)
{
	char b;
	int fd = open(fifo, O_RDONLY | O_CLOEXEC);
	int rc = fd < 0 || read(fd, &b, 1) != 1;
	if (rc)
		fprintf(stderr, "trainer: %s: no go\n", fifo);
	if (fd >= 0)
		close(fd);
	return rc;
}

static void usage(void)
{
	fprintf(stderr, "usage: trainer --steps N [--bytes B] [--resume | --restore-step S] [--log FILE] [--compute-us US]"
			" [--quiet] [--times]\n"
			"       [--prepare] [--go-fifo FIFO] [--then-fifo FIFO]\n");
}

/* For scripts/bench_levels.py: when a save began / was committed, in the
 * wall clock another process can compare with. */
static void logtime(int fd, const char *what, uint64_t step)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	char b[96];
	int n = snprintf(b, sizeof(b), "%s %" PRIu64 " %" PRIu64 "\n", what, step,
			 (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
	if (fd >= 0 && write(fd, b, (size_t)n) != n)
		perror("trainer: log");
}

int main(int argc, char **argv)
{
	uint64_t steps = 10, bytes = 1 << 20, compute_us = 0, want = SNAP_STEP_LATEST;
	int resume = 0, quiet = 0, times = 0, logfd = -1, prepare = 0;
	const char *go = NULL, *then = NULL;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--steps") && i + 1 < argc)
			steps = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--bytes") && i + 1 < argc) {
			if (snap_parse_size(argv[++i], &bytes)) {
				usage();
				return 2;
			}
		} else if (!strcmp(argv[i], "--compute-us") && i + 1 < argc)
			compute_us = strtoull(argv[++i], NULL, 10);
		else if (!strcmp(argv[i], "--resume"))
			resume = 1;
		else if (!strcmp(argv[i], "--restore-step") && i + 1 < argc) {
			want = strtoull(argv[++i], NULL, 10);
			resume = 1;
		}
		else if (!strcmp(argv[i], "--times"))   /* "save S NS" / "commit S NS" lines, CLOCK_REALTIME */
			times = 1;
		else if (!strcmp(argv[i], "--quiet"))
			quiet = 1;
		else if (!strcmp(argv[i], "--prepare"))   /* send the layout before the first step (snap_prepare) */
			prepare = 1;
		else if (!strcmp(argv[i], "--go-fifo") && i + 1 < argc)   /* then wait for a byte there (tests) */
			go = argv[++i], prepare = 1;
		else if (!strcmp(argv[i], "--then-fifo") && i + 1 < argc)   /* after the restore (tests) */
			then = argv[++i];
		else if (!strcmp(argv[i], "--log") && i + 1 < argc) {
			logfd = open(argv[++i], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
			if (logfd < 0) {
				perror(argv[i]);
				return 2;
			}
		} else {
			usage();
			return 2;
		}
	}

	struct snap_config cfg;
	char err[512];
	snap_config_init(&cfg);
	if (snap_config_from_env(&cfg, err, sizeof(err))) {
		fprintf(stderr, "trainer: %s\n", err);
		return 2;
	}
	snap_ctx *ctx;
	int rc = snap_open(&cfg, &ctx);
	if (rc) {
		fprintf(stderr, "trainer rank %d: %s\n", cfg.rank, ctx ? snap_errmsg(ctx) : snap_strerror(rc));
		snap_close(ctx);
		return 1;
	}

	/* The RNG state is small, as in real jobs; the rest splits `bytes`. */
	size_t sizes[NREG] = { bytes / 2 / 4 * 4, bytes / 2 / 4 * 4, 64 };
	uint8_t *bufs[NREG] = { NULL }, *scratch = malloc(bytes + 64);
	int exit_code = 0;
	for (int i = 0; i < NREG && !exit_code; i++) {
		bufs[i] = malloc(sizes[i]);
		struct snap_region r = { .name = names[i], .ptr = bufs[i], .bytes = sizes[i], .dtype = dtypes[i],
					 .kind = kinds[i] };
		if (!bufs[i] || !scratch) {
			fprintf(stderr, "trainer: out of memory\n");
			exit_code = 1;
		} else if (snap_register(ctx, &r)) {
			fprintf(stderr, "trainer rank %d: %s\n", cfg.rank, snap_errmsg(ctx));
			exit_code = 1;
		}
	}

	/* As a trainer would before its first step: the daemon prepares the
	 * slot (and, in a mesh, parity) files while that step runs. */
	if (prepare && !exit_code) {
		if (snap_prepare(ctx)) {
			fprintf(stderr, "trainer rank %d: %s\n", cfg.rank, snap_errmsg(ctx));
			exit_code = 1;
		} else {
			logline(logfd, "prepared %" PRIu64 "\n", 0);
		}
	}
	if (go && !exit_code && wait_go(go))
		exit_code = 1;
	uint64_t start = 1;
	if (resume && !exit_code) {
		uint64_t got;
		rc = snap_restore(ctx, want, &got);
		if (rc == 0) {
			int bad = check(&cfg, bufs, sizes, cfg.rank, got, scratch);
			if (bad >= 0) {
				fprintf(stderr, "trainer rank %d: MISMATCH: region %s after restoring step %" PRIu64 "\n",
					cfg.rank, names[bad], got);
				exit_code = 3;
			} else {
				logline(logfd, "restored %" PRIu64 "\n", got);
				/* A restore that repaired chunks or fell back to an older step says so. */
				if (!quiet && snap_errmsg(ctx)[0])
					printf("rank %d: %s\n", cfg.rank, snap_errmsg(ctx));
				if (!quiet)
					printf("rank %d: restored step %" PRIu64 " (verified %s)\n", cfg.rank, got,
					       cfg.codec_param >= SNAP_CODEC_LOSSY_ABS || cfg.codec_optim >= SNAP_CODEC_LOSSY_ABS
						       ? "within the codec bounds" : "bit-exact");
				start = got + 1;
			}
		} else if (rc == SNAP_ENOENT) {
			logline(logfd, "fresh %" PRIu64 "\n", 0);
			if (!quiet)
				printf("rank %d: nothing to restore, starting fresh\n", cfg.rank);
		} else {
			fprintf(stderr, "trainer rank %d: restore failed: %s\n", cfg.rank, snap_errmsg(ctx));
			exit_code = rc == SNAP_ECORRUPT ? 3 : 1;
		}
	}

	if (then && !exit_code && wait_go(then))
		exit_code = 1;
	rc = 0;
	for (uint64_t s = start; s <= steps && !exit_code; s++) {
		if ((rc = snap_fence(ctx)))
			break;
		for (int i = 0; i < NREG; i++)
			fill(bufs[i], sizes[i], cfg.rank, i, s);
		if (times)
			logtime(logfd, "save", s);
		if ((rc = snap_save(ctx, s)))
			break;
		if (compute_us) {
			struct timespec ts = { (time_t)(compute_us / 1000000), (long)(compute_us % 1000000) * 1000 };
			nanosleep(&ts, NULL);
		}
		if ((rc = snap_wait(ctx)))
			break;
		if (times)
			logtime(logfd, "commit", s);
		logline(logfd, "committed %" PRIu64 "\n", s);
		if (!quiet)
			printf("rank %d: step %" PRIu64 " committed\n", cfg.rank, s);
	}
	if (rc) {
		fprintf(stderr, "trainer rank %d: %s\n", cfg.rank, snap_errmsg(ctx));
		exit_code = 1;
	}
	if (snap_close(ctx) && !exit_code)
		exit_code = 1;
	for (int i = 0; i < NREG; i++)
		free(bufs[i]);
	free(scratch);
	if (logfd >= 0)
		close(logfd);
	return exit_code;
}
