/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files on the preload's side: which descriptors are store files,
 * opening (create in the store, or read from it), budget growth, commit at
 * the last close, the fall back to the file system, and the namespace
 * operations (stat, rename, unlink, listings) merged with the real
 * directory. docs/design.md, "Captured files (LD_PRELOAD)".
 *
 * Visibility: a committed file is visible to every preloaded process of the
 * job; a file being written is visible (stat, open) only to the process
 * writing it, and appears for everyone at its close. A process killed while
 * writing therefore leaves nothing behind: snapsmp discards the data of a
 * connection that closed without committing.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "snap/base.h"
#include "preload.h"
#include "snap/wire.h"

_Atomic(struct pl_file *) pl_tab[PL_MAXFD];
static pthread_mutex_t tab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pl_file *writing;    /* files this process is writing (tab_mu) */
static atomic_int maxfd;           /* highest descriptor ever tracked */

/* Store files whose chunks this process has verified (by id), so a second open does not reread them. */
#define VERIFIED 64
static uint64_t verified[VERIFIED];
static unsigned nverified;
static pthread_mutex_t ver_mu = PTHREAD_MUTEX_INITIALIZER;

/* ---- small helpers ------------------------------------------------------- */

static void data_path(uint64_t id, char *out, size_t cap)
{
	char name[17];
	snap_fman_data_name(id, name);
	if (snprintf(out, cap, "%s/%s", pl_cfg.data, name) >= (int)cap)
		out[0] = '\0';   /* cannot happen: pl_cfg.data is checked at start */
}

