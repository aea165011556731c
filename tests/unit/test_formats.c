/*
 * Manifest, layout, wire header and config parsing, fed good and bad input:
 * every truncation of a manifest, random byte flips, headers that lie about
 * lengths, and malformed SNAP_* variables.
 */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "buf.h"
#include "internal.h"
#include "manifest.h"
#include "wire.h"

static struct snap_manifest sample(struct snap_layout *lay, uint32_t **crc)
{
	static float a[3000];
	static uint16_t b[64];
	struct snap_region regs[2] = {
		{ .name = "layer.0.weight", .ptr = a, .bytes = sizeof(a), .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
		  .ndim = 2, .shape = { 30, 100 }, .global_shape = { 60, 100 }, .shard_offset = { 30, 0 } },
		{ .name = "rng", .ptr = b, .bytes = sizeof(b), .dtype = SNAP_DTYPE_BF16, .kind = SNAP_KIND_RNG },
	};
	char err[256];
	CHECK_RC(snap_layout_build(lay, regs, 2, 4096, err, sizeof(err)), 0);
	*crc = calloc(lay->ncrc, 4);
	for (uint32_t i = 0; i < lay->ncrc; i++)
		(*crc)[i] = 0x1000 + i;
	struct snap_manifest m = { .rank = 1, .world = 2, .step = 42, .slot = 1, .wall_ns = 7, .layout = *lay, .crc = *crc };
	strcpy(m.job, "job-a");
	return m;
}

