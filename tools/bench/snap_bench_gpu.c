/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap_bench_gpu: a snapshot of GPU state as a trainer sees it, through a
 * real snapsmp, side by side in one run with the physical limit and with
 * what frameworks do instead (also run as `snapbench snapshot --device
 * cuda`, which execs this program).
 *
 * For each size (one rank, one region of f32 in device memory):
 *   snap_save blocks       host time of snap_save_on_stream()
 *   save -> committed      until snapsmp published the step (snap_wait)
 *   pinned cudaMemcpyAsync D2H of the same bytes into cudaHostAlloc memory:
 *                          the PCIe limit, what the copy cannot beat
 *   pageable copy          cudaMemcpy into malloc'd memory, as
 *                          tensor.to("cpu") / torch.save of a CUDA tensor do
 *   codec runs             the same save with the CUDA codec kernels in the
 *                          path (lossless; lossy abs 1e-3)
 * and the codec kernels alone vs the C twin on one core (GB/s of raw input).
 * Medians over --iters. Values: --input FILE (raw f32, tiled), else a ramp.
 */
#include <cuda_runtime_api.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "cliopts.h"
#include "snap/base.h"
#include "snap/codec.h"
#include "snap/snap.h"

#define CU(call)                                                                                       \
	do {                                                                                           \
		cudaError_t e_ = (call);                                                               \
		if (e_ != cudaSuccess) {                                                               \
			fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
			exit(1);                                                                       \
		}                                                                                      \
	} while (0)

#define MAXI 32

/* The benchmark's values: the input tiled, or a ramp. */
static void fill(float *h, uint64_t bytes, const float *tile, size_t ntile)
{
	for (uint64_t i = 0; i < bytes / 4; i++)
		h[i] = tile ? tile[i % ntile] : (float)i * 1e-3f;
}

static double now(void)
{
	return snap_now_ns() / 1e9;
}

/* snapsmp beside this program's build or install tree, else on PATH. */
static void find_smp(char *out, size_t cap)
{
	static const char *const cand[] = { "%s/snapsmp", "%s/../../smp/snapsmp" };
	bench_find_prog(out, cap, "SNAPSMP", "snapsmp", cand, 2);
}

struct result {
	double block, commit;
};

static char smp[PATH_MAX];

/* A private snapsmp on a fresh store per run, so runs do not add up in /dev/shm. */
static pid_t start_smp(const char *store)
{
	pid_t pid = fork();
	if (pid == 0) {
		execlp(smp, "snapsmp", "--store", store, "--quiet", "--mem-limit", "1T", (char *)NULL);
		_exit(127);
	}
	return pid;
}

static void stop_smp(pid_t pid, const char *store)
{
	kill(pid, SIGTERM);
	waitpid(pid, NULL, 0);
	char cmd[200];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", store);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", store);
}

/* Save/commit of d (bytes) through snapsmp with the given codec. */
static int run_snap(const char *store, void *d, uint64_t bytes, int codec, double bound, int iters,
		    cudaStream_t st, struct result *out)
{
	static int job;
	pid_t spid = start_smp(store);
	struct snap_config cfg;
	snap_config_init(&cfg);
	snprintf(cfg.store, sizeof(cfg.store), "%s", store);
	snprintf(cfg.socket, sizeof(cfg.socket), "%s/smp.sock", store);
	snprintf(cfg.job, sizeof(cfg.job), "gpubench%d", job++);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	cfg.copy_threads = cores > 8 ? 8 : (unsigned)cores;
	cfg.timeout_ms = 60000;
	cfg.autostart = SNAP_AUTOSTART_OFF;   /* the daemon is the one started above, with its settings */
	snap_ctx *ctx = NULL;
	if (snap_open(&cfg, &ctx)) {
		fprintf(stderr, "snap_open: %s\n", snap_errmsg(ctx));
		snap_close(ctx);
		stop_smp(spid, store);
		return -1;
	}
	struct snap_region r = { .name = "weights", .ptr = d, .bytes = bytes, .dtype = SNAP_DTYPE_F32,
				 .kind = SNAP_KIND_PARAM, .device = SNAP_DEVICE_CUDA, .codec = codec,
				 .codec_bound = bound };
	int rc = snap_register(ctx, &r);
	double b[MAXI], c[MAXI];
	for (int it = -2; it < iters && !rc; it++) {
		CU(cudaStreamSynchronize(st));
		double t0 = now();
		rc = snap_save_on_stream(ctx, (uint64_t)(it + 3), st);
		double t1 = now();
		if (!rc)
			rc = snap_wait(ctx);
		double t2 = now();
		if (it >= 0) {
			b[it] = t1 - t0;
			c[it] = t2 - t0;
		}
	}
	if (rc)
		fprintf(stderr, "snapshot: %s\n", snap_errmsg(ctx));
	snap_close(ctx);
	stop_smp(spid, store);
	if (rc)
		return -1;
	out->block = bench_median(b, iters);
	out->commit = bench_median(c, iters);
	return 0;
}

