/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapbench snapshot: the cost of a snapshot as a trainer sees it,
 * through a real snapsmp, side by side with the physical limit (one
 * single-threaded memcpy of the same bytes) and what users would do instead
 * (torch.save of the same bytes to the same filesystem).
 *
 * A private snapsmp serves a fresh store under --dir (default /dev/shm, a
 * tmpfs with huge pages shows what they change); N rank processes
 * each snapshot size/N bytes. Per iteration we take the slowest rank (the
 * job waits for it), then report the median over iterations.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_proc.h"
#include "bench_snapshot.h"
#include "bench_util.h"
#include "cliopts.h"
#include "snap/proto.h"
#include "snap/snap.h"
#include "snapbench.h"

/* snapsmp next to this binary (build tree or install), else on PATH. */
static void find_smp(char *out, size_t cap)
{
	static const char *const cand[] = { "%s/snapsmp", "%s/../smp/snapsmp" };
	bench_find_prog(out, cap, "SNAPSMP", "snapsmp", cand, 2);
}

/* Open a context on the benchmark's store and register the filled region: 0, or 1 after a message. */
static int rank_open(struct rank_run *k, int ranks)
{
	struct snap_config *cfg = &k->cfg;
	snap_config_init(cfg);
	int too_long = snprintf(cfg->store, sizeof(cfg->store), "%s", k->store) >= (int)sizeof(cfg->store) ||
		       snprintf(cfg->socket, sizeof(cfg->socket), "%s/smp.sock", k->store) >= (int)sizeof(cfg->socket);
	snprintf(cfg->job, sizeof(cfg->job), "bench");
	cfg->autostart = SNAP_AUTOSTART_OFF;   /* the daemon is the benchmark's, with its settings */
	cfg->rank = k->rank;
	cfg->world_size = ranks;
	/* As deployed: the node's cores shared by its ranks' copy threads. */
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	cfg->copy_threads = cores / ranks > 1 ? (unsigned)(cores / ranks) : 1;
	if (too_long) {
		fprintf(stderr, "bench rank %d: store path %s is too long (at most %zu bytes with /smp.sock)\n", k->rank,
			k->store, sizeof(cfg->socket) - 10);
		return 1;
	}
	k->buf = malloc(k->bytes);
	if (!k->buf || snap_open(cfg, &k->ctx)) {
		fprintf(stderr, "bench rank %d: %s\n", k->rank, k->ctx ? snap_errmsg(k->ctx) : "out of memory");
		return 1;
	}
	for (uint64_t i = 0; i < k->bytes / 4; i++)
		k->buf[i] = k->d->tile ? k->d->tile[i % k->d->ntile] : (float)i * 1e-3f;
	k->r = (struct snap_region){ .name = "weights", .ptr = k->buf, .bytes = k->bytes / 4 * 4,
				     .dtype = SNAP_DTYPE_F32, .codec = k->d->codec, .codec_bound = k->d->bound };
	return 0;
}

/* Save and wait, two warm-up steps first. Every phase keeps meeting the
 * others at the barrier after a failure (rc), so nobody hangs. */
static int phase_save(struct rank_run *k, int rc)
{
	for (int it = -2; it < k->iters; it++) {
		pthread_barrier_wait(k->bar);
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns();
		rc = snap_save(k->ctx, (uint64_t)(it + 3));
		uint64_t t1 = snap_now_ns();
		if (!rc)
			rc = snap_wait(k->ctx);
		uint64_t t2 = snap_now_ns();
		if (it >= 0) {
			k->res[NRES * it] = (t1 - t0) / 1e9;
			k->res[NRES * it + 1] = (t2 - t0) / 1e9;
		} else if (it == -2) {
			k->res[FIRST_SAVE] = (t2 - t0) / 1e9;
		}
	}
	return rc;
}

