/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * encode.c - two-phase protect of one step: agree on lengths, then run the
 * exchange with parity holders as the outputs, then share the CRC tables so
 * every member's meta can vouch for every other member.
 */
#include <stdlib.h>
#include <string.h>

#include "ec_internal.h"

struct snap_ec_encode {
	MPI_Comm comm;
	struct snap_ec_group g;
	struct ec_code code;
	struct snap_ec_meta *mt;
	uint32_t window;
	int done;
	char err[256];
};

struct begin_info {
	uint64_t len, step;
	uint32_t app_len, chunk, window;
	int32_t rc;
};

/* Phase 1, local: this member's row of the length table (its arguments
 * checked; a refusal travels in rc so the others learn of it). */
static int encode_my_info(const struct snap_ec_group *g, uint64_t step, uint64_t data_len, const void *app,
			  size_t app_len, const struct snap_ec_opts *opts, struct snap_ec_encode **out,
			  struct begin_info *mine, char *err, size_t errlen)
{
	*mine = (struct begin_info){ .len = data_len, .step = step, .app_len = (uint32_t)app_len };
	uint32_t chunk = 0, window = 0;
	int rc;
	if (!out)
		rc = ec_errf(err, errlen, SNAP_EINVAL, "ec: encode_begin: NULL output");
	else if (app_len > SNAP_EC_APP_MAX || (app_len && !app))
		rc = ec_errf(err, errlen, SNAP_EINVAL, "ec: app blob of %zu bytes (max %u, non-NULL)",
			     app_len, SNAP_EC_APP_MAX);
	else
		rc = ec_opts_resolve(opts, g->n, &chunk, &window, err, errlen);
	if (rc)
		mine->app_len = 0;
	mine->chunk = chunk;
	mine->window = window;
	mine->rc = rc;
	return rc;
}

/* Phase 2, collective: every member's row; all leave on the same verdict
 * (a member that refused its arguments, or disagreement on the shape). */
