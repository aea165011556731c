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
#include "cliopts.h"
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

struct ec_args {
	int k, m, reps, json;
	uint64_t size, chunk;
	const char *fresh_dir;   /* --dir */
};

static int chunk_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	if (cli_size(c, opt, v, SNAP_EC_MIN_CHUNK, SNAP_EC_MAX_CHUNK, "64 bytes to 256M", dst))
		return -1;
	if (*(uint64_t *)dst % 64) {
		cli_error(c, "%s %s: expected a multiple of 64 bytes", opt, v);
		return -1;
	}
	return 0;
}

/* SB_OK with a filled, -1 after --help, SB_USAGE. */
static int ec_parse(int argc, char **argv, struct ec_args *a)
{
	*a = (struct ec_args){ .k = 4, .m = 2, .reps = 5, .size = 16ull << 20, .fresh_dir = "/dev/shm" };
	const struct cli_opt opts[] = {
		CLI_OPT_HELP,
		CLI_OPT_FLAG("json", 0, &a->json),
		CLI_OPT_INT("k", 0, &a->k, 1, SNAP_EC_MAX_GROUP - 1),
		CLI_OPT_INT("m", 0, &a->m, 1, SNAP_EC_MAX_GROUP - 1),
		CLI_OPT_SIZE("size", 0, &a->size, 1, 1ull << 34, "1 byte to 16G"),
		CLI_OPT_CALL("chunk", 0, &a->chunk, chunk_opt),
		CLI_OPT_INT("reps", 0, &a->reps, 1, 1000),
		CLI_OPT_STR("dir", 0, &a->fresh_dir),
	};
	const struct cli c = BENCH_CLI("ec", usage, 1);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	if (a->k + a->m > SNAP_EC_MAX_GROUP) {
		cli_error(&c, "--k %d --m %d: a group has at most %d nodes", a->k, a->m, SNAP_EC_MAX_GROUP);
		return SB_USAGE;
	}
	return SB_OK;
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

/* The group's data and parity in this process: node j's data zero padded
 * to k whole segments for the raw calls, its parity, and raw ISA-L's. */
struct ec_set {
	int k, m, n;
	uint64_t seg, size;
	uint8_t **data, **par, **out, *gen, *tbls;
	uint64_t *len;
};

static void ec_set_free(struct ec_set *e)
{
	if (e->data)
		for (int j = 0; j < e->n; j++)
			free(e->data[j]);
	if (e->par)
		for (int j = 0; j < e->n; j++)
			free(e->par[j]);
	if (e->out)
		for (int i = 0; i < e->n * e->m; i++)
			free(e->out[i]);
	free(e->data); free(e->par); free(e->out); free(e->gen); free(e->tbls); free(e->len);
}

static int ec_set_alloc(struct ec_set *e, const struct ec_args *a)
{
	int k = a->k, m = a->m, n = k + m;
	*e = (struct ec_set){ .k = k, .m = m, .n = n, .size = a->size, .seg = snap_ec_seg_len(k, a->size) };
	uint64_t span = (uint64_t)k * e->seg;
	e->data = calloc((size_t)n, sizeof(*e->data));
	e->par = calloc((size_t)n, sizeof(*e->par));
	e->out = calloc((size_t)n * m, sizeof(*e->out));
	e->gen = malloc((size_t)n * k);
	e->tbls = malloc((size_t)32 * k * m);
	e->len = calloc((size_t)n, sizeof(*e->len));
	if (!e->data || !e->par || !e->out || !e->gen || !e->tbls || !e->len)
		return -1;
	uint64_t x = 0x2545F4914F6CDD1Dull;
	for (int j = 0; j < n; j++) {
		e->data[j] = calloc(1, span);
		e->par[j] = malloc((size_t)m * e->seg);
		e->len[j] = a->size;
		if (!e->data[j] || !e->par[j])
			return -1;
		for (uint64_t b = 0; b < a->size; b++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			e->data[j][b] = (uint8_t)x;
		}
		memset(e->par[j], 0, (size_t)m * e->seg); /* touch pages before timing */
	}
	for (int i = 0; i < n * m; i++)
		if (!(e->out[i] = calloc(1, e->seg)))
			return -1;
	gf_gen_cauchy1_matrix(e->gen, n, k);
	ec_init_tables(k, m, e->gen + (size_t)k * k, e->tbls);
	return 0;
}

/* (a) raw ISA-L: n stripes, all m rows at once, whole segments; best seconds. */
static double ec_raw_encode(const struct ec_set *e, int reps)
{
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		double t0 = bench_mono();
		for (int s = 0; s < e->n; s++) {
			unsigned char *src[SNAP_EC_MAX_GROUP];
			for (int t = 0; t < e->k; t++)
				src[t] = e->data[(s + e->m + t) % e->n] + (uint64_t)t * e->seg;
			ec_encode_data((int)e->seg, e->k, e->m, e->tbls, src, e->out + (size_t)s * e->m);
		}
		double t = bench_mono() - t0;
		best = t < best ? t : best;
	}
	return best;
}