static int ns_path(const char *abs, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s%s", pl_cfg.ns, abs);
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

static void set_tab(int fd, struct pl_file *p)
{
	if ((unsigned)fd >= PL_MAXFD)
		return;
	atomic_store_explicit(&pl_tab[fd], p, memory_order_release);
	int m = atomic_load(&maxfd);
	while (fd > m && !atomic_compare_exchange_weak(&maxfd, &m, fd)) {
	}
}

static void free_file(struct pl_file *p)
{
	if (p->kind == PL_WRITE && p->rfd >= 0)
		pl_real.close(p->rfd);
	for (size_t i = 0; i < p->nnames; i++)
		free(p->names[i]);
	free(p->names);
	free(p->seen);
	free(p->data);
	free(p->path);
	if (p->kind == PL_WRITE)
		pthread_mutex_destroy(&p->mu);
	free(p);
}

/* A file this process is writing at abs, or NULL (tab_mu held). */
static struct pl_file *find_writing(const char *abs)
{
	for (struct pl_file *p = writing; p; p = p->wnext)
		if (!p->unlinked && strcmp(p->path, abs) == 0)
			return p;
	return NULL;
}

static void unlist_writing(struct pl_file *p)
{
	for (struct pl_file **pp = &writing; *pp; pp = &(*pp)->wnext)
		if (*pp == p) {
			*pp = p->wnext;
			return;
		}
}

static int split_dir(const char *abs, char *dir, size_t cap)
{
	const char *s = strrchr(abs, '/');
	size_t dl = s == abs ? 1 : (size_t)(s - abs);
	if (dl >= cap)
		return -1;
	memcpy(dir, abs, dl);
	dir[dl] = '\0';
	return 0;
}

static int copy_range(int from, int to, uint64_t len)
{
	off_t in = 0, out = 0;
	while ((uint64_t)in < len) {
		ssize_t n = pl_real.copy_file_range ? pl_real.copy_file_range(from, &in, to, &out, len - (uint64_t)in, 0) : -1;
		if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
			n = sendfile(to, from, &in, len - (uint64_t)in);   /* pl_real not needed: `to` is ours */
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
	}
	return 0;
}

/* ---- the store, read directly ------------------------------------------- */

/*
 * The committed manifest of abs: 1 (in *m, free with snap_fman_free), 0 not
 * in the store, -1 present but unreadable or corrupt (errno EIO, message said).
 */
static int store_lookup(const char *abs, struct snap_fman *m)
{
	char p[PATH_MAX];
	if (ns_path(abs, p, sizeof(p)))
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
	pthread_mutex_lock(&ver_mu);
	int yes = 0;
	for (unsigned i = 0; i < VERIFIED && !yes; i++)
		yes = verified[i] == id;
	pthread_mutex_unlock(&ver_mu);
	return yes;
}

static void mark_verified(uint64_t id)
{
	pthread_mutex_lock(&ver_mu);
	verified[nverified++ % VERIFIED] = id;
	pthread_mutex_unlock(&ver_mu);
}

/*
 * Open the data of a committed file with `flags` (read-only), after checking
 * every chunk against its CRC32C once per process: a flipped bit in node
 * memory is an error naming the file and chunk, never silently read.
 */
static int open_data(const char *abs, const struct snap_fman *m, int flags)
{
	char dp[PATH_MAX];
	data_path(m->id, dp, sizeof(dp));
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
static int open_committed(const char *abs, int flags)
{
	for (int tries = 0; tries < 16; tries++) {
		struct snap_fman m;
		int r = store_lookup(abs, &m);
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

static void store_unlock(int fd)
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
static int mutate(uint16_t type, const struct snap_wbuf *req, uint32_t *e, int *lockfd, int *uncertain)
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
static void ns_parents(const char *p)
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
static void store_forget(const char *abs)
{
	struct snap_fman m;
	if (store_lookup(abs, &m) <= 0)
		return;
	snap_fman_free(&m);
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, abs);
	snap_put_u8(&w, 1);
	uint32_t e;
	int lockfd, unsure;
	if (mutate(SNAP_MSG_FUNLINK, &w, &e, &lockfd, &unsure) == 1) {
		/* The manifest goes; its data is garbage the next snapsmp removes at start. */
		char p[PATH_MAX];
		if (lockfd >= 0 && !ns_path(abs, p, sizeof(p)))
			pl_real.unlinkat(AT_FDCWD, p, 0);
		store_unlock(lockfd);
	}
	snap_wbuf_free(&w);
}

/* ---- open ---------------------------------------------------------------- */

static void track_new(int fd, struct pl_file *p)
{
	pthread_mutex_lock(&tab_mu);
	p->refs = 1;
	if (p->kind == PL_WRITE) {
		p->wnext = writing;
		writing = p;
	}
	set_tab(fd, p);
	pthread_mutex_unlock(&tab_mu);
}

void pl_track_dir(int fd, const char *abs)
{
	if ((unsigned)fd >= PL_MAXFD)
		return;
	struct pl_file *p = calloc(1, sizeof(*p));
	if (!p || !(p->path = strdup(abs))) {
		free(p);
		return;
	}
	p->kind = PL_DIR;
	track_new(fd, p);
}

static int request_grow(struct pl_file *p, uint64_t bytes, char *msg, size_t msglen)
{
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, p->id);
	snap_put_u64(&w, bytes);
	void *pl;
	uint32_t len;
	int rc = pl_rpc(SNAP_MSG_FGROW, &w, &pl, &len, msg, msglen);
	snap_wbuf_free(&w);
	if (rc == 0) {
		free(pl);
		atomic_store(&p->granted, bytes);
	}
	return rc;
}

static void send_abort(uint64_t id)
{
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, id);
	void *pl;
	uint32_t len;
	char msg[128];
	if (pl_rpc(SNAP_MSG_FABORT, &w, &pl, &len, msg, sizeof(msg)) == 0)
		free(pl);
	snap_wbuf_free(&w);
}

/* A hidden name beside abs for bytes that go to the file system (renamed over abs at close). */
static int fallback_name(const char *abs, char *out, size_t cap)
{
	static atomic_uint seq;
	char dir[PATH_MAX];
	if (split_dir(abs, dir, sizeof(dir)))
		return -1;
	int n = snprintf(out, cap, "%s/.%s.snapfallback-%d-%u", strcmp(dir, "/") ? dir : "", strrchr(abs, '/') + 1,
			 (int)getpid(), atomic_fetch_add(&seq, 1));
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* Copy the current bytes of abs (a file this process writes, a committed one, a real one) into wfd. */
static int copy_current(const char *abs, int wfd)
{
	pthread_mutex_lock(&tab_mu);
	struct pl_file *cur = find_writing(abs);
	char cp[PATH_MAX] = "";
	if (cur)
		snprintf(cp, sizeof(cp), "%s", cur->data);
	pthread_mutex_unlock(&tab_mu);
	int src = cp[0] ? pl_real.openat(AT_FDCWD, cp, O_RDONLY | O_CLOEXEC) : open_committed(abs, O_RDONLY | O_CLOEXEC);
	if (src == -2)
		src = pl_real.openat(AT_FDCWD, abs, O_RDONLY | O_CLOEXEC);
	struct stat st;
	int rc = src >= 0 && pl_real.fstatat(src, "", &st, AT_EMPTY_PATH) == 0 ? copy_range(src, wfd, (uint64_t)st.st_size) : -1;
	if (src >= 0)
		pl_real.close(src);
	return rc;
}

static struct pl_file *new_write(const char *abs, int acc, int flags, uint32_t fmode)
{
	struct pl_file *p = calloc(1, sizeof(*p));
	if (!p || !(p->path = strdup(abs))) {
		free(p);
		return NULL;
	}
	p->kind = PL_WRITE;
	p->accmode = acc;
	p->append = (flags & O_APPEND) != 0;
	p->mode = fmode;
	p->owner = getpid();
	p->rfd = -1;
	pthread_mutex_init(&p->mu, NULL);
	return p;
}

#define KEEP_FLAGS (O_ACCMODE | O_APPEND | O_CLOEXEC | O_NONBLOCK | O_SYNC | O_DSYNC | O_NOATIME)

/*
 * The file system instead of the store (no snapsmp, or it refused): the
 * bytes go to a hidden temporary beside abs, renamed over abs at the last
 * close. So even here a process killed mid-write leaves no torn file.
 */
static int open_fallback(const char *abs, int flags, uint32_t fmode, int exists)
{
	char tmp[PATH_MAX + 64];
	struct pl_file *p = new_write(abs, flags & O_ACCMODE, flags, fmode);
	if (!p || fallback_name(abs, tmp, sizeof(tmp)) || !(p->data = strdup(tmp))) {
		if (p)
			free_file(p);
		errno = ENOMEM;
		return -1;
	}
	p->realtmp = 1;
	atomic_store(&p->fallen, 1);
	int fd = pl_real.openat(AT_FDCWD, tmp, (flags & KEEP_FLAGS) | O_CREAT | O_EXCL | O_NOFOLLOW, fmode);
	int e = errno;
	if (fd >= 0 && !(flags & O_TRUNC) && exists) {
		int wfd = pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CLOEXEC);
		if (wfd < 0 || copy_current(abs, wfd) != 0)
			e = errno, pl_real.close(fd), fd = -1;
		if (wfd >= 0)
			pl_real.close(wfd);
	}
	if (fd >= 0)
		p->rfd = pl_real.openat(AT_FDCWD, tmp, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || p->rfd < 0 || (unsigned)fd >= PL_MAXFD) {
		if (fd >= 0)
			e = EMFILE, pl_real.close(fd);
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		free_file(p);
		errno = e;
		return -1;
	}
	track_new(fd, p);
	return fd;
}

int pl_open(int dirfd, const char *path, int flags, mode_t mode, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if ((flags & O_PATH) || (flags & O_TMPFILE) == O_TMPFILE || !pl_resolve(dirfd, path, abs))
		return -1;
	*handled = 1;
	int acc = flags & O_ACCMODE, writing_ = acc != O_RDONLY || (flags & O_TRUNC);
	struct stat rst;
	if ((flags & O_DIRECTORY) || !writing_) {
		if (!(flags & O_DIRECTORY)) {
			/* A file this process is writing, then the store, then the real file. */
			pthread_mutex_lock(&tab_mu);
			struct pl_file *w = find_writing(abs);
			char dp[PATH_MAX] = "";
			if (w)
				snprintf(dp, sizeof(dp), "%s", w->data);
			pthread_mutex_unlock(&tab_mu);
			if (dp[0])
				return pl_real.openat(AT_FDCWD, dp, flags & ~(O_CREAT | O_EXCL));
			int fd = open_committed(abs, flags);
			if (fd != -2)
				return fd;
		}
		int fd = pl_real.openat(dirfd, path, flags, mode);
		if (fd >= 0 && pl_real.fstatat(fd, "", &rst, AT_EMPTY_PATH) == 0 && S_ISDIR(rst.st_mode))
			pl_track_dir(fd, abs);
		return fd;
	}

	/* Writing. What exists at abs now: a file of ours being written, a committed one, a real one. */
	struct snap_fman m;
	uint32_t old_mode = 0;   /* an existing file keeps its mode, as with open(2) */
	int in_store = store_lookup(abs, &m);
	if (in_store < 0)
		in_store = 0;   /* unreadable manifest: a new file replaces it */
	if (in_store) {
		old_mode = m.mode;
		snap_fman_free(&m);
	}
	pthread_mutex_lock(&tab_mu);
	struct pl_file *cur = find_writing(abs);
	int in_writing = cur != NULL;
	if (cur)
		old_mode = cur->mode;
	pthread_mutex_unlock(&tab_mu);
	int in_real = pl_real.fstatat(AT_FDCWD, abs, &rst, 0) == 0;
	if (in_real && S_ISDIR(rst.st_mode)) {
		errno = EISDIR;
		return -1;
	}
	if (in_real && !in_store && !in_writing)
		old_mode = rst.st_mode & 07777;
	int exists = in_store || in_writing || in_real;
	if ((flags & O_CREAT) && (flags & O_EXCL) && exists) {
		errno = EEXIST;
		return -1;
	}
	if (!(flags & O_CREAT) && !exists) {
		errno = ENOENT;
		return -1;
	}
	char dir[PATH_MAX];
	struct stat dst;
	if (split_dir(abs, dir, sizeof(dir)) || pl_real.fstatat(AT_FDCWD, dir, &dst, 0) != 0) {
		errno = ENOENT;
		return -1;
	}
	if (!S_ISDIR(dst.st_mode)) {
		errno = ENOTDIR;
		return -1;
	}
	uint32_t fmode = exists ? old_mode : (uint32_t)(mode & ~atomic_load(&pl_umask) & 07777);
	if (!pl_connected())
		return open_fallback(abs, flags, fmode, exists);   /* warned once by pl_connected */
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, abs);
	snap_put_u32(&w, fmode);
	snap_put_u8(&w, (flags & O_CREAT) && (flags & O_EXCL) ? 1 : 0);
	void *pl;
	uint32_t len;
	char msg[512];
	int rc = pl_rpc(SNAP_MSG_FCREATE, &w, &pl, &len, msg, sizeof(msg));
	snap_wbuf_free(&w);
	uint32_t err = 0;
	uint64_t id = 0;
	if (rc == 0) {
		struct snap_rbuf r;
		snap_rbuf_init(&r, pl, len);
		err = snap_get_u32(&r);
		id = snap_get_u64(&r);
		if (r.bad)
			rc = SNAP_EPROTO;
		free(pl);
	}
	if (rc == 0 && err == EEXIST) {
		errno = EEXIST;
		return -1;
	}
	if (rc || err) {
		pl_warn_once(PL_WARN_FALLBACK, "%s: the node store refused it (%s); writing it to the file system", abs,
			     rc ? msg : strerror((int)err));
		return open_fallback(abs, flags, fmode, exists);
	}
	struct pl_file *p = new_write(abs, acc, flags, fmode);
	char dp[PATH_MAX];
	data_path(id, dp, sizeof(dp));
	if (!p || !(p->data = strdup(dp))) {
		if (p)
			free_file(p);
		send_abort(id);
		errno = ENOMEM;
		return -1;
	}
	p->id = id;
	int fd = pl_real.openat(AT_FDCWD, dp, (flags & KEEP_FLAGS) | O_NOFOLLOW);
	p->rfd = fd >= 0 ? pl_real.openat(AT_FDCWD, dp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW) : -1;
	int ok = fd >= 0 && p->rfd >= 0 && (unsigned)fd < PL_MAXFD;
	if (ok && !(flags & O_TRUNC) && exists) {
		/* Opened for update: the new version starts as a copy of the current one. */
		struct stat st;
		int wfd = pl_real.openat(AT_FDCWD, dp, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
		ok = wfd >= 0 && copy_current(abs, wfd) == 0 && pl_real.fstatat(wfd, "", &st, AT_EMPTY_PATH) == 0 &&
		     (!st.st_size || request_grow(p, (uint64_t)st.st_size, msg, sizeof(msg)) == 0);
		if (wfd >= 0)
			pl_real.close(wfd);
	}
	if (!ok) {
		if (fd >= 0)
			pl_real.close(fd);
		send_abort(id);
		free_file(p);
		pl_warn_once(PL_WARN_FALLBACK, "%s: cannot prepare its store file; writing it to the file system", abs);
		return open_fallback(abs, flags, fmode, exists);
	}
	track_new(fd, p);
	return fd;
}

/* ---- growth, fallback, commit -------------------------------------------- */

/* Replace every descriptor naming p with realfd's file description, keeping each one's close-on-exec flag. */
static void redirect(struct pl_file *p, int realfd)
{
	int top = atomic_load(&maxfd);
	for (int fd = 0; fd <= top && fd < PL_MAXFD; fd++) {
		if (atomic_load(&pl_tab[fd]) != p)
			continue;
		int cloexec = pl_real.fcntl(fd, F_GETFD) & FD_CLOEXEC;
		pl_real.dup3(realfd, fd, cloexec ? O_CLOEXEC : 0);
	}
}

/*
 * Move a file being written to the file system (the store is full, or
 * snapsmp went away): a hidden temporary beside its path gets what was
 * written so far and takes the place of the store file under the
 * application's descriptors (dup3 onto the same numbers, same offset), so
 * the application carries on without noticing; the last close renames it
 * over the path. Under p->mu.
 */
static int fall_back(struct pl_file *p, int fd, const char *why)
{
	if (atomic_load(&p->fallen))
		return 0;
	char tmp[PATH_MAX + 64];
	int acc = p->accmode == O_RDONLY ? O_RDWR : p->accmode;
	int realfd = fallback_name(p->path, tmp, sizeof(tmp)) ? -1 :
		pl_real.openat(AT_FDCWD, tmp, acc | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, p->mode);
	struct stat st;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	int rfd = realfd >= 0 ? pl_real.openat(AT_FDCWD, tmp, O_RDONLY | O_CLOEXEC) : -1;
	char *data = rfd >= 0 ? strdup(tmp) : NULL;
	if (!data || pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) != 0 ||
	    copy_range(p->rfd, realfd, (uint64_t)st.st_size) != 0) {
		pl_say("%s: cannot move it to the file system after \"%s\": %s", p->path, why, strerror(errno));
		if (realfd >= 0) {
			pl_real.close(realfd);
			pl_real.unlinkat(AT_FDCWD, tmp, 0);
		}
		if (rfd >= 0)
			pl_real.close(rfd);
		free(data);
		return -1;
	}
	if (pos >= 0)
		lseek(realfd, pos, SEEK_SET);
	if (p->append)
		pl_real.fcntl(realfd, F_SETFL, O_APPEND);
	redirect(p, realfd);
	pl_real.close(realfd);
	pthread_mutex_lock(&tab_mu);
	pl_real.close(p->rfd);
	p->rfd = rfd;
	free(p->data);
	p->data = data;
	p->realtmp = 1;
	pthread_mutex_unlock(&tab_mu);
	atomic_store(&p->fallen, 1);
	send_abort(p->id);
	pl_warn_once(PL_WARN_FULL, "%s; %s and further captured files that do not fit go to the file system", why,
		     p->path);
	return 0;
}

