/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Processes: fork, exec, spawn, descriptors passed over a Unix socket, and
 * the process's end. A store file's descriptor is only safe in a process
 * whose preload knows it (its table says which file, who commits, when);
 * the moment it could reach one that does not (a child that shares it, an
 * image after exec, a receiver of SCM_RIGHTS), its file becomes a plain
 * file at its real path (pl_export_all), with one warning. From then on
 * every holder writes the same real file through the same open file
 * description, as without the preload, so the last close by any process
 * leaves exactly the bytes written. docs/preload.md has the table.
 *
 * glibc's exec and spawn functions call each other past the PLT, so each
 * one is interposed; vfork becomes fork (the child runs our hooks, which
 * must not write into its parent's memory).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "preload.h"

#define EXPORT __attribute__((visibility("default")))

static void *next(const char *name)
{
	return dlsym(RTLD_NEXT, name);
}
/* The real function, looked up once; fn_t is its type. */
#define REAL(fn_t, name)                                          \
	static fn_t real_;                                        \
	if (!real_) {                                             \
		void *p_ = next(name);                            \
		memcpy(&real_, &p_, sizeof(p_));                  \
	}

static void before_exec(void)
{
	PL_INIT();
	if (pl_cfg.enabled)
		pl_export_all("its descriptor crosses an exec");
}

_Thread_local int pl_spawning_daemon;

static void before_share(void)
{
	PL_INIT();
	if (pl_cfg.enabled && !pl_spawning_daemon)
		pl_export_all("a child process shares its descriptor");
}

typedef pid_t (*fork_t)(void);
EXPORT pid_t fork(void)
{
	before_share();
	REAL(fork_t, "fork");
	return real_();
}

/* A vfork child shares its parent's memory: our hooks in it would write
 * the parent's tables. fork is a valid vfork. */
EXPORT pid_t vfork(void)
{
	return fork();
}

typedef int (*execve_t)(const char *, char *const[], char *const[]);
EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	before_exec();
	REAL(execve_t, "execve");
	return real_(path, argv, envp);
}

typedef int (*execv_t)(const char *, char *const[]);
EXPORT int execv(const char *path, char *const argv[])
{
	before_exec();
	REAL(execv_t, "execv");
	return real_(path, argv);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	before_exec();
	REAL(execv_t, "execvp");
	return real_(file, argv);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	before_exec();
	REAL(execve_t, "execvpe");
	return real_(file, argv, envp);
}

typedef int (*fexecve_t)(int, char *const[], char *const[]);
EXPORT int fexecve(int fd, char *const argv[], char *const envp[])
{
	before_exec();
	REAL(fexecve_t, "fexecve");
	return real_(fd, argv, envp);
}

typedef int (*execveat_t)(int, const char *, char *const[], char *const[], int);
EXPORT int execveat(int dirfd, const char *path, char *const argv[], char *const envp[], int flags)
{
	before_exec();
	REAL(execveat_t, "execveat");
	if (!real_) {
		errno = ENOSYS;
		return -1;
	}
	return real_(dirfd, path, argv, envp, flags);
}

/* execl and friends: the list as an argv (envp after the NULL for execle). */
static char **list_argv(const char *arg0, va_list ap, char *const **envp)
{
	size_t cap = 16, n = 0;
	char **v = malloc(cap * sizeof(*v));
	if (!v)
		return NULL;
	v[n++] = (char *)arg0;
	for (char *a = arg0 ? va_arg(ap, char *) : NULL;; a = va_arg(ap, char *)) {
		if (n + 1 >= cap) {
			char **w = realloc(v, (cap *= 2) * sizeof(*v));
			if (!w) {
				free(v);
				return NULL;
			}
			v = w;
		}
		v[n++] = a;
		if (!a)
			break;
	}
	if (!arg0)
		v[0] = NULL;
	if (envp)
		*envp = va_arg(ap, char *const *);
	return v;
}

EXPORT int execl(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	char **v = list_argv(arg, ap, NULL);
	va_end(ap);
	if (!v) {
		errno = ENOMEM;
		return -1;
	}
	int r = execv(path, v);
	int e = errno;
	free(v);
	errno = e;
	return r;
}

