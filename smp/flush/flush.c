/* SPDX-License-Identifier: BSD-3-Clause */
/* The flush thread; see flush.h. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "flush/flush.h"
#include "snap/base.h"
#include "snap/io.h"

struct snap_flusher {
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct flush_req *todo, *done;    /* FIFO in, LIFO out (order does not matter) */
	int stop;
	int pipe[2];                      /* one byte per finished request */
	struct snap_io_writer *writer;
	char dir[SNAP_PATH_MAX];
	unsigned keep;
};

void snap_flush_req_free(struct flush_req *req)
{
	if (!req)
		return;
	for (uint32_t i = 0; req->ranks && i < req->nranks; i++)
		snap_manifest_free(&req->ranks[i].man);
	free(req->ranks);
	free(req);
}

int flush_req_build(struct snap_store *s, struct store_job *j, uint64_t step, int node_only, struct flush_req **out,
		    char *err, size_t errlen)
{
	*out = NULL;
	struct store_rank *r0 = j->nranks ? j->ranks[0] : NULL;
	struct store_slot *s0 = snap_store_find(s, r0, step, NULL);
	if (!s0 && !node_only) {
		snap_fmt(err, errlen, "job %s has no committed step %" PRIu64 " to flush", j->name, step);
		return SNAP_ENOENT;
	}
	struct flush_req *q = calloc(1, sizeof(*q));
	if (!q || !(q->ranks = calloc(j->nranks ? j->nranks : 1, sizeof(*q->ranks)))) {
		free(q);
		return SNAP_ENOMEM;
	}
	snprintf(q->job, sizeof(q->job), "%s", j->name);
	q->step = step;
	q->node_only = node_only;
	q->world = s0 ? s0->man.world : 0;
	uint32_t upto = node_only ? j->nranks : q->world;
	if (upto > j->nranks && !node_only) {
		snap_fmt(err, errlen, "step %" PRIu64 " of job %s is not complete: rank %u does not hold it", step, j->name,
			 j->nranks);
		snap_flush_req_free(q);
		return SNAP_ENOENT;
	}
	for (uint32_t r = 0; r < upto; r++) {
		uint32_t slot;
		struct store_slot *sl = snap_store_find(s, j->ranks[r], step, &slot);
		if (!sl && node_only)
			continue;
		struct flush_rank *fr = &q->ranks[q->nranks];
		char why[128];
		if (!sl || snap_manifest_decode(sl->man_bytes, sl->man_len, &fr->man, why, sizeof(why))) {
			snap_fmt(err, errlen, "step %" PRIu64 " of job %s is not complete: rank %u does not hold it", step,
				 j->name, r);
			snap_flush_req_free(q);
			return SNAP_ENOENT;
		}
		q->nranks++;
		q->world = sl->man.world;
		fr->slot = slot;
		snap_store_path(s, j->name, r, slot, 0, fr->path, sizeof(fr->path));
	}
	for (uint32_t i = 0; i < q->nranks; i++)
		j->ranks[q->ranks[i].man.rank]->slots[q->ranks[i].slot].refs++;
	*out = q;
	return 0;
}

void flush_req_unpin(struct snap_store *s, const struct flush_req *q)
{
	struct store_job *j = snap_store_job(s, q->job, 0);
	for (uint32_t i = 0; j && i < q->nranks; i++) {
		uint32_t r = q->ranks[i].man.rank;
		if (r < j->nranks && j->ranks[r])
			snap_store_unref(s, j, j->ranks[r], q->ranks[i].slot);
	}
}

