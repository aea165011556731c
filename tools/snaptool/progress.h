/* SPDX-License-Identifier: BSD-3-Clause */
/* progress.h - a progress bar on stderr, drawn only when stderr is a terminal. */
#ifndef SNAPTOOL_PROGRESS_H
#define SNAPTOOL_PROGRESS_H

#include <stdint.h>

struct st_progress {
	int on;                 /* stderr is a terminal */
	const char *what;
	uint64_t total, done, t0_ns, drawn_ns;
};

/* Start a bar over `total` bytes (drawn at once when stderr is a terminal;
 * a pipe or a file gets nothing, so scripts parse clean output). */
void st_progress_begin(struct st_progress *p, const char *what, uint64_t total);
/* `bytes` more are done; redraws at most 10 times a second. */
void st_progress_add(struct st_progress *p, uint64_t bytes);
/* Erase the bar before printing a line to the terminal; the next update redraws it. */
void st_progress_hide(struct st_progress *p);
/* Draw the final state and end the line. */
void st_progress_end(struct st_progress *p);

#endif
