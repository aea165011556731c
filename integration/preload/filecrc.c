/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The checksums of a captured file at its commit (capfiles.c): CRC32C of every
 * chunk, read from the file itself on a few threads.
 */
#include <pthread.h>

#include "capfiles_int.h"

/*
 * CRC32C of every chunk, read with pread into a buffer that stays in cache:
 * about 2.5x faster than through a mapping of the tmpfs file (4 KiB page
 * faults and TLB misses), and a big file uses a few threads. The checksums
 * are taken here, after the last write, from the file itself: whatever
 * wrote the bytes (write, stdio, a shared mapping, a child process), the
 * manifest describes what is there.
 */
struct crc_job {
	int fd;
	uint64_t size;
	uint32_t chunk, n, first, step;
	uint32_t *crc;
	int failed;
};

static void *crc_worker(void *arg)
{
	struct crc_job *j = arg;
	uint8_t *buf = malloc(j->chunk);
	if (!buf) {
		j->failed = 1;
		return NULL;
	}
	for (uint32_t i = j->first; i < j->n && !j->failed; i += j->step) {
		uint64_t off = (uint64_t)i * j->chunk;
		size_t len = j->size - off < j->chunk ? (size_t)(j->size - off) : j->chunk, got = 0;
		while (got < len) {
			ssize_t r = pread(j->fd, buf + got, len - got, (off_t)(off + got));
			if (r <= 0) {
				j->failed = 1;
				break;
			}
			got += (size_t)r;
		}
		j->crc[i] = snap_crc32c(buf, len);
	}
	free(buf);
	return NULL;
}

int plf_file_crcs(int fd, uint64_t size, uint32_t chunk, uint32_t n, uint32_t *crc)
{
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned t = size >= (64u << 20) ? (unsigned)(cpus > 4 ? 4 : cpus > 1 ? cpus : 1) : 1;
	struct crc_job jobs[4];
	pthread_t th[4];
	unsigned started = 0;
	for (unsigned k = 0; k < t; k++)
		jobs[k] = (struct crc_job){ .fd = fd, .size = size, .chunk = chunk, .n = n, .first = k, .step = t, .crc = crc };
	for (unsigned k = 1; k < t; k++)
		if (pthread_create(&th[k], NULL, crc_worker, &jobs[k]) == 0)
			started |= 1u << k;
	crc_worker(&jobs[0]);
	int failed = jobs[0].failed;
	for (unsigned k = 1; k < t; k++) {
		if (started & (1u << k))
			pthread_join(th[k], NULL);
		else
			crc_worker(&jobs[k]);   /* no thread for this share: do it here */
		failed |= jobs[k].failed;
	}
	return failed ? -1 : 0;
}
