/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One generation of a job's captured files on a node (capgen.h): the
 * catalog format, the paths, the mapping of its bytes and pruning. What a
 * generation is and when one is taken: meshcap.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mesh/capgen.h"
#include "mesh/mesh_int.h"
#include "snap/fileman.h"

#define CAP_MAGIC "SNAPCAT1"

void cap_list_free(struct cap_list *l)
{
	for (uint32_t i = 0; i < l->n; i++) {
		free(l->e[i].path);
		free(l->e[i].man);
	}
	free(l->e);
	memset(l, 0, sizeof(*l));
}

/* <root>/<job>/files[/rest] */
int cap_files_path(const struct snap_mesh *mesh, const char *job, const char *rest, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s/%s/files%s%s", mesh->store->root, job, rest ? "/" : "", rest ? rest : "");
	return n < 0 || (size_t)n >= cap ? SNAP_EINVAL : 0;
}

int cap_gen_dir(const struct snap_mesh *mesh, const char *job, uint64_t g, char *out, size_t cap)
{
	char rest[64];
	snprintf(rest, sizeof(rest), "ec/g-%" PRIu64, g);
	return cap_files_path(mesh, job, rest, out, cap);
}

/* <root>/<job>, <root>/<job>/files and <root>/<job>/files/ec. */
int cap_make_dirs(const struct snap_mesh *mesh, const char *job)
{
	char p[SNAP_FILE_MAX];
	if (mesh_mkdirs(mesh->store->root, job, -1) || cap_files_path(mesh, job, NULL, p, sizeof(p)) ||
	    (mkdir(p, 0700) != 0 && errno != EEXIST) || cap_files_path(mesh, job, "ec", p, sizeof(p)) ||
	    (mkdir(p, 0700) != 0 && errno != EEXIST))
		return SNAP_EIO;
	return 0;
}

/* "<job>/files": where meshfiles.c's helpers find this job's ec records. */
void cap_ec_job(const char *job, char *out, size_t cap)
{
	snprintf(out, cap, "%s/files", job);
}

/* rm of a generation directory (it holds only plain files). */
void cap_remove_gen_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char p[SNAP_FILE_MAX];
		if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") &&
		    snprintf(p, sizeof(p), "%s/%s", dir, de->d_name) < (int)sizeof(p))
			unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

/* Every generation of job but keep (all when !has_keep): records first.
 * The spare stays with a kept generation (the next one writes into it) and
 * goes with the last one. */
uint64_t cap_prune(struct snap_mesh *mesh, const char *job, int has_keep, uint64_t keep)
{
	char jf[SNAP_FILE_MAX], ecdir[SNAP_FILE_MAX];
	uint64_t freed = 0;
	cap_ec_job(job, jf, sizeof(jf));
	mesh_ec_prune(mesh->store->root, jf, has_keep, keep, has_keep ? 1 : 0, &freed);
	if (cap_files_path(mesh, job, "ec", ecdir, sizeof(ecdir)))
		return freed;
	DIR *d = opendir(ecdir);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		uint64_t g = 0;
		char p[SNAP_FILE_MAX];
		if (strncmp(de->d_name, "g-", 2) || sscanf(de->d_name + 2, "%" SCNu64, &g) != 1 || (has_keep && g == keep))
			continue;
		if (snprintf(p, sizeof(p), "%s/%s", ecdir, de->d_name) < (int)sizeof(p))
			cap_remove_gen_dir(p);
	}
	if (d)
		closedir(d);
	return freed;
}

int cap_spare_path(const struct snap_mesh *mesh, const char *job, char *out, size_t cap)
{
	char rest[64];
	snprintf(rest, sizeof(rest), "ec/%s", MESH_SPARE_PARITY);
	return cap_files_path(mesh, job, rest, out, cap);
}

uint64_t mesh_cap_parity_bytes(const char *root, const char *job)
{
	char jf[SNAP_FILE_MAX];
	cap_ec_job(job, jf, sizeof(jf));
	return mesh_ec_bytes(root, jf);
}


