/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapsmp under hostile clients: bad magic, lying lengths, half messages,
 * messages out of order, chunk lengths that lie about codec frames, random
 * payloads for every message type, planted
 * descriptors, a foreign uid. After each attack the daemon must still serve,
 * and a snapshot committed before the attacks must restore bit-exact.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "../check.h"
#include "../skiprule.h"
#include "snap/buf.h"
#include "harness.h"
#include "snap/manifest.h"
#include "snap/wire.h"
#include "status.h"

static float state[4096];

static int raw_connect(const struct smp_proc *p)
{
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	memcpy(a.sun_path, p->socket, strlen(p->socket) + 1);
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(s);
		return -1;
	}
	struct timeval tv = { 2, 0 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return s;
}

/* Read one reply and return its status (1 if the daemon just closed). */
static int read_status(int s)
{
	uint8_t h[SNAP_WIRE_HDR];
	struct snap_msg_hdr m;
	ssize_t got = recv(s, h, sizeof(h), MSG_WAITALL);
	if (got != (ssize_t)sizeof(h))
		return 1;
	if (snap_wire_parse_hdr(h, &m))
		return 2;
	uint8_t sink[4096];
	for (uint32_t left = m.len; left > 0;) {
		ssize_t k = recv(s, sink, left < sizeof(sink) ? left : sizeof(sink), 0);
		if (k <= 0)
			break;
		left -= (uint32_t)k;
	}
	return m.status;
}

/* Send raw bytes; read the reply status (or 1 if the daemon just closed). */
static int send_raw(int s, const void *buf, size_t n)
{
	if (send(s, buf, n, MSG_NOSIGNAL) != (ssize_t)n)
		return 1;
	return read_status(s);
}

static int send_msg(int s, uint16_t type, const void *payload, uint32_t len)
{
	uint8_t *b = malloc(SNAP_WIRE_HDR + len);
	snap_wire_put_hdr(b, type, 0, len);
	memcpy(b + SNAP_WIRE_HDR, payload, len);
	int rc = send_raw(s, b, SNAP_WIRE_HDR + len);
	free(b);
	return rc;
}

static int hello(int s, const char *job, uint32_t rank, uint32_t world)
{
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, job);
	snap_put_u32(&w, rank);
	snap_put_u32(&w, world);
	snap_put_u32(&w, 1);
	snap_put_u64(&w, 0);   /* generation: a new process */
	int rc = send_msg(s, SNAP_MSG_HELLO, w.p, (uint32_t)w.len);
	snap_wbuf_free(&w);
	return rc;
}

static void save_reference(const struct smp_proc *p)
{
	struct snap_config c;
	smp_cfg(&c, p, "keep", 0, 1);
	snap_ctx *ctx;
	for (int i = 0; i < 4096; i++)
		state[i] = (float)i / 7;
	struct snap_region r = { .name = "state", .ptr = state, .bytes = sizeof(state), .dtype = SNAP_DTYPE_F32 };
	CHECK_RC(snap_open(&c, &ctx), 0);
	CHECK_RC(snap_register(ctx, &r), 0);
	CHECK_RC(snap_save(ctx, 10), 0);
	CHECK_RC(snap_wait(ctx), 0);
	snap_close(ctx);
}

/* The daemon is alive and the reference snapshot restores bit-exact. */
static void check_reference(const struct smp_proc *p, const char *after)
{
	struct snap_config c;
	smp_cfg(&c, p, "keep", 0, 1);
	snap_ctx *ctx;
	memset(state, 0, sizeof(state));
	struct snap_region r = { .name = "state", .ptr = state, .bytes = sizeof(state), .dtype = SNAP_DTYPE_F32 };
	uint64_t got = 0;
	int rc = snap_open(&c, &ctx);
	if (!rc)
		rc = snap_register(ctx, &r);
	if (!rc)
		rc = snap_restore(ctx, SNAP_STEP_LATEST, &got);
	int ok = rc == 0 && got == 10;
	for (int i = 0; ok && i < 4096; i++)
		ok = state[i] == (float)i / 7;
	if (!ok)
		fprintf(stderr, "after %s: reference snapshot not restorable: %s\n", after, snap_errmsg(ctx));
	CHECK(ok);
	snap_close(ctx);
}

