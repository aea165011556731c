/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files, daemon side: the flush thread, which copies committed
 * files to their real paths (temp file, fsync, rename, directory fsync),
 * skipping those whose real file already holds the bytes.
 */
#include "files/files_int.h"

static struct fent *pick(struct snap_files *f)
{
	for (struct fjob *j = f->jobs; j; j = j->next) {
		if (!f->cfg->flush_files && !j->urgent)
			continue;
		for (struct fent *e = j->head; e; e = e->next)
			if (e->state == F_DIRTY && !e->failed)
				return e;
	}
	return NULL;
}

/* Does the real file hold exactly these bytes already (a flush before a restart)? */
static int real_matches(const char *path, const struct snap_fman *m)
{
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	int ok = fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == m->size;
	uint8_t *buf = ok && m->size ? malloc(m->chunk) : NULL;
	if (ok && m->size && !buf)
		ok = 0;
	for (uint64_t off = 0, i = 0; ok && off < m->size; off += m->chunk, i++) {
		size_t len = m->size - off < m->chunk ? (size_t)(m->size - off) : m->chunk, got = 0;
		while (got < len) {
			ssize_t r = pread(fd, buf + got, len - got, (off_t)(off + got));
			if (r <= 0) {
				ok = 0;
				break;
			}
			got += (size_t)r;
		}
		ok = ok && snap_crc32c(buf, len) == m->crc[i];
	}
	free(buf);
	if (fd >= 0)
		close(fd);
	return ok;
}

