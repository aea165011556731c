/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh_util.c - what the three parts of `snapbench mesh` (the driver
 * bench_mesh.c, the nodes bench_mesh_nodes.c, the trainers
 * bench_mesh_trainers.c) all use: the stop flag SIGINT/SIGTERM set, a
 * short nap, and the message prefix. Kept apart so that the parts call
 * down into this file, never back into each other.
 */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "bench_mesh.h"

volatile sig_atomic_t bm_stop;

static void on_signal(int sig)
{
	bm_stop = sig;
}

void bm_nap_ms(int ms)
{
	struct timespec ts = { 0, ms * 1000000L };
	nanosleep(&ts, NULL);
}

void bm_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "snapbench mesh: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

void bm_signals_catch(struct bm_signals *old)
{
	struct sigaction sa = { .sa_handler = on_signal }, ign = { .sa_handler = SIG_IGN };
	sigemptyset(&sa.sa_mask);
	sigemptyset(&ign.sa_mask);
	sigaction(SIGINT, &sa, &old->intr);
	sigaction(SIGTERM, &sa, &old->term);
	/* A trainer that died must not take the benchmark with it when it is
	 * told to go: the mesh (in a session of its own) would outlive us. */
	sigaction(SIGPIPE, &ign, &old->pipe);
}

void bm_signals_restore(const struct bm_signals *old)
{
	sigaction(SIGINT, &old->intr, NULL);
	sigaction(SIGTERM, &old->term, NULL);
	sigaction(SIGPIPE, &old->pipe, NULL);
}
