/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * codec.c - stream framing of both codecs: header, block table, parameter
 * checks, and the split of blocks over threads. The block coders live in
 * lossless.c and lossy.c; the rules shared with the GPU in codec_core.h.
 */
#include <pthread.h>
#include <string.h>

#include "snap/codec.h"
#include "codec_impl.h"

/* Everything a stream is cut by, derived from params or a header. */
struct plan {
	int codec;             /* as written in the header */
	struct snapc_dt dt;
	uint32_t B, log2B;
	uint64_t count;
	uint32_t nblocks;
	double bound, param;
	struct snapc_lyq q;    /* lossy only */
};

static int block_log2(uint32_t B, uint32_t *log2B)
{
	if (B == 0)
		B = SNAP_CODEC_BLOCK_DEFAULT;
	if (B < SNAP_CODEC_BLOCK_MIN || B > SNAP_CODEC_BLOCK_MAX || (B & (B - 1)))
		return SNAP_EINVAL;
	*log2B = snapc_bits(B) - 1;
	return 0;
}

int snap_codec_check(const struct snap_codec_params *p)
{
	struct snapc_dt dt;
	uint32_t l;
	struct snapc_lyq q;
	if (!p || snapc_dt_of(p->dtype, &dt) || block_log2(p->block_elems, &l))
		return SNAP_EINVAL;
	switch (p->codec) {
	case SNAP_CODEC_LOSSLESS:
		return 0;
	case SNAP_CODEC_LOSSY_ABS:
		return snapc_step(p->bound, &q) ? SNAP_ERANGE : 0;
	case SNAP_CODEC_LOSSY_REL:
		return p->bound > 0.0 && p->bound < 1.0e300 ? 0 : SNAP_ERANGE;
	default:
		return SNAP_EINVAL;
	}
}

static size_t block_max(uint32_t n, uint32_t es)
{
	return SNAPC_BLOCK_SLACK + (size_t)n * es;
}

size_t snap_codec_bound(const struct snap_codec_params *p, size_t count)
{
	struct snapc_dt dt;
	uint32_t l;
	if (snap_codec_check(p) || snapc_dt_of(p->dtype, &dt) || block_log2(p->block_elems, &l))
		return 0;
	uint64_t nb = (count + ((size_t)1 << l) - 1) >> l;
	if (nb > UINT32_MAX || count > (SIZE_MAX - 64) / 8)
		return 0;
	return SNAP_CODEC_HEADER_BYTES + nb * (4 + SNAPC_BLOCK_SLACK) + count * dt.esize;
}

static uint32_t block_n(const struct plan *pl, uint32_t b)
{
	uint64_t i0 = (uint64_t)b << pl->log2B;
	return pl->count - i0 < pl->B ? (uint32_t)(pl->count - i0) : pl->B;
}

static int encode_block(const struct plan *pl, const uint8_t *src, uint32_t b,
			uint8_t *dst, size_t cap, size_t *len)
{
	const uint8_t *s = src + ((size_t)b << pl->log2B) * pl->dt.esize;
	uint32_t n = block_n(pl, b);
	if (pl->codec == SNAP_CODEC_LOSSLESS)
		return snapc_ll_encode(s, n, &pl->dt, dst, cap, len);
	return snapc_ly_encode(s, n, &pl->dt, &pl->q, dst, cap, len);
}

static int decode_block(const struct plan *pl, const uint8_t *src, size_t len,
			uint32_t b, uint8_t *dst)
{
	uint8_t *d = dst + ((size_t)b << pl->log2B) * pl->dt.esize;
	uint32_t n = block_n(pl, b);
	if (pl->codec == SNAP_CODEC_LOSSLESS)
		return snapc_ll_decode(src, len, n, &pl->dt, d);
	return snapc_ly_decode(src, len, n, &pl->dt, &pl->q, d);
}

static void write_header(const struct plan *pl, uint8_t *dst, uint64_t payload)
{
	snapc_st32(dst, SNAPC_MAGIC);
	dst[4] = SNAP_CODEC_VERSION;
	dst[5] = (uint8_t)pl->codec;
	dst[6] = (uint8_t)(pl->dt.esize == 4 ? SNAP_DTYPE_F32 : pl->dt.E == 8 ? SNAP_DTYPE_BF16 : SNAP_DTYPE_F16);
	dst[7] = (uint8_t)pl->log2B;
	snapc_st64(dst + 8, pl->count);
	uint64_t u;
	memcpy(&u, &pl->bound, 8);
	snapc_st64(dst + 16, u);
	memcpy(&u, &pl->param, 8);
	snapc_st64(dst + 24, u);
	snapc_st64(dst + 32, payload);
	snapc_st32(dst + 40, pl->nblocks);
	snapc_st32(dst + 44, 0);
}