void pl_prewrite(struct pl_file *p, int fd, int64_t off, uint64_t n)
{
	if (p->kind != PL_WRITE || atomic_load(&p->fallen) || p->owner != getpid())
		return;
	uint64_t end;
	if (off >= 0) {
		end = (uint64_t)off + n;
	} else {
		struct stat st;
		off_t cur = p->append ? (pl_real.fstatat(fd, "", &st, AT_EMPTY_PATH) == 0 ? st.st_size : 0)
				      : lseek(fd, 0, SEEK_CUR);
		end = (uint64_t)(cur > 0 ? cur : 0) + n;
	}
	if (end <= atomic_load(&p->granted))
		return;
	pthread_mutex_lock(&p->mu);
	if (end > atomic_load(&p->granted) && !atomic_load(&p->fallen)) {
		/* Reserve ahead (25%, at least 8 MiB) so a big file asks a few dozen times, not per write. */
		uint64_t want = end + end / 4;
		want = want < (8u << 20) ? (8u << 20) : (want + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
		char msg[512];
		int rc = request_grow(p, want, msg, sizeof(msg));
		if (rc == SNAP_ENOSPC)   /* near the budget: just what this write needs */
			rc = request_grow(p, (end + 4095) & ~(uint64_t)4095, msg, sizeof(msg));
		if (rc == SNAP_ENOSPC)
			fall_back(p, fd, msg);
		else if (rc)
			fall_back(p, fd, "snapsmp went away while the file was written");
	}
	pthread_mutex_unlock(&p->mu);
}

int pl_write_failed(struct pl_file *p, int fd)
{
	if (p->kind != PL_WRITE || p->owner != getpid() || atomic_load(&p->fallen))
		return 0;
	pthread_mutex_lock(&p->mu);
	int ok = fall_back(p, fd, "the node store's file system is full (ENOSPC)") == 0;
	pthread_mutex_unlock(&p->mu);
	return ok;
}

/* Put a finished temporary in place of its path: first the store's older copy goes, so it can never shadow this one. */
static int install_real(const char *tmp, const char *path)
{
	store_forget(path);
	if (pl_real.renameat(AT_FDCWD, tmp, AT_FDCWD, path) != 0) {
		int e = errno;
		pl_say("%s: cannot rename %s into place: %s", path, tmp, strerror(e));
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		errno = EIO;
		return -1;
	}
	return 0;
}

/*
 * The file could not be committed to the store (snapsmp died, refused):
 * write what the application wrote to its real path, atomically (temporary
 * name, fsync, rename), so the checkpoint survives the middleware.
 */
static int save_to_disk(struct pl_file *p, const char *why)
{
	char tmp[PATH_MAX + 64];
	struct stat st;
	int fd = fallback_name(p->path, tmp, sizeof(tmp)) ? -1 :
		pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, p->mode);
	int ok = fd >= 0 && pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) == 0 &&
		 copy_range(p->rfd, fd, (uint64_t)st.st_size) == 0 && fsync(fd) == 0;
	int e = errno;
	if (fd >= 0 && pl_real.close(fd) != 0)
		ok = 0;
	if (!ok) {
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		pl_say("%s: LOST: not committed to the node store (%s) and not writable to the file system (%s)", p->path,
		       why, strerror(e));
		errno = EIO;
		return -1;
	}
	pl_warn_once(PL_WARN_FALLBACK, "%s: not committed to the node store (%s); written to the file system instead",
		     p->path, why);
	return install_real(tmp, p->path);
}

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

