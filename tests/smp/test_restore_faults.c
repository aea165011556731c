/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The restore's faults against a real snapsmp: a bad chunk checked as it is
 * copied (restore_verify inline) through the saving process's mapping, a
 * store on huge pages (a new context maps the slot there), and a read of the
 * slot that fails mid-restore. This program's pread() stands in for libc's,
 * for libsnap too, which is why these tests have a process of their own.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/stat.h>

#include "api_fixture.h"
#include "../skiprule.h"
#include "snap/base.h"

/* restore_verify inline in the process that saved: read through its own
 * mapping, each chunk checked as it is copied, the bad one named. */
static void test_corrupt_chunk_inline_mapping(struct smp_proc *p)
{
	char path[512];
	snap_ctx *ctx = open_saved(p, "inline", SNAP_VERIFY_INLINE, path, sizeof(path));
	if (!ctx)
		return;
	flip_byte(path, 600 * 1024);   /* chunk 2 of "w" */
	fill(77);
	uint64_t got = 0;
	CHECK_RC(snap_restore(ctx, 2, &got), SNAP_ECORRUPT);
	CHECK(strstr(snap_errmsg(ctx), "\"w\" chunk 2") && strstr(snap_errmsg(ctx), "partly overwritten"));
	CHECK(holds(2, 0, N / 2) && holds(2, 3 * N / 4, N));
	/* No other level held it (no flush directory): snapsmp withdrew it. */
	CHECK_RC(snap_restore(ctx, 2, &got), SNAP_ENOENT);
	fill(77);
	CHECK_RC(snap_restore(ctx, 1, &got), 0);
	CHECK(got == 1 && is_step(1));
	snap_close(ctx);
}

/*
 * A store on huge pages: a new context maps the slot (cheap there) instead
 * of reading it. The same refusal of a bad chunk, both verify orders, and
 * the good step restored exactly. Needs mount(2) (root, as in CI) and
 * huge pages for tmpfs: an optional case, decided before any case runs.
 */
static int huge_store_possible(void)
{
	char line[256] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	if (!f)
		return 0;
	int ok = fgets(line, sizeof line, f) != NULL;
	fclose(f);
	/* force or deny override the mount's huge= option */
	return ok && !strstr(line, "[force]") && !strstr(line, "[deny]") && skiprule_can_mount();
}

static void test_huge_store(void)
{
	char dir[128], store[160], how[160];
	snprintf(dir, sizeof(dir), "/dev/shm/snaptest-huge-%d", (int)getpid());
	snprintf(store, sizeof(store), "%s/store", dir);
	mkdir(dir, 0700);
	if (mount("none", dir, "tmpfs", 0, "huge=within_size,size=64M") != 0) {
		fprintf(stderr, "test_restore_faults: FAILED: mount of a huge=within_size tmpfs: %s\n", strerror(errno));
		check_failures++;
		rmdir(dir);
		return;
	}
	struct smp_proc p;
	CHECK_RC(smp_start(&p, store, NULL), 0);
	CHECK(snap_store_hugepages(store, how, sizeof(how)) == 1);
	char path[512];
	snap_ctx *ctx;
	/* A job each: the failed restore costs the step (no other level holds it). */
	for (int verify = SNAP_VERIFY_FIRST; verify <= SNAP_VERIFY_INLINE; verify++) {
		const char *job = verify == SNAP_VERIFY_FIRST ? "huge" : "huge-inline";
		snap_close(open_saved(&p, job, SNAP_VERIFY_AUTO, path, sizeof(path)));
		flip_byte(path, 800 * 1024);   /* chunk 3 of "w" */
		ctx = open_job_verify(&p, job, 1, verify);
		fill(77);
		CHECK_RC(snap_restore(ctx, 2, NULL), SNAP_ECORRUPT);
		CHECK(strstr(snap_errmsg(ctx), "\"w\" chunk 3") != NULL);
		CHECK(verify == SNAP_VERIFY_FIRST ? is_step(77) : holds(2, 0, 3 * N / 4));
		snap_close(ctx);
	}
	ctx = open_job(&p, "huge", 1);
	uint64_t got = 0;
	fill(77);
	CHECK_RC(snap_restore(ctx, 1, &got), 0);
	CHECK(got == 1 && is_step(1));
	snap_close(ctx);
	smp_stop(&p, SIGTERM);
	CHECK(umount(dir) == 0);
	rmdir(dir);
}

