/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A real disk filling up under the O_DIRECT flush: a 48 MiB ext4 (a file
 * mounted through a loop device; exits 77 without CAP_SYS_ADMIN,
 * /dev/loop-control or mkfs.ext4, and fails when mkfs or mount fails) is filled by a filler
 * file until only a fraction of one step's bytes is free, and a step of two
 * 4 MiB regions is written with each kind of data: uncompressed (the bulk
 * io_uring pass after HDF5's close), LZ4 (chunks on the ring while HDF5
 * builds the file) and codec frames (recorded by the driver, written after
 * the close). Whichever write meets the full disk first -- HDF5's metadata,
 * an LZ4 chunk, the bulk pass, the fsync -- the call must fail with
 * SNAP_ENOSPC naming the rank file, leave no file in the step directory,
 * and leave the step persisted before intact; with room the same step must
 * persist and read back bit-exact. The process must then exit cleanly
 * (HDF5 1.10 crashed at exit after a failed close: see deferdrv.c).
 * usage: io_full_disk DIR
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_testutil.h"
#include "../skiprule.h"

#define JOB "full"
#define N (1024 * 1024) /* floats per region: 4 MiB */

static float A[N], B[N];
static struct io_t_frames FR;

static const char *kind_name[3] = {"uncompressed", "lz4", "frames"};

static int write_kind(const char *dir, uint64_t step, int kind, struct snap_io_err *err)
{
	struct snap_io_opts o = {.codec = kind == 1 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE, .chunk_bytes = 256 << 10,
				 .io_bytes = 256 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, err);
	CHECK(w);
	uint64_t g[1] = {N}, o0[1] = {0};
	struct snap_io_region r[2] = {io_t_region("a", SNAP_DTYPE_F32, 1, g, o0, g, A),
				      io_t_region("b", SNAP_DTYPE_F32, 1, g, o0, g, kind == 2 ? FR.decoded : B)};
	if (kind == 2)
		io_t_frames_attach(&r[1], &FR);
	int rc = snap_io_write_rank(w, dir, JOB, step, 0, 1, r, 2, NULL, err);
	snap_io_writer_free(w);
	return rc < 0 ? rc : snap_io_step_seal(dir, JOB, step, 1, err);
}

static void check_step(const char *dir, uint64_t step, int kind)
{
	static float a[N], b[N];
	struct snap_io_err err = {0};
	size_t bad;
	OK(snap_io_verify_step(dir, JOB, step, &bad, &err), &err);
	struct snap_io_dest d[2] = {{.name = "a", .buf = a, .bytes = sizeof a}, {.name = "b", .buf = b, .bytes = sizeof b}};
	OK(snap_io_read_rank(dir, JOB, step, 0, d, 2, &err), &err);
	CHECK(memcmp(a, A, sizeof a) == 0 && memcmp(b, kind == 2 ? FR.decoded : B, sizeof b) == 0);
}

/* Entries of a directory ("." and ".." not counted); 0 if it is missing. */
static int entries(const char *path)
{
	DIR *d = opendir(path);
	int n = 0;
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static uint64_t free_bytes(const char *dir)
{
	struct statvfs v;
	CHECK(statvfs(dir, &v) == 0);
	return (uint64_t)v.f_bavail * v.f_frsize;
}

/* Leaves at most about `left` bytes free on the file system of dir (a
 * piece at a time: the file's own extent blocks take room too). */
static void fill_to(const char *dir, const char *filler, uint64_t left)
{
	unlink(filler);
	int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0);
	for (off_t at = 0;;) {
		uint64_t avail = free_bytes(dir);
		if (avail <= left)
			break;
		uint64_t k = avail - left < (1u << 20) ? avail - left : (1u << 20);
		if (posix_fallocate(fd, at, (off_t)k) != 0)
			break; /* full */
		at += (off_t)k;
	}
	close(fd);
}

static char mnt[512];