static int encode_agree_lengths(MPI_Comm comm, const struct snap_ec_group *g, const struct begin_info *mine,
				struct begin_info *all, int rc, char *err, size_t errlen)
{
	if (MPI_Allgather(mine, sizeof(*mine), MPI_BYTE, all, sizeof(*mine), MPI_BYTE, comm) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Allgather of lengths failed");
	for (int j = 0; j < g->n && !rc; j++) {
		if (all[j].rc)
			rc = ec_errf(err, errlen, all[j].rc, "ec: group %d index %d refused its arguments",
				     g->id, j);
		else if (all[j].chunk != all[0].chunk || all[j].step != all[0].step ||
			 all[j].window != all[0].window)
			rc = ec_errf(err, errlen, SNAP_EINVAL,
				     "ec: group %d members disagree on step/chunk/window (index 0 vs %d)",
				     g->id, j);
	}
	return rc;
}

/* Phase 3, local: the shape of the stripes and the meta that will describe
 * them, from the agreed table. seg_len too long is the same verdict on every
 * member; an allocation may fail on one only (the caller agrees on that). */
static int encode_setup_meta(struct snap_ec_encode *e, const struct snap_ec_group *g, uint64_t step,
			     const struct begin_info *all, uint32_t chunk, int *same_everywhere, char *err,
			     size_t errlen)
{
	uint64_t maxl = 0, apps = 0;
	for (int j = 0; j < g->n; j++) {
		maxl = all[j].len > maxl ? all[j].len : maxl;
		apps += all[j].app_len;
	}
	uint64_t seg_len = snap_ec_seg_len(g->k, maxl);
	if ((seg_len + chunk - 1) / chunk > UINT32_MAX) {
		*same_everywhere = 1;
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: segments too long for chunk size %u", chunk);
	}
	struct snap_ec_meta *mt = calloc(1, sizeof(*mt));
	e->mt = mt;
	if (!mt)
		return ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory for the metadata");
	mt->step = step;
	mt->group = g->id;
	mt->first_rank = g->first_rank;
	mt->n = g->n;
	mt->k = g->k;
	mt->m = g->m;
	mt->index = g->index;
	mt->chunk_size = chunk;
	mt->seg_len = seg_len;
	mt->nchunks = (uint32_t)((seg_len + chunk - 1) / chunk);
	int rc;
	if ((rc = ec_meta_alloc(mt, apps)) || (rc = ec_code_init(&e->code, g->k, g->m)))
		ec_errf(err, errlen, rc, "ec: out of memory for the metadata");
	return rc;
}

/* Phase 4, collective: every member's lengths and app blob into the meta. */
static int encode_share_apps(MPI_Comm comm, const struct snap_ec_group *g, struct snap_ec_meta *mt,
			     const struct begin_info *all, const void *app, size_t app_len, char *err,
			     size_t errlen)
{
	int counts[SNAP_EC_MAX_GROUP], displs[SNAP_EC_MAX_GROUP];
	uint64_t off = 0;
	for (int j = 0; j < g->n; j++) {
		mt->len[j] = all[j].len;
		mt->app_len[j] = all[j].app_len;
		mt->app_off[j] = off;
		counts[j] = (int)all[j].app_len;
		displs[j] = (int)off;
		off += all[j].app_len;
	}
	if (MPI_Allgatherv(app, (int)app_len, MPI_BYTE, mt->app, counts, displs, MPI_BYTE, comm) !=
	    MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Allgatherv of app blobs failed");
	return 0;
}

int snap_ec_encode_begin(MPI_Comm comm, const struct snap_ec_group *g, uint64_t step,
			 uint64_t data_len, const void *app, size_t app_len,
			 const struct snap_ec_opts *opts, struct snap_ec_encode **out,
			 char *err, size_t errlen)
{
	int rc = ec_check_comm(comm, g, err, errlen);
	if (rc)
		return rc;
	if (out)
		*out = NULL;
	struct begin_info mine;
	rc = encode_my_info(g, step, data_len, app, app_len, opts, out, &mine, err, errlen);

	/* Per-member tables live on the stack (n <= 255), so nothing can keep
	 * this member out of the Allgather below; a failed allocation is
	 * reported through it (rc) or through ec_group_status before the
	 * Allgatherv, and fails the whole group instead of hanging it. */
	struct begin_info all[SNAP_EC_MAX_GROUP];
	struct snap_ec_encode *e = calloc(1, sizeof(*e));
	if (!e && !rc) {
		rc = ec_errf(err, errlen, SNAP_ENOMEM, "ec: out of memory");
		mine.rc = rc;
		mine.app_len = 0;
	}
	if (e)
		e->comm = MPI_COMM_NULL;
	if ((rc = encode_agree_lengths(comm, g, &mine, all, rc, err, errlen)))
		goto fail; /* every member saw the same table: all leave here */
	e->g = *g;
	e->window = mine.window;
	int same_everywhere = 0;
	rc = encode_setup_meta(e, g, step, all, mine.chunk, &same_everywhere, err, errlen);
	if (same_everywhere)
		goto fail;
	/* Local allocations above may fail on one member only: agree before
	 * the Allgatherv that every member has to enter. */
	if ((rc = ec_group_status(comm, rc, err, errlen, "encode setup")))
		goto fail;
	if ((rc = encode_share_apps(comm, g, e->mt, all, app, app_len, err, errlen)))
		goto fail;
	if ((rc = ec_comm_dup(comm, &e->comm, err, errlen)))
		goto fail;
	*out = e;
	return 0;
fail:
	snap_ec_encode_free(e);
	return rc;
}

uint64_t snap_ec_encode_parity_len(const struct snap_ec_encode *e)
{
	return e && e->mt ? (uint64_t)e->mt->m * e->mt->seg_len : 0;
}

int snap_ec_encode_run(struct snap_ec_encode *e, const struct iovec *iov, int iovcnt,
		       void *parity, uint64_t parity_len)
{
	if (!e)
		return SNAP_EINVAL;
	struct snap_ec_meta *mt = e->mt;
	struct ec_iov v = { 0 };
	uint32_t *tab = NULL;
	size_t ncrc = (size_t)mt->n * (size_t)(mt->k + mt->m) * mt->nchunks;
	uint64_t plen = (uint64_t)mt->m * mt->seg_len;
	int rc = 0;
	e->err[0] = 0;
	if (e->done)
		rc = ec_errf(e->err, sizeof(e->err), SNAP_ESTATE, "ec: encode_run called twice");
	else if (ec_iov_init(&v, iov, iovcnt))
		rc = ec_errf(e->err, sizeof(e->err), SNAP_EINVAL, "ec: bad iovec list");
	else if (v.total != mt->len[mt->index])
		rc = ec_errf(e->err, sizeof(e->err), SNAP_EINVAL,
			     "ec: iovecs hold %llu bytes, encode_begin was told %llu",
			     (unsigned long long)v.total, (unsigned long long)mt->len[mt->index]);
	else if (parity_len < plen || (plen && !parity))
		rc = ec_errf(e->err, sizeof(e->err), SNAP_EINVAL,
			     "ec: parity buffer of %llu bytes, need %llu",
			     (unsigned long long)parity_len, (unsigned long long)plen);
	else if (!(tab = calloc(ncrc ? ncrc : 1, sizeof(uint32_t))))
		rc = ec_errf(e->err, sizeof(e->err), SNAP_ENOMEM, "ec: out of memory");
	rc = ec_group_status(e->comm, rc, e->err, sizeof(e->err), "encode arguments");
	if (rc)
		goto out;
	struct ec_xchg x = {
		.mode = EC_MODE_ENCODE, .comm = e->comm, .me = mt->index, .mt = mt,
		.code = &e->code, .data = &v, .parity = parity, .crc_tab = tab,
		.window = e->window, .err = e->err, .errlen = sizeof(e->err),
	};
	rc = ec_xchg_run(&x);
	rc = ec_group_status(e->comm, rc, e->err, sizeof(e->err), "encode exchange");
	if (rc)
		goto out;
	/* Each CRC was computed by exactly one member (a data piece's by the
	 * unit's decoder, a parity row's by its owner): XOR assembles them. */
	if (MPI_Allreduce(tab, mt->crc, (int)ncrc, MPI_UINT32_T, MPI_BXOR, e->comm) != MPI_SUCCESS) {
		rc = ec_errf(e->err, sizeof(e->err), SNAP_EIO, "ec: MPI_Allreduce of CRCs failed");
		goto out;
	}
	e->done = 1;
out:
	free(tab);
	ec_iov_fini(&v);
	return rc;
}

const struct snap_ec_meta *snap_ec_encode_meta(const struct snap_ec_encode *e)
{
	return e && e->done ? e->mt : NULL;
}

const char *snap_ec_encode_error(const struct snap_ec_encode *e)
{
	return e ? e->err : "ec: NULL encode handle";
}

void snap_ec_encode_free(struct snap_ec_encode *e)
{
	if (!e)
		return;
	if (e->comm != MPI_COMM_NULL)
		MPI_Comm_free(&e->comm);
	ec_code_fini(&e->code);
	snap_ec_meta_free(e->mt);
	free(e);
}
