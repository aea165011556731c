/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * mesh_int.h - state shared by mesh.c, protect.c, recover.c, meshcap.c and
 * meshheal.c (not an API), and the helpers of meshutil.c and meshrec.c they
 * share. Calls go one way (see the layers in smp_internal.h): mesh.c ->
 * meshheal.c -> recover.c; mesh.c -> protect.c, recover.c, meshcap.c ->
 * meshutil.c, meshrec.c.
 */
#ifndef SNAP_MESH_INT_H
#define SNAP_MESH_INT_H

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#include "snap/base.h"
#include "base/log.h"
#include "mesh/mesh.h"
#include "store/slotmap.h"
#include "snap/meshfiles.h"
#include "snap/ec.h"

#define MESH_MAX_COMPLETE 16 /* globally complete steps remembered per job */
#define MESH_ERRLEN 1024
#define MESH_MAX_DAMAGED 16  /* copies given up remembered per job */

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
	uint64_t news_launch;         /* ... the launch it is (launch_id in mesh.c), 0: unknown */
	/* The mesh's flush of a protected step (meshflush.c). Agreed: */
	int fl_busy;                  /* 1: nodes writing their ranks' files, 2: node 0 sealing */
	uint64_t fl_step;
	uint32_t fl_world;
	int fl_want;                  /* a node asked for a flush: start one when idle */
	int fl_relaunch;              /* the relaunch rebuilt prot: flush it unless persisted (meshflush.c) */
	unsigned since_flush;         /* protected steps since the last flush began */
	int fl_counted;               /* since_flush has counted fl_last_prot */
	uint64_t fl_last_prot;
	int has_persisted;
	uint64_t persisted;
	uint64_t fl_t0;               /* here: when the flush began (for the log) */
	/* this round's fold of every node's summary */
	unsigned f_nodes, f_done;     /* nodes that have the job; of them, those done with fl_step */
	uint32_t f_ok;                /* rank files written of fl_step */
	uint32_t f_world;             /* its world size, as the nodes holding ranks of it say */
	int f_fail_node;              /* first node whose part failed, -1 none */
	int f_seal;                   /* node 0's seal of fl_step: 0 not yet, 1 sealed, 2 failed */
	int f_has_persisted;
	uint64_t f_persisted;
	/* node 0 only: its seal of seal_step, reported in every summary */
	int seal_state;               /* 0 none, 1 sealed, 2 failed */
	uint64_t seal_step;
	/* Captured files (meshcap.c). Agreed: */
	int cap_want;                 /* this round: some node's captured files changed */
	int has_cap;                  /* generation cap_gen is protected on every node */
	uint64_t cap_gen;
	uint64_t cap_seq;             /* newest generation number used or seen */
	/* here: store_job.files_ver when the last (failed) generation was taken */
	uint64_t cap_done, cap_failed;
	/* protect.c, here: the protected step's parity stays mapped; when a
	 * newer step is protected its file becomes the spare
	 * (MESH_SPARE_PARITY) that the next protect writes into, so no
	 * protect creates, clears and maps parity pages anew. */
	void *par_map, *spare_map;
	uint64_t par_len, spare_len;
	/* Self-healing from parity (meshheal.c). Here, [mu]: a repair the
	 * poll thread asked for (heal_req of step heal_req_step), taken by the
	 * next round's summary; the outcome of the last one run. Agreed: */
	int heal_req;
	uint64_t heal_req_step;
	int heal_now;                 /* this round: some node asked for a repair of prot */
	uint64_t heal_round;          /* [mu] the round whose repair gave heal_rc, heal_msg */
	uint64_t heal_step;
	int heal_rc;
	char heal_msg[MESH_ERRLEN];
	/* [mu] this node's copies given up (no level holds them intact): left
	 * out of the summaries, so the agreement no longer counts the step */
	struct mesh_given_up { uint32_t rank; uint64_t step, gen; } damaged[MESH_MAX_DAMAGED];
	unsigned ndamaged;
	int lost;                     /* relaunch could not rebuild it */
	char lost_msg[MESH_ERRLEN];
	/* The relaunch (recover.c). Agreed, from the plan: */
	int rl_plan;                  /* step rl_step is rebuilt (and verified) on every node */
	uint64_t rl_step;
	int rl_have;                  /* here: this node holds the record of rl_step */
	/* [mu] here: the view seeded with rl_step answers LATEST before the
	 * first round after the rebuild (snap_mesh_view_fresh), until a rank
	 * commits a newer step here */
	int seeded;
	unsigned char *rl_seen;       /* [mu] per pin: its rank restored or committed since the start */
	int rl_done;                  /* [mu] the rebuild of rl_step is agreed (rl_failed: it failed) */
	int rl_failed;
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
	uint64_t heal_done;           /* [mu] the last round whose repairs (meshheal.c) are done */
	struct smp_log log;           /* --quiet; node = rank */
	unsigned period_ms;
	/* --flush-dir (meshflush.c): one directory every node writes into */
	struct snap_flusher *flusher; /* this node's flush thread, NULL without --flush-dir */
	char flush_dir[SNAP_PATH_MAX];   /* shared, or the per-node pattern (%n) */
	char node_flush_dir[SNAP_PATH_MAX];/* per-node: this node's directory; else empty */
	unsigned flush_every, flush_keep;
	int efd;                      /* eventfd: flush state changed (snap_mesh_fd) */
	struct snap_slotmaps maps;    /* mesh thread: slot files kept mapped (store/slotmap.c) */
	struct mesh_warm *warm;       /* mesh thread: files made ready ahead (meshwarm.c) */
	/* The relaunch (recover.c): the rebuild the mesh thread runs before its
	 * rounds, on a node that serves meanwhile (every job's copy intact) */
	int rebuild_pending;
	uint64_t ec_counted;          /* ec bytes in mem_used before that rebuild */
	unsigned rl_left;             /* [mu] pinned ranks not yet restored/committed: the warm-up waits */
	int rl_said;                  /* mesh thread: the end of the relaunch's restores was logged */
	uint64_t rl_t0;               /* mesh thread: the first warm round after the relaunch */
};

