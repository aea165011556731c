/* Helpers shared by the io tests: checks that fail loudly, fixtures. */
#ifndef IO_TESTUTIL_H
#define IO_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Real weights (../shared/data/ppocr_v4_rec.f32) repeated to n bytes; falls
 * back to a deterministic pattern when the file is not there. */
static inline void io_t_weights(void *buf, size_t n, size_t skip)
{
	static const char *paths[] = {SNAP_TEST_WEIGHTS, NULL};
	FILE *f = fopen(paths[0], "rb");
	unsigned char *p = buf;
	size_t got = 0;
	if (f) {
		fseek(f, (long)(skip % 10000000), SEEK_SET);
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
	for (uint32_t x = (uint32_t)skip * 2654435761u + 1; got < n; got++) {
		x = x * 1103515245u + 12345u;
		p[got] = (unsigned char)(x >> 16);
	}
}

#endif
