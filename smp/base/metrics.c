/* SPDX-License-Identifier: BSD-3-Clause */
/* snapsmp's histograms, counters and metrics-file writer; see metrics.h. */
#include "base/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "snap/base.h"
#include "snap/types.h"

/* Seconds: a commit takes microseconds, a flush of a large model minutes. */
static const double bounds[] = { 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
				 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 600 };
#define NB (sizeof(bounds) / sizeof(bounds[0]))

struct hist {
	uint64_t le[NB];   /* not cumulative here; summed when written */
	uint64_t count;
	double sum;
};

struct mjobm {
	char name[SNAP_JOB_MAX + 1];
	struct hist h[SMP_HIST_N];
	uint64_t cnt[SMP_CNT_N];
	struct {
		int has;
		uint64_t step, since;
	} seen[4];
	struct mjobm *next;
};

static const struct {
	const char *name, *help;
} hist_names[SMP_HIST_N] = {
	{ "libsnap_save_duration_seconds", "From a rank's ACQUIRE of a slot to its COMMIT reaching the daemon (the copy)." },
	{ "libsnap_commit_duration_seconds", "The daemon's handling of a COMMIT: verify, manifest write and rename." },
	{ "libsnap_protect_duration_seconds", "One erasure-coding of a step across the mesh, until every node agreed." },
	{ "libsnap_flush_duration_seconds", "One flush of a step to HDF5 that succeeded (mesh: agreement to seal)." },
};

static const struct {
	const char *name, *help;
	int per_job;
} cnt_names[SMP_CNT_N] = {
	{ "libsnap_flush_failures_total", "Flushes of a step to HDF5 that failed.", 1 },
	{ "libsnap_protect_failures_total", "Erasure-codings of a step that did not protect it.", 1 },
	{ "libsnap_rebuilt_chunks_total", "Chunks rebuilt from parity when the mesh started (lost or corrupt here).", 1 },
	{ "libsnap_rejected_connections_total", "Connections refused: another uid, or too many.", 0 },
	{ "libsnap_request_errors_total", "Trainer and snaptool requests answered with an error.", 0 },
	{ "libsnap_log_warnings_total", "Log lines at warn: something refused, lost or damaged.", 0 },
	{ "libsnap_log_errors_total", "Log lines at error: fatal for the daemon.", 0 },
	{ "libsnap_slots_precreated_total", "Slot files reserved at REGISTER, ahead of the save that takes them.", 1 },
	{ "libsnap_slots_reused_total", "Slot files a REGISTER found in place at the layout's size (a relaunch).", 1 },
	{ "libsnap_slots_late_total", "Saves that had to reserve (or finish reserving) their slot file themselves.", 1 },
	{ "libsnap_slots_prefaulted_total", "Slot files mapped and faulted in ahead of their first protect.", 1 },
	{ "libsnap_slot_maps_warm_total", "Protects that first read a slot through a mapping faulted in ahead.", 1 },
	{ "libsnap_slot_maps_cold_total", "Protects that had to map a slot file themselves.", 1 },
	{ "libsnap_parity_precreated_total", "Parity files created and faulted in ahead of the first protects.", 1 },
	{ "libsnap_parity_warm_total", "Protects that wrote into a pre-created parity file or the spare.", 1 },
	{ "libsnap_parity_cold_total", "Protects that had to create their parity file.", 1 },
};

static atomic_int on;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct mjobm *jobs;            /* [mu] */
static uint64_t node_cnt[SMP_CNT_N];  /* [mu] */
static char node_name[256];
static int mesh_rank = -1;
/* the writer thread */
static pthread_t thr;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static char *pending;                 /* [mu] text waiting to be written */
static size_t pending_len;
static int stopping;                  /* [mu] */
static char path[SNAP_PATH_MAX + 8], tmp[SNAP_PATH_MAX + 16];
static char werr[SNAP_PATH_MAX + 128];  /* [mu] the writer's last failure, until taken */
static int werr_new;                  /* [mu] */
static int werr_was;                  /* writer: the last write failed (say it once) */

int smp_metrics_on(void)
{
	return atomic_load_explicit(&on, memory_order_relaxed);
}

/* [mu] The job's entry, created when new; NULL when out of memory. */
static struct mjobm *job_entry(const char *job)
{
	for (struct mjobm *j = jobs; j; j = j->next)
		if (!strcmp(j->name, job))
			return j;
	struct mjobm *j = calloc(1, sizeof(*j));
	if (!j)
		return NULL;
	snprintf(j->name, sizeof(j->name), "%s", job);
	/* name order, so the file reads the same from one write to the next */
	struct mjobm **pp = &jobs;
	while (*pp && strcmp((*pp)->name, job) < 0)
		pp = &(*pp)->next;
	j->next = *pp;
	*pp = j;
	return j;
}

