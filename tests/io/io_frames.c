/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Codec frames in rank files: regions held as snap/codec.h streams written
 * as they are, one HDF5 chunk per frame, and read back raw or decoded.
 *
 *   io_frames roundtrip OUT   3 steps x 2 ranks (writer codec none, lz4, lz4 without O_DIRECT)
 *       of f32/bf16/f16 frame regions (lossless, lossy-abs, lossy-rel; random
 *       values with NaN and Inf; several frames with a short last one, one
 *       frame larger than the region, 9000 frames) beside raw regions; list,
 *       read raw frames and decoded values, verify, export copy (and
 *       virtual). Leaves OUT/expect/{rank-R,global}/<dataset>.bin (decoded
 *       values) for check_h5py_frames.py and check_h5dump_frames.sh.
 *   io_frames faults DIR      frames that lie (CRC, dtype, count, length,
 *       header, nframes) are refused before any file appears; a byte flipped
 *       in a stored frame, a truncated file, destinations that do not fit;
 *       the HDF5 filter function itself on good and hostile streams.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include <hdf5.h>

#include "codecfilter.h"
#include "io_testutil.h"

#define JOB "jobF"
#define WORLD 2
#define MAXR 8

struct spec {
	const char *name;
	int dtype, codec; /* codec 0: a raw region */
	double bound;
	int ndim;
	uint64_t global[3];
	int split;        /* rank r holds the r-th half along dim 0; else the whole tensor */
	unsigned ranks;   /* bit r: rank r holds it */
	uint64_t fe;
};

static const struct spec S[] = {
	{"fr.f32.lossless", SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, 2, {74, 100}, 1, 3, 1024},
	{"model/fr.bf16.abs", SNAP_DTYPE_BF16, SNAP_CODEC_LOSSY_ABS, 1e-2, 3, {3, 1000, 2}, 0, 3, 2048},
	{"fr.f16.rel", SNAP_DTYPE_F16, SNAP_CODEC_LOSSY_REL, 1e-3, 1, {10000}, 1, 3, 512},
	{"fr.one", SNAP_DTYPE_F32, SNAP_CODEC_LOSSY_ABS, 1e-4, 1, {300}, 0, 1, 4096},
	{"fr.many", SNAP_DTYPE_BF16, SNAP_CODEC_LOSSLESS, 0, 1, {256 * 9000}, 0, 2, 256},
	{"raw.f32", SNAP_DTYPE_F32, 0, 0, 2, {2, 500}, 1, 3, 0},
	{"raw.i64", SNAP_DTYPE_I64, 0, 0, 1, {64}, 0, 3, 0},
};
#define NS (sizeof S / sizeof S[0])

struct inst {
	int held;
	uint64_t off[3], shape[3], count;
	struct io_t_frames fr;  /* frame regions */
	void *vals;             /* what reading gives: decoded frames or the raw bytes */
};

static struct inst I[WORLD][NS];
static const char *out;

static uint32_t rnd_state = 12345;
static uint32_t rnd(void)
{
	rnd_state = rnd_state * 1103515245u + 12345u;
	return rnd_state >> 8;
}

/* count f32 values: smooth-ish weights with NaN, +-Inf and a few spikes. */
static void fill_f32(float *v, uint64_t count)
{
	for (uint64_t i = 0; i < count; i++) {
		uint32_t r = rnd();
		v[i] = (float)((double)(r % 20001) / 10000.0 - 1.0) * (i % 7 == 0 ? 30.0f : 1.0f);
		if (r % 997 == 0)
			v[i] = NAN;
		else if (r % 991 == 0)
			v[i] = (r & 1) ? INFINITY : -INFINITY;
	}
}

static void dsname(const char *name, char *o, size_t cap)
{
	size_t k = 0;
	for (const char *p = name; *p && k + 4 < cap; p++)
		k += (size_t)(*p == '/' ? snprintf(o + k, cap - k, "%%2F") : snprintf(o + k, cap - k, "%c", *p));
	o[k] = '\0';
}

