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
#include <getopt.h>
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

#include "bench_opts.h"
#include "bench_proc.h"
#include "bench_util.h"
#include "snap/proto.h"
#include "snap/snap.h"
#include "snapbench.h"

#define MAX_ITERS 64
#define NRES 8   /* per iteration: save blocks, save -> committed, restore, restore by a new context, the same
                   into fresh buffers, the same as the first but verifying every chunk first, read(2) of a
                   file of the same bytes on the store's file system; [0] only: the job's first save ->
                   committed (the warm-up saves, not in the medians) */
#define READ_BLOCK (256u << 10)   /* the restore's bounce block */

/* snapsmp next to this binary (build tree or install), else on PATH. */
static void find_smp(char *out, size_t cap)
{
	static const char *const cand[] = { "%s/snapsmp", "%s/../smp/snapsmp" };
	bench_find_prog(out, cap, "SNAPSMP", "snapsmp", cand, 2);
}

/*
 * One rank: open, register, warm up, then time `iters` save/wait cycles.
 * Ranks meet at a barrier before each save, as a training step's allreduce
 * makes them do; without it a fast rank would measure the wait for a slow
 * rank's commit (slot backpressure), not the cost of a save.
 */
/* What each rank snapshots: its region's codec and its values. */
struct bench_data {
	int codec;
	double bound;
	const float *tile;     /* --input: values tiled over the region; NULL: a ramp */
	size_t ntile;
	int first_after_ms;    /* --first-after: the first save that long after snap_prepare */
};

/* Close *ctx and open a new one with cfg, registering r: a relaunched trainer. */
static int reopen(const struct snap_config *cfg, const struct snap_region *r, snap_ctx **ctx)
{
	snap_close(*ctx);
	*ctx = NULL;
	int rc = snap_open(cfg, ctx);
	return rc ? rc : snap_register(*ctx, r);
}

