/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Round trip through real files: writes three steps of a 2-rank job (codec
 * none, LZ4 with small chunks, LZ4 with default chunks) holding sharded,
 * replicated and rank-local tensors of every interesting dtype and awkward
 * names, seals them, reads every region back bit-exact, verifies, exports
 * (virtual and copy), and leaves the expected bytes under OUT/expect for
 * check_h5py.py and check_h5dump.sh to compare independent readers against.
 * usage: io_roundtrip OUT
 */
#include <inttypes.h>
#include <sys/stat.h>

#include "io_testutil.h"

#define WORLD 2
#define JOB "jobA"

struct tensor {
	const char *name;
	int dtype, ndim;
	uint64_t global[3];
	int shard_dim;          /* -1: every rank holds all of it */
	int rank_local;         /* 1: each rank's copy differs (rng state) */
	unsigned char *data;    /* global bytes (rank_local: rank 0's) */
	size_t bytes;
};

static struct tensor T[] = {
	{"model/embed.weight", SNAP_DTYPE_F32, 2, {64, 300}, 1, 0, NULL, 0},
	{"layers.0.attn.bf16", SNAP_DTYPE_BF16, 2, {40, 33}, 0, 0, NULL, 0},
	{"norm.f16", SNAP_DTYPE_F16, 1, {17}, -1, 0, NULL, 0},
	{"opt/exp_avg", SNAP_DTYPE_F32, 3, {6, 10, 7}, 0, 0, NULL, 0},
	{"rng/state", SNAP_DTYPE_U8, 1, {5000}, -1, 1, NULL, 0},
	{"step_counter", SNAP_DTYPE_I64, 1, {1}, -1, 0, NULL, 0},
	{".hidden", SNAP_DTYPE_U16, 1, {3}, -1, 0, NULL, 0},
	{"a/b", SNAP_DTYPE_U32, 1, {4}, -1, 0, NULL, 0},
	{"a%2Fb", SNAP_DTYPE_U32, 1, {4}, -1, 0, NULL, 0},
	{"empty", SNAP_DTYPE_F32, 1, {0}, -1, 0, NULL, 0},
	{"big", SNAP_DTYPE_F64, 2, {300, 1000}, 0, 0, NULL, 0},
	{"flags", SNAP_DTYPE_BOOL, 2, {3, 5}, 1, 0, NULL, 0},
};
#define NT (sizeof T / sizeof T[0])

/* Shard of tensor t for rank r: offset and shape. */
static void shard_of(const struct tensor *t, int r, uint64_t *off, uint64_t *shape)
{
	for (int d = 0; d < t->ndim; d++) {
		off[d] = 0;
		shape[d] = t->global[d];
	}
	if (t->shard_dim >= 0) {
		uint64_t g = t->global[t->shard_dim];
		uint64_t cut = t->dtype == SNAP_DTYPE_BF16 ? 25 : g / 2; /* uneven on purpose for bf16 */
		off[t->shard_dim] = r == 0 ? 0 : cut;
		shape[t->shard_dim] = r == 0 ? cut : g - cut;
	}
}

/* Copies the box (off, shape) of a C-order global array into a dense buffer. */
static void slice(const struct tensor *t, const uint64_t *off, const uint64_t *shape, unsigned char *out)
{
	size_t es = snap_dtype_size(t->dtype);
	uint64_t n = 1;
	for (int d = 0; d < t->ndim; d++)
		n *= shape[d];
	for (uint64_t i = 0; i < n; i++) {
		uint64_t rem = i, g = 0, mul = 1;
		for (int d = t->ndim - 1; d >= 0; d--) {
			uint64_t c = rem % shape[d];
			rem /= shape[d];
			g += (c + off[d]) * mul;
			mul *= t->global[d];
		}
		memcpy(out + i * es, t->data + g * es, es);
	}
}

static void save(const char *path, const void *p, size_t n)
{
	FILE *f = fopen(path, "wb");
	CHECK(f && fwrite(p, 1, n, f) == n && fclose(f) == 0);
}

