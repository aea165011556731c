/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * pl_calls - the calls a captured directory must answer like a directory,
 * one by one, run under LD_PRELOAD=libsnap_preload.so with a real snapsmp
 * (tests/preload/preload_trials.py starts both):
 *
 *   pl_calls use DIR     create, write/pwrite/writev, read/pread/lseek/mmap,
 *                        stat/lstat/fstatat/statx/access, fopen64/fwrite/fclose,
 *                        O_APPEND, O_EXCL, update in place, truncate/ftruncate,
 *                        dup/dup2/fcntl(F_DUPFD), fork, rename (replace, while
 *                        open, directories), unlink (also while open), rmdir,
 *                        opendir/readdir, getdents64, openat/fstatat/unlinkat
 *                        with a directory descriptor, chdir + relative paths,
 *                        __open_2, creat, sendfile/copy_file_range, exec
 *   pl_calls disk DIR    without the preload, after snapsmp flushed: the real
 *                        directory holds exactly the final files, byte for byte
 *
 * Exit 0 when every check passed; each failure is printed.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

int __open_2(const char *path, int flags);

static int failures, checks;
#define CHECK(c)                                                                                       \
	do {                                                                                           \
		checks++;                                                                              \
		if (!(c)) {                                                                            \
			failures++;                                                                    \
			printf("FAILED %s:%d: %s (errno %s)\n", __FILE__, __LINE__, #c, strerror(errno)); \
		}                                                                                      \
	} while (0)

static char dir[2048];

static const char *P(const char *name)
{
	static char b[8][4096];
	static int i;
	i = (i + 1) % 8;
	snprintf(b[i], sizeof(b[i]), "%s/%s", dir, name);
	return b[i];
}

/* Deterministic content: byte k of file `tag`. */
static void fill(uint8_t *p, size_t n, unsigned tag, size_t from)
{
	for (size_t k = 0; k < n; k++)
		p[k] = (uint8_t)((from + k) * 31 + tag * 7 + ((from + k) >> 11));
}

static int same_as(const char *path, const uint8_t *want, size_t n)
{
	int fd = open(path, O_RDONLY);
	if (fd < 0)
		return 0;
	struct stat st;
	uint8_t *got = malloc(n + 1);
	ssize_t r = got ? read(fd, got, n + 1) : -1;
	int ok = fstat(fd, &st) == 0 && (size_t)st.st_size == n && r == (ssize_t)n && memcmp(got, want, n) == 0;
	free(got);
	close(fd);
	return ok;
}

static int exists(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0;
}

/* names[0..n) sorted and joined by ','. A listing that does not fit says so,
 * and so matches no expected one, rather than being cut. */
static void join_names(char (*names)[256], int n, char *out, size_t cap)
{
	qsort(names, (size_t)n, 256, (int (*)(const void *, const void *))strcmp);
	size_t len = 0;
	out[0] = '\0';
	for (int i = 0; i < n; i++) {
		int w = snprintf(out + len, cap - len, "%s%s", i ? "," : "", names[i]);
		if (w < 0 || (size_t)w >= cap - len) {
			snprintf(out, cap, "(names longer than %zu bytes)", cap - 1);
			return;
		}
		len += (size_t)w;
	}
}

/* Names in dir (opendir/readdir), "a,b,c" sorted, hidden names skipped. */
static void listing(const char *d, char *out, size_t cap)
{
	char names[64][256];
	int n = 0;
	DIR *dp = opendir(d);
	struct dirent *e;
	while (dp && (e = readdir(dp)) && n < 64)
		if (e->d_name[0] != '.')
			snprintf(names[n++], 256, "%s", e->d_name);
	if (dp)
		closedir(dp);
	join_names(names, n, out, cap);
}

/* The same through getdents64 on an O_DIRECTORY descriptor. */
static void listing_getdents(const char *d, char *out, size_t cap)
{
	char names[64][256], buf[512];
	int n = 0, fd = open(d, O_RDONLY | O_DIRECTORY);
	ssize_t r;
	while (fd >= 0 && (r = getdents64(fd, buf, sizeof(buf))) > 0)
		for (ssize_t off = 0; off < r && n < 64;) {
			struct dirent64 *e = (struct dirent64 *)(buf + off);
			if (e->d_name[0] != '.')
				snprintf(names[n++], 256, "%s", e->d_name);
			off += e->d_reclen;
		}
	if (fd >= 0)
		close(fd);
	join_names(names, n, out, cap);
}

#define MB (1u << 20)

/* The final state both modes agree on. */
static void expected_a(uint8_t *a)   /* a.bin: 1000 bytes after truncate, middle patched */
{
	fill(a, 1000, 1, 0);
	memset(a + 500, 0xAB, 16);
}

static int use(void)
{
	static uint8_t buf[4 * MB], want[4 * MB];
	struct stat st;
	char l[2048];

	/* 1. create, write + pwrite, visible to this process while open */
	fill(buf, MB, 1, 0);
	int fd = open(P("a.bin"), O_WRONLY | O_CREAT | O_EXCL, 0640);
	CHECK(fd >= 0);
	CHECK(write(fd, buf, MB / 2) == MB / 2);
	CHECK(pwrite(fd, buf + MB / 2, MB / 2, MB / 2) == MB / 2);
	CHECK(stat(P("a.bin"), &st) == 0 && st.st_size == MB);
	CHECK(close(fd) == 0);
	CHECK(stat(P("a.bin"), &st) == 0 && st.st_size == MB && S_ISREG(st.st_mode) && (st.st_mode & 0777) == 0640);
	CHECK(lstat(P("a.bin"), &st) == 0 && st.st_size == MB);
	CHECK(fstatat(AT_FDCWD, P("a.bin"), &st, 0) == 0 && st.st_size == MB);
	struct statx sx;
	CHECK(statx(AT_FDCWD, P("a.bin"), 0, STATX_BASIC_STATS, &sx) == 0 && sx.stx_size == MB);
	CHECK(access(P("a.bin"), R_OK | W_OK) == 0);
	CHECK(access(P("nope"), F_OK) != 0 && errno == ENOENT);
	CHECK(same_as(P("a.bin"), buf, MB));
	/* the store holds it, the file system does not (yet, without a flush) */
	char ns[8192];
	snprintf(ns, sizeof(ns), "%s/%s/files/ns%s/a.bin", getenv("SNAP_STORE"), getenv("SNAP_JOB") ? getenv("SNAP_JOB") : "default", dir);
	CHECK(access(ns, F_OK) == 0);

	/* 2. read paths: pread, lseek, mmap */
	fd = open(P("a.bin"), O_RDONLY);
	uint8_t small[64];
	CHECK(fd >= 0 && pread(fd, small, 64, 4096) == 64 && memcmp(small, buf + 4096, 64) == 0);
	CHECK(lseek(fd, 0, SEEK_END) == MB);
	CHECK(lseek(fd, 100, SEEK_SET) == 100 && read(fd, small, 8) == 8 && memcmp(small, buf + 100, 8) == 0);
	uint8_t *m = mmap(NULL, MB, PROT_READ, MAP_SHARED, fd, 0);
	CHECK(m != MAP_FAILED && memcmp(m, buf, MB) == 0);
	if (m != MAP_FAILED)
		munmap(m, MB);
	close(fd);

	/* 3. O_EXCL on an existing captured file */
	CHECK(open(P("a.bin"), O_WRONLY | O_CREAT | O_EXCL, 0640) < 0 && errno == EEXIST);

	/* 4. fopen64 / fwrite / fclose, and reading it with fopen */
	FILE *f = fopen64(P("b.txt"), "w");
	CHECK(f != NULL);
	if (f) {
		CHECK(fwrite("hello captured world\n", 1, 21, f) == 21);
		CHECK(fprintf(f, "%d\n", 42) == 3);
		CHECK(fclose(f) == 0);
	}
	f = fopen(P("b.txt"), "r");
	char line[64] = "";
	CHECK(f && fgets(line, sizeof(line), f) && strcmp(line, "hello captured world\n") == 0);
	if (f)
		fclose(f);

	/* 5. O_APPEND keeps what was there */
	fd = open(P("a.bin"), O_WRONLY | O_APPEND);
	fill(buf + MB, 10, 2, 0);
	CHECK(fd >= 0 && write(fd, buf + MB, 10) == 10);
	CHECK(close(fd) == 0);
	CHECK(stat(P("a.bin"), &st) == 0 && st.st_size == MB + 10);

	/* 6. update in place (O_RDWR, no O_TRUNC): a new version, rest preserved */
	fd = open(P("a.bin"), O_RDWR);
	memset(small, 0xAB, 16);
	CHECK(fd >= 0 && pwrite(fd, small, 16, 500) == 16);
	CHECK(close(fd) == 0);
	memcpy(want, buf, MB + 10);
	memset(want + 500, 0xAB, 16);
	CHECK(same_as(P("a.bin"), want, MB + 10));

	/* 7. truncate (path) and ftruncate (descriptor) */
	CHECK(truncate(P("a.bin"), 1000) == 0);
	expected_a(want);
	CHECK(same_as(P("a.bin"), want, 1000));
	fd = open(P("t.bin"), O_RDWR | O_CREAT | O_TRUNC, 0600);
	CHECK(fd >= 0 && ftruncate(fd, 3 * MB) == 0);
	uint8_t *w = fd >= 0 ? mmap(NULL, 3 * MB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	CHECK(w != MAP_FAILED);
	if (w != MAP_FAILED) {
		fill(w, 3 * MB, 3, 0);   /* written through a mapping, not write() */
		munmap(w, 3 * MB);
	}
	CHECK(ftruncate(fd, 2 * MB) == 0 && close(fd) == 0);
	fill(want, 2 * MB, 3, 0);
	CHECK(same_as(P("t.bin"), want, 2 * MB));

	/* 8. dup, dup2, F_DUPFD: the file is committed at its last close */
	fd = open(P("c.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	int fd2 = dup(fd), fd3 = fcntl(fd, F_DUPFD_CLOEXEC, 200), fd4 = dup2(fd, 150);
	fill(buf, 3 * MB, 4, 0);
	CHECK(fd >= 0 && fd2 >= 0 && fd3 >= 200 && fd4 == 150);
	CHECK(write(fd, buf, MB) == MB);
	CHECK(close(fd) == 0);
	CHECK(write(fd2, buf + MB, MB) == MB && close(fd2) == 0);
	CHECK(write(fd3, buf + 2 * MB, MB) == MB && close(fd3) == 0);
	CHECK(close(fd4) == 0);
	CHECK(same_as(P("c.bin"), buf, 3 * MB));

	/* 9. fork: the file open across it becomes a real file (both processes
	 * hold it); a child closing its inherited copy loses nothing */
	fd = open(P("d.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	fill(buf, 2 * MB, 5, 0);
	CHECK(fd >= 0 && write(fd, buf, MB) == MB);
	pid_t pid = fork();
	if (pid == 0) {
		close(fd);
		int cfd = open(P("child.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);   /* the child's own file */
		int ok = cfd >= 0 && write(cfd, "child", 5) == 5 && close(cfd) == 0;
		_exit(ok ? 0 : 1);
	}
	int status = -1;
	CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0);
	CHECK(write(fd, buf + MB, MB) == MB && close(fd) == 0);
	CHECK(same_as(P("d.bin"), buf, 2 * MB));
	CHECK(same_as(P("child.bin"), (const uint8_t *)"child", 5));

	/* 10. rename: replace an existing file, and rename a file still open */
	CHECK(rename(P("d.bin"), P("c.bin")) == 0);
	CHECK(!exists(P("d.bin")) && same_as(P("c.bin"), buf, 2 * MB));
	fd = open(P("e.tmp"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "early", 5) == 5);
	CHECK(rename(P("e.tmp"), P("e.bin")) == 0);
	CHECK(write(fd, "-late", 5) == 5 && close(fd) == 0);
	CHECK(!exists(P("e.tmp")) && same_as(P("e.bin"), (const uint8_t *)"early-late", 10));

	/* 11. unlink, also of a file being written */
	CHECK(unlink(P("child.bin")) == 0 && !exists(P("child.bin")));
	CHECK(unlink(P("child.bin")) != 0 && errno == ENOENT);
	fd = open(P("f.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "gone", 4) == 4 && unlink(P("f.bin")) == 0 && close(fd) == 0);
	CHECK(!exists(P("f.bin")));

	/* 12. writev, sendfile, copy_file_range into captured files; __open_2, creat */
	fill(buf, MB, 6, 0);
	fd = open(P("g.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	struct iovec iov[2] = { { buf, MB / 2 }, { buf + MB / 2, MB / 2 } };
	CHECK(fd >= 0 && writev(fd, iov, 2) == MB && close(fd) == 0);
	int src = __open_2(P("g.bin"), O_RDONLY);   /* how _FORTIFY_SOURCE code opens */
	fd = creat(P("h.bin"), 0644);
	off_t so = 0;
	CHECK(src >= 0 && fd >= 0 && sendfile(fd, src, &so, MB) == MB && close(fd) == 0);
	fd = open(P("i.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	loff_t in = 0;
	CHECK(fd >= 0 && copy_file_range(src, &in, fd, NULL, MB, 0) == MB && close(fd) == 0);
	/* as cp does: copy_file_range asks for nearly SSIZE_MAX bytes; the store
	 * must reserve only what the input holds, not fall back to the disk */
	fd = open(P("j.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && lseek(src, 0, SEEK_SET) == 0 &&
	      copy_file_range(src, NULL, fd, NULL, (size_t)SSIZE_MAX - (1u << 30), 0) == MB &&
	      copy_file_range(src, NULL, fd, NULL, (size_t)SSIZE_MAX - (1u << 30), 0) == 0 && close(fd) == 0);
	struct stat raw;   /* the real file system's view, past the preload's stat */
	CHECK(same_as(P("j.bin"), buf, MB) && syscall(SYS_newfstatat, AT_FDCWD, P("j.bin"), &raw, 0) != 0 &&
	      unlink(P("j.bin")) == 0);
	close(src);
	CHECK(same_as(P("h.bin"), buf, MB) && same_as(P("i.bin"), buf, MB));
	CHECK(unlink(P("g.bin")) == 0 && unlink(P("i.bin")) == 0);

	/* 13. listings merge the store's files with the real directory's */
	CHECK(same_as(P("pre.txt"), (const uint8_t *)"pre", 3));   /* written by the test without the preload */
	CHECK(mkdir(P("sub"), 0755) == 0);
	listing(dir, l, sizeof(l));
	CHECK(strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sub,t.bin") == 0);
	if (strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sub,t.bin"))
		printf("  listing: %s\n", l);
	listing_getdents(dir, l, sizeof(l));
	CHECK(strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sub,t.bin") == 0);
	if (strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sub,t.bin"))
		printf("  getdents64: %s\n", l);

	/* 14. directories: rmdir refuses one holding store files; a renamed directory takes them along */
	fd = open(P("sub/j.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "jjj", 3) == 3 && close(fd) == 0);
	CHECK(rmdir(P("sub")) != 0 && errno == ENOTEMPTY);
	CHECK(rename(P("sub"), P("sub2")) == 0);
	CHECK(same_as(P("sub2/j.bin"), (const uint8_t *)"jjj", 3) && !exists(P("sub/j.bin")));
	listing(P("sub2"), l, sizeof(l));
	CHECK(strcmp(l, "j.bin") == 0);

	/* 15. *at() with a descriptor of a captured directory; chdir and relative paths */
	int dfd = open(P("sub2"), O_RDONLY | O_DIRECTORY);
	fd = openat(dfd, "k.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(dfd >= 0 && fd >= 0 && write(fd, "kk", 2) == 2 && close(fd) == 0);
	CHECK(fstatat(dfd, "k.bin", &st, 0) == 0 && st.st_size == 2);
	CHECK(unlinkat(dfd, "k.bin", 0) == 0 && fstatat(dfd, "k.bin", &st, 0) != 0);
	CHECK(unlinkat(dfd, "j.bin", 0) == 0);
	close(dfd);
	CHECK(rmdir(P("sub2")) == 0);
	char cwd[4096];
	CHECK(getcwd(cwd, sizeof(cwd)) && chdir(dir) == 0);
	fd = open("rel.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "rel", 3) == 3 && close(fd) == 0);
	CHECK(stat("rel.bin", &st) == 0 && st.st_size == 3 && stat("../" "x-no", &st) != 0);
	CHECK(rename("rel.bin", "e.bin") == 0 && same_as("e.bin", (const uint8_t *)"rel", 3));
	CHECK(chdir(cwd) == 0);

	/* 16. outside the captured directory nothing changes: the file is on disk at once */
	char outside[4096];
	snprintf(outside, sizeof(outside), "%s.outside", dir);
	fd = open(outside, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "out", 3) == 3 && close(fd) == 0);
	snprintf(ns, sizeof(ns), "%s/%s/files/ns%s", getenv("SNAP_STORE"), getenv("SNAP_JOB") ? getenv("SNAP_JOB") : "default", outside);
	CHECK(access(ns, F_OK) != 0);
	CHECK(unlink(outside) == 0);

	/* 17. exec: a program the shell runs (it inherits LD_PRELOAD) writes its own
	 * captured file; our open file, shared with the child, becomes a real
	 * file before the spawn and keeps every byte written on either side */
	fd = open(P("x.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	CHECK(fd >= 0 && write(fd, "parent", 6) == 6);
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "printf child > '%s'", P("sh.txt"));
	/* A sanitizer build of the preload needs the sanitizer runtime loaded
	 * first into the uninstrumented shell (this program carries its own). */
	const char *rt = getenv("PL_ASAN_RUNTIME"), *pre = getenv("LD_PRELOAD");
	char *saved = pre ? strdup(pre) : NULL, both[8192];
	if (rt && *rt && saved) {
		snprintf(both, sizeof(both), "%s:%s", rt, saved);
		setenv("LD_PRELOAD", both, 1);
	}
	CHECK(system(cmd) == 0);
	if (saved) {
		setenv("LD_PRELOAD", saved, 1);
		free(saved);
	}
	CHECK(write(fd, "-after", 6) == 6 && close(fd) == 0);
	CHECK(same_as(P("x.bin"), (const uint8_t *)"parent-after", 12));
	CHECK(same_as(P("sh.txt"), (const uint8_t *)"child", 5));

	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}

/* Without the preload, after the flush: exactly the final files, byte for byte. */
static int disk(void)
{
	static uint8_t want[4 * MB];
	char l[2048];
	listing(dir, l, sizeof(l));
	CHECK(strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sh.txt,t.bin,x.bin") == 0);
	if (strcmp(l, "a.bin,b.txt,c.bin,e.bin,h.bin,pre.txt,sh.txt,t.bin,x.bin"))
		printf("  on disk: %s\n", l);
	expected_a(want);
	CHECK(same_as(P("a.bin"), want, 1000));
	CHECK(same_as(P("b.txt"), (const uint8_t *)"hello captured world\n42\n", 24));
	fill(want, 2 * MB, 5, 0);
	CHECK(same_as(P("c.bin"), want, 2 * MB));
	CHECK(same_as(P("e.bin"), (const uint8_t *)"rel", 3));
	fill(want, MB, 6, 0);
	CHECK(same_as(P("h.bin"), want, MB));
	fill(want, 2 * MB, 3, 0);
	CHECK(same_as(P("t.bin"), want, 2 * MB));
	CHECK(same_as(P("pre.txt"), (const uint8_t *)"pre", 3));
	CHECK(same_as(P("x.bin"), (const uint8_t *)"parent-after", 12));
	CHECK(same_as(P("sh.txt"), (const uint8_t *)"child", 5));
	struct stat st;
	CHECK(stat(P("a.bin"), &st) == 0 && (st.st_mode & 0777) == 0640);
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: pl_calls use|disk DIR\n");
		return 2;
	}
	snprintf(dir, sizeof(dir), "%s", argv[2]);
	umask(022);
	setvbuf(stdout, NULL, _IOLBF, 0);
	return !strcmp(argv[1], "use") ? use() : disk();
}
