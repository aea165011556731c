/* SPDX-License-Identifier: BSD-3-Clause */
/* Helpers shared by the io tests: checks that fail loudly, fixtures. */
#ifndef IO_TESTUTIL_H
#define IO_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/codec.h"
#include "snap/io.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); exit(1); } } while (0)
/* rc must equal want, and the message must mention every given fragment. */
#define EXPECT_ERR(rc, want, err, ...) do {                                                     \
	int rc_ = (rc);                                                                          \
	if (rc_ != (want)) {                                                                     \
		fprintf(stderr, "%s:%d: got %d (%s) want %d: %s\n", __FILE__, __LINE__, rc_,     \
			snap_strerror(rc_), (want), (err)->msg);                                  \
		exit(1);                                                                         \
	}                                                                                        \
	const char *frags_[] = {__VA_ARGS__, NULL};                                              \
	for (int i_ = 0; frags_[i_]; i_++)                                                       \
		if (!strstr((err)->msg, frags_[i_])) {                                           \
			fprintf(stderr, "%s:%d: message lacks \"%s\": %s\n", __FILE__, __LINE__,  \
				frags_[i_], (err)->msg);                                         \
			exit(1);                                                                 \
		}                                                                                \
	printf("  ok (%s): %s\n", snap_strerror(rc_), (err)->msg);                                \
} while (0)
#define OK(call, err) do { int r_ = (call); if (r_ < 0) { fprintf(stderr, "%s:%d: %s -> %d %s\n", \
	__FILE__, __LINE__, #call, r_, (err)->msg); exit(1); } } while (0)

/* A region over caller memory. */
static inline struct snap_io_region io_t_region(const char *name, int dtype, int ndim, const uint64_t *global,
						const uint64_t *off, const uint64_t *shape, const void *data)
{
	struct snap_io_region r = {.name = name, .dtype = dtype, .kind = SNAP_KIND_PARAM, .ndim = ndim, .data = data};
	size_t bytes = snap_dtype_size(dtype);
	for (int d = 0; d < ndim; d++) {
		r.global_shape[d] = global[d];
		r.shard_offset[d] = off[d];
		r.shape[d] = shape[d];
		bytes *= shape[d];
	}
	r.bytes = bytes;
	r.crc32c = snap_io_crc32c(data, bytes);
	r.has_crc = 1;
	return r;
}

/* Real weights (SNAP_TEST_WEIGHTS: the sample shipped in tests/data) from
 * byte `skip` on, repeated to n bytes. The file ships with the repository:
 * missing, it is a failure, never a quiet switch to other values. */
static inline void io_t_weights(void *buf, size_t n, size_t skip)
{
	FILE *f = fopen(SNAP_TEST_WEIGHTS, "rb");
	if (!f) {
		fprintf(stderr, "cannot open the test weights %s (tests/data/README.md)\n", SNAP_TEST_WEIGHTS);
		exit(1);
	}
	unsigned char *p = buf;
	size_t got = 0;
	CHECK(fseek(f, 0, SEEK_END) == 0);
	long size = ftell(f);
	CHECK(size > 0);
	CHECK(fseek(f, (long)(skip % (size_t)size), SEEK_SET) == 0);
	while (got < n) {
		size_t k = fread(p + got, 1, n - got, f);
		if (k == 0) {
			rewind(f);
			continue;
		}
		got += k;
	}
	fclose(f);
}

/* A region's values cut into frames of fe values, each compressed on its own
 * with snap_codec_compress (what the node store holds for a codec region),
 * and what decoding them gives. */
struct io_t_frames {
	uint32_t n;
	uint64_t fe, count, maxlen;
	void **frame;
	uint64_t *len;
	uint32_t *crc;
	void *decoded;   /* count values */
	int codec;       /* of the first frame's header */
};

