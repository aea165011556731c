/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The C API against a real snapsmp: the save/fence/wait/restore contract,
 * the errors users hit (unfenced save, frozen layout, steps going back,
 * layout mismatch, unknown job, memory budget, a second process for a rank),
 * and corruption of a committed slot. The restore's own faults (inline
 * checking, huge-page stores, failing reads) are test_restore_faults.c's.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <sched.h>
#include <stdint.h>
#include <sys/stat.h>

#include "../check.h"
#include "harness.h"
#include "snap/base.h"

#include "api_fixture.h"

/* Threads of this process whose policy (field 41 of /proc/self/task/N/stat) is SCHED_BATCH. */
static unsigned batch_threads(void)
{
	glob_t g;
	unsigned n = 0;
	if (glob("/proc/self/task/*/stat", 0, NULL, &g) != 0)
		return 0;
	for (size_t i = 0; i < g.gl_pathc; i++) {
		char buf[1024];
		FILE *f = fopen(g.gl_pathv[i], "r");
		size_t len = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
		if (f)
			fclose(f);
		buf[len] = '\0';
		char *s = strrchr(buf, ')'), *save = NULL;
		int field = 2;
		for (char *tok = s ? strtok_r(s + 1, " ", &save) : NULL; tok; tok = strtok_r(NULL, " ", &save))
			if (++field == 41) {
				n += strtol(tok, NULL, 10) == SCHED_BATCH;
				break;
			}
	}
	globfree(&g);
	return n;
}

static void test_cycle(struct smp_proc *p)
{
	snap_ctx *ctx = open_job(p, "a", 1);
	uint64_t step = 0;
	CHECK(ctx != NULL);
	if (!ctx)
		return;
	/* Every copy thread is a batch thread once snap_open returns: a save's
	 * wake-up does not preempt the trainer (pool.c). */
	struct snap_config d;
	snap_config_init(&d);
	unsigned nb = batch_threads();
	CHECK(nb == d.copy_threads);
	if (nb != d.copy_threads)
		fprintf(stderr, "%u SCHED_BATCH threads, %u copy threads\n", nb, d.copy_threads);
	CHECK_RC(snap_latest(ctx, &step), SNAP_ENOENT);
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, NULL), SNAP_ENOENT);

	fill(1);
	CHECK_RC(snap_save(ctx, 1), 0);
	CHECK_RC(snap_save(ctx, 2), SNAP_EUNFENCED);
	CHECK(strstr(snap_errmsg(ctx), "snap_fence") != NULL);
	struct snap_region late = { .name = "late", .ptr = w, .bytes = 4, .dtype = SNAP_DTYPE_F32 };
	CHECK_RC(snap_register(ctx, &late), SNAP_ESTATE);
	CHECK_RC(snap_fence(ctx), 0);
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(snap_latest(ctx, &step), 0);
	CHECK(step == 1);

	fill(2);
	CHECK_RC(snap_save(ctx, 2), 0);
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(snap_save(ctx, 2), SNAP_EINVAL);   /* steps must increase */

	fill(99);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 2 && is_step(2));
	CHECK_RC(snap_restore(ctx, 1, &got), 0);     /* both slots hold a step */
	CHECK(got == 1 && is_step(1));

	fill(3);
	CHECK_RC(snap_save(ctx, 3), 0);              /* overwrites step 1's slot */
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(snap_restore(ctx, 1, &got), SNAP_ENOENT);

	/* Rewind: restore 2, save 3 again -> the old step 3 is replaced. */
	CHECK_RC(snap_restore(ctx, 2, &got), 0);
	CHECK(got == 2 && is_step(2));
	fill(3);
	CHECK_RC(snap_save(ctx, 3), 0);
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(snap_latest(ctx, &step), 0);
	CHECK(step == 3);
	CHECK_RC(snap_restore(ctx, 2, &got), 0);   /* step 2 survived the rewind */
	CHECK_RC(snap_close(ctx), 0);
}

