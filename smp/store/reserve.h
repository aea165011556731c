/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * reserve.h - slot files reserved by a thread of their own (reserve.c).
 *
 * posix_fallocate() of a slot on tmpfs allocates and clears every page of
 * it. Done at REGISTER in the daemon's one thread, it held up every request
 * behind it: a relaunched trainer on a replaced node waited for its empty
 * slots to be reserved before its RESTORE was even read (perf: a fifth of
 * the trainers' restore phase in `snapbench mesh`). Now the store counts the
 * bytes against its budget at REGISTER and queues the files here; one thread
 * reserves them in order. Whoever needs a slot's file settled (an ACQUIRE of
 * it, a new layout, a recommit) waits for its ticket, and does the work
 * itself when the thread has not started it yet, or takes it over after the
 * piece under way when it has (the thread runs at a lower priority).
 *
 * The thread touches nothing but its queue and the files; the store applies
 * a result (snap_store_settle, slots.c) in the thread that owns it.
 */
#ifndef SNAP_SMP_RESERVE_H
#define SNAP_SMP_RESERVE_H

#include <stdint.h>

struct snap_reserver;

/* A reserver; its thread starts with the first submit. NULL: out of memory. */
struct snap_reserver *snap_reserver_new(void);
/* Stop the thread once its current file is done; queued files are dropped
 * (they keep whatever size they had). NULL is allowed. */
void snap_reserver_free(struct snap_reserver *rv);

/* Queue "make path exactly bytes long, every byte allocated". *ticket > 0
 * names it. 0, or SNAP_ENOMEM / SNAP_EIO (no thread): reserve it yourself. */
int snap_reserver_submit(struct snap_reserver *rv, const char *path, uint64_t bytes, uint64_t *ticket);

/* Wait for ticket (doing it here when it is still queued) and forget it:
 * 0, or the errno it failed with. A ticket unknown (already taken) is 0. */
int snap_reserver_wait(struct snap_reserver *rv, uint64_t ticket);

/* A finished ticket, taken without waiting: 1 and *ticket, *err_no set; 0 when none. */
int snap_reserver_take(struct snap_reserver *rv, uint64_t *ticket, int *err_no);

/* The work itself, for whoever does it: 0 or an errno. On failure the file
 * is left empty, so nothing can map bytes that were never allocated. */
int snap_reserve_file(const char *path, uint64_t bytes);

/* Wait until the thread has nothing queued or under way (tests: what it
 * did is then all there for snap_reserver_take). */
void snap_reserver_drain(struct snap_reserver *rv);

/* Whether the thread is reserving a file now, and how many files waiters
 * did themselves: taken from the queue (stolen), or taken over part-way
 * (handed: the thread stops between 64 MiB pieces once a caller waits). */
void snap_reserver_stats(struct snap_reserver *rv, int *busy, unsigned long *stolen, unsigned long *handed);

#endif