static double run_pinned(void *d, uint64_t bytes, int iters, cudaStream_t st)
{
	void *h;
	double t[MAXI];
	CU(cudaHostAlloc(&h, bytes, cudaHostAllocDefault));
	for (int it = -1; it < iters; it++) {
		double t0 = now();
		CU(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, st));
		CU(cudaStreamSynchronize(st));
		if (it >= 0)
			t[it] = now() - t0;
	}
	CU(cudaFreeHost(h));
	return bench_median(t, iters);
}

static double run_pageable(void *d, uint64_t bytes, int iters)
{
	double t[MAXI];
	for (int it = 0; it < iters; it++) {
		/* A fresh buffer each time, as .to("cpu") allocates one. */
		void *h = malloc(bytes);
		double t0 = now();
		CU(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
		t[it] = now() - t0;
		free(h);
	}
	return bench_median(t, iters);
}

/* The kernels on the whole buffer in one call (a full GPU: what they can
 * do), compress and decompress; exits on any failure, or if the round trip
 * is not bit-exact where it must be (lossless). */
static void run_whole(void *d, uint64_t bytes, int codec, double bound, int iters, cudaStream_t st,
		      double *comp_gbs, double *dec_gbs)
{
	struct snap_codec_params p = { .codec = codec, .dtype = SNAP_DTYPE_F32, .bound = bound };
	size_t n = bytes / 4, cap = snap_codec_bound(&p, n), sl = snap_codec_cuda_scratch_size(&p, n);
	void *out, *sc, *back, *dsc;
	uint64_t *len, hlen = 0;
	int *status, hst = 0;
	CU(cudaMalloc(&out, cap));
	CU(cudaMalloc(&sc, sl));
	CU(cudaMalloc(&back, bytes));
	CU(cudaMalloc((void **)&len, 8));
	CU(cudaMalloc((void **)&status, sizeof(int)));
	double t[MAXI], u[MAXI];
	for (int it = -1; it < iters; it++) {
		CU(cudaStreamSynchronize(st));
		double t0 = now();
		if (snap_codec_cuda_compress(&p, d, n, out, cap, sc, sl, len, st)) {
			fprintf(stderr, "snap_codec_cuda_compress failed\n");
			exit(1);
		}
		CU(cudaStreamSynchronize(st));
		if (it >= 0)
			t[it] = now() - t0;
	}
	CU(cudaMemcpy(&hlen, len, 8, cudaMemcpyDeviceToHost));
	struct snap_codec_info info;
	uint8_t *hs = malloc(hlen ? hlen : 1);
	CU(cudaMemcpy(hs, out, hlen, cudaMemcpyDeviceToHost));
	if (snap_codec_inspect(hs, hlen, &info)) {
		fprintf(stderr, "whole-buffer stream: bad header\n");
		exit(1);
	}
	free(hs);
	size_t dl = snap_codec_cuda_decode_scratch_size(&info);
	CU(cudaMalloc(&dsc, dl));
	for (int it = -1; it < iters; it++) {
		CU(cudaStreamSynchronize(st));
		double t0 = now();
		if (snap_codec_cuda_decompress(&info, out, hlen, back, bytes, dsc, dl, status, st)) {
			fprintf(stderr, "snap_codec_cuda_decompress failed\n");
			exit(1);
		}
		CU(cudaStreamSynchronize(st));
		if (it >= 0)
			u[it] = now() - t0;
	}
	CU(cudaMemcpy(&hst, status, sizeof(int), cudaMemcpyDeviceToHost));
	if (hst) {
		fprintf(stderr, "whole-buffer decode: %s\n", snap_strerror(hst));
		exit(1);
	}
	if (codec == SNAP_CODEC_LOSSLESS) {
		uint8_t *a = malloc(bytes), *b = malloc(bytes);
		CU(cudaMemcpy(a, d, bytes, cudaMemcpyDeviceToHost));
		CU(cudaMemcpy(b, back, bytes, cudaMemcpyDeviceToHost));
		if (memcmp(a, b, bytes)) {
			fprintf(stderr, "whole-buffer lossless round trip differs\n");
			exit(1);
		}
		free(a);
		free(b);
	}
	*comp_gbs = bytes / bench_median(t, iters) / 1e9;
	*dec_gbs = bytes / bench_median(u, iters) / 1e9;
	cudaFree(out);
	cudaFree(sc);
	cudaFree(back);
	cudaFree(dsc);
	cudaFree(len);
	cudaFree(status);
}

/* Codec kernels over the whole buffer in SNAP_CHUNK_SIZE pieces, as the
 * save runs them (taking turns over NSTREAMS streams, each with its
 * scratch, like libsnap_cuda), and the C twin on one core over the first
 * 256 MiB. */
#define NSTREAMS 4
static void run_kernels(void *d, const float *h, uint64_t bytes, int codec, double bound, int iters,
			double *gpu_gbs, double *cpu_gbs, double *ratio)
{
	const uint64_t chunk = 4u << 20;
	struct snap_codec_params p = { .codec = codec, .dtype = SNAP_DTYPE_F32, .bound = bound };
	size_t cap = snap_codec_bound(&p, chunk / 4), sl = snap_codec_cuda_scratch_size(&p, chunk / 4);
	uint64_t nch = bytes / chunk;
	void *out, *sc[NSTREAMS];
	cudaStream_t sts[NSTREAMS];
	uint64_t *lens, *hl = malloc(nch * 8);
	CU(cudaMalloc(&out, cap * nch));
	for (int k = 0; k < NSTREAMS; k++) {
		CU(cudaMalloc(&sc[k], sl));
		CU(cudaStreamCreateWithFlags(&sts[k], cudaStreamNonBlocking));
	}
	CU(cudaMalloc((void **)&lens, nch * 8));
	double t[MAXI];
	for (int it = -1; it < iters; it++) {
		CU(cudaDeviceSynchronize());
		double t0 = now();
		for (uint64_t k = 0; k < nch; k++) {
			int rc = snap_codec_cuda_compress(&p, (const char *)d + k * chunk, chunk / 4,
							  (char *)out + k * cap, cap, sc[k % NSTREAMS], sl, lens + k,
							  sts[k % NSTREAMS]);
			if (rc) {
				fprintf(stderr, "snap_codec_cuda_compress: %s\n", snap_strerror(rc));
				exit(1);
			}
		}
		CU(cudaDeviceSynchronize());
		if (it >= 0)
			t[it] = now() - t0;
	}
	CU(cudaMemcpy(hl, lens, nch * 8, cudaMemcpyDeviceToHost));
	uint64_t stored = 0;
	for (uint64_t k = 0; k < nch; k++)
		stored += hl[k];
	*ratio = stored ? (double)(nch * chunk) / (double)stored : 0;
	*gpu_gbs = nch * chunk / bench_median(t, iters) / 1e9;
	uint64_t cb = bytes < (256ull << 20) ? bytes : (256ull << 20);
	uint8_t *cout = malloc(cap);
	double t0 = now();
	for (uint64_t k = 0; k + chunk <= cb; k += chunk) {
		size_t n;
		snap_codec_compress(&p, (const char *)h + k, chunk / 4, cout, cap, &n);
	}
	*cpu_gbs = cb / (now() - t0) / 1e9;
	free(cout);
	free(hl);
	cudaFree(out);
	for (int k = 0; k < NSTREAMS; k++) {
		cudaFree(sc[k]);
		cudaStreamDestroy(sts[k]);
	}
	cudaFree(lens);
}

struct gpu_args {
	const char *sizes, *input;
	int iters;
};

static int device_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	(void)c, (void)dst;
	if (strcmp(v, "cuda") != 0) {
		fprintf(stderr, "%s: only cuda\n", opt);
		return -1;
	}
	return 0;
}

