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
  verify:   launch D's step 5, each node's store holding only its own rank:
            `snaptool verify --nodes` passes it whole (one node's store alone
            says ranks are missing), names the node and rank of a flipped
            byte, and the rank of a deleted node store.

usage: mesh_launch.py --build DIR [--shape 2+1] [--nodes 3] [--mpiexec P]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, restored_of, setup, start_trainers  # noqa: E402


def check_verify_nodes(a, base, fail, step=5):
    """snaptool verify --nodes over the stopped mesh's stores (rank r on node r)."""
    pat = os.path.join(base, "node%n")

    def verify(*extra, store=pat, nodes=True):
        argv = [a.snaptool, "verify", str(step), "--store", store, "--job", JOB, *extra]
        r = subprocess.run(argv + (["--nodes", str(a.nodes)] if nodes else []), capture_output=True, text=True,
                           timeout=120)
        return r, f"{' '.join(argv[1:])}: exit {r.returncode}: {r.stdout}{r.stderr}"

    w = a.world
    r, said = verify(store=os.path.join(base, "node0"), nodes=False)
    if r.returncode != 3 or f"1 of {w} ranks present in the node store" not in r.stdout:
        fail(f"verify: one node's store alone should hold 1 of {w} ranks: {said}")
    r, said = verify()
    if r.returncode != 0 or f"{w} of {w} ranks present in {a.nodes} node stores, 0 corrupt" not in r.stdout:
        fail(f"verify --nodes on the healthy mesh: {said}")
    r, said = verify("--json")
    doc = json.loads(r.stdout) if r.returncode == 0 else {}
    if (doc.get("result") != "ok" or doc.get("ranks_present") != w or doc.get("missing_ranks") != [] or
            doc.get("missing_nodes") != [] or sorted((x["node"], x["rank"]) for x in doc["ranks"]) !=
            [(x % a.nodes, x) for x in range(w)]):
        fail(f"verify --nodes --json on the healthy mesh: {said}")
        return
    # One byte of rank 1's slot on node 1: a chunk mismatch, named with its node.
    slot = next(x["slot"] for x in doc["ranks"] if x["rank"] == 1)
    path = os.path.join(base, "node1", JOB, "rank-00001", f"slot-{slot}")
    with open(path, "r+b") as f:
        f.seek(1000)
        good = f.read(1)
        f.seek(1000)
        f.write(bytes([good[0] ^ 0xFF]))
    r, said = verify()
    if r.returncode != 3 or not re.search(r"^node1: rank 1: region \S+ chunk \d+: CRC32C mismatch$", r.stdout, re.M):
        fail(f"verify --nodes with a flipped byte on node1: {said}")
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(good)
    # Node 2's store gone: its rank is in no node store.
    shutil.rmtree(os.path.join(base, "node2"))
    r, said = verify()
    if (r.returncode != 3 or "node2: " + os.path.join(base, "node2") + ": no store" not in r.stdout or
            f"step {step}: rank 2 in no node store" not in r.stdout):
        fail(f"verify --nodes with node2's store deleted: {said}")
    r, said = verify("--json")
    doc = json.loads(r.stdout) if r.stdout.startswith("{") else {}
    if (r.returncode != 3 or doc.get("result") != "incomplete" or doc.get("missing_nodes") != [2] or
            doc.get("missing_ranks") != [2]):
        fail(f"verify --nodes --json with node2's store deleted: {said}")
    print(f"verify --nodes: step {step} whole over {a.nodes} node stores; a flipped byte named node1 rank 1; "
          "a deleted store named rank 2", flush=True)


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
        check_verify_nodes(a, mesh.base, fail)
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
