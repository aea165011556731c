/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * ec_internal.h - shared between the ec/ sources; not installed.
 */
#ifndef SNAP_EC_INTERNAL_H
#define SNAP_EC_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <sys/uio.h>
#include <mpi.h>

#include "snap/base.h"   /* snap_crc32c_update: the one CRC32C */
#include "snap/ec.h"

/* The Reed-Solomon code of one group shape. */
struct ec_code {
	int k, m, n;
	uint8_t *gen;      /* n x k, rows < k identity */
	uint8_t *enc_tbls;                                 /* m rows of 32*k bytes */
};

int ec_code_init(struct ec_code *c, int k, int m);
void ec_code_fini(struct ec_code *c);
/* Coefficients (k bytes) expressing member slot `out` over survivor slots
 * surv[0..k). Slots < k are data, k + p parity row p. */
int ec_code_row(const struct ec_code *c, const int *surv, int out, uint8_t *coef);

struct snap_ec_meta {
	uint64_t step;
	int group, first_rank, n, k, m, index;
	uint32_t chunk_size, nchunks;
	uint64_t seg_len;
	uint64_t *len;     /* [n] */
	uint32_t *app_len; /* [n] */
	uint64_t *app_off; /* [n] offsets into app */
	uint8_t *app;
	uint64_t app_total;
	uint32_t *crc;     /* [n][k+m][nchunks] */
};

static inline uint32_t *ec_meta_crc(const struct snap_ec_meta *mt, int node, int slot, uint32_t q)
{
	return &mt->crc[((size_t)node * (size_t)(mt->k + mt->m) + (size_t)slot) * mt->nchunks + q];
}

/* The packed meta (meta.c): magic, version, then u32 group, first_rank, n,
 * k, m, index, ... The index is the one field survivors' records differ in. */
#define EC_META_MAGIC "SNAPECM1"
#define EC_META_VERSION 1u
#define EC_META_FIXED (8 + 4 + 8 * 4 + 3 * 8)
#define EC_META_INDEX_OFF 32 /* byte offset of the index field */

/* Allocates len/app arrays/crc for the shape already set in *mt. */
int ec_meta_alloc(struct snap_ec_meta *mt, uint64_t app_total);
struct snap_ec_meta *ec_meta_dup(const struct snap_ec_meta *mt);

/* Bytes of member `node`'s data segment `seg` chunk q that are real data
 * (the rest of the chunk is logical zero padding). */
static inline uint64_t ec_valid(const struct snap_ec_meta *mt, int node, int seg, uint32_t q)
{
	uint64_t off = (uint64_t)seg * mt->seg_len + (uint64_t)q * mt->chunk_size;
	uint64_t end = (uint64_t)seg * mt->seg_len + ((uint64_t)q + 1) * mt->chunk_size;
	uint64_t segend = ((uint64_t)seg + 1) * mt->seg_len;
	uint64_t len = mt->len[node];
	if (end > segend)
		end = segend;
	if (len <= off)
		return 0;
	return (len < end ? len : end) - off;
}

static inline uint64_t ec_chunk_len(const struct snap_ec_meta *mt, uint32_t q)
{
	uint64_t off = (uint64_t)q * mt->chunk_size;
	uint64_t left = mt->seg_len - off;
	return left < mt->chunk_size ? left : mt->chunk_size;
}

/* Walks a caller's iovec list by absolute byte offset. */
struct ec_iov {
	const struct iovec *iov;
	int cnt;
	uint64_t *start; /* [cnt + 1] prefix sums */
	uint64_t total;
};

int ec_iov_init(struct ec_iov *v, const struct iovec *iov, int cnt);
void ec_iov_fini(struct ec_iov *v);
/* Pointer to [off, off+len) when contiguous in one iovec, else NULL. */
uint8_t *ec_iov_contig(const struct ec_iov *v, uint64_t off, uint64_t len);
void ec_iov_read(const struct ec_iov *v, uint64_t off, void *dst, uint64_t len);
void ec_iov_write(const struct ec_iov *v, uint64_t off, const void *src, uint64_t len);
/* [off, off+len) of v written or read through io, one call per iovec it
 * touches (io->write / io->read must be set). */
