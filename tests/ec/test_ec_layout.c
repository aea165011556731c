/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * test_ec_layout.c - group formation, tail policy, rotation balance and
 * overhead, the placement inverse functions, CRC32C, bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/base.h"
#include "snap/ec.h"

static int failures;
#define CHECK(c, ...)                                                        \
	do {                                                                 \
		if (!(c)) {                                                  \
			failures++;                                          \
			fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c); \
			fprintf(stderr, __VA_ARGS__);                        \
			fputc('\n', stderr);                                 \
		}                                                            \
	} while (0)

/* Every rank maps to exactly one group; groups are contiguous and sized by
 * the documented tail policy. */
static void check_mesh(int nodes, int k, int m)
{
	char err[256];
	struct snap_ec_group g, prev = { .id = -1 };
	int size = k + m, tail = nodes % size, full = nodes / size;
	int refused = (tail && tail <= m && full == 0);
	int members = 0;
	for (int r = 0; r < nodes; r++) {
		int rc = snap_ec_group_of(nodes, k, m, 0, r, &g, err, sizeof(err));
		if (refused) {
			CHECK(rc == SNAP_EINVAL && strstr(err, "cannot form"), "N=%d %d+%d: %s", nodes, k, m, err);
			return;
		}
		CHECK(rc == 0, "N=%d %d+%d r=%d: %s", nodes, k, m, r, err);
		if (rc)
			return;
		CHECK(g.first_rank + g.index == r, "rank %d", r);
		CHECK(g.n == g.k + g.m && g.m == m && g.k >= 1, "shape");
		if (g.id != prev.id) {
			CHECK(g.id == prev.id + 1 && g.index == 0, "groups in order");
			if (prev.id >= 0)
				CHECK(members == prev.n, "group %d has %d members, says %d", prev.id, members, prev.n);
			members = 0;
		}
		members++;
		int expect_n = size;
		if (tail > m && g.id == full)
			expect_n = tail;
		if (tail && tail <= m && g.id == full - 1)
			expect_n = size + tail;
		CHECK(g.n == expect_n, "N=%d %d+%d group %d n=%d expect %d", nodes, k, m, g.id, g.n, expect_n);
		CHECK(g.ngroups == full + (tail > m), "ngroups");
		prev = g;
	}
	CHECK(members == prev.n, "last group");
	int rc = snap_ec_group_of(nodes, k, m, SNAP_EC_TAIL_STRICT, 0, &g, err, sizeof(err));
	CHECK(tail ? rc == SNAP_EINVAL && strstr(err, "strict") : rc == 0, "strict N=%d", nodes);
}

/* Within a group: each stripe has n distinct members, each node sends k
 * segments and holds m parity rows, and the maps invert each other. */
static void check_rotation(int k, int m)
{
	struct snap_ec_group g = { .id = 0, .ngroups = 1, .n = k + m, .k = k, .m = m };
	int n = k + m;
	int *dcount = calloc((size_t)n, sizeof(int)), *pcount = calloc((size_t)n, sizeof(int));
	for (int s = 0; s < n; s++) {
		int *seen = calloc((size_t)n, sizeof(int));
		for (int t = 0; t < k; t++) {
			int h = snap_ec_data_holder(&g, s, t);
			CHECK(h >= 0 && h < n, "holder");
			seen[h]++;
			dcount[h]++;
			CHECK(snap_ec_data_stripe(&g, h, t) == s, "data inverse %d+%d s=%d t=%d", k, m, s, t);
		}
		for (int p = 0; p < m; p++) {
			int h = snap_ec_parity_holder(&g, s, p);
			seen[h]++;
			pcount[h]++;
			CHECK(snap_ec_parity_stripe(&g, h, p) == s, "parity inverse");
		}
		for (int j = 0; j < n; j++)
			CHECK(seen[j] == 1, "%d+%d stripe %d: node %d appears %d times", k, m, s, j, seen[j]);
		free(seen);
	}
	for (int j = 0; j < n; j++) {
		CHECK(dcount[j] == k && pcount[j] == m, "%d+%d node %d: %d data %d parity", k, m, j,
		      dcount[j], pcount[j]);
		/* storage overhead: m parity segments of L/k per L bytes of data */
		uint64_t L = 1000003;
		uint64_t par = (uint64_t)m * snap_ec_seg_len(k, L);
		double ovh = (double)par / (double)L;
		CHECK(ovh >= (double)m / k && ovh <= (double)m / k + (double)m / (double)L, "overhead %f", ovh);
	}
	free(dcount);
	free(pcount);
}