/* (b) our kernel, same data; then both must agree before either figure
 * means anything. Best seconds, or a negative value after a message. */
static double ec_kernel_encode(const struct ec_set *e, uint64_t chunk, int reps)
{
	double best = 1e30;
	char err[256];
	for (int r = 0; r < reps; r++) {
		double t0 = bench_mono();
		if (snap_ec_encode_group_local(e->k, e->m, (uint32_t)chunk, (const void *const *)e->data, e->len,
					       (void *const *)e->par, err, sizeof(err))) {
			fprintf(stderr, "snapbench ec: %s\n", err);
			return -1;
		}
		double t = bench_mono() - t0;
		best = t < best ? t : best;
	}
	for (int s = 0; s < e->n; s++)
		for (int p = 0; p < e->m; p++)
			if (memcmp(e->out[(size_t)s * e->m + p], e->par[(s + p) % e->n] + (uint64_t)p * e->seg, e->seg)) {
				fprintf(stderr, "snapbench ec: kernel parity differs from raw ISA-L (stripe %d row %d)\n", s, p);
				return -1;
			}
	return best;
}

/* Stripe s of (e'): its survivors as sources, its erased slots; how many erased. */
static int ec_stripe_loss(const struct ec_set *e, int s, unsigned char **src, int *surv, int *er)
{
	int ns = 0, ne = 0;
	for (int slot = 0; slot < e->n; slot++) {
		int node = slot < e->k ? (s + e->m + slot) % e->n : (s + slot - e->k) % e->n;
		if (node < e->m)
			er[ne++] = slot;
		else if (ns < e->k) {
			src[ns] = slot < e->k ? e->data[node] + (uint64_t)slot * e->seg
					      : e->par[node] + (uint64_t)(slot - e->k) * e->seg;
			surv[ns++] = slot;
		}
	}
	return ne;
}

/* (e') raw decode: members 0..m-1 lost, every stripe repaired from k survivors; best seconds. */
static double ec_raw_decode(const struct ec_set *e, int reps)
{
	double best = 1e30;
	uint8_t *rows = malloc((size_t)e->n * e->k), *dtbl = malloc((size_t)32 * e->k * e->n);
	uint8_t **dout = calloc((size_t)e->n, sizeof(*dout));
	int ok = rows && dtbl && dout;
	for (int i = 0; ok && i < e->n; i++)
		ok = (dout[i] = calloc(1, e->seg)) != NULL;
	for (int r = 0; ok && r < reps; r++) {
		double t0 = bench_mono();
		for (int s = 0; s < e->n; s++) {
			int surv[SNAP_EC_MAX_GROUP], er[SNAP_EC_MAX_GROUP];
			unsigned char *src[SNAP_EC_MAX_GROUP];
			int ne = ec_stripe_loss(e, s, src, surv, er);
			if (!ne)
				continue;
			decode_rows(e->gen, e->k, surv, er, ne, rows);
			ec_init_tables(e->k, ne, rows, dtbl);
			ec_encode_data((int)e->seg, e->k, ne, dtbl, src, dout);
		}
		double t = bench_mono() - t0;
		best = t < best ? t : best;
	}
	if (dout)
		for (int i = 0; i < e->n; i++)
			free(dout[i]);
	free(dout);
	free(rows);
	free(dtbl);
	return best;
}