static void test_layout_rules(void)
{
	float x[16];
	char err[256];
	struct snap_layout lay;
	struct snap_region r = { .name = "x", .ptr = x, .bytes = sizeof(x), .dtype = SNAP_DTYPE_F32 };
	CHECK_RC(snap_layout_build(&lay, &r, 1, 4096, err, sizeof(err)), 0);
	CHECK(lay.slot_bytes == 4096 && lay.ncrc == 1 && lay.regions[0].offset == 0);
	snap_layout_free(&lay);

	struct snap_region bad = r;
	bad.bytes = 6; /* not whole f32 elements */
	CHECK_RC(snap_layout_build(&lay, &bad, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "\"x\"") != NULL);
	bad = r;
	bad.dtype = 99;
	CHECK_RC(snap_layout_build(&lay, &bad, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	bad = r;
	bad.ndim = 1;
	bad.shape[0] = 15; /* 15 elements but 64 bytes */
	bad.global_shape[0] = 15;
	CHECK_RC(snap_layout_build(&lay, &bad, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	bad.shape[0] = 16;
	bad.global_shape[0] = 20;
	bad.shard_offset[0] = 5; /* 5 + 16 > 20 */
	CHECK_RC(snap_layout_build(&lay, &bad, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "outside") != NULL);
	bad = r;
	bad.name = "bad\nname";
	CHECK_RC(snap_layout_build(&lay, &bad, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	struct snap_region two[2] = { r, r };
	CHECK_RC(snap_layout_build(&lay, two, 2, 4096, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "twice") != NULL);
	CHECK_RC(snap_layout_build(&lay, &r, 1, 100, err, sizeof(err)), SNAP_EINVAL);
}

static void test_chunk_lookup(void)
{
	static uint8_t a[10000], b[5000];
	struct snap_region regs[4] = {
		{ .name = "e0", .ptr = a, .bytes = 0, .dtype = SNAP_DTYPE_U8 },
		{ .name = "a", .ptr = a, .bytes = sizeof(a), .dtype = SNAP_DTYPE_U8 },
		{ .name = "e1", .ptr = a, .bytes = 0, .dtype = SNAP_DTYPE_U8 },
		{ .name = "b", .ptr = b, .bytes = sizeof(b), .dtype = SNAP_DTYPE_U8 },
	};
	struct snap_layout lay;
	char err[256];
	CHECK_RC(snap_layout_build(&lay, regs, 4, 4096, err, sizeof(err)), 0);
	CHECK(lay.ncrc == 5);
	const char *want[5] = { "a", "a", "a", "b", "b" };
	uint64_t want_len[5] = { 4096, 4096, 10000 - 8192, 4096, 5000 - 4096 };
	for (uint32_t t = 0; t < 5; t++) {
		uint64_t off, len;
		const struct snap_man_region *g = snap_layout_chunk(&lay, t, &off, &len);
		CHECK(!strcmp(g->name, want[t]) && len == want_len[t]);
		CHECK(off == g->offset + (uint64_t)(t - g->first_crc) * 4096);
	}
	uint8_t *slot = calloc(1, lay.slot_bytes);
	uint32_t crc[5], bad = 99;
	snap_layout_crcs(&lay, slot, crc);
	CHECK(snap_layout_verify(&lay, slot, crc, &bad) == 0);
	slot[lay.regions[3].offset + 4096] ^= 1;   /* chunk 4 (b's second) */
	CHECK(snap_layout_verify(&lay, slot, crc, &bad) == 1 && bad == 4);
	free(slot);
	snap_layout_free(&lay);
}

static void test_manifest_roundtrip_and_damage(void)
{
	struct snap_layout lay;
	uint32_t *crc;
	struct snap_manifest m = sample(&lay, &crc), d;
	struct snap_wbuf w = { 0 };
	char err[256];
	CHECK_RC(snap_manifest_encode(&m, &w), 0);
	CHECK_RC(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)), 0);
	CHECK(d.step == 42 && d.rank == 1 && d.world == 2 && !strcmp(d.job, "job-a"));
	CHECK(d.layout.nregions == 2 && d.layout.regions[0].global_shape[0] == 60 && d.layout.regions[0].shard_offset[0] == 30);
	CHECK(d.layout.ncrc == lay.ncrc && !memcmp(d.crc, crc, lay.ncrc * 4));
	CHECK_RC(snap_layout_compare(&d.layout, &lay, err, sizeof(err)), 0);
	snap_manifest_free(&d);

	/* Every truncation fails, and never reads out of bounds (ASan). */
	for (size_t n = 0; n < w.len; n++) {
		uint8_t *copy = malloc(n ? n : 1);
		memcpy(copy, w.p, n);
		int rc = snap_manifest_decode(copy, n, &d, err, sizeof(err));
		CHECK(rc != 0);
		if (rc == 0)
			snap_manifest_free(&d);
		free(copy);
	}
	/* Every single-byte flip fails (the checksum or a field catches it). */
	for (size_t i = 0; i < w.len; i++) {
		w.p[i] ^= 0x5a;
		int rc = snap_manifest_decode(w.p, w.len, &d, err, sizeof(err));
		CHECK(rc != 0);
		if (rc == 0)
			snap_manifest_free(&d);
		w.p[i] ^= 0x5a;
	}
	snap_wbuf_free(&w);

	/* A manifest with a valid checksum but lying fields is still refused. */
	struct snap_manifest lie = m;
	lie.rank = 5; /* >= world */
	CHECK_RC(snap_manifest_encode(&lie, &w), 0);
	CHECK(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)) == SNAP_EPROTO);
	snap_wbuf_free(&w);
	lay.regions[0].nchunks = 99; /* wrong chunk count */
	CHECK_RC(snap_manifest_encode(&m, &w), 0);
	CHECK(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)) == SNAP_EPROTO);
	snap_wbuf_free(&w);
	lay.regions[0].nchunks = 3;
	lay.regions[1].offset = 8; /* overlaps region 0 */
	CHECK_RC(snap_manifest_encode(&m, &w), 0);
	CHECK(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)) == SNAP_EPROTO);
	snap_wbuf_free(&w);

	/* Layout comparison names the region that differs. */
	struct snap_layout other;
	float y[10];
	struct snap_region r = { .name = "layer.0.weight", .ptr = y, .bytes = sizeof(y), .dtype = SNAP_DTYPE_F32 };
	CHECK_RC(snap_layout_build(&other, &r, 1, 4096, err, sizeof(err)), 0);
	lay.regions[1].offset = 12288;
	CHECK_RC(snap_layout_compare(&lay, &other, err, sizeof(err)), SNAP_EMISMATCH);
	CHECK(strstr(err, "layer.0.weight") != NULL);
	snap_layout_free(&other);
	snap_layout_free(&lay);
	free(crc);
}

static void test_random_garbage(void)
{
	srand(1234);
	char err[256];
	for (int i = 0; i < 20000; i++) {
		size_t n = (size_t)(rand() % 300);
		uint8_t *b = malloc(n ? n : 1);
		for (size_t k = 0; k < n; k++)
			b[k] = (uint8_t)rand();
		if (n >= 8 && i % 2)
			memcpy(b, SNAP_MAN_MAGIC, 8);
		struct snap_manifest d;
		if (snap_manifest_decode(b, n, &d, err, sizeof(err)) == 0)
			snap_manifest_free(&d);
		struct snap_rbuf r;
		struct snap_layout lay;
		snap_rbuf_init(&r, b, n);
		if (snap_layout_decode(&r, &lay, err, sizeof(err)) == 0)
			snap_layout_free(&lay);
		free(b);
	}
}

