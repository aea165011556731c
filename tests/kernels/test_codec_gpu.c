/* SPDX-License-Identifier: BSD-3-Clause */
/* GPU twin equality: for every dtype, codec and array kind, the CUDA kernels
 * must write the same bytes as the C twin, the GPU must decode C streams to
 * the C twin's output, and corrupted streams must be refused on the GPU too.
 * Also prints GPU throughput on the real weights when given a file.
 * Exits 77 (ctest SKIP) when no usable GPU is present.
 * Usage: test_codec_gpu [--quick|--tiny] [weights.f32]
 * --quick: three lengths only, for runs under compute-sanitizer's memcheck;
 * --tiny: one length and two corruptions per case, for its racecheck. */
#include <cuda_runtime_api.h>

#include "snap/codec.h"
#include "seeds.h"
#include "codec_testutil.h"

#include "../cuda_check.h"
#include "../skiprule.h"

static const int dtypes[] = { SNAP_DTYPE_F32, SNAP_DTYPE_BF16, SNAP_DTYPE_F16 };
static int flips = 20; /* corrupted copies decoded per case */

/* Compress on the GPU; returns the stream (malloc'd) and its length. */
static uint8_t *gpu_compress(const struct snap_codec_params *p, const void *in,
			     size_t n, size_t *len, float *ms)
{
	size_t es = snap_dtype_size(p->dtype), cap = snap_codec_bound(p, n);
	size_t sl = snap_codec_cuda_scratch_size(p, n);
	void *d_in, *d_out, *d_sc;
	uint64_t *d_len, hlen = 0;
	CU(cudaMalloc(&d_in, n * es + 1));
	CU(cudaMalloc(&d_out, cap));
	CU(cudaMalloc(&d_sc, sl + 1));
	CU(cudaMalloc((void **)&d_len, 8));
	CU(cudaMemcpy(d_in, in, n * es, cudaMemcpyHostToDevice));
	cudaEvent_t e0, e1;
	CU(cudaEventCreate(&e0));
	CU(cudaEventCreate(&e1));
	CU(cudaEventRecord(e0, 0));
	int rc = snap_codec_cuda_compress(p, d_in, n, d_out, cap, d_sc, sl, d_len, NULL);
	CU(cudaEventRecord(e1, 0));
	CHECK(rc == 0, "cuda compress rc %d", rc);
	CU(cudaDeviceSynchronize());
	if (ms)
		CU(cudaEventElapsedTime(ms, e0, e1));
	CU(cudaMemcpy(&hlen, d_len, 8, cudaMemcpyDeviceToHost));
	uint8_t *s = malloc(cap);
	CHECK(hlen <= cap, "gpu length %llu > cap", (unsigned long long)hlen);
	if (hlen > cap) hlen = 0;
	CU(cudaMemcpy(s, d_out, hlen, cudaMemcpyDeviceToHost));
	*len = hlen;
	cudaFree(d_in); cudaFree(d_out); cudaFree(d_sc); cudaFree(d_len);
	cudaEventDestroy(e0); cudaEventDestroy(e1);
	return s;
}

/* Decode on the GPU; returns the device status (0 or SNAP_E*). */
static int gpu_decompress(const uint8_t *s, size_t len, void *out, size_t out_bytes, float *ms)
{
	struct snap_codec_info info;
	int rc = snap_codec_inspect(s, len, &info);
	if (rc)
		return rc;
	void *d_s, *d_o, *d_sc;
	int *d_st, st = 1;
	size_t sl = snap_codec_cuda_decode_scratch_size(&info);
	CU(cudaMalloc(&d_s, len + 1));
	CU(cudaMalloc(&d_o, out_bytes + 1));
	CU(cudaMalloc(&d_sc, sl + 8));
	CU(cudaMalloc((void **)&d_st, sizeof(int)));
	CU(cudaMemcpy(d_s, s, len, cudaMemcpyHostToDevice));
	cudaEvent_t e0, e1;
	CU(cudaEventCreate(&e0));
	CU(cudaEventCreate(&e1));
	CU(cudaEventRecord(e0, 0));
	rc = snap_codec_cuda_decompress(&info, d_s, len, d_o, out_bytes, d_sc, sl, d_st, NULL);
	CU(cudaEventRecord(e1, 0));
	CU(cudaDeviceSynchronize());
	if (ms)
		CU(cudaEventElapsedTime(ms, e0, e1));
	if (rc == 0) {
		CU(cudaMemcpy(&st, d_st, sizeof(int), cudaMemcpyDeviceToHost));
		rc = st;
		if (out_bytes)
			CU(cudaMemcpy(out, d_o, out_bytes, cudaMemcpyDeviceToHost));
	}
	cudaFree(d_s); cudaFree(d_o); cudaFree(d_sc); cudaFree(d_st);
	cudaEventDestroy(e0); cudaEventDestroy(e1);
	return rc;
}

