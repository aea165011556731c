/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rebuild.c - two-phase rebuild: agree on who is lost and hand replacements
 * their meta, then verify every surviving chunk, plan the erasures and run
 * the exchange with lost/corrupt pieces as the outputs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ec_internal.h"

struct snap_ec_rebuild {
	MPI_Comm comm;
	struct snap_ec_group g;
	struct ec_code code;
	struct snap_ec_meta *mt;
	uint8_t *lost; /* [n] */
	int nlost;
	uint32_t window;
	int done;
	int has_io;
	struct snap_ec_io io;
	char err[512];
};

struct member_info {
	int32_t have, rc;
	uint32_t digest;
	uint32_t size;
	uint64_t step;
};

/* Append ", rank R" items to a message without overflowing it. */
static void append(char *buf, size_t len, const char *fmt, int a, int b)
{
	size_t used = strlen(buf);
	if (used + 1 < len)
		snprintf(buf + used, len - used, fmt, a, b);
}

/* Phase 1, local: this member's row of the member table. A survivor packs
 * its meta (kept in *packed for the Bcast) and sends a digest of it with
 * the index field zeroed, since survivors' records differ only there. */
static int rebuild_my_info(const struct snap_ec_group *g, const struct snap_ec_meta *mine,
			   struct member_info *me, uint8_t **packed, size_t *psize, char *err, size_t errlen)
{
	if (mine->group != g->id || mine->n != g->n || mine->k != g->k || mine->m != g->m ||
	    mine->index != g->index || mine->first_rank != g->first_rank)
		return ec_errf(err, errlen, SNAP_EMISMATCH,
			       "ec: meta of group %d index %d (%d+%d) handed to group %d index %d (%d+%d)",
			       mine->group, mine->index, mine->k, mine->m, g->id, g->index, g->k, g->m);
	snap_ec_meta_pack(mine, NULL, 0, psize);
	if (*psize > INT32_MAX)
		return ec_errf(err, errlen, SNAP_EOVERFLOW,
			       "ec: packed meta of %zu bytes exceeds what one MPI_Bcast can carry", *psize);
	if (!(*packed = malloc(*psize)))
		return ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory");
	snap_ec_meta_pack(mine, *packed, *psize, psize);
	uint8_t saved[4];
	memcpy(saved, *packed + EC_META_INDEX_OFF, 4);
	memset(*packed + EC_META_INDEX_OFF, 0, 4);
	me->digest = snap_crc32c_update(0, *packed, *psize - 4);
	memcpy(*packed + EC_META_INDEX_OFF, saved, 4);
	me->have = 1;
	me->size = (uint32_t)*psize;
	me->step = mine->step;
	return 0;
}

/* Phase 2, collective: every member's row, and the verdicts all members
 * reach alike from it: a refusal, more than m lost, survivors that hold
 * different records. *ref: the lowest surviving index. */
