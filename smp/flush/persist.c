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
#include "base/metrics.h"
#include "smp_internal.h"
#include "flush/persist.h"
#include "snap/wire.h"

/* Flush a step every rank of which this node holds (no mesh). */
static int start(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen)
{
	struct flush_req *q;
	int rc = flush_req_build(m->store, j, step, 0, &q, err, errlen);
	if (rc)
		return rc;
	j->flushing = 1;
	j->flush_step = step;
	j->since_flush = 0;
	j->last_flush_ns = snap_now_ns();
	smp_say(m, "flushing step %" PRIu64 " of job %s to %s", step, j->name, m->cfg->flush_dir);
	snap_flusher_submit(m->flusher, q);
	return 0;
}

/*
 * In a mesh the nodes flush together (meshflush.c): a request here only
 * asks the next agreement round for a flush of the newest protected step of
 * every job. The flag is the store's, read by the mesh thread under the lock.
 */
static void mesh_want(struct smp *m)
{
	m->store->mesh_flush_wanted = 1;
}

int persist_request(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen)
{
	if (!m->flusher) {
		snap_fmt(err, errlen, "snapsmp runs without a flush directory (SNAP_FLUSH_DIR / --flush-dir)");
		return SNAP_EUNSUPPORTED;
	}
	if (m->mesh) {
		if (step != SNAP_STEP_LATEST) {
			snap_fmt(err, errlen, "in an --ec mesh the nodes flush the newest protected step together; "
				 "a flush of step %" PRIu64 " alone is not supported (ask for the latest)", step);
			return SNAP_EUNSUPPORTED;
		}
		mesh_want(m);
		return 0;
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
	if (m->mesh)   /* the mesh counts protected steps itself (--flush-every) */
		return;
	if (snap_store_latest(m->store, j, &latest) != 0 || (j->has_seen && latest <= j->seen))
		return;
	j->has_seen = 1;
	j->seen = latest;
	smp_say(m, "step %" PRIu64 " of job %s restorable: every rank of %u committed it", latest, j->name, j->world);
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
	if (m->mesh) {
		smp_say(m, "%s: asking the mesh to flush the newest protected step of every job", why);
		mesh_want(m);
		return;
	}
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

/* How this node's rank files of a flush reached the disk (--flush-direct). */
static const char *how_written(const struct flush_req *q)
{
	if (!q->nranks)
		return "";
	return q->direct == q->nranks ? ", O_DIRECT" : q->direct ? ", O_DIRECT for some rank files"
								: ", through the page cache";
}

void persist_tick(struct smp *m)
{
	if (!m->flusher || !m->cfg->flush_interval)
		return;
	uint64_t now = snap_now_ns(), period = (uint64_t)m->cfg->flush_interval * 1000000000ull;
	if (m->mesh) {
		if (now - m->last_mesh_tick_ns >= period) {
			m->last_mesh_tick_ns = now;
			mesh_want(m);
		}
		return;
	}
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
		flush_req_unpin(m->store, q);
		struct store_job *j = snap_store_job(m->store, q->job, 0);
		if (q->node_only) {
			/* This node's part of a mesh flush: the next round reports it. */
			if (q->withdrawn)
				smp_say(m, "withdrew this node's earlier part of step %" PRIu64 " of job %s from %s (an "
				    "earlier try, or incarnation, sealed it)", q->step, q->job, q->part_dir);
			if (q->rc == 0 && q->nranks)
				smp_say(m, "wrote %u rank file(s) of step %" PRIu64 " of job %s%s: %.1f MiB in %.2f s%s", q->nranks,
				    q->step, q->job, q->part_dir[0] ? " and sealed them as this node's part" : "",
				    q->bytes / 1048576.0, q->seconds, how_written(q));
			else if (q->rc)
				smp_say(m, "flush of this node's ranks of step %" PRIu64 " of job %s failed: %s", q->step, q->job,
				    q->err);
			if (j && j->mfl_step == q->step && j->mfl_try == q->try_no) {
				j->mfl_state = q->rc ? 2 : 1;
				j->mfl_ranks = q->rc ? 0 : q->nranks;
				j->mfl_bytes = q->bytes;
				snap_fmt(j->mfl_msg, sizeof(j->mfl_msg), "%s", q->rc ? q->err : "");
			}
			if (j)
				j->flushing = 0;
			snap_flush_req_free(q);
			continue;
		}
		if (q->rc == 0) {
			smp_say(m, "persisted step %" PRIu64 " of job %s: %.1f MiB in %.2f s (%.2f GB/s)%s%s%s", q->step,
			    q->job, q->bytes / 1048576.0, q->seconds, q->seconds > 0 ? q->bytes / q->seconds / 1e9 : 0.0,
			    how_written(q), q->err[0] ? "; " : "", q->err);
			smp_metrics_observe(SMP_HIST_FLUSH, q->job, q->seconds);
			if (j && (!j->has_persisted || q->step > j->persisted)) {
				j->has_persisted = 1;
				j->persisted = q->step;
			}
		} else {
			smp_say(m, "flush of step %" PRIu64 " of job %s failed: %s", q->step, q->job, q->err);
			smp_metrics_count(SMP_CNT_FLUSH_FAILED, q->job);
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
	uint64_t asked = step;
	if (step == SNAP_STEP_LATEST && snap_store_latest(m->store, j, &step) != 0) {
		snap_fmt(err, SMP_ERRLEN, "job %s has no restorable step to flush", job);
		return SNAP_ENOENT;
	}
	/* A mesh flushes its newest protected step, which catches up with the
	 * newest complete one: the waiter is answered once that is persisted. */
	int rc = persist_request(m, j, m->mesh ? asked : step, err, SMP_ERRLEN);
	if (rc || !wait)
		return rc;
	if (j->has_persisted && (m->mesh ? j->persisted >= step : j->persisted == step) &&
	    !(j->flushing && j->flush_step == step))
		return 0;
	c->waiting = 1;
	snprintf(c->wait_job, sizeof(c->wait_job), "%s", job);
	c->wait_step = step;
	*deferred = 1;
	return 0;
}

void persist_mesh_update(struct smp *m)
{
	for (struct conn *c = m->conns; c; c = c->next) {
		struct store_job *j = c->dead || !c->waiting ? NULL : snap_store_job(m->store, c->wait_job, 0);
		if (!j)
			continue;
		if (j->has_persisted && j->persisted >= c->wait_step) {
			c->waiting = 0;
			struct snap_wbuf w = { 0 };
			snap_put_u64(&w, j->persisted);
			snap_put_u64(&w, j->mfl_bytes);
			snap_put_u64(&w, j->mfl_ns);
			smp_reply_ok(c->fd, SNAP_MSG_FLUSH, &w, -1);
			snap_wbuf_free(&w);
		} else if (j->mfl_failed && j->mfl_failed_step >= c->wait_step) {
			c->waiting = 0;
			smp_reply_err(c->fd, SNAP_MSG_FLUSH, SNAP_EIO, j->mfl_msg);
		} else if (!j->mfl_busy && !m->store->mesh_stopped) {
			mesh_want(m);   /* the protected step had not caught up yet: again */
		}
	}
}

int persist_busy(const struct smp *m)
{
	if (m->mesh) {
		/* Until the mesh thread is gone a drain waits for the mesh's flush. */
		const struct snap_store *s = m->store;
		if (s->mesh_stopped)
			return 0;
		if (s->mesh_flush_wanted || s->mesh_flush_taken)
			return 1;
		for (const struct store_job *j = s->jobs; j; j = j->next)
			if (j->mfl_busy || j->flushing)
				return 1;
		return 0;
	}
	for (const struct store_job *j = m->store->jobs; j; j = j->next)
		if (j->flushing || j->want_latest || j->want_step_set)
			return 1;
	return 0;
}
