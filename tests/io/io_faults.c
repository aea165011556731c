/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Faults against real files: truncation, flipped bytes (data, LZ4 chunk,
 * HDF5 metadata, manifest), missing files, an unwritable flush directory
 * (a path under a regular file), a full one (a 1 MiB tmpfs, when mount is
 * permitted), bad input, rewriting a persisted step, and retention. Each
 * must give a clear error naming the file (and dataset), and lose nothing
 * else: the other step keeps verifying and restoring.
 * usage: io_faults DIR
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_testutil.h"
#include "../skiprule.h"

#define JOB "faulty"
#define N (256 * 1024)

static float A[N], B[N / 4];

static void write_step(const char *dir, uint64_t step, int codec, uint32_t world)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = codec, .chunk_bytes = 64 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	CHECK(w);
	for (uint32_t r = 0; r < world; r++) {
		uint64_t g[1] = {N}, off[1] = {0}, sh[1] = {N}, g2[2] = {N / 64, 16}, o2[2] = {0, 0}, s2[2] = {N / 64, 16};
		struct snap_io_region reg[2] = {
			io_t_region("w/main", SNAP_DTYPE_F32, 1, g, off, sh, A),
			io_t_region("w/second", SNAP_DTYPE_F32, 2, g2, o2, s2, B)};
		OK(snap_io_write_rank(w, dir, JOB, step, r, world, reg, 2, NULL, &err), &err);
	}
	snap_io_writer_free(w);
	OK(snap_io_step_seal(dir, JOB, step, world, &err), &err);
}

static void flip(const char *path, off_t at)
{
	int fd = open(path, O_RDWR);
	CHECK(fd >= 0);
	unsigned char c;
	CHECK(pread(fd, &c, 1, at) == 1);
	c ^= 0x10;
	CHECK(pwrite(fd, &c, 1, at) == 1);
	close(fd);
}

static off_t fsize(const char *p)
{
	struct stat st;
	CHECK(stat(p, &st) == 0);
	return st.st_size;
}

static void copy_file(const char *from, const char *to)
{
	char cmd[4096];
	snprintf(cmd, sizeof cmd, "cp -p '%s' '%s'", from, to);
	CHECK(system(cmd) == 0);
}

/* Entries of a directory that must exist, "." and ".." not counted. */
static int entries(const char *path)
{
	DIR *d = opendir(path);
	CHECK(d);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	return n;
}

/* Step `step` of job `job`, world 2, rank r holding region regs[r]. */
static void write_pair(const char *dir, const char *job, uint64_t step, const struct snap_io_region *regs)
{
	struct snap_io_err err = {0};
	struct snap_io_writer *w = snap_io_writer_new(NULL, &err);
	CHECK(w);
	for (uint32_t r = 0; r < 2; r++)
		OK(snap_io_write_rank(w, dir, job, step, r, 2, &regs[r], 1, NULL, &err), &err);
	snap_io_writer_free(w);
	OK(snap_io_step_seal(dir, job, step, 2, &err), &err);
}

