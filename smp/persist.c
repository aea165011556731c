/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Flush policy: which restorable step to persist and when. Every F-th new
 * restorable step (SNAP_FLUSH_EVERY), every T seconds (SNAP_FLUSH_INTERVAL),
 * on SIGUSR1 (a preemption notice) and SIGTERM, and on request (FLUSH from
 * the C API or snaptool). One flush per job at a time; requests arriving
 * meanwhile are remembered (the newest restorable step, and at most one
 * explicitly named step) and started when it ends. Flushing never blocks a
 * commit: the flush thread reads pinned slots, and retention skips them.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snap/buf.h"
#include "smp_internal.h"
#include "snap/wire.h"

static void pin(struct smp *m, struct flush_req *q, int delta)
{
	struct store_job *j = snap_store_job(m->store, q->job, 0);
	for (uint32_t r = 0; j && r < q->world; r++) {
		struct store_rank *rk = r < j->nranks ? j->ranks[r] : NULL;
		if (rk && delta > 0)
			rk->slots[q->ranks[r].slot].refs++;
		else if (rk)
			snap_store_unref(m->store, j, rk, q->ranks[r].slot);
	}
}

/* Build a self-contained request for a step every rank committed. */
static int start(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen)
{
	struct store_rank *r0 = j->nranks ? j->ranks[0] : NULL;
	struct store_slot *s0 = snap_store_find(m->store, r0, step, NULL);
	if (!s0) {
		snap_fmt(err, errlen, "job %s has no committed step %" PRIu64 " to flush", j->name, step);
		return SNAP_ENOENT;
	}
	struct flush_req *q = calloc(1, sizeof(*q));
	uint32_t world = s0->man.world;
	if (!q || !(q->ranks = calloc(world, sizeof(*q->ranks)))) {
		free(q);
		return SNAP_ENOMEM;
	}
	snprintf(q->job, sizeof(q->job), "%s", j->name);
	q->step = step;
	q->world = world;
	for (uint32_t r = 0; r < world; r++) {
		struct store_rank *rk = r < j->nranks ? j->ranks[r] : NULL;
		uint32_t slot;
		struct store_slot *sl = snap_store_find(m->store, rk, step, &slot);
		char why[128];
		if (!sl || snap_manifest_decode(sl->man_bytes, sl->man_len, &q->ranks[r].man, why, sizeof(why))) {
			snap_fmt(err, errlen, "step %" PRIu64 " of job %s is not complete: rank %u does not hold it", step,
				 j->name, r);
			q->world = r;
			snap_flush_req_free(q);
			return SNAP_ENOENT;
		}
		q->ranks[r].slot = slot;
		snap_store_path(m->store, j->name, r, slot, 0, q->ranks[r].path, sizeof(q->ranks[r].path));
	}
	pin(m, q, +1);
	j->flushing = 1;
	j->flush_step = step;
	j->since_flush = 0;
	j->last_flush_ns = snap_now_ns();
	smp_say(m, "flushing step %" PRIu64 " of job %s to %s", step, j->name, m->cfg->flush_dir);
	snap_flusher_submit(m->flusher, q);
	return 0;
}

int persist_request(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen)
{
	if (!m->flusher) {
		snap_fmt(err, errlen, "snapsmp runs without a flush directory (SNAP_FLUSH_DIR / --flush-dir)");
		return SNAP_EUNSUPPORTED;
	}
	uint64_t latest;
	if (step == SNAP_STEP_LATEST) {
		if (snap_store_latest(m->store, j, &latest) != 0) {
			snap_fmt(err, errlen, "job %s has no restorable step to flush", j->name);
			return SNAP_ENOENT;
		}
		if (j->has_persisted && j->persisted >= latest)
			return 0;
		if (j->flushing) {
			j->want_latest = 1;
			return 0;
		}
		return start(m, j, latest, err, errlen);
	}
	if (j->has_persisted && j->persisted == step)
		return 0;
	if (j->flushing) {
		if (j->flush_step == step)
			return 0;
		if (j->want_step_set && j->want_step != step) {
			snap_fmt(err, errlen, "job %s: a flush of step %" PRIu64 " is already queued; retry later", j->name,
				 j->want_step);
			return SNAP_EBUSY;
		}
		j->want_step_set = 1;
		j->want_step = step;
		return 0;
	}
	return start(m, j, step, err, errlen);
}

void persist_on_commit(struct smp *m, struct store_job *j)
{
	uint64_t latest;
	if (snap_store_latest(m->store, j, &latest) != 0 || (j->has_seen && latest <= j->seen))
		return;
	j->has_seen = 1;
	j->seen = latest;
	j->since_flush++;
	if (m->flusher && m->cfg->flush_every && j->since_flush >= m->cfg->flush_every) {
		char err[SMP_ERRLEN];
		if (persist_request(m, j, SNAP_STEP_LATEST, err, sizeof(err)))
			smp_say(m, "%s", err);
	}
}

