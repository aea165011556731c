/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Slot files reserved by a thread (smp/store/reserve.c) and what the store makes
 * of it (smp/store/slots.c):
 *   - snap_reserve_file: a new file gets every byte allocated; a longer one
 *     is cut; a failure leaves the file empty and says why;
 *   - the reserver: files submitted in a batch all end allocated, whether a
 *     caller waits for its ticket (the thread's, or done by the caller when
 *     still queued, or finished by it when the thread hands a file under way
 *     back), takes it finished, or frees the reserver with work still queued
 *     (ASan: nothing leaks, the thread is joined);
 *   - the store: REGISTER counts every slot against the budget at once, an
 *     ACQUIRE hands out a slot whose file is allocated, and on a store too
 *     small for the layout (a 3 MiB tmpfs, as root) the slot that could not
 *     be reserved in the background gives its bytes back, is logged, and
 *     the ACQUIRE that picks it fails with "is full" instead of a SIGBUS.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../smp/store/reserve.h"
#include "snap/base.h"
#include "../skiprule.h"
#include "snap/store.h"
#include "../check.h"

#define MIB (1ull << 20)

static char dir[64];

/* Whether path is exactly bytes long with every byte allocated. */
static int allocated(const char *path, uint64_t bytes)
{
	struct stat st;
	return stat(path, &st) == 0 && (uint64_t)st.st_size == bytes && (uint64_t)st.st_blocks * 512 >= bytes;
}

static void test_file(void)
{
	char p[128];
	snprintf(p, sizeof(p), "%s/one", dir);
	CHECK(snap_reserve_file(p, 3 * MIB) == 0 && allocated(p, 3 * MIB));
	CHECK(snap_reserve_file(p, MIB) == 0 && allocated(p, MIB));          /* cut */
	CHECK(snap_reserve_file(p, 0) == 0 && allocated(p, 0));
	snprintf(p, sizeof(p), "%s/no/such/dir", dir);
	CHECK(snap_reserve_file(p, MIB) == ENOENT);
}

static void test_reserver(void)
{
	enum { N = 8 };
	char p[N][128];
	uint64_t t[N];
	struct snap_reserver *rv = snap_reserver_new();
	CHECK(rv != NULL);
	for (int i = 0; i < N; i++) {
		snprintf(p[i], sizeof(p[i]), "%s/r%d", dir, i);
		CHECK_RC(snap_reserver_submit(rv, p[i], (uint64_t)(i + 1) * MIB, &t[i]), 0);
		CHECK(t[i] > 0 && (i == 0 || t[i] > t[i - 1]));
	}
	/* the last one first: queued behind the others, so most likely done here */
	CHECK(snap_reserver_wait(rv, t[N - 1]) == 0 && allocated(p[N - 1], N * MIB));
	CHECK(snap_reserver_wait(rv, t[N - 1]) == 0);   /* taken: unknown now */
	for (int i = 0; i < N - 1; i++)
		CHECK(snap_reserver_wait(rv, t[i]) == 0 && allocated(p[i], (uint64_t)(i + 1) * MIB));
	uint64_t got;
	int e;
	CHECK(snap_reserver_take(rv, &got, &e) == 0);
	/* a failure comes back as its errno through take */
	char bad[128];
	snprintf(bad, sizeof(bad), "%s/no/such/file", dir);
	uint64_t tb;
	CHECK_RC(snap_reserver_submit(rv, bad, MIB, &tb), 0);
	snap_reserver_drain(rv);
	CHECK(snap_reserver_take(rv, &got, &e) == 1 && got == tb && e == ENOENT);
	/* A file under way when its caller waits: the thread stops after its
	 * current 64 MiB piece and the caller finishes it (the thread runs at a
	 * lower priority). Struck once the thread's first piece is in (each
	 * fallocate that succeeds is an IN_MODIFY of the file); the other seven
	 * of 512 MiB take far longer to clear than the strike, but a preempted
	 * test could still find them done, so up to 5 tries. */
	unsigned long stolen, handed, handed0;
	int busy;
	snap_reserver_stats(rv, &busy, &stolen, &handed0);
	handed = handed0;   /* the waits above may have taken some over already */
	for (int try = 0; try < 5 && handed == handed0; try++) {
		uint64_t tbig;
		int in = inotify_init1(IN_CLOEXEC);
		CHECK(in >= 0 && inotify_add_watch(in, p[0], IN_MODIFY) >= 0);
		CHECK_RC(snap_reserver_submit(rv, p[0], 512 * MIB, &tbig), 0);
		char ev[sizeof(struct inotify_event) + 256];
		CHECK(read(in, ev, sizeof(ev)) > 0);
		close(in);
		CHECK(snap_reserver_wait(rv, tbig) == 0 && allocated(p[0], 512 * MIB));
		snap_reserver_stats(rv, &busy, &stolen, &handed);
		CHECK_RC(snap_reserve_file(p[0], 0), 0);
	}
	CHECK(handed > handed0);
	printf("a file under way taken over by its waiter: %lu time(s)\n", handed - handed0);
	/* work still queued when the reserver goes: joined, nothing leaks */
	for (int i = 0; i < N; i++)
		CHECK_RC(snap_reserver_submit(rv, p[i], MIB, &t[i]), 0);
	snap_reserver_free(rv);
	snap_reserver_free(NULL);
}