static int run_rank(const char *store, int rank, int ranks, uint64_t bytes, int iters, int wfd,
		    pthread_barrier_t *bar, const struct bench_data *d)
{
	struct snap_config cfg;
	snap_config_init(&cfg);
	int too_long = snprintf(cfg.store, sizeof(cfg.store), "%s", store) >= (int)sizeof(cfg.store) ||
		       snprintf(cfg.socket, sizeof(cfg.socket), "%s/smp.sock", store) >= (int)sizeof(cfg.socket);
	snprintf(cfg.job, sizeof(cfg.job), "bench");
	cfg.autostart = SNAP_AUTOSTART_OFF;   /* the daemon is the benchmark's, with its settings */
	cfg.rank = rank;
	cfg.world_size = ranks;
	/* As deployed: the node's cores shared by its ranks' copy threads. */
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	cfg.copy_threads = cores / ranks > 1 ? (unsigned)(cores / ranks) : 1;
	snap_ctx *ctx = NULL;
	if (too_long) {
		fprintf(stderr, "bench rank %d: store path %s is too long (at most %zu bytes with /smp.sock)\n", rank,
			store, sizeof(cfg.socket) - 10);
		return 1;
	}
	float *buf = malloc(bytes);
	if (!buf || snap_open(&cfg, &ctx)) {
		fprintf(stderr, "bench rank %d: %s\n", rank, ctx ? snap_errmsg(ctx) : "out of memory");
		return 1;
	}
	for (uint64_t i = 0; i < bytes / 4; i++)
		buf[i] = d->tile ? d->tile[i % d->ntile] : (float)i * 1e-3f;
	struct snap_region r = { .name = "weights", .ptr = buf, .bytes = bytes / 4 * 4, .dtype = SNAP_DTYPE_F32,
				 .codec = d->codec, .codec_bound = d->bound };
	int rc = snap_register(ctx, &r);
	/* The layout goes to the daemon now, as a trainer sends it before its
	 * first step (snap_prepare): its slot files are reserved from here. */
	if (!rc)
		rc = snap_prepare(ctx);
	if (!rc && d->first_after_ms) {   /* a first training step */
		struct timespec ts = { d->first_after_ms / 1000, (long)(d->first_after_ms % 1000) * 1000000L };
		nanosleep(&ts, NULL);
	}
	double res[NRES * MAX_ITERS] = { 0 };
	for (int it = -2; it < iters; it++) {
		pthread_barrier_wait(bar);
		if (rc)
			continue;   /* keep meeting the others so nobody hangs */
		uint64_t t0 = snap_now_ns();
		rc = snap_save(ctx, (uint64_t)(it + 3));
		uint64_t t1 = snap_now_ns();
		if (!rc)
			rc = snap_wait(ctx);
		uint64_t t2 = snap_now_ns();
		if (it >= 0) {
			res[NRES * it] = (t1 - t0) / 1e9;
			res[NRES * it + 1] = (t2 - t0) / 1e9;
		} else if (it == -2) {
			res[7] = (t2 - t0) / 1e9;
		}
	}
	/* Restore of the newest step from the node store into the buffers
	 * (every chunk's CRC32C checked, then copied), after all saves: read
	 * through the slot mapping this process's saves made... */
	for (int it = -1; it < iters; it++) {
		pthread_barrier_wait(bar);
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns(), got;
		rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
		if (it >= 0)
			res[NRES * it + 2] = (snap_now_ns() - t0) / 1e9;
	}
	/* ...and from a new context, as a relaunched trainer restores: it has
	 * never mapped the slot, and (restore_verify auto) checks each chunk as
	 * it copies it; then the same checking every chunk first (restore_verify
	 * first), the saving context's way. Only snap_restore() is timed. */
	struct snap_config first = cfg;
	first.restore_verify = SNAP_VERIFY_FIRST;
	for (int it = -1; it < 2 * iters + 1; it++) {
		pthread_barrier_wait(bar);
		if (!rc)
			rc = reopen(it < iters ? &cfg : &first, &r, &ctx);
		pthread_barrier_wait(bar);   /* every rank open before any restores */
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns(), got;
		rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
		if (it >= 0 && it < iters)
			res[NRES * it + 3] = (snap_now_ns() - t0) / 1e9;
		else if (it > iters)
			res[NRES * (it - iters - 1) + 5] = (snap_now_ns() - t0) / 1e9;
	}
	/* ...and into buffers never touched, as a relaunched trainer that
	 * allocates its tensors empty and restores into them: the copy meets
	 * every page for the first time. Its own mapping, so it is fresh. */
	for (int it = -1; it < iters; it++) {
		pthread_barrier_wait(bar);
		void *fresh = MAP_FAILED;
		if (!rc) {
			fresh = mmap(NULL, r.bytes ? r.bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			r.ptr = fresh;
			rc = fresh == MAP_FAILED ? SNAP_ENOMEM : reopen(&cfg, &r, &ctx);
		}
		pthread_barrier_wait(bar);
		if (!rc) {
			uint64_t t0 = snap_now_ns(), got;
			rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
			if (it >= 0)
				res[NRES * it + 4] = (snap_now_ns() - t0) / 1e9;
			/* the bytes must be the saved ones, or the row measures nothing
			 * (a lossy codec's are not: only raw and lossless are checked) */
			int exact = d->codec == SNAP_CODEC_NONE || d->codec == SNAP_CODEC_LOSSLESS;
			for (uint64_t i = 0; exact && !rc && i < bytes / 4; i += 4093)
				if (memcmp(&((float *)fresh)[i], &buf[i], 4) != 0)
					rc = SNAP_ECORRUPT;
		}
		if (fresh != MAP_FAILED)
			munmap(fresh, r.bytes ? r.bytes : 1);
	}
	/* The floor for a restore that reads the store through the page cache
	 * (a new context on a store it does not map): read(2) of a file of the
	 * same bytes beside the store, on the same file system, into a block
	 * the size of the restore's bounce block; every rank at once. */
	char rpath[PATH_MAX + 32];
	snprintf(rpath, sizeof(rpath), "%s.read-%d", store, rank);
	int rfd = rc ? -1 : open(rpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	uint8_t *blk = malloc(READ_BLOCK);
	uint64_t put = 0;   /* write(2) moves at most ~2 GiB a call */
	for (ssize_t n = 1; !rc && rfd >= 0 && put < bytes && n > 0; put += n > 0 ? (uint64_t)n : 0)
		n = write(rfd, (const char *)buf + put, bytes - put);
	if (!rc && (rfd < 0 || !blk || put != bytes)) {
		fprintf(stderr, "bench rank %d: cannot write %s: %s\n", rank, rpath, strerror(errno));
		rc = SNAP_EIO;
	}
	for (int it = -1; it < iters; it++) {
		pthread_barrier_wait(bar);
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns();
		for (uint64_t off = 0; off < bytes && !rc;) {
			ssize_t n = pread(rfd, blk, bytes - off < READ_BLOCK ? bytes - off : READ_BLOCK, (off_t)off);
			if (n <= 0)
				rc = SNAP_EIO;
			off += n > 0 ? (uint64_t)n : 0;
		}
		if (it >= 0)
			res[NRES * it + 6] = (snap_now_ns() - t0) / 1e9;
	}
	if (rfd >= 0) {
		close(rfd);
		unlink(rpath);
	}
	free(blk);
	if (rc)
		fprintf(stderr, "bench rank %d: %s\n", rank, ctx ? snap_errmsg(ctx) : snap_strerror(rc));
	if (ctx)
		snap_close(ctx);
	free(buf);
	if (!rc && write(wfd, res, sizeof(double) * NRES * (size_t)iters) != (ssize_t)(sizeof(double) * NRES * (size_t)iters))
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

int cmd_bench_snapshot(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		if ((strcmp(argv[i], "--device") == 0 && i + 1 < argc && strcmp(argv[i + 1], "cuda") == 0) ||
		    strcmp(argv[i], "--device=cuda") == 0)
			return exec_gpu_bench(argc, argv);
	uint64_t size = 256ull << 20;
	int ranks = 2, iters = 10, json = 0, c;
	struct bench_data data = { 0 };
	const char *input = NULL, *codec = "none", *dir = "/dev/shm";
	static const struct option lo[] = { { "size", required_argument, NULL, 's' },
					    { "codec", required_argument, NULL, 'c' },
					    { "input", required_argument, NULL, 'f' },
					    { "ranks", required_argument, NULL, 'r' },
					    { "iters", required_argument, NULL, 'i' },
					    { "json", no_argument, NULL, 'j' },
					    { "dir", required_argument, NULL, 'd' },
					    { "first-after", required_argument, NULL, 'a' },
					    { "help", no_argument, NULL, 'h' },
					    { NULL, 0, NULL, 0 } };
	const char *usage = "usage: snapbench snapshot [--size BYTES] [--ranks N] [--iters K] [--codec SPEC]\n"
			    "                          [--input FILE] [--dir D] [--first-after MS] [--json]\n"
			    "Save/commit of BYTES (split over N ranks) through a private snapsmp, vs memcpy and torch.save;\n"
			    "then restore of the newest step by the saving context and by a new one (as after a relaunch),\n"
			    "into its buffers and into fresh, never touched ones (a new context checks each chunk as it\n"
			    "copies it, restore_verify auto; \"verify first\" checks every chunk before copying any).\n"
			    "--codec: none, lossless, abs:BOUND or rel:FACTOR for the f32 region (as SNAP_CODEC_PARAM).\n"
			    "--input: raw little-endian f32 values (e.g. trained weights) tiled over the region;\n"
			    "  default a ramp, which says nothing about a codec's speed on real data.\n"
			    "--dir: where the store and torch.save's file go (default /dev/shm; a tmpfs mounted\n"
			    "  huge=within_size shows what huge pages change, docs/deploy.md).\n"
			    "--first-after: the first save MS ms after the layout went to the daemon (snap_prepare),\n"
			    "  as after a first training step; \"first save\" is that save -> committed.\n"
			    "--device cuda: the region in GPU memory, vs pinned cudaMemcpyAsync and a pageable copy\n"
			    "  (runs snap_bench_gpu, built where nvcc was found; --sizes LIST instead of --size).\n";
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		switch (c) {
		case 's':
			if (snap_parse_size(optarg, &size) || size < 4096) {
				fprintf(stderr, "--size: expected a size >= 4096\n");
				return SB_USAGE;
			}
			break;
		case 'r':
			if (bench_opt_int("snapshot", "--ranks", optarg, 1, 64, &ranks))
				return SB_USAGE;
			break;
		case 'i':
			if (bench_opt_int("snapshot", "--iters", optarg, 1, MAX_ITERS, &iters))
				return SB_USAGE;
			break;
		case 'd': dir = optarg; break;
		case 'a':
			if (bench_opt_int("snapshot", "--first-after", optarg, 0, 3600000, &data.first_after_ms))
				return SB_USAGE;
			break;
		case 'j': json = 1; break;
		case 'c':
			codec = optarg;
			if (snap_codec_spec_parse(optarg, &data.codec, &data.bound)) {
				fprintf(stderr, "--codec: expected none, lossless, abs:BOUND or rel:FACTOR\n");
				return SB_USAGE;
			}
			break;
		case 'f': input = optarg; break;
		case 'h': printf("%s", usage); return SB_OK;
		default: fprintf(stderr, "%s", usage); return SB_USAGE;
		}
	}
	char store[PATH_MAX], smp[PATH_MAX];
	snprintf(store, sizeof(store), "%s/snapbench-%d", dir, (int)getpid());
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
	char fs[160];
	int huge = snap_store_hugepages(dir, fs, sizeof(fs));
	float *tile = NULL;
	if (input) {
		FILE *f = fopen(input, "rb");
		struct stat st;
		if (!f || fstat(fileno(f), &st) != 0 || st.st_size < 4 || !(tile = malloc((size_t)st.st_size)) ||
		    fread(tile, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
			fprintf(stderr, "bench snapshot: cannot read --input %s\n", input);
			if (f)
				fclose(f);
			free(tile);
			return SB_FAIL;
		}
		fclose(f);
		data.tile = tile;
		data.ntile = (size_t)st.st_size / 4;
	}
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
	uint64_t per = size / (uint64_t)ranks / 4096 * 4096;
	pthread_barrier_t *bar = mmap(NULL, sizeof(*bar), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pthread_barrierattr_t ba;
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	if (bar == MAP_FAILED || pthread_barrier_init(bar, &ba, (unsigned)ranks) != 0) {
		fprintf(stderr, "bench snapshot: cannot create a shared barrier\n");
		return SB_FAIL;
	}
	pid_t kids[64];
	for (int r = 0; r < ranks; r++) {
		kids[r] = fork();
		if (kids[r] == 0) {
			close(pfd[0]);
			_exit(run_rank(store, r, ranks, per, iters, pfd[1], bar, &data));
		}
	}
	close(pfd[1]);
	double block[MAX_ITERS] = { 0 }, commit[MAX_ITERS] = { 0 }, restore[MAX_ITERS] = { 0 },
	       cold[MAX_ITERS] = { 0 }, fresh[MAX_ITERS] = { 0 }, cold_first[MAX_ITERS] = { 0 },
	       sread[MAX_ITERS] = { 0 }, res[NRES * MAX_ITERS], first_save = 0;
	int ok = 1;
	for (int r = 0; r < ranks; r++) {
		size_t want = sizeof(double) * NRES * (size_t)iters, got = 0;
		while (got < want) {
			ssize_t n = read(pfd[0], (char *)res + got, want - got);
			if (n <= 0)
				break;
			got += (size_t)n;
		}
		if (got < want) {
			ok = 0;
			break;
		}
		for (int i = 0; i < iters; i++) {
			block[i] = res[NRES * i] > block[i] ? res[NRES * i] : block[i];
			commit[i] = res[NRES * i + 1] > commit[i] ? res[NRES * i + 1] : commit[i];
			restore[i] = res[NRES * i + 2] > restore[i] ? res[NRES * i + 2] : restore[i];
			cold[i] = res[NRES * i + 3] > cold[i] ? res[NRES * i + 3] : cold[i];
			fresh[i] = res[NRES * i + 4] > fresh[i] ? res[NRES * i + 4] : fresh[i];
			cold_first[i] = res[NRES * i + 5] > cold_first[i] ? res[NRES * i + 5] : cold_first[i];
			sread[i] = res[NRES * i + 6] > sread[i] ? res[NRES * i + 6] : sread[i];
		}
		first_save = res[7] > first_save ? res[7] : first_save;
	}
	close(pfd[0]);
	for (int r = 0; r < ranks; r++) {
		int st;
		waitpid(kids[r], &st, 0);
		ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
	}
	kill(spid, SIGTERM);
	waitpid(spid, NULL, 0);
	if (!ok) {
		fprintf(stderr, "bench snapshot: a rank failed (see above)\n");
		remove_store(store);
		return SB_FAIL;
	}
	uint64_t total = per * (uint64_t)ranks;
	double b = bench_median(block, iters), cm = bench_median(commit, iters), rs = bench_median(restore, iters);
	double rc_new = bench_median(cold, iters), rc_fresh = bench_median(fresh, iters);
	double rc_first = bench_median(cold_first, iters), rd = bench_median(sread, iters);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	double mc = bench_memcpy(total, iters);
	double mct = bench_memcpy_mt(total, iters, cores > 64 ? 64 : (int)cores);
	double ts = bench_torch(store, total, iters);
	remove_store(store);
	free(tile);

	if (json) {
		printf("{\"first_commit_s\":%.6g,\"first_vs_steady\":%.3f,", first_save, first_save / cm);
		printf("\"bytes\":%" PRIu64 ",\"ranks\":%d,\"codec\":\"%s\",\"save_block_s\":%.6g,\"commit_s\":%.6g,"
		       "\"restore_s\":%.6g,\"restore_new_ctx_s\":%.6g,\"restore_new_ctx_verify_first_s\":%.6g,"
		       "\"restore_fresh_buffers_s\":%.6g,\"store_read_s\":%.6g,\"memcpy_s\":%.6g,"
		       "\"memcpy_all_cores_s\":%.6g,\"store_hugepages\":%s,\"torch_save_s\":", total, ranks, codec, b,
		       cm, rs, rc_new, rc_first, rc_fresh, rd, mc, mct, huge == 1 ? "true" : "false");
		ts < 0 ? printf("null}\n") : printf("%.6g}\n", ts);
		return SB_OK;
	}
	printf("snapshot of %.1f MiB over %d ranks (%ld copy threads each, %ld cores), codec %s, %s, median of %d, "
	       "slowest rank\n", total / 1048576.0, ranks, cores / ranks > 1 ? cores / ranks : 1, cores, codec,
	       input ? input : "ramp data", iters);
	const char *tlabel = strcmp(dir, "/dev/shm") ? "torch.save to --dir" : "torch.save to /dev/shm";
	printf("store under %s: %s huge pages (%s)\n", dir, huge == 1 ? "with" : "without",
	       huge < 0 ? "not a tmpfs" : fs);
	printf("  %-28s %10s %10s %12s\n", "", "seconds", "GB/s", "vs memcpy");
	printf("  %-28s %10.6f %10s %11.2f%%\n", "snap_save blocks", b, "-", 100 * b / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "save -> committed", cm, total / cm / 1e9, cm / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx   (%.2fx the median: the job's first save)\n", "  the same, first save",
	       first_save, total / first_save / 1e9, first_save / mc, first_save / cm);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "restore (store -> buffers)", rs, total / rs / 1e9, rs / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "restore, new context", rc_new, total / rc_new / 1e9, rc_new / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "  the same, verify first", rc_first, total / rc_first / 1e9,
	       rc_first / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "  the same, fresh buffers", rc_fresh, total / rc_fresh / 1e9,
	       rc_fresh / mc);
	printf("  %-28s %10.4f %10.2f %11.2fx   (a new context's restore takes %.2fx of it)\n",
	       "read(2) of the same bytes", rd, total / rd / 1e9, rd / mc, rc_new / rd);
	printf("  %-28s %10.4f %10.2f %11.2fx\n", "memcpy, 1 thread", mc, total / mc / 1e9, 1.0);
	if (mct > 0)
		printf("  %-28s %10.4f %10.2f %11.2fx\n", "memcpy, all cores", mct, total / mct / 1e9, mct / mc);
	if (ts < 0)
		printf("  %-28s %10s\n", tlabel, "unavailable");
	else
		printf("  %-28s %10.4f %10.2f %11.2fx   (commit is %.1fx faster)\n", tlabel, ts,
		       total / ts / 1e9, ts / mc, ts / cm);
	return SB_OK;
}