/* ---- threads --------------------------------------------------------- */

struct job {
	const struct plan *pl;
	const uint8_t *src;
	uint8_t *dst;
	size_t cap;
	uint32_t b0, b1;       /* block range */
	size_t off;            /* where this range's payload starts in dst */
	size_t used;           /* payload bytes written (encode) */
	int rc;
	float lo, hi;          /* finite min/max (range pass) */
	int any;
};

static void *job_encode(void *arg)
{
	struct job *j = arg;
	const struct plan *pl = j->pl;
	size_t off = j->off, end = j->cap;
	j->rc = 0;
	for (uint32_t b = j->b0; b < j->b1; b++) {
		size_t len;
		int rc = encode_block(pl, j->src, b, j->dst + off, end - off, &len);
		if (rc) { j->rc = rc; break; }
		snapc_st32(j->dst + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b, (uint32_t)len);
		off += len;
	}
	j->used = off - j->off;
	return NULL;
}

static void *job_decode(void *arg)
{
	struct job *j = arg;
	const uint8_t *tab = j->src + SNAP_CODEC_HEADER_BYTES;
	size_t off = j->off;
	j->rc = 0;
	for (uint32_t b = j->b0; b < j->b1; b++) {
		uint32_t len = snapc_ld32(tab + 4 * (size_t)b);
		int rc = decode_block(j->pl, j->src + off, len, b, j->dst);
		if (rc) { j->rc = rc; break; }
		off += len;
	}
	return NULL;
}

static void *job_range(void *arg)
{
	struct job *j = arg;
	const struct plan *pl = j->pl;
	uint64_t i0 = (uint64_t)j->b0 << pl->log2B, i1 = (uint64_t)j->b1 << pl->log2B;
	float lo = 0, hi = 0;
	int any = 0;
	if (i1 > pl->count)
		i1 = pl->count;
	for (uint64_t i = i0; i < i1; i++) {
		float x = snapc_to_f32(snapc_ldel(j->src, i, pl->dt.esize), pl->dt.esize, pl->dt.E);
		if (!(fabsf(x) <= 3.40282347e38f))
			continue;
		if (!any) { lo = hi = x; any = 1; }
		lo = x < lo ? x : lo;
		hi = x > hi ? x : hi;
	}
	j->lo = lo; j->hi = hi; j->any = any;
	return NULL;
}

/* Run fn over nthreads jobs, job 0 on the calling thread; a job whose thread
 * cannot start runs on the calling thread after job 0. */
static void run_jobs(void *(*fn)(void *), struct job *jobs, unsigned nthreads)
{
	pthread_t tid[64];
	int started[64] = {0};
	for (unsigned t = 1; t < nthreads; t++)
		started[t] = pthread_create(&tid[t], NULL, fn, &jobs[t]) == 0;
	fn(&jobs[0]);
	for (unsigned t = 1; t < nthreads; t++) {
		if (started[t])
			pthread_join(tid[t], NULL);
		else
			fn(&jobs[t]);
	}
}

static unsigned clamp_threads(unsigned nthreads, uint32_t nblocks)
{
	if (nthreads < 1) nthreads = 1;
	if (nthreads > 64) nthreads = 64;
	if (nthreads > nblocks) nthreads = nblocks ? nblocks : 1;
	return nthreads;
}

static void split(struct job *jobs, unsigned nt, uint32_t nblocks)
{
	for (unsigned t = 0; t < nt; t++) {
		jobs[t].b0 = (uint32_t)((uint64_t)nblocks * t / nt);
		jobs[t].b1 = (uint32_t)((uint64_t)nblocks * (t + 1) / nt);
	}
}

/* ---- compress -------------------------------------------------------- */

