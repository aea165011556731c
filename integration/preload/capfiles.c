/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files on the preload's side: which descriptors are store files,
 * budget growth, commit at the last close, the fall back to the file system
 * and the export at a process's end; capopen.c opens them, nsread.c and
 * nsops.c hold the namespace (capfiles_int.h). docs/design/captured-files.md
 * has the model.
 *
 * Visibility: a committed file is visible to every preloaded process of the
 * job; a file being written is visible (stat, open) only to the process
 * writing it, and appears for everyone at its close. A process killed while
 * writing therefore leaves nothing behind: snapsmp discards the data of a
 * connection that closed without committing.
 */
#include "capfiles_int.h"

_Atomic(struct pl_file *) pl_tab[PL_MAXFD];
pthread_mutex_t plf_tab_mu = PTHREAD_MUTEX_INITIALIZER;
static struct pl_file *writing;    /* files this process is writing (plf_tab_mu) */
static atomic_int maxfd;           /* highest descriptor ever tracked */

/* ---- small helpers ------------------------------------------------------- */

static void apply_meta(struct pl_file *p, int fd);

void plf_data_path(uint64_t id, char *out, size_t cap)
{
	char name[17];
	snap_fman_data_name(id, name);
	if (snprintf(out, cap, "%s/%s", pl_cfg.data, name) >= (int)cap)
		out[0] = '\0';   /* cannot happen: pl_cfg.data is checked at start */
}

int plf_ns_path(const char *abs, char *out, size_t cap)
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

void plf_free_file(struct pl_file *p)
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

