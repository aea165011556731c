/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * snapbench flush: our HDF5 flush (codec none, lz4, codec frames) against fio's
 * sequential O_DIRECT io_uring write and a plain h5py write, same directory,
 * same bytes, one run. The arrays are real trained weights
 * (ppocr_v4_rec.f32) repeated to --size and cut into 64 MiB tensors.
 * Without --dir it writes in a fresh directory under $TMPDIR (or /tmp) and
 * removes it afterwards.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <lz4.h>

#include "bench_util.h"
#include "cliopts.h"
#include "snap/base.h"
#include "snap/codec.h"
#include "snap/io.h"
#include "snapbench.h"

#define TENSOR_MAX (64ull << 20)

/* Relative to the working directory: a checkout's root or its build dir. */
static const char *const data_paths[] = {
	"../shared/data/ppocr_v4_rec.f32", "../../shared/data/ppocr_v4_rec.f32", NULL};

static void usage(FILE *o)
{
	fprintf(o, "usage: snapbench flush --size BYTES [--dir DIR] [--json]\n"
		   "  Writes BYTES of real fp32 weights as one rank's step with snapio (codec none,\n"
		   "  then lz4, then as codec frames: lossless and lossy abs 1e-3, compressed\n"
		   "  beforehand as the copy threads do at save time), runs fio --rw=write --bs=4M --direct=1 --ioengine=io_uring --iodepth=8\n"
		   "  --end_fsync=1 of the same size in DIR, and a plain h5py write of the same arrays;\n"
		   "  it also times LZ4 compressing the same bytes in memory (4 MiB chunks, one thread)\n"
		   "  and gives the LZ4 flush as a share of min(that, fio x LZ4's ratio), the slower of\n"
		   "  compressing and writing. Every figure but that one includes fsync. GB/s = 1e9 bytes/s. After each snapio write it reports\n"
		   "  how many MiB of the file the page cache still holds (mincore): buffered writes\n"
		   "  leave it there, O_DIRECT writes do not. DIR defaults to a fresh directory\n"
		   "  under $TMPDIR (else /tmp), removed afterwards. The weights: env SNAP_BENCH_DATA, else\n"
		   "  ../shared/data/ppocr_v4_rec.f32 or ../../shared/data/ppocr_v4_rec.f32 from the\n"
		   "  working directory.\n");
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char *find_data(void)
{
	const char *e = getenv("SNAP_BENCH_DATA");
	if (e && access(e, R_OK) == 0)
		return e;
	for (int i = 0; data_paths[i]; i++)
		if (access(data_paths[i], R_OK) == 0)
			return data_paths[i];
	return NULL;
}

/* How much of step's rank file the flush left in the page cache, in MiB
 * (mincore); -1 if it cannot tell. Buffered writes leave all of it there,
 * evicting what the node had cached; O_DIRECT writes leave none. */
static double cached_mib(const char *dir, const char *job, uint64_t step)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s/step-%" PRIu64 "/rank-0.h5", dir, job, step);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || st.st_size == 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	size_t len = (size_t)st.st_size, pg = (size_t)sysconf(_SC_PAGESIZE), np = (len + pg - 1) / pg;
	void *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
	close(fd);
	unsigned char *vec = m != MAP_FAILED ? malloc(np) : NULL;
	double mib = -1;
	if (vec && mincore(m, len, vec) == 0) {
		size_t in = 0;
		for (size_t i = 0; i < np; i++)
			in += vec[i] & 1;
		mib = (double)in * (double)pg / (1 << 20);
	}
	free(vec);
	if (m != MAP_FAILED)
		munmap(m, len);
	return mib;
}

static int fill(unsigned char *buf, size_t n, const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	size_t got = 0;
	while (got < n) {
		size_t k = fread(buf + got, 1, n - got, f);
		if (k == 0) {
			if (got == 0)
				break;
			rewind(f);
			continue;
		}
		got += k;
	}
	fclose(f);
	return got == n ? 0 : -1;
}