static void save(const char *sub, const char *name, const void *buf, size_t len)
{
	char d[4096], p[4400], ds[256];
	snprintf(d, sizeof d, "%s/expect/%s", out, sub);
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "mkdir -p '%s'", d);
	CHECK(system(cmd) == 0);
	dsname(name, ds, sizeof ds);
	snprintf(p, sizeof p, "%s/%s.bin", d, ds);
	FILE *f = fopen(p, "wb");
	CHECK(f && fwrite(buf, 1, len, f) == len && fclose(f) == 0);
}

static void make_data(void)
{
	for (uint32_t r = 0; r < WORLD; r++) {
		for (size_t i = 0; i < NS; i++) {
			const struct spec *s = &S[i];
			struct inst *x = &I[r][i];
			if (!(s->ranks >> r & 1))
				continue;
			x->held = 1;
			x->count = 1;
			for (int d = 0; d < s->ndim; d++) {
				x->shape[d] = s->global[d];
				x->off[d] = 0;
				if (d == 0 && s->split) {
					x->shape[d] = s->global[d] / WORLD;
					x->off[d] = r * x->shape[d];
				}
				x->count *= x->shape[d];
			}
			size_t es = snap_dtype_size(s->dtype);
			float *f32 = malloc(x->count * sizeof *f32);
			void *v = malloc(x->count * es);
			CHECK(f32 && v);
			fill_f32(f32, x->count);
			if (s->dtype == SNAP_DTYPE_F32)
				memcpy(v, f32, x->count * 4);
			else if (s->dtype == SNAP_DTYPE_I64)
				for (uint64_t k = 0; k < x->count; k++)
					((int64_t *)v)[k] = (int64_t)rnd() << 20 ^ (int64_t)k;
			else
				CHECK(snap_codec_convert(s->dtype, v, SNAP_DTYPE_F32, f32, x->count) == 0);
			free(f32);
			if (s->codec) {
				io_t_frames_make(&x->fr, s->dtype, s->codec, s->bound, v, x->count, s->fe);
				free(v);
				x->vals = x->fr.decoded;
			} else {
				x->vals = v;
			}
			char sub[32];
			snprintf(sub, sizeof sub, "rank-%" PRIu32, r);
			save(sub, s->name, x->vals, x->count * es);
		}
	}
	/* The global tensors, as the exports must hold them. */
	for (size_t i = 0; i < NS; i++) {
		const struct spec *s = &S[i];
		size_t es = snap_dtype_size(s->dtype);
		uint64_t total = 1;
		for (int d = 0; d < s->ndim; d++)
			total *= s->global[d];
		char *g = malloc(total * es);
		CHECK(g);
		if (s->split) {
			for (uint32_t r = 0; r < WORLD; r++)
				memcpy(g + r * I[r][i].count * es, I[r][i].vals, I[r][i].count * es);
		} else {
			uint32_t r = I[0][i].held ? 0 : 1;
			memcpy(g, I[r][i].vals, total * es);
		}
		save("global", s->name, g, total * es);
		free(g);
	}
}

static void write_step(const char *dir, uint64_t step, int codec, unsigned flags)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = codec, .chunk_bytes = 8 << 10, .flags = flags};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	CHECK(w);
	for (uint32_t r = 0; r < WORLD; r++) {
		struct snap_io_region reg[NS];
		size_t n = 0;
		uint64_t stored = 0, raw = 0, bulk = 0;
		for (size_t i = 0; i < NS; i++) {
			struct inst *x = &I[r][i];
			if (!x->held)
				continue;
			reg[n] = io_t_region(S[i].name, S[i].dtype, S[i].ndim, S[i].global, x->off, x->shape, x->vals);
			if (S[i].codec) {
				io_t_frames_attach(&reg[n], &x->fr);
				for (uint32_t k = 0; k < x->fr.n; k++) {
					stored += x->fr.len[k];
					bulk += x->fr.len[k];
				}
			} else if (codec == SNAP_IO_CODEC_NONE) {
				bulk += reg[n].bytes;
			}
			raw += reg[n].bytes;
			n++;
		}
		struct snap_io_write_stats st;
		OK(snap_io_write_rank(w, dir, JOB, step, r, WORLD, reg, n, &st, &err), &err);
		CHECK(st.raw_bytes == raw && st.stored_bytes >= stored);
		/* Frames and uncompressed data go through the io_uring pass
		 * (deferdrv.c), and so do LZ4 chunks with O_DIRECT: all of their
		 * stored bytes (what is not frames). */
		uint64_t lz4 = codec == SNAP_IO_CODEC_LZ4 && st.direct ? st.stored_bytes - stored : 0;
		CHECK(codec != SNAP_IO_CODEC_LZ4 || !st.direct || lz4 > 0);
		CHECK(!(flags & SNAP_IO_NO_DIRECT) || !st.direct);
		if (st.bulk_bytes != bulk + lz4) {
			fprintf(stderr, "rank %u: %" PRIu64 " bytes through io_uring, expected %" PRIu64 "\n", r,
				st.bulk_bytes, bulk + lz4);
			CHECK(0);
		}
	}
	snap_io_writer_free(w);
	OK(snap_io_step_seal(dir, JOB, step, WORLD, &err), &err);
}