static int file_crcs(int fd, uint64_t size, uint32_t chunk, uint32_t n, uint32_t *crc)
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
		else
			jobs[k].failed = -1;   /* this thread did it not: do its share below */
	crc_worker(&jobs[0]);
	int failed = jobs[0].failed;
	for (unsigned k = 1; k < t; k++) {
		if (started & (1u << k))
			pthread_join(th[k], NULL);
		else
			crc_worker(&(struct crc_job){ .fd = fd, .size = size, .chunk = chunk, .n = n, .first = k, .step = t, .crc = crc });
		failed |= jobs[k].failed > 0;
	}
	return failed ? -1 : 0;
}

static int commit(struct pl_file *p)
{
	struct stat st;
	if (pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) != 0)
		return save_to_disk(p, "its data vanished");
	uint64_t size = (uint64_t)st.st_size;
	uint32_t chunk = pl_cfg.chunk, n = snap_fman_nchunks(size, chunk);
	uint32_t *crc = malloc(sizeof(uint32_t) * (n ? n : 1));
	if (!crc || file_crcs(p->rfd, size, chunk, n, crc) != 0) {
		free(crc);
		return save_to_disk(p, "cannot checksum it (out of memory or a read error)");
	}
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, p->id);
	snap_put_u64(&w, size);
	snap_put_u32(&w, chunk);
	snap_put_u32(&w, n);
	for (uint32_t i = 0; i < n; i++)
		snap_put_u32(&w, crc[i]);
	free(crc);
	void *pl;
	uint32_t len;
	char msg[512];
	int rc = pl_rpc(SNAP_MSG_FCOMMIT, &w, &pl, &len, msg, sizeof(msg));
	snap_wbuf_free(&w);
	if (rc == 0) {
		free(pl);
		return 0;
	}
	return save_to_disk(p, msg);
}

