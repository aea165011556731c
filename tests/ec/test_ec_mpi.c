/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * test_ec_mpi.c - encode and rebuild across real MPI processes.
 *
 *   mpiexec -np N test_ec_mpi K M TRIALS SEED [CHUNK] [MAXLEN]
 *
 * Each randomized trial (all members of a group draw the same random
 * numbers): unequal and zero data lengths in scattered iovecs; encode; check
 * parity against the single-process encoder; lose up to M members (buffers
 * freed, meta dropped or corrupted) and flip bytes in survivors' data and
 * parity; predict from the layout rules whether every (stripe, chunk) keeps
 * at most M erasures; rebuild; demand bit-exact data and parity or the
 * predicted SNAP_ELOST. Then M+1 losses, then bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/ec.h"

static int failures, rank_world;
#define CHECK(c, ...)                                                                  \
	do {                                                                           \
		if (!(c)) {                                                            \
			failures++;                                                    \
			fprintf(stderr, "[rank %d] FAIL %s:%d: %s: ", rank_world, __FILE__, \
				__LINE__, #c);                                         \
			fprintf(stderr, __VA_ARGS__);                                  \
			fputc('\n', stderr);                                           \
		}                                                                      \
	} while (0)

static uint64_t rs;
static uint64_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return rs;
}

/* Member-local randomness (iovec cuts) must not disturb the shared stream. */
static uint64_t ls = 88172645463325252ull;
static uint64_t lrnd(void)
{
	ls ^= ls << 13;
	ls ^= ls >> 7;
	ls ^= ls << 17;
	return ls;
}

static void gen(uint64_t seed, int trial, int rank, uint8_t *buf, uint64_t len)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)trial << 32) ^ (uint64_t)rank * 0xBF58476D1CE4E5B9ull;
	for (uint64_t i = 0; i < len; i++) {
		x += 0x9E3779B97F4A7C15ull;
		uint64_t z = x;
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
		buf[i] = (uint8_t)(z >> 56);
	}
}

/* Cut buf into up to 4 iovecs at random points (empty ones included). */
static int split(uint8_t *buf, uint64_t len, struct iovec *iov)
{
	int cnt = 1 + (int)(lrnd() % 4);
	uint64_t cut[5] = { 0 };
	for (int i = 1; i < cnt; i++)
		cut[i] = len ? lrnd() % (len + 1) : 0;
	cut[cnt] = len;
	for (int i = 1; i < cnt; i++) /* insertion sort */
		for (int j = i; j > 1 && cut[j] < cut[j - 1]; j--) {
			uint64_t t = cut[j]; cut[j] = cut[j - 1]; cut[j - 1] = t;
		}
	for (int i = 0; i < cnt; i++) {
		iov[i].iov_base = buf + cut[i];
		iov[i].iov_len = cut[i + 1] - cut[i];
	}
	return cnt;
}

struct group_data {
	int n, k, m;
	uint64_t len[SNAP_EC_MAX_GROUP], seg;
	uint8_t *data[SNAP_EC_MAX_GROUP], *par[SNAP_EC_MAX_GROUP];
};

static void group_ref(struct group_data *gd, const struct snap_ec_group *g, uint64_t seed, int trial,
		      uint32_t chunk)
{
	uint64_t maxl = 0;
	for (int j = 0; j < gd->n; j++)
		maxl = gd->len[j] > maxl ? gd->len[j] : maxl;
	gd->seg = snap_ec_seg_len(gd->k, maxl);
	for (int j = 0; j < gd->n; j++) {
		gd->data[j] = malloc(gd->len[j] + 1);
		gen(seed, trial, g->first_rank + j, gd->data[j], gd->len[j]);
		gd->par[j] = malloc((size_t)gd->m * gd->seg + 1);
	}
	char err[256];
	int rc = snap_ec_encode_group_local(gd->k, gd->m, chunk, (const void *const *)gd->data, gd->len,
					    (void *const *)gd->par, err, sizeof(err));
	CHECK(rc == 0, "reference encode: %s", err);
}

static void group_free(struct group_data *gd)
{
	for (int j = 0; j < gd->n; j++) {
		free(gd->data[j]);
		free(gd->par[j]);
	}
}

