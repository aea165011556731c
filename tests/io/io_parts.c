/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Per-node flush directories (a dir naming the node as %n): each node
 * writes and seals its part; readers see the union. Checks that a step is
 * persisted only once the parts cover the world, that every read call
 * (list, world, regions, read, verify, export, lost step) goes through the
 * pattern, that a lone part read as a whole step, a rank in two parts,
 * parts of different worlds and a corrupt part are refused by name, and
 * that retention removes whole steps across the nodes while keeping the
 * newest persisted one and a newer step whose parts are still arriving;
 * a withdrawn part is an unfinished flush (not a lost step) until sealed again.
 * usage: io_parts DIR
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io_testutil.h"

#define JOB "parts"
#define WORLD 4
#define N (64 * 1024)

static float data[WORLD][N];
static char pattern[512];

static void node_dir(char *out, size_t cap, int node)
{
	const char *at = strstr(pattern, "%n");
	snprintf(out, cap, "%.*s%d%s", (int)(at - pattern), pattern, node, at + 2);
}

/* Node `node` writes ranks[0..n) of step and, when seal, seals them as its part. */
static void write_part(int node, uint64_t step, uint32_t world, const uint32_t *ranks, size_t n, int seal)
{
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.chunk_bytes = 16 << 10};
	struct snap_io_writer *w = snap_io_writer_new(&o, &err);
	CHECK(w);
	char nd[600];
	node_dir(nd, sizeof nd, node);
	for (size_t i = 0; i < n; i++) {
		uint32_t r = ranks[i];
		for (size_t k = 0; k < N; k++)
			data[r][k] = (float)(step * 1000 + r) + (float)k * 1e-3f;
		uint64_t g[1] = {(uint64_t)N * world}, off[1] = {(uint64_t)N * r}, sh[1] = {N};
		struct snap_io_region reg = io_t_region("w", SNAP_DTYPE_F32, 1, g, off, sh, data[r]);
		OK(snap_io_write_rank(w, nd, JOB, step, r, world, &reg, 1, NULL, &err), &err);
	}
	snap_io_writer_free(w);
	if (seal)
		OK(snap_io_part_seal(nd, JOB, step, world, ranks, n, &err), &err);
}

static int listed(uint64_t step)
{
	uint64_t s[16];
	int n = snap_io_list_steps(pattern, JOB, s, 16, NULL);
	for (int i = 0; i < n && i < 16; i++)
		if (s[i] == step)
			return 1;
	return 0;
}

