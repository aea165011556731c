/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_proc.c - helpers of bench_proc.h.
 */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_proc.h"

int bench_run_capture(char *const argv[], char *buf, size_t cap)
{
	int fd[2];
	if (pipe(fd))
		return -1;
	pid_t pid = fork();
	if (pid < 0) {
		close(fd[0]);
		close(fd[1]);
		return -1;
	}
	if (pid == 0) {
		dup2(fd[1], 1);
		close(fd[0]);
		close(fd[1]);
		execvp(argv[0], argv);
		fprintf(stderr, "snapbench: cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	close(fd[1]);
	size_t used = 0;
	for (;;) {
		char tmp[4096];
		ssize_t r = read(fd[0], tmp, sizeof(tmp));
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		size_t c = (size_t)r < cap - 1 - used ? (size_t)r : cap - 1 - used;
		memcpy(buf + used, tmp, c);
		used += c;
	}
	buf[used] = 0;
	close(fd[0]);
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

double bench_jnum(const char *json, const char *key)
{
	char pat[64];
	snprintf(pat, sizeof(pat), "\"%s\":", key);
	const char *p = strstr(json, pat);
	return p ? strtod(p + strlen(pat), NULL) : -1.0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	return remove(path) && errno != ENOENT ? -1 : 0;
}

int bench_rm_tree(const char *path)
{
	if (access(path, F_OK) && errno == ENOENT)
		return 0;
	return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