/* ---- meshutil.c (and log.c) ---- */

/* "node N: ..." lines; errors are logged even with --quiet. */
#define mesh_say(mesh, ...) smp_logf(&(mesh)->log, SMP_LOG_INFO, __VA_ARGS__)
#define mesh_warn(mesh, ...) smp_logf(&(mesh)->log, SMP_LOG_WARN, __VA_ARGS__)
/* The job's entry, created in name order when new; NULL when out of memory. */
struct mjob *mesh_job(struct snap_mesh *mesh, const char *name);
/* snap_mesh_abort (mesh.h) is defined there too. */

/* The job's entry if the mesh has one (never creates: only agreed data do). */
struct mjob *mesh_job_find(struct snap_mesh *mesh, const char *name);
/* relaunch.c, [lock held]: before serving, the view seeded with each
 * planned job's relaunch step; the relaunch's restores the warm-up waits for. */
void mesh_seed_view(struct snap_mesh *mesh);
void mesh_hold_warm(struct snap_mesh *mesh);
/* relaunch.c: after the plan (and a rebuild done here), before the first
 * round [lock held]: the ec files counted, what is persisted known, the
 * protected (or, pin_planned, the planned) step pinned, the warm-up held;
 * on a node that serves meanwhile, the mesh thread's rebuild and recount. */
void mesh_after_recovery(struct snap_mesh *mesh, struct snap_store *store, int pin_planned);
void mesh_rebuild_behind(struct snap_mesh *mesh);
/* CPU time of the calling thread (user + system), in ns. The mesh's MPI
 * traffic is progressed and copied (CMA) by the thread that waits on it,
 * so a protect's or rebuild's thread holds nearly all of its CPU. */
uint64_t mesh_thread_cpu_ns(void);

/* ---- recover.c: the relaunch ---- */

/* [collective, before serving] Gather the records and decide each job's
 * step (rl_plan, rl_step; lost jobs marked). Returns 1 when this node must
 * rebuild before it serves (it lacks a record of a decided step, or its
 * store lacks a slot the record lists), else 0. */