/* (c)-(e) over MPI: the helper's JSON line into out, or NULL after a message. */
static const char *ec_mpi(const struct ec_args *a, uint64_t chunk, char *out, size_t cap)
{
	char helper[PATH_MAX], a_np[16], a_k[16], a_m[16], a_size[32], a_chunk[32], a_reps[16];
	if (find_helper(helper, sizeof(helper))) {
		fprintf(stderr, "snapbench ec: MPI helper snap_ec_bench not found beside snapbench (../ec/, ./, "
			SNAP_BENCH_LIBEXEC "/) nor at $SNAP_EC_BENCH_HELPER\n");
		return NULL;
	}
	const char *mpiexec = getenv("MPIEXEC");
	if (!mpiexec || !*mpiexec)
		mpiexec = "mpiexec";
	if (geteuid() == 0) {
		setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
		setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
	}
	snprintf(a_np, sizeof(a_np), "%d", a->k + a->m);
	snprintf(a_k, sizeof(a_k), "%d", a->k);
	snprintf(a_m, sizeof(a_m), "%d", a->m);
	snprintf(a_size, sizeof(a_size), "%" PRIu64, a->size);
	snprintf(a_chunk, sizeof(a_chunk), "%" PRIu64, chunk);
	snprintf(a_reps, sizeof(a_reps), "%d", a->reps);
	char *const av[] = { (char *)mpiexec, "-np", a_np, "--oversubscribe", helper, "--k", a_k, "--m", a_m,
			     "--size", a_size, "--chunk", a_chunk, "--reps", a_reps, "--fresh-dir", (char *)a->fresh_dir,
			     NULL };
	int st = bench_run_capture(av, out, cap);
	const char *line = strchr(out, '{');
	if (st != 0 || !line || !strstr(line, "\"verified\":true")) {
		fprintf(stderr, "snapbench ec: MPI helper failed (exit %d): %s\n", st, out);
		return NULL;
	}
	return line;
}

/* What the run measured, as printed. */
struct ec_figures {
	uint64_t chunk;
	double prot, raw_enc, kern, raw_dec, move, mesh, reb, alt;
	double cores, move_s, cpu_move, cpu_enc, cpu_reb, cpu_dec, enc_ceiling, reb_ceiling;
	double fresh, cpu_fresh;   /* the rebuild with the lost members' bytes in fresh files */
};

static void ec_figures(struct ec_figures *f, const char *line, double best_raw, double best_kern, double best_dec)
{
	double prot = f->prot;
	f->raw_enc = prot / best_raw;
	f->kern = prot / best_kern;
	f->raw_dec = prot / best_dec;
	f->move = bench_jnum(line, "mpi_move_gbps");
	f->mesh = bench_jnum(line, "mesh_encode_gbps");
	f->reb = bench_jnum(line, "rebuild_gbps");
	f->alt = bench_jnum(line, "alt_reduce_scatter_gbps");
	/* CPU per GB of protected data, and the ceiling it sets on this host. */
	f->cores = bench_cores();
	f->move_s = bench_jnum(line, "mpi_move_s");
	f->cpu_move = bench_jnum(line, "mpi_move_cpu_s") / prot;
	f->cpu_enc = bench_jnum(line, "mesh_encode_cpu_s") / prot;
	f->cpu_reb = bench_jnum(line, "rebuild_cpu_s") / prot;
	f->cpu_dec = best_dec / prot;
	f->enc_ceiling = bench_cpu_ceiling(f->cores, f->cpu_enc, f->move);
	f->reb_ceiling = bench_cpu_ceiling(f->cores, f->cpu_reb, f->raw_dec);
	f->fresh = bench_jnum(line, "rebuild_fresh_gbps");
	f->cpu_fresh = bench_jnum(line, "rebuild_fresh_cpu_s") / prot;
}

static void ec_print_json(const struct ec_args *a, const struct ec_figures *f)
{
	printf("{\"k\":%d,\"m\":%d,\"nodes\":%d,\"size\":%" PRIu64 ",\"chunk\":%" PRIu64 ",\"reps\":%d,"
	       "\"raw_encode_gbps\":%.3f,\"kernel_encode_gbps\":%.3f,\"mpi_move_gbps\":%.3f,"
	       "\"mesh_encode_gbps\":%.3f,\"raw_decode_gbps\":%.3f,\"rebuild_gbps\":%.3f,"
	       "\"alt_reduce_scatter_gbps\":%.3f,\"kernel_vs_raw\":%.3f,\"mesh_vs_move\":%.3f,"
	       "\"cores\":%.0f,\"mpi_move_cpu_s_per_gb\":%.4f,\"mpi_move_cores_busy\":%.2f,"
	       "\"mesh_encode_cpu_s_per_gb\":%.4f,\"rebuild_cpu_s_per_gb\":%.4f,\"raw_decode_cpu_s_per_gb\":%.4f,"
	       "\"mesh_vs_move_cpu_ceiling\":%.3f,\"rebuild_vs_decode_cpu_ceiling\":%.3f,"
	       "\"rebuild_fresh_gbps\":%.3f,\"rebuild_fresh_cpu_s_per_gb\":%.4f}\n",
	       a->k, a->m, a->k + a->m, a->size, f->chunk, a->reps, f->raw_enc, f->kern, f->move, f->mesh, f->raw_dec,
	       f->reb, f->alt, f->kern / f->raw_enc, f->mesh / f->move, f->cores, f->cpu_move,
	       f->cpu_move * f->prot / f->move_s, f->cpu_enc, f->cpu_reb, f->cpu_dec, f->enc_ceiling, f->reb_ceiling,
	       f->fresh, f->cpu_fresh);
}