int pl_release(struct pl_file *p, int failed)
{
	pthread_mutex_lock(&tab_mu);
	int last = --p->refs == 0;
	if (last && p->kind == PL_WRITE)
		unlist_writing(p);
	pthread_mutex_unlock(&tab_mu);
	if (!last)
		return 0;
	int rc = 0;
	if (p->kind == PL_WRITE && p->owner == getpid()) {
		if (p->realtmp) {
			if (p->unlinked || failed)
				pl_real.unlinkat(AT_FDCWD, p->data, 0);
			else
				rc = install_real(p->data, p->path);
		} else if (p->unlinked || failed) {
			send_abort(p->id);
		} else {
			rc = commit(p);
		}
	}
	free_file(p);
	return rc;
}

int pl_dup_track(int oldfd, int newfd)
{
	if (newfd < 0 || oldfd == newfd)
		return 0;
	struct pl_file *p = pl_get(oldfd);
	struct pl_file *prev = (unsigned)newfd < PL_MAXFD ? atomic_exchange(&pl_tab[newfd], NULL) : NULL;
	if (p) {
		pthread_mutex_lock(&tab_mu);
		p->refs++;
		set_tab(newfd, p);
		pthread_mutex_unlock(&tab_mu);
	}
	/* dup2 onto a tracked descriptor closed it. */
	return prev ? pl_release(prev, 0) : 0;
}

/* ---- stat, access -------------------------------------------------------- */

static void patch_stat(struct stat *st, const struct snap_fman *m)
{
	st->st_mode = S_IFREG | (m->mode & 07777);
	st->st_size = (off_t)m->size;
	st->st_nlink = 1;
	st->st_mtim.tv_sec = (time_t)(m->mtime_ns / 1000000000ull);
	st->st_mtim.tv_nsec = (long)(m->mtime_ns % 1000000000ull);
	st->st_ctim = st->st_mtim;
}

/* The stat of abs as the store sees it: 1 found, 0 not ours, -1 error. */
static int store_stat(const char *abs, struct stat *st)
{
	pthread_mutex_lock(&tab_mu);
	struct pl_file *w = find_writing(abs);
	int rfd = w ? pl_real.dup(w->rfd) : -1;
	uint32_t mode = w ? w->mode : 0;
	pthread_mutex_unlock(&tab_mu);
	if (rfd >= 0) {
		int rc = pl_real.fstatat(rfd, "", st, AT_EMPTY_PATH);
		pl_real.close(rfd);
		st->st_mode = S_IFREG | mode;
		return rc == 0 ? 1 : -1;
	}
	for (int tries = 0; tries < 16; tries++) {
		struct snap_fman m;
		int r = store_lookup(abs, &m);
		if (r <= 0)
			return r;
		char dp[PATH_MAX];
		data_path(m.id, dp, sizeof(dp));
		int ok = pl_real.fstatat(AT_FDCWD, dp, st, 0) == 0;
		if (ok)
			patch_stat(st, &m);
		snap_fman_free(&m);
		if (ok)
			return 1;
	}
	errno = EIO;
	return -1;
}

int pl_stat(int dirfd, const char *path, struct stat *st, int flags, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (((flags & AT_EMPTY_PATH) && path && !path[0]) || !pl_resolve(dirfd, path, abs))
		return -1;
	int r = store_stat(abs, st);
	if (r == 0)
		return -1;
	*handled = 1;
	return r > 0 ? 0 : -1;
}

int pl_statx(int dirfd, const char *path, int flags, unsigned mask, struct statx *sx, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (((flags & AT_EMPTY_PATH) && path && !path[0]) || !pl_resolve(dirfd, path, abs) || !pl_real.statx)
		return -1;
	struct stat st;
	int r = store_stat(abs, &st);
	if (r == 0)
		return -1;
	*handled = 1;
	if (r < 0)
		return -1;
	memset(sx, 0, sizeof(*sx));
	sx->stx_mask = STATX_BASIC_STATS & (mask | STATX_BASIC_STATS);
	sx->stx_blksize = (uint32_t)st.st_blksize;
	sx->stx_nlink = (uint32_t)st.st_nlink;
	sx->stx_uid = st.st_uid;
	sx->stx_gid = st.st_gid;
	sx->stx_mode = (uint16_t)st.st_mode;
	sx->stx_ino = st.st_ino;
	sx->stx_size = (uint64_t)st.st_size;
	sx->stx_blocks = (uint64_t)st.st_blocks;
	sx->stx_atime.tv_sec = st.st_atim.tv_sec;
	sx->stx_atime.tv_nsec = (uint32_t)st.st_atim.tv_nsec;
	sx->stx_mtime.tv_sec = st.st_mtim.tv_sec;
	sx->stx_mtime.tv_nsec = (uint32_t)st.st_mtim.tv_nsec;
	sx->stx_ctime.tv_sec = st.st_ctim.tv_sec;
	sx->stx_ctime.tv_nsec = (uint32_t)st.st_ctim.tv_nsec;
	sx->stx_dev_major = major(st.st_dev);
	sx->stx_dev_minor = minor(st.st_dev);
	return 0;
}