static void test_framing(const struct smp_proc *p)
{
	uint8_t h[SNAP_WIRE_HDR];
	int s = raw_connect(p);
	memcpy(h, "GARBAGE!GARBAGE!", 16);
	CHECK(send_raw(s, h, 16) == SNAP_EFORMAT);
	close(s);

	s = raw_connect(p);
	snap_wire_put_hdr(h, SNAP_MSG_HELLO, 0, SNAP_WIRE_MAX + 1);  /* lying length */
	CHECK(send_raw(s, h, 16) == SNAP_EPROTO);
	close(s);

	s = raw_connect(p);          /* half a header, then hang up */
	CHECK(send(s, h, 7, MSG_NOSIGNAL) == 7);
	close(s);

	s = raw_connect(p);          /* a header promising more than is sent */
	snap_wire_put_hdr(h, SNAP_MSG_HELLO, 0, 1000);
	CHECK(send(s, h, 16, MSG_NOSIGNAL) == 16);
	close(s);

	s = raw_connect(p);
	CHECK(send_msg(s, SNAP_MSG_COMMIT, "x", 1) == SNAP_EPROTO);  /* before HELLO */
	close(s);

	s = raw_connect(p);
	CHECK(hello(s, "j", 0, 0) == SNAP_EPROTO);       /* world 0 */
	close(s);
	s = raw_connect(p);
	CHECK(hello(s, "../../etc", 0, 1) == SNAP_EPROTO); /* path traversal in job */
	close(s);
	s = raw_connect(p);
	CHECK(hello(s, "j", 0, 1) == 0);
	CHECK(hello(s, "j", 0, 1) == SNAP_EPROTO);       /* twice */
	close(s);
	check_reference(p, "framing attacks");
}

static void test_out_of_order(const struct smp_proc *p)
{
	int s = raw_connect(p);
	CHECK(hello(s, "ooo", 0, 1) == 0);
	uint8_t step[8] = { 1 };
	CHECK(send_msg(s, SNAP_MSG_ACQUIRE, step, 8) == SNAP_EPROTO);  /* no layout yet */
	close(s);

	/* COMMIT of a slot never acquired, and with the wrong checksum count. */
	s = raw_connect(p);
	CHECK(hello(s, "ooo", 0, 1) == 0);
	struct snap_wbuf w = { 0 };
	snap_put_u32(&w, 0);
	snap_put_u64(&w, 5);
	snap_put_u32(&w, 3);
	snap_put_u32(&w, 1);  /* 1 of 3 checksums */
	CHECK(send_msg(s, SNAP_MSG_COMMIT, w.p, (uint32_t)w.len) == SNAP_EPROTO);
	snap_wbuf_free(&w);
	close(s);
	check_reference(p, "out-of-order messages");
}

/* A codec region of two chunks and a 100-byte raw region. */
static float lay_x[2048];
static void two_regions(struct snap_layout *lay)
{
	struct snap_region regs[2] = {
		{ .name = "z", .ptr = lay_x, .bytes = sizeof(lay_x), .dtype = SNAP_DTYPE_F32, .codec = SNAP_CODEC_LOSSLESS },
		{ .name = "raw", .ptr = lay_x, .bytes = 100, .dtype = SNAP_DTYPE_U8 },
	};
	char err[256];
	CHECK_RC(snap_layout_build(lay, regs, 2, 4096, err, sizeof(err)), 0);
	CHECK(lay->ncrc == 3); /* the length lists below have three entries */
}

/* A rank of `job` that registered lay and holds slot 0 for step 1 sends a
 * COMMIT of it with these stored lengths (zero checksums, which the daemon
 * takes on trust without --verify-commit) and pinned bytes; returns the
 * reply's status and leaves the connection in *sock. */