static void test_mismatch_and_unknown_job(struct smp_proc *p)
{
	/* Same job and rank, but "w" registered with another size. */
	snap_ctx *ctx = open_job(p, "a", 0);
	static float small[100];
	for (int i = 0; i < 100; i++)
		small[i] = -1;
	struct snap_region a = { .name = "w", .ptr = small, .bytes = sizeof(small), .dtype = SNAP_DTYPE_F32 };
	struct snap_region b = { .name = "rng", .ptr = rng, .bytes = sizeof(rng), .dtype = SNAP_DTYPE_U8 };
	CHECK_RC(snap_register(ctx, &a), 0);
	CHECK_RC(snap_register(ctx, &b), 0);
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, NULL), SNAP_EMISMATCH);
	CHECK(strstr(snap_errmsg(ctx), "\"w\"") != NULL);
	CHECK(small[0] == -1 && small[99] == -1);   /* untouched */
	snap_close(ctx);

	ctx = open_job(p, "nosuch", 1);
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, NULL), SNAP_ENOENT);
	CHECK(strstr(snap_errmsg(ctx), "nosuch") != NULL);
	snap_close(ctx);
}

static void test_one_process_per_rank(struct smp_proc *p)
{
	snap_ctx *a = open_job(p, "a", 1), *b;
	struct snap_config c;
	smp_cfg(&c, p, "a", 0, 1);
	c.timeout_ms = 200;
	CHECK_RC(snap_open(&c, &b), SNAP_EBUSY);
	CHECK(strstr(snap_errmsg(b), "already connected") != NULL);
	snap_close(b);
	snap_close(a);
}

/* A fresh step 3 of job "a" rank 1 (after step 2), one byte of chunk 1 of
 * "w" flipped: each case below costs the step (no flush directory holds
 * another copy, so snapsmp withdraws it). */
static void corrupt_step3(struct smp_proc *p)
{
	snap_ctx *ctx = open_job(p, "a", 1);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, 2, &got), 0);
	fill(3);
	CHECK_RC(snap_save(ctx, 3), 0);
	CHECK_RC(snap_wait(ctx), 0);
	snap_close(ctx);
	char path[512];
	CHECK_RC(slot_of(p->store, "a", 3, path, sizeof(path)), 0);
	flip_byte(path, 300 * 1024);   /* inside chunk 1 of "w" */
}

/*
 * One flipped byte in step 3's slot, restored by new contexts (as after a
 * relaunch). Chunks of w are 256 KiB: N floats are 4 of them.
 */
static void test_corrupt_chunk(struct smp_proc *p)
{
	char path[512];
	CHECK_RC(slot_of(p->store, "a", 3, path, sizeof(path)), 0);
	flip_byte(path, 300 * 1024);   /* inside chunk 1 of "w" */
	/* restore_verify auto, in a context that has not saved: each chunk is
	 * checked as it is copied. An explicit step never falls back: refused by
	 * name, the good chunks were copied, and no other level holds it. */
	snap_ctx *ctx = open_job(p, "a", 1);
	fill(77);
	CHECK_RC(snap_restore(ctx, 3, NULL), SNAP_ECORRUPT);
	CHECK(strstr(snap_errmsg(ctx), "\"w\" chunk 1") != NULL);
	CHECK(strstr(snap_errmsg(ctx), "partly overwritten") && strstr(snap_errmsg(ctx), "as it was copied"));
	CHECK(strstr(snap_errmsg(ctx), "no level holds a good copy") != NULL);
	CHECK(holds(3, 0, N / 4) && holds(3, N / 2, N));
	CHECK_RC(snap_restore(ctx, 3, NULL), SNAP_ENOENT);   /* withdrawn */
	snap_close(ctx);
	/* The newest step that restores, into a buffer not aligned like the
	 * slot: step 3 is bad, so step 2, every byte written again, and said. */
	corrupt_step3(p);
	wp = w_mis;
	ctx = open_job(p, "a", 1);
	fill(77);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 2 && is_step(2));
	CHECK(strstr(snap_errmsg(ctx), "fell back to step 2") && strstr(snap_errmsg(ctx), "\"w\" chunk 1"));
	snap_close(ctx);
	wp = w;
	/* first: every chunk before any byte is written, memory untouched. */
	corrupt_step3(p);
	ctx = open_job_verify(p, "a", 1, SNAP_VERIFY_FIRST);
	fill(77);
	CHECK_RC(snap_restore(ctx, 3, NULL), SNAP_ECORRUPT);
	CHECK(strstr(snap_errmsg(ctx), "\"w\" chunk 1") != NULL);
	CHECK(strstr(snap_errmsg(ctx), "untouched") != NULL);
	CHECK(is_step(77));
	CHECK_RC(snap_restore(ctx, 2, &got), 0);    /* the other step still restores */
	CHECK(got == 2 && is_step(2));
	snap_close(ctx);
}