static int plan_compress(const struct snap_codec_params *p, const void *src,
			 size_t count, unsigned nthreads, struct plan *pl)
{
	int rc = snap_codec_check(p);
	if (rc)
		return rc;
	memset(pl, 0, sizeof(*pl));
	snapc_dt_of(p->dtype, &pl->dt);
	block_log2(p->block_elems, &pl->log2B);
	pl->B = 1u << pl->log2B;
	pl->count = count;
	uint64_t nb = (count + pl->B - 1) >> pl->log2B;
	if (nb > UINT32_MAX)
		return SNAP_EINVAL;
	pl->nblocks = (uint32_t)nb;
	pl->codec = p->codec;
	if (p->codec == SNAP_CODEC_LOSSY_ABS) {
		pl->bound = pl->param = p->bound;
	} else if (p->codec == SNAP_CODEC_LOSSY_REL) {
		struct job jobs[64];
		unsigned nt = clamp_threads(nthreads, pl->nblocks);
		memset(jobs, 0, sizeof(jobs));
		split(jobs, nt, pl->nblocks);
		for (unsigned t = 0; t < nt; t++) { jobs[t].pl = pl; jobs[t].src = src; }
		run_jobs(job_range, jobs, nt);
		float lo = 0, hi = 0;
		int any = 0;
		for (unsigned t = 0; t < nt; t++) {
			if (!jobs[t].any) continue;
			if (!any) { lo = jobs[t].lo; hi = jobs[t].hi; any = 1; }
			lo = jobs[t].lo < lo ? jobs[t].lo : lo;
			hi = jobs[t].hi > hi ? jobs[t].hi : hi;
		}
		pl->bound = p->bound * ((double)hi - (double)lo);
		pl->param = p->bound;
	}
	if (pl->codec != SNAP_CODEC_LOSSLESS &&
	    snapc_step(pl->bound, &pl->q)) {
		if (pl->codec == SNAP_CODEC_LOSSY_ABS)
			return SNAP_ERANGE;
		pl->codec = SNAP_CODEC_LOSSLESS; /* degenerate range: keep it exact */
	}
	if (pl->codec == SNAP_CODEC_LOSSLESS)
		pl->bound = pl->param = 0.0;
	return 0;
}

int snap_codec_compress_mt(const struct snap_codec_params *p, const void *src,
			   size_t count, void *dst, size_t dst_cap,
			   size_t *out_len, unsigned nthreads)
{
	struct plan pl;
	if (!p || (!src && count) || !dst || !out_len)
		return SNAP_EINVAL;
	int rc = plan_compress(p, src, count, nthreads, &pl);
	if (rc)
		return rc;
	size_t H = SNAP_CODEC_HEADER_BYTES + 4 * (size_t)pl.nblocks;
	if (dst_cap < H)
		return SNAP_EOVERFLOW;
	unsigned nt = clamp_threads(nthreads, pl.nblocks);
	if (nt > 1 && dst_cap < snap_codec_bound(p, count))
		return SNAP_EOVERFLOW;

	struct job jobs[64];
	memset(jobs, 0, sizeof(jobs));
	split(jobs, nt, pl.nblocks);
	size_t full = block_max(pl.B, pl.dt.esize);
	for (unsigned t = 0; t < nt; t++) {
		jobs[t].pl = &pl;
		jobs[t].src = src;
		jobs[t].dst = dst;
		jobs[t].off = H + (size_t)jobs[t].b0 * full;
		jobs[t].cap = t + 1 < nt ? H + (size_t)jobs[t].b1 * full : dst_cap;
	}
	run_jobs(job_encode, jobs, nt);
	size_t end = H;
	for (unsigned t = 0; t < nt; t++) {
		if (jobs[t].rc)
			return jobs[t].rc;
		if (jobs[t].off != end)
			memmove((uint8_t *)dst + end, (uint8_t *)dst + jobs[t].off, jobs[t].used);
		end += jobs[t].used;
	}
	write_header(&pl, dst, end - H);
	*out_len = end;
	return 0;
}

int snap_codec_compress(const struct snap_codec_params *p, const void *src,
			size_t count, void *dst, size_t dst_cap, size_t *out_len)
{
	return snap_codec_compress_mt(p, src, count, dst, dst_cap, out_len, 1);
}

/* ---- inspect / decompress -------------------------------------------- */

static int plan_stream(const uint8_t *s, size_t len, struct plan *pl)
{
	if (!s || len < SNAP_CODEC_HEADER_BYTES)
		return SNAP_ETRUNC;
	memset(pl, 0, sizeof(*pl));
	if (snapc_ld32(s) != SNAPC_MAGIC || s[4] != SNAP_CODEC_VERSION)
		return SNAP_EFORMAT;
	pl->codec = s[5];
	if (pl->codec < SNAP_CODEC_LOSSLESS || pl->codec > SNAP_CODEC_LOSSY_REL ||
	    snapc_dt_of(s[6], &pl->dt) || s[7] < 8 || s[7] > 14)
		return SNAP_EFORMAT;
	pl->log2B = s[7];
	pl->B = 1u << pl->log2B;
	pl->count = snapc_ld64(s + 8);
	uint64_t u = snapc_ld64(s + 16);
	memcpy(&pl->bound, &u, 8);
	u = snapc_ld64(s + 24);
	memcpy(&pl->param, &u, 8);
	pl->nblocks = snapc_ld32(s + 40);
	if (snapc_ld32(s + 44) != 0 || pl->count > ((uint64_t)UINT32_MAX << pl->log2B) ||
	    pl->nblocks != (pl->count + pl->B - 1) >> pl->log2B)
		return SNAP_ECORRUPT;
	if (pl->codec == SNAP_CODEC_LOSSLESS) {
		if (u != 0 || snapc_ld64(s + 16) != 0)
			return SNAP_ECORRUPT;
	} else if (snapc_step(pl->bound, &pl->q) || !(pl->param > 0.0)) {
		return SNAP_ECORRUPT;
	}
	return 0;
}

