/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * capgen.h - one generation of a job's captured files as the mesh keeps it
 * on a node (meshcap.c's format, not an API): its paths, its catalog, the
 * mapping of its bytes for an encode or a rebuild, and pruning.
 *
 *   <root>/<job>/files/ec/step-<G>.parity, step-<G>.rec   as for steps
 *   <root>/<job>/files/ec/g-<G>/catalog                   this node's catalog
 *   <root>/<job>/files/ec/g-<G>/<data id>                 hard links to the data
 *
 * The catalog: "SNAPCAT1", u32 count, u32 CRC32C of the rest, u64 length,
 * then per file u32 path length, u32 manifest length, u64 size, the path
 * and the manifest, padded to 8 bytes (native little-endian).
 */
#ifndef SNAP_SMP_CAPGEN_H
#define SNAP_SMP_CAPGEN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct snap_mesh;

#define CAP_HDR 24            /* magic, u32 count, u32 CRC32C of the rest, u64 length */
#define CAP_BLOB_MAGIC 0x31464353u /* "SCF1" */
#define CAP_PATH_MAX 4096
#define CAP_DEPTH 128

struct cap_blob {
	uint32_t magic, nfiles;
	uint64_t cat_len;
};

struct cap_ent {
	char *path;                   /* absolute logical path */
	void *man;                    /* encoded manifest */
	uint32_t man_len;
	uint64_t id, size;
};

struct cap_list {
	struct cap_ent *e;
	uint32_t n, cap;
};

void cap_list_free(struct cap_list *l);
int cap_list_add(struct cap_list *l, const char *path, const void *man, uint32_t man_len, uint64_t id,
		 uint64_t size);

/* <root>/<job>/files[/rest]; SNAP_EINVAL when it does not fit. */
int cap_files_path(const struct snap_mesh *mesh, const char *job, const char *rest, char *out, size_t cap);
/* <root>/<job>/files/ec/g-<g> */
int cap_gen_dir(const struct snap_mesh *mesh, const char *job, uint64_t g, char *out, size_t cap);
/* mkdir <root>/<job>, <root>/<job>/files and <root>/<job>/files/ec. */
int cap_make_dirs(const struct snap_mesh *mesh, const char *job);
/* "<job>/files": the job name meshfiles.c's helpers take for these records. */
void cap_ec_job(const char *job, char *out, size_t cap);
/* rm -r of a generation directory (plain files only). */
void cap_remove_gen_dir(const char *dir);
/* <root>/<job>/files/ec/MESH_SPARE_PARITY: the parity file of the
 * generation protected before the newest, which the next one writes into
 * (meshcap.c). */
int cap_spare_path(const struct snap_mesh *mesh, const char *job, char *out, size_t cap);
/* Remove every generation of job but keep (all when !has_keep), records
 * first; the spare stays when a generation is kept. Returns the parity
 * bytes freed. */
uint64_t cap_prune(struct snap_mesh *mesh, const char *job, int has_keep, uint64_t keep);

/* The catalog of l, malloc'd; *len its size. NULL when out of memory. */
void *cap_catalog_pack(const struct cap_list *l, size_t *len);
/* Parse and check a catalog (paths, every manifest decodes and matches its
 * size) into l; SNAP_ECORRUPT with why on anything wrong. */
int cap_catalog_parse(const uint8_t *p, size_t len, struct cap_list *l, char *err, size_t errlen);
/* This node's catalog of generation g, read and checked, and every data
 * link present at its size; why on failure. */
int cap_read_catalog(struct snap_mesh *mesh, const char *job, uint64_t g, struct cap_list *l, void **cat,
		     size_t *len, char *err, size_t errlen);

/* The generation's bytes as iov[l->n + 1]: the catalog, then each data file
 * mapped read-only through its link. With fds (a rebuild: l->n + 1 ints,
 * fds[0] the caller's), each data file also stays open read-write in
 * fds[i + 1] for the rebuild's io (-1 for an empty one); the caller closes
 * them, on failure too. */
int cap_map_gen(const char *gdir, const struct cap_list *l, void *cat, size_t cat_len, int *fds,
		struct iovec **iovp, char *err, size_t errlen);
void cap_unmap_gen(struct iovec *iov, uint32_t n);

#endif
