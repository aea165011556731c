/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The read side of the client: the newest restorable step, restore (verify
 * every chunk, then copy; or verify each as it is copied), and flush
 * requests. See snap/snap.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "client.h"
#include "snap/wire.h"

int snap_latest(snap_ctx *ctx, uint64_t *step)
{
	if (!ctx)
		return SNAP_EINVAL;
	if (!step)
		return snap_fail(ctx, SNAP_EINVAL, "latest: NULL step pointer");
	int rc = snap_ensure_connected(ctx);
	if (rc)
		return rc;
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	rc = snap_roundtrip(ctx, ctx->err, SNAP_MSG_LATEST, NULL, &rep, &rlen, NULL, "latest");
	pthread_mutex_unlock(&ctx->sock_mu);
	if (rc)
		return rc;
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, rlen);
	*step = snap_get_u64(&r);
	free(rep);
	return r.bad ? snap_fail(ctx, SNAP_EPROTO, "latest: malformed reply") : 0;
}

/*
 * Where restore reads a slot from. A slot this process already maps for its
 * saves is read through that mapping. Otherwise (a relaunched trainer) a
 * slot of raw host regions is read with pread(): a fresh mapping costs a
 * page-table entry per 4 KiB to build and to tear down, and on a virtual
 * machine a hypervisor fault on the first touch of every page, which made
 * restore 5-10x slower than memcpy. The kernel copies from the page cache
 * through its own mapping instead. Codec frames and CUDA regions take their
 * source as one pointer, so a fresh mapping still serves those.
 */

