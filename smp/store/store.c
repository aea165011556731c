/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The node store: slot files, manifests, and the rules for which slot may be
 * overwritten. See store.h for the layout and the crash-only argument.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snap/base.h"
#include "store/reserve.h"
#include "snap/store.h"

void snap_store_logf(const struct snap_store *s, const char *fmt, ...)
{
	if (!s->log)
		return;
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	s->log(msg);
}

/* dir + "/" + name; skips (returns -1) rather than truncating a path. */
static int join(char *out, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(out, cap, "%s/%s", dir, name);
	return n < 0 || (size_t)n >= cap ? -1 : 0;
}

int snap_store_path(const struct snap_store *s, const char *job, uint32_t rank, uint32_t slot, int man,
		    char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/%s/rank-%05u/slot-%u%s", s->root, job, rank, slot, man ? ".man" : "");
	return n < 0 || (size_t)n >= cap ? SNAP_EINVAL : 0;
}

void snap_store_slot_clear(struct store_slot *sl)
{
	if (sl->state == SLOT_COMMITTED)
		snap_manifest_free(&sl->man);
	free(sl->man_bytes);
	sl->man_bytes = NULL;
	sl->man_len = 0;
	sl->superseded = 0;
	sl->state = SLOT_FREE;
}

struct store_job *snap_store_job(struct snap_store *s, const char *name, int create)
{
	for (struct store_job *j = s->jobs; j; j = j->next)
		if (strcmp(j->name, name) == 0)
			return j;
	if (!create)
		return NULL;
	if (!s->read_only) {
		char path[SNAP_FILE_MAX];
		snprintf(path, sizeof(path), "%s/%s", s->root, name);
		if (mkdir(path, 0700) != 0 && errno != EEXIST)
			return NULL;
	}
	struct store_job *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", name);
	j->next = s->jobs;
	s->jobs = j;
	return j;
}

struct store_rank *snap_store_rank(struct snap_store *s, struct store_job *j, uint32_t rank, int create)
{
	if (rank < j->nranks && j->ranks[rank])
		return j->ranks[rank];
	if (!create || rank >= (1u << 24))
		return NULL;
	if (!s->read_only) {
		char path[SNAP_FILE_MAX];
		snprintf(path, sizeof(path), "%s/%s/rank-%05u", s->root, j->name, rank);
		if (mkdir(path, 0700) != 0 && errno != EEXIST)
			return NULL;
	}
	if (rank >= j->nranks) {
		uint32_t n = rank + 1 > j->nranks * 2 ? rank + 1 : j->nranks * 2;
		struct store_rank **p = realloc(j->ranks, n * sizeof(*p));
		if (!p)
			return NULL;
		memset(p + j->nranks, 0, (n - j->nranks) * sizeof(*p));
		j->ranks = p;
		j->nranks = n;
	}
	struct store_rank *r = calloc(1, sizeof(*r));
	if (!r || !(r->slots = calloc(s->nslots, sizeof(*r->slots)))) {
		free(r);
		return NULL;
	}
	r->rank = rank;
	j->ranks[rank] = r;
	return r;
}

int snap_store_open_regular(const char *path, int flags, struct stat *st, char *err, size_t errlen)
{
	/* O_NONBLOCK: opening a FIFO for reading returns at once instead of
	 * waiting for a writer; O_NOFOLLOW: a symlink is not the store's file. */
	int fd = open(path, flags | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snap_fmt(err, errlen, "%s", e == ELOOP ? "is a symbolic link" : e == ENOENT ? "" : strerror(e));
		errno = e;
		return -1;
	}
	if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
		int e = errno;
		snap_fmt(err, errlen, "is not a regular file (mode %o)", (unsigned)(st->st_mode & S_IFMT) >> 12);
		close(fd);
		errno = S_ISREG(st->st_mode) ? e : EINVAL;
		return -1;
	}
	/* Reads of a regular file never block; clear the flag for clarity. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	return fd;
}

/* Remember the first path the scan may not read: the store cannot be judged. */
static void note_denied(struct snap_store *s, const char *path)
{
	if (!s->denied[0])
		snprintf(s->denied, sizeof(s->denied), "%s", path);
}