/*
 * The same, in the process that saved: restore reads the slot through the
 * mapping its saves wrote (not a fresh read of the file), and a byte flipped
 * in the file since is seen there too and refused, memory untouched. Also
 * the last chunk of a region, and a region shorter than a page.
 */
static void test_corrupt_chunk_saved_mapping(struct smp_proc *p)
{
	char path[512];
	snap_ctx *ctx = open_saved(p, "mapped", SNAP_VERIFY_AUTO, path, sizeof(path));
	if (!ctx)
		return;
	flip_byte(path, 1000 * 1024);   /* inside chunk 3, the last of "w" */
	fill(77);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, 2, &got), SNAP_ECORRUPT);
	CHECK(strstr(snap_errmsg(ctx), "\"w\" chunk 3") != NULL);
	CHECK(strstr(snap_errmsg(ctx), "untouched") != NULL);
	CHECK(is_step(77));
	CHECK_RC(snap_restore(ctx, 2, &got), SNAP_ENOENT);   /* no other level held it: withdrawn */
	CHECK_RC(snap_restore(ctx, 1, &got), 0);   /* the other slot, also mapped by the saves */
	CHECK(got == 1 && is_step(1));
	/* The rng region: its own chunk after w's, 100 bytes. */
	fill(3);
	CHECK_RC(snap_save(ctx, 3), 0);
	CHECK_RC(snap_wait(ctx), 0);
	CHECK_RC(slot_of(p->store, "mapped", 3, path, sizeof(path)), 0);
	flip_byte(path, (off_t)sizeof(w) + 50);
	fill(77);
	CHECK_RC(snap_restore(ctx, 3, &got), SNAP_ECORRUPT);
	CHECK(strstr(snap_errmsg(ctx), "\"rng\" chunk 0") != NULL);
	CHECK(is_step(77));
	snap_close(ctx);
}

static void test_budget(const char *store)
{
	struct smp_proc p;
	const char *extra[] = { "--mem-limit", "1M", NULL };
	CHECK_RC(smp_start(&p, store, extra), 0);
	snap_ctx *ctx = open_job(&p, "big", 1);   /* 2 slots x ~1 MiB > 1 MiB */
	fill(1);
	CHECK_RC(snap_save(ctx, 1), SNAP_ENOSPC);
	CHECK(strstr(snap_errmsg(ctx), "SNAP_MEM_LIMIT") != NULL);
	snap_close(ctx);
	smp_stop(&p, SIGTERM);
}

static void test_restart_keeps_steps(struct smp_proc *p)
{
	CHECK(WIFEXITED(smp_stop(p, SIGKILL)) == 0);   /* crash */
	CHECK_RC(smp_start(p, p->store, NULL), 0);
	snap_ctx *ctx = open_job(p, "a", 1);
	uint64_t got = 0;
	fill(0);
	/* test_corrupt_chunk went back to step 2, which withdrew step 3. */
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 2 && is_step(2));
	snap_close(ctx);
	int st = smp_stop(p, SIGTERM);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK(access(p->socket, F_OK) != 0);          /* clean shutdown removes it */
}

