/* The C twin's fast paths (SSE2, AVX2+F16C, unrolled packers) against its
 * plain scalar reference (snapc_quant, snapc_pack32): for many random and
 * adversarial arrays, every dtype, both codecs, several bounds and block
 * sizes, each SIMD level available here must write the same stream bytes as
 * the scalar level and decode any stream to the same values. */
#include "snap/codec.h"
#include "codec_impl.h"
#include "testutil.h"

static const int dtypes[] = { SNAP_DTYPE_F32, SNAP_DTYPE_BF16, SNAP_DTYPE_F16 };
static const double bounds[] = { 1e-3, 0.37, 1e-6, 1e-30, 12.0 };
static const uint32_t blocks[] = { 256, 4096, 16384 };

static int levels[3], nlevels;
static long nstreams;

/* Values of kind gen, with a sprinkle of specials in the gauss-like kinds so
 * the SIMD paths also see rejected lanes next to accepted ones. */
static void gen_values(int gen, float *f, size_t n, double scale)
{
	tu_gen(gen, f, n);
	if (gen == GEN_GAUSS || gen == GEN_RAMP)
		for (size_t i = 0; i < n; i++)
			f[i] *= (float)scale;
}

static void one(int dt, int gen, size_t n, uint32_t B, int codec, double bound, double scale)
{
	char what[200];
	size_t es = snap_dtype_size(dt);
	float *f = malloc((n ? n : 1) * 4);
	uint8_t *raw = malloc(n * es + 8), *in = raw + 1 + (n & 1); /* unaligned */
	gen_values(gen, f, n, scale);
	snap_codec_convert(dt, in, SNAP_DTYPE_F32, f, n);
	snprintf(what, sizeof(what), "dt=%d gen=%s n=%zu B=%u codec=%d bound=%g scale=%g",
		 dt, tu_gen_name[gen], n, B, codec, bound, scale);

	struct snap_codec_params p = { codec, dt, bound, B };
	size_t cap = snap_codec_bound(&p, n);
	uint8_t *ref = malloc(cap + 1), *s = malloc(cap + 1);
	uint8_t *dref = malloc(n * es + 1), *d = malloc(n * es + 1);
	size_t lref = 0, l = 0;

	snapc_set_isa(SNAPC_ISA_SCALAR);
	int rc = snap_codec_compress(&p, in, n, ref, cap, &lref);
	CHECK(rc == 0, "%s: scalar compress rc %d", what, rc);
	rc = snap_codec_decompress(ref, lref, dref, n * es, NULL);
	CHECK(rc == 0, "%s: scalar decompress rc %d", what, rc);
	for (int k = 0; k < nlevels; k++) {
		snapc_set_isa(levels[k]);
		rc = snap_codec_compress_mt(&p, in, n, s, cap, &l, 1 + (unsigned)(n % 3));
		CHECK(rc == 0 && l == lref && memcmp(s, ref, l) == 0,
		      "%s: level %d stream differs from the scalar reference", what, levels[k]);
		memset(d, 0xa5, n * es);
		rc = snap_codec_decompress(ref, lref, d, n * es, NULL);
		CHECK(rc == 0 && memcmp(d, dref, n * es) == 0,
		      "%s: level %d decodes differently", what, levels[k]);
		nstreams++;
	}
	if (codec == SNAP_CODEC_LOSSLESS)
		CHECK(memcmp(dref, in, n * es) == 0, "%s: lossless not exact", what);
	free(f); free(raw); free(ref); free(s); free(dref); free(d);
}

int main(int argc, char **argv)
{
	int iters = argc > 1 ? atoi(argv[1]) : 1;
	for (int lv = SNAPC_ISA_SSE2; lv <= SNAPC_ISA_AVX2; lv++)
		if (snapc_set_isa(lv) == lv)
			levels[nlevels++] = lv;
	printf("fast-path levels here:");
	for (int k = 0; k < nlevels; k++)
		printf(" %d", levels[k]);
	printf("\n");
	static const size_t sizes[] = { 0, 1, 31, 32, 33, 255, 256, 257, 1000, 4095, 4096, 4097, 16385 };
	for (int it = 0; it < iters; it++) {
		for (size_t di = 0; di < 3; di++)
			for (int gen = 0; gen < GEN_COUNT; gen++)
				for (size_t si = 0; si < sizeof(sizes) / sizeof(*sizes); si++) {
					size_t n = sizes[si];
					uint32_t B = blocks[(si + (size_t)gen) % 3];
					double scale = pow(10.0, (double)(tu_next() % 7) - 3.0);
					one(dtypes[di], gen, n, B, SNAP_CODEC_LOSSLESS, 0, scale);
					for (size_t bi = 0; bi < sizeof(bounds) / sizeof(*bounds); bi++)
						one(dtypes[di], gen, n, B, SNAP_CODEC_LOSSY_ABS, bounds[bi], scale);
					one(dtypes[di], gen, n, B, SNAP_CODEC_LOSSY_REL, 1e-3, scale);
				}
		/* random lengths, dtypes, generators and bounds */
		for (int r = 0; r < 300; r++) {
			int dt = dtypes[tu_next() % 3], gen = (int)(tu_next() % GEN_COUNT);
			size_t n = (size_t)(tu_next() % 40000);
			double bound = pow(10.0, -(double)(tu_next() % 9)) * (0.5 + tu_unif());
			double scale = pow(10.0, (double)(tu_next() % 9) - 4.0);
			uint32_t B = blocks[tu_next() % 3];
			one(dt, gen, n, B, r % 4 ? SNAP_CODEC_LOSSY_ABS : SNAP_CODEC_LOSSLESS, bound, scale);
		}
	}
	snapc_set_isa(snapc_isa_detected);
	printf("%ld fast-path streams compared, %d failures\n", nstreams, tu_failures);
	return tu_failures ? 1 : 0;
}
