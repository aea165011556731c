/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * smp_internal.h - the daemon's state (struct smp, struct conn), shared by
 * daemon.c and requests.c with persist.c and files.c; requests.c's and
 * persist.c's functions.
 *
 * Layers of snapsmp: a file calls only into files of lower layers (and its
 * own layer where the arrow says so); nothing calls upward, so there are no
 * call loops. Types (this header, mesh_int.h) are shared across layers.
 *
 *   8  main.c                   flags -> config, --ec, snap_smp_serve
 *   7  daemon.c                 poll loop, connections, signals, shutdown
 *   6  requests.c export.c scrub.c
 *                               the trainers' requests and their dispatch;
 *                               the store's state as metrics (--metrics-file);
 *                               the background scrub of the store
 *   5  mesh.c meshscrub.c       MPI start/stop, agreement rounds, mesh thread;
 *                               the scrub's mesh part (parity first, parity
 *                               pieces)
 *   4  persist.c meshflush.c filereq.c repair.c meshheal.c
 *                               flush policy (-> flush.c); the mesh's flush
 *                               of a protected step across nodes; captured
 *                               files' requests; a damaged slot repaired
 *                               from the flush (-> rehydrate.c); repair from
 *                               the mesh's parity while serving (-> recover.c)
 *   3  flush.c files.c rehydrate.c protect.c recover.c meshcap.c
 *                               flush thread, captured files (open, close,
 *                               hooks), restore from disk, encode a step,
 *                               relaunch rebuild, captured files across the mesh
 *   2  meshrec.c capgen.c filescan.c fileflush.c
 *                               the relaunch's gathered records; a captured-
 *                               files generation on disk; captured files'
 *                               start-up scan and flush thread
 *   1  log.c reply.c meshutil.c meshmap.c config.c fileent.c
 *                               (meshmap: slot files kept mapped; fileent:
 *                               a job's captured-file entries)
 *   0  store.c slots.c reserve.c meshfiles.c metrics.c   (libraries
 *                               snapstore, snapmeshfiles; reserve: slot
 *                               files reserved by a thread; metrics:
 *                               histograms, counters, the file's writer
 *                               thread, recorded into from every layer)
 *
 * So requests.c answers requests and logs through log.c/reply.c, which
 * persist.c and files.c use too; mesh.c calls protect.c and recover.c, and
 * what those share with it (job entries, abort) lives in meshutil.c.
 */
#ifndef SNAP_SMP_INTERNAL_H
#define SNAP_SMP_INTERNAL_H

#include <stdint.h>

#include "snap/buf.h"
#include "snap/smp_config.h"
#include "flush.h"
#include "snap/base.h"
#include "log.h"
#include "repair.h"
#include "reply.h"
#include "snap/store.h"

#define SMP_ERRLEN 768

struct fjob;
struct smp_scrub;
struct smp_mesh_scrub;
struct snap_files;

struct conn {
	int fd;
	uint8_t *buf;
	size_t len, cap;
	struct store_job *job;
	struct store_rank *rank;
	uint32_t pid;
	int dead;
	uint64_t restore_ticket;       /* mesh: RESTORE of the newest step waits for a fresh view */
	/* mesh: a REPAIR waiting for the repair from parity (meshheal.c): its
	 * ticket, step, and per rank of the job the bad chunks found before */
	uint64_t heal_ticket, heal_step;
	uint32_t *heal_bad, heal_n;
	uint64_t pinned;               /* bytes of its slots the trainer pinned (CUDA), as of its last COMMIT */
	uint64_t acquire_ns;           /* its last ACQUIRE (--metrics-file: the save's duration) */
	/* a FLUSH request waiting for its step to be persisted */
	int waiting;
	char wait_job[SNAP_JOB_MAX + 1];
	uint64_t wait_step;
	struct fjob *fjob;             /* captured files (files.c): the job FATTACH named */
	struct conn *next;
};

struct smp {
	const struct snap_smp_config *cfg;
	struct snap_store *store;
	struct snap_flusher *flusher;  /* NULL without SNAP_FLUSH_DIR */
	int lfd, sigfd;
	struct conn *conns;
	unsigned nconns;
	struct smp_log log;            /* --quiet; node -1: the mesh prefixes its own lines */
	int draining;                  /* SIGTERM seen: finish flushes, then exit */
	int drain_asked;               /* a signal from another process is part of the drain */
	struct snap_mesh *mesh;        /* --ec: NULL without a mesh */
	struct snap_files *files;      /* captured files (files.c) */
	uint64_t last_mesh_tick_ns;    /* mesh: when --flush-interval last asked the mesh to flush */
	/* --metrics-file (export.c): when the store was last read, the file last formatted */
	uint64_t metrics_read_ns, metrics_write_ns;
	double metrics_start_s;        /* the daemon's start, seconds since the epoch */
	struct smp_heal heal;          /* repairs and scrubs so far (repair.c, scrub.c) */
	struct smp_scrub *scrub;       /* the background scrub (scrub.c); NULL: off */
	struct smp_mesh_scrub *mscrub; /* its mesh part (meshscrub.c); NULL until used */
};

/* An INFO line of the daemon (silenced by --quiet). */
#define smp_say(m, ...) smp_logf(&(m)->log, SMP_LOG_INFO, __VA_ARGS__)

/* ---- requests.c: the trainers' requests ---- */

struct snap_msg_hdr;
/* Handles one complete request of c (header h, its payload) and replies. */
void smp_dispatch(struct smp *m, struct conn *c, const struct snap_msg_hdr *h, const uint8_t *payload);
/* Closes c: its rank is free for a new connection; c is reaped later. */
void smp_close_conn(struct smp *m, struct conn *c);

/* ---- persist.c: when to flush, and what to tell who asked ---- */

/* After a commit: count new restorable steps, flush every F-th. */
void persist_on_commit(struct smp *m, struct store_job *j);
/* Flush `step` (SNAP_STEP_LATEST: the newest restorable) of j now or after the current flush. */
int persist_request(struct smp *m, struct store_job *j, uint64_t step, char *err, size_t errlen);
/* SIGUSR1 / SIGTERM: flush the newest restorable step of every job. */
void persist_all(struct smp *m, const char *why);
/* The interval timer: milliseconds until the next check (-1: none). */
int persist_timeout_ms(struct smp *m);
void persist_tick(struct smp *m);
/* Finished flushes: unpin, record, answer waiters, start queued ones. */
void persist_collect(struct smp *m);
/* A FLUSH message (allowed without HELLO). */
int persist_on_flush_msg(struct smp *m, struct conn *c, struct snap_rbuf *r, char *err, int *deferred);
/* Mesh: the mesh thread changed flush state (snap_mesh_fd readable):
 * answer FLUSH waiters whose step is persisted or failed. */
void persist_mesh_update(struct smp *m);
/* Flushes still running or queued (mesh: also one wanted or agreed and not sealed). */
int persist_busy(const struct smp *m);

/* ---- export.c: --metrics-file ---- */

/* [mesh lock held] Read the store's gauges (once a second) and hand the
 * file's text to the metrics writer (every --metrics-interval seconds). */
void smp_export_tick(struct smp *m);
/* The poll timeout with the metrics' once-a-second reading (-1: none). */
int smp_export_timeout_ms(const struct smp *m, int timeout);

#endif
