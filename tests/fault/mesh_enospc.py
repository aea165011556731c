#!/usr/bin/python3
# SPDX-License-Identifier: BSD-3-Clause
"""A relaunch rebuild that cannot write: the lost node's new store is full.

The rebuild writes a lost node's pieces with pwrite() (smp/mesh/meshrec.c,
mesh_fio). When that fails (here ENOSPC: the replaced node's store is a
tmpfs too small for its part), the whole group must fail the rebuild
together, every trainer must get an error naming the failed rebuild and the
disk's complaint (no torn or partial step restored), and the survivors'
stores must stay exactly as they were, so that a relaunch once the space is
there rebuilds the node and restores the step bit-exact. Event-driven:

  1. ranks 0..N-1 (one per node) save steps 1..3 and exit; the test waits
     until every node holds step 3's protect record, then SIGKILLs the mesh;
  2. node 1's store is deleted and replaced by a 256 KiB tmpfs; the mesh is
     relaunched and the trainers asked to restore: each must exit 1, naming
     the rebuild of step 3, node 1 (the node where it failed, not one that
     only saw it fail) and the exhausted store space; the survivors' files
     are unchanged (md5);
  3. the tmpfs is removed and the mesh relaunched: node 1 is rebuilt and
     every rank restores step 3 (the trainer checks its bytes).

Needs CAP_SYS_ADMIN for mount(2) (root, as in CI): exits 77, saying so, without
it, decided before phase 1; with it, a failing mount is a failure.

usage: mesh_enospc.py --build DIR [--shape 2+1] [--nodes 3] [--mpiexec P]
"""
import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from events import Waiter  # noqa: E402
from mesh_trials import JOB, Mesh, have_record, restored_of, setup, start_trainers, tree_md5  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from skiprule import can_mount, skip_test  # noqa: E402


class NoFullStore(Exception):
    """Phase 2 cannot run: its mount failed (recorded as a failure)."""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--shape", default="2+1")
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--mpiexec", default=shutil.which("mpiexec") or "mpiexec")
    a = ap.parse_args()
    # Decided before phase 1 runs, from the capability: a mount that fails
    # later, with it, is a failure, and phase 1's failures are never lost.
    if not can_mount():
        skip_test("mesh_enospc", "needs CAP_SYS_ADMIN to mount a tmpfs (root, as in CI)")
    a.world, a.bytes = 0, "1M"
    base, logdir = setup(a, "snaptest-meshenospc")
    a.world = a.nodes   # rank r on node r
    mesh = Mesh(a, base)
    waiter = Waiter()
    waiter.watch(logdir)
    lost = 1
    failures = []

    def fail(msg):
        print("FAIL:", msg, flush=True)
        failures.append(msg)

    def run(tag, last):
        procs = start_trainers(a, mesh, logdir, tag, last)
        out = []
        for p, log, err in procs:
            p.wait(timeout=300)
            with open(err) as f:
                out.append((p.returncode, restored_of(log) if os.path.exists(log) else None, f.read()))
        return out

    def survivors():
        # the job's data and parity; "generation" counts the daemons' starts
        return {n: {p: h for p, h in tree_md5(os.path.join(mesh.root(n), JOB)).items() if p != "generation"}
                for n in range(a.nodes) if n != lost}

    mounted = False
    try:
        # 1. three protected steps
        mesh.start(os.path.join(logdir, "mesh0.log"))
        res = run("save", 3)
        if any(rc != 0 for rc, _, _ in res):
            fail(f"saving steps 1-3: {res}")
        if not waiter.until(lambda: have_record(mesh, a, 3), limit=120,
                            dirs=lambda: [os.path.join(mesh.root(n), JOB, "ec") for n in range(a.nodes)]):
            fail(f"step 3 was not protected on every node; see {mesh.log}")
        mesh.kill()
        # 2. node 1 replaced by a store too small for its part
        root = mesh.root(lost)
        shutil.rmtree(root)
        os.makedirs(root)
        m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", root], capture_output=True, text=True)
        if m.returncode != 0:
            fail(f"mount of a 256 KiB tmpfs on {root} failed ({m.returncode}): {m.stderr.strip()}")
            raise NoFullStore()
        mounted = True
        before = survivors()
        mesh.start(os.path.join(logdir, "mesh1.log"))
        res = run("full", 3)
        mesh.kill()
        # Every rank is told of the failed rebuild and its cause on node 1 (not "failed on
        # another group member"), rank 1 too: its REGISTER reserves its empty slots in the
        # background now (smp/store/reserve.h), so its RESTORE is what fails.
        for r, (rc, got, err) in enumerate(res):
            want = ["rebuild of step 3 failed", f"node {lost}:", "store space exhausted"]
            if rc != 1 or any(w not in err for w in want):
                fail(f"full store: rank {r} exited {rc} (restored {got}), expected 1 with {want}: {err!r}")
        if "rebuild of step 3 failed" not in mesh.text():
            fail(f"full store: the mesh did not log the failed rebuild; see {mesh.log}")
        after = survivors()
        if after != before:
            changed = sorted(f"node{n}/{p}" for n in before for p in set(before[n]) | set(after[n])
                             if before[n].get(p) != after[n].get(p))
            fail(f"full store: the survivors' files changed: {changed}")
        # 3. space again: the relaunch rebuilds node 1 and restores step 3
        subprocess.run(["umount", root], check=True)
        mounted = False
        mesh.start(os.path.join(logdir, "mesh2.log"))
        res = run("again", 3)
        if any(rc != 0 or got != 3 for rc, got, _ in res):
            fail(f"after the space came back: {[(rc, got) for rc, got, _ in res]}")
        if "rebuilt this lost node" not in mesh.text():
            fail(f"node {lost} was not rebuilt; see {mesh.log}")
        rc = mesh.stop()
        if rc != 0:
            fail(f"mesh exited {rc} on SIGTERM")
        if mesh.sanitizer_errors():
            fail(f"sanitizer report in {mesh.log}")
    except NoFullStore:
        pass   # recorded by fail() above
    finally:
        mesh.kill()
        if mounted:
            subprocess.run(["umount", mesh.root(lost)])
    if failures:
        print(f"mesh_enospc: {len(failures)} failures; logs in {logdir}")
        return 1
    shutil.rmtree(base, ignore_errors=True)
    shutil.rmtree(logdir, ignore_errors=True)
    print("mesh_enospc: OK (a full store failed the rebuild on every rank, by name, survivors untouched; "
          "rebuilt once the space was back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