static void twin(int dt, int gen, size_t n, uint32_t B, int codec, double bound)
{
	size_t es = snap_dtype_size(dt);
	float *f = malloc((n ? n : 1) * 4);
	uint8_t *in = malloc(n * es + 1);
	tu_gen(gen, f, n);
	snap_codec_convert(dt, in, SNAP_DTYPE_F32, f, n);
	struct snap_codec_params p = { codec, dt, bound, B };
	size_t cap = snap_codec_bound(&p, n), lc = 0, lg = 0;
	uint8_t *sc = malloc(cap);
	CHECK(snap_codec_compress(&p, in, n, sc, cap, &lc) == 0, "cpu compress");
	uint8_t *sg = gpu_compress(&p, in, n, &lg, NULL);
	size_t at = 0;
	while (at < lc && at < lg && sc[at] == sg[at])
		at++;
	CHECK(lc == lg && at == lc,
	      "dt=%d gen=%s n=%zu B=%u codec=%d: GPU stream differs (%zu vs %zu bytes), first at byte %zu"
	      " (GPU 0x%02x, C 0x%02x)", dt, tu_gen_name[gen], n, B, codec, lg, lc, at,
	      at < lg ? sg[at] : 0, at < lc ? sc[at] : 0);
	static int dumped;
	const char *dump = getenv("SNAP_TEST_DUMP"); /* the first differing pair, for a look off the GPU machine */
	if ((lc != lg || at != lc) && dump && !dumped++) {
		char path[4096];
		snprintf(path, sizeof(path), "%s/gpu-%d-%d-%zu-%u-%d.bin", dump, dt, gen, n, B, codec);
		FILE *fp = fopen(path, "wb");
		if (fp) { fwrite(sg, 1, lg, fp); fclose(fp); }
		snprintf(path, sizeof(path), "%s/c.bin", dump);
		fp = fopen(path, "wb");
		if (fp) { fwrite(sc, 1, lc, fp); fclose(fp); }
	}
	uint8_t *oc = malloc(n * es + 1), *og = malloc(n * es + 1);
	CHECK(snap_codec_decompress(sg, lg, oc, n * es, NULL) == 0, "cpu decodes gpu stream");
	int rc = gpu_decompress(sc, lc, og, n * es, NULL);
	CHECK(rc == 0 && memcmp(oc, og, n * es) == 0,
	      "dt=%d gen=%s n=%zu codec=%d: GPU decode differs (rc %d)", dt, tu_gen_name[gen], n, codec, rc);
	/* Corruptions the C decoder refuses must be refused on the GPU. */
	for (int r = 0; r < flips && lc > 60; r++) {
		uint8_t *m = malloc(lc);
		memcpy(m, sc, lc);
		m[48 + tu_next() % (lc - 48)] ^= (uint8_t)(1 + tu_next() % 255);
		int crc = snap_codec_decompress(m, lc, oc, n * es, NULL);
		int grc = gpu_decompress(m, lc, og, n * es, NULL);
		CHECK((crc == 0) == (grc == 0), "flip: C rc %d, GPU rc %d", crc, grc);
		if (crc == 0 && grc == 0)
			CHECK(memcmp(oc, og, n * es) == 0, "flip: outputs differ");
		free(m);
	}
	free(f); free(in); free(sc); free(sg); free(oc); free(og);
}