void smp_metrics_observe(enum smp_hist h, const char *job, double seconds)
{
	if (!smp_metrics_on() || (unsigned)h >= SMP_HIST_N || !job)
		return;
	unsigned b = 0;
	while (b < NB && seconds > bounds[b])
		b++;
	pthread_mutex_lock(&mu);
	struct mjobm *j = smp_metrics_on() ? job_entry(job) : NULL;
	if (j) {
		if (b < NB)
			j->h[h].le[b]++;
		j->h[h].count++;
		j->h[h].sum += seconds;
	}
	pthread_mutex_unlock(&mu);
}

void smp_metrics_add(enum smp_counter c, const char *job, uint64_t n)
{
	if (!smp_metrics_on() || (unsigned)c >= SMP_CNT_N)
		return;
	pthread_mutex_lock(&mu);
	if (!smp_metrics_on()) {
		/* stopped meanwhile: the table is gone */
	} else if (cnt_names[c].per_job) {
		struct mjobm *j = job ? job_entry(job) : NULL;
		if (j)
			j->cnt[c] += n;
	} else {
		node_cnt[c] += n;
	}
	pthread_mutex_unlock(&mu);
}

void smp_metrics_count(enum smp_counter c, const char *job)
{
	smp_metrics_add(c, job, 1);
}

uint64_t smp_metrics_since(const char *job, int kind, uint64_t step, uint64_t now)
{
	if (kind < 0 || kind > 3)
		return now;
	pthread_mutex_lock(&mu);
	struct mjobm *j = smp_metrics_on() ? job_entry(job) : NULL;
	uint64_t t = now;
	if (j) {
		if (!j->seen[kind].has || j->seen[kind].step != step) {
			j->seen[kind].has = 1;
			j->seen[kind].step = step;
			j->seen[kind].since = now;
		}
		t = j->seen[kind].since;
	}
	pthread_mutex_unlock(&mu);
	return t;
}

/* ---- the exposition --------------------------------------------------- */

void smp_text_printf(struct smp_text *t, const char *fmt, ...)
{
	for (int tries = 0; tries < 2 && !t->oom; tries++) {
		va_list ap;
		va_start(ap, fmt);
		int n = vsnprintf(t->buf ? t->buf + t->len : NULL, t->buf ? t->cap - t->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			t->oom = 1;
			return;
		}
		if (t->buf && t->len + (size_t)n < t->cap) {
			t->len += (size_t)n;
			return;
		}
		size_t cap = t->cap ? t->cap : 4096;
		while (cap <= t->len + (size_t)n)
			cap *= 2;
		char *p = realloc(t->buf, cap);
		if (!p) {
			t->oom = 1;
			return;
		}
		t->buf = p;
		t->cap = cap;
	}
}

/* A label value with \, " and newline escaped, as the format asks. */
static void put_value(struct smp_text *t, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			smp_text_printf(t, "\\%c", *v);
		else if (*v == '\n')
			smp_text_printf(t, "\\n");
		else
			smp_text_printf(t, "%c", *v);
	}
}

void smp_text_labels(struct smp_text *t, const char *job)
{
	if (job) {
		smp_text_printf(t, "job=\"");
		put_value(t, job);
		smp_text_printf(t, "\",");
	}
	smp_text_printf(t, "node=\"");
	put_value(t, node_name);
	smp_text_printf(t, "\"");
	if (mesh_rank >= 0)
		smp_text_printf(t, ",mesh_node=\"%d\"", mesh_rank);
}

static void format_hist(struct smp_text *t, int h)
{
	smp_text_printf(t, "# HELP %s %s\n# TYPE %s histogram\n", hist_names[h].name, hist_names[h].help,
			hist_names[h].name);
	for (struct mjobm *j = jobs; j; j = j->next) {
		uint64_t cum = 0;
		for (unsigned b = 0; b < NB; b++) {
			cum += j->h[h].le[b];
			smp_text_printf(t, "%s_bucket{", hist_names[h].name);
			smp_text_labels(t, j->name);
			smp_text_printf(t, ",le=\"%g\"} %llu\n", bounds[b], (unsigned long long)cum);
		}
		smp_text_printf(t, "%s_bucket{", hist_names[h].name);
		smp_text_labels(t, j->name);
		smp_text_printf(t, ",le=\"+Inf\"} %llu\n%s_sum{", (unsigned long long)j->h[h].count, hist_names[h].name);
		smp_text_labels(t, j->name);
		smp_text_printf(t, "} %.9g\n%s_count{", j->h[h].sum, hist_names[h].name);
		smp_text_labels(t, j->name);
		smp_text_printf(t, "} %llu\n", (unsigned long long)j->h[h].count);
	}
}

