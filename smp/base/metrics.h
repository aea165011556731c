/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * metrics.h - what snapsmp counts for --metrics-file (SNAP_METRICS_FILE):
 * duration histograms and event counters, recorded by whichever thread sees
 * the event, and a writer thread that puts the Prometheus text exposition
 * in place atomically (write PATH.tmp, rename) for node_exporter's textfile
 * collector.
 *
 * Cost: with no metrics file every call returns after one load of a flag.
 * With one, an observation is a mutex-guarded add to a small per-job table;
 * the gauges (steps, bytes) are read by the poll loop (gauges.c) once a
 * second, and the file is formatted there every --metrics-interval seconds
 * and written by the writer thread, never by the save, commit, protect or
 * flush threads.
 *
 * The table holds no pointers into the store: a job is named by its name,
 * so the mesh thread and the poll loop record into it without the store
 * lock.
 */
#ifndef SNAP_SMP_METRICS_H
#define SNAP_SMP_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* Duration histograms, per job. */
enum smp_hist {
	SMP_HIST_SAVE,     /* a rank's ACQUIRE of a slot to its COMMIT arriving */
	SMP_HIST_COMMIT,   /* the daemon's handling of a COMMIT (manifest write, rename) */
	SMP_HIST_PROTECT,  /* mesh: one successful encode and agreement of a step */
	SMP_HIST_FLUSH,    /* one successful flush of a step (mesh: agreement to seal) */
	SMP_HIST_N
};

/* Counters: per job (flushes, protects, rebuilt chunks) or per node (the
 * rest; job NULL). */
enum smp_counter {
	SMP_CNT_FLUSH_FAILED,     /* flushes of a step that failed */
	SMP_CNT_PROTECT_FAILED,   /* mesh: encodes of a step that did not protect it */
	SMP_CNT_REBUILT_CHUNKS,   /* mesh: chunks rebuilt from parity at a relaunch (lost or corrupt) */
	SMP_CNT_REJECTED,         /* connections refused (wrong uid, too many) */
	SMP_CNT_REQ_ERRORS,       /* requests answered with an error (not "busy, retry") */
	SMP_CNT_LOG_WARN,         /* log lines at warn (refused, lost, damaged) ... */
	SMP_CNT_LOG_ERROR,        /* ... and at error, whatever --log-level writes */
	/* Warm from the first step (slots.c, meshwarm.c), per job: */
	SMP_CNT_SLOTS_PRECREATED, /* slot files reserved at REGISTER, ahead of the save that takes them */
	SMP_CNT_SLOTS_REUSED,     /* slot files a REGISTER found in place at the layout's size (a relaunch) */
	SMP_CNT_SLOTS_LATE,       /* saves that had to reserve (or finish reserving) their slot file themselves */
	SMP_CNT_SLOTS_PREFAULTED, /* mesh: slot files mapped and faulted in ahead of their first protect */
	SMP_CNT_SLOT_MAPS_WARM,   /* mesh: protects that read a slot through such a mapping, first use */
	SMP_CNT_SLOT_MAPS_COLD,   /* mesh: protects that had to map a slot file themselves */
	SMP_CNT_PARITY_PRECREATED,/* mesh: parity files created and faulted in ahead of the first protects */
	SMP_CNT_PARITY_WARM,      /* mesh: protects that wrote into a pre-created parity file or the spare */
	SMP_CNT_PARITY_COLD,      /* mesh: protects that had to create their parity file */
	SMP_CNT_N
};

/* Whether metrics are on (smp_metrics_start succeeded). */
int smp_metrics_on(void);
/*
 * Start the writer thread for path (before the threads that record start).
 * node names this daemon in every series (the "node" label); mesh_node is
 * its mesh rank (a "mesh_node" label), -1 without a mesh. 0 or SNAP_EIO /
 * SNAP_ENOMEM with a message.
 */
int smp_metrics_start(const char *path, const char *node, int mesh_node, char *err, size_t errlen);
/* Stop the writer and remove the file: a daemon that stopped on purpose
 * has no state to report, and a file left behind would go on saying it had. */
void smp_metrics_stop(void);

/* Record one duration of job. */
void smp_metrics_observe(enum smp_hist h, const char *job, double seconds);
/* Count one event (job NULL for the per-node counters). */
void smp_metrics_count(enum smp_counter c, const char *job);
/* Count n events at once. */
void smp_metrics_add(enum smp_counter c, const char *job, uint64_t n);

/* The exposition under construction (gauges.c). */
struct smp_text {
	char *buf;
	size_t len, cap;
	int oom;
};
void smp_text_printf(struct smp_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The labels every series carries: job="..."(when job), node="...", mesh_node="..." */
void smp_text_labels(struct smp_text *t, const char *job);
/* Append the histograms and counters recorded so far. */
void smp_metrics_format(struct smp_text *t);
/* Hand t's text to the writer thread (takes the buffer; t is emptied). */
void smp_metrics_publish(struct smp_text *t);

/* 1 and the message when the writer failed since the last call (it says
 * so once until a write succeeds again). */
int smp_metrics_take_error(char *err, size_t errlen);

/*
 * Ages: the first time (monotonic ns) the value `step` was seen for job's
 * kind (0..3: committed, restorable, protected, persisted), remembered from
 * the previous call; now when it is new.
 */
uint64_t smp_metrics_since(const char *job, int kind, uint64_t step, uint64_t now);

#endif