static void read_back(uint64_t step)
{
	static float got[N];
	struct snap_io_err err = {0};
	for (uint32_t r = 0; r < WORLD; r++) {
		struct snap_io_dest d = {.name = "w", .buf = got, .bytes = sizeof got};
		OK(snap_io_read_rank(pattern, JOB, step, r, &d, 1, &err), &err);
		CHECK(got[0] == (float)(step * 1000 + r) && got[N - 1] == (float)(step * 1000 + r) + (float)(N - 1) * 1e-3f);
	}
	size_t bad = 9;
	OK(snap_io_verify_step(pattern, JOB, step, &bad, &err), &err);
	CHECK(bad == 0);
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: io_parts DIR\n");
		return 2;
	}
	char cmd[2000];
	snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", argv[1], argv[1]);
	CHECK(system(cmd) == 0);
	snprintf(pattern, sizeof pattern, "%s/node%%n", argv[1]);
	struct snap_io_err err = {0};
	uint32_t world = 0;
	uint32_t even[2] = {0, 2}, odd[2] = {1, 3};

	printf("step 1: node 0 holds ranks 0 and 2, node 1 ranks 1 and 3\n");
	write_part(0, 1, WORLD, even, 2, 1);
	write_part(1, 1, WORLD, odd, 2, 0);
	CHECK(!listed(1));
	EXPECT_ERR(snap_io_step_world(pattern, JOB, 1, &world, &err), SNAP_ENOENT, &err, "not persisted",
		   "2 of 4 ranks", "rank 1 is not");
	uint64_t lost = 0;
	CHECK(!snap_io_lost_step(pattern, JOB, 0, &lost)); /* node 1's part is a flush under way */
	char nd1[600], nd0[600], p[800];
	node_dir(nd0, sizeof nd0, 0);
	node_dir(nd1, sizeof nd1, 1);
	OK(snap_io_part_seal(nd1, JOB, 1, WORLD, odd, 2, &err), &err);
	CHECK(listed(1));
	OK(snap_io_step_world(pattern, JOB, 1, &world, &err), &err);
	CHECK(world == WORLD);
	read_back(1);
	/* idempotent for the same ranks; another rank set is refused */
	OK(snap_io_part_seal(nd1, JOB, 1, WORLD, odd, 2, &err), &err);
	EXPECT_ERR(snap_io_part_seal(nd1, JOB, 1, WORLD, odd, 1, &err), SNAP_ESTATE, &err, "already sealed");

	printf("export through the pattern, both modes\n");
	snprintf(p, sizeof p, "%s/export-copy.h5", argv[1]);
	OK(snap_io_export(pattern, JOB, 1, p, SNAP_IO_EXPORT_COPY, &err), &err);
	CHECK(exists(p));
	snprintf(p, sizeof p, "%s/export-virtual.h5", argv[1]);
	OK(snap_io_export(pattern, JOB, 1, p, SNAP_IO_EXPORT_VIRTUAL, &err), &err);
	CHECK(exists(p));

	printf("bad input\n");
	EXPECT_ERR(snap_io_step_world(nd0, JOB, 1, &world, &err), SNAP_EINVAL, &err, "one node's part", "%n");
	EXPECT_ERR(snap_io_step_seal(pattern, JOB, 1, WORLD, &err), SNAP_EINVAL, &err, "snap_io_part_seal");
	EXPECT_ERR(snap_io_part_seal(pattern, JOB, 1, WORLD, odd, 2, &err), SNAP_EINVAL, &err, "not the pattern");
	uint32_t twice[2] = {1, 1}, big[1] = {WORLD};
	EXPECT_ERR(snap_io_part_seal(nd1, JOB, 9, WORLD, twice, 2, &err), SNAP_EINVAL, &err, "listed twice");
	EXPECT_ERR(snap_io_part_seal(nd1, JOB, 9, WORLD, big, 1, &err), SNAP_EINVAL, &err, "not below the world");
	EXPECT_ERR(snap_io_part_seal(nd1, JOB, 9, WORLD, odd, 2, &err), SNAP_ENOENT, &err, "rank-1.h5", "missing");
	{
		struct snap_io_opts o = {0};
		struct snap_io_writer *w = snap_io_writer_new(&o, &err);
		uint64_t g[1] = {N}, off[1] = {0}, sh[1] = {N};
		struct snap_io_region reg = io_t_region("w", SNAP_DTYPE_F32, 1, g, off, sh, data[0]);
		EXPECT_ERR(snap_io_write_rank(w, pattern, JOB, 9, 0, 1, &reg, 1, NULL, &err), SNAP_EINVAL, &err,
			   "one node's directory");
		snap_io_writer_free(w);
	}
	char twice_pat[600];
	snprintf(twice_pat, sizeof twice_pat, "%s/n%%n/%%n", argv[1]);
	EXPECT_ERR(snap_io_list_steps(twice_pat, JOB, NULL, 0, &err), SNAP_EINVAL, &err, "once");
	/* directories that only look like nodes are not nodes */
	snprintf(cmd, sizeof cmd, "mkdir -p '%s/node01/%s/step-1' '%s/nodex/%s/step-1' '%s/node/%s'", argv[1], JOB,
		 argv[1], JOB, argv[1], JOB);
	CHECK(system(cmd) == 0);
	snprintf(cmd, sizeof cmd, "cp '%s/%s/step-1/MANIFEST' '%s/node01/%s/step-1/'", nd1, JOB, argv[1], JOB);
	CHECK(system(cmd) == 0);
	CHECK(listed(1));
	read_back(1);

	printf("a rank in two parts, and parts of different worlds\n");
	uint32_t one[1] = {1};
	write_part(2, 1, WORLD, one, 1, 1);
	EXPECT_ERR(snap_io_step_world(pattern, JOB, 1, &world, &err), SNAP_ECORRUPT, &err, "rank 1 of step 1",
		   "also in node 1");
	CHECK(!listed(1));
	snprintf(cmd, sizeof cmd, "rm -rf '%s/node2'", argv[1]);
	CHECK(system(cmd) == 0);
	CHECK(listed(1));
	write_part(2, 2, WORLD, even, 2, 1);
	write_part(3, 2, WORLD + 1, odd, 2, 1);
	EXPECT_ERR(snap_io_step_world(pattern, JOB, 2, &world, &err), SNAP_ECORRUPT, &err, "world");
	snprintf(cmd, sizeof cmd, "rm -rf '%s/node2' '%s/node3'", argv[1], argv[1]);
	CHECK(system(cmd) == 0);

	printf("a corrupt part makes its step unreadable, by name\n");
	write_part(0, 2, WORLD, even, 2, 1);
	write_part(1, 2, WORLD, odd, 2, 1);
	CHECK(listed(2));
	snprintf(p, sizeof p, "%s/%s/step-2/MANIFEST", nd1, JOB);
	{
		int fd = open(p, O_RDWR);
		CHECK(fd >= 0);
		char c;
		CHECK(pread(fd, &c, 1, 30) == 1);
		c ^= 1;
		CHECK(pwrite(fd, &c, 1, 30) == 1);
		close(fd);
	}
	CHECK(!listed(2) && listed(1));
	uint64_t torn = 0;
	CHECK(snap_io_sealed_step(pattern, JOB, &torn) == 1 && torn == 2);   /* a torn part was sealed */
	EXPECT_ERR(snap_io_verify_step(pattern, JOB, 2, NULL, &err), SNAP_ECORRUPT, &err, "node1", "torn or corrupt");
	/* a part whose MANIFEST was lost after sealing is evidence of a lost step */
	CHECK(unlink(p) == 0);
	CHECK(snap_io_lost_step(pattern, JOB, 1, &lost) == 1 && lost == 2);
	OK(snap_io_part_seal(nd1, JOB, 2, WORLD, odd, 2, &err), &err);
	CHECK(listed(2));
	read_back(2);
	/* a rank file of a part removed: the step is damaged, by name */
	snprintf(p, sizeof p, "%s/%s/step-2/rank-3.h5", nd1, JOB);
	snprintf(cmd, sizeof cmd, "mv '%s' '%s.aside'", p, p);
	CHECK(system(cmd) == 0);
	CHECK(!listed(2));
	uint64_t sealed = 0;
	CHECK(snap_io_sealed_step(pattern, JOB, &sealed) == 1 && sealed == 2);   /* sealed, damaged since */
	EXPECT_ERR(snap_io_step_world(pattern, JOB, 2, &world, &err), SNAP_ENOENT, &err, "rank-3.h5", "damaged");
	snprintf(cmd, sizeof cmd, "mv '%s.aside' '%s'", p, p);
	CHECK(system(cmd) == 0);
	CHECK(listed(2));

	printf("retention across the nodes\n");
	write_part(0, 3, WORLD, even, 2, 1);
	write_part(1, 3, WORLD, odd, 2, 1);
	write_part(0, 4, WORLD, even, 2, 1);   /* step 4: node 1's part still arriving */
	write_part(1, 4, WORLD, odd, 1, 0);
	CHECK(listed(3) && !listed(4));
	CHECK(snap_io_sealed_step(pattern, JOB, &sealed) == 1 && sealed == 3);   /* 4: a part still arriving */
	int removed = snap_io_retain(pattern, JOB, 1, &err);
	OK(removed, &err);
	CHECK(removed == 4);   /* steps 1 and 2, a part on each node */
	CHECK(!listed(1) && !listed(2) && listed(3));
	read_back(3);
	for (int node = 0; node < 2; node++) {
		char nd[600];
		node_dir(nd, sizeof nd, node);
		for (int s = 1; s <= 4; s++) {
			snprintf(p, sizeof p, "%s/%s/step-%d", nd, JOB, s);
			CHECK(exists(p) == (s >= 3));
		}
	}
	/* node 1 finishes step 4: it is persisted, and retention keeps only it */
	write_part(1, 4, WORLD, odd, 2, 1);
	CHECK(listed(4));
	OK(snap_io_retain(pattern, JOB, 1, &err), &err);
	CHECK(!listed(3) && listed(4));
	read_back(4);
	uint64_t newest = 0;
	OK(snap_io_newest_step(pattern, JOB, &newest, &err), &err);
	CHECK(newest == 4);

	printf("withdrawing a part\n");
	CHECK(snap_io_part_withdraw(nd1, JOB, 4, &err) == 1);
	CHECK(!listed(4) && !snap_io_lost_step(pattern, JOB, 0, &lost)); /* marked unfinished, not lost */
	CHECK(snap_io_part_withdraw(nd1, JOB, 4, &err) == 0);
	CHECK(snap_io_sealed_step(pattern, JOB, &sealed) == 0);   /* step 3 went to retention */
	write_part(1, 4, WORLD, odd, 2, 1);   /* rewritten over its old files, sealed again */
	CHECK(listed(4));
	read_back(4);
	EXPECT_ERR(snap_io_part_withdraw(pattern, JOB, 4, &err), SNAP_EINVAL, &err, "not the pattern");
	{
		char whole[600];
		snprintf(whole, sizeof whole, "%s/whole", argv[1]);
		struct snap_io_opts o = {0};
		struct snap_io_writer *w = snap_io_writer_new(&o, &err);
		uint64_t g[1] = {N}, off[1] = {0}, sh[1] = {N};
		struct snap_io_region reg = io_t_region("w", SNAP_DTYPE_F32, 1, g, off, sh, data[0]);
		OK(snap_io_write_rank(w, whole, JOB, 1, 0, 1, &reg, 1, NULL, &err), &err);
		snap_io_writer_free(w);
		OK(snap_io_step_seal(whole, JOB, 1, 1, &err), &err);
		EXPECT_ERR(snap_io_part_withdraw(whole, JOB, 1, &err), SNAP_ESTATE, &err, "whole step");
		uint64_t s1 = 0;
		OK(snap_io_newest_step(whole, JOB, &s1, &err), &err);
		CHECK(s1 == 1);
	}
	printf("io_parts: ok\n");
	return 0;
}
