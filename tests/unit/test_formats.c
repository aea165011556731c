/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Manifest, layout, wire header and config parsing, fed good and bad input:
 * every truncation of a manifest, random byte flips, headers that lie about
 * lengths, and malformed SNAP_* variables (the client's, and snapsmp's own
 * settings in smp/include/snap/smp_config.h), and the STATUS reply as
 * snapsmp writes it (smp/requests.c), from this and older daemons.
 */
#include <stdlib.h>
#include <string.h>

#include "../check.h"
#include "snap/buf.h"
#include "snap/smp_config.h"
#include "snap/proto.h"
#include "snap/manifest.h"
#include "snap/codec.h"
#include "snap/status.h"
#include "snap/wire.h"

/* Three regions: raw f32 (3 chunks), raw bf16 (1), lossy f32 (2 frames). */
static struct snap_manifest sample(struct snap_layout *lay, uint32_t **crc)
{
	static float a[3000], c[1500];
	static uint16_t b[64];
	struct snap_region regs[3] = {
		{ .name = "layer.0.weight", .ptr = a, .bytes = sizeof(a), .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
		  .ndim = 2, .shape = { 30, 100 }, .global_shape = { 60, 100 }, .shard_offset = { 30, 0 } },
		{ .name = "rng", .ptr = b, .bytes = sizeof(b), .dtype = SNAP_DTYPE_BF16, .kind = SNAP_KIND_RNG },
		{ .name = "exp_avg", .ptr = c, .bytes = sizeof(c), .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_OPTIM,
		  .codec = SNAP_CODEC_LOSSY_ABS, .codec_bound = 1e-3 },
	};
	char err[256];
	CHECK_RC(snap_layout_build(lay, regs, 3, 4096, err, sizeof(err)), 0);
	*crc = calloc(2 * (size_t)lay->ncrc, 4);
	for (uint32_t t = 0; t < lay->ncrc; t++) {
		struct snap_chunk ch;
		snap_layout_chunk(lay, t, &ch);
		(*crc)[t] = 0x1000 + t;
		(*crc)[lay->ncrc + t] = (uint32_t)(ch.g->frame_cap ? 100 + t : ch.raw_len);
	}
	struct snap_manifest m = { .rank = 1, .world = 2, .step = 42, .slot = 1, .wall_ns = 7, .layout = *lay,
				   .crc = *crc, .len = *crc + lay->ncrc };
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

	/* Codecs: float dtypes only, a valid bound, no bound without a codec. */
	struct snap_region cr = r;
	cr.codec = SNAP_CODEC_LOSSLESS;
	CHECK_RC(snap_layout_build(&lay, &cr, 1, 4096, err, sizeof(err)), 0);
	CHECK(lay.regions[0].frame_cap >= 64 + SNAP_CODEC_HEADER_BYTES && lay.ncrc == 1);
	CHECK(lay.slot_bytes >= lay.regions[0].frame_cap && lay.raw_bytes == 64);
	snap_layout_free(&lay);
	int32_t iv[16];
	struct snap_region ci = { .name = "steps", .ptr = iv, .bytes = sizeof(iv), .dtype = SNAP_DTYPE_I32,
				  .codec = SNAP_CODEC_LOSSLESS };
	CHECK_RC(snap_layout_build(&lay, &ci, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "\"steps\"") && strstr(err, "i32"));
	cr.codec = SNAP_CODEC_LOSSY_ABS;
	cr.codec_bound = -1;
	CHECK_RC(snap_layout_build(&lay, &cr, 1, 4096, err, sizeof(err)), SNAP_ERANGE);
	CHECK(strstr(err, "\"x\"") && strstr(err, "bound"));
	cr.codec = 17;
	CHECK_RC(snap_layout_build(&lay, &cr, 1, 4096, err, sizeof(err)), SNAP_EINVAL);
	cr.codec = SNAP_CODEC_LOSSY_REL;
	cr.codec_bound = 1e-3;
	CHECK_RC(snap_layout_build(&lay, &cr, 1, 4096, err, sizeof(err)), 0);
	snap_layout_free(&lay);
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
	uint8_t *slot = calloc(1, lay.slot_bytes);
	uint32_t crc[5], len[5], bad = 99;
	for (uint32_t t = 0; t < 5; t++) {
		struct snap_chunk c;
		snap_layout_chunk(&lay, t, &c);
		CHECK(!strcmp(c.g->name, want[t]) && c.raw_len == want_len[t] && c.cap == c.raw_len);
		CHECK(c.index == t - c.g->first_crc && c.raw_off == (uint64_t)c.index * 4096);
		CHECK(c.slot_off == c.g->offset + c.raw_off);
		len[t] = (uint32_t)c.raw_len;
		crc[t] = snap_crc32c(slot + c.slot_off, c.raw_len);
	}
	CHECK_RC(snap_layout_check_lens(&lay, len, err, sizeof(err)), 0);
	CHECK(snap_layout_verify(&lay, slot, crc, len, &bad) == 0);
	slot[lay.regions[3].offset + 4096] ^= 1;   /* chunk 4 (b's second) */
	CHECK(snap_layout_verify(&lay, slot, crc, len, &bad) == 1 && bad == 4);
	len[2]--;                                   /* a raw chunk must be stored whole */
	CHECK_RC(snap_layout_check_lens(&lay, len, err, sizeof(err)), SNAP_EPROTO);
	CHECK(strstr(err, "\"a\" chunk 2") != NULL);
	free(slot);
	snap_layout_free(&lay);