int mesh_recover_plan(struct snap_mesh *mesh);
/* [collective] Rebuild (or verify) every planned job's step, agree on the
 * outcome, prune the other steps' ec files; sets has_prot/prot or lost
 * under mu. Returns 1 when some job was planned. */
int mesh_recover_run(struct snap_mesh *mesh);

/* ---- meshwarm.c (mesh thread only) ---- */

/* Once per round, before the protects: take what the warm-up worker made
 * ready (slot mappings into mesh->maps, parity files into the job's pool,
 * a relaunch's kept parity and spare into the job), and queue what is new:
 * reserved slot files of registered ranks not mapped yet, parity files up
 * to two per job within the budget. Starts the worker the first time. */
void mesh_warm_round(struct snap_mesh *mesh);
/* Before a protect maps slot file path itself: the warm-up's request for
 * it, if any, finished (done here when not started, waited for when under
 * way) and taken, so the work is never done twice. */
void mesh_warm_settle_slot(struct snap_mesh *mesh, const char *path);
/* A parity file made ahead for job (one under way is waited for), at
 * least plen bytes: renamed to `to`,
 * cut to plen, its mapping in *map (*len = plen) and its bytes uncounted
 * (the caller charges plen). 0, or -1 when the pool has none. */
int mesh_warm_take_parity(struct snap_mesh *mesh, const char *job, uint64_t plen, const char *to, void **map,
			  uint64_t *len);
/* Stop the worker, unmap the pool (its files stay, counted at the next start). */
void mesh_warm_free(struct snap_mesh *mesh);

/* ---- meshrec.c: the relaunch's records (recover.c, meshcap.c) ---- */

/* One valid erasure-coding record of a node. */
struct mesh_rec {
	char job[SNAP_JOB_MAX + 1];
	uint64_t step;                /* a step, or a generation of captured files */
};
/* Every node's valid records, gathered: node i's are all[dsp[i] .. +cnt[i]). */
struct mesh_recs {
	struct mesh_rec *all;
	int *cnt, *dsp;
	int total;
};
/* A local check of unit g of job beyond its record (0: usable). */
typedef int (*mesh_rec_check)(struct snap_mesh *mesh, const char *job, uint64_t g, char *err, size_t errlen);
/* [collective] List this node's valid records under <root>/<job><sub>/ec
 * (sub "" for steps, "/files" for captured files), gather everyone's. */
void mesh_gather_records(struct snap_mesh *mesh, const char *sub, mesh_rec_check check, struct mesh_recs *r);
void mesh_recs_free(struct mesh_recs *r);
int mesh_has_rec(const struct mesh_recs *r, int node, const char *job, uint64_t g);
/* Can every group rebuild unit g (at most m records missing)? If not and msg
 * is given, it names the first group that cannot and its lost nodes. */
int mesh_rebuildable(struct snap_mesh *mesh, const struct mesh_recs *r, const char *job, uint64_t g, char *err,
		     size_t errlen);
/* [collective] Agree on an outcome: 0, or SNAP_ELOST with a failing node's
 * message in msg: the first whose failure was its own, else the first. */
int mesh_agree(struct snap_mesh *mesh, int rc, char *err, size_t errlen);
/* A parity file mapped read-write at plen bytes (created or resized), for
 * an encode to write into. */
void *mesh_map_parity(const char *ppath, uint64_t plen, char *err, size_t errlen);
/* The parity file of a rebuild, created or resized to plen bytes: open
 * read-write in *fd for the rebuild's io, and returned mapped read-only for
 * MPI to send parity rows from (populated only when this node has its
 * pieces: a lost node sends none). NULL and msg on failure. */
void *mesh_open_parity(const char *ppath, uint64_t plen, int have, int *fd, char *err, size_t errlen);
/* The rebuild's io over a node's files (struct snap_ec_io): rebuilt pieces
 * are written with pwrite(), not through a fresh mapping, whose every page
 * the kernel would zero-fill and fault in first (on the test VM, 256 MiB
 * written through one took 1.1 s, with pwrite() 0.14 s). iov i of the
 * rebuild is file fd[i], or memory (iov[i]) where fd[i] < 0; the parity is
 * fd[n]. Reads (the verification, the rows this node decodes) stay on the
 * read-only mappings, populated up front: reading them through pread() too
 * was 3x faster on one VM (shadow page tables: a trap per page even after
 * MAP_POPULATE) but 1.2-1.6x slower on another and adds a copy everywhere
 * (README, "Erasure coding"). */