int pl_access(int dirfd, const char *path, int mode, int *handled)
{
	char abs[PATH_MAX];
	struct stat st;
	*handled = 0;
	if (!pl_resolve(dirfd, path, abs))
		return -1;
	int r = store_stat(abs, &st);
	if (r == 0)
		return -1;
	*handled = 1;
	if (r < 0)
		return -1;
	if ((mode & X_OK) && !(st.st_mode & 0111)) {
		errno = EACCES;
		return -1;
	}
	return 0;
}

/* ---- rename, unlink, truncate -------------------------------------------- */

static int exists_anywhere(const char *abs)
{
	struct stat st;
	return store_stat(abs, &st) != 0 || pl_real.fstatat(AT_FDCWD, abs, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/* Move a store file out of the captured directories: its bytes to `to`, then unlink it. */
static int move_out(const char *from, const char *to)
{
	int src = open_committed(from, O_RDONLY | O_CLOEXEC);
	if (src < 0)
		return -1;
	char tmp[PATH_MAX + 32];
	struct stat st;
	snprintf(tmp, sizeof(tmp), "%s.snapmove-%d", to, (int)getpid());
	pl_real.fstatat(src, "", &st, AT_EMPTY_PATH);
	int fd = pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, st.st_mode & 07777);
	int ok = fd >= 0 && copy_range(src, fd, (uint64_t)st.st_size) == 0;
	int e = errno;
	pl_real.close(src);
	if (fd >= 0 && pl_real.close(fd) != 0)
		ok = 0;
	if (ok && pl_real.renameat(AT_FDCWD, tmp, AT_FDCWD, to) != 0)
		ok = 0, e = errno;
	if (!ok) {
		pl_real.unlinkat(AT_FDCWD, tmp, 0);
		errno = e;
		return -1;
	}
	int h;
	return pl_unlink(AT_FDCWD, from, 0, &h);
}

/* No snapsmp runs and we hold the files lock (or there is no store): rename in the namespace and on disk ourselves. */
static int rename_direct(int lockfd, const char *from, const char *to)
{
	char a[PATH_MAX], z[PATH_MAX], dir[PATH_MAX];
	struct snap_fman m;
	struct stat st;
	int in_store = lockfd >= 0 && store_lookup(from, &m) > 0;
	if (in_store)
		snap_fman_free(&m);
	if (in_store) {
		if (ns_path(from, a, sizeof(a)) || ns_path(to, z, sizeof(z)) || split_dir(to, dir, sizeof(dir))) {
			errno = ENAMETOOLONG;
			return -1;
		}
		if (pl_real.fstatat(AT_FDCWD, dir, &st, 0) != 0 || !S_ISDIR(st.st_mode)) {
			errno = ENOENT;
			return -1;
		}
		ns_parents(z);
		if (pl_real.renameat(AT_FDCWD, a, AT_FDCWD, z) != 0)
			return -1;
		/* A real copy of `from` (flushed or older) follows, so the disk keeps
		 * in step; the store's copy wins wherever they differ (the next
		 * snapsmp flushes it). */
		pl_real.renameat(AT_FDCWD, from, AT_FDCWD, to);
		return 0;
	}
	if (pl_real.fstatat(AT_FDCWD, from, &st, AT_SYMLINK_NOFOLLOW) != 0)
		return -1;
	if (lockfd >= 0 && !S_ISDIR(st.st_mode) && !ns_path(to, z, sizeof(z)))
		pl_real.unlinkat(AT_FDCWD, z, 0);   /* the store's `to` must not shadow the file that replaces it */
	return pl_real.renameat(AT_FDCWD, from, AT_FDCWD, to);
}

/* The other versions of `abs` go (a store copy, an older real file): the name belongs to an open file now. */
static void drop_other_versions(const char *abs)
{
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, abs);
	snap_put_u8(&b, 0);
	uint32_t e;
	int lockfd, unsure;
	if (mutate(SNAP_MSG_FUNLINK, &b, &e, &lockfd, &unsure) == 1) {
		char p[PATH_MAX];
		if (lockfd >= 0 && !ns_path(abs, p, sizeof(p)))
			pl_real.unlinkat(AT_FDCWD, p, 0);
		pl_real.unlinkat(AT_FDCWD, abs, 0);
		store_unlock(lockfd);
	}
	snap_wbuf_free(&b);
}

static void rename_writing(struct pl_file *w, const char *to)
{
	pthread_mutex_lock(&tab_mu);
	char *np = strdup(to);
	if (np) {
		free(w->path);
		w->path = np;
	}
	pthread_mutex_unlock(&tab_mu);
}

