/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pl_writer - an ordinary C program that checkpoints with write() and
 * pwrite(), knowing nothing of libsnap. The preload tests run it under
 * LD_PRELOAD=libsnap_preload.so and SIGKILL it at random moments.
 *
 *   pl_writer run DIR BYTES [STEPS]  resume from the newest valid checkpoint
 *                                    in DIR, then per step: write DIR/ckpt.tmp
 *                                    (header placeholder, payload in uneven
 *                                    write()s, header by pwrite() at 0, fsync),
 *                                    close, rename to DIR/ckpt-<step>, unlink
 *                                    ckpt-<step-2>, print "committed <step>"
 *                                    (and with PL_PAUSE_AT=A,B,...: after
 *                                    those steps "paused <step>", SIGSTOP)
 *   pl_writer hold DIR BYTES STEPS   run, print "holding", wait for a signal
 *   pl_writer check DIR              verify every file in DIR byte for byte
 *                                    (read, pread and mmap), print one JSON line
 *
 * A checkpoint's bytes are a function of its step, so a reader can tell a
 * complete file from a torn one without any side record.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define HDR 64
#define MAGIC "PLWRITE1"

static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Payload byte i of step `step` (8 bytes at a time). */
static void payload(uint64_t step, uint8_t *p, size_t n)
{
	uint64_t s = step * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i += 8) {
		uint64_t v = rng_next(&s);
		memcpy(p + i, &v, n - i < 8 ? n - i : 8);
	}
}

static void header(uint8_t *h, uint64_t step, uint64_t bytes)
{
	memset(h, 0, HDR);
	memcpy(h, MAGIC, 8);
	memcpy(h + 8, &step, 8);
	memcpy(h + 16, &bytes, 8);
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/*
 * Check one file: 0 complete and valid (step in *step), -1 invalid (why).
 * Reads the header with pread, the payload with read() after lseek, and
 * compares the whole file once more through a read-only mmap.
 */
static int verify(const char *path, uint64_t bytes, uint64_t *step, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0) {
		snprintf(err, errlen, "open: %s", strerror(errno));
		return -1;
	}
	struct stat st;
	uint8_t h[HDR], want[HDR];
	int rc = -1;
	uint8_t *buf = NULL, *exp = NULL;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != HDR + bytes) {
		snprintf(err, errlen, "size %lld, want %llu", (long long)st.st_size, (unsigned long long)(HDR + bytes));
		goto out;
	}
	if (pread(fd, h, HDR, 0) != HDR || memcmp(h, MAGIC, 8)) {
		snprintf(err, errlen, "bad header");
		goto out;
	}
	memcpy(step, h + 8, 8);
	header(want, *step, bytes);
	if (memcmp(h, want, HDR)) {
		snprintf(err, errlen, "header fields wrong");
		goto out;
	}
	buf = malloc(bytes ? bytes : 1);
	exp = malloc(bytes ? bytes : 1);
	if (!buf || !exp || lseek(fd, HDR, SEEK_SET) != HDR) {
		snprintf(err, errlen, "lseek/malloc");
		goto out;
	}
	for (size_t got = 0; got < bytes;) {
		ssize_t r = read(fd, buf + got, bytes - got);
		if (r <= 0) {
			snprintf(err, errlen, "short read at %zu", got);
			goto out;
		}
		got += (size_t)r;
	}
	payload(*step, exp, bytes);
	if (memcmp(buf, exp, bytes)) {
		snprintf(err, errlen, "payload differs");
		goto out;
	}
	uint8_t *m = mmap(NULL, HDR + bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED || memcmp(m, want, HDR) || memcmp(m + HDR, exp, bytes)) {
		snprintf(err, errlen, "mmap view differs");
		if (m != MAP_FAILED)
			munmap(m, HDR + bytes);
		goto out;
	}
	munmap(m, HDR + bytes);
	rc = 0;
out:
	free(buf);
	free(exp);
	close(fd);
	return rc;
}

static int parse_step(const char *name, uint64_t *step)
{
	if (strncmp(name, "ckpt-", 5) || !name[5])
		return 0;
	char *end;
	*step = strtoull(name + 5, &end, 10);
	return *end == '\0';
}

static int check_once(const char *dir, uint64_t bytes, int64_t *newest, int print, int retry);

/* Every file in dir: print {"newest": N|-1, "files": k, "bad": [...], "names": [...]}. 0 if all valid. */
static int check(const char *dir, uint64_t bytes, int64_t *newest, int print)
{
	/*
	 * A listing is not atomic against renames: a writer SIGKILLed just
	 * after os.replace-style renaming leaves the RENAME in snapsmp's socket,
	 * applied after we listed "ckpt.tmp" and before we open it. A name
	 * that vanishes is not a torn file: list again until the listing holds
	 * still (bounded; a namespace that keeps moving with the writer dead is
	 * reported).
	 */
	int rc = 0;
	for (int attempt = 0; attempt < 10000; attempt++) {
		rc = check_once(dir, bytes, newest, print, attempt < 9999);
		if (rc != -1)
			return rc;
		struct timespec ts = { 0, 1000000 };
		nanosleep(&ts, NULL);
	}
	return rc;
}