static int rebuild_agree_members(MPI_Comm comm, const struct snap_ec_group *g, const struct member_info *me,
				 struct member_info *all, int rc, int *ref, int *nlost, char *err, size_t errlen)
{
	if (MPI_Allgather(me, sizeof(*me), MPI_BYTE, all, sizeof(*me), MPI_BYTE, comm) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Allgather of member states failed");
	for (int j = 0; j < g->n && !rc; j++) {
		if (all[j].rc)
			rc = ec_errf(err, errlen, all[j].rc, "ec: group %d index %d refused its arguments",
				     g->id, j);
		else if (all[j].have && *ref < 0)
			*ref = j;
	}
	if (rc)
		return rc;
	for (int j = 0; j < g->n; j++)
		*nlost += !all[j].have;
	if (*nlost > g->m) {
		char msg[400];
		snprintf(msg, sizeof(msg), "ec: group %d (ranks %d-%d, %d+%d) lost %d members (ranks",
			 g->id, g->first_rank, g->first_rank + g->n - 1, g->k, g->m, *nlost);
		int first = 1;
		for (int j = 0; j < g->n; j++)
			if (!all[j].have) {
				append(msg, sizeof(msg), first ? " %d" : ", %d", g->first_rank + j, 0);
				first = 0;
			}
		append(msg, sizeof(msg), "); at most %d can be rebuilt%.0d", g->m, 0);
		return ec_errf(err, errlen, SNAP_ELOST, "%s", msg);
	}
	for (int j = 0; j < g->n; j++)
		if (all[j].have && (all[j].digest != all[*ref].digest || all[j].size != all[*ref].size))
			return ec_errf(err, errlen, SNAP_EMISMATCH,
				       "ec: group %d survivors disagree: index %d has step %llu, index %d step %llu "
				       "(or different lengths/CRCs)", g->id, *ref,
				       (unsigned long long)all[*ref].step, j, (unsigned long long)all[j].step);
	return 0;
}

/* Phase 3, local: the lost flags, and room for the meta (a survivor's own
 * copy, or the buffer a replacement receives it in). May fail on one member
 * only: the caller agrees on the outcome. */
static int rebuild_setup_local(struct snap_ec_rebuild *r, const struct snap_ec_group *g,
			       const struct member_info *all, int nlost, int ref, const struct snap_ec_meta *mine,
			       uint8_t **packed, size_t *psize, char *err, size_t errlen)
{
	int rc = 0;
	r->nlost = nlost;
	if (!(r->lost = calloc((size_t)g->n, 1)))
		rc = ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory");
	for (int j = 0; r->lost && j < g->n; j++)
		r->lost[j] = !all[j].have;
	if (mine) {
		if (!rc && !(r->mt = ec_meta_dup(mine)))
			rc = ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory for the meta");
	} else {
		*psize = all[ref].size;
		if (!rc && !(*packed = malloc(*psize)))
			rc = ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory for the meta");
	}
	return rc;
}

/* Phase 4, collective when members were lost: replacements learn their meta
 * from the lowest surviving index (all survivors' records are identical but
 * for the index field); then the code tables. */
static int rebuild_share_meta(MPI_Comm comm, struct snap_ec_rebuild *r, const struct snap_ec_group *g,
			      const struct snap_ec_meta *mine, uint8_t *packed, size_t psize, uint32_t ref_size,
			      int ref, int nlost, char *err, size_t errlen)
{
	int rc = 0;
	if (nlost && MPI_Bcast(packed, (int)ref_size, MPI_BYTE, ref, comm) != MPI_SUCCESS)
		rc = ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Bcast of the meta failed");
	if (!mine && !rc) {
		rc = snap_ec_meta_unpack(packed, psize, &r->mt, err, errlen);
		if (!rc)
			r->mt->index = g->index;
	}
	if (!rc && (rc = ec_code_init(&r->code, g->k, g->m)))
		ec_errf(err, errlen, rc, "ec: out of memory");
	return rc;
}

int snap_ec_rebuild_begin(MPI_Comm comm, const struct snap_ec_group *g,
			  const struct snap_ec_meta *mine, const struct snap_ec_opts *opts,
			  struct snap_ec_rebuild **out, char *err, size_t errlen)
{
	int rc = ec_check_comm(comm, g, err, errlen);
	if (rc)
		return rc;
	if (out)
		*out = NULL;
	struct member_info me = { 0 };
	uint8_t *packed = NULL;
	uint32_t chunk, window = 0;
	size_t psize = 0;
	if (!out) {
		rc = ec_errf(err, errlen, SNAP_EINVAL, "ec: rebuild_begin: NULL output");
	} else if ((rc = ec_opts_resolve(opts, g->n, &chunk, &window, err, errlen))) {
		/* chunk size comes from the meta; only the window matters */
	} else if (mine) {
		rc = rebuild_my_info(g, mine, &me, &packed, &psize, err, errlen);
	}
	/* The member table lives on the stack (n <= 255) so nothing keeps this
	 * member out of the Allgather; allocation failures travel in me.rc or
	 * through ec_group_status before the Bcast every member must enter. */
	struct member_info all[SNAP_EC_MAX_GROUP];
	struct snap_ec_rebuild *r = calloc(1, sizeof(*r));
	if (!r && !rc)
		rc = ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory");
	me.rc = rc;
	if (r) {
		r->comm = MPI_COMM_NULL;
		r->g = *g;
		r->window = window;
	}
	int ref = -1, nlost = 0;
	if ((rc = rebuild_agree_members(comm, g, &me, all, rc, &ref, &nlost, err, errlen)))
		goto fail; /* every member saw the same table: all leave here */
	rc = rebuild_setup_local(r, g, all, nlost, ref, mine, &packed, &psize, err, errlen);
	if ((rc = ec_group_status(comm, rc, err, errlen, "rebuild setup")))
		goto fail;
	rc = rebuild_share_meta(comm, r, g, mine, packed, psize, all[ref].size, ref, nlost, err, errlen);
	if ((rc = ec_group_status(comm, rc, err, errlen, "rebuild meta")))
		goto fail;
	if ((rc = ec_comm_dup(comm, &r->comm, err, errlen)))
		goto fail;
	free(packed);
	*out = r;
	return 0;
fail:
	free(packed);
	snap_ec_rebuild_free(r);
	return rc;
}

const struct snap_ec_meta *snap_ec_rebuild_meta(const struct snap_ec_rebuild *r)
{
	return r ? r->mt : NULL;
}

int snap_ec_rebuild_lost(const struct snap_ec_rebuild *r, int *ids, int cap)
{
	if (!r || (cap && !ids))
		return SNAP_EINVAL;
	int c = 0;
	for (int j = 0; j < r->g.n; j++)
		if (r->lost[j]) {
			if (c < cap)
				ids[c] = j;
			c++;
		}
	return c;
}

/* The rebuild verifies survivors' chunks as it goes, one batch of chunk
 * rows ahead of the exchange: each member CRCs its pieces of the next
 * batch (just before they are sent, so the sends find them in cache), the
 * group gathers the flags with a nonblocking Iallgather, and the exchange
 * waits for a row's flags only when it reaches that row. A batch is the
 * rows of one exchange window (at least one row), so the verify's buffers
 * are as bounded as the exchange's. Before, every chunk was verified and
 * gathered before the first byte moved: a whole pass, then a barrier. */
struct verify {
	struct snap_ec_rebuild *r;
	const struct ec_iov *v;
	const uint8_t *parity;
	uint8_t *erased;        /* [n][k+m][nchunks]: rows < ready are filled */
	uint32_t rows;          /* rows per batch */
	uint8_t *mine[2], *all[2];  /* [k+m][rows], [n][k+m][rows] */
	MPI_Request req[2];
	uint32_t q0[2];         /* first row of the batch in flight in each buffer */
	int busy[2];
	uint32_t ready, next;   /* rows < ready checked; rows < next requested */
	uint64_t bad;           /* corrupt chunks of mine */
	const struct snap_ec_io *io; /* pieces read through io->read into buf */
	uint8_t *buf;
};

/* Mark this member's pieces of rows [q0, q1) erased: all of them when it is
 * lost, else the chunks whose CRC fails (or, through io->read, that cannot
 * be read). Pure zero padding never is. */
static void local_erasures(struct verify *vf, uint32_t q0, uint32_t q1, uint8_t *flags)
{
	const struct snap_ec_meta *mt = vf->r->mt;
	int me = mt->index, km = mt->k + mt->m;
	for (uint32_t q = q0; q < q1; q++)
		for (int slot = 0; slot < km; slot++) {
			uint8_t *f = &flags[(size_t)slot * vf->rows + (q - q0)];
			if (slot < mt->k && ec_valid(mt, me, slot, q) == 0)
				*f = 0;
			else if (vf->r->lost[me])
				*f = 1;
			else if (vf->io) {
				uint32_t c = 0;
				int rc = ec_piece_crc_io(mt, me, vf->v, vf->io, slot, q, vf->buf, &c);
				vf->bad += (*f = rc || c != *ec_meta_crc(mt, me, slot, q));
			} else {
				vf->bad += (*f = ec_piece_crc(mt, me, vf->v, vf->parity, slot, q) !=
						 *ec_meta_crc(mt, me, slot, q));
			}
		}
}

/* Every member runs this on the same table, so all agree on the verdict. */
static int plan_check(struct snap_ec_rebuild *r, const uint8_t *erased, uint32_t q0, uint32_t q1)
{
	const struct snap_ec_meta *mt = r->mt;
	int n = mt->n, k = mt->k, m = mt->m;
	for (uint32_t q = q0; q < q1; q++)
		for (int s = 0; s < n; s++) {
			int cnt = 0;
			for (int slot = 0; slot < n; slot++) {
				int node = ec_slot_node(n, k, m, s, slot);
				cnt += erased[((size_t)node * (size_t)n + (size_t)slot) * mt->nchunks + q] != 0;
			}
			if (cnt <= m)
				continue;
			char msg[480];
			snprintf(msg, sizeof(msg),
				 "ec: group %d (ranks %d-%d, %d+%d) step %llu: stripe %d chunk %u has %d erasures, "
				 "at most %d can be rebuilt:", mt->group, mt->first_rank,
				 mt->first_rank + n - 1, k, m, (unsigned long long)mt->step, s, q, cnt, m);
			for (int slot = 0; slot < n; slot++) {
				int node = ec_slot_node(n, k, m, s, slot);
				if (!erased[((size_t)node * (size_t)n + (size_t)slot) * mt->nchunks + q])
					continue;
				if (r->lost[node])
					append(msg, sizeof(msg), " rank %d (lost)%.0d", mt->first_rank + node, 0);
				else
					append(msg, sizeof(msg), slot < k ? " rank %d (corrupt data seg %d)"
									  : " rank %d (corrupt parity row %d)",
					       mt->first_rank + node, slot < k ? slot : slot - k);
			}
			return ec_errf(r->err, sizeof(r->err), SNAP_ELOST, "%s", msg);
		}
	return 0;
}

/* Verify the next batch of rows and start gathering its flags. */
static int verify_start(struct verify *vf)
{
	const struct snap_ec_meta *mt = vf->r->mt;
	int b = (int)((vf->next / vf->rows) % 2), km = mt->k + mt->m;
	uint32_t q1 = vf->next + vf->rows < mt->nchunks ? vf->next + vf->rows : mt->nchunks;
	local_erasures(vf, vf->next, q1, vf->mine[b]);
	vf->q0[b] = vf->next;
	vf->next = q1;
	vf->busy[b] = 1;
	if (MPI_Iallgather(vf->mine[b], km * (int)vf->rows, MPI_BYTE, vf->all[b], km * (int)vf->rows, MPI_BYTE,
			   vf->r->comm, &vf->req[b]) != MPI_SUCCESS)
		return ec_errf(vf->r->err, sizeof(vf->r->err), SNAP_EIO, "ec: MPI_Iallgather of erasures failed");
	return 0;
}

/* Wait for the batch in buffer b, copy its flags into the table, check it. */
static int verify_finish(struct verify *vf, int b)
{
	const struct snap_ec_meta *mt = vf->r->mt;
	int km = mt->k + mt->m;
	vf->busy[b] = 0;
	if (MPI_Wait(&vf->req[b], MPI_STATUS_IGNORE) != MPI_SUCCESS)
		return ec_errf(vf->r->err, sizeof(vf->r->err), SNAP_EIO, "ec: MPI_Iallgather of erasures failed");
	uint32_t q0 = vf->q0[b], q1 = q0 + vf->rows < mt->nchunks ? q0 + vf->rows : mt->nchunks;
	for (int node = 0; node < mt->n; node++)
		for (int slot = 0; slot < km; slot++)
			memcpy(vf->erased + ((size_t)node * (size_t)km + (size_t)slot) * mt->nchunks + q0,
			       vf->all[b] + ((size_t)node * (size_t)km + (size_t)slot) * vf->rows, q1 - q0);
	vf->ready = q1;
	return plan_check(vf->r, vf->erased, q0, q1);
}

/* ec_xchg's row_ready: rows up to q checked, the batch after it requested. */
static int row_ready(void *arg, uint32_t q)
{
	struct verify *vf = arg;
	int rc = 0;
	while (!rc && vf->ready <= q) {
		if (vf->next == vf->ready)
			rc = verify_start(vf);
		if (!rc)
			rc = verify_finish(vf, (int)((vf->ready / vf->rows) % 2));
	}
	if (!rc && vf->next == vf->ready && vf->next < vf->r->mt->nchunks)
		rc = verify_start(vf);
	return rc;
}

static size_t per_batch(const struct snap_ec_meta *mt, uint32_t rows, size_t members)
{
	return members * (size_t)(mt->k + mt->m) * rows;
}

int snap_ec_rebuild_run(struct snap_ec_rebuild *r, const struct iovec *iov, int iovcnt,
			void *parity, uint64_t parity_len, struct snap_ec_rebuild_stats *st)
{
	if (!r)
		return SNAP_EINVAL;
	const struct snap_ec_meta *mt = r->mt;
	struct ec_iov v = { 0 };
	size_t per = (size_t)(mt->k + mt->m) * mt->nchunks;
	uint8_t *erased = NULL;
	uint64_t plen = (uint64_t)mt->m * mt->seg_len;
	int rc = 0;
	r->err[0] = 0;
	if (st)
		memset(st, 0, sizeof(*st));
	if (r->done)
		rc = ec_errf(r->err, sizeof(r->err), SNAP_ESTATE, "ec: rebuild_run called twice");
	else if (ec_iov_init(&v, iov, iovcnt))
		rc = ec_errf(r->err, sizeof(r->err), SNAP_EINVAL, "ec: bad iovec list");
	else if (v.total != mt->len[mt->index])
		rc = ec_errf(r->err, sizeof(r->err), SNAP_EINVAL,
			     "ec: iovecs hold %llu bytes, the meta says index %d has %llu",
			     (unsigned long long)v.total, mt->index,
			     (unsigned long long)mt->len[mt->index]);
	else if (parity_len < plen || (plen && !parity))
		rc = ec_errf(r->err, sizeof(r->err), SNAP_EINVAL, "ec: parity buffer of %llu bytes, need %llu",
			     (unsigned long long)parity_len, (unsigned long long)plen);
	else if (!(erased = calloc((size_t)mt->n * per + 1, 1)))
		rc = ec_errf(r->err, sizeof(r->err), SNAP_ENOMEM, "ec: out of memory");
	rc = ec_group_status(r->comm, rc, r->err, sizeof(r->err), "rebuild arguments");
	if (rc)
		goto out;
	struct verify vf = { .r = r, .v = &v, .parity = parity, .erased = erased,
			     .io = r->has_io && r->io.read ? &r->io : NULL };
	uint32_t w = r->window ? r->window : (uint32_t)mt->n;
	vf.rows = (w + (uint32_t)mt->n - 1) / (uint32_t)mt->n;
	for (int b = 0; b < 2; b++) {
		vf.mine[b] = calloc(1, per_batch(mt, vf.rows, 1));
		vf.all[b] = malloc(per_batch(mt, vf.rows, (size_t)mt->n));
	}
	if (vf.io)
		vf.buf = malloc(mt->chunk_size);
	rc = vf.mine[0] && vf.mine[1] && vf.all[0] && vf.all[1] && (!vf.io || vf.buf) ? 0 : SNAP_ENOMEM;
	if (rc)
		ec_errf(r->err, sizeof(r->err), rc, "ec: out of memory");
	if ((rc = ec_group_status(r->comm, rc, r->err, sizeof(r->err), "rebuild verify buffers")))
		goto out_vf;
	struct ec_xchg x = {
		.mode = EC_MODE_REBUILD, .comm = r->comm, .me = mt->index, .mt = mt,
		.code = &r->code, .data = &v, .parity = parity, .erased = erased,
		.window = r->window, .err = r->err, .errlen = sizeof(r->err),
		.row_ready = row_ready, .row_arg = &vf, .io = r->has_io ? &r->io : NULL,
	};
	rc = ec_xchg_run(&x);
	for (int b = 0; b < 2; b++) /* a batch requested ahead of a failure */
		if (vf.busy[b])
			MPI_Wait(&vf.req[b], MPI_STATUS_IGNORE);
	rc = ec_group_status(r->comm, rc, r->err, sizeof(r->err), "rebuild exchange");
	if (st) {
		st->lost = r->nlost;
		st->chunks_rebuilt = x.chunks_written;
		st->chunks_corrupt = r->lost[mt->index] ? 0 : vf.bad;
		st->bytes_written = x.bytes_written;
	}
	if (!rc)
		r->done = 1;
out_vf:
	for (int b = 0; b < 2; b++) {
		free(vf.mine[b]);
		free(vf.all[b]);
	}
	free(vf.buf);
out:
	free(erased);
	ec_iov_fini(&v);
	return rc;
}

int snap_ec_rebuild_set_io(struct snap_ec_rebuild *r, const struct snap_ec_io *io)
{
	if (!r || (io && !io->read && !io->write))
		return SNAP_EINVAL;
	r->has_io = io != NULL;
	if (io)
		r->io = *io;
	return 0;
}

const char *snap_ec_rebuild_error(const struct snap_ec_rebuild *r)
{
	return r ? r->err : "ec: NULL rebuild handle";
}

void snap_ec_rebuild_free(struct snap_ec_rebuild *r)
{
	if (!r)
		return;
	if (r->comm != MPI_COMM_NULL)
		MPI_Comm_free(&r->comm);
	ec_code_fini(&r->code);
	snap_ec_meta_free(r->mt);
	free(r->lost);
	free(r);
}