static uint64_t valid(const struct group_data *gd, uint32_t chunk, int j, int t, uint32_t q)
{
	uint64_t off = (uint64_t)t * gd->seg + (uint64_t)q * chunk;
	uint64_t end = off + chunk, segend = ((uint64_t)t + 1) * gd->seg;
	if (end > segend)
		end = segend;
	if (gd->len[j] <= off)
		return 0;
	return (gd->len[j] < end ? gd->len[j] : end) - off;
}

/* erasure flags [node][slot][chunk] -> does some (stripe, chunk) exceed m? */
static int predict_lost(const struct group_data *gd, const uint8_t *er, uint32_t nch)
{
	int n = gd->n, k = gd->k, m = gd->m;
	for (uint32_t q = 0; q < nch; q++)
		for (int s = 0; s < n; s++) {
			int cnt = 0;
			for (int t = 0; t < k; t++)
				cnt += er[((size_t)((s + m + t) % n) * n + t) * nch + q];
			for (int p = 0; p < m; p++)
				cnt += er[((size_t)((s + p) % n) * n + k + p) * nch + q];
			if (cnt > m)
				return 1;
		}
	return 0;
}

struct stats { int trials, lost_nodes, flips, meta_bad, expect_lost, ios, io_fails; };

/* Rebuild io over shadow copies of the buffers: reads come from them and
 * rebuilt bytes land there, so the test sees that io got every rebuilt
 * byte and that run()'s own buffers were never written. fail_at > 0 fails
 * that write. */
struct test_io {
	struct iovec iov[4];
	uint8_t *par;
	uint64_t plen;
	int writes, reads, fail_at;
};

static uint8_t *io_at(struct test_io *t, int iov, uint64_t off, size_t len)
{
	if (iov >= 4 || (iov >= 0 && off + len > t->iov[iov].iov_len) || (iov < 0 && off + len > t->plen))
		return NULL;
	return (iov < 0 ? t->par : (uint8_t *)t->iov[iov].iov_base) + off;
}

static int io_write(void *arg, int iov, uint64_t off, const void *buf, size_t len)
{
	struct test_io *t = arg;
	uint8_t *p = io_at(t, iov, off, len);
	if (++t->writes == t->fail_at)
		return SNAP_EIO;
	if (!p)
		return SNAP_EINVAL;
	memcpy(p, buf, len);
	return 0;
}

static int io_read(void *arg, int iov, uint64_t off, void *buf, size_t len)
{
	struct test_io *t = arg;
	uint8_t *p = io_at(t, iov, off, len);
	t->reads++;
	if (!p)
		return SNAP_EINVAL;
	memcpy(buf, p, len);
	return 0;
}

