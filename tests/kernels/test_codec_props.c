/* SPDX-License-Identifier: BSD-3-Clause */
/* Property tests of both codecs over random and adversarial arrays: lossless
 * round-trips are bit-exact, every lossy value is within the bound (checked
 * per element in the target dtype), multi-threaded streams equal the
 * single-threaded ones, streams fit snap_codec_bound(). Unaligned buffers. */
#include "snap/codec.h"
#include "codec_testutil.h"

static const int dtypes[] = { SNAP_DTYPE_F32, SNAP_DTYPE_BF16, SNAP_DTYPE_F16 };

static float elem_f32(int dt, const uint8_t *p, size_t i)
{
	float f;
	if (dt == SNAP_DTYPE_F32) { memcpy(&f, p + 4 * i, 4); return f; }
	snap_codec_convert(SNAP_DTYPE_F32, &f, dt, p + 2 * i, 1);
	return f;
}

static void check_lossy(int dt, const uint8_t *in, const uint8_t *out, size_t n,
			double bound, const char *what)
{
	size_t es = snap_dtype_size(dt);
	for (size_t i = 0; i < n; i++) {
		float x = elem_f32(dt, in, i), y = elem_f32(dt, out, i);
		if (isnan(x) || isinf(x)) {
			CHECK(memcmp(in + i * es, out + i * es, es) == 0,
			      "%s: non-finite value %zu not exact", what, i);
			continue;
		}
		long double d = fabsl((long double)x - (long double)y);
		CHECK(d <= (long double)bound, "%s: |%.9g - %.9g| = %Lg > %g at %zu",
		      what, x, y, d, bound, i);
	}
}

static void one(int dt, int gen, size_t n, uint32_t B, int codec, double bound)
{
	char what[160];
	size_t es = snap_dtype_size(dt);
	float *f = malloc((n ? n : 1) * 4);
	uint8_t *raw = malloc(n * es + 8), *in = raw + 1;
	tu_gen(gen, f, n);
	snap_codec_convert(dt, in, SNAP_DTYPE_F32, f, n);
	snprintf(what, sizeof(what), "dt=%d gen=%s n=%zu B=%u codec=%d bound=%g",
		 dt, tu_gen_name[gen], n, B, codec, bound);

	struct snap_codec_params p = { codec, dt, bound, B };
	size_t cap = snap_codec_bound(&p, n);
	CHECK(cap > 0, "%s: bound 0", what);
	uint8_t *s1 = malloc(cap + 3), *s2 = malloc(cap), *s1u = s1 + 3;
	size_t l1 = 0, l2 = 0;
	int rc = snap_codec_compress(&p, in, n, s1u, cap, &l1);
	CHECK(rc == 0, "%s: compress rc %d", what, rc);
	rc = snap_codec_compress_mt(&p, in, n, s2, cap, &l2, 3);
	CHECK(rc == 0 && l1 == l2 && memcmp(s1u, s2, l1) == 0, "%s: mt stream differs", what);
	CHECK(l1 <= cap, "%s: %zu > bound %zu", what, l1, cap);

	struct snap_codec_info info;
	rc = snap_codec_inspect(s1u, l1, &info);
	CHECK(rc == 0 && info.stream_len == l1 && info.count == n && info.dtype == dt,
	      "%s: inspect rc %d", what, rc);

	/* The bound every lossy value is checked against is the test's own (ABS)
	 * or computed here from the input (REL), never the header's: an encoder
	 * that records and enforces a looser bound must fail. */
	double want = bound;
	int fallback_ok = codec == SNAP_CODEC_LOSSLESS;
	if (codec == SNAP_CODEC_LOSSY_REL) {
		float lo = INFINITY, hi = -INFINITY;
		for (size_t i = 0; i < n; i++) {
			float x = elem_f32(dt, in, i);
			if (isfinite(x)) { lo = fminf(lo, x); hi = fmaxf(hi, x); }
		}
		want = lo <= hi ? bound * ((double)hi - (double)lo) : 0.0;
		/* LOSSLESS instead only when that bound cannot be a quantization
		 * step: not positive and below 1e300, or 2*bound under the smallest
		 * normal float (codec.h, snap_codec_check). */
		fallback_ok = !(want > 0.0 && want < 1.0e300 && 2.0 * want >= FLT_MIN);
	}
	if (rc == 0) {
		if (fallback_ok)
			CHECK(info.codec == SNAP_CODEC_LOSSLESS && info.bound == 0.0,
			      "%s: codec %d bound %g, want lossless", what, info.codec, info.bound);
		else
			CHECK(info.codec == codec && info.bound == want,
			      "%s: codec %d bound %g, want codec %d bound %g", what,
			      info.codec, info.bound, codec, want);
	}

	uint8_t *oraw = malloc(n * es + 8), *out = oraw + 3;
	size_t cnt = 99;
	rc = snap_codec_decompress(s1u, l1, out, n * es, &cnt);
	CHECK(rc == 0 && cnt == n, "%s: decompress rc %d", what, rc);
	if (rc == 0) {
		if (fallback_ok)
			CHECK(memcmp(in, out, n * es) == 0, "%s: lossless mismatch", what);
		else
			check_lossy(dt, in, out, n, want, what);
	}
	uint8_t *out2 = malloc(n * es + 1);
	rc = snap_codec_decompress_mt(s1u, l1, out2, n * es, NULL, 4);
	CHECK(rc == 0 && memcmp(out, out2, n * es) == 0, "%s: mt decode differs", what);
	if (n) {
		rc = snap_codec_decompress(s1u, l1, out2, n * es - 1, NULL);
		CHECK(rc == SNAP_EOVERFLOW, "%s: short dst rc %d", what, rc);
		rc = snap_codec_compress(&p, in, n, s2, l1 - 1, &l2);
		CHECK(rc == SNAP_EOVERFLOW, "%s: short stream dst rc %d", what, rc);
	}
	free(out2); free(oraw); free(s1); free(s2); free(raw); free(f);
}

