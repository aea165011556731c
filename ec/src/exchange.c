/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * exchange.c - the pipelined MPI engine shared by encode and rebuild.
 *
 * Work is cut into units (chunk q, stripe s), u = q * n + s. A unit has
 * "erased" slots (encode: the m parity rows; rebuild: lost or corrupt
 * pieces). One member, the decoder, receives the k surviving source pieces,
 * computes all erased rows with one multi-row ISA-L call and forwards each
 * row to its owner: k + m - 1 transfers per unit instead of k * m when every
 * owner gathers the sources itself, and each source is read once.
 * Sources are sent straight from the caller's buffers and rows land straight
 * in them; only pieces that straddle two iovecs are staged. Pieces that are
 * wholly zero padding are never sent: the decoder substitutes a zero chunk.
 *
 * Deadlock freedom: every node posts units in the same order and waits on
 * unit u only after posting up to u + window - 1, so the lowest unit anyone
 * waits on has been posted by everyone.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <isa-l/erasure_code.h>

#include "ec_internal.h"

/* Tags name the unit (mod EC_TAGS > max window), so a row forwarded late
 * never matches a piece of a later unit between the same two nodes. */
#define EC_TAGS 16384

struct unit_slot {
	int active;
	uint32_t q;
	int s;
	int ne;            /* erased slots in this unit */
	int is_dec;        /* I compute every erased row of this unit */
	int my_er;         /* my erased slot's position in er[], -1 if none */
	int nrecv, nsend;
	MPI_Request *rreq; /* [k] */
	MPI_Request *sreq; /* [m] */
	int *surv;         /* [k] survivor slots */
	int *er;           /* [m] erased slots */
	uint64_t *rlen;    /* [k] bytes expected from each survivor */
	const uint8_t *own_src; /* decoder's own source piece */
	uint8_t *row_dst;  /* where my received row landed */
	uint8_t *rbuf;     /* k * chunk: decoder's receive buffers */
	uint8_t *obuf;     /* m * chunk: decoder's row buffers */
	uint8_t *tmp;      /* chunk: staging / landing for a data piece that
			    * straddles iovecs */
};

struct tbl_cache {
	int valid, ne;
	int *key;      /* [k + m]: survivors then erased slots */
	uint8_t *tbls; /* 32 * k * m */
};

struct engine {
	struct ec_xchg *x;
	const struct snap_ec_meta *mt;
	int n, k, m;
	uint8_t *zero;
	uint32_t zero_crc; /* CRC of a full zero chunk */
	struct unit_slot *slots;
	struct tbl_cache *cache; /* per stripe */
	int rc;                  /* first local failure */
};

static int slot_node(const struct engine *e, int s, int slot)
{
	return ec_slot_node(e->n, e->k, e->m, s, slot);
}

static int my_slot(const struct engine *e, int s)
{
	int me = e->x->me, n = e->n;
	int t = ((me - s - e->m) % n + n) % n;
	if (t < e->k)
		return t;
	return e->k + ((me - s) % n + n) % n;
}

static int is_erased(const struct engine *e, int s, uint32_t q, int slot)
{
	if (e->x->mode == EC_MODE_ENCODE)
		return slot >= e->k;
	int node = slot_node(e, s, slot);
	return e->x->erased[((size_t)node * (size_t)e->n + (size_t)slot) * e->mt->nchunks + q] != 0;
}

static uint64_t piece_len(const struct engine *e, int s, uint32_t q, int slot)
{
	if (slot >= e->k)
		return ec_chunk_len(e->mt, q);
	return ec_valid(e->mt, slot_node(e, s, slot), slot, q);
}

static uint64_t piece_off(const struct snap_ec_meta *mt, int slot, uint32_t q)
{
	int k = mt->k;
	return (uint64_t)(slot < k ? slot : slot - k) * mt->seg_len + (uint64_t)q * mt->chunk_size;
}

static int fail(struct engine *e, int code, const char *what)
{
	if (!e->rc) {
		e->rc = code;
		ec_errf(e->x->err, e->x->errlen, code, "ec: %s", what);
	}
	return code;
}