void smp_metrics_format(struct smp_text *t)
{
	pthread_mutex_lock(&mu);
	/* Without a mesh nothing is protected: no series says otherwise. */
	for (int h = 0; h < SMP_HIST_N; h++)
		if (h != SMP_HIST_PROTECT || mesh_rank >= 0)
			format_hist(t, h);
	for (int c = 0; c < SMP_CNT_N; c++) {
		if ((c == SMP_CNT_PROTECT_FAILED || c == SMP_CNT_REBUILT_CHUNKS ||
		     (c >= SMP_CNT_SLOTS_PREFAULTED && c <= SMP_CNT_PARITY_COLD)) && mesh_rank < 0)
			continue;
		smp_text_printf(t, "# HELP %s %s\n# TYPE %s counter\n", cnt_names[c].name, cnt_names[c].help,
				cnt_names[c].name);
		if (!cnt_names[c].per_job) {
			smp_text_printf(t, "%s{", cnt_names[c].name);
			smp_text_labels(t, NULL);
			smp_text_printf(t, "} %llu\n", (unsigned long long)node_cnt[c]);
			continue;
		}
		for (struct mjobm *j = jobs; j; j = j->next) {
			smp_text_printf(t, "%s{", cnt_names[c].name);
			smp_text_labels(t, j->name);
			smp_text_printf(t, "} %llu\n", (unsigned long long)j->cnt[c]);
		}
	}
	pthread_mutex_unlock(&mu);
}

void smp_metrics_publish(struct smp_text *t)
{
	if (!smp_metrics_on() || t->oom) {
		free(t->buf);
		*t = (struct smp_text){ 0 };
		return;
	}
	pthread_mutex_lock(&mu);
	free(pending);
	pending = t->buf;
	pending_len = t->len;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	*t = (struct smp_text){ 0 };
}

/* The writer logs nothing itself (the log counts its lines here): the
 * poll loop takes the message (smp_metrics_take_error) and logs it. */
static void fail(const char *what)
{
	int e = errno;
	if (werr_was)
		return;
	werr_was = 1;
	pthread_mutex_lock(&mu);
	snprintf(werr, sizeof(werr), "cannot write the metrics file %s: %s", what, strerror(e));
	werr_new = 1;
	pthread_mutex_unlock(&mu);
}

int smp_metrics_take_error(char *err, size_t errlen)
{
	pthread_mutex_lock(&mu);
	int n = werr_new;
	if (n)
		snprintf(err, errlen, "%s", werr);
	werr_new = 0;
	pthread_mutex_unlock(&mu);
	return n;
}

/* PATH.tmp, then rename: the collector never reads half a file. The file
 * is 0644: node_exporter commonly runs as a user of its own. */
static void write_file(const char *text, size_t len)
{
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		fail(tmp);
		return;
	}
	size_t off = 0;
	while (off < len) {
		ssize_t n = write(fd, text + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		off += (size_t)n;
	}
	int bad = off < len;
	if (fchmod(fd, 0644) != 0 || close(fd) != 0)
		bad = 1;
	if (bad || rename(tmp, path) != 0) {
		fail(path);
		unlink(tmp);
		return;
	}
	werr_was = 0;
}

static void *writer(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (!pending && !stopping)
			pthread_cond_wait(&cv, &mu);
		if (!pending)
			break;
		char *text = pending;
		size_t len = pending_len;
		pending = NULL;
		pthread_mutex_unlock(&mu);
		write_file(text, len);
		free(text);
		pthread_mutex_lock(&mu);
	}
	pthread_mutex_unlock(&mu);
	return NULL;
}

int smp_metrics_start(const char *file, const char *node, int mesh_node, char *err, size_t errlen)
{
	if (snprintf(path, sizeof(path), "%s", file) >= (int)sizeof(path) ||
	    snprintf(tmp, sizeof(tmp), "%s.tmp", file) >= (int)sizeof(tmp)) {
		snap_fmt(err, errlen, "metrics file path %s is too long", file);
		return SNAP_EINVAL;
	}
	snprintf(node_name, sizeof(node_name), "%s", node);
	mesh_rank = mesh_node;
	stopping = 0;   /* a process may serve again after a stop (tests) */
	werr_new = werr_was = 0;
	/* Fail at start, not silently in the writer: the directory must take it. */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		snap_fmt(err, errlen, "--metrics-file (SNAP_METRICS_FILE): cannot write %s: %s", tmp, strerror(errno));
		return SNAP_EIO;
	}
	close(fd);
	unlink(tmp);
	int rc = pthread_create(&thr, NULL, writer, NULL);
	if (rc) {
		snap_fmt(err, errlen, "cannot start the metrics writer: %s", strerror(rc));
		return SNAP_ENOMEM;
	}
	atomic_store(&on, 1);
	return 0;
}

void smp_metrics_stop(void)
{
	if (!smp_metrics_on())
		return;
	atomic_store(&on, 0);
	pthread_mutex_lock(&mu);
	stopping = 1;
	free(pending);
	pending = NULL;
	pthread_cond_signal(&cv);
	pthread_mutex_unlock(&mu);
	pthread_join(thr, NULL);
	unlink(path);
	pthread_mutex_lock(&mu);
	while (jobs) {
		struct mjobm *j = jobs;
		jobs = j->next;
		free(j);
	}
	memset(node_cnt, 0, sizeof(node_cnt));
	pthread_mutex_unlock(&mu);
}
