/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap_ec_bench.c - MPI side of `snaptool bench ec`. Run as one group of
 * k + m ranks (simulated nodes); rank 0 prints one JSON line.
 *
 *   mpiexec -np K+M snap_ec_bench --k K --m M --size BYTES [--chunk C] [--reps R]
 *
 * Measures, on the same data, best of R runs, in GB of protected data (the
 * group's n * size bytes) per second:
 *   mpi_move_gbps        the encode traffic alone, same pattern: per unit k
 *                        data pieces to the decoder, m - 1 rows onward
 *   alt_ship_all_move_gbps  MPI alone for the first design (every parity
 *                        holder gathers the k pieces: k * m transfers)
 *   mesh_encode_gbps     snap_ec_encode_begin + run (end-to-end protect)
 *   rebuild_gbps         snap_ec_rebuild_begin + run with members 0..m-1 lost
 *   rebuild_fresh_*      the same rebuild with the lost members' data and
 *                        parity in files created fresh each run in
 *                        --fresh-dir (default /dev/shm) and mapped shared:
 *                        a relaunched node has to allocate that memory, so
 *                        this is what the library costs over the bytes
 *                        snapsmp's rebuild writes (page allocation included)
 *   alt_reduce_scatter_gbps  the design alternative: partial products (ISA-L)
 *                        XOR-reduced with MPI_Reduce_scatter_block per chunk
 * and the CPU seconds all ranks together spent on the move, the protect and
 * the rebuild (the least of the R runs; *_cpu_s),
 * and checks that the rebuilt bytes are bit-exact and that the alternative's
 * parity equals the library's ("verified").
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <isa-l/erasure_code.h>

#include "snap/ec.h"

static int me, n, k, m;
static uint64_t size, seg;
static uint32_t chunk = SNAP_EC_DEFAULT_CHUNK, window;

static double now(void) { return MPI_Wtime(); }

/* CPU seconds this process has used, every thread (MPI's included). */
static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU seconds the whole group used since c0 (each rank's own c0). On one
 * host the ranks share its cores, so the group cannot go faster than its
 * CPU seconds over the cores: where the "link" is a memcpy by the kernel
 * (CMA), moving bytes and coding them compete for the same cores. */
static double cpu_span(double c0)
{
	double c = cpu_now() - c0, sum;
	MPI_Allreduce(&c, &sum, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
	return sum;
}

/* Slowest rank's time: the group is done when its last member is. */
static double span(double t0)
{
	double t = now() - t0, mx;
	MPI_Allreduce(&t, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return mx;
}

/* MPI alone, the engine's traffic: each unit's k data pieces to the holder
 * of parity row 0 (the decoder), which forwards m - 1 rows of chunk size. */
static double move_once(const uint8_t *data, uint8_t *rbuf, uint8_t *par, MPI_Request *req, double *cpu)
{
	struct snap_ec_group g = { .n = n, .k = k, .m = m };
	uint32_t nch = (uint32_t)((seg + chunk - 1) / chunk);
	MPI_Barrier(MPI_COMM_WORLD);
	double c0 = cpu_now(), t0 = now();
	for (uint32_t q = 0; q < nch; q++) {
		uint64_t clen = seg - (uint64_t)q * chunk < chunk ? seg - (uint64_t)q * chunk : chunk;
		int nr = 0, s0 = snap_ec_parity_stripe(&g, me, 0);
		for (int t = 0; t < k; t++) /* I decode stripe s0 */
			MPI_Irecv(rbuf + (size_t)t * chunk, (int)clen, MPI_BYTE,
				  snap_ec_data_holder(&g, s0, t), s0, MPI_COMM_WORLD, &req[nr++]);
		for (int p = 1; p < m; p++) {
			int s = snap_ec_parity_stripe(&g, me, p);
			MPI_Irecv(par + (uint64_t)p * seg + (uint64_t)q * chunk, (int)clen, MPI_BYTE,
				  snap_ec_parity_holder(&g, s, 0), s, MPI_COMM_WORLD, &req[nr++]);
		}
		for (int t = 0; t < k; t++) {
			int s = snap_ec_data_stripe(&g, me, t);
			MPI_Isend(data + (uint64_t)t * seg + (uint64_t)q * chunk, (int)clen, MPI_BYTE,
				  snap_ec_parity_holder(&g, s, 0), s, MPI_COMM_WORLD, &req[nr++]);
		}
		for (int p = 1; p < m; p++)
			MPI_Isend(rbuf + (size_t)(k + p) * chunk, (int)clen, MPI_BYTE,
				  snap_ec_parity_holder(&g, s0, p), s0, MPI_COMM_WORLD, &req[nr++]);
		MPI_Waitall(nr, req, MPI_STATUSES_IGNORE);
	}
	double t = span(t0);
	*cpu = cpu_span(c0);
	return t;
}

/* MPI alone, the first design: every parity holder gathers all k sources
 * itself (k * m transfers per unit instead of k + m - 1). */
static double ship_all_once(const uint8_t *data, uint8_t *rbuf, MPI_Request *req)
{
	struct snap_ec_group g = { .n = n, .k = k, .m = m };
	uint32_t nch = (uint32_t)((seg + chunk - 1) / chunk);
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = now();
	/* one window of n units (a chunk row) at a time, like the engine */
	for (uint32_t q = 0; q < nch; q++) {
		uint64_t clen = seg - (uint64_t)q * chunk < chunk ? seg - (uint64_t)q * chunk : chunk;
		int nr = 0;
		for (int p = 0; p < m; p++) {
			int s = snap_ec_parity_stripe(&g, me, p);
			for (int t = 0; t < k; t++)
				MPI_Irecv(rbuf + ((size_t)p * k + t) * chunk, (int)clen, MPI_BYTE,
					  snap_ec_data_holder(&g, s, t), s, MPI_COMM_WORLD, &req[nr++]);
		}
		for (int t = 0; t < k; t++) {
			int s = snap_ec_data_stripe(&g, me, t);
			for (int p = 0; p < m; p++)
				MPI_Isend(data + (uint64_t)t * seg + (uint64_t)q * chunk, (int)clen, MPI_BYTE,
					  snap_ec_parity_holder(&g, s, p), s, MPI_COMM_WORLD, &req[nr++]);
		}
		MPI_Waitall(nr, req, MPI_STATUSES_IGNORE);
	}
	return span(t0);
}

static void xor_op(void *in, void *inout, int *len, MPI_Datatype *dt)
{
	(void)dt;
	uint8_t *a = in, *b = inout;
	int i = 0;
	for (; i + 8 <= *len; i += 8) {
		uint64_t x, y;
		memcpy(&x, a + i, 8);
		memcpy(&y, b + i, 8);
		y ^= x;
		memcpy(b + i, &y, 8);
	}
	for (; i < *len; i++)
		b[i] ^= a[i];
}

/* Alternative: each node multiplies its own pieces (1 source -> m rows) and
 * the products are XOR-reduced to the holders by MPI_Reduce_scatter_block. */
static double reduce_once(const uint8_t *data, uint8_t *sbuf, uint8_t *rows, uint8_t *parity, MPI_Op op,
			  const uint8_t *gen)
{
	struct snap_ec_group g = { .n = n, .k = k, .m = m };
	uint32_t nch = (uint32_t)((seg + chunk - 1) / chunk);
	uint8_t tbls[SNAP_EC_MAX_GROUP * 32], col[SNAP_EC_MAX_GROUP];
	MPI_Barrier(MPI_COMM_WORLD);
	double t0 = now();
	for (uint32_t q = 0; q < nch; q++) {
		uint64_t clen = seg - (uint64_t)q * chunk < chunk ? seg - (uint64_t)q * chunk : chunk;
		size_t blk = (size_t)m * clen;
		memset(sbuf, 0, blk * (size_t)n);
		for (int t = 0; t < k; t++) {
			int s = snap_ec_data_stripe(&g, me, t);
			unsigned char *dst[SNAP_EC_MAX_GROUP];
			for (int p = 0; p < m; p++) {
				col[p] = gen[(size_t)(k + p) * k + t];
				dst[p] = sbuf + (size_t)snap_ec_parity_holder(&g, s, p) * blk + (size_t)p * clen;
			}
			ec_init_tables(1, m, col, tbls);
			unsigned char *src = (unsigned char *)data + (uint64_t)t * seg + (uint64_t)q * chunk;
			ec_encode_data((int)clen, 1, m, tbls, &src, dst);
		}
		/* my block: row p of this chunk at p * clen -> parity row p, chunk q */
		MPI_Reduce_scatter_block(sbuf, rows, (int)blk, MPI_BYTE, op, MPI_COMM_WORLD);
		for (int p = 0; p < m; p++)
			memcpy(parity + (uint64_t)p * seg + (uint64_t)q * chunk, rows + (size_t)p * clen, clen);
	}
	return span(t0);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &me);
	MPI_Comm_size(MPI_COMM_WORLD, &n);
	int reps = 3;
	const char *fresh_dir = "/dev/shm";
	k = 0;
	m = 0;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--k")) k = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--m")) m = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--size")) size = strtoull(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--chunk")) chunk = (uint32_t)strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--window")) window = (uint32_t)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--fresh-dir")) fresh_dir = argv[i + 1];
	}
	char err[512];
	struct snap_ec_group g;
	MPI_Comm gc;
	if (k + m != n || size == 0 || reps < 1 ||
	    snap_ec_comm_split(MPI_COMM_WORLD, k, m, SNAP_EC_TAIL_STRICT, &g, &gc, err, sizeof(err))) {
		if (me == 0)
			printf("{\"error\":\"need -np K+M, --size > 0 (k=%d m=%d np=%d)\"}\n", k, m, n);
		MPI_Finalize();
		return 1;
	}
	seg = snap_ec_seg_len(k, size);
	/* data: k whole segments (the MPI-only patterns read k * seg bytes),
	 * zero past size like the library's logical padding */
	uint8_t *data = calloc((size_t)k * seg, 1), *copy = malloc(size), *par = malloc((size_t)m * seg);
	uint8_t *par2 = malloc((size_t)m * seg);
	uint8_t *rbuf = malloc((size_t)m * (k + m) * chunk), *sbuf = malloc((size_t)n * m * chunk);
	MPI_Request *req = malloc(sizeof(MPI_Request) * (size_t)(2 * k * m));
	uint64_t x = 0x1234567ull + (uint64_t)me;
	for (uint64_t i = 0; i < size; i++) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		data[i] = (uint8_t)x;
	}
	memset(par, 0, (size_t)m * seg);
	struct snap_ec_opts o = { .chunk_size = chunk, .window = window };
	double best_move = 1e30, best_enc = 1e30, best_reb = 1e30, best_red = 1e30, best_ship = 1e30;
	double cpu_move = 1e30, cpu_enc = 1e30, cpu_reb = 1e30, c;
	int ok = 1;
	struct iovec iov = { data, size };
	uint8_t *blob = NULL;
	size_t blen = 0;
	for (int r = 0; r < reps; r++) {
		double t = move_once(data, rbuf, par2, req, &c);
		best_move = t < best_move ? t : best_move;
		cpu_move = c < cpu_move ? c : cpu_move;
		t = ship_all_once(data, rbuf, req);
		best_ship = t < best_ship ? t : best_ship;
		struct snap_ec_encode *e = NULL;
		MPI_Barrier(MPI_COMM_WORLD);
		double c0 = cpu_now(), t0 = now();
		int rc = snap_ec_encode_begin(gc, &g, 1, size, NULL, 0, &o, &e, err, sizeof(err));
		if (!rc)
			rc = snap_ec_encode_run(e, &iov, 1, par, (uint64_t)m * seg);
		t = span(t0);
		c = cpu_span(c0);
		best_enc = t < best_enc ? t : best_enc;
		cpu_enc = c < cpu_enc ? c : cpu_enc;
		if (rc) {
			ok = 0;
			fprintf(stderr, "encode: %s\n", e ? snap_ec_encode_error(e) : err);
		} else if (!blob) {
			snap_ec_meta_pack(snap_ec_encode_meta(e), NULL, 0, &blen);
			blob = malloc(blen);
			snap_ec_meta_pack(snap_ec_encode_meta(e), blob, blen, &blen);
		}
		snap_ec_encode_free(e);
	}
	/* rebuild members 0..m-1 from scratch, every rep */
	struct snap_ec_meta *mt = NULL;
	if (blob && snap_ec_meta_unpack(blob, blen, &mt, err, sizeof(err)))
		ok = 0;
	for (int r = 0; r < reps && ok; r++) {
		int lost = me < m;
		struct iovec ci = { copy, size };
		memcpy(copy, data, size);
		memcpy(par2, par, (size_t)m * seg);
		if (lost) {
			memset(copy, 0, size);
			memset(par2, 0, (size_t)m * seg);
		}
		struct snap_ec_rebuild *rb = NULL;
		MPI_Barrier(MPI_COMM_WORLD);
		double c0 = cpu_now(), t0 = now();
		int rc = snap_ec_rebuild_begin(gc, &g, lost ? NULL : mt, &o, &rb, err, sizeof(err));
		if (!rc)
			rc = snap_ec_rebuild_run(rb, &ci, 1, par2, (uint64_t)m * seg, NULL);
		double t = span(t0);
		c = cpu_span(c0);
		best_reb = t < best_reb ? t : best_reb;
		cpu_reb = c < cpu_reb ? c : cpu_reb;
		if (rc || memcmp(copy, data, size) || memcmp(par2, par, (size_t)m * seg)) {
			ok = 0;
			fprintf(stderr, "rebuild: rc %d %s\n", rc, rb ? snap_ec_rebuild_error(rb) : err);
		}
		snap_ec_rebuild_free(rb);
	}
	/* the same rebuild into fresh store memory: the lost members' bytes in
	 * new tmpfs files, mapped shared and never touched before the rebuild */
	double best_fresh = 1e30, cpu_fresh = 1e30;
	for (int r = 0; r < reps && ok && mt; r++) {
		int lost = me < m, lrc = 0;
		uint8_t *fd_data = copy, *fd_par = par2;
		char fp[2][4096];
		memcpy(copy, data, size);
		memcpy(par2, par, (size_t)m * seg);
		for (int f = 0; lost && f < 2 && !lrc; f++) {
			size_t flen = f ? (size_t)m * seg : size;
			snprintf(fp[f], sizeof(fp[f]), "%s/snap-ec-bench-%d-%d-%d", fresh_dir, (int)getpid(), r, f);
			int fd = open(fp[f], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
			void *p = fd < 0 || ftruncate(fd, (off_t)flen) ? MAP_FAILED
								    : mmap(NULL, flen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (fd >= 0)
				close(fd);
			if (p == MAP_FAILED) {
				fprintf(stderr, "rebuild into fresh memory: cannot map %s\n", fp[f]);
				lrc = 1;
			} else if (f) {
				fd_par = p;
			} else {
				fd_data = p;
			}
		}
		int all_ok = 0;
		lrc = !lrc;
		MPI_Allreduce(&lrc, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
		if (!all_ok) {
			ok = 0;
		} else {
			struct iovec ci = { fd_data, size };
			struct snap_ec_rebuild *rb = NULL;
			MPI_Barrier(MPI_COMM_WORLD);
			double c0 = cpu_now(), t0 = now();
			int rc = snap_ec_rebuild_begin(gc, &g, lost ? NULL : mt, &o, &rb, err, sizeof(err));
			if (!rc)
				rc = snap_ec_rebuild_run(rb, &ci, 1, fd_par, (uint64_t)m * seg, NULL);
			double t = span(t0);
			c = cpu_span(c0);
			best_fresh = t < best_fresh ? t : best_fresh;
			cpu_fresh = c < cpu_fresh ? c : cpu_fresh;
			if (rc || memcmp(fd_data, data, size) || memcmp(fd_par, par, (size_t)m * seg)) {
				ok = 0;
				fprintf(stderr, "rebuild into fresh memory: rc %d %s\n", rc,
					rb ? snap_ec_rebuild_error(rb) : err);
			}
			snap_ec_rebuild_free(rb);
		}
		if (lost && fd_data != copy)
			munmap(fd_data, size);
		if (lost && fd_par != par2)
			munmap(fd_par, (size_t)m * seg);
		for (int f = 0; lost && f < 2; f++)
			unlink(fp[f]);
	}
	/* the alternative design must produce the same parity to count */
	MPI_Op op;
	MPI_Op_create(xor_op, 1, &op);
	uint8_t *gen = malloc((size_t)n * k);
	gf_gen_cauchy1_matrix(gen, n, k);
	for (int r = 0; r < reps; r++) {
		memset(par2, 0, (size_t)m * seg);
		double t = reduce_once(data, sbuf, rbuf, par2, op, gen);
		best_red = t < best_red ? t : best_red;
		if (blob && memcmp(par2, par, (size_t)m * seg)) {
			ok = 0;
			fprintf(stderr, "alt reduce-scatter: parity differs from the library's on rank %d\n", me);
		}
	}
	MPI_Op_free(&op);
	int oks, okl = ok;
	MPI_Allreduce(&okl, &oks, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
	double prot = (double)n * (double)size / 1e9;
	if (me == 0)
		printf("{\"k\":%d,\"m\":%d,\"size\":%llu,\"chunk\":%u,\"reps\":%d,"
		       "\"mpi_move_gbps\":%.3f,\"mesh_encode_gbps\":%.3f,\"rebuild_gbps\":%.3f,"
		       "\"alt_reduce_scatter_gbps\":%.3f,\"alt_ship_all_move_gbps\":%.3f,\"mesh_encode_s\":%.6f,\"rebuild_s\":%.6f,"
		       "\"mpi_move_s\":%.6f,\"mpi_move_cpu_s\":%.6f,\"mesh_encode_cpu_s\":%.6f,\"rebuild_cpu_s\":%.6f,"
		       "\"rebuild_fresh_gbps\":%.3f,\"rebuild_fresh_s\":%.6f,\"rebuild_fresh_cpu_s\":%.6f,"
		       "\"verified\":%s}\n",
		       k, m, (unsigned long long)size, chunk, reps, prot / best_move, prot / best_enc,
		       prot / best_reb, prot / best_red, prot / best_ship, best_enc, best_reb, best_move, cpu_move,
		       cpu_enc, cpu_reb, prot / best_fresh, best_fresh, cpu_fresh, oks ? "true" : "false");
	fflush(stdout);
	snap_ec_meta_free(mt);
	free(blob); free(gen); free(data); free(copy); free(par); free(par2); free(rbuf); free(sbuf); free(req);
	MPI_Comm_free(&gc);
	MPI_Finalize();
	return oks ? 0 : 1;
}
