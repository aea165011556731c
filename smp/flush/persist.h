/* SPDX-License-Identifier: BSD-3-Clause */
/* persist.h - the flush policy (persist.c): when to flush which step, and
 * what to tell who asked. Called by the daemon's loop and requests. */
#ifndef SNAP_SMP_PERSIST_H
#define SNAP_SMP_PERSIST_H

#include <stddef.h>
#include <stdint.h>

struct smp;
struct conn;
struct store_job;
struct snap_rbuf;

/* After a commit: count new restorable steps, flush every F-th. */
void persist_on_commit(struct smp *m, struct store_job *j);
/* Flush `step` (SNAP_STEP_LATEST: the newest restorable) of j now or after the current flush. */
int persist_request(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen);
/* SIGUSR1 / SIGTERM: flush the newest restorable step of every job. */
void persist_all(struct smp *m, const char *why);
/* The interval timer: milliseconds until the next check (-1: none). */
int persist_timeout_ms(struct smp *m);
void persist_tick(struct smp *m);
/* Finished flushes: unpin, record, answer waiters, start queued ones. */
void persist_collect(struct smp *m);
/* A FLUSH message (allowed without HELLO). */
int persist_on_flush_msg(struct smp *m, struct conn *c, struct snap_rbuf *r, char *err, int *deferred);
/* Mesh: the mesh thread changed flush state (snap_mesh_fd readable):
 * answer FLUSH waiters whose step is persisted or failed. */
void persist_mesh_update(struct smp *m);
/* Flushes still running or queued (mesh: also one wanted or agreed and not sealed). */
int persist_busy(const struct smp *m);

#endif