	/* A codec region: frames sit at frame_cap strides, raw offsets at chunk strides. */
	static float f[2500];
	struct snap_region cr[2] = {
		{ .name = "raw", .ptr = a, .bytes = 100, .dtype = SNAP_DTYPE_U8 },
		{ .name = "z", .ptr = f, .bytes = sizeof(f), .dtype = SNAP_DTYPE_F32, .codec = SNAP_CODEC_LOSSLESS },
	};
	CHECK_RC(snap_layout_build(&lay, cr, 2, 4096, err, sizeof(err)), 0);
	const struct snap_man_region *z = &lay.regions[1];
	CHECK(lay.ncrc == 4 && z->nchunks == 3 && z->offset == 4096 && z->frame_cap > 4096);
	CHECK(lay.slot_bytes == (4096 + 3 * z->frame_cap + 4095) / 4096 * 4096);
	uint32_t zl[4] = { 100, SNAP_CODEC_HEADER_BYTES, 4000, (uint32_t)z->frame_cap };
	for (uint32_t t = 1; t < 4; t++) {
		struct snap_chunk c;
		snap_layout_chunk(&lay, t, &c);
		CHECK(c.g == z && c.index == t - 1 && c.cap == z->frame_cap);
		CHECK(c.slot_off == z->offset + (t - 1) * z->frame_cap && c.raw_off == (t - 1) * 4096ull);
		CHECK(c.raw_len == (t < 3 ? 4096u : sizeof(f) - 8192));
	}
	CHECK_RC(snap_layout_check_lens(&lay, zl, err, sizeof(err)), 0);
	zl[3]++;                                    /* beyond the frame's room */
	CHECK_RC(snap_layout_check_lens(&lay, zl, err, sizeof(err)), SNAP_EPROTO);
	zl[3] = SNAP_CODEC_HEADER_BYTES - 1;        /* shorter than a stream header */
	CHECK_RC(snap_layout_check_lens(&lay, zl, err, sizeof(err)), SNAP_EPROTO);
	CHECK(strstr(err, "\"z\" chunk 2") != NULL);
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
	CHECK(d.layout.nregions == 3 && d.layout.regions[0].global_shape[0] == 60 && d.layout.regions[0].shard_offset[0] == 30);
	CHECK(d.layout.ncrc == lay.ncrc && !memcmp(d.crc, crc, lay.ncrc * 4) && !memcmp(d.len, m.len, lay.ncrc * 4));
	CHECK(d.layout.regions[2].codec == SNAP_CODEC_LOSSY_ABS && d.layout.regions[2].bound == 1e-3);
	CHECK(d.layout.regions[2].frame_cap == lay.regions[2].frame_cap && d.layout.slot_bytes == lay.slot_bytes);
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
	lay.regions[1].offset = 12288;
	m.layout = lay;
	m.len[lay.ncrc - 1] = (uint32_t)lay.regions[2].frame_cap + 1; /* a frame beyond its room */
	CHECK_RC(snap_manifest_encode(&m, &w), 0);
	CHECK(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)) == SNAP_EPROTO);
	CHECK(strstr(err, "exp_avg") != NULL);
	snap_wbuf_free(&w);
	m.len[lay.ncrc - 1] = 100;
	lay.regions[2].bound = 0; /* a lossy region without its bound */
	CHECK_RC(snap_manifest_encode(&m, &w), 0);
	CHECK(snap_manifest_decode(w.p, w.len, &d, err, sizeof(err)) == SNAP_EPROTO);
	snap_wbuf_free(&w);
	lay.regions[2].bound = 1e-3;

	/* Layout comparison names the region that differs. */
	struct snap_layout other;
	float y[10];
	struct snap_region r = { .name = "layer.0.weight", .ptr = y, .bytes = sizeof(y), .dtype = SNAP_DTYPE_F32 };
	CHECK_RC(snap_layout_build(&other, &r, 1, 4096, err, sizeof(err)), 0);
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
	CHECK(c.world_size == 1 && !strcmp(c.job, "default"));
	setenv("SNAP_JOB", "llm-7b", 1);
	setenv("SNAP_STORE", "/dev/shm/node3", 1);
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.rank == 3 && c.world_size == 8);
	/* The socket stays "derive from the store" until it is used (issue 10:
	 * setting cfg.store after init must be enough). */
	CHECK(c.socket[0] == '\0' && !strcmp(c.job, "llm-7b"));
	CHECK_RC(snap_config_socket(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.socket, "/dev/shm/node3/smp.sock"));
	setenv("SNAP_RANK", "5", 1); /* SNAP_* wins over the launcher's */
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.rank == 5);
	setenv("SNAP_JOB", "../etc", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_JOB") != NULL);
	setenv("SNAP_JOB", "ok", 1);
	setenv("SNAP_RANK", "9", 1); /* >= world size 8 */
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_RANK") != NULL && strstr(err, "SNAP_WORLD_SIZE") != NULL);
	setenv("SNAP_RANK", "1", 1);

	/* SNAP_AUTOSTART: the struct's zero is the default (on); 0 turns it off. */
	unsetenv("SNAP_AUTOSTART");
	snap_config_init(&c);
	CHECK(c.autostart == SNAP_AUTOSTART_DEFAULT);
	setenv("SNAP_AUTOSTART", "0", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.autostart == SNAP_AUTOSTART_OFF);
	setenv("SNAP_AUTOSTART", "1", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.autostart == SNAP_AUTOSTART_ON);
	setenv("SNAP_AUTOSTART", "yes", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_AUTOSTART") != NULL);
	unsetenv("SNAP_AUTOSTART");
	c.autostart = 7;
	CHECK_RC(snap_config_check(&c, err, sizeof(err)), SNAP_EINVAL);
	c.autostart = SNAP_AUTOSTART_DEFAULT;

	/* The launch: SNAP_LAUNCH, else the launcher's (torchrun, srun, mpirun). */
	const char *launch_vars[] = { "SNAP_LAUNCH", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID",
				      "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "PMIX_NAMESPACE" };
	for (size_t i = 0; i < sizeof(launch_vars) / sizeof(*launch_vars); i++)
		unsetenv(launch_vars[i]);
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.launch[0] == '\0');
	setenv("PMIX_NAMESPACE", "prterun-vm-1234@1", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.launch, "pmix:prterun-vm-1234@1"));
	setenv("SLURM_JOB_ID", "77", 1); /* a shell in an allocation: no step, no launch of its own */
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.launch, "pmix:prterun-vm-1234@1"));
	setenv("SLURM_STEP_ID", "3", 1);
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.launch, "slurm:77.3:0"));
	setenv("TORCHELASTIC_RUN_ID", "r9", 1);
	setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.launch, "torchelastic:r9:2"));
	setenv("SNAP_LAUNCH", "mine", 1);
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.launch, "mine"));
	setenv("SNAP_LAUNCH", "a\nb", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "SNAP_LAUNCH") != NULL);
	for (size_t i = 0; i < sizeof(launch_vars) / sizeof(*launch_vars); i++)
		unsetenv(launch_vars[i]);

	/* Codec defaults: the four spellings, and each malformed one named. */
	setenv("SNAP_CODEC_PARAM", "lossless", 1);
	setenv("SNAP_CODEC_OPTIM", "rel:1e-4", 1);
	snap_config_init(&c);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.codec_param == SNAP_CODEC_LOSSLESS && c.codec_optim == SNAP_CODEC_LOSSY_REL && c.codec_optim_bound == 1e-4);
	setenv("SNAP_CODEC_OPTIM", "abs:0.5", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.codec_optim == SNAP_CODEC_LOSSY_ABS && c.codec_optim_bound == 0.5);
	const char *bad[] = { "zstd", "abs:", "abs:-1", "rel:0", "rel:1e-3x", "abs:nan", "lossless:1", "abs:1e400" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("SNAP_CODEC_OPTIM", bad[i], 1);
		CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
		CHECK(strstr(err, "SNAP_CODEC_OPTIM") != NULL);
	}
	setenv("SNAP_CODEC_OPTIM", "none", 1);
	CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(c.codec_optim == SNAP_CODEC_NONE);
	unsetenv("SNAP_CODEC_PARAM");
	unsetenv("SNAP_CODEC_OPTIM");

	/* Restore verification: auto by default, the three names, a bad one named. */
	snap_config_init(&c);
	CHECK(c.restore_verify == SNAP_VERIFY_AUTO);
	const char *modes[] = { "auto", "first", "inline" };
	for (int i = 0; i < 3; i++) {
		setenv("SNAP_RESTORE_VERIFY", modes[i], 1);
		CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), 0);
		CHECK(c.restore_verify == i);
	}
	const char *badv[] = { "INLINE", "none", "1", "first " };
	for (size_t i = 0; i < sizeof(badv) / sizeof(badv[0]); i++) {
		setenv("SNAP_RESTORE_VERIFY", badv[i], 1);
		CHECK_RC(snap_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
		CHECK(strstr(err, "SNAP_RESTORE_VERIFY") != NULL);
	}
	unsetenv("SNAP_RESTORE_VERIFY");
	c.restore_verify = 3;   /* set in C: refused by the check snap_open makes */
	CHECK_RC(snap_config_check(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "restore_verify") != NULL);
}