/* One rank (a child process): every phase, then its seconds down wfd. 0 or 1. */
static int run_rank(const char *store, int rank, int ranks, uint64_t bytes, int iters, int wfd,
		    pthread_barrier_t *bar, const struct bench_data *d)
{
	static struct rank_run k;
	k = (struct rank_run){ .store = store, .rank = rank, .iters = iters, .bytes = bytes, .bar = bar, .d = d };
	if (rank_open(&k, ranks))
		return 1;
	int rc = snap_register(k.ctx, &k.r);
	/* The layout goes to the daemon now, as a trainer sends it before its
	 * first step (snap_prepare): its slot files are reserved from here. */
	if (!rc)
		rc = snap_prepare(k.ctx);
	if (!rc && d->first_after_ms) {   /* a first training step */
		struct timespec ts = { d->first_after_ms / 1000, (long)(d->first_after_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	rc = phase_save(&k, rc);
	rc = snapshot_restores(&k, rc);
	if (rc)
		fprintf(stderr, "bench rank %d: %s\n", rank, k.ctx ? snap_errmsg(k.ctx) : snap_strerror(rc));
	if (k.ctx)
		snap_close(k.ctx);
	free(k.buf);
	size_t len = sizeof(double) * NRES * (size_t)iters;
	if (!rc && write(wfd, k.res, len) != (ssize_t)len)
		rc = 1;
	return rc ? 1 : 0;
}

/* The private store lives in memory (a tmpfs): never leave it behind. */
static void remove_store(const char *store)
{
	if (bench_rm_tree(store))
		fprintf(stderr, "could not remove %s: %s\n", store, strerror(errno));
}

static double bench_memcpy(uint64_t bytes, int iters)
{
	uint8_t *src = malloc(bytes), *dst = malloc(bytes);
	double t[MAX_ITERS];
	if (!src || !dst)
		return -1;
	memset(src, 1, bytes);
	memset(dst, 0, bytes);   /* fault in, as the slot is pre-faulted */
	for (int i = 0; i < iters; i++) {
		uint64_t t0 = snap_now_ns();
		memcpy(dst, src, bytes);
		t[i] = (snap_now_ns() - t0) / 1e9;
		src[i % bytes]++;
	}
	free(src);
	free(dst);
	return bench_median(t, iters);
}

/* The same copy split over `threads` threads: the limit for work that uses
 * every core, as the ranks' copy threads do together. */
struct mc_part {
	uint8_t *dst;
	const uint8_t *src;
	size_t n;
};

static void *mc_thread(void *arg)
{
	struct mc_part *p = arg;
	memcpy(p->dst, p->src, p->n);
	return NULL;
}

static double bench_memcpy_mt(uint64_t bytes, int iters, int threads)
{
	uint8_t *src = malloc(bytes), *dst = malloc(bytes);
	double t[MAX_ITERS];
	struct mc_part part[64];
	pthread_t tid[64];
	if (!src || !dst || threads < 1 || threads > 64) {
		free(src);
		free(dst);
		return -1;
	}
	memset(src, 1, bytes);
	memset(dst, 0, bytes);
	uint64_t per = bytes / (uint64_t)threads / 4096 * 4096;
	for (int k = 0; k < threads; k++)
		part[k] = (struct mc_part){ dst + k * per, src + k * per, k + 1 < threads ? per : bytes - k * per };
	int ok = 1;
	for (int i = 0; i < iters && ok; i++) {
		uint64_t t0 = snap_now_ns();
		int started = 0;
		for (; started < threads; started++)
			if (pthread_create(&tid[started], NULL, mc_thread, &part[started]) != 0)
				break;
		for (int k = 0; k < started; k++)
			pthread_join(tid[k], NULL);
		ok = started == threads;
		t[i] = (snap_now_ns() - t0) / 1e9;
		src[i % bytes]++;
	}
	free(src);
	free(dst);
	return ok ? bench_median(t, iters) : -1;
}

/* torch.save of the same bytes to the same filesystem; -1 if unavailable. */
static double bench_torch(const char *dir, uint64_t bytes, int iters)
{
	char cmd[1024];
	int len = snprintf(cmd, sizeof(cmd),
		 "'%s' -c 'import sys,time,torch,statistics\n"
		 "t=torch.arange(%" PRIu64 ",dtype=torch.float32)*1e-3\n"
		 "r=[]\n"
		 "for i in range(%d):\n"
		 "  a=time.perf_counter(); torch.save({\"weights\":t},\"%s/t.pt\"); r.append(time.perf_counter()-a)\n"
		 "print(statistics.median(r))' 2>/dev/null",
		 BENCH_PYTHON, bytes / 4, iters < 5 ? iters : 5, dir);
	if (len < 0 || len >= (int)sizeof(cmd))
		return -1;   /* a directory too long for the command: no comparison */
	FILE *p = popen(cmd, "r");
	double v = -1;
	if (!p)
		return -1;
	if (fscanf(p, "%lf", &v) != 1)
		v = -1;
	if (pclose(p) != 0)
		v = -1;
	return v;
}

/*
 * --device cuda: the GPU benchmark is its own program (it links the CUDA
 * runtime; snapbench never does), built in bench/ beside snapbench when nvcc
 * was found.
 */
static int exec_gpu_bench(int argc, char **argv)
{
	static const char *const cand[] = { "%s/bench/snap_bench_gpu", "%s/../bench/snap_bench_gpu",
					    "%s/snap_bench_gpu" };
	char prog[PATH_MAX];
	char **args = calloc((size_t)argc + 2, sizeof(char *));
	if (!args)
		return SB_FAIL;
	args[0] = "snap_bench_gpu";
	for (int i = 1; i < argc; i++)
		args[i] = argv[i];
	bench_find_prog(prog, sizeof(prog), NULL, "snap_bench_gpu", cand, 3);
	execvp(prog, args);
	fprintf(stderr, "bench snapshot --device cuda: cannot run %s (%s); snap_bench_gpu is built only where "
		"nvcc was found\n", prog, strerror(errno));
	free(args);
	return SB_FAIL;
}

struct snap_args {
	uint64_t size;
	int ranks, iters, json;
	const char *input, *codec, *dir;
	struct bench_data data;   /* its codec and bound from --codec */
};

static int size_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	(void)c;
	if (snap_parse_size(v, dst) || *(uint64_t *)dst < 4096) {
		fprintf(stderr, "%s: expected a size >= 4096\n", opt);
		return -1;
	}
	return 0;
}

static int codec_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	struct snap_args *a = dst;
	(void)c;
	a->codec = v;
	if (snap_codec_spec_parse(v, &a->data.codec, &a->data.bound)) {
		fprintf(stderr, "%s: expected none, lossless, abs:BOUND or rel:FACTOR\n", opt);
		return -1;
	}
	return 0;
}

static const char snapshot_usage[] =
	"usage: snapbench snapshot [--size BYTES] [--ranks N] [--iters K] [--codec SPEC]\n"
	"                          [--input FILE] [--dir D] [--first-after MS] [--json]\n"
	"Save/commit of BYTES (split over N ranks) through a private snapsmp, vs memcpy and torch.save;\n"
	"then restore of the newest step by the saving context and by a new one (as after a relaunch),\n"
	"into its buffers and into fresh, never touched ones (a new context checks each chunk as it\n"
	"copies it, restore_verify auto; \"verify first\" checks every chunk before copying any).\n"
	"The fresh restore's ceiling: memcpy, 1 thread, into never-touched memory, and the CPU\n"
	"seconds per GB of both (the ranks' processes for the restore).\n"
	"--codec: none, lossless, abs:BOUND or rel:FACTOR for the f32 region (as SNAP_CODEC_PARAM).\n"
	"--input: raw little-endian f32 values (e.g. trained weights) tiled over the region;\n"
	"  default a ramp, which says nothing about a codec's speed on real data.\n"
	"--dir: where the store and torch.save's file go (default /dev/shm; a tmpfs mounted\n"
	"  huge=within_size shows what huge pages change, docs/deploy.md).\n"
	"--first-after: the first save MS ms after the layout went to the daemon (snap_prepare),\n"
	"  as after a first training step; \"first save\" is that save -> committed.\n"
	"--device cuda: the region in GPU memory, vs pinned cudaMemcpyAsync and a pageable copy\n"
	"  (runs snap_bench_gpu, built where nvcc was found; --sizes LIST instead of --size).\n";

static void usage(FILE *f)
{
	fputs(snapshot_usage, f);
}

/* SB_OK with a filled, -1 after --help, SB_USAGE. */
static int snap_parse(int argc, char **argv, struct snap_args *a)
{
	*a = (struct snap_args){ .size = 256ull << 20, .ranks = 2, .iters = 10, .codec = "none", .dir = "/dev/shm" };
	const struct cli_opt opts[] = {
		CLI_OPT_CALL("size", 0, &a->size, size_opt),
		CLI_OPT_CALL("codec", 0, a, codec_opt),
		CLI_OPT_STR("input", 0, &a->input),
		CLI_OPT_INT("ranks", 0, &a->ranks, 1, 64),
		CLI_OPT_INT("iters", 0, &a->iters, 1, MAX_ITERS),
		CLI_OPT_FLAG("json", 0, &a->json),
		CLI_OPT_STR("dir", 0, &a->dir),
		CLI_OPT_INT("first-after", 0, &a->data.first_after_ms, 0, 3600000),
		CLI_OPT_HELP,
	};
	const struct cli c = BENCH_CLI("snapshot", usage, 0);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	return SB_OK;
}

/* --dir: a directory under which the store's socket path fits and
 * torch.save's script can quote; the store's path into store. SB_OK or SB_USAGE. */
static int snapshot_dir(const char *dir, char *store, size_t cap)
{
	snprintf(store, cap, "%s/snapbench-%d", dir, (int)getpid());
	/* the socket is <store>/smp.sock; torch.save's path goes into a quoted script */
	if (strlen(store) + sizeof("/smp.sock") > sizeof(((struct sockaddr_un *)0)->sun_path) || strpbrk(dir, "'\"\\")) {
		fprintf(stderr, "snapbench snapshot: --dir %s: too long for a socket path under it, or holds a quote "
			"or a backslash\n", dir);
		return SB_USAGE;
	}
	struct stat dst;
	int st_rc = stat(dir, &dst);
	if (st_rc != 0 || !S_ISDIR(dst.st_mode)) {
		fprintf(stderr, "snapbench snapshot: --dir %s: %s\n", dir, st_rc ? strerror(errno) : "not a directory");
		return SB_USAGE;
	}
	return SB_OK;
}

/* --input's f32 values, tiled over each rank's region: SB_OK (data->tile
 * malloc'd) or SB_FAIL after a message. */
static int snapshot_input(const char *input, struct bench_data *data)
{
	if (!(data->tile = bench_read_f32(input, &data->ntile))) {
		fprintf(stderr, "bench snapshot: cannot read --input %s\n", input);
		return SB_FAIL;
	}
	return SB_OK;
}

/* Every rank's seconds from fd; per column and iteration the slowest
 * rank's into slow. Whether every rank sent them all. */
static int snapshot_collect(int fd, int ranks, int iters, double slow[NRES][MAX_ITERS])
{
	double res[NRES * MAX_ITERS];
	for (int r = 0; r < ranks; r++) {
		size_t want = sizeof(double) * NRES * (size_t)iters, got = 0;
		while (got < want) {
			ssize_t n = read(fd, (char *)res + got, want - got);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		if (got < want)
			return 0;
		for (int i = 0; i < iters; i++)
			for (int c = 0; c < NRES; c++)
				slow[c][i] = c == CPU_FRESH ? slow[c][i] + res[NRES * i + c]
					   : res[NRES * i + c] > slow[c][i] ? res[NRES * i + c] : slow[c][i];
	}
	return 1;
}

/* A barrier the ranks (processes) share. NULL after a message. */
static pthread_barrier_t *snapshot_barrier(int ranks)
{
	pthread_barrier_t *bar = mmap(NULL, sizeof(*bar), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pthread_barrierattr_t ba;
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	if (bar == MAP_FAILED || pthread_barrier_init(bar, &ba, (unsigned)ranks) != 0) {
		fprintf(stderr, "bench snapshot: cannot create a shared barrier\n");
		return NULL;
	}
	return bar;
}

/* A private snapsmp on store and the ranks against it, each saving per
 * bytes; the median of each column (NRES) into med. SB_OK or SB_FAIL. */
static int snapshot_ranks(const struct snap_args *a, const char *store, uint64_t per, double med[NRES])
{
	char smp[PATH_MAX];
	find_smp(smp, sizeof(smp));
	pid_t spid = fork();
	if (spid == 0) {
		execl(smp, "snapsmp", "--store", store, "--quiet", "--mem-limit", "1T", (char *)NULL);
		execlp("snapsmp", "snapsmp", "--store", store, "--quiet", "--mem-limit", "1T", (char *)NULL);
		_exit(127);
	}
	int pfd[2];
	if (spid < 0 || pipe(pfd) != 0) {
		fprintf(stderr, "bench snapshot: cannot start snapsmp (%s)\n", strerror(errno));
		return SB_FAIL;
	}
	pthread_barrier_t *bar = snapshot_barrier(a->ranks);
	if (!bar)
		return SB_FAIL;
	pid_t kids[64];
	for (int r = 0; r < a->ranks; r++) {
		kids[r] = fork();
		if (kids[r] == 0) {
			close(pfd[0]);
			_exit(run_rank(store, r, a->ranks, per, a->iters, pfd[1], bar, &a->data));
		}
	}
	close(pfd[1]);
	static double slow[NRES][MAX_ITERS];
	memset(slow, 0, sizeof(slow));
	int ok = snapshot_collect(pfd[0], a->ranks, a->iters, slow);
	close(pfd[0]);
	for (int r = 0; r < a->ranks; r++) {
		int st;
		waitpid(kids[r], &st, 0);
		ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	kill(spid, SIGTERM);
	waitpid(spid, NULL, 0);
	if (!ok) {
		fprintf(stderr, "bench snapshot: a rank failed (see above)\n");
		return SB_FAIL;
	}
	for (int c = 0; c < NRES; c++)
		med[c] = c == FIRST_SAVE ? slow[c][0] : bench_median(slow[c], a->iters);
	return SB_OK;
}

/* What snapshot prints: the ranks' medians (columns of NRES) and the comparisons. */
struct snapshot_figures {
	uint64_t total;
	double med[NRES], mc, mct, ts, mcf, mcf_cpu;
	long cores;
	int huge;
	char fs[160];
};

static void snapshot_json(const struct snap_args *a, const struct snapshot_figures *f)
{
	const double *m = f->med;
	printf("{\"first_commit_s\":%.6g,\"first_vs_steady\":%.3f,", m[FIRST_SAVE], m[FIRST_SAVE] / m[1]);
	printf("\"bytes\":%" PRIu64 ",\"ranks\":%d,\"codec\":\"%s\",\"save_block_s\":%.6g,\"commit_s\":%.6g,"
	       "\"restore_s\":%.6g,\"restore_new_ctx_s\":%.6g,\"restore_new_ctx_verify_first_s\":%.6g,"
	       "\"restore_fresh_buffers_s\":%.6g,\"store_read_s\":%.6g,\"memcpy_s\":%.6g,"
	       "\"memcpy_all_cores_s\":%.6g,\"store_hugepages\":%s,", f->total, a->ranks, a->codec,
	       m[0], m[1], m[2], m[3], m[5], m[4], m[6], f->mc, f->mct, f->huge == 1 ? "true" : "false");
	printf("\"memcpy_fresh_s\":%.6g,\"restore_fresh_cpu_s_per_gb\":%.6g,\"memcpy_fresh_cpu_s_per_gb\":%.6g,"
	       "\"torch_save_s\":", f->mcf, m[CPU_FRESH] / (f->total / 1e9), f->mcf_cpu / (f->total / 1e9));
	f->ts < 0 ? printf("null}\n") : printf("%.6g}\n", f->ts);
}

static void snapshot_text(const struct snap_args *a, const struct snapshot_figures *f)
{
	double b = f->med[0], cm = f->med[1], rs = f->med[2], rc_new = f->med[3], rc_fresh = f->med[4];
	double rc_first = f->med[5], rd = f->med[6], mc = f->mc, mct = f->mct, ts = f->ts, total = (double)f->total;
	long cores = f->cores;
	printf("snapshot of %.1f MiB over %d ranks (%ld copy threads each, %ld cores), codec %s, %s, median of %d, "
	       "slowest rank\n", total / 1048576.0, a->ranks, cores / a->ranks > 1 ? cores / a->ranks : 1, cores,
	       a->codec, a->input ? a->input : "ramp data", a->iters);
	const char *tlabel = strcmp(a->dir, "/dev/shm") ? "torch.save to --dir" : "torch.save to /dev/shm";
	printf("store under %s: %s huge pages (%s)\n", a->dir, f->huge == 1 ? "with" : "without",
	       f->huge < 0 ? "not a tmpfs" : f->fs);
	printf("  %-28s %10s %10s %12s\n", "", "seconds", "GB/s", "vs memcpy");
	printf("  %-28s %10.6f %10s %11.2f%%\n", "snap_save blocks", b, "-", 100 * b / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "save -> committed", cm, total / cm / 1e9, cm / mc);
	double fs = f->med[FIRST_SAVE];
	printf("  %-28s %10.4f %10.2f %11.2fx   (%.2fx the median: the job's first save)\n", "  the same, first save",
	       fs, total / fs / 1e9, fs / mc, fs / cm);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "restore (store -> buffers)", rs, total / rs / 1e9, rs / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "restore, new context", rc_new, total / rc_new / 1e9, rc_new / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "  the same, verify first", rc_first, total / rc_first / 1e9,
	       rc_first / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "  the same, fresh buffers", rc_fresh, total / rc_fresh / 1e9,
	       rc_fresh / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx   (a new context's restore takes %.2fx of it)\n",
	       "read(2) of the same bytes", rd, total / rd / 1e9, rd / mc, rc_new / rd);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "memcpy, 1 thread", mc, total / mc / 1e9, 1.0);
	if (f->mcf > 0)
		printf("  %-28s %10.4f %10.2f %11.2fx   (into never-touched memory: the fresh restore's ceiling)\n",
		       "  the same, fresh buffers", f->mcf, total / f->mcf / 1e9, f->mcf / mc);
	if (mct > 0)
		printf("  %-28s %10.4f %10.2f %11.2fx\n", "memcpy, all cores", mct, total / mct / 1e9, mct / mc);
	if (f->mcf_cpu > 0)
		printf("CPU seconds per GB into fresh buffers: restore %.3f (the ranks' processes), memcpy %.3f: %.2fx\n",
		       f->med[CPU_FRESH] / (total / 1e9), f->mcf_cpu / (total / 1e9), f->med[CPU_FRESH] / f->mcf_cpu);
	if (ts < 0)
		printf("  %-28s %10s\n", tlabel, "unavailable");
	else
		printf("  %-28s %10.4f %10.2f %11.2fx   (commit is %.1fx faster)\n", tlabel, ts,
		       total / ts / 1e9, ts / mc, ts / cm);
}

int cmd_bench_snapshot(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)   /* a program of its own, with its own options */
		if ((strcmp(argv[i], "--device") == 0 && i + 1 < argc && strcmp(argv[i + 1], "cuda") == 0) ||
		    strcmp(argv[i], "--device=cuda") == 0)
			return exec_gpu_bench(argc, argv);
	struct snap_args A;
	char store[PATH_MAX];
	int rc = snap_parse(argc, argv, &A);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	if ((rc = snapshot_dir(A.dir, store, sizeof(store))))
		return rc;
	static struct snapshot_figures F;
	F.huge = snap_store_hugepages(A.dir, F.fs, sizeof(F.fs));
	if (A.input && (rc = snapshot_input(A.input, &A.data)))
		return rc;
	uint64_t per = A.size / (uint64_t)A.ranks / 4096 * 4096;
	rc = snapshot_ranks(&A, store, per, F.med);
	if (rc) {
		remove_store(store);
		return rc;
	}
	F.total = per * (uint64_t)A.ranks;
	F.cores = sysconf(_SC_NPROCESSORS_ONLN);
	F.mc = bench_memcpy(F.total, A.iters);
	F.mct = bench_memcpy_mt(F.total, A.iters, F.cores > 64 ? 64 : (int)F.cores);
	F.mcf = snapshot_memcpy_fresh(F.total, A.iters, &F.mcf_cpu);
	F.ts = bench_torch(store, F.total, A.iters);
	remove_store(store);
	free((void *)A.data.tile);
	if (A.json)
		snapshot_json(&A, &F);
	else
		snapshot_text(&A, &F);
	return SB_OK;
}
