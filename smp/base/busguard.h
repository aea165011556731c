/* SPDX-License-Identifier: BSD-3-Clause */
/* busguard.h - reads of a mapped file that may be truncated underneath; see busguard.c. */
#ifndef SNAP_BUSGUARD_H
#define SNAP_BUSGUARD_H

/* Install the SIGBUS handler (once, on the main thread before other threads
 * start; later calls do nothing). Without it smp_bus_guarded runs nothing. */
void smp_bus_guard_init(void);
/* fn(arg) on this thread with a SIGBUS it raises (a page of a mapped file
 * truncated underneath) turned into a return: 0 when fn ran through, -1
 * when it faulted (what it did up to the fault stays done), -2 when the
 * handler is not installed (fn did not run). */
int smp_bus_guarded(void (*fn)(void *), void *arg);

#endif