struct listed {
	uint32_t rank;
	int lz4;
	size_t n;
};

static int on_region(const struct snap_io_region_info *in, void *arg)
{
	struct listed *l = arg;
	size_t i = 0;
	while (i < NS && strcmp(S[i].name, in->name) != 0)
		i++;
	CHECK(i < NS);
	const struct spec *s = &S[i];
	const struct inst *x = &I[l->rank][i];
	CHECK(x->held && in->dtype == s->dtype && in->ndim == s->ndim);
	CHECK(in->bytes == x->count * snap_dtype_size(s->dtype));
	for (int d = 0; d < s->ndim; d++)
		CHECK(in->shape[d] == x->shape[d] && in->shard_offset[d] == x->off[d] &&
		      in->global_shape[d] == s->global[d]);
	if (s->codec) {
		uint64_t sum = 0;
		for (uint32_t k = 0; k < x->fr.n; k++)
			sum += x->fr.len[k];
		CHECK(in->codec == SNAP_IO_CODEC_FRAMES && in->frame_codec == x->fr.codec);
		CHECK(in->nframes == x->fr.n && in->frame_elems == s->fe && in->crc32c == 0);
		CHECK(in->stored_bytes == sum);
	} else {
		CHECK(in->codec == (l->lz4 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE));
		CHECK(in->frame_codec == 0 && in->nframes == 0 && in->frame_elems == 0);
		CHECK(in->crc32c == snap_io_crc32c(x->vals, (size_t)in->bytes));
	}
	l->n++;
	return 0;
}

static void check_rank(const char *dir, uint64_t step, uint32_t r, int lz4)
{
	struct snap_io_err err = {0};
	struct listed l = {r, lz4, 0};
	OK(snap_io_list_regions(dir, JOB, step, r, on_region, &l, &err), &err);
	size_t held = 0;
	for (size_t i = 0; i < NS; i++)
		held += (size_t)I[r][i].held;
	CHECK(l.n == held);

	/* Raw frames: byte-identical, at a frame_cap that is not a round number. */
	struct snap_io_dest d[NS];
	size_t n = 0;
	for (size_t i = 0; i < NS; i++) {
		const struct inst *x = &I[r][i];
		if (!x->held || !S[i].codec)
			continue;
		uint64_t cap = x->fr.maxlen + 3;
		d[n] = (struct snap_io_dest){.name = S[i].name, .bytes = x->fr.n * cap, .frame_cap = cap,
					     .frame_elems = S[i].fe, .nframes = x->fr.n};
		d[n].buf = malloc(d[n].bytes);
		d[n].frame_len = calloc(x->fr.n, sizeof *d[n].frame_len);
		d[n].frame_crc = calloc(x->fr.n, sizeof *d[n].frame_crc);
		CHECK(d[n].buf && d[n].frame_len && d[n].frame_crc);
		n++;
	}
	OK(snap_io_read_rank(dir, JOB, step, r, d, n, &err), &err);
	for (size_t j = 0, i = 0; i < NS; i++) {
		const struct inst *x = &I[r][i];
		if (!x->held || !S[i].codec)
			continue;
		for (uint32_t k = 0; k < x->fr.n; k++) {
			CHECK(d[j].frame_len[k] == x->fr.len[k] && d[j].frame_crc[k] == x->fr.crc[k]);
			CHECK(memcmp((char *)d[j].buf + k * d[j].frame_cap, x->fr.frame[k], x->fr.len[k]) == 0);
		}
		free(d[j].buf);
		free(d[j].frame_len);
		free(d[j].frame_crc);
		j++;
	}

	/* Values: frame regions decoded, raw ones as they are. */
	n = 0;
	for (size_t i = 0; i < NS; i++) {
		const struct inst *x = &I[r][i];
		if (!x->held)
			continue;
		d[n] = (struct snap_io_dest){.name = S[i].name, .bytes = x->count * snap_dtype_size(S[i].dtype)};
		CHECK((d[n].buf = malloc(d[n].bytes)) != NULL);
		memset(d[n].buf, 0xA5, d[n].bytes);
		n++;
	}
	OK(snap_io_read_rank(dir, JOB, step, r, d, n, &err), &err);
	for (size_t j = 0, i = 0; i < NS; i++) {
		if (!I[r][i].held)
			continue;
		CHECK(memcmp(d[j].buf, I[r][i].vals, d[j].bytes) == 0);
		free(d[j].buf);
		j++;
	}
}