void persist_all(struct smp *m, const char *why)
{
	if (!m->flusher)
		return;
	for (struct store_job *j = m->store->jobs; j; j = j->next) {
		char err[SMP_ERRLEN];
		uint64_t latest;
		if (snap_store_latest(m->store, j, &latest) != 0 || (j->has_persisted && j->persisted >= latest))
			continue;
		smp_say(m, "%s: flushing step %" PRIu64 " of job %s now", why, latest, j->name);
		if (persist_request(m, j, SNAP_STEP_LATEST, err, sizeof(err)))
			smp_say(m, "%s", err);
	}
}

int persist_timeout_ms(struct smp *m)
{
	return m->flusher && m->cfg->flush_interval ? 1000 : -1;
}

void persist_tick(struct smp *m)
{
	if (!m->flusher || !m->cfg->flush_interval)
		return;
	uint64_t now = snap_now_ns(), period = (uint64_t)m->cfg->flush_interval * 1000000000ull;
	for (struct store_job *j = m->store->jobs; j; j = j->next) {
		uint64_t latest;
		if (j->flushing || now - j->last_flush_ns < period || snap_store_latest(m->store, j, &latest) != 0 ||
		    (j->has_persisted && j->persisted >= latest))
			continue;
		char err[SMP_ERRLEN];
		if (persist_request(m, j, SNAP_STEP_LATEST, err, sizeof(err)))
			smp_say(m, "%s", err);
	}
}

static void answer_waiters(struct smp *m, const struct flush_req *q)
{
	for (struct conn *c = m->conns; c; c = c->next) {
		if (c->dead || !c->waiting || strcmp(c->wait_job, q->job) || c->wait_step != q->step)
			continue;
		c->waiting = 0;
		if (q->rc) {
			smp_reply_err(c->fd, SNAP_MSG_FLUSH, q->rc, q->err);
		} else {
			struct snap_wbuf w = { 0 };
			snap_put_u64(&w, q->step);
			snap_put_u64(&w, q->bytes);
			snap_put_u64(&w, (uint64_t)(q->seconds * 1e9));
			smp_reply_ok(c->fd, SNAP_MSG_FLUSH, &w, -1);
			snap_wbuf_free(&w);
		}
	}
}

void persist_collect(struct smp *m)
{
	struct flush_req *q;
	while (m->flusher && (q = snap_flusher_done(m->flusher))) {
		pin(m, q, -1);
		struct store_job *j = snap_store_job(m->store, q->job, 0);
		if (q->rc == 0) {
			smp_say(m, "persisted step %" PRIu64 " of job %s: %.1f MiB in %.2f s (%.2f GB/s)%s%s", q->step, q->job,
			    q->bytes / 1048576.0, q->seconds, q->seconds > 0 ? q->bytes / q->seconds / 1e9 : 0.0,
			    q->err[0] ? "; " : "", q->err);
			if (j && (!j->has_persisted || q->step > j->persisted)) {
				j->has_persisted = 1;
				j->persisted = q->step;
			}
		} else {
			smp_say(m, "flush of step %" PRIu64 " of job %s failed: %s", q->step, q->job, q->err);
		}
		answer_waiters(m, q);
		if (j) {
			j->flushing = 0;
			char err[SMP_ERRLEN];
			if (j->want_step_set) {
				j->want_step_set = 0;
				if (persist_request(m, j, j->want_step, err, sizeof(err)))
					smp_say(m, "%s", err);
			} else if (j->want_latest) {
				j->want_latest = 0;
				if (persist_request(m, j, SNAP_STEP_LATEST, err, sizeof(err)) && !m->draining)
					smp_say(m, "%s", err);
			}
		}
		snap_flush_req_free(q);
	}
}

int persist_on_flush_msg(struct smp *m, struct conn *c, struct snap_rbuf *r, char *err, int *deferred)
{
	char job[SNAP_JOB_MAX + 1];
	snap_get_str(r, job, sizeof(job));
	uint64_t step = snap_get_u64(r);
	uint8_t wait = snap_get_u8(r);
	*deferred = 0;
	if (r->bad || snap_rbuf_left(r) || !snap_job_name_ok(job)) {
		snap_fmt(err, SMP_ERRLEN, "malformed FLUSH");
		return SNAP_EPROTO;
	}
	struct store_job *j = snap_store_job(m->store, job, 0);
	if (!j) {
		snap_fmt(err, SMP_ERRLEN, "job %s is not in store %s", job, m->store->root);
		return SNAP_ENOENT;
	}
	if (step == SNAP_STEP_LATEST && snap_store_latest(m->store, j, &step) != 0) {
		snap_fmt(err, SMP_ERRLEN, "job %s has no restorable step to flush", job);
		return SNAP_ENOENT;
	}
	int rc = persist_request(m, j, step, err, SMP_ERRLEN);
	if (rc || !wait)
		return rc;
	if (j->has_persisted && j->persisted == step && !(j->flushing && j->flush_step == step))
		return 0;
	c->waiting = 1;
	snprintf(c->wait_job, sizeof(c->wait_job), "%s", job);
	c->wait_step = step;
	*deferred = 1;
	return 0;
}

int persist_busy(const struct smp *m)
{
	for (const struct store_job *j = m->store->jobs; j; j = j->next)
		if (j->flushing || j->want_latest || j->want_step_set)
			return 1;
	return 0;
}