/* Post the receives and sends of unit (s, q). One member, the decoder,
 * gathers the k sources and computes every erased row at once (ISA-L's
 * multi-row kernel reads each source once); it forwards each row to its
 * owner. Encode: the decoder is parity row 0's holder, rotating with s.
 * Rebuild: a survivor rotating with (s, q), so a replacement's link only
 * carries its own bytes. */
static void post(struct engine *e, struct unit_slot *u, int s, uint32_t q, int tag)
{
	const struct snap_ec_meta *mt = e->mt;
	struct ec_xchg *x = e->x;
	int k = e->k, mine = my_slot(e, s), ns = 0;
	u->active = 1;
	u->q = q;
	u->s = s;
	u->ne = 0;
	u->is_dec = 0;
	u->my_er = -1;
	u->nrecv = u->nsend = 0;
	u->own_src = NULL;
	u->row_dst = NULL;
	for (int slot = 0; slot < e->n; slot++) {
		if (is_erased(e, s, q, slot)) {
			if (slot >= k || piece_len(e, s, q, slot)) {
				if (slot == mine)
					u->my_er = u->ne;
				if (u->ne < e->m)
					u->er[u->ne] = slot;
				u->ne++;
			}
		} else if (ns < k) {
			u->surv[ns++] = slot;
		}
	}
	if (u->ne == 0)
		return;
	if (ns < k || u->ne > e->m) {
		u->ne = 0;
		fail(e, SNAP_ELOST, "unit has more than m erasures (plan not validated)");
		return;
	}
	int dec = x->mode == EC_MODE_ENCODE ? slot_node(e, s, u->er[0])
					    : slot_node(e, s, u->surv[(s + (int)q) % k]);
	int surv_me = -1;
	for (int i = 0; i < k; i++)
		if (u->surv[i] == mine)
			surv_me = i;
	uint64_t mylen = piece_len(e, s, q, mine);
	const uint8_t *src = NULL;
	if (surv_me >= 0 && mylen && x->me == dec && x->io && x->io->read) {
		/* my own source, decoded here: read into the staging buffer */
		uint64_t off = piece_off(mt, mine, q);
		int rc = mine >= k ? x->io->read(x->io->arg, -1, off, u->tmp, mylen)
				   : ec_io_read(x->data, off, u->tmp, mylen, x->io);
		if (rc)
			fail(e, rc < 0 ? rc : SNAP_EIO, "reading a source piece through the rebuild's io failed");
		src = u->tmp;
	} else if (surv_me >= 0 && mylen) {
		if (mine >= k) {
			src = x->parity + piece_off(mt, mine, q);
		} else if (!(src = ec_iov_contig(x->data, piece_off(mt, mine, q), mylen))) {
			ec_iov_read(x->data, piece_off(mt, mine, q), u->tmp, mylen);
			src = u->tmp;
		}
	}
	if (x->me == dec) {
		u->is_dec = 1;
		u->own_src = src;
		for (int i = 0; i < k; i++) {
			u->rlen[i] = piece_len(e, s, q, u->surv[i]);
			if (!u->rlen[i] || i == surv_me)
				continue;
			if (MPI_Irecv(u->rbuf + (size_t)i * mt->chunk_size, (int)u->rlen[i], MPI_BYTE,
				      slot_node(e, s, u->surv[i]), tag, x->comm,
				      &u->rreq[u->nrecv++]) != MPI_SUCCESS)
				fail(e, SNAP_EIO, "MPI_Irecv failed");
		}
		return;
	}
	if (surv_me >= 0 && mylen &&
	    MPI_Isend(src, (int)mylen, MPI_BYTE, dec, tag, x->comm, &u->sreq[u->nsend++]) != MPI_SUCCESS)
		fail(e, SNAP_EIO, "MPI_Isend failed");
	if (u->my_er >= 0) {
		uint64_t len = piece_len(e, s, q, mine);
		uint8_t *dst = x->io && x->io->write ? NULL /* staged, then written through io */
			       : mine >= k ? x->parity + piece_off(mt, mine, q)
					   : ec_iov_contig(x->data, piece_off(mt, mine, q), len);
		if (!dst)
			dst = u->tmp;
		u->row_dst = dst;
		if (MPI_Irecv(dst, (int)len, MPI_BYTE, dec, tag, x->comm,
				     &u->rreq[u->nrecv++]) != MPI_SUCCESS)
			fail(e, SNAP_EIO, "MPI_Irecv failed");
	}
}

