/* SPDX-License-Identifier: BSD-3-Clause */
/* The erasure-coding files of a node store; format described in meshfiles.h. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snap/base.h"
#include "snap/meshfiles.h"

int snap_mesh_expand(const char *pat, int rank, char *out, size_t cap)
{
	size_t o = 0;
	for (const char *p = pat; *p; p++) {
		int n;
		if (p[0] == '%' && p[1] == 'n') {
			n = snprintf(out + o, cap - o, "%d", rank);
			p++;
		} else {
			n = snprintf(out + o, cap - o, "%c", *p);
		}
		if (n < 0 || (size_t)n >= cap - o)
			return SNAP_EINVAL;
		o += (size_t)n;
	}
	if (o == 0 && cap)
		out[0] = 0;
	return 0;
}

size_t mesh_blob_size(uint32_t n)
{
	return 8 + (size_t)n * sizeof(struct mesh_slot_ent);
}

void mesh_blob_pack(const struct mesh_slot_ent *e, uint32_t n, void *out)
{
	uint32_t h[2] = { MESH_BLOB_MAGIC, n };
	memcpy(out, h, 8);
	if (n)
		memcpy((char *)out + 8, e, (size_t)n * sizeof(*e));
}

int mesh_blob_unpack(const void *blob, size_t len, struct mesh_slot_ent **e, uint32_t *n)
{
	uint32_t h[2];
	*e = NULL;
	*n = 0;
	if (!blob || len < 8)
		return SNAP_ECORRUPT;
	memcpy(h, blob, 8);
	if (h[0] != MESH_BLOB_MAGIC || h[1] > (1u << 24) || len != mesh_blob_size(h[1]))
		return SNAP_ECORRUPT;
	if (h[1]) {
		*e = malloc((size_t)h[1] * sizeof(**e));
		if (!*e)
			return SNAP_ENOMEM;
		memcpy(*e, (const char *)blob + 8, (size_t)h[1] * sizeof(**e));
	}
	*n = h[1];
	return 0;
}

int mesh_ec_path(const char *root, const char *job, uint64_t step, const char *ext, char *out, size_t cap)
{
	int n = ext ? snprintf(out, cap, "%s/%s/ec/step-%" PRIu64 ".%s", root, job, step, ext)
		    : snprintf(out, cap, "%s/%s/ec", root, job);
	return n < 0 || (size_t)n >= cap ? SNAP_EINVAL : 0;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

int mesh_list_records(const char *root, const char *job, uint64_t **steps, size_t *n)
{
	char dir[SNAP_FILE_MAX];
	*steps = NULL;
	*n = 0;
	if (mesh_ec_path(root, job, 0, NULL, dir, sizeof(dir)))
		return SNAP_EINVAL;
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	size_t cap = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *s = e->d_name;
		size_t len = strlen(s);
		if (len < 10 || strncmp(s, "step-", 5) || strcmp(s + len - 4, ".rec"))
			continue;
		uint64_t v = 0;
		size_t i = 5;
		for (; i < len - 4 && s[i] >= '0' && s[i] <= '9' && v < UINT64_MAX / 10; i++)
			v = v * 10 + (uint64_t)(s[i] - '0');
		if (i != len - 4)
			continue;
		if (*n == cap) {
			cap = cap ? cap * 2 : 8;
			uint64_t *p = realloc(*steps, cap * sizeof(*p));
			if (!p) {
				closedir(d);
				return SNAP_ENOMEM;
			}
			*steps = p;
		}
		(*steps)[(*n)++] = v;
	}
	closedir(d);
	if (*n)
		qsort(*steps, *n, sizeof(**steps), cmp_u64);
	return 0;
}

/* "step-<keep>.rec" / "step-<keep>.parity" */
static int is_kept(const char *name, int has_keep, uint64_t keep)
{
	char a[64], b[64];
	if (!has_keep)
		return 0;
	snprintf(a, sizeof(a), "step-%" PRIu64 ".rec", keep);
	snprintf(b, sizeof(b), "step-%" PRIu64 ".parity", keep);
	return strcmp(name, a) == 0 || strcmp(name, b) == 0;
}

static int is_record(const char *name)
{
	size_t len = strlen(name);
	return len > 4 && strcmp(name + len - 4, ".rec") == 0;
}