/* A file this process is writing at abs, or NULL (plf_tab_mu held). */
struct pl_file *plf_find_writing(const char *abs)
{
	for (struct pl_file *p = writing; p; p = p->wnext)
		if (!p->unlinked && !atomic_load(&p->exported) && strcmp(p->path, abs) == 0)
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

int plf_split_dir(const char *abs, char *dir, size_t cap)
{
	const char *s = strrchr(abs, '/');
	size_t dl = s == abs ? 1 : (size_t)(s - abs);
	if (dl >= cap)
		return -1;
	memcpy(dir, abs, dl);
	dir[dl] = '\0';
	return 0;
}

int plf_follow(char *abs)
{
	/* A real symbolic link under a captured directory may name a store file: follow it lexically. */
	for (int hops = 0; hops < 8; hops++) {
		struct stat st;
		char t[PATH_MAX], n[2 * PATH_MAX];
		if (pl_real.fstatat(AT_FDCWD, abs, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISLNK(st.st_mode))
			return hops > 0;
		ssize_t l = readlink(abs, t, sizeof(t) - 1);
		if (l <= 0)
			return 0;
		t[l] = '\0';
		if (t[0] == '/') {
			snprintf(n, sizeof(n), "%s", t);
		} else {
			char dir[PATH_MAX];
			if (plf_split_dir(abs, dir, sizeof(dir)))
				return 0;
			snprintf(n, sizeof(n), "%s/%s", dir, t);
		}
		if (pl_normalize(n, abs, PATH_MAX))
			return 0;
	}
	return 0;
}

void plf_data_mode(int fd, uint32_t mode)
{
	/* the program's fstat on its descriptor sees its mode; snapsmp keeps read and write */
	if (syscall(SYS_fchmod, fd, (mode | 0600) & 07777) != 0) {
		/* the manifest holds the mode all the same */
	}
}

int plf_copy_range(int from, int to, uint64_t len)
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

/* ---- tracking and the store's requests ---------------------------------- */

void plf_track_new(int fd, struct pl_file *p)
{
	pthread_mutex_lock(&plf_tab_mu);
	p->refs = 1;
	if (p->kind == PL_WRITE) {
		p->wnext = writing;
		writing = p;
	}
	set_tab(fd, p);
	pthread_mutex_unlock(&plf_tab_mu);
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
	plf_track_new(fd, p);
}

int plf_request_grow(struct pl_file *p, uint64_t bytes, char *err, size_t errlen)
{
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, p->id);
	snap_put_u64(&w, bytes);
	void *pl;
	uint32_t len;
	int rc = pl_rpc(SNAP_MSG_FGROW, &w, &pl, &len, err, errlen);
	snap_wbuf_free(&w);
	if (rc == 0) {
		free(pl);
		atomic_store(&p->granted, bytes);
	}
	return rc;
}

void plf_send_abort(uint64_t id)
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
int plf_fallback_name(const char *abs, char *out, size_t cap)
{
	static atomic_uint seq;
	char dir[PATH_MAX];
	if (plf_split_dir(abs, dir, sizeof(dir)))
		return -1;
	int n = snprintf(out, cap, "%s/.%s.snapfallback-%d-%u", strcmp(dir, "/") ? dir : "", strrchr(abs, '/') + 1,
			 (int)getpid(), atomic_fetch_add(&seq, 1));
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* ---- growth, fallback, commit -------------------------------------------- */

/* Replace every descriptor naming p with realfd's file description, keeping each one's close-on-exec flag. */
static void redirect(struct pl_file *p, int realfd)
{
	int top = atomic_load(&maxfd);
	for (int fd = 0; fd <= top && fd < PL_MAXFD; fd++) {
		if (atomic_load(&pl_tab[fd]) != p)
			continue;
		struct stat a, b;
		if (pl_real.fstatat(fd, "", &a, AT_EMPTY_PATH) != 0 || pl_real.fstatat(p->rfd, "", &b, AT_EMPTY_PATH) != 0 ||
		    a.st_dev != b.st_dev || a.st_ino != b.st_ino)
			continue;   /* a stale entry: that number names something else now */
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
/*
 * A real file holding p's bytes so far, at a hidden name beside its path
 * (tmp), opened as p was and at fd's offset: its descriptor, or -1 (errno)
 * with nothing left behind.
 */
static int copy_aside(struct pl_file *p, int fd, char *tmp, size_t cap)
{
	int acc = p->accmode == O_RDONLY ? O_RDWR : p->accmode;
	int realfd = plf_fallback_name(p->path, tmp, cap) ? -1 :
		pl_real.openat(AT_FDCWD, tmp, acc | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, p->mode);
	struct stat st;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	if (realfd < 0 || pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) != 0 ||
	    plf_copy_range(p->rfd, realfd, (uint64_t)st.st_size) != 0) {
		int e = errno;
		if (realfd >= 0) {
			pl_real.close(realfd);
			pl_real.unlinkat(AT_FDCWD, tmp, 0);
		}
		errno = e;
		return -1;
	}
	if (pos >= 0)
		lseek(realfd, pos, SEEK_SET);
	if (p->append)
		pl_real.fcntl(realfd, F_SETFL, O_APPEND);
	return realfd;
}

static int fall_back(struct pl_file *p, int fd, const char *why)
{
	if (atomic_load(&p->fallen))
		return 0;
	char tmp[PATH_MAX + 64];
	int realfd = copy_aside(p, fd, tmp, sizeof(tmp));
	int rfd = realfd >= 0 ? pl_hide_fd(pl_real.openat(AT_FDCWD, tmp, O_RDONLY | O_CLOEXEC)) : -1;
	char *data = rfd >= 0 ? strdup(tmp) : NULL;
	if (!data) {
		pl_say("%s: cannot move it to the file system after \"%s\": %s", p->path, why,
		       strerror(realfd < 0 || rfd < 0 ? errno : ENOMEM));
		if (realfd >= 0) {
			pl_real.close(realfd);
			pl_real.unlinkat(AT_FDCWD, tmp, 0);
		}
		if (rfd >= 0)
			pl_real.close(rfd);
		return -1;
	}
	redirect(p, realfd);
	pl_real.close(realfd);
	pthread_mutex_lock(&plf_tab_mu);
	pl_real.close(p->rfd);
	p->rfd = rfd;
	free(p->data);
	p->data = data;
	p->realtmp = 1;
	pthread_mutex_unlock(&plf_tab_mu);
	atomic_store(&p->fallen, 1);
	plf_send_abort(p->id);
	pl_warn_once(PL_WARN_FULL, "%s; %s and further captured files that do not fit go to the file system", why,
		     p->path);
	return 0;
}

void pl_prewrite(struct pl_file *p, int fd, int64_t off, uint64_t n)
{
	if (p->kind != PL_WRITE || atomic_load(&p->fallen) || p->owner != getpid())
		return;
	if (atomic_load_explicit(&p->tset, memory_order_relaxed))
		atomic_store(&p->tset, 0);   /* a write after futimens moves the mtime on, as on disk */
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
		int rc = plf_request_grow(p, want, msg, sizeof(msg));
		if (rc == SNAP_ENOSPC)   /* near the budget: just what this write needs */
			rc = plf_request_grow(p, (end + 4095) & ~(uint64_t)4095, msg, sizeof(msg));
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
int plf_install_real(const char *tmp, const char *path)
{
	plf_store_forget(path);
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
	int fd = plf_fallback_name(p->path, tmp, sizeof(tmp)) ? -1 :
		pl_real.openat(AT_FDCWD, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, p->mode);
	int ok = fd >= 0 && pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) == 0 &&
		 plf_copy_range(p->rfd, fd, (uint64_t)st.st_size) == 0 && fsync(fd) == 0;
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
	return plf_install_real(tmp, p->path);
}

static int commit(struct pl_file *p)
{
	struct stat st;
	if (pl_real.fstatat(p->rfd, "", &st, AT_EMPTY_PATH) != 0)
		return save_to_disk(p, "its data vanished");
	uint64_t size = (uint64_t)st.st_size;
	uint32_t chunk = pl_cfg.chunk, n = snap_fman_nchunks(size, chunk);
	uint32_t *crc = malloc(sizeof(uint32_t) * (n ? n : 1));
	if (!crc || plf_file_crcs(p->rfd, size, chunk, n, crc) != 0) {
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
	uint32_t set = (atomic_load(&p->mset) ? 1u : 0u) | (atomic_load(&p->tset) ? 2u : 0u);
	if (set) {
		snap_put_u32(&w, set);
		snap_put_u32(&w, p->mode);
		snap_put_u64(&w, atomic_load(&p->mtime_ns));
	}
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
	pthread_mutex_lock(&plf_tab_mu);
	int last = --p->refs == 0;
	if (last && p->kind == PL_WRITE)
		unlist_writing(p);
	pthread_mutex_unlock(&plf_tab_mu);
	if (!last)
		return 0;
	int rc = 0;
	if (p->kind == PL_WRITE && p->owner == getpid() && !atomic_load(&p->exported)) {
		if (p->realtmp) {
			if (p->unlinked || failed) {
				pl_real.unlinkat(AT_FDCWD, p->data, 0);
			} else {
				apply_meta(p, p->rfd);
				rc = plf_install_real(p->data, p->path);
			}
		} else if (p->unlinked || failed) {
			plf_send_abort(p->id);
		} else {
			rc = commit(p);
		}
	}
	plf_free_file(p);
	return rc;
}

int pl_dup_track(int oldfd, int newfd)
{
	if (newfd < 0 || oldfd == newfd)
		return 0;
	struct pl_file *p = pl_get(oldfd);
	struct pl_file *prev = (unsigned)newfd < PL_MAXFD ? atomic_exchange(&pl_tab[newfd], NULL) : NULL;
	if (p) {
		pthread_mutex_lock(&plf_tab_mu);
		p->refs++;
		set_tab(newfd, p);
		pthread_mutex_unlock(&plf_tab_mu);
	}
	/* dup2 onto a tracked descriptor closed it. */
	return prev ? pl_release(prev, 0) : 0;
}

/* ---- export: the file leaves the store for good ---------------------------- */

/* The times and mode the program set, onto a real descriptor. */
static void apply_meta(struct pl_file *p, int fd)
{
	if (fchmod(fd, p->mode & 07777) != 0) {
		/* the file keeps the mode it was created with */
	}
	if (atomic_load(&p->tset)) {
		uint64_t t = atomic_load(&p->mtime_ns);
		struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT },
					  { .tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull) } };
		futimens(fd, ts);
	}
}

/*
 * p becomes a plain file at its real path, now: its bytes so far go to a
 * temporary beside it, renamed over the path at once, and that real file
 * takes the store file's place under every descriptor of p (dup3 onto the
 * same numbers, same offset and flags). From here on the program writes a
 * real file, as without the preload, whichever process holds it and
 * whenever the last one closes it. A file already headed for the file
 * system (realtmp) only takes its name now. Under p->mu.
 */
static int export_file(struct pl_file *p, const char *why)
{
	if (atomic_load(&p->exported))
		return 0;
	int fd = -1, top = atomic_load(&maxfd);
	for (int i = 0; i <= top && i < PL_MAXFD && fd < 0; i++)
		if (atomic_load(&pl_tab[i]) == p)
			fd = i;
	if (!p->realtmp) {
		if (fd < 0)
			return 0;
		char tmp[PATH_MAX + 64];
		int realfd = copy_aside(p, fd, tmp, sizeof(tmp));
		if (realfd < 0) {
			pl_say("%s: cannot move it to the file system (%s): %s; it stays in the node store", p->path, why,
			       strerror(errno));
			return -1;
		}
		apply_meta(p, realfd);
		redirect(p, realfd);
		pl_real.close(realfd);
		if (p->owner == getpid())
			plf_send_abort(p->id);
		pthread_mutex_lock(&plf_tab_mu);
		free(p->data);
		p->data = strdup(tmp);
		pthread_mutex_unlock(&plf_tab_mu);
	} else if (fd >= 0) {
		apply_meta(p, fd);
	}
	atomic_store(&p->fallen, 1);
	atomic_store(&p->exported, 1);
	char data[PATH_MAX + 64];
	pthread_mutex_lock(&plf_tab_mu);
	snprintf(data, sizeof(data), "%s", p->data ? p->data : "");
	pthread_mutex_unlock(&plf_tab_mu);
	if (p->unlinked)
		pl_real.unlinkat(AT_FDCWD, data, 0);
	else if (plf_install_real(data, p->path) != 0)
		return -1;
	pl_warn_once(PL_WARN_EXPORT, "%s: %s, so it is written to the file system, not the node store", p->path, why);
	return 0;
}

/* The files being written, each held once (plf_tab_mu dropped while exporting). */
static size_t snapshot_writing(struct pl_file **out, size_t cap)
{
	size_t n = 0;
	pthread_mutex_lock(&plf_tab_mu);
	for (struct pl_file *p = writing; p && n < cap; p = p->wnext)
		if (!atomic_load(&p->exported)) {
			p->refs++;
			out[n++] = p;
		}
	pthread_mutex_unlock(&plf_tab_mu);
	return n;
}

void pl_export_all(const char *why)
{
	struct pl_file *v[256];
	for (;;) {
		size_t n = snapshot_writing(v, 256);
		if (!n)
			return;
		int moved = 0;
		for (size_t i = 0; i < n; i++) {
			pthread_mutex_lock(&v[i]->mu);
			moved += export_file(v[i], why) == 0;
			pthread_mutex_unlock(&v[i]->mu);
			pl_release(v[i], 0);
		}
		if (!moved || n < 256)
			return;
	}
}

/* fd's store file being written, held (pl_release it), with its lock taken;
 * NULL when fd is none or has left the store already. */
static struct pl_file *writer_of(int fd)
{
	struct pl_file *p = pl_get(fd);
	if (!p || p->kind != PL_WRITE || atomic_load(&p->exported))
		return NULL;
	pthread_mutex_lock(&plf_tab_mu);
	p->refs++;
	pthread_mutex_unlock(&plf_tab_mu);
	pthread_mutex_lock(&p->mu);
	return p;
}

void pl_export_fd(int fd, const char *why)
{
	struct pl_file *p = writer_of(fd);
	if (!p)
		return;
	export_file(p, why);
	pthread_mutex_unlock(&p->mu);
	pl_release(p, 0);
}

void pl_attach_real(int fd, const char *why)
{
	struct pl_file *p = writer_of(fd);
	if (!p)
		return;
	off_t pos = lseek(fd, 0, SEEK_CUR);
	int realfd = pl_real.openat(AT_FDCWD, p->path, p->accmode | O_CLOEXEC | O_NOFOLLOW);
	if (realfd >= 0) {
		if (pos >= 0)
			lseek(realfd, pos, SEEK_SET);
		if (p->append)
			pl_real.fcntl(realfd, F_SETFL, O_APPEND);
		redirect(p, realfd);
		pl_real.close(realfd);
		if (p->owner == getpid())
			plf_send_abort(p->id);
		atomic_store(&p->fallen, 1);
		atomic_store(&p->exported, 1);
		pl_warn_once(PL_WARN_EXPORT, "%s: %s, so it is written to the file system, not the node store", p->path,
			     why);
	}
	pthread_mutex_unlock(&p->mu);
	pl_release(p, 0);
}

int pl_files_open(void)
{
	pthread_mutex_lock(&plf_tab_mu);
	int any = 0;
	for (struct pl_file *p = writing; p && !any; p = p->wnext)
		any = !atomic_load(&p->exported) && p->owner == getpid();
	pthread_mutex_unlock(&plf_tab_mu);
	return any;
}

void pl_files_at_exit(void)
{
	/* The kernel closes every descriptor at the end: commit as that close would. */
	for (int fd = 0, top = atomic_load(&maxfd); fd <= top && fd < PL_MAXFD; fd++) {
		struct pl_file *p = atomic_load(&pl_tab[fd]);
		if (!p || p->kind != PL_WRITE)
			continue;
		p = atomic_exchange(&pl_tab[fd], NULL);
		if (p)
			pl_release(p, 0);
	}
}

/* ---- fork ---------------------------------------------------------------- */

void pl_files_atfork_prepare(void)
{
	pthread_mutex_lock(&plf_tab_mu);
	pthread_mutex_lock(&plf_dir_mu);
	pthread_mutex_lock(&plf_ver_mu);
}

void pl_files_atfork_parent(void)
{
	pthread_mutex_unlock(&plf_ver_mu);
	pthread_mutex_unlock(&plf_dir_mu);
	pthread_mutex_unlock(&plf_tab_mu);
}

void pl_files_atfork_child(void)
{
	/* The child inherits the descriptors but not the files' ownership
	 * (p->owner): only the process that opened a file commits it. */
	pthread_mutex_unlock(&plf_ver_mu);
	pthread_mutex_unlock(&plf_dir_mu);
	pthread_mutex_unlock(&plf_tab_mu);
}
