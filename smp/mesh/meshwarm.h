/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * meshwarm.h - the warm-up's plan (meshwarm.c: what to map, create and at
 * what length, on the mesh thread) and its worker (warmworker.c: the thread
 * that creates, maps and faults in the files) share this queue. Not an API;
 * calls go one way: meshwarm.c -> warmworker.c.
 *
 * Threads: the mesh thread owns struct mesh_warm's job list and the pool;
 * the worker sees only its queue (mu).
 */
#ifndef SNAP_MESH_WARM_H
#define SNAP_MESH_WARM_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "snap/store.h"   /* SNAP_FILE_MAX */
#include "snap/types.h"   /* SNAP_JOB_MAX */

#define MESH_WARM_PAGE 4096u

enum { W_SLOT, W_PARITY, W_PROT, W_SPARE };   /* what a request is */
enum { Q_QUEUED, Q_RUNNING, Q_DONE };

struct wreq {
	int kind, state, err_no;
	uint64_t len, step;       /* W_PROT: the protected step whose parity it is */
	unsigned idx;             /* W_PARITY: the pool file's number */
	void *addr;
	dev_t dev;
	ino_t ino;
	char job[SNAP_JOB_MAX + 1];
	char path[SNAP_FILE_MAX];
	struct wreq *next;
};

struct wjob;

struct mesh_warm {
	pthread_mutex_t mu;
	pthread_cond_t cv, done;
	pthread_t th;
	int started, stop;
	struct wreq *q;           /* [mu] queued, running and done requests */
	struct wjob *jobs;        /* mesh thread */
};

/* ---- warmworker.c ---- */

/* A warm-up with its worker thread running; NULL when none could start. */
struct mesh_warm *mesh_warm_start(void);
/* Queue a request (len, step and idx as struct wreq); -1 when it is not. */
int mesh_warm_queue(struct mesh_warm *w, int kind, const char *job, const char *path, uint64_t len, uint64_t step,
		    unsigned idx);
/* Whether a request for path is in the queue (any state). */
int mesh_warm_pending(struct mesh_warm *w, const char *path);
/* Requests of job not taken yet, of any kind. */
int mesh_warm_pending_job(struct mesh_warm *w, const char *job);
/* Requests of job of that kind not taken yet. */
unsigned mesh_warm_queued(struct mesh_warm *w, const char *job, int kind);
/* A finished request, out of the queue (the caller frees it); NULL if none. */
struct wreq *mesh_warm_done(struct mesh_warm *w);
/* The request for path (or, path NULL, job's requests of kind) finished:
 * done here when the worker has not started it, waited for when it has. */
void mesh_warm_wait(struct mesh_warm *w, const char *path, const char *job, int kind);
/* Stop and join the worker; the queue's requests unmapped and freed. */
void mesh_warm_stop(struct mesh_warm *w);
/* After mesh_warm_stop: w itself. */
void mesh_warm_destroy(struct mesh_warm *w);

#endif
