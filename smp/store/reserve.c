/* SPDX-License-Identifier: BSD-3-Clause */
/* Slot files reserved by a thread of their own: reserve.h says why. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "store/reserve.h"
#include "snap/base.h"

/* A RUNNING item whose caller waits is HANDED back after the piece under
 * way: the caller finishes it at its own priority (the thread's is lower,
 * and may not be raised again without privilege). */
enum { QUEUED, RUNNING, HANDED, DONE };

#define PIECE (64ull << 20)

struct item {
	uint64_t ticket, bytes;
	uint64_t at;                 /* HANDED: allocated up to here */
	int state, err_no, waited;
	struct item *next;
	char path[];
};

struct snap_reserver {
	pthread_mutex_t mu;
	pthread_cond_t work, done;
	pthread_t th;
	int started, stop;
	uint64_t next_ticket;
	unsigned long stolen, handed;
	struct item *head;           /* in submission order, finished ones included */
};

/*
 * Make path exactly bytes long, every byte allocated, from *at on (what
 * before it is allocated already). A longer file is cut first; a shorter
 * one grows a piece at a time through posix_fallocate, which sets the size
 * last, so a kill halfway never leaves a file that claims bytes it does not
 * have. With it, stops between pieces once its caller waits: -1, *at where
 * it stopped. Else 0 or an errno; a failure leaves the file empty. With
 * keep, the file stays open there (-1 if it never opened) for the caller to
 * close once it has published the result.
 */
static int reserve(const char *path, uint64_t bytes, uint64_t *at, struct snap_reserver *rv, struct item *it,
		   int *keep)
{
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (keep)
		*keep = -1;
	if (fd < 0)
		return errno;
	struct stat st;
	int e = fstat(fd, &st) != 0 ? errno : 0;
	if (!e && (uint64_t)st.st_size > bytes && ftruncate(fd, (off_t)bytes) != 0)
		e = errno;
	while (!e && *at < bytes) {
		if (it) {
			pthread_mutex_lock(&rv->mu);
			e = it->waited ? -1 : 0;
			pthread_mutex_unlock(&rv->mu);
			if (e)
				break;
		}
		uint64_t n = bytes - *at < PIECE ? bytes - *at : PIECE;
		if ((e = posix_fallocate(fd, (off_t)*at, (off_t)n)) == 0)
			*at += n;
	}
	if (e > 0 && ftruncate(fd, 0) != 0) {
		/* keep the first error */
	}
	if (keep)
		*keep = fd;
	else
		close(fd);
	return e;
}

int snap_reserve_file(const char *path, uint64_t bytes)
{
	uint64_t at = 0;
	return reserve(path, bytes, &at, NULL, NULL, NULL);
}

static void *reserver_main(void *arg)
{
	struct snap_reserver *rv = arg;
	/* Behind the trainers and the daemon's own thread when cores are short:
	 * a relaunched trainer's restore ran 0.08 s faster (`snapbench mesh`,
	 * 4 nodes and 4 trainers on 2 cores). An ACQUIRE that waits for the
	 * file under way takes it over after the current piece (HANDED). */
	setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
	pthread_mutex_lock(&rv->mu);
	for (;;) {
		struct item *it = rv->head;
		while (it && it->state != QUEUED)
			it = it->next;
		if (rv->stop)
			break;
		if (!it) {
			pthread_cond_wait(&rv->work, &rv->mu);
			continue;
		}
		it->state = RUNNING;
		pthread_mutex_unlock(&rv->mu);
		uint64_t at = 0;
		int fd;
		int e = reserve(it->path, it->bytes, &at, rv, it, &fd);
		pthread_mutex_lock(&rv->mu);
		it->at = at;
		it->err_no = e > 0 ? e : 0;
		it->state = e < 0 ? HANDED : DONE;
		pthread_cond_broadcast(&rv->done);
		/* Closed after the result is published: whoever watches the
		 * store for the close (inotify) finds it done. */
		if (fd >= 0)
			close(fd);
	}
	pthread_mutex_unlock(&rv->mu);
	return NULL;
}

struct snap_reserver *snap_reserver_new(void)
{
	struct snap_reserver *rv = calloc(1, sizeof(*rv));
	if (!rv)
		return NULL;
	pthread_mutex_init(&rv->mu, NULL);
	pthread_cond_init(&rv->work, NULL);
	pthread_cond_init(&rv->done, NULL);
	return rv;
}

