/* SPDX-License-Identifier: BSD-3-Clause */
/* progress.h - a progress bar on stderr, drawn only when stderr is a terminal. */
#ifndef SNAPTOOL_PROGRESS_H
#define SNAPTOOL_PROGRESS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

struct st_progress {
	int on;                 /* stderr is a terminal and not --quiet */
	const char *what;
	uint64_t total, done, t0_ns, drawn_ns;
	/* st_progress_watch_reads: the sampling thread */
	pthread_t th;
	int watching;
	atomic_int stop;
	uint64_t rchar0;
};

/* --quiet: no bar at all (set by st_parse). */
extern int st_progress_off;

/* Start a bar over `total` bytes (drawn at once when stderr is a terminal;
 * a pipe or a file gets nothing, so scripts parse clean output). */
void st_progress_begin(struct st_progress *p, const char *what, uint64_t total);
/* `bytes` more are done; redraws at most 10 times a second. */
void st_progress_add(struct st_progress *p, uint64_t bytes);
/* Set the bytes done (a count observed from outside, e.g. a file's size). */
void st_progress_set(struct st_progress *p, uint64_t done);
/* Erase the bar before printing a line to the terminal; the next update redraws it. */
void st_progress_hide(struct st_progress *p);
/* Draw the final state and end the line. */
void st_progress_end(struct st_progress *p);

/*
 * For a library call that reads a known amount without telling its
 * progress (snap_io_verify_step, snap_io_export): a thread samples the
 * bytes this process has read (rchar in /proc/self/io) every 100 ms and
 * redraws. Between watch and unwatch only that thread touches the bar.
 * Nothing happens when the bar is off.
 */
void st_progress_watch_reads(struct st_progress *p);
void st_progress_unwatch(struct st_progress *p);

/* Bytes of the regular files in `dir` (not recursive); 0 when unreadable. */
uint64_t st_dir_bytes(const char *dir);

#endif