static void ratio_sanity(void)
{
	/* Weights-like data must actually shrink: a codec that stores raw passes
	 * round-trips but fails here. */
	size_t n = 100000;
	float *f = malloc(n * 4);
	tu_gen(GEN_GAUSS, f, n);
	struct snap_codec_params p = { SNAP_CODEC_LOSSLESS, SNAP_DTYPE_F32, 0, 0 };
	size_t cap = snap_codec_bound(&p, n), len;
	uint8_t *s = malloc(cap);
	CHECK(snap_codec_compress(&p, f, n, s, cap, &len) == 0 && (double)n * 4 / len > 1.1,
	      "lossless gauss ratio %.3f", (double)n * 4 / len);
	p.codec = SNAP_CODEC_LOSSY_ABS;
	p.bound = 1e-3;
	CHECK(snap_codec_compress(&p, f, n, s, cap, &len) == 0 && (double)n * 4 / len > 3.0,
	      "lossy gauss ratio %.3f", (double)n * 4 / len);
	/* REL on a spread-out tensor must quantize, not fall back to LOSSLESS. */
	p.codec = SNAP_CODEC_LOSSY_REL;
	p.bound = 1e-3;
	cap = snap_codec_bound(&p, n);
	struct snap_codec_info info = {0};
	CHECK(snap_codec_compress(&p, f, n, s, cap, &len) == 0 &&
	      snap_codec_inspect(s, len, &info) == 0 && info.codec == SNAP_CODEC_LOSSY_REL &&
	      (double)n * 4 / len > 3.0,
	      "rel gauss codec %d ratio %.3f", info.codec, (double)n * 4 / len);
	free(s); free(f);
}