static void unmount(void)
{
	umount(mnt);
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	char img[512], dir[600], filler[600], sdir[700], cmd[4096];
	/* A failed earlier run may have left its disk mounted. */
	snprintf(cmd, sizeof cmd, "umount '%s/mnt' 2>/dev/null; rm -rf '%s' && mkdir -p '%s'", argv[1], argv[1], argv[1]);
	CHECK(system(cmd) == 0);
	snprintf(img, sizeof img, "%s/disk.img", argv[1]);
	snprintf(mnt, sizeof mnt, "%s/mnt", argv[1]);
	snprintf(dir, sizeof dir, "%s/flush", mnt);
	snprintf(filler, sizeof filler, "%s/filler", mnt);
	CHECK(mkdir(mnt, 0755) == 0);
	/* Whether this can run is decided from what the process has, before
	 * anything is tried: with it, a failing mkfs or mount is a failure. */
	if (!skiprule_can_mount())
		skiprule_skip_test("io_full_disk", "needs CAP_SYS_ADMIN to mount an ext4 (root, as in CI)");
	if (access("/dev/loop-control", F_OK) != 0)
		skiprule_skip_test("io_full_disk", "needs /dev/loop-control to mount a file as a disk");
	if (system("command -v mkfs.ext4 >/dev/null 2>&1") != 0)
		skiprule_skip_test("io_full_disk", "needs mkfs.ext4 (e2fsprogs)");
	snprintf(cmd, sizeof cmd, "truncate -s 48M '%s' && mkfs.ext4 -q -F -m 0 -O ^has_journal '%s'", img, img);
	if (system(cmd) != 0) {
		fprintf(stderr, "io_full_disk: FAILED: %s (its output above)\n", cmd);
		return 1;
	}
	snprintf(cmd, sizeof cmd, "mount -o loop '%s' '%s'", img, mnt);
	if (system(cmd) != 0) {
		fprintf(stderr, "io_full_disk: FAILED: %s (its output above)\n", cmd);
		return 1;
	}
	atexit(unmount); /* CHECK exits: the disk must not stay mounted */
	io_t_weights(A, sizeof A, 5);
	io_t_weights(B, sizeof B, 6);
	io_t_frames_make(&FR, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, B, N, N / 4);
	struct snap_io_err err = {0};

	printf("step 1 persisted with room to spare\n");
	OK(write_kind(dir, 1, 0, &err), &err);
	check_step(dir, 1, 0);
	uint64_t need = 2ull * N * 4; /* one step's data, metadata aside */
	/* Free space left: from nothing to more than a step needs, so the
	 * write that fails moves through the file's phases (HDF5's metadata at
	 * the close, the first region, the second, the last bytes). */
	const uint64_t left[] = {0, 8 << 10, 12 << 10, 16 << 10, 24 << 10, 32 << 10, 64 << 10, need / 4, need / 2, need * 3 / 4, need - (64 << 10), need * 5 / 4};
	int fails[3] = {0}, fits[3] = {0};
	uint64_t step = 2;
	for (int kind = 0; kind < 3; kind++) {
		for (size_t i = 0; i < sizeof left / sizeof left[0]; i++, step++) {
			fill_to(mnt, filler, left[i]);
			int rc = write_kind(dir, step, kind, &err);
			snprintf(sdir, sizeof sdir, "%s/" JOB "/step-%" PRIu64, dir, step);
			if (rc == 0) {
				fits[kind]++;
				printf("%s, %" PRIu64 " KiB free: persisted\n", kind_name[kind], left[i] >> 10);
				check_step(dir, step, kind);
			} else {
				fails[kind]++;
				printf("%s, %" PRIu64 " KiB free: ", kind_name[kind], left[i] >> 10);
				EXPECT_ERR(rc, SNAP_ENOSPC, &err, "step-");
				if (entries(sdir) != 0) {
					fprintf(stderr, "%s holds %d entries after the failed write\n", sdir, entries(sdir));
					CHECK(0);
				}
			}
			snprintf(cmd, sizeof cmd, "rm -rf '%s'", sdir);
			CHECK(system(cmd) == 0);
			check_step(dir, 1, 0);
		}
	}
	unlink(filler);
	for (int kind = 0; kind < 3; kind++) {
		printf("%s: %d failed with the disk full, %d persisted\n", kind_name[kind], fails[kind], fits[kind]);
		CHECK(fails[kind] >= 6 && fits[kind] >= 1);
	}
	io_t_frames_free(&FR);
	CHECK(umount(mnt) == 0);
	mnt[0] = '\0';
	unlink(img);
	printf("io_full_disk: all good\n");
	return 0;
}