static int commit_with(const struct smp_proc *p, const char *job, const struct snap_layout *lay,
		       const uint32_t *lens, uint64_t pinned, int *sock)
{
	int s = raw_connect(p);
	*sock = s;
	CHECK(hello(s, job, 0, 1) == 0);
	struct snap_wbuf w = { 0 };
	snap_layout_encode(&w, lay);
	CHECK(send_msg(s, SNAP_MSG_REGISTER, w.p, (uint32_t)w.len) == 0);
	snap_wbuf_free(&w);
	uint8_t step[8] = { 1 };
	CHECK(send_msg(s, SNAP_MSG_ACQUIRE, step, 8) == 0);   /* the first free slot: 0 */
	snap_put_u32(&w, 0);
	snap_put_u64(&w, 1);
	snap_put_u32(&w, lay->ncrc);
	for (uint32_t t = 0; t < lay->ncrc; t++)
		snap_put_u32(&w, 0);
	for (uint32_t t = 0; t < lay->ncrc; t++)
		snap_put_u32(&w, lens[t]);
	snap_put_u64(&w, pinned);
	int rc = send_msg(s, SNAP_MSG_COMMIT, w.p, (uint32_t)w.len);
	snap_wbuf_free(&w);
	return rc;
}

/*
 * A COMMIT whose stored lengths lie about a codec region's frames: longer
 * than the frame's room, shorter than a stream header, or a raw chunk not
 * stored whole. Each is refused and nothing of the job becomes restorable.
 */
static void test_lying_lengths(const struct smp_proc *p)
{
	struct snap_layout lay;
	two_regions(&lay);
	uint32_t lies[3][3] = {
		{ (uint32_t)lay.regions[0].frame_cap + 1, 100, 100 },   /* beyond the frame's room */
		{ 100, 10, 100 },                                       /* shorter than a header */
		{ 100, 100, 99 },                                       /* a raw chunk cut short */
	};
	for (int k = 0; k < 3; k++) {
		int s;
		CHECK(commit_with(p, "lie", &lay, lies[k], 0, &s) == SNAP_EPROTO);
		close(s);
	}
	snap_layout_free(&lay);
	struct snap_config c;
	smp_cfg(&c, p, "lie", 0, 1);
	snap_ctx *ctx;
	uint64_t latest;
	CHECK_RC(snap_open(&c, &ctx), 0);
	CHECK_RC(snap_latest(ctx, &latest), SNAP_ENOENT);
	snap_close(ctx);
	check_reference(p, "lying chunk lengths");
}

/*
 * A COMMIT carries the bytes the trainer holds pinned for GPU copies;
 * STATUS sums them over the connected trainers (snaptool status shows it)
 * and drops a trainer once it hangs up.
 */
static void test_pinned_status(const struct smp_proc *p)
{
	struct snap_layout lay;
	two_regions(&lay);
	const uint32_t honest[3] = { 100, 100, 100 }; /* frames of 100 bytes, the raw chunk whole */
	const uint64_t want = 123456789;
	int s;
	CHECK(commit_with(p, "pin", &lay, honest, want, &s) == 0);
	uint64_t pinned = 0;
	uint32_t pinners = 0;
	CHECK(smp_status_pinned(p->socket, &pinned, &pinners) == 0);
	if (pinned != want || pinners != 1)
		fprintf(stderr, "STATUS: %llu bytes pinned by %u, want %llu by 1\n", (unsigned long long)pinned,
			pinners, (unsigned long long)want);
	CHECK(pinned == want && pinners == 1);
	/* Hang up and wait for the event itself: the daemon closes its end (EOF
	 * here) in the same step that drops the connection from its count. */
	struct timeval tv = { 60, 0 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	CHECK(shutdown(s, SHUT_WR) == 0);
	char c;
	CHECK(recv(s, &c, 1, 0) == 0);
	close(s);
	CHECK(smp_status_pinned(p->socket, &pinned, &pinners) == 0);
	CHECK(pinned == 0 && pinners == 0);
	snap_layout_free(&lay);
}

static void test_random_payloads(const struct smp_proc *p)
{
	srand(42);
	for (int round = 0; round < 40; round++) {
		int s = raw_connect(p);
		char job[16];
		snprintf(job, sizeof(job), "fz%d", round % 4);
		if (hello(s, job, 0, 1) != 0) {
			close(s);
			continue;
		}
		for (int i = 0; i < 50; i++) {
			uint32_t n = (uint32_t)(rand() % 200);
			uint8_t buf[200];
			for (uint32_t k = 0; k < n; k++)
				buf[k] = (uint8_t)rand();
			uint16_t type = (uint16_t)(1 + rand() % 7);
			if (send_msg(s, type, buf, n) == 1)
				break;   /* the daemon hung up on us: reconnect */
		}
		close(s);
	}
	check_reference(p, "random payloads");
}

/* How many of the daemon's descriptors name `path`. */
static int fds_naming(pid_t pid, const char *path)
{
	char dir[64], fd[384], to[4096];
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		snprintf(fd, sizeof(fd), "%s/%s", dir, e->d_name);
		ssize_t l = readlink(fd, to, sizeof(to) - 1);
		if (l > 0) {
			to[l] = 0;
			n += strcmp(to, path) == 0;
		}
	}
	if (d)
		closedir(d);
	return d ? n : -1;
}