/* The export holds every tensor at its global shape with the expected values. */
static void check_export(const char *path)
{
	hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
	CHECK(f >= 0);
	for (size_t i = 0; i < NS; i++) {
		char ds[256], p[4200];
		dsname(S[i].name, ds, sizeof ds);
		snprintf(p, sizeof p, "%s/expect/global/%s.bin", out, ds);
		FILE *e = fopen(p, "rb");
		CHECK(e);
		fseek(e, 0, SEEK_END);
		size_t len = (size_t)ftell(e);
		rewind(e);
		char *want = malloc(len), *got = malloc(len);
		CHECK(want && got && fread(want, 1, len, e) == len);
		fclose(e);
		hid_t d = H5Dopen2(f, ds, H5P_DEFAULT), t = H5Dget_type(d), s = H5Dget_space(d);
		hsize_t dims[3];
		CHECK(d >= 0 && H5Sget_simple_extent_ndims(s) == S[i].ndim);
		H5Sget_simple_extent_dims(s, dims, NULL);
		for (int k = 0; k < S[i].ndim; k++)
			CHECK(dims[k] == S[i].global[k]);
		CHECK(H5Dread(d, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
		CHECK(memcmp(want, got, len) == 0);
		H5Sclose(s);
		H5Tclose(t);
		H5Dclose(d);
		free(want);
		free(got);
	}
	H5Fclose(f);
}

static int roundtrip(void)
{
	char dir[4096], cmd[4200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
	CHECK(system(cmd) == 0);
	snprintf(dir, sizeof dir, "%s/flush", out);
	make_data();
	struct snap_io_err err = {0};
	/* Step 3: LZ4 without O_DIRECT, where HDF5 writes the chunks itself. */
	for (uint64_t step = 1; step <= 3; step++) {
		int lz4 = step >= 2;
		write_step(dir, step, lz4 ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE, step == 3 ? SNAP_IO_NO_DIRECT : 0);
		for (uint32_t r = 0; r < WORLD; r++)
			check_rank(dir, step, r, lz4);
		size_t bad = 99;
		OK(snap_io_verify_step(dir, JOB, step, &bad, &err), &err);
		CHECK(bad == 0);
		char exp[4200];
		snprintf(exp, sizeof exp, "%s/export-%" PRIu64 "-copy.h5", out, step);
		OK(snap_io_export(dir, JOB, step, exp, SNAP_IO_EXPORT_COPY, &err), &err);
		check_export(exp);
		snprintf(exp, sizeof exp, "%s/export-%" PRIu64 "-virtual.h5", out, step);
		int rc = snap_io_export(dir, JOB, step, exp, SNAP_IO_EXPORT_VIRTUAL, &err);
		if (rc == 0 && !lz4) {
			/* in-process: snapio registered the codec filter (LZ4 needs
			 * the plugin, which this test keeps out of reach) */
			check_export(exp);
			printf("step %" PRIu64 ": virtual export over frames reads back\n", step);
		} else if (rc) {
			EXPECT_ERR(rc, SNAP_EUNSUPPORTED, &err, "--copy");
		}
		printf("step %" PRIu64 " (writer codec %s%s): listed, raw frames, decoded values, verify, export ok\n",
		       step, lz4 ? "lz4" : "none", step == 3 ? ", no O_DIRECT" : "");
	}
	for (uint32_t r = 0; r < WORLD; r++)
		for (size_t i = 0; i < NS; i++) {
			if (S[i].codec && I[r][i].held)
				io_t_frames_free(&I[r][i].fr);
			else
				free(I[r][i].vals);
		}
	printf("io_frames roundtrip: ok\n");
	return 0;
}

/* ---- faults --------------------------------------------------------------- */

#define FN 5000
#define FE 1024
static float FV[FN], RV[1000];

static int entries_in(const char *path)
{
	char cmd[4400];
	snprintf(cmd, sizeof cmd, "test -z \"$(ls -A '%s' 2>/dev/null)\"", path);
	return system(cmd) != 0;
}

/* One rank (world 1): frame region "w" over f and raw region "r". */
static int put(const char *dir, uint64_t step, const struct io_t_frames *f, void (*edit)(struct snap_io_region *),
	       struct snap_io_err *err)
{
	struct snap_io_writer *w = snap_io_writer_new(NULL, err);
	CHECK(w);
	uint64_t g[1] = {FN}, o[1] = {0}, gr[1] = {1000};
	struct snap_io_region reg[2] = {io_t_region("w", SNAP_DTYPE_F32, 1, g, o, g, FV),
					io_t_region("r", SNAP_DTYPE_F32, 1, gr, o, gr, RV)};
	io_t_frames_attach(&reg[0], f);
	if (edit)
		edit(&reg[0]);
	int rc = snap_io_write_rank(w, dir, JOB, step, 0, 1, reg, 2, NULL, err);
	snap_io_writer_free(w);
	return rc;
}

/* Writing with region "w" changed by edit must fail with code, naming what
 * m1 and m2 say, and leave nothing behind. */
static void refused(const char *dir, const struct io_t_frames *f, void (*edit)(struct snap_io_region *), int code,
		    const char *m1, const char *m2)
{
	struct snap_io_err err = {0};
	EXPECT_ERR(put(dir, 1, f, edit, &err), code, &err, m1, m2);
	char sdir[4200];
	snprintf(sdir, sizeof sdir, "%s/" JOB "/step-1", dir);
	CHECK(!entries_in(sdir)); /* no rank file, no temp file left */
}

static struct io_t_frames F, FB;
static uint32_t bad_crc[FN / FE + 1];
static const void *swapped[FN / FE + 1];
static uint64_t swapped_len[FN / FE + 1], long_len[FN / FE + 1];
static uint32_t swapped_crc[FN / FE + 1];
static unsigned char *hdr_copy;
static const void *hdr_frames[FN / FE + 1];
static uint32_t hdr_crc[FN / FE + 1];

static void e_crc(struct snap_io_region *r) { r->frame_crc = bad_crc; }
static void e_dtype(struct snap_io_region *r)
{ /* bf16 frames of the right counts under an f32 region */
	r->frame = (const void *const *)FB.frame;
	r->frame_len = FB.len;
	r->frame_crc = FB.crc;
}
static void e_count(struct snap_io_region *r)
{
	r->frame = swapped;
	r->frame_len = swapped_len;
	r->frame_crc = swapped_crc;
}
static void e_nframes(struct snap_io_region *r) { r->nframes--; }
static void e_fe(struct snap_io_region *r) { r->frame_elems = 2048; }
static void e_header(struct snap_io_region *r)
{
	r->frame = hdr_frames;
	r->frame_crc = hdr_crc;
}
static void e_len(struct snap_io_region *r) { r->frame_len = long_len; }
static void e_zero(struct snap_io_region *r)
{
	static uint64_t zero_len[FN / FE + 1];
	memcpy(zero_len, F.len, sizeof zero_len);
	zero_len[2] = 0;
	r->frame_len = zero_len;
}
static void e_i32(struct snap_io_region *r) { r->dtype = SNAP_DTYPE_I32; }
static void e_null(struct snap_io_region *r) { r->frame_crc = NULL; }

static off_t chunk_addr(const char *path, const char *ds, uint64_t at, hsize_t *size)
{
	hid_t f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT), d = H5Dopen2(f, ds, H5P_DEFAULT);
	hsize_t off[1] = {at};
	unsigned mask = 1;
	haddr_t addr = 0;
	CHECK(f >= 0 && d >= 0 && H5Dget_chunk_info_by_coord(d, off, &mask, &addr, size) >= 0 && mask == 0);
	H5Dclose(d);
	H5Fclose(f);
	return (off_t)addr;
}

static void flip(const char *path, off_t at)
{
	int fd = open(path, O_RDWR);
	unsigned char c;
	CHECK(fd >= 0 && pread(fd, &c, 1, at) == 1);
	c ^= 0x04;
	CHECK(pwrite(fd, &c, 1, at) == 1);
	close(fd);
}

/* The filter function as HDF5 calls it to read a chunk. */
static size_t run_filter(unsigned flags, int dtype, uint64_t elems, const void *src, size_t len, void **out)
{
	unsigned cd[SNAP_IO_CODEC_CD_N] = {SNAP_IO_CODEC_CD_VERSION, (unsigned)dtype, (unsigned)elems, (unsigned)(elems >> 32)};
	void *buf = H5allocate_memory(len, 0);
	CHECK(buf);
	memcpy(buf, src, len);
	size_t bsz = len;
	size_t n = io_codec_filter_class.filter(flags, SNAP_IO_CODEC_CD_N, cd, len, &bsz, &buf);
	if (n == 0) {
		H5free_memory(buf);
		*out = NULL;
	} else {
		CHECK(bsz >= n);
		*out = buf;
	}
	return n;
}

static void filter_unit(void)
{
	void *o;
	uint32_t last = F.n - 1;
	size_t llen = (size_t)F.len[last];
	uint64_t lvals = FN - (uint64_t)last * FE;
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_F32, FE, F.frame[last], llen, &o) == FE * 4);
	CHECK(memcmp(o, (float *)F.decoded + last * FE, lvals * 4) == 0);
	for (uint64_t k = lvals; k < FE; k++)
		CHECK(((float *)o)[k] == 0.0f); /* short last frame: zero-padded to the chunk */
	H5free_memory(o);
	CHECK(run_filter(0, SNAP_DTYPE_F32, FE, F.frame[0], (size_t)F.len[0], &o) == 0);             /* encoding */
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_BF16, FE, F.frame[0], (size_t)F.len[0], &o) == 0); /* dtype */
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_F32, FE / 2, F.frame[0], (size_t)F.len[0], &o) == 0); /* count */
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_F32, FE, F.frame[0], (size_t)F.len[0] - 1, &o) == 0); /* short */
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_I32, FE, F.frame[0], (size_t)F.len[0], &o) == 0);
	CHECK(run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_F32, FE, RV, sizeof RV, &o) == 0);            /* garbage */
	unsigned char *bad = malloc(llen);
	CHECK(bad);
	memcpy(bad, F.frame[last], llen);
	bad[llen - 5] ^= 0xFF; /* payload: must not decode to anything out of bounds */
	size_t n = run_filter(H5Z_FLAG_REVERSE, SNAP_DTYPE_F32, FE, bad, llen, &o);
	if (n)
		H5free_memory(o);
	free(bad);
	printf("filter function: decodes and zero-pads; refuses encoding, wrong dtype/count, short and garbage "
	       "streams\n");
}

