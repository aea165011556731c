/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * warmworker.c - the mesh warm-up's worker: a thread (at nice 10, as the
 * slot reservations) that takes the requests the plan (meshwarm.c) queues
 * and, for each, creates or opens the file, maps it and touches every page,
 * so that the mesh thread finds it mapped and faulted in. Why, and which
 * files: meshwarm.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/busguard.h"
#include "mesh/meshwarm.h"

struct touch {
	volatile uint8_t *b;
	uint64_t len;
	int write;
};

static void touch_pages(void *arg)
{
	struct touch *t = arg;
	uint8_t sum = 0;
	for (uint64_t o = 0; o < t->len; o += MESH_WARM_PAGE) {
		uint8_t v = t->b[o];
		if (t->write)
			t->b[o] = v;
		sum ^= v;
	}
	(void)sum;
}

static int map_touch(struct wreq *r)
{
	int rw = r->kind != W_SLOT, fd;
	if (r->kind == W_PARITY) {
		fd = open(r->path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd >= 0 && (ftruncate(fd, (off_t)r->len) != 0 || (errno = posix_fallocate(fd, 0, (off_t)r->len)) != 0)) {
			int e = errno;
			close(fd);
			unlink(r->path);
			return e;
		}
	} else {
		fd = open(r->path, (rw ? O_RDWR : O_RDONLY) | O_CLOEXEC | O_NOFOLLOW);
	}
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return e;
	}
	if (r->kind != W_PARITY && r->kind != W_SLOT)
		r->len = (uint64_t)st.st_size;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < r->len || !r->len) {
		close(fd);
		return EINVAL;
	}
	/* Only a file whose pages are all there: a page of a hole, read on a
	 * full tmpfs (a reservation that ran out of space), is allocated by the
	 * fault, and its ENOSPC is a SIGBUS that would kill the daemon. */
	if ((uint64_t)st.st_blocks * 512 < r->len) {
		close(fd);
		return ENOSPC;
	}
	void *p = mmap(NULL, r->len, PROT_READ | (rw ? PROT_WRITE : 0), MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return errno;
	/* The first touch through this mapping is what costs (a trap per page on
	 * a shadow-paged VM, even after MAP_POPULATE): pay it here. A new pool
	 * file is the worker's alone until the mesh thread takes it, so its
	 * pages are touched for writing, as the encode will (a byte written back
	 * as it was read). Every other file is only read: a protect may be
	 * writing into a spare or kept parity file at this very moment, and a
	 * byte written back from before its write would undo it. */
	/* Under the SIGBUS guard: a file cut behind the daemon's back (a damaged
	 * store) loses its pages under the mapping, and the touch would kill
	 * the daemon. Such a file is not warmed; a protect or repair meets it. */
	struct touch t = { p, r->len, r->kind == W_PARITY };
	if (smp_bus_guarded(touch_pages, &t) == -1) {
		munmap(p, r->len);
		return EIO;
	}
	r->addr = p;
	r->dev = st.st_dev;
	r->ino = st.st_ino;
	return 0;
}

/* [mu held] Queued request r, done outside the lock (by the worker, or by
 * the mesh thread that would otherwise wait for it). */
static void run(struct mesh_warm *w, struct wreq *r)
{
	r->state = Q_RUNNING;
	pthread_mutex_unlock(&w->mu);
	int e = map_touch(r);
	pthread_mutex_lock(&w->mu);
	r->err_no = e;
	r->state = Q_DONE;
}

