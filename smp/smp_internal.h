/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * smp_internal.h - the daemon's state (struct smp, struct conn), shared by
 * daemon.c and requests.c with the subsystems that act on a connection or
 * on the whole daemon (flush/persist.c, files/, heal/, gauges.c); the
 * prototypes of requests.c and gauges.c. Which folder may call which is in
 * README.md beside this file (and checked by tests/unit/check_smp_layers.py).
 */
#ifndef SNAP_SMP_INTERNAL_H
#define SNAP_SMP_INTERNAL_H

#include <stdint.h>

#include "snap/buf.h"
#include "snap/smp_config.h"
#include "flush/flush.h"
#include "snap/base.h"
#include "base/log.h"
#include "heal/repair.h"
#include "base/reply.h"
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
	/* mesh: restored step `provisional_step` while the relaunch's rebuild
	 * ran (snap_mesh_restore_check decides whether its saves may go on) */
	int provisional;
	uint64_t provisional_step;
	/* mesh: a REPAIR waiting for the repair from parity (meshheal.c): its
	 * ticket, step, and per rank of the job the bad chunks found before */
	uint64_t heal_ticket, heal_step;
	uint32_t *heal_bad, heal_n;
	uint64_t pinned;               /* bytes of its slots the trainer pinned (CUDA), as of its last COMMIT */
	/* each slot's last ACQUIRE (--metrics-file: the save's duration), per
	 * slot because a client acquires its next slot while the previous
	 * save's COMMIT is still on its way (up to 64 slots, SNAP_SLOTS) */
	uint64_t acquire_ns[64];
	/* a FLUSH request waiting for its step to be persisted */
	int waiting;
	char wait_job[SNAP_JOB_MAX + 1];
	uint64_t wait_step;
	struct fjob *fjob;             /* captured files (files/): the job FATTACH named */
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
	struct snap_files *files;      /* captured files (files/) */
	uint64_t last_mesh_tick_ns;    /* mesh: when --flush-interval last asked the mesh to flush */
	/* --metrics-file (gauges.c): when the store was last read, the file last formatted */
	uint64_t metrics_read_ns, metrics_write_ns;
	double metrics_start_s;        /* the daemon's start, seconds since the epoch */
	struct smp_heal heal;          /* repairs and scrubs so far (heal/) */
	struct smp_scrub *scrub;       /* the background scrub (heal/scrub.c); NULL: off */
	struct smp_mesh_scrub *mscrub; /* its mesh part (heal/meshscrub.c); NULL until used */
};

/* An INFO line of the daemon (silenced by --quiet). */
#define smp_say(m, ...) smp_logf(&(m)->log, SMP_LOG_INFO, __VA_ARGS__)

/* ---- requests.c: the trainers' requests ---- */

struct snap_msg_hdr;
/* Handles one complete request of c (header h, its payload) and replies. */
void smp_dispatch(struct smp *m, struct conn *c, const struct snap_msg_hdr *h, const uint8_t *payload);
/* Closes c: its rank is free for a new connection; c is reaped later. */
void smp_close_conn(struct smp *m, struct conn *c);

/* ---- gauges.c: --metrics-file ---- */

/* [mesh lock held] Read the store's gauges (once a second) and hand the
 * file's text to the metrics writer (every --metrics-interval seconds). */
void smp_export_tick(struct smp *m);
/* The poll timeout with the metrics' once-a-second reading (-1: none). */
int smp_export_timeout_ms(const struct smp *m, int timeout);

#endif