int main(void)
{
	char err[256], line[512];
	for (int k = 1; k <= 8; k++)
		for (int m = 1; m <= 3; m++) {
			check_rotation(k, m);
			for (int nodes = 1; nodes <= 40; nodes++)
				check_mesh(nodes, k, m);
		}
	check_rotation(200, 55);
	/* worked example from the header: 14 nodes of 4+2 -> 6,6 + tail 2 merged */
	struct snap_ec_group g;
	CHECK(snap_ec_group_of(14, 4, 2, 0, 13, &g, err, sizeof(err)) == 0, "%s", err);
	CHECK(g.id == 1 && g.n == 8 && g.k == 6 && g.first_rank == 6 && g.index == 7, "merged tail");
	CHECK(snap_ec_group_of(15, 4, 2, 0, 14, &g, err, sizeof(err)) == 0, "%s", err);
	CHECK(g.id == 2 && g.n == 3 && g.k == 1 && g.ngroups == 3, "own tail group");
	CHECK(snap_ec_group_of(6, 4, 2, 0, 2, &g, err, sizeof(err)) == 0, "%s", err);
	int want = snap_ec_describe(&g, line, sizeof(line));
	CHECK(want > 0 && (size_t)want < sizeof(line) && strstr(line, "4+2, overhead 0.50") &&
	      strstr(line, "index 2"), "describe: %s", line);
	char tiny[8];
	CHECK(snap_ec_describe(&g, tiny, sizeof(tiny)) == want && strlen(tiny) == 7, "truncation");

	/* bad arguments */
	CHECK(snap_ec_group_of(6, 0, 2, 0, 0, &g, err, sizeof(err)) == SNAP_EINVAL, "k=0");
	CHECK(snap_ec_group_of(6, 4, 0, 0, 0, &g, err, sizeof(err)) == SNAP_EINVAL, "m=0");
	CHECK(snap_ec_group_of(300, 250, 6, 0, 0, &g, err, sizeof(err)) == SNAP_EINVAL &&
	      strstr(err, "255"), "k+m too big: %s", err);
	CHECK(snap_ec_group_of(6, 4, 2, 0, 6, &g, err, sizeof(err)) == SNAP_EINVAL, "rank range");
	CHECK(snap_ec_group_of(6, 4, 2, 0, -1, &g, NULL, 0) == SNAP_EINVAL, "negative rank");
	CHECK(snap_ec_group_of(2, 4, 2, 0, 0, &g, err, sizeof(err)) == SNAP_EINVAL, "N <= m");
	CHECK(snap_ec_group_of(6, 4, 2, 0, 0, NULL, err, sizeof(err)) == SNAP_EINVAL, "NULL");
	CHECK(snap_ec_group_of(511, 253, 2, 0, 0, &g, err, sizeof(err)) == SNAP_EINVAL &&
	      strstr(err, "merging"), "merged group too big: %s", err);
	struct snap_ec_group bad = { .n = 6, .k = 3, .m = 2 };
	CHECK(snap_ec_data_stripe(&bad, 0, 0) == SNAP_EINVAL, "inconsistent group");
	CHECK(snap_ec_data_stripe(&g, 0, 4) == SNAP_EINVAL, "seg range");
	CHECK(snap_ec_parity_holder(&g, 6, 0) == SNAP_EINVAL, "stripe range");
	CHECK(snap_ec_parity_stripe(&g, 0, 2) == SNAP_EINVAL, "row range");
	CHECK(snap_ec_seg_len(4, 0) == 0 && snap_ec_seg_len(4, 9) == 3 && snap_ec_seg_len(0, 9) == 0, "seg_len");

	/* CRC-32C check value and chaining */
	CHECK(snap_crc32c_update(0, "123456789", 9) == 0xE3069283u, "crc32c %08x",
	      snap_crc32c_update(0, "123456789", 9));
	CHECK(snap_crc32c_update(snap_crc32c_update(0, "1234", 4), "56789", 5) == 0xE3069283u, "chained");

	if (failures) {
		fprintf(stderr, "test_ec_layout: %d failures\n", failures);
		return 1;
	}
	printf("test_ec_layout: ok\n");
	return 0;
}
