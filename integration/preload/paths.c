/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Configuration (the same SNAP_* variables as everything else, through
 * snap_config_from_env) and the one question asked of every path: does it
 * lie under a captured directory? Paths are compared lexically after
 * folding "." and ".." (symbolic links are not resolved: a captured
 * directory reached through another spelling is simply not captured, and
 * its files go to the file system as they would without the preload).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snap/proto.h"
#include "preload.h"

struct pl_cfg pl_cfg;
_Atomic mode_t pl_umask = 022;

static char cwd[PATH_MAX];
static atomic_uint cwd_seq;
static atomic_int cwd_relevant;   /* cwd lies inside, or above, a captured directory */
static pthread_mutex_t cwd_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int warned[PL_WARN_KINDS];

void pl_say(const char *fmt, ...)
{
	char msg[1200];
	int n = snprintf(msg, sizeof(msg), "libsnap preload[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg + n, sizeof(msg) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	size_t len = strlen(msg);
	msg[len++] = '\n';
	/* A warning must not become part of a file the program writes (2> into a captured directory). */
	char link[PATH_MAX], abs[PATH_MAX];
	ssize_t ll = readlink("/proc/self/fd/2", link, sizeof(link) - 1);
	if (ll > 0) {
		link[ll] = '\0';
		if (link[0] == '/' && pl_resolve(AT_FDCWD, link, abs))
			return;
	}
	if (pl_get(2))
		return;
	if (pl_real.write && pl_real.write(2, msg, len) < 0) {
		/* nowhere else to say it */
	}
}

int pl_hide_fd(int fd)
{
	if (fd < 0 || fd >= PL_HIDE_FD)
		return fd;
	int h = pl_real.fcntl(fd, F_DUPFD_CLOEXEC, PL_HIDE_FD);
	if (h < 0)
		return fd;   /* a low RLIMIT_NOFILE: it stays where it is */
	pl_real.close(fd);
	return h;
}

void pl_warn_once(int kind, const char *fmt, ...)
{
	if (atomic_exchange(&warned[kind], 1))
		return;
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	pl_say("%s", msg);
}

int pl_normalize(const char *in, char *out, size_t cap)
{
	if (in[0] != '/' || cap < 2)
		return -1;
	size_t len = 0;
	for (const char *c = in; *c;) {
		while (*c == '/')
			c++;
		const char *s = c;
		while (*c && *c != '/')
			c++;
		size_t l = (size_t)(c - s);
		if (l == 0 || (l == 1 && s[0] == '.'))
			continue;
		if (l == 2 && s[0] == '.' && s[1] == '.') {
			while (len > 0 && out[len - 1] != '/')
				len--;
			if (len > 0)
				len--;   /* the '/' before the popped component */
			continue;
		}
		if (len + 1 + l + 1 > cap)
			return -1;
		out[len++] = '/';
		memcpy(out + len, s, l);
		len += l;
	}
	if (len == 0)
		out[len++] = '/';
	out[len] = '\0';
	return 0;
}

static int captured(const char *abs)
{
	for (int i = 0; i < pl_cfg.ncap; i++) {
		size_t n = pl_cfg.caplen[i];
		if (strncmp(abs, pl_cfg.cap[i], n) == 0 && (abs[n] == '\0' || abs[n] == '/'))
			return 1;
	}
	return 0;
}

/* Could this absolute path, once normalized, be captured? (cheap, no copy) */
static int maybe_abs(const char *path)
{
	for (int i = 0; i < pl_cfg.ncap; i++)
		if (strncmp(path, pl_cfg.cap[i], pl_cfg.caplen[i]) == 0)
			return 1;
	return strstr(path, "/.") != NULL || strstr(path, "//") != NULL;
}

void pl_cwd_update(void)
{
	char tmp[PATH_MAX];
	if (!getcwd(tmp, sizeof(tmp)))
		tmp[0] = '\0';
	int rel = tmp[0] == '/' && tmp[1] == '\0';
	size_t tl = strlen(tmp);
	for (int i = 0; i < pl_cfg.ncap && !rel; i++)
		rel = captured(tmp) || (strncmp(pl_cfg.cap[i], tmp, tl) == 0 && pl_cfg.cap[i][tl] == '/');
	pthread_mutex_lock(&cwd_mu);
	atomic_fetch_add(&cwd_seq, 1);
	memcpy(cwd, tmp, tl + 1);
	atomic_store(&cwd_relevant, rel || !tmp[0]);
	atomic_fetch_add(&cwd_seq, 1);
	pthread_mutex_unlock(&cwd_mu);
}

/* A consistent copy of the cached working directory (seqlock: chdir is rare, lookups are not). */
static void cwd_copy(char *out)
{
	for (;;) {
		unsigned s = atomic_load(&cwd_seq);
		if (s & 1)
			continue;
		size_t n = strnlen(cwd, PATH_MAX - 1);
		memcpy(out, cwd, n);
		out[n] = '\0';
		if (atomic_load(&cwd_seq) == s)
			return;
	}
}

int pl_resolve(int dirfd, const char *path, char *out)
{
	if (!pl_cfg.enabled || !path || !path[0])
		return 0;
	char tmp[2 * PATH_MAX];
	const char *src = path;
	if (path[0] != '/') {
		size_t bl;
		if (dirfd == AT_FDCWD) {
			if (!atomic_load_explicit(&cwd_relevant, memory_order_relaxed) && !strstr(path, ".."))
				return 0;
			cwd_copy(tmp);
			if (!tmp[0])
				return 0;   /* working directory unknown (removed) */
		} else {
			struct pl_file *p = pl_get(dirfd);
			if (p && p->kind == PL_DIR) {
				snprintf(tmp, PATH_MAX, "%s", p->path);
			} else {
				/* A directory opened past the preload (O_PATH, inside a library): the kernel knows where. */
				char link[64];
				snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
				ssize_t n = readlink(link, tmp, PATH_MAX - 1);
				if (n <= 0 || tmp[0] != '/')
					return 0;
				tmp[n] = '\0';
			}
		}
		bl = strlen(tmp);
		size_t pl = strlen(path);
		if (bl + 1 + pl + 1 > sizeof(tmp))
			return 0;
		tmp[bl] = '/';
		memcpy(tmp + bl + 1, path, pl + 1);
		src = tmp;
	} else if (!maybe_abs(path)) {
		return 0;
	}
	if (pl_normalize(src, out, PATH_MAX))
		return 0;
	return captured(out);
}

/* The umask, read without changing it (umask(2) would, for a moment, for every thread). */
static void load_umask(void)
{
	int fd = pl_real.openat(AT_FDCWD, "/proc/self/status", O_RDONLY | O_CLOEXEC);
	char buf[4096];
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		pl_real.close(fd);
	if (n > 0) {
		buf[n] = '\0';
		char *u = strstr(buf, "\nUmask:");
		if (u) {
			atomic_store(&pl_umask, (mode_t)strtoul(u + 7, NULL, 8) & 0777);
			return;
		}
	}
	mode_t old = pl_real.umask(022);
	pl_real.umask(old);
	atomic_store(&pl_umask, old);
}

void pl_config_load(void)
{
	struct snap_config cfg;
	char err[512];
	const char *want = getenv("SNAP_CAPTURE");
	if (!want || !*want)
		return;
	snap_config_init(&cfg);
	if (snap_config_from_env(&cfg, err, sizeof(err)) || snap_config_socket(&cfg, err, sizeof(err))) {
		pl_say("SNAP_CAPTURE ignored, files go to the file system: %s", err);
		return;
	}
	char list[sizeof(cfg.capture)];
	snprintf(list, sizeof(list), "%s", cfg.capture);
	for (char *save = NULL, *d = strtok_r(list, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
		char n[PATH_MAX];
		if (d[0] != '/' || pl_normalize(d, n, sizeof(n)) || !strcmp(n, "/")) {
			pl_say("SNAP_CAPTURE: \"%s\" is not an absolute directory below /; ignored", d);
			continue;
		}
		if (pl_cfg.ncap == PL_MAXCAP) {
			pl_say("SNAP_CAPTURE: more than %d directories; \"%s\" and later ones ignored", PL_MAXCAP, d);
			break;
		}
		strcpy(pl_cfg.cap[pl_cfg.ncap], n);
		pl_cfg.caplen[pl_cfg.ncap] = strlen(n);
		pl_cfg.ncap++;
	}
	snprintf(pl_cfg.job, sizeof(pl_cfg.job), "%s", cfg.job);
	snprintf(pl_cfg.store, sizeof(pl_cfg.store), "%s", cfg.store);
	snprintf(pl_cfg.socket, sizeof(pl_cfg.socket), "%s", cfg.socket);
	if (snprintf(pl_cfg.ns, sizeof(pl_cfg.ns), "%s/%s/files/ns", cfg.store, cfg.job) >= (int)sizeof(pl_cfg.ns) ||
	    snprintf(pl_cfg.data, sizeof(pl_cfg.data), "%s/%s/files/data", cfg.store, cfg.job) >=
		    (int)sizeof(pl_cfg.data)) {
		pl_say("SNAP_STORE path too long; SNAP_CAPTURE ignored");
		pl_cfg.ncap = 0;
	}
	pl_cfg.chunk = (uint32_t)cfg.chunk_size;
	pl_cfg.timeout_ms = cfg.timeout_ms;
	pl_cfg.autostart = cfg.autostart != SNAP_AUTOSTART_OFF;
	load_umask();
	pl_cfg.enabled = pl_cfg.ncap > 0;
	pl_cwd_update();
}