static void make_data(void)
{
	for (size_t i = 0; i < NT; i++) {
		struct tensor *t = &T[i];
		size_t n = snap_dtype_size(t->dtype);
		for (int d = 0; d < t->ndim; d++)
			n *= t->global[d];
		t->bytes = n;
		t->data = malloc(n ? n : 1);
		CHECK(t->data);
		if (t->dtype == SNAP_DTYPE_F32 || t->dtype == SNAP_DTYPE_F64) {
			io_t_weights(t->data, n, i * 4096);
		} else if (t->dtype == SNAP_DTYPE_BF16) {
			/* bf16 = top half of real f32 weights */
			float *w = malloc(n * 2);
			io_t_weights(w, n * 2, 777);
			for (size_t k = 0; k < n / 2; k++) {
				uint32_t u;
				memcpy(&u, &w[k], 4);
				uint16_t h = (uint16_t)(u >> 16);
				memcpy(t->data + 2 * k, &h, 2);
			}
			free(w);
		} else if (t->dtype == SNAP_DTYPE_BOOL) {
			for (size_t k = 0; k < n; k++)
				t->data[k] = (unsigned char)(k * 7 % 3 == 0);
		} else {
			for (size_t k = 0; k < n; k++)
				t->data[k] = (unsigned char)(k * 131 + i * 17 + 5);
		}
	}
}

/* Rank-local tensors differ per rank: rank r's bytes are global ^ r. */
static unsigned char *rank_bytes(const struct tensor *t, int r, uint64_t *off, uint64_t *shape, size_t *bytes)
{
	shard_of(t, r, off, shape);
	size_t n = snap_dtype_size(t->dtype);
	for (int d = 0; d < t->ndim; d++)
		n *= shape[d];
	unsigned char *b = malloc(n ? n : 1);
	CHECK(b);
	slice(t, off, shape, b);
	if (t->rank_local)
		for (size_t k = 0; k < n; k++)
			b[k] ^= (unsigned char)(r * 0x5A);
	*bytes = n;
	return b;
}

static char dsname(const char *name, char *out)
{
	/* Mirror of the documented escaping (docs/io-format.md). */
	static const char hex[] = "0123456789ABCDEF";
	size_t k = 0;
	for (size_t i = 0; name[i]; i++) {
		unsigned char c = (unsigned char)name[i];
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
		    c == '-' || (c == '.' && i > 0))
			out[k++] = (char)c;
		else {
			out[k++] = '%';
			out[k++] = hex[c >> 4];
			out[k++] = hex[c & 15];
		}
	}
	out[k] = '\0';
	return 0;
}