/* Load slot i of a rank from disk: committed if its manifest checks out. */
static void scan_slot(struct snap_store *s, struct store_job *j, struct store_rank *r, uint32_t i)
{
	char path[SNAP_FILE_MAX], mpath[SNAP_FILE_MAX], why[256] = "";
	struct store_slot *sl = &r->slots[i];
	struct stat st;
	snap_store_path(s, j->name, r->rank, i, 0, path, sizeof(path));
	snap_store_path(s, j->name, r->rank, i, 1, mpath, sizeof(mpath));
	int rc = lstat(path, &st);
	int has_data = rc == 0 ? S_ISREG(st.st_mode) : errno != ENOENT;
	sl->size = rc == 0 && S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
	s->mem_used += sl->size;
	if (rc == 0 && !S_ISREG(st.st_mode))
		snap_store_logf(s, "%s is not a regular file; slot %u of job %s rank %u is unusable", path, i, j->name,
				r->rank);

	struct stat mst;
	int fd = snap_store_open_regular(mpath, O_RDONLY, &mst, why, sizeof(why));
	if (fd < 0) {
		if (errno == ENOENT)
			return;
		if (errno == EACCES)
			note_denied(s, mpath);
		/* A FIFO, a device, a link or an unreadable file is no manifest:
		 * never remove what we did not write (it may not even be ours). */
		snap_store_logf(s, "skipping %s: %s", mpath, why);
		return;
	}
	void *buf = NULL;
	ssize_t got = -1;
	if (mst.st_size > 0 && mst.st_size < (64 << 20) && (buf = malloc((size_t)mst.st_size)))
		got = pread(fd, buf, (size_t)mst.st_size, 0);
	close(fd);
	rc = SNAP_EIO;
	if (got == mst.st_size && got > 0)
		rc = snap_manifest_decode(buf, (size_t)got, &sl->man, why, sizeof(why));
	else
		snprintf(why, sizeof(why), "unreadable or empty");
	if (rc == 0) {
		if (strcmp(sl->man.job, j->name) || sl->man.rank != r->rank || sl->man.slot != i) {
			snprintf(why, sizeof(why), "describes job %s rank %u slot %u", sl->man.job, sl->man.rank, sl->man.slot);
			rc = SNAP_ECORRUPT;
		} else if (!has_data || sl->size < sl->man.layout.slot_bytes) {
			snprintf(why, sizeof(why), "slot file holds %" PRIu64 " of %" PRIu64 " bytes (truncated)", sl->size,
				 sl->man.layout.slot_bytes);
			rc = SNAP_ECORRUPT;
		}
		if (rc)
			snap_manifest_free(&sl->man);
	}
	if (rc == 0) {
		sl->state = SLOT_COMMITTED;
		sl->step = sl->man.step;
		if (sl->man.gen > j->gen)
			j->gen = sl->man.gen;
		sl->man_bytes = buf;
		sl->man_len = (uint32_t)got;
		return;
	}
	free(buf);
	r->discarded++;
	snap_store_logf(s, "discarding %s: %s", mpath, why);
	if (!s->read_only)
		unlink(mpath);
}