static void trial(MPI_Comm gc, const struct snap_ec_group *g, uint64_t seed, int tr, uint32_t chunk,
		  uint64_t maxlen, struct stats *st)
{
	int n = g->n, k = g->k, m = g->m, me = g->index;
	char err[512];
	rs = seed * 1000003u + (uint64_t)tr * 7919u + (uint64_t)g->id * 104729u + 1;
	for (int i = 0; i < 8; i++)
		rnd();
	struct group_data gd = { .n = n, .k = k, .m = m };
	uint64_t base = 1 + rnd() % maxlen;
	for (int j = 0; j < n; j++) {
		uint64_t r = rnd();
		if (tr % 10 == 3)
			gd.len[j] = base;                /* equal lengths */
		else if (tr % 13 == 7)
			gd.len[j] = 0;                   /* the whole group empty */
		else
			gd.len[j] = (r % 5 == 0) ? 0 : r % (maxlen + 1);
	}
	group_ref(&gd, g, seed, tr, chunk);
	uint64_t mylen = gd.len[me];
	uint8_t *data = malloc(mylen + 1);
	memcpy(data, gd.data[me], mylen);
	struct iovec iov[4];
	int iovcnt = split(data, mylen, iov);
	char app[64];
	int applen = snprintf(app, sizeof(app), "node %d trial %d", g->first_rank + me, tr);

	struct snap_ec_opts o = { .chunk_size = chunk, .window = (uint32_t)(1 + rnd() % (2 * (uint64_t)n)) };
	struct snap_ec_encode *e = NULL;
	int rc = snap_ec_encode_begin(gc, g, 100 + (uint64_t)tr, mylen, app, (size_t)applen, &o, &e,
				      err, sizeof(err));
	CHECK(rc == 0, "encode_begin: %s", err);
	if (rc) {
		group_free(&gd);
		free(data);
		return;
	}
	uint64_t plen = snap_ec_encode_parity_len(e);
	CHECK(plen == (uint64_t)m * gd.seg, "parity len %llu", (unsigned long long)plen);
	uint8_t *par = malloc(plen + 1);
	memset(par, 0xCC, plen + 1);
	rc = snap_ec_encode_run(e, iov, iovcnt, par, plen);
	CHECK(rc == 0, "encode_run: %s", snap_ec_encode_error(e));
	CHECK(memcmp(par, gd.par[me], plen) == 0, "trial %d: mesh parity differs from the reference", tr);
	CHECK(memcmp(data, gd.data[me], mylen) == 0, "encode modified the data");
	size_t blen = 0;
	snap_ec_meta_pack(snap_ec_encode_meta(e), NULL, 0, &blen);
	uint8_t *blob = malloc(blen);
	CHECK(snap_ec_meta_pack(snap_ec_encode_meta(e), blob, blen, &blen) == 0, "pack");
	snap_ec_encode_free(e);
	struct snap_ec_meta *mt = NULL;
	rc = snap_ec_meta_unpack(blob, blen, &mt, err, sizeof(err));
	CHECK(rc == 0, "unpack: %s", err);
	uint32_t nbad = 99;
	CHECK(snap_ec_verify(mt, iov, iovcnt, par, plen, &nbad, err, sizeof(err)) == 0 && nbad == 0,
	      "fresh verify: %s", err);
	struct snap_ec_meta_info info;
	snap_ec_meta_info(mt, &info);
	uint32_t nch = info.nchunks;

	/* Scenario, identical on every member. */
	size_t nflags = (size_t)n * n * nch + 1;
	uint8_t *er = calloc(nflags, 1), lost[SNAP_EC_MAX_GROUP] = { 0 };
	int nlost = (int)(rnd() % (uint64_t)(m + 1));
	if (tr % 4 != 0 && nlost == 0)
		nlost = 1;
	for (int c = 0; c < nlost;) {
		int j = (int)(rnd() % (uint64_t)n);
		if (!lost[j]) {
			lost[j] = 1;
			c++;
		}
	}
	int meta_bad = -1;
	if (nlost < m && rnd() % 4 == 0) {
		meta_bad = (int)(rnd() % (uint64_t)n);
		if (lost[meta_bad])
			meta_bad = -1;
	}
	int nflip = rnd() % 3 == 0 ? 1 + (int)(rnd() % 4) : 0;
	struct { int node, par; uint64_t off; uint8_t x; } flip[4];
	int nf = 0;
	for (int i = 0; i < nflip; i++) {
		int j = (int)(rnd() % (uint64_t)n), isp = (int)(rnd() % 2);
		uint64_t lim = isp ? (uint64_t)m * gd.seg : gd.len[j];
		uint64_t off = rnd();
		uint8_t x = (uint8_t)(1 + rnd() % 255);
		if (lost[j] || j == meta_bad || lim == 0)
			continue;
		flip[nf].node = j;
		flip[nf].par = isp;
		flip[nf].off = off % lim;
		flip[nf].x = x;
		nf++;
	}
	for (int j = 0; j < n; j++) {
		if (!lost[j] && j != meta_bad)
			continue;
		for (int t = 0; t < k; t++)
			for (uint32_t q = 0; q < nch; q++)
				er[((size_t)j * n + t) * nch + q] = valid(&gd, chunk, j, t, q) > 0;
		for (int p = 0; p < m; p++)
			for (uint32_t q = 0; q < nch; q++)
				er[((size_t)j * n + k + p) * nch + q] = 1;
	}
	uint64_t my_bad_chunks = 0;
	for (int i = 0; i < nf; i++) {
		int slot = (int)(flip[i].off / gd.seg) + (flip[i].par ? k : 0);
		uint32_t q = (uint32_t)((flip[i].off % gd.seg) / chunk);
		uint8_t *f = &er[((size_t)flip[i].node * n + slot) * nch + q];
		if (flip[i].node == me && !*f)
			my_bad_chunks++;
		*f = 1;
		if (flip[i].node == me)
			(flip[i].par ? par : data)[flip[i].off] ^= flip[i].x;
	}
	int expect_lost = predict_lost(&gd, er, nch);
	st->trials++;
	st->lost_nodes += nlost + (meta_bad >= 0);
	st->flips += nf;
	st->meta_bad += meta_bad >= 0;
	st->expect_lost += expect_lost;

	if (nf && !lost[me] && me != meta_bad && my_bad_chunks)
		CHECK(snap_ec_verify(mt, iov, iovcnt, par, plen, &nbad, err, sizeof(err)) == SNAP_ECORRUPT &&
		      nbad == my_bad_chunks, "verify after flips: %u bad, expected %llu", nbad,
		      (unsigned long long)my_bad_chunks);
	if (me == meta_bad) {
		blob[blen / 2] ^= 0x10;
		struct snap_ec_meta *bad = NULL;
		CHECK(snap_ec_meta_unpack(blob, blen, &bad, err, sizeof(err)) == SNAP_ECORRUPT, "meta flip");
	}
	if (lost[me] || me == meta_bad) {
		/* the store is gone: nothing survives but the MPI rank */
		snap_ec_meta_free(mt);
		mt = NULL;
		free(data);
		free(par);
		data = par = NULL;
	}
	struct snap_ec_rebuild *r = NULL;
	rc = snap_ec_rebuild_begin(gc, g, mt, &o, &r, err, sizeof(err));
	CHECK(rc == 0, "trial %d rebuild_begin: %s", tr, err);
	if (rc == 0) {
		int ids[SNAP_EC_MAX_GROUP];
		CHECK(snap_ec_rebuild_lost(r, ids, n) == nlost + (meta_bad >= 0), "lost count");
		snap_ec_meta_info(snap_ec_rebuild_meta(r), &info);
		CHECK(info.data_len == mylen && info.parity_len == plen && info.index == me &&
		      info.step == 100 + (uint64_t)tr, "rebuilt meta info");
		const void *a;
		size_t al;
		snap_ec_meta_app(snap_ec_rebuild_meta(r), me, &a, &al);
		CHECK(al == (size_t)applen && memcmp(a, app, al) == 0, "app blob");
		if (!data) {
			data = malloc(mylen + 1);
			par = malloc(plen + 1);
			memset(data, 0xA5, mylen + 1);
			memset(par, 0x5A, plen + 1);
		}
		iovcnt = split(data, mylen, iov);
		/* Half the trials rebuild through io over shadow copies; in some of
		 * those the first lost member's first write fails. */
		int use_io = (int)(rnd() % 2), io_fails = use_io && !expect_lost && rnd() % 3 == 0;
		int first_lost = -1;
		for (int j = n - 1; j >= 0; j--)
			if (lost[j] || j == meta_bad)
				first_lost = j;
		io_fails = io_fails && first_lost >= 0;
		uint8_t *sdata = NULL, *spar = NULL, *before = NULL, *pbefore = NULL;
		struct test_io ts = { .plen = plen, .fail_at = io_fails && me == first_lost ? 1 : 0 };
		if (use_io) {
			sdata = malloc(mylen + 1);
			spar = malloc(plen + 1);
			before = malloc(mylen + 1);
			pbefore = malloc(plen + 1);
			memcpy(sdata, data, mylen + 1);
			memcpy(spar, par, plen + 1);
			memcpy(before, data, mylen + 1);
			memcpy(pbefore, par, plen + 1);
			for (int i = 0; i < iovcnt; i++) /* the same cuts as run()'s iovecs */
				ts.iov[i] = (struct iovec){ sdata + ((uint8_t *)iov[i].iov_base - data), iov[i].iov_len };
			ts.par = spar;
			struct snap_ec_io io = { io_read, io_write, &ts };
			CHECK(snap_ec_rebuild_set_io(r, &io) == 0, "set_io");
		}
		struct snap_ec_rebuild_stats rst;
		rc = snap_ec_rebuild_run(r, iov, iovcnt, par, plen, &rst);
		if (use_io) {
			CHECK(memcmp(data, before, mylen) == 0 && memcmp(par, pbefore, plen) == 0,
			      "trial %d: rebuild through io wrote into run()'s buffers", tr);
			/* a survivor verifies its pieces through io->read */
			CHECK(lost[me] || me == meta_bad || (mylen == 0 && plen == 0) || ts.reads > 0,
			      "trial %d: a survivor read nothing through io", tr);
			if (!rc) { /* the io's copies are what the checks below see */
				memcpy(data, sdata, mylen);
				memcpy(par, spar, plen);
			}
		}
		if (io_fails) {
			CHECK(rc != 0, "trial %d: a write failed on member %d but rebuild_run returned 0", tr, first_lost);
			if (me == first_lost)
				CHECK(strstr(snap_ec_rebuild_error(r), "writing rebuilt"), "trial %d: write failure: %s", tr,
				      snap_ec_rebuild_error(r));
			st->io_fails++;
		} else if (expect_lost) {
			CHECK(rc == SNAP_ELOST && strstr(snap_ec_rebuild_error(r), "erasures"),
			      "trial %d: expected ELOST, got %d: %s", tr, rc, snap_ec_rebuild_error(r));
		} else {
			CHECK(rc == 0, "trial %d rebuild_run: %s", tr, snap_ec_rebuild_error(r));
			CHECK(memcmp(data, gd.data[me], mylen) == 0, "trial %d: data not bit-exact", tr);
			CHECK(memcmp(par, gd.par[me], plen) == 0, "trial %d: parity not bit-exact", tr);
			if (!lost[me] && me != meta_bad)
				CHECK(rst.chunks_corrupt == my_bad_chunks, "corrupt count %llu vs %llu",
				      (unsigned long long)rst.chunks_corrupt, (unsigned long long)my_bad_chunks);
			CHECK(snap_ec_verify(snap_ec_rebuild_meta(r), iov, iovcnt, par, plen, &nbad, err,
					     sizeof(err)) == 0, "verify after rebuild: %s", err);
		}
		st->ios += use_io;
		free(sdata);
		free(spar);
		free(before);
		free(pbefore);
		snap_ec_rebuild_free(r);
	}
	snap_ec_meta_free(mt);
	free(blob);
	free(er);
	free(data);
	free(par);
	group_free(&gd);
}

