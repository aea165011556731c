/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * layout.c - group formation and rotated parity placement.
 *
 * Contiguous ranks keep a group's traffic inside one switch when the
 * launcher packs ranks by host order; rotation makes every member send k
 * segments and hold m parity segments, so no node is a hot spot.
 */
#include <stdio.h>
#include <string.h>

#include "ec_internal.h"

int ec_errf(char *buf, size_t len, int code, const char *fmt, ...)
{
	if (buf && len) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(buf, len, fmt, ap);
		va_end(ap);
	}
	return code;
}

static int check_shape(int nodes, int k, int m, char *err, size_t errlen)
{
	if (k < 1 || m < 1)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: need k >= 1 and m >= 1 (got k=%d m=%d)", k, m);
	if (k + m > SNAP_EC_MAX_GROUP)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: k+m=%d exceeds %d (GF(2^8) code)",
			       k + m, SNAP_EC_MAX_GROUP);
	if (nodes < 1)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: mesh of %d nodes", nodes);
	return 0;
}

int snap_ec_group_of(int nodes, int k, int m, unsigned flags, int rank,
		     struct snap_ec_group *g, char *err, size_t errlen)
{
	int rc = check_shape(nodes, k, m, err, errlen);
	if (rc)
		return rc;
	if (!g)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: group_of: NULL output");
	if (rank < 0 || rank >= nodes)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: rank %d outside a mesh of %d nodes",
			       rank, nodes);
	int size = k + m, full = nodes / size, tail = nodes % size;
	if (tail && (flags & SNAP_EC_TAIL_STRICT))
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec: %d nodes is not a multiple of the group size %d+%d (strict tail policy)",
			       nodes, k, m);
	if (tail && tail <= m && full == 0)
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec: %d nodes cannot form a group with m=%d parity (need at least %d)",
			       nodes, m, m + 1);
	if (tail && tail <= m && size + tail > SNAP_EC_MAX_GROUP)
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec: merging the %d-node tail makes a group of %d > %d",
			       tail, size + tail, SNAP_EC_MAX_GROUP);
	int ngroups = full + (tail > m ? 1 : 0);
	int id = rank / size;
	memset(g, 0, sizeof(*g));
	g->ngroups = ngroups;
	g->m = m;
	if (tail && tail <= m && id >= full - 1) {
		/* the small tail joins the last full group */
		id = full - 1;
		g->n = size + tail;
	} else if (id == full) {
		g->n = tail;
	} else {
		g->n = size;
	}
	g->id = id;
	g->first_rank = id * size;
	g->k = g->n - m;
	g->index = rank - g->first_rank;
	return 0;
}

static int mod(int a, int n)
{
	int r = a % n;
	return r < 0 ? r + n : r;
}

static int valid_g(const struct snap_ec_group *g)
{
	return g && g->n >= 2 && g->m >= 1 && g->k == g->n - g->m && g->k >= 1;
}

int snap_ec_data_stripe(const struct snap_ec_group *g, int index, int seg)
{
	if (!valid_g(g) || index < 0 || index >= g->n || seg < 0 || seg >= g->k)
		return SNAP_EINVAL;
	return mod(index - g->m - seg, g->n);
}

int snap_ec_parity_stripe(const struct snap_ec_group *g, int index, int row)
{
	if (!valid_g(g) || index < 0 || index >= g->n || row < 0 || row >= g->m)
		return SNAP_EINVAL;
	return mod(index - row, g->n);
}

int snap_ec_data_holder(const struct snap_ec_group *g, int stripe, int seg)
{
	if (!valid_g(g) || stripe < 0 || stripe >= g->n || seg < 0 || seg >= g->k)
		return SNAP_EINVAL;
	return mod(stripe + g->m + seg, g->n);
}

int snap_ec_parity_holder(const struct snap_ec_group *g, int stripe, int row)
{
	if (!valid_g(g) || stripe < 0 || stripe >= g->n || row < 0 || row >= g->m)
		return SNAP_EINVAL;
	return mod(stripe + row, g->n);
}

uint64_t snap_ec_seg_len(int k, uint64_t max_len)
{
	if (k < 1)
		return 0;
	return max_len / (uint64_t)k + (max_len % (uint64_t)k ? 1 : 0);
}

int snap_ec_describe(const struct snap_ec_group *g, char *buf, size_t len)
{
	if (!valid_g(g) || g->index < 0 || g->index >= g->n || (!buf && len))
		return SNAP_EINVAL;
	char tmp[64];
	size_t used = 0;
	int want = snprintf(buf, len, "group %d (ranks %d-%d, %d+%d, overhead %.2f): index %d data",
			    g->id, g->first_rank, g->first_rank + g->n - 1, g->k, g->m,
			    (double)g->m / g->k, g->index);
	if (want < 0)
		return SNAP_EINVAL;
	used = (size_t)want;
	for (int t = 0; t < g->k; t++) {
		int n = snprintf(tmp, sizeof(tmp), " seg%d->s%d", t, snap_ec_data_stripe(g, g->index, t));
		if (used + 1 < len)
			snprintf(buf + used, len - used, "%s", tmp);
		used += (size_t)n;
	}
	if (used + 1 < len)
		snprintf(buf + used, len - used, "%s", " parity");
	used += 7;
	for (int p = 0; p < g->m; p++) {
		int n = snprintf(tmp, sizeof(tmp), " s%d.p%d", snap_ec_parity_stripe(g, g->index, p), p);
		if (used + 1 < len)
			snprintf(buf + used, len - used, "%s", tmp);
		used += (size_t)n;
	}
	return (int)used;
}

int snap_ec_comm_split(MPI_Comm mesh, int k, int m, unsigned flags, struct snap_ec_group *g,
		       MPI_Comm *group_comm, char *err, size_t errlen)
{
	int size, rank;
	if (!g || !group_comm)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: comm_split: NULL output");
	if (MPI_Comm_size(mesh, &size) != MPI_SUCCESS || MPI_Comm_rank(mesh, &rank) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: comm_split: invalid mesh communicator");
	int rc = snap_ec_group_of(size, k, m, flags, rank, g, err, errlen);
	if (rc)
		return rc;
	if (MPI_Comm_split(mesh, g->id, g->index, group_comm) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Comm_split failed for group %d", g->id);
	return 0;
}

int ec_check_comm(MPI_Comm comm, const struct snap_ec_group *g, char *err, size_t errlen)
{
	int size, rank;
	if (!g || g->k < 1 || g->m < 1 || g->n != g->k + g->m || g->n > SNAP_EC_MAX_GROUP)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: invalid group description");
	if (comm == MPI_COMM_NULL || MPI_Comm_size(comm, &size) != MPI_SUCCESS ||
	    MPI_Comm_rank(comm, &rank) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EINVAL, "ec: invalid group communicator");
	if (size != g->n || rank != g->index)
		return ec_errf(err, errlen, SNAP_EINVAL,
			       "ec: communicator has size %d rank %d, group %d expects %d members, index %d",
			       size, rank, g->id, g->n, g->index);
	return 0;
}