static const char gpu_usage[] = "usage: snap_bench_gpu [--sizes 256M,1G,4G,8G] [--iters K] [--input FILE]\n"
				"       (snapbench snapshot --device cuda takes the same options)\n";

static void usage(FILE *f)
{
	fputs(gpu_usage, f);
}

/* 0 with a filled, -1 after --help, or the exit code 2 after a message. */
static int gpu_parse(int argc, char **argv, struct gpu_args *a)
{
	const char *iters = NULL;
	*a = (struct gpu_args){ .sizes = "256M,1G,4G,8G", .iters = 5 };
	const struct cli_opt opts[] = {
		CLI_OPT_STR("sizes", 0, &a->sizes),     CLI_OPT_STR("size", 0, &a->sizes),
		CLI_OPT_STR("iters", 0, &iters),        CLI_OPT_STR("input", 0, &a->input),
		CLI_OPT_CALL("device", 0, NULL, device_opt), CLI_OPT_HELP,
	};
	const struct cli c = { .who = "snap_bench_gpu", .unknown_fmt = "%s: unknown or incomplete option '%s'",
			       .max_pos = 0, .usage = usage };
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : 2;
	a->iters = iters ? atoi(iters) : a->iters;
	if (a->iters < 1 || a->iters > MAXI) {
		fprintf(stderr, "--iters: 1..%d\n", MAXI);
		return 2;
	}
	return 0;
}

