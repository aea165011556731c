/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The self-healing counters' reason for damage beyond repair: kept in
 * memory for STATUS and in the store's record (snap/damage.h), so that it
 * outlives the daemon. Used by the repair of slots (repair.c) and the scrub
 * of captured files (filescrub.c); logs through the store's callback.
 * And the scrub's read of a stored range, which both use.
 */
#include <errno.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/busguard.h"
#include "heal/repair.h"
#include "snap/damage.h"

void smp_heal_damage(struct smp_heal *h, const struct snap_store *s, const char *job, const char *what,
		     const char *why)
{
	struct snap_damage d = { .time_s = (uint64_t)time(NULL) };
	snprintf(d.job, sizeof(d.job), "%s", job);
	snprintf(d.what, sizeof(d.what), "%s", what);
	snprintf(d.why, sizeof(d.why), "%s", why);
	snap_damage_line(&d, h->last_damage, sizeof(h->last_damage));
	char err[SNAP_FILE_MAX + 128];
	if (snap_damage_record(s->root, &d, err, sizeof(err)))
		snap_store_logf(s, "%s (the reason is kept until this daemon stops)", err);
}

void smp_heal_load(struct smp_heal *h, const struct snap_store *s)
{
	struct snap_damage d;
	if (snap_damage_load(s->root, &d, 1) == 1) {
		snap_damage_line(&d, h->last_damage, sizeof(h->last_damage));
		snap_store_logf(s, "last damage beyond repair recorded in the store: %s", h->last_damage);
	}
}

/*
 * The scrub reads through a mapping: pread() of tmpfs spent about 80% of
 * the scrub's CPU time copying into its buffer (perf: _copy_to_iter,
 * filemap_get_entry) and 8% in the CRC itself. A mapping of a file that is
 * truncated behind the daemon's back raises SIGBUS on the lost pages, so
 * the CRC over it runs under base/busguard.c's guard.
 */
void smp_heal_guard_init(void)
{
	smp_bus_guard_init();
}

static int crc_pread(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, uint32_t *crc)
{
	uint32_t c = 0;
	for (uint64_t done = 0; done < len;) {
		size_t k = len - done < bufsize ? (size_t)(len - done) : bufsize;
		ssize_t n = pread(fd, buf, k, (off_t)(off + done));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		c = snap_crc32c_update(c, buf, (size_t)n);
		done += (uint64_t)n;
	}
	*crc = c;
	return 0;
}

int smp_heal_crc(int fd, uint64_t off, uint64_t len, uint8_t *buf, size_t bufsize, uint32_t *crc)
{
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < off + len)
		return -1;   /* short: its bytes are gone */
	if (!len) {
		*crc = 0;
		return 0;
	}
	const uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE), moff = off / pg * pg;
	const size_t mlen = (size_t)(off + len - moff);
	void *p = mmap(NULL, mlen, PROT_READ, MAP_SHARED, fd, (off_t)moff);
	if (p == MAP_FAILED)
		return crc_pread(fd, off, len, buf, bufsize, crc);
	/* The page tables in one call, not a fault per 64 KiB. */
	madvise(p, mlen, MADV_POPULATE_READ);
	int rc = smp_heal_crc_mapped((const uint8_t *)p + (off - moff), (size_t)len, crc);
	munmap(p, mlen);
	return rc == -2 ? crc_pread(fd, off, len, buf, bufsize, crc) : rc;   /* -2: no guard */
}

struct crc_job {
	const uint8_t *p;
	size_t len;
	uint32_t crc;
};

static void crc_run(void *arg)
{
	struct crc_job *c = arg;
	c->crc = snap_crc32c(c->p, c->len);
}

int smp_heal_crc_mapped(const uint8_t *p, size_t len, uint32_t *crc)
{
	struct crc_job c = { p, len, 0 };
	int rc = smp_bus_guarded(crc_run, &c);
	if (rc == 0)
		*crc = c.crc;
	return rc;
}
