#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""libsnap under a real SLURM: a private cluster of 4 fake nodes on this
machine (slurm_cluster.py), the mesh of snapsmp daemons as one job step
(`srun --ntasks-per-node=1 --mpi=pmix snapsmp --ec 3+1`), the example
trainer's ranks as another, 2 per node. The trainer checks every restored
byte itself (exit 3 on a mismatch, which fails the run here). One scenario
per run:

  mesh          in one allocation (salloc --no-shell, steps with --jobid):
                the trainers commit 6 steps; once every node logged step 6
                protected, mesh and trainers are stopped and launched again;
                every rank restores step 6, bit-exact.
  sbatch        `sbatch integration/launch/slurm.sbatch`, unmodified (SNAP_*
                variables and sbatch options only); a trainer rank is
                SIGKILLed after its third commit, the recipe relaunches
                mesh and trainers, every rank restores the same step and the
                job finishes (exit 0).
  node-failure  the trainers run; once every node logged a step protected,
                node n2's daemon and trainers are SIGKILLed, n2 is marked
                down (scontrol update state=down reason=drill) and its store
                wiped (its memory is gone); n2 is resumed as the replacement
                and the job is launched again on n1-n4: the mesh rebuilds
                n2's store from parity and every rank restores the same
                step, at least the newest one every node had protected;
                n2's --metrics-file shows that step protected and the
                chunks rebuilt, labelled node="n2", mesh_node="1".
  preempt       the recipe under sbatch --requeue with SNAP_FLUSH_DIR; once a
                step is protected everywhere, `scancel --signal=USR1 --batch`
                (what --signal=B:USR1@N does before the time limit) makes the
                mesh persist it while training goes on; then the job is
                preempted (scontrol requeuehold: SIGTERM to every task, the
                mesh persists the newest protected step once more, the job
                goes back to the queue), every node store is removed, and the
                released job restores the newest persisted step from disk on
                every rank, bit-exact, and trains to the end.

