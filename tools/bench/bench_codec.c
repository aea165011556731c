/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_codec.c - `snapbench codec`: our lossless and lossy codecs side
 * by side with LZ4 (default level) and ZFP (fixed accuracy, same absolute
 * bound) on one input, all measured in this run on the same data.
 *
 * Throughput is uncompressed bytes of the benchmarked dtype per second, best
 * of --reps runs. LZ4 and ZFP run single-threaded; ours on --threads.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <lz4.h>
#ifdef SNAP_HAVE_ZFP
#include <zfp.h>
#endif

#include "cliopts.h"
#include "snap/codec.h"
#include "snapbench.h"

struct row {
	const char *codec;
	double ratio, comp_gbps, decomp_gbps, max_err;
	double bound;          /* absolute bound enforced; 0 for exact codecs */
	const char *note;
	int ok;
};

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: snapbench codec --input FILE --dtype f32|bf16|f16 [--bound B]\n"
		"                       [--rel R] [--threads N] [--reps N] [--json]\n"
		"  FILE holds raw little-endian f32 values; bf16/f16 are cast from them\n"
		"  (round to nearest even). --bound: absolute bound for our lossy codec\n"
		"  and ZFP's fixed-accuracy tolerance (default 1e-3). --rel R adds our\n"
		"  lossy codec with bound R * (max - min). --threads: our codecs only\n"
		"  (default 1; LZ4 and ZFP are single-threaded). --reps (default 5).\n");
}

static float elem(int dt, const void *p, size_t i)
{
	float f;
	if (dt == SNAP_DTYPE_F32)
		memcpy(&f, (const float *)p + i, 4);
	else
		snap_codec_convert(SNAP_DTYPE_F32, &f, dt, (const uint16_t *)p + i, 1);
	return f;
}

/* Max |x - y| over values finite in x; NaN/Inf in x must come back as is. */
static double max_err(int dt, const void *x, const void *y, size_t n, int *ok)
{
	double m = 0;
	for (size_t i = 0; i < n; i++) {
		float a = elem(dt, x, i), b = elem(dt, y, i);
		if (!isfinite(a)) {
			if (!(isnan(a) ? isnan(b) : a == b))
				*ok = 0;
			continue;
		}
		double d = fabs((double)a - (double)b);
		if (!(d <= m))
			m = isnan(d) ? INFINITY : d;
	}
	return m;
}

static int bench_ours(struct row *r, const struct snap_codec_params *p,
		      const void *in, size_t n, size_t es, unsigned threads,
		      int reps, void *out)
{
	size_t cap = snap_codec_bound(p, n), len = 0;
	uint8_t *s = malloc(cap ? cap : 1);
	if (!s)
		return -1;
	double bc = INFINITY, bd = INFINITY;
	for (int k = 0; k < reps; k++) {
		double t0 = now_s();
		int rc = snap_codec_compress_mt(p, in, n, s, cap, &len, threads);
		double t1 = now_s();
		if (rc) {
			fprintf(stderr, "bench codec: %s compress: %s\n", r->codec, snap_strerror(rc));
			free(s);
			return -1;
		}
		rc = snap_codec_decompress_mt(s, len, out, n * es, NULL, threads);
		double t2 = now_s();
		if (rc) {
			fprintf(stderr, "bench codec: %s decompress: %s\n", r->codec, snap_strerror(rc));
			free(s);
			return -1;
		}
		bc = fmin(bc, t1 - t0);
		bd = fmin(bd, t2 - t1);
	}
	struct snap_codec_info info;
	snap_codec_inspect(s, len, &info);
	r->bound = info.bound;
	r->ratio = (double)(n * es) / (double)len;
	r->comp_gbps = (double)(n * es) / bc / 1e9;
	r->decomp_gbps = (double)(n * es) / bd / 1e9;
	r->ok = 1;
	r->max_err = max_err(p->dtype, in, out, n, &r->ok);
	if (p->codec == SNAP_CODEC_LOSSLESS && memcmp(in, out, n * es))
		r->ok = 0;
	if (p->codec != SNAP_CODEC_LOSSLESS && r->max_err > info.bound)
		r->ok = 0;
	free(s);
	return 0;
}

static int bench_lz4(struct row *r, const void *in, size_t bytes, int reps, void *out)
{
	if (bytes > (size_t)LZ4_MAX_INPUT_SIZE)
		return -1;
	int cap = LZ4_compressBound((int)bytes), len = 0;
	char *s = malloc((size_t)cap);
	if (!s)
		return -1;
	double bc = INFINITY, bd = INFINITY;
	for (int k = 0; k < reps; k++) {
		double t0 = now_s();
		len = LZ4_compress_default(in, s, (int)bytes, cap);
		double t1 = now_s();
		int d = LZ4_decompress_safe(s, out, len, (int)bytes);
		double t2 = now_s();
		if (len <= 0 || d != (int)bytes) {
			free(s);
			return -1;
		}
		bc = fmin(bc, t1 - t0);
		bd = fmin(bd, t2 - t1);
	}
	r->ratio = (double)bytes / len;
	r->comp_gbps = bytes / bc / 1e9;
	r->decomp_gbps = bytes / bd / 1e9;
	r->max_err = 0;
	r->ok = memcmp(in, out, bytes) == 0;
	free(s);
	return 0;
}