/*
 * A descriptor passed (SCM_RIGHTS) with a HELLO, which takes none, must be
 * closed by the daemon. The descriptor names a file of this test's own, so
 * the check counts only it: once the daemon has answered the HELLO it has
 * read the descriptor, and holds it still only if it leaked it. (Counting
 * all of its descriptors needed the daemon to settle first: an earlier
 * test's hang-up could still be on its way.)
 */
static void test_planted_fd(const struct smp_proc *p)
{
	char marker[1024];
	snprintf(marker, sizeof(marker), "/dev/shm/snaptest-proto-%d.planted", (int)getpid());
	int mfd = open(marker, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	CHECK(mfd >= 0);
	char real[4096];
	CHECK(realpath(marker, real) != NULL);
	for (int i = 0; i < 20; i++) {
		int s = raw_connect(p);
		struct snap_wbuf w = { 0 };
		snap_put_str(&w, "fdjob");
		snap_put_u32(&w, 0);
		snap_put_u32(&w, 1);
		snap_put_u32(&w, 1);
		snap_put_u64(&w, 0);
		CHECK(snap_wire_send(s, SNAP_MSG_HELLO, 0, w.p, (uint32_t)w.len, mfd) == 0);
		struct snap_msg_hdr h;
		void *pl;
		CHECK(snap_wire_recv(s, &h, &pl, NULL, 2000) == 0 && h.status == 0);
		free(pl);
		snap_wbuf_free(&w);
		int held = fds_naming(p->pid, real);
		if (held != 0)
			fprintf(stderr, "snapsmp holds %d descriptor(s) of %s after answering HELLO %d\n", held, real, i);
		CHECK(held == 0);
		close(s);
	}
	close(mfd);
	unlink(marker);
	check_reference(p, "planted descriptors");
}

/*
 * Another user reaching the socket is refused by SO_PEERCRED. The 0700 store
 * directory and 0600 socket normally stop them before that check, so open
 * both up for the test: the daemon's own check must still say no.
 */
static void test_foreign_uid(const struct smp_proc *p)
{
	if (!skiprule_optional("foreign uid", "root, to switch users", geteuid() == 0))
		return;
	CHECK(chmod(p->store, 0755) == 0 && chmod(p->socket, 0666) == 0);
	pid_t pid = fork();
	if (pid == 0) {
		if (setuid(65534) != 0)
			_exit(3);
		int s = raw_connect(p);
		if (s < 0)
			_exit(4);   /* the socket must be reachable, or nothing is tested */
		/* The daemon refuses at accept, before any request: just read it
		 * (sending first could race with its close and see EPIPE). */
		_exit(read_status(s) == SNAP_EPERM ? 0 : 1);
	}
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		fprintf(stderr, "foreign uid: child exit status %d (1: not refused, 3: setuid, 4: no connect)\n",
			WIFEXITED(st) ? WEXITSTATUS(st) : -1);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	chmod(p->socket, 0600);
	chmod(p->store, 0700);
	check_reference(p, "foreign uid");
}

int main(void)
{
	struct smp_proc p;
	char store[128];
	snprintf(store, sizeof(store), "/dev/shm/snaptest-proto-%d", (int)getpid());
	rm_rf(store);
	if (smp_start(&p, store, NULL) != 0)
		return 1;
	save_reference(&p);
	test_framing(&p);
	test_out_of_order(&p);
	test_lying_lengths(&p);
	test_pinned_status(&p);
	test_random_payloads(&p);
	test_planted_fd(&p);
	test_foreign_uid(&p);
	int st = smp_stop(&p, SIGTERM);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	rm_rf(store);
	if (!check_failures)
		skiprule_summary("test_protocol");
	return check_done("test_protocol");
}