/* pread exactly n bytes at off: 0, or an errno (EIO: the file is shorter). */
static int read_full(int fd, uint8_t *buf, size_t n, uint64_t off)
{
	while (n > 0) {
		ssize_t k = pread(fd, buf, n, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return errno;
		if (k == 0)
			return EIO;
		buf += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

static void read_failed(snap_ctx *ctx, uint32_t t, int err)
{
	pthread_mutex_lock(&ctx->mu);
	if (!ctx->rio) {
		ctx->rio = err;
		ctx->rio_chunk = t;
	}
	pthread_mutex_unlock(&ctx->mu);
}

/* [mu not held] The lowest bad chunk wins, whichever thread finds it. */
static void mark(snap_ctx *ctx, uint32_t *first, uint32_t t)
{
	pthread_mutex_lock(&ctx->mu);
	if (!*first || t + 1 < *first)
		*first = t + 1;
	pthread_mutex_unlock(&ctx->mu);
}

/* With crc, fold len bytes at src into *crc; with dst, copy them there too,
 * a block at a time so that the copy reads what the CRC just brought into
 * L2: one pass over memory for both. */
static void crc_copy(uint8_t *dst, const uint8_t *src, uint64_t len, uint32_t *crc)
{
	for (uint64_t done = 0; done < len; done += SUBBLOCK) {
		size_t k = len - done < SUBBLOCK ? (size_t)(len - done) : SUBBLOCK;
		if (crc)
			*crc = snap_crc32c_update(*crc, src + done, k);
		if (dst)
			snap_copy_stream(dst + done, src + done, k);
	}
}

/*
 * The first len stored bytes of chunk t, read through a bounce block that
 * stays in L2: with crc, their CRC32C into *crc; with dst, copied into dst
 * with non-temporal stores (pread() straight into dst copies with rep
 * movsb, 2-3x slower when dst is not aligned like the slot; see
 * common/src/copy.c). Even into a dst aligned like the slot, pread()
 * straight into it was slower (1 GiB over 2 ranks, 64-byte aligned buffers:
 * 0.176-0.187 s against 0.157-0.167 s through the bounce block): the
 * kernel's stores read every destination line first, the non-temporal ones
 * do not. 0 if they could not be read.
 */
static int read_through(snap_ctx *ctx, uint32_t t, const struct snap_chunk *c, uint64_t len, uint8_t *dst,
			uint32_t *crc)
{
	/* At most copy_threads tasks run at once, one bounce block each. */
	pthread_mutex_lock(&ctx->mu);
	uint8_t *b = ctx->rbounce[--ctx->nrbounce];
	pthread_mutex_unlock(&ctx->mu);
	int err = 0;
	if (crc)
		*crc = 0;
	for (uint64_t done = 0; done < len && !err; done += SUBBLOCK) {
		size_t k = len - done < SUBBLOCK ? (size_t)(len - done) : SUBBLOCK;
		if ((err = read_full(ctx->rfd, b, k, c->slot_off + done)))
			break;
		crc_copy(dst ? dst + done : NULL, b, k, crc);
	}
	pthread_mutex_lock(&ctx->mu);
	ctx->rbounce[ctx->nrbounce++] = b;
	pthread_mutex_unlock(&ctx->mu);
	if (err)
		read_failed(ctx, t, err);
	return !err;
}

/* Phase 0: is chunk t intact? Its CRC, and for a frame, a header that
 * promises exactly the chunk's values (so phase 1 cannot overrun). */
static int chunk_ok(snap_ctx *ctx, uint32_t t, const struct snap_chunk *c)
{
	const struct snap_manifest *man = ctx->rman;
	if (!ctx->rbase) {   /* raw host regions only: no header to check */
		uint32_t crc;   /* a failed read is reported as such (rio), not as a bad CRC */
		return !read_through(ctx, t, c, man->len[t], NULL, &crc) || crc == man->crc[t];
	}
	const uint8_t *src = ctx->rbase + c->slot_off;
	if (snap_crc32c(src, man->len[t]) != man->crc[t])
		return 0;
	if (c->g->codec == SNAP_CODEC_NONE)
		return 1;
	struct snap_codec_info info;
	return snap_codec_inspect(src, man->len[t], &info) == 0 && info.dtype == c->g->dtype &&
	       info.count == c->raw_len / snap_dtype_size(c->g->dtype);
}

/*
 * A relaunched trainer restores into buffers it has just allocated and never
 * touched; the copy then faults them in a page at a time, each fault a trap
 * (to the hypervisor too, on a VM). MADV_POPULATE_WRITE faults the chunk's
 * pages in one call: `snapbench snapshot`'s "fresh buffers" restore of 1 GiB
 * over 2 ranks took 0.54-0.62 s with it, 0.64-0.84 s without, on the
 * development VM.
 * Memory already touched would pay a page-table walk for nothing (~0.05 s
 * per GiB), so a chunk whose first page is resident is left alone, and a
 * restore through the saving process's own mapping (whose buffers the saves
 * read) does not even ask (ctx->rfresh). Best effort: a mapping that refuses
 * it (EFAULT, ENOMEM, a VM_IO mapping's EINVAL) is left to the copy, which
 * faults the pages as before. A kernel before 5.14 answers EINVAL to the
 * advice itself; one zero-length probe finds that once, so such a kernel is
 * not asked per chunk, and a mapping's EINVAL does not turn it off for the
 * process. No touch-per-page fallback: it would take the same faults, on
 * the same copy thread, just before the copy would.
 */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14; headers may be older than the kernel */
#endif
static _Atomic int populate_ok; /* 0 unknown, 1 the kernel has it, -1 not */

static void populate(uint8_t *dst, uint64_t len)
{
	uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t a = ((uintptr_t)dst + page - 1) & ~(page - 1), e = ((uintptr_t)dst + len) & ~(page - 1);
	unsigned char resident = 0;
	if (e <= a || populate_ok < 0 || (mincore((void *)a, page, &resident) == 0 && (resident & 1)))
		return;
	int saved = errno;
	if (populate_ok == 0)
		/* The advice is checked before the range, and a zero length is
		 * then done: EINVAL here means only "unknown advice". */
		populate_ok = madvise((void *)a, 0, MADV_POPULATE_WRITE) == 0 ? 1 : -1;
	if (populate_ok > 0)
		(void)madvise((void *)a, e - a, MADV_POPULATE_WRITE);
	errno = saved;
}

static void restore_task(void *arg, uint32_t t)
{
	snap_ctx *ctx = arg;
	const struct snap_manifest *man = ctx->rman;
	struct snap_chunk c;
	snap_layout_chunk(&man->layout, t, &c);
	if (ctx->rphase == 0) {
		if (!chunk_ok(ctx, t, &c))
			mark(ctx, &ctx->rbad, t);
		return;
	}
	/* Copy into the registered region of the same name. */
	for (uint32_t i = 0; i < ctx->nregs; i++) {
		if (strcmp(ctx->regs[i].name, c.g->name) != 0)
			continue;
		uint8_t *dst = (uint8_t *)ctx->regs[i].ptr + c.raw_off;
		if (ctx->rfresh && ctx->regs[i].device != SNAP_DEVICE_CUDA)
			populate(dst, c.raw_len);
		/* Inline, raw host bytes are checked in the pass that copies them;
		 * a frame or a device copy is checked first (its header too), then
		 * decoded or copied while the chunk is still in cache. */
		int fused = ctx->rinline && c.g->codec == SNAP_CODEC_NONE && ctx->regs[i].device != SNAP_DEVICE_CUDA;
		uint32_t crc = 0;
		if (!ctx->rbase) {
			if (read_through(ctx, t, &c, c.raw_len, dst, fused ? &crc : NULL) && fused && crc != man->crc[t])
				mark(ctx, &ctx->rbad, t);
			return;
		}
		const uint8_t *src = ctx->rbase + c.slot_off;
		if (ctx->rinline && !fused && !chunk_ok(ctx, t, &c)) {
			mark(ctx, &ctx->rbad, t);
		} else if (ctx->regs[i].device == SNAP_DEVICE_CUDA) {
			snap_gpu_restore_chunk(ctx, dst, src, man->len[t], &c);
		} else if (c.g->codec == SNAP_CODEC_NONE) {
			crc_copy(dst, src, c.raw_len, fused ? &crc : NULL);
			if (fused && crc != man->crc[t])
				mark(ctx, &ctx->rbad, t);
		} else if (snap_codec_decompress(src, man->len[t], dst, c.raw_len, NULL) != 0) {
			/* Only a frame written wrong yet CRC-consistent gets here. */
			mark(ctx, &ctx->rdecode, t);
		}
		return;
	}
}

static void restore_done(void *arg)
{
	snap_ctx *ctx = arg;
	pthread_mutex_lock(&ctx->mu);
	ctx->rdone = 1;
	pthread_cond_broadcast(&ctx->cv);
	pthread_mutex_unlock(&ctx->mu);
}

static void run_restore_phase(snap_ctx *ctx, int phase)
{
	ctx->rphase = phase;
	ctx->rdone = 0;
	snap_pool_submit(ctx->pool, ctx->rman->layout.ncrc, restore_task, restore_done, ctx);
	pthread_mutex_lock(&ctx->mu);
	while (!ctx->rdone)
		pthread_cond_wait(&ctx->cv, &ctx->mu);
	pthread_mutex_unlock(&ctx->mu);
}

/*
 * RESTORE `step`: the manifest (and the slot's descriptor) snapsmp picked.
 * EBUSY means a slot is being read, or (mesh) the daemons are agreeing on
 * the newest step; both pass within an encode or an agreement round, so it
 * is retried until timeout_ms.
 */
/* A newer step snapsmp's SNAP_STEP_LATEST passed over (the RESTORE reply's
 * note after the manifest), SNAP_STEP_LATEST when none. */
struct restore_note {
	uint64_t over;
	char why[SNAP_CLIENT_ERRLEN];
};

/* Split the reply: the manifest (its header says its length) and the note. */
static int split_note(snap_ctx *ctx, const void *rep, uint32_t *rlen, struct restore_note *note, const char *what)
{
	note->over = SNAP_STEP_LATEST;
	note->why[0] = 0;
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, *rlen);
	(void)snap_get_bytes(&r, 16);   /* magic, version, CRC */
	uint64_t total = snap_get_u64(&r);
	if (r.bad || total >= *rlen)
		return 0;   /* no note (a short or bad manifest: the decode says what is wrong) */
	snap_rbuf_init(&r, (const uint8_t *)rep + total, *rlen - (uint32_t)total);
	note->over = snap_get_u64(&r);
	snap_get_str(&r, note->why, sizeof(note->why));
	if (r.bad || snap_rbuf_left(&r) || note->over == SNAP_STEP_LATEST)
		return snap_fail(ctx, SNAP_EPROTO, "%s: malformed RESTORE reply (%u bytes after the manifest)", what,
				 *rlen - (uint32_t)total);
	*rlen = (uint32_t)total;
	return 0;
}

static int ask_restore(snap_ctx *ctx, uint64_t step, void **rep, uint32_t *rlen, int *fd, struct restore_note *note,
		       const char *what)
{
	struct snap_wbuf w = { 0 };
	snap_put_u64(&w, step);
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	long delay_us = 1000;
	int rc;
	for (;;) {
		pthread_mutex_lock(&ctx->sock_mu);
		rc = snap_roundtrip(ctx, ctx->err, SNAP_MSG_RESTORE, &w, rep, rlen, fd, what);
		pthread_mutex_unlock(&ctx->sock_mu);
		if (rc != SNAP_EBUSY || snap_now_ns() >= deadline)
			break;
		struct timespec ts = { 0, delay_us * 1000L };
		nanosleep(&ts, NULL);
		/* an agreement round is every 20 ms: ask again within one */
		delay_us = delay_us < 16000 ? delay_us * 2 : delay_us;
	}
	snap_wbuf_free(&w);
	if (rc == 0 && (rc = split_note(ctx, *rep, rlen, note, what))) {
		free(*rep);
		*rep = NULL;
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
	}
	return rc;
}

/* The mapping this process made of the slot for its saves, if fd is that
 * file (a relaunched process, or a slot snapsmp rebuilt, has none). */
static const uint8_t *saved_map(const snap_ctx *ctx, uint32_t slot, const struct stat *st)
{
	if (slot >= ctx->nmaps)
		return NULL;
	const struct slot_map *m = &ctx->maps[slot];
	if (m->base && m->dev == st->st_dev && m->ino == st->st_ino && m->size == (uint64_t)st->st_size)
		return m->base;
	return NULL;
}

/*
 * Can the slot be read with pread() (see above)? Raw host regions only, and
 * not from a store on huge pages: there a fresh mapping costs next to
 * nothing (a page-table entry per 2 MiB: MAP_POPULATE and munmap of 1 GiB
 * took 0.001 s on the development VM, against 0.2-0.28 s with 4 KiB pages),
 * and reading through it saves the kernel's copy into the bounce block.
 */
static int by_read(snap_ctx *ctx, const struct snap_manifest *man)
{
	if (ctx->rhuge < 0) {
		char how[160];
		ctx->rhuge = snap_store_hugepages(ctx->cfg.store, how, sizeof(how)) == 1;
	}
	if (ctx->rhuge)
		return 0;
	for (uint32_t i = 0; i < man->layout.nregions; i++)
		if (man->layout.regions[i].codec != SNAP_CODEC_NONE)
			return 0;
	for (uint32_t i = 0; i < ctx->nregs; i++)
		if (ctx->regs[i].device == SNAP_DEVICE_CUDA)
			return 0;
	return 1;
}

static void free_bounce(snap_ctx *ctx)
{
	for (unsigned i = 0; i < ctx->nrbounce; i++)
		free(ctx->rbounce[i]);
	free(ctx->rbounce);
	ctx->rbounce = NULL;
	ctx->nrbounce = 0;
}

static int alloc_bounce(snap_ctx *ctx)
{
	unsigned n = ctx->cfg.copy_threads ? ctx->cfg.copy_threads : 1;
	if (!(ctx->rbounce = calloc(n, sizeof(*ctx->rbounce))))
		return SNAP_ENOMEM;
	for (; ctx->nrbounce < n; ctx->nrbounce++)
		if (!(ctx->rbounce[ctx->nrbounce] = aligned_alloc(4096, SUBBLOCK)))
			return SNAP_ENOMEM;
	return 0;
}

/*
 * One restore of `step` as snapsmp hands it over. *tried: the step of the
 * manifest, once one came (else left alone); *touched: set once a
 * registered byte was written, by this pass or (as given) an earlier one.
 */
static int restore_once(snap_ctx *ctx, uint64_t step, uint64_t *restored, uint64_t *tried, int *touched,
			struct restore_note *note)
{
	void *rep;
	uint32_t rlen;
	int fd = -1;
	int rc = ask_restore(ctx, step, &rep, &rlen, &fd, note, "restore");
	if (rc)
		return rc;
	struct snap_manifest man;
	char merr[256];
	rc = snap_manifest_decode(rep, rlen, &man, merr, sizeof(merr));
	free(rep);
	if (rc) {
		if (fd >= 0)
			close(fd);
		return snap_fail(ctx, rc, "restore: manifest from snapsmp is invalid: %s", merr);
	}
	*tried = man.step;
	char where[160];
	snprintf(where, sizeof(where), "restore of step %" PRIu64 " (job %s, rank %u)", man.step, man.job, man.rank);
	struct stat st;
	const uint8_t *base = NULL;
	uint8_t *mapped = MAP_FAILED;   /* a mapping of our own, unmapped at the end */
	int saved = 0;                  /* read through the mapping our saves made */
	if (fd < 0) {
		rc = snap_fail(ctx, SNAP_EPROTO, "%s: snapsmp passed no slot file", where);
	} else if (strcmp(man.job, ctx->cfg.job) != 0 || man.rank != (uint32_t)ctx->cfg.rank) {
		rc = snap_fail(ctx, SNAP_EPROTO, "%s: snapsmp sent the snapshot of another job or rank", where);
	} else if ((rc = snap_layout_compare(&man.layout, &ctx->layout, merr, sizeof(merr)))) {
		snap_fail(ctx, rc, "%s: %s", where, merr);
	} else if (fstat(fd, &st) != 0 || (uint64_t)st.st_size < man.layout.slot_bytes) {
		rc = snap_fail(ctx, SNAP_ECORRUPT, "%s: slot file %u is truncated (%" PRIu64 " of %" PRIu64 " bytes)", where,
			  man.slot, (uint64_t)st.st_size, man.layout.slot_bytes);
	} else if ((saved = (base = saved_map(ctx, man.slot, &st)) != NULL) || !man.layout.slot_bytes) {
		/* read through the save mapping (or nothing to read) */
	} else if (by_read(ctx, &man)) {
		if ((rc = alloc_bounce(ctx)))
			snap_fail(ctx, rc, "%s: out of memory", where);
	} else if ((mapped = mmap(NULL, man.layout.slot_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0)) ==
		   MAP_FAILED) {
		rc = snap_fail(ctx, SNAP_EIO, "%s: mmap: %s", where, strerror(errno));
	} else {
		base = mapped;
	}
	if (!rc) {
		ctx->rman = &man;
		ctx->rbase = base;
		ctx->rfresh = !saved;
		ctx->rfd = fd;
		ctx->rbad = 0;
		ctx->rdecode = 0;
		ctx->rgpu = 0;
		ctx->rio = 0;
		/* FIRST: phase 0 checks every chunk, phase 1 copies. INLINE: phase 1
		 * alone, checking each chunk as it copies it. */
		int mode = ctx->cfg.restore_verify;
		ctx->rinline = mode == SNAP_VERIFY_INLINE || (mode == SNAP_VERIFY_AUTO && !ctx->have_last_step);
		int copied = 0;
		if (ctx->rinline || (run_restore_phase(ctx, 0), !ctx->rio && !ctx->rbad))
			run_restore_phase(ctx, 1), copied = 1;
		*touched |= copied;
		const char *mem = *touched ? "registered memory is partly overwritten" : "registered memory left untouched";
		const char *how = ctx->rinline ? " (checked as it was copied: restore_verify inline, or auto in a context "
						 "that had neither saved nor restored)" : "";
		if (ctx->rgpu) {
			rc = snap_fail(ctx, ctx->rgpu, "%s: copy to the GPU failed: %s; %s", where, ctx->rgpu_msg, mem);
		} else if (ctx->rio) {
			rc = snap_fail(ctx, SNAP_EIO, "%s: reading chunk %u of slot %u: %s; %s", where, ctx->rio_chunk,
				  man.slot, strerror(ctx->rio), mem);
		} else if (ctx->rbad) {
			struct snap_chunk c;
			snap_layout_chunk(&man.layout, ctx->rbad - 1, &c);
			rc = snap_fail(ctx, SNAP_ECORRUPT, "%s: region \"%s\" chunk %u (bytes %" PRIu64 "+%" PRIu64
				  ") fails its CRC32C%s check in slot %u; %s%s", where, c.g->name, c.index, c.raw_off,
				  c.raw_len, c.g->codec != SNAP_CODEC_NONE ? " or codec header" : "", man.slot, mem, how);
		} else if (ctx->rdecode) {
			struct snap_chunk c;
			snap_layout_chunk(&man.layout, ctx->rdecode - 1, &c);
			rc = snap_fail(ctx, SNAP_ECORRUPT, "%s: region \"%s\" chunk %u has a valid CRC32C but does not "
				  "decode; %s", where, c.g->name, c.index, mem);
		} else {
			if (restored)
				*restored = man.step;
			/* The next save continues from here (see the timeline rule in slots.c). */
			ctx->last_step = man.step;
			ctx->have_last_step = 1;
		}
		ctx->rman = NULL;
		ctx->rbase = NULL;
		ctx->rfd = -1;
	}
	free_bounce(ctx);
	if (fd >= 0)
		close(fd);
	if (mapped != MAP_FAILED)
		munmap(mapped, man.layout.slot_bytes);
	snap_manifest_free(&man);
	return rc;
}

/* What snapsmp's REPAIR did to one step of this rank (smp/heal/repair.c). */
struct repair_reply {
	uint64_t step;
	uint32_t bad, repaired, withdrawn, mended;
	char how[SNAP_CLIENT_ERRLEN];
};

/* Ask snapsmp to verify `step` of this rank and repair it from the other levels. */
static int ask_repair(snap_ctx *ctx, uint64_t step, struct repair_reply *rr)
{
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, ctx->cfg.job);
	snap_put_u32(&w, (uint32_t)ctx->cfg.rank);
	snap_put_u64(&w, step);
	void *rep = NULL;
	uint32_t rlen;
	char err[SNAP_CLIENT_ERRLEN];
	/* EBUSY: on a mesh the daemons decode the bad chunks from parity in
	 * their next agreement round (every 20 ms); ask again until timeout_ms. */
	uint64_t deadline = snap_now_ns() + (uint64_t)ctx->cfg.timeout_ms * 1000000ull;
	long delay_us = 1000;
	int rc;
	for (;;) {
		pthread_mutex_lock(&ctx->sock_mu);
		rc = snap_roundtrip(ctx, err, SNAP_MSG_REPAIR, &w, &rep, &rlen, NULL, "repair");
		pthread_mutex_unlock(&ctx->sock_mu);
		if (rc != SNAP_EBUSY || snap_now_ns() >= deadline)
			break;
		struct timespec ts = { 0, delay_us * 1000L };
		nanosleep(&ts, NULL);
		delay_us = delay_us < 16000 ? delay_us * 2 : delay_us;
	}
	snap_wbuf_free(&w);
	if (rc) {
		snprintf(rr->how, sizeof(rr->how), "%s", err);
		return rc;
	}
	struct snap_rbuf r;
	snap_rbuf_init(&r, rep, rlen);
	rr->step = snap_get_u64(&r);
	(void)snap_get_u32(&r);   /* ranks checked: this one */
	rr->bad = snap_get_u32(&r);
	rr->repaired = snap_get_u32(&r);
	rr->withdrawn = snap_get_u32(&r);
	rr->mended = snap_get_u32(&r);
	snap_get_str(&r, rr->how, sizeof(rr->how));
	free(rep);
	if (r.bad) {
		snprintf(rr->how, sizeof(rr->how), "malformed REPAIR reply");
		return SNAP_EPROTO;
	}
	return 0;
}

/*
 * A restore that heals: a chunk that fails its check makes snapsmp verify
 * the step and rewrite the bad chunks from the next level that holds them
 * (the flush), and the step is read again whole, so every registered byte
 * is written by the one pass that succeeds. A step no level holds intact is
 * withdrawn by snapsmp; SNAP_STEP_LATEST then means the next older step that
 * restores, an explicit step a clear error. What happened is the context's
 * message after a success too (snap_errmsg).
 */
int snap_restore(snap_ctx *ctx, uint64_t step, uint64_t *restored)
{
	if (!ctx)
		return SNAP_EINVAL;
	int rc = snap_wait(ctx);
	if (rc)
		return rc;
	if ((rc = snap_freeze(ctx)) || (rc = snap_ensure_connected(ctx)))
		return rc;
	uint64_t want = step, got = 0, repaired_step = 0, newest_bad = SNAP_STEP_LATEST, over = SNAP_STEP_LATEST;
	int have_repaired = 0, reread = 0;
	uint64_t reread_step = 0;
	uint32_t repaired = 0;
	int touched = 0;
	char note[SNAP_CLIENT_ERRLEN] = "", first[SNAP_CLIENT_ERRLEN] = "", over_why[SNAP_CLIENT_ERRLEN] = "";
	/* Each withdrawal removes a step, each repair is tried once a step. */
	for (unsigned tries = 0;; tries++) {
		uint64_t tried = want;
		ctx->err[0] = 0;
		struct restore_note rn = { SNAP_STEP_LATEST, "" };
		rc = restore_once(ctx, want, &got, &tried, &touched, &rn);
		if (rn.over != SNAP_STEP_LATEST && over == SNAP_STEP_LATEST) {
			/* The newest step snapsmp passed over before this loop met any. */
			over = rn.over;
			snprintf(over_why, sizeof(over_why), "%s", rn.why);
		}
		if (rc == 0)
			break;
		char why[SNAP_CLIENT_ERRLEN];
		snprintf(why, sizeof(why), "%s", ctx->err);
		struct repair_reply rr = { 0 };
		int r2 = SNAP_ECORRUPT;
		if ((rc == SNAP_ECORRUPT || rc == SNAP_EIO) && tries < 64 && !(have_repaired && tried == repaired_step))
			r2 = ask_repair(ctx, tried, &rr);
		if (r2 == 0 && !rr.withdrawn && rr.repaired == rr.bad && (rr.bad || rr.mended)) {
			repaired += rr.repaired;
			repaired_step = want = rr.step;
			have_repaired = 1;
			snap_fmt(note, sizeof(note), "restore of step %" PRIu64 ": %s", rr.step, rr.how);
			continue;
		}
		if (r2 == 0 && !rr.bad && !rr.withdrawn && !rr.mended && rc == SNAP_ECORRUPT && !(reread && tried == reread_step)) {
			/* snapsmp finds every chunk intact: another rank's repair (a
			 * mesh decodes the whole stripe) or the scrub mended it since
			 * this read; read it again, once. */
			reread = 1;
			reread_step = want = rr.step;
			if (!repaired)
				snap_fmt(note, sizeof(note), "restore of step %" PRIu64 ": a bad chunk this restore read "
					 "was repaired meanwhile (by another rank's repair or the scrub)", rr.step);
			continue;
		}
		if (r2 == 0 && rr.withdrawn && step == SNAP_STEP_LATEST) {
			if (newest_bad == SNAP_STEP_LATEST) {
				newest_bad = rr.step;
				snap_fmt(first, sizeof(first), "step %" PRIu64 " is damaged beyond repair (%s)", rr.step,
					 rr.how);
			}
			want = SNAP_STEP_LATEST;
			continue;
		}
		if (r2 == SNAP_ENOENT && step == SNAP_STEP_LATEST) {   /* (r2 is a REPAIR's: asked) */
			/* The damaged step went while its repair waited (a mesh: another
			 * rank gave it up, and the job rewound to an older step). */
			if (newest_bad == SNAP_STEP_LATEST) {
				newest_bad = tried;
				snap_fmt(first, sizeof(first), "step %" PRIu64 " is damaged and no longer restorable (%s)",
					 tried, rr.how);
			}
			want = SNAP_STEP_LATEST;
			continue;
		}
		const char *lost = r2 == 0 && rr.bad ? "; no level holds a good copy: " : "";
		if (newest_bad == SNAP_STEP_LATEST) {
			if (!lost[0])
				return rc;   /* not damage (or nothing repair could find): as it was */
			return snap_fail(ctx, rc, "%s%s%s", why, lost, rr.how);
		}
		/* Fell back and found nothing better: the memory's state matters most. */
		return snap_fail(ctx, rc == SNAP_ENOENT ? SNAP_ECORRUPT : rc, "restore: no step restores: %s; then: %s%s%s; %s",
				 first, why, lost, lost[0] ? rr.how : "",
				 touched ? "registered memory is partly overwritten: do not use it" :
					   "registered memory left untouched");
	}
	if (restored)
		*restored = got;
	if (newest_bad != SNAP_STEP_LATEST || over != SNAP_STEP_LATEST) {
		/* over is newer than any step this loop met: it comes first */
		snap_fmt(ctx->err, sizeof(ctx->err), "restore fell back to step %" PRIu64 ": %s%s%s%s%s", got, over_why,
			 over_why[0] && first[0] ? "; " : "", first, repaired ? "; " : "", repaired ? note : "");
	} else if (repaired || reread) {
		snap_fmt(ctx->err, sizeof(ctx->err), "%s", note);
	} else {
		ctx->err[0] = 0;   /* not a retry's "waiting for an agreement round" */
	}
	return 0;
}

/* sizeof(struct snap_region_info) in 0.4, the first sized layout. */
#define SNAP_INFO_SIZE_0_4 (offsetof(struct snap_region_info, shard_offset) + SNAP_MAX_NDIM * sizeof(uint64_t))

/* One region's description, in the caller's layout: `size` bytes at out. */
static void describe_one(const struct snap_man_region *g, void *out, size_t size)
{
	struct snap_region_info o;
	memset(&o, 0, sizeof(o));
	memcpy(o.name, g->name, sizeof(o.name));
	o.bytes = g->bytes;
	o.dtype = g->dtype;
	o.kind = g->kind;
	o.device = g->device;
	o.codec = g->codec;
	o.codec_bound = g->bound;
	o.ndim = g->ndim;
	for (int d = 0; d < g->ndim; d++) {
		o.shape[d] = g->shape[d];
		o.global_shape[d] = g->global_shape[d];
		o.shard_offset[d] = g->shard_offset[d];
	}
	snap_abi_copyout(out, size, &o, sizeof(o));
}

int snap_describe_size(snap_ctx *ctx, uint64_t step, uint64_t *step_out, struct snap_region_info *regions,
		       uint32_t cap, uint32_t *nregions, size_t size)
{
	if (!ctx)
		return SNAP_EINVAL;
	if (!nregions || (cap && !regions))
		return snap_fail(ctx, SNAP_EINVAL, "describe: NULL nregions, or NULL regions with cap %u", cap);
	if (cap && size < SNAP_INFO_SIZE_0_4)
		return snap_fail(ctx, SNAP_EINVAL, "describe: struct snap_region_info size %zu is smaller than any "
				 "released layout", size);
	*nregions = 0;
	int rc = snap_ensure_connected(ctx);
	if (rc)
		return rc;
	/* The same request as a restore: snapsmp picks the step by the same
	 * rules, so what is described is what snap_restore() will get. */
	void *rep;
	uint32_t rlen;
	int fd = -1;
	struct restore_note note;
	rc = ask_restore(ctx, step, &rep, &rlen, &fd, &note, "describe");
	if (fd >= 0)
		close(fd);   /* only the manifest is wanted */
	if (rc)
		return rc;
	struct snap_manifest man;
	char merr[256];
	rc = snap_manifest_decode(rep, rlen, &man, merr, sizeof(merr));
	free(rep);
	if (rc)
		return snap_fail(ctx, rc, "describe: manifest from snapsmp is invalid: %s", merr);
	if (strcmp(man.job, ctx->cfg.job) != 0 || man.rank != (uint32_t)ctx->cfg.rank) {
		rc = snap_fail(ctx, SNAP_EPROTO, "describe of step %" PRIu64 ": snapsmp sent the snapshot of another job "
			  "or rank (%s rank %u)", man.step, man.job, man.rank);
	} else {
		const struct snap_layout *lay = &man.layout;
		for (uint32_t i = 0; i < lay->nregions && i < cap; i++)
			describe_one(&lay->regions[i], (unsigned char *)regions + (size_t)i * size, size);
		*nregions = lay->nregions;
		if (step_out)
			*step_out = man.step;
		if (note.over != SNAP_STEP_LATEST)   /* what a restore of it would say */
			snap_fmt(ctx->err, sizeof(ctx->err), "restore would fall back to step %" PRIu64 ": %s", man.step,
				 note.why);
		else
			ctx->err[0] = 0;
		if (cap < lay->nregions)
			rc = snap_fail(ctx, SNAP_EOVERFLOW, "describe of step %" PRIu64 ": it has %u regions, room for %u",
				  man.step, lay->nregions, cap);
	}
	snap_manifest_free(&man);
	return rc;
}

int snap_flush(snap_ctx *ctx, uint64_t step, int wait)
{
	if (!ctx)
		return SNAP_EINVAL;
	int rc = snap_ensure_connected(ctx);
	if (rc)
		return rc;
	struct snap_wbuf w = { 0 };
	snap_put_str(&w, ctx->cfg.job);
	snap_put_u64(&w, step);
	snap_put_u8(&w, wait ? 1 : 0);
	void *rep;
	uint32_t rlen;
	pthread_mutex_lock(&ctx->sock_mu);
	rc = snap_roundtrip(ctx, ctx->err, SNAP_MSG_FLUSH, &w, &rep, &rlen, NULL, "flush");
	pthread_mutex_unlock(&ctx->sock_mu);
	snap_wbuf_free(&w);
	free(rep);
	return rc;
}