void snap_reserver_free(struct snap_reserver *rv)
{
	if (!rv)
		return;
	pthread_mutex_lock(&rv->mu);
	rv->stop = 1;
	pthread_cond_broadcast(&rv->work);
	pthread_mutex_unlock(&rv->mu);
	if (rv->started)
		pthread_join(rv->th, NULL);
	while (rv->head) {
		struct item *it = rv->head;
		rv->head = it->next;
		free(it);
	}
	pthread_cond_destroy(&rv->done);
	pthread_cond_destroy(&rv->work);
	pthread_mutex_destroy(&rv->mu);
	free(rv);
}

int snap_reserver_submit(struct snap_reserver *rv, const char *path, uint64_t bytes, uint64_t *ticket)
{
	size_t len = strlen(path) + 1;
	struct item *it = calloc(1, sizeof(*it) + len);
	if (!it)
		return SNAP_ENOMEM;
	memcpy(it->path, path, len);
	it->bytes = bytes;
	pthread_mutex_lock(&rv->mu);
	if (!rv->started) {
		if (pthread_create(&rv->th, NULL, reserver_main, rv) != 0) {
			pthread_mutex_unlock(&rv->mu);
			free(it);
			return SNAP_EIO;
		}
		rv->started = 1;
	}
	it->ticket = *ticket = ++rv->next_ticket;
	struct item **tail = &rv->head;
	while (*tail)
		tail = &(*tail)->next;
	*tail = it;
	pthread_cond_signal(&rv->work);
	pthread_mutex_unlock(&rv->mu);
	return 0;
}

/* Unlink it from the list (rv->mu held). */
static void unlink_item(struct snap_reserver *rv, struct item *it)
{
	for (struct item **p = &rv->head; *p; p = &(*p)->next) {
		if (*p == it) {
			*p = it->next;
			return;
		}
	}
}

int snap_reserver_wait(struct snap_reserver *rv, uint64_t ticket)
{
	pthread_mutex_lock(&rv->mu);
	struct item *it = rv->head;
	while (it && it->ticket != ticket)
		it = it->next;
	if (!it) {
		pthread_mutex_unlock(&rv->mu);
		return 0;
	}
	/* Not started: done here rather than behind the others; under way:
	 * finished here from where the thread hands it back. */
	rv->stolen += it->state == QUEUED;
	it->waited = 1;
	while (it->state == RUNNING)
		pthread_cond_wait(&rv->done, &rv->mu);
	rv->handed += it->state == HANDED;
	unlink_item(rv, it);
	pthread_cond_broadcast(&rv->done);   /* a drain may be waiting for it */
	pthread_mutex_unlock(&rv->mu);
	int e = it->err_no;
	if (it->state != DONE)
		e = reserve(it->path, it->bytes, &it->at, NULL, NULL, NULL);
	free(it);
	return e;
}

int snap_reserver_take(struct snap_reserver *rv, uint64_t *ticket, int *err_no)
{
	pthread_mutex_lock(&rv->mu);
	struct item *it = rv->head;
	while (it && it->state != DONE)
		it = it->next;
	if (it)
		unlink_item(rv, it);
	pthread_mutex_unlock(&rv->mu);
	if (!it)
		return 0;
	*ticket = it->ticket;
	*err_no = it->err_no;
	free(it);
	return 1;
}

void snap_reserver_stats(struct snap_reserver *rv, int *busy, unsigned long *stolen, unsigned long *handed)
{
	pthread_mutex_lock(&rv->mu);
	*busy = 0;
	for (struct item *it = rv->head; it; it = it->next)
		*busy |= it->state == RUNNING;
	*stolen = rv->stolen;
	*handed = rv->handed;
	pthread_mutex_unlock(&rv->mu);
}

void snap_reserver_drain(struct snap_reserver *rv)
{
	pthread_mutex_lock(&rv->mu);
	for (;;) {
		struct item *it = rv->head;
		while (it && it->state != QUEUED && it->state != RUNNING)
			it = it->next;
		if (!it || !rv->started || rv->stop)
			break;
		pthread_cond_wait(&rv->done, &rv->mu);
	}
	pthread_mutex_unlock(&rv->mu);
}
