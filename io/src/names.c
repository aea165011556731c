/* SPDX-License-Identifier: BSD-3-Clause */
/* Job names, region-name escaping, paths and directory durability. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_int.h"

int io_check_job(const char *job, struct snap_io_err *err)
{
	size_t n = job ? strlen(job) : 0;
	if (n == 0 || n > 128 || job[0] == '.')
		return io_fail(err, SNAP_EINVAL, "job name \"%s\" must be 1..128 characters not starting with '.'",
			       job ? job : "(null)");
	for (size_t i = 0; i < n; i++) {
		char c = job[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '.' || c == '_' || c == '-'))
			return io_fail(err, SNAP_EINVAL, "job name \"%s\": only [A-Za-z0-9._-] allowed", job);
	}
	return 0;
}

/*
 * HDF5 treats '/' as a path separator and "." specially, so region names
 * are escaped: bytes outside [A-Za-z0-9_.-] and '%' become %XX, and a
 * leading '.' becomes %2E. The mapping is injective, so two different
 * regions can never land on one dataset, and readable names stay readable.
 */
int io_sanitise(const char *name, char *out, size_t cap)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t n = strlen(name), k = 0;
	if (n == 0 || n > SNAP_IO_MAX_NAME || cap < 3 * n + 1)
		return SNAP_EINVAL;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)name[i];
		int plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
			    c == '_' || c == '-' || (c == '.' && i > 0);
		if (plain) {
			out[k++] = (char)c;
		} else {
			out[k++] = '%';
			out[k++] = hex[c >> 4];
			out[k++] = hex[c & 15];
		}
	}
	out[k] = '\0';
	return 0;
}

static int fit(int k, size_t cap)
{
	return k < 0 || (size_t)k >= cap ? SNAP_EINVAL : 0;
}

int io_path_job(char *out, size_t cap, const char *dir, const char *job)
{
	return fit(snprintf(out, cap, "%s/%s", dir, job), cap);
}

int io_path_step(char *out, size_t cap, const char *dir, const char *job, uint64_t step)
{
	return fit(snprintf(out, cap, "%s/%s/step-%" PRIu64, dir, job, step), cap);
}

int io_fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return rc;
}

int io_mkdirs(const char *path, unsigned mode, struct snap_io_err *err)
{
	char buf[4096];
	size_t n = strlen(path);
	if (n == 0 || n >= sizeof buf)
		return io_fail(err, SNAP_EINVAL, "path too long: %s", path);
	memcpy(buf, path, n + 1);
	for (size_t i = 1; i <= n; i++) {
		if (buf[i] != '/' && buf[i] != '\0')
			continue;
		char saved = buf[i];
		buf[i] = '\0';
		if (mkdir(buf, 0700) == 0) {
			if (chmod(buf, mode) != 0) {
				int e = errno;
				return io_fail(err, io_errno_code(e), "cannot set mode %03o on %s: %s", mode, buf, strerror(e));
			}
			/* The new entry is durable only once its parent is fsynced. */
			char *slash = strrchr(buf, '/');
			if (slash && slash != buf) {
				*slash = '\0';
				io_fsync_dir(buf);
				*slash = '/';
			} else if (slash == buf) {
				io_fsync_dir("/");
			}
		} else if (errno != EEXIST) {
			int e = errno;
			return io_fail(err, io_errno_code(e), "cannot create directory %s: %s", buf, strerror(e));
		} else {
			struct stat st;
			if (stat(buf, &st) < 0 || !S_ISDIR(st.st_mode))
				return io_fail(err, SNAP_EIO, "cannot create directory %s: not a directory", buf);
		}
		buf[i] = saved;
	}
	return 0;
}

int io_rmtree(const char *path)
{
	DIR *d = opendir(path);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		char sub[4096];
		if (snprintf(sub, sizeof sub, "%s/%s", path, e->d_name) >= (int)sizeof sub) {
			rc = -ENAMETOOLONG;
			continue;
		}
		struct stat st;
		if (lstat(sub, &st) == 0 && S_ISDIR(st.st_mode)) {
			int r = io_rmtree(sub);
			if (r && !rc)
				rc = r;
		} else if (unlink(sub) < 0 && errno != ENOENT && !rc) {
			rc = -errno;
		}
	}
	closedir(d);
	if (rmdir(path) < 0 && errno != ENOENT && !rc)
		rc = -errno;
	return rc;
}

/*
 * Per-node flush directories: a directory containing "%n" stands for one
 * directory per mesh node, "%n" replaced by the node's number in decimal.
 * The number must sit inside one path component (D/node%n, D/%n/flush), so
 * the nodes present are one listing of that component's parent away.
 */
int io_is_pattern(const char *dir)
{
	return dir && strstr(dir, "%n") != NULL;
}

int io_node_dir(char *out, size_t cap, const char *pattern, uint32_t node)
{
	const char *at = strstr(pattern, "%n");
	if (!at)
		return fit(snprintf(out, cap, "%s", pattern), cap);
	return fit(snprintf(out, cap, "%.*s%" PRIu32 "%s", (int)(at - pattern), pattern, node, at + 2), cap);
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

int io_list_nodes(const char *pattern, uint32_t **nodes, size_t *count, struct snap_io_err *err)
{
	*nodes = NULL;
	*count = 0;
	const char *at = strstr(pattern, "%n");
	if (!at || strstr(at + 2, "%n"))
		return io_fail(err, SNAP_EINVAL, "%s: a per-node flush directory names the node once, as %%n", pattern);
	const char *comp = at;
	while (comp > pattern && comp[-1] != '/')
		comp--;
	const char *comp_end = strchr(at, '/');
	size_t pre = (size_t)(at - comp), suf = comp_end ? (size_t)(comp_end - at - 2) : strlen(at + 2);
	char parent[4096];
	if (comp == pattern)
		snprintf(parent, sizeof parent, ".");
	else if (fit(snprintf(parent, sizeof parent, "%.*s", (int)(comp - pattern), pattern), sizeof parent))
		return io_fail(err, SNAP_EINVAL, "path too long: %s", pattern);
	DIR *d = opendir(parent);
	if (!d) {
		if (errno == ENOENT || errno == ENOTDIR)
			return 0;
		return io_fail(err, io_errno_code(errno), "%s: cannot list: %s", parent, strerror(errno));
	}
	size_t cap = 0;
	int rc = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		const char *nm = e->d_name;
		size_t len = strlen(nm);
		if (len <= pre + suf || strncmp(nm, comp, pre) || strncmp(nm + len - suf, at + 2, suf))
			continue;
		/* decimal, no sign, no leading zeros: node 1 is "1", never "01" */
		uint64_t v = 0;
		size_t i = pre;
		if (nm[i] == '0' && len - suf > pre + 1)
			continue;
		for (; i < len - suf && nm[i] >= '0' && nm[i] <= '9' && v <= UINT32_MAX; i++)
			v = v * 10 + (uint64_t)(nm[i] - '0');
		if (i != len - suf || v > UINT32_MAX)
			continue;
		if (*count == cap) {
			cap = cap ? 2 * cap : 16;
			uint32_t *p = realloc(*nodes, cap * sizeof *p);
			if (!p) {
				rc = io_fail(err, SNAP_ENOMEM, "out of memory");
				break;
			}
			*nodes = p;
		}
		(*nodes)[(*count)++] = (uint32_t)v;
	}
	closedir(d);
	if (rc) {
		free(*nodes);
		*nodes = NULL;
		*count = 0;
		return rc;
	}
	if (*count)
		qsort(*nodes, *count, sizeof **nodes, cmp_u32);
	return 0;
}
