/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh.h - the parts of `snapbench mesh` (bench_mesh.c says what it
 * measures): the mesh as processes and its log (bench_mesh_nodes.c), the
 * trainer processes (bench_mesh_trainers.c), and what they share
 * (bench_mesh_util.c). The driver calls the nodes and the trainers, the
 * trainers ask the nodes whether the mesh still runs, all three use the
 * util; nothing calls back up.
 */
#ifndef SNAP_BENCH_MESH_H
#define SNAP_BENCH_MESH_H

#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define JOB "bench"
#define SLOTS 3
#define MAX_NODES 256
#define MAX_STEPS 1000
#define WAIT_S 600.0   /* for any one event: generous, a benchmark reports rather than races */

/* Set by SIGINT/SIGTERM: every wait gives up, the caller cleans up. */
extern volatile sig_atomic_t bm_stop;

/* ---- shared by the three parts (bench_mesh_util.c) ---- */

/* "snapbench mesh: " + the message on stderr. */
void bm_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void bm_nap_ms(int ms);

/* SIGINT and SIGTERM set bm_stop, SIGPIPE is ignored, for the run; then
 * what was there before. */
struct bm_signals {
	struct sigaction intr, term, pipe;
};
void bm_signals_catch(struct bm_signals *old);
void bm_signals_restore(const struct bm_signals *old);

/* ---- the mesh: mpiexec in a session of its own (bench_mesh_nodes.c) ---- */

struct mesh {
	int k, m, nodes;
	int lost;                /* --lost: group 0's first nodes whose stores go */
	char base[PATH_MAX];     /* node n's store: base/node<n> */
	char log[PATH_MAX];      /* the daemons' stdout and stderr */
	const char *dir;         /* --dir */
	int huge;                /* snap_store_hugepages(dir) */
	char fs[160];            /* and what decided it */
	char smp[PATH_MAX];
	const char *mpiexec;
	uint64_t mem_limit;
	pid_t pid;               /* mpiexec, leader of the session */
	char *text;              /* what the log holds so far */
	size_t len, cap;
	off_t read_at;
};

/* node n's store folder, or a file in it; 0, or -1 when it does not fit. */
int node_path(const struct mesh *ms, int n, const char *leaf, char *out, size_t cap);
/* Start the mesh and wait until every node serves; -1 (killed again) if not. */
int mesh_start(struct mesh *ms);
/* The two halves of mesh_start: fork mpiexec; wait for every node's socket. */
int mesh_launch(struct mesh *ms);
int mesh_serving(struct mesh *ms);
/* Whether mpiexec still runs (reaps it when not). */
int mesh_alive(struct mesh *ms);
/* SIGKILL of every node at once, and their MPI segments removed. */
void mesh_kill(struct mesh *ms);
/* SIGTERM to every node, wait for mpiexec; -1 if it had to be killed. */
int mesh_stop(struct mesh *ms);
/* Read what the log gained since the last call (complete lines only). */
int log_refresh(struct mesh *ms);

/* One node's "protected" line for step s. */
struct prot {
	uint64_t data, parity;
	double ms, cpu_ms;   /* wall, and the protect thread's CPU */
};

/* Every node's "protected" line for step s, in order of appearance; how many. */
int find_protected(const struct mesh *ms, uint64_t s, struct prot *out, int cap);
/* Wait until every node logged step s protected; lines gets them. */
int wait_protected(struct mesh *ms, uint64_t s, struct prot *lines);

/* Wait until every node logged job JOB's files ready ahead of its first
 * protects (smp/mesh/meshwarm.c); -1 when the mesh died or the wait ran out. */
int wait_ready(struct mesh *ms);

/* One lost node's "rebuilt this lost node" line. */
struct rebuilt {
	double ms, files, exchange, publish;
	double cpu_ms;   /* the node's own rebuild CPU (-1: not logged) */
	uint64_t bytes;
};

int find_rebuilt(const struct mesh *ms, uint64_t s, struct rebuilt *out, int cap);
/* Until every lost node logged its rebuild of step s (and node 0 its
 * verification); how many, or -1 (said) on a timeout or a dead mesh. */
int wait_rebuilt(struct mesh *ms, uint64_t s, struct rebuilt *out, int cap);
/* Node 0's "verified on every node" line for step s: the CPU the whole
 * mesh spent on the rebuild, in ms (-1 when the line is not there). */
double find_rebuild_cpu(const struct mesh *ms, uint64_t s);

/* ---- the trainers: one process per node (bench_mesh_trainers.c) ---- */

enum { T_READY = 1, T_DONE = 2, T_RESTORED = 3, T_FAILED = 4 };

struct tmsg {       /* child -> parent, one write (atomic on a pipe) */
	int rank, what, rc;
	uint64_t step;
	double secs;
};

struct crew {
	int n;
	pid_t pid[MAX_NODES];
	int go[MAX_NODES];       /* write ends, parent -> trainer */
	int res;                 /* read end, every trainer -> parent */
	/* read while waiting for something else: a fast trainer's READY for
	 * the next step can come before a slow one's DONE for this one */
	struct tmsg early[2 * MAX_NODES];
	int nearly;
	double first_at;         /* crew_collect: bench_mono() of its first report */
};

/* One trainer per node: steps > 0 save steps 1..steps, each filled on one
 * byte from the parent and saved on the next; steps == 0 restore the newest
 * step and check it is `last`. */
int crew_start(struct crew *c, const struct mesh *ms, uint64_t size, int steps, uint64_t last);
/* One byte to every trainer (`what`, for the message if one is gone). */
int crew_tell(struct crew *c, const char *what, int s);
/* One `what` message about step s from every trainer; secs gets the largest
 * time they report. -1 on a failure, a dead trainer or mesh, or bm_stop. */
int crew_collect(struct crew *c, struct mesh *ms, int what, uint64_t s, double *secs);
/* Whether every trainer exited 0 (their go pipes closed first). */
int crew_join(struct crew *c);
/* Close the pipes and reap (SIGKILL first when kill_them). */
void crew_end(struct crew *c, int kill_them);

#endif