EXPORT int execlp(const char *file, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	char **v = list_argv(arg, ap, NULL);
	va_end(ap);
	if (!v) {
		errno = ENOMEM;
		return -1;
	}
	int r = execvp(file, v);
	int e = errno;
	free(v);
	errno = e;
	return r;
}

EXPORT int execle(const char *path, const char *arg, ...)
{
	va_list ap;
	va_start(ap, arg);
	char *const *envp = NULL;
	char **v = list_argv(arg, ap, &envp);
	va_end(ap);
	if (!v) {
		errno = ENOMEM;
		return -1;
	}
	int r = execve(path, v, envp);
	int e = errno;
	free(v);
	errno = e;
	return r;
}

typedef int (*spawn_t)(pid_t *, const char *, const posix_spawn_file_actions_t *, const posix_spawnattr_t *,
		       char *const[], char *const[]);
EXPORT int posix_spawn(pid_t *pid, const char *path, const posix_spawn_file_actions_t *fa,
		       const posix_spawnattr_t *at, char *const argv[], char *const envp[])
{
	before_share();
	REAL(spawn_t, "posix_spawn");
	return real_(pid, path, fa, at, argv, envp);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const posix_spawn_file_actions_t *fa,
			const posix_spawnattr_t *at, char *const argv[], char *const envp[])
{
	before_share();
	REAL(spawn_t, "posix_spawnp");
	return real_(pid, file, fa, at, argv, envp);
}

/* The child opens the path itself, inside glibc: it must find the real file there. */
typedef int (*addopen_t)(posix_spawn_file_actions_t *, int, const char *, int, mode_t);
EXPORT int posix_spawn_file_actions_addopen(posix_spawn_file_actions_t *fa, int fd, const char *path, int flags,
					    mode_t mode)
{
	PL_INIT();
	char abs[PATH_MAX];
	if (pl_cfg.enabled && pl_resolve(AT_FDCWD, path, abs))
		pl_materialize(abs, "a spawned child opens it");
	REAL(addopen_t, "posix_spawn_file_actions_addopen");
	return real_(fa, fd, path, flags, mode);
}

typedef int (*system_t)(const char *);
EXPORT int system(const char *cmd)
{
	before_share();
	REAL(system_t, "system");
	return real_(cmd);
}

typedef FILE *(*popen_t)(const char *, const char *);
EXPORT FILE *popen(const char *cmd, const char *mode)
{
	before_share();
	REAL(popen_t, "popen");
	return real_(cmd, mode);
}

/* A descriptor sent to another process: that process cannot know it is a store file. */
typedef ssize_t (*sendmsg_t)(int, const struct msghdr *, int);
EXPORT ssize_t sendmsg(int s, const struct msghdr *m, int flags)
{
	PL_INIT();
	if (__builtin_expect(m && m->msg_controllen, 0) && pl_cfg.enabled) {
		for (struct cmsghdr *c = CMSG_FIRSTHDR((struct msghdr *)m); c; c = CMSG_NXTHDR((struct msghdr *)m, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < nfd; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(fd));
				pl_export_fd(fd, "its descriptor is sent to another process");
			}
		}
	}
	REAL(sendmsg_t, "sendmsg");
	return real_(s, m, flags);
}

/* The end of the process closes its descriptors: commit what it still writes. */
typedef void (*exit_t)(int);
EXPORT void _exit(int status)
{
	PL_INIT();
	if (pl_cfg.enabled)
		pl_files_at_exit();
	REAL(exit_t, "_exit");
	real_(status);
	__builtin_unreachable();
}

EXPORT void _Exit(int status)
{
	_exit(status);
}

__attribute__((destructor)) static void pl_at_exit(void)
{
	if (!atomic_load(&pl_ready) || !pl_cfg.enabled || !pl_files_open())
		return;
	/* exit() flushes the streams after the destructors: a stream still open
	 * on a captured file must reach it before its commit. (Only then: a
	 * stream another thread holds locked would block here.) */
	fflush(NULL);
	pl_files_at_exit();
}
