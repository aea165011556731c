/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_restore.c - snapbench snapshot's restore rows: after the saves
 * (bench_snapshot.c), each rank restores the newest step by the saving
 * context, by a new context (verifying as it copies, then verifying
 * first), into fresh buffers, and reads the same bytes with read(2) as the
 * floor; and the fresh restore's ceiling, memcpy into never-touched memory.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include "bench_snapshot.h"
#include "bench_util.h"
#include "snap/base.h"
#include "snap/snap.h"

#define READ_BLOCK (256u << 10)   /* the restore's bounce block */

/* Close *ctx and open a new one with cfg, registering r: a relaunched trainer. */
static int reopen(const struct snap_config *cfg, const struct snap_region *r, snap_ctx **ctx)
{
	snap_close(*ctx);
	*ctx = NULL;
	int rc = snap_open(cfg, ctx);
	return rc ? rc : snap_register(*ctx, r);
}

/* Restore of the newest step from the node store into the buffers (every
 * chunk's CRC32C checked, then copied), after all saves: read through the
 * slot mapping this process's saves made... */
static int phase_restore(struct rank_run *k, int rc)
{
	for (int it = -1; it < k->iters; it++) {
		pthread_barrier_wait(k->bar);
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns(), got;
		rc = snap_restore(k->ctx, SNAP_STEP_LATEST, &got);
		if (it >= 0)
			k->res[NRES * it + 2] = (snap_now_ns() - t0) / 1e9;
	}
	return rc;
}

/* ...and from a new context, as a relaunched trainer restores: it has
 * never mapped the slot, and (restore_verify auto) checks each chunk as
 * it copies it; then the same checking every chunk first (restore_verify
 * first), the saving context's way. Only snap_restore() is timed. */
static int phase_restore_new(struct rank_run *k, int rc)
{
	struct snap_config first = k->cfg;
	first.restore_verify = SNAP_VERIFY_FIRST;
	int iters = k->iters;
	for (int it = -1; it < 2 * iters + 1; it++) {
		pthread_barrier_wait(k->bar);
		if (!rc)
			rc = reopen(it < iters ? &k->cfg : &first, &k->r, &k->ctx);
		pthread_barrier_wait(k->bar);   /* every rank open before any restores */
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns(), got;
		rc = snap_restore(k->ctx, SNAP_STEP_LATEST, &got);
		if (it >= 0 && it < iters)
			k->res[NRES * it + 3] = (snap_now_ns() - t0) / 1e9;
		else if (it > iters)
			k->res[NRES * (it - iters - 1) + 5] = (snap_now_ns() - t0) / 1e9;
	}
	return rc;
}

/* User + system CPU seconds of this process, every thread. */
static double proc_cpu_s(void)
{
	struct rusage ru;
	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* ...and into buffers never touched, as a relaunched trainer that
 * allocates its tensors empty and restores into them: the copy meets
 * every page for the first time. Its own mapping, so it is fresh. */
static int phase_restore_fresh(struct rank_run *k, int rc)
{
	for (int it = -1; it < k->iters; it++) {
		pthread_barrier_wait(k->bar);
		void *fresh = MAP_FAILED;
		size_t len = k->r.bytes ? k->r.bytes : 1;
		if (!rc) {
			fresh = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			k->r.ptr = fresh;
			rc = fresh == MAP_FAILED ? SNAP_ENOMEM : reopen(&k->cfg, &k->r, &k->ctx);
		}
		pthread_barrier_wait(k->bar);
		if (!rc) {
			uint64_t t0 = snap_now_ns(), got;
			double c0 = proc_cpu_s();
			rc = snap_restore(k->ctx, SNAP_STEP_LATEST, &got);
			if (it >= 0) {
				k->res[NRES * it + 4] = (snap_now_ns() - t0) / 1e9;
				k->res[NRES * it + CPU_FRESH] = proc_cpu_s() - c0;
			}
			/* the bytes must be the saved ones, or the row measures nothing
			 * (a lossy codec's are not: only raw and lossless are checked) */
			int exact = k->d->codec == SNAP_CODEC_NONE || k->d->codec == SNAP_CODEC_LOSSLESS;
			for (uint64_t i = 0; exact && !rc && i < k->bytes / 4; i += 4093)
				if (memcmp(&((float *)fresh)[i], &k->buf[i], 4) != 0)
					rc = SNAP_ECORRUPT;
		}
		if (fresh != MAP_FAILED)
			munmap(fresh, len);
	}
	return rc;
}

/* The floor for a restore that reads the store through the page cache
 * (a new context on a store it does not map): read(2) of a file of the
 * same bytes beside the store, on the same file system, into a block
 * the size of the restore's bounce block; every rank at once. */
static int phase_read(struct rank_run *k, int rc)
{
	char rpath[PATH_MAX + 32];
	uint64_t bytes = k->bytes;
	snprintf(rpath, sizeof(rpath), "%s.read-%d", k->store, k->rank);
	int rfd = rc ? -1 : open(rpath, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	uint8_t *blk = malloc(READ_BLOCK);
	uint64_t put = 0;   /* write(2) moves at most ~2 GiB a call */
	for (ssize_t n = 1; !rc && rfd >= 0 && put < bytes && n > 0; put += n > 0 ? (uint64_t)n : 0)
		n = write(rfd, (const char *)k->buf + put, bytes - put);
	if (!rc && (rfd < 0 || !blk || put != bytes)) {
		fprintf(stderr, "bench rank %d: cannot write %s: %s\n", k->rank, rpath, strerror(errno));
		rc = SNAP_EIO;
	}
	for (int it = -1; it < k->iters; it++) {
		pthread_barrier_wait(k->bar);
		if (rc)
			continue;
		uint64_t t0 = snap_now_ns();
		for (uint64_t off = 0; off < bytes && !rc;) {
			ssize_t n = pread(rfd, blk, bytes - off < READ_BLOCK ? bytes - off : READ_BLOCK, (off_t)off);
			if (n <= 0)
				rc = SNAP_EIO;
			off += n > 0 ? (uint64_t)n : 0;
		}
		if (it >= 0)
			k->res[NRES * it + 6] = (snap_now_ns() - t0) / 1e9;
	}
	if (rfd >= 0) {
		close(rfd);
		unlink(rpath);
	}
	free(blk);
	return rc;
}

/* The ceiling of a restore into fresh buffers: memcpy, 1 thread, into a
 * mapping never touched (a new one each time), so the copy pays every
 * page fault as the restore does. Median wall seconds; *cpu the median
 * CPU seconds of the copy (faults included). */
double snapshot_memcpy_fresh(uint64_t bytes, int iters, double *cpu)
{
	uint8_t *src = malloc(bytes);
	double t[MAX_ITERS], c[MAX_ITERS];
	*cpu = -1;
	if (!src)
		return -1;
	memset(src, 1, bytes);
	for (int i = 0; i < iters; i++) {
		void *dst = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (dst == MAP_FAILED) {
			free(src);
			return -1;
		}
		double c0 = proc_cpu_s();
		uint64_t t0 = snap_now_ns();
		memcpy(dst, src, bytes);
		t[i] = (snap_now_ns() - t0) / 1e9;
		c[i] = proc_cpu_s() - c0;
		munmap(dst, bytes);
		src[i % bytes]++;
	}
	free(src);
	*cpu = bench_median(c, iters);
	return bench_median(t, iters);
}

int snapshot_restores(struct rank_run *k, int rc)
{
	rc = phase_restore(k, rc);
	rc = phase_restore_new(k, rc);
	rc = phase_restore_fresh(k, rc);
	return phase_read(k, rc);
}