int pl_rename(int od, const char *old, int nd, const char *new, unsigned flags, int *handled)
{
	char from[PATH_MAX], to[PATH_MAX];
	int co = pl_resolve(od, old, from), cn = pl_resolve(nd, new, to);
	*handled = 0;
	if ((!co && !cn) || (flags & ~(unsigned)RENAME_NOREPLACE))
		return -1;
	*handled = 1;
	if ((flags & RENAME_NOREPLACE) && exists_anywhere(to)) {
		errno = EEXIST;
		return -1;
	}
	pthread_mutex_lock(&tab_mu);
	struct pl_file *w = co ? find_writing(from) : NULL;
	int wtmp = w && w->realtmp;
	pthread_mutex_unlock(&tab_mu);
	if (co && !cn) {
		if (w) {
			errno = EXDEV;   /* an open, uncommitted file cannot leave the store; movers copy on EXDEV */
			return -1;
		}
		struct stat st;
		if (store_stat(from, &st) > 0)
			return move_out(from, to);
		return pl_real.renameat(od, old, nd, new);
	}
	if (!co && cn) {
		/* A real file moves in: it replaces the store's copy of `to`. */
		struct stat st;
		if (pl_real.fstatat(od, old, &st, AT_SYMLINK_NOFOLLOW) != 0)
			return -1;
		if (!S_ISDIR(st.st_mode))
			store_forget(to);
		return pl_real.renameat(od, old, nd, new);
	}
	if (wtmp) {
		/* Open and headed for the file system: it takes the new name at its close. */
		drop_other_versions(from);
		rename_writing(w, to);
		return 0;
	}
	if (!w && !exists_anywhere(from)) {
		errno = ENOENT;
		return -1;
	}
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, from);
	snap_put_str(&b, to);
	snap_put_u8(&b, w ? 1 : 0);
	uint32_t e;
	int lockfd, unsure;
	int direct = mutate(SNAP_MSG_FRENAME, &b, &e, &lockfd, &unsure);
	snap_wbuf_free(&b);
	if (direct) {
		if (w) {
			/* Its commit will fail (its snapsmp is gone) and put it on disk under the new name. */
			e = 0;
			char p[PATH_MAX];
			if (lockfd >= 0 && !ns_path(from, p, sizeof(p)))
				pl_real.unlinkat(AT_FDCWD, p, 0);
			pl_real.unlinkat(AT_FDCWD, from, 0);
		} else {
			e = rename_direct(lockfd, from, to) == 0 ? 0 : (uint32_t)errno;
		}
		store_unlock(lockfd);
	}
	/* A snapsmp that died after doing it but before saying so. */
	if (e == ENOENT && unsure && exists_anywhere(to) && !exists_anywhere(from))
		e = 0;
	if (e) {
		errno = (int)e;
		return -1;
	}
	if (w)
		rename_writing(w, to);
	return 0;
}

int pl_unlink(int dirfd, const char *path, int flags, int *handled)
{
	char abs[PATH_MAX];
	*handled = 0;
	if (!pl_resolve(dirfd, path, abs))
		return -1;
	*handled = 1;
	if (flags & AT_REMOVEDIR) {
		/* Store files keep a directory non-empty even when the real one is empty. */
		char p[PATH_MAX];
		if (!ns_path(abs, p, sizeof(p))) {
			DIR *d = pl_real.opendir(p);
			struct dirent64 *e;
			int files = 0;
			while (d && (e = pl_real.readdir64(d)))
				files += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
			if (d)
				pl_real.closedir(d);
			if (files && pl_real.unlinkat(AT_FDCWD, p, AT_REMOVEDIR) != 0) {
				errno = ENOTEMPTY;
				return -1;
			}
			if (!files)
				pl_real.unlinkat(AT_FDCWD, p, AT_REMOVEDIR);
		}
		return pl_real.unlinkat(dirfd, path, AT_REMOVEDIR);
	}
	pthread_mutex_lock(&tab_mu);
	struct pl_file *w = find_writing(abs);
	if (w)
		w->unlinked = 1;   /* discarded at its close, like the inode of an unlinked open file */
	pthread_mutex_unlock(&tab_mu);
	struct snap_wbuf b = { 0 };
	snap_put_str(&b, abs);
	snap_put_u8(&b, 0);
	uint32_t e;
	int lockfd, unsure;
	if (mutate(SNAP_MSG_FUNLINK, &b, &e, &lockfd, &unsure) == 1) {
		char p[PATH_MAX];
		int in_store = lockfd >= 0 && !ns_path(abs, p, sizeof(p)) && pl_real.unlinkat(AT_FDCWD, p, 0) == 0;
		e = 0;
		if (pl_real.unlinkat(AT_FDCWD, abs, 0) != 0 && !(in_store && errno == ENOENT))
			e = (uint32_t)errno;
		store_unlock(lockfd);
	}
	snap_wbuf_free(&b);
	if (e == ENOENT && (w || unsure))
		e = 0;
	if (e) {
		errno = (int)e;
		return -1;
	}
	return 0;
}

int pl_truncate(const char *path, off_t len, int *handled)
{
	char abs[PATH_MAX];
	struct stat st;
	*handled = 0;
	if (!pl_resolve(AT_FDCWD, path, abs) || store_stat(abs, &st) <= 0)
		return -1;
	*handled = 1;
	/* A new version of the file, through the hooks (copy, truncate, commit). */
	int h, fd = pl_open(AT_FDCWD, abs, O_WRONLY | O_CLOEXEC, 0, &h);
	if (!h)
		return pl_real.truncate(path, len);
	if (fd < 0)
		return -1;
	struct pl_file *p = pl_get(fd);
	if (p)
		pl_prewrite(p, fd, 0, (uint64_t)len);
	int rc = pl_real.ftruncate(fd, len);
	int e = errno;
	struct pl_file *q = (unsigned)fd < PL_MAXFD ? atomic_exchange(&pl_tab[fd], NULL) : NULL;
	pl_real.close(fd);
	int rr = q ? pl_release(q, rc != 0) : 0;
	if (rc) {
		errno = e;
		return -1;
	}
	return rr;
}

/* ---- listings ------------------------------------------------------------ */