/* snapsmp's own settings (smp/include/snap/smp_config.h): defaults, every SNAP_* variable,
 * and each malformed one named; the client part still goes through
 * snap_config_from_env. */
static void test_smp_config(void)
{
	struct snap_smp_config c;
	char err[256];
	CHECK_RC(snap_smp_config_init(NULL), SNAP_EINVAL);
	CHECK_RC(snap_smp_config_from_env(NULL, err, sizeof(err)), SNAP_EINVAL);
	CHECK_RC(snap_smp_config_init(&c), 0);
	CHECK(c.slots == 2 && c.flush_keep == 2 && c.flush_mode == 0600 && c.flush_files == 1 && c.flush_direct == 1 &&
	      c.mem_limit >= 4096);
	CHECK(!c.flush_dir[0] && !c.flush_every && !c.flush_interval && !c.flush_codec && !c.allow_older &&
	      !c.verify_commit);
	CHECK(c.client.world_size == 1 && !strcmp(c.client.job, "default"));
	CHECK_RC(snap_smp_config_check(&c, err, sizeof(err)), 0);

	setenv("SNAP_JOB", "llm-7b", 1);
	setenv("SNAP_MEM_LIMIT", "2G", 1);
	setenv("SNAP_SLOTS", "3", 1);
	setenv("SNAP_VERIFY_COMMIT", "1", 1);
	setenv("SNAP_FLUSH_DIR", "/scratch/ckpt", 1);
	setenv("SNAP_FLUSH_EVERY", "5", 1);
	setenv("SNAP_FLUSH_INTERVAL", "60", 1);
	setenv("SNAP_FLUSH_KEEP", "4", 1);
	setenv("SNAP_FLUSH_CODEC", "lz4", 1);
	setenv("SNAP_FLUSH_MODE", "0640", 1);
	setenv("SNAP_ALLOW_OLDER", "1", 1);
	setenv("SNAP_FLUSH_FILES", "0", 1);
	setenv("SNAP_FLUSH_DIRECT", "0", 1);
	CHECK_RC(snap_smp_config_from_env(&c, err, sizeof(err)), 0);
	CHECK(!strcmp(c.client.job, "llm-7b"));
	CHECK(c.mem_limit == 2ull << 30 && c.slots == 3 && c.verify_commit == 1 && !strcmp(c.flush_dir, "/scratch/ckpt"));
	CHECK(c.flush_every == 5 && c.flush_interval == 60 && c.flush_keep == 4 && c.flush_codec == 1);
	CHECK(c.flush_mode == 0640 && c.allow_older == 1 && c.flush_files == 0 && c.flush_direct == 0);

	struct {
		const char *var, *val, *says;
	} bad[] = {
		{ "SNAP_SLOTS", "1", "SNAP_SLOTS" },
		{ "SNAP_SLOTS", "65", "SNAP_SLOTS" },
		{ "SNAP_MEM_LIMIT", "lots", "SNAP_MEM_LIMIT" },
		{ "SNAP_MEM_LIMIT", "100", "SNAP_MEM_LIMIT" },
		{ "SNAP_VERIFY_COMMIT", "2", "SNAP_VERIFY_COMMIT" },
		{ "SNAP_FLUSH_EVERY", "-1", "SNAP_FLUSH_EVERY" },
		{ "SNAP_FLUSH_INTERVAL", "1s", "SNAP_FLUSH_INTERVAL" },
		{ "SNAP_FLUSH_KEEP", "0", "SNAP_FLUSH_KEEP" },
		{ "SNAP_FLUSH_CODEC", "zstd", "SNAP_FLUSH_CODEC" },
		{ "SNAP_FLUSH_MODE", "0400", "SNAP_FLUSH_MODE" },
		{ "SNAP_FLUSH_MODE", "0x600", "SNAP_FLUSH_MODE" },
		{ "SNAP_ALLOW_OLDER", "yes", "SNAP_ALLOW_OLDER" },
		{ "SNAP_FLUSH_FILES", "2", "SNAP_FLUSH_FILES" },
		{ "SNAP_FLUSH_DIRECT", "on", "SNAP_FLUSH_DIRECT" },
		{ "SNAP_FLUSH_DIR", "relative/dir", "SNAP_FLUSH_DIR" },
		{ "SNAP_JOB", "../etc", "SNAP_JOB" },   /* the client part is checked too */
		{ "SNAP_STORE", "relative/store", "SNAP_STORE" },
		{ "SNAP_RANK", "16777216", "SNAP_RANK" }, /* parses, but is outside any world size */
		{ "SNAP_CHUNK_SIZE", "4G", "SNAP_CHUNK_SIZE" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *old = getenv(bad[i].var) ? strdup(getenv(bad[i].var)) : NULL;
		setenv(bad[i].var, bad[i].val, 1);
		snap_smp_config_init(&c);
		err[0] = 0;
		CHECK_RC(snap_smp_config_from_env(&c, err, sizeof(err)), SNAP_EINVAL);
		if (!strstr(err, bad[i].says))
			fprintf(stderr, "%s=%s: error \"%s\" does not say %s\n", bad[i].var, bad[i].val, err, bad[i].says);
		CHECK(strstr(err, bad[i].says) != NULL);
		if (old)
			setenv(bad[i].var, old, 1);
		else
			unsetenv(bad[i].var);
		free(old);
	}

	/* What the command line sets is checked by snap_smp_config_check. */
	CHECK_RC(snap_smp_config_from_env(&c, err, sizeof(err)), 0);
	c.slots = 1;
	CHECK_RC(snap_smp_config_check(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "slots") != NULL);
	c.slots = 2;
	c.flush_mode = 0200;
	CHECK_RC(snap_smp_config_check(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "flush mode") != NULL);
	c.flush_mode = 0600;
	snprintf(c.flush_dir, sizeof(c.flush_dir), "ckpt");
	CHECK_RC(snap_smp_config_check(&c, err, sizeof(err)), SNAP_EINVAL);
	CHECK(strstr(err, "flush directory \"ckpt\"") != NULL);

	unsigned mode = 0;
	int codec = -1;
	CHECK_RC(snap_smp_flush_mode_parse("640", &mode), 0);
	CHECK(mode == 0640);
	CHECK_RC(snap_smp_flush_mode_parse("1600", &mode), SNAP_EINVAL);
	CHECK_RC(snap_smp_flush_mode_parse("", &mode), SNAP_EINVAL);
	CHECK_RC(snap_smp_flush_codec_parse("none", &codec), 0);
	CHECK(codec == 0);
	CHECK_RC(snap_smp_flush_codec_parse("LZ4", &codec), SNAP_EINVAL);

	const char *vars[] = { "SNAP_MEM_LIMIT", "SNAP_SLOTS", "SNAP_VERIFY_COMMIT", "SNAP_FLUSH_DIR", "SNAP_FLUSH_EVERY",
			       "SNAP_FLUSH_INTERVAL", "SNAP_FLUSH_KEEP", "SNAP_FLUSH_CODEC", "SNAP_FLUSH_MODE",
			       "SNAP_ALLOW_OLDER", "SNAP_FLUSH_FILES", "SNAP_FLUSH_DIRECT" };
	for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
		unsetenv(vars[i]);
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

/* A STATUS reply in the daemon's order (smp/requests.c), cut after `fields`
 * of its 15 fields (older daemons send 6, 7 or 14). */
static struct snap_wbuf status_reply(int fields, const char *last)
{
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, 1ull << 40);   /* mem_limit */
	snap_put_u64(&w, 3ull << 30);   /* mem_used */
	snap_put_u32(&w, 3);        /* slots */
	snap_put_u32(&w, 4242);     /* pid */
	snap_put_u64(&w, 1ull << 30);
	snap_put_u32(&w, 2);        /* pinners */
	if (fields > 6)
		snap_put_u32(&w, 5);    /* reserving */
	if (fields > 7) {
		for (uint64_t i = 0; i < 5; i++)
			snap_put_u64(&w, 10 + i);
		snap_put_str(&w, last);
	}
	if (fields > 14)
		snap_put_u64(&w, 9);    /* damaged_files */
	return w;
}

static void test_status_reply(void)
{
	struct snap_status st;
	struct snap_wbuf w = status_reply(15, "job a step 7: chunk 3 beyond repair");
	CHECK_RC(snap_status_decode(w.p, w.len, &st), 0);
	CHECK(st.mem_limit == 1ull << 40 && st.mem_used == 3ull << 30 && st.slots == 3 && st.pid == 4242);
	CHECK(st.pinned == 1ull << 30 && st.pinners == 2 && st.reserving == 5 && st.has_heal && st.has_files);
	CHECK(st.repaired_chunks == 10 && st.damaged_steps == 11 && st.scrubbed_bytes == 12 && st.scrub_passes == 13);
	CHECK(st.scrub_rate == 14 && st.damaged_files == 9 && !strcmp(st.last_damage, "job a step 7: chunk 3 beyond repair"));
	/* every cut inside a field is malformed, and leaves nothing behind */
	for (size_t cut = 0; cut < w.len; cut++) {
		int whole = cut == 36 || cut == 40 || cut == w.len - 8;   /* the ends older daemons send */
		CHECK_RC(snap_status_decode(w.p, cut, &st), whole ? 0 : -1);
		if (!whole)
			CHECK(st.mem_limit == 0 && st.pid == 0 && !st.has_heal);
	}
	snap_wbuf_free(&w);

	/* older daemons: no reserving, no self-healing counters, no damaged_files */
	w = status_reply(6, "none");
	CHECK_RC(snap_status_decode(w.p, w.len, &st), 0);
	CHECK(st.pinners == 2 && st.reserving == 0 && !st.has_heal && !st.has_files);
	snap_wbuf_free(&w);
	w = status_reply(7, "none");
	CHECK_RC(snap_status_decode(w.p, w.len, &st), 0);
	CHECK(st.reserving == 5 && !st.has_heal && !st.has_files);
	snap_wbuf_free(&w);
	w = status_reply(14, "none");
	CHECK_RC(snap_status_decode(w.p, w.len, &st), 0);
	CHECK(st.has_heal && !st.has_files && st.scrubbed_bytes == 12 && !strcmp(st.last_damage, "none"));
	snap_wbuf_free(&w);

	/* a control character in the damage line is refused */
	w = status_reply(15, "bad\nline");
	CHECK_RC(snap_status_decode(w.p, w.len, &st), -1);
	snap_wbuf_free(&w);

	/* no daemon on the socket */
	CHECK_RC(snap_status_ask("/nonexistent/smp.sock", 100, &st), -1);
	CHECK(st.mem_limit == 0 && !st.has_heal);
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
	test_smp_config();
	test_status_reply();
	return check_done("test_formats");
}