#ifdef SNAP_HAVE_ZFP
/* ZFP on floats (bf16/f16 inputs upcast exactly); error measured against
 * those floats. bytes_ref: size of the benchmarked dtype, for ratio/GB/s. */
static int bench_zfp(struct row *r, const float *f, size_t n, size_t bytes_ref,
		     double tol, int reps)
{
	float *out = malloc(n * sizeof(float));
	zfp_field *field = zfp_field_1d((void *)f, zfp_type_float, n);
	zfp_field *ofield = zfp_field_1d(out, zfp_type_float, n);
	zfp_stream *zs = zfp_stream_open(NULL);
	zfp_stream_set_accuracy(zs, tol);
	size_t cap = zfp_stream_maximum_size(zs, field), len = 0;
	void *buf = malloc(cap);
	bitstream *bs = stream_open(buf, cap);
	zfp_stream_set_bit_stream(zs, bs);
	double bc = INFINITY, bd = INFINITY;
	int rc = 0;
	for (int k = 0; k < reps && !rc; k++) {
		zfp_stream_rewind(zs);
		double t0 = now_s();
		len = zfp_compress(zs, field);
		double t1 = now_s();
		zfp_stream_rewind(zs);
		size_t d = zfp_decompress(zs, ofield);
		double t2 = now_s();
		if (!len || !d)
			rc = -1;
		bc = fmin(bc, t1 - t0);
		bd = fmin(bd, t2 - t1);
	}
	if (!rc) {
		r->ratio = (double)bytes_ref / (double)len;
		r->comp_gbps = bytes_ref / bc / 1e9;
		r->decomp_gbps = bytes_ref / bd / 1e9;
		r->ok = 1;
		r->max_err = max_err(SNAP_DTYPE_F32, f, out, n, &r->ok);
	}
	zfp_field_free(field);
	zfp_field_free(ofield);
	stream_close(bs);
	zfp_stream_close(zs);
	free(buf);
	free(out);
	return rc;
}
#endif

struct codec_args {
	const char *input, *dtname;
	double bound, rel;
	unsigned threads;
	int reps, json;
};

/* SB_OK with a filled, -1 after --help, SB_USAGE. */
static int codec_parse(int argc, char **argv, struct codec_args *a)
{
	const char *bound = NULL, *rel = NULL, *threads = NULL, *reps = NULL;
	*a = (struct codec_args){ .dtname = "f32", .bound = 1e-3, .threads = 1, .reps = 5 };
	const struct cli_opt opts[] = {
		CLI_OPT_HELP,
		CLI_OPT_FLAG("json", 0, &a->json),
		CLI_OPT_STR("input", 0, &a->input),
		CLI_OPT_STR("dtype", 0, &a->dtname),
		CLI_OPT_STR("bound", 0, &bound),
		CLI_OPT_STR("rel", 0, &rel),
		CLI_OPT_STR("threads", 0, &threads),
		CLI_OPT_STR("reps", 0, &reps),
	};
	const struct cli c = BENCH_CLI("codec", usage, 1);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	a->bound = bound ? strtod(bound, NULL) : a->bound;
	a->rel = rel ? strtod(rel, NULL) : a->rel;
	a->threads = threads ? (unsigned)strtoul(threads, NULL, 10) : a->threads;
	a->reps = reps ? atoi(reps) : a->reps;
	return SB_OK;
}

/* --input's f32 values (*n of them), or NULL after a message. */
static float *codec_read(const char *input, size_t *n)
{
	FILE *fp = fopen(input, "rb");
	if (!fp) {
		fprintf(stderr, "bench codec: %s: %s\n", input, strerror(errno));
		return NULL;
	}
	fseek(fp, 0, SEEK_END);
	long fsz = ftell(fp);
	fseek(fp, 0, SEEK_SET);
	*n = fsz > 0 ? (size_t)fsz / 4 : 0;
	float *f = malloc(*n * 4 + 4);
	if (!f || fread(f, 4, *n, fp) != *n || *n == 0) {
		fprintf(stderr, "bench codec: cannot read f32 values from %s\n", input);
		fclose(fp);
		free(f);
		return NULL;
	}
	fclose(fp);
	return f;
}

/* The values as the benchmarked dtype (in) and back as f32 (up), n of them. */
struct codec_input {
	int dt;
	size_t n, es, bytes;
	void *in;
	float *up;
};