int main(int argc, char **argv)
{
	CHECK(argc == 2);
	const char *out = argv[1];
	char flush[1024], p[8192], name[1024];
	snprintf(flush, sizeof flush, "%s/flush", out);
	struct snap_io_err err = {0};

	CHECK(snap_io_crc32c("123456789", 9) == 0xE3069283u);
	make_data();
	snprintf(p, sizeof p, "%s/expect", out);
	mkdir(out, 0755);
	mkdir(p, 0755);
	snprintf(p, sizeof p, "%s/expect/global", out);
	mkdir(p, 0755);
	for (size_t i = 0; i < NT; i++) {
		if (T[i].rank_local)
			continue;
		dsname(T[i].name, name);
		snprintf(p, sizeof p, "%s/expect/global/%s.bin", out, name);
		save(p, T[i].data, T[i].bytes);
	}
	/* rank-local tensors export rank 0's copy */
	for (size_t i = 0; i < NT; i++) {
		if (!T[i].rank_local)
			continue;
		uint64_t off[3], shape[3];
		size_t n;
		unsigned char *b = rank_bytes(&T[i], 0, off, shape, &n);
		dsname(T[i].name, name);
		snprintf(p, sizeof p, "%s/expect/global/%s.bin", out, name);
		save(p, b, n);
		free(b);
	}

	struct { uint64_t step; int codec; size_t chunk; } steps[] = {
		{10, SNAP_IO_CODEC_NONE, 0}, {20, SNAP_IO_CODEC_LZ4, 8192}, {30, SNAP_IO_CODEC_LZ4, 0}};
	for (size_t s = 0; s < 3; s++) {
		struct snap_io_opts o = {.codec = steps[s].codec, .chunk_bytes = steps[s].chunk, .queue_depth = 4,
					 .io_bytes = 256 << 10};
		struct snap_io_writer *w = snap_io_writer_new(&o, &err);
		CHECK(w);
		for (int r = 0; r < WORLD; r++) {
			struct snap_io_region reg[NT];
			unsigned char *bufs[NT];
			snprintf(p, sizeof p, "%s/expect/rank-%d", out, r);
			mkdir(p, 0755);
			for (size_t i = 0; i < NT; i++) {
				uint64_t off[3], shape[3];
				size_t n;
				bufs[i] = rank_bytes(&T[i], r, off, shape, &n);
				reg[i] = io_t_region(T[i].name, T[i].dtype, T[i].ndim, T[i].global, off, shape, bufs[i]);
				reg[i].kind = T[i].rank_local ? SNAP_KIND_RNG : SNAP_KIND_PARAM;
				if (i % 2)
					reg[i].has_crc = 0; /* writer computes it */
				dsname(T[i].name, name);
				snprintf(p, sizeof p, "%s/expect/rank-%d/%s.bin", out, r, name);
				save(p, bufs[i], n);
			}
			struct snap_io_write_stats st;
			OK(snap_io_write_rank(w, flush, JOB, steps[s].step, (uint32_t)r, WORLD, reg, NT, &st, &err), &err);
			printf("step %" PRIu64 " rank %d: raw %" PRIu64 " stored %" PRIu64 " file %" PRIu64 " direct %d\n",
			       steps[s].step, r, st.raw_bytes, st.stored_bytes, st.file_bytes, st.direct);
			/* Not persisted until sealed. */
			uint32_t wd;
			CHECK(snap_io_step_world(flush, JOB, steps[s].step, &wd, &err) == SNAP_ENOENT);
			for (size_t i = 0; i < NT; i++)
				free(bufs[i]);
		}
		snap_io_writer_free(w);
		EXPECT_ERR(snap_io_step_seal(flush, JOB, steps[s].step, WORLD + 1, &err), SNAP_ENOENT, &err, "rank-2.h5");
		OK(snap_io_step_seal(flush, JOB, steps[s].step, WORLD, &err), &err);
		OK(snap_io_step_seal(flush, JOB, steps[s].step, WORLD, &err), &err); /* idempotent */
	}

	uint64_t list[8];
	CHECK(snap_io_list_steps(flush, JOB, list, 8, &err) == 3);
	CHECK(list[0] == 30 && list[1] == 20 && list[2] == 10);
	uint64_t newest;
	OK(snap_io_newest_step(flush, JOB, &newest, &err), &err);
	CHECK(newest == 30);

	for (size_t s = 0; s < 3; s++) {
		size_t bad = 99;
		OK(snap_io_verify_step(flush, JOB, steps[s].step, &bad, &err), &err);
		CHECK(bad == 0);
		for (int r = 0; r < WORLD; r++) {
			struct snap_io_dest dst[NT];
			unsigned char *want[NT];
			memset(dst, 0, sizeof dst); /* io.h: zero-initialise, then set */
			for (size_t i = 0; i < NT; i++) {
				uint64_t off[3], shape[3];
				size_t n;
				want[i] = rank_bytes(&T[i], r, off, shape, &n);
				dst[i].name = T[NT - 1 - i].name; /* any order */
				dst[i].bytes = 0;
			}
			for (size_t i = 0; i < NT; i++) {
				size_t j = NT - 1 - i;
				uint64_t off[3], shape[3];
				size_t n;
				free(rank_bytes(&T[j], r, off, shape, &n));
				dst[i].bytes = n;
				dst[i].buf = malloc(n ? n : 1);
				memset(dst[i].buf, 0xEE, n);
			}
			OK(snap_io_read_rank(flush, JOB, steps[s].step, (uint32_t)r, dst, NT, &err), &err);
			for (size_t i = 0; i < NT; i++) {
				size_t j = NT - 1 - i;
				CHECK(memcmp(dst[i].buf, want[j], dst[i].bytes) == 0);
				free(dst[i].buf);
				free(want[j]);
			}
		}
		snprintf(p, sizeof p, "%s/export-%" PRIu64 "-virtual.h5", out, steps[s].step);
		OK(snap_io_export(flush, JOB, steps[s].step, p, SNAP_IO_EXPORT_VIRTUAL, &err), &err);
		snprintf(p, sizeof p, "%s/export-%" PRIu64 "-copy.h5", out, steps[s].step);
		OK(snap_io_export(flush, JOB, steps[s].step, p, SNAP_IO_EXPORT_COPY, &err), &err);
	}
	/* A wrong-size buffer and an unknown name are named clearly. */
	char small[8];
	struct snap_io_dest d1 = {.name = "big", .buf = small, .bytes = sizeof small};
	struct snap_io_dest d2 = {.name = "nope", .buf = small, .bytes = sizeof small};
	EXPECT_ERR(snap_io_read_rank(flush, JOB, 10, 0, &d1, 1, &err), SNAP_EMISMATCH, &err, "rank-0.h5", "big");
	EXPECT_ERR(snap_io_read_rank(flush, JOB, 10, 0, &d2, 1, &err), SNAP_ENOENT, &err, "nope");
	EXPECT_ERR(snap_io_read_rank(flush, JOB, 11, 0, &d2, 1, &err), SNAP_ENOENT, &err, "not persisted");
	for (size_t i = 0; i < NT; i++)
		free(T[i].data);
	printf("io_roundtrip: all good\n");
	return 0;
}
