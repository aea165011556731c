/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snap/ec.h - erasure coding of node snapshots across an MPI mesh.
 *
 * The mesh (one MPI rank per node) is cut into groups of contiguous ranks.
 * A group of n = k + m nodes survives the loss of any m of its members.
 *
 * Layout (rotated Reed-Solomon, SCR/FTI style). Inside a group every node's
 * data for a step is cut into k segments of seg_len = ceil(max_len / k)
 * bytes, where max_len is the largest data length in the group; bytes past a
 * node's own length are zeros that exist only logically (never copied, never
 * sent). There are n stripes. Stripe s takes segment t (t = 0..k-1) from node
 * (s + m + t) mod n and keeps its parity row p (p = 0..m-1) on node
 * (s + p) mod n. So every node sends k segments and keeps m parity segments:
 * storage overhead m/k per node and the same traffic in and out of every
 * node. The code is a Cauchy Reed-Solomon code over GF(2^8) (ISA-L's
 * gf_gen_cauchy1_matrix), so any k of a stripe's k + m members rebuild it.
 *
 * Integrity. Segments are cut into chunks of chunk_size bytes. Every chunk of
 * every member's data (zero padded to the chunk) and parity carries a CRC32C
 * (ISA-L crc32_iscsi, standard CRC-32C value). The per-step metadata record
 * (struct snap_ec_meta, opaque, serializable) holds all members' lengths and
 * CRC tables and is identical on every member except for the owner index, so
 * any survivor can tell a replacement node what it held. A chunk whose CRC
 * fails is an erasure, repaired like a lost node when the stripe has at most m
 * erasures in that chunk.
 *
 * Exchange. Point-to-point MPI, pipelined by (chunk, stripe) units. In each
 * unit one member (the decoder) gathers the k source pieces, computes every
 * missing row (encode: the m parity rows; rebuild: lost or corrupt pieces)
 * with one ISA-L ec_encode_data call and forwards each row to its owner:
 * k + m - 1 transfers per unit. At most `window` units are in flight; per
 * node that is at most window * (k + m + 1) * chunk_size bytes of buffers,
 * plus one zero chunk. See ec/README.md for the measured alternatives.
 *
 * Collective calls (marked [collective]) must be called by every member of the
 * group communicator in the same order. Every call returns 0 or a negative
 * code from snap/error.h; calls with an errbuf write a message naming what
 * failed (always NUL terminated, may be NULL/0), handles keep the last
 * message (snap_ec_*_error). A collective call fails on every member when
 * it fails on one; the members where it did not fail themselves get the
 * first failing member's code and a message containing
 * SNAP_EC_ERR_ELSEWHERE, so a caller gathering messages can prefer the one
 * that names the cause. Nothing here exits, aborts, or spawns threads.
 * ec/ knows nothing of the store: the caller hands iovecs and buffers in.
 */
#ifndef SNAP_EC_H
#define SNAP_EC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* In the message of a member whose call failed only because another
 * member's did (see above). */
#define SNAP_EC_ERR_ELSEWHERE "failed on another group member"
#include <mpi.h>

#include "snap/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SNAP_EC_MAX_GROUP 255              /* GF(2^8) Cauchy: k + m <= 255 */
#define SNAP_EC_DEFAULT_CHUNK (256u << 10) /* CRC and pipeline unit */
#define SNAP_EC_MIN_CHUNK 64u
#define SNAP_EC_MAX_CHUNK (1u << 28)
#define SNAP_EC_APP_MAX (64u << 10)        /* per-node opaque blob in the meta */

/* ------------------------------------------------------------------ */
/* Group formation and placement (pure functions, no MPI)              */
/* ------------------------------------------------------------------ */

/*
 * Tail policy. With N nodes and groups of K + M, the last N mod (K + M)
 * ranks ("tail", r of them) are handled as follows by default:
 *   r >= M + 1: they form their own smaller group, same M, k = r - M
 *               (higher overhead M/(r-M) for that group only);
 *   1 <= r <= M: they join the previous group, which becomes (K + r) + M
 *               (lower overhead); if there is no previous group (N <= M)
 *               the mesh is refused.
 * SNAP_EC_TAIL_STRICT refuses any N that is not a multiple of K + M.
 */
