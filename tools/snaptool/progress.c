/* SPDX-License-Identifier: BSD-3-Clause */
/* Progress bar of long snaptool commands; see progress.h. */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "snap/base.h" /* snap_now_ns */
#include "progress.h"

int st_progress_off;

static void draw(struct st_progress *p)
{
	char bar[31];
	uint64_t t = snap_now_ns(), done = p->done < p->total ? p->done : p->total;
	double frac = p->total ? (double)done / (double)p->total : 1.0, secs = (double)(t - p->t0_ns) / 1e9;
	int fill = (int)(frac * 30.0 + 0.5);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	/* \r and erase-to-end: the line is rewritten in place on a terminal. */
	fprintf(stderr, "\r%s [%s] %3.0f%%  %.1f / %.1f MiB  %.0f MB/s\033[K", p->what, bar, frac * 100.0,
		(double)done / 1048576.0, (double)p->total / 1048576.0, secs > 0 ? (double)done / 1e6 / secs : 0.0);
	fflush(stderr);
	p->drawn_ns = t;
}

void st_progress_begin(struct st_progress *p, const char *what, uint64_t total)
{
	*p = (struct st_progress){ .on = !st_progress_off && isatty(STDERR_FILENO), .what = what, .total = total,
				   .t0_ns = snap_now_ns() };
	if (p->on)
		draw(p);
}

void st_progress_add(struct st_progress *p, uint64_t bytes)
{
	st_progress_set(p, p->done + bytes);
}

void st_progress_set(struct st_progress *p, uint64_t done)
{
	p->done = done;
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

/* rchar of /proc/self/io: bytes read by read(2) and friends, all threads. */
static uint64_t self_rchar(void)
{
	char buf[512];
	int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	unsigned long long v = 0;
	const char *at = strstr(buf, "rchar:");
	return at && sscanf(at, "rchar: %llu", &v) == 1 ? v : 0;
}

static void *watch_main(void *arg)
{
	struct st_progress *p = arg;
	const struct timespec tick = { 0, 100000000 };
	while (!atomic_load(&p->stop)) {
		nanosleep(&tick, NULL);
		st_progress_set(p, self_rchar() - p->rchar0);
	}
	return NULL;
}

void st_progress_watch_reads(struct st_progress *p)
{
	if (!p->on)
		return;
	p->rchar0 = self_rchar();
	atomic_store(&p->stop, 0);
	p->watching = pthread_create(&p->th, NULL, watch_main, p) == 0;
}

void st_progress_unwatch(struct st_progress *p)
{
	if (!p->watching)
		return;
	atomic_store(&p->stop, 1);
	pthread_join(p->th, NULL);
	p->watching = 0;
}

/* Per-node flush directories ("%n" in dir): the sum over nodes 0, 1, ...
 * while the node's directory (the path up to the component holding %n)
 * exists. */
static uint64_t nodes_bytes(const char *dir)
{
	const char *at = strstr(dir, "%n"), *end = strchr(at, '/');
	size_t root_len = end ? (size_t)(end - dir) : strlen(dir);
	uint64_t sum = 0;
	for (int n = 0;; n++) {
		char root[SNAP_PATH_MAX], path[SNAP_PATH_MAX];
		struct stat st;
		if (snprintf(root, sizeof(root), "%.*s%d%.*s", (int)(at - dir), dir, n, (int)(root_len - (size_t)(at + 2 - dir)),
			     at + 2) >= (int)sizeof(root) ||
		    snprintf(path, sizeof(path), "%s%s", root, dir + root_len) >= (int)sizeof(path) || stat(root, &st) != 0)
			return sum;
		sum += st_dir_bytes(path);
	}
}

uint64_t st_dir_bytes(const char *dir)
{
	if (strstr(dir, "%n"))
		return nodes_bytes(dir);
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	uint64_t sum = 0;
	struct dirent *e;
	struct stat st;
	while ((e = readdir(d)))
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
			sum += (uint64_t)st.st_size;
	closedir(d);
	return sum;
}
