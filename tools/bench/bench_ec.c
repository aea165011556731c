/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_ec.c - `snapbench ec`: erasure-coding throughput on one data set.
 *
 *   snapbench ec [--k K] [--m M] [--size BYTES] [--chunk BYTES] [--reps R] [--dir D] [--json]
 *
 * In this process: (a) raw ISA-L encode of the group's n = K+M stripes with
 * whole segments, (b) our encode kernel (snap_ec_encode_group_local: the
 * same per-unit code the mesh runs), (e') raw ISA-L decode with members
 * 0..M-1 lost. Then it launches `mpiexec -np K+M --oversubscribe
 * snap_ec_bench` (the MPI helper built in ec/) for (c) MPI moving the encode
 * traffic alone, (d) end-to-end protect, (e) rebuild of M lost members, and
 * reads one JSON line from its rank 0. Every figure is GB (1e9 bytes) of
 * protected data (n * size) per second, best of R runs.
 *
 * Helper lookup: $SNAP_EC_BENCH_HELPER, else next to snapbench's build tree
 * (<dir of snapbench>/../ec/snap_ec_bench, <dir>/snap_ec_bench), else where
 * it is installed (<dir>/../libexec/libsnap/snap_ec_bench). mpiexec is
 * $MPIEXEC or `mpiexec` in PATH; when run as root the Open MPI root
 * overrides are set for the child.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

#include "snap/base.h"
#include "snap/ec.h"
#include "bench_opts.h"
#include "bench_proc.h"
#include "bench_util.h"
#include "snapbench.h"

/* Where snap_ec_bench is installed, from snapbench's directory (CMake sets it). */
#ifndef SNAP_BENCH_LIBEXEC
#define SNAP_BENCH_LIBEXEC "../libexec/libsnap"
#endif

static void usage(FILE *f)
{
	fprintf(f, "usage: snapbench ec [--k K] [--m M] [--size BYTES] [--chunk BYTES] [--reps R] [--dir D] [--json]\n"
		   "  --size   data bytes per simulated node (default 16 MiB)\n"
		   "  --chunk  CRC/pipeline chunk (default: library default)\n"
		   "  --dir    where the rebuild into fresh memory creates the lost members' files\n"
		   "           (default /dev/shm: the memory a relaunched node store allocates)\n"
		   "  Runs K+M MPI ranks on this host via mpiexec (see ec/README.md); prints the CPU seconds\n"
		   "  per GB the ranks spent and the ceiling they set (cores / CPU seconds per GB).\n");
}

static int find_helper(char *out, size_t len)
{
	const char *env = getenv("SNAP_EC_BENCH_HELPER");
	if (env && *env) {
		snprintf(out, len, "%s", env);
		return access(out, X_OK) == 0 ? 0 : -1;
	}
	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	if (n <= 0)
		return -1;
	exe[n] = 0;
	char *slash = strrchr(exe, '/');
	if (!slash)
		return -1;
	*slash = 0;
	static const char *const rel[] = { "/../ec/snap_ec_bench", "/ec/snap_ec_bench", "/snap_ec_bench",
					   "/" SNAP_BENCH_LIBEXEC "/snap_ec_bench" };
	for (size_t i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
		size_t a = strlen(exe), b = strlen(rel[i]);
		if (a + b + 1 > len)
			continue;
		memcpy(out, exe, a);
		memcpy(out + a, rel[i], b + 1);
		if (access(out, X_OK) == 0)
			return 0;
	}
	return -1;
}

/* Decode rows for the erased slots of one stripe (survivors surv[0..k)). */
static int decode_rows(const uint8_t *gen, int k, const int *surv, const int *erased, int ne,
		       uint8_t *rows)
{
	uint8_t b[SNAP_EC_MAX_GROUP * SNAP_EC_MAX_GROUP], inv[SNAP_EC_MAX_GROUP * SNAP_EC_MAX_GROUP];
	for (int i = 0; i < k; i++)
		memcpy(b + (size_t)i * k, gen + (size_t)surv[i] * k, (size_t)k);
	if (gf_invert_matrix(b, inv, k))
		return -1;
	for (int e = 0; e < ne; e++)
		for (int j = 0; j < k; j++) {
			uint8_t acc = 0;
			for (int i = 0; i < k; i++)
				acc ^= gf_mul(gen[(size_t)erased[e] * k + i], inv[(size_t)i * k + j]);
			rows[(size_t)e * k + j] = acc;
		}
	return 0;
}

int cmd_bench_ec(int argc, char **argv)
{
	int k = 4, m = 2, reps = 5, json = 0;
	uint64_t size = 16ull << 20, chunk = 0;
	const char *fresh_dir = "/dev/shm";
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		int bad = 0;
		if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
			usage(stdout);
			return SB_OK;
		} else if (!strcmp(a, "--json")) {
			json = 1;
		} else if (v && !strcmp(a, "--k")) {
			bad = bench_opt_int("ec", a, v, 1, SNAP_EC_MAX_GROUP - 1, &k), i++;
		} else if (v && !strcmp(a, "--m")) {
			bad = bench_opt_int("ec", a, v, 1, SNAP_EC_MAX_GROUP - 1, &m), i++;
		} else if (v && !strcmp(a, "--size")) {
			bad = bench_opt_size("ec", a, v, 1, 1ull << 34, "1 byte to 16G", &size), i++;
		} else if (v && !strcmp(a, "--chunk")) {
			bad = bench_opt_size("ec", a, v, SNAP_EC_MIN_CHUNK, SNAP_EC_MAX_CHUNK, "64 bytes to 256M", &chunk), i++;
			if (!bad && chunk % 64) {
				fprintf(stderr, "snapbench ec: --chunk %s: expected a multiple of 64 bytes\n", v);
				bad = 1;
			}
		} else if (v && !strcmp(a, "--reps")) {
			bad = bench_opt_int("ec", a, v, 1, 1000, &reps), i++;
		} else if (v && !strcmp(a, "--dir")) {
			fresh_dir = v;
			i++;
		} else {
			fprintf(stderr, "snapbench ec: unknown or incomplete option '%s'\n", a);
			bad = 1;
		}
		if (bad) {
			usage(stderr);
			return SB_USAGE;
		}
	}
	if (k + m > SNAP_EC_MAX_GROUP) {
		fprintf(stderr, "snapbench ec: --k %d --m %d: a group has at most %d nodes\n", k, m, SNAP_EC_MAX_GROUP);
		return SB_USAGE;
	}
	int n = k + m;
	uint64_t seg = snap_ec_seg_len(k, size), span = (uint64_t)k * seg;
	/* node j's data, zero padded to k whole segments for the raw calls */
	uint8_t **data = calloc((size_t)n, sizeof(*data)), **par = calloc((size_t)n, sizeof(*par));
	uint8_t **out = calloc((size_t)n * m, sizeof(*out));
	uint8_t *gen = malloc((size_t)n * k), *tbls = malloc((size_t)32 * k * m);
	uint64_t *len = calloc((size_t)n, sizeof(*len));
	int rc = SB_FAIL;
	if (!data || !par || !out || !gen || !tbls || !len)
		goto done;
	uint64_t x = 0x2545F4914F6CDD1Dull;
	for (int j = 0; j < n; j++) {
		data[j] = calloc(1, span);
		par[j] = malloc((size_t)m * seg);
		len[j] = size;
		if (!data[j] || !par[j])
			goto done;
		for (uint64_t b = 0; b < size; b++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			data[j][b] = (uint8_t)x;
		}
		memset(par[j], 0, (size_t)m * seg); /* touch pages before timing */
	}
	for (int i = 0; i < n * m; i++)
		if (!(out[i] = calloc(1, seg)))
			goto done;
	gf_gen_cauchy1_matrix(gen, n, k);
	ec_init_tables(k, m, gen + (size_t)k * k, tbls);
	double prot = (double)n * (double)size / 1e9;

	/* (a) raw ISA-L: n stripes, all m rows at once, whole segments */
	double best_raw = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = bench_mono();
		for (int s = 0; s < n; s++) {
			unsigned char *src[SNAP_EC_MAX_GROUP];
			for (int t = 0; t < k; t++)
				src[t] = data[(s + m + t) % n] + (uint64_t)t * seg;
			ec_encode_data((int)seg, k, m, tbls, src, out + (size_t)s * m);
		}
		double t = bench_mono() - t0;
		best_raw = t < best_raw ? t : best_raw;
	}
	/* (b) our kernel, same data */
	double best_kern = 1e30;
	char err[256];
	for (int r = 0; r < reps; r++) {
		double t0 = bench_mono();
		if (snap_ec_encode_group_local(k, m, (uint32_t)chunk, (const void *const *)data, len,
					       (void *const *)par, err, sizeof(err))) {
			fprintf(stderr, "snapbench ec: %s\n", err);
			goto done;
		}
		double t = bench_mono() - t0;
		best_kern = t < best_kern ? t : best_kern;
	}
	/* both must agree before either figure means anything */
	for (int s = 0; s < n; s++)
		for (int p = 0; p < m; p++)
			if (memcmp(out[(size_t)s * m + p], par[(s + p) % n] + (uint64_t)p * seg, seg)) {
				fprintf(stderr, "snapbench ec: kernel parity differs from raw ISA-L (stripe %d row %d)\n", s, p);
				goto done;
			}
	/* (e') raw decode: members 0..m-1 lost, every stripe repaired from k survivors */
	double best_dec = 1e30;
	uint8_t *rows = malloc((size_t)n * k), *dtbl = malloc((size_t)32 * k * n);
	uint8_t **dout = calloc((size_t)n, sizeof(*dout));
	int dec_ok = rows && dtbl && dout;
	for (int i = 0; dec_ok && i < n; i++)
		dec_ok = (dout[i] = calloc(1, seg)) != NULL;
	for (int r = 0; dec_ok && r < reps; r++) {
		double t0 = bench_mono();
		for (int s = 0; s < n; s++) {
			int surv[SNAP_EC_MAX_GROUP], er[SNAP_EC_MAX_GROUP], ns = 0, ne = 0;
			unsigned char *src[SNAP_EC_MAX_GROUP];
			for (int slot = 0; slot < n; slot++) {
				int node = slot < k ? (s + m + slot) % n : (s + slot - k) % n;
				if (node < m)
					er[ne++] = slot;
				else if (ns < k) {
					src[ns] = slot < k ? data[node] + (uint64_t)slot * seg
							   : par[node] + (uint64_t)(slot - k) * seg;
					surv[ns++] = slot;
				}
			}
			if (!ne)
				continue;
			decode_rows(gen, k, surv, er, ne, rows);
			ec_init_tables(k, ne, rows, dtbl);
			ec_encode_data((int)seg, k, ne, dtbl, src, dout);
		}
		double t = bench_mono() - t0;
		best_dec = t < best_dec ? t : best_dec;
	}
	if (dout)
		for (int i = 0; i < n; i++)
			free(dout[i]);
	free(dout);
	free(rows);
	free(dtbl);

	/* (c)-(e) over MPI */
	char helper[PATH_MAX], a_np[16], a_k[16], a_m[16], a_size[32], a_chunk[32], a_reps[16];
	if (find_helper(helper, sizeof(helper))) {
		fprintf(stderr, "snapbench ec: MPI helper snap_ec_bench not found beside snapbench (../ec/, ./, "
			SNAP_BENCH_LIBEXEC "/) nor at $SNAP_EC_BENCH_HELPER\n");
		goto done;
	}
	const char *mpiexec = getenv("MPIEXEC");
	if (!mpiexec || !*mpiexec)
		mpiexec = "mpiexec";
	if (geteuid() == 0) {
		setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
		setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
	}
	snprintf(a_np, sizeof(a_np), "%d", n);
	snprintf(a_k, sizeof(a_k), "%d", k);
	snprintf(a_m, sizeof(a_m), "%d", m);
	snprintf(a_size, sizeof(a_size), "%" PRIu64, size);
	uint64_t ch = chunk ? chunk : SNAP_EC_DEFAULT_CHUNK;
	snprintf(a_chunk, sizeof(a_chunk), "%" PRIu64, ch);
	snprintf(a_reps, sizeof(a_reps), "%d", reps);
	char *const av[] = { (char *)mpiexec, "-np", a_np, "--oversubscribe", helper, "--k", a_k, "--m", a_m,
			     "--size", a_size, "--chunk", a_chunk, "--reps", a_reps, "--fresh-dir", (char *)fresh_dir,
			     NULL };
	static char outbuf[1 << 16];
	int st = bench_run_capture(av, outbuf, sizeof(outbuf));
	const char *line = strchr(outbuf, '{');
	if (st != 0 || !line || !strstr(line, "\"verified\":true")) {
		fprintf(stderr, "snapbench ec: MPI helper failed (exit %d): %s\n", st, outbuf);
		goto done;
	}
	double raw_enc = prot / best_raw, kern = prot / best_kern, raw_dec = prot / best_dec;
	double move = bench_jnum(line, "mpi_move_gbps"), mesh = bench_jnum(line, "mesh_encode_gbps");
	double reb = bench_jnum(line, "rebuild_gbps"), alt = bench_jnum(line, "alt_reduce_scatter_gbps");
	/* CPU per GB of protected data, and the ceiling it sets on this host. */
	double cores = bench_cores();
	double move_s = bench_jnum(line, "mpi_move_s"), cpu_move = bench_jnum(line, "mpi_move_cpu_s") / prot;
	double cpu_enc = bench_jnum(line, "mesh_encode_cpu_s") / prot, cpu_reb = bench_jnum(line, "rebuild_cpu_s") / prot;
	double cpu_dec = best_dec / prot;
	double cpu_fresh = bench_jnum(line, "rebuild_fresh_cpu_s") / prot, fresh = bench_jnum(line, "rebuild_fresh_gbps");
	double enc_ceiling = bench_cpu_ceiling(cores, cpu_enc, move);
	double reb_ceiling = bench_cpu_ceiling(cores, cpu_reb, raw_dec);
	if (json) {
		printf("{\"k\":%d,\"m\":%d,\"nodes\":%d,\"size\":%" PRIu64 ",\"chunk\":%" PRIu64 ",\"reps\":%d,"
		       "\"raw_encode_gbps\":%.3f,\"kernel_encode_gbps\":%.3f,\"mpi_move_gbps\":%.3f,"
		       "\"mesh_encode_gbps\":%.3f,\"raw_decode_gbps\":%.3f,\"rebuild_gbps\":%.3f,"
		       "\"alt_reduce_scatter_gbps\":%.3f,\"kernel_vs_raw\":%.3f,\"mesh_vs_move\":%.3f,"
		       "\"cores\":%.0f,\"mpi_move_cpu_s_per_gb\":%.4f,\"mpi_move_cores_busy\":%.2f,"
		       "\"mesh_encode_cpu_s_per_gb\":%.4f,\"rebuild_cpu_s_per_gb\":%.4f,\"raw_decode_cpu_s_per_gb\":%.4f,"
		       "\"mesh_vs_move_cpu_ceiling\":%.3f,\"rebuild_vs_decode_cpu_ceiling\":%.3f,"
		       "\"rebuild_fresh_gbps\":%.3f,\"rebuild_fresh_cpu_s_per_gb\":%.4f}\n",
		       k, m, n, size, ch, reps, raw_enc, kern, move, mesh, raw_dec, reb, alt, kern / raw_enc,
		       mesh / move, cores, cpu_move, cpu_move * prot / move_s, cpu_enc, cpu_reb, cpu_dec, enc_ceiling,
		       reb_ceiling, fresh, cpu_fresh);
	} else {
		printf("ec bench: %d+%d, %d simulated nodes (MPI ranks on this host), %" PRIu64 " bytes/node, "
		       "chunk %" PRIu64 ", best of %d\n", k, m, n, size, ch, reps);
		printf("  %-26s %9s  %s\n", "figure", "GB/s", "(GB of protected data per second)");
		printf("  %-26s %9.3f  ISA-L ec_encode_data, 1 process, whole segments\n", "raw_encode_gbps", raw_enc);
		printf("  %-26s %9.3f  ec/ kernel, 1 process (%.0f%% of raw)\n", "kernel_encode_gbps", kern,
		       100 * kern / raw_enc);
		printf("  %-26s %9.3f  MPI alone, same traffic pattern\n", "mpi_move_gbps", move);
		printf("  %-26s %9.3f  end-to-end protect (%.0f%% of MPI move)\n", "mesh_encode_gbps", mesh,
		       100 * mesh / move);
		printf("  %-26s %9.3f  ISA-L decode, %d members lost, 1 process\n", "raw_decode_gbps", raw_dec, m);
		printf("  %-26s %9.3f  rebuild of %d lost members over MPI, verified\n", "rebuild_gbps", reb, m);
		printf("  %-26s %9.3f  the same, lost members' bytes in fresh %s files\n", "rebuild_fresh_gbps", fresh,
		       fresh_dir);
		printf("  %-26s %9.3f  alternative: partial products + MPI_Reduce_scatter\n",
		       "alt_reduce_scatter_gbps", alt);
		printf("  CPU seconds per GB of protected data, all ranks (%.0f cores here):\n", cores);
		printf("  %-26s %9.4f  %.2f cores busy while MPI moves\n", "mpi_move_cpu", cpu_move,
		       cpu_move * prot / move_s);
		printf("  %-26s %9.4f  ceiling on this host: %.2f of MPI move (cores / CPU per GB)\n",
		       "mesh_encode_cpu", cpu_enc, enc_ceiling);
		printf("  %-26s %9.4f  ceiling on this host: %.2f of raw decode\n", "rebuild_cpu", cpu_reb,
		       reb_ceiling);
		printf("  %-26s %9.4f  lost members' bytes in fresh %s files\n", "rebuild_fresh_cpu", cpu_fresh,
		       fresh_dir);
		printf("  %-26s %9.4f  1 process\n", "raw_decode_cpu", cpu_dec);
	}
	rc = SB_OK;
done:
	if (data)
		for (int j = 0; j < n; j++)
			free(data[j]);
	if (par)
		for (int j = 0; j < n; j++)
			free(par[j]);
	if (out)
		for (int i = 0; i < n * m; i++)
			free(out[i]);
	free(data); free(par); free(out); free(gen); free(tbls); free(len);
	return rc;
}