static double run_flush(const char *dir, const char *job, uint64_t step, int codec, unsigned char *buf, size_t size,
			double *ratio)
{
	size_t nt = (size + TENSOR_MAX - 1) / TENSOR_MAX;
	struct snap_io_region *r = calloc(nt, sizeof *r);
	char (*names)[32] = calloc(nt, sizeof *names);
	struct snap_io_err err = {0};
	struct snap_io_opts o = {.codec = codec};
	struct snap_io_writer *w = r && names ? snap_io_writer_new(&o, &err) : NULL;
	double gbps = -1;
	if (w) {
		for (size_t i = 0; i < nt; i++) {
			size_t off = i * TENSOR_MAX, len = size - off < TENSOR_MAX ? size - off : TENSOR_MAX;
			snprintf(names[i], sizeof names[i], "layer.%zu.weight", i);
			r[i] = (struct snap_io_region){.name = names[i], .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
						       .ndim = 1, .data = buf + off, .bytes = len};
			r[i].global_shape[0] = r[i].shape[0] = len / 4;
			r[i].crc32c = snap_io_crc32c(buf + off, len); /* as the store would hand it over */
			r[i].has_crc = 1;
		}
		struct snap_io_write_stats st;
		double t0 = now();
		if (snap_io_write_rank(w, dir, job, step, 0, 1, r, nt, &st, &err) == 0 &&
		    snap_io_step_seal(dir, job, step, 1, &err) == 0) {
			gbps = (double)size / (now() - t0) / 1e9;
			*ratio = (double)st.raw_bytes / (double)st.stored_bytes;
		}
	}
	if (gbps < 0)
		fprintf(stderr, "bench flush: %s\n", err.msg);
	snap_io_writer_free(w);
	free(r);
	free(names);
	return gbps;
}

/* LZ4's own speed on the same bytes, one thread, in memory: the chunks
 * snapio's LZ4 flush makes (4 MiB, LZ4_compress_default), nothing written.
 * With fio's figure it bounds what an LZ4 flush can reach. */
static double lz4_in_memory(const unsigned char *buf, size_t size)
{
	const int chunk = 4 << 20;
	char *out = malloc((size_t)LZ4_compressBound(chunk));
	if (!out)
		return -1;
	size_t sink = 0;
	double t0 = now();
	for (size_t off = 0; off < size; off += (size_t)chunk) {
		int n = size - off < (size_t)chunk ? (int)(size - off) : chunk;
		sink += (size_t)LZ4_compress_default((const char *)buf + off, out, n, LZ4_compressBound(chunk));
	}
	double t = now() - t0;
	free(out);
	return sink ? (double)size / t / 1e9 : -1;
}

/*
 * The flush of codec regions: the frames the copy threads made at save time
 * (made here, untimed, 4 MiB of values each) written as they are. GB/s is of
 * raw bytes, so it shows what the smaller files buy.
 */
#define FRAME_ELEMS (1u << 20)
static double run_frames(const char *dir, const char *job, uint64_t step, int codec, double bound,
			 const unsigned char *buf, size_t size, double *ratio)
{
	size_t nt = (size + TENSOR_MAX - 1) / TENSOR_MAX, nf = (size / 4 + FRAME_ELEMS - 1) / FRAME_ELEMS;
	struct snap_codec_params p = { .codec = codec, .dtype = SNAP_DTYPE_F32, .bound = bound };
	size_t cap = snap_codec_bound(&p, FRAME_ELEMS);
	struct snap_io_region *r = calloc(nt, sizeof *r);
	char (*names)[32] = calloc(nt, sizeof *names);
	unsigned char *fbuf = malloc(nf * cap);
	const void **frame = calloc(nf, sizeof *frame);
	uint64_t *flen = calloc(nf, sizeof *flen);
	uint32_t *fcrc = calloc(nf, sizeof *fcrc);
	struct snap_io_err err = {0};
	struct snap_io_writer *w = r && names && fbuf && frame && flen && fcrc ? snap_io_writer_new(NULL, &err) : NULL;
	double gbps = -1;
	for (size_t i = 0, f = 0; w && i < nt; i++) {
		size_t off = i * TENSOR_MAX, len = size - off < TENSOR_MAX ? size - off : TENSOR_MAX;
		snprintf(names[i], sizeof names[i], "layer.%zu.weight", i);
		r[i] = (struct snap_io_region){.name = names[i], .dtype = SNAP_DTYPE_F32, .kind = SNAP_KIND_PARAM,
					       .ndim = 1, .bytes = len, .frame_elems = FRAME_ELEMS,
					       .frame = frame + f, .frame_len = flen + f, .frame_crc = fcrc + f};
		r[i].global_shape[0] = r[i].shape[0] = len / 4;
		for (size_t e = 0; e < len / 4; e += FRAME_ELEMS, f++, r[i].nframes++) {
			size_t n = len / 4 - e < FRAME_ELEMS ? len / 4 - e : FRAME_ELEMS, out = 0;
			if (snap_codec_compress(&p, buf + off + e * 4, n, fbuf + f * cap, cap, &out)) {
				snprintf(err.msg, sizeof err.msg, "compression failed");
				snap_io_writer_free(w);
				w = NULL;
				break;
			}
			frame[f] = fbuf + f * cap;
			flen[f] = out;
			fcrc[f] = snap_io_crc32c(frame[f], out);
		}
	}
	struct snap_io_write_stats st;
	double t0 = now();
	if (w && snap_io_write_rank(w, dir, job, step, 0, 1, r, nt, &st, &err) == 0 &&
	    snap_io_step_seal(dir, job, step, 1, &err) == 0) {
		gbps = (double)size / (now() - t0) / 1e9;
		*ratio = (double)st.raw_bytes / (double)st.stored_bytes;
	}
	if (gbps < 0)
		fprintf(stderr, "bench flush: frames: %s\n", err.msg);
	snap_io_writer_free(w);
	free(r);
	free(names);
	free(fbuf);
	free(frame);
	free(flen);
	free(fcrc);
	return gbps;
}