int cap_list_add(struct cap_list *l, const char *path, const void *man, uint32_t man_len, uint64_t id,
		    uint64_t size)
{
	if (l->n == l->cap) {
		uint32_t cap = l->cap ? 2 * l->cap : 64;
		struct cap_ent *e = realloc(l->e, cap * sizeof(*e));
		if (!e)
			return SNAP_ENOMEM;
		l->e = e;
		l->cap = cap;
	}
	struct cap_ent *e = &l->e[l->n];
	*e = (struct cap_ent){ .path = strdup(path), .man = malloc(man_len ? man_len : 1), .man_len = man_len,
			       .id = id, .size = size };
	if (!e->path || !e->man) {
		free(e->path);
		free(e->man);
		return SNAP_ENOMEM;
	}
	memcpy(e->man, man, man_len);
	l->n++;
	return 0;
}

static size_t pad8(size_t n)
{
	return (n + 7) & ~(size_t)7;
}

/* header | per file: u32 path length, u32 manifest length, u64 size, path, manifest (8-aligned) */
void *cap_catalog_pack(const struct cap_list *l, size_t *len)
{
	size_t n = CAP_HDR;
	for (uint32_t i = 0; i < l->n; i++)
		n += 16 + pad8(strlen(l->e[i].path) + l->e[i].man_len);
	uint8_t *p = calloc(1, n), *q = p + CAP_HDR;
	if (!p)
		return NULL;
	for (uint32_t i = 0; i < l->n; i++) {
		uint32_t pl = (uint32_t)strlen(l->e[i].path);
		memcpy(q, &pl, 4);
		memcpy(q + 4, &l->e[i].man_len, 4);
		memcpy(q + 8, &l->e[i].size, 8);
		memcpy(q + 16, l->e[i].path, pl);
		memcpy(q + 16 + pl, l->e[i].man, l->e[i].man_len);
		q += 16 + pad8(pl + l->e[i].man_len);
	}
	uint32_t crc = snap_crc32c(p + CAP_HDR, n - CAP_HDR);
	uint64_t len64 = n;
	memcpy(p, CAP_MAGIC, 8);
	memcpy(p + 8, &l->n, 4);
	memcpy(p + 12, &crc, 4);
	memcpy(p + 16, &len64, 8);
	*len = n;
	return p;
}

/* A logical path as files/fileopen.c keeps them: absolute, no empty, "." or ".." part. */
static int path_ok(const char *p, size_t len)
{
	if (len < 2 || len >= CAP_PATH_MAX || p[0] != '/' || memchr(p, 0, len))
		return 0;
	for (size_t i = 0; i < len;) {
		size_t s = i + 1, e = s;
		while (e < len && p[e] != '/')
			e++;
		if (e == s || (e - s == 1 && p[s] == '.') || (e - s == 2 && p[s] == '.' && p[s + 1] == '.'))
			return 0;
		i = e;
	}
	return 1;
}

/* Parse and check a catalog of len bytes (every manifest decodes, its size
 * is the entry's). SNAP_ECORRUPT with why on anything wrong. */
int cap_catalog_parse(const uint8_t *p, size_t len, struct cap_list *l, char *err, size_t errlen)
{
	uint32_t count, crc;
	uint64_t len64;
	if (len < CAP_HDR || memcmp(p, CAP_MAGIC, 8)) {
		snap_fmt(err, errlen, "the catalog's header is not a catalog's");
		return SNAP_ECORRUPT;
	}
	memcpy(&count, p + 8, 4);
	memcpy(&crc, p + 12, 4);
	memcpy(&len64, p + 16, 8);
	if (len64 != len || snap_crc32c(p + CAP_HDR, len - CAP_HDR) != crc) {
		snap_fmt(err, errlen, "the catalog's length or CRC32C does not match its bytes");
		return SNAP_ECORRUPT;
	}
	size_t o = CAP_HDR;
	for (uint32_t i = 0; i < count; i++) {
		uint32_t pl, ml;
		uint64_t size;
		struct snap_fman m;
		char path[CAP_PATH_MAX];
		if (len - o < 16) {
			snap_fmt(err, errlen, "the catalog ends inside entry %u of %u", i, count);
			return SNAP_ECORRUPT;
		}
		memcpy(&pl, p + o, 4);
		memcpy(&ml, p + o + 4, 4);
		memcpy(&size, p + o + 8, 8);
		if ((uint64_t)pl + ml > len - o - 16 || !path_ok((const char *)p + o + 16, pl)) {
			snap_fmt(err, errlen, "entry %u of the catalog has a bad path or length", i);
			return SNAP_ECORRUPT;
		}
		memcpy(path, p + o + 16, pl);
		path[pl] = 0;
		int rc = snap_fman_decode(p + o + 16 + pl, ml, &m, err, errlen);
		if (rc)
			return rc;
		uint64_t id = m.id, msize = m.size;
		snap_fman_free(&m);
		if (msize != size) {
			snap_fmt(err, errlen, "the manifest of %s says %" PRIu64 " bytes, the catalog %" PRIu64, path, msize,
				 size);
			return SNAP_ECORRUPT;
		}
		if ((rc = cap_list_add(l, path, p + o + 16 + pl, ml, id, size)))
			return rc;
		o += 16 + pad8((size_t)pl + ml);
		if (o > len) {
			snap_fmt(err, errlen, "the catalog ends inside entry %u of %u", i, count);
			return SNAP_ECORRUPT;
		}
	}
	if (o != len) {
		snap_fmt(err, errlen, "%zu bytes after the last entry of the catalog", len - o);
		return SNAP_ECORRUPT;
	}
	return 0;
}