/* m + 1 losses: a clear refusal, then the same step still rebuilds once one
 * of the "lost" stores turns out to be intact. */
static void too_many(MPI_Comm gc, const struct snap_ec_group *g, uint64_t seed, uint32_t chunk)
{
	int n = g->n, m = g->m, me = g->index;
	char err[512];
	struct group_data gd = { .n = n, .k = g->k, .m = m };
	for (int j = 0; j < n; j++)
		gd.len[j] = 3000 + 17 * (uint64_t)j;
	group_ref(&gd, g, seed, 9999, chunk);
	struct snap_ec_opts o = { .chunk_size = chunk };
	struct snap_ec_encode *e = NULL;
	struct iovec iov = { gd.data[me], gd.len[me] };
	uint8_t *par = malloc((size_t)m * gd.seg);
	CHECK(snap_ec_encode_begin(gc, g, 7, gd.len[me], NULL, 0, &o, &e, err, sizeof(err)) == 0, "%s", err);
	CHECK(snap_ec_encode_run(e, &iov, 1, par, (uint64_t)m * gd.seg) == 0, "%s", snap_ec_encode_error(e));
	struct snap_ec_meta *mt = NULL;
	size_t blen;
	snap_ec_meta_pack(snap_ec_encode_meta(e), NULL, 0, &blen);
	uint8_t *blob = malloc(blen);
	snap_ec_meta_pack(snap_ec_encode_meta(e), blob, blen, &blen);
	snap_ec_encode_free(e);
	snap_ec_meta_unpack(blob, blen, &mt, err, sizeof(err));
	struct snap_ec_rebuild *r = NULL;
	int gone = me <= m; /* members 0..m: m + 1 of them */
	int rc = snap_ec_rebuild_begin(gc, g, gone ? NULL : mt, &o, &r, err, sizeof(err));
	char want[64];
	snprintf(want, sizeof(want), "lost %d members (ranks %d,", m + 1, g->first_rank);
	CHECK(rc == SNAP_ELOST && !r && strstr(err, want) && strstr(err, "group"), "M+1: rc %d: %s", rc, err);
	if (me == 0 && rank_world == 0)
		printf("  M+1 message: %s\n", err);
	/* member 0 was a false alarm: m lost now, must rebuild bit-exact */
	uint8_t *d = gd.data[me];
	uint8_t *copy = malloc(gd.len[me] + 1);
	memcpy(copy, d, gd.len[me]);
	if (me >= 1 && me <= m) {
		memset(copy, 0, gd.len[me]);
		memset(par, 0, (size_t)m * gd.seg);
	}
	rc = snap_ec_rebuild_begin(gc, g, (me >= 1 && me <= m) ? NULL : mt, &o, &r, err, sizeof(err));
	CHECK(rc == 0, "m lost after refusal: %s", err);
	struct iovec ci = { copy, gd.len[me] };
	if (!rc) {
		CHECK(snap_ec_rebuild_run(r, &ci, 1, par, (uint64_t)m * gd.seg, NULL) == 0, "%s",
		      snap_ec_rebuild_error(r));
		CHECK(memcmp(copy, d, gd.len[me]) == 0 && memcmp(par, gd.par[me], (size_t)m * gd.seg) == 0,
		      "rebuild after refusal not bit-exact");
		snap_ec_rebuild_free(r);
	}
	free(copy);
	free(blob);
	free(par);
	snap_ec_meta_free(mt);
	group_free(&gd);
}