Waits are for events: log lines (inotify on the log directory), process
exits (pidfds), the scheduler's answers; one generous deadline each.
Exit 77 (one line) when not root or the SLURM/munge packages are missing.
usage: launch_slurm.py --build BUILD_DIR --source SOURCE_DIR SCENARIO
"""
import argparse
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "fault"))
from events import Waiter  # noqa: E402
from promfile import prom_value  # noqa: E402
import slurm_cluster  # noqa: E402

NODES, PPN, EC = 4, 2, "3+1"
JOB = "slurmjob"
fails = []


def check(cond, msg):
    if not cond:
        fails.append(msg)
        print("FAIL:", msg, flush=True)
    return cond


def say(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Run:
    def __init__(self, a, tmp, cluster):
        self.a, self.tmp, self.c = a, tmp, cluster
        self.logs = os.path.join(tmp, "logs")
        self.store = tempfile.mkdtemp(prefix="snap-slurm-", dir="/dev/shm")
        os.makedirs(self.logs)
        self.flush = os.path.join(tmp, "flush")
        # The trainer's ranks: each uses its node's store (the fake nodes
        # share /dev/shm, so "%n" in SNAP_STORE is the node's index, as
        # snapsmp expands it to its mesh rank) and logs per rank.
        self.wrapper = os.path.join(tmp, "rank.sh")
        with open(self.wrapper, "w") as f:
            f.write('#!/bin/bash\nexport SNAP_STORE="${SNAP_STORE//%n/$SLURM_NODEID}"\n'
                    f'exec {a.build}/integration/trainer "$@" --quiet --log {self.logs}/rank$SLURM_PROCID.log\n')
        os.chmod(self.wrapper, 0o755)
        path = os.pathsep.join([os.path.join(a.build, "smp"), os.environ.get("PATH", "")])
        # SNAP_AUTOSTART=0 as in the recipe: a trainer that finds no
        # listener (the mesh still starting, or a dead one's socket file
        # left after a failed start) waits for the mesh's snapsmp instead of
        # starting one of its own, which SNAP_EC would make fail outside MPI.
        self.env = dict(cluster.env, PATH=path, SNAP_EC=EC, SNAP_STORE=self.store + "/node%n", SNAP_JOB=JOB,
                        SNAP_MEM_LIMIT="256M", SNAP_TIMEOUT_MS="120000", SNAP_LOG=self.logs + "/smp%n.log",
                        SNAP_AUTOSTART="0",
                        OMPI_MCA_btl="self,tcp", OMPI_MCA_btl_tcp_if_include="lo", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        for k in list(self.env):
            if k.startswith(("SLURM_", "SNAP_FLUSH", "SNAP_SOCKET", "SNAP_METRICS")) and k != "SLURM_CONF":
                del self.env[k]
        self.w = Waiter()
        self.w.watch(self.logs)
        self.mesh_relaunches = 0

    # ---- what the logs say ----
    def protected(self, node):
        """Steps node `node` logged protected."""
        return [int(m.group(1)) for m in re.finditer(rf"job {JOB} step (\d+) protected", self.read(f"smp{node}.log"))]

    def protected_everywhere(self):
        """The newest step every node logged protected, or None."""
        sets = [set(self.protected(n)) for n in range(NODES)]
        common = set.intersection(*sets) if all(sets) else set()
        return max(common) if common else None

    def read(self, name):
        try:
            with open(os.path.join(self.logs, name)) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def rank_lines(self, r):
        return [ln.split() for ln in self.read(f"rank{r}.log").splitlines()]

    def restores(self, r):
        return [int(p[1]) for p in self.rank_lines(r) if len(p) == 2 and p[0] == "restored"]

    def committed(self, r):
        c = [int(p[1]) for p in self.rank_lines(r) if len(p) == 2 and p[0] == "committed"]
        return c[-1] if c else None

    def until(self, pred, what, limit=120, procs=()):
        v = self.w.until(pred, limit=limit, procs=procs)
        if not v:
            check(False, f"timed out or ended waiting for {what}")
            self.dump()
            raise SystemExit(1)
        return v

    def dump(self):
        for p in sorted(glob.glob(os.path.join(self.logs, "*"))) + sorted(glob.glob(os.path.join(self.tmp, "*.out"))):
            with open(p, errors="replace") as f:
                lines = f.readlines()
            print(f"--- {p} (last 15 of {len(lines)} lines)\n" + "".join(lines[-15:]), end="")

    # ---- SLURM ----
    def slurm(self, *argv, check_rc=True):
        r = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=120)
        if check_rc and r.returncode != 0:
            check(False, f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
            raise SystemExit(1)
        return r

    def alloc(self, nodes="n[1-4]"):
        r = self.slurm("salloc", "--no-shell", f"--nodes={NODES}", f"--nodelist={nodes}",
                       f"--ntasks-per-node={PPN}", "--job-name=drill")
        m = re.search(r"Granted job allocation (\d+)", r.stderr + r.stdout)
        check(m is not None, f"salloc said {r.stderr!r}")
        return m.group(1)

    def step_mesh(self, jobid):
        out = open(os.path.join(self.tmp, "mesh.out"), "a")
        p = subprocess.Popen(["srun", f"--jobid={jobid}", f"--nodes={NODES}", f"--ntasks={NODES}",
                              "--ntasks-per-node=1", "--overlap", "--mpi=pmix", "--kill-on-bad-exit=1",
                              "--job-name=mesh", "snapsmp", "--ec", EC], env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        return p

    def step_trainers(self, jobid, *args):
        out = open(os.path.join(self.tmp, "trainers.out"), "a")
        p = subprocess.Popen(["srun", f"--jobid={jobid}", f"--nodes={NODES}", f"--ntasks={NODES * PPN}",
                              f"--ntasks-per-node={PPN}", "--overlap", "--kill-on-bad-exit=1", self.wrapper, *args],
                             env=self.env, stdout=out, stderr=subprocess.STDOUT)
        out.close()
        return p

    def launch(self, jobid, *args):
        """The mesh and the trainers as two steps of allocation jobid, until
        the trainers exit; (their status, the mesh's srun). A mesh that ends
        first is relaunched with the trainers once, as the recipe does: on
        fake nodes of one host, Open MPI's TCP connect between two daemons
        of a freshly started mesh fails now and then ("connect() to
        127.0.0.1:P failed: Operation now in progress"), and the mesh aborts
        before it serves. Said in the output; a second failure fails."""
        for attempt in (1, 2):
            mesh = self.step_mesh(jobid)
            tr = self.step_trainers(jobid, *args)
            self.w.until(lambda: tr.poll() is not None or mesh.poll() is not None, limit=150, procs=[mesh, tr])
            if mesh.poll() is None:
                if tr.poll() is None:
                    check(False, "the trainers did not finish")
                    self.stop(tr)
                return tr.returncode, mesh
            self.stop(tr)
            say(f"the mesh exited ({mesh.returncode}) before the trainers ended (attempt {attempt}): "
                "relaunching both, as the recipe does")
            self.mesh_relaunches += 1
        check(False, "the mesh failed twice in a row")
        raise SystemExit(1)

    def start(self, jobid, pred, what, *args):
        """The mesh and the trainers as two steps of jobid, until pred()
        holds while both run; (mesh, trainers). A mesh that ends first is
        relaunched with the trainers once, for the same reason as in
        launch(): a mesh starting on fake nodes of one host now and then
        dies in Open MPI's start-up (the loopback connect abort, and once an
        ASan SEGV at pc 0 on a node's main thread before any trainer had
        connected). Said in the output; a second failure fails."""
        for attempt in (1, 2):
            mesh = self.step_mesh(jobid)
            tr = self.step_trainers(jobid, *args)
            v = self.w.until(lambda: pred() or mesh.poll() is not None or tr.poll() is not None,
                             limit=120, procs=[mesh, tr])
            if mesh.poll() is None and tr.poll() is None and v:
                return mesh, tr
            if mesh.poll() is None and tr.poll() is not None:
                # Trainers whose node daemon died end first; the mesh's
                # srun follows once it has reaped its tasks.
                self.w.until(lambda: mesh.poll() is not None, limit=30, procs=[mesh])
            if mesh.poll() is None or attempt == 2:
                check(False, f"timed out or ended waiting for {what}")
                self.dump()
                raise SystemExit(1)
            self.stop(tr)
            say(f"the mesh exited ({mesh.returncode}) before {what} (attempt {attempt}): "
                "relaunching both, as the recipe does")
            self.mesh_relaunches += 1

    def stop(self, p, limit=60, step=None):
        """Stop an srun and return its status: a SIGTERM to every task of
        `step` (scancel --signal=TERM JOB.STEP, named by srun --job-name),
        or a SIGTERM to srun, which SIGKILLs its tasks."""
        if p.poll() is None and step:
            q = self.slurm("squeue", "-h", "-s", "-o", "%i %j", check_rc=False).stdout.split("\n")
            ids = [ln.split()[0] for ln in q if ln.split()[1:] == [step]]
            check(len(ids) == 1, f"step {step}: squeue says {q}")
            if ids:
                self.slurm("scancel", "--signal=TERM", ids[0])
        elif p.poll() is None:
            p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait()

    def job_gone(self, jobid):
        st = self.job_state(jobid)[0]
        return st is None or st not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED")

    def job_state(self, jobid):
        """(JobState, ExitCode) of an ended job, from slurmctld (MinJobAge keeps it)."""
        t = self.slurm("scontrol", "show", "job", jobid, check_rc=False).stdout
        st, ec = re.search(r"JobState=(\S+)", t), re.search(r"ExitCode=(\S+)", t)
        return (st.group(1) if st else None, ec.group(1) if ec else None)

    def wait_job_gone(self, jobid, limit=60):
        deadline = time.monotonic() + limit
        while not self.job_gone(jobid):   # the scheduler's answer is the event
            if time.monotonic() > deadline:
                check(False, f"job {jobid} still in the queue after {limit} s")
                raise SystemExit(1)
            time.sleep(0.2)

    def pids_on(self, node, names):
        """Processes of this test running on fake node `node` (SLURMD_NODENAME) whose name is in names."""
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/comm") as f:
                    comm = f.read().strip()
                if comm not in names:
                    continue
                with open(f"/proc/{d}/environ", "rb") as f:
                    env = f.read().split(b"\0")
            except OSError:
                continue
            if f"SLURMD_NODENAME={node}".encode() in env and f"SLURM_CONF={self.c.conf}".encode() in env:
                out.append(int(d))
        return out

    def check_restores(self, what, at_least=None, exact=None):
        got = [self.restores(r) for r in range(NODES * PPN)]
        last = [g[-1] if g else None for g in got]
        say(f"{what}: ranks restored {last}")
        if not check(all(x is not None for x in last), f"{what}: a rank restored nothing: {last}"):
            return None
        check(len(set(last)) == 1, f"{what}: ranks restored different steps: {last}")
        if exact is not None:
            check(last[0] == exact, f"{what}: restored step {last[0]}, expected {exact}")
        if at_least is not None:
            check(last[0] >= at_least, f"{what}: restored step {last[0]}, older than {at_least}")
        return last[0]

    def close(self):
        self.w.close()
        shutil.rmtree(self.store, ignore_errors=True)


# ---- scenarios ----------------------------------------------------------------

def scenario_mesh(run):
    jobid = run.alloc()
    rc, mesh = run.launch(jobid, "--steps", "6", "--bytes", "262144", "--resume")
    check(rc == 0, f"trainers exited {rc}")
    run.until(lambda: run.protected_everywhere() == 6, "step 6 protected on every node", procs=[mesh])
    say("step 6 protected on every node; relaunching mesh and trainers")
    check(run.stop(mesh, step="mesh") == 0, "the mesh did not stop cleanly")
    rc, mesh = run.launch(jobid, "--steps", "6", "--bytes", "262144", "--resume")
    check(rc == 0, f"relaunched trainers exited {rc}")
    run.check_restores("relaunch", exact=6)
    check(run.stop(mesh, step="mesh") == 0, "the relaunched mesh did not stop cleanly")
    run.slurm("scancel", jobid)


def scenario_sbatch(run):
    out = os.path.join(run.tmp, "batch.out")
    env = dict(run.env, RESTARTS="2")
    sb = subprocess.Popen(["sbatch", "--parsable", f"--nodes={NODES}", f"--ntasks-per-node={PPN}",
                           f"--output={out}", os.path.join(run.a.source, "integration", "launch", "slurm.sbatch"),
                           run.wrapper, "--steps", "12", "--bytes", "262144", "--compute-us", "100000", "--resume"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    jobid = sb.stdout.readline().strip().split(";")[0]
    if not check(jobid.isdigit(), f"sbatch said {jobid!r}"):
        sb.kill()
        sb.wait()
        return
    say(f"batch job {jobid}")
    victim = NODES * PPN - 1
    run.until(lambda: (run.committed(victim) or 0) >= 3, f"rank {victim}'s third commit")
    node = f"n{victim // PPN + 1}"
    pids = [p for p in run.pids_on(node, {"trainer"})]
    check(len(pids) >= 1, f"no trainer process found on {node}")
    for p in pids:
        os.kill(p, signal.SIGKILL)
    say(f"SIGKILLed the trainers on {node} ({pids}) after rank {victim} committed {run.committed(victim)}")
    sb.wait(timeout=60)
    run.wait_job_gone(jobid, limit=150)
    state = run.job_state(jobid)
    check(state == ("COMPLETED", "0:0"), f"the batch job ended {state}")
    with open(out, errors="replace") as f:
        text = f.read()
    check("attempt 2" in text and "exited with status" in text,
          "the recipe did not report the trainers' failure and relaunch them")
    run.check_restores("relaunch by the recipe", at_least=1)
    for rk in range(NODES * PPN):
        check(run.committed(rk) == 12, f"rank {rk} ended at step {run.committed(rk)}, not 12")
    for n in range(NODES):
        check("shutting down" in run.read(f"smp{n}.log"), f"node {n} was not stopped by a SIGTERM (scancel)")


def scenario_node_failure(run):
    jobid = run.alloc()
    mesh, tr = run.start(jobid, lambda: (run.protected_everywhere() or 0) >= 3, "a step >= 3 protected on every node",
                         "--steps", "200", "--bytes", "262144", "--compute-us", "50000", "--resume")
    p_before = run.protected_everywhere()
    pids = run.pids_on("n2", {"snapsmp", "trainer"})
    check(len(pids) >= 2, f"n2 runs {pids}: expected its snapsmp and trainers")
    for p in pids:
        os.kill(p, signal.SIGKILL)
    say(f"SIGKILLed n2's daemon and trainers {pids}; step {p_before} was protected everywhere")
    run.slurm("scontrol", "update", "nodename=n2", "state=down", "reason=drill")
    check(run.c.states().get("n2") == "down", f"n2 is not down: {run.c.states()}")
    run.stop(mesh)
    run.stop(tr)
    run.wait_job_gone(jobid)
    shutil.rmtree(os.path.join(run.store, "node1"))     # n2's memory is gone with it
    # slurmctld refuses to resume a node still completing the killed job's steps.
    deadline = time.monotonic() + 60
    # slurmctld's acceptance is the event (it has no notification to wait on).
    while run.slurm("scontrol", "update", "nodename=n2", "state=resume", check_rc=False).returncode != 0:
        if not check(time.monotonic() < deadline, f"n2 cannot be resumed: {run.c.states()}"):
            raise SystemExit(1)
        time.sleep(0.2)
    say("n2 is down, its store gone; resumed as the replacement")
    mdir = os.path.join(run.tmp, "metrics")
    os.makedirs(mdir)
    run.env.update(SNAP_METRICS_FILE=mdir + "/snapsmp%n.prom", SNAP_METRICS_INTERVAL="1")
    jobid = run.alloc()
    rc, mesh = run.launch(jobid, "--steps", "0", "--bytes", "262144", "--resume")
    check(rc == 0, f"relaunched trainers exited {rc}")
    got = run.check_restores("after the node failure", at_least=p_before)
    check(got in run.protected(0), f"restored step {got} was never protected")
    rebuilt = run.read("smp1.log")
    check("rebuilt this lost node" in rebuilt, "node 1 (n2) did not log its store's rebuild")
    # The replacement's metrics file says the same: its protected step, the
    # chunks rebuilt there, under its SLURM node name and mesh rank.
    mfile = os.path.join(mdir, "snapsmp1.prom")

    def metric(name):
        return prom_value(mfile, name, f'job="{JOB}",node="n2",mesh_node="1"')
    run.w.watch(mdir)
    run.until(lambda: metric("libsnap_protected_step") == got and (metric("libsnap_rebuilt_chunks_total") or 0) > 0,
              "n2's metrics file to show the rebuild", limit=60, procs=[mesh])
    say(f"n2's metrics: protected step {metric('libsnap_protected_step'):.0f}, "
        f"{metric('libsnap_rebuilt_chunks_total'):.0f} chunks rebuilt")
    check(run.stop(mesh, step="mesh") == 0, "the mesh did not stop cleanly")
    run.slurm("scancel", jobid)


def scenario_preempt(run):
    os.makedirs(run.flush)
    out = os.path.join(run.tmp, "batch.out")
    # RESTARTS: the recipe relaunches a mesh that failed to form (see Run.launch).
    env = dict(run.env, SNAP_FLUSH_DIR=run.flush, RESTARTS="2")
    script = os.path.join(run.a.source, "integration", "launch", "slurm.sbatch")
    steps = 40
    r = subprocess.run(["sbatch", "--parsable", "--requeue", f"--nodes={NODES}", f"--ntasks-per-node={PPN}",
                        f"--output={out}", "--open-mode=append", script, run.wrapper, "--steps", str(steps),
                        "--bytes", "262144", "--compute-us", "50000", "--resume"],
                       env=env, capture_output=True, text=True, timeout=60)
    if not check(r.returncode == 0, f"sbatch: {r.stderr}"):
        return
    jobid = r.stdout.strip().split(";")[0]
    run.until(lambda: (run.protected_everywhere() or 0) >= 3, "a step >= 3 protected on every node")
    run.slurm("scancel", "--signal=USR1", "--batch", jobid)
    say("scancel --signal=USR1 --batch: waiting for the mesh to persist a step")

    def persisted():
        return [int(m.group(1)) for m in re.finditer(rf"job {JOB} step (\d+) persisted", run.read("smp0.log"))]
    first = run.until(lambda: persisted(), "a persisted step after USR1")[0]
    # Training goes on meanwhile: the USR1 is a notice, not a stop.
    c0 = run.committed(0)
    run.until(lambda: (run.committed(0) or 0) > c0, "a commit after the notice")
    check(run.committed(0) < steps, "the job finished before the preemption")
    say(f"step {first} persisted on USR1, training goes on; preempting (scontrol requeuehold)")
    # The preemption: SIGTERM to every task (snapsmp persists once more),
    # the job back in the queue, held until the node stores are gone.
    run.slurm("scontrol", "requeuehold", jobid)
    deadline = time.monotonic() + 60
    # The scheduler's own state is the event (it has no notification to wait on).
    while run.job_state(jobid)[0] != "PENDING" or run.c.states() != {n: "idle" for n in run.c.nodes}:
        if not check(time.monotonic() < deadline, f"job {jobid} not requeued: {run.job_state(jobid)}"):
            raise SystemExit(1)
        time.sleep(0.2)
    newest = max(persisted())
    shutil.rmtree(run.store)
    os.makedirs(run.store)
    restored_before = {r: len(run.restores(r)) for r in range(NODES * PPN)}
    say(f"requeued and held; newest persisted step {newest}; every node store removed; released")
    run.slurm("scontrol", "release", jobid)
    # slurmctld delays a requeued batch job's start (BeginTime); an
    # operator's preemption drill need not wait for all of it, but the start
    # must fall in a later second than the requeue: slurmd revokes the job's
    # credential at the requeue, to the second, and a start within that
    # second is killed ("Killing non-startable batch JobId=1: Job credential
    # revoked", seen once under ASan).
    run.slurm("scontrol", "update", f"jobid={jobid}", "StartTime=now+2")
    run.wait_job_gone(jobid, limit=150)
    state = run.job_state(jobid)
    check(state == ("COMPLETED", "0:0"), f"the requeued job ended {state}")
    check(all(len(run.restores(r)) > restored_before[r] for r in restored_before),
          "a rank of the requeued job restored nothing")
    run.check_restores("requeued job, from disk", exact=newest)
    check(re.search(rf"restoring persisted step {newest} ", "".join(run.read(f"smp{n}.log") for n in range(NODES)))
          is not None, "no node logged the restore from disk")
    for rk in range(NODES * PPN):
        check(run.committed(rk) == steps, f"rank {rk} ended at step {run.committed(rk)}, not {steps}")


SCENARIOS = {"mesh": scenario_mesh, "sbatch": scenario_sbatch, "node-failure": scenario_node_failure,
             "preempt": scenario_preempt}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--source", required=True)
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    a = ap.parse_args()
    a.build, a.source = os.path.abspath(a.build), os.path.abspath(a.source)
    why = slurm_cluster.missing()
    if why:
        print(f"SKIP: no private SLURM cluster here: {why}")
        return 77
    tmp = tempfile.mkdtemp(prefix="snap-slurm-")
    cluster = slurm_cluster.Cluster(os.path.join(tmp, "cluster"), nodes=NODES)
    run = None
    t0 = time.monotonic()
    try:
        cluster.start()
        say(f"SLURM cluster of {NODES} fake nodes up in {tmp}/cluster")
        run = Run(a, tmp, cluster)
        SCENARIOS[a.scenario](run)
        if run.mesh_relaunches:
            say(f"note: the mesh failed to form {run.mesh_relaunches} time(s) and was relaunched")
    except SystemExit:
        pass
    except (subprocess.TimeoutExpired, RuntimeError, OSError) as e:
        check(False, f"{type(e).__name__}: {e}")
    finally:
        if run:
            if fails:
                run.dump()
            run.close()
        # Whatever is still queued goes before the daemons that would end it.
        # (slurmstepd outlives slurmd: the jobs must be gone first).
        subprocess.run(["scancel", "--user=root", "--full"], env=cluster.env, capture_output=True)
        deadline = time.monotonic() + 60
        while cluster.procs and time.monotonic() < deadline:   # an empty queue is the event
            q = subprocess.run(["squeue", "-h"], env=cluster.env, capture_output=True, text=True)
            if q.returncode != 0 or not q.stdout.strip():
                break
            time.sleep(0.2)
        cluster.stop()
        if not fails:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept {tmp} for a look")
    print(f"{a.scenario}: {'PASS' if not fails else f'{len(fails)} failure(s)'} in {time.monotonic() - t0:.1f} s")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