static void params(void)
{
	struct snap_codec_params p = { SNAP_CODEC_LOSSY_ABS, SNAP_DTYPE_F32, 0.0, 0 };
	CHECK(snap_codec_check(&p) == SNAP_ERANGE, "bound 0");
	p.bound = NAN; CHECK(snap_codec_check(&p) == SNAP_ERANGE, "bound nan");
	p.bound = -1; CHECK(snap_codec_check(&p) == SNAP_ERANGE, "bound <0");
	p.bound = 1e-45; CHECK(snap_codec_check(&p) == SNAP_ERANGE, "bound tiny");
	p.bound = 1e39; CHECK(snap_codec_check(&p) == 0, "bound 1e39: step FLT_MAX");
	p.bound = 1e301; CHECK(snap_codec_check(&p) == SNAP_ERANGE, "bound huge");
	p.bound = 1e-3; p.block_elems = 1000; CHECK(snap_codec_check(&p) == SNAP_EINVAL, "block 1000");
	p.block_elems = 128; CHECK(snap_codec_check(&p) == SNAP_EINVAL, "block 128");
	p.block_elems = 32768; CHECK(snap_codec_check(&p) == SNAP_EINVAL, "block 32768");
	p.block_elems = 0; p.dtype = SNAP_DTYPE_F64; CHECK(snap_codec_check(&p) == SNAP_EINVAL, "f64");
	p.dtype = SNAP_DTYPE_F32; p.codec = 9; CHECK(snap_codec_check(&p) == SNAP_EINVAL, "codec 9");
	CHECK(snap_codec_bound(&p, 10) == 0, "bound of bad params");
	/* Rounding conversions against known values. */
	float one = 1.0f, r;
	uint16_t h;
	snap_codec_convert(SNAP_DTYPE_F16, &h, SNAP_DTYPE_F32, &one, 1);
	CHECK(h == 0x3c00, "f16(1) = %x", h);
	float t = 65520.0f;
	snap_codec_convert(SNAP_DTYPE_F16, &h, SNAP_DTYPE_F32, &t, 1);
	CHECK(h == 0x7c00, "f16(65520) = %x", h);
	t = 5.9604645e-8f; /* 2^-24: smallest f16 subnormal */
	snap_codec_convert(SNAP_DTYPE_F16, &h, SNAP_DTYPE_F32, &t, 1);
	snap_codec_convert(SNAP_DTYPE_F32, &r, SNAP_DTYPE_F16, &h, 1);
	CHECK(h == 1 && r == t, "f16 subnormal %x", h);
	t = 1.00390625f; /* 1 + 2^-8: ties to even in bf16 -> 1.0 */
	snap_codec_convert(SNAP_DTYPE_BF16, &h, SNAP_DTYPE_F32, &t, 1);
	CHECK(h == 0x3f80, "bf16 tie %x", h);
	/* Every f16 value survives f16 -> f32 -> f16. */
	for (uint32_t v = 0; v < 65536; v++) {
		uint16_t a = (uint16_t)v, b;
		snap_codec_convert(SNAP_DTYPE_F32, &r, SNAP_DTYPE_F16, &a, 1);
		snap_codec_convert(SNAP_DTYPE_F16, &b, SNAP_DTYPE_F32, &r, 1);
		if ((a & 0x7c00) == 0x7c00 && (a & 0x3ff))
			CHECK((b & 0x7e00) == 0x7e00 || (b & 0x7e00) == 0xfe00, "f16 nan %x", a);
		else
			CHECK(a == b, "f16 roundtrip %x -> %x", a, b);
	}
}

int main(void)
{
	const size_t lens_small[] = { 0, 1, 2, 31, 32, 33, 255, 256, 257, 1000 };
	params();
	ratio_sanity();
	for (int d = 0; d < 3; d++) {
		for (int g = 0; g < GEN_COUNT; g++) {
			for (size_t li = 0; li < sizeof(lens_small) / sizeof(*lens_small); li++) {
				size_t n = lens_small[li];
				one(dtypes[d], g, n, 256, SNAP_CODEC_LOSSLESS, 0);
				one(dtypes[d], g, n, 256, SNAP_CODEC_LOSSY_ABS, 1e-3);
				one(dtypes[d], g, n, 256, SNAP_CODEC_LOSSY_REL, 1e-2);
			}
			const size_t B = SNAP_CODEC_BLOCK_DEFAULT;
			const size_t lens_big[] = { B - 1, B, B + 1, 3 * B + 17 };
			for (size_t li = 0; li < 4; li++) {
				size_t n = lens_big[li];
				one(dtypes[d], g, n, 0, SNAP_CODEC_LOSSLESS, 0);
				one(dtypes[d], g, n, 0, SNAP_CODEC_LOSSY_ABS, 1e-3);
				one(dtypes[d], g, n, 0, SNAP_CODEC_LOSSY_ABS, 0.25);
				one(dtypes[d], g, n, 0, SNAP_CODEC_LOSSY_ABS, 1e-30);
				one(dtypes[d], g, n, 0, SNAP_CODEC_LOSSY_ABS, 1e30);
				one(dtypes[d], g, n, 16384, SNAP_CODEC_LOSSY_REL, 1e-3);
			}
			/* random lengths and bounds */
			for (int r = 0; r < 6; r++) {
				size_t n = tu_next() % 20000;
				double b = pow(10.0, -7.0 + 8.0 * tu_unif());
				one(dtypes[d], g, n, 512u << (tu_next() % 5), SNAP_CODEC_LOSSY_ABS, b);
				one(dtypes[d], g, n, 512u << (tu_next() % 5), SNAP_CODEC_LOSSLESS, 0);
			}
		}
	}
	if (tu_failures) {
		fprintf(stderr, "%d failures\n", tu_failures);
		return 1;
	}
	printf("codec property tests passed\n");
	return 0;
}