static void real_data(const char *path)
{
	/* The weights ship with the repository (tests/data): a missing or short
	 * file fails the test, never drops the check. */
	FILE *fp = fopen(path, "rb");
	CHECK(fp != NULL, "real data: cannot open %s (tests/data/README.md)", path);
	if (!fp)
		return;
	fseek(fp, 0, SEEK_END);
	size_t n = (size_t)ftell(fp) / 4;
	fseek(fp, 0, SEEK_SET);
	float *f = malloc(n * 4);
	int short_read = n == 0 || fread(f, 4, n, fp) != n;
	fclose(fp);
	CHECK(!short_read, "real data: cannot read %zu values from %s", n, path);
	if (short_read) {
		free(f);
		return;
	}
	uint8_t *in = malloc(n * 4), *o = malloc(n * 4);
	printf("%-6s %-9s %8s %10s %12s  (GPU kernel time, events)\n", "dtype", "codec", "ratio",
	       "comp GB/s", "decomp GB/s");
	for (int d = 0; d < 3; d++) {
		int dt = dtypes[d];
		size_t es = snap_dtype_size(dt);
		snap_codec_convert(dt, in, SNAP_DTYPE_F32, f, n);
		for (int c = 0; c < 2; c++) {
			struct snap_codec_params p = { c ? SNAP_CODEC_LOSSY_ABS : SNAP_CODEC_LOSSLESS, dt, 1e-3, 0 };
			size_t lg, lc, cap = snap_codec_bound(&p, n);
			float mc = 0, md = 0;
			uint8_t *sg = gpu_compress(&p, in, n, &lg, NULL);
			free(sg);
			sg = gpu_compress(&p, in, n, &lg, &mc); /* warm */
			uint8_t *sc = malloc(cap);
			snap_codec_compress(&p, in, n, sc, cap, &lc);
			CHECK(lc == lg && memcmp(sc, sg, lc) == 0, "real data dt=%d codec=%d differs", dt, p.codec);
			CHECK(gpu_decompress(sg, lg, o, n * es, &md) == 0, "real data gpu decode");
			printf("%-6s %-9s %8.3f %10.2f %12.2f\n", dt == 7 ? "f32" : dt == 6 ? "bf16" : "f16",
			       c ? "lossy" : "lossless", (double)(n * es) / lg, n * es / (mc * 1e6),
			       n * es / (md * 1e6));
			free(sg); free(sc);
		}
	}
	free(f); free(in); free(o);
}

/* The fuzzers' seed streams: the GPU decodes each as the C twin does, the
 * GPU re-encodes the decoded values into the C twin's bytes, and mutated
 * copies (1-4 random bytes changed, as the fuzz driver does) get the same
 * verdict and the same values from both. */
static void seed_twins(int mutations)
{
	static uint8_t s[1 << 20], m[1 << 20];
	for (int i = 0; i < NSEEDS; i++) {
		size_t len = seed_stream(i, s, sizeof(s));
		struct snap_codec_info info;
		CHECK(len > 0 && snap_codec_inspect(s, len, &info) == 0, "seed %d: no stream", i);
		if (!len)
			continue;
		size_t es = snap_dtype_size(info.dtype), nb = info.count * es;
		uint8_t *oc = malloc(nb + 1), *og = malloc(nb + 1);
		CHECK(snap_codec_decompress(s, len, oc, nb, NULL) == 0, "seed %d: C decode", i);
		int rc = gpu_decompress(s, len, og, nb, NULL);
		CHECK(rc == 0 && memcmp(oc, og, nb) == 0, "seed %d: GPU decode differs (rc %d)", i, rc);
		double bound = info.codec == SNAP_CODEC_LOSSLESS ? 0 : info.param;
		struct snap_codec_params p = { info.codec, info.dtype, bound, info.block_elems };
		size_t cap = snap_codec_bound(&p, info.count), lc = 0, lg = 0;
		uint8_t *sc = malloc(cap ? cap : 1);
		CHECK(snap_codec_compress(&p, oc, info.count, sc, cap, &lc) == 0, "seed %d: C re-encode", i);
		uint8_t *sg = gpu_compress(&p, oc, info.count, &lg, NULL);
		CHECK(lc == lg && memcmp(sc, sg, lc) == 0, "seed %d: GPU re-encode differs (%zu vs %zu bytes)", i, lg,
		      lc);
		for (int r = 0; r < mutations; r++) {
			memcpy(m, s, len);
			for (int k = 1 + (int)(tu_next() % 4); k > 0; k--)
				m[tu_next() % len] ^= (uint8_t)(1 + tu_next() % 255);
			int crc = snap_codec_decompress(m, len, oc, nb, NULL);
			int grc = gpu_decompress(m, len, og, nb, NULL);
			CHECK((crc == 0) == (grc == 0), "seed %d mutation %d: C rc %d, GPU rc %d", i, r, crc, grc);
			struct snap_codec_info mi;
			if (crc == 0 && grc == 0 && snap_codec_inspect(m, len, &mi) == 0) /* what both wrote */
				CHECK(memcmp(oc, og, mi.count * snap_dtype_size(mi.dtype)) == 0, "seed %d mutation %d: outputs differ", i, r);
		}
		free(oc); free(og); free(sc); free(sg);
	}
}

