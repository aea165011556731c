/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One rank's HDF5 file as a file: its names (final and temp), its creation
 * with the configured mode and the root attributes that say whose it is,
 * and opening it again with those attributes checked. The identity is
 * written and read here only; the datasets inside are write.c's and
 * read.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

static int fit(int k, size_t cap)
{
	return k < 0 || (size_t)k >= cap ? SNAP_EINVAL : 0;
}

int io_rank_name(char *out, size_t cap, const char *sdir, uint32_t rank)
{
	return fit(snprintf(out, cap, "%s/rank-%" PRIu32 ".h5", sdir, rank), cap);
}

int io_path_rank(char *out, size_t cap, const char *dir, const char *job, uint64_t step, uint32_t rank)
{
	int rc = io_path_step(out, cap, dir, job, step);
	if (rc)
		return rc;
	size_t k = strlen(out);
	return fit(snprintf(out + k, cap - k, "/rank-%" PRIu32 ".h5", rank), cap - k);
}

int io_is_rank_name(const char *name)
{
	size_t n = strlen(name);
	return strncmp(name, "rank-", 5) == 0 && n > 8 && strcmp(name + n - 3, ".h5") == 0;
}

static atomic_uint tmp_seq;

int io_rank_tmp_name(char *out, size_t cap, const char *sdir, uint32_t rank)
{
	return fit(snprintf(out, cap, "%s/.rank-%" PRIu32 ".h5.tmp.%d.%u", sdir, rank, (int)getpid(),
			    atomic_fetch_add(&tmp_seq, 1)), cap);
}

/* The root attributes rank_attrs reads back. */
int io_rank_create(const char *tmp, const char *final, unsigned mode, const struct io_rank_id *id,
		   struct io_defer *defer, hid_t *file, struct snap_io_err *err)
{
	hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), f = -1;
	if (fapl < 0 || H5Pset_alignment(fapl, SNAP_IO_ALIGN, SNAP_IO_ALIGN) < 0 || io_defer_fapl(fapl, defer) < 0) {
		if (fapl >= 0)
			H5Pclose(fapl);
		return io_fail_h5(err, SNAP_EIO, "%s: HDF5 property setup failed", final);
	}
	/* Create the file ourselves with the configured bits (fchmod: the umask
	 * must not widen or narrow them), then let HDF5 take it over. */
	int tfd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (tfd < 0 || fchmod(tfd, mode) != 0) {
		int e = errno;
		if (tfd >= 0) {
			close(tfd);
			unlink(tmp);
		}
		H5Pclose(fapl);
		return io_fail(err, io_errno_code(e), "%s: cannot create temp file %s: %s", final, tmp, strerror(e));
	}
	close(tfd);
	errno = 0;
	f = H5Fcreate(tmp, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
	H5Pclose(fapl);
	if (f < 0) {
		int e = errno;
		return io_fail_h5(err, e ? io_errno_code(e) : SNAP_EIO, "%s: cannot create temp file %s%s%s", final, tmp,
				  e ? ": " : "", e ? strerror(e) : "");
	}
	uint64_t u[2] = {id->step, SNAP_IO_FORMAT_VERSION};
	if (io_attr_str(f, "format", SNAP_IO_FORMAT_NAME) < 0 || io_attr_u64(f, "format_version", &u[1], 1) < 0 ||
	    io_attr_str(f, "job", id->job) < 0 || io_attr_u64(f, "step", &u[0], 1) < 0 ||
	    io_attr_u32(f, "rank", id->rank) < 0 || io_attr_u32(f, "world", id->world) < 0) {
		int rc = io_fail_h5(err, SNAP_EIO, "%s: writing file attributes failed", final);
		io_defer_close(f, defer);
		return rc;
	}
	*file = f;
	return 0;
}

static int rank_attrs(hid_t file, const char *path, char *job, size_t jobcap, uint64_t *step,
		      uint32_t *rank, uint32_t *world, struct snap_io_err *err)
{
	char fmt[32];
	uint64_t ver = 0, r = 0, w = 0;
	if (io_get_attr_str(file, "format", fmt, sizeof fmt) < 0 || strcmp(fmt, SNAP_IO_FORMAT_NAME) != 0 ||
	    io_get_attr_u64(file, "format_version", &ver, 1, NULL) < 0)
		return io_fail_h5(err, SNAP_EFORMAT, "%s: not a snapio rank file (no format attribute)", path);
	if (ver != SNAP_IO_FORMAT_VERSION)
		return io_fail(err, SNAP_EFORMAT, "%s: snapio format version %" PRIu64 " not supported", path, ver);
	if (io_get_attr_str(file, "job", job, jobcap) < 0 || io_get_attr_u64(file, "step", step, 1, NULL) < 0 ||
	    io_get_attr_u64(file, "rank", &r, 1, NULL) < 0 || io_get_attr_u64(file, "world", &w, 1, NULL) < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: rank file attributes missing or unreadable", path);
	*rank = (uint32_t)r;
	*world = (uint32_t)w;
	return 0;
}

int io_rank_open_file(const char *path, const struct io_rank_id *expect, hid_t *file, struct snap_io_err *err)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return io_fail(err, SNAP_ENOENT, "%s: missing: %s", path, strerror(errno));
	/* HDF5 would open a FIFO and block on it for ever. */
	if (!S_ISREG(st.st_mode))
		return io_fail(err, SNAP_ECORRUPT, "%s: not a regular file (or a symbolic link); skipped", path);
	hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	if (f < 0)
		return io_fail_h5(err, SNAP_ECORRUPT, "%s: not a readable HDF5 file (truncated or corrupt?)", path);
	char job[160] = "";
	uint64_t step = 0;
	uint32_t rank = 0, world = 0;
	int rc = rank_attrs(f, path, job, sizeof job, &step, &rank, &world, err);
	if (!rc && expect &&
	    (strcmp(job, expect->job) || step != expect->step || rank != expect->rank || world != expect->world))
		rc = io_fail(err, SNAP_EMISMATCH, "%s: file says job %s step %" PRIu64 " rank %" PRIu32 "/%" PRIu32
			     ", expected job %s step %" PRIu64 " rank %" PRIu32 "/%" PRIu32 " (a rank file moved or "
			     "copied from another rank or step?)", path, job, step, rank, world, expect->job,
			     expect->step, expect->rank, expect->world);
	if (rc) {
		H5Fclose(f);
		return rc;
	}
	*file = f;
	return 0;
}