struct mesh_fio {
	const struct iovec *iov;
	const int *fd;   /* [n + 1] */
	int n;
};
/* snap_ec_rebuild_set_io with f (which must outlive the run). */
int mesh_fio_attach(struct snap_ec_rebuild *rb, struct mesh_fio *f);
/* [collective over the group] Begin the rebuild of the unit whose record
 * is rpath: this node passes its record when it has a usable one (have),
 * else it counts as lost. msg on failure. */
int mesh_rebuild_begin(struct snap_mesh *mesh, const char *rpath, int have, struct snap_ec_rebuild **rb, char *err,
		       size_t errlen);
/* Pack meta into rpath (written to rpath.tmp and renamed). */
int mesh_write_record(const char *rpath, const struct snap_ec_meta *meta);
/* [no lock held] Charge plen parity bytes to the memory budget, or
 * SNAP_ENOSPC with err naming the budget. */
int mesh_charge_parity(struct snap_mesh *mesh, uint64_t plen, char *err, size_t errlen);

/* ---- meshflush.c (called by mesh.c) ---- */

/* [no lock held; every node, same data] After a round's fold: advance each
 * job's flush (start, all parts written -> node 0 seals, sealed or failed ->
 * done). wanted: some node asked for a flush this round. Returns 1 while a
 * flush is under way or wanted (a stop waits for it). */
int mesh_flush_round(struct snap_mesh *mesh, int wanted);

/* ---- protect.c, recover.c (called by mesh.c) ---- */

/* [no lock held; collective over the mesh] Encode step g of job j across
 * every group, agree, and on success make g the job's protected step. */
int mesh_protect(struct snap_mesh *mesh, struct mjob *j, uint64_t g);
/* [mesh thread] Unmap the kept parity files (the protected step's, the
 * spare) that are gone from the store, e.g. a job directory removed by
 * hand: their pages would otherwise outlive the budget's count of them.
 * Returns how many it unmapped. */
unsigned mesh_parity_sweep(struct snap_mesh *mesh);
/* [lock held] Pin this node's slots of step g of job j as its protected step. */
void mesh_pin_protected(struct snap_mesh *mesh, struct mjob *j, uint64_t g);

/* [collective over the group, no lock held] The relaunch's rebuild of step
 * g of job run again while serving (every member passes its files): each
 * chunk of data or parity that fails its recorded CRC32C is decoded from
 * the rest of its stripe and rewritten. 0 or an error with msg. */
int mesh_heal_rebuild(struct snap_mesh *mesh, const char *job, uint64_t g, char *err, size_t errlen);

/* ---- meshheal.c (called by mesh.c): repair from parity while serving ---- */

/* [no lock held; every node, same data] After a round's fold: run the
 * repair of every job some node asked one for (heal_now), record the
 * outcome for the poll thread. */
void mesh_heal_round(struct snap_mesh *mesh, uint64_t number);
/* [lock held] Is this node's copy of (rank, step) of generation gen of j given up? */
int mesh_heal_given_up(const struct mjob *j, uint32_t rank, uint64_t step, uint64_t gen);

/* ---- meshcap.c (called by mesh.c): captured files across the mesh ---- */

/* [no lock held; collective over the mesh] Erasure-code this node's
 * committed captured files of job j as a new generation; on success on
 * every node it replaces the previous one. */
int mesh_cap_protect(struct snap_mesh *mesh, struct mjob *j);
/* [collective, before serving, before the captured files are opened]
 * Rebuild the newest generation every group can rebuild: lost nodes get
 * their captured files (namespace and data) back. Returns 1 if it wrote. */
int mesh_cap_recover(struct snap_mesh *mesh);
/* Bytes of the captured files' parity of job (the memory budget). */
uint64_t mesh_cap_parity_bytes(const char *root, const char *job);

#endif
