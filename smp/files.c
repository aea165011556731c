/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files in the node store, daemon side: the namespace, the memory
 * budget of files being written, commit, rename, unlink, eviction of flushed
 * files, and the flush thread that copies committed files to their real
 * paths. See files.h and docs/design.md, "Captured files (LD_PRELOAD)".
 *
 * Crash-only like the rest of the store: the namespace is the tree of
 * manifests under files/ns, each published by rename(2). What lives only in
 * memory (which files are being written, which are flushed) is rebuilt at
 * start: files being written are gone with their writers' connections, and
 * every committed file is checked against its real path again.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snap/fileman.h"
#include "files.h"
#include "snap/base.h"
#include "smp_internal.h"
#include "snap/wire.h"

#define FILES_HBUCKETS 4096
#define FILES_PATH_MAX 4096
#define FILES_SCAN_DEPTH 128

enum { F_DIRTY = 0, F_FLUSHING = 1, F_CLEAN = 2 };

struct fjob;

struct fent {
	char *path;                 /* absolute logical path */
	uint64_t id, size, charge, mtime_ns;
	struct snap_fman man;       /* crc[] kept for the flush */
	int state;
	int check_real;             /* found at start: the real file may hold these bytes already */
	int failed;                 /* flushing failed 3 times: retried only when asked */
	int tries;                  /* failed flushes since the last success or request */
	int dead;                   /* removed while being flushed: the flush thread frees it */
	struct fjob *job;
	struct fent *hnext;
	struct fent *prev, *next;   /* commit order (oldest first) */
};

struct fwip {                   /* a file being written by a connection */
	uint64_t id, granted;
	char *path;
	uint32_t mode;
	void *owner;
	struct fwip *next;
};

struct fjob {
	char name[SNAP_JOB_MAX + 1];
	char dir[SNAP_FILE_MAX];    /* <root>/<job>/files */
	int nsfd, datafd, tmpfd;    /* directory descriptors */
	int lockfd;                 /* files/lock, held (flock) while this daemon runs: a preloaded
	                               process changes the namespace itself only when nobody holds it */
	struct fent *hash[FILES_HBUCKETS];
	struct fent *head, *tail;
	struct fwip *wip;
	int urgent;                 /* flush everything now (FFLUSH, SIGUSR1, SIGTERM) */
	struct fjob *next;
};

struct snap_files {
	struct snap_store *store;
	const struct snap_smp_config *cfg;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t th;
	int started, stop;
	int pipe[2];
	struct fjob *jobs;
	uint64_t last_id;
	struct conn_wait {
		struct conn *c;
		struct fjob *j;
		struct conn_wait *next;
	} *waiters;
};

/* ---- helpers ------------------------------------------------------------- */

static unsigned hash_path(const char *p)
{
	uint32_t h = 2166136261u;
	for (; *p; p++)
		h = (h ^ (uint8_t)*p) * 16777619u;
	return h % FILES_HBUCKETS;
}

static struct fent *lookup(struct fjob *j, const char *path)
{
	for (struct fent *e = j->hash[hash_path(path)]; e; e = e->hnext)
		if (strcmp(e->path, path) == 0)
			return e;
	return NULL;
}

static void hash_insert(struct fjob *j, struct fent *e)
{
	unsigned h = hash_path(e->path);
	e->hnext = j->hash[h];
	j->hash[h] = e;
}

static void hash_remove(struct fjob *j, struct fent *e)
{
	for (struct fent **pp = &j->hash[hash_path(e->path)]; *pp; pp = &(*pp)->hnext)
		if (*pp == e) {
			*pp = e->hnext;
			return;
		}
}

static void order_append(struct fjob *j, struct fent *e)
{
	e->next = NULL;
	e->prev = j->tail;
	if (j->tail)
		j->tail->next = e;
	else
		j->head = e;
	j->tail = e;
}

static void order_remove(struct fjob *j, struct fent *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		j->head = e->next;
	if (e->next)
		e->next->prev = e->prev;
	else
		j->tail = e->prev;
	e->prev = e->next = NULL;
}

static void free_entry(struct fent *e)
{
	snap_fman_free(&e->man);
	free(e->path);
	free(e);
}

/*
 * A path a client may name: absolute, normalized (no "", "." or ".."
 * components), not the root, not inside the store itself (the flush would
 * write into the store it reads).
 */
static int path_ok(const struct snap_files *f, const char *p)
{
	size_t n = strlen(p), rl = strlen(f->store->root);
	if (n < 2 || n >= FILES_PATH_MAX || p[0] != '/' || p[n - 1] == '/')
		return 0;
	for (const char *c = p; *c;) {
		const char *s = ++c;   /* past '/' */
		while (*c && *c != '/')
			c++;
		size_t l = (size_t)(c - s);
		if (l == 0 || l > 255 || (l == 1 && s[0] == '.') || (l == 2 && s[0] == '.' && s[1] == '.'))
			return 0;
	}
	return !(strncmp(p, f->store->root, rl) == 0 && (p[rl] == '/' || p[rl] == '\0'));
}

/* dirname / basename of an absolute normalized path into buffers. */
static void split_path(const char *p, char *dir, size_t dcap, const char **base)
{
	const char *s = strrchr(p, '/');
	size_t dl = s == p ? 1 : (size_t)(s - p);
	snprintf(dir, dcap, "%.*s", (int)dl, p);
	*base = s + 1;
}

