/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mesh_int.h - state shared by mesh.c, protect.c and recover.c (not an API),
 * and the helpers of meshutil.c they share. Calls go one way (see the layers
 * in smp_internal.h): mesh.c -> protect.c, recover.c -> meshutil.c.
 */
#ifndef SNAP_MESH_INT_H
#define SNAP_MESH_INT_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>

#include "snap/base.h"
#include "log.h"
#include "mesh.h"
#include "snap/meshfiles.h"
#include "snap/ec.h"

#define MESH_MAX_COMPLETE 16 /* globally complete steps remembered per job */
#define MESH_ERRLEN 1024

struct mesh_pin {
	uint32_t rank, slot;
};

/* One job as the mesh sees it. The list is identical on every node: entries
 * are created only from agreed (gathered) data, in name order. */
struct mjob {
	char name[SNAP_JOB_MAX + 1];
	int has_prot;                 /* agreed: parity of step prot on every node */
	uint64_t prot;
	struct mesh_pin *pins;        /* this node's slots of prot, refs held */
	uint32_t npins;
	int has_failed;               /* last encode attempt failed: don't retry it */
	uint64_t failed;
	uint64_t complete[MESH_MAX_COMPLETE]; /* newest first */
	unsigned ncomplete;
	int news;                     /* this round: a new incarnation rewound (1: to news_base, 2: to nothing) */
	uint64_t news_base;
	int lost;                     /* relaunch could not rebuild it */
	char lost_msg[MESH_ERRLEN];
	struct mjob *next;
};

struct snap_mesh {
	MPI_Comm world, group;
	int rank, size, k, m;
	struct snap_ec_group grp;
	struct snap_store *store;
	pthread_mutex_t mu;
	pthread_t thr;
	int thr_started;
	atomic_int stop_req;
	struct mjob *jobs;
	uint64_t rounds_started;      /* [mu] summaries taken (round numbers handed out) */
	uint64_t rounds_done;         /* [mu] the last round whose view is published */
	struct smp_log log;           /* --quiet; node = rank */
	unsigned period_ms;
};

/* ---- meshutil.c (and log.c) ---- */

/* "node N: ..." lines; errors are logged even with --quiet. */
#define mesh_say(mesh, ...) smp_logf(&(mesh)->log, SMP_LOG_INFO, __VA_ARGS__)
#define mesh_warn(mesh, ...) smp_logf(&(mesh)->log, SMP_LOG_WARN, __VA_ARGS__)
/* The job's entry, created in name order when new; NULL when out of memory. */
struct mjob *mesh_job(struct snap_mesh *mesh, const char *name);
/* snap_mesh_abort (mesh.h) is defined there too. */

/* ---- protect.c, recover.c (called by mesh.c) ---- */

/* [no lock held; collective over the mesh] Encode step g of job j across
 * every group, agree, and on success make g the job's protected step. */
int mesh_protect(struct snap_mesh *mesh, struct mjob *j, uint64_t g);
/* [lock held] Pin this node's slots of step g of job j as its protected step. */
void mesh_pin_protected(struct snap_mesh *mesh, struct mjob *j, uint64_t g);

/* [collective, before serving, store locked by the caller] relaunch rebuild. */
int mesh_recover(struct snap_mesh *mesh);

#endif
