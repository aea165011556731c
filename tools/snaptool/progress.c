/* SPDX-License-Identifier: BSD-3-Clause */
/* Progress bar of long snaptool commands; see progress.h. */
#include <stdio.h>
#include <unistd.h>

#include "snap/base.h" /* snap_now_ns */
#include "progress.h"

static void draw(struct st_progress *p)
{
	char bar[31];
	uint64_t t = snap_now_ns();
	double frac = p->total ? (double)p->done / (double)p->total : 1.0, secs = (double)(t - p->t0_ns) / 1e9;
	int fill = (int)(frac * 30.0 + 0.5);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	/* \r and erase-to-end: the line is rewritten in place on a terminal. */
	fprintf(stderr, "\r%s [%s] %3.0f%%  %.1f / %.1f MiB  %.0f MB/s\033[K", p->what, bar, frac * 100.0,
		(double)p->done / 1048576.0, (double)p->total / 1048576.0, secs > 0 ? (double)p->done / 1e6 / secs : 0.0);
	fflush(stderr);
	p->drawn_ns = t;
}

void st_progress_begin(struct st_progress *p, const char *what, uint64_t total)
{
	*p = (struct st_progress){ .on = isatty(STDERR_FILENO), .what = what, .total = total, .t0_ns = snap_now_ns() };
	if (p->on)
		draw(p);
}

void st_progress_add(struct st_progress *p, uint64_t bytes)
{
	p->done += bytes;
	if (p->on && snap_now_ns() - p->drawn_ns >= 100000000ull)
		draw(p);
}

void st_progress_hide(struct st_progress *p)
{
	if (!p->on)
		return;
	fputs("\r\033[K", stderr);
	fflush(stderr);
	p->drawn_ns = 0;   /* redraw at the next update */
}

void st_progress_end(struct st_progress *p)
{
	if (!p->on)
		return;
	draw(p);
	fputc('\n', stderr);
}