static void ec_print_text(const struct ec_args *a, const struct ec_figures *f)
{
	printf("ec bench: %d+%d, %d simulated nodes (MPI ranks on this host), %" PRIu64 " bytes/node, "
	       "chunk %" PRIu64 ", best of %d\n", a->k, a->m, a->k + a->m, a->size, f->chunk, a->reps);
	printf("  %-26s %9s  %s\n", "figure", "GB/s", "(GB of protected data per second)");
	printf("  %-26s %9.3f  ISA-L ec_encode_data, 1 process, whole segments\n", "raw_encode_gbps", f->raw_enc);
	printf("  %-26s %9.3f  ec/ kernel, 1 process (%.0f%% of raw)\n", "kernel_encode_gbps", f->kern,
	       100 * f->kern / f->raw_enc);
	printf("  %-26s %9.3f  MPI alone, same traffic pattern\n", "mpi_move_gbps", f->move);
	printf("  %-26s %9.3f  end-to-end protect (%.0f%% of MPI move)\n", "mesh_encode_gbps", f->mesh,
	       100 * f->mesh / f->move);
	printf("  %-26s %9.3f  ISA-L decode, %d members lost, 1 process\n", "raw_decode_gbps", f->raw_dec, a->m);
	printf("  %-26s %9.3f  rebuild of %d lost members over MPI, verified\n", "rebuild_gbps", f->reb, a->m);
	printf("  %-26s %9.3f  the same, lost members' bytes in fresh %s files\n", "rebuild_fresh_gbps", f->fresh,
	       a->fresh_dir);
	printf("  %-26s %9.3f  alternative: partial products + MPI_Reduce_scatter\n", "alt_reduce_scatter_gbps",
	       f->alt);
	printf("  CPU seconds per GB of protected data, all ranks (%.0f cores here):\n", f->cores);
	printf("  %-26s %9.4f  %.2f cores busy while MPI moves\n", "mpi_move_cpu", f->cpu_move,
	       f->cpu_move * f->prot / f->move_s);
	printf("  %-26s %9.4f  ceiling on this host: %.2f of MPI move (cores / CPU per GB)\n", "mesh_encode_cpu",
	       f->cpu_enc, f->enc_ceiling);
	printf("  %-26s %9.4f  ceiling on this host: %.2f of raw decode\n", "rebuild_cpu", f->cpu_reb,
	       f->reb_ceiling);
	printf("  %-26s %9.4f  lost members' bytes in fresh %s files\n", "rebuild_fresh_cpu", f->cpu_fresh,
	       a->fresh_dir);
	printf("  %-26s %9.4f  1 process\n", "raw_decode_cpu", f->cpu_dec);
}

/* The in-process figures, then MPI's; 0, or -1 after a message. */
static int ec_run(const struct ec_args *a, struct ec_figures *f)
{
	struct ec_set e;
	int rc = -1;
	if (ec_set_alloc(&e, a))
		goto done;
	double best_raw = ec_raw_encode(&e, a->reps), best_kern = ec_kernel_encode(&e, a->chunk, a->reps);
	if (best_kern < 0)
		goto done;
	double best_dec = ec_raw_decode(&e, a->reps);
	static char outbuf[1 << 16];
	f->chunk = a->chunk ? a->chunk : SNAP_EC_DEFAULT_CHUNK;
	const char *line = ec_mpi(a, f->chunk, outbuf, sizeof(outbuf));
	if (!line)
		goto done;
	f->prot = (double)e.n * (double)a->size / 1e9;
	ec_figures(f, line, best_raw, best_kern, best_dec);
	rc = 0;
done:
	ec_set_free(&e);
	return rc;
}

int cmd_bench_ec(int argc, char **argv)
{
	struct ec_args a;
	struct ec_figures f;
	int rc = ec_parse(argc, argv, &a);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	if (ec_run(&a, &f))
		return SB_FAIL;
	if (a.json)
		ec_print_json(&a, &f);
	else
		ec_print_text(&a, &f);
	return SB_OK;
}