/* --input's f32 values into *tile (*ntile of them): 0, or 1 after a message. */
static int gpu_input(const char *input, float **tile, size_t *ntile)
{
	if (!(*tile = bench_read_f32(input, ntile))) {
		fprintf(stderr, "cannot read --input %s\n", input);
		return 1;
	}
	return 0;
}

/* One row of the table: the size tok (skipped when it is not one); -1 when a snapshot failed. */
static int gpu_size_row(const char *store, const char *tok, const float *tile, size_t ntile, int iters,
			cudaStream_t st)
{
	uint64_t bytes;
	if (snap_parse_size(tok, &bytes) || bytes < (4u << 20)) {
		fprintf(stderr, "--sizes: %s is not a size >= 4M\n", tok);
		return 0;
	}
	bytes = bytes / (4u << 20) * (4u << 20);
	float *h = malloc(bytes);
	fill(h, bytes, tile, ntile);
	void *d;
	CU(cudaMalloc(&d, bytes));
	CU(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
	struct result raw, ll, ly;
	if (run_snap(store, d, bytes, SNAP_CODEC_NONE, 0, iters, st, &raw) ||
	    run_snap(store, d, bytes, SNAP_CODEC_LOSSLESS, 0, iters, st, &ll) ||
	    run_snap(store, d, bytes, SNAP_CODEC_LOSSY_ABS, 1e-3, iters, st, &ly)) {
		fprintf(stderr, "snapshot of %s failed\n", tok);
		return -1;
	}
	double pin = run_pinned(d, bytes, iters, st), pg = run_pageable(d, bytes, iters < 3 ? iters : 3);
	double gb = bytes / 1e9;
	printf("%8s | %7.3fms %8.4fs %7.1f | %6.4fs %7.1f | %6.3fx | %6.3fs %7.1f | lossless %.4fs %.1f %.3fms;"
	       " abs:1e-3 %.4fs %.1f %.3fms\n",
	       tok, raw.block * 1e3, raw.commit, gb / raw.commit, pin, gb / pin, raw.commit / pin, pg, gb / pg,
	       ll.commit, gb / ll.commit, ll.block * 1e3, ly.commit, gb / ly.commit, ly.block * 1e3);
	free(h);
	CU(cudaFree(d));
	return 0;
}

/* The codec kernels alone on 1 GiB (or the input tiled to it). */
static void gpu_kernels(const float *tile, size_t ntile, int iters, cudaStream_t st)
{
	uint64_t kb = 1ull << 30;
	float *h = malloc(kb);
	fill(h, kb, tile, ntile);
	void *d;
	CU(cudaMalloc(&d, kb));
	CU(cudaMemcpy(d, h, kb, cudaMemcpyHostToDevice));
	printf("codec kernels alone, f32, 4 MiB chunks over 1 GiB on %d streams, as a save runs them (GB/s of raw input):\n",
	       NSTREAMS);
	const struct { const char *name; int codec; double bound; } cs[] = {
		{ "lossless", SNAP_CODEC_LOSSLESS, 0 }, { "abs:1e-3", SNAP_CODEC_LOSSY_ABS, 1e-3 },
		{ "rel:1e-3", SNAP_CODEC_LOSSY_REL, 1e-3 } };
	for (int i = 0; i < 3; i++) {
		double g, cpu, ratio;
		run_kernels(d, h, kb, cs[i].codec, cs[i].bound, iters, &g, &cpu, &ratio);
		printf("  %-9s ratio %6.3f  GPU %7.1f GB/s  C twin (1 core) %6.2f GB/s  (%.0fx)\n", cs[i].name, ratio, g,
		       cpu, g / cpu);
	}
	printf("codec kernels alone, f32, the whole 1 GiB in one call (GB/s of raw input):\n");
	for (int i = 0; i < 3; i++) {
		double c, u;
		run_whole(d, kb, cs[i].codec, cs[i].bound, iters, st, &c, &u);
		printf("  %-9s compress %7.1f GB/s  decompress %7.1f GB/s\n", cs[i].name, c, u);
	}
	free(h);
	CU(cudaFree(d));
}

int main(int argc, char **argv)
{
	struct gpu_args A;
	int rc = gpu_parse(argc, argv, &A);
	if (rc)
		return rc < 0 ? 0 : rc;
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
		fprintf(stderr, "snap_bench_gpu: no usable CUDA device\n");
		return 1;
	}
	struct cudaDeviceProp prop;
	CU(cudaGetDeviceProperties(&prop, 0));
	float *tile = NULL;
	size_t ntile = 0;
	if (A.input && gpu_input(A.input, &tile, &ntile))
		return 1;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snapbench-gpu-%d", (int)getpid());
	find_smp(smp, sizeof(smp));
	cudaStream_t st;
	CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
	printf("GPU snapshot benchmark on %s, %s, median of %d; GB/s are raw bytes per second\n", prop.name,
	       A.input ? A.input : "ramp data", A.iters);
	printf("%8s | %9s %9s %7s | %7s %7s | %7s | %7s %7s | %s\n", "size", "save blk", "commit", "GB/s",
	       "pinned", "GB/s", "ratio", "pageabl", "GB/s", "codec: commit s, GB/s, stall ms");
	char *list = strdup(A.sizes), *save = NULL;
	for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
		if (gpu_size_row(store, tok, tile, ntile, A.iters, st))
			break;
	free(list);
	gpu_kernels(tile, ntile, A.iters, st);
	free(tile);
	return 0;
}