static int name_hidden(const char *n)
{
	/* the flush's and the fallback's temporary files */
	return n[0] == '.' && (strstr(n, ".snapflush-") || strstr(n, ".snapfallback-"));
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Names of the committed files in the store's copy of directory abs, sorted. */
static void list_store(const char *abs, char ***names, size_t *n)
{
	*names = NULL;
	*n = 0;
	char p[PATH_MAX];
	if (ns_path(abs, p, sizeof(p)))
		return;
	int dfd = pl_real.openat(AT_FDCWD, p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = dfd >= 0 ? pl_real.fdopendir(dfd) : NULL;
	if (!d) {
		if (dfd >= 0)
			pl_real.close(dfd);
		return;
	}
	size_t cap = 0;
	struct dirent64 *e;
	while ((e = pl_real.readdir64(d))) {
		struct stat st;
		if (e->d_type == DT_DIR || !strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if (e->d_type != DT_REG && (pl_real.fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISREG(st.st_mode)))
			continue;
		if (*n == cap) {
			cap = cap ? 2 * cap : 16;
			char **q = realloc(*names, cap * sizeof(*q));
			if (!q)
				break;
			*names = q;
		}
		if (!((*names)[*n] = strdup(e->d_name)))
			break;
		(*n)++;
	}
	pl_real.closedir(d);
	if (*n)
		qsort(*names, *n, sizeof(**names), cmp_str);
}

static ssize_t find_name(char **names, size_t n, const char *name)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		int c = strcmp(names[mid], name);
		if (c == 0)
			return (ssize_t)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

struct pl_dir {
	DIR *d;
	char **names;
	uint8_t *seen;
	size_t n, next;
	struct dirent64 ent;
	struct pl_dir *link;
};
static struct pl_dir *dirs;
static pthread_mutex_t dir_mu = PTHREAD_MUTEX_INITIALIZER;
atomic_int pl_ndirs;

void pl_dir_opened(DIR *d, const char *abs)
{
	struct pl_dir *x = calloc(1, sizeof(*x));
	if (!x)
		return;
	x->d = d;
	list_store(abs, &x->names, &x->n);
	x->seen = calloc(x->n ? x->n : 1, 1);
	pthread_mutex_lock(&dir_mu);
	x->link = dirs;
	dirs = x;
	atomic_fetch_add(&pl_ndirs, 1);
	pthread_mutex_unlock(&dir_mu);
}

static struct pl_dir *find_dir(DIR *d)
{
	struct pl_dir *x;
	pthread_mutex_lock(&dir_mu);
	for (x = dirs; x && x->d != d; x = x->link) {
	}
	pthread_mutex_unlock(&dir_mu);
	return x;
}

struct dirent64 *pl_readdir(DIR *d)
{
	struct pl_dir *x = find_dir(d);
	if (!x)
		return pl_real.readdir64(d);
	struct dirent64 *e;
	while ((e = pl_real.readdir64(d))) {
		if (name_hidden(e->d_name))
			continue;
		ssize_t i = find_name(x->names, x->n, e->d_name);
		if (i >= 0)
			x->seen[i] = 1;
		return e;
	}
	/* The real directory is exhausted: the store's files it does not have. */
	while (x->next < x->n && x->seen[x->next])
		x->next++;
	if (x->next == x->n)
		return NULL;
	const char *name = x->names[x->next++];
	memset(&x->ent, 0, sizeof(x->ent));
	x->ent.d_ino = 1 + (ino64_t)x->next;
	x->ent.d_type = DT_REG;
	x->ent.d_reclen = sizeof(x->ent);
	snprintf(x->ent.d_name, sizeof(x->ent.d_name), "%s", name);
	return &x->ent;
}

void pl_dir_rewound(DIR *d)
{
	struct pl_dir *x = find_dir(d);
	if (x) {
		memset(x->seen, 0, x->n ? x->n : 1);
		x->next = 0;
	}
}

void pl_dir_closed(DIR *d)
{
	pthread_mutex_lock(&dir_mu);
	for (struct pl_dir **pp = &dirs; *pp; pp = &(*pp)->link) {
		struct pl_dir *x = *pp;
		if (x->d != d)
			continue;
		*pp = x->link;
		atomic_fetch_sub(&pl_ndirs, 1);
		for (size_t i = 0; i < x->n; i++)
			free(x->names[i]);
		free(x->names);
		free(x->seen);
		free(x);
		break;
	}
	pthread_mutex_unlock(&dir_mu);
}

/* getdents64 on a captured directory descriptor: the real entries, then the store's. */
ssize_t pl_getdents(struct pl_file *p, int fd, void *buf, size_t n)
{
	if (!p->listed) {
		list_store(p->path, &p->names, &p->nnames);
		p->seen = calloc(p->nnames ? p->nnames : 1, 1);
		p->listed = 1;
	}
	ssize_t r = pl_real.getdents64(fd, buf, n);
	if (r > 0) {
		for (ssize_t off = 0; off < r;) {
			struct dirent64 *e = (struct dirent64 *)((char *)buf + off);
			ssize_t i = find_name(p->names, p->nnames, e->d_name);
			if (i >= 0 && p->seen)
				p->seen[i] = 1;
			off += e->d_reclen;
		}
		return r;
	}
	if (r < 0)
		return r;
	size_t used = 0;
	while (p->emitted < p->nnames) {
		size_t k = p->emitted;
		if (p->seen && p->seen[k]) {
			p->emitted++;
			continue;
		}
		size_t nl = strlen(p->names[k]);
		size_t rec = (offsetof(struct dirent64, d_name) + nl + 1 + 7) & ~(size_t)7;
		if (used + rec > n)
			break;
		struct dirent64 *e = (struct dirent64 *)((char *)buf + used);
		memset(e, 0, rec);
		e->d_ino = 1 + k;
		e->d_off = (off64_t)(used + rec);
		e->d_reclen = (unsigned short)rec;
		e->d_type = DT_REG;
		memcpy(e->d_name, p->names[k], nl + 1);
		used += rec;
		p->emitted++;
	}
	if (used == 0 && p->emitted < p->nnames) {
		errno = EINVAL;   /* buffer too small for one entry, as the kernel says */
		return -1;
	}
	return (ssize_t)used;
}

/* ---- fork ---------------------------------------------------------------- */

void pl_files_atfork_prepare(void)
{
	pthread_mutex_lock(&tab_mu);
	pthread_mutex_lock(&dir_mu);
	pthread_mutex_lock(&ver_mu);
}

void pl_files_atfork_parent(void)
{
	pthread_mutex_unlock(&ver_mu);
	pthread_mutex_unlock(&dir_mu);
	pthread_mutex_unlock(&tab_mu);
}

void pl_files_atfork_child(void)
{
	/* The child inherits the descriptors but not the files' ownership
	 * (p->owner): only the process that opened a file commits it. */
	pthread_mutex_unlock(&ver_mu);
	pthread_mutex_unlock(&dir_mu);
	pthread_mutex_unlock(&tab_mu);
}