/* Argument errors agree with the C side: a NULL destination for a nonempty
 * stream is SNAP_EINVAL on both (host-side checks, nothing is launched). */
static void null_dst(void)
{
	enum { N = 300 };
	float f[N];
	for (int i = 0; i < N; i++)
		f[i] = (float)i;
	struct snap_codec_params p = { SNAP_CODEC_LOSSLESS, SNAP_DTYPE_F32, 0, 256 };
	size_t cap = snap_codec_bound(&p, N), len = 0;
	uint8_t *s = malloc(cap);
	struct snap_codec_info info;
	CHECK(snap_codec_compress(&p, f, N, s, cap, &len) == 0 &&
	      snap_codec_inspect(s, len, &info) == 0, "null_dst: host stream");
	int rc = snap_codec_decompress(s, len, NULL, sizeof(f), NULL);
	CHECK(rc == SNAP_EINVAL, "C decode to NULL rc %d", rc);
	void *d_s;
	int *d_st;
	CU(cudaMalloc(&d_s, len));
	CU(cudaMalloc((void **)&d_st, sizeof(int)));
	rc = snap_codec_cuda_decompress(&info, d_s, len, NULL, sizeof(f), NULL, 0, d_st, NULL);
	CHECK(rc == SNAP_EINVAL, "GPU decode to NULL rc %d", rc);
	CU(cudaFree(d_s));
	CU(cudaFree(d_st));
	free(s);
}

int main(int argc, char **argv)
{
	int ndev = 0;
	if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)
		skiprule_skip_test("test_codec_gpu", "no usable CUDA device (cudaGetDeviceCount found none)");
	int quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
	int tiny = argc > 1 && strcmp(argv[1], "--tiny") == 0;
	if (quick || tiny) {
		argc--;
		argv++;
	}
	null_dst();
	const size_t all[] = { 0, 1, 33, 255, 257, 4095, 4097, 3 * 4096 + 17, 100000 };
	const size_t few[] = { 255, 4097, 3 * 4096 + 17 };
	const size_t one[] = { 4097 };
	const size_t *lens = tiny ? one : quick ? few : all;
	size_t nlens = tiny ? 1 : quick ? sizeof(few) / sizeof(*few) : sizeof(all) / sizeof(*all);
	if (tiny)
		flips = 2;
	for (int d = 0; d < 3; d++)
		for (int g = 0; g < GEN_COUNT; g++)
			for (size_t li = 0; li < nlens; li++) {
				size_t n = lens[li];
				uint32_t B = n < 300 ? 256 : 0;
				twin(dtypes[d], g, n, B, SNAP_CODEC_LOSSLESS, 0);
				twin(dtypes[d], g, n, B, SNAP_CODEC_LOSSY_ABS, 1e-3);
				twin(dtypes[d], g, n, 16384, SNAP_CODEC_LOSSY_REL, 1e-2);
				twin(dtypes[d], g, n, B, SNAP_CODEC_LOSSY_ABS, 0.5);
			}
	seed_twins(tiny ? 2 : quick ? 20 : 200);
	if (argc > 1)
		real_data(argv[1]);
	else
		printf("no weights file given: the real-data twin check not run (ctest passes tests/data's)\n");
	if (tu_failures) {
		fprintf(stderr, "%d failures\n", tu_failures);
		return 1;
	}
	printf("GPU twin tests passed\n");
	return 0;
}