int cap_map_gen(const char *gdir, const struct cap_list *l, void *cat, size_t cat_len, int *fds,
		struct iovec **iovp, char *err, size_t errlen)
{
	struct iovec *iov = calloc((size_t)l->n + 1, sizeof(*iov));
	if (!iov)
		return SNAP_ENOMEM;
	*iovp = iov;
	iov[0] = (struct iovec){ cat, cat_len };
	for (uint32_t i = 0; fds && i < l->n; i++)
		fds[i + 1] = -1;
	for (uint32_t i = 0; i < l->n; i++) {
		char dname[17], p[SNAP_FILE_MAX + 32];
		snap_fman_data_name(l->e[i].id, dname);
		snprintf(p, sizeof(p), "%s/%s", gdir, dname);
		if (!l->e[i].size)
			continue;
		int fd = open(p, (fds ? O_RDWR : O_RDONLY) | O_CLOEXEC);
		struct stat st;
		void *m = MAP_FAILED;
		if (fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size == l->e[i].size)
			m = mmap(NULL, l->e[i].size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
		if (fds)
			fds[i + 1] = fd;
		else if (fd >= 0)
			close(fd);
		if (m == MAP_FAILED) {
			snap_fmt(err, errlen, "cannot map %s (%" PRIu64 " bytes): %s", p, l->e[i].size,
				 fd < 0 ? strerror(errno) : "wrong size");
			return SNAP_EIO;
		}
		iov[i + 1] = (struct iovec){ m, l->e[i].size };
	}
	return 0;
}

void cap_unmap_gen(struct iovec *iov, uint32_t n)
{
	for (uint32_t i = 1; iov && i <= n; i++)
		if (iov[i].iov_base)
			munmap(iov[i].iov_base, iov[i].iov_len);
	free(iov);
}

/* Collective over the group, whatever failed here (a member that failed
 * passes nothing, and the library fails the group instead of hanging it). */
int cap_read_catalog(struct snap_mesh *mesh, const char *job, uint64_t g, struct cap_list *l, void **cat,
			size_t *len, char *err, size_t errlen)
{
	char gdir[SNAP_FILE_MAX], p[SNAP_FILE_MAX + 16];
	if (cap_gen_dir(mesh, job, g, gdir, sizeof(gdir)))
		return SNAP_EINVAL;
	snprintf(p, sizeof(p), "%s/catalog", gdir);
	int rc = mesh_read_file(p, 1u << 30, cat, len);
	if (rc) {
		snap_fmt(err, errlen, "its catalog %s is missing or unreadable", p);
		return rc;
	}
	rc = cap_catalog_parse(*cat, *len, l, err, errlen);
	for (uint32_t i = 0; !rc && i < l->n; i++) {
		char dname[17], dp[SNAP_FILE_MAX + 32];
		struct stat st;
		snap_fman_data_name(l->e[i].id, dname);
		snprintf(dp, sizeof(dp), "%s/%s", gdir, dname);
		if (stat(dp, &st) != 0 || (uint64_t)st.st_size != l->e[i].size) {
			snap_fmt(err, errlen, "the data of %s (%s) is missing or has the wrong size", l->e[i].path, dp);
			rc = SNAP_ECORRUPT;
		}
	}
	return rc;
}

/* mesh_rec_check: a record counts only with its catalog and data links. */