static double run_fio(const char *dir, size_t size, char *note, size_t cap)
{
	char cmd[4096];
	if (snprintf(cmd, sizeof cmd, "fio --name=snapbench --directory='%s' --rw=write --bs=4M --direct=1 "
		     "--ioengine=io_uring --iodepth=8 --end_fsync=1 --size=%zu --output-format=json 2>/dev/null", dir,
		     size) >= (int)sizeof cmd) {
		snprintf(note, cap, "directory too long for the fio command; skipped");
		return -1;
	}
	FILE *p = popen(cmd, "r");
	if (!p) {
		snprintf(note, cap, "fio could not be started");
		return -1;
	}
	static char out[1 << 20];
	size_t n = fread(out, 1, sizeof out - 1, p);
	out[n] = '\0';
	int st = pclose(p);
	if (snprintf(cmd, sizeof cmd, "%s/snapbench.0.0", dir) < (int)sizeof cmd)
		unlink(cmd);
	const char *wr = strstr(out, "\"write\" : {");
	const char *bw = wr ? strstr(wr, "\"bw_bytes\"") : NULL;
	if (st != 0 || !bw) {
		snprintf(note, cap, "fio absent or failed (exit %d); skipped", st);
		return -1;
	}
	return strtod(strchr(bw, ':') + 1, NULL) / 1e9;
}

static double run_h5py(const char *dir, const char *data, size_t size, char *note, size_t cap)
{
	char cmd[8192];
	snprintf(cmd, sizeof cmd,
		 "'%s' - <<'EOF' 2>&1\n"
		 "import os, time, h5py, numpy as np\n"
		 "size, T = %zu, %llu\n"
		 "buf = np.resize(np.fromfile('%s', dtype=np.uint8), size)\n"
		 "fn = '%s/snapbench-h5py.h5'\n"
		 "t0 = time.monotonic()\n"
		 "with h5py.File(fn, 'w') as f:\n"
		 "    for i, off in enumerate(range(0, size, T)):\n"
		 "        f.create_dataset('layer.%%d.weight' %% i, data=buf[off:off + T].view(np.float32))\n"
		 "fd = os.open(fn, os.O_RDONLY); os.fsync(fd); os.close(fd)\n"
		 "print('SECONDS', time.monotonic() - t0)\n"
		 "os.unlink(fn)\n"
		 "EOF\n", BENCH_PYTHON, size, TENSOR_MAX, data, dir);
	FILE *p = popen(cmd, "r");
	char line[512];
	double s = -1;
	while (p && fgets(line, sizeof line, p))
		if (strncmp(line, "SECONDS ", 8) == 0)
			s = strtod(line + 8, NULL);
	if (p)
		pclose(p);
	if (s <= 0) {
		snprintf(note, cap, "h5py write failed; skipped");
		return -1;
	}
	return (double)size / s / 1e9;
}