/* A running trainer survives a daemon crash: the next save reconnects. */
static void test_live_reconnect(const char *store)
{
	struct smp_proc p;
	CHECK_RC(smp_start(&p, store, NULL), 0);
	snap_ctx *ctx = open_job(&p, "live", 1);
	fill(1);
	CHECK_RC(snap_save(ctx, 1), 0);
	CHECK_RC(snap_wait(ctx), 0);
	smp_stop(&p, SIGKILL);
	CHECK_RC(smp_start(&p, store, NULL), 0);
	CHECK_RC(snap_fence(ctx), 0);
	fill(2);
	CHECK_RC(snap_save(ctx, 2), 0);
	CHECK_RC(snap_wait(ctx), 0);
	uint64_t got = 0;
	fill(0);
	CHECK_RC(snap_restore(ctx, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 2 && is_step(2));
	snap_close(ctx);
	smp_stop(&p, SIGTERM);
}

/*
 * Issue 10: ranks 0-2 commit steps 1 and 2, rank 0 alone commits step 3,
 * snapsmp dies (SIGKILL) and restarts while all three processes live on.
 * Ranks 2 and 1 reconnect first and commit step 3. Before the fix the
 * first reconnect started a new generation, whose save withdrew rank 0's
 * committed step 3 as "an older incarnation's", so step 3 never became
 * restorable and every later save found no free slot (SNAP_EBUSY) for ever.
 */
#define LR_BYTES (64 * 1024)
static uint8_t lr_mem[3][LR_BYTES];

static snap_ctx *open_rank(const struct smp_proc *p, const char *job, int rank, int world)
{
	struct snap_config c;
	smp_cfg(&c, p, job, rank, world);
	c.timeout_ms = 60000;   /* a stall must fail the test (within ctest's 120 s), not hang it */
	snap_ctx *ctx;
	CHECK_RC(snap_open(&c, &ctx), 0);
	struct snap_region r = { .name = "m", .ptr = lr_mem[rank], .bytes = LR_BYTES, .dtype = SNAP_DTYPE_U8,
				 .kind = SNAP_KIND_PARAM };
	CHECK_RC(snap_register(ctx, &r), 0);
	return ctx;
}

static int lr_save(snap_ctx *ctx, int rank, uint64_t step)
{
	int rc = snap_fence(ctx);
	memset(lr_mem[rank], (int)(step * 3 + (uint64_t)rank), LR_BYTES);
	if (!rc)
		rc = snap_save(ctx, step);
	if (!rc)
		rc = snap_wait(ctx);
	if (rc)
		fprintf(stderr, "rank %d step %" PRIu64 ": %s\n", rank, step, snap_errmsg(ctx));
	return rc;
}

static void test_live_ranks_daemon_restart(const char *store)
{
	struct smp_proc p;
	rm_rf(store);
	CHECK_RC(smp_start(&p, store, NULL), 0);
	snap_ctx *c[3];
	for (int r = 0; r < 3; r++)
		c[r] = open_rank(&p, "lr", r, 3);
	for (uint64_t s = 1; s <= 2; s++)
		for (int r = 0; r < 3; r++)
			CHECK_RC(lr_save(c[r], r, s), 0);
	CHECK_RC(lr_save(c[0], 0, 3), 0);
	smp_stop(&p, SIGKILL);
	CHECK_RC(smp_start(&p, store, NULL), 0);
	CHECK_RC(lr_save(c[2], 2, 3), 0);
	CHECK_RC(lr_save(c[1], 1, 3), 0);
	uint64_t latest = 0;
	CHECK_RC(snap_latest(c[1], &latest), 0);
	CHECK(latest == 3);                     /* every rank was told step 3 is committed */
	for (uint64_t s = 4; s <= 6; s++)       /* and checkpointing goes on */
		for (int r = 2; r >= 0; r--)
			CHECK_RC(lr_save(c[r], r, s), 0);
	CHECK_RC(snap_latest(c[0], &latest), 0);
	CHECK(latest == 6);
	for (int r = 0; r < 3; r++) {
		uint64_t got = 0;
		memset(lr_mem[r], 0xee, LR_BYTES);
		CHECK_RC(snap_restore(c[r], SNAP_STEP_LATEST, &got), 0);
		CHECK(got == 6 && lr_mem[r][LR_BYTES - 1] == (uint8_t)(6 * 3 + r));
		snap_close(c[r]);
	}
	smp_stop(&p, SIGTERM);
	rm_rf(store);
}

/* Issue 10 item 3: NULL required pointers are SNAP_EINVAL, with a message
 * when there is a context to hold one (they crashed or said nothing). */
static void test_null_args(const struct smp_proc *p)
{
	struct snap_config c;
	CHECK_RC(snap_config_init(NULL), SNAP_EINVAL);
	CHECK_RC(snap_config_from_env(NULL, NULL, 0), SNAP_EINVAL);
	CHECK_RC(snap_parse_size("4K", NULL), SNAP_EINVAL);
	smp_cfg(&c, p, "nulls", 0, 1);
	CHECK_RC(snap_open(&c, NULL), SNAP_EINVAL);
	snap_ctx *ctx = open_job(p, "nulls", 0);
	CHECK(ctx != NULL);
	CHECK_RC(snap_register(ctx, NULL), SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "NULL") != NULL);
	CHECK_RC(snap_latest(ctx, NULL), SNAP_EINVAL);
	CHECK(strstr(snap_errmsg(ctx), "NULL") != NULL);
	snap_close(ctx);
}