static int restores(const char *dir, uint64_t step, uint32_t rank)
{
	static float a[N], b[N / 4];
	struct snap_io_dest d[2] = {{.name = "w/main", .buf = a, .bytes = sizeof a},
				    {.name = "w/second", .buf = b, .bytes = sizeof b}};
	struct snap_io_err err = {0};
	int rc = snap_io_read_rank(dir, JOB, step, rank, d, 2, &err);
	return rc == 0 && memcmp(a, A, sizeof a) == 0 && memcmp(b, B, sizeof b) == 0;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	char dir[1024], p[4096], q[8192];
	snprintf(dir, sizeof dir, "%s/flush", argv[1]);
	snprintf(p, sizeof p, "rm -rf '%s' && mkdir -p '%s'", argv[1], dir);
	CHECK(system(p) == 0);
	io_t_weights(A, sizeof A, 0);
	io_t_weights(B, sizeof B, 12345);
	/* Decided before any case runs, from the capability, not from a mount
	 * that failed: with it, a failing mount fails the test. */
	int mnt = skiprule_optional("full, read-only and full-export tmpfs cases", "CAP_SYS_ADMIN to mount a tmpfs",
				    skiprule_can_mount());
	struct snap_io_err err = {0};
	size_t bad;

	printf("a job directory with only an unfinished step: no persisted step\n");
	snprintf(p, sizeof p, "mkdir -p '%s/" JOB "/step-1'", dir);
	CHECK(system(p) == 0);
	CHECK(snap_io_list_steps(dir, JOB, NULL, 0, &err) == 0);
	{
		uint64_t s;
		EXPECT_ERR(snap_io_newest_step(dir, JOB, &s, &err), SNAP_ENOENT, &err, "no persisted step");
	}

	printf("good steps 1 (none) and 2 (lz4), world 2\n");
	write_step(dir, 1, SNAP_IO_CODEC_NONE, 2);
	write_step(dir, 2, SNAP_IO_CODEC_LZ4, 2);
	OK(snap_io_verify_step(dir, JOB, 1, &bad, &err), &err);
	OK(snap_io_verify_step(dir, JOB, 2, &bad, &err), &err);

	printf("flipped data byte (contiguous) in step 1 rank 1\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-1/rank-1.h5", dir);
	snprintf(q, sizeof q, "%s.orig", p);
	copy_file(p, q);
	flip(p, fsize(p) - 100); /* w/second's data is last in the file */
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 1, &bad, &err), SNAP_ECORRUPT, &err, "step-1/rank-1.h5",
		   "w%2Fsecond", "CRC32C");
	CHECK(bad == 1);
	{
		static float b[N / 4];
		struct snap_io_dest d = {.name = "w/second", .buf = b, .bytes = sizeof b};
		EXPECT_ERR(snap_io_read_rank(dir, JOB, 1, 1, &d, 1, &err), SNAP_ECORRUPT, &err, "rank-1.h5", "w/second");
	}
	CHECK(restores(dir, 1, 0) && restores(dir, 2, 1));
	rename(q, p);
	OK(snap_io_verify_step(dir, JOB, 1, &bad, &err), &err);

	printf("flipped byte inside an LZ4 chunk (step 2 rank 0)\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-2/rank-0.h5", dir);
	snprintf(q, sizeof q, "%s.orig", p);
	copy_file(p, q);
	flip(p, fsize(p) / 2);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 2, &bad, &err), SNAP_ECORRUPT, &err, "step-2/rank-0.h5", "w%2Fmain");
	CHECK(restores(dir, 1, 0) && restores(dir, 2, 1));
	rename(q, p);

	printf("flipped HDF5 superblock byte\n");
	copy_file(p, q);
	flip(p, 9);
	CHECK(snap_io_verify_step(dir, JOB, 2, &bad, &err) < 0);
	printf("  ok (%s): %s\n", snap_strerror(err.code), err.msg);
	CHECK(strstr(err.msg, "step-2/rank-0.h5"));
	CHECK(restores(dir, 1, 0));
	rename(q, p);
	OK(snap_io_verify_step(dir, JOB, 2, &bad, &err), &err);

	printf("truncated rank file: step no longer listed, errors name the file\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-1/rank-0.h5", dir);
	snprintf(q, sizeof q, "%s.orig", p);
	copy_file(p, q);
	CHECK(truncate(p, fsize(p) / 2) == 0);
	uint64_t steps[4];
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 1 && steps[0] == 2);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 1, &bad, &err), SNAP_ETRUNC, &err, "step-1/rank-0.h5", "truncated");
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 1, 0, NULL, 0, &err), SNAP_ETRUNC, &err, "step-1/rank-0.h5");
	CHECK(restores(dir, 2, 0) && restores(dir, 2, 1));
	rename(q, p);

	printf("missing rank file\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-2/rank-1.h5", dir);
	snprintf(q, sizeof q, "%s/" JOB "/step-2/moved.h5", dir);
	CHECK(rename(p, q) == 0);
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 1 && steps[0] == 1);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 2, &bad, &err), SNAP_ENOENT, &err, "step-2/rank-1.h5");
	CHECK(restores(dir, 1, 1));
	CHECK(rename(q, p) == 0);

	printf("rank file swapped with another rank's (same size, valid checksums)\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-1/rank-0.h5", dir);
	snprintf(q, sizeof q, "%s.orig", p);
	copy_file(p, q);
	{
		char p1[4096];
		snprintf(p1, sizeof p1, "%s/" JOB "/step-1/rank-1.h5", dir);
		CHECK(fsize(p1) == fsize(p));
		copy_file(p1, p);
		static float a[N];
		struct snap_io_dest d = {.name = "w/main", .buf = a, .bytes = sizeof a};
		EXPECT_ERR(snap_io_read_rank(dir, JOB, 1, 0, &d, 1, &err), SNAP_EMISMATCH, &err, "step-1/rank-0.h5",
			   "rank 1/2", "rank 0/2");
		EXPECT_ERR(snap_io_verify_step(dir, JOB, 1, &bad, &err), SNAP_EMISMATCH, &err, "step-1/rank-0.h5");
		CHECK(bad == 1);
	}
	CHECK(restores(dir, 1, 1));
	rename(q, p);
	CHECK(restores(dir, 1, 0));

	printf("torn manifest: step not persisted\n");
	snprintf(p, sizeof p, "%s/" JOB "/step-2/MANIFEST", dir);
	snprintf(q, sizeof q, "%s.orig", p);
	copy_file(p, q);
	flip(p, 20);
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 1 && steps[0] == 1);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 2, &bad, &err), SNAP_ECORRUPT, &err, "MANIFEST", "torn");
	rename(q, p);
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 2);

	printf("bad input\n");
	{
		struct snap_io_writer *w = snap_io_writer_new(NULL, &err);
		CHECK(w);
		uint64_t g[1] = {N}, off[1] = {0}, sh[1] = {N};
		struct snap_io_region r[2] = {io_t_region("x", SNAP_DTYPE_F32, 1, g, off, sh, A),
					      io_t_region("x", SNAP_DTYPE_F32, 1, g, off, sh, A)};
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 3, 0, 1, r, 2, NULL, &err), SNAP_EINVAL, &err, "\"x\" given twice");
		EXPECT_ERR(snap_io_write_rank(w, dir, "../evil", 3, 0, 1, r, 1, NULL, &err), SNAP_EINVAL, &err, "../evil");
		r[0].bytes -= 4;
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 3, 0, 1, r, 1, NULL, &err), SNAP_EINVAL, &err, "\"x\"");
		r[0].bytes += 4;
		r[0].shard_offset[0] = 1;
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 3, 0, 1, r, 1, NULL, &err), SNAP_EINVAL, &err, "outside");
		r[0].shard_offset[0] = 0;
		r[0].crc32c ^= 1; /* memory no longer matches what the store recorded */
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 3, 0, 1, r, 1, NULL, &err), SNAP_ECORRUPT, &err, "rank-0.h5", "\"x\"");
		snprintf(p, sizeof p, "%s/" JOB "/step-3/rank-0.h5", dir);
		CHECK(access(p, F_OK) != 0);
		{
			struct snap_io_opts lo = {.codec = SNAP_IO_CODEC_LZ4, .chunk_bytes = 64 << 10};
			struct snap_io_writer *lw = snap_io_writer_new(&lo, &err);
			CHECK(lw);
			EXPECT_ERR(snap_io_write_rank(lw, dir, JOB, 3, 0, 1, r, 1, NULL, &err), SNAP_ECORRUPT, &err,
				   "rank-0.h5", "\"x\"", "CRC32C");
			CHECK(access(p, F_OK) != 0);
			snap_io_writer_free(lw);
		}
		r[0].crc32c ^= 1;
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 2, 0, 2, r, 1, NULL, &err), SNAP_ESTATE, &err, "already persisted");
		EXPECT_ERR(snap_io_write_rank(w, dir, JOB, 3, 2, 2, r, 1, NULL, &err), SNAP_EINVAL, &err, "rank 2");

		printf("unwritable flush directory (a path under a regular file)\n");
		snprintf(p, sizeof p, "%s/plainfile", argv[1]);
		FILE *f = fopen(p, "w");
		CHECK(f && fclose(f) == 0);
		snprintf(q, sizeof q, "%s/sub", p);
		CHECK(snap_io_write_rank(w, q, JOB, 3, 0, 1, r, 1, NULL, &err) < 0);
		printf("  ok (%s): %s\n", snap_strerror(err.code), err.msg);
		CHECK(strstr(err.msg, "plainfile"));

		printf("full flush directory (1 MiB tmpfs)\n");
		snprintf(p, sizeof p, "%s/full", argv[1]);
		mkdir(p, 0755);
		if (mnt) {
			CHECK(mount("tmpfs", p, "tmpfs", 0, "size=1m") == 0);
			EXPECT_ERR(snap_io_write_rank(w, p, JOB, 3, 0, 1, r, 1, NULL, &err), SNAP_ENOSPC, &err,
				   "step-3/rank-0.h5");
			snprintf(q, sizeof q, "%s/" JOB "/step-3", p);
			CHECK(entries(q) == 0); /* no temp file left behind */
			/* Codec frames reach the disk in the io_uring pass (after
			 * HDF5 allocated them): a full disk there names the dataset. */
			struct io_t_frames fr;
			io_t_frames_make(&fr, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, A, N, N / 8);
			struct snap_io_region fx[2] = {r[0], r[0]};
			fx[1].name = "y";
			io_t_frames_attach(&fx[0], &fr);
			io_t_frames_attach(&fx[1], &fr);
			EXPECT_ERR(snap_io_write_rank(w, p, JOB, 3, 0, 1, fx, 2, NULL, &err), SNAP_ENOSPC, &err,
				   "step-3/rank-0.h5", "dataset \"");
			CHECK(entries(q) == 0);
			io_t_frames_free(&fr);
			struct snap_io_region small = r[0];
			small.shape[0] = small.global_shape[0] = 1000;
			small.bytes = 4000;
			small.crc32c = snap_io_crc32c(A, 4000);
			/* Full before HDF5 writes the file's metadata (at H5Fclose):
			 * HDF5 1.10 leaves a file whose close failed half torn down in
			 * its ID table, and crashed at exit (H5F__close_cb); the driver
			 * keeps such a failure from HDF5 and reports it itself. */
			printf("full when HDF5 writes the metadata, at its close\n");
			snprintf(q, sizeof q, "%s/filler", p);
			int ffd = open(q, O_WRONLY | O_CREAT | O_TRUNC, 0600);
			CHECK(ffd >= 0);
			while (write(ffd, A, sizeof A) > 0)
				;
			close(ffd);
			EXPECT_ERR(snap_io_write_rank(w, p, JOB, 3, 0, 1, &small, 1, NULL, &err), SNAP_ENOSPC, &err,
				   "step-3/rank-0.h5");
			snprintf(q, sizeof q, "%s/" JOB "/step-3", p);
			CHECK(entries(q) == 0);
			snprintf(q, sizeof q, "%s/filler", p);
			CHECK(unlink(q) == 0);
			/* a small step still fits afterwards: nothing leaked */
			OK(snap_io_write_rank(w, p, JOB, 4, 0, 1, &small, 1, NULL, &err), &err);
			OK(snap_io_step_seal(p, JOB, 4, 1, &err), &err);
			OK(snap_io_verify_step(p, JOB, 4, &bad, &err), &err);
			printf("read-only flush directory (remounted ro)\n");
			CHECK(mount("tmpfs", p, "tmpfs", MS_REMOUNT | MS_RDONLY, "size=1m") == 0);
			EXPECT_ERR(snap_io_write_rank(w, p, JOB, 5, 0, 1, &small, 1, NULL, &err), SNAP_EPERM, &err,
				   "step-5");
			OK(snap_io_verify_step(p, JOB, 4, &bad, &err), &err);
			CHECK(umount(p) == 0);
		}
		snap_io_writer_free(w);
	}

	printf("export refuses shards that do not make one tensor\n");
	{
		static int32_t I[64];
		uint64_t g[1] = {64}, g65[1] = {65}, o0[1] = {0}, o32[1] = {32}, s16[1] = {16}, s32[1] = {32},
			 s40[1] = {40};
		struct {
			const char *what;
			struct snap_io_region r[2];
		} cases[] = {
			{"disagree on dtype", {io_t_region("t", SNAP_DTYPE_F32, 1, g, o0, s32, A),
					       io_t_region("t", SNAP_DTYPE_I32, 1, g, o32, s32, I)}},
			{"disagree on dtype or global shape", {io_t_region("t", SNAP_DTYPE_F32, 1, g, o0, s32, A),
							       io_t_region("t", SNAP_DTYPE_F32, 1, g65, o32, s32, A)}},
			{"overlap", {io_t_region("t", SNAP_DTYPE_F32, 1, g, o0, s40, A),
				     io_t_region("t", SNAP_DTYPE_F32, 1, g, o32, s32, A)}},
			{"cover 48 of 64", {io_t_region("t", SNAP_DTYPE_F32, 1, g, o0, s16, A),
					    io_t_region("t", SNAP_DTYPE_F32, 1, g, o32, s32, A)}},
		};
		/* a good pair first: the same writer path exports fine */
		struct snap_io_region good[2] = {io_t_region("t", SNAP_DTYPE_F32, 1, g, o0, s32, A),
						 io_t_region("t", SNAP_DTYPE_F32, 1, g, o32, s32, A + 32)};
		write_pair(dir, "exports", 1, good);
		snprintf(p, sizeof p, "%s/export-good.h5", argv[1]);
		OK(snap_io_export(dir, "exports", 1, p, SNAP_IO_EXPORT_COPY, &err), &err);
		for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
			write_pair(dir, "exports", 2 + c, cases[c].r);
			for (int mode = 0; mode < 2; mode++) {
				snprintf(p, sizeof p, "%s/export-bad.h5", argv[1]);
				EXPECT_ERR(snap_io_export(dir, "exports", 2 + c, p, mode, &err), SNAP_EMISMATCH, &err,
					   "tensor \"t\"", cases[c].what);
				CHECK(access(p, F_OK) != 0);
			}
		}
		CHECK(entries(argv[1]) == 4); /* flush, plainfile, full, export-good.h5: no temp file */
		/* A full disk under the export, both modes: a clear error, no temp
		 * file, and HDF5 left sound (it used to crash at exit after a
		 * failed close: see io_faults' full-at-close case). */
		snprintf(p, sizeof p, "%s/full", argv[1]);
		if (mnt) {
			CHECK(mount("tmpfs", p, "tmpfs", 0, "size=64k") == 0);
			snprintf(q, sizeof q, "%s/filler", p);
			int ffd = open(q, O_WRONLY | O_CREAT | O_TRUNC, 0600);
			CHECK(ffd >= 0);
			while (write(ffd, A, sizeof A) > 0)
				;
			close(ffd);
			for (int mode = 0; mode < 2; mode++) {
				printf("export to a full disk, %s\n", mode == SNAP_IO_EXPORT_COPY ? "copy" : "virtual");
				snprintf(q, sizeof q, "%s/export.h5", p);
				EXPECT_ERR(snap_io_export(dir, "exports", 1, q, mode, &err), SNAP_ENOSPC, &err, "export.h5");
				CHECK(entries(p) == 1); /* the filler alone */
			}
			CHECK(umount(p) == 0);
		}
	}

	printf("retention\n");
	for (uint64_t s = 3; s <= 6; s++)
		write_step(dir, s, SNAP_IO_CODEC_NONE, 1);
	/* an incomplete old step and an incomplete newer one (a flush under way) */
	snprintf(p, sizeof p, "mkdir -p '%s/" JOB "/step-0' '%s/" JOB "/step-9' && touch '%s/" JOB "/step-9/.rank-0.h5.tmp.1.1'",
		 dir, dir, dir);
	CHECK(system(p) == 0);
	EXPECT_ERR(snap_io_retain(dir, JOB, 0, &err), SNAP_EINVAL, &err, "at least 1");
	int removed = snap_io_retain(dir, JOB, 2, &err);
	CHECK(removed == 5); /* steps 1..4 and the stale step 0 */
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 2 && steps[0] == 6 && steps[1] == 5);
	snprintf(p, sizeof p, "%s/" JOB "/step-9", dir);
	CHECK(access(p, F_OK) == 0);
	CHECK(snap_io_retain(dir, JOB, 1, &err) == 1);
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 1 && steps[0] == 6);
	CHECK(snap_io_retain(dir, JOB, 1, &err) == 0);
	OK(snap_io_verify_step(dir, JOB, 6, &bad, &err), &err);
	/* the newest persisted survives even when a newer step is damaged */
	write_step(dir, 7, SNAP_IO_CODEC_NONE, 1);
	snprintf(p, sizeof p, "%s/" JOB "/step-7/MANIFEST", dir);
	flip(p, 5);
	CHECK(snap_io_retain(dir, JOB, 1, &err) == 0);
	CHECK(snap_io_list_steps(dir, JOB, steps, 4, &err) == 1 && steps[0] == 6);
	OK(snap_io_verify_step(dir, JOB, 6, &bad, &err), &err);
	skiprule_summary("io_faults");
	return 0;
}