static inline void io_t_frames_make(struct io_t_frames *f, int dtype, int codec, double bound, const void *vals,
				    uint64_t count, uint64_t fe)
{
	size_t es = snap_dtype_size(dtype);
	memset(f, 0, sizeof *f);
	f->n = (uint32_t)(count / fe + (count % fe != 0));
	f->fe = fe;
	f->count = count;
	f->frame = calloc(f->n, sizeof *f->frame);
	f->len = calloc(f->n, sizeof *f->len);
	f->crc = calloc(f->n, sizeof *f->crc);
	f->decoded = malloc(count * es);
	CHECK(f->frame && f->len && f->crc && f->decoded);
	for (uint32_t k = 0; k < f->n; k++) {
		uint64_t at = k * fe, nv = count - at < fe ? count - at : fe;
		struct snap_codec_params p = {.codec = codec, .dtype = dtype, .bound = bound};
		size_t cap = snap_codec_bound(&p, nv), len = 0, got = 0;
		CHECK(cap > 0 && (f->frame[k] = malloc(cap)) != NULL);
		CHECK(snap_codec_compress(&p, (const char *)vals + at * es, nv, f->frame[k], cap, &len) == 0);
		f->len[k] = len;
		f->crc[k] = snap_io_crc32c(f->frame[k], len);
		f->maxlen = len > f->maxlen ? len : f->maxlen;
		CHECK(snap_codec_decompress(f->frame[k], len, (char *)f->decoded + at * es, nv * es, &got) == 0 &&
		      got == nv);
		struct snap_codec_info in;
		CHECK(snap_codec_inspect(f->frame[k], len, &in) == 0);
		if (k == 0)
			f->codec = in.codec;
	}
}

/* Makes r (built by io_t_region over f->decoded) a frame region of f. */
static inline void io_t_frames_attach(struct snap_io_region *r, const struct io_t_frames *f)
{
	r->nframes = f->n;
	r->frame_elems = f->fe;
	r->frame = (const void *const *)f->frame;
	r->frame_len = f->len;
	r->frame_crc = f->crc;
	r->data = NULL;
	r->has_crc = 0;
}

static inline void io_t_frames_free(struct io_t_frames *f)
{
	for (uint32_t k = 0; k < f->n; k++)
		free(f->frame[k]);
	free(f->frame);
	free(f->len);
	free(f->crc);
	free(f->decoded);
	memset(f, 0, sizeof *f);
}

/* The fault sweeps' step (io_pread_faults, io_alloc_faults): region "w",
 * f32 values stored as the frames f, and region "r", 1000 raw f32. */
static inline int io_t_write_fr(struct snap_io_writer *w, const char *dir, const char *job, uint64_t step,
				const struct io_t_frames *f, const float *r, struct snap_io_err *err)
{
	uint64_t g[1] = {f->count}, o[1] = {0}, gr[1] = {1000};
	struct snap_io_region reg[2] = {io_t_region("w", SNAP_DTYPE_F32, 1, g, o, g, f->decoded),
					io_t_region("r", SNAP_DTYPE_F32, 1, gr, o, gr, r)};
	io_t_frames_attach(&reg[0], f);
	return snap_io_write_rank(w, dir, job, step, 0, 1, reg, 2, NULL, err);
}

/* That step seals, verifies, and reads back bit-exact (the frames decoded). */
static inline void io_t_check_fr(const char *dir, const char *job, uint64_t step, const struct io_t_frames *f,
				 const float *r)
{
	float *w = malloc(f->count * 4), rb[1000];
	struct snap_io_err err = {0};
	size_t bad;
	CHECK(w);
	OK(snap_io_step_seal(dir, job, step, 1, &err), &err);
	OK(snap_io_verify_step(dir, job, step, &bad, &err), &err);
	struct snap_io_dest d[2] = {{.name = "w", .buf = w, .bytes = f->count * 4},
				    {.name = "r", .buf = rb, .bytes = sizeof rb}};
	OK(snap_io_read_rank(dir, job, step, 0, d, 2, &err), &err);
	CHECK(memcmp(w, f->decoded, f->count * 4) == 0 && memcmp(rb, r, sizeof rb) == 0);
	free(w);
}

#endif
