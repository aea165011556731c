/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * harness.h - start and stop a real snapsmp on a private store for a test.
 * SNAPSMP_PATH is the built daemon (set by CMake).
 */
#ifndef SNAP_TEST_HARNESS_H
#define SNAP_TEST_HARNESS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "snap/snap.h"

struct smp_proc {
	pid_t pid;
	char store[128];
	char socket[160];
};

static inline int smp_connectable(const char *path)
{
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(a.sun_path)) {
		close(s);
		return 0;
	}
	memcpy(a.sun_path, path, strlen(path) + 1);
	int ok = connect(s, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(s);
	return ok;
}

/* One generous deadline, for hangs only: the waits below end at their event
 * (the socket accepts, the process exits), however slow the build. */
#define SMP_DEADLINE_MS 120000

static inline long long smp_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Start snapsmp with extra args (NULL-terminated list). Waits until it listens. */
static inline int smp_start(struct smp_proc *p, const char *store, const char *const *extra)
{
	if (p->store != store)
		snprintf(p->store, sizeof(p->store), "%s", store);
	snprintf(p->socket, sizeof(p->socket), "%s/smp.sock", p->store);
	store = p->store;
	p->pid = fork();
	if (p->pid == 0) {
		/* No background scrub unless extra asks for one (a later flag
		 * wins): these tests damage slots and then restore them. */
		const char *argv[32] = { SNAPSMP_PATH, "--store", store, "--quiet", "--scrub-rate", "0" };
		int n = 6;
		for (; extra && *extra && n < 30; extra++)
			argv[n++] = *extra;
		argv[n] = NULL;
		execv(SNAPSMP_PATH, (char *const *)argv);
		_exit(127);
	}
	for (long long end = smp_now_ms() + SMP_DEADLINE_MS; smp_now_ms() < end;) {
		int st;
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			p->pid = 0;
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
		}
		if (smp_connectable(p->socket))
			return 0;
		struct timespec ts = { 0, 10 * 1000000 };
		nanosleep(&ts, NULL);
	}
	return -1;
}

/* Run snapsmp to completion (it is expected to refuse to start): exit code. */
static inline int smp_run_fail(const char *store)
{
	pid_t pid = fork();
	if (pid == 0) {
		execl(SNAPSMP_PATH, SNAPSMP_PATH, "--store", store, "--quiet", (char *)NULL);
		_exit(127);
	}
	for (long long end = smp_now_ms() + SMP_DEADLINE_MS; smp_now_ms() < end;) {
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid)
			return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
		struct timespec ts = { 0, 10 * 1000000 };
		nanosleep(&ts, NULL);
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	return -1;
}

/* Stop with sig (SIGTERM: clean; SIGKILL: crash). Returns the exit status. */
static inline int smp_stop(struct smp_proc *p, int sig)
{
	int st = 0;
	if (p->pid <= 0)
		return -1;
	kill(p->pid, sig);
	waitpid(p->pid, &st, 0);
	p->pid = 0;
	return st;
}

static inline void smp_cfg(struct snap_config *c, const struct smp_proc *p, const char *job, int rank, int world)
{
	snap_config_init(c);
	snprintf(c->store, sizeof(c->store), "%s", p->store);
	snprintf(c->socket, sizeof(c->socket), "%s", p->socket);
	snprintf(c->job, sizeof(c->job), "%s", job);
	c->rank = rank;
	c->world_size = world;
	c->timeout_ms = 60000; /* for hangs only: ranks wait on each other's events */
	/* The tests start, kill and restart their daemon themselves. */
	c->autostart = SNAP_AUTOSTART_OFF;
}

static inline void rm_rf(const char *path)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", path);
}

#endif