int ec_io_write(const struct ec_iov *v, uint64_t off, const void *src, uint64_t len, const struct snap_ec_io *io);
int ec_io_read(const struct ec_iov *v, uint64_t off, void *dst, uint64_t len, const struct snap_ec_io *io);
/* CRC32C (chained) over [off, off+len). */
uint32_t ec_iov_crc(const struct ec_iov *v, uint64_t off, uint64_t len, uint32_t crc);

/* CRC32C of `v` real bytes at p followed by `zeros` zero bytes. */
uint32_t ec_crc_padded(uint32_t crc, const void *p, uint64_t v, uint64_t zeros);

/* Exchange engine: move the source pieces of every (chunk, stripe) unit
 * that has erased slots to the owners of those slots, who compute them. */
enum ec_mode { EC_MODE_ENCODE, EC_MODE_REBUILD };

struct ec_xchg {
	enum ec_mode mode;
	MPI_Comm comm;
	int me;
	const struct snap_ec_meta *mt; /* shape, lengths and (rebuild) CRCs */
	const struct ec_code *code;
	const struct ec_iov *data;     /* my data */
	uint8_t *parity;               /* my parity, m * seg_len */
	const uint8_t *erased;         /* rebuild: [n][k+m][nchunks] flags */
	uint32_t *crc_tab;             /* encode: out [n][k+m][nchunks], zero but
					* the CRCs this member computed */
	uint32_t window;
	/* rebuild: called before the first unit of chunk row q is posted, at
	 * the same unit on every member; it fills row q of erased (and may
	 * collect rows ahead). Nonzero: every member returns that error
	 * (its message in err) once the units in flight are done. */
	int (*row_ready)(void *arg, uint32_t q);
	void *row_arg;
	/* rebuild: how my pieces are read and my rebuilt ones written; NULL
	 * (or a NULL callback): through data and parity */
	const struct snap_ec_io *io;
	/* results */
	uint64_t chunks_written, bytes_written;
	char *err;
	size_t errlen;
};

/* Collective over x->comm. Allocates all its buffers first and agrees on
 * that (one Allreduce), so a local out-of-memory fails the group. */
int ec_xchg_run(struct ec_xchg *x);

/* Agree on a status across the group (MPI_MIN) so no member proceeds
 * alone; a member that was fine gets "failed on another group member". */
int ec_group_status(MPI_Comm comm, int rc, char *err, size_t errlen, const char *what);

/* MPI_Comm_dup with errors returned, not fatal: the handle's own
 * communicator. SNAP_EIO (and *out = MPI_COMM_NULL) when it fails. */
int ec_comm_dup(MPI_Comm comm, MPI_Comm *out, char *err, size_t errlen);

/* EINVAL with a message unless g is a valid shape and comm has g->n members
 * with this process at g->index. */
int ec_check_comm(MPI_Comm comm, const struct snap_ec_group *g, char *err, size_t errlen);

/* CRC32C of member `me`'s piece (slot, chunk q) as the meta records it: a
 * data chunk zero-padded to the chunk length, or a parity chunk. */
uint32_t ec_piece_crc(const struct snap_ec_meta *mt, int me, const struct ec_iov *v, const uint8_t *parity,
		      int slot, uint32_t q);
/* The same through io->read into buf (chunk_size bytes); SNAP_EIO etc. when
 * the read fails. */
int ec_piece_crc_io(const struct snap_ec_meta *mt, int me, const struct ec_iov *v, const struct snap_ec_io *io,
		    int slot, uint32_t q, uint8_t *buf, uint32_t *crc);

/* Group member (0..n-1) holding slot `slot` of stripe s (rotated placement:
 * data slot t on (s + m + t) mod n, parity row p on (s + p) mod n). */
static inline int ec_slot_node(int n, int k, int m, int s, int slot)
{
	return slot < k ? (s + m + slot) % n : (s + slot - k) % n;
}

/* Error message helper: writes into buf (if any) and returns code. */
int ec_errf(char *buf, size_t len, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

int ec_opts_resolve(const struct snap_ec_opts *o, int n, uint32_t *chunk, uint32_t *window,
		    char *err, size_t errlen);

#endif