static int size_opt(const struct cli *c, const char *opt, const char *v, void *dst)
{
	if (snap_parse_size(v, dst)) {
		cli_error(c, "%s %s: expected a size like 64M or 1G", opt, v);
		return -1;
	}
	return 0;
}

/* SB_OK with *size (whole pages), *dir, *json; -1 after --help; SB_USAGE. */
static int flush_parse(int argc, char **argv, size_t *size, const char **dir, int *json)
{
	uint64_t b = 0;
	const struct cli_opt opts[] = {
		CLI_OPT_HELP,
		CLI_OPT_CALL("size", 0, &b, size_opt),
		CLI_OPT_STR("dir", 0, dir),
		CLI_OPT_FLAG("json", 0, json),
	};
	const struct cli c = BENCH_CLI("flush", usage, 0);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	*size = (size_t)b / 4096 * 4096;
	if (*size == 0) {
		usage(stderr);
		return SB_USAGE;
	}
	return SB_OK;
}

/* What flush measured, as printed. */
struct flush_figures {
	double none, lz4, fl, fa, r1, r2, r3, fio, h5, lzm, lz4_limit, c[4];
	char fio_note[128], h5_note[128];
};

/* The weights, size bytes of them in a page-aligned buffer; NULL after a message. */
static unsigned char *flush_data(size_t size, const char **data)
{
	*data = find_data();
	if (!*data) {
		const char *e = getenv("SNAP_BENCH_DATA");
		fprintf(stderr, "bench flush: weights file not found: SNAP_BENCH_DATA is %s%s%s, and neither %s nor %s "
			"is readable from the working directory (set SNAP_BENCH_DATA to ppocr_v4_rec.f32)\n",
			e ? "'" : "", e ? e : "unset", e ? "' (not readable)" : "", data_paths[0], data_paths[1]);
		return NULL;
	}
	unsigned char *buf = NULL;
	if (posix_memalign((void **)&buf, 4096, size) != 0 || fill(buf, size, *data) < 0) {
		fprintf(stderr, "bench flush: cannot prepare %zu bytes from %s\n", size, *data);
		free(buf);
		return NULL;
	}
	return buf;
}

/* snapio's four ways, then fio, LZ4 in memory and h5py, in dir. */
static void flush_measure(const char *dir, const char *data, unsigned char *buf, size_t size,
			  struct flush_figures *f)
{
	char job[64], rm[4096];
	snprintf(job, sizeof job, "bench-%d", (int)getpid());
	double r0 = 1;
	f->r1 = f->r2 = f->r3 = 1;
	f->none = run_flush(dir, job, 1, SNAP_IO_CODEC_NONE, buf, size, &r0);
	f->c[0] = cached_mib(dir, job, 1);
	f->lz4 = run_flush(dir, job, 2, SNAP_IO_CODEC_LZ4, buf, size, &f->r1);
	f->c[1] = cached_mib(dir, job, 2);
	f->fl = run_frames(dir, job, 3, SNAP_CODEC_LOSSLESS, 0, buf, size, &f->r2);
	f->c[2] = cached_mib(dir, job, 3);
	f->fa = run_frames(dir, job, 4, SNAP_CODEC_LOSSY_ABS, 1e-3, buf, size, &f->r3);
	f->c[3] = cached_mib(dir, job, 4);
	if (snprintf(rm, sizeof rm, "rm -rf '%s/%s'", dir, job) >= (int)sizeof rm || system(rm) != 0)
		fprintf(stderr, "bench flush: could not remove %s/%s\n", dir, job);
	f->fio = run_fio(dir, size, f->fio_note, sizeof f->fio_note);
	f->lzm = lz4_in_memory(buf, size);
	/* An LZ4 flush writes the compressed bytes: its limit in raw GB/s is the
	 * slower of compressing and writing them. */
	f->lz4_limit = f->fio > 0 && f->lzm > 0 ? (f->fio * f->r1 < f->lzm ? f->fio * f->r1 : f->lzm) : -1;
	f->h5 = run_h5py(dir, data, size, f->h5_note, sizeof f->h5_note);
}