#define SNAP_EC_TAIL_STRICT 1u

struct snap_ec_group {
	int id;         /* group number, 0..ngroups-1 */
	int ngroups;    /* groups in the mesh */
	int first_rank; /* mesh rank of group index 0 (members are contiguous) */
	int n;          /* members = k + m */
	int k;          /* data segments per node */
	int m;          /* parity rows per stripe = tolerated losses */
	int index;      /* the queried node's index in the group, 0..n-1 */
};

/*
 * Which group mesh rank `rank` belongs to, for a mesh of `nodes` ranks and
 * groups of k + m. Fills *g. SNAP_EINVAL (message in errbuf) for k < 1,
 * m < 1, k + m > SNAP_EC_MAX_GROUP, rank outside the mesh, or a mesh the
 * tail policy refuses.
 */
int snap_ec_group_of(int nodes, int k, int m, unsigned flags, int rank,
		     struct snap_ec_group *g, char *err, size_t errlen);

/* Stripe that node `index` feeds with its data segment `seg` (0..k-1). */
int snap_ec_data_stripe(const struct snap_ec_group *g, int index, int seg);
/* Stripe whose parity row `row` (0..m-1) node `index` holds. */
int snap_ec_parity_stripe(const struct snap_ec_group *g, int index, int row);
/* Index of the node giving segment position `seg` of stripe `stripe`. */
int snap_ec_data_holder(const struct snap_ec_group *g, int stripe, int seg);
/* Index of the node holding parity row `row` of stripe `stripe`. */
int snap_ec_parity_holder(const struct snap_ec_group *g, int stripe, int row);
/* Segment length for a group whose largest data length is max_len. */
uint64_t snap_ec_seg_len(int k, uint64_t max_len);

/*
 * One human-readable line for `snaptool status`, e.g.
 *   "group 1 (ranks 6-11, 4+2, overhead 0.50): index 2 data seg0->s2 ...
 *    parity s2.p0 s1.p1"
 * Returns the length it wanted (like snprintf) or SNAP_EINVAL.
 */
int snap_ec_describe(const struct snap_ec_group *g, char *buf, size_t len);

/*
 * [collective over `mesh`] Form the caller's group and a communicator of it
 * (MPI_Comm_split; rank in *group_comm equals g->index). Free it with
 * MPI_Comm_free. Every rank computes the same layout, so all succeed or all
 * fail with SNAP_EINVAL.
 */