static int faults(void)
{
	char dir[4096], cmd[4200], path[4200];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", out, out);
	CHECK(system(cmd) == 0);
	snprintf(dir, sizeof dir, "%s/flush", out);
	fill_f32(FV, FN);
	fill_f32(RV, 1000);
	io_t_frames_make(&F, SNAP_DTYPE_F32, SNAP_CODEC_LOSSLESS, 0, FV, FN, FE);
	uint16_t *bv = malloc(FN * 2);
	CHECK(bv && snap_codec_convert(SNAP_DTYPE_BF16, bv, SNAP_DTYPE_F32, FV, FN) == 0);
	io_t_frames_make(&FB, SNAP_DTYPE_BF16, SNAP_CODEC_LOSSLESS, 0, bv, FN, FE);
	free(bv);
	CHECK(F.n == 5);
	for (uint32_t k = 0; k < F.n; k++) {
		bad_crc[k] = F.crc[k] ^ (k == 3);
		uint32_t s = k == 0 ? 4 : k == 4 ? 0 : k;
		swapped[k] = F.frame[s];
		swapped_len[k] = F.len[s];
		swapped_crc[k] = F.crc[s];
		hdr_frames[k] = F.frame[k];
		hdr_crc[k] = F.crc[k];
		long_len[k] = F.len[k] + (k == 2);
	}
	/* frame 2 gets a byte of room after it, for long_len (one byte more
	 * than its stream); hdr_frames' frame 2 is a copy with a broken magic
	 * (and a CRC that matches the broken copy) */
	size_t len2 = (size_t)F.len[2];
	unsigned char *f2 = malloc(len2 + 1);
	CHECK(f2 && (hdr_copy = malloc(len2)) != NULL);
	memcpy(f2, F.frame[2], len2);
	f2[len2] = 0;
	free(F.frame[2]);
	F.frame[2] = f2;
	memcpy(hdr_copy, f2, len2);
	hdr_copy[0] ^= 0x55;
	hdr_frames[2] = hdr_copy;
	hdr_crc[2] = snap_io_crc32c(hdr_copy, len2);

	printf("frames that lie are refused before anything is written\n");
	refused(dir, &F, e_crc, SNAP_ECORRUPT, "\"w\"", "frame 3 does not match its CRC32C");
	refused(dir, &F, e_dtype, SNAP_EINVAL, "\"w\" frame 0", "bf16");
	refused(dir, &F, e_count, SNAP_EINVAL, "\"w\" frame 0", "header says 904");
	refused(dir, &F, e_nframes, SNAP_EINVAL, "\"w\"", "4 frames given");
	refused(dir, &F, e_fe, SNAP_EINVAL, "\"w\"", "5 frames given");
	refused(dir, &F, e_header, SNAP_ECORRUPT, "\"w\" frame 2", "not a codec stream");
	refused(dir, &F, e_len, SNAP_EINVAL, "\"w\" frame 2", "frame_len");
	refused(dir, &F, e_zero, SNAP_EINVAL, "\"w\" frame 2", "0 bytes");
	refused(dir, &F, e_i32, SNAP_EINVAL, "\"w\"", "f32, bf16 or f16");
	refused(dir, &F, e_null, SNAP_EINVAL, "\"w\"", "NULL");

	struct snap_io_err err = {0};
	size_t bad;
	for (uint64_t step = 1; step <= 3; step++) {
		OK(put(dir, step, &F, NULL, &err), &err);
		OK(snap_io_step_seal(dir, JOB, step, 1, &err), &err);
	}
	float *vals = malloc(FN * 4), rv[1000];
	uint64_t cap = F.maxlen, flen[5];
	uint32_t fcrc[5];
	char *fb = malloc(F.n * cap);
	CHECK(vals && fb);
	struct snap_io_dest dec[2] = {{.name = "w", .buf = vals, .bytes = FN * 4}, {.name = "r", .buf = rv, .bytes = sizeof rv}};
	struct snap_io_dest raw = {.name = "w", .buf = fb, .bytes = F.n * cap, .frame_cap = cap, .frame_elems = FE,
				   .nframes = F.n, .frame_len = flen, .frame_crc = fcrc};
	OK(snap_io_read_rank(dir, JOB, 1, 0, dec, 2, &err), &err);
	CHECK(memcmp(vals, F.decoded, FN * 4) == 0 && memcmp(rv, RV, sizeof rv) == 0);
	OK(snap_io_read_rank(dir, JOB, 1, 0, &raw, 1, &err), &err);
	for (uint32_t k = 0; k < F.n; k++)
		CHECK(flen[k] == F.len[k] && fcrc[k] == F.crc[k] && memcmp(fb + k * cap, F.frame[k], flen[k]) == 0);

	printf("a byte flipped inside stored frame 2\n");
	snprintf(path, sizeof path, "%s/" JOB "/step-1/rank-0.h5", dir);
	hsize_t csz = 0;
	off_t at = chunk_addr(path, "w", 2 * FE, &csz);
	CHECK(csz == F.len[2]);
	flip(path, at + (off_t)csz / 2);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 1, &bad, &err), SNAP_ECORRUPT, &err, "step-1/rank-0.h5",
		   "dataset \"w\"", "frame 2", "CRC32C mismatch");
	CHECK(bad == 1);
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 1, 0, dec, 2, &err), SNAP_ECORRUPT, &err, "dataset \"w\"", "frame 2");
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 1, 0, &raw, 1, &err), SNAP_ECORRUPT, &err, "dataset \"w\"", "frame 2");
	OK(snap_io_read_rank(dir, JOB, 1, 0, &dec[1], 1, &err), &err); /* the raw region is fine */
	OK(snap_io_verify_step(dir, JOB, 2, &bad, &err), &err);        /* and so is the next step */

	printf("a byte flipped in frame 0's stored header\n");
	snprintf(path, sizeof path, "%s/" JOB "/step-2/rank-0.h5", dir);
	at = chunk_addr(path, "w", 0, &csz);
	flip(path, at + 1);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 2, &bad, &err), SNAP_ECORRUPT, &err, "dataset \"w\"", "frame 0");
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 2, 0, dec, 1, &err), SNAP_ECORRUPT, &err, "dataset \"w\"", "frame 0");

	printf("destinations that do not fit the frames\n");
	struct snap_io_dest t = raw;
	t.frame_cap = cap - 1;
	t.bytes = F.n * t.frame_cap;
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EMISMATCH, &err, "dataset \"w\"", "frame_cap");
	t = raw;
	t.frame_elems = 2048;
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EMISMATCH, &err, "dataset \"w\"", "5 frames of 1024");
	t = raw;
	t.nframes = 6;
	t.bytes = 6 * cap;
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EMISMATCH, &err, "dataset \"w\"", "6 of 1024");
	t = raw;
	t.bytes--;
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EINVAL, &err, "\"w\"", "frame_cap");
	t = raw;
	t.name = "r";
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EMISMATCH, &err, "dataset \"r\"",
		   "stored raw, not as codec frames");
	t = dec[0];
	t.bytes -= 4;
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), SNAP_EMISMATCH, &err, "dataset \"w\"", "20000 bytes");
	t = raw;
	t.frame_len = NULL;
	t.frame_crc = NULL;
	OK(snap_io_read_rank(dir, JOB, 3, 0, &t, 1, &err), &err); /* lengths and CRCs are optional */
	OK(snap_io_verify_step(dir, JOB, 3, &bad, &err), &err);

	printf("truncated rank file\n");
	snprintf(path, sizeof path, "%s/" JOB "/step-3/rank-0.h5", dir);
	struct stat st;
	CHECK(stat(path, &st) == 0 && truncate(path, st.st_size - 100) == 0);
	EXPECT_ERR(snap_io_verify_step(dir, JOB, 3, &bad, &err), SNAP_ETRUNC, &err, "step-3/rank-0.h5", "truncated");
	EXPECT_ERR(snap_io_read_rank(dir, JOB, 3, 0, dec, 1, &err), SNAP_ETRUNC, &err, "step-3/rank-0.h5");

	filter_unit();
	free(vals);
	free(fb);
	free(hdr_copy);
	io_t_frames_free(&F);
	io_t_frames_free(&FB);
	printf("io_frames faults: ok\n");
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc == 3);
	out = argv[2];
	if (strcmp(argv[1], "roundtrip") == 0)
		return roundtrip();
	if (strcmp(argv[1], "faults") == 0)
		return faults();
	fprintf(stderr, "usage: io_frames roundtrip|faults DIR\n");
	return 2;
}