/*
 * Issue 9: the ABI grows. A program built against an older header passes
 * smaller structs (missing fields take defaults); one built against a newer
 * header passes bigger ones, refused only if a field this library does not
 * know is set; a config that never went through snap_config_init is refused.
 */
struct region_next {
	struct snap_region r;
	uint64_t future;          /* a field of a later header */
};
struct info_next {
	struct snap_region_info i;
	uint64_t future;
};

static void test_abi_sizes(const struct smp_proc *p)
{
	struct snap_config c;
	memset(&c, 0, sizeof(c));
	snap_ctx *ctx = NULL;
	CHECK_RC(snap_open(&c, &ctx), SNAP_EINVAL);    /* size 0: never initialised */
	CHECK(ctx && strstr(snap_errmsg(ctx), "snap_config_init") != NULL);
	snap_close(ctx);
	CHECK_RC(snap_config_init_size(&c, 16), SNAP_EINVAL);
	struct { struct snap_config c; uint64_t future; } big;
	memset(&big, 0xAB, sizeof(big));
	CHECK_RC(snap_config_init_size(&big.c, sizeof(big)), 0);
	/* the default copy threads: half the CPUs of this process's affinity, in [2, 8] */
	cpu_set_t aff;
	CHECK(sched_getaffinity(0, sizeof(aff), &aff) == 0);
	unsigned want = (unsigned)CPU_COUNT(&aff) / 2;
	want = want < 2 ? 2 : want > 8 ? 8 : want;
	CHECK(big.future == 0 && big.c.size == sizeof(big) && big.c.copy_threads == want);
	smp_cfg(&big.c, p, "abi", 0, 1);
	big.c.size = sizeof(big);
	CHECK_RC(snap_config_from_env(&big.c, NULL, 0), 0);
	CHECK(big.future == 0);
	big.future = 1;
	CHECK_RC(snap_open(&big.c, &ctx), SNAP_EUNSUPPORTED);
	CHECK(strstr(snap_errmsg(ctx), "newer snap/snap.h") != NULL);
	snap_close(ctx);

	ctx = open_job(p, "abi", 0);
	CHECK(ctx != NULL);
	struct region_next a = { .r = { .name = "w", .ptr = w, .bytes = sizeof(w), .dtype = SNAP_DTYPE_F32,
					.kind = SNAP_KIND_PARAM }, .future = 3 };
	CHECK_RC(snap_register_size(ctx, &a.r, sizeof(a)), SNAP_EUNSUPPORTED);
	CHECK(strstr(snap_errmsg(ctx), "\"w\"") && strstr(snap_errmsg(ctx), "newer"));
	CHECK_RC(snap_register_size(ctx, &a.r, 24), SNAP_EINVAL);
	a.future = 0;
	CHECK_RC(snap_register_size(ctx, &a.r, sizeof(a)), 0);
	struct snap_region b = { .name = "rng", .ptr = rng, .bytes = sizeof(rng), .dtype = SNAP_DTYPE_U8,
				 .kind = SNAP_KIND_RNG };
	CHECK_RC(snap_register(ctx, &b), 0);
	fill(7);
	CHECK_RC(snap_save(ctx, 7), 0);
	CHECK_RC(snap_wait(ctx), 0);
	/* describe writes each entry at the caller's stride and zeroes what it does not know. */
	struct info_next out[2];
	memset(out, 0xAB, sizeof(out));
	uint32_t n = 0;
	uint64_t got = 0;
	CHECK_RC(snap_describe_size(ctx, SNAP_STEP_LATEST, &got, &out[0].i, 2, &n, sizeof(out[0])), 0);
	CHECK(n == 2 && got == 7 && !strcmp(out[0].i.name, "w") && !strcmp(out[1].i.name, "rng"));
	CHECK(out[0].future == 0 && out[1].future == 0 && out[1].i.bytes == sizeof(rng));
	CHECK_RC(snap_describe_size(ctx, SNAP_STEP_LATEST, &got, &out[0].i, 2, &n, 8), SNAP_EINVAL);
	snap_close(ctx);
}