static char logged[4096];

static void on_log(const char *msg)
{
	snprintf(logged + strlen(logged), sizeof(logged) - strlen(logged), "%s\n", msg);
}

/* Register a 3-slot rank of slot_bytes, then acquire steps 1 and 2: both
 * succeed, or (full: room for one slot) exactly one does. Which one is not
 * fixed: an ACQUIRE reserves its slot itself while the thread reserves
 * another, and either may take the last free pages. */
static void register_and_acquire(const char *root, uint64_t slot_bytes, int full)
{
	struct snap_store *s = NULL;
	char err[2][512] = { "", "" };
	CHECK_RC(snap_store_open(&s, root, 3, 1024 * MIB, 0, on_log, err[0], sizeof(err[0])), 0);
	if (!s)
		return;
	struct store_job *j = snap_store_job(s, "job", 1);
	struct store_rank *r = snap_store_rank(s, j, 0, 1);
	uint64_t before = s->mem_used;
	struct snap_layout lay = { .slot_bytes = slot_bytes };
	CHECK_RC(snap_store_register(s, j, r, &lay, err[0], sizeof(err[0])), 0);
	CHECK(s->mem_used == before + 3 * slot_bytes);   /* counted at once */
	int ok = 0, owner;
	for (int step = 1; step <= 2; step++) {
		uint32_t slot;
		int fd = -1;
		int rc = snap_store_acquire(s, j, r, (uint64_t)step, &owner, &slot, &fd, err[step - 1], sizeof(err[0]));
		char p[SNAP_FILE_MAX];
		snap_store_path(s, "job", 0, slot, 0, p, sizeof(p));
		if (rc == 0) {
			ok++;
			CHECK(fd >= 0 && allocated(p, slot_bytes));
		} else {
			CHECK(full && rc == SNAP_ENOSPC && strstr(err[step - 1], "is full") != NULL);
		}
		if (fd >= 0)
			close(fd);
	}
	CHECK(ok == (full ? 1 : 2));
	snap_reserver_drain(s->resv);   /* the reservations still in the thread */
	snap_store_reap(s);
	for (uint32_t i = 0; i < 3; i++)
		CHECK(r->slots[i].resv == 0);
	if (full) {
		CHECK(strstr(logged, "could not reserve") != NULL && strstr(logged, "the store is full") != NULL);
		CHECK(s->mem_used == before + slot_bytes);   /* what stays counted is what exists */
		printf("full store, as expected: %s%s\nlog:\n%s", err[0], err[1], logged);
	} else {
		CHECK(s->mem_used == before + 3 * slot_bytes);
		for (uint32_t i = 0; i < 3; i++) {
			char p[SNAP_FILE_MAX];
			snap_store_path(s, "job", 0, i, 0, p, sizeof(p));
			CHECK(allocated(p, slot_bytes));
		}
	}
	snap_store_close(s);
}

int main(void)
{
	/* tmpfs, where reserving means clearing pages and takes a while */
	snprintf(dir, sizeof(dir), "/dev/shm/test_reserve.%d", (int)getpid());
	if (mkdir(dir, 0700) != 0) {
		perror(dir);
		return 1;
	}
	int can_mount = skiprule_can_mount(); /* decided before any case runs */
	test_file();
	test_reserver();
	char root[192];
	snprintf(root, sizeof(root), "%s/store", dir);
	register_and_acquire(root, 32 * MIB, 0);
	logged[0] = 0;
	char small[96];
	snprintf(small, sizeof(small), "%s/small", dir);
	mkdir(small, 0700);
	if (skiprule_optional("the full-store half", "CAP_SYS_ADMIN to mount a 3 MiB tmpfs", can_mount)) {
		if (mount("tmpfs", small, "tmpfs", 0, "size=3m") != 0) {
			fprintf(stderr, "unit.reserve: FAILED: mount of a 3 MiB tmpfs: %s\n", strerror(errno));
			check_failures++;
		} else {
			snprintf(root, sizeof(root), "%s/store", small);
			register_and_acquire(root, 2 * MIB, 1);
			umount(small);
		}
	}
	char cmd[160];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	if (!check_failures)
		skiprule_summary("unit.reserve");
	return check_done("unit.reserve");
}
