/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * meshfiles.h - the erasure-coding files of a node store, shared by snapsmp
 * (protect, relaunch rebuild) and snaptool status (offline reader).
 *
 *   <root>/<job>/ec/step-<g>.parity   this node's parity rows of step g
 *   <root>/<job>/ec/step-<g>.rec      packed snap_ec meta record of step g;
 *                                     present = this node's parity in place
 *
 * Both are written to "<name>.tmp" and renamed, parity first, so a record
 * never describes parity that is not all there (crash-only, like manifests).
 *
 * What is coded: for each rank this node hosted in step g (ascending rank),
 * the rank's manifest bytes followed by its slot file's first slot_bytes.
 * Coding the manifest too means a replacement node gets its manifests back
 * bit-exact from the same rebuild. The order and sizes are the "slot list",
 * carried as the app blob of the meta record (every member's record holds
 * every member's list, so a survivor tells a replacement how to cut its
 * rebuilt bytes back into files).
 */
#ifndef SNAP_MESHFILES_H
#define SNAP_MESHFILES_H

#include <stddef.h>
#include <stdint.h>

#include "snap/store.h"

/* Replace every "%n" in pat by rank (no MPI: snapsmp and snaptool status).
 * SNAP_EINVAL when the result does not fit in cap. */
int snap_mesh_expand(const char *pat, int rank, char *out, size_t cap);

#define MESH_BLOB_MAGIC 0x31414d53u /* "SMA1" */

struct mesh_slot_ent {
	uint32_t rank, slot, man_len, pad;
	uint64_t slot_bytes;
};

/* Slot list <-> app blob (native little-endian; x86/arm64 only). */
size_t mesh_blob_size(uint32_t n);
void mesh_blob_pack(const struct mesh_slot_ent *e, uint32_t n, void *out);
/* Points *e into blob (copied out); SNAP_ECORRUPT when malformed. */
int mesh_blob_unpack(const void *blob, size_t len, struct mesh_slot_ent **e, uint32_t *n);

/* <root>/<job>/ec[/step-<g>.<ext>]; ext NULL = the directory. */
int mesh_ec_path(const char *root, const char *job, uint64_t step, const char *ext, char *out, size_t cap);

/* Steps of every "step-<g>.rec" under <root>/<job>/ec, ascending; *n count. */
int mesh_list_records(const char *root, const char *job, uint64_t **steps, size_t *n);

/* The parity file a protect writes into next: the previous protected
 * step's, kept with its pages (smp/mesh/protect.c). Counted in the budget. */
#define MESH_SPARE_PARITY "spare.parity"
/* Parity files created ahead of a job's first protects, "warm-<i>.parity"
 * (smp/meshwarm.c; i < 2): the first protects write into them instead of
 * creating their own. Counted in the budget; kept like the spare. */
#define MESH_WARM_PARITY "warm-%u.parity"
#define MESH_WARM_MAX 2
/* Whether name is one of them. */
int mesh_is_warm_parity(const char *name);

/* Remove every file of <root>/<job>/ec except step-<keep>.rec and
 * step-<keep>.parity (all of them when !has_keep), MESH_SPARE_PARITY when
 * keep_spare & 1 and the warm parity files when keep_spare & 2 (a relaunch
 * removes them: they are made again when needed): older steps, orphan parity (killed between the parity
 * rename and the record), *.tmp. Records go first. *freed: bytes of the
 * removed non-record files. */
int mesh_ec_prune(const char *root, const char *job, int has_keep, uint64_t keep, int keep_spare, uint64_t *freed);
/* Bytes of the non-record files of <root>/<job>/ec (parity and leftovers):
 * what the memory budget counts. */
uint64_t mesh_ec_bytes(const char *root, const char *job);

/* Whole small file into a malloc'd buffer (limit bytes); SNAP_ENOENT/EIO. */
int mesh_read_file(const char *path, size_t limit, void **buf, size_t *len);
/* Write path.tmp and rename it over path. */
int mesh_write_atomic(const char *path, const void *buf, size_t len);
/* mkdir -p of the store's per-job directories used here. */
int mesh_mkdirs(const char *root, const char *job, int rank);

#endif
