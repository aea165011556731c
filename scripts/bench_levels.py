#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""The protection levels of one deployment, measured in one run: the README's
levels table.

  mpirun -np NODES snapsmp --ec K+M --flush-dir DISK   (stores in /dev/shm)
  + NODES+2 example trainers of BYTES each, spread over the nodes.

For the last step S of a run it measures, from the trainers' own clocks
(trainer --times) and the moment the daemons' log lines appear (inotify):
  save -> committed in the node stores (level 1),
  save -> protected by parity on every node (level 2),
  preemption notice (SIGUSR1) -> persisted on disk (level 3),
and for each level the recovery: SIGKILL of the whole mesh and the trainers,
the loss that level survives, relaunch, and time until every rank has
restored S (verified by the trainer), split into relaunch -> serving and
serving -> restored. Medians of --reps runs per recovery.

usage: scripts/bench_levels.py BUILD_DIR [--nodes 4] [--shape 3+1] [--bytes 64M]
"""
import argparse
import os
import re
import shutil
import signal
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "fault"))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, groups_of, restored_of, setup, start_trainers  # noqa: E402


def times_of(log, what, step):
    with open(log) as f:
        m = re.search(rf"^{what} {step} (\d+)$", f.read(), re.M)
    return int(m.group(1)) / 1e9 if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shape", default="3+1")
    ap.add_argument("--bytes", default="64M")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    base, logdir = setup(a, "snapbench-levels")
    disk = os.path.join(base, "disk")
    # (a later --mem-limit wins over the one Mesh passes)
    mesh = Mesh(a, base, ["--flush-dir", disk, "--flush-every", "1000", "--flush-keep", "1", "--mem-limit", "6G"])
    waiter = Waiter()
    waiter.watch(logdir)
    S = a.steps
    step_re = re.compile(rf"job {JOB} step {S} (protected|persisted)")

    def seen(what):
        return len([m for m in step_re.finditer(mesh.text()) if m.group(1) == what]) >= a.nodes

    def trainers(tag, steps):
        return start_trainers(a, mesh, logdir, tag, steps)

    try:
        mesh.start(os.path.join(logdir, "mesh-save.log"))
        # A first run creates the job; then the measured one restores it and
        # saves one more step with timestamps (--times).
        for p, _, _ in trainers("save", S):
            p.wait()
        S += 1
        step_re = re.compile(rf"job {JOB} step {S} (protected|persisted)")
        # default copy threads and a longer timeout: 64 MiB per rank on 2 cores
        timed = start_trainers(a, mesh, logdir, "timed", S, extra=["--times"],
                               env_over={"SNAP_TIMEOUT_MS": "60000", "SNAP_COPY_THREADS": None})
        for p, _, _ in timed:
            if p.wait() != 0:
                sys.exit(f"bench_levels: a trainer failed; logs in {logdir}")
        t_save = max(times_of(log, "save", S) for _, log, _ in timed)
        t_commit = max(times_of(log, "commit", S) for _, log, _ in timed)
        if not waiter.until(lambda: seen("protected"), limit=300):
            sys.exit(f"bench_levels: step {S} was not protected; see {mesh.log}")
        t_prot = time.time()
        t_usr1 = time.time()
        mesh.signal_all(signal.SIGUSR1)
        if not waiter.until(lambda: seen("persisted"), limit=300):
            sys.exit(f"bench_levels: step {S} was not persisted; see {mesh.log}")
        t_pers = time.time()
        total = 0
        for d, _, files in os.walk(os.path.join(disk, JOB, f"step-{S}")):
            total += sum(os.path.getsize(os.path.join(d, f)) for f in files)

        groups = groups_of(a.nodes, a.k, a.m)
        # what each level survives: nothing lost, one node of group 0, every store
        losses = {1: [], 2: [groups[0][-1]], 3: list(range(a.nodes))}
        recov = {}
        for level in (1, 2, 3):
            serve, total_t = [], []
            for rep in range(a.reps):
                mesh.kill()
                for n in losses[level]:
                    shutil.rmtree(mesh.root(n), ignore_errors=True)
                t0 = time.time()
                mesh.start(os.path.join(logdir, f"mesh-l{level}-{rep}.log"))
                t1 = time.time()
                procs = trainers(f"l{level}-{rep}", S)
                for p, _, _ in procs:
                    p.wait()
                t2 = time.time()
                got = {restored_of(log) for _, log, _ in procs}
                if got != {S} or any(p.returncode for p, _, _ in procs):
                    sys.exit(f"bench_levels: level {level}: restored {got}; logs in {logdir}")
                text = mesh.text()
                if (level == 3) != ("(level: disk)" in text) or (level == 2) != ("rebuilt this lost node" in text):
                    sys.exit(f"bench_levels: level {level} was not the level that served; see {mesh.log}")
                serve.append(t1 - t0)
                total_t.append(t2 - t0)
            recov[level] = (statistics.median(serve), statistics.median(total_t))
        mesh.stop()
    finally:
        mesh.kill()
    data = a.world * _size(a.bytes)
    print(f"levels: {a.nodes} nodes ({a.shape}), {a.world} ranks x {a.bytes} = {data / 2**20:.0f} MiB, "
          f"stores in /dev/shm, flush directory {disk} (tmpfs here), medians of {a.reps} recoveries")
    print("| level | survives | a save reaches it | recovery: relaunch -> serving | relaunch -> every rank restored |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| 1 node stores | trainer crashes, daemon restarts | {1e3 * (t_commit - t_save):.0f} ms (save -> committed) "
          f"| {recov[1][0]:.2f} s | {recov[1][1]:.2f} s |")
    print(f"| 2 parity ({a.shape}) | loss of up to {a.m} node(s) per group | {1e3 * (t_prot - t_save):.0f} ms "
          f"(save -> protected) | {recov[2][0]:.2f} s (rebuild included) | {recov[2][1]:.2f} s |")
    print(f"| 3 disk (HDF5) | loss of every node | {1e3 * (t_pers - t_usr1):.0f} ms (SIGUSR1 -> persisted, "
          f"{total / 2**20:.0f} MiB) | {recov[3][0]:.2f} s | {recov[3][1]:.2f} s (loaded from disk) |")
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    return 0


def _size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1]] if s[-1] in mult else int(s)


if __name__ == "__main__":
    sys.exit(main())