/* Map a rank's slot read-only. */
static int map_slot(const struct flush_rank *fr, const uint8_t **base, char *err, size_t errlen)
{
	const struct snap_layout *lay = &fr->man.layout;
	*base = NULL;
	if (lay->slot_bytes == 0)
		return 0;
	struct stat st;
	char why[128];
	int fd = snap_store_open_regular(fr->path, O_RDONLY, &st, why, sizeof(why));
	if (fd < 0) {
		snap_fmt(err, errlen, "cannot open slot file %s: %s", fr->path, why[0] ? why : "missing");
		return SNAP_EIO;
	}
	const uint8_t *p = mmap(NULL, lay->slot_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
	close(fd);
	if (p == MAP_FAILED) {
		snap_fmt(err, errlen, "cannot map slot file %s: %s", fr->path, strerror(errno));
		return SNAP_EIO;
	}
	*base = p;
	return 0;
}

/* A raw region's CRC32C from its chunks' CRCs in the manifest: no pass over the data. */
static uint32_t region_crc(const struct snap_manifest *m, const struct snap_man_region *g)
{
	uint32_t c = 0;
	for (uint32_t k = 0; k < g->nchunks; k++)
		c = snap_crc32c_combine(c, m->crc[g->first_crc + k], m->len[g->first_crc + k]);
	return c;
}

/* A codec region goes to disk as its frames, as they are: never decoded and
 * re-encoded, so a lossy snapshot is quantized once. */
static void frames_of(const struct snap_manifest *m, const struct snap_man_region *g, const uint8_t *base,
		      const void **frame, uint64_t *len, struct snap_io_region *o)
{
	for (uint32_t k = 0; k < g->nchunks; k++) {
		struct snap_chunk c;
		snap_layout_chunk(&m->layout, g->first_crc + k, &c);
		frame[k] = base + c.slot_off;
		len[k] = m->len[g->first_crc + k];
	}
	o->nframes = g->nchunks;
	o->frame_elems = m->layout.chunk_size / snap_dtype_size(g->dtype);
	o->frame = frame;
	o->frame_len = len;
	o->frame_crc = m->crc + g->first_crc;
}

static int write_rank(const char *dir, struct snap_flusher *f, struct flush_req *q, const struct flush_rank *fr)
{
	const struct snap_layout *lay = &fr->man.layout;
	const uint8_t *base;
	int rc = map_slot(fr, &base, q->err, sizeof(q->err));
	if (rc)
		return rc;
	struct snap_io_region *regs = calloc(lay->nregions ? lay->nregions : 1, sizeof(*regs));
	const void **frame = calloc(lay->ncrc ? lay->ncrc : 1, sizeof(*frame));
	uint64_t *frame_len = calloc(lay->ncrc ? lay->ncrc : 1, sizeof(*frame_len));
	if (!regs || !frame || !frame_len) {
		free(regs);
		free(frame);
		free(frame_len);
		if (base)
			munmap((void *)base, lay->slot_bytes);
		return SNAP_ENOMEM;
	}
	for (uint32_t i = 0; i < lay->nregions; i++) {
		const struct snap_man_region *g = &lay->regions[i];
		struct snap_io_region *o = &regs[i];
		o->name = g->name;
		o->dtype = g->dtype;
		o->kind = g->kind;
		o->bytes = g->bytes;
		/* The writer checks the bytes (or each frame) against the CRCs while
		 * writing them, so a bit flip in the store since commit is never
		 * persisted. */
		if (g->codec != SNAP_CODEC_NONE) {
			frames_of(&fr->man, g, base, frame + g->first_crc, frame_len + g->first_crc, o);
		} else {
			o->data = base + g->offset;
			o->crc32c = region_crc(&fr->man, g);
			o->has_crc = 1;
		}
		if (g->ndim == 0) {   /* a flat tensor: one dimension, unsharded */
			o->ndim = 1;
			o->shape[0] = o->global_shape[0] = g->bytes / snap_dtype_size(g->dtype);
		} else {
			o->ndim = g->ndim;
			memcpy(o->shape, g->shape, sizeof(o->shape));
			memcpy(o->global_shape, g->global_shape, sizeof(o->global_shape));
			memcpy(o->shard_offset, g->shard_offset, sizeof(o->shard_offset));
		}
	}
	struct snap_io_err e = { 0 };
	struct snap_io_write_stats st = { 0 };
	rc = snap_io_write_rank(f->writer, dir, q->job, q->step, fr->man.rank, q->world, regs, lay->nregions, &st,
				&e);
	if (rc)
		snap_fmt(q->err, sizeof(q->err), "%s", e.msg);
	q->bytes += st.raw_bytes;
	q->direct += rc == 0 && st.direct;
	free(regs);
	free(frame);
	free(frame_len);
	if (base)
		munmap((void *)base, lay->slot_bytes);
	return rc;
}

static void run(struct snap_flusher *f, struct flush_req *q)
{
	uint64_t t0 = snap_now_ns();
	struct snap_io_err e = { 0 };
	q->rc = 0;
	const char *dir = q->part_dir[0] ? q->part_dir : f->dir;
	if (q->part_dir[0]) {
		/* Here, not when queued: an earlier try of this step may still be
		 * ahead of this one in the queue, and would seal after it. */
		int w = snap_io_part_withdraw(dir, q->job, q->step, &e);
		if (w < 0) {
			q->rc = w;
			snap_fmt(q->err, sizeof(q->err), "%s", e.msg);
		}
		q->withdrawn = w > 0;
	}
	for (uint32_t r = 0; r < q->nranks && !q->rc; r++)
		q->rc = write_rank(dir, f, q, &q->ranks[r]);
	if (!q->rc && q->part_dir[0] && q->nranks) {
		uint32_t *ranks = malloc(q->nranks * sizeof(*ranks));
		for (uint32_t r = 0; ranks && r < q->nranks; r++)
			ranks[r] = q->ranks[r].man.rank;
		if (!ranks)
			q->rc = SNAP_ENOMEM;
		else if ((q->rc = snap_io_part_seal(dir, q->job, q->step, q->world, ranks, q->nranks, &e)))
			snap_fmt(q->err, sizeof(q->err), "sealing this node's part: %s", e.msg);
		free(ranks);
	}
	if (!q->rc && !q->node_only && (q->rc = snap_io_step_seal(f->dir, q->job, q->step, q->world, &e)))
		snap_fmt(q->err, sizeof(q->err), "%s", e.msg);
	if (!q->rc && !q->node_only && snap_io_retain(f->dir, q->job, f->keep, &e) < 0)
		snap_fmt(q->err, sizeof(q->err), "persisted, but retention failed: %s", e.msg);
	q->seconds = (snap_now_ns() - t0) / 1e9;
}

static void *thread_main(void *arg)
{
	struct snap_flusher *f = arg;
	pthread_mutex_lock(&f->mu);
	for (;;) {
		struct flush_req *q = f->todo;
		if (!q) {
			if (f->stop)
				break;
			pthread_cond_wait(&f->cv, &f->mu);
			continue;
		}
		f->todo = q->next;
		pthread_mutex_unlock(&f->mu);
		run(f, q);
		pthread_mutex_lock(&f->mu);
		q->next = f->done;
		f->done = q;
		/* A full (non-blocking) pipe already wakes the loop: a lost byte is harmless. */
		char b = 1;
		ssize_t n = write(f->pipe[1], &b, 1);
		(void)n;
	}
	pthread_mutex_unlock(&f->mu);
	return NULL;
}

int snap_flusher_start(struct snap_flusher **fp, const struct snap_smp_config *cfg, char *err, size_t errlen)
{
	struct snap_flusher *f = calloc(1, sizeof(*f));
	if (!f)
		return SNAP_ENOMEM;
	struct snap_io_opts o = { .codec = cfg->flush_codec ? SNAP_IO_CODEC_LZ4 : SNAP_IO_CODEC_NONE,
				  .mode = cfg->flush_mode, .flags = cfg->flush_direct ? 0 : SNAP_IO_NO_DIRECT };
	struct snap_io_err e = { 0 };
	f->writer = snap_io_writer_new(&o, &e);
	if (!f->writer || pipe2(f->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		snap_fmt(err, errlen, "cannot start the flush writer: %s", f->writer ? strerror(errno) : e.msg);
		snap_io_writer_free(f->writer);
		free(f);
		return SNAP_EIO;
	}
	snprintf(f->dir, sizeof(f->dir), "%s", cfg->flush_dir);
	f->keep = cfg->flush_keep ? cfg->flush_keep : 1;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	if (pthread_create(&f->thread, NULL, thread_main, f) != 0) {
		snap_fmt(err, errlen, "cannot start the flush thread");
		close(f->pipe[0]);
		close(f->pipe[1]);
		snap_io_writer_free(f->writer);
		free(f);
		return SNAP_EIO;
	}
	*fp = f;
	return 0;
}

void snap_flusher_submit(struct snap_flusher *f, struct flush_req *req)
{
	pthread_mutex_lock(&f->mu);
	req->next = NULL;
	struct flush_req **pp = &f->todo;
	while (*pp)
		pp = &(*pp)->next;
	*pp = req;
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

int snap_flusher_fd(const struct snap_flusher *f)
{
	return f->pipe[0];
}

struct flush_req *snap_flusher_done(struct snap_flusher *f)
{
	char b[64];
	while (read(f->pipe[0], b, sizeof(b)) > 0)
		;
	pthread_mutex_lock(&f->mu);
	struct flush_req *q = f->done;
	if (q)
		f->done = q->next;
	pthread_mutex_unlock(&f->mu);
	return q;
}

void snap_flusher_stop(struct snap_flusher *f)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	f->stop = 1;
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
	pthread_join(f->thread, NULL);
	for (struct flush_req *q; (q = f->done);) {
		f->done = q->next;
		snap_flush_req_free(q);
	}
	close(f->pipe[0]);
	close(f->pipe[1]);
	snap_io_writer_free(f->writer);
	pthread_mutex_destroy(&f->mu);
	pthread_cond_destroy(&f->cv);
	free(f);
}
