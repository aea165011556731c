/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files on the preload's side: the store's namespace read
 * directly (a committed file's manifest, its data opened and verified once
 * per process), and changed by this process itself, under the store's
 * files lock, when no snapsmp runs.
 */
#include "capfiles_int.h"

/* Store files whose chunks this process has verified (by id), so a second open does not reread them. */
#define VERIFIED 64
static uint64_t verified[VERIFIED];
static unsigned nverified;
pthread_mutex_t plf_ver_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- the store, read directly ------------------------------------------- */

/*
 * The committed manifest of abs: 1 (in *m, free with snap_fman_free), 0 not
 * in the store, -1 present but unreadable or corrupt (errno EIO, message said).
 */
int plf_store_lookup(const char *abs, struct snap_fman *m)
{
	char p[PATH_MAX];
	if (plf_ns_path(abs, p, sizeof(p)))
		return 0;
	int fd = pl_real.openat(AT_FDCWD, p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return 0;
	struct stat st;
	if (pl_real.fstatat(fd, "", &st, AT_EMPTY_PATH) != 0 || !S_ISREG(st.st_mode) || st.st_size > SNAP_FMAN_MAX) {
		pl_real.close(fd);
		return 0;
	}
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
	pl_real.close(fd);
	char why[256];
	int rc = got == st.st_size ? snap_fman_decode(buf, (size_t)got, m, why, sizeof(why)) : SNAP_EIO;
	free(buf);
	if (rc) {
		pl_say("%s: its manifest in the node store (%s) is unusable: %s", abs, p, got == st.st_size ? why : "short read");
		errno = EIO;
		return -1;
	}
	return 1;
}

static int was_verified(uint64_t id)
{
	pthread_mutex_lock(&plf_ver_mu);
	int yes = 0;
	for (unsigned i = 0; i < VERIFIED && !yes; i++)
		yes = verified[i] == id;
	pthread_mutex_unlock(&plf_ver_mu);
	return yes;
}

static void mark_verified(uint64_t id)
{
	pthread_mutex_lock(&plf_ver_mu);
	verified[nverified++ % VERIFIED] = id;
	pthread_mutex_unlock(&plf_ver_mu);
}

/*
 * Open the data of a committed file with `flags` (read-only), after checking
 * every chunk against its CRC32C once per process: a flipped bit in node
 * memory is an error naming the file and chunk, never silently read.
 */
static int open_data(const char *abs, const struct snap_fman *m, int flags)
{
	char dp[PATH_MAX];
	plf_data_path(m->id, dp, sizeof(dp));
	int fd = pl_real.openat(AT_FDCWD, dp, (flags & ~(O_CREAT | O_EXCL | O_TRUNC | O_DIRECTORY)) | O_NOFOLLOW);
	if (fd < 0)
		return -1;   /* ENOENT: replaced or removed meanwhile; the caller looks again */
	struct stat st;
	if (pl_real.fstatat(fd, "", &st, AT_EMPTY_PATH) != 0 || (uint64_t)st.st_size != m->size) {
		pl_real.close(fd);
		errno = ENOENT;
		return -1;
	}
	if (m->size && !was_verified(m->id)) {
		int vfd = pl_real.openat(AT_FDCWD, dp, O_RDONLY | O_CLOEXEC);
		const uint8_t *p = vfd >= 0 ? mmap(NULL, m->size, PROT_READ, MAP_SHARED, vfd, 0) : MAP_FAILED;
		if (vfd >= 0)
			pl_real.close(vfd);
		int64_t bad = p == MAP_FAILED ? -2 : snap_fman_verify(m, p);
		if (p != MAP_FAILED)
			munmap((void *)p, m->size);
		if (bad != -1) {
			if (bad >= 0)
				pl_say("%s in the node store is corrupt: chunk %" PRId64 " of %u fails its CRC32C; refusing to "
				       "read it", abs, bad, m->nchunks);
			else
				pl_say("%s: cannot map its data %s to verify it: %s", abs, dp, strerror(errno));
			pl_real.close(fd);
			errno = EIO;
			return -1;
		}
		mark_verified(m->id);
	}
	return fd;
}

/* Read-only open of a committed store file: fd, -2 not in the store, -1 error. */
int plf_open_committed(const char *abs, int flags)
{
	for (int tries = 0; tries < 16; tries++) {
		struct snap_fman m;
		int r = plf_store_lookup(abs, &m);
		if (r <= 0)
			return r == 0 ? -2 : -1;
		int fd = open_data(abs, &m, flags);
		int e = errno;
		snap_fman_free(&m);
		if (fd >= 0 || e != ENOENT) {
			errno = e;
			return fd;
		}
	}
	errno = EIO;
	return -1;
}

/* ---- changing the namespace ------------------------------------------------
 *
 * Only snapsmp changes the store's namespace while it runs. When none runs,
 * a preloaded process may change it itself, but only holding the files
 * lock that a running snapsmp holds for its whole life: so a snapsmp that
 * starts meanwhile scans a namespace nobody changes under it, and a
 * process never edits what a live snapsmp has in memory.
 */

/* The store's files lock: a descriptor holding it, NO_STORE when the job has no captured-file store at all, or -1 (snapsmp holds it). */
#define NO_STORE (-2)
static int try_store_lock(void)
{
	char p[PATH_MAX];
	if (snprintf(p, sizeof(p), "%s/%s/files/lock", pl_cfg.store, pl_cfg.job) >= (int)sizeof(p))
		return NO_STORE;
	int fd = pl_real.openat(AT_FDCWD, p, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? NO_STORE : -1;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		pl_real.close(fd);
		return -1;
	}
	return fd;
}

void plf_store_unlock(int fd)
{
	if (fd >= 0)
		pl_real.close(fd);   /* releases the flock */
}

/*
 * Send a namespace request answered by an errno (FRENAME, FUNLINK). 0: the
 * daemon answered, *e is the result. 1: no snapsmp runs and *lockfd holds
 * the files lock (or NO_STORE): the caller does it itself. *uncertain: an
 * earlier attempt reached a snapsmp that died before answering, so the
 * change may be done already.
 */
int plf_mutate(uint16_t type, const struct snap_wbuf *req, uint32_t *e, int *lockfd, int *uncertain)
{
	uint64_t deadline = snap_now_ns() + (uint64_t)pl_cfg.timeout_ms * 1000000ull;
	*uncertain = 0;
	*lockfd = -1;
	*e = 0;
	for (;;) {
		void *pl;
		uint32_t len;
		char msg[256];
		int sent, rc = pl_rpc_ex(type, req, &pl, &len, msg, sizeof(msg), 1, &sent);
		if (rc == 0) {
			struct snap_rbuf r;
			snap_rbuf_init(&r, pl, len);
			*e = snap_get_u32(&r);
			if (r.bad)
				*e = EIO;
			free(pl);
			return 0;
		}
		if (rc != SNAP_ESMP) {
			pl_say("snapsmp refused a namespace request: %s", msg);
			*e = EIO;
			return 0;
		}
		*uncertain |= sent;
		int fd = try_store_lock();
		if (fd != -1) {
			*lockfd = fd;
			return 1;
		}
		if (snap_now_ns() > deadline) {
			pl_say("snapsmp at %s holds the store but does not answer (SNAP_TIMEOUT_MS=%u)", pl_cfg.socket,
			       pl_cfg.timeout_ms);
			*e = EIO;
			return 0;
		}
		usleep(10000);   /* a snapsmp starting up: it listens once its scan is done */
	}
}

/* mkdir -p of the namespace directories above ns path p (under the lock). */
void plf_ns_parents(const char *p)
{
	char b[PATH_MAX];
	snprintf(b, sizeof(b), "%s", p);
	for (char *c = b + strlen(pl_cfg.ns) + 1; (c = strchr(c, '/')); c++) {
		*c = '\0';
		mkdir(b, 0700);
		*c = '/';
	}
}

/* Remove abs from the store's namespace only: a real file is about to stand there instead. */
void plf_store_forget(const char *abs)
{
	struct snap_fman m;
	if (plf_store_lookup(abs, &m) <= 0)
		return;
	snap_fman_free(&m);
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, abs);
	snap_put_u8(&w, 1);
	uint32_t e;
	int lockfd, unsure;
	if (plf_mutate(SNAP_MSG_FUNLINK, &w, &e, &lockfd, &unsure) == 1) {
		/* The manifest goes; its data is garbage the next snapsmp removes at start. */
		char p[PATH_MAX];
		if (lockfd >= 0 && !plf_ns_path(abs, p, sizeof(p)))
			pl_real.unlinkat(AT_FDCWD, p, 0);
		plf_store_unlock(lockfd);
	}
	snap_wbuf_free(&w);
}