int mesh_is_warm_parity(const char *name)
{
	for (unsigned i = 0; i < MESH_WARM_MAX; i++) {
		char w[32];
		snprintf(w, sizeof(w), MESH_WARM_PARITY, i);
		if (!strcmp(name, w))
			return 1;
	}
	return 0;
}

int mesh_ec_prune(const char *root, const char *job, int has_keep, uint64_t keep, int keep_spare, uint64_t *freed)
{
	char dir[SNAP_FILE_MAX];
	*freed = 0;
	if (mesh_ec_path(root, job, 0, NULL, dir, sizeof(dir)))
		return SNAP_EINVAL;
	/* Records first: a parity file without its record is garbage, a record
	 * without its parity would be a lie. */
	for (int pass = 0; pass < 2; pass++) {
		DIR *d = opendir(dir);
		if (!d)
			return errno == ENOENT ? 0 : SNAP_EIO;
		struct dirent *e;
		while ((e = readdir(d))) {
			const char *s = e->d_name;
			char p[SNAP_FILE_MAX];
			struct stat st;
			if (!strcmp(s, ".") || !strcmp(s, "..") || is_kept(s, has_keep, keep) ||
			    ((keep_spare & 1) && !strcmp(s, MESH_SPARE_PARITY)) ||
			    ((keep_spare & 2) && mesh_is_warm_parity(s)) ||
			    is_record(s) != (pass == 0))
				continue;
			int n = snprintf(p, sizeof(p), "%s/%s", dir, s);
			if (n < 0 || (size_t)n >= sizeof(p) || lstat(p, &st) != 0 || S_ISDIR(st.st_mode))
				continue;
			if (unlink(p) == 0 && !is_record(s))
				*freed += (uint64_t)st.st_size;
		}
		closedir(d);
	}
	return 0;
}

uint64_t mesh_ec_bytes(const char *root, const char *job)
{
	char dir[SNAP_FILE_MAX];
	uint64_t sum = 0;
	if (mesh_ec_path(root, job, 0, NULL, dir, sizeof(dir)))
		return 0;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char p[SNAP_FILE_MAX];
		struct stat st;
		int n = snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		if (n < 0 || (size_t)n >= sizeof(p) || is_record(e->d_name) || lstat(p, &st) != 0 || !S_ISREG(st.st_mode))
			continue;
		sum += (uint64_t)st.st_size;
	}
	if (d)
		closedir(d);
	return sum;
}

int mesh_read_file(const char *path, size_t limit, void **buf, size_t *len)
{
	*buf = NULL;
	*len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? SNAP_ENOENT : SNAP_EIO;
	struct stat st;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size > limit) {
		close(fd);
		return SNAP_EIO;
	}
	size_t sz = (size_t)st.st_size;
	char *p = malloc(sz ? sz : 1);
	size_t got = 0;
	while (p && got < sz) {
		ssize_t r = pread(fd, p + got, sz - got, (off_t)got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	if (!p || got != sz) {
		free(p);
		return p ? SNAP_EIO : SNAP_ENOMEM;
	}
	*buf = p;
	*len = sz;
	return 0;
}

int mesh_write_atomic(const char *path, const void *buf, size_t len)
{
	char tmp[SNAP_FILE_MAX + 8];
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return SNAP_EIO;
	const char *p = buf;
	while (len > 0) {
		ssize_t n = write(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			close(fd);
			unlink(tmp);
			return errno == ENOSPC ? SNAP_ENOSPC : SNAP_EIO;
		}
		p += n;
		len -= (size_t)n;
	}
	if (close(fd) != 0 || rename(tmp, path) != 0) {
		unlink(tmp);
		return SNAP_EIO;
	}
	return 0;
}

int mesh_mkdirs(const char *root, const char *job, int rank)
{
	char p[SNAP_FILE_MAX];
	snprintf(p, sizeof(p), "%s/%s", root, job);
	if (mkdir(p, 0700) != 0 && errno != EEXIST)
		return SNAP_EIO;
	if (rank < 0) {
		snprintf(p, sizeof(p), "%s/%s/ec", root, job);
	} else {
		snprintf(p, sizeof(p), "%s/%s/rank-%05d", root, job, rank);
	}
	if (mkdir(p, 0700) != 0 && errno != EEXIST)
		return SNAP_EIO;
	return 0;
}
