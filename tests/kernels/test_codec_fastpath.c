/* SPDX-License-Identifier: BSD-3-Clause */
/* The C twin's fast paths (SSE2, AVX2+F16C, unrolled packers) against its
 * plain scalar reference (snapc_quant, snapc_pack32): for many random and
 * adversarial arrays, every dtype, both codecs, several bounds and block
 * sizes, and 2-byte arrays built bit by bit to reach every branch of the
 * lossless coders (code-table windows, escape rates, raw exponents), each
 * SIMD level available here must write the same stream bytes as
 * the scalar level and decode any stream to the same values. */
#include "snap/codec.h"
#include "codec_impl.h"
#include "codec_testutil.h"

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

/* Every level against the scalar one on the n values of dtype dt at in. */
static void compare(int dt, const uint8_t *in, size_t n, uint32_t B, int codec,
		    double bound, const char *what)
{
	size_t es = snap_dtype_size(dt);
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
	/* Damaged copies (a few bytes changed after the block table, or, in
	 * a lossless stream, one exponent code of the first block set to any
	 * k-bit value: table codes, invalid ones, escapes): every level must
	 * give the scalar verdict and, if it decodes, its values. */
	size_t body = SNAP_CODEC_HEADER_BYTES + 4 * ((n + B - 1) / B);
	for (int t = 0; n && lref > body && t < 6; t++) {
		memcpy(s, ref, lref);
		uint32_t k = ref[body], nb = n < B ? (uint32_t)n : B;
		if (t % 2 && codec == SNAP_CODEC_LOSSLESS && k) {
			/* t 1: any code; t 3, 5: an escape code made a code above
			 * the table (invalid unless T = 2^k - 1: then itself) */
			uint32_t T = ref[body + 1], esc = (1u << k) - 1, i = (uint32_t)(tu_next() % nb);
			size_t c = body + 8 + T, bit;
			uint32_t v = (uint32_t)(tu_next() % (1u << k));
			for (uint32_t j = 0; t > 1 && j < nb; j++, i = (i + 1) % nb) {
				uint32_t code = 0;
				for (uint32_t b = 0; b < k; b++)
					code |= (uint32_t)(ref[c + ((size_t)i * k + b) / 8] >>
							   (((size_t)i * k + b) % 8) & 1) << b;
				if (code == esc) {
					v = T + (uint32_t)(tu_next() % (esc - T + 1));
					break;
				}
			}
			bit = (size_t)i * k;
			for (uint32_t b = 0; b < k; b++, bit++) {
				s[c + bit / 8] &= (uint8_t)~(1u << bit % 8);
				s[c + bit / 8] |= (uint8_t)((v >> b & 1) << bit % 8);
			}
		} else {
			for (int f = 0, nf = 1 + (int)(tu_next() % 3); f < nf; f++)
				s[body + tu_next() % (lref - body)] ^= (uint8_t)(1 + tu_next() % 255);
		}
		snapc_set_isa(SNAPC_ISA_SCALAR);
		int rc0 = snap_codec_decompress(s, lref, dref, n * es, NULL);
		for (int k = 0; k < nlevels; k++) {
			snapc_set_isa(levels[k]);
			rc = snap_codec_decompress(s, lref, d, n * es, NULL);
			CHECK(rc == rc0 && (rc || memcmp(d, dref, n * es) == 0),
			      "%s: damaged copy %d: level %d gives %d, scalar %d", what, t,
			      levels[k], rc, rc0);
		}
	}
	free(ref); free(s); free(dref); free(d);
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
	compare(dt, in, n, B, codec, bound, what);
	free(f); free(raw);
}

/* 2-byte values built from their bits, for the lossless coders: exponents
 * drawn (skewed) from a set of nsym exponents spread over a window of
 * `spread` values (so the code table spans one to many 16-wide windows),
 * a fraction pesc of them any exponent (escapes, incl. 0: zeros and
 * denormals, and the maximum: Inf and NaN), random sign and mantissa bits;
 * at byte offset off of the buffer. */
static void one_bits16(int dt, size_t n, uint32_t B, uint32_t nsym, uint32_t spread,
		       double pesc, size_t off)
{
	char what[200];
	const uint32_t E = dt == SNAP_DTYPE_BF16 ? 8 : 5, M = dt == SNAP_DTYPE_BF16 ? 7 : 10;
	const uint32_t emax = (1u << E) - 1;
	uint32_t sym[64];
	uint8_t *raw = malloc(2 * n + 8), *in = raw + off;
	if (spread > emax + 1)
		spread = emax + 1;
	uint32_t lo = (uint32_t)(tu_next() % (emax + 2 - spread));
	for (uint32_t t = 0; t < nsym; t++)
		sym[t] = lo + (uint32_t)(tu_next() % spread);
	for (size_t i = 0; i < n; i++) {
		uint32_t e, r = (uint32_t)tu_next();
		if (tu_unif() < pesc)
			e = (uint32_t)(tu_next() % (emax + 1));
		else /* symbol t with weight ~ 1/(t+1) */
			e = sym[(uint32_t)((double)nsym * tu_unif() * tu_unif()) % nsym];
		uint32_t v = (r >> 16 & 1) << (E + M) | e << M | (r & ((1u << M) - 1));
		in[2 * i] = (uint8_t)v;
		in[2 * i + 1] = (uint8_t)(v >> 8);
	}
	snprintf(what, sizeof(what), "bits16 dt=%d n=%zu B=%u nsym=%u spread=%u pesc=%g off=%zu",
		 dt, n, B, nsym, spread, pesc, off);
	compare(dt, in, n, B, SNAP_CODEC_LOSSLESS, 0, what);
	free(raw);
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
	/* exponent mixes of the 2-byte dtypes: table windows, escapes,
	 * lengths around chunk and block boundaries, unaligned buffers */
	static const uint32_t spreads[] = { 1, 2, 16, 17, 33, 64, 65, 100, 256 };
	static const double pescs[] = { 0, 0.001, 0.05, 0.3, 1 };
	static const size_t lens[] = { 32, 63, 64, 65, 255, 256, 288, 4064, 4096, 4127, 16384, 16416 };
	for (int it = 0; it < iters; it++)
		for (int r = 0; r < 400; r++) {
			int dt = r & 1 ? SNAP_DTYPE_BF16 : SNAP_DTYPE_F16;
			size_t n = r % 3 ? lens[tu_next() % (sizeof(lens) / sizeof(*lens))]
					 : (size_t)(tu_next() % 20000);
			one_bits16(dt, n, blocks[tu_next() % 3], 1 + (uint32_t)(tu_next() % 40),
				   spreads[tu_next() % (sizeof(spreads) / sizeof(*spreads))],
				   pescs[tu_next() % (sizeof(pescs) / sizeof(*pescs))],
				   (size_t)(tu_next() % 4));
		}
	snapc_set_isa(snapc_isa_detected);
	printf("%ld fast-path streams compared, %d failures\n", nstreams, tu_failures);
	return tu_failures ? 1 : 0;
}
