/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The step manifest: the one file whose presence makes a step persisted.
 * Plain text so a person can read it, with its own CRC32C on the last line
 * so a torn or edited manifest is not mistaken for a good one:
 *
 *   snapio-manifest 1
 *   job <job>
 *   step <step>
 *   world <world>
 *   part <n>      (only in a node's directory of per-node flush directories:
 *                  the n rank lines below are the ranks that node wrote)
 *   rank <r> <file bytes> <datasets> <raw bytes> <crc32c over datasets' crc32c>
 *                         (a frame dataset's: the CRC32C of its frame_crc32c)
 *   ...           (every rank 0..world-1, or a part's ranks, ascending)
 *   end <crc32c of every byte above this line, 8 hex digits>
 *
 * This file reads and writes one directory's MANIFEST; steps.c joins a
 * step's parts across node directories.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

#define MANIFEST_MAX (64u << 20)

/* -EFTYPE_: not a regular file (a FIFO would block open or read for ever). */
#define EFTYPE_ ENODEV

static int read_all(const char *path, char **out, size_t *len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
	if (fd < 0)
		return errno == ELOOP ? -EFTYPE_ : -errno;
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return -EFTYPE_;
	}
	if (st.st_size > (off_t)MANIFEST_MAX) {
		close(fd);
		return -EFBIG;
	}
	char *b = malloc((size_t)st.st_size + 1);
	size_t got = 0;
	while (b && got < (size_t)st.st_size) {
		ssize_t k = read(fd, b + got, (size_t)st.st_size - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	if (!b)
		return -ENOMEM;
	b[got] = '\0';
	*out = b;
	*len = got;
	return 0;
}

int io_manifest_read(const char *dir, const char *job, uint64_t step, int check_files, uint32_t *world, int *part,
		     struct io_manifest_rank **ranks, struct snap_io_err *err)
{
	char path[4200], sdir[4096];
	if (io_path_step(sdir, sizeof sdir, dir, job, step))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
	snprintf(path, sizeof path, "%s/%s", sdir, SNAP_IO_MANIFEST);
	char *b = NULL;
	size_t len = 0;
	int rc = read_all(path, &b, &len);
	if (rc == -ENOENT)
		return io_fail(err, SNAP_ENOENT, "step %" PRIu64 " of job %s is not persisted (no %s)", step, job, path);
	if (rc == -EFTYPE_)
		return io_fail(err, SNAP_ECORRUPT, "%s: not a regular file (or a symbolic link); step %" PRIu64
			       " skipped", path, step);
	if (rc)
		return io_fail(err, io_errno_code(-rc), "%s: cannot read: %s", path, strerror(-rc));
	/* The trailer covers everything before it. */
	char *end = len >= 13 ? b + len - 13 : NULL;
	unsigned crc = 0;
	if (!end || strncmp(end, "end ", 4) != 0 || (end != b && end[-1] != '\n') || b[len - 1] != '\n' ||
	    sscanf(end + 4, "%8x", &crc) != 1 || crc != snap_io_crc32c(b, (size_t)(end - b))) {
		free(b);
		return io_fail(err, SNAP_ECORRUPT, "%s: manifest is torn or corrupt (checksum line)", path);
	}
	*end = '\0';
	char mjob[160] = "";
	uint64_t mstep = 0, w = 0, lines = 0;
	int ver = 0, pos = 0, k = 0;
	struct io_manifest_rank *r = NULL;
	if (sscanf(b, "snapio-manifest %d\njob %159s\nstep %" SCNu64 "\nworld %" SCNu64 "\n%n", &ver, mjob, &mstep, &w,
		   &pos) != 4 || pos == 0) {
		rc = io_fail(err, SNAP_ECORRUPT, "%s: manifest header unreadable", path);
	} else if (ver != SNAP_IO_FORMAT_VERSION) {
		rc = io_fail(err, SNAP_EFORMAT, "%s: manifest version %d not supported", path, ver);
	} else if (strcmp(mjob, job) != 0 || mstep != step || w == 0 || w > UINT32_MAX) {
		rc = io_fail(err, SNAP_ECORRUPT, "%s: manifest is for job %s step %" PRIu64 " world %" PRIu64, path,
			     mjob, mstep, w);
	} else if (!(r = calloc(w, sizeof *r))) {
		rc = io_fail(err, SNAP_ENOMEM, "out of memory");
	}
	*part = 0;
	lines = w;
	if (!rc && strncmp(b + pos, "part ", 5) == 0) {
		if (sscanf(b + pos, "part %" SCNu64 "\n%n", &lines, &k) != 1 || k == 0 || lines == 0 || lines > w)
			rc = io_fail(err, SNAP_ECORRUPT, "%s: manifest's part line unreadable", path);
		*part = 1;
		pos += k;
	}
	const char *p = b + pos;
	uint64_t next = 0;   /* rank lines ascend: a whole manifest lists 0..world-1 */
	for (uint64_t i = 0; i < lines && !rc; i++) {
		uint64_t ri = 0, size = 0, nds = 0, raw = 0;
		unsigned cs = 0;
		k = 0;
		if (sscanf(p, "rank %" SCNu64 " %" SCNu64 " %" SCNu64 " %" SCNu64 " %8x\n%n", &ri, &size, &nds, &raw, &cs,
			   &k) != 5 || k == 0 || ri < next || ri >= w || (!*part && ri != i)) {
			rc = io_fail(err, SNAP_ECORRUPT, "%s: manifest line for rank %" PRIu64 " unreadable", path,
				     *part ? next : i);
			break;
		}
		next = ri + 1;
		r[ri] = (struct io_manifest_rank){ size, nds, raw, cs, 1, -1 };
		p += k;
		if (check_files) {
			char rp[4200];
			struct stat st;
			io_rank_name(rp, sizeof rp, sdir, (uint32_t)ri);
			if (stat(rp, &st) < 0)
				rc = io_fail(err, SNAP_ENOENT, "%s: missing (step %" PRIu64 " is damaged)", rp, step);
			else if ((uint64_t)st.st_size != size)
				rc = io_fail(err, (uint64_t)st.st_size < size ? SNAP_ETRUNC : SNAP_ECORRUPT,
					     "%s: %" PRIu64 " bytes, manifest says %" PRIu64 " (step %" PRIu64
					     " is damaged)", rp, (uint64_t)st.st_size, size, step);
		}
	}
	if (!rc && *p)
		rc = io_fail(err, SNAP_ECORRUPT, "%s: manifest has lines past its ranks", path);
	free(b);
	if (rc) {
		free(r);
		return rc;
	}
	*world = (uint32_t)w;
	if (ranks)
		*ranks = r;
	else
		free(r);
	return 0;
}

uint32_t io_ds_crcsum(const struct io_ds *ds, size_t n)
{
	uint32_t c = 0xFFFFFFFFu;
	for (size_t i = 0; i < n; i++)
		c = io_crc_u32le(c, ds[i].sumcrc);
	return c ^ 0xFFFFFFFFu;
}

/* Summary of one rank file for its manifest line; metadata only. */
static int summarise(const char *path, const char *job, uint64_t step, uint32_t rank, uint32_t world,
		     struct io_manifest_rank *m, struct snap_io_err *err)
{
	hid_t f;
	struct io_ds *ds = NULL;
	size_t n = 0;
	struct io_rank_id id = {job, step, rank, world};
	int rc = io_rank_open(path, &id, &f, &ds, &n, err);
	if (rc)
		return rc;
	struct stat st;
	if (!rc && stat(path, &st) < 0)
		rc = io_fail(err, SNAP_EIO, "%s: stat failed", path);
	m->raw_bytes = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		if (ds[i].off != UINT64_MAX && ds[i].off + ds[i].info.bytes > (uint64_t)st.st_size)
			rc = io_fail(err, SNAP_ETRUNC, "%s: truncated: dataset \"%s\" ends past the end of file", path,
				     ds[i].dataset);
		m->raw_bytes += ds[i].info.bytes;
	}
	m->crcsum = io_ds_crcsum(ds, n);
	m->ndatasets = n;
	m->size = (uint64_t)st.st_size;
	H5Fclose(f);
	free(ds);
	return rc;
}

/* Every listed rank file of the step present (missing ones first: that is
 * the usual reason a seal is early), then summarised into m[rank]. ranks
 * NULL: every rank of the world. */
static int summarise_step(const char *sdir, const char *job, uint64_t step, uint32_t world, const uint32_t *ranks,
			  size_t n, struct io_manifest_rank *m, struct snap_io_err *err)
{
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		char rp[4200];
		io_rank_name(rp, sizeof rp, sdir, ranks ? ranks[i] : (uint32_t)i);
		if (access(rp, F_OK) < 0)
			rc = io_fail(err, SNAP_ENOENT, "%s: missing; step %" PRIu64 " cannot be sealed", rp, step);
	}
	io_h5_enter();
	for (size_t i = 0; i < n && !rc; i++) {
		uint32_t r = ranks ? ranks[i] : (uint32_t)i;
		char rp[4200];
		io_rank_name(rp, sizeof rp, sdir, r);
		rc = summarise(rp, job, step, r, world, &m[r], err);
		m[r].present = 1;
	}
	io_h5_leave();
	return rc;
}

/* The MANIFEST's text (format at the top of this file), malloc'd; NULL
 * when out of memory. A part lists the present entries of m only. */
static char *manifest_text(const char *job, uint64_t step, uint32_t world, int part, size_t nlisted,
			   const struct io_manifest_rank *m, size_t *len_out)
{
	size_t cap = 256 + (size_t)world * 128, len = 0;
	char *b = malloc(cap);
	if (!b)
		return NULL;
	len += (size_t)snprintf(b + len, cap - len, "snapio-manifest %d\njob %s\nstep %" PRIu64 "\nworld %" PRIu32 "\n",
				SNAP_IO_FORMAT_VERSION, job, step, world);
	if (part)
		len += (size_t)snprintf(b + len, cap - len, "part %zu\n", nlisted);
	for (uint32_t r = 0; r < world; r++)
		if (m[r].present)
			len += (size_t)snprintf(b + len, cap - len, "rank %" PRIu32 " %" PRIu64 " %" PRIu64 " %" PRIu64
						" %08x\n", r, m[r].size, m[r].ndatasets, m[r].raw_bytes, m[r].crcsum);
	len += (size_t)snprintf(b + len, cap - len, "end %08x\n", snap_io_crc32c(b, len));
	*len_out = len;
	return b;
}

/* b[0..len) to path through tmp: written, fsynced, renamed, and the step
 * directory fsynced. Returns 0 or an errno; tmp may be left behind. */
static int put_durably(const char *sdir, const char *tmp, const char *path, const char *b, size_t len)
{
	/* The MANIFEST takes the step directory's bits less x (the writer
	 * made the directory with the configured mode), whatever the umask. */
	struct stat dst;
	unsigned fmode = stat(sdir, &dst) == 0 ? ((unsigned)dst.st_mode & 0666) | 0600 : 0600;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
	size_t off = 0;
	int e = fd < 0 ? errno : 0;
	if (!e && fchmod(fd, fmode) != 0)
		e = errno;
	while (!e && off < len) {
		ssize_t k = write(fd, b + off, len - off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			e = k < 0 ? errno : ENOSPC;
		else
			off += (size_t)k;
	}
	if (!e && fsync(fd) < 0)
		e = errno;
	if (fd >= 0 && close(fd) < 0 && !e)
		e = errno;
	if (!e && rename(tmp, path) < 0)
		e = errno;
	if (!e) {
		int d = io_fsync_dir(sdir);
		e = d < 0 ? -d : 0;
	}
	return e;
}

/* A whole step (ranks NULL: 0..world-1) or one node's part (its n ranks). */
static int seal(const char *dir, const char *job, uint64_t step, uint32_t world, const uint32_t *ranks, size_t n,
		struct snap_io_err *err)
{
	int rc;
	if ((rc = io_check_job(job, err)) < 0)
		return rc;
	char sdir[4096], path[4200], tmp[4300];
	if (io_path_step(sdir, sizeof sdir, dir, job, step))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
	snprintf(path, sizeof path, "%s/%s", sdir, SNAP_IO_MANIFEST);
	struct io_manifest_rank *m = calloc(world, sizeof *m);
	if (!m)
		return io_fail(err, SNAP_ENOMEM, "out of memory");
	for (size_t i = 0; ranks && i < n; i++)
		if (ranks[i] >= world || m[ranks[i]].present++) {
			free(m);
			return io_fail(err, SNAP_EINVAL, "%s: rank %" PRIu32 " of a part is %s", path, ranks[i],
				       ranks[i] >= world ? "not below the world size" : "listed twice");
		}
	uint32_t have = 0;
	int part = 0;
	struct io_manifest_rank *old = NULL;
	struct snap_io_err probe = {0};
	char mark[4200];
	snprintf(mark, sizeof mark, "%s/%s", sdir, SNAP_IO_INCOMPLETE);
	if (io_manifest_read(dir, job, step, 1, &have, &part, &old, &probe) == 0) {
		/* Idempotent: the same world, and for a part the same ranks. */
		int same = have == world && part == (ranks != NULL);
		for (uint32_t r = 0; same && r < world; r++)
			same = old[r].present == (ranks ? m[r].present : 1);
		free(old);
		free(m);
		if (same) {
			unlink(mark);
			return 0;
		}
		return io_fail(err, SNAP_ESTATE, "%s: step already sealed with world %" PRIu32 "%s, not this one", path,
			       have, part ? " as a part of other ranks" : "");
	}
	rc = summarise_step(sdir, job, step, world, ranks, ranks ? n : world, m, err);
	size_t len = 0;
	char *b = rc ? NULL : manifest_text(job, step, world, ranks != NULL, n, m, &len);
	if (!rc && !b)
		rc = io_fail(err, SNAP_ENOMEM, "out of memory");
	if (!rc) {
		snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%d", sdir, SNAP_IO_MANIFEST, (int)getpid());
		int e = put_durably(sdir, tmp, path, b, len);
		if (e) {
			unlink(tmp);
			rc = io_fail(err, io_errno_code(e), "%s: writing manifest failed: %s", path, strerror(e));
		} else {
			unlink(mark); /* sealed: the step is no longer an unfinished flush */
		}
	}
	free(b);
	free(m);
	return rc;
}

int snap_io_step_seal(const char *dir, const char *job, uint64_t step, uint32_t world, struct snap_io_err *err)
{
	io_err_clear(err);
	if (!dir || world == 0)
		return io_fail(err, SNAP_EINVAL, "snap_io_step_seal: NULL dir or world 0");
	if (io_is_pattern(dir))
		return io_fail(err, SNAP_EINVAL, "%s: per-node directories are sealed a part at a time "
			       "(snap_io_part_seal in each node's directory)", dir);
	return seal(dir, job, step, world, NULL, world, err);
}

int snap_io_part_seal(const char *dir, const char *job, uint64_t step, uint32_t world, const uint32_t *ranks,
		      size_t n, struct snap_io_err *err)
{
	io_err_clear(err);
	if (!dir || world == 0 || !ranks || n == 0)
		return io_fail(err, SNAP_EINVAL, "snap_io_part_seal: NULL dir or ranks, no ranks or world 0");
	if (io_is_pattern(dir))
		return io_fail(err, SNAP_EINVAL, "%s: seal a part in one node's directory, not the pattern", dir);
	return seal(dir, job, step, world, ranks, n, err);
}

int snap_io_part_withdraw(const char *dir, const char *job, uint64_t step, struct snap_io_err *err)
{
	io_err_clear(err);
	int rc = dir ? io_check_job(job, err) : io_fail(err, SNAP_EINVAL, "NULL dir");
	if (rc)
		return rc;
	if (io_is_pattern(dir))
		return io_fail(err, SNAP_EINVAL, "%s: withdraw a part in one node's directory, not the pattern", dir);
	char sdir[4096], path[4200], mark[4200];
	if (io_path_step(sdir, sizeof sdir, dir, job, step))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", dir);
	snprintf(path, sizeof path, "%s/%s", sdir, SNAP_IO_MANIFEST);
	snprintf(mark, sizeof mark, "%s/%s", sdir, SNAP_IO_INCOMPLETE);
	uint32_t world = 0;
	int part = 0;
	struct snap_io_err probe = {0};
	rc = io_manifest_read(dir, job, step, 0, &world, &part, NULL, &probe);
	if (rc == SNAP_ENOENT)
		return 0;
	if (rc == 0 && !part)
		return io_fail(err, SNAP_ESTATE, "%s: a whole step's MANIFEST, not a node's part; not withdrawn", path);
	/* A torn or unreadable MANIFEST goes as well: it never counted. The
	 * mark first, so no instant shows rank files with neither (which
	 * snap_io_lost_step would take for a lost MANIFEST). */
	int fd = open(mark, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return io_fail(err, io_errno_code(errno), "%s: cannot create: %s", mark, strerror(errno));
	close(fd);
	if (unlink(path) < 0 && errno != ENOENT)
		return io_fail(err, io_errno_code(errno), "%s: cannot remove: %s", path, strerror(errno));
	int d = io_fsync_dir(sdir);
	if (d < 0)
		return io_fail(err, io_errno_code(-d), "%s: fsync of directory failed: %s", sdir, strerror(-d));
	return 1;
}