static int parse_uint(const char *s, const char *prefix, const char *suffix, uint32_t *out)
{
	size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(s);
	if (n <= pl + sl || strncmp(s, prefix, pl) || strcmp(s + n - sl, suffix))
		return 0;
	uint64_t v = 0;
	for (size_t i = pl; i < n - sl; i++) {
		if (s[i] < '0' || s[i] > '9' || v > (1u << 24))
			return 0;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = (uint32_t)v;
	return 1;
}

static void scan_rank(struct snap_store *s, struct store_job *j, const char *dir, uint32_t rank)
{
	struct store_rank *r = snap_store_rank(s, j, rank, 1);
	if (!r)
		return;
	DIR *d = opendir(dir);
	if (!d && errno == EACCES)
		note_denied(s, dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		uint32_t i;
		size_t n = strlen(e->d_name);
		if (n > 4 && strcmp(e->d_name + n - 4, ".tmp") == 0) {
			char p[SNAP_FILE_MAX];
			if (join(p, sizeof(p), dir, e->d_name))
				continue;
			snap_store_logf(s, "removing leftover %s", p);
			if (!s->read_only)
				unlink(p);
		} else if ((parse_uint(e->d_name, "slot-", "", &i) || parse_uint(e->d_name, "slot-", ".man", &i)) &&
			   i >= s->nslots) {
			snap_store_logf(s, "%s/%s: slot %u is beyond the configured %u slots per rank; ignored (raise SNAP_SLOTS to use it)",
			      dir, e->d_name, i, s->nslots);
		}
	}
	if (d)
		closedir(d);
	for (uint32_t i = 0; i < s->nslots; i++)
		scan_slot(s, j, r, i);
}

/* The generation counter a previous daemon recorded (slots.c), if any. */
static void load_generation(struct snap_store *s, struct store_job *j, const char *jdir)
{
	char path[SNAP_FILE_MAX], why[128], text[32];
	struct stat st;
	if (join(path, sizeof(path), jdir, "generation"))
		return;
	int fd = snap_store_open_regular(path, O_RDONLY, &st, why, sizeof(why));
	if (fd < 0) {
		if (errno != ENOENT)
			snap_store_logf(s, "skipping %s: %s", path, why);
		return;
	}
	ssize_t n = read(fd, text, sizeof(text) - 1);
	close(fd);
	char *end;
	text[n > 0 ? n : 0] = '\0';
	uint64_t g = strtoull(text, &end, 10);
	if (n <= 0 || end == text || (*end && *end != '\n'))
		snap_store_logf(s, "ignoring %s: not a generation number", path);
	else if (g > j->gen)
		j->gen = g;
}

static int scan(struct snap_store *s)
{
	DIR *d = opendir(s->root);
	if (!d) {
		if (errno == EACCES)
			note_denied(s, s->root);
		return errno == EACCES ? SNAP_EPERM : SNAP_EIO;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		char jdir[SNAP_FILE_MAX];
		struct stat st;
		if (!snap_job_name_ok(e->d_name))
			continue;
		snprintf(jdir, sizeof(jdir), "%s/%s", s->root, e->d_name);
		if (stat(jdir, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		struct store_job *j = snap_store_job(s, e->d_name, 1);
		DIR *jd = j ? opendir(jdir) : NULL;
		if (j && !jd && errno == EACCES)
			note_denied(s, jdir);
		if (j)
			load_generation(s, j, jdir);
		struct dirent *re;
		while (jd && (re = readdir(jd))) {
			uint32_t rank;
			if (strcmp(re->d_name, "files") == 0)
				j->files_ver = 1;   /* captured files: unknown to the mesh until it protects them */
			if (!parse_uint(re->d_name, "rank-", "", &rank))
				continue;
			char rdir[SNAP_FILE_MAX];
			if (join(rdir, sizeof(rdir), jdir, re->d_name))
				continue;
			scan_rank(s, j, rdir, rank);
		}
		if (jd)
			closedir(jd);
	}
	closedir(d);
	return 0;
}

int snap_store_open(struct snap_store **sp, const char *root, unsigned nslots, uint64_t mem_limit,
		    int read_only, void (*log)(const char *), char *err, size_t errlen)
{
	*sp = NULL;
	struct snap_store *s = calloc(1, sizeof(*s));
	if (!s)
		return SNAP_ENOMEM;
	s->lock_fd = -1;
	s->read_only = read_only;
	s->nslots = nslots;
	s->mem_limit = mem_limit;
	s->log = log;
	if (strlen(root) >= sizeof(s->root) - 1 || root[0] != '/') {
		snap_fmt(err, errlen, "store root \"%s\" must be an absolute path under %zu bytes", root, sizeof(s->root));
		free(s);
		return SNAP_EINVAL;
	}
	strcpy(s->root, root);
	struct stat st;
	if (!read_only) {
		if (mkdir(root, 0700) != 0 && errno != EEXIST) {
			snap_fmt(err, errlen, "cannot create store root %s: %s", root, strerror(errno));
			free(s);
			return errno == EACCES || errno == EROFS || errno == EPERM ? SNAP_EPERM : SNAP_EIO;
		}
		char lock[SNAP_FILE_MAX];
		snprintf(lock, sizeof(lock), "%s/smp.lock", root);
		s->lock_fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (s->lock_fd < 0) {
			snap_fmt(err, errlen, "cannot write in store root %s: %s", root, strerror(errno));
			free(s);
			return errno == EACCES || errno == EROFS || errno == EPERM ? SNAP_EPERM : SNAP_EIO;
		}
		if (flock(s->lock_fd, LOCK_EX | LOCK_NB) != 0) {
			snap_fmt(err, errlen, "store root %s is in use by another snapsmp", root);
			close(s->lock_fd);
			free(s);
			return SNAP_EBUSY;
		}
	}
	if (stat(root, &st) != 0 || !S_ISDIR(st.st_mode)) {
		snap_fmt(err, errlen, "store root %s is not a directory", root);
		snap_store_close(s);
		return SNAP_ENOENT;
	}
	if (!read_only && (st.st_mode & 077))
		chmod(root, 0700);
	scan(s);
	if (s->denied[0]) {
		/* An unreadable store is not an empty one: saying "nothing is
		 * recoverable" about data we could not read is a false loss report. */
		snap_fmt(err, errlen, "cannot read %s: permission denied (the store belongs to uid %u, mode %03o; "
			 "run as that user)", s->denied, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
		snap_store_close(s);
		return SNAP_EPERM;
	}
	*sp = s;
	return 0;
}

void snap_store_close(struct snap_store *s)
{
	if (!s)
		return;
	snap_reserver_free(s->resv);   /* first: its thread writes slot files */
	while (s->jobs) {
		struct store_job *j = s->jobs;
		s->jobs = j->next;
		for (uint32_t i = 0; i < j->nranks; i++) {
			struct store_rank *r = j->ranks[i];
			if (!r)
				continue;
			for (unsigned k = 0; k < s->nslots; k++)
				snap_store_slot_clear(&r->slots[k]);
			snap_layout_free(&r->layout);
			free(r->slots);
			free(r);
		}
		free(j->ranks);
		free(j);
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	free(s);
}