/*
 * Issue 10 item 8: setting cfg.store after snap_config_init is enough: the
 * socket follows the store (it stayed at the default store's socket, so the
 * client talked to another daemon or none).
 */
static void test_socket_follows_store(const struct smp_proc *p)
{
	struct snap_config c;
	snap_config_init(&c);
	snprintf(c.store, sizeof(c.store), "%s", p->store);
	c.timeout_ms = 60000; /* for a hang only: the daemon is up, the connect is immediate */
	snap_ctx *ctx = NULL;
	CHECK_RC(snap_open(&c, &ctx), 0);
	snap_close(ctx);
}

/* Issue 10 item 8: snap_restore fences itself, as its header now says (it
 * said a fence was required): a restore right after an unfenced save waits
 * for that save's copy and commit, and finds it. */
static void test_restore_fences_itself(const struct smp_proc *p)
{
	snap_ctx *c = open_rank(p, "rf", 0, 1);
	memset(lr_mem[0], 7, LR_BYTES);
	CHECK_RC(snap_save(c, 1), 0);   /* no snap_fence, no snap_wait */
	uint64_t got = 0;
	CHECK_RC(snap_restore(c, SNAP_STEP_LATEST, &got), 0);
	CHECK(got == 1 && lr_mem[0][0] == 7);
	snap_close(c);
}

/* Issue 10 item 8: a rank of a world-2 job must not restore a world-1 snapshot. */
static void test_world_mismatch(const struct smp_proc *p)
{
	snap_ctx *one = open_rank(p, "wm", 0, 1);
	CHECK_RC(lr_save(one, 0, 1), 0);
	snap_close(one);
	snap_ctx *two = open_rank(p, "wm", 0, 2);
	uint64_t got = 0;
	CHECK_RC(snap_restore(two, SNAP_STEP_LATEST, &got), SNAP_EMISMATCH);
	CHECK(strstr(snap_errmsg(two), "world") != NULL);
	snap_close(two);
}

static void test_bad_store_root(void)
{

	/* A path under a regular file can never be created, even by root. */
	CHECK(smp_run_fail("/proc/self/status/store") == 1);
	CHECK(smp_run_fail("relative/store") == 2);
	/* A second daemon on the same store refuses to start, with its own exit
	 * code (3: the store is another snapsmp's, which serves it). */
	struct smp_proc a;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snaptest-lock-%d", (int)getpid());
	CHECK_RC(smp_start(&a, store, NULL), 0);
	CHECK(smp_run_fail(store) == 3);
	smp_stop(&a, SIGTERM);
	rm_rf(store);
}

int main(void)
{
	struct smp_proc p;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snaptest-api-%d", (int)getpid());
	rm_rf(store);
	if (smp_start(&p, store, NULL) != 0) {
		fprintf(stderr, "cannot start %s\n", SNAPSMP_PATH);
		return 1;
	}
	test_cycle(&p);
	test_mismatch_and_unknown_job(&p);
	test_one_process_per_rank(&p);
	test_corrupt_chunk(&p);
	test_corrupt_chunk_saved_mapping(&p);
	test_restart_keeps_steps(&p);
	char store2[160];
	snprintf(store2, sizeof(store2), "%s-budget", store);
	test_budget(store2);
	rm_rf(store2);
	test_live_reconnect(store2);
	test_live_ranks_daemon_restart(store2);
	CHECK_RC(smp_start(&p, store2, NULL), 0);
	test_null_args(&p);
	test_abi_sizes(&p);
	test_socket_follows_store(&p);
	test_world_mismatch(&p);
	test_restore_fences_itself(&p);
	smp_stop(&p, SIGTERM);
	test_bad_store_root();
	rm_rf(store);
	rm_rf(store2);
	return check_done("test_api");
}