/* One pass of check(); -1 if retry is set and a listed name vanished. */
static int check_once(const char *dir, uint64_t bytes, int64_t *newest, int print, int retry)
{
	DIR *d = opendir(dir);
	if (!d) {
		printf("{\"error\": \"opendir %s: %s\"}\n", dir, strerror(errno));
		return 2;
	}
	char bad[4096] = "", names[8192] = "";
	int nfiles = 0, nbad = 0;
	*newest = -1;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[4096], why[256];
		uint64_t step = 0, fstep = 0;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		nfiles++;
		size_t nl = strlen(names);
		snprintf(names + nl, sizeof(names) - nl, "%s\"%s\"", nl ? ", " : "", e->d_name);
		int named = parse_step(e->d_name, &step);
		int vrc = verify(p, bytes, &fstep, why, sizeof(why));
		if (vrc != 0 && retry && strcmp(why, "open: No such file or directory") == 0) {
			closedir(d);
			return -1;
		}
		if (vrc != 0 || (named && fstep != step) || (!named && strcmp(e->d_name, "ckpt.tmp"))) {
			size_t bl = strlen(bad);
			snprintf(bad + bl, sizeof(bad) - bl, "%s\"%s: %s\"", nbad ? ", " : "", e->d_name,
				 named && fstep != step ? "step differs" : why);
			nbad++;
			continue;
		}
		if (named && (int64_t)step > *newest)
			*newest = (int64_t)step;
	}
	closedir(d);
	if (print)
		printf("{\"newest\": %" PRId64 ", \"files\": %d, \"bad\": [%s], \"names\": [%s]}\n", *newest, nfiles, bad,
		       names);
	return nbad ? 1 : 0;
}

/* Whether PL_PAUSE_AT (steps, comma-separated) names step. */
static int paused_at(uint64_t step)
{
	const char *p = getenv("PL_PAUSE_AT");
	while (p && *p) {
		char *end;
		unsigned long long v = strtoull(p, &end, 10);
		if (end == p)
			return 0;
		if (v == step)
			return 1;
		p = *end == ',' ? end + 1 : end;
	}
	return 0;
}

static int run(const char *dir, uint64_t bytes, uint64_t steps)
{
	int64_t newest;
	if (check(dir, bytes, &newest, 0) != 0) {
		fprintf(stderr, "pl_writer: %s holds an invalid file at start (a torn checkpoint is visible)\n", dir);
		check(dir, bytes, &newest, 1);
		return 3;
	}
	printf("resumed %" PRId64 "\n", newest);
	fflush(stdout);
	uint8_t *buf = malloc(bytes ? bytes : 1), h[HDR] = { 0 };
	if (!buf)
		return 1;
	uint64_t s = (uint64_t)getpid();
	char tmp[4096], fin[4096], old[4096];
	snprintf(tmp, sizeof(tmp), "%s/ckpt.tmp", dir);
	for (uint64_t step = (uint64_t)(newest + 1); step < (uint64_t)(newest + 1) + steps; step++) {
		payload(step, buf, bytes);
		int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		if (fd < 0 || write_all(fd, h, HDR)) {   /* placeholder header, patched by pwrite below */
			perror("pl_writer: open/write");
			return 1;
		}
		for (size_t off = 0; off < bytes;) {
			size_t n = 1 + rng_next(&s) % (256 << 10);
			n = n > bytes - off ? bytes - off : n;
			if (write_all(fd, buf + off, n)) {
				perror("pl_writer: write");
				return 1;
			}
			off += n;
		}
		header(h, step, bytes);
		struct stat st;
		if (pwrite(fd, h, HDR, 0) != HDR || lseek(fd, 0, SEEK_CUR) != (off_t)(HDR + bytes) || fstat(fd, &st) ||
		    st.st_size != (off_t)(HDR + bytes) || fsync(fd) || close(fd)) {
			perror("pl_writer: pwrite/lseek/fstat/fsync/close");
			return 1;
		}
		snprintf(fin, sizeof(fin), "%s/ckpt-%" PRIu64, dir, step);
		if (rename(tmp, fin)) {
			perror("pl_writer: rename");
			return 1;
		}
		if (step >= 2) {
			snprintf(old, sizeof(old), "%s/ckpt-%" PRIu64, dir, step - 2);
			if (unlink(old) && errno != ENOENT) {
				perror("pl_writer: unlink");
				return 1;
			}
		}
		printf("committed %" PRIu64 "\n", step);
		fflush(stdout);
		if (paused_at(step)) {
			/* Between checkpoints, every file closed: the memory test
			 * reads /proc while this process is stopped. */
			printf("paused %" PRIu64 "\n", step);
			fflush(stdout);
			raise(SIGSTOP);
		}
	}
	free(buf);
	return 0;
}

/* run, then wait for a signal (the SIGTERM test): print "holding" once done. */
static int hold(const char *dir, uint64_t bytes, uint64_t steps)
{
	int rc = run(dir, bytes, steps);
	if (rc)
		return rc;
	printf("holding\n");
	fflush(stdout);
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "run"))
		return run(argv[2], strtoull(argv[3], NULL, 0), argc > 4 ? strtoull(argv[4], NULL, 0) : UINT64_MAX / 4);
	if (argc >= 5 && !strcmp(argv[1], "hold"))
		return hold(argv[2], strtoull(argv[3], NULL, 0), strtoull(argv[4], NULL, 0));
	if (argc >= 4 && !strcmp(argv[1], "check")) {
		int64_t newest;
		return check(argv[2], strtoull(argv[3], NULL, 0), &newest, 1);
	}
	fprintf(stderr, "usage: pl_writer run DIR BYTES [STEPS] | check DIR BYTES\n");
	return 2;
}
