/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * bench_mesh.c - `snapbench mesh`: erasure coding through the real daemons,
 * side by side in one run with the limits `snapbench ec` measures.
 *
 *   snapbench mesh [--k K] [--m M] [--lost L] [--nodes N] [--size BYTES] [--steps S] [--dir D]
 *                  [--warm-wait] [--first-after MS] [--keep-log] [--json]
 *
 * `mpiexec -np N snapsmp --ec K+M`, one store per simulated node under D
 * (default /dev/shm), and one trainer process per node (rank = node, a
 * libsnap context of its own) saving SIZE bytes per step.
 *
 * Protect. The trainers save one step at a time, and fill the next step
 * only once every node logged this one protected, so protects do not
 * compete with saves or fills for the cores. Two figures per step: the daemons' own
 * protect time (the slowest node's log line: map + encode + publish and
 * agree) and save -> protected as the job sees it (from the moment the
 * trainers are told to save until the last node's line appears). The
 * first SLOTS + 1 steps may be cold (a slot file or parity file the daemons'
 * warm-up, smp/mesh/meshwarm.c, has not made ready yet is mapped or created by
 * the protect itself; docs/design/mesh-and-ec.md "Protect"); the steady
 * figures are medians of the rest. The trainers send their layout
 * (snap_prepare) and fill step 1 at once, which leaves the warm-up only the
 * fill's time; with --warm-wait step 1 waits until every node logged its
 * files ready (a job whose first step outlasts the warm-up), and the time
 * that took is reported; --first-after MS waits a fixed time instead.
 *
 * Rebuild. SIGKILL of the whole mesh, the stores of the first M nodes of
 * group 0 deleted, relaunch: the slowest rebuilt node's logged time, and
 * relaunch -> serving. Then a new trainer process per node (a relaunched
 * job) restores the newest step and checks every byte. Then the same loss
 * again, relaunched as integration/launch/mpirun.sh does it: the trainers
 * start with the mesh (their connection retries until it serves), so what
 * a trainer does before its restore overlaps the rebuild; relaunch ->
 * restored once more.
 *
 * Then `snapbench ec` with the same K, M and SIZE gives, in the same run,
 * MPI moving the same traffic (the target for protect: >= 0.7 of it), raw
 * ISA-L decode (the target for rebuild: >= 0.5 of it) and the library's
 * own end-to-end figures over warm buffers. Every rate is GB (1e9 bytes) of
 * protected data (N x SIZE) per second.
 *
 * The daemons' log goes to a file in $TMPDIR (default /tmp), removed after
 * a successful run and named in the error otherwise. SIGINT or SIGTERM stop
 * the run: the mesh and the trainers are killed and the stores removed.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "bench_mesh.h"
#include "bench_proc.h"
#include "bench_util.h"
#include "cliopts.h"
#include "snap/base.h"
#include "snap/ec.h"
#include "snap/snap.h"
#include "snapbench.h"

static void usage(FILE *f)
{
	fprintf(f, "usage: snapbench mesh [--k K] [--m M] [--lost L] [--nodes N] [--size BYTES] [--steps S] [--dir D]\n"
		   "                      [--warm-wait] [--first-after MS] [--keep-log] [--json]\n"
		   "Erasure coding through the real daemons: mpiexec -np N snapsmp --ec K+M on this host, one\n"
		   "trainer per node saving BYTES per step, then the mesh SIGKILLed, L nodes' stores deleted and\n"
		   "rebuilt at relaunch (twice: trainers started once the mesh serves, then beside it, as\n"
		   "integration/launch/mpirun.sh does); beside MPI moving the same bytes and raw ISA-L\n"
		   "(snapbench ec), same run; and the CPU seconds per GB each took, which on a host whose\n"
		   "cores the nodes share set a ceiling: no figure can beat cores / CPU seconds per GB.\n"
		   "  --k, --m   group shape (default 3+1)\n"
		   "  --lost     nodes whose stores are deleted, 1 to M (default M); the library's\n"
		   "             rebuild beside it always rebuilds M\n"
		   "  --nodes    simulated nodes, >= K+M (default K+M)\n"
		   "  --size     bytes per node (default 256M)\n"
		   "  --steps    steps saved, >= %d: the first %d are cold (default 8)\n"
		   "  --dir      where the node stores go (default /dev/shm)\n"
		   "  --warm-wait  step 1 only once every node logged its files ready ahead of the first protect\n"
		   "             (a job whose first step outlasts that warm-up); default: as soon as the fill is done\n"
		   "  --first-after MS  step 1 no earlier than MS ms after the trainers sent their layout\n"
		   "  --keep-log keep the daemons' log (named on stderr) after a successful run: its time stamps\n"
		   "             split a relaunch into MPI start, rebuild, serving and the trainers' restores\n"
		   "  --json     one JSON line instead of the table\n"
		   "snapsmp is found beside snapbench (or $SNAPSMP), mpiexec is $MPIEXEC or on PATH.\n",
		SLOTS + 2, SLOTS + 1);
}

struct result {
	double commit_s[MAX_STEPS], prot_s[MAX_STEPS], wall_s[MAX_STEPS];
	double cpu_s[MAX_STEPS];  /* every node's protect thread, summed */
	double rebuild_cpu_s;     /* the whole mesh's rebuild */
	double rebuild_lost_cpu_s; /* the lost nodes' part of it (-1: not logged) */
	double cores;
	int warm;                 /* --warm-wait */
	double warm_s;            /* --warm-wait: trainers started -> every node's files ready; -1 without */
	uint64_t data, parity;
	double serving, restored, restore_max, rebuild_ms, files, exchange, publish;
	double restored_together, restore_max_together;   /* the second relaunch */
	double first_together;                            /* ... until its first rank restored */
	double lib_move, lib_raw_enc, lib_mesh, lib_raw_dec, lib_reb;
	double lib_move_cpu, lib_mesh_cpu, lib_reb_cpu, lib_dec_cpu;  /* CPU s per GB */
	double lib_fresh_cpu;     /* the library's rebuild into fresh files in --dir */
	double lib_mesh_ceiling, lib_reb_ceiling;                     /* as snapbench ec says */
};

static double median_of(const double *v, int from, int to)
{
	double t[MAX_STEPS];
	int n = 0;
	for (int i = from; i < to; i++)
		t[n++] = v[i];
	return bench_median(t, n);
}

/* The loss: every node at once, once they have all exited (a killed
 * daemon frees a deleted store's memory as it exits), then the stores of
 * group 0's first --lost nodes (M by default). */
static int lose(struct mesh *ms)
{
	mesh_kill(ms);
	for (int n = 0; n < ms->lost; n++) {
		char dir[PATH_MAX + 16];
		if (node_path(ms, n, NULL, dir, sizeof(dir)) || bench_rm_tree(dir)) {
			bm_fail("cannot remove %s: %s", dir, strerror(errno));
			return -1;
		}
	}
	return 0;
}

/* The run itself; the caller cleans up. */
static int run(struct mesh *ms, uint64_t size, int steps, double first_after, struct result *R)
{
	struct crew c = { .res = -1 };
	struct prot lines[MAX_NODES];
	if (mesh_start(ms))
		goto bad;
	double tw = bench_mono();
	if (crew_start(&c, ms, size, steps, 0) || (R->warm && wait_ready(ms)))
		goto bad;
	R->warm_s = R->warm ? bench_mono() - tw : -1;
	while (first_after > 0 && bench_mono() - tw < first_after && !bm_stop)
		bm_nap_ms(5);
	for (int s = 1; s <= steps; s++) {
		double d;
		if (crew_tell(&c, "fill", s) || crew_collect(&c, ms, T_READY, (uint64_t)s, &d))
			goto bad;
		double t0 = bench_mono();
		if (crew_tell(&c, "save", s))
			goto bad;
		if (crew_collect(&c, ms, T_DONE, (uint64_t)s, &R->commit_s[s - 1]) || wait_protected(ms, (uint64_t)s, lines))
			goto bad;
		R->wall_s[s - 1] = bench_mono() - t0;
		R->prot_s[s - 1] = R->cpu_s[s - 1] = 0;
		R->data = R->parity = 0;
		for (int n = 0; n < ms->nodes; n++) {
			R->prot_s[s - 1] = lines[n].ms / 1e3 > R->prot_s[s - 1] ? lines[n].ms / 1e3 : R->prot_s[s - 1];
			R->cpu_s[s - 1] += lines[n].cpu_ms / 1e3;
			R->data += lines[n].data;
			R->parity += lines[n].parity;
		}
	}
	if (!crew_join(&c))
		goto bad;

	if (lose(ms))
		goto bad;
	double t0 = bench_mono();
	if (mesh_start(ms))
		goto bad;
	R->serving = bench_mono() - t0;
	struct rebuilt rb[MAX_NODES];
	int nrb = wait_rebuilt(ms, (uint64_t)steps, rb, MAX_NODES);
	if (nrb < 0)
		goto bad;
	R->rebuild_ms = R->files = R->exchange = R->publish = 0;
	R->rebuild_cpu_s = find_rebuild_cpu(ms, (uint64_t)steps) / 1e3;
	R->rebuild_lost_cpu_s = 0;
	for (int i = 0; i < nrb; i++) {
		R->rebuild_lost_cpu_s = rb[i].cpu_ms < 0 || R->rebuild_lost_cpu_s < 0 ? -1
											: R->rebuild_lost_cpu_s + rb[i].cpu_ms / 1e3;
		R->rebuild_ms = rb[i].ms > R->rebuild_ms ? rb[i].ms : R->rebuild_ms;
		R->files = rb[i].files > R->files ? rb[i].files : R->files;
		R->exchange = rb[i].exchange > R->exchange ? rb[i].exchange : R->exchange;
		R->publish = rb[i].publish > R->publish ? rb[i].publish : R->publish;
	}
	if (crew_start(&c, ms, size, 0, (uint64_t)steps) ||
	    crew_collect(&c, ms, T_RESTORED, (uint64_t)steps, &R->restore_max) || !crew_join(&c)) {
		bm_fail("after the rebuild the trainers did not all restore step %d intact", steps);
		goto bad;
	}
	R->restored = bench_mono() - t0;

	/* The same loss again, relaunched as integration/launch/mpirun.sh does:
	 * the trainers start with the mesh and connect once it serves. */
	if (lose(ms))
		goto bad;
	t0 = bench_mono();
	if (mesh_launch(ms) || crew_start(&c, ms, size, 0, (uint64_t)steps) ||
	    crew_collect(&c, ms, T_RESTORED, (uint64_t)steps, &R->restore_max_together) || !crew_join(&c)) {
		bm_fail("relaunched together with the mesh, the trainers did not all restore step %d intact", steps);
		goto bad;
	}
	R->restored_together = bench_mono() - t0;
	R->first_together = c.first_at - t0;
	if (mesh_stop(ms))
		bm_fail("the mesh did not shut down cleanly after SIGTERM; see %s", ms->log);
	return 0;
bad:
	crew_end(&c, 1);
	mesh_kill(ms);
	return -1;
}

/* `snapbench ec` with the same shape and size, for the limits. */
static int library(const struct mesh *ms, uint64_t size, struct result *R)
{
	char self[PATH_MAX], k[16], m[16], sz[32];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		return -1;
	self[n] = 0;
	snprintf(k, sizeof(k), "%d", ms->k);
	snprintf(m, sizeof(m), "%d", ms->m);
	snprintf(sz, sizeof(sz), "%" PRIu64, size);
	char *const av[] = { self, "ec", "--k", k, "--m", m, "--size", sz, "--reps", "3", "--dir", (char *)ms->dir,
			     "--json", NULL };
	static char out[1 << 16];
	int st = bench_run_capture(av, out, sizeof(out));
	const char *line = strchr(out, '{');
	if (st != 0 || !line) {
		bm_fail("snapbench ec failed (exit %d)", st);
		return -1;
	}
	R->lib_move = bench_jnum(line, "mpi_move_gbps");
	R->lib_raw_enc = bench_jnum(line, "raw_encode_gbps");
	R->lib_mesh = bench_jnum(line, "mesh_encode_gbps");
	R->lib_raw_dec = bench_jnum(line, "raw_decode_gbps");
	R->lib_reb = bench_jnum(line, "rebuild_gbps");
	R->lib_move_cpu = bench_jnum(line, "mpi_move_cpu_s_per_gb");
	R->lib_mesh_cpu = bench_jnum(line, "mesh_encode_cpu_s_per_gb");
	R->lib_reb_cpu = bench_jnum(line, "rebuild_cpu_s_per_gb");
	R->lib_dec_cpu = bench_jnum(line, "raw_decode_cpu_s_per_gb");
	R->lib_fresh_cpu = bench_jnum(line, "rebuild_fresh_cpu_s_per_gb");
	R->lib_mesh_ceiling = bench_jnum(line, "mesh_vs_move_cpu_ceiling");
	R->lib_reb_ceiling = bench_jnum(line, "rebuild_vs_decode_cpu_ceiling");
	return 0;
}

/* The figures report_json and report_text print, from a run's result. */
struct summary {
	int cold;
	double steady, wall, commit, cold_max, gb, prot, reb;
	double cpu_prot, cpu_reb, prot_ceiling, reb_ceiling;
};

static void summarize(int steps, const struct result *R, struct summary *S)
{
	int cold = S->cold = SLOTS + 1;
	S->steady = median_of(R->prot_s, cold, steps);
	S->wall = median_of(R->wall_s, cold, steps);
	S->commit = median_of(R->commit_s, cold, steps);
	S->cold_max = 0;
	S->gb = (double)R->data / 1e9;
	for (int i = 0; i < cold; i++)
		S->cold_max = R->prot_s[i] > S->cold_max ? R->prot_s[i] : S->cold_max;
	S->prot = S->gb / S->steady;
	S->reb = S->gb / (R->rebuild_ms / 1e3);
	/* CPU seconds per GB, and the ceiling they set (bench_cpu_ceiling). */
	S->cpu_prot = median_of(R->cpu_s, cold, steps) / S->gb;
	S->cpu_reb = R->rebuild_cpu_s / S->gb;
	S->prot_ceiling = bench_cpu_ceiling(R->cores, S->cpu_prot, R->lib_move);
	S->reb_ceiling = bench_cpu_ceiling(R->cores, S->cpu_reb, R->lib_raw_dec);
}

static void report_json(const struct mesh *ms, uint64_t size, int steps, const struct result *R,
			const struct summary *S)
{
	printf("{\"shape\":\"%d+%d\",\"k\":%d,\"m\":%d,\"nodes\":%d,\"size\":%" PRIu64 ",\"steps\":%d,"
	       "\"store_hugepages\":%s,\"protected_bytes\":%" PRIu64 ",\"parity_bytes\":%" PRIu64
	       ",\"protect_cold_s\":[", ms->k, ms->m, ms->k, ms->m, ms->nodes, size, steps,
	       ms->huge == 1 ? "true" : "false", R->data, R->parity);
	for (int i = 0; i < S->cold; i++)
		printf("%s%.6f", i ? "," : "", R->prot_s[i]);
	printf("],\"protect_cold_cpu_s\":[");
	for (int i = 0; i < S->cold; i++)
		printf("%s%.6f", i ? "," : "", R->cpu_s[i]);
	printf("],\"protect_steady_cpu_s\":%.6f,\"protect_first_vs_steady\":%.3f,\"warm_wait\":%s,"
	       "\"warm_up_s\":%.3f", S->cpu_prot * S->gb, R->prot_s[0] / S->steady, R->warm ? "true" : "false",
	       R->warm_s);
	printf(",\"protect_steady_s\":%.6f,\"protect_gbps\":%.3f,\"protect_cold_gbps\":%.3f,"
	       "\"commit_s\":%.6f,\"save_to_protected_s\":%.6f,\"lost_nodes\":[",
	       S->steady, S->prot, S->gb / S->cold_max, S->commit, S->wall);
	for (int i = 0; i < ms->lost; i++)
		printf("%s%d", i ? "," : "", i);
	printf("],\"rebuild_s\":%.6f,\"rebuild_phases_ms\":{\"files\":%.1f,\"exchange\":%.1f,\"publish\":%.1f},"
	       "\"rebuild_gbps\":%.3f,\"relaunch_to_serving_s\":%.3f,\"relaunch_to_restored_s\":%.3f,"
	       "\"restore_s\":%.6f,\"restored_bytes_checked\":%" PRIu64 ",\"relaunch_together_to_restored_s\":%.3f,"
	       "\"relaunch_together_to_first_restored_s\":%.3f,"
	       "\"restore_together_s\":%.6f,",
	       R->rebuild_ms / 1e3, R->files, R->exchange, R->publish, S->reb, R->serving, R->restored,
	       R->restore_max, (uint64_t)ms->nodes * (size / 8 * 8), R->restored_together, R->first_together,
	       R->restore_max_together);
	printf("\"library\":{\"mpi_move_gbps\":%.3f,\"raw_encode_gbps\":%.3f,\"mesh_encode_gbps\":%.3f,"
	       "\"raw_decode_gbps\":%.3f,\"rebuild_gbps\":%.3f,\"mpi_move_cpu_s_per_gb\":%.4f,"
	       "\"mesh_encode_cpu_s_per_gb\":%.4f,\"rebuild_cpu_s_per_gb\":%.4f,\"raw_decode_cpu_s_per_gb\":%.4f,"
	       "\"rebuild_fresh_cpu_s_per_gb\":%.4f},"
	       "\"cores\":%.0f,\"protect_cpu_s_per_gb\":%.4f,\"rebuild_cpu_s_per_gb\":%.4f,"
	       "\"protect_cpu_vs_library\":%.3f,\"rebuild_cpu_vs_library\":%.3f,"
	       "\"rebuild_cpu_vs_library_fresh\":%.3f,\"rebuild_lost_nodes_cpu_s_per_gb\":%.4f,"
	       "\"protect_vs_mpi_move\":%.3f,\"protect_vs_mpi_move_cpu_ceiling\":%.3f,"
	       "\"rebuild_vs_raw_decode\":%.3f,\"rebuild_vs_raw_decode_cpu_ceiling\":%.3f}\n",
	       R->lib_move, R->lib_raw_enc, R->lib_mesh, R->lib_raw_dec, R->lib_reb, R->lib_move_cpu,
	       R->lib_mesh_cpu, R->lib_reb_cpu, R->lib_dec_cpu, R->lib_fresh_cpu, R->cores, S->cpu_prot, S->cpu_reb,
	       S->cpu_prot / R->lib_mesh_cpu, S->cpu_reb / R->lib_reb_cpu, S->cpu_reb / R->lib_fresh_cpu,
	       R->rebuild_lost_cpu_s < 0 ? -1.0 : R->rebuild_lost_cpu_s / S->gb, S->prot / R->lib_move,
	       S->prot_ceiling, S->reb / R->lib_raw_dec, S->reb_ceiling);
}

static void report_text(const struct mesh *ms, uint64_t size, int steps, const struct result *R,
			const struct summary *S)
{
	int cold = S->cold;
	double steady = S->steady, wall = S->wall, commit = S->commit, cold_max = S->cold_max, gb = S->gb;
	double prot = S->prot, reb = S->reb, cpu_prot = S->cpu_prot, cpu_reb = S->cpu_reb;
	double prot_ceiling = S->prot_ceiling, reb_ceiling = S->reb_ceiling;
	printf("mesh bench: %d nodes (%d+%d) of real snapsmp daemons on this host, %.1f MiB per node, "
	       "%.3f GB of protected data per step; GB/s of protected data\n",
	       ms->nodes, ms->k, ms->m, size / 1048576.0, gb);
	printf("stores under %s: %s huge pages (%s)\n", ms->dir, ms->huge == 1 ? "with" : "without", ms->fs);
	printf("  %-40s %8s %10s  %s\n", "", "GB/s", "seconds", "");
	printf("  %-40s %8.2f %10.4f  the daemons' own time, slowest node\n", "protect, steady (median)", prot, steady);
	printf("  %-40s %8.2f %10.4f  the slowest of steps 1-%d\n", "protect, cold", gb / cold_max, cold_max, cold);
	printf("  %-40s %8.2f %10.4f  %.2fx steady%s\n", "protect, first step", gb / R->prot_s[0], R->prot_s[0],
	       R->prot_s[0] / steady, R->warm ? "" : " (saved right after REGISTER)");
	if (R->warm)
		printf("  %-40s %8s %10.3f  trainers started -> every node's files ready (--warm-wait)\n",
		       "warm-up ahead of step 1", "", R->warm_s);
	printf("  %-40s %8.2f %10.4f  as the job sees it (median)\n", "save -> protected", gb / wall, wall);
	printf("  %-40s %8.2f %10.4f  (median)\n", "save -> committed", gb / commit, commit);
	printf("  %-40s %8.2f %10s  MPI alone, same traffic (snapbench ec)\n", "MPI move", R->lib_move, "");
	printf("  %-40s %8.2f %10s  the ec/ library over MPI, warm buffers\n", "protect, library", R->lib_mesh, "");
	printf("  %-40s %8.2f %10s  (target >= 0.7)\n", "protect / MPI move", prot / R->lib_move, "");
	printf("  %-40s %8.2f %10.4f  %d lost; files %.0f, exchange %.0f, publish %.0f ms\n",
	       "rebuild of the lost node(s)", reb, R->rebuild_ms / 1e3, ms->lost, R->files, R->exchange, R->publish);
	printf("  %-40s %8.2f %10s  1 process (snapbench ec)\n", "raw ISA-L decode", R->lib_raw_dec, "");
	printf("  %-40s %8.2f %10s  the ec/ library over MPI\n", "rebuild, library", R->lib_reb, "");
	printf("  %-40s %8.3f %10s  (target >= 0.5)\n", "rebuild / raw decode", reb / R->lib_raw_dec, "");
	printf("  CPU seconds per GB of protected data (all processes; %.0f cores here, so a figure cannot beat\n"
	       "  cores / CPU per GB: the ceiling)\n", R->cores);
	printf("  %-40s %8.4f %10s  ceiling %.2f of MPI move\n", "protect, daemons (median)", cpu_prot, "",
	       prot_ceiling);
	printf("  %-40s %8.4f %10s  ceiling %.2f of MPI move\n", "protect, library", R->lib_mesh_cpu, "",
	       R->lib_mesh_ceiling);
	printf("  %-40s %8.4f\n", "MPI move", R->lib_move_cpu);
	printf("  %-40s %8.4f %10s  ceiling %.2f of raw decode\n", "rebuild, daemons", cpu_reb, "", reb_ceiling);
	if (R->rebuild_lost_cpu_s >= 0)
		printf("  %-40s %8.4f %10s  survivors %.4f\n", "  of which the lost node(s)", R->rebuild_lost_cpu_s / gb,
		       "", cpu_reb - R->rebuild_lost_cpu_s / gb);
	printf("  %-40s %8.4f %10s  ceiling %.2f of raw decode\n", "rebuild, library", R->lib_reb_cpu, "",
	       R->lib_reb_ceiling);
	printf("  %-40s %8.4f %10s  the lost nodes' bytes in fresh files in %s\n", "rebuild, library, fresh memory",
	       R->lib_fresh_cpu, "", ms->dir);
	printf("  %-40s %8.4f %10s  1 process\n", "raw ISA-L decode", R->lib_dec_cpu, "");
	printf("  %-40s %8.2f %10s  (target <= 1.2)\n", "protect CPU, daemons / library", cpu_prot / R->lib_mesh_cpu,
	       "");
	printf("  %-40s %8.2f %10s  (target <= 1.2); %.2f of the library's into fresh memory\n",
	       "rebuild CPU, daemons / library", cpu_reb / R->lib_reb_cpu, "", cpu_reb / R->lib_fresh_cpu);
	printf("  %-40s %8s %10.3f\n", "relaunch -> serving", "", R->serving);
	printf("  %-40s %8s %10.3f  every rank restored and checked step %d\n", "relaunch -> restored", "", R->restored,
	       steps);
	printf("  %-40s %8s %10.3f  the trainers started with the mesh (mpirun.sh)\n", "the same, launched together", "",
	       R->restored_together);
	printf("  %-40s %8s %10.3f  nodes whose copy is intact serve during the rebuild\n", "  the first rank restored", "",
	       R->first_together);
}

struct mesh_args {
	int k, m, nodes, steps, json, lost, warm, first_ms, keep_log;
	uint64_t size;
	const char *dir;
};

/* SB_OK with a filled, -1 after --help, SB_USAGE. */
static int mesh_parse(int argc, char **argv, struct mesh_args *a)
{
	*a = (struct mesh_args){ .k = 3, .m = 1, .steps = 8, .size = 256ull << 20, .dir = "/dev/shm" };
	const struct cli_opt opts[] = {
		CLI_OPT_HELP,
		CLI_OPT_FLAG("json", 0, &a->json),
		CLI_OPT_INT("k", 0, &a->k, 1, SNAP_EC_MAX_GROUP - 1),
		CLI_OPT_INT("m", 0, &a->m, 1, SNAP_EC_MAX_GROUP - 1),
		CLI_OPT_INT("lost", 0, &a->lost, 1, SNAP_EC_MAX_GROUP - 1),
		CLI_OPT_INT("nodes", 0, &a->nodes, 2, MAX_NODES),
		CLI_OPT_INT("steps", 0, &a->steps, SLOTS + 2, MAX_STEPS),
		CLI_OPT_SIZE("size", 0, &a->size, 8, 64ull << 30, "8 bytes to 64G"),
		CLI_OPT_STR("dir", 0, &a->dir),
		CLI_OPT_FLAG("warm-wait", 0, &a->warm),
		CLI_OPT_INT("first-after", 0, &a->first_ms, 0, 3600000),
		CLI_OPT_FLAG("keep-log", 0, &a->keep_log),
	};
	const struct cli c = BENCH_CLI("mesh", usage, 1);
	int rc = cli_parse(&c, argc, argv, opts, sizeof(opts) / sizeof(opts[0]), NULL);
	if (rc)
		return rc == CLI_HELP_ASKED ? -1 : SB_USAGE;
	a->nodes = a->nodes ? a->nodes : a->k + a->m;
	struct snap_ec_group g;
	char err[256];
	int k = a->k, m = a->m, nodes = a->nodes;
	if (nodes < k + m || nodes > MAX_NODES || snap_ec_group_of(nodes, k, m, 0, 0, &g, err, sizeof(err))) {
		bm_fail("--nodes %d in groups of %d+%d: %s", nodes, k, m,
		     nodes < k + m ? "need at least K+M nodes (group 0, the one that loses nodes, is measured)"
				   : nodes > MAX_NODES ? "too many" : err);
		return SB_USAGE;
	}
	if (a->lost > m) {
		bm_fail("--lost %d: a %d+%d group rebuilds at most %d lost nodes", a->lost, k, m, m);
		return SB_USAGE;
	}
	return SB_OK;
}

/* The mesh's programs, paths and budget; its base folder made. SB_OK, or
 * SB_USAGE / SB_FAIL after a message. */
static int mesh_setup(const struct mesh_args *a, struct mesh *ms)
{
	*ms = (struct mesh){ .k = a->k, .m = a->m, .nodes = a->nodes, .lost = a->lost ? a->lost : a->m, .dir = a->dir };
	static const char *const cand[] = { "%s/snapsmp", "%s/../smp/snapsmp" };
	bench_find_prog(ms->smp, sizeof(ms->smp), "SNAPSMP", "snapsmp", cand, 2);
	ms->mpiexec = getenv("MPIEXEC") && *getenv("MPIEXEC") ? getenv("MPIEXEC") : "mpiexec";
	/* 3 slots of data and the parity of 2 steps (the protected one and the next), and room */
	ms->mem_limit = 4 * a->size + 4 * ((uint64_t)a->m * a->size / (uint64_t)a->k + 1) + (64ull << 20);
	const char *tmp = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
	snprintf(ms->base, sizeof(ms->base), "%s/snapbench-mesh-%d", a->dir, (int)getpid());
	snprintf(ms->log, sizeof(ms->log), "%s/snapbench-mesh-%d.log", tmp, (int)getpid());
	char probe[SNAP_PATH_MAX];
	if (node_path(ms, a->nodes - 1, "smp.sock", probe, sizeof(probe))) {
		bm_fail("--dir %s: too long: the node stores' socket paths must fit in %d bytes", a->dir,
			SNAP_PATH_MAX - 1);
		return SB_USAGE;
	}
	if (mkdir(ms->base, 0700)) {
		bm_fail("cannot create %s: %s", ms->base, strerror(errno));
		return SB_FAIL;
	}
	ms->huge = snap_store_hugepages(ms->base, ms->fs, sizeof(ms->fs));
	unlink(ms->log);
	return SB_OK;
}

int cmd_bench_mesh(int argc, char **argv)
{
	struct mesh_args a;
	struct mesh ms;
	int rc = mesh_parse(argc, argv, &a);
	if (rc)
		return rc < 0 ? SB_OK : rc;
	if ((rc = mesh_setup(&a, &ms)))
		return rc;
	struct bm_signals old;
	bm_signals_catch(&old);
	static struct result R;
	R.cores = bench_cores();
	R.warm = a.warm;
	rc = run(&ms, a.size, a.steps, a.first_ms / 1e3, &R);
	if (bench_rm_tree(ms.base))
		bm_fail("could not remove %s: %s", ms.base, strerror(errno));
	free(ms.text);
	bm_signals_restore(&old);
	if (bm_stop) {
		bm_fail("stopped by signal %d; the mesh and the trainers were killed, the stores removed", (int)bm_stop);
		unlink(ms.log);
		return SB_FAIL;
	}
	if (rc) {
		bm_fail("the daemons' log is kept: %s", ms.log);
		return SB_FAIL;
	}
	if (a.keep_log)
		fprintf(stderr, "snapbench mesh: the daemons' log is kept: %s\n", ms.log);
	else
		unlink(ms.log);
	if (library(&ms, a.size, &R))
		return SB_FAIL;
	struct summary S;
	summarize(a.steps, &R, &S);
	if (a.json)
		report_json(&ms, a.size, a.steps, &R, &S);
	else
		report_text(&ms, a.size, a.steps, &R, &S);
	return SB_OK;
}