int files_write_all(int fd, const uint8_t *p, size_t len)
{
	while (len) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

/*
 * Copy one committed file to a temporary name beside its real path, checking
 * every chunk against its CRC first (a bit flipped in memory since the
 * commit is never persisted). 1: the real file already holds these bytes.
 */
static int flush_copy(int datafd, const char *path, const struct snap_fman *m, int check_real, char *tmp,
		      size_t tmpcap, char *err, size_t errlen)
{
	if (check_real && real_matches(path, m))
		return 1;
	char name[17];
	snap_fman_data_name(m->id, name);
	int dfd = openat(datafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (dfd < 0 || fstat(dfd, &st) != 0 || (uint64_t)st.st_size != m->size) {
		snap_fmt(err, errlen, "its data in the store is gone or has changed size");
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	/* pread into one chunk buffer: it stays in cache for the CRC and the
	 * write, where a mapping of the tmpfs file reads at a third the speed. */
	uint8_t *buf = m->size ? malloc(m->chunk) : NULL;
	int rc = -1, fd = -1;
	if (m->size && !buf) {
		snap_fmt(err, errlen, "out of memory");
		goto out;
	}
	if (files_flush_tmp_name(path, m->id, tmp, tmpcap)) {
		snap_fmt(err, errlen, "path too long");
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		snap_fmt(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		goto out;
	}
	for (uint64_t off = 0, i = 0; off < m->size; off += m->chunk, i++) {
		size_t len = m->size - off < m->chunk ? (size_t)(m->size - off) : m->chunk, got = 0;
		while (got < len) {
			ssize_t r = pread(dfd, buf + got, len - got, (off_t)(off + got));
			if (r <= 0) {
				snap_fmt(err, errlen, "cannot read its data: %s", r < 0 ? strerror(errno) : "short");
				goto out;
			}
			got += (size_t)r;
		}
		if (snap_crc32c(buf, len) != m->crc[i]) {
			snap_fmt(err, errlen, "chunk %" PRIu64 " in node memory no longer matches its CRC32C (not flushed)", i);
			goto out;
		}
		if (files_write_all(fd, buf, len)) {
			snap_fmt(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
			goto out;
		}
	}
	/* The mode the creating process asked for (or set later), whatever
	 * snapsmp's umask; the mtime of its commit, or the one it set itself. */
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
				  { .tv_sec = (time_t)(m->mtime_ns / 1000000000ull), .tv_nsec = (long)(m->mtime_ns % 1000000000ull) } };
	if (fchmod(fd, m->mode & 07777) != 0 || futimens(fd, ts) != 0 || fsync(fd) != 0) {
		snap_fmt(err, errlen, "cannot sync %s: %s", tmp, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	if (fd >= 0 && close(fd) != 0 && rc == 0) {
		snap_fmt(err, errlen, "cannot close %s: %s", tmp, strerror(errno));
		rc = -1;
	}
	if (rc && fd >= 0)
		unlink(tmp);
	free(buf);
	close(dfd);
	return rc;
}

/* The namespace on disk still names this id at path (nobody else changed it under us). */
static int manifest_names(struct fjob *j, const char *path, uint64_t id)
{
	int fd = openat(j->nsfd, path + 1, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	uint8_t buf[48];
	ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf), 0) : -1;
	if (fd >= 0)
		close(fd);
	if (n < 32 || memcmp(buf, SNAP_FMAN_MAGIC, 8))
		return 0;
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = v << 8 | buf[24 + k];
	return v == id;
}

static void fsync_dir_of(const char *path)
{
	char dir[FILES_PATH_MAX];
	const char *base;
	files_split_path(path, dir, sizeof(dir), &base);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

void *files_flusher(void *arg)
{
	struct snap_files *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->stop) {
		struct fent *e = pick(f);
		if (!e) {
			for (struct fjob *j = f->jobs; j; j = j->next)
				if (j->urgent) {
					j->urgent = 0;
					files_notify(f);
				}
			pthread_cond_wait(&f->cv, &f->mu);
			continue;
		}
		e->state = F_FLUSHING;
		struct fjob *j = e->job;
		char *path = strdup(e->path);
		int check = e->check_real, datafd = j->datafd;
		struct snap_fman m = e->man;   /* crc[] stays owned by e, which outlives the copy */
		pthread_mutex_unlock(&f->mu);

		char tmp[FILES_PATH_MAX + 64] = "", why[512] = "";
		uint64_t t0 = snap_now_ns();
		int rc = path ? flush_copy(datafd, path, &m, check, tmp, sizeof(tmp), why, sizeof(why)) : -1;
		if (!path)
			snprintf(why, sizeof(why), "out of memory");

		pthread_mutex_lock(&f->mu);
		char *final = NULL;
		int dead = e->dead;
		if (dead) {
			if (rc == 0)
				unlink(tmp);
			files_free_entry(e);   /* e is gone from here on */
		} else if (rc < 0) {
			e->state = F_DIRTY;
			e->failed = ++e->tries >= 3;
			if (e->failed)
				snap_store_logf(f->store, "captured file %s (job %s) not flushed: %s", e->path, j->name, why);
		} else if (rc == 1) {
			e->state = F_CLEAN;
		} else if (!manifest_names(j, e->path, e->id)) {
			/* Removed from the namespace behind our back (a preloaded process
			 * whose snapsmp was down): this copy is older than the real file. */
			unlink(tmp);
			e->state = F_DIRTY;
			e->failed = 1;
			snap_store_logf(f->store, "captured file %s (job %s) not flushed: its manifest no longer names "
					"copy %016" PRIx64 " (changed by another process)", e->path, j->name, e->id);
		} else if (rename(tmp, e->path) != 0) {
			/* Renamed meanwhile (its directory too, or to another file
			 * system), or its directory went away: copy again. */
			int er = errno;
			unlink(tmp);
			e->state = F_DIRTY;
			e->failed = ++e->tries >= 3;
			if (e->failed)
				snap_store_logf(f->store, "captured file %s (job %s) not flushed: rename: %s", e->path,
						j->name, strerror(er));
		} else {
			e->tries = 0;
			e->state = F_CLEAN;
			final = strdup(e->path);
			snap_store_logf(f->store, "flushed captured file %s (%" PRIu64 " bytes, %.3f s)", e->path,
					e->size, (double)(snap_now_ns() - t0) / 1e9);
		}
		if (!dead)
			e->check_real = 0;
		files_notify(f);
		pthread_mutex_unlock(&f->mu);
		if (final)
			fsync_dir_of(final);   /* the rename is durable too */
		free(final);
		free(path);
		pthread_mutex_lock(&f->mu);
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}