/*
 * A slot read that fails mid-restore. This program's pread() takes the
 * place of libc's for libsnap too (the executable's symbol comes first),
 * and fails the fail_at-th call after it is armed: with EIO, or (eof) by
 * returning 0 as at the end of a file shorter than it should be.
 */
static atomic_int pread_calls, fail_at, fail_eof;

ssize_t pread(int fd, void *buf, size_t n, off_t off)
{
	static ssize_t (*real)(int, void *, size_t, off_t);
	int at = atomic_load(&fail_at);
	if (at && atomic_fetch_add(&pread_calls, 1) + 1 == at) {
		if (atomic_load(&fail_eof))
			return 0;
		errno = EIO;
		return -1;
	}
	if (!real)
		real = (ssize_t (*)(int, void *, size_t, off_t))dlsym(RTLD_NEXT, "pread");
	return real(fd, buf, n, off);
}

/* A new context (which reads the slot with pread) restoring step 2 of
 * "eio" (4 chunks of w and one of rng: one read each) with the k-th read
 * failing: SNAP_EIO naming the chunk, the slot and the cause; with
 * restore_verify first, memory untouched when the failure came in the
 * verify pass (reads 1-5) and said to be partly overwritten in the copy
 * (6-10); inline, always said to be partly overwritten. */
static void read_fails(struct smp_proc *p);

static void test_read_fails(struct smp_proc *p)
{
	char path[512];
	snap_close(open_saved(p, "eio", SNAP_VERIFY_AUTO, path, sizeof(path)));
	/* into a buffer aligned like the slot and into one that is not (the
	 * bounce block's non-temporal copy takes either) */
	for (int mis = 0; mis < 2; mis++) {
		wp = mis ? w_mis : w;
		read_fails(p);
	}
	wp = w;
}

static void read_fails(struct smp_proc *p)
{
	for (int verify = SNAP_VERIFY_FIRST; verify <= SNAP_VERIFY_INLINE; verify++) {
		int reads = verify == SNAP_VERIFY_FIRST ? 10 : 5;
		for (int k = 1; k <= reads; k++) {
			snap_ctx *ctx = open_job_verify(p, "eio", 1, verify);
			if (!ctx)
				return;
			fill(77);
			atomic_store(&fail_eof, k % 2);
			atomic_store(&pread_calls, 0);
			atomic_store(&fail_at, k);
			int rc = snap_restore(ctx, 2, NULL);
			atomic_store(&fail_at, 0);
			const char *msg = snap_errmsg(ctx);
			CHECK_RC(rc, SNAP_EIO);
			CHECK(strstr(msg, "reading chunk") && strstr(msg, "of slot") &&
			      strstr(msg, strerror(EIO)));
			int untouched = verify == SNAP_VERIFY_FIRST && k <= 5;
			CHECK(strstr(msg, untouched ? "left untouched" : "partly overwritten") != NULL);
			if (untouched)
				CHECK(is_step(77));
			if (rc != SNAP_EIO || !strstr(msg, untouched ? "left untouched" : "partly overwritten"))
				fprintf(stderr, "  (verify %d, read %d failing: %s)\n", verify, k, msg);
			snap_close(ctx);
		}
	}
	/* nothing armed: the same restore succeeds */
	snap_ctx *ctx = open_job(p, "eio", 1);
	uint64_t got = 0;
	fill(77);
	CHECK_RC(snap_restore(ctx, 2, &got), 0);
	CHECK(got == 2 && is_step(2));
	snap_close(ctx);
}

int main(void)
{
	struct smp_proc p;
	char store[128];
	int huge = skiprule_optional("huge-page store", "CAP_SYS_ADMIN and transparent huge pages for tmpfs",
				     huge_store_possible());
	snprintf(store, sizeof(store), "/dev/shm/snaptest-restore-%d", (int)getpid());
	rm_rf(store);
	if (smp_start(&p, store, NULL) != 0) {
		fprintf(stderr, "cannot start %s\n", SNAPSMP_PATH);
		return 1;
	}
	test_corrupt_chunk_inline_mapping(&p);
	test_read_fails(&p);
	smp_stop(&p, SIGTERM);
	rm_rf(store);
	if (huge)
		test_huge_store();
	if (!check_failures)
		skiprule_summary("test_restore_faults");
	return check_done("test_restore_faults");
}