static void test_wire_header(void)
{
	uint8_t h[SNAP_WIRE_HDR];
	struct snap_msg_hdr m;
	snap_wire_put_hdr(h, SNAP_MSG_COMMIT, -3, 1234);
	CHECK_RC(snap_wire_parse_hdr(h, &m), 0);
	CHECK(m.type == SNAP_MSG_COMMIT && m.status == -3 && m.len == 1234);
	h[0] ^= 1;
	CHECK_RC(snap_wire_parse_hdr(h, &m), SNAP_EFORMAT);
	snap_wire_put_hdr(h, 1, 0, SNAP_WIRE_MAX + 1);
	CHECK_RC(snap_wire_parse_hdr(h, &m), SNAP_EPROTO);
	snap_wire_put_hdr(h, 1, 0, 0);
	h[4] = 9; /* version */
	CHECK_RC(snap_wire_parse_hdr(h, &m), SNAP_EFORMAT);
}

static void test_config(void)
{
	uint64_t v;
	CHECK_RC(snap_parse_size("4096", &v), 0);
	CHECK(v == 4096);
	CHECK_RC(snap_parse_size("64M", &v), 0);
	CHECK(v == 64ull << 20);
	CHECK_RC(snap_parse_size("2GiB", &v), 0);
	CHECK(v == 2ull << 30);
	CHECK_RC(snap_parse_size("1.5G", &v), SNAP_EINVAL);
	CHECK_RC(snap_parse_size("-1", &v), SNAP_EINVAL);
	CHECK_RC(snap_parse_size("99999999999999999999T", &v), SNAP_EINVAL);
	CHECK_RC(snap_parse_size("", &v), SNAP_EINVAL);

	struct snap_config c;
	char err[256];
	snap_config_init(&c);
	CHECK(c.slots == 2 && c.world_size == 1 && !strcmp(c.job, "default"));
	setenv("SNAP_JOB", "llm-7b", 1);
	setenv("SNAP_STORE", "/dev/shm/node3", 1);
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	setenv("SNAP_MEM_LIMIT", "2G", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.rank == 3 && c.world_size == 8 && c.mem_limit == 2ull << 30);
	CHECK(!strcmp(c.socket, "/dev/shm/node3/smp.sock") && !strcmp(c.job, "llm-7b"));
	setenv("SNAP_RANK", "5", 1); /* SNAP_* wins over the launcher's */
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.rank == 5);
	setenv("SNAP_SLOTS", "1", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_SLOTS") != NULL);
	unsetenv("SNAP_SLOTS");
	setenv("SNAP_MEM_LIMIT", "lots", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_MEM_LIMIT") != NULL);
	unsetenv("SNAP_MEM_LIMIT");
	setenv("SNAP_JOB", "../etc", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	setenv("SNAP_JOB", "ok", 1);
	setenv("SNAP_RANK", "9", 1); /* >= world size 8 */
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
}

static void test_crc(void)
{
	CHECK(snap_crc32c("123456789", 9) == 0xE3069283u); /* the CRC-32C check value */
	CHECK(snap_crc32c_update(snap_crc32c("1234", 4), "56789", 5) == 0xE3069283u);
	CHECK(snap_crc32c("", 0) == 0);
	/* combine(crc(a), crc(b), len(b)) == crc(a ++ b) for random splits and lengths */
	srand(7);
	static uint8_t buf[70000];
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)rand();
	for (int k = 0; k < 200; k++) {
		size_t n = (size_t)rand() % sizeof(buf), cut = n ? (size_t)rand() % (n + 1) : 0;
		uint32_t whole = snap_crc32c(buf, n);
		uint32_t joined = snap_crc32c_combine(snap_crc32c(buf, cut), snap_crc32c(buf + cut, n - cut), n - cut);
		CHECK(joined == whole);
	}
}

int main(void)
{
	test_crc();
	test_layout_rules();
	test_chunk_lookup();
	test_manifest_roundtrip_and_damage();
	test_random_garbage();
	test_wire_header();
	test_config();
	return check_done("test_formats");
}
