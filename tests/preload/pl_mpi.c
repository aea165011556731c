/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pl_mpi DIR - an ordinary MPI program: each rank writes DIR/rank-<r>.bin
 * (1 MiB, bytes a function of the rank), then MPI_Finalize. Under the
 * preload, MPI_Finalize returns only once snapsmp has flushed the job's
 * captured files, so when mpirun returns they are on disk.
 */
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: pl_mpi DIR\n");
		return 2;
	}
	MPI_Init(&argc, &argv);
	int rank;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	char path[4096];
	snprintf(path, sizeof(path), "%s/rank-%d.bin", argv[1], rank);
	static unsigned char buf[1 << 20];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (unsigned char)(i * 13 + (size_t)rank * 101);
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int ok = fd >= 0 && write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf) && close(fd) == 0;
	if (!ok)
		perror("pl_mpi: write");
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return ok ? 0 : 1;
}