/* Decode tables of unit u; NULL with *rc set (SNAP_ENOMEM, or
 * SNAP_ECORRUPT when the survivor matrix does not invert). */
static const uint8_t *row_tables(struct engine *e, const struct unit_slot *u, int *rc)
{
	struct ec_xchg *x = e->x;
	int k = e->k, ne = u->ne;
	if (x->mode == EC_MODE_ENCODE)
		return x->code->enc_tbls;
	struct tbl_cache *c = &e->cache[u->s];
	if (c->valid && c->ne == ne && memcmp(c->key, u->surv, sizeof(int) * (size_t)k) == 0 &&
	    memcmp(c->key + k, u->er, sizeof(int) * (size_t)ne) == 0)
		return c->tbls;
	uint8_t coef[SNAP_EC_MAX_GROUP * SNAP_EC_MAX_GROUP];
	for (int i = 0; i < ne; i++)
		if ((*rc = ec_code_row(x->code, u->surv, u->er[i], coef + (size_t)i * (size_t)k)))
			return NULL;
	ec_init_tables(k, ne, coef, c->tbls);
	memcpy(c->key, u->surv, sizeof(int) * (size_t)k);
	memcpy(c->key + k, u->er, sizeof(int) * (size_t)ne);
	c->ne = ne;
	c->valid = 1;
	return c->tbls;
}

/* Encode: where the CRC of (node, slot, chunk q) goes in the table the
 * group reduces into the record. */
static uint32_t *ec_tab_crc(const struct engine *e, int node, int slot, uint32_t q)
{
	return &e->x->crc_tab[((size_t)node * (size_t)(e->k + e->m) + (size_t)slot) * e->mt->nchunks + q];
}

/* A finished row of mine: check or record its CRC, and land it (through
 * io->write when set, once its CRC is right). */
static void own_row(struct engine *e, struct unit_slot *u, int slot, const uint8_t *buf)
{
	const struct snap_ec_meta *mt = e->mt;
	struct ec_xchg *x = e->x;
	uint64_t clen = ec_chunk_len(mt, u->q), off = piece_off(mt, slot, u->q);
	uint64_t len = slot < e->k ? ec_valid(mt, x->me, slot, u->q) : clen;
	uint32_t c = ec_crc_padded(0, buf, len, clen - len);
	char what[160];
	snprintf(what, sizeof(what), "%s %d chunk %u of group index %d", slot < e->k ? "data segment" : "parity row",
		 slot < e->k ? slot : slot - e->k, u->q, x->me);
	if (x->mode == EC_MODE_ENCODE) {
		*ec_tab_crc(e, x->me, slot, u->q) = c;
	} else if (c != *ec_meta_crc(mt, x->me, slot, u->q)) {
		char msg[200];
		snprintf(msg, sizeof(msg), "rebuilt %s fails its CRC32C", what);
		fail(e, SNAP_ECORRUPT, msg);
		return;
	}
	if (x->io && x->io->write) {
		int rc = slot >= e->k ? x->io->write(x->io->arg, -1, off, buf, len)
				      : ec_io_write(x->data, off, buf, len, x->io);
		if (rc) {
			char msg[240];
			snprintf(msg, sizeof(msg), "writing rebuilt %s failed: %s (%d)", what, snap_strerror(rc), rc);
			fail(e, rc < 0 ? rc : SNAP_EIO, msg);
			return;
		}
	} else if (slot >= e->k) {
		if (buf != x->parity + off)
			memcpy(x->parity + off, buf, len);
	} else if (buf != ec_iov_contig(x->data, off, len)) {
		ec_iov_write(x->data, off, buf, len);
	}
	x->chunks_written++;
	x->bytes_written += len;
}

/* Wait for slot u's sources, compute and forward (decoder), or land the
 * row I own (owner). */