static void flush_json(size_t size, const char *dir, const struct flush_figures *f)
{
	printf("{\"size\": %zu, \"dir\": \"%s\", \"flush_gbps\": %.3f, \"flush_lz4_gbps\": %.3f, "
	       "\"lz4_ratio\": %.4f, \"frames_lossless_gbps\": %.3f, \"frames_lossless_ratio\": %.4f, "
	       "\"frames_lossy_gbps\": %.3f, \"frames_lossy_ratio\": %.4f, \"fio_gbps\": %.3f, "
	       "\"h5py_gbps\": %.3f, \"flush_vs_fio\": %.3f, \"lz4_memory_gbps\": %.3f, "
	       "\"flush_lz4_vs_limit\": %.3f, \"cached_mib\": {\"none\": %.1f, \"lz4\": %.1f, "
	       "\"frames_lossless\": %.1f, \"frames_lossy\": %.1f}}\n",
	       size, dir, f->none, f->lz4, f->r1, f->fl, f->r2, f->fa, f->r3, f->fio, f->h5,
	       f->fio > 0 ? f->none / f->fio : -1.0, f->lzm, f->lz4_limit > 0 ? f->lz4 / f->lz4_limit : -1.0, f->c[0],
	       f->c[1], f->c[2], f->c[3]);
}

static void flush_text(size_t size, const char *dir, const struct flush_figures *f)
{
	printf("flush benchmark: %zu bytes of fp32 weights in %s\n", size, dir);
	printf("  %-34s %8s   %s\n", "path", "GB/s", "(left in the page cache)");
	printf("  %-34s %8.3f   (%.0f MiB)\n", "snapio codec=none (io_uring)", f->none, f->c[0]);
	printf("  %-34s %8.3f   (ratio %.4f; %.0f MiB)\n", "snapio codec=lz4 (io_uring)", f->lz4, f->r1, f->c[1]);
	printf("  %-34s %8.3f   (ratio %.4f; raw GB/s; %.0f MiB)\n", "snapio frames, lossless (io_uring)", f->fl, f->r2,
	       f->c[2]);
	printf("  %-34s %8.3f   (ratio %.4f; raw GB/s; %.0f MiB)\n", "snapio frames, lossy abs 1e-3", f->fa, f->r3,
	       f->c[3]);
	if (f->fio > 0)
		printf("  %-34s %8.3f   (snapio none = %.0f%% of fio)\n", "fio write 4M direct io_uring qd8", f->fio,
		       100 * f->none / f->fio);
	else
		printf("  %-34s %8s   %s\n", "fio", "-", f->fio_note);
	if (f->lzm > 0 && f->lz4_limit > 0)
		printf("  %-34s %8.3f   (snapio lz4 = %.0f%% of min(this, fio x ratio))\n",
		       "lz4 in memory, 1 thread", f->lzm, 100 * f->lz4 / f->lz4_limit);
	if (f->h5 > 0)
		printf("  %-34s %8.3f\n", "h5py plain write", f->h5);
	else
		printf("  %-34s %8s   %s\n", "h5py", "-", f->h5_note);
}

int cmd_bench_flush(int argc, char **argv)
{
	size_t size = 0;
	const char *dir = NULL, *data;
	char scratch[PATH_MAX] = "", rm[4096];
	int json = 0;
	int rc = flush_parse(argc, argv, &size, &dir, &json);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	unsigned char *buf = flush_data(size, &data);
	if (!buf)
		return SB_FAIL;
	if (!dir) {
		const char *tmp = getenv("TMPDIR");
		snprintf(scratch, sizeof scratch, "%s/snapbench-flush-XXXXXX", tmp && *tmp ? tmp : "/tmp");
		if (!mkdtemp(scratch)) {
			fprintf(stderr, "bench flush: cannot create a scratch directory %s: %s (give --dir)\n", scratch,
				strerror(errno));
			free(buf);
			return SB_FAIL;
		}
		dir = scratch;
	}
	static struct flush_figures F;
	flush_measure(dir, data, buf, size, &F);
	free(buf);
	/* The scratch directory is ours: it goes whole, with whatever a failed step left. */
	if (scratch[0]) {
		if (snprintf(rm, sizeof rm, "rm -rf '%s'", scratch) >= (int)sizeof rm || system(rm) != 0)
			fprintf(stderr, "bench flush: could not remove %s\n", scratch);
	}
	if (json)
		flush_json(size, dir, &F);
	else
		flush_text(size, dir, &F);
	return F.none > 0 && F.lz4 > 0 && F.fl > 0 && F.fa > 0 ? SB_OK : SB_FAIL;
}