int snap_ec_comm_split(MPI_Comm mesh, int k, int m, unsigned flags,
		       struct snap_ec_group *g, MPI_Comm *group_comm,
		       char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* Per-step metadata record                                            */
/* ------------------------------------------------------------------ */

struct snap_ec_meta; /* opaque; every call returning one allocates it */

struct snap_ec_meta_info {
	uint64_t step;       /* caller's tag, copied from encode */
	int group, first_rank, n, k, m, index;
	uint32_t chunk_size;
	uint32_t nchunks;    /* chunks per segment */
	uint64_t seg_len;
	uint64_t data_len;   /* this member's data length */
	uint64_t parity_len; /* this member's parity bytes: m * seg_len */
	uint64_t max_len;    /* largest data length in the group */
};

void snap_ec_meta_info(const struct snap_ec_meta *meta, struct snap_ec_meta_info *info);
/* Data length of group member `index`, or 0 when out of range. */
uint64_t snap_ec_meta_member_len(const struct snap_ec_meta *meta, int index);
/* The app blob member `index` gave to encode (NULL/0 when none). */
int snap_ec_meta_app(const struct snap_ec_meta *meta, int index,
		     const void **app, size_t *app_len);
/*
 * Parity piece (row, chunk q) of this member: its offset and length in the
 * parity buffer and the CRC32C the record holds for it, so that a scrub can
 * check the parity one piece at a time. SNAP_EINVAL for row outside 0..m-1
 * or q outside 0..nchunks-1.
 */
int snap_ec_meta_parity_piece(const struct snap_ec_meta *meta, int row, uint32_t q, uint64_t *off, uint64_t *len,
			      uint32_t *crc);
/*
 * Serialize into buf (little-endian, self-checking with a trailing CRC32C).
 * *need gets the size; if cap < *need returns SNAP_EOVERFLOW and writes
 * nothing, so call once with cap 0 to size the buffer.
 */
int snap_ec_meta_pack(const struct snap_ec_meta *meta, void *buf, size_t cap, size_t *need);
/* Parse a packed record. SNAP_EFORMAT (bad magic/version), SNAP_ETRUNC,
 * SNAP_ECORRUPT (CRC mismatch or inconsistent fields). */
int snap_ec_meta_unpack(const void *buf, size_t len, struct snap_ec_meta **out,
			char *err, size_t errlen);
void snap_ec_meta_free(struct snap_ec_meta *meta);

/*
 * Local scrub, no MPI: check this member's data and parity against the
 * CRCs in its meta. Returns 0 if every chunk matches, SNAP_ECORRUPT if some
 * do not (*nbad gets the count; errbuf names the first one), SNAP_EINVAL
 * if the buffers do not have the meta's lengths.
 */
int snap_ec_verify(const struct snap_ec_meta *meta, const struct iovec *iov, int iovcnt,
		   const void *parity, uint64_t parity_len, uint32_t *nbad,
		   char *err, size_t errlen);

/* ------------------------------------------------------------------ */
/* Encode (protect a step)                                             */
/* ------------------------------------------------------------------ */

struct snap_ec_opts {
	uint32_t chunk_size; /* 0: SNAP_EC_DEFAULT_CHUNK; multiple of 64 in [64, 2^28] */
	uint32_t window;     /* (chunk, stripe) units in flight; 0: n */
};

struct snap_ec_encode;

/*
 * [collective] Phase 1: exchange lengths (and app blobs) in the group.
 * `comm` is the group communicator (size g->n, rank g->index); it is
 * duplicated, so the caller's own traffic cannot collide. data_len is this
 * node's byte count for the step (0 allowed), app/app_len (<= SNAP_EC_APP_MAX)
 * a blob replicated into every member's meta (e.g. the node's slot list, so a
 * replacement knows how to cut its rebuilt bytes). opts may be NULL; all
 * members must pass the same opts. After it returns, ask for the parity size.
 */
int snap_ec_encode_begin(MPI_Comm comm, const struct snap_ec_group *g, uint64_t step,
			 uint64_t data_len, const void *app, size_t app_len,
			 const struct snap_ec_opts *opts, struct snap_ec_encode **out,
			 char *err, size_t errlen);

/* Bytes of parity this node must provide to run(): m * seg_len. */
uint64_t snap_ec_encode_parity_len(const struct snap_ec_encode *e);

/*
 * [collective] Phase 2: compute this node's parity into `parity` (row p at
 * offset p * seg_len) and all CRCs. iov must total exactly data_len. The data
 * is only read. On failure of any member every member returns an error.
 */
int snap_ec_encode_run(struct snap_ec_encode *e, const struct iovec *iov, int iovcnt,
		       void *parity, uint64_t parity_len);

/* After a successful run: this node's meta (owned by the handle; copy it
 * out with snap_ec_meta_pack before snap_ec_encode_free). */
const struct snap_ec_meta *snap_ec_encode_meta(const struct snap_ec_encode *e);
const char *snap_ec_encode_error(const struct snap_ec_encode *e);
void snap_ec_encode_free(struct snap_ec_encode *e);

/* ------------------------------------------------------------------ */
/* Rebuild (lost nodes and corrupt chunks)                             */
/* ------------------------------------------------------------------ */

struct snap_ec_rebuild;

struct snap_ec_rebuild_stats {
	int lost;                /* members that came without a meta */
	uint64_t chunks_rebuilt; /* chunks written on this node (lost or corrupt) */
	uint64_t chunks_corrupt; /* chunks of this node whose CRC failed */
	uint64_t bytes_written;  /* data + parity bytes written on this node */
};

/*
 * [collective] Phase 1. Survivors pass their meta for the step; a
 * replacement or a node whose store/meta is gone passes NULL and is "lost".
 * The survivors' metas must describe the same step and group
 * (SNAP_EMISMATCH otherwise). More than m lost members: SNAP_ELOST on every
 * member, the message naming the group, its rank range and the lost ranks.
 * On success every member (lost ones included) can read its meta, hence its
 * data and parity lengths, and allocate before run().
 */
int snap_ec_rebuild_begin(MPI_Comm comm, const struct snap_ec_group *g,
			  const struct snap_ec_meta *mine, const struct snap_ec_opts *opts,
			  struct snap_ec_rebuild **out, char *err, size_t errlen);

/* This member's meta (a replacement's is reconstructed from a survivor). */
const struct snap_ec_meta *snap_ec_rebuild_meta(const struct snap_ec_rebuild *r);
/* Group indices of lost members into ids[0..cap); returns their count. */
int snap_ec_rebuild_lost(const struct snap_ec_rebuild *r, int *ids, int cap);

/*
 * [collective] Phase 2. Survivors pass their data and parity (writable: any
 * chunk whose CRC fails is rewritten in place); lost members pass buffers of
 * the lengths their meta gives, whose contents are ignored. Every lost byte
 * is rebuilt and checked against the recorded CRC. SNAP_ELOST when some
 * (stripe, chunk) has more than m erasures (lost members plus corrupt chunks;
 * the message names the stripe, chunk and nodes); SNAP_ECORRUPT if a rebuilt
 * chunk does not match its CRC. stats may be NULL.
 */
int snap_ec_rebuild_run(struct snap_ec_rebuild *r, const struct iovec *iov, int iovcnt,
			void *parity, uint64_t parity_len, struct snap_ec_rebuild_stats *stats);

/*
 * How a member reads its pieces and writes its rebuilt ones, instead of
 * through the buffers run() gets (optional; either callback may be NULL).
 * iov is the index of the iovec run() was given (-1: the parity buffer) and
 * off the offset within it; a piece that straddles iovecs comes as one call
 * per iovec. Both return 0 or a negative error code.
 *
 * read: the verification's CRC of each of this member's pieces, and the
 *   sources this member decodes itself, read through it into a reused
 *   buffer. A failed read makes the piece an erasure. Sources sent to other
 *   members still go from the buffers (MPI reads them).
 * write: each rebuilt piece, already checked against its recorded CRC32C.
 *   A failure fails the rebuild on every member (the message names the
 *   piece). The buffers are then never written, and a lost member's never
 *   touched at all.
 *
 * Why: at a relaunch the stores are mapped afresh. Every first touch of a
 * page through a new mapping faults, and on a shadow-paged virtual machine
 * (this project's test host) each such fault is a trip to the hypervisor
 * even after MAP_POPULATE. Measured here, 256 MiB of tmpfs: written through
 * a new mapping 1.1 s, with pwrite() 0.14 s; read 1.4 GB/s through a new
 * mapping, 5.4 GB/s with pread() into a reused buffer. Callbacks that call
 * pread()/pwrite() let the kernel copy through its own mapping instead.
 * Writes win everywhere; reads depend on the machine (on another VM,
 * without the per-page traps, pread() was 1.2-1.6x slower than a populated
 * mapping): snapsmp passes only write.
 */
struct snap_ec_io {
	int (*read)(void *arg, int iov, uint64_t off, void *buf, size_t len);
	int (*write)(void *arg, int iov, uint64_t off, const void *buf, size_t len);
	void *arg;
};

/* Before run(): use io (copied; NULL restores the default, the buffers
 * themselves). SNAP_EINVAL if both callbacks are NULL. */
int snap_ec_rebuild_set_io(struct snap_ec_rebuild *r, const struct snap_ec_io *io);

const char *snap_ec_rebuild_error(const struct snap_ec_rebuild *r);
void snap_ec_rebuild_free(struct snap_ec_rebuild *r);

/* ------------------------------------------------------------------ */
/* Single-process helpers (reference, benchmarks, tools)               */
/* ------------------------------------------------------------------ */

/*
 * Compute every member's parity of one group in this process with the same
 * per-unit kernel the mesh uses. data[j] has len[j] bytes, parity[j] must
 * hold m * snap_ec_seg_len(k, max len) bytes. chunk_size 0 = default.
 */
int snap_ec_encode_group_local(int k, int m, uint32_t chunk_size,
			       const void *const *data, const uint64_t *len,
			       void *const *parity, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* SNAP_EC_H */
