/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapbench scrub: the background scrub of a private snapsmp
 * (docs/self-healing.md), measured two ways in one run.
 *
 * Speed: a committed step of --size bytes; each round checks them with a
 * plain snap_crc32c loop over the slot file's mapping (no daemon running),
 * then starts snapsmp on the store at an unlimited --scrub-rate and reads
 * its scrubbed_bytes (STATUS) and CPU time (/proc) over a window. Reported:
 * the scrub's GB/s over the plain loop's (median of the rounds' ratios) and
 * its CPU seconds per GB.
 *
 * Cost on a running job: one trainer in this process does --steps steps of
 * a memory-bound update of its state (--passes sweeps of w = w * a + b, the
 * shape of an optimizer step) followed by snap_save of that state, with
 * snapsmp at --scrub-rate 0 and at --rate (default: the daemon's default, 16M), in
 * alternating rounds so that a neighbour's load hits both alike. Each round
 * gives its median step time; reported: the median over the rounds of each
 * setting, their difference, and the median of each round's paired
 * difference (its two runs ran back to back, under much the same load).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cliopts.h"
#include "bench_proc.h"
#include "bench_util.h"
#include "snap/base.h"
#include "snap/snap.h"
#include "snap/status.h"
#include "snapbench.h"

#define MAX_ROUNDS 32
#define MAX_STEPS 256

struct sb {
	char store[PATH_MAX], sock[PATH_MAX], smp[PATH_MAX];
	uint64_t size;
};

static pid_t start_smp(const struct sb *b, const char *rate)
{
	pid_t p = fork();
	if (p == 0) {
		execl(b->smp, "snapsmp", "--store", b->store, "--quiet", "--mem-limit", "1T", "--scrub-rate", rate,
		      (char *)NULL);
		execlp("snapsmp", "snapsmp", "--store", b->store, "--quiet", "--mem-limit", "1T", "--scrub-rate", rate,
		       (char *)NULL);
		_exit(127);
	}
	if (p < 0)
		return -1;
	/* Serving once its socket accepts; a daemon that exited never will. */
	for (double end = bench_mono() + 60; bench_mono() < end;) {
		struct sockaddr_un a = { .sun_family = AF_UNIX };
		memcpy(a.sun_path, b->sock, strlen(b->sock) + 1);   /* checked to fit at the start */
		int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		int ok = s >= 0 && connect(s, (struct sockaddr *)&a, sizeof(a)) == 0;
		if (s >= 0)
			close(s);
		if (ok)
			return p;
		if (waitpid(p, NULL, WNOHANG) == p)
			return -1;
		usleep(2000);
	}
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	return -1;
}

static void stop_smp(pid_t p)
{
	if (p > 0) {
		kill(p, SIGTERM);
		waitpid(p, NULL, 0);
	}
}

/* The daemon's scrubbed_bytes: 0, or -1 when it does not answer. */
static int scrubbed(const struct sb *b, uint64_t *bytes)
{
	struct snap_status st;
	if (snap_status_ask(b->sock, 5000, &st) != 0 || !st.has_heal)
		return -1;
	*bytes = st.scrubbed_bytes;
	return 0;
}

/* CPU seconds (user + system) process p has used. */
static double cpu_s(pid_t p)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)p);
	FILE *f = fopen(path, "r");
	size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
	if (f)
		fclose(f);
	buf[n] = '\0';
	const char *c = strrchr(buf, ')');   /* the command name may hold spaces */
	unsigned long ut = 0, st = 0;
	if (!c || sscanf(c + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
		return 0;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static int open_ctx(const struct sb *b, snap_ctx **ctx)
{
	struct snap_config cfg;
	snap_config_init(&cfg);
	if (snprintf(cfg.store, sizeof(cfg.store), "%s", b->store) >= (int)sizeof(cfg.store) ||
	    snprintf(cfg.socket, sizeof(cfg.socket), "%s", b->sock) >= (int)sizeof(cfg.socket))
		return SNAP_EINVAL;
	snprintf(cfg.job, sizeof(cfg.job), "bench");
	cfg.autostart = SNAP_AUTOSTART_OFF;
	cfg.rank = 0;
	cfg.world_size = 1;
	return snap_open(&cfg, ctx);
}

/* One optimizer-like step over the state: memory-bound, as most are. */
static void update(float *w, size_t n, int passes)
{
	for (int k = 0; k < passes; k++)
		for (size_t i = 0; i < n; i++)
			w[i] = w[i] * 0.9999f + 1e-7f;
}

/* The committed slot file of the one step saved (the one with a manifest). */
static int slot_path(const struct sb *b, char *out, size_t cap)
{
	char pat[PATH_MAX + 64];
	snprintf(pat, sizeof(pat), "%s/bench/rank-*/slot-*.man", b->store);
	glob_t g;
	if (glob(pat, 0, NULL, &g) != 0 || g.gl_pathc != 1) {
		globfree(&g);
		return -1;
	}
	snprintf(out, cap, "%.*s", (int)(strlen(g.gl_pathv[0]) - 4), g.gl_pathv[0]);
	globfree(&g);
	return 0;
}

static double thread_cpu_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Plain snap_crc32c over the mapped slot file, passes until min_s: GB/s
 * (and its CPU seconds per GB). */
static double crc_loop(const char *path, uint64_t bytes, double min_s, double *cpu_per_gb)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	void *p = fd >= 0 ? mmap(NULL, bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
	if (fd >= 0)
		close(fd);
	if (p == MAP_FAILED)
		return -1;
	volatile uint32_t sink = snap_crc32c(p, bytes);   /* warm: page tables, caches */
	uint64_t done = 0;
	double t0 = bench_mono(), c0 = thread_cpu_s(), t;
	do {
		sink ^= snap_crc32c(p, bytes);
		done += bytes;
	} while ((t = bench_mono() - t0) < min_s);
	*cpu_per_gb = (thread_cpu_s() - c0) / (done / 1e9);
	(void)sink;
	munmap(p, bytes);
	return done / t / 1e9;
}

/* The scrub at an unlimited rate over window_s: GB/s and CPU-s per GB. */
static int scrub_speed(const struct sb *b, double window_s, double *gbps, double *cpu_per_gb)
{
	pid_t p = start_smp(b, "1T");
	if (p < 0)
		return -1;
	uint64_t b0 = 0, b1 = 0;
	int rc = 0;
	/* From its first scrubbed byte: start-up is not the scrub. */
	double end = bench_mono() + 30;
	while ((rc = scrubbed(b, &b0)) == 0 && b0 == 0 && bench_mono() < end)
		usleep(1000);
	double t0 = bench_mono(), c0 = cpu_s(p);
	if (!rc && b0) {
		usleep((useconds_t)(window_s * 1e6));
		rc = scrubbed(b, &b1);
	}
	double t1 = bench_mono(), c1 = cpu_s(p);
	stop_smp(p);
	if (rc || b1 <= b0)
		return -1;
	double gb = (double)(b1 - b0) / 1e9;
	*gbps = gb / (t1 - t0);
	*cpu_per_gb = (c1 - c0) / gb;
	return 0;
}

/* One round of the job: its median step time in seconds, or -1. */
static double job_round(const struct sb *b, const char *rate, float *w, int steps, int passes)
{
	bench_rm_tree(b->store);
	pid_t p = start_smp(b, rate);
	snap_ctx *ctx = NULL;
	double t[MAX_STEPS], med = -1;
	struct snap_region r = { .name = "state", .ptr = w, .bytes = b->size, .dtype = SNAP_DTYPE_F32 };
	int rc = p < 0 ? SNAP_EIO : open_ctx(b, &ctx);
	if (!rc)
		rc = snap_register(ctx, &r);
	/* Two steps first: slots reserved, pages touched, the scrub under way. */
	for (int s = -2; !rc && s < steps; s++) {
		double t0 = bench_mono();
		rc = snap_wait(ctx);   /* the fence: the last save's copy is done before the update */
		update(w, b->size / 4, passes);
		if (!rc)
			rc = snap_save(ctx, (uint64_t)(s + 3));
		if (s >= 0)
			t[s] = bench_mono() - t0;
	}
	if (!rc)
		rc = snap_wait(ctx);
	if (rc)
		fprintf(stderr, "snapbench scrub: the job failed: %s\n", ctx ? snap_errmsg(ctx) : "snapsmp did not start");
	else
		med = bench_median(t, steps);
	snap_close(ctx);
	stop_smp(p);
	return med;
}

static int save_one(const struct sb *b)
{
	pid_t p = start_smp(b, "0");
	float *w = malloc(b->size);
	snap_ctx *ctx = NULL;
	int rc = p < 0 || !w ? SNAP_EIO : open_ctx(b, &ctx);
	if (!rc) {
		for (uint64_t i = 0; i < b->size / 4; i++)
			w[i] = (float)i * 1e-3f;
		struct snap_region r = { .name = "state", .ptr = w, .bytes = b->size, .dtype = SNAP_DTYPE_F32 };
		rc = snap_register(ctx, &r);
		if (!rc)
			rc = snap_save(ctx, 1);
		if (!rc)
			rc = snap_wait(ctx);
		if (rc)
			fprintf(stderr, "snapbench scrub: saving the step failed: %s\n", snap_errmsg(ctx));
	}
	snap_close(ctx);
	free(w);
	stop_smp(p);
	return rc;
}

struct scrub_args {
	int rounds, steps, passes, json;
	uint64_t rate;
	const char *dir;
};

static void scrub_usage(FILE *f)
{
	fprintf(f,
		"usage: snapbench scrub [--size BYTES] [--rounds N] [--steps K] [--passes P] [--rate SIZE] [--dir D]\n"
		"                       [--json]\n"
		"The background scrub of a private snapsmp (docs/self-healing.md):\n"
		"speed: a committed step of BYTES (default 256M) checked by a plain snap_crc32c loop over the slot\n"
		"  file's mapping, then by snapsmp's scrub at an unlimited --scrub-rate (its scrubbed bytes and CPU\n"
		"  time over 2 s); N rounds (default 5), the median ratio and CPU seconds per GB;\n"
		"cost: one trainer doing K steps (default 20) of P sweeps (default 4) of w = w * a + b over BYTES of\n"
		"  state, each followed by snap_save, with snapsmp at --scrub-rate 0 and at --rate (default 16M, the\n"
		"  default), N rounds of each, alternating; the medians of the rounds' median step times, and\n"
		"  the median of each round's difference between its two runs (run back to back).\n");
}

/* SB_OK with b and a filled, -1 after --help, SB_USAGE. */
static int scrub_parse(int argc, char **argv, struct sb *b, struct scrub_args *a)
{
	*a = (struct scrub_args){ .rounds = 5, .steps = 20, .passes = 4, .rate = 16ull << 20, .dir = "/dev/shm" };
	b->size = 256ull << 20;
	const struct cli_opt opts[] = {
		CLI_OPT_HELP,
		CLI_OPT_SIZE("size", 0, &b->size, 1 << 20, 1ull << 40, "1M to 1T"),
		CLI_OPT_INT("rounds", 0, &a->rounds, 1, MAX_ROUNDS),
		CLI_OPT_INT("steps", 0, &a->steps, 1, MAX_STEPS),
		CLI_OPT_INT("passes", 0, &a->passes, 0, 1000),
		CLI_OPT_SIZE("rate", 0, &a->rate, 1, 1ull << 40, "1 to 1T bytes per second"),
		CLI_OPT_STR("dir", 0, &a->dir),
		CLI_OPT_FLAG("json", 0, &a->json),
	};
	const struct cli c = BENCH_CLI("scrub", scrub_usage, 0);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	b->size = b->size / 4096 * 4096;
	snprintf(b->store, sizeof(b->store), "%s/snapbench-scrub-%d", a->dir, (int)getpid());
	if (snprintf(b->sock, sizeof(b->sock), "%s/smp.sock", b->store) >= (int)sizeof(((struct sockaddr_un *)0)->sun_path) ||
	    strlen(b->store) >= sizeof(((struct snap_config *)0)->store)) {
		fprintf(stderr, "snapbench scrub: --dir %s: too long for a socket path under it\n", a->dir);
		return SB_USAGE;
	}
	static const char *const cand[] = { "%s/snapsmp", "%s/../smp/snapsmp" };
	bench_find_prog(b->smp, sizeof(b->smp), "SNAPSMP", "snapsmp", cand, 2);
	return SB_OK;
}

/* The figures, medians over the rounds. */
struct scrub_result {
	double crc, scr, ratio, cpu, ccpu, cratio;           /* speed */
	double off, on, cost, pair;                          /* cost on a job */
	double r_off[MAX_ROUNDS], r_on[MAX_ROUNDS];          /* each round, in run order */
};

/* Speed: a plain CRC32C loop and the scrub at full rate over one committed step. */
static int scrub_speed_rounds(struct sb *b, const struct scrub_args *a, struct scrub_result *r)
{
	const double window = 2;
	char slot[PATH_MAX];
	double crc[MAX_ROUNDS], scr[MAX_ROUNDS], ratio[MAX_ROUNDS], cpu[MAX_ROUNDS], ccpu[MAX_ROUNDS], cratio[MAX_ROUNDS];
	const char *failed = save_one(b) ? "saving a step" : slot_path(b, slot, sizeof(slot)) ? "finding its slot file" : NULL;
	for (int i = 0; !failed && i < a->rounds; i++) {
		crc[i] = crc_loop(slot, b->size, window / 2, &ccpu[i]);
		failed = crc[i] <= 0 ? "mapping the slot file" :
			 scrub_speed(b, window, &scr[i], &cpu[i]) ? "reading the scrub's progress" : NULL;
		if (!failed) {
			ratio[i] = scr[i] / crc[i];
			cratio[i] = ccpu[i] / cpu[i];
		}
	}
	if (failed) {
		fprintf(stderr, "snapbench scrub: %s failed (snapsmp %s, store %s)\n", failed, b->smp, b->store);
		return SB_FAIL;
	}
	r->ratio = bench_median(ratio, a->rounds);
	r->crc = bench_median(crc, a->rounds);
	r->scr = bench_median(scr, a->rounds);
	r->cpu = bench_median(cpu, a->rounds);
	r->ccpu = bench_median(ccpu, a->rounds);
	r->cratio = bench_median(cratio, a->rounds);
	return SB_OK;
}

/* Cost: a job's step time with the scrub off and at --rate, rounds alternating. */
static int scrub_cost_rounds(struct sb *b, const struct scrub_args *a, struct scrub_result *r)
{
	float *w = malloc(b->size);
	double off[MAX_ROUNDS], on[MAX_ROUNDS];
	char rate_s[32];
	snprintf(rate_s, sizeof(rate_s), "%" PRIu64, a->rate);
	int fail = !w;
	for (uint64_t i = 0; w && i < b->size / 4; i++)
		w[i] = (float)(i % 1000) * 1e-3f;
	for (int i = 0; !fail && i < a->rounds; i++) {
		/* Alternating which goes first, so neither always follows the other. */
		double *first = i % 2 ? on : off, *second = i % 2 ? off : on;
		first[i] = job_round(b, i % 2 ? rate_s : "0", w, a->steps, a->passes);
		second[i] = job_round(b, i % 2 ? "0" : rate_s, w, a->steps, a->passes);
		fail = off[i] < 0 || on[i] < 0;
	}
	free(w);
	if (fail)
		return SB_FAIL;
	memcpy(r->r_off, off, sizeof(off));   /* in run order: the medians sort them */
	memcpy(r->r_on, on, sizeof(on));
	/* Each round's two runs ran back to back: their ratio cancels the load
	 * that drifts between rounds, which the medians of each side do not. */
	double pair[MAX_ROUNDS];
	for (int i = 0; i < a->rounds; i++)
		pair[i] = 100 * (r->r_on[i] - r->r_off[i]) / r->r_off[i];
	r->pair = bench_median(pair, a->rounds);
	r->off = bench_median(off, a->rounds);
	r->on = bench_median(on, a->rounds);
	r->cost = 100 * (r->on - r->off) / r->off;
	return SB_OK;
}

static void scrub_print(const struct sb *b, const struct scrub_args *a, const struct scrub_result *r)
{
	if (a->json) {
		printf("{\"bytes\":%" PRIu64 ",\"rounds\":%d,\"crc32c_gbps\":%.4g,\"scrub_gbps\":%.4g,\"scrub_vs_crc32c\":%.4g,"
		       "\"scrub_cpu_s_per_gb\":%.4g,\"crc32c_cpu_s_per_gb\":%.4g,\"scrub_vs_crc32c_cpu\":%.4g,\"steps\":%d,"
		       "\"passes\":%d,\"rate\":%" PRIu64 ",\"step_s_scrub_off\":%.6g,\"step_s_scrub_on\":%.6g,"
		       "\"step_cost_pct\":%.3g,\"step_cost_paired_pct\":%.3g}\n", b->size, a->rounds, r->crc, r->scr,
		       r->ratio, r->cpu, r->ccpu, r->cratio, a->steps, a->passes, a->rate, r->off, r->on, r->cost, r->pair);
		return;
	}
	printf("scrub of a %.0f MiB step, %d rounds (medians), %.0f cores\n", b->size / 1048576.0, a->rounds, bench_cores());
	printf("  %-40s %8.3f GB/s   %.3f CPU-s/GB\n", "plain snap_crc32c over the slot's mapping", r->crc, r->ccpu);
	printf("  %-40s %8.3f GB/s   %.3f CPU-s/GB\n", "snapsmp scrub, --scrub-rate unlimited", r->scr, r->cpu);
	printf("  %-40s %8.2f (wall)  %.2f (CPU per byte)\n", "scrub vs CRC32C", r->ratio, r->cratio);
	printf("job: %d steps of %d sweeps over the state + snap_save, median step time\n", a->steps, a->passes);
	printf("  %-40s %8.4f s\n", "--scrub-rate 0", r->off);
	printf("  %-40s %8.4f s   %+.2f%%\n", a->rate == 16ull << 20 ? "--scrub-rate 16M (default)" : "--scrub-rate --rate",
	       r->on, r->cost);
	printf("  %-40s %+8.2f%%\n", "median of the rounds' paired differences", r->pair);
	printf("  rounds (off/on):");
	for (int i = 0; i < a->rounds; i++)
		printf(" %.4f/%.4f", r->r_off[i], r->r_on[i]);
	printf("\n");
}

int cmd_bench_scrub(int argc, char **argv)
{
	static struct sb b;
	static struct scrub_result r;
	struct scrub_args a;
	int rc = scrub_parse(argc, argv, &b, &a);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	rc = scrub_speed_rounds(&b, &a, &r);
	if (!rc)
		rc = scrub_cost_rounds(&b, &a, &r);
	bench_rm_tree(b.store);
	if (!rc)
		scrub_print(&b, &a, &r);
	return rc;
}
