#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A rank that starts late in a mesh: one launch or a relaunch (SNAP_LAUNCH).

In a mesh each node tells the others when a new incarnation of a job rewinds
it (starts fresh, or restores step B): every node then drops the steps past B
that no connected process of its current generation wrote, because they are
a dead incarnation's. A rank of the *same* launch whose peers on other nodes
already saved and exited is no new incarnation: dropping their steps made
the job's steps incomplete for ever (seen in CI: bench.mesh, where rank 0's
trainer reached its node after ranks 1 and 2 had committed step 1 and
exited, hung waiting for step 1 to be protected). Event-driven, no timing:

  late:     ranks 1..W-1 of launch A save steps 1-2 and exit; then rank 0 of
            launch A starts (fresh: no step is complete) and saves 1-2. Step 2
            must be protected on every node, and no step withdrawn.
  relaunch: ranks 1..W-1 of launch B restore 2, save 3-4 and exit; then
            rank 0 of another launch C starts: it restores 2 and its rewind
            must withdraw the dead launch B's steps 3-4 on the other nodes,
            so that a full launch D restores 2, not a step no incarnation had.

usage: mesh_launch.py --build DIR [--shape 2+1] [--nodes 3] [--mpiexec P]
"""
import argparse
import os
import re
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, restored_of, setup, start_trainers  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="2+1")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    a.world, a.bytes = 0, "256K"
    base, logdir = setup(a, "snaptest-meshlaunch")
    a.world = a.nodes   # rank r on node r
    mesh = Mesh(a, base)
    waiter = Waiter()
    waiter.watch(logdir)
    failures = []

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def run(tag, ranks, last, launch):
        procs = start_trainers(a, mesh, logdir, tag, last, ranks=ranks, env_over={"SNAP_LAUNCH": launch})
        out = []
        for p, log, err in procs:
            if p.wait(timeout=300) != 0:
                fail(f"{tag}: a trainer exited {p.returncode}; see {err}")
            out.append(restored_of(log) if os.path.exists(log) else None)
        return out

    def protected(step):
        return len(re.findall(rf"job {JOB} step {step} protected", mesh.text()))

    def withdrawn(steps):
        return [ln for ln in mesh.text().splitlines() if "withdrew step" in ln and
                any(f"withdrew step {s} " in ln for s in steps)]

    try:
        mesh.start(os.path.join(logdir, "mesh.log"))
        late = list(range(1, a.world))
        # ---- late: one launch, rank 0 after its peers exited ----
        run("late-peers", late, 2, "A")
        got = run("late-rank0", [0], 2, "A")
        if got != [0]:
            fail(f"late: rank 0 of launch A restored {got}, expected a fresh start (no step was complete)")
        # the failure shows as withdrawn steps; success as step 2 protected everywhere
        if not waiter.until(lambda: protected(2) >= a.nodes or withdrawn([1, 2]), limit=300):
            fail(f"late: step 2 was not protected on every node; see {mesh.log}")
        if withdrawn([1, 2]):
            fail(f"late: a rank of the same launch withdrew its peers' steps: {withdrawn([1, 2])[:2]}")
        print(f"late: rank 0 started after ranks {late} of its launch exited; step 2 protected on "
              f"{protected(2)} nodes, nothing withdrawn", flush=True)

        # ---- relaunch: rank 0 of another launch after a dead launch's ranks ----
        got = run("dead-peers", late, 4, "B")
        if got != [2] * len(late):
            fail(f"relaunch: launch B restored {got}, expected step 2 on every rank")
        got = run("new-rank0", [0], 4, "C")
        if got != [2]:
            fail(f"relaunch: rank 0 of launch C restored {got}, expected step 2")
        if not waiter.until(lambda: len(withdrawn([3, 4])) >= 2 * len(late), limit=300):
            fail(f"relaunch: launch B's steps 3-4 on ranks {late} were not all withdrawn "
                 f"({len(withdrawn([3, 4]))} lines); see {mesh.log}")
        got = run("full", None, 5, "D")
        if got != [2] * a.world:
            fail(f"relaunch: the full launch D restored {got}, expected step 2 on every rank")
        print(f"relaunch: launch C's rewind withdrew {len(withdrawn([3, 4]))} slots of the dead launch B; "
              f"launch D restored {got}", flush=True)
        mesh.stop()
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    finally:
        mesh.kill()
    if failures:
        print(f"mesh_launch: {len(failures)} failure(s); logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print("mesh_launch: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
