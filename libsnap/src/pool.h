/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pool.h - a fixed set of copy threads running one job at a time. A job is
 * `ntasks` independent tasks; the thread that finishes the last one runs the
 * job's completion callback, which may block (the commit round trip) while
 * the other threads already serve the next job.
 */
#ifndef SNAP_POOL_H
#define SNAP_POOL_H

#include <stdint.h>

struct snap_pool;

typedef void (*snap_task_fn)(void *arg, uint32_t task);
typedef void (*snap_done_fn)(void *arg);

/* Start n threads. 0 or SNAP_ENOMEM / SNAP_EIO. */
int snap_pool_start(struct snap_pool **pp, unsigned n);

/*
 * Queue a job. Waits while the previous job still has tasks being handed out
 * (callers fence before submitting, so this does not block in practice).
 * ntasks == 0 runs done() on the calling thread.
 */
void snap_pool_submit(struct snap_pool *p, uint32_t ntasks, snap_task_fn fn, snap_done_fn done, void *arg);

/* Finish the current job, stop and join every thread, free. NULL is a no-op. */
void snap_pool_stop(struct snap_pool *p);

#endif
