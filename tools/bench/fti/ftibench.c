/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * FTI's side of scripts/bench_fti.py: what FTI (github.com/leobago/fti, the
 * multi-level checkpoint library libsnap is compared with) takes to reach
 * level 3 (Reed-Solomon across a group of nodes) and to recover after lost
 * nodes. One rank plays one node (the config's Node_size 1, Local_test 1).
 *
 *   mpirun -np N ftibench ckpt    CONFIG BYTES REPS
 *       REPS level-3 checkpoints of BYTES per rank, each of new contents;
 *       prints the slowest rank's FTI_Checkpoint time per rep, then exits
 *       without FTI_Finalize (a crash: the checkpoint stays for recover).
 *   mpirun -np N ftibench recover CONFIG BYTES
 *       after the caller deleted some nodes' local directories: FTI_Init
 *       (which rebuilds them), FTI_Recover into the buffer, every byte
 *       checked against the last checkpoint's contents.
 *
 * Not built by CMake (FTI is not packaged by Debian): the script compiles it
 * with mpicc against an FTI install.
 */
#include <fti.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
static void fill(uint8_t *b, size_t n, int rank, int ver)
{
	uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(rank + 1) + (uint64_t)ver;
	for (size_t i = 0; i + 8 <= n; i += 8) {
		x ^= x << 13; x ^= x >> 7; x ^= x << 17;
		memcpy(b + i, &x, 8);
	}
}
static double maxt(double t)
{
	double m;
	MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
	return m;
}
int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	if (argc < 4)
		return 2;
	int rec = !strcmp(argv[1], "recover");
	size_t bytes = strtoull(argv[3], NULL, 0);
	int reps = argc > 4 ? atoi(argv[4]) : 3;
	double t0 = MPI_Wtime();
	FTI_Init(argv[2], MPI_COMM_WORLD);
	double tinit = maxt(MPI_Wtime() - t0);
	int rank;
	MPI_Comm_rank(FTI_COMM_WORLD, &rank);
	uint8_t *buf = malloc(bytes);
	unsigned ver = 0;
	memset(buf, 0, bytes);
	FTI_Protect(0, buf, (int32_t)bytes, FTI_CHAR);
	FTI_Protect(1, &ver, 1, FTI_UINT);
	if (rec) {
		int st = FTI_Status();
		double t1 = MPI_Wtime();
		int rc = st ? FTI_Recover() : -1;
		double trec = maxt(MPI_Wtime() - t1);
		uint8_t *ref = malloc(bytes);
		fill(ref, bytes, rank, (int)ver);
		int bad = rc != 0 || memcmp(ref, buf, bytes) != 0, anybad;
		MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, FTI_COMM_WORLD);
		if (rank == 0)
			printf("{\"fti\":\"recover\",\"bytes\":%zu,\"status\":%d,\"init_s\":%.3f,\"recover_s\":%.3f,"
			       "\"version\":%u,\"verified\":%s}\n", bytes, st, tinit, trec, ver, anybad ? "false" : "true");
		free(ref);
	} else {
		for (int r = 1; r <= reps; r++) {
			ver = (unsigned)r;
			fill(buf, bytes, rank, (int)ver);
			MPI_Barrier(FTI_COMM_WORLD);
			double t1 = MPI_Wtime();
			FTI_Checkpoint(r, 3);
			double t = maxt(MPI_Wtime() - t1);
			if (rank == 0)
				printf("{\"fti\":\"ckpt\",\"level\":3,\"bytes\":%zu,\"rep\":%d,\"s\":%.3f}\n", bytes, r, t);
			fflush(stdout);
		}
	}
	free(buf);
	if (!rec) {
		/* leave the checkpoint for the recover run: no FTI_Finalize (a
		 * crash), which keeps the L3 files and marks the run failed */
		MPI_Barrier(MPI_COMM_WORLD);
		_exit(0);
	}
	FTI_Finalize();
	MPI_Finalize();
	return 0;
}
