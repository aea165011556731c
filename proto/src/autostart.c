/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Starting snapsmp for a client that found none (SNAP_AUTOSTART): libsnap.so
 * and the preload both call this when connect() on the store's socket finds
 * no listener. snapsmp --detach does the detaching (its own session, its
 * descriptors closed, log STORE/snapsmp.log) and exits once its child serves
 * the store, or with 3 when another snapsmp holds the store's lock: the lock
 * decides a race of first clients, so a node gets exactly one daemon.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "snap/proto.h"

extern char **environ;

/* From CMake: <bindir> relative to <libdir> of the installed layout, and
 * smp/ relative to the folder of a library in the build tree. */
#ifndef SNAP_LIB_TO_BIN
#define SNAP_LIB_TO_BIN "../bin"
#endif
#ifndef SNAP_BUILD_LIB_TO_SMP
#define SNAP_BUILD_LIB_TO_SMP "../smp"
#endif

/* access(2) without the preload's interposer: the path may lie under a
 * captured directory, and asking the preload about it from inside its own
 * connect would re-enter it. */
static int can_exec(const char *path)
{
	return syscall(SYS_faccessat, AT_FDCWD, path, X_OK) == 0 ? 0 : -1;
}

/* $SNAPSMP (as snapbench reads it), else snapsmp in the prefix this library
 * is installed in (or beside it in the build tree), else "snapsmp" on PATH. */
static int find_smp(char *out, size_t cap, int *on_path, char *err, size_t errlen)
{
	*on_path = 0;
	const char *env = getenv("SNAPSMP");
	if (env && *env) {
		errno = 0;
		if (can_exec(env) != 0 || snprintf(out, cap, "%s", env) >= (int)cap) {
			snap_fmt(err, errlen, "SNAPSMP=%s: %s", env, errno ? strerror(errno) : "path too long");
			return SNAP_ENOENT;
		}
		return 0;
	}
	Dl_info di;
	if (dladdr((void *)&snap_smp_autostart, &di) && di.dli_fname) {
		const char *slash = strrchr(di.dli_fname, '/');
		int dirlen = slash ? (int)(slash - di.dli_fname) : 0;
		static const char *const rel[] = { SNAP_LIB_TO_BIN, SNAP_BUILD_LIB_TO_SMP };
		for (size_t i = 0; slash && i < sizeof(rel) / sizeof(rel[0]); i++)
			if (snprintf(out, cap, "%.*s/%s/snapsmp", dirlen, di.dli_fname, rel[i]) < (int)cap &&
			    can_exec(out) == 0)
				return 0;
	}
	snprintf(out, cap, "snapsmp");
	*on_path = 1;
	return 0;
}

/* The environment minus LD_PRELOAD: a daemon under the preload would capture
 * its own store's files. NULL on ENOMEM. */
static char **child_env(void)
{
	size_t n = 0;
	while (environ && environ[n])
		n++;
	char **env = malloc((n + 1) * sizeof(*env));
	if (!env)
		return NULL;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		if (strncmp(environ[i], "LD_PRELOAD=", 11) != 0)
			env[k++] = environ[i];
	env[k] = NULL;
	return env;
}

/* Wait for snapsmp --detach to exit, until deadline_ns. Its exit code, -1 when
 * it is unknown (SIGCHLD ignored: the kernel reaped it), -2 on the deadline. */
static int wait_exit(pid_t pid, uint64_t deadline_ns)
{
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd >= 0) {
		struct pollfd p = { .fd = pfd, .events = POLLIN };
		for (;;) {
			uint64_t now = snap_now_ns();
			int ms = now >= deadline_ns ? 0 : (int)((deadline_ns - now + 999999) / 1000000);
			int r = poll(&p, 1, ms);
			if (r > 0 || (r < 0 && errno != EINTR))
				break;
			if (r == 0) {
				close(pfd);
				kill(pid, SIGKILL);   /* the waiting parent only; a daemon it forked goes on */
				waitpid(pid, NULL, 0);
				return -2;
			}
		}
		close(pfd);
	}
	int st;
	pid_t r;
	while ((r = waitpid(pid, &st, 0)) < 0 && errno == EINTR)
		;
	if (r != pid)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int snap_smp_autostart(const char *store, const char *sock, uint64_t deadline_ns, char *err, size_t errlen)
{
	char prog[4096];
	int on_path;
	int rc = find_smp(prog, sizeof(prog), &on_path, err, errlen);
	if (rc)
		return rc;
	char *argv[] = { prog, "--detach", "--store", (char *)store, "--socket", (char *)sock, NULL };
	char **env = child_env();
	if (!env) {
		snap_fmt(err, errlen, "autostart: out of memory");
		return SNAP_ENOMEM;
	}
	/* Quiet: its failures are told below and in its log; the child it forks
	 * takes /dev/null itself. Signals as a fresh program expects them. */
	posix_spawn_file_actions_t fa;
	posix_spawnattr_t at;
	posix_spawn_file_actions_init(&fa);
	posix_spawnattr_init(&at);
	for (int fd = 0; fd < 3; fd++)
		posix_spawn_file_actions_addopen(&fa, fd, "/dev/null", O_RDWR, 0);
	sigset_t none, all;
	sigemptyset(&none);
	sigfillset(&all);
	posix_spawnattr_setsigmask(&at, &none);
	posix_spawnattr_setsigdefault(&at, &all);
	posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
	pid_t pid;
	int e = on_path ? posix_spawnp(&pid, prog, &fa, &at, argv, env) : posix_spawn(&pid, prog, &fa, &at, argv, env);
	posix_spawn_file_actions_destroy(&fa);
	posix_spawnattr_destroy(&at);
	free(env);
	if (e) {
		snap_fmt(err, errlen, "no snapsmp answers at %s and starting one failed: %s: %s (set SNAPSMP to its "
			 "path, or SNAP_AUTOSTART=0 and start it yourself)", sock, prog, strerror(e));
		return SNAP_ESMP;
	}
	int code = wait_exit(pid, deadline_ns);
	/* 0: its child serves the store; 3: another snapsmp holds the store and
	 * serves it, or will in a moment; -1: unknown, the connect will tell. */
	if (code == 0 || code == 3 || code == -1)
		return 0;
	if (code == -2)
		snap_fmt(err, errlen, "no snapsmp answers at %s and the one started (%s --detach --store %s) did not serve "
			 "in time; see %s/snapsmp.log", sock, prog, store, store);
	else
		snap_fmt(err, errlen, "no snapsmp answers at %s and the one started failed (`%s --detach --store %s "
			 "--socket %s` exited with code %d; see %s/snapsmp.log, or run it by hand)", sock, prog, store, sock,
			 code, store);
	return SNAP_ESMP;
}