static void complete(struct engine *e, struct unit_slot *u, int tag)
{
	const struct snap_ec_meta *mt = e->mt;
	struct ec_xchg *x = e->x;
	int k = e->k;
	if (!u->active)
		return;
	u->active = 0;
	if (u->nrecv && MPI_Waitall(u->nrecv, u->rreq, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
		fail(e, SNAP_EIO, "MPI receive failed");
	uint64_t clen = ec_chunk_len(mt, u->q);
	if (u->is_dec && u->ne) {
		/* sends of my own source went nowhere: I am the decoder */
		int trc = 0;
		const uint8_t *tb = e->rc ? NULL : row_tables(e, u, &trc);
		if (!tb && !e->rc)
			fail(e, trc, trc == SNAP_ENOMEM ? "out of memory for decode tables"
						       : "survivor matrix does not invert");
		const uint8_t *src[SNAP_EC_MAX_GROUP];
		uint8_t *dst[SNAP_EC_MAX_GROUP];
		for (int j = 0; j < u->ne; j++) /* my own parity row: in place (no io->write) */
			dst[j] = (!(x->io && x->io->write) && u->er[j] >= k && slot_node(e, u->s, u->er[j]) == x->me)
					 ? x->parity + piece_off(mt, u->er[j], u->q)
					 : u->obuf + (size_t)j * mt->chunk_size;
		if (!e->rc) {
			for (int i = 0; i < k; i++) {
				uint8_t *b = u->rbuf + (size_t)i * mt->chunk_size;
				if (u->rlen[i] == 0) {
					src[i] = e->zero;
				} else if (slot_node(e, u->s, u->surv[i]) == x->me) {
					if (u->rlen[i] < clen) { /* pad my own short piece */
						memcpy(b, u->own_src, u->rlen[i]);
						memset(b + u->rlen[i], 0, clen - u->rlen[i]);
						src[i] = b;
					} else {
						src[i] = u->own_src;
					}
				} else {
					if (u->rlen[i] < clen)
						memset(b + u->rlen[i], 0, clen - u->rlen[i]);
					src[i] = b;
				}
			}
			if (x->mode == EC_MODE_ENCODE)
				for (int i = 0; i < k; i++) /* while the sources are in cache */
					*ec_tab_crc(e, slot_node(e, u->s, u->surv[i]), u->surv[i], u->q) =
						src[i] == e->zero && clen == mt->chunk_size
							? e->zero_crc
							: snap_crc32c_update(0, src[i], clen);
			ec_encode_data((int)clen, k, u->ne, (unsigned char *)tb, (unsigned char **)src, dst);
		}
		for (int j = 0; j < u->ne; j++) {
			int slot = u->er[j], owner = slot_node(e, u->s, slot);
			uint64_t len = piece_len(e, u->s, u->q, slot);
			if (!e->rc)
				for (uint64_t b = len; b < clen; b++)
					if (dst[j][b]) { /* padding must decode to zeros */
						fail(e, SNAP_ECORRUPT, "rebuilt padding is not zero");
						break;
					}
			/* After a local failure the owners still wait for their
			 * rows: they get zeros (an erased piece either way), and
			 * the failure reaches them through the group status. */
			const uint8_t *row = e->rc ? e->zero : dst[j];
			if (owner == x->me) {
				if (!e->rc)
					own_row(e, u, slot, dst[j]);
			} else if (MPI_Isend(row, (int)len, MPI_BYTE, owner, tag, x->comm, &u->sreq[u->nsend++]) !=
				   MPI_SUCCESS) {
				fail(e, SNAP_EIO, "MPI_Isend failed");
			}
		}
	} else if (u->my_er >= 0 && u->row_dst && !e->rc) {
		own_row(e, u, u->er[u->my_er], u->row_dst);
	}
	if (u->nsend && MPI_Waitall(u->nsend, u->sreq, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
		fail(e, SNAP_EIO, "MPI send failed");
}

int ec_group_status(MPI_Comm comm, int rc, char *err, size_t errlen, const char *what)
{
	int all = rc;
	if (MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, comm) != MPI_SUCCESS)
		return ec_errf(err, errlen, SNAP_EIO, "ec: %s: MPI_Allreduce failed", what);
	if (all && !rc)
		ec_errf(err, errlen, all, "ec: %s " SNAP_EC_ERR_ELSEWHERE " (%d)", what, all);
	return all;
}

int ec_comm_dup(MPI_Comm comm, MPI_Comm *out, char *err, size_t errlen)
{
	if (MPI_Comm_dup(comm, out) != MPI_SUCCESS) {
		*out = MPI_COMM_NULL;
		return ec_errf(err, errlen, SNAP_EIO, "ec: MPI_Comm_dup failed");
	}
	MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
	return 0;
}

int ec_xchg_run(struct ec_xchg *x)
{
	struct engine e = { .x = x, .mt = x->mt, .n = x->mt->n, .k = x->mt->k, .m = x->mt->m };
	const struct snap_ec_meta *mt = x->mt;
	uint64_t units = (uint64_t)mt->nchunks * (uint64_t)e.n;
	uint32_t w = x->window ? x->window : (uint32_t)e.n;
	if (units == 0)
		return 0;
	if ((uint64_t)w > units)
		w = (uint32_t)units;
	/* Every buffer up front (window x (k + m + 1) chunks, the documented
	 * bound), then agree: a member short of memory fails the whole group
	 * here instead of leaving its peers waiting inside the pipeline. */
	size_t chunk = mt->chunk_size;
	e.zero = calloc(1, chunk);
	e.slots = calloc(w, sizeof(*e.slots));
	e.cache = calloc((size_t)e.n, sizeof(*e.cache));
	int ok = e.zero && e.slots && e.cache;
	for (uint32_t i = 0; ok && i < w; i++) {
		struct unit_slot *u = &e.slots[i];
		u->rreq = calloc((size_t)e.k, sizeof(MPI_Request));
		u->sreq = calloc((size_t)e.m, sizeof(MPI_Request));
		u->surv = calloc((size_t)e.k, sizeof(int));
		u->rlen = calloc((size_t)e.k, sizeof(uint64_t));
		u->er = calloc((size_t)e.m, sizeof(int));
		u->rbuf = malloc((size_t)e.k * chunk);
		u->obuf = malloc((size_t)e.m * chunk);
		u->tmp = malloc(chunk);
		ok = u->rreq && u->sreq && u->surv && u->rlen && u->er && u->rbuf && u->obuf && u->tmp;
	}
	for (int s = 0; ok && s < e.n; s++) {
		e.cache[s].key = calloc((size_t)e.n, sizeof(int));
		e.cache[s].tbls = malloc((size_t)32 * (size_t)e.k * (size_t)e.m);
		ok = e.cache[s].key && e.cache[s].tbls;
	}
	if (!ok)
		fail(&e, SNAP_ENOMEM, "out of memory for the exchange buffers");
	else
		e.zero_crc = snap_crc32c_update(0, e.zero, chunk);
	int grc = ec_group_status(x->comm, e.rc, x->err, x->errlen, "exchange setup");
	if (grc) {
		e.rc = grc;
		goto out;
	}
	/* A local failure does not stop the loop: peers still expect our
	 * sends and receives for every unit, or they would hang. */
	uint64_t end = units;
	for (uint64_t un = 0; un < units; un++) {
		struct unit_slot *u = &e.slots[un % w];
		int rrc = x->row_ready && un % (uint64_t)e.n == 0 ? x->row_ready(x->row_arg, (uint32_t)(un / (uint64_t)e.n))
								: 0;
		if (rrc) { /* the same verdict on every member: stop together */
			e.rc = rrc;
			end = un;
			break;
		}
		if (un >= w)
			complete(&e, u, (int)((un - w) % EC_TAGS));
		post(&e, u, (int)(un % (uint64_t)e.n), (uint32_t)(un / (uint64_t)e.n), (int)(un % EC_TAGS));
	}
	for (uint64_t un = end > w ? end - w : 0; un < end; un++)
		complete(&e, &e.slots[un % w], (int)(un % EC_TAGS));
out:
	if (e.slots)
		for (uint32_t i = 0; i < w; i++) {
			free(e.slots[i].rreq);
			free(e.slots[i].sreq);
			free(e.slots[i].surv);
			free(e.slots[i].rlen);
			free(e.slots[i].rbuf);
			free(e.slots[i].obuf);
			free(e.slots[i].er);
			free(e.slots[i].tmp);
		}
	if (e.cache)
		for (int s = 0; s < e.n; s++) {
			free(e.cache[s].key);
			free(e.cache[s].tbls);
		}
	free(e.slots);
	free(e.cache);
	free(e.zero);
	return e.rc;
}