/* The flush's temporary name beside the real file: hidden, and the preload hides it from listings. */
static int flush_tmp_name(const char *path, uint64_t id, char *out, size_t cap)
{
	char dir[FILES_PATH_MAX];
	const char *base;
	split_path(path, dir, sizeof(dir), &base);
	int n = snprintf(out, cap, "%s%s.%s.snapflush-%016" PRIx64, dir, strcmp(dir, "/") ? "/" : "", base, id);
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

/* mkdir -p of the parents of rel (relative to dirfd). */
static int mkparents(int dirfd, const char *rel)
{
	char buf[FILES_PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", rel);
	for (char *c = strchr(buf, '/'); c; c = strchr(c + 1, '/')) {
		*c = '\0';
		if (mkdirat(dirfd, buf, 0700) != 0 && errno != EEXIST)
			return -1;
		*c = '/';
	}
	return 0;
}

static void notify(struct snap_files *f)
{
	char b = 1;
	if (write(f->pipe[1], &b, 1) < 0) {
		/* full pipe: the poll loop has wake-ups pending already */
	}
}

static uint64_t wall_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

/* The job's namespace changed: an erasure-coded mesh protects it anew
 * (meshcap.c reads the counter in its next round). */
static void ns_changed(struct snap_files *f, struct fjob *j)
{
	struct store_job *sj = snap_store_job(f->store, j->name, 1);
	if (sj)
		sj->files_ver++;
}

/*
 * Drop an entry from the namespace: its manifest (unless a rename already
 * replaced it), its data, its memory charge. One being flushed is freed by
 * the flush thread when its copy ends.
 */
static void remove_entry(struct snap_files *f, struct fjob *j, struct fent *e, int unlink_manifest)
{
	char name[17];
	hash_remove(j, e);
	order_remove(j, e);
	ns_changed(f, j);
	if (unlink_manifest)
		unlinkat(j->nsfd, e->path + 1, 0);
	snap_fman_data_name(e->id, name);
	unlinkat(j->datafd, name, 0);
	f->store->mem_used -= e->charge < f->store->mem_used ? e->charge : f->store->mem_used;
	if (e->state == F_FLUSHING)
		e->dead = 1;
	else
		free_entry(e);
}

static void uncharge(struct snap_files *f, uint64_t bytes)
{
	f->store->mem_used -= bytes < f->store->mem_used ? bytes : f->store->mem_used;
}

static void drop_wip(struct snap_files *f, struct fjob *j, struct fwip *w, int unlink_data)
{
	for (struct fwip **pp = &j->wip; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	if (unlink_data) {
		char name[17];
		snap_fman_data_name(w->id, name);
		unlinkat(j->datafd, name, 0);
	}
	uncharge(f, w->granted);
	free(w->path);
	free(w);
}

static struct fwip *find_wip(struct fjob *j, uint64_t id, void *owner)
{
	for (struct fwip *w = j->wip; w; w = w->next)
		if (w->id == id && w->owner == owner)
			return w;
	return NULL;
}

/* ---- jobs and the start-up scan ------------------------------------------ */

static int open_dir_at(int dirfd, const char *name, int create)
{
	if (create && mkdirat(dirfd, name, 0700) != 0 && errno != EEXIST)
		return -1;
	return openat(dirfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static void free_job(struct fjob *j)
{
	for (struct fent *e = j->head, *n; e; e = n) {
		n = e->next;
		free_entry(e);
	}
	while (j->wip) {
		struct fwip *w = j->wip;
		j->wip = w->next;
		free(w->path);
		free(w);
	}
	for (int *fd = &j->nsfd; fd <= &j->tmpfd; fd++)
		if (*fd >= 0)
			close(*fd);
	if (j->lockfd >= 0)
		close(j->lockfd);
	free(j);
}

struct scan {
	struct snap_files *f;
	struct fjob *j;
	struct fent **list;
	size_t n, cap;
};

static int cmp_mtime(const void *a, const void *b)
{
	const struct fent *x = *(struct fent *const *)a, *y = *(struct fent *const *)b;
	return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

/* One manifest found at start: keep it if it decodes and its data is whole. */
static void scan_manifest(struct scan *sc, int dfd, const char *name, const char *path)
{
	struct snap_files *f = sc->f;
	struct fjob *j = sc->j;
	char why[256] = "";
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > SNAP_FMAN_MAX) {
		snap_store_logf(f->store, "captured files of job %s: skipping %s: not a readable regular file",
				j->name, path);
		if (fd >= 0)
			close(fd);
		return;
	}
	uint8_t *buf = malloc((size_t)st.st_size + 1);
	ssize_t got = buf ? pread(fd, buf, (size_t)st.st_size, 0) : -1;
	close(fd);
	struct fent *e = calloc(1, sizeof(*e));
	int rc = SNAP_EIO;
	if (e && got == st.st_size)
		rc = snap_fman_decode(buf, (size_t)got, &e->man, why, sizeof(why));
	free(buf);
	if (rc == 0) {
		char dname[17];
		struct stat ds;
		snap_fman_data_name(e->man.id, dname);
		for (size_t i = 0; i < sc->n; i++)
			if (sc->list[i]->id == e->man.id)
				rc = SNAP_ECORRUPT;
		if (rc)
			snprintf(why, sizeof(why), "its data %s is named by another manifest too", dname);
		else if (fstatat(j->datafd, dname, &ds, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(ds.st_mode))
			snprintf(why, sizeof(why), "its data file %s is missing", dname), rc = SNAP_ECORRUPT;
		else if ((uint64_t)ds.st_size != e->man.size)
			snprintf(why, sizeof(why), "its data file holds %" PRIu64 " of %" PRIu64 " bytes",
				 (uint64_t)ds.st_size, e->man.size), rc = SNAP_ECORRUPT;
		else
			e->charge = (uint64_t)ds.st_blocks * 512;
	}
	if (rc == 0 && sc->n == sc->cap) {
		size_t cap = sc->cap ? 2 * sc->cap : 64;
		struct fent **l = realloc(sc->list, cap * sizeof(*l));
		if (l) {
			sc->list = l;
			sc->cap = cap;
		} else {
			rc = SNAP_ENOMEM;
			snprintf(why, sizeof(why), "out of memory");
		}
	}
	if (rc == 0 && !(e->path = strdup(path)))
		rc = SNAP_ENOMEM;
	if (rc) {
		snap_store_logf(f->store, "captured files of job %s: discarding %s: %s", j->name, path,
				why[0] ? why : "unreadable");
		if (rc != SNAP_ENOMEM)
			unlinkat(dfd, name, 0);
		if (e) {
			snap_fman_free(&e->man);
			free(e->path);
			free(e);
		}
		return;
	}
	e->id = e->man.id;
	e->size = e->man.size;
	e->mtime_ns = e->man.mtime_ns;
	e->job = j;
	e->state = F_DIRTY;
	e->check_real = 1;
	sc->list[sc->n++] = e;
}

/* Walk the namespace tree; returns the number of entries left in dir (for pruning). */
static int scan_tree(struct scan *sc, int dfd, char *path, size_t plen, int depth)
{
	int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 1;
	}
	int left = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		size_t nl = strlen(de->d_name);
		if (plen + 1 + nl >= FILES_PATH_MAX) {
			left++;
			continue;
		}
		path[plen] = '/';
		memcpy(path + plen + 1, de->d_name, nl + 1);
		struct stat st;
		if (fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
			path[plen] = '\0';
			continue;
		}
		if (S_ISDIR(st.st_mode) && depth < FILES_SCAN_DEPTH) {
			int sub = openat(dfd, de->d_name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int n = sub >= 0 ? scan_tree(sc, sub, path, plen + 1 + nl, depth + 1) : 1;
			if (sub >= 0)
				close(sub);
			if (n == 0 && unlinkat(dfd, de->d_name, AT_REMOVEDIR) == 0)
				n = 0;
			else
				left++;
		} else {
			scan_manifest(sc, dfd, de->d_name, path);
			left++;
		}
		path[plen] = '\0';
	}
	closedir(d);
	return left;
}

static int parse_id(const char *s, uint64_t *id)
{
	if (strlen(s) != 16)
		return 0;
	uint64_t v = 0;
	for (int i = 0; i < 16; i++) {
		char c = s[i];
		int x = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (x < 0)
			return 0;
		v = v << 4 | (uint64_t)x;
	}
	*id = v;
	return 1;
}

static void clear_dir(int dirfd)
{
	int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return;
	}
	struct dirent *de;
	while ((de = readdir(d)))
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
			unlinkat(dirfd, de->d_name, 0);
	closedir(d);
}

/* Leftover temporaries of flushes a crash interrupted, beside the files they were for. */
static void remove_flush_leftovers(struct snap_files *f, struct fent **list, size_t n)
{
	char done[64][FILES_PATH_MAX / 16];
	int ndone = 0;
	for (size_t i = 0; i < n; i++) {
		char dir[FILES_PATH_MAX];
		const char *base;
		split_path(list[i]->path, dir, sizeof(dir), &base);
		int seen = 0;
		for (int k = 0; k < ndone && !seen; k++)
			seen = strcmp(done[k], dir) == 0;
		if (seen)
			continue;
		if (ndone < 64 && strlen(dir) < sizeof(done[0]))
			strcpy(done[ndone++], dir);
		DIR *d = opendir(dir);
		struct dirent *de;
		while (d && (de = readdir(d))) {
			if (de->d_name[0] != '.' || !strstr(de->d_name, ".snapflush-"))
				continue;
			char p[FILES_PATH_MAX];
			if (snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) < (int)sizeof(p)) {
				snap_store_logf(f->store, "removing %s (a flush that did not finish)", p);
				unlink(p);
			}
		}
		if (d)
			closedir(d);
	}
}

static struct fjob *load_job(struct snap_files *f, const char *name, int create)
{
	struct fjob *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	j->nsfd = j->datafd = j->tmpfd = j->lockfd = -1;
	snprintf(j->name, sizeof(j->name), "%s", name);
	char jdir[SNAP_FILE_MAX];
	if (snprintf(jdir, sizeof(jdir), "%s/%s", f->store->root, name) >= (int)sizeof(jdir) ||
	    snprintf(j->dir, sizeof(j->dir), "%s/files", jdir) >= (int)sizeof(j->dir)) {
		errno = ENAMETOOLONG;
		goto fail;
	}
	if (create && mkdir(jdir, 0700) != 0 && errno != EEXIST)
		goto fail;
	if (create && mkdir(j->dir, 0700) != 0 && errno != EEXIST)
		goto fail;
	int top = open(j->dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (top < 0)
		goto fail;
	/* Preloaded processes hold the lock for a few system calls at most
	 * (while no snapsmp ran): wait for them, boundedly. */
	j->lockfd = openat(top, "lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	for (int i = 0; j->lockfd >= 0 && flock(j->lockfd, LOCK_EX | LOCK_NB) != 0; i++) {
		if (i == 10000) {
			errno = EWOULDBLOCK;
			close(top);
			goto fail;
		}
		usleep(1000);
	}
	if (j->lockfd < 0) {
		close(top);
		goto fail;
	}
	j->nsfd = open_dir_at(top, "ns", 1);
	j->datafd = open_dir_at(top, "data", 1);
	j->tmpfd = open_dir_at(top, "tmp", 1);
	close(top);
	if (j->nsfd < 0 || j->datafd < 0 || j->tmpfd < 0)
		goto fail;
	clear_dir(j->tmpfd);
	struct scan sc = { .f = f, .j = j };
	char path[FILES_PATH_MAX] = "";
	scan_tree(&sc, j->nsfd, path, 0, 0);
	if (sc.n)
		qsort(sc.list, sc.n, sizeof(*sc.list), cmp_mtime);
	for (size_t i = 0; i < sc.n; i++) {
		hash_insert(j, sc.list[i]);
		order_append(j, sc.list[i]);
		f->store->mem_used += sc.list[i]->charge;
	}
	remove_flush_leftovers(f, sc.list, sc.n);
	/* Data no manifest names: a file whose writer died, or one replaced by a crash mid-commit. */
	int fd = openat(j->datafd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;
	while (d && (de = readdir(d))) {
		uint64_t id;
		if (!parse_id(de->d_name, &id))
			continue;
		if (id > f->last_id)
			f->last_id = id;
		int used = 0;
		for (size_t i = 0; i < sc.n && !used; i++)
			used = sc.list[i]->id == id;
		if (!used) {
			snap_store_logf(f->store, "captured files of job %s: removing data %s of a file never committed",
					j->name, de->d_name);
			unlinkat(j->datafd, de->d_name, 0);
		}
	}
	if (d)
		closedir(d);
	else if (fd >= 0)
		close(fd);
	if (sc.n)
		snap_store_logf(f->store, "captured files of job %s: %zu committed files in the store", j->name, sc.n);
	free(sc.list);
	j->next = f->jobs;
	f->jobs = j;
	return j;
fail:
	snap_store_logf(f->store, "captured files of job %s: cannot use %s: %s", name, j->dir, strerror(errno));
	free_job(j);
	return NULL;
}

static struct fjob *find_job(struct snap_files *f, const char *name, int create)
{
	for (struct fjob *j = f->jobs; j; j = j->next)
		if (strcmp(j->name, name) == 0)
			return j;
	return create ? load_job(f, name, 1) : NULL;
}

/* ---- the flush thread ---------------------------------------------------- */

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

static int write_all(int fd, const uint8_t *p, size_t len)
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
		      size_t tmpcap, char *why, size_t whylen)
{
	if (check_real && real_matches(path, m))
		return 1;
	char name[17];
	snap_fman_data_name(m->id, name);
	int dfd = openat(datafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (dfd < 0 || fstat(dfd, &st) != 0 || (uint64_t)st.st_size != m->size) {
		snap_fmt(why, whylen, "its data in the store is gone or has changed size");
		if (dfd >= 0)
			close(dfd);
		return -1;
	}
	/* pread into one chunk buffer: it stays in cache for the CRC and the
	 * write, where a mapping of the tmpfs file reads at a third the speed. */
	uint8_t *buf = m->size ? malloc(m->chunk) : NULL;
	int rc = -1, fd = -1;
	if (m->size && !buf) {
		snap_fmt(why, whylen, "out of memory");
		goto out;
	}
	if (flush_tmp_name(path, m->id, tmp, tmpcap)) {
		snap_fmt(why, whylen, "path too long");
		goto out;
	}
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0) {
		snap_fmt(why, whylen, "cannot create %s: %s", tmp, strerror(errno));
		goto out;
	}
	for (uint64_t off = 0, i = 0; off < m->size; off += m->chunk, i++) {
		size_t len = m->size - off < m->chunk ? (size_t)(m->size - off) : m->chunk, got = 0;
		while (got < len) {
			ssize_t r = pread(dfd, buf + got, len - got, (off_t)(off + got));
			if (r <= 0) {
				snap_fmt(why, whylen, "cannot read its data: %s", r < 0 ? strerror(errno) : "short");
				goto out;
			}
			got += (size_t)r;
		}
		if (snap_crc32c(buf, len) != m->crc[i]) {
			snap_fmt(why, whylen, "chunk %" PRIu64 " in node memory no longer matches its CRC32C (not flushed)", i);
			goto out;
		}
		if (write_all(fd, buf, len)) {
			snap_fmt(why, whylen, "cannot write %s: %s", tmp, strerror(errno));
			goto out;
		}
	}
	/* The mode the creating process asked for, whatever snapsmp's umask. */
	if (fchmod(fd, m->mode & 07777) != 0 || fsync(fd) != 0) {
		snap_fmt(why, whylen, "cannot sync %s: %s", tmp, strerror(errno));
		goto out;
	}
	rc = 0;
out:
	if (fd >= 0 && close(fd) != 0 && rc == 0) {
		snap_fmt(why, whylen, "cannot close %s: %s", tmp, strerror(errno));
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
	split_path(path, dir, sizeof(dir), &base);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

static void *flusher(void *arg)
{
	struct snap_files *f = arg;
	pthread_mutex_lock(&f->mu);
	while (!f->stop) {
		struct fent *e = pick(f);
		if (!e) {
			for (struct fjob *j = f->jobs; j; j = j->next)
				if (j->urgent) {
					j->urgent = 0;
					notify(f);
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
			free_entry(e);   /* e is gone from here on */
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
		notify(f);
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

/* ---- open / close -------------------------------------------------------- */

int snap_files_open(struct snap_files **fp, struct snap_store *store, const struct snap_smp_config *cfg,
		    char *err, size_t errlen)
{
	*fp = NULL;
	struct snap_files *f = calloc(1, sizeof(*f));
	if (!f)
		return SNAP_ENOMEM;
	f->store = store;
	f->cfg = cfg;
	f->pipe[0] = f->pipe[1] = -1;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	if (pipe2(f->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		snap_fmt(err, errlen, "pipe: %s", strerror(errno));
		snap_files_close(f);
		return SNAP_EIO;
	}
	DIR *d = opendir(store->root);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char p[SNAP_FILE_MAX];
		struct stat st;
		if (!snap_job_name_ok(de->d_name) ||
		    snprintf(p, sizeof(p), "%s/%s/files", store->root, de->d_name) >= (int)sizeof(p) ||
		    lstat(p, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		load_job(f, de->d_name, 0);
	}
	if (d)
		closedir(d);
	f->last_id = f->last_id > wall_ns() ? f->last_id : wall_ns();
	if ((errno = pthread_create(&f->th, NULL, flusher, f)) != 0) {
		snap_fmt(err, errlen, "cannot start the captured-file flush thread: %s", strerror(errno));
		snap_files_close(f);
		return SNAP_EIO;
	}
	f->started = 1;
	*fp = f;
	return 0;
}

void snap_files_close(struct snap_files *f)
{
	if (!f)
		return;
	if (f->started) {
		pthread_mutex_lock(&f->mu);
		f->stop = 1;
		pthread_cond_signal(&f->cv);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->th, NULL);
	}
	while (f->jobs) {
		struct fjob *j = f->jobs;
		f->jobs = j->next;
		free_job(j);
	}
	while (f->waiters) {
		struct conn_wait *w = f->waiters;
		f->waiters = w->next;
		free(w);
	}
	if (f->pipe[0] >= 0)
		close(f->pipe[0]);
	if (f->pipe[1] >= 0)
		close(f->pipe[1]);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

int snap_files_fd(const struct snap_files *f)
{
	return f ? f->pipe[0] : -1;
}

/* Files of job j (all jobs: NULL) still to flush in this round: dirty and not failed, or being flushed. */
static int pending(struct snap_files *f, struct fjob *only)
{
	int n = 0;
	for (struct fjob *j = f->jobs; j; j = j->next)
		for (struct fent *e = only && j != only ? NULL : j->head; e; e = e->next)
			n += e->state == F_FLUSHING || (e->state == F_DIRTY && !e->failed);
	return n;
}

static void reply_flush(struct conn *c, struct snap_files *f, struct fjob *j)
{
	struct snap_wbuf w = { 0 };
	uint64_t left = 0, failed = 0;
	for (struct fent *e = j->head; e; e = e->next) {
		left += e->state != F_CLEAN;
		failed += e->state == F_DIRTY && e->failed;
	}
	(void)f;
	snap_put_u64(&w, left);
	snap_put_u64(&w, failed);
	smp_reply_ok(c->fd, SNAP_MSG_FFLUSH, &w, -1);
	snap_wbuf_free(&w);
}

void snap_files_collect(struct smp *m)
{
	struct snap_files *f = m->files;
	char b[256];
	while (read(f->pipe[0], b, sizeof(b)) > 0) {
	}
	pthread_mutex_lock(&f->mu);
	for (struct conn_wait **pp = &f->waiters; *pp;) {
		struct conn_wait *w = *pp;
		if (!w->c->dead && (w->j->urgent || pending(f, w->j))) {
			pp = &w->next;
			continue;
		}
		if (!w->c->dead)
			reply_flush(w->c, f, w->j);
		*pp = w->next;
		free(w);
	}
	pthread_mutex_unlock(&f->mu);
}

void snap_files_conn_closed(struct snap_files *f, struct conn *c)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	for (struct fjob *j = f->jobs; j; j = j->next)
		for (struct fwip *w = j->wip, *n; w; w = n) {
			n = w->next;
			if (w->owner == c)
				drop_wip(f, j, w, 1);
		}
	for (struct conn_wait **pp = &f->waiters; *pp;) {
		struct conn_wait *w = *pp;
		if (w->c == c) {
			*pp = w->next;
			free(w);
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&f->mu);
}

static void urge(struct fjob *j)
{
	for (struct fent *e = j->head; e; e = e->next)
		e->failed = e->tries = 0;
	j->urgent = 1;
}

void snap_files_flush_all(struct snap_files *f, const char *why)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	int n = pending(f, NULL), failed = 0;
	for (struct fjob *j = f->jobs; j; j = j->next) {
		for (struct fent *e = j->head; e; e = e->next)
			failed += e->state == F_DIRTY && e->failed;
		urge(j);
	}
	if (n + failed)
		snap_store_logf(f->store, "%s: flushing %d captured files now", why, n + failed);
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

int snap_files_busy(struct snap_files *f)
{
	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	int n = pending(f, NULL);
	for (struct fjob *j = f->jobs; j; j = j->next)
		n += j->urgent;
	pthread_mutex_unlock(&f->mu);
	return n;
}

/* ---- requests ------------------------------------------------------------ */

/*
 * Make room for `bytes` more in the budget, evicting flushed files (oldest
 * first): their real copies are verified, and readers fall back to them.
 */
static int reserve(struct snap_files *f, uint64_t bytes)
{
	struct snap_store *s = f->store;
	while (s->mem_used + bytes > s->mem_limit) {
		struct fent *victim = NULL;
		for (struct fjob *j = f->jobs; j; j = j->next)
			for (struct fent *e = j->head; e; e = e->next)
				if (e->state == F_CLEAN && (!victim || e->mtime_ns < victim->mtime_ns)) {
					victim = e;
					break;
				}
		if (!victim)
			return SNAP_ENOSPC;
		snap_store_logf(s, "evicting captured file %s (%" PRIu64 " bytes) from the store: it is flushed",
				victim->path, victim->size);
		remove_entry(f, victim->job, victim, 1);
	}
	s->mem_used += bytes;
	return 0;
}

static int on_create(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r,
		     struct snap_wbuf *out, char *err, size_t errlen)
{
	char path[FILES_PATH_MAX];
	snap_get_str(r, path, sizeof(path));
	uint32_t mode = snap_get_u32(r);
	uint8_t excl = snap_get_u8(r);
	if (r->bad || snap_rbuf_left(r) || mode > 07777 || excl > 1) {
		snap_fmt(err, errlen, "malformed FCREATE");
		return SNAP_EPROTO;
	}
	uint32_t e = 0;
	struct stat st;
	if (!path_ok(f, path)) {
		e = EINVAL;
	} else if (excl) {
		int taken = lookup(j, path) != NULL || lstat(path, &st) == 0;
		for (struct fwip *w = j->wip; w && !taken; w = w->next)
			taken = strcmp(w->path, path) == 0;
		if (taken)
			e = EEXIST;
	}
	uint64_t id = 0;
	if (!e) {
		char name[17];
		int fd = -1;
		for (int tries = 0; fd < 0 && tries < 64; tries++) {
			id = ++f->last_id;
			snap_fman_data_name(id, name);
			fd = openat(j->datafd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
			if (fd < 0 && errno != EEXIST)
				break;
		}
		if (fd < 0) {
			snap_fmt(err, errlen, "cannot create a data file in %s/data: %s", j->dir, strerror(errno));
			return errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
		}
		close(fd);
		struct fwip *w = calloc(1, sizeof(*w));
		if (!w || !(w->path = strdup(path))) {
			free(w);
			unlinkat(j->datafd, name, 0);
			return SNAP_ENOMEM;
		}
		w->id = id;
		w->mode = mode;
		w->owner = c;
		w->next = j->wip;
		j->wip = w;
	}
	snap_put_u32(out, e);
	snap_put_u64(out, id);
	return 0;
}

static int on_grow(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r, char *err,
		   size_t errlen)
{
	uint64_t id = snap_get_u64(r), bytes = snap_get_u64(r);
	struct fwip *w = find_wip(j, id, c);
	if (r->bad || snap_rbuf_left(r) || !w) {
		snap_fmt(err, errlen, "malformed FGROW, or file %016" PRIx64 " is not being written on this connection", id);
		return SNAP_EPROTO;
	}
	if (bytes <= w->granted)
		return 0;
	if (reserve(f, bytes - w->granted)) {
		snap_fmt(err, errlen, "the node store is full: %s needs %" PRIu64 " bytes, SNAP_MEM_LIMIT=%" PRIu64
			 " with %" PRIu64 " in use and no flushed file left to evict", w->path, bytes, f->store->mem_limit,
			 f->store->mem_used);
		return SNAP_ENOSPC;
	}
	w->granted = bytes;
	return 0;
}

static int on_commit(struct snap_files *f, struct fjob *j, struct conn *c, struct snap_rbuf *r, char *err,
		     size_t errlen)
{
	uint64_t id = snap_get_u64(r), size = snap_get_u64(r);
	uint32_t chunk = snap_get_u32(r), n = snap_get_u32(r);
	struct fwip *w = find_wip(j, id, c);
	if (r->bad || !w || chunk < 4096 || chunk > (1u << 31) || n != snap_fman_nchunks(size, chunk) ||
	    snap_rbuf_left(r) != (size_t)n * 4) {
		snap_fmt(err, errlen, "malformed FCOMMIT (file %016" PRIx64 ", %" PRIu64 " bytes, chunk %u, %u CRCs)", id,
			 size, chunk, n);
		return SNAP_EPROTO;
	}
	struct fent *e = calloc(1, sizeof(*e));
	if (!e || !(e->man.crc = malloc(sizeof(uint32_t) * (n ? n : 1))) || !(e->path = strdup(w->path))) {
		if (e)
			free(e->man.crc);
		free(e);
		return SNAP_ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++)
		e->man.crc[i] = snap_get_u32(r);
	e->man.id = e->id = id;
	e->man.size = e->size = size;
	e->man.mtime_ns = e->mtime_ns = wall_ns();
	e->man.mode = w->mode;
	e->man.chunk = chunk;
	e->man.nchunks = n;
	e->job = j;
	char name[17], tmp[32];
	snap_fman_data_name(id, name);
	snprintf(tmp, sizeof(tmp), "%s.man", name);
	int rc = 0, fd = openat(j->datafd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0 || (uint64_t)st.st_size != size) {
		snap_fmt(err, errlen, "commit of %s: its data holds %" PRIu64 " bytes, the commit says %" PRIu64, w->path,
			 fd >= 0 ? (uint64_t)st.st_size : 0, size);
		rc = SNAP_ECORRUPT;
	} else if (f->cfg->verify_commit && size) {
		const uint8_t *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
		int64_t bad = p == MAP_FAILED ? 0 : snap_fman_verify(&e->man, p);
		if (bad >= 0) {
			snap_fmt(err, errlen, "commit of %s: chunk %" PRId64 " does not match the CRC the writer sent",
				 w->path, bad);
			rc = SNAP_ECORRUPT;
		}
		if (p != MAP_FAILED)
			munmap((void *)p, size);
	}
	if (fd >= 0)
		close(fd);
	e->charge = rc ? 0 : (uint64_t)st.st_blocks * 512;
	struct snap_wbuf mw = { 0 };
	if (!rc && snap_fman_encode(&e->man, &mw))
		rc = SNAP_ENOMEM;
	if (!rc) {
		int mfd = openat(j->tmpfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		int ok = mfd >= 0 && write_all(mfd, mw.p, mw.len) == 0;
		if (mfd >= 0 && close(mfd) != 0)
			ok = 0;
		/* A preloaded process may prune an empty directory of the namespace
		 * between our mkdir and rename (rmdir): try again. */
		for (int tries = 0; ok && tries < 3; tries++) {
			if (mkparents(j->nsfd, e->path + 1) != 0) {
				ok = 0;
				break;
			}
			if (renameat(j->tmpfd, tmp, j->nsfd, e->path + 1) == 0)
				break;
			if (errno == ENOENT)
				continue;
			/* An empty directory of the namespace where the file goes now. */
			ok = (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) &&
			     unlinkat(j->nsfd, e->path + 1, AT_REMOVEDIR) == 0 &&
			     renameat(j->tmpfd, tmp, j->nsfd, e->path + 1) == 0;
			break;
		}
		if (!ok) {
			snap_fmt(err, errlen, "cannot publish the manifest of %s in %s/ns: %s", e->path, j->dir,
				 strerror(errno));
			rc = errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
			unlinkat(j->tmpfd, tmp, 0);
		}
	}
	snap_wbuf_free(&mw);
	if (rc) {
		drop_wip(f, j, w, 1);
		free_entry(e);
		return rc;
	}
	struct fent *old = lookup(j, e->path);
	if (old)
		remove_entry(f, j, old, 0);   /* its manifest was just replaced */
	uncharge(f, w->granted);
	w->granted = 0;
	drop_wip(f, j, w, 0);
	f->store->mem_used += e->charge;
	e->state = F_DIRTY;
	hash_insert(j, e);
	order_append(j, e);
	pthread_cond_signal(&f->cv);
	return 0;
}

static int real_isdir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Does the namespace hold a committed file under directory rel? */
static int ns_has_files(int at, const char *rel, int depth)
{
	int fd = openat(at, rel, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	int found = 0;
	struct dirent *de;
	while (!found && (de = readdir(d))) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
		    fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0)
			continue;
		found = S_ISDIR(st.st_mode) ? depth < FILES_SCAN_DEPTH && ns_has_files(dirfd(d), de->d_name, depth + 1)
					    : 1;
	}
	closedir(d);
	return found;
}

/* A real directory was renamed from -> to: its store files follow (one rename of the namespace subtree). */
static void move_subtree(struct snap_files *f, struct fjob *j, const char *from, const char *to)
{
	struct stat st;
	if (fstatat(j->nsfd, from + 1, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
		return;
	unlinkat(j->nsfd, to + 1, AT_REMOVEDIR);   /* an empty leftover; a full one made us refuse */
	if (mkparents(j->nsfd, to + 1) != 0 || renameat(j->nsfd, from + 1, j->nsfd, to + 1) != 0) {
		snap_store_logf(f->store, "captured files of job %s: cannot move the store's copy of %s to %s: %s", j->name,
				from, to, strerror(errno));
		return;
	}
	size_t fl = strlen(from), tl = strlen(to);
	struct fent *moved = NULL;
	for (unsigned h = 0; h < FILES_HBUCKETS; h++)
		for (struct fent **pp = &j->hash[h]; *pp;) {
			struct fent *e = *pp;
			if (strncmp(e->path, from, fl) || e->path[fl] != '/') {
				pp = &e->hnext;
				continue;
			}
			*pp = e->hnext;   /* rehashed below, under its new name */
			char *np = malloc(tl + strlen(e->path + fl) + 1);
			if (np) {
				memcpy(np, to, tl);
				strcpy(np + tl, e->path + fl);
				free(e->path);
				e->path = np;
			}
			e->tries = e->failed = 0;
			e->hnext = moved;
			moved = e;
		}
	while (moved) {
		struct fent *e = moved;
		moved = e->hnext;
		hash_insert(j, e);
	}
	for (struct fwip *w = j->wip; w; w = w->next) {
		if (strncmp(w->path, from, fl) || w->path[fl] != '/')
			continue;
		char *np = malloc(tl + strlen(w->path + fl) + 1);
		if (np) {
			memcpy(np, to, tl);
			strcpy(np + tl, w->path + fl);
			free(w->path);
			w->path = np;
		}
	}
	pthread_cond_signal(&f->cv);
}

static uint32_t do_rename(struct snap_files *f, struct fjob *j, struct conn *c, const char *from, const char *to,
			  int wip)
{
	if (!path_ok(f, from) || !path_ok(f, to))
		return EINVAL;
	if (strcmp(from, to) == 0)
		return 0;
	struct fent *e = lookup(j, from), *t = lookup(j, to);
	char dir[FILES_PATH_MAX];
	const char *base;
	split_path(to, dir, sizeof(dir), &base);
	if (wip) {
		/* A file this connection is writing: it will be committed under the new name. */
		struct fwip *w = NULL;
		for (struct fwip *x = j->wip; x && !w; x = x->next)
			if (x->owner == c && strcmp(x->path, from) == 0)
				w = x;
		if (!w)
			return ENOENT;
		if (!real_isdir(dir))
			return ENOENT;
		char *p = strdup(to);
		if (!p)
			return ENOMEM;
		free(w->path);
		w->path = p;
		if (e)
			remove_entry(f, j, e, 1);   /* the name now belongs to the open file */
		if (unlink(from) != 0 && errno != ENOENT && errno != EISDIR) {
			/* a stale real copy we cannot remove resurfaces later: say so */
			snap_store_logf(f->store, "cannot remove %s after its rename: %s", from, strerror(errno));
		}
		return 0;
	}
	if (!e) {
		/* Only the real file or directory: rename it; a store file at `to`
		 * is replaced by it, and a directory takes its store files along. */
		struct stat st;
		int isdir = lstat(from, &st) == 0 && S_ISDIR(st.st_mode);
		if (isdir && ns_has_files(j->nsfd, to + 1, 0))
			return ENOTEMPTY;   /* the real `to` may look empty; its store files count */
		/* The store's `to` steps aside first: were we to die between the two
		 * renames, the older store copy must not shadow the file that
		 * replaced it (tmp/ is emptied at start, so aside = removed). */
		char aside[32];
		snprintf(aside, sizeof(aside), "%016" PRIx64 ".old", t ? t->id : 0);
		if (t && renameat(j->nsfd, to + 1, j->tmpfd, aside) != 0)
			return (uint32_t)errno;
		if (rename(from, to) != 0) {
			int er = errno;
			if (t)
				renameat(j->tmpfd, aside, j->nsfd, to + 1);
			return (uint32_t)er;
		}
		if (t) {
			unlinkat(j->tmpfd, aside, 0);
			remove_entry(f, j, t, 0);
		}
		if (isdir)
			move_subtree(f, j, from, to);
		return 0;
	}
	if (!real_isdir(dir))
		return ENOENT;
	if (real_isdir(to))
		return EISDIR;
	if (mkparents(j->nsfd, to + 1) != 0)
		return (uint32_t)errno;
	if (renameat(j->nsfd, from + 1, j->nsfd, to + 1) != 0) {
		int ok = (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) &&
			 unlinkat(j->nsfd, to + 1, AT_REMOVEDIR) == 0 && renameat(j->nsfd, from + 1, j->nsfd, to + 1) == 0;
		if (!ok)
			return (uint32_t)errno;
	}
	if (t && t != e)
		remove_entry(f, j, t, 0);   /* replaced by the rename */
	/* The real side follows: a flushed copy moves with it; an older real
	 * file at `from` must not resurface once the store copy is gone. */
	if (e->state == F_CLEAN) {
		if (rename(from, to) != 0) {
			e->state = F_DIRTY;
			e->failed = 0;
			unlink(from);
		}
	} else if (unlink(from) != 0 && errno != ENOENT) {
		snap_store_logf(f->store, "cannot remove the older %s after its rename: %s", from, strerror(errno));
	}
	char *p = strdup(to);
	if (!p)
		return ENOMEM;
	hash_remove(j, e);
	free(e->path);
	e->path = p;
	hash_insert(j, e);
	pthread_cond_signal(&f->cv);
	return 0;
}

static uint32_t do_unlink(struct snap_files *f, struct fjob *j, const char *path, int store_only)
{
	if (!path_ok(f, path))
		return EINVAL;
	struct fent *e = lookup(j, path);
	if (e)
		remove_entry(f, j, e, 1);
	if (store_only)
		return 0;
	if (unlink(path) != 0 && !(e && errno == ENOENT))
		return (uint32_t)errno;
	return 0;
}

int snap_files_dispatch(struct smp *m, struct conn *c, uint16_t type, struct snap_rbuf *r, struct snap_wbuf *out,
			char *err, size_t errlen, int *deferred)
{
	struct snap_files *f = m->files;
	if (!f) {
		snap_fmt(err, errlen, "this snapsmp does not serve captured files");
		return SNAP_EUNSUPPORTED;
	}
	int rc = 0;
	pthread_mutex_lock(&f->mu);
	struct fjob *j = c->fjob;
	if (type == SNAP_MSG_FATTACH) {
		char job[SNAP_JOB_MAX + 1];
		snap_get_str(r, job, sizeof(job));
		uint32_t pid = snap_get_u32(r);
		if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job) || j) {
			snap_fmt(err, errlen, "malformed FATTACH (job name invalid, or sent twice)");
			rc = SNAP_EPROTO;
		} else if (!(j = find_job(f, job, 1))) {
			snap_fmt(err, errlen, "cannot create the captured-file store of job %s under %s: %s", job,
				 f->store->root, strerror(errno));
			rc = SNAP_EIO;
		} else {
			c->fjob = j;
			c->pid = pid;
			snap_put_u64(out, f->store->mem_limit);
			snap_put_u64(out, f->store->mem_used);
		}
		goto out;
	}
	if (!j) {
		snap_fmt(err, errlen, "send FATTACH first");
		rc = SNAP_EPROTO;
		goto out;
	}
	switch (type) {
	case SNAP_MSG_FCREATE: rc = on_create(f, j, c, r, out, err, errlen); break;
	case SNAP_MSG_FGROW: rc = on_grow(f, j, c, r, err, errlen); break;
	case SNAP_MSG_FCOMMIT:
		if (!(rc = on_commit(f, j, c, r, err, errlen)))
			ns_changed(f, j);
		break;
	case SNAP_MSG_FABORT: {
		uint64_t id = snap_get_u64(r);
		struct fwip *w = find_wip(j, id, c);
		if (r->bad || snap_rbuf_left(r) || !w) {
			snap_fmt(err, errlen, "malformed FABORT");
			rc = SNAP_EPROTO;
		} else {
			drop_wip(f, j, w, 1);
		}
		break;
	}
	case SNAP_MSG_FRENAME: {
		char from[FILES_PATH_MAX], to[FILES_PATH_MAX];
		snap_get_str(r, from, sizeof(from));
		snap_get_str(r, to, sizeof(to));
		uint8_t wip = snap_get_u8(r);
		if (r->bad || snap_rbuf_left(r) || wip > 1) {
			snap_fmt(err, errlen, "malformed FRENAME");
			rc = SNAP_EPROTO;
		} else {
			snap_put_u32(out, do_rename(f, j, c, from, to, wip));
			ns_changed(f, j);
		}
		break;
	}
	case SNAP_MSG_FUNLINK: {
		char path[FILES_PATH_MAX];
		snap_get_str(r, path, sizeof(path));
		uint8_t store_only = snap_get_u8(r);
		if (r->bad || snap_rbuf_left(r) || store_only > 1) {
			snap_fmt(err, errlen, "malformed FUNLINK");
			rc = SNAP_EPROTO;
		} else {
			snap_put_u32(out, do_unlink(f, j, path, store_only));
		}
		break;
	}
	case SNAP_MSG_FFLUSH: {
		uint8_t wait = snap_get_u8(r);
		struct conn_wait *w = NULL;
		if (r->bad || snap_rbuf_left(r) || wait > 1) {
			snap_fmt(err, errlen, "malformed FFLUSH");
			rc = SNAP_EPROTO;
		} else if (wait && !(w = calloc(1, sizeof(*w)))) {
			rc = SNAP_ENOMEM;
		} else {
			urge(j);
			pthread_cond_signal(&f->cv);
			if (w) {
				w->c = c;
				w->j = j;
				w->next = f->waiters;
				f->waiters = w;
				*deferred = 1;
			} else {
				snap_put_u64(out, (uint64_t)pending(f, j));
				snap_put_u64(out, 0);
			}
		}
		break;
	}
	default:
		snap_fmt(err, errlen, "unknown message type %u", type);
		rc = SNAP_EPROTO;
	}
out:
	pthread_mutex_unlock(&f->mu);
	return rc;
}
