/*
 * exchange.c - the pipelined MPI engine shared by encode and rebuild.
 *
 * Work is cut into units (chunk q, stripe s), u = q * n + s. In a unit the
 * owners of "erased" slots (encode: the m parity rows; rebuild: lost or
 * corrupt pieces) each receive the k surviving source pieces and run one
 * ISA-L row encode. Sources are sent straight from the caller's buffers;
 * only pieces that straddle two iovecs are staged. Pieces that are wholly
 * zero padding are never sent: the receiver substitutes a zero chunk.
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

struct unit_slot {
	int active;
	uint32_t q;
	int s;
	int out;          /* my slot to compute, -1 if none */
	int nrecv, nsend;
	MPI_Request *rreq; /* [k] */
	MPI_Request *sreq; /* [m] */
	int *surv;         /* [k] survivor slots */
	uint64_t *rlen;    /* [k] bytes expected from each survivor */
	uint8_t *rbuf;     /* k * chunk, allocated on first use */
	uint8_t *tmp;      /* chunk: staging for a send or a decoded data piece */
};

struct tbl_cache {
	int valid, out;
	int *surv;
	uint8_t *tbls; /* 32 * k */
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
	return slot < e->k ? (s + e->m + slot) % e->n : (s + slot - e->k) % e->n;
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

static int fail(struct engine *e, int code, const char *what)
{
	if (!e->rc) {
		e->rc = code;
		ec_errf(e->x->err, e->x->errlen, code, "ec: %s", what);
	}
	return code;
}

static uint8_t *alloc_rbuf(struct engine *e, struct unit_slot *u)
{
	if (!u->rbuf)
		u->rbuf = malloc((size_t)e->k * e->mt->chunk_size);
	return u->rbuf;
}

/* Post the receives and sends of unit (s, q) into slot u. */
static void post(struct engine *e, struct unit_slot *u, int s, uint32_t q)
{
	const struct snap_ec_meta *mt = e->mt;
	struct ec_xchg *x = e->x;
	int k = e->k, mine = my_slot(e, s), ns = 0, nerased = 0;
	int erased[SNAP_EC_MAX_GROUP];
	uint64_t clen = ec_chunk_len(mt, q);
	u->active = 1;
	u->q = q;
	u->s = s;
	u->out = -1;
	u->nrecv = u->nsend = 0;
	for (int slot = 0; slot < e->n; slot++) {
		if (is_erased(e, s, q, slot)) {
			if (slot >= k || piece_len(e, s, q, slot))
				erased[nerased++] = slot;
		} else if (ns < k) {
			u->surv[ns++] = slot;
		}
	}
	if (mine < k && x->mode == EC_MODE_ENCODE && x->my_crc) {
		/* CRC of my data piece while it is being touched anyway */
		uint64_t v = piece_len(e, s, q, mine);
		uint64_t off = (uint64_t)mine * mt->seg_len + (uint64_t)q * mt->chunk_size;
		uint32_t c = (v == 0 && clen == mt->chunk_size) ? e->zero_crc
			     : ec_crc_padded(ec_iov_crc(x->data, off, v, 0), NULL, 0, clen - v);
		x->my_crc[(size_t)mine * mt->nchunks + q] = c;
	}
	if (nerased == 0)
		return;
	if (ns < k) {
		fail(e, SNAP_ELOST, "unit has fewer than k survivors (plan not validated)");
		return;
	}
	int out = -1;
	for (int i = 0; i < nerased; i++)
		if (erased[i] == mine)
			out = mine;
	if (out >= 0) {
		u->out = out;
		if (!alloc_rbuf(e, u)) {
			fail(e, SNAP_ENOMEM, "out of memory for receive buffers");
			return;
		}
		for (int i = 0; i < k; i++) {
			u->rlen[i] = piece_len(e, s, q, u->surv[i]);
			if (!u->rlen[i])
				continue;
			if (MPI_Irecv(u->rbuf + (size_t)i * mt->chunk_size, (int)u->rlen[i], MPI_BYTE,
				      slot_node(e, s, u->surv[i]), s, x->comm,
				      &u->rreq[u->nrecv++]) != MPI_SUCCESS)
				fail(e, SNAP_EIO, "MPI_Irecv failed");
		}
		return;
	}
	int surv_me = 0;
	for (int i = 0; i < k; i++)
		surv_me |= u->surv[i] == mine;
	uint64_t len = piece_len(e, s, q, mine);
	if (!surv_me || !len)
		return;
	const uint8_t *src;
	if (mine >= k) {
		src = x->parity + (uint64_t)(mine - k) * mt->seg_len + (uint64_t)q * mt->chunk_size;
	} else {
		uint64_t off = (uint64_t)mine * mt->seg_len + (uint64_t)q * mt->chunk_size;
		src = ec_iov_contig(x->data, off, len);
		if (!src) {
			ec_iov_read(x->data, off, u->tmp, len);
			src = u->tmp;
		}
	}
	for (int i = 0; i < nerased; i++)
		if (MPI_Isend(src, (int)len, MPI_BYTE, slot_node(e, s, erased[i]), s, x->comm,
			      &u->sreq[u->nsend++]) != MPI_SUCCESS)
			fail(e, SNAP_EIO, "MPI_Isend failed");
}

static const uint8_t *row_tables(struct engine *e, int s, const int *surv, int out)
{
	struct ec_xchg *x = e->x;
	int k = e->k;
	if (x->mode == EC_MODE_ENCODE)
		return x->code->enc_tbls + (size_t)32 * (size_t)k * (size_t)(out - k);
	struct tbl_cache *c = &e->cache[s];
	if (c->valid && c->out == out && memcmp(c->surv, surv, sizeof(int) * (size_t)k) == 0)
		return c->tbls;
	uint8_t coef[SNAP_EC_MAX_GROUP];
	if (ec_code_row(x->code, surv, out, coef))
		return NULL;
	ec_init_tables(k, 1, coef, c->tbls);
	memcpy(c->surv, surv, sizeof(int) * (size_t)k);
	c->out = out;
	c->valid = 1;
	return c->tbls;
}

/* Wait for slot u's traffic and compute its output piece, if any. */
static void complete(struct engine *e, struct unit_slot *u)
{
	const struct snap_ec_meta *mt = e->mt;
	struct ec_xchg *x = e->x;
	int k = e->k;
	if (!u->active)
		return;
	u->active = 0;
	if (u->nrecv && MPI_Waitall(u->nrecv, u->rreq, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
		fail(e, SNAP_EIO, "MPI receive failed");
	if (u->out >= 0 && !e->rc) {
		uint64_t clen = ec_chunk_len(mt, u->q);
		const uint8_t *src[SNAP_EC_MAX_GROUP];
		for (int i = 0; i < k; i++) {
			uint8_t *b = u->rbuf + (size_t)i * mt->chunk_size;
			if (u->rlen[i] == 0) {
				src[i] = e->zero;
				continue;
			}
			if (u->rlen[i] < clen)
				memset(b + u->rlen[i], 0, clen - u->rlen[i]);
			src[i] = b;
		}
		const uint8_t *tb = row_tables(e, u->s, u->surv, u->out);
		int out = u->out;
		uint8_t *dst = out >= k ? x->parity + (uint64_t)(out - k) * mt->seg_len +
						 (uint64_t)u->q * mt->chunk_size
				       : u->tmp;
		if (!tb) {
			fail(e, SNAP_ENOMEM, "out of memory for decode tables");
		} else {
			ec_encode_data((int)clen, k, 1, (unsigned char *)tb, (unsigned char **)src, &dst);
			uint32_t c = snap_ec_crc32c(0, dst, clen);
			if (x->mode == EC_MODE_ENCODE) {
				x->my_crc[(size_t)out * mt->nchunks + u->q] = c;
			} else if (c != *ec_meta_crc(mt, x->me, out, u->q)) {
				char what[160];
				snprintf(what, sizeof(what),
					 "rebuilt %s %d chunk %u of group index %d fails its CRC32C",
					 out < k ? "data segment" : "parity row", out < k ? out : out - k,
					 u->q, x->me);
				fail(e, SNAP_ECORRUPT, what);
			}
			if (out < k)
				ec_iov_write(x->data,
					     (uint64_t)out * mt->seg_len + (uint64_t)u->q * mt->chunk_size,
					     dst, ec_valid(mt, x->me, out, u->q));
			x->chunks_written++;
			x->bytes_written += out < k ? ec_valid(mt, x->me, out, u->q) : clen;
		}
	}
	if (u->nsend && MPI_Waitall(u->nsend, u->sreq, MPI_STATUSES_IGNORE) != MPI_SUCCESS)
		fail(e, SNAP_EIO, "MPI send failed");
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
	e.zero = calloc(1, mt->chunk_size);
	e.slots = calloc(w, sizeof(*e.slots));
	e.cache = calloc((size_t)e.n, sizeof(*e.cache));
	if (!e.zero || !e.slots || !e.cache) {
		fail(&e, SNAP_ENOMEM, "out of memory for the exchange");
		goto out;
	}
	e.zero_crc = snap_ec_crc32c(0, e.zero, mt->chunk_size);
	for (uint32_t i = 0; i < w; i++) {
		struct unit_slot *u = &e.slots[i];
		u->rreq = calloc((size_t)e.k, sizeof(MPI_Request));
		u->sreq = calloc((size_t)e.m, sizeof(MPI_Request));
		u->surv = calloc((size_t)e.k, sizeof(int));
		u->rlen = calloc((size_t)e.k, sizeof(uint64_t));
		u->tmp = malloc(mt->chunk_size);
		if (!u->rreq || !u->sreq || !u->surv || !u->rlen || !u->tmp) {
			fail(&e, SNAP_ENOMEM, "out of memory for the exchange");
			goto out;
		}
	}
	for (int s = 0; s < e.n; s++) {
		e.cache[s].surv = calloc((size_t)e.k, sizeof(int));
		e.cache[s].tbls = malloc((size_t)32 * (size_t)e.k);
		if (!e.cache[s].surv || !e.cache[s].tbls) {
			fail(&e, SNAP_ENOMEM, "out of memory for the exchange");
			goto out;
		}
	}
	/* A local failure does not stop the loop: peers still expect our
	 * sends and receives for every unit, or they would hang. */
	for (uint64_t un = 0; un < units; un++) {
		struct unit_slot *u = &e.slots[un % w];
		if (un >= w)
			complete(&e, u);
		post(&e, u, (int)(un % (uint64_t)e.n), (uint32_t)(un / (uint64_t)e.n));
	}
	for (uint64_t un = units > w ? units - w : 0; un < units; un++)
		complete(&e, &e.slots[un % w]);
out:
	if (e.slots)
		for (uint32_t i = 0; i < w; i++) {
			free(e.slots[i].rreq);
			free(e.slots[i].sreq);
			free(e.slots[i].surv);
			free(e.slots[i].rlen);
			free(e.slots[i].rbuf);
			free(e.slots[i].tmp);
		}
	if (e.cache)
		for (int s = 0; s < e.n; s++) {
			free(e.cache[s].surv);
			free(e.cache[s].tbls);
		}
	free(e.slots);
	free(e.cache);
	free(e.zero);
	return e.rc;
}
