/* SPDX-License-Identifier: BSD-3-Clause */
/* Copy threads; see pool.h. */
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>

#include "pool.h"
#include "snap/error.h"

struct snap_pool {
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	pthread_t *threads;
	unsigned nthreads;
	int stop;
	/* the current job */
	snap_task_fn fn;
	snap_done_fn done;
	void *arg;
	uint32_t ntasks, next, remaining;
};

static void *worker(void *vp)
{
	struct snap_pool *p = vp;
	pthread_mutex_lock(&p->mu);
	for (;;) {
		if (p->next < p->ntasks) {
			uint32_t t = p->next++;
			snap_task_fn fn = p->fn;
			void *arg = p->arg;
			pthread_mutex_unlock(&p->mu);
			fn(arg, t);
			pthread_mutex_lock(&p->mu);
			if (--p->remaining == 0) {
				snap_done_fn done = p->done;
				p->ntasks = p->next = 0;
				pthread_cond_broadcast(&p->idle);
				pthread_mutex_unlock(&p->mu);
				if (done)
					done(arg);
				pthread_mutex_lock(&p->mu);
			}
			continue;
		}
		if (p->stop)
			break;
		pthread_cond_wait(&p->work, &p->mu);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int snap_pool_start(struct snap_pool **pp, unsigned n)
{
	struct snap_pool *p = calloc(1, sizeof(*p));
	if (!p)
		return SNAP_ENOMEM;
	p->threads = calloc(n, sizeof(pthread_t));
	if (!p->threads) {
		free(p);
		return SNAP_ENOMEM;
	}
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->idle, NULL);
	for (unsigned i = 0; i < n; i++) {
		if (pthread_create(&p->threads[i], NULL, worker, p) != 0) {
			p->nthreads = i;
			snap_pool_stop(p);
			return SNAP_EIO;
		}
		p->nthreads = i + 1;
#ifdef SCHED_BATCH
		/*
		 * A save wakes every copy thread just before it returns; as
		 * normal threads they would preempt the trainer on a busy
		 * machine, and the save would return only when the scheduler
		 * hands the core back (milliseconds). A batch thread does not
		 * preempt on wakeup; it still gets its fair share of the CPU
		 * (same nice level). Set here rather than by the thread, so it
		 * holds when snap_open returns (glibc's attributes take only
		 * OTHER, FIFO and RR). Best effort: refused, the thread stays
		 * as it was.
		 */
		struct sched_param sp = { 0 };
		(void)pthread_setschedparam(p->threads[i], SCHED_BATCH, &sp);
#endif
	}
	*pp = p;
	return 0;
}

void snap_pool_submit(struct snap_pool *p, uint32_t ntasks, snap_task_fn fn, snap_done_fn done, void *arg)
{
	if (ntasks == 0) {
		if (done)
			done(arg);
		return;
	}
	pthread_mutex_lock(&p->mu);
	while (p->remaining > 0)
		pthread_cond_wait(&p->idle, &p->mu);
	p->fn = fn;
	p->done = done;
	p->arg = arg;
	p->ntasks = p->remaining = ntasks;
	p->next = 0;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
}

void snap_pool_stop(struct snap_pool *p)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->mu);
	while (p->remaining > 0)
		pthread_cond_wait(&p->idle, &p->mu);
	p->stop = 1;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->nthreads; i++)
		pthread_join(p->threads[i], NULL);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->idle);
	free(p->threads);
	free(p);
}
