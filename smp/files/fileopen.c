/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Captured files in the node store, daemon side: open and close, and the
 * daemon's hooks (the flush thread's results, closed connections, flush
 * everything now). See files.h and docs/design/captured-files.md
 * (LD_PRELOAD); files_int.h says which file holds what.
 */
#include "files/files_int.h"

int snap_files_open(struct snap_files **fp, struct snap_store *store, const struct snap_smp_config *cfg,
		    char *err, size_t errlen)
{
	*fp = NULL;
	struct snap_files *f = calloc(1, sizeof(*f));
	if (!f)
		return SNAP_ENOMEM;
	f->store = store;
	f->cfg = cfg;
	f->pipe[0] = f->pipe[1] = -1;
	pthread_mutex_init(&f->mu, NULL);
	pthread_cond_init(&f->cv, NULL);
	if (pipe2(f->pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
		snap_fmt(err, errlen, "pipe: %s", strerror(errno));
		snap_files_close(f);
		return SNAP_EIO;
	}
	DIR *d = opendir(store->root);
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char p[SNAP_FILE_MAX];
		struct stat st;
		if (!snap_job_name_ok(de->d_name) ||
		    snprintf(p, sizeof(p), "%s/%s/files", store->root, de->d_name) >= (int)sizeof(p) ||
		    lstat(p, &st) != 0 || !S_ISDIR(st.st_mode))
			continue;
		files_load_job(f, de->d_name, 0);
	}
	if (d)
		closedir(d);
	f->last_id = f->last_id > files_wall_ns() ? f->last_id : files_wall_ns();
	if ((errno = pthread_create(&f->th, NULL, files_flusher, f)) != 0) {
		snap_fmt(err, errlen, "cannot start the captured-file flush thread: %s", strerror(errno));
		snap_files_close(f);
		return SNAP_EIO;
	}
	f->started = 1;
	*fp = f;
	return 0;
}

void snap_files_close(struct snap_files *f)
{
	if (!f)
		return;
	if (f->started) {
		pthread_mutex_lock(&f->mu);
		f->stop = 1;
		pthread_cond_signal(&f->cv);
		pthread_mutex_unlock(&f->mu);
		pthread_join(f->th, NULL);
	}
	while (f->jobs) {
		struct fjob *j = f->jobs;
		f->jobs = j->next;
		files_free_job(j);
	}
	while (f->waiters) {
		struct conn_wait *w = f->waiters;
		f->waiters = w->next;
		free(w);
	}
	if (f->pipe[0] >= 0)
		close(f->pipe[0]);
	if (f->pipe[1] >= 0)
		close(f->pipe[1]);
	pthread_cond_destroy(&f->cv);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

int snap_files_fd(const struct snap_files *f)
{
	return f ? f->pipe[0] : -1;
}

/* Files of job j (all jobs: NULL) still to flush in this round: dirty and not failed, or being flushed. */
int files_pending(struct snap_files *f, struct fjob *only)
{
	int n = 0;
	for (struct fjob *j = f->jobs; j; j = j->next)
		for (struct fent *e = only && j != only ? NULL : j->head; e; e = e->next)
			n += e->state == F_FLUSHING || (e->state == F_DIRTY && !e->failed);
	return n;
}

static void reply_flush(struct conn *c, struct snap_files *f, struct fjob *j)
{
	struct snap_wbuf w = { 0 };
	uint64_t left = 0, failed = 0;
	for (struct fent *e = j->head; e; e = e->next) {
		left += e->state != F_CLEAN;
		failed += e->state == F_DIRTY && e->failed;
	}
	(void)f;
	snap_put_u64(&w, left);
	snap_put_u64(&w, failed);
	smp_reply_ok(c->fd, SNAP_MSG_FFLUSH, &w, -1);
	snap_wbuf_free(&w);
}

void snap_files_collect(struct smp *m)
{
	struct snap_files *f = m->files;
	char b[256];
	while (read(f->pipe[0], b, sizeof(b)) > 0) {
	}
	pthread_mutex_lock(&f->mu);
	for (struct conn_wait **pp = &f->waiters; *pp;) {
		struct conn_wait *w = *pp;
		if (!w->c->dead && (w->j->urgent || files_pending(f, w->j))) {
			pp = &w->next;
			continue;
		}
		if (!w->c->dead)
			reply_flush(w->c, f, w->j);
		*pp = w->next;
		free(w);
	}
	pthread_mutex_unlock(&f->mu);
}

void snap_files_conn_closed(struct snap_files *f, struct conn *c)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	for (struct fjob *j = f->jobs; j; j = j->next)
		for (struct fwip *w = j->wip, *n; w; w = n) {
			n = w->next;
			if (w->owner == c)
				files_drop_wip(f, j, w, 1);
		}
	for (struct conn_wait **pp = &f->waiters; *pp;) {
		struct conn_wait *w = *pp;
		if (w->c == c) {
			*pp = w->next;
			free(w);
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&f->mu);
}

void files_urge(struct fjob *j)
{
	for (struct fent *e = j->head; e; e = e->next)
		e->failed = e->tries = 0;
	j->urgent = 1;
}

void snap_files_flush_all(struct snap_files *f, const char *why)
{
	if (!f)
		return;
	pthread_mutex_lock(&f->mu);
	int n = files_pending(f, NULL), failed = 0;
	for (struct fjob *j = f->jobs; j; j = j->next) {
		for (struct fent *e = j->head; e; e = e->next)
			failed += e->state == F_DIRTY && e->failed;
		files_urge(j);
	}
	if (n + failed)
		snap_store_logf(f->store, "%s: flushing %d captured files now", why, n + failed);
	pthread_cond_signal(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

int snap_files_busy(struct snap_files *f)
{
	if (!f)
		return 0;
	pthread_mutex_lock(&f->mu);
	int n = files_pending(f, NULL);
	for (struct fjob *j = f->jobs; j; j = j->next)
		n += j->urgent;
	pthread_mutex_unlock(&f->mu);
	return n;
}