/* Every codec's row on the input; how many rows, *fail when one could not run. */
static int codec_rows(const struct codec_args *a, const struct codec_input *x, void *out, struct row *rows, int *fail)
{
	int nr = 0;
	struct snap_codec_params p = { SNAP_CODEC_LOSSLESS, x->dt, 0, 0 };
	rows[nr] = (struct row){ .codec = "snap-lossless", .note = "bit-exact" };
	if (bench_ours(&rows[nr], &p, x->in, x->n, x->es, a->threads, a->reps, out)) *fail = 1; else nr++;
	p.codec = SNAP_CODEC_LOSSY_ABS;
	p.bound = a->bound;
	rows[nr] = (struct row){ .codec = "snap-lossy", .note = "abs bound" };
	if (bench_ours(&rows[nr], &p, x->in, x->n, x->es, a->threads, a->reps, out)) *fail = 1; else nr++;
	static char relnote[64];
	if (a->rel > 0) {
		p.codec = SNAP_CODEC_LOSSY_REL;
		p.bound = a->rel;
		rows[nr] = (struct row){ .codec = "snap-lossy-rel" };
		if (bench_ours(&rows[nr], &p, x->in, x->n, x->es, a->threads, a->reps, out)) {
			*fail = 1;
		} else {
			snprintf(relnote, sizeof(relnote), "bound %.3g", rows[nr].bound);
			rows[nr++].note = relnote;
		}
	}
	rows[nr] = (struct row){ .codec = "lz4", .note = "default level" };
	if (bench_lz4(&rows[nr], x->in, x->bytes, a->reps, out)) *fail = 1; else nr++;
#ifdef SNAP_HAVE_ZFP
	rows[nr] = (struct row){ .codec = "zfp",
		.note = x->dt == SNAP_DTYPE_F32 ? "fixed accuracy" : "fixed accuracy, on upcast f32",
		.bound = a->bound };
	if (bench_zfp(&rows[nr], x->up, x->n, x->bytes, a->bound, a->reps)) *fail = 1; else nr++;
#else
	fprintf(stderr, "bench codec: built without libzfp; ZFP row left out\n");
#endif
	return nr;
}

static void codec_print(const struct codec_args *a, size_t n, const struct row *rows, int nr)
{
	if (a->json) {
		printf("[");
		for (int i = 0; i < nr; i++)
			printf("%s\n {\"codec\": \"%s\", \"dtype\": \"%s\", \"values\": %zu, \"threads\": %u, "
			       "\"bound\": %.6g, \"ratio\": %.4f, \"comp_gbps\": %.4f, \"decomp_gbps\": %.4f, "
			       "\"max_err\": %.6g, \"ok\": %s}",
			       i ? "," : "", rows[i].codec, a->dtname, n,
			       strncmp(rows[i].codec, "snap", 4) ? 1 : a->threads,
			       rows[i].bound,
			       rows[i].ratio, rows[i].comp_gbps, rows[i].decomp_gbps, rows[i].max_err,
			       rows[i].ok ? "true" : "false");
		printf("\n]\n");
		return;
	}
	printf("input %s: %zu values, dtype %s, bound %g, threads %u (ours), best of %d\n",
	       a->input, n, a->dtname, a->bound, a->threads, a->reps);
	printf("%-15s %7s %10s %12s %11s  %s\n", "codec", "ratio", "comp GB/s",
	       "decomp GB/s", "max err", "note");
	for (int i = 0; i < nr; i++)
		printf("%-15s %7.3f %10.3f %12.3f %11.4g  %s%s\n", rows[i].codec, rows[i].ratio,
		       rows[i].comp_gbps, rows[i].decomp_gbps, rows[i].max_err, rows[i].note,
		       rows[i].ok ? "" : "  ** FAILED CHECK **");
}

int cmd_bench_codec(int argc, char **argv)
{
	struct codec_args A;
	int rc = codec_parse(argc, argv, &A);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	struct codec_input x = { .dt = !strcmp(A.dtname, "f32")	 ? SNAP_DTYPE_F32
				       : !strcmp(A.dtname, "bf16") ? SNAP_DTYPE_BF16
				       : !strcmp(A.dtname, "f16")  ? SNAP_DTYPE_F16
								   : -1 };
	if (!A.input || x.dt < 0 || !(A.bound > 0) || A.rel < 0 || A.reps < 1 || A.threads < 1 || A.threads > 64) {
		usage(stderr);
		return SB_USAGE;
	}
	float *f = codec_read(A.input, &x.n);
	if (!f)
		return SB_FAIL;
	x.es = snap_dtype_size(x.dt);
	x.bytes = x.n * x.es;
	x.in = malloc(x.bytes);
	x.up = malloc(x.n * 4);
	void *out = malloc(x.bytes);
	snap_codec_convert(x.dt, x.in, SNAP_DTYPE_F32, f, x.n);
	snap_codec_convert(SNAP_DTYPE_F32, x.up, x.dt, x.in, x.n); /* exact upcast for ZFP */

	struct row rows[5];
	int fail = 0;
	memset(rows, 0, sizeof(rows));
	int nr = codec_rows(&A, &x, out, rows, &fail);
	codec_print(&A, x.n, rows, nr);
	int bad = fail;
	for (int i = 0; i < nr; i++)
		if (!rows[i].ok && strcmp(rows[i].codec, "zfp"))
			bad = 1;
	free(f); free(x.in); free(out); free(x.up);
	return bad ? SB_FAIL : SB_OK;
}
