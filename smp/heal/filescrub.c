/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files, daemon side: the background scrub's share (scrub.c
 * drives it, in turn with the slots, on the same --scrub-rate budget).
 * Each committed file's data is re-read chunk by chunk and checked against
 * its manifest's CRC32C. A bad chunk is rewritten from the flushed copy at
 * the file's real path when that copy's chunk has the recorded CRC32C, and
 * checked again; otherwise the file is marked damaged (counted, logged, the
 * reason recorded in the store: snap/damage.h). A damaged file stays in
 * the store: its readers verify every chunk before their first read and
 * get EIO naming the chunk, never its bytes, and the flush refuses to copy
 * it. Removing it would let readers fall back to the real file, which may
 * be an older version: wrong bytes served silently.
 *
 * The data files are read through mappings kept from pass to pass
 * (store/slotmap.c, as the slots are: mapping each chunk afresh spent more
 * than the CRC filling and tearing down page tables), up to a cap: a job
 * may hold thousands of captured files, and each mapping is a VMA (the
 * kernel's vm.max_map_count is 65530 by default) and 2 MiB of page tables
 * per GiB read. The reads run under the SIGBUS guard: a data file
 * truncated behind the daemon's back loses pages under the mapping.
 *
 * Runs on the poll thread, which alone changes the namespace lists; the
 * flush thread only reads them and marks states, which this does not read.
 */
#include "files/files_int.h"
#include "heal/repair.h"
#include "store/slotmap.h"

/* The file under the cursor, moving on to the next job's files as needed:
 * NULL (and *wrapped) past the last job. */
static struct fent *cursor(struct snap_files *f, int *wrapped)
{
	for (;;) {
		while (f->scrub_e && (f->scrub_e->damaged || !f->scrub_e->size)) {
			f->scrub_e = f->scrub_e->next;
			f->scrub_chunk = 0;
		}
		if (f->scrub_e)
			return f->scrub_e;
		f->scrub_j = f->scrub_in ? f->scrub_j->next : f->jobs;
		f->scrub_in = f->scrub_j != NULL;
		if (!f->scrub_j) {
			*wrapped = 1;
			return NULL;
		}
		f->scrub_e = f->scrub_j->head;
		f->scrub_chunk = 0;
	}
}

/* CRC32C of len bytes at off of fd (heal.c's guarded mapping): 0, or -1 when short or unreadable. */
static int crc_of(int fd, uint64_t off, size_t len, uint8_t *buf, size_t bufsize, uint32_t *crc, uint64_t *read)
{
	if (smp_heal_crc(fd, off, len, buf, bufsize, crc))
		return -1;
	*read += len;
	return 0;
}

/* Chunk k of e from its real path into its data file, checked before and after: 1 repaired, 0 not (why said). */
static int repair_chunk(struct fjob *j, struct fent *e, uint32_t k, char *err, size_t errlen)
{
	const struct snap_fman *m = &e->man;
	uint64_t off = (uint64_t)k * m->chunk;
	size_t len = m->size - off < m->chunk ? (size_t)(m->size - off) : m->chunk;
	int rfd = open(e->path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	uint8_t *buf = NULL;
	int ok = 0, dfd = -1;
	if (rfd < 0) {
		snap_fmt(err, errlen, "its flushed copy %s cannot be opened: %s", e->path, strerror(errno));
		goto out;
	}
	if (fstat(rfd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != m->size) {
		snap_fmt(err, errlen, "its flushed copy %s is not this version (%" PRIu64 " bytes, not %" PRIu64 ")",
			 e->path, (uint64_t)st.st_size, m->size);
		goto out;
	}
	if (!(buf = malloc(len ? len : 1))) {
		snap_fmt(err, errlen, "out of memory");
		goto out;
	}
	size_t got = 0;
	while (got < len) {
		ssize_t n = pread(rfd, buf + got, len - got, (off_t)(off + got));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	/* Nothing is taken from a copy whose own checksum does not match. */
	if (got != len || snap_crc32c(buf, len) != m->crc[k]) {
		snap_fmt(err, errlen, "its flushed copy %s does not hold chunk %u as committed (CRC32C differs)",
			 e->path, k);
		goto out;
	}
	char name[17];
	snap_fman_data_name(e->id, name);
	dfd = openat(j->datafd, name, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0 || pwrite(dfd, buf, len, (off_t)off) != (ssize_t)len) {
		snap_fmt(err, errlen, "cannot rewrite its data %s: %s", name, strerror(errno));
		goto out;
	}
	uint32_t crc;
	uint64_t ignored = 0;
	ok = crc_of(dfd, off, len, buf, len ? len : 1, &crc, &ignored) == 0 && crc == m->crc[k];
	if (!ok)
		snap_fmt(err, errlen, "chunk %u still fails its CRC32C after it was rewritten", k);
out:
	free(buf);
	if (rfd >= 0)
		close(rfd);
	if (dfd >= 0)
		close(dfd);
	return ok;
}

/* Chunk k of e failed: repair it, or mark e damaged. */
static void on_bad(struct snap_files *f, struct fjob *j, struct fent *e, uint32_t k, struct smp_heal *h)
{
	char why[FILES_PATH_MAX + 256] = "";
	char name[17];
	snap_fman_data_name(e->id, name);
	snap_store_logf(f->store, "scrub: captured file %s (job %s): chunk %u of %u fails its CRC32C in the node store "
			"(data %s)", e->path, j->name, k, e->man.nchunks, name);
	if (repair_chunk(j, e, k, why, sizeof(why))) {
		h->repaired_chunks++;
		snap_store_logf(f->store, "scrub: captured file %s (job %s): chunk %u repaired from its flushed copy",
				e->path, j->name, k);
		return;
	}
	e->damaged = 1;
	h->damaged_files++;
	char what[FILES_PATH_MAX + 32], how[sizeof(why) + 160];
	snprintf(what, sizeof(what), "captured file %s", e->path);
	snprintf(how, sizeof(how), "chunk %u of %u fails its CRC32C in the node store and %s; its readers get EIO",
		 k, e->man.nchunks, why);
	snap_store_logf(f->store, "scrub: captured file %s (job %s) is damaged beyond repair: %s", e->path, j->name,
			how);
	smp_heal_damage(h, f->store, j->name, what, how);
}

void snap_files_scrub_maps_init(struct snap_slotmaps *mm)
{
	*mm = (struct snap_slotmaps){ .lazy = 1, .max_maps = FILES_SCRUB_MAPS, .max_bytes = FILES_SCRUB_MAP_BYTES };
}

/* The path of e's data file (for its mapping): 0, or -1 when too long. */
static int data_path(const struct fjob *j, const struct fent *e, char *out, size_t cap)
{
	char name[17];
	snap_fman_data_name(e->id, name);
	return snprintf(out, cap, "%s/data/%s", j->dir, name) >= (int)cap ? -1 : 0;
}

/* Chunk k (len bytes at off) of e, checked: 1 good, 0 bad. Through the
 * kept mapping of its data file (*map, looked up once per file and call),
 * else read from *fd (opened when first needed). */
static int chunk_ok(struct snap_files *f, struct fjob *j, struct fent *e, uint32_t k, uint64_t off, size_t len,
		    struct snap_slotmaps *mm, const uint8_t **map, int *fd, uint8_t *buf, size_t bufsize,
		    uint64_t *read)
{
	char path[SNAP_FILE_MAX + 32], err[SNAP_FILE_MAX + 128];
	uint32_t crc = 0;
	int rc = -2;
	if (!*map && mm && *fd < 0 && data_path(j, e, path, sizeof(path)) == 0)
		*map = snap_slotmap_get(mm, path, e->size, err, sizeof(err));
	if (*map && (rc = smp_heal_crc_mapped(*map + off, len, &crc)) == 0)
		*read += len;
	if (rc == -1) {
		/* SIGBUS: pages lost under the mapping (the file was cut short) */
		snap_store_logf(f->store, "scrub: captured file %s (job %s): its data file lost pages under the scrub's "
				"mapping (truncated?)", e->path, j->name);
		return 0;
	}
	if (rc == -2) {   /* not mapped (shorter than committed, unmappable), or no guard */
		if (*fd < 0) {
			char name[17];
			snap_fman_data_name(e->id, name);
			*fd = openat(j->datafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		}
		if (*fd < 0 || crc_of(*fd, off, len, buf, bufsize, &crc, read))
			return 0;
	}
	return crc == e->man.crc[k];
}

uint64_t snap_files_scrub(struct snap_files *f, struct smp_heal *h, struct snap_slotmaps *mm, uint8_t *buf,
			  size_t bufsize, int64_t budget, uint64_t deadline_ns, int *wrapped, unsigned *seen)
{
	*wrapped = 0;
	if (!f) {
		*wrapped = 1;
		return 0;
	}
	uint64_t read = 0;
	int fd = -1;
	const uint8_t *map = NULL;
	const struct fent *cur = NULL;   /* the file fd or map is of */
	while ((int64_t)read < budget && snap_now_ns() < deadline_ns) {
		struct fent *e = cursor(f, wrapped);
		if (!e)
			break;
		struct fjob *j = f->scrub_j;
		if (f->scrub_chunk >= e->man.nchunks) {
			f->scrub_e = e->next;
			f->scrub_chunk = 0;
			(*seen)++;
			continue;
		}
		if (cur != e) {
			if (fd >= 0)
				close(fd);
			fd = -1;
			map = NULL;
			cur = e;
		}
		uint32_t k = f->scrub_chunk;
		uint64_t off = (uint64_t)k * e->man.chunk;
		size_t len = e->size - off < e->man.chunk ? (size_t)(e->size - off) : e->man.chunk;
		uint64_t before = read;
		int ok = chunk_ok(f, j, e, k, off, len, mm, &map, &fd, buf, bufsize, &read);
		if (read == before)
			read += 4096;   /* an unreadable chunk still costs something */
		f->scrub_chunk++;
		if (!ok) {
			if (fd >= 0)
				close(fd);
			fd = -1;
			map = NULL;
			cur = NULL;
			char path[SNAP_FILE_MAX + 32];
			if (mm && data_path(j, e, path, sizeof(path)) == 0)
				snap_slotmap_drop(mm, path);   /* read afresh after the repair */
			on_bad(f, j, e, k, h);
		}
	}
	if (fd >= 0)
		close(fd);
	return read;
}