static int inspect(const uint8_t *s, size_t len, struct plan *pl, uint64_t *total)
{
	int rc = plan_stream(s, len, pl);
	if (rc)
		return rc;
	uint64_t H = SNAP_CODEC_HEADER_BYTES + 4 * (uint64_t)pl->nblocks;
	if (len < H)
		return SNAP_ETRUNC;
	uint64_t payload = 0;
	uint32_t minb = pl->codec == SNAP_CODEC_LOSSLESS ? SNAPC_LL_HDR : SNAPC_LY_HDR;
	for (uint32_t b = 0; b < pl->nblocks; b++) {
		uint32_t bl = snapc_ld32(s + SNAP_CODEC_HEADER_BYTES + 4 * (size_t)b);
		if (bl < minb || bl > block_max(block_n(pl, b), pl->dt.esize))
			return SNAP_ECORRUPT;
		payload += bl;
	}
	if (payload != snapc_ld64(s + 32))
		return SNAP_ECORRUPT;
	if (len - H < payload)
		return SNAP_ETRUNC;
	*total = H + payload;
	return 0;
}

int snap_codec_inspect(const void *src, size_t src_len, struct snap_codec_info *info)
{
	struct plan pl;
	uint64_t total;
	int rc = inspect(src, src_len, &pl, &total);
	if (rc)
		return rc;
	if (info) {
		info->version = SNAP_CODEC_VERSION;
		info->codec = pl.codec;
		info->dtype = ((const uint8_t *)src)[6];
		info->block_elems = pl.B;
		info->count = pl.count;
		info->bound = pl.bound;
		info->param = pl.param;
		info->nblocks = pl.nblocks;
		info->stream_len = total;
	}
	return 0;
}

int snap_codec_decompress_mt(const void *src, size_t src_len, void *dst,
			     size_t dst_cap, size_t *count_out,
			     unsigned nthreads)
{
	struct plan pl;
	uint64_t total;
	int rc = inspect(src, src_len, &pl, &total);
	if (rc)
		return rc;
	if (pl.count > dst_cap / pl.dt.esize)
		return SNAP_EOVERFLOW;
	if (!dst && pl.count)
		return SNAP_EINVAL;
	unsigned nt = clamp_threads(nthreads, pl.nblocks);
	struct job jobs[64];
	memset(jobs, 0, sizeof(jobs));
	split(jobs, nt, pl.nblocks);
	const uint8_t *tab = (const uint8_t *)src + SNAP_CODEC_HEADER_BYTES;
	size_t off = SNAP_CODEC_HEADER_BYTES + 4 * (size_t)pl.nblocks;
	uint32_t b = 0;
	for (unsigned t = 0; t < nt; t++) {
		for (; b < jobs[t].b0; b++)
			off += snapc_ld32(tab + 4 * (size_t)b);
		jobs[t].pl = &pl;
		jobs[t].src = src;
		jobs[t].dst = dst;
		jobs[t].off = off;
	}
	run_jobs(job_decode, jobs, nt);
	for (unsigned t = 0; t < nt; t++)
		if (jobs[t].rc)
			return jobs[t].rc;
	if (count_out)
		*count_out = (size_t)pl.count;
	return 0;
}

int snap_codec_decompress(const void *src, size_t src_len, void *dst,
			  size_t dst_cap, size_t *count_out)
{
	return snap_codec_decompress_mt(src, src_len, dst, dst_cap, count_out, 1);
}

/* ---- dtype conversion ------------------------------------------------ */

int snap_codec_convert(int dst_dtype, void *dst, int src_dtype,
		       const void *src, size_t count)
{
	struct snapc_dt sd, dd;
	if (snapc_dt_of(src_dtype, &sd) || snapc_dt_of(dst_dtype, &dd) || (count && (!src || !dst)))
		return SNAP_EINVAL;
	for (size_t i = 0; i < count; i++) {
		uint32_t v = snapc_ldel(src, i, sd.esize);
		if (src_dtype != dst_dtype)
			v = snapc_from_f32(snapc_to_f32(v, sd.esize, sd.E), dd.esize, dd.E);
		snapc_stel(dst, i, dd.esize, v);
	}
	return 0;
}