static void *worker(void *arg)
{
	struct mesh_warm *w = arg;
	/* Behind the trainers, the poll thread and the protects: what it does
	 * is ahead of time by definition. */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	pthread_mutex_lock(&w->mu);
	while (!w->stop) {
		struct wreq *r = w->q;
		while (r && r->state != Q_QUEUED)
			r = r->next;
		if (!r) {
			pthread_cond_wait(&w->cv, &w->mu);
			continue;
		}
		run(w, r);
		pthread_cond_broadcast(&w->done);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

struct mesh_warm *mesh_warm_start(void)
{
	struct mesh_warm *w = calloc(1, sizeof(*w));
	if (!w)
		return NULL;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	pthread_cond_init(&w->done, NULL);
	if (pthread_create(&w->th, NULL, worker, w) != 0) {
		pthread_cond_destroy(&w->done);
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		free(w);
		return NULL;
	}
	w->started = 1;
	return w;
}

int mesh_warm_pending(struct mesh_warm *w, const char *path)
{
	int found = 0;
	pthread_mutex_lock(&w->mu);
	for (struct wreq *r = w->q; r && !found; r = r->next)
		found = !strcmp(r->path, path);
	pthread_mutex_unlock(&w->mu);
	return found;
}

int mesh_warm_queue(struct mesh_warm *w, int kind, const char *job, const char *path, uint64_t len, uint64_t step,
		    unsigned idx)
{
	size_t jl = strlen(job), pl = strlen(path);
	if (jl >= sizeof(((struct wreq *)0)->job) || pl >= sizeof(((struct wreq *)0)->path))
		return -1;   /* a cut path would name another file: not made ahead */
	struct wreq *r = calloc(1, sizeof(*r));
	if (!r)
		return -1;
	r->kind = kind;
	r->len = len;
	r->step = step;
	r->idx = idx;
	memcpy(r->job, job, jl + 1);
	memcpy(r->path, path, pl + 1);
	pthread_mutex_lock(&w->mu);
	struct wreq **t = &w->q;
	while (*t)
		t = &(*t)->next;
	*t = r;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return 0;
}

unsigned mesh_warm_queued(struct mesh_warm *w, const char *job, int kind)
{
	unsigned n = 0;
	pthread_mutex_lock(&w->mu);
	for (struct wreq *r = w->q; r; r = r->next)
		n += r->kind == kind && !strcmp(r->job, job);
	pthread_mutex_unlock(&w->mu);
	return n;
}

int mesh_warm_pending_job(struct mesh_warm *w, const char *job)
{
	int n = 0;
	pthread_mutex_lock(&w->mu);
	for (struct wreq *r = w->q; r; r = r->next)
		n += !strcmp(r->job, job);
	pthread_mutex_unlock(&w->mu);
	return n;
}

struct wreq *mesh_warm_done(struct mesh_warm *w)
{
	pthread_mutex_lock(&w->mu);
	struct wreq **pp = &w->q, *r;
	while ((r = *pp) && r->state != Q_DONE)
		pp = &r->next;
	if (r)
		*pp = r->next;
	pthread_mutex_unlock(&w->mu);
	return r;
}

/* Whether r is what mesh_warm_wait() waits for: the request for path, or
 * (path NULL) job's requests of that kind. */
static int settles(const struct wreq *r, const char *path, const char *job, int kind)
{
	if (path)
		return strcmp(r->path, path) == 0;
	return r->kind == kind && job && strcmp(r->job, job) == 0;
}

void mesh_warm_wait(struct mesh_warm *w, const char *path, const char *job, int kind)
{
	for (;;) {
		pthread_mutex_lock(&w->mu);
		struct wreq *r = w->q;
		while (r && (r->state == Q_DONE || !settles(r, path, job, kind)))
			r = r->next;
		if (r && r->state == Q_QUEUED) {
			run(w, r);
		} else if (r) {
			while (r->state != Q_DONE)
				pthread_cond_wait(&w->done, &w->mu);
		}
		pthread_mutex_unlock(&w->mu);
		if (!r)
			break;
	}
}

void mesh_warm_stop(struct mesh_warm *w)
{
	pthread_mutex_lock(&w->mu);
	w->stop = 1;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
	if (w->started)
		pthread_join(w->th, NULL);
	while (w->q) {
		struct wreq *r = w->q;
		w->q = r->next;
		if (r->state == Q_DONE && !r->err_no && r->addr)
			munmap(r->addr, r->len);
		free(r);
	}
}

void mesh_warm_destroy(struct mesh_warm *w)
{
	pthread_cond_destroy(&w->done);
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w);
}
