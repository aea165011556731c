/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * io_uw_write_pieces (io/src/uring.c), the writer of runs of codec frames:
 * random runs of 1-12 pieces of 0-9000 bytes at random unaligned offsets,
 * with io_bytes 8 KiB so windows, heads and tails cut pieces anywhere. After
 * each run is drained the file must hold exactly the pieces back to back,
 * every byte outside the run must be as before (the file is prefilled), and
 * each piece's CRC32C must be that of its bytes. Once with O_DIRECT (where
 * the file system allows it) and once buffered.
 * usage: io_uring_pieces DIR
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"
#include "io_testutil.h"
#include "../skiprule.h"

#define FILE_BYTES (256 * 1024)
#define MAXP 12
#define MAXLEN 9000

static unsigned char want[FILE_BYTES], got[FILE_BYTES], src[MAXP][MAXLEN];
static uint64_t rng = 88172645463325252ull;

static uint64_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static void read_back(int fd)
{
	CHECK(pread(fd, got, FILE_BYTES, 0) == FILE_BYTES);
	if (memcmp(got, want, FILE_BYTES) != 0) {
		size_t i = 0;
		while (got[i] == want[i])
			i++;
		fprintf(stderr, "byte %zu differs: %02x, expected %02x\n", i, got[i], want[i]);
		CHECK(0);
	}
}

static int trials(const char *path, int direct)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	CHECK(fd >= 0);
	memset(want, 0xAB, sizeof want);
	CHECK(pwrite(fd, want, FILE_BYTES, 0) == FILE_BYTES);
	int fdd = direct ? open(path, O_WRONLY | O_DIRECT | O_CLOEXEC) : -1;
	CHECK(!direct || fdd >= 0); /* the probe in main said O_DIRECT works here */
	int e;
	struct io_uring_writer *u = io_uw_new(4, 8192, &e);
	CHECK(u && io_uw_begin(u, fdd, fd) == 0);
	for (int t = 0; t < 300; t++) {
		struct io_piece pc[MAXP];
		uint32_t crc[MAXP];
		size_t n = 1 + next() % MAXP, total = 0;
		for (size_t i = 0; i < n; i++) {
			/* A few empty pieces, a few sub-page ones, most spanning pages. */
			size_t len = next() % 8 == 0 ? 0 : next() % 4 == 0 ? next() % 100 : next() % MAXLEN;
			for (size_t k = 0; k < len; k++)
				src[i][k] = (unsigned char)next();
			crc[i] = 0xFFFFFFFFu;
			pc[i] = (struct io_piece){src[i], len, next() % 3 ? &crc[i] : NULL, i};
			total += len;
		}
		uint64_t off = next() % (FILE_BYTES - total);
		for (size_t i = 0, at = off; i < n; at += pc[i].len, i++)
			memcpy(want + at, src[i], pc[i].len);
		CHECK(io_uw_write_pieces(u, pc, n, off) == 0);
		CHECK(io_uw_drain(u) == 0);
		for (size_t i = 0; i < n; i++)
			CHECK(!pc[i].crc || (crc[i] ^ 0xFFFFFFFFu) == snap_io_crc32c(src[i], pc[i].len));
		read_back(fd);
	}
	io_uw_free(u);
	if (fdd >= 0)
		close(fdd);
	close(fd);
	printf("%s: 300 runs written and read back\n", direct ? "O_DIRECT" : "buffered");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: io_uring_pieces DIR\n");
		return 2;
	}
	char path[4096];
	CHECK(mkdir(argv[1], 0755) == 0 || errno == EEXIST);
	snprintf(path, sizeof path, "%s/pieces.bin", argv[1]);
	/* Decided before any run, by a probe file, so a failing O_DIRECT open
	 * of the test's own file later is a failure, not a skip. */
	int pf = open(path, O_WRONLY | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
	if (pf >= 0)
		close(pf);
	if (skiprule_optional("the O_DIRECT runs", "a directory that takes O_DIRECT", pf >= 0))
		trials(path, 1);
	trials(path, 0);
	unlink(path);
	skiprule_summary("io_uring_pieces");
	return 0;
}