/* Flip the low bit of the byte at off in a packed meta and re-seal its
 * CRC: a valid record that says something else. */
static void restamp(uint8_t *blob, size_t blen, size_t off)
{
	blob[off] ^= 1;
	size_t l = blen - 4;
	uint32_t c = snap_crc32c_update(0, blob, l);
	for (int i = 0; i < 4; i++)
		blob[l + (size_t)i] = (uint8_t)(c >> (8 * i));
}

static void bad_args(MPI_Comm gc, const struct snap_ec_group *g)
{
	int me = g->index, m = g->m;
	char err[512];
	static uint8_t big[SNAP_EC_APP_MAX + 1];
	struct snap_ec_encode *e = NULL;
	/* one member's bad argument fails the whole group, nobody hangs */
	int rc = snap_ec_encode_begin(gc, g, 1, 10, big, me == 0 ? sizeof(big) : 1, NULL, &e, err, sizeof(err));
	CHECK(rc == SNAP_EINVAL && !e, "oversized app blob: %d", rc);
	struct snap_ec_opts o = { .chunk_size = me == 1 ? 128 : 64 };
	rc = snap_ec_encode_begin(gc, g, 1, 10, NULL, 0, &o, &e, err, sizeof(err));
	CHECK(rc == SNAP_EINVAL && strstr(err, "disagree"), "chunk disagreement: %s", err);
	o.chunk_size = 100;
	rc = snap_ec_encode_begin(gc, g, 1, 10, NULL, 0, &o, &e, err, sizeof(err));
	CHECK(rc == SNAP_EINVAL, "chunk 100");
	struct snap_ec_group wrong = *g;
	wrong.index = (g->index + 1) % g->n;
	rc = snap_ec_encode_begin(gc, &wrong, 1, 10, NULL, 0, NULL, &e, err, sizeof(err));
	CHECK(rc == SNAP_EINVAL && strstr(err, "communicator"), "wrong index: %s", err);

	uint8_t buf[64] = { 0 }, par[64];
	rc = snap_ec_encode_begin(gc, g, 1, 10, NULL, 0, NULL, &e, err, sizeof(err));
	CHECK(rc == 0, "%s", err);
	struct iovec iov = { buf, me == 0 ? 9 : 10 };
	rc = snap_ec_encode_run(e, &iov, 1, par, sizeof(par));
	CHECK(rc == SNAP_EINVAL, "short iovec on one member: %d", rc);
	snap_ec_encode_free(e);
	rc = snap_ec_encode_begin(gc, g, 1, 10, NULL, 0, NULL, &e, err, sizeof(err));
	iov.iov_len = 10;
	rc = snap_ec_encode_run(e, &iov, 1, par, me == 0 ? 1 : sizeof(par));
	CHECK(rc == SNAP_EINVAL, "short parity on one member: %d", rc);
	snap_ec_encode_free(e);
	rc = snap_ec_encode_begin(gc, g, 1, 10, NULL, 0, NULL, &e, err, sizeof(err));
	CHECK(snap_ec_encode_run(e, &iov, 1, par, sizeof(par)) == 0, "%s", snap_ec_encode_error(e));
	CHECK(snap_ec_encode_run(e, &iov, 1, par, sizeof(par)) == SNAP_ESTATE, "run twice");
	size_t blen;
	snap_ec_meta_pack(snap_ec_encode_meta(e), NULL, 0, &blen);
	uint8_t *blob = malloc(blen);
	snap_ec_meta_pack(snap_ec_encode_meta(e), blob, blen, &blen);
	CHECK(snap_ec_meta_pack(snap_ec_encode_meta(e), blob, blen - 1, &blen) == SNAP_EOVERFLOW, "pack cap");
	snap_ec_encode_free(e);
	struct snap_ec_meta *mt = NULL;
	CHECK(snap_ec_meta_unpack(blob, blen - 1, &mt, err, sizeof(err)) == SNAP_ETRUNC && !mt, "truncated");
	/* a record of another group or index handed to rebuild_begin: that
	 * member refuses it (EMISMATCH) and the whole group gets the code */
	for (int which = 0; which < 2; which++) {
		uint8_t *b2 = malloc(blen);
		memcpy(b2, blob, blen);
		if (me == 0)
			restamp(b2, blen, which ? 32 : 12); /* index : group field */
		struct snap_ec_meta *bad = NULL;
		CHECK(snap_ec_meta_unpack(b2, blen, &bad, err, sizeof(err)) == 0, "%s", err);
		struct snap_ec_rebuild *rb = NULL;
		rc = snap_ec_rebuild_begin(gc, g, bad, NULL, &rb, err, sizeof(err));
		CHECK(rc == SNAP_EMISMATCH && !rb && (me != 0 || strstr(err, "handed to")),
		      "wrong %s in the meta: %d %s", which ? "index" : "group", rc, err);
		snap_ec_rebuild_free(rb);
		snap_ec_meta_free(bad);
		free(b2);
	}
	snap_ec_meta_unpack(blob, blen, &mt, err, sizeof(err));
	/* survivors disagree on the step: index m's record is from another step */
	struct snap_ec_rebuild *r = NULL;
	if (me == m) {
		rc = snap_ec_rebuild_begin(gc, g, NULL, NULL, &r, err, sizeof(err));
	} else {
		if (me == m + 1 || (g->n == m + 1 && me == 0)) {
			/* re-stamp the step and re-pack: a valid record of another step */
			restamp(blob, blen, 44); /* step low byte: magic, version, 8 u32 fields */
			snap_ec_meta_free(mt);
			CHECK(snap_ec_meta_unpack(blob, blen, &mt, err, sizeof(err)) == 0, "%s", err);
		}
		rc = snap_ec_rebuild_begin(gc, g, mt, NULL, &r, err, sizeof(err));
	}
	CHECK(rc == SNAP_EMISMATCH && strstr(err, "disagree"), "step mismatch: %d %s", rc, err);
	snap_ec_meta_free(mt);
	free(blob);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank_world);
	if (argc < 5) {
		if (rank_world == 0)
			fprintf(stderr, "usage: test_ec_mpi K M TRIALS SEED [CHUNK] [MAXLEN]\n");
		MPI_Finalize();
		return 2;
	}
	int k = atoi(argv[1]), m = atoi(argv[2]), trials = atoi(argv[3]);
	uint64_t seed = strtoull(argv[4], NULL, 0);
	uint32_t chunk = argc > 5 ? (uint32_t)atoi(argv[5]) : 1024;
	uint64_t maxlen = argc > 6 ? strtoull(argv[6], NULL, 0) : 40000;
	struct snap_ec_group g;
	MPI_Comm gc;
	char err[256];
	int rc = snap_ec_comm_split(MPI_COMM_WORLD, k, m, 0, &g, &gc, err, sizeof(err));
	if (rc) {
		fprintf(stderr, "[rank %d] %s\n", rank_world, err);
		MPI_Finalize();
		return 1;
	}
	struct stats st = { 0 };
	for (int t = 0; t < trials; t++)
		trial(gc, &g, seed, t, chunk, maxlen, &st);
	too_many(gc, &g, seed, chunk);
	bad_args(gc, &g);
	MPI_Comm_free(&gc);
	int tot[8] = { failures, st.trials, st.lost_nodes, st.flips, st.meta_bad, st.expect_lost, st.ios,
		       st.io_fails }, sum[8];
	/* per-group stats are counted once, by each group's index 0 */
	if (g.index != 0)
		for (int i = 1; i < 8; i++)
			tot[i] = 0;
	MPI_Reduce(tot, sum, 8, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank_world == 0)
		printf("test_ec_mpi %d+%d (%d groups): %d trials, %d nodes lost, %d byte flips, %d corrupt metas, "
		       "%d predicted ELOST, %d through io (%d failing): %s\n", k, m, g.ngroups, sum[1], sum[2],
		       sum[3], sum[4], sum[5], sum[6], sum[7], sum[0] ? "FAILED" : "ok");
	MPI_Finalize();
	return failures ? 1 : 0;
}
